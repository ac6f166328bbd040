//! Agent deliveries are handed out under a lease: an adapter that dies after `wait` returned but
//! before its harness had the messages loses nothing (they come again, marked redelivered, once
//! the lease expires), while one that acks never sees a message twice.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::SqlitePool;
use switchboard_core::api::Request;
use switchboard_core::engine::LEASE_MS;
use switchboard_tests::{
    DaemonProcess, Peer, TestRelay, befriend, befriend_cli, bridge_of, bridge_rpc, home, open_session, profile_db,
};

async fn pair() -> (TestRelay, Peer, Peer) {
    let relay = TestRelay::start().await;
    let alice = Peer::live("alice", &relay.url()).await;
    let bob = Peer::live("bob", &relay.url()).await;
    befriend(&alice, &bob).await;
    (relay, alice, bob)
}

/// Makes every lease in the database `ms` older: the clock moves on for leases only.
async fn age_leases(pool: &SqlitePool, ms: i64) {
    sqlx::query("UPDATE agent_deliveries SET leased_at = leased_at - ? WHERE state = 'handed'")
        .bind(ms)
        .execute(pool)
        .await
        .unwrap();
}

async fn state_of(pool: &SqlitePool, agent: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT state FROM agent_deliveries WHERE agent = ? AND mode != 'none' ORDER BY message")
        .bind(agent)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn wait_as(peer: &Peer, agent: &str, secs: u64) -> Value {
    peer.as_agent(agent, Request::Wait { agent: None, timeout_secs: secs, paused_seen: None }).await.unwrap()
}

async fn ack_as(peer: &Peer, agent: &str, lease: &Value) -> Result<Value, String> {
    peer.as_agent(agent, Request::Ack { lease: lease.as_str().unwrap().into(), ids: None }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacked_lease_is_handed_out_again_marked_redelivered() {
    let (_relay, alice, bob) = pair().await;
    alice.open_session("planner").await;
    bob.open_session("coder").await;
    alice.agent_send("planner", "bob", "first", "send", None, Some("coder")).await.unwrap();

    // The adapter takes the message and dies before its harness has it: no ack.
    let first = wait_as(&bob, "coder", 10).await;
    let got = first["deliveries"].as_array().unwrap();
    assert_eq!(got.len(), 1, "{first}");
    assert_eq!(got[0]["redelivered"], false);
    let id = got[0]["id"].clone();
    assert!(first["lease"].as_str().is_some_and(|l| !l.is_empty()), "{first}");

    // Within the lease it is not handed out twice, and not counted unread.
    let again = wait_as(&bob, "coder", 0).await;
    assert!(again["deliveries"].as_array().unwrap().is_empty(), "{again}");
    assert_eq!(again["lease"], Value::Null);
    assert_eq!(again["unread"], 0);
    assert_eq!(state_of(&bob.rt.store().pool, "coder").await, ["handed"]);

    // Once the lease expires it is unread again and the next wait hands it out, marked.
    age_leases(&bob.rt.store().pool, LEASE_MS).await;
    let unread = bob.as_agent("coder", Request::Unread { agent: None }).await.unwrap();
    assert_eq!(unread["unread"], 1);
    let second = wait_as(&bob, "coder", 0).await;
    let got = second["deliveries"].as_array().unwrap();
    assert_eq!(got.len(), 1, "{second}");
    assert_eq!(got[0]["id"], id);
    assert_eq!(got[0]["redelivered"], true);
    assert_ne!(second["lease"], first["lease"], "a new lease");

    // The stale lease acks nothing; the new one delivers the message, for good.
    assert_eq!(ack_as(&bob, "coder", &first["lease"]).await.unwrap()["acked"], 0);
    assert_eq!(ack_as(&bob, "coder", &second["lease"]).await.unwrap()["acked"], 1);
    assert_eq!(state_of(&bob.rt.store().pool, "coder").await, ["delivered"]);
    age_leases(&bob.rt.store().pool, 10 * LEASE_MS).await;
    assert!(wait_as(&bob, "coder", 0).await["deliveries"].as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_agent_wakes_when_a_lease_expires() {
    let (_relay, alice, bob) = pair().await;
    alice.open_session("planner").await;
    bob.open_session("coder").await;
    alice.agent_send("planner", "bob", "lost once", "send", None, Some("coder")).await.unwrap();
    let first = wait_as(&bob, "coder", 10).await;
    assert_eq!(first["deliveries"].as_array().unwrap().len(), 1, "{first}");

    // The lease has 1.5 s left: a long-poll started now returns when it runs out, not at its end.
    age_leases(&bob.rt.store().pool, LEASE_MS - 1_500).await;
    let started = Instant::now();
    let second = wait_as(&bob, "coder", 30).await;
    let took = started.elapsed();
    let got = second["deliveries"].as_array().unwrap();
    assert_eq!(got.len(), 1, "{second}");
    assert_eq!(got[0]["redelivered"], true);
    assert!(took >= Duration::from_millis(1_000) && took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acked_lease_never_comes_again() {
    let (_relay, alice, bob) = pair().await;
    alice.open_session("planner").await;
    bob.open_session("coder").await;
    for text in ["one", "two"] {
        alice.agent_send("planner", "bob", text, "send", None, Some("coder")).await.unwrap();
    }
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let v = wait_as(&bob, "coder", 10).await;
        let got = v["deliveries"].as_array().unwrap();
        assert!(!got.is_empty(), "both messages arrive: {v}");
        assert!(got.iter().all(|d| d["redelivered"] == false));
        seen.extend(got.iter().map(|d| d["id"].clone()));
        assert_eq!(ack_as(&bob, "coder", &v["lease"]).await.unwrap()["acked"], got.len());
    }
    // Long past any lease, nothing comes again, nothing is unread, and a second ack is a no-op.
    age_leases(&bob.rt.store().pool, 10 * LEASE_MS).await;
    let v = wait_as(&bob, "coder", 1).await;
    assert!(v["deliveries"].as_array().unwrap().is_empty(), "{v}");
    assert_eq!(v["unread"], 0);
    assert_eq!(state_of(&bob.rt.store().pool, "coder").await, ["delivered", "delivered"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acking_another_agents_lease_is_refused() {
    let (_relay, alice, bob) = pair().await;
    alice.open_session("planner").await;
    bob.open_session("coder").await;
    bob.open_session("reviewer").await;
    alice.agent_send("planner", "bob", "for coder", "send", None, Some("coder")).await.unwrap();
    let v = wait_as(&bob, "coder", 10).await;
    assert_eq!(v["deliveries"].as_array().unwrap().len(), 1, "{v}");

    assert_eq!(ack_as(&bob, "reviewer", &v["lease"]).await.unwrap_err(), "forbidden");
    assert_eq!(state_of(&bob.rt.store().pool, "coder").await, ["handed"], "the refused ack changed nothing");

    // The owner may ack any lease.
    let acked = bob.call(Request::Ack { lease: v["lease"].as_str().unwrap().into(), ids: None }).await;
    assert_eq!(acked["acked"], 1);
    assert_eq!(acked["agent"], "coder");
    assert_eq!(state_of(&bob.rt.store().pool, "coder").await, ["delivered"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acking_some_ids_of_a_lease_leaves_the_rest_to_come_again() {
    let (_relay, alice, bob) = pair().await;
    alice.open_session("planner").await;
    bob.open_session("coder").await;
    for text in ["one", "two"] {
        alice.agent_send("planner", "bob", text, "send", None, Some("coder")).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while bob.as_agent("coder", Request::Unread { agent: None }).await.unwrap()["unread"] != 2 {
        assert!(Instant::now() < deadline, "both messages arrive");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v = wait_as(&bob, "coder", 10).await;
    let got = v["deliveries"].as_array().unwrap();
    assert_eq!(got.len(), 2, "{v}");
    let first = got[0]["id"].as_str().unwrap().to_owned();
    let lease = v["lease"].as_str().unwrap().to_owned();
    let acked = bob.as_agent("coder", Request::Ack { lease, ids: Some(vec![first.clone()]) }).await.unwrap();
    assert_eq!(acked["acked"], 1);
    age_leases(&bob.rt.store().pool, LEASE_MS).await;
    let again = wait_as(&bob, "coder", 0).await;
    let again = again["deliveries"].as_array().unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0]["id"], got[1]["id"]);
    assert_eq!(again[0]["redelivered"], true);
}

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

/// The real adapters over a running daemon: a bridge `wait` that is never acked (an adapter killed
/// before its harness had the messages) comes again marked redelivered; `listen` and the hook ack
/// once they have printed, so what they printed is delivered for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_bridge_an_unacked_wait_comes_again_and_listen_and_hooks_ack() {
    let relay = TestRelay::start().await;
    let (_a, alice) = home();
    let (_b, bob) = home();
    befriend_cli(&bin(), &alice, &bob, &relay.url());
    let daemon = DaemonProcess::start(&bin(), &bob);
    let (url, _, owner) = bridge_of(&bob);
    let http = reqwest::Client::new();
    let coder = open_session(&http, &url, &owner, "coder").await;
    let db = profile_db(&bob).await;

    let (ok, _, err) = switchboard_tests::switchboard(&bin(), &alice, &["send", "bob", "one", "--to-agent", "coder"]);
    assert!(ok, "{err}");
    let first = bridge_rpc(&url, &coder, &json!({"op": "wait", "timeout_secs": 30})).await;
    let got = first["deliveries"].as_array().unwrap();
    assert_eq!(got.len(), 1, "{first}");
    let id = got[0]["id"].clone();
    // The adapter dies here. Its lease expires; `listen` (a fresh adapter) prints the message again.
    age_leases(&db, LEASE_MS).await;
    let out = std::process::Command::new(bin())
        .args(["--home", bob.to_str().unwrap(), "listen", "--agent", "coder", "--once", "--timeout", "10"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert_eq!(lines[0]["id"], id);
    assert_eq!(lines[0]["redelivered"], true);
    assert_eq!(state_of(&db, "coder").await, ["delivered"], "listen acked after printing");

    // The PostToolUse hook acks what it printed too.
    let (ok, _, err) = switchboard_tests::switchboard(&bin(), &alice, &["send", "bob", "two", "--to-agent", "coder"]);
    assert!(ok, "{err}");
    let mut printed = String::new();
    for _ in 0..100 {
        let (ok, out, err) =
            switchboard_tests::switchboard(&bin(), &bob, &["hook", "--agent", "coder", "post-tool-use"]);
        assert!(ok, "{err}");
        if !out.trim().is_empty() {
            printed = out;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(printed.contains("\\ntwo\\n"), "{printed}");
    assert_eq!(state_of(&db, "coder").await, ["delivered", "delivered"], "the hook acked after printing");
    age_leases(&db, 10 * LEASE_MS).await;
    let last = bridge_rpc(&url, &coder, &json!({"op": "wait", "timeout_secs": 0})).await;
    assert!(last["deliveries"].as_array().unwrap().is_empty(), "{last}");
    db.close().await;
    drop(daemon);
}
