//! What relay-lite's load benches share: knobs from the environment, the keep-alive HTTP client,
//! the bare baseline servers ("axum + one sqlx INSERT per request", "axum + sqlx with the same
//! group commit as relay-lite", which also delivers committed bodies to websockets, and the same
//! group commit on PostgreSQL), the
//! closed-loop POST load generator, and the statistics (percentiles, medians, per-round ratios).
//! Each bench keeps only what is its protocol's own: the bodies it seals and the relay set-up.

// Each bench uses its own subset.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{Message as WsMessage, WebSocketUpgrade};
use axum::extract::{Path as UrlPath, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions as _, Connection as _, SqliteConnection};
use switchboard_core::util::{b64u, now_ms};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};

/// `$name` parsed, or `default` when unset; a value that does not parse stops the run.
pub fn env_or<T: FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

/// The command that reproduces this run: the bench's `$PREFIX*` variables, then `cargo bench`.
pub fn command(prefix: &str, bench: &str) -> String {
    let mut vars: Vec<String> =
        std::env::vars().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| format!("{k}={v} ")).collect();
    vars.sort();
    format!("{}cargo bench -p relay-lite --bench {bench}", vars.concat())
}

/// One keep-alive HTTP/1.1 connection per client, no Nagle.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder().http1_only().tcp_nodelay(true).timeout(Duration::from_secs(30)).build().unwrap()
}

/// A bare axum server on a loopback port (TCP_NODELAY, like relay-lite's acceptor).
pub async fn serve(router: Router) -> (SocketAddr, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (addr, task)
}

/// The throughput baseline: `POST route` (with one `{id}` segment) does one sqlx `INSERT` of
/// the body per request on a pool of `pool_size` (WAL, `synchronous=FULL`) and answers `202 {}`.
pub async fn start_insert_baseline(
    dir: &Path,
    route: &str,
    pool_size: u32,
) -> (SocketAddr, JoinHandle<()>, SqlitePool) {
    let options = SqliteConnectOptions::new()
        .filename(dir.join("baseline.sqlite3"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePoolOptions::new().max_connections(pool_size).connect_with(options).await.unwrap();
    sqlx::query(
        "CREATE TABLE stored (id INTEGER PRIMARY KEY, mailbox TEXT NOT NULL, received_ms INTEGER NOT NULL, \
         body BLOB NOT NULL) STRICT",
    )
    .execute(&pool)
    .await
    .unwrap();
    async fn insert(
        State(pool): State<SqlitePool>,
        UrlPath(id): UrlPath<String>,
        body: Bytes,
    ) -> (StatusCode, &'static str) {
        let done = sqlx::query("INSERT INTO stored (mailbox, received_ms, body) VALUES (?, ?, ?)")
            .bind(id)
            .bind(now_ms())
            .bind(body.as_ref())
            .execute(&pool)
            .await;
        match done {
            Ok(_) => (StatusCode::ACCEPTED, "{}"),
            Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, ""),
        }
    }
    let router = Router::new().route(route, post(insert)).with_state(pool.clone());
    let (addr, task) = serve(router).await;
    (addr, task, pool)
}

/// A write queued for the group-commit baseline's writer.
struct GroupWrite {
    mailbox: String,
    body: Bytes,
    /// With [`Check::Keyed`]: the body's replay key.
    key: Option<Vec<u8>>,
    /// With [`Check::Numbered`]: the sender (its bearer token).
    sender: Option<String>,
    reply: oneshot::Sender<Stored>,
}

/// How the group-commit baseline's writer answered one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stored {
    /// Committed as a new row (its number in its mailbox): `202`.
    New(i64),
    /// Its key was already stored (a replay): nothing written, `200`.
    Known,
    /// A pending limit of [`Check::Numbered`] is reached: nothing written, `507`.
    Full,
    /// The batch failed: `500`.
    Failed,
}

