//! Relay-side decisions (§4.2, §7.1, §8) as pure functions relay-lite calls around its store:
//! card publication (a live control write bound to the first actor), packet delivery (signature,
//! bounds, exact-resubmission lookup, current card, expiry, size, admission), owner-authenticated
//! reads and deletes, list paging parameters, and the HTTP error codes with their statuses.
//!
//! Flow for `POST /v1/mailboxes/{id}/packets`: [`Packet::parse`] the bounded body, look up the
//! packet ID in accepted history and the current card, decide admission for the verified actor,
//! call [`check_delivery`], then (on `Accept`) check quotas and store packet, sequence number and
//! tombstone in one transaction.

use super::card::{CardError, MailboxCard};
use super::packet::{Packet, PacketError};
use super::{Id16, MAX_TTL_MS, PROTOCOL, SKEW_MS};
use crate::protocol::agent_identity::http::{DiscoveryDocument, ErrorBody, HttpShapeError};
use crate::protocol::agent_identity::json::{self, Object, Value};
use crate::protocol::agent_identity::jwt::{JwtError, JwtPolicy, verify_request_jwt};
use crate::protocol::agent_identity::live_write::{LiveWrite, LiveWriteError, NonceCacheEntry, check_live_write};
use crate::protocol::agent_identity::shape::{self, ShapeError};
use crate::protocol::agent_identity::{AgentId, ErrorCode, Hash32, Origin};

/// Default page size of packet lists.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// Largest page size of packet lists.
pub const MAX_LIST_LIMIT: usize = 1000;

/// An Agent Mail error code: Identity's shared codes plus Mail's four.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MailCode {
    /// A shared Identity code.
    Identity(ErrorCode),
    /// Unknown mailbox, or this relay is not in the current card's routes (404).
    MailboxUnavailable,
    /// The packet names a card other than the current one, or the current card expired (409).
    StaleCard,
    /// The packet deadline passed (410).
    PacketExpired,
    /// The mailbox belongs to another actor (409).
    MailboxConflict,
}

impl MailCode {
    /// The wire string.
    pub fn as_str(&self) -> &'static str {
        match self {
            MailCode::Identity(c) => c.as_str(),
            MailCode::MailboxUnavailable => "mailbox_unavailable",
            MailCode::StaleCard => "stale_card",
            MailCode::PacketExpired => "packet_expired",
            MailCode::MailboxConflict => "mailbox_conflict",
        }
    }

    /// The HTTP status.
    pub fn http_status(&self) -> u16 {
        match self {
            MailCode::Identity(c) => c.http_status(),
            MailCode::MailboxUnavailable => 404,
            MailCode::StaleCard | MailCode::MailboxConflict => 409,
            MailCode::PacketExpired => 410,
        }
    }
}

