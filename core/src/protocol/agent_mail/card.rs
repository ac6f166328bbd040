//! Mailbox cards (§4.1): owner-signed `mailbox.publish` envelopes binding an Agent ID to a separate
//! X25519 key, routes, limits and times; and the sender's pin rule (§3.2): the greatest nonce
//! wins, a same-nonce different card is refused, closed and expired cards still pin.

use ed25519_dalek::SigningKey;

use super::hpke::is_usable_public_key;
use super::{Id16, MAX_PACKET_BYTES, MAX_RAW_BYTES, MAX_ROUTES, MAX_TTL_MS, MIN_CARD_PACKET_BYTES, PROTOCOL, SKEW_MS};
use crate::protocol::agent_identity::encoding::b64;
use crate::protocol::agent_identity::envelope::{Envelope, EnvelopeError, Event};
use crate::protocol::agent_identity::json::{Object, Value};
use crate::protocol::agent_identity::origin::{Origin, OriginError};
use crate::protocol::agent_identity::shape::{self, ShapeError};
use crate::protocol::agent_identity::{AgentId, ErrorCode, Hash32};

/// The card event type.
pub const CARD_TYPE: &str = "mailbox.publish";

const PAYLOAD_FIELDS: [&str; 6] =
    ["mailbox_id", "expires_at", "receive_until", "public_key", "routes", "max_packet_bytes"];

/// The card payload (a full replacement of the previous card).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardPayload {
    /// Stable across this mailbox's updates and routes.
    pub mailbox_id: Id16,
    /// New encryption under this card requires `now < expires_at`.
    pub expires_at: i64,
    /// Upper bound on the expiration of messages encrypted to this card.
    pub receive_until: i64,
    /// Raw X25519 public key (never derived from the identity key).
    pub public_key: [u8; 32],
    /// Zero to eight unique HTTPS origins; empty closes the mailbox.
    pub routes: Vec<Origin>,
    /// Largest `JCS(packet)` in bytes, 4096..=1048576.
    pub max_packet_bytes: usize,
}

/// Why a card was refused. Every variant is the card signer's fault except
/// [`CardError::Envelope`]`(WrongSigner)`, a local bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CardError {
    /// The raw body is larger than any card can be.
    #[error("card body too large")]
    TooLarge,
    /// Not a verified Identity envelope.
    #[error("{0}")]
    Envelope(#[from] EnvelopeError),
    /// Not an `agent-mail/1.0` `mailbox.publish` event, or a malformed payload.
    #[error("invalid card: {0}")]
    Shape(#[from] ShapeError),
    /// Violates `created_at < expires_at <= created_at + MAX_TTL`.
    #[error("card lifetime must be positive and at most 30 days")]
    Lifetime,
    /// Violates `expires_at <= receive_until <= expires_at + MAX_TTL`.
    #[error("receive_until must be within 30 days after expires_at")]
    ReceiveUntil,
    /// The X25519 public key is a low-order point (all-zero shared secrets, RFC 9180 §7.1.4).
    #[error("card public key is not a usable X25519 key")]
    UnusableKey,
    /// A route is not a serialized HTTPS origin.
    #[error("card route is not an origin: {0}")]
    Route(OriginError),
    /// Duplicate routes, or more than eight.
    #[error("card routes must be unique and at most eight")]
    Routes,
    /// `max_packet_bytes` outside 4096..=1048576.
    #[error("max_packet_bytes must be between 4096 and 1048576")]
    PacketLimit,
}

impl CardError {
    /// The wire error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            CardError::TooLarge => ErrorCode::PayloadTooLarge,
            CardError::Envelope(e) => e.code(),
            _ => ErrorCode::InvalidEvent,
        }
    }
}

/// Why a valid card cannot be used to send now (§4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CardUnusable {
    /// `created_at` is more than five minutes in the future.
    #[error("card is dated in the future")]
    NotYetValid,
    /// `now >= expires_at`.
    #[error("card expired")]
    Expired,
    /// `routes` is empty: the mailbox is closed.
    #[error("mailbox is closed")]
    Closed,
}

/// A verified, well-formed mailbox card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailboxCard {
    envelope: Envelope,
    payload: CardPayload,
}

impl CardPayload {
    fn to_value(&self) -> Value {
        Value::Object(
            Object::new()
                .with("mailbox_id", self.mailbox_id.to_string())
                .with("expires_at", self.expires_at)
                .with("receive_until", self.receive_until)
                .with("public_key", b64(&self.public_key))
                .with("routes", Value::Array(self.routes.iter().map(|r| Value::from(r.as_str())).collect()))
                .with("max_packet_bytes", Value::Int(i64::try_from(self.max_packet_bytes).unwrap_or(i64::MAX))),
        )
    }

