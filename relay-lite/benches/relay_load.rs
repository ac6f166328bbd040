//! relay-lite under load on loopback, each figure a ratio against a baseline measured in the same
//! process run. The machine is small and noisy, so baseline and relay rounds alternate (ABBA
//! order) and the summary gives medians over the rounds.
//!
//! - Send throughput: `RELAY_LOAD_CLIENTS` (32) keep-alive HTTP/1.1 clients post real sealed
//!   letagents envelopes (1087 bytes, sealed before the clock starts) to `POST /v1/send/{id}`
//!   across `RELAY_LOAD_MAILBOXES` (8) mailboxes whose owners logged in first; only `202`s count.
//!   Baseline: a bare axum route that does one sqlx `INSERT` of the body per request on a pool
//!   (`RELAY_LOAD_BASELINE_POOL`, default 10: sqlx's default and the fastest of 1, 4 and 10 on
//!   the 2-core machine), same pragmas (WAL, `synchronous=FULL`), same clients, bodies and URLs.
//! - The honest baseline for both: a bare axum + sqlx server with the same group commit as
//!   relay-lite (one writer task, one transaction and one fsync per batch of queued writes, WAL,
//!   `synchronous=FULL`, cached statements), which also hands each committed body straight to the
//!   websockets watching its mailbox (`support::start_group_commit_baseline`). Throughput rounds
//!   alternate relay-lite and this loop; the per-request baseline runs in the same rounds.
//! - Flatness: `RELAY_LOAD_PREFILL` (10,000) envelopes are left waiting first, then the same
//!   load runs `RELAY_LOAD_FLAT_WARMUP_SECS` (2, not counted: fresh connections ramp up) and
//!   then `RELAY_LOAD_FLAT_SECS` (10) counted seconds; the first and last whole counted seconds
//!   are compared, for relay-lite and for the group-commit loop.
//! - Send-to-delivery latency: the recipient holds the inbox websocket (`RelayClient::connect`,
//!   a signed login) and one sender posts one envelope at a time; a sample runs from the start of
//!   the POST until the `msg` frame arrives. The recipient does not ack (the mailbox limit is
//!   raised), so every sample is one deposit commit and nothing else. Baseline: a bare axum route
//!   echoing the same body, timed with the same reqwest client to the end of the response body,
//!   and the group-commit loop's send to its websocket frame (same client, same JSON framing).
//!
//! - Stringcup: the same loads as Stringcup sends (bearer tokens, sealed messages as JSON, `201`)
//!   and a recipient parked in `GET /api/v2/messages?wait=25`. Baselines: the group-commit loop
//!   storing the same bodies; that loop doing Stringcup's least durable work (`Check::Numbered`:
//!   the route's body checks, both numberings kept durably, the pending limits); and that loop
//!   answering a parked long-poll (`GET /poll/{id}`), timed as relay-lite's long-poll is.
//!
//! `cargo bench -p relay-lite --bench relay_load`; `RELAY_LOAD_SCALE=0.2` shortens every phase for
//! a quick run, `RELAY_LOAD_ROUNDS` (3) sets the number of rounds; `RELAY_LOAD_PROFILE=relay`
//! (or `group`) runs one side's throughput alone, for a profiler attached to the process
//! (`stringcup`: the Stringcup latency run alone, then the loop's long-poll and websocket;
//! `stringcup-send`: Stringcup throughput, relay-lite alone; `stringcup-minimum`: the plain loop
//! and the minimum loop on the Stringcup load).

// A bench, not library code: a failed setup or a wrong answer should stop the run loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::post;
use futures_util::StreamExt as _;
use relay_lite::{Config, RunningRelay};
use support::{
    Check, ClientWork, Load, Pairs, env_or, http_client, leave_waiting, median, percentile_ms, post_load, serve,
    start_group_commit_baseline, start_group_commit_baseline_checked, start_insert_baseline,
};
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::protocol::letagents::wire::RelayToClient;
use switchboard_core::protocol::letagents::{Inner, Kind, MIN_ENVELOPE, seal};
use switchboard_core::transport::letagents::{RelayClient, RelaySocket};
use switchboard_core::util::{OsRng, b64u, now_ms};
use tokio_tungstenite::tungstenite::Message;

/// Characters of message text: with the signature and JSON framing the plaintext just fits one
/// 1024-byte block, so every envelope is the smallest sealed size (1087 bytes).
const TEXT_CHARS: usize = 500;
/// Distinct sealed envelopes per mailbox, cycled by the senders (the relay treats bodies as
/// opaque, so reuse costs it nothing it would not pay for fresh ones).
const BODIES_PER_MAILBOX: usize = 128;
/// Distinct sealed Stringcup messages per client (sealed per run: ids are drawn at registration).
const STRINGCUP_BODIES_PER_CLIENT: usize = 16;

/// Knobs, from the environment.
#[derive(Debug, Clone)]
struct Settings {
    scale: f64,
    rounds: usize,
    clients: usize,
    mailboxes: usize,
    baseline_pool: u32,
    warmup: Duration,
    measure: Duration,
    latency_warmup: usize,
    latency_samples: usize,
    prefill: usize,
    flat: Duration,
    flat_warmup: Duration,
}

