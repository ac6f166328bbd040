//! The single writer task: group commit, for any backend.
//!
//! - wait for one queued write, then take every write already queued (up to a batch limit),
//!   without lingering for more: while a batch commits the next one queues, so under load batches
//!   fill by themselves, and a linger (tried: up to 200 µs after a large batch, yielding) only
//!   spun the writer's core, which the request tasks need on a small machine (BENCHMARKS.md);
//! - apply them in order inside one transaction, each seeing the ones before it;
//! - commit (one fsync for the whole batch; on PostgreSQL also one `NOTIFY` naming every key the
//!   batch woke, sent inside the transaction so it is delivered only if the batch commits), then
//!   wake local watchers and answer every caller; if anything fails the batch is rolled back and
//!   every caller in it gets the error, so no caller is ever told "stored" for a write that is
//!   not on disk;
//! - after a failed batch the connection is discarded and the next batch opens a fresh one, so
//!   a failure can never leave the writer inside a transaction that later "commits" only
//!   release savepoints (see `SqliteBackend` in [`super`]);
//! - a batch a backend reports as retryable (PostgreSQL's deadlock or serialization failure,
//!   when instances lock the same rows in another order) is applied again from the start.
//!
//! The writer knows nothing of any protocol: each protocol's store file defines its writes as
//! types implementing [`WriteOp`] for the connection type of the backend it runs on.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::StoreError;
use super::sync::SyncDb;
use crate::hub::{Committed, Hub};

/// Where a write's result goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// Most writes in one transaction.
const MAX_BATCH: usize = 1024;
/// Most envelope bytes in one transaction, so one batch cannot hold the writer for long.
const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Times a retryable batch is applied before its callers get the error.
const MAX_ATTEMPTS: usize = 5;

/// What the writer hands an op while it applies: the hub (for reads such as "is this mailbox
/// watched") and the wake-ups to publish once the batch commits.
pub(crate) struct BatchCx<'h> {
    /// The local wake-up hub.
    pub(crate) hub: &'h Hub,
    wakeups: Vec<(String, i64)>,
    /// The committed body for each wake-up, where the write has one (same index).
    bodies: Vec<Option<Committed>>,
}

impl BatchCx<'_> {
    /// Announces, once the batch commits, that `seq` is the newest value of hub key `key`,
    /// handing the hub the committed `body` (if any) so live sessions send it without reading
    /// it back.
    pub(crate) fn wake_with(&mut self, key: String, seq: i64, body: Option<Committed>) {
        self.wakeups.push((key, seq));
        self.bodies.push(body);
    }
}

/// One queued write for connections of type `C`.
pub(crate) trait WriteOp<C>: Send {
    /// Payload bytes, for the batch byte limit.
    fn bytes(&self) -> usize {
        0
    }

    /// The keys whose rows the write locks to decide ([`Request::locks`]).
    fn locks(&self, _keys: &mut Vec<String>) {}

    /// Runs the write inside the batch transaction and keeps its outcome (applying again, after
    /// a retried batch, replaces it).
    fn apply<'a>(&'a mut self, conn: &'a mut C, cx: &'a mut BatchCx<'_>) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// Runs the write like [`WriteOp::apply`], synchronously on the SQLite writer's connection
    /// (how the SQLite backend applies every write, see [`super::sync`]).
    fn apply_sync(&mut self, _db: &SyncDb, _cx: &mut BatchCx<'_>) -> Result<(), sqlx::Error> {
        Err(sqlx::Error::Protocol("this write has no synchronous path".into()))
    }

    /// Answers the caller: the applied outcome if the batch committed, else the batch's error.
    fn finish(self: Box<Self>, committed: &Result<(), StoreError>, hub: &Hub);
}

/// A boxed write.
pub(crate) type BoxOp<C> = Box<dyn WriteOp<C>>;

