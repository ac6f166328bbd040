//! Groups as the person's conversations, over a real relay-lite: the owner creates a named group
//! and invites with no session handle anywhere (the default session is made on first use), the
//! link says who invites to what, the joiner takes the group's name, the invite shows as used,
//! history pages read like a chat and mark only the owner's own session read, rename is local
//! and the owner's alone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::time::Duration;

use serde_json::Value;
use switchboard_core::api::Request;
use switchboard_core::protocol::letmeknow::invite::InviteLink;
use switchboard_tests::{Peer, TestRelay};

fn create(name: &str) -> Request {
    Request::GroupCreate { name: name.into() }
}

fn invite(group: &str, ttl_secs: Option<u64>) -> Request {
    Request::GroupInvite { handle: None, group: Some(group.into()), ttl_secs }
}

fn join(link: &str) -> Request {
    Request::GroupJoin { handle: None, link: link.into(), timeout_secs: Some(30) }
}

fn history(group: &str, mark_read: bool) -> Request {
    Request::GroupHistory { handle: None, group: group.into(), before: None, limit: None, mark_read }
}

fn say(group: &str, text: &str) -> Request {
    Request::GroupSend { handle: None, group: group.into(), text: text.into(), to: None, reply_to: None }
}

/// The group's entry in `peer`'s list.
async fn listed(peer: &Peer, group: &str) -> Value {
    let all = peer.call(Request::GroupList { handle: None }).await;
    all.as_array().unwrap().iter().find(|g| g["group"] == group).cloned().unwrap_or(Value::Null)
}