/// Why a relay refused a request. The client (or sender) is at fault in every case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// The card body is invalid.
    #[error("{0}")]
    Card(#[from] CardError),
    /// The packet body is invalid.
    #[error("{0}")]
    Packet(#[from] PacketError),
    /// The live-write checks refused the card (timestamp window or service-wide nonce).
    #[error("{0}")]
    LiveWrite(#[from] LiveWriteError),
    /// The card's nonce does not exceed the current card's.
    #[error("card nonce must be greater than {current}")]
    NotAboveCurrent {
        /// The current card's nonce.
        current: u64,
    },
    /// The mailbox is bound to another actor.
    #[error("mailbox belongs to another actor")]
    MailboxConflict,
    /// The first card for a mailbox does not list this relay's origin.
    #[error("the first card must list this relay's origin")]
    FirstCardOmitsRelay,
    /// Unknown mailbox, or this relay is not a route of the current card.
    #[error("mailbox unavailable")]
    MailboxUnavailable,
    /// The packet names another card, or the current card expired.
    #[error("packet names a card other than the current one, or the card expired")]
    StaleCard,
    /// The packet deadline has passed.
    #[error("packet expired")]
    PacketExpired,
    /// The path mailbox is not the header's.
    #[error("path mailbox differs from the packet header")]
    PathMismatch,
    /// `header.expires_at` is beyond `min(card.receive_until, now + MAX_TTL + 300000)`.
    #[error("packet expiration is beyond what the card accepts")]
    ExpiryTooLate,
    /// The packet exceeds the card's `max_packet_bytes`.
    #[error("packet exceeds the card's max_packet_bytes")]
    OverCardLimit,
    /// Sender admission denied, or an owner token for another identity.
    #[error("permission denied")]
    PermissionDenied,
    /// The owner JWT is invalid.
    #[error("invalid token: {0}")]
    Token(#[from] JwtError),
    /// A malformed `limit`, `cursor` or path identifier.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl RelayError {
    /// The error code.
    pub fn code(&self) -> MailCode {
        match self {
            RelayError::Card(e) => MailCode::Identity(e.code()),
            RelayError::Packet(e) => MailCode::Identity(e.code()),
            RelayError::LiveWrite(e) => MailCode::Identity(e.code()),
            RelayError::NotAboveCurrent { .. } => MailCode::Identity(ErrorCode::NonceNotGreater),
            RelayError::MailboxConflict => MailCode::MailboxConflict,
            RelayError::FirstCardOmitsRelay | RelayError::PermissionDenied => {
                MailCode::Identity(ErrorCode::PermissionDenied)
            }
            RelayError::MailboxUnavailable => MailCode::MailboxUnavailable,
            RelayError::StaleCard => MailCode::StaleCard,
            RelayError::PacketExpired => MailCode::PacketExpired,
            RelayError::PathMismatch | RelayError::ExpiryTooLate => MailCode::Identity(ErrorCode::InvalidEvent),
            RelayError::OverCardLimit => MailCode::Identity(ErrorCode::PayloadTooLarge),
            RelayError::Token(_) => MailCode::Identity(ErrorCode::InvalidToken),
            RelayError::InvalidRequest(_) => MailCode::Identity(ErrorCode::InvalidRequest),
        }
    }

    /// The value for the `Max-Seen-Nonce` header, when the refusal was a nonce check.
    pub fn max_seen_nonce(&self) -> Option<u64> {
        match self {
            RelayError::LiveWrite(LiveWriteError::NonceNotGreater { max_seen }) => Some(*max_seen),
            RelayError::NotAboveCurrent { current } => Some(*current),
            _ => None,
        }
    }

    /// The Identity-shaped error body.
    pub fn to_body(&self) -> ErrorBody {
        ErrorBody::new(self.code().as_str(), self.to_string())
    }
}

/// The relay's current card for a mailbox and when it was first accepted. The mailbox binding to
/// `card.owner()` lives as long as this record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentCard {
    /// The current card.
    pub card: MailboxCard,
    /// First acceptance time (returned unchanged on exact resubmission).
    pub accepted_at: i64,
}

impl CurrentCard {
    /// The accepted record `{envelope, accepted_at}` served by publish and card reads.
    pub fn to_record(&self) -> Value {
        Value::Object(Object::new().with("envelope", self.card.to_value()).with("accepted_at", self.accepted_at))
    }

    /// Reads a card accepted record (client side of `GET .../card`), verifying the card.
    pub fn from_record(bytes: &[u8]) -> Result<Self, RelayError> {
        let v = json::parse(bytes).map_err(|e| CardError::Envelope(e.into()))?;
        let obj = shape::object(&v, "").map_err(CardError::from)?;
        shape::closed(obj, "", &["envelope", "accepted_at"], &[]).map_err(CardError::from)?;
        let card = MailboxCard::from_value(shape::member(obj, "", "envelope").map_err(CardError::from)?)?;
        let accepted_at = shape::timestamp(obj, "", "accepted_at").map_err(CardError::from)?;
        Ok(Self { card, accepted_at })
    }

    /// Whether the relay may forget the mailbox and its binding: every packet and tombstone has
    /// expired by the card's `receive_until`.
    pub fn forgettable(&self, now_ms: i64) -> bool {
        now_ms >= self.card.payload().receive_until
    }
}

/// `POST /v1/mailboxes`: decides a verified card against the current card and the actor's
/// service-wide nonce cache. On `Accept`, atomically replace the current card (accepted at
/// `now`) and update the nonce cache with `NonceCacheEntry::after_accept`; on `Resubmission`,
/// answer with the current record unchanged.
pub fn check_publish(
    card: &MailboxCard,
    relay_origin: &Origin,
    current: Option<&CurrentCard>,
    actor_nonces: Option<&NonceCacheEntry>,
    now_ms: i64,
    window_ms: i64,
) -> Result<LiveWrite, RelayError> {
    if let Some(cur) = current {
        if cur.card.hash() == card.hash() {
            return Ok(LiveWrite::Resubmission);
        }
        if cur.card.owner() != card.owner() {
            return Err(RelayError::MailboxConflict);
        }
        // Only the current card is kept: any older card is a stale write.
        if card.nonce() <= cur.card.nonce() {
            return Err(RelayError::NotAboveCurrent { current: cur.card.nonce() });
        }
    }
    check_live_write(card.envelope(), false, actor_nonces, now_ms, window_ms)?;
    if current.is_none() && !card.lists_route(relay_origin) {
        return Err(RelayError::FirstCardOmitsRelay);
    }
    Ok(LiveWrite::Accept)
}

/// The relay's answer to an accepted packet: exactly `packet_id` and `accepted_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryResult {
    /// The packet ID.
    pub packet_id: Hash32,
    /// First acceptance time.
    pub accepted_at: i64,
}

impl DeliveryResult {
    /// The result as JSON.
    pub fn to_value(&self) -> Value {
        Value::Object(Object::new().with("packet_id", self.packet_id.to_string()).with("accepted_at", self.accepted_at))
    }

    /// Reads a delivery result (sender side).
    pub fn parse(bytes: &[u8]) -> Result<Self, HttpShapeError> {
        let v = json::parse(bytes)?;
        let obj = shape::object(&v, "")?;
        shape::closed(obj, "", &["packet_id", "accepted_at"], &[])?;
        Ok(Self {
            packet_id: shape::hash(obj, "", "packet_id")?,
            accepted_at: shape::timestamp(obj, "", "accepted_at")?,
        })
    }
}

/// Sender admission policy decided by the relay for the verified actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Accept packets from this sender.
    Allow,
    /// The owner blocked this sender.
    Deny,
}

