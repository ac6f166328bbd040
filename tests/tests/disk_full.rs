//! A full disk under a profile. alice's profile lives on an 8 MiB tmpfs; once she and bob are
//! contacts, a file fills what is left of it. While it is full, alice sends to bob and bob sends
//! to alice, and alice reads her inbox several times. Then the file is deleted, alice's runtime is
//! restarted on the same profile, and everything is reconciled:
//!
//! - a send alice was told was queued reaches bob exactly once; a send refused with `disk_full`
//!   never reaches him;
//! - every message bob sent reaches alice exactly once: what her runtime could not save it did
//!   not acknowledge to the relay, so it is read again once space returns.
//!
//! Mounting needs root. Without it the test prints why and passes, unless
//! `SWITCHBOARD_REQUIRE_TMPFS=1` (CI) makes that a failure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;

use switchboard_core::api::Request;
use switchboard_core::store::{Stmt, Store, StoreError};
use switchboard_tests::{Peer, SmallDisk, TestRelay, befriend};

/// A message text of about 20 KB that starts with `tag`.
fn text(tag: &str) -> String {
    let mut t = format!("{tag}|");
    t.extend(std::iter::repeat_n('z', 20_000));
    t
}

/// The tag of a message as `inbox` shows it.
fn tag_of(message: &serde_json::Value) -> String {
    message["body"].as_str().unwrap_or_default().split('|').next().unwrap().to_owned()
}

/// alice sends `tag`'s text to bob as the owner (one-shot, like a CLI command).
async fn send(alice: &Peer, tag: &str) -> Result<(), (String, String)> {
    let request = Request::Send {
        contact: "bob".into(),
        text: text(tag),
        kind: None,
        reply_to: None,
        from_agent: None,
        to_agent: None,
    };
    alice.rt.handle(request, true).await.map(drop).map_err(|e| (e.code().to_owned(), e.to_string()))
}

