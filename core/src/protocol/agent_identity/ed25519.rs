//! Deterministic Ed25519 verification (§3.1): canonical `A` and `R`, no small-order points,
//! `S < L`, cofactorless equation. Every conforming verifier then accepts exactly the same
//! signatures, whatever its library's defaults.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

/// Why a signature was refused. Always the signer's (or a forger's) fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The public key `A` is not a canonical point encoding.
    #[error("public key is not a canonical encoding")]
    NonCanonicalKey,
    /// The public key is a point of small order.
    #[error("public key is a small-order point")]
    SmallOrderKey,
    /// `R` is not a canonical point encoding.
    #[error("signature R is not a canonical encoding")]
    NonCanonicalR,
    /// `R` is a point of small order.
    #[error("signature R is a small-order point")]
    SmallOrderR,
    /// `S` is not reduced modulo `L`.
    #[error("signature S is not reduced")]
    NonReducedS,
    /// The key does not decode to a curve point, or the equation does not hold.
    #[error("signature does not verify")]
    Invalid,
}

/// `L`, the order of the prime subgroup, little-endian.
const L: [u8; 32] = [
    0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
];

/// y-coordinates (sign bit cleared) of the small-order points, Appendix B.
const SMALL_ORDER_Y: [[u8; 32]; 5] = [
    // order 1: y = 1
    [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    // order 2: y = p - 1
    [
        0xec, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
    ],
    // order 4: y = 0
    [0; 32],
    // order 8
    [
        0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98, 0xf0, 0xd5, 0xdf,
        0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53, 0xfc, 0x05,
    ],
    // order 8
    [
        0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67, 0x0f, 0x2a, 0x20,
        0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac, 0x03, 0x7a,
    ],
];

fn y_coordinate(encoding: &[u8; 32]) -> [u8; 32] {
    let mut y = *encoding;
    if let Some(top) = y.last_mut() {
        *top &= 0x7f;
    }
    y
}

/// Compares two 32-byte little-endian integers.
fn le_less_than(a: &[u8; 32], b: &[u8; 32]) -> bool {
    for (x, y) in a.iter().rev().zip(b.iter().rev()) {
        if x != y {
            return x < y;
        }
    }
    false
}

/// `p = 2^255 - 19`, little-endian.
const P: [u8; 32] = [
    0xed, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
];

/// Whether a point encoding is canonical: its y-coordinate is below `p`.
pub fn is_canonical_point(encoding: &[u8; 32]) -> bool {
    le_less_than(&y_coordinate(encoding), &P)
}

/// Whether a point encoding denotes a point of small order (Appendix B).
pub fn is_small_order_point(encoding: &[u8; 32]) -> bool {
    SMALL_ORDER_Y.contains(&y_coordinate(encoding))
}

/// Verifies `signature` over `message` under `public_key` with the rules of §3.1.
pub fn verify_strict(public_key: &[u8; 32], message: &[u8], signature: &[u8; 64]) -> Result<(), SignatureError> {
    let (r, s) = signature.split_at(32);
    let r: [u8; 32] = r.try_into().map_err(|_| SignatureError::Invalid)?;
    let s: [u8; 32] = s.try_into().map_err(|_| SignatureError::Invalid)?;
    if !is_canonical_point(public_key) {
        return Err(SignatureError::NonCanonicalKey);
    }
    if is_small_order_point(public_key) {
        return Err(SignatureError::SmallOrderKey);
    }
    if !is_canonical_point(&r) {
        return Err(SignatureError::NonCanonicalR);
    }
    if is_small_order_point(&r) {
        return Err(SignatureError::SmallOrderR);
    }
    if !le_less_than(&s, &L) {
        return Err(SignatureError::NonReducedS);
    }
    let key = VerifyingKey::from_bytes(public_key).map_err(|_| SignatureError::Invalid)?;
    // With the checks above, dalek's `verify_strict` is exactly the cofactorless equation
    // `[S]B = R + [k]A`, comparing the recomputed R's canonical encoding with the given bytes.
    key.verify_strict(message, &Signature::from_bytes(signature)).map_err(|_| SignatureError::Invalid)
}

/// Signs `message` (Ed25519 is deterministic, so vectors reproduce byte for byte).
pub fn sign(key: &SigningKey, message: &[u8]) -> [u8; 64] {
    key.sign(message).to_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_order_and_canonical_checks_follow_appendix_b() {
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(is_small_order_point(&identity));
        // The sign bit does not change the y-coordinate.
        let mut signed = identity;
        signed[31] |= 0x80;
        assert!(is_small_order_point(&signed));
        // p + 1 encodes y = 1 non-canonically.
        let mut p_plus_one = P;
        p_plus_one[0] = 0xee;
        assert!(!is_canonical_point(&p_plus_one));
        assert!(is_canonical_point(&SMALL_ORDER_Y[1]));
    }

    #[test]
    fn honest_signature_verifies_and_s_plus_l_does_not() {
        let key = SigningKey::from_bytes(&[9u8; 32]);
        let public = key.verifying_key().to_bytes();
        let sig = sign(&key, b"hello");
        assert_eq!(verify_strict(&public, b"hello", &sig), Ok(()));
        assert_eq!(verify_strict(&public, b"hellO", &sig), Err(SignatureError::Invalid));
        // Add L to S: same scalar modulo L, so only the reduction rule catches it.
        let mut bumped = sig;
        let mut carry = 0u16;
        for (i, l) in L.iter().enumerate() {
            let sum = u16::from(bumped[32 + i]) + u16::from(*l) + carry;
            bumped[32 + i] = (sum & 0xff) as u8;
            carry = sum >> 8;
        }
        assert_eq!(verify_strict(&public, b"hello", &bumped), Err(SignatureError::NonReducedS));
    }
}
