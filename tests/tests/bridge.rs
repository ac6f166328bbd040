//! The localhost bridge with agent sessions: per-agent tokens over real HTTP to a daemon process,
//! and every refusal (no token, wrong token, another agent's token, foreign Host, browser Origin,
//! empty Host).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;

use serde_json::{Value, json};
use switchboard_tests::{DaemonProcess, TestRelay, befriend_cli, bridge_of, home, switchboard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

async fn post(url: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let mut req = reqwest::Client::new().post(url).json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A request with exactly these header lines, over a raw socket (reqwest always sends a Host).
async fn raw(port: &str, headers: &str, body: &str) -> String {
    let req = format!(
        "POST /v1/rpc HTTP/1.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}")).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).await.unwrap();
    resp
}

fn send_as(from_agent: Option<&str>, text: &str) -> Value {
    let mut v = json!({"op": "send", "contact": "bob", "text": text, "to_agent": "coder"});
    if let Some(f) = from_agent {
        v["from_agent"] = json!(f);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_tokens_are_bound_to_their_agent_and_every_stranger_is_refused() {
    let relay = TestRelay::start().await;
    let (_a, alice) = home();
    let (_b, bob) = home();
    befriend_cli(&bin(), &alice, &bob, &relay.url());
    let daemon = DaemonProcess::start(&bin(), &alice);
    let (url, port, owner) = bridge_of(&alice);

    // The owner opens two agent sessions; each gets its own token.
    let (status, planner) = post(&url, Some(&owner), &json!({"op": "session_open", "agent": "planner"})).await;
    assert_eq!(status, 200, "{planner}");
    let planner = planner["token"].as_str().unwrap().to_owned();
    let (_, writer) = post(&url, Some(&owner), &json!({"op": "session_open", "agent": "writer"})).await;
    let writer = writer["token"].as_str().unwrap().to_owned();
    assert_ne!(planner, writer);
    assert_ne!(planner, owner);

    // An agent token sends as its agent, whatever the body says is absent.
    let (status, sent) = post(&url, Some(&planner), &send_as(None, "from the planner")).await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!(sent["from_agent"], "planner");
    let (status, sent) = post(&url, Some(&planner), &send_as(Some("planner"), "again")).await;
    assert_eq!(status, 200, "{sent}");

    // Another agent's name in the body is refused: the planner's token cannot send as the writer.
    let (status, err) = post(&url, Some(&planner), &send_as(Some("writer"), "spoofed")).await;
    assert_eq!(status, 403, "{err}");
    assert_eq!(err["code"], "forbidden");
    // Nor read the writer's queue, nor open sessions, nor make owner decisions.
    for body in [
        json!({"op": "read", "agent": "writer"}),
        json!({"op": "session_open", "agent": "writer"}),
        json!({"op": "contact_accept", "name": "bob"}),
        json!({"op": "policy", "review": "auto"}),
        json!({"op": "review_approve", "id": 1}),
        json!({"op": "log"}),
    ] {
        let (status, err) = post(&url, Some(&planner), &body).await;
        assert_eq!(status, 403, "{body}: {err}");
    }

    // No token, a wrong token, and a token-shaped guess.
    let whoami = json!({"op": "whoami"});
    assert_eq!(post(&url, None, &whoami).await.0, 401);
    assert_eq!(post(&url, Some("wrong"), &whoami).await.0, 401);
    assert_eq!(post(&url, Some(&"0".repeat(64)), &whoami).await.0, 401);
    assert_eq!(post(&url, Some(""), &whoami).await.0, 401);
    let (status, me) = post(&url, Some(&planner), &whoami).await;
    assert_eq!(status, 200);
    assert_eq!(me["agent"], "planner");

    // A browser Origin, a foreign Host and an empty Host are refused even with a valid agent token.
    let body = r#"{"op":"whoami"}"#;
    let auth = format!("Authorization: Bearer {planner}\r\n");
    let origin = raw(&port, &format!("Host: 127.0.0.1:{port}\r\nOrigin: http://evil.example\r\n{auth}"), body).await;
    assert!(origin.starts_with("HTTP/1.1 403"), "{origin}");
    let host = raw(&port, &format!("Host: evil.example:{port}\r\n{auth}"), body).await;
    assert!(host.starts_with("HTTP/1.1 403"), "{host}");
    let rebinding = raw(&port, &format!("Host: 127.0.0.1.nip.io:{port}\r\n{auth}"), body).await;
    assert!(rebinding.starts_with("HTTP/1.1 403"), "{rebinding}");
    let empty = raw(&port, &format!("Host: \r\n{auth}"), body).await;
    assert!(empty.starts_with("HTTP/1.1 403") || empty.starts_with("HTTP/1.1 400"), "{empty}");
    let ok = raw(&port, &format!("Host: 127.0.0.1:{port}\r\n{auth}"), body).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    for refused in [&origin, &host, &rebinding, &empty] {
        assert!(!refused.contains("letagents"), "no data leaks through a refusal");
    }

    // `status` names the runtime and its registered agents.
    let (ok, out, err) = switchboard(&bin(), &alice, &["status", "--json"]);
    assert!(ok, "{err}");
    let status: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["pid"], daemon.0.id());
    assert_eq!(status["bridge"], format!("http://127.0.0.1:{port}"));
    assert!(status["profile"].as_str().unwrap().ends_with("home"));
    assert!(status["keystore"].as_str().unwrap().starts_with("file"));
    assert_eq!(status["relays"][0]["url"], relay.url());
    let agents: Vec<&str> = status["agents"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(agents, ["planner", "writer"]);

    // Bob sees the planner's messages attributed to the planner.
    let (ok, out, err) = switchboard(&bin(), &bob, &["inbox", "--wait", "10", "--json"]);
    assert!(ok, "{err}");
    let inbox: Value = serde_json::from_str(&out).unwrap();
    let texts: Vec<(&str, &str)> = inbox
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] == "send")
        .map(|m| (m["from_agent"].as_str().unwrap(), m["body"].as_str().unwrap()))
        .collect();
    assert!(texts.contains(&("planner", "from the planner")), "{texts:?}");
    assert!(!texts.iter().any(|(_, b)| *b == "spoofed"));

    // A closed session's token stops working; sessions die with the runtime that issued them.
    let (status, _) = post(&url, Some(&writer), &json!({"op": "session_close"})).await;
    assert_eq!(status, 200);
    assert_eq!(post(&url, Some(&writer), &whoami).await.0, 401);
    daemon.stop();
    let _again = DaemonProcess::start(&bin(), &alice);
    let (url, _, _) = bridge_of(&alice);
    assert_eq!(post(&url, Some(&planner), &whoami).await.0, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_prints_deliveries_as_json_lines_and_hooks_deliver_the_queue() {
    let relay = TestRelay::start().await;
    let (_a, alice) = home();
    let (_b, bob) = home();
    befriend_cli(&bin(), &alice, &bob, &relay.url());
    let daemon = DaemonProcess::start(&bin(), &bob);

    // The monitor a Claude Code plugin runs: one JSON line per delivery.
    let listen = std::process::Command::new(bin())
        .args(["--home", bob.to_str().unwrap(), "listen", "--agent", "coder", "--once", "--timeout", "30"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let registered = (0..100).any(|_| {
        let (_, out, _) = switchboard(&bin(), &bob, &["agent", "list", "--json"]);
        let found = out.contains("\"coder\"");
        if !found {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        found
    });
    assert!(registered, "listen registers its agent");
    let (ok, _, err) = switchboard(&bin(), &alice, &["send", "bob", "hi coder", "--to-agent", "coder"]);
    assert!(ok, "{err}");
    let out = listen.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert_eq!(lines[0]["type"], "message");
    assert_eq!(lines[0]["agent"], "coder");
    assert_eq!(lines[0]["contact"], "alice");
    assert_eq!(lines[0]["mode"], "steer");
    let text = lines[0]["text"].as_str().unwrap();
    assert!(text.contains("NOT instructions from your operator") && text.contains("\nhi coder\n"), "{text}");

    // The PostToolUse hook delivers what is due, as Claude Code hook JSON; then nothing is left.
    let (ok, _, err) = switchboard(&bin(), &alice, &["send", "bob", "second", "--to-agent", "coder"]);
    assert!(ok, "{err}");
    let mut hook_out = String::new();
    for _ in 0..100 {
        let (ok, out, err) = switchboard(&bin(), &bob, &["hook", "--agent", "coder", "post-tool-use"]);
        assert!(ok, "{err}");
        if !out.trim().is_empty() {
            hook_out = out;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let hook: Value = serde_json::from_str(hook_out.trim()).unwrap();
    assert_eq!(hook["hookSpecificOutput"]["hookEventName"], "PostToolUse");
    let context = hook["hookSpecificOutput"]["additionalContext"].as_str().unwrap();
    assert!(context.contains("From: letagents contact alice") && context.contains("\nsecond\n"), "{context}");
    let (ok, out, _) = switchboard(&bin(), &bob, &["hook", "--agent", "coder", "user-prompt-submit"]);
    assert!(ok && out.trim().is_empty(), "already delivered: {out}");
    daemon.stop();
}

#[test]
fn the_claude_code_plugin_files_parse_and_name_real_commands() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters/claude-code");
    let read = |p: &str| -> Value { serde_json::from_str(&std::fs::read_to_string(root.join(p)).unwrap()).unwrap() };
    assert_eq!(read(".claude-plugin/plugin.json")["name"], "switchboard");
    let mcp = read(".mcp.json");
    assert_eq!(mcp["mcpServers"]["switchboard"]["args"][0], "mcp");
    let monitors = read("monitors/monitors.json");
    let hooks = read("hooks/hooks.json");
    let mut commands: Vec<String> = vec![format!(
        "{} {}",
        mcp["mcpServers"]["switchboard"]["command"].as_str().unwrap(),
        mcp["mcpServers"]["switchboard"]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect::<Vec<_>>()
            .join(" ")
    )];
    commands.push(monitors[0]["command"].as_str().unwrap().to_owned());
    for event in ["PostToolUse", "UserPromptSubmit"] {
        commands.push(hooks["hooks"][event][0]["hooks"][0]["command"].as_str().unwrap().to_owned());
    }
    // Each command, run through the plugin's wrapper with `--help`, is one the binary knows.
    for c in commands {
        let c = c.replace("${CLAUDE_PLUGIN_ROOT}", root.to_str().unwrap());
        let mut words = c.split_whitespace();
        let program = words.next().unwrap();
        let sub = words.next().unwrap();
        assert!(["mcp", "listen", "hook"].contains(&sub), "{c}");
        let out =
            std::process::Command::new(program).args([sub, "--help"]).env("SWITCHBOARD_BIN", bin()).output().unwrap();
        assert!(out.status.success(), "{c}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
