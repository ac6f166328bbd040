//! Reads on the caller's thread.
//!
//! sqlx runs each SQLite statement on its connection's own worker thread: every statement is a
//! trip there and back (a channel send, a wake-up, a reply, another wake-up). When the cores are
//! busy that trip costs ~0.1–0.15 ms, and the read inside it a few µs (BENCHMARKS.md, "Reads on
//! the caller's thread"). A group message's receive made a dozen such trips between the relay's
//! answer and the hand-out, most of them reads. Those reads run here instead: synchronously, on
//! connections of this store's own ([`rusqlite`], the same bundled SQLite through the same
//! `libsqlite3-sys` as sqlx's), with cached statements, as relay-lite's writer runs its writes.
//!
//! What may run here: a short read through an index (`tests/tests/query_plans.rs` checks every
//! statement's plan), since it holds the async worker thread it runs on. Writes and anything
//! that may wait stay on sqlx. The connections are read-only (`query_only`): nothing can write
//! through them. In WAL mode a reader does not wait for the writer, and each statement reads the
//! newest commit when it starts, so a read here sees everything committed before it was called,
//! on any connection, as a pool read does.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, Params, Row};

use super::{Result, StoreError};

/// Idle connections kept; more are opened while more callers read at once, and closed after.
const IDLE: usize = 4;

/// Prepared statements each connection keeps (the reads that run here, with room to spare).
const STATEMENTS: usize = 64;

/// The store's connections for reads on the caller's thread.
#[derive(Debug)]
pub(crate) struct DirectReads {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl DirectReads {
    /// Reads of the (migrated) database at `path`; connections are opened when first needed.
    pub(crate) fn new(path: &Path) -> Self {
        Self { path: path.to_owned(), idle: Mutex::new(Vec::new()) }
    }

    /// Runs `read` on an idle connection (or a new one), then keeps the connection for the next.
    fn with<T>(&self, read: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let taken = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let conn = match taken {
            Some(conn) => conn,
            None => open(&self.path).map_err(StoreError::Direct)?,
        };
        let out = read(&conn).map_err(StoreError::Direct);
        // A single statement leaves no transaction open; a connection that somehow did is not kept.
        if conn.is_autocommit()
            && let Ok(mut idle) = self.idle.lock()
            && idle.len() < IDLE
        {
            idle.push(conn);
        }
        out
    }

    /// Every row `sql` returns, each through `map`.
    pub(crate) fn rows<T>(
        &self,
        sql: &'static str,
        params: impl Params,
        map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        self.with(|conn| conn.prepare_cached(sql)?.query_map(params, map)?.collect())
    }

    /// The first row `sql` returns, if any, through `map`.
    pub(crate) fn row<T>(
        &self,
        sql: &'static str,
        params: impl Params,
        map: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Option<T>> {
        self.with(|conn| {
            let mut stmt = conn.prepare_cached(sql)?;
            let mut rows = stmt.query(params)?;
            rows.next()?.map(map).transpose()
        })
    }
}

/// A read-only connection to the database at `path`. The file exists and is migrated (sqlx's
/// pool opened it first), in WAL mode.
fn open(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    // A reader waits only in rare moments (another connection recovering the WAL index); never
    // long on the async thread it runs on.
    conn.busy_timeout(Duration::from_secs(1))?;
    conn.set_prepared_statement_cache_capacity(STATEMENTS);
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::store::Store;

    /// A read sees what was committed through the pool just before (another connection), and the
    /// connections cannot write.
    #[tokio::test]
    async fn reads_see_the_pools_commits_and_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        let read = |key: &'static str| {
            store.direct.row("SELECT value FROM meta WHERE key = ?", [key], |r| r.get::<_, String>(0)).unwrap()
        };
        assert_eq!(read("direct-test"), None);
        store.set_meta("direct-test", "one").await.unwrap();
        assert_eq!(read("direct-test").as_deref(), Some("one"));
        store.set_meta("direct-test", "two").await.unwrap();
        assert_eq!(read("direct-test").as_deref(), Some("two"));
        let err = store.direct.with(|c| c.execute("INSERT INTO meta (key, value) VALUES ('x', 'y')", [])).unwrap_err();
        assert!(err.to_string().contains("readonly") || err.to_string().contains("read-only"), "{err}");
        assert_eq!(store.meta("x").await.unwrap(), None);
    }

    /// A failing read is an error, and the connection stays usable for the next.
    #[tokio::test]
    async fn a_failing_read_is_an_error_and_the_next_one_works() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        assert!(store.direct.rows("SELECT nothing FROM nowhere", [], |r| r.get::<_, i64>(0)).is_err());
        let one = store.direct.row("SELECT 1", [], |r| r.get::<_, i64>(0)).unwrap();
        assert_eq!(one, Some(1));
        assert!(store.direct.idle.lock().unwrap().len() <= IDLE);
    }
}