/// What the group-commit baseline does with each body on the request's task before queueing it
/// (as relay-lite checks a packet there), and what its writer keeps with it.
#[derive(Clone, Copy)]
pub enum Check {
    /// Nothing: every body is stored.
    None,
    /// The body must pass, else `400`.
    Pass(fn(&[u8]) -> bool),
    /// The body must pass and yields its key, stored with it under a `UNIQUE` constraint: the
    /// replay tombstone a protocol may require (Agent Mail §7.1's packet IDs). A body whose key is
    /// stored already is answered `200` and not stored again; one that fails, `400`.
    Keyed(fn(&[u8]) -> Option<Vec<u8>>),
    /// Stringcup v2's least durable work per send (B.3.5, B.3.6), in bare code: the body must
    /// pass (else `400`) and the request must carry `Authorization` (the sender, else `401`). The
    /// writer numbers each stored message twice, in its recipient's inbox (the row, under
    /// `UNIQUE (mailbox, seq)`: the inbox's pages and acks address it) and in its sender's sent
    /// log, both from 1 and never reused, so the next numbers are kept durably (one upserted row
    /// per identity a batch touched, all in one statement per batch). It checks the four pending
    /// limits (count and bytes, per recipient and per sender to a recipient) against counts kept
    /// in memory (a relay can rebuild them from the stored rows); the limits are
    /// [`NUMBERED_LIMIT`], as high as relay-lite's are set in the benches.
    Numbered(fn(&[u8]) -> bool),
}

/// The pending limits of [`Check::Numbered`]: relay-lite's Stringcup limits as the benches set them.
pub const NUMBERED_LIMIT: u64 = u64::MAX / 4;

/// The writer's numbering for [`Check::Numbered`]: next numbers and pending counts.
#[derive(Default)]
struct Numbering {
    /// Recipient → its inbox's next number.
    next_inbox: HashMap<String, i64>,
    /// Sender → its next sent number.
    next_sent: HashMap<String, i64>,
    /// Recipient → (pending messages, pending bytes).
    pending: HashMap<String, (u64, u64)>,
    /// (Recipient, sender) → that sender's pending (messages, bytes) in that inbox.
    share: HashMap<(String, String), (u64, u64)>,
}

/// The group-commit baseline's state: the writer's queue and the committed-body fan-out.
#[derive(Clone)]
struct GroupState {
    writes: mpsc::Sender<GroupWrite>,
    committed: broadcast::Sender<(Arc<str>, i64, Bytes)>,
    check: Check,
}

/// The honest baseline: `POST route` (one `{id}` segment) queues the body for one writer task
/// that does what relay-lite's writer does and nothing else: wait for one write, take every write
/// already queued (up to 1024), `BEGIN IMMEDIATE`, one cached `INSERT` each, `COMMIT` (one fsync
/// per batch; WAL, `synchronous=FULL`), then answer every caller `202 {}` and hand each committed
/// body to the websockets at `GET /ws/{id}`, which send it as `{"t":"msg","seq":…,"ct":b64u}`,
/// and to the long-polls parked at `GET /poll/{id}`, which answer `{"messages":[{"id":…,"ct":b64u}],
/// "count":1}` (an empty page after 25 s).
pub async fn start_group_commit_baseline(dir: &Path, route: &str) -> (SocketAddr, JoinHandle<()>, JoinHandle<()>) {
    start_group_commit_baseline_checked(dir, route, Check::None).await
}

