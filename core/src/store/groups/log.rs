//! The decrypted letmeknow log (`lmk_messages`) as the engine writes and reads it: rows a sync
//! stores, a send's row from `sending` to `done`, the read frontier and the leases of group
//! deliveries. Functions a transaction needs take any executor (`&mut *tx` or the pool).

use std::collections::BTreeMap;

use sqlx::{SqliteConnection, SqliteExecutor};

use super::super::{Result, Stmt, Store};

/// A whole row of a session's group log.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GroupMessage {
    /// Local row id: the order rows arrived in.
    pub rowid_: i64,
    /// The session whose log it is.
    pub handle: String,
    /// The group.
    pub group_id: String,
    /// Message id (b64u hash of the ciphertext), or `joined:N` / `alert:…` for local rows.
    pub id: String,
    /// Log position on the relay (0 while sending, and for local rows).
    pub seq: i64,
    /// MLS epoch it was sent at.
    pub epoch: i64,
    /// `message`, `leave`, `event` or `alert`.
    pub kind: String,
    /// `done`, `sending` or `commit_pending`.
    pub state: String,
    /// Written by this session (0/1).
    pub outgoing: i64,
    /// Sender's fingerprint.
    pub sender_fp: String,
    /// Sender's display name (as its credential claims).
    pub sender_name: String,
    /// Addressed member's fingerprint, or empty.
    pub to_fp: String,
    /// Message id answered, or empty.
    pub reply_to: String,
    /// JSON list of the ids the sender had read.
    pub after: String,
    /// The text.
    pub content: String,
    /// Entered the session's context (0/1).
    pub read: i64,
    /// Unix ms.
    pub created_at: i64,
    /// The delivery lease it was last handed out under, or empty.
    pub lease: String,
    /// When that lease was given (ms).
    pub leased_at: i64,
}

impl GroupMessage {
    /// The row from a read on the caller's thread (`SELECT *`), by column name.
    fn from_direct(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(super::super::direct::by_column!(
            r,
            GroupMessage {
                rowid_,
                handle,
                group_id,
                id,
                seq,
                epoch,
                kind,
                state,
                outgoing,
                sender_fp,
                sender_name,
                to_fp,
                reply_to,
                after,
                content,
                read,
                created_at,
                lease,
                leased_at
            }
        ))
    }

    /// The ids of its `after` list (empty when unreadable).
    pub fn after_ids(&self) -> Vec<String> {
        serde_json::from_str(&self.after).unwrap_or_default()
    }
}

/// A new local-log row (`state` empty means `done`).
#[derive(Debug, Default)]
pub struct NewGroupRow<'a> {
    /// Message id.
    pub id: String,
    /// Log position (0 while unknown).
    pub seq: i64,
    /// MLS epoch.
    pub epoch: i64,
    /// `message`, `leave`, `event` or `alert`.
    pub kind: &'a str,
    /// `done` (empty), `sending` or `commit_pending`.
    pub state: &'a str,
    /// Written by this session.
    pub outgoing: bool,
    /// Sender's fingerprint.
    pub sender_fp: String,
    /// Sender's display name.
    pub sender_name: String,
    /// Addressed member's fingerprint, or empty.
    pub to_fp: String,
    /// Message id answered, or empty.
    pub reply_to: String,
    /// Ids the sender had read.
    pub after: Vec<String>,
    /// The text.
    pub content: String,
    /// Already in the session's context.
    pub read: bool,
}

/// Stores `row` in `handle`'s log of `gid` unless a row with its id is there.
pub async fn insert_group_row(
    conn: &mut SqliteConnection,
    handle: &str,
    gid: &str,
    row: NewGroupRow<'_>,
    now: i64,
) -> Result<()> {
    group_row_insert(handle, gid, row, now).execute(conn).await?;
    Ok(())
}

