//! letmeknow sessions and memberships: `lmk_sessions` and `lmk_mls_rows` (each session's MLS
//! state, one row per OpenMLS entry),
//! `lmk_groups` (which groups it is in and how far it read), member notes, epoch
//! authenticators, the per-group policy and held group sends.

use sqlx::{SqliteConnection, SqliteExecutor};

use super::super::{Result, Stmt, Store};

/// A stored group session: what restores its MLS member.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GroupSessionRow {
    /// Display name in its credential.
    pub name: String,
    /// Its signature key.
    pub signature_key: Vec<u8>,
    /// The legacy snapshot of the whole OpenMLS state (profiles made before migration 0018);
    /// empty once the state lives in `lmk_mls_rows`.
    pub mls_state: Vec<u8>,
}

/// A session's membership of one group.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GroupMembership {
    /// The group.
    pub group_id: String,
    /// The relay that carries its log.
    pub relay: String,
    /// How far the session read the log.
    pub cursor: i64,
    /// `active`, `removed`, `left` or `expired`.
    pub state: String,
    /// When the session joined (ms).
    pub joined_at: i64,
}

/// Writes the OpenMLS entries an operation changed: each `(key, Some(value))` is upserted,
/// each `(key, None)` deleted.
pub async fn save_group_state(
    conn: &mut SqliteConnection,
    handle: &str,
    changes: &[(&[u8], Option<&[u8]>)],
) -> Result<()> {
    for stmt in group_state_stmts(handle, changes) {
        stmt.execute(conn).await?;
    }
    Ok(())
}

/// [`save_group_state`] as statements, for a [`crate::store::BatchTx`].
pub fn group_state_stmts(handle: &str, changes: &[(&[u8], Option<&[u8]>)]) -> Vec<Stmt> {
    changes
        .iter()
        .map(|&(key, value)| match value {
            Some(value) => Stmt::new(
                "INSERT INTO lmk_mls_rows (handle, key, value) VALUES (?, ?, ?) \
                 ON CONFLICT (handle, key) DO UPDATE SET value = excluded.value",
            )
            .bind(handle)
            .bind(key)
            .bind(value),
            None => Stmt::new("DELETE FROM lmk_mls_rows WHERE handle = ? AND key = ?").bind(handle).bind(key),
        })
        .collect()
}

