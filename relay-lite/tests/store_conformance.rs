//! The store conformance suite, written once and run on every backend that serves a family:
//! SQLite (always) and PostgreSQL (a real server, see `pg_common`). Each scenario is a plain
//! async fn over the [`Store`] handle the routes use; the `conformance!` macro makes one test per
//! scenario per backend (`on_sqlite::…`, `on_postgres::…`).
//!
//! Covered: every store operation of the four families — letagents, letmeknow, Stringcup v2
//! (identities and tokens, sends and batches, inbox reads after a cursor, acks, idempotency keys,
//! the pending limits at their boundary, topics, rendezvous, sweeps, statistics) and Agent Mail
//! 1.0 (card binding and nonces, deliveries and their retries, tombstones, the quota at its
//! boundary, blocks, sweeps) — with the epoch compare-and-set, per-key sequence counters,
//! capacity, replayed logins, invite state and the wake-ups a commit publishes. The tests named
//! `on_postgres_…` at the end run two instances (two stores) on one database.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod pg_common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use ed25519_dalek::SigningKey;
use relay_lite::hub::Hub;
use relay_lite::store::agent_mail::{AmSweepReport, Decided, Quota, Refusal};
use relay_lite::store::letmeknow::{InviteOutcome, PostOutcome, group_key, invite_key};
use relay_lite::store::stringcup::{
    AddMembers, AddOutcome, Counts, CreateTopic, DeleteOutcome, DeleteTopic, JoinOutcome, JoinRendezvous,
    OpenRendezvous, Opened, PendingCaps, PendingLimit, ReleaseRendezvous, RemoveMember, RemoveOutcome, Role, Rotate,
    ScSweepReport, SendOutcome, Sweep, TopicCreated, Update, inbox_key, rendezvous_key,
};
use relay_lite::store::{DepositOutcome, LoginOutcome, Store};
use switchboard_core::protocol::agent_identity::AgentId;
use switchboard_core::protocol::agent_mail::relay::{DeliveryResult, RelayError};
use switchboard_core::protocol::agent_mail::{DAY_MS, Id16, Packet};
use switchboard_core::protocol::letmeknow::header::ContentType;

/// One backend under test: the store and the hub it publishes to.
struct Backend {
    store: Arc<Store>,
    hub: Arc<Hub>,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let hub = Arc::new(Hub::default());
    let store = Arc::new(Store::open(dir.path(), hub.clone()).await.unwrap());
    Backend { store, hub, _dir: Some(dir) }
}

async fn postgres() -> Option<Backend> {
    let cluster = pg_common::cluster()?;
    let url = cluster.fresh_database().await;
    let hub = Arc::new(Hub::default());
    let store = Arc::new(Store::open_postgres(&url, hub.clone()).await.unwrap());
    Some(Backend { store, hub, _dir: None })
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let backend = super::sqlite().await;
                    super::$name(&backend).await;
                    backend.store.close().await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(backend) = super::postgres().await else { return };
                    super::$name(&backend).await;
                    backend.store.close().await;
                }
            )*
        }
    };
}

conformance!(
    login_creates_then_updates_and_refuses_a_replay,
    deposit_needs_the_mailbox_and_its_drop,
    deposits_get_consecutive_seqs_and_stop_at_capacity,
    waiting_reads_in_seq_order_after_a_cursor_with_a_limit,
    ack_deletes_what_exists_and_seqs_are_never_reused,
    sweep_expires_old_envelopes_and_erases_idle_empty_mailboxes,
    the_waiting_count_follows_deposits_acks_and_sweeps_and_refuses_exactly_at_capacity,
    a_committed_deposit_wakes_its_mailbox_watchers,
    concurrent_commits_at_one_epoch_exactly_one_wins,
    application_messages_need_the_current_epoch_and_the_log_reads_in_order,
    letmeknow_sweep_deletes_old_messages_and_keeps_the_epoch,
    an_invite_takes_one_join_then_one_welcome_from_its_owner,
    an_expired_invite_is_gone_and_its_id_can_be_reused,
    stringcup_register_update_rotate_and_touch_keep_one_token_per_identity,
    stringcup_inbox_ids_and_sent_seqs_are_per_key_and_read_after_a_cursor,
    stringcup_concurrent_sends_to_one_inbox_get_consecutive_ids,
    stringcup_acks_sort_ids_into_acknowledged_and_not_found_and_ids_are_never_reused,
    stringcup_an_idempotency_key_stores_once_and_replays_the_same_sent_seq,
    stringcup_pending_limits_refuse_exactly_at_their_boundary,
    stringcup_pending_counters_follow_sends_acks_keyed_sends_and_a_reclaimed_inbox,
    stringcup_topics_keep_owner_rules_and_a_member_limit,
    stringcup_a_rendezvous_takes_one_responder_and_ends_when_everyone_released,
    stringcup_sweep_reclaims_expired_tokens_old_keys_and_expired_rendezvous,
    stringcup_a_committed_send_wakes_the_inbox_and_counts_follow,
    agent_mail_a_card_binds_its_mailbox_to_its_owner_and_nonces_only_grow,
    agent_mail_a_packet_is_stored_once_and_a_retry_answers_its_first_acceptance,
    agent_mail_a_deleted_packet_leaves_a_tombstone_that_still_answers_a_retry,
    agent_mail_the_quota_refuses_exactly_at_its_boundary_and_a_delete_frees_room,
    agent_mail_a_blocked_sender_is_refused_until_unblocked,
    agent_mail_sweep_reclaims_expired_packets_and_tombstones_then_the_mailbox,
);

const DROP: &str = "drop-hash-of-alice";
const G: &str = "0123456789abcdef0123456789abcdef";
const I: &str = "fedcba9876543210fedcba9876543210";

fn body(tag: &str) -> Bytes {
    Bytes::from(format!("LA1{tag}"))
}

async fn login_creates_then_updates_and_refuses_a_replay(b: &Backend) {
    let s = &b.store;
    assert_eq!(s.login("alice", DROP, 10, 100).await.unwrap(), LoginOutcome::Created);
    assert_eq!(s.login("alice", "new-drop", 11, 101).await.unwrap(), LoginOutcome::Updated);
    assert_eq!(s.login("alice", "evil", 11, 102).await.unwrap(), LoginOutcome::Replay);
    assert_eq!(s.login("alice", "evil", 5, 103).await.unwrap(), LoginOutcome::Replay);
    assert_eq!(s.drop_hash("alice").await.unwrap().as_deref(), Some("new-drop"));
    assert_eq!(s.drop_hash("nobody").await.unwrap(), None);
}

async fn deposit_needs_the_mailbox_and_its_drop(b: &Backend) {
    let s = &b.store;
    assert_eq!(s.deposit("alice", DROP, body("x"), 10, 1).await.unwrap(), DepositOutcome::NoMailbox);
    s.login("alice", DROP, 1, 1).await.unwrap();
    assert_eq!(s.deposit("alice", "wrong", body("x"), 10, 2).await.unwrap(), DepositOutcome::NoMailbox);
    assert_eq!(s.deposit("alice", DROP, body("x"), 10, 2).await.unwrap(), DepositOutcome::Stored { seq: 1 });
    assert_eq!(s.waiting_count("alice").await.unwrap(), 1);
}

async fn deposits_get_consecutive_seqs_and_stop_at_capacity(b: &Backend) {
    b.store.login("alice", DROP, 1, 1).await.unwrap();
    let sends = (0..20).map(|i| {
        let store = b.store.clone();
        tokio::spawn(async move { store.deposit("alice", DROP, body(&i.to_string()), 15, 2).await.unwrap() })
    });
    let (mut seqs, mut full) = (Vec::new(), 0);
    for send in sends.collect::<Vec<_>>() {
        match send.await.unwrap() {
            DepositOutcome::Stored { seq } => seqs.push(seq),
            DepositOutcome::Full => full += 1,
            DepositOutcome::NoMailbox => panic!("mailbox vanished"),
        }
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=15).collect::<Vec<_>>());
    assert_eq!(full, 5);
}

async fn waiting_reads_in_seq_order_after_a_cursor_with_a_limit(b: &Backend) {
    let s = &b.store;
    s.login("alice", DROP, 1, 1).await.unwrap();
    for i in 0..5 {
        s.deposit("alice", DROP, body(&i.to_string()), 100, 2).await.unwrap();
    }
    let page = s.waiting("alice", 1, 3).await.unwrap();
    assert_eq!(page.iter().map(|w| w.seq).collect::<Vec<_>>(), vec![2, 3, 4]);
    assert_eq!(page[0].body, b"LA11".to_vec());
    assert!(s.waiting("alice", 5, 10).await.unwrap().is_empty());
    assert!(s.waiting("nobody", 0, 10).await.unwrap().is_empty());
}

