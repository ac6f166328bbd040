//! Shared by the app's tests: a private X display (Xvfb) with its own D-Bus session, launching a
//! window process in it and measuring it the same way for the app and for the bare-window baseline
//! (spawn to first paint, idle RSS of the process tree), screenshots; an initialised profile,
//! polling, and command invocation on Tauri's mock runtime.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Panics naming the missing tool unless every one is on PATH.
pub fn require_tools(tools: &[&str]) {
    for tool in tools {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(found, "{tool} is missing: run scripts/install-deps.sh");
    }
}

/// `<target>/screenshots/<sub>` (created), from this test binary's path `<target>/debug/deps/x`.
pub fn out_dir(sub: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.ancestors().nth(3).unwrap().join("screenshots").join(sub);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `<target>/debug/examples/NAME` (built by `cargo build --workspace --examples`, and by a plain
/// `cargo test --workspace`, which scripts/test.sh runs after `cargo build --all-targets`).
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.ancestors().nth(2).unwrap().join("examples").join(name);
    assert!(bin.is_file(), "{} is missing: run `cargo build --workspace --examples` first", bin.display());
    // A narrow `cargo test --test X` does not rebuild examples: refuse to measure a stale one.
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    for source in [dir.join("examples").join(format!("{name}.rs")), dir.join("tauri.conf.json")] {
        assert!(
            modified(&bin) >= modified(&source),
            "{} is older than {}: run `cargo build --workspace --examples` first",
            bin.display(),
            source.display()
        );
    }
    bin
}

/// An Xvfb display with a D-Bus session of its own (so the app's single-instance name and
/// anything else on the bus are private to the test), alive until dropped.
pub struct Display {
    child: Child,
    stdin: Option<ChildStdin>,
    /// DISPLAY, XAUTHORITY and DBUS_SESSION_BUS_ADDRESS inside it.
    pub env: Vec<(String, String)>,
}

impl Display {
    /// Starts `xvfb-run -a` (1280x800x24) with `dbus-run-session` inside; it ends when dropped.
    /// Starts are one at a time: `-a` takes the first display number without a lock file, so two
    /// tests starting at once could pick the same number, one Xvfb then failing while its app
    /// draws on the other test's display and dies with it ("Failed to initialize GTK", seen in
    /// CI). The lock file exists once `xvfb-run` runs its command, which is when this returns.
    ///
    /// The server runs with `-noreset`: by default an X server resets whenever its last client
    /// disconnects, and a client connecting during the reset is refused. A test polling with
    /// `xdotool` while its app starts is such a client: the poll connected first, disconnected,
    /// and the app's GTK failed to open the display ("Failed to initialize GTK", CI, 12-06).
    /// Measured here: `xdotool` connecting in a loop while another client connects 300 times,
    /// 12 of those 300 connections failed without `-noreset`, none with it.
    pub fn start() -> Self {
        static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = STARTING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let script = r#"printf 'DISPLAY=%s\nXAUTHORITY=%s\nDBUS_SESSION_BUS_ADDRESS=%s\n\n' \
            "$DISPLAY" "${XAUTHORITY:-}" "$DBUS_SESSION_BUS_ADDRESS"; cat >/dev/null"#;
        let mut child = Command::new("xvfb-run")
            .args(["-a", "-s", "-screen 0 1280x800x24 -noreset", "dbus-run-session", "--", "bash", "-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut env = Vec::new();
        loop {
            let mut line = String::new();
            let n = out.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if n == 0 || line.is_empty() {
                break;
            }
            let (k, v) = line.split_once('=').unwrap();
            env.push((k.to_owned(), v.to_owned()));
        }
        assert!(
            env.iter().any(|(k, v)| k == "DISPLAY" && !v.is_empty()),
            "xvfb-run with dbus-run-session did not start: {env:?}"
        );
        let stdin = child.stdin.take();
        Self { child, stdin, env }
    }

    /// A command that runs on this display and bus.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd
    }

    /// A screenshot of the whole screen.
    pub fn screenshot(&self, path: &Path) {
        let _ = std::fs::remove_file(path);
        let ok = self.command("import").args(["-window", "root"]).arg(path).status().unwrap().success();
        assert!(ok && path.is_file(), "import could not take {}", path.display());
    }

    /// The ids of visible windows named exactly `name`.
    pub fn visible_windows(&self, name: &str) -> Vec<String> {
        let out = self.command("xdotool").args(["search", "--onlyvisible", "--name"]).arg(format!("^{name}$")).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect()).unwrap_or_default()
    }
}

/// Gives `child` up to `grace` to exit on its own (after whatever asked it to), then kills it;
/// reaps it either way.
fn exit_or_kill(child: &mut Child, grace: Duration) {
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Display {
    fn drop(&mut self) {
        drop(self.stdin.take()); // the script's `cat` sees EOF; xvfb-run then stops Xvfb
        exit_or_kill(&mut self.child, Duration::from_secs(10));
    }
}

/// The number of distinct colours in a PNG (ImageMagick), to tell a painted screen from a blank one.
pub fn colours(png: &Path) -> u32 {
    let out = Command::new("identify").args(["-format", "%k"]).arg(png).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
}

/// `ps -e -o pid=,ppid=,rss=` now.
pub fn ps_snapshot() -> String {
    let out = Command::new("ps").args(["-e", "-o", "pid=,ppid=,rss="]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `root` and all its descendants in a `ps -e -o pid=,ppid=,rss=` snapshot, with their RSS (KiB).
pub fn tree(ps: &str, root: u32) -> Vec<(u32, u64)> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut rss = BTreeMap::new();
    for line in ps.lines() {
        let f: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if f.len() == 3 {
            children.entry(f[1] as u32).or_default().push(f[0] as u32);
            rss.insert(f[0] as u32, f[2]);
        }
    }
    let mut found = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        if let Some(r) = rss.get(&p) {
            found.push((p, *r));
        }
        stack.extend(children.get(&p).cloned().unwrap_or_default());
    }
    found
}

/// RSS in KiB of `root` and all its descendants (a sum: shared pages count once per process).
pub fn tree_rss(ps: &str, root: u32) -> u64 {
    tree(ps, root).iter().map(|(_, r)| r).sum()
}

/// Proportional set size in KiB of process `pid` (`/proc/PID/smaps_rollup`): shared pages split
/// between the processes that map them, so a sum over processes counts each page once.
pub fn pss_kib(pid: u32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Whether process `pid` exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

/// A window process launched by [`launch`]: its stdout lines as they arrive, stamped.
pub struct Launched {
    /// The process.
    pub child: Child,
    /// When it was spawned.
    pub spawned: Instant,
    lines: mpsc::Receiver<(Instant, String)>,
    /// Everything it wrote so far (stdout and stderr), for failure messages.
    pub log: Arc<Mutex<String>>,
}

/// Spawns `cmd` with its output captured (stdout lines stamped on arrival).
pub fn launch(mut cmd: Command) -> Launched {
    let spawned = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null()).spawn().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let out_log = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let at = Instant::now();
            out_log.lock().unwrap().push_str(&format!("{line}\n"));
            let _ = tx.send((at, line));
        }
    });
    let stderr = child.stderr.take().unwrap();
    let err_log = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            err_log.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
    Launched { child, spawned, lines, log }
}

