//! Test harness: a real relay-lite on a loopback port, and profiles that talk through it, either
//! as in-process runtimes (the library) or as `switchboard` processes (the CLI).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use relay_lite::{Config, Limits, RunningRelay};
use serde_json::Value;
use switchboard_core::api::Request;
use switchboard_core::engine::{InitOptions, Runtime};
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::{Profile, ProfileLock};
use switchboard_core::protocol::letagents::{self, Inner, Kind, PeerKeys};
use switchboard_core::transport::letagents::{RelayClient, SendOutcome};
use switchboard_core::util::{OsRng, b64u_decode, now_ms};
use tempfile::TempDir;

pub mod browser;
pub mod model;
pub mod netns;

/// A relay-lite serving on loopback, restartable on the same port and data.
pub struct TestRelay {
    relay: Option<RunningRelay>,
    tls: relay_lite::TlsMode,
    /// SHA-256 of the relay's certificate when it serves TLS.
    pub cert_sha256: Option<String>,
    /// Its data directory.
    pub dir: TempDir,
    /// Its address.
    pub addr: SocketAddr,
    limits: Limits,
}

impl TestRelay {
    /// Starts a relay with the seed's limits.
    pub async fn start() -> Self {
        Self::start_with(Limits::default()).await
    }

    /// Starts a relay with `limits`.
    pub async fn start_with(limits: Limits) -> Self {
        Self::start_full(limits, relay_lite::TlsMode::Plain).await
    }

    /// Starts a relay serving a self-signed certificate (peers pin it).
    pub async fn start_tls() -> Self {
        Self::start_full(Limits::default(), relay_lite::TlsMode::SelfSigned).await
    }

    async fn start_full(limits: Limits, tls: relay_lite::TlsMode) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir.path());
        config.limits = limits.clone();
        config.tls = tls.clone();
        let relay = relay_lite::spawn(config).await.unwrap();
        let addr = relay.addr;
        let cert_sha256 = relay.cert_sha256.map(|c| switchboard_core::util::hex(&c));
        Self { relay: Some(relay), tls, cert_sha256, dir, addr, limits }
    }

    /// Base URL.
    pub fn url(&self) -> String {
        let scheme = if self.cert_sha256.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Stops it (the port refuses connections until `restart`).
    pub async fn stop(&mut self) {
        if let Some(r) = self.relay.take() {
            r.shutdown().await.unwrap();
        }
    }

    /// Starts it again on the same port and data.
    pub async fn restart(&mut self) {
        self.stop().await;
        let mut config = Config::new(self.addr, self.dir.path());
        config.limits = self.limits.clone();
        config.tls = self.tls.clone();
        self.relay = Some(relay_lite::spawn(config).await.unwrap());
    }
}

/// A raw letagents device a test controls, to craft envelopes a real client would not (forged
/// signatures, wrong senders, move notices from strangers).
pub struct Forger {
    pub id: DeviceIdentity,
    pub relay: RelayClient,
}

impl Forger {
    pub fn new(relay: &TestRelay) -> Self {
        Self { id: DeviceIdentity::generate(&mut OsRng), relay: RelayClient::new(&relay.url(), None).unwrap() }
    }

    pub fn address(&self) -> String {
        self.id.address().to_string()
    }

    pub fn inner(&self, to: &PeerKeys, kind: Kind, body: Value) -> Inner {
        Inner::new(&self.id.keys(), &to.mailbox_id(), now_ms(), uuid::Uuid::new_v4(), kind, body)
    }

    pub fn seal(&self, to: &PeerKeys, inner: &Inner) -> Vec<u8> {
        letagents::seal(&self.id.sig, to, &serde_json::to_string(inner).unwrap(), &mut OsRng).unwrap()
    }

    pub async fn post(&self, to: &Peer, envelope: Vec<u8>) {
        assert_eq!(self.try_post(to, envelope).await, SendOutcome::Accepted);
    }