impl Settings {
    fn from_env() -> Self {
        let scale: f64 = env_or("RELAY_LOAD_SCALE", 1.0_f64).clamp(0.01, 100.0);
        let scaled = |n: f64, min: f64| (n * scale).max(min);
        Self {
            scale,
            rounds: env_or("RELAY_LOAD_ROUNDS", 3_usize).max(1),
            clients: env_or("RELAY_LOAD_CLIENTS", 32_usize).max(1),
            mailboxes: env_or("RELAY_LOAD_MAILBOXES", 8_usize).max(1),
            baseline_pool: env_or("RELAY_LOAD_BASELINE_POOL", 10_u32).max(1),
            warmup: Duration::from_secs_f64(scaled(1.0, 0.2)),
            measure: Duration::from_secs_f64(scaled(4.0, 0.5)),
            latency_warmup: scaled(100.0, 5.0) as usize,
            latency_samples: scaled(2000.0, 20.0) as usize,
            prefill: env_or("RELAY_LOAD_PREFILL", 10_000_usize),
            flat: Duration::from_secs(env_or("RELAY_LOAD_FLAT_SECS", 10_u64).max(2)),
            flat_warmup: Duration::from_secs_f64(env_or("RELAY_LOAD_FLAT_WARMUP_SECS", 2.0_f64).max(0.0)),
        }
    }

    /// The command that reproduces this run.
    fn command(&self) -> String {
        support::command("RELAY_LOAD_", "relay_load")
    }
}

/// A logged-in mailbox as senders see it: its send path, drop header and sealed envelopes.
#[derive(Clone)]
struct Target {
    path: String,
    drop: String,
    bodies: Vec<Bytes>,
}

fn sealed(from: &DeviceIdentity, to: &DeviceIdentity) -> Bytes {
    let inner = Inner::new(
        &from.keys(),
        &to.keys().mailbox_id(),
        now_ms(),
        uuid::Uuid::new_v4(),
        Kind::Send,
        serde_json::Value::String("x".repeat(TEXT_CHARS)),
    );
    let json = serde_json::to_string(&inner).unwrap();
    let envelope = seal(&from.sig, &to.keys(), &json, &mut OsRng).unwrap();
    assert_eq!(envelope.len(), MIN_ENVELOPE, "envelope size drifted");
    Bytes::from(envelope)
}

fn target(sender: &DeviceIdentity, owner: &DeviceIdentity) -> Target {
    Target {
        path: format!("/v1/send/{}", owner.keys().mailbox_id()),
        drop: b64u(&owner.drop),
        bodies: (0..BODIES_PER_MAILBOX).map(|_| sealed(sender, owner)).collect(),
    }
}

/// relay-lite on a loopback port with the send limits out of the way.
async fn start_relay(dir: &Path) -> RunningRelay {
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir);
    config.limits.sends_per_minute = 0;
    config.limits.ip_requests_per_minute = 0;
    config.limits.mailbox_capacity = 1 << 40;
    relay_lite::spawn(config).await.unwrap()
}

/// Each client's work: client `c` posts to mailbox `c % n`, cycling its bodies from `c`.
fn client_work(targets: &[Target], s: &Settings) -> Vec<Arc<ClientWork>> {
    (0..s.clients)
        .map(|c| {
            let t = &targets[c % targets.len()];
            Arc::new(ClientWork {
                path: t.path.clone(),
                headers: vec![("x-la-drop", t.drop.clone()), ("content-type", "application/octet-stream".into())],
                bodies: t.bodies.clone(),
                first: c,
                cycle: true,
                stored: StatusCode::ACCEPTED,
            })
        })
        .collect()
}

async fn relay_throughput(owners: &[DeviceIdentity], targets: &[Target], s: &Settings) -> Load {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(dir.path()).await;
    let client = RelayClient::new(&relay.url(), None).unwrap();
    for owner in owners {
        // The first login creates the mailbox.
        client.inbox(&owner.sig, &owner.drop).await.unwrap();
    }
    let load = post_load(&relay.url(), &client_work(targets, s), s.warmup, s.measure).await;
    relay.shutdown().await.unwrap();
    load
}

async fn group_throughput(targets: &[Target], s: &Settings) -> Load {
    let dir = tempfile::tempdir().unwrap();
    let (addr, task, writer) = start_group_commit_baseline(dir.path(), "/v1/send/{id}").await;
    let load = post_load(&format!("http://{addr}"), &client_work(targets, s), s.warmup, s.measure).await;
    task.abort();
    writer.abort();
    load
}

/// Leaves `s.prefill` envelopes waiting at `base`, then runs the load for `s.flat_warmup` (not
/// counted: the measuring clients open fresh connections, and both servers' first second after
/// the prefill ramps up) and `s.flat` (counted, second by second). More envelopes keep
/// arriving during both, so at least `s.prefill` wait throughout the counted window.
async fn prefilled_load(base: &str, work: &[Arc<ClientWork>], s: &Settings) -> Load {
    leave_waiting(base, work, s.prefill).await;
    post_load(base, work, s.flat_warmup, s.flat).await
}

/// relay-lite with the Stringcup rate limits out of the way and room for every message the
/// load leaves waiting.
async fn start_stringcup_relay(dir: &Path) -> RunningRelay {
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir);
    config.limits.ip_requests_per_minute = 0;
    let sc = &mut config.limits.stringcup;
    sc.sends_per_hour = 0;
    sc.inbox_requests_per_hour = 0;
    sc.other_requests_per_hour = 0;
    sc.registrations_per_hour_per_ip = 0;
    sc.inbox_max_pending_messages = u64::MAX / 4;
    sc.inbox_max_pending_bytes = u64::MAX / 4;
    sc.inbox_max_pending_per_sender = u64::MAX / 4;
    sc.inbox_max_pending_bytes_per_sender = u64::MAX / 4;
    relay_lite::spawn(config).await.unwrap()
}

