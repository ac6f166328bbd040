//! Local agents and what the operator decides for them: `agents` (registered sessions and their
//! presence), `agent_tokens` (bridge session tokens, stored hashed), the per-contact outbound mode
//! in `conversations`, `review_queue` (agent sends held for the operator), and how far each
//! message addressed to a local agent was handed out to it (read from `agent_deliveries`).

use sqlx::{QueryBuilder, Sqlite};

use super::{Result, Store};

/// How far a message addressed to a local agent got to it (`agent_deliveries`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Handout {
    /// The message's local row.
    pub message: i64,
    /// The agent.
    pub agent: String,
    /// queued | paused | handed | delivered | skipped.
    pub state: String,
    /// When the agent acknowledged it (ms), 0 before.
    pub delivered_at: i64,
}

/// A held send as the review list shows it: for a contact (1:1), a letmeknow group, or an ASNET
/// challenge.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ReviewItem {
    /// Review id.
    pub id: i64,
    /// The agent (or group session) that wrote it.
    pub agent: String,
    /// The contact's name, for a 1:1 send.
    pub contact: Option<String>,
    /// Message kind.
    pub kind: String,
    /// The text (for ASNET, the action as JSON).
    pub body: String,
    /// The message it answers.
    pub reply_to: Option<String>,
    /// The peer's agent it names.
    pub to_agent: Option<String>,
    /// When it was held (ms).
    pub created_at: i64,
    /// The group, for a group send.
    pub group_id: Option<String>,
    /// The addressed member's fingerprint, for a group send.
    pub to_fp: Option<String>,
    /// The ASNET challenge it answers, if any.
    pub challenge_id: Option<String>,
    /// When that challenge expires.
    pub expires_at: Option<i64>,
}

/// A held group send.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct HeldGroupSend {
    /// The group session that wrote it.
    pub agent: String,
    /// The group.
    pub group_id: String,
    /// The text.
    pub body: String,
    /// The addressed member's fingerprint.
    pub to_fp: Option<String>,
    /// The message it answers.
    pub reply_to: Option<String>,
}

/// A held 1:1 send.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct HeldSend {
    /// The agent that wrote it.
    pub agent: String,
    /// The contact's name.
    pub contact: String,
    /// Message kind.
    pub kind: String,
    /// The text.
    pub body: String,
    /// The message it answers.
    pub reply_to: Option<String>,
    /// The peer's agent it names.
    pub to_agent: Option<String>,
    /// The contact's row id.
    pub contact_id: i64,
}

impl Store {
    /// Registers (or refreshes) local agent `name`, online.
    pub async fn register_agent(&self, name: &str, harness: &str, where_: &str, now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO agents (name, harness, status, where_, updated_at) VALUES (?, ?, 'online', ?, ?) \
             ON CONFLICT(name) DO UPDATE SET harness = excluded.harness, status = 'online', updated_at = excluded.updated_at",
        )
        .bind(name)
        .bind(harness)
        .bind(where_)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Forgets local agent `name`; whether there was one.
    pub async fn unregister_agent(&self, name: &str) -> Result<bool> {
        let n = sqlx::query("DELETE FROM agents WHERE name = ?").bind(name).execute(&self.pool).await?.rows_affected();
        Ok(n > 0)
    }

