//! letmeknow groups end to end: real relay-lite, real profiles, each agent session its own MLS
//! member. Invite, join, talk, remove, leave with three and five sessions; the invite edge
//! cases; what a removed member can no longer read.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use serde_json::Value;
use switchboard_core::engine::Runtime;
use switchboard_core::protocol::letmeknow::invite::{InviteLink, new_owner_token};
use switchboard_core::transport::TransportError;
use switchboard_core::transport::letagents::RelayClient;
use switchboard_core::transport::letmeknow::LetmeknowClient;
use switchboard_core::util::OsRng;
use switchboard_tests::{Peer, TestRelay};

/// One agent session: a profile's runtime and the session's handle.
struct Agent {
    peer: Peer,
    handle: String,
    fp: String,
}

impl Agent {
    async fn new(name: &str, relay: &TestRelay) -> Self {
        let peer = Peer::offline(name, &relay.url()).await;
        let s = peer.rt.lmk_session(None, Some(&format!("{name}'s agent"))).await.unwrap();
        let handle = s["handle"].as_str().unwrap().to_owned();
        assert!(handle.contains('-'), "a two-word handle: {handle}");
        Self { fp: s["fingerprint"].as_str().unwrap().to_owned(), peer, handle }
    }

    fn rt(&self) -> &Runtime {
        &self.peer.rt
    }

    async fn sync(&self, group: &str) {
        self.rt().lmk_sync(&self.handle, group, 0).await.unwrap();
    }

    async fn deliveries(&self) -> Vec<Value> {
        self.rt().lmk_deliveries(&self.handle).await.unwrap()["items"].as_array().unwrap().clone()
    }

    async fn members(&self, group: &str) -> Vec<Value> {
        self.rt().lmk_members(&self.handle, group).await.unwrap()["members"].as_array().unwrap().clone()
    }

    async fn send(&self, group: &str, text: &str) -> String {
        self.rt().lmk_send(&self.handle, group, text, None, None).await.unwrap()["id"].as_str().unwrap().to_owned()
    }

    async fn contents(&self) -> Vec<String> {
        self.deliveries().await.iter().map(|d| d["content"].as_str().unwrap().to_owned()).collect()
    }
}

/// `inviter` invites `joiner` (into `group`, or a new group); returns the group id.
async fn admit(inviter: &Agent, group: Option<&str>, joiner: &Agent) -> String {
    let inv = inviter.rt().lmk_invite(&inviter.handle, group, None).await.unwrap();
    let link = inv["link"].as_str().unwrap();
    assert!(link.contains("/i/") && link.contains('#'));
    let (joined, admitted) = tokio::join!(
        joiner.rt().lmk_join(&joiner.handle, link, Some(60)),
        inviter.rt().lmk_invite_wait(inv["invite"].as_str().unwrap())
    );
    let joined = joined.unwrap();
    let admitted = admitted.unwrap();
    assert_eq!(admitted["joined"]["fingerprint"], joiner.fp.as_str());
    assert_eq!(joined["group"], inv["group"]);
    inv["group"].as_str().unwrap().to_owned()
}

fn fps(members: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = members.iter().map(|m| m["fingerprint"].as_str().unwrap().to_owned()).collect();
    v.sort();
    v
}

