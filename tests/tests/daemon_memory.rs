//! The resident memory of an idle `switchboard daemon` (one profile, connected to a real
//! relay-lite, nothing to do): issue 16's goal is at most 16 MB.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;
use std::time::Duration;

use switchboard_tests::{DaemonProcess, TestRelay, bridge_of, bridge_rpc, home, switchboard_ok};

/// The goal, in KiB (16 MB, decimal).
const GOAL_KIB: u64 = 16_000_000 / 1024;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

/// `VmRSS` of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_daemon_stays_under_16_mb() {
    let relay = TestRelay::start().await;
    let (_dir, home) = home();
    switchboard_ok(&bin(), &home, &["init", "--name", "alice", "--relay", &relay.url()]);
    let daemon = DaemonProcess::start(&bin(), &home);
    // It is up: the bridge answers and the relay connection is open.
    let (url, _, token) = bridge_of(&home);
    let status = bridge_rpc(&url, &token, &serde_json::json!({"op": "status"})).await;
    println!("status: {status}");
    // Idle: a few seconds with nothing to do, sampled; the last sample is what it settles at.
    let mut samples = Vec::new();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        samples.push(rss_kib(daemon.0.id()));
    }
    daemon.stop();
    let settled = *samples.last().unwrap();
    println!("idle daemon RSS samples (KiB): {samples:?}; goal {GOAL_KIB} KiB");
    assert!(settled <= GOAL_KIB, "idle daemon RSS {settled} KiB is over the {GOAL_KIB} KiB goal");
}
