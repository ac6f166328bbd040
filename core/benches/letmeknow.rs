//! letmeknow's MLS operations through Switchboard's adapter (`switchboard_core::mls::Member`,
//! including collecting the changed state rows the engine writes after every operation) against
//! bare OpenMLS doing the same operation in the same run, for groups of 2, 5, 10, 50 and 100:
//! - add + Welcome + join: the inviter commits an Add and merges it, the joiner joins;
//! - commit + process: the inviter's Add commit processed by an existing member;
//! - an application message encrypted by one member and decrypted by another.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use openmls::prelude::tls_codec::Deserialize as _;
use openmls::prelude::*;
use openmls_basic_credential::SignatureKeyPair;
use openmls_rust_crypto::OpenMlsRustCrypto;
use switchboard_core::mls::{CIPHERSUITE, Member, PAST_EPOCHS};

const G: &str = "0123456789abcdef0123456789abcdef";

// ---- bare OpenMLS ---------------------------------------------------------------------------

struct Bare {
    provider: OpenMlsRustCrypto,
    signer: SignatureKeyPair,
    cred: CredentialWithKey,
}

impl Bare {
    fn new(name: &str) -> Self {
        let provider = OpenMlsRustCrypto::default();
        let signer = SignatureKeyPair::new(CIPHERSUITE.signature_algorithm()).unwrap();
        signer.store(provider.storage()).unwrap();
        let cred = CredentialWithKey {
            credential: BasicCredential::new(name.as_bytes().to_vec()).into(),
            signature_key: signer.public().into(),
        };
        Self { provider, signer, cred }
    }

    fn key_package(&self) -> KeyPackage {
        KeyPackage::builder()
            .build(CIPHERSUITE, &self.provider, &self.signer, self.cred.clone())
            .unwrap()
            .key_package()
            .clone()
    }

    fn create(&self) -> MlsGroup {
        let config = MlsGroupCreateConfig::builder()
            .ciphersuite(CIPHERSUITE)
            .use_ratchet_tree_extension(true)
            .wire_format_policy(PURE_CIPHERTEXT_WIRE_FORMAT_POLICY)
            .max_past_epochs(PAST_EPOCHS)
            .build();
        MlsGroup::new_with_group_id(
            &self.provider,
            &self.signer,
            &config,
            GroupId::from_slice(G.as_bytes()),
            self.cred.clone(),
        )
        .unwrap()
    }

    fn join(&self, welcome: &[u8]) -> MlsGroup {
        let MlsMessageBodyIn::Welcome(w) = MlsMessageIn::tls_deserialize_exact(welcome).unwrap().extract() else {
            panic!("not a welcome")
        };
        let config = MlsGroupJoinConfig::builder()
            .use_ratchet_tree_extension(true)
            .wire_format_policy(PURE_CIPHERTEXT_WIRE_FORMAT_POLICY)
            .max_past_epochs(PAST_EPOCHS)
            .build();
        StagedWelcome::new_from_welcome(&self.provider, &config, w, None).unwrap().into_group(&self.provider).unwrap()
    }

    fn process(&self, group: &mut MlsGroup, bytes: &[u8]) -> Option<Vec<u8>> {
        let msg = MlsMessageIn::tls_deserialize_exact(bytes).unwrap().try_into_protocol_message().unwrap();
        match group.process_message(&self.provider, msg).unwrap().into_content() {
            ProcessedMessageContent::ApplicationMessage(a) => Some(a.into_bytes()),
            ProcessedMessageContent::StagedCommitMessage(c) => {
                group.merge_staged_commit(&self.provider, *c).unwrap();
                None
            }
            _ => None,
        }
    }
}

/// A bare creator whose group has `n - 1` members, and the second member's state (the same
/// configuration as the adapter's: ratchet tree in the Welcome, pure ciphertext, past epochs kept).
fn bare_group(n: usize) -> (Bare, Bare) {
    let creator = Bare::new("creator");
    let second = Bare::new("second");
    let mut g = creator.create();
    let (_, welcome, _) = g.add_members(&creator.provider, &creator.signer, &[second.key_package()]).unwrap();
    g.merge_pending_commit(&creator.provider).unwrap();
    second.join(&welcome.to_bytes().unwrap());
    // One commit per member, as the adapter's group is built: both states then hold the same
    // epochs (and past epochs' secrets).
    for i in 2..n.saturating_sub(1) {
        let kp = Bare::new(&format!("m{i}")).key_package();
        let (commit, _, _) = g.add_members(&creator.provider, &creator.signer, &[kp]).unwrap();
        g.merge_pending_commit(&creator.provider).unwrap();
        let mut g2 = MlsGroup::load(second.provider.storage(), g.group_id()).unwrap().unwrap();
        second.process(&mut g2, &commit.to_bytes().unwrap());
    }
    (creator, second)
}

