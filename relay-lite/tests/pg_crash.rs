//! Crash consistency across instances on PostgreSQL (issue 15): three `relay-lite` processes on
//! one database; 32 concurrent senders post 1,200 unique envelopes across four mailboxes, half
//! through A and half through B, while B is SIGKILLed and restarted (same port) three times.
//! Afterwards every envelope that got `202` from either instance is readable through C (and A
//! serves the same pages), and no envelope is there twice.
//!
//! The senders' retry policy and the bookkeeping are `crash_common`'s (shared with `crash.rs`).
//!
//! Needs PostgreSQL (see `pg_common`): skipped with a reason without it, failed under
//! `SWITCHBOARD_REQUIRE_POSTGRES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
mod crash_common;
mod pg_common;

use std::sync::Arc;
use std::time::Instant;

use common::{Api, BinRelay, Owner, decode, http_client, start_binary};
use crash_common::{Delivered, Senders, UNLIMITED};
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

async fn instance(url: &str, data: &str, listen: &str) -> BinRelay {
    let args = ["--listen", listen, "--data", data, "--database", url, "--public-url", PUBLIC];
    let args: Vec<&str> = args.iter().chain(&UNLIMITED).copied().collect();
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

    // Envelope i goes through A when i is even, through B when odd.
    let a_addr = a.addr;
    let senders = Senders::start(
        &owners,
        || {
            vec![
                Api { http: http_client(), addr: a_addr, scheme: "http" },
                Api { http: http_client(), addr: b_addr, scheme: "http" },
            ]
        },
        SENDERS,
        ENVELOPES,
    );
    for threshold in KILL_AT {
        senders.answered_at_least(threshold).await;
        b.child.kill().await.unwrap(); // SIGKILL
        b = instance(&url, &data(1), &b_addr.to_string()).await;
        assert_eq!(b.addr, b_addr, "B restarted on the same port");
    }
    let fates = senders.fates().await;

    // Drain every mailbox through C, checking that A serves the same page first.
    let mut delivered = Delivered::default();
    for (m, owner) in owners.iter().enumerate() {
        loop {
            let through_c = page(&c, owner).await.msgs;
            let through_a = page(&a, owner).await.msgs;
            let seqs: Vec<i64> = through_c.iter().map(|w| w.seq).collect();
            assert_eq!(through_a.iter().map(|w| w.seq).collect::<Vec<_>>(), seqs, "A and C disagree");
            if through_c.is_empty() {
                break;
            }
            delivered.page(m, MAILBOXES, &through_c.iter().map(|w| (w.seq, decode(&w.ct))).collect::<Vec<_>>());
            ack(&c, owner, &seqs).await;
        }
    }
    let (accepted, unknown, unknown_stored, total) = delivered.check(&fates);
    eprintln!(
        "pg crash test: {} kills of B, {accepted} accepted, {unknown} unknown ({unknown_stored} of them stored \
         anyway), {total} delivered, {:?}",
        KILL_AT.len(),
        started.elapsed()
    );
}
