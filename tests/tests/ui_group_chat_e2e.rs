//! Groups as conversations end to end in headless Chromium: `switchboard ui` serves the built
//! ui/dist and runs alice's runtime (carol is her contact); `ui/e2e/group_chat.e2e.mjs` sees the
//! empty Groups screen, creates a named group, watches its invite link turn "used" when bob joins,
//! reads bob's message from the chat list (unread, preview, ordered with contacts), answers in the
//! chat view, renames the group, and joins bob's group from a pasted link ("Join group?" with
//! bob's name). This test plays bob, a profile on the same relay-lite. Nothing is built here:
//! scripts/install-deps.sh installs chromium, runs `npm ci` and builds ui/dist.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use switchboard_core::api::Request;
use switchboard_tests::browser::{Driver, require_browser, run_scenario, serve_ui};
use switchboard_tests::{Peer, TestRelay, switchboard_ok};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

/// Bob, as the browser scenario asks: he joins, talks, reads and invites, as his own session.
struct World {
    bob: Peer,
    /// The group bob made ("Band practice").
    band: Option<String>,
}

impl World {
    /// Bob's session in `group` (his default one).
    async fn handle_in(&self, group: &str) -> Result<String, String> {
        let all = self.bob.request(Request::GroupList { handle: None }).await?;
        let g = all.as_array().and_then(|a| a.iter().find(|g| g["group"] == group).cloned());
        Ok(g.ok_or(format!("bob is not in {group}"))?["handle"].as_str().unwrap_or_default().to_owned())
    }
}

impl Driver for World {
    async fn handle(&mut self, req: &Value) -> Result<Value, String> {
        let s = |k: &str| req[k].as_str().unwrap_or_default().to_owned();
        match req["op"].as_str().unwrap_or("") {
            "bob_join" => {
                let joined = self
                    .bob
                    .request(Request::GroupJoin { handle: None, link: s("link"), timeout_secs: Some(60) })
                    .await?;
                Ok(joined["group"].clone())
            }
            "bob_fingerprint" => {
                let all = self.bob.request(Request::GroupList { handle: None }).await?;
                let group = all[0]["group"].as_str().unwrap_or_default().to_owned();
                let members = self.bob.request(Request::GroupMembers { handle: None, group }).await?;
                let me = members["members"].as_array().and_then(|m| m.iter().find(|m| m["you"] == true).cloned());
                Ok(me.ok_or("bob is no member")?["fingerprint"].clone())
            }
            "bob_say" => {
                self.bob
                    .request(Request::GroupSend {
                        handle: None,
                        group: s("group"),
                        text: s("text"),
                        // An @mention: the member addressed, by fingerprint.
                        to: req["to"].as_str().map(Into::into),
                        reply_to: None,
                    })
                    .await
            }
            "bob_wait_for" => {
                let group = s("group");
                let handle = self.handle_in(&group).await?;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                loop {
                    self.bob.rt.lmk_sync(&handle, &group, 2).await.map_err(|e| e.to_string())?;
                    let page = self
                        .bob
                        .request(Request::GroupHistory {
                            handle: None,
                            group: group.clone(),
                            before: None,
                            limit: None,
                            mark_read: true,
                        })
                        .await?;
                    let found = page["messages"]
                        .as_array()
                        .and_then(|m| m.iter().find(|m| m["content"] == req["text"]).cloned());
                    if let Some(m) = found {
                        return Ok(m);
                    }
                    if tokio::time::Instant::now() > deadline {
                        return Err(format!("bob never got {}", req["text"]));
                    }
                }
            }
            "bob_invite" => {
                let made = self.bob.request(Request::GroupCreate { name: s("name") }).await?;
                let group = made["group"].as_str().unwrap_or_default().to_owned();
                self.band = Some(group.clone());
                let inv =
                    self.bob.request(Request::GroupInvite { handle: None, group: Some(group), ttl_secs: None }).await?;
                Ok(inv["link"].clone())
            }
            "bob_invite_unnamed" => {
                // As `switchboard invite` with no group: a new group that has no name.
                let inv = self.bob.request(Request::GroupInvite { handle: None, group: None, ttl_secs: None }).await?;
                Ok(inv["link"].clone())
            }
            "bob_band" => Ok(Value::from(self.band.clone().ok_or("bob made no group")?)),
            other => Err(format!("unknown driver op {other}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_is_a_chat_named_invited_to_read_written_renamed_and_joined_from_a_pasted_link() {
    require_browser();
    let relay = TestRelay::start().await;
    let bob = Peer::offline("Bob", &relay.url()).await;
    bob.call(Request::Policy { review: None, loop_limit: Some(10_000), digest_secs: Some(0) }).await;

    // Alice (initialised from the command line, carol her contact); `switchboard ui` runs her.
    let home = tempfile::tempdir().unwrap();
    let (alice_home, carol_home) = (home.path().join("alice"), home.path().join("carol"));
    let run = |home: &PathBuf, args: &[&str]| switchboard_ok(&bin(), home, args);
    run(&alice_home, &["init", "--name", "Alice", "--relay", &relay.url(), "--keystore", "file"]);
    run(&carol_home, &["init", "--name", "carol", "--relay", &relay.url(), "--keystore", "file"]);
    let carol: Value = serde_json::from_str(&run(&carol_home, &["whoami", "--json"])).unwrap();
    run(&alice_home, &["contact", "add", carol["letagents"]["address"].as_str().unwrap(), "--name", "carol"]);
    // No loop guard in the way: this is about the conversation, not the delivery policy.
    run(&alice_home, &["policy", "--loop-limit", "10000"]);
    let (mut ui_proc, url) = serve_ui(&bin(), &alice_home).await;
    let mut world = World { bob, band: None };
    let shots =
        run_scenario("group_chat.e2e.mjs", &url, &[], "ui-group-chat-e2e", Duration::from_secs(240), &mut world).await;
    assert!(shots.join("08-join-dialog.png").is_file());
    ui_proc.start_kill().unwrap();
}
