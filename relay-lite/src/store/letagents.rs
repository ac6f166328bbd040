//! SQL for letagents v1 mailboxes (`la_mailbox`) and their waiting envelopes (`la_envelope`).
//!
//! Write functions run inside the writer's batch transaction; read functions use the reader
//! pool. All queries are checked at run time (no `query!` macros, no DATABASE_URL at build time).

use async_trait::async_trait;
use axum::body::Bytes;
use rusqlite::OptionalExtension as _;
use sqlx::SqlitePool;

use super::sync::{SyncDb, rows};
use super::writer::sync_request;
use super::{LetagentsStore, SqliteStore, StoreError};
use crate::hub::{Committed, Hub};

/// A send to store.
#[derive(Debug)]
pub struct Deposit {
    /// Recipient mailbox id.
    pub mailbox: String,
    /// b64u(SHA-256(drop)) computed from the sender's `x-la-drop`.
    pub drop_hash: String,
    /// The opaque envelope.
    pub body: Bytes,
    /// Most envelopes that may wait.
    pub capacity: i64,
    /// Relay clock (ms).
    pub now: i64,
}

/// What happened to a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepositOutcome {
    /// Committed under this seq.
    Stored {
        /// Per-mailbox sequence number.
        seq: i64,
    },
    /// No such mailbox, or the drop does not match (deliberately one outcome).
    NoMailbox,
    /// `capacity` envelopes are already waiting.
    Full,
}

/// An authenticated login to record.
#[derive(Debug)]
pub struct Login {
    /// Mailbox id.
    pub mailbox: String,
    /// The drop hash the owner announces.
    pub drop_hash: String,
    /// The login's signed timestamp.
    pub ts: i64,
    /// Relay clock (ms).
    pub now: i64,
}

/// Result of recording a login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginOutcome {
    /// Accepted; the mailbox was created.
    Created,
    /// Accepted; the mailbox existed and its drop hash and login time were updated.
    Updated,
    /// Refused: `ts` is not newer than the last accepted login.
    Replay,
}

/// An authenticated ack.
#[derive(Debug)]
pub struct Ack {
    /// Mailbox id.
    pub mailbox: String,
    /// Seqs to delete.
    pub seqs: Vec<i64>,
    /// Relay clock (ms).
    pub now: i64,
}

/// A retention and idle sweep.
#[derive(Debug)]
pub struct Sweep {
    /// Relay clock (ms).
    pub now: i64,
    /// Envelopes received before this are deleted.
    pub expire_before: i64,
    /// Empty mailboxes last active before this are erased.
    pub idle_before: i64,
}

/// What a sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Envelopes deleted for age.
    pub expired: u64,
    /// Mailboxes erased for idleness.
    pub erased: u64,
}

/// One waiting envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Sequence number.
    pub seq: i64,
    /// The envelope bytes.
    pub body: Vec<u8>,
}

impl Deposit {
    /// The hub key and seq to announce once a stored deposit commits.
    pub(crate) fn wakeup_for(&self, out: &DepositOutcome) -> Option<(String, i64)> {
        match out {
            DepositOutcome::Stored { seq } => Some((self.mailbox.clone(), *seq)),
            _ => None,
        }
    }
}

sync_request!(Deposit => DepositOutcome, deposit, {
    fn bytes(&self) -> usize {
        self.body.len()
    }

    fn wakeup(&self, out: &DepositOutcome) -> Option<(String, i64)> {
        self.wakeup_for(out)
    }

    fn wakeup_body(&self, _out: &DepositOutcome) -> Option<Committed> {
        Some(Committed::Envelope(self.body.clone()))
    }
});

sync_request!(Login => LoginOutcome, login);
sync_request!(Ack => Vec<i64>, ack);
sync_request!(Sweep => SweepReport, sweep);

#[async_trait]
impl LetagentsStore for SqliteStore {
    async fn deposit(
        &self,
        mailbox: &str,
        drop_hash: &str,
        body: Bytes,
        capacity: usize,
        now: i64,
    ) -> Result<DepositOutcome, StoreError> {
        self.submit(Deposit::new(mailbox, drop_hash, body, capacity, now)).await
    }

    async fn login(&self, mailbox: &str, drop_hash: &str, ts: i64, now: i64) -> Result<LoginOutcome, StoreError> {
        self.submit(Login { mailbox: mailbox.to_owned(), drop_hash: drop_hash.to_owned(), ts, now }).await
    }

    async fn ack(&self, mailbox: &str, seqs: Vec<i64>, now: i64) -> Result<Vec<i64>, StoreError> {
        self.submit(Ack { mailbox: mailbox.to_owned(), seqs, now }).await
    }

    async fn sweep(&self, now: i64, expire_before: i64, idle_before: i64) -> Result<SweepReport, StoreError> {
        self.submit(Sweep { now, expire_before, idle_before }).await
    }

    async fn drop_hash(&self, mailbox: &str) -> Result<Option<String>, StoreError> {
        Ok(drop_hash(&self.read, mailbox).await?)
    }

    async fn waiting(&self, mailbox: &str, after: i64, limit: usize) -> Result<Vec<Waiting>, StoreError> {
        Ok(waiting(&self.read, mailbox, after, limit).await?)
    }

    async fn waiting_count(&self, mailbox: &str) -> Result<i64, StoreError> {
        Ok(waiting_count(&self.read, mailbox).await?)
    }
}

impl Deposit {
    /// A deposit of `body` into `mailbox`.
    pub(crate) fn new(mailbox: &str, drop_hash: &str, body: Bytes, capacity: usize, now: i64) -> Self {
        Self {
            mailbox: mailbox.to_owned(),
            drop_hash: drop_hash.to_owned(),
            body,
            capacity: i64::try_from(capacity).unwrap_or(i64::MAX),
            now,
        }
    }
}

