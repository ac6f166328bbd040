//! The PostgreSQL backend: several relay-lite instances on one database.
//!
//! - Each instance runs its own group-committing writer (one transaction per batch, as on
//!   SQLite). Rows that hold a counter or a compare-and-set target (a mailbox's `next_seq`, a
//!   group's epoch) are locked `FOR UPDATE` inside the batch, so instances committing to the same
//!   key take turns. Before its first write a batch takes a transaction-scoped advisory lock on
//!   every key its writes name (`Request::locks`), in ascending hash order: batches of different
//!   instances that share keys queue one behind the other instead of deadlocking (a deadlock costs
//!   PostgreSQL's `deadlock_timeout`, 1 s, before it is broken). A batch that still deadlocks or
//!   fails serialization (writes that name no key, sweeps) is applied again.
//! - A batch that woke anybody sends one `NOTIFY relay_lite` inside its transaction (delivered
//!   only if it commits): a JSON list of `[key, value]` pairs, or `*` when that would not fit in
//!   PostgreSQL's 8,000-byte payload. Every instance `LISTEN`s (`listen`) and publishes what it
//!   hears to its own hub, so a long-poll or websocket parked on one instance wakes when another
//!   commits. When the listener's connection is lost, every parked waiter re-reads once it is
//!   back (notifications sent meanwhile are gone).
//! - Sweeps take a transaction-scoped advisory lock first: one instance at a time sweeps a family,
//!   the others skip that round.
//! - Schema: `migrations-pg/` (sqlx's migrator serialises concurrent starts with its own lock).
//!
//! Families served: every one — letagents ([`letagents`]), letmeknow ([`letmeknow`]),
//! Stringcup v2 ([`stringcup`]) and Agent Mail 1.0 ([`agent_mail`]).

pub mod agent_mail;
pub mod letagents;
pub mod letmeknow;
pub mod stringcup;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions as _, Connection as _, PgConnection};
use tokio::task::JoinHandle;

use super::StoreError;
use super::writer::{Backend, Request, Writer};
use crate::hub::Hub;

/// The channel every instance listens on.
pub const CHANNEL: &str = "relay_lite";
/// PostgreSQL refuses payloads of 8,000 bytes or more.
const MAX_PAYLOAD: usize = 7999;
/// The payload that tells every instance to wake every waiter.
const EVERYONE: &str = "*";

/// The PostgreSQL backend: a writer connection, a reader pool and a listener.
pub struct PgStore {
    writer: Writer<PgConnection>,
    pub(crate) read: PgPool,
    listener: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to `url`, runs the migrations, starts the writer and the listener.
    pub async fn open(url: &str, hub: Arc<Hub>) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.parse()?;
        let mut conn = options.connect().await?;
        sqlx::migrate!("./migrations-pg").run(&mut conn).await.map_err(|e| StoreError::Migrate(Arc::new(e)))?;
        let read = PgPoolOptions::new().max_connections(8).min_connections(1).connect_with(options.clone()).await?;
        // Listen before serving: a waiter that parks from now on cannot miss another's commit.
        let mut listener = PgListener::connect_with(&read).await?;
        listener.listen(CHANNEL).await?;
        let listener = tokio::spawn(listen(listener, read.clone(), hub.clone()));
        let writer = Writer::start(PgBackend { options }, conn, hub);
        Ok(Self { writer, read, listener: Mutex::new(Some(listener)) })
    }

    /// Queues `req`; returns its outcome after the commit.
    pub(crate) async fn submit<R: Request<PgConnection>>(&self, req: R) -> Result<R::Out, StoreError> {
        self.writer.submit(req).await
    }

    /// Commits what is queued, stops the writer and the listener, closes the pool.
    pub(crate) async fn close(&self) {
        self.writer.close().await;
        let listener = self.listener.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(listener) = listener {
            listener.abort();
            let _ = listener.await;
        }
        self.read.close().await;
    }
}

/// The payload announcing `wakeups`: the newest value per key, or `*` when too long.
pub(crate) fn payload(wakeups: &[(String, i64)]) -> String {
    let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
    for (key, value) in wakeups {
        let v = newest.entry(key).or_insert(*value);
        *v = (*v).max(*value);
    }
    let pairs: Vec<(&str, i64)> = newest.into_iter().collect();
    match serde_json::to_string(&pairs) {
        Ok(text) if text.len() <= MAX_PAYLOAD => text,
        _ => EVERYONE.to_owned(),
    }
}

/// Publishes what a notification announces to the local hub.
pub(crate) fn deliver(hub: &Hub, payload: &str) {
    if payload == EVERYONE {
        hub.poke_all();
        return;
    }
    match serde_json::from_str::<Vec<(String, i64)>>(payload) {
        Ok(pairs) => {
            for (key, value) in pairs {
                hub.publish(&key, value);
            }
        }
        Err(e) => {
            // Not ours (somebody else's NOTIFY on our channel): wake everyone rather than guess.
            tracing::warn!(error = %e, "unreadable notification; waking every waiter");
            hub.poke_all();
        }
    }
}

