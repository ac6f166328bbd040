//! The relay's one error type, and the one place that maps errors to HTTP status codes and the
//! JSON body `{"error": code, "message": text}` ([`wire::ErrorBody`]).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use switchboard_core::protocol::agent_identity::ErrorCode;
use switchboard_core::protocol::agent_mail::relay::{MailCode, RelayError};
use switchboard_core::protocol::letagents::relay_auth::AuthError;
use switchboard_core::protocol::letagents::wire;

use crate::store::StoreError;
use crate::store::agent_mail::Refusal;
use crate::store::stringcup::PendingLimit;

/// Why a request failed; each variant says whose fault it is.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed (client's fault): `400`.
    #[error("{0}")]
    BadRequest(String),
    /// Unknown mailbox, or a wrong drop for an existing one (sender's fault): `404`, and the two
    /// cases are answered byte for byte the same so a sender cannot probe for mailboxes.
    #[error("no such mailbox")]
    NoMailbox,
    /// No route matches (client's fault): `404`.
    #[error("no such endpoint")]
    NoRoute,
    /// A login or ack failed authentication (client's fault): `401`, or `400` for a malformed
    /// parameter.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The envelope is larger than the limit (sender's fault): `413`.
    #[error("envelope larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// Too many sends for the mailbox, or requests from the client's address: `429` with
    /// `Retry-After`.
    #[error("rate limit exceeded; retry in {retry_after_secs} s")]
    RateLimited {
        /// Seconds until a retry can succeed.
        retry_after_secs: u64,
    },
    /// The mailbox holds as many envelopes as it may (its owner's backlog): `507`.
    #[error("mailbox full")]
    MailboxFull,
    /// A request body or a Stringcup ciphertext is larger than its limit (client's fault):
    /// `413`.
    #[error("{what} larger than {limit} bytes")]
    PayloadTooLarge {
        /// What was too large.
        what: &'static str,
        /// The limit in bytes.
        limit: usize,
    },
    /// No valid bearer token (client's fault): `401` with `WWW-Authenticate: Bearer`.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// The named thing does not exist, or is not visible to the caller (client's fault): `404`.
    /// Stringcup answers this, never `403`, wherever a `403` would confirm that something
    /// exists (another identity's message, a topic the caller is not in).
    #[error("{0}")]
    NotFound(&'static str),
    /// The caller may see the thing but not do this to it (a topic member acting as owner):
    /// `403`.
    #[error("{0}")]
    Forbidden(&'static str),
    /// The request conflicts with the current state (client's, or a competitor's): `409`.
    #[error("{}", .0.message())]
    Conflict(Conflict),
    /// An `Idempotency-Key` reused for a different recipient (client's fault): `422`.
    #[error("this Idempotency-Key already names a send to a different recipient; use a fresh key per message")]
    IdempotencyKeyReused,
    /// A Stringcup send would exceed a pending limit (`507`); the code and message say whether
    /// the sender's own share or the recipient's whole inbox is full.
    #[error("{}", pending_message(*.0))]
    PendingFull(PendingLimit),
    /// The relay is shutting down (relay's state, nobody's fault): `503`.
    #[error("relay is shutting down")]
    Unavailable,
    /// The relay is already receiving as many request-body bytes as its memory budget allows
    /// (its load, nobody's fault): `503` with `Retry-After`; nothing was read or stored.
    #[error("the relay is receiving too much at once; nothing was stored; retry in {BUSY_RETRY_AFTER_SECS} s")]
    Busy,
    /// The relay's disk is full, so nothing was stored (the relay's condition, not the
    /// client's): `507` on a send, where letagents and Stringcup define `507` as "not stored,
    /// retry later", `503` elsewhere; both with `Retry-After`. The relay recovers by itself once
    /// space returns.
    #[error("the relay is out of storage; nothing was stored; retry in {STORAGE_RETRY_AFTER_SECS} s")]
    StorageFull {
        /// Whether the request was a send (`507`) rather than another write (`503`).
        send: bool,
    },
    /// The relay's disk failed a read or write, so nothing was stored (relay's fault): `503` with
    /// `Retry-After`.
    #[error("the relay's storage failed; nothing was stored; retry in {STORAGE_RETRY_AFTER_SECS} s")]
    StorageFailed,
    /// The store failed (relay's fault): `500`; details are logged, not sent.
    #[error("internal error")]
    Store(#[source] StoreError),
    /// An Agent Mail 1.0 refusal: the spec's code and status, in Identity's error shape
    /// `{"error": {"code", "message"}}`, with `Max-Seen-Nonce` on nonce refusals.
    #[error("{message}")]
    AgentMail {
        /// The §8 code (its status comes with it).
        code: MailCode,
        /// Human-readable text.
        message: String,
        /// The `Max-Seen-Nonce` header value, if any.
        max_seen_nonce: Option<u64>,
    },
}

impl From<RelayError> for Error {
    fn from(e: RelayError) -> Self {
        Self::AgentMail { code: e.code(), message: e.to_string(), max_seen_nonce: e.max_seen_nonce() }
    }
}

impl From<Refusal> for Error {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Relay(e) => e.into(),
            Refusal::Quota => Self::agent_mail(ErrorCode::RateLimited, "the mailbox's storage quota is exhausted"),
        }
    }
}

