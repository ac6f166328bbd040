//! Sealing and opening letagents envelopes: `"LA1" ‖ eph.pub ‖ nonce ‖ AES-256-GCM(plain)`.

use aes_gcm::aead::{AeadInOut, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use hkdf::Hkdf;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

use super::address::{Address, PeerKeys};
use super::inner::{Inner, InnerError, Kind};
use super::{MAX_ENVELOPE, MIN_ENVELOPE};
use crate::util::{Rng, b64u, b64u_array};

const MAGIC: &[u8; 3] = b"LA1";
const SIG_CONTEXT: &[u8] = b"letagents-msg-v1\n";
const HKDF_INFO: &[u8] = b"letagents-v1 aes-256-gcm";
const AAD_PREFIX: &[u8] = b"letagents-v1";
const BLOCK: usize = 1024;
const HEADER: usize = 3 + 32 + 12;
const TAG: usize = 16;

/// The plaintext object inside the envelope.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Plain<'a> {
    #[serde(borrow)]
    inner: std::borrow::Cow<'a, str>,
    sig: std::borrow::Cow<'a, str>,
}

/// Why sealing failed (always a local mistake: an oversized message or bad recipient key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The sealed envelope would exceed 32 KiB.
    #[error("message too large: the envelope would be {0} bytes, over the 32768-byte limit")]
    TooLarge(usize),
    /// The recipient's box key is a low-order point.
    #[error("recipient box key is not a usable X25519 key")]
    BadRecipientKey,
}

/// Why an envelope was refused. Every variant is the peer's (or the relay's) fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Too short, too long, wrong magic, or a padded length that is not a multiple of 1024.
    #[error("malformed envelope framing")]
    Framing,
    /// The ephemeral key gives an all-zero shared secret.
    #[error("ephemeral key is a low-order point")]
    WeakKey,
    /// AES-GCM authentication failed: tampered, or not for us.
    #[error("decryption failed (tampered, or sealed to another key)")]
    Decrypt,
    /// The plaintext is not `{inner, sig}` JSON with padding.
    #[error("plaintext is not a valid letagents object")]
    Plain,
    /// `inner` is not valid JSON of the expected shape.
    #[error("inner message is malformed: {0}")]
    InnerJson(String),
    /// `inner` fails validation.
    #[error("inner message is invalid: {0}")]
    Inner(#[from] InnerError),
    /// The signature does not verify against `inner.from`.
    #[error("signature does not verify against the sender's key")]
    Signature,
    /// `inner.to` names another mailbox.
    #[error("message is addressed to another mailbox")]
    WrongRecipient,
}

/// A successfully opened and authenticated message.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The parsed `inner`.
    pub inner: Inner,
    /// Its kind, validated.
    pub kind: Kind,
    /// The sender's address (with drop only for `hello`).
    pub from: Address,
    /// The exact signed bytes.
    pub inner_json: String,
}

impl Opened {
    /// The sender's keys.
    pub fn sender(&self) -> &PeerKeys {
        &self.from.keys
    }
}

fn derive_key(shared: &[u8; 32], eph_pub: &[u8; 32], recipient_box: &[u8; 32]) -> Zeroizing<[u8; 32]> {
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(eph_pub);
    salt[32..].copy_from_slice(recipient_box);
    let hk = Hkdf::<Sha256>::new(Some(&salt), shared);
    let mut key = Zeroizing::new([0u8; 32]);
    // 32 bytes is always a valid HKDF-SHA256 output length.
    #[allow(clippy::expect_used)]
    hk.expand(HKDF_INFO, key.as_mut()).expect("32 is a valid HKDF output length");
    key
}

fn aad(recipient_id: &str) -> Vec<u8> {
    let mut aad = AAD_PREFIX.to_vec();
    aad.extend_from_slice(recipient_id.as_bytes());
    aad
}

fn signed_bytes(eph_pub: &[u8; 32], inner_json: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SIG_CONTEXT.len() + 33 + inner_json.len());
    m.extend_from_slice(SIG_CONTEXT);
    m.extend_from_slice(eph_pub);
    m.push(b'\n');
    m.extend_from_slice(inner_json);
    m
}