/// A Stringcup identity registered on `api` with key `secret`: (id, bearer token, public key).
async fn stringcup_register(http: &reqwest::Client, api: &str, secret: [u8; 32]) -> (String, String, [u8; 32]) {
    let public = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(secret)).to_bytes();
    let v: serde_json::Value = http
        .post(format!("{api}/identities"))
        .json(&serde_json::json!({"identity_public_key": data_encoding::BASE64.encode(&public), "algo": "x25519"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (v["id"].as_str().unwrap().to_owned(), v["api_token"].as_str().unwrap().to_owned(), public)
}

/// Stringcup senders and recipients registered on `relay`, and the sends of the load: client `c`
/// is a sender of its own and posts to recipient `c % s.mailboxes`, cycling sealed messages of
/// the letagents load's text (`POST /api/v2/messages`, bearer token, JSON, `201`). Also the same
/// bodies as the group-commit loop's work (posted to `/v1/send/{recipient}`, `202`).
async fn stringcup_work(relay: &RunningRelay, s: &Settings) -> (Vec<Arc<ClientWork>>, Vec<Arc<ClientWork>>) {
    use switchboard_core::protocol::stringcup::crypto;
    let http = http_client();
    let api = format!("{}/api/v2", relay.url());
    let mut recipients = Vec::new();
    for m in 0..s.mailboxes {
        recipients.push(stringcup_register(&http, &api, [u8::try_from(m % 200).unwrap() + 1; 32]).await);
    }
    let text = "x".repeat(TEXT_CHARS);
    let (mut relay_work, mut loop_work) = (Vec::new(), Vec::new());
    for c in 0..s.clients {
        let (sender, token, _) = stringcup_register(&http, &api, [201; 32]).await;
        let (recipient, _, key) = &recipients[c % recipients.len()];
        let bodies: Vec<Bytes> = (0..STRINGCUP_BODIES_PER_CLIENT)
            .map(|_| {
                let (header, ciphertext) = crypto::seal(&sender, recipient, key, &text, &mut OsRng).unwrap();
                let body = serde_json::json!({"recipient_id": recipient, "header": header, "ciphertext": ciphertext});
                Bytes::from(serde_json::to_vec(&body).unwrap())
            })
            .collect();
        relay_work.push(Arc::new(ClientWork {
            path: "/api/v2/messages".into(),
            headers: vec![("authorization", format!("Bearer {token}")), ("content-type", "application/json".into())],
            bodies: bodies.clone(),
            first: 0,
            cycle: true,
            stored: StatusCode::CREATED,
        }));
        loop_work.push(Arc::new(ClientWork {
            path: format!("/v1/send/{recipient}"),
            // The plain loop ignores the token; the minimum loop numbers the sender by it.
            headers: vec![("authorization", format!("Bearer {token}")), ("content-type", "application/json".into())],
            bodies,
            first: 0,
            cycle: true,
            stored: StatusCode::ACCEPTED,
        }));
    }
    (relay_work, loop_work)
}

/// The stateless checks a Stringcup relay makes of a send's body before storing it (B.2, as
/// relay-lite's route makes them): a JSON object with a recipient, a version-2 header of the one
/// algorithm whose ephemeral key and IV are base64 of 32 and 12 bytes, and a base64 ciphertext of
/// at least its 16-byte tag and at most 256 KiB.
fn stringcup_send_parses(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Header {
        version: u8,
        algo: String,
        ephemeral_pub: String,
        iv: String,
    }
    #[derive(serde::Deserialize)]
    struct Send {
        recipient_id: String,
        header: Header,
        ciphertext: String,
    }
    let decoded = |text: &str| data_encoding::BASE64.decode(text.as_bytes()).ok();
    let Ok(send) = serde_json::from_slice::<Send>(body) else { return false };
    let ciphertext = decoded(&send.ciphertext).map_or(0, |c| c.len());
    !send.recipient_id.is_empty()
        && send.header.version == 2
        && send.header.algo == switchboard_core::protocol::stringcup::crypto::ALGO
        && decoded(&send.header.ephemeral_pub).is_some_and(|k| k.len() == 32)
        && decoded(&send.header.iv).is_some_and(|iv| iv.len() == 12)
        && (16..=256 * 1024).contains(&ciphertext)
}

/// Stringcup durable sends: relay-lite, the group-commit loop storing the same bodies and, unless
/// `prefilled`, that loop doing Stringcup's least durable work ([`Check::Numbered`] with
/// [`stringcup_send_parses`]), the loops first when `loop_first`; with `prefilled`, after
/// [`prefilled_load`] (flatness). Returns (relay-lite, loop, minimum loop).
async fn stringcup_throughput(s: &Settings, loop_first: bool, prefilled: bool) -> (Load, Load, Option<Load>) {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_stringcup_relay(dir.path()).await;
    let (relay_work, loop_work) = stringcup_work(&relay, s).await;
    let run_loop = |check: Check| {
        let loop_work = &loop_work;
        async move {
            let dir = tempfile::tempdir().unwrap();
            let (addr, task, writer) = start_group_commit_baseline_checked(dir.path(), "/v1/send/{id}", check).await;
            let base = format!("http://{addr}");
            let load = if prefilled {
                prefilled_load(&base, loop_work, s).await
            } else {
                post_load(&base, loop_work, s.warmup, s.measure).await
            };
            task.abort();
            writer.abort();
            load
        }
    };
    let run_loops = || async {
        let group = run_loop(Check::None).await;
        let minimum = if prefilled { None } else { Some(run_loop(Check::Numbered(stringcup_send_parses)).await) };
        (group, minimum)
    };
    let loops = if loop_first { Some(run_loops().await) } else { None };
    let load = if prefilled {
        prefilled_load(&relay.url(), &relay_work, s).await
    } else {
        post_load(&relay.url(), &relay_work, s.warmup, s.measure).await
    };
    relay.shutdown().await.unwrap();
    let (group, minimum) = match loops {
        Some(loops) => loops,
        None => run_loops().await,
    };
    (load, group, minimum)
}

async fn relay_flat(owners: &[DeviceIdentity], targets: &[Target], s: &Settings) -> Load {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(dir.path()).await;
    let client = RelayClient::new(&relay.url(), None).unwrap();
    for owner in owners {
        client.inbox(&owner.sig, &owner.drop).await.unwrap();
    }
    let load = prefilled_load(&relay.url(), &client_work(targets, s), s).await;
    relay.shutdown().await.unwrap();
    load
}

async fn group_flat(targets: &[Target], s: &Settings) -> Load {
    let dir = tempfile::tempdir().unwrap();
    let (addr, task, writer) = start_group_commit_baseline(dir.path(), "/v1/send/{id}").await;
    let load = prefilled_load(&format!("http://{addr}"), &client_work(targets, s), s).await;
    task.abort();
    writer.abort();
    load
}

/// Send-to-delivery samples through the group-commit loop: POST start to its websocket frame.
async fn group_latency(http: &reqwest::Client, sender: &DeviceIdentity, s: &Settings) -> Vec<Duration> {
    let dir = tempfile::tempdir().unwrap();
    let (addr, task, writer) = start_group_commit_baseline(dir.path(), "/v1/send/{id}").await;
    let owner = DeviceIdentity::generate(&mut OsRng);
    let target = target(sender, &owner);
    let expected: Vec<String> = target.bodies.iter().map(|b| b64u(b)).collect();
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/ws/{}", owner.keys().mailbox_id())).await.unwrap();
    let url = format!("http://{addr}{}", target.path);
    let mut samples = Vec::with_capacity(s.latency_samples);
    for i in 0..s.latency_warmup + s.latency_samples {
        let n = i % target.bodies.len();
        let started = Instant::now();
        let post = async {
            let r = http
                .post(&url)
                .header("x-la-drop", &target.drop)
                .header("content-type", "application/octet-stream")
                .body(target.bodies[n].clone())
                .send()
                .await
                .unwrap();
            let status = r.status();
            r.bytes().await.unwrap();
            status
        };
        let delivered = async {
            loop {
                let message = tokio::time::timeout(Duration::from_secs(10), ws.next())
                    .await
                    .expect("no frame within 10 s")
                    .expect("websocket closed")
                    .unwrap();
                if let Message::Text(text) = message {
                    let v: serde_json::Value = serde_json::from_str(text.as_str()).unwrap();
                    return (started.elapsed(), v["ct"].as_str().unwrap().to_owned());
                }
            }
        };
        let (status, (took, ct)) = tokio::join!(post, delivered);
        assert_eq!(status, StatusCode::ACCEPTED);
        assert!(ct == expected[n], "the websocket delivered a different envelope");
        if i >= s.latency_warmup {
            samples.push(took);
        }
    }
    drop(ws);
    task.abort();
    writer.abort();
    samples
}

async fn baseline_throughput(targets: &[Target], s: &Settings) -> Load {
    let dir = tempfile::tempdir().unwrap();
    let (addr, task, pool) = start_insert_baseline(dir.path(), "/v1/send/{id}", s.baseline_pool).await;
    let load = post_load(&format!("http://{addr}"), &client_work(targets, s), s.warmup, s.measure).await;
    task.abort();
    pool.close().await;
    load
}

async fn next_frame(ws: &mut RelaySocket) -> RelayToClient {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("no frame within 10 s")
            .expect("websocket closed")
            .unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(text.as_str()).unwrap();
        }
    }
}