fn copy_bare(b: &Bare) -> Bare {
    let provider = OpenMlsRustCrypto::default();
    *provider.storage().values.write().unwrap() = b.provider.storage().values.read().unwrap().clone();
    let signer =
        SignatureKeyPair::read(provider.storage(), b.signer.public(), CIPHERSUITE.signature_algorithm()).unwrap();
    Bare { provider, signer, cred: b.cred.clone() }
}

// ---- Switchboard's adapter ------------------------------------------------------------------

fn adapter_group(n: usize) -> (Member, Member) {
    let creator = Member::generate("creator").unwrap();
    let second = Member::generate("second").unwrap();
    let mut g = creator.create_group(G).unwrap();
    let (kp, _) = creator.inspect_key_package(&second.key_package().unwrap()).unwrap();
    let (_, welcome) = creator.add(&mut g, kp).unwrap();
    creator.merge_pending(&mut g).unwrap();
    second.join(&welcome).unwrap();
    for i in 2..n.saturating_sub(1) {
        let m = Member::generate(&format!("m{i}")).unwrap();
        let (kp, _) = creator.inspect_key_package(&m.key_package().unwrap()).unwrap();
        let (commit, _) = creator.add(&mut g, kp).unwrap();
        creator.merge_pending(&mut g).unwrap();
        let mut g2 = second.load_group(G).unwrap().unwrap();
        second.process(&mut g2, &commit).unwrap();
    }
    (creator, second)
}

fn copy_member(m: &Member) -> Member {
    Member::from_rows(m.rows(), m.signature_key(), m.name()).unwrap()
}

/// What the engine does after an operation, short of SQLite: take the changed rows (to write in
/// the operation's transaction) and mark them saved.
fn persist(m: &Member) {
    let changes = m.changes();
    black_box(&changes);
    m.saved(&changes);
}

fn bytes(rows: &[(Vec<u8>, Vec<u8>)]) -> usize {
    rows.iter().map(|(k, v)| k.len() + v.len()).sum()
}

fn changed_bytes(m: &Member) -> (usize, usize) {
    let changes = m.changes();
    let n = changes.iter().map(|c| c.key.len() + c.value.as_ref().map_or(0, Vec::len)).sum();
    m.saved(&changes);
    (changes.len(), n)
}

/// What one operation writes, for BENCHMARKS.md: the changed rows against the whole state
/// (what the snapshot wrote).
fn report_sizes(n: usize, creator: &Member, second: &Member) {
    let (creator, second) = (copy_member(creator), copy_member(second));
    let mut g = creator.load_group(G).unwrap().unwrap();
    let j = Member::generate("joiner").unwrap();
    let (kp, _) = creator.inspect_key_package(&j.key_package().unwrap()).unwrap();
    let (commit, _) = creator.add(&mut g, kp).unwrap();
    creator.merge_pending(&mut g).unwrap();
    let (rows, written) = changed_bytes(&creator);
    let mut g2 = second.load_group(G).unwrap().unwrap();
    second.process(&mut g2, &commit).unwrap();
    let (rows2, written2) = changed_bytes(&second);
    let m = creator.encrypt(&mut g, &[b'x'; 1000]).unwrap();
    let (rows3, written3) = changed_bytes(&creator);
    second.process(&mut g2, &m).unwrap();
    let (rows4, written4) = changed_bytes(&second);
    eprintln!(
        "group of {n}: whole state {} rows / {} B (creator), {} rows / {} B (member); written: add commit {rows} rows / \
         {written} B, its processing {rows2} / {written2} B, a 1 KB message sent {rows3} / {written3} B, received \
         {rows4} / {written4} B",
        creator.rows().len(),
        bytes(&creator.rows()),
        second.rows().len(),
        bytes(&second.rows()),
    );
}

