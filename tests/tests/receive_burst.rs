//! A burst of envelopes waiting at a real relay-lite: the receiving runtime commits it in a few
//! transactions (not one per envelope), keeps every envelope exactly once and in order, and a
//! daemon killed with SIGKILL in the middle of the burst loses nothing it acked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
// relay_lite::Limits is non-exhaustive, so limits are raised field by field.
#![allow(clippy::field_reassign_with_default)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchboard_core::api::Request;
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::protocol::letagents::{self as la, Inner, Kind, PeerKeys};
use switchboard_core::transport::letagents::{RelayClient, SendOutcome};
use switchboard_core::util::{OsRng, b64u_decode, now_ms};
use switchboard_tests::{DaemonProcess, Peer, TestRelay, home, profile_db, switchboard_ok};

const BURST: usize = 1000;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

/// A relay that takes a thousand sends from one sender in a few seconds.
async fn roomy_relay() -> TestRelay {
    let mut limits = relay_lite::Limits::default();
    limits.sends_per_minute = 100_000;
    limits.ip_requests_per_minute = 1_000_000;
    limits.mailbox_capacity = 10_000;
    TestRelay::start_with(limits).await
}

/// The sender: a real letagents device whose keys the test holds, so it can post a thousand
/// sealed envelopes straight to the relay (the recipient's side is all real).
struct Sender {
    id: DeviceIdentity,
    relay: RelayClient,
}

impl Sender {
    async fn new(relay: &TestRelay) -> Self {
        let s = Self { id: DeviceIdentity::generate(&mut OsRng), relay: RelayClient::new(&relay.url(), None).unwrap() };
        // Log in once, so its mailbox exists for the receipts that come back.
        s.relay.inbox(&s.id.sig, &s.id.drop).await.unwrap();
        s
    }

    /// Seals `n` numbered messages to the holder of `to` (drop code `drop`) and posts them in
    /// order, one after another.
    async fn post_burst(&self, to: &PeerKeys, drop: &[u8], n: usize) {
        let base = now_ms();
        for i in 0..n {
            let inner = Inner::new(
                &self.id.keys(),
                &to.mailbox_id(),
                base + i64::try_from(i).unwrap(),
                uuid::Uuid::new_v4(),
                Kind::Send,
                json!(format!("burst {i}")),
            );
            let env = la::seal(&self.id.sig, to, &serde_json::to_string(&inner).unwrap(), &mut OsRng).unwrap();
            assert_eq!(self.relay.send(&to.mailbox_id(), drop, env).await, SendOutcome::Accepted, "post {i}");
        }
    }
}

/// The received bodies of the burst, in the order they were committed.
async fn received(pool: &sqlx::SqlitePool) -> Vec<String> {
    sqlx::query_scalar("SELECT body FROM messages WHERE direction = 'in' AND kind = 'send' ORDER BY rowid_")
        .fetch_all(pool)
        .await
        .unwrap()
}

fn expected(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("burst {i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_1000_arrives_complete_in_order_in_a_few_transactions() {
    let relay = roomy_relay().await;
    let mut bob = Peer::offline("bob", &relay.url()).await;
    bob.inbox(0).await;
    let sender = Sender::new(&relay).await;
    bob.call(Request::ContactAdd {
        address: sender.id.address().to_string(),
        name: Some("mallory".into()),
        allow: None,
        relay: None,
        no_hello: true,
    })
    .await;
    let drop = la::Address::parse(&bob.address().await).unwrap().drop.unwrap();
    sender.post_burst(&bob.rt.keys(), &drop, BURST).await;

    // Bob comes online: the websocket hands the whole backlog over at once.
    let before = bob.rt.letagents_receive_transactions();
    let started = Instant::now();
    bob.go_live();
    let pool = bob.rt.store().pool.clone();
    assert!(bob.eventually(120, || async { received(&pool).await.len() >= BURST }).await, "the burst never arrived");
    let took = started.elapsed();
    let txs = bob.rt.letagents_receive_transactions() - before;
    println!("{BURST} envelopes received in {took:?} and {txs} transactions");
    assert_eq!(received(&pool).await, expected(BURST), "incomplete, duplicated or out of order");
    assert!(txs <= 100, "{txs} transactions for {BURST} envelopes: not batched");
    // Every per-message rule still ran: each one is seen, audited and owed a receipt.
    let seen: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM seen").fetch_one(&pool).await.unwrap();
    assert!(seen >= i64::try_from(BURST).unwrap());
    let audited: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM audit WHERE direction = 'in' AND state = 'received' AND kind = 'send'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(audited, i64::try_from(BURST).unwrap());
    // Receipts (queued in the same transactions) reach the sender.
    let got_receipts = bob
        .eventually(30, || async {
            let waiting = sender.relay.inbox(&sender.id.sig, &sender.id.drop).await.unwrap();
            waiting
                .iter()
                .filter_map(|m| b64u_decode(&m.ct))
                .any(|env| la::open(&env, &sender.id.boxs, &sender.id.keys()).is_ok_and(|o| o.kind == Kind::Receipt))
        })
        .await;
    assert!(got_receipts, "no receipt came back");
}

/// Bob's profile under `home`, with the sender as an accepted contact; bob's keys and drop code.
fn bob_profile(home: &Path, relay: &str, sender: &Sender) -> (PeerKeys, Vec<u8>) {
    switchboard_ok(&bin(), home, &["init", "--name", "bob", "--relay", relay]);
    let who: Value = serde_json::from_str(&switchboard_ok(&bin(), home, &["whoami", "--json"])).unwrap();
    let address = la::Address::parse(who["letagents"]["address"].as_str().unwrap()).unwrap();
    let sender_address = sender.id.address().to_string();
    switchboard_ok(&bin(), home, &["contact", "add", &sender_address, "--name", "mallory", "--no-hello"]);
    (address.keys, address.drop.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_burst_loses_nothing_it_acked() {
    let relay = roomy_relay().await;
    let (_dir, home) = home();
    let sender = Sender::new(&relay).await;
    let (bob, drop_code) = bob_profile(&home, &relay.url(), &sender);
    sender.post_burst(&bob, &drop_code, BURST).await;

    let pool = profile_db(&home).await;
    let daemon = DaemonProcess::start(&bin(), &home);
    // Kill it (SIGKILL) as soon as a first part of the burst has committed.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut at_kill = 0;
    while Instant::now() < deadline {
        at_kill = received(&pool).await.len();
        if at_kill > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // DaemonProcess's drop is `Child::kill`: SIGKILL, then reap.
    drop(daemon);
    assert!(at_kill > 0, "nothing arrived before the kill");
    let after_kill = received(&pool).await.len();
    println!("killed with {at_kill} committed (then {after_kill})");
    assert!(after_kill < BURST, "the whole burst was in before the kill: nothing was cut");

    // Started again, it gets the rest from the relay: what it had acked is in its database, what
    // it had not is delivered again, and nothing is there twice.
    let daemon = DaemonProcess::start(&bin(), &home);
    let deadline = Instant::now() + Duration::from_secs(120);
    while received(&pool).await.len() < BURST && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    daemon.stop();
    assert_eq!(received(&pool).await, expected(BURST), "lost, duplicated or reordered across the crash");
}
