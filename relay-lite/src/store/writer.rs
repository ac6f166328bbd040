//! The single writer task: group commit.
//!
//! - wait for one queued write, then take every write already queued (up to a batch limit);
//! - apply them in order inside one transaction, each seeing the ones before it;
//! - commit (one fsync for the whole batch under `synchronous=FULL`), then answer every caller
//!   and wake websocket watchers; if anything fails the batch is rolled back and every caller
//!   in it gets the error, so no caller is ever told "stored" for a write that is not on disk;
//! - after a failed batch the connection is discarded and the next batch opens a fresh one, so
//!   a failure can never leave the writer inside a transaction that later "commits" only
//!   release savepoints (see [`apply_batch`]).
use std::sync::Arc;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use super::StoreError;
use super::agent_mail::AmOp;
use super::letagents::{self, DepositOutcome, LoginOutcome, SweepReport};
use super::letmeknow::LmkOp;
use super::stringcup::ScOp;
use crate::hub::Hub;

/// Where a write's result goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// Most writes in one transaction.
const MAX_BATCH: usize = 1024;
/// Most envelope bytes in one transaction, so one batch cannot hold the writer for long.
const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;

/// A queued write, its result once applied, and where to send it after the commit.
pub(crate) enum Op {
    Deposit {
        req: letagents::Deposit,
        out: Option<DepositOutcome>,
        reply: Reply<DepositOutcome>,
    },
    Login {
        req: letagents::Login,
        out: Option<LoginOutcome>,
        reply: Reply<LoginOutcome>,
    },
    Ack {
        req: letagents::Ack,
        out: Option<Vec<i64>>,
        reply: Reply<Vec<i64>>,
    },
    Sweep {
        req: letagents::Sweep,
        out: Option<SweepReport>,
        reply: Reply<SweepReport>,
    },
    /// A Stringcup v2 write (its own enum, so each protocol's SQL stays in its file).
    Stringcup(ScOp),
    /// An Agent Mail 1.0 write (its own enum, so its SQL stays in its file).
    AgentMail(Box<AmOp>),
    /// A letmeknow group log or invite write.
    Letmeknow(LmkOp),
    /// Commit what came before, then stop.
    Close(oneshot::Sender<()>),
}

/// A caller's result: the applied outcome if the batch committed, else the batch's error.
pub(crate) fn settle<T>(committed: &Result<(), StoreError>, out: Option<T>) -> Result<T, StoreError> {
    match committed {
        Ok(()) => out.ok_or(StoreError::Closed),
        Err(e) => Err(e.clone()),
    }
}

impl Op {
    fn bytes(&self) -> usize {
        match self {
            Self::Deposit { req, .. } => req.body.len(),
            Self::Stringcup(op) => op.bytes(),
            Self::AgentMail(op) => op.bytes(),
            Self::Letmeknow(op) => op.bytes(),
            _ => 0,
        }
    }

    async fn apply(&mut self, conn: &mut SqliteConnection, hub: &Hub) -> Result<(), sqlx::Error> {
        match self {
            Self::Deposit { req, out, .. } => *out = Some(letagents::deposit(conn, req).await?),
            Self::Login { req, out, .. } => *out = Some(letagents::login(conn, req).await?),
            Self::Ack { req, out, .. } => *out = Some(letagents::ack(conn, req).await?),
            Self::Sweep { req, out, .. } => *out = Some(letagents::sweep(conn, req, hub).await?),
            Self::Stringcup(op) => op.apply(conn).await?,
            Self::AgentMail(op) => op.apply(conn).await?,
            Self::Letmeknow(op) => op.apply(conn).await?,
            Self::Close(_) => {}
        }
        Ok(())
    }

    /// Answers the caller: the applied result if the batch committed, else the batch's error.
    fn finish(self, committed: &Result<(), StoreError>, hub: &Hub) {
        // A caller that went away (client disconnected) no longer needs the answer.
        match self {
            Self::Deposit { req, out, reply } => {
                let result = settle(committed, out);
                if let Ok(DepositOutcome::Stored { seq }) = &result {
                    hub.publish(&req.mailbox, *seq);
                }
                let _ = reply.send(result);
            }
            Self::Login { out, reply, .. } => {
                let _ = reply.send(settle(committed, out));
            }
            Self::Ack { out, reply, .. } => {
                let _ = reply.send(settle(committed, out));
            }
            Self::Sweep { out, reply, .. } => {
                let _ = reply.send(settle(committed, out));
            }
            Self::Stringcup(op) => op.finish(committed, hub),
            Self::AgentMail(op) => (*op).finish(committed),
            Self::Letmeknow(op) => op.finish(committed, hub),
            Self::Close(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Applies `batch` in one transaction and commits it.
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
/// is in autocommit mode, and its `COMMIT` ends the outermost transaction.
async fn apply_batch(conn: &mut SqliteConnection, batch: &mut [Op], hub: &Hub) -> Result<(), StoreError> {
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    for op in batch.iter_mut() {
        op.apply(conn, hub).await?;
    }
    sqlx::query("COMMIT").execute(&mut *conn).await?;
    Ok(())
}

/// Applies and commits `batch` on the writer connection, opening one first if the last failure
/// discarded it. After any failure the connection is rolled back and dropped (closing it ends
/// whatever transaction SQLite may still hold), so the next batch starts on a clean one.
async fn commit_batch(
    slot: &mut Option<SqliteConnection>,
    options: &SqliteConnectOptions,
    batch: &mut [Op],
    hub: &Hub,
) -> Result<(), StoreError> {
    let conn = match slot {
        Some(conn) => conn,
        None => slot.insert(options.connect().await?),
    };
    let committed = apply_batch(conn, batch, hub).await;
    if committed.is_err()
        && let Some(mut conn) = slot.take()
    {
        // SQLite may already have rolled back by itself; then this ROLLBACK fails, harmlessly.
        let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
        if let Err(e) = conn.close().await {
            tracing::warn!(error = %e, "closing the failed writer connection");
        }
    }
    committed
}

/// Runs until a [`Op::Close`] arrives or every sender is gone; `options` open a replacement
/// connection after a failed batch.
pub(crate) async fn run(
    conn: SqliteConnection,
    options: SqliteConnectOptions,
    mut queue: mpsc::Receiver<Op>,
    hub: Arc<Hub>,
) {
    let mut conn = Some(conn);
    let mut batch: Vec<Op> = Vec::with_capacity(MAX_BATCH);
    let mut closing = false;
    while !closing {
        let Some(first) = queue.recv().await else {
            break;
        };
        let mut bytes = first.bytes();
        closing = matches!(first, Op::Close(_));
        batch.push(first);
        while !closing && batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
            let Ok(op) = queue.try_recv() else { break };
            bytes += op.bytes();
            closing = matches!(op, Op::Close(_));
            batch.push(op);
        }
        let committed = commit_batch(&mut conn, &options, &mut batch, &hub).await;
        match &committed {
            Ok(()) => tracing::trace!(writes = batch.len(), bytes, "write batch committed"),
            Err(e) => tracing::error!(error = %e, writes = batch.len(), "write batch rolled back"),
        }
        for op in batch.drain(..) {
            op.finish(&committed, &hub);
        }
    }
    // Writes still queued behind a Close are dropped; their callers see `Closed`.
    queue.close();
    if let Some(conn) = conn
        && let Err(e) = conn.close().await
    {
        tracing::warn!(error = %e, "closing the writer connection");
    }
}
