//! Core events become UI events here, and only here: each runtime event is emitted to the window
//! as `runtime-event` (the same JSON the bridge streams to browsers), counted for the tray's
//! unread badge, and turned into a system notification when `notify::decide` allows it; the
//! runtime's do-not-disturb (switched from anywhere: the CLI, another client) is mirrored into
//! the app's switch and the tray.

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
    if let Event::Dnd { on } = e {
        if let Some(s) = app.state::<AppState>().remember_dnd(*on) {
            crate::tray::settings_changed(app, &s);
        }
        return;
    }
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
    let decision = match app.state::<AppState>().settings.lock() {
        Ok(s) => crate::notify::decide(&s, &m, focused),
        Err(_) => return,
    };
    match decision {
        crate::notify::Decision::Show(p) => crate::notify::show(app, p),
        crate::notify::Decision::Skip(why) => tracing::debug!("no notification for {id}: {why}"),
    }
}

/// The window gained focus: everything is seen.
pub fn seen<R: Runtime>(app: &AppHandle<R>) {
    let state = app.state::<AppState>();
    if let Ok(mut u) = state.unread.lock() {
        *u = 0;
    }
    state.notifications.seen_all();
    crate::tray::set_unread(app, 0);
}
