//! The desktop app: a thin Tauri shell around the profile's runtime. It embeds the runtime (or
//! attaches to the daemon that owns the profile), exposes a few commands to the UI in ui/, turns
//! core events into UI events, notifications and the tray's unread badge, and keeps one instance.

pub mod commands;
pub mod error;
pub mod events;
pub mod host;
pub mod hosted;
pub mod notify;
pub mod settings;
pub mod tray;

use std::path::PathBuf;
use std::time::Instant;

use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::Profile;
use tauri::{Emitter, Manager, WindowEvent};

use host::AppState;

/// The commands the UI may call (each also needs its capability grant).
pub fn with_commands<R: tauri::Runtime>(builder: tauri::Builder<R>) -> tauri::Builder<R> {
    builder.invoke_handler(tauri::generate_handler![
        commands::profile::profile_initialized,
        commands::profile::profile_init,
        commands::runtime::runtime_request,
        commands::settings::settings_get,
        commands::settings::settings_set,
        commands::settings::mute_get,
        commands::settings::mute_set,
        commands::settings::relay_hosted,
        commands::app::app_painted,
        commands::app::app_unread,
    ])
}

/// The app's context: tauri.conf.json, the capabilities and the embedded ui/dist.
pub fn context<R: tauri::Runtime>() -> tauri::Context<R> {
    tauri::generate_context!()
}

/// `--home DIR` from the arguments, else `$SWITCHBOARD_HOME`, else the default profile.
fn profile_from_args(args: &[String]) -> Result<Profile, String> {
    let home = args.iter().position(|a| a == "--home").and_then(|i| args.get(i + 1)).map(PathBuf::from);
    Profile::resolve(home).map_err(|e| e.to_string())
}

/// A `switchboard:` link among the arguments (an invite link or address opened from elsewhere).
fn link_in(args: &[String]) -> Option<String> {
    args.iter().find(|a| a.starts_with("switchboard:")).cloned()
}

/// Runs the desktop app.
pub fn run() -> Result<(), String> {
    let started = Instant::now();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SWITCHBOARD_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let args: Vec<String> = std::env::args().collect();
    let profile = profile_from_args(&args)?;
    let keystore = std::env::var("SWITCHBOARD_KEYSTORE")
        .ok()
        .and_then(|k| k.parse::<KeystorePreference>().ok())
        .unwrap_or_default();
    let first_link = link_in(&args);

    let builder = tauri::Builder::default()
        // A second launch shows this window (and hands over a link it was opened with) instead.
        .plugin(tauri_plugin_single_instance::init(|app, args, _cwd| {
            tray::show(app);
            if let Some(link) = link_in(&args) {
                let _ = app.emit("open-link", link);
            }
        }))
        .setup(move |app| {
            let state = tauri::async_runtime::block_on(AppState::start(profile, keystore, started))
                .map_err(|e| format!("{} ({})", e.message, e.code))?;
            let start_in_tray = state.settings.lock().map(|s| s.start_in_tray).unwrap_or(false);
            app.manage(state);
            let handle = app.handle().clone();
            tauri::async_runtime::block_on(events::start(&handle));
            let tray = match tray::build(&handle) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("no tray icon: {e}");
                    false
                }
            };
            // The window is created hidden (tauri.conf.json) and shown here, so starting in the
            // tray never flashes it. Start hidden only where the tray can bring the window back
            // (an icon, and a tray host that shows it), and never before first run was answered.
            let initialized = tauri::async_runtime::block_on(app.state::<AppState>().initialized());
            if !(start_in_tray && tray && initialized && tray::host_present_now())
                && let Some(w) = app.get_webview_window("main")
            {
                let _ = w.show();
            }
            if let Some(link) = first_link.clone() {
                let _ = handle.emit("open-link", link);
            }
            Ok(())
        })
        .on_window_event(|window, event| match event {
            WindowEvent::CloseRequested { api, .. } => {
                let app = window.app_handle();
                let to_tray = app.state::<AppState>().settings.lock().map(|s| s.close_to_tray).unwrap_or(false);
                if to_tray && app.tray_by_id("main").is_some() {
                    api.prevent_close();
                    tray::close_to_tray(window);
                } else {
                    tauri::async_runtime::block_on(app.state::<AppState>().shutdown());
                }
            }
            WindowEvent::Focused(true) => events::seen(window.app_handle()),
            _ => {}
        });
    with_commands(builder).run(context()).map_err(|e| e.to_string())
}
