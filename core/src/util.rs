//! Small shared helpers: base64url/base32 codecs, clocks and the randomness source that sans-io
//! code takes as a parameter.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use data_encoding::BASE32_NOPAD;

/// base64url without padding, the encoding every letagents and Agent Mail binary value uses in
/// text (the `base64` crate: unlike data-encoding's generic codec it stays fast in the dev
/// profile's opt-level 1, ~13× on a 22 KB ciphertext; the two are equal when optimised).
pub fn b64u(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes canonical base64url without padding: padding, the standard alphabet, a length of 1
/// mod 4 and non-zero trailing bits are refused, so every accepted text is exactly what [`b64u`]
/// gives for its bytes (the tests check this exhaustively for short texts).
pub fn b64u_decode(text: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(text.as_bytes()).ok()
}

/// Decodes base64url into exactly `N` bytes.
pub fn b64u_array<const N: usize>(text: &str) -> Option<[u8; N]> {
    b64u_decode(text)?.try_into().ok()
}

/// RFC 4648 base32, upper case, no padding.
pub fn base32(bytes: &[u8]) -> String {
    BASE32_NOPAD.encode(bytes)
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    data_encoding::HEXLOWER.encode(bytes)
}

/// Decodes hex in either case.
pub fn hex_decode(text: &str) -> Option<Vec<u8>> {
    data_encoding::HEXLOWER_PERMISSIVE.decode(text.as_bytes()).ok()
}

/// Unix time in milliseconds from the system clock. Only binaries and the engine call this;
/// protocol code takes `now` as an argument.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A source of cryptographic randomness, injected into sans-io code so tests can be
/// deterministic.
pub trait Rng {
    /// Fills `buf` with random bytes.
    fn fill(&mut self, buf: &mut [u8]);
}

/// The operating system's CSPRNG.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsRng;

impl Rng for OsRng {
    fn fill(&mut self, buf: &mut [u8]) {
        // getrandom fails only when the OS has no entropy source at all; there is nothing
        // sensible to do then but stop.
        #[allow(clippy::expect_used)]
        getrandom::fill(buf).expect("the operating system's random source failed");
    }
}

/// Random bytes from the OS.
pub fn random_array<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    OsRng.fill(&mut out);
    out
}

/// A deterministic generator for tests and golden vectors (SHA-256 in counter mode).
#[derive(Debug, Clone)]
pub struct SeededRng {
    seed: [u8; 32],
    counter: u64,
}

impl SeededRng {
    /// A generator whose output depends only on `seed`.
    pub fn new(seed: [u8; 32]) -> Self {
        Self { seed, counter: 0 }
    }
}

impl Rng for SeededRng {
    fn fill(&mut self, buf: &mut [u8]) {
        use sha2::{Digest, Sha256};
        for chunk in buf.chunks_mut(32) {
            let mut h = Sha256::new();
            h.update(self.seed);
            h.update(self.counter.to_be_bytes());
            self.counter += 1;
            let block = h.finalize();
            for (dst, src) in chunk.iter_mut().zip(block.iter()) {
                *dst = *src;
            }
        }
    }
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b64u_rejects_padding_and_noncanonical_bits() {
        assert_eq!(b64u(&[0xff]), "_w");
        assert!(b64u_decode("_w==").is_none());
        assert!(b64u_decode("_x").is_none(), "non-zero trailing bits must be refused");
        assert_eq!(b64u_array::<1>("_w"), Some([0xff]));
        assert_eq!(b64u_array::<2>("_w"), None);
    }

    /// Decoding accepts a text exactly when it is the canonical encoding of its bytes: every
    /// text of up to three characters over the alphabet, padding, `+`, `/` and a space.
    #[test]
    fn b64u_decode_accepts_only_canonical_text() {
        let alphabet: Vec<char> =
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/ ".chars().collect();
        let mut texts = vec![String::new()];
        let mut all = vec![String::new()];
        for _ in 0..3 {
            texts = texts.iter().flat_map(|t| alphabet.iter().map(move |c| format!("{t}{c}"))).collect();
            all.extend(texts.iter().cloned());
        }
        let mut accepted = 0;
        for text in &all {
            if let Some(bytes) = b64u_decode(text) {
                assert_eq!(b64u(&bytes), *text, "{text:?} decoded but is not canonical");
                accepted += 1;
            }
        }
        // Every accepted text is canonical (above), and there are exactly as many accepted as
        // canonical texts of up to three characters, so nothing canonical is refused either.
        // The canonical ones: the empty text, 64 × 4 of two characters (one byte: the second
        // character's low 4 bits zero) and 64 × 64 × 16 of three (two bytes: low 2 bits zero).
        assert_eq!(accepted, 1 + 64 * 4 + 64 * 64 * 16);
        // Longer texts: the bytes of every length up to 64 round-trip.
        for len in 0..=64usize {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(b64u_decode(&b64u(&bytes)), Some(bytes));
        }
    }
}
