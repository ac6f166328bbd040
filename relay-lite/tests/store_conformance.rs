//! The store conformance suite, written once and run on every backend that serves a family:
//! SQLite (always) and PostgreSQL (a real server, see `pg_common`). Each scenario is a plain
//! async fn over the [`Store`] handle the routes use; the `conformance!` macro makes one test per
//! scenario per backend (`on_sqlite::…`, `on_postgres::…`).
//!
//! Covered: every letagents and letmeknow store operation (the families the PostgreSQL backend
//! serves), the epoch compare-and-set, per-key sequence counters, capacity, replayed logins,
//! invite state, sweeps, and the wake-ups a commit publishes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod pg_common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use relay_lite::hub::Hub;
use relay_lite::store::letmeknow::{InviteOutcome, PostOutcome, group_key, invite_key};
use relay_lite::store::{DepositOutcome, LoginOutcome, Store};
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

/// Two instances post a commit at one epoch at once: one wins, the other sees the new epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_commits_at_one_epoch_through_two_instances_exactly_one_wins() {
    let Some(cluster) = pg_common::cluster() else { return };
    let url = cluster.fresh_database().await;
    let a = Arc::new(Store::open_postgres(&url, Arc::new(Hub::default())).await.unwrap());
    let b = Arc::new(Store::open_postgres(&url, Arc::new(Hub::default())).await.unwrap());
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
