//! Upgrades of an existing database (SQLite; PostgreSQL where `pg_common` can run a cluster): a
//! migration that adds counters starts them from what the database already holds, so limits read
//! from the counters hold across the upgrade; one that reshapes a table or a statistic keeps what
//! it held.

// Tests: a failed setup should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod pg_common;

use std::sync::Arc;

use axum::body::Bytes;
use relay_lite::hub::Hub;
use relay_lite::store::stringcup::{NewMessage, PendingCaps, PendingLimit, SendOutcome, SendRequest, Sweep};
use relay_lite::store::{DB_FILE, DepositOutcome, Store};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{ConnectOptions as _, Connection as _};

/// A database in `dir` migrated up to (not including) migration `version`.
async fn migrated_before(dir: &std::path::Path, version: i64) -> sqlx::SqliteConnection {
    let options = SqliteConnectOptions::new()
        .filename(dir.join(DB_FILE))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let mut conn = options.connect().await.unwrap();
    let mut before = sqlx::migrate!("./migrations");
    let upto: Vec<_> = before.migrations.iter().filter(|m| m.version < version).cloned().collect();
    assert_eq!(upto.len(), usize::try_from(version - 1).unwrap(), "the migrations before {version}");
    before.migrations = upto.into();
    before.run(&mut conn).await.unwrap();
    conn
}

/// A Stringcup identity row written straight into the old schema: token last used at
/// `token_last_used_ms`, its next sent number `next_sent_seq` (1 for one that never sent).
async fn insert_identity(conn: &mut sqlx::SqliteConnection, id: &str, token_last_used_ms: i64, next_sent_seq: i64) {
    sqlx::query(
        "INSERT INTO sc_identity (id, public_key, token_hash, token_created_ms, token_last_used_ms, \
         key_updated_ms, updated_ms, created_ms, next_sent_seq) VALUES (?1, x'01', CAST(?1 AS BLOB), 1, ?2, 1, 1, 1, ?3)",
    )
    .bind(id)
    .bind(token_last_used_ms)
    .bind(next_sent_seq)
    .execute(conn)
    .await
    .unwrap();
}

fn send(sender: &str, caps: PendingCaps) -> SendRequest {
    SendRequest {
        sender: sender.into(),
        idempotency_key: None,
        idempotency_expired_before: 0,
        messages: vec![NewMessage {
            recipient: "b".into(),
            ephemeral_pub: vec![2; 32],
            iv: vec![3; 12],
            header_extra: String::new(),
            ciphertext: vec![4; 16],
        }],
        caps,
        now: 2,
    }
}

/// Migration 0008 counts what already waits: an inbox filled before the upgrade is as full after
/// it, per sender and in all, and the next message takes the next number.
#[tokio::test]
async fn the_stringcup_pending_counters_start_from_what_waited_before_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = migrated_before(dir.path(), 8).await;
    for id in ["a", "b", "c"] {
        insert_identity(&mut conn, id, 1, 1).await;
    }
    for (id, sender, size) in [(1, "a", 10), (2, "a", 20), (3, "c", 5)] {
        sqlx::query(
            "INSERT INTO sc_message (recipient, id, sender, sent_seq, ephemeral_pub, iv, ciphertext, size, \
             created_ms) VALUES ('b', ?, ?, 1, x'02', x'03', x'04', ?, 1)",
        )
        .bind(id)
        .bind(sender)
        .bind(size)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    sqlx::query("UPDATE sc_identity SET next_inbox_id = 4 WHERE id = 'b'").execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();

    let store = Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap();
    let roomy = PendingCaps { inbox_messages: 100, inbox_bytes: 1 << 20, sender_messages: 100, sender_bytes: 1 << 20 };
    // sc "a" already has two waiting.
    let out = store.stringcup().send(send("a", PendingCaps { sender_messages: 2, ..roomy })).await.unwrap();
    assert_eq!(out, vec![SendOutcome::Full(PendingLimit::SenderMessages(2))]);
    // 35 bytes wait in all: 16 more is over 50.
    let out = store.stringcup().send(send("c", PendingCaps { inbox_bytes: 50, ..roomy })).await.unwrap();
    assert_eq!(out, vec![SendOutcome::Full(PendingLimit::InboxBytes(50))]);
    let out = store.stringcup().send(send("c", roomy)).await.unwrap();
    assert_eq!(out, vec![SendOutcome::Stored { sent_seq: 1, inbox_id: 4 }]);
    assert_eq!(store.stringcup().counts().await.unwrap().messages_pending, 4);
    store.close().await;
}

