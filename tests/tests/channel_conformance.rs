//! One behaviour, every 1:1 channel: the same checks run over letagents, Stringcup and Agent Mail
//! (one test per channel from the `conformance!` macro), two real runtimes through a real
//! relay-lite over HTTP. What the engine promises whichever protocol carries a message: a
//! stranger becomes a contact only when the owner accepts its request; messages are shown exactly
//! once; an answer goes back on the same channel; a message sent while the relay is down is kept
//! (`queued`) and goes out once it is back, arriving once; a blocked contact's messages are never
//! shown. Where the seeds differ the channel says so ([`Channel::hello`]); protocol-specific
//! behaviour stays in each protocol's own suite.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use serde_json::Value;
use switchboard_core::api::Request;
use switchboard_tests::{Peer, TestRelay, send_request};

/// A channel under test: its protocol's name in DTOs and where `whoami` shows an address for it.
#[derive(Clone, Copy)]
struct Channel {
    protocol: &'static str,
    section: &'static str,
    field: &'static str,
    /// Adding a contact introduces us (letagents' hello), and the request is that hello: a
    /// message sent before the peer accepts is dropped (the seed's `not_accepted`). Otherwise the
    /// first message is the request, held until the peer accepts and then shown.
    hello: bool,
}

const LETAGENTS: Channel = Channel { protocol: "letagents", section: "letagents", field: "address", hello: true };
const STRINGCUP: Channel = Channel { protocol: "stringcup", section: "stringcup", field: "id", hello: false };
const AGENT_MAIL: Channel = Channel { protocol: "agent-mail", section: "agent_mail", field: "address", hello: false };

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod letagents {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::LETAGENTS).await
            })*
        }
        mod stringcup {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::STRINGCUP).await
            })*
        }
        mod agent_mail {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::AGENT_MAIL).await
            })*
        }
    };
}

conformance!(
    a_stranger_becomes_a_contact_once_accepted_then_both_sides_talk_once,
    a_message_sent_while_the_relay_is_down_is_kept_and_arrives_once,
    a_blocked_contacts_messages_are_never_shown,
);

async fn address(p: &Peer, ch: Channel) -> String {
    let who = p.call(Request::Whoami).await;
    who[ch.section][ch.field].as_str().unwrap_or_else(|| panic!("whoami has no {} address: {who}", ch.protocol)).into()
}

/// Alice adds Bob by `ch`'s address; Bob accepts the request that makes (the hello, or Alice's
/// first message, `first`). Bob is then shown `first` once, whichever way it went. Returns the
/// name Bob knows Alice by.
async fn introduce(alice: &Peer, bob: &Peer, ch: Channel) -> String {
    let contact = alice.add_contact(&address(bob, ch).await, "bob").await;
    assert_eq!(contact["protocol"], ch.protocol, "{contact}");
    assert!(contact["safety_number"].as_str().is_some_and(|s| !s.is_empty()), "{contact}");
    if !ch.hello {
        alice.send("bob", "first").await;
    }
    let mut request = Value::Null;
    for _ in 0..200 {
        let reqs = bob.call(Request::ContactRequests).await;
        if let Some(r) = reqs.as_array().unwrap().iter().find(|r| r["protocol"] == ch.protocol) {
            request = r.clone();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!request.is_null(), "bob never saw a {} request", ch.protocol);
    let name = request["name"].as_str().unwrap().to_owned();
    bob.call(Request::ContactAccept { name: name.clone(), new_name: None }).await;
    if ch.hello {
        alice.send("bob", "first").await;
    }
    name
}

/// Every message shown within `secs`, polling (an offline peer syncs on each call).
async fn texts(p: &Peer, want: usize, secs: u64) -> Vec<String> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline && got.len() < want {
        for m in p.inbox(0).await {
            got.push(m["body"].as_str().unwrap_or_default().to_owned());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    got
}

async fn a_stranger_becomes_a_contact_once_accepted_then_both_sides_talk_once(ch: Channel) {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let alice_as = introduce(&alice, &bob, ch).await;
    assert_eq!(texts(&bob, 1, 10).await, ["first"]);
    // Shown once: nothing comes back on the next read.
    assert!(bob.inbox(0).await.is_empty());

    // The answer goes back on the same channel.
    bob.send(&alice_as, "back").await;
    let got = alice.inbox(0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0]["body"].as_str(), got[0]["protocol"].as_str()), (Some("back"), Some(ch.protocol)));
    assert!(alice.inbox(0).await.is_empty());
}

async fn a_message_sent_while_the_relay_is_down_is_kept_and_arrives_once(ch: Channel) {
    let mut relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    introduce(&alice, &bob, ch).await;
    assert_eq!(texts(&bob, 1, 10).await, ["first"]);

    relay.stop().await;
    let id = alice.send("bob", "while down").await;
    assert_eq!(alice.state_of(&id).await, "queued");
    relay.restart().await;
    // An offline runtime sends what it queued when asked to (a daemon's outbox worker retries).
    let sent = alice
        .eventually(20, || async {
            let _ = alice.try_call(Request::Flush).await;
            alice.state_of(&id).await != "queued"
        })
        .await;
    assert!(sent, "still queued after the relay came back");
    assert_eq!(texts(&bob, 1, 10).await, ["while down"]);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(bob.inbox(0).await.is_empty(), "arrived twice");
}

async fn a_blocked_contacts_messages_are_never_shown(ch: Channel) {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let alice_as = introduce(&alice, &bob, ch).await;
    assert_eq!(texts(&bob, 1, 10).await, ["first"]);

    bob.call(Request::ContactBlock { name: alice_as.clone() }).await;
    // Alice is not told; what she sends is dropped (at the relay, or by Bob on arrival).
    let _ = alice.try_call(send_request("bob", "after the block")).await;
    assert!(texts(&bob, 1, 2).await.is_empty(), "a blocked contact's message was shown");
    bob.call(Request::ContactUnblock { name: alice_as }).await;
    alice.send("bob", "after the unblock").await;
    assert_eq!(texts(&bob, 1, 10).await, ["after the unblock"]);
}
