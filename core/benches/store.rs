//! The receive path's storage cost: `Runtime::receive` (open, decide, and one transaction with
//! the seen id, the message, the queued receipt and the audit rows) against a bare SQLite insert
//! of one row of the same size with the same pragmas (WAL, synchronous=FULL), in the same run.
//!
//! And an agent's `wait` (timeout 0: classify what is new, hand out what is due) on a profile
//! holding 100 000 incoming messages it already had, with the queue's scan mark (migration 0008)
//! against the same call with the mark reset before each call (a scan of the whole history, what
//! every wait did before the mark), and against a profile with no history.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::str::FromStr;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use switchboard_core::bridge::api::Request;
use switchboard_core::engine::{InitOptions, Runtime};
use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::Profile;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let receiver = support::bob_with_contact_alice(&rt);
    let (bob, dir) = (&receiver.bob, &receiver.dir);
    let envelope = || receiver.envelope_from_alice();

    let bare = rt.block_on(async {
        let opts = SqliteConnectOptions::from_str("sqlite://")
            .unwrap()
            .filename(dir.path().join("bare.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full);
        let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL) STRICT").execute(&pool).await.unwrap();
        pool
    });

    let mut g = c.benchmark_group("store");
    g.bench_function("receive_commit", |b| {
        b.iter_batched(envelope, |env| rt.block_on(bob.receive_letagents(&env)).unwrap(), BatchSize::SmallInput)
    });
    g.bench_function("bare_insert", |b| {
        b.iter_batched(
            envelope,
            |env| rt.block_on(sqlx::query("INSERT INTO t (body) VALUES (?)").bind(env).execute(&bare)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();

    // An agent on bob's profile, and a history of 100 000 incoming messages it already had.
    let wait = || Request::Wait { agent: Some("coder".into()), timeout_secs: 0, paused_seen: None };
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh_profile = Profile { dir: fresh_dir.path().join("carol") };
    let _fresh_lock = fresh_profile.try_lock().unwrap().unwrap();
    let fresh = rt
        .block_on(Runtime::init(
            &fresh_profile,
            InitOptions {
                name: "carol".into(),
                relay: "http://127.0.0.1:9".into(),
                relay_cert_sha256: None,
                keystore: KeystorePreference::File,
            },
        ))
        .unwrap();
    for r in [bob, &fresh] {
        rt.block_on(r.handle(Request::SessionOpen { agent: "coder".into(), harness: None }, false)).unwrap();
        rt.block_on(r.handle(wait(), false)).unwrap();
    }
    rt.block_on(async {
        let pool = &bob.store().pool;
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) \
             INSERT INTO messages (id, direction, protocol, peer, kind, body, ts, state, shown, created_at) \
             SELECT 'h' || i, 'in', 'letagents', 'history', 'send', 'old news', i, 'received', 1, i FROM n",
        )
        .execute(pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO agent_deliveries (agent, message, mode, state, due_at) \
             SELECT 'coder', rowid_, 'digest', 'delivered', 0 FROM messages WHERE peer = 'history'",
        )
        .execute(pool)
        .await
        .unwrap();
    });
    rt.block_on(bob.handle(wait(), false)).unwrap();
    let mut g = c.benchmark_group("agent_wait");
    g.bench_function("history_100k_scan_mark", |b| b.iter(|| rt.block_on(bob.handle(wait(), false)).unwrap()));
    g.bench_function("history_100k_full_scan", |b| {
        b.iter_batched(
            || {
                rt.block_on(sqlx::query("UPDATE agent_floors SET scanned_rowid = 0").execute(&bob.store().pool))
                    .unwrap()
            },
            |_| rt.block_on(bob.handle(wait(), false)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("no_history", |b| b.iter(|| rt.block_on(fresh.handle(wait(), false)).unwrap()));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
