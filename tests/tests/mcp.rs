//! `switchboard mcp` driven by a real MCP client (the `mcp` package from PyPI, installed by
//! scripts/install-deps.sh): two agents on two profiles exchange messages through relay-lite.
//! Afterwards, nothing secret is left in the databases, the logs or temporary files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use switchboard_tests::{DaemonProcess, TestRelay, befriend_cli, bridge_of, home, open_session};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

fn python() -> String {
    std::env::var("SWITCHBOARD_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Fails (never skips) when the MCP client is missing.
fn require_mcp_client() {
    let out = Command::new(python())
        .args(["-c", "import mcp, importlib.metadata as m; print(m.version('mcp'))"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; run scripts/install-deps.sh", python()));
    assert!(
        out.status.success(),
        "the `mcp` Python package is missing ({}); run scripts/install-deps.sh (pip install mcp==2.3.0)",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Every file under `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// The ways a secret could be written down.
fn encodings(secret: &[u8]) -> Vec<Vec<u8>> {
    use data_encoding::{BASE64, BASE64_NOPAD, BASE64URL_NOPAD, HEXLOWER, HEXUPPER};
    let mut v = vec![secret.to_vec()];
    for e in [&BASE64, &BASE64_NOPAD, &BASE64URL_NOPAD, &HEXLOWER, &HEXUPPER] {
        v.push(e.encode(secret).into_bytes());
    }
    v
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    needle.len() <= hay.len() && hay.windows(needle.len()).any(|w| w == needle)
}

/// The profile's secrets as the keystore holds them: every `*.secret` slot file (device keys, each
/// Stringcup identity's key and token, the Agent Mail and LAN keys, any slot added later). A slot
/// of raw bytes gives them whole and as 32-byte keys; a JSON slot gives its secret fields, and a
/// field this test does not know fails it, so a new slot format is classified here, not skipped.
fn profile_secrets(home: &Path) -> Vec<(String, Vec<u8>)> {
    let b64u = |s: &str| data_encoding::BASE64URL_NOPAD.decode(s.trim().as_bytes()).ok();
    let mut out = Vec::new();
    let mut secret = |what: String, text: &str| {
        if let Some(bytes) = b64u(text).filter(|b| b.len() >= 16) {
            out.push((what.clone(), bytes));
        }
        out.push((what, text.as_bytes().to_vec()));
    };
    let mut slots = Vec::new();
    for entry in std::fs::read_dir(home).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".secret")) else {
            continue;
        };
        slots.push(name.to_owned());
        let raw = b64u(&std::fs::read_to_string(&path).unwrap()).expect("a keystore file is base64url");
        let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(&raw) else {
            for (i, key) in raw.chunks(32).enumerate() {
                secret(format!("{name} key {i}"), &data_encoding::BASE64URL_NOPAD.encode(key));
            }
            continue;
        };
        for (field, value) in fields {
            let what = format!("{name} {field}");
            match (field.as_str(), value) {
                // Public: the identity's id, the mailbox id, a card key's public half.
                ("id" | "mailbox", _) | (_, Value::Null) => {}
                ("secret" | "token" | "seed" | "pending", Value::String(text)) => secret(what, &text),
                ("previous", Value::Array(items)) => {
                    items.iter().filter_map(Value::as_str).for_each(|text| secret(what.clone(), text));
                }
                ("keys", Value::Object(keys)) => {
                    keys.values().filter_map(Value::as_str).for_each(|text| secret(what.clone(), text));
                }
                (_, value) => panic!("{what} = {value}: is it secret? classify it in profile_secrets"),
            }
        }
    }
    assert!(slots.iter().any(|s| s == "keys") && slots.iter().any(|s| s.starts_with("stringcup")), "{slots:?}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_talk_through_switchboard_mcp_and_leave_no_secret_behind() {
    require_mcp_client();
    let relay = TestRelay::start().await;
    let (_a, alice) = home();
    let (_b, bob) = home();
    let tmp = tempfile::tempdir().unwrap();
    befriend_cli(&bin(), &alice, &bob, &relay.url());

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/two_agents.py");
    let out = Command::new(python())
        .arg(&script)
        .arg(bin())
        .arg(&alice)
        .arg(&bob)
        .env("TMPDIR", tmp.path())
        .env("SWITCHBOARD_LOG", "debug")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        let errors: Vec<&str> = stderr.lines().filter(|l| !l.contains(" DEBUG ") && !l.contains(" TRACE ")).collect();
        panic!("the MCP client failed:\n{}\n{stdout}", errors.join("\n"));
    }
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["ok"], true);
    assert!(summary["fenced"].as_str().unwrap().contains("From: letagents contact alice, agent planner"));
    // The MCP processes owned their runtimes and cleaned up when the client left.
    assert!(!alice.join("bridge.token").exists() && !bob.join("bridge.token").exists());
    // The MCP server acked what its `wait` and `read` tools returned: nothing is left handed out.
    for (home, agent) in [(&alice, "planner"), (&bob, "coder")] {
        let db = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=ro", home.join("switchboard.db").display()))
            .await
            .unwrap();
        let states: Vec<String> = sqlx::query_scalar(
            "SELECT state FROM agent_deliveries WHERE agent = ? AND mode != 'none' ORDER BY message",
        )
        .bind(agent)
        .fetch_all(&db)
        .await
        .unwrap();
        let expected = if agent == "coder" { 2 } else { 1 };
        assert_eq!(states, vec!["delivered"; expected], "{agent}");
        db.close().await;
    }

    // One more round over the bridge with a daemon, to have an owner token and an agent token to
    // look for.
    let daemon = DaemonProcess::start(&bin(), &alice);
    let (url, _, owner) = bridge_of(&alice);
    let http = reqwest::Client::new();
    let agent_token = open_session(&http, &url, &owner, "scanner").await;
    let sent = http
        .post(&url)
        .bearer_auth(&agent_token)
        .json(&json!({"op": "send", "contact": "bob", "text": "scan me"}))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    daemon.stop();

    // The scan: databases (with WAL files), everything else in the profiles, the relay's data,
    // temporary files, and the logs (the MCP servers ran with SWITCHBOARD_LOG=debug).
    let mut secrets = Vec::new();
    for (who, home) in [("alice", &alice), ("bob", &bob)] {
        for (what, s) in profile_secrets(home) {
            secrets.push((format!("{who}'s {what}"), s));
        }
    }
    secrets.push(("alice's owner bridge token".into(), owner.as_bytes().to_vec()));
    secrets.push(("an agent session token".into(), agent_token.as_bytes().to_vec()));
    let mut scanned = Vec::new();
    for dir in [alice.as_path(), bob.as_path(), relay.dir.path(), tmp.path()] {
        files(dir, &mut scanned);
    }
    // The keystore files hold the keys by design (the explicit 0600 file store).
    scanned.retain(|p| p.extension().is_none_or(|e| e != "secret"));
    assert!(scanned.iter().any(|p| p.ends_with("switchboard.db")), "{scanned:?}");
    let mut blobs: Vec<(String, Vec<u8>)> =
        scanned.iter().map(|p| (p.display().to_string(), std::fs::read(p).unwrap_or_default())).collect();
    blobs.push(("MCP and client logs".into(), format!("{stderr}\n{stdout}").into_bytes()));
    // A control: the scan does see what the runtime stored.
    assert!(blobs.iter().any(|(_, d)| find(d, b"scan me")), "the scan reads the databases");
    for (what, secret) in &secrets {
        for enc in encodings(secret) {
            for (name, data) in &blobs {
                assert!(!find(data, &enc), "{what} found in {name}");
            }
        }
    }
}
