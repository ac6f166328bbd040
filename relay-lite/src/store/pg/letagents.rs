//! letagents v1 on PostgreSQL: the same requests and outcomes as [`crate::store::letagents`],
//! with the mailbox row locked (`FOR UPDATE`) wherever a write reads what it then changes, so
//! instances writing one mailbox take turns.

use async_trait::async_trait;
use axum::body::Bytes;
use futures_util::future::BoxFuture;
use sqlx::{PgConnection, PgPool};

use super::{PgStore, lock_keys, sweep_lock, try_sweep_lock};
use crate::hub::{Committed, Hub};
use crate::store::letagents::{Ack, Deposit, DepositOutcome, Login, LoginOutcome, Sweep, SweepReport, Waiting, same};
use crate::store::writer::Request;
use crate::store::{LetagentsStore, StoreError};

/// One statement on the common path, as on SQLite: the envelope is inserted only if the mailbox
/// exists, the drop hash matches and fewer than `capacity` wait; the triggers of
/// `migrations-pg/0006` advance `next_seq` and the `waiting` counter in the same statement. Only a
/// refused deposit reads again, to tell "no such mailbox or wrong drop" from "full" (comparing
/// with [`same`]; the SQL `drop_hash = $2` compares SHA-256 hashes of drops, see
/// [`crate::store::letagents`]). The batch already holds this mailbox's key lock (see `locks`),
/// so no other instance's deposit, login or ack runs meanwhile; `FOR UPDATE` also keeps a sweep
/// from erasing the mailbox before the commit.
async fn deposit(conn: &mut PgConnection, d: &Deposit) -> Result<DepositOutcome, sqlx::Error> {
    let stored: Option<i64> = sqlx::query_scalar(
        "INSERT INTO la_envelope (mailbox, seq, received_ms, body) \
         SELECT id, next_seq, $3, $4 FROM la_mailbox WHERE id = $1 AND drop_hash = $2 AND waiting < $5 \
         FOR UPDATE RETURNING seq",
    )
    .bind(&d.mailbox)
    .bind(&d.drop_hash)
    .bind(d.now)
    .bind(d.body.as_ref())
    .bind(d.capacity)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(seq) = stored {
        return Ok(DepositOutcome::Stored { seq });
    }
    let drop_hash: Option<String> = sqlx::query_scalar("SELECT drop_hash FROM la_mailbox WHERE id = $1")
        .bind(&d.mailbox)
        .fetch_optional(&mut *conn)
        .await?;
    match drop_hash {
        Some(h) if same(h.as_bytes(), d.drop_hash.as_bytes()) => Ok(DepositOutcome::Full),
        _ => Ok(DepositOutcome::NoMailbox),
    }
}

async fn login(conn: &mut PgConnection, l: &Login) -> Result<LoginOutcome, sqlx::Error> {
    let created = sqlx::query(
        "INSERT INTO la_mailbox (id, drop_hash, last_login_ms, last_active_ms, next_seq, created_ms) \
         VALUES ($1, $2, $3, $4, 1, $4) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&l.mailbox)
    .bind(&l.drop_hash)
    .bind(l.ts)
    .bind(l.now)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if created == 1 {
        return Ok(LoginOutcome::Created);
    }
    let last: i64 = sqlx::query_scalar("SELECT last_login_ms FROM la_mailbox WHERE id = $1 FOR UPDATE")
        .bind(&l.mailbox)
        .fetch_one(&mut *conn)
        .await?;
    if l.ts <= last {
        return Ok(LoginOutcome::Replay);
    }
    sqlx::query("UPDATE la_mailbox SET drop_hash = $1, last_login_ms = $2, last_active_ms = $3 WHERE id = $4")
        .bind(&l.drop_hash)
        .bind(l.ts)
        .bind(l.now)
        .bind(&l.mailbox)
        .execute(&mut *conn)
        .await?;
    Ok(LoginOutcome::Updated)
}

async fn ack(conn: &mut PgConnection, a: &Ack) -> Result<Vec<i64>, sqlx::Error> {
    let deleted: Vec<i64> =
        sqlx::query_scalar("DELETE FROM la_envelope WHERE mailbox = $1 AND seq = ANY($2) RETURNING seq")
            .bind(&a.mailbox)
            .bind(&a.seqs)
            .fetch_all(&mut *conn)
            .await?;
    // In the order asked, each once (as the SQLite backend answers).
    let mut left: std::collections::BTreeSet<i64> = deleted.into_iter().collect();
    let acked = a.seqs.iter().copied().filter(|seq| left.remove(seq)).collect();
    sqlx::query("UPDATE la_mailbox SET last_active_ms = GREATEST(last_active_ms, $1) WHERE id = $2")
        .bind(a.now)
        .bind(&a.mailbox)
        .execute(&mut *conn)
        .await?;
    Ok(acked)
}

async fn sweep(conn: &mut PgConnection, s: &Sweep, hub: &Hub) -> Result<SweepReport, sqlx::Error> {
    if !try_sweep_lock(conn, sweep_lock::LETAGENTS).await? {
        tracing::debug!("another instance is sweeping letagents");
        return Ok(SweepReport::default());
    }
    // Deleting an envelope updates its mailbox's row (the waiting counter's trigger), as a
    // deposit does: take the batch locks of the mailboxes it will touch first, so the sweep queues
    // behind (or ahead of) other instances' batches on those mailboxes instead of locking their
    // rows in another order (a deadlock, broken only after `deadlock_timeout`).
    let touched: Vec<String> = sqlx::query_scalar("SELECT DISTINCT mailbox FROM la_envelope WHERE received_ms < $1")
        .bind(s.expire_before)
        .fetch_all(&mut *conn)
        .await?;
    let keys: Vec<String> = touched.iter().map(|m| mailbox_lock(m)).collect();
    lock_keys(conn, &keys).await?;
    let expired = sqlx::query("DELETE FROM la_envelope WHERE received_ms < $1")
        .bind(s.expire_before)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    let idle: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM la_mailbox AS m WHERE last_active_ms < $1 \
         AND NOT EXISTS (SELECT 1 FROM la_envelope AS e WHERE e.mailbox = m.id)",
    )
    .bind(s.idle_before)
    .fetch_all(&mut *conn)
    .await?;
    let mut erased = 0;
    for id in idle {
        // A mailbox its owner is connected to (through this instance) is not idle.
        if hub.is_watched(&id) {
            continue;
        }
        erased += sqlx::query(
            "DELETE FROM la_mailbox AS m WHERE id = $1 AND last_active_ms < $2 \
             AND NOT EXISTS (SELECT 1 FROM la_envelope AS e WHERE e.mailbox = m.id)",
        )
        .bind(&id)
        .bind(s.idle_before)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    }
    tracing::debug!(now = s.now, expired, erased, "sweep applied");
    Ok(SweepReport { expired, erased })
}

