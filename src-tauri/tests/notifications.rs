//! System notifications against a real notification server: dunst on a private D-Bus session bus
//! and a private Xvfb display. A conversation keeps one notification (replaced, not stacked), and
//! invoking a notification's default action (what a click does; `dunstctl action` here) makes the
//! app emit `open-conversation` with that conversation. A letmeknow group notifies too: bob, on a
//! real relay-lite, joins alice's group and writes; alice's app (embedded runtime) notifies under
//! `g:GROUP`, and the click opens it.
//!
//! The test starts its own `dbus-daemon`, `Xvfb` and `dunst`, then runs itself again as a child
//! process on that bus (a process's session bus comes from its environment), so it never touches
//! the caller's desktop. It fails, never skips, when dbus-daemon, Xvfb or dunst is missing
//! (scripts/install-deps.sh installs them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use switchboard_app::host::AppState;
use switchboard_app::notify::{self, OPEN_CONVERSATION, Pending};
use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::Profile;
use tauri::Listener as _;
use tauri::Manager as _;
use tauri::test::mock_builder;

const CHILD: &str = "SWITCHBOARD_NOTIFY_TEST_CHILD";
const TEST: &str = "notifications_group_per_conversation_and_a_click_opens_it";

/// Processes this test started, killed by their ids when it ends.
struct Started(Vec<Child>);

impl Drop for Started {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn dunstctl(bus: &str, args: &[&str]) -> Option<String> {
    let out = Command::new("dunstctl").args(args).env("DBUS_SESSION_BUS_ADDRESS", bus).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn count(bus: &str, which: &str) -> u32 {
    dunstctl(bus, &["count", which]).and_then(|s| s.parse().ok()).unwrap_or(u32::MAX)
}

#[test]
fn notifications_group_per_conversation_and_a_click_opens_it() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let mut started = Started(Vec::new());
    let mut bus_daemon = Command::new("dbus-daemon")
        .args(["--session", "--nofork", "--print-address=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("dbus-daemon (package dbus) is needed");
    let mut line = String::new();
    BufReader::new(bus_daemon.stdout.take().unwrap()).read_line(&mut line).unwrap();
    started.0.push(bus_daemon);
    let bus = line.trim().to_owned();
    assert!(bus.starts_with("unix:"), "{bus}");
    // A display for dunst: Xvfb picks a free one and reports it once it accepts clients.
    let mut xvfb = Command::new("Xvfb")
        .args(["-displayfd", "1", "-nolisten", "tcp", "-screen", "0", "640x480x24"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("Xvfb (package xvfb) is needed");
    let mut display = String::new();
    BufReader::new(xvfb.stdout.take().unwrap()).read_line(&mut display).unwrap();
    started.0.push(xvfb);
    let display = format!(":{}", display.trim());
    let dunst = Command::new("dunst")
        .env("DISPLAY", &display)
        .env("DBUS_SESSION_BUS_ADDRESS", &bus)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("dunst is needed");
    started.0.push(dunst);
    assert!(support::eventually(20, || dunstctl(&bus, &["is-paused"]).is_some()), "dunst never came up on {bus}");

    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("DBUS_SESSION_BUS_ADDRESS", &bus)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "{text}");
    for line in text.lines().filter(|l| l.contains(" message to notification: ")) {
        eprintln!("{line}");
    }
}

/// Runs on the private bus with dunst serving it.
fn child() {
    let bus = std::env::var("DBUS_SESSION_BUS_ADDRESS").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let profile = Profile { dir: dir.path().join("profile") };
    let state =
        tauri::async_runtime::block_on(AppState::start(profile, KeystorePreference::File, Instant::now())).unwrap();
    let app = switchboard_app::with_commands(mock_builder()).manage(state).build(switchboard_app::context()).unwrap();
    // The window (never focused on the mock runtime), for its commands.
    let window = tauri::WebviewWindowBuilder::new(&app, "main", Default::default()).build().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    app.listen_any(OPEN_CONVERSATION, move |e| {
        let _ = tx.send(serde_json::from_str::<String>(e.payload()).unwrap());
    });
    let pending =
        |c: &str, body: &str| Pending { conversation: format!("c:{c}"), summary: c.to_owned(), body: body.to_owned() };

    // Two messages from bob: one notification, updated in place.
    let first = notify::show_now(app.handle(), &pending("bob", "one")).unwrap();
    let second = notify::show_now(app.handle(), &pending("bob", "two")).unwrap();
    assert_eq!(first, second);
    assert!(support::eventually(5, || count(&bus, "displayed") + count(&bus, "waiting") == 1));
    // Carol's conversation has its own.
    let carol = notify::show_now(app.handle(), &pending("carol", "hi")).unwrap();
    assert_ne!(carol, first);
    assert!(support::eventually(5, || count(&bus, "displayed") + count(&bus, "waiting") == 2));
    // The window is seen: the app withdraws its notifications.
    switchboard_app::events::seen(app.handle());
    assert!(support::eventually(5, || count(&bus, "displayed") + count(&bus, "waiting") == 0));

    // A click: dunst invokes the default action of the one notification shown, and the app
    // asks the window to open bob's conversation.
    notify::show(app.handle(), pending("bob", "three"));
    assert!(support::eventually(5, || count(&bus, "displayed") == 1), "bob's notification never showed");
    dunstctl(&bus, &["action", "0"]).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), "c:bob");
    // Carol's notification, clicked, opens carol's conversation.
    let _ = dunstctl(&bus, &["close-all"]);
    assert!(support::eventually(5, || count(&bus, "displayed") == 0));
    notify::show(app.handle(), pending("carol", "again"));
    assert!(support::eventually(5, || count(&bus, "displayed") == 1));
    dunstctl(&bus, &["action", "0"]).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), "c:carol");
    let _ = dunstctl(&bus, &["close-all"]);
    assert!(support::eventually(5, || count(&bus, "displayed") == 0));