    pub async fn try_post(&self, to: &Peer, envelope: Vec<u8>) -> SendOutcome {
        let drop = letagents::Address::parse(&to.address().await).unwrap().drop.unwrap();
        self.relay.send(&to.rt.keys().mailbox_id(), &drop, envelope).await
    }

    /// Reads our own mailbox and opens everything in it.
    pub async fn read(&self) -> Vec<letagents::Opened> {
        let msgs = self.relay.inbox(&self.id.sig, &self.id.drop).await.unwrap();
        msgs.iter()
            .filter_map(|m| letagents::open(&b64u_decode(&m.ct).unwrap(), &self.id.boxs, &self.id.keys()).ok())
            .collect()
    }
}

/// A plain `send` of `text` to `contact` (no kind, reply or agents), as the owner makes it.
pub fn send_request(contact: &str, text: &str) -> Request {
    Request::Send {
        contact: contact.into(),
        text: text.into(),
        kind: None,
        reply_to: None,
        from_agent: None,
        to_agent: None,
    }
}

/// Adding `address` as a contact named `name`, with a hello, as the owner does.
pub fn add_request(address: &str, name: &str) -> Request {
    Request::ContactAdd { address: address.into(), name: Some(name.into()), allow: None, relay: None, no_hello: false }
}

/// A profile with its runtime in this process.
pub struct Peer {
    /// The runtime.
    pub rt: Runtime,
    /// Display name.
    pub name: String,
    /// Whether it runs like a daemon (websocket + outbox worker) or like one-shot commands.
    pub live: bool,
    _lock: ProfileLock,
    /// The profile directory.
    pub dir: TempDir,
}

impl Peer {
    /// A new profile on `relay`, offline (each call syncs like a CLI command).
    pub async fn offline(name: &str, relay: &str) -> Self {
        Self::offline_pinned(name, relay, None).await
    }

    /// A new offline profile on a relay whose certificate it pins (hex SHA-256).
    pub async fn offline_pinned(name: &str, relay: &str, pin: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let profile = Profile { dir: dir.path().join("profile") };
        let lock = profile.try_lock().unwrap().unwrap();
        let opts = InitOptions {
            name: name.into(),
            relay: relay.into(),
            relay_cert_sha256: pin.map(Into::into),
            keystore: KeystorePreference::File,
        };
        let rt = Runtime::init(&profile, opts).await.unwrap();
        Self { rt, name: name.into(), live: false, _lock: lock, dir }
    }

    /// A new offline profile on `relay` inside `dir` (e.g. a directory on a small disk).
    pub async fn offline_in(name: &str, relay: &str, dir: TempDir) -> Self {
        let profile = Profile { dir: dir.path().join("profile") };
        let lock = profile.try_lock().unwrap().unwrap();
        let opts = InitOptions {
            name: name.into(),
            relay: relay.into(),
            relay_cert_sha256: None,
            keystore: KeystorePreference::File,
        };
        let rt = Runtime::init(&profile, opts).await.unwrap();
        Self { rt, name: name.into(), live: false, _lock: lock, dir }
    }

    /// Opens a closed profile again (see [`Peer::close`]), offline.
    pub async fn reopen(name: &str, profile: Profile, dir: TempDir) -> Self {
        let lock = profile.try_lock().unwrap().unwrap();
        let rt = Runtime::open(&profile).await.unwrap();
        Self { rt, name: name.into(), live: false, _lock: lock, dir }
    }

    /// A new profile whose runtime keeps its websocket and outbox worker running.
    pub async fn live(name: &str, relay: &str) -> Self {
        let mut p = Self::offline(name, relay).await;
        p.go_live();
        p
    }

    /// Starts the background loops.
    pub fn go_live(&mut self) {
        self.rt.start_background();
        self.live = true;
    }

