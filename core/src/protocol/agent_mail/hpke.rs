//! RFC 9180 HPKE, Base mode only, for the one suite Agent Mail fixes: DHKEM(X25519, HKDF-SHA256)
//! `0x0020`, HKDF-SHA256 `0x0001`, ChaCha20-Poly1305 `0x0003`; one message per context, at
//! sequence number zero (so the AEAD nonce is `base_nonce`).
//!
//! Written out over x25519-dalek, hkdf and chacha20poly1305 rather than through the `hpke` crate
//! because the Agent Mail vectors fix the raw ephemeral X25519 secret, and `hpke` 0.15 only takes
//! an RNG whose output it runs through `DeriveKeyPair`: with it the published packets could be
//! opened but never reproduced. This file is checked against RFC 9180 Appendix A.2.1, against
//! every Agent Mail vector, and against the `hpke` crate in both directions (core/tests).

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use hkdf::{Hkdf, HkdfExtract};
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

/// `info` for every Agent Mail encryption: `UTF8("agent-mail/1.0")`.
pub const INFO: &[u8] = b"agent-mail/1.0";
/// Length of `enc` (an X25519 public key).
pub const ENC_LEN: usize = 32;
/// Length of the AEAD tag appended to the ciphertext.
pub const TAG_LEN: usize = 16;

const KEM_SUITE_ID: &[u8] = b"KEM\x00\x20";
const HPKE_SUITE_ID: &[u8] = b"HPKE\x00\x20\x00\x01\x00\x03";
const VERSION_LABEL: &[u8] = b"HPKE-v1";
const MODE_BASE: u8 = 0x00;

/// Why HPKE failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HpkeError {
    /// The peer public key (recipient key when sealing, `enc` when opening) is a low-order point:
    /// the shared secret would be all zeros (RFC 9180 §7.1.4). The key owner's fault.
    #[error("X25519 key gives an all-zero shared secret")]
    LowOrderKey,
    /// Authentication failed: tampered, wrong key, or different AAD. The sender's (or relay's)
    /// fault, or not for us.
    #[error("decryption failed")]
    Open,
    /// The AEAD refused to encrypt (plaintext beyond ChaCha20-Poly1305's limit): a local bug.
    #[error("encryption failed")]
    Seal,
}

/// `LabeledExtract(salt, label, ikm)`: the PRK bytes and an HKDF ready to expand from it.
fn labeled_extract_prk(suite_id: &[u8], salt: &[u8], label: &[u8], ikm: &[u8]) -> ([u8; 32], Hkdf<Sha256>) {
    let mut ctx = HkdfExtract::<Sha256>::new(Some(salt));
    ctx.input_ikm(VERSION_LABEL);
    ctx.input_ikm(suite_id);
    ctx.input_ikm(label);
    ctx.input_ikm(ikm);
    let (prk, hkdf) = ctx.finalize();
    let mut bytes = [0u8; 32];
    bytes.copy_from_slice(&prk);
    (bytes, hkdf)
}

fn labeled_extract(suite_id: &[u8], salt: &[u8], label: &[u8], ikm: &[u8]) -> Hkdf<Sha256> {
    labeled_extract_prk(suite_id, salt, label, ikm).1
}

fn labeled_expand(prk: &Hkdf<Sha256>, suite_id: &[u8], label: &[u8], info: &[u8], out: &mut [u8]) {
    let len = u16::try_from(out.len()).unwrap_or(u16::MAX).to_be_bytes();
    // Only called with 12- and 32-byte outputs, far below HKDF-SHA256's 8160-byte limit.
    let _ = prk.expand_multi_info(&[&len, VERSION_LABEL, suite_id, label, info], out);
}

/// The KEM shared secret: `ExtractAndExpand(dh, enc || pkR)`.
fn kem_shared_secret(dh: &[u8; 32], enc: &[u8; 32], pk_r: &[u8; 32]) -> Zeroizing<[u8; 32]> {
    let eae_prk = labeled_extract(KEM_SUITE_ID, b"", b"eae_prk", dh);
    let mut shared = Zeroizing::new([0u8; 32]);
    labeled_expand(&eae_prk, KEM_SUITE_ID, b"shared_secret", &[enc.as_slice(), pk_r].concat(), shared.as_mut());
    shared
}