/// [`insert_group_row`] as a statement, for a [`crate::store::BatchTx`].
pub fn group_row_insert(handle: &str, gid: &str, row: NewGroupRow<'_>, now: i64) -> Stmt {
    Stmt::new(
        "INSERT INTO lmk_messages (handle, group_id, id, seq, epoch, kind, state, outgoing, sender_fp, sender_name, \
         to_fp, reply_to, after, content, read, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (handle, group_id, id) DO NOTHING",
    )
    .bind(handle)
    .bind(gid)
    .bind(row.id)
    .bind(row.seq)
    .bind(row.epoch)
    .bind(row.kind)
    .bind(if row.state.is_empty() { "done" } else { row.state })
    .bind(row.outgoing)
    .bind(row.sender_fp)
    .bind(row.sender_name)
    .bind(row.to_fp)
    .bind(row.reply_to)
    .bind(serde_json::to_string(&row.after).unwrap_or_else(|_| "[]".into()))
    .bind(row.content)
    .bind(row.read)
    .bind(now)
}

/// Our row `id` was taken into the log at `seq`: it is done (for a [`crate::store::BatchTx`]).
pub fn group_row_posted(handle: &str, gid: &str, id: &str, seq: i64) -> Stmt {
    Stmt::new("UPDATE lmk_messages SET seq = ?, state = 'done' WHERE handle = ? AND group_id = ? AND id = ?")
        .bind(seq)
        .bind(handle)
        .bind(gid)
        .bind(id)
}

/// Forgets our row `id` (a post the log did not take).
pub async fn delete_group_row(ex: impl SqliteExecutor<'_>, handle: &str, gid: &str, id: &str) -> Result<()> {
    sqlx::query("DELETE FROM lmk_messages WHERE handle = ? AND group_id = ? AND id = ?")
        .bind(handle)
        .bind(gid)
        .bind(id)
        .execute(ex)
        .await?;
    Ok(())
}

/// Row `rowid` entered its session's context.
pub async fn mark_group_row_read(ex: impl SqliteExecutor<'_>, rowid: i64) -> Result<()> {
    sqlx::query("UPDATE lmk_messages SET read = 1 WHERE rowid_ = ?").bind(rowid).execute(ex).await?;
    Ok(())
}

/// Hands the rows `rowids` out under `lease`, each unless it is read or leased after
/// `expired_before`: returns `(rowid, times handed out)` of each row handed out, for
/// [`crate::store::BatchTx::commit_returning`]. One statement for any number of rows.
pub fn lease_group_rows(rowids: &[i64], lease: &str, now: i64, expired_before: i64) -> Stmt {
    Stmt::new(
        "UPDATE lmk_messages SET lease = ?, leased_at = ?, handed_count = handed_count + 1 \
         WHERE rowid_ IN (SELECT value FROM json_each(?)) AND read = 0 AND (lease = '' OR leased_at <= ?) \
         RETURNING rowid_, handed_count",
    )
    .bind(lease)
    .bind(now)
    .bind(serde_json::to_string(rowids).unwrap_or_else(|_| "[]".into()))
    .bind(expired_before)
}

/// The sessions whose rows went out under `lease`.
pub async fn group_lease_holders(conn: &mut SqliteConnection, lease: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(GROUP_LEASE_HOLDERS).bind(lease).fetch_all(&mut *conn).await?)
}

/// (rowid, id) of the unread rows handed out under `lease`, in log order.
pub async fn group_lease_unread(conn: &mut SqliteConnection, lease: &str) -> Result<Vec<(i64, String)>> {
    Ok(sqlx::query_as(GROUP_LEASE_UNREAD).bind(lease).fetch_all(&mut *conn).await?)
}

/// Marks row `rowid` read if it is still unread under `lease`; whether it changed.
pub async fn ack_group_row(conn: &mut SqliteConnection, rowid: i64, lease: &str) -> Result<u64> {
    Ok(sqlx::query("UPDATE lmk_messages SET read = 1 WHERE rowid_ = ? AND lease = ? AND read = 0")
        .bind(rowid)
        .bind(lease)
        .execute(&mut *conn)
        .await?
        .rows_affected())
}

/// [`group_lease_holders`]: in `lmk_messages_lease` (0007), which `lease != ''` lets SQLite use
/// (a lease is never empty); without it every ack read the whole log.
const GROUP_LEASE_HOLDERS: &str = "SELECT DISTINCT handle FROM lmk_messages WHERE lease = ? AND lease != ''";

/// [`group_lease_unread`]: as [`GROUP_LEASE_HOLDERS`].
const GROUP_LEASE_UNREAD: &str =
    "SELECT rowid_, id FROM lmk_messages WHERE lease = ? AND lease != '' AND read = 0 ORDER BY rowid_";

