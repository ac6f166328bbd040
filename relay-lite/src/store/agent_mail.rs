//! Agent Mail 1.0 SQL (§4.2, §7.1, §8): current cards (one per mailbox, binding it to its first
//! card's owner), the service-wide live-write nonce cache, and accepted packets whose rows stay
//! as acceptance tombstones after the owner deletes them.
//!
//! Publication and delivery decide inside the writer's transaction: the pure checks in
//! `switchboard_core::protocol::agent_mail::relay` run against state read in the same
//! transaction, so the decision, sequence allocation and storage are one atomic step, and the
//! caller is answered only after the commit.
//!
//! Routes see [`AgentMailStore`]; the request and outcome types here are shared with the
//! PostgreSQL backend ([`super::pg::agent_mail`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use async_trait::async_trait;
use rusqlite::OptionalExtension as _;
use sqlx::{Row as _, SqlitePool};
use switchboard_core::protocol::agent_identity::live_write::{DEFAULT_WINDOW_MS, LiveWrite, NonceCacheEntry};
use switchboard_core::protocol::agent_identity::{AgentId, Hash32, Origin};
use switchboard_core::protocol::agent_mail::Id16;
use switchboard_core::protocol::agent_mail::card::MailboxCard;
use switchboard_core::protocol::agent_mail::packet::Packet;
use switchboard_core::protocol::agent_mail::relay::{
    self, Admission, CurrentCard, Delivery, DeliveryResult, RelayError,
};

use super::sync::{SyncDb, SyncResult as _, rows};
use super::writer::sync_request;
use super::{SqliteStore, Store, StoreError};
use crate::hub::Hub;
use crate::origin::PublicOrigins;

/// What one mailbox may hold before the next new packet gets `rate_limited` (checked before
/// anything is stored); from [`crate::limits::AgentMailLimits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Most undeleted, unexpired packets.
    pub packets: i64,
    /// Most undeleted, unexpired packet bytes.
    pub bytes: i64,
}

/// A decision the relay made, or its refusal (the client's fault).
pub type Decided<T> = Result<T, Refusal>;

/// Why a write was refused without touching the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A §8 refusal from the pure checks.
    Relay(RelayError),
    /// The mailbox's storage quota is exhausted (`rate_limited`).
    Quota,
}

impl From<RelayError> for Refusal {
    fn from(e: RelayError) -> Self {
        Self::Relay(e)
    }
}

/// Outcome of a card publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The current record after the request (the original one on exact resubmission).
    pub current: CurrentCard,
    /// Whether this was an exact resubmission.
    pub resubmission: bool,
}

/// `POST /v1/mailboxes`.
pub(crate) struct Publish {
    pub(crate) card: MailboxCard,
    pub(crate) origin: Origin,
    pub(crate) now: i64,
}

/// `POST /v1/mailboxes/{id}/packets`.
pub(crate) struct Deliver {
    pub(crate) packet: Packet,
    pub(crate) path: Id16,
    pub(crate) origins: Arc<PublicOrigins>,
    pub(crate) quota: Quota,
    pub(crate) now: i64,
    /// The packet's JCS bytes, as stored: serialized by the caller, not on the single writer.
    pub(crate) body: Vec<u8>,
}

/// The reclaim sweep at `now`.
pub(crate) struct Sweep {
    pub(crate) now: i64,
}

/// What a sweep reclaimed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AmSweepReport {
    /// Packet rows (stored packets and deletion tombstones) past their packet's expiry.
    pub packets: u64,
    /// Mailboxes whose current card's `receive_until` passed (binding, card and blocks forgotten).
    pub mailboxes: u64,
    /// Expired live-write nonce cache entries.
    pub nonces: u64,
}

/// `DELETE /v1/mailboxes/{id}/packets/{packet_id}` (after the owner was authorized).
pub(crate) struct Delete {
    pub(crate) mailbox: Id16,
    pub(crate) packet_id: Hash32,
}

/// `PUT`/`DELETE /v1/mailboxes/{id}/blocked/{agent_id}` (after the owner was authorized).
pub(crate) struct Block {
    pub(crate) mailbox: Id16,
    pub(crate) sender: AgentId,
    pub(crate) blocked: bool,
}

