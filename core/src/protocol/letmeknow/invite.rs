//! Invite links and the invite crypto (`specs/letmeknow-relay.md`, Invites).
//!
//! - link: `https://<relay host>/i/<invite id>#<secret>`, secret = 32 random bytes in b64u; the
//!   fragment never reaches the relay. Our links may add `&from=<inviter>&group=<group name>`
//!   (percent-encoded UTF-8) after the secret, so the joiner's window can say who invites them to
//!   what before joining; they are the link maker's words, as unauthenticated as the link itself;
//! - `k = HKDF-SHA256(ikm = secret, salt = "letmeknow-invite-v1", info = invite id, L = 32)`;
//! - join and welcome `data` = b64(nonce (12) ‖ ChaCha20-Poly1305(k, nonce, blob, aad = role ‖
//!   invite id)), role `join` or `welcome`, so a blob cannot be replayed in the other role or on
//!   another invite.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use hkdf::Hkdf;
use sha2::Sha256;
use zeroize::Zeroizing;

use super::is_id;
use crate::util::{Rng, b64u, b64u_array};

/// HKDF salt of the invite key.
const SALT: &[u8] = b"letmeknow-invite-v1";
/// ChaCha20-Poly1305 nonce length.
const NONCE: usize = 12;

/// Which side wrote a blob; part of the AAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The joiner's KeyPackage and display name.
    Join,
    /// The inviter's Welcome, group id and relay URL.
    Welcome,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Self::Join => b"join",
            Self::Welcome => b"welcome",
        }
    }
}

/// Why an invite link or blob was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InviteError {
    /// The link is not `http(s)://host/i/<32 hex>#<b64u of 32 bytes>` (the user's fault).
    #[error("not a letmeknow invite link (https://HOST/i/ID#SECRET)")]
    BadLink,
    /// The blob does not open under this invite's key and role: a wrong secret, or a relay or
    /// third party that tampered with it.
    #[error("the invite data does not decrypt with this link's secret")]
    Decrypt,
    /// The AEAD refused to encrypt (a local bug: far beyond any blob size).
    #[error("encryption failed")]
    Seal,
}

/// A parsed invite link.
#[derive(Clone, PartialEq, Eq)]
pub struct InviteLink {
    /// The relay's base URL (`scheme://host[:port]`), no trailing slash.
    pub relay: String,
    /// The invite id (32 lower-case hex).
    pub id: String,
    /// The invite secret.
    pub secret: Zeroizing<[u8; 32]>,
    /// The inviter's display name, as the link states it (not authenticated).
    pub from: Option<String>,
    /// The inviter's name for the group, as the link states it (not authenticated).
    pub group: Option<String>,
}

/// Longest `from` / `group` a link carries (characters); longer values are cut.
pub const MAX_LINK_NAME: usize = 64;

/// A name fit for a link: trimmed, without control characters, at most [`MAX_LINK_NAME`] chars.
fn clean_name(name: &str) -> Option<String> {
    let clean: String = name.chars().filter(|c| !c.is_control()).take(MAX_LINK_NAME).collect();
    let clean = clean.trim();
    (!clean.is_empty()).then(|| clean.to_owned())
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn pct_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes `%XX` escapes (and `+` as a space); `None` when an escape is cut or the bytes are not
/// UTF-8.
fn pct_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

impl std::fmt::Debug for InviteLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InviteLink").field("relay", &self.relay).field("id", &self.id).finish_non_exhaustive()
    }
}

impl InviteLink {
    /// A new invite on `relay` with a random id and secret.
    pub fn generate(relay: &str, rng: &mut impl Rng) -> Self {
        let mut secret = Zeroizing::new([0u8; 32]);
        rng.fill(secret.as_mut());
        Self { relay: relay.trim_end_matches('/').to_owned(), id: super::new_id(rng), secret, from: None, group: None }
    }

