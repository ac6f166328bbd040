//! Agent Mail 1.0 on PostgreSQL: the same requests and outcomes as
//! [`crate::store::agent_mail`], deciding with the same pure checks of
//! `switchboard_core::protocol::agent_mail::relay`.
//!
//! What serialises a decision across instances:
//! - a publication names two batch lock keys (`store::writer::Request::locks`): its
//!   actor (the live-write nonce cache) and its mailbox id (the binding to the first card's owner,
//!   which may not have a row to lock yet); the batch takes them before any write runs;
//! - a delivery names its mailbox's key, and locks its mailbox row (`FOR UPDATE`) before it reads the packet's history, the
//!   blocks and the quota counters and takes `next_seq`: the same packet through two instances
//!   is stored once, the second sees the first's row and answers the resubmission;
//! - a delete turns the packet row into its tombstone and moves the counters in one step;
//! - the sweep takes the family's advisory lock (one instance sweeps at a time) and lowers the
//!   counters by what it deleted (never a recount, which could miss a concurrent delivery).

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool, Row as _};
use switchboard_core::protocol::agent_identity::live_write::{DEFAULT_WINDOW_MS, LiveWrite, NonceCacheEntry};
use switchboard_core::protocol::agent_identity::{AgentId, Hash32, Origin};
use switchboard_core::protocol::agent_mail::Id16;
use switchboard_core::protocol::agent_mail::card::MailboxCard;
use switchboard_core::protocol::agent_mail::packet::Packet;
use switchboard_core::protocol::agent_mail::relay::{self, Admission, CurrentCard, Delivery, DeliveryResult};

use super::{PgStore, sweep_lock, try_sweep_lock};
use crate::origin::PublicOrigins;
use crate::store::StoreError;
use crate::store::agent_mail::{
    AgentMailStore, AmSweepReport, Block, Decided, Delete, Deliver, Publish, Published, Quota, Refusal, StoredPacket,
    Sweep, corrupt, parse_current, to_i64, verified_card,
};
use crate::store::writer::request;

async fn current_card(db: impl sqlx::PgExecutor<'_>, mailbox: &Id16) -> Result<Option<CurrentCard>, sqlx::Error> {
    let row = sqlx::query("SELECT card, accepted_at FROM am_mailboxes WHERE mailbox_id = $1")
        .bind(mailbox.to_string())
        .fetch_optional(db)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let bytes: Vec<u8> = row.try_get("card")?;
    Ok(Some(parse_current(&bytes, row.try_get("accepted_at")?)?))
}

async fn publish(conn: &mut PgConnection, req: &Publish) -> Result<Decided<Published>, sqlx::Error> {
    let mailbox = req.card.mailbox_id();
    let actor = req.card.owner().to_string();
    let current = current_card(&mut *conn, &mailbox).await?;
    let nonces = sqlx::query("SELECT max_nonce, valid_until FROM am_nonces WHERE actor = $1")
        .bind(&actor)
        .fetch_optional(&mut *conn)
        .await?
        .map(|row| -> Result<_, sqlx::Error> {
            let max: i64 = row.try_get("max_nonce")?;
            Ok(NonceCacheEntry { max_nonce: max.max(0).unsigned_abs(), valid_until: row.try_get("valid_until")? })
        })
        .transpose()?;
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
            sqlx::query(
                "INSERT INTO am_nonces (actor, max_nonce, valid_until) VALUES ($1, $2, $3) \
                 ON CONFLICT (actor) DO UPDATE SET max_nonce = excluded.max_nonce, valid_until = excluded.valid_until",
            )
            .bind(&actor)
            .bind(to_i64(entry.max_nonce))
            .bind(entry.valid_until)
            .execute(&mut *conn)
            .await?;
            sqlx::query(
                "INSERT INTO am_mailboxes (mailbox_id, owner, card, accepted_at, receive_until) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (mailbox_id) DO UPDATE SET card = excluded.card, \
                 accepted_at = excluded.accepted_at, receive_until = excluded.receive_until",
            )
            .bind(mailbox.to_string())
            .bind(&actor)
            .bind(req.card.to_jcs())
            .bind(req.now)
            .bind(req.card.payload().receive_until)
            .execute(&mut *conn)
            .await?;
            let current = CurrentCard { card: req.card.clone(), accepted_at: req.now };
            Ok(Ok(Published { current, resubmission: false }))
        }
    }
}

