//! The shell's commands through Tauri's IPC on the mock runtime, against a real runtime: first
//! run (with a given relay, or hosting one), requests, typed errors, settings, do-not-disturb in
//! the runtime, muted conversations, and attaching to a runtime that already owns the profile.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use std::time::Instant;

use serde_json::{Value, json};
use switchboard_app::host::AppState;
use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::Profile;
use switchboard_tests::TestRelay;
use tauri::test::{MockRuntime, mock_builder};
use tauri::{App, WebviewWindow, WebviewWindowBuilder};

/// A relay address nothing listens on.
const NO_RELAY: &str = "http://127.0.0.1:9";

/// A real relay (relay-lite on a loopback port, on Tauri's runtime): first run checks that the
/// relay answers before it makes an identity.
fn relay() -> TestRelay {
    tauri::async_runtime::block_on(TestRelay::start())
}

fn app(profile: Profile) -> (App<MockRuntime>, WebviewWindow<MockRuntime>) {
    let mut state =
        tauri::async_runtime::block_on(AppState::start(profile, KeystorePreference::File, Instant::now())).unwrap();
    // A hosted relay takes any free port here (8471 may be taken by another test or app).
    state.hosted_port = 0;
    let app = switchboard_app::with_commands(mock_builder()).manage(state).build(switchboard_app::context()).unwrap();
    let webview = WebviewWindowBuilder::new(&app, "main", Default::default()).build().unwrap();
    (app, webview)
}

fn request(w: &WebviewWindow<MockRuntime>, req: Value) -> Result<Value, Value> {
    support::invoke(w, "runtime_request", json!({ "request": req }))
}

fn profile() -> (tempfile::TempDir, Profile) {
    let d = tempfile::tempdir().unwrap();
    let p = Profile { dir: d.path().join("profile") };
    (d, p)
}

