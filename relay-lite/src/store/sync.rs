//! The SQLite writer's connection, and the synchronous path of its hottest writes.
//!
//! sqlx runs every SQLite statement on the connection's own worker thread: each statement is a
//! round trip between that thread and the writer (a channel send, a wake-up, a reply, another
//! wake-up). A batch of 30 letagents deposits was 32 such trips (`BEGIN`, 30 inserts,
//! `COMMIT`), and each trip could wait for a core behind the request tasks (BENCHMARKS.md, "the
//! writer on its own thread"). Writes that declare a synchronous path ([`Request::sync`]) run
//! instead under one lock of sqlx's own database handle ([`SqliteConnection::lock_handle`]), on
//! the writer's thread, through [`rusqlite`] on that same handle with its cached statements: a
//! run of them in a batch costs one trip, however many statements it holds. They run inside the
//! batch's transaction like every other write; a batch that starts with such a run begins its
//! transaction under that run's lock, and one that ends with one commits under it. A batch of
//! only synchronous writes (the common case under load) does not touch sqlx at all: it runs on
//! a connection of the writer's own to the same file ([`WriterConn::run_own`]), so it never
//! leaves the writer's thread; where it was one trip per statement plus two.
//!
//! [`Request::sync`]: super::writer::Request::sync

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use sqlx::SqliteConnection;
use sqlx::error::{DatabaseError, ErrorKind};

/// The handle a synchronous write runs on.
pub(crate) type SyncDb = rusqlite::Connection;

/// The SQLite writer's connection: sqlx's, and the prepared statements of the synchronous
/// writes on its handle.
pub(crate) struct WriterConn {
    /// A connection of the writer's own to the same file, for batches of synchronous writes
    /// only ([`WriterConn::run_own`]); opened on first use.
    own: Option<SyncDb>,
    /// The database file, for `own`.
    path: PathBuf,
    /// The statements, on `conn`'s handle; made on first use, and always dropped (their
    /// statements finalized) before `conn` closes: field order, and [`WriterConn::into_inner`].
    sync: Option<SyncDb>,
    /// The batch's `BEGIN IMMEDIATE` is still to run, before its first statement.
    begin_due: bool,
    conn: SqliteConnection,
}

impl WriterConn {
    /// Wraps sqlx's connection to the database at `path`.
    pub(crate) fn new(conn: SqliteConnection, path: &Path) -> Self {
        Self { own: None, path: path.to_owned(), sync: None, begin_due: false, conn }
    }

    /// Runs a batch whose every write is synchronous on the writer's own connection, in a
    /// transaction of its own (`BEGIN IMMEDIATE`, `f`, `COMMIT`): the batch never leaves the
    /// writer's thread, where through sqlx's connection it would wait for the handle's lock
    /// (a round trip to sqlx's worker thread, which then waits to take the lock back). Both
    /// connections only ever write from this thread, one transaction at a time, and each
    /// `BEGIN IMMEDIATE` starts from everything committed before it, on either.
    pub(crate) fn run_own<T>(&mut self, f: impl FnOnce(&SyncDb) -> Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        let db = match &self.own {
            Some(db) => db,
            None => self.own.insert(open_own(&self.path).map_err(raw_error)?),
        };
        // This batch's deferred begin is this transaction's.
        self.begin_due = false;
        db.prepare_cached("BEGIN IMMEDIATE").and_then(|mut s| s.execute([])).map_err(raw_error)?;
        let out = f(db)?;
        db.prepare_cached("COMMIT").and_then(|mut s| s.execute([])).map_err(raw_error)?;
        Ok(out)
    }

    /// Starts a batch: its `BEGIN IMMEDIATE` runs before its first statement, under the lock of
    /// the first synchronous run if that comes first. A plain `BEGIN` fails inside a
    /// transaction, so every batch still proves the connection was in autocommit mode before it
    /// writes anything (see `SqliteBackend`).
    pub(crate) fn begin(&mut self) {
        self.begin_due = true;
    }

    /// Runs the batch's `BEGIN IMMEDIATE` through sqlx if it has not run yet: before a write
    /// that goes through sqlx.
    pub(crate) async fn begin_now(&mut self) -> Result<(), sqlx::Error> {
        if self.begin_due {
            sqlx::query("BEGIN IMMEDIATE").execute(&mut self.conn).await?;
            self.begin_due = false;
        }
        Ok(())
    }

    /// Commits the batch through sqlx.
    pub(crate) async fn commit(&mut self) -> Result<(), sqlx::Error> {
        self.begin_now().await?;
        sqlx::query("COMMIT").execute(&mut self.conn).await.map(drop)
    }

