//! What the SIGKILL tests share (`crash.rs`: one SQLite relay killed and restarted;
//! `pg_crash.rs`: instances on one PostgreSQL, one of them killed): numbered envelopes, the
//! senders and their retry policy, and the final bookkeeping.
//!
//! Retry policy of the senders: a send that failed to *connect* never reached the relay, so it
//! is retried until it gets an answer. A send that failed after connecting (the relay died
//! mid-request) has an unknown fate: the relay may have committed it before dying. It is not
//! retried (a retry could legitimately store it twice; receivers dedup by message id, the relay
//! does not) and may be delivered once or not at all, never twice.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::{Api, Owner, envelope};

/// The flags that let the senders' load through: no send or IP rate limit, room for every
/// envelope in one mailbox.
pub const UNLIMITED: [&str; 6] =
    ["--sends-per-minute", "0", "--ip-requests-per-minute", "0", "--mailbox-capacity", "100000"];

/// What a sender knows of one envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The relay answered `202`: it must be delivered exactly once.
    Accepted,
    /// The relay died mid-request: delivered once or not at all.
    Unknown,
}

/// Envelope number `i` (its number is readable in the bytes).
pub fn body(i: usize) -> Vec<u8> {
    envelope(&format!("<envelope {i:05}>"), 1_200)
}

/// The number of an envelope made by [`body`].
pub fn index_of(body: &[u8]) -> usize {
    let end = body.iter().position(|b| *b == b'>').unwrap();
    let text = std::str::from_utf8(&body[3..=end]).unwrap();
    text.strip_prefix("<envelope ").unwrap().strip_suffix('>').unwrap().parse().unwrap()
}

/// Senders posting envelopes `0..envelopes` to `owners` (envelope `i` to mailbox
/// `i % owners.len()`), `senders` at once, envelope `i` through `through(i)`'s relay; each
/// answered send counts in the returned counter. [`Senders::fates`] waits for them.
pub struct Senders {
    pub answered: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<Vec<(usize, Fate)>>>,
    envelopes: usize,
}

impl Senders {
    /// Starts them; `apis` are the relays to send through, envelope `i` through
    /// `apis[i % apis.len()]`.
    pub fn start(owners: &Arc<Vec<Owner>>, apis: impl Fn() -> Vec<Api>, senders: usize, envelopes: usize) -> Self {
        let answered = Arc::new(AtomicUsize::new(0));
        let tasks = (0..senders)
            .map(|s| {
                let owners = owners.clone();
                let answered = answered.clone();
                let through = apis();
                tokio::spawn(async move {
                    let mut fates = Vec::new();
                    for i in (s..envelopes).step_by(senders) {
                        let owner = &owners[i % owners.len()];
                        let api = &through[i % through.len()];
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
                })
            })
            .collect();
        Self { answered, tasks, envelopes }
    }

    /// Waits until `n` sends were answered (or failed).
    pub async fn answered_at_least(&self, n: usize) {
        while self.answered.load(Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Every envelope's fate, once all senders finished.
    pub async fn fates(self) -> BTreeMap<usize, Fate> {
        let mut fates = BTreeMap::new();
        for task in self.tasks {
            for (i, fate) in task.await.unwrap() {
                fates.insert(i, fate);
            }
        }
        assert_eq!(fates.len(), self.envelopes);
        fates
    }
}

/// What a drain found, envelope by envelope.
#[derive(Default)]
pub struct Delivered {
    count: HashMap<usize, usize>,
    last_seq: HashMap<usize, i64>,
}

impl Delivered {
    /// Records one page of mailbox `mailbox` (of `mailboxes`): seqs grow, each envelope is in its
    /// own mailbox.
    pub fn page(&mut self, mailbox: usize, mailboxes: usize, page: &[(i64, Vec<u8>)]) {
        for (seq, bytes) in page {
            let last = self.last_seq.entry(mailbox).or_default();
            assert!(*seq > *last, "seqs grow: {seq} after {last}");
            *last = *seq;
            let i = index_of(bytes);
            assert_eq!(i % mailboxes, mailbox, "envelope {i} in the wrong mailbox");
            *self.count.entry(i).or_default() += 1;
        }
    }

    /// Checks the outcome: nothing twice, every accepted envelope there, most accepted. Returns
    /// (accepted, unknown, unknown but stored anyway, delivered).
    pub fn check(&self, fates: &BTreeMap<usize, Fate>) -> (usize, usize, usize, usize) {
        let twice: Vec<_> = self.count.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "delivered more than once: {twice:?}");
        let lost: Vec<usize> = fates
            .iter()
            .filter(|(i, f)| **f == Fate::Accepted && !self.count.contains_key(i))
            .map(|(i, _)| *i)
            .collect();
        assert!(lost.is_empty(), "{} accepted envelopes lost: {lost:?}", lost.len());
        let accepted = fates.values().filter(|f| **f == Fate::Accepted).count();
        assert!(accepted > fates.len() / 2, "only {accepted} accepted");
        let unknown_stored = fates.iter().filter(|(i, f)| **f == Fate::Unknown && self.count.contains_key(i)).count();
        (accepted, fates.len() - accepted, unknown_stored, self.count.len())
    }
}
