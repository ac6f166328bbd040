//! The delivery policy for letmeknow groups, and do-not-disturb, end to end over a real
//! relay-lite: digest ticks, the per-group loop guard, per-group review mode, and a runtime-wide
//! do-not-disturb that holds 1:1 and group wakes and loses nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard_core::bridge::api::Request;
use switchboard_core::engine::Runtime;
use switchboard_tests::{Peer, TestRelay, befriend};

/// One profile with one group session (`handle`, which is also its agent session's name).
struct Member {
    peer: Peer,
    handle: String,
    fp: String,
}

impl Member {
    async fn new(name: &str, handle: &str, relay: &TestRelay) -> Self {
        let peer = Peer::offline(name, &relay.url()).await;
        let s = peer.rt.lmk_session(Some(handle), Some(&format!("{name}'s agent"))).await.unwrap();
        Self { fp: s["fingerprint"].as_str().unwrap().to_owned(), peer, handle: handle.to_owned() }
    }

    fn rt(&self) -> &Runtime {
        &self.peer.rt
    }

    async fn policy(&self, loop_limit: Option<u32>, digest_secs: Option<u64>) {
        self.peer.call(Request::Policy { review: None, loop_limit, digest_secs }).await;
    }

    async fn sync(&self, group: &str) {
        self.rt().lmk_sync(&self.handle, group, 0).await.unwrap();
    }

    /// What the session is handed now (no wait).
    async fn take(&self) -> Value {
        self.rt().lmk_deliveries(&self.handle).await.unwrap()
    }

    /// A plain group message from the owner's side of this runtime (no policy involved).
    async fn say(&self, group: &str, text: &str) -> String {
        self.rt().lmk_send(&self.handle, group, text, None, None).await.unwrap()["id"].as_str().unwrap().to_owned()
    }
}

fn contents(v: &Value) -> Vec<String> {
    v["items"].as_array().unwrap().iter().map(|i| i["content"].as_str().unwrap().to_owned()).collect()
}

/// `inviter` invites `joiner` into `group` (or a new group); returns the group id.
async fn admit(inviter: &Member, group: Option<&str>, joiner: &Member) -> String {
    let inv = inviter.rt().lmk_invite(&inviter.handle, group, None).await.unwrap();
    let (joined, admitted) = tokio::join!(
        joiner.rt().lmk_join(&joiner.handle, inv["link"].as_str().unwrap(), Some(60)),
        inviter.rt().lmk_invite_wait(inv["invite"].as_str().unwrap())
    );
    joined.unwrap();
    admitted.unwrap();
    inv["group"].as_str().unwrap().to_owned()
}

