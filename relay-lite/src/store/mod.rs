//! The relay's store: what the routes call ([`Store`]), per protocol family behind a trait
//! ([`LetagentsStore`], [`LetmeknowStore`], [`StringcupStore`], [`AgentMailStore`]), with two
//! backends serving every family.
//!
//! - SQLite (the embedded default; WAL, `synchronous=FULL`, numbered migrations in
//!   `migrations/`). One relay-lite owns the file.
//! - PostgreSQL ([`pg`]; migrations in `migrations-pg/`), for several relay-lite instances on
//!   one database.
//! - Every write goes through one writer task per instance (`writer`) fed by a bounded
//!   channel; it applies all queued writes in one transaction and answers each caller only after
//!   the commit (group commit), so a `202` always means "on disk" and throughput grows with
//!   concurrency instead of paying one fsync per envelope. The writer knows no protocol: each
//!   family's requests implement its `Request` trait per backend.
//! - Reads use a small pool of reader connections beside the writer.
//! - The SQL for each protocol lives in its own file ([`letagents`], [`stringcup`],
//!   [`letmeknow`], [`agent_mail`]; PostgreSQL's in [`pg`]).

pub mod agent_mail;
pub mod letagents;
pub mod letmeknow;
pub mod pg;
pub mod stringcup;
pub(crate) mod sync;
pub(crate) mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use futures_util::future::BoxFuture;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions as _, Connection as _};
use switchboard_core::protocol::letmeknow::header::ContentType;

use crate::hub::Hub;
pub use agent_mail::AgentMailStore;
pub use letagents::{DepositOutcome, LoginOutcome, SweepReport, Waiting};
use letmeknow::{InviteOutcome, InviteState, LmkSweepReport, PostOutcome};
pub use stringcup::StringcupStore;
use sync::WriterConn;
use writer::{Backend, Writer};

/// The database file inside the data directory.
pub const DB_FILE: &str = "relay-lite.sqlite3";

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
    /// The family is not served by this relay's backend (a bug: its routes are not mounted).
    #[error("{0} is not served by this relay's database backend")]
    NotServed(Family),
    /// Another process holds the SQLite database (a second relay-lite on the same `--data`).
    #[error(
        "another process is using the database {0} (a second relay-lite on the same data directory?); \
         stop it first"
    )]
    InUse(std::path::PathBuf),
}

/// A protocol family of relay APIs, as `--families` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// letagents v1 (`/v1/send|inbox|ack`).
    Letagents,
    /// letmeknow group logs and invites (`/g`, `/i`).
    Letmeknow,
    /// Stringcup v2 (`/api/v2`).
    Stringcup,
    /// Agent Mail 1.0 (`/v1/mailboxes`, discovery).
    AgentMail,
}

impl Family {
    /// Every family, in the order `--families` lists them.
    pub const ALL: [Family; 4] = [Family::Letagents, Family::Letmeknow, Family::Stringcup, Family::AgentMail];
    /// The families the PostgreSQL backend serves (every one).
    pub const ON_POSTGRES: [Family; 4] = Self::ALL;

    /// The name `--families` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Letagents => "letagents",
            Self::Letmeknow => "letmeknow",
            Self::Stringcup => "stringcup",
            Self::AgentMail => "agent-mail",
        }
    }

    /// The family named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// SQLite's primary result codes for a full disk and for an I/O error (the low byte of an
/// extended code such as `SQLITE_IOERR_FSYNC`).
const SQLITE_FULL: i64 = 13;
const SQLITE_IOERR: i64 = 10;

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let Some(code) = e.as_database_error().and_then(|d| d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>())
        {
            // PostgreSQL's SQLSTATE: 53100 disk_full, class 58 system (I/O) errors.
            return match code.code() {
                "53100" => Self::DiskFull(Arc::new(e)),
                c if c.starts_with("58") => Self::Io(Arc::new(e)),
                _ => Self::Database(Arc::new(e)),
            };
        }
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

