//! The UI end to end in headless Chromium: `switchboard ui` serves the built ui/dist and runs the
//! runtime for a new profile; `ui/e2e/app.e2e.mjs` (playwright-core, Debian's chromium) walks
//! first run, paste-to-add, a conversation with a second profile (unread counts, Enter to send,
//! 480×400), the relay going down and coming back, a hello request (approved under a name), a
//! person added by contact link whose message moves from letagents to Agent Mail when the relay
//! stays down, verification, a key change,
//! message search, dark mode, review mode with an agent's held message, and every main screen in
//! light and dark at two sizes, asking this test to act as the other parties. Nothing is built here:
//! scripts/install-deps.sh installs chromium, runs `npm ci` and builds ui/dist; a missing piece
//! fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_core::api::Request;
use switchboard_core::engine::FALL_BACK_UNREACHABLE_AFTER_MS;
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::protocol::letagents::{self as la, Inner, Kind};
use switchboard_core::transport::letagents::{RelayClient, SendOutcome};
use switchboard_core::util::{OsRng, now_ms};
use switchboard_tests::browser::{Driver, require_browser, run_scenario, serve_ui};
use switchboard_tests::{Peer, TestRelay, bridge_of, open_session, profile_db};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

fn send(contact: &str, text: &str, kind: &str, reply_to: Option<&str>) -> Request {
    Request::Send {
        contact: contact.into(),
        text: text.into(),
        kind: Some(kind.into()),
        reply_to: reply_to.map(Into::into),
        from_agent: None,
        to_agent: None,
    }
}

/// The other parties the browser talks to.
struct World {
    bob: Peer,
    carol: Peer,
    /// Mallory after changing her box key (same signing key).
    mallory_rekeyed: DeviceIdentity,
    relay: RelayClient,
    bob_calls_alice: Option<String>,
    /// Dave, whom Alice adds by his contact link (a person with three channels).
    dave: Option<Peer>,
    /// The relay everyone uses: stopped and restarted to show the connection bar.
    test_relay: TestRelay,
    /// Alice's profile directory (her runtime is `switchboard ui`'s): her bridge for agents.
    alice_home: PathBuf,
    http: reqwest::Client,
}

