//! relay-lite on PostgreSQL under load on loopback, each figure a ratio against a baseline
//! measured in the same run (rounds alternate the order, the summary gives medians).
//!
//! - A PostgreSQL cluster of its own with the durability defaults (`fsync=on`,
//!   `synchronous_commit=on`), a fresh database per run.
//! - Durable send throughput: `PG_LOAD_CLIENTS` (32) keep-alive clients post real sealed
//!   letagents envelopes (1087 bytes) to `POST /v1/send/{id}` across `PG_LOAD_MAILBOXES` (8)
//!   mailboxes; only `202`s count. With 1 instance, and with 3 instances on one database (client
//!   `c` posts to instance `c % 3`, as a load balancer spreads connections). Baseline: the same
//!   number of bare axum + sqlx servers doing relay-lite's group commit on PostgreSQL and nothing
//!   else (`support::start_pg_group_commit_baseline`: one writer, one transaction, one `INSERT`
//!   per write, one `pg_notify` per batch), same clients, bodies and spreading.
//! - Send-to-delivery latency across instances: the recipient's websocket is on instance C, one
//!   sender posts through A, one envelope at a time; a sample runs from the start of the POST to
//!   the `msg` frame. Baseline: the same with the websocket on A (one instance, no NOTIFY hop),
//!   in the same cluster. The same for Stringcup: the recipient parked in a long-poll on C (or
//!   A), the send through A, until the long-poll answers.
//!
//! - Durable send with a backlog: the 1-instance throughput again after `PG_LOAD_PREFILL` (10,000)
//!   envelopes were left waiting (spread over the mailboxes), for both sides.
//!
//! `cargo bench --workspace --bench pg_load --profile dev`; `PG_LOAD_SCALE=0.5` shortens every phase,
//! `PG_LOAD_ROUNDS` (3) sets the number of rounds. Needs Debian's `postgresql` package.

// A bench, not library code: a failed setup or a wrong answer should stop the run loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

#[path = "../tests/pg_common/mod.rs"]
mod pg_common;
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use futures_util::StreamExt as _;
use relay_lite::{Config, RunningRelay};
use support::{ClientWork, Load, Pairs, env_or, http_client, leave_waiting, median, percentile_ms, post_load};
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::protocol::letagents::wire::RelayToClient;
use switchboard_core::protocol::letagents::{Inner, Kind, MIN_ENVELOPE, seal};
use switchboard_core::transport::letagents::{RelayClient, RelaySocket};
use switchboard_core::util::{OsRng, b64u, now_ms};
use tokio_tungstenite::tungstenite::Message;

/// Characters of message text: the smallest sealed envelope (1087 bytes), as in relay_load.
const TEXT_CHARS: usize = 500;
/// Distinct sealed envelopes per mailbox, cycled by the senders.
const BODIES_PER_MAILBOX: usize = 64;
/// Instances of the cluster runs.
const CLUSTER: usize = 3;

#[derive(Debug, Clone)]
struct Settings {
    scale: f64,
    rounds: usize,
    clients: usize,
    mailboxes: usize,
    warmup: Duration,
    measure: Duration,
    latency_warmup: usize,
    latency_samples: usize,
    prefill: usize,
}

impl Settings {
    fn from_env() -> Self {
        let scale: f64 = env_or("PG_LOAD_SCALE", 1.0_f64).clamp(0.01, 100.0);
        let scaled = |n: f64, min: f64| (n * scale).max(min);
        Self {
            scale,
            rounds: env_or("PG_LOAD_ROUNDS", 3_usize).max(1),
            clients: env_or("PG_LOAD_CLIENTS", 32_usize).max(1),
            mailboxes: env_or("PG_LOAD_MAILBOXES", 8_usize).max(1),
            warmup: Duration::from_secs_f64(scaled(1.0, 0.2)),
            measure: Duration::from_secs_f64(scaled(3.0, 1.0)),
            latency_warmup: scaled(20.0, 5.0) as usize,
            latency_samples: scaled(300.0, 20.0) as usize,
            prefill: env_or("PG_LOAD_PREFILL", 10_000_usize),
        }
    }
}

/// A mailbox as senders see it: its send path, drop header and sealed envelopes.
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

/// Client `c` posts to mailbox `c % mailboxes` through server `bases[c % bases.len()]`.
fn client_work(bases: &[String], targets: &[Target], s: &Settings) -> Vec<Arc<ClientWork>> {
    (0..s.clients)
        .map(|c| {
            let t = &targets[c % targets.len()];
            Arc::new(ClientWork {
                path: format!("{}{}", bases[c % bases.len()], t.path),
                headers: vec![("x-la-drop", t.drop.clone()), ("content-type", "application/octet-stream".into())],
                bodies: t.bodies.clone(),
                first: c,
                cycle: true,
                stored: StatusCode::ACCEPTED,
            })
        })
        .collect()
}

