//! The real app under Xvfb: its window appears (found by X11 window name and checked mapped with
//! xwininfo), the UI paints (the app prints its start-to-first-paint time), a screenshot of the
//! screen is saved under the build output, and the app's idle memory is measured.
//! Needs xvfb-run, xdotool, xwininfo and ImageMagick (scripts/install-deps.sh).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use switchboard_core::engine::{InitOptions, Runtime};
use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::Profile;

const SCRIPT: &str = r#"
set -u
"$APP" --home "$PROFILE" > "$OUT/app.log" 2>&1 &
pid=$!
echo "$pid" > "$OUT/app.pid"
id=""
for _ in $(seq 1 240); do
  id=$(xdotool search --onlyvisible --name '^Switchboard$' 2>/dev/null | head -n 1)
  [ -n "$id" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "app exited" >&2; exit 3; }
  sleep 0.25
done
[ -n "$id" ] || { echo "no window" >&2; kill "$pid"; exit 4; }
for _ in $(seq 1 240); do
  grep -q "first paint" "$OUT/app.log" && break
  sleep 0.25
done
sleep 1
xwininfo -id "$id" > "$OUT/xwininfo.txt"
import -window root "$OUT/app.png"
sleep 5
ps -e -o pid=,ppid=,rss= > "$OUT/ps.txt"
kill "$pid"
wait "$pid"
exit 0
"#;

fn out_dir() -> PathBuf {
    // <target>/debug/deps/window-* -> <target>/screenshots
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().join("screenshots")
}

/// RSS in KiB of `root` and all its descendants, from `ps -e -o pid=,ppid=,rss=`.
fn tree_rss(ps: &str, root: u32) -> u64 {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut rss = BTreeMap::new();
    for line in ps.lines() {
        let f: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if f.len() == 3 {
            children.entry(f[1] as u32).or_default().push(f[0] as u32);
            rss.insert(f[0] as u32, f[2]);
        }
    }
    let mut total = 0;
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        total += rss.get(&p).copied().unwrap_or(0);
        stack.extend(children.get(&p).cloned().unwrap_or_default());
    }
    total
}

#[test]
fn the_app_window_appears_under_xvfb_and_is_screenshotted() {
    for tool in ["xvfb-run", "xdotool", "xwininfo", "import"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).status().unwrap().success();
        assert!(found, "{tool} is missing: run scripts/install-deps.sh");
    }
    let home = tempfile::tempdir().unwrap();
    let profile = Profile { dir: home.path().join("profile") };
    // An initialised profile, so the window shows the app rather than the first-run screen.
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let opts = InitOptions {
            name: "alice".into(),
            relay: "http://127.0.0.1:9".into(),
            relay_cert_sha256: None,
            keystore: KeystorePreference::File,
        };
        Runtime::init(&profile, opts).await.unwrap().shutdown();
    });
    drop(rt);

    let out = out_dir();
    std::fs::create_dir_all(&out).unwrap();
    let _ = std::fs::remove_file(out.join("app.png"));
    let status = Command::new("xvfb-run")
        .args(["-a", "-s", "-screen 0 1280x800x24", "bash", "-c", SCRIPT])
        .env("APP", env!("CARGO_BIN_EXE_switchboard-app"))
        .env("PROFILE", &profile.dir)
        .env("OUT", &out)
        .env("SWITCHBOARD_KEYSTORE", "file")
        .status()
        .unwrap();
    let log = std::fs::read_to_string(out.join("app.log")).unwrap_or_default();
    assert!(status.success(), "the app did not show its window ({status}); its log:\n{log}");

    let info = std::fs::read_to_string(out.join("xwininfo.txt")).unwrap();
    assert!(info.contains("Map State: IsViewable"), "{info}");
    let width: u32 = info.lines().find_map(|l| l.trim().strip_prefix("Width: ")).unwrap().parse().unwrap();
    assert!(width >= 480, "{info}");

    let paint = log.lines().find(|l| l.contains("first paint")).expect("the UI never reported its first paint");
    let shot = out.join("app.png");
    assert!(shot.is_file());
    let colors = Command::new("identify").args(["-format", "%k"]).arg(&shot).output().unwrap();
    let colors: u32 = String::from_utf8_lossy(&colors.stdout).trim().parse().unwrap();
    assert!(colors > 50, "the screenshot looks blank ({colors} colours)");

    let pid: u32 = std::fs::read_to_string(out.join("app.pid")).unwrap().trim().parse().unwrap();
    let rss = tree_rss(&std::fs::read_to_string(out.join("ps.txt")).unwrap(), pid);
    println!("{paint}; idle RSS (app and its WebKit processes) {} MiB; screenshot {}", rss / 1024, shot.display());
    let figures = format!("{paint}\nidle_rss_kib {rss}\n");
    std::fs::write(out.join("app-figures.txt"), figures).unwrap();
    assert!(rss > 0);
}