impl Launched {
    /// Waits up to `secs` for a stdout line containing `needle`; returns it with its arrival time.
    pub fn wait_line(&mut self, needle: &str, secs: u64) -> (Instant, String) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok((at, line)) if line.contains(needle) => return (at, line),
                Ok(_) => {}
                Err(_) => {
                    if let Ok(Some(status)) = self.child.try_wait() {
                        panic!("the process exited ({status}) before printing {needle:?}:\n{}", self.log());
                    }
                    assert!(Instant::now() < deadline, "no {needle:?} within {secs} s:\n{}", self.log());
                }
            }
        }
    }

    /// Its output so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGTERM (a clean shutdown), then SIGKILL after 10 s; waits for it.
    pub fn stop(mut self) -> String {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        exit_or_kill(&mut self.child, Duration::from_secs(10));
        self.log()
    }
}

impl Drop for Launched {
    /// A test that fails half-way leaves nothing running: SIGTERM (tauri-driver then stops its
    /// WebKitWebDriver), SIGKILL if that was not enough.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill").arg(self.child.id().to_string()).status();
            exit_or_kill(&mut self.child, Duration::from_secs(5));
        }
    }
}

/// What one launch of a window process measured.
#[derive(Debug, Clone)]
pub struct Figures {
    /// From spawn to the "first paint" line reaching us.
    pub spawn_to_paint_ms: u128,
    /// The line itself (the process's own figure, measured from its `main`).
    pub paint_line: String,
    /// RSS of the process and its descendants (the WebKit processes) after `idle` seconds.
    pub idle_rss_kib: u64,
    /// Of which the process itself.
    pub own_rss_kib: u64,
    /// PSS of the process tree at the same moment (shared pages counted once).
    pub idle_pss_kib: u64,
    /// How many processes the tree had.
    pub processes: usize,
    /// `xwininfo` of its window.
    pub xwininfo: String,
}

