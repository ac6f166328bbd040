//! SQL for Stringcup v2: identities and their tokens (`sc_identity`), inboxes (`sc_message`),
//! idempotency keys (`sc_idempotency`), topics (`sc_topic`, `sc_topic_member`), rendezvous
//! (`sc_rendezvous`, `sc_rendezvous_claim`) and the statistics counter (`sc_counter`: what
//! reclaimed identities had stored; the lifetime total adds every identity's sent count).
//!
//! - Writes are requests run by the group-committing writer: each request's decision (stored,
//!   not found, full, replay...) is made inside the transaction, so concurrent requests are
//!   serialised by the writer, never by the route. Business outcomes are values, never SQL
//!   errors: a failing statement would roll back every other caller's write in the batch.
//! - Once the batch commits, the writer wakes parked long-polls through the hub (an inbox's
//!   newest id with the message itself, a rendezvous' version); on PostgreSQL the same wake-ups
//!   reach other instances (without the message: they read it).
//! - Reads go to the reader pool. Routes see [`StringcupStore`]; the request and outcome types
//!   here are shared with the PostgreSQL backend ([`super::pg::stringcup`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::OptionalExtension as _;
use sqlx::{SqliteConnection, SqliteExecutor};
use switchboard_core::util::hex;

use super::sync::{SyncDb, rows};
use super::writer::sync_request;
use super::{SqliteStore, Store, StoreError};
use crate::hub::{Committed, Hub};

/// The hub key of an identity's inbox (namespaced apart from letagents mailbox ids).
pub fn inbox_key(identity: &str) -> String {
    format!("stringcup/inbox/{identity}")
}

/// The hub key of a rendezvous.
pub fn rendezvous_key(token_hash: &[u8]) -> String {
    format!("stringcup/rendezvous/{}", hex(token_hash))
}

/// A rendezvous role, derived by the relay (B.6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Opened the rendezvous.
    Initiator,
    /// Joined with the token.
    Responder,
}

impl Role {
    /// The wire and database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initiator => "initiator",
            Self::Responder => "responder",
        }
    }

    /// The role spelled `text`.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "initiator" => Some(Self::Initiator),
            "responder" => Some(Self::Responder),
            _ => None,
        }
    }
}

/// An identity as anyone may see it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct IdentityRow {
    /// `sc-...`.
    pub id: String,
    /// Raw X25519 public key.
    pub public_key: Vec<u8>,
    /// Always `x25519` today.
    pub algo: String,
    /// Owner-chosen label, `''` for none.
    pub display_name: String,
    /// When the key last changed (ms).
    pub key_updated_ms: i64,
    /// When anything last changed (ms).
    pub updated_ms: i64,
    /// Registration time (ms).
    pub created_ms: i64,
}

/// The identity a bearer token belongs to, with the token's times.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TokenRow {
    /// The identity.
    pub identity: String,
    /// When this token was issued (ms).
    pub token_created_ms: i64,
    /// When it was last used, refreshed at most once per touch interval (ms).
    pub token_last_used_ms: i64,
}

/// Most tokens [`TokenCache`] holds; past this it starts over (~100 bytes an entry).
const TOKEN_CACHE_ENTRIES: usize = 16_384;

/// The bearer tokens the SQLite backend looked up, so an authenticated request does not read
/// the database for its token (a read on the reader pool, BENCHMARKS.md "Stringcup long-poll").
///
/// Exact, not merely fresh: only this process writes a SQLite database, and every write that
/// changes what [`StringcupStore::by_token`] returns updates the cache as it settles, before its
/// caller hears back (`writer::Request::settled`): a touch raises the cached last use
/// as its `UPDATE` does, a rotation and a failed touch forget the identity, a sweep forgets
/// everything. A lookup that missed fills the cache only if nothing was forgotten or changed
/// since it missed (`TokenCache::fill`), so a row read before a write committed is never
/// cached after that write settled. Unknown tokens are not cached. PostgreSQL, whose rows other
/// instances change, reads every time.
#[derive(Debug, Default)]
pub struct TokenCache {
    inner: Mutex<TokenCacheInner>,
}

#[derive(Debug, Default)]
struct TokenCacheInner {
    rows: HashMap<Vec<u8>, TokenRow>,
    /// Each cached identity's token hash (one token per identity).
    hash_of: HashMap<String, Vec<u8>>,
    /// Advanced by every change; a fill from before one is dropped.
    generation: u64,
}

impl TokenCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, TokenCacheInner> {
        // Every change below leaves both maps consistent before anything can panic.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The row of `token_hash` if cached, else the generation a fill after reading it must match.
    pub(crate) fn get(&self, token_hash: &[u8]) -> Result<TokenRow, u64> {
        let inner = self.lock();
        inner.rows.get(token_hash).cloned().ok_or(inner.generation)
    }

    /// Caches `row`, read for `token_hash` after a miss at `generation`, unless anything changed
    /// since.
    pub(crate) fn fill(&self, token_hash: &[u8], row: &TokenRow, generation: u64) {
        let mut inner = self.lock();
        if inner.generation != generation {
            return;
        }
        if inner.rows.len() >= TOKEN_CACHE_ENTRIES {
            inner.rows.clear();
            inner.hash_of.clear();
        }
        if let Some(old) = inner.hash_of.insert(row.identity.clone(), token_hash.to_vec()) {
            inner.rows.remove(&old);
        }
        inner.rows.insert(token_hash.to_vec(), row.clone());
    }

    /// `identity`'s token was used at `now` (a committed [`Touch`]).
    pub(crate) fn touched(&self, identity: &str, now: i64) {
        let mut inner = self.lock();
        inner.generation += 1;
        let Some(hash) = inner.hash_of.get(identity).cloned() else { return };
        if let Some(row) = inner.rows.get_mut(&hash) {
            row.token_last_used_ms = row.token_last_used_ms.max(now);
        }
    }

    /// Drops whatever is cached for `identity`.
    pub(crate) fn forget(&self, identity: &str) {
        let mut inner = self.lock();
        inner.generation += 1;
        if let Some(hash) = inner.hash_of.remove(identity) {
            inner.rows.remove(&hash);
        }
    }

    /// Drops everything.
    pub(crate) fn clear(&self) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.rows.clear();
        inner.hash_of.clear();
    }
}

/// A new identity.
#[derive(Debug)]
pub struct Register {
    /// Freshly drawn `sc-` id.
    pub id: String,
    /// Raw X25519 key.
    pub public_key: Vec<u8>,
    /// Label, `''` for none.
    pub display_name: String,
    /// SHA-256 of the issued token.
    pub token_hash: Vec<u8>,
    /// Relay clock (ms).
    pub now: i64,
}

/// A change to the caller's identity.
#[derive(Debug)]
pub struct Update {
    /// The caller.
    pub identity: String,
    /// A new key, if given.
    pub public_key: Option<Vec<u8>>,
    /// A new label (`''` clears it), if given.
    pub display_name: Option<String>,
    /// Relay clock (ms).
    pub now: i64,
}

/// The identity after an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Updated {
    /// The record as stored now.
    pub row: IdentityRow,
    /// Whether the key itself changed.
    pub key_changed: bool,
}

/// An authenticated use of a token (resets the inactivity window).
#[derive(Debug)]
pub struct Touch {
    /// The caller.
    pub identity: String,
    /// Relay clock (ms).
    pub now: i64,
}

/// A token rotation: replaces `old_hash` with `new_hash` only if `old_hash` is still current.
#[derive(Debug)]
pub struct Rotate {
    /// The caller.
    pub identity: String,
    /// SHA-256 of the presented token.
    pub old_hash: Vec<u8>,
    /// SHA-256 of the new token.
    pub new_hash: Vec<u8>,
    /// Relay clock (ms).
    pub now: i64,
}

