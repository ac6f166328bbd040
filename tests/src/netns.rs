//! A test LAN out of network namespaces: one namespace holds a bridge, each host namespace is
//! joined to it by a veth pair, addresses are in 198.18.0.0/24 (the benchmarking range, never a
//! real network). mDNS runs only inside these namespaces, never in the root one.
//!
//! Every namespace is deleted when the [`Lan`] is dropped, also when a test panics.
//! `SWITCHBOARD_REQUIRE_NETNS=1` turns "cannot create namespaces" from a skip into a failure.

use std::process::{Command, Output};

/// A bridge namespace and the host namespaces on it.
pub struct Lan {
    prefix: String,
    namespaces: Vec<String>,
}

fn run(args: &[&str]) -> Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn must(args: &[&str]) {
    let out = run(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

impl Lan {
    /// Creates the bridge namespace, or says why it cannot (not root, no `ip`, no netns support).
    /// With `SWITCHBOARD_REQUIRE_NETNS=1` a failure panics instead.
    pub fn create(tag: &str) -> Option<Lan> {
        let required = std::env::var("SWITCHBOARD_REQUIRE_NETNS").is_ok_and(|v| v == "1");
        let prefix = format!("sb{tag}{}", std::process::id() % 100_000);
        let bridge_ns = format!("{prefix}-br");
        let lan = Lan { prefix, namespaces: Vec::new() };
        let out = Command::new("ip").args(["netns", "add", &bridge_ns]).output();
        let why = match out {
            Err(e) => Some(format!("cannot run `ip` ({e}); install iproute2")),
            Ok(o) if !o.status.success() => {
                Some(format!("cannot create a network namespace: {}", String::from_utf8_lossy(&o.stderr).trim()))
            }
            Ok(_) => None,
        };
        if let Some(why) = why {
            assert!(!required, "SWITCHBOARD_REQUIRE_NETNS=1 but {why}");
            eprintln!("SKIP: {why} (needs root and iproute2; set SWITCHBOARD_REQUIRE_NETNS=1 to fail instead)");
            return None;
        }
        let mut lan = lan;
        lan.namespaces.push(bridge_ns.clone());
        must(&["ip", "-n", &bridge_ns, "link", "add", "br0", "type", "bridge"]);
        must(&["ip", "-n", &bridge_ns, "link", "set", "br0", "up"]);
        must(&["ip", "-n", &bridge_ns, "link", "set", "lo", "up"]);
        Some(lan)
    }

    /// The bridge namespace's name.
    pub fn bridge_ns(&self) -> &str {
        &self.namespaces[0]
    }

    /// Adds host namespace number `n` (1..=250) with address 198.18.0.`n`/24; returns its name.
    pub fn add_host(&mut self, n: u8) -> String {
        let ns = format!("{}-h{n}", self.prefix);
        must(&["ip", "netns", "add", &ns]);
        self.namespaces.push(ns.clone());
        let br = self.bridge_ns().to_owned();
        let port = format!("p{n}");
        let tmp = format!("sbv{}x{n}", std::process::id() % 100_000);
        // Made in the host namespace, then its peer moved to the bridge namespace: no interface
        // ever appears in the root namespace under a fixed name.
        must(&["ip", "-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &tmp]);
        must(&["ip", "-n", &ns, "link", "set", &tmp, "netns", &br]);
        must(&["ip", "-n", &br, "link", "set", &tmp, "name", &port]);
        must(&["ip", "-n", &br, "link", "set", &port, "master", "br0"]);
        must(&["ip", "-n", &br, "link", "set", &port, "up"]);
        must(&["ip", "-n", &ns, "addr", "add", &format!("198.18.0.{n}/24"), "dev", "eth0"]);
        must(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
        must(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        ns
    }

    /// The address of host `n`.
    pub fn addr(n: u8) -> String {
        format!("198.18.0.{n}")
    }

    /// Isolates (or rejoins) host `n`'s bridge port: isolated ports cannot reach each other but
    /// still reach ports that are not isolated.
    pub fn isolate(&self, n: u8, on: bool) {
        must(&[
            "ip",
            "-n",
            self.bridge_ns(),
            "link",
            "set",
            &format!("p{n}"),
            "type",
            "bridge_slave",
            "isolated",
            if on { "on" } else { "off" },
        ]);
    }

    /// A command run inside namespace `ns`.
    pub fn command(ns: &str, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            let out = run(&["ip", "netns", "del", ns]);
            if !out.status.success() {
                eprintln!("could not delete namespace {ns}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }
}
