//! Stringcup ECIES (X25519 + HKDF-SHA256 + AES-256-GCM) and key fingerprints, as in B.2–B.4 and
//! B.7 of the spec.

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use data_encoding::BASE64;
use hkdf::Hkdf;
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

use crate::util::{Rng, b64u, hex, sha256};

/// The `header.algo` value.
pub const ALGO: &str = "x25519+ecies+aes256gcm";
/// The `header.version` value.
pub const VERSION: u64 = 2;
const SALT: &[u8] = b"stringcup-v2-msg";

/// The message header as sent (base64 fields, standard alphabet with padding).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Header {
    /// Always 2.
    pub version: u64,
    /// Always [`ALGO`].
    pub algo: String,
    /// Base64 of the 32-byte ephemeral public key.
    pub ephemeral_pub: String,
    /// Base64 of the 12-byte IV.
    pub iv: String,
}

/// Why a message could not be opened. All are the peer's (or relay's) fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Unknown version or algorithm.
    #[error("unsupported header (version {0}, algo {1})")]
    Header(u64, String),
    /// A field is not base64 of the right length.
    #[error("malformed `{0}`")]
    Encoding(&'static str),
    /// The ephemeral key gives an all-zero shared secret.
    #[error("ephemeral key is a low-order point")]
    WeakKey,
    /// Authentication failed: tampered, wrong key, or the sender id is not who sealed it.
    #[error("decryption failed (tampered, another recipient, or another sender)")]
    Decrypt,
    /// The plaintext is not UTF-8.
    #[error("plaintext is not UTF-8")]
    Utf8,
}

/// Why sealing failed (local).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The recipient's key is a low-order point.
    #[error("recipient key is not a usable X25519 key")]
    BadRecipientKey,
}

/// The message key: HKDF-SHA256(ikm = shared, salt = "stringcup-v2-msg", info = "sender->recipient").
pub fn message_key(shared: &[u8; 32], sender_id: &str, recipient_id: &str) -> Zeroizing<[u8; 32]> {
    let info = format!("{sender_id}->{recipient_id}");
    let mut key = Zeroizing::new([0u8; 32]);
    // 32 bytes is always a valid HKDF-SHA256 output length.
    #[allow(clippy::expect_used)]
    Hkdf::<Sha256>::new(Some(SALT), shared).expand(info.as_bytes(), key.as_mut()).expect("valid length");
    key
}

/// Encrypts `plaintext` from `sender_id` to `recipient_id` (whose static key is `recipient`),
/// with the ephemeral secret and IV drawn from `rng`. Returns the header and base64 ciphertext.
pub fn seal(
    sender_id: &str,
    recipient_id: &str,
    recipient: &[u8; 32],
    plaintext: &str,
    rng: &mut dyn Rng,
) -> Result<(Header, String), SealError> {
    let mut eph = Zeroizing::new([0u8; 32]);
    rng.fill(eph.as_mut());
    let mut iv = [0u8; 12];
    rng.fill(&mut iv);
    seal_with(sender_id, recipient_id, recipient, plaintext, &eph, iv)
}

/// [`seal`] with explicit ephemeral secret and IV (test vectors).
pub fn seal_with(
    sender_id: &str,
    recipient_id: &str,
    recipient: &[u8; 32],
    plaintext: &str,
    eph_secret: &[u8; 32],
    iv: [u8; 12],
) -> Result<(Header, String), SealError> {
    let eph = StaticSecret::from(*eph_secret);
    let eph_pub = PublicKey::from(&eph);
    let shared = eph.diffie_hellman(&PublicKey::from(*recipient));
    if !shared.was_contributory() {
        return Err(SealError::BadRecipientKey);
    }
    let key = message_key(shared.as_bytes(), sender_id, recipient_id);
    let ct = Aes256Gcm::new((&*key).into())
        .encrypt(&Nonce::from(iv), plaintext.as_bytes())
        .map_err(|_| SealError::BadRecipientKey)?;
    let header = Header {
        version: VERSION,
        algo: ALGO.into(),
        ephemeral_pub: BASE64.encode(eph_pub.as_bytes()),
        iv: BASE64.encode(&iv),
    };
    Ok((header, BASE64.encode(&ct)))
}

fn decode<const N: usize>(field: &'static str, text: &str) -> Result<[u8; N], OpenError> {
    BASE64.decode(text.as_bytes()).ok().and_then(|v| v.try_into().ok()).ok_or(OpenError::Encoding(field))
}

/// Decrypts a message from `sender_id` to us (`my_id`, static secret `me`).
pub fn open(
    sender_id: &str,
    my_id: &str,
    me: &StaticSecret,
    header: &Header,
    ciphertext: &str,
) -> Result<String, OpenError> {
    if header.version != VERSION || header.algo != ALGO {
        return Err(OpenError::Header(header.version, header.algo.clone()));
    }
    let eph: [u8; 32] = decode("ephemeral_pub", &header.ephemeral_pub)?;
    let iv: [u8; 12] = decode("iv", &header.iv)?;
    let ct = BASE64.decode(ciphertext.as_bytes()).map_err(|_| OpenError::Encoding("ciphertext"))?;
    let shared = me.diffie_hellman(&PublicKey::from(eph));
    if !shared.was_contributory() {
        return Err(OpenError::WeakKey);
    }
    let key = message_key(shared.as_bytes(), sender_id, my_id);
    let plain =
        Aes256Gcm::new((&*key).into()).decrypt(&Nonce::from(iv), ct.as_slice()).map_err(|_| OpenError::Decrypt)?;
    String::from_utf8(plain).map_err(|_| OpenError::Utf8)
}