/// Records the authenticator of `epoch` (kept if one is there).
pub async fn record_epoch_auth(
    conn: &mut SqliteConnection,
    handle: &str,
    gid: &str,
    epoch: i64,
    auth: Vec<u8>,
) -> Result<()> {
    sqlx::query("INSERT OR IGNORE INTO lmk_epoch_auth (handle, group_id, epoch, auth) VALUES (?, ?, ?, ?)")
        .bind(handle)
        .bind(gid)
        .bind(epoch)
        .bind(auth)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Our authenticator of `epoch`, if this session was in it: a one-column read for
/// [`crate::store::BatchTx::fetch_optional`].
pub fn epoch_auth(handle: &str, gid: &str, epoch: i64) -> Stmt {
    Stmt::new("SELECT auth FROM lmk_epoch_auth WHERE handle = ? AND group_id = ? AND epoch = ?")
        .bind(handle)
        .bind(gid)
        .bind(epoch)
}

/// Forgets the authenticators of epochs from `epoch` on (a re-join replaces them).
pub async fn forget_epoch_auth_from(conn: &mut SqliteConnection, handle: &str, gid: &str, epoch: i64) -> Result<()> {
    sqlx::query("DELETE FROM lmk_epoch_auth WHERE handle = ? AND group_id = ? AND epoch >= ?")
        .bind(handle)
        .bind(gid)
        .bind(epoch)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Notes who member `fingerprint` is (its name, and who added it unless `invited_by` is empty).
pub async fn note_group_member(
    conn: &mut SqliteConnection,
    handle: &str,
    gid: &str,
    fingerprint: &str,
    name: &str,
    invited_by: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO lmk_member_notes (handle, group_id, fingerprint, name, invited_by) VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT (handle, group_id, fingerprint) DO UPDATE SET name = excluded.name, \
         invited_by = CASE WHEN excluded.invited_by = '' THEN invited_by ELSE excluded.invited_by END",
    )
    .bind(handle)
    .bind(gid)
    .bind(fingerprint)
    .bind(name)
    .bind(invited_by)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// `handle` created group `gid` on `relay`.
pub async fn insert_group(conn: &mut SqliteConnection, handle: &str, gid: &str, relay: &str, now: i64) -> Result<()> {
    sqlx::query("INSERT INTO lmk_groups (handle, group_id, relay, joined_at) VALUES (?, ?, ?, ?)")
        .bind(handle)
        .bind(gid)
        .bind(relay)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// `handle` joined `gid` on `relay` at log position `cursor` (a re-join resets the cursor and
/// makes the membership active again).
pub async fn join_group(
    conn: &mut SqliteConnection,
    handle: &str,
    gid: &str,
    relay: &str,
    cursor: i64,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO lmk_groups (handle, group_id, relay, cursor, joined_at) VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT (handle, group_id) DO UPDATE SET relay = excluded.relay, cursor = excluded.cursor, \
         state = 'active'",
    )
    .bind(handle)
    .bind(gid)
    .bind(relay)
    .bind(cursor)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Sets the state of `handle`'s membership of `gid` (`removed`, `left`, `expired`).
pub async fn set_membership_state(ex: impl SqliteExecutor<'_>, handle: &str, gid: &str, state: &str) -> Result<()> {
    sqlx::query("UPDATE lmk_groups SET state = ? WHERE handle = ? AND group_id = ?")
        .bind(state)
        .bind(handle)
        .bind(gid)
        .execute(ex)
        .await?;
    Ok(())
}

/// `handle` read `gid`'s log up to `seq`.
pub fn set_group_cursor(handle: &str, gid: &str, seq: i64) -> Stmt {
    Stmt::new("UPDATE lmk_groups SET cursor = ? WHERE handle = ? AND group_id = ?").bind(seq).bind(handle).bind(gid)
}

impl Store {
    /// Every group session's handle, oldest first.
    pub async fn group_session_handles(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT handle FROM lmk_sessions ORDER BY created_at").fetch_all(&self.pool).await?)
    }

    /// Whether group session `handle` exists.
    pub async fn group_session_exists(&self, handle: &str) -> Result<bool> {
        let found: Option<String> = sqlx::query_scalar("SELECT handle FROM lmk_sessions WHERE handle = ?")
            .bind(handle)
            .fetch_optional(&self.pool)
            .await?;
        Ok(found.is_some())
    }

    /// Stores a new group session with its first OpenMLS entries, in one transaction.
    pub async fn insert_group_session(
        &self,
        handle: &str,
        name: &str,
        signature_key: &[u8],
        rows: &[(Vec<u8>, Vec<u8>)],
        now: i64,
    ) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query(
            "INSERT INTO lmk_sessions (handle, name, signature_key, mls_state, created_at) VALUES (?, ?, ?, x'', ?)",
        )
        .bind(handle)
        .bind(name)
        .bind(signature_key)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let changes: Vec<(&[u8], Option<&[u8]>)> =
            rows.iter().map(|(k, v)| (k.as_slice(), Some(v.as_slice()))).collect();
        save_group_state(&mut tx, handle, &changes).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Group session `handle`: its identity and its legacy snapshot, if it still has one.
    pub async fn group_session(&self, handle: &str) -> Result<Option<GroupSessionRow>> {
        Ok(sqlx::query_as("SELECT name, signature_key, mls_state FROM lmk_sessions WHERE handle = ?")
            .bind(handle)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Every OpenMLS entry of group session `handle`, as (key, value).
    pub async fn group_mls_rows(&self, handle: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(sqlx::query_as("SELECT key, value FROM lmk_mls_rows WHERE handle = ?")
            .bind(handle)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Moves a legacy snapshot into rows: replaces `handle`'s rows with `rows` (the snapshot's
    /// entries) and empties the snapshot, in one transaction.
    pub async fn move_group_state_to_rows(&self, handle: &str, rows: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query("DELETE FROM lmk_mls_rows WHERE handle = ?").bind(handle).execute(&mut *tx).await?;
        let changes: Vec<(&[u8], Option<&[u8]>)> =
            rows.iter().map(|(k, v)| (k.as_slice(), Some(v.as_slice()))).collect();
        save_group_state(&mut tx, handle, &changes).await?;
        sqlx::query("UPDATE lmk_sessions SET mls_state = x'' WHERE handle = ?").bind(handle).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// (signature key, display name) of group session `handle`.
    pub async fn group_session_identity(&self, handle: &str) -> Result<Option<(Vec<u8>, String)>> {
        Ok(sqlx::query_as("SELECT signature_key, name FROM lmk_sessions WHERE handle = ?")
            .bind(handle)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Every group session's signature key.
    pub async fn group_session_keys(&self) -> Result<Vec<Vec<u8>>> {
        Ok(sqlx::query_scalar("SELECT signature_key FROM lmk_sessions").fetch_all(&self.pool).await?)
    }

    /// (handle, group) of every active membership.
    pub async fn active_memberships(&self) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as("SELECT handle, group_id FROM lmk_groups WHERE state = 'active'")
            .fetch_all(&self.pool)
            .await?)
    }

    /// `handle`'s membership of `gid`. On the caller's thread (`store::direct`).
    pub fn group_membership(&self, handle: &str, gid: &str) -> Result<Option<GroupMembership>> {
        self.direct.row(
            "SELECT group_id, relay, cursor, state, joined_at FROM lmk_groups WHERE handle = ? AND group_id = ?",
            (handle, gid),
            |r| {
                Ok(GroupMembership {
                    group_id: r.get(0)?,
                    relay: r.get(1)?,
                    cursor: r.get(2)?,
                    state: r.get(3)?,
                    joined_at: r.get(4)?,
                })
            },
        )
    }

    /// (group, relay) of `handle`'s active memberships. On the caller's thread.
    pub fn active_groups_of(&self, handle: &str) -> Result<Vec<(String, String)>> {
        self.direct.rows(
            "SELECT group_id, relay FROM lmk_groups WHERE handle = ? AND state = 'active'",
            [handle],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    }

    /// Every membership of `handle`, in the order it joined.
    pub async fn memberships_of(&self, handle: &str) -> Result<Vec<GroupMembership>> {
        Ok(sqlx::query_as(
            "SELECT group_id, relay, state, cursor, joined_at FROM lmk_groups WHERE handle = ? ORDER BY joined_at",
        )
        .bind(handle)
        .fetch_all(&self.pool)
        .await?)
    }

    /// (fingerprint, invited by) of the members `handle` noted in `gid`.
    pub async fn group_member_notes(&self, handle: &str, gid: &str) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as("SELECT fingerprint, invited_by FROM lmk_member_notes WHERE handle = ? AND group_id = ?")
            .bind(handle)
            .bind(gid)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Operator input in `gid`: the loop guard counts from the newest log row on.
    pub async fn reset_group_loop_guard(&self, handle: &str, gid: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO lmk_policy (handle, group_id, reset_rowid) VALUES (?1, ?2, \
             (SELECT COALESCE(MAX(rowid_), 0) FROM lmk_messages)) \
             ON CONFLICT (handle, group_id) DO UPDATE SET reset_rowid = excluded.reset_rowid",
        )
        .bind(handle)
        .bind(gid)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The outbound mode set for `handle`'s sends to `gid`, if one was.
    pub async fn group_outbound(&self, handle: &str, gid: &str) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT outbound FROM lmk_policy WHERE handle = ? AND group_id = ?")
            .bind(handle)
            .bind(gid)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Sets the outbound mode of `handle`'s sends to `gid`.
    pub async fn set_group_outbound(&self, handle: &str, gid: &str, mode: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO lmk_policy (handle, group_id, outbound) VALUES (?, ?, ?) \
             ON CONFLICT (handle, group_id) DO UPDATE SET outbound = excluded.outbound",
        )
        .bind(handle)
        .bind(gid)
        .bind(mode)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Holds agent session `agent`'s send to `gid` for the operator's review; its review id.
    pub async fn hold_group_send(
        &self,
        agent: &str,
        gid: &str,
        to_fp: Option<&str>,
        body: &str,
        reply_to: Option<&str>,
        now: i64,
    ) -> Result<i64> {
        Ok(sqlx::query(
            "INSERT INTO review_queue (agent, group_id, to_fp, kind, body, reply_to, created_at) \
             VALUES (?, ?, ?, 'send', ?, ?, ?)",
        )
        .bind(agent)
        .bind(gid)
        .bind(to_fp)
        .bind(body)
        .bind(reply_to)
        .bind(now)
        .execute(&self.pool)
        .await?
        .last_insert_rowid())
    }
}
