//! A group's delivery policy (in its chat's details) end to end in headless Chromium: `switchboard ui` serves
//! the built ui/dist and runs alice's runtime (loop limit 1); `ui/e2e/group_policy.e2e.mjs`
//! creates a group in the window, switches its outbound mode to review, sees the loop guard's
//! banner after bob's messages and resumes the group, then approves alice's agent's held group
//! send on the review screen, which bob receives. This test plays bob and alice's agent session
//! (a session token from alice's bridge, as `switchboard mcp` would get). Nothing is built here:
//! scripts/install-deps.sh installs chromium, runs `npm ci` and builds ui/dist.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_core::api::Request;
use switchboard_tests::browser::{Driver, require_browser, run_scenario, serve_ui};
use switchboard_tests::{Peer, TestRelay, bridge_of, open_session, switchboard};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

/// Bob (a group member in another profile) and alice's agent, as the browser scenario asks.
struct World {
    bob: Peer,
    bob_handle: String,
    alice_home: PathBuf,
    http: reqwest::Client,
    /// Alice's agent's session token, once it attached to her group session.
    agent: Option<String>,
}

impl World {
    /// Alice's agent attaches to her group session (the window's): a session token from her
    /// bridge, as `switchboard mcp` would get. From then on the window's look at the group no
    /// longer marks its messages read: they are the agent's to take.
    async fn alice_agent(&mut self) -> Result<String, String> {
        if let Some(t) = &self.agent {
            return Ok(t.clone());
        }
        let (url, _, owner) = bridge_of(&self.alice_home);
        let groups: Value = self
            .http
            .post(&url)
            .bearer_auth(&owner)
            .json(&json!({"op": "group_list"}))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        let handle = groups[0]["handle"].as_str().ok_or(format!("no group session: {groups}"))?.to_owned();
        let token = open_session(&self.http, &url, &owner, &handle).await;
        self.agent = Some(token.clone());
        Ok(token)
    }
}

impl Driver for World {
    async fn handle(&mut self, req: &Value) -> Result<Value, String> {
        let s = |k: &str| req[k].as_str().unwrap_or_default().to_owned();
        match req["op"].as_str().unwrap_or("") {
            "bob_join" => {
                let joined = self.bob.rt.lmk_join(&self.bob_handle, &s("link"), Some(60)).await;
                Ok(joined.map_err(|e| e.to_string())?["group"].clone())
            }
            "bob_say" => {
                let sent = self.bob.rt.lmk_send(&self.bob_handle, &s("group"), &s("text"), None, None).await;
                sent.map_err(|e| e.to_string())
            }
            "bob_wait_for" => {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                loop {
                    self.bob.rt.lmk_sync(&self.bob_handle, &s("group"), 2).await.map_err(|e| e.to_string())?;
                    let got = self.bob.rt.lmk_deliveries(&self.bob_handle).await.map_err(|e| e.to_string())?;
                    if let Some(m) = got["items"].as_array().unwrap().iter().find(|i| i["content"] == req["text"]) {
                        return Ok(m.clone());
                    }
                    if tokio::time::Instant::now() > deadline {
                        return Err(format!("bob never got {}", req["text"]));
                    }
                }
            }
            "alice_agent_attach" => Ok(Value::from(self.alice_agent().await?.len())),
            "alice_agent_send" => {
                // Alice's agent session is her group session's handle, with its own token.
                let agent = self.alice_agent().await?;
                let (url, _, _) = bridge_of(&self.alice_home);
                let sent: Value = self
                    .http
                    .post(&url)
                    .bearer_auth(&agent)
                    .json(&json!({"op": "group_send", "group": s("group"), "text": s("text")}))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?
                    .json()
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(sent)
            }
            other => Err(format!("unknown driver op {other}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_screen_switches_review_mode_resumes_the_loop_guard_and_approves_a_group_send() {
    require_browser();
    let relay = TestRelay::start().await;
    let bob = Peer::offline("bob", &relay.url()).await;
    bob.call(Request::Policy { review: None, loop_limit: Some(10_000), digest_secs: Some(0) }).await;
    let bob_handle = bob.rt.lmk_session(Some("brave-heron"), Some("Bob's agent")).await.unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_owned();

    // Alice: an initialised profile whose loop guard stops after one hop; `switchboard ui` runs it.
    let home = tempfile::tempdir().unwrap();
    let alice_home = home.path().join("alice");
    for args in [
        &["init", "--name", "Alice", "--relay", &relay.url(), "--keystore", "file"][..],
        &["policy", "--loop-limit", "1", "--digest", "0"],
    ] {
        let (ok, _, err) = switchboard(&bin(), &alice_home, args);
        assert!(ok, "switchboard {args:?}: {err}");
    }
    let (mut ui_proc, url) = serve_ui(&bin(), &alice_home).await;
    let mut world = World { bob, bob_handle, alice_home, http: reqwest::Client::new(), agent: None };
    let shots =
        run_scenario("group_policy.e2e.mjs", &url, &[], "ui-group-policy-e2e", Duration::from_secs(180), &mut world)
            .await;
    assert!(shots.join("02-loop-guard-paused.png").is_file());
    ui_proc.start_kill().unwrap();
}
