//! ASNET/1 (Agent Society Network), sans-io: an email command service that proves control of a
//! sender's mailbox with single-use challenges and keeps a graph of consented connections.
//!
//! Message flow:
//! - a trusted transport adapter ([`mime`] for RFC 5322 mail over SMTP) turns one inbound mail
//!   into an [`EnvelopeIn`]: bare sender, actual recipient, provider delivery id,
//!   `Auto-Submitted`, decoded body;
//! - [`service::receive`] drops self-sent and automatic mail, deduplicates the delivery id for
//!   24 h, applies the rolling-hour budgets, parses the body strictly ([`command`]) and runs it;
//! - a protected command (`REGISTER`, `CONNECT`, `ACCEPT`, `LIST CONNECTIONS`, `DISCONNECT`)
//!   only issues a `CHALLENGE` to the sender's mailbox, bound to that mailbox and the exact action,
//!   stored as a hash; `VERIFY` from the same mailbox consumes it and then runs the action;
//! - `LOOKUP` is public and answered at once with minimal metadata, never a mailbox;
//! - every reply is an [`service::Reply`] in the returned outbox; [`outbox`] decides when the
//!   caller may send it (pacing, retries with backoff, 15-minute expiry). Rejections never mail.
//!
//! Nothing here awaits, reads a clock or performs I/O: `now`, randomness and storage
//! ([`store::Store`]) are parameters; the caller commits each `receive` in one transaction.

pub mod client;
pub mod command;
pub mod mime;
pub mod outbox;
pub mod service;
pub mod store;
#[cfg(test)]
mod tests;

use std::fmt;

use crate::util::{Rng, hex};

pub use command::{Action, Command, CommandError};
pub use service::{Config, EnvelopeIn, Limits, Outcome, Reason, Reply, ReplyBody, Status, receive};
pub use store::{MemoryStore, Store};

/// The protocol identifier; any other value fails closed.
pub const PROTOCOL: &str = "ASNET/1";
/// One minute in milliseconds.
pub const MINUTE_MS: i64 = 60_000;
/// One hour in milliseconds.
pub const HOUR_MS: i64 = 60 * MINUTE_MS;
/// One day in milliseconds.
pub const DAY_MS: i64 = 24 * HOUR_MS;
/// How long a challenge can be redeemed.
pub const CHALLENGE_TTL_MS: i64 = 15 * MINUTE_MS;
/// Incorrect well-formed code guesses a challenge accepts before it is locked.
pub const MAX_WRONG_GUESSES: u32 = 5;
/// How long a connection offer waits for the invitee.
pub const OFFER_TTL_MS: i64 = DAY_MS;
/// How long a delivery id is remembered.
pub const DELIVERY_DEDUP_MS: i64 = DAY_MS;
/// The rolling window of the inbound budgets.
pub const BUDGET_WINDOW_MS: i64 = HOUR_MS;
/// How long a queued reply may wait before it is discarded.
pub const REPLY_TTL_MS: i64 = 15 * MINUTE_MS;
/// Largest command body in bytes (checked before parsing).
pub const MAX_BODY_BYTES: usize = 4096;
/// Longest delivery id accepted from the transport adapter.
pub const MAX_DELIVERY_ID_BYTES: usize = 256;

/// Why an identifier, code or address was refused. The sender's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Not `mem_` + 32 lowercase hex.
    #[error("not a member id")]
    MemberId,
    /// Not `chl_` + 32 lowercase hex.
    #[error("not a challenge id")]
    ChallengeId,
    /// Not `req_` + 32 lowercase hex.
    #[error("not a request id")]
    RequestId,
    /// Not `rsp_` + 32 lowercase hex.
    #[error("not a response id")]
    ResponseId,
    /// Not 32 lowercase hex.
    #[error("not a challenge code")]
    Code,
    /// Not one of the defined scopes.
    #[error("unknown scope")]
    Scope,
    /// Not a bare ASCII `local@domain` mailbox.
    #[error("not a bare ASCII mailbox")]
    Mailbox,
    /// Empty, too long or not printable ASCII.
    #[error("not a delivery id")]
    DeliveryId,
}

/// Parses `prefix` followed by 32 lowercase hex characters.
fn parse_prefixed_hex(text: &str, prefix: &str) -> Option<[u8; 16]> {
    let digits = text.strip_prefix(prefix)?;
    parse_hex16(digits)
}

/// Parses exactly 32 lowercase hex characters.
fn parse_hex16(digits: &str) -> Option<[u8; 16]> {
    if digits.len() != 32 || !digits.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let bytes = crate::util::hex_decode(digits)?;
    bytes.try_into().ok()
}

macro_rules! random_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $err:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub [u8; 16]);

        impl $name {
            /// The textual prefix.
            pub const PREFIX: &'static str = $prefix;

            /// 128 fresh bits from the CSPRNG.
            pub fn random(rng: &mut dyn Rng) -> Self {
                let mut b = [0u8; 16];
                rng.fill(&mut b);
                Self(b)
            }

            /// Parses the exact textual form (prefix and 32 lowercase hex characters).
            pub fn parse(text: &str) -> Result<Self, FormatError> {
                parse_prefixed_hex(text, $prefix).map(Self).ok_or(FormatError::$err)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", $prefix, hex(&self.0))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{self}")
            }
        }
    };
}

random_id!(
    /// A stable member id, `mem_` + 32 lowercase hex.
    MemberId,
    "mem_",
    MemberId
);
random_id!(
    /// A challenge id, `chl_` + 32 lowercase hex.
    ChallengeId,
    "chl_",
    ChallengeId
);
random_id!(
    /// A connection offer (request) id, `req_` + 32 lowercase hex.
    RequestId,
    "req_",
    RequestId
);
random_id!(
    /// A reply's stable response id, `rsp_` + 32 lowercase hex (`X-ASNET-Response-ID`).
    ResponseId,
    "rsp_",
    ResponseId
);