    /// The same link stating who invites (`from`) to what (`group`).
    pub fn with_names(mut self, from: Option<&str>, group: Option<&str>) -> Self {
        self.from = from.and_then(clean_name);
        self.group = group.and_then(clean_name);
        self
    }

    /// Parses `scheme://host/i/<id>#<secret>`.
    pub fn parse(link: &str) -> Result<Self, InviteError> {
        let link = link.trim();
        let (before, fragment) = link.split_once('#').ok_or(InviteError::BadLink)?;
        let mut parts = fragment.split('&');
        let secret = parts.next().ok_or(InviteError::BadLink)?;
        let secret = Zeroizing::new(b64u_array::<32>(secret).ok_or(InviteError::BadLink)?);
        let (mut from, mut group) = (None, None);
        // Unknown parameters are ignored; undecodable names are dropped (the link still works).
        for part in parts {
            match part.split_once('=') {
                Some(("from", v)) => from = pct_decode(v).as_deref().and_then(clean_name),
                Some(("group", v)) => group = pct_decode(v).as_deref().and_then(clean_name),
                _ => {}
            }
        }
        let (relay, id) = before.rsplit_once("/i/").ok_or(InviteError::BadLink)?;
        let scheme_ok = relay.starts_with("https://") || relay.starts_with("http://");
        let host = relay.split_once("://").map_or("", |(_, h)| h);
        if !scheme_ok || host.is_empty() || host.contains('/') || !is_id(id) {
            return Err(InviteError::BadLink);
        }
        Ok(Self { relay: relay.to_owned(), id: id.to_owned(), secret, from, group })
    }

    /// The link text.
    pub fn to_link(&self) -> String {
        let mut link = format!("{}/i/{}#{}", self.relay, self.id, b64u(self.secret.as_ref()));
        if let Some(from) = &self.from {
            link.push_str(&format!("&from={}", pct_encode(from)));
        }
        if let Some(group) = &self.group {
            link.push_str(&format!("&group={}", pct_encode(group)));
        }
        link
    }

    /// The invite key.
    pub fn key(&self) -> InviteKey {
        InviteKey::derive(&self.secret, &self.id)
    }
}

/// The symmetric key protecting one invite's blobs.
pub struct InviteKey {
    key: Zeroizing<[u8; 32]>,
    id: String,
}

impl std::fmt::Debug for InviteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InviteKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl InviteKey {
    /// `HKDF-SHA256(ikm = secret, salt = "letmeknow-invite-v1", info = id, L = 32)`.
    pub fn derive(secret: &[u8; 32], id: &str) -> Self {
        let hk = Hkdf::<Sha256>::new(Some(SALT), secret);
        let mut key = Zeroizing::new([0u8; 32]);
        // 32 bytes is always a valid HKDF-SHA256 output length.
        let _ = hk.expand(id.as_bytes(), key.as_mut());
        Self { key, id: id.to_owned() }
    }

    fn aad(&self, role: Role) -> Vec<u8> {
        [role.label(), self.id.as_bytes()].concat()
    }

    /// `nonce ‖ ChaCha20-Poly1305(k, nonce, blob, role ‖ id)` with a random nonce.
    pub fn seal(&self, role: Role, blob: &[u8], rng: &mut impl Rng) -> Result<Vec<u8>, InviteError> {
        let mut nonce = [0u8; NONCE];
        rng.fill(&mut nonce);
        let cipher = ChaCha20Poly1305::new((&*self.key).into());
        let aad = self.aad(role);
        let ct =
            cipher.encrypt(&Nonce::from(nonce), Payload { msg: blob, aad: &aad }).map_err(|_| InviteError::Seal)?;
        Ok([nonce.as_slice(), &ct].concat())
    }

