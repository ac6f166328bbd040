//! The relay's SQLite store (WAL, `synchronous=FULL`, numbered migrations in `migrations/`).
//!
//! - Every write goes through one writer task ([`writer`]) fed by a bounded channel; it applies
//!   all queued writes in one transaction and answers each caller only after the commit (group
//!   commit), so a `202` always means "on disk" and throughput grows with concurrency instead of
//!   paying one fsync per envelope.
//! - Reads use a small pool of reader connections; WAL lets them run beside the writer.
//! - The SQL for each protocol lives in its own file ([`letagents`], [`stringcup`], [`letmeknow`]).

pub mod agent_mail;
pub mod letagents;
pub mod letmeknow;
pub mod stringcup;
mod writer;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use sqlx::ConnectOptions as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::hub::Hub;
pub use letagents::{DepositOutcome, LoginOutcome, SweepReport, Waiting};
use writer::Op;

/// The database file inside the data directory.
pub const DB_FILE: &str = "relay-lite.sqlite3";

/// Writes that may queue for the writer before callers wait (backpressure).
const QUEUE: usize = 4096;

/// Why a store operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The disk holding the database is full (`SQLITE_FULL`): the relay's condition, not the
    /// client's. The whole batch that contained the write was rolled back; the same write succeeds
    /// once space returns.
    #[error("the relay's disk is full: {0}")]
    DiskFull(Arc<sqlx::Error>),
    /// Reading or writing the database file failed (`SQLITE_IOERR`, e.g. a failed fsync): the
    /// relay's fault. The whole batch that contained the write was rolled back.
    #[error("the relay's disk failed: {0}")]
    Io(Arc<sqlx::Error>),
    /// SQLite failed otherwise (relay's fault: corruption, a bug in a query). The whole batch that
    /// contained the write was rolled back.
    #[error("database: {0}")]
    Database(Arc<sqlx::Error>),
    /// A migration failed while opening (relay's fault).
    #[error("migration: {0}")]
    Migrate(Arc<sqlx::migrate::MigrateError>),
    /// The store is closed or closing (the relay is shutting down).
    #[error("store closed")]
    Closed,
}

/// SQLite's primary result codes for a full disk and for an I/O error (the low byte of an
/// extended code such as `SQLITE_IOERR_FSYNC`).
const SQLITE_FULL: i64 = 13;
const SQLITE_IOERR: i64 = 10;

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        let primary = e
            .as_database_error()
            .and_then(|d| d.code())
            .and_then(|code| code.parse::<i64>().ok())
            .map(|extended| extended & 0xff);
        match primary {
            Some(SQLITE_FULL) => Self::DiskFull(Arc::new(e)),
            Some(SQLITE_IOERR) => Self::Io(Arc::new(e)),
            _ => Self::Database(Arc::new(e)),
        }
    }
}

/// Handle to the store: cheap calls that queue writes for the writer or read from the pool.
pub struct Store {
    writes: mpsc::Sender<Op>,
    read: SqlitePool,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

fn connect_options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(10))
}

impl Store {
    /// Opens (or creates) the database in `data_dir`, runs migrations and starts the writer;
    /// `hub` hears about every committed envelope.
    pub async fn open(data_dir: &Path, hub: Arc<Hub>) -> Result<Self, StoreError> {
        let path = data_dir.join(DB_FILE);
        let options = connect_options(&path);
        let mut conn = options.connect().await?;
        sqlx::migrate!("./migrations").run(&mut conn).await.map_err(|e| StoreError::Migrate(Arc::new(e)))?;
        let read = SqlitePoolOptions::new().max_connections(4).min_connections(1).connect_with(options.clone()).await?;
        let (writes, queue) = mpsc::channel(QUEUE);
        let writer = tokio::spawn(writer::run(conn, options, queue, hub));
        Ok(Self { writes, read, writer: Mutex::new(Some(writer)) })
    }

