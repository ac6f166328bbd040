//! One contact per person (issue 20) end to end over a real relay-lite: a pasted contact link
//! makes one person with a channel per protocol, messages over two protocols land in one
//! conversation, and a send whose channel's relay is down falls back to the next channel and
//! arrives once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use serde_json::Value;
use switchboard_core::api::Request;
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
    assert_eq!(mine[0]["moved_from"], "letagents", "{conv}");
    // The channel that failed shows as unreachable until a message gets through on it.
    let list = alice.call(Request::ContactList).await;
    let reach: Vec<(&str, bool)> = list[0]["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["protocol"].as_str().unwrap(), c["reachable"].as_bool().unwrap()))
        .collect();
    assert_eq!(reach, [("letagents", false), ("agent-mail", true), ("stringcup", true)], "{list}");
    // Nothing more arrives later: each channel was tried once.
    alice.call(Request::Flush).await;
    assert!(bob.inbox(0).await.iter().all(|m| m["body"] != "one message, one arrival"));
}

fn reply_request(contact: &str, text: &str, reply_to: &str) -> Request {
    Request::Send {
        contact: contact.into(),
        text: text.into(),
        kind: Some("reply".into()),
        reply_to: Some(reply_to.into()),
        from_agent: None,
        to_agent: None,
    }
}