/// [`Store::group_row_by_id`]: one probe of `UNIQUE (handle, group_id, id)` per group of the
/// session, instead of every row of the session (`CROSS JOIN` keeps the groups outside).
const GROUP_ROW_BY_ID: &str = "SELECT m.* FROM lmk_groups g CROSS JOIN lmk_messages m ON m.handle = g.handle \
     AND m.group_id = g.group_id AND m.id = ?2 WHERE g.handle = ?1";

/// [`Store::group_unknown_links_after`]: the rowid range above the mark (the `+` keeps SQLite off
/// the group's whole index), each reference probed in `UNIQUE (handle, group_id, id)` and
/// `lmk_expired`'s key. An `after` that is not a JSON array counts as empty, and so do
/// elements that are not strings.
const UNKNOWN_LINKS_AFTER: &str = "SELECT r.rowid_, r.id, j.value FROM lmk_messages r \
     LEFT JOIN json_each(CASE WHEN json_type(r.after) = 'array' THEN r.after ELSE '[]' END) j \
     ON j.type = 'text' AND NOT EXISTS (SELECT 1 FROM lmk_messages k WHERE k.handle = ?2 AND k.group_id = ?3 AND k.id = j.value \
        AND k.kind IN ('message', 'leave')) \
     AND NOT EXISTS (SELECT 1 FROM lmk_expired e WHERE e.handle = ?2 AND e.group_id = ?3 AND e.id = j.value) \
     WHERE r.rowid_ > ?1 AND +r.handle = ?2 AND +r.group_id = ?3 AND r.kind IN ('message', 'leave') \
     ORDER BY r.rowid_";

/// Leave requests from other members of a group: `lmk_messages_leaves` (0020).
const LEAVERS: &str = "SELECT DISTINCT sender_fp FROM lmk_messages WHERE handle = ? AND group_id = ? \
                       AND kind = 'leave' AND outgoing = 0";

/// Each group's loop-guard threshold: at most `limit + 1` entries of `lmk_messages_hops` (0020)
/// per group, from the group's last operator input on.
const HOP_THRESHOLDS: &str = "SELECT g.group_id, (SELECT m.rowid_ FROM lmk_messages m WHERE m.handle = g.handle \
     AND m.group_id = g.group_id AND m.kind = 'message' AND m.state = 'done' \
     AND m.rowid_ > COALESCE(p.reset_rowid, 0) ORDER BY m.rowid_ LIMIT 1 OFFSET ?2) \
     FROM lmk_groups g LEFT JOIN lmk_policy p ON p.handle = g.handle AND p.group_id = g.group_id \
     WHERE g.handle = ?1";

/// The read frontier: the uncovered read rows, in `lmk_messages_tips` (0020), after the latest
/// join (a few membership events, in `lmk_messages_events`). Named: without statistics SQLite
/// would take `lmk_messages_unread` (every read row of the session since the join).
const FRONTIER: &str = "SELECT id FROM lmk_messages INDEXED BY lmk_messages_tips \
     WHERE handle = ?1 AND group_id = ?2 AND read = 1 AND covered = 0 AND state = 'done' \
     AND kind IN ('message', 'leave') AND rowid_ > COALESCE((SELECT MAX(rowid_) FROM lmk_messages \
     WHERE handle = ?1 AND group_id = ?2 AND kind = 'event' AND id LIKE 'joined:%'), 0) ORDER BY rowid_";

/// A group's hops since the last operator input, counted in `lmk_messages_hops` (0020) from
/// that input on.
const HOPS: &str = "SELECT COUNT(*) FROM lmk_messages WHERE handle = ?1 AND group_id = ?2 AND kind = 'message' \
     AND state = 'done' AND rowid_ > COALESCE((SELECT reset_rowid FROM lmk_policy \
     WHERE handle = ?1 AND group_id = ?2), 0)";