/// `"sha256:"` + unpadded base64url of SHA-256(raw public key) (B.7). The client always computes
/// it locally; the relay serves it beside every key.
pub fn fingerprint(public_key: &[u8]) -> String {
    format!("sha256:{}", b64u(&sha256(public_key)))
}

/// The first 16 hex characters of SHA-256(raw public key), in groups of four (B.7).
pub fn fingerprint_short(public_key: &[u8]) -> String {
    let h = hex(&sha256(public_key));
    let first: Vec<&str> = (0..4).filter_map(|i| h.get(i * 4..i * 4 + 4)).collect();
    first.join("-")
}

/// Decodes a base64 (standard, padded) 32-byte public key, as the relay serves them.
pub fn decode_public_key(text: &str) -> Option<[u8; 32]> {
    BASE64.decode(text.as_bytes()).ok()?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published vector, `../shared/vectors/stringcup-v2.vectors.json`, byte for byte.
    #[test]
    fn published_vector() {
        let v: serde_json::Value =
            serde_json::from_str(include_str!("../../../tests/vectors/stringcup-v2.vectors.json")).unwrap();
        let i = &v["inputs"];
        let b = |k: &str| BASE64.decode(i[k].as_str().unwrap().as_bytes()).unwrap();
        let arr = |k: &str| -> [u8; 32] { b(k).try_into().unwrap() };
        let (sender, recipient) = (i["sender_id"].as_str().unwrap(), i["recipient_id"].as_str().unwrap());
        let eph = StaticSecret::from(arr("ephemeral_private"));
        assert_eq!(BASE64.encode(PublicKey::from(&eph).as_bytes()), i["ephemeral_public"].as_str().unwrap());
        let recipient_priv = StaticSecret::from(arr("recipient_static_private"));
        assert_eq!(BASE64.encode(PublicKey::from(&recipient_priv).as_bytes()), i["recipient_static_public"]);
        let shared = eph.diffie_hellman(&PublicKey::from(arr("recipient_static_public")));
        assert_eq!(BASE64.encode(shared.as_bytes()), v["expected"]["shared_secret"]);
        let key = message_key(shared.as_bytes(), sender, recipient);
        assert_eq!(BASE64.encode(key.as_ref()), v["expected"]["message_key"]);
        let iv: [u8; 12] = b("iv").try_into().unwrap();
        let plaintext = i["plaintext"].as_str().unwrap();
        let (header, ct) =
            seal_with(sender, recipient, &arr("recipient_static_public"), plaintext, &arr("ephemeral_private"), iv)
                .unwrap();
        assert_eq!(ct, v["expected"]["ciphertext"].as_str().unwrap());
        assert_eq!(header.ephemeral_pub, i["ephemeral_public"].as_str().unwrap());
        // decrypt_check: the recipient recovers the plaintext; the wrong direction does not.
        assert_eq!(open(sender, recipient, &recipient_priv, &header, &ct).unwrap(), plaintext);
        assert_eq!(open(recipient, sender, &recipient_priv, &header, &ct), Err(OpenError::Decrypt));
    }

    #[test]
    fn fingerprints_follow_b7() {
        let key = decode_public_key("ssZ6QL5hX0NQkCEOqIHYR4wtTCYsMyEKd5XY9VTg23o=").unwrap();
        assert_eq!(fingerprint(&key), "sha256:JLv6MQ0Yw8JV_Cv64fmVTyXN8p0V5v5BF22BaLbTcLo");
        assert_eq!(fingerprint_short(&key), "24bb-fa31-0d18-c3c2");
    }

    #[test]
    fn tampering_and_bad_headers_are_refused() {
        let me = StaticSecret::from([9u8; 32]);
        let my_pub = PublicKey::from(&me).to_bytes();
        let (header, ct) = seal("sc-a", "sc-b", &my_pub, "hi", &mut crate::util::SeededRng::new([1; 32])).unwrap();
        let mut raw = BASE64.decode(ct.as_bytes()).unwrap();
        raw[0] ^= 1;
        assert_eq!(open("sc-a", "sc-b", &me, &header, &BASE64.encode(&raw)), Err(OpenError::Decrypt));
        let mut h = header.clone();
        h.algo = "rot13".into();
        assert!(matches!(open("sc-a", "sc-b", &me, &h, &ct), Err(OpenError::Header(..))));
        let mut h = header;
        h.iv = "AAAA".into();
        assert_eq!(open("sc-a", "sc-b", &me, &h, &ct), Err(OpenError::Encoding("iv")));
    }
}
