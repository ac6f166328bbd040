//! What the person's window needs of the letmeknow tables: local group names, which session is
//! in a group, a group's history page and marking it read (the log itself is written by
//! `engine::groups`).

use std::collections::BTreeMap;

use sqlx::SqliteConnection;

use super::{Result, Store};

/// One row of a group's local log, as a conversation shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GroupLogRow {
    /// Local row id: the order rows arrived in.
    pub rowid_: i64,
    /// Message id (b64u hash of the ciphertext), or `joined:N` / `alert:…` for local rows.
    pub id: String,
    /// Log position on the relay (0 while sending, and for local rows).
    pub seq: i64,
    /// `message`, `leave`, `event` or `alert`.
    pub kind: String,
    /// `done`, `sending` or `commit_pending`.
    pub state: String,
    /// Written by this session.
    pub outgoing: i64,
    /// Sender's fingerprint.
    pub sender_fp: String,
    /// Sender's display name (as its credential claims).
    pub sender_name: String,
    /// Addressed member's fingerprint, or empty.
    pub to_fp: String,
    /// Message id answered, or empty.
    pub reply_to: String,
    /// The text.
    pub content: String,
    /// Entered the session's context.
    pub read: i64,
    /// Unix ms.
    pub created_at: i64,
}

impl Store {
    /// Every group's local name.
    pub async fn group_names(&self) -> Result<BTreeMap<String, String>> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT group_id, name FROM lmk_group_names").fetch_all(&self.pool).await?;
        Ok(rows.into_iter().collect())
    }

    /// Sets (or replaces) a group's local name.
    pub async fn set_group_name(&self, group: &str, name: &str, now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO lmk_group_names (group_id, name, updated_at) VALUES (?, ?, ?) \
             ON CONFLICT (group_id) DO UPDATE SET name = excluded.name, updated_at = excluded.updated_at",
        )
        .bind(group)
        .bind(name)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The sessions that are (or were) in `group`, with their membership state, oldest session
    /// first.
    pub async fn group_sessions(&self, group: &str) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(
            "SELECT g.handle, g.state FROM lmk_groups g JOIN lmk_sessions s ON s.handle = g.handle \
             WHERE g.group_id = ? ORDER BY s.created_at, g.handle",
        )
        .bind(group)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The newest `limit` rows of `group` in `handle`'s log before row `before` (all when
    /// `None`), oldest first.
    pub async fn group_log_page(
        &self,
        handle: &str,
        group: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<GroupLogRow>> {
        Ok(sqlx::query_as(
            "SELECT * FROM (SELECT rowid_, id, seq, kind, state, outgoing, sender_fp, sender_name, to_fp, reply_to, \
             content, read, created_at FROM lmk_messages WHERE handle = ?1 AND group_id = ?2 AND rowid_ < ?3 \
             ORDER BY rowid_ DESC LIMIT ?4) ORDER BY rowid_",
        )
        .bind(handle)
        .bind(group)
        .bind(before.unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Marks `handle`'s rows of `group` up to row `upto` read (they entered its context); the
    /// number of rows that changed.
    pub async fn mark_group_read(&self, handle: &str, group: &str, upto: i64) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE lmk_messages SET read = 1 WHERE handle = ? AND group_id = ? AND rowid_ <= ? AND read = 0 \
             AND state = 'done'",
        )
        .bind(handle)
        .bind(group)
        .bind(upto)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Whether a local agent session goes by `name` (an agent may act as a group session).
    pub async fn is_agent(&self, name: &str) -> Result<bool> {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM agents WHERE name = ?").bind(name).fetch_optional(&self.pool).await?;
        Ok(found.is_some())
    }

    /// The names of the members of `group` that `handle` noted, but for fingerprint `me`.
    pub async fn group_member_names(&self, handle: &str, group: &str, me: &str) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT name FROM lmk_member_notes WHERE handle = ? AND group_id = ? AND fingerprint != ? ORDER BY name",
        )
        .bind(handle)
        .bind(group)
        .bind(me)
        .fetch_all(&self.pool)
        .await?)
    }
}

/// Names `group` unless it has a name already (a join keeps what the person chose before).
pub async fn name_group_if_unnamed(conn: &mut SqliteConnection, group: &str, name: &str, now: i64) -> Result<()> {
    sqlx::query("INSERT INTO lmk_group_names (group_id, name, updated_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING")
        .bind(group)
        .bind(name)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(())
}
