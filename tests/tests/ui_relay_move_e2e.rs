//! Moving to another relay from Settings, end to end in headless Chromium: `switchboard ui` runs
//! alice (her profile on one relay-lite, where carol, a letagents contact, reaches her);
//! `ui/e2e/relay_move.e2e.mjs` has her approve carol and dave (a Stringcup contact there), then
//! tries a relay that is down and a
//! self-signed one without its fingerprint (each confirmed, then refused in plain words, nothing
//! changed), then moves with the certificate's SHA-256 after a confirmation that says carol will be
//! told. Carol gets the signed notice (with the new relay's pin) through the old relay and her
//! next message reaches alice on the new one; bob, whose profile lives only on the new relay,
//! says hello, alice approves in the UI and his message arrives. Dave, who cannot follow (a
//! Stringcup id belongs to its relay), stays on the old relay, and he and alice still reach each
//! other there. This test plays carol, bob and dave.
//! Nothing is built here: scripts/install-deps.sh installs chromium, runs `npm ci` and builds
//! ui/dist.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use switchboard_core::bridge::api::Request;
use switchboard_tests::browser::{Driver, require_browser, run_scenario, serve_ui};
use switchboard_tests::{Peer, TestRelay, add_request, send_request, switchboard_ok};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

/// Carol (letagents) and dave (Stringcup), on alice's old relay; bob, on the relay alice moves
/// to.
struct World {
    carol: Peer,
    bob: Peer,
    dave: Peer,
}

impl Driver for World {
    async fn handle(&mut self, req: &Value) -> Result<Value, String> {
        let s = |k: &str| req[k].as_str().unwrap_or_default().to_owned();
        match req["op"].as_str().unwrap_or("") {
            "bob_hello" => self.bob.request(add_request(&s("to"), "alice")).await,
            "bob_say" => self.bob.request(send_request("alice", &s("text"))).await,
            "carol_hello" => self.carol.request(add_request(&s("to"), "alice")).await,
            // What carol's runtime now knows of alice: the move line, once it arrived, and her route.
            "carol_sees_move" => {
                for _ in 0..100 {
                    let got = self.carol.request(Request::Inbox { all: true, wait_secs: 0 }).await?;
                    if let Some(line) = got.as_array().into_iter().flatten().find(|m| m["kind"] == "moved") {
                        let contacts = self.carol.request(Request::ContactList).await?;
                        let alice = contacts.as_array().into_iter().flatten().find(|c| c["name"] == "alice");
                        let trusted = self.carol.request(Request::RelayTrusted).await?;
                        return Ok(serde_json::json!({
                            "line": line,
                            "relay": alice.map(|c| c["relay"].clone()),
                            "trusted": trusted,
                        }));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err("carol never got alice's move notice".into())
            }
            "carol_say" => self.carol.request(send_request("alice", &s("text"))).await,
            // Dave adds alice's Stringcup id and writes to it.
            "dave_hello" => {
                self.dave.request(add_request(&s("to"), "alice")).await?;
                self.dave.request(send_request("alice", &s("text"))).await
            }
            "dave_say" => self.dave.request(send_request("alice", &s("text"))).await,
            // Waits until `text` from alice reaches dave.
            "dave_wait_for" => {
                for _ in 0..150 {
                    let got = self.dave.request(Request::Inbox { all: true, wait_secs: 0 }).await?;
                    if let Some(m) = got.as_array().into_iter().flatten().find(|m| m["body"] == s("text").as_str()) {
                        return Ok(m.clone());
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(format!("dave never got {:?}", s("text")))
            }
            other => Err(format!("unknown driver op {other}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_to_another_relay_in_settings_refuses_what_does_not_answer_then_moves_and_is_reached_there() {
    require_browser();
    let new_relay = TestRelay::start_tls().await;
    let cert = new_relay.cert_sha256.clone().unwrap();
    let bob = Peer::offline_pinned("Bob", &new_relay.url(), Some(&cert)).await;
    let mut down = TestRelay::start().await;
    let down_url = down.url();
    down.stop().await;
    let old_relay = TestRelay::start().await;
    let carol = Peer::offline("Carol", &old_relay.url()).await;
    let dave = Peer::offline("Dave", &old_relay.url()).await;
    let home = tempfile::tempdir().unwrap();
    let alice_home = home.path().join("alice");
    switchboard_ok(
        &bin(),
        &alice_home,
        &["init", "--name", "Alice", "--relay", &old_relay.url(), "--keystore", "file"],
    );
    let (mut ui_proc, url) = serve_ui(&bin(), &alice_home).await;
    let mut world = World { carol, bob, dave };
    let env = [
        ("NEW_RELAY_URL", new_relay.url().trim_end_matches('/').to_owned()),
        ("NEW_RELAY_CERT", cert),
        ("DOWN_RELAY_URL", down_url),
    ];
    let shots =
        run_scenario("relay_move.e2e.mjs", &url, &env, "ui-relay-move-e2e", Duration::from_secs(180), &mut world).await;
    assert!(shots.join("moved.png").is_file());
    ui_proc.start_kill().unwrap();
}
