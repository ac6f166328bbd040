//! Crash consistency of the `relay-lite` binary: 32 concurrent senders post 2,000 unique
//! envelopes across four mailboxes while the relay is SIGKILLed and restarted (same data
//! directory, same port) four times. Afterwards every envelope that got `202` is in its inbox,
//! and no envelope is delivered twice.
//!
//! The senders' retry policy and the bookkeeping are `crash_common`'s.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
mod crash_common;

use std::sync::Arc;
use std::time::Instant;

use common::{Api, BinRelay, Owner, decode, http_client, start_binary};
use crash_common::{Delivered, Senders, UNLIMITED};

const SENDERS: usize = 32;
const ENVELOPES: usize = 2_000;
const MAILBOXES: usize = 4;
/// Kill the relay when this many sends have been answered (or failed).
const KILL_AT: [usize; 4] = [300, 700, 1_100, 1_500];

fn relay_args(data: &str, listen: &str) -> Vec<String> {
    ["--listen", listen, "--data", data].iter().chain(&UNLIMITED).map(|s| (*s).to_owned()).collect()
}

async fn start(args: &[String]) -> BinRelay {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_binary(&args, http_client()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_accepted_envelope_survives_sigkill_and_none_is_delivered_twice() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let mut relay = start(&relay_args(&data, "127.0.0.1:0")).await;
    let addr = relay.addr;
    let restart_args = relay_args(&data, &addr.to_string());

    let owners: Arc<Vec<Owner>> = Arc::new((0..MAILBOXES).map(|_| Owner::new()).collect());
    for owner in owners.iter() {
        relay.inbox(owner).await;
    }

    let senders =
        Senders::start(&owners, || vec![Api { http: http_client(), addr, scheme: "http" }], SENDERS, ENVELOPES);
    let mut kills = 0;
    for threshold in KILL_AT {
        senders.answered_at_least(threshold).await;
        relay.child.kill().await.unwrap(); // SIGKILL
        kills += 1;
        relay = start(&restart_args).await;
        assert_eq!(relay.addr, addr, "restarted on the same port");
    }
    let fates = senders.fates().await;

    // Drain every inbox through the plain API: read a page, ack it, until empty.
    let mut delivered = Delivered::default();
    for (m, owner) in owners.iter().enumerate() {
        loop {
            let page = relay.inbox(owner).await.msgs;
            if page.is_empty() {
                break;
            }
            let seqs: Vec<i64> = page.iter().map(|w| w.seq).collect();
            delivered.page(m, MAILBOXES, &page.iter().map(|w| (w.seq, decode(&w.ct))).collect::<Vec<_>>());
            assert_eq!(relay.ack(owner, &seqs).await.acked, seqs);
        }
    }
    let (accepted, unknown, unknown_stored, total) = delivered.check(&fates);
    assert_eq!(kills, KILL_AT.len());
    eprintln!(
        "crash test: {kills} kills, {accepted} accepted, {unknown} unknown ({unknown_stored} of them \
         stored anyway), {total} delivered, {:?}",
        started.elapsed()
    );
}
