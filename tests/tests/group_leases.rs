//! letmeknow group deliveries are handed out under a lease, as 1:1 deliveries are: a session
//! whose adapter dies after `deliveries` returned but before its harness had the items loses
//! nothing (they come again, marked redelivered, once the lease expires), one that acks never
//! sees an item twice, and only acked items enter the read frontier (`after`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::SqlitePool;
use switchboard_core::api::Request;
use switchboard_core::engine::LEASE_MS;
use switchboard_tests::{
    DaemonProcess, GroupMember as Member, TestRelay, bridge_of, bridge_rpc, cli_invite, home, open_session, profile_db,
    switchboard_ok,
};

/// One profile with one group session, which is also its agent session (`handle`); every item
/// is due at once and no loop guard intervenes: these tests are about leases.
async fn member(name: &str, handle: &str, relay: &TestRelay) -> Member {
    let m = Member::new(name, handle, relay).await;
    m.policy(Some(10_000), Some(0)).await;
    m.peer.open_session(handle).await;
    m
}

/// Alice's session invites Bob's into a new group; both have read the join. Returns the group.
async fn group_of_two() -> (TestRelay, Member, Member, String) {
    let relay = TestRelay::start().await;
    let alice = member("alice", "amber-otter", &relay).await;
    let bob = member("bob", "brave-heron", &relay).await;
    let group = alice.admit(None, &bob).await;
    // The membership events are handed out and acked: from here on only the test's messages count.
    for m in [&alice, &bob] {
        m.sync(&group).await;
        let v = m.deliveries(0).await;
        if !v["lease"].is_null() {
            m.ack_as(&m.handle, &v["lease"], None).await.unwrap();
        }
    }
    (relay, alice, bob, group)
}

/// Makes every group lease in `pool` `ms` older: the clock moves on for leases only.
async fn age_leases(pool: &SqlitePool, ms: i64) {
    sqlx::query("UPDATE lmk_messages SET leased_at = leased_at - ? WHERE lease != ''")
        .bind(ms)
        .execute(pool)
        .await
        .unwrap();
}

/// (read, leased) of the row with `content` in `pool`.
async fn row_state(pool: &SqlitePool, content: &str) -> (i64, bool) {
    let (read, lease): (i64, String) = sqlx::query_as("SELECT read, lease FROM lmk_messages WHERE content = ?")
        .bind(content)
        .fetch_one(pool)
        .await
        .unwrap();
    (read, !lease.is_empty())
}

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().unwrap().clone()
}

