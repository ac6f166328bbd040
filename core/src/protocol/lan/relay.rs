//! A relay announced on the LAN: "my relay is at URL and its certificate's SHA-256 is X", signed
//! by the announcer's identity key, so that a contact can use a self-signed relay (the one the
//! desktop app hosts) for groups without asking anyone.
//!
//! - [`RelayAnnouncement::sign`]: the identity key signs `switchboard-lan-relay-v1\n` ‖ expiry
//!   (u64 BE ms) ‖ certificate SHA-256 (32) ‖ URL length (u8) ‖ URL. Fixed widths and the length
//!   keep the string unambiguous; the context keeps it apart from a LAN binding's signature.
//! - It travels as a request of its own on a connection whose hello verified both ways; the
//!   receiver judges it only against the identity keys that peer proved in its hello
//!   ([`RelayAnnouncement::verify`]): a stranger's announcement never reaches this code, and a
//!   contact cannot announce for another.
//! - The URL must be `https://` on a LAN address (an IPv4 private, link-local or benchmarking
//!   address, or a `.local` name) with no path, query or credentials: a contact can vouch for a
//!   relay on the network we share, never re-pin a public name such as our own relay's.
//! - The expiry window is a binding's (it is signed with the day's bindings), so a stale
//!   announcement cannot be replayed for long.
//!
//! Wire form: expiry (u64 BE ms) ‖ SHA-256 (32) ‖ URL length (u8, 1..=[`MAX_URL`]) ‖ URL ‖
//! signature (64). It does not name the key, like a binding.

use std::net::Ipv4Addr;

use ed25519_dalek::SigningKey;

use super::{CLOCK_SKEW_MS, MAX_BINDING_VALIDITY_MS};
use crate::protocol::agent_identity::ed25519::{sign, verify_strict};

/// The domain separation prefix of the signed string.
pub const RELAY_CONTEXT: &[u8] = b"switchboard-lan-relay-v1\n";
/// Longest announced URL, in bytes.
pub const MAX_URL: usize = 200;

/// Why an announcement was refused. Every variant is the announcer's fault (or its clock's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnounceError {
    /// The bytes are not an announcement (peer).
    #[error("malformed relay announcement: {0}")]
    Malformed(&'static str),
    /// The URL is not an `https://` URL on a LAN address (peer).
    #[error("announced relay URL is not an https URL on the local network: {0}")]
    NotLan(String),
    /// The announcement's expiry has passed (peer, or a clock off by more than the skew).
    #[error("relay announcement expired")]
    Expired,
    /// The expiry is further ahead than any honest announcement's (peer).
    #[error("relay announcement expiry is too far in the future")]
    TooLong,
    /// None of the keys the peer proved signed it: forged, corrupted, or signed by someone else
    /// (peer).
    #[error("relay announcement is not signed by the announcing contact")]
    Foreign,
}

/// A signed relay announcement as it travels; untrusted until [`RelayAnnouncement::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayAnnouncement {
    expires_at_ms: i64,
    cert_sha256: [u8; 32],
    url: String,
    signature: [u8; 64],
}

/// An announcement a proven contact's key signed, for a LAN URL, within its window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedRelay {
    /// The identity key that signed it (one the peer proved in its hello).
    pub identity: [u8; 32],
    /// The relay's URL, canonical (`https://host:port`, no trailing slash).
    pub url: String,
    /// SHA-256 of the relay certificate's DER.
    pub cert_sha256: [u8; 32],
    /// When the announcement lapses.
    pub expires_at_ms: i64,
}

fn signed_string(expires_at_ms: i64, cert_sha256: &[u8; 32], url: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(RELAY_CONTEXT.len() + 8 + 32 + 1 + url.len());
    m.extend_from_slice(RELAY_CONTEXT);
    m.extend_from_slice(&expires_at_ms.to_be_bytes());
    m.extend_from_slice(cert_sha256);
    m.push(u8::try_from(url.len()).unwrap_or(u8::MAX));
    m.extend_from_slice(url.as_bytes());
    m
}

fn lan_ipv4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    (ip.is_private() || ip.is_link_local() || (a == 198 && (b & 0xfe) == 18))
        && !ip.is_loopback()
        && !ip.is_unspecified()
        && !ip.is_broadcast()
}

