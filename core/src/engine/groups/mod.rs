//! letmeknow groups in the runtime: each agent session (a random two-word handle) is its own MLS
//! member, with its own signing key, across all its groups.
//!
//! - `invite` creates the group if needed, opens an invite on the relay (10 minutes, single
//!   use) and returns the link; a task of this runtime waits for the join, commits the Add and
//!   posts the Welcome under the owner token;
//! - `join LINK` posts an encrypted KeyPackage, waits for the Welcome, joins at the epoch the
//!   Add created and reads the log after the Add;
//! - every commit (add, remove) is posted at the epoch the relay holds; losing the
//!   compare-and-set (`409`) discards the pending commit, processes the winner and retries;
//! - reading the log processes each entry in its own transaction: message rows, cursor and the
//!   OpenMLS state snapshot commit together. Own messages are recognised by id (hash of the
//!   ciphertext) and skipped;
//! - checks: `epoch-auth` against our own authenticator of that epoch, `after` references that
//!   never arrived (gap), messages that do not decrypt at our epoch (a relay showing members
//!   different commits), and a log that starts beyond our cursor (offline past retention: the
//!   session must be re-invited). Each becomes an `alert` row the session sees.
//! - the read frontier: a message is read once it entered the agent's context (handed out by
//!   `deliveries`/`listen` *and acked*, fetched by `read`, replied to, or written by the session);
//!   `after` carries the tips of that set. A row handed out but not yet acked is not read: the
//!   adapter may die before its harness has it, and a frontier claiming it would tell the group
//!   the session saw something it never did (and hide the row from the redelivery).
//! - **leases** (as for 1:1 deliveries, `delivery`): `deliveries` hands due rows out under a
//!   random lease id (`G…`, so the one `ack` op tells group leases from 1:1 ones) that the answer
//!   carries; the adapter acks it once its harness has the items, which marks them read. A lease
//!   not acked within [`LEASE_MS`] makes its rows due again: handed out under a new lease, marked
//!   `redelivered`. A session acks only its own leases, the owner any. Rows a catch-up omits (past
//!   [`CATCH_UP`]) ride under the same lease, so a full ack marks them read as before; an ack by
//!   `ids` marks only the rows it names. `read ID` (a direct fetch, whose answer is the content)
//!   marks read at once, as the 1:1 `read ID` does.
//!
//! Delivery policy (the 1:1 policy of `delivery`, applied to each session's unread group rows
//! when they are handed over, so nothing is classified twice and changing the policy applies to
//! what is still unread):
//! - **steer**: addressed to the session (`to` = its fingerprint, an `@handle`/`@name` mention)
//!   and alerts: due at once. **digest**: everything else, due at the 1:1 digest tick
//!   (`digest_due`, `policy_digest_secs`). Once something is due, waiting digest rows ride
//!   along (as in 1:1 queues); until then they stay unread, outside the frontier and `after`.
//!   `lmk_wait` wakes on new log entries, at the next tick, when a lease expires unacked and on
//!   operator input, never spins.
//! - **loop guard** per (session, group): group messages in and out after `lmk_policy.reset_rowid`
//!   are hops; a message with more than `policy_loop_limit` hops up to it is paused (kept unread,
//!   no one woken; alerts and events still pass), and an agent session's send is refused with
//!   `loop_guard` once the hops reach the limit. Operator input (the owner's `GroupSend`,
//!   `GroupResume`, approving a held send) moves the reset to the newest row: paused rows are
//!   released because they no longer count.
//! - **outbound mode** per (session, group), `lmk_policy.outbound`: `auto`, `review` or
//!   `default` (the profile's `policy_review`, as for contacts). In review an agent session's send
//!   waits in `review_queue` (`group_id`, `to_fp`); the owner's approval sends it as the session,
//!   denial drops it. The owner's own sends are never reviewed.
//! - **do-not-disturb** (`delivery`): nothing is handed over while it is on (not even rows whose
//!   lease expired); it is all kept.
//!
//! The person's own conversations (the desktop window): the owner acts through one **default
//! session** (meta `lmk_owner_handle`, display name = the profile's name, created on first use),
//! so creating, inviting and joining never ask for a handle; a request naming a group without a
//! handle acts as the session in that group (the default one first). Groups carry a local name
//! (`lmk_group_names`: set at creation, taken from the inviter's name for it on join, renamable);
//! invite links state the inviter's name and the group's. `GroupHistory` pages a group's log for
//! the window; with `mark_read` the rows shown enter the default session's read frontier (never an
//! agent session's, nor the default session's while an agent acts as it: their rows are read when
//! the agent acks them). `GroupInvites` says what became
//! of the invites this runtime opened (waiting, used by whom, expired).
//!
//! The parts: this file holds the shared state, the log-row helpers and the request dispatch
//! with handle resolution; `sync` follows and processes logs, `membership` creates, invites,
//! joins, removes and leaves, `send` posts messages under the loop guard and review, and
//! `deliveries` hands rows to sessions under leases. Every statement they need is a function
//! of `store::groups`.