/// What the writer's queue carries.
pub(crate) enum Msg<C> {
    /// A write.
    Op(BoxOp<C>),
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

/// A queued write's request, its result once applied, and where to send it.
pub(crate) struct Pending<R, T> {
    pub(crate) req: R,
    pub(crate) out: Option<T>,
    pub(crate) reply: Reply<T>,
}

impl<R, T> Pending<R, T> {
    /// A write of `req` answered on `reply`.
    pub(crate) fn new(req: R, reply: Reply<T>) -> Self {
        Self { req, out: None, reply }
    }

    /// Answers the caller (one that went away no longer needs the answer).
    pub(crate) fn answer(self, committed: &Result<(), StoreError>) {
        let _ = self.reply.send(settle(committed, self.out));
    }
}

/// A write request that knows how to apply itself on connections of type `C`: the request types
/// of each protocol family implement it once per backend that serves the family.
pub(crate) trait Request<C>: Send + Sync + 'static {
    /// What the caller gets once the batch commits.
    type Out: Send + 'static;

    /// Payload bytes, for the batch byte limit.
    fn bytes(&self) -> usize {
        0
    }

    /// Runs the request inside the batch transaction.
    fn run<'a>(&'a self, conn: &'a mut C, hub: &'a Hub) -> BoxFuture<'a, Result<Self::Out, sqlx::Error>>;

    /// Runs the request inside the batch transaction, synchronously on the SQLite writer's
    /// connection (every SQLite request has this path: [`sync_request`]).
    fn run_sync(&self, _db: &SyncDb, _hub: &Hub) -> Result<Self::Out, sqlx::Error> {
        Err(sqlx::Error::Protocol("this write has no synchronous path".into()))
    }

    /// The hub key and value to announce when `out` commits, if any.
    fn wakeup(&self, _out: &Self::Out) -> Option<(String, i64)> {
        None
    }

    /// The body `out` committed under its wake-up's seq, if the hub should hand it to live
    /// sessions.
    fn wakeup_body(&self, _out: &Self::Out) -> Option<Committed> {
        None
    }

    /// Further hub keys and values to announce when `out` commits, for a request that wakes
    /// several (a batch send to several inboxes), each with its committed body if the hub
    /// should hand it to watchers.
    fn more_wakeups(&self, _out: &Self::Out) -> Vec<(String, i64, Option<Committed>)> {
        Vec::new()
    }

    /// Brings what the hub caches of the database up to date once the batch settled: `out` is
    /// the applied outcome if the batch committed, `None` if it failed (a failed commit may still
    /// have reached the disk, so a cache forgets rather than keeps what the write touched).
    /// Runs before the caller is answered.
    fn settled(&self, _out: Option<&Self::Out>, _hub: &Hub) {}

    /// The keys whose rows this request locks to decide (a mailbox, an inbox, a group): a backend
    /// shared by several instances locks every key of a batch up front, in one global order, so
    /// two instances' batches never deadlock on them (see [`Backend::lock`]).
    fn locks(&self, _keys: &mut Vec<String>) {}
}

/// Implements [`Request`] on connection type `$conn` for request type `$req` answering `$out`,
/// run by `async fn $run(&mut $conn, &$req) -> Result<$out, sqlx::Error>`; further trait items
/// (wake-ups, bytes) go in the optional block.
macro_rules! request {
    ($conn:ty, $req:ty => $out:ty, $run:path $(, { $($more:tt)* })?) => {
        impl $crate::store::writer::Request<$conn> for $req {
            type Out = $out;

            fn run<'a>(
                &'a self,
                conn: &'a mut $conn,
                _: &'a $crate::hub::Hub,
            ) -> futures_util::future::BoxFuture<'a, Result<$out, sqlx::Error>> {
                Box::pin($run(conn, self))
            }

            $($($more)*)?
        }
    };
}
pub(crate) use request;