/// letagents v1 storage: mailboxes, their drop hashes and waiting envelopes.
#[async_trait]
pub trait LetagentsStore: Send + Sync {
    /// Stores `body` in `mailbox` if `drop_hash` matches and fewer than `capacity` envelopes
    /// wait; returns after the commit.
    async fn deposit(
        &self,
        mailbox: &str,
        drop_hash: &str,
        body: Bytes,
        capacity: usize,
        now: i64,
    ) -> Result<DepositOutcome, StoreError>;

    /// Records an authenticated login: creates the mailbox or updates its drop hash, unless
    /// `ts` is not newer than the last accepted login.
    async fn login(&self, mailbox: &str, drop_hash: &str, ts: i64, now: i64) -> Result<LoginOutcome, StoreError>;

    /// Deletes the listed envelopes; returns the seqs that existed.
    async fn ack(&self, mailbox: &str, seqs: Vec<i64>, now: i64) -> Result<Vec<i64>, StoreError>;

    /// Deletes envelopes received before `expire_before` and erases mailboxes last active
    /// before `idle_before` that hold nothing and that no websocket (of this instance) watches.
    async fn sweep(&self, now: i64, expire_before: i64, idle_before: i64) -> Result<SweepReport, StoreError>;

    /// The stored drop hash of `mailbox`, if it exists.
    async fn drop_hash(&self, mailbox: &str) -> Result<Option<String>, StoreError>;

    /// Up to `limit` waiting envelopes of `mailbox` with seq above `after`, oldest first.
    async fn waiting(&self, mailbox: &str, after: i64, limit: usize) -> Result<Vec<Waiting>, StoreError>;

    /// Number of envelopes waiting in `mailbox`.
    async fn waiting_count(&self, mailbox: &str) -> Result<i64, StoreError>;
}

/// letmeknow storage: group epochs and logs, invites.
#[async_trait]
pub trait LetmeknowStore: Send + Sync {
    /// Appends a group message if its epoch is current (a commit advances the epoch).
    async fn post(
        &self,
        gid: &str,
        epoch: u64,
        content: ContentType,
        data: Bytes,
        now: i64,
    ) -> Result<PostOutcome, StoreError>;

    /// Up to `limit` log entries of `gid` with seq above `after`, ascending.
    async fn messages(&self, gid: &str, after: i64, limit: usize) -> Result<Vec<(i64, Vec<u8>)>, StoreError>;

    /// The group's current epoch (0 for a group never written).
    async fn epoch(&self, gid: &str) -> Result<i64, StoreError>;

    /// Creates an invite (`Conflict` if a live one has this id).
    async fn create_invite(
        &self,
        id: &str,
        owner: &str,
        expires_at: i64,
        now: i64,
    ) -> Result<InviteOutcome, StoreError>;

    /// Stores the join data (`owner` `None`) or, for the owner, the welcome data.
    async fn put_blob(
        &self,
        id: &str,
        owner: Option<&str>,
        data: Vec<u8>,
        now: i64,
    ) -> Result<InviteOutcome, StoreError>;

    /// A live invite, or `None` if unknown or expired at `now`.
    async fn invite(&self, id: &str, now: i64) -> Result<Option<InviteState>, StoreError>;

    /// Deletes messages received before `messages_before` (group epochs stay) and invites that
    /// expired by `now`.
    async fn sweep(&self, messages_before: i64, now: i64) -> Result<LmkSweepReport, StoreError>;
}

/// The SQLite backend: one file, one writer connection, a pool of readers.
pub struct SqliteStore {
    writer: Writer<WriterConn>,
    pub(crate) read: SqlitePool,
    /// The writer's hub, for the caches its writes keep exact.
    pub(crate) hub: Arc<Hub>,
    /// This process's claim on the database ([`claim`]), released on close.
    claim: std::sync::Mutex<Option<std::fs::File>>,
}