/// One validated message to store.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// Well-formed `sc-` id (it may not exist).
    pub recipient: String,
    /// Header `ephemeral_pub`, 32 bytes.
    pub ephemeral_pub: Vec<u8>,
    /// Header `iv`, 12 bytes.
    pub iv: Vec<u8>,
    /// The header's extra fields as a JSON object of strings, `""` for none (checked by the
    /// route; stored and returned as is).
    pub header_extra: String,
    /// The opaque ciphertext.
    pub ciphertext: Vec<u8>,
}

impl NewMessage {
    /// What the message counts for against the pending byte limits: the ciphertext and the
    /// extra header fields.
    pub fn size(&self) -> usize {
        self.ciphertext.len().saturating_add(self.header_extra.len())
    }
}

/// The pending limits a send is checked against (B.3.6).
#[derive(Debug, Clone, Copy)]
pub struct PendingCaps {
    /// Messages in one inbox across all senders.
    pub inbox_messages: u64,
    /// Bytes in one inbox across all senders.
    pub inbox_bytes: u64,
    /// Messages from one sender in one inbox.
    pub sender_messages: u64,
    /// Bytes from one sender in one inbox.
    pub sender_bytes: u64,
}

/// A send of one message (with an optional idempotency key) or a batch.
#[derive(Debug)]
pub struct SendRequest {
    /// The authenticated sender.
    pub sender: String,
    /// `Idempotency-Key`; only with exactly one message.
    pub idempotency_key: Option<String>,
    /// Keys created before this are forgotten (ms).
    pub idempotency_expired_before: i64,
    /// The messages, each stored or refused on its own.
    pub messages: Vec<NewMessage>,
    /// The pending limits.
    pub caps: PendingCaps,
    /// Relay clock (ms).
    pub now: i64,
}

/// Which pending limit refused a send, with its value. The per-sender ones mean the sender's
/// own share is full (the recipient is not behind); the inbox ones mean the recipient is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingLimit {
    /// Messages from this sender waiting in the inbox.
    SenderMessages(u64),
    /// Bytes from this sender waiting in the inbox.
    SenderBytes(u64),
    /// Messages waiting in the inbox from everybody.
    InboxMessages(u64),
    /// Bytes waiting in the inbox from everybody.
    InboxBytes(u64),
}

impl PendingLimit {
    /// Whether only the sender's share is full.
    pub fn is_per_sender(self) -> bool {
        matches!(self, Self::SenderMessages(_) | Self::SenderBytes(_))
    }
}

/// What happened to one message of a [`SendRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    /// Committed: the sender's number, and the recipient's (never told to the sender).
    Stored {
        /// The sender's number.
        sent_seq: i64,
        /// The recipient's number.
        inbox_id: i64,
    },
    /// The idempotency key already names a stored send to the same recipient.
    Replay {
        /// That send's number.
        sent_seq: i64,
    },
    /// The idempotency key already names a send to a different recipient.
    KeyReused,
    /// No such recipient.
    NoRecipient,
    /// A pending limit is reached.
    Full(PendingLimit),
    /// The sender itself no longer exists (reclaimed while the request was in flight).
    NoSender,
}

/// A message waiting in an inbox.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredMessage {
    /// The recipient's number.
    pub id: i64,
    /// Who sent it.
    pub sender: String,
    /// Header version.
    pub header_version: i64,
    /// Header algorithm.
    pub header_algo: String,
    /// Header ephemeral key.
    pub ephemeral_pub: Vec<u8>,
    /// Header IV.
    pub iv: Vec<u8>,
    /// Extra header fields, as [`NewMessage::header_extra`].
    pub header_extra: String,
    /// The opaque ciphertext.
    pub ciphertext: Vec<u8>,
    /// When it was stored (ms).
    pub created_ms: i64,
}

/// An acknowledgement of messages in the caller's own inbox.
#[derive(Debug)]
pub struct Ack {
    /// The caller.
    pub identity: String,
    /// Ids to delete, without duplicates.
    pub ids: Vec<i64>,
}

/// Every id of an [`Ack`], in exactly one bucket, in request order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckOutcome {
    /// Deleted now.
    pub acknowledged: Vec<i64>,
    /// Not in the caller's inbox.
    pub not_found: Vec<i64>,
}

/// A topic the caller is a member of.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TopicRow {
    /// `tp-...`.
    pub id: String,
    /// Its owner.
    pub owner: String,
    /// Creation time (ms).
    pub created_ms: i64,
    /// Members, owner included.
    pub member_count: i64,
}

/// A new topic.
#[derive(Debug)]
pub struct CreateTopic {
    /// Freshly drawn `tp-` id.
    pub id: String,
    /// The caller, who becomes owner and first member.
    pub owner: String,
    /// Well-formed identity ids to add in the same write, without duplicates (the owner's own
    /// id counts as already a member).
    pub members: Vec<String>,
    /// Most members a topic may have.
    pub max_members: u64,
    /// Relay clock (ms).
    pub now: i64,
}

/// Who a creation with members added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitialMembers {
    /// Added along with the owner.
    pub added: Vec<String>,
    /// Already a member (the owner naming itself).
    pub already: Vec<String>,
    /// No such identity.
    pub unknown: Vec<String>,
    /// Members now, owner included.
    pub members: u64,
}

/// Result of creating a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicCreated {
    /// Created, with these members.
    Created(InitialMembers),
    /// The drawn id exists already; draw another.
    IdTaken,
    /// The caller no longer exists.
    NoCaller,
    /// The members asked for would take the topic past its limit; nothing was created.
    Full,
}

/// The owner adds members.
#[derive(Debug)]
pub struct AddMembers {
    /// Topic id or legacy name, as addressed.
    pub topic: String,
    /// The caller.
    pub caller: String,
    /// Identities to add, without duplicates.
    pub ids: Vec<String>,
    /// Most members a topic may have.
    pub max_members: u64,
    /// Relay clock (ms).
    pub now: i64,
}

/// Result of adding members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddOutcome {
    /// No such topic, or the caller is not a member (deliberately one outcome).
    NotFound,
    /// The caller is a member but not the owner.
    NotOwner,
    /// The additions would take the topic past its limit; nothing was added.
    Full {
        /// Members now.
        members: u64,
    },
    /// Done.
    Added {
        /// The topic's id.
        topic: String,
        /// Newly added.
        added: Vec<String>,
        /// Already members (a no-op).
        already: Vec<String>,
        /// No such identity.
        unknown: Vec<String>,
        /// Members now.
        members: u64,
    },
}

/// Removal of a member (by the owner, or by the member itself).
#[derive(Debug)]
pub struct RemoveMember {
    /// Topic id or legacy name.
    pub topic: String,
    /// The caller.
    pub caller: String,
    /// The member to remove.
    pub member: String,
}

/// Result of removing a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoveOutcome {
    /// No such topic, or the caller is not a member.
    NotFound,
    /// A member tried to remove somebody else.
    NotOwner,
    /// The owner cannot be removed.
    OwnerStays,
    /// The target is not a member.
    NotMember,
    /// Removed from this topic id.
    Removed(String),
}

/// Deletion of a topic by its owner.
#[derive(Debug)]
pub struct DeleteTopic {
    /// Topic id or legacy name.
    pub topic: String,
    /// The caller.
    pub caller: String,
}

/// Result of deleting a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// No such topic, or the caller is not a member.
    NotFound,
    /// A member who is not the owner.
    NotOwner,
    /// Deleted this topic id.
    Deleted(String),
}

/// A new rendezvous with the caller as initiator.
#[derive(Debug)]
pub struct OpenRendezvous {
    /// SHA-256 of the freshly drawn token.
    pub token_hash: Vec<u8>,
    /// The caller.
    pub identity: String,
    /// Relay clock (ms).
    pub now: i64,
    /// When the token stops working (ms).
    pub expires_ms: i64,
}