/// Whether one more packet of `size` bytes fits `mailbox`'s quota at `now` (the counters bound
/// the exact figures from above; count exactly only when they say no). The mailbox row is
/// locked by the caller.
async fn within_quota(
    conn: &mut PgConnection,
    mailbox: &str,
    size: i64,
    quota: Quota,
    now: i64,
) -> Result<bool, sqlx::Error> {
    let fits = |count: i64, bytes: i64| count < quota.packets && bytes.saturating_add(size) <= quota.bytes;
    let (count, bytes): (i64, i64) =
        sqlx::query_as("SELECT stored_packets, stored_bytes FROM am_mailboxes WHERE mailbox_id = $1")
            .bind(mailbox)
            .fetch_one(&mut *conn)
            .await?;
    if fits(count, bytes) {
        return Ok(true);
    }
    let (count, bytes): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COALESCE(SUM(size), 0)::BIGINT FROM am_packets \
         WHERE mailbox_id = $1 AND body IS NOT NULL AND expires_at > $2",
    )
    .bind(mailbox)
    .bind(now)
    .fetch_one(&mut *conn)
    .await?;
    Ok(fits(count, bytes))
}

async fn deliver(conn: &mut PgConnection, req: &Deliver) -> Result<Decided<DeliveryResult>, sqlx::Error> {
    let id = req.packet.id();
    let mailbox = req.path.to_string();
    // The lock first: the history, blocks, quota and seq below are then this delivery's alone.
    let card: Option<Vec<u8>> = sqlx::query_scalar("SELECT card FROM am_mailboxes WHERE mailbox_id = $1 FOR UPDATE")
        .bind(&mailbox)
        .fetch_optional(&mut *conn)
        .await?;
    let current = card.map(|bytes| verified_card(&mailbox, bytes)).transpose()?;
    let seen: Option<i64> = sqlx::query_scalar("SELECT accepted_at FROM am_packets WHERE packet_id = $1")
        .bind(id.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    let seen = seen.map(|accepted_at| DeliveryResult { packet_id: id, accepted_at });
    let blocked: Option<i32> = sqlx::query_scalar("SELECT 1 FROM am_blocked WHERE mailbox_id = $1 AND sender = $2")
        .bind(&mailbox)
        .bind(req.packet.sender().to_string())
        .fetch_optional(&mut *conn)
        .await?;
    let admission = if blocked.is_some() { Admission::Deny } else { Admission::Allow };
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
            if !within_quota(conn, &mailbox, size, req.quota, req.now).await? {
                return Ok(Err(Refusal::Quota));
            }
            let seq: i64 = sqlx::query_scalar(
                "UPDATE am_mailboxes SET next_seq = next_seq + 1, stored_packets = stored_packets + 1, \
                 stored_bytes = stored_bytes + $1 WHERE mailbox_id = $2 RETURNING next_seq - 1",
            )
            .bind(size)
            .bind(&mailbox)
            .fetch_one(&mut *conn)
            .await?;
            sqlx::query(
                "INSERT INTO am_packets (packet_id, mailbox_id, seq, accepted_at, expires_at, size, body) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(id.to_string())
            .bind(&mailbox)
            .bind(seq)
            .bind(req.now)
            .bind(req.packet.header().expires_at)
            .bind(size)
            .bind(&req.body)
            .execute(&mut *conn)
            .await?;
            Ok(Ok(DeliveryResult { packet_id: id, accepted_at: req.now }))
        }
    }
}