    fn from_value(value: &Value) -> Result<Self, CardError> {
        let obj = shape::object(value, "payload")?;
        shape::closed(obj, "payload", &PAYLOAD_FIELDS, &[])?;
        let mailbox_id = Id16::parse(shape::string(obj, "payload", "mailbox_id")?)
            .ok_or_else(|| ShapeError::new("payload.mailbox_id", "not an id16"))?;
        let expires_at = shape::timestamp(obj, "payload", "expires_at")?;
        let receive_until = shape::timestamp(obj, "payload", "receive_until")?;
        let public_key = shape::fixed::<32>(obj, "payload", "public_key")?;
        let mut routes = Vec::new();
        for r in shape::array(obj, "payload", "routes")? {
            let r = r.as_str().ok_or_else(|| ShapeError::new("payload.routes", "items must be strings"))?;
            routes.push(Origin::parse(r).map_err(CardError::Route)?);
        }
        let max = shape::integer(obj, "payload", "max_packet_bytes")?;
        let max_packet_bytes = usize::try_from(max).map_err(|_| CardError::PacketLimit)?;
        Ok(Self { mailbox_id, expires_at, receive_until, public_key, routes, max_packet_bytes })
    }
}

impl MailboxCard {
    /// Signs a card for the owner `key`. The nonce must exceed every nonce the owner used before
    /// (see `live_write::next_nonce`); successive cards keep `created_at` non-decreasing.
    pub fn sign(key: &SigningKey, created_at: i64, nonce: u64, payload: CardPayload) -> Result<Self, CardError> {
        let event = Event {
            protocol: PROTOCOL.to_owned(),
            event_type: CARD_TYPE.to_owned(),
            actor: AgentId::of(key),
            created_at,
            nonce,
            payload: payload.to_value(),
            extensions: Object::new(),
        };
        Self::from_envelope(event.sign(key)?)
    }

    /// Parses and verifies a card from raw bytes: strict JSON, Identity steps 1–5, card rules.
    pub fn parse(bytes: &[u8]) -> Result<Self, CardError> {
        if bytes.len() > MAX_RAW_BYTES {
            return Err(CardError::TooLarge);
        }
        Self::from_envelope(Envelope::parse(bytes, &[])?)
    }

    /// Verifies a card given as a parsed value (a reply card or an accepted record's envelope).
    pub fn from_value(value: &Value) -> Result<Self, CardError> {
        Self::from_envelope(Envelope::from_value(value, &[])?)
    }

    /// Checks that a verified envelope is a well-formed card.
    pub fn from_envelope(envelope: Envelope) -> Result<Self, CardError> {
        let event = envelope.event();
        if event.protocol != PROTOCOL {
            return Err(ShapeError::new("event.protocol", format!("expected {PROTOCOL}")).into());
        }
        if event.event_type != CARD_TYPE {
            return Err(ShapeError::new("event.type", format!("expected {CARD_TYPE}")).into());
        }
        let payload = CardPayload::from_value(&event.payload)?;
        let created_at = event.created_at;
        if !(created_at < payload.expires_at && payload.expires_at <= created_at.saturating_add(MAX_TTL_MS)) {
            return Err(CardError::Lifetime);
        }
        if !(payload.expires_at <= payload.receive_until
            && payload.receive_until <= payload.expires_at.saturating_add(MAX_TTL_MS))
        {
            return Err(CardError::ReceiveUntil);
        }
        if !is_usable_public_key(&payload.public_key) {
            return Err(CardError::UnusableKey);
        }
        if payload.routes.len() > MAX_ROUTES
            || payload.routes.iter().enumerate().any(|(i, r)| payload.routes.iter().skip(i + 1).any(|o| o == r))
        {
            return Err(CardError::Routes);
        }
        if !(MIN_CARD_PACKET_BYTES..=MAX_PACKET_BYTES).contains(&payload.max_packet_bytes) {
            return Err(CardError::PacketLimit);
        }
        Ok(Self { envelope, payload })
    }

    /// `card_hash`: the Identity event hash, the only key selector a packet carries.
    pub fn hash(&self) -> Hash32 {
        self.envelope.hash()
    }