/// Hears every instance's commits and publishes them to `hub`, until the pool closes.
async fn listen(listener: PgListener, pool: PgPool, hub: Arc<Hub>) {
    let mut listener = Some(listener);
    loop {
        let current = match listener.as_mut() {
            Some(l) => l,
            None => match PgListener::connect_with(&pool).await {
                Ok(mut l) => match l.listen(CHANNEL).await {
                    Ok(()) => {
                        tracing::info!("database listener reconnected; every waiter re-reads");
                        hub.poke_all();
                        listener.insert(l)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "listening again failed");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    }
                },
                Err(sqlx::Error::PoolClosed) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "database listener cannot reconnect yet");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            },
        };
        match current.try_recv().await {
            Ok(Some(notification)) => deliver(&hub, notification.payload()),
            Ok(None) => {
                // sqlx reconnected and listens again; what was sent meanwhile is lost.
                tracing::info!("database listener reconnected; every waiter re-reads");
                hub.poke_all();
            }
            Err(sqlx::Error::PoolClosed) => return,
            Err(e) => {
                tracing::warn!(error = %e, "database listener lost its connection");
                listener = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The writer's transactions on PostgreSQL.
struct PgBackend {
    options: PgConnectOptions,
}

impl Backend for PgBackend {
    type Conn = PgConnection;

    fn connect(&self) -> BoxFuture<'_, Result<PgConnection, sqlx::Error>> {
        Box::pin(self.options.connect())
    }

    fn begin<'a>(&'a self, conn: &'a mut PgConnection) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move { sqlx::query("BEGIN").execute(conn).await.map(drop) })
    }

    fn commit<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        wakeups: &'a [(String, i64)],
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            if !wakeups.is_empty() {
                // Inside the transaction: delivered at commit, never for a rolled-back batch.
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(CHANNEL)
                    .bind(payload(wakeups))
                    .execute(&mut *conn)
                    .await?;
            }
            sqlx::query("COMMIT").execute(conn).await.map(drop)
        })
    }

    fn discard(&self, mut conn: PgConnection) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
            if let Err(e) = conn.close().await {
                tracing::debug!(error = %e, "closing the failed writer connection");
            }
        })
    }

    fn close(&self, conn: PgConnection) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(e) = conn.close().await {
                tracing::warn!(error = %e, "closing the writer connection");
            }
        })
    }

    fn retryable(&self, e: &sqlx::Error) -> bool {
        // serialization_failure, deadlock_detected: another instance's batch won a lock race.
        e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "40001" || c == "40P01")
    }

    fn locks_keys(&self) -> bool {
        true
    }

    fn lock<'a>(&'a self, conn: &'a mut PgConnection, keys: &'a [String]) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(lock_keys(conn, keys))
    }
}

/// Takes the batch locks of `keys`: transaction-scoped advisory locks in ascending order of the
/// keys' hashes. Every instance takes them in the same order, so batches that share keys queue
/// instead of deadlocking (PostgreSQL would break each deadlock only after `deadlock_timeout`,
/// 1 s). `unnest` yields the array in order; a hash collision only makes two keys queue.
pub(crate) async fn lock_keys(conn: &mut PgConnection, keys: &[String]) -> Result<(), sqlx::Error> {
    let mut hashes: Vec<i32> = keys.iter().map(|k| key_hash(k)).collect();
    hashes.sort_unstable();
    hashes.dedup();
    sqlx::query("SELECT pg_advisory_xact_lock($1, k) FROM unnest($2::int4[]) AS k")
        .bind(BATCH_LOCK_CLASS)
        .bind(&hashes)
        .execute(conn)
        .await
        .map(drop)
}

/// The first key of the two-key advisory locks a batch takes on its writes' keys (`rw`); a space
/// apart from the one-key sweep locks.
const BATCH_LOCK_CLASS: i32 = 0x7277;

/// A stable 32-bit hash of a lock key (FNV-1a), the same in every instance and release.
fn key_hash(key: &str) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in key.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    i32::from_ne_bytes(h.to_ne_bytes())
}

/// Advisory lock keys: one per family's sweep.
pub(crate) mod sweep_lock {
    /// letagents' sweep.
    pub(crate) const LETAGENTS: i64 = 0x7265_6c61_7900_0001;
    /// letmeknow's sweep.
    pub(crate) const LETMEKNOW: i64 = 0x7265_6c61_7900_0002;
    /// Stringcup's sweep.
    pub(crate) const STRINGCUP: i64 = 0x7265_6c61_7900_0003;
    /// Agent Mail's sweep.
    pub(crate) const AGENT_MAIL: i64 = 0x7265_6c61_7900_0004;
}

/// Takes the transaction-scoped advisory lock `key`; `false` if another instance holds it.
pub(crate) async fn try_sweep_lock(conn: &mut PgConnection, key: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)").bind(key).fetch_one(conn).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_names_each_key_once_with_its_newest_value() {
        let text = payload(&[("m".into(), 3), ("m".into(), 5), ("letmeknow/g/x".into(), 1)]);
        assert_eq!(text, r#"[["letmeknow/g/x",1],["m",5]]"#);
        let hub = Hub::default();
        let mut rx = hub.subscribe("m");
        deliver(&hub, &text);
        assert_eq!(*rx.borrow_and_update(), 5);
    }

    #[test]
    fn a_payload_too_long_for_notify_wakes_everyone() {
        let many: Vec<(String, i64)> = (0..1000).map(|i| (format!("mailbox-{i:020}"), i)).collect();
        assert_eq!(payload(&many), "*");
        let hub = Hub::default();
        let mut rx = hub.subscribe("quiet");
        deliver(&hub, "*");
        assert!(rx.has_changed().unwrap(), "a poke wakes even without a newer value");
        rx.borrow_and_update();
    }
}
