//! The tray icon: unread badge, left click toggles the window, menu open / do-not-disturb / quit;
//! whether anything on this desktop shows tray icons at all (without a host, hiding the window
//! would lose the app), and closing the window to the tray, saying so the first time.

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

/// The D-Bus name of the StatusNotifier watcher (KDE, GNOME's AppIndicator extension, waybar...).
const SNI_WATCHER: &str = "org.kde.StatusNotifierWatcher";

/// Whether a StatusNotifier host is registered with a watcher on the session bus.
#[cfg(all(unix, not(target_os = "macos")))]
async fn sni_host() -> zbus::Result<bool> {
    let conn = zbus::Connection::session().await?;
    let owned: bool = conn
        .call_method(
            Some("org.freedesktop.DBus"),
            "/org/freedesktop/DBus",
            Some("org.freedesktop.DBus"),
            "NameHasOwner",
            &(SNI_WATCHER,),
        )
        .await?
        .body()
        .deserialize()?;
    if !owned {
        return Ok(false);
    }
    let reply = conn
        .call_method(
            Some(SNI_WATCHER),
            "/StatusNotifierWatcher",
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &(SNI_WATCHER, "IsStatusNotifierHostRegistered"),
        )
        .await?;
    let v: zbus::OwnedVariant = reply.body().deserialize()?;
    Ok(bool::try_from(v).unwrap_or(false))
}

/// Whether an XEmbed system tray (freedesktop System Tray spec: the owner of
/// `_NET_SYSTEM_TRAY_S<screen>`) runs on the display: libappindicator shows the icon there when
/// no StatusNotifier host exists. Asked on a connection of its own.
#[cfg(target_os = "linux")]
fn xembed_tray() -> bool {
    use x11rb::connection::Connection as _;
    use x11rb::protocol::xproto::ConnectionExt as _;
    let Ok((conn, screen)) = x11rb::connect(None) else { return false };
    let atom = format!("_NET_SYSTEM_TRAY_S{screen}");
    let owner = conn
        .intern_atom(false, atom.as_bytes())
        .ok()
        .and_then(|c| c.reply().ok())
        .and_then(|a| conn.get_selection_owner(a.atom).ok())
        .and_then(|c| c.reply().ok());
    drop(conn.flush());
    owner.is_some_and(|o| o.owner != x11rb::NONE)
}

#[cfg(not(target_os = "linux"))]
fn xembed_tray() -> bool {
    // Windows and macOS always show tray (menu bar) icons.
    true
}

/// Whether the tray icon is shown somewhere.
async fn host_present() -> bool {
    let xembed = tauri::async_runtime::spawn_blocking(xembed_tray).await.unwrap_or(false);
    #[cfg(all(unix, not(target_os = "macos")))]
    {
        if xembed {
            return true;
        }
        match tokio::time::timeout(std::time::Duration::from_secs(2), sni_host()).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                tracing::debug!("no StatusNotifier host: {e}");
                false
            }
            Err(_) => false,
        }
    }
    #[cfg(not(all(unix, not(target_os = "macos"))))]
    {
        xembed
    }
}

/// Whether the window may start hidden: the tray icon can be seen.
pub fn host_present_now() -> bool {
    tauri::async_runtime::block_on(host_present())
}

/// The window's close button, with close-to-tray on: hides the window where a tray host shows
/// the icon (the first time with a notification saying where the app went), and quits where none
/// does (the icon would be invisible and the app lost).
pub fn close_to_tray<R: Runtime>(window: &tauri::Window<R>) {
    let app = window.app_handle().clone();
    let window = window.clone();
    tauri::async_runtime::spawn(async move {
        if !host_present().await {
            tracing::info!("no tray host: closing the window quits");
            let state = app.state::<AppState>();
            state.shutdown().await;
            app.exit(0);
            return;
        }
        let _ = window.hide();
        let state = app.state::<AppState>();
        let first =
            state.settings.lock().map(|mut s| !std::mem::replace(&mut s.tray_hint_shown, true)).unwrap_or(false);
        if first {
            if let Ok(s) = state.settings.lock()
                && let Err(e) = s.save(&state.profile.dir)
            {
                tracing::warn!("settings not saved: {}", e.message);
            }
            tauri::async_runtime::spawn_blocking(|| {
                let shown = notify_rust::Notification::new()
                    .appname("Switchboard")
                    .summary(STILL_RUNNING)
                    .body(STILL_RUNNING_BODY)
                    .show();
                if let Err(e) = shown {
                    tracing::debug!("tray notice not shown: {e}");
                }
            });
        }
    });
}

/// The first hide's notification.
pub const STILL_RUNNING: &str = "Switchboard is still running in the tray";
/// What it says next.
pub const STILL_RUNNING_BODY: &str =
    "Messages keep arriving. Click the tray icon to open the window; choose Quit in its menu to stop.";

/// Stops the runtime and exits.
pub fn quit<R: Runtime>(app: &AppHandle<R>) {
    let state = app.state::<AppState>();
    tauri::async_runtime::block_on(state.shutdown());
    app.exit(0);
}