impl Deliver {
    /// A delivery of `packet` to the mailbox of `path`.
    pub(crate) fn new(packet: Packet, path: Id16, origins: Arc<PublicOrigins>, quota: Quota, now: i64) -> Self {
        let body = packet.to_jcs();
        Self { packet, path, origins, quota, now, body }
    }

    /// Payload bytes, for the writer's per-batch byte cap.
    pub(crate) fn payload_bytes(&self) -> usize {
        self.packet.size()
    }
}

sync_request!(Publish => Decided<Published>, publish);
sync_request!(Deliver => Decided<DeliveryResult>, deliver, {
    fn bytes(&self) -> usize {
        self.payload_bytes()
    }
});
sync_request!(Delete => (), delete);
sync_request!(Block => (), block);
sync_request!(Sweep => AmSweepReport, sweep);

pub(crate) fn corrupt(what: &str) -> sqlx::Error {
    sqlx::Error::Decode(format!("stored agent mail {what} does not verify").into())
}

pub(crate) fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A mailbox's stored current card and its acceptance time: parameter (mailbox id).
const CURRENT_CARD: &str = "SELECT card, accepted_at FROM am_mailboxes WHERE mailbox_id = ?";

async fn current_card<'e, E>(db: E, mailbox: &Id16) -> Result<Option<CurrentCard>, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Sqlite>,
{
    let row = sqlx::query(CURRENT_CARD).bind(mailbox.to_string()).fetch_optional(db).await?;
    let Some(row) = row else { return Ok(None) };
    let bytes: Vec<u8> = row.try_get("card")?;
    Ok(Some(parse_current(&bytes, row.try_get("accepted_at")?)?))
}

/// [`current_card`] inside the writer's transaction.
fn current_card_sync(db: &SyncDb, mailbox: &Id16) -> Result<Option<CurrentCard>, sqlx::Error> {
    let row: Option<(Vec<u8>, i64)> = db
        .prepare_cached(CURRENT_CARD)
        .and_then(|mut s| s.query_row([mailbox.to_string()], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .into_sqlx()?;
    row.map(|(bytes, accepted_at)| parse_current(&bytes, accepted_at)).transpose()
}

/// A stored current card, parsed and verified again.
pub(crate) fn parse_current(bytes: &[u8], accepted_at: i64) -> Result<CurrentCard, sqlx::Error> {
    let card = MailboxCard::parse(bytes).map_err(|_| corrupt("card"))?;
    Ok(CurrentCard { card, accepted_at })
}

/// Verified cards by mailbox with the stored bytes they were parsed from: delivery reads the
/// current card's bytes in its transaction and reuses the verified card only when they are
/// byte-identical, so a changed (or another store's) card is always parsed and verified afresh.
type CardCache = HashMap<String, (Vec<u8>, MailboxCard)>;

/// Entries kept before the cache starts over (each holds one card, at most a few KiB).
const CARD_CACHE_MAX: usize = 4096;

fn card_cache() -> MutexGuard<'static, CardCache> {
    static CARDS: OnceLock<Mutex<CardCache>> = OnceLock::new();
    CARDS.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner)
}

/// `mailbox`'s card from its stored `bytes`: the cached verified card when the bytes are the
/// ones it was parsed from, else parsed and verified (and cached).
pub(crate) fn verified_card(mailbox: &str, bytes: Vec<u8>) -> Result<MailboxCard, sqlx::Error> {
    if let Some((cached, card)) = card_cache().get(mailbox)
        && *cached == bytes
    {
        return Ok(card.clone());
    }
    let card = MailboxCard::parse(&bytes).map_err(|_| corrupt("card"))?;
    let mut cache = card_cache();
    if cache.len() >= CARD_CACHE_MAX {
        cache.clear();
    }
    cache.insert(mailbox.to_owned(), (bytes, card.clone()));
    Ok(card)
}