    group_messages_notify(&app, &window, &bus, &rx);
}

/// Alice's app hosts her runtime; bob (a core runtime on the same relay-lite) joins her group and
/// writes to it; her app's group watcher notifies and the click names the group.
fn group_messages_notify(
    app: &tauri::App<tauri::test::MockRuntime>,
    window: &tauri::WebviewWindow<tauri::test::MockRuntime>,
    bus: &str,
    rx: &mpsc::Receiver<String>,
) {
    use serde_json::{Value, json};
    use switchboard_core::bridge::api::Request;
    use tauri::async_runtime::block_on;
    let req = |v: Value| serde_json::from_value::<Request>(v).unwrap();
    let relay = block_on(switchboard_tests::TestRelay::start());
    let state = app.state::<AppState>();
    block_on(state.init("alice".into(), Some(relay.url()))).unwrap();
    block_on(switchboard_app::events::start(app.handle()));
    block_on(state.request(req(json!({"op": "group_session", "name": "Alice's agent"})))).unwrap();
    let inv = block_on(state.request(req(json!({"op": "group_invite"})))).unwrap();
    let group = inv["group"].as_str().unwrap().to_owned();

    let bob = block_on(switchboard_tests::Peer::offline("bob", &relay.url()));
    let bob_session = block_on(bob.rt.lmk_session(None, Some("Bob's agent"))).unwrap();
    let bob_handle = bob_session["handle"].as_str().unwrap().to_owned();
    let link = inv["link"].as_str().unwrap().to_owned();
    let (joined, admitted) = block_on(async {
        tokio::join!(
            bob.rt.lmk_join(&bob_handle, &link, Some(60)),
            state.request(req(json!({"op": "group_invite_wait", "invite": inv["invite"]})))
        )
    });
    admitted.unwrap();
    assert_eq!(joined.unwrap()["group"], group.as_str());

    block_on(bob.rt.lmk_send(&bob_handle, &group, "hello from bob's agent", None, None)).unwrap();
    // Alice's runtime follows the group log in the background and emits a `group_message` event
    // for bob's message; her app notifies for it.
    let sent = std::time::Instant::now();
    assert!(
        support::eventually(30, || count(bus, "displayed") == 1),
        "no group notification; alice's groups: {}",
        block_on(state.request(Request::GroupList { handle: None })).map(|v| v.to_string()).unwrap_or_default()
    );
    eprintln!("group message to notification: {} ms", sent.elapsed().as_millis());
    dunstctl(bus, &["action", "0"]).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), format!("g:{group}"));
    let _ = dunstctl(bus, &["close-all"]);
    assert!(support::eventually(5, || count(bus, "displayed") == 0));
    // The notification names the sender (the event carries it).
    let history = dunstctl(bus, &["history"]).unwrap_or_default();
    assert!(history.contains("1 unread message, the latest from Bob's agent"), "{history}");

    // Contacts: bob's message notifies; muted, it does not; alice's own message never does.
    let who = block_on(state.request(Request::Whoami)).unwrap();
    let address = who["letagents"]["address"].as_str().unwrap().to_owned();
    block_on(bob.rt.handle(req(json!({"op": "contact_add", "address": address, "name": "alice"})), true)).unwrap();
    assert!(support::eventually(20, || {
        let r = block_on(state.request(Request::ContactRequests)).unwrap();
        r.as_array().unwrap().iter().any(|c| c["name"] == "bob")
    }));
    block_on(state.request(req(json!({"op": "contact_accept", "name": "bob"})))).unwrap();
    let bob_says = |text: &str| {
        block_on(bob.rt.handle(req(json!({"op": "send", "contact": "alice", "text": text})), true)).unwrap();
    };
    let arrived = |text: &str| {
        support::eventually(20, || {
            let c = block_on(state.request(req(json!({"op": "conversation", "contact": "bob"})))).unwrap();
            c.as_array().unwrap().iter().any(|m| m["body"] == text)
        })
    };
    let sent = std::time::Instant::now();
    bob_says("are you there?");
    assert!(support::eventually(10, || count(bus, "displayed") == 1), "bob's message did not notify");
    eprintln!("contact message to notification: {} ms", sent.elapsed().as_millis());
    assert!(arrived("are you there?"));
    dunstctl(bus, &["action", "0"]).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), "c:bob");
    let _ = dunstctl(bus, &["close-all"]);
    assert!(support::eventually(5, || count(bus, "displayed") == 0));

    state.settings.lock().unwrap().muted.insert("c:bob".into());
    bob_says("muted now");
    assert!(arrived("muted now"));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(count(bus, "displayed") + count(bus, "waiting"), 0, "a muted conversation notified");

    state.settings.lock().unwrap().muted.remove("c:bob");
    block_on(state.request(req(json!({"op": "send", "contact": "bob", "text": "my own words"})))).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(count(bus, "displayed") + count(bus, "waiting"), 0, "one's own message notified");
    bob_says("unmuted again");
    assert!(arrived("unmuted again"));
    assert!(support::eventually(10, || count(bus, "displayed") == 1), "the unmuted conversation did not notify");
    // Muting it from its screen withdraws the notification on screen.
    support::invoke(window, "mute_set", json!({"conversation": "c:bob", "muted": true})).unwrap();
    assert!(
        support::eventually(5, || count(bus, "displayed") + count(bus, "waiting") == 0),
        "still shown after muting"
    );
    block_on(state.shutdown());
}