/// [`start_group_commit_baseline`], where every body first goes through `check` on the request's
/// task (e.g. the protocol's stateless checks a relay cannot skip, or those and the replay key
/// it must keep).
pub async fn start_group_commit_baseline_checked(
    dir: &Path,
    route: &str,
    check: Check,
) -> (SocketAddr, JoinHandle<()>, JoinHandle<()>) {
    let options = SqliteConnectOptions::new()
        .filename(dir.join("group-baseline.sqlite3"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10));
    let mut conn = options.connect().await.unwrap();
    // Each loop has only the columns and indexes its check needs: an index over NULLs would still
    // cost the other loops an entry per row.
    let schema: &[&'static str] = match check {
        Check::None | Check::Pass(_) => &["CREATE TABLE stored (id INTEGER PRIMARY KEY, mailbox TEXT NOT NULL, \
             received_ms INTEGER NOT NULL, body BLOB NOT NULL) STRICT"],
        Check::Keyed(_) => &["CREATE TABLE stored (id INTEGER PRIMARY KEY, mailbox TEXT NOT NULL, \
             received_ms INTEGER NOT NULL, body BLOB NOT NULL, key BLOB NOT NULL UNIQUE) STRICT"],
        Check::Numbered(_) => &[
            "CREATE TABLE stored (id INTEGER PRIMARY KEY, mailbox TEXT NOT NULL, received_ms INTEGER NOT NULL, \
             body BLOB NOT NULL, seq INTEGER NOT NULL, sender TEXT NOT NULL, sent_seq INTEGER NOT NULL, \
             UNIQUE (mailbox, seq)) STRICT",
            "CREATE TABLE counters (identity TEXT PRIMARY KEY, next_inbox INTEGER NOT NULL, \
             next_sent INTEGER NOT NULL) STRICT, WITHOUT ROWID",
        ],
    };
    for statement in schema {
        sqlx::query(*statement).execute(&mut conn).await.unwrap();
    }
    let numbered = matches!(check, Check::Numbered(_));
    let (writes, mut queue) = mpsc::channel::<GroupWrite>(4096);
    let (committed, _) = broadcast::channel(4096);
    let fanout = committed.clone();
    let writer = tokio::spawn(async move {
        let mut batch: Vec<GroupWrite> = Vec::with_capacity(1024);
        let mut outcomes: Vec<Stored> = Vec::with_capacity(1024);
        let mut numbering = Numbering::default();
        while let Some(first) = queue.recv().await {
            batch.push(first);
            while batch.len() < 1024 {
                let Ok(next) = queue.try_recv() else { break };
                batch.push(next);
            }
            if numbered {
                commit_numbered(&mut conn, &batch, &mut numbering, &mut outcomes).await;
            } else {
                commit_group(&mut conn, &batch, &mut outcomes).await;
            }
            for (write, stored) in batch.drain(..).zip(outcomes.drain(..)) {
                if let Stored::New(id) = stored
                    && fanout.receiver_count() > 0
                {
                    let _ = fanout.send((Arc::from(write.mailbox.as_str()), id, write.body));
                }
                let _ = write.reply.send(stored);
            }
        }
    });
    async fn deposit(
        State(state): State<GroupState>,
        UrlPath(id): UrlPath<String>,
        headers: HeaderMap,
        body: Bytes,
    ) -> (StatusCode, &'static str) {
        let (key, sender) = match state.check {
            Check::None => (None, None),
            Check::Pass(check) if check(&body) => (None, None),
            Check::Keyed(check) => match check(&body) {
                Some(key) => (Some(key), None),
                None => return (StatusCode::BAD_REQUEST, ""),
            },
            Check::Numbered(check) => {
                let Some(sender) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
                    return (StatusCode::UNAUTHORIZED, "");
                };
                if !check(&body) {
                    return (StatusCode::BAD_REQUEST, "");
                }
                (None, Some(sender.to_owned()))
            }
            Check::Pass(_) => return (StatusCode::BAD_REQUEST, ""),
        };
        let (reply, answer) = oneshot::channel();
        if state.writes.send(GroupWrite { mailbox: id, body, key, sender, reply }).await.is_err() {
            return (StatusCode::INTERNAL_SERVER_ERROR, "");
        }
        match answer.await {
            Ok(Stored::New(_)) => (StatusCode::ACCEPTED, "{}"),
            Ok(Stored::Known) => (StatusCode::OK, "{}"),
            Ok(Stored::Full) => (StatusCode::INSUFFICIENT_STORAGE, ""),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, ""),
        }
    }
    async fn watch(State(state): State<GroupState>, UrlPath(id): UrlPath<String>, ws: WebSocketUpgrade) -> Response {
        let mut committed = state.committed.subscribe();
        ws.on_upgrade(move |mut socket| async move {
            while let Ok((mailbox, seq, body)) = committed.recv().await {
                if *mailbox != *id {
                    continue;
                }
                let frame = serde_json::json!({"t": "msg", "seq": seq, "ct": b64u(&body)}).to_string();
                if socket.send(WsMessage::Text(frame.into())).await.is_err() {
                    return;
                }
            }
        })
    }
    async fn poll(State(state): State<GroupState>, UrlPath(id): UrlPath<String>) -> Response {
        let mut committed = state.committed.subscribe();
        let wait = tokio::time::sleep(Duration::from_secs(25));
        tokio::pin!(wait);
        let mut messages = Vec::new();
        loop {
            tokio::select! {
                next = committed.recv() => match next {
                    Ok((mailbox, seq, body)) if *mailbox == *id => {
                        messages.push(serde_json::json!({"id": seq, "ct": b64u(&body)}));
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                },
                () = &mut wait => break,
            }
        }
        let page = serde_json::json!({"count": messages.len(), "messages": messages}).to_string();
        (StatusCode::OK, [(CONTENT_TYPE, "application/json")], page).into_response()
    }
    let router = Router::new()
        .route(route, post(deposit))
        .route("/ws/{id}", get(watch))
        .route("/poll/{id}", get(poll))
        .with_state(GroupState { writes, committed, check });
    let (addr, task) = serve(router).await;
    (addr, task, writer)
}

