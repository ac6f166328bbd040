//! The app's commands, a few lines each, grouped by area. Each is granted to the main window by
//! `capabilities/main.json` (build.rs declares them, so none is reachable without a grant).

pub mod app;
pub mod profile;
pub mod runtime;
pub mod settings;