/// Launches `cmd` on `display`, waits for its window (named `title`, visible) and its first-paint
/// line, screenshots the screen to `shot`, waits `idle` seconds and measures the process tree's
/// RSS, then stops it. The app and the baseline go through exactly this.
pub fn measure(display: &Display, cmd: Command, title: &str, shot: &Path, idle: Duration) -> Figures {
    let mut run = launch(cmd);
    let (at, paint_line) = run.wait_line("first paint", 60);
    let spawn_to_paint_ms = at.duration_since(run.spawned).as_millis();
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        if let Some(id) = display.visible_windows(title).into_iter().next() {
            break id;
        }
        assert!(Instant::now() < deadline, "no visible window named {title}:\n{}", run.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(1));
    let xwininfo = display.command("xwininfo").args(["-id", &id]).output().unwrap();
    let xwininfo = String::from_utf8_lossy(&xwininfo.stdout).into_owned();
    display.screenshot(shot);
    std::thread::sleep(idle);
    let ps = ps_snapshot();
    let pid = run.child.id();
    let procs = tree(&ps, pid);
    let own_rss_kib = procs.iter().find(|(p, _)| *p == pid).map(|(_, r)| *r).unwrap_or(0);
    let idle_rss_kib = procs.iter().map(|(_, r)| r).sum();
    let idle_pss_kib = procs.iter().map(|(p, _)| pss_kib(*p)).sum();
    let processes = procs.len();
    let children: Vec<u32> = procs.iter().map(|(p, _)| *p).filter(|p| *p != pid).collect();
    run.stop();
    // Its WebKit processes go with it; wait so the next launch starts on a quiet machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    while children.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    Figures { spawn_to_paint_ms, paint_line, idle_rss_kib, own_rss_kib, idle_pss_kib, processes, xwininfo }
}

/// The median of `xs` (the lower middle for an even count).
pub fn median(mut xs: Vec<u128>) -> u128 {
    xs.sort_unstable();
    xs.get(xs.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

/// Writes `text` to `path`, creating parents.
pub fn write(path: &Path, text: &str) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// Polls `f` every 100 ms for up to `secs`; whether it came true.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// A profile at `home/profile` initialised as "alice" against a relay nothing listens on (init
/// and the window need no relay), keys in the file keystore.
pub fn initialised_profile(home: &Path) -> switchboard_core::profile::Profile {
    use switchboard_core::engine::{InitOptions, Runtime};
    let profile = switchboard_core::profile::Profile { dir: home.join("profile") };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let opts = InitOptions {
            name: "alice".into(),
            relay: "http://127.0.0.1:9".into(),
            relay_cert_sha256: None,
            keystore: switchboard_core::identity::keystore::KeystorePreference::File,
        };
        Runtime::init(&profile, opts).await.unwrap().shutdown();
    });
    profile
}

/// Invokes app command `cmd` with `args` through Tauri's IPC on the mock runtime, from the app's
/// own origin on Linux (pages from elsewhere get no commands).
pub fn invoke(
    w: &tauri::WebviewWindow<tauri::test::MockRuntime>,
    cmd: &str,
    args: serde_json::Value,
) -> Result<serde_json::Value, serde_json::Value> {
    use tauri::ipc::{CallbackFn, InvokeBody};
    use tauri::webview::InvokeRequest;
    tauri::test::get_ipc_response(
        w,
        InvokeRequest {
            cmd: cmd.into(),
            callback: CallbackFn(0),
            error: CallbackFn(1),
            url: "tauri://localhost".parse().unwrap(),
            body: InvokeBody::Json(args),
            headers: Default::default(),
            invoke_key: tauri::test::INVOKE_KEY.to_string(),
        },
    )
    .map(|b| b.deserialize::<serde_json::Value>().unwrap())
}

