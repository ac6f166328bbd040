//! The tray with the real app under Xvfb (its own D-Bus session). Start-in-tray: with the setting
//! on and a tray host on the display (trayer), the app starts, owns the profile (its bridge
//! answers) and shows no window; a second launch (single instance) brings the first one's window
//! up. With the setting off, or with no tray host to show the icon, the window shows at once.
//! Close-to-tray: with a tray host, closing hides the window and the first time (only) a
//! notification (dunst, a real server) says the app is still running in the tray; with no tray
//! host, closing quits the app instead of leaving it running with no way back.
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
    let _tray = support::TrayHost::start(&display);
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

fn app_on(display: &Display, profile: &Profile) -> std::process::Command {
    let mut cmd = display.command(env!("CARGO_BIN_EXE_switchboard-app"));
    cmd.arg("--home").arg(&profile.dir).env("SWITCHBOARD_KEYSTORE", "file");
    cmd
}

/// The one visible app window (waiting up to a minute for it).
fn window_of(display: &Display, app: &support::Launched) -> String {
    // The window id is taken from the same query that found it (a second `xdotool search` came
    // back empty once in CI, between the window mapping and the test reading it again).
    let mut found = None;
    assert!(
        support::eventually(60, || {
            let windows = display.visible_windows("Switchboard");
            let one = windows.len() == 1;
            found = windows.into_iter().next().filter(|_| one);
            one
        }),
        "the window never came up:\n{}",
        app.log()
    );
    found.unwrap()
}

#[test]
fn start_in_tray_shows_the_window_where_no_tray_host_would_show_the_icon() {
    support::require_tools(&["xvfb-run", "dbus-run-session", "xdotool"]);
    let home = tempfile::tempdir().unwrap();
    let profile = initialised_profile(home.path(), true);
    let display = Display::start();
    let app = support::launch(app_on(&display, &profile));
    window_of(&display, &app);
    app.stop();
}

#[test]
fn closing_the_window_quits_where_no_tray_host_shows_the_icon() {
    support::require_tools(&["xvfb-run", "dbus-run-session", "xdotool", "python3"]);
    let home = tempfile::tempdir().unwrap();
    let profile = initialised_profile(home.path(), false);
    let display = Display::start();
    let mut app = support::launch(app_on(&display, &profile));
    let window = window_of(&display, &app);
    assert!(support::eventually(60, || profile.read_bridge_files().is_some()), "no runtime:\n{}", app.log());
    support::close_window(&display, &window);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = app.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "closing the window left the app running with no tray host:\n{}", app.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "the app did not quit cleanly ({status}):\n{}", app.log());
    // The profile is free again: another app (or the daemon) can own it.
    assert!(profile.read_bridge_files().is_none(), "the runtime left its bridge files behind");
}

#[test]
fn closing_the_window_hides_it_to_a_tray_host_and_says_so_the_first_time() {
    support::require_tools(&["xvfb-run", "dbus-run-session", "xdotool", "python3", "dunst", "dunstctl"]);
    let home = tempfile::tempdir().unwrap();
    let profile = initialised_profile(home.path(), false);
    let display = Display::start();
    let _tray = support::TrayHost::start(&display);
    let mut dunst = display
        .command("dunst")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Notifications dunst has shown and closed, by their summary.
    let notices = || {
        let out = display.command("dunstctl").arg("history").output().unwrap();
        let history: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let shown = history["data"][0].as_array().cloned().unwrap_or_default();
        shown.iter().filter(|n| n["summary"]["data"] == "Switchboard is still running in the tray").count()
    };
    assert!(
        support::eventually(20, || display.command("dunstctl").arg("is-paused").status().is_ok_and(|s| s.success())),
        "dunst did not start"
    );
    let app = support::launch(app_on(&display, &profile));
    let window = window_of(&display, &app);
    support::close_window(&display, &window);
    assert!(
        support::eventually(10, || display.visible_windows("Switchboard").is_empty()),
        "the window did not hide:\n{}",
        app.log()
    );
    // dunst moves a notification to its history once it is closed: close them all first.
    let said = support::eventually(20, || {
        let _ = display.command("dunstctl").arg("close-all").status();
        notices() == 1
    });
    assert!(said, "no 'still running in the tray' notification:\n{}", app.log());
    assert!(support::alive(app.child.id()), "the app quit although a tray host shows its icon:\n{}", app.log());
    // Brought back (a second launch) and closed again: hidden again, and not said twice.
    assert!(app_on(&display, &profile).status().unwrap().success());
    let window = window_of(&display, &app);
    support::close_window(&display, &window);
    assert!(
        support::eventually(10, || display.visible_windows("Switchboard").is_empty()),
        "the window did not hide again"
    );
    std::thread::sleep(Duration::from_secs(2));
    let _ = display.command("dunstctl").arg("close-all").status();
    assert_eq!(notices(), 1, "the tray notice is said once");
    assert!(support::alive(app.child.id()));
    app.stop();
    let _ = dunst.kill();
    let _ = dunst.wait();
}
