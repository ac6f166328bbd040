//! The shell's commands through Tauri's IPC on the mock runtime, against a real runtime: first
//! run, requests, typed errors, settings, and attaching to a runtime that already owns the profile.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::time::Instant;

use serde_json::{Value, json};
use switchboard_app::host::AppState;
use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::Profile;
use tauri::ipc::{CallbackFn, InvokeBody};
use tauri::test::{INVOKE_KEY, MockRuntime, mock_builder};
use tauri::webview::InvokeRequest;
use tauri::{App, WebviewWindow, WebviewWindowBuilder};

/// A relay address nothing listens on: init and local requests do not need a relay.
const NO_RELAY: &str = "http://127.0.0.1:9";

fn app(profile: Profile) -> (App<MockRuntime>, WebviewWindow<MockRuntime>) {
    let state =
        tauri::async_runtime::block_on(AppState::start(profile, KeystorePreference::File, Instant::now())).unwrap();
    let app = switchboard_app::with_commands(mock_builder()).manage(state).build(switchboard_app::context()).unwrap();
    let webview = WebviewWindowBuilder::new(&app, "main", Default::default()).build().unwrap();
    (app, webview)
}

fn invoke(w: &WebviewWindow<MockRuntime>, cmd: &str, args: Value) -> Result<Value, Value> {
    tauri::test::get_ipc_response(
        w,
        InvokeRequest {
            cmd: cmd.into(),
            callback: CallbackFn(0),
            error: CallbackFn(1),
            // The app's own origin on Linux (pages from elsewhere get no commands).
            url: "tauri://localhost".parse().unwrap(),
            body: InvokeBody::Json(args),
            headers: Default::default(),
            invoke_key: INVOKE_KEY.to_string(),
        },
    )
    .map(|b| b.deserialize::<Value>().unwrap())
}

fn request(w: &WebviewWindow<MockRuntime>, req: Value) -> Result<Value, Value> {
    invoke(w, "runtime_request", json!({ "request": req }))
}

fn profile() -> (tempfile::TempDir, Profile) {
    let d = tempfile::tempdir().unwrap();
    let p = Profile { dir: d.path().join("profile") };
    (d, p)
}

#[test]
fn first_run_creates_the_identity_then_requests_reach_the_runtime() {
    let (_d, p) = profile();
    let (_app, w) = app(p.clone());
    assert_eq!(invoke(&w, "profile_initialized", json!({})).unwrap(), json!(false));
    let e = request(&w, json!({"op": "whoami"})).unwrap_err();
    assert_eq!(e["code"], "not_initialized");

    let who = invoke(&w, "profile_init", json!({"name": "alice", "relay": NO_RELAY})).unwrap();
    assert_eq!(who["name"], "alice");
    assert!(who["letagents"]["address"].as_str().unwrap().starts_with("la1."));
    assert_eq!(invoke(&w, "profile_initialized", json!({})).unwrap(), json!(true));
    assert_eq!(request(&w, json!({"op": "whoami"})).unwrap()["name"], "alice");
    assert_eq!(request(&w, json!({"op": "contact_list"})).unwrap(), json!([]));
    // The embedded runtime serves its bridge for the CLI and agents.
    assert!(p.read_bridge_files().is_some());

    let again = invoke(&w, "profile_init", json!({"name": "eve", "relay": NO_RELAY})).unwrap_err();
    assert_eq!(again["code"], "already_initialized");
}

#[test]
fn errors_cross_as_code_and_message() {
    let (_d, p) = profile();
    let (_app, w) = app(p);
    invoke(&w, "profile_init", json!({"name": "alice", "relay": NO_RELAY})).unwrap();
    let e = request(&w, json!({"op": "contact_verify", "name": "nobody"})).unwrap_err();
    assert_eq!(e["code"], "unknown_contact");
    assert!(e["message"].as_str().unwrap().contains("nobody"));
    let e = request(&w, json!({"op": "no_such_op"})).unwrap_err();
    assert_eq!(e["code"], "invalid_input");
    let e = request(&w, json!({"op": "send", "contact": "nobody", "text": "hi"})).unwrap_err();
    assert_eq!(e["code"], "unknown_contact");
    let e = invoke(&w, "profile_init", json!({"name": "x", "relay": null})).unwrap_err();
    assert_eq!(e["code"], "unsupported");
}

#[test]
fn settings_are_kept_in_the_profile() {
    let (_d, p) = profile();
    let (_app, w) = app(p.clone());
    let s = invoke(&w, "settings_get", json!({})).unwrap();
    assert_eq!(s["notifications"], true);
    assert_eq!(s["do_not_disturb"], false);
    invoke(&w, "settings_set", json!({"key": "do_not_disturb", "value": true})).unwrap();
    assert_eq!(invoke(&w, "settings_get", json!({})).unwrap()["do_not_disturb"], true);
    let saved: Value = serde_json::from_slice(&std::fs::read(p.dir.join("app-settings.json")).unwrap()).unwrap();
    assert_eq!(saved["do_not_disturb"], true);
    let e = invoke(&w, "settings_set", json!({"key": "everything", "value": true})).unwrap_err();
    assert_eq!(e["code"], "invalid_input");
}

#[test]
fn a_second_app_attaches_to_the_runtime_that_owns_the_profile() {
    let (_d, p) = profile();
    let (_app, owner) = app(p.clone());
    invoke(&owner, "profile_init", json!({"name": "alice", "relay": NO_RELAY})).unwrap();
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
    let e = invoke(&w, "plugin:event|emit", json!({"event": "runtime-event", "payload": {}})).unwrap_err();
    assert!(e.as_str().unwrap().contains("not allowed"), "{e}");
    let e = invoke(&w, "plugin:window|close", json!({"label": "main"})).unwrap_err();
    assert!(e.as_str().unwrap().contains("not allowed"), "{e}");
    assert_eq!(invoke(&w, "profile_initialized", json!({})).unwrap(), json!(false));
}

#[test]
fn the_first_paint_is_reported_once() {
    let (_d, p) = profile();
    let (_app, w) = app(p);
    let a = invoke(&w, "app_painted", json!({})).unwrap().as_u64().unwrap();
    let b = invoke(&w, "app_painted", json!({})).unwrap().as_u64().unwrap();
    assert!(b >= a);
}
