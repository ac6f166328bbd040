//! The relay's view (relay-lite serves it): what clients send (`...In`, decoded but not yet
//! validated; strict where the seed says to refuse) and what the relay answers (`...Out`, every
//! field the seed names). Field names are the seed's; fields the seed does not name are listed
//! in relay-lite's README.

use serde::{Deserialize, Serialize};

// ---- client to relay ----------------------------------------------------------------------

/// `POST /api/v2/identities`.
#[derive(Debug, Deserialize)]
pub struct RegisterIn {
    /// Base64 of the 32-byte X25519 key.
    pub identity_public_key: String,
    /// `x25519` if given.
    #[serde(default)]
    pub algo: Option<String>,
    /// Optional label.
    #[serde(default)]
    pub display_name: Option<String>,
}

/// `PUT /api/v2/identities`.
#[derive(Debug, Deserialize)]
pub struct UpdateIn {
    /// A new key, if given.
    #[serde(default)]
    pub identity_public_key: Option<String>,
    /// `x25519` if given.
    #[serde(default)]
    pub algo: Option<String>,
    /// A new label; absent keeps it, `null` clears it (hence a raw value).
    #[serde(default, deserialize_with = "present")]
    pub display_name: Option<serde_json::Value>,
}

/// `Some` for any value that is present, `null` included (serde maps `null` to `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

/// A message header, as sent.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct HeaderIn {
    /// Must be 2.
    pub version: i64,
    /// Must be `x25519+ecies+aes256gcm`.
    pub algo: String,
    /// Base64 of 32 bytes.
    pub ephemeral_pub: String,
    /// Base64 of 12 bytes.
    pub iv: String,
    /// Any other fields (the reference client's pairing `purpose` and `tag`): carried to the
    /// recipient unchanged, within bounds checked by the route (strings only, a few small ones).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// One message, in `POST /api/v2/messages` or a batch entry. Unknown top-level fields are
/// refused: the relay would otherwise drop them silently on the way to the recipient (extra
/// *header* fields are carried instead).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageIn {
    /// `sc-...`.
    pub recipient_id: String,
    /// The sender, as the reference client states it; optional, and when present it must be
    /// the identity the bearer token belongs to (`403` otherwise). The stored sender is always
    /// the token's identity.
    #[serde(default)]
    pub sender_id: Option<String>,
    /// Header.
    pub header: HeaderIn,
    /// Base64 ciphertext with its 16-byte GCM tag.
    pub ciphertext: String,
}

/// `POST /api/v2/messages/batch`; entries are parsed one by one so one bad entry fails alone.
#[derive(Debug, Deserialize)]
pub struct BatchIn {
    /// Up to 200 entries.
    pub messages: Vec<serde_json::Value>,
}

/// `POST /api/v2/messages/ack`.
#[derive(Debug, Deserialize)]
pub struct AckIn {
    /// Up to 200 of the caller's own message ids.
    pub ids: Vec<i64>,
}

/// `POST /api/v2/topics/{topic}/members` (`ids` is accepted as an alias).
#[derive(Debug, Deserialize)]
pub struct MembersIn {
    /// Identities to add, up to 100.
    #[serde(alias = "ids")]
    pub members: Vec<String>,
}

/// `POST /api/v2/rendezvous` and `DELETE /api/v2/rendezvous`.
#[derive(Debug, Deserialize)]
pub struct RendezvousIn {
    /// An issued token to join; absent opens a new rendezvous.
    #[serde(default)]
    pub token: Option<String>,
    /// Seconds to park until paired (0 to 25, clamped).
    #[serde(default)]
    pub wait: Option<serde_json::Value>,
}

// ---- relay to client ----------------------------------------------------------------------