/// Seals `inner_json` (the exact bytes to sign) from `sender` to `recipient`.
pub fn seal(
    sender: &SigningKey,
    recipient: &PeerKeys,
    inner_json: &str,
    rng: &mut dyn Rng,
) -> Result<Vec<u8>, SealError> {
    let mut eph_secret = Zeroizing::new([0u8; 32]);
    rng.fill(eph_secret.as_mut());
    let eph = StaticSecret::from(*eph_secret);
    let eph_pub = PublicKey::from(&eph).to_bytes();

    let sig = sender.sign(&signed_bytes(&eph_pub, inner_json.as_bytes()));
    let sig_b64 = b64u(&sig.to_bytes());
    let plain = Plain { inner: inner_json.into(), sig: sig_b64.into() };
    // One buffer for the whole envelope: the header, the plaintext JSON written right after it
    // and padded, encrypted in place, then the tag. (The JSON escapes `inner`'s quotes: a little
    // more than `inner` itself, rarely over the spare block.)
    let room = HEADER + (inner_json.len() + inner_json.len() / 8 + 128).div_ceil(BLOCK) * BLOCK + TAG;
    let mut out = Zeroizing::new(Vec::with_capacity(room.min(MAX_ENVELOPE)));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&eph_pub);
    out.extend_from_slice(&[0u8; 12]);
    serde_json::to_writer(&mut *out, &plain).map_err(|_| SealError::TooLarge(0))?;
    let padded = (out.len() - HEADER).div_ceil(BLOCK).max(1) * BLOCK;
    let total = HEADER + padded + TAG;
    if total > MAX_ENVELOPE {
        return Err(SealError::TooLarge(total));
    }
    out.resize(HEADER + padded, b' ');

    let shared = eph.diffie_hellman(&PublicKey::from(recipient.boxk));
    if !shared.was_contributory() {
        return Err(SealError::BadRecipientKey);
    }
    let key = derive_key(shared.as_bytes(), &eph_pub, &recipient.boxk);
    let mut nonce = [0u8; 12];
    rng.fill(&mut nonce);
    out.get_mut(3 + 32..HEADER).ok_or(SealError::TooLarge(total))?.copy_from_slice(&nonce);
    let cipher = Aes256Gcm::new((&*key).into());
    let aad = aad(&recipient.mailbox_id());
    let body = out.get_mut(HEADER..).ok_or(SealError::TooLarge(total))?;
    let tag = cipher
        .encrypt_inout_detached(&Nonce::from(nonce), &aad, body.into())
        .map_err(|_| SealError::TooLarge(total))?;
    out.extend_from_slice(&tag);
    // Only ciphertext is left in the buffer: hand it out without the wipe.
    Ok(std::mem::take(&mut *out))
}

/// Checks the framing rules a receiver applies before anything else is read.
pub fn check_framing(envelope: &[u8]) -> Result<(), OpenError> {
    let len = envelope.len();
    if !(MIN_ENVELOPE..=MAX_ENVELOPE).contains(&len)
        || !envelope.starts_with(MAGIC)
        || !(len - HEADER - TAG).is_multiple_of(BLOCK)
    {
        return Err(OpenError::Framing);
    }
    Ok(())
}

