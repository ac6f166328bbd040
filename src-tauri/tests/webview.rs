//! The real app in its real webview (WebKitGTK), driven over W3C WebDriver: `tauri-driver` in
//! front of Debian's `WebKitWebDriver`, on a private Xvfb display and D-Bus session, with a real
//! relay-lite and a second profile (an in-process runtime). The scenario: first run (name and
//! relay URL) shows the addresses; bob's letagents address pasted into the window (a real
//! keyboard paste through the X clipboard) shows a preview with his safety number, and adding it
//! sends him a hello; a message typed and sent in the conversation reaches bob, and his answer
//! appears in it (sent with Enter); with the relay stopped a connection bar shows and a message
//! sent then shows a clock, going out by itself once the relay is back; a pasted non-address says
//! so and the notice clears on navigation; review mode and the dark theme switch in Settings; a
//! message to alice's agent is marked for it, waiting, then handed to it; a group made by name is
//! a chat; bob's pasted invite link asks "Join group?" naming him, and joining opens the group
//! with his message; at 480x400 one pane shows with the composer and newest message in view;
//! Settings → Move to another relay confirms what it will do, moves, bob is told and his next
//! message reaches the window through the new relay;
//! two messages arriving while Settings is open are counted in the navigation, the
//! window title and the tray icon (trayer, a real XEmbed tray), and opening the conversation reads
//! them everywhere; closing the window (the WM_DELETE_WINDOW a window manager sends) with a tray
//! host on the display leaves the app running with its window hidden (close-to-tray is the
//! default); launching the binary again with
//! a `switchboard:` link (single instance) shows the window with that link's preview.
//! Screenshots go to `<target>/screenshots/webview/`.
//!
//! Needs tauri-driver (`cargo install tauri-driver`, or `$SWITCHBOARD_TAURI_DRIVER`), Debian's
//! webkit2gtk-driver, xvfb-run, dbus-run-session, xdotool, ImageMagick and python3 (all from
//! scripts/install-deps.sh). Without the drivers the test skips, unless
//! SWITCHBOARD_REQUIRE_WEBDRIVER is set (scripts/test.sh sets it), which makes it fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchboard_core::bridge::api::Request;
use switchboard_tests::{Peer, TestRelay};

use support::Display;

/// The W3C name of an element reference in JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A WebDriver session over plain HTTP (tauri-driver on loopback).
struct WebDriver {
    http: reqwest::Client,
    base: String,
    session: String,
    shots: PathBuf,
}