/// What to do with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// New acceptance: check quotas, then store atomically with the next `seq` and a tombstone
    /// kept until the packet expires; answer `202` with `{packet_id, accepted_at: now}`.
    Accept,
    /// A packet ID in accepted history: answer `202` with the original result. Nothing is
    /// recreated and no current policy, card or time check applies.
    Resubmission(DeliveryResult),
}

/// `POST /v1/mailboxes/{mailbox_id}/packets` for a parsed, verified packet. `history` is the
/// original result when the packet ID is in accepted history (tombstones included); `current`
/// is the current card; `admission` is the owner's policy for `packet.sender()`.
pub fn check_delivery(
    packet: &Packet,
    path_mailbox: &Id16,
    relay_origin: &Origin,
    current: Option<&MailboxCard>,
    history: Option<&DeliveryResult>,
    admission: Admission,
    now_ms: i64,
) -> Result<Delivery, RelayError> {
    let header = packet.header();
    if header.mailbox_id != *path_mailbox {
        return Err(RelayError::PathMismatch);
    }
    if let Some(result) = history {
        return Ok(Delivery::Resubmission(*result));
    }
    packet.check_not_future(now_ms)?;
    let card = current.ok_or(RelayError::MailboxUnavailable)?;
    if card.mailbox_id() != *path_mailbox || !card.lists_route(relay_origin) {
        return Err(RelayError::MailboxUnavailable);
    }
    if header.card_hash != card.hash() || now_ms >= card.payload().expires_at {
        return Err(RelayError::StaleCard);
    }
    if now_ms >= header.expires_at {
        return Err(RelayError::PacketExpired);
    }
    let latest = card.payload().receive_until.min(now_ms.saturating_add(MAX_TTL_MS).saturating_add(SKEW_MS));
    if header.expires_at > latest {
        return Err(RelayError::ExpiryTooLate);
    }
    if packet.size() > card.payload().max_packet_bytes {
        return Err(RelayError::OverCardLimit);
    }
    if admission == Admission::Deny {
        return Err(RelayError::PermissionDenied);
    }
    Ok(Delivery::Accept)
}