#[tokio::test]
async fn three_sessions_invite_join_talk_remove_and_leave() {
    let relay = TestRelay::start().await;
    let alice = Agent::new("alice", &relay).await;
    let bob = Agent::new("bob", &relay).await;
    let carol = Agent::new("carol", &relay).await;

    let g = admit(&alice, None, &bob).await;
    admit(&alice, Some(&g), &carol).await;
    bob.sync(&g).await;
    // Everyone sees the joiner as display name, fingerprint and who invited them.
    let seen = bob.contents().await;
    assert!(seen.iter().any(|c| c == &format!("alice's agent added carol's agent ({})", carol.fp)), "{seen:?}");
    for a in [&alice, &bob, &carol] {
        let m = a.members(&g).await;
        assert_eq!(fps(&m), fps(&alice.members(&g).await));
        assert_eq!(m.len(), 3);
    }
    let carol_row = bob.members(&g).await.into_iter().find(|m| m["fingerprint"] == carol.fp.as_str()).unwrap();
    assert_eq!(carol_row["name"], "carol's agent");
    assert!(carol_row["invited_by"].as_str().unwrap().starts_with("alice's agent"));

    // Talk: a message for the group, and a reply addressed to one member.
    let hello = alice.send(&g, "hello, group").await;
    carol.sync(&g).await;
    let got = carol.deliveries().await;
    let h = got.iter().find(|d| d["id"] == hello.as_str()).unwrap();
    assert_eq!(h["from"]["fingerprint"], alice.fp.as_str());
    assert_eq!(h["mode"], "digest");
    let reply = carol.rt().lmk_send(&carol.handle, &g, "hi bob", Some(&bob.fp), Some(&hello)).await.unwrap();
    bob.sync(&g).await;
    let got = bob.deliveries().await;
    let r = got.iter().find(|d| d["id"] == reply["id"]).unwrap();
    assert_eq!(r["mode"], "steer", "addressed to bob");
    assert_eq!(r["reply_to"], hello.as_str());
    assert!(r["after"].as_array().unwrap().iter().any(|a| a == hello.as_str()), "reply-to is covered by after");
    assert!(got.iter().any(|d| d["id"] == hello.as_str()));

    // Remove carol: she learns it, and cannot read what follows.
    alice.rt().lmk_remove(&alice.handle, &g, &carol.fp).await.unwrap();
    carol.sync(&g).await;
    assert!(carol.contents().await.iter().any(|c| c.contains(&format!("removed carol's agent ({})", carol.fp))));
    let secret = alice.send(&g, "secret after carol left").await;
    let err = carol.rt().lmk_sync(&carol.handle, &g, 0).await.unwrap_err();
    assert_eq!(err.code(), "forbidden");
    // Even forcing her session to read on, nothing decrypts.
    sqlx::query("UPDATE lmk_groups SET state = 'active'").execute(&carol.rt().store().pool).await.unwrap();
    carol.rt().lmk_sync(&carol.handle, &g, 0).await.unwrap();
    let rows: Vec<String> =
        sqlx::query_scalar("SELECT content FROM lmk_messages").fetch_all(&carol.rt().store().pool).await.unwrap();
    assert!(!rows.iter().any(|c| c.contains("secret after carol")), "{rows:?}");
    assert!(carol.rt().lmk_read(&carol.handle, &secret, 0).await.is_err());
    bob.sync(&g).await;
    assert!(bob.contents().await.iter().any(|c| c == "secret after carol left"));

    // Bob leaves: alice's runtime commits his removal when it reads the request.
    bob.rt().lmk_leave(&bob.handle, &g).await.unwrap();
    alice.sync(&g).await;
    assert_eq!(fps(&alice.members(&g).await), vec![alice.fp.clone()]);
    // Alice's own commit is in her log (already read: her runtime did it for her).
    let log: Vec<String> =
        sqlx::query_scalar("SELECT content FROM lmk_messages").fetch_all(&alice.rt().store().pool).await.unwrap();
    assert!(log.iter().any(|c| c.contains(&format!("removed bob's agent ({})", bob.fp))), "{log:?}");
    assert_eq!(bob.rt().lmk_send(&bob.handle, &g, "still here?", None, None).await.unwrap_err().code(), "forbidden");
}

#[tokio::test]
async fn five_sessions_talk_and_a_removed_member_reads_nothing_after() {
    let relay = TestRelay::start().await;
    let mut agents = Vec::new();
    for name in ["ann", "ben", "cat", "dan", "eve"] {
        agents.push(Agent::new(name, &relay).await);
    }
    let g = admit(&agents[0], None, &agents[1]).await;
    for i in 2..5 {
        // Any member may invite.
        admit(&agents[i - 1], Some(&g), &agents[i]).await;
    }
    for a in &agents {
        a.sync(&g).await;
        assert_eq!(a.members(&g).await.len(), 5);
        a.deliveries().await;
    }
    for a in &agents {
        a.send(&g, &format!("{} here", a.peer.name)).await;
    }
    for a in &agents {
        a.sync(&g).await;
        let seen = a.contents().await;
        for other in &agents {
            if other.fp != a.fp {
                assert!(seen.contains(&format!("{} here", other.peer.name)), "{}: {seen:?}", a.peer.name);
            }
        }
    }
    // cat removes eve; dan leaves.
    agents[2].rt().lmk_remove(&agents[2].handle, &g, &agents[4].fp).await.unwrap();
    agents[3].rt().lmk_leave(&agents[3].handle, &g).await.unwrap();
    agents[0].sync(&g).await;
    agents[1].sync(&g).await;
    agents[2].sync(&g).await;
    agents[0].send(&g, "three of us now").await;
    for a in &agents[..3] {
        a.sync(&g).await;
        assert_eq!(a.members(&g).await.len(), 3);
        assert!(a.contents().await.iter().any(|c| c == "three of us now") || a.fp == agents[0].fp);
    }
    agents[4].sync(&g).await;
    assert!(agents[4].rt().lmk_sync(&agents[4].handle, &g, 0).await.is_err(), "eve is out");
    let rows: Vec<String> =
        sqlx::query_scalar("SELECT content FROM lmk_messages").fetch_all(&agents[4].rt().store().pool).await.unwrap();
    assert!(!rows.iter().any(|c| c.contains("three of us")));
}

