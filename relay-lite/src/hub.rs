//! Wake-ups for live delivery: the writer publishes each mailbox's newest committed `seq` right
//! after the commit, and websocket sessions and parked long-polls watching that mailbox wake and
//! read what is new. Keys are letagents mailbox ids, or `stringcup/...` keys for Stringcup inboxes
//! and rendezvous (see `store::stringcup`), which can never collide with them.
//!
//! A `watch` channel per watched mailbox coalesces bursts and cannot lose a wake-up: a session
//! subscribes before it reads the backlog, then reads everything above the last seq it sent
//! whenever the value changes.
//!
//! A write that commits something a watcher sends on (a letagents deposit's envelope, a Stringcup
//! message) also hands it to the hub (the writer publishes each batch at once,
//! [`Hub::publish_batch`]); for watched keys the hub keeps the newest few as one unbroken run of
//! seqs, so a live session or a woken long-poll sends them without reading them back
//! ([`Hub::recent_envelopes_after`], [`Hub::recent_stringcup_after`]). Any wake-up without its
//! body for a newer seq (another instance's commit, a lost wake-up)
//! breaks the run, and the watcher reads the store as before.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use tokio::sync::watch;

use crate::store::stringcup::{StoredMessage, TokenCache};

/// What a committed write hands the hub for its watchers. A key only ever carries one kind
/// (letagents mailbox ids and `stringcup/...` keys cannot collide).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// A letagents envelope, as deposited.
    Envelope(Bytes),
    /// A Stringcup message, as a read of the recipient's inbox returns it.
    Stringcup(Arc<StoredMessage>),
}

impl Committed {
    /// Bytes held, for the per-key cap.
    fn len(&self) -> usize {
        match self {
            Self::Envelope(b) => b.len(),
            Self::Stringcup(m) => m.ciphertext.len() + m.sender.len() + m.header_extra.len() + 64,
        }
    }
}

/// Most committed bodies kept per watched key.
const RECENT_ENTRIES: usize = 64;
/// Most committed bytes kept per watched key.
const RECENT_BYTES: usize = 256 * 1024;

/// One watched key: its newest-seq channel and the newest committed bodies, consecutive seqs.
#[derive(Debug)]
struct Watched {
    tx: watch::Sender<i64>,
    recent: VecDeque<(i64, Committed)>,
    recent_bytes: usize,
}

impl Watched {
    fn new(tx: watch::Sender<i64>) -> Self {
        Self { tx, recent: VecDeque::new(), recent_bytes: 0 }
    }

    fn forget_recent(&mut self) {
        self.recent.clear();
        self.recent_bytes = 0;
    }

    /// Records `seq` (with its body if known) as committed.
    fn record(&mut self, seq: i64, body: Option<Committed>) {
        let newest = self.recent.back().map_or(*self.tx.borrow(), |(s, _)| *s);
        match body {
            _ if seq <= newest => {}
            Some(body) if seq == newest + 1 || self.recent.is_empty() => {
                if seq != newest + 1 {
                    self.forget_recent();
                }
                self.recent_bytes += body.len();
                self.recent.push_back((seq, body));
                while self.recent.len() > RECENT_ENTRIES || self.recent_bytes > RECENT_BYTES {
                    let Some((_, old)) = self.recent.pop_front() else { break };
                    self.recent_bytes -= old.len();
                }
            }
            // A newer seq whose bytes the hub does not have: the run is broken.
            _ => self.forget_recent(),
        }
    }
}

/// Per-mailbox newest-seq channels, only for mailboxes somebody is watching; and, since the hub
/// hears every committed write, the cache those writes keep exact (`Hub::stringcup_tokens`).
#[derive(Debug, Default)]
pub struct Hub {
    watched: Mutex<HashMap<String, Watched>>,
    stringcup_tokens: TokenCache,
}