/// Result of opening a rendezvous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// Opened.
    Opened,
    /// The drawn token exists already; draw another.
    TokenTaken,
    /// The caller no longer exists.
    NoCaller,
}

/// A claim under an existing token (or a re-poll by a claimant).
#[derive(Debug)]
pub struct JoinRendezvous {
    /// SHA-256 of the presented token.
    pub token_hash: Vec<u8>,
    /// The caller.
    pub identity: String,
    /// Relay clock (ms).
    pub now: i64,
}

/// Result of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinOutcome {
    /// No such (unexpired) rendezvous.
    Unknown,
    /// The caller holds this role (now or from before).
    Holds(Role),
    /// Another identity holds the responder role.
    RoleTaken,
}

/// Release of the caller's own claim.
#[derive(Debug)]
pub struct ReleaseRendezvous {
    /// SHA-256 of the presented token.
    pub token_hash: Vec<u8>,
    /// The caller.
    pub identity: String,
    /// Relay clock (ms).
    pub now: i64,
}

/// Result of a release: the role given up, or `None` if the caller held nothing there.
pub type Released = Option<Role>;

/// A rendezvous as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RendezvousRow {
    /// When the token stops working (ms).
    pub expires_ms: i64,
    /// Grows on each claim or release.
    pub version: i64,
    /// Current claims.
    pub claims: Vec<(Role, String)>,
}

/// The Stringcup part of a sweep.
#[derive(Debug)]
pub struct Sweep {
    /// Relay clock (ms).
    pub now: i64,
    /// Identities whose token was last used before this are reclaimed (ms).
    pub tokens_unused_since: i64,
    /// Idempotency keys created before this are forgotten (ms).
    pub idempotency_before: i64,
}

/// What a Stringcup sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScSweepReport {
    /// Identities reclaimed (their token expired); their inboxes went with them.
    pub identities: u64,
    /// Idempotency keys forgotten.
    pub idempotency_keys: u64,
    /// Rendezvous expired.
    pub rendezvous: u64,
}

/// Aggregate counts for the public statistics (raw; suppression happens at the route).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Identities registered.
    pub identities: u64,
    /// Topics.
    pub topics: u64,
    /// Messages waiting in inboxes.
    pub messages_pending: u64,
    /// Messages ever stored.
    pub messages_stored: u64,
}

/// The header version every stored message has (the column's default, both backends).
pub const STORED_HEADER_VERSION: i64 = 2;
/// The header algorithm every stored message has (the column's default, both backends).
pub const STORED_HEADER_ALGO: &str = "x25519+ecies+aes256gcm";

impl SendRequest {
    /// The inboxes to wake once `out` commits: each recipient a message was stored for, with
    /// its new inbox id and the message as a read of that inbox returns it, so a long-poll
    /// parked there answers without reading it back.
    pub(crate) fn wakeups_for(&self, out: &[SendOutcome]) -> Vec<(String, i64, Option<Committed>)> {
        self.messages
            .iter()
            .zip(out)
            .filter_map(|(message, outcome)| match outcome {
                SendOutcome::Stored { inbox_id, .. } => {
                    let stored = StoredMessage {
                        id: *inbox_id,
                        sender: self.sender.clone(),
                        header_version: STORED_HEADER_VERSION,
                        header_algo: STORED_HEADER_ALGO.to_owned(),
                        ephemeral_pub: message.ephemeral_pub.clone(),
                        iv: message.iv.clone(),
                        header_extra: message.header_extra.clone(),
                        ciphertext: message.ciphertext.clone(),
                        created_ms: self.now,
                    };
                    Some((inbox_key(&message.recipient), *inbox_id, Some(Committed::Stringcup(Arc::new(stored)))))
                }
                _ => None,
            })
            .collect()
    }

    /// Payload bytes, for the writer's per-batch byte cap.
    pub(crate) fn payload_bytes(&self) -> usize {
        self.messages.iter().map(NewMessage::size).sum()
    }
}

impl JoinRendezvous {
    /// The rendezvous version to announce once a claim (or a re-poll) commits.
    pub(crate) fn wakeup_for(&self, out: &(JoinOutcome, i64)) -> Option<(String, i64)> {
        match out {
            (JoinOutcome::Holds(_), version) => Some((rendezvous_key(&self.token_hash), *version)),
            _ => None,
        }
    }
}

impl ReleaseRendezvous {
    /// The rendezvous version to announce once a release commits.
    pub(crate) fn wakeup_for(&self, out: &(Released, i64)) -> Option<(String, i64)> {
        match out {
            (Some(_), version) => Some((rendezvous_key(&self.token_hash), *version)),
            (None, _) => None,
        }
    }
}

sync_request!(Register => bool, register);
sync_request!(Update => Option<Updated>, update);
sync_request!(Touch => (), touch, {
    fn settled(&self, out: Option<&()>, hub: &crate::hub::Hub) {
        match out {
            Some(()) => hub.stringcup_tokens().touched(&self.identity, self.now),
            None => hub.stringcup_tokens().forget(&self.identity),
        }
    }
});
sync_request!(Rotate => bool, rotate, {
    fn settled(&self, _: Option<&bool>, hub: &crate::hub::Hub) {
        hub.stringcup_tokens().forget(&self.identity);
    }
});
sync_request!(SendRequest => Vec<SendOutcome>, send, {
    fn bytes(&self) -> usize {
        self.payload_bytes()
    }

    fn more_wakeups(&self, out: &Vec<SendOutcome>) -> Vec<(String, i64, Option<Committed>)> {
        self.wakeups_for(out)
    }
});
sync_request!(Ack => AckOutcome, ack);
sync_request!(CreateTopic => TopicCreated, create_topic);
sync_request!(AddMembers => AddOutcome, add_members);
sync_request!(RemoveMember => RemoveOutcome, remove_member);
sync_request!(DeleteTopic => DeleteOutcome, delete_topic);
sync_request!(OpenRendezvous => Opened, open_rendezvous);
sync_request!(JoinRendezvous => (JoinOutcome, i64), join_rendezvous, {
    fn wakeup(&self, out: &(JoinOutcome, i64)) -> Option<(String, i64)> {
        self.wakeup_for(out)
    }
});
sync_request!(ReleaseRendezvous => (Released, i64), release_rendezvous, {
    fn wakeup(&self, out: &(Released, i64)) -> Option<(String, i64)> {
        self.wakeup_for(out)
    }
});
sync_request!(Sweep => ScSweepReport, sweep, {
    fn settled(&self, _: Option<&ScSweepReport>, hub: &crate::hub::Hub) {
        hub.stringcup_tokens().clear();
    }
});

/// A count from SQL (a negative one, impossible, reads as 0).
pub(crate) fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

// ---- writes -------------------------------------------------------------------------------

fn exists(db: &SyncDb, identity: &str) -> rusqlite::Result<bool> {
    db.prepare_cached("SELECT 1 FROM sc_identity WHERE id = ?")?.exists([identity])
}

fn register(db: &SyncDb, r: &Register, _: &Hub) -> rusqlite::Result<bool> {
    let inserted = db
        .prepare_cached(
            "INSERT INTO sc_identity (id, public_key, algo, display_name, token_hash, token_created_ms, \
             token_last_used_ms, key_updated_ms, updated_ms, created_ms) \
             VALUES (?1, ?2, 'x25519', ?3, ?4, ?5, ?5, ?5, ?5, ?5) ON CONFLICT DO NOTHING",
        )?
        .execute((&r.id, &r.public_key, &r.display_name, &r.token_hash, r.now))?;
    Ok(inserted == 1)
}

/// The [`IdentityRow`] of one identity, its columns in the fields' order: parameter (id).
const IDENTITY_ROW: &str =
    "SELECT id, public_key, algo, display_name, key_updated_ms, updated_ms, created_ms FROM sc_identity WHERE id = ?";

