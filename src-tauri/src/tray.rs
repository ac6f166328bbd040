//! The tray icon: unread badge, left click toggles the window, menu open / do-not-disturb / quit.

use tauri::image::Image;
use tauri::menu::{CheckMenuItem, Menu, MenuItem, PredefinedMenuItem};
use tauri::tray::{MouseButton, MouseButtonState, TrayIconBuilder, TrayIconEvent};
use tauri::{AppHandle, Manager, Runtime};

use crate::host::AppState;
use crate::settings::Settings;

const TRAY_ID: &str = "main";
const ICON: &[u8] = include_bytes!("../../icons/tray.png");
const ICON_UNREAD: &[u8] = include_bytes!("../../icons/tray-unread.png");

fn menu<R: Runtime>(app: &AppHandle<R>, dnd: bool) -> tauri::Result<Menu<R>> {
    let open = MenuItem::with_id(app, "open", "Open Switchboard", true, None::<&str>)?;
    let dnd = CheckMenuItem::with_id(app, "dnd", "Do not disturb", true, dnd, None::<&str>)?;
    let sep = PredefinedMenuItem::separator(app)?;
    let quit = MenuItem::with_id(app, "quit", "Quit", true, None::<&str>)?;
    Menu::with_items(app, &[&open, &dnd, &sep, &quit])
}

/// Shows the window and focuses it.
pub fn show<R: Runtime>(app: &AppHandle<R>) {
    if let Some(w) = app.get_webview_window("main") {
        let _ = w.show();
        let _ = w.unminimize();
        let _ = w.set_focus();
    }
}

fn toggle<R: Runtime>(app: &AppHandle<R>) {
    if let Some(w) = app.get_webview_window("main") {
        if w.is_visible().unwrap_or(false) {
            let _ = w.hide();
        } else {
            show(app);
        }
    }
}

/// Builds the tray icon.
pub fn build<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<()> {
    let state = app.state::<AppState>();
    let dnd = state.settings.lock().map(|s| s.do_not_disturb).unwrap_or(false);
    TrayIconBuilder::with_id(TRAY_ID)
        .icon(Image::from_bytes(ICON)?)
        // On Linux the icon is handed over as a PNG file; by default every app with this tray id
        // shares /run/user/N/tray-icon/tray-icon-main-N.png (and deletes it when it changes the
        // icon), so each profile keeps its own.
        .temp_dir_path(state.profile.dir.join("tray-icon"))
        .tooltip("Switchboard")
        .menu(&menu(app, dnd)?)
        .show_menu_on_left_click(false)
        .on_menu_event(|app, event| match event.id().as_ref() {
            "open" => show(app),
            "dnd" => toggle_dnd(app),
            "quit" => quit(app),
            _ => {}
        })
        .on_tray_icon_event(|tray, event| {
            if let TrayIconEvent::Click { button: MouseButton::Left, button_state: MouseButtonState::Up, .. } = event {
                toggle(tray.app_handle());
            }
        })
        .build(app)?;
    Ok(())
}

/// The tray's do-not-disturb item: switches the runtime (agent wakes) and the app
/// (notifications), then redraws the menu with the state that took effect.
pub fn toggle_dnd<R: Runtime>(app: &AppHandle<R>) {
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        let state = app.state::<AppState>();
        let on = !state.settings.lock().map(|s| s.do_not_disturb).unwrap_or(false);
        let snapshot = match state.set_dnd(on).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("do-not-disturb not switched: {e}");
                match state.settings.lock() {
                    Ok(s) => s.clone(),
                    Err(_) => return,
                }
            }
        };
        settings_changed(&app, &snapshot);
    });
}

/// Shows the unread count on the tray icon.
pub fn set_unread<R: Runtime>(app: &AppHandle<R>, n: u32) {
    let Some(tray) = app.tray_by_id(TRAY_ID) else { return };
    if let Ok(img) = Image::from_bytes(if n > 0 { ICON_UNREAD } else { ICON }) {
        let _ = tray.set_icon(Some(img));
    }
    let tip = if n > 0 { format!("Switchboard: {n} unread") } else { "Switchboard".to_owned() };
    let _ = tray.set_tooltip(Some(tip));
}

/// Keeps the tray menu in step with the settings.
pub fn settings_changed<R: Runtime>(app: &AppHandle<R>, s: &Settings) {
    if let (Some(tray), Ok(m)) = (app.tray_by_id(TRAY_ID), menu(app, s.do_not_disturb)) {
        let _ = tray.set_menu(Some(m));
    }
}

/// Stops the runtime and exits.
pub fn quit<R: Runtime>(app: &AppHandle<R>) {
    let state = app.state::<AppState>();
    tauri::async_runtime::block_on(state.shutdown());
    app.exit(0);
}