fn publish(db: &SyncDb, req: &Publish, _: &Hub) -> Result<Decided<Published>, sqlx::Error> {
    let mailbox = req.card.mailbox_id();
    let current = current_card_sync(db, &mailbox)?;
    let actor = req.card.owner().to_string();
    let nonces = db
        .prepare_cached("SELECT max_nonce, valid_until FROM am_nonces WHERE actor = ?")
        .and_then(|mut s| {
            s.query_row([&actor], |r| {
                let max: i64 = r.get(0)?;
                Ok(NonceCacheEntry { max_nonce: max.max(0).unsigned_abs(), valid_until: r.get(1)? })
            })
            .optional()
        })
        .into_sqlx()?;
    let decision =
        relay::check_publish(&req.card, &req.origin, current.as_ref(), nonces.as_ref(), req.now, DEFAULT_WINDOW_MS);
    match decision {
        Err(e) => Ok(Err(e.into())),
        Ok(LiveWrite::Resubmission) => {
            let current = current.ok_or_else(|| corrupt("card"))?;
            Ok(Ok(Published { current, resubmission: true }))
        }
        Ok(LiveWrite::Accept) => {
            let entry = NonceCacheEntry::after_accept(nonces.as_ref(), req.card.nonce(), req.now, DEFAULT_WINDOW_MS);
            let stored = || -> rusqlite::Result<()> {
                db.prepare_cached(
                    "INSERT INTO am_nonces (actor, max_nonce, valid_until) VALUES (?, ?, ?) \
                     ON CONFLICT (actor) DO UPDATE SET max_nonce = excluded.max_nonce, valid_until = excluded.valid_until",
                )?
                .execute((&actor, to_i64(entry.max_nonce), entry.valid_until))?;
                db.prepare_cached(
                    "INSERT INTO am_mailboxes (mailbox_id, owner, card, accepted_at, receive_until) \
                     VALUES (?, ?, ?, ?, ?) ON CONFLICT (mailbox_id) DO UPDATE SET card = excluded.card, \
                     accepted_at = excluded.accepted_at, receive_until = excluded.receive_until",
                )?
                .execute((
                    mailbox.to_string(),
                    &actor,
                    req.card.to_jcs(),
                    req.now,
                    req.card.payload().receive_until,
                ))?;
                Ok(())
            };
            stored().into_sqlx()?;
            let current = CurrentCard { card: req.card.clone(), accepted_at: req.now };
            Ok(Ok(Published { current, resubmission: false }))
        }
    }
}