/// Opens an envelope addressed to `me` (whose box secret is `my_box`): decrypts, verifies the
/// signature against `inner.from`, and checks `inner.to`.
pub fn open(envelope: &[u8], my_box: &StaticSecret, me: &PeerKeys) -> Result<Opened, OpenError> {
    check_framing(envelope)?;
    let eph_pub: [u8; 32] = envelope.get(3..35).and_then(|s| s.try_into().ok()).ok_or(OpenError::Framing)?;
    let nonce: [u8; 12] = envelope.get(35..HEADER).and_then(|s| s.try_into().ok()).ok_or(OpenError::Framing)?;
    let ct = envelope.get(HEADER..envelope.len() - TAG).ok_or(OpenError::Framing)?;
    let tag = envelope.get(envelope.len() - TAG..).ok_or(OpenError::Framing)?;
    let tag = aes_gcm::Tag::try_from(tag).map_err(|_| OpenError::Framing)?;

    let shared = my_box.diffie_hellman(&PublicKey::from(eph_pub));
    if !shared.was_contributory() {
        return Err(OpenError::WeakKey);
    }
    let key = derive_key(shared.as_bytes(), &eph_pub, &me.boxk);
    let cipher = Aes256Gcm::new((&*key).into());
    let my_id = me.mailbox_id();
    let aad = aad(&my_id);
    let mut plain = Zeroizing::new(ct.to_vec());
    cipher
        .decrypt_inout_detached(&Nonce::from(nonce), &aad, plain.as_mut_slice().into(), &tag)
        .map_err(|_| OpenError::Decrypt)?;

    let json_end = plain.iter().rposition(|b| *b != b' ').map_or(0, |i| i + 1);
    let json = plain.get(..json_end).ok_or(OpenError::Plain)?;
    let parsed: Plain<'_> = serde_json::from_slice(json).map_err(|_| OpenError::Plain)?;
    let sig = b64u_array::<64>(&parsed.sig).ok_or(OpenError::Plain)?;
    let inner_json = parsed.inner.into_owned();

    let inner: Inner = serde_json::from_str(&inner_json).map_err(|e| OpenError::InnerJson(e.to_string()))?;
    let (kind, from) = inner.validate()?;
    let vk = VerifyingKey::from_bytes(&from.keys.sig).map_err(|_| OpenError::Signature)?;
    vk.verify_strict(&signed_bytes(&eph_pub, inner_json.as_bytes()), &Signature::from_bytes(&sig))
        .map_err(|_| OpenError::Signature)?;
    if inner.to != my_id {
        return Err(OpenError::WrongRecipient);
    }
    Ok(Opened { inner, kind, from, inner_json })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SeededRng;

    pub(crate) struct Party {
        pub sig: SigningKey,
        pub boxs: StaticSecret,
        pub keys: PeerKeys,
    }

    pub(crate) fn party(seed: u8) -> Party {
        let sig = SigningKey::from_bytes(&[seed; 32]);
        let boxs = StaticSecret::from([seed.wrapping_add(100); 32]);
        let keys = PeerKeys { sig: sig.verifying_key().to_bytes(), boxk: PublicKey::from(&boxs).to_bytes() };
        Party { sig, boxs, keys }
    }

    fn message(from: &Party, to: &Party, body: &str) -> String {
        let inner = Inner::new(
            &from.keys,
            &to.keys.mailbox_id(),
            1_700_000_000_000,
            uuid::Uuid::from_bytes([5; 16]),
            Kind::Send,
            body.into(),
        );
        serde_json::to_string(&inner).unwrap()
    }

    #[test]
    fn sealed_message_opens_for_its_recipient() {
        let (alice, bob) = (party(1), party(2));
        let json = message(&alice, &bob, "hello bob");
        let env = seal(&alice.sig, &bob.keys, &json, &mut SeededRng::new([0; 32])).unwrap();
        assert_eq!(env.len(), MIN_ENVELOPE);
        let opened = open(&env, &bob.boxs, &bob.keys).unwrap();
        assert_eq!(opened.inner_json, json);
        assert_eq!(opened.inner.text(), "hello bob");
        assert_eq!(opened.sender(), &alice.keys);
    }

    /// Seal writes into one buffer and encrypts in place; its bytes must stay exactly those of
    /// the plain construction: JSON of `{inner, sig}`, spaces to a multiple of 1024,
    /// AES-256-GCM with the tag appended, after `LA1 ‖ eph.pub ‖ nonce`.
    #[test]
    fn sealed_bytes_are_those_of_the_plain_construction() {
        use crate::util::Rng as _;
        use aes_gcm::aead::{Aead, Payload};
        let (alice, bob) = (party(1), party(2));
        for body in ["", "quote \" and backslash \\ and \u{1}", "long ".repeat(1000).as_str()] {
            let json = message(&alice, &bob, body);
            let env = seal(&alice.sig, &bob.keys, &json, &mut SeededRng::new([9; 32])).unwrap();

            let mut rng = SeededRng::new([9; 32]);
            let mut eph = [0u8; 32];
            rng.fill(&mut eph);
            let eph = StaticSecret::from(eph);
            let eph_pub = PublicKey::from(&eph).to_bytes();
            let sig = alice.sig.sign(&signed_bytes(&eph_pub, json.as_bytes()));
            let plain = Plain { inner: json.as_str().into(), sig: b64u(&sig.to_bytes()).into() };
            let mut plain = serde_json::to_vec(&plain).unwrap();
            plain.resize(plain.len().div_ceil(BLOCK) * BLOCK, b' ');
            let shared = eph.diffie_hellman(&PublicKey::from(bob.keys.boxk));
            let key = derive_key(shared.as_bytes(), &eph_pub, &bob.keys.boxk);
            let mut nonce = [0u8; 12];
            rng.fill(&mut nonce);
            let aad = aad(&bob.keys.mailbox_id());
            let ct = Aes256Gcm::new((&*key).into())
                .encrypt(&Nonce::from(nonce), Payload { msg: &plain, aad: &aad })
                .unwrap();
            assert_eq!(env, [MAGIC.as_slice(), &eph_pub, &nonce, &ct].concat());
        }
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let (alice, bob) = (party(1), party(2));
        let env = seal(&alice.sig, &bob.keys, &message(&alice, &bob, "x"), &mut SeededRng::new([1; 32])).unwrap();
        for i in 0..env.len() {
            let mut bad = env.clone();
            bad[i] ^= 0x01;
            assert!(open(&bad, &bob.boxs, &bob.keys).is_err(), "flip at byte {i} was accepted");
        }
    }

    #[test]
    fn envelope_for_someone_else_does_not_open() {
        let (alice, bob, carol) = (party(1), party(2), party(3));
        let env = seal(&alice.sig, &bob.keys, &message(&alice, &bob, "x"), &mut SeededRng::new([1; 32])).unwrap();
        assert_eq!(open(&env, &carol.boxs, &carol.keys).unwrap_err(), OpenError::Decrypt);
    }

    #[test]
    fn inner_to_another_mailbox_is_refused_even_when_sealed_to_us() {
        let (alice, bob, carol) = (party(1), party(2), party(3));
        // Alice seals to Bob's key a message whose inner.to is Carol (a forwarded envelope).
        let env = seal(&alice.sig, &bob.keys, &message(&alice, &carol, "x"), &mut SeededRng::new([1; 32])).unwrap();
        assert_eq!(open(&env, &bob.boxs, &bob.keys).unwrap_err(), OpenError::WrongRecipient);
    }

    #[test]
    fn signature_by_another_key_is_refused() {
        let (alice, bob, mallory) = (party(1), party(2), party(4));
        // Mallory signs a message that claims to be from Alice.
        let env = seal(&mallory.sig, &bob.keys, &message(&alice, &bob, "x"), &mut SeededRng::new([1; 32])).unwrap();
        assert_eq!(open(&env, &bob.boxs, &bob.keys).unwrap_err(), OpenError::Signature);
    }

    #[test]
    fn size_limits_hold_at_the_boundary() {
        let (alice, bob) = (party(1), party(2));
        // Find the largest body that still seals; one more byte must be refused.
        let mut n = 31_000;
        while seal(&alice.sig, &bob.keys, &message(&alice, &bob, &"a".repeat(n + 1)), &mut SeededRng::new([1; 32]))
            .is_ok()
        {
            n += 1;
        }
        let env =
            seal(&alice.sig, &bob.keys, &message(&alice, &bob, &"a".repeat(n)), &mut SeededRng::new([1; 32])).unwrap();
        assert_eq!(env.len(), HEADER + 31 * BLOCK + TAG);
        assert!(matches!(
            seal(&alice.sig, &bob.keys, &message(&alice, &bob, &"a".repeat(n + 1)), &mut SeededRng::new([1; 32])),
            Err(SealError::TooLarge(_))
        ));
        assert_eq!(check_framing(&vec![b'L'; MIN_ENVELOPE - 1]), Err(OpenError::Framing));
        let mut big = b"LA1".to_vec();
        big.resize(HEADER + 32 * BLOCK + TAG, 0);
        assert_eq!(check_framing(&big), Err(OpenError::Framing), "over 32 KiB");
    }

    #[test]
    fn plaintext_is_padded_to_1024() {
        let (alice, bob) = (party(1), party(2));
        for len in [0usize, 500, 900, 1100, 5000] {
            let env =
                seal(&alice.sig, &bob.keys, &message(&alice, &bob, &"z".repeat(len)), &mut SeededRng::new([2; 32]))
                    .unwrap();
            assert_eq!((env.len() - HEADER - TAG) % BLOCK, 0);
            check_framing(&env).unwrap();
        }
    }
}
