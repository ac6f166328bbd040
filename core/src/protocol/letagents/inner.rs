//! The signed `inner` message: its fields, kinds and the body each kind must carry.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::address::{Address, PeerKeys};

/// Message kinds of letagents v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Agent text.
    Send,
    /// Agent text that expects a reply.
    Ask,
    /// The answer to an `ask`; `reply_to` names it.
    Reply,
    /// Asks the recipient's daemon who is online.
    List,
    /// The set of local agents; the answer to `list`, or unsolicited presence.
    Roster,
    /// What happened to a send/ask/list.
    Receipt,
    /// A contact request from an unknown device, carrying its full address.
    Hello,
}

impl Kind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Send => "send",
            Kind::Ask => "ask",
            Kind::Reply => "reply",
            Kind::List => "list",
            Kind::Roster => "roster",
            Kind::Receipt => "receipt",
            Kind::Hello => "hello",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "send" => Kind::Send,
            "ask" => Kind::Ask,
            "reply" => Kind::Reply,
            "list" => Kind::List,
            "roster" => Kind::Roster,
            "receipt" => Kind::Receipt,
            "hello" => Kind::Hello,
            _ => return None,
        })
    }

    /// Kinds a contact's allow list can name.
    pub const ALLOWABLE: [Kind; 4] = [Kind::Send, Kind::Ask, Kind::Reply, Kind::List];

    /// Whether a receipt is owed for this kind when it comes from a known contact.
    pub fn wants_receipt(self) -> bool {
        matches!(self, Kind::Send | Kind::Ask | Kind::List)
    }
}

/// Receipt status values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReceiptStatus {
    /// Handed to a live agent.
    Pushed,
    /// Stored for an agent to pick up.
    Queued,
    /// Refused by the recipient's rules.
    Refused,
}

/// A roster entry: one agent on the sender's machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RosterEntry {
    /// The agent's name.
    pub name: String,
    /// Which harness runs it (claude-code, codex, mcp, cli...).
    pub harness: String,
    /// online, idle, offline.
    pub status: String,
    /// Where it runs (`<machine>/<agent>` or a free-form place).
    #[serde(rename = "where")]
    pub where_: String,
}

/// A receipt body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptBody {
    /// What happened.
    pub status: ReceiptStatus,
    /// Human-readable detail.
    #[serde(default)]
    pub detail: String,
}

/// The `inner` object exactly as it travels. Unknown fields are tolerated (forward
/// compatibility); every known field is type-checked by serde and then by [`Inner::validate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inner {
    /// Protocol version, always 1.
    pub v: u64,
    /// Sender address without drop (with drop for `hello`).
    pub from: String,
    /// Recipient mailbox id.
    pub to: String,
    /// Unix milliseconds.
    pub ts: i64,
    /// UUID v4, lower case.
    pub id: String,
    /// Message kind (kept as text until validated, so an unknown kind is a clear error).
    pub kind: String,
    /// The message this one answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// The sending agent on the sender's machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_agent: Option<String>,
    /// The target agent on the recipient's machine (v0.2 called it `session`).
    #[serde(default, alias = "session", skip_serializing_if = "Option::is_none")]
    pub to_agent: Option<String>,
    /// Kind-specific body.
    pub body: Value,
    /// Only on a `hello` to a known contact: the sender's profile now receives at this relay (a
    /// Switchboard profile decision, `docs/relay-move.md`; plain letagents clients ignore the
    /// unknown field and refresh the address as for any hello). Covered by the signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<MovedTo>,
}

/// Where a contact's profile moved: its new relay, and that relay's certificate pin when it is
/// self-signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedTo {
    /// The relay's URL (`https://…`, or `http://` on loopback).
    pub url: String,
    /// SHA-256 of the relay's certificate (64 hex digits), for a self-signed relay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_sha256: Option<String>,
}

/// Longest relay URL a move notice may carry.
pub const MAX_MOVED_URL: usize = 512;