/// Whether one more packet of `size` bytes fits `mailbox`'s quota at `now`, given its stored
/// counters (`count`, `bytes`). The counters include expired packets the sweep has not reclaimed
/// yet, so they bound the exact figures from above: fitting by the counters means fitting
/// exactly; otherwise count the unexpired packets.
fn within_quota(
    db: &SyncDb,
    mailbox: &str,
    (count, bytes): (i64, i64),
    size: i64,
    quota: Quota,
    now: i64,
) -> rusqlite::Result<bool> {
    let fits = |count: i64, bytes: i64| count < quota.packets && bytes.saturating_add(size) <= quota.bytes;
    if fits(count, bytes) {
        return Ok(true);
    }
    let (count, bytes): (i64, i64) = db
        .prepare_cached(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM am_packets \
             WHERE mailbox_id = ? AND body IS NOT NULL AND expires_at > ?",
        )?
        .query_row((mailbox, now), |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(fits(count, bytes))
}

/// What a delivery decides on, read in one statement: the packet's first acceptance (history),
/// the mailbox's stored card and quota counters, and whether the sender is blocked there.
type DeliveryFacts = (Option<i64>, Option<Vec<u8>>, Option<i64>, Option<i64>, bool);

/// Two statements on the common path: one read of everything the decision needs, and one
/// insert that takes the mailbox's next seq itself (its trigger, migration 0009, advances
/// `next_seq` and the quota counters).
fn deliver(db: &SyncDb, req: &Deliver, _: &Hub) -> Result<Decided<DeliveryResult>, sqlx::Error> {
    let id = req.packet.id();
    let packet_id = id.to_string();
    let mailbox = req.path.to_string();
    let (accepted_at, card, stored_packets, stored_bytes, blocked): DeliveryFacts = db
        .prepare_cached(
            "SELECT (SELECT accepted_at FROM am_packets WHERE packet_id = ?1), m.card, m.stored_packets, \
             m.stored_bytes, EXISTS (SELECT 1 FROM am_blocked WHERE mailbox_id = ?2 AND sender = ?3) \
             FROM (SELECT 1) LEFT JOIN am_mailboxes AS m ON m.mailbox_id = ?2",
        )
        .and_then(|mut s| {
            s.query_row((&packet_id, &mailbox, req.packet.sender().to_string()), |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
        })
        .into_sqlx()?;
    let seen = accepted_at.map(|accepted_at| DeliveryResult { packet_id: id, accepted_at });
    let current = card.map(|bytes| verified_card(&mailbox, bytes)).transpose()?;
    let admission = if blocked { Admission::Deny } else { Admission::Allow };
    // The card must list one of this relay's names (any of them); the primary when none does,
    // which check_delivery then refuses.
    let origin = current
        .as_ref()
        .and_then(|card| req.origins.origins().find(|o| card.lists_route(o)))
        .unwrap_or_else(|| req.origins.primary_origin());
    let decision =
        relay::check_delivery(&req.packet, &req.path, origin, current.as_ref(), seen.as_ref(), admission, req.now);
    match decision {
        Err(e) => Ok(Err(e.into())),
        Ok(Delivery::Resubmission(result)) => Ok(Ok(result)),
        Ok(Delivery::Accept) => {
            let size = i64::try_from(req.packet.size()).unwrap_or(i64::MAX);
            let counters = (stored_packets.unwrap_or(0), stored_bytes.unwrap_or(0));
            if !within_quota(db, &mailbox, counters, size, req.quota, req.now).into_sqlx()? {
                return Ok(Err(Refusal::Quota));
            }
            db.prepare_cached(
                "INSERT INTO am_packets (packet_id, mailbox_id, seq, accepted_at, expires_at, size, body) \
                 SELECT ?1, mailbox_id, next_seq, ?3, ?4, ?5, ?6 FROM am_mailboxes WHERE mailbox_id = ?2 \
                 RETURNING seq",
            )
            .and_then(|mut s| {
                s.query_row((&packet_id, &mailbox, req.now, req.packet.header().expires_at, size, &req.body), |r| {
                    r.get::<_, i64>(0)
                })
            })
            .into_sqlx()?;
            Ok(Ok(DeliveryResult { packet_id: id, accepted_at: req.now }))
        }
    }
}

fn delete(db: &SyncDb, req: &Delete, _: &Hub) -> rusqlite::Result<()> {
    // The row stays as the acceptance tombstone; only the ciphertext goes.
    let mailbox = req.mailbox.to_string();
    let freed: Option<i64> = db
        .prepare_cached(
            "UPDATE am_packets SET body = NULL WHERE packet_id = ? AND mailbox_id = ? AND body IS NOT NULL \
             RETURNING size",
        )?
        .query_row((req.packet_id.to_string(), &mailbox), |r| r.get(0))
        .optional()?;
    if let Some(size) = freed {
        db.prepare_cached(
            "UPDATE am_mailboxes SET stored_packets = stored_packets - 1, stored_bytes = stored_bytes - ? \
             WHERE mailbox_id = ?",
        )?
        .execute((size, &mailbox))?;
    }
    Ok(())
}

/// The sweep's expired packets, through `am_packets_expires` (0012).
const SWEEP_EXPIRED: &str = "DELETE FROM am_packets WHERE expires_at <= ? RETURNING mailbox_id, size, body IS NOT NULL";

/// The sweep's forgotten mailboxes, through `am_mailboxes_receive_until` (0012).
const SWEEP_MAILBOXES: &str = "DELETE FROM am_mailboxes WHERE receive_until <= ?";

/// Reclaims what the protocol no longer needs: packet rows (bodies and tombstones) once the
/// packet expired, mailboxes whose current card's `receive_until` passed (every packet and
/// tombstone has expired by then, so no retry can be mistaken for a new packet), and nonce cache
/// entries past their validity.
fn sweep(db: &SyncDb, req: &Sweep, _: &Hub) -> rusqlite::Result<AmSweepReport> {
    // Through `am_packets_expires` (0012); the counters of each mailbox lose what it held.
    let mut freed: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut packets = 0_usize;
    {
        let mut expired = db.prepare_cached(SWEEP_EXPIRED)?;
        let mut rows = expired.query([req.now])?;
        while let Some(row) = rows.next()? {
            packets += 1;
            if row.get::<_, bool>(2)? {
                let held = freed.entry(row.get(0)?).or_default();
                held.0 += 1;
                held.1 += row.get::<_, i64>(1)?;
            }
        }
    }
    for (mailbox, (n, bytes)) in &freed {
        db.prepare_cached(
            "UPDATE am_mailboxes SET stored_packets = stored_packets - ?, stored_bytes = stored_bytes - ? \
             WHERE mailbox_id = ?",
        )?
        .execute((n, bytes, mailbox))?;
    }
    db.prepare_cached(
        "DELETE FROM am_blocked WHERE mailbox_id IN (SELECT mailbox_id FROM am_mailboxes WHERE receive_until <= ?)",
    )?
    .execute([req.now])?;
    db.prepare_cached(
        "DELETE FROM am_packets WHERE mailbox_id IN (SELECT mailbox_id FROM am_mailboxes WHERE receive_until <= ?)",
    )?
    .execute([req.now])?;
    let mailboxes = db.prepare_cached(SWEEP_MAILBOXES)?.execute([req.now])?;
    let nonces = db.prepare_cached("DELETE FROM am_nonces WHERE valid_until <= ?")?.execute([req.now])?;
    Ok(AmSweepReport { packets: rows(packets), mailboxes: rows(mailboxes), nonces: rows(nonces) })
}

fn block(db: &SyncDb, req: &Block, _: &Hub) -> rusqlite::Result<()> {
    let sql = if req.blocked {
        "INSERT OR IGNORE INTO am_blocked (mailbox_id, sender) VALUES (?, ?)"
    } else {
        "DELETE FROM am_blocked WHERE mailbox_id = ? AND sender = ?"
    };
    db.prepare_cached(sql)?.execute((req.mailbox.to_string(), req.sender.to_string()))?;
    Ok(())
}

/// One stored packet for an owner list.
#[derive(Debug, Clone)]
pub struct StoredPacket {
    /// Mailbox sequence number.
    pub seq: u64,
    /// First acceptance time.
    pub accepted_at: i64,
    /// The packet as accepted (JCS).
    pub body: Vec<u8>,
}

async fn list(
    pool: &SqlitePool,
    mailbox: &Id16,
    after: u64,
    limit: usize,
    now: i64,
) -> Result<Vec<StoredPacket>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT seq, accepted_at, body FROM am_packets WHERE mailbox_id = ? AND seq > ? AND body IS NOT NULL \
         AND expires_at > ? ORDER BY seq LIMIT ?",
    )
    .bind(mailbox.to_string())
    .bind(to_i64(after))
    .bind(now)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| {
            let seq: i64 = row.try_get("seq")?;
            Ok(StoredPacket {
                seq: seq.max(0).unsigned_abs(),
                accepted_at: row.try_get("accepted_at")?,
                body: row.try_get("body")?,
            })
        })
        .collect()
}

