//! letmeknow send-to-delivery latency through a real relay-lite over HTTP on loopback, with real
//! runtimes (profiles on disk, MLS state committed with every row), against baselines measured
//! in the same run:
//! - baseline: the relay's group-log round trip alone: one transport client posts an opaque
//!   blob (a valid PrivateMessage header, no MLS) to a group log while another is parked in the
//!   long-poll for it;
//! - reference: letagents 1:1, a live runtime's send to the moment the recipient's live runtime
//!   (parked in `inbox --wait`) hands the message over;
//! - measured: `group send` by one member of a group of 2 and of 5 to the moment every other
//!   member, parked in the `listen` wait (`lmk_wait`), has it delivered (per member and for all);
//!   and letagents 1:1 and the group of 2 again with a long past (`LMK_LATENCY_HISTORY` messages
//!   each, default 20,000; a group's read and before the last operator input): what a message
//!   costs must not grow with it.
//!
//! Each receiver is parked before the send and the clock starts just before the send call. Run:
//! `cargo bench --workspace --bench letmeknow_latency` (`LMK_LATENCY_ITERS=N` per figure, default
//! 100; the whole run takes ~30-60 s after the build).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard_core::api::Request;
use switchboard_core::engine::Runtime;
use switchboard_core::protocol::letmeknow::header::{self, ContentType};
use switchboard_core::protocol::letmeknow::new_id;
use switchboard_core::transport::letagents::RelayClient;
use switchboard_core::transport::letmeknow::LetmeknowClient;
use switchboard_core::util::OsRng;
use switchboard_tests::{Peer, TestRelay, befriend};

/// How long receivers get to park in their long-poll before the clock starts.
const PARK: Duration = Duration::from_millis(40);
/// Opaque body of the baseline's posts: about the size of a group message of a short text.
const BLOB: usize = 400;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn pct(samples: &[f64], p: f64) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// The relay log round trip without MLS or storage on the clients.
async fn baseline(relay: &str, iters: usize) -> Vec<f64> {
    let writer = LetmeknowClient::new(&RelayClient::new(relay, None).unwrap());
    let reader = LetmeknowClient::new(&RelayClient::new(relay, None).unwrap());
    let gid = new_id(&mut OsRng);
    let mut cursor = 0u64;
    let mut out = Vec::new();
    for i in 0..iters + 5 {
        let r = reader.clone();
        let g = gid.clone();
        let parked = tokio::spawn(async move {
            let got = r.read(&g, cursor, 30).await.unwrap();
            (Instant::now(), got.last().unwrap().seq)
        });
        tokio::time::sleep(PARK).await;
        let t0 = Instant::now();
        writer.post(&gid, header::build(gid.as_bytes(), 0, ContentType::Application, &[0xab; BLOB])).await.unwrap();
        let (at, seq) = parked.await.unwrap();
        cursor = seq;
        if i >= 5 {
            out.push(ms(at - t0));
        }
    }
    out
}

/// Waits on a live runtime's inbox until `text` is handed over.
async fn inbox_until(rt: Runtime, text: String) -> Instant {
    loop {
        let got = rt.handle(Request::Inbox { all: false, wait_secs: 30 }, false).await.unwrap();
        if got.as_array().unwrap().iter().any(|m| m["body"] == text.as_str()) {
            return Instant::now();
        }
    }
}

