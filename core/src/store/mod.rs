//! The profile's SQLite store: contacts, messages, replay protection, the durable outbox, the
//! audit log and local agents. One file, WAL, synchronous=FULL, numbered migrations.
//!
//! Functions that must commit together take a `&mut SqliteConnection`, so the engine can run
//! them inside one transaction.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{SqliteConnection, SqlitePool};

mod agent_mail;
mod agents;
mod asnet;
mod batch;
mod contacts;
pub mod deliveries;
mod direct;
pub mod groups;
mod lan;
mod people;
mod protocol;
pub use agent_mail::{
    AmMessageRow, AttachmentMeta, NewAttachment, NewOwnCard, OwnCardRow, PinRow, am_insert_message, am_insert_own_card,
    am_pin, am_replace_queued_packet, am_sent_to, am_set_pin, attachment_bytes, insert_attachment, message_rowid,
    meta_in,
};
pub use agents::{Handout, HeldGroupSend, HeldSend, ReviewItem};
pub use asnet::{AsnetAccountRow, AsnetChallengeRow};
pub use batch::{Arg, BatchTx, Stmt};
pub use contacts::{
    ContactUpdate, contact_by_peer, count_blocked_drop, insert_contact, name_taken, pending_requests, release_held,
    rules_for, set_blocked, update_contact,
};
pub(crate) use direct::Here;
pub use groups::{GroupLogRow, covers as group_context_covers, name_group_if_unnamed};
pub use lan::{
    DeliveryPath, RelayVouch, TrustedRelayRow, set_message_path, set_message_path_stmt, trust_relay, trusted_relay,
};
pub use people::{
    PersonRow, clear_contact_person, delete_person, insert_person, person_by_key, person_name_taken, record_fallback,
    rename_contact, rename_person, set_contact_person,
};
pub use protocol::{ContactState, Protocol};

/// Store failures: local (disk, corruption) or bugs.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The disk holding the profile is full (`SQLITE_FULL`; local, not the peer's or the
    /// relay's): the transaction was rolled back, so nothing of it was saved, acknowledged or
    /// queued. The same request succeeds once space is freed.
    #[error("the profile's disk is full, so nothing was saved; free some space and try again ({0})")]
    DiskFull(Box<dyn std::error::Error + Send + Sync>),
    /// SQLite said no.
    #[error("database: {0}")]
    Sql(sqlx::Error),
    /// SQLite said no on the caller's thread (`store::direct`).
    #[error("database: {0}")]
    Direct(rusqlite::Error),
    /// A migration failed.
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, StoreError>;

/// SQLite's primary result code for a full disk (the low byte of an extended code).
const SQLITE_FULL: i64 = 13;

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        let primary = e
            .as_database_error()
            .and_then(|d| d.code())
            .and_then(|code| code.parse::<i64>().ok())
            .map(|extended| extended & 0xff);
        if primary == Some(SQLITE_FULL) { Self::DiskFull(Box::new(e)) } else { Self::Sql(e) }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
            Self::DiskFull(Box::new(e))
        } else {
            Self::Direct(e)
        }
    }
}

/// Keeps a pooled connection only if it is back in autocommit mode.
///
/// When `COMMIT` fails on a full disk, SQLite rolls the transaction back by itself; the
/// `ROLLBACK` sqlx then sends fails ("no transaction is active"), and sqlx, which counts
/// transaction depth itself and only decrements it when `COMMIT` or `ROLLBACK` succeeds, still
/// believes the connection is inside a transaction. Returned to the pool like that, its next
/// `begin()` would issue `SAVEPOINT` and its `commit()` `RELEASE`; after one more failed commit
/// SQLite leaves autocommit off for good and every later "commit" on the connection only
/// releases a savepoint: reported saved, never written. Such a connection is closed instead, and
/// the pool opens a fresh one.
fn keep_after_release(
    conn: &mut SqliteConnection,
    _: sqlx::pool::PoolConnectionMetadata,
) -> futures_util::future::BoxFuture<'_, std::result::Result<bool, sqlx::Error>> {
    use sqlx::Connection as _;
    Box::pin(async move {
        if !conn.is_in_transaction() {
            return Ok(true);
        }
        // A dropped transaction queues its ROLLBACK; a ping runs it first.
        conn.ping().await?;
        if conn.is_in_transaction() {
            return Ok(false);
        }
        // Rolled back as sqlx believes; a plain BEGIN, which fails inside a transaction, checks
        // that SQLite agrees.
        if sqlx::query("BEGIN").execute(&mut *conn).await.is_err() {
            return Ok(false);
        }
        sqlx::query("ROLLBACK").execute(&mut *conn).await?;
        Ok(true)
    })
}

/// The store handle.
#[derive(Debug, Clone)]
pub struct Store {
    /// The connection pool.
    pub pool: SqlitePool,
    /// Connections for the hot reads, run on the caller's thread (`store::direct`).
    direct: std::sync::Arc<direct::Direct>,
}

/// A contact row.
#[derive(Debug, Clone, sqlx::FromRow, Serialize)]
pub struct ContactRow {
    /// Row id.
    pub id: i64,
    /// Local name.
    pub name: String,
    /// Protocol.
    pub protocol: Protocol,
    /// Protocol-level id (letagents: mailbox id).
    pub peer_id: String,
    /// Full address.
    pub address: String,
    /// Ed25519 key.
    #[serde(skip)]
    pub sig_pub: Vec<u8>,
    /// X25519 key.
    #[serde(skip)]
    pub box_pub: Vec<u8>,
    /// Drop code.
    #[serde(skip)]
    pub drop_code: Option<Vec<u8>>,
    /// Relay override.
    pub relay_url: Option<String>,
    /// Accepted, or a request.
    pub state: ContactState,
    /// Comma-separated kinds.
    pub allow_kinds: String,
    /// Whether the user compared safety numbers.
    pub verified: bool,
    /// A different box key seen for this id.
    #[serde(skip)]
    pub changed_box_pub: Option<Vec<u8>>,
    /// When it was seen.
    pub key_changed_at: Option<i64>,
    /// Their last roster.
    pub roster: String,
    /// The hello's name.
    pub request_body: String,
    /// When added.
    pub created_at: i64,
    /// Whether the owner blocked this peer (migration 0009): what it sends is dropped.
    pub blocked: bool,
    /// When it was blocked (0: never).
    pub blocked_at: i64,
    /// How many of its messages were dropped while it was blocked.
    pub blocked_dropped: i64,
    /// The person this row is a channel of (migration 0013), if added by a contact link.
    pub person_id: Option<i64>,
}

/// A message row.
#[derive(Debug, Clone, sqlx::FromRow, Serialize)]
pub struct MessageRow {
    /// Local sequence.
    #[serde(skip)]
    pub rowid_: i64,
    /// Message id.
    pub id: String,
    /// in | out.
    pub direction: String,
    /// Protocol.
    pub protocol: Protocol,
    /// Contact row id.
    #[serde(skip)]
    pub contact_id: Option<i64>,
    /// Peer's protocol id.
    pub peer: String,
    /// Kind.
    pub kind: String,
    /// Body (text, or JSON for structured kinds).
    pub body: String,
    /// Answers this id.
    pub reply_to: Option<String>,
    /// Sending agent.
    pub from_agent: Option<String>,
    /// Target agent.
    pub to_agent: Option<String>,
    /// Sender's timestamp (ms).
    pub ts: i64,
    /// Delivery state.
    pub state: String,
    /// Detail (receipt text, error).
    pub detail: String,
    /// The path that carried it: direct, relay, or '' (not handed over yet, or older rows).
    pub path: String,
    /// For a message another channel carried after its own failed: the id it was first queued
    /// under (migration 0013); '' otherwise.
    pub fallback_of: String,
    /// Whether `inbox` showed it.
    #[serde(skip)]
    pub shown: bool,
    /// Local time stored.
    pub created_at: i64,
}