/// How long [`claim`] waits for a lock held elsewhere before refusing.
const CLAIM_GRACE: Duration = Duration::from_secs(1);

/// Claims the database at `path` for this process: an exclusive lock on `path` + `.lock`, held
/// until the store closes (or the process ends). One process writes the file, so what its
/// writer commits is everything that changes (the hub's wake-ups and the token cache rely on
/// that); a second relay-lite on the same data directory is refused at start.
///
/// A lock still held is retried for [`CLAIM_GRACE`] first: the lock belongs to the open file,
/// so a child process forked (by any thread of this process, for any command) while the
/// previous store held it shares it until the child's `exec` closes its copy, and a store
/// reopened at once can meet that copy (the likely cause of a CI failure: a relay restarted in
/// process was refused while the test binary's other test was spawning `mount`, `chown` and
/// `umount`). A second relay-lite holds it for good and is refused after the grace.
async fn claim(path: &Path) -> Result<std::fs::File, StoreError> {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let io = |e: std::io::Error| StoreError::Io(Arc::new(sqlx::Error::Io(e)));
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(io)?;
    let deadline = tokio::time::Instant::now() + CLAIM_GRACE;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(std::fs::TryLockError::WouldBlock) => return Err(StoreError::InUse(path.to_owned())),
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
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

/// The writer's transactions on SQLite.
///
/// The transaction is a plain `BEGIN IMMEDIATE` … `COMMIT`, not sqlx's `Connection::begin`:
/// sqlx counts transaction depth itself and only decrements the count when `COMMIT` or
/// `ROLLBACK` succeeds. On `SQLITE_FULL` SQLite rolls a failed `COMMIT` back by itself, so the
/// `ROLLBACK` sqlx then sends fails ("no transaction is active") and sqlx keeps believing a
/// transaction is open; its next `begin()` issues `SAVEPOINT` and its `commit()` `RELEASE`. When
/// such a `RELEASE` (which commits, being outermost) fails too, SQLite leaves the connection with
/// autocommit off (`OP_Savepoint` sets `db->autoCommit = 0` after a failed commit), and every
/// later batch only released a nested savepoint: answered `2xx`, never committed, no fsync.
/// A plain `BEGIN` fails inside a transaction, so here every batch first proves the connection
/// is in autocommit mode, and its `COMMIT` ends the outermost transaction. (The writer's
/// connection is rusqlite's now, which keeps no such count; the rule stays.)
struct SqliteBackend {
    path: PathBuf,
}

impl Backend for SqliteBackend {
    type Conn = WriterConn;

    fn connect(&self) -> BoxFuture<'_, Result<WriterConn, sqlx::Error>> {
        Box::pin(std::future::ready(WriterConn::open(&self.path)))
    }

    fn begin<'a>(&'a self, conn: &'a mut WriterConn) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(std::future::ready(conn.execute("BEGIN IMMEDIATE")))
    }

    /// Every write synchronously, in order, then the commit: the batch never leaves the
    /// writer's thread ([`sync`]).
    fn apply_and_commit<'a>(
        &'a self,
        conn: &'a mut WriterConn,
        batch: &'a mut [writer::BoxOp<WriterConn>],
        cx: &'a mut writer::BatchCx<'_>,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        let applied = batch.iter_mut().try_for_each(|op| op.apply_sync(conn.db(), cx));
        // SQLite's commit announces nothing (wake-ups are local, published after it).
        Box::pin(std::future::ready(applied.and_then(|()| conn.execute("COMMIT"))))
    }

    fn commit<'a>(
        &'a self,
        conn: &'a mut WriterConn,
        _wakeups: &'a [(String, i64)],
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(std::future::ready(conn.execute("COMMIT")))
    }

    fn discard(&self, conn: WriterConn) -> BoxFuture<'_, ()> {
        // SQLite may already have rolled back by itself; then this ROLLBACK fails, harmlessly.
        // Closing the connection ends whatever transaction SQLite may still hold.
        let _ = conn.execute("ROLLBACK");
        conn.close();
        Box::pin(std::future::ready(()))
    }

    fn close(&self, conn: WriterConn) -> BoxFuture<'_, ()> {
        conn.close();
        Box::pin(std::future::ready(()))
    }
}

