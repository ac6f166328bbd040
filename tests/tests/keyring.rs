//! Secret keys in the OS keyring (Secret Service here), and the explicit file fallback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;

use serde_json::Value;
use switchboard_tests::{TestRelay, home};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

fn run(home: &std::path::Path, envs: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("--home").arg(home).args(args).env_remove("SWITCHBOARD_KEYSTORE");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs only where a Secret Service is provided (scripts/test.sh starts gnome-keyring and sets
/// SWITCHBOARD_TEST_KEYRING=1); CI always does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_live_in_the_secret_service_and_survive_reopening() {
    if std::env::var("SWITCHBOARD_TEST_KEYRING").as_deref() != Ok("1") {
        eprintln!("SKIPPED: no Secret Service in this environment (run scripts/test.sh)");
        return;
    }
    let relay = TestRelay::start().await;
    let (_h, home) = home();
    let (ok, out, err) =
        run(&home, &[], &["init", "--name", "kim", "--relay", &relay.url(), "--keystore", "os-keyring", "--json"]);
    assert!(ok, "{err}");
    let who: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(who["keystore"], "os-keyring");
    assert!(!home.join("keys.secret").exists(), "no key file when the keyring holds the keys");
    // The secret is really in the Secret Service, under this profile's account.
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=ro", home.join("switchboard.db").display()))
        .await
        .unwrap();
    let account: String =
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'account'").fetch_one(&pool).await.unwrap();
    pool.close().await;
    let found = std::process::Command::new("secret-tool")
        .args(["lookup", "service", "switchboard", "username", &account])
        .output()
        .unwrap();
    assert!(found.status.success(), "secret-tool found nothing: {}", String::from_utf8_lossy(&found.stderr));
    let secret = found.stdout;
    assert_eq!(secret.len(), 64, "sig seed and box secret");
    // A later process reads the same keys back.
    let (ok, out, err) = run(&home, &[], &["whoami", "--json"]);
    assert!(ok, "{err}");
    let again: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(again["letagents"]["address"], who["letagents"]["address"]);
    // And no secret key bytes sit anywhere in the profile directory.
    for entry in std::fs::read_dir(&home).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap_or_default();
        for half in [&secret[..32], &secret[32..]] {
            assert!(!bytes.windows(32).any(|w| w == half), "secret key bytes found in {}", path.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_keyring_reachable_the_file_store_is_used_and_said() {
    let relay = TestRelay::start().await;
    let (_h, home) = home();
    let no_bus = [("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/bus")];
    let (ok, out, err) = run(&home, &no_bus, &["init", "--name", "lee", "--relay", &relay.url(), "--json"]);
    assert!(ok, "{err}");
    let who: Value = serde_json::from_str(&out).unwrap();
    let ks = who["keystore"].as_str().unwrap();
    assert!(ks.starts_with("file ") && ks.contains("no OS keyring reachable"), "{ks}");
    assert!(home.join("keys.secret").exists());
    // A profile made on the file store keeps using it, keyring or not.
    let (ok, out, _) = run(&home, &[], &["whoami", "--json"]);
    assert!(ok);
    let again: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(again["letagents"]["address"], who["letagents"]["address"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_for_the_keyring_where_there_is_none_fails_loudly() {
    let relay = TestRelay::start().await;
    let (_h, home) = home();
    let no_bus = [("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/bus")];
    let (ok, _, err) =
        run(&home, &no_bus, &["init", "--name", "lee", "--relay", &relay.url(), "--keystore", "os-keyring"]);
    assert!(!ok);
    assert!(err.contains("keyring"), "{err}");
}
