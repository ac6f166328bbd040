//! letmeknow on PostgreSQL: the same requests and outcomes as [`crate::store::letmeknow`]. The
//! epoch compare-and-set locks the group row, and an invite's join or welcome locks the invite
//! row, so the check and the write are one step across instances.

use async_trait::async_trait;
use axum::body::Bytes;
use futures_util::future::BoxFuture;
use sqlx::{PgConnection, Row as _};
use switchboard_core::protocol::letmeknow::header::ContentType;

use super::{PgStore, sweep_lock, try_sweep_lock};
use crate::hub::Hub;
use crate::store::letmeknow::{
    CreateInvite, InviteOutcome, InviteState, LmkSweepReport, Post, PostOutcome, PutBlob, Sweep, constant_time_eq,
    owner_hash,
};
use crate::store::writer::Request;
use crate::store::{LetmeknowStore, StoreError};

async fn post(conn: &mut PgConnection, req: &Post) -> Result<PostOutcome, sqlx::Error> {
    sqlx::query("INSERT INTO lmk_groups (group_id, last_active) VALUES ($1, $2) ON CONFLICT (group_id) DO NOTHING")
        .bind(&req.gid)
        .bind(req.now)
        .execute(&mut *conn)
        .await?;
    let (current, seq): (i64, i64) =
        sqlx::query_as("SELECT epoch, next_seq FROM lmk_groups WHERE group_id = $1 FOR UPDATE")
            .bind(&req.gid)
            .fetch_one(&mut *conn)
            .await?;
    if req.epoch != current {
        return Ok(PostOutcome::WrongEpoch { current });
    }
    let epoch = if req.commit { current.saturating_add(1) } else { current };
    sqlx::query("UPDATE lmk_groups SET epoch = $1, next_seq = $2, last_active = $3 WHERE group_id = $4")
        .bind(epoch)
        .bind(seq + 1)
        .bind(req.now)
        .bind(&req.gid)
        .execute(&mut *conn)
        .await?;
    sqlx::query("INSERT INTO lmk_messages (group_id, seq, received_at, data) VALUES ($1, $2, $3, $4)")
        .bind(&req.gid)
        .bind(seq)
        .bind(req.now)
        .bind(req.data.as_ref())
        .execute(&mut *conn)
        .await?;
    Ok(PostOutcome::Stored { seq })
}

async fn create_invite(conn: &mut PgConnection, req: &CreateInvite) -> Result<InviteOutcome, sqlx::Error> {
    // An expired invite is gone, even if the sweep has not deleted it yet.
    sqlx::query("DELETE FROM lmk_invites WHERE invite_id = $1 AND expires_at <= $2")
        .bind(&req.id)
        .bind(req.now)
        .execute(&mut *conn)
        .await?;
    let inserted = sqlx::query(
        "INSERT INTO lmk_invites (invite_id, owner_hash, expires_at) VALUES ($1, $2, $3) \
         ON CONFLICT (invite_id) DO NOTHING",
    )
    .bind(&req.id)
    .bind(&req.owner_hash)
    .bind(req.expires_at)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(if inserted == 1 { InviteOutcome::Done } else { InviteOutcome::Conflict })
}