/// An identity as anyone may look it up (B.1.3, B.7).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdentityOut {
    /// `sc-...`.
    pub id: String,
    /// Standard base64 of the raw key.
    pub identity_public_key: String,
    /// `x25519`.
    pub algo: String,
    /// The owner's label, if any.
    pub display_name: Option<String>,
    /// `sha256:` + unpadded base64url of SHA-256(key).
    pub fingerprint: String,
    /// First 16 hex digits of the same digest, in fours.
    pub fingerprint_short: String,
    /// When the key last changed.
    pub key_updated_at: String,
    /// Registration time.
    pub created_at: String,
}

/// `201` to a registration.
#[derive(Debug, Serialize, Deserialize)]
pub struct Registered {
    /// The public record.
    #[serde(flatten)]
    pub identity: IdentityOut,
    /// Always `true`: the relay chose the id.
    pub id_assigned: bool,
    /// The bearer token, shown this once.
    pub api_token: String,
}

/// `200` to `PUT /api/v2/identities`.
#[derive(Debug, Serialize, Deserialize)]
pub struct UpdatedOut {
    /// The record now.
    #[serde(flatten)]
    pub identity: IdentityOut,
    /// Whether the key itself changed (only then did `key_updated_at` move).
    pub key_changed: bool,
    /// When anything last changed.
    pub updated_at: String,
}

/// `GET /api/v2/tokens/current`.
#[derive(Debug, Serialize, Deserialize)]
pub struct TokenOut {
    /// Whose token.
    pub identity_id: String,
    /// When this token was issued.
    pub created_at: String,
    /// When it was last used, as the relay counts it (this request included, to the minute).
    pub last_used_at: String,
    /// When it stops working unless used again.
    pub expires_at: String,
    /// Seconds until then.
    pub expires_in_seconds: i64,
    /// The inactivity limit in whole days.
    pub inactivity_ttl_days: i64,
    /// The inactivity limit in seconds.
    pub inactivity_ttl_seconds: i64,
}

/// `POST /api/v2/tokens/rotate`.
#[derive(Debug, Serialize, Deserialize)]
pub struct RotatedOut {
    /// Whose token.
    pub identity_id: String,
    /// The new token, shown this once.
    pub api_token: String,
    /// Now.
    pub created_at: String,
    /// When it stops working unless used.
    pub expires_at: String,
    /// Always `revoked`.
    pub previous_token: String,
}

/// `201` / `200` to a send.
#[derive(Debug, Serialize, Deserialize)]
pub struct SentOut {
    /// The sender's own number for this message.
    pub sent_seq: i64,
    /// Always `stored`.
    pub status: String,
    /// `true` on a replay of a completed send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_replay: Option<bool>,
}

/// A stored batch entry.
#[derive(Debug, Serialize, Deserialize)]
pub struct BatchSent {
    /// Position in the request.
    pub index: usize,
    /// Its recipient.
    pub recipient_id: String,
    /// The sender's number.
    pub sent_seq: i64,
}

/// A refused batch entry.
#[derive(Debug, Serialize, Deserialize)]
pub struct BatchFailed {
    /// Position in the request.
    pub index: usize,
    /// Its recipient, if the entry named one.
    pub recipient_id: Option<String>,
    /// Why, in words.
    pub error: String,
    /// Why, as the code the single send would have answered.
    pub code: String,
    /// The status the single send would have answered.
    pub status: u16,
}

/// `200` to a batch.
#[derive(Debug, Serialize, Deserialize)]
pub struct BatchOut {
    /// Always `processed`.
    pub status: String,
    /// Stored entries.
    pub sent: Vec<BatchSent>,
    /// Refused entries.
    pub failed: Vec<BatchFailed>,
    /// Length of `sent`.
    pub count: usize,
}

/// A header, as delivered.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HeaderOut {
    /// 2.
    pub version: i64,
    /// `x25519+ecies+aes256gcm`.
    pub algo: String,
    /// Standard base64.
    pub ephemeral_pub: String,
    /// Standard base64.
    pub iv: String,
    /// The sender's extra header fields, exactly as sent.
    #[serde(flatten)]
    pub extra: std::collections::BTreeMap<String, String>,
}