/// The canonical form of a relay URL a contact may vouch for: `https://` on a LAN IPv4 address
/// or a `.local` name, an optional port, no credentials, path, query or fragment (one trailing
/// `/` is dropped). The form is what a URL parser prints for it, minus the trailing slash:
/// lower-case name, port 443 left out. Parsed by hand (sans-io code has no URL crate) and
/// deliberately narrow: anything unusual is refused.
pub fn canonical_lan_url(text: &str) -> Result<String, AnnounceError> {
    let bad = || AnnounceError::NotLan(text.chars().take(MAX_URL).collect());
    let rest = text.strip_prefix("https://").ok_or_else(bad)?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.len() > MAX_URL {
        return Err(bad());
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => {
            let digits_ok =
                !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) && !p.starts_with('0');
            let port: u16 = if digits_ok { p.parse().map_err(|_| bad())? } else { return Err(bad()) };
            (h, Some(port))
        }
        None => (authority, None),
    };
    let host = if let Ok(ip) = host.parse::<Ipv4Addr>() {
        if !lan_ipv4(ip) {
            return Err(bad());
        }
        ip.to_string()
    } else {
        let name = host.to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        let stem = name.strip_suffix(".local").ok_or_else(bad)?;
        // A name of digits and dots only would be an IP address in another spelling.
        if !stem.split('.').all(label_ok) || stem.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(bad());
        }
        name
    };
    Ok(match port {
        Some(p) if p != 443 => format!("https://{host}:{p}"),
        _ => format!("https://{host}"),
    })
}

impl RelayAnnouncement {
    /// Signs an announcement of the relay at `url` (made canonical; refused unless it is a LAN
    /// URL) with certificate `cert_sha256`, valid until `expires_at_ms`.
    pub fn sign(
        identity: &SigningKey,
        url: &str,
        cert_sha256: [u8; 32],
        expires_at_ms: i64,
    ) -> Result<Self, AnnounceError> {
        let url = canonical_lan_url(url)?;
        if url.len() > MAX_URL {
            return Err(AnnounceError::Malformed("URL too long"));
        }
        let signature = sign(identity, &signed_string(expires_at_ms, &cert_sha256, &url));
        Ok(Self { expires_at_ms, cert_sha256, url, signature })
    }

