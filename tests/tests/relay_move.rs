//! Moving a profile to another relay (`relay move`, Settings → Relay): two real relay-lite
//! instances over HTTP and real runtimes. A profile that nobody reaches yet moves, and is then
//! reachable on the new relay on every 1:1 channel, live (its receive loops start again there)
//! and after a restart. A profile with a letagents contact, an Agent Mail contact and a group
//! moves: the contacts learn the new relay (a signed notice; a newer card), what was sent to the
//! old relay before still arrives (the drain), the group stays on the old relay, and with the old
//! relay gone both contacts still reach it. Stringcup contacts, which cannot follow (an id
//! belongs to the relay that assigned it), stay on the old relay and are reached through the
//! identity it assigned, kept for them. Forged notices change nothing; a relay that does not
//! answer refuses the move.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use serde_json::{Value, json};
use switchboard_core::api::Request;
use switchboard_core::protocol::letagents::inner::MovedTo;
use switchboard_core::protocol::letagents::{Kind, PeerKeys};
use switchboard_tests::{Forger, Peer, TestRelay, befriend};

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
    assert_eq!(status["relays"][0]["own"], true);
    // The old relay is listed as still read (drained for 48 h), with nobody living there.
    let listed = status["relays"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{status}");
    assert_eq!(listed[1]["url"], old.url().trim_end_matches('/'));
    assert_eq!(listed[1]["own"], false);
    let until = listed[1]["drain_until"].as_i64().expect("a drain end");
    assert!((47 * 3_600_000..=48 * 3_600_000).contains(&(until - switchboard_core::util::now_ms())), "{status}");
    assert_eq!((listed[1]["stringcup"].as_i64(), listed[1]["groups"].as_i64()), (Some(0), Some(0)));

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

/// A contact's entry in `p`'s contact list.
async fn contact(p: &Peer, name: &str) -> Value {
    let all = p.call(Request::ContactList).await;
    all.as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap_or_else(|| panic!("no {name}: {all}"))
}

/// Polls `p`'s inbox until a message with `body` arrives; every message seen meanwhile.
async fn arrives(p: &Peer, body: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen.extend(p.inbox(0).await);
        if seen.iter().any(|m| m["body"] == body) {
            return seen;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{} never got {body:?}; saw {seen:?}", p.name)
}

/// The name of the pending request from `id` (a protocol id), once it arrived.
async fn request_from(p: &Peer, id: &str) -> String {
    for _ in 0..100 {
        let reqs = p.call(Request::ContactRequests).await;
        if let Some(r) = reqs.as_array().unwrap().iter().find(|r| r["id"] == id) {
            return r["name"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{} never saw a request from {id}", p.name)
}

fn group_say(group: &str, text: &str) -> Request {
    Request::GroupSend { handle: None, group: group.into(), text: text.into(), to: None, reply_to: None }
}

/// The texts of `group`'s history in `p`, after reading its log.
async fn group_texts(p: &Peer, group: &str) -> Vec<String> {
    let list = p.call(Request::GroupList { handle: None }).await;
    let handle =
        list.as_array().unwrap().iter().find(|g| g["group"] == group).unwrap()["handle"].as_str().unwrap().to_owned();
    p.rt.lmk_sync(&handle, group, 0).await.unwrap();
    let page = p
        .call(Request::GroupHistory { handle: None, group: group.into(), before: None, limit: None, mark_read: false })
        .await;
    page["messages"].as_array().unwrap().iter().filter_map(|m| m["content"].as_str().map(str::to_owned)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_with_contacts_and_a_group_moves_and_everyone_still_reaches_it() {
    let mut old = TestRelay::start().await;
    let new = TestRelay::start().await;
    let old_url = old.url().trim_end_matches('/').to_owned();
    let new_url = new.url().trim_end_matches('/').to_owned();
    let alice = Peer::offline("alice", &old.url()).await;
    let bob = Peer::offline("bob", &old.url()).await;
    let carol = Peer::offline("carol", &old.url()).await;
    let dave = Peer::offline("dave", &old.url()).await;

    // bob: letagents, both ways. carol: Agent Mail (she wrote first, alice accepted). dave: a
    // group alice made on the old relay.
    befriend(&alice, &bob).await;
    bob.inbox(0).await;
    let who = alice.call(Request::Whoami).await;
    carol.add_contact(who["agent_mail"]["address"].as_str().unwrap(), "alice").await;
    carol.send("alice", "hi over mail").await;
    let carol_id = carol.call(Request::Whoami).await["agent_mail"]["agent_id"].as_str().unwrap().to_owned();
    let name = request_from(&alice, &carol_id).await;
    alice.call(Request::ContactAccept { name, new_name: Some("carol".into()) }).await;
    let made = alice.call(Request::GroupCreate { name: "Team".into() }).await;
    let group = made["group"].as_str().unwrap().to_owned();
    let inv = alice.call(Request::GroupInvite { handle: None, group: Some(group.clone()), ttl_secs: None }).await;
    let link = inv["link"].as_str().unwrap().to_owned();
    dave.call(Request::GroupJoin { handle: None, link, timeout_secs: Some(30) }).await;
    alice.inbox(0).await;

    // What the move will do, before it does it.
    let plan = alice.call(Request::RelayMovePlan).await;
    assert_eq!(
        (&plan["letagents"], &plan["agent_mail"], &plan["stringcup"], &plan["groups"], &plan["drain_hours"]),
        (&1.into(), &1.into(), &0.into(), &1.into(), &48.into()),
        "{plan}"
    );
    assert_eq!(plan["refused"], Value::Null);
    assert_eq!(
        plan["summary"],
        "2 contacts will be told; 1 group stays on the old relay; the old relay is read for 48 h"
    );

    let moved = alice.call(move_to(&new.url())).await;
    assert_eq!(moved["letagents"]["relay"], new_url.as_str(), "{moved}");
    assert_eq!(
        (&moved["move"]["from"], &moved["move"]["letagents_told"], &moved["move"]["groups_on_old_relay"]),
        (&old_url.clone().into(), &1.into(), &1.into()),
        "{moved}"
    );
    // bob still lives on the old relay: alice's route to him says so now.
    assert_eq!(contact(&alice, "bob").await["relay"], old_url.as_str());

    // Drain: bob has not read the notice yet and sends to the old relay; it still arrives.
    bob.send("alice", "sent before I knew").await;
    arrives(&alice, "sent before I knew").await;

    // The group stays on the old relay and works both ways.
    dave.call(group_say(&group, "the group is still here")).await;
    assert!(group_texts(&alice, &group).await.contains(&"the group is still here".to_owned()));
    alice.call(group_say(&group, "so am I")).await;
    assert!(group_texts(&dave, &group).await.contains(&"so am I".to_owned()));

    // bob reads the notice: his route to alice is the new relay, and his conversation says so.
    let got = arrives(&bob, &new_url).await;
    let line = got.iter().find(|m| m["body"] == new_url.as_str()).unwrap();
    assert_eq!((&line["kind"], &line["from"]), (&"moved".into(), &"alice".into()), "{line}");
    assert_eq!(contact(&bob, "alice").await["relay"], new_url.as_str());
    // alice still reaches bob where he lives.
    alice.send("bob", "I moved").await;
    arrives(&bob, "I moved").await;

    // carol's next send fetches alice's newer card (from the old route, which she knows) and
    // goes to the new relay; bob's goes there too. With the old relay gone, both still arrive.
    carol.send("alice", "mail after the move").await;
    bob.send("alice", "found you on the new relay").await;
    old.stop().await;
    let got = arrives(&alice, "mail after the move").await;
    if !got.iter().any(|m| m["body"] == "found you on the new relay") {
        arrives(&alice, "found you on the new relay").await;
    }
}

/// A signed hello from `f` to `to` claiming a move to `url`, `from` the address it says it comes
/// from.
fn notice(f: &Forger, to: &PeerKeys, from: &str, url: &str) -> Vec<u8> {
    let mut inner = f.inner(to, Kind::Hello, json!("x"));
    inner.from = from.to_owned();
    inner.moved_to = Some(MovedTo { url: url.into(), cert_sha256: Some("ab".repeat(32)) });
    f.seal(to, &inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_move_notice_is_refused_and_changes_nothing() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    befriend(&alice, &bob).await;
    alice.inbox(0).await;
    let before = contact(&alice, "bob").await;
    let evil = "https://evil.example";
    let f = Forger::new(&relay);

    // A stranger's notice (its own address, validly signed): not a contact, not even a request.
    f.post(&alice, notice(&f, &alice.rt.keys(), &f.id.address().to_string(), evil)).await;
    // bob's address, signed by someone else's key: the signature does not verify.
    f.post(&alice, notice(&f, &alice.rt.keys(), &bob.address().await, evil)).await;
    alice.inbox(0).await;

    assert_eq!(contact(&alice, "bob").await, before);
    assert_eq!(alice.call(Request::ContactRequests).await, json!([]));
    assert_eq!(alice.call(Request::ContactList).await.as_array().unwrap().len(), 1);
    assert_eq!(alice.call(Request::RelayTrusted).await, json!([]), "no pin taken from a forger");
    let drops: Vec<String> = alice
        .log()
        .await
        .iter()
        .filter(|r| r["direction"] == "in" && r["state"] == "dropped")
        .map(|r| r["detail"].as_str().unwrap().to_owned())
        .collect();
    assert!(drops.iter().any(|d| d == "unknown_sender"), "{drops:?}");
    assert!(drops.iter().any(|d| d.contains("signature")), "{drops:?}");
    // The real bob still reaches alice where he always did.
    bob.send("alice", "still me").await;
    arrives(&alice, "still me").await;
}

/// `to` accepts the pending request from Stringcup id `id` under `name`.
async fn accept_from(to: &Peer, id: &str, name: &str) {
    let req = request_from(to, id).await;
    to.call(Request::ContactAccept { name: req, new_name: Some(name.into()) }).await;
}

/// A message with `body` reaches `to`, from the contact `from` (as `to` names it).
async fn reaches(to: &Peer, from: &str, body: &str) {
    let got = arrives(to, body).await;
    let m = got.iter().find(|m| m["body"] == body).unwrap();
    assert_eq!((&m["from"], &m["protocol"]), (&from.into(), &"stringcup".into()), "{m}");
}

/// Stringcup contacts cannot follow a move (an id belongs to the relay that assigned it): they
/// stay on the old relay, reached both ways through the identity it assigned alice, which she
/// keeps (across a restart too) and keeps reading; new contacts use her identity on the new
/// relay; an old relay that is down holds only its own contacts' mail; moving back reuses the
/// identity held there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stringcup_contacts_stay_on_the_old_relay_and_new_ones_use_the_new_one() {
    let mut a = TestRelay::start().await;
    let b = TestRelay::start().await;
    let a_url = a.url().trim_end_matches('/').to_owned();
    let b_url = b.url().trim_end_matches('/').to_owned();
    let alice = Peer::offline("alice", &a.url()).await;
    let carol = Peer::offline("carol", &a.url()).await;
    let alice_a = alice.stringcup_id().await;
    carol.add_contact(&alice_a, "alice").await;
    carol.send("alice", "hi over stringcup").await;
    accept_from(&alice, &carol.stringcup_id().await, "carol").await;
    arrives(&alice, "hi over stringcup").await;

    let plan = alice.call(Request::RelayMovePlan).await;
    assert_eq!(plan["stringcup"], 1, "{plan}");
    assert_eq!(
        plan["summary"],
        "0 contacts will be told; 0 groups stay on the old relay, and so does 1 Stringcup contact (a Stringcup id \
         belongs to the relay that assigned it); the old relay is read for 48 h"
    );
    let moved = alice.call(move_to(&b.url())).await;
    assert_eq!(moved["move"]["stringcup_on_old_relay"], 1, "{moved}");
    let alice_b = moved["stringcup"]["id"].as_str().unwrap().to_owned();
    assert_ne!(alice_b, alice_a, "a new identity from the new relay");
    assert_eq!(moved["stringcup"]["other_relays"], json!([{"id": alice_a, "relay": a_url, "contacts": 1}]));
    assert_eq!(contact(&alice, "carol").await["relay"], a_url.as_str());

    // carol still reaches alice's identity on A, and alice reaches her from it.
    carol.send("alice", "still on A").await;
    reaches(&alice, "carol", "still on A").await;
    alice.send("carol", "so am I, for you").await;
    reaches(&carol, "alice", "so am I, for you").await;

    // A topic lives on one relay: carol, on A, cannot be put in one on B.
    assert_eq!(
        alice.try_call(Request::TopicCreate { members: vec!["carol".into()] }).await.unwrap_err(),
        "invalid_input"
    );

    // A stranger on A writing to alice's kept identity becomes a request living on A.
    let erin = Peer::offline("erin", &a.url()).await;
    erin.add_contact(&alice_a, "alice").await;
    erin.send("alice", "found your old id").await;
    accept_from(&alice, &erin.stringcup_id().await, "erin").await;
    reaches(&alice, "erin", "found your old id").await;
    assert_eq!(contact(&alice, "erin").await["relay"], a_url.as_str());

    // dave lives on B: alice adds him there, through her identity on B.
    let dave = Peer::offline("dave", &b.url()).await;
    alice.add_contact(&dave.stringcup_id().await, "dave").await;
    assert_eq!(contact(&alice, "dave").await["relay"], Value::Null, "on alice's own relay");
    alice.send("dave", "hello from B").await;
    accept_from(&dave, &alice_b, "alice").await;
    reaches(&dave, "alice", "hello from B").await;
    dave.send("alice", "hi on B").await;
    reaches(&alice, "dave", "hi on B").await;

    // A is down: what alice writes to carol waits, dave is not held up, and nothing fails.
    a.stop().await;
    let waiting = alice.send("carol", "while A is down").await;
    assert_eq!(alice.state_of(&waiting).await, "queued");
    dave.send("alice", "B works without A").await;
    reaches(&alice, "dave", "B works without A").await;
    alice.send("dave", "so it does").await;
    reaches(&dave, "alice", "so it does").await;
    a.restart().await;
    alice.call(Request::Flush).await;
    reaches(&carol, "alice", "while A is down").await;

    // Opened again, alice holds both identities (the keys come from the keystore).
    let (profile, dir) = alice.close();
    let alice = Peer::reopen("alice", profile, dir).await;
    assert_eq!(alice.stringcup_id().await, alice_b);
    carol.send("alice", "after your restart").await;
    reaches(&alice, "carol", "after your restart").await;
    dave.send("alice", "me too").await;
    reaches(&alice, "dave", "me too").await;
    alice.send("carol", "back again").await;
    reaches(&carol, "alice", "back again").await;

    // Moving back to A reuses the identity A assigned (no new registration): carol and erin are
    // on alice's own relay again, and dave is now the one on another relay.
    let back = alice.call(move_to(&a.url())).await;
    assert_eq!(back["stringcup"]["id"], alice_a.as_str(), "{back}");
    assert_eq!(back["move"]["stringcup_on_old_relay"], 1, "{back}");
    assert_eq!(back["stringcup"]["other_relays"], json!([{"id": alice_b, "relay": b_url, "contacts": 1}]));
    assert_eq!(contact(&alice, "carol").await["relay"], Value::Null);
    assert_eq!(contact(&alice, "erin").await["relay"], Value::Null);
    assert_eq!(contact(&alice, "dave").await["relay"], b_url.as_str());
    carol.send("alice", "welcome back").await;
    reaches(&alice, "carol", "welcome back").await;
    alice.send("carol", "thanks").await;
    reaches(&carol, "alice", "thanks").await;
    dave.send("alice", "still here on B").await;
    reaches(&alice, "dave", "still here on B").await;
    alice.send("dave", "and I reach you there").await;
    reaches(&dave, "alice", "and I reach you there").await;
}

/// The live runtime (the app, the daemon) reads a kept identity's inbox by itself, with no
/// command asking, after the 48 h drain has nothing to do with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_runtime_reads_the_kept_stringcup_identity_by_itself() {
    let a = TestRelay::start().await;
    let b = TestRelay::start().await;
    let mut alice = Peer::offline("alice", &a.url()).await;
    let carol = Peer::offline("carol", &a.url()).await;
    carol.add_contact(&alice.stringcup_id().await, "alice").await;
    carol.send("alice", "hello").await;
    accept_from(&alice, &carol.stringcup_id().await, "carol").await;
    alice.inbox(0).await;
    alice.go_live();
    alice.call(move_to(&b.url())).await;
    carol.send("alice", "to your old id").await;
    // A live runtime's inbox does not sync: only its loops bring messages in (every 12 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    loop {
        if alice.inbox(0).await.iter().any(|m| m["body"] == "to your old id") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the kept identity was never read");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
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

/// The live runtime (the daemon, the app) reads the old relay by itself: a contact who has not
/// read the move notice yet writes to alice's old mailbox after the move, and it arrives with no
/// command asking for it (the drain loop, every 15 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_runtime_reads_the_old_relay_by_itself_after_a_move() {
    let old = TestRelay::start().await;
    let new = TestRelay::start().await;
    let mut alice = Peer::offline("alice", &old.url()).await;
    let bob = Peer::offline("bob", &old.url()).await;
    befriend(&alice, &bob).await;
    bob.inbox(0).await;
    alice.go_live();
    alice.call(move_to(&new.url())).await;
    // After the drain the move itself runs: what bob sends now waits for the loop's next round.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    bob.send("alice", "to your old mailbox").await;
    // A live runtime's inbox does not sync: only its own loops bring messages in.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    loop {
        if alice.inbox(0).await.iter().any(|m| m["body"] == "to your old mailbox") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the drain loop never read the old relay");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// A message queued while the relay was down, before a move, goes out after it, to the relay
/// where its recipient lives (the old one), ahead of the move notice; the contact then follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_queued_before_a_move_goes_out_after_it_to_where_the_contact_lives() {
    let mut old = TestRelay::start().await;
    let new = TestRelay::start().await;
    let new_url = new.url().trim_end_matches('/').to_owned();
    let alice = Peer::offline("alice", &old.url()).await;
    let bob = Peer::offline("bob", &old.url()).await;
    befriend(&alice, &bob).await;
    bob.inbox(0).await;

    old.stop().await;
    let id = alice.send("bob", "written while the relay was down").await;
    assert_eq!(alice.state_of(&id).await, "queued");
    // The move needs only the new relay to answer.
    let moved = alice.call(move_to(&new.url())).await;
    assert_eq!(moved["move"]["letagents_told"], 1, "{moved}");
    assert_eq!(alice.state_of(&id).await, "queued", "still waiting for bob's relay");

    old.restart().await;
    alice.call(Request::Flush).await;
    let got = arrives(&bob, &new_url).await;
    let bodies: Vec<&str> = got.iter().filter_map(|m| m["body"].as_str()).collect();
    let queued = bodies.iter().position(|b| *b == "written while the relay was down");
    let notice = bodies.iter().position(|b| *b == new_url.as_str());
    assert!(queued.is_some() && queued < notice, "the queued message first, then the notice: {bodies:?}");
    assert_eq!(contact(&bob, "alice").await["relay"], new_url.as_str());
    bob.send("alice", "found you").await;
    arrives(&alice, "found you").await;
    // bob's receipt for it came back too (sent before he read the notice: through the drain).
    assert!(alice.eventually(20, || async { alice.state_of(&id).await == "delivered" }).await, "delivered to bob");
}

/// The plan counts people, not channels: bob added by contact link is one person with a
/// letagents, an Agent Mail and a Stringcup channel, and the confirmation says one contact is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_counts_a_person_added_by_link_once() {
    let old = TestRelay::start().await;
    let alice = Peer::offline("alice", &old.url()).await;
    let bob = Peer::offline("bob", &old.url()).await;
    let link = bob.call(Request::Whoami).await["contact_link"]["link"].as_str().unwrap().to_owned();
    alice.add_contact(&link, "bob").await;
    let plan = alice.call(Request::RelayMovePlan).await;
    assert_eq!(
        (&plan["letagents"], &plan["agent_mail"], &plan["told"], &plan["stringcup"]),
        (&1.into(), &1.into(), &1.into(), &1.into()),
        "{plan}"
    );
    assert_eq!(
        plan["summary"],
        "1 contact will be told; 0 groups stay on the old relay, and so does 1 Stringcup contact (a Stringcup id \
         belongs to the relay that assigned it); the old relay is read for 48 h"
    );
}