/// An outbox row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    /// Row id.
    pub id: i64,
    /// Message id.
    pub message_id: String,
    /// Protocol.
    pub protocol: Protocol,
    /// Kind of the message.
    pub kind: String,
    /// Relay base URL.
    pub relay_url: String,
    /// Recipient mailbox.
    pub target: String,
    /// Drop code.
    pub drop_code: Vec<u8>,
    /// Exact bytes to post (retries reuse them).
    pub payload: Vec<u8>,
    /// Attempts so far.
    pub attempts: i64,
    /// Not before (ms).
    pub next_attempt_at: i64,
    /// Last error.
    pub last_error: String,
    /// Enqueued at (ms).
    pub created_at: i64,
}

/// An audit row.
#[derive(Debug, Clone, sqlx::FromRow, Serialize)]
pub struct AuditRow {
    /// Row id.
    pub id: i64,
    /// When (ms).
    pub at: i64,
    /// in | out.
    pub direction: String,
    /// Protocol.
    pub protocol: String,
    /// Peer id.
    pub peer: String,
    /// Message id.
    pub message_id: String,
    /// Kind.
    pub kind: String,
    /// queued, relayed, delivered, refused, received, dropped, failed...
    pub state: String,
    /// Detail.
    pub detail: String,
    /// The path that carried the message (direct, relay), or '' when the row is not a transfer.
    pub path: String,
}

/// A local agent.
#[derive(Debug, Clone, sqlx::FromRow, Serialize)]
pub struct AgentRow {
    /// Name.
    pub name: String,
    /// Harness.
    pub harness: String,
    /// Status.
    pub status: String,
    /// Where.
    #[sqlx(rename = "where_")]
    #[serde(rename = "where")]
    pub where_: String,
    /// Last change (ms).
    pub updated_at: i64,
}

/// A new contact.
#[derive(Debug, Clone)]
pub struct NewContact<'a> {
    /// Local name.
    pub name: &'a str,
    /// Protocol.
    pub protocol: Protocol,
    /// Peer id.
    pub peer_id: &'a str,
    /// Address.
    pub address: &'a str,
    /// Ed25519 key.
    pub sig_pub: &'a [u8],
    /// X25519 key.
    pub box_pub: &'a [u8],
    /// Drop.
    pub drop_code: Option<&'a [u8]>,
    /// Relay override.
    pub relay_url: Option<&'a str>,
    /// Accepted, or a request.
    pub state: ContactState,
    /// Allowed kinds.
    pub allow_kinds: &'a str,
    /// Hello name.
    pub request_body: &'a str,
    /// Now.
    pub now: i64,
}

/// A message to record.
#[derive(Debug, Clone)]
pub struct NewMessage<'a> {
    /// Id.
    pub id: &'a str,
    /// in | out.
    pub direction: &'a str,
    /// Protocol.
    pub protocol: Protocol,
    /// Contact.
    pub contact_id: Option<i64>,
    /// Peer id.
    pub peer: &'a str,
    /// Kind.
    pub kind: &'a str,
    /// Body.
    pub body: &'a str,
    /// Reply to.
    pub reply_to: Option<&'a str>,
    /// From agent.
    pub from_agent: Option<&'a str>,
    /// To agent.
    pub to_agent: Option<&'a str>,
    /// Sender ts.
    pub ts: i64,
    /// State.
    pub state: &'a str,
    /// Whether it should never show in `inbox` (receipts, lists).
    pub hidden: bool,
    /// Now.
    pub now: i64,
}

/// An audit entry.
#[derive(Debug, Clone, Copy)]
pub struct Audit<'a> {
    /// in | out.
    pub direction: &'a str,
    /// Protocol.
    pub protocol: &'a str,
    /// Peer id.
    pub peer: &'a str,
    /// Message id.
    pub message_id: &'a str,
    /// Kind.
    pub kind: &'a str,
    /// State.
    pub state: &'a str,
    /// Detail.
    pub detail: &'a str,
}

/// [`Store::message`]: through `messages_by_id` (0021).
const MESSAGE_BY_ID: &str = "SELECT * FROM messages WHERE direction = ? AND id = ? LIMIT 1";

/// [`set_outgoing_state`] (every receipt): through `messages_by_id` (0021), named: SQLite would
/// otherwise walk every outgoing entry of the unique index, which holds all four columns.
const OUTGOING_STATE: &str = "UPDATE messages INDEXED BY messages_by_id SET state = ?, detail = ? \
     WHERE direction = 'out' AND id = ? AND peer = ?";

/// [`Store::conversation_page`]: the contact's newest rows, in `messages_by_contact` (0021).
const CONVERSATION_PAGE: &str = "SELECT * FROM (SELECT * FROM messages WHERE contact_id = ?1 \
     AND kind NOT IN ('receipt', 'roster') ORDER BY rowid_ DESC LIMIT ?2) ORDER BY rowid_";

impl Store {
    /// Opens (creating if needed) the database at `path` and runs migrations.
    pub async fn open(path: &Path) -> Result<Self> {
        let opts = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .after_release(keep_after_release)
            // sqlx pings a pooled connection before handing it out, by default: for SQLite a
            // round trip to the connection's worker thread on every acquire, to check a file that
            // cannot hang up; a released connection is already checked (`keep_after_release`).
            .test_before_acquire(false)
            .connect_with(opts)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
        Ok(Self { pool, direct: std::sync::Arc::new(direct::Direct::new(path)) })
    }

    /// A write transaction: `BEGIN IMMEDIATE`, so it takes the write lock first (waiting up to the
    /// busy timeout behind another writer). A deferred `BEGIN` that reads and then writes fails at
    /// once with `database is locked` when another connection committed in between (WAL cannot
    /// upgrade a stale read snapshot, and SQLite does not wait for that case), which a live
    /// runtime's receive loops and requests would hit.
    pub async fn write_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// A write transaction (`BEGIN IMMEDIATE`) whose commit does not wait for the disk
    /// (`synchronous=NORMAL` for this one commit; the others stay FULL). Only for writes that
    /// may be lost to an OS crash or power cut and then simply happen again: it is atomic and
    /// survives a crash of the process like any other (SQLite's WAL: a commit is in the WAL file
    /// when it returns), and the next FULL commit on any connection syncs it with its own.
    /// Uses: a group log entry processed (the relay keeps the log, so a lost commit reads and
    /// decrypts it again from the same rolled-back MLS state), a lease handed out or acked (lost:
    /// handed out again, as when a lease runs out), a sent row marked posted (lost: the next sync
    /// marks it from the log). Committed on the caller's thread when it can be ([`BatchTx`]).
    pub async fn replayable_tx(&self) -> Result<BatchTx> {
        // `PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE` go with the first trip; if anything
        // fails, the guard closes the connection.
        Ok(BatchTx::new(self.pool.clone(), self.direct.clone(), true))
    }