/// Send-to-delivery samples through relay-lite: POST start to the `msg` frame on the websocket.
async fn relay_latency(http: &reqwest::Client, sender: &DeviceIdentity, s: &Settings) -> Vec<Duration> {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(dir.path()).await;
    let owner = DeviceIdentity::generate(&mut OsRng);
    let target = target(sender, &owner);
    let expected: Vec<String> = target.bodies.iter().map(|b| b64u(b)).collect();
    let mut ws = RelayClient::new(&relay.url(), None).unwrap().connect(&owner.sig, &owner.drop).await.unwrap();
    assert_eq!(next_frame(&mut ws).await, RelayToClient::Ready);
    let url = format!("{}{}", relay.url(), target.path);
    let mut samples = Vec::with_capacity(s.latency_samples);
    for i in 0..s.latency_warmup + s.latency_samples {
        let n = i % target.bodies.len();
        let started = Instant::now();
        let post = async {
            let r = http
                .post(&url)
                .header("x-la-drop", &target.drop)
                .header("content-type", "application/octet-stream")
                .body(target.bodies[n].clone())
                .send()
                .await
                .unwrap();
            let status = r.status();
            r.bytes().await.unwrap();
            status
        };
        let delivered = async {
            loop {
                if let RelayToClient::Msg { ct, .. } = next_frame(&mut ws).await {
                    return (started.elapsed(), ct);
                }
            }
        };
        let (status, (took, ct)) = tokio::join!(post, delivered);
        assert_eq!(status, StatusCode::ACCEPTED);
        assert!(ct == expected[n], "the websocket delivered a different envelope");
        if i >= s.latency_warmup {
            samples.push(took);
        }
    }
    drop(ws);
    relay.shutdown().await.unwrap();
    samples
}