async fn identity_row(conn: impl SqliteExecutor<'_>, id: &str) -> Result<Option<IdentityRow>, sqlx::Error> {
    sqlx::query_as(IDENTITY_ROW).bind(id).fetch_optional(conn).await
}

fn identity_row_sync(db: &SyncDb, id: &str) -> rusqlite::Result<Option<IdentityRow>> {
    db.prepare_cached(IDENTITY_ROW)?
        .query_row([id], |r| {
            Ok(IdentityRow {
                id: r.get(0)?,
                public_key: r.get(1)?,
                algo: r.get(2)?,
                display_name: r.get(3)?,
                key_updated_ms: r.get(4)?,
                updated_ms: r.get(5)?,
                created_ms: r.get(6)?,
            })
        })
        .optional()
}

fn update(db: &SyncDb, u: &Update, _: &Hub) -> rusqlite::Result<Option<Updated>> {
    let Some(before) = identity_row_sync(db, &u.identity)? else {
        return Ok(None);
    };
    let key_changed = u.public_key.as_ref().is_some_and(|k| *k != before.public_key);
    let name_changed = u.display_name.as_ref().is_some_and(|n| *n != before.display_name);
    if key_changed || name_changed {
        db.prepare_cached(
            "UPDATE sc_identity SET public_key = ?, display_name = ?, updated_ms = ?, \
             key_updated_ms = CASE WHEN ? THEN ? ELSE key_updated_ms END WHERE id = ?",
        )?
        .execute((
            u.public_key.as_ref().unwrap_or(&before.public_key),
            u.display_name.as_ref().unwrap_or(&before.display_name),
            u.now,
            key_changed,
            u.now,
            &u.identity,
        ))?;
    }
    let row = identity_row_sync(db, &u.identity)?;
    Ok(row.map(|row| Updated { row, key_changed }))
}

fn touch(db: &SyncDb, t: &Touch, _: &Hub) -> rusqlite::Result<()> {
    db.prepare_cached("UPDATE sc_identity SET token_last_used_ms = max(token_last_used_ms, ?) WHERE id = ?")?
        .execute((t.now, &t.identity))?;
    Ok(())
}

fn rotate(db: &SyncDb, r: &Rotate, _: &Hub) -> rusqlite::Result<bool> {
    let changed = db
        .prepare_cached(
            "UPDATE sc_identity SET token_hash = ?, token_created_ms = ?, token_last_used_ms = ? \
             WHERE id = ? AND token_hash = ?",
        )?
        .execute((&r.new_hash, r.now, r.now, &r.identity, &r.old_hash))?;
    Ok(changed == 1)
}

/// What waits in one inbox, from the counters of migration 0008: the sender's share (messages,
/// bytes) and the whole inbox's (messages, bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(crate) sender_messages: u64,
    pub(crate) sender_bytes: u64,
    pub(crate) inbox_messages: u64,
    pub(crate) inbox_bytes: u64,
}

impl Pending {
    /// From the counter columns as stored.
    pub(crate) fn from_row((sender_messages, sender_bytes, inbox_messages, inbox_bytes): (i64, i64, i64, i64)) -> Self {
        Self {
            sender_messages: count(sender_messages),
            sender_bytes: count(sender_bytes),
            inbox_messages: count(inbox_messages),
            inbox_bytes: count(inbox_bytes),
        }
    }

    /// The first pending limit `size` more bytes would break; the sender's share is checked
    /// first because it is the binding limit and the one a sender can act on.
    pub(crate) fn over_limit(&self, size: u64, caps: PendingCaps) -> Option<PendingLimit> {
        if self.sender_messages >= caps.sender_messages {
            return Some(PendingLimit::SenderMessages(caps.sender_messages));
        }
        if self.sender_bytes.saturating_add(size) > caps.sender_bytes {
            return Some(PendingLimit::SenderBytes(caps.sender_bytes));
        }
        if self.inbox_messages >= caps.inbox_messages {
            return Some(PendingLimit::InboxMessages(caps.inbox_messages));
        }
        if self.inbox_bytes.saturating_add(size) > caps.inbox_bytes {
            return Some(PendingLimit::InboxBytes(caps.inbox_bytes));
        }
        None
    }
}

