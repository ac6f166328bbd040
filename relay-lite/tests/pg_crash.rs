//! Crash consistency across instances on PostgreSQL (issue 15): three `relay-lite` processes on
//! one database; 32 concurrent senders post 1,200 unique envelopes across four mailboxes, half
//! through A and half through B, while B is SIGKILLed and restarted (same port) three times.
//! Afterwards every envelope that got `202` from either instance is readable through C (and A
//! serves the same pages), and no envelope is there twice.
//!
//! The senders' retry policy is `crash.rs`'s: a send that failed to connect never reached the
//! relay and is retried; one that failed after connecting (B died mid-request) has an unknown
//! fate and may be stored once or not at all, never twice.
//!
//! Needs PostgreSQL (see `pg_common`): skipped with a reason without it, failed under
//! `SWITCHBOARD_REQUIRE_POSTGRES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
mod pg_common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Api, BinRelay, Owner, decode, envelope, http_client, start_binary};
use switchboard_core::protocol::letagents::relay_auth;
use switchboard_core::protocol::letagents::wire::InboxResponse;

/// The name every instance answers to (what clients sign logins for).
const PUBLIC: &str = "http://relay.test";
const HOST: &str = "relay.test";
const SENDERS: usize = 32;
const ENVELOPES: usize = 1_200;
const MAILBOXES: usize = 4;
/// Kill B when this many sends have been answered (or failed).
const KILL_AT: [usize; 3] = [250, 550, 850];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Accepted,
    Unknown,
}

fn body(i: usize) -> Vec<u8> {
    envelope(&format!("<envelope {i:05}>"), 1_200)
}

fn index_of(body: &[u8]) -> usize {
    let end = body.iter().position(|b| *b == b'>').unwrap();
    let text = std::str::from_utf8(&body[3..=end]).unwrap();
    text.strip_prefix("<envelope ").unwrap().strip_suffix('>').unwrap().parse().unwrap()
}

async fn instance(url: &str, data: &str, listen: &str) -> BinRelay {
    let args = [
        "--listen",
        listen,
        "--data",
        data,
        "--database",
        url,
        "--public-url",
        PUBLIC,
        "--sends-per-minute",
        "0",
        "--ip-requests-per-minute",
        "0",
        "--mailbox-capacity",
        "100000",
    ];
    start_binary(&args, http_client()).await
}

/// One page of `owner`'s waiting envelopes through `api` (a login signed for the public name).
async fn page(api: &Api, owner: &Owner) -> InboxResponse {
    let r = api.inbox_raw(owner, &owner.login(HOST).query()).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    r.json().await.unwrap()
}

async fn ack(api: &Api, owner: &Owner, seqs: &[i64]) {
    let query = relay_auth::sign_ack(&owner.key, HOST, owner.next_ts(), seqs);
    let r = api.http.post(api.url(&format!("/v1/ack/{}?{query}", owner.id))).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_write_acknowledged_by_a_or_a_killed_b_is_readable_through_c_and_none_twice() {
    let Some(pg) = pg_common::cluster() else { return };
    let url = pg.fresh_database().await;
    let started = Instant::now();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let data = |i: usize| dirs[i].path().to_str().unwrap().to_owned();
    // One at a time: the first runs the migrations.
    let a = instance(&url, &data(0), "127.0.0.1:0").await;
    let mut b = instance(&url, &data(1), "127.0.0.1:0").await;
    let c = instance(&url, &data(2), "127.0.0.1:0").await;
    let b_addr = b.addr;

    let owners: Arc<Vec<Owner>> = Arc::new((0..MAILBOXES).map(|_| Owner::new()).collect());
    for owner in owners.iter() {
        page(&a, owner).await;
    }

    let answered = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let owners = owners.clone();
        let answered = answered.clone();
        let through = [
            Api { http: http_client(), addr: a.addr, scheme: "http" },
            Api { http: http_client(), addr: b_addr, scheme: "http" },
        ];
        senders.push(tokio::spawn(async move {
            let mut fates = Vec::new();
            for i in (s..ENVELOPES).step_by(SENDERS) {
                let owner = &owners[i % MAILBOXES];
                let api = &through[i % 2];
                let fate = loop {
                    match api.try_send_raw(&owner.id, &owner.drop, body(i)).await {
                        Ok(r) if r.status() == 202 => break Fate::Accepted,
                        Ok(r) if r.status().is_server_error() => break Fate::Unknown,
                        Ok(r) => panic!("envelope {i}: unexpected {}", r.status()),
                        Err(e) if e.is_connect() => tokio::time::sleep(Duration::from_millis(10)).await,
                        Err(_) => break Fate::Unknown,
                    }
                };
                answered.fetch_add(1, Ordering::SeqCst);
                fates.push((i, fate));
            }
            fates
        }));
    }

    for threshold in KILL_AT {
        while answered.load(Ordering::SeqCst) < threshold {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        b.child.kill().await.unwrap(); // SIGKILL
        b = instance(&url, &data(1), &b_addr.to_string()).await;
        assert_eq!(b.addr, b_addr, "B restarted on the same port");
    }

    let mut fates = BTreeMap::new();
    for sender in senders {
        for (i, fate) in sender.await.unwrap() {
            fates.insert(i, fate);
        }
    }
    assert_eq!(fates.len(), ENVELOPES);
    let accepted = fates.values().filter(|f| **f == Fate::Accepted).count();

    // Drain every mailbox through C, checking that A serves the same page first.
    let mut delivered: HashMap<usize, usize> = HashMap::new();
    for (m, owner) in owners.iter().enumerate() {
        let mut last_seq = 0;
        loop {
            let through_c = page(&c, owner).await.msgs;
            let through_a = page(&a, owner).await.msgs;
            let seqs: Vec<i64> = through_c.iter().map(|w| w.seq).collect();
            assert_eq!(through_a.iter().map(|w| w.seq).collect::<Vec<_>>(), seqs, "A and C disagree");
            if through_c.is_empty() {
                break;
            }
            for w in &through_c {
                assert!(w.seq > last_seq, "seqs grow: {} after {last_seq}", w.seq);
                last_seq = w.seq;
                let i = index_of(&decode(&w.ct));
                assert_eq!(i % MAILBOXES, m, "envelope {i} in the wrong mailbox");
                *delivered.entry(i).or_default() += 1;
            }
            ack(&c, owner, &seqs).await;
        }
    }

    let twice: Vec<_> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let lost: Vec<usize> =
        fates.iter().filter(|(i, f)| **f == Fate::Accepted && !delivered.contains_key(i)).map(|(i, _)| *i).collect();
    assert!(lost.is_empty(), "{} acknowledged envelopes lost: {lost:?}", lost.len());
    assert!(accepted > ENVELOPES / 2, "only {accepted} accepted");
    let unknown_delivered = fates.iter().filter(|(i, f)| **f == Fate::Unknown && delivered.contains_key(i)).count();
    eprintln!(
        "pg crash test: {} kills of B, {accepted} accepted, {} unknown ({unknown_delivered} of them stored \
         anyway), {} delivered, {:?}",
        KILL_AT.len(),
        ENVELOPES - accepted,
        delivered.len(),
        started.elapsed()
    );
}
