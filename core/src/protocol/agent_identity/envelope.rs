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
use super::error_code::ErrorCode;
use super::json::{self, JsonError, MAX_SAFE_INTEGER, Object, Value};
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

    /// `JCS(event)`, the bytes that are hashed (written without copying the payload).
    pub fn to_jcs(&self) -> Vec<u8> {
        let protocol = Value::from(self.protocol.as_str());
        let event_type = Value::from(self.event_type.as_str());
        let actor = Value::from(self.actor.to_string());
        let created_at = Value::Int(self.created_at);
        let nonce = Value::Int(i64::try_from(self.nonce).unwrap_or(i64::MAX));
        let mut members: Vec<(&str, &Value)> = vec![
            ("protocol", &protocol),
            ("type", &event_type),
            ("actor", &actor),
            ("created_at", &created_at),
            ("nonce", &nonce),
            ("payload", &self.payload),
        ];
        members.extend(self.extensions.iter());
        json::object_to_jcs(&members).into_bytes()
    }

    /// `SHA3-256(JCS(event))`, the event ID.
    pub fn hash(&self) -> Hash32 {
        Hash32::of(&self.to_jcs())
    }

    /// Reads an event object. `extensions` lists the extra top-level members the event's protocol
    /// defines; any other member is refused (§5.1).
    pub fn from_value(value: &Value, extensions: &[&str]) -> Result<Self, EnvelopeError> {
        Self::from_owned(value.clone(), extensions)
    }

    /// [`Event::from_value`] taking ownership (no copy of a large payload).
    pub fn from_owned(value: Value, extensions: &[&str]) -> Result<Self, EnvelopeError> {
        let obj = shape::object(&value, "event")?;
        shape::closed(obj, "event", &EVENT_FIELDS, extensions)?;
        let protocol = shape::string(obj, "event", "protocol")?.to_owned();
        let event_type = shape::string(obj, "event", "type")?.to_owned();
        let actor = AgentId::parse(shape::string(obj, "event", "actor")?).map_err(EnvelopeError::Actor)?;
        let created_at = shape::timestamp(obj, "event", "created_at")?;
        let nonce = shape::positive(obj, "event", "nonce")?;
        let Value::Object(mut rest) = value else {
            return Err(ShapeError::new("event", "expected an object").into());
        };
        let payload = rest.remove("payload").ok_or_else(|| ShapeError::new("event.payload", "missing"))?;
        for field in EVENT_FIELDS {
            rest.remove(field);
        }
        Ok(Self { protocol, event_type, actor, created_at, nonce, payload, extensions: rest })
    }

    /// Signs the event with `key`, which must be the actor's key.
    pub fn sign(self, key: &SigningKey) -> Result<Envelope, EnvelopeError> {
        if AgentId::of(key) != self.actor {
            return Err(EnvelopeError::WrongSigner);
        }
        // Never produce an envelope receivers must refuse.
        if !(0..=MAX_SAFE_INTEGER).contains(&self.created_at) || !(1..=MAX_SAFE_NONCE).contains(&self.nonce) {
            return Err(ShapeError::new("event", "created_at or nonce outside the safe range").into());
        }
        if let Some(k) = self.extensions.keys().find(|k| EVENT_FIELDS.contains(k)) {
            return Err(ShapeError::new(k, "extension shadows an event field").into());
        }
        let event_jcs = self.to_jcs();
        let hash = Hash32::of(&event_jcs);
        let signature = sign(key, hash.as_bytes());
        Ok(Envelope { event: self, hash, signature, event_jcs_len: event_jcs.len() })
    }
}

/// An envelope whose shape has been read (step 1) but whose hash and signature are not yet
/// checked. Lets a protocol run its own cheap shape checks before the signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeIn {
    /// The event.
    pub event: Event,
    /// The claimed `hash`.
    pub hash: Hash32,
    /// The claimed signature.
    pub signature: [u8; 64],
}

impl EnvelopeIn {
    /// Step 1 of §6.1: a closed `{hash, event, signature}` with a closed, well-typed event.
    pub fn from_value(value: &Value, extensions: &[&str]) -> Result<Self, EnvelopeError> {
        Self::from_owned(value.clone(), extensions)
    }

