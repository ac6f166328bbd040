//! JSON shapes exchanged with a letagents relay, named by direction.

use serde::{Deserialize, Serialize};

/// A websocket frame from relay to client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "lowercase")]
pub enum RelayToClient {
    /// A waiting or live envelope.
    Msg {
        /// Per-mailbox sequence number.
        seq: i64,
        /// b64u envelope.
        ct: String,
    },
    /// Every waiting envelope has been sent; what follows is live.
    Ready,
    /// Answer to a ping.
    Pong,
}

/// A websocket frame from client to relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "lowercase")]
pub enum ClientToRelay {
    /// The envelope with this seq is committed locally; delete it.
    Ack {
        /// Sequence number.
        seq: i64,
    },
    /// Keep-alive.
    Ping,
}

/// One waiting envelope in a plain inbox response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingMsg {
    /// Sequence number.
    pub seq: i64,
    /// b64u envelope.
    pub ct: String,
}

/// `GET /v1/inbox/<id>` without upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxResponse {
    /// The oldest waiting envelopes, at most 100.
    pub msgs: Vec<WaitingMsg>,
}

/// `POST /v1/ack/<id>` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckResponse {
    /// The seqs that were deleted.
    pub acked: Vec<i64>,
}

/// Error body every relay-lite endpoint answers with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Machine-readable code.
    pub error: String,
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
}

/// Most envelopes a plain inbox read returns.
pub const INBOX_PAGE: usize = 100;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_have_the_profile_shape() {
        let m = RelayToClient::Msg { seq: 3, ct: "AA".into() };
        assert_eq!(serde_json::to_string(&m).unwrap(), r#"{"t":"msg","seq":3,"ct":"AA"}"#);
        assert_eq!(serde_json::to_string(&RelayToClient::Ready).unwrap(), r#"{"t":"ready"}"#);
        let a: ClientToRelay = serde_json::from_str(r#"{"t":"ack","seq":7}"#).unwrap();
        assert_eq!(a, ClientToRelay::Ack { seq: 7 });
    }
}
