//! Who is in a group: creating one, invites (a task of this runtime admits the joiner), joining
//! through a link, commits that add or remove members (rebased when another commit wins the
//! epoch), leaving, honouring others' leave requests, deleting a session.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::{
    CommitEvent, InviteRecord, MAX_REBASES, Session, Stage, canonical_fp, commit_rows, group_name, note_member,
    record_epoch, save_state, who,
};
use crate::engine::{Error, Event, Result, Runtime};
use crate::mls::{self, Member};
use crate::protocol::letmeknow::invite::{InviteLink, Role, new_owner_token};
use crate::protocol::letmeknow::wire::{JoinBlob, WelcomeBlob};
use crate::protocol::letmeknow::{INVITE_TTL, MAX_WAIT_SECS, is_id, message_id, new_id};
use crate::store::groups::{self as db, NewGroupRow};
use crate::store::name_group_if_unnamed;
use crate::transport::TransportError;
use crate::transport::letmeknow::Posted;
use crate::util::{OsRng, b64u, b64u_decode, now_ms};

impl Runtime {
    /// A new group named `name`, made by the owner's default session.
    pub(in crate::engine) async fn lmk_create(&self, name: &str) -> Result<Value> {
        let name = group_name(name)?;
        let handle = self.lmk_owner_handle().await?;
        let session = self.lmk_load(&handle).await?;
        let (gid, _) = {
            let s = session.lock().await;
            self.lmk_new_group(&s).await?
        };
        self.store().set_group_name(&gid, &name, now_ms()).await?;
        Ok(json!({"group": gid, "name": name, "handle": handle}))
    }

    /// The invites this runtime opened since it started, newest first.
    pub(in crate::engine) fn lmk_invites(&self) -> Value {
        let now = now_ms();
        let Ok(invites) = self.inner.groups.invites.lock() else { return json!([]) };
        let mut out: Vec<(i64, Value)> = invites
            .iter()
            .map(|(id, r)| {
                let (state, joined, error) = match &r.outcome {
                    Some(Ok(name)) => ("used", name.as_str(), ""),
                    Some(Err(_)) | None if now >= r.expires_at => ("expired", "", ""),
                    Some(Err(e)) => ("failed", "", e.as_str()),
                    None => ("waiting", "", ""),
                };
                let v = json!({"invite": id, "group": r.group, "link": r.link, "expires_at": r.expires_at,
                    "state": state, "joined": joined, "error": error});
                (r.expires_at, v)
            })
            .collect();
        out.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
        Value::Array(out.into_iter().map(|(_, v)| v).collect())
    }

    /// Forgets a send the log did not take: the pending MLS state and its message row, committed
    /// with the member's state.
    pub(super) async fn drop_pending_send(
        &self,
        s: &Session,
        group: &mut openmls::group::MlsGroup,
        gid: &str,
        id: &str,
    ) -> Result<()> {
        s.member.discard_pending(group)?;
        let mut tx = self.store().write_tx().await?;
        db::delete_group_row(&mut *tx, &s.handle, gid, id).await?;
        let saved = save_state(&mut tx, &s.handle, &s.member).await?;
        tx.commit().await?;
        s.member.saved(&saved);
        Ok(())
    }

