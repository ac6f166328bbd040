//! The LAN layer between real network namespaces on one bridge (`tests/src/netns.rs`): two
//! contacts discover each other over mDNS and deliver directly; after bridge-port isolation a
//! delivery fails within the timeout; a stranger and a contact with an expired binding are refused.
//! Needs root and iproute2 (skips otherwise; `SWITCHBOARD_REQUIRE_NETNS=1` makes that a failure).
//!
//! Prints discovery time and direct delivery latency (BENCHMARKS.md).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use serde_json::{Value, json};
use switchboard_core::util::{hex, now_ms};
use switchboard_tests::netns::Lan;

const ALICE: i64 = 1;
const BOB: i64 = 2;
const CAROL: i64 = 3;
const DAVE: i64 = 4;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lan-node"))
}

fn identity(n: u8) -> [u8; 32] {
    [n; 32]
}

fn public(n: u8) -> String {
    hex(&SigningKey::from_bytes(&identity(n)).verifying_key().to_bytes())
}

/// A lan-node process in a namespace, its events and its stdin.
struct Node {
    child: Child,
    stdin: ChildStdin,
    events: mpsc::Receiver<Value>,
    started: Instant,
    _dir: tempfile::TempDir,
}

impl Node {
    fn spawn(ns: &str, n: u8, pins: Value, binding_expiry_ms: Option<i64>) -> Node {
        Node::spawn_announcing(ns, n, pins, binding_expiry_ms, Value::Null)
    }

