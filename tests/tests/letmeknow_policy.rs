//! The delivery policy for letmeknow groups, and do-not-disturb, end to end over a real
//! relay-lite: digest ticks, the per-group loop guard, per-group review mode, and a runtime-wide
//! do-not-disturb that holds 1:1 and group wakes and loses nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard_core::api::Request;
use switchboard_tests::{GroupMember as Member, TestRelay, befriend};

fn contents(v: &Value) -> Vec<String> {
    v["items"].as_array().unwrap().iter().map(|i| i["content"].as_str().unwrap().to_owned()).collect()
}

/// Alice and bob in one group, everything before the test already taken by both.
async fn pair(relay: &TestRelay) -> (Member, Member, String) {
    let alice = Member::new("alice", "amber-otter", relay).await;
    let bob = Member::new("bob", "brave-heron", relay).await;
    alice.policy(Some(10_000), Some(0)).await;
    bob.policy(Some(10_000), Some(0)).await;
    let g = alice.admit(None, &bob).await;
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
    bob.policy(None, Some(3)).await;

    // Addressed by fingerprint: steer, at once.
    alice.rt().lmk_send(&alice.handle, &g, "for bob", Some(&bob.fp), None).await.unwrap();
    bob.sync(&g).await;
    let got = bob.take().await;
    assert_eq!(contents(&got), ["for bob"]);
    assert_eq!(got["items"][0]["mode"], "steer");

    // Chatter: a digest item, held until the next 3-second tick, unread and outside `after`.
    let chatter = alice.say(&g, "chatter").await;
    // Early in a period, so the check below cannot straddle a tick.
    while switchboard_core::util::now_ms() % 3000 > 1500 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bob.sync(&g).await;
    let held = bob.take().await;
    assert_eq!(contents(&held), Vec::<String>::new(), "{held}");
    assert_eq!(held["held"]["digest"], 1);
    let tick = held["next_digest_at"].as_i64().unwrap();
    assert_eq!(tick % 3000, 0, "digests fall on the ticks of the 1:1 policy");
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
async fn the_group_loop_guard_pauses_after_n_hops_and_operator_input_releases() {
    let relay = TestRelay::start().await;
    let (alice, bob, g) = pair(&relay).await;
    bob.policy(Some(3), None).await;

    for m in ["m1", "m2", "m3"] {
        alice.say(&g, m).await;
    }
    bob.sync(&g).await;
    assert_eq!(contents(&bob.take().await), ["m1", "m2", "m3"], "up to the limit, delivered");
    // Three hops and no operator input: the agent's sends are refused...
    assert_eq!(bob.agent_says(&g, "and another thing").await.unwrap_err(), "loop_guard");
    // ...and what arrives is paused: kept unread, no agent woken.
    alice.say(&g, "m4").await;
    bob.sync(&g).await;
    let t = Instant::now();
    let got = bob.rt().lmk_wait(&bob.handle, 1).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(900), "a paused message wakes nobody: {:?}", t.elapsed());
    assert_eq!(contents(&got), Vec::<String>::new());
    assert_eq!(got["held"]["paused_by_loop_guard"], 1);
    let list = bob.group_list().await;
    assert_eq!(list["loop_guard"]["paused"], true, "{list}");
    assert_eq!(list["loop_guard"]["held"], 1);
    // Alerts still go through (an alert row as the runtime writes one for a gap).
    sqlx::query(
        "INSERT INTO lmk_messages (handle, group_id, id, kind, content, created_at) VALUES (?, ?, 'alert:t', 'alert', \
         'gap: test', 0)",
    )
    .bind(&bob.handle)
    .bind(&g)
    .execute(&bob.rt().store().pool)
    .await
    .unwrap();
    let got = bob.take().await;
    assert_eq!(contents(&got), ["gap: test"]);
    assert_eq!(got["items"][0]["mode"], "steer");

    // The owner resumes the group: what was paused is released, the agent may send again.
    let r = bob.peer.call(Request::GroupResume { handle: None, group: g.clone() }).await;
    assert_eq!((r["resumed"].as_bool(), r["released"].as_u64()), (Some(true), Some(1)));
    assert_eq!(contents(&bob.take().await), ["m4"]);
    assert_eq!(bob.group_list().await["loop_guard"]["paused"], false);
    let sent = bob.agent_says(&g, "agent back at work").await.unwrap();
    assert!(sent["id"].is_string() && sent["seq"].is_u64(), "{sent}");
    alice.sync(&g).await;
    assert_eq!(contents(&alice.take().await), ["agent back at work"]);

    // Past the limit again (bob's own message counts); an owner send is operator input too.
    for m in ["m5", "m6", "m7"] {
        alice.say(&g, m).await;
    }
    bob.sync(&g).await;
    assert_eq!(contents(&bob.take().await), ["m5", "m6"]);
    assert_eq!(bob.agent_says(&g, "refused").await.unwrap_err(), "loop_guard");
    bob.owner_says(&g, "operator here: carry on").await;
    assert_eq!(contents(&bob.take().await), ["m7"]);
    assert!(bob.agent_says(&g, "carrying on").await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_mode_holds_an_agent_group_send_until_the_owner_approves_or_denies_it() {
    let relay = TestRelay::start().await;
    let (alice, bob, g) = pair(&relay).await;
    let m = bob.peer.call(Request::GroupMode { handle: None, group: g.clone(), mode: "review".into() }).await;
    assert_eq!(m["mode"], "review");
    assert_eq!(bob.group_list().await["mode"], "review");

    let held = bob.agent_says(&g, "may I share the plan?").await.unwrap();
    assert_eq!(held["state"], "held_for_review");
    assert!(held["id"].is_null());
    let review_id = held["review_id"].as_i64().unwrap();
    alice.sync(&g).await;
    assert_eq!(contents(&alice.take().await), Vec::<String>::new(), "nothing reached the group");
    let list = bob.peer.call(Request::ReviewList).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["group"], g.as_str());
    assert_eq!(list[0]["agent"], bob.handle.as_str());
    assert_eq!(list[0]["text"], "may I share the plan?");
    assert!(list[0]["contact"].is_null());

    // Approved: sent to the group as the session wrote it.
    let sent = bob.peer.call(Request::ReviewApprove { id: review_id, text: None }).await;
    assert_eq!(sent["state"], "approved");
    assert!(sent["id"].is_string(), "{sent}");
    alice.sync(&g).await;
    let got = alice.take().await;
    assert_eq!(contents(&got), ["may I share the plan?"]);
    assert_eq!(got["items"][0]["from"]["fingerprint"], bob.fp.as_str());
    assert_eq!(got["items"][0]["id"], sent["id"]);

    // Denied: dropped, never sent.
    let held = bob.agent_says(&g, "the secret plan").await.unwrap();
    let denied = bob.peer.call(Request::ReviewReject { id: held["review_id"].as_i64().unwrap() }).await;
    assert_eq!(denied["state"], "rejected");
    assert_eq!(bob.peer.call(Request::ReviewList).await, serde_json::json!([]));
    let rows: Vec<String> =
        sqlx::query_scalar("SELECT content FROM lmk_messages").fetch_all(&bob.rt().store().pool).await.unwrap();
    assert!(!rows.iter().any(|c| c == "the secret plan"), "{rows:?}");

    // The owner's own sends are not reviewed.
    let own = bob.owner_says(&g, "from the operator").await;
    assert!(own["id"].is_string() && own.get("review_id").is_none(), "{own}");
    alice.sync(&g).await;
    assert_eq!(contents(&alice.take().await), ["from the operator"], "the denied message never arrived");

    // `default` follows the profile-wide review policy; an explicit `auto` overrides it.
    bob.peer.call(Request::GroupMode { handle: None, group: g.clone(), mode: "default".into() }).await;
    bob.peer.call(Request::Policy { review: Some("review".into()), loop_limit: None, digest_secs: None }).await;
    assert_eq!(bob.agent_says(&g, "held by the profile policy").await.unwrap()["state"], "held_for_review");
    bob.peer.call(Request::GroupMode { handle: None, group: g.clone(), mode: "auto".into() }).await;
    assert!(bob.agent_says(&g, "sent: this group is auto").await.unwrap()["id"].is_string());
    alice.sync(&g).await;
    assert_eq!(contents(&alice.take().await), ["sent: this group is auto"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_session_cannot_switch_do_not_disturb_group_mode_or_resume() {
    let relay = TestRelay::start().await;
    let (_alice, bob, g) = pair(&relay).await;
    bob.peer.open_session(&bob.handle).await;
    for on in [Some(false), Some(true), None] {
        assert_eq!(bob.peer.as_agent(&bob.handle, Request::Dnd { on }).await.unwrap_err(), "forbidden");
    }
    let mode = Request::GroupMode { handle: None, group: g.clone(), mode: "auto".into() };
    assert_eq!(bob.peer.as_agent(&bob.handle, mode).await.unwrap_err(), "forbidden");
    let resume = Request::GroupResume { handle: None, group: g.clone() };
    assert_eq!(bob.peer.as_agent(&bob.handle, resume).await.unwrap_err(), "forbidden");
    assert_eq!(
        bob.peer.as_agent(&bob.handle, Request::ReviewApprove { id: 1, text: None }).await.unwrap_err(),
        "forbidden"
    );
    assert_eq!(bob.peer.call(Request::Dnd { on: None }).await["dnd"], false);
    assert_eq!(bob.group_list().await["mode"], "default");
}

mod cli {
    use std::path::PathBuf;

    use switchboard_tests::{TestRelay, home, switchboard};

    #[tokio::test(flavor = "multi_thread")]
    async fn dnd_on_off_and_status_from_the_command_line() {
        let relay = TestRelay::start().await;
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"));
        let (_d, h) = home();
        let run = |args: &[&str]| {
            let (ok, out, err) = switchboard(&bin, &h, args);
            assert!(ok, "switchboard {args:?}: {err}");
            out
        };
        run(&["init", "--name", "carol", "--relay", &relay.url(), "--keystore", "file"]);
        assert_eq!(run(&["dnd"]).trim(), "do-not-disturb: off");
        assert_eq!(run(&["dnd", "on"]).trim(), "do-not-disturb: on");
        assert_eq!(run(&["dnd", "status", "--json"]).trim(), r#"{"dnd":true}"#);
        assert!(run(&["status", "--json"]).contains(r#""dnd":true"#));
        assert_eq!(run(&["dnd", "off", "--json"]).trim(), r#"{"dnd":false}"#);
        let (ok, _, err) = switchboard(&bin, &h, &["dnd", "maybe"]);
        assert!(!ok && err.contains("possible values"), "{err}");
    }
}

#[tokio::test]
async fn migration_0005_keeps_held_messages_and_holds_each_for_a_contact_or_a_group() {
    let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await.unwrap();
    for sql in [
        include_str!("../../core/migrations/0001_init.sql"),
        include_str!("../../core/migrations/0002_agent_sessions.sql"),
        include_str!("../../core/migrations/0003_agent_mail.sql"),
        include_str!("../../core/migrations/0004_letmeknow.sql"),
    ] {
        sqlx::raw_sql(sql).execute(&pool).await.unwrap();
    }
    // A profile from before 0005: a 1:1 send held for review, a group with the old column.
    sqlx::raw_sql(
        "PRAGMA foreign_keys = OFF; \
         INSERT INTO review_queue (agent, contact_id, kind, body, reply_to, created_at) \
         VALUES ('coder', 7, 'ask', 'held before the upgrade', 'r1', 5); \
         INSERT INTO lmk_groups (handle, group_id, relay, joined_at, review) VALUES ('h', 'g', 'http://r', 1, 'review');",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(include_str!("../../core/migrations/0005_group_policy.sql")).execute(&pool).await.unwrap();

    type Held = (i64, String, Option<i64>, Option<String>, String, String, Option<String>, String);
    let row: Held =
        sqlx::query_as("SELECT id, agent, contact_id, group_id, kind, body, reply_to, state FROM review_queue")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        row,
        (
            1,
            "coder".into(),
            Some(7),
            None,
            "ask".into(),
            "held before the upgrade".into(),
            Some("r1".into()),
            "pending".into()
        )
    );
    let insert = |contact: Option<i64>, group: Option<&'static str>| {
        sqlx::query("INSERT INTO review_queue (agent, contact_id, group_id, kind, body, created_at) VALUES ('a', ?, ?, 'send', 't', 1)")
            .bind(contact)
            .bind(group)
            .execute(&pool)
    };
    assert!(insert(None, Some("g")).await.is_ok(), "a group send");
    assert!(insert(None, None).await.is_err(), "neither a contact nor a group");
    assert!(insert(Some(7), Some("g")).await.is_err(), "both");
    assert_eq!(sqlx::query_scalar::<_, String>("SELECT group_id FROM lmk_groups").fetch_one(&pool).await.unwrap(), "g");
    assert!(sqlx::query("SELECT review FROM lmk_groups").fetch_all(&pool).await.is_err(), "the unused column is gone");
    sqlx::query("INSERT INTO lmk_policy (handle, group_id) VALUES ('h', 'g')").execute(&pool).await.unwrap();
    let p: (i64, String) =
        sqlx::query_as("SELECT reset_rowid, outbound FROM lmk_policy").fetch_one(&pool).await.unwrap();
    assert_eq!(p, (0, "default".into()));
}

/// Every peer message a sync stores becomes a `GroupMessage` event (what the desktop app notifies
/// from), with the sender's name; one written by another session of the same profile is marked
/// `own`, so the app neither counts nor notifies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_group_messages_are_events_and_a_sibling_sessions_are_marked_own() {
    use switchboard_core::engine::Event;
    let relay = TestRelay::start().await;
    let (alice, bob, g) = pair(&relay).await;
    // A message stored before the sibling exists: the runtime has read its sessions' keys once.
    bob.say(&g, "before the sibling").await;
    alice.sync(&g).await;
    // A second session on alice's profile joins the same group.
    let sibling = alice.rt().lmk_session(Some("cedar-finch"), Some("alice's reviewer")).await.unwrap();
    assert_eq!(sibling["handle"], "cedar-finch");
    let inv = alice.rt().lmk_invite(&alice.handle, Some(&g), None).await.unwrap();
    let (joined, admitted) = tokio::join!(
        alice.rt().lmk_join("cedar-finch", inv["link"].as_str().unwrap(), Some(60)),
        alice.rt().lmk_invite_wait(inv["invite"].as_str().unwrap())
    );
    joined.unwrap();
    admitted.unwrap();
    alice.sync(&g).await;
    let mut events = alice.rt().subscribe();

    bob.say(&g, "from bob").await;
    alice.sync(&g).await;
    alice.rt().lmk_sync("cedar-finch", &g, 0).await.unwrap();
    alice.rt().lmk_send("cedar-finch", &g, "from alice's other session", None, None).await.unwrap();
    alice.sync(&g).await;

    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let Event::GroupMessage { handle, group, from, own, .. } = e {
            assert_eq!(group, g);
            seen.push((handle, from, own));
        }
    }
    let want = |h: &str, from: &str, own: bool| (h.to_owned(), from.to_owned(), own);
    assert_eq!(
        seen,
        [
            want(&alice.handle, "bob's agent", false),
            want("cedar-finch", "bob's agent", false),
            want(&alice.handle, "alice's reviewer", true),
        ],
        "one event per stored peer message, per local session"
    );
}
