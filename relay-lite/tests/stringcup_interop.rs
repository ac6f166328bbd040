//! Interoperability with the PUBLISHED Stringcup reference client (PyPI `stringcup` 3.38.0, the
//! library and its MCP server): each test starts relay-lite in-process on a loopback port and
//! runs `tests/interop/stringcup_client.py <base_url> <scenario>`, which drives the real client
//! and exits non-zero with a `FAIL <scenario>: ...` line on any mismatch.
//!
//! The client must be installed in the `python3` first on `PATH` (scripts/install-deps.sh does
//! it); when it is not, these tests fail rather than skip.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod sc_common;

use std::fs::File;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use relay_lite::StringcupLimits;
use sc_common::{Relay, relay_with};

/// Longest a scenario may run before it is killed and the test fails.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/stringcup_client.py")
}

/// Fails (never skips) unless `python3` can import the published client.
fn require_client() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        let probe = Command::new("python3")
            .args(["-c", "import stringcup, importlib.metadata as m; print(m.version('stringcup'))"])
            .output();
        match probe {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().lines().last().unwrap_or_default().to_owned()),
            Err(e) => Err(format!("cannot run python3: {e}")),
        }
    });
    if let Err(why) = checked {
        panic!(
            "the Stringcup reference client is not importable by `python3` ({why}); run scripts/install-deps.sh, \
             which installs stringcup==3.38.0 with pip into the python3 first on PATH"
        );
    }
}

/// Runs `scenario` against `relay`; panics with the script's output unless it exits 0.
async fn scenario(relay: &Relay, scenario: &str) {
    require_client();
    let base_url = format!("{}/api/v2", relay.relay.url());
    let out_dir = tempfile::tempdir().unwrap();
    let (stdout_path, stderr_path) = (out_dir.path().join("stdout"), out_dir.path().join("stderr"));
    let mut child = Command::new("python3")
        .arg(script())
        .arg(&base_url)
        .arg(scenario)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(File::create(&stdout_path).unwrap())
        .stderr(File::create(&stderr_path).unwrap())
        .spawn()
        .expect("run python3");
    // Poll rather than block: the relay answers the script from this same runtime.
    let deadline = Instant::now() + SCENARIO_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let output = format!("--- stdout\n{stdout}\n--- stderr\n{stderr}");
    match status {
        Some(status) if status.success() => {
            assert!(stdout.contains(&format!("ok {scenario}")), "scenario {scenario} printed no ok line:\n{output}");
        }
        Some(status) => panic!("scenario {scenario} failed ({status}):\n{output}"),
        None => panic!("scenario {scenario} did not finish within {SCENARIO_TIMEOUT:?}:\n{output}"),
    }
}

/// The seed's limits, with budgets high enough that the client's own throttle (which pauses
/// when a bucket is nearly spent) never slows a scenario down.
fn roomy(l: &mut StringcupLimits) {
    l.sends_per_hour = 10_000;
    l.inbox_requests_per_hour = 10_000;
    l.other_requests_per_hour = 10_000;
}

#[tokio::test]
async fn reference_client_version_guards_pass_against_the_advertised_info() {
    scenario(&relay_with(roomy).await, "info").await;
}

#[tokio::test]
async fn reference_clients_register_send_long_poll_decrypt_and_ack() {
    scenario(&relay_with(roomy).await, "messaging").await;
}

#[tokio::test]
async fn reference_client_retries_with_one_idempotency_key_store_once() {
    scenario(&relay_with(roomy).await, "idempotency").await;
}

#[tokio::test]
async fn reference_clients_pair_through_a_rendezvous_and_verify_with_header_tags() {
    scenario(&relay_with(roomy).await, "pairing").await;
}

#[tokio::test]
async fn reference_clients_pair_without_a_secret_and_time_out_alone() {
    scenario(&relay_with(roomy).await, "pairing-unverified").await;
}

#[tokio::test]
async fn reference_client_topics_notices_and_broadcast_fan_out() {
    scenario(&relay_with(roomy).await, "topics").await;
}

#[tokio::test]
async fn reference_client_token_info_rotation_and_key_rotation() {
    scenario(&relay_with(roomy).await, "tokens").await;
}

#[tokio::test]
async fn reference_client_sees_413_507_429_and_rate_limit_headers_as_it_expects() {
    let relay = relay_with(|l| {
        l.message_max_bytes = 4096;
        l.inbox_max_pending_per_sender = 5;
        l.sends_per_hour = 10;
    })
    .await;
    scenario(&relay, "limits").await;
}

#[tokio::test]
async fn reference_mcp_servers_pair_message_and_share_a_channel() {
    scenario(&relay_with(roomy).await, "mcp").await;
}