impl WebDriver {
    /// Opens a session that launches `app` with `args`. (Requests use keep-alive: tauri-driver
    /// forwards a client's `Connection: close` to WebKitWebDriver, and then now and then drops a
    /// request, which Python's urllib showed.)
    async fn start(port: u16, app: &Path, args: &[String], shots: PathBuf) -> Self {
        let tls = switchboard_core::transport::tls::client_config(None).unwrap();
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .no_proxy()
            .timeout(Duration::from_secs(90))
            .build()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(Instant::now() < deadline, "tauri-driver never answered on {base}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "wry",
            "tauri:options": {"application": app, "args": args},
        }}});
        let res: Value = http.post(format!("{base}/session")).json(&caps).send().await.unwrap().json().await.unwrap();
        let session = res["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {res}")).to_owned();
        Self { http, base, session, shots }
    }

    /// One command; panics with the driver's error.
    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        self.try_cmd(method, path, body).await.unwrap_or_else(|e| panic!("WebDriver {path}: {e}"))
    }

    async fn try_cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.map_err(|e| e.to_string())?;
        let ok = res.status().is_success();
        let v: Value = res.json().await.map_err(|e| e.to_string())?;
        if ok { Ok(v["value"].clone()) } else { Err(v["value"].to_string()) }
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    async fn js(&self, script: &str, args: Value) -> Value {
        self.cmd(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": args}))).await
    }

    /// Waits up to `secs` for `script` to return something truthy; returns it.
    async fn until(&self, what: &str, secs: u64, script: &str, args: Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self
                .try_cmd(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": args})))
                .await;
            match v {
                Ok(v) if !(v.is_null() || v == json!(false) || v == json!("")) => return v,
                _ if Instant::now() > deadline => {
                    let text = self.js("return document.body ? document.body.innerText : ''", json!([])).await;
                    self.shot(&format!("failed-{}", what.replace(' ', "-"))).await;
                    panic!("timed out waiting for {what}; the page says:\n{text}");
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Waits for the element matching the CSS `selector` (visible); returns its reference.
    async fn element(&self, selector: &str) -> Value {
        let script = "const e = document.querySelector(arguments[0]); \
                      return e && e.getClientRects().length > 0 ? e : null;";
        self.until(selector, 30, script, json!([selector])).await
    }

    fn id(el: &Value) -> String {
        el[ELEMENT].as_str().unwrap_or_else(|| panic!("not an element: {el}")).to_owned()
    }

    async fn click(&self, selector: &str) {
        self.on_fresh(selector, |el| vec![(format!("/element/{el}/click"), json!({}))]).await;
    }

    /// Runs `steps(element)` on the element matching `selector`, finding it again when a
    /// background refresh replaced it in between (WebDriver's "stale element reference": the UI
    /// re-renders on runtime events and every few seconds).
    async fn on_fresh(&self, selector: &str, steps: impl Fn(&str) -> Vec<(String, Value)>) {
        for attempt in 0..5 {
            let el = Self::id(&self.element(selector).await);
            let mut result = Ok(Value::Null);
            for (path, body) in steps(&el) {
                result = self.try_cmd(reqwest::Method::POST, &path, Some(body)).await;
                if result.is_err() {
                    break;
                }
            }
            match result {
                Ok(_) => return,
                Err(e) if e.contains("stale element") && attempt < 4 => continue,
                Err(e) => panic!("WebDriver on {selector}: {e}"),
            }
        }
    }

    /// Clears the field and types `text` into it (real key events).
    async fn type_into(&self, selector: &str, text: &str) {
        self.on_fresh(selector, |el| {
            vec![(format!("/element/{el}/clear"), json!({})), (format!("/element/{el}/value"), json!({"text": text}))]
        })
        .await;
    }

    /// The trimmed text of the element matching `selector`.
    async fn text(&self, selector: &str) -> String {
        let el = Self::id(&self.element(selector).await);
        let v = self.cmd(reqwest::Method::GET, &format!("/element/{el}/text"), None).await;
        v.as_str().unwrap_or("").trim().to_owned()
    }

    /// Presses `modifier`+`key` (WebDriver key codes) with the keyboard.
    async fn chord(&self, modifier: &str, key: &str) {
        let actions = json!({"actions": [{"type": "key", "id": "keyboard", "actions": [
            {"type": "keyDown", "value": modifier}, {"type": "keyDown", "value": key},
            {"type": "keyUp", "value": key}, {"type": "keyUp", "value": modifier},
        ]}]});
        self.cmd(reqwest::Method::POST, "/actions", Some(actions)).await;
        let _ = self.try_cmd(reqwest::Method::DELETE, "/actions", None).await;
    }

    /// The webview's own screenshot, saved as `<shots>/<name>.png`.
    async fn shot(&self, name: &str) -> PathBuf {
        // WebKit captures the last painted frame: let the page paint what was just typed first.
        let frames = "const done = arguments[arguments.length - 1]; \
                      requestAnimationFrame(() => requestAnimationFrame(() => done(true)));";
        let _ =
            self.try_cmd(reqwest::Method::POST, "/execute/async", Some(json!({"script": frames, "args": []}))).await;
        let b64 = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = data_encoding::BASE64.decode(b64.as_str().unwrap_or("").as_bytes()).unwrap();
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// Ends the session (the driver stops the app it launched).
    async fn quit(&self) {
        let _ = self.try_cmd(reqwest::Method::DELETE, "", None).await;
    }
}

/// tauri-driver: `$SWITCHBOARD_TAURI_DRIVER`, else on PATH, else `~/.cargo/bin`; `None` (skip)
/// when missing, unless SWITCHBOARD_REQUIRE_WEBDRIVER is set.
fn tauri_driver() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("tauri-driver")).collect::<Vec<_>>())
        .unwrap_or_default();
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let candidates = std::env::var_os("SWITCHBOARD_TAURI_DRIVER")
        .map(PathBuf::from)
        .into_iter()
        .chain(on_path)
        .chain(cargo_home.map(|c| c.join("bin/tauri-driver")));
    let found = candidates.into_iter().find(|p| p.is_file());
    let native = Path::new("/usr/bin/WebKitWebDriver").is_file();
    if found.is_none() || !native {
        assert!(
            std::env::var_os("SWITCHBOARD_REQUIRE_WEBDRIVER").is_none(),
            "tauri-driver ({found:?}) or WebKitWebDriver (present: {native}) is missing and \
             SWITCHBOARD_REQUIRE_WEBDRIVER is set: run scripts/install-deps.sh"
        );
        eprintln!("skipping: no tauri-driver or WebKitWebDriver (run scripts/install-deps.sh)");
        return None;
    }
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The pid of the switchboard-app process under `root` (the driver launched it).
fn app_pid_under(root: u32) -> Option<u32> {
    let ps = support::ps_snapshot();
    support::tree(&ps, root).into_iter().map(|(p, _)| p).find(|p| {
        std::fs::read_to_string(format!("/proc/{p}/comm")).map(|c| c.trim() == "switchboard-app").unwrap_or(false)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_real_app_adds_a_pasted_contact_exchanges_messages_closes_to_tray_and_opens_links() {
    let Some(driver_bin) = tauri_driver() else { return };
    support::require_tools(&["xvfb-run", "dbus-run-session", "xdotool", "import", "identify", "python3"]);
    let app = PathBuf::from(env!("CARGO_BIN_EXE_switchboard-app"));
    let shots = support::out_dir("webview");
    for old in std::fs::read_dir(&shots).unwrap().flatten() {
        let _ = std::fs::remove_file(old.path());
    }

    let mut relay = TestRelay::start().await;
    let bob = Peer::offline("bob", &relay.url()).await;
    let carol = Peer::offline("carol", &relay.url()).await;
    let bob_who = bob.call(Request::Whoami).await;
    let bob_address = bob_who["letagents"]["address"].as_str().unwrap().to_owned();
    let bob_safety = bob_who["letagents"]["safety_number"].as_str().unwrap().to_owned();
    let carol_who = carol.call(Request::Whoami).await;
    let carol_address = carol_who["letagents"]["address"].as_str().unwrap().to_owned();
    let carol_safety = carol_who["letagents"]["safety_number"].as_str().unwrap().to_owned();

    let home = tempfile::tempdir().unwrap();
    let profile = home.path().join("alice");
    let display = Display::start();
    // A real system tray (trayer, XEmbed): the app's icon shows there (libappindicator's fallback).
    let _tray = support::TrayHost::start(&display);
    let port = free_port();
    let driver = support::launch({
        let mut cmd = display.command(&driver_bin);
        cmd.args(["--port", &port.to_string(), "--native-port", &free_port().to_string()])
            .env("SWITCHBOARD_KEYSTORE", "file")
            // The webview's own data (WebKit caches) in the test's directory, not the user's.
            .env("XDG_DATA_HOME", home.path().join("data"))
            .env("XDG_CACHE_HOME", home.path().join("cache"));
        cmd
    });
    let args = vec!["--home".to_owned(), profile.display().to_string()];
    let wd = WebDriver::start(port, &app, &args, shots.clone()).await;

    // ---- first run: name and relay URL, then the addresses with safety numbers.
    wd.element("#fr-name").await;
    wd.type_into("#fr-name", "Alice").await;
    wd.click("#fr-mode-url").await;
    // A relay that does not answer: first run says what failed and makes no identity.
    wd.type_into("#fr-relay", "http://127.0.0.1:9").await;
    wd.click("form[aria-labelledby=fr-title] button[type=submit]").await;
    wd.until(
        "first run saying the relay did not answer",
        30,
        "const a = document.querySelector('form[aria-labelledby=fr-title] [role=alert]'); \
         return a && a.textContent.includes('could not reach the relay')",
        json!([]),
    )
    .await;
    wd.shot("01a-first-run-relay-down").await;
    let still =
        wd.js("return !!document.getElementById('fr-name') && !document.querySelector('.identity')", json!([])).await;
    assert_eq!(still, json!(true), "no identity was made: still on first run");
    wd.type_into("#fr-relay", &relay.url()).await;
    wd.shot("01-first-run").await;
    wd.click("form[aria-labelledby=fr-title] button[type=submit]").await;
    let card = ".identity[data-protocol=letagents]";
    wd.element(&format!("{card} code.address")).await;
    let alice_address = wd.text(&format!("{card} code.address")).await;
    let alice_safety = wd.text(&format!("{card} .safety")).await;
    assert!(alice_address.starts_with("la1."), "first run shows the letagents address: {alice_address}");
    assert_eq!(alice_safety.len(), 39, "first run shows the safety number: {alice_safety}");
    let cards = wd
        .js(
            "return [...document.querySelectorAll('.identity')].map(c => \
             [c.dataset.protocol, (c.querySelector('code.address') || {}).textContent || ''])",
            json!([]),
        )
        .await;
    for protocol in ["letagents", "stringcup", "agent_mail"] {
        let shown =
            cards.as_array().unwrap().iter().any(|c| c[0] == protocol && c[1].as_str().is_some_and(|a| !a.is_empty()));
        assert!(shown, "first run shows the {protocol} address: {cards}");
    }
    let qr = "const i = document.querySelector('.identity[data-protocol=letagents] img.qr'); \
              return i && i.complete && i.naturalWidth > 0;";
    wd.until("the address's QR code to render", 10, qr, json!([])).await;
    wd.shot("02-identity-ready").await;
    let cont = "return [...document.querySelectorAll('main button')].find(b => b.textContent.trim() === 'Continue')";
    let cont = wd.until("the Continue button", 10, cont, json!([])).await;
    wd.cmd(reqwest::Method::POST, &format!("/element/{}/click", WebDriver::id(&cont)), Some(json!({}))).await;
    wd.until("the app's ready screen", 30, "return document.body.dataset.ready === 'true'", json!([])).await;

    // ---- paste bob's address into the window: the text goes to the X clipboard by a real cut in
    // the paste field, then Ctrl+V outside any field is the paste-anywhere path.
    wd.type_into("#paste-field", &bob_address).await;
    wd.chord("\u{E009}", "a").await;
    wd.chord("\u{E009}", "x").await;
    let field_now = wd.js("return document.getElementById('paste-field').value", json!([])).await;
    assert_eq!(field_now, json!(""), "the cut emptied the field");
    wd.click("main h2").await;
    wd.chord("\u{E009}", "v").await;
    let fp = wd
        .until(
            "the preview with bob's fingerprint",
            20,
            "const d = document.querySelector('dialog[open].preview'); \
             const f = document.getElementById('preview-fingerprint'); \
             return d && f && f.textContent !== '…' ? f.textContent : null;",
            json!([]),
        )
        .await;
    assert_eq!(fp, json!(bob_safety), "the preview shows bob's safety number");
    let kind = wd.text("dialog[open].preview dl").await;
    assert!(kind.contains("letagents"), "the preview names the protocol: {kind}");
    wd.shot("03-paste-preview").await;
    wd.type_into("#preview-name", "bob").await;
    wd.click("dialog[open].preview button[type=submit]").await;
    wd.element("a[aria-label='Open conversation with bob']").await;

    // bob sees alice's hello and accepts it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let alice_at_bob = loop {
        let reqs = bob.call(Request::ContactRequests).await;
        if let Some(r) = reqs.as_array().and_then(|a| a.first()) {
            assert_eq!(r["address"], json!(alice_address), "bob's request is from alice");
            break r["name"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "alice's hello never reached bob");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    bob.call(Request::ContactAccept { name: alice_at_bob.clone(), new_name: None }).await;

    // ---- send from the window; bob receives it.
    wd.click("a[aria-label='Open conversation with bob']").await;
    // Enter sends (WebDriver's Enter key, U+E007).
    wd.type_into("#compose", "hello bob, from the real webview\u{E007}").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    'got: loop {
        for m in bob.inbox(2).await {
            if m["body"] == "hello bob, from the real webview" {
                break 'got;
            }
        }
        assert!(Instant::now() < deadline, "bob never received alice's message");
    }
    wd.until("the message delivered", 30, "return document.querySelector('.msg.out[data-state=delivered]')", json!([]))
        .await;

    // ---- bob answers; it appears in the open conversation.
    bob.send(&alice_at_bob, "hi alice, bob here").await;
    wd.until(
        "bob's answer in the conversation",
        30,
        "return [...document.querySelectorAll('.msg.in .body')].some(b => b.textContent === 'hi alice, bob here')",
        json!([]),
    )
    .await;
    wd.shot("04-conversation").await;

    // ---- unread while another screen is open: the navigation, the window title (what the window
    // manager shows) and the tray icon count it; opening the conversation reads it everywhere.
    let tray_icon = |name: &str| {
        let shot = shots.join(name);
        display.screenshot(&shot);
        // trayer sits at the top right; its icons are the right-most 48x24 pixels.
        let out = display
            .command("identify")
            .args(["-format", "%#"])
            .arg(format!("{}[48x24+1232+0]", shot.display()))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wd.click("nav a[href='#/settings']").await;
    wd.element("#set-theme").await;
    let read_icon = tray_icon("04a-tray-read.png");
    for text in ["are you there?", "ping again"] {
        bob.send(&alice_at_bob, text).await;
    }
    wd.until("two unread in the title", 30, "return document.title === '(2) Switchboard'", json!([])).await;
    wd.until(
        "the count in the navigation",
        10,
        "const a = document.querySelector(\"nav a[href='#/contacts']\"); return a && a.textContent.includes('2')",
        json!([]),
    )
    .await;
    assert!(
        support::eventually(10, || display.visible_windows(r"\(2\) Switchboard").len() == 1),
        "the window manager sees the count in the window title"
    );
    assert!(
        support::eventually(10, || tray_icon("04b-tray-unread.png") != read_icon),
        "the tray icon shows unread messages"
    );
    wd.shot("04b-unread-elsewhere").await;
    wd.click("nav a[href='#/contacts']").await;
    wd.click("a[href='#/c/bob']").await;
    wd.until("read again", 30, "return document.title === 'Switchboard'", json!([])).await;
    assert!(
        support::eventually(10, || tray_icon("04c-tray-read-again.png") == read_icon),
        "the tray icon is back to no unread"
    );

    // ---- a message bob writes to one of alice's agents (coder, a session on her bridge) is marked
    // as the agent's, waiting until coder asks for its messages, then handed to coder.
    let (bridge, _, owner) = switchboard_tests::bridge_of(&profile);
    let http = reqwest::Client::new();
    let coder = switchboard_tests::open_session(&http, &bridge, &owner, "coder").await;
    bob.call(Request::Send {
        contact: alice_at_bob.clone(),
        text: "coder, please run the tests".into(),
        kind: None,
        reply_to: None,
        from_agent: None,
        to_agent: Some("coder".into()),
    })
    .await;
    let for_coder = |state: &str| {
        format!(
            "const m = [...document.querySelectorAll('.msg.in.to-agent')].find(m => m.textContent.includes('coder, please run the tests')); \
             return m && m.textContent.includes('for your agent coder') && m.textContent.includes('{state}')"
        )
    };
    wd.until("the message marked for coder, waiting", 30, &for_coder("waiting for coder"), json!([])).await;
    let handed: Value = http
        .post(&bridge)
        .bearer_auth(&coder)
        .json(&json!({"op": "wait", "timeout_secs": 10}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(handed.to_string().contains("coder, please run the tests"), "coder was handed it: {handed}");
    wd.until("the message handed to coder", 30, &for_coder("handed to coder"), json!([])).await;
    wd.shot("04g-for-agent").await;

    // ---- the relay goes down: a connection bar says so, and a message sent now shows a clock
    // (queued), not a tick; it goes out by itself when the relay is back.
    relay.stop().await;
    wd.type_into("#compose", "sent while the relay is down\u{E007}").await;
    wd.until(
        "the queued clock",
        30,
        "const m = [...document.querySelectorAll('.msg.out')].find(m => m.textContent.includes('sent while the relay is down')); \
         return m && m.querySelector('.tick-queued')",
        json!([]),
    )
    .await;
    wd.until(
        "the connection bar",
        60,
        "const b = document.querySelector('.connection'); return b && !b.hidden && b.textContent.length > 0",
        json!([]),
    )
    .await;
    wd.shot("04d-relay-down").await;
    relay.restart().await;
    wd.until(
        "the queued message sent by itself",
        60,
        "const m = [...document.querySelectorAll('.msg.out')].find(m => m.textContent.includes('sent while the relay is down')); \
         return m && !m.querySelector('.tick-queued')",
        json!([]),
    )
    .await;
    wd.until("the connection bar gone", 60, "return document.querySelector('.connection').hidden", json!([])).await;

    // ---- pasting something that is no address says so, and the notice goes on navigation.
    wd.type_into("#paste-field", "not an address at all").await;
    wd.chord("\u{E009}", "a").await;
    wd.chord("\u{E009}", "x").await;
    wd.click("main h2").await;
    wd.chord("\u{E009}", "v").await;
    wd.until(
        "the notice about the paste",
        10,
        "return document.querySelector('.notice').textContent.length > 0",
        json!([]),
    )
    .await;
    wd.shot("04e-paste-garbage").await;
    wd.click("nav a[href='#/settings']").await;
    wd.until("the notice cleared", 10, "return document.querySelector('.notice').textContent === ''", json!([])).await;

    // ---- review mode from Settings, and dark mode (the Theme setting).
    wd.click("#set-review").await;
    wd.until(
        "review mode on",
        10,
        "return document.querySelector('.notice').textContent.includes('Review mode is on')",
        json!([]),
    )
    .await;
    let dark = "const s = document.getElementById('set-theme'); s.value = 'dark'; \
                s.dispatchEvent(new Event('change', {bubbles: true})); \
                return getComputedStyle(document.documentElement).backgroundColor";
    let bg = wd.js(dark, json!([])).await;
    assert_eq!(bg, json!("rgb(17, 19, 24)"), "the dark theme applies in the real webview");
    wd.click("nav a[href='#/contacts']").await;
    wd.click("a[href='#/c/bob']").await;
    wd.element("#compose").await;
    wd.shot("04f-dark-conversation").await;
    wd.click("nav a[href='#/settings']").await;
    wd.element("#set-theme").await;
    wd.js("const s = document.getElementById('set-theme'); s.value = 'system'; s.dispatchEvent(new Event('change', {bubbles: true}))", json!([])).await;
    wd.click("#set-review").await;
    wd.until(
        "review mode off",
        10,
        "return document.querySelector('.notice').textContent.includes('Review mode is off')",
        json!([]),
    )
    .await;
    wd.click("nav a[href='#/contacts']").await;
    wd.click("a[href='#/c/bob']").await;
    wd.element("#compose").await;

    // ---- a group is a chat: made by its name (no handle asked), opened with its invite link,
    // written in with Enter.
    wd.click("nav a[href='#/groups']").await;
    wd.type_into("#new-group-name", "Team").await;
    wd.click("form[aria-labelledby=new-group-title] button[type=submit]").await;
    wd.until(
        "the group's chat",
        30,
        "const h = document.getElementById('conv-title'); return h && h.textContent.includes('Team') && document.getElementById('compose')",
        json!([]),
    )
    .await;
    wd.type_into("#compose", "hello team\u{E007}").await;
    wd.until(
        "the group message",
        30,
        "return [...document.querySelectorAll('.group-chat .msg.out')].some(m => m.textContent.includes('hello team'))",
        json!([]),
    )
    .await;
    wd.shot("04h-group-chat").await;
    wd.click("nav a[href='#/contacts']").await;
    wd.click("a[href='#/c/bob']").await;
    wd.element("#compose").await;

    // ---- bob's invite link pasted into the window: "Join group?" naming bob and the group (not
    // a contact preview); joining opens the group as a chat where bob's message appears.
    let made = bob.call(Request::GroupCreate { name: "Band practice".into() }).await;
    let band = made["group"].as_str().unwrap().to_owned();
    let invite = bob.call(Request::GroupInvite { handle: None, group: Some(band.clone()), ttl_secs: None }).await;
    let link = invite["link"].as_str().unwrap().to_owned();
    wd.type_into("#paste-field", &link).await;
    wd.chord("\u{E009}", "a").await;
    wd.chord("\u{E009}", "x").await;
    wd.click("main h2").await;
    wd.chord("\u{E009}", "v").await;
    let who = wd
        .until(
            "the Join group? dialog",
            20,
            "const d = document.querySelector('dialog[open]'); const w = document.getElementById('join-who'); \
             return d && w && d.textContent.includes('Join group?') ? w.textContent : null",
            json!([]),
        )
        .await;
    assert_eq!(
        who,
        json!("bob invited you to \u{201c}Band practice\u{201d}."),
        "the dialog names the inviter and the group"
    );
    wd.shot("04j-join-dialog").await;
    wd.click("dialog[open] button[type=submit]").await;
    wd.until(
        "the joined group's chat",
        60,
        "const h = document.getElementById('conv-title'); return h && h.textContent.includes('Band practice')",
        json!([]),
    )
    .await;
    bob.call(Request::GroupSend {
        handle: None,
        group: band.clone(),
        text: "Welcome to the band".into(),
        to: None,
        reply_to: None,
    })
    .await;
    wd.until(
        "bob's group message",
        30,
        "return [...document.querySelectorAll('.group-chat .msg.in')].some(m => m.textContent.includes('Welcome to the band'))",
        json!([]),
    )
    .await;
    wd.shot("04k-joined-group").await;
    wd.click("nav a[href='#/contacts']").await;
    wd.click("a[href='#/c/bob']").await;
    wd.element("#compose").await;

    // ---- a 480x400 window (its minimum): one pane, no sideways scrolling, the composer and the
    // newest message in view.
    let win = display.visible_windows("Switchboard").remove(0);
    let sized =
        |w: &str, h: &str| display.command("xdotool").args(["windowsize", &win, w, h]).status().unwrap().success();
    assert!(sized("480", "400"), "xdotool could not resize the window");
    wd.until(
        "the 480x400 layout",
        20,
        "const inView = (e) => { const r = e.getBoundingClientRect(); return r.top >= 0 && r.bottom <= innerHeight + 1 && r.height > 0; }; \
         const msgs = document.querySelectorAll('.msg'); \
         return innerWidth <= 480 && document.documentElement.scrollWidth <= innerWidth + 1 \
           && inView(document.getElementById('compose')) && msgs.length > 0 && inView(msgs[msgs.length - 1])",
        json!([]),
    )
    .await;
    wd.shot("04i-480x400").await;
    assert!(sized("1024", "760"));

    // ---- Settings → Move to another relay: what it will do first, then the move; bob (who
    // lives on the old relay) is told and his next message reaches the window from the new one.
    let relay_b = TestRelay::start().await;
    let new_url = relay_b.url().trim_end_matches('/').to_owned();
    wd.click("nav a[href='#/settings']").await;
    wd.type_into("#set-move-url", &new_url).await;
    wd.click("#relay-move button[type=submit]").await;
    let plan = wd
        .until(
            "the move's confirmation",
            30,
            "const t = document.getElementById('set-move-confirm-text'); return t ? t.textContent : null",
            json!([]),
        )
        .await;
    let plan = plan.as_str().unwrap_or_default().to_owned();
    assert!(plan.contains("1 contact will be told") && plan.contains("48 h"), "the plan in words: {plan}");
    wd.shot("04l-relay-move-confirm").await;
    wd.click("#set-move-yes").await;
    wd.until(
        "the moved notice",
        60,
        "return [...document.querySelectorAll('[role=status]')].some(s => s.textContent.includes('Moved to'))",
        json!([]),
    )
    .await;
    wd.shot("04m-relay-moved").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    'told: loop {
        for m in bob.inbox(1).await {
            if m["kind"] == "moved" && m["body"] == new_url.as_str() {
                break 'told;
            }
        }
        assert!(Instant::now() < deadline, "bob was never told about the move");
    }
    bob.send(&alice_at_bob, "found you on the new relay").await;
    wd.click("nav a[href='#/contacts']").await;
    wd.click("a[href='#/c/bob']").await;
    wd.until(
        "bob's message through the new relay",
        30,
        "return [...document.querySelectorAll('.msg.in .body')].some(b => b.textContent === 'found you on the new relay')",
        json!([]),
    )
    .await;

    // ---- close the window with a tray host on the display: the app keeps running, its window
    // hidden (tests/tray.rs: without a host, closing quits).
    let driver_pid = driver.child.id();
    let app_pid = app_pid_under(driver_pid).expect("the app process under tauri-driver");
    let windows = display.visible_windows("Switchboard");
    assert_eq!(windows.len(), 1, "one visible app window: {windows:?}");
    support::close_window(&display, &windows[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !display.visible_windows("Switchboard").is_empty() {
        assert!(Instant::now() < deadline, "the window did not close");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(support::alive(app_pid), "closing the window quit the app (close-to-tray is the default)");
    display.screenshot(&shots.join("05-closed-to-tray.png"));

    // ---- a second launch with a switchboard: link hands it to the first instance and exits.
    let link = format!("switchboard:{carol_address}");
    let mut second = display.command(&app);
    second.args(["--home", &profile.display().to_string(), &link]).env("SWITCHBOARD_KEYSTORE", "file");
    let mut second = support::launch(second);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = second.child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let log = second.stop();
            panic!("the second launch kept running (no single instance):\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "the second launch failed ({status}):\n{}", second.log());
    let deadline = Instant::now() + Duration::from_secs(10);
    while display.visible_windows("Switchboard").is_empty() {
        assert!(Instant::now() < deadline, "the second launch did not bring the window back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fp = wd
        .until(
            "the link's preview in the first instance",
            20,
            "const d = document.querySelector('dialog[open].preview'); \
             const f = document.getElementById('preview-fingerprint'); \
             return d && f && f.textContent !== '…' ? f.textContent : null;",
            json!([]),
        )
        .await;
    assert_eq!(fp, json!(carol_safety), "the preview shows carol's safety number");
    assert!(support::alive(app_pid), "still the first instance");
    assert_eq!(app_pid_under(driver_pid), Some(app_pid), "no second app process stayed");
    wd.shot("06-link-preview").await;
    display.screenshot(&shots.join("07-link-preview-screen.png"));
    assert!(support::colours(&shots.join("07-link-preview-screen.png")) > 50, "the window is painted again");

    wd.quit().await;
    if support::alive(app_pid) {
        let _ = std::process::Command::new("kill").arg(app_pid.to_string()).status();
    }
    let log = driver.stop();
    drop(display);
    println!("screenshots in {}\ntauri-driver log:\n{log}", shots.display());
}