async fn ack_deletes_what_exists_and_seqs_are_never_reused(b: &Backend) {
    let s = &b.store;
    s.login("alice", DROP, 1, 1).await.unwrap();
    for i in 0..3 {
        s.deposit("alice", DROP, body(&i.to_string()), 100, 2).await.unwrap();
    }
    assert_eq!(s.ack("alice", vec![3, 9, 1, 3], 5).await.unwrap(), vec![3, 1]);
    assert_eq!(s.waiting_count("alice").await.unwrap(), 1);
    assert_eq!(s.ack("alice", vec![2], 6).await.unwrap(), vec![2]);
    let next = s.deposit("alice", DROP, body("again"), 100, 7).await.unwrap();
    assert_eq!(next, DepositOutcome::Stored { seq: 4 }, "a seq is never handed out twice");
}

async fn sweep_expires_old_envelopes_and_erases_idle_empty_mailboxes(b: &Backend) {
    let s = &b.store;
    s.login("old", DROP, 1, 10).await.unwrap();
    s.login("busy", DROP, 1, 10).await.unwrap();
    s.login("fresh", DROP, 1, 1000).await.unwrap();
    s.deposit("busy", DROP, body("kept"), 100, 500).await.unwrap();
    s.deposit("fresh", DROP, body("expired"), 100, 20).await.unwrap();
    let report = s.sweep(1000, 100, 100).await.unwrap();
    assert_eq!(report.expired, 1, "the envelope received at 20");
    assert_eq!(report.erased, 1, "only `old`: `busy` holds mail, `fresh` is active");
    assert_eq!(s.drop_hash("old").await.unwrap(), None);
    assert!(s.drop_hash("busy").await.unwrap().is_some());
    assert!(s.drop_hash("fresh").await.unwrap().is_some());
    assert_eq!(s.waiting_count("fresh").await.unwrap(), 0);
}

/// The waiting count (a counter kept in the write transaction on SQLite) and the capacity check
/// it feeds agree with the envelopes really waiting after every kind of change.
async fn the_waiting_count_follows_deposits_acks_and_sweeps_and_refuses_exactly_at_capacity(b: &Backend) {
    const CAP: usize = 4;
    let s = &b.store;
    let really_waiting = |mailbox: &'static str| async move { s.waiting(mailbox, 0, 1000).await.unwrap().len() as i64 };
    s.login("alice", DROP, 1, 1).await.unwrap();
    s.login("bob", DROP, 1, 1).await.unwrap();
    // Two old envelopes (received at 10) and two new ones (at 500); bob's mail is counted apart.
    for (i, at) in [10, 10, 500, 500].into_iter().enumerate() {
        let stored = s.deposit("alice", DROP, body(&i.to_string()), CAP, at).await.unwrap();
        assert_eq!(stored, DepositOutcome::Stored { seq: i as i64 + 1 });
    }
    s.deposit("bob", DROP, body("b"), CAP, 10).await.unwrap();
    assert_eq!(s.waiting_count("alice").await.unwrap(), 4);
    assert_eq!(s.waiting_count("bob").await.unwrap(), 1);
    // Exactly at the limit: refused, and the refusal changes nothing.
    assert_eq!(s.deposit("alice", DROP, body("over"), CAP, 600).await.unwrap(), DepositOutcome::Full);
    assert_eq!(s.waiting_count("alice").await.unwrap(), 4);
    // A wrong drop at the limit is still "no mailbox", never "full".
    assert_eq!(s.deposit("alice", "wrong", body("x"), CAP, 600).await.unwrap(), DepositOutcome::NoMailbox);
    // An ack frees exactly what it deleted (seq 9 does not exist, 3 is named twice).
    assert_eq!(s.ack("alice", vec![3, 9, 3], 700).await.unwrap(), vec![3]);
    assert_eq!(s.waiting_count("alice").await.unwrap(), 3);
    assert_eq!(s.deposit("alice", DROP, body("fits"), CAP, 800).await.unwrap(), DepositOutcome::Stored { seq: 5 });
    assert_eq!(s.deposit("alice", DROP, body("over"), CAP, 800).await.unwrap(), DepositOutcome::Full);
    assert_eq!(s.waiting_count("alice").await.unwrap(), really_waiting("alice").await);
    // The expiry sweep takes the two envelopes received at 10 from alice and bob's one.
    let report = s.sweep(900, 100, 0).await.unwrap();
    assert_eq!(report.expired, 3);
    assert_eq!(s.waiting_count("alice").await.unwrap(), 2);
    assert_eq!(s.waiting_count("alice").await.unwrap(), really_waiting("alice").await);
    assert_eq!(s.waiting_count("bob").await.unwrap(), 0);
    // Room for exactly two more, then refused at the limit again.
    for seq in [6, 7] {
        let stored = s.deposit("alice", DROP, body("refill"), CAP, 950).await.unwrap();
        assert_eq!(stored, DepositOutcome::Stored { seq });
    }
    assert_eq!(s.deposit("alice", DROP, body("over"), CAP, 950).await.unwrap(), DepositOutcome::Full);
    assert_eq!(s.waiting_count("alice").await.unwrap(), CAP as i64);
    assert_eq!(really_waiting("alice").await, CAP as i64);
    // Everything acked: zero, and a deposit fits again.
    assert_eq!(s.ack("alice", vec![4, 5, 6, 7], 990).await.unwrap().len(), 4);
    assert_eq!(s.waiting_count("alice").await.unwrap(), 0);
    assert_eq!(s.deposit("alice", DROP, body("again"), CAP, 999).await.unwrap(), DepositOutcome::Stored { seq: 8 });
    assert_eq!(s.waiting_count("alice").await.unwrap(), 1);
}

async fn a_committed_deposit_wakes_its_mailbox_watchers(b: &Backend) {
    let s = &b.store;
    s.login("alice", DROP, 1, 1).await.unwrap();
    let mut newest = b.hub.subscribe("alice");
    s.deposit("alice", DROP, body("x"), 100, 2).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), newest.changed()).await.unwrap().unwrap();
    assert_eq!(*newest.borrow_and_update(), 1);
    let mut group = b.hub.subscribe(&group_key(G));
    s.lmk_post(G, 0, ContentType::Commit, Bytes::from_static(b"c"), 3).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), group.changed()).await.unwrap().unwrap();
    assert_eq!(*group.borrow_and_update(), 1);
}

async fn concurrent_commits_at_one_epoch_exactly_one_wins(b: &Backend) {
    let posts = (0..10).map(|_| {
        let store = b.store.clone();
        tokio::spawn(
            async move { store.lmk_post(G, 0, ContentType::Commit, Bytes::from_static(b"c"), 1).await.unwrap() },
        )
    });
    let mut won = 0;
    for p in posts.collect::<Vec<_>>() {
        match p.await.unwrap() {
            PostOutcome::Stored { seq } => {
                won += 1;
                assert_eq!(seq, 1);
            }
            PostOutcome::WrongEpoch { current } => assert_eq!(current, 1),
        }
    }
    assert_eq!(won, 1);
    assert_eq!(b.store.lmk_epoch(G).await.unwrap(), 1);
}

async fn application_messages_need_the_current_epoch_and_the_log_reads_in_order(b: &Backend) {
    let s = &b.store;
    assert_eq!(s.lmk_epoch(G).await.unwrap(), 0, "a group never written is at epoch 0");
    let app = |t: &'static str| Bytes::from_static(t.as_bytes());
    assert_eq!(s.lmk_post(G, 0, ContentType::Application, app("a"), 1).await.unwrap(), PostOutcome::Stored { seq: 1 });
    assert_eq!(
        s.lmk_post(G, 1, ContentType::Application, app("b"), 2).await.unwrap(),
        PostOutcome::WrongEpoch { current: 0 }
    );
    assert_eq!(s.lmk_post(G, 0, ContentType::Commit, app("c"), 3).await.unwrap(), PostOutcome::Stored { seq: 2 });
    assert_eq!(s.lmk_post(G, 1, ContentType::Application, app("d"), 4).await.unwrap(), PostOutcome::Stored { seq: 3 });
    assert_eq!(s.lmk_messages(G, 1, 10).await.unwrap(), vec![(2, b"c".to_vec()), (3, b"d".to_vec())]);
    assert_eq!(s.lmk_messages(G, 0, 1).await.unwrap(), vec![(1, b"a".to_vec())]);
}

async fn letmeknow_sweep_deletes_old_messages_and_keeps_the_epoch(b: &Backend) {
    let s = &b.store;
    s.lmk_post(G, 0, ContentType::Commit, Bytes::from_static(b"a"), 10).await.unwrap();
    s.lmk_post(G, 1, ContentType::Application, Bytes::from_static(b"b"), 20).await.unwrap();
    let report = s.lmk_sweep(15, 20).await.unwrap();
    assert_eq!(report.messages, 1);
    assert_eq!(s.lmk_messages(G, 0, 10).await.unwrap(), vec![(2, b"b".to_vec())]);
    assert_eq!(s.lmk_epoch(G).await.unwrap(), 1);
    let next = s.lmk_post(G, 1, ContentType::Commit, Bytes::from_static(b"c"), 30).await.unwrap();
    assert_eq!(next, PostOutcome::Stored { seq: 3 });
}

