//! The per-agent delivery queue of 1:1 messages: `agent_floors` (where each agent's queue starts
//! and how far it was classified), `agent_deliveries` (each message's mode and state for each
//! agent, under leases) and `conversations` (the loop guard's operator-input mark per contact).
//! The policy that decides what goes where is the engine's (`engine::delivery`).

use sqlx::{SqliteConnection, SqliteExecutor};

use super::{MessageRow, Result, Store};

/// An incoming message not yet classified for an agent.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UnclassifiedMessage {
    /// The message row.
    pub rowid_: i64,
    /// Its contact.
    pub contact_id: Option<i64>,
    /// The local agent it names, if any.
    pub to_agent: Option<String>,
    /// The message it answers, if any.
    pub reply_to: Option<String>,
    /// When it was stored (ms).
    pub created_at: i64,
}

/// A delivery due to be handed out.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DueDelivery {
    /// The message row.
    pub message: i64,
    /// `steer` or `digest`.
    pub mode: String,
    /// How often it was handed out before.
    pub handed_count: i64,
}

/// [`conversation_hops`]: through `messages_by_contact` (0021), from the last operator input on.
pub(crate) const CONVERSATION_HOPS: &str = "SELECT COUNT(*) FROM (SELECT 1 FROM messages WHERE contact_id = ?1 \
     AND rowid_ > COALESCE((SELECT reset_rowid FROM conversations WHERE contact_id = ?1), 0) \
     AND rowid_ <= ?2 AND kind IN ('send', 'ask', 'reply') AND (direction = 'out' OR state = 'received') \
     LIMIT ?3)";

/// [`delivery_lease_holders`]: in `agent_deliveries_lease` (0006), which `lease != ''` lets
/// SQLite use (a lease never is empty); without it every ack read every delivery.
pub(crate) const DELIVERY_LEASE_HOLDERS: &str =
    "SELECT DISTINCT agent FROM agent_deliveries WHERE lease = ? AND lease != ''";

/// [`handed_under`]: as [`DELIVERY_LEASE_HOLDERS`].
pub(crate) const HANDED_UNDER: &str = "SELECT d.message, m.id FROM agent_deliveries d JOIN messages m \
     ON m.rowid_ = d.message WHERE d.lease = ? AND d.lease != '' AND d.state = 'handed'";

/// [`ack_delivery`]: as [`DELIVERY_LEASE_HOLDERS`].
pub(crate) const ACK_DELIVERY: &str = "UPDATE agent_deliveries SET state = 'delivered', delivered_at = ? \
     WHERE lease = ? AND lease != '' AND message = ? AND state = 'handed'";

/// [`sent_by`]: through `messages_by_id` (0021).
pub(crate) const SENT_BY: &str = "SELECT COUNT(*) FROM messages WHERE direction = 'out' AND id = ? AND from_agent = ?";

/// Agent-to-agent hops in the conversation with `contact_id` since its last operator input,
/// counting messages up to row `upto`, and no further than `cap` (what the loop guard compares
/// needs no more: the count then reads at most `cap` hops of `messages_by_contact`, 0021).
pub async fn conversation_hops(ex: impl SqliteExecutor<'_>, contact_id: i64, upto: i64, cap: i64) -> Result<i64> {
    Ok(sqlx::query_scalar(CONVERSATION_HOPS).bind(contact_id).bind(upto).bind(cap).fetch_one(ex).await?)
}

