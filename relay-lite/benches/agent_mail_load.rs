//! relay-lite's Agent Mail packet acceptance under load on loopback, against the bare insert
//! baseline measured in the same process run (alternating rounds, medians).
//!
//! - Relay: `AM_LOAD_CLIENTS` (32) keep-alive HTTP/1.1 clients post distinct, real sealed packets
//!   (a 1 KiB text message: one 2 KiB padded block, sealed before the clock starts) to
//!   `POST /v1/mailboxes/{id}/packets` across `AM_LOAD_MAILBOXES` (8) mailboxes whose cards were
//!   published first; only `202`s of new packets count. Every packet is fresh (a repeat would be
//!   answered from accepted history, which is cheaper). Each acceptance is the full §7.1 path:
//!   strict parse, event hash and Ed25519 verification, the history, card, quota and admission
//!   checks, sequence allocation and storage, committed before the answer.
//! - Baselines, same clients, bodies and URLs, in the same alternating rounds: the bare
//!   group-commit loop (`support::start_group_commit_baseline`: one writer task, one transaction
//!   and one fsync per batch of queued writes, one cached `INSERT` each; issue 16's honest
//!   baseline), and a bare axum route doing one sqlx `INSERT` of the body per request (pool 10,
//!   WAL, `synchronous=FULL`; a floor: one fsync per request). Two more loops add, on each
//!   request's task, `Packet::parse` (the stateless §7.1 checks every relay must run), and
//!   then also the packet ID kept as a `UNIQUE` acceptance tombstone (the replay protection §7.1
//!   makes every relay keep): the protocol's minimum work per packet, in bare code.
//!
//! `cargo bench -p relay-lite --bench agent_mail_load`; `AM_LOAD_SCALE=0.2` for a quick run,
//! `AM_LOAD_ROUNDS` (3) rounds; `AM_LOAD_PROFILE=relay` (or `group`) runs one side alone, for a
//! profiler attached to the process.

// A bench, not library code: a failed setup or a wrong answer should stop the run loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use ed25519_dalek::SigningKey;
use relay_lite::{Config, RunningRelay};
use support::{
    Check, ClientWork, Load, env_or, http_client, median, post_load, start_group_commit_baseline_checked,
    start_insert_baseline,
};
use switchboard_core::protocol::agent_identity::{AgentId, Origin};
use switchboard_core::protocol::agent_mail::card::CardPayload;
use switchboard_core::protocol::agent_mail::packet::{Packet, SealRequest, seal};
use switchboard_core::protocol::agent_mail::{DAY_MS, Id16, MailboxCard, Message, Part};
use switchboard_core::util::{OsRng, now_ms, random_array};
use x25519_dalek::{PublicKey, StaticSecret};

/// The origin cards name: the relay is configured with it (`public_urls`) and requests carry it as `Host`.
const HOST: &str = "relay.example";
/// Characters of message text.
const TEXT_CHARS: usize = 1024;

#[derive(Debug, Clone)]
struct Settings {
    scale: f64,
    rounds: usize,
    clients: usize,
    mailboxes: usize,
    warmup: Duration,
    measure: Duration,
    packets_per_client: usize,
}

impl Settings {
    fn from_env() -> Self {
        let scale: f64 = env_or("AM_LOAD_SCALE", 1.0_f64).clamp(0.01, 100.0);
        let scaled = |n: f64, min: f64| (n * scale).max(min);
        Self {
            scale,
            rounds: env_or("AM_LOAD_ROUNDS", 3_usize).max(1),
            clients: env_or("AM_LOAD_CLIENTS", 32_usize).max(1),
            mailboxes: env_or("AM_LOAD_MAILBOXES", 8_usize).max(1),
            warmup: Duration::from_secs_f64(scaled(1.0, 0.2)),
            measure: Duration::from_secs_f64(scaled(4.0, 0.5)),
            // relay-lite accepts each packet once: enough for ~12,800 a second over the run.
            packets_per_client: scaled(2000.0, 40.0) as usize,
        }
    }

    fn command(&self) -> String {
        support::command("AM_LOAD_", "agent_mail_load")
    }
}

fn card_for(owner: &SigningKey, mailbox: Id16, origin: &Origin) -> MailboxCard {
    let now = now_ms();
    let secret = StaticSecret::from(random_array::<32>());
    MailboxCard::sign(
        owner,
        now,
        1,
        CardPayload {
            mailbox_id: mailbox,
            expires_at: now + DAY_MS,
            receive_until: now + 2 * DAY_MS,
            public_key: PublicKey::from(&secret).to_bytes(),
            routes: vec![origin.clone()],
            max_packet_bytes: 65536,
        },
    )
    .unwrap()
}

async fn start_relay(dir: &Path) -> RunningRelay {
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir);
    // The origin the cards name (relay-lite no longer takes it from the request's `Host`).
    config.public_urls = vec![format!("https://{HOST}")];
    config.limits.ip_requests_per_minute = 0;
    config.limits.agent_mail.mailbox_max_packets = u32::MAX;
    config.limits.agent_mail.mailbox_max_bytes = u64::MAX;
    relay_lite::spawn(config).await.unwrap()
}