/// One group commit of the baseline: every write of `batch` in one transaction; `outcomes` gets
/// one answer per write (its rowid if new). Every write fails if anything failed; the
/// transaction is then rolled back.
async fn commit_group(conn: &mut SqliteConnection, batch: &[GroupWrite], outcomes: &mut Vec<Stored>) {
    let applied = async {
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
        let now = now_ms();
        for write in batch {
            let id: Option<i64> = match &write.key {
                None => {
                    sqlx::query_scalar("INSERT INTO stored (mailbox, received_ms, body) VALUES (?, ?, ?) RETURNING id")
                        .bind(&write.mailbox)
                        .bind(now)
                        .bind(write.body.as_ref())
                        .fetch_optional(&mut *conn)
                        .await?
                }
                Some(key) => {
                    sqlx::query_scalar(
                        "INSERT INTO stored (mailbox, received_ms, body, key) VALUES (?, ?, ?, ?) \
                         ON CONFLICT (key) DO NOTHING RETURNING id",
                    )
                    .bind(&write.mailbox)
                    .bind(now)
                    .bind(write.body.as_ref())
                    .bind(key.as_slice())
                    .fetch_optional(&mut *conn)
                    .await?
                }
            };
            outcomes.push(id.map_or(Stored::Known, Stored::New));
        }
        sqlx::query("COMMIT").execute(&mut *conn).await?;
        Ok::<(), sqlx::Error>(())
    }
    .await;
    if applied.is_err() {
        outcomes.clear();
        outcomes.resize(batch.len(), Stored::Failed);
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
    }
}