    /// Posts a commit the caller staged with `stage`, rebasing when another commit wins the
    /// epoch. Returns the commit's seq and the Welcome if there is one.
    pub(super) async fn commit_with(
        &self,
        s: &mut Session,
        gid: &str,
        stage: &Stage<'_>,
    ) -> Result<(i64, Option<Vec<u8>>)> {
        let (relay, _, state) = self.lmk_group_row(&s.handle, gid)?;
        Self::require_active(&state, gid)?;
        let client = self.lmk_client(&relay).await?;
        for _ in 0..MAX_REBASES {
            self.sync_locked(s, gid, 0).await?;
            let mut group = s.member.load_group(gid)?.ok_or_else(|| Error::Bug("group state missing".into()))?;
            let (commit, welcome) = stage(&s.member, &mut group)?;
            let id = message_id(&commit);
            // The pending commit is durable before the relay sees it, so a crash in between is
            // recovered when the commit comes back from the log.
            let mut tx = self.store().write_tx().await?;
            let row = NewGroupRow {
                id: id.clone(),
                kind: "event",
                state: "commit_pending",
                outgoing: true,
                read: true,
                ..Default::default()
            };
            db::insert_group_row(&mut tx, &s.handle, gid, row, now_ms()).await?;
            let saved = save_state(&mut tx, &s.handle, &s.member).await?;
            tx.commit().await?;
            s.member.saved(&saved);
            match client.post(gid, commit).await {
                Ok(Posted::Stored(seq)) => {
                    let seq = i64::try_from(seq).unwrap_or(i64::MAX);
                    // From the staged commit, not a before/after diff: a re-add keeps the
                    // member's fingerprint (and usually its leaf) but is still a remove and an add.
                    let (added, removed) = Member::pending_changes(&group);
                    s.member.merge_pending(&mut group)?;
                    let after = mls::members(&group);
                    let me = mls::MemberInfo {
                        name: s.member.name().to_owned(),
                        fingerprint: s.member.fingerprint(),
                        leaf: group.own_leaf_index().u32(),
                    };
                    let added: Vec<_> = added
                        .into_iter()
                        .map(|a| after.iter().find(|m| m.fingerprint == a.fingerprint).cloned().unwrap_or(a))
                        .collect();
                    let mut tx = self.store().write_tx().await?;
                    db::delete_group_row(&mut *tx, &s.handle, gid, &id).await?;
                    let epoch = i64::try_from(group.epoch().as_u64()).unwrap_or(i64::MAX);
                    let ev = CommitEvent {
                        id: &id,
                        seq,
                        epoch,
                        committer: &me,
                        added: &added,
                        removed: &removed,
                        mine: true,
                    };
                    commit_rows(&mut tx, &s.handle, gid, ev).await?;
                    record_epoch(&mut tx, &s.handle, gid, &group).await?;
                    let saved = save_state(&mut tx, &s.handle, &s.member).await?;
                    tx.commit().await?;
                    s.member.saved(&saved);
                    return Ok((seq, welcome));
                }
                Ok(Posted::WrongEpoch(_)) => {
                    // Another member's commit won this epoch: drop ours, process theirs, retry.
                    self.inner.groups.rebases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.drop_pending_send(s, &mut group, gid, &id).await?;
                }
                Err(e) => {
                    self.drop_pending_send(s, &mut group, gid, &id).await?;
                    return Err(e.into());
                }
            }
        }
        Err(Error::Transport(TransportError::Unreachable(format!(
            "group {gid}: lost the epoch race {MAX_REBASES} times in a row; try again"
        ))))
    }

    /// Creates a group (when `group` is `None`) and an invite; a task of this runtime admits the
    /// joiner. Returns `{group, link, expires_at, invite}`.
    pub async fn lmk_invite(&self, handle: &str, group: Option<&str>, ttl_secs: Option<u64>) -> Result<Value> {
        let session = self.lmk_load(handle).await?;
        let ttl = ttl_secs.unwrap_or(INVITE_TTL).clamp(1, crate::protocol::letmeknow::MAX_INVITE_TTL);
        let (gid, relay) = {
            let s = session.lock().await;
            match group {
                Some(gid) => {
                    let (relay, _, state) = self.lmk_group_row(handle, gid)?;
                    Self::require_active(&state, gid)?;
                    (gid.to_owned(), relay)
                }
                None => self.lmk_new_group(&s).await?,
            }
        };
        let inviter = session.lock().await.member.name().to_owned();
        let group_name = self.store().group_names().await?.remove(&gid);
        let client = self.lmk_client(&relay).await?;
        let link = InviteLink::generate(client.base(), &mut OsRng).with_names(Some(&inviter), group_name.as_deref());
        let owner = new_owner_token(&mut OsRng);
        client.create_invite(&link.id, ttl, &owner).await?;
        let expires_at = now_ms() + i64::try_from(ttl * 1000).unwrap_or(i64::MAX);
        if let Ok(mut invites) = self.inner.groups.invites.lock() {
            let record = InviteRecord { group: gid.clone(), link: link.to_link(), expires_at, outcome: None };
            invites.insert(link.id.clone(), record);
        }
        let rt = self.clone();
        let (h, g, l) = (handle.to_owned(), gid.clone(), link.clone());
        let task = tokio::spawn(async move {
            let out = rt.lmk_admit(&h, &g, &l, &owner, expires_at).await;
            let outcome = match &out {
                Ok(v) => Ok(v.pointer("/joined/name").and_then(Value::as_str).unwrap_or_default().to_owned()),
                Err(e) => Err(e.to_string()),
            };
            if let Ok(mut invites) = rt.inner.groups.invites.lock()
                && let Some(r) = invites.get_mut(&l.id)
            {
                r.outcome = Some(outcome);
            }
            rt.emit(Event::GroupChanged { group: g.clone() });
            out
        });
        self.inner.groups.admissions.lock().await.insert(link.id.clone(), task);
        Ok(json!({"group": gid, "link": link.to_link(), "expires_at": expires_at, "invite": link.id}))
    }