    /// Runs `f` on the connection's handle, holding sqlx's lock on it: no other statement runs
    /// on it meanwhile, and sqlx's worker thread waits until `f` returns. The batch's `BEGIN`
    /// runs first if it is still due, and with `commit` its `COMMIT` after `f` succeeds: a run of
    /// synchronous writes in a batch that also holds others costs one trip to sqlx's worker
    /// thread.
    pub(crate) async fn with_sync<T>(
        &mut self,
        commit: bool,
        f: impl FnOnce(&SyncDb) -> Result<T, sqlx::Error>,
    ) -> Result<T, sqlx::Error> {
        let mut locked = self.conn.lock_handle().await?;
        let db = match &self.sync {
            Some(db) => db,
            None => {
                // The crate's one `unsafe` (its lints deny it everywhere else).
                // SAFETY: the handle is sqlx's open connection, which outlives `self.sync` (it is
                // dropped first, see the field); rusqlite does not close a handle it did not open
                // (`from_handle`), and it is only used while sqlx's lock on the handle is held.
                #[allow(unsafe_code)]
                let db = unsafe { rusqlite::Connection::from_handle(locked.as_raw_handle().as_ptr()) };
                self.sync.insert(db.map_err(raw_error)?)
            }
        };
        if self.begin_due {
            db.prepare_cached("BEGIN IMMEDIATE").and_then(|mut s| s.execute([])).map_err(raw_error)?;
            self.begin_due = false;
        }
        let out = f(db)?;
        if commit {
            db.prepare_cached("COMMIT").and_then(|mut s| s.execute([])).map_err(raw_error)?;
        }
        drop(locked);
        Ok(out)
    }

    /// sqlx's connection, the synchronous statements finalized (under the handle's lock).
    pub(crate) async fn into_inner(mut self) -> SqliteConnection {
        if let Some(db) = self.sync.take() {
            match self.conn.lock_handle().await {
                Ok(locked) => {
                    drop(db);
                    drop(locked);
                }
                // The worker is gone: nothing else can run on the handle.
                Err(_) => drop(db),
            }
        }
        self.conn
    }
}

/// The writer's own connection to the database at `path`, configured as sqlx's writer connection
/// is (`super::connect_options`): WAL (the file's, already set), `synchronous=FULL`, foreign keys
/// on, a 10 s busy timeout. The durability settings are read back, not assumed.
fn open_own(path: &Path) -> rusqlite::Result<SyncDb> {
    use rusqlite::OpenFlags;
    let db = SyncDb::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    db.busy_timeout(std::time::Duration::from_secs(10))?;
    db.pragma_update(None, "synchronous", "FULL")?;
    db.pragma_update(None, "foreign_keys", true)?;
    let journal: String = db.pragma_query_value(None, "journal_mode", |r| r.get(0))?;
    let synchronous: i64 = db.pragma_query_value(None, "synchronous", |r| r.get(0))?;
    let foreign_keys: bool = db.pragma_query_value(None, "foreign_keys", |r| r.get(0))?;
    if !journal.eq_ignore_ascii_case("wal") || synchronous != 2 || !foreign_keys {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISUSE),
            Some(format!(
                "the writer's own connection is not durable as configured: journal_mode={journal}, \
                 synchronous={synchronous}, foreign_keys={foreign_keys}"
            )),
        ));
    }
    Ok(db)
}

impl std::ops::Deref for WriterConn {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for WriterConn {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }
}

/// An error of a synchronous statement, as the sqlx error the rest of the store handles: SQLite's
/// extended result code stays the error's code, so a full disk is still told from an I/O error
/// and from a bug ([`super::StoreError`]).
pub(crate) fn raw_error(e: rusqlite::Error) -> sqlx::Error {
    match e.sqlite_error() {
        Some(code) => {
            let message = match &e {
                rusqlite::Error::SqliteFailure(_, Some(message)) => message.clone(),
                _ => code.to_string(),
            };
            sqlx::Error::Database(Box::new(RawError { extended: code.extended_code, message }))
        }
        None => sqlx::Error::Protocol(format!("synchronous write: {e}")),
    }
}

/// The result of a synchronous write, as the sqlx result the writer handles: a rusqlite error
/// goes through [`raw_error`]; an sqlx error (a stored value that does not decode) stays as is.
pub(crate) trait SyncResult<T> {
    fn into_sqlx(self) -> Result<T, sqlx::Error>;
}

impl<T> SyncResult<T> for rusqlite::Result<T> {
    fn into_sqlx(self) -> Result<T, sqlx::Error> {
        self.map_err(raw_error)
    }
}

impl<T> SyncResult<T> for Result<T, sqlx::Error> {
    fn into_sqlx(self) -> Result<T, sqlx::Error> {
        self
    }
}

/// A failed SQLite call made through [`rusqlite`].
#[derive(Debug, thiserror::Error)]
#[error("{message} (SQLite code {extended})")]
pub(crate) struct RawError {
    extended: i32,
    message: String,
}

impl DatabaseError for RawError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Owned(self.extended.to_string()))
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> ErrorKind {
        match self.extended {
            rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                ErrorKind::UniqueViolation
            }
            rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY => ErrorKind::ForeignKeyViolation,
            rusqlite::ffi::SQLITE_CONSTRAINT_NOTNULL => ErrorKind::NotNullViolation,
            rusqlite::ffi::SQLITE_CONSTRAINT_CHECK => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_keeps_its_code_through_the_conversion() {
        let e = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("database or disk is full".into()),
        );
        let e = raw_error(e);
        assert!(matches!(super::super::StoreError::from(e), super::super::StoreError::DiskFull(_)));
        let io = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR_FSYNC), None);
        assert!(matches!(super::super::StoreError::from(raw_error(io)), super::super::StoreError::Io(_)));
    }
}
