//! Write transactions whose statements travel to SQLite together.
//!
//! sqlx runs each SQLite connection on a worker thread of its own, and every statement awaited on
//! it is a trip there and back: two thread wake-ups, ~0.1 ms each under load, where the
//! statement itself takes a few µs. A [`BatchTx`] queues the statements whose results nobody
//! reads (`BEGIN`, the writes) and sends them with the next statement that returns a row, or with
//! the `COMMIT`: one trip per read, plus one for the rest. The statements run in the order they
//! were queued, on one connection, in one transaction, exactly as if each had been awaited; an
//! error in a queued write comes back from the trip that carried it, and the transaction is then
//! abandoned (the guard closes its connection, which rolls it back).
//!
//! This relies on the SQLite driver running a string of several statements, binding positional
//! `?` parameters in order across them (`sqlx-sqlite`'s `ExecuteIter`), which sqlx documents as
//! supported but deprecated for SQLite. `batch_tests` pins the behaviour: it fails if an sqlx
//! upgrade drops it.

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments, FromRow, Sqlite, SqliteConnection};

use super::Result;

/// A value bound to a [`Stmt`].
#[derive(Debug, Clone)]
pub enum Arg {
    /// An integer.
    Int(i64),
    /// Text.
    Text(String),
    /// A blob.
    Blob(Vec<u8>),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Self::Int(i64::from(v))
    }
}
impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Self::Text(v.to_owned())
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Self {
        Self::Text(v)
    }
}
impl From<&[u8]> for Arg {
    fn from(v: &[u8]) -> Self {
        Self::Blob(v.to_vec())
    }
}
impl From<Vec<u8>> for Arg {
    fn from(v: Vec<u8>) -> Self {
        Self::Blob(v)
    }
}

/// One statement with its values, built before it is sent: run on its own
/// ([`Stmt::execute`]) or queued on a [`BatchTx`]. Its parameters are positional `?`s (a
/// numbered `?N` would name a value of the whole batch, not of this statement).
#[derive(Debug, Clone)]
#[must_use = "a statement does nothing until it is executed or queued"]
pub struct Stmt {
    sql: &'static str,
    args: Vec<Arg>,
}

impl Stmt {
    /// A statement; `sql` holds one statement with positional `?` parameters.
    pub fn new(sql: &'static str) -> Self {
        debug_assert!(!sql.contains("?1") && !sql.trim_end().ends_with(';'), "one statement, positional `?`s: {sql}");
        Self { sql, args: Vec::new() }
    }

    /// Binds the next `?`.
    pub fn bind(mut self, v: impl Into<Arg>) -> Self {
        self.args.push(v.into());
        self
    }

    /// Runs it on `conn` alone; the number of rows it changed.
    pub async fn execute(self, conn: &mut SqliteConnection) -> Result<u64> {
        let mut args = SqliteArguments::default();
        add_all(&mut args, self.args)?;
        Ok(sqlx::query_with(self.sql, args).execute(conn).await?.rows_affected())
    }
}

fn add_all(args: &mut SqliteArguments, values: Vec<Arg>) -> std::result::Result<(), sqlx::Error> {
    for v in values {
        let added = match v {
            Arg::Int(i) => args.add(i),
            Arg::Text(s) => args.add(s),
            Arg::Blob(b) => args.add(b),
        };
        added.map_err(sqlx::Error::Encode)?;
    }
    Ok(())
}

/// A write transaction (`BEGIN IMMEDIATE`) whose statements are queued and sent together
/// (module docs). Made by [`super::Store::batch_tx`] (its commit waits for the disk) or
/// [`super::Store::replayable_tx`] (its commit does not: only for writes that happen again when
/// lost). Dropped without [`commit`](Self::commit), its connection is closed (which rolls back
/// whatever was sent) rather than returned to the pool, so no connection goes back mid-way or
/// with `synchronous=NORMAL`.
///
/// There is no way to reach the connection past the queue: [`conn`](Self::conn) sends what is
/// queued first, so a statement run on it directly still runs after them, inside the
/// transaction.
pub struct BatchTx {
    conn: PoolConnection<Sqlite>,
    /// Statements not sent yet, `;`-separated, starting with the `BEGIN` until the first trip.
    sql: String,
    args: SqliteArguments,
    replayable: bool,
    /// Whether anything besides the `BEGIN` was queued or sent: a transaction that did nothing
    /// commits without a trip.
    used: bool,
    /// A value failed to bind: the queue no longer lines up, so nothing more is sent.
    broken: bool,
    done: bool,
}

impl BatchTx {
    pub(super) fn new(conn: PoolConnection<Sqlite>, replayable: bool) -> Self {
        let begin = if replayable { "PRAGMA synchronous = NORMAL;\nBEGIN IMMEDIATE" } else { "BEGIN IMMEDIATE" };
        Self {
            conn,
            sql: begin.to_owned(),
            args: SqliteArguments::default(),
            replayable,
            used: false,
            broken: false,
            done: false,
        }
    }