    /// A new group with `s` as its only member, on the profile's relay: (group id, relay).
    pub(super) async fn lmk_new_group(&self, s: &Session) -> Result<(String, String)> {
        let handle = &s.handle;
        let gid = new_id(&mut OsRng);
        let g = s.member.create_group(&gid)?;
        let relay = self.relay_url().trim_end_matches('/').to_owned();
        let mut tx = self.store().write_tx().await?;
        db::insert_group(&mut tx, handle, &gid, &relay, now_ms()).await?;
        let me = mls::MemberInfo { name: s.member.name().to_owned(), fingerprint: s.member.fingerprint(), leaf: 0 };
        note_member(&mut tx, handle, &gid, &me, "").await?;
        record_epoch(&mut tx, handle, &gid, &g).await?;
        let saved = save_state(&mut tx, handle, &s.member).await?;
        tx.commit().await?;
        s.member.saved(&saved);
        self.inner.groups.joined.notify_one();
        Ok((gid, relay))
    }

    /// Waits for the admission of an invite this runtime opened to end; its outcome.
    pub async fn lmk_invite_wait(&self, invite: &str) -> Result<Value> {
        let task = self
            .inner
            .groups
            .admissions
            .lock()
            .await
            .remove(invite)
            .ok_or_else(|| Error::Invalid(format!("no invite `{invite}` is waiting in this runtime")))?;
        task.await.map_err(|e| Error::Bug(e.to_string()))?
    }