#[test]
fn first_run_refuses_a_relay_that_does_not_answer_and_makes_no_identity() {
    let (_d, p) = profile();
    let (_app, w) = app(p);
    let e = support::invoke(&w, "profile_init", json!({"name": "alice", "relay": NO_RELAY})).unwrap_err();
    assert_eq!(e["code"], "relay", "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("the relay at http://127.0.0.1:9 did not answer"), "says what failed: {message}");
    assert_eq!(support::invoke(&w, "profile_initialized", json!({})).unwrap(), json!(false), "no identity made");
    let relay = relay();
    let who = support::invoke(&w, "profile_init", json!({"name": "alice", "relay": relay.url()})).unwrap();
    assert_eq!(who["name"], "alice", "the same window then succeeds with a relay that answers");
}

#[test]
fn first_run_creates_the_identity_then_requests_reach_the_runtime() {
    let relay = relay();
    let (_d, p) = profile();
    let (_app, w) = app(p.clone());
    assert_eq!(support::invoke(&w, "profile_initialized", json!({})).unwrap(), json!(false));
    let e = request(&w, json!({"op": "whoami"})).unwrap_err();
    assert_eq!(e["code"], "not_initialized");

    let who = support::invoke(&w, "profile_init", json!({"name": "alice", "relay": relay.url()})).unwrap();
    assert_eq!(who["name"], "alice");
    assert!(who["letagents"]["address"].as_str().unwrap().starts_with("la1."));
    assert_eq!(support::invoke(&w, "profile_initialized", json!({})).unwrap(), json!(true));
    assert_eq!(request(&w, json!({"op": "whoami"})).unwrap()["name"], "alice");
    assert_eq!(request(&w, json!({"op": "contact_list"})).unwrap(), json!([]));
    // The embedded runtime serves its bridge for the CLI and agents.
    assert!(p.read_bridge_files().is_some());

    let again = support::invoke(&w, "profile_init", json!({"name": "eve", "relay": relay.url()})).unwrap_err();
    assert_eq!(again["code"], "already_initialized");
}

#[test]
fn errors_cross_as_code_and_message() {
    let relay = relay();
    let (_d, p) = profile();
    let (_app, w) = app(p);
    support::invoke(&w, "profile_init", json!({"name": "alice", "relay": relay.url()})).unwrap();
    let e = request(&w, json!({"op": "contact_verify", "name": "nobody"})).unwrap_err();
    assert_eq!(e["code"], "unknown_contact");
    assert!(e["message"].as_str().unwrap().contains("nobody"));
    let e = request(&w, json!({"op": "no_such_op"})).unwrap_err();
    assert_eq!(e["code"], "invalid_input");
    let e = request(&w, json!({"op": "send", "contact": "nobody", "text": "hi"})).unwrap_err();
    assert_eq!(e["code"], "unknown_contact");
    let e = support::invoke(&w, "profile_init", json!({"name": "x", "relay": null})).unwrap_err();
    assert_eq!(e["code"], "already_initialized");
    let e = support::invoke(&w, "mute_set", json!({"conversation": "", "muted": true})).unwrap_err();
    assert_eq!(e["code"], "invalid_input");
}

#[test]
fn settings_are_kept_in_the_profile() {
    let (_d, p) = profile();
    let (_app, w) = app(p.clone());
    let s = support::invoke(&w, "settings_get", json!({})).unwrap();
    assert_eq!(s["notifications"], true);
    assert_eq!(s["do_not_disturb"], false);
    support::invoke(&w, "settings_set", json!({"key": "do_not_disturb", "value": true})).unwrap();
    assert_eq!(support::invoke(&w, "settings_get", json!({})).unwrap()["do_not_disturb"], true);
    let saved: Value = serde_json::from_slice(&std::fs::read(p.dir.join("app-settings.json")).unwrap()).unwrap();
    assert_eq!(saved["do_not_disturb"], true);
    let e = support::invoke(&w, "settings_set", json!({"key": "everything", "value": true})).unwrap_err();
    assert_eq!(e["code"], "invalid_input");
}

#[test]
fn a_second_app_attaches_to_the_runtime_that_owns_the_profile() {
    let relay = relay();
    let (_d, p) = profile();
    let (_app, owner) = app(p.clone());
    support::invoke(&owner, "profile_init", json!({"name": "alice", "relay": relay.url()})).unwrap();
    let state =
        tauri::async_runtime::block_on(AppState::start(p.clone(), KeystorePreference::File, Instant::now())).unwrap();
    assert!(tauri::async_runtime::block_on(state.attached()));
    let who = tauri::async_runtime::block_on(state.request(switchboard_core::bridge::api::Request::Whoami)).unwrap();
    assert_eq!(who["name"], "alice");
}

#[test]
fn the_window_may_call_nothing_it_was_not_granted() {
    let (_d, p) = profile();
    let (_app, w) = app(p);
    // Granted: listening to events. Not granted: emitting them, window management, anything else.
    let e = support::invoke(&w, "plugin:event|emit", json!({"event": "runtime-event", "payload": {}})).unwrap_err();
    assert!(e.as_str().unwrap().contains("not allowed"), "{e}");
    let e = support::invoke(&w, "plugin:window|close", json!({"label": "main"})).unwrap_err();
    assert!(e.as_str().unwrap().contains("not allowed"), "{e}");
    assert_eq!(support::invoke(&w, "profile_initialized", json!({})).unwrap(), json!(false));
}

#[test]
fn the_first_paint_is_reported_once() {
    let (_d, p) = profile();
    let (_app, w) = app(p);
    let a = support::invoke(&w, "app_painted", json!({})).unwrap().as_u64().unwrap();
    let b = support::invoke(&w, "app_painted", json!({})).unwrap().as_u64().unwrap();
    assert!(b >= a);
}

/// Polls `f` for up to `secs` seconds.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + std::time::Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

/// Bob: a core runtime on another profile, live (websocket and outbox worker), on `relay`
/// pinning `pin`.
fn bob_on(relay: &str, pin: &str) -> (tempfile::TempDir, switchboard_core::engine::Runtime) {
    let d = tempfile::tempdir().unwrap();
    let profile = Profile { dir: d.path().join("bob") };
    let opts = switchboard_core::engine::InitOptions {
        name: "bob".into(),
        relay: relay.into(),
        relay_cert_sha256: Some(pin.into()),
        keystore: KeystorePreference::File,
    };
    let rt = tauri::async_runtime::block_on(switchboard_core::engine::Runtime::init(&profile, opts)).unwrap();
    tauri::async_runtime::block_on(async { rt.start_background() });
    (d, rt)
}

fn bob_call(rt: &switchboard_core::engine::Runtime, req: Value) -> Value {
    let req = serde_json::from_value(req).unwrap();
    tauri::async_runtime::block_on(rt.handle(req, false)).unwrap()
}

#[test]
fn first_run_without_a_relay_hosts_one_that_a_second_profile_reaches() {
    let (_d, p) = profile();
    let (_app, w) = app(p.clone());
    assert_eq!(support::invoke(&w, "relay_hosted", json!({})).unwrap(), Value::Null);

    let who = support::invoke(&w, "profile_init", json!({"name": "alice", "relay": null})).unwrap();
    let url = who["letagents"]["relay"].as_str().unwrap().to_owned();
    assert!(url.starts_with("https://"), "{url}");
    let hosted = support::invoke(&w, "relay_hosted", json!({})).unwrap();
    assert_eq!(hosted["url"], url.as_str());
    assert_eq!(hosted["running"], true);
    assert_eq!(hosted["accepting"], true);
    assert!(url.ends_with(&format!(":{}", hosted["port"])));
    let pin = hosted["cert_sha256"].as_str().unwrap().to_owned();
    assert_eq!(pin.len(), 64);
    assert!(p.dir.join("relay-lite").join("tls").join("self-signed.cert.pem").exists());
    // The choice is remembered for the next launch.
    let saved: Value = serde_json::from_slice(&std::fs::read(p.dir.join("app-settings.json")).unwrap()).unwrap();
    assert_eq!(saved["hosted_relay"]["url"], url.as_str());
    // The switches the settings screen shows stay booleans.
    assert!(support::invoke(&w, "settings_get", json!({})).unwrap().get("hosted_relay").is_none());

    // Alice's own runtime reaches it: its relay connection comes up.
    assert!(
        eventually(20, || request(&w, json!({"op": "status"})).unwrap()["relays"][0]["health"]["state"] == "connected"),
        "{}",
        request(&w, json!({"op": "status"})).unwrap()
    );

    // Bob, another profile, pins the certificate and talks to alice through the hosted relay.
    let (_bd, bob) = bob_on(&url, &pin);
    let alice_addr = who["letagents"]["address"].as_str().unwrap().to_owned();
    bob_call(&bob, json!({"op": "contact_add", "address": alice_addr, "name": "alice"}));
    assert!(
        eventually(20, || request(&w, json!({"op": "contact_requests"}))
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "bob")),
        "alice never saw bob's request"
    );
    request(&w, json!({"op": "contact_accept", "name": "bob"})).unwrap();
    bob_call(&bob, json!({"op": "send", "contact": "alice", "text": "hello over the hosted relay"}));
    assert!(
        eventually(20, || request(&w, json!({"op": "conversation", "contact": "bob"}))
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["body"] == "hello over the hosted relay" && m["direction"] == "in")),
        "bob's message never reached alice"
    );
    // And back: alice answers, bob receives.
    request(&w, json!({"op": "send", "contact": "bob", "text": "hi bob"})).unwrap();
    assert!(
        eventually(20, || bob_call(&bob, json!({"op": "conversation", "contact": "alice"}))
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["body"] == "hi bob")),
        "alice's answer never reached bob"
    );
    bob.shutdown();
}