fn bench_groups(c: &mut Criterion) {
    let mut add = c.benchmark_group("letmeknow_add_welcome_join");
    add.sample_size(10);
    let mut commit = Vec::new();
    for n in [2usize, 5, 10, 50, 100] {
        let (ac, asec) = adapter_group(n);
        let (bc, bsec) = bare_group(n);
        report_sizes(n, &ac, &asec);
        add.bench_with_input(BenchmarkId::new("switchboard", n), &n, |b, _| {
            b.iter_batched(
                || {
                    let j = Member::generate("joiner").unwrap();
                    let kp = j.key_package().unwrap();
                    (copy_member(&ac), j, kp)
                },
                |(creator, joiner, kp)| {
                    let mut g = creator.load_group(G).unwrap().unwrap();
                    let (kp, _) = creator.inspect_key_package(&kp).unwrap();
                    let (_, welcome) = creator.add(&mut g, kp).unwrap();
                    creator.merge_pending(&mut g).unwrap();
                    persist(&creator);
                    black_box(joiner.join(&welcome).unwrap());
                    persist(&joiner);
                },
                BatchSize::PerIteration,
            )
        });
        add.bench_with_input(BenchmarkId::new("openmls", n), &n, |b, _| {
            b.iter_batched(
                || {
                    let j = Bare::new("joiner");
                    let kp = MlsMessageOut::from(j.key_package()).to_bytes().unwrap();
                    (copy_bare(&bc), j, kp)
                },
                |(creator, joiner, kp)| {
                    let mut g = MlsGroup::load(creator.provider.storage(), &GroupId::from_slice(G.as_bytes()))
                        .unwrap()
                        .unwrap();
                    let MlsMessageBodyIn::KeyPackage(kp) = MlsMessageIn::tls_deserialize_exact(&kp).unwrap().extract()
                    else {
                        panic!()
                    };
                    let kp = kp.validate(creator.provider.crypto(), ProtocolVersion::Mls10).unwrap();
                    let (_, welcome, _) = g.add_members(&creator.provider, &creator.signer, &[kp]).unwrap();
                    g.merge_pending_commit(&creator.provider).unwrap();
                    black_box(joiner.join(&welcome.to_bytes().unwrap()));
                },
                BatchSize::PerIteration,
            )
        });
        commit.push((n, ac, asec, bc, bsec));
    }
    add.finish();

    let mut cp = c.benchmark_group("letmeknow_commit_process");
    cp.sample_size(10);
    for (n, ac, asec, bc, bsec) in &commit {
        cp.bench_with_input(BenchmarkId::new("switchboard", n), n, |b, _| {
            b.iter_batched(
                || {
                    let j = Member::generate("joiner").unwrap();
                    (copy_member(ac), copy_member(asec), j.key_package().unwrap())
                },
                |(creator, second, kp)| {
                    let mut g = creator.load_group(G).unwrap().unwrap();
                    let (kp, _) = creator.inspect_key_package(&kp).unwrap();
                    let (commit, _) = creator.add(&mut g, kp).unwrap();
                    creator.merge_pending(&mut g).unwrap();
                    persist(&creator);
                    let mut g2 = second.load_group(G).unwrap().unwrap();
                    black_box(second.process(&mut g2, &commit).unwrap());
                    persist(&second);
                },
                BatchSize::PerIteration,
            )
        });
        cp.bench_with_input(BenchmarkId::new("openmls", n), n, |b, _| {
            b.iter_batched(
                || (copy_bare(bc), copy_bare(bsec), Bare::new("joiner").key_package()),
                |(creator, second, kp)| {
                    let gid = GroupId::from_slice(G.as_bytes());
                    let mut g = MlsGroup::load(creator.provider.storage(), &gid).unwrap().unwrap();
                    let (commit, _, _) = g.add_members(&creator.provider, &creator.signer, &[kp]).unwrap();
                    g.merge_pending_commit(&creator.provider).unwrap();
                    let mut g2 = MlsGroup::load(second.provider.storage(), &gid).unwrap().unwrap();
                    black_box(second.process(&mut g2, &commit.to_bytes().unwrap()));
                },
                BatchSize::PerIteration,
            )
        });
    }
    cp.finish();

    // What the code before migration 0018 added to every operation instead: the whole state's
    // snapshot (same encoder), of the creator after the Add and of the member who processed it.
    let mut snap = c.benchmark_group("letmeknow_state_snapshot_before_0018");
    snap.sample_size(10);
    for (n, ac, asec, _, _) in &commit {
        let rows = ac.rows();
        let rows2 = asec.rows();
        snap.bench_with_input(BenchmarkId::new("both_snapshots", n), n, |b, _| {
            b.iter(|| {
                black_box(switchboard_core::mls::storage::snapshot(&rows));
                black_box(switchboard_core::mls::storage::snapshot(&rows2));
            })
        });
    }
    snap.finish();

    // Application messages in a group of 2 (encrypt by one member, decrypt by the other).
    let (_, ac, asec, bc, bsec) = commit.swap_remove(0);
    let mut app = c.benchmark_group("letmeknow_application_message");
    let text = vec![b'x'; 1000];
    let mut ga = ac.load_group(G).unwrap().unwrap();
    let mut gb = asec.load_group(G).unwrap().unwrap();
    app.bench_function("switchboard_encrypt_decrypt_1k", |b| {
        b.iter(|| {
            let m = ac.encrypt(&mut ga, &text).unwrap();
            persist(&ac);
            black_box(asec.process(&mut gb, &m).unwrap());
            persist(&asec);
        })
    });
    let gid = GroupId::from_slice(G.as_bytes());
    let mut ba = MlsGroup::load(bc.provider.storage(), &gid).unwrap().unwrap();
    let mut bb = MlsGroup::load(bsec.provider.storage(), &gid).unwrap().unwrap();
    app.bench_function("openmls_encrypt_decrypt_1k", |b| {
        b.iter(|| {
            let m = ba.create_message(&bc.provider, &bc.signer, &text).unwrap().to_bytes().unwrap();
            black_box(bsec.process(&mut bb, &m));
        })
    });
    app.finish();
}

criterion_group!(benches, bench_groups);
criterion_main!(benches);
