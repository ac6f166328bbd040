//! The app's own settings (tray, notifications, muted conversations, the hosted relay), kept as
//! JSON next to the profile's data.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::CommandError;
use crate::hosted::HostedRelayConfig;

/// Desktop settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Settings {
    /// Show system notifications for new messages.
    pub notifications: bool,
    /// Pause notifications and agent wakes (the runtime's do-not-disturb follows this).
    pub do_not_disturb: bool,
    /// Closing the window hides it to the tray.
    pub close_to_tray: bool,
    /// Start hidden in the tray.
    pub start_in_tray: bool,
    /// Conversations that never notify (`crate::notify::conversation_key`).
    pub muted: BTreeSet<String>,
    /// The relay this app hosts, started again at every launch (none: the profile uses another).
    pub hosted_relay: Option<HostedRelayConfig>,
    /// The first close to the tray said where the app went (said once; not a switch).
    pub tray_hint_shown: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            notifications: true,
            do_not_disturb: false,
            close_to_tray: true,
            start_in_tray: false,
            muted: BTreeSet::new(),
            hosted_relay: None,
            tray_hint_shown: false,
        }
    }
}

/// Where a profile's app settings live.
pub fn path(profile_dir: &Path) -> PathBuf {
    profile_dir.join("app-settings.json")
}

impl Settings {
    /// Loads the settings (defaults when there are none or they do not parse).
    pub fn load(profile_dir: &Path) -> Self {
        std::fs::read(path(profile_dir)).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    /// Saves the settings.
    pub fn save(&self, profile_dir: &Path) -> Result<(), CommandError> {
        std::fs::create_dir_all(profile_dir).map_err(|e| CommandError::new("settings", e))?;
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| CommandError::new("internal", e))?;
        std::fs::write(path(profile_dir), bytes).map_err(|e| CommandError::new("settings", e))
    }

    /// The switches as a flat map of booleans (what the settings screen shows).
    pub fn to_map(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut m)) => {
                m.retain(|k, v| v.is_boolean() && k != "tray_hint_shown");
                m
            }
            _ => Map::new(),
        }
    }

    /// Changes one setting by name.
    pub fn set(&mut self, key: &str, value: bool) -> Result<(), CommandError> {
        let slot = match key {
            "notifications" => &mut self.notifications,
            "do_not_disturb" => &mut self.do_not_disturb,
            "close_to_tray" => &mut self.close_to_tray,
            "start_in_tray" => &mut self.start_in_tray,
            other => return Err(CommandError::new("invalid_input", format!("no setting named `{other}`"))),
        };
        *slot = value;
        Ok(())
    }
}