#[test]
fn the_hosted_relay_starts_again_with_the_app() {
    let (_d, p) = profile();
    let (port, url, pin) = {
        let (app, w) = app(p.clone());
        support::invoke(&w, "profile_init", json!({"name": "alice", "relay": null})).unwrap();
        let hosted = support::invoke(&w, "relay_hosted", json!({})).unwrap();
        tauri::async_runtime::block_on(tauri::Manager::state::<AppState>(&app).shutdown());
        (hosted["port"].clone(), hosted["url"].clone(), hosted["cert_sha256"].clone())
    };
    // The next launch: same port, same certificate, and the runtime connects to it.
    let (_app, w) = app(p);
    let hosted = support::invoke(&w, "relay_hosted", json!({})).unwrap();
    assert_eq!((hosted["port"].clone(), hosted["url"].clone(), hosted["cert_sha256"].clone()), (port, url, pin));
    assert_eq!(hosted["accepting"], true, "{hosted}");
    assert_eq!(hosted["error"], Value::Null);
    assert!(
        eventually(20, || request(&w, json!({"op": "status"})).unwrap()["relays"][0]["health"]["state"] == "connected"),
        "{}",
        request(&w, json!({"op": "status"})).unwrap()
    );
}

/// A Stringcup contact cannot follow a move (its id belongs to the relay that assigned it), so
/// the relay the app hosts keeps running for it, and it still reaches alice there.
#[test]
fn moving_away_from_the_hosted_relay_keeps_it_while_a_stringcup_contact_lives_there() {
    let (_d, p) = profile();
    let elsewhere = relay();
    let (app, w) = app(p.clone());
    support::invoke(&w, "profile_init", json!({"name": "alice", "relay": null})).unwrap();
    let hosted = support::invoke(&w, "relay_hosted", json!({})).unwrap();
    let (hosted_url, pin) = (hosted["url"].as_str().unwrap(), hosted["cert_sha256"].as_str().unwrap());
    let alice_sc = request(&w, json!({"op": "whoami"})).unwrap()["stringcup"]["id"].as_str().unwrap().to_owned();
    let (_bd, bob) = bob_on(hosted_url, pin);
    bob_call(&bob, json!({"op": "contact_add", "address": alice_sc, "name": "alice"}));
    bob_call(&bob, json!({"op": "send", "contact": "alice", "text": "hi over stringcup"}));
    let mut name = Value::Null;
    assert!(eventually(30, || {
        name = request(&w, json!({"op": "contact_requests"})).unwrap()[0]["name"].clone();
        !name.is_null()
    }));
    request(&w, json!({"op": "contact_accept", "name": name, "new_name": "bob"})).unwrap();

    let who = request(&w, json!({"op": "relay_move", "url": elsewhere.url()})).unwrap();
    assert_eq!(who["move"]["stringcup_on_old_relay"], 1, "{who}");
    let still = support::invoke(&w, "relay_hosted", json!({})).unwrap();
    assert_eq!((&still["url"], &still["running"]), (&hosted["url"], &json!(true)), "{still}");
    bob_call(&bob, json!({"op": "send", "contact": "alice", "text": "still here"}));
    assert!(
        eventually(40, || {
            let all = request(&w, json!({"op": "inbox", "all": true})).unwrap();
            all.as_array().unwrap().iter().any(|m| m["body"] == "still here")
        }),
        "bob's message through the hosted relay never arrived"
    );
    bob.shutdown();
    tauri::async_runtime::block_on(tauri::Manager::state::<AppState>(&app).shutdown());
}

