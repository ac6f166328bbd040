//! Reads, and replayable commits, on the caller's thread.
//!
//! sqlx runs each SQLite statement on its connection's own worker thread: every statement is a
//! trip there and back (a channel send, a wake-up, a reply, another wake-up). When the cores are
//! busy that trip costs ~0.1–0.15 ms, and the read inside it a few µs (BENCHMARKS.md, "Reads and
//! commits on the caller's thread"). A group message's receive made a dozen such trips between the
//! relay's answer and the hand-out, most of them reads. Those reads run here instead:
//! synchronously, on connections of this store's own ([`rusqlite`], the same bundled SQLite
//! through the same `libsqlite3-sys` as sqlx's), with cached statements, as relay-lite's writer
//! runs its writes.
//!
//! What may run here: a short read through an index (`tests/tests/query_plans.rs` checks every
//! statement's plan), since it holds the async worker thread it runs on. The read connections
//! are read-only (`query_only`): nothing can write through them. In WAL mode a reader does not
//! wait for the writer, and each statement reads the newest commit when it starts, so a read here
//! sees everything committed before it was called, on any connection, as a pool read does.
//!
//! And the writes of a [`super::BatchTx`] whose statements were all queued, only when the write
//! lock is free at that moment ([`Direct::try_commit`] never waits: a busy lock sends the
//! transaction to sqlx, which does):
//! - a replayable one ([`super::Store::replayable_tx`]: a group entry processed, a lease handed
//!   out, a post marked), committed without waiting for the disk (`synchronous=NORMAL`, its
//!   point): it appends a few pages to the WAL file, tens of µs, on the caller's thread;
//! - a durable one ([`super::Store::batch_tx`]: a group message before its post), whose commit
//!   waits for the disk (`FULL`): inside `tokio::task::block_in_place`, so the worker's other
//!   tasks move to another thread meanwhile; on a runtime of one thread it goes to sqlx.
//!
//! And a transaction that reads, decides and writes ([`Direct::try_decide`], through
//! [`super::Store::decide_here`]: a letagents message received), on the durable writer, when the
//! lock is free at that moment: it holds the lock from its first read to the commit, so nothing
//! it read can change before what it wrote is committed.
//!
//! These connections never checkpoint (that copies the WAL into the database and syncs it):
//! every [`CHECKPOINT_EVERY`] commits made here, the transaction's pooled connection does it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags, Params, Row, ToSql, params_from_iter};

use super::{Arg, ContactRow, ContactState, MessageRow, OutboxRow, PersonRow, Protocol, Result, Stmt, StoreError};

/// Idle connections kept; more are opened while more callers read at once, and closed after.
const IDLE: usize = 4;

/// Prepared statements each connection keeps (the reads that run here, with room to spare).
const STATEMENTS: usize = 64;

/// Page cache of each read connection, in KiB.
const READER_CACHE_KIB: i64 = 512;

/// Commits on the caller's thread between two checkpoints.
const CHECKPOINT_EVERY: u32 = 256;

/// The store's connections for work on the caller's thread.
#[derive(Debug)]
pub(crate) struct Direct {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    /// The writers' connections (opened when first needed), for replayable commits
    /// (`synchronous=NORMAL`) and for durable ones (`FULL`); `try_lock`ed, never waited for.
    writer: Mutex<Option<Connection>>,
    durable: Mutex<Option<Connection>>,
    commits: AtomicU32,
}