/// A message in an inbox page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MessageOut {
    /// The recipient's own number: the ACK handle and cursor.
    pub id: i64,
    /// Who sent it (as authenticated by its token).
    pub sender_id: String,
    /// The caller.
    pub recipient_id: String,
    /// Header.
    pub header: HeaderOut,
    /// Standard base64.
    pub ciphertext: String,
    /// When it was stored.
    pub created_at: String,
}

/// `GET /api/v2/messages`.
#[derive(Debug, Serialize, Deserialize)]
pub struct InboxOut {
    /// Oldest first.
    pub messages: Vec<MessageOut>,
    /// Length of `messages`.
    pub count: usize,
    /// More messages remain past this page.
    pub has_more: bool,
    /// The cursor for the next poll.
    pub next_since_id: Option<i64>,
}

/// `POST /api/v2/messages/ack`.
#[derive(Debug, Serialize, Deserialize)]
pub struct AckOut {
    /// Always `acknowledged`.
    pub status: String,
    /// Deleted by this call.
    pub acknowledged: Vec<i64>,
    /// Not in the caller's inbox.
    pub not_found: Vec<i64>,
    /// Length of `acknowledged`.
    pub count: usize,
}

/// `DELETE /api/v2/messages/{id}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeletedOut {
    /// Always `acknowledged`.
    pub status: String,
    /// The id.
    pub message_id: i64,
}

/// `POST /api/v2/topics` (optional; `ids` is accepted as an alias). `name` is refused before
/// this is parsed.
#[derive(Debug, Deserialize)]
pub struct CreateTopicIn {
    /// Identities to add with the owner, up to 100.
    #[serde(default, alias = "ids")]
    pub members: Option<Vec<String>>,
}

/// A topic in the caller's list.
#[derive(Debug, Serialize, Deserialize)]
pub struct TopicOut {
    /// `tp-...`.
    pub id: String,
    /// Its owner.
    pub owner_id: String,
    /// `owner` or `member`: the caller's place in it.
    pub role: String,
    /// Whether the caller owns it (the reference client reads this).
    pub is_owner: bool,
    /// Members, owner included.
    pub member_count: i64,
    /// Creation time.
    pub created_at: String,
}

/// `201` to `POST /api/v2/topics`: the topic, and what became of the members asked for.
#[derive(Debug, Serialize, Deserialize)]
pub struct TopicCreatedOut {
    /// The topic, as listed.
    #[serde(flatten)]
    pub topic: TopicOut,
    /// Added along with the owner.
    pub added: Vec<String>,
    /// Already a member (the owner naming itself).
    pub already_member: Vec<String>,
    /// No such identity (malformed ids included).
    pub unknown: Vec<String>,
}

/// A member in a roster.
#[derive(Debug, Serialize, Deserialize)]
pub struct MemberOut {
    /// The member's public record.
    #[serde(flatten)]
    pub identity: IdentityOut,
    /// `owner` or `member`.
    pub role: String,
}

/// `GET /api/v2/topics/{topic}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct RosterOut {
    /// `tp-...`.
    pub id: String,
    /// Its owner.
    pub owner_id: String,
    /// Creation time.
    pub created_at: String,
    /// Members in the order they joined.
    pub members: Vec<MemberOut>,
    /// Length of `members`.
    pub count: usize,
}

/// `GET /api/v2/topics`.
#[derive(Debug, Serialize, Deserialize)]
pub struct TopicsOut {
    /// Oldest first.
    pub topics: Vec<TopicOut>,
    /// Length of `topics`.
    pub count: usize,
}

/// `POST /api/v2/topics/{topic}/members`.
#[derive(Debug, Serialize, Deserialize)]
pub struct MembersOut {
    /// The topic.
    pub topic_id: String,
    /// Newly added.
    pub added: Vec<String>,
    /// Already members (no-op).
    pub already_member: Vec<String>,
    /// No such identity.
    pub unknown: Vec<String>,
    /// Members now.
    pub member_count: u64,
}