async fn put_blob(conn: &mut PgConnection, req: &PutBlob) -> Result<InviteOutcome, sqlx::Error> {
    let row = sqlx::query(
        "SELECT owner_hash, join_data IS NOT NULL AS joined, welcome_data IS NOT NULL AS welcomed \
         FROM lmk_invites WHERE invite_id = $1 AND expires_at > $2 FOR UPDATE",
    )
    .bind(&req.id)
    .bind(req.now)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(InviteOutcome::Gone) };
    let (owner_hash, joined, welcomed): (String, bool, bool) =
        (row.try_get("owner_hash")?, row.try_get("joined")?, row.try_get("welcomed")?);
    match &req.owner_hash {
        None => {
            if joined {
                return Ok(InviteOutcome::Conflict);
            }
            sqlx::query("UPDATE lmk_invites SET join_data = $1 WHERE invite_id = $2")
                .bind(&req.data)
                .bind(&req.id)
                .execute(&mut *conn)
                .await?;
        }
        Some(given) => {
            if !constant_time_eq(given.as_bytes(), owner_hash.as_bytes()) {
                return Ok(InviteOutcome::Forbidden);
            }
            if !joined || welcomed {
                return Ok(InviteOutcome::Conflict);
            }
            sqlx::query("UPDATE lmk_invites SET welcome_data = $1 WHERE invite_id = $2")
                .bind(&req.data)
                .bind(&req.id)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(InviteOutcome::Done)
}

async fn sweep(conn: &mut PgConnection, req: &Sweep) -> Result<LmkSweepReport, sqlx::Error> {
    if !try_sweep_lock(conn, sweep_lock::LETMEKNOW).await? {
        tracing::debug!("another instance is sweeping letmeknow");
        return Ok(LmkSweepReport::default());
    }
    let messages = sqlx::query("DELETE FROM lmk_messages WHERE received_at < $1")
        .bind(req.messages_before)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    let invites = sqlx::query("DELETE FROM lmk_invites WHERE expires_at <= $1")
        .bind(req.now)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    Ok(LmkSweepReport { messages, invites })
}

impl Request<PgConnection> for Post {
    type Out = PostOutcome;

    fn bytes(&self) -> usize {
        self.data.len()
    }

    fn run<'a>(&'a self, conn: &'a mut PgConnection, _: &'a Hub) -> BoxFuture<'a, Result<PostOutcome, sqlx::Error>> {
        Box::pin(post(conn, self))
    }

    fn wakeup(&self, out: &PostOutcome) -> Option<(String, i64)> {
        self.wakeup_for(out)
    }

    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(format!("lmk/g/{}", self.gid));
    }
}

impl Request<PgConnection> for CreateInvite {
    type Out = InviteOutcome;

    fn run<'a>(&'a self, conn: &'a mut PgConnection, _: &'a Hub) -> BoxFuture<'a, Result<InviteOutcome, sqlx::Error>> {
        Box::pin(create_invite(conn, self))
    }

    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(format!("lmk/i/{}", self.id));
    }
}

impl Request<PgConnection> for PutBlob {
    type Out = InviteOutcome;

    fn bytes(&self) -> usize {
        self.data.len()
    }

    fn run<'a>(&'a self, conn: &'a mut PgConnection, _: &'a Hub) -> BoxFuture<'a, Result<InviteOutcome, sqlx::Error>> {
        Box::pin(put_blob(conn, self))
    }

    fn wakeup(&self, out: &InviteOutcome) -> Option<(String, i64)> {
        self.wakeup_for(out)
    }

    fn locks(&self, keys: &mut Vec<String>) {
        keys.push(format!("lmk/i/{}", self.id));
    }
}

impl Request<PgConnection> for Sweep {
    type Out = LmkSweepReport;

    fn run<'a>(&'a self, conn: &'a mut PgConnection, _: &'a Hub) -> BoxFuture<'a, Result<LmkSweepReport, sqlx::Error>> {
        Box::pin(sweep(conn, self))
    }
}

#[async_trait]
impl LetmeknowStore for PgStore {
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
        Ok(sqlx::query_as("SELECT seq, data FROM lmk_messages WHERE group_id = $1 AND seq > $2 ORDER BY seq LIMIT $3")
            .bind(gid)
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.read)
            .await?)
    }

    async fn epoch(&self, gid: &str) -> Result<i64, StoreError> {
        let epoch: Option<i64> = sqlx::query_scalar("SELECT epoch FROM lmk_groups WHERE group_id = $1")
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
            "SELECT expires_at, join_data, welcome_data FROM lmk_invites WHERE invite_id = $1 AND expires_at > $2",
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
