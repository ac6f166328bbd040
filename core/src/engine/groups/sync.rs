//! Following a group's log: the daemon loop that follows every active membership, the sync that
//! reads the log after the cursor and processes each entry in its own transaction (checks,
//! alerts, merged commits), gap reports and what came before a join.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::{
    CommitEvent, FOLLOW_SCAN, Payload, Session, alert, canonical_fp, commit_rows, queue_state, record_epoch, who,
};
use crate::engine::{Error, Event, Result, Runtime};
use crate::mls::{self, Processed};
use crate::protocol::letmeknow::{MAX_WAIT_SECS, PAGE, message_id};
use crate::store::groups::{self as db, NewGroupRow};
use crate::transport::letmeknow::LogEntry;
use crate::util::{b64u_decode, now_ms};

/// What a sync did: how many log entries it processed, and the cursor it left (a removal it
/// then committed for a leave request may have moved the group's cursor past it).
pub(super) struct Synced {
    pub(super) processed: usize,
    pub(super) cursor: i64,
}

impl Runtime {
    /// Daemon loop: follows every active (session, group) pair, starting a follower for groups
    /// joined since the last scan, so commits are processed, deliveries queued and leave
    /// requests honoured with no command run.
    pub(in crate::engine) async fn lmk_background_loop(self) {
        let mut stop = self.inner.shutdown.subscribe();
        let mut followers: HashMap<(String, String), tokio::task::JoinHandle<()>> = HashMap::new();
        loop {
            if *stop.borrow() {
                break;
            }
            followers.retain(|_, t| !t.is_finished());
            let active = self.store().active_memberships().await;
            match active {
                Ok(rows) => {
                    for (handle, gid) in rows {
                        if followers.contains_key(&(handle.clone(), gid.clone())) {
                            continue;
                        }
                        let rt = self.clone();
                        let (h, g) = (handle.clone(), gid.clone());
                        followers.insert((handle, gid), tokio::spawn(async move { rt.lmk_follow(&h, &g).await }));
                    }
                }
                Err(e) => tracing::warn!("letmeknow: listing groups: {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(FOLLOW_SCAN) => {}
                () = self.inner.groups.joined.notified() => {}
                _ = stop.changed() => break,
            }
        }
        for t in followers.values() {
            t.abort();
        }
    }

    /// Follows one group until the runtime stops or the session is no longer an active member:
    /// long-polls the log outside the session lock (commands on the session are not held up),
    /// and syncs under the lock when something is new (and once at the start, for leave requests
    /// read earlier but not yet honoured).
    pub(super) async fn lmk_follow(&self, handle: &str, gid: &str) {
        let mut stop = self.inner.shutdown.subscribe();
        let mut failures = 0u32;
        let mut first = true;
        loop {
            if *stop.borrow() {
                return;
            }
            let round = async {
                // A deleted session's groups are gone: nothing left to follow.
                let Ok((relay, cursor, state)) = self.lmk_group_row(handle, gid) else {
                    return Ok(false);
                };
                if state != "active" {
                    return Ok(false);
                }
                let mut prefetched = None;
                if !first {
                    let client = self.lmk_client(&relay).await?;
                    let entries = client.read(gid, u64::try_from(cursor).unwrap_or(0), MAX_WAIT_SECS).await?;
                    if entries.is_empty() {
                        return Ok(true);
                    }
                    // Processed as read (no second read), unless the cursor moved meanwhile.
                    prefetched = Some((cursor, entries));
                }
                self.lmk_sync_from(handle, gid, 0, prefetched).await?;
                Ok::<bool, Error>(true)
            };
            let result = tokio::select! {
                r = round => r,
                _ = stop.changed() => return,
            };
            match result {
                Ok(true) => {
                    first = false;
                    failures = 0;
                }
                Ok(false) => return,
                Err(e) => {
                    tracing::info!("letmeknow group {gid} ({handle}): {e}");
                    failures = failures.saturating_add(1);
                    let pause =
                        Duration::from_millis(u64::try_from(crate::engine::backoff_ms(failures)).unwrap_or(1000));
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    }

    /// Reads the group log after the cursor (holding up to `wait_secs` when nothing is new) and
    /// processes it; then honours leave requests. Returns how many entries were processed.
    pub async fn lmk_sync(&self, handle: &str, gid: &str, wait_secs: u64) -> Result<usize> {
        Ok(self.lmk_sync_from(handle, gid, wait_secs, None).await?.processed)
    }

    /// [`Self::lmk_sync`], starting with `prefetched`: entries read (without the session's lock,
    /// by a long-poll) after cursor `.0`; used only if the cursor has not moved since.
    pub(super) async fn lmk_sync_from(
        &self,
        handle: &str,
        gid: &str,
        wait_secs: u64,
        prefetched: Option<(i64, Vec<LogEntry>)>,
    ) -> Result<Synced> {
        let session = self.lmk_load(handle).await?;
        let synced = {
            let mut s = session.lock().await;
            self.sync_locked_from(&mut s, gid, wait_secs, prefetched).await?
        };
        self.honour_leaves(handle, gid).await?;
        Ok(synced)
    }

    pub(super) async fn sync_locked(&self, s: &mut Session, gid: &str, wait_secs: u64) -> Result<usize> {
        Ok(self.sync_locked_from(s, gid, wait_secs, None).await?.processed)
    }

    /// [`Self::sync_locked_from_inner`], then an [`Event::GroupMessage`] for each message or alert
    /// from someone else it stored (also when it failed part-way: what it committed is stored).
    pub(super) async fn sync_locked_from(
        &self,
        s: &mut Session,
        gid: &str,
        wait_secs: u64,
        prefetched: Option<(i64, Vec<LogEntry>)>,
    ) -> Result<Synced> {
        let (relay, cursor, state, mark) = self
            .store()
            .group_sync_start(&s.handle, gid)?
            .ok_or_else(|| Error::Invalid(format!("`{}` is not in group {gid}", s.handle)))?;
        Self::require_active(&state, gid)?;
        let result = self.sync_locked_from_inner(s, gid, &relay, cursor, wait_secs, prefetched).await;
        let new = self.store().group_arrivals_since(&s.handle, gid, mark)?;
        if new.is_empty() {
            return result;
        }
        // Another session of this profile in the same group wrote it: the profile's own message.
        let own = self.lmk_own_fingerprints().await?;
        for (id, from, fp) in new {
            let own = own.contains(&fp);
            self.emit(Event::GroupMessage { handle: s.handle.clone(), group: gid.to_owned(), id, from, own });
        }
        result
    }

    pub(super) async fn sync_locked_from_inner(
        &self,
        s: &mut Session,
        gid: &str,
        relay: &str,
        mut cursor: i64,
        wait_secs: u64,
        mut prefetched: Option<(i64, Vec<LogEntry>)>,
    ) -> Result<Synced> {
        let client = self.lmk_client(relay).await?;
        let mut processed = 0;
        let mut wait = wait_secs.min(MAX_WAIT_SECS);
        loop {
            let entries = match prefetched.take() {
                Some((after, entries)) if after == cursor => entries,
                _ => client.read(gid, u64::try_from(cursor).unwrap_or(0), wait).await?,
            };
            wait = 0;
            // A page short of the relay's page size is all there is: no second read to learn that.
            let last_page = entries.len() < PAGE;
            let Some(first) = entries.first() else { break };
            let first_seq = i64::try_from(first.seq).unwrap_or(i64::MAX);
            // Entries skipped before the first one read: our own posts there are not lost (we
            // have them, and merged our commits when the relay took them). Counted only when
            // something was skipped: the count walks the group's whole log.
            let skipped = first_seq.saturating_sub(cursor + 1);
            let lost = skipped > 0
                && skipped > self.store().own_group_posts_between(&s.handle, gid, cursor, first_seq).await?;
            // Entries gone from the relay (retention) that held no commit: the first one left is
            // still at our epoch (epochs only grow, one per commit), so our MLS state can go on;
            // the session is told what it lost and reads on.
            let our_epoch = if lost { s.member.load_group(gid)?.map(|g| g.epoch().as_u64()) } else { None };
            if lost && our_epoch.is_some() && our_epoch == mls::message_epoch(&first.data) {
                let text = format!(
                    "messages {}..{} of this group are gone from the relay before this session read them (offline \
                     longer than its retention); no membership change was among them, so the session reads on",
                    cursor + 1,
                    first.seq - 1
                );
                let mut tx = self.store().write_tx().await?;
                alert(&mut tx, &s.handle, gid, &format!("lost:{cursor}"), text).await?;
                tx.commit().await?;
            } else if lost {
                let mut tx = self.store().write_tx().await?;
                db::set_membership_state(&mut *tx, &s.handle, gid, "expired").await?;
                let text = format!(
                    "messages {}..{} of this group are gone from the relay (offline longer than its retention): \
                     this session cannot follow the group any more and must be re-invited",
                    cursor + 1,
                    first.seq - 1
                );
                // Keyed by the lost range: a session re-invited and later lost again is told again.
                alert(&mut tx, &s.handle, gid, &format!("expired:{cursor}"), text).await?;
                tx.commit().await?;
                return Err(Error::Forbidden(format!(
                    "group {gid}: this session was offline longer than the relay keeps messages; ask a member to \
                     re-invite it"
                )));
            }
            for entry in entries {
                let seq = i64::try_from(entry.seq).unwrap_or(i64::MAX);
                let removed = self.process_entry(s, gid, seq, &entry.data).await?;
                cursor = seq;
                processed += 1;
                if removed {
                    return Ok(Synced { processed, cursor });
                }
            }
            if last_page {
                break;
            }
        }
        self.report_gaps(&s.handle, gid).await?;
        Ok(Synced { processed, cursor })
    }

    /// Processes one log entry in one transaction; returns whether it removed us.
    pub(super) async fn process_entry(&self, s: &mut Session, gid: &str, seq: i64, data: &[u8]) -> Result<bool> {
        let handle = s.handle.clone();
        let id = message_id(data);
        // Replayable: lost to a power cut, the cursor and the MLS state go back together and the
        // entry is read and processed again from the relay's log.
        // One read first, on this thread (our own row's state, and our authenticator of the
        // epoch the entry's header names, which an application message is checked against);
        // then the transaction's statements are queued and go in one trip with the `COMMIT`.
        let msg_epoch = mls::message_epoch(data).unwrap_or(u64::MAX);
        let header_epoch = i64::try_from(msg_epoch).unwrap_or(i64::MAX);
        let (own, mut auth_at_header) = self.store().group_entry_lookup(&handle, gid, &id, header_epoch)?;
        let mut tx = self.store().replayable_tx().await?;
        tx.queue(db::set_group_cursor(&handle, gid, seq));
        let mut group = s.member.load_group(gid)?.ok_or_else(|| Error::Bug("group state missing".into()))?;
        if let Some(state) = own {
            // Our own message (we cannot decrypt it): a commit we posted but had not merged
            // (the runtime stopped between the relay's answer and the merge) is merged now.
            let mut saved = Vec::new();
            if state == "commit_pending" {
                s.member.merge_pending(&mut group)?;
                record_epoch(tx.conn().await?, &handle, gid, &group).await?;
                saved = queue_state(&mut tx, &handle, &s.member)?;
            }
            tx.queue(db::group_row_posted(&handle, gid, &id, seq));
            s.member.park(group);
            tx.commit().await?;
            s.member.saved(&saved);
            return Ok(false);
        }
        let our_epoch = group.epoch().as_u64();
        let outcome = s.member.process(&mut group, data);
        let mut removed_us = false;
        let mut stored_leave = false;
        match outcome {
            Ok(Processed::Application { sender, data: plain, epoch }) => {
                let epoch_i = i64::try_from(epoch).unwrap_or(i64::MAX);
                match serde_json::from_slice::<Payload>(&plain) {
                    Ok(p) => {
                        // Read first when the epoch is the header's (as it is for every
                        // application message OpenMLS accepts).
                        let ours = if epoch == msg_epoch {
                            auth_at_header.take()
                        } else {
                            let read: Option<(Vec<u8>,)> =
                                tx.fetch_optional(db::epoch_auth(&handle, gid, epoch_i)).await?;
                            read.map(|(a,)| a)
                        };
                        // Every epoch this session is in has its authenticator recorded (create,
                        // join, each merged commit), so a missing one counts as a mismatch too.
                        // A message that fails the check is not delivered: its sender's view of
                        // the group differs from ours, and what it says (a leave request
                        // included) is not acted on.
                        if ours.is_none_or(|ours| b64u_decode(&p.epoch_auth).as_deref() != Some(ours.as_slice())) {
                            alert(
                                tx.conn().await?,
                                &handle,
                                gid,
                                &format!("epoch-auth:{id}"),
                                format!(
                                    "epoch-auth mismatch: {} sent message {id} at epoch {epoch} with an epoch \
                                     authenticator that differs from ours; the relay may be showing members \
                                     different commits (a split group). The message was not delivered",
                                    who(&sender)
                                ),
                            )
                            .await?;
                            let saved = queue_state(&mut tx, &handle, &s.member)?;
                            tx.commit().await?;
                            s.member.saved(&saved);
                            return Ok(false);
                        }
                        // A reply must be to something in the sender's declared context: a
                        // `reply-to` that `after` does not cover (seed 001) would let a message
                        // pose as the answer to one its sender never saw. The text is kept; the
                        // reply link is not, and the owner is told once.
                        let mut reply_to = p.reply_to.unwrap_or_default();
                        if !reply_to.is_empty()
                            && !crate::store::group_context_covers(tx.conn().await?, &handle, gid, &p.after, &reply_to)
                                .await?
                        {
                            alert(
                                tx.conn().await?,
                                &handle,
                                gid,
                                &format!("reply-to:{id}"),
                                format!(
                                    "{} sent message {id} as a reply to {reply_to}, which its context (`after`) \
                                     does not cover; it is shown without the reply link",
                                    who(&sender)
                                ),
                            )
                            .await?;
                            reply_to.clear();
                        }
                        let row = NewGroupRow {
                            id: id.clone(),
                            seq,
                            epoch: epoch_i,
                            kind: if p.leave { "leave" } else { "message" },
                            sender_fp: sender.fingerprint.clone(),
                            sender_name: sender.name.clone(),
                            to_fp: p.to.as_deref().map(canonical_fp).unwrap_or_default(),
                            reply_to,
                            after: p.after,
                            content: p.content,
                            ..Default::default()
                        };
                        tx.queue(db::group_row_insert(&handle, gid, row, now_ms()));
                        stored_leave = p.leave;
                    }
                    Err(e) => {
                        alert(
                            tx.conn().await?,
                            &handle,
                            gid,
                            &format!("payload:{id}"),
                            format!(
                                "{} sent message {id} whose payload is not a letmeknow message ({e}); ignored",
                                who(&sender)
                            ),
                        )
                        .await?;
                    }
                }
            }
            Ok(Processed::Commit { committer, added, removed, self_removed }) => {
                let epoch_i = i64::try_from(group.epoch().as_u64()).unwrap_or(i64::MAX);
                let ev = CommitEvent {
                    id: &id,
                    seq,
                    epoch: epoch_i,
                    committer: &committer,
                    added: &added,
                    removed: &removed,
                    mine: false,
                };
                let conn = tx.conn().await?;
                commit_rows(conn, &handle, gid, ev).await?;
                if self_removed {
                    removed_us = true;
                    db::set_membership_state(&mut *conn, &handle, gid, "removed").await?;
                } else {
                    record_epoch(conn, &handle, gid, &group).await?;
                }
            }
            Err(e) => {
                let why = if msg_epoch == our_epoch {
                    format!(
                        "message {id} (log position {seq}) is at our epoch {our_epoch} but does not decrypt ({e}): the \
                         relay may be showing members different commits (epoch-auth mismatch / split group)"
                    )
                } else {
                    format!(
                        "message {id} (log position {seq}, epoch {msg_epoch}, ours {our_epoch}) was not processed: {e}"
                    )
                };
                alert(tx.conn().await?, &handle, gid, &format!("undecryptable:{id}"), why).await?;
            }
        }
        // Kept for the next operation on this group, unless processing failed (see `park`).
        s.member.park(group);
        let saved = queue_state(&mut tx, &handle, &s.member)?;
        tx.commit().await?;
        s.member.saved(&saved);
        if stored_leave {
            // Counted once committed: a check that counts it reads the request (one that ran
            // before is not taken as covering it).
            self.inner.groups.leave_request_stored(&handle, gid);
        }
        Ok(removed_us)
    }

    /// Alerts for `after` references that never arrived, once each. Judges only the rows after
    /// the group's gap mark (see `Groups::gap_marks`), or the whole log when there is none.
    pub(super) async fn report_gaps(&self, handle: &str, gid: &str) -> Result<()> {
        let key = (handle.to_owned(), gid.to_owned());
        let mark = self.inner.groups.gap_marks.lock().map(|m| m.get(&key).copied()).unwrap_or(None);
        // One read: the rows after the mark, each with the references in its `after` that name
        // no message this session has (or had, before the group TTL).
        let after_mark = match mark {
            Some(mark) => Some(self.store().group_unknown_links_after(handle, gid, mark)?),
            None => None,
        };
        // Rows deleted since (the group TTL, a deleted session) may have freed rowids below the
        // mark (SQLite reuses them only when the newest rows are gone), so finding nothing after
        // the mark is checked against the newest row; finding something proves the newest row
        // is past the mark.
        let after_mark = match (mark, after_mark) {
            (Some(m), Some(rows)) if rows.is_empty() && self.store().group_newest_rowid()? < m => None,
            (_, rows) => rows,
        };
        let (mut missing, judged) = match after_mark {
            Some(rows) => {
                let Some(newest) = rows.last().map(|(rowid, _, _)| *rowid) else { return Ok(()) };
                let mut missing: BTreeMap<String, String> = BTreeMap::new();
                for (_, id, unknown) in rows {
                    if let Some(gap) = unknown {
                        missing.entry(gap).or_insert(id);
                    }
                }
                (missing, newest)
            }
            None => {
                // Taken first: a row added during the scan is judged (again) next time.
                let newest = self.store().group_newest_rowid()?;
                let rows = self.store().group_message_links(handle, gid).await?;
                let mut known: BTreeSet<String> = rows.iter().map(|(id, _)| id.clone()).collect();
                // A message whose content was deleted after the group TTL arrived all the same.
                known.extend(self.store().expired_group_ids(handle, gid).await?);
                let mut missing: BTreeMap<String, String> = BTreeMap::new();
                for (id, after) in &rows {
                    let after: Vec<String> = serde_json::from_str(after).unwrap_or_default();
                    for a in after {
                        if !known.contains(&a) {
                            missing.entry(a).or_insert_with(|| id.clone());
                        }
                    }
                }
                (missing, newest)
            }
        };
        let judged_up_to = |rt: &Self| {
            if let Ok(mut m) = rt.inner.groups.gap_marks.lock() {
                m.insert(key.clone(), judged);
            }
        };
        if missing.is_empty() {
            judged_up_to(self);
            return Ok(());
        }
        // A member's frontier may name messages from before this session joined: those were
        // never ours to receive, so they are no gap. Which they are, the relay's log says.
        match self.pre_join_ids(handle, gid).await {
            Ok(before) => missing.retain(|gap, _| !before.contains(gap)),
            Err(e) => {
                // Without the log we cannot tell a pre-join reference from a gap: decide next
                // time (no mark: the whole log is judged again).
                tracing::debug!(error = %e, group = gid, "reading the log before our join");
                if let Ok(mut m) = self.inner.groups.gap_marks.lock() {
                    m.remove(&key);
                }
                return Ok(());
            }
        }
        if missing.is_empty() {
            judged_up_to(self);
            return Ok(());
        }
        let mut tx = self.store().write_tx().await?;
        for (gap, by) in missing {
            let text = format!(
                "gap: message {gap}, which {by} says its sender had read, never arrived from the relay (withheld or \
                 lost)"
            );
            alert(&mut tx, handle, gid, &format!("gap:{gap}"), text).await?;
        }
        tx.commit().await?;
        judged_up_to(self);
        Ok(())
    }

    /// Ids of the log entries before this session's latest join of `gid` (empty for the member
    /// that created the group), read from the relay once per runtime and join. Entries the relay
    /// has already dropped (retention) are not among them.
    pub(super) async fn pre_join_ids(&self, handle: &str, gid: &str) -> Result<Arc<BTreeSet<String>>> {
        let joined = self.store().group_join_seq(handle, gid).await?;
        let Some(joined) = joined.filter(|j| *j > 0) else { return Ok(Arc::default()) };
        let key = (handle.to_owned(), gid.to_owned(), joined);
        if let Some(ids) = self.inner.groups.pre_join.lock().await.get(&key) {
            return Ok(ids.clone());
        }
        let (relay, _, _) = self.lmk_group_row(handle, gid)?;
        let client = self.lmk_client(&relay).await?;
        let mut ids = BTreeSet::new();
        let mut after = 0u64;
        'pages: loop {
            let page = client.read(gid, after, 0).await?;
            let Some(last) = page.last().map(|e| e.seq) else { break };
            for e in page {
                if i64::try_from(e.seq).unwrap_or(i64::MAX) >= joined {
                    break 'pages;
                }
                ids.insert(message_id(&e.data));
            }
            after = last;
        }
        let ids = Arc::new(ids);
        self.inner.groups.pre_join.lock().await.insert(key, ids.clone());
        Ok(ids)
    }

    pub(in crate::engine) async fn lmk_sync_best_effort(&self, handle: &str, gid: &str) {
        if let Err(e) = self.lmk_sync(handle, gid, 0).await {
            tracing::debug!(error = %e, group = gid, "group sync");
        }
    }
}