    /// [`Node::spawn`] with a relay to announce (lan-node's `relay` config).
    fn spawn_announcing(ns: &str, n: u8, pins: Value, binding_expiry_ms: Option<i64>, relay: Value) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let mut config = json!({
            "identity_seed": hex(&identity(n)),
            "lan_seed": hex(&switchboard_core::util::random_array::<32>()),
            "pins": pins,
            "store": dir.path().join("store").to_str().unwrap(),
            "relay": relay,
        });
        if let Some(e) = binding_expiry_ms {
            config["binding_expiry_ms"] = json!(e);
        }
        let started = Instant::now();
        let mut child = Lan::command(ns, &bin())
            .arg(config.to_string())
            .env("RUST_LOG", "switchboard_core=debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(std::env::temp_dir().join(format!("lan-node-{ns}.log"))).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    break;
                }
            }
        });
        let stdin = child.stdin.take().unwrap();
        Node { child, stdin, events, started, _dir: dir }
    }

    /// The next event of `kind` within `timeout`, or None.
    fn next(&self, kind: &str, timeout: Duration) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.events.recv_timeout(left) {
                Ok(v) if v["event"] == kind => return Some(v),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    /// Waits until `contact` is nearby; returns how long after spawn that was.
    fn wait_nearby(&self, contact: i64, timeout: Duration) -> Option<Duration> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.next("nearby", deadline.checked_duration_since(Instant::now())?)?;
            if v["contacts"].as_array().unwrap().iter().any(|c| c.as_i64() == Some(contact)) {
                return Some(self.started.elapsed());
            }
        }
    }

    /// Every nearby set reported within `window`.
    fn nearby_sets(&self, window: Duration) -> Vec<Vec<i64>> {
        let deadline = Instant::now() + window;
        let mut out = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.events.recv_timeout(left) {
                Ok(v) if v["event"] == "nearby" => {
                    out.push(v["contacts"].as_array().unwrap().iter().map(|c| c.as_i64().unwrap()).collect())
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        out
    }

    fn deliver(&mut self, contact: i64, size: usize, seq: u64) -> Value {
        writeln!(self.stdin, "deliver {contact} {size} {seq}").unwrap();
        self.stdin.flush().unwrap();
        let v = self.next("delivered", Duration::from_secs(10)).expect("no delivery result");
        assert_eq!(v["seq"], seq.to_string());
        v
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pins(list: &[(u8, i64)]) -> Value {
    list.iter().map(|(n, id)| (public(*n), json!(id))).collect::<serde_json::Map<_, _>>().into()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
fn contacts_on_one_lan_discover_deliver_directly_and_refuse_strangers() {
    let Some(mut lan) = Lan::create("l") else { return };
    let a = lan.add_host(1);
    let b = lan.add_host(2);
    let c = lan.add_host(3);
    let d = lan.add_host(4);

    // Discovery time: both started at once, until each sees the other as nearby. Fresh LAN keys
    // (so fresh PeerIds) every round. A first mDNS query sent before the other side listens is
    // answered by the next one (the query interval is 20 s), hence the 45 s bound; the figure is
    // the measured time either way.
    let mut discovery = Vec::new();
    for _ in 0..10 {
        let alice = Node::spawn(&a, 1, pins(&[(2, BOB)]), None);
        let bob = Node::spawn(&b, 2, pins(&[(1, ALICE)]), None);
        let t_b = bob.wait_nearby(ALICE, Duration::from_secs(45)).expect("bob never saw alice nearby");
        let t_a = alice.wait_nearby(BOB, Duration::from_secs(45)).expect("alice never saw bob nearby");
        discovery.push(t_a.max(t_b).as_secs_f64() * 1000.0);
    }
    discovery.sort_by(f64::total_cmp);

    let mut alice = Node::spawn(&a, 1, pins(&[(2, BOB), (4, DAVE)]), None);
    let bob = Node::spawn(&b, 2, pins(&[(1, ALICE)]), None);
    // Carol is nobody's contact but pins Alice and Bob; Dave is Alice's contact but presents a
    // binding that expired an hour ago.
    let carol = Node::spawn(&c, 3, pins(&[(1, ALICE), (2, BOB)]), None);
    let mut dave = Node::spawn(&d, 4, pins(&[(1, ALICE)]), Some(now_ms() - 3_600_000));
    alice.wait_nearby(BOB, Duration::from_secs(45)).expect("alice never saw bob nearby");
    bob.wait_nearby(ALICE, Duration::from_secs(45)).expect("bob never saw alice nearby");

    // Direct delivery: the bytes arrive at Bob, from Alice, stored before the answer.
    let v = alice.deliver(BOB, 1024, 0);
    assert_eq!(v["result"], "stored", "{v}");
    let got = bob.next("inbound", Duration::from_secs(5)).expect("bob got nothing");
    assert_eq!((got["contacts"].clone(), got["len"].clone()), (json!([ALICE]), json!(1024)));
    // 64 KiB minus the frame header goes direct; one byte more is refused before sending.
    assert_eq!(alice.deliver(BOB, 65_533, 1)["result"], "stored");
    let too_big = alice.deliver(BOB, 65_534, 2);
    assert_eq!(too_big["ok"], false);
    assert!(too_big["result"].as_str().unwrap().contains("64 KiB"), "{too_big}");

    // Latency of direct delivery (1 KiB, receiver commits with fsync before answering).
    let mut latency = Vec::new();
    for seq in 10..210 {
        let v = alice.deliver(BOB, 1024, seq);
        assert_eq!(v["result"], "stored", "{v}");
        latency.push(v["us"].as_f64().unwrap() / 1000.0);
    }
    latency.sort_by(f64::total_cmp);

    // Strangers: Carol (foreign) and Dave (expired) never become nearby to anyone and cannot
    // deliver; Alice and Bob never list them.
    let carol_sets = carol.nearby_sets(Duration::from_secs(3));
    assert!(carol_sets.iter().all(Vec::is_empty), "carol saw {carol_sets:?}");
    assert_eq!(dave.deliver(ALICE, 100, 300)["result"], "contact is not nearby");
    assert!(!alice.deliver(DAVE, 100, 301)["ok"].as_bool().unwrap(), "alice delivered to expired dave");
    let dave_sets = dave.nearby_sets(Duration::from_millis(200));
    assert!(dave_sets.iter().all(Vec::is_empty), "dave saw {dave_sets:?}");
    for set in alice.nearby_sets(Duration::from_millis(200)) {
        assert!(!set.contains(&DAVE) && !set.contains(&CAROL), "alice listed {set:?}");
    }
    let alice_log = std::fs::read_to_string(std::env::temp_dir().join(format!("lan-node-{a}.log"))).unwrap();
    assert!(alice_log.contains("binding expired"), "alice did not refuse dave's expired binding");
    assert!(alice_log.contains("no binding is signed by a pinned contact"), "alice did not refuse carol");

    // Cut Alice from Bob: the next delivery fails within the timeout (the engine then takes the
    // relay), and Bob stops being nearby.
    lan.isolate(1, true);
    lan.isolate(2, true);
    let t = Instant::now();
    let v = alice.deliver(BOB, 1024, 400);
    let took = t.elapsed();
    assert_eq!(v["ok"], false, "{v}");
    assert!(took < Duration::from_millis(2_600), "failure took {took:?}");
    // Bob is no longer nearby: the next delivery is refused at once, without trying the link.
    // (The `nearby` event itself came before the failed delivery's answer, which `deliver`
    // read past.)
    let t = Instant::now();
    assert_eq!(alice.deliver(BOB, 1024, 401)["result"], "contact is not nearby", "bob still nearby after the cut");
    assert!(t.elapsed() < Duration::from_millis(500), "the refusal tried the link: {:?}", t.elapsed());

    println!(
        "LAN discovery (both started -> both nearby), 10 rounds: p50 {:.0} ms, p95 {:.0} ms",
        percentile(&discovery, 0.5),
        percentile(&discovery, 0.95)
    );
    println!(
        "LAN direct delivery 1 KiB (deliver -> Stored after receiver fsync), 200: p50 {:.2} ms, p95 {:.2} ms",
        percentile(&latency, 0.5),
        percentile(&latency, 0.95)
    );
    println!("isolated delivery failed after {} ms", took.as_millis());
    drop((alice, bob, carol, dave));
}

/// A relay announcement as lan-node takes it.
fn relay(url: &str, cert: u8, expires_at_ms: Option<i64>, signer: Option<u8>) -> Value {
    let mut v = json!({"url": url, "cert_sha256": hex(&[cert; 32])});
    if let Some(e) = expires_at_ms {
        v["expires_at_ms"] = json!(e);
    }
    if let Some(n) = signer {
        v["signer_seed"] = json!(hex(&identity(n)));
    }
    v
}

#[test]
fn a_relay_is_taken_only_from_a_bound_contact_that_signed_it_itself() {
    const ERIN: i64 = 5;
    let Some(mut lan) = Lan::create("r") else { return };
    let a = lan.add_host(1);
    let b = lan.add_host(2);
    let c = lan.add_host(3);
    let d = lan.add_host(4);
    let e = lan.add_host(5);

    // Bob pins alice, dave and erin; all three pin bob, so each binds both ways. Alice announces
    // her relay honestly; dave announces one signed by a key he never proved (alice's, say: a
    // forger who got hold of nothing but her public key would sign with his own); erin's
    // announcement expired an hour ago. Carol announces too, but bob never pinned her.
    let bob = Node::spawn(&b, 2, pins(&[(1, ALICE), (4, DAVE), (5, ERIN)]), None);
    let _alice =
        Node::spawn_announcing(&a, 1, pins(&[(2, BOB)]), None, relay("https://198.18.0.1:8443", 0xa1, None, None));
    let _carol =
        Node::spawn_announcing(&c, 3, pins(&[(2, BOB)]), None, relay("https://198.18.0.3:8443", 0xc3, None, None));
    let _dave =
        Node::spawn_announcing(&d, 4, pins(&[(2, BOB)]), None, relay("https://198.18.0.4:8443", 0xd4, None, Some(9)));
    let _erin = Node::spawn_announcing(
        &e,
        5,
        pins(&[(2, BOB)]),
        None,
        relay("https://198.18.0.5:8443", 0xe5, Some(now_ms() - 3_600_000), None),
    );

    let deadline = Instant::now() + Duration::from_secs(45);
    let mut nearby = Vec::new();
    let mut relays = Vec::new();
    // Until all three contacts are nearby, then a few seconds more for any late announcement.
    let mut settle: Option<Instant> = None;
    while Instant::now() < deadline && settle.is_none_or(|t| t.elapsed() < Duration::from_secs(4)) {
        let Ok(v) = bob.events.recv_timeout(Duration::from_millis(200)) else { continue };
        match v["event"].as_str() {
            Some("nearby") => {
                nearby = v["contacts"].as_array().unwrap().iter().map(|c| c.as_i64().unwrap()).collect();
                if [ALICE, DAVE, ERIN].iter().all(|c| nearby.contains(c)) {
                    settle.get_or_insert_with(Instant::now);
                }
            }
            Some("relay") => relays.push(v["relay"].clone()),
            _ => {}
        }
    }
    assert!(settle.is_some(), "alice, dave and erin never all nearby at bob (last: {nearby:?})");
    assert_eq!(
        relays,
        vec![json!({"contact": ALICE, "url": "https://198.18.0.1:8443", "cert_sha256": hex(&[0xa1; 32])})],
        "bob took other relays than alice's"
    );
    let log = std::fs::read_to_string(std::env::temp_dir().join(format!("lan-node-{b}.log"))).unwrap_or_default();
    assert!(
        log.contains("relay announcement from") && log.contains("not signed by the announcing contact"),
        "dave's forgery was not refused"
    );
    assert!(log.contains("relay announcement expired"), "erin's expired announcement was not refused");
}
