//! Upgrades of an existing SQLite database: a migration that adds counters starts them from what
//! the database already holds, so limits read from the counters hold across the upgrade.

// Tests: a failed setup should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::Arc;

use relay_lite::hub::Hub;
use relay_lite::store::stringcup::{NewMessage, PendingCaps, PendingLimit, SendOutcome, SendRequest};
use relay_lite::store::{DB_FILE, Store};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{ConnectOptions as _, Connection as _};

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
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join(DB_FILE))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let mut conn = options.connect().await.unwrap();
    let mut before = sqlx::migrate!("./migrations");
    let upto: Vec<_> = before.migrations.iter().filter(|m| m.version < 8).cloned().collect();
    assert_eq!(upto.len(), 7, "the migrations before the counters");
    before.migrations = upto.into();
    before.run(&mut conn).await.unwrap();
    for id in ["a", "b", "c"] {
        sqlx::query(
            "INSERT INTO sc_identity (id, public_key, token_hash, token_created_ms, token_last_used_ms, \
             key_updated_ms, updated_ms, created_ms) VALUES (?1, x'01', CAST(?1 AS BLOB), 1, 1, 1, 1, 1)",
        )
        .bind(id)
        .execute(&mut conn)
        .await
        .unwrap();
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
