//! Start-in-tray with the real app under Xvfb (its own D-Bus session): with the setting on, the
//! app starts, owns the profile (its bridge answers) and shows no window; a second launch (single
//! instance) brings the first one's window up. With the setting off the window shows at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use std::time::{Duration, Instant};

use support::Display;
use switchboard_core::profile::Profile;

fn initialised_profile(home: &std::path::Path, start_in_tray: bool) -> Profile {
    let profile = support::initialised_profile(home);
    let settings = serde_json::json!({"start_in_tray": start_in_tray, "close_to_tray": true});
    std::fs::write(profile.dir.join("app-settings.json"), settings.to_string()).unwrap();
    profile
}

#[test]
fn start_in_tray_keeps_the_window_hidden_until_asked() {
    support::require_tools(&["xvfb-run", "dbus-run-session", "xdotool"]);
    let home = tempfile::tempdir().unwrap();
    let profile = initialised_profile(home.path(), true);
    let display = Display::start();
    let app = || {
        let mut app = display.command(env!("CARGO_BIN_EXE_switchboard-app"));
        app.arg("--home").arg(&profile.dir).env("SWITCHBOARD_KEYSTORE", "file");
        app
    };
    let first = support::launch(app());
    // It runs the profile's runtime (bridge files appear) ...
    assert!(support::eventually(60, || profile.read_bridge_files().is_some()), "no runtime:\n{}", first.log());
    // ... with no window on screen, for as long as we look.
    let hidden_for = Instant::now();
    while hidden_for.elapsed() < Duration::from_secs(4) {
        assert!(display.visible_windows("Switchboard").is_empty(), "a window showed:\n{}", first.log());
        assert!(support::alive(first.child.id()), "the app exited:\n{}", first.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    // A second launch hands over to the first, which shows its window.
    let second = app().status().unwrap();
    assert!(second.success(), "the second launch failed: {second}");
    assert!(
        support::eventually(30, || !display.visible_windows("Switchboard").is_empty()),
        "the window never came up:\n{}",
        first.log()
    );
    assert!(support::alive(first.child.id()));
    first.stop();
}

#[test]
fn without_start_in_tray_the_window_shows_at_once() {
    support::require_tools(&["xvfb-run", "dbus-run-session", "xdotool"]);
    let home = tempfile::tempdir().unwrap();
    let profile = initialised_profile(home.path(), false);
    let display = Display::start();
    let mut cmd = display.command(env!("CARGO_BIN_EXE_switchboard-app"));
    cmd.arg("--home").arg(&profile.dir).env("SWITCHBOARD_KEYSTORE", "file");
    let app = support::launch(cmd);
    assert!(
        support::eventually(60, || !display.visible_windows("Switchboard").is_empty()),
        "the window never came up:\n{}",
        app.log()
    );
    app.stop();
}
