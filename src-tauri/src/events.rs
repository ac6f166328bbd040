//! Core events become UI events here, and only here: each runtime event is emitted to the window
//! as `runtime-event` (the same JSON the bridge streams to browsers; the window then reports its
//! unread total for the tray) and turned into a system notification when `notify::decide` allows it; the
//! runtime's do-not-disturb (switched from anywhere: the CLI, another client) is mirrored into
//! the app's switch and the tray. An embedded runtime's events come from its broadcast channel;
//! an attached app follows the owning runtime's `GET /v1/events` (server-sent events, owner
//! token), so both behave the same. letmeknow group messages come as `group_message` events
//! (the runtime follows every group log in the background) and notify under `g:GROUP`.

use std::time::Duration;

use serde_json::Value;
use switchboard_core::api::Request;
use switchboard_core::bridge::web::ui_event;
use switchboard_core::engine::Runtime as Core;
use tauri::{AppHandle, Emitter, Manager, Runtime};
use tokio::sync::broadcast::error::RecvError;

use crate::host::AppState;

/// The UI event name.
pub const RUNTIME_EVENT: &str = "runtime-event";

/// Starts following the runtime the app uses: the embedded one's channel, or the attached one's
/// event stream. Nothing before first run.
pub async fn start<R: Runtime>(app: &AppHandle<R>) {
    let state = app.state::<AppState>();
    if let Some(rt) = state.runtime().await {
        forward(app.clone(), rt);
    } else if state.attached().await
        && let Some((port, token)) = state.profile.read_bridge_files()
    {
        follow_bridge(app.clone(), port, token);
    }
}

/// Forwards `core`'s events to the app until the runtime stops.
pub fn forward<R: Runtime>(app: AppHandle<R>, core: Core) {
    let mut rx = core.subscribe();
    tauri::async_runtime::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(e) => handle(&app, &ui_event(&e)).await,
                Err(RecvError::Lagged(_)) => {
                    let _ = app.emit(RUNTIME_EVENT, serde_json::json!({"type": "changed"}));
                }
                Err(RecvError::Closed) => break,
            }
        }
    });
}

/// Follows the owning runtime's bridge event stream until the app stops, reconnecting (with a
/// `changed` to the UI, which refreshes) when the stream breaks.
pub fn follow_bridge<R: Runtime>(app: AppHandle<R>, port: u16, token: String) {
    tauri::async_runtime::spawn(async move {
        let Ok(tls) = switchboard_core::transport::tls::client_config(None) else { return };
        let Ok(http) = reqwest::Client::builder().tls_backend_preconfigured(tls).no_proxy().build() else { return };
        let mut backoff = Duration::from_millis(500);
        loop {
            if app.state::<AppState>().stopped().await {
                return;
            }
            let resp = http.get(format!("http://127.0.0.1:{port}/v1/events")).bearer_auth(&token).send().await;
            match resp {
                Ok(mut r) if r.status().is_success() => {
                    backoff = Duration::from_millis(500);
                    let mut buf = String::new();
                    while let Ok(Some(chunk)) = r.chunk().await {
                        buf.push_str(&String::from_utf8_lossy(&chunk));
                        while let Some(end) = buf.find("\n\n") {
                            let frame: String = buf.drain(..end + 2).collect();
                            for data in frame.lines().filter_map(|l| l.strip_prefix("data:")) {
                                if let Ok(v) = serde_json::from_str::<Value>(data.trim()) {
                                    handle(&app, &v).await;
                                }
                            }
                        }
                        if buf.len() > 1 << 20 {
                            buf.clear();
                        }
                    }
                    let _ = app.emit(RUNTIME_EVENT, serde_json::json!({"type": "changed"}));
                }
                Ok(r) => tracing::warn!("runtime events refused: {}", r.status()),
                Err(e) => tracing::debug!("runtime events: {e}"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    });
}

/// One UI event (`{"type": ...}`): to the window, then the badge, notifications and DND mirror.
async fn handle<R: Runtime>(app: &AppHandle<R>, e: &Value) {
    let _ = app.emit(RUNTIME_EVENT, e);
    let state = app.state::<AppState>();
    match e.get("type").and_then(Value::as_str) {
        Some("dnd") => {
            if let Some(on) = e.get("on").and_then(Value::as_bool)
                && let Some(s) = state.remember_dnd(on)
            {
                crate::tray::settings_changed(app, &s);
            }
        }
        Some("message") => {
            let Some(id) = e.get("id").and_then(Value::as_str) else { return };
            let Ok(m) = state.request(Request::Message { id: id.to_owned() }).await else { return };
            message(app, id, &m);
        }
        Some("group_message") => {
            // One's own messages (another session of this profile wrote them) neither count nor
            // notify, as for contacts.
            if e.get("own").and_then(Value::as_bool).unwrap_or(false) {
                return;
            }
            let Some(group) = e.get("group").and_then(Value::as_str) else { return };
            let id = e.get("id").and_then(Value::as_str).unwrap_or_default();
            if !state.group_seen.first(group, id) {
                return;
            }
            let from = e.get("from").and_then(Value::as_str).unwrap_or_default();
            group_message(app, group, from).await;
        }
        _ => {}
    }
}

/// Whether the window has focus (nothing notifies then). The tray's unread total is the window's
/// own (`app_unread`): the same read markers, so the two never disagree.
fn focused<R: Runtime>(app: &AppHandle<R>) -> bool {
    app.get_webview_window("main").and_then(|w| w.is_focused().ok()).unwrap_or(false)
}

/// A stored message: when the policy allows, a notification.
fn message<R: Runtime>(app: &AppHandle<R>, id: &str, m: &Value) {
    // One's own messages neither count nor notify.
    if m.get("direction").and_then(Value::as_str) != Some("in") {
        return;
    }
    let focused = focused(app);
    let state = app.state::<AppState>();
    let decision = match state.settings.lock() {
        Ok(s) => crate::notify::decide(&s, m, focused),
        Err(_) => return,
    };
    match decision {
        crate::notify::Decision::Show(p) => crate::notify::show(app, p),
        crate::notify::Decision::Skip(why) => tracing::debug!("no notification for {id}: {why}"),
    }
}

/// A group message or alert from someone else: when the policy allows, the
/// group's notification with its unread count over every local session in it.
async fn group_message<R: Runtime>(app: &AppHandle<R>, group: &str, from: &str) {
    let focused = focused(app);
    let state = app.state::<AppState>();
    let unread = group_unread(&state, group).await.unwrap_or(1).max(1);
    let decision = match state.settings.lock() {
        Ok(s) => crate::notify::decide_group(&s, group, unread, from, focused),
        Err(_) => return,
    };
    match decision {
        crate::notify::Decision::Show(p) => crate::notify::show(app, p),
        crate::notify::Decision::Skip(why) => tracing::debug!("no notification for group {group}: {why}"),
    }
}

/// `group`'s unread count over every local group session (two sessions in one group add up),
/// or `None` when the runtime cannot be asked.
async fn group_unread(state: &AppState, group: &str) -> Option<i64> {
    let v = state.request(Request::GroupList { handle: None }).await.ok()?;
    Some(
        v.as_array()?
            .iter()
            .filter(|g| g.get("group").and_then(Value::as_str) == Some(group))
            .filter_map(|g| g.get("unread").and_then(Value::as_i64))
            .sum(),
    )
}

/// The window gained focus: everything is seen.
pub fn seen<R: Runtime>(app: &AppHandle<R>) {
    let state = app.state::<AppState>();
    state.notifications.seen_all();
    crate::notify::withdraw(app, None);
}