impl Hub {
    /// The Stringcup bearer tokens the SQLite backend looked up, updated by the writes that
    /// change them as each settles.
    pub(crate) fn stringcup_tokens(&self) -> &TokenCache {
        &self.stringcup_tokens
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Watched>> {
        // A panic while holding this lock cannot leave the map inconsistent; keep going.
        self.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts watching `mailbox`; the receiver changes whenever a newer seq commits.
    pub fn subscribe(&self, mailbox: &str) -> watch::Receiver<i64> {
        let mut map = self.lock();
        match map.get(mailbox) {
            Some(w) => w.tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(0);
                map.insert(mailbox.to_owned(), Watched::new(tx));
                rx
            }
        }
    }

    /// Forgets `mailbox` once its last watcher is gone (call after dropping the receiver).
    pub fn release(&self, mailbox: &str) {
        let mut map = self.lock();
        if map.get(mailbox).is_some_and(|w| w.tx.receiver_count() == 0) {
            map.remove(mailbox);
        }
    }

    /// Announces that `seq` committed in `mailbox`.
    pub fn publish(&self, mailbox: &str, seq: i64) {
        self.publish_inner(mailbox, seq, None);
    }

    /// Announces that `seq` committed in `mailbox` holding `body`, which watchers may then send
    /// without reading it back (see [`Hub::recent_envelopes_after`]).
    pub fn publish_body(&self, mailbox: &str, seq: i64, body: Committed) {
        self.publish_inner(mailbox, seq, Some(body));
    }

    /// Announces everything one batch committed, under one lock of the hub: a watcher woken by
    /// the first key's announcement reads the hub only after the whole batch is recorded, so a
    /// long-poll woken by a send of several messages answers with all of them (published one by
    /// one, a woken watcher could read the hub between two of them).
    pub fn publish_batch(&self, committed: impl IntoIterator<Item = (String, i64, Option<Committed>)>) {
        let mut map = self.lock();
        for (key, seq, body) in committed {
            Self::publish_locked(&mut map, &key, seq, body);
        }
    }

    fn publish_inner(&self, mailbox: &str, seq: i64, body: Option<Committed>) {
        Self::publish_locked(&mut self.lock(), mailbox, seq, body);
    }

    fn publish_locked(map: &mut HashMap<String, Watched>, mailbox: &str, seq: i64, body: Option<Committed>) {
        if let Some(w) = map.get_mut(mailbox) {
            w.record(seq, body);
            w.tx.send_if_modified(|newest| {
                if seq > *newest {
                    *newest = seq;
                    true
                } else {
                    false
                }
            });
        }
    }

    /// The committed bodies of `mailbox` with seqs above `after`, oldest first, if the hub holds
    /// every one of them up to the newest published seq; `None` when the caller must read the
    /// store (the run starts later, was broken, or nothing newer was published with its body).
    fn recent_after<T>(&self, key: &str, after: i64, take: impl Fn(&Committed) -> Option<T>) -> Option<Vec<(i64, T)>> {
        let map = self.lock();
        let w = map.get(key)?;
        let (first, _) = w.recent.front()?;
        let (last, _) = w.recent.back()?;
        if *first > after + 1 || *last <= after || *last != *w.tx.borrow() {
            return None;
        }
        w.recent.iter().filter(|(seq, _)| *seq > after).map(|(seq, c)| Some((*seq, take(c)?))).collect()
    }

    /// The letagents envelopes committed in `mailbox` above seq `after` (see `recent_after`).
    pub fn recent_envelopes_after(&self, mailbox: &str, after: i64) -> Option<Vec<(i64, Bytes)>> {
        self.recent_after(mailbox, after, |c| match c {
            Committed::Envelope(b) => Some(b.clone()),
            Committed::Stringcup(_) => None,
        })
    }

    /// The Stringcup messages committed under inbox key `key` with ids above `after`, oldest
    /// first (see `recent_after`).
    pub fn recent_stringcup_after(&self, key: &str, after: i64) -> Option<Vec<Arc<StoredMessage>>> {
        let run = self.recent_after(key, after, |c| match c {
            Committed::Stringcup(m) => Some(m.clone()),
            Committed::Envelope(_) => None,
        })?;
        Some(run.into_iter().map(|(_, m)| m).collect())
    }

    /// Whether a websocket session is watching `mailbox` (such a mailbox is not idle).
    pub fn is_watched(&self, mailbox: &str) -> bool {
        self.lock().get(mailbox).is_some_and(|w| w.tx.receiver_count() > 0)
    }

    /// Wakes every watcher without a newer value, so each re-reads what it waits for: after
    /// wake-ups may have been lost (another instance's, while the database listener
    /// reconnected) or were too many to name one by one.
    pub fn poke_all(&self) {
        for w in self.lock().values_mut() {
            w.forget_recent();
            w.tx.send_modify(|_| {});
        }
    }

    /// Drops channels nobody watches any more.
    pub fn prune(&self) {
        self.lock().retain(|_, w| w.tx.receiver_count() > 0);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watcher_wakes_on_publish_and_release_forgets_the_mailbox() {
        let hub = Hub::default();
        let mut rx = hub.subscribe("m");
        hub.publish("m", 3);
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), 3);
        hub.publish("m", 2);
        assert!(!rx.has_changed().unwrap(), "older seqs do not wake anybody");
        assert!(hub.is_watched("m"));
        drop(rx);
        hub.release("m");
        assert!(!hub.is_watched("m"));
    }