/// Gives `peer` a past with its contact `contact`: `rows` messages, in and out, shown (a
/// long-lived conversation's rows), written straight into the profile's database.
async fn give_conversation_history(peer: &Peer, contact: &str, rows: usize) {
    let pool = &peer.rt.store().pool;
    let (cid, peer_id): (i64, String) =
        sqlx::query_as("SELECT id, peer_id FROM contacts WHERE name = ?").bind(contact).fetch_one(pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let now = switchboard_core::util::now_ms();
    for i in 0..rows {
        let out = i % 2 == 0;
        sqlx::query(
            "INSERT INTO messages (id, direction, protocol, contact_id, peer, kind, body, ts, state, shown, created_at) \
             VALUES (?, ?, 'letagents', ?, ?, 'send', ?, ?, ?, 1, ?)",
        )
        .bind(format!("past-{i}"))
        .bind(if out { "out" } else { "in" })
        .bind(cid)
        .bind(&peer_id)
        .bind(format!("message {i} of a long conversation, about as long as an agent's status line"))
        .bind(now - 1000)
        .bind(if out { "delivered" } else { "received" })
        .bind(now - 1000)
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

/// letagents 1:1 between two live runtimes, each first given `history` past messages with the
/// other ([`give_conversation_history`]).
async fn letagents(relay: &str, iters: usize, history: usize) -> Vec<f64> {
    let alice = Peer::live("alice", relay).await;
    let bob = Peer::live("bob", relay).await;
    befriend(&alice, &bob).await;
    if history > 0 {
        give_conversation_history(&alice, "bob", history).await;
        give_conversation_history(&bob, "alice", history).await;
    }
    let mut out = Vec::new();
    for i in 0..iters + 5 {
        let text = format!("letagents probe {i}");
        let parked = tokio::spawn(inbox_until(bob.rt.clone(), text.clone()));
        tokio::time::sleep(PARK).await;
        let t0 = Instant::now();
        alice.send("bob", &text).await;
        let at = tokio::time::timeout(Duration::from_secs(30), parked).await.expect("delivered").unwrap();
        if i >= 5 {
            out.push(ms(at - t0));
        }
    }
    out
}

/// One agent session on its own profile, with every group item due at once (no digest, no loop
/// guard: this measures transport and MLS, not the delivery policy's hold).
struct Member {
    peer: Peer,
    handle: String,
}

async fn member(name: &str, relay: &str) -> Member {
    let peer = Peer::offline(name, relay).await;
    peer.call(Request::Policy { review: None, loop_limit: Some(1_000_000), digest_secs: Some(0) }).await;
    let s = peer.rt.lmk_session(None, Some(&format!("{name}'s agent"))).await.unwrap();
    Member { handle: s["handle"].as_str().unwrap().to_owned(), peer }
}

/// Parks in the `listen` wait until the message `text` is delivered.
async fn deliveries_until(rt: Runtime, handle: String, text: String) -> Instant {
    loop {
        let got: Value = rt.lmk_wait(&handle, 30).await.unwrap();
        let found = got["items"].as_array().unwrap().iter().any(|d| d["content"] == text.as_str());
        let at = Instant::now();
        // A listener acks what it printed (else it comes again after the lease); not timed.
        if let Some(lease) = got["lease"].as_str() {
            rt.lmk_ack(None, lease, None).await.unwrap();
        }
        if found {
            return at;
        }
    }
}

/// Gives `m` a past in `gid`: `rows` messages, read, in and out (as a long-lived group's log
/// holds), then operator input after them (the loop guard counts from there, as it would after
/// the owner last took part). Written straight into the profile's database, in one transaction.
async fn give_history(m: &Member, gid: &str, rows: usize) {
    let pool = &m.peer.rt.store().pool;
    let mut tx = pool.begin().await.unwrap();
    let now = switchboard_core::util::now_ms();
    for i in 0..rows {
        sqlx::query(
            "INSERT INTO lmk_messages (handle, group_id, id, seq, epoch, kind, outgoing, sender_fp, sender_name, \
             after, content, read, created_at) VALUES (?, ?, ?, 0, 1, 'message', ?, ?, 'someone', ?, ?, 1, ?)",
        )
        .bind(&m.handle)
        .bind(gid)
        .bind(format!("past-{i}"))
        .bind(i64::from(i % 2 == 0))
        .bind("ab".repeat(16))
        .bind(if i == 0 { "[]".to_owned() } else { format!("[\"past-{}\"]", i - 1) })
        .bind(format!("message {i} of a long conversation, about as long as an agent's status line"))
        .bind(now - 1000)
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO lmk_policy (handle, group_id, reset_rowid) VALUES (?1, ?2, (SELECT MAX(rowid_) FROM lmk_messages)) \
         ON CONFLICT (handle, group_id) DO UPDATE SET reset_rowid = excluded.reset_rowid",
    )
    .bind(&m.handle)
    .bind(gid)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// A group of `n`: member 0 sends, the others are parked; each member first gets `history`
/// past messages ([`give_history`]). Returns (each member's latency, the latency until all had it).
async fn group(relay: &str, n: usize, iters: usize, history: usize) -> (Vec<f64>, Vec<f64>) {
    let mut members = Vec::new();
    for i in 0..n {
        members.push(member(&format!("m{i}"), relay).await);
    }
    let sender = &members[0];
    let mut gid = None;
    for joiner in &members[1..] {
        let inv = sender.peer.rt.lmk_invite(&sender.handle, gid.as_deref(), None).await.unwrap();
        let (joined, admitted) = tokio::join!(
            joiner.peer.rt.lmk_join(&joiner.handle, inv["link"].as_str().unwrap(), Some(60)),
            sender.peer.rt.lmk_invite_wait(inv["invite"].as_str().unwrap())
        );
        admitted.unwrap();
        joined.unwrap();
        gid = Some(inv["group"].as_str().unwrap().to_owned());
    }
    let gid = gid.unwrap();
    if history > 0 {
        for m in &members {
            give_history(m, &gid, history).await;
        }
    }
    for m in &members {
        m.peer.rt.lmk_sync(&m.handle, &gid, 0).await.unwrap();
        if let Some(lease) = m.peer.rt.lmk_deliveries(&m.handle).await.unwrap()["lease"].as_str() {
            m.peer.rt.lmk_ack(None, lease, None).await.unwrap();
        }
    }
    let (mut each, mut all) = (Vec::new(), Vec::new());
    for i in 0..iters + 5 {
        let text = format!("group probe {i}");
        let parked: Vec<_> = members[1..]
            .iter()
            .map(|m| tokio::spawn(deliveries_until(m.peer.rt.clone(), m.handle.clone(), text.clone())))
            .collect();
        tokio::time::sleep(PARK).await;
        let t0 = Instant::now();
        sender.peer.rt.lmk_send(&sender.handle, &gid, &text, None, None).await.unwrap();
        let mut last = t0;
        let mut these = Vec::new();
        for p in parked {
            let at = tokio::time::timeout(Duration::from_secs(30), p).await.expect("delivered").unwrap();
            these.push(ms(at - t0));
            last = last.max(at);
        }
        if i >= 5 {
            each.extend(these);
            all.push(ms(last - t0));
        }
    }
    (each, all)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let iters: usize = std::env::var("LMK_LATENCY_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    // The relay's rate limits (per mailbox, per group, per IP: everything here is one loopback
    // address) are abuse protection, not part of the path measured: off.
    let mut limits = relay_lite::Limits { sends_per_minute: 0, ip_requests_per_minute: 0, ..Default::default() };
    limits.letmeknow.posts_per_group_minute = 0;
    let relay = TestRelay::start_with(limits).await;
    let url = relay.url();
    let started = Instant::now();
    let base = baseline(&url, iters).await;
    let history: usize = std::env::var("LMK_LATENCY_HISTORY").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let la = letagents(&url, iters, 0).await;
    let la_past = letagents(&url, iters, history).await;
    let (_, g2_all) = group(&url, 2, iters, 0).await;
    let (g5_each, g5_all) = group(&url, 5, iters, 0).await;
    let (_, g2_past) = group(&url, 2, iters, history).await;
    let (b50, b95) = (pct(&base, 0.5), pct(&base, 0.95));
    println!(
        "letmeknow send-to-delivery latency, relay-lite on loopback, {iters} sends per figure ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    println!("| figure | p50 | p95 | p50 / baseline p50 | p95 / baseline p95 |");
    println!("|---|---:|---:|---:|---:|");
    let past = format!("group of 2 with {history} past messages each: send → the other member's listen wait");
    let la_past_name = format!("letagents 1:1 with {history} past messages each: send → recipient's inbox wait");
    let rows: [(&str, &[f64]); 7] = [
        ("baseline: opaque blob, relay log post → parked long-poll", &base),
        ("letagents 1:1: send → recipient's inbox wait", &la),
        (&la_past_name, &la_past),
        ("group of 2: send → the other member's listen wait", &g2_all),
        ("group of 5: send → each member's listen wait", &g5_each),
        ("group of 5: send → all 4 members", &g5_all),
        (&past, &g2_past),
    ];
    for (name, v) in rows {
        let (p50, p95) = (pct(v, 0.5), pct(v, 0.95));
        println!("| {name} | {p50:.2} ms | {p95:.2} ms | {:.1}× | {:.1}× |", p50 / b50, p95 / b95);
    }
}