impl Driver for World {
    async fn handle(&mut self, req: &Value) -> Result<Value, String> {
        match req["op"].as_str().unwrap_or("") {
            "bob_accept" => {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                loop {
                    let pending = self.bob.call(Request::ContactRequests).await;
                    if let Some(c) = pending.as_array().and_then(|a| a.first()) {
                        let name = c["name"].as_str().unwrap().to_owned();
                        if c["address"] != req["from"] {
                            return Err(format!("bob's request is from someone else: {c}"));
                        }
                        self.bob.call(Request::ContactAccept { name: name.clone(), new_name: None }).await;
                        self.bob_calls_alice = Some(name);
                        return Ok(json!(true));
                    }
                    if tokio::time::Instant::now() > deadline {
                        return Err(format!(
                            "no hello from alice reached bob; {}; {}",
                            seen(&self.bob).await,
                            self.alice_outbox().await
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            "bob_wait_for" => {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                loop {
                    for m in self.bob.inbox(2).await {
                        if m["body"] == req["text"] {
                            return Ok(m);
                        }
                    }
                    if tokio::time::Instant::now() > deadline {
                        return Err(format!(
                            "bob never got {}; {}; {}",
                            req["text"],
                            seen(&self.bob).await,
                            self.alice_outbox().await
                        ));
                    }
                }
            }
            "bob_send" => {
                let alice = self.bob_calls_alice.clone().ok_or("bob has not accepted alice")?;
                let kind = req["kind"].as_str().unwrap_or("send");
                self.bob.try_call(send(&alice, req["text"].as_str().unwrap(), kind, None)).await
            }
            "carol_hello" => {
                self.carol
                    .try_call(Request::ContactAdd {
                        address: req["to"].as_str().unwrap().into(),
                        name: Some("alice".into()),
                        allow: None,
                        relay: None,
                        no_hello: false,
                    })
                    .await
            }
            "mallory_rekey" => {
                // Same signing key, a new box key: a reinstalled (or compromised) device.
                let alice = la::Address::parse(req["to"].as_str().unwrap()).map_err(|e| e.to_string())?;
                let inner = Inner::new(
                    &self.mallory_rekeyed.keys(),
                    &alice.keys.mailbox_id(),
                    now_ms(),
                    uuid::Uuid::new_v4(),
                    Kind::Send,
                    json!("new key, who dis"),
                );
                let env = la::seal(
                    &self.mallory_rekeyed.sig,
                    &alice.keys,
                    &serde_json::to_string(&inner).unwrap(),
                    &mut OsRng,
                )
                .unwrap();
                match self.relay.send(&alice.keys.mailbox_id(), &alice.drop.unwrap(), env).await {
                    SendOutcome::Accepted => Ok(json!(true)),
                    other => Err(format!("relay refused mallory's envelope: {other:?}")),
                }
            }
            "mallory_new_safety" => Ok(json!(self.mallory_rekeyed.keys().safety_number())),
            "dave_link" => {
                let dave = Peer::live("dave", &self.test_relay.url()).await;
                let who = dave.call(Request::Whoami).await;
                let link = who["contact_link"]["link"].clone();
                self.dave = Some(dave);
                Ok(link)
            }
            "dave_wait_for" => {
                let dave = self.dave.as_ref().ok_or("no dave yet")?;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                loop {
                    // Alice is new to Dave: her hello and her first mail are requests he accepts.
                    for r in dave.call(Request::ContactRequests).await.as_array().cloned().unwrap_or_default() {
                        let name = r["name"].as_str().unwrap_or_default().to_owned();
                        dave.call(Request::ContactAccept { name, new_name: None }).await;
                    }
                    for m in dave.inbox(1).await {
                        if m["body"] == req["text"] {
                            return Ok(m);
                        }
                    }
                    if tokio::time::Instant::now() > deadline {
                        return Err(format!(
                            "dave never got {}; {}; {}",
                            req["text"],
                            seen(dave).await,
                            self.alice_outbox().await
                        ));
                    }
                }
            }
            "alice_age_outbox" => {
                // Alice's message has waited past the fall-back delay, and is due now.
                let db = profile_db(&self.alice_home).await;
                let aged = sqlx::query(
                    "UPDATE outbox SET created_at = created_at - ?1, next_attempt_at = 0 WHERE message_id IN \
                     (SELECT id FROM messages WHERE direction = 'out' AND body = ?2)",
                )
                .bind(FALL_BACK_UNREACHABLE_AFTER_MS + 1_000)
                .bind(req["text"].as_str().unwrap_or_default())
                .execute(&db)
                .await
                .map_err(|e| e.to_string())?
                .rows_affected();
                db.close().await;
                if aged == 1 { Ok(json!(true)) } else { Err(format!("{aged} outbox rows for {}", req["text"])) }
            }
            "relay_stop" => {
                self.test_relay.stop().await;
                Ok(json!(true))
            }
            "relay_restart" => {
                self.test_relay.restart().await;
                Ok(json!(true))
            }
            "alice_agent_send" => {
                // One of alice's agents, through her bridge with its own session: held for
                // review when her policy says so.
                let body = json!({"op": "send", "contact": req["to"], "text": req["text"]});
                self.alice_agent(req["agent"].as_str().unwrap_or("coder"), &body).await
            }
            "alice_agent" => {
                // Any request as one of alice's agents (wait for deliveries, ack them).
                self.alice_agent(req["agent"].as_str().unwrap_or("coder"), &req["body"]).await
            }
            "bob_send_to_agent" => {
                // Bob writes to one of alice's agents by name.
                let alice = self.bob_calls_alice.clone().ok_or("bob has not accepted alice")?;
                let mut r = send(&alice, req["text"].as_str().unwrap(), "send", None);
                if let Request::Send { to_agent, .. } = &mut r {
                    *to_agent = req["agent"].as_str().map(Into::into);
                }
                self.bob.try_call(r).await
            }
            other => Err(format!("unknown driver op {other}")),
        }
    }
}

/// What a waiting party saw, for a driver's timeout: its relay connection, its pending requests
/// and its newest messages (a CI log then tells a lost message from a dead connection).
async fn seen(p: &Peer) -> String {
    let status = p.request(Request::Status).await.unwrap_or_else(|e| json!(e));
    let requests = p.request(Request::ContactRequests).await.unwrap_or_else(|e| json!(e));
    let inbox = p.request(Request::Inbox { all: true, wait_secs: 0 }).await.unwrap_or_else(|e| json!(e));
    let newest: Vec<Value> = inbox
        .as_array()
        .map(|a| a.iter().rev().take(5).map(|m| json!([m["protocol"], m["from"], m["body"]])).collect())
        .unwrap_or_default();
    format!(
        "{} sees its relay as {} ({}), outbox {}, requests {requests}, newest messages {}",
        p.name,
        status["relays"][0]["health"]["state"],
        status["relays"][0]["health"]["last_error"],
        status["outbox"],
        Value::from(newest)
    )
}

impl World {
    /// What waits in alice's outbox (protocol, attempts, last error), for a driver's timeout.
    async fn alice_outbox(&self) -> String {
        let db = profile_db(&self.alice_home).await;
        let rows: Vec<(String, String, i64, String)> = sqlx::query_as(
            "SELECT o.protocol, COALESCE(m.body, ''), o.attempts, o.last_error FROM outbox o \
             LEFT JOIN messages m ON m.id = o.message_id AND m.direction = 'out' ORDER BY o.id",
        )
        .fetch_all(&db)
        .await
        .unwrap_or_default();
        db.close().await;
        format!("alice's outbox: {rows:?}")
    }

    /// `body` as alice's agent `agent`, through her bridge with the agent's own session.
    async fn alice_agent(&self, agent: &str, body: &Value) -> Result<Value, String> {
        let (url, _, owner) = bridge_of(&self.alice_home);
        let token = open_session(&self.http, &url, &owner, agent).await;
        let sent = self.http.post(&url).bearer_auth(&token).json(body).send().await.map_err(|e| e.to_string())?;
        sent.json::<Value>().await.map_err(|e| e.to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_in_chromium_first_run_paste_converse_approve_verify_and_key_change() {
    require_browser();
    let relay = TestRelay::start().await;
    let bob = Peer::live("bob", &relay.url()).await;
    let carol = Peer::live("carol", &relay.url()).await;
    let mallory = DeviceIdentity::generate(&mut OsRng);
    let relay_client = RelayClient::new(&relay.url(), None).unwrap();
    // Log in once so Mallory's mailbox exists for Alice's hello.
    relay_client.inbox(&mallory.sig, &mallory.drop).await.unwrap();
    let mallory_rekeyed = DeviceIdentity {
        sig: ed25519_dalek::SigningKey::from_bytes(&mallory.sig.to_bytes()),
        boxs: x25519_dalek::StaticSecret::from([42u8; 32]),
        drop: mallory.drop,
    };
    let bob_who = bob.call(Request::Whoami).await;
    let mallory_address = mallory.address().to_string();
    let relay_url = relay.url();

    // Alice: a new profile, its runtime and UI served by `switchboard ui`.
    let home = tempfile::tempdir().unwrap();
    let alice_home = home.path().join("alice");
    let (mut ui_proc, url) = serve_ui(&bin(), &alice_home).await;
    let mut world = World {
        bob,
        carol,
        mallory_rekeyed,
        relay: relay_client,
        bob_calls_alice: None,
        dave: None,
        test_relay: relay,
        alice_home,
        http: reqwest::Client::new(),
    };
    let env = [
        ("RELAY_URL", relay_url),
        ("BOB_ADDRESS", bob_who["letagents"]["address"].as_str().unwrap().to_owned()),
        ("BOB_SAFETY", bob_who["letagents"]["safety_number"].as_str().unwrap().to_owned()),
        ("CAROL_NAME", "carol".to_owned()),
        ("MALLORY_ADDRESS", mallory_address),
    ];
    let shots = run_scenario("app.e2e.mjs", &url, &env, "ui-e2e", Duration::from_secs(540), &mut world).await;
    assert!(shots.join("07-key-changed.png").is_file());
    ui_proc.start_kill().unwrap();
}
