//! letagents v1 end to end: two profiles and a real relay-lite over real HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
// relay_lite::Limits is non-exhaustive, so limits are raised field by field.
#![allow(clippy::field_reassign_with_default)]

use serde_json::{Value, json};
use switchboard_core::api::Request;
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::protocol::letagents::{self as la, Inner, Kind};
use switchboard_core::transport::letagents::SendOutcome;
use switchboard_core::util::{OsRng, now_ms};
use switchboard_tests::{Forger, Peer, TestRelay, befriend};

fn send_req(contact: &str, text: &str, kind: &str, reply_to: Option<&str>) -> Request {
    Request::Send {
        contact: contact.into(),
        text: text.into(),
        kind: Some(kind.into()),
        reply_to: reply_to.map(Into::into),
        from_agent: None,
        to_agent: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_ask_reply_and_receipts_over_the_websocket() {
    let relay = TestRelay::start().await;
    let alice = Peer::live("alice", &relay.url()).await;
    let bob = Peer::live("bob", &relay.url()).await;
    befriend(&alice, &bob).await;

    let id = alice.send("bob", "hello bob").await;
    let got = bob.inbox(10).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["body"], "hello bob");
    assert_eq!(got[0]["from"], "alice");
    assert_eq!(got[0]["kind"], "send");
    assert!(
        alice.eventually(10, || async { alice.state_of(&id).await == "delivered" }).await,
        "no receipt for the send"
    );

    let ask = alice.call(send_req("bob", "what is 2+2?", "ask", None)).await["id"].as_str().unwrap().to_owned();
    let got = bob.inbox(10).await;
    assert_eq!(got[0]["kind"], "ask");
    assert_eq!(got[0]["id"], ask.as_str());
    bob.call(send_req("alice", "4", "reply", Some(&ask))).await;
    let got = alice.inbox(10).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["kind"], "reply");
    assert_eq!(got[0]["reply_to"], ask.as_str());
    assert_eq!(got[0]["body"], "4");
    // Nothing shows twice.
    assert!(alice.inbox(0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_wait_at_the_relay_while_the_recipient_is_offline() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    // Bob logs in once so his mailbox exists, then goes away.
    bob.inbox(0).await;
    befriend(&alice, &bob).await;
    let first = alice.send("bob", "one").await;
    let second = alice.send("bob", "two").await;
    assert_eq!(alice.state_of(&first).await, "relayed");
    let got = bob.inbox(0).await;
    let bodies: Vec<&str> = got.iter().map(|m| m["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, ["one", "two"]);
    // Bob's receipts reach alice the next time she syncs.
    alice.inbox(0).await;
    assert_eq!(alice.state_of(&first).await, "delivered");
    assert_eq!(alice.state_of(&second).await, "delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_is_answered_with_a_roster_and_presence_is_pushed() {
    let relay = TestRelay::start().await;
    let alice = Peer::live("alice", &relay.url()).await;
    let bob = Peer::live("bob", &relay.url()).await;
    befriend(&alice, &bob).await;
    bob.call(Request::AgentRegister { name: "coder".into(), harness: Some("claude-code".into()) }).await;
    // Presence roster arrives unsolicited.
    let got = alice.inbox(10).await;
    assert_eq!(got[0]["kind"], "roster");
    assert_eq!(got[0]["body"][0]["name"], "coder");

    let list = alice.call(Request::List { contact: "bob".into() }).await["id"].as_str().unwrap().to_owned();
    let got = alice.inbox(10).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["kind"], "roster");
    assert_eq!(got[0]["reply_to"], list.as_str());
    assert_eq!(got[0]["body"][0]["harness"], "claude-code");
    assert_eq!(got[0]["body"][0]["where"], "bob/coder");
    let contacts = alice.call(Request::ContactList).await;
    assert_eq!(contacts[0]["roster"][0]["name"], "coder");
    assert!(alice.eventually(10, || async { alice.state_of(&list).await == "delivered" }).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_becomes_a_request_that_can_be_accepted() {
    let relay = TestRelay::start().await;
    let alice = Peer::live("alice", &relay.url()).await;
    let bob = Peer::live("bob", &relay.url()).await;
    alice
        .call(Request::ContactAdd {
            address: bob.address().await,
            name: Some("bob".into()),
            allow: None,
            relay: None,
            no_hello: false,
        })
        .await;
    assert!(
        bob.eventually(10, || async { !bob.call(Request::ContactRequests).await.as_array().unwrap().is_empty() }).await
    );
    let reqs = bob.call(Request::ContactRequests).await;
    assert_eq!(reqs[0]["name"], "alice");
    assert_eq!(reqs[0]["request"], "alice");
    assert_eq!(reqs[0]["safety_number"], alice.call(Request::Whoami).await["letagents"]["safety_number"]);
    // While pending, messages from alice are dropped, not shown.
    alice.send("bob", "before accept").await;
    let dropped = bob.eventually(10, || async { bob.log().await.iter().any(|r| r["detail"] == "not_accepted") }).await;
    assert!(dropped, "the message from a pending contact was not dropped");
    assert!(bob.inbox(0).await.is_empty());
    assert_eq!(bob.try_call(send_req("alice", "x", "send", None)).await.unwrap_err(), "pending_contact");
    bob.call(Request::ContactAccept { name: "alice".into(), new_name: None }).await;
    alice.send("bob", "after accept").await;
    let got = bob.inbox(10).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["body"], "after accept");
    bob.send("alice", "hi alice").await;
    assert_eq!(alice.inbox(10).await[0]["body"], "hi alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_delivers_exactly_once_after_the_relay_comes_back() {
    let mut relay = TestRelay::start().await;
    let alice = Peer::live("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    bob.inbox(0).await;
    befriend(&alice, &bob).await;
    relay.stop().await;
    let id = alice.send("bob", "sent while the relay was down").await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(alice.state_of(&id).await, "queued");
    relay.restart().await;
    assert!(
        alice
            .eventually(30, || async {
                alice.state_of(&id).await == "relayed" || alice.state_of(&id).await == "delivered"
            })
            .await
    );
    let got = bob.inbox(0).await;
    assert_eq!(got.iter().filter(|m| m["id"] == id.as_str()).count(), 1);
    assert!(bob.inbox(0).await.is_empty());
    let relayed =
        alice.log().await.iter().filter(|r| r["message_id"] == id.as_str() && r["state"] == "relayed").count();
    assert_eq!(relayed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_message_survives_a_runtime_restart() {
    let mut relay = TestRelay::start().await;
    let bob = Peer::offline("bob", &relay.url()).await;
    bob.inbox(0).await;
    let alice = Peer::offline("alice", &relay.url()).await;
    befriend(&alice, &bob).await;
    relay.stop().await;
    let id = alice.send("bob", "persisted").await;
    assert_eq!(alice.state_of(&id).await, "queued");
    // The runtime goes away and a new one opens the same profile.
    let (profile, dir) = alice.close();
    relay.restart().await;
    let rt = switchboard_core::engine::Runtime::open(&profile).await.unwrap();
    rt.handle(Request::Flush, true).await.unwrap();
    let got = bob.inbox(0).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["body"], "persisted");
    drop(dir);
}

// ----- rejections: each is crafted by a device whose keys the test holds -------------------

/// The relay refuses a login not newer than the last one it accepted; one client's logins signed
/// at the same moment (an inbox read while the websocket reconnects) must still all get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_signed_concurrently_by_one_client_are_all_accepted() {
    let relay = TestRelay::start().await;
    let f = std::sync::Arc::new(Forger::new(&relay));
    let reads = (0..16).map(|_| {
        let f = f.clone();
        tokio::spawn(async move { f.relay.inbox(&f.id.sig, &f.id.drop).await.map(|_| ()) })
    });
    let sockets = (0..2).map(|_| {
        let f = f.clone();
        tokio::spawn(async move { f.relay.connect(&f.id.sig, &f.id.drop).await.map(drop) })
    });
    for task in reads.chain(sockets).collect::<Vec<_>>() {
        task.await.unwrap().unwrap();
    }
}

/// Bob, with the forger as an accepted contact named "mallory".
async fn bob_knows_forger(relay: &TestRelay) -> (Peer, Forger) {
    let bob = Peer::offline("bob", &relay.url()).await;
    bob.inbox(0).await;
    let f = Forger::new(relay);
    f.read().await; // log in: the forger's mailbox exists for receipts
    bob.call(Request::ContactAdd {
        address: f.address(),
        name: Some("mallory".into()),
        allow: None,
        relay: None,
        no_hello: true,
    })
    .await;
    (bob, f)
}

async fn last_in_audit(bob: &Peer) -> Value {
    bob.log().await.into_iter().rfind(|r| r["direction"] == "in").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_anywhere_is_refused_and_the_intact_envelope_still_arrives() {
    let mut limits = relay_lite::Limits::default();
    limits.sends_per_minute = 10_000;
    limits.ip_requests_per_minute = 100_000;
    limits.mailbox_capacity = 10_000;
    let relay = TestRelay::start_with(limits).await;
    let (bob, f) = bob_knows_forger(&relay).await;
    let inner = f.inner(&bob.rt.keys(), Kind::Send, json!("intact"));
    let env = f.seal(&bob.rt.keys(), &inner);
    let mut positions: Vec<usize> = (0..env.len()).step_by(37).collect();
    positions.extend([0, 1, 2, 3, 34, 35, 46, 47, env.len() - 17, env.len() - 1]);
    let mut stored = 0;
    for &i in &positions {
        let mut bad = env.clone();
        bad[i] ^= 0x80;
        match f.try_post(&bob, bad).await {
            SendOutcome::Accepted => stored += 1,
            // relay-lite already refuses a broken "LA1" magic; nothing else is its business.
            SendOutcome::Permanent(e) => assert!(i < 3 && e.contains("400"), "byte {i}: {e}"),
            other => panic!("byte {i}: {other:?}"),
        }
    }
    assert_eq!(stored, positions.iter().filter(|&&i| i >= 3).count());
    assert!(bob.inbox(0).await.is_empty(), "a tampered envelope was shown");
    let dropped = bob.log().await.iter().filter(|r| r["state"] == "dropped").count();
    assert_eq!(dropped, stored);
    f.post(&bob, env).await;
    let got = bob.inbox(0).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["body"], "intact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelope_for_another_recipient_is_refused() {
    let relay = TestRelay::start().await;
    let (bob, f) = bob_knows_forger(&relay).await;
    let carol = DeviceIdentity::generate(&mut OsRng).keys();
    // Sealed to bob's box key, but inner.to names carol.
    let inner = f.inner(&carol, Kind::Send, json!("for carol"));
    f.post(&bob, f.seal(&bob.rt.keys(), &inner)).await;
    assert!(bob.inbox(0).await.is_empty());
    let row = last_in_audit(&bob).await;
    assert_eq!(row["state"], "dropped");
    assert!(row["detail"].as_str().unwrap().contains("another mailbox"), "{row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_message_is_dropped() {
    let relay = TestRelay::start().await;
    let (bob, f) = bob_knows_forger(&relay).await;
    let mut inner = f.inner(&bob.rt.keys(), Kind::Send, json!("old news"));
    inner.ts = now_ms() - la::STALE_AFTER_MS - 60_000;
    f.post(&bob, f.seal(&bob.rt.keys(), &inner)).await;
    assert!(bob.inbox(0).await.is_empty());
    let row = last_in_audit(&bob).await;
    assert_eq!((row["state"].as_str(), row["detail"].as_str()), (Some("dropped"), Some("stale")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_id_is_dropped() {
    let relay = TestRelay::start().await;
    let (bob, f) = bob_knows_forger(&relay).await;
    let inner = f.inner(&bob.rt.keys(), Kind::Send, json!("once"));
    let env = f.seal(&bob.rt.keys(), &inner);
    f.post(&bob, env.clone()).await;
    assert_eq!(bob.inbox(0).await.len(), 1);
    // The identical envelope, and a fresh sealing of the same inner id.
    f.post(&bob, env).await;
    f.post(&bob, f.seal(&bob.rt.keys(), &inner)).await;
    assert!(bob.inbox(0).await.is_empty());
    let replays = bob.log().await.iter().filter(|r| r["detail"] == "replay").count();
    assert_eq!(replays, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_sender_is_dropped() {
    let relay = TestRelay::start().await;
    let bob = Peer::offline("bob", &relay.url()).await;
    bob.inbox(0).await;
    let stranger = Forger::new(&relay);
    let inner = stranger.inner(&bob.rt.keys(), Kind::Send, json!("let me in"));
    stranger.post(&bob, stranger.seal(&bob.rt.keys(), &inner)).await;
    assert!(bob.inbox(0).await.is_empty());
    assert!(bob.call(Request::ContactList).await.as_array().unwrap().is_empty());
    assert_eq!(last_in_audit(&bob).await["detail"], "unknown_sender");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_box_key_is_refused_and_blocks_sending_until_verified() {
    let relay = TestRelay::start().await;
    let (bob, f) = bob_knows_forger(&relay).await;
    // Same sig key, new box key: what a re-installed (or compromised) device looks like.
    let rekeyed = DeviceIdentity {
        sig: ed25519_dalek::SigningKey::from_bytes(&f.id.sig.to_bytes()),
        boxs: x25519_dalek::StaticSecret::from([42u8; 32]),
        drop: f.id.drop,
    };
    let inner = Inner::new(
        &rekeyed.keys(),
        &bob.rt.keys().mailbox_id(),
        now_ms(),
        uuid::Uuid::new_v4(),
        Kind::Send,
        json!("new key, who dis"),
    );
    let env = la::seal(&rekeyed.sig, &bob.rt.keys(), &serde_json::to_string(&inner).unwrap(), &mut OsRng).unwrap();
    f.post(&bob, env).await;
    assert!(bob.inbox(0).await.is_empty());
    let c = &bob.call(Request::ContactList).await[0];
    assert_eq!(c["key_changed"], true);
    assert_eq!(c["new_safety_number"], rekeyed.keys().safety_number());
    assert_eq!(bob.try_call(send_req("mallory", "hi", "send", None)).await.unwrap_err(), "key_changed");
    bob.call(Request::ContactVerify { name: "mallory".into() }).await;
    let c = &bob.call(Request::ContactList).await[0];
    assert_eq!(c["key_changed"], false);
    assert_eq!(c["safety_number"], rekeyed.keys().safety_number());
    bob.send("mallory", "ok now").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disallowed_kind_is_refused_with_a_receipt() {
    let relay = TestRelay::start().await;
    let (bob, f) = bob_knows_forger(&relay).await;
    bob.call(Request::ContactAllow { name: "mallory".into(), kinds: vec!["send".into()] }).await;
    let inner = f.inner(&bob.rt.keys(), Kind::Ask, json!("may I ask?"));
    f.post(&bob, f.seal(&bob.rt.keys(), &inner)).await;
    assert!(bob.inbox(0).await.is_empty());
    assert_eq!(last_in_audit(&bob).await["state"], "refused");
    let receipts: Vec<_> = f.read().await.into_iter().filter(|o| o.kind == Kind::Receipt).collect();
    assert_eq!(receipts.len(), 1);
    assert_eq!(receipts[0].inner.reply_to.as_deref(), Some(inner.id.as_str()));
    assert_eq!(receipts[0].inner.body["status"], "refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_rule_that_denies_refuses_the_message() {
    let relay = TestRelay::start().await;
    let (bob, f) = bob_knows_forger(&relay).await;
    bob.call(Request::ContactRule {
        name: "mallory".into(),
        from: "ci*".into(),
        to: "*".into(),
        action: "deny".into(),
    })
    .await;
    let mut denied = f.inner(&bob.rt.keys(), Kind::Send, json!("from the CI bot"));
    denied.from_agent = Some("ci-bot".into());
    let mut allowed = f.inner(&bob.rt.keys(), Kind::Send, json!("from a person"));
    allowed.from_agent = Some("alice".into());
    f.post(&bob, f.seal(&bob.rt.keys(), &denied)).await;
    f.post(&bob, f.seal(&bob.rt.keys(), &allowed)).await;
    let got = bob.inbox(0).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["body"], "from a person");
    let statuses: Vec<String> = f
        .read()
        .await
        .iter()
        .filter(|o| o.kind == Kind::Receipt)
        .map(|o| o.inner.body["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses.len(), 2);
    // Bob is reading his inbox when the allowed one arrives, so it counts as pushed.
    assert!(statuses.contains(&"refused".to_owned()) && statuses.contains(&"pushed".to_owned()), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_talk_through_a_self_signed_relay_they_pin() {
    let relay = TestRelay::start_tls().await;
    let pin = relay.cert_sha256.clone().unwrap();
    let mut alice = Peer::offline_pinned("alice", &relay.url(), Some(&pin)).await;
    alice.go_live();
    let bob = Peer::offline_pinned("bob", &relay.url(), Some(&pin)).await;
    befriend(&alice, &bob).await;
    let id = alice.send("bob", "over TLS").await;
    assert!(alice.eventually(10, || async { alice.state_of(&id).await != "queued" }).await);
    let got = bob.inbox(0).await;
    assert_eq!(got[0]["body"], "over TLS");
    // Alice's websocket (wss) receives bob's receipt live.
    assert!(alice.eventually(10, || async { alice.state_of(&id).await == "delivered" }).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_certificate_does_not_match_the_pin_is_refused() {
    let relay = TestRelay::start_tls().await;
    let wrong = "00".repeat(32);
    let eve = Peer::offline_pinned("eve", &relay.url(), Some(&wrong)).await;
    let err = eve.try_call(Request::Inbox { all: false, wait_secs: 0 }).await.unwrap_err();
    assert_eq!(err, "relay");
    // And with no pin at all, a self-signed certificate is not trusted either.
    let frank = Peer::offline("frank", &relay.url()).await;
    assert_eq!(frank.try_call(Request::Inbox { all: false, wait_secs: 0 }).await.unwrap_err(), "relay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hundredth_stranger_request_is_kept_and_the_hundred_and_first_dropped() {
    let mut limits = relay_lite::Limits::default();
    limits.sends_per_minute = 0;
    limits.ip_requests_per_minute = 0;
    let relay = TestRelay::start_with(limits).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let max = usize::try_from(switchboard_core::engine::MAX_PENDING_REQUESTS).unwrap();
    for i in 0..=max {
        let f = Forger::new(&relay);
        let mut hello = f.inner(&bob.rt.keys(), Kind::Hello, json!(format!("stranger{i}")));
        hello.from = f.address();
        f.post(&bob, f.seal(&bob.rt.keys(), &hello)).await;
    }
    let pending = bob.call(Request::ContactRequests).await;
    assert_eq!(pending.as_array().unwrap().len(), max);
    assert_eq!(last_in_audit(&bob).await["detail"], "unknown_sender");
}

/// Ages the outbox entry of `id` by `hours` (its `created_at`) and makes it due: the give-up
/// rules read that time, so this stands in for a clock `hours` ahead.
async fn age_outbox(p: &Peer, id: &str, hours: i64) {
    sqlx::query("UPDATE outbox SET created_at = ?, next_attempt_at = 0 WHERE message_id = ?")
        .bind(now_ms() - hours * 3_600_000)
        .bind(id)
        .execute(&p.rt.store().pool)
        .await
        .unwrap();
}

/// Issue 12 §4: letagents gives a payload up after 48 h (receivers drop older envelopes), not
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_letagents_payload_the_relay_never_takes_is_given_up_after_48_hours() {
    let mut relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    befriend(&alice, &bob).await;
    relay.stop().await;
    let id = alice.send("bob", "while the relay is down").await;
    age_outbox(&alice, &id, 47).await;
    alice.try_call(Request::Flush).await.ok();
    assert_eq!(alice.state_of(&id).await, "queued", "47 h: still trying");
    age_outbox(&alice, &id, 49).await;
    alice.try_call(Request::Flush).await.ok();
    assert_eq!(alice.state_of(&id).await, "failed", "49 h: given up");
    let detail: String = sqlx::query_scalar("SELECT detail FROM messages WHERE id = ?")
        .bind(&id)
        .fetch_one(&alice.rt.store().pool)
        .await
        .unwrap();
    assert!(detail.starts_with("gave up after 48 h: unreachable"), "{detail}");
}
