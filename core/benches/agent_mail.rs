//! Agent Mail packet sealing and opening, each against the sum of its primitives measured in the
//! same run: JCS of the message and event, SHA3-256 of the event, Ed25519 sign / strict verify,
//! HPKE Base seal / open over the padded plaintext (and, on open, strict parsing of the packet and
//! the plaintext). Also this crate's HPKE against the `hpke` crate's, for the same work.
//! `scripts/bench.sh` style: compare medians as ratios, not absolute times.
//! After criterion's figures each pair is timed again in alternation (`paired`), which is what
//! BENCHMARKS.md quotes: `cargo bench … --bench agent_mail -- paired` runs only that.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod paired;

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ed25519_dalek::SigningKey;
use switchboard_core::protocol::agent_identity::AgentId;
use switchboard_core::protocol::agent_identity::ed25519::{sign, verify_strict};
use switchboard_core::protocol::agent_identity::encoding::sha3_256;
use switchboard_core::protocol::agent_identity::json;
use switchboard_core::protocol::agent_identity::origin::Origin;
use switchboard_core::protocol::agent_mail::card::CardPayload;
use switchboard_core::protocol::agent_mail::hpke::{self as mail_hpke, INFO};
use switchboard_core::protocol::agent_mail::packet::{SealRequest, frame, seal};
use switchboard_core::protocol::agent_mail::recipient::{self, RetainedKey, SenderPolicy};
use switchboard_core::protocol::agent_mail::{DAY_MS, Id16, MailboxCard, Message, Part};
use switchboard_core::util::{OsRng, Rng, SeededRng};
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

const NOW: i64 = 1_790_726_400_000;

fn bench(c: &mut Criterion) {
    let alice = SigningKey::from_bytes(&[0xa1; 32]);
    let bob = SigningKey::from_bytes(&[0xb0; 32]);
    let bob_box = StaticSecret::from([0xb1; 32]);
    let bob_pub = PublicKey::from(&bob_box).to_bytes();
    let card = MailboxCard::sign(
        &bob,
        NOW,
        100,
        CardPayload {
            mailbox_id: Id16([7; 16]),
            expires_at: NOW + DAY_MS,
            receive_until: NOW + 2 * DAY_MS,
            public_key: bob_pub,
            routes: vec![Origin::parse("https://relay.example").unwrap()],
            max_packet_bytes: 65536,
        },
    )
    .unwrap();
    let keys = vec![RetainedKey { card: card.clone(), secret: bob_box.clone() }];
    let me = AgentId::of(&bob);
    let mut rng = SeededRng::new([1; 32]);

    for (label, body) in [("1k", 200usize), ("16k", 15_000)] {
        let mut message =
            Message::new(&mut rng, AgentId::of(&alice), me, NOW, NOW + DAY_MS, vec![Part::text("Hello, Bob.")]);
        message.parts.push(Part::bytes("application/octet-stream", vec![0x5a; body], Some("data.bin")));
        let req = SealRequest { sender: &alice, card: &card, message: &message, created_at: NOW, nonce: 7 };
        let packet = seal(&req, NOW, &mut OsRng).unwrap();
        let packet_bytes = packet.to_jcs();

        // Inputs for the primitives, computed once.
        let message_value = message.to_value();
        let event_value = packet.envelope().event().to_value();
        let aad = packet.aad();
        let plaintext = frame(&message.to_jcs()).unwrap();
        let hash = packet.id();
        let signature = *packet.envelope().signature();
        let plain_json = message.to_jcs();

        let primitives_seal = || {
            let json = json::to_jcs(black_box(&message_value));
            let mut eph = Zeroizing::new([0u8; 32]);
            OsRng.fill(eph.as_mut());
            let (enc, ct) = mail_hpke::seal_base(&bob_pub, INFO, &aad, &plaintext, eph).unwrap();
            let event_jcs = json::to_jcs(black_box(&event_value));
            let digest = sha3_256(&event_jcs);
            let sig = sign(&alice, &digest);
            black_box((json, enc, ct, sig))
        };
        let primitives_open = || {
            let event_jcs = json::to_jcs(black_box(&event_value));
            let digest = sha3_256(&event_jcs);
            verify_strict(AgentId::of(&alice).public_key(), hash.as_bytes(), &signature).unwrap();
            let pt = mail_hpke::open_base(&bob_box, packet.enc(), INFO, &aad, packet.ciphertext()).unwrap();
            let parsed = json::parse(black_box(&plain_json)).unwrap();
            black_box((digest, pt, json::to_jcs(&parsed)))
        };

        // Ours: the whole receive path (strict parse, checks, open, content hash).
        let open = || {
            recipient::receive(black_box(&packet_bytes), None, &me, &keys, NOW, |_| SenderPolicy::Allow, |_| None)
                .unwrap()
        };

        let mut g = c.benchmark_group(format!("agent_mail_{label}"));
        g.throughput(Throughput::Elements(1));
        g.bench_function("seal", |b| b.iter(|| seal(black_box(&req), NOW, &mut OsRng).unwrap()));
        g.bench_function("seal_primitives", |b| b.iter(primitives_seal));
        g.bench_function("open", |b| b.iter(open));
        g.bench_function("open_primitives", |b| b.iter(primitives_open));
        g.finish();

        paired::paired(
            &format!("agent_mail_{label}/seal"),
            || {
                black_box(seal(black_box(&req), NOW, &mut OsRng).unwrap());
            },
            || {
                black_box(primitives_seal());
            },
        );
        paired::paired(
            &format!("agent_mail_{label}/open"),
            || {
                black_box(open());
            },
            || {
                black_box(primitives_open());
            },
        );
        // The same open against the primitives plus the content hash §4 step 4 needs: a
        // receiver must tell a retransmission from a reused message id with different bytes, so
        // it keeps the message's canonical bytes or, as Switchboard does, their SHA3-256.
        paired::paired(
            &format!("agent_mail_{label}/open (baseline + content hash)"),
            || {
                black_box(open());
            },
            || {
                black_box((primitives_open(), sha3_256(black_box(&plain_json))));
            },
        );
    }

    // This crate's HPKE (needed for fixed-ephemeral vectors) against the `hpke` crate, same work.
    use hpke::{Kem as _, Serializable};
    let (_, crate_pk) = hpke::kem::X25519HkdfSha256::derive_keypair(&[5; 32]);
    let crate_pk_bytes: [u8; 32] = crate_pk.to_bytes().as_slice().try_into().unwrap();
    let pt = vec![0u8; 2048];
    let mut g = c.benchmark_group("hpke_2k");
    g.bench_function("seal_this_crate", |b| {
        b.iter(|| {
            let mut eph = Zeroizing::new([0u8; 32]);
            OsRng.fill(eph.as_mut());
            mail_hpke::seal_base(&crate_pk_bytes, INFO, b"aad", black_box(&pt), eph).unwrap()
        })
    });
    g.bench_function("seal_hpke_crate", |b| {
        b.iter(|| {
            hpke::single_shot_seal::<hpke::aead::ChaCha20Poly1305, hpke::kdf::HkdfSha256, hpke::kem::X25519HkdfSha256>(
                &hpke::OpModeS::Base,
                &crate_pk,
                INFO,
                black_box(&pt),
                b"aad",
            )
            .unwrap()
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