impl Store {
    /// What processing a log entry reads first, in one row: the state of `handle`'s row `id` in
    /// `gid` if it has one (our own posts), and our authenticator of `epoch` if this session was
    /// in it. On the caller's thread, before the entry's transaction: the caller holds the
    /// session's lock, under which every write of a session's own rows and authenticators runs
    /// (send, commit, join, sync), so both stay as read until the transaction commits.
    pub fn group_entry_lookup(
        &self,
        handle: &str,
        gid: &str,
        id: &str,
        epoch: i64,
    ) -> Result<(Option<String>, Option<Vec<u8>>)> {
        Ok(self
            .direct
            .row(
                "SELECT (SELECT state FROM lmk_messages WHERE handle = ?1 AND group_id = ?2 AND id = ?3), \
                 (SELECT auth FROM lmk_epoch_auth WHERE handle = ?1 AND group_id = ?2 AND epoch = ?4)",
                (handle, gid, id, epoch),
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .unwrap_or_default())
    }

    /// What a sync of `handle`'s membership of `gid` starts from, in one read: (relay, cursor,
    /// state) and the newest row id of any group log (0 when empty), the mark its arrivals are
    /// found after. `None` when `handle` is not in `gid`.
    /// On the caller's thread (`store::direct`).
    pub fn group_sync_start(&self, handle: &str, gid: &str) -> Result<Option<(String, i64, String, i64)>> {
        self.direct.row(
            "SELECT relay, cursor, state, (SELECT COALESCE(MAX(rowid_), 0) FROM lmk_messages) FROM lmk_groups \
             WHERE handle = ? AND group_id = ?",
            (handle, gid),
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
    }

    /// (id, sender name, sender fingerprint) of the messages and alerts from others stored in
    /// `handle`'s log of `gid` after row `mark`, in log order. On the caller's thread.
    pub fn group_arrivals_since(&self, handle: &str, gid: &str, mark: i64) -> Result<Vec<(String, String, String)>> {
        // `+handle`/`+group_id`: the rowid range above the mark, not the group's whole history
        // through the (handle, group_id, id) index.
        self.direct.rows(
            "SELECT id, sender_name, sender_fp FROM lmk_messages WHERE +handle = ? AND +group_id = ? AND rowid_ > ? \
             AND outgoing = 0 AND kind IN ('message', 'alert') ORDER BY rowid_",
            (handle, gid, mark),
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    }

    /// How many distinct log positions strictly between `after` and `before` hold our own posts.
    pub async fn own_group_posts_between(&self, handle: &str, gid: &str, after: i64, before: i64) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT COUNT(DISTINCT seq) FROM lmk_messages WHERE handle = ? AND group_id = ? AND outgoing = 1 \
             AND state = 'done' AND seq > ? AND seq < ?",
        )
        .bind(handle)
        .bind(gid)
        .bind(after)
        .bind(before)
        .fetch_one(&self.pool)
        .await?)
    }

    /// The newest row of every group log (0 when empty; one step down the rowid tree). On the
    /// caller's thread.
    pub fn group_newest_rowid(&self) -> Result<i64> {
        Ok(self.direct.row("SELECT COALESCE(MAX(rowid_), 0) FROM lmk_messages", [], |r| r.get(0))?.unwrap_or(0))
    }

    /// The messages and leave requests in `handle`'s log of `gid` after row `rowid`, in log
    /// order, each as (rowid, id, a reference in its `after` that names no message or leave
    /// request of the log nor an expired one): one row per unknown reference, or one with `None`
    /// when all are known. The gap check's whole question in one statement, on the caller's thread.
    pub fn group_unknown_links_after(
        &self,
        handle: &str,
        gid: &str,
        rowid: i64,
    ) -> Result<Vec<(i64, String, Option<String>)>> {
        self.direct.rows(UNKNOWN_LINKS_AFTER, (rowid, handle, gid), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
    }

    /// (id, after) of every message and leave request in `handle`'s log of `gid`.
    pub async fn group_message_links(&self, handle: &str, gid: &str) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(
            "SELECT id, after FROM lmk_messages WHERE handle = ? AND group_id = ? AND kind IN ('message', 'leave')",
        )
        .bind(handle)
        .bind(gid)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The log position of `handle`'s latest join of `gid` (its `joined:` event), if any.
    pub async fn group_join_seq(&self, handle: &str, gid: &str) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT seq FROM lmk_messages WHERE handle = ? AND group_id = ? AND kind = 'event' AND id LIKE 'joined:%' \
             ORDER BY rowid_ DESC LIMIT 1",
        )
        .bind(handle)
        .bind(gid)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The read frontier of `handle` in `gid`: its read messages and leave requests since its
    /// latest join that no read one names in `after` (marked `covered` by 0020's triggers), in
    /// log order. Only the tips are read, through `lmk_messages_tips`. On the caller's thread.
    pub fn group_frontier(&self, handle: &str, gid: &str) -> Result<Vec<String>> {
        self.direct.rows(FRONTIER, (handle, gid), |r| r.get(0))
    }

