//! A LAN node on its own, for tests that run it inside a network namespace
//! (`ip netns exec NS lan-node CONFIG_JSON`): one process per namespace, since a process cannot
//! move its tasks between namespaces.
//!
//! Config (JSON argument): `identity_seed` (hex, 32 bytes), `lan_seed` (hex), `binding_expiry_ms`
//! (optional: sign an expired or odd binding), `pins` ({hex identity key: contact id}), `store`
//! (a file where deliveries are committed), `keepalive_ms` (optional), `relay` (optional: a
//! relay to announce, `{url, cert_sha256, expires_at_ms, signer_seed}`; the last two let a test
//! announce an expired one or sign it with a key that is not the node's identity).
//!
//! Prints JSON lines: `started` (peer id, ms since start), `nearby` (contact ids, ms since start)
//! on every change, `relay` (contact, url, cert_sha256) when a contact's announcement verified, `delivered` (seq, result, latency µs), `inbound` (contacts, protocol, len).
//! Reads commands: `deliver CONTACT SIZE SEQ`, `quit`. A delivery is answered `Stored` only after
//! it is appended to `store` and fsynced.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use serde_json::{Value, json};
use switchboard_core::protocol::lan::{LanBinding, LanKey, ProtocolTag, RelayAnnouncement};
use switchboard_core::transport::lan::{self, LanConfig, LanIdentity};
use switchboard_core::util::{hex_decode, now_ms};
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

fn seed(v: &Value, field: &str) -> [u8; 32] {
    hex_decode(v[field].as_str().unwrap_or_else(|| panic!("{field} missing"))).unwrap().try_into().unwrap()
}

fn emit(v: Value) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}").unwrap();
    out.flush().unwrap();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "switchboard_core=debug".into()))
        .with_writer(std::io::stderr)
        .init();
    let config: Value = serde_json::from_str(&std::env::args().nth(1).expect("config JSON argument")).unwrap();
    let start = Instant::now();
    let identity = SigningKey::from_bytes(&seed(&config, "identity_seed"));
    let mut secret = seed(&config, "lan_seed").to_vec();
    secret.extend_from_slice(&now_ms().to_be_bytes());
    let key = LanKey::from_secret(&secret).unwrap();
    let expiry = config["binding_expiry_ms"].as_i64().unwrap_or_else(|| key.binding_expiry());
    let bindings = vec![LanBinding::sign(&identity, &key.peer_id_bytes(), expiry)];
    let pins: BTreeMap<[u8; 32], i64> = config["pins"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (hex_decode(k).unwrap().try_into().unwrap(), v.as_i64().unwrap()))
        .collect();
    let (_pin_tx, pin_rx) = watch::channel(Arc::new(pins));
    let mut cfg = LanConfig::default();
    if let Some(ms) = config["keepalive_ms"].as_u64() {
        cfg.keepalive = Duration::from_millis(ms);
    }
    let relay = config.get("relay").filter(|r| !r.is_null()).map(|r| {
        let signer =
            r.get("signer_seed").map_or_else(|| identity.clone(), |_| SigningKey::from_bytes(&seed(r, "signer_seed")));
        let expiry = r["expires_at_ms"].as_i64().unwrap_or(expiry);
        RelayAnnouncement::sign(&signer, r["url"].as_str().unwrap(), seed(r, "cert_sha256"), expiry).unwrap()
    });
    let (handle, mut inbound) = lan::start(LanIdentity { key, bindings, relay }, pin_rx, cfg).unwrap();
    emit(json!({"event": "started", "peer_id": handle.peer_id(), "ms": start.elapsed().as_millis() as u64}));

    // Nearby changes.
    let mut nearby = handle.watch_nearby();
    tokio::spawn(async move {
        while nearby.changed().await.is_ok() {
            let set: Vec<i64> = nearby.borrow_and_update().iter().copied().collect();
            emit(json!({"event": "nearby", "contacts": set, "ms": start.elapsed().as_millis() as u64}));
        }
    });

    // Relays contacts announced.
    let mut relays = handle.watch_relays();
    tokio::spawn(async move {
        while relays.changed().await.is_ok() {
            let all: Vec<Value> = relays
                .borrow_and_update()
                .iter()
                .map(|(c, r)| json!({"contact": c, "url": r.url, "cert_sha256": switchboard_core::util::hex(&r.cert_sha256)}))
                .collect();
            for r in all {
                emit(json!({"event": "relay", "relay": r}));
            }
        }
    });

    // Deliveries to us: commit (append + fsync), then answer.
    let store_path = config["store"].as_str().unwrap().to_owned();
    tokio::spawn(async move {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&store_path).unwrap();
        while let Some(msg) = inbound.recv().await {
            let sealed = msg.delivery.sealed();
            file.write_all(&(sealed.len() as u32).to_be_bytes()).unwrap();
            file.write_all(sealed).unwrap();
            file.sync_data().unwrap();
            emit(json!({
                "event": "inbound",
                "contacts": msg.contacts,
                "protocol": msg.delivery.protocol().as_str(),
                "len": sealed.len(),
            }));
            msg.reply.stored();
        }
    });

    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["deliver", contact, size, seq] => {
                let (contact, size): (i64, usize) = (contact.parse().unwrap(), size.parse().unwrap());
                let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
                let t = Instant::now();
                let result = handle.deliver(contact, ProtocolTag::Letagents, bytes).await;
                emit(json!({
                    "event": "delivered",
                    "seq": seq,
                    "ok": result.is_ok(),
                    "result": match &result { Ok(_) => "stored".to_owned(), Err(e) => e.to_string() },
                    "us": t.elapsed().as_micros() as u64,
                }));
            }
            ["quit"] => break,
            _ => emit(json!({"event": "error", "line": line})),
        }
    }
    handle.shutdown().await;
}