    /// Queues `stmt`, a statement that returns no rows (a write without `RETURNING`): it is
    /// sent with the next trip.
    pub fn queue(&mut self, stmt: Stmt) -> Result<()> {
        self.used = true;
        if let Err(e) = add_all(&mut self.args, stmt.args) {
            self.broken = true;
            return Err(e.into());
        }
        self.push(stmt.sql);
        Ok(())
    }

    /// Sends what is queued and then `stmt` in one trip; the first row `stmt` returns.
    pub async fn fetch_optional<O>(&mut self, stmt: Stmt) -> Result<Option<O>>
    where
        O: for<'r> FromRow<'r, SqliteRow> + Send + Unpin,
    {
        self.queue(stmt)?;
        let (sql, args) = self.take()?;
        Ok(sqlx::query_as_with::<_, O, _>(sqlx::AssertSqlSafe(sql), args).fetch_optional(&mut *self.conn).await?)
    }

    /// The transaction's connection, for statements that are not [`Stmt`]s: what is queued is
    /// sent first.
    pub async fn conn(&mut self) -> Result<&mut SqliteConnection> {
        self.used = true;
        self.flush().await?;
        Ok(&mut self.conn)
    }

    /// Sends what is queued and the `COMMIT` (and, for a replayable transaction, puts the
    /// connection back to `synchronous=FULL`) in one trip. Failing anywhere leaves `done` unset,
    /// so the connection is closed, never pooled mid-transaction or with `NORMAL`. A transaction
    /// that did nothing sends nothing.
    pub async fn commit(mut self) -> Result<()> {
        if self.queue_commit() {
            self.flush().await?;
        }
        self.done = true;
        Ok(())
    }

    /// Sends what is queued, then `stmts` (writes with a `RETURNING` clause), then the `COMMIT`,
    /// all in one trip; the rows `stmts` returned, in order (a statement that changed nothing
    /// returns none, so let the rows say which statement they are from). The rows are only
    /// handed back once the commit succeeded.
    pub async fn commit_returning<O>(mut self, stmts: Vec<Stmt>) -> Result<Vec<O>>
    where
        O: for<'r> FromRow<'r, SqliteRow> + Send + Unpin,
    {
        for stmt in stmts {
            self.queue(stmt)?;
        }
        if !self.queue_commit() {
            self.done = true;
            return Ok(Vec::new());
        }
        let (sql, args) = self.take()?;
        let rows = sqlx::query_as_with::<_, O, _>(sqlx::AssertSqlSafe(sql), args).fetch_all(&mut *self.conn).await?;
        self.done = true;
        Ok(rows)
    }

    /// Queues the `COMMIT` (and, replayable, the return to `synchronous=FULL`); false when the
    /// transaction did nothing, so there is nothing to send.
    fn queue_commit(&mut self) -> bool {
        if self.used {
            self.push(if self.replayable { "COMMIT;\nPRAGMA synchronous = FULL" } else { "COMMIT" });
        }
        self.used
    }

    async fn flush(&mut self) -> Result<()> {
        if self.sql.is_empty() {
            return Ok(());
        }
        let (sql, args) = self.take()?;
        sqlx::query_with(sqlx::AssertSqlSafe(sql), args).execute(&mut *self.conn).await?;
        Ok(())
    }

    fn push(&mut self, sql: &str) {
        if !self.sql.is_empty() {
            self.sql.push_str(";\n");
        }
        self.sql.push_str(sql);
    }

    fn take(&mut self) -> Result<(String, SqliteArguments)> {
        if self.broken {
            return Err(
                sqlx::Error::Protocol("a value of this transaction failed to bind; it was abandoned".into()).into()
            );
        }
        Ok((std::mem::take(&mut self.sql), std::mem::take(&mut self.args)))
    }
}