/// What waits in `recipient`'s inbox, from `sender` and in all (the counters of migration
/// 0008: two rows, whatever the backlog), or `None` if there is no such identity.
fn pending(db: &SyncDb, recipient: &str, sender: &str) -> rusqlite::Result<Option<Pending>> {
    let row = db
        .prepare_cached(
            "SELECT COALESCE(s.messages, 0), COALESCE(s.bytes, 0), i.pending_messages, i.pending_bytes \
             FROM sc_identity AS i LEFT JOIN sc_pending_share AS s ON s.recipient = i.id AND s.sender = ?2 \
             WHERE i.id = ?1",
        )?
        .query_row((recipient, sender), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    Ok(row.map(Pending::from_row))
}

fn store_one(db: &SyncDb, sender: &str, m: &NewMessage, caps: PendingCaps, now: i64) -> rusqlite::Result<SendOutcome> {
    let pending = pending(db, &m.recipient, sender)?;
    store_checked(db, sender, m, pending, caps, now)
}

/// Stores `m` given what waits in its recipient's inbox (`None`: no such recipient), read
/// earlier in the same transaction: one statement. The insert takes the recipient's next inbox
/// number and the sender's next sent number in the statement itself; its triggers advance both
/// (migrations 0008 and 0010; the sender's is also the lifetime count of what it stored,
/// migration 0011) and count the message in the inbox's pending counters.
fn store_checked(
    db: &SyncDb,
    sender: &str,
    m: &NewMessage,
    pending: Option<Pending>,
    caps: PendingCaps,
    now: i64,
) -> rusqlite::Result<SendOutcome> {
    let Some(pending) = pending else {
        return Ok(SendOutcome::NoRecipient);
    };
    let size = u64::try_from(m.size()).unwrap_or(u64::MAX);
    if let Some(limit) = pending.over_limit(size, caps) {
        return Ok(SendOutcome::Full(limit));
    }
    let (inbox_id, sent_seq): (i64, i64) = db
        .prepare_cached(
            "INSERT INTO sc_message (recipient, id, sender, sent_seq, ephemeral_pub, iv, header_extra, ciphertext, \
             size, created_ms) SELECT r.id, r.next_inbox_id, s.id, s.next_sent_seq, ?3, ?4, ?5, ?6, ?7, ?8 \
             FROM sc_identity AS r JOIN sc_identity AS s ON s.id = ?2 WHERE r.id = ?1 RETURNING id, sent_seq",
        )?
        .query_row(
            rusqlite::params![
                m.recipient,
                sender,
                m.ephemeral_pub,
                m.iv,
                m.header_extra,
                m.ciphertext,
                i64::try_from(size).unwrap_or(i64::MAX),
                now,
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
    Ok(SendOutcome::Stored { sent_seq, inbox_id })
}

/// The sent number `sender`'s next stored message takes (`None`: no such sender), and what waits
/// in `recipient`'s inbox (see [`pending`]), in one statement.
fn sender_and_pending(db: &SyncDb, sender: &str, recipient: &str) -> rusqlite::Result<(Option<i64>, Option<Pending>)> {
    let (next_sent_seq, recipient_exists, share_n, share_bytes, inbox_n, inbox_bytes): (
        Option<i64>,
        bool,
        i64,
        i64,
        i64,
        i64,
    ) = db
        .prepare_cached(
            "SELECT (SELECT next_sent_seq FROM sc_identity WHERE id = ?1), i.id IS NOT NULL, \
             COALESCE(s.messages, 0), COALESCE(s.bytes, 0), COALESCE(i.pending_messages, 0), \
             COALESCE(i.pending_bytes, 0) \
             FROM (SELECT 1) LEFT JOIN sc_identity AS i ON i.id = ?2 \
             LEFT JOIN sc_pending_share AS s ON s.recipient = i.id AND s.sender = ?1",
        )?
        .query_row((sender, recipient), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))?;
    let pending = recipient_exists.then(|| Pending::from_row((share_n, share_bytes, inbox_n, inbox_bytes)));
    Ok((next_sent_seq, pending))
}

/// A send, synchronously on the writer's connection (the relay's hottest Stringcup write, see
/// [`super::sync`]).
fn send(db: &SyncDb, s: &SendRequest, _: &Hub) -> rusqlite::Result<Vec<SendOutcome>> {
    let key = match (&s.idempotency_key, s.messages.as_slice()) {
        (Some(key), [message]) => Some((key, message)),
        _ => None,
    };
    if let Some((key, message)) = key {
        // The recipient's inbox is read before the reservation, in the statement that checks the
        // sender; nothing in between touches it (one writer, one transaction).
        let (next_sent_seq, pending) = sender_and_pending(db, &s.sender, &message.recipient)?;
        let Some(next_sent_seq) = next_sent_seq else {
            return Ok(vec![SendOutcome::NoSender]);
        };
        // The reservation: the primary key admits one row per (sender, key), so of any number
        // of concurrent retries exactly one gets past this line. A key past its lifetime is
        // taken over in the same statement (the upsert's `WHERE`); a live one is left alone. It
        // carries the sent number the message takes below (read in this transaction, which
        // nothing else writes), so a stored send needs no second write to the key's row.
        let reserved = db
            .prepare_cached(
                "INSERT INTO sc_idempotency (sender, key, recipient, sent_seq, created_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (sender, key) DO UPDATE SET recipient = excluded.recipient, \
                 sent_seq = excluded.sent_seq, created_ms = excluded.created_ms \
                 WHERE sc_idempotency.created_ms < ?6",
            )?
            .execute((&s.sender, key, &message.recipient, next_sent_seq, s.now, s.idempotency_expired_before))?;
        if reserved == 0 {
            let (recipient, sent_seq): (String, i64) = db
                .prepare_cached("SELECT recipient, sent_seq FROM sc_idempotency WHERE sender = ? AND key = ?")?
                .query_row((&s.sender, key), |r| Ok((r.get(0)?, r.get(1)?)))?;
            let outcome =
                if recipient == message.recipient { SendOutcome::Replay { sent_seq } } else { SendOutcome::KeyReused };
            return Ok(vec![outcome]);
        }
        let outcome = store_checked(db, &s.sender, message, pending, s.caps, s.now)?;
        match outcome {
            SendOutcome::Stored { sent_seq, .. } if sent_seq == next_sent_seq => {}
            SendOutcome::Stored { sent_seq, .. } => {
                // Impossible (one writer, one transaction); kept exact all the same.
                db.prepare_cached("UPDATE sc_idempotency SET sent_seq = ? WHERE sender = ? AND key = ?")?
                    .execute((sent_seq, &s.sender, key))?;
            }
            // Only a send that stored a message consumes its key.
            _ => {
                db.prepare_cached("DELETE FROM sc_idempotency WHERE sender = ? AND key = ?")?
                    .execute((&s.sender, key))?;
            }
        }
        return Ok(vec![outcome]);
    }
    if let [message] = s.messages.as_slice() {
        // One message (the common send): the sender's existence and the inbox in one statement.
        let (next_sent_seq, pending) = sender_and_pending(db, &s.sender, &message.recipient)?;
        if next_sent_seq.is_none() {
            return Ok(vec![SendOutcome::NoSender]);
        }
        return Ok(vec![store_checked(db, &s.sender, message, pending, s.caps, s.now)?]);
    }
    if !exists(db, &s.sender)? {
        return Ok(vec![SendOutcome::NoSender; s.messages.len()]);
    }
    let mut out = Vec::with_capacity(s.messages.len());
    for message in &s.messages {
        out.push(store_one(db, &s.sender, message, s.caps, s.now)?);
    }
    Ok(out)
}

fn ack(db: &SyncDb, a: &Ack, _: &Hub) -> rusqlite::Result<AckOutcome> {
    let mut out = AckOutcome::default();
    let mut delete = db.prepare_cached("DELETE FROM sc_message WHERE recipient = ? AND id = ?")?;
    for &id in &a.ids {
        if delete.execute((&a.identity, id))? > 0 { out.acknowledged.push(id) } else { out.not_found.push(id) }
    }
    Ok(out)
}

/// Whether `text` has the shape of an issued topic id (`tp-` + 24 base32 characters).
pub fn is_topic_id(text: &str) -> bool {
    text.strip_prefix("tp-").is_some_and(|rest| rest.len() == 24 && rest.bytes().all(is_base32_lower))
}

/// A lower-case RFC 4648 base32 character.
pub fn is_base32_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)
}

/// The topic a reference names, if the caller is a member: parameters (caller, by id, reference).
const TOPIC_FOR_MEMBER: &str = "SELECT t.id, t.owner, t.created_ms, \
     (SELECT COUNT(*) FROM sc_topic_member AS c WHERE c.topic = t.id) AS member_count \
     FROM sc_topic AS t JOIN sc_topic_member AS m ON m.topic = t.id AND m.member = ?1 \
     WHERE (?2 AND t.id = ?3) OR (NOT ?2 AND t.legacy_name <> '' AND t.legacy_name = ?3)";

/// The topic `reference` names (an issued id, or a legacy name) with its owner, if `caller` is
/// a member. Both forms go through this one query, so they reach the same checks.
async fn topic_for_member(
    conn: impl SqliteExecutor<'_>,
    reference: &str,
    caller: &str,
) -> Result<Option<TopicRow>, sqlx::Error> {
    sqlx::query_as(TOPIC_FOR_MEMBER)
        .bind(caller)
        .bind(is_topic_id(reference))
        .bind(reference)
        .fetch_optional(conn)
        .await
}

/// [`topic_for_member`] inside the writer's transaction.
fn topic_for_member_sync(db: &SyncDb, reference: &str, caller: &str) -> rusqlite::Result<Option<TopicRow>> {
    db.prepare_cached(TOPIC_FOR_MEMBER)?
        .query_row((caller, is_topic_id(reference), reference), |r| {
            Ok(TopicRow { id: r.get(0)?, owner: r.get(1)?, created_ms: r.get(2)?, member_count: r.get(3)? })
        })
        .optional()
}

fn create_topic(db: &SyncDb, c: &CreateTopic, _: &Hub) -> rusqlite::Result<TopicCreated> {
    if !exists(db, &c.owner)? {
        return Ok(TopicCreated::NoCaller);
    }
    let mut initial = InitialMembers::default();
    for id in &c.members {
        if *id == c.owner {
            initial.already.push(id.clone());
        } else if exists(db, id)? {
            initial.added.push(id.clone());
        } else {
            initial.unknown.push(id.clone());
        }
    }
    initial.members = u64::try_from(initial.added.len()).unwrap_or(u64::MAX).saturating_add(1);
    if !initial.added.is_empty() && initial.members > c.max_members {
        return Ok(TopicCreated::Full);
    }
    let inserted = db
        .prepare_cached("INSERT INTO sc_topic (id, owner, created_ms) VALUES (?, ?, ?) ON CONFLICT DO NOTHING")?
        .execute((&c.id, &c.owner, c.now))?;
    if inserted == 0 {
        return Ok(TopicCreated::IdTaken);
    }
    // The owner first: rosters list members in the order they joined.
    let mut add = db.prepare_cached("INSERT INTO sc_topic_member (topic, member, added_ms) VALUES (?, ?, ?)")?;
    for member in std::iter::once(&c.owner).chain(&initial.added) {
        add.execute((&c.id, member, c.now))?;
    }
    Ok(TopicCreated::Created(initial))
}