async fn relay_throughput(cards: &[MailboxCard], work: &[Arc<ClientWork>], s: &Settings) -> Load {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(dir.path()).await;
    let http = http_client();
    for card in cards {
        let r = http
            .post(format!("{}/v1/mailboxes", relay.url()))
            .header(reqwest::header::HOST, HOST)
            .body(card.to_jcs())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    }
    let load = post_load(&relay.url(), work, s.warmup, s.measure).await;
    relay.shutdown().await.unwrap();
    load
}

async fn baseline_throughput(work: &[Arc<ClientWork>], s: &Settings) -> Load {
    let dir = tempfile::tempdir().unwrap();
    let (addr, task, pool) = start_insert_baseline(dir.path(), "/v1/mailboxes/{id}/packets", 10).await;
    let load = post_load(&format!("http://{addr}"), work, s.warmup, s.measure).await;
    task.abort();
    pool.close().await;
    load
}

/// The group-commit loop on fresh storage, each body first through `check`: `Check::None` (the
/// bare loop), `VERIFIED` or `TOMBSTONE`.
async fn group_throughput(work: &[Arc<ClientWork>], s: &Settings, check: Check) -> Load {
    let dir = tempfile::tempdir().unwrap();
    let (addr, task, writer) =
        start_group_commit_baseline_checked(dir.path(), "/v1/mailboxes/{id}/packets", check).await;
    let load = post_load(&format!("http://{addr}"), work, s.warmup, s.measure).await;
    task.abort();
    writer.abort();
    load
}

/// The stateless part of §7.1 acceptance that any relay must do: `Packet::parse` (strict JSON
/// and closed shape, sizes and time bounds, the event hash, the sender's Ed25519 signature). Not
/// the stateful checks (card, history, quota) and not relay-lite's own storage layout.
const VERIFIED: Check = Check::Pass(|body| Packet::parse(body).is_ok());

/// [`VERIFIED`] and also what §7.1 makes every relay keep for each packet beyond its bytes: the
/// packet ID as an acceptance tombstone ("the relay's replay protection"), here the raw 32 bytes
/// under a `UNIQUE` constraint in the same row, so a replay is found and not stored again. The
/// protocol's minimum durable work per packet, done by bare code; like relay-lite it must get
/// fresh packets only (a repeat would take the cheaper lookup).
const TOMBSTONE: Check = Check::Keyed(|body| Packet::parse(body).ok().map(|p| p.id().0.to_vec()));