impl Error {
    /// An Agent Mail error with an Identity code.
    pub fn agent_mail(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::AgentMail { code: MailCode::Identity(code), message: message.into(), max_seen_nonce: None }
    }
}

/// The `409` cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflict {
    /// Another request with the same `Idempotency-Key` is in flight; back off and retry.
    IdempotencyInFlight,
    /// Another identity holds the rendezvous role; treat the token as compromised.
    RoleTaken,
    /// The topic would exceed its member limit.
    TopicFull(usize),
    /// The owner cannot leave its topic; delete the topic instead.
    OwnerStays,
}

impl Conflict {
    fn code(self) -> &'static str {
        match self {
            Self::IdempotencyInFlight => "idempotency_in_flight",
            Self::RoleTaken => "role_taken",
            Self::TopicFull(_) => "topic_full",
            Self::OwnerStays => "owner_cannot_leave",
        }
    }

    fn message(self) -> String {
        match self {
            Self::IdempotencyInFlight => {
                "a request with this Idempotency-Key is in flight; back off briefly and retry with the same key".into()
            }
            Self::RoleTaken => "another identity holds this rendezvous role; treat the token as compromised and \
                                open a new rendezvous"
                .into(),
            Self::TopicFull(max) => format!("a topic has at most {max} members; nothing was added"),
            Self::OwnerStays => "the owner cannot be removed; delete the topic instead".into(),
        }
    }
}

fn pending_message(limit: PendingLimit) -> String {
    match limit {
        PendingLimit::SenderMessages(n) => format!(
            "your share of this recipient's inbox is full ({n} pending messages from you); the recipient is not \
             behind: slow down and retry once it acknowledges"
        ),
        PendingLimit::SenderBytes(n) => format!(
            "your share of this recipient's inbox is full ({n} pending bytes from you); the recipient is not \
             behind: slow down and retry once it acknowledges"
        ),
        PendingLimit::InboxMessages(n) => format!(
            "the recipient's inbox is full ({n} pending messages from all senders); the recipient is behind: \
             retry once it acknowledges"
        ),
        PendingLimit::InboxBytes(n) => format!(
            "the recipient's inbox is full ({n} pending bytes from all senders); the recipient is behind: retry \
             once it acknowledges"
        ),
    }
}

/// What `Retry-After` says when the relay's disk is full or failing.
pub const STORAGE_RETRY_AFTER_SECS: u64 = 5;

/// `Retry-After` when the request-body budget is spent.
pub const BUSY_RETRY_AFTER_SECS: u64 = 1;

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Closed => Self::Unavailable,
            StoreError::DiskFull(_) => Self::StorageFull { send: false },
            StoreError::Io(_) => Self::StorageFailed,
            other => Self::Store(other),
        }
    }
}

impl Error {
    /// A store failure during a send (letagents `/v1/send`, Stringcup `POST /messages` and
    /// `/messages/batch`): as [`From<StoreError>`], except that a full disk answers `507`.
    pub fn from_send(e: StoreError) -> Self {
        match Self::from(e) {
            Self::StorageFull { .. } => Self::StorageFull { send: true },
            other => other,
        }
    }
}