/// Equality that takes the same time wherever the first difference is.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One statement on the common path: the envelope is inserted only if the mailbox exists, the
/// drop hash matches and fewer than `capacity` wait; the triggers of migration 0007 advance
/// `next_seq` and the `waiting` counter in the same statement. Only a refused deposit reads
/// again, to tell "no such mailbox or wrong drop" from "full".
///
/// The SQL `drop_hash = ?` comparison is not constant-time, but it compares SHA-256 hashes of
/// drops, not drops: learning how many leading characters of the stored hash a guess's hash
/// matches does not help anyone find a drop with that hash. The refusal path compares with
/// [`same`] like before.
pub(crate) fn deposit(db: &SyncDb, d: &Deposit, _: &Hub) -> rusqlite::Result<DepositOutcome> {
    let stored: Option<i64> = db
        .prepare_cached(
            "INSERT INTO la_envelope (mailbox, seq, received_ms, body) \
             SELECT id, next_seq, ?3, ?4 FROM la_mailbox WHERE id = ?1 AND drop_hash = ?2 AND waiting < ?5 \
             RETURNING seq",
        )?
        .query_row((&d.mailbox, &d.drop_hash, d.now, d.body.as_ref(), d.capacity), |row| row.get(0))
        .optional()?;
    if let Some(seq) = stored {
        return Ok(DepositOutcome::Stored { seq });
    }
    let drop_hash: Option<String> = db
        .prepare_cached("SELECT drop_hash FROM la_mailbox WHERE id = ?")?
        .query_row([&d.mailbox], |row| row.get(0))
        .optional()?;
    match drop_hash {
        Some(h) if same(h.as_bytes(), d.drop_hash.as_bytes()) => Ok(DepositOutcome::Full),
        _ => Ok(DepositOutcome::NoMailbox),
    }
}

pub(crate) fn login(db: &SyncDb, l: &Login, _: &Hub) -> rusqlite::Result<LoginOutcome> {
    let last: Option<i64> = db
        .prepare_cached("SELECT last_login_ms FROM la_mailbox WHERE id = ?")?
        .query_row([&l.mailbox], |row| row.get(0))
        .optional()?;
    match last {
        Some(last) if l.ts <= last => Ok(LoginOutcome::Replay),
        Some(_) => {
            db.prepare_cached(
                "UPDATE la_mailbox SET drop_hash = ?, last_login_ms = ?, last_active_ms = ? WHERE id = ?",
            )?
            .execute((&l.drop_hash, l.ts, l.now, &l.mailbox))?;
            Ok(LoginOutcome::Updated)
        }
        None => {
            db.prepare_cached(
                "INSERT INTO la_mailbox (id, drop_hash, last_login_ms, last_active_ms, next_seq, created_ms) \
                 VALUES (?, ?, ?, ?, 1, ?)",
            )?
            .execute((&l.mailbox, &l.drop_hash, l.ts, l.now, l.now))?;
            Ok(LoginOutcome::Created)
        }
    }
}

pub(crate) fn ack(db: &SyncDb, a: &Ack, _: &Hub) -> rusqlite::Result<Vec<i64>> {
    let mut acked = Vec::new();
    let mut delete = db.prepare_cached("DELETE FROM la_envelope WHERE mailbox = ? AND seq = ?")?;
    for &seq in &a.seqs {
        if delete.execute((&a.mailbox, seq))? > 0 {
            acked.push(seq);
        }
    }
    db.prepare_cached("UPDATE la_mailbox SET last_active_ms = max(last_active_ms, ?) WHERE id = ?")?
        .execute((a.now, &a.mailbox))?;
    Ok(acked)
}

pub(crate) fn sweep(db: &SyncDb, s: &Sweep, hub: &Hub) -> rusqlite::Result<SweepReport> {
    let expired = db.prepare_cached("DELETE FROM la_envelope WHERE received_ms < ?")?.execute([s.expire_before])?;
    let idle: Vec<String> = db
        .prepare_cached("SELECT id FROM la_mailbox WHERE last_active_ms < ? AND waiting = 0")?
        .query_map([s.idle_before], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut erased = 0;
    let mut delete = db.prepare_cached("DELETE FROM la_mailbox WHERE id = ?")?;
    for id in idle {
        // A mailbox its owner is connected to right now is not idle, whatever the clock says.
        if hub.is_watched(&id) {
            continue;
        }
        erased += delete.execute([&id])?;
    }
    let (expired, erased) = (rows(expired), rows(erased));
    tracing::debug!(now = s.now, expired, erased, "sweep applied");
    Ok(SweepReport { expired, erased })
}

pub(crate) async fn drop_hash(pool: &SqlitePool, mailbox: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT drop_hash FROM la_mailbox WHERE id = ?").bind(mailbox).fetch_optional(pool).await
}

pub(crate) async fn waiting(
    pool: &SqlitePool,
    mailbox: &str,
    after: i64,
    limit: usize,
) -> Result<Vec<Waiting>, sqlx::Error> {
    let rows: Vec<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT seq, body FROM la_envelope WHERE mailbox = ? AND seq > ? ORDER BY seq LIMIT ?")
            .bind(mailbox)
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(|(seq, body)| Waiting { seq, body }).collect())
}

/// The mailbox's `waiting` counter (kept by the triggers of migration 0007); 0 for no mailbox.
pub(crate) async fn waiting_count(pool: &SqlitePool, mailbox: &str) -> Result<i64, sqlx::Error> {
    let n: Option<i64> =
        sqlx::query_scalar("SELECT waiting FROM la_mailbox WHERE id = ?").bind(mailbox).fetch_optional(pool).await?;
    Ok(n.unwrap_or(0))
}