mod deliveries;
mod membership;
mod send;
mod sync;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::delivery::{Label, fence};
use super::relays::ForeignRelay;
use super::{Error, Event, Result, Runtime};
use crate::mls::{self, Member};
use crate::protocol::letmeknow::fingerprint;
use crate::store::groups::{self as db, GroupMessage, NewGroupRow};
use crate::store::{BatchTx, Stmt};
use crate::transport::letmeknow::LetmeknowClient;
use crate::util::now_ms;

/// Messages a catch-up delivers at most; older unread ones are counted as omitted.
pub const CATCH_UP: usize = 20;
/// How often a commit or send is retried after losing the epoch race.
const MAX_REBASES: usize = 8;
/// How often the daemon looks for groups joined since its last look (a join in this runtime
/// wakes it at once; the scan catches groups another process joined on the same profile).
const FOLLOW_SCAN: Duration = Duration::from_secs(2);
/// Meta key of the owner's default group session.
const OWNER_HANDLE: &str = "lmk_owner_handle";
/// Longest local group name (characters).
const MAX_GROUP_NAME: usize = 64;
/// Rows a history page holds by default, and at most.
const HISTORY_PAGE: u32 = 200;
const MAX_HISTORY_PAGE: u32 = 1000;

const ADJECTIVES: &[&str] = &[
    "amber", "brave", "calm", "deft", "eager", "fair", "gentle", "hardy", "ivory", "jolly", "keen", "lucid", "mellow",
    "nimble", "olive", "plucky", "quiet", "rapid", "sunny", "tidy", "upbeat", "vivid", "witty", "young",
];
const NOUNS: &[&str] = &[
    "otter", "falcon", "maple", "harbor", "comet", "badger", "willow", "lantern", "pebble", "heron", "cedar", "meadow",
    "beacon", "fjord", "quartz", "sparrow", "thistle", "walrus", "yarrow", "zephyr", "canyon", "ember",
];

/// A random two-word handle for a new group session.
pub fn random_handle() -> String {
    let r: [u8; 2] = crate::util::random_array();
    let a = ADJECTIVES.get(usize::from(r[0]) % ADJECTIVES.len()).copied().unwrap_or("calm");
    let n = NOUNS.get(usize::from(r[1]) % NOUNS.len()).copied().unwrap_or("otter");
    format!("{a}-{n}")
}

/// The plaintext inside every application message (`specs/letmeknow-relay.md`), plus our one
/// extension: `leave`, a member asking the others to commit its removal.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Payload {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    to: Option<String>,
    #[serde(rename = "reply-to", default, skip_serializing_if = "Option::is_none")]
    reply_to: Option<String>,
    after: Vec<String>,
    #[serde(rename = "epoch-auth")]
    epoch_auth: String,
    content: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    leave: bool,
}

/// One session's member, serialised behind a lock (MLS operations on one member never
/// interleave).
struct Session {
    handle: String,
    member: Member,
}

