//! Issue 17 end to end: real `switchboard daemon`s in network namespaces on one bridge
//! (`tests/src/netns.rs`). Namespace A runs alice, B runs bob (contacts of each other), R runs
//! relay-lite, C runs carol (she added alice, who never accepted: a stranger to alice).
//!
//! Asserts, through the CLI as a user sees it: discovery (bob "nearby" in alice's `contact list`
//! and `status --json`, and the other way round); a message delivered directly with
//! `path = direct` on both sides (`show`, the audit log); after bridge-port isolation the next
//! message arrives through the relay, exactly once, with no manual step, and the peer is no
//! longer listed nearby; carol's announcement is refused and she learns no one nearby.
//!
//! Prints discovery time and direct vs relay latency (send → the receiver's `inbox --wait`
//! returns it) for BENCHMARKS.md. Needs root and iproute2 (skips otherwise;
//! `SWITCHBOARD_REQUIRE_NETNS=1` makes that a failure).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard_tests::netns::Lan;

/// The tests here run one at a time: each starts several daemons and relays, with 2 s direct
/// delivery deadlines and timed figures that two such LANs at once on 2 cores would distort.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchboard-under-test"))
}

fn relay_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lan-relay"))
}

/// A profile whose every command (and daemon) runs inside its namespace.
struct Host {
    name: &'static str,
    ns: String,
    home: PathBuf,
    log: PathBuf,
    daemon: Option<Child>,
}

