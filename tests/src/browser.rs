//! The UI in headless Chromium: `switchboard ui` serves the built ui/dist and runs a profile's
//! runtime; a playwright-core script under ui/e2e drives the page and asks the test, line by
//! line on its stdin/stdout (`REQ {json}` / `RES {json}`), to act as the other parties. Nothing
//! is built here: scripts/install-deps.sh installs chromium, runs `npm ci` and builds ui/dist; a
//! missing piece fails the test.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// The repository's ui/ directory.
pub fn ui_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui")
}

fn require(path: &Path, what: &str) {
    assert!(path.exists(), "{} is missing ({what}): run scripts/install-deps.sh", path.display());
}

/// Checks that the UI build, playwright-core and Chromium are there; returns Chromium's path
/// (`$CHROMIUM`, else Debian's).
pub fn require_browser() -> String {
    let ui = ui_dir();
    require(&ui.join("dist/index.html"), "the UI build");
    require(&ui.join("node_modules/playwright-core"), "npm ci in ui/");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    require(Path::new(&chromium), "Debian's chromium");
    chromium
}

/// `switchboard --home HOME ui --ui ui/dist` (killed on drop) and the sign-in URL it prints.
pub async fn serve_ui(bin: &Path, home: &Path) -> (Child, String) {
    serve_ui_with(bin, home, &[]).await
}

/// [`serve_ui`] with more environment for the runtime.
pub async fn serve_ui_with(bin: &Path, home: &Path, env: &[(&str, &str)]) -> (Child, String) {
    let mut child = Command::new(bin)
        .arg("--home")
        .arg(home)
        .arg("ui")
        .arg("--ui")
        .arg(ui_dir().join("dist"))
        .env("SWITCHBOARD_KEYSTORE", "file")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), out.next_line()).await.unwrap().unwrap().unwrap();
    assert!(url.starts_with("http://127.0.0.1:") && url.contains("/#code="), "{url}");
    (child, url)
}

/// The test's side of a browser scenario: answers the script's requests.
pub trait Driver {
    /// One request from the script; `Err` is passed back to it as `{"error": ...}`.
    fn handle(&mut self, req: &Value) -> impl Future<Output = Result<Value, String>>;
}

/// Runs `ui/e2e/SCRIPT` in Chromium against `url` with `env`, answering its requests with
/// `driver`, and fails unless it prints `E2E OK` and exits cleanly within `limit`. Screenshots go
/// to `<target>/screenshots/SHOTS`, which is returned.
pub async fn run_scenario(
    script: &str,
    url: &str,
    env: &[(&str, String)],
    shots: &str,
    limit: Duration,
    driver: &mut impl Driver,
) -> PathBuf {
    let chromium = require_browser();
    let ui = ui_dir();
    // Under the build output: <target>/debug/deps/<test>-* -> <target>/screenshots/SHOTS.
    let exe = std::env::current_exe().unwrap();
    let shots = exe.ancestors().nth(3).unwrap().join("screenshots").join(shots);
    let mut node = Command::new("node");
    node.arg(ui.join("e2e").join(script))
        .current_dir(&ui)
        .env("UI_URL", url)
        .env("CHROMIUM", &chromium)
        .env("SHOT_DIR", &shots)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        node.env(k, v);
    }
    let mut node = node.spawn().unwrap();
    let mut to_node = node.stdin.take().unwrap();
    let mut from_node = BufReader::new(node.stdout.take().unwrap()).lines();
    // The script's stderr is passed through, and its last step and its error kept for the panic
    // message: a CI log shows the end of a failing test's output, which a stack trace fills.
    let mut errors = BufReader::new(node.stderr.take().unwrap()).lines();
    let stderr = tokio::spawn(async move {
        let (mut last_step, mut failure) = (String::new(), String::new());
        while let Ok(Some(line)) = errors.next_line().await {
            // Straight to fd 2, as an inherited stderr was: not held back by the test harness.
            let _ = writeln!(std::io::stderr(), "{line}");
            if let Some(s) = line.strip_prefix("e2e: ") {
                last_step = s.to_owned();
            } else if let Some(f) = line.strip_prefix("e2e failed: ") {
                failure = f.to_owned();
            }
        }
        (last_step, failure)
    });
    let mut passed = false;
    let run = async {
        while let Some(line) = from_node.next_line().await.unwrap() {
            if let Some(req) = line.strip_prefix("REQ ") {
                let req: Value = serde_json::from_str(req).unwrap();
                let res = match driver.handle(&req).await {
                    Ok(v) => json!({"ok": v}),
                    Err(e) => json!({"error": e}),
                };
                to_node.write_all(format!("RES {res}\n").as_bytes()).await.unwrap();
                to_node.flush().await.unwrap();
            } else if line == "E2E OK" {
                passed = true;
            } else {
                eprintln!("node: {line}");
            }
        }
    };
    tokio::time::timeout(limit, run).await.expect("the browser scenario timed out");
    let status = node.wait().await.unwrap();
    // Bounded: a process the script started could still hold its stderr open.
    let (last_step, failure) =
        tokio::time::timeout(Duration::from_secs(10), stderr).await.ok().and_then(Result::ok).unwrap_or_default();
    assert!(
        status.success() && passed,
        "the browser scenario failed ({status}) in step \"{last_step}\": {failure}; screenshots in {}",
        shots.display()
    );
    shots
}