/// Migration 0011 derives the lifetime count of stored messages from the senders' numbering and
/// moves idempotency keys to a table keyed by (sender, key): the statistic reads the same after
/// the upgrade and keeps counting (also through a reclaim), and a key reserved before it still
/// answers its retry with the number it was given.
#[tokio::test]
async fn the_stringcup_lifetime_count_and_idempotency_keys_survive_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = migrated_before(dir.path(), 11).await;
    for (id, next_sent_seq) in [("a", 4), ("b", 1), ("c", 3)] {
        insert_identity(&mut conn, id, 1000, next_sent_seq).await;
    }
    // 9 stored in the relay's life, 5 of them by identities still registered (3 by a, 2 by c).
    sqlx::query("UPDATE sc_counter SET value = 9 WHERE name = 'messages_stored'").execute(&mut conn).await.unwrap();
    sqlx::query(
        "INSERT INTO sc_idempotency (sender, key, recipient, sent_seq, created_ms) VALUES ('a', 'k1', 'b', 3, 500)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();

    let store = Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap();
    let sc = store.stringcup();
    assert_eq!(sc.counts().await.unwrap().messages_stored, 9);
    let roomy = PendingCaps { inbox_messages: 100, inbox_bytes: 1 << 20, sender_messages: 100, sender_bytes: 1 << 20 };
    let keyed = |key: &str| SendRequest {
        idempotency_key: Some(key.into()),
        idempotency_expired_before: 0,
        ..send("a", roomy)
    };
    // The retry of the send reserved before the upgrade is answered with its number.
    assert_eq!(sc.send(keyed("k1")).await.unwrap(), vec![SendOutcome::Replay { sent_seq: 3 }]);
    // A new keyed send takes a's next number, and its retry gets the same one.
    assert_eq!(sc.send(keyed("k2")).await.unwrap(), vec![SendOutcome::Stored { sent_seq: 4, inbox_id: 1 }]);
    assert_eq!(sc.send(keyed("k2")).await.unwrap(), vec![SendOutcome::Replay { sent_seq: 4 }]);
    assert_eq!(sc.send(send("c", roomy)).await.unwrap(), vec![SendOutcome::Stored { sent_seq: 3, inbox_id: 2 }]);
    assert_eq!(sc.counts().await.unwrap().messages_stored, 11);
    // Reclaiming a sender (its token unused) keeps what it stored in the total.
    let report = sc.sweep(Sweep { now: 5000, tokens_unused_since: 1001, idempotency_before: 0 }).await.unwrap();
    assert_eq!(report.identities, 3);
    assert_eq!(sc.counts().await.unwrap().messages_stored, 11);
    store.close().await;
}

/// PostgreSQL migration 0006 counts what already waits: a mailbox filled before the upgrade is as
/// full after it (the capacity check refuses exactly at capacity), and the counter follows
/// deposits, acks and the retention sweep from there.
#[tokio::test]
async fn the_letagents_waiting_counter_starts_from_what_waited_before_the_upgrade_on_postgres() {
    let Some(cluster) = pg_common::cluster() else { return };
    let url = cluster.fresh_database().await;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut before = sqlx::migrate!("./migrations-pg");
    let upto: Vec<_> = before.migrations.iter().filter(|m| m.version < 6).cloned().collect();
    assert_eq!(upto.len(), 5, "the migrations before 6");
    before.migrations = upto.into();
    before.run(&mut conn).await.unwrap();
    sqlx::query("INSERT INTO la_mailbox (id, drop_hash, next_seq) VALUES ('alice', 'drop', 4), ('bob', 'drop', 1)")
        .execute(&mut conn)
        .await
        .unwrap();
    for (seq, received_ms) in [(1, 100), (2, 100), (3, 5000)] {
        sqlx::query("INSERT INTO la_envelope (mailbox, seq, received_ms, body) VALUES ('alice', $1, $2, '\\x00')")
            .bind(seq)
            .bind(received_ms)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    conn.close().await.unwrap();

    let store = Store::open_postgres(&url, Arc::new(Hub::default())).await.unwrap();
    assert_eq!(store.waiting_count("alice").await.unwrap(), 3);
    assert_eq!(store.waiting_count("bob").await.unwrap(), 0);
    let body = || Bytes::from_static(b"LA1 after the upgrade");
    assert_eq!(store.deposit("alice", "drop", body(), 4, 6000).await.unwrap(), DepositOutcome::Stored { seq: 4 });
    assert_eq!(store.deposit("alice", "drop", body(), 4, 6000).await.unwrap(), DepositOutcome::Full);
    assert_eq!(store.deposit("alice", "wrong", body(), 4, 6000).await.unwrap(), DepositOutcome::NoMailbox);
    assert_eq!(store.deposit("carol", "drop", body(), 4, 6000).await.unwrap(), DepositOutcome::NoMailbox);
    assert_eq!(store.waiting_count("alice").await.unwrap(), 4);
    assert_eq!(store.ack("alice", vec![4, 9], 7000).await.unwrap(), vec![4]);
    assert_eq!(store.waiting_count("alice").await.unwrap(), 3);
    // A seq is never reused: the next deposit after the ack takes 5.
    assert_eq!(store.deposit("alice", "drop", body(), 4, 7000).await.unwrap(), DepositOutcome::Stored { seq: 5 });
    // The retention sweep drops the two old envelopes and the counter with them.
    let report = store.sweep(8000, 1000, 0).await.unwrap();
    assert_eq!(report.expired, 2);
    assert_eq!(store.waiting_count("alice").await.unwrap(), 2);
    assert_eq!(store.waiting("alice", 0, 10).await.unwrap().len(), 2);
    store.close().await;
}
