//! Canonical unpadded base64url (§4.2), SHA3-256 and the 32-byte hash type used for event IDs.

use std::fmt;

use sha3::{Digest, Sha3_256};

/// Unpadded base64url (§4.2): [`b64`] encodes; [`b64_decode`] and [`b64_array`] accept only the
/// canonical text of their bytes (padding, other alphabets and non-zero trailing bits are
/// refused), so decoding then re-encoding always reproduces the input. One codec with
/// letagents' (`crate::util`).
pub use crate::util::{b64u as b64, b64u_array as b64_array, b64u_decode as b64_decode};

/// SHA3-256.
pub fn sha3_256(data: &[u8]) -> [u8; 32] {
    Sha3_256::digest(data).into()
}

/// A SHA3-256 digest (or other 32-byte value) written as canonical base64url: event hashes,
/// packet IDs, card hashes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hash32(pub [u8; 32]);

impl Hash32 {
    /// The SHA3-256 of `data`.
    pub fn of(data: &[u8]) -> Self {
        Self(sha3_256(data))
    }

    /// Parses canonical base64url of exactly 32 bytes.
    pub fn parse(text: &str) -> Option<Self> {
        b64_array(text).map(Self)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&b64(&self.0))
    }
}

impl fmt::Debug for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash32({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_must_be_canonical() {
        assert_eq!(b64_decode("_w"), Some(vec![0xff]));
        assert_eq!(b64_decode("_w=="), None);
        assert_eq!(b64_decode("_x"), None);
        assert_eq!(b64_decode("/w"), None);
        assert_eq!(b64_decode(""), Some(vec![]));
        assert_eq!(b64_decode("A"), None);
    }

    #[test]
    fn sha3_256_of_empty_input() {
        assert_eq!(
            crate::util::hex(&sha3_256(b"")),
            "a7ffc6f8bf1ed76651c14756a061d662f580ff4de43b49fa82d80a4b80f8434a"
        );
    }
}