#[test]
fn moving_away_from_the_hosted_relay_stops_it_and_the_next_launch_does_not_host_one() {
    let (_d, p) = profile();
    let elsewhere = relay();
    {
        let (app, w) = app(p.clone());
        support::invoke(&w, "profile_init", json!({"name": "alice", "relay": null})).unwrap();
        let hosted = support::invoke(&w, "relay_hosted", json!({})).unwrap();
        let hosted_url = hosted["url"].as_str().unwrap().to_owned();
        assert_eq!(hosted["accepting"], true, "{hosted}");

        let who = request(&w, json!({"op": "relay_move", "url": elsewhere.url()})).unwrap();
        assert_eq!(who["letagents"]["relay"], elsewhere.url().trim_end_matches('/'));
        assert_eq!(support::invoke(&w, "relay_hosted", json!({})).unwrap(), Value::Null);
        // The relay the app hosted no longer answers.
        let probe = tauri::async_runtime::block_on(switchboard_core::engine::check_relay(
            &hosted_url,
            hosted["cert_sha256"].as_str(),
        ));
        assert!(probe.is_err(), "the hosted relay still answers");
        assert!(
            eventually(20, || request(&w, json!({"op": "status"})).unwrap()["relays"][0]["health"]["state"]
                == "connected"),
            "{}",
            request(&w, json!({"op": "status"})).unwrap()
        );
        tauri::async_runtime::block_on(tauri::Manager::state::<AppState>(&app).shutdown());
    }
    let (_app, w) = app(p.clone());
    assert_eq!(support::invoke(&w, "relay_hosted", json!({})).unwrap(), Value::Null);
    let saved: Value = serde_json::from_slice(&std::fs::read(p.dir.join("app-settings.json")).unwrap()).unwrap();
    assert!(saved.get("hosted_relay").is_none_or(Value::is_null), "{saved}");
    let who = request(&w, json!({"op": "whoami"})).unwrap();
    assert_eq!(who["letagents"]["relay"], elsewhere.url().trim_end_matches('/'));
}

