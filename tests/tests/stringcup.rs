//! Stringcup v2 end to end: profiles registered on relay-lite's /api/v2, talking through it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
// relay_lite::Limits is raised field by field.
#![allow(clippy::field_reassign_with_default)]

use serde_json::Value;
use switchboard_core::api::Request;
use switchboard_tests::{Peer, TestRelay, send_request};

/// Bob and Carol, each a mutual Stringcup contact of `alice` (named "bob", "carol", "alice").
async fn bob_and_carol_know(alice: &Peer, relay: &TestRelay) -> (Peer, Peer) {
    let bob = Peer::offline("bob", &relay.url()).await;
    let carol = Peer::offline("carol", &relay.url()).await;
    let alice_id = alice.stringcup_id().await;
    for (p, n) in [(&bob, "bob"), (&carol, "carol")] {
        p.add_contact(&alice_id, "alice").await;
        alice.add_contact(&p.stringcup_id().await, n).await;
    }
    (bob, carol)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_message_is_held_as_a_request_then_both_sides_talk() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let who = bob.call(Request::Whoami).await;
    let bob_id = who["stringcup"]["id"].as_str().unwrap().to_owned();
    assert_eq!(who["stringcup"]["fingerprint_short"].as_str().unwrap().len(), 19);

    let c = alice.add_contact(&bob_id, "bob").await;
    assert_eq!(c["protocol"], "stringcup");
    // The fingerprint alice pinned is the one bob's own device computes.
    assert_eq!(c["safety_number"], who["stringcup"]["fingerprint_short"]);
    let sent = alice.call(send_request("bob", "hello over stringcup")).await;
    assert_eq!(sent["state"], "relayed");

    // Bob does not know alice: her message waits behind a contact request.
    assert!(bob.inbox(0).await.is_empty());
    let reqs = bob.call(Request::ContactRequests).await;
    assert_eq!(reqs[0]["name"], "alice");
    assert_eq!(reqs[0]["protocol"], "stringcup");
    bob.call(Request::ContactAccept { name: "alice".into(), new_name: None }).await;
    let got = bob.inbox(0).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["body"], "hello over stringcup");
    assert_eq!(got[0]["protocol"], "stringcup");

    bob.call(send_request("alice", "hi alice")).await;
    let got = alice.inbox(0).await;
    assert_eq!(got[0]["body"], "hi alice");
    assert_eq!(got[0]["from"], "bob");
    // Acked after the commit: nothing comes back.
    assert!(alice.inbox(0).await.is_empty());
    assert!(bob.inbox(0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_runtime_gets_stringcup_mail_through_the_long_poll() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::live("bob", &relay.url()).await;
    let alice_id = alice.stringcup_id().await;
    bob.add_contact(&alice_id, "alice").await; // bob knows alice: nothing is held
    alice.add_contact(&bob.stringcup_id().await, "bob").await;
    let started = std::time::Instant::now();
    alice.call(send_request("bob", "are you there?")).await;
    let got = bob.inbox(10).await;
    assert_eq!(got[0]["body"], "are you there?");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "long-poll did not wake promptly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_through_a_rendezvous_pins_each_others_keys() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let opened = alice.call(Request::PairOpen).await;
    let token = opened["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("rv-"));
    let t2 = token.clone();
    let (a, b) = tokio::join!(
        alice.call(Request::PairWait { token: token.clone(), name: Some("bob".into()), timeout_secs: 30 }),
        bob.call(Request::PairWait { token: t2, name: Some("alice".into()), timeout_secs: 30 }),
    );
    assert_eq!(a["status"], "paired");
    assert_eq!(b["status"], "paired");
    let bob_who = bob.call(Request::Whoami).await;
    assert_eq!(a["fingerprint_short"], bob_who["stringcup"]["fingerprint_short"]);
    assert_eq!(a["peer_id"], bob_who["stringcup"]["id"]);
    // Paired contacts talk at once, in both directions.
    alice.call(send_request("bob", "paired!")).await;
    assert_eq!(bob.inbox(0).await[0]["body"], "paired!");

    // A third identity cannot take a role in that rendezvous.
    let mallory = Peer::offline("mallory", &relay.url()).await;
    let err = mallory.try_call(Request::PairWait { token, name: None, timeout_secs: 5 }).await.unwrap_err();
    assert_eq!(err, "invalid_input");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_key_blocks_sending_until_verified() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let bob_id = bob.stringcup_id().await;
    alice.add_contact(&bob_id, "bob").await;
    // Bob's identity gets another key on the relay (re-keyed, or a relay substituting one).
    let secret = std::fs::read_to_string(bob.dir.path().join("profile/stringcup.secret")).unwrap();
    let stored: Value = serde_json::from_slice(&switchboard_core::util::b64u_decode(secret.trim()).unwrap()).unwrap();
    let new_key = data_encoding::BASE64.encode(&[9u8; 32]);
    let resp = reqwest::Client::new()
        .put(format!("{}/api/v2/identities", relay.url()))
        .bearer_auth(stored["token"].as_str().unwrap())
        .json(&serde_json::json!({"identity_public_key": new_key, "algo": "x25519"}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    assert_eq!(alice.try_call(send_request("bob", "still you?")).await.unwrap_err(), "key_changed");
    let c = &alice.call(Request::ContactList).await[0];
    assert_eq!(c["key_changed"], true);
    assert_ne!(c["new_safety_number"], c["safety_number"]);
    alice.call(Request::ContactVerify { name: "bob".into() }).await;
    alice.call(send_request("bob", "re-verified")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_send_is_stored_once_thanks_to_its_idempotency_key() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let (alice_id, bob_id) = (alice.stringcup_id().await, bob.stringcup_id().await);
    bob.add_contact(&alice_id, "alice").await;
    alice.add_contact(&bob_id, "bob").await;
    let id = alice.call(send_request("bob", "exactly once")).await["id"].as_str().unwrap().to_owned();
    // The relay stored it but the answer was lost: the outbox sends it again under the same
    // Idempotency-Key (here even re-encrypted, which B.2.6 allows).
    let pool = &alice.rt.store().pool;
    let bob_key: Vec<u8> =
        sqlx::query_scalar("SELECT box_pub FROM contacts WHERE name = 'bob'").fetch_one(pool).await.unwrap();
    let (header, ciphertext) = switchboard_core::protocol::stringcup::crypto::seal(
        &alice_id,
        &bob_id,
        &bob_key.try_into().unwrap(),
        "exactly once",
        &mut switchboard_core::util::OsRng,
    )
    .unwrap();
    let body =
        serde_json::to_vec(&serde_json::json!({"recipient_id": bob_id, "header": header, "ciphertext": ciphertext}))
            .unwrap();
    sqlx::query(
        "INSERT INTO outbox (message_id, protocol, kind, relay_url, target, drop_code, payload, next_attempt_at, created_at) \
         VALUES (?, 'stringcup', 'send', ?, ?, x'', ?, 0, 0)",
    )
    .bind(&id)
    .bind(relay.url())
    .bind(&bob_id)
    .bind(body)
    .execute(pool)
    .await
    .unwrap();
    alice.call(Request::Flush).await;
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox").fetch_one(pool).await.unwrap();
    assert_eq!(left, 0, "the replay counts as delivered");
    let got = bob.inbox(0).await;
    assert_eq!(got.len(), 1, "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_fans_out_in_one_batch_to_pinned_members() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let (bob, carol) = bob_and_carol_know(&alice, &relay).await;
    let topic = alice.call(Request::TopicCreate { members: vec!["bob".into(), "carol".into()] }).await;
    let topic = topic["topic"].as_str().unwrap().to_owned();
    assert!(topic.starts_with("tp-"));
    let r = alice.call(Request::TopicSend { topic, text: "standup in 5".into() }).await;
    assert_eq!(r["sent"], 2, "{r}");
    assert_eq!(r["skipped"].as_array().unwrap().len(), 0);
    assert_eq!(bob.inbox(0).await[0]["body"], "standup in 5");
    assert_eq!(carol.inbox(0).await[0]["body"], "standup in 5");
}

/// Issue 12 §4: the Stringcup plaintext is the text alone, so an ask, a reply-to and an agent
/// address are refused with a clear error instead of being recorded here and lost on the wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_stringcup_cannot_carry_is_refused_not_dropped() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    bob.add_contact(&alice.stringcup_id().await, "alice").await;
    alice.add_contact(&bob.stringcup_id().await, "bob").await;
    let first = alice.call(send_request("bob", "hello")).await;
    let first = first["id"].as_str().unwrap().to_owned();
    let refused = [
        (Some("ask"), None, None, "the kind (ask/reply)"),
        (Some("reply"), Some(first.clone()), None, "the kind (ask/reply)"),
        (None, Some(first.clone()), None, "which message this replies to"),
        (None, None, Some("coder".to_owned()), "the addressed agent"),
    ];
    for (kind, reply_to, to_agent, what) in refused {
        let req = Request::Send {
            contact: "bob".into(),
            text: "lost?".into(),
            kind: kind.map(Into::into),
            reply_to,
            from_agent: None,
            to_agent,
        };
        let e = alice.rt.handle(req, true).await.unwrap_err();
        assert_eq!(e.code(), "invalid_input");
        let e = e.to_string();
        assert!(e.contains("Stringcup carries only the text") && e.contains(what), "{e}");
    }
    let got: Vec<String> = bob.inbox(0).await.iter().map(|m| m["body"].as_str().unwrap().to_owned()).collect();
    assert_eq!(got, vec!["hello".to_owned()], "only the plain message was sent");
}

/// Issue 12 §4: a live sender's outbox must not post a topic message on its own while the batch
/// posts the same payload (the batch carries no Idempotency-Key, so the relay would store both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sender_fans_out_a_topic_message_exactly_once_per_member() {
    let relay = TestRelay::start().await;
    let alice = Peer::live("alice", &relay.url()).await;
    let (bob, carol) = bob_and_carol_know(&alice, &relay).await;
    let topic = alice.call(Request::TopicCreate { members: vec!["bob".into(), "carol".into()] }).await;
    let topic = topic["topic"].as_str().unwrap().to_owned();
    for round in 0..5 {
        let text = format!("standup {round}");
        let r = alice.call(Request::TopicSend { topic: topic.clone(), text: text.clone() }).await;
        assert_eq!(r["sent"].as_u64().unwrap() + r["queued"].as_u64().unwrap(), 2, "{r}");
    }
    // Whatever the batch left queued goes out through the outbox; then nothing is left.
    assert!(alice.eventually(10, || async { alice.rt.store().outbox_len().await.unwrap() == 0 }).await);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for p in [&bob, &carol] {
        let bodies: Vec<String> = p.inbox(0).await.iter().map(|m| m["body"].as_str().unwrap().to_owned()).collect();
        let want: Vec<String> = (0..5).map(|r| format!("standup {r}")).collect();
        let mut sorted = bodies.clone();
        sorted.sort();
        assert_eq!(sorted, want, "{}: each topic message exactly once, got {bodies:?}", p.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_two_kinds_of_507_are_told_apart() {
    let mut limits = relay_lite::Limits::default();
    limits.stringcup.inbox_max_pending_per_sender = 2;
    limits.stringcup.inbox_max_pending_messages = 3;
    let relay = TestRelay::start_with(limits).await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let carol = Peer::offline("carol", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let bob_id = bob.stringcup_id().await;
    alice.add_contact(&bob_id, "bob").await;
    carol.add_contact(&bob_id, "bob").await;
    alice.call(send_request("bob", "1")).await;
    alice.call(send_request("bob", "2")).await;
    let third = alice.call(send_request("bob", "3")).await;
    assert_eq!(third["state"], "queued");
    let outbox: (String,) = sqlx::query_as("SELECT last_error FROM outbox WHERE message_id = ?")
        .bind(third["id"].as_str().unwrap())
        .fetch_one(&alice.rt.store().pool)
        .await
        .unwrap();
    assert!(outbox.0.contains("the recipient is not behind"), "{}", outbox.0);

    carol.call(send_request("bob", "c1")).await;
    let c2 = carol.call(send_request("bob", "c2")).await;
    let outbox: (String,) = sqlx::query_as("SELECT last_error FROM outbox WHERE message_id = ?")
        .bind(c2["id"].as_str().unwrap())
        .fetch_one(&carol.rt.store().pool)
        .await
        .unwrap();
    assert!(outbox.0.contains("the recipient is behind"), "{}", outbox.0);
}

/// Issue 12 §4: a 507 is "not stored yet", never a permanent failure (B.3.6): a message refused
/// for 30 days (its outbox entry aged so) is still queued, and goes out once the inbox drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stringcup_507_is_retried_however_long_it_lasts() {
    let mut limits = relay_lite::Limits::default();
    limits.stringcup.inbox_max_pending_per_sender = 1;
    let relay = TestRelay::start_with(limits).await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    bob.add_contact(&alice.stringcup_id().await, "alice").await;
    alice.add_contact(&bob.stringcup_id().await, "bob").await;
    alice.call(send_request("bob", "1")).await;
    let second = alice.call(send_request("bob", "2")).await;
    let second = second["id"].as_str().unwrap().to_owned();
    assert_eq!(alice.state_of(&second).await, "queued");
    sqlx::query("UPDATE outbox SET created_at = ?, next_attempt_at = 0 WHERE message_id = ?")
        .bind(switchboard_core::util::now_ms() - 30 * 86_400_000)
        .bind(&second)
        .execute(&alice.rt.store().pool)
        .await
        .unwrap();
    alice.call(Request::Flush).await;
    assert_eq!(alice.state_of(&second).await, "queued", "a 507 is never given up");
    assert_eq!(bob.inbox(0).await[0]["body"], "1");
    alice.call(Request::Flush).await;
    assert_eq!(alice.state_of(&second).await, "relayed");
    assert_eq!(bob.inbox(0).await[0]["body"], "2");
}

/// Issue 12 §4 (B.8): the client reads the inbox budget relay-lite advertises and paces on it;
/// once it is spent, the 429 says when to come back. (The receive loop's use of both is in
/// `stringcup_receive_loop`; `Budget::pace_ms` is unit-tested in core.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_budget_is_read_from_the_relay_and_a_429_says_when_to_return() {
    use switchboard_core::transport::TransportError;
    use switchboard_core::transport::letagents::RelayClient;
    use switchboard_core::transport::stringcup::StringcupClient;
    let mut limits = relay_lite::Limits::default();
    limits.stringcup.inbox_requests_per_hour = 3;
    let relay = TestRelay::start_with(limits).await;
    let client = StringcupClient::new(&RelayClient::new(&relay.url(), None).unwrap());
    let key = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([7u8; 32]));
    let me = client.register(&data_encoding::BASE64.encode(key.as_bytes()), "pacer").await.unwrap();
    let now = switchboard_core::util::now_ms();
    for left in [2, 1, 0] {
        let (_, _, budget) = client.inbox(&me.api_token, 0).await.unwrap();
        assert_eq!(budget.remaining, Some(left));
        let pause = budget.pace_ms(now).expect("fewer than PACE_BELOW left: paced");
        assert!(pause > 0 && pause <= 3_600_000, "{pause}");
    }
    match client.inbox(&me.api_token, 0).await {
        Err(TransportError::Status { status: 429, retry_after: Some(secs), .. }) => assert!(secs > 0 && secs <= 3600),
        other => panic!("expected a 429 with Retry-After, got {other:?}"),
    }
}

/// Issue 12 §4: the topic commands of B.3.4 a user could not reach: list, add, remove, leave,
/// delete, each through real relay-lite; and a pairing that times out gives its claim back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_can_be_listed_changed_left_and_deleted() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let (bob, carol) = bob_and_carol_know(&alice, &relay).await;
    let t = alice.call(Request::TopicCreate { members: vec!["bob".into()] }).await;
    let topic = t["topic"].as_str().unwrap().to_owned();
    let listed = alice.call(Request::TopicList).await;
    assert_eq!(listed, serde_json::json!([{"topic": topic, "owner": "me", "members": 2}]));
    let seen_by_bob = bob.call(Request::TopicList).await;
    assert_eq!(seen_by_bob[0]["owner"], "alice", "the owner by our contact name: {seen_by_bob}");

    let added =
        alice.call(Request::TopicAdd { topic: topic.clone(), members: vec!["carol".into(), "bob".into()] }).await;
    assert_eq!((added["added"].as_u64(), added["already_member"].as_u64()), (Some(1), Some(1)), "{added}");
    assert_eq!(carol.call(Request::TopicList).await.as_array().unwrap().len(), 1);
    let not_a_contact =
        alice.try_call(Request::TopicAdd { topic: topic.clone(), members: vec!["mallory".into()] }).await;
    assert_eq!(not_a_contact.unwrap_err(), "unknown_contact");

    alice.call(Request::TopicRemove { topic: topic.clone(), member: Some("carol".into()) }).await;
    assert_eq!(carol.call(Request::TopicList).await, serde_json::json!([]));
    bob.call(Request::TopicRemove { topic: topic.clone(), member: None }).await;
    assert_eq!(bob.call(Request::TopicList).await, serde_json::json!([]), "bob left");
    assert_eq!(alice.call(Request::TopicList).await[0]["members"], 1);
    let not_owner = bob.try_call(Request::TopicDelete { topic: topic.clone() }).await;
    assert!(not_owner.is_err(), "only the owner deletes: {not_owner:?}");
    alice.call(Request::TopicDelete { topic: topic.clone() }).await;
    assert_eq!(alice.call(Request::TopicList).await, serde_json::json!([]));

    // A pairing nobody joins times out and releases the claim: the relay forgets the rendezvous,
    // so the token cannot be completed later behind alice's back.
    let opened = alice.call(Request::PairOpen).await;
    let token = opened["token"].as_str().unwrap().to_owned();
    let waited = alice.call(Request::PairWait { token: token.clone(), name: None, timeout_secs: 1 }).await;
    assert_eq!((waited["status"].as_str(), waited["released"].as_bool()), (Some("timeout"), Some(true)), "{waited}");
    let late = bob.rt.handle(Request::PairWait { token, name: None, timeout_secs: 1 }, true).await.unwrap_err();
    assert!(late.to_string().contains("no such rendezvous"), "{late}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_is_saved_and_keeps_working() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    bob.add_contact(&alice.stringcup_id().await, "alice").await;
    alice.add_contact(&bob.stringcup_id().await, "bob").await;
    let path = alice.dir.path().join("profile/stringcup.secret");
    let before = std::fs::read(&path).unwrap();
    let r = alice.call(Request::TokenRotate).await;
    assert_eq!(r["rotated"], true);
    assert_ne!(std::fs::read(&path).unwrap(), before, "the new token is durable");
    alice.call(send_request("bob", "after rotation")).await;
    assert_eq!(bob.inbox(0).await[0]["body"], "after rotation");
    // A reopened runtime uses the saved token.
    let (profile, _dir) = alice.close();
    let rt = switchboard_core::engine::Runtime::open(&profile).await.unwrap();
    let v = rt.handle(send_request("bob", "after reopen"), true).await.unwrap();
    assert_eq!(v["state"], "relayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hundredth_stranger_is_held_and_the_hundred_and_first_dropped() {
    use switchboard_core::protocol::stringcup::crypto;
    let mut limits = relay_lite::Limits::default();
    limits.ip_requests_per_minute = 0;
    limits.stringcup.registrations_per_hour_per_ip = 10_000;
    limits.stringcup.inbox_max_pending_messages = 10_000;
    let relay = TestRelay::start_with(limits).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let bob_id = bob.stringcup_id().await;
    let record: Value =
        reqwest::get(format!("{}/api/v2/identities/{bob_id}", relay.url())).await.unwrap().json().await.unwrap();
    let bob_key = crypto::decode_public_key(record["identity_public_key"].as_str().unwrap()).unwrap();
    let http = reqwest::Client::new();
    let max = usize::try_from(switchboard_core::engine::MAX_PENDING_REQUESTS).unwrap();
    for i in 0..=max {
        let key = data_encoding::BASE64.encode(&[u8::try_from(i % 250).unwrap() + 1; 32]);
        let reg: Value = http
            .post(format!("{}/api/v2/identities", relay.url()))
            .json(&serde_json::json!({"identity_public_key": key, "algo": "x25519", "display_name": format!("s{i}")}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = reg["id"].as_str().unwrap();
        let (header, ciphertext) =
            crypto::seal(id, &bob_id, &bob_key, "hi", &mut switchboard_core::util::OsRng).unwrap();
        let r = http
            .post(format!("{}/api/v2/messages", relay.url()))
            .bearer_auth(reg["api_token"].as_str().unwrap())
            .json(&serde_json::json!({"recipient_id": bob_id, "header": header, "ciphertext": ciphertext}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let pending = bob.call(Request::ContactRequests).await;
    assert_eq!(pending.as_array().unwrap().len(), max);
    let dropped =
        bob.log().await.iter().filter(|r| r["detail"].as_str().unwrap_or("").contains("too many pending")).count();
    assert_eq!(dropped, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_update_keeps_the_id_opens_mail_sealed_to_the_old_key_and_contacts_must_verify_anew() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let alice_id = alice.stringcup_id().await;
    bob.add_contact(&alice_id, "alice").await;
    alice.add_contact(&bob.stringcup_id().await, "bob").await;
    let before = alice.call(Request::Whoami).await["stringcup"].clone();
    // Sealed to the key alice has now, and still in her inbox when the key changes.
    bob.call(send_request("alice", "sealed to the old key")).await;

    let r = alice.call(Request::StringcupKeyUpdate).await;
    assert_eq!(r["updated"], true, "{r}");
    assert_eq!(r["previous_fingerprint"], before["fingerprint"]);
    let after = alice.call(Request::Whoami).await["stringcup"].clone();
    assert_eq!(after["id"], before["id"], "same identity, same inbox");
    assert_ne!(after["fingerprint"], before["fingerprint"]);
    assert_eq!(after["fingerprint"], r["fingerprint"]);
    // The relay serves the new key.
    let served: Value =
        reqwest::get(format!("{}/api/v2/identities/{alice_id}", relay.url())).await.unwrap().json().await.unwrap();
    let key = data_encoding::BASE64.decode(served["identity_public_key"].as_str().unwrap().as_bytes()).unwrap();
    assert_eq!(
        switchboard_core::protocol::stringcup::crypto::fingerprint(&key),
        after["fingerprint"].as_str().unwrap()
    );

    // A reopened runtime still opens what was sealed to the old key (the old key was saved).
    let (profile, _dir) = alice.close();
    let rt = switchboard_core::engine::Runtime::open(&profile).await.unwrap();
    let got = rt.handle(Request::Inbox { all: false, wait_secs: 0 }, true).await.unwrap();
    assert_eq!(got[0]["body"], "sealed to the old key", "{got}");

    // Bob pinned the old key: he is stopped until he verifies the new one.
    assert_eq!(bob.try_call(send_request("alice", "still you?")).await.unwrap_err(), "key_changed");
    let c = &bob.call(Request::ContactList).await[0];
    assert_eq!(c["key_changed"], true);
    bob.call(Request::ContactVerify { name: "alice".into() }).await;
    bob.call(send_request("alice", "to the new key")).await;
    let got = rt.handle(Request::Inbox { all: false, wait_secs: 0 }, true).await.unwrap();
    assert!(got.as_array().unwrap().iter().any(|m| m["body"] == "to the new key"), "{got}");
    rt.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_update_whose_answer_is_lost_is_settled_by_the_next_one() {
    let mut relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let alice_id = alice.stringcup_id().await;
    bob.add_contact(&alice_id, "alice").await;
    alice.add_contact(&bob.stringcup_id().await, "bob").await;
    let before = alice.call(Request::Whoami).await["stringcup"]["fingerprint"].clone();
    let stored = || -> Value {
        let secret = std::fs::read_to_string(alice.dir.path().join("profile/stringcup.secret")).unwrap();
        serde_json::from_slice(&switchboard_core::util::b64u_decode(secret.trim()).unwrap()).unwrap()
    };

    // The relay is gone while the update runs: it fails, the new key stays saved as pending.
    relay.stop().await;
    assert!(alice.try_call(Request::StringcupKeyUpdate).await.is_err());
    assert_eq!(alice.call(Request::Whoami).await["stringcup"]["fingerprint"], before, "not current yet");
    let pending = stored()["pending"].as_str().expect("the pending key is durable").to_owned();
    // Say the relay had taken it after all (the answer was what got lost).
    relay.restart().await;
    let secret: [u8; 32] = switchboard_core::util::b64u_decode(&pending).unwrap().try_into().unwrap();
    let public = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(secret));
    let put = reqwest::Client::new()
        .put(format!("{}/api/v2/identities", relay.url()))
        .bearer_auth(stored()["token"].as_str().unwrap())
        .json(&serde_json::json!({"identity_public_key": data_encoding::BASE64.encode(public.as_bytes()), "algo": "x25519"}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success());
    // Bob verifies the key the relay serves and seals to it: alice opens it with the pending key.
    bob.try_call(send_request("alice", "probe")).await.unwrap_err();
    bob.call(Request::ContactVerify { name: "alice".into() }).await;
    bob.call(send_request("alice", "sealed to the pending key")).await;
    assert_eq!(alice.inbox(0).await[0]["body"], "sealed to the pending key");

    // The next update finds the relay holding the pending key, keeps it as an old key, and goes on.
    bob.call(send_request("alice", "in flight during the second update")).await;
    let r = alice.call(Request::StringcupKeyUpdate).await;
    let pending_fp = switchboard_core::protocol::stringcup::crypto::fingerprint(public.as_bytes());
    assert_eq!(r["previous_fingerprint"], pending_fp.as_str(), "the key the relay held is the one replaced: {r}");
    assert!(stored().get("pending").is_none(), "settled");
    assert_eq!(stored()["previous"].as_array().unwrap().len(), 2, "the pending key and the first one are kept");
    assert!(alice.inbox(0).await.iter().any(|m| m["body"] == "in flight during the second update"));
}