/// One long-poll sample: `poll`'s request goes out on a task of its own and parks for 2 ms, then
/// `send` starts. Returns the page, the time from the send's start to the page having arrived and
/// parsed (whether or not the send's answer has, as a websocket sample ends at its frame), the
/// send's status and the time to its answer. (The page is awaited on its own task: on this
/// 2-core machine that measured up to 0.2 ms lower than awaiting it with the send on one task, as
/// the websocket samples do, so a long-poll is not made to look slower than it is.)
async fn parked_then_sent(
    poll: reqwest::RequestBuilder,
    send: reqwest::RequestBuilder,
) -> (serde_json::Value, Duration, StatusCode, Duration) {
    let poll = tokio::spawn(async move {
        let page: serde_json::Value = poll.send().await.unwrap().json().await.unwrap();
        (page, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert!(!poll.is_finished(), "the long-poll answered before anything was sent");
    let started = Instant::now();
    let sent = send.send().await.unwrap();
    let status = sent.status();
    sent.bytes().await.unwrap();
    let send_took = started.elapsed();
    let (page, arrived) = poll.await.unwrap();
    (page, arrived.duration_since(started), status, send_took)
}

/// Stringcup: (send `201` latency, send-to-long-poll delivery latency) with a recipient parked in
/// `GET /api/v2/messages?wait=25`; each sample is acked outside the timed window.
async fn stringcup_latency(http: &reqwest::Client, s: &Settings) -> (Vec<Duration>, Vec<Duration>) {
    use switchboard_core::protocol::stringcup::crypto;
    let dir = tempfile::tempdir().unwrap();
    let relay = start_stringcup_relay(dir.path()).await;
    let api = format!("{}/api/v2", relay.url());
    let (alice, alice_token, _) = stringcup_register(http, &api, [1; 32]).await;
    let (bob, bob_token, bob_key) = stringcup_register(http, &api, [2; 32]).await;
    let text = "x".repeat(TEXT_CHARS);
    let send_url = format!("{api}/messages");
    let mut sends = Vec::with_capacity(s.latency_samples);
    let mut deliveries = Vec::with_capacity(s.latency_samples);
    for i in 0..s.latency_warmup + s.latency_samples {
        let (header, ciphertext) = crypto::seal(&alice, &bob, &bob_key, &text, &mut OsRng).unwrap();
        // Serialized before the clock starts, as the loop's bodies are sealed before theirs.
        let body = serde_json::json!({"recipient_id": bob, "header": header, "ciphertext": ciphertext});
        let body = Bytes::from(serde_json::to_vec(&body).unwrap());
        // Park the recipient first, then send. The delivery is timed as the loop's websocket
        // frame is: when the page has arrived, whether or not the send's answer has.
        let poll = http.get(format!("{api}/messages?wait=25")).bearer_auth(&bob_token);
        let send = http
            .post(&send_url)
            .bearer_auth(&alice_token)
            .header("Idempotency-Key", format!("k{i}"))
            .header("content-type", "application/json")
            .body(body);
        let (page, delivered, status, send_took) = parked_then_sent(poll, send).await;
        assert_eq!(status, StatusCode::CREATED);
        let ids: Vec<i64> = page["messages"].as_array().unwrap().iter().map(|m| m["id"].as_i64().unwrap()).collect();
        assert_eq!(ids.len(), 1, "the long-poll returned {page}");
        http.post(format!("{api}/messages/ack"))
            .bearer_auth(&bob_token)
            .json(&serde_json::json!({"ids": ids}))
            .send()
            .await
            .unwrap();
        if i >= s.latency_warmup {
            sends.push(send_took);
            deliveries.push(delivered);
        }
    }
    relay.shutdown().await.unwrap();
    (sends, deliveries)
}

/// Send-to-long-poll samples through the group-commit loop, taken as [`stringcup_latency`] takes
/// relay-lite's: the recipient is parked in `GET /poll/{id}` (its own connection, on a task of its
/// own) 2 ms before the POST of the same kind of sealed Stringcup JSON body starts, and a sample
/// ends when the page has arrived and parsed; the page must carry exactly that body.
async fn group_poll_latency(http: &reqwest::Client, s: &Settings) -> Vec<Duration> {
    use switchboard_core::protocol::stringcup::crypto;
    let dir = tempfile::tempdir().unwrap();
    let (addr, task, writer) = start_group_commit_baseline(dir.path(), "/v1/send/{id}").await;
    let (alice, bob) = ("sc-alice", "sc-bob");
    let bob_key = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([2; 32])).to_bytes();
    let text = "x".repeat(TEXT_CHARS);
    let send_url = format!("http://{addr}/v1/send/{bob}");
    let poll_url = format!("http://{addr}/poll/{bob}");
    let mut samples = Vec::with_capacity(s.latency_samples);
    for i in 0..s.latency_warmup + s.latency_samples {
        let (header, ciphertext) = crypto::seal(alice, bob, &bob_key, &text, &mut OsRng).unwrap();
        let body = serde_json::json!({"recipient_id": bob, "header": header, "ciphertext": ciphertext});
        let body = Bytes::from(serde_json::to_vec(&body).unwrap());
        let expected = b64u(&body);
        let send = http.post(&send_url).header("content-type", "application/json").body(body);
        let (page, delivered, status, _) = parked_then_sent(http.get(&poll_url), send).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        let messages = page["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 1, "the long-poll returned {page}");
        assert!(messages[0]["ct"].as_str() == Some(expected.as_str()), "the long-poll delivered a different body");
        if i >= s.latency_warmup {
            samples.push(delivered);
        }
    }
    task.abort();
    writer.abort();
    samples
}

/// Round trips of the same body through a bare axum echo route.
async fn echo_latency(http: &reqwest::Client, body: &Bytes, s: &Settings) -> Vec<Duration> {
    let router = Router::new().route("/echo", post(|body: Bytes| async move { body }));
    let (addr, task) = serve(router).await;
    let url = format!("http://{addr}/echo");
    let mut samples = Vec::with_capacity(s.latency_samples);
    for i in 0..s.latency_warmup + s.latency_samples {
        let started = Instant::now();
        let r =
            http.post(&url).header("content-type", "application/octet-stream").body(body.clone()).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let echoed = r.bytes().await.unwrap();
        let took = started.elapsed();
        assert_eq!(echoed.len(), body.len());
        if i >= s.latency_warmup {
            samples.push(took);
        }
    }
    task.abort();
    samples
}

#[tokio::main]
async fn main() {
    relay_lite::tls::install_default_provider();
    let s = Settings::from_env();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    println!(
        "relay_load: {cores} cores, scale {}, {} rounds, {} clients over {} mailboxes, \
         baseline pool {}, {:?} warm-up + {:?} per throughput run, {} (+{} warm-up) latency \
         samples per run",
        s.scale,
        s.rounds,
        s.clients,
        s.mailboxes,
        s.baseline_pool,
        s.warmup,
        s.measure,
        s.latency_samples,
        s.latency_warmup,
    );

    let sender = DeviceIdentity::generate(&mut OsRng);
    let owners: Vec<DeviceIdentity> = (0..s.mailboxes).map(|_| DeviceIdentity::generate(&mut OsRng)).collect();
    let targets: Vec<Target> = owners.iter().map(|o| target(&sender, o)).collect();

    // One side alone, for a profiler attached to the whole process (`perf record`, `perf stat`):
    // `RELAY_LOAD_PROFILE=relay` or `group` runs that side's throughput once and stops.
    if let Ok(side) = std::env::var("RELAY_LOAD_PROFILE") {
        let load = match side.as_str() {
            "relay" => relay_throughput(&owners, &targets, &s).await,
            "group" => group_throughput(&targets, &s).await,
            "stringcup-send" => stringcup_throughput(&s, false, false).await.0,
            "stringcup-minimum" => {
                let (_, group, minimum) = stringcup_throughput(&s, true, false).await;
                let minimum = minimum.unwrap();
                println!(
                    "  group-commit loop {:.0}/s ({} failed), the loop doing Stringcup's least durable work {:.0}/s \
                     ({} failed)",
                    group.per_sec, group.failed, minimum.per_sec, minimum.failed
                );
                return;
            }
            "stringcup" => {
                let http = http_client();
                let (send, delivery) = stringcup_latency(&http, &s).await;
                let polled = group_poll_latency(&http, &s).await;
                let watched = group_latency(&http, &sender, &s).await;
                println!(
                    "  stringcup alone: send p50 {:.3} ms, long-poll delivery p50 {:.3} ms; the group-commit loop's \
                     send to long-poll p50 {:.3} ms, to websocket p50 {:.3} ms",
                    percentile_ms(&send, 50.0),
                    percentile_ms(&delivery, 50.0),
                    percentile_ms(&polled, 50.0),
                    percentile_ms(&watched, 50.0)
                );
                return;
            }
            other => panic!(
                "RELAY_LOAD_PROFILE={other:?}: expected relay, group, stringcup, stringcup-send or stringcup-minimum"
            ),
        };
        println!("  {side} alone: {:.0}/s ({} failed), per second {:?}", load.per_sec, load.failed, load.per_second);
        return;
    }

    let mut throughput = Pairs::default();
    let mut grouped = Pairs::default();
    let mut failures = (0_u64, 0_u64);
    for round in 0..s.rounds {
        let (relay, group) = if round % 2 == 0 {
            let g = group_throughput(&targets, &s).await;
            (relay_throughput(&owners, &targets, &s).await, g)
        } else {
            let r = relay_throughput(&owners, &targets, &s).await;
            (r, group_throughput(&targets, &s).await)
        };
        let baseline = baseline_throughput(&targets, &s).await;
        println!(
            "  throughput round {}: relay-lite {:>8.0}/s ({} failed), group-commit loop {:>8.0}/s ({} failed), \
             per-request INSERT {:>8.0}/s ({} failed)",
            round + 1,
            relay.per_sec,
            relay.failed,
            group.per_sec,
            group.failed,
            baseline.per_sec,
            baseline.failed
        );
        failures.0 += relay.failed;
        failures.1 += baseline.failed + group.failed;
        throughput.push(relay.per_sec, baseline.per_sec);
        grouped.push(relay.per_sec, group.per_sec);
    }

    // Of a per-second series: the last three seconds over the first three.
    let thirds_of = |per_second: &[u64]| {
        let n = per_second.len().min(3);
        let sum = |s: &[u64]| s.iter().sum::<u64>() as f64;
        sum(&per_second[per_second.len() - n..]) / sum(&per_second[..n])
    };
    let mut first = Pairs::default();
    let mut last = Pairs::default();
    let mut flat_window = Pairs::default();
    let mut thirds = Pairs::default();
    for round in 0..s.rounds {
        let (relay, group) = if round % 2 == 0 {
            let g = group_flat(&targets, &s).await;
            (relay_flat(&owners, &targets, &s).await, g)
        } else {
            let r = relay_flat(&owners, &targets, &s).await;
            (r, group_flat(&targets, &s).await)
        };
        println!(
            "  flatness round {} ({} waiting first): relay-lite per second {:?}, group-commit loop per second {:?}",
            round + 1,
            s.prefill,
            relay.per_second,
            group.per_second
        );
        failures.0 += relay.failed;
        failures.1 += group.failed;
        let (rf, rl) = (relay.per_second[0] as f64, *relay.per_second.last().unwrap() as f64);
        let (gf, gl) = (group.per_second[0] as f64, *group.per_second.last().unwrap() as f64);
        first.push(rf, gf);
        last.push(rl, gl);
        thirds.push(thirds_of(&relay.per_second), thirds_of(&group.per_second));
        flat_window.push(relay.per_sec, group.per_sec);
    }

    let mut sc_grouped = Pairs::default();
    let mut sc_minimum = Pairs::default();
    for round in 0..s.rounds {
        let (relay, group, minimum) = stringcup_throughput(&s, round % 2 == 0, false).await;
        let minimum = minimum.expect("measured unless prefilled");
        println!(
            "  stringcup throughput round {}: relay-lite {:>8.0}/s ({} failed), group-commit loop {:>8.0}/s ({} failed), \
             the loop doing Stringcup's least durable work {:>8.0}/s ({} failed)",
            round + 1,
            relay.per_sec,
            relay.failed,
            group.per_sec,
            group.failed,
            minimum.per_sec,
            minimum.failed
        );
        failures.0 += relay.failed;
        failures.1 += group.failed + minimum.failed;
        sc_grouped.push(relay.per_sec, group.per_sec);
        sc_minimum.push(relay.per_sec, minimum.per_sec);
    }
    let mut sc_flat = Pairs::default();
    let mut sc_thirds = Pairs::default();
    for round in 0..s.rounds {
        let (relay, group, _) = stringcup_throughput(&s, round % 2 == 1, true).await;
        println!(
            "  stringcup flatness round {} ({} waiting first): relay-lite per second {:?}, group-commit loop per \
             second {:?}",
            round + 1,
            s.prefill,
            relay.per_second,
            group.per_second
        );
        failures.0 += relay.failed;
        failures.1 += group.failed;
        sc_flat.push(relay.per_sec, group.per_sec);
        sc_thirds.push(thirds_of(&relay.per_second), thirds_of(&group.per_second));
    }

    let http = http_client();
    let echo_body = targets[0].bodies[0].clone();
    let mut ws50 = Pairs::default();
    let mut ws99 = Pairs::default();
    for round in 0..s.rounds {
        let (relay, group) = if round % 2 == 0 {
            let g = group_latency(&http, &sender, &s).await;
            (relay_latency(&http, &sender, &s).await, g)
        } else {
            let r = relay_latency(&http, &sender, &s).await;
            (r, group_latency(&http, &sender, &s).await)
        };
        let (r50, r99) = (percentile_ms(&relay, 50.0), percentile_ms(&relay, 99.0));
        let (g50, g99) = (percentile_ms(&group, 50.0), percentile_ms(&group, 99.0));
        println!(
            "  websocket round {}: relay-lite p50 {r50:.3} ms p99 {r99:.3} ms, group-commit loop p50 {g50:.3} ms \
             p99 {g99:.3} ms",
            round + 1
        );
        ws50.push(r50, g50);
        ws99.push(r99, g99);
    }
    let mut p50 = Pairs::default();
    let mut p99 = Pairs::default();
    for round in 0..s.rounds {
        let (relay, echo) = if round % 2 == 0 {
            let e = echo_latency(&http, &echo_body, &s).await;
            (relay_latency(&http, &sender, &s).await, e)
        } else {
            let r = relay_latency(&http, &sender, &s).await;
            (r, echo_latency(&http, &echo_body, &s).await)
        };
        let (r50, r99) = (percentile_ms(&relay, 50.0), percentile_ms(&relay, 99.0));
        let (e50, e99) = (percentile_ms(&echo, 50.0), percentile_ms(&echo, 99.0));
        println!(
            "  latency round {}: relay-lite p50 {r50:.3} ms p99 {r99:.3} ms, echo p50 {e50:.3} ms \
             p99 {e99:.3} ms",
            round + 1
        );
        p50.push(r50, e50);
        p99.push(r99, e99);
    }

    let mut sc_send = Pairs::default();
    let mut sc50 = Pairs::default();
    let mut sc99 = Pairs::default();
    let mut sc_polled = Pairs::default();
    for round in 0..s.rounds {
        let echo = echo_latency(&http, &echo_body, &s).await;
        let (polled, (send, delivery)) = if round % 2 == 0 {
            let polled = group_poll_latency(&http, &s).await;
            (polled, stringcup_latency(&http, &s).await)
        } else {
            let relay = stringcup_latency(&http, &s).await;
            (group_poll_latency(&http, &s).await, relay)
        };
        let (e50, e99) = (percentile_ms(&echo, 50.0), percentile_ms(&echo, 99.0));
        let (s50, d50, d99) =
            (percentile_ms(&send, 50.0), percentile_ms(&delivery, 50.0), percentile_ms(&delivery, 99.0));
        let p50 = percentile_ms(&polled, 50.0);
        println!(
            "  stringcup round {}: send p50 {s50:.3} ms, long-poll delivery p50 {d50:.3} ms p99 {d99:.3} ms, \
             the group-commit loop's send to long-poll p50 {p50:.3} ms, echo p50 {e50:.3} ms p99 {e99:.3} ms",
            round + 1
        );
        sc_send.push(s50, e50);
        sc50.push(d50, e50);
        sc99.push(d99, e99);
        sc_polled.push(d50, p50);
    }

    println!();
    println!(
        "Medians of {} alternating rounds; ratio = median of the per-round relay-lite / baseline \
         ratios.",
        s.rounds
    );
    println!();
    println!("| figure | relay-lite | baseline | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| durable send, {} clients, {} mailboxes, {}-byte envelopes (202/s; baseline: axum + sqlx with the \
         same group commit, WAL, synchronous=FULL) | {:.0} | {:.0} | {:.2}x |",
        s.clients,
        s.mailboxes,
        MIN_ENVELOPE,
        median(&grouped.relay),
        median(&grouped.baseline),
        grouped.ratio()
    );
    println!(
        "| durable send over {:?} after {} envelopes were left waiting (202/s; baseline: the group-commit \
         loop, same) | {:.0} | {:.0} | {:.2}x |",
        s.flat,
        s.prefill,
        median(&flat_window.relay),
        median(&flat_window.baseline),
        flat_window.ratio()
    );
    println!(
        "| ... first second (202s) | {:.0} | {:.0} | {:.2}x |",
        median(&first.relay),
        median(&first.baseline),
        first.ratio()
    );
    println!(
        "| ... last second (202s) | {:.0} | {:.0} | {:.2}x |",
        median(&last.relay),
        median(&last.baseline),
        last.ratio()
    );
    let drift = |l: &[f64], f: &[f64]| median(&l.iter().zip(f).map(|(l, f)| l / f).collect::<Vec<f64>>());
    println!(
        "| ... last second / first second (flatness) | {:.2} | {:.2} | |",
        drift(&last.relay, &first.relay),
        drift(&last.baseline, &first.baseline)
    );
    println!(
        "| ... last three seconds / first three (flatness, steadier) | {:.2} | {:.2} | |",
        median(&thirds.relay),
        median(&thirds.baseline)
    );
    println!(
        "| Stringcup durable send, {} clients (a sender each) over {} inboxes, sealed {}-character messages \
         as JSON (201/s; baseline: the group-commit loop storing the same bodies) | {:.0} | {:.0} | {:.2}x |",
        s.clients,
        s.mailboxes,
        TEXT_CHARS,
        median(&sc_grouped.relay),
        median(&sc_grouped.baseline),
        sc_grouped.ratio()
    );
    println!(
        "| Stringcup durable send, as above (201/s; baseline: the group-commit loop doing Stringcup's least \
         durable work: body checks, both numberings, limits) | {:.0} | {:.0} | {:.2}x |",
        median(&sc_minimum.relay),
        median(&sc_minimum.baseline),
        sc_minimum.ratio()
    );
    println!(
        "| the group-commit loop doing Stringcup's least durable work / the plain loop (201/s) | {:.0} | {:.0} | \
         {:.2}x |",
        median(&sc_minimum.baseline),
        median(&sc_grouped.baseline),
        median(&sc_minimum.baseline) / median(&sc_grouped.baseline)
    );
    println!(
        "| Stringcup durable send over {:?} after {} messages were left waiting (201/s; baseline: the \
         group-commit loop, same) | {:.0} | {:.0} | {:.2}x |",
        s.flat,
        s.prefill,
        median(&sc_flat.relay),
        median(&sc_flat.baseline),
        sc_flat.ratio()
    );
    println!(
        "| ... last three seconds / first three (flatness) | {:.2} | {:.2} | |",
        median(&sc_thirds.relay),
        median(&sc_thirds.baseline)
    );
    println!(
        "| send-to-websocket p50, POST start to the `msg` frame (ms; baseline: the group-commit loop's \
         websocket) | {:.3} | {:.3} | {:.2}x |",
        median(&ws50.relay),
        median(&ws50.baseline),
        ws50.ratio()
    );
    println!(
        "| send-to-websocket p99 (ms; baseline: the group-commit loop's websocket) | {:.3} | {:.3} | {:.2}x |",
        median(&ws99.relay),
        median(&ws99.baseline),
        ws99.ratio()
    );
    println!(
        "| send throughput, {} clients, {} mailboxes, {}-byte envelopes (202/s; baseline: axum + \
         one sqlx INSERT per request, pool {}, WAL, synchronous=FULL) | {:.0} | {:.0} | {:.2}x |",
        s.clients,
        s.mailboxes,
        MIN_ENVELOPE,
        s.baseline_pool,
        median(&throughput.relay),
        median(&throughput.baseline),
        throughput.ratio()
    );
    println!(
        "| send-to-delivery p50, POST start to websocket `msg` (ms; baseline: axum echo round \
         trip, same body) | {:.3} | {:.3} | {:.1}x |",
        median(&p50.relay),
        median(&p50.baseline),
        p50.ratio()
    );
    println!(
        "| send-to-delivery p99 (ms; baseline: echo p99) | {:.3} | {:.3} | {:.1}x |",
        median(&p99.relay),
        median(&p99.baseline),
        p99.ratio()
    );
    println!(
        "| Stringcup send p50, POST to `201` (ms; baseline: echo p50) | {:.3} | {:.3} | {:.1}x |",
        median(&sc_send.relay),
        median(&sc_send.baseline),
        sc_send.ratio()
    );
    println!(
        "| Stringcup send-to-delivery p50, POST start to the parked long-poll answering (ms; baseline: echo p50) | {:.3} | {:.3} | {:.1}x |",
        median(&sc50.relay),
        median(&sc50.baseline),
        sc50.ratio()
    );
    println!(
        "| Stringcup send-to-delivery p99 (ms; baseline: echo p99) | {:.3} | {:.3} | {:.1}x |",
        median(&sc99.relay),
        median(&sc99.baseline),
        sc99.ratio()
    );
    println!(
        "| Stringcup send-to-delivery p50 (ms; baseline: the group-commit loop's send-to-websocket p50, \
         issue 16's goal) | {:.3} | {:.3} | {:.2}x |",
        median(&sc50.relay),
        median(&ws50.baseline),
        median(&sc50.relay) / median(&ws50.baseline)
    );
    println!(
        "| Stringcup send-to-delivery p50 (ms; baseline: the group-commit loop's send to a parked long-poll, \
         same rounds) | {:.3} | {:.3} | {:.2}x |",
        median(&sc_polled.relay),
        median(&sc_polled.baseline),
        sc_polled.ratio()
    );
    println!(
        "| the group-commit loop: send to long-poll p50 / send to websocket p50 (ms) | {:.3} | {:.3} | {:.2}x |",
        median(&sc_polled.baseline),
        median(&ws50.baseline),
        median(&sc_polled.baseline) / median(&ws50.baseline)
    );
    if failures != (0, 0) {
        println!();
        println!("Failed sends (non-202 or transport errors): relay-lite {}, baseline {}.", failures.0, failures.1);
    }
    println!();
    println!("Reproduce: {}", s.command());
}
