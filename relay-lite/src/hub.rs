//! Wake-ups for live delivery: the writer publishes each mailbox's newest committed `seq` right
//! after the commit, and websocket sessions and parked long-polls watching that mailbox wake and
//! read what is new. Keys are letagents mailbox ids, or `stringcup/...` keys for Stringcup inboxes
//! and rendezvous (see `store::stringcup`), which can never collide with them.
//!
//! A `watch` channel per watched mailbox coalesces bursts and cannot lose a wake-up: a session
//! subscribes before it reads the backlog, then reads everything above the last seq it sent
//! whenever the value changes.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;

/// Per-mailbox newest-seq channels, only for mailboxes somebody is watching.
#[derive(Debug, Default)]
pub struct Hub {
    watched: Mutex<HashMap<String, watch::Sender<i64>>>,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<i64>>> {
        // A panic while holding this lock cannot leave the map inconsistent; keep going.
        self.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts watching `mailbox`; the receiver changes whenever a newer seq commits.
    pub fn subscribe(&self, mailbox: &str) -> watch::Receiver<i64> {
        let mut map = self.lock();
        match map.get(mailbox) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(0);
                map.insert(mailbox.to_owned(), tx);
                rx
            }
        }
    }

    /// Forgets `mailbox` once its last watcher is gone (call after dropping the receiver).
    pub fn release(&self, mailbox: &str) {
        let mut map = self.lock();
        if map.get(mailbox).is_some_and(|tx| tx.receiver_count() == 0) {
            map.remove(mailbox);
        }
    }

    /// Announces that `seq` committed in `mailbox`.
    pub fn publish(&self, mailbox: &str, seq: i64) {
        let map = self.lock();
        if let Some(tx) = map.get(mailbox) {
            tx.send_if_modified(|newest| {
                if seq > *newest {
                    *newest = seq;
                    true
                } else {
                    false
                }
            });
        }
    }

    /// Whether a websocket session is watching `mailbox` (such a mailbox is not idle).
    pub fn is_watched(&self, mailbox: &str) -> bool {
        self.lock().get(mailbox).is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// Wakes every watcher without a newer value, so each re-reads what it waits for: after
    /// wake-ups may have been lost (another instance's, while the database listener
    /// reconnected) or were too many to name one by one.
    pub fn poke_all(&self) {
        for tx in self.lock().values() {
            tx.send_modify(|_| {});
        }
    }

    /// Drops channels nobody watches any more.
    pub fn prune(&self) {
        self.lock().retain(|_, tx| tx.receiver_count() > 0);
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
}
