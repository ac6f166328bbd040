//! What the person's window needs of the letmeknow tables: local group names, which session is
//! in a group, a group's history page and marking it read (the log itself is written by
//! `engine::groups`).

use std::collections::BTreeMap;

use sqlx::SqliteConnection;

use super::{Result, Store};

mod log;
mod sessions;
pub use log::{
    GroupMessage, NewGroupRow, ack_group_row, delete_group_row, group_lease_holders, group_lease_unread,
    group_row_insert, group_row_posted, insert_group_row, lease_group_rows, mark_group_row_read,
};
pub use sessions::{
    GroupMembership, GroupSessionRow, epoch_auth, forget_epoch_auth_from, group_state_stmts, insert_group, join_group,
    note_group_member, record_epoch_auth, save_group_state, set_group_cursor, set_membership_state,
};

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

/// How far [`covers`] walks back through `after` links before it stops looking.
pub const COVER_WALK_LIMIT: usize = 2_000;

/// Whether `target` is in the context a message declares: one of its `after` ids, or an ancestor
/// of one through the `after` lists of rows this session holds for the group (seed 001: a
/// `reply-to` must be covered by `after`). A row we have not received cannot be walked through,
/// so a reference only it would cover counts as not covered; the walk stops after
/// [`COVER_WALK_LIMIT`] rows.
pub async fn covers(
    conn: &mut SqliteConnection,
    handle: &str,
    group: &str,
    after: &[String],
    target: &str,
) -> Result<bool> {
    let mut seen: std::collections::HashSet<String> = after.iter().cloned().collect();
    let mut todo: Vec<String> = after.to_vec();
    while let Some(id) = todo.pop() {
        if id == target {
            return Ok(true);
        }
        if seen.len() > COVER_WALK_LIMIT {
            break;
        }
        let parents: Option<String> = sqlx::query_scalar(
            "SELECT after FROM lmk_messages WHERE handle = ?1 AND group_id = ?2 AND id = ?3 \
             UNION ALL SELECT after FROM lmk_expired WHERE handle = ?1 AND group_id = ?2 AND id = ?3 LIMIT 1",
        )
        .bind(handle)
        .bind(group)
        .bind(&id)
        .fetch_optional(&mut *conn)
        .await?;
        let parents: Vec<String> = parents.and_then(|p| serde_json::from_str(&p).ok()).unwrap_or_default();
        for p in parents {
            if seen.insert(p.clone()) {
                todo.push(p);
            }
        }
    }
    Ok(false)
}

impl Store {
    /// Deletes the decrypted group log older than `cutoff` (ms): messages and leave requests that
    /// entered their session's context (read) or were sent by it, alerts, and membership events
    /// (a session's `joined:` marker stays: it tells its own history from what came before it).
    /// Unread rows stay until read: a message nobody has seen is not lost to the clock. A deleted
    /// message keeps its id and `after` list in `lmk_expired`. Returns the rows deleted.
    pub async fn expire_group_log(&self, cutoff: i64) -> Result<u64> {
        let mut tx = self.write_tx().await?;
        // The same condition in both statements (a literal each: sqlx takes no built SQL).
        sqlx::query(
            "INSERT OR IGNORE INTO lmk_expired (handle, group_id, id, after) SELECT handle, group_id, id, after \
             FROM lmk_messages WHERE created_at < ?1 AND state = 'done' AND (read = 1 OR outgoing = 1) \
             AND kind IN ('message', 'leave')",
        )
        .bind(cutoff)
        .execute(&mut *tx)
        .await?;
        let gone = sqlx::query(
            "DELETE FROM lmk_messages WHERE created_at < ?1 AND state = 'done' AND (read = 1 OR outgoing = 1) \
             AND (kind IN ('message', 'leave', 'alert') OR (kind = 'event' AND id NOT LIKE 'joined:%'))",
        )
        .bind(cutoff)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(gone.rows_affected())
    }

    /// Ids of `group`'s messages whose decrypted content was deleted by [`Self::expire_group_log`].
    pub async fn expired_group_ids(&self, handle: &str, group: &str) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT id FROM lmk_expired WHERE handle = ? AND group_id = ?")
            .bind(handle)
            .bind(group)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Deletes a group session: its MLS state and everything kept for its groups (the decrypted
    /// log, member notes, epoch authenticators, policies), in one transaction. False when there
    /// was no such session.
    pub async fn delete_group_session(&self, handle: &str) -> Result<bool> {
        let gone = sqlx::query("DELETE FROM lmk_sessions WHERE handle = ?").bind(handle).execute(&self.pool).await?;
        Ok(gone.rows_affected() > 0)
    }
}
