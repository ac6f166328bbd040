//! The SQLite writer's connection: every write runs synchronously on the writer's thread.
//!
//! sqlx runs every SQLite statement on the connection's own worker thread: each statement is a
//! round trip between that thread and the writer (a channel send, a wake-up, a reply, another
//! wake-up), and each trip could wait for a core behind the request tasks (BENCHMARKS.md, "the
//! writer on its own thread"). A batch of 30 letagents deposits was 32 such trips (`BEGIN`, 30
//! inserts, `COMMIT`). The writer therefore holds a [`rusqlite`] connection of its own to the
//! database (the same bundled SQLite as sqlx's, through the same `libsqlite3-sys`) and runs a
//! whole batch on it with cached statements: `BEGIN IMMEDIATE`, every write in queue order,
//! `COMMIT`, without leaving its thread. Each protocol's store file defines its writes with
//! [`super::writer::sync_request`]; sqlx serves the reader pool and the migrations.
//!
//! Until every write was ported, a batch that mixed in sqlx writes ran on sqlx's connection
//! (with the ported ones on its handle, the crate's one `unsafe`): an ack through sqlx then a
//! send on this connection made each commit invalidate the other connection's page cache, so a
//! Stringcup send read its pages back from the file after every ack (BENCHMARKS.md, "Every
//! SQLite write on the writer's own connection").

use std::borrow::Cow;
use std::path::Path;

use sqlx::error::{DatabaseError, ErrorKind};

/// The connection a write runs on.
pub(crate) type SyncDb = rusqlite::Connection;

/// The SQLite writer's connection.
pub(crate) struct WriterConn {
    db: SyncDb,
}

impl WriterConn {
    /// Opens the writer's connection to the database at `path` (migrated already).
    pub(crate) fn open(path: &Path) -> Result<Self, sqlx::Error> {
        Ok(Self { db: open_own(path).map_err(raw_error)? })
    }

    /// The connection, for the batch's writes.
    pub(crate) fn db(&self) -> &SyncDb {
        &self.db
    }

    /// Runs one of the batch's own statements (`BEGIN IMMEDIATE`, `COMMIT`, `ROLLBACK`).
    pub(crate) fn execute(&self, sql: &str) -> Result<(), sqlx::Error> {
        self.db.prepare_cached(sql).and_then(|mut s| s.execute([])).map(drop).map_err(raw_error)
    }

    /// Closes the connection; SQLite rolls back a transaction still open on it.
    pub(crate) fn close(self) {
        if let Err((_, e)) = self.db.close() {
            tracing::warn!(error = %e, "closing the writer connection");
        }
    }
}

/// Prepared statements the writer's connection keeps.
const STATEMENT_CACHE: usize = 128;

/// The writer's connection to the database at `path`, configured as sqlx's connections are
/// (`super::connect_options`): WAL (the file's, already set), `synchronous=FULL`, foreign keys
/// on, a 10 s busy timeout. The durability settings are read back, not assumed.
fn open_own(path: &Path) -> rusqlite::Result<SyncDb> {
    use rusqlite::OpenFlags;
    let db = SyncDb::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    db.busy_timeout(std::time::Duration::from_secs(10))?;
    // Every write of every protocol prepares its statements here (~70 in all); rusqlite keeps 16
    // by default, which a mixed load would churn through.
    db.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    db.pragma_update(None, "synchronous", "FULL")?;
    db.pragma_update(None, "foreign_keys", true)?;
    let journal: String = db.pragma_query_value(None, "journal_mode", |r| r.get(0))?;
    let synchronous: i64 = db.pragma_query_value(None, "synchronous", |r| r.get(0))?;
    let foreign_keys: bool = db.pragma_query_value(None, "foreign_keys", |r| r.get(0))?;
    if !journal.eq_ignore_ascii_case("wal") || synchronous != 2 || !foreign_keys {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISUSE),
            Some(format!(
                "the writer's connection is not durable as configured: journal_mode={journal}, \
                 synchronous={synchronous}, foreign_keys={foreign_keys}"
            )),
        ));
    }
    Ok(db)
}

/// An error of a rusqlite call, as the sqlx error the rest of the store handles: SQLite's
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

/// Rows a statement changed, as a report counts them.
pub(crate) fn rows(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The result of a write, as the sqlx result the writer handles: a rusqlite error
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
