//! Blocking senders on every protocol, through a real relay-lite over real HTTP: Agent Mail's
//! recipient policy applied to the verified actor before decryption (§7.2 step 1) and at the
//! relay (§7.4); letagents and Stringcup blocked locally; a denied request stays denied until the
//! owner unblocks it; a blocked sender's messages never reach an agent, and are counted and
//! audited; the owner blocks over the CLI and the bridge, agents may not.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use serde_json::{Value, json};
use switchboard_core::api::Request;
use switchboard_tests::{
    DaemonProcess, Peer, TestRelay, befriend, befriend_cli, bridge_of, bridge_rpc, home, switchboard, switchboard_ok,
};

fn block(name: &str) -> Request {
    Request::ContactBlock { name: name.into() }
}

fn unblock(name: &str) -> Request {
    Request::ContactUnblock { name: name.into() }
}

fn mail(contact: &str, text: &str) -> Request {
    Request::MailSend { contact: contact.into(), text: text.into(), subject: None, reply_to: None, attachments: vec![] }
}

async fn contact(p: &Peer, name: &str) -> Value {
    let all = p.call(Request::ContactList).await;
    all.as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap_or_else(|| panic!("no contact {name}"))
}

async fn requests(p: &Peer) -> Vec<String> {
    let reqs = p.call(Request::ContactRequests).await;
    reqs.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_owned()).collect()
}

/// Audit rows of `p` in `state`.
async fn audited(p: &Peer, state: &str) -> Vec<Value> {
    p.log().await.into_iter().filter(|r| r["state"] == state).collect()
}

/// Incoming message rows stored for `peer` (whatever their state).
async fn stored_from(p: &Peer, peer: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE direction = 'in' AND peer = ?")
        .bind(peer)
        .fetch_one(&p.rt.store().pool)
        .await
        .unwrap()
}