fn is_member(db: &SyncDb, topic: &str, identity: &str) -> rusqlite::Result<bool> {
    db.prepare_cached("SELECT 1 FROM sc_topic_member WHERE topic = ? AND member = ?")?.exists((topic, identity))
}

fn add_members(db: &SyncDb, a: &AddMembers, _: &Hub) -> rusqlite::Result<AddOutcome> {
    let Some(topic) = topic_for_member_sync(db, &a.topic, &a.caller)? else {
        return Ok(AddOutcome::NotFound);
    };
    if topic.owner != a.caller {
        return Ok(AddOutcome::NotOwner);
    }
    let (mut added, mut already, mut unknown) = (Vec::new(), Vec::new(), Vec::new());
    for id in &a.ids {
        if is_member(db, &topic.id, id)? {
            already.push(id.clone());
        } else if exists(db, id)? {
            added.push(id.clone());
        } else {
            unknown.push(id.clone());
        }
    }
    let members = count(topic.member_count);
    let after = members.saturating_add(u64::try_from(added.len()).unwrap_or(u64::MAX));
    if after > a.max_members {
        return Ok(AddOutcome::Full { members });
    }
    let mut add = db.prepare_cached("INSERT INTO sc_topic_member (topic, member, added_ms) VALUES (?, ?, ?)")?;
    for id in &added {
        add.execute((&topic.id, id, a.now))?;
    }
    Ok(AddOutcome::Added { topic: topic.id, added, already, unknown, members: after })
}

fn remove_member(db: &SyncDb, r: &RemoveMember, _: &Hub) -> rusqlite::Result<RemoveOutcome> {
    let Some(topic) = topic_for_member_sync(db, &r.topic, &r.caller)? else {
        return Ok(RemoveOutcome::NotFound);
    };
    if r.member != r.caller && topic.owner != r.caller {
        return Ok(RemoveOutcome::NotOwner);
    }
    if r.member == topic.owner {
        return Ok(RemoveOutcome::OwnerStays);
    }
    let removed = db
        .prepare_cached("DELETE FROM sc_topic_member WHERE topic = ? AND member = ?")?
        .execute((&topic.id, &r.member))?;
    Ok(if removed == 0 { RemoveOutcome::NotMember } else { RemoveOutcome::Removed(topic.id) })
}

fn delete_topic(db: &SyncDb, d: &DeleteTopic, _: &Hub) -> rusqlite::Result<DeleteOutcome> {
    let Some(topic) = topic_for_member_sync(db, &d.topic, &d.caller)? else {
        return Ok(DeleteOutcome::NotFound);
    };
    if topic.owner != d.caller {
        return Ok(DeleteOutcome::NotOwner);
    }
    db.prepare_cached("DELETE FROM sc_topic WHERE id = ?")?.execute([&topic.id])?;
    Ok(DeleteOutcome::Deleted(topic.id))
}

fn open_rendezvous(db: &SyncDb, o: &OpenRendezvous, _: &Hub) -> rusqlite::Result<Opened> {
    if !exists(db, &o.identity)? {
        return Ok(Opened::NoCaller);
    }
    let inserted = db
        .prepare_cached(
            "INSERT INTO sc_rendezvous (token_hash, created_ms, expires_ms, version) VALUES (?, ?, ?, 1) \
             ON CONFLICT DO NOTHING",
        )?
        .execute((&o.token_hash, o.now, o.expires_ms))?;
    if inserted == 0 {
        return Ok(Opened::TokenTaken);
    }
    db.prepare_cached("INSERT INTO sc_rendezvous_claim (token_hash, role, identity, claimed_ms) VALUES (?, ?, ?, ?)")?
        .execute((&o.token_hash, Role::Initiator.as_str(), &o.identity, o.now))?;
    Ok(Opened::Opened)
}

fn bump(db: &SyncDb, token_hash: &[u8]) -> rusqlite::Result<i64> {
    db.prepare_cached("UPDATE sc_rendezvous SET version = version + 1 WHERE token_hash = ? RETURNING version")?
        .query_row([token_hash], |r| r.get(0))
}

fn join_rendezvous(db: &SyncDb, j: &JoinRendezvous, _: &Hub) -> rusqlite::Result<(JoinOutcome, i64)> {
    let Some(row) = rendezvous_row_sync(db, &j.token_hash, j.now)? else {
        return Ok((JoinOutcome::Unknown, 0));
    };
    // 1. A claimant keeps its role (the initiator re-polls with its own token).
    if let Some((role, _)) = row.claims.iter().find(|(_, who)| *who == j.identity) {
        return Ok((JoinOutcome::Holds(*role), row.version));
    }
    // 2. Anybody else can only become the responder, once.
    if row.claims.iter().any(|(role, _)| *role == Role::Responder) {
        return Ok((JoinOutcome::RoleTaken, row.version));
    }
    if !exists(db, &j.identity)? {
        return Ok((JoinOutcome::Unknown, 0));
    }
    db.prepare_cached("INSERT INTO sc_rendezvous_claim (token_hash, role, identity, claimed_ms) VALUES (?, ?, ?, ?)")?
        .execute((&j.token_hash, Role::Responder.as_str(), &j.identity, j.now))?;
    let version = bump(db, &j.token_hash)?;
    Ok((JoinOutcome::Holds(Role::Responder), version))
}

fn release_rendezvous(db: &SyncDb, r: &ReleaseRendezvous, _: &Hub) -> rusqlite::Result<(Released, i64)> {
    let Some(row) = rendezvous_row_sync(db, &r.token_hash, r.now)? else {
        return Ok((None, 0));
    };
    let Some((role, _)) = row.claims.iter().find(|(_, who)| *who == r.identity) else {
        return Ok((None, row.version));
    };
    db.prepare_cached("DELETE FROM sc_rendezvous_claim WHERE token_hash = ? AND identity = ?")?
        .execute((&r.token_hash, &r.identity))?;
    let version = bump(db, &r.token_hash)?;
    if row.claims.len() == 1 {
        // Nobody is left: the meeting is over.
        db.prepare_cached("DELETE FROM sc_rendezvous WHERE token_hash = ?")?.execute([&r.token_hash])?;
    }
    Ok((Some(*role), version))
}

fn sweep(db: &SyncDb, s: &Sweep, _: &Hub) -> rusqlite::Result<ScSweepReport> {
    // Reclaiming an identity removes its inbox, memberships, owned topics and claims (cascade):
    // its token can no longer authenticate, so that mail is uncollectable (B.3.6). Mail it
    // sent to others stays.
    let identities = rows(
        db.prepare_cached("DELETE FROM sc_identity WHERE token_last_used_ms < ?")?.execute([s.tokens_unused_since])?,
    );
    let idempotency_keys =
        rows(db.prepare_cached("DELETE FROM sc_idempotency WHERE created_ms < ?")?.execute([s.idempotency_before])?);
    let rendezvous = rows(db.prepare_cached("DELETE FROM sc_rendezvous WHERE expires_ms <= ?")?.execute([s.now])?);
    Ok(ScSweepReport { identities, idempotency_keys, rendezvous })
}

// ---- reads --------------------------------------------------------------------------------

/// A rendezvous's head, if unexpired: parameters (token hash, now).
const RENDEZVOUS_HEAD: &str = "SELECT expires_ms, version FROM sc_rendezvous WHERE token_hash = ? AND expires_ms > ?";
/// A rendezvous's claims: parameter (token hash).
const RENDEZVOUS_CLAIMS: &str = "SELECT role, identity FROM sc_rendezvous_claim WHERE token_hash = ? ORDER BY role";

fn rendezvous_of(expires_ms: i64, version: i64, claims: Vec<(String, String)>) -> RendezvousRow {
    let claims = claims.into_iter().filter_map(|(role, who)| Role::parse(&role).map(|r| (r, who))).collect();
    RendezvousRow { expires_ms, version, claims }
}

