//! letmeknow SQL: per-group epoch and ciphertext log, and pending invites.
//!
//! - A post decides inside the writer's transaction: the epoch compare-and-set (a commit must
//!   target the current epoch and advances it; an application message must be at the current
//!   epoch), the seq allocation and the insert are one atomic step, answered after the commit.
//! - Retention deletes old messages but keeps the group row, so the epoch survives.
//! - Invites accept one join and one welcome; reads treat an expired invite as gone at once, and
//!   the sweep deletes it.
//!
//! Hub keys (see [`crate::hub`]): `letmeknow/g/<gid>` carries the newest seq of a group;
//! `letmeknow/i/<id>` carries 1 once a join is stored and 2 once the welcome is.

use async_trait::async_trait;
use axum::body::Bytes;
use rusqlite::OptionalExtension as _;
use sqlx::Row as _;
use switchboard_core::protocol::letmeknow::header::ContentType;
use switchboard_core::util::{hex, sha256};

use super::sync::{SyncDb, rows};
use super::writer::sync_request;
use super::{LetmeknowStore, SqliteStore, Store, StoreError};
use crate::hub::Hub;

/// The hub key of a group log.
pub fn group_key(gid: &str) -> String {
    format!("letmeknow/g/{gid}")
}

/// The hub key of an invite.
pub fn invite_key(id: &str) -> String {
    format!("letmeknow/i/{id}")
}

/// Hub value once an invite holds a join.
pub const JOINED: i64 = 1;
/// Hub value once an invite holds a welcome.
pub const WELCOMED: i64 = 2;

/// Outcome of a group post.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostOutcome {
    /// Stored at this seq.
    Stored {
        /// Position in the group log.
        seq: i64,
    },
    /// Refused: the message's epoch is not the group's current one.
    WrongEpoch {
        /// The current epoch.
        current: i64,
    },
}

/// Outcome of an invite write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InviteOutcome {
    /// Done.
    Done,
    /// No such invite, or it expired (`404`).
    Gone,
    /// The invite already exists / already has a join / a welcome, or has no join yet (`409`).
    Conflict,
    /// Wrong or missing owner token (`403`).
    Forbidden,
}

/// `POST /g/{gid}/messages` after the header was parsed.
pub(crate) struct Post {
    pub(crate) gid: String,
    pub(crate) epoch: i64,
    pub(crate) commit: bool,
    pub(crate) data: Bytes,
    pub(crate) now: i64,
}

/// `PUT /i/{id}`.
pub(crate) struct CreateInvite {
    pub(crate) id: String,
    pub(crate) owner_hash: String,
    pub(crate) expires_at: i64,
    pub(crate) now: i64,
}

/// `POST /i/{id}/join` or `/welcome`.
pub(crate) struct PutBlob {
    pub(crate) id: String,
    /// `Some` for the welcome: the owner token's hash to check.
    pub(crate) owner_hash: Option<String>,
    pub(crate) data: Vec<u8>,
    pub(crate) now: i64,
}

/// The sweep: messages received before `messages_before`, invites expired at `now`.
pub(crate) struct Sweep {
    pub(crate) messages_before: i64,
    pub(crate) now: i64,
}

/// What a sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LmkSweepReport {
    /// Messages past retention.
    pub messages: u64,
    /// Expired invites.
    pub invites: u64,
}

impl Post {
    pub(crate) fn new(gid: &str, epoch: u64, content: ContentType, data: Bytes, now: i64) -> Self {
        Self {
            gid: gid.to_owned(),
            epoch: i64::try_from(epoch).unwrap_or(i64::MAX),
            commit: content == ContentType::Commit,
            data,
            now,
        }
    }

    /// The hub key and seq to announce once a stored post commits.
    pub(crate) fn wakeup_for(&self, out: &PostOutcome) -> Option<(String, i64)> {
        match out {
            PostOutcome::Stored { seq } => Some((group_key(&self.gid), *seq)),
            PostOutcome::WrongEpoch { .. } => None,
        }
    }
}