    /// Stops this runtime and releases the profile; returns what is needed to open it again.
    pub fn close(self) -> (Profile, TempDir) {
        self.rt.shutdown();
        let profile = self.rt.profile().clone();
        (profile, self.dir)
    }

    /// Performs a request, panicking on error.
    pub async fn call(&self, req: Request) -> Value {
        // Boxed: `handle`'s future is large in a debug build, and a long scenario holding one per
        // call would not fit a test thread's stack.
        match Box::pin(self.rt.handle(req, !self.live)).await {
            Ok(v) => v,
            Err(e) => panic!("{}: {e}", self.name),
        }
    }

    /// Performs a request, returning the error's message on failure (what a scenario driver
    /// hands back to the browser script).
    pub async fn request(&self, req: Request) -> Result<Value, String> {
        self.rt.handle(req, !self.live).await.map_err(|e| e.to_string())
    }

    /// Performs a request, returning the error code on failure.
    pub async fn try_call(&self, req: Request) -> Result<Value, String> {
        self.rt.handle(req, !self.live).await.map_err(|e| e.code().to_owned())
    }

    /// Our full letagents address.
    pub async fn address(&self) -> String {
        self.call(Request::Whoami).await["letagents"]["address"].as_str().unwrap().to_owned()
    }

    /// Our Stringcup id.
    pub async fn stringcup_id(&self) -> String {
        self.call(Request::Whoami).await["stringcup"]["id"].as_str().expect("registered at init").to_owned()
    }

    /// Adds a contact by `address` (any protocol's) under `name`, saying hello where the protocol
    /// has one; the contact as the runtime returns it.
    pub async fn add_contact(&self, address: &str, name: &str) -> Value {
        self.call(add_request(address, name)).await
    }

    /// Sends text; returns the id.
    pub async fn send(&self, contact: &str, text: &str) -> String {
        let v = self.call(send_request(contact, text)).await;
        v["id"].as_str().unwrap().to_owned()
    }

    /// New messages (waiting up to `wait` seconds for one).
    pub async fn inbox(&self, wait: u64) -> Vec<Value> {
        self.call(Request::Inbox { all: false, wait_secs: wait }).await.as_array().cloned().unwrap()
    }

    /// The state of one of our messages.
    pub async fn state_of(&self, id: &str) -> String {
        self.call(Request::Message { id: id.into() }).await["state"].as_str().unwrap().to_owned()
    }

    /// The audit log.
    pub async fn log(&self) -> Vec<Value> {
        self.call(Request::Log { search: None, limit: Some(10_000) }).await.as_array().cloned().unwrap()
    }