    /// Reads, decides and writes in one durable transaction on the caller's thread
    /// ([`direct`](self::direct): no trip to sqlx's worker for any statement), when it can: the
    /// write lock is free at this moment and the runtime has several threads (the commit waits
    /// for the disk inside `block_in_place`, so the worker's other tasks move meanwhile).
    /// `work` holds the write lock from its first read to the commit, so what it read cannot
    /// change before what it writes is committed; it must be short (index reads, a few
    /// writes). `Some` is what `work` answered, committed. `None`: nothing was written, because
    /// the lock was taken, the runtime has one thread, or `work` declined (answered `None`): do
    /// it through sqlx, which waits for the lock.
    pub(crate) async fn decide_here<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce(&Here<'_>) -> std::result::Result<Option<T>, E>,
    ) -> std::result::Result<Option<T>, E> {
        let multi = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if !multi {
            return Ok(None);
        }
        match tokio::task::block_in_place(|| self.direct.try_decide(work))? {
            direct::Decided::Committed(t, checkpoint) => {
                if checkpoint {
                    batch::checkpoint(&self.pool).await;
                }
                Ok(Some(t))
            }
            direct::Decided::Busy | direct::Decided::Declined => Ok(None),
        }
    }

    /// How many transactions this store committed on the caller's thread (`store::direct`)
    /// since it was opened: replayable and durable batches, and decisions (`decide_here`); the
    /// rest went through sqlx.
    pub fn direct_commits(&self) -> u32 {
        self.direct.commits()
    }

    /// A write transaction like [`Self::write_tx`] (`BEGIN IMMEDIATE`, its commit waits for the
    /// disk) whose statements are queued and sent together ([`BatchTx`]): for the hot paths
    /// that write several rows and read little.
    pub async fn batch_tx(&self) -> Result<BatchTx> {
        Ok(BatchTx::new(self.pool.clone(), self.direct.clone(), false))
    }