    /// The announced URL (unverified until [`Self::verify`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The wire form.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 + 32 + 1 + self.url.len() + 64);
        v.extend_from_slice(&self.expires_at_ms.to_be_bytes());
        v.extend_from_slice(&self.cert_sha256);
        // `sign` and `decode` keep the URL within MAX_URL.
        v.push(u8::try_from(self.url.len()).unwrap_or(u8::MAX));
        v.extend_from_slice(self.url.as_bytes());
        v.extend_from_slice(&self.signature);
        v
    }

    /// Decodes exactly one announcement.
    pub fn decode(input: &[u8]) -> Result<Self, AnnounceError> {
        let short = AnnounceError::Malformed("truncated");
        let (expiry, rest) = input.split_first_chunk::<8>().ok_or(short.clone())?;
        let (cert_sha256, rest) = rest.split_first_chunk::<32>().ok_or(short.clone())?;
        let (&url_len, rest) = rest.split_first().ok_or(short.clone())?;
        let url_len = usize::from(url_len);
        if url_len == 0 || url_len > MAX_URL {
            return Err(AnnounceError::Malformed("URL length"));
        }
        let (url, rest) = rest.split_at_checked(url_len).ok_or(short.clone())?;
        let (signature, rest) = rest.split_first_chunk::<64>().ok_or(short)?;
        if !rest.is_empty() {
            return Err(AnnounceError::Malformed("trailing bytes"));
        }
        let url = std::str::from_utf8(url).map_err(|_| AnnounceError::Malformed("URL is not UTF-8"))?.to_owned();
        let expires_at_ms =
            i64::try_from(u64::from_be_bytes(*expiry)).map_err(|_| AnnounceError::Malformed("expiry out of range"))?;
        Ok(Self { expires_at_ms, cert_sha256: *cert_sha256, url, signature: *signature })
    }

    /// Judges an announcement from a peer that proved the identity keys `proven` (its hello), at
    /// `now_ms`: a LAN URL in canonical form, within the expiry window, signed by one of those
    /// keys.
    pub fn verify<'k>(
        &self,
        proven: impl IntoIterator<Item = &'k [u8; 32]>,
        now_ms: i64,
    ) -> Result<VerifiedRelay, AnnounceError> {
        if canonical_lan_url(&self.url)? != self.url {
            return Err(AnnounceError::Malformed("URL not in canonical form"));
        }
        if self.expires_at_ms.saturating_add(CLOCK_SKEW_MS) <= now_ms {
            return Err(AnnounceError::Expired);
        }
        if self.expires_at_ms > now_ms.saturating_add(MAX_BINDING_VALIDITY_MS) {
            return Err(AnnounceError::TooLong);
        }
        let signed = signed_string(self.expires_at_ms, &self.cert_sha256, &self.url);
        let identity = proven
            .into_iter()
            .find(|key| verify_strict(key, &signed, &self.signature).is_ok())
            .ok_or(AnnounceError::Foreign)?;
        Ok(VerifiedRelay {
            identity: *identity,
            url: self.url.clone(),
            cert_sha256: self.cert_sha256,
            expires_at_ms: self.expires_at_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;
    const DAY: i64 = 24 * 3600 * 1000;
    const URL: &str = "https://198.18.0.1:8443";

    fn alice() -> SigningKey {
        SigningKey::from_bytes(&[1; 32])
    }

    fn key(k: &SigningKey) -> [u8; 32] {
        k.verifying_key().to_bytes()
    }

    fn announcement() -> RelayAnnouncement {
        RelayAnnouncement::sign(&alice(), URL, [0xc5; 32], NOW + DAY).unwrap()
    }

    #[test]
    fn contacts_announcement_verifies_against_the_key_it_proved() {
        let other = [7; 32];
        let v = announcement().verify(&[other, key(&alice())], NOW).unwrap();
        assert_eq!(
            v,
            VerifiedRelay {
                identity: key(&alice()),
                url: URL.into(),
                cert_sha256: [0xc5; 32],
                expires_at_ms: NOW + DAY
            }
        );
    }

    #[test]
    fn announcement_round_trips_through_its_wire_form_without_naming_the_key() {
        let a = announcement();
        let bytes = a.to_bytes();
        assert_eq!(bytes.len(), 8 + 32 + 1 + URL.len() + 64);
        assert!(!bytes.windows(32).any(|w| w == key(&alice())));
        assert_eq!(RelayAnnouncement::decode(&bytes), Ok(a));
        for cut in 0..bytes.len() {
            assert!(RelayAnnouncement::decode(bytes.get(..cut).unwrap()).is_err(), "cut at {cut} decoded");
        }
        let mut longer = bytes;
        longer.push(0);
        assert_eq!(RelayAnnouncement::decode(&longer), Err(AnnounceError::Malformed("trailing bytes")));
    }

    #[test]
    fn announcement_signed_by_another_key_is_refused() {
        let mallory = SigningKey::from_bytes(&[2; 32]);
        let forged = RelayAnnouncement::sign(&mallory, URL, [0xc5; 32], NOW + DAY).unwrap();
        // Mallory is bound as herself but claims to speak for alice: only her own key counts.
        assert_eq!(forged.verify(&[key(&alice())], NOW), Err(AnnounceError::Foreign));
        // A peer that proved no key at all has nothing an announcement could verify against.
        assert_eq!(announcement().verify(&[], NOW), Err(AnnounceError::Foreign));
    }

    #[test]
    fn every_changed_byte_of_an_announcement_is_refused() {
        let honest = announcement().to_bytes();
        for i in 0..honest.len() {
            let mut b = honest.clone();
            *b.get_mut(i).unwrap() ^= 0x01;
            let Ok(a) = RelayAnnouncement::decode(&b) else { continue };
            assert!(a.verify(&[key(&alice())], NOW).is_err(), "flip at byte {i} verified");
        }
    }

    #[test]
    fn expired_or_too_long_announcement_is_refused() {
        let a = announcement();
        assert!(a.verify(&[key(&alice())], NOW + DAY + CLOCK_SKEW_MS - 1).is_ok());
        assert_eq!(a.verify(&[key(&alice())], NOW + DAY + CLOCK_SKEW_MS), Err(AnnounceError::Expired));
        let far = RelayAnnouncement::sign(&alice(), URL, [0; 32], NOW + MAX_BINDING_VALIDITY_MS + 1).unwrap();
        assert_eq!(far.verify(&[key(&alice())], NOW), Err(AnnounceError::TooLong));
    }

    #[test]
    fn only_https_urls_on_the_lan_can_be_announced() {
        for ok in
            ["https://198.18.0.1:8443", "https://192.168.1.20:8443/", "https://10.0.0.2", "https://studio.local:9000"]
        {
            assert!(RelayAnnouncement::sign(&alice(), ok, [0; 32], NOW).is_ok(), "{ok} refused");
        }
        assert_eq!(canonical_lan_url("https://192.168.1.20:8443/").unwrap(), "https://192.168.1.20:8443");
        for bad in [
            "http://198.18.0.1:8443",
            "https://relay.example",
            "https://8.8.8.8",
            "https://127.0.0.1:8443",
            "https://0.0.0.0:8443",
            "https://[fe80::1]:8443",
            "https://198.18.0.1:8443/other",
            "https://198.18.0.1:8443/?q",
            "https://user@198.18.0.1:8443",
            "https://.local",
            "not a url",
        ] {
            assert!(
                matches!(RelayAnnouncement::sign(&alice(), bad, [0; 32], NOW), Err(AnnounceError::NotLan(_))),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn announcement_with_a_non_canonical_or_public_url_on_the_wire_is_refused() {
        // A hand-made announcement (signature over the odd URL) still fails the URL rule.
        let mk = |url: &str| {
            let mut a = announcement();
            a.url = url.into();
            a.signature = sign(&alice(), &signed_string(a.expires_at_ms, &a.cert_sha256, url));
            RelayAnnouncement::decode(&a.to_bytes()).unwrap()
        };
        assert!(matches!(mk("https://relay.example").verify(&[key(&alice())], NOW), Err(AnnounceError::NotLan(_))));
        assert_eq!(
            mk("https://198.18.0.1:8443/").verify(&[key(&alice())], NOW),
            Err(AnnounceError::Malformed("URL not in canonical form"))
        );
    }
}
