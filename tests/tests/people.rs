//! One contact per person (issue 20) end to end over a real relay-lite: a pasted contact link
//! makes one person with a channel per protocol, messages over two protocols land in one
//! conversation, and a send whose channel's relay is down falls back to the next channel and
//! arrives once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use serde_json::Value;
use switchboard_core::bridge::api::Request;
use switchboard_tests::{Peer, TestRelay, send_request};

async fn link_of(p: &Peer) -> String {
    let who = p.call(Request::Whoami).await;
    who["contact_link"]["link"].as_str().expect("whoami offers a contact link").to_owned()
}

/// Alice and Bob on one relay, each having pasted the other's link.
async fn alice_and_bob(relay: &TestRelay) -> (Peer, Peer) {
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let (al, bl) = (link_of(&alice).await, link_of(&bob).await);
    alice.add_contact(&bl, "bob").await;
    bob.add_contact(&al, "alice").await;
    (alice, bob)
}

fn channels(person: &Value) -> Vec<String> {
    person["channels"].as_array().unwrap().iter().map(|c| c["protocol"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pasted_link_makes_one_contact_with_three_channels_and_one_safety_number() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let who = bob.call(Request::Whoami).await;
    let link = who["contact_link"]["link"].as_str().unwrap();
    assert!(link.starts_with("switchboard:sb1."), "{link}");
    // One safety number for the person: the one Bob's own device shows.
    assert_eq!(who["contact_link"]["safety_number"], who["letagents"]["safety_number"]);
    assert_eq!(who["contact_link"]["channels"], serde_json::json!(["letagents", "agent-mail", "stringcup"]));

    let person = alice.add_contact(link, "bob").await;
    assert_eq!(person["name"], "bob");
    assert_eq!(person["safety_number"], who["contact_link"]["safety_number"]);
    assert_eq!(channels(&person), ["letagents", "agent-mail", "stringcup"]);
    assert_eq!(person["skipped"], serde_json::json!([]));

    // `contact list`: one entry for Bob, holding his three channels.
    let list = alice.call(Request::ContactList).await;
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["name"], "bob");
    assert_eq!(channels(&list[0]), ["letagents", "agent-mail", "stringcup"]);

    // Pasting it again adds nothing; a bare protocol address still makes a contact of its own.
    let again = alice.add_contact(link, "bob").await;
    assert_eq!(channels(&again), ["letagents", "agent-mail", "stringcup"]);
    let carol = Peer::offline("carol", &relay.url()).await;
    let c = alice.add_contact(&carol.address().await, "carol").await;
    assert_eq!(c["protocol"], "letagents");
    assert_eq!(alice.call(Request::ContactList).await.as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_link_is_refused_with_a_clear_error() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let link = link_of(&bob).await;
    // One character of the signed payload changed: the signature no longer holds.
    let (head, sig) = link.rsplit_once('.').unwrap();
    let mut bytes = head.as_bytes().to_vec();
    let i = bytes.len() - 5;
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    let forged = format!("{}.{sig}", String::from_utf8(bytes).unwrap());
    let err = alice
        .try_call(Request::ContactAdd { address: forged, name: None, allow: None, relay: None, no_hello: false })
        .await
        .unwrap_err();
    assert_eq!(err, "invalid_contact_link");
    assert!(alice.call(Request::ContactList).await.as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_on_two_protocols_from_one_person_show_as_one_conversation() {
    let relay = TestRelay::start().await;
    let (alice, bob) = alice_and_bob(&relay).await;
    // Alice writes to the person: the first channel, letagents.
    let first = alice.call(send_request("bob", "hello bob")).await;
    assert_eq!(first["protocol"], "letagents");
    // Bob answers once on letagents and once on Agent Mail (by channel name).
    bob.call(send_request("alice", "hi on letagents")).await;
    bob.call(send_request("alice.agent-mail", "hi on agent mail")).await;
    let got = alice.inbox(0).await;
    let mut protocols: Vec<&str> = got.iter().map(|m| m["protocol"].as_str().unwrap()).collect();
    protocols.sort_unstable();
    assert_eq!(protocols, ["agent-mail", "letagents"], "{got:?}");

    let conv = alice.call(Request::Conversation { contact: "bob".into(), limit: None }).await;
    let bodies: Vec<&str> = conv.as_array().unwrap().iter().map(|m| m["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, ["hello bob", "hi on letagents", "hi on agent mail"]);
    assert!(conv.as_array().unwrap().iter().all(|m| m["from"] == "bob" || m["to"] == "bob"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_relay_down_a_send_falls_back_to_the_next_channel_and_arrives_once() {
    let mut relay = TestRelay::start().await;
    let (alice, bob) = alice_and_bob(&relay).await;
    // A brief outage moves nothing: every channel shares the one relay here, and the message
    // stays on its first channel (letagents authenticates its sender end to end).
    relay.stop().await;
    let brief = alice.call(send_request("bob", "sent during a brief outage")).await;
    let brief_id = brief["id"].as_str().unwrap().to_owned();
    for _ in 0..3 {
        let _ = alice.try_call(Request::Flush).await;
    }
    assert_eq!(alice.call(Request::Message { id: brief_id.clone() }).await["state"], "queued");
    relay.restart().await;
    alice.call(Request::Flush).await;
    let got = bob.inbox(0).await;
    let brief_in: Vec<&Value> = got.iter().filter(|m| m["body"] == "sent during a brief outage").collect();
    assert_eq!(brief_in.len(), 1, "{got:?}");
    assert_eq!(brief_in[0]["protocol"], "letagents");

    // A long one: the letagents row has waited past the fall-back delay, so it goes to Agent
    // Mail, where it waits (a fresh row) until the relay is back.
    relay.stop().await;
    let first = alice.call(send_request("bob", "one message, one arrival")).await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(first["protocol"], "letagents");
    sqlx::query("UPDATE outbox SET created_at = created_at - ? WHERE message_id = ?")
        .bind(switchboard_core::engine::FALL_BACK_UNREACHABLE_AFTER_MS + 1_000)
        .bind(&first_id)
        .execute(&alice.rt.store().pool)
        .await
        .unwrap();
    for _ in 0..3 {
        let _ = alice.try_call(Request::Flush).await;
    }
    let shown = alice.call(Request::Message { id: first_id.clone() }).await;
    assert_eq!(shown["state"], "rerouted", "{shown}");
    assert!(shown["detail"].as_str().unwrap().contains("sent on agent-mail"), "{shown}");

    relay.restart().await;
    alice.call(Request::Flush).await;
    let got = bob.inbox(0).await;
    let ours: Vec<&Value> = got.iter().filter(|m| m["body"] == "one message, one arrival").collect();
    assert_eq!(ours.len(), 1, "{got:?}");
    assert_eq!(ours[0]["protocol"], "agent-mail");
    assert_eq!(ours[0]["from"], "alice");

    // Alice's side: the conversation shows the message once, on the channel that carried it,
    // naming the one it was first queued under.
    let conv = alice.call(Request::Conversation { contact: "bob".into(), limit: None }).await;
    let mine: Vec<&Value> =
        conv.as_array().unwrap().iter().filter(|m| m["body"] == "one message, one arrival").collect();
    assert_eq!(mine.len(), 1, "{conv}");
    assert_eq!(mine[0]["protocol"], "agent-mail");
    assert_eq!(mine[0]["path"], "relay");
    assert_ne!(mine[0]["fallback_of"], "");
    // Nothing more arrives later: each channel was tried once.
    alice.call(Request::Flush).await;
    assert!(bob.inbox(0).await.iter().all(|m| m["body"] != "one message, one arrival"));
}