async fn rendezvous_row(
    conn: &mut SqliteConnection,
    token_hash: &[u8],
    now: i64,
) -> Result<Option<RendezvousRow>, sqlx::Error> {
    let head: Option<(i64, i64)> =
        sqlx::query_as(RENDEZVOUS_HEAD).bind(token_hash).bind(now).fetch_optional(&mut *conn).await?;
    let Some((expires_ms, version)) = head else {
        return Ok(None);
    };
    let claims = sqlx::query_as(RENDEZVOUS_CLAIMS).bind(token_hash).fetch_all(&mut *conn).await?;
    Ok(Some(rendezvous_of(expires_ms, version, claims)))
}

/// [`rendezvous_row`] inside the writer's transaction.
fn rendezvous_row_sync(db: &SyncDb, token_hash: &[u8], now: i64) -> rusqlite::Result<Option<RendezvousRow>> {
    let head: Option<(i64, i64)> =
        db.prepare_cached(RENDEZVOUS_HEAD)?.query_row((token_hash, now), |r| Ok((r.get(0)?, r.get(1)?))).optional()?;
    let Some((expires_ms, version)) = head else {
        return Ok(None);
    };
    let claims = db
        .prepare_cached(RENDEZVOUS_CLAIMS)?
        .query_map([token_hash], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Some(rendezvous_of(expires_ms, version, claims)))
}

/// Stringcup v2 storage: identities and tokens, inboxes, idempotency keys, topics, rendezvous.
/// Writes are decided inside the writer's transaction and answered after the commit.
#[async_trait]
pub trait StringcupStore: Send + Sync {
    /// Creates an identity; `false` if its id or token hash is taken (draw again).
    async fn register(&self, req: Register) -> Result<bool, StoreError>;

    /// Changes the caller's key and/or label; `None` if the identity is gone.
    async fn update(&self, req: Update) -> Result<Option<Updated>, StoreError>;

    /// Records a use of the caller's token.
    async fn touch(&self, identity: &str, now: i64) -> Result<(), StoreError>;

    /// Replaces the presented token; `false` if it is no longer current.
    async fn rotate(&self, req: Rotate) -> Result<bool, StoreError>;

    /// Stores each message on its own; one outcome per message, in order.
    async fn send(&self, req: SendRequest) -> Result<Vec<SendOutcome>, StoreError>;

    /// Deletes messages from the caller's own inbox.
    async fn ack(&self, identity: &str, ids: Vec<i64>) -> Result<AckOutcome, StoreError>;

    /// Creates a topic owned by the caller, with its initial members.
    async fn create_topic(&self, req: CreateTopic) -> Result<TopicCreated, StoreError>;

    /// Adds members (owner only).
    async fn add_members(&self, req: AddMembers) -> Result<AddOutcome, StoreError>;

    /// Removes a member (owner, or self).
    async fn remove_member(&self, req: RemoveMember) -> Result<RemoveOutcome, StoreError>;

    /// Deletes a topic (owner only).
    async fn delete_topic(&self, req: DeleteTopic) -> Result<DeleteOutcome, StoreError>;

    /// Opens a rendezvous with the caller as initiator.
    async fn open_rendezvous(&self, req: OpenRendezvous) -> Result<Opened, StoreError>;

    /// Claims a role under a token (or confirms the caller's existing one); with the version.
    async fn join_rendezvous(&self, req: JoinRendezvous) -> Result<(JoinOutcome, i64), StoreError>;

    /// Releases the caller's own claim.
    async fn release_rendezvous(&self, req: ReleaseRendezvous) -> Result<Released, StoreError>;

    /// Reclaims identities with expired tokens, forgets old idempotency keys and expired
    /// rendezvous.
    async fn sweep(&self, req: Sweep) -> Result<ScSweepReport, StoreError>;

    /// The identity holding the token with this hash.
    async fn by_token(&self, token_hash: &[u8]) -> Result<Option<TokenRow>, StoreError>;

    /// An identity by exact id.
    async fn identity(&self, id: &str) -> Result<Option<IdentityRow>, StoreError>;

    /// Up to `limit` messages of `recipient`'s inbox with id above `since`, oldest first.
    async fn inbox(&self, recipient: &str, since: i64, limit: usize) -> Result<Vec<StoredMessage>, StoreError>;

    /// The newest inbox id ever given out in `recipient`'s inbox (0 for none, or no such
    /// identity): a long-poll that found nothing above its cursor parks knowing that the next
    /// message takes the id after this one.
    async fn newest_inbox_id(&self, recipient: &str) -> Result<i64, StoreError>;

    /// The topics `identity` belongs to, oldest first.
    async fn topics_of(&self, identity: &str) -> Result<Vec<TopicRow>, StoreError>;

    /// The topic `reference` names, if `caller` is a member.
    async fn topic_for_member(&self, reference: &str, caller: &str) -> Result<Option<TopicRow>, StoreError>;

    /// A topic's members with their keys, in the order they joined.
    async fn roster(&self, topic: &str) -> Result<Vec<IdentityRow>, StoreError>;

    /// An unexpired rendezvous with its claims.
    async fn rendezvous(&self, token_hash: &[u8], now: i64) -> Result<Option<RendezvousRow>, StoreError>;

    /// Raw aggregate counts for the public statistics.
    async fn counts(&self) -> Result<Counts, StoreError>;
}

impl Store {
    /// Stringcup v2 storage.
    pub fn stringcup(&self) -> &dyn StringcupStore {
        &*self.stringcup
    }
}

#[async_trait]
impl StringcupStore for SqliteStore {
    async fn register(&self, req: Register) -> Result<bool, StoreError> {
        self.submit(req).await
    }

    async fn update(&self, req: Update) -> Result<Option<Updated>, StoreError> {
        self.submit(req).await
    }

    async fn touch(&self, identity: &str, now: i64) -> Result<(), StoreError> {
        self.submit(Touch { identity: identity.to_owned(), now }).await
    }

    async fn rotate(&self, req: Rotate) -> Result<bool, StoreError> {
        self.submit(req).await
    }

    async fn send(&self, req: SendRequest) -> Result<Vec<SendOutcome>, StoreError> {
        self.submit(req).await
    }

    async fn ack(&self, identity: &str, ids: Vec<i64>) -> Result<AckOutcome, StoreError> {
        self.submit(Ack { identity: identity.to_owned(), ids }).await
    }

    async fn create_topic(&self, req: CreateTopic) -> Result<TopicCreated, StoreError> {
        self.submit(req).await
    }

    async fn add_members(&self, req: AddMembers) -> Result<AddOutcome, StoreError> {
        self.submit(req).await
    }

    async fn remove_member(&self, req: RemoveMember) -> Result<RemoveOutcome, StoreError> {
        self.submit(req).await
    }

    async fn delete_topic(&self, req: DeleteTopic) -> Result<DeleteOutcome, StoreError> {
        self.submit(req).await
    }

    async fn open_rendezvous(&self, req: OpenRendezvous) -> Result<Opened, StoreError> {
        self.submit(req).await
    }

    async fn join_rendezvous(&self, req: JoinRendezvous) -> Result<(JoinOutcome, i64), StoreError> {
        self.submit(req).await
    }

    async fn release_rendezvous(&self, req: ReleaseRendezvous) -> Result<Released, StoreError> {
        Ok(self.submit(req).await?.0)
    }

    async fn sweep(&self, req: Sweep) -> Result<ScSweepReport, StoreError> {
        self.submit(req).await
    }