    /// Polls `f` until it returns true or `secs` pass.
    pub async fn eventually<F, Fut>(&self, secs: u64, mut f: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        while tokio::time::Instant::now() < deadline {
            if f().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

/// Makes `a` and `b` mutual contacts named by their display names: a adds b (hello), b accepts.
pub async fn befriend(a: &Peer, b: &Peer) {
    a.add_contact(&b.address().await, &b.name).await;
    let ok = b
        .eventually(10, || async {
            let reqs = b.call(Request::ContactRequests).await;
            reqs.as_array().unwrap().iter().any(|r| r["name"] == a.name.as_str())
        })
        .await;
    assert!(ok, "{} never saw {}'s request", b.name, a.name);
    b.call(Request::ContactAccept { name: a.name.clone(), new_name: None }).await;
}

/// Runs the `switchboard` binary with `--home home` and `args`; returns (status ok, stdout, stderr).
pub fn switchboard(bin: &Path, home: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin)
        .arg("--home")
        .arg(home)
        .args(args)
        .env("SWITCHBOARD_KEYSTORE", std::env::var("SWITCHBOARD_TEST_KEYSTORE").unwrap_or_else(|_| "file".into()))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`switchboard`], which must succeed; its stdout.
pub fn switchboard_ok(bin: &Path, home: &Path, args: &[&str]) -> String {
    let (success, out, err) = switchboard(bin, home, args);
    assert!(success, "switchboard {args:?} failed: {err}");
    out
}

/// `switchboard invite --json` on a profile no runtime runs: it prints the invite line, then
/// admits the join itself and exits. Returns the running process and that line.
pub fn cli_invite(bin: &Path, home: &Path) -> (std::process::Child, Value) {
    use std::io::BufRead as _;
    let mut inviter = Command::new(bin)
        .arg("--home")
        .arg(home)
        .args(["invite", "--json"])
        .env("SWITCHBOARD_KEYSTORE", "file")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(inviter.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let line = serde_json::from_str(&first).unwrap_or_else(|e| panic!("invite printed {first:?}: {e}"));
    (inviter, line)
}

/// A temporary profile home for CLI tests.
pub fn home() -> (TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("home");
    (d, p)
}

impl Peer {
    /// Registers `agent` as a local agent session (as the owner would) and returns its token.
    pub async fn open_session(&self, agent: &str) -> String {
        let v = self.call(Request::SessionOpen { agent: agent.into(), harness: Some("test".into()) }).await;
        v["token"].as_str().unwrap().to_owned()
    }

    /// Performs a request as the local agent session `agent`, returning the error code on failure.
    pub async fn as_agent(&self, agent: &str, req: Request) -> Result<Value, String> {
        let caller = switchboard_core::engine::Caller::Agent(agent.into());
        self.rt.handle_as(&caller, req, !self.live).await.map_err(|e| e.code().to_owned())
    }

    /// Sends as the local agent `agent`: (contact, text, kind, reply_to, to_agent).
    pub async fn agent_send(
        &self,
        agent: &str,
        contact: &str,
        text: &str,
        kind: &str,
        reply_to: Option<&str>,
        to_agent: Option<&str>,
    ) -> Result<Value, String> {
        self.as_agent(
            agent,
            Request::Send {
                contact: contact.into(),
                text: text.into(),
                kind: Some(kind.into()),
                reply_to: reply_to.map(Into::into),
                from_agent: None,
                to_agent: to_agent.map(Into::into),
            },
        )
        .await
    }

    /// Waits up to `secs` as agent `agent` and returns what was delivered to it.
    pub async fn agent_wait(&self, agent: &str, secs: u64) -> Vec<Value> {
        let v =
            self.as_agent(agent, Request::Wait { agent: None, timeout_secs: secs, paused_seen: None }).await.unwrap();
        v["deliveries"].as_array().cloned().unwrap()
    }
}

/// A `switchboard daemon` process on a profile, killed on drop.
pub struct DaemonProcess(pub std::process::Child);

impl DaemonProcess {
    /// Starts the daemon and waits until its bridge files exist.
    pub fn start(bin: &Path, home: &Path) -> Self {
        let mut child = Command::new(bin)
            .arg("--home")
            .arg(home)
            .arg("daemon")
            .env("SWITCHBOARD_KEYSTORE", "file")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..200 {
            if home.join("bridge.token").exists() && home.join("bridge.port").exists() {
                return Self(child);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("daemon did not start its bridge");
    }

    /// Asks it to stop (SIGTERM) and waits.
    pub fn stop(mut self) {
        Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status().unwrap();
        let status = self.0.wait().unwrap();
        assert!(status.success(), "daemon exited with {status}");
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The bridge of the runtime serving `home`: (rpc URL, port, owner token).
pub fn bridge_of(home: &Path) -> (String, String, String) {
    let port = std::fs::read_to_string(home.join("bridge.port")).unwrap().trim().to_owned();
    let token = std::fs::read_to_string(home.join("bridge.token")).unwrap().trim().to_owned();
    (format!("http://127.0.0.1:{port}/v1/rpc"), port, token)
}

/// Two CLI profiles on `relay` that are each other's contacts (`alice` and `bob`).
pub fn befriend_cli(bin: &Path, alice: &Path, bob: &Path, relay: &str) {
    let run = |home: &Path, args: &[&str]| {
        let (ok, out, err) = switchboard(bin, home, args);
        assert!(ok, "switchboard {args:?} failed: {err}");
        out
    };
    run(alice, &["init", "--name", "alice", "--relay", relay]);
    run(bob, &["init", "--name", "bob", "--relay", relay]);
    let who: Value = serde_json::from_str(&run(bob, &["whoami", "--json"])).unwrap();
    let addr = who["letagents"]["address"].as_str().unwrap().to_owned();
    run(alice, &["contact", "add", &addr, "--name", "bob"]);
    for _ in 0..100 {
        let reqs: Value = serde_json::from_str(&run(bob, &["contact", "requests", "--json"])).unwrap();
        if reqs.as_array().unwrap().iter().any(|r| r["name"] == "alice") {
            run(bob, &["contact", "accept", "alice"]);
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("bob never saw alice's request");
}

/// One bridge request (`POST` of `body` to the bridge `url` with bearer `token`), which must
/// succeed; its answer.
pub async fn bridge_rpc(url: &str, token: &str, body: &Value) -> Value {
    let resp = reqwest::Client::new().post(url).bearer_auth(token).json(body).send().await.unwrap();
    assert!(resp.status().is_success(), "{body}");
    resp.json().await.unwrap()
}

/// The SQLite database of the profile at `home`, opened beside its runtime.
pub async fn profile_db(home: &Path) -> sqlx::SqlitePool {
    sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rw", home.join("switchboard.db").display())).await.unwrap()
}

/// Opens an agent session for `agent` on the bridge at `url` with the owner token; returns the
/// session's token.
pub async fn open_session(http: &reqwest::Client, url: &str, owner: &str, agent: &str) -> String {
    let opened: Value = http
        .post(url)
        .bearer_auth(owner)
        .json(&serde_json::json!({"op": "session_open", "agent": agent}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    opened["token"].as_str().unwrap_or_else(|| panic!("session_open failed: {opened}")).to_owned()
}

/// One profile with one letmeknow group session (`handle`, which is also its agent session's
/// name), driven in-process.
pub struct GroupMember {
    /// The profile.
    pub peer: Peer,
    /// The group session.
    pub handle: String,
    /// Its fingerprint.
    pub fp: String,
}

impl GroupMember {
    /// An offline profile `name` on `relay` with the group session `handle` ("NAME's agent").
    pub async fn new(name: &str, handle: &str, relay: &TestRelay) -> Self {
        let peer = Peer::offline(name, &relay.url()).await;
        let s = peer.rt.lmk_session(Some(handle), Some(&format!("{name}'s agent"))).await.unwrap();
        Self { fp: s["fingerprint"].as_str().unwrap().to_owned(), peer, handle: handle.to_owned() }
    }

    /// The runtime.
    pub fn rt(&self) -> &Runtime {
        &self.peer.rt
    }

    /// The profile's database.
    pub fn pool(&self) -> &sqlx::SqlitePool {
        &self.rt().store().pool
    }

    /// Sets the delivery policy's loop limit and digest.
    pub async fn policy(&self, loop_limit: Option<u32>, digest_secs: Option<u64>) {
        self.peer.call(Request::Policy { review: None, loop_limit, digest_secs }).await;
    }

    /// Reads the group's log now.
    pub async fn sync(&self, group: &str) {
        self.rt().lmk_sync(&self.handle, group, 0).await.unwrap();
    }

    /// A plain group message from the owner's side of this runtime (no policy involved); its id.
    pub async fn say(&self, group: &str, text: &str) -> String {
        self.rt().lmk_send(&self.handle, group, text, None, None).await.unwrap()["id"].as_str().unwrap().to_owned()
    }

    /// `group_read` without id as the agent session does it (the bridge vocabulary), waiting up
    /// to `wait_secs`.
    pub async fn deliveries(&self, wait_secs: u64) -> Value {
        self.peer.as_agent(&self.handle, Request::GroupDeliveries { handle: None, wait_secs }).await.unwrap()
    }

    /// What the session is handed now (no wait; owner side, not acked).
    pub async fn take(&self) -> Value {
        self.rt().lmk_deliveries(&self.handle).await.unwrap()
    }

    /// A group send as the agent session (under the policy); the error code on refusal.
    pub async fn agent_says(&self, group: &str, text: &str) -> Result<Value, String> {
        let req = Request::GroupSend { handle: None, group: group.into(), text: text.into(), to: None, reply_to: None };
        self.peer.as_agent(&self.handle, req).await
    }

    /// A group send by the owner through the bridge vocabulary (operator input).
    pub async fn owner_says(&self, group: &str, text: &str) -> Value {
        let req = Request::GroupSend { handle: None, group: group.into(), text: text.into(), to: None, reply_to: None };
        self.peer.call(req).await
    }

    /// The first group of the profile's `group list`.
    pub async fn group_list(&self) -> Value {
        self.peer.call(Request::GroupList { handle: None }).await[0].clone()
    }

    /// Acks a group `lease` as agent session `who` of this profile.
    pub async fn ack_as(&self, who: &str, lease: &Value, ids: Option<Vec<String>>) -> Result<Value, String> {
        self.peer.as_agent(who, Request::Ack { lease: lease.as_str().unwrap().into(), ids }).await
    }

    /// Invites `joiner` into `group` (or a new group) and waits for the admission; the group id.
    pub async fn admit(&self, group: Option<&str>, joiner: &GroupMember) -> String {
        let inv = self.rt().lmk_invite(&self.handle, group, None).await.unwrap();
        let (joined, admitted) = tokio::join!(
            joiner.rt().lmk_join(&joiner.handle, inv["link"].as_str().unwrap(), Some(60)),
            self.rt().lmk_invite_wait(inv["invite"].as_str().unwrap())
        );
        joined.unwrap();
        admitted.unwrap();
        inv["group"].as_str().unwrap().to_owned()
    }
}

/// A tmpfs of a fixed size mounted on a fresh directory, unmounted when dropped (also when a test
/// panics; lazily if something still holds a file open). Mounting needs root.
pub struct SmallDisk {
    dir: TempDir,
}

impl SmallDisk {
    /// Mounts `size` (e.g. `8m`), or says why not: a failure under `SWITCHBOARD_REQUIRE_TMPFS=1`
    /// (CI), a printed skip otherwise.
    pub fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir.path())
            .output();
        let why = match mounted {
            Ok(out) if out.status.success() => return Some(Self { dir }),
            Ok(out) => format!("mount -t tmpfs failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
            Err(e) => format!("cannot run mount: {e}"),
        };
        assert!(
            std::env::var("SWITCHBOARD_REQUIRE_TMPFS").as_deref() != Ok("1"),
            "SWITCHBOARD_REQUIRE_TMPFS=1 but no tmpfs could be mounted (needs root): {why}"
        );
        eprintln!("skipping: {why} (needs root; SWITCHBOARD_REQUIRE_TMPFS=1 makes this a failure)");
        None
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills what is left of it with a file at `path` (on this disk); returns the bytes written.
    pub fn fill(&self, path: &Path) -> usize {
        use std::io::Write as _;
        let mut file = std::fs::File::create(path).unwrap();
        let chunk = vec![1u8; 64 * 1024];
        let mut written = 0;
        loop {
            match file.write(&chunk) {
                Ok(0) | Err(_) => return written,
                Ok(n) => written += n,
            }
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let path = self.dir.path();
        if !Command::new("umount").arg(path).status().is_ok_and(|s| s.success()) {
            let _ = Command::new("umount").arg("-l").arg(path).status();
        }
    }
}
