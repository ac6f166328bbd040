//! Crash consistency of the `relay-lite` binary: 32 concurrent senders post 2,000 unique
//! envelopes across four mailboxes while the relay is SIGKILLed and restarted (same data
//! directory, same port) four times. Afterwards every envelope that got `202` is in its inbox,
//! and no envelope is delivered twice.
//!
//! Retry policy of the senders: a send that failed to *connect* never reached the relay, so it
//! is retried until it gets an answer. A send that failed after connecting (the relay died
//! mid-request) has an unknown fate: the relay may have committed it before dying. It is not
//! retried (a retry could legitimately store it twice; receivers dedup by message id, the relay
//! does not) and the test allows it to be either delivered once or absent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Api, BinRelay, Owner, decode, envelope, http_client, start_binary};

const SENDERS: usize = 32;
const ENVELOPES: usize = 2_000;
const MAILBOXES: usize = 4;
/// Kill the relay when this many sends have been answered (or failed).
const KILL_AT: [usize; 4] = [300, 700, 1_100, 1_500];

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

fn relay_args(data: &str, listen: &str) -> Vec<String> {
    [
        "--listen",
        listen,
        "--data",
        data,
        "--sends-per-minute",
        "0",
        "--ip-requests-per-minute",
        "0",
        "--mailbox-capacity",
        "100000",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
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

    let answered = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let owners = owners.clone();
        let answered = answered.clone();
        let api = Api { http: http_client(), addr, scheme: "http" };
        senders.push(tokio::spawn(async move {
            let mut fates = Vec::new();
            for i in (s..ENVELOPES).step_by(SENDERS) {
                let owner = &owners[i % MAILBOXES];
                let fate = loop {
                    match api.try_send_raw(&owner.id, &owner.drop, body(i)).await {
                        Ok(r) if r.status() == 202 => break Fate::Accepted,
                        Ok(r) if r.status().is_server_error() => break Fate::Unknown,
                        Ok(r) => panic!("envelope {i}: unexpected {}", r.status()),
                        Err(e) if e.is_connect() => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err(_) => break Fate::Unknown,
                    }
                };
                answered.fetch_add(1, Ordering::SeqCst);
                fates.push((i, fate));
            }
            fates
        }));
    }

    let mut kills = 0;
    for threshold in KILL_AT {
        while answered.load(Ordering::SeqCst) < threshold {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        relay.child.kill().await.unwrap(); // SIGKILL
        kills += 1;
        relay = start(&restart_args).await;
        assert_eq!(relay.addr, addr, "restarted on the same port");
    }

    let mut fates = BTreeMap::new();
    for sender in senders {
        for (i, fate) in sender.await.unwrap() {
            fates.insert(i, fate);
        }
    }
    assert_eq!(fates.len(), ENVELOPES);
    let accepted = fates.values().filter(|f| **f == Fate::Accepted).count();

    // Drain every inbox through the plain API: read a page, ack it, until empty.
    let mut delivered: HashMap<usize, usize> = HashMap::new();
    for (m, owner) in owners.iter().enumerate() {
        let mut last_seq = 0;
        loop {
            let page = relay.inbox(owner).await.msgs;
            if page.is_empty() {
                break;
            }
            let seqs: Vec<i64> = page.iter().map(|w| w.seq).collect();
            for w in &page {
                assert!(w.seq > last_seq, "seqs grow: {} after {last_seq}", w.seq);
                last_seq = w.seq;
                let i = index_of(&decode(&w.ct));
                assert_eq!(i % MAILBOXES, m, "envelope {i} in the wrong mailbox");
                *delivered.entry(i).or_default() += 1;
            }
            assert_eq!(relay.ack(owner, &seqs).await.acked, seqs);
        }
    }

    let twice: Vec<_> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let lost: Vec<usize> =
        fates.iter().filter(|(i, f)| **f == Fate::Accepted && !delivered.contains_key(i)).map(|(i, _)| *i).collect();
    assert!(lost.is_empty(), "{} accepted envelopes lost: {lost:?}", lost.len());
    let unknown_delivered = fates.iter().filter(|(i, f)| **f == Fate::Unknown && delivered.contains_key(i)).count();
    assert_eq!(kills, KILL_AT.len());
    assert!(accepted > ENVELOPES / 2, "only {accepted} accepted");
    eprintln!(
        "crash test: {kills} kills, {accepted} accepted, {} unknown ({unknown_delivered} of them \
         stored anyway), {} delivered, {:?}",
        ENVELOPES - accepted,
        delivered.len(),
        started.elapsed()
    );
}
