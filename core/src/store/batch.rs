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

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments, FromRow, Sqlite, SqliteConnection, SqlitePool};

use super::Result;
use super::direct::Direct;

/// A value bound to a [`Stmt`].
#[derive(Debug, Clone)]
pub enum Arg {
    /// An integer.
    Int(i64),
    /// Text.
    Text(String),
    /// A blob.
    Blob(Vec<u8>),
    /// NULL.
    Null,
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
impl<T: Into<Arg>> From<Option<T>> for Arg {
    fn from(v: Option<T>) -> Self {
        v.map_or(Self::Null, Into::into)
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

    /// The statement and its values, for the caller's-thread writer.
    pub(super) fn parts(&self) -> (&'static str, &[Arg]) {
        (self.sql, &self.args)
    }

    /// Runs it on `conn` alone; the number of rows it changed.
    pub async fn execute(self, conn: &mut SqliteConnection) -> Result<u64> {
        Ok(self.run(conn).await?.rows_affected())
    }

    /// Runs an `INSERT` on `conn` alone; the rowid it gave the row.
    pub async fn insert(self, conn: &mut SqliteConnection) -> Result<i64> {
        Ok(self.run(conn).await?.last_insert_rowid())
    }

    /// Runs `stmts` on `conn`, one after another.
    pub async fn execute_all(stmts: impl IntoIterator<Item = Stmt>, conn: &mut SqliteConnection) -> Result<()> {
        for stmt in stmts {
            stmt.execute(&mut *conn).await?;
        }
        Ok(())
    }

    async fn run(self, conn: &mut SqliteConnection) -> Result<sqlx::sqlite::SqliteQueryResult> {
        let mut args = SqliteArguments::default();
        add_all(&mut args, self.args)?;
        Ok(sqlx::query_with(self.sql, args).execute(conn).await?)
    }
}

fn add_all(args: &mut SqliteArguments, values: Vec<Arg>) -> std::result::Result<(), sqlx::Error> {
    for v in values {
        let added = match v {
            Arg::Int(i) => args.add(i),
            Arg::Text(s) => args.add(s),
            Arg::Blob(b) => args.add(b),
            Arg::Null => args.add(None::<i64>),
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
/// A transaction that reaches its commit without a trip (everything queued) runs on the
/// caller's thread instead when the write lock is free at that moment (`super::direct`: a
/// durable one only on a multi-threaded runtime): no trip at all. When another connection holds
/// the lock it goes to sqlx as above, which waits for it.
///
/// There is no way to reach the connection past the queue: [`conn`](Self::conn) sends what is
/// queued first, so a statement run on it directly still runs after them, inside the
/// transaction. The pool's connection is taken at the first trip, so a transaction that
/// commits on the caller's thread never takes one.
pub struct BatchTx {
    pool: SqlitePool,
    /// The pool's connection, from the first trip on.
    conn: Option<PoolConnection<Sqlite>>,
    /// The caller's-thread writers, while nothing was sent.
    direct: Option<Arc<Direct>>,
    /// `BEGIN` (with the `PRAGMA` of a replayable one), until the first trip carries it.
    begin: Option<&'static str>,
    /// Statements not sent yet, in order.
    queued: Vec<Stmt>,
    replayable: bool,
    /// Whether anything besides the `BEGIN` was queued or sent: a transaction that did nothing
    /// commits without a trip.
    used: bool,
    /// A value failed to bind: the queue no longer lines up, so nothing more is sent.
    broken: bool,
    done: bool,
}

impl BatchTx {
    pub(super) fn new(pool: SqlitePool, direct: Arc<Direct>, replayable: bool) -> Self {
        let direct = Some(direct);
        let begin = if replayable { "PRAGMA synchronous = NORMAL;\nBEGIN IMMEDIATE" } else { "BEGIN IMMEDIATE" };
        Self {
            pool,
            conn: None,
            direct,
            begin: Some(begin),
            queued: Vec::new(),
            replayable,
            used: false,
            broken: false,
            done: false,
        }
    }

    /// The pool's connection, taken at the first trip.
    async fn pooled(&mut self) -> Result<&mut PoolConnection<Sqlite>> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => self.pool.acquire().await?,
        };
        Ok(self.conn.insert(conn))
    }

    /// Queues `stmt`, a statement that returns no rows (a write without `RETURNING`): it is
    /// sent with the next trip (its values are bound then; one that fails to bind fails that
    /// trip and abandons the transaction).
    pub fn queue(&mut self, stmt: Stmt) {
        self.used = true;
        self.queued.push(stmt);
    }

    /// Sends what is queued and then `stmt` in one trip; the first row `stmt` returns.
    pub async fn fetch_optional<O>(&mut self, stmt: Stmt) -> Result<Option<O>>
    where
        O: for<'r> FromRow<'r, SqliteRow> + Send + Unpin,
    {
        self.queue(stmt);
        let (sql, args) = self.take(None)?;
        Ok(sqlx::query_as_with::<_, O, _>(sqlx::AssertSqlSafe(sql), args)
            .fetch_optional(&mut **self.pooled().await?)
            .await?)
    }

    /// The transaction's connection, for statements that are not [`Stmt`]s: what is queued is
    /// sent first.
    pub async fn conn(&mut self) -> Result<&mut SqliteConnection> {
        self.used = true;
        if self.begin.is_some() || !self.queued.is_empty() {
            let (sql, args) = self.take(None)?;
            sqlx::query_with(sqlx::AssertSqlSafe(sql), args).execute(&mut **self.pooled().await?).await?;
        }
        Ok(&mut **self.pooled().await?)
    }

    /// Sends what is queued and the `COMMIT` (and, for a replayable transaction, puts the
    /// connection back to `synchronous=FULL`) in one trip, or runs it all on the caller's
    /// thread (see the type's docs). Failing anywhere leaves `done` unset, so the connection is
    /// closed, never pooled mid-transaction or with `NORMAL`. A transaction that did nothing
    /// sends nothing.
    pub async fn commit(mut self) -> Result<()> {
        if !self.used {
            self.done = true;
            return Ok(());
        }
        if self.try_direct::<()>(&[]).await?.is_none() {
            let (sql, args) = self.commit_sql(Vec::new())?;
            sqlx::query_with(sqlx::AssertSqlSafe(sql), args).execute(&mut **self.pooled().await?).await?;
            self.done = true;
        }
        Ok(())
    }

    /// Sends what is queued, then `stmts` (writes with a `RETURNING` clause), then the `COMMIT`,
    /// all in one trip (or on the caller's thread, as [`Self::commit`]); the rows `stmts`
    /// returned, in order (a statement that changed nothing returns none, so let the rows say
    /// which statement they are from). The rows are only handed back once the commit succeeded.
    pub async fn commit_returning<O>(mut self, stmts: Vec<Stmt>) -> Result<Vec<O>>
    where
        O: for<'r> FromRow<'r, SqliteRow> + Returned + Send + Unpin,
    {
        if !self.used && stmts.is_empty() {
            self.done = true;
            return Ok(Vec::new());
        }
        if let Some(rows) = self.try_direct(&stmts).await? {
            return Ok(rows);
        }
        let (sql, args) = self.commit_sql(stmts)?;
        let rows = sqlx::query_as_with::<_, O, _>(sqlx::AssertSqlSafe(sql), args)
            .fetch_all(&mut **self.pooled().await?)
            .await?;
        self.done = true;
        Ok(rows)
    }

    /// The whole transaction (what is queued, then `returning`, then the `COMMIT`) on the
    /// caller's thread, when nothing was sent yet and the write lock is free now (a durable
    /// transaction only on a multi-threaded runtime): the rows `returning` gave, and the
    /// transaction is done. `None`: nothing happened.
    async fn try_direct<O: Returned>(&mut self, returning: &[Stmt]) -> Result<Option<Vec<O>>> {
        let Some(direct) = self.direct.take().filter(|_| self.begin.is_some() && !self.broken) else {
            return Ok(None);
        };
        let durable = !self.replayable;
        let commit = || direct.try_commit(durable, &self.queued, returning, O::from_direct);
        let tried = if !durable {
            commit()?
        } else if tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
        {
            // The commit waits for the disk: tokio hands this worker's other tasks to another
            // thread meanwhile.
            tokio::task::block_in_place(commit)?
        } else {
            // A runtime of one thread must not wait for the disk: sqlx's thread does.
            None
        };
        let Some((rows, checkpoint)) = tried else { return Ok(None) };
        self.done = true;
        if checkpoint {
            self::checkpoint(&mut **self.pooled().await?).await;
        }
        Ok(Some(rows))
    }

    /// The rest of the transaction as one string: what is queued, `stmts`, the `COMMIT` (and a
    /// replayable one's return to `synchronous=FULL`).
    fn commit_sql(&mut self, stmts: Vec<Stmt>) -> Result<(String, SqliteArguments)> {
        self.queued.extend(stmts);
        self.take(Some(if self.replayable { "COMMIT;\nPRAGMA synchronous = FULL" } else { "COMMIT" }))
    }

    /// What is queued (after the `BEGIN` if it was not sent yet, then `tail`) as one string of
    /// statements and its values; the queue is empty after, and the caller's-thread writer out
    /// of the question (something went through sqlx).
    fn take(&mut self, tail: Option<&'static str>) -> Result<(String, SqliteArguments)> {
        if self.broken {
            return Err(
                sqlx::Error::Protocol("a value of this transaction failed to bind; it was abandoned".into()).into()
            );
        }
        self.direct = None;
        let queued = std::mem::take(&mut self.queued);
        let mut sql = String::new();
        let mut args = SqliteArguments::default();
        let parts = self.begin.take().into_iter().chain(queued.iter().map(|s| s.sql)).chain(tail);
        for part in parts {
            if !sql.is_empty() {
                sql.push_str(";\n");
            }
            sql.push_str(part);
        }
        for stmt in queued {
            if let Err(e) = add_all(&mut args, stmt.args) {
                self.broken = true;
                return Err(e.into());
            }
        }
        Ok((sql, args))
    }
}

/// The checkpoint due after [`CHECKPOINT_EVERY`](super::direct) commits on the caller's thread,
/// whose connections do not checkpoint (that would be on that thread): `conn` (a pooled one)
/// does, without waiting for readers. Not the transaction's failure if it cannot.
pub(super) async fn checkpoint<'c>(conn: impl sqlx::SqliteExecutor<'c>) {
    if let Err(e) = sqlx::raw_sql("PRAGMA wal_checkpoint(PASSIVE)").execute(conn).await {
        tracing::debug!(error = %e, "checkpoint after writes on the caller's thread");
    }
}

impl Drop for BatchTx {
    fn drop(&mut self) {
        if !self.done
            && let Some(conn) = &mut self.conn
        {
            conn.close_on_drop();
        }
    }
}

/// A row returned by a write sent with the commit ([`BatchTx::commit_returning`]), as the
/// caller's-thread writer reads it.
pub trait Returned: Sized {
    /// The row, by column position.
    fn from_direct(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self>;
}

impl Returned for () {
    fn from_direct(_: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(())
    }
}

impl<A: rusqlite::types::FromSql, B: rusqlite::types::FromSql> Returned for (A, B) {
    fn from_direct(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok((row.get(0)?, row.get(1)?))
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
        tx.queue(put("a", 1));
        tx.queue(put("b", 2));
        tx.queue(Stmt::new("UPDATE t SET n = n * 10 WHERE k = ?").bind("a"));
        tx.queue(Stmt::new("UPDATE t SET b = ? WHERE k = ?").bind(vec![7u8, 8]).bind("b"));
        let got: Option<(i64, i64, Vec<u8>)> = tx
            .fetch_optional(Stmt::new(
                "SELECT (SELECT n FROM t WHERE k = ?), (SELECT n FROM t WHERE k = ?), (SELECT b FROM t WHERE k = ?)",
            ).bind("a").bind("b").bind("b"))
            .await
            .unwrap();
        assert_eq!(got, Some((10, 2, vec![7, 8])));
        // Not visible outside before the commit (the transaction is open), visible after.
        assert_eq!(sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM t").fetch_one(&store.pool).await.unwrap(), 0);
        tx.queue(put("c", 3));
        tx.commit().await.unwrap();
        let all: Vec<(String, i64)> =
            sqlx::query_as("SELECT k, n FROM t ORDER BY k").fetch_all(&store.pool).await.unwrap();
        assert_eq!(all, vec![("a".into(), 10), ("b".into(), 2), ("c".into(), 3)]);
    }

    #[tokio::test]
    async fn a_read_that_finds_nothing_still_runs_what_came_before_it() {
        let (_d, store) = store().await;
        let mut tx = store.replayable_tx().await.unwrap();
        tx.queue(put("a", 1));
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
        tx.queue(put("a", 1));
        tx.queue(Stmt::new("INSERT INTO t (k, n) VALUES (?, ?)").bind("a").bind(2));
        tx.queue(put("b", 3));
        assert!(tx.commit().await.is_err(), "the duplicate key fails the commit's trip");
        assert_eq!(sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM t").fetch_one(&store.pool).await.unwrap(), 0);
        // The write lock went with the closed connection.
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(put("c", 1));
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
        tx.queue(put("d", 4));
        let rows: Vec<(String, i64)> = tx.commit_returning(vec![bump("a"), bump("c"), bump("b")]).await.unwrap();
        assert_eq!(rows, vec![("a".into(), 11), ("b".into(), 12)], "c changed nothing, so it returned nothing");
        let all: Vec<(String, i64)> =
            sqlx::query_as("SELECT k, n FROM t ORDER BY k").fetch_all(&store.pool).await.unwrap();
        assert_eq!(all, vec![("a".into(), 11), ("b".into(), 12), ("c".into(), 3), ("d".into(), 4)]);
        // A write after them that fails: the whole trip fails, nothing stays.
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(Stmt::new("INSERT INTO t (k, n) VALUES (?, ?)").bind("a").bind(0));
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
        tx.queue(put("a", 1));
        let n: i64 =
            sqlx::query_scalar("SELECT n FROM t WHERE k = 'a'").fetch_one(tx.conn().await.unwrap()).await.unwrap();
        assert_eq!(n, 1);
        drop(tx);
        assert_eq!(sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM t").fetch_one(&store.pool).await.unwrap(), 0);
    }

    /// A replayable transaction with everything queued commits on the caller's thread when the
    /// lock is free: kept, visible to the pool at once, rows returned as through sqlx.
    #[tokio::test]
    async fn a_replayable_commit_runs_on_the_callers_thread_when_the_lock_is_free() {
        let (_d, store) = store().await;
        let before = store.direct.commits();
        let mut tx = store.replayable_tx().await.unwrap();
        tx.queue(put("a", 1));
        tx.queue(Stmt::new("UPDATE t SET b = ? WHERE k = ?").bind(vec![1u8, 2]).bind("a"));
        tx.commit().await.unwrap();
        assert_eq!(store.direct.commits(), before + 1, "committed on the caller's thread");
        let row: (i64, Vec<u8>) =
            sqlx::query_as("SELECT n, b FROM t WHERE k = 'a'").fetch_one(&store.pool).await.unwrap();
        assert_eq!(row, (1, vec![1, 2]));
        // The writer's connection stays NORMAL; the pool's stay FULL.
        let mut conn = store.pool.acquire().await.unwrap();
        let level: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(&mut *conn).await.unwrap();
        assert_eq!(level, 2);
    }

    /// `None` binds NULL, through sqlx (a trip) and on the caller's thread alike.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_none_binds_null_on_either_path() {
        let (_d, store) = store().await;
        let null_n = |k: &str| {
            Stmt::new("INSERT INTO t (k, n, b) VALUES (?, ?, ?)").bind(k).bind(None::<i64>).bind(None::<Vec<u8>>)
        };
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(null_n("direct"));
        tx.queue(Stmt::new("UPDATE t SET n = ? WHERE k = ?").bind(Some(5_i64)).bind("direct"));
        let before = store.direct.commits();
        tx.commit().await.unwrap();
        assert_eq!(store.direct.commits(), before + 1, "on the caller's thread");
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(null_n("trip"));
        let got: Option<(Option<i64>, Option<Vec<u8>>)> =
            tx.fetch_optional(Stmt::new("SELECT n, b FROM t WHERE k = ?").bind("trip")).await.unwrap();
        assert_eq!(got, Some((None, None)));
        tx.commit().await.unwrap();
        let rows: Vec<(String, Option<i64>, Option<Vec<u8>>)> =
            sqlx::query_as("SELECT k, n, b FROM t ORDER BY k").fetch_all(&store.pool).await.unwrap();
        assert_eq!(rows, [("direct".to_owned(), Some(5), None), ("trip".to_owned(), None, None)]);
    }

    /// A transaction that commits on the caller's thread never takes a pool connection: with
    /// every pooled one held elsewhere it still commits at once. One that needs a trip takes one
    /// then (and waits for it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_on_the_callers_thread_takes_no_pool_connection() {
        let (_d, store) = store().await;
        let mut held = Vec::new();
        for _ in 0..store.pool.options().get_max_connections() {
            held.push(store.pool.acquire().await.unwrap());
        }
        let quick = std::time::Duration::from_secs(2);
        for durable in [false, true] {
            let commit = async {
                let mut tx = if durable { store.batch_tx().await? } else { store.replayable_tx().await? };
                tx.queue(put(if durable { "durable" } else { "replayable" }, 1));
                tx.commit().await
            };
            tokio::time::timeout(quick, commit).await.expect("no pool connection needed").unwrap();
        }
        let other = store.clone();
        let trip = async move {
            let mut tx = other.replayable_tx().await?;
            tx.queue(put("c", 3));
            let n: Option<(i64,)> = tx.fetch_optional(Stmt::new("SELECT n FROM t WHERE k = ?").bind("c")).await?;
            tx.commit().await?;
            Ok::<_, crate::store::StoreError>(n)
        };
        let trip = tokio::spawn(trip);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!trip.is_finished(), "a trip waits for a pool connection");
        drop(held);
        assert_eq!(trip.await.unwrap().unwrap(), Some((3,)));
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t").fetch_one(&store.pool).await.unwrap();
        assert_eq!(n, 3);
    }

