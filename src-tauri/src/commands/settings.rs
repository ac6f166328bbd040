//! Settings commands: notifications, do-not-disturb, tray.

use serde_json::{Map, Value};
use tauri::State;

use crate::error::CommandError;
use crate::host::AppState;

/// The desktop settings.
#[tauri::command]
pub fn settings_get(state: State<'_, AppState>) -> Result<Map<String, Value>, CommandError> {
    let s = state.settings.lock().map_err(|_| CommandError::new("internal", "settings lock"))?;
    Ok(s.to_map())
}

/// Changes one setting and saves it.
#[tauri::command]
pub fn settings_set<R: tauri::Runtime>(
    app: tauri::AppHandle<R>,
    state: State<'_, AppState>,
    key: String,
    value: bool,
) -> Result<(), CommandError> {
    let snapshot = {
        let mut s = state.settings.lock().map_err(|_| CommandError::new("internal", "settings lock"))?;
        s.set(&key, value)?;
        s.save(&state.profile.dir)?;
        s.clone()
    };
    crate::tray::settings_changed(&app, &snapshot);
    Ok(())
}
