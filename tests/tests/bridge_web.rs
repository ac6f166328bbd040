//! The bridge serving the UI: pages without a token, single-use sign-in codes, the session
//! cookie, and the same-origin rule; every other browser origin is still refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use switchboard_core::api::Request;
use switchboard_core::bridge::web::WebUi;
use switchboard_core::bridge::{Bridge, serve, serve_with};
use switchboard_tests::{DaemonProcess, Peer, TestRelay, bridge_of, home, switchboard};

use tokio::io::{AsyncBufReadExt, BufReader};

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn ui_build() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("index.html"), "<!doctype html><title>t</title>").unwrap();
    std::fs::create_dir(d.path().join("assets")).unwrap();
    std::fs::write(d.path().join("assets/app.js"), "console.log(1)").unwrap();
    d
}

struct Served {
    bridge: Bridge,
    ui: WebUi,
    base: String,
    _dir: tempfile::TempDir,
    _peer: Peer,
}

async fn served() -> Served {
    let relay = TestRelay::start().await;
    let peer = Peer::offline("alice", &relay.url()).await;
    let dir = ui_build();
    let ui = WebUi { dir: Some(dir.path().to_owned()), ..Default::default() };
    let bridge = serve_with(peer.rt.clone(), Some(ui.clone())).await.unwrap();
    let base = format!("http://127.0.0.1:{}", bridge.addr.port());
    Served { bridge, ui, base, _dir: dir, _peer: peer }
}

impl Served {
    fn origin(&self) -> String {
        self.base.clone()
    }