impl MemberId {
    /// The public discovery marker, `agent-society:v1:<memberId>`.
    pub fn marker(&self) -> String {
        format!("agent-society:v1:{self}")
    }
}

/// A challenge code: 32 lowercase hex characters (128 CSPRNG bits). Only its hash is stored.
#[derive(Clone, PartialEq, Eq)]
pub struct Code([u8; 16]);

impl Code {
    /// 128 fresh bits from the CSPRNG.
    pub fn random(rng: &mut dyn Rng) -> Self {
        let mut b = [0u8; 16];
        rng.fill(&mut b);
        Self(b)
    }

    /// Parses exactly 32 lowercase hex characters.
    pub fn parse(text: &str) -> Result<Self, FormatError> {
        parse_hex16(text).map(Self).ok_or(FormatError::Code)
    }

    /// The stored form: SHA-256 over a domain label, the challenge id and the code. The code has
    /// 128 random bits, so a fast hash suffices; binding the id stops reuse across challenges.
    pub fn hash(&self, challenge: &ChallengeId) -> [u8; 32] {
        let mut input = Vec::with_capacity(64);
        input.extend_from_slice(b"ASNET/1 challenge code\0");
        input.extend_from_slice(&challenge.0);
        input.extend_from_slice(&self.0);
        crate::util::sha256(&input)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for Code {
    /// Never prints the code: it is a credential.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Code(..)")
    }
}

/// A connection scope. The set is closed: unknown scopes are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// `contact:email`.
    ContactEmail,
    /// `profile:basic`.
    ProfileBasic,
}

impl Scope {
    /// Every defined scope.
    pub const ALL: [Scope; 2] = [Scope::ContactEmail, Scope::ProfileBasic];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::ContactEmail => "contact:email",
            Scope::ProfileBasic => "profile:basic",
        }
    }

    /// Parses a wire name (case-sensitive).
    pub fn parse(text: &str) -> Result<Self, FormatError> {
        Scope::ALL.into_iter().find(|s| s.as_str() == text).ok_or(FormatError::Scope)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A nonempty set of distinct scopes, kept in the order the command gave them (the challenge's
/// action repeats the exact command).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scopes(Vec<Scope>);

impl Scopes {
    /// Checks nonempty and distinct.
    pub fn new(scopes: Vec<Scope>) -> Option<Self> {
        if scopes.is_empty() {
            return None;
        }
        for (i, s) in scopes.iter().enumerate() {
            if scopes.iter().skip(i + 1).any(|t| t == s) {
                return None;
            }
        }
        Some(Self(scopes))
    }

    /// The scopes in their given order.
    pub fn as_slice(&self) -> &[Scope] {
        &self.0
    }

    /// Whether every scope of `self` is in `other`.
    pub fn is_subset_of(&self, other: &Scopes) -> bool {
        self.0.iter().all(|s| other.0.contains(s))
    }

    /// The wire names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|s| s.as_str()).collect()
    }

    /// The wire names joined by commas (a compact storage form).
    pub fn to_csv(&self) -> String {
        self.names().join(",")
    }

    /// Parses the storage form written by [`Scopes::to_csv`].
    pub fn from_csv(text: &str) -> Option<Self> {
        let scopes = text.split(',').map(Scope::parse).collect::<Result<Vec<_>, _>>().ok()?;
        Self::new(scopes)
    }
}

/// A bare ASCII mailbox `local@domain`: dot-atom local part (case, dots and plus tags preserved),
/// DNS domain (lower-cased). No quoted local parts, address literals or Unicode: those need an
/// explicit future policy.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mailbox(String);

/// Longest mailbox (RFC 5321 path limit less the angle brackets).
pub const MAX_MAILBOX_BYTES: usize = 254;

impl Mailbox {
    /// Parses and normalizes (domain case only).
    pub fn parse(text: &str) -> Result<Self, FormatError> {
        if text.is_empty() || text.len() > MAX_MAILBOX_BYTES || !text.is_ascii() {
            return Err(FormatError::Mailbox);
        }
        let (local, domain) = text.split_once('@').ok_or(FormatError::Mailbox)?;
        if !is_dot_atom(local) || local.len() > 64 || !is_dns_domain(domain) {
            return Err(FormatError::Mailbox);
        }
        Ok(Self(format!("{local}@{}", domain.to_ascii_lowercase())))
    }

    /// The normalized text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The (lower-case) domain.
    pub fn domain(&self) -> &str {
        self.0.rsplit_once('@').map(|(_, d)| d).unwrap_or_default()
    }
}

impl fmt::Display for Mailbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mailbox({})", self.0)
    }
}

/// RFC 5322 `atext`.
fn is_atext(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-/=?^_`{|}~".contains(&b)
}

/// RFC 5322 `dot-atom-text`: atoms separated by single dots.
fn is_dot_atom(text: &str) -> bool {
    !text.is_empty() && text.split('.').all(|atom| !atom.is_empty() && atom.bytes().all(is_atext))
}

/// A DNS host name: labels of letters, digits and inner hyphens, 1–63 bytes each, ≤ 253 in all.
fn is_dns_domain(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A provider-controlled delivery id: 1–256 bytes of printable ASCII.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeliveryId(String);

impl DeliveryId {
    /// Checks length and alphabet.
    pub fn parse(text: &str) -> Result<Self, FormatError> {
        if text.is_empty() || text.len() > MAX_DELIVERY_ID_BYTES || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(FormatError::DeliveryId);
        }
        Ok(Self(text.to_owned()))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for DeliveryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeliveryId({})", self.0)
    }
}
