//! Signed event envelopes (§5): `{hash, event, signature}` where `hash = B64(SHA3-256(JCS(event)))`
//! and the signature is Ed25519 over the raw 32-byte digest.
//!
//! An [`Envelope`] value is always verified: it is only made by [`Event::sign`] or by parsing
//! through steps 1–5 of §6.1 (strict JSON, closed shape, hash, actor, signature). Time and nonce
//! rules depend on the use (live write or portable object) and live in `live_write`.

use ed25519_dalek::SigningKey;

use super::agent_id::{AgentId, AgentIdError};
use super::ed25519::{SignatureError, sign, verify_strict};
use super::encoding::{Hash32, b64};
use super::http::ErrorCode;
use super::json::{self, JsonError, Object, Value};
use super::shape::{self, ShapeError};

/// The six members every event has.
pub const EVENT_FIELDS: [&str; 6] = ["protocol", "type", "actor", "created_at", "nonce", "payload"];

/// The largest nonce (2^53 − 1).
pub const MAX_SAFE_NONCE: u64 = 9_007_199_254_740_991;

/// The event object of an envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Protocol identifier, e.g. `agent-mail/1.0`.
    pub protocol: String,
    /// Event type, e.g. `mailbox.publish`.
    pub event_type: String,
    /// The signer.
    pub actor: AgentId,
    /// Unix milliseconds.
    pub created_at: i64,
    /// The signer's monotonic nonce.
    pub nonce: u64,
    /// The protocol-defined payload, kept exactly as received.
    pub payload: Value,
    /// Extra top-level members the protocol defines (Discourse's `room_id`, ...); empty for Mail.
    pub extensions: Object,
}