impl PutBlob {
    pub(crate) fn new(id: &str, owner: Option<&str>, data: Vec<u8>, now: i64) -> Self {
        Self { id: id.to_owned(), owner_hash: owner.map(owner_hash), data, now }
    }

    /// The hub key and value to announce once a stored join or welcome commits.
    pub(crate) fn wakeup_for(&self, out: &InviteOutcome) -> Option<(String, i64)> {
        let value = if self.owner_hash.is_some() { WELCOMED } else { JOINED };
        (*out == InviteOutcome::Done).then(|| (invite_key(&self.id), value))
    }
}

sync_request!(Post => PostOutcome, post, {
    fn bytes(&self) -> usize {
        self.data.len()
    }

    fn wakeup(&self, out: &PostOutcome) -> Option<(String, i64)> {
        self.wakeup_for(out)
    }
});
sync_request!(CreateInvite => InviteOutcome, create_invite);
sync_request!(PutBlob => InviteOutcome, put_blob, {
    fn bytes(&self) -> usize {
        self.data.len()
    }

    fn wakeup(&self, out: &InviteOutcome) -> Option<(String, i64)> {
        self.wakeup_for(out)
    }
});
sync_request!(Sweep => LmkSweepReport, sweep);

fn post(db: &SyncDb, req: &Post, _: &Hub) -> rusqlite::Result<PostOutcome> {
    db.prepare_cached(
        "INSERT INTO lmk_groups (group_id, last_active) VALUES (?, ?) ON CONFLICT (group_id) DO NOTHING",
    )?
    .execute((&req.gid, req.now))?;
    let (current, seq): (i64, i64) = db
        .prepare_cached("SELECT epoch, next_seq FROM lmk_groups WHERE group_id = ?")?
        .query_row([&req.gid], |r| Ok((r.get(0)?, r.get(1)?)))?;
    if req.epoch != current {
        return Ok(PostOutcome::WrongEpoch { current });
    }
    let epoch = if req.commit { current.saturating_add(1) } else { current };
    db.prepare_cached("UPDATE lmk_groups SET epoch = ?, next_seq = ?, last_active = ? WHERE group_id = ?")?
        .execute((epoch, seq + 1, req.now, &req.gid))?;
    db.prepare_cached("INSERT INTO lmk_messages (group_id, seq, received_at, data) VALUES (?, ?, ?, ?)")?.execute((
        &req.gid,
        seq,
        req.now,
        req.data.as_ref(),
    ))?;
    Ok(PostOutcome::Stored { seq })
}

fn create_invite(db: &SyncDb, req: &CreateInvite, _: &Hub) -> rusqlite::Result<InviteOutcome> {
    // An expired invite is gone, even if the sweep has not deleted it yet.
    db.prepare_cached("DELETE FROM lmk_invites WHERE invite_id = ? AND expires_at <= ?")?
        .execute((&req.id, req.now))?;
    let inserted = db
        .prepare_cached(
            "INSERT INTO lmk_invites (invite_id, owner_hash, expires_at) VALUES (?, ?, ?) \
             ON CONFLICT (invite_id) DO NOTHING",
        )?
        .execute((&req.id, &req.owner_hash, req.expires_at))?;
    Ok(if inserted == 1 { InviteOutcome::Done } else { InviteOutcome::Conflict })
}

