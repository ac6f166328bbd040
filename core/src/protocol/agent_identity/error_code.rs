//! The shared error codes of Agent Identity §8.1, on their own so that every part that reports
//! one ([`super::envelope`], [`super::live_write`], [`super::http`]'s bodies) depends on this
//! leaf, not on each other.

/// The shared error codes of §8.1. Protocols add their own (Mail's are in `agent_mail::relay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The HTTP request, query or body is malformed.
    InvalidRequest,
    /// Event shape is invalid, including unknown fields or non-I-JSON input.
    InvalidEvent,
    /// `hash` does not match the event content.
    InvalidEventHash,
    /// Signature verification failed.
    InvalidSignature,
    /// `actor` is not a valid Agent ID for this operation.
    InvalidActor,
    /// `created_at` is outside the live-write window.
    TimestampOutOfWindow,
    /// `nonce` is not greater than the effective maximum.
    NonceNotGreater,
    /// Request JWT authentication failed.
    InvalidToken,
    /// The authenticated or signing party lacks permission.
    PermissionDenied,
    /// The resource does not exist or is not visible.
    NotFound,
    /// A rate limit or quota was exceeded.
    RateLimited,
    /// The body or payload exceeds a published limit.
    PayloadTooLarge,
}

impl ErrorCode {
    /// Every shared code.
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::InvalidRequest,
        ErrorCode::InvalidEvent,
        ErrorCode::InvalidEventHash,
        ErrorCode::InvalidSignature,
        ErrorCode::InvalidActor,
        ErrorCode::TimestampOutOfWindow,
        ErrorCode::NonceNotGreater,
        ErrorCode::InvalidToken,
        ErrorCode::PermissionDenied,
        ErrorCode::NotFound,
        ErrorCode::RateLimited,
        ErrorCode::PayloadTooLarge,
    ];

    /// The wire string.
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::InvalidEvent => "invalid_event",
            ErrorCode::InvalidEventHash => "invalid_event_hash",
            ErrorCode::InvalidSignature => "invalid_signature",
            ErrorCode::InvalidActor => "invalid_actor",
            ErrorCode::TimestampOutOfWindow => "timestamp_out_of_window",
            ErrorCode::NonceNotGreater => "nonce_not_greater",
            ErrorCode::InvalidToken => "invalid_token",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::NotFound => "not_found",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::PayloadTooLarge => "payload_too_large",
        }
    }

    /// The code for a wire string.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == text)
    }

    /// The HTTP status a service should use. Identity fixes no statuses; these are the
    /// conventional ones (4xx: the client's request is at fault).
    pub fn http_status(&self) -> u16 {
        match self {
            ErrorCode::InvalidRequest
            | ErrorCode::InvalidEvent
            | ErrorCode::InvalidEventHash
            | ErrorCode::InvalidSignature
            | ErrorCode::InvalidActor
            | ErrorCode::TimestampOutOfWindow => 400,
            ErrorCode::InvalidToken => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::NonceNotGreater => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::RateLimited => 429,
        }
    }
}