/// Stages a commit in a member's group: (commit, Welcome if it adds someone).
type Stage<'a> = dyn Fn(&Member, &mut openmls::group::MlsGroup) -> Result<(Vec<u8>, Option<Vec<u8>>)> + Sync + 'a;

/// (session handle, group id, log position of the session's join).
type PreJoinKey = (String, String, i64);

/// The runtime's group state: loaded sessions and running invite admissions.
#[derive(Default)]
pub(crate) struct Groups {
    sessions: Mutex<HashMap<String, Arc<Mutex<Session>>>>,
    admissions: Mutex<HashMap<String, tokio::task::JoinHandle<Result<Value>>>>,
    /// Posts that lost the epoch race and were redone on the winner's epoch.
    rebases: std::sync::atomic::AtomicU64,
    /// Per (session, group, log position of its join): ids of the log entries before the join,
    /// fetched once from the relay (see `pre_join_ids`).
    pre_join: Mutex<HashMap<PreJoinKey, Arc<BTreeSet<String>>>>,
    /// Per (session, group): the newest log row whose `after` the gap check has judged. Rows
    /// up to it need no second look (an `after` names earlier log entries, so only a new row
    /// can open a gap); absent, the next check reads the whole log (once per runtime, and after
    /// a check that could not decide).
    gap_marks: std::sync::Mutex<HashMap<(String, String), i64>>,
    /// A session became an active member of a group: the daemon loop follows it at once.
    joined: tokio::sync::Notify,
    /// The invites this runtime opened, by invite id, and what became of them.
    invites: std::sync::Mutex<BTreeMap<String, InviteRecord>>,
    /// Held while the owner's default session is looked up or created (made once).
    owner: Mutex<()>,
    /// Per session: (fingerprint, display name), which never change while it exists; read on
    /// every policy look, so kept once read (dropped when the session is deleted).
    identities: std::sync::Mutex<HashMap<String, (String, String)>>,
    /// The fingerprints of every session of this profile (a group message from one of them is
    /// the profile's own), once read; dropped when a session is created or deleted.
    own_fingerprints: std::sync::Mutex<Option<Arc<BTreeSet<String>>>>,
    /// Per (session, group): the leave requests this runtime stored, counted, and the count at
    /// which all of them were last found settled (see `honour_leaves`).
    leave_requests: std::sync::Mutex<HashMap<(String, String), LeaveRequests>>,
}

/// [`Groups::leave_requests`] of one (session, group).
#[derive(Debug, Default, Clone, Copy)]
struct LeaveRequests {
    /// Leave requests from others stored since this runtime started.
    stored: u64,
    /// `stored` when a check last found every leave request honoured or moot; `None` until the
    /// first check (the log may hold requests read before this runtime started).
    settled: Option<u64>,
}

impl Groups {
    /// A session was created or deleted: the identities kept are read again, and its groups'
    /// leave requests checked again.
    fn sessions_changed(&self, handle: &str) {
        if let Ok(mut m) = self.identities.lock() {
            m.remove(handle);
        }
        if let Ok(mut own) = self.own_fingerprints.lock() {
            *own = None;
        }
        if let Ok(mut l) = self.leave_requests.lock() {
            l.retain(|(h, _), _| h != handle);
        }
    }

    /// A leave request from another member of `gid` was stored for `handle`.
    fn leave_request_stored(&self, handle: &str, gid: &str) {
        if let Ok(mut l) = self.leave_requests.lock() {
            l.entry((handle.to_owned(), gid.to_owned())).or_default().stored += 1;
        }
    }

    /// `Some(stored)` to check `handle`'s leave requests in `gid` (then [`Self::leaves_settled`]
    /// with it), `None` when none arrived since the last check found them all settled.
    fn leaves_to_check(&self, handle: &str, gid: &str) -> Option<u64> {
        let Ok(mut l) = self.leave_requests.lock() else { return Some(0) };
        let r = l.entry((handle.to_owned(), gid.to_owned())).or_default();
        (r.settled != Some(r.stored)).then_some(r.stored)
    }