/// Digests are handed over at once (no tick to wait for).
async fn digest_now(p: &Peer) {
    p.call(Request::Policy { review: None, loop_limit: None, digest_secs: Some(0) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_mail_blocked_sender_is_refused_before_decryption_and_by_the_relay() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let alice_id = alice.call(Request::Whoami).await["agent_mail"]["agent_id"].as_str().unwrap().to_owned();
    let bob_address = bob.call(Request::Whoami).await["agent_mail"]["address"].as_str().unwrap().to_owned();
    alice.add_contact(&bob_address, "bob").await;
    alice.call(mail("bob", "first, as a stranger")).await;

    // A stranger's mail becomes a pending request, as on the other protocols.
    let name = {
        let reqs = bob.call(Request::ContactRequests).await;
        let r = reqs.as_array().unwrap().iter().find(|r| r["id"] == alice_id.as_str()).cloned().unwrap();
        r["name"].as_str().unwrap().to_owned()
    };
    assert_eq!(stored_from(&bob, &alice_id).await, 1, "held behind the request");

    // This one is accepted by the relay before the block: it waits in Bob's mailbox.
    let queued = alice.call(mail("bob", "second, already queued at the relay")).await;
    assert_eq!(queued["state"], "relayed");

    let blocked = bob.call(block(&name)).await;
    assert_eq!(blocked["blocked"], true);
    assert_eq!(blocked["relay_block"]["told"], true, "{blocked}");

    // The queued packet is refused by Bob's own policy on the verified actor, before opening.
    bob.call(Request::ContactList).await;
    let c = contact(&bob, &name).await;
    assert_eq!(c["blocked"], true);
    assert_eq!(c["blocked_dropped"], 1, "{c}");
    let rows = audited(&bob, "blocked").await;
    assert!(rows.iter().any(|r| r["peer"] == alice_id.as_str() && r["protocol"] == "agent-mail"), "{rows:?}");
    assert!(
        rows.iter().any(|r| r["detail"].as_str().unwrap().contains("sender_blocked")
            || r["detail"].as_str().unwrap().contains("blocked")),
        "{rows:?}"
    );
    assert_eq!(stored_from(&bob, &alice_id).await, 1, "nothing from a blocked sender is stored");
    assert!(bob.inbox(0).await.is_empty());
    // The held request mail is never released, and a blocked request cannot be accepted.
    assert!(requests(&bob).await.is_empty(), "a blocked sender is not a request");
    assert_eq!(
        bob.try_call(Request::ContactAccept { name: name.clone(), new_name: None }).await.unwrap_err(),
        "blocked_contact"
    );

    // The relay no longer accepts new packets from Alice (§7.4 permission_denied).
    let refused = alice.call(mail("bob", "third, after the block")).await;
    assert_eq!(refused["state"], "failed", "{refused}");
    assert!(refused["detail"].as_str().unwrap().contains("permission_denied"), "{refused}");

    // Unblocking at both ends: the request is back and new mail is accepted again.
    let unblocked = bob.call(unblock(&name)).await;
    assert_eq!(unblocked["blocked"], false);
    assert_eq!(unblocked["relay_block"]["told"], true);
    assert_eq!(requests(&bob).await, vec![name.clone()]);
    bob.call(Request::ContactAccept { name: name.clone(), new_name: None }).await;
    let fourth = alice.call(mail("bob", "fourth, welcome back")).await;
    assert_eq!(fourth["state"], "relayed", "{fourth}");
    let got = bob.inbox(0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["body"], "fourth, welcome back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_stays_denied_until_the_owner_unblocks() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    alice.add_contact(&bob.address().await, "bob").await;
    assert_eq!(requests(&bob).await, vec!["alice".to_owned()]);
    let denied = bob.call(Request::ContactDeny { name: "alice".into() }).await;
    assert_eq!(denied["denied"], "alice");
    assert_eq!(denied["blocked"], true);
    assert!(requests(&bob).await.is_empty());

    // The same stranger asks again at once: nothing comes back, the drop is counted.
    alice.send("bob", "please, let me in").await;
    alice.send("bob", "please, again").await;
    assert!(requests(&bob).await.is_empty(), "a denied stranger must not come back as a request");
    let c = contact(&bob, "alice").await;
    assert_eq!(c["blocked_dropped"], 2, "{c}");
    assert_eq!(audited(&bob, "blocked").await.len(), 2 + 1, "two drops and the owner's block");

    // Until the owner unblocks: then the request is back and can be accepted.
    bob.call(unblock("alice")).await;
    assert_eq!(requests(&bob).await, vec!["alice".to_owned()]);
    bob.call(Request::ContactAccept { name: "alice".into(), new_name: None }).await;
    alice.send("bob", "thanks").await;
    let got = bob.inbox(0).await;
    assert_eq!(got.last().unwrap()["body"], "thanks", "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_letagents_contact_never_reaches_an_agent() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    befriend(&alice, &bob).await;
    bob.open_session("coder").await;
    digest_now(&bob).await;
    alice.send("bob", "before").await;
    assert_eq!(bob.agent_wait("coder", 0).await.len(), 1);

    // Received but not yet handed to the agent when the owner blocks: taken out of its queue.
    alice.send("bob", "queued when blocked").await;
    bob.call(Request::ContactList).await;
    bob.call(block("alice")).await;
    assert!(bob.agent_wait("coder", 0).await.is_empty(), "a blocked contact's queued message must not be handed over");

    // Sent after the block: dropped on receipt, counted, audited, never stored or shown.
    alice.send("bob", "after").await;
    assert!(bob.agent_wait("coder", 0).await.is_empty());
    assert!(bob.inbox(0).await.iter().all(|m| m["body"] != "after"));
    let c = contact(&bob, "alice").await;
    assert_eq!(c["blocked_dropped"], 1);
    let rows = audited(&bob, "blocked").await;
    assert!(rows.iter().any(|r| r["protocol"] == "letagents" && r["direction"] == "in"), "{rows:?}");
    // Nothing is sent to a blocked contact either.
    let err = bob
        .try_call(Request::Send {
            contact: "alice".into(),
            text: "hi".into(),
            kind: None,
            reply_to: None,
            from_agent: None,
            to_agent: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err, "blocked_contact");
    // An agent may not unblock (or block): that is the operator's decision.
    assert_eq!(bob.as_agent("coder", unblock("alice")).await.unwrap_err(), "forbidden");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_stringcup_sender_is_dropped_before_decryption() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    alice.add_contact(&bob.stringcup_id().await, "bob").await;
    alice.send("bob", "hello over stringcup").await;
    assert_eq!(requests(&bob).await, vec!["alice".to_owned()]);
    bob.call(Request::ContactAccept { name: "alice".into(), new_name: None }).await;
    bob.open_session("coder").await;
    digest_now(&bob).await;
    assert_eq!(bob.agent_wait("coder", 0).await.len(), 1);

    let blocked = bob.call(block("alice")).await;
    assert_eq!(blocked["blocked"], true);
    assert_eq!(blocked["relay_block"], Value::Null, "Stringcup blocks locally only");
    alice.send("bob", "after the block").await;
    assert!(bob.agent_wait("coder", 0).await.is_empty());
    assert!(bob.inbox(0).await.iter().all(|m| m["body"] != "after the block"));
    assert_eq!(contact(&bob, "alice").await["blocked_dropped"], 1);
    let rows = audited(&bob, "blocked").await;
    assert!(rows.iter().any(|r| r["protocol"] == "stringcup" && r["direction"] == "in"), "{rows:?}");

    bob.call(unblock("alice")).await;
    alice.send("bob", "after the unblock").await;
    let got = bob.agent_wait("coder", 0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0]["text"].as_str().unwrap().contains("after the unblock"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_blocks_from_the_cli_and_over_the_bridge() {
    let relay = TestRelay::start().await;
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"));
    let (_a, alice) = home();
    let (_b, bob) = home();
    befriend_cli(&bin, &alice, &bob, &relay.url());

    let out = switchboard_ok(&bin, &bob, &["contact", "block", "alice"]);
    assert!(out.contains("BLOCKED"), "{out}");
    let out = switchboard_ok(&bin, &bob, &["contact", "list"]);
    assert!(out.contains("BLOCKED (0 dropped)"), "{out}");
    switchboard_ok(&bin, &alice, &["send", "bob", "text-from-a-blocked-sender"]);
    let out = switchboard_ok(&bin, &bob, &["inbox"]);
    assert!(!out.contains("text-from-a-blocked-sender"), "{out}");
    let out = switchboard_ok(&bin, &bob, &["contact", "list"]);
    assert!(out.contains("BLOCKED (1 dropped)"), "{out}");
    let (ok, _, err) = switchboard(&bin, &bob, &["send", "alice", "hi"]);
    assert!(!ok && err.contains("is blocked"), "{err}");
    let out = switchboard_ok(&bin, &bob, &["contact", "unblock", "alice"]);
    assert!(!out.contains("BLOCKED"), "{out}");

    // Over the bridge, as the owner.
    let daemon = DaemonProcess::start(&bin, &bob);
    let (url, _, token) = bridge_of(&bob);
    let v = bridge_rpc(&url, &token, &json!({"op": "contact_block", "name": "alice"})).await;
    assert_eq!(v["blocked"], true, "{v}");
    let v = bridge_rpc(&url, &token, &json!({"op": "contact_list"})).await;
    assert_eq!(v[0]["blocked"], true, "{v}");
    let v = bridge_rpc(&url, &token, &json!({"op": "contact_unblock", "name": "alice"})).await;
    assert_eq!(v["blocked"], false, "{v}");
    daemon.stop();
}