    /// Signs in like the page does and returns the cookie header value.
    async fn sign_in(&self) -> String {
        let code = self.ui.sessions.mint_code();
        let r = http()
            .post(format!("{}/v1/session", self.base))
            .header("origin", self.origin())
            .json(&json!({ "code": code }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"), "{set}");
        set.split(';').next().unwrap().to_owned()
    }

    async fn rpc(&self, origin: Option<&str>, cookie: Option<&str>, extra: &[(&str, &str)]) -> (StatusCode, Value) {
        let mut req = http().post(format!("{}/v1/rpc", self.base)).json(&json!({"op": "whoami"}));
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_served_with_a_strict_csp_and_no_token() {
    let s = served().await;
    let r = http().get(format!("{}/", s.base)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let csp = r.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let js = http().get(format!("{}/assets/app.js", s.base)).send().await.unwrap();
    assert!(js.headers()["content-type"].to_str().unwrap().starts_with("text/javascript"));
    // An app route falls back to index.html; traversal and wrong Hosts do not.
    assert_eq!(http().get(format!("{}/contacts", s.base)).send().await.unwrap().status(), StatusCode::OK);
    // A raw `..` (clients normalise URLs, so write the request by hand) never leaves the dir.
    let raw = raw_get(s.bridge.addr, "/assets/../../../../etc/passwd").await;
    assert!(raw.starts_with("HTTP/1.1 404"), "{raw}");
    assert_eq!(raw_get(s.bridge.addr, "/.hidden").await.lines().next().unwrap(), "HTTP/1.1 404 Not Found");
    let r = http().get(format!("{}/", s.base)).header("host", "evil.example").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_code_works_once_and_only_from_the_bridges_own_origin() {
    let s = served().await;
    let code = s.ui.sessions.mint_code();
    let post = |origin: &str, code: &str| {
        http()
            .post(format!("{}/v1/session", s.base))
            .header("origin", origin.to_owned())
            .json(&json!({"code": code}))
            .send()
    };
    let foreign = post("http://evil.example", &code).await.unwrap();
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);
    assert!(foreign.headers().get("set-cookie").is_none());
    let other_port = post("http://127.0.0.1:1", &code).await.unwrap();
    assert_eq!(other_port.status(), StatusCode::FORBIDDEN);
    let ok = post(&s.origin(), &code).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let again = post(&s.origin(), &code).await.unwrap();
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(again.json::<Value>().await.unwrap()["code"], "bad_code");
    assert_eq!(post(&s.origin(), "made-up").await.unwrap().status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_works_only_same_origin() {
    let s = served().await;
    let cookie = s.sign_in().await;
    let own = s.origin();
    let (st, who) = s.rpc(Some(&own), Some(&cookie), &[]).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(who["name"], "alice");
    // A same-origin GET carries no Origin; the browser marks it.
    let r = http()
        .get(format!("{}/v1/ping", s.base))
        .header("cookie", &cookie)
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    let port = s.bridge.addr.port();
    let forged = format!("sb_session_{port}=forged");
    type Case<'a> = (Option<String>, Option<&'a str>, Vec<(&'a str, &'a str)>);
    let refusals: Vec<Case> = vec![
        (Some("http://evil.example".into()), Some(&cookie), vec![]),
        (Some(format!("http://localhost:{port}")), Some(&cookie), vec![]),
        (Some(format!("http://127.0.0.1:{}", port + 1)), Some(&cookie), vec![]),
        (Some("null".into()), Some(&cookie), vec![]),
        (None, Some(&cookie), vec![]),
        (None, Some(&cookie), vec![("sec-fetch-site", "same-site")]),
        (Some(own.clone()), None, vec![]),
        (Some(own.clone()), Some("sb_session_1=x"), vec![]),
        (Some(own.clone()), Some(&forged), vec![]),
        (Some(own.clone()), Some(&cookie), vec![("host", "evil.example")]),
    ];
    for (i, (origin, c, extra)) in refusals.iter().enumerate() {
        let (st, body) = s.rpc(origin.as_deref(), *c, extra).await;
        assert!(st == StatusCode::FORBIDDEN || st == StatusCode::UNAUTHORIZED, "case {i} let through: {st} {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_token_mints_codes_and_a_plain_bridge_serves_no_ui() {
    let s = served().await;
    let token = &s.bridge.token;
    let r = http().post(format!("{}/v1/ui-code", s.base)).bearer_auth(token).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let url = r.json::<Value>().await.unwrap()["url"].as_str().unwrap().to_owned();
    assert!(url.starts_with(&format!("{}/#code=", s.base)), "{url}");
    // The owner token from a browser page is refused (Origin), as is an agent's token.
    let r = http()
        .post(format!("{}/v1/ui-code", s.base))
        .bearer_auth(token)
        .header("origin", s.origin())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let agent = s._peer.open_session("helper").await;
    let r = http().post(format!("{}/v1/ui-code", s.base)).bearer_auth(&agent).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // A browser session cannot mint further codes either.
    let cookie = s.sign_in().await;
    let r = http()
        .post(format!("{}/v1/ui-code", s.base))
        .header("origin", s.origin())
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    let relay = TestRelay::start().await;
    let plain_peer = Peer::offline("bob", &relay.url()).await;
    let plain = serve(plain_peer.rt.clone()).await.unwrap();
    let base = format!("http://127.0.0.1:{}", plain.addr.port());
    assert_eq!(http().get(format!("{base}/")).send().await.unwrap().status(), StatusCode::NOT_FOUND);
    let r = http().post(format!("{base}/v1/ui-code")).bearer_auth(&plain.token).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = http()
        .post(format!("{base}/v1/rpc"))
        .header("origin", base.clone())
        .header("cookie", format!("sb_session_{}=x", plain.addr.port()))
        .json(&Request::Whoami)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
}

async fn raw_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).await.unwrap();
    out
}

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchboard_ui_asks_a_running_daemon_for_a_link_that_signs_in_once() {
    let relay = TestRelay::start().await;
    let (_d, home) = home();
    let (ok, _, err) = switchboard(&bin(), &home, &["init", "--name", "alice", "--relay", &relay.url()]);
    assert!(ok, "{err}");
    let dir = ui_build();
    let child = std::process::Command::new(bin())
        .arg("--home")
        .arg(&home)
        .args(["daemon", "--ui", dir.path().to_str().unwrap()])
        .env("SWITCHBOARD_KEYSTORE", "file")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let daemon = DaemonProcess(child);
    for _ in 0..200 {
        if home.join("bridge.port").exists() && home.join("bridge.token").exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (ok, out, err) = switchboard(&bin(), &home, &["ui"]);
    assert!(ok, "{err}");
    let url = out.trim().to_owned();
    let (_, port, _) = bridge_of(&home);
    let origin = format!("http://127.0.0.1:{port}");
    assert!(url.starts_with(&format!("{origin}/#code=")), "{url}");
    let code = url.split("code=").nth(1).unwrap();
    let sign_in = || {
        http().post(format!("{origin}/v1/session")).header("origin", origin.clone()).json(&json!({"code": code})).send()
    };
    assert_eq!(sign_in().await.unwrap().status(), StatusCode::OK);
    assert_eq!(sign_in().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchboard_ui_on_a_new_profile_serves_first_run_then_the_runtime() {
    let relay = TestRelay::start().await;
    let (_d, home) = home();
    let dir = ui_build();
    let mut child = tokio::process::Command::new(bin())
        .arg("--home")
        .arg(&home)
        .args(["ui", "--ui", dir.path().to_str().unwrap()])
        .env("SWITCHBOARD_KEYSTORE", "file")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), out.next_line()).await.unwrap().unwrap().unwrap();
    let origin = url.split("/#").next().unwrap().to_owned();
    let code = url.split("code=").nth(1).unwrap();
    let r = http().post(format!("{origin}/v1/session")).header("origin", &origin).json(&json!({"code": code})).send();
    let r = r.await.unwrap();
    let cookie = r.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_owned();
    let call = |path: &str, body: Value, cookie: Option<String>| {
        let mut req = http().post(format!("{origin}{path}")).header("origin", &origin).json(&body);
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        req.send()
    };
    let r = call("/v1/rpc", json!({"op": "whoami"}), Some(cookie.clone())).await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "not_initialized");
    // Setting up needs the session.
    let r = call("/v1/setup", json!({"name": "alice", "relay": relay.url()}), None).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = call("/v1/setup", json!({"name": "alice", "relay": relay.url()}), Some(cookie)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["whoami"]["name"], "alice");
    let next = v["url"].as_str().unwrap();
    let (_, port, token) = bridge_of(&home);
    assert!(next.starts_with(&format!("http://127.0.0.1:{port}/#code=")), "{next}");
    // The profile's runtime now answers the CLI over its bridge.
    let r = http()
        .post(format!("http://127.0.0.1:{port}/v1/rpc"))
        .bearer_auth(token)
        .json(&Request::Whoami)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["name"], "alice");
    child.start_kill().unwrap();
}