    /// The mailbox owner (the event's actor).
    pub fn owner(&self) -> &AgentId {
        self.envelope.actor()
    }

    /// The signed envelope.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The payload.
    pub fn payload(&self) -> &CardPayload {
        &self.payload
    }

    /// The mailbox identifier.
    pub fn mailbox_id(&self) -> Id16 {
        self.payload.mailbox_id
    }

    /// Signing time.
    pub fn created_at(&self) -> i64 {
        self.envelope.event().created_at
    }

    /// The owner's nonce for this card.
    pub fn nonce(&self) -> u64 {
        self.envelope.event().nonce
    }

    /// Whether the card closes the mailbox (no routes).
    pub fn is_closed(&self) -> bool {
        self.payload.routes.is_empty()
    }

    /// Whether `origin` is one of the card's routes.
    pub fn lists_route(&self, origin: &Origin) -> bool {
        self.payload.routes.contains(origin)
    }

    /// The stable address `did:agent:<owner>/mail/<mailbox_id>`, the sender's pin key.
    pub fn stable_address(&self) -> String {
        format!("{}/mail/{}", self.owner(), self.payload.mailbox_id)
    }

    /// The sender's use check (§4.1): `created_at <= now + 300000`, `now < expires_at`, routes
    /// non-empty.
    pub fn check_sendable(&self, now_ms: i64) -> Result<(), CardUnusable> {
        if self.created_at() > now_ms.saturating_add(SKEW_MS) {
            return Err(CardUnusable::NotYetValid);
        }
        if now_ms >= self.payload.expires_at {
            return Err(CardUnusable::Expired);
        }
        if self.is_closed() {
            return Err(CardUnusable::Closed);
        }
        Ok(())
    }

    /// The card as JSON (the envelope, exactly as signed).
    pub fn to_value(&self) -> Value {
        self.envelope.to_value()
    }

    /// `JCS(card)`.
    pub fn to_jcs(&self) -> Vec<u8> {
        self.envelope.to_jcs()
    }
}

/// The sender's durable pin for one `(owner, mailbox_id)`: the valid card with the greatest nonce
/// seen, even when that card is closed or expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    /// The mailbox owner.
    pub owner: AgentId,
    /// The mailbox.
    pub mailbox_id: Id16,
    /// The pinned card's nonce.
    pub nonce: u64,
    /// The pinned card's hash.
    pub card_hash: Hash32,
    /// The pinned card's `created_at`.
    pub created_at: i64,
}

impl Pin {
    /// The pin a card establishes.
    pub fn of(card: &MailboxCard) -> Self {
        Self {
            owner: *card.owner(),
            mailbox_id: card.mailbox_id(),
            nonce: card.nonce(),
            card_hash: card.hash(),
            created_at: card.created_at(),
        }
    }

    /// Whether the pin may be forgotten: every earlier card has expired by then.
    pub fn discardable(&self, now_ms: i64) -> bool {
        now_ms >= self.created_at.saturating_add(MAX_TTL_MS).saturating_add(SKEW_MS)
    }
}

/// A card accepted against the pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinOutcome {
    /// The pinned card itself.
    Same,
    /// A higher-nonce card: store this new pin.
    Advanced(Pin),
}

/// A card refused by the pin (the card source's fault; the pin is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    /// The card is for another owner or mailbox than the pin.
    #[error("card belongs to another mailbox than the pin")]
    OtherMailbox,
    /// The card's nonce is below the pinned one: an older card.
    #[error("card is older than the pinned card")]
    Older,
    /// Same nonce, different card: conflicting signed cards.
    #[error("card conflicts with the pinned card of the same nonce")]
    Conflict,
}

/// Applies the pin rule to a verified card. With no pin, the card becomes the pin.
pub fn check_pin(pinned: Option<&Pin>, card: &MailboxCard) -> Result<PinOutcome, PinError> {
    let Some(pin) = pinned else {
        return Ok(PinOutcome::Advanced(Pin::of(card)));
    };
    if pin.owner != *card.owner() || pin.mailbox_id != card.mailbox_id() {
        return Err(PinError::OtherMailbox);
    }
    if card.hash() == pin.card_hash {
        return Ok(PinOutcome::Same);
    }
    match card.nonce().cmp(&pin.nonce) {
        std::cmp::Ordering::Greater => Ok(PinOutcome::Advanced(Pin::of(card))),
        std::cmp::Ordering::Equal => Err(PinError::Conflict),
        std::cmp::Ordering::Less => Err(PinError::Older),
    }
}
