//! The durable outbox, shared by every channel: queuing a sealed payload with its message and
//! audit rows in the caller's transaction, the commit-then-wake tail of a send, and the worker
//! that posts due payloads through their channel with full-jitter exponential backoff.
//!
//! - A payload is committed before any network I/O; every retry posts the exact stored bytes.
//! - `Retry-After` is honoured; a payload the relay keeps refusing is given up (`failed`) when
//!   its channel says (letagents: 48 h; Agent Mail: the message's deadline; Stringcup: never).
//! - A relay found unreachable is not tried again in the same pass.
//! - A row for a nearby contact (the LAN layer, `engine/lan.rs`) is offered directly first, one
//!   try; if that fails the relay gets it in the same attempt. The path is recorded.
//! - A person's message (`engine/people.rs`) whose channel fails (relay unreachable, refused for
//!   good, or given up; unreachable only after [`FALL_BACK_UNREACHABLE_AFTER_MS`]) is handed
//!   to the person's next channel once; the first row is `rerouted` and names where it went.

use std::time::Duration;

/// How long a person's message waits on an unreachable relay before it goes to the person's next
/// channel (a permanent refusal or a give-up moves it at once).
pub const FALL_BACK_UNREACHABLE_AFTER_MS: i64 = 10 * 60 * 1000;

use super::{Event, Result, Runtime};
use crate::store::{self, ContactRow, DeliveryPath, NewMessage, OutboxRow, Protocol, Queued};
use crate::transport::letagents::SendOutcome;
use crate::util::{now_ms, random_array};

/// First retry delay.
pub const BACKOFF_BASE_MS: i64 = 500;
/// Largest retry delay.
pub const BACKOFF_CAP_MS: i64 = 30_000;

/// Full-jitter exponential backoff: a delay in [d/2, d] with d = min(cap, base * 2^attempt).
pub fn backoff_ms(attempt: u32) -> i64 {
    let d = BACKOFF_BASE_MS.saturating_mul(1i64 << attempt.min(20)).min(BACKOFF_CAP_MS);
    let r = i64::from(u16::from_le_bytes(random_array::<2>()));
    d / 2 + (d / 2) * r / i64::from(u16::MAX)
}

/// A sealed outgoing message, ready to queue: what the messages table shows and what the
/// outbox posts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sealed<'a> {
    /// The message id (letagents and Agent Mail: the protocol's id; Stringcup: the
    /// Idempotency-Key).
    pub id: &'a str,
    /// Its protocol.
    pub protocol: Protocol,
    /// The contact it goes to.
    pub contact: &'a ContactRow,
    /// Its kind.
    pub kind: &'a str,
    /// What `inbox`/`conversation` show (text, or JSON for structured kinds).
    pub body: &'a str,
    /// The message it answers.
    pub reply_to: Option<&'a str>,
    /// The local agent sending it.
    pub from_agent: Option<&'a str>,
    /// The peer's agent it is for.
    pub to_agent: Option<&'a str>,
    /// The sender's timestamp.
    pub ts: i64,
    /// Where it is posted.
    pub relay_url: &'a str,
    /// The relay's name for the recipient.
    pub target: &'a str,
    /// letagents' drop code, else empty.
    pub drop_code: &'a [u8],
    /// The exact bytes every attempt posts.
    pub payload: &'a [u8],
}

/// Records `s` in `tx`: the outgoing message (queued, hidden from `inbox`), the outbox entry and
/// the `queued` audit row. The caller commits with [`Runtime::commit_queued`].
pub(super) async fn queue(tx: &mut sqlx::SqliteConnection, s: Sealed<'_>, now: i64) -> Result<()> {
    Ok(store::Stmt::execute_all(queue_stmts(s, now), tx).await?)
}

/// [`queue`] as statements, for a [`store::BatchTx`] (committed with
/// [`Runtime::commit_batch_queued`]).
pub(super) fn queue_stmts(s: Sealed<'_>, now: i64) -> [store::Stmt; 3] {
    let message = store::insert_message_stmt(&NewMessage {
        id: s.id,
        direction: "out",
        protocol: s.protocol,
        contact_id: Some(s.contact.id),
        peer: &s.contact.peer_id,
        kind: s.kind,
        body: s.body,
        reply_to: s.reply_to,
        from_agent: s.from_agent,
        to_agent: s.to_agent,
        ts: s.ts,
        state: "queued",
        hidden: true,
        now,
    });
    let out = Queued {
        message_id: s.id,
        protocol: s.protocol,
        kind: s.kind,
        relay_url: s.relay_url,
        target: s.target,
        peer: &s.contact.peer_id,
        drop_code: s.drop_code,
        payload: s.payload,
    };
    let [entry, audit] = store::enqueue_stmts(out, now);
    [message, entry, audit]
}

/// What one delivery attempt came to.
pub(super) enum Attempt {
    Accepted,
    Unreachable,
    Later,
}

impl Runtime {
    /// Commits a transaction that queued payloads, then wakes the outbox worker.
    pub(super) async fn commit_queued(&self, tx: sqlx::Transaction<'static, sqlx::Sqlite>) -> Result<()> {
        tx.commit().await?;
        self.inner.outbox_wake.notify_one();
        Ok(())
    }

    /// [`Self::commit_queued`] for statements queued on a [`store::BatchTx`] (durable: the
    /// envelope is on disk before any attempt posts it).
    pub(super) async fn commit_batch_queued(&self, tx: store::BatchTx) -> Result<()> {
        tx.commit().await?;
        self.inner.outbox_wake.notify_one();
        Ok(())
    }

