//! Profile commands: first run.

use serde_json::Value;
use tauri::State;

use crate::error::CommandError;
use crate::host::AppState;

/// Whether the profile has an identity (false: the UI shows first run).
#[tauri::command]
pub async fn profile_initialized(state: State<'_, AppState>) -> Result<bool, CommandError> {
    Ok(state.initialized().await)
}

/// Creates the identity and starts the runtime; returns `whoami`.
#[tauri::command]
pub async fn profile_init<R: tauri::Runtime>(
    app: tauri::AppHandle<R>,
    state: State<'_, AppState>,
    name: String,
    relay: Option<String>,
) -> Result<Value, CommandError> {
    let who = state.init(name, relay).await?;
    crate::events::start(&app).await;
    Ok(who)
}