impl Direct {
    /// Work on the (migrated) database at `path`; connections are opened when first needed.
    pub(crate) fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            idle: Mutex::new(Vec::new()),
            writer: Mutex::new(None),
            durable: Mutex::new(None),
            commits: AtomicU32::new(0),
        }
    }

    /// Runs `stmts`, then `returning` (writes with `RETURNING`, each row through `map`), in one
    /// `BEGIN IMMEDIATE` transaction committed with `synchronous=FULL` when `durable` (the
    /// commit waits for the disk) and `NORMAL` otherwise, if the write lock is
    /// free now: the rows `returning` gave, and whether the WAL is now due a checkpoint by
    /// another connection (once every [`CHECKPOINT_EVERY`] commits made here). `None` when the
    /// lock is not free (another connection writes, or another caller has this writer): nothing
    /// was done. A statement or the commit failing rolls everything back.
    pub(crate) fn try_commit<T>(
        &self,
        durable: bool,
        stmts: &[Stmt],
        returning: &[Stmt],
        mut map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Option<(Vec<T>, bool)>> {
        let writer = if durable { &self.durable } else { &self.writer };
        let Ok(mut slot) = writer.try_lock() else { return Ok(None) };
        let conn = match slot.take() {
            Some(conn) => conn,
            None => open_writer(&self.path, durable)?,
        };
        match conn.execute_batch("BEGIN IMMEDIATE") {
            Ok(()) => {}
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {
                *slot = Some(conn);
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
        let mut run = || -> rusqlite::Result<Vec<T>> {
            for stmt in stmts {
                let (sql, args) = stmt.parts();
                conn.prepare_cached(sql)?.execute(params_from_iter(args))?;
            }
            let mut out = Vec::new();
            for stmt in returning {
                let (sql, args) = stmt.parts();
                let mut prepared = conn.prepare_cached(sql)?;
                let mut rows = prepared.query(params_from_iter(args))?;
                while let Some(row) = rows.next()? {
                    out.push(map(row)?);
                }
            }
            conn.execute_batch("COMMIT")?;
            Ok(out)
        };
        let out = run();
        if out.is_err() && !conn.is_autocommit() {
            // SQLite rolls back by itself on some failures (a full disk at the commit), not all.
            let _ = conn.execute_batch("ROLLBACK");
        }
        // A connection still inside a transaction is closed (which rolls it back), never kept.
        if conn.is_autocommit() {
            *slot = Some(conn);
        }
        let out = out?;
        let made = self.commits.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        Ok(Some((out, made.is_multiple_of(CHECKPOINT_EVERY))))
    }

    /// Runs `work` inside a `BEGIN IMMEDIATE` transaction on the durable writer (`FULL`: the
    /// commit waits for the disk), if the write lock is free now, and commits what it wrote when
    /// it returns `Some`. For a decision that reads what it then writes (a message received):
    /// holding the write lock from the first read, nothing can change what it read before the
    /// commit. `work` must be short (index reads, a few writes, no waiting): the lock is held
    /// on the caller's thread throughout. `None` from `work`, or an error anywhere, rolls back.
    pub(crate) fn try_decide<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce(&Here<'_>) -> std::result::Result<Option<T>, E>,
    ) -> std::result::Result<Decided<T>, E> {
        let Ok(mut slot) = self.durable.try_lock() else { return Ok(Decided::Busy) };
        let conn = match slot.take() {
            Some(conn) => conn,
            None => open_writer(&self.path, true).map_err(StoreError::from)?,
        };
        match conn.execute_batch("BEGIN IMMEDIATE") {
            Ok(()) => {}
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {
                *slot = Some(conn);
                return Ok(Decided::Busy);
            }
            Err(e) => return Err(StoreError::from(e).into()),
        }
        let out = match work(&Here { conn: &conn }) {
            Ok(Some(t)) => conn.execute_batch("COMMIT").map(|()| Some(t)).map_err(|e| StoreError::from(e).into()),
            Ok(None) => conn.execute_batch("ROLLBACK").map(|()| None).map_err(|e| StoreError::from(e).into()),
            Err(e) => Err(e),
        };
        if out.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        // A connection still inside a transaction is closed (which rolls it back), never kept.
        if conn.is_autocommit() {
            *slot = Some(conn);
        }
        Ok(match out? {
            Some(t) => {
                let made = self.commits.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
                Decided::Committed(t, made.is_multiple_of(CHECKPOINT_EVERY))
            }
            None => Decided::Declined,
        })
    }

    /// Commits made on the caller's thread so far.
    pub(crate) fn commits(&self) -> u32 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Runs `read` on an idle connection (or a new one), then keeps the connection for the next.
    fn with<T>(&self, read: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let taken = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let conn = match taken {
            Some(conn) => conn,
            None => open(&self.path).map_err(StoreError::from)?,
        };
        let out = read(&conn).map_err(StoreError::from);
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

/// What [`Direct::try_decide`] did.
#[derive(Debug)]
pub(crate) enum Decided<T> {
    /// The write lock was not free: nothing was run.
    Busy,
    /// The work declined (or found nothing to do): rolled back.
    Declined,
    /// Committed, with the work's answer, and whether the WAL is now due a checkpoint by
    /// another connection.
    Committed(T, bool),
}

/// The transaction [`Direct::try_decide`] lends its work: reads and writes on the writer's
/// connection, with cached statements.
pub(crate) struct Here<'c> {
    conn: &'c Connection,
}

impl std::fmt::Debug for Here<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Here")
    }
}

impl Here<'_> {
    /// The first row `sql` returns, if any, through `map`.
    pub(crate) fn row<T>(
        &self,
        sql: &'static str,
        params: impl Params,
        map: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Option<T>> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let mut rows = stmt.query(params)?;
        Ok(rows.next()?.map(map).transpose()?)
    }

    /// Every row `sql` returns, each through `map`.
    pub(crate) fn rows<T>(
        &self,
        sql: &'static str,
        params: impl Params,
        map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        Ok(self.conn.prepare_cached(sql)?.query_map(params, map)?.collect::<rusqlite::Result<_>>()?)
    }

    /// Runs `stmt` (a write); how many rows it changed.
    pub(crate) fn run(&self, stmt: &Stmt) -> Result<usize> {
        let (sql, args) = stmt.parts();
        Ok(self.conn.prepare_cached(sql)?.execute(params_from_iter(args))?)
    }
}

