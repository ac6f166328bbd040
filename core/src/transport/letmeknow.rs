//! The letmeknow relay client: the group log (`/g/{gid}/messages`) and invites (`/i/{id}...`)
//! of `specs/letmeknow-relay.md`, over the same TLS configuration (and pin) as the profile's
//! relay client. Long-polls get their own timeout beyond the hold.

use std::time::Duration;

use reqwest::StatusCode;

use super::letagents::RelayClient;
use super::{TransportError, status_error, unreachable};
use crate::protocol::letmeknow::wire::{
    ClientToRelayInvite, InviteData, RelayToClientEpoch, RelayToClientLogEntry, RelayToClientPosted, b64, b64_decode,
};

/// What a post to the group log came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    /// Stored at this seq.
    Stored(u64),
    /// The group is at another epoch (`409`): catch up, then retry.
    WrongEpoch(u64),
}

/// One entry of the group log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Per-group position.
    pub seq: u64,
    /// The MLSMessage bytes.
    pub data: Vec<u8>,
}

/// A client for one relay's letmeknow API.
#[derive(Debug, Clone)]
pub struct LetmeknowClient {
    base: String,
    http: reqwest::Client,
}

fn hold(wait_secs: u64) -> Duration {
    Duration::from_secs(wait_secs + 15)
}

impl LetmeknowClient {
    /// The letmeknow API of the relay `relay` talks to (same TLS, same pin).
    pub fn new(relay: &RelayClient) -> Self {
        Self { base: relay.base().as_str().trim_end_matches('/').to_owned(), http: relay.http().clone() }
    }

    /// The relay's base URL (what invite links carry).
    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST /g/{gid}/messages`.
    pub async fn post(&self, gid: &str, message: Vec<u8>) -> Result<Posted, TransportError> {
        let resp = self
            .http
            .post(self.url(&format!("/g/{gid}/messages")))
            .header("content-type", "application/octet-stream")
            .body(message)
            .send()
            .await
            .map_err(unreachable)?;
        match resp.status() {
            StatusCode::OK => {
                let p: RelayToClientPosted = resp.json().await.map_err(|e| TransportError::Malformed(e.to_string()))?;
                Ok(Posted::Stored(p.seq))
            }
            StatusCode::CONFLICT => {
                let e: RelayToClientEpoch = resp.json().await.map_err(|e| TransportError::Malformed(e.to_string()))?;
                Ok(Posted::WrongEpoch(e.epoch))
            }
            _ => Err(status_error(resp).await),
        }
    }

    /// `GET /g/{gid}/messages?after=N&wait=S`.
    pub async fn read(&self, gid: &str, after: u64, wait_secs: u64) -> Result<Vec<LogEntry>, TransportError> {
        let resp = self
            .http
            .get(self.url(&format!("/g/{gid}/messages?after={after}&wait={wait_secs}")))
            .timeout(hold(wait_secs))
            .send()
            .await
            .map_err(unreachable)?;
        if !resp.status().is_success() {
            return Err(status_error(resp).await);
        }
        let entries: Vec<RelayToClientLogEntry> =
            resp.json().await.map_err(|e| TransportError::Malformed(e.to_string()))?;
        entries
            .into_iter()
            .map(|e| {
                let data = b64_decode(&e.data).ok_or_else(|| TransportError::Malformed("log entry data".into()))?;
                Ok(LogEntry { seq: e.seq, data })
            })
            .collect()
    }

    /// `PUT /i/{id}`.
    pub async fn create_invite(&self, id: &str, ttl: u64, owner: &str) -> Result<(), TransportError> {
        let body = ClientToRelayInvite { ttl, owner: owner.to_owned() };
        let resp = self.http.put(self.url(&format!("/i/{id}"))).json(&body).send().await.map_err(unreachable)?;
        if resp.status() != StatusCode::CREATED {
            return Err(status_error(resp).await);
        }
        Ok(())
    }

    /// `POST /i/{id}/join` or `/welcome` (the welcome with the owner token).
    pub async fn put_blob(
        &self,
        id: &str,
        welcome: bool,
        owner: Option<&str>,
        data: &[u8],
    ) -> Result<(), TransportError> {
        let role = if welcome { "welcome" } else { "join" };
        let mut req = self.http.post(self.url(&format!("/i/{id}/{role}"))).json(&InviteData { data: b64(data) });
        if let Some(owner) = owner {
            req = req.bearer_auth(owner);
        }
        let resp = req.send().await.map_err(unreachable)?;
        if resp.status() != StatusCode::NO_CONTENT {
            return Err(status_error(resp).await);
        }
        Ok(())
    }

    /// `GET /i/{id}/join|welcome?wait=S`: the data, or `None` when the hold ended empty.
    pub async fn get_blob(&self, id: &str, welcome: bool, wait_secs: u64) -> Result<Option<Vec<u8>>, TransportError> {
        let role = if welcome { "welcome" } else { "join" };
        let resp = self
            .http
            .get(self.url(&format!("/i/{id}/{role}?wait={wait_secs}")))
            .timeout(hold(wait_secs))
            .send()
            .await
            .map_err(unreachable)?;
        match resp.status() {
            StatusCode::NO_CONTENT => Ok(None),
            StatusCode::OK => {
                let d: InviteData = resp.json().await.map_err(|e| TransportError::Malformed(e.to_string()))?;
                Ok(Some(b64_decode(&d.data).ok_or_else(|| TransportError::Malformed("invite data".into()))?))
            }
            _ => Err(status_error(resp).await),
        }
    }
}