impl SqliteStore {
    /// Opens (or creates) the database in `data_dir`, runs migrations and starts the writer;
    /// `hub` hears about every committed envelope.
    pub async fn open(data_dir: &Path, hub: Arc<Hub>) -> Result<Self, StoreError> {
        let path = data_dir.join(DB_FILE);
        let claim = claim(&path).await?;
        let options = connect_options(&path);
        let mut conn = options.connect().await?;
        sqlx::migrate!("./migrations").run(&mut conn).await.map_err(|e| StoreError::Migrate(Arc::new(e)))?;
        conn.close().await?;
        let read = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(1)
            // sqlx pings an idle connection before handing it out, by default: for SQLite a
            // round trip to the connection's worker thread on every read, to check a file that
            // cannot hang up (BENCHMARKS.md, "Stringcup long-poll").
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await?;
        let writer =
            Writer::start_on_thread(SqliteBackend { path: path.clone() }, WriterConn::open(&path)?, hub.clone())
                .map_err(|e| StoreError::Io(Arc::new(sqlx::Error::Io(e))))?;
        Ok(Self { writer, read, hub, claim: std::sync::Mutex::new(Some(claim)) })
    }

    /// Queues `req`; returns its outcome after the commit.
    pub(crate) async fn submit<R: writer::Request<WriterConn>>(&self, req: R) -> Result<R::Out, StoreError> {
        self.writer.submit(req).await
    }

    async fn close(&self) {
        self.writer.close().await;
        self.read.close().await;
        drop(self.claim.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
    }
}

/// Handle to the store: each family's calls go to the backend that serves it.
pub struct Store {
    letagents: Arc<dyn LetagentsStore>,
    letmeknow: Arc<dyn LetmeknowStore>,
    stringcup: Arc<dyn StringcupStore>,
    agent_mail: Arc<dyn AgentMailStore>,
    sqlite: Option<Arc<SqliteStore>>,
    pg: Option<Arc<pg::PgStore>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("postgres", &self.pg.is_some()).finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) the SQLite database in `data_dir`, runs migrations and starts the
    /// writer; `hub` hears about every committed write. Serves every family.
    pub async fn open(data_dir: &Path, hub: Arc<Hub>) -> Result<Self, StoreError> {
        let sqlite = Arc::new(SqliteStore::open(data_dir, hub).await?);
        Ok(Self {
            letagents: sqlite.clone(),
            letmeknow: sqlite.clone(),
            stringcup: sqlite.clone(),
            agent_mail: sqlite.clone(),
            sqlite: Some(sqlite),
            pg: None,
        })
    }

    /// Connects to the PostgreSQL database at `url`, runs its migrations, starts the writer and
    /// the listener that hears other instances' commits; `hub` hears about every committed
    /// write, this instance's and the others'. Serves [`Family::ON_POSTGRES`].
    pub async fn open_postgres(url: &str, hub: Arc<Hub>) -> Result<Self, StoreError> {
        let pg = Arc::new(pg::PgStore::open(url, hub).await?);
        Ok(Self {
            letagents: pg.clone(),
            letmeknow: pg.clone(),
            stringcup: pg.clone(),
            agent_mail: pg.clone(),
            sqlite: None,
            pg: Some(pg),
        })
    }