    /// Every leave request stored up to count `seen` is honoured or moot.
    fn leaves_settled(&self, handle: &str, gid: &str, seen: u64) {
        if let Ok(mut l) = self.leave_requests.lock() {
            l.entry((handle.to_owned(), gid.to_owned())).or_default().settled = Some(seen);
        }
    }

    /// Drops every gap mark (see `gap_marks`): the next checks read whole logs.
    pub(crate) fn forget_gap_marks(&self) {
        if let Ok(mut m) = self.gap_marks.lock() {
            m.clear();
        }
    }
}

/// An invite this runtime opened.
struct InviteRecord {
    group: String,
    link: String,
    expires_at: i64,
    /// `None` while waiting; the joiner's name, or why the admission ended without one.
    outcome: Option<std::result::Result<String, String>>,
}

/// A local group name as the person typed it: trimmed, no control characters, not empty.
fn group_name(name: &str) -> Result<String> {
    let clean: String = name.chars().filter(|c| !c.is_control()).collect();
    let clean = clean.trim();
    if clean.is_empty() {
        return Err(Error::Invalid("a group needs a name".into()));
    }
    if clean.chars().count() > MAX_GROUP_NAME {
        return Err(Error::Invalid(format!("a group name has at most {MAX_GROUP_NAME} characters")));
    }
    Ok(clean.to_owned())
}

fn canonical_fp(text: &str) -> String {
    let hex: String = text.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase();
    hex.as_bytes().chunks(4).filter_map(|c| std::str::from_utf8(c).ok()).collect::<Vec<_>>().join(" ")
}

/// Whether `text` mentions one of `names` as `@name` (case-insensitive), not as the start of a
/// longer word (`@bob` does not mention `bo`).
fn mentions(text: &str, names: &[&str]) -> bool {
    let lower = text.to_lowercase();
    names.iter().filter(|n| !n.trim().is_empty()).any(|name| {
        let needle = format!("@{}", name.to_lowercase());
        lower.match_indices(&needle).any(|(at, m)| {
            lower
                .get(at + m.len()..)
                .and_then(|rest| rest.chars().next())
                .is_none_or(|c| !(c.is_alphanumeric() || c == '-' || c == '_'))
        })
    })
}

/// A row of the local log as clients see it.
fn row_dto(r: &GroupMessage) -> Value {
    let after = r.after_ids();
    let kind = r.kind.as_str();
    // Peers are not operators: their text reaches an agent only fenced and attributed. Membership
    // events are local text but quote display names members claimed, so they are fenced too.
    let peer_text = kind == "message" || kind == "leave" || kind == "event";
    let fenced = (r.outgoing == 0 && peer_text).then(|| {
        let (gid, id, fp, name, reply) = (&r.group_id, &r.id, &r.sender_fp, &r.sender_name, &r.reply_to);
        let label = Label {
            protocol: "letmeknow",
            // MLS: every application message is signed by the sender's leaf credential.
            auth: super::delivery::SenderAuth::SignedEndToEnd,
            contact: gid,
            from_agent: (!name.is_empty()).then_some(name.as_str()),
            fingerprint: if fp.is_empty() { "(none: a local event)" } else { fp },
            verified: false,
            kind,
            id,
            reply_to: (!reply.is_empty()).then_some(reply.as_str()),
        };
        fence(&label, &r.content)
    });
    json!({
        "fenced": fenced,
        "group": r.group_id,
        "id": r.id,
        "seq": r.seq,
        "epoch": r.epoch,
        "kind": r.kind,
        "outgoing": r.outgoing != 0,
        "from": {"name": r.sender_name, "fingerprint": r.sender_fp},
        "to": r.to_fp,
        "reply_to": r.reply_to,
        "after": after,
        "content": r.content,
        "at": r.created_at,
    })
}

/// An `alert` row: something the session must know about the group's integrity.
async fn alert(conn: &mut sqlx::SqliteConnection, handle: &str, gid: &str, key: &str, text: String) -> Result<()> {
    let row = NewGroupRow { id: format!("alert:{key}"), kind: "alert", content: text, ..Default::default() };
    Ok(db::insert_group_row(conn, handle, gid, row, now_ms()).await?)
}

