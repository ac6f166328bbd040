//! The HPKE construction against RFC 9180 Appendix A.2.1 (DHKEM(X25519, HKDF-SHA256),
//! HKDF-SHA256, ChaCha20Poly1305, Base mode, sequence number 0), and against the `hpke` crate in
//! both directions, since Mail's own implementation exists only to take a fixed ephemeral key.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod agent_common;

use agent_common::*;
use hpke::aead::ChaCha20Poly1305;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem as _, OpModeR, OpModeS, Serializable};
use switchboard_core::protocol::agent_mail::hpke::{
    HpkeError, INFO as MAIL_INFO, is_usable_public_key, open_base, seal_base,
};
use switchboard_core::util::hex_decode;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

/// RFC 9180, A.2.1 (published values).
mod rfc9180_a21 {
    pub const INFO: &str = "4f6465206f6e2061204772656369616e2055726e";
    pub const IKM_E: &str = "909a9b35d3dc4713a5e72a4da274b55d3d3821a37e5d099e74a647db583a904b";
    pub const PK_EM: &str = "1afa08d3dec047a643885163f1180476fa7ddb54c6a8029ea33f95796bf2ac4a";
    pub const SK_EM: &str = "f4ec9b33b792c372c1d2c2063507b684ef925b8c75a42dbcbf57d63ccd381600";
    pub const IKM_R: &str = "1ac01f181fdf9f352797655161c58b75c656a6cc2716dcb66372da835542e1df";
    pub const PK_RM: &str = "4310ee97d88cc1f088a5576c77ab0cf5c3ac797f3d95139c6c84b5429c59662a";
    pub const SK_RM: &str = "8057991eef8f1f1af18f4a9491d16a1ce333f695d4db8e38da75975c4478e0fb";
    /// Sequence number 0.
    pub const PT: &str = "4265617574792069732074727574682c20747275746820626561757479";
    pub const AAD0: &str = "436f756e742d30";
    pub const CT0: &str = "1c5250d8034ec2b784ba2cfd69dbdb8af406cfe3ff938e131f0def8c8b60b4db21993c62ce81883d2dd1b51a28";
}

fn h(text: &str) -> Vec<u8> {
    hex_decode(text).unwrap()
}

#[test]
fn rfc9180_a21_key_pairs_are_consistent() {
    use rfc9180_a21::*;
    assert_eq!(PublicKey::from(&x25519_secret(SK_EM)).to_bytes(), hex32(PK_EM));
    assert_eq!(PublicKey::from(&x25519_secret(SK_RM)).to_bytes(), hex32(PK_RM));
    // DeriveKeyPair(ikm) gives the published public keys.
    let (_, pk_e) = X25519HkdfSha256::derive_keypair(&h(IKM_E));
    let (_, pk_r) = X25519HkdfSha256::derive_keypair(&h(IKM_R));
    assert_eq!(pk_e.to_bytes().as_slice(), h(PK_EM).as_slice());
    assert_eq!(pk_r.to_bytes().as_slice(), h(PK_RM).as_slice());
}

#[test]
fn rfc9180_a21_seal_reproduces_the_published_ciphertext() {
    use rfc9180_a21::*;
    let (enc, ct) = seal_base(&hex32(PK_RM), &h(INFO), &h(AAD0), &h(PT), Zeroizing::new(hex32(SK_EM))).unwrap();
    assert_eq!(enc, hex32(PK_EM));
    assert_eq!(ct, h(CT0));
}

#[test]
fn rfc9180_a21_open_recovers_the_published_plaintext() {
    use rfc9180_a21::*;
    let pt = open_base(&x25519_secret(SK_RM), &hex32(PK_EM), &h(INFO), &h(AAD0), &h(CT0)).unwrap();
    assert_eq!(*pt, h(PT));
    assert_eq!(*pt, b"Beauty is truth, truth beauty");
    // Any other AAD, info or key fails.
    assert_eq!(open_base(&x25519_secret(SK_RM), &hex32(PK_EM), &h(INFO), b"Count-1", &h(CT0)), Err(HpkeError::Open));
    assert_eq!(open_base(&x25519_secret(SK_RM), &hex32(PK_EM), MAIL_INFO, &h(AAD0), &h(CT0)), Err(HpkeError::Open));
    assert_eq!(open_base(&x25519_secret(SK_EM), &hex32(PK_EM), &h(INFO), &h(AAD0), &h(CT0)), Err(HpkeError::Open));
}

#[test]
fn hpke_crate_sealed_messages_open_here() {
    let (sk, pk) = X25519HkdfSha256::derive_keypair(&[3u8; 32]);
    let ours = StaticSecret::from(<[u8; 32]>::try_from(sk.to_bytes().as_slice()).unwrap());
    for len in [0usize, 1, 1023, 1024, 4096] {
        let pt = vec![0x5a; len];
        let (enc, ct) = hpke::single_shot_seal::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256>(
            &OpModeS::Base,
            &pk,
            MAIL_INFO,
            &pt,
            b"aad",
        )
        .unwrap();
        let enc: [u8; 32] = enc.to_bytes().as_slice().try_into().unwrap();
        assert_eq!(*open_base(&ours, &enc, MAIL_INFO, b"aad", &ct).unwrap(), pt, "{len}");
    }
}

#[test]
fn messages_sealed_here_open_in_the_hpke_crate() {
    let (sk, pk) = X25519HkdfSha256::derive_keypair(&[4u8; 32]);
    let pk_bytes: [u8; 32] = pk.to_bytes().as_slice().try_into().unwrap();
    for (i, len) in [0usize, 1, 1020, 1024, 5000].into_iter().enumerate() {
        let pt = vec![0xa5; len];
        let (enc, ct) = seal_base(&pk_bytes, MAIL_INFO, b"meta", &pt, Zeroizing::new([i as u8 + 1; 32])).unwrap();
        let enc = <X25519HkdfSha256 as hpke::Kem>::EncappedKey::from_bytes(&enc).unwrap();
        let opened = hpke::single_shot_open::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256>(
            &OpModeR::Base,
            &sk,
            &enc,
            MAIL_INFO,
            &ct,
            b"meta",
        )
        .unwrap();
        assert_eq!(opened, pt, "{len}");
    }
}

#[test]
fn low_order_keys_are_refused_both_ways() {
    let zero = [0u8; 32];
    let mut one = [0u8; 32];
    one[0] = 1;
    assert!(!is_usable_public_key(&zero));
    assert!(!is_usable_public_key(&one));
    assert!(is_usable_public_key(&hex32(rfc9180_a21::PK_RM)));
    assert_eq!(seal_base(&zero, MAIL_INFO, b"", b"x", Zeroizing::new([9; 32])), Err(HpkeError::LowOrderKey));
    assert_eq!(
        open_base(&x25519_secret(rfc9180_a21::SK_RM), &one, MAIL_INFO, b"", &[0u8; 32]),
        Err(HpkeError::LowOrderKey)
    );
}