/// Alice and bob in one group, everything before the test already taken by both.
async fn pair(relay: &TestRelay) -> (Member, Member, String) {
    let alice = Member::new("alice", "amber-otter", relay).await;
    let bob = Member::new("bob", "brave-heron", relay).await;
    alice.policy(Some(10_000), Some(0)).await;
    bob.policy(Some(10_000), Some(0)).await;
    let g = admit(&alice, None, &bob).await;
    bob.sync(&g).await;
    alice.sync(&g).await;
    bob.take().await;
    alice.take().await;
    (alice, bob, g)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_not_disturb_holds_one_to_one_and_group_wakes_and_off_releases_them_all() {
    let relay = TestRelay::start().await;
    let (alice, bob, g) = pair(&relay).await;
    befriend(&alice.peer, &bob.peer).await;
    // bob's agent "brave-heron" is both a registered 1:1 agent and the group session.
    bob.peer.open_session(&bob.handle).await;

    assert_eq!(bob.peer.call(Request::Dnd { on: None }).await["dnd"], false);
    assert_eq!(bob.peer.call(Request::Dnd { on: Some(true) }).await, serde_json::json!({"dnd": true}));
    assert_eq!(bob.peer.call(Request::Dnd { on: None }).await["dnd"], true);
    assert_eq!(bob.peer.call(Request::Status).await["dnd"], true);

    // Addressed 1:1 traffic (steer) and group traffic, addressed and not.
    let send = |text: &str| Request::Send {
        contact: "bob".into(),
        text: text.into(),
        kind: None,
        reply_to: None,
        from_agent: None,
        to_agent: Some("brave-heron".into()),
    };
    alice.peer.call(send("1:1 for brave-heron")).await;
    alice.say(&g, "group chatter").await;
    alice.say(&g, "@brave-heron please look").await;
    alice.rt().lmk_send(&alice.handle, &g, "addressed by fingerprint", Some(&bob.fp), None).await.unwrap();

    // Nothing wakes the agent: the waits run to their end and hand over nothing.
    let t = Instant::now();
    assert!(bob.peer.agent_wait(&bob.handle, 1).await.is_empty(), "1:1 held by do-not-disturb");
    let got = bob.rt().lmk_wait(&bob.handle, 1).await.unwrap();
    assert!(t.elapsed() >= Duration::from_secs(2), "both waits waited: {:?}", t.elapsed());
    assert_eq!(contents(&got), Vec::<String>::new());
    assert_eq!(got["dnd"], true);
    assert_eq!(got["held"]["dnd"], 3, "{got}");
    let read = bob.peer.as_agent(&bob.handle, Request::Read { agent: None, id: None, ancestors: None }).await.unwrap();
    assert_eq!(read["deliveries"].as_array().unwrap().len(), 0);
    assert_eq!(read["unread"], 1, "kept, not dropped");

    // Waiting agents are woken by do-not-disturb going off, and get everything that was held.
    let rt = bob.rt().clone();
    let off = async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        rt.handle(Request::Dnd { on: Some(false) }, true).await.unwrap()
    };
    let t = Instant::now();
    let (one, group, off) = tokio::join!(bob.peer.agent_wait(&bob.handle, 30), bob.rt().lmk_wait(&bob.handle, 30), off);
    assert!(t.elapsed() < Duration::from_secs(10), "woken by dnd off, not by the timeout: {:?}", t.elapsed());
    assert_eq!(off["dnd"], false);
    let one: Vec<&str> = one.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert!(one.len() == 1 && one[0].contains("1:1 for brave-heron"), "{one:?}");
    let mut group = contents(&group.unwrap());
    group.sort();
    assert_eq!(group, ["@brave-heron please look", "addressed by fingerprint", "group chatter"]);
    assert_eq!(bob.peer.call(Request::Status).await["dnd"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_steer_is_delivered_at_once_and_digest_waits_for_the_tick() {
    let relay = TestRelay::start().await;
    let (alice, bob, g) = pair(&relay).await;
    bob.policy(None, Some(2)).await;

    // Addressed by fingerprint: steer, at once.
    alice.rt().lmk_send(&alice.handle, &g, "for bob", Some(&bob.fp), None).await.unwrap();
    bob.sync(&g).await;
    let got = bob.take().await;
    assert_eq!(contents(&got), ["for bob"]);
    assert_eq!(got["items"][0]["mode"], "steer");

    // Chatter: a digest item, held until the next 2-second tick, unread and outside `after`.
    let chatter = alice.say(&g, "chatter").await;
    bob.sync(&g).await;
    let held = bob.take().await;
    assert_eq!(contents(&held), Vec::<String>::new(), "{held}");
    assert_eq!(held["held"]["digest"], 1);
    let tick = held["next_digest_at"].as_i64().unwrap();
    assert_eq!(tick % 2000, 0, "digests fall on the ticks of the 1:1 policy");
    let mine = bob.rt().lmk_send(&bob.handle, &g, "bob's own line", None, None).await.unwrap();
    let row = bob.rt().lmk_read(&bob.handle, mine["id"].as_str().unwrap(), 0).await.unwrap();
    assert!(!row["message"]["after"].as_array().unwrap().iter().any(|a| a == chatter.as_str()), "{row}");

    // A waiting session is woken by the tick, not by its timeout.
    let t = Instant::now();
    let got = bob.rt().lmk_wait(&bob.handle, 20).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "woken at the tick: {:?}", t.elapsed());
    assert!(switchboard_core::util::now_ms() >= tick);
    assert_eq!(contents(&got), ["chatter"]);
    assert_eq!(got["items"][0]["mode"], "digest");

    // An @mention steers; chatter waiting for its tick rides along with it (as in 1:1 queues).
    alice.say(&g, "more chatter").await;
    alice.say(&g, "@brave-heron now").await;
    bob.sync(&g).await;
    let got = bob.take().await;
    assert_eq!(contents(&got), ["more chatter", "@brave-heron now"]);
    assert_eq!(got["items"][0]["mode"], "digest");
    assert_eq!(got["items"][1]["mode"], "steer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_session_cannot_switch_do_not_disturb() {
    let relay = TestRelay::start().await;
    let bob = Member::new("bob", "brave-heron", &relay).await;
    bob.peer.open_session(&bob.handle).await;
    for on in [Some(false), Some(true), None] {
        assert_eq!(bob.peer.as_agent(&bob.handle, Request::Dnd { on }).await.unwrap_err(), "forbidden");
    }
    assert_eq!(bob.peer.call(Request::Dnd { on: None }).await["dnd"], false);
}