    /// The row id of message (or leave request) `id` in `handle`'s log of `gid`.
    pub async fn group_message_rowid(&self, handle: &str, gid: &str, id: &str) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT rowid_ FROM lmk_messages WHERE handle = ? AND group_id = ? AND id = ? AND kind IN ('message', 'leave')",
        )
        .bind(handle)
        .bind(gid)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Fingerprints of the members who asked to leave `gid` (in `handle`'s log). On the caller's
    /// thread.
    pub fn group_leavers(&self, handle: &str, gid: &str) -> Result<Vec<String>> {
        self.direct.rows(LEAVERS, (handle, gid), |r| r.get(0))
    }

    /// How many rows of `gid` `handle` has not read.
    pub async fn group_unread(&self, handle: &str, gid: &str) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM lmk_messages WHERE handle = ? AND group_id = ? AND read = 0")
            .bind(handle)
            .bind(gid)
            .fetch_one(&self.pool)
            .await?)
    }

    /// `handle`'s row `id`, in whichever group (ids are message hashes: one at most).
    pub async fn group_row_by_id(&self, handle: &str, id: &str) -> Result<Option<GroupMessage>> {
        Ok(sqlx::query_as(GROUP_ROW_BY_ID).bind(handle).bind(id).fetch_optional(&self.pool).await?)
    }

    /// `handle`'s row `id` of `gid`.
    pub async fn group_row(&self, handle: &str, gid: &str, id: &str) -> Result<Option<GroupMessage>> {
        Ok(sqlx::query_as("SELECT * FROM lmk_messages WHERE handle = ? AND group_id = ? AND id = ?")
            .bind(handle)
            .bind(gid)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// `handle`'s unread rows that are done, in log order. On the caller's thread.
    pub fn unread_group_rows(&self, handle: &str) -> Result<Vec<GroupMessage>> {
        self.direct.rows(
            "SELECT * FROM lmk_messages WHERE handle = ? AND read = 0 AND state = 'done' ORDER BY rowid_",
            [handle],
            GroupMessage::from_direct,
        )
    }

    /// For each group of `handle`: the rowid of the hop that passes `limit`, i.e. the
    /// `limit + 1`-th group message, in or out, after the group's last operator input (the loop
    /// guard's hops), if there is one. A row at or after it has more than `limit` hops before it,
    /// itself included. Reads at most `limit + 1` entries of `lmk_messages_hops` per group,
    /// whatever the group's history.
    /// On the caller's thread.
    pub fn group_hop_thresholds(&self, handle: &str, limit: i64) -> Result<BTreeMap<String, i64>> {
        let rows: Vec<(String, Option<i64>)> =
            self.direct.rows(HOP_THRESHOLDS, (handle, limit), |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.into_iter().filter_map(|(gid, rowid)| Some((gid, rowid?))).collect())
    }

    /// Agent-to-agent hops in `gid` since `handle`'s last operator input there: every group
    /// message, in or out.
    pub async fn group_hops(&self, handle: &str, gid: &str) -> Result<i64> {
        Ok(sqlx::query_scalar(HOPS).bind(handle).bind(gid).fetch_one(&self.pool).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a message sent or received asks of the group's log must not read the group's
    /// history: each step on `lmk_messages` is a range of one of 0020's partial indexes, which
    /// hold only the rows asked about. (Without them SQLite read every row of the group through
    /// `UNIQUE (handle, group_id, id)`: in a group of 20,000 messages ~27 ms for the leave
    /// requests, ~10 ms for the hops, ~35 ms for the frontier.)
    #[tokio::test]
    async fn the_per_message_queries_read_an_index_range_not_the_groups_history() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        let hops = ["lmk_messages_hops (handle=? AND group_id=? AND rowid>?)"];
        for (sql, steps) in [
            (LEAVERS, &["lmk_messages_leaves (handle=? AND group_id=?)"][..]),
            (GROUP_LEASE_HOLDERS, &["lmk_messages_lease (lease=?)"][..]),
            (GROUP_LEASE_UNREAD, &["lmk_messages_lease (lease=?)"][..]),
            (GROUP_ROW_BY_ID, &["sqlite_autoindex_lmk_messages_1 (handle=? AND group_id=? AND id=?)"][..]),
            (
                UNKNOWN_LINKS_AFTER,
                &[
                    "INTEGER PRIMARY KEY (rowid>?)",
                    "sqlite_autoindex_lmk_messages_1 (handle=? AND group_id=? AND id=?)",
                ][..],
            ),
            (HOP_THRESHOLDS, &hops[..]),
            (HOPS, &hops[..]),
            (
                FRONTIER,
                &[
                    "lmk_messages_tips (handle=? AND group_id=? AND rowid>?)",
                    "lmk_messages_events (handle=? AND group_id=?)",
                ][..],
            ),
        ] {
            let plan = crate::store::query_plan(&store.pool, sql).await;
            // Every step expected is there, and nothing reads a table whole (the `after` list's
            // own elements are `json_each`'s virtual table).
            for expected in steps {
                assert!(plan.iter().any(|d| d.ends_with(expected)), "{sql}: no {expected} (plan {plan:?})");
            }
            let scans: Vec<&String> =
                plan.iter().filter(|d| d.starts_with("SCAN ") && !d.contains("VIRTUAL TABLE")).collect();
            assert!(scans.is_empty(), "{sql}: {scans:?} (plan {plan:?})");
        }
    }

    /// A lease takes only rows that are unread and not under a lease still running, in one
    /// statement for the whole batch, and says which it took: what keeps two callers racing
    /// for one session's rows from handing any out twice.
    #[tokio::test]
    async fn a_lease_takes_only_free_rows_and_says_which() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        sqlx::raw_sql(
            "INSERT INTO lmk_sessions (handle, name, signature_key, mls_state, created_at) VALUES ('h', 'n', x'00', x'', 1); \
             INSERT INTO lmk_groups (handle, group_id, relay, joined_at) VALUES ('h', 'g', 'r', 1)",
        )
        .execute(&store.pool)
        .await
        .unwrap();
        let mut rowids = Vec::new();
        for id in ["a", "b", "c"] {
            let row = NewGroupRow { id: id.into(), kind: "message", ..Default::default() };
            insert_group_row(&mut store.pool.acquire().await.unwrap(), "h", "g", row, 1).await.unwrap();
            rowids.push(store.group_message_rowid("h", "g", id).await.unwrap().unwrap());
        }
        let lease = |rows: &[i64], name: &str, now: i64| {
            let store = &store;
            let (rows, name) = (rows.to_vec(), name.to_owned());
            async move {
                let tx = store.replayable_tx().await.unwrap();
                let mut got: Vec<(i64, i64)> =
                    tx.commit_returning(vec![lease_group_rows(&rows, &name, now, now - 1000)]).await.unwrap();
                got.sort_unstable();
                got
            }
        };
        let (a, b, c) = (rowids[0], rowids[1], rowids[2]);
        assert_eq!(lease(&[a, b], "L1", 10_000).await, vec![(a, 1), (b, 1)]);
        // A second caller with the same view, the first lease still running: only the free row.
        assert_eq!(lease(&[a, b, c], "L2", 10_500).await, vec![(c, 1)]);
        // Once L1 ran out its rows go again, counted; a read row never does.
        sqlx::query("UPDATE lmk_messages SET read = 1 WHERE rowid_ = ?").bind(b).execute(&store.pool).await.unwrap();
        assert_eq!(lease(&[a, b], "L3", 11_500).await, vec![(a, 2)]);
        let mut holders = Vec::new();
        for rowid in [a, b, c] {
            let lease: String = sqlx::query_scalar("SELECT lease FROM lmk_messages WHERE rowid_ = ?")
                .bind(rowid)
                .fetch_one(&store.pool)
                .await
                .unwrap();
            holders.push(lease);
        }
        assert_eq!(holders, ["L3", "L1", "L2"]);
    }
}
