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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::Row as _;
use tokio::sync::Mutex;

use super::delivery::{LEASE_MS, Label, digest_due, fence};
use super::{Error, Event, Result, Runtime};
use crate::bridge::api::Request;
use crate::mls::{self, Member, Processed};
use crate::protocol::letmeknow::invite::{InviteLink, Role, new_owner_token};
use crate::protocol::letmeknow::wire::{JoinBlob, WelcomeBlob};
use crate::protocol::letmeknow::{INVITE_TTL, MAX_WAIT_SECS, PAGE, fingerprint, is_id, message_id, new_id};
use crate::store::name_group_if_unnamed;
use crate::transport::TransportError;
use crate::transport::letagents::RelayClient;
use crate::transport::letmeknow::{LetmeknowClient, LogEntry, Posted};
use crate::util::{OsRng, b64u, b64u_decode, now_ms};

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
    /// A session became an active member of a group: the daemon loop follows it at once.
    joined: tokio::sync::Notify,
    /// The invites this runtime opened, by invite id, and what became of them.
    invites: std::sync::Mutex<BTreeMap<String, InviteRecord>>,
    /// Held while the owner's default session is looked up or created (made once).
    owner: Mutex<()>,
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
fn row_dto(r: &sqlx::sqlite::SqliteRow) -> Value {
    let after: Vec<String> = serde_json::from_str(r.get::<String, _>("after").as_str()).unwrap_or_default();
    let kind: String = r.get("kind");
    // Peers are not operators: their text reaches an agent only fenced and attributed. Membership
    // events are local text but quote display names members claimed, so they are fenced too.
    let peer_text = kind == "message" || kind == "leave" || kind == "event";
    let fenced = (r.get::<i64, _>("outgoing") == 0 && peer_text).then(|| {
        let (gid, id, fp, name, reply): (String, String, String, String, String) =
            (r.get("group_id"), r.get("id"), r.get("sender_fp"), r.get("sender_name"), r.get("reply_to"));
        let label = Label {
            protocol: "letmeknow",
            // MLS: every application message is signed by the sender's leaf credential.
            auth: super::delivery::SenderAuth::SignedEndToEnd,
            contact: &gid,
            from_agent: (!name.is_empty()).then_some(name.as_str()),
            fingerprint: if fp.is_empty() { "(none: a local event)" } else { &fp },
            verified: false,
            kind: &kind,
            id: &id,
            reply_to: (!reply.is_empty()).then_some(reply.as_str()),
        };
        fence(&label, r.get::<String, _>("content").as_str())
    });
    json!({
        "fenced": fenced,
        "group": r.get::<String, _>("group_id"),
        "id": r.get::<String, _>("id"),
        "seq": r.get::<i64, _>("seq"),
        "epoch": r.get::<i64, _>("epoch"),
        "kind": r.get::<String, _>("kind"),
        "outgoing": r.get::<i64, _>("outgoing") != 0,
        "from": {"name": r.get::<String, _>("sender_name"), "fingerprint": r.get::<String, _>("sender_fp")},
        "to": r.get::<String, _>("to_fp"),
        "reply_to": r.get::<String, _>("reply_to"),
        "after": after,
        "content": r.get::<String, _>("content"),
        "at": r.get::<i64, _>("created_at"),
    })
}

/// A new local-log row.
#[derive(Default)]
struct NewRow<'a> {
    id: String,
    seq: i64,
    epoch: i64,
    kind: &'a str,
    state: &'a str,
    outgoing: bool,
    sender_fp: String,
    sender_name: String,
    to_fp: String,
    reply_to: String,
    after: Vec<String>,
    content: String,
    read: bool,
}

async fn insert_row(
    conn: &mut sqlx::SqliteConnection,
    handle: &str,
    gid: &str,
    row: NewRow<'_>,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO lmk_messages (handle, group_id, id, seq, epoch, kind, state, outgoing, sender_fp, sender_name, \
         to_fp, reply_to, after, content, read, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (handle, group_id, id) DO NOTHING",
    )
    .bind(handle)
    .bind(gid)
    .bind(&row.id)
    .bind(row.seq)
    .bind(row.epoch)
    .bind(row.kind)
    .bind(if row.state.is_empty() { "done" } else { row.state })
    .bind(i64::from(row.outgoing))
    .bind(&row.sender_fp)
    .bind(&row.sender_name)
    .bind(&row.to_fp)
    .bind(&row.reply_to)
    .bind(serde_json::to_string(&row.after).unwrap_or_else(|_| "[]".into()))
    .bind(&row.content)
    .bind(i64::from(row.read))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// An `alert` row: something the session must know about the group's integrity.
async fn alert(conn: &mut sqlx::SqliteConnection, handle: &str, gid: &str, key: &str, text: String) -> Result<()> {
    let row = NewRow { id: format!("alert:{key}"), kind: "alert", content: text, ..Default::default() };
    insert_row(conn, handle, gid, row, now_ms()).await
}