    #[tokio::test]
    async fn committed_bodies_are_handed_out_only_as_an_unbroken_run_up_to_the_newest_seq() {
        let hub = Hub::default();
        let env = |b: &'static [u8]| Committed::Envelope(Bytes::from_static(b));
        hub.publish_body("m", 1, env(b"unwatched"));
        let _rx = hub.subscribe("m");
        assert_eq!(hub.recent_envelopes_after("m", 0), None, "nothing kept while nobody watched");
        hub.publish_body("m", 1, env(b"one"));
        hub.publish_body("m", 2, env(b"two"));
        assert_eq!(
            hub.recent_envelopes_after("m", 0),
            Some(vec![(1, Bytes::from_static(b"one")), (2, Bytes::from_static(b"two"))])
        );
        assert_eq!(hub.recent_envelopes_after("m", 1), Some(vec![(2, Bytes::from_static(b"two"))]));
        assert_eq!(hub.recent_envelopes_after("m", 2), None, "nothing newer");
        // Seq 3 committed elsewhere (no bytes): the run is broken, sessions read the store.
        hub.publish("m", 3);
        assert_eq!(hub.recent_envelopes_after("m", 2), None);
        hub.publish_body("m", 4, env(b"four"));
        assert_eq!(hub.recent_envelopes_after("m", 2), None, "seq 3 is missing");
        assert_eq!(hub.recent_envelopes_after("m", 3), Some(vec![(4, Bytes::from_static(b"four"))]));
        // A repeated wake-up for a seq already held changes nothing; a lost one breaks the run.
        hub.publish("m", 4);
        assert_eq!(hub.recent_envelopes_after("m", 3), Some(vec![(4, Bytes::from_static(b"four"))]));
        hub.poke_all();
        assert_eq!(hub.recent_envelopes_after("m", 3), None);
        for seq in 5..5 + RECENT_ENTRIES as i64 + 10 {
            hub.publish_body("m", seq, env(b"x"));
        }
        assert_eq!(hub.recent_envelopes_after("m", 5), None, "the oldest fell out of the bounded run");
        let newest = 4 + RECENT_ENTRIES as i64 + 10;
        assert_eq!(hub.recent_envelopes_after("m", newest - 2).map(|v| v.len()), Some(2));
    }

    #[tokio::test]
    async fn stringcup_messages_are_handed_out_as_such_and_a_key_of_the_other_kind_reads_the_store() {
        let hub = Hub::default();
        let msg = |id: i64| {
            Arc::new(StoredMessage {
                id,
                sender: "s".into(),
                header_version: 2,
                header_algo: "a".into(),
                ephemeral_pub: vec![1; 32],
                iv: vec![2; 12],
                header_extra: String::new(),
                ciphertext: vec![3; 40],
                created_ms: 7,
            })
        };
        let _rx = hub.subscribe("k");
        hub.publish_body("k", 1, Committed::Stringcup(msg(1)));
        hub.publish_body("k", 2, Committed::Stringcup(msg(2)));
        assert_eq!(hub.recent_stringcup_after("k", 0), Some(vec![msg(1), msg(2)]));
        assert_eq!(hub.recent_stringcup_after("k", 1), Some(vec![msg(2)]));
        assert_eq!(hub.recent_envelopes_after("k", 0), None, "not envelopes: read the store");
        hub.publish_body("k", 3, Committed::Envelope(Bytes::from_static(b"x")));
        assert_eq!(hub.recent_stringcup_after("k", 1), None, "a run with another kind in it is not handed out");
    }
}
