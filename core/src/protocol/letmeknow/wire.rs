//! JSON bodies of the letmeknow group log and invite API, named by direction. Binary values are
//! standard base64 (with padding), as the relay API specifies.

use data_encoding::BASE64;
use serde::{Deserialize, Serialize};

/// Standard base64 with padding.
pub fn b64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// Decodes canonical standard base64 with padding. The decoder alone also takes concatenated
/// padded blocks (`GVs=Gb8=`); only the text [`b64`] prints for the bytes is accepted, so each
/// byte string has exactly one encoding.
pub fn b64_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = BASE64.decode(text.as_bytes()).ok()?;
    (BASE64.encode(&bytes) == text).then_some(bytes)
}

/// `200` answer to `POST /g/{gid}/messages`: the message's position in the group log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayToClientPosted {
    /// Per-group sequence number, from 1.
    pub seq: u64,
}

/// `409` answer to a post at a stale epoch (or to a commit that lost the race).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayToClientEpoch {
    /// The group's current epoch.
    pub epoch: u64,
}

/// One entry of `GET /g/{gid}/messages`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayToClientLogEntry {
    /// Per-group sequence number.
    pub seq: u64,
    /// The MLSMessage bytes as posted, standard base64.
    pub data: String,
}

/// `PUT /i/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientToRelayInvite {
    /// Lifetime in seconds, 1 to 86400.
    pub ttl: u64,
    /// The owner token (64 lower-case hex), required to post the Welcome.
    pub owner: String,
}

/// Join or welcome data, both directions: `{"data": "<b64>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InviteData {
    /// `nonce ‖ ciphertext`, standard base64 (see [`super::invite`]).
    pub data: String,
}

/// What the joiner encrypts into its join data: its KeyPackage and display name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinBlob {
    /// The TLS-serialized KeyPackage (MLSMessage), b64u.
    pub key_package: String,
    /// The joiner's display name (an unverified claim).
    pub name: String,
}

/// What the inviter encrypts into its welcome data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WelcomeBlob {
    /// The TLS-serialized Welcome (MLSMessage), b64u.
    pub welcome: String,
    /// The group id (32 lower-case hex).
    pub group: String,
    /// The relay's base URL.
    pub relay: String,
    /// The log position of the commit that added the joiner: the joiner reads after it.
    pub seq: u64,
    /// The inviter's name for the group, which the joiner takes as its own until renamed (our
    /// extension; absent from other clients' Welcomes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_canonical_only() {
        assert_eq!(b64_decode("aGVsbG8="), Some(b"hello".to_vec()));
        assert_eq!(b64_decode(""), Some(vec![]));
        // Concatenated padded blocks (found by the letmeknow_wire fuzz target).
        assert_eq!(b64_decode("GVs=Gb8="), None);
        assert_eq!(b64_decode("aGVsbG8"), None);
        assert_eq!(b64_decode("aGVsbG9="), None);
        assert_eq!(b64(&b64_decode("GVsZvw==").unwrap()), "GVsZvw==");
    }
}