fn contents(v: &Value) -> Vec<String> {
    items(v).iter().map(|i| i["content"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacked_group_lease_is_handed_out_again_marked_redelivered() {
    let (_relay, alice, bob, g) = group_of_two().await;
    alice.say(&g, "first").await;
    bob.sync(&g).await;

    // The adapter takes the item and dies before its harness has it: no ack.
    let first = bob.deliveries(0).await;
    assert_eq!(contents(&first), ["first"], "{first}");
    assert_eq!(items(&first)[0]["redelivered"], false);
    let lease = first["lease"].as_str().unwrap();
    assert!(lease.starts_with('G') && lease.len() > 16, "{first}");
    assert_eq!(row_state(bob.pool(), "first").await, (0, true), "handed, not read");

    // Within the lease it is not handed out twice.
    let again = bob.deliveries(0).await;
    assert!(items(&again).is_empty(), "{again}");
    assert_eq!(again["lease"], Value::Null);
    assert_eq!(again["handed"], 1);

    // Once the lease expires the next call hands it out again, marked, under a new lease.
    age_leases(bob.pool(), LEASE_MS).await;
    let second = bob.deliveries(0).await;
    assert_eq!(contents(&second), ["first"], "{second}");
    assert_eq!(items(&second)[0]["redelivered"], true);
    assert_eq!(items(&second)[0]["id"], items(&first)[0]["id"]);
    assert_ne!(second["lease"], first["lease"]);

    // The stale lease acks nothing; the new one makes it read, for good.
    assert_eq!(bob.ack_as(&bob.handle, &first["lease"], None).await.unwrap()["acked"], 0);
    assert_eq!(bob.ack_as(&bob.handle, &second["lease"], None).await.unwrap()["acked"], 1);
    assert_eq!(row_state(bob.pool(), "first").await.0, 1);
    age_leases(bob.pool(), 10 * LEASE_MS).await;
    assert!(items(&bob.deliveries(0).await).is_empty());
}

/// Several callers at once for one session's rows: each row goes out under one lease only, and
/// rows that come again after their lease ran out come together under one new lease, marked.
/// (The statement's own check against a stale view is tested deterministically in
/// `store::groups::log::tests::a_lease_takes_only_free_rows_and_says_which`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_at_once_never_hand_out_a_group_row_twice() {
    let (_relay, alice, bob, g) = group_of_two().await;
    let said: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
    for text in &said {
        alice.say(&g, text).await;
    }
    bob.sync(&g).await;
    let (a, b, c, d) = tokio::join!(bob.deliveries(0), bob.deliveries(0), bob.deliveries(0), bob.deliveries(0));
    let mut got: Vec<String> = [&a, &b, &c, &d].iter().flat_map(|v| contents(v)).collect();
    got.sort();
    assert_eq!(got, said, "each row once: {a} {b} {c} {d}");
    let leases: Vec<&Value> = [&a, &b, &c, &d].into_iter().map(|v| &v["lease"]).filter(|l| !l.is_null()).collect();
    for v in [&a, &b, &c, &d] {
        assert!(items(v).iter().all(|i| i["redelivered"] == false), "{v}");
    }
    // Run out, the rows come again together under one new lease, marked.
    age_leases(bob.pool(), LEASE_MS).await;
    let again = bob.deliveries(0).await;
    let mut back = contents(&again);
    back.sort();
    assert_eq!(back, said, "{again}");
    assert!(items(&again).iter().all(|i| i["redelivered"] == true), "{again}");
    assert!(leases.iter().all(|l| **l != again["lease"]));
    assert_eq!(bob.ack_as(&bob.handle, &again["lease"], None).await.unwrap()["acked"], 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_session_wakes_when_a_group_lease_expires() {
    let (_relay, alice, bob, g) = group_of_two().await;
    alice.say(&g, "lost once").await;
    let first = bob.deliveries(10).await;
    assert_eq!(contents(&first), ["lost once"], "{first}");

    // The lease has 1.5 s left: a long wait started now returns when it runs out, not at its end.
    age_leases(bob.pool(), LEASE_MS - 1_500).await;
    let started = Instant::now();
    let second = bob.deliveries(30).await;
    let took = started.elapsed();
    assert_eq!(contents(&second), ["lost once"], "{second}");
    assert_eq!(items(&second)[0]["redelivered"], true);
    assert!(took >= Duration::from_millis(1_000) && took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acked_group_lease_never_comes_again() {
    let (_relay, alice, bob, g) = group_of_two().await;
    for text in ["one", "two"] {
        alice.say(&g, text).await;
    }
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let v = bob.deliveries(10).await;
        let got = items(&v);
        assert!(!got.is_empty(), "both messages arrive: {v}");
        assert!(got.iter().all(|d| d["redelivered"] == false), "{v}");
        seen.extend(contents(&v));
        assert_eq!(bob.ack_as(&bob.handle, &v["lease"], None).await.unwrap()["acked"], got.len());
    }
    assert_eq!(seen, ["one", "two"]);
    // Long past any lease, nothing comes again and nothing is unread; a second ack is a no-op.
    age_leases(bob.pool(), 10 * LEASE_MS).await;
    let v = bob.deliveries(1).await;
    assert!(items(&v).is_empty(), "{v}");
    assert_eq!(bob.peer.call(Request::GroupList { handle: Some(bob.handle.clone()) }).await[0]["unread"], 0);
    assert_eq!(row_state(bob.pool(), "one").await.0, 1);
    assert_eq!(row_state(bob.pool(), "two").await.0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acking_some_ids_of_a_group_lease_leaves_the_rest_to_come_again() {
    let (_relay, alice, bob, g) = group_of_two().await;
    for text in ["one", "two"] {
        alice.say(&g, text).await;
    }
    bob.sync(&g).await;
    let v = bob.deliveries(0).await;
    assert_eq!(contents(&v), ["one", "two"], "{v}");
    let got = items(&v);
    let first = got[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(bob.ack_as(&bob.handle, &v["lease"], Some(vec![first])).await.unwrap()["acked"], 1);
    assert_eq!(row_state(bob.pool(), "one").await.0, 1);
    assert_eq!(row_state(bob.pool(), "two").await, (0, true));
    age_leases(bob.pool(), LEASE_MS).await;
    let again = bob.deliveries(0).await;
    assert_eq!(contents(&again), ["two"], "{again}");
    assert_eq!(items(&again)[0]["id"], got[1]["id"]);
    assert_eq!(items(&again)[0]["redelivered"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acking_another_sessions_group_lease_is_refused() {
    let (_relay, alice, bob, g) = group_of_two().await;
    // A second session on bob's profile: a group session of its own, and a plain agent.
    bob.rt().lmk_session(Some("calm-falcon"), Some("bob's other agent")).await.unwrap();
    bob.peer.open_session("calm-falcon").await;
    bob.peer.open_session("coder").await;
    alice.say(&g, "for brave-heron").await;
    bob.sync(&g).await;
    let v = bob.deliveries(0).await;
    assert_eq!(contents(&v), ["for brave-heron"], "{v}");

    for other in ["calm-falcon", "coder"] {
        assert_eq!(bob.ack_as(other, &v["lease"], None).await.unwrap_err(), "forbidden", "{other}");
    }
    assert_eq!(row_state(bob.pool(), "for brave-heron").await, (0, true), "the refused acks changed nothing");

    // The owner may ack any lease, through the same `ack` op as 1:1 leases.
    let acked = bob.peer.call(Request::Ack { lease: v["lease"].as_str().unwrap().into(), ids: None }).await;
    assert_eq!(acked["acked"], 1);
    assert_eq!(acked["handle"], "brave-heron");
    assert_eq!(row_state(bob.pool(), "for brave-heron").await.0, 1);
}

/// The `after` of the message `id` as `m` stored it.
async fn after_of(m: &Member, id: &str) -> Vec<String> {
    let after: String = sqlx::query_scalar("SELECT after FROM lmk_messages WHERE handle = ? AND id = ?")
        .bind(&m.handle)
        .bind(id)
        .fetch_one(m.pool())
        .await
        .unwrap();
    serde_json::from_str(&after).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_frontier_holds_only_acked_items() {
    let (_relay, alice, bob, g) = group_of_two().await;
    let hello = alice.say(&g, "hello").await;
    bob.sync(&g).await;
    let v = bob.deliveries(0).await;
    assert_eq!(contents(&v), ["hello"], "{v}");

    // Handed out but not acked: bob's next message does not claim to have read it.
    let before_ack = bob.say(&g, "answer before the ack").await;
    assert!(!after_of(&bob, &before_ack).await.contains(&hello), "{:?}", after_of(&bob, &before_ack).await);

    bob.ack_as(&bob.handle, &v["lease"], None).await.unwrap();
    let after_ack = bob.say(&g, "answer after the ack").await;
    let after = after_of(&bob, &after_ack).await;
    assert!(after.contains(&hello), "{after:?}");
    // What alice receives carries the same claim.
    alice.sync(&g).await;
    let got = alice.deliveries(0).await;
    let seen = items(&got).into_iter().find(|i| i["id"] == after_ack.as_str()).expect("delivered to alice");
    assert!(seen["after"].as_array().unwrap().iter().any(|a| a == hello.as_str()), "{seen}");
    assert_eq!(seen["from"]["fingerprint"], bob.fp.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_not_disturb_hands_out_no_expired_group_lease() {
    let (_relay, alice, bob, g) = group_of_two().await;
    alice.say(&g, "held").await;
    bob.sync(&g).await;
    assert_eq!(contents(&bob.deliveries(0).await), ["held"]);
    bob.peer.call(Request::Dnd { on: Some(true) }).await;
    age_leases(bob.pool(), LEASE_MS).await;
    let v = bob.deliveries(1).await;
    assert!(items(&v).is_empty(), "{v}");
    assert_eq!(v["held"]["dnd"], 1, "{v}");
    bob.peer.call(Request::Dnd { on: Some(false) }).await;
    let v = bob.deliveries(0).await;
    assert_eq!(contents(&v), ["held"], "{v}");
    assert_eq!(items(&v)[0]["redelivered"], true);
}

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

fn ok(home: &Path, args: &[&str]) -> String {
    switchboard_ok(&bin(), home, args)
}

/// The group lines `listen --handle brave-heron --once` prints on bob's profile.
fn listen_once(bob: &Path) -> Vec<Value> {
    let out = ok(bob, &["listen", "--handle", "brave-heron", "--once", "--timeout", "10"]);
    out.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).filter(|l| l["type"] == "group").collect()
}

/// The real adapter over a running daemon: a bridge `group_deliveries` that is never acked (an
/// adapter killed before its harness had the items) comes again marked redelivered in
/// `listen --handle --once`, which acks once it has printed, so what it printed is read for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_handle_acks_what_it_printed_and_reprints_an_unacked_lease() {
    let relay = TestRelay::start().await;
    let (_a, alice) = home();
    let (_b, bob) = home();
    for (h, name) in [(&alice, "alice"), (&bob, "bob")] {
        ok(h, &["init", "--name", name, "--relay", &relay.url(), "--keystore", "file"]);
        ok(h, &["policy", "--digest", "0"]);
    }
    ok(&alice, &["listen", "--handle", "amber-otter", "--name", "Alice's agent", "--once", "--timeout", "0"]);
    ok(&bob, &["listen", "--handle", "brave-heron", "--name", "Bob's agent", "--once", "--timeout", "0"]);
    // No runtime runs for alice: `invite` prints the link, then admits the join itself.
    let (mut inviter, inv) = cli_invite(&bin(), &alice);
    let group = inv["group"].as_str().unwrap().to_owned();
    let link = inv["link"].as_str().unwrap().to_owned();
    let bob_home = bob.clone();
    tokio::task::spawn_blocking(move || ok(&bob_home, &["join", &link])).await.unwrap();
    assert!(inviter.wait().unwrap().success());

    let daemon = DaemonProcess::start(&bin(), &bob);
    let db = profile_db(&bob).await;
    // What came with the join is printed and acked.
    listen_once(&bob);

    // `listen` prints a new message and acks it.
    ok(&alice, &["group", "send", &group, "one"]);
    let lines = listen_once(&bob);
    let one = lines.iter().find(|l| l["content"] == "one").unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!((one["handle"].as_str(), one["redelivered"].as_bool()), (Some("brave-heron"), Some(false)));
    assert_eq!(row_state(&db, "one").await.0, 1, "listen acked after printing");

    // An adapter takes the next one over the bridge and dies before acking.
    ok(&alice, &["group", "send", &group, "two"]);
    let (url, _, owner) = bridge_of(&bob);
    let http = reqwest::Client::new();
    let token = open_session(&http, &url, &owner, "brave-heron").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let taken = loop {
        let v = bridge_rpc(&url, &token, &json!({"op": "group_deliveries", "wait_secs": 5})).await;
        if contents(&v).contains(&"two".to_owned()) {
            break v;
        }
        assert!(Instant::now() < deadline, "two never arrived: {v}");
    };
    assert_eq!(row_state(&db, "two").await, (0, true));
    // Within the lease `listen` has nothing to print; once it expires, it prints it again.
    assert!(listen_once_quick(&bob).is_empty());
    age_leases(&db, LEASE_MS).await;
    let lines = listen_once(&bob);
    let two = lines.iter().find(|l| l["content"] == "two").unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!(two["redelivered"], true);
    assert_eq!(two["id"], items(&taken)[0]["id"]);
    assert_eq!(row_state(&db, "two").await.0, 1, "listen acked the redelivered item");
    age_leases(&db, 10 * LEASE_MS).await;
    let last = bridge_rpc(&url, &token, &json!({"op": "group_deliveries", "wait_secs": 0})).await;
    assert!(items(&last).is_empty(), "{last}");
    db.close().await;
    daemon.stop();
}

/// `listen --handle brave-heron --once` that does not wait.
fn listen_once_quick(bob: &Path) -> Vec<Value> {
    let out = ok(bob, &["listen", "--handle", "brave-heron", "--once", "--timeout", "0"]);
    out.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).filter(|l| l["type"] == "group").collect()
}

fn python() -> String {
    std::env::var("SWITCHBOARD_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// `switchboard mcp` under a real MCP client (the `mcp` package from PyPI, see tests/mcp.rs): the
/// items its `group_read` tool returned are read for good, because the server acked their lease
/// as it returned the tool result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_group_read_tool_acks_what_it_returned() {
    let relay = TestRelay::start().await;
    let (_a, alice) = home();
    let (_b, bob) = home();
    for (h, name, handle) in [(&alice, "alice", "amber-otter"), (&bob, "bob", "brave-heron")] {
        ok(h, &["init", "--name", name, "--relay", &relay.url(), "--keystore", "file"]);
        ok(h, &["policy", "--digest", "0"]);
        ok(h, &["listen", "--handle", handle, "--name", &format!("{name}'s agent"), "--once", "--timeout", "0"]);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/group_read.py");
    let out = Command::new(python()).arg(&script).arg(bin()).arg(&alice).arg(&bob).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the MCP client failed:\n{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["ok"], true);
    let db = profile_db(&bob).await;
    let (read, lease): (i64, String) =
        sqlx::query_as("SELECT read, lease FROM lmk_messages WHERE handle = 'brave-heron' AND id = ?")
            .bind(summary["id"].as_str().unwrap())
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(lease, summary["lease"].as_str().unwrap(), "handed out under the lease the tool result carried");
    assert_eq!(read, 1, "the MCP server acked the lease with its tool result");
    db.close().await;
}