/// Agent Mail 1.0 storage: current cards, the live-write nonce cache, accepted packets and
/// their tombstones, sender blocks. Writes decide inside the writer's transaction.
#[async_trait]
pub trait AgentMailStore: Send + Sync {
    /// Decides and (on acceptance) stores a verified card as its mailbox's current card.
    async fn publish(&self, card: MailboxCard, origin: Origin, now: i64) -> Result<Decided<Published>, StoreError>;

    /// Decides and (on acceptance) stores a verified packet delivered to `path`.
    async fn deliver(
        &self,
        packet: Packet,
        path: Id16,
        origins: Arc<PublicOrigins>,
        quota: Quota,
        now: i64,
    ) -> Result<Decided<DeliveryResult>, StoreError>;

    /// Deletes a packet's ciphertext, keeping its tombstone; absent packets are fine.
    async fn delete(&self, mailbox: Id16, packet_id: Hash32) -> Result<(), StoreError>;

    /// Blocks (or unblocks) new packets from `sender` to `mailbox`; idempotent.
    async fn block(&self, mailbox: Id16, sender: AgentId, blocked: bool) -> Result<(), StoreError>;

    /// Reclaims expired packets and tombstones, forgettable mailboxes and stale nonce entries.
    async fn sweep(&self, now: i64) -> Result<AmSweepReport, StoreError>;

    /// The current card of `mailbox`.
    async fn card(&self, mailbox: &Id16) -> Result<Option<CurrentCard>, StoreError>;

    /// Up to `limit` undeleted, unexpired packets of `mailbox` with seq above `after`.
    async fn list(&self, mailbox: &Id16, after: u64, limit: usize, now: i64) -> Result<Vec<StoredPacket>, StoreError>;
}

#[async_trait]
impl AgentMailStore for SqliteStore {
    async fn publish(&self, card: MailboxCard, origin: Origin, now: i64) -> Result<Decided<Published>, StoreError> {
        self.submit(Publish { card, origin, now }).await
    }

