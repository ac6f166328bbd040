//! Small shared helpers: base64url/base32 codecs, clocks and the randomness source that sans-io
//! code takes as a parameter.

use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};

/// base64url without padding, the encoding every letagents binary value uses in text.
pub fn b64u(bytes: &[u8]) -> String {
    BASE64URL_NOPAD.encode(bytes)
}

/// Decodes strict base64url without padding (non-canonical trailing bits are refused).
pub fn b64u_decode(text: &str) -> Option<Vec<u8>> {
    BASE64URL_NOPAD.decode(text.as_bytes()).ok()
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
}