/// `n` relay-lite instances on the database at `url`, the send limits out of the way. They start
/// one after another: the first runs the migrations.
async fn instances(url: &str, n: usize, dirs: &mut Vec<tempfile::TempDir>) -> Vec<RunningRelay> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir.path());
        config.database = Some(url.to_owned());
        config.limits.sends_per_minute = 0;
        config.limits.ip_requests_per_minute = 0;
        config.limits.mailbox_capacity = 1 << 40;
        config.limits.stringcup.sends_per_hour = u32::MAX;
        config.limits.stringcup.inbox_requests_per_hour = u32::MAX;
        config.limits.stringcup.other_requests_per_hour = u32::MAX;
        dirs.push(dir);
        out.push(relay_lite::spawn(config).await.unwrap());
    }
    out
}

async fn relay_throughput(
    pg: &pg_common::Cluster,
    n: usize,
    owners: &[DeviceIdentity],
    targets: &[Target],
    s: &Settings,
    waiting: usize,
) -> Load {
    let url = pg.fresh_database().await;
    let mut dirs = Vec::new();
    let relays = instances(&url, n, &mut dirs).await;
    let client = RelayClient::new(&relays[0].url(), None).unwrap();
    for owner in owners {
        client.inbox(&owner.sig, &owner.drop).await.unwrap();
    }
    let bases: Vec<String> = relays.iter().map(RunningRelay::url).collect();
    let work = client_work(&bases, targets, s);
    leave_waiting("", &work, waiting).await;
    let load = post_load("", &work, s.warmup, s.measure).await;
    for relay in relays {
        relay.shutdown().await.unwrap();
    }
    load
}

async fn baseline_throughput(
    pg: &pg_common::Cluster,
    n: usize,
    targets: &[Target],
    s: &Settings,
    waiting: usize,
) -> Load {
    let url = pg.fresh_database().await;
    support::create_pg_baseline_table(&url).await;
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        servers.push(support::start_pg_group_commit_baseline(&url, "/v1/send/{id}").await);
    }
    let bases: Vec<String> = servers.iter().map(|(addr, _, _)| format!("http://{addr}")).collect();
    let work = client_work(&bases, targets, s);
    leave_waiting("", &work, waiting).await;
    let load = post_load("", &work, s.warmup, s.measure).await;
    for (_, task, writer) in servers {
        task.abort();
        writer.abort();
    }
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

/// Send-to-delivery samples: POST through `send_via`, the recipient's websocket on `watch_on`.
async fn latency(
    http: &reqwest::Client,
    send_via: &RunningRelay,
    watch_on: &RunningRelay,
    sender: &DeviceIdentity,
    s: &Settings,
) -> Vec<Duration> {
    let owner = DeviceIdentity::generate(&mut OsRng);
    let target = target(sender, &owner);
    let expected: Vec<String> = target.bodies.iter().map(|b| b64u(b)).collect();
    let mut ws = RelayClient::new(&watch_on.url(), None).unwrap().connect(&owner.sig, &owner.drop).await.unwrap();
    assert_eq!(next_frame(&mut ws).await, RelayToClient::Ready);
    let url = format!("{}{}", send_via.url(), target.path);
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
    samples
}