impl Drop for BatchTx {
    fn drop(&mut self) {
        if !self.done {
            self.conn.close_on_drop();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod batch_tests {
    use super::*;
    use crate::store::Store;

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        sqlx::raw_sql("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER, b BLOB)").execute(&store.pool).await.unwrap();
        (dir, store)
    }

    fn put(k: &str, n: i64) -> Stmt {
        Stmt::new("INSERT INTO t (k, n) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = excluded.n").bind(k).bind(n)
    }

    /// The queued writes run before the read, in order, with their values bound in order
    /// across the statements: what the driver must keep doing for batches to be correct.
    #[tokio::test]
    async fn queued_writes_run_in_order_before_the_read_that_carries_them() {
        let (_d, store) = store().await;
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(put("a", 1)).unwrap();
        tx.queue(put("b", 2)).unwrap();
        tx.queue(Stmt::new("UPDATE t SET n = n * 10 WHERE k = ?").bind("a")).unwrap();
        tx.queue(Stmt::new("UPDATE t SET b = ? WHERE k = ?").bind(vec![7u8, 8]).bind("b")).unwrap();
        let got: Option<(i64, i64, Vec<u8>)> = tx
            .fetch_optional(Stmt::new(
                "SELECT (SELECT n FROM t WHERE k = ?), (SELECT n FROM t WHERE k = ?), (SELECT b FROM t WHERE k = ?)",
            ).bind("a").bind("b").bind("b"))
            .await
            .unwrap();
        assert_eq!(got, Some((10, 2, vec![7, 8])));
        // Not visible outside before the commit (the transaction is open), visible after.
        assert_eq!(sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM t").fetch_one(&store.pool).await.unwrap(), 0);
        tx.queue(put("c", 3)).unwrap();
        tx.commit().await.unwrap();
        let all: Vec<(String, i64)> =
            sqlx::query_as("SELECT k, n FROM t ORDER BY k").fetch_all(&store.pool).await.unwrap();
        assert_eq!(all, vec![("a".into(), 10), ("b".into(), 2), ("c".into(), 3)]);
    }

    #[tokio::test]
    async fn a_read_that_finds_nothing_still_runs_what_came_before_it() {
        let (_d, store) = store().await;
        let mut tx = store.replayable_tx().await.unwrap();
        tx.queue(put("a", 1)).unwrap();
        let none: Option<(i64,)> =
            tx.fetch_optional(Stmt::new("SELECT n FROM t WHERE k = ?").bind("zz")).await.unwrap();
        assert_eq!(none, None);
        let a: Option<(i64,)> = tx.fetch_optional(Stmt::new("SELECT n FROM t WHERE k = ?").bind("a")).await.unwrap();
        assert_eq!(a, Some((1,)));
        tx.commit().await.unwrap();
    }

    /// A queued write that fails fails the trip carrying it, and nothing of the transaction stays.
    #[tokio::test]
    async fn a_failing_queued_write_fails_its_trip_and_keeps_nothing() {
        let (_d, store) = store().await;
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(put("a", 1)).unwrap();
        tx.queue(Stmt::new("INSERT INTO t (k, n) VALUES (?, ?)").bind("a").bind(2)).unwrap();
        tx.queue(put("b", 3)).unwrap();
        assert!(tx.commit().await.is_err(), "the duplicate key fails the commit's trip");
        assert_eq!(sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM t").fetch_one(&store.pool).await.unwrap(), 0);
        // The write lock went with the closed connection.
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(put("c", 1)).unwrap();
        tx.commit().await.unwrap();
    }

    /// Rows returned by writes sent with the commit come back once it succeeded; a commit that
    /// fails returns none of them and keeps nothing.
    #[tokio::test]
    async fn writes_returning_rows_go_with_the_commit() {
        let (_d, store) = store().await;
        for (k, n) in [("a", 1), ("b", 2), ("c", 3)] {
            put(k, n).execute(&mut store.pool.acquire().await.unwrap()).await.unwrap();
        }
        let bump = |k: &str| Stmt::new("UPDATE t SET n = n + 10 WHERE k = ? AND n < 3 RETURNING k, n").bind(k);
        let mut tx = store.replayable_tx().await.unwrap();
        tx.queue(put("d", 4)).unwrap();
        let rows: Vec<(String, i64)> = tx.commit_returning(vec![bump("a"), bump("c"), bump("b")]).await.unwrap();
        assert_eq!(rows, vec![("a".into(), 11), ("b".into(), 12)], "c changed nothing, so it returned nothing");
        let all: Vec<(String, i64)> =
            sqlx::query_as("SELECT k, n FROM t ORDER BY k").fetch_all(&store.pool).await.unwrap();
        assert_eq!(all, vec![("a".into(), 11), ("b".into(), 12), ("c".into(), 3), ("d".into(), 4)]);
        // A write after them that fails: the whole trip fails, nothing stays.
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(Stmt::new("INSERT INTO t (k, n) VALUES (?, ?)").bind("a").bind(0)).unwrap();
        let failed = tx.commit_returning::<(String, i64)>(vec![bump("c")]).await;
        assert!(failed.is_err());
        let c: i64 = sqlx::query_scalar("SELECT n FROM t WHERE k = 'c'").fetch_one(&store.pool).await.unwrap();
        assert_eq!(c, 3);
    }

    /// A transaction that did nothing commits without a trip: it does not even take the write
    /// lock, so it does not wait behind another writer.
    #[tokio::test]
    async fn a_transaction_that_did_nothing_sends_nothing() {
        let (_d, store) = store().await;
        let mut writer = store.pool.acquire().await.unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *writer).await.unwrap();
        let tx = store.replayable_tx().await.unwrap();
        let quick = tokio::time::timeout(std::time::Duration::from_millis(500), tx.commit()).await;
        assert!(matches!(quick, Ok(Ok(()))), "committed at once, without waiting for the lock: {quick:?}");
        sqlx::raw_sql("ROLLBACK").execute(&mut *writer).await.unwrap();
    }

    /// The connection handed out directly runs after what was queued, inside the transaction.
    #[tokio::test]
    async fn the_connection_handed_out_runs_after_the_queue() {
        let (_d, store) = store().await;
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(put("a", 1)).unwrap();
        let n: i64 =
            sqlx::query_scalar("SELECT n FROM t WHERE k = 'a'").fetch_one(tx.conn().await.unwrap()).await.unwrap();
        assert_eq!(n, 1);
        drop(tx);
        assert_eq!(sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM t").fetch_one(&store.pool).await.unwrap(), 0);
    }
}