    async fn write<T>(&self, make: impl FnOnce(writer::Reply<T>) -> Op) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.writes.send(make(reply)).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Stores `body` in `mailbox` if `drop_hash` matches and fewer than `capacity` envelopes
    /// wait; returns after the commit.
    pub async fn deposit(
        &self,
        mailbox: &str,
        drop_hash: &str,
        body: Bytes,
        capacity: usize,
        now: i64,
    ) -> Result<DepositOutcome, StoreError> {
        let req = letagents::Deposit {
            mailbox: mailbox.to_owned(),
            drop_hash: drop_hash.to_owned(),
            body,
            capacity: i64::try_from(capacity).unwrap_or(i64::MAX),
            now,
        };
        self.write(|reply| Op::Deposit { req, out: None, reply }).await
    }

    /// Records an authenticated login: creates the mailbox or updates its drop hash, unless
    /// `ts` is not newer than the last accepted login.
    pub async fn login(&self, mailbox: &str, drop_hash: &str, ts: i64, now: i64) -> Result<LoginOutcome, StoreError> {
        let req = letagents::Login { mailbox: mailbox.to_owned(), drop_hash: drop_hash.to_owned(), ts, now };
        self.write(|reply| Op::Login { req, out: None, reply }).await
    }

    /// Deletes the listed envelopes; returns the seqs that existed.
    pub async fn ack(&self, mailbox: &str, seqs: Vec<i64>, now: i64) -> Result<Vec<i64>, StoreError> {
        let req = letagents::Ack { mailbox: mailbox.to_owned(), seqs, now };
        self.write(|reply| Op::Ack { req, out: None, reply }).await
    }

    /// Deletes envelopes received before `expire_before` and erases mailboxes last active
    /// before `idle_before` that hold nothing and that no websocket watches.
    pub async fn sweep(&self, now: i64, expire_before: i64, idle_before: i64) -> Result<SweepReport, StoreError> {
        let req = letagents::Sweep { now, expire_before, idle_before };
        self.write(|reply| Op::Sweep { req, out: None, reply }).await
    }

    /// The stored drop hash of `mailbox`, if it exists.
    pub async fn drop_hash(&self, mailbox: &str) -> Result<Option<String>, StoreError> {
        Ok(letagents::drop_hash(&self.read, mailbox).await?)
    }

    /// Up to `limit` waiting envelopes of `mailbox` with seq above `after`, oldest first.
    pub async fn waiting(&self, mailbox: &str, after: i64, limit: usize) -> Result<Vec<Waiting>, StoreError> {
        Ok(letagents::waiting(&self.read, mailbox, after, limit).await?)
    }

    /// Number of envelopes waiting in `mailbox`.
    pub async fn waiting_count(&self, mailbox: &str) -> Result<i64, StoreError> {
        Ok(letagents::waiting_count(&self.read, mailbox).await?)
    }

    /// Commits what is queued, stops the writer and closes every connection. Later calls fail
    /// with [`StoreError::Closed`].
    pub async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.writes.send(Op::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
        let writer = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(writer) = writer {
            let _ = writer.await;
        }
        self.read.close().await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn database_is_in_wal_mode_with_synchronous_full() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap();
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&store.read).await.unwrap();
        let sync: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(&store.read).await.unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(sync, 2, "FULL");
        store.close().await;
    }

    #[tokio::test]
    async fn one_batch_assigns_consecutive_seqs_and_refuses_past_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap());
        assert_eq!(store.login("m", "h", 1, 1).await.unwrap(), LoginOutcome::Created);
        let sends = (0..20).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.deposit("m", "h", Bytes::from_static(b"LA1"), 15, 2).await.unwrap() })
        });
        let mut seqs = Vec::new();
        let mut full = 0;
        for send in sends.collect::<Vec<_>>() {
            match send.await.unwrap() {
                DepositOutcome::Stored { seq } => seqs.push(seq),
                DepositOutcome::Full => full += 1,
                DepositOutcome::NoMailbox => panic!("mailbox vanished"),
            }
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=15).collect::<Vec<_>>());
        assert_eq!(full, 5);
        assert_eq!(store.deposit("m", "wrong", Bytes::new(), 99, 3).await.unwrap(), DepositOutcome::NoMailbox);
        store.close().await;
        assert!(matches!(store.waiting_count("m").await, Err(StoreError::Database(_)) | Err(StoreError::Closed)));
    }
}