    /// Reads a meta value.
    pub async fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT value FROM meta WHERE key = ?").bind(key).fetch_optional(&self.pool).await?)
    }

    /// The delivery policy's meta values in one read: (`policy_review`, `policy_loop_limit`,
    /// `policy_digest_secs`, `dnd`), each if set. On the caller's thread (`store::direct`).
    pub fn policy_meta(&self) -> Result<[Option<String>; 4]> {
        let rows: Vec<(String, String)> = self.direct.rows(
            "SELECT key, value FROM meta WHERE key IN ('policy_review', 'policy_loop_limit', 'policy_digest_secs', 'dnd')",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let mut out: [Option<String>; 4] = Default::default();
        for (k, v) in rows {
            let at = match k.as_str() {
                "policy_review" => 0,
                "policy_loop_limit" => 1,
                "policy_digest_secs" => 2,
                _ => 3,
            };
            if let Some(slot) = out.get_mut(at) {
                *slot = Some(v);
            }
        }
        Ok(out)
    }

    /// Writes a meta value.
    pub async fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        set_meta(&mut *self.pool.acquire().await?, key, value).await
    }

    /// What reaches this profile through its own relay at `relay_url`: its accepted, unblocked
    /// letagents and Agent Mail contacts (the ones a move tells), every Stringcup contact stored
    /// as on our own relay (they stay there, reached through the identity it assigned), and the
    /// active groups whose log it carries.
    pub async fn own_relay_dependents(&self, relay_url: &str) -> Result<RelayDependents> {
        let count = |protocol: Protocol, sql: &'static str| {
            sqlx::query_scalar::<_, i64>(sql).bind(protocol.as_str()).fetch_one(&self.pool)
        };
        let told = "SELECT COUNT(*) FROM contacts WHERE protocol = ? AND state = 'active' AND blocked = 0";
        let letagents = count(Protocol::Letagents, told).await?;
        let agent_mail = count(Protocol::AgentMail, told).await?;
        // The people those are: a person added by contact link has a channel of each.
        let people_told = sqlx::query_scalar(
            "SELECT COUNT(DISTINCT COALESCE('person ' || person_id, 'contact ' || id)) FROM contacts \
             WHERE protocol IN (?, ?) AND state = 'active' AND blocked = 0",
        )
        .bind(Protocol::Letagents.as_str())
        .bind(Protocol::AgentMail.as_str())
        .fetch_one(&self.pool)
        .await?;
        let stringcup =
            count(Protocol::Stringcup, "SELECT COUNT(*) FROM contacts WHERE protocol = ? AND relay_url IS NULL")
                .await?;
        let groups = sqlx::query_scalar(
            "SELECT COUNT(DISTINCT group_id) FROM lmk_groups WHERE state = 'active' AND rtrim(relay, '/') = rtrim(?, '/')",
        )
        .bind(relay_url)
        .fetch_one(&self.pool)
        .await?;
        Ok(RelayDependents { letagents, agent_mail, people_told, stringcup, groups })
    }

    /// The relays other than `own` (canonical) that this profile still reads at `now`: one moved
    /// away from that is draining, one holding Stringcup contacts through the identity it
    /// assigned, one carrying an active group's log; one row per relay, in URL order.
    pub async fn other_relays(&self, own: &str, now: i64) -> Result<Vec<OtherRelayRow>> {
        Ok(sqlx::query_as(
            "WITH urls(url) AS ( \
               SELECT url FROM old_relays WHERE drain_until > ?2 \
               UNION SELECT relay_url FROM stringcup_identities \
               UNION SELECT rtrim(relay, '/') FROM lmk_groups WHERE state = 'active') \
             SELECT url, \
               (SELECT MAX(drain_until) FROM old_relays o WHERE o.url = urls.url AND o.drain_until > ?2) \
                 AS drain_until, \
               (SELECT COUNT(*) FROM contacts c WHERE c.protocol = 'stringcup' \
                 AND rtrim(c.relay_url, '/') = urls.url) AS stringcup, \
               (SELECT COUNT(DISTINCT group_id) FROM lmk_groups g WHERE g.state = 'active' \
                 AND rtrim(g.relay, '/') = urls.url) AS groups \
             FROM urls WHERE url <> rtrim(?1, '/') ORDER BY url",
        )
        .bind(own)
        .bind(now)
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .filter(|r: &OtherRelayRow| r.drain_until.is_some() || r.stringcup > 0 || r.groups > 0)
        .collect())
    }

    /// Makes `new` (certificate pin `new_pin_hex`, empty for the web PKI) the profile's own relay
    /// instead of `old`, in one transaction:
    /// - every letagents and Stringcup contact stored as "on our own relay" (`relay_url` NULL) is
    ///   pinned to `old`, where it still lives (a Stringcup contact is reached through the identity
    ///   `old` assigned, kept in `stringcup_identities`); Stringcup contacts pinned to `new` (a
    ///   move back) are on our own relay again;
    /// - the old relay's certificate pin (`old_pin`, if it had one) becomes the owner's vouch in
    ///   `trusted_relays`, so groups, contacts and the drain still verify it;
    /// - `old` is read until `drain_until` (`old_relays`); `new` is no longer an old relay.
    pub async fn move_own_relay(
        &self,
        old: &str,
        old_pin: Option<[u8; 32]>,
        new: &str,
        new_pin_hex: &str,
        now: i64,
        drain_until: i64,
    ) -> Result<()> {
        let mut tx = self.write_tx().await?;
        set_meta(&mut tx, "relay_url", new).await?;
        set_meta(&mut tx, "relay_cert_sha256", new_pin_hex).await?;
        sqlx::query("UPDATE contacts SET relay_url = ? WHERE protocol IN (?, ?) AND relay_url IS NULL")
            .bind(old)
            .bind(Protocol::Letagents.as_str())
            .bind(Protocol::Stringcup.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE contacts SET relay_url = NULL WHERE protocol = ? AND rtrim(relay_url, '/') = rtrim(?, '/')",
        )
        .bind(Protocol::Stringcup.as_str())
        .bind(new)
        .execute(&mut *tx)
        .await?;
        if let Some(pin) = old_pin {
            sqlx::query(
                "INSERT INTO trusted_relays (url, cert_sha256, source, contact_id, expires_at, updated_at) \
                 VALUES (?, ?, 'user', NULL, 0, ?) ON CONFLICT (url) DO UPDATE SET cert_sha256 = excluded.cert_sha256, \
                 source = 'user', contact_id = NULL, expires_at = 0, updated_at = excluded.updated_at",
            )
            .bind(old)
            .bind(pin.as_slice())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(
            "INSERT INTO old_relays (url, moved_at, drain_until) VALUES (?, ?, ?) \
             ON CONFLICT (url) DO UPDATE SET moved_at = excluded.moved_at, drain_until = excluded.drain_until",
        )
        .bind(old)
        .bind(now)
        .bind(drain_until)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM old_relays WHERE url = ?").bind(new).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The Stringcup identities this profile holds, one per relay (`stringcup_identities`), each
    /// with how many Stringcup contacts are stored with that relay (`contacts.relay_url`; those
    /// on our own relay have none, so the own relay's identity counts 0 here).
    pub async fn stringcup_identities(&self) -> Result<Vec<StringcupIdentityRow>> {
        Ok(sqlx::query_as(
            "SELECT i.relay_url, i.sc_id, i.slot, (SELECT COUNT(*) FROM contacts c WHERE c.protocol = 'stringcup' \
             AND rtrim(c.relay_url, '/') = i.relay_url) AS contacts FROM stringcup_identities i ORDER BY i.created_at",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Records the Stringcup identity `sc_id` the relay at `relay_url` (canonical) assigned,
    /// whose secrets are already in keystore slot `slot`.
    pub async fn set_stringcup_identity(&self, relay_url: &str, sc_id: &str, slot: &str, now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO stringcup_identities (relay_url, sc_id, slot, created_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (relay_url) DO UPDATE SET sc_id = excluded.sc_id, slot = excluded.slot",
        )
        .bind(relay_url)
        .bind(sc_id)
        .bind(slot)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Stores the identity recorded for relay URL `from` under `to` (the same relay, canonical).
    pub async fn rekey_stringcup_identity(&self, from: &str, to: &str) -> Result<()> {
        sqlx::query("UPDATE stringcup_identities SET relay_url = ? WHERE relay_url = ?")
            .bind(to)
            .bind(from)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The relays moved away from that are still read (`drain_until` after `now`): (url,
    /// drain_until), oldest move first.
    pub async fn draining_relays(&self, now: i64) -> Result<Vec<(String, i64)>> {
        Ok(sqlx::query_as("SELECT url, drain_until FROM old_relays WHERE drain_until > ? ORDER BY moved_at")
            .bind(now)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Unshown incoming messages (or all with `all`), oldest first. On the caller's thread
    /// (`store::direct`).
    pub fn inbox(&self, all: bool, limit: i64) -> Result<Vec<MessageRow>> {
        self.direct.rows(
            "SELECT * FROM (SELECT * FROM messages WHERE direction = 'in' AND shown IN (0, ?1) \
             ORDER BY rowid_ DESC LIMIT ?2) ORDER BY rowid_",
            (i64::from(all), limit),
            MessageRow::from_direct,
        )
    }

    /// The name each of the contacts `ids` is shown by: its person's, if it is a channel of one,
    /// else its own. Ids that name no contact are left out. On the caller's thread.
    pub fn display_names(&self, ids: &[i64]) -> Result<std::collections::BTreeMap<i64, String>> {
        if ids.is_empty() {
            return Ok(std::collections::BTreeMap::new());
        }
        let ids = format!("[{}]", ids.iter().map(i64::to_string).collect::<Vec<_>>().join(","));
        Ok(self
            .direct
            .rows(
                "SELECT c.id, COALESCE(p.name, c.name) FROM contacts c LEFT JOIN people p ON p.id = c.person_id \
                 WHERE c.id IN (SELECT value FROM json_each(?))",
                [ids],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .into_iter()
            .collect())
    }

    /// Marks the messages `rowids` shown (handed to an inbox reader). Replayable: a mark lost to
    /// a power cut shows those messages again, as a group lease lost that way hands its rows out
    /// again; so it commits without waiting for the disk, on the caller's thread when it can.
    pub async fn mark_shown(&self, rowids: &[i64]) -> Result<()> {
        if rowids.is_empty() {
            return Ok(());
        }
        let ids = format!("[{}]", rowids.iter().map(i64::to_string).collect::<Vec<_>>().join(","));
        let mut tx = self.replayable_tx().await?;
        tx.queue(Stmt::new("UPDATE messages SET shown = 1 WHERE rowid_ IN (SELECT value FROM json_each(?))").bind(ids));
        tx.commit().await
    }

    /// A message by id and direction. On the caller's thread.
    pub fn message(&self, direction: &str, id: &str) -> Result<Option<MessageRow>> {
        self.direct.row(MESSAGE_BY_ID, (direction, id), MessageRow::from_direct)
    }

    /// The newest `limit` messages with contact `contact_id` (no receipts or rosters), oldest
    /// first.
    pub async fn conversation_page(&self, contact_id: i64, limit: i64) -> Result<Vec<MessageRow>> {
        Ok(sqlx::query_as(CONVERSATION_PAGE).bind(contact_id).bind(limit).fetch_all(&self.pool).await?)
    }

    /// Outbox rows due at `now`.
    /// On the caller's thread.
    pub fn due_outbox(&self, now: i64, limit: i64) -> Result<Vec<OutboxRow>> {
        self.direct.rows(
            "SELECT * FROM outbox WHERE next_attempt_at <= ? ORDER BY id LIMIT ?",
            (now, limit),
            OutboxRow::from_direct,
        )
    }

    /// The earliest next attempt, if anything is queued. On the caller's thread.
    pub fn next_outbox_time(&self) -> Result<Option<i64>> {
        Ok(self.direct.row("SELECT MIN(next_attempt_at) FROM outbox", [], |r| r.get(0))?.flatten())
    }

    /// The outbox entry of `message_id` on `protocol`, if it is still queued.
    pub async fn outbox_row(&self, message_id: &str, protocol: Protocol) -> Result<Option<OutboxRow>> {
        Ok(sqlx::query_as("SELECT * FROM outbox WHERE message_id = ? AND protocol = ?")
            .bind(message_id)
            .bind(protocol)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Makes held entries (see [`outbox_hold`]) due at `now`, without counting an attempt.
    pub async fn outbox_release(&self, message_ids: &[String], now: i64) -> Result<()> {
        let mut tx = self.write_tx().await?;
        for id in message_ids {
            sqlx::query("UPDATE outbox SET next_attempt_at = ? WHERE message_id = ? AND next_attempt_at > ?")
                .bind(now)
                .bind(id)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Agent Mail: the public keys (base64url) of our cards that can still receive, past
    /// nothing yet (`receive_until` after `now`), and of the current card, whatever its time.
    pub async fn am_live_card_keys(&self, now: i64) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT public_key FROM am_own_cards WHERE receive_until > ? \
             UNION SELECT public_key FROM (SELECT public_key FROM am_own_cards ORDER BY nonce DESC LIMIT 1)",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Agent Mail: forgets our cards past `receive_until` (the current one stays). Returns how
    /// many went.
    pub async fn am_forget_cards(&self, now: i64) -> Result<u64> {
        let done = sqlx::query(
            "DELETE FROM am_own_cards WHERE receive_until <= ? AND nonce < (SELECT MAX(nonce) FROM am_own_cards)",
        )
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Number of queued outbox entries.
    pub async fn outbox_len(&self) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM outbox").fetch_one(&self.pool).await?)
    }

    /// The relay took the payload: remove it from the outbox, move the message to `relayed`.
    pub async fn outbox_sent(&self, row: &OutboxRow, now: i64) -> Result<()> {
        self.outbox_handed_over(row, DeliveryPath::Relay, now).await
    }

    /// A failed attempt: try again at `next`.
    pub async fn outbox_retry(&self, id: i64, next: i64, error: &str) -> Result<()> {
        sqlx::query("UPDATE outbox SET attempts = attempts + 1, next_attempt_at = ?, last_error = ? WHERE id = ?")
            .bind(next)
            .bind(error)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A permanent failure: drop from the outbox, mark the message failed.
    pub async fn outbox_failed(&self, row: &OutboxRow, error: &str, now: i64) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query("DELETE FROM outbox WHERE id = ?").bind(row.id).execute(&mut *tx).await?;
        // Named (0021): SQLite would otherwise walk every outgoing entry of the unique index.
        sqlx::query(
            "UPDATE messages INDEXED BY messages_by_id SET state = 'failed', detail = ? WHERE direction = 'out' AND id = ?",
        )
            .bind(error)
            .bind(&row.message_id)
            .execute(&mut *tx)
            .await?;
        audit(
            &mut tx,
            now,
            Audit {
                direction: "out",
                protocol: row.protocol.as_str(),
                peer: &row.target,
                message_id: &row.message_id,
                kind: &row.kind,
                state: "failed",
                detail: error,
            },
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The audit log, newest last, optionally filtered by a substring.
    pub async fn audit_log(&self, search: Option<&str>, limit: i64) -> Result<Vec<AuditRow>> {
        let pattern = search.map(|s| format!("%{}%", s.replace('%', "\\%").replace('_', "\\_")));
        Ok(sqlx::query_as(
            "SELECT * FROM (SELECT * FROM audit WHERE ?1 IS NULL OR (peer || ' ' || message_id || ' ' || kind || ' ' \
             || state || ' ' || detail) LIKE ?1 ESCAPE '\\' ORDER BY id DESC LIMIT ?2) ORDER BY id",
        )
        .bind(pattern)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Local agents.
    pub async fn agents(&self) -> Result<Vec<AgentRow>> {
        Ok(sqlx::query_as("SELECT * FROM agents ORDER BY name").fetch_all(&self.pool).await?)
    }

    /// Forgets seen ids older than `before` (they would be dropped as stale anyway).
    pub async fn prune_seen(&self, before: i64) -> Result<u64> {
        Ok(sqlx::query("DELETE FROM seen WHERE ts < ?").bind(before).execute(&self.pool).await?.rows_affected())
    }
}

/// What depends on the profile's own relay ([`Store::own_relay_dependents`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayDependents {
    /// letagents contacts, accepted and not blocked.
    pub letagents: i64,
    /// Agent Mail contacts, accepted and not blocked.
    pub agent_mail: i64,
    /// The people the letagents and Agent Mail contacts are (a person's channels count once).
    pub people_told: i64,
    /// Stringcup contacts on our own relay, any state: they stay there.
    pub stringcup: i64,
    /// Active groups whose log the relay carries.
    pub groups: i64,
}

/// A relay other than its own that the profile still reads ([`Store::other_relays`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct OtherRelayRow {
    /// Its canonical URL.
    pub url: String,
    /// Moved away from and read until then (ms), while that is in the future.
    pub drain_until: Option<i64>,
    /// Stringcup contacts living there (reached and read through the identity it assigned).
    pub stringcup: i64,
    /// Active groups whose log it carries.
    pub groups: i64,
}

/// A Stringcup identity this profile holds ([`Store::stringcup_identities`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StringcupIdentityRow {
    /// The relay that assigned it (canonical URL).
    pub relay_url: String,
    /// Its `sc-` id.
    pub sc_id: String,
    /// The keystore slot holding its keys and token.
    pub slot: String,
    /// Stringcup contacts stored with that relay.
    pub contacts: i64,
}

/// The URLs of the relays moved away from that are still read at `now`, oldest move first,
/// inside a transaction.
pub async fn draining_relay_urls(conn: &mut SqliteConnection, now: i64) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar("SELECT url FROM old_relays WHERE drain_until > ? ORDER BY moved_at")
        .bind(now)
        .fetch_all(conn)
        .await?)
}

/// Writes a meta value inside a transaction.
pub async fn set_meta(conn: &mut SqliteConnection, key: &str, value: &str) -> Result<()> {
    sqlx::query("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
        .bind(key)
        .bind(value)
        .execute(conn)
        .await?;
    Ok(())
}

/// Appends to the audit log.
pub async fn audit(conn: &mut SqliteConnection, now: i64, a: Audit<'_>) -> Result<()> {
    audit_via(conn, now, a, None).await
}

/// Appends to the audit log, with the path that carried the message when there is one.
pub async fn audit_via(conn: &mut SqliteConnection, now: i64, a: Audit<'_>, path: Option<DeliveryPath>) -> Result<()> {
    audit_stmt(now, a, path).execute(conn).await?;
    Ok(())
}

/// [`audit_via`] as a statement to queue.
pub fn audit_stmt(now: i64, a: Audit<'_>, path: Option<DeliveryPath>) -> Stmt {
    Stmt::new(
        "INSERT INTO audit (at, direction, protocol, peer, message_id, kind, state, detail, path) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(now)
    .bind(a.direction)
    .bind(a.protocol)
    .bind(a.peer)
    .bind(a.message_id)
    .bind(a.kind)
    .bind(a.state)
    .bind(a.detail)
    .bind(path.map_or("", DeliveryPath::as_str))
}

/// Records (sender, id) as processed. Returns false if it was already there.
pub async fn mark_seen(conn: &mut SqliteConnection, protocol: Protocol, peer: &str, id: &str, ts: i64) -> Result<bool> {
    Ok(mark_seen_stmt(protocol, peer, id, ts).execute(conn).await? == 1)
}

/// [`mark_seen`] as a statement to queue or run.
pub fn mark_seen_stmt(protocol: Protocol, peer: &str, id: &str, ts: i64) -> Stmt {
    Stmt::new("INSERT INTO seen (protocol, peer, id, ts) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING")
        .bind(protocol.as_str())
        .bind(peer)
        .bind(id)
        .bind(ts)
}

const WAS_SEEN: &str = "SELECT COUNT(*) FROM seen WHERE protocol = ? AND peer = ? AND id = ?";

/// Whether (sender, id) was already processed.
pub async fn was_seen(conn: &mut SqliteConnection, protocol: Protocol, peer: &str, id: &str) -> Result<bool> {
    Ok(sqlx::query_scalar::<_, i64>(WAS_SEEN).bind(protocol).bind(peer).bind(id).fetch_one(conn).await? > 0)
}

impl Here<'_> {
    /// [`was_seen`] in a transaction on the caller's thread.
    pub(crate) fn was_seen(&self, protocol: Protocol, peer: &str, id: &str) -> Result<bool> {
        Ok(self.row(WAS_SEEN, (protocol.as_str(), peer, id), |r| r.get::<_, i64>(0))?.unwrap_or(0) > 0)
    }
}

/// Records a message. Returns its local row id.
pub async fn insert_message(conn: &mut SqliteConnection, m: &NewMessage<'_>) -> Result<i64> {
    insert_message_stmt(m).insert(conn).await
}

/// [`insert_message`] as a statement to queue (no rowid back).
pub fn insert_message_stmt(m: &NewMessage<'_>) -> Stmt {
    Stmt::new(
        "INSERT INTO messages (id, direction, protocol, contact_id, peer, kind, body, reply_to, from_agent, to_agent, \
         ts, state, shown, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(m.id)
    .bind(m.direction)
    .bind(m.protocol.as_str())
    .bind(m.contact_id)
    .bind(m.peer)
    .bind(m.kind)
    .bind(m.body)
    .bind(m.reply_to)
    .bind(m.from_agent)
    .bind(m.to_agent)
    .bind(m.ts)
    .bind(m.state)
    .bind(m.hidden)
    .bind(m.now)
}

/// A payload to queue for sending.
#[derive(Debug, Clone, Copy)]
pub struct Queued<'a> {
    /// The message it carries.
    pub message_id: &'a str,
    /// Its protocol.
    pub protocol: Protocol,
    /// Its kind (for the audit log).
    pub kind: &'a str,
    /// Where it is posted.
    pub relay_url: &'a str,
    /// The relay's name for the recipient (peer id, mailbox).
    pub target: &'a str,
    /// The peer, as the audit log names it.
    pub peer: &'a str,
    /// letagents drop code, else empty.
    pub drop_code: &'a [u8],
    /// The exact bytes every attempt posts.
    pub payload: &'a [u8],
}

/// Holds a just-queued entry until `until`: the outbox worker leaves it alone while the caller
/// makes the first attempt itself (a Stringcup topic batch), then [`Store::outbox_release`]s it.
pub async fn outbox_hold(conn: &mut SqliteConnection, message_id: &str, until: i64) -> Result<()> {
    sqlx::query("UPDATE outbox SET next_attempt_at = ? WHERE message_id = ?")
        .bind(until)
        .bind(message_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Queues a payload for sending and records it as queued in the audit log, in `conn`'s
/// transaction; the caller commits and then wakes the outbox.
pub async fn enqueue(conn: &mut SqliteConnection, o: Queued<'_>, now: i64) -> Result<()> {
    Stmt::execute_all(enqueue_stmts(o, now), conn).await
}

/// [`enqueue`] as statements to queue: the outbox entry and its `queued` audit row.
pub fn enqueue_stmts(o: Queued<'_>, now: i64) -> [Stmt; 2] {
    let entry = Stmt::new(
        "INSERT INTO outbox (message_id, protocol, kind, relay_url, target, drop_code, payload, next_attempt_at, \
         created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(o.message_id)
    .bind(o.protocol.as_str())
    .bind(o.kind)
    .bind(o.relay_url)
    .bind(o.target)
    .bind(o.drop_code)
    .bind(o.payload)
    .bind(now)
    .bind(now);
    let queued = Audit {
        direction: "out",
        protocol: o.protocol.as_str(),
        peer: o.peer,
        message_id: o.message_id,
        kind: o.kind,
        state: "queued",
        detail: "",
    };
    [entry, audit_stmt(now, queued, None)]
}

/// Sets an outgoing message's state from a receipt. Returns the previous state if it existed.
pub async fn set_outgoing_state(
    conn: &mut SqliteConnection,
    id: &str,
    peer: &str,
    state: &str,
    detail: &str,
) -> Result<bool> {
    let n =
        sqlx::query(OUTGOING_STATE).bind(state).bind(detail).bind(id).bind(peer).execute(conn).await?.rows_affected();
    Ok(n > 0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod replayable_tests {
    use super::*;

    async fn synchronous_levels(store: &Store) -> Vec<i64> {
        // Every connection the pool holds (max 4), each asked while the others are held.
        let mut held = Vec::new();
        let mut levels = Vec::new();
        for _ in 0..4 {
            let mut conn = store.pool.acquire().await.unwrap();
            levels.push(sqlx::query_scalar("PRAGMA synchronous").fetch_one(&mut *conn).await.unwrap());
            held.push(conn);
        }
        levels
    }

    /// `mark_shown` marks exactly the rows named (any number, in one statement), on the caller's
    /// thread; the inbox then shows only the others.
    #[tokio::test]
    async fn mark_shown_marks_exactly_the_rows_named_on_the_callers_thread() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        for i in 0..5 {
            sqlx::query(
                "INSERT INTO messages (id, direction, protocol, peer, kind, body, ts, state, created_at) \
                 VALUES (?, 'in', 'letagents', 'p', 'send', 'b', 0, 'received', 0)",
            )
            .bind(format!("m{i}"))
            .execute(&store.pool)
            .await
            .unwrap();
        }
        let rows = store.inbox(false, 1000).unwrap();
        assert_eq!(rows.len(), 5);
        store.mark_shown(&[]).await.unwrap();
        let before = store.direct_commits();
        store.mark_shown(&[rows[0].rowid_, rows[2].rowid_, rows[3].rowid_]).await.unwrap();
        assert_eq!(store.direct_commits(), before + 1, "one commit, on the caller's thread");
        let left: Vec<String> = store.inbox(false, 1000).unwrap().into_iter().map(|m| m.id).collect();
        assert_eq!(left, ["m1", "m4"]);
        assert_eq!(store.inbox(true, 1000).unwrap().len(), 5, "all of them with `all`");
    }

    #[tokio::test]
    async fn a_replayable_commit_is_kept_and_its_connection_goes_back_to_full_sync() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        let mut tx = store.replayable_tx().await.unwrap();
        let inside: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(tx.conn().await.unwrap()).await.unwrap();
        assert_eq!(inside, 1, "NORMAL for this transaction's commit");
        set_meta(tx.conn().await.unwrap(), "k", "committed").await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(store.meta("k").await.unwrap().as_deref(), Some("committed"));
        assert_eq!(synchronous_levels(&store).await, vec![2; 4], "every pooled connection is FULL again");
    }

    #[tokio::test]
    async fn a_replayable_transaction_dropped_uncommitted_leaves_nothing_and_no_relaxed_connection() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        {
            let mut tx = store.replayable_tx().await.unwrap();
            set_meta(tx.conn().await.unwrap(), "k", "half done").await.unwrap();
            // Dropped here, as when a `?` returns early.
        }
        assert_eq!(store.meta("k").await.unwrap(), None, "rolled back");
        assert_eq!(synchronous_levels(&store).await, vec![2; 4], "the relaxed connection was closed, not pooled");
        // The write lock was released with it.
        let mut tx = store.write_tx().await.unwrap();
        set_meta(&mut tx, "k", "later").await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(store.meta("k").await.unwrap().as_deref(), Some("later"));
    }

    #[tokio::test]
    async fn a_replayable_commit_that_fails_keeps_nothing_and_no_relaxed_connection() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        let mut tx = store.replayable_tx().await.unwrap();
        set_meta(tx.conn().await.unwrap(), "k", "refused").await.unwrap();
        // A deferred foreign key left broken: `COMMIT` itself fails (and the `PRAGMA` sent in
        // the same trip does not run).
        sqlx::raw_sql(
            "CREATE TEMP TABLE parent (id INTEGER PRIMARY KEY); \
             CREATE TEMP TABLE child (p INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED); \
             INSERT INTO child VALUES (1)",
        )
        .execute(tx.conn().await.unwrap())
        .await
        .unwrap();
        assert!(tx.commit().await.is_err(), "the commit is refused");
        assert_eq!(store.meta("k").await.unwrap(), None, "rolled back");
        assert_eq!(synchronous_levels(&store).await, vec![2; 4], "the relaxed connection was closed, not pooled");
    }
}

/// The steps of `sql`'s plan (`EXPLAIN QUERY PLAN`, parameters left unbound), as SQLite words
/// them.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) async fn query_plan(pool: &SqlitePool, sql: &str) -> Vec<String> {
    let plan: Vec<(i64, i64, i64, String)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}"))).fetch_all(pool).await.unwrap();
    plan.into_iter().map(|(_, _, _, step)| step).collect()
}

/// A profile database in `dir` with the migrations numbered below `version` applied, and the
/// later migration files in order, for an upgrade test to apply after writing old-schema rows.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
async fn migrated_before(dir: &Path, version: &str) -> (SqlitePool, Vec<std::path::PathBuf>) {
    let opts = SqliteConnectOptions::new().filename(dir.join("db.sqlite")).create_if_missing(true);
    let pool = SqlitePool::connect_with(opts).await.unwrap();
    let migrations = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&migrations).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let (before, later): (Vec<_>, Vec<_>) =
        files.into_iter().partition(|p| p.file_name().unwrap().to_str().unwrap() < version);
    apply_migrations(&pool, &before).await;
    (pool, later)
}

/// Applies migration `files` in order (our own files, read as they are).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
async fn apply_migrations(pool: &SqlitePool, files: &[std::path::PathBuf]) {
    for f in files {
        sqlx::raw_sql(sqlx::AssertSqlSafe(std::fs::read_to_string(f).unwrap())).execute(pool).await.unwrap();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod stringcup_identity_tests {
    use super::*;

    /// Migrations 0001-0018, then a profile with an identity registered the old way
    /// (`meta.stringcup_id`), then 0019.
    #[tokio::test]
    async fn the_identity_registered_before_0019_belongs_to_the_profiles_relay() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, from19) = migrated_before(dir.path(), "0019").await;
        for (k, v) in [("relay_url", "http://127.0.0.1:9/"), ("stringcup_id", "sc-aaaaaaaaaaaaaaaaaaaaaaaaaa")] {
            sqlx::query("INSERT INTO meta (key, value) VALUES (?, ?)").bind(k).bind(v).execute(&pool).await.unwrap();
        }
        apply_migrations(&pool, &from19[..1]).await;
        let rows: Vec<(String, String, String)> =
            sqlx::query_as("SELECT relay_url, sc_id, slot FROM stringcup_identities").fetch_all(&pool).await.unwrap();
        assert_eq!(
            rows,
            [("http://127.0.0.1:9".to_owned(), "sc-aaaaaaaaaaaaaaaaaaaaaaaaaa".to_owned(), "stringcup".to_owned())]
        );
        let left: Option<String> = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'stringcup_id'")
            .fetch_optional(&pool)
            .await
            .unwrap();
        assert_eq!(left, None);
    }

    async fn add(store: &Store, name: &str, protocol: Protocol, relay: Option<&str>) {
        let mut conn = store.pool.acquire().await.unwrap();
        let c = NewContact {
            name,
            protocol,
            peer_id: name,
            address: name,
            sig_pub: &[],
            box_pub: &[7; 32],
            drop_code: None,
            relay_url: relay,
            state: ContactState::Active,
            allow_kinds: "send",
            request_body: "",
            now: 1,
        };
        insert_contact(&mut conn, &c).await.unwrap();
    }

    async fn relay_of(store: &Store, protocol: Protocol, name: &str) -> Option<String> {
        let mut conn = store.pool.acquire().await.unwrap();
        contact_by_peer(&mut conn, protocol, name).await.unwrap().unwrap().relay_url
    }

    #[tokio::test]
    async fn a_move_leaves_stringcup_contacts_on_the_old_relay_and_a_move_back_brings_them_home() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        let (a, b) = ("http://127.0.0.1:1", "http://127.0.0.1:2");
        add(&store, "carol", Protocol::Stringcup, None).await;
        add(&store, "bob", Protocol::Letagents, None).await;
        add(&store, "zed", Protocol::Stringcup, Some("http://127.0.0.1:3")).await;
        store.set_stringcup_identity(a, "sc-a", "stringcup", 1).await.unwrap();
        assert_eq!(store.own_relay_dependents(a).await.unwrap().stringcup, 1, "zed lives elsewhere already");

        store.move_own_relay(a, None, b, "", 2, 3).await.unwrap();
        assert_eq!(relay_of(&store, Protocol::Stringcup, "carol").await.as_deref(), Some(a));
        assert_eq!(relay_of(&store, Protocol::Letagents, "bob").await.as_deref(), Some(a));
        add(&store, "dave", Protocol::Stringcup, None).await;
        store.set_stringcup_identity(b, "sc-b", "stringcup@x", 4).await.unwrap();
        let ids = store.stringcup_identities().await.unwrap();
        let counts: Vec<(&str, i64)> = ids.iter().map(|r| (r.sc_id.as_str(), r.contacts)).collect();
        assert_eq!(counts, [("sc-a", 1), ("sc-b", 0)], "the own relay's contacts are stored without one");

        store.move_own_relay(b, None, a, "", 5, 6).await.unwrap();
        assert_eq!(relay_of(&store, Protocol::Stringcup, "carol").await, None, "home again");
        assert_eq!(relay_of(&store, Protocol::Stringcup, "dave").await.as_deref(), Some(b));
        assert_eq!(relay_of(&store, Protocol::Stringcup, "zed").await.as_deref(), Some("http://127.0.0.1:3"));
        let ids = store.stringcup_identities().await.unwrap();
        let counts: Vec<(&str, i64)> = ids.iter().map(|r| (r.sc_id.as_str(), r.contacts)).collect();
        assert_eq!(counts, [("sc-a", 0), ("sc-b", 1)]);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod frontier_tests {
    use super::*;

    /// The read frontier as it was computed before 0020 (every read message since the latest
    /// join and its `after`, parsed): the oracle the `covered` column must agree with.
    async fn frontier_by_scan(pool: &SqlitePool, handle: &str, gid: &str) -> Vec<String> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT id, after FROM lmk_messages WHERE handle = ?1 AND group_id = ?2 AND read = 1 \
             AND kind IN ('message', 'leave') AND state = 'done' AND rowid_ > COALESCE((SELECT MAX(rowid_) \
             FROM lmk_messages WHERE handle = ?1 AND group_id = ?2 AND kind = 'event' AND id LIKE 'joined:%'), 0) \
             ORDER BY rowid_",
        )
        .bind(handle)
        .bind(gid)
        .fetch_all(pool)
        .await
        .unwrap();
        let covered: std::collections::BTreeSet<String> =
            rows.iter().flat_map(|(_, a)| serde_json::from_str::<Vec<String>>(a).unwrap()).collect();
        rows.into_iter().map(|(id, _)| id).filter(|id| !covered.contains(id)).collect()
    }

    async fn row(pool: &SqlitePool, gid: &str, id: &str, kind: &str, after: &[&str], read: bool, state: &str) {
        sqlx::query(
            "INSERT INTO lmk_messages (handle, group_id, id, kind, state, after, read, created_at) \
             VALUES ('h', ?, ?, ?, ?, ?, ?, 1)",
        )
        .bind(gid)
        .bind(id)
        .bind(kind)
        .bind(state)
        .bind(serde_json::to_string(after).unwrap())
        .bind(read)
        .execute(pool)
        .await
        .unwrap();
    }

    /// A profile from before 0020 with a conversation read in and out of order, an unread tail,
    /// a message still sending and a re-join; then 0020; then the ways rows get read or finish.
    /// After every step the frontier through `covered` equals the scan's.
    #[tokio::test]
    async fn the_covered_frontier_matches_the_scan_across_the_upgrade_and_every_way_a_row_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, from20) = migrated_before(dir.path(), "0020").await;
        sqlx::query(
            "INSERT INTO lmk_sessions (handle, name, signature_key, mls_state, created_at) \
             VALUES ('h', 'n', x'00', x'', 1)",
        )
        .execute(&pool)
        .await
        .unwrap();
        for g in ["g", "other"] {
            sqlx::query("INSERT INTO lmk_groups (handle, group_id, relay, joined_at) VALUES ('h', ?, 'r', 1)")
                .bind(g)
                .execute(&pool)
                .await
                .unwrap();
        }
        // Old membership, then a re-join: nothing before it counts.
        row(&pool, "g", "old", "message", &[], true, "done").await;
        row(&pool, "g", "joined:2", "event", &[], true, "done").await;
        row(&pool, "g", "a", "message", &[], true, "done").await;
        row(&pool, "g", "b", "message", &["a"], true, "done").await;
        row(&pool, "g", "c", "message", &["a"], true, "done").await; // two tips: b and c
        row(&pool, "g", "d", "message", &["b", "c"], false, "done").await; // unread
        row(&pool, "g", "e", "leave", &["d"], true, "done").await; // read before d: covers d
        row(&pool, "g", "f", "message", &["e"], true, "sending").await; // not posted yet
        row(&pool, "g", "bad", "message", &[], true, "done").await; // an empty `after`
        row(&pool, "other", "x", "message", &["a"], true, "done").await; // another group's `a`
        let upgraded = Store {
            pool: pool.clone(),
            direct: std::sync::Arc::new(direct::Direct::new(&dir.path().join("db.sqlite"))),
        };
        let expect = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let check = |label: &'static str| {
            let (pool, store) = (pool.clone(), &upgraded);
            async move {
                for g in ["g", "other"] {
                    let by_scan = frontier_by_scan(&pool, "h", g).await;
                    assert_eq!(store.group_frontier("h", g).unwrap(), by_scan, "{label}, group {g}");
                }
            }
        };
        apply_migrations(&pool, &from20).await;
        check("after the upgrade").await;
        assert_eq!(upgraded.group_frontier("h", "g").unwrap(), expect(&["b", "c", "e", "bad"]));

        // d read late: covered by e already, so no new tip; it covers b and c.
        sqlx::query("UPDATE lmk_messages SET read = 1 WHERE handle = 'h' AND group_id = 'g' AND id = 'd'")
            .execute(&pool)
            .await
            .unwrap();
        check("d read").await;
        // f posted: state done, covers e.
        sqlx::query("UPDATE lmk_messages SET state = 'done' WHERE handle = 'h' AND group_id = 'g' AND id = 'f'")
            .execute(&pool)
            .await
            .unwrap();
        check("f posted").await;
        assert_eq!(upgraded.group_frontier("h", "g").unwrap(), expect(&["f", "bad"]));
        // A new read row (an own send) covering every tip.
        row(&pool, "g", "h1", "message", &["f", "bad"], true, "done").await;
        check("own send").await;
        assert_eq!(upgraded.group_frontier("h", "g").unwrap(), expect(&["h1"]));
        // An unread row naming h1 covers nothing until read; an event never covers.
        row(&pool, "g", "i", "message", &["h1"], false, "done").await;
        row(&pool, "g", "ev", "event", &["h1"], true, "done").await;
        check("unread and event rows").await;
        assert_eq!(upgraded.group_frontier("h", "g").unwrap(), expect(&["h1"]));
        sqlx::query("UPDATE lmk_messages SET read = 1 WHERE handle = 'h' AND group_id = 'g' AND id = 'i'")
            .execute(&pool)
            .await
            .unwrap();
        check("i read").await;
        assert_eq!(upgraded.group_frontier("h", "g").unwrap(), expect(&["i"]));
        // Another join: the frontier starts again.
        row(&pool, "g", "joined:9", "event", &[], true, "done").await;
        check("re-joined").await;
        assert!(upgraded.group_frontier("h", "g").unwrap().is_empty());
        // A row whose `after` is not JSON is stored and read all the same (the triggers skip it)
        // and covers nothing.
        row(&pool, "g", "junk", "message", &[], false, "done").await;
        sqlx::query("UPDATE lmk_messages SET after = 'not json' WHERE handle = 'h' AND group_id = 'g' AND id = 'junk'")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("UPDATE lmk_messages SET read = 1 WHERE handle = 'h' AND group_id = 'g' AND id = 'junk'")
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(upgraded.group_frontier("h", "g").unwrap(), expect(&["junk"]));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod message_lookup_tests {
    use super::*;

    /// Looking up one-to-one messages by contact or by id, deliveries by lease and Agent Mail
    /// messages by id reads an index range, never the table (0021, 0022; before them each of
    /// these read every row, or every outgoing one: 14-40 ms with 100,000 messages).
    #[tokio::test]
    async fn message_lookups_by_contact_and_id_read_an_index_range() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        let by_contact = "USING INDEX messages_by_contact (contact_id=?";
        let by_id = "USING INDEX messages_by_id (id=?)";
        for (sql, expected) in [
            (deliveries::CONVERSATION_HOPS, by_contact),
            (deliveries::SENT_BY, by_id),
            (people::LAST_SEND_FAILED, by_contact),
            (people::FELL_BACK_FROM, "USING INDEX messages_fallbacks (fallback_of=?)"),
            (people::PERSON_CONVERSATION, by_contact),
            (lan::OUTBOX_CONTACT, by_id),
            (MESSAGE_BY_ID, by_id),
            (lan::MARK_RELAYED, by_id),
            (deliveries::DELIVERY_LEASE_HOLDERS, "USING INDEX agent_deliveries_lease (lease=?)"),
            (deliveries::HANDED_UNDER, "USING INDEX agent_deliveries_lease (lease=?)"),
            (deliveries::ACK_DELIVERY, "USING INDEX agent_deliveries_lease (lease=?)"),
            (agent_mail::AM_SENT_TO, "(recipient=? AND sender=? AND message_id=?)"),
            (agent_mail::AM_SENT, "USING INDEX am_messages_by_id (message_id=?)"),
            (agent_mail::AM_SUBJECT_THREAD, "USING INDEX am_messages_by_id (message_id=?)"),
            (OUTGOING_STATE, by_id),
            (CONVERSATION_PAGE, by_contact),
        ] {
            let plan = query_plan(&store.pool, sql).await;
            // The lookup goes through the index named, and no step reads a whole table.
            assert!(plan.iter().any(|d| d.contains(expected)), "{sql}: {plan:?}");
            assert!(
                !plan.iter().any(|d| d.starts_with("SCAN ") && !d.starts_with("SCAN (subquery")),
                "{sql}: {plan:?}"
            );
        }
    }
}
