//! Errors as they cross to the UI: `{code, message, data?}`, the same shape the bridge uses.

use serde::Serialize;
use switchboard_core::api::ApiError;

/// A command's error.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({code})")]
pub struct CommandError {
    /// Stable machine-readable code.
    pub code: String,
    /// Human-readable message.
    pub message: String,
    /// What the UI acts on, for codes that carry it (`ApiError::data`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl CommandError {
    /// An error with `code`.
    pub fn new(code: &str, message: impl std::fmt::Display) -> Self {
        Self { code: code.into(), message: message.to_string(), data: None }
    }
}

impl From<ApiError> for CommandError {
    fn from(e: ApiError) -> Self {
        Self { code: e.code, message: e.message, data: e.data }
    }
}
