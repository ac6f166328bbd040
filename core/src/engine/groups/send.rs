//! Sending to a group: the application message (payload with `after` = the read frontier and the
//! epoch authenticator, durable before the relay sees it, rebased on a lost epoch race), and the
//! delivery policy's send side: loop guard, outbound mode (review), operator input.

use serde_json::{Value, json};

use super::{MAX_REBASES, Payload, canonical_fp, queue_state};
use crate::engine::{Error, Event, Result, Runtime};
use crate::mls;
use crate::protocol::letmeknow::message_id;
use crate::store::groups::{self as db, NewGroupRow};
use crate::transport::TransportError;
use crate::transport::letmeknow::Posted;
use crate::util::{b64u, now_ms};

impl Runtime {
    /// Sends `text` to the group (optionally addressed to a member's fingerprint, optionally
    /// replying to a message, which `after` then covers). Returns `{id, seq}`.
    pub async fn lmk_send(
        &self,
        handle: &str,
        gid: &str,
        text: &str,
        to: Option<&str>,
        reply_to: Option<&str>,
    ) -> Result<Value> {
        self.lmk_post_app(handle, gid, text, to, reply_to, false).await
    }

    pub(super) async fn lmk_post_app(
        &self,
        handle: &str,
        gid: &str,
        text: &str,
        to: Option<&str>,
        reply_to: Option<&str>,
        leave: bool,
    ) -> Result<Value> {
        let session = self.lmk_load(handle).await?;
        let mut s = session.lock().await;
        // Optimistic: the first attempt encrypts at the epoch this session already has (its
        // follower keeps it current) and lets the relay's compare-and-set judge it; only after
        // losing the epoch race, or when the send names a member or a message this session may
        // not have read yet, is the log read first. A lost race costs one message key, never a
        // message: the row is deleted and the send retried at the new epoch.
        let mut read_first = to.is_some() || reply_to.is_some();
        // Without a read first, the frontier is read now, with the membership.
        let (relay, _, state) = self.lmk_group_row(handle, gid)?;
        let mut first_frontier = if read_first { None } else { Some(self.frontier(handle, gid)?) };
        Self::require_active(&state, gid)?;
        let client = self.lmk_client(&relay).await?;
        for _ in 0..MAX_REBASES {
            if read_first {
                self.sync_locked(&mut s, gid, 0).await?;
                let (_, _, state) = self.lmk_group_row(handle, gid)?;
                Self::require_active(&state, gid)?;
            }
            read_first = true;
            let mut group = s.member.load_group(gid)?.ok_or_else(|| Error::Bug("group state missing".into()))?;
            let to = match to {
                Some(fp) => {
                    let fp = canonical_fp(fp);
                    if !mls::members(&group).iter().any(|m| m.fingerprint == fp) {
                        return Err(Error::Invalid(format!("no member of {gid} has fingerprint {fp}")));
                    }
                    Some(fp)
                }
                None => None,
            };
            let mut after = match first_frontier.take() {
                Some(after) => after,
                None => self.frontier(handle, gid)?,
            };
            if let Some(r) = reply_to {
                let known = self.store().group_message_rowid(handle, gid, r).await?;
                let rowid = known.ok_or_else(|| Error::UnknownMessage(r.to_owned()))?;
                // Replying means it entered our context: it joins the frontier, and `after` covers it.
                db::mark_group_row_read(&self.store().pool, rowid).await?;
                if !after.iter().any(|a| a == r) {
                    after = self.frontier(handle, gid)?;
                    if !after.iter().any(|a| a == r) {
                        after.push(r.to_owned());
                    }
                }
            }
            let payload = Payload {
                to: to.clone(),
                reply_to: reply_to.map(str::to_owned),
                after: after.clone(),
                epoch_auth: b64u(&mls::epoch_authenticator(&group)),
                content: text.to_owned(),
                leave,
            };
            let plain = serde_json::to_vec(&payload).map_err(|e| Error::Bug(e.to_string()))?;
            let bytes = s.member.encrypt(&mut group, &plain)?;
            let id = message_id(&bytes);
            let epoch = i64::try_from(group.epoch().as_u64()).unwrap_or(i64::MAX);
            // Kept for the next operation on this group (the follower's, or the next send).
            s.member.park(group);
            // The ratchet state and the row are durable before the relay sees the ciphertext, so
            // a restart never reuses a message key.
            // One trip: `BEGIN`, the row, the changed OpenMLS rows and the `COMMIT` together.
            let mut tx = self.store().batch_tx().await?;
            let row = NewGroupRow {
                id: id.clone(),
                epoch,
                kind: if leave { "leave" } else { "message" },
                state: "sending",
                outgoing: true,
                sender_fp: s.member.fingerprint(),
                sender_name: s.member.name().to_owned(),
                to_fp: to.unwrap_or_default(),
                reply_to: reply_to.unwrap_or_default().to_owned(),
                after,
                content: text.to_owned(),
                read: true,
                seq: 0,
            };
            tx.queue(db::group_row_insert(handle, gid, row, now_ms()));
            let saved = queue_state(&mut tx, handle, &s.member)?;
            tx.commit().await?;
            s.member.saved(&saved);
            match client.post(gid, bytes).await? {
                Posted::Stored(seq) => {
                    let seq_i = i64::try_from(seq).unwrap_or(i64::MAX);
                    // Replayable: lost to a power cut, the next sync marks it from the log.
                    let mut tx = self.store().replayable_tx().await?;
                    tx.queue(db::group_row_posted(handle, gid, &id, seq_i));
                    tx.commit().await?;
                    return Ok(json!({"group": gid, "id": id, "seq": seq}));
                }
                Posted::WrongEpoch(_) => {
                    self.inner.groups.rebases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    db::delete_group_row(&self.store().pool, handle, gid, &id).await?;
                }
            }
        }
        Err(Error::Transport(TransportError::Unreachable(format!("group {gid}: the epoch kept moving; try again"))))
    }

