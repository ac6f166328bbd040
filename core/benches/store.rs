//! The receive path's storage cost: `Runtime::receive` (open, decide, and one transaction with
//! the seen id, the message, the queued receipt and the audit rows) against a bare SQLite insert
//! of one row of the same size with the same pragmas (WAL, synchronous=FULL), in the same run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::str::FromStr;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use switchboard_core::bridge::api::Request;
use switchboard_core::engine::{InitOptions, Runtime};
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::Profile;
use switchboard_core::protocol::letagents::{self as la, Inner, Kind};
use switchboard_core::util::{OsRng, now_ms};

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let profile = Profile { dir: dir.path().join("bob") };
    let _lock = profile.try_lock().unwrap().unwrap();
    let bob = rt
        .block_on(Runtime::init(
            &profile,
            InitOptions {
                name: "bob".into(),
                // Nothing listens there: the receive path never touches the network.
                relay: "http://127.0.0.1:9".into(),
                relay_cert_sha256: None,
                keystore: KeystorePreference::File,
            },
        ))
        .unwrap();
    let alice = DeviceIdentity::generate(&mut OsRng);
    rt.block_on(bob.handle(
        Request::ContactAdd {
            address: alice.address().to_string(),
            name: Some("alice".into()),
            allow: None,
            relay: None,
            no_hello: true,
        },
        false,
    ))
    .unwrap();
    let bob_keys = bob.keys();
    let envelope = || {
        let inner = Inner::new(
            &alice.keys(),
            &bob_keys.mailbox_id(),
            now_ms(),
            uuid::Uuid::new_v4(),
            Kind::Send,
            "x".repeat(200).into(),
        );
        la::seal(&alice.sig, &bob_keys, &serde_json::to_string(&inner).unwrap(), &mut OsRng).unwrap()
    };

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
        b.iter_batched(envelope, |env| rt.block_on(bob.receive(&env)).unwrap(), BatchSize::SmallInput)
    });
    g.bench_function("bare_insert", |b| {
        b.iter_batched(
            envelope,
            |env| rt.block_on(sqlx::query("INSERT INTO t (body) VALUES (?)").bind(env).execute(&bare)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