/// Makes `id`'s outbox row look older than the fall-back delay, as if its relay had been down
/// that long.
async fn age_past_fall_back(p: &Peer, id: &str) {
    sqlx::query("UPDATE outbox SET created_at = created_at - ? WHERE message_id = ?")
        .bind(switchboard_core::engine::FALL_BACK_UNREACHABLE_AFTER_MS + 1_000)
        .bind(id)
        .execute(&p.rt.store().pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_to_a_person_goes_back_on_the_channel_its_message_came_on() {
    let mut relay = TestRelay::start().await;
    let (alice, bob) = alice_and_bob(&relay).await;
    // Bob writes on Agent Mail (his choice of channel); Alice replies to the person.
    bob.call(send_request("alice.agent-mail", "asked on agent mail")).await;
    let got = alice.inbox(0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["protocol"], "agent-mail");
    assert_eq!(got[0]["from"], "bob");
    let asked = got[0]["id"].as_str().unwrap().to_owned();
    let reply = alice.call(reply_request("bob", "answered where you asked", &asked)).await;
    assert_eq!(reply["protocol"], "agent-mail", "{reply}");
    let back = bob.inbox(0).await;
    let ours: Vec<&Value> = back.iter().filter(|m| m["body"] == "answered where you asked").collect();
    assert_eq!(ours.len(), 1, "{back:?}");
    assert_eq!(ours[0]["protocol"], "agent-mail");
    assert_eq!(ours[0]["reply_to"], asked.as_str());

    // A plain send still takes the first channel.
    assert_eq!(alice.call(send_request("bob", "a new subject")).await["protocol"], "letagents");

    // The reply's channel failing: it falls back from there (Agent Mail to Stringcup), not
    // back to letagents.
    relay.stop().await;
    let late = alice.call(reply_request("bob", "a reply while the relay is down", &asked)).await;
    assert_eq!(late["protocol"], "agent-mail");
    let late_id = late["id"].as_str().unwrap().to_owned();
    age_past_fall_back(&alice, &late_id).await;
    for _ in 0..3 {
        let _ = alice.try_call(Request::Flush).await;
    }
    let shown = alice.call(Request::Message { id: late_id }).await;
    assert_eq!(shown["state"], "rerouted", "{shown}");
    assert!(shown["detail"].as_str().unwrap().contains("sent on stringcup"), "{shown}");
    relay.restart().await;
    alice.call(Request::Flush).await;
    let got = bob.inbox(0).await;
    let late_in: Vec<&Value> = got.iter().filter(|m| m["body"] == "a reply while the relay is down").collect();
    assert_eq!(late_in.len(), 1, "{got:?}");
    assert_eq!(late_in[0]["protocol"], "stringcup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepting_a_request_takes_a_name_and_refuses_one_already_taken() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let carol = Peer::offline("carol", &relay.url()).await;
    let dave = Peer::offline("dave", &relay.url()).await;
    // Bob already has a contact `carol` and a person `dave`.
    bob.add_contact(&carol.address().await, "carol").await;
    bob.add_contact(&link_of(&dave).await, "dave").await;
    alice.add_contact(&bob.address().await, "bob").await;
    let reqs = bob.call(Request::ContactRequests).await;
    let reqs = reqs.as_array().unwrap();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let claimed = reqs[0]["name"].as_str().unwrap().to_owned();
    assert_eq!(claimed, "alice");

    for taken in ["carol", "dave"] {
        let accept = Request::ContactAccept { name: claimed.clone(), new_name: Some(taken.into()) };
        let err = bob.rt.handle(accept, true).await.unwrap_err();
        assert_eq!(err.code(), "contact_exists");
        assert!(err.to_string().contains(&format!("`{taken}` already exists")), "{err}");
    }
    // Still pending under the name it came with.
    assert_eq!(bob.call(Request::ContactRequests).await.as_array().unwrap().len(), 1);

    let accepted =
        bob.call(Request::ContactAccept { name: claimed.clone(), new_name: Some("Alice from work".into()) }).await;
    assert_eq!(accepted["name"], "Alice from work");
    assert_eq!(accepted["state"], "active");
    assert!(bob.call(Request::ContactRequests).await.as_array().unwrap().is_empty());
    // The new name is the one to write to; the claimed one is gone.
    alice.send("bob", "hello").await;
    let got = bob.inbox(0).await;
    assert_eq!(got.iter().filter(|m| m["body"] == "hello").count(), 1, "{got:?}");
    assert!(got.iter().all(|m| m["from"] == "Alice from work"), "{got:?}");
    bob.send("Alice from work", "hi").await;
    assert_eq!(bob.try_call(send_request(&claimed, "hi")).await.unwrap_err(), "unknown_contact");
}

/// Alice knows Bob twice, by two bare addresses (letagents and Agent Mail), and Bob knows her
/// the same way: two contacts each, before any merge.
async fn known_twice(relay: &TestRelay) -> (Peer, Peer) {
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let mail = |p: &Peer| {
        let rt = p.rt.clone();
        async move {
            let who = rt.handle(Request::Whoami, true).await.unwrap();
            who["agent_mail"]["address"].as_str().unwrap().to_owned()
        }
    };
    alice.add_contact(&bob.address().await, "bob").await;
    alice.add_contact(&mail(&bob).await, "bob-mail").await;
    bob.add_contact(&alice.address().await, "alice").await;
    bob.add_contact(&mail(&alice).await, "alice-mail").await;
    (alice, bob)
}

fn names(list: &Value) -> Vec<String> {
    list.as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merged_contact_receiving_on_two_protocols_shows_one_conversation() {
    let relay = TestRelay::start().await;
    let (alice, bob) = known_twice(&relay).await;
    bob.send("alice", "before the merge, on letagents").await;
    let _ = alice.inbox(0).await;
    let list = alice.call(Request::ContactList).await;
    assert_eq!(names(&list), ["bob", "bob-mail"]);
    let mail_number = list[1]["safety_number"].as_str().unwrap().to_owned();
    let la_number = list[0]["safety_number"].as_str().unwrap().to_owned();

    // Not compared: refused, with both numbers and the command that confirms.
    let merge = |confirm: Option<&str>| Request::ContactMerge {
        name: "bob".into(),
        other: "bob-mail".into(),
        confirm_safety_number: confirm.map(Into::into),
    };
    let err = alice.rt.handle(merge(None), true).await.unwrap_err();
    assert_eq!(err.code(), "safety_number_unconfirmed");
    let msg = err.to_string();
    assert!(msg.contains(&la_number) && msg.contains(&mail_number), "{msg}");
    assert!(msg.contains("--confirm-safety-number"), "{msg}");
    // A number that is not B's is no confirmation.
    assert_eq!(alice.try_call(merge(Some(&la_number))).await.unwrap_err(), "safety_number_unconfirmed");
    assert_eq!(names(&alice.call(Request::ContactList).await), ["bob", "bob-mail"]);

    // Confirmed: one contact with both channels.
    let person = alice.call(merge(Some(&mail_number))).await;
    assert_eq!(person["name"], "bob");
    assert_eq!(channels(&person), ["letagents", "agent-mail"]);
    let list = alice.call(Request::ContactList).await;
    assert_eq!(names(&list), ["bob"], "{list}");

    // Bob writes on both protocols; Alice writes to the one contact.
    bob.send("alice-mail", "after the merge, on agent mail").await;
    let mut got = alice.inbox(0).await;
    bob.send("alice", "after the merge, on letagents").await;
    got.extend(alice.inbox(0).await);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.iter().all(|m| m["from"] == "bob"), "{got:?}");
    alice.send("bob", "one conversation").await;

    let conv = alice.call(Request::Conversation { contact: "bob".into(), limit: None }).await;
    let seen: Vec<(&str, &str)> = conv
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["protocol"].as_str().unwrap(), m["body"].as_str().unwrap()))
        .filter(|(_, b)| !b.is_empty())
        .collect();
    assert_eq!(
        seen,
        [
            ("letagents", "before the merge, on letagents"),
            ("agent-mail", "after the merge, on agent mail"),
            ("letagents", "after the merge, on letagents"),
            ("letagents", "one conversation"),
        ],
        "{conv}"
    );

    // Split: the Agent Mail channel is a contact of its own again, with its own history.
    let split = alice.call(Request::ContactSplit { name: "bob".into(), protocol: "agent-mail".into() }).await;
    assert_eq!(channels(&split["person"]), ["letagents"]);
    let mail_name = split["contact"]["name"].as_str().unwrap().to_owned();
    assert_eq!(mail_name, "bob.agent-mail");
    assert_eq!(names(&alice.call(Request::ContactList).await), ["bob", "bob.agent-mail"]);
    let conv = alice.call(Request::Conversation { contact: "bob".into(), limit: None }).await;
    assert!(conv.as_array().unwrap().iter().all(|m| m["protocol"] == "letagents"), "{conv}");
    let conv = alice.call(Request::Conversation { contact: mail_name.clone(), limit: None }).await;
    let bodies: Vec<&str> = conv.as_array().unwrap().iter().filter_map(|m| m["body"].as_str()).collect();
    assert!(bodies.contains(&"after the merge, on agent mail"), "{conv}");
    // The last channel stays.
    let err = alice.try_call(Request::ContactSplit { name: "bob".into(), protocol: "letagents".into() }).await;
    assert_eq!(err.unwrap_err(), "invalid_input");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_keeps_one_channel_per_protocol_when_merged() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let carol = Peer::offline("carol", &relay.url()).await;
    alice.add_contact(&link_of(&bob).await, "bob").await;
    let c = alice.add_contact(&carol.address().await, "carol").await;
    let carol_number = c["safety_number"].as_str().unwrap().to_owned();
    // Confirmed, but Bob already has a letagents channel.
    let merge = Request::ContactMerge {
        name: "bob".into(),
        other: "carol".into(),
        confirm_safety_number: Some(carol_number.to_lowercase()),
    };
    let err = alice.rt.handle(merge, true).await.unwrap_err();
    assert_eq!(err.code(), "invalid_input");
    assert!(err.to_string().contains("one channel per protocol"), "{err}");
    assert_eq!(names(&alice.call(Request::ContactList).await), ["bob", "carol"]);
}

fn channel<'a>(person: &'a Value, protocol: &str) -> &'a Value {
    person["channels"].as_array().unwrap().iter().find(|c| c["protocol"] == protocol).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifying_a_person_verifies_every_channel_its_link_signed() {
    let relay = TestRelay::start().await;
    let (alice, _bob) = alice_and_bob(&relay).await;
    let person = alice.call(Request::ContactVerify { name: "bob".into() }).await;
    assert_eq!(person["verified"], true, "{person}");
    // The link carries the letagents keys and the Agent Mail identity; for Stringcup it names
    // the id only, whose key the relay serves: that channel is verified on its own.
    assert_eq!(channel(&person, "letagents")["verified"], true);
    assert_eq!(channel(&person, "agent-mail")["verified"], true);
    assert_eq!(channel(&person, "stringcup")["verified"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_a_person_blocks_every_channel() {
    let relay = TestRelay::start().await;
    let (alice, bob) = alice_and_bob(&relay).await;
    let person = alice.call(Request::ContactBlock { name: "bob".into() }).await;
    assert_eq!(person["blocked"], true, "{person}");
    for p in ["letagents", "agent-mail", "stringcup"] {
        assert_eq!(channel(&person, p)["blocked"], true, "{p}: {person}");
    }
    assert_eq!(alice.try_call(send_request("bob", "hi")).await.unwrap_err(), "blocked_contact");
    // Whatever channel Bob tries, nothing reaches Alice.
    bob.send("alice.agent-mail", "on agent mail").await;
    bob.send("alice.stringcup", "on stringcup").await;
    bob.send("alice", "on letagents").await;
    assert!(alice.inbox(0).await.is_empty());

    let person = alice.call(Request::ContactUnblock { name: "bob".into() }).await;
    assert_eq!(person["blocked"], false, "{person}");
    assert!(person["channels"].as_array().unwrap().iter().all(|c| c["blocked"] == false), "{person}");
    bob.send("alice.stringcup", "after the unblock").await;
    let got = alice.inbox(0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["body"], "after the unblock");
}