#[tokio::test]
async fn an_expired_invite_cannot_be_joined() {
    let relay = TestRelay::start().await;
    let (alice, bob) = (Agent::new("alice", &relay).await, Agent::new("bob", &relay).await);
    let inv = alice.rt().lmk_invite(&alice.handle, None, Some(1)).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let err = bob.rt().lmk_join(&bob.handle, inv["link"].as_str().unwrap(), Some(5)).await.unwrap_err();
    assert!(err.to_string().contains("unknown or expired"), "{err}");
    let err = alice.rt().lmk_invite_wait(inv["invite"].as_str().unwrap()).await.unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");
}

#[tokio::test]
async fn an_invite_used_twice_admits_only_the_first() {
    let relay = TestRelay::start().await;
    let (alice, bob, mallory) =
        (Agent::new("alice", &relay).await, Agent::new("bob", &relay).await, Agent::new("mallory", &relay).await);
    let inv = alice.rt().lmk_invite(&alice.handle, None, None).await.unwrap();
    let link = inv["link"].as_str().unwrap();
    let (joined, _) = tokio::join!(
        bob.rt().lmk_join(&bob.handle, link, Some(60)),
        alice.rt().lmk_invite_wait(inv["invite"].as_str().unwrap())
    );
    joined.unwrap();
    let err = mallory.rt().lmk_join(&mallory.handle, link, Some(5)).await.unwrap_err();
    assert!(err.to_string().contains("already used"), "{err}");
    assert_eq!(alice.members(inv["group"].as_str().unwrap()).await.len(), 2);
}

#[tokio::test]
async fn a_join_with_the_wrong_secret_is_refused_by_the_inviter() {
    let relay = TestRelay::start().await;
    let (alice, bob) = (Agent::new("alice", &relay).await, Agent::new("bob", &relay).await);
    let inv = alice.rt().lmk_invite(&alice.handle, None, None).await.unwrap();
    let mut link = InviteLink::parse(inv["link"].as_str().unwrap()).unwrap();
    *link.secret = [7; 32];
    let wrong = link.to_link();
    let (joined, admitted) = tokio::join!(
        bob.rt().lmk_join(&bob.handle, &wrong, Some(3)),
        alice.rt().lmk_invite_wait(inv["invite"].as_str().unwrap())
    );
    assert!(admitted.unwrap_err().to_string().contains("does not decrypt"));
    assert!(joined.unwrap_err().to_string().contains("no Welcome"));
    assert_eq!(alice.members(inv["group"].as_str().unwrap()).await.len(), 1, "nobody was added");
}

#[tokio::test]
async fn a_welcome_without_the_owner_token_is_refused() {
    let relay = TestRelay::start().await;
    let client = LetmeknowClient::new(&RelayClient::new(&relay.url(), None).unwrap());
    let link = InviteLink::generate(&relay.url(), &mut OsRng);
    let owner = new_owner_token(&mut OsRng);
    client.create_invite(&link.id, 600, &owner).await.unwrap();
    client.put_blob(&link.id, false, None, b"join").await.unwrap();
    for token in [None, Some(new_owner_token(&mut OsRng))] {
        let err = client.put_blob(&link.id, true, token.as_deref(), b"forged welcome").await.unwrap_err();
        assert!(matches!(err, TransportError::Status { status: 403, .. }), "{err:?}");
    }
    assert_eq!(client.get_blob(&link.id, true, 0).await.unwrap(), None, "no welcome was stored");
    client.put_blob(&link.id, true, Some(&owner), b"welcome").await.unwrap();
    assert_eq!(client.get_blob(&link.id, true, 0).await.unwrap(), Some(b"welcome".to_vec()));
}