async fn delete(conn: &mut PgConnection, req: &Delete) -> Result<(), sqlx::Error> {
    // The row stays as the acceptance tombstone; only the ciphertext goes.
    sqlx::query(
        "WITH freed AS (UPDATE am_packets SET body = NULL \
         WHERE packet_id = $1 AND mailbox_id = $2 AND body IS NOT NULL RETURNING mailbox_id, size) \
         UPDATE am_mailboxes AS m SET stored_packets = m.stored_packets - 1, stored_bytes = m.stored_bytes - f.size \
         FROM freed AS f WHERE m.mailbox_id = f.mailbox_id",
    )
    .bind(req.packet_id.to_string())
    .bind(req.mailbox.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn block(conn: &mut PgConnection, req: &Block) -> Result<(), sqlx::Error> {
    let sql = if req.blocked {
        "INSERT INTO am_blocked (mailbox_id, sender) VALUES ($1, $2) ON CONFLICT DO NOTHING"
    } else {
        "DELETE FROM am_blocked WHERE mailbox_id = $1 AND sender = $2"
    };
    sqlx::query(sql).bind(req.mailbox.to_string()).bind(req.sender.to_string()).execute(&mut *conn).await?;
    Ok(())
}

/// Reclaims what the protocol no longer needs, as on SQLite: expired packet rows (bodies and
/// tombstones), mailboxes whose card's `receive_until` passed, stale nonce entries.
async fn sweep(conn: &mut PgConnection, req: &Sweep) -> Result<AmSweepReport, sqlx::Error> {
    if !try_sweep_lock(conn, sweep_lock::AGENT_MAIL).await? {
        tracing::debug!("another instance is sweeping agent mail");
        return Ok(AmSweepReport::default());
    }
    let packets: i64 = sqlx::query_scalar(
        "WITH gone AS (DELETE FROM am_packets WHERE expires_at <= $1 \
                       RETURNING mailbox_id, size, body IS NOT NULL AS stored), \
         freed AS (SELECT mailbox_id, COUNT(*) FILTER (WHERE stored) AS n, \
                          COALESCE(SUM(size) FILTER (WHERE stored), 0) AS bytes FROM gone GROUP BY mailbox_id), \
         lowered AS (UPDATE am_mailboxes AS m SET stored_packets = m.stored_packets - f.n, \
                            stored_bytes = m.stored_bytes - f.bytes \
                     FROM freed AS f WHERE m.mailbox_id = f.mailbox_id) \
         SELECT COUNT(*) FROM gone",
    )
    .bind(req.now)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "DELETE FROM am_blocked WHERE mailbox_id IN (SELECT mailbox_id FROM am_mailboxes WHERE receive_until <= $1)",
    )
    .bind(req.now)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "DELETE FROM am_packets WHERE mailbox_id IN (SELECT mailbox_id FROM am_mailboxes WHERE receive_until <= $1)",
    )
    .bind(req.now)
    .execute(&mut *conn)
    .await?;
    let mailboxes =
        sqlx::query("DELETE FROM am_mailboxes WHERE receive_until <= $1").bind(req.now).execute(&mut *conn).await?;
    let nonces = sqlx::query("DELETE FROM am_nonces WHERE valid_until <= $1").bind(req.now).execute(&mut *conn).await?;
    Ok(AmSweepReport {
        packets: u64::try_from(packets).unwrap_or(0),
        mailboxes: mailboxes.rows_affected(),
        nonces: nonces.rows_affected(),
    })
}

/// The batch lock key of a mailbox (its binding, card, counters, blocks and packets).
fn mailbox_lock(mailbox: &Id16) -> String {
    format!("am/mailbox/{mailbox}")
}

request!(PgConnection, Publish => Decided<Published>, publish, {
    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(format!("am/actor/{}", self.card.owner()));
        keys.push(mailbox_lock(&self.card.mailbox_id()));
    }
});
request!(PgConnection, Deliver => Decided<DeliveryResult>, deliver, {
    fn bytes(&self) -> usize {
        self.payload_bytes()
    }

    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(mailbox_lock(&self.path));
    }
});
request!(PgConnection, Delete => (), delete, {
    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(mailbox_lock(&self.mailbox));
    }
});
request!(PgConnection, Block => (), block, {
    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(mailbox_lock(&self.mailbox));
    }
});
request!(PgConnection, Sweep => AmSweepReport, sweep);

async fn list(
    pool: &PgPool,
    mailbox: &Id16,
    after: u64,
    limit: usize,
    now: i64,
) -> Result<Vec<StoredPacket>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT seq, accepted_at, body FROM am_packets WHERE mailbox_id = $1 AND seq > $2 AND body IS NOT NULL \
         AND expires_at > $3 ORDER BY seq LIMIT $4",
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

#[async_trait]
impl AgentMailStore for PgStore {
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