#[tokio::main]
async fn main() {
    relay_lite::tls::install_default_provider();
    let s = Settings::from_env();
    let origin = Origin::parse(&format!("https://{HOST}")).unwrap();
    let sender = SigningKey::from_bytes(&random_array::<32>());
    let owners: Vec<SigningKey> = (0..s.mailboxes).map(|_| SigningKey::from_bytes(&random_array::<32>())).collect();
    let cards: Vec<MailboxCard> = owners.iter().map(|o| card_for(o, Id16(random_array::<16>()), &origin)).collect();
    let sealing = Instant::now();
    let mut nonce = 1000;
    let text = "x".repeat(TEXT_CHARS);
    let work: Vec<Arc<ClientWork>> = (0..s.clients)
        .map(|c| {
            let card = &cards[c % cards.len()];
            let packets = (0..s.packets_per_client)
                .map(|_| {
                    let now = now_ms();
                    nonce += 1;
                    let m = Message::new(
                        &mut OsRng,
                        AgentId::of(&sender),
                        *card.owner(),
                        now,
                        now + DAY_MS / 2,
                        vec![Part::text(&text)],
                    );
                    let req = SealRequest { sender: &sender, card, message: &m, created_at: now, nonce };
                    Bytes::from(seal(&req, now, &mut OsRng).unwrap().to_jcs())
                })
                .collect();
            // Every packet fresh: a repeat would be answered from accepted history, which is cheaper.
            Arc::new(ClientWork {
                path: format!("/v1/mailboxes/{}/packets", card.mailbox_id()),
                headers: vec![("host", HOST.to_owned()), ("content-type", "application/json".into())],
                bodies: packets,
                first: 0,
                cycle: false,
                stored: StatusCode::ACCEPTED,
            })
        })
        .collect();
    // The loops keep no history, so their clients cycle through the same packets: until
    // 2026-12-05 they used relay-lite's non-repeating work too, and ran out of packets before
    // the window ended (their figures were capped by the packets sealed, not by the server).
    let looped: Vec<Arc<ClientWork>> =
        work.iter().map(|w| Arc::new(ClientWork { cycle: true, ..ClientWork::clone(w) })).collect();
    let size = work[0].bodies[0].len();
    println!(
        "agent_mail_load: {} rounds, {} clients over {} mailboxes, {} distinct {size}-byte packets per client \
         (sealed in {:.1} s), {:?} warm-up + {:?} per run",
        s.rounds,
        s.clients,
        s.mailboxes,
        s.packets_per_client,
        sealing.elapsed().as_secs_f64(),
        s.warmup,
        s.measure
    );

    // One side alone, for a profiler attached to the whole process: `AM_LOAD_PROFILE=relay` or
    // `group` runs that side's throughput once and stops.
    if let Ok(side) = std::env::var("AM_LOAD_PROFILE") {
        let load = match side.as_str() {
            "relay" => relay_throughput(&cards, &work, &s).await,
            "group" => group_throughput(&looped, &s, Check::None).await,
            "verified" => group_throughput(&looped, &s, VERIFIED).await,
            "tombstone" => group_throughput(&work, &s, TOMBSTONE).await,
            other => panic!("AM_LOAD_PROFILE={other:?}: expected relay, group, verified or tombstone"),
        };
        println!("  {side} alone: {:.0}/s ({} failed), per second {:?}", load.per_sec, load.failed, load.per_second);
        return;
    }

    let (mut relay_rates, mut base_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut group_rates, mut group_ratios) = (Vec::new(), Vec::new());
    let (mut verified_rates, mut verified_ratios) = (Vec::new(), Vec::new());
    let (mut tombstone_rates, mut tombstone_ratios) = (Vec::new(), Vec::new());
    for round in 0..s.rounds {
        let (relay, group) = if round % 2 == 0 {
            let g = group_throughput(&looped, &s, Check::None).await;
            (relay_throughput(&cards, &work, &s).await, g)
        } else {
            let r = relay_throughput(&cards, &work, &s).await;
            (r, group_throughput(&looped, &s, Check::None).await)
        };
        let verified = group_throughput(&looped, &s, VERIFIED).await;
        assert_eq!(verified.failed, 0, "the verifying loop refused a packet relay-lite accepts");
        let tombstone = group_throughput(&work, &s, TOMBSTONE).await;
        assert_eq!(tombstone.failed, 0, "the tombstone loop refused or repeated a packet");
        assert_eq!(tombstone.exhausted, 0, "the tombstone loop ran out of fresh packets: raise AM_LOAD_SCALE");
        let base = baseline_throughput(&looped, &s).await;
        println!(
            "  round {}: relay-lite {:>7.0}/s ({} failed, {} clients ran out), group-commit loop {:>7.0}/s \
             ({} failed), the loop verifying each packet {:>7.0}/s, and keeping its tombstone {:>7.0}/s, \
             per-request INSERT {:>7.0}/s ({} failed)",
            round + 1,
            relay.per_sec,
            relay.failed,
            relay.exhausted,
            group.per_sec,
            group.failed,
            verified.per_sec,
            tombstone.per_sec,
            base.per_sec,
            base.failed
        );
        assert_eq!(relay.exhausted, 0, "clients ran out of fresh packets: raise AM_LOAD_SCALE");
        relay_rates.push(relay.per_sec);
        base_rates.push(base.per_sec);
        group_rates.push(group.per_sec);
        ratios.push(relay.per_sec / base.per_sec);
        group_ratios.push(relay.per_sec / group.per_sec);
        verified_rates.push(verified.per_sec);
        verified_ratios.push(relay.per_sec / verified.per_sec);
        tombstone_rates.push(tombstone.per_sec);
        tombstone_ratios.push(relay.per_sec / tombstone.per_sec);
    }
    println!();
    println!("| figure | relay-lite | baseline | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| Agent Mail packet acceptance, {} clients, {} mailboxes, {size}-byte packets (new 202/s; baseline: \
         axum + sqlx with the same group commit, WAL, synchronous=FULL) | {:.0} | {:.0} | {:.2}x |",
        s.clients,
        s.mailboxes,
        median(&relay_rates),
        median(&group_rates),
        median(&group_ratios)
    );
    println!(
        "| … against the same loop that also runs `Packet::parse` on each packet (strict parse, event hash, \
         Ed25519 verification: the stateless acceptance work every relay must do) | {:.0} | {:.0} | {:.2}x |",
        median(&relay_rates),
        median(&verified_rates),
        median(&verified_ratios)
    );
    println!(
        "| … against that verifying loop also keeping each packet ID as a UNIQUE acceptance tombstone (§7.1: the \
         protocol's minimum durable state per packet) | {:.0} | {:.0} | {:.2}x |",
        median(&relay_rates),
        median(&tombstone_rates),
        median(&tombstone_ratios)
    );
    println!(
        "| Agent Mail packet acceptance, {} clients, {} mailboxes, {size}-byte packets (new 202/s; baseline: \
         axum + one sqlx INSERT per request, pool 10, WAL, synchronous=FULL) | {:.0} | {:.0} | {:.2}x |",
        s.clients,
        s.mailboxes,
        median(&relay_rates),
        median(&base_rates),
        median(&ratios)
    );
    println!();
    println!("Reproduce: {} (scale {})", s.command(), s.scale);
}
