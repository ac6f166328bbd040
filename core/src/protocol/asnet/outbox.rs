//! The reply outbox's decisions, sans-io: which queued reply to send next and when, what a
//! failure does, and when a reply is dropped.
//!
//! - every send (of any reply) is at least [`MIN_SEND_INTERVAL_MS`] after the previous one;
//! - a failed send is retried at most [`MAX_RETRIES`] times with exponential backoff
//!   ([`backoff_ms`]); a permanent failure, or the last retry failing, makes it dead;
//! - a reply not sent by its `expires_at` (15 minutes after it was queued) is expired;
//! - sent, dead and expired entries lose their body (codes and private results are not kept).
//!
//! The caller persists [`Entry`] values and [`Pacer`] in its store; nothing here reads a clock.

use super::service::Reply;
use super::{Mailbox, ResponseId};

/// Retries after the first attempt.
pub const MAX_RETRIES: u32 = 5;
/// Least time between two sends.
pub const MIN_SEND_INTERVAL_MS: i64 = 1000;
/// Backoff before the first retry; doubles for each further one.
pub const BACKOFF_BASE_MS: i64 = 2000;

/// The wait after the `failures`-th failed attempt (1-based): 2 s, 4 s, 8 s, 16 s, 32 s.
pub fn backoff_ms(failures: u32) -> i64 {
    BACKOFF_BASE_MS.saturating_mul(1i64 << failures.saturating_sub(1).min(20))
}

/// Where a queued reply is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Waiting for its next attempt.
    Queued,
    /// Handed to the mail server.
    Sent,
    /// Permanent failure or retries exhausted.
    Dead,
    /// Not sent within its lifetime.
    Expired,
}

impl EntryState {
    /// The storage name.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::Queued => "queued",
            EntryState::Sent => "sent",
            EntryState::Dead => "dead",
            EntryState::Expired => "expired",
        }
    }

    /// Parses the storage name.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "queued" => Some(EntryState::Queued),
            "sent" => Some(EntryState::Sent),
            "dead" => Some(EntryState::Dead),
            "expired" => Some(EntryState::Expired),
            _ => None,
        }
    }
}

/// One reply in the outbox, in the form a dispatcher persists and renders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Stable across attempts (`X-ASNET-Response-ID`).
    pub response_id: ResponseId,
    /// The destination mailbox.
    pub to: Mailbox,
    /// The reply type (`CHALLENGE`, …), for the subject line.
    pub kind: String,
    /// The JSON body; emptied once the entry is sent, dead or expired.
    pub body: String,
    /// Discard unsent at this time (Unix ms).
    pub expires_at: i64,
    /// Failed attempts so far.
    pub failures: u32,
    /// Earliest time of the next attempt (Unix ms).
    pub next_attempt_at: i64,
    /// The state.
    pub state: EntryState,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The mail server accepted the message.
    Sent,
    /// A temporary failure (connection, 4xx): retry after backoff.
    Temporary,
    /// A permanent failure (5xx): never retry.
    Permanent,
}

impl Entry {
    /// A queued entry for a reply produced by the service, due at once.
    pub fn from_reply(reply: &Reply) -> Self {
        Self {
            response_id: reply.response_id,
            to: reply.to.clone(),
            kind: reply.body.type_name().to_owned(),
            body: reply.body_text(),
            expires_at: reply.expires_at,
            failures: 0,
            next_attempt_at: reply.created_at,
            state: EntryState::Queued,
        }
    }

    /// Whether it may be attempted at `now` (pacing aside).
    pub fn is_due(&self, now: i64) -> bool {
        self.state == EntryState::Queued && now >= self.next_attempt_at && now < self.expires_at
    }

    /// Marks a queued entry past its lifetime as expired; returns whether it changed.
    pub fn expire(&mut self, now: i64) -> bool {
        if self.state == EntryState::Queued && now >= self.expires_at {
            self.state = EntryState::Expired;
            self.body.clear();
            return true;
        }
        false
    }

    /// Records how an attempt at `now` ended.
    pub fn record(&mut self, attempt: Attempt, now: i64) {
        match attempt {
            Attempt::Sent => {
                self.state = EntryState::Sent;
                self.body.clear();
            }
            Attempt::Permanent => {
                self.state = EntryState::Dead;
                self.body.clear();
            }
            Attempt::Temporary => {
                self.failures = self.failures.saturating_add(1);
                if self.failures > MAX_RETRIES {
                    self.state = EntryState::Dead;
                    self.body.clear();
                } else {
                    self.next_attempt_at = now.saturating_add(backoff_ms(self.failures));
                    self.expire(now);
                }
            }
        }
    }
}

/// The global send pacing: at most one send per [`MIN_SEND_INTERVAL_MS`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pacer {
    /// When the last send was attempted (Unix ms).
    pub last_send_at: Option<i64>,
}

impl Pacer {
    /// The earliest time the next send may start.
    pub fn next_slot(&self) -> i64 {
        self.last_send_at.map_or(i64::MIN, |t| t.saturating_add(MIN_SEND_INTERVAL_MS))
    }

    /// Records a send attempt starting at `now`.
    pub fn record_send(&mut self, now: i64) {
        self.last_send_at = Some(now);
    }
}

/// What the dispatcher should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Attempt the entry at this index now (then `Pacer::record_send` and `Entry::record`).
    Send(usize),
    /// Nothing may be sent before this time (Unix ms).
    WaitUntil(i64),
    /// Nothing is queued.
    Idle,
}

/// Picks the next action over `entries` (expired entries should have been marked first with
/// [`Entry::expire`]). The oldest due entry goes first, so replies keep their order.
pub fn next(entries: &[Entry], pacer: &Pacer, now: i64) -> Next {
    let queued = entries.iter().enumerate().filter(|(_, e)| e.state == EntryState::Queued && now < e.expires_at);
    let Some((index, entry)) = queued.min_by_key(|(i, e)| (e.next_attempt_at, *i)) else {
        return Next::Idle;
    };
    let at = entry.next_attempt_at.max(pacer.next_slot());
    if at <= now { Next::Send(index) } else { Next::WaitUntil(at) }
}
