//! Settings commands: notifications, do-not-disturb, tray, muted conversations, the hosted relay.

use serde_json::{Map, Value};
use tauri::State;

use crate::error::CommandError;
use crate::host::AppState;

/// The desktop settings (the switches).
#[tauri::command]
pub fn settings_get(state: State<'_, AppState>) -> Result<Map<String, Value>, CommandError> {
    let s = state.settings.lock().map_err(|_| CommandError::new("internal", "settings lock"))?;
    Ok(s.to_map())
}

/// Changes one switch and saves it. Do-not-disturb is the runtime's too (it pauses agent
/// wakes), so it is switched there first.
#[tauri::command]
pub async fn settings_set<R: tauri::Runtime>(
    app: tauri::AppHandle<R>,
    state: State<'_, AppState>,
    key: String,
    value: bool,
) -> Result<(), CommandError> {
    let snapshot = if key == "do_not_disturb" {
        state.set_dnd(value).await?
    } else {
        let mut s = state.settings.lock().map_err(|_| CommandError::new("internal", "settings lock"))?;
        s.set(&key, value)?;
        s.save(&state.profile.dir)?;
        s.clone()
    };
    crate::tray::settings_changed(&app, &snapshot);
    Ok(())
}

/// The muted conversations (`c:NAME`).
#[tauri::command]
pub fn mute_get(state: State<'_, AppState>) -> Result<Vec<String>, CommandError> {
    let s = state.settings.lock().map_err(|_| CommandError::new("internal", "settings lock"))?;
    Ok(s.muted.iter().cloned().collect())
}

/// Mutes or unmutes one conversation's notifications and saves it; muting withdraws the one on
/// screen.
#[tauri::command]
pub fn mute_set<R: tauri::Runtime>(
    app: tauri::AppHandle<R>,
    state: State<'_, AppState>,
    conversation: String,
    muted: bool,
) -> Result<(), CommandError> {
    if conversation.is_empty() || conversation.len() > 300 {
        return Err(CommandError::new("invalid_input", "a conversation key is 1 to 300 characters"));
    }
    {
        let mut s = state.settings.lock().map_err(|_| CommandError::new("internal", "settings lock"))?;
        if muted {
            s.muted.insert(conversation.clone());
        } else {
            s.muted.remove(&conversation);
        }
        s.save(&state.profile.dir)?;
    }
    if muted {
        crate::notify::withdraw(&app, Some(&conversation));
    }
    Ok(())
}

/// The relay this app hosts: URL, certificate pin, port, data directory, whether it accepts
/// connections; `null` when the profile uses another relay.
#[tauri::command]
pub async fn relay_hosted(state: State<'_, AppState>) -> Result<Value, CommandError> {
    Ok(state.hosted_status().await)
}
