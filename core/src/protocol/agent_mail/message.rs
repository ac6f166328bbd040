//! Immutable messages (§5): the closed plaintext object, its inert parts, and reply bindings.
//!
//! A message has no inner signature; its sender is authenticated by the packet signature and the
//! HPKE context binding. Parts are data, never instructions: nothing here interprets, fetches or
//! writes what a part contains or names.

use super::card::{CardError, MailboxCard};
use super::{Id16, MAX_TTL_MS};
use crate::protocol::agent_identity::encoding::b64;
use crate::protocol::agent_identity::json::{self, JsonError, Object, Value};
use crate::protocol::agent_identity::shape::{self, ShapeError};
use crate::protocol::agent_identity::{AgentId, ErrorCode, Hash32};
use crate::util::Rng;

/// Most parts a message may carry.
pub const MAX_PARTS: usize = 32;
/// Longest subject, in Unicode scalar values.
pub const MAX_SUBJECT_CHARS: usize = 1024;
/// Longest part name, in Unicode scalar values.
pub const MAX_NAME_CHARS: usize = 255;
/// Longest media type.
pub const MAX_MEDIA_TYPE_LEN: usize = 127;

const REQUIRED: [&str; 7] = ["message_id", "from", "created_at", "to", "expires_at", "thread_id", "parts"];
const OPTIONAL: [&str; 3] = ["subject", "in_reply_to", "reply_card"];

/// One content part: opaque bytes with a media type and an optional display name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Lower-case `type/subtype`, no parameters.
    pub media_type: String,
    /// The content bytes (may be empty).
    pub data: Vec<u8>,
    /// An inert display filename, never an instruction to write a file.
    pub name: Option<String>,
}

impl Part {
    /// A `text/plain` part.
    pub fn text(text: &str) -> Self {
        Self { media_type: "text/plain".into(), data: text.as_bytes().to_vec(), name: None }
    }

    /// An opaque part.
    pub fn bytes(media_type: &str, data: Vec<u8>, name: Option<&str>) -> Self {
        Self { media_type: media_type.into(), data, name: name.map(str::to_owned) }
    }

    /// Whether this is a `text/*` part.
    pub fn is_text(&self) -> bool {
        self.media_type.starts_with("text/")
    }

    /// The text of a `text/*` part (validated UTF-8 in a validated message).
    pub fn as_text(&self) -> Option<&str> {
        if self.is_text() { std::str::from_utf8(&self.data).ok() } else { None }
    }

    /// The name made safe to show or to offer as a download name: path separators, control
    /// characters and leading dots replaced, so it can never address a path.
    pub fn display_name(&self) -> Option<String> {
        self.name.as_deref().map(inert_name)
    }

    fn to_value(&self) -> Value {
        let mut obj = Object::new().with("media_type", self.media_type.as_str()).with("data", b64(&self.data));
        if let Some(name) = &self.name {
            obj.insert("name", Value::from(name.as_str()));
        }
        Value::Object(obj)
    }

    fn validate(&self, index: usize) -> Result<(), MessageError> {
        if !is_media_type(&self.media_type) {
            return Err(MessageError::MediaType(index));
        }
        if self.is_text() && std::str::from_utf8(&self.data).is_err() {
            return Err(MessageError::TextEncoding(index));
        }
        if let Some(name) = &self.name
            && !(1..=MAX_NAME_CHARS).contains(&name.chars().count())
        {
            return Err(MessageError::Name(index));
        }
        Ok(())
    }
}

/// A peer's part name made safe to show or to offer as a download name: path separators,
/// control characters and a leading dot replaced, so it can never address a path.
pub fn inert_name(name: &str) -> String {
    let cleaned: String = name.chars().map(|c| if c == '/' || c == '\\' || c.is_control() { '_' } else { c }).collect();
    match cleaned.strip_prefix('.') {
        Some(rest) => format!("_{rest}"),
        None => cleaned,
    }
}

/// `[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*`, at most 127 characters.
pub fn is_media_type(text: &str) -> bool {
    fn token(t: &str) -> bool {
        let mut bytes = t.bytes();
        bytes.next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$&^_.+-".contains(&b))
    }
    text.len() <= MAX_MEDIA_TYPE_LEN && text.split_once('/').is_some_and(|(t, s)| token(t) && token(s))
}