/// Operator input in the conversation with `contact_id`: the loop guard counts from the newest
/// message on.
pub async fn reset_conversation(conn: &mut SqliteConnection, contact_id: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO conversations (contact_id, reset_rowid) VALUES (?1, (SELECT COALESCE(MAX(rowid_), 0) FROM messages)) \
         ON CONFLICT(contact_id) DO UPDATE SET reset_rowid = excluded.reset_rowid",
    )
    .bind(contact_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Queues again, due `now`, every paused delivery of the conversation with `contact_id`; how
/// many.
pub async fn release_paused(conn: &mut SqliteConnection, contact_id: i64, now: i64) -> Result<u64> {
    Ok(sqlx::query(
        // By agent and state (`agent_deliveries_queued`): the key wants the agent first.
        "UPDATE agent_deliveries SET state = 'queued', due_at = ?2 WHERE agent IN (SELECT name FROM agents) \
         AND state = 'paused' AND message IN (SELECT rowid_ FROM messages WHERE contact_id = ?1)",
    )
    .bind(contact_id)
    .bind(now)
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

/// (floor, scanned) of `agent`'s queue; (0, 0) when it has none.
pub async fn agent_floor(conn: &mut SqliteConnection, agent: &str) -> Result<(i64, i64)> {
    Ok(sqlx::query_as("SELECT floor_rowid, scanned_rowid FROM agent_floors WHERE agent = ?")
        .bind(agent)
        .fetch_optional(&mut *conn)
        .await?
        .unwrap_or((0, 0)))
}

/// Up to `limit` received send/ask/reply rows above row `above` that `agent`'s queue has not
/// classified, but for blocked contacts', in row order.
pub async fn unclassified_messages(
    conn: &mut SqliteConnection,
    agent: &str,
    above: i64,
    limit: i64,
) -> Result<Vec<UnclassifiedMessage>> {
    Ok(sqlx::query_as(
        // `+direction`: walk the rowid range above the mark, not the direction index (which
        // holds every incoming row).
        "SELECT m.rowid_, m.contact_id, m.to_agent, m.reply_to, m.created_at FROM messages m \
         WHERE +m.direction = 'in' AND m.state = 'received' AND m.kind IN ('send', 'ask', 'reply') \
         AND m.rowid_ > ?2 AND NOT EXISTS (SELECT 1 FROM agent_deliveries d WHERE d.agent = ?1 AND d.message = m.rowid_) \
         AND NOT EXISTS (SELECT 1 FROM contacts c WHERE c.id = m.contact_id AND c.blocked = 1) \
         ORDER BY m.rowid_ LIMIT ?3",
    )
    .bind(agent)
    .bind(above)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?)
}

/// The newest message row id (0 when there is none).
pub async fn newest_message_rowid(conn: &mut SqliteConnection) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT COALESCE(MAX(rowid_), 0) FROM messages").fetch_one(&mut *conn).await?)
}

/// `agent`'s queue has classified every row up to `rowid`.
pub async fn set_scanned(conn: &mut SqliteConnection, agent: &str, rowid: i64) -> Result<()> {
    sqlx::query("UPDATE agent_floors SET scanned_rowid = ? WHERE agent = ?")
        .bind(rowid)
        .bind(agent)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Every local agent's name.
pub async fn agent_names(conn: &mut SqliteConnection) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar("SELECT name FROM agents").fetch_all(&mut *conn).await?)
}

/// Whether `agent` sent message `id`.
pub async fn sent_by(conn: &mut SqliteConnection, id: &str, agent: &str) -> Result<bool> {
    let n: i64 = sqlx::query_scalar(SENT_BY).bind(id).bind(agent).fetch_one(&mut *conn).await?;
    Ok(n > 0)
}

/// Classifies message `rowid` for `agent` (kept if it was classified already).
pub async fn insert_delivery(
    conn: &mut SqliteConnection,
    agent: &str,
    rowid: i64,
    mode: &str,
    state: &str,
    due_at: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO agent_deliveries (agent, message, mode, state, due_at) VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT DO NOTHING",
    )
    .bind(agent)
    .bind(rowid)
    .bind(mode)
    .bind(state)
    .bind(due_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Up to 200 of `agent`'s deliveries to hand out: queued and due by `until`, or handed under a
/// lease given by `expired` (run out), in message order.
pub async fn due_deliveries(
    conn: &mut SqliteConnection,
    agent: &str,
    until: i64,
    expired: i64,
) -> Result<Vec<DueDelivery>> {
    Ok(sqlx::query_as(
        // Two ranges of the (agent, state, due_at) index, named so that the planner does not
        // walk every delivery the agent ever had in message order instead.
        "SELECT message, mode, handed_count FROM agent_deliveries INDEXED BY agent_deliveries_queued \
         WHERE agent = ?1 AND state = 'queued' AND due_at <= ?2 UNION ALL \
         SELECT message, mode, handed_count FROM agent_deliveries INDEXED BY agent_deliveries_queued \
         WHERE agent = ?1 AND state = 'handed' AND leased_at <= ?3 ORDER BY message LIMIT 200",
    )
    .bind(agent)
    .bind(until)
    .bind(expired)
    .fetch_all(&mut *conn)
    .await?)
}

/// Hands `agent`'s delivery of message `rowid` out under `lease`.
pub async fn hand_delivery(conn: &mut SqliteConnection, agent: &str, rowid: i64, lease: &str, now: i64) -> Result<()> {
    sqlx::query(
        "UPDATE agent_deliveries SET state = 'handed', lease = ?, leased_at = ?, \
         handed_count = handed_count + 1 WHERE agent = ? AND message = ?",
    )
    .bind(lease)
    .bind(now)
    .bind(agent)
    .bind(rowid)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The agents whose deliveries went out under `lease`.
pub async fn delivery_lease_holders(conn: &mut SqliteConnection, lease: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(DELIVERY_LEASE_HOLDERS).bind(lease).fetch_all(&mut *conn).await?)
}

/// (message row, message id) of the deliveries still handed out under `lease`.
pub async fn handed_under(conn: &mut SqliteConnection, lease: &str) -> Result<Vec<(i64, String)>> {
    Ok(sqlx::query_as(HANDED_UNDER).bind(lease).fetch_all(&mut *conn).await?)
}

/// Marks the delivery of message `rowid` under `lease` delivered if it is still handed; whether
/// it changed.
pub async fn ack_delivery(conn: &mut SqliteConnection, lease: &str, rowid: i64, now: i64) -> Result<u64> {
    Ok(sqlx::query(ACK_DELIVERY).bind(now).bind(lease).bind(rowid).execute(&mut *conn).await?.rows_affected())
}

impl Store {
    /// Agent-to-agent hops in the conversation with `contact_id`, all of them (see
    /// [`conversation_hops`]).
    pub async fn hops(&self, contact_id: i64, upto: i64) -> Result<i64> {
        conversation_hops(&self.pool, contact_id, upto, i64::MAX).await
    }

    /// Starts `agent`'s queue unless it has one: `catch_up` incoming messages before the newest
    /// are in it.
    pub async fn ensure_agent_floor(&self, agent: &str, catch_up: i64) -> Result<()> {
        // The newest rows first, by rowid (`+direction`: not by the direction index, which would
        // sort the whole history).
        sqlx::query(
            "INSERT INTO agent_floors (agent, floor_rowid) SELECT ?1, COALESCE((SELECT rowid_ FROM messages \
             WHERE +direction = 'in' AND kind IN ('send', 'ask', 'reply') ORDER BY rowid_ DESC LIMIT 1 OFFSET ?2), 0) \
             WHERE NOT EXISTS (SELECT 1 FROM agent_floors WHERE agent = ?1) ON CONFLICT(agent) DO NOTHING",
        )
        .bind(agent)
        .bind(catch_up)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// `agent`'s deliveries to hand out: queued, and handed under a lease given by
    /// `expired_before` (run out).
    pub async fn undelivered_count(&self, agent: &str, expired_before: i64) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT (SELECT COUNT(*) FROM agent_deliveries WHERE agent = ?1 AND state = 'queued') \
             + (SELECT COUNT(*) FROM agent_deliveries WHERE agent = ?1 AND state = 'handed' AND leased_at <= ?2)",
        )
        .bind(agent)
        .bind(expired_before)
        .fetch_one(&self.pool)
        .await?)
    }

    /// `agent`'s deliveries the loop guard paused.
    pub async fn paused_count(&self, agent: &str) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM agent_deliveries WHERE agent = ? AND state = 'paused'")
            .bind(agent)
            .fetch_one(&self.pool)
            .await?)
    }

    /// `agent`'s sends waiting for the operator's review.
    pub async fn held_for_review(&self, agent: &str) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM review_queue WHERE agent = ? AND state = 'pending'")
            .bind(agent)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Message row `rowid`.
    pub async fn message_by_rowid(&self, rowid: i64) -> Result<Option<MessageRow>> {
        Ok(sqlx::query_as("SELECT * FROM messages WHERE rowid_ = ?").bind(rowid).fetch_optional(&self.pool).await?)
    }

    /// `agent` read message `rowid` directly: its delivery (queued or handed) is delivered.
    pub async fn mark_read_delivered(&self, agent: &str, rowid: i64, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE agent_deliveries SET state = 'delivered', delivered_at = ? WHERE agent = ? AND message = ? \
             AND state IN ('queued', 'handed')",
        )
        .bind(now)
        .bind(agent)
        .bind(rowid)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// When `agent`'s next delivery is due to be handed out: a queued one falling due, or a
    /// lease (running `lease_ms`) expiring unacked.
    pub async fn next_delivery_at(&self, agent: &str, lease_ms: i64) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT MIN(CASE state WHEN 'queued' THEN due_at ELSE leased_at + ?2 END) FROM agent_deliveries \
             WHERE agent = ?1 AND state IN ('queued', 'handed')",
        )
        .bind(agent)
        .bind(lease_ms)
        .fetch_one(&self.pool)
        .await?)
    }
}