fn put_blob(db: &SyncDb, req: &PutBlob, _: &Hub) -> rusqlite::Result<InviteOutcome> {
    let row: Option<(String, bool, bool)> = db
        .prepare_cached(
            "SELECT owner_hash, join_data IS NOT NULL, welcome_data IS NOT NULL \
             FROM lmk_invites WHERE invite_id = ? AND expires_at > ?",
        )?
        .query_row((&req.id, req.now), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((owner_hash, joined, welcomed)) = row else { return Ok(InviteOutcome::Gone) };
    match &req.owner_hash {
        None => {
            if joined {
                return Ok(InviteOutcome::Conflict);
            }
            db.prepare_cached("UPDATE lmk_invites SET join_data = ? WHERE invite_id = ?")?
                .execute((&req.data, &req.id))?;
        }
        Some(given) => {
            if !constant_time_eq(given.as_bytes(), owner_hash.as_bytes()) {
                return Ok(InviteOutcome::Forbidden);
            }
            if !joined || welcomed {
                return Ok(InviteOutcome::Conflict);
            }
            db.prepare_cached("UPDATE lmk_invites SET welcome_data = ? WHERE invite_id = ?")?
                .execute((&req.data, &req.id))?;
        }
    }
    Ok(InviteOutcome::Done)
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn sweep(db: &SyncDb, req: &Sweep, _: &Hub) -> rusqlite::Result<LmkSweepReport> {
    let messages =
        db.prepare_cached("DELETE FROM lmk_messages WHERE received_at < ?")?.execute([req.messages_before])?;
    let invites = db.prepare_cached("DELETE FROM lmk_invites WHERE expires_at <= ?")?.execute([req.now])?;
    Ok(LmkSweepReport { messages: rows(messages), invites: rows(invites) })
}

/// A live invite as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InviteState {
    /// Expiry (Unix ms).
    pub expires_at: i64,
    /// The joiner's data, once posted.
    pub join: Option<Vec<u8>>,
    /// The inviter's data, once posted.
    pub welcome: Option<Vec<u8>>,
}

/// The SHA-256 (hex) under which an owner token is stored and compared.
pub fn owner_hash(token: &str) -> String {
    hex(&sha256(token.as_bytes()))
}

#[async_trait]
impl LetmeknowStore for SqliteStore {
    async fn post(
        &self,
        gid: &str,
        epoch: u64,
        content: ContentType,
        data: Bytes,
        now: i64,
    ) -> Result<PostOutcome, StoreError> {
        self.submit(Post::new(gid, epoch, content, data, now)).await
    }

    async fn messages(&self, gid: &str, after: i64, limit: usize) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        let rows =
            sqlx::query("SELECT seq, data FROM lmk_messages WHERE group_id = ? AND seq > ? ORDER BY seq LIMIT ?")
                .bind(gid)
                .bind(after)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.read)
                .await?;
        Ok(rows.into_iter().map(|r| Ok((r.try_get("seq")?, r.try_get("data")?))).collect::<Result<_, sqlx::Error>>()?)
    }

    async fn epoch(&self, gid: &str) -> Result<i64, StoreError> {
        let epoch: Option<i64> = sqlx::query_scalar("SELECT epoch FROM lmk_groups WHERE group_id = ?")
            .bind(gid)
            .fetch_optional(&self.read)
            .await?;
        Ok(epoch.unwrap_or(0))
    }

    async fn create_invite(
        &self,
        id: &str,
        owner: &str,
        expires_at: i64,
        now: i64,
    ) -> Result<InviteOutcome, StoreError> {
        self.submit(CreateInvite { id: id.to_owned(), owner_hash: owner_hash(owner), expires_at, now }).await
    }

    async fn put_blob(
        &self,
        id: &str,
        owner: Option<&str>,
        data: Vec<u8>,
        now: i64,
    ) -> Result<InviteOutcome, StoreError> {
        self.submit(PutBlob::new(id, owner, data, now)).await
    }

    async fn invite(&self, id: &str, now: i64) -> Result<Option<InviteState>, StoreError> {
        let row = sqlx::query(
            "SELECT expires_at, join_data, welcome_data FROM lmk_invites WHERE invite_id = ? AND expires_at > ?",
        )
        .bind(id)
        .bind(now)
        .fetch_optional(&self.read)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(InviteState {
            expires_at: row.try_get("expires_at")?,
            join: row.try_get("join_data")?,
            welcome: row.try_get("welcome_data")?,
        }))
    }

    async fn sweep(&self, messages_before: i64, now: i64) -> Result<LmkSweepReport, StoreError> {
        self.submit(Sweep { messages_before, now }).await
    }
}