    /// The payload is with the relay or the nearby contact: off the outbox, the path recorded.
    async fn handed_over(&self, row: &OutboxRow, path: DeliveryPath) -> Result<Attempt> {
        self.store().outbox_handed_over(row, path, now_ms()).await?;
        if !matches!(row.kind.as_str(), "receipt" | "roster" | "hello") {
            self.emit(Event::Delivery { id: row.message_id.clone(), state: "relayed".into() });
        }
        Ok(Attempt::Accepted)
    }

    /// One delivery attempt: directly when the contact is nearby (one try), else (or when that
    /// fails) through the row's channel to the relay, in the same attempt.
    async fn attempt(&self, row: OutboxRow) -> Result<Attempt> {
        if self.lan_try_direct(&row).await {
            return self.handed_over(&row, DeliveryPath::Direct).await;
        }
        let now = now_ms();
        let outcome = self.channel(row.protocol).attempt(self, &row).await?;
        match outcome {
            SendOutcome::Accepted => self.handed_over(&row, DeliveryPath::Relay).await,
            SendOutcome::Retry { after_ms, reason } => {
                if reason.starts_with("unreachable") && self.fall_back_if_long_down(&row, now, &reason).await? {
                    self.set_health("disconnected", &reason);
                    return Ok(Attempt::Unreachable);
                }
                if self.give_up_if_due(&row, now, &reason).await? {
                    return Ok(Attempt::Later);
                }
                let attempt = u32::try_from(row.attempts).unwrap_or(u32::MAX);
                let delay = after_ms.unwrap_or(0).max(backoff_ms(attempt));
                self.store().outbox_retry(row.id, now + delay, &reason).await?;
                if reason.starts_with("unreachable") {
                    self.set_health("disconnected", &reason);
                    return Ok(Attempt::Unreachable);
                }
                Ok(Attempt::Later)
            }
            SendOutcome::Permanent(reason) => {
                if self.fall_back(&row, &reason).await? {
                    return Ok(Attempt::Later);
                }
                self.store().outbox_failed(&row, &reason, now).await?;
                Ok(Attempt::Later)
            }
        }
    }

    /// Gives `row` up (`failed`, with `reason` as the last refusal) if its channel's give-up time
    /// has come. Returns whether it did.
    /// A person's message whose relay has been down a while goes to their next channel. Not at
    /// once: every channel of a profile usually shares one relay, and a brief outage would
    /// otherwise push every message down to the last channel (Stringcup, whose sender is only
    /// relay-asserted). True when it moved.
    async fn fall_back_if_long_down(&self, row: &OutboxRow, now: i64, reason: &str) -> Result<bool> {
        Ok(now - row.created_at >= FALL_BACK_UNREACHABLE_AFTER_MS && self.fall_back(row, reason).await?)
    }

    async fn give_up_if_due(&self, row: &OutboxRow, now: i64, reason: &str) -> Result<bool> {
        match self.channel(row.protocol).give_up_at(row) {
            Some((at, when)) if now >= at => {
                if self.fall_back(row, &format!("gave up {when}: {reason}")).await? {
                    return Ok(true);
                }
                self.store().outbox_failed(row, &format!("gave up {when}: {reason}"), now).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// One pass over the outbox: everything due now, or everything queued with `force` (an
    /// explicit flush, or a one-shot command that has no daemon to wait for). A relay found
    /// unreachable is not tried again in the same pass. Returns how many the relay accepted.
    pub async fn flush_once(&self, force: bool) -> Result<usize> {
        let until = if force { i64::MAX } else { now_ms() };
        let mut sent = 0;
        let mut down: Vec<String> = Vec::new();
        for row in self.store().due_outbox(until, 500)? {
            if down.contains(&row.relay_url) {
                // The relay is down, but a nearby contact may still take it directly; if not, a
                // deadline still passes while the relay is down.
                if self.lan_try_direct(&row).await {
                    self.handed_over(&row, DeliveryPath::Direct).await?;
                    sent += 1;
                } else {
                    let (now, why) = (now_ms(), "unreachable: the relay did not answer");
                    if !self.fall_back_if_long_down(&row, now, why).await? {
                        self.give_up_if_due(&row, now, why).await?;
                    }
                }
                continue;
            }
            let url = row.relay_url.clone();
            match self.attempt(row).await? {
                Attempt::Accepted => sent += 1,
                Attempt::Unreachable => down.push(url),
                Attempt::Later => {}
            }
        }
        Ok(sent)
    }

    pub(super) async fn outbox_loop(self) {
        let mut stop = self.inner.shutdown.subscribe();
        loop {
            if let Err(e) = self.flush_once(false).await {
                tracing::warn!("outbox: {e}");
            }
            let next = self.store().next_outbox_time().ok().flatten();
            let wait = next.map_or(60_000, |t| (t - now_ms()).clamp(10, 60_000));
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(1000))) => {}
                _ = self.inner.outbox_wake.notified() => {}
                _ = stop.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded_and_jittered() {
        for attempt in 0..40 {
            let d = backoff_ms(attempt);
            let full = (BACKOFF_BASE_MS << attempt.min(20)).min(BACKOFF_CAP_MS);
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d}");
        }
        assert!(backoff_ms(100) <= BACKOFF_CAP_MS);
    }
}
