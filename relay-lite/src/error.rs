//! The relay's one error type, and the one place that maps errors to HTTP status codes and the
//! JSON body `{"error": code, "message": text}` ([`wire::ErrorBody`]).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use switchboard_core::protocol::letagents::relay_auth::AuthError;
use switchboard_core::protocol::letagents::wire;

use crate::store::StoreError;

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
    /// The relay is shutting down (relay's state, nobody's fault): `503`.
    #[error("relay is shutting down")]
    Unavailable,
    /// The store failed (relay's fault): `500`; details are logged, not sent.
    #[error("internal error")]
    Store(#[source] StoreError),
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Closed => Self::Unavailable,
            other => Self::Store(other),
        }
    }
}

impl Error {
    /// Status code and machine-readable code.
    fn status(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::NoMailbox | Self::NoRoute => (StatusCode::NOT_FOUND, "not_found"),
            Self::Auth(AuthError::Param(_)) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::Auth(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Self::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Self::MailboxFull => (StatusCode::INSUFFICIENT_STORAGE, "mailbox_full"),
            Self::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        if let Self::Store(e) = &self {
            tracing::error!(error = %e, "store failure");
        }
        let (status, code) = self.status();
        let body = wire::ErrorBody { error: code.to_owned(), message: self.to_string() };
        let mut response = (status, Json(body)).into_response();
        if let Self::RateLimited { retry_after_secs } = self {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
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
    fn malformed_auth_parameter_is_400_bad_signature_is_401() {
        assert_eq!(Error::Auth(AuthError::Param("ts")).status().0, StatusCode::BAD_REQUEST);
        assert_eq!(Error::Auth(AuthError::BadSignature).status().0, StatusCode::UNAUTHORIZED);
    }
}