impl Request<PgConnection> for Deposit {
    type Out = DepositOutcome;

    fn bytes(&self) -> usize {
        self.body.len()
    }

    fn run<'a>(&'a self, conn: &'a mut PgConnection, _: &'a Hub) -> BoxFuture<'a, Result<DepositOutcome, sqlx::Error>> {
        Box::pin(deposit(conn, self))
    }

    fn wakeup(&self, out: &DepositOutcome) -> Option<(String, i64)> {
        self.wakeup_for(out)
    }

    fn wakeup_body(&self, _out: &DepositOutcome) -> Option<Committed> {
        Some(Committed::Envelope(self.body.clone()))
    }

    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(mailbox_lock(&self.mailbox));
    }
}

impl Request<PgConnection> for Login {
    type Out = LoginOutcome;

    fn run<'a>(&'a self, conn: &'a mut PgConnection, _: &'a Hub) -> BoxFuture<'a, Result<LoginOutcome, sqlx::Error>> {
        Box::pin(login(conn, self))
    }

    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(mailbox_lock(&self.mailbox));
    }
}

impl Request<PgConnection> for Ack {
    type Out = Vec<i64>;

    fn run<'a>(&'a self, conn: &'a mut PgConnection, _: &'a Hub) -> BoxFuture<'a, Result<Vec<i64>, sqlx::Error>> {
        Box::pin(ack(conn, self))
    }

    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(mailbox_lock(&self.mailbox));
    }
}

/// The batch lock key of a mailbox row.
fn mailbox_lock(mailbox: &str) -> String {
    format!("la/{mailbox}")
}

impl Request<PgConnection> for Sweep {
    type Out = SweepReport;

    fn run<'a>(&'a self, conn: &'a mut PgConnection, hub: &'a Hub) -> BoxFuture<'a, Result<SweepReport, sqlx::Error>> {
        Box::pin(sweep(conn, self, hub))
    }
}

async fn waiting(pool: &PgPool, mailbox: &str, after: i64, limit: usize) -> Result<Vec<Waiting>, sqlx::Error> {
    let rows: Vec<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT seq, body FROM la_envelope WHERE mailbox = $1 AND seq > $2 ORDER BY seq LIMIT $3")
            .bind(mailbox)
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(|(seq, body)| Waiting { seq, body }).collect())
}

#[async_trait]
impl LetagentsStore for PgStore {
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
        Ok(sqlx::query_scalar("SELECT drop_hash FROM la_mailbox WHERE id = $1")
            .bind(mailbox)
            .fetch_optional(&self.read)
            .await?)
    }

    async fn waiting(&self, mailbox: &str, after: i64, limit: usize) -> Result<Vec<Waiting>, StoreError> {
        Ok(waiting(&self.read, mailbox, after, limit).await?)
    }

    async fn waiting_count(&self, mailbox: &str) -> Result<i64, StoreError> {
        // The counter the triggers of `migrations-pg/0006` keep; 0 for no mailbox.
        let waiting: Option<i64> = sqlx::query_scalar("SELECT waiting FROM la_mailbox WHERE id = $1")
            .bind(mailbox)
            .fetch_optional(&self.read)
            .await?;
        Ok(waiting.unwrap_or(0))
    }
}