/// Sends WM_DELETE_WINDOW to X window `id`: what a window manager does when its close button is
/// clicked (Xvfb has no window manager, and xdotool's windowclose destroys the window instead).
const WM_DELETE: &str = r#"
import ctypes, sys
x = ctypes.cdll.LoadLibrary("libX11.so.6")
x.XOpenDisplay.restype = ctypes.c_void_p
x.XOpenDisplay.argtypes = [ctypes.c_char_p]
x.XInternAtom.restype = ctypes.c_ulong
x.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
class ClientMessage(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("serial", ctypes.c_ulong), ("send_event", ctypes.c_int),
                ("display", ctypes.c_void_p), ("window", ctypes.c_ulong), ("message_type", ctypes.c_ulong),
                ("format", ctypes.c_int), ("data", ctypes.c_long * 5)]
class Event(ctypes.Union):
    _fields_ = [("xclient", ClientMessage), ("pad", ctypes.c_long * 24)]
x.XSendEvent.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_long, ctypes.POINTER(Event)]
x.XFlush.argtypes = [ctypes.c_void_p]
x.XCloseDisplay.argtypes = [ctypes.c_void_p]
d = x.XOpenDisplay(None)
if not d:
    sys.exit("cannot open the display")
win = int(sys.argv[1])
ev = Event()
ev.xclient.type = 33  # ClientMessage
ev.xclient.window = win
ev.xclient.message_type = x.XInternAtom(d, b"WM_PROTOCOLS", 0)
ev.xclient.format = 32
ev.xclient.data[0] = x.XInternAtom(d, b"WM_DELETE_WINDOW", 0)
ev.xclient.data[1] = 0  # CurrentTime
if not x.XSendEvent(d, win, 0, 0, ctypes.byref(ev)):
    sys.exit("XSendEvent failed")
x.XFlush(d)
x.XCloseDisplay(d)
"#;

/// Sends WM_DELETE_WINDOW to X window `id` on `display` (a click on its close button).
pub fn close_window(display: &Display, id: &str) {
    let closed = display.command("python3").args(["-c", WM_DELETE, id]).status().unwrap();
    assert!(closed.success(), "could not send WM_DELETE_WINDOW");
}

/// Whether an XEmbed system tray owns `_NET_SYSTEM_TRAY_S0` on the display (python3 + Xlib).
const TRAY_OWNED: &str = r#"
import ctypes, sys
x = ctypes.cdll.LoadLibrary("libX11.so.6")
x.XOpenDisplay.restype = ctypes.c_void_p
x.XOpenDisplay.argtypes = [ctypes.c_char_p]
x.XInternAtom.restype = ctypes.c_ulong
x.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
x.XGetSelectionOwner.restype = ctypes.c_ulong
x.XGetSelectionOwner.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
d = x.XOpenDisplay(None)
if not d:
    sys.exit(2)
sys.exit(0 if x.XGetSelectionOwner(d, x.XInternAtom(d, b"_NET_SYSTEM_TRAY_S0", 0)) else 1)
"#;

/// A real system tray on the display: `trayer` (an XEmbed tray, the freedesktop System Tray
/// protocol), which libappindicator shows its icon in when no StatusNotifier host exists. Stopped
/// when dropped.
pub struct TrayHost(Child);

impl TrayHost {
    /// Starts trayer and waits until it owns the tray selection.
    pub fn start(display: &Display) -> Self {
        require_tools(&["trayer", "python3"]);
        let child = display
            .command("trayer")
            .args(["--edge", "top", "--align", "right", "--widthtype", "request", "--height", "24"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let host = Self(child);
        assert!(
            eventually(20, || display.command("python3").args(["-c", TRAY_OWNED]).status().is_ok_and(|s| s.success())),
            "trayer never took the system tray selection"
        );
        host
    }
}

impl Drop for TrayHost {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