/// Writes the OpenMLS rows `member` changed since its last save into `conn`'s transaction and
/// returns them: the caller marks them [`Member::saved`] once that transaction committed. Until
/// then they stay dirty, so a transaction that rolls back has them written again by the next save.
async fn save_state(
    conn: &mut sqlx::SqliteConnection,
    handle: &str,
    member: &Member,
) -> Result<Vec<mls::storage::Change>> {
    let (changes, stmts) = state_stmts(handle, member);
    for stmt in stmts {
        stmt.execute(conn).await?;
    }
    Ok(changes)
}

/// [`save_state`] on a [`BatchTx`]: the changed rows are queued with its other writes.
fn queue_state(tx: &mut BatchTx, handle: &str, member: &Member) -> Result<Vec<mls::storage::Change>> {
    let (changes, stmts) = state_stmts(handle, member);
    for stmt in stmts {
        tx.queue(stmt);
    }
    Ok(changes)
}

/// The OpenMLS rows `member` changed since its last save, and the statements that write them.
fn state_stmts(handle: &str, member: &Member) -> (Vec<mls::storage::Change>, Vec<Stmt>) {
    let changes = member.changes();
    let rows: Vec<(&[u8], Option<&[u8]>)> = changes.iter().map(|c| (c.key.as_slice(), c.value.as_deref())).collect();
    let stmts = db::group_state_stmts(handle, &rows);
    (changes, stmts)
}

async fn record_epoch(
    conn: &mut sqlx::SqliteConnection,
    handle: &str,
    gid: &str,
    group: &openmls::group::MlsGroup,
) -> Result<()> {
    let epoch = i64::try_from(group.epoch().as_u64()).unwrap_or(i64::MAX);
    Ok(db::record_epoch_auth(conn, handle, gid, epoch, mls::epoch_authenticator(group)).await?)
}

async fn note_member(
    conn: &mut sqlx::SqliteConnection,
    handle: &str,
    gid: &str,
    who: &mls::MemberInfo,
    invited_by: &str,
) -> Result<()> {
    Ok(db::note_group_member(conn, handle, gid, &who.fingerprint, &who.name, invited_by).await?)
}

fn who(m: &mls::MemberInfo) -> String {
    format!("{} ({})", m.name, m.fingerprint)
}

/// A merged commit as the local log records it.
struct CommitEvent<'a> {
    id: &'a str,
    seq: i64,
    epoch: i64,
    committer: &'a mls::MemberInfo,
    added: &'a [mls::MemberInfo],
    removed: &'a [mls::MemberInfo],
    /// Ours: already in the agent's context.
    mine: bool,
}

/// The event row of a merged commit, and notes on who added whom.
async fn commit_rows(conn: &mut sqlx::SqliteConnection, handle: &str, gid: &str, ev: CommitEvent<'_>) -> Result<()> {
    let CommitEvent { id, seq, epoch, committer, added, removed, mine } = ev;
    let mut lines = Vec::new();
    // A member in both lists was re-invited: its stale leaf replaced by a new one (same key).
    let readded = |fp: &str| added.iter().any(|a| a.fingerprint == fp) && removed.iter().any(|r| r.fingerprint == fp);
    for a in added {
        note_member(conn, handle, gid, a, &who(committer)).await?;
        let verb = if readded(&a.fingerprint) { "re-added" } else { "added" };
        lines.push(format!("{} {verb} {}", committer.name, who(a)));
    }
    for r in removed.iter().filter(|r| !readded(&r.fingerprint)) {
        lines.push(format!("{} removed {}", committer.name, who(r)));
    }
    if lines.is_empty() {
        lines.push(format!("{} updated the group", committer.name));
    }
    let row = NewGroupRow {
        id: id.to_owned(),
        seq,
        epoch,
        kind: "event",
        outgoing: mine,
        sender_fp: committer.fingerprint.clone(),
        sender_name: committer.name.clone(),
        content: lines.join("; "),
        read: mine,
        ..Default::default()
    };
    Ok(db::insert_group_row(conn, handle, gid, row, now_ms()).await?)
}