    /// Another connection holds the write lock: the commit goes through sqlx, which waits for
    /// it, and nothing is lost or done twice.
    #[tokio::test]
    async fn a_busy_lock_sends_the_replayable_commit_through_sqlx_which_waits() {
        let (_d, store) = store().await;
        let mut writer = store.pool.acquire().await.unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *writer).await.unwrap();
        let before = store.direct.commits();
        let waiting = {
            let store = store.clone();
            tokio::spawn(async move {
                let mut tx = store.replayable_tx().await.unwrap();
                tx.queue(put("a", 7));
                tx.commit().await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "it waits for the lock");
        sqlx::raw_sql("ROLLBACK").execute(&mut *writer).await.unwrap();
        waiting.await.unwrap().unwrap();
        assert_eq!(store.direct.commits(), before, "not on the caller's thread");
        let n: i64 = sqlx::query_scalar("SELECT n FROM t WHERE k = 'a'").fetch_one(&store.pool).await.unwrap();
        assert_eq!(n, 7);
    }

    /// A write that fails on the caller's thread fails the commit and keeps nothing; the lock is
    /// released and the next commit there works.
    #[tokio::test]
    async fn a_failing_write_on_the_callers_thread_keeps_nothing() {
        let (_d, store) = store().await;
        let mut tx = store.replayable_tx().await.unwrap();
        tx.queue(put("a", 1));
        tx.queue(Stmt::new("INSERT INTO t (k, n) VALUES (?, ?)").bind("a").bind(2));
        assert!(tx.commit().await.is_err(), "the duplicate key fails the commit");
        assert_eq!(sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM t").fetch_one(&store.pool).await.unwrap(), 0);
        let before = store.direct.commits();
        let mut tx = store.replayable_tx().await.unwrap();
        tx.queue(put("b", 2));
        let rows: Vec<(String, i64)> =
            tx.commit_returning(vec![Stmt::new("UPDATE t SET n = n + 1 RETURNING k, n")]).await.unwrap();
        assert_eq!(rows, vec![("b".into(), 3)]);
        assert_eq!(store.direct.commits(), before + 1);
        // A durable write after it takes the lock at once (nothing was left holding it).
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(put("c", 1));
        tokio::time::timeout(std::time::Duration::from_secs(2), tx.commit()).await.unwrap().unwrap();
    }

    /// The caller's-thread writer never checkpoints (that would copy the WAL into the database
    /// and sync it on an async thread): in WAL mode only a checkpoint writes the database file,
    /// so its size holds still past SQLite's automatic threshold (1,000 pages) until the
    /// 256th commit made there has a pooled connection checkpoint.
    #[tokio::test]
    async fn commits_on_the_callers_thread_are_checkpointed_by_the_pool_every_256() {
        let (dir, store) = store().await;
        let file = dir.path().join("db.sqlite");
        let size = || std::fs::metadata(&file).unwrap().len();
        sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE)").execute(&store.pool).await.unwrap();
        let start = size();
        let before = store.direct.commits();
        let blob = vec![7u8; 20_000];
        for i in 0..256_i64 {
            if i == 255 {
                assert_eq!(size(), start, "no checkpoint in 255 commits of 20 KB (~1,250 pages)");
            }
            let mut tx = store.replayable_tx().await.unwrap();
            tx.queue(
                Stmt::new("INSERT INTO t (k, n, b) VALUES (?, ?, ?)").bind(format!("k{i}")).bind(i).bind(blob.clone()),
            );
            tx.commit().await.unwrap();
        }
        assert_eq!(store.direct.commits(), before + 256, "all on the caller's thread");
        assert!(size() > start + 255 * 20_000, "the 256th commit had the pool checkpoint: {} bytes", size());
    }

    /// A durable transaction commits on the caller's thread too, on a multi-threaded runtime
    /// (its wait for the disk inside `block_in_place`); a failing one keeps nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_durable_commit_runs_on_the_callers_thread_on_a_multi_threaded_runtime() {
        let (_d, store) = store().await;
        let before = store.direct.commits();
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(put("a", 1));
        tx.commit().await.unwrap();
        assert_eq!(store.direct.commits(), before + 1, "committed on the caller's thread");
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(put("b", 2));
        tx.queue(Stmt::new("INSERT INTO t (k, n) VALUES (?, ?)").bind("a").bind(2));
        assert!(tx.commit().await.is_err(), "the duplicate key fails the commit");
        let all: Vec<(String, i64)> =
            sqlx::query_as("SELECT k, n FROM t ORDER BY k").fetch_all(&store.pool).await.unwrap();
        assert_eq!(all, vec![("a".into(), 1)], "b was not kept");
        assert_eq!(store.direct.commits(), before + 1);
    }

    /// On a runtime of one thread a durable commit does not wait for the disk on it: sqlx's
    /// thread does.
    #[tokio::test(flavor = "current_thread")]
    async fn a_durable_commit_goes_through_sqlx_on_a_runtime_of_one_thread() {
        let (_d, store) = store().await;
        let before = store.direct.commits();
        let mut tx = store.batch_tx().await.unwrap();
        tx.queue(put("a", 1));
        tx.commit().await.unwrap();
        assert_eq!(store.direct.commits(), before, "not on the caller's thread");
        let n: i64 = sqlx::query_scalar("SELECT n FROM t WHERE k = 'a'").fetch_one(&store.pool).await.unwrap();
        assert_eq!(n, 1);
    }
}