/// The Base-mode key schedule: AEAD key and base nonce.
fn key_schedule(shared: &[u8; 32], info: &[u8]) -> (Zeroizing<[u8; 32]>, [u8; 12]) {
    // LabeledExtract("", "psk_id_hash", "") and LabeledExtract("", "info_hash", info).
    let psk_id_hash = labeled_extract_bytes(b"", b"psk_id_hash", b"");
    let info_hash = labeled_extract_bytes(b"", b"info_hash", info);
    let mut context = Vec::with_capacity(65);
    context.push(MODE_BASE);
    context.extend_from_slice(&psk_id_hash);
    context.extend_from_slice(&info_hash);
    let secret = labeled_extract(HPKE_SUITE_ID, shared, b"secret", b"");
    let mut key = Zeroizing::new([0u8; 32]);
    labeled_expand(&secret, HPKE_SUITE_ID, b"key", &context, key.as_mut());
    let mut base_nonce = [0u8; 12];
    labeled_expand(&secret, HPKE_SUITE_ID, b"base_nonce", &context, &mut base_nonce);
    (key, base_nonce)
}

fn labeled_extract_bytes(salt: &[u8], label: &[u8], ikm: &[u8]) -> [u8; 32] {
    labeled_extract_prk(HPKE_SUITE_ID, salt, label, ikm).0
}

/// Whether an X25519 public key is usable: not a low-order point (which would make every shared
/// secret all zeros). Exact, since clamped scalars are multiples of the cofactor.
pub fn is_usable_public_key(public_key: &[u8; 32]) -> bool {
    x25519_dalek::x25519([0x42; 32], *public_key) != [0u8; 32]
}

/// `SealBase(pkR, info, aad, pt)` with the ephemeral secret `sk_e` (fresh randomness in
/// production; fixed only in test vectors). Returns `(enc, ciphertext || tag)`.
pub fn seal_base(
    pk_r: &[u8; 32],
    info: &[u8],
    aad: &[u8],
    plaintext: &[u8],
    sk_e: Zeroizing<[u8; 32]>,
) -> Result<([u8; 32], Vec<u8>), HpkeError> {
    let eph = StaticSecret::from(*sk_e);
    let enc = PublicKey::from(&eph).to_bytes();
    let dh = eph.diffie_hellman(&PublicKey::from(*pk_r));
    if !dh.was_contributory() {
        return Err(HpkeError::LowOrderKey);
    }
    let shared = kem_shared_secret(dh.as_bytes(), &enc, pk_r);
    let (key, base_nonce) = key_schedule(&shared, info);
    let cipher = ChaCha20Poly1305::new((&*key).into());
    let ct = cipher.encrypt(&Nonce::from(base_nonce), Payload { msg: plaintext, aad }).map_err(|_| HpkeError::Seal)?;
    Ok((enc, ct))
}

/// `OpenBase(enc, skR, info, aad, ct)`.
pub fn open_base(
    sk_r: &StaticSecret,
    enc: &[u8; 32],
    info: &[u8],
    aad: &[u8],
    ciphertext: &[u8],
) -> Result<Zeroizing<Vec<u8>>, HpkeError> {
    let dh = sk_r.diffie_hellman(&PublicKey::from(*enc));
    if !dh.was_contributory() {
        return Err(HpkeError::LowOrderKey);
    }
    let pk_r = PublicKey::from(sk_r).to_bytes();
    let shared = kem_shared_secret(dh.as_bytes(), enc, &pk_r);
    let (key, base_nonce) = key_schedule(&shared, info);
    let cipher = ChaCha20Poly1305::new((&*key).into());
    cipher
        .decrypt(&Nonce::from(base_nonce), Payload { msg: ciphertext, aad })
        .map(Zeroizing::new)
        .map_err(|_| HpkeError::Open)
}