    async fn deliver(
        &self,
        packet: Packet,
        path: Id16,
        origins: Arc<PublicOrigins>,
        quota: Quota,
        now: i64,
    ) -> Result<Decided<DeliveryResult>, StoreError> {
        self.submit(Deliver::new(packet, path, origins, quota, now)).await
    }

    async fn delete(&self, mailbox: Id16, packet_id: Hash32) -> Result<(), StoreError> {
        self.submit(Delete { mailbox, packet_id }).await
    }

    async fn block(&self, mailbox: Id16, sender: AgentId, blocked: bool) -> Result<(), StoreError> {
        self.submit(Block { mailbox, sender, blocked }).await
    }

    async fn sweep(&self, now: i64) -> Result<AmSweepReport, StoreError> {
        self.submit(Sweep { now }).await
    }

    async fn card(&self, mailbox: &Id16) -> Result<Option<CurrentCard>, StoreError> {
        Ok(current_card(&self.read, mailbox).await?)
    }

    async fn list(&self, mailbox: &Id16, after: u64, limit: usize, now: i64) -> Result<Vec<StoredPacket>, StoreError> {
        Ok(list(&self.read, mailbox, after, limit, now).await?)
    }
}

impl Store {
    /// Agent Mail 1.0 storage.
    pub fn agent_mail(&self) -> &dyn AgentMailStore {
        &*self.agent_mail
    }

    /// Decides and (on acceptance) stores a verified card (see [`AgentMailStore::publish`]).
    pub async fn am_publish(
        &self,
        card: MailboxCard,
        origin: Origin,
        now: i64,
    ) -> Result<Decided<Published>, StoreError> {
        self.agent_mail.publish(card, origin, now).await
    }

    /// Decides and (on acceptance) stores a verified packet (see [`AgentMailStore::deliver`]).
    pub async fn am_deliver(
        &self,
        packet: Packet,
        path: Id16,
        origins: Arc<PublicOrigins>,
        quota: Quota,
        now: i64,
    ) -> Result<Decided<DeliveryResult>, StoreError> {
        self.agent_mail.deliver(packet, path, origins, quota, now).await
    }

    /// Reclaims expired packets and tombstones, forgettable mailboxes and stale nonce entries.
    pub async fn am_sweep(&self, now: i64) -> Result<AmSweepReport, StoreError> {
        self.agent_mail.sweep(now).await
    }

    /// Deletes a packet's ciphertext, keeping its tombstone; absent packets are fine.
    pub async fn am_delete(&self, mailbox: Id16, packet_id: Hash32) -> Result<(), StoreError> {
        self.agent_mail.delete(mailbox, packet_id).await
    }

    /// Blocks (or unblocks) new packets from `sender` to `mailbox`; idempotent.
    pub async fn am_block(&self, mailbox: Id16, sender: AgentId, blocked: bool) -> Result<(), StoreError> {
        self.agent_mail.block(mailbox, sender, blocked).await
    }

    /// The current card of `mailbox`.
    pub async fn am_card(&self, mailbox: &Id16) -> Result<Option<CurrentCard>, StoreError> {
        self.agent_mail.card(mailbox).await
    }

    /// Up to `limit` undeleted, unexpired packets of `mailbox` with seq above `after`.
    pub async fn am_list(
        &self,
        mailbox: &Id16,
        after: u64,
        limit: usize,
        now: i64,
    ) -> Result<Vec<StoredPacket>, StoreError> {
        self.agent_mail.list(mailbox, after, limit, now).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use sqlx::ConnectOptions as _;

    use super::*;

    /// The sweep's deletes read an index range, not every packet or mailbox: it runs on the one
    /// writer every minute, and until 0012 its scan and recount stalled every write for ~0.5 s
    /// per 100,000 packets.
    #[tokio::test]
    async fn the_sweep_reads_index_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("db.sqlite3"))
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        sqlx::migrate!("./migrations").run(&mut conn).await.unwrap();
        for (sql, index) in [
            (SWEEP_EXPIRED, "INDEX am_packets_expires (expires_at<?)"),
            (SWEEP_MAILBOXES, "INDEX am_mailboxes_receive_until (receive_until<?)"),
        ] {
            let plan: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .bind(0_i64)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap();
            assert!(plan.iter().any(|(_, _, _, d)| d.ends_with(index)), "{sql}: {plan:?}");
        }
    }
}
