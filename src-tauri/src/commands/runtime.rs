//! Runtime commands: the bridge's request vocabulary (core/src/bridge/api.rs), as the owner.

use serde_json::Value;
use switchboard_core::api::Request;
use tauri::State;

use crate::error::CommandError;
use crate::host::AppState;

/// One runtime request (`{"op": ...}`), answered with the runtime's DTO.
#[tauri::command]
pub async fn runtime_request(state: State<'_, AppState>, request: Value) -> Result<Value, CommandError> {
    let req: Request =
        serde_json::from_value(request).map_err(|e| CommandError::new("invalid_input", format!("bad request: {e}")))?;
    let moved_to = match &req {
        Request::RelayMove { url, .. } => Some(url.clone()),
        _ => None,
    };
    let answer = state.request(req).await?;
    if let Some(url) = moved_to {
        let count = |k: &str| answer.get("move").and_then(|m| m.get(k)).and_then(Value::as_i64).unwrap_or(0);
        let still_used = count("letagents_told")
            + count("agent_mail_contacts")
            + count("groups_on_old_relay")
            + count("stringcup_on_old_relay")
            > 0;
        state.relay_moved(&url, still_used).await;
    }
    Ok(answer)
}