impl Host {
    fn new(name: &'static str, ns: &str, dir: &Path) -> Host {
        Host {
            name,
            ns: ns.to_owned(),
            home: dir.join(name),
            log: dir.join(format!("{name}-daemon.log")),
            daemon: None,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Lan::command(&self.ns, &bin());
        c.arg("--home").arg(&self.home).args(args).env("SWITCHBOARD_KEYSTORE", "file");
        c
    }

    fn sb(&self, args: &[&str]) -> (bool, String, String) {
        let out = self.command(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.sb(args);
        assert!(ok, "{}: switchboard {args:?} failed: {err}", self.name);
        out
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.ok(&all);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{}: {args:?} printed {out:?}: {e}", self.name))
    }

    fn start(&mut self) {
        assert!(self.daemon.is_none());
        let _ = std::fs::remove_file(self.home.join("bridge.port"));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = self
            .command(&["daemon"])
            // The LAN layer at debug: its dials and refusals, printed if the test fails.
            .env("SWITCHBOARD_LOG", "switchboard_core=info,switchboard_core::transport::lan=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.daemon = Some(child);
        for _ in 0..400 {
            if self.home.join("bridge.port").exists() && self.home.join("bridge.token").exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("{}'s daemon did not start its bridge", self.name);
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            // SIGTERM to `ip netns exec`, which execs the daemon: the same process.
            Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether `contact` shows "nearby" in `contact list --json`.
    fn sees_nearby(&self, contact: &str) -> bool {
        let list = self.json(&["contact", "list"]);
        list.as_array().unwrap().iter().any(|c| c["name"] == contact && c["nearby"] == true)
    }

    fn status_nearby(&self) -> Vec<String> {
        let st = self.json(&["status"]);
        st["lan"]["nearby"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect()
    }

    /// Waits until `contact` is nearby; how long that took from `since`.
    fn wait_nearby(&self, contact: &str, since: Instant, timeout: Duration) -> Option<Duration> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.sees_nearby(contact) {
                return Some(since.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    fn send(&self, to: &str, text: &str) -> String {
        let v = self.json(&["send", to, text]);
        v["id"].as_str().unwrap_or_else(|| panic!("send printed {v}")).to_owned()
    }

    /// `show ID --json`, once the hand-over (to the contact or the relay) has recorded its path.
    /// Not once the state is past `queued`: the recipient's receipt can mark the message
    /// `delivered` before the sender's hand-over commits.
    fn show_handed_over(&self, id: &str) -> Value {
        let mut v = Value::Null;
        for _ in 0..200 {
            v = self.json(&["show", id]);
            if v["state"] != "queued" && v["path"] != "" {
                return v;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{}: {id} was never handed over: {v}", self.name);
    }

    fn log_has(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.log).unwrap_or_default().contains(needle)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop();
        // A failed run leaves its story in the daemon's log, which lives in a temporary directory:
        // print it before that goes.
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("---- {}'s daemon log ({}) ----\n{log}", self.name, self.log.display());
        }
    }
}

/// A receiver's `inbox --wait` started first, then the sender's `send`: how long from the send
/// until the waiter printed the message, and the message as the receiver saw it.
fn timed_delivery(from: &Host, to: &Host, text: &str) -> (Duration, Value) {
    timed_delivery_to(from, to_name(to), to, text)
}

/// [`timed_delivery`] to `from`'s contact named `contact` (on `to`).
fn timed_delivery_to(from: &Host, contact: &str, to: &Host, text: &str) -> (Duration, Value) {
    let mut waiter = to.command(&["--json", "inbox", "--wait", "20"]).stdout(Stdio::piped()).spawn().unwrap();
    // Let the waiter reach the daemon and subscribe before the message can arrive.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let id = from.send(contact, text);
    let mut out = String::new();
    BufReader::new(waiter.stdout.take().unwrap()).read_line(&mut out).unwrap();
    let took = t.elapsed();
    waiter.wait().unwrap();
    let msgs: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("inbox printed {out:?}: {e}"));
    let msg = msgs.as_array().unwrap().iter().find(|m| m["id"] == id.as_str()).cloned();
    (took, msg.unwrap_or_else(|| panic!("{} got {msgs} instead of {id}", to.name)))
}

/// Milliseconds from the sender's commit of message `id` to the receiver's (the namespaces share
/// one clock): the engine's part of the latency, without the CLI processes around it.
fn commit_to_commit(from: &Host, to: &Host, id: &str) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let at = |home: PathBuf, direction: &'static str| {
            let id = id.to_owned();
            async move {
                let pool = switchboard_tests::profile_db(&home).await;
                let t: i64 = sqlx::query_scalar("SELECT created_at FROM messages WHERE direction = ? AND id = ?")
                    .bind(direction)
                    .bind(&id)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                pool.close().await;
                t
            }
        };
        (at(to.home.clone(), "in").await - at(from.home.clone(), "out").await) as f64
    })
}

fn to_name(h: &Host) -> &'static str {
    // Each profile calls the other by its own name.
    h.name
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
fn daemons_on_one_lan_discover_deliver_directly_fall_back_to_the_relay_and_refuse_a_stranger() {
    let _one_at_a_time = serial();
    let Some(mut lan) = Lan::create("d") else { return };
    let a = lan.add_host(1);
    let b = lan.add_host(2);
    let r = lan.add_host(3);
    let c = lan.add_host(4);
    let dir = tempfile::tempdir().unwrap();

    // The relay in R.
    let relay_dir = dir.path().join("relay");
    let mut relay = Lan::command(&r, &relay_bin())
        .arg(format!("{}:8443", Lan::addr(3)))
        .arg(&relay_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(relay.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let mut parts = line.split_whitespace();
    let (url, cert) = (parts.next().expect("relay url").to_owned(), parts.next().expect("relay cert").to_owned());

    let mut alice = Host::new("alice", &a, dir.path());
    let mut bob = Host::new("bob", &b, dir.path());
    let mut carol = Host::new("carol", &c, dir.path());
    for h in [&alice, &bob, &carol] {
        h.ok(&["init", "--name", h.name, "--relay", &url, "--relay-cert-sha256", &cert]);
    }
    // Off by default: no node, no LAN socket.
    let st = alice.json(&["lan", "status"]);
    assert_eq!((st["enabled"].clone(), st["running"].clone()), (Value::Bool(false), Value::Bool(false)), "{st}");

    // alice and bob are contacts (alice adds bob, bob accepts); carol adds alice, who never
    // accepts her.
    let addr = |h: &Host| h.json(&["whoami"])["letagents"]["address"].as_str().unwrap().to_owned();
    alice.ok(&["contact", "add", &addr(&bob), "--name", "bob"]);
    let mut accepted = false;
    for _ in 0..100 {
        let reqs = bob.json(&["contact", "requests"]);
        if reqs.as_array().unwrap().iter().any(|r| r["name"] == "alice") {
            bob.ok(&["contact", "accept", "alice"]);
            accepted = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(accepted, "bob never saw alice's request");
    carol.ok(&["contact", "add", &addr(&alice), "--name", "alice"]);
    // alice also has bob's Agent Mail address; her first mail (through the relay) makes her a
    // request at bob, which he accepts.
    let mail = bob.json(&["whoami"])["agent_mail"]["address"].as_str().unwrap().to_owned();
    alice.ok(&["contact", "add", &mail, "--name", "bob-mail"]);
    alice.ok(&["send", "bob-mail", "hello by mail"]);
    let mut accepted = false;
    for _ in 0..100 {
        let reqs = bob.json(&["contact", "requests"]);
        if let Some(r) = reqs.as_array().unwrap().iter().find(|r| r["protocol"] == "agent-mail") {
            bob.ok(&["contact", "accept", r["name"].as_str().unwrap()]);
            accepted = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(accepted, "bob never saw alice's mail request");
    // Accepting released her first mail (it came through the relay): read it.
    let first = bob.json(&["inbox"]);
    assert!(first.as_array().unwrap().iter().any(|m| m["body"] == "hello by mail" && m["path"] == "relay"), "{first}");
    for h in [&alice, &bob, &carol] {
        assert!(h.ok(&["lan", "on"]).contains("lan: on"));
    }

    // Discovery: both daemons started at once, until each lists the other as nearby. The LAN
    // key stays in the keystore, so the PeerIds are the same each round (as within a day).
    let mut discovery = Vec::new();
    for round in 0..5 {
        let t = Instant::now();
        alice.start();
        bob.start();
        let ta = alice.wait_nearby("bob", t, Duration::from_secs(20));
        let tb = bob.wait_nearby("alice", t, Duration::from_secs(20));
        let (Some(ta), Some(tb)) = (ta, tb) else {
            panic!("round {round}: not nearby (alice sees bob: {ta:?}, bob sees alice: {tb:?})")
        };
        discovery.push(ms(ta.max(tb)));
        if round < 4 {
            alice.stop();
            bob.stop();
        }
    }
    discovery.sort_by(f64::total_cmp);
    assert!(alice.status_nearby().contains(&"bob".to_owned()), "status --json: {:?}", alice.status_nearby());
    assert!(bob.status_nearby().contains(&"alice".to_owned()), "status --json: {:?}", bob.status_nearby());
    let text = alice.ok(&["contact", "list"]);
    assert!(text.lines().any(|l| l.starts_with("bob") && l.contains("nearby")), "{text}");

    // Carol, a stranger to alice, runs too: her node is refused, nobody is nearby to her, and
    // alice never lists her.
    carol.start();

    // Direct delivery, recorded as such on both sides and in both audit logs.
    let (_, got) = timed_delivery(&alice, &bob, "hello over the LAN");
    let id = got["id"].as_str().unwrap().to_owned();
    assert_eq!(got["path"], "direct", "{got}");
    assert_eq!(bob.json(&["show", &id])["path"], "direct");
    assert_eq!(alice.show_handed_over(&id)["path"], "direct");
    let audit = |h: &Host, id: &str| -> Vec<Value> {
        h.json(&["log"]).as_array().unwrap().iter().filter(|r| r["message_id"] == id).cloned().collect()
    };
    assert!(
        audit(&alice, &id).iter().any(|r| r["state"] == "relayed" && r["path"] == "direct"),
        "{:?}",
        audit(&alice, &id)
    );
    assert!(
        audit(&bob, &id).iter().any(|r| r["state"] == "received" && r["path"] == "direct"),
        "{:?}",
        audit(&bob, &id)
    );

    // Agent Mail goes direct too (the packet bytes the relay would carry).
    let mut mail_direct = None;
    for i in 0..50 {
        if alice.sees_nearby("bob-mail") {
            let (_, got) = timed_delivery_to(&alice, "bob-mail", &bob, &format!("mail over the LAN {i}"));
            mail_direct = Some(got);
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let got = mail_direct.expect("bob's Agent Mail contact never showed nearby at alice");
    assert_eq!(
        (got["protocol"].clone(), got["path"].clone()),
        (Value::from("agent-mail"), Value::from("direct")),
        "{got}"
    );

    // Direct latency.
    let (mut direct, mut direct_engine) = (Vec::new(), Vec::new());
    for i in 0..15 {
        let (took, m) = timed_delivery(&alice, &bob, &format!("direct {i}"));
        assert_eq!(m["path"], "direct", "{m}");
        direct.push(ms(took));
        direct_engine.push(commit_to_commit(&alice, &bob, m["id"].as_str().unwrap()));
    }
    direct.sort_by(f64::total_cmp);
    direct_engine.sort_by(f64::total_cmp);

    // The stranger: refused by alice's node, nobody nearby to her.
    let refused = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        alice.log_has("no binding is signed by a pinned contact")
    });
    assert!(refused, "alice's daemon never refused carol's binding");
    assert!(carol.status_nearby().is_empty(), "carol learned {:?}", carol.status_nearby());
    let alice_list = alice.json(&["contact", "list"]);
    let is_bob = |c: &Value| c["name"] == "bob" || c["name"] == "bob-mail";
    assert!(alice_list.as_array().unwrap().iter().all(|c| is_bob(c) || c["nearby"] == false), "{alice_list}");

    // Cut alice from bob (both still reach the relay). The next message goes through the
    // relay in the same attempt, arrives once, and bob stops being nearby to alice.
    lan.isolate(1, true);
    lan.isolate(2, true);
    let (took, got) = timed_delivery(&alice, &bob, "after the cut");
    let cut_id = got["id"].as_str().unwrap().to_owned();
    assert_eq!(got["path"], "relay", "{got}");
    assert_eq!(alice.show_handed_over(&cut_id)["path"], "relay");
    assert!(!alice.sees_nearby("bob"), "bob still listed nearby after a failed direct delivery");
    println!("first message after the cut: {:.0} ms (direct try + relay)", ms(took));

    // Relay latency between the same two namespaces, same run: nothing tries the cut link now.
    let (mut relayed, mut relayed_engine) = (Vec::new(), Vec::new());
    for i in 0..15 {
        let (took, m) = timed_delivery(&alice, &bob, &format!("relay {i}"));
        assert_eq!(m["path"], "relay", "{m}");
        relayed.push(ms(took));
        relayed_engine.push(commit_to_commit(&alice, &bob, m["id"].as_str().unwrap()));
    }
    relayed.sort_by(f64::total_cmp);
    relayed_engine.sort_by(f64::total_cmp);

    // Exactly once: bob's history holds the message after the cut one time, alice's outbox is
    // empty.
    let history = bob.json(&["inbox", "--all"]);
    let copies = history.as_array().unwrap().iter().filter(|m| m["id"] == cut_id.as_str()).count();
    assert_eq!(copies, 1, "{history}");
    assert_eq!(alice.json(&["status"])["outbox"], 0);

    println!(
        "LAN discovery, daemons started -> both list each other nearby, 5 rounds: p50 {:.0} ms, p95 {:.0} ms",
        percentile(&discovery, 0.5),
        percentile(&discovery, 0.95)
    );
    println!(
        "send -> receiver's inbox --wait returns it, 15 each: direct p50 {:.0} ms (p95 {:.0}), relay p50 {:.0} ms (p95 {:.0})",
        percentile(&direct, 0.5),
        percentile(&direct, 0.95),
        percentile(&relayed, 0.5),
        percentile(&relayed, 0.95)
    );
    println!(
        "sender's commit -> receiver's commit, same messages: direct p50 {:.0} ms (p95 {:.0}), relay p50 {:.0} ms (p95 {:.0})",
        percentile(&direct_engine, 0.5),
        percentile(&direct_engine, 0.95),
        percentile(&relayed_engine, 0.5),
        percentile(&relayed_engine, 0.95)
    );
    // Off: the running daemon stops its node; nothing but the bridge (loopback) listens in A.
    assert!(alice.ok(&["lan", "off"]).contains("lan: off"));
    let st = alice.json(&["lan", "status"]);
    assert_eq!((st["enabled"].clone(), st["running"].clone()), (Value::Bool(false), Value::Bool(false)), "{st}");
    let mut exposed = Vec::new();
    for _ in 0..60 {
        let out = Command::new("ip").args(["netns", "exec", &a, "ss", "-Hlntu"]).output().unwrap();
        exposed = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.split_whitespace().nth(4).is_some_and(|local| local.starts_with("127.0.0.1:")))
            .map(str::to_owned)
            .collect();
        if exposed.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(exposed.is_empty(), "LAN off, yet alice's namespace has {exposed:?}");

    drop((alice, bob, carol));
    let _ = relay.kill();
    let _ = relay.wait();
}

/// relay-lite with a self-signed certificate in namespace `ns`, on `addr:8443`: its URL and
/// certificate SHA-256 (hex), and the process.
fn spawn_relay(ns: &str, addr: &str, dir: &Path) -> (String, String, Child) {
    let mut relay = Lan::command(ns, &relay_bin())
        .arg(format!("{addr}:8443"))
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(relay.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let mut parts = line.split_whitespace();
    let (url, cert) = (parts.next().expect("relay url").to_owned(), parts.next().expect("relay cert").to_owned());
    (url, cert, relay)
}

/// Group messages `h`'s session `handle` has been handed, waiting until one says `text`.
fn wait_group_message(h: &Host, handle: &str, text: &str) -> Value {
    for _ in 0..20 {
        let out = h.ok(&["listen", "--handle", handle, "--once", "--timeout", "5"]);
        let found = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["type"] == "group" && l["content"] == text);
        if let Some(m) = found {
            return m;
        }
    }
    panic!("{} never got the group message {text:?}", h.name);
}

/// Groups on a LAN without internet: alice hosts a relay with a self-signed certificate in her
/// own namespace (as the desktop app's "Host one on this machine" does) and her profile uses it;
/// bob's profile uses another relay. Bob cannot join alice's group until alice's daemon, bound to
/// him over the LAN, announces her relay signed by her identity key: before that his join fails
/// with `untrusted_relay` naming the URL and the certificate's SHA-256; after it, the same link
/// works and they talk through alice's relay, bob holding only the pin alice signed. Carol,
/// whom bob never added, hosts a relay too: whatever her daemon does, bob never trusts it, and
/// her invite fails the same way.
#[test]
fn a_contacts_self_signed_relay_is_used_for_groups_only_after_its_signed_lan_announcement() {
    let _one_at_a_time = serial();
    let Some(mut lan) = Lan::create("g") else { return };
    let a = lan.add_host(1);
    let b = lan.add_host(2);
    let r = lan.add_host(3);
    let c = lan.add_host(4);
    let dir = tempfile::tempdir().unwrap();

    let (alice_url, alice_cert, mut alice_relay) = spawn_relay(&a, &Lan::addr(1), &dir.path().join("relay-a"));
    let (bob_url, bob_cert, mut bob_relay) = spawn_relay(&r, &Lan::addr(3), &dir.path().join("relay-r"));
    let (carol_url, carol_cert, mut carol_relay) = spawn_relay(&c, &Lan::addr(4), &dir.path().join("relay-c"));
    assert!(alice_url != bob_url && alice_cert != bob_cert);

    let mut alice = Host::new("alice", &a, dir.path());
    let mut bob = Host::new("bob", &b, dir.path());
    let mut carol = Host::new("carol", &c, dir.path());
    alice.ok(&["init", "--name", "alice", "--relay", &alice_url, "--relay-cert-sha256", &alice_cert]);
    bob.ok(&["init", "--name", "bob", "--relay", &bob_url, "--relay-cert-sha256", &bob_cert]);
    carol.ok(&["init", "--name", "carol", "--relay", &carol_url, "--relay-cert-sha256", &carol_cert]);
    // alice and bob add each other by address (each pins the other's keys); carol adds bob, who
    // never adds her.
    let addr = |h: &Host| h.json(&["whoami"])["letagents"]["address"].as_str().unwrap().to_owned();
    alice.ok(&["contact", "add", &addr(&bob), "--name", "bob"]);
    bob.ok(&["contact", "add", &addr(&alice), "--name", "alice"]);
    carol.ok(&["contact", "add", &addr(&bob), "--name", "bob"]);
    for h in [&mut alice, &mut bob, &mut carol] {
        h.start();
    }
    alice.ok(&["listen", "--handle", "amber-otter", "--name", "Alice", "--once", "--timeout", "0"]);
    bob.ok(&["listen", "--handle", "brave-heron", "--name", "Bob", "--once", "--timeout", "0"]);
    carol.ok(&["listen", "--handle", "calm-crane", "--name", "Carol", "--once", "--timeout", "0"]);

    // LAN off: bob knows nothing of alice's relay. Her invite lives there; his join is refused
    // with the typed error a UI turns into "trust this relay?".
    let inv = alice.json(&["invite"]);
    let (group, link) = (inv["group"].as_str().unwrap().to_owned(), inv["link"].as_str().unwrap().to_owned());
    assert!(link.starts_with(&alice_url), "{link}");
    let untrusted = |h: &Host, link: &str, url: &str, cert: &str| {
        let (ok, _, err) = h.sb(&["--json", "join", link, "--handle", "brave-heron"]);
        assert!(!ok, "{}: joined through an untrusted relay", h.name);
        let e: Value = serde_json::from_str(err.trim()).unwrap_or_else(|e| panic!("join printed {err:?}: {e}"));
        assert_eq!(e["error"]["code"], "untrusted_relay", "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(url) && message.contains(cert), "{message}");
    };
    untrusted(&bob, &link, &alice_url, &alice_cert);
    assert_eq!(bob.json(&["relay", "list"]), Value::Array(vec![]));

    // LAN on: once alice and bob are bound, alice's daemon announces her relay and bob's stores
    // it as vouched for by alice. Carol's node is refused; nothing of hers is kept.
    for h in [&alice, &bob, &carol] {
        assert!(h.ok(&["lan", "on"]).contains("lan: on"));
    }
    let t = Instant::now();
    assert!(bob.wait_nearby("alice", t, Duration::from_secs(30)).is_some(), "alice never nearby at bob");
    let mut trusted = Value::Null;
    for _ in 0..100 {
        trusted = bob.json(&["relay", "list"]);
        if !trusted.as_array().unwrap().is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let expected =
        serde_json::json!([{"url": alice_url, "cert_sha256": alice_cert, "source": "contact", "contact": "alice"}]);
    let shown: Vec<Value> = trusted
        .as_array()
        .unwrap()
        .iter()
        .map(|r| serde_json::json!({"url": r["url"], "cert_sha256": r["cert_sha256"], "source": r["source"], "contact": r["contact"]}))
        .collect();
    assert_eq!(Value::Array(shown), expected, "bob's trusted relays: {trusted}");

    // The same link now works: bob joins through alice's relay with the pin alice signed, and
    // they talk there.
    // Unaddressed group traffic is handed out in digests, at most every 180 s by default: with
    // digests at once, `listen` below sees each message as soon as it is synced (the 180 s
    // boundary otherwise falls past the wait in about half the runs).
    for h in [&alice, &bob] {
        h.ok(&["policy", "--digest", "0"]);
    }
    let joined = bob.json(&["join", &link, "--handle", "brave-heron"]);
    assert_eq!(joined["group"], group.as_str(), "{joined}");
    bob.ok(&["group", "send", &group, "hello from bob, through alice's relay", "--handle", "brave-heron"]);
    wait_group_message(&alice, "amber-otter", "hello from bob, through alice's relay");
    alice.ok(&["group", "send", &group, "and back", "--handle", "amber-otter"]);
    wait_group_message(&bob, "brave-heron", "and back");
    // alice's relay holds the group (bob's own relay never saw it: the link names alice's).
    assert!(bob.log_has(&format!("trusting the relay at {alice_url}")), "bob's daemon did not log the pin's origin");

    // Carol, a stranger to bob: his node refused her, so her relay is not trusted, and her invite
    // fails as alice's did before the announcement.
    let refused = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        bob.log_has("no binding is signed by a pinned contact")
    });
    assert!(refused, "bob's daemon never refused carol");
    let carol_inv = carol.json(&["invite"]);
    untrusted(&bob, carol_inv["link"].as_str().unwrap(), &carol_url, &carol_cert);
    let urls: Vec<Value> = bob.json(&["relay", "list"]).as_array().unwrap().iter().map(|r| r["url"].clone()).collect();
    assert_eq!(urls, vec![Value::from(alice_url.as_str())]);

    // The owner may still accept a relay by hand; the list says so.
    bob.ok(&["relay", "trust", &carol_url, &carol_cert]);
    let list = bob.json(&["relay", "list"]);
    let carols = list.as_array().unwrap().iter().find(|r| r["url"] == carol_url.as_str()).cloned().unwrap();
    assert_eq!((carols["source"].clone(), carols["contact"].clone()), (Value::from("you"), Value::Null), "{list}");

    drop((alice, bob, carol));
    for relay in [&mut alice_relay, &mut bob_relay, &mut carol_relay] {
        let _ = relay.kill();
        let _ = relay.wait();
    }
}
