//! Trusting a relay in the UI, end to end in headless Chromium: `switchboard ui` runs alice
//! (her profile on one relay-lite); bob's profile lives on another relay-lite serving a
//! self-signed certificate (as a relay hosted on a laptop does), and no contact of alice's
//! announced it. `ui/e2e/relay_trust.e2e.mjs` pastes bob's invite link: the join dialog asks
//! "Trust this relay?" with its URL and the certificate's SHA-256 instead of failing, and only
//! "Trust this relay and join" trusts it; the join then goes through and bob's message arrives.
//! This test plays bob. Nothing is built here: scripts/install-deps.sh installs chromium, runs
//! `npm ci` and builds ui/dist.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use switchboard_core::bridge::api::Request;
use switchboard_tests::browser::{Driver, require_browser, run_scenario, serve_ui};
use switchboard_tests::{Peer, TestRelay, switchboard_ok};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

/// Bob, on his self-signed relay.
struct World {
    bob: Peer,
    group: Option<String>,
}

impl Driver for World {
    async fn handle(&mut self, req: &Value) -> Result<Value, String> {
        let s = |k: &str| req[k].as_str().unwrap_or_default().to_owned();
        match req["op"].as_str().unwrap_or("") {
            "bob_invite" => {
                let made = self.bob.request(Request::GroupCreate { name: s("name") }).await?;
                let group = made["group"].as_str().unwrap_or_default().to_owned();
                self.group = Some(group.clone());
                let inv =
                    self.bob.request(Request::GroupInvite { handle: None, group: Some(group), ttl_secs: None }).await?;
                Ok(inv["link"].clone())
            }
            "bob_say" => {
                let group = self.group.clone().ok_or("bob made no group")?;
                self.bob
                    .request(Request::GroupSend { handle: None, group, text: s("text"), to: None, reply_to: None })
                    .await
            }
            other => Err(format!("unknown driver op {other}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_a_group_on_an_unknown_self_signed_relay_asks_to_trust_its_certificate_first() {
    require_browser();
    let bobs_relay = TestRelay::start_tls().await;
    let cert = bobs_relay.cert_sha256.clone().unwrap();
    let bob = Peer::offline_pinned("Bob", &bobs_relay.url(), Some(&cert)).await;
    let alices_relay = TestRelay::start().await;
    let home = tempfile::tempdir().unwrap();
    let alice_home = home.path().join("alice");
    switchboard_ok(
        &bin(),
        &alice_home,
        &["init", "--name", "Alice", "--relay", &alices_relay.url(), "--keystore", "file"],
    );
    let (mut ui_proc, url) = serve_ui(&bin(), &alice_home).await;
    let mut world = World { bob, group: None };
    let env = [("RELAY_URL", bobs_relay.url()), ("RELAY_CERT", cert)];
    let shots =
        run_scenario("relay_trust.e2e.mjs", &url, &env, "ui-relay-trust-e2e", Duration::from_secs(180), &mut world)
            .await;
    assert!(shots.join("trust-relay.png").is_file());
    ui_proc.start_kill().unwrap();
}