impl ToSql for Arg {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Self::Int(i) => ValueRef::Integer(*i),
            Self::Text(s) => ValueRef::Text(s.as_bytes()),
            Self::Blob(b) => ValueRef::Blob(b),
            Self::Null => ValueRef::Null,
        }))
    }
}

impl FromSql for Protocol {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let s = value.as_str()?;
        Protocol::parse(s).ok_or_else(|| FromSqlError::Other(format!("unknown protocol `{s}`").into()))
    }
}

impl FromSql for ContactState {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        match value.as_str()? {
            "active" => Ok(ContactState::Active),
            "pending" => Ok(ContactState::Pending),
            s => Err(FromSqlError::Other(format!("unknown contact state `{s}`").into())),
        }
    }
}

/// `$ty { field: row.get("field")?, ... }`: a row type read here by column name, as sqlx's
/// `FromRow` reads it, each field from the column of its own name
/// (`tests::rows_read_here_equal_the_pools` compares the two on every column).
macro_rules! by_column {
    ($row:expr, $ty:ident { $($field:ident),* $(,)? }) => {
        $ty { $($field: $row.get(stringify!($field))?),* }
    };
}
pub(super) use by_column;

impl ContactRow {
    pub(crate) fn from_direct(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(by_column!(
            r,
            ContactRow {
                id,
                name,
                protocol,
                peer_id,
                address,
                sig_pub,
                box_pub,
                drop_code,
                relay_url,
                state,
                allow_kinds,
                verified,
                changed_box_pub,
                key_changed_at,
                roster,
                request_body,
                created_at,
                blocked,
                blocked_at,
                blocked_dropped,
                person_id
            }
        ))
    }
}

impl MessageRow {
    pub(crate) fn from_direct(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(by_column!(
            r,
            MessageRow {
                rowid_,
                id,
                direction,
                protocol,
                contact_id,
                peer,
                kind,
                body,
                reply_to,
                from_agent,
                to_agent,
                ts,
                state,
                detail,
                path,
                fallback_of,
                shown,
                created_at
            }
        ))
    }
}

impl PersonRow {
    pub(crate) fn from_direct(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(by_column!(r, PersonRow { id, name, identity_key, safety_number, link, created_at }))
    }
}

impl OutboxRow {
    pub(crate) fn from_direct(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(by_column!(
            r,
            OutboxRow {
                id,
                message_id,
                protocol,
                kind,
                relay_url,
                target,
                drop_code,
                payload,
                attempts,
                next_attempt_at,
                last_error,
                created_at
            }
        ))
    }
}

/// A writer's connection to the database at `path`: `synchronous=FULL` when `durable`, else
/// `NORMAL` (replayable transactions only), foreign keys on as on sqlx's, no busy wait (a busy
/// lock is the caller's cue to go through sqlx) and no automatic checkpoint. WAL and the rest
/// are read back.
fn open_writer(path: &Path, durable: bool) -> rusqlite::Result<Connection> {
    let conn = connect(path, Duration::ZERO)?;
    let level = if durable { 2 } else { 1 };
    conn.pragma_update(None, "synchronous", level)?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    let journal: String = conn.pragma_query_value(None, "journal_mode", |r| r.get(0))?;
    let synchronous: i64 = conn.pragma_query_value(None, "synchronous", |r| r.get(0))?;
    let foreign_keys: bool = conn.pragma_query_value(None, "foreign_keys", |r| r.get(0))?;
    if !journal.eq_ignore_ascii_case("wal") || synchronous != level || !foreign_keys {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISUSE),
            Some(format!(
                "the caller's-thread writer is not configured as it must be: journal_mode={journal}, \
                 synchronous={synchronous}, foreign_keys={foreign_keys}"
            )),
        ));
    }
    Ok(conn)
}

