//! What a session is handed: the wait for something due (`lmk_wait`), the delivery policy over its
//! unread rows (steer, digest, loop guard, do-not-disturb), leases and their acks, direct reads
//! with ancestors, the group list and the person's history pages.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use serde_json::{Value, json};

use super::{CATCH_UP, OWNER_HANDLE, mentions, row_dto};
use crate::engine::delivery::{LEASE_MS, digest_due};
use crate::engine::{Error, Event, Result, Runtime};
use crate::protocol::letmeknow::{MAX_WAIT_SECS, fingerprint};
use crate::store::groups::{self as db, GroupMessage};
use crate::transport::letmeknow::LogEntry;
use crate::util::now_ms;

impl Runtime {
    /// A page of `gid`'s log in `handle`'s view, oldest first; `mark_read` (the owner looking)
    /// marks the rows shown read when `handle` is the owner's default session.
    pub(in crate::engine) async fn lmk_history(
        &self,
        handle: &str,
        gid: &str,
        before: Option<i64>,
        limit: Option<u32>,
        mark_read: bool,
    ) -> Result<Value> {
        let limit = limit.unwrap_or(super::HISTORY_PAGE).clamp(1, super::MAX_HISTORY_PAGE);
        self.lmk_group_row(handle, gid)?;
        let rows = self.store().group_log_page(handle, gid, before, i64::from(limit)).await?;
        let owner = self.store().meta(OWNER_HANDLE).await?;
        let newest = rows.last().map(|r| r.rowid_);
        // An agent acting as this session reads by acking its deliveries: the person's look
        // must not take them from it.
        let persons = owner.as_deref() == Some(handle) && !self.store().is_agent(handle).await?;
        if let Some(upto) = newest.filter(|_| mark_read && persons) {
            self.store().mark_group_read(handle, gid, upto).await?;
        }
        let name = self.store().group_names().await?.remove(gid).unwrap_or_default();
        let messages: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "row": r.rowid_,
                    "id": r.id,
                    "seq": r.seq,
                    "kind": r.kind,
                    "state": r.state,
                    "outgoing": r.outgoing != 0,
                    "from": {"name": r.sender_name, "fingerprint": r.sender_fp},
                    "to": r.to_fp,
                    "reply_to": r.reply_to,
                    "content": r.content,
                    "read": r.read != 0,
                    "at": r.created_at,
                })
            })
            .collect();
        Ok(json!({"group": gid, "name": name, "handle": handle, "messages": messages}))
    }

    /// Reads every active group and returns what the delivery policy makes due to the session,
    /// waiting up to `wait_secs` while nothing is: woken by new entries in any group's log
    /// (long-polled without holding the session), by the next digest tick, and by operator
    /// input (do-not-disturb off, a group resumed).
    pub async fn lmk_wait(&self, handle: &str, wait_secs: u64) -> Result<Value> {
        let mut events = self.subscribe();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_secs.min(3600));
        // What the last long-poll brought: (group, cursor it read after, entries).
        let mut news: Option<(String, i64, Vec<LogEntry>)> = None;
        loop {
            let groups = self.store().active_groups_of(handle)?;
            // Each group with the cursor its sync left, taken before the policy look: whatever
            // is added after that (by a follower, or by a removal the sync committed) wakes the
            // poll. A group whose sync fails is not long-polled this round (its log would answer
            // at once, every time): it is retried on the next wake.
            let mut cursors = Vec::new();
            for (gid, relay) in groups {
                let prefetched = news.take_if(|(g, _, _)| *g == gid).map(|(_, after, entries)| (after, entries));
                match self.lmk_sync_from(handle, &gid, 0, prefetched).await {
                    Ok(synced) => cursors.push((gid, relay, synced.cursor)),
                    Err(e) => tracing::debug!(error = %e, group = gid, "group sync"),
                }
            }
            let pending = self.lmk_pending(handle).await?;
            let now_i = tokio::time::Instant::now();
            if !pending.due.is_empty() || now_i >= deadline {
                // The policy's look just made is the one handed out (no second look).
                return self.lmk_hand_out(handle, pending).await;
            }
            let mut until = deadline;
            // The next thing to hand out: a digest tick, or a lease running out unacked.
            let next = [pending.next_due, pending.next_expiry].into_iter().flatten().min();
            if let Some(t) = next.filter(|_| !pending.dnd) {
                until = until.min(now_i + Duration::from_millis(u64::try_from(t - now_ms()).unwrap_or(0)));
            }
            let wait = until.saturating_duration_since(now_i).as_secs().clamp(1, MAX_WAIT_SECS);
            let mut peeks = Vec::new();
            for (gid, relay, cursor) in cursors {
                let client = self.lmk_client(&relay).await?;
                peeks.push(Box::pin(async move {
                    match client.read(&gid, u64::try_from(cursor).unwrap_or(0), wait).await {
                        // Handed to the next round's sync, which processes them without reading again.
                        Ok(entries) if !entries.is_empty() => Some((gid, cursor, entries)),
                        Ok(_) => None,
                        Err(_) => {
                            // A relay that fails at once must not turn this loop into a spin.
                            tokio::time::sleep(Duration::from_secs(wait)).await;
                            None
                        }
                    }
                }));
            }
            let relay_news = async {
                if peeks.is_empty() {
                    std::future::pending::<Option<(String, i64, Vec<LogEntry>)>>().await
                } else {
                    futures_util::future::select_all(peeks).await.0
                }
            };
            let operator = async {
                loop {
                    match events.recv().await {
                        Ok(Event::Dnd { .. } | Event::GroupResumed { .. })
                        | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
                    }
                }
            };
            tokio::select! {
                got = relay_news => news = got,
                () = operator => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// The groups of a session.
    pub async fn lmk_groups(&self, handle: &str) -> Result<Value> {
        let rows = self.store().memberships_of(handle).await?;
        let policy = self.policy()?;
        let pending = self.lmk_pending(handle).await?;
        let names = self.store().group_names().await?;
        let owner = self.store().meta(OWNER_HANDLE).await?;
        let me = self.store().group_session_identity(handle).await?.map(|(k, _)| fingerprint(&k)).unwrap_or_default();
        let mut out = Vec::new();
        for r in rows {
            let gid = r.group_id;
            let others = self.store().group_member_names(handle, &gid, &me).await?;
            let hops = self.lmk_hops(handle, &gid).await?;
            let held = pending.paused.get(&gid).copied().unwrap_or(0);
            let loop_guard = json!({
                "hops": hops,
                "limit": policy.loop_limit,
                "paused": hops >= policy.loop_limit || held > 0,
                "held": held,
            });
            let outbound = self.lmk_outbound(handle, &gid).await?;
            let unread = self.store().group_unread(handle, &gid).await?;
            out.push(json!({
                "name": names.get(&gid).cloned().unwrap_or_default(),
                "member_names": others,
                "own": owner.as_deref() == Some(handle),
                "group": gid,
                "handle": handle,
                "joined_at": r.joined_at,
                "relay": r.relay,
                "state": r.state,
                "unread": unread,
                "mode": outbound,
                "loop_guard": loop_guard,
            }));
        }
        Ok(Value::Array(out))
    }

    /// A message and `ancestors` levels of its causal history (`after`); all of it enters the
    /// session's context (the read frontier).
    pub async fn lmk_read(&self, handle: &str, id: &str, ancestors: usize) -> Result<Value> {
        let first =
            self.store().group_row_by_id(handle, id).await?.ok_or_else(|| Error::UnknownMessage(id.to_owned()))?;
        let gid = first.group_id.clone();
        let mut out = vec![row_dto(&first)];
        let mut rowids = vec![first.rowid_];
        let mut seen = BTreeSet::from([id.to_owned()]);
        let mut queue: VecDeque<(String, usize)> = VecDeque::new();
        queue.extend(first.after_ids().into_iter().map(|a| (a, 1)));
        let mut missing = Vec::new();
        while let Some((aid, depth)) = queue.pop_front() {
            if depth > ancestors || !seen.insert(aid.clone()) {
                continue;
            }
            match self.store().group_row(handle, &gid, &aid).await? {
                Some(row) => {
                    queue.extend(row.after_ids().into_iter().map(|a| (a, depth + 1)));
                    rowids.push(row.rowid_);
                    out.push(row_dto(&row));
                }
                None => missing.push(aid),
            }
        }
        let mut tx = self.store().write_tx().await?;
        for r in rowids {
            db::mark_group_row_read(&mut *tx, r).await?;
        }
        tx.commit().await?;
        Ok(
            json!({"message": out.first().cloned(), "ancestors": out.get(1..).map(<[Value]>::to_vec), "missing": missing}),
        )
    }

    /// What the delivery policy makes of the session's unread rows now (see the module doc).
    pub(super) async fn lmk_pending(&self, handle: &str) -> Result<Pending> {
        let (policy, dnd) = self.policy_and_dnd()?;
        let rows = self.store().unread_group_rows(handle)?;
        let (me, my_name) = self.lmk_identity(handle).await?;
        // The loop guard's hops: every group message, in or out, after the group's last operator
        // input, by rowid; a row is paused when more than the limit precede it (itself included),
        // i.e. from each group's threshold on. (Nothing unread, nothing to weigh.)
        let thresholds = if rows.is_empty() {
            BTreeMap::new()
        } else {
            self.store().group_hop_thresholds(handle, policy.loop_limit)?
        };
        let now = now_ms();
        let mut out = Pending { dnd, ..Default::default() };
        for r in rows {
            // Handed out under a lease still running: neither due nor waiting, until it is acked
            // (read) or runs out (due again, whatever the digest tick says).
            let leased = !r.lease.is_empty();
            let expires = r.leased_at.saturating_add(LEASE_MS);
            if leased && expires > now {
                out.handed += 1;
                out.next_expiry = Some(out.next_expiry.map_or(expires, |t| t.min(expires)));
                continue;
            }
            let rowid = r.rowid_;
            let gid = r.group_id.clone();
            let to = r.to_fp.as_str();
            let kind = r.kind.as_str();
            // Steer when addressed to this session (`to`, or an @mention of its handle or name
            // in a peer's message) and for alerts; digest otherwise.
            let mentioned = kind == "message" && r.outgoing == 0 && mentions(&r.content, &[handle, &my_name]);
            let steer = !to.is_empty() && to == me || kind == "alert" || mentioned;
            let paused = kind == "message" && thresholds.get(&gid).is_some_and(|t| rowid >= *t);
            let due_at = if steer || leased { r.created_at } else { digest_due(r.created_at, policy.digest_ms) };
            if paused {
                *out.paused.entry(gid).or_default() += 1;
            } else if dnd {
                out.dnd_held += 1;
            } else if due_at > now {
                out.next_due = Some(out.next_due.map_or(due_at, |t| t.min(due_at)));
                out.early.push(r);
            } else {
                out.due.push((r, if steer { "steer" } else { "digest" }));
            }
        }
        Ok(out)
    }

    /// Hands the session what is due now (the policy in the module doc), capped at the last
    /// `CATCH_UP` plus the number omitted, under a new lease (`lease`, null when nothing is
    /// handed out): it is read once the lease is acked ([`Self::lmk_ack`]). Rows whose lease ran
    /// out unacked are due again and come marked `redelivered`. What is not due stays unread,
    /// outside the read frontier, and is counted under `held`.
    pub async fn lmk_deliveries(&self, handle: &str) -> Result<Value> {
        let pending = self.lmk_pending(handle).await?;
        self.lmk_hand_out(handle, pending).await
    }

    /// [`Self::lmk_deliveries`] of a policy look already made: rows leased or acked since are
    /// skipped by the lease's own check.
    async fn lmk_hand_out(&self, handle: &str, pending: Pending) -> Result<Value> {
        // Once something is due the session is woken anyway: waiting digest rows ride along (as
        // in the 1:1 queue), in log order.
        let waiting = pending.early.len();
        let mut batch: Vec<(&GroupMessage, &str)> = pending.due.iter().map(|(r, m)| (r, *m)).collect();
        if !batch.is_empty() {
            batch.extend(pending.early.iter().map(|r| (r, "digest")));
            batch.sort_by_key(|(r, _)| r.rowid_);
        }
        let lease = format!("G{}", crate::util::hex(&crate::util::random_array::<16>()));
        let now = now_ms();
        // IMMEDIATE: two concurrent callers for one session must not hand out the same rows.
        // Replayable: a lease lost to a power cut hands its rows out again, as one running out.
        // One statement, sent with `BEGIN` and `COMMIT` in one trip: a concurrent caller may have
        // taken a row (or it was acked meanwhile), and each row is handed over once per lease,
        // so the rows it returns say which were taken.
        let tx = self.store().replayable_tx().await?;
        let rowids: Vec<i64> = batch.iter().map(|(r, _)| r.rowid_).collect();
        let stmts = if rowids.is_empty() {
            Vec::new()
        } else {
            vec![db::lease_group_rows(&rowids, &lease, now, now.saturating_sub(LEASE_MS))]
        };
        let handed: HashMap<i64, i64> = tx.commit_returning::<(i64, i64)>(stmts).await?.into_iter().collect();
        let taken: Vec<(&GroupMessage, &str, bool)> =
            batch.into_iter().filter_map(|(r, mode)| handed.get(&r.rowid_).map(|n| (r, mode, *n > 1))).collect();
        let omitted = taken.len().saturating_sub(CATCH_UP);
        let items: Vec<Value> = taken
            .iter()
            .skip(omitted)
            .map(|(r, mode, again)| {
                let mut v = row_dto(r);
                if let Some(o) = v.as_object_mut() {
                    o.insert("mode".into(), json!(mode));
                    o.insert("redelivered".into(), json!(again));
                }
                v
            })
            .collect();
        let paused: usize = pending.paused.values().sum();
        Ok(json!({
            "handle": handle,
            "lease": if taken.is_empty() { Value::Null } else { Value::String(lease) },
            "omitted": omitted,
            "note": if omitted > 0 { format!("{omitted} earlier omitted") } else { String::new() },
            "items": items,
            "dnd": pending.dnd,
            "held": {
                "digest": if taken.is_empty() { waiting } else { 0 },
                "paused_by_loop_guard": paused,
                "dnd": pending.dnd_held,
            },
            "handed": pending.handed,
            "next_digest_at": if taken.is_empty() { pending.next_due } else { None },
        }))
    }

    /// Acks a group lease that [`Self::lmk_deliveries`] handed out: its rows (only those with the
    /// given `ids`, if any) become read and enter the read frontier. `agent` is the calling
    /// session (`None` for the owner); a lease handed to another session is refused. Acking
    /// twice, or after the rows were handed out again under a new lease, acks nothing.
    pub async fn lmk_ack(&self, agent: Option<&str>, lease: &str, ids: Option<&[String]>) -> Result<Value> {
        // Replayable: an ack lost to a power cut hands the rows out again (at least once).
        let mut tx = self.store().replayable_tx().await?;
        let conn = tx.conn().await?;
        let owners = db::group_lease_holders(conn, lease).await?;
        if let Some(me) = agent
            && owners.iter().any(|o| o != me)
        {
            return Err(Error::Forbidden(format!(
                "group lease `{}` was not handed to session `{me}`",
                crate::engine::delivery::label_value(lease)
            )));
        }
        let rows = db::group_lease_unread(conn, lease).await?;
        let mut acked = 0u64;
        for (rowid, id) in rows {
            if ids.is_some_and(|ids| !ids.contains(&id)) {
                continue;
            }
            acked += db::ack_group_row(conn, rowid, lease).await?;
        }
        tx.commit().await?;
        Ok(json!({"lease": lease, "acked": acked, "agent": owners.first(), "handle": owners.first()}))
    }
}

/// The delivery policy's view of a session's unread group rows at one moment.
#[derive(Default)]
pub(super) struct Pending {
    /// Due now, oldest first, with their mode (steer or digest).
    pub(super) due: Vec<(GroupMessage, &'static str)>,
    /// Digest rows waiting for their tick (they ride along with anything due).
    pub(super) early: Vec<GroupMessage>,
    /// The earliest tick a waiting digest row is due at.
    pub(super) next_due: Option<i64>,
    /// Rows the loop guard holds, per group.
    pub(super) paused: BTreeMap<String, usize>,
    /// Due rows held only by do-not-disturb.
    pub(super) dnd_held: usize,
    /// Rows handed out under a lease that has not run out (not acked yet).
    pub(super) handed: usize,
    /// When the first of those leases runs out.
    pub(super) next_expiry: Option<i64>,
    /// Whether do-not-disturb is on.
    pub(super) dnd: bool,
}
