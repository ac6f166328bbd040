//! Relay transports: TLS configuration (web PKI or a pinned self-signed certificate) and the
//! letagents relay client (HTTP send/inbox/ack and the websocket).

pub mod letagents;
pub mod stringcup;
pub mod tls;

/// Transport failures, classified by who is at fault.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The relay could not be reached (down, refused, timed out): try again later.
    #[error("relay unreachable: {0}")]
    Unreachable(String),
    /// The relay answered with an error status.
    #[error("relay answered {status}: {body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// Body text (truncated).
        body: String,
        /// `Retry-After` seconds, if given.
        retry_after: Option<u64>,
    },
    /// The relay sent something we cannot parse.
    #[error("relay sent a malformed response: {0}")]
    Malformed(String),
    /// The relay URL or configuration is wrong (local).
    #[error("relay configuration: {0}")]
    Config(String),
}
