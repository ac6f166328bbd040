//! Relay transports: TLS configuration (web PKI or a pinned self-signed certificate) and the
//! letagents relay client (HTTP send/inbox/ack and the websocket), and the LAN layer ([`lan`]).

pub mod agent_mail;
pub mod lan;
pub mod letagents;
pub mod letmeknow;
pub mod local_net;
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
        /// The machine-readable `error` code of a JSON error body, read before truncation.
        code: String,
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
    /// A public fetch was refused by the local-network policy (the address a peer gave points
    /// into a local network and the profile does not allow that).
    #[error("{0}")]
    LocalNetwork(String),
}

pub(crate) fn unreachable(e: impl std::fmt::Display) -> TransportError {
    TransportError::Unreachable(e.to_string())
}

/// Turns an error response into [`TransportError::Status`]: status, `Retry-After`, the JSON
/// `error` code, and the body cut to 300 bytes for messages.
pub(crate) async fn status_error(resp: reqwest::Response) -> TransportError {
    let status = resp.status().as_u16();
    let retry_after =
        resp.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let mut body = resp.text().await.unwrap_or_default();
    let code = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("error").and_then(serde_json::Value::as_str).map(str::to_owned))
        .unwrap_or_default();
    let mut cut = body.len().min(300);
    while !body.is_char_boundary(cut) {
        cut -= 1;
    }
    body.truncate(cut);
    TransportError::Status { status, code, body, retry_after }
}