#[test]
fn do_not_disturb_is_the_runtimes_and_the_apps() {
    let relay = relay();
    let (_d, p) = profile();
    {
        let (app, w) = app(p.clone());
        // Before first run there is no runtime: the switch is kept and handed over at init.
        support::invoke(&w, "settings_set", json!({"key": "do_not_disturb", "value": true})).unwrap();
        support::invoke(&w, "profile_init", json!({"name": "alice", "relay": relay.url()})).unwrap();
        assert_eq!(request(&w, json!({"op": "dnd"})).unwrap(), json!({"dnd": true}));
        // The settings switch turns the runtime's off (agent wakes resume).
        support::invoke(&w, "settings_set", json!({"key": "do_not_disturb", "value": false})).unwrap();
        assert_eq!(request(&w, json!({"op": "dnd"})).unwrap(), json!({"dnd": false}));
        assert_eq!(support::invoke(&w, "settings_get", json!({})).unwrap()["do_not_disturb"], false);
        // Switched in the runtime by another client: the app's switch follows.
        request(&w, json!({"op": "dnd", "on": true})).unwrap();
        assert!(eventually(10, || support::invoke(&w, "settings_get", json!({})).unwrap()["do_not_disturb"] == true));
        // Off again in the runtime, then the app stops with its setting saved as on.
        request(&w, json!({"op": "dnd", "on": false})).unwrap();
        assert!(eventually(10, || support::invoke(&w, "settings_get", json!({})).unwrap()["do_not_disturb"] == false));
        let mut saved: Value =
            serde_json::from_slice(&std::fs::read(p.dir.join("app-settings.json")).unwrap()).unwrap();
        saved["do_not_disturb"] = json!(true);
        tauri::async_runtime::block_on(tauri::Manager::state::<AppState>(&app).shutdown());
        std::fs::write(p.dir.join("app-settings.json"), serde_json::to_vec(&saved).unwrap()).unwrap();
    }
    // At start-up the runtime's state wins (it is shared with the CLI and agents).
    let (_app, w) = app(p);
    assert_eq!(support::invoke(&w, "settings_get", json!({})).unwrap()["do_not_disturb"], false);
    assert_eq!(request(&w, json!({"op": "dnd"})).unwrap(), json!({"dnd": false}));
}

#[test]
fn muted_conversations_are_kept_in_the_profile() {
    let (_d, p) = profile();
    let (_app, w) = app(p.clone());
    assert_eq!(support::invoke(&w, "mute_get", json!({})).unwrap(), json!([]));
    support::invoke(&w, "mute_set", json!({"conversation": "c:bob", "muted": true})).unwrap();
    support::invoke(&w, "mute_set", json!({"conversation": "c:carol", "muted": true})).unwrap();
    support::invoke(&w, "mute_set", json!({"conversation": "c:carol", "muted": false})).unwrap();
    assert_eq!(support::invoke(&w, "mute_get", json!({})).unwrap(), json!(["c:bob"]));
    let saved: Value = serde_json::from_slice(&std::fs::read(p.dir.join("app-settings.json")).unwrap()).unwrap();
    assert_eq!(saved["muted"], json!(["c:bob"]));
}

#[test]
fn an_attached_app_follows_the_owning_runtimes_events() {
    let relay = relay();
    use tauri::Listener as _;
    let (_d, p) = profile();
    let (_owner_app, owner) = app(p.clone());
    support::invoke(&owner, "profile_init", json!({"name": "alice", "relay": relay.url()})).unwrap();
    let (attached_app, w) = app(p);
    assert!(tauri::async_runtime::block_on(tauri::Manager::state::<AppState>(&attached_app).attached()));
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    attached_app.listen_any(switchboard_app::events::RUNTIME_EVENT, move |e| {
        let _ = tx.send(serde_json::from_str(e.payload()).unwrap());
    });
    tauri::async_runtime::block_on(switchboard_app::events::start(attached_app.handle()));

    // Do-not-disturb switched in the owning runtime reaches the attached app's switch (over the
    // bridge's event stream, which connects in the background: switch until it is heard).
    assert!(eventually(20, || {
        request(&owner, json!({"op": "dnd", "on": true})).unwrap();
        support::invoke(&w, "settings_get", json!({})).unwrap()["do_not_disturb"] == true
    }));
    assert!(rx.try_iter().any(|e| e == json!({"type": "dnd", "on": true})));
    // The attached app's switch sets the owning runtime's do-not-disturb.
    support::invoke(&w, "settings_set", json!({"key": "do_not_disturb", "value": false})).unwrap();
    assert_eq!(request(&owner, json!({"op": "dnd"})).unwrap(), json!({"dnd": false}));
    assert_eq!(request(&w, json!({"op": "dnd"})).unwrap(), json!({"dnd": false}));
}