async fn save_state(conn: &mut sqlx::SqliteConnection, handle: &str, member: &Member) -> Result<()> {
    sqlx::query("UPDATE lmk_sessions SET mls_state = ? WHERE handle = ?")
        .bind(member.snapshot())
        .bind(handle)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn record_epoch(
    conn: &mut sqlx::SqliteConnection,
    handle: &str,
    gid: &str,
    group: &openmls::group::MlsGroup,
) -> Result<()> {
    sqlx::query("INSERT OR IGNORE INTO lmk_epoch_auth (handle, group_id, epoch, auth) VALUES (?, ?, ?, ?)")
        .bind(handle)
        .bind(gid)
        .bind(i64::try_from(group.epoch().as_u64()).unwrap_or(i64::MAX))
        .bind(mls::epoch_authenticator(group))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn note_member(
    conn: &mut sqlx::SqliteConnection,
    handle: &str,
    gid: &str,
    who: &mls::MemberInfo,
    invited_by: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO lmk_member_notes (handle, group_id, fingerprint, name, invited_by) VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT (handle, group_id, fingerprint) DO UPDATE SET name = excluded.name, \
         invited_by = CASE WHEN excluded.invited_by = '' THEN invited_by ELSE excluded.invited_by END",
    )
    .bind(handle)
    .bind(gid)
    .bind(&who.fingerprint)
    .bind(&who.name)
    .bind(invited_by)
    .execute(&mut *conn)
    .await?;
    Ok(())
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
    let row = NewRow {
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
    insert_row(conn, handle, gid, row, now_ms()).await
}

impl Runtime {
    /// The letmeknow requests. `agent` is the calling agent session's name, which is its handle
    /// (an owner caller names the handle, or uses the profile's only session).
    pub(crate) async fn handle_group(&self, agent: Option<&str>, req: Request) -> Result<Value> {
        let pick = |given: Option<String>| -> Option<String> {
            match agent {
                Some(me) => Some(me.to_owned()),
                None => given,
            }
        };
        match req {
            Request::GroupSession { handle, name } => {
                let handle = pick(handle);
                self.lmk_session(handle.as_deref(), name.as_deref()).await
            }
            Request::GroupInvite { handle, group, ttl_secs } => {
                let h = match (pick(handle), group.as_deref()) {
                    (Some(h), _) => h,
                    (None, Some(g)) => self.lmk_handle_in(g).await?,
                    (None, None) => self.lmk_owner_handle().await?,
                };
                self.lmk_invite(&h, group.as_deref(), ttl_secs).await
            }
            Request::GroupInviteWait { invite } => self.lmk_invite_wait(&invite).await,
            Request::GroupJoin { handle, link, timeout_secs } => {
                let h = match pick(handle) {
                    Some(h) => h,
                    None => self.lmk_owner_handle().await?,
                };
                self.lmk_join(&h, &link, timeout_secs).await
            }
            Request::GroupList { handle } => match pick(handle) {
                Some(h) => self.lmk_groups(&h).await,
                // The owner without a handle: every session's groups (each entry names its handle);
                // none yet is an empty list (the first group makes the default session).
                None => {
                    let handles: Vec<String> =
                        sqlx::query_scalar("SELECT handle FROM lmk_sessions ORDER BY created_at")
                            .fetch_all(&self.store().pool)
                            .await?;
                    let mut all = Vec::new();
                    for h in handles {
                        if let Value::Array(groups) = self.lmk_groups(&h).await? {
                            all.extend(groups);
                        }
                    }
                    Ok(Value::Array(all))
                }
            },
            Request::GroupSend { handle, group, text, to, reply_to } => {
                let h = self.group_handle(pick(handle), &group).await?;
                if agent.is_some() {
                    // An agent session: under the loop guard and the group's outbound mode.
                    return self.lmk_agent_send(&h, &group, &text, to.as_deref(), reply_to.as_deref()).await;
                }
                // The owner: operator input, which resets the group's loop guard.
                let v = self.lmk_send(&h, &group, &text, to.as_deref(), reply_to.as_deref()).await?;
                self.lmk_operator_input(&h, &group).await?;
                Ok(v)
            }
            Request::GroupRead { handle, id, ancestors } => {
                let h = self.resolve_handle(pick(handle)).await?;
                self.lmk_read(&h, &id, usize::try_from(ancestors.unwrap_or(0)).unwrap_or(usize::MAX)).await
            }
            Request::GroupMembers { handle, group } => {
                let h = self.group_handle(pick(handle), &group).await?;
                self.lmk_sync_best_effort(&h, &group).await;
                self.lmk_members(&h, &group).await
            }
            Request::GroupRemove { handle, group, fingerprint } => {
                let h = self.group_handle(pick(handle), &group).await?;
                self.lmk_remove(&h, &group, &fingerprint).await
            }
            Request::GroupSessionDelete { handle } if agent.is_none() => self.lmk_session_delete(&handle).await,
            Request::GroupLeave { handle, group } => {
                let h = self.group_handle(pick(handle), &group).await?;
                self.lmk_leave(&h, &group).await
            }
            Request::GroupDeliveries { handle, wait_secs } => {
                let h = self.resolve_handle(pick(handle)).await?;
                self.lmk_wait(&h, wait_secs).await
            }
            Request::GroupMode { handle, group, mode } if agent.is_none() => {
                let h = self.group_handle(handle, &group).await?;
                self.lmk_set_mode(&h, &group, &mode).await
            }
            Request::GroupResume { handle, group } if agent.is_none() => {
                let h = self.group_handle(handle, &group).await?;
                let released = self.lmk_operator_input(&h, &group).await?;
                Ok(json!({"group": group, "handle": h, "resumed": true, "released": released}))
            }
            Request::GroupCreate { name } if agent.is_none() => self.lmk_create(&name).await,
            Request::GroupRename { group, name } if agent.is_none() => {
                let name = group_name(&name)?;
                self.lmk_handle_in(&group).await?;
                self.store().set_group_name(&group, &name, now_ms()).await?;
                self.emit(Event::GroupChanged { group: group.clone() });
                Ok(json!({"group": group, "name": name}))
            }
            Request::GroupHistory { handle, group, before, limit, mark_read } => {
                let h = self.group_handle(pick(handle), &group).await?;
                let limit = limit.unwrap_or(HISTORY_PAGE).clamp(1, MAX_HISTORY_PAGE);
                self.lmk_history(&h, &group, before, limit, mark_read && agent.is_none()).await
            }
            Request::GroupInvites if agent.is_none() => Ok(self.lmk_invites()),
            Request::GroupMode { .. } | Request::GroupResume { .. } => Err(Error::Forbidden(
                "agent sessions may not change a group's policy: that is your operator's decision".into(),
            )),
            Request::GroupCreate { .. } | Request::GroupRename { .. } | Request::GroupInvites => Err(Error::Forbidden(
                "agent sessions may not create, rename or list the operator's groups and invites".into(),
            )),
            other => Err(Error::Bug(format!("not a group request: {other:?}"))),
        }
    }

    /// How many posts of this runtime lost the epoch race and were redone on the winner's epoch.
    pub fn lmk_rebases(&self) -> u64 {
        self.inner.groups.rebases.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The handle named, else the profile's only session.
    async fn resolve_handle(&self, handle: Option<String>) -> Result<String> {
        if let Some(h) = handle {
            return Ok(h);
        }
        let all: Vec<String> = sqlx::query_scalar("SELECT handle FROM lmk_sessions ORDER BY created_at")
            .fetch_all(&self.store().pool)
            .await?;
        match all.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(Error::Invalid("no group session yet: start one with `switchboard listen --handle NAME`".into())),
            many => {
                Err(Error::Invalid(format!("several group sessions ({}): name one with --handle", many.join(", "))))
            }
        }
    }

    /// `given`, else the session in `gid` (see [`Self::lmk_handle_in`]).
    async fn group_handle(&self, given: Option<String>, gid: &str) -> Result<String> {
        match given {
            Some(h) => Ok(h),
            None => self.lmk_handle_in(gid).await,
        }
    }

    /// The session that acts in `gid` for the owner: the default session if it is (or was) in
    /// it, else the first active one, else the first that ever was.
    async fn lmk_handle_in(&self, gid: &str) -> Result<String> {
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
        if let Some(h) = self.store().meta(OWNER_HANDLE).await? {
            let exists: Option<String> = sqlx::query_scalar("SELECT handle FROM lmk_sessions WHERE handle = ?")
                .bind(&h)
                .fetch_optional(&self.store().pool)
                .await?;
            if exists.is_some() {
                return Ok(h);
            }
        }
        let sessions: Vec<(String, String)> =
            sqlx::query_as("SELECT handle, name FROM lmk_sessions ORDER BY created_at")
                .fetch_all(&self.store().pool)
                .await?;
        let handle = match sessions.as_slice() {
            [(h, _)] => h.clone(),
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

    /// A new group named `name`, made by the owner's default session.
    async fn lmk_create(&self, name: &str) -> Result<Value> {
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

    /// A page of `gid`'s log in `handle`'s view, oldest first; `mark_read` (the owner looking)
    /// marks the rows shown read when `handle` is the owner's default session.
    async fn lmk_history(
        &self,
        handle: &str,
        gid: &str,
        before: Option<i64>,
        limit: u32,
        mark_read: bool,
    ) -> Result<Value> {
        self.lmk_group_row(handle, gid).await?;
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

    /// The invites this runtime opened since it started, newest first.
    fn lmk_invites(&self) -> Value {
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

    async fn lmk_sync_best_effort(&self, handle: &str, gid: &str) {
        if let Err(e) = self.lmk_sync(handle, gid, 0).await {
            tracing::debug!(error = %e, group = gid, "group sync");
        }
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
            let groups: Vec<(String, String)> =
                sqlx::query("SELECT group_id, relay FROM lmk_groups WHERE handle = ? AND state = 'active'")
                    .bind(handle)
                    .fetch_all(&self.store().pool)
                    .await?
                    .iter()
                    .map(|r| (r.get("group_id"), r.get("relay")))
                    .collect();
            // A group whose sync fails is not long-polled this round (its log would answer at
            // once, every time): it is retried on the next wake.
            let mut healthy = Vec::new();
            for (gid, relay) in groups {
                let prefetched = news.take_if(|(g, _, _)| *g == gid).map(|(_, after, entries)| (after, entries));
                match self.lmk_sync_from(handle, &gid, 0, prefetched).await {
                    Ok(_) => healthy.push((gid, relay)),
                    Err(e) => tracing::debug!(error = %e, group = gid, "group sync"),
                }
            }
            // Cursors before the policy look: whatever a follower adds after it wakes the poll.
            let mut cursors = Vec::new();
            for (gid, relay) in &healthy {
                let (_, cursor, _) = self.lmk_group_row(handle, gid).await?;
                cursors.push((gid.clone(), relay.clone(), cursor));
            }
            let pending = self.lmk_pending(handle).await?;
            let now_i = tokio::time::Instant::now();
            if !pending.due.is_empty() || now_i >= deadline {
                return self.lmk_deliveries(handle).await;
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
                let client = self.lmk_client(&relay)?;
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

    fn lmk_client(&self, relay: &str) -> Result<LetmeknowClient> {
        if relay.trim_end_matches('/') == self.inner.relay_url.trim_end_matches('/') {
            return Ok(LetmeknowClient::new(&self.inner.relay));
        }
        Ok(LetmeknowClient::new(&RelayClient::new(relay, None)?))
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
        let existing = sqlx::query("SELECT name FROM lmk_sessions WHERE handle = ?")
            .bind(&handle)
            .fetch_optional(&self.store().pool)
            .await?;
        if existing.is_none() {
            let name = name
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map_or_else(|| format!("{}'s agent {handle}", self.inner.name), str::to_owned);
            if name.len() > 200 {
                return Err(Error::Invalid("a display name has at most 200 bytes".into()));
            }
            let member = Member::generate(&name)?;
            sqlx::query(
                "INSERT INTO lmk_sessions (handle, name, signature_key, mls_state, created_at) VALUES (?, ?, ?, ?, ?)",
            )
            .bind(&handle)
            .bind(&name)
            .bind(member.signature_key())
            .bind(member.snapshot())
            .bind(now_ms())
            .execute(&self.store().pool)
            .await?;
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
        let row = sqlx::query("SELECT name, signature_key, mls_state FROM lmk_sessions WHERE handle = ?")
            .bind(handle)
            .fetch_optional(&self.store().pool)
            .await?
            .ok_or_else(|| Error::Invalid(format!("no group session `{handle}`: start one with `listen --handle`")))?;
        let member = Member::restore(
            row.get::<Vec<u8>, _>("mls_state").as_slice(),
            row.get::<Vec<u8>, _>("signature_key").as_slice(),
            row.get::<String, _>("name").as_str(),
        )?;
        let s = Arc::new(Mutex::new(Session { handle: handle.to_owned(), member }));
        sessions.insert(handle.to_owned(), s.clone());
        Ok(s)
    }

    async fn lmk_group_row(&self, handle: &str, gid: &str) -> Result<(String, i64, String)> {
        let row = sqlx::query("SELECT relay, cursor, state FROM lmk_groups WHERE handle = ? AND group_id = ?")
            .bind(handle)
            .bind(gid)
            .fetch_optional(&self.store().pool)
            .await?
            .ok_or_else(|| Error::Invalid(format!("`{handle}` is not in group {gid}")))?;
        Ok((row.get("relay"), row.get("cursor"), row.get("state")))
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

    /// Daemon loop: follows every active (session, group) pair, starting a follower for groups
    /// joined since the last scan, so commits are processed, deliveries queued and leave
    /// requests honoured with no command run.
    pub(super) async fn lmk_background_loop(self) {
        let mut stop = self.inner.shutdown.subscribe();
        let mut followers: HashMap<(String, String), tokio::task::JoinHandle<()>> = HashMap::new();
        loop {
            if *stop.borrow() {
                break;
            }
            followers.retain(|_, t| !t.is_finished());
            let active =
                sqlx::query_as::<_, (String, String)>("SELECT handle, group_id FROM lmk_groups WHERE state = 'active'")
                    .fetch_all(&self.store().pool)
                    .await;
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
    async fn lmk_follow(&self, handle: &str, gid: &str) {
        let mut stop = self.inner.shutdown.subscribe();
        let mut failures = 0u32;
        let mut first = true;
        loop {
            if *stop.borrow() {
                return;
            }
            let round = async {
                // A deleted session's groups are gone: nothing left to follow.
                let Ok((relay, cursor, state)) = self.lmk_group_row(handle, gid).await else {
                    return Ok(false);
                };
                if state != "active" {
                    return Ok(false);
                }
                if !first {
                    let client = self.lmk_client(&relay)?;
                    if client.read(gid, u64::try_from(cursor).unwrap_or(0), MAX_WAIT_SECS).await?.is_empty() {
                        return Ok(true);
                    }
                }
                self.lmk_sync(handle, gid, 0).await?;
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
                    let pause = Duration::from_millis(u64::try_from(super::backoff_ms(failures)).unwrap_or(1000));
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
        self.lmk_sync_from(handle, gid, wait_secs, None).await
    }

    /// [`Self::lmk_sync`], starting with `prefetched`: entries read (without the session's lock,
    /// by a long-poll) after cursor `.0`; used only if the cursor has not moved since.
    async fn lmk_sync_from(
        &self,
        handle: &str,
        gid: &str,
        wait_secs: u64,
        prefetched: Option<(i64, Vec<LogEntry>)>,
    ) -> Result<usize> {
        let session = self.lmk_load(handle).await?;
        let n = {
            let mut s = session.lock().await;
            self.sync_locked_from(&mut s, gid, wait_secs, prefetched).await?
        };
        self.honour_leaves(handle, gid).await?;
        Ok(n)
    }

    async fn sync_locked(&self, s: &mut Session, gid: &str, wait_secs: u64) -> Result<usize> {
        self.sync_locked_from(s, gid, wait_secs, None).await
    }

    /// [`Self::sync_locked_from_inner`], then an [`Event::GroupMessage`] for each message or alert
    /// from someone else it stored (also when it failed part-way: what it committed is stored).
    async fn sync_locked_from(
        &self,
        s: &mut Session,
        gid: &str,
        wait_secs: u64,
        prefetched: Option<(i64, Vec<LogEntry>)>,
    ) -> Result<usize> {
        let mark: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(rowid_), 0) FROM lmk_messages")
            .fetch_one(&self.store().pool)
            .await?;
        let result = self.sync_locked_from_inner(s, gid, wait_secs, prefetched).await;
        // `+handle`/`+group_id`: the rowid range above the mark, not the group's whole history
        // through the (handle, group_id, id) index.
        let new: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT id, sender_name, sender_fp FROM lmk_messages WHERE +handle = ? AND +group_id = ? AND rowid_ > ? \
             AND outgoing = 0 AND kind IN ('message', 'alert') ORDER BY rowid_",
        )
        .bind(&s.handle)
        .bind(gid)
        .bind(mark)
        .fetch_all(&self.store().pool)
        .await?;
        if new.is_empty() {
            return result;
        }
        // Another session of this profile in the same group wrote it: the profile's own message.
        let own: BTreeSet<String> = sqlx::query_scalar::<_, Vec<u8>>("SELECT signature_key FROM lmk_sessions")
            .fetch_all(&self.store().pool)
            .await?
            .iter()
            .map(|k| fingerprint(k))
            .collect();
        for (id, from, fp) in new {
            let own = own.contains(&fp);
            self.emit(Event::GroupMessage { handle: s.handle.clone(), group: gid.to_owned(), id, from, own });
        }
        result
    }

    async fn sync_locked_from_inner(
        &self,
        s: &mut Session,
        gid: &str,
        wait_secs: u64,
        mut prefetched: Option<(i64, Vec<LogEntry>)>,
    ) -> Result<usize> {
        let (relay, mut cursor, state) = self.lmk_group_row(&s.handle, gid).await?;
        Self::require_active(&state, gid)?;
        let client = self.lmk_client(&relay)?;
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
            // Our own posts in the missing range are not lost: we have them (and merged our
            // commits when the relay took them).
            let ours: i64 = sqlx::query_scalar(
                "SELECT COUNT(DISTINCT seq) FROM lmk_messages WHERE handle = ? AND group_id = ? AND outgoing = 1 \
                 AND state = 'done' AND seq > ? AND seq < ?",
            )
            .bind(&s.handle)
            .bind(gid)
            .bind(cursor)
            .bind(first_seq)
            .fetch_one(&self.store().pool)
            .await?;
            let lost = first_seq.saturating_sub(cursor + 1) > ours;
            // Entries gone from the relay (retention) that held no commit: the first one left is
            // still at our epoch (epochs only grow, one per commit), so our MLS state can go on;
            // the session is told what it lost and reads on.
            let our_epoch = s.member.load_group(gid)?.map(|g| g.epoch().as_u64());
            if lost && our_epoch.is_some() && our_epoch == mls::message_epoch(&first.data) {
                let text = format!(
                    "messages {}..{} of this group are gone from the relay before this session read them (offline \
                     longer than its retention); no membership change was among them, so the session reads on",
                    cursor + 1,
                    first.seq - 1
                );
                let mut tx = self.store().pool.begin().await?;
                alert(&mut tx, &s.handle, gid, &format!("lost:{cursor}"), text).await?;
                tx.commit().await?;
            } else if lost {
                let mut tx = self.store().pool.begin().await?;
                sqlx::query("UPDATE lmk_groups SET state = 'expired' WHERE handle = ? AND group_id = ?")
                    .bind(&s.handle)
                    .bind(gid)
                    .execute(&mut *tx)
                    .await?;
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
                    return Ok(processed);
                }
            }
            if last_page {
                break;
            }
        }
        self.report_gaps(&s.handle, gid).await?;
        Ok(processed)
    }

    /// Processes one log entry in one transaction; returns whether it removed us.
    async fn process_entry(&self, s: &mut Session, gid: &str, seq: i64, data: &[u8]) -> Result<bool> {
        let handle = s.handle.clone();
        let id = message_id(data);
        let mut tx = self.store().pool.begin().await?;
        sqlx::query("UPDATE lmk_groups SET cursor = ? WHERE handle = ? AND group_id = ?")
            .bind(seq)
            .bind(&handle)
            .bind(gid)
            .execute(&mut *tx)
            .await?;
        let own = sqlx::query("SELECT state FROM lmk_messages WHERE handle = ? AND group_id = ? AND id = ?")
            .bind(&handle)
            .bind(gid)
            .bind(&id)
            .fetch_optional(&mut *tx)
            .await?;
        let mut group = s.member.load_group(gid)?.ok_or_else(|| Error::Bug("group state missing".into()))?;
        if let Some(own) = own {
            // Our own message (we cannot decrypt it): a commit we posted but had not merged
            // (the runtime stopped between the relay's answer and the merge) is merged now.
            let state: String = own.get("state");
            if state == "commit_pending" {
                s.member.merge_pending(&mut group)?;
                record_epoch(&mut tx, &handle, gid, &group).await?;
                save_state(&mut tx, &handle, &s.member).await?;
            }
            sqlx::query("UPDATE lmk_messages SET seq = ?, state = 'done' WHERE handle = ? AND group_id = ? AND id = ?")
                .bind(seq)
                .bind(&handle)
                .bind(gid)
                .bind(&id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            return Ok(false);
        }
        let our_epoch = group.epoch().as_u64();
        let msg_epoch = mls::message_epoch(data).unwrap_or(u64::MAX);
        let outcome = s.member.process(&mut group, data);
        let mut removed_us = false;
        match outcome {
            Ok(Processed::Application { sender, data: plain, epoch }) => {
                let epoch_i = i64::try_from(epoch).unwrap_or(i64::MAX);
                match serde_json::from_slice::<Payload>(&plain) {
                    Ok(p) => {
                        let ours: Option<Vec<u8>> = sqlx::query_scalar(
                            "SELECT auth FROM lmk_epoch_auth WHERE handle = ? AND group_id = ? AND epoch = ?",
                        )
                        .bind(&handle)
                        .bind(gid)
                        .bind(epoch_i)
                        .fetch_optional(&mut *tx)
                        .await?;
                        // Every epoch this session is in has its authenticator recorded (create,
                        // join, each merged commit), so a missing one counts as a mismatch too.
                        // A message that fails the check is not delivered: its sender's view of
                        // the group differs from ours, and what it says (a leave request
                        // included) is not acted on.
                        if ours.is_none_or(|ours| b64u_decode(&p.epoch_auth).as_deref() != Some(ours.as_slice())) {
                            alert(
                                &mut tx,
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
                            save_state(&mut tx, &handle, &s.member).await?;
                            tx.commit().await?;
                            return Ok(false);
                        }
                        // A reply must be to something in the sender's declared context: a
                        // `reply-to` that `after` does not cover (seed 001) would let a message
                        // pose as the answer to one its sender never saw. The text is kept; the
                        // reply link is not, and the owner is told once.
                        let mut reply_to = p.reply_to.unwrap_or_default();
                        if !reply_to.is_empty()
                            && !crate::store::group_context_covers(&mut tx, &handle, gid, &p.after, &reply_to).await?
                        {
                            alert(
                                &mut tx,
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
                        let row = NewRow {
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
                        insert_row(&mut tx, &handle, gid, row, now_ms()).await?;
                    }
                    Err(e) => {
                        alert(
                            &mut tx,
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
                commit_rows(&mut tx, &handle, gid, ev).await?;
                if self_removed {
                    removed_us = true;
                    sqlx::query("UPDATE lmk_groups SET state = 'removed' WHERE handle = ? AND group_id = ?")
                        .bind(&handle)
                        .bind(gid)
                        .execute(&mut *tx)
                        .await?;
                } else {
                    record_epoch(&mut tx, &handle, gid, &group).await?;
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
                alert(&mut tx, &handle, gid, &format!("undecryptable:{id}"), why).await?;
            }
        }
        save_state(&mut tx, &handle, &s.member).await?;
        tx.commit().await?;
        Ok(removed_us)
    }

    /// Alerts for `after` references that never arrived, once each.
    async fn report_gaps(&self, handle: &str, gid: &str) -> Result<()> {
        let rows = sqlx::query(
            "SELECT id, after FROM lmk_messages WHERE handle = ? AND group_id = ? AND kind IN ('message', 'leave')",
        )
        .bind(handle)
        .bind(gid)
        .fetch_all(&self.store().pool)
        .await?;
        let mut known: BTreeSet<String> = rows.iter().map(|r| r.get::<String, _>("id")).collect();
        // A message whose content was deleted after the group TTL arrived all the same.
        known.extend(self.store().expired_group_ids(handle, gid).await?);
        let mut missing: BTreeMap<String, String> = BTreeMap::new();
        for r in &rows {
            let after: Vec<String> = serde_json::from_str(r.get::<String, _>("after").as_str()).unwrap_or_default();
            for a in after {
                if !known.contains(&a) {
                    missing.entry(a).or_insert_with(|| r.get::<String, _>("id"));
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        // A member's frontier may name messages from before this session joined: those were
        // never ours to receive, so they are no gap. Which they are, the relay's log says.
        match self.pre_join_ids(handle, gid).await {
            Ok(before) => missing.retain(|gap, _| !before.contains(gap)),
            Err(e) => {
                // Without the log we cannot tell a pre-join reference from a gap: decide next time.
                tracing::debug!(error = %e, group = gid, "reading the log before our join");
                return Ok(());
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let mut tx = self.store().pool.begin().await?;
        for (gap, by) in missing {
            let text = format!(
                "gap: message {gap}, which {by} says its sender had read, never arrived from the relay (withheld or \
                 lost)"
            );
            alert(&mut tx, handle, gid, &format!("gap:{gap}"), text).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Ids of the log entries before this session's latest join of `gid` (empty for the member
    /// that created the group), read from the relay once per runtime and join. Entries the relay
    /// has already dropped (retention) are not among them.
    async fn pre_join_ids(&self, handle: &str, gid: &str) -> Result<Arc<BTreeSet<String>>> {
        let joined: Option<i64> = sqlx::query_scalar(
            "SELECT seq FROM lmk_messages WHERE handle = ? AND group_id = ? AND kind = 'event' AND id LIKE 'joined:%' \
             ORDER BY rowid_ DESC LIMIT 1",
        )
        .bind(handle)
        .bind(gid)
        .fetch_optional(&self.store().pool)
        .await?;
        let Some(joined) = joined.filter(|j| *j > 0) else { return Ok(Arc::default()) };
        let key = (handle.to_owned(), gid.to_owned(), joined);
        if let Some(ids) = self.inner.groups.pre_join.lock().await.get(&key) {
            return Ok(ids.clone());
        }
        let (relay, _, _) = self.lmk_group_row(handle, gid).await?;
        let client = self.lmk_client(&relay)?;
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

    /// The tips of the session's read frontier in `gid`.
    async fn frontier(&self, handle: &str, gid: &str) -> Result<Vec<String>> {
        // Only since the session's latest join: after a re-invite, what it read in its old
        // membership is history, not a claim about the group it is in now.
        let rows = sqlx::query(
            "SELECT id, after FROM lmk_messages WHERE handle = ? AND group_id = ? AND read = 1 \
             AND kind IN ('message', 'leave') AND state = 'done' AND rowid_ > COALESCE((SELECT MAX(rowid_) \
             FROM lmk_messages WHERE handle = ? AND group_id = ? AND kind = 'event' AND id LIKE 'joined:%'), 0) \
             ORDER BY rowid_",
        )
        .bind(handle)
        .bind(gid)
        .bind(handle)
        .bind(gid)
        .fetch_all(&self.store().pool)
        .await?;
        let mut covered = BTreeSet::new();
        for r in &rows {
            let after: Vec<String> = serde_json::from_str(r.get::<String, _>("after").as_str()).unwrap_or_default();
            covered.extend(after);
        }
        Ok(rows.iter().map(|r| r.get::<String, _>("id")).filter(|id| !covered.contains(id)).collect())
    }

    /// Forgets a send the log did not take: the pending MLS state and its message row, committed
    /// with the member's state.
    async fn drop_pending_send(
        &self,
        s: &Session,
        group: &mut openmls::group::MlsGroup,
        gid: &str,
        id: &str,
    ) -> Result<()> {
        s.member.discard_pending(group)?;
        let mut tx = self.store().pool.begin().await?;
        sqlx::query("DELETE FROM lmk_messages WHERE handle = ? AND group_id = ? AND id = ?")
            .bind(&s.handle)
            .bind(gid)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        save_state(&mut tx, &s.handle, &s.member).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Posts a commit the caller staged with `stage`, rebasing when another commit wins the
    /// epoch. Returns the commit's seq and the Welcome if there is one.
    async fn commit_with(&self, s: &mut Session, gid: &str, stage: &Stage<'_>) -> Result<(i64, Option<Vec<u8>>)> {
        let (relay, _, state) = self.lmk_group_row(&s.handle, gid).await?;
        Self::require_active(&state, gid)?;
        let client = self.lmk_client(&relay)?;
        for _ in 0..MAX_REBASES {
            self.sync_locked(s, gid, 0).await?;
            let mut group = s.member.load_group(gid)?.ok_or_else(|| Error::Bug("group state missing".into()))?;
            let (commit, welcome) = stage(&s.member, &mut group)?;
            let id = message_id(&commit);
            // The pending commit is durable before the relay sees it, so a crash in between is
            // recovered when the commit comes back from the log.
            let mut tx = self.store().pool.begin().await?;
            let row = NewRow {
                id: id.clone(),
                kind: "event",
                state: "commit_pending",
                outgoing: true,
                read: true,
                ..Default::default()
            };
            insert_row(&mut tx, &s.handle, gid, row, now_ms()).await?;
            save_state(&mut tx, &s.handle, &s.member).await?;
            tx.commit().await?;
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
                    let mut tx = self.store().pool.begin().await?;
                    sqlx::query("DELETE FROM lmk_messages WHERE handle = ? AND group_id = ? AND id = ?")
                        .bind(&s.handle)
                        .bind(gid)
                        .bind(&id)
                        .execute(&mut *tx)
                        .await?;
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
                    save_state(&mut tx, &s.handle, &s.member).await?;
                    tx.commit().await?;
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
                    let (relay, _, state) = self.lmk_group_row(handle, gid).await?;
                    Self::require_active(&state, gid)?;
                    (gid.to_owned(), relay)
                }
                None => self.lmk_new_group(&s).await?,
            }
        };
        let inviter = session.lock().await.member.name().to_owned();
        let group_name = self.store().group_names().await?.remove(&gid);
        let client = self.lmk_client(&relay)?;
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
    async fn lmk_new_group(&self, s: &Session) -> Result<(String, String)> {
        let handle = &s.handle;
        let gid = new_id(&mut OsRng);
        let g = s.member.create_group(&gid)?;
        let relay = self.inner.relay_url.trim_end_matches('/').to_owned();
        let mut tx = self.store().pool.begin().await?;
        sqlx::query("INSERT INTO lmk_groups (handle, group_id, relay, joined_at) VALUES (?, ?, ?, ?)")
            .bind(handle)
            .bind(&gid)
            .bind(&relay)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        let me = mls::MemberInfo { name: s.member.name().to_owned(), fingerprint: s.member.fingerprint(), leaf: 0 };
        note_member(&mut tx, handle, &gid, &me, "").await?;
        record_epoch(&mut tx, handle, &gid, &g).await?;
        save_state(&mut tx, handle, &s.member).await?;
        tx.commit().await?;
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
    async fn lmk_admit(
        &self,
        handle: &str,
        gid: &str,
        link: &InviteLink,
        owner: &str,
        expires_at: i64,
    ) -> Result<Value> {
        let (relay, _, _) = self.lmk_group_row(handle, gid).await?;
        let client = self.lmk_client(&relay)?;
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
        let client = self.lmk_client(&link.relay)?;
        let key = link.key();
        let sealed = {
            let s = session.lock().await;
            let kp = s.member.key_package()?;
            // The KeyPackage's private keys must be durable before anyone can use it.
            let mut tx = self.store().pool.begin().await?;
            save_state(&mut tx, handle, &s.member).await?;
            tx.commit().await?;
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
            Err(e) => return Err(e.into()),
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
            let mut tx = self.store().pool.begin().await?;
            sqlx::query(
                "INSERT INTO lmk_groups (handle, group_id, relay, cursor, joined_at) VALUES (?, ?, ?, ?, ?) \
                 ON CONFLICT (handle, group_id) DO UPDATE SET relay = excluded.relay, cursor = excluded.cursor, \
                 state = 'active'",
            )
            .bind(handle)
            .bind(&blob.group)
            .bind(blob.relay.trim_end_matches('/'))
            .bind(i64::try_from(blob.seq).unwrap_or(i64::MAX))
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
            for m in &members {
                note_member(&mut tx, handle, &blob.group, m, "").await?;
            }
            // Joining a group this session was in before (re-invited after falling behind the
            // relay's retention, or after a removal): its old rows stay as history, the cursor
            // and state were reset above, and authenticators it recorded for epochs from this
            // one on belong to the old membership (perhaps a fork): the Welcome's replace them.
            sqlx::query("DELETE FROM lmk_epoch_auth WHERE handle = ? AND group_id = ? AND epoch >= ?")
                .bind(handle)
                .bind(&blob.group)
                .bind(i64::try_from(group.epoch().as_u64()).unwrap_or(i64::MAX))
                .execute(&mut *tx)
                .await?;
            let names = members.iter().map(who).collect::<Vec<_>>().join(", ");
            let row = NewRow {
                id: format!("joined:{}", blob.seq),
                seq: i64::try_from(blob.seq).unwrap_or(0),
                epoch: i64::try_from(group.epoch().as_u64()).unwrap_or(0),
                kind: "event",
                content: format!("you joined; members: {names}"),
                ..Default::default()
            };
            insert_row(&mut tx, handle, &blob.group, row, now_ms()).await?;
            // The inviter's name for the group (the Welcome's, else the link's) becomes ours,
            // unless we named it before (a re-join).
            let suggested = blob.name.as_deref().or(link.group.as_deref()).and_then(|n| group_name(n).ok());
            if let Some(name) = suggested {
                name_group_if_unnamed(&mut tx, &blob.group, &name, now_ms()).await?;
            }
            record_epoch(&mut tx, handle, &blob.group, &group).await?;
            save_state(&mut tx, handle, &s.member).await?;
            tx.commit().await?;
            self.inner.groups.joined.notify_one();
        }
        self.lmk_sync(handle, &blob.group, 0).await?;
        let members = self.lmk_members(handle, &blob.group).await?;
        let name = self.store().group_names().await?.remove(&blob.group).unwrap_or_default();
        Ok(json!({"group": blob.group, "name": name, "handle": handle, "members": members.get("members").cloned()}))
    }

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

    async fn lmk_post_app(
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
        let (relay, _, state) = self.lmk_group_row(handle, gid).await?;
        Self::require_active(&state, gid)?;
        let client = self.lmk_client(&relay)?;
        for _ in 0..MAX_REBASES {
            self.sync_locked(&mut s, gid, 0).await?;
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
            let mut after = self.frontier(handle, gid).await?;
            if let Some(r) = reply_to {
                let known: Option<i64> = sqlx::query_scalar(
                    "SELECT rowid_ FROM lmk_messages WHERE handle = ? AND group_id = ? AND id = ? AND kind IN ('message', 'leave')",
                )
                .bind(handle)
                .bind(gid)
                .bind(r)
                .fetch_optional(&self.store().pool)
                .await?;
                let rowid = known.ok_or_else(|| Error::UnknownMessage(r.to_owned()))?;
                // Replying means it entered our context: it joins the frontier, and `after` covers it.
                sqlx::query("UPDATE lmk_messages SET read = 1 WHERE rowid_ = ?")
                    .bind(rowid)
                    .execute(&self.store().pool)
                    .await?;
                if !after.iter().any(|a| a == r) {
                    after = self.frontier(handle, gid).await?;
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
            // The ratchet state and the row are durable before the relay sees the ciphertext, so
            // a restart never reuses a message key.
            let mut tx = self.store().pool.begin().await?;
            let row = NewRow {
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
            insert_row(&mut tx, handle, gid, row, now_ms()).await?;
            save_state(&mut tx, handle, &s.member).await?;
            tx.commit().await?;
            match client.post(gid, bytes).await? {
                Posted::Stored(seq) => {
                    sqlx::query(
                        "UPDATE lmk_messages SET seq = ?, state = 'done' WHERE handle = ? AND group_id = ? AND id = ?",
                    )
                    .bind(i64::try_from(seq).unwrap_or(i64::MAX))
                    .bind(handle)
                    .bind(gid)
                    .bind(&id)
                    .execute(&self.store().pool)
                    .await?;
                    return Ok(json!({"group": gid, "id": id, "seq": seq}));
                }
                Posted::WrongEpoch(_) => {
                    self.inner.groups.rebases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    sqlx::query("DELETE FROM lmk_messages WHERE handle = ? AND group_id = ? AND id = ?")
                        .bind(handle)
                        .bind(gid)
                        .bind(&id)
                        .execute(&self.store().pool)
                        .await?;
                }
            }
        }
        Err(Error::Transport(TransportError::Unreachable(format!("group {gid}: the epoch kept moving; try again"))))
    }

    /// Members of `gid` as this session sees them: name, fingerprint, who added them.
    pub async fn lmk_members(&self, handle: &str, gid: &str) -> Result<Value> {
        let session = self.lmk_load(handle).await?;
        let s = session.lock().await;
        let group =
            s.member.load_group(gid)?.ok_or_else(|| Error::Invalid(format!("`{handle}` is not in group {gid}")))?;
        let notes =
            sqlx::query("SELECT fingerprint, invited_by FROM lmk_member_notes WHERE handle = ? AND group_id = ?")
                .bind(handle)
                .bind(gid)
                .fetch_all(&self.store().pool)
                .await?;
        let notes: BTreeMap<String, String> =
            notes.iter().map(|r| (r.get::<String, _>("fingerprint"), r.get::<String, _>("invited_by"))).collect();
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

    /// Leaves `gid`: asks the other members to commit our removal, then stops following it.
    /// Deletes group session `handle` (owner only): leaves each of its active groups (the others
    /// commit the removal), then erases its MLS state and its decrypted log (seed 001: the log is
    /// deleted with the session). A group that could not be told (its relay down) is named in the
    /// answer; the session is deleted all the same, since the owner asked for its keys to go.
    pub async fn lmk_session_delete(&self, handle: &str) -> Result<Value> {
        let session = self.lmk_load(handle).await?;
        let groups: Vec<String> =
            sqlx::query_scalar("SELECT group_id FROM lmk_groups WHERE handle = ? AND state = 'active'")
                .bind(handle)
                .fetch_all(&self.store().pool)
                .await?;
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
        }
        for g in groups {
            self.emit(Event::GroupChanged { group: g });
        }
        Ok(json!({"handle": handle, "deleted": true, "left": left, "not_told": not_told}))
    }

    pub async fn lmk_leave(&self, handle: &str, gid: &str) -> Result<Value> {
        let sent = self.lmk_post_app(handle, gid, "(leaving the group)", None, None, true).await?;
        sqlx::query("UPDATE lmk_groups SET state = 'left' WHERE handle = ? AND group_id = ?")
            .bind(handle)
            .bind(gid)
            .execute(&self.store().pool)
            .await?;
        Ok(json!({"group": gid, "left": true, "request": sent.get("id").cloned()}))
    }

    /// Commits the removal of members who asked to leave and are still in the group.
    async fn honour_leaves(&self, handle: &str, gid: &str) -> Result<()> {
        let (_, _, state) = self.lmk_group_row(handle, gid).await?;
        if state != "active" {
            return Ok(());
        }
        let leavers: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT sender_fp FROM lmk_messages WHERE handle = ? AND group_id = ? AND kind = 'leave' AND outgoing = 0",
        )
        .bind(handle)
        .bind(gid)
        .fetch_all(&self.store().pool)
        .await?;
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
        Ok(())
    }

    /// The groups of a session.
    pub async fn lmk_groups(&self, handle: &str) -> Result<Value> {
        let rows = sqlx::query(
            "SELECT group_id, relay, state, cursor, joined_at FROM lmk_groups WHERE handle = ? ORDER BY joined_at",
        )
        .bind(handle)
        .fetch_all(&self.store().pool)
        .await?;
        let policy = self.policy().await?;
        let pending = self.lmk_pending(handle).await?;
        let names = self.store().group_names().await?;
        let owner = self.store().meta(OWNER_HANDLE).await?;
        let me: Option<Vec<u8>> = sqlx::query_scalar("SELECT signature_key FROM lmk_sessions WHERE handle = ?")
            .bind(handle)
            .fetch_optional(&self.store().pool)
            .await?;
        let me = me.map(|k| fingerprint(&k)).unwrap_or_default();
        let mut out = Vec::new();
        for r in rows {
            let gid: String = r.get("group_id");
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
            let unread: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM lmk_messages WHERE handle = ? AND group_id = ? AND read = 0")
                    .bind(handle)
                    .bind(&gid)
                    .fetch_one(&self.store().pool)
                    .await?;
            out.push(json!({
                "name": names.get(&gid).cloned().unwrap_or_default(),
                "member_names": others,
                "own": owner.as_deref() == Some(handle),
                "group": gid,
                "handle": handle,
                "joined_at": r.get::<i64, _>("joined_at"),
                "relay": r.get::<String, _>("relay"),
                "state": r.get::<String, _>("state"),
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
        let first = sqlx::query("SELECT * FROM lmk_messages WHERE handle = ? AND id = ?")
            .bind(handle)
            .bind(id)
            .fetch_optional(&self.store().pool)
            .await?
            .ok_or_else(|| Error::UnknownMessage(id.to_owned()))?;
        let gid: String = first.get("group_id");
        let mut out = vec![row_dto(&first)];
        let mut rowids = vec![first.get::<i64, _>("rowid_")];
        let mut seen = BTreeSet::from([id.to_owned()]);
        let mut queue: VecDeque<(String, usize)> = VecDeque::new();
        let after: Vec<String> = serde_json::from_str(first.get::<String, _>("after").as_str()).unwrap_or_default();
        queue.extend(after.into_iter().map(|a| (a, 1)));
        let mut missing = Vec::new();
        while let Some((aid, depth)) = queue.pop_front() {
            if depth > ancestors || !seen.insert(aid.clone()) {
                continue;
            }
            let row = sqlx::query("SELECT * FROM lmk_messages WHERE handle = ? AND group_id = ? AND id = ?")
                .bind(handle)
                .bind(&gid)
                .bind(&aid)
                .fetch_optional(&self.store().pool)
                .await?;
            match row {
                Some(row) => {
                    let after: Vec<String> =
                        serde_json::from_str(row.get::<String, _>("after").as_str()).unwrap_or_default();
                    queue.extend(after.into_iter().map(|a| (a, depth + 1)));
                    rowids.push(row.get("rowid_"));
                    out.push(row_dto(&row));
                }
                None => missing.push(aid),
            }
        }
        let mut tx = self.store().pool.begin().await?;
        for r in rowids {
            sqlx::query("UPDATE lmk_messages SET read = 1 WHERE rowid_ = ?").bind(r).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(
            json!({"message": out.first().cloned(), "ancestors": out.get(1..).map(<[Value]>::to_vec), "missing": missing}),
        )
    }

    /// What the delivery policy makes of the session's unread rows now (see the module doc).
    async fn lmk_pending(&self, handle: &str) -> Result<Pending> {
        let policy = self.policy().await?;
        let dnd = self.dnd().await?;
        let rows =
            sqlx::query("SELECT * FROM lmk_messages WHERE handle = ? AND read = 0 AND state = 'done' ORDER BY rowid_")
                .bind(handle)
                .fetch_all(&self.store().pool)
                .await?;
        let (me, my_name) =
            sqlx::query_as::<_, (Vec<u8>, String)>("SELECT signature_key, name FROM lmk_sessions WHERE handle = ?")
                .bind(handle)
                .fetch_optional(&self.store().pool)
                .await?
                .map(|(k, name)| (fingerprint(&k), name))
                .unwrap_or_default();
        // The loop guard's hops: every group message, in or out, after the group's last operator
        // input, by rowid; a row is paused when more than the limit precede it (itself included).
        let counted: Vec<(String, i64)> = sqlx::query_as(
            "SELECT m.group_id, m.rowid_ FROM lmk_messages m WHERE m.handle = ?1 AND m.kind = 'message' \
             AND m.state = 'done' AND m.rowid_ > COALESCE((SELECT p.reset_rowid FROM lmk_policy p \
             WHERE p.handle = ?1 AND p.group_id = m.group_id), 0) ORDER BY m.rowid_",
        )
        .bind(handle)
        .fetch_all(&self.store().pool)
        .await?;
        let mut hops: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for (gid, rowid) in counted {
            hops.entry(gid).or_default().push(rowid);
        }
        let now = now_ms();
        let mut out = Pending { dnd, ..Default::default() };
        for r in rows {
            // Handed out under a lease still running: neither due nor waiting, until it is acked
            // (read) or runs out (due again, whatever the digest tick says).
            let leased = !r.get::<String, _>("lease").is_empty();
            let expires = r.get::<i64, _>("leased_at").saturating_add(LEASE_MS);
            if leased && expires > now {
                out.handed += 1;
                out.next_expiry = Some(out.next_expiry.map_or(expires, |t| t.min(expires)));
                continue;
            }
            let rowid: i64 = r.get("rowid_");
            let gid: String = r.get("group_id");
            let to: String = r.get("to_fp");
            let kind: String = r.get("kind");
            // Steer when addressed to this session (`to`, or an @mention of its handle or name
            // in a peer's message) and for alerts; digest otherwise.
            let mentioned = kind == "message"
                && r.get::<i64, _>("outgoing") == 0
                && mentions(r.get::<String, _>("content").as_str(), &[handle, &my_name]);
            let steer = !to.is_empty() && to == me || kind == "alert" || mentioned;
            let before = hops.get(&gid).map_or(0, |v| v.partition_point(|x| *x <= rowid));
            let paused = kind == "message" && i64::try_from(before).unwrap_or(i64::MAX) > policy.loop_limit;
            let due_at =
                if steer || leased { r.get("created_at") } else { digest_due(r.get("created_at"), policy.digest_ms) };
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
    /// [`CATCH_UP`] plus the number omitted, under a new lease (`lease`, null when nothing is
    /// handed out): it is read once the lease is acked ([`Self::lmk_ack`]). Rows whose lease ran
    /// out unacked are due again and come marked `redelivered`. What is not due stays unread,
    /// outside the read frontier, and is counted under `held`.
    pub async fn lmk_deliveries(&self, handle: &str) -> Result<Value> {
        let pending = self.lmk_pending(handle).await?;
        // Once something is due the session is woken anyway: waiting digest rows ride along (as
        // in the 1:1 queue), in log order.
        let waiting = pending.early.len();
        let mut batch: Vec<(&sqlx::sqlite::SqliteRow, &str)> = pending.due.iter().map(|(r, m)| (r, *m)).collect();
        if !batch.is_empty() {
            batch.extend(pending.early.iter().map(|r| (r, "digest")));
            batch.sort_by_key(|(r, _)| r.get::<i64, _>("rowid_"));
        }
        let lease = format!("G{}", crate::util::hex(&crate::util::random_array::<16>()));
        let now = now_ms();
        let mut taken = Vec::with_capacity(batch.len());
        // IMMEDIATE: two concurrent callers for one session must not hand out the same rows.
        let mut tx = self.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        for (r, mode) in batch {
            // A concurrent caller may have taken it (or it was acked meanwhile): each row is
            // handed over once per lease.
            let handed: Option<i64> = sqlx::query_scalar(
                "UPDATE lmk_messages SET lease = ?1, leased_at = ?2, handed_count = handed_count + 1 \
                 WHERE rowid_ = ?3 AND read = 0 AND (lease = '' OR leased_at <= ?4) RETURNING handed_count",
            )
            .bind(&lease)
            .bind(now)
            .bind(r.get::<i64, _>("rowid_"))
            .bind(now.saturating_sub(LEASE_MS))
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(n) = handed {
                taken.push((r, mode, n > 1));
            }
        }
        tx.commit().await?;
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
        let mut tx = self.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        let owners: Vec<String> = sqlx::query_scalar("SELECT DISTINCT handle FROM lmk_messages WHERE lease = ?")
            .bind(lease)
            .fetch_all(&mut *tx)
            .await?;
        if let Some(me) = agent
            && owners.iter().any(|o| o != me)
        {
            return Err(Error::Forbidden(format!(
                "group lease `{}` was not handed to session `{me}`",
                super::delivery::label_value(lease)
            )));
        }
        let rows: Vec<(i64, String)> =
            sqlx::query_as("SELECT rowid_, id FROM lmk_messages WHERE lease = ? AND read = 0 ORDER BY rowid_")
                .bind(lease)
                .fetch_all(&mut *tx)
                .await?;
        let mut acked = 0u64;
        for (rowid, id) in rows {
            if ids.is_some_and(|ids| !ids.contains(&id)) {
                continue;
            }
            acked += sqlx::query("UPDATE lmk_messages SET read = 1 WHERE rowid_ = ? AND lease = ? AND read = 0")
                .bind(rowid)
                .bind(lease)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(json!({"lease": lease, "acked": acked, "agent": owners.first(), "handle": owners.first()}))
    }
}

/// The delivery policy's send side and operator input.
impl Runtime {
    /// Agent-to-agent hops in `gid` since the session's last operator input there: every group
    /// message, in or out.
    async fn lmk_hops(&self, handle: &str, gid: &str) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT COUNT(*) FROM lmk_messages WHERE handle = ?1 AND group_id = ?2 AND kind = 'message' \
             AND state = 'done' AND rowid_ > COALESCE((SELECT reset_rowid FROM lmk_policy \
             WHERE handle = ?1 AND group_id = ?2), 0)",
        )
        .bind(handle)
        .bind(gid)
        .fetch_one(&self.store().pool)
        .await?)
    }

    /// Operator input in `gid` (the owner sent there, resumed it, or approved a held send): the
    /// loop guard counts from here, and what it paused is released. Returns how many messages
    /// were released.
    pub(super) async fn lmk_operator_input(&self, handle: &str, gid: &str) -> Result<u64> {
        self.lmk_group_row(handle, gid).await?;
        let before = self.lmk_pending(handle).await?.paused.get(gid).copied().unwrap_or(0);
        sqlx::query(
            "INSERT INTO lmk_policy (handle, group_id, reset_rowid) VALUES (?1, ?2, \
             (SELECT COALESCE(MAX(rowid_), 0) FROM lmk_messages)) \
             ON CONFLICT (handle, group_id) DO UPDATE SET reset_rowid = excluded.reset_rowid",
        )
        .bind(handle)
        .bind(gid)
        .execute(&self.store().pool)
        .await?;
        self.emit(Event::GroupResumed { handle: handle.to_owned(), group: gid.to_owned() });
        Ok(u64::try_from(before).unwrap_or(0))
    }

    /// The group's outbound mode as set (`default`: the profile-wide review policy).
    async fn lmk_outbound(&self, handle: &str, gid: &str) -> Result<String> {
        Ok(sqlx::query_scalar("SELECT outbound FROM lmk_policy WHERE handle = ? AND group_id = ?")
            .bind(handle)
            .bind(gid)
            .fetch_optional(&self.store().pool)
            .await?
            .unwrap_or_else(|| "default".to_owned()))
    }

    /// Sets the outbound mode of the session's agent sends to `gid`.
    async fn lmk_set_mode(&self, handle: &str, gid: &str, mode: &str) -> Result<Value> {
        if !matches!(mode, "auto" | "review" | "default") {
            return Err(Error::Invalid("mode must be auto, review or default".into()));
        }
        self.lmk_group_row(handle, gid).await?;
        sqlx::query(
            "INSERT INTO lmk_policy (handle, group_id, outbound) VALUES (?, ?, ?) \
             ON CONFLICT (handle, group_id) DO UPDATE SET outbound = excluded.outbound",
        )
        .bind(handle)
        .bind(gid)
        .bind(mode)
        .execute(&self.store().pool)
        .await?;
        Ok(json!({"group": gid, "handle": handle, "mode": mode}))
    }

    /// An agent session's send to `gid`: refused by the loop guard past the limit, held in the
    /// review queue in review mode, sent otherwise.
    async fn lmk_agent_send(
        &self,
        me: &str,
        gid: &str,
        text: &str,
        to: Option<&str>,
        reply_to: Option<&str>,
    ) -> Result<Value> {
        let (_, _, state) = self.lmk_group_row(me, gid).await?;
        Self::require_active(&state, gid)?;
        let policy = self.policy().await?;
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
        let id = sqlx::query(
            "INSERT INTO review_queue (agent, group_id, to_fp, kind, body, reply_to, created_at) \
             VALUES (?, ?, ?, 'send', ?, ?, ?)",
        )
        .bind(me)
        .bind(gid)
        .bind(to.map(canonical_fp))
        .bind(text)
        .bind(reply_to)
        .bind(now_ms())
        .execute(&self.store().pool)
        .await?
        .last_insert_rowid();
        Ok(json!({
            "group": gid,
            "id": Value::Null,
            "review_id": id,
            "state": "held_for_review",
            "detail": format!("held until your operator approves it (switchboard review approve {id})"),
        }))
    }
}

/// The delivery policy's view of a session's unread group rows at one moment.
#[derive(Default)]
struct Pending {
    /// Due now, oldest first, with their mode (steer or digest).
    due: Vec<(sqlx::sqlite::SqliteRow, &'static str)>,
    /// Digest rows waiting for their tick (they ride along with anything due).
    early: Vec<sqlx::sqlite::SqliteRow>,
    /// The earliest tick a waiting digest row is due at.
    next_due: Option<i64>,
    /// Rows the loop guard holds, per group.
    paused: BTreeMap<String, usize>,
    /// Due rows held only by do-not-disturb.
    dnd_held: usize,
    /// Rows handed out under a lease that has not run out (not acked yet).
    handed: usize,
    /// When the first of those leases runs out.
    next_expiry: Option<i64>,
    /// Whether do-not-disturb is on.
    dnd: bool,
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