/// A read-only connection to the database at `path`. The file exists and is migrated (sqlx's
/// pool opened it first), in WAL mode.
fn open(path: &Path) -> rusqlite::Result<Connection> {
    // A reader waits only in rare moments (another connection recovering the WAL index); never
    // long on the async thread it runs on.
    let conn = connect(path, Duration::from_secs(1))?;
    // Index ranges need few pages; SQLite's default cache (2 MB a connection) would let each
    // reader grow the daemon's memory for little gain.
    conn.pragma_update(None, "cache_size", READER_CACHE_KIB.saturating_neg())?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

/// A connection of this module's to the database at `path` (it exists: sqlx's pool opened and
/// migrated it), waiting up to `busy` for a lock, keeping [`STATEMENTS`] prepared statements.
fn connect(path: &Path, busy: Duration) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.busy_timeout(busy)?;
    conn.set_prepared_statement_cache_capacity(STATEMENTS);
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

    /// The rows read here are the rows sqlx's `FromRow` reads, column for column: every optional
    /// column set and unset, every text column holding its own value.
    #[tokio::test]
    async fn rows_read_here_equal_the_pools() {
        use crate::store::{NewContact, NewMessage, insert_contact, insert_message, insert_person};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        let mut conn = store.pool.acquire().await.unwrap();
        let person = insert_person(&mut conn, "carol", &[7; 32], "1234 5678", "link", 11).await.unwrap();
        for (name, drop, protocol) in
            [("bare", None, Protocol::Stringcup), ("full", Some(&[9u8; 16][..]), Protocol::AgentMail)]
        {
            let c = NewContact {
                name,
                protocol,
                peer_id: &format!("{name}-peer"),
                address: &format!("{name}-address"),
                sig_pub: &[1; 32],
                box_pub: &[2; 32],
                drop_code: drop,
                relay_url: drop.map(|_| "https://relay.example"),
                state: if drop.is_some() { ContactState::Active } else { ContactState::Pending },
                allow_kinds: "send,reply",
                request_body: "hello",
                now: 12,
            };
            let id = insert_contact(&mut conn, &c).await.unwrap();
            if drop.is_some() {
                sqlx::query(
                    "UPDATE contacts SET verified = 1, changed_box_pub = x'0303', key_changed_at = 13, roster = 'r', \
                     blocked = 1, blocked_at = 14, blocked_dropped = 15, person_id = ? WHERE id = ?",
                )
                .bind(person)
                .bind(id)
                .execute(&mut *conn)
                .await
                .unwrap();
            }
            let m = NewMessage {
                id: &format!("{name}-message"),
                direction: "in",
                protocol,
                contact_id: drop.map(|_| id),
                peer: "peer",
                kind: "send",
                body: "body",
                reply_to: drop.map(|_| "r"),
                from_agent: drop.map(|_| "f"),
                to_agent: drop.map(|_| "t"),
                ts: 16,
                state: "received",
                hidden: false,
                now: 17,
            };
            insert_message(&mut conn, &m).await.unwrap();
        }
        sqlx::query(
            "UPDATE messages SET detail = 'd', path = 'relay', fallback_of = 'o', shown = 1 WHERE id = 'full-message'",
        )
        .execute(&mut *conn)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO outbox (message_id, protocol, kind, relay_url, target, drop_code, payload, attempts, \
             next_attempt_at, last_error, created_at) VALUES ('m', 'letagents', 'send', 'u', 't', x'01', x'02', 3, 4, 'e', 5)",
        )
        .execute(&mut *conn)
        .await
        .unwrap();
        let same = |pool: String, here: String| assert_eq!(pool, here);
        for id in 1..=2 {
            let pool: ContactRow =
                sqlx::query_as("SELECT * FROM contacts WHERE id = ?").bind(id).fetch_one(&mut *conn).await.unwrap();
            same(format!("{pool:?}"), format!("{:?}", store.contact_by_id(id).unwrap().unwrap()));
        }
        let pool: Vec<MessageRow> = sqlx::query_as("SELECT * FROM messages WHERE direction = 'in' ORDER BY rowid_")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        assert_eq!(pool.len(), 2);
        same(format!("{pool:?}"), format!("{:?}", store.inbox(true, 10).unwrap()));
        let pool: Vec<OutboxRow> = sqlx::query_as("SELECT * FROM outbox").fetch_all(&mut *conn).await.unwrap();
        same(format!("{pool:?}"), format!("{:?}", store.due_outbox(4, 10).unwrap()));
        let pool: PersonRow = sqlx::query_as("SELECT * FROM people").fetch_one(&mut *conn).await.unwrap();
        same(format!("{pool:?}"), format!("{:?}", store.person_by_name("carol").unwrap().unwrap()));
        // The names messages show: a person's channel by the person's name, another by its own.
        let names = store.display_names(&[1, 2, 99]).unwrap();
        assert_eq!(names.into_iter().collect::<Vec<_>>(), [(1, "bare".to_owned()), (2, "carol".to_owned())]);
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