/// `DELETE /api/v2/topics/{topic}/members/{id}` and `DELETE /api/v2/topics/{topic}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct TopicChangeOut {
    /// `removed` or `deleted`.
    pub status: String,
    /// The topic.
    pub topic_id: String,
    /// The removed member, for a removal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_id: Option<String>,
}

/// `POST /api/v2/rendezvous`.
#[derive(Debug, Serialize, Deserialize)]
pub struct RendezvousOut {
    /// `waiting` or `paired`.
    pub status: String,
    /// The issued token; only in the answer that opens the rendezvous.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The caller's derived role.
    pub role: String,
    /// The caller.
    pub my_id: String,
    /// The counterpart, once it has claimed.
    pub peer_id: Option<String>,
    /// The counterpart's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_identity_public_key: Option<String>,
    /// Its fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_fingerprint: Option<String>,
    /// Its short fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_fingerprint_short: Option<String>,
    /// When the token stops working.
    pub expires_at: String,
}

/// `DELETE /api/v2/rendezvous`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReleasedOut {
    /// Always `released`.
    pub status: String,
    /// The role given up.
    pub role: String,
}

/// Hourly budgets, as advertised.
#[derive(Debug, Serialize, Deserialize)]
pub struct RateLimits {
    /// Send requests per identity (a batch counts once).
    pub send_per_hour: u32,
    /// Inbox requests per identity.
    pub inbox_per_hour: u32,
    /// Other authenticated requests per identity.
    pub other_per_hour: u32,
    /// Registrations per client address.
    pub registrations_per_hour_per_ip: u32,
}

/// `GET /api/v2`: what this relay enforces (B.3.6 names the first five fields).
#[derive(Debug, Serialize, Deserialize)]
pub struct Info {
    /// `stringcup`.
    pub protocol: String,
    /// 2.
    pub version: u32,
    /// The header algorithm.
    pub algo: String,
    /// Largest ciphertext (decoded bytes).
    pub message_max_bytes: usize,
    /// Pending messages per inbox.
    pub inbox_max_pending_messages: u64,
    /// Pending bytes per inbox.
    pub inbox_max_pending_bytes: u64,
    /// Pending messages per sender per inbox.
    pub inbox_max_pending_per_sender: u64,
    /// Pending bytes per sender per inbox.
    pub inbox_max_pending_bytes_per_sender: u64,
    /// Entries per batch.
    pub batch_max_messages: usize,
    /// Largest batch body.
    pub batch_max_body_bytes: usize,
    /// Ids per ack.
    pub ack_max_ids: usize,
    /// Largest inbox page.
    pub inbox_page_max: usize,
    /// Inbox page without `limit`.
    pub inbox_page_default: usize,
    /// Longest `wait`.
    pub long_poll_max_wait_seconds: u64,
    /// Hourly budgets.
    pub rate_limits: RateLimits,
    /// Token inactivity limit.
    pub token_inactivity_ttl_seconds: i64,
    /// How long an `Idempotency-Key` is remembered.
    pub idempotency_key_ttl_seconds: i64,
    /// How long a rendezvous token lives.
    pub rendezvous_ttl_seconds: i64,
    /// Members per topic.
    pub topic_max_members: usize,
    /// Members added per call.
    pub topic_max_add_per_call: usize,
}

/// `GET /api/v2/stats`: coarse counts, `null` when below `suppressed_below`; no timeline.
#[derive(Debug, Serialize, Deserialize)]
pub struct Stats {
    /// Identities registered.
    pub identities: Option<u64>,
    /// Topics.
    pub topics: Option<u64>,
    /// Messages waiting for acknowledgement.
    pub messages_pending: Option<u64>,
    /// Messages ever stored.
    pub messages_stored_total: Option<u64>,
    /// Counts below this are published as `null`.
    pub suppressed_below: u64,
    /// Published counts are rounded down to a multiple of this.
    pub rounded_down_to_multiple_of: u64,
    /// The snapshot is recomputed at most this often.
    pub refreshed_at_most_every_seconds: i64,
}