async fn an_invite_takes_one_join_then_one_welcome_from_its_owner(b: &Backend) {
    let s = &b.store;
    assert_eq!(s.lmk_create_invite(I, "owner-token", 1000, 1).await.unwrap(), InviteOutcome::Done);
    assert_eq!(s.lmk_create_invite(I, "other", 1000, 2).await.unwrap(), InviteOutcome::Conflict);
    assert_eq!(s.lmk_put_blob(I, Some("owner-token"), b"w".to_vec(), 3).await.unwrap(), InviteOutcome::Conflict);
    let mut watch = b.hub.subscribe(&invite_key(I));
    assert_eq!(s.lmk_put_blob(I, None, b"j".to_vec(), 4).await.unwrap(), InviteOutcome::Done);
    tokio::time::timeout(Duration::from_secs(5), watch.changed()).await.unwrap().unwrap();
    assert_eq!(s.lmk_put_blob(I, None, b"j2".to_vec(), 5).await.unwrap(), InviteOutcome::Conflict);
    assert_eq!(s.lmk_put_blob(I, Some("wrong"), b"w".to_vec(), 6).await.unwrap(), InviteOutcome::Forbidden);
    assert_eq!(s.lmk_put_blob(I, Some("owner-token"), b"w".to_vec(), 7).await.unwrap(), InviteOutcome::Done);
    assert_eq!(s.lmk_put_blob(I, Some("owner-token"), b"w".to_vec(), 8).await.unwrap(), InviteOutcome::Conflict);
    let state = s.lmk_invite(I, 9).await.unwrap().unwrap();
    assert_eq!((state.expires_at, state.join, state.welcome), (1000, Some(b"j".to_vec()), Some(b"w".to_vec())));
    assert_eq!(s.lmk_put_blob("00000000000000000000000000000000", None, vec![], 9).await.unwrap(), InviteOutcome::Gone);
}

async fn an_expired_invite_is_gone_and_its_id_can_be_reused(b: &Backend) {
    let s = &b.store;
    s.lmk_create_invite(I, "owner", 100, 1).await.unwrap();
    assert!(s.lmk_invite(I, 100).await.unwrap().is_none(), "gone at its expiry, before any sweep");
    assert_eq!(s.lmk_put_blob(I, None, b"j".to_vec(), 100).await.unwrap(), InviteOutcome::Gone);
    assert_eq!(s.lmk_create_invite(I, "new-owner", 500, 200).await.unwrap(), InviteOutcome::Done);
    s.lmk_create_invite("11111111111111111111111111111111", "o", 300, 200).await.unwrap();
    let report = s.lmk_sweep(0, 400).await.unwrap();
    assert_eq!(report.invites, 1);
    assert!(s.lmk_invite(I, 400).await.unwrap().is_some());
}

/// Two instances (two stores, two hubs) on one PostgreSQL database: a commit through one wakes a
/// watcher of the other, through LISTEN/NOTIFY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_commit_through_one_instance_wakes_a_watcher_of_another() {
    let Some(cluster) = pg_common::cluster() else { return };
    let url = cluster.fresh_database().await;
    let (hub_a, hub_c) = (Arc::new(Hub::default()), Arc::new(Hub::default()));
    let a = Store::open_postgres(&url, hub_a).await.unwrap();
    let c = Store::open_postgres(&url, hub_c.clone()).await.unwrap();
    a.login("alice", DROP, 1, 1).await.unwrap();
    let mut newest = hub_c.subscribe("alice");
    let sent = std::time::Instant::now();
    assert_eq!(a.deposit("alice", DROP, body("x"), 100, 2).await.unwrap(), DepositOutcome::Stored { seq: 1 });
    tokio::time::timeout(Duration::from_secs(5), newest.changed()).await.unwrap().unwrap();
    assert_eq!(*newest.borrow_and_update(), 1);
    assert!(sent.elapsed() < Duration::from_millis(200), "woke after {:?}", sent.elapsed());
    assert_eq!(c.waiting("alice", 0, 10).await.unwrap().len(), 1, "C reads what A committed");
    a.close().await;
    c.close().await;
}

/// Two stores on one fresh PostgreSQL database (two relay-lite instances, in this process), or
/// `None` when there is no PostgreSQL here (see `pg_common`).
async fn two_pg_instances() -> Option<(Arc<Store>, Arc<Store>)> {
    let url = pg_common::cluster()?.fresh_database().await;
    let a = Arc::new(Store::open_postgres(&url, Arc::new(Hub::default())).await.unwrap());
    let b = Arc::new(Store::open_postgres(&url, Arc::new(Hub::default())).await.unwrap());
    Some((a, b))
}

/// Two instances post a commit at one epoch at once: one wins, the other sees the new epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_commits_at_one_epoch_through_two_instances_exactly_one_wins() {
    let Some((a, b)) = two_pg_instances().await else { return };
    for round in 0..20u64 {
        let gid = format!("{round:032x}");
        let post = |s: Arc<Store>, gid: String| {
            tokio::spawn(async move { s.lmk_post(&gid, 0, ContentType::Commit, Bytes::from_static(b"c"), 1).await })
        };
        let (ra, rb) = (post(a.clone(), gid.clone()), post(b.clone(), gid.clone()));
        let outcomes = [ra.await.unwrap().unwrap(), rb.await.unwrap().unwrap()];
        let won = outcomes.iter().filter(|o| matches!(o, PostOutcome::Stored { seq: 1 })).count();
        let lost = outcomes.iter().filter(|o| **o == PostOutcome::WrongEpoch { current: 1 }).count();
        assert_eq!((won, lost), (1, 1), "round {round}: {outcomes:?}");
    }
    a.close().await;
    b.close().await;
}

// ---- Stringcup v2 ----------------------------------------------------------------------------

mod sc {
    use relay_lite::store::stringcup::*;

    /// Generous pending limits.
    pub const ROOMY: PendingCaps =
        PendingCaps { inbox_messages: 1000, inbox_bytes: 1 << 24, sender_messages: 1000, sender_bytes: 1 << 24 };

    pub fn register(id: &str, now: i64) -> Register {
        Register {
            id: id.into(),
            public_key: vec![1; 32],
            display_name: String::new(),
            token_hash: format!("token-of-{id}").into_bytes(),
            now,
        }
    }

    pub fn message(recipient: &str, ciphertext: &[u8]) -> NewMessage {
        NewMessage {
            recipient: recipient.into(),
            ephemeral_pub: vec![2; 32],
            iv: vec![3; 12],
            header_extra: String::new(),
            ciphertext: ciphertext.to_vec(),
        }
    }

    pub fn send(
        sender: &str,
        key: Option<&str>,
        messages: Vec<NewMessage>,
        caps: PendingCaps,
        now: i64,
    ) -> SendRequest {
        SendRequest {
            sender: sender.into(),
            idempotency_key: key.map(str::to_owned),
            idempotency_expired_before: 0,
            messages,
            caps,
            now,
        }
    }
}

async fn sc_identities(s: &Store, ids: &[&str]) {
    for id in ids {
        assert!(s.stringcup().register(sc::register(id, 1)).await.unwrap(), "register {id}");
    }
}

async fn sc_send_one(s: &Store, from: &str, to: &str, text: &[u8], caps: PendingCaps) -> SendOutcome {
    let out = s.stringcup().send(sc::send(from, None, vec![sc::message(to, text)], caps, 10)).await.unwrap();
    assert_eq!(out.len(), 1);
    out[0]
}

async fn stringcup_register_update_rotate_and_touch_keep_one_token_per_identity(b: &Backend) {
    let s = b.store.stringcup();
    assert!(s.register(sc::register("sc-alice", 100)).await.unwrap());
    assert!(!s.register(sc::register("sc-alice", 101)).await.unwrap(), "the id is taken");
    let mut same_token = sc::register("sc-other", 102);
    same_token.token_hash = b"token-of-sc-alice".to_vec();
    assert!(!s.register(same_token).await.unwrap(), "the token hash is taken");
    let row = s.by_token(b"token-of-sc-alice").await.unwrap().unwrap();
    assert_eq!((row.identity.as_str(), row.token_created_ms, row.token_last_used_ms), ("sc-alice", 100, 100));
    // Touch only moves forward.
    s.touch("sc-alice", 500).await.unwrap();
    s.touch("sc-alice", 400).await.unwrap();
    assert_eq!(s.by_token(b"token-of-sc-alice").await.unwrap().unwrap().token_last_used_ms, 500);
    // A label change is not a key change; a key change moves key_updated_ms.
    let named = Update { identity: "sc-alice".into(), public_key: None, display_name: Some("Alice".into()), now: 600 };
    let named = s.update(named).await.unwrap().unwrap();
    assert!(!named.key_changed);
    assert_eq!((named.row.display_name.as_str(), named.row.updated_ms, named.row.key_updated_ms), ("Alice", 600, 100));
    let rekey = Update { identity: "sc-alice".into(), public_key: Some(vec![9; 32]), display_name: None, now: 700 };
    let rekeyed = s.update(rekey).await.unwrap().unwrap();
    assert!(rekeyed.key_changed);
    assert_eq!((rekeyed.row.public_key, rekeyed.row.key_updated_ms), (vec![9; 32], 700));
    let gone = Update { identity: "sc-nobody".into(), public_key: None, display_name: Some("x".into()), now: 1 };
    assert!(s.update(gone).await.unwrap().is_none());
    // Rotation replaces the current token once; the old one no longer authenticates.
    let rotate = |old: &[u8], new: &[u8]| Rotate {
        identity: "sc-alice".into(),
        old_hash: old.to_vec(),
        new_hash: new.to_vec(),
        now: 800,
    };
    assert!(s.rotate(rotate(b"token-of-sc-alice", b"second")).await.unwrap());
    assert!(!s.rotate(rotate(b"token-of-sc-alice", b"third")).await.unwrap(), "a stale token rotates nothing");
    assert!(s.by_token(b"token-of-sc-alice").await.unwrap().is_none());
    assert_eq!(s.by_token(b"second").await.unwrap().unwrap().token_created_ms, 800);
    assert_eq!(s.identity("sc-alice").await.unwrap().unwrap().display_name, "Alice");
    assert!(s.identity("sc-nobody").await.unwrap().is_none());
}