impl Runtime {
    /// The session an invite comes from: the one named, else the one in `group`, else the
    /// owner's default session.
    pub(in crate::engine) async fn invite_handle(&self, handle: Option<String>, group: Option<&str>) -> Result<String> {
        match (handle, group) {
            (Some(h), _) => Ok(h),
            (None, Some(g)) => self.lmk_handle_in(g).await,
            (None, None) => self.lmk_owner_handle().await,
        }
    }

    /// The groups of session `handle`; for the owner without a handle, every session's groups
    /// (each entry names its handle), none yet being an empty list (the first group makes the
    /// default session).
    pub(in crate::engine) async fn group_list(&self, handle: Option<String>) -> Result<Value> {
        if let Some(h) = handle {
            return self.lmk_groups(&h).await;
        }
        let mut all = Vec::new();
        for h in self.store().group_session_handles().await? {
            if let Value::Array(groups) = self.lmk_groups(&h).await? {
                all.extend(groups);
            }
        }
        Ok(Value::Array(all))
    }

    /// The owner resumes a group the loop guard paused (operator input).
    pub(in crate::engine) async fn group_resume(&self, handle: Option<String>, group: &str) -> Result<Value> {
        let h = self.group_handle(handle, group).await?;
        let released = self.lmk_operator_input(&h, group).await?;
        Ok(json!({"group": group, "handle": h, "resumed": true, "released": released}))
    }

    /// The owner's local name for a group.
    pub(in crate::engine) async fn lmk_rename(&self, group: &str, name: &str) -> Result<Value> {
        let name = group_name(name)?;
        self.lmk_handle_in(group).await?;
        self.store().set_group_name(group, &name, now_ms()).await?;
        self.emit(Event::GroupChanged { group: group.to_owned() });
        Ok(json!({"group": group, "name": name}))
    }

    /// How many posts of this runtime lost the epoch race and were redone on the winner's epoch.
    pub fn lmk_rebases(&self) -> u64 {
        self.inner.groups.rebases.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The handle named, else the profile's only session.
    pub(in crate::engine) async fn resolve_handle(&self, handle: Option<String>) -> Result<String> {
        if let Some(h) = handle {
            return Ok(h);
        }
        let all = self.store().group_session_handles().await?;
        match all.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(Error::Invalid("no group session yet: start one with `switchboard listen --handle NAME`".into())),
            many => {
                Err(Error::Invalid(format!("several group sessions ({}): name one with --handle", many.join(", "))))
            }
        }
    }

    /// `given`, else the session in `gid` (see [`Self::lmk_handle_in`]).
    pub(in crate::engine) async fn group_handle(&self, given: Option<String>, gid: &str) -> Result<String> {
        match given {
            Some(h) => Ok(h),
            None => self.lmk_handle_in(gid).await,
        }
    }

    /// The session that acts in `gid` for the owner: the default session if it is (or was) in
    /// it, else the first active one, else the first that ever was.
    pub(in crate::engine) async fn lmk_handle_in(&self, gid: &str) -> Result<String> {
        let sessions = self.store().group_sessions(gid).await?;
        let owner = self.store().meta(OWNER_HANDLE).await?;
        if let Some(o) = owner.filter(|o| sessions.iter().any(|(h, _)| h == o)) {
            return Ok(o);
        }
        let active = sessions.iter().find(|(_, state)| state == "active");
        active.or(sessions.first()).map(|(h, _)| h.clone()).ok_or_else(|| Error::UnknownGroup(gid.to_owned()))
    }

