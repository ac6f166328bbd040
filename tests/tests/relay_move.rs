//! Moving a profile to another relay (`relay move`, Settings → Relay): two real relay-lite
//! instances over HTTP and real runtimes. A profile that nobody reaches yet moves, and is then
//! reachable on the new relay on every 1:1 channel, live (its receive loops start again there)
//! and after a restart; the old relay is left behind. A move that would cut contacts off, or to a
//! relay that does not answer, is refused and changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use serde_json::Value;
use switchboard_core::api::Request;
use switchboard_tests::{Peer, TestRelay, befriend};

fn move_to(url: &str) -> Request {
    Request::RelayMove { url: url.into(), cert_sha256: None }
}

/// Bob (on the new relay) adds Alice by the address `who` shows in `section`/`field` and sends
/// `text`; Alice accepts the request that makes and is shown `text` (letagents' hello is the
/// request there, so its text follows the acceptance).
async fn reach(alice: &Peer, bob: &Peer, who: &Value, section: &str, field: &str, protocol: &str, text: &str) {
    let address = who[section][field].as_str().unwrap_or_else(|| panic!("no {section} address: {who}"));
    let name = format!("alice-{section}");
    let c = bob.add_contact(address, &name).await;
    assert_eq!(c["protocol"], protocol, "{c}");
    let hello = protocol == "letagents";
    if !hello {
        bob.send(&name, text).await;
    }
    let mut request = Value::Null;
    for _ in 0..200 {
        let reqs = alice.call(Request::ContactRequests).await;
        if let Some(r) = reqs.as_array().unwrap().iter().find(|r| r["protocol"] == protocol) {
            request = r.clone();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!request.is_null(), "alice never saw bob's {protocol} request on the new relay");
    alice.call(Request::ContactAccept { name: request["name"].as_str().unwrap().into(), new_name: None }).await;
    if hello {
        bob.send(&name, text).await;
    }
    let mut got = Vec::new();
    for _ in 0..200 {
        got.extend(alice.inbox(0).await.into_iter().filter(|m| m["protocol"] == protocol));
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!got.is_empty(), "bob's {protocol} message never reached alice on the new relay");
    // Shown once.
    got.extend(alice.inbox(0).await.into_iter().filter(|m| m["protocol"] == protocol));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["body"], text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_nobody_reaches_yet_moves_and_is_reached_on_the_new_relay_on_every_channel() {
    let old = TestRelay::start().await;
    let new = TestRelay::start().await;
    // Live: its receive loops run on the old relay when the move happens.
    let alice = Peer::live("alice", &old.url()).await;
    let before = alice.call(Request::Whoami).await;
    let old_stringcup = before["stringcup"]["id"].as_str().unwrap().to_owned();
    assert_eq!(before["letagents"]["relay"], old.url().trim_end_matches('/'));

    let who = alice.call(move_to(&new.url())).await;
    let new_url = new.url().trim_end_matches('/').to_owned();
    assert_eq!(who["letagents"]["relay"], new_url, "{who}");
    // The letagents identity stays (its mailbox id is its key); the relay-assigned Stringcup
    // identity is a new one from the new relay; the Agent Mail card now routes there.
    assert_eq!(who["letagents"]["address"], before["letagents"]["address"]);
    let sc = who["stringcup"]["id"].as_str().expect("a Stringcup identity on the new relay");
    assert_ne!(sc, old_stringcup);
    assert_eq!(who["stringcup"]["relay"], format!("{new_url}/api/v2"));
    assert!(who["agent_mail"]["relay"].as_str().unwrap().ends_with(&new_url.replace("http://", "")), "{who}");
    let status = alice.call(Request::Status).await;
    assert_eq!(status["relays"][0]["url"], new_url);

    // Bob lives on the new relay only; he reaches Alice there on each channel, and she (live,
    // her receivers started again on the new relay) sees each message once.
    let bob = Peer::offline("bob", &new.url()).await;
    reach(&alice, &bob, &who, "letagents", "address", "letagents", "hello over letagents").await;
    reach(&alice, &bob, &who, "stringcup", "id", "stringcup", "hello over stringcup").await;
    reach(&alice, &bob, &who, "agent_mail", "address", "agent-mail", "hello over agent mail").await;

    // The move is durable: opened again, the profile is on the new relay with the same identities.
    let (profile, dir) = alice.close();
    let alice = Peer::reopen("alice", profile, dir).await;
    let again = alice.call(Request::Whoami).await;
    assert_eq!(again["letagents"]["relay"], new_url);
    assert_eq!(again["stringcup"]["id"], sc);
    assert_eq!(again["agent_mail"]["address"], who["agent_mail"]["address"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_that_would_cut_contacts_off_is_refused_and_changes_nothing() {
    let old = TestRelay::start().await;
    let new = TestRelay::start().await;
    let alice = Peer::offline("alice", &old.url()).await;
    let carol = Peer::offline("carol", &old.url()).await;
    befriend(&carol, &alice).await;
    let before = alice.call(Request::Whoami).await;

    assert_eq!(alice.try_call(move_to(&new.url())).await.unwrap_err(), "relay_in_use");
    let err = alice.rt.handle(move_to(&new.url()), true).await.unwrap_err();
    assert!(err.to_string().starts_with("1 contact reaches you through the relay at"), "{err}");
    // Clients get the counts as data, not only as words.
    let old_url = old.url().trim_end_matches('/').to_owned();
    assert_eq!(err.to_api().data, Some(serde_json::json!({"url": old_url, "contacts": 1, "groups": 0})));
    assert_eq!(alice.call(Request::Whoami).await, before);
    // Still reachable where carol sends.
    carol.send("alice", "still here?").await;
    let ok = alice.eventually(10, || async { alice.inbox(0).await.iter().any(|m| m["body"] == "still here?") }).await;
    assert!(ok, "alice lost carol after a refused move");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_does_not_answer_is_refused_and_the_profile_stays() {
    let old = TestRelay::start().await;
    let mut gone = TestRelay::start().await;
    let gone_url = gone.url();
    gone.stop().await;
    let alice = Peer::offline("alice", &old.url()).await;
    let before = alice.call(Request::Whoami).await;

    assert_eq!(alice.try_call(move_to(&gone_url)).await.unwrap_err(), "relay");
    assert_eq!(alice.try_call(move_to("ftp://nowhere")).await.unwrap_err(), "invalid_input");
    assert_eq!(alice.try_call(move_to(&old.url())).await.unwrap_err(), "invalid_input");
    assert_eq!(alice.call(Request::Whoami).await, before);
}
