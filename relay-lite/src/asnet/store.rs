//! The ASNET/1 service's SQLite store: its own database file (`asnet.sqlite3` in the data
//! directory, migrations in `asnet-migrations/`), so it shares nothing with the relay's store
//! and its writer.
//!
//! - [`SqlStore`] implements the protocol core's synchronous [`Store`] trait on one open
//!   transaction (`BEGIN IMMEDIATE`); [`AsnetDb::receive`] runs the core's `receive` on a blocking
//!   thread, queues its replies in the outbox table and commits it all at once, so state,
//!   consumed challenges and offers, delivery ids, budgets and replies change together or not at
//!   all;
//! - the outbox dispatcher reads and updates [`Entry`] rows and the [`Pacer`] row here;
//! - one pooled connection: every write is serialized (SQLite has one writer anyway).

use std::path::Path;
use std::time::Duration;

use sqlx::ConnectOptions as _;
use sqlx::Row as _;
use sqlx::sqlite::{
    Sqlite, SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use switchboard_core::protocol::asnet::command::Action;
use switchboard_core::protocol::asnet::outbox::{Entry, EntryState, Pacer};
use switchboard_core::protocol::asnet::store::{Challenge, ChallengeState, Edge, Member, Offer, Pair, Store};
use switchboard_core::protocol::asnet::{
    BUDGET_WINDOW_MS, ChallengeId, Config, DAY_MS, DELIVERY_DEDUP_MS, DeliveryId, EnvelopeIn, Mailbox, MemberId,
    Outcome, RequestId, ResponseId, Scopes, receive, service::ServiceError,
};
use switchboard_core::util::OsRng;
use tokio::runtime::Handle;

/// The database file inside the data directory.
pub const DB_FILE: &str = "asnet.sqlite3";

/// Why the ASNET store failed. All are the relay's fault (local); the SMTP listener answers
/// `451` so the MTA retries.
#[derive(Debug, thiserror::Error)]
pub enum AsnetStoreError {
    /// SQLite failed (disk, corruption, a bug in a query).
    #[error("ASNET database: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed while opening.
    #[error("ASNET migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A row does not decode into the protocol's types (corruption or a bug).
    #[error("ASNET database holds a malformed {0} row")]
    Corrupt(&'static str),
    /// The blocking task running the protocol core panicked or was cancelled (a bug).
    #[error("ASNET worker task failed")]
    Task,
}

type Query<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments>;

/// Handle to the ASNET database.
#[derive(Debug, Clone)]
pub struct AsnetDb {
    pool: SqlitePool,
}

impl AsnetDb {
    /// Opens (or creates) `data_dir/asnet.sqlite3` and runs its migrations.
    pub async fn open(data_dir: &Path) -> Result<Self, AsnetStoreError> {
        let options = SqliteConnectOptions::new()
            .filename(data_dir.join(DB_FILE))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        let mut conn = options.connect().await?;
        sqlx::migrate!("./asnet-migrations").run(&mut conn).await?;
        drop(conn);
        let pool = SqlitePoolOptions::new().max_connections(1).min_connections(1).connect_with(options).await?;
        Ok(Self { pool })
    }

    /// Begins a write transaction for the synchronous [`Store`] trait; `rt` runs its queries, so
    /// call this (and the store's methods) from a thread outside the runtime's async context
    /// (a blocking task or a plain thread).
    pub fn begin_blocking(&self, rt: Handle) -> Result<SqlStore, AsnetStoreError> {
        let tx = rt.block_on(self.pool.begin_with("BEGIN IMMEDIATE"))?;
        Ok(SqlStore { tx, rt })
    }

    /// Runs the protocol core on one trusted envelope and commits its state changes with its
    /// replies queued in the outbox. Nothing is committed when this fails.
    pub async fn receive(&self, config: Config, envelope: EnvelopeIn, now: i64) -> Result<Outcome, AsnetStoreError> {
        let db = self.clone();
        let rt = Handle::current();
        tokio::task::spawn_blocking(move || {
            let mut store = db.begin_blocking(rt)?;
            let outcome = receive(&config, &mut store, &envelope, now, &mut OsRng).map_err(|e| match e {
                ServiceError::Store(e) => e,
            })?;
            for reply in &outcome.outbox {
                store.put_entry(&Entry::from_reply(reply))?;
            }
            store.commit()?;
            Ok(outcome)
        })
        .await
        .map_err(|_| AsnetStoreError::Task)?
    }

    /// Marks queued entries past their lifetime expired (body removed); returns how many.
    pub async fn expire_outbox(&self, now: i64) -> Result<u64, AsnetStoreError> {
        let done = sqlx::query(
            "UPDATE asnet_outbox SET state = 'expired', body = '' WHERE state = 'queued' AND expires_at <= ?",
        )
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Every queued entry, oldest first.
    pub async fn queued(&self) -> Result<Vec<Entry>, AsnetStoreError> {
        let rows = sqlx::query(
            "SELECT response_id, to_mailbox, kind, body, expires_at, failures, next_attempt_at, state \
             FROM asnet_outbox WHERE state = 'queued' ORDER BY seq",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(entry_from_row).collect()
    }

    /// Every entry in any state, oldest first (for operators and tests; bodies of finished
    /// entries are empty).
    pub async fn outbox(&self) -> Result<Vec<Entry>, AsnetStoreError> {
        let rows = sqlx::query(
            "SELECT response_id, to_mailbox, kind, body, expires_at, failures, next_attempt_at, state \
             FROM asnet_outbox ORDER BY seq",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(entry_from_row).collect()
    }

    /// Writes back an entry after an attempt.
    pub async fn save_entry(&self, entry: &Entry) -> Result<(), AsnetStoreError> {
        sqlx::query(
            "UPDATE asnet_outbox SET body = ?, failures = ?, next_attempt_at = ?, state = ? WHERE response_id = ?",
        )
        .bind(&entry.body)
        .bind(i64::from(entry.failures))
        .bind(entry.next_attempt_at)
        .bind(entry.state.as_str())
        .bind(entry.response_id.0.as_slice())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The send pacing.
    pub async fn pacer(&self) -> Result<Pacer, AsnetStoreError> {
        let last: Option<i64> =
            sqlx::query_scalar("SELECT last_send_at FROM asnet_pacer WHERE id = 1").fetch_one(&self.pool).await?;
        Ok(Pacer { last_send_at: last })
    }

    /// Records the start of a send (before it is attempted, so a crash cannot speed sends up).
    pub async fn save_pacer(&self, pacer: &Pacer) -> Result<(), AsnetStoreError> {
        sqlx::query("UPDATE asnet_pacer SET last_send_at = ? WHERE id = 1")
            .bind(pacer.last_send_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Reclaims space: the core's sweep, and finished outbox rows a day after they expired.
    pub async fn sweep(&self, now: i64) -> Result<(), AsnetStoreError> {
        let db = self.clone();
        let rt = Handle::current();
        tokio::task::spawn_blocking(move || {
            let mut store = db.begin_blocking(rt)?;
            store.sweep(now)?;
            store.exec(
                sqlx::query("DELETE FROM asnet_outbox WHERE state != 'queued' AND expires_at <= ?")
                    .bind(now.saturating_sub(DAY_MS)),
            )?;
            store.commit()
        })
        .await
        .map_err(|_| AsnetStoreError::Task)?
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn entry_from_row(row: &SqliteRow) -> Result<Entry, AsnetStoreError> {
    let bad = |_| AsnetStoreError::Corrupt("outbox");
    let rid: Vec<u8> = row.try_get(0).map_err(bad)?;
    let to: String = row.try_get(1).map_err(bad)?;
    let state: String = row.try_get(7).map_err(bad)?;
    let failures: i64 = row.try_get(5).map_err(bad)?;
    Ok(Entry {
        response_id: ResponseId(rid.try_into().map_err(|_| AsnetStoreError::Corrupt("outbox"))?),
        to: Mailbox::parse(&to).map_err(|_| AsnetStoreError::Corrupt("outbox"))?,
        kind: row.try_get(2).map_err(bad)?,
        body: row.try_get(3).map_err(bad)?,
        expires_at: row.try_get(4).map_err(bad)?,
        failures: u32::try_from(failures).map_err(|_| AsnetStoreError::Corrupt("outbox"))?,
        next_attempt_at: row.try_get(6).map_err(bad)?,
        state: EntryState::parse(&state).ok_or(AsnetStoreError::Corrupt("outbox"))?,
    })
}

/// The protocol core's [`Store`] on one open SQLite transaction. Dropping it rolls back.
#[derive(Debug)]
pub struct SqlStore {
    tx: sqlx::Transaction<'static, Sqlite>,
    rt: Handle,
}

fn id16(bytes: Vec<u8>, table: &'static str) -> Result<[u8; 16], AsnetStoreError> {
    bytes.try_into().map_err(|_| AsnetStoreError::Corrupt(table))
}

fn member_from_row(row: &SqliteRow) -> Result<Member, AsnetStoreError> {
    let bad = |_| AsnetStoreError::Corrupt("member");
    let mailbox: String = row.try_get(1).map_err(bad)?;
    Ok(Member {
        id: MemberId(id16(row.try_get(0).map_err(bad)?, "member")?),
        mailbox: Mailbox::parse(&mailbox).map_err(|_| AsnetStoreError::Corrupt("member"))?,
        discovery: row.try_get::<i64, _>(2).map_err(bad)? != 0,
        created_at: row.try_get(3).map_err(bad)?,
    })
}

fn offer_from_row(row: &SqliteRow) -> Result<Offer, AsnetStoreError> {
    let bad = |_| AsnetStoreError::Corrupt("offer");
    let scopes: String = row.try_get(3).map_err(bad)?;
    Ok(Offer {
        id: RequestId(id16(row.try_get(0).map_err(bad)?, "offer")?),
        from: MemberId(id16(row.try_get(1).map_err(bad)?, "offer")?),
        to: MemberId(id16(row.try_get(2).map_err(bad)?, "offer")?),
        scopes: Scopes::from_csv(&scopes).ok_or(AsnetStoreError::Corrupt("offer"))?,
        expires_at: row.try_get(4).map_err(bad)?,
    })
}

fn edge_from_row(row: &SqliteRow) -> Result<Edge, AsnetStoreError> {
    let bad = |_| AsnetStoreError::Corrupt("edge");
    let low = MemberId(id16(row.try_get(0).map_err(bad)?, "edge")?);
    let high = MemberId(id16(row.try_get(1).map_err(bad)?, "edge")?);
    let scopes: String = row.try_get(2).map_err(bad)?;
    Ok(Edge {
        pair: Pair::new(low, high).ok_or(AsnetStoreError::Corrupt("edge"))?,
        scopes: Scopes::from_csv(&scopes).ok_or(AsnetStoreError::Corrupt("edge"))?,
        created_at: row.try_get(3).map_err(bad)?,
    })
}

impl SqlStore {
    /// Commits everything done through this store.
    pub fn commit(self) -> Result<(), AsnetStoreError> {
        let Self { tx, rt } = self;
        rt.block_on(tx.commit())?;
        Ok(())
    }

    fn exec(&mut self, q: Query<'_>) -> Result<u64, AsnetStoreError> {
        Ok(self.rt.block_on(q.execute(&mut *self.tx))?.rows_affected())
    }

    fn one(&mut self, q: Query<'_>) -> Result<Option<SqliteRow>, AsnetStoreError> {
        Ok(self.rt.block_on(q.fetch_optional(&mut *self.tx))?)
    }

    fn all(&mut self, q: Query<'_>) -> Result<Vec<SqliteRow>, AsnetStoreError> {
        Ok(self.rt.block_on(q.fetch_all(&mut *self.tx))?)
    }

    fn count(&mut self, q: Query<'_>) -> Result<u32, AsnetStoreError> {
        let row = self.one(q)?.ok_or(AsnetStoreError::Corrupt("count"))?;
        let n: i64 = row.try_get(0).map_err(|_| AsnetStoreError::Corrupt("count"))?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Queues one outbox entry (in this transaction).
    pub fn put_entry(&mut self, entry: &Entry) -> Result<(), AsnetStoreError> {
        self.exec(
            sqlx::query(
                "INSERT INTO asnet_outbox (response_id, to_mailbox, kind, body, expires_at, failures, \
                 next_attempt_at, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(entry.response_id.0.to_vec())
            .bind(entry.to.as_str().to_owned())
            .bind(entry.kind.clone())
            .bind(entry.body.clone())
            .bind(entry.expires_at)
            .bind(i64::from(entry.failures))
            .bind(entry.next_attempt_at)
            .bind(entry.state.as_str()),
        )?;
        Ok(())
    }
}

impl Store for SqlStore {
    type Error = AsnetStoreError;

    fn delivery_seen_since(&mut self, id: &DeliveryId, since: i64) -> Result<bool, AsnetStoreError> {
        let q = sqlx::query("SELECT 1 FROM asnet_deliveries WHERE delivery_id = ? AND at >= ?")
            .bind(id.as_str().to_owned())
            .bind(since);
        Ok(self.one(q)?.is_some())
    }

    fn record_delivery(&mut self, id: &DeliveryId, at: i64) -> Result<(), AsnetStoreError> {
        self.exec(
            sqlx::query(
                "INSERT INTO asnet_deliveries (delivery_id, at) VALUES (?, ?) \
                 ON CONFLICT (delivery_id) DO UPDATE SET at = excluded.at",
            )
            .bind(id.as_str().to_owned())
            .bind(at),
        )?;
        Ok(())
    }

    fn sender_attempts_since(&mut self, sender: &Mailbox, since: i64) -> Result<u32, AsnetStoreError> {
        self.count(
            sqlx::query("SELECT COUNT(*) FROM asnet_attempts WHERE sender = ? AND at >= ?")
                .bind(sender.as_str().to_owned())
                .bind(since),
        )
    }

    fn global_attempts_since(&mut self, since: i64) -> Result<u32, AsnetStoreError> {
        self.count(sqlx::query("SELECT COUNT(*) FROM asnet_attempts WHERE at >= ?").bind(since))
    }

    fn record_attempt(&mut self, sender: &Mailbox, at: i64) -> Result<(), AsnetStoreError> {
        self.exec(
            sqlx::query("INSERT INTO asnet_attempts (sender, at) VALUES (?, ?)")
                .bind(sender.as_str().to_owned())
                .bind(at),
        )?;
        Ok(())
    }

    fn member(&mut self, id: &MemberId) -> Result<Option<Member>, AsnetStoreError> {
        let q = sqlx::query("SELECT id, mailbox, discovery, created_at FROM asnet_members WHERE id = ?")
            .bind(id.0.to_vec());
        self.one(q)?.as_ref().map(member_from_row).transpose()
    }

    fn member_by_mailbox(&mut self, mailbox: &Mailbox) -> Result<Option<Member>, AsnetStoreError> {
        let q = sqlx::query("SELECT id, mailbox, discovery, created_at FROM asnet_members WHERE mailbox = ?")
            .bind(mailbox.as_str().to_owned());
        self.one(q)?.as_ref().map(member_from_row).transpose()
    }

    fn put_member(&mut self, member: &Member) -> Result<(), AsnetStoreError> {
        self.exec(
            sqlx::query(
                "INSERT INTO asnet_members (id, mailbox, discovery, created_at) VALUES (?, ?, ?, ?) \
                 ON CONFLICT (id) DO UPDATE SET mailbox = excluded.mailbox, discovery = excluded.discovery, \
                 created_at = excluded.created_at",
            )
            .bind(member.id.0.to_vec())
            .bind(member.mailbox.as_str().to_owned())
            .bind(i64::from(member.discovery))
            .bind(member.created_at),
        )?;
        Ok(())
    }

    fn challenge(&mut self, id: &ChallengeId) -> Result<Option<Challenge>, AsnetStoreError> {
        let q = sqlx::query(
            "SELECT mailbox, action, code_hash, expires_at, wrong_guesses, state FROM asnet_challenges WHERE id = ?",
        )
        .bind(id.0.to_vec());
        let Some(row) = self.one(q)? else { return Ok(None) };
        let bad = |_| AsnetStoreError::Corrupt("challenge");
        let mailbox: String = row.try_get(0).map_err(bad)?;
        let action: String = row.try_get(1).map_err(bad)?;
        let hash: Vec<u8> = row.try_get(2).map_err(bad)?;
        let wrong: i64 = row.try_get(4).map_err(bad)?;
        let state: String = row.try_get(5).map_err(bad)?;
        Ok(Some(Challenge {
            id: *id,
            mailbox: Mailbox::parse(&mailbox).map_err(|_| AsnetStoreError::Corrupt("challenge"))?,
            action: Action::from_stored(&action).ok_or(AsnetStoreError::Corrupt("challenge"))?,
            code_hash: hash.try_into().map_err(|_| AsnetStoreError::Corrupt("challenge"))?,
            expires_at: row.try_get(3).map_err(bad)?,
            wrong_guesses: u32::try_from(wrong).map_err(|_| AsnetStoreError::Corrupt("challenge"))?,
            state: ChallengeState::parse(&state).ok_or(AsnetStoreError::Corrupt("challenge"))?,
        }))
    }

    fn put_challenge(&mut self, c: &Challenge) -> Result<(), AsnetStoreError> {
        self.exec(
            sqlx::query(
                "INSERT INTO asnet_challenges (id, mailbox, action, code_hash, expires_at, wrong_guesses, state) \
                 VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET mailbox = excluded.mailbox, \
                 action = excluded.action, code_hash = excluded.code_hash, expires_at = excluded.expires_at, \
                 wrong_guesses = excluded.wrong_guesses, state = excluded.state",
            )
            .bind(c.id.0.to_vec())
            .bind(c.mailbox.as_str().to_owned())
            .bind(c.action.to_stored())
            .bind(c.code_hash.to_vec())
            .bind(c.expires_at)
            .bind(i64::from(c.wrong_guesses))
            .bind(c.state.as_str()),
        )?;
        Ok(())
    }

    fn offer(&mut self, id: &RequestId) -> Result<Option<Offer>, AsnetStoreError> {
        let q = sqlx::query("SELECT id, from_member, to_member, scopes, expires_at FROM asnet_offers WHERE id = ?")
            .bind(id.0.to_vec());
        self.one(q)?.as_ref().map(offer_from_row).transpose()
    }

    fn offers_between(&mut self, pair: &Pair) -> Result<Vec<Offer>, AsnetStoreError> {
        let q = sqlx::query(
            "SELECT id, from_member, to_member, scopes, expires_at FROM asnet_offers WHERE low = ? AND high = ? \
             ORDER BY id",
        )
        .bind(pair.low().0.to_vec())
        .bind(pair.high().0.to_vec());
        self.all(q)?.iter().map(offer_from_row).collect()
    }

    fn put_offer(&mut self, o: &Offer) -> Result<(), AsnetStoreError> {
        let pair = Pair::new(o.from, o.to).ok_or(AsnetStoreError::Corrupt("offer"))?;
        self.exec(
            sqlx::query(
                "INSERT INTO asnet_offers (id, from_member, to_member, low, high, scopes, expires_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(o.id.0.to_vec())
            .bind(o.from.0.to_vec())
            .bind(o.to.0.to_vec())
            .bind(pair.low().0.to_vec())
            .bind(pair.high().0.to_vec())
            .bind(o.scopes.to_csv())
            .bind(o.expires_at),
        )?;
        Ok(())
    }

    fn delete_offer(&mut self, id: &RequestId) -> Result<(), AsnetStoreError> {
        self.exec(sqlx::query("DELETE FROM asnet_offers WHERE id = ?").bind(id.0.to_vec()))?;
        Ok(())
    }

    fn edge(&mut self, pair: &Pair) -> Result<Option<Edge>, AsnetStoreError> {
        let q = sqlx::query("SELECT low, high, scopes, created_at FROM asnet_edges WHERE low = ? AND high = ?")
            .bind(pair.low().0.to_vec())
            .bind(pair.high().0.to_vec());
        self.one(q)?.as_ref().map(edge_from_row).transpose()
    }

    fn put_edge(&mut self, e: &Edge) -> Result<(), AsnetStoreError> {
        self.exec(
            sqlx::query(
                "INSERT INTO asnet_edges (low, high, scopes, created_at) VALUES (?, ?, ?, ?) \
                 ON CONFLICT (low, high) DO UPDATE SET scopes = excluded.scopes, created_at = excluded.created_at",
            )
            .bind(e.pair.low().0.to_vec())
            .bind(e.pair.high().0.to_vec())
            .bind(e.scopes.to_csv())
            .bind(e.created_at),
        )?;
        Ok(())
    }

    fn delete_edge(&mut self, pair: &Pair) -> Result<(), AsnetStoreError> {
        self.exec(
            sqlx::query("DELETE FROM asnet_edges WHERE low = ? AND high = ?")
                .bind(pair.low().0.to_vec())
                .bind(pair.high().0.to_vec()),
        )?;
        Ok(())
    }

    fn edges_of(&mut self, member: &MemberId) -> Result<Vec<Edge>, AsnetStoreError> {
        let q = sqlx::query("SELECT low, high, scopes, created_at FROM asnet_edges WHERE low = ?1 OR high = ?1")
            .bind(member.0.to_vec());
        let mut edges = self.all(q)?.iter().map(edge_from_row).collect::<Result<Vec<_>, _>>()?;
        edges.sort_by_key(|e| e.pair.other(member));
        Ok(edges)
    }

    fn sweep(&mut self, now: i64) -> Result<(), AsnetStoreError> {
        // The core's boundaries: a record exactly one horizon old is already gone.
        self.exec(
            sqlx::query("DELETE FROM asnet_deliveries WHERE at <= ?").bind(now.saturating_sub(DELIVERY_DEDUP_MS)),
        )?;
        self.exec(sqlx::query("DELETE FROM asnet_attempts WHERE at <= ?").bind(now.saturating_sub(BUDGET_WINDOW_MS)))?;
        self.exec(sqlx::query("DELETE FROM asnet_challenges WHERE expires_at <= ?").bind(now))?;
        self.exec(sqlx::query("DELETE FROM asnet_offers WHERE expires_at <= ?").bind(now))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use switchboard_core::protocol::asnet::store::conformance;

    use super::*;

    #[test]
    fn sqlite_store_passes_the_protocol_conformance_suite() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        // Pool connections go back to the pool on a spawned task: the runtime must be current.
        let _guard = rt.enter();
        let dir = tempfile::tempdir().unwrap();
        let mut n = 0;
        let mut dbs = Vec::new();
        conformance::run(|| {
            n += 1;
            let sub = dir.path().join(format!("db{n}"));
            std::fs::create_dir_all(&sub).unwrap();
            let db = rt.block_on(AsnetDb::open(&sub)).unwrap();
            let store = db.begin_blocking(rt.handle().clone()).unwrap();
            dbs.push(db);
            store
        });
    }

    #[test]
    fn a_store_dropped_without_commit_leaves_nothing() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        // Pool connections go back to the pool on a spawned task: the runtime must be current.
        let _guard = rt.enter();
        let dir = tempfile::tempdir().unwrap();
        let db = rt.block_on(AsnetDb::open(dir.path())).unwrap();
        let d = DeliveryId::parse("q-1").unwrap();
        let mut s = db.begin_blocking(rt.handle().clone()).unwrap();
        s.record_delivery(&d, 5).unwrap();
        drop(s);
        let mut s = db.begin_blocking(rt.handle().clone()).unwrap();
        assert!(!s.delivery_seen_since(&d, 0).unwrap());
        s.record_delivery(&d, 5).unwrap();
        s.commit().unwrap();
        let mut s = db.begin_blocking(rt.handle().clone()).unwrap();
        assert!(s.delivery_seen_since(&d, 0).unwrap());
    }
}
