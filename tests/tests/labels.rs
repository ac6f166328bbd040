//! The fence label and DTOs say only what each protocol proves about a sender, through a real
//! relay-lite over real HTTP: letagents and Agent Mail messages are signed end to end by the
//! sender's key; a Stringcup sender is only asserted by the relay (seed 003 B.6), so its
//! verified safety number must not read as if it vouched for who sent the message.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use serde_json::Value;
use switchboard_core::api::Request;
use switchboard_tests::{Peer, TestRelay, befriend, home, switchboard_ok};

/// The fence's preamble (everything before the opening marker line).
fn preamble(text: &str) -> &str {
    let close = text.lines().last().unwrap();
    let marker = close.strip_suffix(">>>").unwrap();
    &text[..text.find(&format!("<<<{marker}")).unwrap()]
}

/// The one delivery agent `coder` of `p` gets next.
async fn delivered(p: &Peer) -> Value {
    let got = p.agent_wait("coder", 0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    got[0].clone()
}

/// Digests are handed over at once (no tick to wait for).
async fn digest_now(p: &Peer) {
    p.call(Request::Policy { review: None, loop_limit: None, digest_secs: Some(0) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn letagents_label_says_the_sender_signed_end_to_end() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    befriend(&alice, &bob).await;
    bob.open_session("coder").await;
    digest_now(&bob).await;
    alice.send("bob", "hello").await;
    let m = delivered(&bob).await;
    assert_eq!(m["sender_auth"], "signed_end_to_end");
    let fp = m["fingerprint"].as_str().unwrap();
    let pre = preamble(m["text"].as_str().unwrap());
    assert!(pre.contains(&format!("From: letagents contact alice; safety number {fp}; NOT verified.")), "{pre}");
    assert!(pre.contains("Sender: signed end to end by the key with that safety number"), "{pre}");
    assert!(!pre.contains("asserted by the relay"), "{pre}");
    let c = bob.call(Request::ContactList).await;
    assert_eq!(c[0]["sender_auth"], "signed_end_to_end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_mail_label_says_the_sender_signed_end_to_end() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let bob_address = bob.call(Request::Whoami).await["agent_mail"]["address"].as_str().unwrap().to_owned();
    alice.add_contact(&bob_address, "bob").await;
    alice
        .call(Request::MailSend {
            contact: "bob".into(),
            text: "hi".into(),
            subject: None,
            reply_to: None,
            attachments: vec![],
        })
        .await;
    let reqs = bob.call(Request::ContactRequests).await;
    let name = reqs[0]["name"].as_str().unwrap().to_owned();
    bob.call(Request::ContactAccept { name: name.clone(), new_name: None }).await;
    bob.open_session("coder").await;
    digest_now(&bob).await;
    alice
        .call(Request::MailSend {
            contact: "bob".into(),
            text: "again".into(),
            subject: None,
            reply_to: None,
            attachments: vec![],
        })
        .await;
    // The agent's queue starts with the catch-up: both messages, each labelled the same way.
    let got = bob.agent_wait("coder", 0).await;
    assert!(!got.is_empty());
    for m in &got {
        assert_eq!(m["protocol"], "agent-mail");
        assert_eq!(m["sender_auth"], "signed_end_to_end");
        let pre = preamble(m["text"].as_str().unwrap());
        assert!(pre.contains("Sender: signed end to end by the key with that safety number"), "{pre}");
        assert!(!pre.contains("asserted by the relay"), "{pre}");
    }
    let view = bob.call(Request::Conversation { contact: name, limit: None }).await;
    assert!(view.as_array().unwrap().iter().all(|m| m["sender_auth"] == "signed_end_to_end"), "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stringcup_label_says_the_relay_asserted_the_sender_even_when_verified() {
    let relay = TestRelay::start().await;
    let alice = Peer::offline("alice", &relay.url()).await;
    let bob = Peer::offline("bob", &relay.url()).await;
    alice.add_contact(&bob.stringcup_id().await, "bob").await;
    alice.send("bob", "hello").await;
    bob.call(Request::ContactRequests).await;
    bob.call(Request::ContactAccept { name: "alice".into(), new_name: None }).await;
    bob.call(Request::ContactVerify { name: "alice".into() }).await;
    bob.open_session("coder").await;
    digest_now(&bob).await;
    let m = delivered(&bob).await;
    assert_eq!(m["sender_auth"], "asserted_by_relay");
    assert_eq!(m["verified"], true);
    let fp = m["fingerprint"].as_str().unwrap();
    let pre = preamble(m["text"].as_str().unwrap());
    assert!(
        pre.contains("From: stringcup contact alice; sender asserted by the relay, NOT authenticated end to end"),
        "{pre}"
    );
    assert!(
        pre.contains(&format!(
            "Their key: safety number {fp}, verified by your operator; it protects what is sent to them"
        )),
        "{pre}"
    );
    // The verified safety number must not read as a statement about who sent this.
    assert!(!pre.contains(&format!("safety number {fp}; verified by your operator")), "{pre}");
    assert!(!pre.contains("signed end to end"), "{pre}");

    // The owner's views say the same.
    alice.send("bob", "second").await;
    let inbox = bob.call(Request::Inbox { all: true, wait_secs: 0 }).await;
    assert!(inbox.as_array().unwrap().iter().all(|m| m["sender_auth"] == "asserted_by_relay"), "{inbox}");
    let c = bob.call(Request::ContactList).await;
    assert_eq!(c[0]["sender_auth"], "asserted_by_relay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_inbox_says_what_is_known_about_each_sender() {
    let relay = TestRelay::start().await;
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"));
    let (_a, alice) = home();
    let (_b, bob) = home();
    switchboard_ok(&bin, &alice, &["init", "--name", "alice", "--relay", &relay.url()]);
    switchboard_ok(&bin, &bob, &["init", "--name", "bob", "--relay", &relay.url()]);
    let who: Value = serde_json::from_str(&switchboard_ok(&bin, &bob, &["whoami", "--json"])).unwrap();
    let sc = who["stringcup"]["id"].as_str().unwrap();
    let la = who["letagents"]["address"].as_str().unwrap();
    switchboard_ok(&bin, &alice, &["contact", "add", sc, "--name", "bob-sc"]);
    switchboard_ok(&bin, &alice, &["contact", "add", la, "--name", "bob-la"]);
    switchboard_ok(&bin, &alice, &["send", "bob-sc", "over stringcup"]);
    let reqs: Value = serde_json::from_str(&switchboard_ok(&bin, &bob, &["contact", "requests", "--json"])).unwrap();
    for r in reqs.as_array().unwrap() {
        switchboard_ok(&bin, &bob, &["contact", "accept", r["name"].as_str().unwrap()]);
    }
    switchboard_ok(&bin, &alice, &["send", "bob-la", "over letagents"]);
    let out = switchboard_ok(&bin, &bob, &["inbox"]);
    let line = |needle: &str| out.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}: {out}"));
    assert!(line("over stringcup").contains("(sender asserted by the relay, not authenticated end to end)"), "{out}");
    assert!(line("over letagents").contains("(sender signed end to end)"), "{out}");
    let list = switchboard_ok(&bin, &bob, &["contact", "list"]);
    assert!(list.contains("sender asserted by the relay"), "{list}");
}
