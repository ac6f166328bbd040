//! The `switchboard` command line as a person or script uses it: processes, a daemon, the bridge.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use switchboard_tests::{DaemonProcess, TestRelay, home, switchboard, switchboard_ok};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

fn ok(home: &Path, args: &[&str]) -> String {
    switchboard_ok(&bin(), home, args)
}

fn json(home: &Path, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&ok(home, &a)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_profiles_talk_through_the_cli_with_and_without_a_daemon() {
    let relay = TestRelay::start().await;
    let url = relay.url();
    let (_a, alice) = home();
    let (_b, bob) = home();
    let who = json(&alice, &["init", "--name", "alice", "--relay", &url]);
    assert_eq!(who["letagents"]["mailbox_id"].as_str().unwrap().len(), 43);
    json(&bob, &["init", "--name", "bob", "--relay", &url]);
    let bob_who = json(&bob, &["whoami"]);
    let bob_addr = bob_who["letagents"]["address"].as_str().unwrap().to_owned();
    assert!(bob_who["letagents"]["safety_number"].as_str().unwrap().split(' ').count() == 8);

    let daemon = DaemonProcess::start(&bin(), &bob);
    // A second runtime for the same profile is refused.
    let (second, _, err) = switchboard(&bin(), &bob, &["daemon"]);
    assert!(!second && err.contains("another runtime"), "{err}");

    // Alice has no daemon: each command runs the runtime in-process.
    let c = json(&alice, &["contact", "add", &bob_addr, "--name", "bob"]);
    assert_eq!(c["state"], "active");
    let requests = (0..100)
        .find_map(|_| {
            let r = json(&bob, &["contact", "requests"]);
            if r.as_array().unwrap().is_empty() {
                std::thread::sleep(Duration::from_millis(100));
                None
            } else {
                Some(r)
            }
        })
        .expect("bob never saw the request");
    assert_eq!(requests[0]["name"], "alice");
    assert_eq!(requests[0]["safety_number"], who["letagents"]["safety_number"]);
    ok(&bob, &["contact", "accept", "alice"]);

    let id = ok(&alice, &["send", "bob", "hello from the command line"]);
    let id = id.split_whitespace().next().unwrap().to_owned();
    let inbox = json(&bob, &["inbox", "--wait", "10"]);
    assert_eq!(inbox[0]["id"], id.as_str());
    assert_eq!(inbox[0]["from"], "alice");
    assert_eq!(inbox[0]["protocol"], "letagents");
    assert_eq!(inbox[0]["body"], "hello from the command line");
    assert!(json(&bob, &["inbox"]).as_array().unwrap().is_empty(), "inbox shows only what is new");
    assert_eq!(json(&bob, &["inbox", "--all"]).as_array().unwrap().len(), 1);

    // An ask answered through the daemon; alice waits in-process with the websocket.
    let ask = json(&alice, &["send", "bob", "ready?", "--ask", "--from-agent", "planner", "--to-agent", "coder"]);
    let got = json(&bob, &["inbox", "--wait", "10"]);
    assert_eq!(got[0]["kind"], "ask");
    assert_eq!(got[0]["to_agent"], "coder");
    ok(&bob, &["send", "alice", "yes", "--reply-to", ask["id"].as_str().unwrap()]);
    let reply = json(&alice, &["inbox", "--wait", "10"]);
    assert_eq!(reply[0]["kind"], "reply");
    assert_eq!(reply[0]["reply_to"], ask["id"]);

    let status = json(&bob, &["status"]);
    assert!(status["bridge"].as_str().unwrap().starts_with("http://127.0.0.1:"));
    assert_eq!(status["relays"][0]["health"]["state"], "connected");
    let log = json(&bob, &["log"]);
    assert!(log.as_array().unwrap().iter().any(|r| r["state"] == "received"));

    daemon.stop();
    assert!(!bob.join("bridge.token").exists(), "bridge files are removed on exit");
    // With the daemon gone, bob's commands run in-process again.
    assert_eq!(json(&bob, &["contact", "list"])[0]["name"], "alice");
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let relay = TestRelay::start().await;
    let (_h, home) = home();
    ok(&home, &["init", "--name", "carol", "--relay", &relay.url()]);
    let daemon = DaemonProcess::start(&bin(), &home);
    for f in ["bridge.token", "bridge.port", "keys.secret", "switchboard.db"] {
        let mode = std::fs::metadata(home.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{f} is {mode:o}");
    }
    let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_refuses_what_is_not_a_local_client() {
    let relay = TestRelay::start().await;
    let (_h, home) = home();
    ok(&home, &["init", "--name", "dave", "--relay", &relay.url()]);
    let daemon = DaemonProcess::start(&bin(), &home);
    let port = std::fs::read_to_string(home.join("bridge.port")).unwrap();
    let token = std::fs::read_to_string(home.join("bridge.token")).unwrap();
    let url = format!("http://127.0.0.1:{port}/v1/rpc");
    let body = r#"{"op":"whoami"}"#;
    let http = reqwest::Client::new();
    let good =
        http.post(&url).bearer_auth(&token).header("content-type", "application/json").body(body).send().await.unwrap();
    assert_eq!(good.status(), 200);

    let no_token = http.post(&url).header("content-type", "application/json").body(body).send().await.unwrap();
    assert_eq!(no_token.status(), 401);
    let wrong = http.post(&url).bearer_auth("0".repeat(64)).body(body).send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let origin =
        http.post(&url).bearer_auth(&token).header("origin", "http://evil.example").body(body).send().await.unwrap();
    assert_eq!(origin.status(), 403);
    let host = http
        .post(&url)
        .bearer_auth(&token)
        .header("host", format!("evil.example:{port}"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(host.status(), 403);
    // A raw request with an empty Host header.
    let raw = format!(
        "POST /v1/rpc HTTP/1.1\r\nHost: \r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}")).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 403") || resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert!(!resp.contains("letagents"), "no data leaks through a refused request");
    daemon.stop();
}

#[test]
fn commands_on_an_uninitialised_profile_say_what_to_do() {
    let (_h, home) = home();
    let (success, _, err) = switchboard(&bin(), &home, &["whoami"]);
    assert!(!success);
    assert!(err.contains("switchboard init"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pair_prints_a_token_and_both_sides_end_up_with_each_others_fingerprint() {
    use std::io::{BufRead, BufReader};
    let relay = TestRelay::start().await;
    let (_a, alice) = home();
    let (_b, bob) = home();
    ok(&alice, &["init", "--name", "alice", "--relay", &relay.url()]);
    ok(&bob, &["init", "--name", "bob", "--relay", &relay.url()]);
    let mut opener = Command::new(bin())
        .arg("--home")
        .arg(&alice)
        .args(["pair", "--name", "bob", "--timeout", "60", "--json"])
        .env("SWITCHBOARD_KEYSTORE", "file")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(opener.stdout.take().unwrap());
    let (token, out) = tokio::task::spawn_blocking(move || {
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let v: Value = serde_json::from_str(&first).unwrap();
        (v["token"].as_str().unwrap().to_owned(), out)
    })
    .await
    .unwrap();
    assert!(token.starts_with("rv-"), "{token}");
    let joined = json(&bob, &["pair", &token, "--name", "alice", "--timeout", "60"]);
    assert_eq!(joined["status"], "paired");
    let opened = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        let mut out = out;
        out.read_line(&mut rest).unwrap();
        let status = opener.wait().unwrap();
        (rest, status)
    })
    .await
    .unwrap();
    assert!(opened.1.success());
    let opened: Value = serde_json::from_str(&opened.0).unwrap();
    assert_eq!(opened["status"], "paired");
    // Each side shows the fingerprint the other side's own device computes.
    assert_eq!(opened["fingerprint_short"], json(&bob, &["whoami"])["stringcup"]["fingerprint_short"]);
    assert_eq!(joined["fingerprint_short"], json(&alice, &["whoami"])["stringcup"]["fingerprint_short"]);
    let contacts = json(&alice, &["contact", "list"]);
    assert_eq!(contacts[0]["name"], "bob");
    assert_eq!(contacts[0]["protocol"], "stringcup");
    ok(&alice, &["send", "bob", "paired from the command line"]);
    assert_eq!(json(&bob, &["inbox"])[0]["body"], "paired from the command line");
}

/// Issue 13 §5: a daemon started while a one-shot command runs its runtime in-process used to
/// fail at once ("another runtime already owns"); it waits for the command and then serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_started_during_a_one_shot_command_waits_for_it_then_serves() {
    let relay = TestRelay::start().await;
    let (_h, alice) = home();
    json(&alice, &["init", "--name", "alice", "--relay", &relay.url()]);
    // `inbox --wait 4` with no daemon runs the runtime in this process and holds the profile.
    let mut oneshot = Command::new(bin())
        .arg("--home")
        .arg(&alice)
        .args(["inbox", "--wait", "4"])
        .env("SWITCHBOARD_KEYSTORE", "file")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = oneshot.id().to_string();
    let holds = (0..200).any(|_| {
        let holder = std::fs::read_to_string(alice.join("runtime.lock")).unwrap_or_default();
        holder.lines().next() == Some(pid.as_str()) || {
            std::thread::sleep(Duration::from_millis(25));
            false
        }
    });
    assert!(holds, "the one-shot command never took the profile");

    let started = std::time::Instant::now();
    let daemon = DaemonProcess::start(&bin(), &alice);
    assert!(oneshot.wait().unwrap().success(), "the one-shot command was disturbed");
    assert!(started.elapsed() > Duration::from_secs(1), "the daemon cannot have run beside the command");
    // The daemon owns the profile now: a command goes through its bridge.
    assert!(json(&alice, &["status"]).is_object());
    daemon.stop();

    // A daemon is still refused at once beside a runtime that serves a bridge.
    let daemon = DaemonProcess::start(&bin(), &alice);
    let t = std::time::Instant::now();
    let (second, _, err) = switchboard(&bin(), &alice, &["daemon"]);
    assert!(!second && err.contains("another runtime") && err.contains("serves its bridge"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5));
    daemon.stop();
}

/// Issue 13 §5: a one-shot `send` whose relay is down used to print `error sending request`
/// although the message was queued (and later delivered); it succeeds, says "queued", and the
/// outbox delivers it once the relay is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_send_to_a_down_relay_says_queued_not_error_and_goes_out_later() {
    let mut relay = TestRelay::start().await;
    let ((_a, alice), (_b, bob)) = (home(), home());
    switchboard_tests::befriend_cli(&bin(), &alice, &bob, &relay.url());
    relay.stop().await;
    let (sent, out, err) = switchboard(&bin(), &alice, &["send", "bob", "while the relay is down", "--json"]);
    assert!(sent, "a queued send was reported as a failure: {err}");
    let view: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(view["state"], "queued", "{view}");
    let (_, text, _) = switchboard(&bin(), &alice, &["send", "bob", "and a second one"]);
    assert!(text.contains("queued"), "the text output does not say it is queued: {text}");

    relay.restart().await;
    ok(&alice, &["flush"]);
    let mut arrived = Vec::new();
    for _ in 0..50 {
        let got = json(&bob, &["inbox"]);
        arrived.extend(got.as_array().unwrap().iter().filter_map(|m| m["body"].as_str().map(str::to_owned)));
        if arrived.len() >= 2 {
            break;
        }
        ok(&alice, &["flush"]);
        std::thread::sleep(Duration::from_millis(200));
    }
    arrived.sort();
    assert_eq!(arrived, ["and a second one", "while the relay is down"], "each queued message arrives once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contact_accept_as_names_the_request_and_merge_prints_both_safety_numbers() {
    let relay = TestRelay::start().await;
    let url = relay.url();
    let (_a, alice) = home();
    let (_b, bob) = home();
    json(&alice, &["init", "--name", "alice", "--relay", &url]);
    let bob_who = json(&bob, &["init", "--name", "bob", "--relay", &url]);
    let bob_addr = bob_who["letagents"]["address"].as_str().unwrap().to_owned();
    let bob_mail = bob_who["agent_mail"]["address"].as_str().unwrap().to_owned();
    ok(&alice, &["contact", "add", &bob_addr, "--name", "bob"]);
    ok(&alice, &["contact", "add", &bob_mail, "--name", "bob-mail"]);
    let requests = (0..100)
        .find_map(|_| {
            let r = json(&bob, &["contact", "requests"]);
            let found = r.as_array().unwrap().iter().find(|c| c["protocol"] == "letagents").cloned();
            if found.is_none() {
                std::thread::sleep(Duration::from_millis(100));
            }
            found
        })
        .expect("bob never saw the request");
    let claimed = requests["name"].as_str().unwrap().to_owned();
    let out = ok(&bob, &["contact", "accept", &claimed, "--as", "Alice A."]);
    assert!(out.starts_with("Alice A. (letagents)"), "{out}");

    // Two contacts for one person: a merge without comparing is refused, naming both numbers.
    let (merged, _, err) = switchboard(&bin(), &alice, &["contact", "merge", "bob", "bob-mail"]);
    assert!(!merged, "{err}");
    let list = json(&alice, &["contact", "list"]);
    let number = |n: &str| {
        list.as_array().unwrap().iter().find(|c| c["name"] == n).unwrap()["safety_number"].as_str().unwrap().to_owned()
    };
    let mail_number = number("bob-mail");
    assert!(err.contains(&number("bob")) && err.contains(&mail_number), "{err}");
    assert!(err.contains(&format!("--confirm-safety-number '{mail_number}'")), "{err}");
    let out = ok(&alice, &["contact", "merge", "bob", "bob-mail", "--confirm-safety-number", &mail_number]);
    assert!(out.contains("via agent-mail"), "{out}");
    assert_eq!(json(&alice, &["contact", "list"]).as_array().unwrap().len(), 1);
    ok(&alice, &["contact", "split", "bob", "agent-mail"]);
    assert_eq!(json(&alice, &["contact", "list"]).as_array().unwrap().len(), 2);
}