    /// Stores a session token's hash for `agent`.
    pub async fn insert_agent_token(&self, token_hash: &[u8], agent: &str, harness: &str, now: i64) -> Result<()> {
        sqlx::query("INSERT INTO agent_tokens (token_hash, agent, harness, created_at) VALUES (?, ?, ?, ?)")
            .bind(token_hash)
            .bind(agent)
            .bind(harness)
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The agent whose session token hashes to `token_hash`.
    pub async fn agent_for_token_hash(&self, token_hash: &[u8]) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT agent FROM agent_tokens WHERE token_hash = ?")
            .bind(token_hash)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Deletes the session token hashing to `token_hash`; its agent, if there was one.
    pub async fn delete_agent_token(&self, token_hash: &[u8]) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("DELETE FROM agent_tokens WHERE token_hash = ? RETURNING agent")
            .bind(token_hash)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Marks `agent` offline unless it still holds a session token.
    pub async fn offline_unless_session(&self, agent: &str, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE agents SET status = 'offline', updated_at = ? WHERE name = ? \
             AND NOT EXISTS (SELECT 1 FROM agent_tokens WHERE agent = ?)",
        )
        .bind(now)
        .bind(agent)
        .bind(agent)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Forgets every session token.
    pub async fn delete_agent_tokens(&self) -> Result<()> {
        sqlx::query("DELETE FROM agent_tokens").execute(&self.pool).await?;
        Ok(())
    }

    /// The outbound mode set for agent sends to contact `contact_id`, if one was.
    pub async fn conversation_outbound(&self, contact_id: i64) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT outbound FROM conversations WHERE contact_id = ?")
            .bind(contact_id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Sets the outbound mode of agent sends to contact `contact_id`.
    pub async fn set_conversation_outbound(&self, contact_id: i64, mode: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO conversations (contact_id, outbound) VALUES (?, ?) \
             ON CONFLICT(contact_id) DO UPDATE SET outbound = excluded.outbound",
        )
        .bind(contact_id)
        .bind(mode)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Holds `agent`'s send to contact `contact_id` for review; its review id.
    #[allow(clippy::too_many_arguments)]
    pub async fn hold_send(
        &self,
        agent: &str,
        contact_id: i64,
        kind: &str,
        body: &str,
        reply_to: Option<&str>,
        to_agent: Option<&str>,
        now: i64,
    ) -> Result<i64> {
        Ok(sqlx::query(
            "INSERT INTO review_queue (agent, contact_id, kind, body, reply_to, to_agent, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(agent)
        .bind(contact_id)
        .bind(kind)
        .bind(body)
        .bind(reply_to)
        .bind(to_agent)
        .bind(now)
        .execute(&self.pool)
        .await?
        .last_insert_rowid())
    }

    /// Every pending review, oldest first.
    pub async fn pending_reviews(&self) -> Result<Vec<ReviewItem>> {
        Ok(sqlx::query_as(
            "SELECT r.id, r.agent, c.name AS contact, r.kind, r.body, r.reply_to, r.to_agent, r.created_at, r.group_id, \
             r.to_fp, a.challenge_id, a.expires_at FROM review_queue r LEFT JOIN contacts c ON c.id = r.contact_id \
             LEFT JOIN asnet_challenges a ON a.challenge_id = r.asnet_challenge WHERE r.state = 'pending' ORDER BY r.id",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Pending review `id`, if it is a group send.
    pub async fn held_group_send(&self, id: i64) -> Result<Option<HeldGroupSend>> {
        Ok(sqlx::query_as(
            "SELECT agent, group_id, body, to_fp, reply_to FROM review_queue \
             WHERE id = ? AND state = 'pending' AND group_id IS NOT NULL",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Pending review `id`, if it is a send to a contact.
    pub async fn held_send(&self, id: i64) -> Result<Option<HeldSend>> {
        Ok(sqlx::query_as(
            "SELECT r.agent, c.name AS contact, r.kind, r.body, r.reply_to, r.to_agent, c.id AS contact_id \
             FROM review_queue r JOIN contacts c ON c.id = r.contact_id WHERE r.id = ? AND r.state = 'pending'",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The hand-out state of messages `rows` (local rows) to each agent they were queued for.
    pub async fn handouts(&self, rows: &[i64]) -> Result<Vec<Handout>> {
        let mut out = Vec::new();
        // SQLite binds at most 32766 parameters; a conversation page is at most 10 000 rows.
        for chunk in rows.chunks(1000) {
            let mut q: QueryBuilder<Sqlite> = QueryBuilder::new(
                "SELECT message, agent, state, delivered_at FROM agent_deliveries WHERE message IN (",
            );
            let mut list = q.separated(", ");
            for r in chunk {
                list.push_bind(*r);
            }
            q.push(")");
            out.extend(q.build_query_as::<Handout>().fetch_all(&self.pool).await?);
        }
        Ok(out)
    }

    /// Replaces the text of pending review `id` (a message, not an ASNET challenge) with the
    /// operator's edit; whether it was such a pending review.
    pub async fn edit_review(&self, id: i64, body: &str) -> Result<bool> {
        let n = sqlx::query(
            "UPDATE review_queue SET body = ? WHERE id = ? AND state = 'pending' AND asnet_challenge IS NULL",
        )
        .bind(body)
        .bind(id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n > 0)
    }

    /// Decides pending review `id` (`approved` with the message sent, or `rejected`); whether it
    /// was pending.
    pub async fn decide_review(&self, id: i64, state: &str, message_id: Option<&str>, now: i64) -> Result<bool> {
        let n = sqlx::query(
            "UPDATE review_queue SET state = ?, message_id = ?, decided_at = ? WHERE id = ? AND state = 'pending'",
        )
        .bind(state)
        .bind(message_id)
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n > 0)
    }
}