/// Implements [`Request`] on the SQLite writer's connection for request type `$req` answering
/// `$out`, run synchronously by `fn $run(&SyncDb, &$req, &Hub) -> Result<$out, E>`, `E` a
/// rusqlite or an sqlx error ([`super::sync::SyncResult`]); further trait items go in the
/// optional block.
macro_rules! sync_request {
    ($req:ty => $out:ty, $run:path $(, { $($more:tt)* })?) => {
        impl $crate::store::writer::Request<$crate::store::sync::WriterConn> for $req {
            type Out = $out;

            fn run<'a>(
                &'a self,
                conn: &'a mut $crate::store::sync::WriterConn,
                hub: &'a $crate::hub::Hub,
            ) -> futures_util::future::BoxFuture<'a, Result<$out, sqlx::Error>> {
                Box::pin(std::future::ready($crate::store::sync::SyncResult::into_sqlx($run(conn.db(), self, hub))))
            }

            fn run_sync(
                &self,
                db: &$crate::store::sync::SyncDb,
                hub: &$crate::hub::Hub,
            ) -> Result<$out, sqlx::Error> {
                $crate::store::sync::SyncResult::into_sqlx($run(db, self, hub))
            }

            $($($more)*)?
        }
    };
}
pub(crate) use sync_request;

impl<R, T> Pending<R, T> {
    /// Keeps the applied outcome and queues its wake-ups.
    fn applied<C>(&mut self, out: T, cx: &mut BatchCx<'_>)
    where
        R: Request<C, Out = T>,
    {
        if let Some((key, seq)) = self.req.wakeup(&out) {
            cx.wake_with(key, seq, self.req.wakeup_body(&out));
        }
        for (key, seq, body) in self.req.more_wakeups(&out) {
            cx.wake_with(key, seq, body);
        }
        self.out = Some(out);
    }
}

impl<C: Send, R: Request<C>> WriteOp<C> for Pending<R, R::Out> {
    fn bytes(&self) -> usize {
        self.req.bytes()
    }

    fn locks(&self, keys: &mut Vec<String>) {
        self.req.locks(keys);
    }

    fn apply<'a>(&'a mut self, conn: &'a mut C, cx: &'a mut BatchCx<'_>) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let out = self.req.run(conn, cx.hub).await?;
            self.applied(out, cx);
            Ok(())
        })
    }

    fn apply_sync(&mut self, db: &SyncDb, cx: &mut BatchCx<'_>) -> Result<(), sqlx::Error> {
        let out = self.req.run_sync(db, cx.hub)?;
        self.applied(out, cx);
        Ok(())
    }

    fn finish(self: Box<Self>, committed: &Result<(), StoreError>, hub: &Hub) {
        self.req.settled(committed.as_ref().ok().and(self.out.as_ref()), hub);
        self.answer(committed);
    }
}

/// The handle to a running writer task: queue writes, close it.
pub(crate) struct Writer<C> {
    writes: mpsc::Sender<Msg<C>>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl<C: Send + 'static> Writer<C> {
    /// Starts the writer task on `conn`; `backend` reopens the connection after a failed batch.
    pub(crate) fn start<B: Backend<Conn = C>>(backend: B, conn: C, hub: Arc<Hub>) -> Self {
        let (writes, queue) = mpsc::channel(QUEUE);
        let task = tokio::spawn(run(backend, conn, queue, hub));
        Self { writes, task: std::sync::Mutex::new(Some(task)) }
    }