    /// The inviter's side: wait for the join, commit the Add, post the Welcome.
    pub(super) async fn lmk_admit(
        &self,
        handle: &str,
        gid: &str,
        link: &InviteLink,
        owner: &str,
        expires_at: i64,
    ) -> Result<Value> {
        let (relay, _, _) = self.lmk_group_row(handle, gid)?;
        let client = self.lmk_client(&relay).await?;
        let data = loop {
            let left = (expires_at - now_ms()).max(0) / 1000;
            if left == 0 {
                return Err(Error::Invalid("the invite expired before anyone joined".into()));
            }
            match client.get_blob(&link.id, false, left.unsigned_abs().min(MAX_WAIT_SECS)).await {
                Ok(Some(data)) => break data,
                Ok(None) => {}
                Err(TransportError::Status { status: 404, .. }) => {
                    return Err(Error::Invalid("the invite expired before anyone joined".into()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for a join");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let key = link.key();
        let blob = key.open(Role::Join, &data).map_err(|_| {
            Error::Peer(
                "the join request does not decrypt with this invite's secret (a wrong link or tampering); the invite \
                 is spent"
                    .into(),
            )
        })?;
        let blob: JoinBlob =
            serde_json::from_slice(&blob).map_err(|e| Error::Peer(format!("malformed join request: {e}")))?;
        let kp_bytes = b64u_decode(&blob.key_package).ok_or_else(|| Error::Peer("malformed KeyPackage".into()))?;
        let session = self.lmk_load(handle).await?;
        let mut s = session.lock().await;
        let (_, joiner) = s.member.inspect_key_package(&kp_bytes)?;
        let stage = |m: &Member, g: &mut openmls::group::MlsGroup| -> Result<(Vec<u8>, Option<Vec<u8>>)> {
            let (kp, who) = m.inspect_key_package(&kp_bytes)?;
            // The same session (same signature key) already has a leaf: its state fell behind
            // (offline past the relay's retention). One commit removes the stale leaf and adds
            // the new KeyPackage, so members see it re-added, once. A new session key with the
            // same display name is a new member: a plain Add.
            let stale = mls::members(g).into_iter().find(|x| x.fingerprint == who.fingerprint);
            let (commit, welcome) = match stale {
                Some(old) if old.leaf == g.own_leaf_index().u32() => {
                    return Err(Error::Invalid("a session cannot join a group through its own invite".into()));
                }
                Some(old) => m.readd(g, old.leaf, kp)?,
                None => m.add(g, kp)?,
            };
            Ok((commit, Some(welcome)))
        };
        let (seq, welcome) = self.commit_with(&mut s, gid, &stage).await?;
        drop(s);
        let welcome = welcome.ok_or_else(|| Error::Bug("an Add without a Welcome".into()))?;
        let blob = WelcomeBlob {
            welcome: b64u(&welcome),
            group: gid.to_owned(),
            relay: relay.clone(),
            seq: seq.max(0).unsigned_abs(),
            name: self.store().group_names().await?.remove(gid),
        };
        let sealed = key
            .seal(Role::Welcome, &serde_json::to_vec(&blob).map_err(|e| Error::Bug(e.to_string()))?, &mut OsRng)
            .map_err(|e| Error::Bug(e.to_string()))?;
        client.put_blob(&link.id, true, Some(owner), &sealed).await?;
        Ok(json!({"group": gid, "joined": {"name": joiner.name, "fingerprint": joiner.fingerprint}}))
    }

    /// The joiner's side: posts the KeyPackage, waits (up to `timeout_secs`, default 11
    /// minutes) for the Welcome, joins and reads the log. Returns `{group, members}`.
    pub async fn lmk_join(&self, handle: &str, link: &str, timeout_secs: Option<u64>) -> Result<Value> {
        let link = InviteLink::parse(link)?;
        let session = self.lmk_load(handle).await?;
        // A relay that is not ours is trusted only by a pin a contact's LAN announcement or the
        // owner vouched for (else the web PKI); a certificate refusal names what the relay
        // presented, so the owner can be asked.
        let (client, foreign) = match self.lmk_foreign(&link.relay).await? {
            Some((client, foreign)) => (client, Some(foreign)),
            None => (self.lmk_client(&link.relay).await?, None),
        };
        let relay_error = |e: TransportError| match &foreign {
            Some(f) => f.error(e),
            None => e.into(),
        };
        let key = link.key();
        let sealed = {
            let s = session.lock().await;
            let kp = s.member.key_package()?;
            // The KeyPackage's private keys must be durable before anyone can use it.
            let mut tx = self.store().write_tx().await?;
            let saved = save_state(&mut tx, handle, &s.member).await?;
            tx.commit().await?;
            s.member.saved(&saved);
            let blob = JoinBlob { key_package: b64u(&kp), name: s.member.name().to_owned() };
            key.seal(Role::Join, &serde_json::to_vec(&blob).map_err(|e| Error::Bug(e.to_string()))?, &mut OsRng)
                .map_err(|e| Error::Bug(e.to_string()))?
        };
        match client.put_blob(&link.id, false, None, &sealed).await {
            Ok(()) => {}
            Err(TransportError::Status { status: 404, .. }) => {
                return Err(Error::Invalid("this invite is unknown or expired: ask for a new link".into()));
            }
            Err(TransportError::Status { status: 409, .. }) => {
                return Err(Error::Invalid("this invite was already used: ask for a new link".into()));
            }
            Err(e) => return Err(relay_error(e)),
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout_secs.unwrap_or(660));
        let data = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now()).as_secs();
            if left == 0 {
                return Err(Error::Invalid("no Welcome arrived: the inviter did not admit this join in time".into()));
            }
            match client.get_blob(&link.id, true, left.min(MAX_WAIT_SECS)).await {
                Ok(Some(data)) => break data,
                Ok(None) => {}
                Err(TransportError::Status { status: 404, .. }) => {
                    return Err(Error::Invalid("the invite expired before the inviter admitted this join".into()));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let blob = key
            .open(Role::Welcome, &data)
            .map_err(|_| Error::Peer("the Welcome does not decrypt with this link's secret (tampering?)".into()))?;
        let blob: WelcomeBlob =
            serde_json::from_slice(&blob).map_err(|e| Error::Peer(format!("malformed Welcome: {e}")))?;
        if !is_id(&blob.group) {
            return Err(Error::Peer("the Welcome names a malformed group id".into()));
        }
        let welcome = b64u_decode(&blob.welcome).ok_or_else(|| Error::Peer("malformed Welcome".into()))?;
        {
            let s = session.lock().await;
            let group = s.member.join(&welcome)?;
            if group.group_id().as_slice() != blob.group.as_bytes() {
                return Err(Error::Peer("the Welcome is for another group than it claims".into()));
            }
            let members = mls::members(&group);
            let mut tx = self.store().write_tx().await?;
            let cursor = i64::try_from(blob.seq).unwrap_or(i64::MAX);
            db::join_group(&mut tx, handle, &blob.group, blob.relay.trim_end_matches('/'), cursor, now_ms()).await?;
            for m in &members {
                note_member(&mut tx, handle, &blob.group, m, "").await?;
            }
            // Joining a group this session was in before (re-invited after falling behind the
            // relay's retention, or after a removal): its old rows stay as history, the cursor
            // and state were reset above, and authenticators it recorded for epochs from this
            // one on belong to the old membership (perhaps a fork): the Welcome's replace them.
            let epoch = i64::try_from(group.epoch().as_u64()).unwrap_or(i64::MAX);
            db::forget_epoch_auth_from(&mut tx, handle, &blob.group, epoch).await?;
            let names = members.iter().map(who).collect::<Vec<_>>().join(", ");
            let row = NewGroupRow {
                id: format!("joined:{}", blob.seq),
                seq: i64::try_from(blob.seq).unwrap_or(0),
                epoch: i64::try_from(group.epoch().as_u64()).unwrap_or(0),
                kind: "event",
                content: format!("you joined; members: {names}"),
                ..Default::default()
            };
            db::insert_group_row(&mut tx, handle, &blob.group, row, now_ms()).await?;
            // The inviter's name for the group (the Welcome's, else the link's) becomes ours,
            // unless we named it before (a re-join).
            let suggested = blob.name.as_deref().or(link.group.as_deref()).and_then(|n| group_name(n).ok());
            if let Some(name) = suggested {
                name_group_if_unnamed(&mut tx, &blob.group, &name, now_ms()).await?;
            }
            record_epoch(&mut tx, handle, &blob.group, &group).await?;
            let saved = save_state(&mut tx, handle, &s.member).await?;
            tx.commit().await?;
            s.member.saved(&saved);
            self.inner.groups.joined.notify_one();
        }
        self.lmk_sync(handle, &blob.group, 0).await?;
        let members = self.lmk_members(handle, &blob.group).await?;
        let name = self.store().group_names().await?.remove(&blob.group).unwrap_or_default();
        Ok(json!({"group": blob.group, "name": name, "handle": handle, "members": members.get("members").cloned()}))
    }

    /// Members of `gid` as this session sees them: name, fingerprint, who added them.
    pub async fn lmk_members(&self, handle: &str, gid: &str) -> Result<Value> {
        let session = self.lmk_load(handle).await?;
        let s = session.lock().await;
        let group =
            s.member.load_group(gid)?.ok_or_else(|| Error::Invalid(format!("`{handle}` is not in group {gid}")))?;
        let notes: BTreeMap<String, String> = self.store().group_member_notes(handle, gid).await?.into_iter().collect();
        let me = s.member.fingerprint();
        let members: Vec<Value> = mls::members(&group)
            .iter()
            .map(|m| {
                json!({
                    "name": m.name,
                    "fingerprint": m.fingerprint,
                    "invited_by": notes.get(&m.fingerprint).cloned().unwrap_or_default(),
                    "you": m.fingerprint == me,
                })
            })
            .collect();
        Ok(json!({"group": gid, "epoch": group.epoch().as_u64(), "members": members}))
    }

    /// Removes the member with `fp` from `gid` (a commit).
    pub async fn lmk_remove(&self, handle: &str, gid: &str, fp: &str) -> Result<Value> {
        let fp = canonical_fp(fp);
        let session = self.lmk_load(handle).await?;
        let mut s = session.lock().await;
        if fp == s.member.fingerprint() {
            return Err(Error::Invalid("to leave a group use `group leave`".into()));
        }
        let target = fp.clone();
        let stage = move |m: &Member, g: &mut openmls::group::MlsGroup| -> Result<(Vec<u8>, Option<Vec<u8>>)> {
            let leaf = mls::members(g)
                .into_iter()
                .find(|x| x.fingerprint == target)
                .ok_or_else(|| Error::UnknownMember(target.to_owned()))?
                .leaf;
            Ok((m.remove(g, &[leaf])?, None))
        };
        let (seq, _) = self.commit_with(&mut s, gid, &stage).await?;
        Ok(json!({"group": gid, "removed": fp, "seq": seq}))
    }

    /// Deletes group session `handle` (owner only): leaves each of its active groups (the others
    /// commit the removal), then erases its MLS state and its decrypted log (seed 001: the log is
    /// deleted with the session). A group that could not be told (its relay down) is named in the
    /// answer; the session is deleted all the same, since the owner asked for its keys to go.
    pub async fn lmk_session_delete(&self, handle: &str) -> Result<Value> {
        let session = self.lmk_load(handle).await?;
        let groups: Vec<String> = self.store().active_groups_of(handle)?.into_iter().map(|(g, _)| g).collect();
        let (mut left, mut not_told) = (Vec::new(), Vec::new());
        for g in &groups {
            match self.lmk_leave(handle, g).await {
                Ok(_) => left.push(json!(g)),
                Err(e) => not_told.push(json!({"group": g, "error": e.to_string()})),
            }
        }
        {
            // Under the session's lock: no sync of it is halfway through a write.
            let _held = session.lock().await;
            self.store().delete_group_session(handle).await?;
            self.inner.groups.sessions.lock().await.remove(handle);
            self.inner.groups.sessions_changed(handle);
        }
        for g in groups {
            self.emit(Event::GroupChanged { group: g });
        }
        Ok(json!({"handle": handle, "deleted": true, "left": left, "not_told": not_told}))
    }

    /// Leaves `gid`: asks the other members to commit our removal, then stops following it.
    pub async fn lmk_leave(&self, handle: &str, gid: &str) -> Result<Value> {
        let sent = self.lmk_post_app(handle, gid, "(leaving the group)", None, None, true).await?;
        db::set_membership_state(&self.store().pool, handle, gid, "left").await?;
        Ok(json!({"group": gid, "left": true, "request": sent.get("id").cloned()}))
    }

    /// Commits the removal of members who asked to leave and are still in the group. Once every
    /// request is found honoured or moot, nothing is read again until another one is stored
    /// (a request stays in the log after its sender is gone).
    pub(super) async fn honour_leaves(&self, handle: &str, gid: &str) -> Result<()> {
        let Some(seen) = self.inner.groups.leaves_to_check(handle, gid) else { return Ok(()) };
        // Nobody asked (the common case, one indexed look): nothing more to read.
        let leavers = self.store().group_leavers(handle, gid)?;
        if leavers.is_empty() {
            self.inner.groups.leaves_settled(handle, gid, seen);
            return Ok(());
        }
        let (_, _, state) = self.lmk_group_row(handle, gid)?;
        if state != "active" {
            return Ok(());
        }
        for fp in leavers {
            let still = {
                let session = self.lmk_load(handle).await?;
                let s = session.lock().await;
                let group = s.member.load_group(gid)?;
                group.is_some_and(|g| mls::members(&g).iter().any(|m| m.fingerprint == fp))
            };
            if still {
                match self.lmk_remove(handle, gid, &fp).await {
                    Ok(_) => {}
                    // Another member removed it first (we rebased onto their commit).
                    Err(Error::UnknownMember(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        self.inner.groups.leaves_settled(handle, gid, seen);
        Ok(())
    }
}