/// An immutable message (`MailMessagePayload`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Stable logical ID; fresh for every new logical message.
    pub message_id: Id16,
    /// The sender (must equal the packet's actor).
    pub from: AgentId,
    /// Original creation time.
    pub created_at: i64,
    /// Exactly one recipient (a bare Agent ID, never an address).
    pub to: AgentId,
    /// Acceptance deadline.
    pub expires_at: i64,
    /// Thread; replies keep the initiator's.
    pub thread_id: Id16,
    /// One to 32 parts, in order.
    pub parts: Vec<Part>,
    /// Optional subject.
    pub subject: Option<String>,
    /// The parent's `message_id`, for replies.
    pub in_reply_to: Option<Id16>,
    /// A card of the sender's for replies (must be signed by `from`).
    pub reply_card: Option<MailboxCard>,
}

/// Why a message is invalid (the sender's fault when received; a local mistake when building).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// Not strict I-JSON.
    #[error("message is not strict I-JSON: {0}")]
    Json(#[from] JsonError),
    /// Missing, unknown or mistyped members (including `null`).
    #[error("invalid message: {0}")]
    Shape(#[from] ShapeError),
    /// Violates `created_at < expires_at <= created_at + MAX_TTL`.
    #[error("message lifetime must be positive and at most 30 days")]
    Lifetime,
    /// Not one to 32 parts.
    #[error("a message has one to 32 parts")]
    PartCount,
    /// Part `n` has an invalid media type.
    #[error("part {0} has an invalid media type")]
    MediaType(usize),
    /// Text part `n` is not UTF-8.
    #[error("text part {0} is not valid UTF-8")]
    TextEncoding(usize),
    /// Part `n` has an empty or over-long name.
    #[error("part {0} name must have 1 to 255 characters")]
    Name(usize),
    /// Subject longer than 1024 characters.
    #[error("subject longer than 1024 characters")]
    Subject,
    /// The reply card does not verify or is malformed.
    #[error("reply card: {0}")]
    ReplyCard(CardError),
    /// The reply card is signed by someone other than `from`.
    #[error("reply card is not the sender's")]
    ReplyCardOwner,
}

impl MessageError {
    /// The wire error code (always `invalid_event` for a packet carrying it).
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InvalidEvent
    }
}

impl Message {
    /// A new message with fresh random `message_id` and `thread_id`.
    pub fn new(
        rng: &mut dyn Rng,
        from: AgentId,
        to: AgentId,
        created_at: i64,
        expires_at: i64,
        parts: Vec<Part>,
    ) -> Self {
        Self {
            message_id: Id16::random(rng),
            from,
            created_at,
            to,
            expires_at,
            thread_id: Id16::random(rng),
            parts,
            subject: None,
            in_reply_to: None,
            reply_card: None,
        }
    }

    /// A reply to `parent` with every binding of §5.2: swapped `from`/`to`, `in_reply_to` the
    /// parent's `message_id`, the parent's `thread_id`, and a fresh `message_id`.
    pub fn reply(parent: &Message, rng: &mut dyn Rng, created_at: i64, expires_at: i64, parts: Vec<Part>) -> Self {
        Self {
            message_id: Id16::random(rng),
            from: parent.to,
            created_at,
            to: parent.from,
            expires_at,
            thread_id: parent.thread_id,
            parts,
            subject: None,
            in_reply_to: Some(parent.message_id),
            reply_card: None,
        }
    }

    /// Checks every rule of §5.1 that does not depend on the packet or the clock.
    pub fn validate(&self) -> Result<(), MessageError> {
        if !(self.created_at < self.expires_at && self.expires_at <= self.created_at.saturating_add(MAX_TTL_MS)) {
            return Err(MessageError::Lifetime);
        }
        if !(1..=MAX_PARTS).contains(&self.parts.len()) {
            return Err(MessageError::PartCount);
        }
        for (i, part) in self.parts.iter().enumerate() {
            part.validate(i)?;
        }
        if self.subject.as_ref().is_some_and(|s| s.chars().count() > MAX_SUBJECT_CHARS) {
            return Err(MessageError::Subject);
        }
        if self.reply_card.as_ref().is_some_and(|c| *c.owner() != self.from) {
            return Err(MessageError::ReplyCardOwner);
        }
        Ok(())
    }

    /// The message as JSON.
    pub fn to_value(&self) -> Value {
        let mut obj = Object::new()
            .with("message_id", self.message_id.to_string())
            .with("from", self.from.to_string())
            .with("created_at", self.created_at)
            .with("to", self.to.to_string())
            .with("expires_at", self.expires_at)
            .with("thread_id", self.thread_id.to_string())
            .with("parts", Value::Array(self.parts.iter().map(Part::to_value).collect()));
        if let Some(subject) = &self.subject {
            obj.insert("subject", Value::from(subject.as_str()));
        }
        if let Some(parent) = &self.in_reply_to {
            obj.insert("in_reply_to", Value::from(parent.to_string()));
        }
        if let Some(card) = &self.reply_card {
            obj.insert("reply_card", card.to_value());
        }
        Value::Object(obj)
    }