    /// Starts the writer on a thread of its own (a current-thread runtime), for a backend whose
    /// writes block (SQLite: every statement and the commit's fsync run on the writer's thread,
    /// [`super::sync`]), so they never hold a runtime worker the request tasks need.
    pub(crate) fn start_on_thread<B: Backend<Conn = C>>(backend: B, conn: C, hub: Arc<Hub>) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
        let (writes, queue) = mpsc::channel(QUEUE);
        let (done, finished) = oneshot::channel::<()>();
        std::thread::Builder::new().name("relay-writer".into()).spawn(move || {
            runtime.block_on(run(backend, conn, queue, hub));
            let _ = done.send(());
        })?;
        let task = tokio::spawn(async move {
            let _ = finished.await;
        });
        Ok(Self { writes, task: std::sync::Mutex::new(Some(task)) })
    }

    /// Queues the op `make` builds and waits for its answer (after the commit).
    pub(crate) async fn write<T>(&self, make: impl FnOnce(Reply<T>) -> BoxOp<C>) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.writes.send(Msg::Op(make(reply))).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Queues `req` and waits for its outcome (after the commit).
    pub(crate) async fn submit<R: Request<C>>(&self, req: R) -> Result<R::Out, StoreError>
    where
        C: Send,
    {
        self.write(|reply| Box::new(Pending::new(req, reply))).await
    }

    /// Commits what is queued and stops the task; later writes fail with [`StoreError::Closed`].
    pub(crate) async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.writes.send(Msg::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
        let task = self.task.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// Writes that may queue for the writer before callers wait (backpressure).
const QUEUE: usize = 4096;

/// How a backend opens, begins, commits and abandons the writer's connection.
pub(crate) trait Backend: Send + Sync + 'static {
    /// The writer's connection.
    type Conn: Send + 'static;

    /// Opens a connection for the writer.
    fn connect(&self) -> BoxFuture<'_, Result<Self::Conn, sqlx::Error>>;

    /// Starts the batch's transaction (a backend may defer it to the batch's first statement).
    fn begin<'a>(&'a self, conn: &'a mut Self::Conn) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// Commits it; `wakeups` are the keys the batch woke (a backend shared by several instances
    /// announces them inside the transaction).
    fn commit<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        wakeups: &'a [(String, i64)],
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// Rolls back and closes a connection whose batch failed.
    fn discard(&self, conn: Self::Conn) -> BoxFuture<'_, ()>;

    /// Closes the connection when the writer stops.
    fn close(&self, conn: Self::Conn) -> BoxFuture<'_, ()>;

    /// Applies the batch's writes in order, each seeing the ones before it, then commits
    /// ([`Backend::commit`], with the wake-ups the writes queued).
    fn apply_and_commit<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        batch: &'a mut [BoxOp<Self::Conn>],
        cx: &'a mut BatchCx<'_>,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            for op in batch.iter_mut() {
                op.apply(conn, cx).await?;
            }
            self.commit(conn, &cx.wakeups).await
        })
    }

    /// Whether a batch that failed with `e` may simply be applied again.
    fn retryable(&self, _e: &sqlx::Error) -> bool {
        false
    }

    /// Whether batches should lock their writes' keys up front ([`Backend::lock`]): only a
    /// backend that other writers share needs it.
    fn locks_keys(&self) -> bool {
        false
    }

    /// Locks `keys` (every key the batch's writes declared) inside the batch's transaction, in an
    /// order every instance uses, before any write runs.
    fn lock<'a>(&'a self, _conn: &'a mut Self::Conn, _keys: &'a [String]) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async { Ok(()) })
    }
}

/// The wake-ups a committed batch publishes, with the committed bodies where known.
type Wakeups = (Vec<(String, i64)>, Vec<Option<Committed>>);

/// Applies `batch` in the transaction begun on `conn` and commits it; returns the wake-ups to
/// publish.
async fn apply_batch<B: Backend>(
    backend: &B,
    conn: &mut B::Conn,
    batch: &mut [BoxOp<B::Conn>],
    hub: &Hub,
) -> Result<Wakeups, sqlx::Error> {
    if backend.locks_keys() {
        let mut keys = Vec::new();
        for op in batch.iter() {
            op.locks(&mut keys);
        }
        if !keys.is_empty() {
            backend.lock(conn, &keys).await?;
        }
    }
    let mut cx = BatchCx { hub, wakeups: Vec::new(), bodies: Vec::new() };
    backend.apply_and_commit(conn, batch, &mut cx).await?;
    Ok((cx.wakeups, cx.bodies))
}