/// [`commit_group`] for [`Check::Numbered`]: each write within the limits is stored under its
/// recipient's and its sender's next numbers; then each identity the batch numbered has its next
/// numbers upserted once. A failed batch leaves `numbering` as it was.
async fn commit_numbered(
    conn: &mut SqliteConnection,
    batch: &[GroupWrite],
    numbering: &mut Numbering,
    outcomes: &mut Vec<Stored>,
) {
    let applied = async {
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
        let now = now_ms();
        let mut touched: Vec<&str> = Vec::new();
        for write in batch {
            let sender = write.sender.as_deref().unwrap_or_default();
            let bytes = write.body.len() as u64;
            let share_key = (write.mailbox.clone(), sender.to_owned());
            let pending = numbering.pending.get(&write.mailbox).copied().unwrap_or_default();
            let share = numbering.share.get(&share_key).copied().unwrap_or_default();
            let room = |(n, b): (u64, u64)| n < NUMBERED_LIMIT && b.saturating_add(bytes) <= NUMBERED_LIMIT;
            if !room(pending) || !room(share) {
                outcomes.push(Stored::Full);
                continue;
            }
            let seq = numbering.next_inbox.get(&write.mailbox).copied().unwrap_or(1);
            let sent = numbering.next_sent.get(sender).copied().unwrap_or(1);
            sqlx::query(
                "INSERT INTO stored (mailbox, received_ms, body, seq, sender, sent_seq) VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(&write.mailbox)
            .bind(now)
            .bind(write.body.as_ref())
            .bind(seq)
            .bind(sender)
            .bind(sent)
            .execute(&mut *conn)
            .await?;
            // Only a stored write takes its numbers and counts (given back below if the batch
            // then fails).
            numbering.pending.insert(write.mailbox.clone(), (pending.0 + 1, pending.1 + bytes));
            numbering.share.insert(share_key, (share.0 + 1, share.1 + bytes));
            numbering.next_inbox.insert(write.mailbox.clone(), seq + 1);
            numbering.next_sent.insert(sender.to_owned(), sent + 1);
            outcomes.push(Stored::New(seq));
            for identity in [write.mailbox.as_str(), sender] {
                if !touched.contains(&identity) {
                    touched.push(identity);
                }
            }
        }
        // One statement for every identity the batch numbered: [identity, next inbox, next sent].
        let counters: Vec<(&str, i64, i64)> = touched
            .into_iter()
            .map(|identity| {
                let next = |numbers: &HashMap<String, i64>| numbers.get(identity).copied().unwrap_or(1);
                (identity, next(&numbering.next_inbox), next(&numbering.next_sent))
            })
            .collect();
        sqlx::query(
            "INSERT INTO counters (identity, next_inbox, next_sent) \
             SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(?) WHERE true \
             ON CONFLICT (identity) DO UPDATE SET next_inbox = excluded.next_inbox, next_sent = excluded.next_sent",
        )
        .bind(serde_json::to_string(&counters).unwrap_or_default())
        .execute(&mut *conn)
        .await?;
        sqlx::query("COMMIT").execute(&mut *conn).await?;
        Ok::<(), sqlx::Error>(())
    }
    .await;
    if applied.is_err() {
        // Every write stored so far took exactly one of each number and one pending message.
        for (write, stored) in batch.iter().zip(outcomes.iter()) {
            if !matches!(stored, Stored::New(_)) {
                continue;
            }
            let sender = write.sender.as_deref().unwrap_or_default();
            let bytes = write.body.len() as u64;
            for counts in [
                numbering.pending.get_mut(&write.mailbox),
                numbering.share.get_mut(&(write.mailbox.clone(), sender.to_owned())),
            ]
            .into_iter()
            .flatten()
            {
                *counts = (counts.0 - 1, counts.1 - bytes);
            }
            for next in [numbering.next_inbox.get_mut(&write.mailbox), numbering.next_sent.get_mut(sender)]
                .into_iter()
                .flatten()
            {
                *next -= 1;
            }
        }
        outcomes.clear();
        outcomes.resize(batch.len(), Stored::Failed);
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
    }
}

/// The PostgreSQL group-commit baseline's writes: mailbox, body, where to answer.
type PgGroupWrite = (String, Bytes, oneshot::Sender<bool>);

/// Creates the PostgreSQL baseline's table in the database at `url` (once per database, before
/// any baseline server starts on it).
pub async fn create_pg_baseline_table(url: &str) {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(
        "CREATE TABLE stored (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, mailbox TEXT NOT NULL, \
         received_ms BIGINT NOT NULL, body BYTEA NOT NULL)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
}

/// The PostgreSQL baseline: what relay-lite's writer does on PostgreSQL and nothing else.
/// `POST route` (one `{id}` segment) queues the body for one writer task that waits for one write,
/// takes every write already queued (up to 1024), `BEGIN`, one cached `INSERT … RETURNING id`
/// each, one `pg_notify` naming each mailbox with its newest id (as relay-lite's batch announces
/// its wake-ups to the other instances), `COMMIT`, then answers every caller `202 {}`. Several of
/// these on one database are the baseline of several relay-lite instances.
pub async fn start_pg_group_commit_baseline(url: &str, route: &str) -> (SocketAddr, JoinHandle<()>, JoinHandle<()>) {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let (writes, mut queue) = mpsc::channel::<PgGroupWrite>(4096);
    let writer = tokio::spawn(async move {
        let mut batch: Vec<PgGroupWrite> = Vec::with_capacity(1024);
        while let Some(first) = queue.recv().await {
            batch.push(first);
            while batch.len() < 1024 {
                let Ok(next) = queue.try_recv() else { break };
                batch.push(next);
            }
            let ok = commit_pg_group(&mut conn, &batch).await;
            for (_, _, reply) in batch.drain(..) {
                let _ = reply.send(ok);
            }
        }
    });
    async fn deposit(
        State(writes): State<mpsc::Sender<PgGroupWrite>>,
        UrlPath(id): UrlPath<String>,
        body: Bytes,
    ) -> (StatusCode, &'static str) {
        let (reply, answer) = oneshot::channel();
        if writes.send((id, body, reply)).await.is_err() {
            return (StatusCode::INTERNAL_SERVER_ERROR, "");
        }
        match answer.await {
            Ok(true) => (StatusCode::ACCEPTED, "{}"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, ""),
        }
    }
    let router = Router::new().route(route, post(deposit)).with_state(writes);
    let (addr, task) = serve(router).await;
    (addr, task, writer)
}

/// One group commit of the PostgreSQL baseline; false (every caller fails) if anything failed.
async fn commit_pg_group(conn: &mut sqlx::PgConnection, batch: &[PgGroupWrite]) -> bool {
    let applied = async {
        sqlx::query("BEGIN").execute(&mut *conn).await?;
        let now = now_ms();
        let mut newest: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
        for (mailbox, body, _) in batch {
            let id: i64 =
                sqlx::query_scalar("INSERT INTO stored (mailbox, received_ms, body) VALUES ($1, $2, $3) RETURNING id")
                    .bind(mailbox)
                    .bind(now)
                    .bind(body.as_ref())
                    .fetch_one(&mut *conn)
                    .await?;
            newest.insert(mailbox, id);
        }
        let payload = serde_json::to_string(&newest.into_iter().collect::<Vec<_>>()).unwrap_or_default();
        sqlx::query("SELECT pg_notify('baseline', $1)").bind(payload).execute(&mut *conn).await?;
        sqlx::query("COMMIT").execute(&mut *conn).await?;
        Ok::<(), sqlx::Error>(())
    }
    .await;
    if applied.is_err() {
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
    }
    applied.is_ok()
}

/// What one load client posts: to `path` (under the server's base URL), with `headers`, the
/// bodies in order from `first`, cycling or each once.
#[derive(Clone)]
pub struct ClientWork {
    /// Path under the base URL.
    pub path: String,
    /// Extra headers (name, value).
    pub headers: Vec<(&'static str, String)>,
    /// The bodies.
    pub bodies: Vec<Bytes>,
    /// Where in `bodies` this client starts.
    pub first: usize,
    /// Whether the bodies repeat; otherwise a client that runs out stops and is counted.
    pub cycle: bool,
    /// The status of a stored post (`202` for letagents, Agent Mail and the baselines, `201` for a
    /// Stringcup send); anything else counts as failed.
    pub stored: StatusCode,
}

/// Posts `total` of `work`'s bodies once, spread over its clients (and so the mailboxes they post
/// to), each at `base` + its client's path, and returns when every one is stored:
/// they are left waiting. Nothing for `total` 0.
pub async fn leave_waiting(base: &str, work: &[Arc<ClientWork>], total: usize) {
    if total == 0 {
        return;
    }
    let per_client = total.div_ceil(work.len());
    let once: Vec<Arc<ClientWork>> = work
        .iter()
        .map(|w| {
            let bodies = (0..per_client).map(|i| w.bodies[(w.first + i) % w.bodies.len()].clone()).collect();
            Arc::new(ClientWork { bodies, first: 0, cycle: false, ..ClientWork::clone(w) })
        })
        .collect();
    let filled = post_load(base, &once, Duration::ZERO, Duration::from_secs(600)).await;
    assert_eq!(filled.failed, 0, "prefill sends failed");
    assert_eq!(filled.exhausted, work.len(), "the prefill did not finish");
}

/// Accepted posts per second over the measured window, the failures, and how many clients ran
/// out of bodies before the window ended.
#[derive(Debug, Clone)]
pub struct Load {
    /// `202`s per second inside the window.
    pub per_sec: f64,
    /// Non-`202` answers and transport errors.
    pub failed: u64,
    /// Clients that ran out of bodies.
    pub exhausted: usize,
    /// `202`s completed in each whole second of the window, in order.
    pub per_second: Vec<u64>,
}

/// One keep-alive connection per `work` item posting back to back for `warmup + measure`;
/// only stored posts (`ClientWork::stored`) whose answer completes inside the measured window
/// count.
pub async fn post_load(base: &str, work: &[Arc<ClientWork>], warmup: Duration, measure: Duration) -> Load {
    let start = Instant::now() + warmup;
    let end = start + measure;
    let mut tasks = JoinSet::new();
    for w in work {
        let w = w.clone();
        let url = format!("{base}{}", w.path);
        tasks.spawn(async move {
            let http = http_client();
            let (mut accepted, mut failed) = (0_u64, 0_u64);
            let mut seconds = vec![0_u64; measure.as_secs() as usize];
            let mut next = w.first;
            while Instant::now() < end {
                let body = if w.cycle {
                    w.bodies[next % w.bodies.len()].clone()
                } else {
                    let Some(b) = w.bodies.get(next).cloned() else { return (accepted, failed, true, seconds) };
                    b
                };
                next += 1;
                let mut req = http.post(&url).body(body);
                for (name, value) in &w.headers {
                    req = req.header(*name, value);
                }
                let ok = match req.send().await {
                    Ok(r) => r.status() == w.stored && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                let done = Instant::now();
                if !ok {
                    failed += 1;
                } else if done >= start && done < end {
                    accepted += 1;
                    if let Some(n) = seconds.get_mut((done - start).as_secs() as usize) {
                        *n += 1;
                    }
                }
            }
            (accepted, failed, false, seconds)
        });
    }
    let (mut accepted, mut failed, mut exhausted) = (0, 0, 0);
    let mut per_second = vec![0_u64; measure.as_secs() as usize];
    while let Some(joined) = tasks.join_next().await {
        let (a, f, e, seconds) = joined.unwrap();
        accepted += a;
        failed += f;
        exhausted += usize::from(e);
        for (total, n) in per_second.iter_mut().zip(seconds) {
            *total += n;
        }
    }
    assert!(accepted > 0, "nothing was accepted");
    Load { per_sec: accepted as f64 / measure.as_secs_f64(), failed, exhausted, per_second }
}

/// Nearest-rank percentile in milliseconds.
pub fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

/// The median (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) { (v[mid - 1] + v[mid]) / 2.0 } else { v[mid] }
}

/// Rounds of paired measurements: relay and baseline values, one pair per round.
#[derive(Debug, Default)]
pub struct Pairs {
    /// relay-lite's value per round.
    pub relay: Vec<f64>,
    /// The baseline's value per round.
    pub baseline: Vec<f64>,
}

impl Pairs {
    /// Records one round.
    pub fn push(&mut self, relay: f64, baseline: f64) {
        self.relay.push(relay);
        self.baseline.push(baseline);
    }

    /// Median of the per-round ratios (relay / baseline).
    pub fn ratio(&self) -> f64 {
        let ratios: Vec<f64> = self.relay.iter().zip(&self.baseline).map(|(r, b)| r / b).collect();
        median(&ratios)
    }
}