    /// Opens what [`seal`](Self::seal) made for `role`.
    pub fn open(&self, role: Role, data: &[u8]) -> Result<Vec<u8>, InviteError> {
        if data.len() < NONCE {
            return Err(InviteError::Decrypt);
        }
        let (nonce, ct) = data.split_at(NONCE);
        let nonce: [u8; NONCE] = nonce.try_into().map_err(|_| InviteError::Decrypt)?;
        let cipher = ChaCha20Poly1305::new((&*self.key).into());
        let aad = self.aad(role);
        cipher.decrypt(&Nonce::from(nonce), Payload { msg: ct, aad: &aad }).map_err(|_| InviteError::Decrypt)
    }
}

/// A fresh owner token (64 lower-case hex).
pub fn new_owner_token(rng: &mut impl Rng) -> String {
    let mut bytes = [0u8; 32];
    rng.fill(&mut bytes);
    crate::util::hex(&bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::util::{OsRng, SeededRng};

    #[test]
    fn link_round_trips_and_the_fragment_holds_the_secret() {
        let link = InviteLink::generate("http://127.0.0.1:8470/", &mut SeededRng::new([1; 32]));
        let text = link.to_link();
        assert!(text.starts_with("http://127.0.0.1:8470/i/"));
        let back = InviteLink::parse(&text).unwrap();
        assert_eq!(back, link);
        for bad in [
            "http://h/i/0123#AAAA",
            "ftp://h/i/0123456789abcdef0123456789abcdef#AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "http://h/i/0123456789abcdef0123456789abcdef",
            "http://h/x/i/0123456789abcdef0123456789abcdef#AAAA",
        ] {
            assert_eq!(InviteLink::parse(bad), Err(InviteError::BadLink), "{bad}");
        }
    }

    #[test]
    fn a_link_states_the_inviter_and_group_name_and_still_parses_without_them() {
        let link = InviteLink::generate("https://relay.example", &mut SeededRng::new([2; 32]))
            .with_names(Some("Alice Ärger & Co"), Some("Team #1 \u{1f680}"));
        let text = link.to_link();
        assert!(text.contains("&from=Alice%20%C3%84rger%20%26%20Co&group=Team%20%231%20%F0%9F%9A%80"), "{text}");
        let back = InviteLink::parse(&text).unwrap();
        assert_eq!(back.from.as_deref(), Some("Alice Ärger & Co"));
        assert_eq!(back.group.as_deref(), Some("Team #1 \u{1f680}"));
        assert_eq!(back.key().id, link.key().id);
        // The bare link of the spec, and names that do not decode or are blank, still join.
        let bare = text.split('&').next().unwrap();
        assert_eq!(InviteLink::parse(bare).unwrap().from, None);
        let odd = format!("{bare}&from=%E2%28&group=%20&x=1");
        let parsed = InviteLink::parse(&odd).unwrap();
        assert_eq!((parsed.from, parsed.group), (None, None));
        let long = "x".repeat(500);
        assert_eq!(link.with_names(Some(&long), None).from.unwrap().chars().count(), MAX_LINK_NAME);
    }

    #[test]
    fn blobs_open_only_with_the_same_secret_role_and_invite() {
        let link = InviteLink::generate("https://relay.example", &mut OsRng);
        let key = link.key();
        let data = key.seal(Role::Join, b"key package", &mut OsRng).unwrap();
        assert_eq!(key.open(Role::Join, &data).unwrap(), b"key package");
        assert_eq!(key.open(Role::Welcome, &data), Err(InviteError::Decrypt));
        let other = InviteKey::derive(&[9; 32], &link.id);
        assert_eq!(other.open(Role::Join, &data), Err(InviteError::Decrypt));
        let moved = InviteKey::derive(&link.secret, &"0".repeat(32));
        assert_eq!(moved.open(Role::Join, &data), Err(InviteError::Decrypt));
        let mut tampered = data.clone();
        tampered[20] ^= 1;
        assert_eq!(key.open(Role::Join, &tampered), Err(InviteError::Decrypt));
        assert_eq!(key.open(Role::Join, &data[..5]), Err(InviteError::Decrypt));
    }
}