/// Why an envelope was refused. Every variant but [`EnvelopeError::WrongSigner`] is the sender's
/// fault; that one is a local bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Not strict I-JSON.
    #[error("not strict I-JSON: {0}")]
    Json(#[from] JsonError),
    /// Wrong shape: missing, extra or mistyped members.
    #[error("invalid envelope shape: {0}")]
    Shape(#[from] ShapeError),
    /// `actor` is not an Agent ID.
    #[error("actor is not an Agent ID: {0}")]
    Actor(AgentIdError),
    /// `hash` does not match the event.
    #[error("hash does not match the event")]
    HashMismatch,
    /// The signature does not verify under `actor`.
    #[error("signature does not verify: {0}")]
    Signature(#[from] SignatureError),
    /// Local: asked to sign an event whose `actor` is another key.
    #[error("event actor is not the signing key")]
    WrongSigner,
}

impl EnvelopeError {
    /// The Identity error code (§8.1).
    pub fn code(&self) -> ErrorCode {
        match self {
            EnvelopeError::Json(_) | EnvelopeError::Shape(_) | EnvelopeError::WrongSigner => ErrorCode::InvalidEvent,
            EnvelopeError::Actor(_) => ErrorCode::InvalidActor,
            EnvelopeError::HashMismatch => ErrorCode::InvalidEventHash,
            EnvelopeError::Signature(_) => ErrorCode::InvalidSignature,
        }
    }
}

impl Event {
    /// The event as a JSON object (six members plus extensions).
    pub fn to_value(&self) -> Value {
        let mut obj = Object::new()
            .with("protocol", self.protocol.as_str())
            .with("type", self.event_type.as_str())
            .with("actor", self.actor.to_string())
            .with("created_at", self.created_at)
            .with("nonce", Value::Int(i64::try_from(self.nonce).unwrap_or(i64::MAX)));
        obj.insert("payload", self.payload.clone());
        for (k, v) in self.extensions.iter() {
            obj.insert(k, v.clone());
        }
        Value::Object(obj)
    }

    /// `JCS(event)`, the bytes that are hashed.
    pub fn to_jcs(&self) -> Vec<u8> {
        json::to_jcs(&self.to_value())
    }

    /// `SHA3-256(JCS(event))`, the event ID.
    pub fn hash(&self) -> Hash32 {
        Hash32::of(&self.to_jcs())
    }

    /// Reads an event object. `extensions` lists the extra top-level members the event's protocol
    /// defines; any other member is refused (§5.1).
    pub fn from_value(value: &Value, extensions: &[&str]) -> Result<Self, EnvelopeError> {
        let obj = shape::object(value, "event")?;
        shape::closed(obj, "event", &EVENT_FIELDS, extensions)?;
        let protocol = shape::string(obj, "event", "protocol")?.to_owned();
        let event_type = shape::string(obj, "event", "type")?.to_owned();
        let actor = AgentId::parse(shape::string(obj, "event", "actor")?).map_err(EnvelopeError::Actor)?;
        let created_at = shape::timestamp(obj, "event", "created_at")?;
        let nonce = shape::positive(obj, "event", "nonce")?;
        let payload = shape::member(obj, "event", "payload")?.clone();
        let mut ext = Object::new();
        for (k, v) in obj.iter().filter(|(k, _)| !EVENT_FIELDS.contains(k)) {
            ext.insert(k, v.clone());
        }
        Ok(Self { protocol, event_type, actor, created_at, nonce, payload, extensions: ext })
    }

    /// Signs the event with `key`, which must be the actor's key.
    pub fn sign(self, key: &SigningKey) -> Result<Envelope, EnvelopeError> {
        if AgentId::of(key) != self.actor {
            return Err(EnvelopeError::WrongSigner);
        }
        // Re-read what would be sent, so a signer never produces an envelope receivers refuse.
        let checked = Self::from_value(&self.to_value(), &self.extensions.keys().collect::<Vec<_>>())?;
        if checked != self || self.nonce > MAX_SAFE_NONCE {
            return Err(ShapeError::new("event", "created_at or nonce outside the safe range").into());
        }
        let hash = self.hash();
        let signature = sign(key, hash.as_bytes());
        Ok(Envelope { event: self, hash, signature })
    }
}

/// A verified envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    event: Event,
    hash: Hash32,
    signature: [u8; 64],
}

impl Envelope {
    /// Steps 1–5 of §6.1 on raw bytes: strict parse, closed shape, hash, actor, signature.
    pub fn parse(bytes: &[u8], extensions: &[&str]) -> Result<Self, EnvelopeError> {
        Self::from_value(&json::parse(bytes)?, extensions)
    }

    /// Steps 1–5 of §6.1 on an already strictly parsed value (an embedded envelope or record).
    pub fn from_value(value: &Value, extensions: &[&str]) -> Result<Self, EnvelopeError> {
        let obj = shape::object(value, "")?;
        shape::closed(obj, "", &["hash", "event", "signature"], &[])?;
        let claimed = shape::hash(obj, "", "hash")?;
        let signature = shape::fixed::<64>(obj, "", "signature")?;
        let event = Event::from_value(shape::member(obj, "", "event")?, extensions)?;
        let hash = event.hash();
        if hash != claimed {
            return Err(EnvelopeError::HashMismatch);
        }
        verify_strict(event.actor.public_key(), hash.as_bytes(), &signature)?;
        Ok(Self { event, hash, signature })
    }

    /// The event.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The event ID.
    pub fn hash(&self) -> Hash32 {
        self.hash
    }

    /// The signer.
    pub fn actor(&self) -> &AgentId {
        &self.event.actor
    }

    /// The raw signature.
    pub fn signature(&self) -> &[u8; 64] {
        &self.signature
    }

    /// The envelope as JSON.
    pub fn to_value(&self) -> Value {
        Value::Object(
            Object::new()
                .with("hash", self.hash.to_string())
                .with("event", self.event.to_value())
                .with("signature", b64(&self.signature)),
        )
    }

    /// `JCS(envelope)`.
    pub fn to_jcs(&self) -> Vec<u8> {
        json::to_jcs(&self.to_value())
    }
}