    /// The owner's default group session, created (with the profile's name) on first use. A
    /// profile with exactly one session already (started by `listen --handle`, or in the window
    /// before the default session existed) keeps that one, as requests without a handle always
    /// did.
    pub async fn lmk_owner_handle(&self) -> Result<String> {
        let _once = self.inner.groups.owner.lock().await;
        if let Some(h) = self.store().meta(OWNER_HANDLE).await?
            && self.store().group_session_exists(&h).await?
        {
            return Ok(h);
        }
        let sessions = self.store().group_session_handles().await?;
        let handle = match sessions.as_slice() {
            [h] => h.clone(),
            _ => {
                let made = self.lmk_session(None, Some(&self.inner.name)).await?;
                made.get("handle")
                    .and_then(Value::as_str)
                    .ok_or_else(|| Error::Bug("a session without a handle".into()))?
                    .to_owned()
            }
        };
        self.store().set_meta(OWNER_HANDLE, &handle).await?;
        Ok(handle)
    }

    /// The letmeknow client for a group's relay: the profile's own client (its pin) for its own
    /// relay, else one that pins what a contact's LAN announcement or the owner vouched for.
    async fn lmk_client(&self, relay: &str) -> Result<LetmeknowClient> {
        Ok(self.lmk_foreign(relay).await?.map_or_else(|| LetmeknowClient::new(&self.relay()), |f| f.0))
    }

    /// For a relay other than the profile's own: its letmeknow client and the handle that turns
    /// a certificate refusal into [`Error::UntrustedRelay`]; `None` for the profile's own.
    async fn lmk_foreign(&self, relay: &str) -> Result<Option<(LetmeknowClient, ForeignRelay)>> {
        if relay.trim_end_matches('/') == self.relay_url().trim_end_matches('/') {
            return Ok(None);
        }
        let foreign = self.foreign_relay(relay).await?;
        Ok(Some((LetmeknowClient::new(&foreign.client), foreign)))
    }

    /// Opens (creating when `handle` is `None` or unknown) an agent session's membership
    /// identity; restarting with the same handle resumes its groups.
    pub async fn lmk_session(&self, handle: Option<&str>, name: Option<&str>) -> Result<Value> {
        let handle = match handle {
            Some(h) if !h.trim().is_empty() => h.trim().to_owned(),
            _ => random_handle(),
        };
        if handle.len() > 64 || !handle.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(Error::Invalid("a handle is letters, digits, '-' and '_' (at most 64)".into()));
        }
        if !self.store().group_session_exists(&handle).await? {
            let name = name
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map_or_else(|| format!("{}'s agent {handle}", self.inner.name), str::to_owned);
            if name.len() > 200 {
                return Err(Error::Invalid("a display name has at most 200 bytes".into()));
            }
            let member = Member::generate(&name)?;
            self.store().insert_group_session(&handle, &name, member.signature_key(), &member.rows(), now_ms()).await?;
            self.inner.groups.sessions_changed(&handle);
        }
        let session = self.lmk_load(&handle).await?;
        let s = session.lock().await;
        Ok(json!({"handle": handle, "name": s.member.name(), "fingerprint": s.member.fingerprint()}))
    }

    async fn lmk_load(&self, handle: &str) -> Result<Arc<Mutex<Session>>> {
        let mut sessions = self.inner.groups.sessions.lock().await;
        if let Some(s) = sessions.get(handle) {
            return Ok(s.clone());
        }
        let row =
            self.store().group_session(handle).await?.ok_or_else(|| {
                Error::Invalid(format!("no group session `{handle}`: start one with `listen --handle`"))
            })?;
        let member = if row.mls_state.is_empty() {
            Member::from_rows(self.store().group_mls_rows(handle).await?, &row.signature_key, &row.name)?
        } else {
            // A profile made before migration 0018: its snapshot becomes rows, once.
            let member = Member::restore(&row.mls_state, &row.signature_key, &row.name)?;
            self.store().move_group_state_to_rows(handle, &member.rows()).await?;
            member.saved(&member.changes());
            member
        };
        let s = Arc::new(Mutex::new(Session { handle: handle.to_owned(), member }));
        sessions.insert(handle.to_owned(), s.clone());
        Ok(s)
    }

    /// The session's (fingerprint, display name); empty for an unknown session.
    async fn lmk_identity(&self, handle: &str) -> Result<(String, String)> {
        if let Some(known) = self.inner.groups.identities.lock().ok().and_then(|m| m.get(handle).cloned()) {
            return Ok(known);
        }
        let Some((key, name)) = self.store().group_session_identity(handle).await? else {
            return Ok(Default::default());
        };
        let identity = (fingerprint(&key), name);
        if let Ok(mut m) = self.inner.groups.identities.lock() {
            m.insert(handle.to_owned(), identity.clone());
        }
        Ok(identity)
    }

    /// The fingerprints of every session of this profile.
    async fn lmk_own_fingerprints(&self) -> Result<Arc<BTreeSet<String>>> {
        if let Some(known) = self.inner.groups.own_fingerprints.lock().ok().and_then(|o| o.clone()) {
            return Ok(known);
        }
        let keys = self.store().group_session_keys().await?;
        let own: Arc<BTreeSet<String>> = Arc::new(keys.iter().map(|k| fingerprint(k)).collect());
        if let Ok(mut o) = self.inner.groups.own_fingerprints.lock() {
            *o = Some(own.clone());
        }
        Ok(own)
    }

    fn lmk_group_row(&self, handle: &str, gid: &str) -> Result<(String, i64, String)> {
        let row = self
            .store()
            .group_membership(handle, gid)?
            .ok_or_else(|| Error::Invalid(format!("`{handle}` is not in group {gid}")))?;
        Ok((row.relay, row.cursor, row.state))
    }

    fn require_active(state: &str, gid: &str) -> Result<()> {
        match state {
            "active" => Ok(()),
            "removed" => Err(Error::Forbidden(format!("you were removed from group {gid}"))),
            "left" => Err(Error::Forbidden(format!("you left group {gid}"))),
            _ => Err(Error::Forbidden(format!(
                "group {gid}: this session was offline longer than the relay keeps messages; ask a member to \
                 re-invite it"
            ))),
        }
    }
}

