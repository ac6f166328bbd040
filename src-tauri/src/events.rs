//! Core events become UI events here, and only here: each runtime event is emitted to the window
//! as `runtime-event` (the same JSON the bridge streams to browsers), counted for the tray's
//! unread badge, and turned into a system notification when `notify::decide` allows it; the
//! runtime's do-not-disturb (switched from anywhere: the CLI, another client) is mirrored into
//! the app's switch and the tray.

use std::collections::BTreeMap;

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
    watch_groups(app.clone(), core.clone());
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

/// letmeknow groups have no per-message runtime event: their unread counts (`group_list`) are
/// read every few seconds while the runtime runs, and a rise notifies under the group's
/// conversation (`g:GROUP`), with the same policy as contacts.
pub fn watch_groups<R: Runtime>(app: AppHandle<R>, core: Core) {
    tauri::async_runtime::spawn(async move {
        let mut events = core.subscribe();
        let mut before: Option<BTreeMap<String, i64>> = None;
        loop {
            let now = group_unread(&core).await;
            if let (Some(before), Some(now)) = (&before, &now) {
                let focused = app.get_webview_window("main").and_then(|w| w.is_focused().ok()).unwrap_or(false);
                for (group, unread) in crate::notify::group_news(before, now) {
                    let decision = match app.state::<AppState>().settings.lock() {
                        Ok(s) => crate::notify::decide_group(&s, &group, unread, focused),
                        Err(_) => return,
                    };
                    if let crate::notify::Decision::Show(p) = decision {
                        crate::notify::show(&app, p);
                    }
                }
            }
            if now.is_some() {
                before = now;
            }
            // Until the runtime stops (its event channel closes).
            let tick = tokio::time::sleep(GROUP_POLL);
            tokio::pin!(tick);
            loop {
                tokio::select! {
                    () = &mut tick => break,
                    e = events.recv() => if let Err(RecvError::Closed) = e { return },
                }
            }
        }
    });
}

/// How often group unread counts are read.
const GROUP_POLL: std::time::Duration = std::time::Duration::from_secs(5);

/// Each group's unread count, or `None` when there is no group session to ask.
async fn group_unread(core: &Core) -> Option<BTreeMap<String, i64>> {
    let v = core.handle_as(&Caller::Owner, Request::GroupList { handle: None }, false).await.ok()?;
    Some(
        v.as_array()?
            .iter()
            .filter_map(|g| Some((g.get("group")?.as_str()?.to_owned(), g.get("unread")?.as_i64()?)))
            .collect(),
    )
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