impl Error {
    /// Status code and machine-readable code.
    pub fn status(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::NoMailbox | Self::NoRoute => (StatusCode::NOT_FOUND, "not_found"),
            Self::Auth(AuthError::Param(_)) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::Auth(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Self::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Self::MailboxFull => (StatusCode::INSUFFICIENT_STORAGE, "mailbox_full"),
            Self::PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Self::Conflict(c) => (StatusCode::CONFLICT, c.code()),
            Self::IdempotencyKeyReused => (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused"),
            Self::PendingFull(limit) if limit.is_per_sender() => {
                (StatusCode::INSUFFICIENT_STORAGE, "sender_share_full")
            }
            Self::PendingFull(_) => (StatusCode::INSUFFICIENT_STORAGE, "inbox_full"),
            Self::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::Busy => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
            Self::StorageFull { send: true } => (StatusCode::INSUFFICIENT_STORAGE, "storage_full"),
            Self::StorageFull { send: false } => (StatusCode::SERVICE_UNAVAILABLE, "storage_full"),
            Self::StorageFailed => (StatusCode::SERVICE_UNAVAILABLE, "storage_failed"),
            Self::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            Self::AgentMail { code, .. } => {
                (StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::BAD_REQUEST), code.as_str())
            }
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        if let Self::Store(e) = &self {
            tracing::error!(error = %e, "store failure");
        }
        let (status, code) = self.status();
        if let Self::AgentMail { message, max_seen_nonce, .. } = &self {
            let body = switchboard_core::protocol::agent_identity::http::ErrorBody::new(code, message.as_str());
            let mut response =
                (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.to_json())
                    .into_response();
            if let Some(n) = max_seen_nonce {
                response.headers_mut().insert("max-seen-nonce", HeaderValue::from(*n));
            }
            return response;
        }
        let body = wire::ErrorBody { error: code.to_owned(), message: self.to_string() };
        let mut response = (status, Json(body)).into_response();
        match self {
            Self::RateLimited { retry_after_secs } => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
            }
            Self::StorageFull { .. } | Self::StorageFailed => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(STORAGE_RETRY_AFTER_SECS));
            }
            Self::Busy => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(BUSY_RETRY_AFTER_SECS));
            }
            Self::Unauthorized(_) => {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rate_limited_carries_retry_after() {
        let r = Error::RateLimited { retry_after_secs: 7 }.into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers().get(header::RETRY_AFTER).unwrap(), "7");
    }

    #[test]
    fn the_two_kinds_of_507_have_different_codes() {
        let sender = Error::PendingFull(PendingLimit::SenderMessages(200));
        let inbox = Error::PendingFull(PendingLimit::InboxBytes(64));
        assert_eq!(sender.status(), (StatusCode::INSUFFICIENT_STORAGE, "sender_share_full"));
        assert_eq!(inbox.status(), (StatusCode::INSUFFICIENT_STORAGE, "inbox_full"));
        assert!(sender.to_string().contains("not behind"));
        assert!(inbox.to_string().contains("is behind"));
    }

    #[test]
    fn a_full_disk_is_507_on_a_send_and_503_elsewhere_both_with_retry_after() {
        let full = || StoreError::DiskFull(std::sync::Arc::new(sqlx::Error::PoolTimedOut));
        let send = Error::from_send(full()).into_response();
        let login = Error::from(full()).into_response();
        assert_eq!(send.status(), StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(login.status(), StatusCode::SERVICE_UNAVAILABLE);
        for r in [&send, &login] {
            assert_eq!(r.headers().get(header::RETRY_AFTER).unwrap(), "5");
        }
        let io = Error::from_send(StoreError::Io(std::sync::Arc::new(sqlx::Error::PoolTimedOut))).into_response();
        assert_eq!(io.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(io.headers().contains_key(header::RETRY_AFTER));
    }

    #[test]
    fn malformed_auth_parameter_is_400_bad_signature_is_401() {
        assert_eq!(Error::Auth(AuthError::Param("ts")).status().0, StatusCode::BAD_REQUEST);
        assert_eq!(Error::Auth(AuthError::BadSignature).status().0, StatusCode::UNAUTHORIZED);
    }
}
