//! App commands: the window tells the shell it painted (start-up figure) and how many messages
//! are unread (the tray shows the same total as the window).

use tauri::{AppHandle, Manager as _, Runtime, State};

use crate::error::CommandError;
use crate::host::AppState;

/// The UI's first render is on screen: prints the start-to-first-paint time once (BENCHMARKS.md
/// reads it) and returns it in milliseconds.
#[tauri::command]
pub fn app_painted(state: State<'_, AppState>) -> Result<u128, CommandError> {
    let ms = state.started.elapsed().as_millis();
    let mut painted = state.painted.lock().map_err(|_| CommandError::new("internal", "paint lock"))?;
    if !*painted {
        *painted = true;
        println!("switchboard-app: first paint {ms} ms after start");
    }
    Ok(ms)
}

/// The unread total the window shows (its read markers): the tray's badge and tooltip, and the
/// native window title (what a taskbar or window switcher shows; the page's own title does not
/// reach it), follow it.
#[tauri::command]
pub fn app_unread<R: Runtime>(app: AppHandle<R>, state: State<'_, AppState>, count: u32) -> Result<(), CommandError> {
    *state.unread.lock().map_err(|_| CommandError::new("internal", "unread lock"))? = count;
    crate::tray::set_unread(&app, count);
    if let Some(w) = app.get_webview_window("main") {
        let title = if count > 0 { format!("({count}) Switchboard") } else { "Switchboard".to_owned() };
        w.set_title(&title).map_err(|e| CommandError::new("internal", e))?;
    }
    Ok(())
}
