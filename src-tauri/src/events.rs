//! Core events become UI events here, and only here: each runtime event is emitted to the window
//! as `runtime-event` (the same JSON the bridge streams to browsers), counted for the tray's
//! unread badge, and turned into a system notification when the settings allow it.

use std::hash::{Hash, Hasher};

use serde_json::Value;
use switchboard_core::bridge::api::Request;
use switchboard_core::bridge::web::ui_event;
use switchboard_core::engine::{Caller, Event, Runtime as Core};
use tauri::{AppHandle, Emitter, Manager, Runtime};
use tokio::sync::broadcast::error::RecvError;

use crate::host::AppState;

/// The UI event name.
pub const RUNTIME_EVENT: &str = "runtime-event";

/// Forwards `core`'s events to the app until the runtime stops.
pub fn forward<R: Runtime>(app: AppHandle<R>, core: Core) {
    let mut rx = core.subscribe();
    tauri::async_runtime::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(e) => handle(&app, &core, &e).await,
                Err(RecvError::Lagged(_)) => {
                    let _ = app.emit(RUNTIME_EVENT, serde_json::json!({"type": "changed"}));
                }
                Err(RecvError::Closed) => break,
            }
        }
    });
}

async fn handle<R: Runtime>(app: &AppHandle<R>, core: &Core, e: &Event) {
    let _ = app.emit(RUNTIME_EVENT, ui_event(e));
    let Event::Message { id } = e else { return };
    let Ok(m) = core.handle_as(&Caller::Owner, Request::Message { id: id.clone() }, false).await else { return };
    // One's own messages neither count nor notify.
    if m.get("direction").and_then(Value::as_str) != Some("in") {
        return;
    }
    let focused = app.get_webview_window("main").and_then(|w| w.is_focused().ok()).unwrap_or(false);
    if !focused {
        let state = app.state::<AppState>();
        let n = state.unread.lock().map(|mut u| {
            *u += 1;
            *u
        });
        if let Ok(n) = n {
            crate::tray::set_unread(app, n);
        }
    }
    let allowed =
        app.state::<AppState>().settings.lock().map(|s| s.notifications && !s.do_not_disturb).unwrap_or(false);
    if allowed && !focused {
        notify(&m);
    }
}

/// Shows a notification for message `m`, one per conversation (a newer one replaces the older).
/// Without a notification daemon this fails, which is not an error for the app.
fn notify(m: &Value) {
    let from = m.get("from").and_then(Value::as_str).unwrap_or("someone").to_owned();
    let body = match m.get("body") {
        Some(Value::String(s)) => s.chars().take(200).collect(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    from.hash(&mut h);
    let id = (h.finish() & 0x7fff_ffff) as u32;
    tauri::async_runtime::spawn_blocking(move || {
        let shown = notify_rust::Notification::new().appname("Switchboard").summary(&from).body(&body).id(id).show();
        if let Err(e) = shown {
            tracing::debug!("notification not shown: {e}");
        }
    });
}

/// The window gained focus: everything is seen.
pub fn seen<R: Runtime>(app: &AppHandle<R>) {
    if let Ok(mut u) = app.state::<AppState>().unread.lock() {
        *u = 0;
    }
    crate::tray::set_unread(app, 0);
}