/// The invite `id` as `peer`'s runtime reports it, once it is no longer waiting (or after 10 s).
async fn settled_invite(peer: &Peer, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let all = peer.call(Request::GroupInvites).await;
        let inv = all.as_array().unwrap().iter().find(|i| i["invite"] == id).cloned().unwrap();
        if inv["state"] != "waiting" || tokio::time::Instant::now() > deadline {
            return inv;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads `group`'s log into `peer`'s session in it (the daemon's follower does this by itself).
async fn catch_up(peer: &Peer, group: &str) {
    let handle = listed(peer, group).await["handle"].as_str().unwrap().to_owned();
    peer.rt.lmk_sync(&handle, group, 0).await.unwrap();
}

/// Alice creates "Team Rocket" and invites; Bob joins with the link alone. Returns the group id.
async fn alice_invites_bob(alice: &Peer, bob: &Peer) -> String {
    let made = alice.call(create("  Team Rocket ")).await;
    let group = made["group"].as_str().unwrap().to_owned();
    assert_eq!(made["name"], "Team Rocket", "the name is trimmed");
    let inv = alice.call(invite(&group, None)).await;
    let link = inv["link"].as_str().unwrap().to_owned();
    let joined = bob.call(join(&link)).await;
    assert_eq!(joined["group"], group.as_str());
    group
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_group_is_created_invited_to_and_joined_without_any_session_handle() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("Alice", &relay.url()).await;
    let bob = Peer::offline("Bob", &relay.url()).await;

    // No group and no session yet: an empty list, not an error telling the person to run a command.
    assert_eq!(alice.call(Request::GroupList { handle: None }).await, serde_json::json!([]));

    let made = alice.call(create("Team Rocket")).await;
    let group = made["group"].as_str().unwrap().to_owned();
    let inv = alice.call(invite(&group, None)).await;
    let link = inv["link"].as_str().unwrap().to_owned();
    assert!(link.ends_with("&from=Alice&group=Team%20Rocket"), "the link says who invites to what: {link}");
    let parsed = InviteLink::parse(&link).unwrap();
    assert_eq!((parsed.from.as_deref(), parsed.group.as_deref()), (Some("Alice"), Some("Team Rocket")));
    let open = alice.call(Request::GroupInvites).await;
    assert_eq!(open[0]["state"], "waiting", "{open}");

    let joined = bob.call(join(&link)).await;
    assert_eq!(joined["group"], group.as_str());
    assert_eq!(joined["name"], "Team Rocket", "the joiner takes the inviter's name for the group");
    let names: Vec<&str> = joined["members"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2);
    assert!(
        names.contains(&"Alice") && names.contains(&"Bob"),
        "default sessions carry the profiles' names: {names:?}"
    );

    // The single-use link shows as used, by whom.
    let used = settled_invite(&alice, inv["invite"].as_str().unwrap()).await;
    assert_eq!((used["state"].as_str(), used["joined"].as_str()), (Some("used"), Some("Bob")), "{used}");

    // Both lists name the group; each is the person's own session.
    for (peer, who) in [(&alice, "alice"), (&bob, "bob")] {
        let g = listed(peer, &group).await;
        assert_eq!(g["name"], "Team Rocket", "{who}: {g}");
        assert_eq!(g["own"], true, "{who}: {g}");
    }
    assert_eq!(listed(&alice, &group).await["member_names"], serde_json::json!(["Bob"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_reads_like_a_chat_and_marks_the_owners_session_read() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("Alice", &relay.url()).await;
    let bob = Peer::offline("Bob", &relay.url()).await;
    let group = alice_invites_bob(&alice, &bob).await;

    alice.call(say(&group, "hello bob")).await;
    alice.call(say(&group, "are you there?")).await;
    catch_up(&bob, &group).await;
    // Unread: the two messages and the line saying bob joined.
    assert_eq!(listed(&bob, &group).await["unread"], 3, "nothing is read before bob looks");

    // A look without marking changes nothing; the person's look marks what it showed.
    let seen = bob.call(history(&group, false)).await;
    assert_eq!(seen["name"], "Team Rocket");
    let msgs: Vec<&Value> = seen["messages"].as_array().unwrap().iter().filter(|m| m["kind"] == "message").collect();
    let texts: Vec<&str> = msgs.iter().map(|m| m["content"].as_str().unwrap()).collect();
    assert_eq!(texts, ["hello bob", "are you there?"], "oldest first");
    assert!(msgs.iter().all(|m| m["from"]["name"] == "Alice" && m["outgoing"] == false && m["read"] == false));
    assert!(seen["messages"][0]["kind"] == "event", "the join is the first line: {}", seen["messages"][0]);
    assert_eq!(listed(&bob, &group).await["unread"], 3);
    bob.call(history(&group, true)).await;
    assert_eq!(listed(&bob, &group).await["unread"], 0, "shown is read");

    // Bob answers as his default session; Alice reads it under his name.
    bob.call(say(&group, "here!")).await;
    catch_up(&alice, &group).await;
    let page = alice.call(history(&group, true)).await;
    let last = page["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((last["content"].as_str(), last["from"]["name"].as_str()), (Some("here!"), Some("Bob")), "{last}");

    // Paging: the row before the newest, alone.
    let before = last["row"].as_i64().unwrap();
    let older = alice
        .call(Request::GroupHistory {
            handle: None,
            group: group.clone(),
            before: Some(before),
            limit: Some(1),
            mark_read: false,
        })
        .await;
    let older = older["messages"].as_array().unwrap();
    assert_eq!(older.len(), 1);
    assert_eq!(older[0]["content"], "are you there?");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sessions_rows_stay_unread_when_the_owner_looks_and_only_the_owner_renames() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("Alice", &relay.url()).await;
    let bob = Peer::offline("Bob", &relay.url()).await;
    let made = alice.call(create("Ops")).await;
    let group = made["group"].as_str().unwrap().to_owned();
    let link = alice.call(invite(&group, None)).await["link"].as_str().unwrap().to_owned();
    // Bob's agent session joins, not Bob's own: its rows are read when the agent acks them.
    bob.rt.lmk_session(Some("brave-heron"), Some("Bob's agent")).await.unwrap();
    bob.call(Request::GroupJoin { handle: Some("brave-heron".into()), link, timeout_secs: Some(30) }).await;
    alice.call(say(&group, "status?")).await;
    bob.rt.lmk_sync("brave-heron", &group, 0).await.unwrap();
    let unread = listed(&bob, &group).await["unread"].as_i64().unwrap();
    assert!(unread >= 1);
    let page = bob.call(history(&group, true)).await;
    assert_eq!(page["handle"], "brave-heron", "the session in the group answers");
    assert_eq!(listed(&bob, &group).await["unread"], unread, "the owner's look is not the agent's read");
    assert_eq!(listed(&bob, &group).await["own"], false);

    // Local names: the owner's, trimmed and bounded; not an agent's to change.
    bob.call(Request::GroupRename { group: group.clone(), name: "Alice's ops".into() }).await;
    assert_eq!(listed(&bob, &group).await["name"], "Alice's ops");
    assert_eq!(listed(&alice, &group).await["name"], "Ops", "a rename is local");
    let by_agent =
        bob.as_agent("brave-heron", Request::GroupRename { group: group.clone(), name: "mine now".into() }).await;
    assert_eq!(by_agent.unwrap_err(), "forbidden");
    let blank = bob.try_call(Request::GroupRename { group: group.clone(), name: " \n ".into() }).await;
    assert_eq!(blank.unwrap_err(), "invalid_input");
    let long = bob.try_call(Request::GroupRename { group: group.clone(), name: "x".repeat(65) }).await;
    assert_eq!(long.unwrap_err(), "invalid_input");
    let stranger = bob.try_call(Request::GroupRename { group: "0".repeat(32), name: "x".into() }).await;
    assert_eq!(stranger.unwrap_err(), "unknown_group");
    let history_of_stranger = bob.try_call(history(&"0".repeat(32), false)).await;
    assert_eq!(history_of_stranger.unwrap_err(), "unknown_group");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invite_nobody_used_shows_as_expired() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("Alice", &relay.url()).await;
    let group = alice.call(create("Quiet")).await["group"].as_str().unwrap().to_owned();
    let inv = alice.call(invite(&group, Some(1))).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let gone = settled_invite(&alice, inv["invite"].as_str().unwrap()).await;
    assert_eq!(gone["state"], "expired", "{gone}");
    assert_eq!(gone["joined"], "");
}