#[cfg(test)]
mod mention_tests {
    use super::mentions;

    #[test]
    fn mentions_need_the_at_sign_and_a_word_end() {
        assert!(mentions("@quiet-otter can you look?", &["quiet-otter", "alice's agent"]));
        assert!(mentions("thanks @Alice's Agent.", &["quiet-otter", "alice's agent"]));
        assert!(!mentions("quiet-otter can you look?", &["quiet-otter"]));
        assert!(!mentions("@quiet-otters", &["quiet-otter"]));
        assert!(!mentions("@quiet-otter-2", &["quiet-otter"]));
        assert!(!mentions("@ anyone", &["", " "]));
    }
}

#[cfg(test)]
mod leave_request_tests {
    use super::Groups;

    #[test]
    fn leave_requests_are_checked_at_start_then_only_after_a_new_one() {
        let g = Groups::default();
        // Never checked by this runtime: the log may hold requests read before it started.
        let seen = g.leaves_to_check("h", "g").expect("checked at start");
        g.leaves_settled("h", "g", seen);
        assert_eq!(g.leaves_to_check("h", "g"), None, "settled, nothing new");
        assert!(g.leaves_to_check("h", "other").is_some(), "per group");
        g.leave_request_stored("h", "g");
        let seen = g.leaves_to_check("h", "g").expect("a new request is checked");
        g.leaves_settled("h", "g", seen);
        assert_eq!(g.leaves_to_check("h", "g"), None);
    }

    #[test]
    fn a_request_stored_during_a_check_is_checked_again() {
        let g = Groups::default();
        let seen = g.leaves_to_check("h", "g").unwrap();
        // Stored after the check read the requests, before it finished.
        g.leave_request_stored("h", "g");
        g.leaves_settled("h", "g", seen);
        assert!(g.leaves_to_check("h", "g").is_some(), "the late request is not taken as settled");
    }

    #[test]
    fn a_deleted_session_is_checked_again() {
        let g = Groups::default();
        let seen = g.leaves_to_check("h", "g").unwrap();
        g.leaves_settled("h", "g", seen);
        g.sessions_changed("h");
        assert!(g.leaves_to_check("h", "g").is_some());
    }
}