    /// Whether this store runs on PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        self.pg.is_some()
    }

    /// The letagents family's storage.
    pub fn letagents(&self) -> &dyn LetagentsStore {
        &*self.letagents
    }

    /// The letmeknow family's storage.
    pub fn letmeknow(&self) -> &dyn LetmeknowStore {
        &*self.letmeknow
    }

    /// The SQLite backend, if this store runs on it (`family` names the one asking).
    #[cfg(test)]
    pub(crate) fn sqlite(&self, family: Family) -> Result<&SqliteStore, StoreError> {
        self.sqlite.as_deref().ok_or(StoreError::NotServed(family))
    }

    /// Stores `body` in `mailbox` (see [`LetagentsStore::deposit`]).
    pub async fn deposit(
        &self,
        mailbox: &str,
        drop_hash: &str,
        body: Bytes,
        capacity: usize,
        now: i64,
    ) -> Result<DepositOutcome, StoreError> {
        self.letagents.deposit(mailbox, drop_hash, body, capacity, now).await
    }

    /// Records a login (see [`LetagentsStore::login`]).
    pub async fn login(&self, mailbox: &str, drop_hash: &str, ts: i64, now: i64) -> Result<LoginOutcome, StoreError> {
        self.letagents.login(mailbox, drop_hash, ts, now).await
    }

    /// Deletes the listed envelopes (see [`LetagentsStore::ack`]).
    pub async fn ack(&self, mailbox: &str, seqs: Vec<i64>, now: i64) -> Result<Vec<i64>, StoreError> {
        self.letagents.ack(mailbox, seqs, now).await
    }

    /// The letagents sweep (see [`LetagentsStore::sweep`]).
    pub async fn sweep(&self, now: i64, expire_before: i64, idle_before: i64) -> Result<SweepReport, StoreError> {
        self.letagents.sweep(now, expire_before, idle_before).await
    }

    /// The stored drop hash of `mailbox`, if it exists.
    pub async fn drop_hash(&self, mailbox: &str) -> Result<Option<String>, StoreError> {
        self.letagents.drop_hash(mailbox).await
    }

    /// Up to `limit` waiting envelopes of `mailbox` with seq above `after`, oldest first.
    pub async fn waiting(&self, mailbox: &str, after: i64, limit: usize) -> Result<Vec<Waiting>, StoreError> {
        self.letagents.waiting(mailbox, after, limit).await
    }

    /// Number of envelopes waiting in `mailbox`.
    pub async fn waiting_count(&self, mailbox: &str) -> Result<i64, StoreError> {
        self.letagents.waiting_count(mailbox).await
    }

    /// Commits what is queued, stops the writer and closes every connection. Later calls fail
    /// with [`StoreError::Closed`].
    pub async fn close(&self) {
        if let Some(sqlite) = &self.sqlite {
            sqlite.close().await;
        }
        if let Some(pg) = &self.pg {
            pg.close().await;
        }
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
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&store.sqlite(Family::Stringcup).unwrap().read)
            .await
            .unwrap();
        let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&store.sqlite(Family::Stringcup).unwrap().read)
            .await
            .unwrap();
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

    /// A write that fails when applied, rolling its batch back.
    struct Fails;

    impl writer::WriteOp<WriterConn> for Fails {
        fn apply<'a>(
            &'a mut self,
            _: &'a mut WriterConn,
            _: &'a mut writer::BatchCx<'_>,
        ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
            Box::pin(async { Err(sqlx::Error::Protocol("refused on purpose".into())) })
        }

        fn apply_sync(&mut self, _: &sync::SyncDb, _: &mut writer::BatchCx<'_>) -> Result<(), sqlx::Error> {
            Err(sqlx::Error::Protocol("refused on purpose".into()))
        }

        fn finish(self: Box<Self>, _: &Result<(), StoreError>, _: &Hub) {}
    }

    /// A queued write whose answer comes on the returned receiver.
    fn queued<R: writer::Request<WriterConn>>(
        req: R,
    ) -> (writer::BoxOp<WriterConn>, tokio::sync::oneshot::Receiver<Result<R::Out, StoreError>>) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        (Box::new(writer::Pending::new(req, reply)), answer)
    }

    /// Runs `ops` as one batch (all queued before the writer starts, then a close) on the
    /// database in `dir`.
    async fn one_batch(dir: &Path, ops: Vec<writer::BoxOp<WriterConn>>) {
        let path = dir.join(DB_FILE);
        let conn = WriterConn::open(&path).unwrap();
        let (queue, writes) = tokio::sync::mpsc::channel(ops.len() + 1);
        for op in ops {
            queue.try_send(writer::Msg::Op(op)).unwrap();
        }
        let (done, closed) = tokio::sync::oneshot::channel();
        queue.try_send(writer::Msg::Close(done)).unwrap();
        writer::run(SqliteBackend { path }, conn, writes, Arc::new(Hub::default())).await;
        closed.await.unwrap();
    }

    fn deposit(mailbox: &str) -> letagents::Deposit {
        letagents::Deposit::new(mailbox, "h", Bytes::from_static(b"LA1"), 10, 2)
    }

    fn login(mailbox: &str) -> letagents::Login {
        letagents::Login { mailbox: mailbox.into(), drop_hash: "h".into(), ts: 1, now: 1 }
    }

    #[tokio::test]
    async fn a_second_store_on_the_same_database_is_refused_until_the_first_closes() {
        let dir = tempfile::tempdir().unwrap();
        let first = Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap();
        let second = Store::open(dir.path(), Arc::new(Hub::default())).await;
        assert!(matches!(second, Err(StoreError::InUse(_))), "{second:?}");
        first.close().await;
        let again = Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap();
        again.close().await;
    }

    #[tokio::test]
    async fn a_claim_held_for_a_moment_elsewhere_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        // Another open file holding the lock briefly (as a forked child's copy does until its
        // `exec`), released well inside the grace.
        let other = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.path().join(format!("{DB_FILE}.lock")))
            .unwrap();
        other.try_lock().unwrap();
        let release = tokio::spawn(async move {
            tokio::time::sleep(CLAIM_GRACE / 5).await;
            drop(other);
        });
        let store = Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap();
        release.await.unwrap();
        store.close().await;
    }

    #[tokio::test]
    async fn a_batch_runs_its_writes_in_queue_order_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        SqliteStore::open(dir.path(), Arc::new(Hub::default())).await.unwrap().close().await;
        // A deposit before the login that creates its mailbox, then two after it: each sees
        // exactly the writes queued before it.
        let (early, early_out) = queued(deposit("m"));
        let (created, created_out) = queued(login("m"));
        let (first, first_out) = queued(deposit("m"));
        let (second, second_out) = queued(deposit("m"));
        one_batch(dir.path(), vec![early, created, first, second]).await;
        assert_eq!(early_out.await.unwrap().unwrap(), DepositOutcome::NoMailbox);
        assert_eq!(created_out.await.unwrap().unwrap(), LoginOutcome::Created);
        assert_eq!(first_out.await.unwrap().unwrap(), DepositOutcome::Stored { seq: 1 });
        assert_eq!(second_out.await.unwrap().unwrap(), DepositOutcome::Stored { seq: 2 });

        // A batch that fails after some writes: all of it rolls back, every caller hears.
        let (created, created_out) = queued(login("n"));
        let (stored, stored_out) = queued(deposit("n"));
        let (more, more_out) = queued(deposit("m"));
        one_batch(dir.path(), vec![created, stored, Box::new(Fails), more]).await;
        assert!(created_out.await.unwrap().is_err());
        assert!(stored_out.await.unwrap().is_err());
        assert!(more_out.await.unwrap().is_err());

        let store = Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap();
        assert_eq!(store.waiting_count("m").await.unwrap(), 2);
        assert_eq!(store.letagents().drop_hash("n").await.unwrap(), None);
        // The writer that discarded its connection left the database usable.
        assert_eq!(
            store.deposit("m", "h", Bytes::from_static(b"LA1"), 10, 3).await.unwrap(),
            DepositOutcome::Stored { seq: 3 }
        );
        store.close().await;
    }
}