/// Stringcup send-to-delivery samples: the recipient parked in `GET /api/v2/messages?wait=25`
/// on `park_on`, the send (`POST /api/v2/messages`) through `send_via`, from the start of the
/// POST until the parked long-poll answers; each message is acked outside the timed window.
async fn stringcup_latency(
    http: &reqwest::Client,
    send_via: &RunningRelay,
    park_on: &RunningRelay,
    s: &Settings,
) -> Vec<Duration> {
    use switchboard_core::protocol::stringcup::crypto;
    let (send_api, park_api) = (format!("{}/api/v2", send_via.url()), format!("{}/api/v2", park_on.url()));
    let register = |key: [u8; 32]| {
        let (http, api) = (http.clone(), send_api.clone());
        async move {
            let public = data_encoding::BASE64
                .encode(x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(key)).as_bytes());
            let v: serde_json::Value = http
                .post(format!("{api}/identities"))
                .json(&serde_json::json!({"identity_public_key": public, "algo": "x25519"}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (v["id"].as_str().unwrap().to_owned(), v["api_token"].as_str().unwrap().to_owned(), public)
        }
    };
    let (alice, alice_token, _) = register(rand_key()).await;
    let (bob, bob_token, bob_pub) = register(rand_key()).await;
    let bob_key = crypto::decode_public_key(&bob_pub).unwrap();
    let text = "x".repeat(TEXT_CHARS);
    let mut samples = Vec::with_capacity(s.latency_samples);
    for i in 0..s.latency_warmup + s.latency_samples {
        let (header, ciphertext) = crypto::seal(&alice, &bob, &bob_key, &text, &mut OsRng).unwrap();
        let body = serde_json::json!({"recipient_id": bob, "header": header, "ciphertext": ciphertext});
        let poll = tokio::spawn(http.get(format!("{park_api}/messages?wait=25")).bearer_auth(&bob_token).send());
        tokio::time::sleep(Duration::from_millis(5)).await;
        let started = Instant::now();
        let sent =
            http.post(format!("{send_api}/messages")).bearer_auth(&alice_token).json(&body).send().await.unwrap();
        assert_eq!(sent.status(), StatusCode::CREATED);
        let page: serde_json::Value = poll.await.unwrap().unwrap().json().await.unwrap();
        let delivered = started.elapsed();
        let ids: Vec<i64> = page["messages"].as_array().unwrap().iter().map(|m| m["id"].as_i64().unwrap()).collect();
        assert_eq!(ids.len(), 1, "the long-poll returned {page}");
        let acked = http
            .post(format!("{send_api}/messages/ack"))
            .bearer_auth(&bob_token)
            .json(&serde_json::json!({"ids": ids}))
            .send()
            .await
            .unwrap();
        assert_eq!(acked.status(), StatusCode::OK);
        if i >= s.latency_warmup {
            samples.push(delivered);
        }
    }
    samples
}

fn rand_key() -> [u8; 32] {
    switchboard_core::util::random_array::<32>()
}

#[tokio::main]
async fn main() {
    relay_lite::tls::install_default_provider();
    let s = Settings::from_env();
    let Some(pg) = pg_common::durable_cluster() else {
        eprintln!("pg_load needs PostgreSQL's server binaries (apt-get install postgresql)");
        std::process::exit(1);
    };
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    println!(
        "pg_load: {cores} cores, scale {}, {} rounds, {} clients over {} mailboxes, {:?} warm-up + {:?} per \
         throughput run, {} (+{} warm-up) latency samples per run; PostgreSQL with fsync=on",
        s.scale, s.rounds, s.clients, s.mailboxes, s.warmup, s.measure, s.latency_samples, s.latency_warmup,
    );
    let sender = DeviceIdentity::generate(&mut OsRng);
    let owners: Vec<DeviceIdentity> = (0..s.mailboxes).map(|_| DeviceIdentity::generate(&mut OsRng)).collect();
    let targets: Vec<Target> = owners.iter().map(|o| target(&sender, o)).collect();

    let mut one = Pairs::default();
    let mut three = Pairs::default();
    let mut backlog = Pairs::default();
    let mut failures = (0_u64, 0_u64);
    for round in 0..s.rounds {
        let mut results = Vec::new();
        for (n, waiting) in [(1, 0), (CLUSTER, 0), (1, s.prefill)] {
            let (relay, base) = if round % 2 == 0 {
                let b = baseline_throughput(pg, n, &targets, &s, waiting).await;
                (relay_throughput(pg, n, &owners, &targets, &s, waiting).await, b)
            } else {
                let r = relay_throughput(pg, n, &owners, &targets, &s, waiting).await;
                (r, baseline_throughput(pg, n, &targets, &s, waiting).await)
            };
            println!(
                "  throughput round {}, {n} instance(s), {waiting} waiting first: relay-lite {:>7.0}/s ({} failed), \
                 group-commit loop {:>7.0}/s ({} failed)",
                round + 1,
                relay.per_sec,
                relay.failed,
                base.per_sec,
                base.failed
            );
            failures.0 += relay.failed;
            failures.1 += base.failed;
            results.push((relay.per_sec, base.per_sec));
        }
        one.push(results[0].0, results[0].1);
        three.push(results[1].0, results[1].1);
        backlog.push(results[2].0, results[2].1);
    }

    let http = http_client();
    let (mut across50, mut across99) = (Pairs::default(), Pairs::default());
    let (mut sc50, mut sc99) = (Pairs::default(), Pairs::default());
    for round in 0..s.rounds {
        let url = pg.fresh_database().await;
        let mut dirs = Vec::new();
        let relays = instances(&url, CLUSTER, &mut dirs).await;
        let (a, c) = (&relays[0], &relays[CLUSTER - 1]);
        let (across, local) = if round % 2 == 0 {
            let l = latency(&http, a, a, &sender, &s).await;
            (latency(&http, a, c, &sender, &s).await, l)
        } else {
            let x = latency(&http, a, c, &sender, &s).await;
            (x, latency(&http, a, a, &sender, &s).await)
        };
        let (x50, x99) = (percentile_ms(&across, 50.0), percentile_ms(&across, 99.0));
        let (l50, l99) = (percentile_ms(&local, 50.0), percentile_ms(&local, 99.0));
        println!(
            "  latency round {}: send on A, websocket on C p50 {x50:.3} ms p99 {x99:.3} ms; both on A p50 \
             {l50:.3} ms p99 {l99:.3} ms",
            round + 1
        );
        across50.push(x50, l50);
        across99.push(x99, l99);
        let (across, local) = if round % 2 == 0 {
            let l = stringcup_latency(&http, a, a, &s).await;
            (stringcup_latency(&http, a, c, &s).await, l)
        } else {
            let x = stringcup_latency(&http, a, c, &s).await;
            (x, stringcup_latency(&http, a, a, &s).await)
        };
        let (x50, x99) = (percentile_ms(&across, 50.0), percentile_ms(&across, 99.0));
        let (l50, l99) = (percentile_ms(&local, 50.0), percentile_ms(&local, 99.0));
        println!(
            "  stringcup round {}: send on A, long-poll parked on C p50 {x50:.3} ms p99 {x99:.3} ms; both on A \
             p50 {l50:.3} ms p99 {l99:.3} ms",
            round + 1
        );
        sc50.push(x50, l50);
        sc99.push(x99, l99);
        for relay in relays {
            relay.shutdown().await.unwrap();
        }
    }

    println!();
    println!(
        "Medians of {} alternating rounds; ratio = median of the per-round relay-lite / baseline ratios.",
        s.rounds
    );
    println!();
    println!("| figure | relay-lite | baseline | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| durable send on PostgreSQL, 1 instance, {} clients, {} mailboxes, {}-byte envelopes (202/s; \
         baseline: axum + sqlx PostgreSQL group-commit loop) | {:.0} | {:.0} | {:.2}x |",
        s.clients,
        s.mailboxes,
        MIN_ENVELOPE,
        median(&one.relay),
        median(&one.baseline),
        one.ratio()
    );
    println!(
        "| durable send on PostgreSQL, {CLUSTER} instances on one database (202/s; baseline: {CLUSTER} such loops \
         on one database) | {:.0} | {:.0} | {:.2}x |",
        median(&three.relay),
        median(&three.baseline),
        three.ratio()
    );
    println!(
        "| durable send on PostgreSQL, 1 instance, after {} envelopes were left waiting (202/s; baseline: the \
         loop, same) | {:.0} | {:.0} | {:.2}x |",
        s.prefill,
        median(&backlog.relay),
        median(&backlog.baseline),
        backlog.ratio()
    );
    println!(
        "| send-to-websocket p50, send on A, websocket on C (ms; baseline: websocket on A) | {:.3} | {:.3} | \
         {:.2}x |",
        median(&across50.relay),
        median(&across50.baseline),
        across50.ratio()
    );
    println!(
        "| send-to-websocket p99, send on A, websocket on C (ms; baseline: websocket on A) | {:.3} | {:.3} | \
         {:.2}x |",
        median(&across99.relay),
        median(&across99.baseline),
        across99.ratio()
    );
    println!(
        "| Stringcup send-to-delivery p50, send on A, long-poll parked on C (ms; baseline: parked on A) | {:.3} | \
         {:.3} | {:.2}x |",
        median(&sc50.relay),
        median(&sc50.baseline),
        sc50.ratio()
    );
    println!(
        "| Stringcup send-to-delivery p99, same (ms; baseline: parked on A) | {:.3} | {:.3} | {:.2}x |",
        median(&sc99.relay),
        median(&sc99.baseline),
        sc99.ratio()
    );
    if failures != (0, 0) {
        println!();
        println!("Failed sends (non-202 or transport errors): relay-lite {}, baseline {}.", failures.0, failures.1);
    }
    println!();
    let vars = support::command("PG_LOAD_", "pg_load");
    let vars = vars.split("cargo bench").next().unwrap_or_default();
    println!("Reproduce: {vars}cargo bench --workspace --bench pg_load --profile dev");
}
