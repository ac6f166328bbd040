//! A letagents envelope received: its common cases (a message from a known contact, accepted,
//! refused or dropped) are decided and committed on the caller's thread (`Store::decide_here`),
//! a burst's up to its first other case; every other case, and every moment the write lock is
//! taken, through sqlx. Both must leave exactly the same rows.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

#[path = "../benches/support/mod.rs"]
mod support;

use std::time::Duration;

use switchboard_core::bridge::api::Request;
use switchboard_core::engine::Runtime;
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::protocol::letagents::{self as la, Inner, Kind};
use switchboard_core::util::{OsRng, now_ms};

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Two profiles `bob`, each with the same `alice` as a contact: one on `one` (a runtime of one
/// thread: every receive goes through sqlx), one on `multi`.
fn twins(one: &tokio::runtime::Runtime, multi: &tokio::runtime::Runtime) -> (support::Receiver, support::Receiver) {
    let through_sqlx = support::bob_with_contact_alice(one);
    let alice = &through_sqlx.alice;
    let twin = DeviceIdentity::from_secret(&alice.secret_bytes(), alice.drop).unwrap();
    let here = support::bob_with_contact(multi, twin);
    (through_sqlx, here)
}

/// One message of a script: id, kind, body, the id it answers, the agent it is for.
type Line = (uuid::Uuid, Kind, &'static str, Option<uuid::Uuid>, &'static str);

/// `from`'s envelope to `to` of `line`, sent at `ts`.
fn envelope(from: &DeviceIdentity, to: &Runtime, ts: i64, line: Line) -> Vec<u8> {
    let (id, kind, body, reply_to, to_agent) = line;
    let mut inner = Inner::new(&from.keys(), &to.keys().mailbox_id(), ts, id, kind, body.into());
    inner.reply_to = reply_to.map(|r| r.to_string());
    inner.from_agent = Some("scout".into());
    inner.to_agent = Some(to_agent.into());
    la::seal(&from.sig, &to.keys(), &serde_json::to_string(&inner).unwrap(), &mut OsRng).unwrap()
}

/// Every row a receive can write, without row ids and local times: the messages, the ids
/// marked seen, the outbox (receipts), the audit log, the contacts.
async fn effects(rt: &Runtime) -> Vec<String> {
    const TABLES: [(&str, &str); 6] = [
        (
            "message",
            "SELECT json_array(id, direction, protocol, contact_id, peer, kind, body, reply_to, from_agent, to_agent, \
             ts, state, detail, path, shown) FROM messages WHERE direction = 'in' ORDER BY rowid_",
        ),
        ("seen", "SELECT json_array(protocol, peer, id, ts) FROM seen ORDER BY id"),
        ("outbox", "SELECT json_array(protocol, kind, target) FROM outbox ORDER BY id"),
        (
            "receipt",
            "SELECT json_array(kind, body, reply_to) FROM messages WHERE direction = 'out' AND kind = 'receipt' \
             ORDER BY rowid_",
        ),
        (
            "audit",
            "SELECT json_array(direction, protocol, peer, message_id, kind, state, detail, path) FROM audit \
             WHERE direction = 'in' ORDER BY id",
        ),
        ("contact", "SELECT json_array(name, state, blocked, blocked_dropped) FROM contacts ORDER BY name"),
    ];
    let mut out = Vec::new();
    for (what, sql) in TABLES {
        let rows: Vec<String> = sqlx::query_scalar(sql).fetch_all(&rt.store().pool).await.unwrap();
        out.extend(rows.into_iter().map(|r| format!("{what} {r}")));
    }
    out
}

/// The same envelopes (same ids, times, kinds and bodies, from the same `alice`) received by
/// a profile on a runtime of one thread, where every receive goes through sqlx, and by one on a
/// multi-threaded runtime, where the common cases are decided on the caller's thread: the rows
/// are the same, and the second made its commits there.
#[test]
fn on_the_callers_thread_a_receive_writes_what_it_writes_through_sqlx() {
    let (one, multi) = (current_thread(), multi_thread());
    let (through_sqlx, here) = twins(&one, &multi);
    let alice = &through_sqlx.alice;
    let ts = now_ms();
    let first = uuid::Uuid::new_v4();
    // A message, a reply to it, one to an agent a rule of bob's denies (refused, with a
    // receipt saying so), one whose body is JSON.
    let script: [Line; 4] = [
        (first, Kind::Send, "hello, bob", None, "builder"),
        (uuid::Uuid::new_v4(), Kind::Reply, "and a reply", Some(first), "builder"),
        (uuid::Uuid::new_v4(), Kind::Ask, "may I deploy?", None, "ops"),
        (uuid::Uuid::new_v4(), Kind::Send, "{\"not\": \"text\"}", None, "builder"),
    ];
    for (profile, rt) in [(&through_sqlx, &one), (&here, &multi)] {
        rt.block_on(
            sqlx::query(
                "INSERT INTO agent_rules (contact_id, position, from_glob, to_glob, action) \
                 SELECT id, 0, '*', 'ops', 'deny' FROM contacts WHERE name = 'alice'",
            )
            .execute(&profile.bob.store().pool),
        )
        .unwrap();
    }
    let mut answers = [Vec::new(), Vec::new()];
    for (i, (profile, rt)) in [(&through_sqlx, &one), (&here, &multi)].into_iter().enumerate() {
        let before = profile.bob.store().direct_commits();
        for line in script {
            let env = envelope(alice, &profile.bob, ts, line);
            answers[i].push(rt.block_on(profile.bob.receive_letagents(&env)).unwrap());
            // The same envelope again: a replay, dropped as seen.
            answers[i].push(rt.block_on(profile.bob.receive_letagents(&env)).unwrap());
        }
        let made = profile.bob.store().direct_commits() - before;
        assert_eq!(made, if i == 0 { 0 } else { 8 }, "commits on the caller's thread (profile {i})");
    }
    assert_eq!(answers[0], [true, false, true, false, false, false, true, false]);
    assert_eq!(answers[0], answers[1]);
    let (a, b) = (one.block_on(effects(&through_sqlx.bob)), multi.block_on(effects(&here.bob)));
    assert_eq!(a.iter().filter(|r| r.starts_with("message")).count(), 3, "{a:#?}");
    // A receipt for each message but the reply (none is asked for), the refused one saying so.
    assert_eq!(a.iter().filter(|r| r.starts_with("outbox")).count(), 3, "{a:#?}");
    assert!(a.iter().any(|r| r.starts_with("receipt") && r.contains("refused")), "{a:#?}");
    assert!(a.iter().any(|r| r.starts_with("audit") && r.contains("\"dropped\"")), "{a:#?}");
    assert!(a.iter().any(|r| r.starts_with("audit") && r.contains("\"refused\"")), "{a:#?}");
    assert_eq!(a, b);
}

/// What is not the common case goes through sqlx on any runtime, and is decided as before: a
/// stranger's hello becomes a request, a blocked contact's message is counted and dropped.
#[test]
fn a_stranger_and_a_blocked_contact_are_decided_through_sqlx() {
    let multi = multi_thread();
    let receiver = support::bob_with_contact_alice(&multi);
    let bob = &receiver.bob;
    let stranger = DeviceIdentity::generate(&mut OsRng);
    let before = bob.store().direct_commits();
    let mut hello = Inner::new(
        &stranger.keys(),
        &bob.keys().mailbox_id(),
        now_ms(),
        uuid::Uuid::new_v4(),
        Kind::Hello,
        "carol".into(),
    );
    hello.from = stranger.address().to_string();
    let env = la::seal(&stranger.sig, &bob.keys(), &serde_json::to_string(&hello).unwrap(), &mut OsRng).unwrap();
    multi.block_on(bob.receive_letagents(&env)).unwrap();
    multi.block_on(bob.handle(Request::ContactBlock { name: "alice".into() }, false)).unwrap();
    let from_alice = receiver.envelope_from_alice();
    assert!(!multi.block_on(bob.receive_letagents(&from_alice)).unwrap());
    assert_eq!(bob.store().direct_commits(), before, "neither case is decided on the caller's thread");
    let rows = multi.block_on(effects(bob));
    assert!(rows.iter().any(|r| r == "contact [\"carol\",\"pending\",0,0]"), "{rows:#?}");
    assert!(rows.iter().any(|r| r == "contact [\"alice\",\"active\",1,1]"), "{rows:#?}");
    assert!(!rows.iter().any(|r| r.starts_with("message")), "{rows:#?}");
}

/// While another connection holds the write lock, a receive does not wait on the caller's
/// thread: it goes through sqlx, which waits for the lock, and commits once it is free.
#[test]
fn a_receive_while_the_write_lock_is_taken_waits_through_sqlx() {
    let multi = multi_thread();
    let receiver = support::bob_with_contact_alice(&multi);
    let bob = receiver.bob.clone();
    let before = bob.store().direct_commits();
    let held = multi.block_on(bob.store().write_tx()).unwrap();
    let env = receiver.envelope_from_alice();
    let receiving = {
        let bob = bob.clone();
        multi.spawn(async move { bob.receive_letagents(&env).await })
    };
    multi.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
    assert!(!receiving.is_finished(), "the receive waits for the lock");
    multi.block_on(held.rollback()).unwrap();
    assert!(multi.block_on(receiving).unwrap().unwrap());
    assert_eq!(bob.store().direct_commits(), before);
    let rows = multi.block_on(effects(&bob));
    assert_eq!(rows.iter().filter(|r| r.starts_with("message")).count(), 1, "{rows:#?}");
}

/// A burst is decided on the caller's thread from its first envelope up to the first that is
/// not the common case (here a stranger's hello), in one transaction; the rest of it through
/// sqlx in another. The rows are those a burst through sqlx alone leaves.
#[test]
fn a_burst_goes_on_the_callers_thread_up_to_its_first_uncommon_envelope() {
    let (one, multi) = (current_thread(), multi_thread());
    let (through_sqlx, here) = twins(&one, &multi);
    let alice = &through_sqlx.alice;
    let stranger = DeviceIdentity::generate(&mut OsRng);
    let ts = now_ms();
    let lines: Vec<Line> = (0..5)
        .map(|i| (uuid::Uuid::new_v4(), Kind::Send, ["one", "two", "", "four", "five"][i], None, "builder"))
        .collect();
    let hello_id = uuid::Uuid::new_v4();
    let mut shown = Vec::new();
    for (profile, rt) in [(&through_sqlx, &one), (&here, &multi)] {
        let mut burst: Vec<Vec<u8>> = lines.iter().map(|l| envelope(alice, &profile.bob, ts, *l)).collect();
        let mut hello =
            Inner::new(&stranger.keys(), &profile.bob.keys().mailbox_id(), ts, hello_id, Kind::Hello, "carol".into());
        hello.from = stranger.address().to_string();
        burst[2] =
            la::seal(&stranger.sig, &profile.bob.keys(), &serde_json::to_string(&hello).unwrap(), &mut OsRng).unwrap();
        // The first envelope again at the end: dropped as seen.
        burst.push(burst[0].clone());
        let (txs, commits) = (profile.bob.letagents_receive_transactions(), profile.bob.store().direct_commits());
        shown.push(rt.block_on(profile.bob.receive_letagents_burst(&burst)).unwrap());
        let txs = profile.bob.letagents_receive_transactions() - txs;
        let commits = profile.bob.store().direct_commits() - commits;
        println!("{txs} transactions, {commits} on the caller's thread");
        assert_eq!((txs, commits), if shown.len() == 1 { (1, 0) } else { (2, 1) });
    }
    assert_eq!(shown[0], [true, true, false, true, true, false]);
    assert_eq!(shown[0], shown[1]);
    let (a, b) = (one.block_on(effects(&through_sqlx.bob)), multi.block_on(effects(&here.bob)));
    assert_eq!(a.iter().filter(|r| r.starts_with("message")).count(), 4, "{a:#?}");
    assert!(a.iter().any(|r| r == "contact [\"carol\",\"pending\",0,0]"), "{a:#?}");
    assert_eq!(a, b);
}