    async fn by_token(&self, token_hash: &[u8]) -> Result<Option<TokenRow>, StoreError> {
        let cache = self.hub.stringcup_tokens();
        let generation = match cache.get(token_hash) {
            Ok(row) => return Ok(Some(row)),
            Err(generation) => generation,
        };
        let row: Option<TokenRow> = sqlx::query_as(
            "SELECT id AS identity, token_created_ms, token_last_used_ms FROM sc_identity WHERE token_hash = ?",
        )
        .bind(token_hash)
        .fetch_optional(&self.read)
        .await?;
        if let Some(row) = &row {
            cache.fill(token_hash, row, generation);
        }
        Ok(row)
    }

    async fn identity(&self, id: &str) -> Result<Option<IdentityRow>, StoreError> {
        Ok(identity_row(&self.read, id).await?)
    }

    async fn inbox(&self, recipient: &str, since: i64, limit: usize) -> Result<Vec<StoredMessage>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT id, sender, header_version, header_algo, ephemeral_pub, iv, header_extra, ciphertext, created_ms \
             FROM sc_message WHERE recipient = ? AND id > ? ORDER BY id LIMIT ?",
        )
        .bind(recipient)
        .bind(since)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.read)
        .await?)
    }

    async fn newest_inbox_id(&self, recipient: &str) -> Result<i64, StoreError> {
        let next: Option<i64> = sqlx::query_scalar("SELECT next_inbox_id FROM sc_identity WHERE id = ?")
            .bind(recipient)
            .fetch_optional(&self.read)
            .await?;
        Ok(next.map_or(0, |n| n - 1))
    }

    async fn topics_of(&self, identity: &str) -> Result<Vec<TopicRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT t.id, t.owner, t.created_ms, \
             (SELECT COUNT(*) FROM sc_topic_member AS c WHERE c.topic = t.id) AS member_count \
             FROM sc_topic AS t JOIN sc_topic_member AS m ON m.topic = t.id \
             WHERE m.member = ? ORDER BY t.rowid",
        )
        .bind(identity)
        .fetch_all(&self.read)
        .await?)
    }

    async fn topic_for_member(&self, reference: &str, caller: &str) -> Result<Option<TopicRow>, StoreError> {
        Ok(topic_for_member(&self.read, reference, caller).await?)
    }

    async fn roster(&self, topic: &str) -> Result<Vec<IdentityRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT i.id, i.public_key, i.algo, i.display_name, i.key_updated_ms, i.updated_ms, i.created_ms \
             FROM sc_topic_member AS m JOIN sc_identity AS i ON i.id = m.member \
             WHERE m.topic = ? ORDER BY m.rowid",
        )
        .bind(topic)
        .fetch_all(&self.read)
        .await?)
    }

    async fn rendezvous(&self, token_hash: &[u8], now: i64) -> Result<Option<RendezvousRow>, StoreError> {
        let mut conn = self.read.acquire().await?;
        Ok(rendezvous_row(&mut conn, token_hash, now).await?)
    }

    async fn counts(&self) -> Result<Counts, StoreError> {
        let (identities, topics, pending, stored): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM sc_identity), (SELECT COUNT(*) FROM sc_topic), \
             (SELECT COUNT(*) FROM sc_message), \
             (SELECT COALESCE(SUM(next_sent_seq - 1), 0) FROM sc_identity) + \
             (SELECT COALESCE(MAX(value), 0) FROM sc_counter WHERE name = 'messages_stored_by_reclaimed')",
        )
        .fetch_one(&self.read)
        .await?;
        Ok(Counts::from_raw(identities, topics, pending, stored))
    }
}

impl Counts {
    /// Counts from the raw SQL figures (negative ones, impossible, read as 0).
    pub(crate) fn from_raw(identities: i64, topics: i64, pending: i64, stored: i64) -> Self {
        Self {
            identities: count(identities),
            topics: count(topics),
            messages_pending: count(pending),
            messages_stored: count(stored),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::hub::Hub;

    fn token_row(identity: &str, last_used: i64) -> TokenRow {
        TokenRow { identity: identity.into(), token_created_ms: 1, token_last_used_ms: last_used }
    }

    #[test]
    fn a_token_row_read_before_a_change_settled_is_not_cached_after_it() {
        let cache = TokenCache::default();
        let missed = cache.get(b"h").unwrap_err();
        // A touch settles while the lookup that missed is still reading the old row.
        cache.touched("sc-a", 5);
        cache.fill(b"h", &token_row("sc-a", 1), missed);
        assert!(cache.get(b"h").is_err(), "the row read before the touch was dropped");
        let missed = cache.get(b"h").unwrap_err();
        cache.fill(b"h", &token_row("sc-a", 5), missed);
        assert_eq!(cache.get(b"h").unwrap().token_last_used_ms, 5);
        // A touch moves the cached use forward only, as its UPDATE does.
        cache.touched("sc-a", 9);
        cache.touched("sc-a", 7);
        assert_eq!(cache.get(b"h").unwrap().token_last_used_ms, 9);
        // A rotation forgets the identity's token; so does a failed touch.
        cache.forget("sc-a");
        assert!(cache.get(b"h").is_err());
        // One token per identity: a fill under a new hash drops the old one.
        let missed = cache.get(b"h").unwrap_err();
        cache.fill(b"h", &token_row("sc-a", 9), missed);
        let missed = cache.get(b"h2").unwrap_err();
        cache.fill(b"h2", &token_row("sc-a", 10), missed);
        assert!(cache.get(b"h").is_err());
        assert_eq!(cache.get(b"h2").unwrap().identity, "sc-a");
        // A sweep forgets everything.
        cache.clear();
        assert!(cache.get(b"h2").is_err());
    }

    #[test]
    fn the_token_cache_stays_within_its_bound() {
        let cache = TokenCache::default();
        for i in 0..=TOKEN_CACHE_ENTRIES {
            let hash = i.to_be_bytes();
            let missed = cache.get(&hash).unwrap_err();
            cache.fill(&hash, &token_row(&format!("sc-{i}"), 1), missed);
        }
        let inner = cache.lock();
        assert!(inner.rows.len() <= TOKEN_CACHE_ENTRIES && inner.hash_of.len() == inner.rows.len());
        assert!(inner.rows.contains_key(&TOKEN_CACHE_ENTRIES.to_be_bytes()[..]), "the newest is kept");
    }

    async fn identity(store: &Store, id: &str) {
        let req = Register {
            id: id.into(),
            public_key: vec![1; 32],
            display_name: String::new(),
            token_hash: id.as_bytes().to_vec(),
            now: 1,
        };
        assert!(store.stringcup().register(req).await.unwrap());
    }

    fn one(sender: &str, recipient: &str, key: &str) -> SendRequest {
        SendRequest {
            sender: sender.into(),
            idempotency_key: Some(key.into()),
            idempotency_expired_before: 0,
            messages: vec![NewMessage {
                recipient: recipient.into(),
                ephemeral_pub: vec![2; 32],
                iv: vec![3; 12],
                header_extra: String::new(),
                ciphertext: vec![4; 16],
            }],
            caps: PendingCaps {
                inbox_messages: 100,
                inbox_bytes: 1 << 20,
                sender_messages: 100,
                sender_bytes: 1 << 20,
            },
            now: 2,
        }
    }

    #[tokio::test]
    async fn the_unique_constraint_lets_exactly_one_of_many_concurrent_sends_with_a_key_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), Arc::new(Hub::default())).await.unwrap());
        identity(&store, "a").await;
        identity(&store, "b").await;
        let sends = (0..50).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.stringcup().send(one("a", "b", "k")).await.unwrap() })
        });
        let mut stored = 0;
        for send in sends.collect::<Vec<_>>() {
            match send.await.unwrap().as_slice() {
                [SendOutcome::Stored { sent_seq: 1, inbox_id: 1 }] => stored += 1,
                [SendOutcome::Replay { sent_seq: 1 }] => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(stored, 1);
        assert_eq!(store.stringcup().inbox("b", 0, 100).await.unwrap().len(), 1);
        store.close().await;
    }
}