impl MovedTo {
    /// The certificate pin, parsed.
    pub fn pin(&self) -> Result<Option<[u8; 32]>, InnerError> {
        let Some(hex) = &self.cert_sha256 else { return Ok(None) };
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(InnerError::MovedTo);
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            let pair = hex.get(2 * i..2 * i + 2).ok_or(InnerError::MovedTo)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| InnerError::MovedTo)?;
        }
        Ok(Some(out))
    }

    fn check(&self) -> Result<(), InnerError> {
        let scheme_ok = self.url.starts_with("https://") || self.url.starts_with("http://");
        if !scheme_ok || self.url.len() > MAX_MOVED_URL || self.url.chars().any(char::is_control) {
            return Err(InnerError::MovedTo);
        }
        self.pin().map(|_| ())
    }
}

/// Why an `inner` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InnerError {
    /// `v` is not 1.
    #[error("unsupported version {0}")]
    Version(u64),
    /// Unknown `kind`.
    #[error("unknown kind `{0}`")]
    Kind(String),
    /// `id` or `reply_to` is not a lower-case UUID.
    #[error("`{0}` is not a lower-case UUID")]
    Id(&'static str),
    /// `from` is not an address of the right form for this kind.
    #[error("`from` is not a valid sender address for this kind")]
    From,
    /// The body does not have the type this kind requires.
    #[error("body does not match kind `{0}`")]
    Body(&'static str),
    /// `reply_to` missing where the kind needs it.
    #[error("`reply_to` is required for kind `{0}`")]
    ReplyTo(&'static str),
    /// An agent name is empty or too long.
    #[error("agent name is empty, too long or has control characters")]
    AgentName,
    /// `moved_to` on another kind than `hello`, or not a relay URL and certificate hash.
    #[error("`moved_to` is only a relay URL (and certificate SHA-256) on a hello")]
    MovedTo,
}

/// Largest agent name accepted.
pub const MAX_AGENT_NAME: usize = 128;

/// Whether `s` is a canonical lower-case hyphenated UUID.
pub fn is_uuid(s: &str) -> bool {
    s.len() == 36 && uuid::Uuid::parse_str(s).is_ok_and(|u| u.hyphenated().to_string() == s)
}

fn valid_agent_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_AGENT_NAME && !name.chars().any(char::is_control)
}

impl Inner {
    /// Checks every field against its kind and returns the kind and the sender's address.
    pub fn validate(&self) -> Result<(Kind, Address), InnerError> {
        if self.v != 1 {
            return Err(InnerError::Version(self.v));
        }
        let kind = Kind::parse(&self.kind).ok_or_else(|| InnerError::Kind(self.kind.clone()))?;
        if !is_uuid(&self.id) {
            return Err(InnerError::Id("id"));
        }
        if let Some(r) = &self.reply_to
            && !is_uuid(r)
        {
            return Err(InnerError::Id("reply_to"));
        }
        for name in [&self.from_agent, &self.to_agent].into_iter().flatten() {
            if !valid_agent_name(name) {
                return Err(InnerError::AgentName);
            }
        }
        let from = Address::parse(&self.from).map_err(|_| InnerError::From)?;
        // Only a hello carries the drop code; everything else uses the address without it.
        if (kind == Kind::Hello) != from.drop.is_some() {
            return Err(InnerError::From);
        }
        match kind {
            Kind::Send | Kind::Ask | Kind::Reply | Kind::Hello => {
                if !self.body.is_string() {
                    return Err(InnerError::Body(kind.as_str()));
                }
            }
            Kind::List => {
                if self.body.as_str() != Some("") {
                    return Err(InnerError::Body("list"));
                }
            }
            Kind::Roster => {
                serde_json::from_value::<Vec<RosterEntry>>(self.body.clone())
                    .map_err(|_| InnerError::Body("roster"))?;
            }
            Kind::Receipt => {
                serde_json::from_value::<ReceiptBody>(self.body.clone()).map_err(|_| InnerError::Body("receipt"))?;
            }
        }
        if matches!(kind, Kind::Reply | Kind::Receipt) && self.reply_to.is_none() {
            return Err(InnerError::ReplyTo(kind.as_str()));
        }
        if let Some(m) = &self.moved_to {
            if kind != Kind::Hello {
                return Err(InnerError::MovedTo);
            }
            m.check()?;
        }
        Ok((kind, from))
    }

    /// Builds a new message from `sender` to `recipient`.
    pub fn new(sender: &PeerKeys, recipient_id: &str, ts: i64, id: uuid::Uuid, kind: Kind, body: Value) -> Self {
        Self {
            v: 1,
            from: sender.address_without_drop(),
            to: recipient_id.to_owned(),
            ts,
            id: id.hyphenated().to_string(),
            kind: kind.as_str().to_owned(),
            reply_to: None,
            from_agent: None,
            to_agent: None,
            body,
            moved_to: None,
        }
    }

    /// The body as text, for the kinds whose body is a string.
    pub fn text(&self) -> &str {
        self.body.as_str().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(kind: Kind, body: Value) -> Inner {
        let keys = PeerKeys { sig: [1; 32], boxk: [2; 32] };
        Inner::new(&keys, "to", 1, uuid::Uuid::from_bytes([7; 16]), kind, body)
    }

    #[test]
    fn a_move_notice_rides_only_on_a_hello_and_names_a_relay() {
        let moved =
            |url: &str, cert: Option<&str>| Some(MovedTo { url: url.into(), cert_sha256: cert.map(Into::into) });
        let mut send = sample(Kind::Send, "hi".into());
        send.moved_to = moved("https://b.example", None);
        assert_eq!(send.validate(), Err(InnerError::MovedTo));
        let keys = PeerKeys { sig: [1; 32], boxk: [2; 32] };
        let mut hello = sample(Kind::Hello, "alice".into());
        hello.from = Address { keys, drop: Some([3; 16]) }.to_string();
        assert!(hello.validate().is_ok());
        hello.moved_to = moved("https://b.example", Some(&"ab".repeat(32)));
        assert!(hello.validate().is_ok());
        assert_eq!(hello.moved_to.as_ref().unwrap().pin(), Ok(Some([0xab; 32])));
        for (url, cert) in [("ftp://b.example", None), ("https://b.example", Some("abc")), ("https://b\n", None)] {
            hello.moved_to = moved(url, cert);
            assert_eq!(hello.validate(), Err(InnerError::MovedTo), "{url}");
        }
        // Absent, the field is not serialized: a plain hello's bytes are unchanged.
        hello.moved_to = None;
        assert!(!serde_json::to_string(&hello).unwrap().contains("moved_to"));
    }

    #[test]
    fn bodies_are_checked_per_kind() {
        assert!(sample(Kind::Send, "hi".into()).validate().is_ok());
        assert_eq!(sample(Kind::Send, 3.into()).validate(), Err(InnerError::Body("send")));
        assert_eq!(sample(Kind::List, "x".into()).validate(), Err(InnerError::Body("list")));
        let mut r = sample(Kind::Receipt, serde_json::json!({"status": "queued", "detail": ""}));
        assert_eq!(r.validate(), Err(InnerError::ReplyTo("receipt")));
        r.reply_to = Some(r.id.clone());
        assert!(r.validate().is_ok());
        let bad_roster = sample(Kind::Roster, serde_json::json!([{"name": "a"}]));
        assert_eq!(bad_roster.validate(), Err(InnerError::Body("roster")));
    }

    #[test]
    fn hello_needs_the_drop_and_others_must_not_carry_it() {
        let mut hello = sample(Kind::Hello, "alice".into());
        assert_eq!(hello.validate(), Err(InnerError::From));
        hello.from = format!("{}.{}", hello.from, crate::util::b64u(&[9; 16]));
        assert!(hello.validate().is_ok());
        let mut send = sample(Kind::Send, "x".into());
        send.from = hello.from.clone();
        assert_eq!(send.validate(), Err(InnerError::From));
    }

    #[test]
    fn session_is_read_as_to_agent() {
        let json =
            serde_json::json!({"v":1,"from":"f","to":"t","ts":1,"id":"i","kind":"send","session":"bob","body":""});
        let inner: Inner = serde_json::from_value(json).unwrap();
        assert_eq!(inner.to_agent.as_deref(), Some("bob"));
    }

    #[test]
    fn ids_must_be_lower_case_uuids() {
        let mut m = sample(Kind::Send, "x".into());
        m.id = uuid::Uuid::from_bytes([0xab; 16]).hyphenated().to_string().to_uppercase();
        assert_eq!(m.validate(), Err(InnerError::Id("id")));
    }
}