/// Applies and commits `batch` on the writer connection, opening one first if the last failure
/// discarded it. After any failure the connection is rolled back and dropped, so the next
/// attempt starts on a clean one.
async fn commit_batch<B: Backend>(
    backend: &B,
    slot: &mut Option<B::Conn>,
    batch: &mut [BoxOp<B::Conn>],
    hub: &Hub,
) -> Result<Wakeups, StoreError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let conn = begin(backend, slot).await?;
        let committed = apply_batch(backend, conn, batch, hub).await;
        let Err(e) = committed else { return committed.map_err(StoreError::from) };
        if let Some(conn) = slot.take() {
            backend.discard(conn).await;
        }
        if attempt >= MAX_ATTEMPTS || !backend.retryable(&e) {
            return Err(e.into());
        }
        tracing::debug!(error = %e, attempt, "write batch conflicted with another instance; applying it again");
    }
}

/// Begins a transaction on the writer connection, opening one if there is none. A connection
/// that cannot even begin (a database server restarted since the last batch) is replaced once:
/// nothing of the batch was applied yet, so trying again on a fresh one is safe.
async fn begin<'s, B: Backend>(backend: &B, slot: &'s mut Option<B::Conn>) -> Result<&'s mut B::Conn, sqlx::Error> {
    let conn = match slot.take() {
        Some(mut conn) => match backend.begin(&mut conn).await {
            Ok(()) => conn,
            Err(e) => {
                tracing::info!(error = %e, "the writer connection failed; opening a new one");
                backend.discard(conn).await;
                fresh(backend).await?
            }
        },
        None => fresh(backend).await?,
    };
    Ok(slot.insert(conn))
}

/// A new writer connection with a transaction begun.
async fn fresh<B: Backend>(backend: &B) -> Result<B::Conn, sqlx::Error> {
    let mut conn = backend.connect().await?;
    backend.begin(&mut conn).await?;
    Ok(conn)
}

/// Runs until a [`Msg::Close`] arrives or every sender is gone.
pub(crate) async fn run<B: Backend>(backend: B, conn: B::Conn, mut queue: mpsc::Receiver<Msg<B::Conn>>, hub: Arc<Hub>) {
    let mut conn = Some(conn);
    let mut batch: Vec<BoxOp<B::Conn>> = Vec::with_capacity(MAX_BATCH);
    let mut closed: Option<oneshot::Sender<()>> = None;
    while closed.is_none() {
        let Some(first) = queue.recv().await else {
            break;
        };
        let mut bytes = 0;
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Op(op) => {
                    bytes += op.bytes();
                    batch.push(op);
                }
                Msg::Close(done) => {
                    closed = Some(done);
                    break;
                }
            }
            if batch.len() >= MAX_BATCH || bytes >= MAX_BATCH_BYTES {
                break;
            }
            next = queue.try_recv().ok();
        }
        if batch.is_empty() {
            continue;
        }
        let committed = commit_batch(&backend, &mut conn, &mut batch, &hub).await;
        let committed = match committed {
            Ok((wakeups, bodies)) => {
                tracing::trace!(writes = batch.len(), bytes, "write batch committed");
                hub.publish_batch(wakeups.into_iter().zip(bodies).map(|((key, seq), body)| (key, seq, body)));
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, writes = batch.len(), "write batch rolled back");
                Err(e)
            }
        };
        for op in batch.drain(..) {
            op.finish(&committed, &hub);
        }
    }
    // Writes still queued behind a Close are dropped; their callers see `Closed`.
    queue.close();
    if let Some(conn) = conn {
        backend.close(conn).await;
    }
    if let Some(done) = closed {
        let _ = done.send(());
    }
}