    /// [`EnvelopeIn::from_value`] taking ownership (no copy of a large payload).
    pub fn from_owned(value: Value, extensions: &[&str]) -> Result<Self, EnvelopeError> {
        let obj = shape::object(&value, "")?;
        shape::closed(obj, "", &["hash", "event", "signature"], &[])?;
        let hash = shape::hash(obj, "", "hash")?;
        let signature = shape::fixed::<64>(obj, "", "signature")?;
        let Value::Object(mut obj) = value else {
            return Err(ShapeError::new("", "expected an object").into());
        };
        let event = obj.remove("event").ok_or_else(|| ShapeError::new("event", "missing"))?;
        let event = Event::from_owned(event, extensions)?;
        Ok(Self { event, hash, signature })
    }

    /// Steps 2–5: recompute the hash and verify the signature under `actor`.
    pub fn verify(self) -> Result<Envelope, EnvelopeError> {
        let event_jcs = self.event.to_jcs();
        let hash = Hash32::of(&event_jcs);
        if hash != self.hash {
            return Err(EnvelopeError::HashMismatch);
        }
        verify_strict(self.event.actor.public_key(), hash.as_bytes(), &self.signature)?;
        Ok(Envelope { event: self.event, hash, signature: self.signature, event_jcs_len: event_jcs.len() })
    }
}

/// A verified envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    event: Event,
    hash: Hash32,
    signature: [u8; 64],
    event_jcs_len: usize,
}

/// Bytes `JCS(envelope)` adds around `JCS(event)`: `{"event":`, `,"hash":"`, 43 hash characters,
/// `","signature":"`, 86 signature characters and `"}`.
pub const ENVELOPE_OVERHEAD: usize = 9 + 9 + 43 + 15 + 86 + 2;

impl Envelope {
    /// Steps 1–5 of §6.1 on raw bytes: strict parse, closed shape, hash, actor, signature.
    pub fn parse(bytes: &[u8], extensions: &[&str]) -> Result<Self, EnvelopeError> {
        EnvelopeIn::from_owned(json::parse(bytes)?, extensions)?.verify()
    }

    /// Steps 1–5 of §6.1 on an already strictly parsed value (an embedded envelope or record).
    pub fn from_value(value: &Value, extensions: &[&str]) -> Result<Self, EnvelopeError> {
        EnvelopeIn::from_value(value, extensions)?.verify()
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

    /// `JCS(envelope)`: members sort as `event`, `hash`, `signature`.
    pub fn to_jcs(&self) -> Vec<u8> {
        let event = self.event.to_jcs();
        let mut out = Vec::with_capacity(event.len() + ENVELOPE_OVERHEAD);
        out.extend_from_slice(b"{\"event\":");
        out.extend_from_slice(&event);
        out.extend_from_slice(b",\"hash\":\"");
        out.extend_from_slice(self.hash.to_string().as_bytes());
        out.extend_from_slice(b"\",\"signature\":\"");
        out.extend_from_slice(b64(&self.signature).as_bytes());
        out.extend_from_slice(b"\"}");
        out
    }

    /// Length of [`Envelope::to_jcs`] without serializing (size limits are measured on it).
    pub fn jcs_len(&self) -> usize {
        self.event_jcs_len + ENVELOPE_OVERHEAD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_jcs_matches_the_generic_serializer() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let event = Event {
            protocol: "p/1".into(),
            event_type: "t.x".into(),
            actor: AgentId::of(&key),
            created_at: 5,
            nonce: 6,
            payload: Value::Object(Object::new().with("é", "\u{1}").with("B", 1i64)),
            extensions: Object::new().with("room_id", "r"),
        };
        assert_eq!(event.to_jcs(), json::to_jcs(&event.to_value()));
        let env = event.sign(&key).unwrap();
        assert_eq!(env.to_jcs(), json::to_jcs(&env.to_value()));
        assert_eq!(env.jcs_len(), env.to_jcs().len());
        assert_eq!(Envelope::parse(&env.to_jcs(), &["room_id"]), Ok(env.clone()));
        assert!(matches!(Envelope::parse(&env.to_jcs(), &[]), Err(EnvelopeError::Shape(_))));
    }

    #[test]
    fn signing_refuses_out_of_range_fields() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let base = Event {
            protocol: "p/1".into(),
            event_type: "t.x".into(),
            actor: AgentId::of(&key),
            created_at: 5,
            nonce: 6,
            payload: Value::Null,
            extensions: Object::new(),
        };
        assert!(Event { nonce: 0, ..base.clone() }.sign(&key).is_err());
        assert!(Event { created_at: -1, ..base.clone() }.sign(&key).is_err());
        assert!(Event { extensions: Object::new().with("nonce", 1i64), ..base.clone() }.sign(&key).is_err());
        assert_eq!(base.clone().sign(&SigningKey::from_bytes(&[4; 32])), Err(EnvelopeError::WrongSigner));
    }
}