    /// `JCS(message)`, the bytes that are framed and encrypted.
    pub fn to_jcs(&self) -> Vec<u8> {
        json::to_jcs(&self.to_value())
    }

    /// The content commitment used for deduplication: `SHA3-256(JCS(message))`.
    pub fn content_hash(&self) -> Hash32 {
        Hash32::of(&self.to_jcs())
    }

    /// Parses and validates a message from strict JSON bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, MessageError> {
        Self::from_value(&json::parse(bytes)?)
    }

    /// Reads and validates a message from a parsed value (closed object, no `null`).
    pub fn from_value(value: &Value) -> Result<Self, MessageError> {
        let obj = shape::object(value, "")?;
        shape::closed(obj, "", &REQUIRED, &OPTIONAL)?;
        let id = |key: &str| -> Result<Id16, MessageError> {
            Id16::parse(shape::string(obj, "", key)?).ok_or_else(|| ShapeError::new(key, "not an id16").into())
        };
        let agent = |key: &str| -> Result<AgentId, MessageError> {
            AgentId::parse(shape::string(obj, "", key)?).map_err(|e| ShapeError::new(key, e.to_string()).into())
        };
        let mut parts = Vec::new();
        for (i, p) in shape::array(obj, "", "parts")?.iter().enumerate() {
            let field = format!("parts[{i}]");
            let p = shape::object(p, &field)?;
            shape::closed(p, &field, &["media_type", "data"], &["name"])?;
            let name = match p.get("name") {
                None => None,
                Some(_) => Some(shape::string(p, &field, "name")?.to_owned()),
            };
            parts.push(Part {
                media_type: shape::string(p, &field, "media_type")?.to_owned(),
                data: shape::bytes(p, &field, "data")?,
                name,
            });
        }
        let subject = match obj.get("subject") {
            None => None,
            Some(_) => Some(shape::string(obj, "", "subject")?.to_owned()),
        };
        let in_reply_to = match obj.get("in_reply_to") {
            None => None,
            Some(_) => Some(id("in_reply_to")?),
        };
        let reply_card = match obj.get("reply_card") {
            None => None,
            Some(card) => Some(MailboxCard::from_value(card).map_err(MessageError::ReplyCard)?),
        };
        let message = Self {
            message_id: id("message_id")?,
            from: agent("from")?,
            created_at: shape::timestamp(obj, "", "created_at")?,
            to: agent("to")?,
            expires_at: shape::timestamp(obj, "", "expires_at")?,
            thread_id: id("thread_id")?,
            parts,
            subject,
            in_reply_to,
            reply_card,
        };
        message.validate()?;
        Ok(message)
    }
}

/// A reply that does not match its parent (§5.2); do not link it into the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// `in_reply_to` is absent or names another message.
    #[error("reply does not name the parent message")]
    Parent,
    /// `from`/`to` are not the parent's `to`/`from`.
    #[error("reply parties are not the parent's, swapped")]
    Parties,
    /// `thread_id` differs from the parent's.
    #[error("reply is in another thread")]
    Thread,
}

/// Checks a reply's bindings against a known parent before linking a thread.
pub fn check_reply(parent: &Message, reply: &Message) -> Result<(), ReplyError> {
    if reply.in_reply_to != Some(parent.message_id) {
        return Err(ReplyError::Parent);
    }
    if reply.to != parent.from || reply.from != parent.to {
        return Err(ReplyError::Parties);
    }
    if reply.thread_id != parent.thread_id {
        return Err(ReplyError::Thread);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_follow_the_grammar() {
        for ok in ["text/plain", "application/octet-stream", "image/svg+xml", "a/b", "x-1/y.z"] {
            assert!(is_media_type(ok), "{ok}");
        }
        for bad in ["Text/plain", "text/plain; charset=utf-8", "text", "/plain", "text/", "-a/b", "a/b/c"] {
            assert!(!is_media_type(bad), "{bad}");
        }
        assert!(!is_media_type(&format!("a/{}", "b".repeat(126))));
        assert!(is_media_type(&format!("a/{}", "b".repeat(125))));
    }

    #[test]
    fn display_names_are_inert() {
        let part = Part::bytes("application/octet-stream", vec![], Some("../../etc/passwd"));
        assert_eq!(part.display_name().as_deref(), Some("_._.._etc_passwd"));
        let part = Part::bytes("application/octet-stream", vec![], Some(".bashrc"));
        assert_eq!(part.display_name().as_deref(), Some("_bashrc"));
    }
}
