//! The client's view: what it sends, and what it reads from a relay. Types read from the relay
//! end in `In` (decoded, not yet trusted: keys in them are checked against local pins before
//! use); they name only the fields the client uses, so a relay that adds fields still works.

use serde::{Deserialize, Serialize};

use crate::protocol::stringcup::crypto::Header;

/// `POST /api/v2/identities` body.
#[derive(Debug, Clone, Serialize)]
pub struct Register<'a> {
    /// Base64 X25519 public key.
    pub identity_public_key: &'a str,
    /// Always `x25519`.
    pub algo: &'a str,
    /// Optional label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<&'a str>,
}

/// `201` to a registration.
#[derive(Debug, Clone, Deserialize)]
pub struct RegisteredIn {
    /// The assigned `sc-` id.
    pub id: String,
    /// The bearer token, shown once.
    pub api_token: String,
}

/// A public identity record.
#[derive(Debug, Clone, Deserialize)]
pub struct IdentityIn {
    /// `sc-` id.
    pub id: String,
    /// Base64 X25519 key.
    pub identity_public_key: String,
    /// Optional label.
    #[serde(default)]
    pub display_name: Option<String>,
}

/// One message to send (`POST /api/v2/messages` body, or a batch entry).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outgoing {
    /// Recipient `sc-` id.
    pub recipient_id: String,
    /// Crypto header.
    pub header: Header,
    /// Base64 ciphertext.
    pub ciphertext: String,
}

/// `201`/`200` to a send.
#[derive(Debug, Clone, Deserialize)]
pub struct SentIn {
    /// Our own outbound number.
    pub sent_seq: i64,
    /// `true` when an Idempotency-Key replay.
    #[serde(default)]
    pub idempotent_replay: bool,
}

/// One inbox entry.
#[derive(Debug, Clone, Deserialize)]
pub struct InboxMessageIn {
    /// Our own number for it: the ACK handle.
    pub id: i64,
    /// Who sent it (the relay authenticated the sender's token).
    pub sender_id: String,
    /// Header (extra fields a peer added are ignored).
    pub header: Header,
    /// Base64 ciphertext.
    pub ciphertext: String,
}

/// A page of the inbox.
#[derive(Debug, Clone, Deserialize)]
pub struct InboxPageIn {
    /// Oldest first.
    pub messages: Vec<InboxMessageIn>,
    /// More remain.
    #[serde(default)]
    pub has_more: bool,
}

/// `POST /api/v2/messages/ack` answer.
#[derive(Debug, Clone, Deserialize)]
pub struct AckIn {
    /// Deleted by this call.
    #[serde(default)]
    pub acknowledged: Vec<i64>,
    /// Already gone.
    #[serde(default)]
    pub not_found: Vec<i64>,
}

/// A rendezvous answer.
#[derive(Debug, Clone, Deserialize)]
pub struct RendezvousIn {
    /// `waiting` or `paired`.
    pub status: String,
    /// Only when opening.
    #[serde(default)]
    pub token: Option<String>,
    /// Derived role.
    #[serde(default)]
    pub role: Option<String>,
    /// The counterpart.
    #[serde(default)]
    pub peer_id: Option<String>,
    /// Its key (base64).
    #[serde(default)]
    pub peer_identity_public_key: Option<String>,
    /// The relay's claim of its fingerprint (never trusted; recomputed locally).
    #[serde(default)]
    pub peer_fingerprint: Option<String>,
}

/// `GET /api/v2/tokens/current`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenInfoIn {
    /// Seconds until the token expires without use.
    pub expires_in_seconds: i64,
}

/// `POST /api/v2/tokens/rotate`.
#[derive(Debug, Clone, Deserialize)]
pub struct RotatedIn {
    /// The replacement token, shown once.
    pub api_token: String,
}

/// A batch answer.
#[derive(Debug, Clone, Deserialize)]
pub struct BatchIn {
    /// Stored entries.
    #[serde(default)]
    pub sent: Vec<BatchSentIn>,
    /// Refused entries.
    #[serde(default)]
    pub failed: Vec<BatchFailedIn>,
}

/// A stored batch entry.
#[derive(Debug, Clone, Deserialize)]
pub struct BatchSentIn {
    /// Position in the request.
    pub index: usize,
}

/// A refused batch entry.
#[derive(Debug, Clone, Deserialize)]
pub struct BatchFailedIn {
    /// Position in the request.
    pub index: usize,
    /// Why.
    #[serde(default)]
    pub error: String,
}

/// A topic roster member.
#[derive(Debug, Clone, Deserialize)]
pub struct MemberIn {
    /// `sc-` id.
    pub id: String,
    /// Base64 key.
    pub identity_public_key: String,
}

/// A topic roster.
#[derive(Debug, Clone, Deserialize)]
pub struct RosterIn {
    /// Members.
    pub members: Vec<MemberIn>,
}

/// A topic in `GET /topics` (B.3.4).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct TopicIn {
    /// `tp-...`.
    pub id: String,
    /// Its owner's id.
    pub owner_id: String,
    /// Members, owner included.
    pub member_count: i64,
}

/// `GET /topics`: the topics the caller belongs to.
#[derive(Debug, Clone, Deserialize)]
pub struct TopicsIn {
    /// Oldest first.
    pub topics: Vec<TopicIn>,
}

/// `POST /topics/{topic}/members`: what became of each id asked for.
#[derive(Debug, Clone, Deserialize)]
pub struct MembersAddedIn {
    /// Newly added.
    #[serde(default)]
    pub added: Vec<String>,
    /// Already members (a no-op).
    #[serde(default)]
    pub already_member: Vec<String>,
    /// No such identity.
    #[serde(default)]
    pub unknown: Vec<String>,
}