/// A stored packet as listed to the owner: exactly `packet_id`, `packet`, `accepted_at`, `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketRecord {
    /// The packet ID.
    pub packet_id: Hash32,
    /// The packet, byte-for-byte as accepted.
    pub packet: Packet,
    /// First acceptance time.
    pub accepted_at: i64,
    /// Mailbox sequence number (owner lists only).
    pub seq: u64,
}

impl PacketRecord {
    /// The record as JSON.
    pub fn to_value(&self) -> Value {
        Value::Object(
            Object::new()
                .with("packet_id", self.packet_id.to_string())
                .with("packet", self.packet.to_value())
                .with("accepted_at", self.accepted_at)
                .with("seq", Value::Int(i64::try_from(self.seq).unwrap_or(i64::MAX))),
        )
    }

    /// Reads a record from a list page item, verifying the packet; the recipient still runs
    /// [`super::recipient::verify_packet`] with `packet_id` as the claimed ID.
    pub fn from_value(value: &Value) -> Result<Self, RelayError> {
        let bad = |e: ShapeError| RelayError::Packet(PacketError::Shape(e));
        let obj = shape::object(value, "record").map_err(bad)?;
        shape::closed(obj, "record", &["packet_id", "packet", "accepted_at", "seq"], &[]).map_err(bad)?;
        Ok(Self {
            packet_id: shape::hash(obj, "record", "packet_id").map_err(bad)?,
            packet: Packet::from_value(shape::member(obj, "record", "packet").map_err(bad)?)?,
            accepted_at: shape::timestamp(obj, "record", "accepted_at").map_err(bad)?,
            seq: shape::positive(obj, "record", "seq").map_err(bad)?,
        })
    }
}

/// Authorizes an owner read or delete: verifies the bearer token for this relay first (so nothing
/// about the mailbox leaks to a bad token), then requires a known mailbox and `sub == owner`.
pub fn authorize_owner(
    token: &str,
    relay_origin: &Origin,
    mailbox_owner: Option<&AgentId>,
    now_secs: i64,
    policy: JwtPolicy,
) -> Result<AgentId, RelayError> {
    let claims = verify_request_jwt(token, relay_origin, now_secs, policy)?;
    let owner = mailbox_owner.ok_or(RelayError::MailboxUnavailable)?;
    if claims.subject != *owner {
        return Err(RelayError::PermissionDenied);
    }
    Ok(claims.subject)
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn bearer_token(header_value: &str) -> Option<&str> {
    header_value.strip_prefix("Bearer ").filter(|t| !t.is_empty() && !t.contains(' '))
}

/// Parses a path identifier (`mailbox_id`).
pub fn parse_mailbox_path(text: &str) -> Result<Id16, RelayError> {
    Id16::parse(text).ok_or_else(|| RelayError::InvalidRequest("mailbox_id is not a canonical id16".into()))
}

/// Parses a path identifier (`packet_id`).
pub fn parse_packet_path(text: &str) -> Result<Hash32, RelayError> {
    Hash32::parse(text).ok_or_else(|| RelayError::InvalidRequest("packet_id is not a canonical hash".into()))
}

/// The `limit` query parameter: default 100, a positive decimal integer up to 1000.
pub fn parse_list_limit(raw: Option<&str>) -> Result<usize, RelayError> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_LIST_LIMIT);
    };
    let bad = || RelayError::InvalidRequest(format!("limit must be an integer from 1 to {MAX_LIST_LIMIT}"));
    if raw.is_empty() || raw.len() > 4 || !raw.bytes().all(|b| b.is_ascii_digit()) || raw.starts_with('0') {
        return Err(bad());
    }
    let limit: usize = raw.parse().map_err(|_| bad())?;
    if limit > MAX_LIST_LIMIT {
        return Err(bad());
    }
    Ok(limit)
}

/// The relay's `/.well-known/agent-mail` document (no endpoints or features in 1.0).
pub fn discovery_document(origin: &Origin) -> DiscoveryDocument {
    DiscoveryDocument { protocol: PROTOCOL.to_owned(), service: origin.clone(), endpoints: None, features: None }
}