async fn stringcup_inbox_ids_and_sent_seqs_are_per_key_and_read_after_a_cursor(b: &Backend) {
    let s = &b.store;
    sc_identities(s, &["sc-a", "sc-b", "sc-c"]).await;
    assert_eq!(sc_send_one(s, "sc-a", "sc-b", b"1", sc::ROOMY).await, SendOutcome::Stored { sent_seq: 1, inbox_id: 1 });
    assert_eq!(sc_send_one(s, "sc-a", "sc-c", b"2", sc::ROOMY).await, SendOutcome::Stored { sent_seq: 2, inbox_id: 1 });
    assert_eq!(sc_send_one(s, "sc-c", "sc-b", b"3", sc::ROOMY).await, SendOutcome::Stored { sent_seq: 1, inbox_id: 2 });
    assert_eq!(sc_send_one(s, "sc-a", "sc-nobody", b"x", sc::ROOMY).await, SendOutcome::NoRecipient);
    assert_eq!(sc_send_one(s, "sc-gone", "sc-b", b"x", sc::ROOMY).await, SendOutcome::NoSender);
    // A batch: each message on its own, in order.
    let mut extra = sc::message("sc-b", b"4");
    extra.header_extra = r#"{"purpose":"pairing"}"#.into();
    let batch =
        sc::send("sc-a", None, vec![extra, sc::message("sc-nobody", b"y"), sc::message("sc-b", b"5")], sc::ROOMY, 20);
    assert_eq!(
        s.stringcup().send(batch).await.unwrap(),
        vec![
            SendOutcome::Stored { sent_seq: 3, inbox_id: 3 },
            SendOutcome::NoRecipient,
            SendOutcome::Stored { sent_seq: 4, inbox_id: 4 }
        ]
    );
    let page = s.stringcup().inbox("sc-b", 1, 2).await.unwrap();
    assert_eq!(page.iter().map(|m| m.id).collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!((page[0].sender.as_str(), page[0].ciphertext.as_slice(), page[0].created_ms), ("sc-c", &b"3"[..], 10));
    assert_eq!(page[1].header_extra, r#"{"purpose":"pairing"}"#);
    assert_eq!((page[1].header_version, page[1].header_algo.as_str()), (2, "x25519+ecies+aes256gcm"));
    assert_eq!((page[1].ephemeral_pub.len(), page[1].iv.len()), (32, 12));
    assert!(s.stringcup().inbox("sc-b", 4, 10).await.unwrap().is_empty());
}

async fn stringcup_concurrent_sends_to_one_inbox_get_consecutive_ids(b: &Backend) {
    let s = &b.store;
    sc_identities(s, &["sc-a", "sc-b"]).await;
    let sends = (0..30).map(|i| {
        let store = b.store.clone();
        tokio::spawn(async move { sc_send_one(&store, "sc-a", "sc-b", format!("m{i}").as_bytes(), sc::ROOMY).await })
    });
    let (mut ids, mut seqs) = (Vec::new(), Vec::new());
    for send in sends.collect::<Vec<_>>() {
        match send.await.unwrap() {
            SendOutcome::Stored { sent_seq, inbox_id } => {
                ids.push(inbox_id);
                seqs.push(sent_seq);
            }
            other => panic!("{other:?}"),
        }
    }
    ids.sort_unstable();
    seqs.sort_unstable();
    assert_eq!(ids, (1..=30).collect::<Vec<_>>());
    assert_eq!(seqs, (1..=30).collect::<Vec<_>>());
}

async fn stringcup_acks_sort_ids_into_acknowledged_and_not_found_and_ids_are_never_reused(b: &Backend) {
    let s = &b.store;
    sc_identities(s, &["sc-a", "sc-b"]).await;
    for i in 0..3 {
        sc_send_one(s, "sc-a", "sc-b", format!("{i}").as_bytes(), sc::ROOMY).await;
    }
    let out = s.stringcup().ack("sc-b", vec![3, 9, 1]).await.unwrap();
    assert_eq!((out.acknowledged, out.not_found), (vec![3, 1], vec![9]));
    let out = s.stringcup().ack("sc-a", vec![2]).await.unwrap();
    assert_eq!((out.acknowledged, out.not_found), (vec![], vec![2]), "only the recipient acks");
    let left = s.stringcup().inbox("sc-b", 0, 10).await.unwrap();
    assert_eq!(left.iter().map(|m| m.id).collect::<Vec<_>>(), vec![2]);
    s.stringcup().ack("sc-b", vec![2]).await.unwrap();
    let next = sc_send_one(s, "sc-a", "sc-b", b"again", sc::ROOMY).await;
    assert_eq!(next, SendOutcome::Stored { sent_seq: 4, inbox_id: 4 }, "an id is never handed out twice");
}

async fn stringcup_an_idempotency_key_stores_once_and_replays_the_same_sent_seq(b: &Backend) {
    let s = &b.store;
    sc_identities(s, &["sc-a", "sc-b", "sc-c"]).await;
    let keyed =
        |to: &str, key: &str, now: i64| sc::send("sc-a", Some(key), vec![sc::message(to, b"k")], sc::ROOMY, now);
    let sends = (0..20).map(|_| {
        let store = b.store.clone();
        let req = keyed("sc-b", "key-1", 10);
        tokio::spawn(async move { store.stringcup().send(req).await.unwrap() })
    });
    let mut stored = 0;
    for send in sends.collect::<Vec<_>>() {
        match send.await.unwrap().as_slice() {
            [SendOutcome::Stored { sent_seq: 1, inbox_id: 1 }] => stored += 1,
            [SendOutcome::Replay { sent_seq: 1 }] => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(stored, 1);
    assert_eq!(s.stringcup().inbox("sc-b", 0, 10).await.unwrap().len(), 1, "one row");
    assert_eq!(s.stringcup().send(keyed("sc-c", "key-1", 11)).await.unwrap(), vec![SendOutcome::KeyReused]);
    // A refused send does not consume its key.
    assert_eq!(s.stringcup().send(keyed("sc-nobody", "key-2", 12)).await.unwrap(), vec![SendOutcome::NoRecipient]);
    let stored = s.stringcup().send(keyed("sc-c", "key-2", 13)).await.unwrap();
    assert_eq!(stored, vec![SendOutcome::Stored { sent_seq: 2, inbox_id: 1 }]);
    // A key past its lifetime is forgotten by the next send that names it.
    let mut late = keyed("sc-b", "key-1", 5000);
    late.idempotency_expired_before = 1000;
    assert_eq!(s.stringcup().send(late).await.unwrap(), vec![SendOutcome::Stored { sent_seq: 3, inbox_id: 2 }]);
}

async fn stringcup_pending_limits_refuse_exactly_at_their_boundary(b: &Backend) {
    let s = &b.store;
    sc_identities(s, &["sc-a", "sc-b", "sc-c"]).await;
    let caps = PendingCaps { inbox_messages: 3, inbox_bytes: 100, sender_messages: 2, sender_bytes: 30 };
    // The sender's message count: two fit, the third is the sender's share being full.
    assert!(matches!(sc_send_one(s, "sc-a", "sc-b", &[0; 10], caps).await, SendOutcome::Stored { .. }));
    assert!(matches!(sc_send_one(s, "sc-a", "sc-b", &[0; 10], caps).await, SendOutcome::Stored { .. }));
    let full = sc_send_one(s, "sc-a", "sc-b", &[0; 1], caps).await;
    assert_eq!(full, SendOutcome::Full(PendingLimit::SenderMessages(2)));
    // The sender's bytes: 20 pending, 10 more is exactly 30 (fits), 11 more is over.
    let bytes = PendingCaps { sender_messages: 10, ..caps };
    assert_eq!(sc_send_one(s, "sc-a", "sc-b", &[0; 11], bytes).await, SendOutcome::Full(PendingLimit::SenderBytes(30)));
    assert!(matches!(sc_send_one(s, "sc-a", "sc-b", &[0; 10], bytes).await, SendOutcome::Stored { .. }));
    // The inbox as a whole: three pending, so anybody's next one is refused.
    assert_eq!(sc_send_one(s, "sc-c", "sc-b", &[0; 1], caps).await, SendOutcome::Full(PendingLimit::InboxMessages(3)));
    let roomy_count = PendingCaps { inbox_messages: 10, sender_bytes: 1000, ..caps };
    assert_eq!(
        sc_send_one(s, "sc-c", "sc-b", &[0; 71], roomy_count).await,
        SendOutcome::Full(PendingLimit::InboxBytes(100))
    );
    assert!(matches!(sc_send_one(s, "sc-c", "sc-b", &[0; 70], roomy_count).await, SendOutcome::Stored { .. }));
    // An ack frees room.
    s.stringcup().ack("sc-b", vec![1]).await.unwrap();
    let after_ack = PendingCaps { inbox_messages: 4, sender_messages: 10, ..caps };
    assert!(matches!(sc_send_one(s, "sc-a", "sc-b", &[0; 1], after_ack).await, SendOutcome::Stored { .. }));
}

/// The pending limits read per-inbox and per-sender counters (SQLite migration 0008, PostgreSQL
/// 0005), not a count of the inbox: they must follow every store and delete exactly.
async fn stringcup_pending_counters_follow_sends_acks_keyed_sends_and_a_reclaimed_inbox(b: &Backend) {
    let s = &b.store;
    sc_identities(s, &["sc-a", "sc-b", "sc-c"]).await;
    let caps = PendingCaps { inbox_messages: 100, inbox_bytes: 1000, sender_messages: 2, sender_bytes: 1000 };
    let stored = |o: SendOutcome| matches!(o, SendOutcome::Stored { .. });
    assert!(stored(sc_send_one(s, "sc-a", "sc-b", &[0; 10], caps).await));
    // A keyed send counts like any other; its replay counts nothing.
    let keyed = || sc::send("sc-a", Some("k1"), vec![sc::message("sc-b", &[0; 10])], caps, 20);
    assert!(stored(s.stringcup().send(keyed()).await.unwrap()[0]));
    assert!(matches!(s.stringcup().send(keyed()).await.unwrap()[0], SendOutcome::Replay { .. }));
    assert_eq!(sc_send_one(s, "sc-a", "sc-b", &[0; 1], caps).await, SendOutcome::Full(PendingLimit::SenderMessages(2)));
    // Each sender has its own share of the inbox; the inbox's total holds all of them.
    assert!(stored(sc_send_one(s, "sc-c", "sc-b", &[0; 10], caps).await));
    let inbox_full = PendingCaps { inbox_messages: 3, sender_messages: 10, ..caps };
    assert_eq!(
        sc_send_one(s, "sc-c", "sc-b", &[0; 1], inbox_full).await,
        SendOutcome::Full(PendingLimit::InboxMessages(3))
    );
    let bytes_full = PendingCaps { inbox_bytes: 35, sender_messages: 10, ..caps };
    assert_eq!(
        sc_send_one(s, "sc-c", "sc-b", &[0; 6], bytes_full).await,
        SendOutcome::Full(PendingLimit::InboxBytes(35))
    );
    // Acking both of sc-a's messages empties its share (and only its share).
    let ids: Vec<i64> = s
        .stringcup()
        .inbox("sc-b", 0, 10)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.sender == "sc-a")
        .map(|m| m.id)
        .collect();
    assert_eq!(ids.len(), 2);
    s.stringcup().ack("sc-b", ids).await.unwrap();
    let one_each = PendingCaps { sender_messages: 1, ..caps };
    assert!(stored(sc_send_one(s, "sc-a", "sc-b", &[0; 10], one_each).await));
    assert_eq!(
        sc_send_one(s, "sc-c", "sc-b", &[0; 1], one_each).await,
        SendOutcome::Full(PendingLimit::SenderMessages(1))
    );
    assert_eq!(s.stringcup().counts().await.unwrap().messages_pending, 2);
    assert_eq!(s.stringcup().counts().await.unwrap().messages_stored, 4);
    // A reclaimed inbox takes its counters with it: the same id registered again starts empty.
    s.stringcup().touch("sc-a", 900).await.unwrap();
    s.stringcup().touch("sc-c", 900).await.unwrap();
    let report =
        s.stringcup().sweep(Sweep { now: 1000, tokens_unused_since: 100, idempotency_before: 0 }).await.unwrap();
    assert_eq!(report.identities, 1);
    sc_identities(s, &["sc-b"]).await;
    assert!(stored(sc_send_one(s, "sc-a", "sc-b", &[0; 10], one_each).await));
    assert!(stored(sc_send_one(s, "sc-c", "sc-b", &[0; 10], one_each).await));
    assert_eq!(
        sc_send_one(s, "sc-a", "sc-b", &[0; 1], one_each).await,
        SendOutcome::Full(PendingLimit::SenderMessages(1))
    );
}

async fn stringcup_topics_keep_owner_rules_and_a_member_limit(b: &Backend) {
    let s = &b.store;
    sc_identities(s, &["sc-o", "sc-m", "sc-n", "sc-x"]).await;
    let topic = "tp-aaaaaaaaaaaaaaaaaaaaaaaa";
    let create = |id: &str, members: Vec<&str>, max: u64| CreateTopic {
        id: id.into(),
        owner: "sc-o".into(),
        members: members.into_iter().map(str::to_owned).collect(),
        max_members: max,
        now: 5,
    };
    assert_eq!(s.stringcup().create_topic(create(topic, vec!["sc-m", "sc-n"], 2)).await.unwrap(), TopicCreated::Full);
    let created = s.stringcup().create_topic(create(topic, vec!["sc-o", "sc-m", "sc-ghost"], 3)).await.unwrap();
    let TopicCreated::Created(initial) = created else { panic!("{created:?}") };
    assert_eq!(
        (initial.added, initial.already, initial.unknown, initial.members),
        (vec!["sc-m".to_owned()], vec!["sc-o".to_owned()], vec!["sc-ghost".to_owned()], 2)
    );
    assert_eq!(s.stringcup().create_topic(create(topic, vec![], 3)).await.unwrap(), TopicCreated::IdTaken);
    let add = |caller: &str, ids: Vec<&str>| AddMembers {
        topic: topic.into(),
        caller: caller.into(),
        ids: ids.into_iter().map(str::to_owned).collect(),
        max_members: 3,
        now: 6,
    };
    assert_eq!(s.stringcup().add_members(add("sc-x", vec!["sc-n"])).await.unwrap(), AddOutcome::NotFound);
    assert_eq!(s.stringcup().add_members(add("sc-m", vec!["sc-n"])).await.unwrap(), AddOutcome::NotOwner);
    assert_eq!(
        s.stringcup().add_members(add("sc-o", vec!["sc-n", "sc-x"])).await.unwrap(),
        AddOutcome::Full { members: 2 }
    );
    let added = s.stringcup().add_members(add("sc-o", vec!["sc-n", "sc-m", "sc-ghost"])).await.unwrap();
    assert_eq!(
        added,
        AddOutcome::Added {
            topic: topic.into(),
            added: vec!["sc-n".into()],
            already: vec!["sc-m".into()],
            unknown: vec!["sc-ghost".into()],
            members: 3
        }
    );
    let roster: Vec<String> = s.stringcup().roster(topic).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(roster, vec!["sc-o", "sc-m", "sc-n"], "in the order they joined");
    let second = "tp-bbbbbbbbbbbbbbbbbbbbbbbb";
    s.stringcup()
        .create_topic(CreateTopic { id: second.into(), owner: "sc-m".into(), members: vec![], max_members: 3, now: 7 })
        .await
        .unwrap();
    let of_m: Vec<String> = s.stringcup().topics_of("sc-m").await.unwrap().into_iter().map(|t| t.id).collect();
    assert_eq!(of_m, vec![topic, second], "oldest first");
    let row = s.stringcup().topic_for_member(topic, "sc-n").await.unwrap().unwrap();
    assert_eq!((row.owner.as_str(), row.member_count, row.created_ms), ("sc-o", 3, 5));
    assert!(s.stringcup().topic_for_member(topic, "sc-x").await.unwrap().is_none(), "non-members see nothing");
    assert!(s.stringcup().topic_for_member("legacy-name", "sc-n").await.unwrap().is_none());
    let remove =
        |caller: &str, member: &str| RemoveMember { topic: topic.into(), caller: caller.into(), member: member.into() };
    assert_eq!(s.stringcup().remove_member(remove("sc-m", "sc-n")).await.unwrap(), RemoveOutcome::NotOwner);
    assert_eq!(s.stringcup().remove_member(remove("sc-o", "sc-o")).await.unwrap(), RemoveOutcome::OwnerStays);
    assert_eq!(
        s.stringcup().remove_member(remove("sc-n", "sc-n")).await.unwrap(),
        RemoveOutcome::Removed(topic.into())
    );
    assert_eq!(s.stringcup().remove_member(remove("sc-o", "sc-x")).await.unwrap(), RemoveOutcome::NotMember);
    let delete = |caller: &str| DeleteTopic { topic: topic.into(), caller: caller.into() };
    assert_eq!(s.stringcup().delete_topic(delete("sc-m")).await.unwrap(), DeleteOutcome::NotOwner);
    assert_eq!(s.stringcup().delete_topic(delete("sc-n")).await.unwrap(), DeleteOutcome::NotFound);
    assert_eq!(s.stringcup().delete_topic(delete("sc-o")).await.unwrap(), DeleteOutcome::Deleted(topic.into()));
    assert!(s.stringcup().roster(topic).await.unwrap().is_empty());
}

async fn stringcup_a_rendezvous_takes_one_responder_and_ends_when_everyone_released(b: &Backend) {
    let s = &b.store;
    sc_identities(s, &["sc-i", "sc-r", "sc-x"]).await;
    let token = b"rendezvous-token-hash".to_vec();
    let open =
        |who: &str| OpenRendezvous { token_hash: token.clone(), identity: who.into(), now: 10, expires_ms: 1000 };
    assert_eq!(s.stringcup().open_rendezvous(open("sc-ghost")).await.unwrap(), Opened::NoCaller);
    assert_eq!(s.stringcup().open_rendezvous(open("sc-i")).await.unwrap(), Opened::Opened);
    assert_eq!(s.stringcup().open_rendezvous(open("sc-x")).await.unwrap(), Opened::TokenTaken);
    let mut watch = b.hub.subscribe(&rendezvous_key(&token));
    let join = |who: &str, now: i64| JoinRendezvous { token_hash: token.clone(), identity: who.into(), now };
    assert_eq!(
        s.stringcup().join_rendezvous(join("sc-i", 20)).await.unwrap(),
        (JoinOutcome::Holds(Role::Initiator), 1)
    );
    assert_eq!(
        s.stringcup().join_rendezvous(join("sc-r", 21)).await.unwrap(),
        (JoinOutcome::Holds(Role::Responder), 2)
    );
    tokio::time::timeout(Duration::from_secs(5), async {
        while *watch.borrow_and_update() < 2 {
            watch.changed().await.unwrap();
        }
    })
    .await
    .unwrap();
    assert_eq!(s.stringcup().join_rendezvous(join("sc-x", 22)).await.unwrap(), (JoinOutcome::RoleTaken, 2));
    assert_eq!(s.stringcup().join_rendezvous(join("sc-r", 1000)).await.unwrap().0, JoinOutcome::Unknown, "expired");
    let row = s.stringcup().rendezvous(&token, 30).await.unwrap().unwrap();
    assert_eq!((row.expires_ms, row.version), (1000, 2));
    assert_eq!(row.claims, vec![(Role::Initiator, "sc-i".to_owned()), (Role::Responder, "sc-r".to_owned())]);
    let release = |who: &str| ReleaseRendezvous { token_hash: token.clone(), identity: who.into(), now: 40 };
    assert_eq!(s.stringcup().release_rendezvous(release("sc-x")).await.unwrap(), None);
    assert_eq!(s.stringcup().release_rendezvous(release("sc-r")).await.unwrap(), Some(Role::Responder));
    assert_eq!(s.stringcup().rendezvous(&token, 41).await.unwrap().unwrap().version, 3);
    assert_eq!(s.stringcup().release_rendezvous(release("sc-i")).await.unwrap(), Some(Role::Initiator));
    assert!(s.stringcup().rendezvous(&token, 42).await.unwrap().is_none(), "nobody left: the meeting is over");
}

async fn stringcup_sweep_reclaims_expired_tokens_old_keys_and_expired_rendezvous(b: &Backend) {
    let s = &b.store;
    sc_identities(s, &["sc-old", "sc-b"]).await;
    s.stringcup().touch("sc-b", 900).await.unwrap();
    // Mail to the old identity goes with it; mail it sent stays deliverable.
    sc_send_one(s, "sc-b", "sc-old", b"to old", sc::ROOMY).await;
    sc_send_one(s, "sc-old", "sc-b", b"from old", sc::ROOMY).await;
    let keyed = sc::send("sc-b", Some("k"), vec![sc::message("sc-b", b"self")], sc::ROOMY, 50);
    s.stringcup().send(keyed).await.unwrap();
    let open = |token: &[u8], expires_ms| OpenRendezvous {
        token_hash: token.to_vec(),
        identity: "sc-b".into(),
        now: 1,
        expires_ms,
    };
    s.stringcup().open_rendezvous(open(b"gone", 500)).await.unwrap();
    s.stringcup().open_rendezvous(open(b"live", 5000)).await.unwrap();
    // Both tokens authenticate (and a backend that caches them has them cached) before the sweep.
    assert!(s.stringcup().by_token(b"token-of-sc-old").await.unwrap().is_some());
    assert!(s.stringcup().by_token(b"token-of-sc-b").await.unwrap().is_some());
    let report =
        s.stringcup().sweep(Sweep { now: 1000, tokens_unused_since: 100, idempotency_before: 100 }).await.unwrap();
    assert_eq!(report, ScSweepReport { identities: 1, idempotency_keys: 1, rendezvous: 1 });
    assert!(s.stringcup().identity("sc-old").await.unwrap().is_none());
    assert!(s.stringcup().by_token(b"token-of-sc-old").await.unwrap().is_none(), "a reclaimed token is refused");
    assert_eq!(s.stringcup().by_token(b"token-of-sc-b").await.unwrap().unwrap().token_last_used_ms, 900);
    assert!(s.stringcup().inbox("sc-old", 0, 10).await.unwrap().is_empty());
    let kept: Vec<String> = s.stringcup().inbox("sc-b", 0, 10).await.unwrap().into_iter().map(|m| m.sender).collect();
    assert_eq!(kept, vec!["sc-old", "sc-b"]);
    assert!(s.stringcup().rendezvous(b"gone", 1000).await.unwrap().is_none());
    assert!(s.stringcup().rendezvous(b"live", 1000).await.unwrap().is_some());
    // The forgotten key stores anew.
    let again = sc::send("sc-b", Some("k"), vec![sc::message("sc-b", b"self")], sc::ROOMY, 1100);
    assert!(matches!(s.stringcup().send(again).await.unwrap()[0], SendOutcome::Stored { .. }));
}

async fn stringcup_a_committed_send_wakes_the_inbox_and_counts_follow(b: &Backend) {
    let s = &b.store;
    sc_identities(s, &["sc-a", "sc-b"]).await;
    let mut inbox = b.hub.subscribe(&inbox_key("sc-b"));
    sc_send_one(s, "sc-a", "sc-b", b"x", sc::ROOMY).await;
    tokio::time::timeout(Duration::from_secs(5), inbox.changed()).await.unwrap().unwrap();
    assert_eq!(*inbox.borrow_and_update(), 1);
    sc_send_one(s, "sc-b", "sc-a", b"y", sc::ROOMY).await;
    s.stringcup().ack("sc-b", vec![1]).await.unwrap();
    s.stringcup()
        .create_topic(CreateTopic {
            id: "tp-cccccccccccccccccccccccc".into(),
            owner: "sc-a".into(),
            members: vec![],
            max_members: 5,
            now: 1,
        })
        .await
        .unwrap();
    let counts = s.stringcup().counts().await.unwrap();
    assert_eq!(counts, Counts { identities: 2, topics: 1, messages_pending: 1, messages_stored: 2 });
}

// ---- Agent Mail 1.0 ----------------------------------------------------------------------------

mod am {
    use std::sync::Arc;

    use ed25519_dalek::SigningKey;
    use relay_lite::PublicOrigins;
    use switchboard_core::protocol::agent_identity::{AgentId, Origin};
    use switchboard_core::protocol::agent_mail::card::CardPayload;
    use switchboard_core::protocol::agent_mail::packet::{SealRequest, seal};
    use switchboard_core::protocol::agent_mail::{DAY_MS, Id16, MailboxCard, Message, Packet, Part};
    use switchboard_core::util::SeededRng;
    use x25519_dalek::{PublicKey, StaticSecret};

    /// The clock of these scenarios (ms).
    pub const T0: i64 = 1_800_000_000_000;
    pub const MAILBOX: Id16 = Id16([7; 16]);

    pub fn origin() -> Origin {
        Origin::parse("https://relay.test").unwrap()
    }

    pub fn origins() -> Arc<PublicOrigins> {
        Arc::new(PublicOrigins::parse(&["https://relay.test"]).unwrap())
    }

    pub fn owner() -> SigningKey {
        SigningKey::from_bytes(&[0xb0; 32])
    }

    pub fn sender() -> SigningKey {
        SigningKey::from_bytes(&[0xa1; 32])
    }

    pub fn card(owner: &SigningKey, created_at: i64, nonce: u64) -> MailboxCard {
        MailboxCard::sign(
            owner,
            created_at,
            nonce,
            CardPayload {
                mailbox_id: MAILBOX,
                expires_at: T0 + DAY_MS,
                receive_until: T0 + 2 * DAY_MS,
                public_key: PublicKey::from(&StaticSecret::from([0xb1; 32])).to_bytes(),
                routes: vec![origin()],
                max_packet_bytes: 65536,
            },
        )
        .unwrap()
    }

    /// A packet from `from` to `card`'s mailbox, expiring `ttl` after T0.
    pub fn packet(card: &MailboxCard, from: &SigningKey, nonce: u64, text: &str, ttl: i64) -> Packet {
        let mut rng = SeededRng::new([nonce as u8; 32]);
        let message = Message::new(&mut rng, AgentId::of(from), *card.owner(), T0, T0 + ttl, vec![Part::text(text)]);
        let req = SealRequest { sender: from, card, message: &message, created_at: T0, nonce };
        seal(&req, T0, &mut rng).unwrap()
    }
}

const AM_ROOMY: Quota = Quota { packets: 100, bytes: 1 << 24 };

async fn am_published(s: &Store) -> switchboard_core::protocol::agent_mail::MailboxCard {
    let card = am::card(&am::owner(), am::T0, 1);
    let out = s.am_publish(card.clone(), am::origin(), am::T0).await.unwrap().unwrap();
    assert!(!out.resubmission);
    card
}

async fn am_deliver(s: &Store, packet: &Packet, quota: Quota, now: i64) -> Decided<DeliveryResult> {
    s.am_deliver(packet.clone(), am::MAILBOX, am::origins(), quota, now).await.unwrap()
}

async fn agent_mail_a_card_binds_its_mailbox_to_its_owner_and_nonces_only_grow(b: &Backend) {
    let s = &b.store;
    assert!(s.am_card(&am::MAILBOX).await.unwrap().is_none());
    let card = am_published(s).await;
    let again = s.am_publish(card.clone(), am::origin(), am::T0 + 1000).await.unwrap().unwrap();
    assert!(again.resubmission);
    assert_eq!(again.current.accepted_at, am::T0, "a resubmission answers the first acceptance");
    let thief = am::card(&SigningKey::from_bytes(&[0x66; 32]), am::T0, 5);
    let refused = s.am_publish(thief, am::origin(), am::T0).await.unwrap();
    assert_eq!(refused, Err(Refusal::Relay(RelayError::MailboxConflict)));
    let older = s.am_publish(am::card(&am::owner(), am::T0 + 1, 1), am::origin(), am::T0 + 2).await.unwrap();
    assert!(matches!(older, Err(Refusal::Relay(RelayError::NotAboveCurrent { current: 1 }))), "{older:?}");
    let newer = am::card(&am::owner(), am::T0 + 10, 2);
    assert!(!s.am_publish(newer.clone(), am::origin(), am::T0 + 20).await.unwrap().unwrap().resubmission);
    let current = s.am_card(&am::MAILBOX).await.unwrap().unwrap();
    assert_eq!((current.card.hash(), current.accepted_at), (newer.hash(), am::T0 + 20));
}

async fn agent_mail_a_packet_is_stored_once_and_a_retry_answers_its_first_acceptance(b: &Backend) {
    let s = &b.store;
    let card = am_published(s).await;
    let first = am::packet(&card, &am::sender(), 1, "one", DAY_MS / 2);
    // Ten deliveries of one packet at once: one row.
    let tries = (0..10).map(|i| {
        let (store, packet) = (b.store.clone(), first.clone());
        tokio::spawn(async move { am_deliver(&store, &packet, AM_ROOMY, am::T0 + 100 + i).await })
    });
    let mut accepted = Vec::new();
    for t in tries.collect::<Vec<_>>() {
        accepted.push(t.await.unwrap().unwrap().accepted_at);
    }
    accepted.dedup();
    assert_eq!(accepted.len(), 1, "every answer names the one acceptance: {accepted:?}");
    for (n, text) in [(2, "two"), (3, "three")] {
        am_deliver(s, &am::packet(&card, &am::sender(), n, text, DAY_MS / 2), AM_ROOMY, am::T0 + 200).await.unwrap();
    }
    let all = s.am_list(&am::MAILBOX, 0, 10, am::T0 + 300).await.unwrap();
    assert_eq!(all.iter().map(|p| p.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(all[0].body, first.to_jcs());
    let after = s.am_list(&am::MAILBOX, 1, 1, am::T0 + 300).await.unwrap();
    assert_eq!(after.iter().map(|p| p.seq).collect::<Vec<_>>(), vec![2]);
    // A packet for a mailbox with no card.
    let elsewhere = s.am_deliver(first.clone(), Id16([8; 16]), am::origins(), AM_ROOMY, am::T0).await.unwrap();
    assert!(elsewhere.is_err());
}

async fn agent_mail_a_deleted_packet_leaves_a_tombstone_that_still_answers_a_retry(b: &Backend) {
    let s = &b.store;
    let card = am_published(s).await;
    let packet = am::packet(&card, &am::sender(), 1, "one", DAY_MS / 2);
    let accepted = am_deliver(s, &packet, AM_ROOMY, am::T0 + 100).await.unwrap();
    s.am_delete(am::MAILBOX, accepted.packet_id).await.unwrap();
    s.am_delete(am::MAILBOX, accepted.packet_id).await.unwrap();
    assert!(s.am_list(&am::MAILBOX, 0, 10, am::T0 + 200).await.unwrap().is_empty());
    let retry = am_deliver(s, &packet, AM_ROOMY, am::T0 + 300).await.unwrap();
    assert_eq!(retry, accepted, "the tombstone answers the retry; nothing is stored again");
    assert!(s.am_list(&am::MAILBOX, 0, 10, am::T0 + 400).await.unwrap().is_empty());
    let next = am::packet(&card, &am::sender(), 2, "two", DAY_MS / 2);
    am_deliver(s, &next, AM_ROOMY, am::T0 + 500).await.unwrap();
    assert_eq!(s.am_list(&am::MAILBOX, 0, 10, am::T0 + 600).await.unwrap()[0].seq, 2, "seqs are never reused");
}

async fn agent_mail_the_quota_refuses_exactly_at_its_boundary_and_a_delete_frees_room(b: &Backend) {
    let s = &b.store;
    let card = am_published(s).await;
    let packets: Vec<Packet> = (1..=4).map(|n| am::packet(&card, &am::sender(), n, "same size", DAY_MS / 2)).collect();
    let two = Quota { packets: 2, bytes: 1 << 24 };
    let first = am_deliver(s, &packets[0], two, am::T0 + 1).await.unwrap();
    am_deliver(s, &packets[1], two, am::T0 + 2).await.unwrap();
    assert_eq!(am_deliver(s, &packets[2], two, am::T0 + 3).await, Err(Refusal::Quota));
    // A retry of a stored packet is not a new packet: answered, not refused.
    assert_eq!(am_deliver(s, &packets[0], two, am::T0 + 4).await.unwrap(), first);
    s.am_delete(am::MAILBOX, first.packet_id).await.unwrap();
    am_deliver(s, &packets[2], two, am::T0 + 5).await.unwrap();
    // Bytes: exactly the stored bytes plus the new packet's fits; one byte less does not.
    let stored = (packets[1].size() + packets[2].size()) as i64;
    let total = stored + packets[3].size() as i64;
    let tight = Quota { packets: 10, bytes: total - 1 };
    assert_eq!(am_deliver(s, &packets[3], tight, am::T0 + 7).await, Err(Refusal::Quota));
    am_deliver(s, &packets[3], Quota { packets: 10, bytes: total }, am::T0 + 8).await.unwrap();
}

async fn agent_mail_a_blocked_sender_is_refused_until_unblocked(b: &Backend) {
    let s = &b.store;
    let card = am_published(s).await;
    let sender = AgentId::of(&am::sender());
    s.am_block(am::MAILBOX, sender, true).await.unwrap();
    s.am_block(am::MAILBOX, sender, true).await.unwrap();
    let packet = am::packet(&card, &am::sender(), 1, "hi", DAY_MS / 2);
    assert_eq!(am_deliver(s, &packet, AM_ROOMY, am::T0 + 1).await, Err(Refusal::Relay(RelayError::PermissionDenied)));
    s.am_block(am::MAILBOX, sender, false).await.unwrap();
    am_deliver(s, &packet, AM_ROOMY, am::T0 + 2).await.unwrap();
}

async fn agent_mail_sweep_reclaims_expired_packets_and_tombstones_then_the_mailbox(b: &Backend) {
    let s = &b.store;
    let card = am_published(s).await;
    let short = am::packet(&card, &am::sender(), 1, "short", 1000);
    let deleted = am::packet(&card, &am::sender(), 2, "deleted", 1000);
    let long = am::packet(&card, &am::sender(), 3, "long", DAY_MS / 2);
    for p in [&short, &deleted, &long] {
        am_deliver(s, p, AM_ROOMY, am::T0 + 1).await.unwrap();
    }
    s.am_delete(am::MAILBOX, deleted.id()).await.unwrap();
    // Nothing has expired yet; the nonce entry (valid for two windows) has not either.
    assert_eq!(s.am_sweep(am::T0 + 500).await.unwrap(), AmSweepReport::default());
    let report = s.am_sweep(am::T0 + 2000).await.unwrap();
    assert_eq!((report.packets, report.mailboxes), (2, 0), "the short one and the tombstone");
    assert_eq!(report.nonces, 0, "the nonce entry lives two live-write windows");
    // The counters moved with the sweep: a quota of two holds the long one and one more.
    let two = Quota { packets: 2, bytes: 1 << 24 };
    am_deliver(s, &am::packet(&card, &am::sender(), 4, "four", DAY_MS / 2), two, am::T0 + 3000).await.unwrap();
    assert_eq!(
        am_deliver(s, &am::packet(&card, &am::sender(), 5, "five", DAY_MS / 2), two, am::T0 + 3001).await,
        Err(Refusal::Quota)
    );
    // Past the card's receive_until the mailbox is forgotten, and may be bound anew.
    let report = s.am_sweep(am::T0 + 2 * DAY_MS).await.unwrap();
    assert_eq!((report.mailboxes, report.nonces), (1, 1));
    assert!(s.am_card(&am::MAILBOX).await.unwrap().is_none());
    assert!(s.am_list(&am::MAILBOX, 0, 10, am::T0).await.unwrap().is_empty());
}

/// One Stringcup idempotency key sent through two instances at once: one message, and both
/// answers name the same `sent_seq`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_one_idempotency_key_through_two_instances_stores_one_message() {
    let Some((a, b)) = two_pg_instances().await else { return };
    sc_identities(&a, &["sc-a", "sc-b"]).await;
    for round in 0..20 {
        let key = format!("key-{round}");
        let send = |s: Arc<Store>| {
            let req = sc::send("sc-a", Some(&key), vec![sc::message("sc-b", b"once")], sc::ROOMY, 10);
            tokio::spawn(async move { s.stringcup().send(req).await.unwrap() })
        };
        let (ra, rb) = (send(a.clone()), send(b.clone()));
        let answers = [ra.await.unwrap(), rb.await.unwrap()];
        let seqs: Vec<i64> = answers
            .iter()
            .map(|o| match o.as_slice() {
                [SendOutcome::Stored { sent_seq, .. } | SendOutcome::Replay { sent_seq }] => *sent_seq,
                other => panic!("round {round}: {other:?}"),
            })
            .collect();
        assert_eq!(seqs[0], seqs[1], "round {round}: {answers:?}");
        let stored = answers.iter().filter(|o| matches!(o[0], SendOutcome::Stored { .. })).count();
        assert_eq!(stored, 1, "round {round}: {answers:?}");
    }
    assert_eq!(b.stringcup().inbox("sc-b", 0, 100).await.unwrap().len(), 20, "one row per key");
    a.close().await;
    b.close().await;
}

/// One Agent Mail packet delivered through two instances at once is stored once, and both
/// answers name the one acceptance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_one_packet_through_two_instances_is_stored_once() {
    let Some((a, b)) = two_pg_instances().await else { return };
    let card = am_published(&a).await;
    for n in 1..=10u64 {
        let packet = am::packet(&card, &am::sender(), n, "once", DAY_MS / 2);
        let deliver = |s: Arc<Store>, at: i64| {
            let packet = packet.clone();
            tokio::spawn(async move { am_deliver(&s, &packet, AM_ROOMY, at).await.unwrap() })
        };
        let (ra, rb) = (deliver(a.clone(), am::T0 + 10), deliver(b.clone(), am::T0 + 20));
        assert_eq!(ra.await.unwrap(), rb.await.unwrap(), "packet {n}");
    }
    let listed = b.am_list(&am::MAILBOX, 0, 100, am::T0 + 30).await.unwrap();
    assert_eq!(listed.iter().map(|p| p.seq).collect::<Vec<_>>(), (1..=10).collect::<Vec<_>>());
    a.close().await;
    b.close().await;
}

/// The Stringcup and Agent Mail sweeps of two instances at once: each removes what is expired
/// exactly once between them (one holds the family's sweep lock; the other skips or finds
/// nothing left), and the quota counters are lowered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_two_instances_sweeping_at_once_remove_everything_once() {
    let Some((a, b)) = two_pg_instances().await else { return };
    let ids: Vec<String> = (0..10).map(|i| format!("sc-old-{i}")).collect();
    sc_identities(&a, &ids.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let card = am_published(&a).await;
    for n in 1..=6 {
        am_deliver(&a, &am::packet(&card, &am::sender(), n, "short", 1000), AM_ROOMY, am::T0 + 1).await.unwrap();
    }
    let sc_sweep = |s: Arc<Store>| {
        let req = Sweep { now: 1000, tokens_unused_since: 100, idempotency_before: 0 };
        tokio::spawn(async move { s.stringcup().sweep(req).await.unwrap() })
    };
    let am_sweep = |s: Arc<Store>| tokio::spawn(async move { s.am_sweep(am::T0 + 2000).await.unwrap() });
    let (sa, sb, ma, mb) = (sc_sweep(a.clone()), sc_sweep(b.clone()), am_sweep(a.clone()), am_sweep(b.clone()));
    let (sa, sb, ma, mb) = (sa.await.unwrap(), sb.await.unwrap(), ma.await.unwrap(), mb.await.unwrap());
    assert_eq!(sa.identities + sb.identities, 10, "{sa:?} {sb:?}");
    assert_eq!(ma.packets + mb.packets, 6, "{ma:?} {mb:?}");
    // Counters lowered once: a quota of one holds exactly one new packet.
    let one = Quota { packets: 1, bytes: 1 << 24 };
    am_deliver(&b, &am::packet(&card, &am::sender(), 7, "new", DAY_MS / 2), one, am::T0 + 3000).await.unwrap();
    let over = am_deliver(&b, &am::packet(&card, &am::sender(), 8, "over", DAY_MS / 2), one, am::T0 + 3001).await;
    assert_eq!(over, Err(Refusal::Quota));
    a.close().await;
    b.close().await;
}

/// letagents on two PostgreSQL instances: deposits through both into shared mailboxes, acks
/// through one and the retention sweep through the other, all at once. Every deposit is stored
/// under a seq of its own, and afterwards each mailbox's `waiting` counter (kept by the triggers
/// of `migrations-pg/0006`, which the sweep's and the acks' deletes fire too) equals the
/// envelopes really waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_the_waiting_counters_stay_exact_under_two_instances_depositing_acking_and_sweeping() {
    let Some((a, b)) = two_pg_instances().await else { return };
    let mailboxes = ["m0", "m1", "m2", "m3"];
    for m in mailboxes {
        assert_eq!(a.login(m, "drop", 1, 1).await.unwrap(), LoginOutcome::Created);
    }
    let body = || Bytes::from_static(b"LA1 envelope");
    // Old envelopes for the sweep: received at 100, expired before 1,000.
    for i in 0..40 {
        let stored = a.deposit(mailboxes[i % 4], "drop", body(), 1 << 20, 100).await.unwrap();
        assert!(matches!(stored, DepositOutcome::Stored { .. }), "{stored:?}");
    }
    let deposits = |s: Arc<Store>, first: usize| {
        tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in first..first + 60 {
                let m = mailboxes[i % 4];
                match s.deposit(m, "drop", body(), 1 << 20, 5000).await.unwrap() {
                    DepositOutcome::Stored { seq } => seqs.push((m, seq)),
                    other => panic!("deposit refused: {other:?}"),
                }
            }
            seqs
        })
    };
    let (da, db) = (deposits(a.clone(), 0), deposits(b.clone(), 1));
    let sweeper = {
        let b = b.clone();
        tokio::spawn(async move {
            let mut expired = 0;
            for _ in 0..5 {
                expired += b.sweep(5000, 1000, 0).await.unwrap().expired;
            }
            expired
        })
    };
    // Acks through A, while the deposits run, of every m0 seq the new deposits take (11 to 40;
    // the old ones have 1 to 10): whatever each pass deletes is counted down.
    let acker = {
        let a = a.clone();
        tokio::spawn(async move {
            let mut acked = 0;
            for _ in 0..20 {
                acked += a.ack("m0", (11..=40).collect(), 5000).await.unwrap().len();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            acked
        })
    };
    let (sa, sb, expired, acked) = (da.await.unwrap(), db.await.unwrap(), sweeper.await.unwrap(), acker.await.unwrap());
    assert_eq!(expired, 40, "the sweep removed every old envelope once");
    let mut all: Vec<(&str, i64)> = sa.into_iter().chain(sb).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 120, "two deposits got one seq");
    let mut waiting_total = 0;
    for m in mailboxes {
        let really = a.waiting(m, 0, 10_000).await.unwrap().len() as i64;
        assert_eq!(a.waiting_count(m).await.unwrap(), really, "{m}'s counter drifted");
        assert_eq!(b.waiting_count(m).await.unwrap(), really);
        waiting_total += really;
    }
    assert_eq!(waiting_total, 120 - i64::try_from(acked).unwrap());
    a.close().await;
    b.close().await;
}