    /// The tips of the session's read frontier in `gid`.
    pub(super) fn frontier(&self, handle: &str, gid: &str) -> Result<Vec<String>> {
        // Only since the session's latest join: after a re-invite, what it read in its old
        // membership is history, not a claim about the group it is in now.
        Ok(self.store().group_frontier(handle, gid)?)
    }

    /// Agent-to-agent hops in `gid` since the session's last operator input there: every group
    /// message, in or out.
    pub(super) async fn lmk_hops(&self, handle: &str, gid: &str) -> Result<i64> {
        Ok(self.store().group_hops(handle, gid).await?)
    }

    /// Operator input in `gid` (the owner sent there, resumed it, or approved a held send): the
    /// loop guard counts from here, and what it paused is released. Returns how many messages
    /// were released.
    pub(in crate::engine) async fn lmk_operator_input(&self, handle: &str, gid: &str) -> Result<u64> {
        self.lmk_group_row(handle, gid)?;
        let before = self.lmk_pending(handle).await?.paused.get(gid).copied().unwrap_or(0);
        self.store().reset_group_loop_guard(handle, gid).await?;
        self.emit(Event::GroupResumed { handle: handle.to_owned(), group: gid.to_owned() });
        Ok(u64::try_from(before).unwrap_or(0))
    }

    /// The group's outbound mode as set (`default`: the profile-wide review policy).
    pub(super) async fn lmk_outbound(&self, handle: &str, gid: &str) -> Result<String> {
        Ok(self.store().group_outbound(handle, gid).await?.unwrap_or_else(|| "default".to_owned()))
    }

    /// Sets the outbound mode of the session's agent sends to `gid`.
    pub(in crate::engine) async fn lmk_set_mode(&self, handle: &str, gid: &str, mode: &str) -> Result<Value> {
        if !matches!(mode, "auto" | "review" | "default") {
            return Err(Error::Invalid("mode must be auto, review or default".into()));
        }
        self.lmk_group_row(handle, gid)?;
        self.store().set_group_outbound(handle, gid, mode).await?;
        Ok(json!({"group": gid, "handle": handle, "mode": mode}))
    }

    /// An agent session's send to `gid`: refused by the loop guard past the limit, held in the
    /// review queue in review mode, sent otherwise.
    pub(in crate::engine) async fn lmk_agent_send(
        &self,
        me: &str,
        gid: &str,
        text: &str,
        to: Option<&str>,
        reply_to: Option<&str>,
    ) -> Result<Value> {
        let (_, _, state) = self.lmk_group_row(me, gid)?;
        Self::require_active(&state, gid)?;
        let policy = self.policy()?;
        let hops = self.lmk_hops(me, gid).await?;
        if hops >= policy.loop_limit {
            return Err(Error::LoopGuard(format!(
                "loop guard: {hops} agent-to-agent messages in group {gid} since your operator last took part \
                 (limit {}); this group is paused until your operator runs `switchboard group resume {gid}`",
                policy.loop_limit
            )));
        }
        let review = match self.lmk_outbound(me, gid).await?.as_str() {
            "review" => true,
            "auto" => false,
            _ => policy.review,
        };
        if !review {
            return self.lmk_send(me, gid, text, to, reply_to).await;
        }
        let to = to.map(canonical_fp);
        let id = self.store().hold_group_send(me, gid, to.as_deref(), text, reply_to, now_ms()).await?;
        Ok(json!({
            "group": gid,
            "id": Value::Null,
            "review_id": id,
            "state": "held_for_review",
            "detail": format!("held until your operator approves it (switchboard review approve {id})"),
        }))
    }
}