impl Store {
    /// Appends a group message if its epoch is current (see [`LetmeknowStore::post`]).
    pub async fn lmk_post(
        &self,
        gid: &str,
        epoch: u64,
        content: ContentType,
        data: Bytes,
        now: i64,
    ) -> Result<PostOutcome, StoreError> {
        self.letmeknow().post(gid, epoch, content, data, now).await
    }

    /// Up to `limit` log entries of `gid` with seq above `after`, ascending.
    pub async fn lmk_messages(&self, gid: &str, after: i64, limit: usize) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        self.letmeknow().messages(gid, after, limit).await
    }

    /// The group's current epoch (0 for a group never written).
    pub async fn lmk_epoch(&self, gid: &str) -> Result<i64, StoreError> {
        self.letmeknow().epoch(gid).await
    }

    /// Creates an invite (`Conflict` if a live one has this id).
    pub async fn lmk_create_invite(
        &self,
        id: &str,
        owner: &str,
        expires_at: i64,
        now: i64,
    ) -> Result<InviteOutcome, StoreError> {
        self.letmeknow().create_invite(id, owner, expires_at, now).await
    }

    /// Stores the join data (`owner` `None`) or, for the owner, the welcome data.
    pub async fn lmk_put_blob(
        &self,
        id: &str,
        owner: Option<&str>,
        data: Vec<u8>,
        now: i64,
    ) -> Result<InviteOutcome, StoreError> {
        self.letmeknow().put_blob(id, owner, data, now).await
    }

    /// A live invite, or `None` if unknown or expired at `now`.
    pub async fn lmk_invite(&self, id: &str, now: i64) -> Result<Option<InviteState>, StoreError> {
        self.letmeknow().invite(id, now).await
    }

    /// Deletes old messages (epochs stay) and expired invites.
    pub async fn lmk_sweep(&self, messages_before: i64, now: i64) -> Result<LmkSweepReport, StoreError> {
        self.letmeknow().sweep(messages_before, now).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const G: &str = "0123456789abcdef0123456789abcdef";

    #[tokio::test]
    async fn concurrent_commits_at_one_epoch_exactly_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap());
        let posts = (0..10).map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store.lmk_post(G, 0, ContentType::Commit, Bytes::from_static(b"c"), 1).await.unwrap()
            })
        });
        let mut won = 0;
        for p in posts.collect::<Vec<_>>() {
            match p.await.unwrap() {
                PostOutcome::Stored { seq } => {
                    won += 1;
                    assert_eq!(seq, 1);
                }
                PostOutcome::WrongEpoch { current } => assert_eq!(current, 1),
            }
        }
        assert_eq!(won, 1);
        assert_eq!(store.lmk_epoch(G).await.unwrap(), 1);
        store.close().await;
    }

    #[tokio::test]
    async fn sweep_deletes_old_messages_and_keeps_the_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap();
        store.lmk_post(G, 0, ContentType::Commit, Bytes::from_static(b"a"), 10).await.unwrap();
        store.lmk_post(G, 1, ContentType::Application, Bytes::from_static(b"b"), 20).await.unwrap();
        let report = store.lmk_sweep(15, 20).await.unwrap();
        assert_eq!(report.messages, 1);
        assert_eq!(store.lmk_messages(G, 0, 10).await.unwrap(), vec![(2, b"b".to_vec())]);
        assert_eq!(store.lmk_epoch(G).await.unwrap(), 1);
        let next = store.lmk_post(G, 1, ContentType::Commit, Bytes::from_static(b"c"), 30).await.unwrap();
        assert_eq!(next, PostOutcome::Stored { seq: 3 });
        store.close().await;
    }
}