fn count(seen: &mut BTreeMap<String, usize>, messages: &[serde_json::Value]) {
    for m in messages {
        *seen.entry(tag_of(m)).or_default() += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_profile_disk_neither_loses_an_accepted_send_nor_acks_an_unsaved_receive() {
    let Some(disk) = SmallDisk::mount("8m") else { return };
    let relay = TestRelay::start().await;
    let bob = Peer::offline("bob", &relay.url()).await;
    bob.inbox(0).await;
    let alice = Peer::offline_in("alice", &relay.url(), tempfile::tempdir_in(disk.path()).unwrap()).await;
    befriend(&alice, &bob).await;
    // Settle what befriending left waiting (hellos, receipts) so the counts below are ours.
    for _ in 0..2 {
        alice.inbox(0).await;
        bob.inbox(0).await;
    }

    let ballast = disk.path().join("ballast");
    let filled = disk.fill(&ballast);
    eprintln!("ballast: {filled} bytes");

    // While full: alice sends twelve messages, bob sends eight, alice reads her inbox after each.
    let mut problems = Vec::new();
    let mut alice_sent: BTreeMap<String, bool> = BTreeMap::new();
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for n in 0..12 {
        let tag = format!("to-bob-{n:02}");
        let sent = send(&alice, &tag).await;
        match &sent {
            Ok(()) => {}
            Err((code, _)) if code == "disk_full" => {}
            Err((code, message)) => {
                problems.push(format!("send {tag} refused with `{code}` ({message}), not disk_full"))
            }
        }
        *codes.entry(sent.as_ref().map_or_else(|(code, _)| code.clone(), |()| "ok".into())).or_default() += 1;
        alice_sent.insert(tag, sent.is_ok());
        if n < 8 {
            bob.send("alice", &text(&format!("to-alice-{n:02}"))).await;
        }
        match alice.rt.handle(Request::Inbox { all: false, wait_secs: 0 }, true).await {
            Ok(_) => *codes.entry("inbox: ok".into()).or_default() += 1,
            Err(e) if e.code() == "disk_full" => *codes.entry("inbox: disk_full".into()).or_default() += 1,
            Err(e) => problems.push(format!("reading the inbox failed with `{}` ({e}), not disk_full", e.code())),
        }
    }
    eprintln!("while full: {codes:?}");
    assert!(alice_sent.values().any(|ok| !ok), "the disk never refused a send: the test did not fill it");

    // Space returns. The same runtime goes on: it sends, and reads (and acks) bob's messages.
    std::fs::remove_file(&ballast).unwrap();
    for n in 0..4 {
        let tag = format!("after-{n}");
        let sent = send(&alice, &tag).await;
        if let Err((code, message)) = &sent {
            problems.push(format!("send {tag} after space returned failed: `{code}` ({message})"));
        }
        alice_sent.insert(tag, sent.is_ok());
    }
    for _ in 0..3 {
        alice.inbox(0).await;
    }

    // Only what is on disk counts: restart alice's runtime, let it catch up, then list every
    // message each side holds.
    let (profile, dir) = alice.close();
    let alice = Peer::reopen("alice", profile, dir).await;
    alice.call(Request::Flush).await;
    for _ in 0..2 {
        alice.inbox(0).await;
        bob.inbox(0).await;
    }
    let mut alice_got = BTreeMap::new();
    count(&mut alice_got, alice.call(Request::Inbox { all: true, wait_secs: 0 }).await.as_array().unwrap());
    let mut bob_got = BTreeMap::new();
    count(&mut bob_got, bob.call(Request::Inbox { all: true, wait_secs: 0 }).await.as_array().unwrap());

    for (tag, queued) in &alice_sent {
        let n = bob_got.remove(tag).unwrap_or(0);
        match (queued, n) {
            (true, 1) | (false, 0) => {}
            (true, _) => problems.push(format!("send {tag} was accepted but reached bob {n} times")),
            (false, _) => problems.push(format!("send {tag} was refused but reached bob {n} times")),
        }
    }
    for n in 0..8 {
        let tag = format!("to-alice-{n:02}");
        let got = alice_got.remove(&tag).unwrap_or(0);
        if got != 1 {
            problems.push(format!("bob's {tag} is in alice's history {got} times"));
        }
    }
    bob_got.retain(|tag, _| tag.starts_with("to-") || tag.starts_with("after-"));
    alice_got.retain(|tag, _| tag.starts_with("to-") || tag.starts_with("after-"));
    problems.extend(bob_got.into_iter().map(|(tag, n)| format!("bob got {tag} {n} times, never sent")));
    problems.extend(alice_got.into_iter().map(|(tag, n)| format!("alice got {tag} {n} times, never sent")));
    drop(alice);
    drop(disk);
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

/// Commits made on the caller's thread (`store::direct`: a group entry or a lease, replayable;
/// a group message before its post, durable) on a full disk: refused as `disk_full`, nothing of
/// them kept, and the same commits made there once space returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_on_the_callers_thread_on_a_full_disk_keep_nothing() {
    let Some(disk) = SmallDisk::mount("4m") else { return };
    let dir = tempfile::tempdir_in(disk.path()).unwrap();
    let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
    let big = "x".repeat(256 * 1024);
    let commit = |key: &'static str, durable: bool| {
        let (store, big) = (&store, big.as_str());
        async move {
            let mut tx = if durable { store.batch_tx().await? } else { store.replayable_tx().await? };
            tx.queue(Stmt::new("INSERT INTO meta (key, value) VALUES (?, ?)").bind(key).bind(big));
            tx.commit().await
        }
    };
    let ballast = disk.path().join("ballast");
    disk.fill(&ballast);
    let before = store.direct_commits();
    for (key, durable) in [("replayable", false), ("durable", true)] {
        let refused = commit(key, durable).await.unwrap_err();
        assert!(matches!(refused, StoreError::DiskFull(_)), "{key}: refused as a full disk: {refused}");
        assert_eq!(store.meta(key).await.unwrap(), None, "{key}: nothing of it kept");
    }
    std::fs::remove_file(&ballast).unwrap();
    for (key, durable) in [("replayable", false), ("durable", true)] {
        commit(key, durable).await.unwrap();
        assert_eq!(store.meta(key).await.unwrap().map(|v| v.len()), Some(big.len()), "{key}");
    }
    assert_eq!(store.direct_commits(), before + 2, "both committed on the caller's thread");
}
