//! Stringcup client sealing and opening against the sum of their primitives in the same run:
//! seal = X25519 key generation + DH + HKDF-SHA256 + AES-256-GCM (+ base64); open = DH + HKDF +
//! AES-256-GCM decrypt.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use criterion::{Criterion, criterion_group, criterion_main};
use hkdf::Hkdf;
use sha2::Sha256;
use switchboard_core::protocol::stringcup::crypto;
use switchboard_core::util::OsRng;
use x25519_dalek::{PublicKey, StaticSecret};

fn primitives_seal(recipient: &PublicKey, plain: &[u8]) -> Vec<u8> {
    let eph = StaticSecret::from([7u8; 32]);
    black_box(PublicKey::from(&eph));
    let shared = eph.diffie_hellman(recipient);
    let mut key = [0u8; 32];
    Hkdf::<Sha256>::new(Some(b"stringcup-v2-msg"), shared.as_bytes()).expand(b"sc-a->sc-b", &mut key).unwrap();
    Aes256Gcm::new((&key).into()).encrypt(&Nonce::from([0u8; 12]), plain).unwrap()
}

fn primitives_open(me: &StaticSecret, eph: &PublicKey, ct: &[u8]) -> Vec<u8> {
    let shared = me.diffie_hellman(eph);
    let mut key = [0u8; 32];
    Hkdf::<Sha256>::new(Some(b"stringcup-v2-msg"), shared.as_bytes()).expand(b"sc-a->sc-b", &mut key).unwrap();
    Aes256Gcm::new((&key).into()).decrypt(&Nonce::from([0u8; 12]), ct).unwrap()
}

fn bench(c: &mut Criterion) {
    let me = StaticSecret::from([3u8; 32]);
    let my_pub = PublicKey::from(&me);
    let text = "x".repeat(1000);
    let (header, ct_b64) = crypto::seal("sc-a", "sc-b", my_pub.as_bytes(), &text, &mut OsRng).unwrap();
    let raw_ct = primitives_seal(&my_pub, text.as_bytes());
    let eph_pub = PublicKey::from(&StaticSecret::from([7u8; 32]));
    let mut g = c.benchmark_group("stringcup_1k");
    g.bench_function("seal", |b| {
        b.iter(|| crypto::seal("sc-a", "sc-b", my_pub.as_bytes(), black_box(&text), &mut OsRng).unwrap())
    });
    g.bench_function("seal_primitives", |b| b.iter(|| primitives_seal(&my_pub, black_box(text.as_bytes()))));
    g.bench_function("open", |b| b.iter(|| crypto::open("sc-a", "sc-b", &me, &header, black_box(&ct_b64)).unwrap()));
    g.bench_function("open_primitives", |b| b.iter(|| primitives_open(&me, &eph_pub, black_box(&raw_ct))));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
