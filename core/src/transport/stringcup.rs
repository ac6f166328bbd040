//! The Stringcup v2 relay client (`<relay>/api/v2`): registration, lookups, idempotent sends,
//! long-polled inbox pages, acks, rendezvous, topics and token lifecycle.

use std::time::Duration;

use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::letagents::RelayClient;
use super::{TransportError, status_error, unreachable};
use crate::protocol::stringcup::wire::{
    AckIn, BatchIn, IdentityIn, InboxPageIn, MembersAddedIn, Outgoing, RegisteredIn, RendezvousIn, RosterIn, RotatedIn,
    SentIn, TokenInfoIn, TopicsIn,
};

/// Longest long-poll hold the spec allows.
pub const MAX_WAIT_SECS: u64 = 25;

/// The `X-Long-Poll` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LongPoll {
    /// No wait was requested (or the relay does not hold).
    Off,
    /// The request was held.
    Waited,
    /// The hold pool was full: sleep the normal interval before retrying.
    Unavailable,
}

/// Below this many requests left in a budget window, polls are spread over the rest of it.
pub const PACE_BELOW: u64 = 10;

/// The relay's `X-RateLimit-Remaining` and `X-RateLimit-Reset` (Unix seconds) on an answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    /// Requests left in the window.
    pub remaining: Option<u64>,
    /// When the window refills, in Unix seconds.
    pub reset_unix_secs: Option<u64>,
}

impl Budget {
    fn of(headers: &reqwest::header::HeaderMap) -> Self {
        let num = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok());
        Self { remaining: num("x-ratelimit-remaining"), reset_unix_secs: num("x-ratelimit-reset") }
    }

    /// How long to wait before the next request so that what is left of the budget lasts until
    /// it refills (B.8: pace against `X-RateLimit-Remaining`): until the reset when nothing is
    /// left, an even share of the time left when fewer than [`PACE_BELOW`] are, else nothing.
    pub fn pace_ms(&self, now_ms: i64) -> Option<i64> {
        let remaining = self.remaining?;
        let reset_ms = i64::try_from(self.reset_unix_secs?).ok()?.saturating_mul(1000);
        let left = reset_ms.saturating_sub(now_ms);
        if left <= 0 || remaining >= PACE_BELOW {
            return None;
        }
        let share = left / i64::try_from(remaining).unwrap_or(i64::MAX).saturating_add(1);
        Some(if remaining == 0 { left } else { share })
    }
}

/// What a send attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// `201` stored, or `200` an idempotent replay of a stored send.
    Stored,
    /// Try again after this many ms, for the reason given.
    Retry {
        /// Suggested delay.
        after_ms: Option<i64>,
        /// Why (for the audit log).
        reason: String,
    },
    /// Will never succeed as is.
    Permanent(String),
}

/// A client for one relay's Stringcup API.
#[derive(Debug, Clone)]
pub struct StringcupClient {
    base: String,
    http: reqwest::Client,
}

async fn json_of<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, TransportError> {
    if !resp.status().is_success() {
        return Err(status_error(resp).await);
    }
    resp.json().await.map_err(|e| TransportError::Malformed(e.to_string()))
}

impl StringcupClient {
    /// The Stringcup API of the relay `relay` talks to (same TLS, same pin).
    pub fn new(relay: &RelayClient) -> Self {
        Self { base: format!("{}/api/v2", relay.base().as_str().trim_end_matches('/')), http: relay.http().clone() }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// An authenticated JSON POST whose answer is JSON.
    async fn post_json<T: DeserializeOwned>(&self, token: &str, path: &str, body: &Value) -> Result<T, TransportError> {
        json_of(self.http.post(self.url(path)).bearer_auth(token).json(body).send().await.map_err(unreachable)?).await
    }

    /// Registers a new identity for `public_key` (base64).
    pub async fn register(&self, public_key: &str, display_name: &str) -> Result<RegisteredIn, TransportError> {
        let body = json!({"identity_public_key": public_key, "algo": "x25519", "display_name": display_name});
        json_of(self.http.post(self.url("/identities")).json(&body).send().await.map_err(unreachable)?).await
    }

    /// Replaces the caller's identity key (`PUT /identities`, B.1.2); the id, token and inbox
    /// stay.
    pub async fn update_key(&self, token: &str, public_key: &str) -> Result<(), TransportError> {
        let body = serde_json::json!({"identity_public_key": public_key, "algo": "x25519"});
        let r =
            self.http.put(self.url("/identities")).bearer_auth(token).json(&body).send().await.map_err(unreachable)?;
        json_of::<serde_json::Value>(r).await.map(|_| ())
    }

    /// Looks up an identity by exact id.
    pub async fn identity(&self, id: &str) -> Result<IdentityIn, TransportError> {
        json_of(self.http.get(self.url(&format!("/identities/{id}"))).send().await.map_err(unreachable)?).await
    }

    /// Sends one message with an Idempotency-Key (the same key for every retry).
    pub async fn send(&self, token: &str, body: &[u8], idempotency_key: &str) -> SendOutcome {
        let resp = self
            .http
            .post(self.url("/messages"))
            .bearer_auth(token)
            .header("Idempotency-Key", idempotency_key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec())
            .send()
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => return SendOutcome::Retry { after_ms: None, reason: format!("unreachable: {e}") },
        };
        let status = resp.status();
        if status == StatusCode::CREATED || status == StatusCode::OK {
            return match resp.json::<SentIn>().await {
                Ok(_) => SendOutcome::Stored,
                Err(e) => SendOutcome::Retry { after_ms: None, reason: format!("malformed send answer: {e}") },
            };
        }
        let TransportError::Status { status, code, body, retry_after } = status_error(resp).await else {
            return SendOutcome::Retry { after_ms: None, reason: "unreadable answer".into() };
        };
        let after_ms = retry_after.map(|s| i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX));
        match status {
            // Another attempt with this key is in flight: it will have finished shortly.
            409 => SendOutcome::Retry { after_ms: Some(1000), reason: "send with this key in flight".into() },
            429 => SendOutcome::Retry { after_ms, reason: format!("rate limited: {body}") },
            // Every 507 means "not stored, retry later", but only one kind says anything about
            // the recipient: the others are our share, or the relay's own disk.
            507 => match code.as_str() {
                "storage_full" => SendOutcome::Retry {
                    after_ms: after_ms.or(Some(60_000)),
                    reason: "the relay is out of storage: retrying (the recipient is not behind)".into(),
                },
                "sender_share_full" => SendOutcome::Retry {
                    after_ms: Some(60_000),
                    reason: "our share of the recipient's inbox is full: slowing down (the recipient is not behind)"
                        .into(),
                },
                _ => SendOutcome::Retry {
                    after_ms: Some(60_000),
                    reason: "the recipient's inbox is full: the recipient is behind".into(),
                },
            },
            401 => SendOutcome::Retry { after_ms: Some(60_000), reason: format!("token refused: {body}") },
            500..=599 => SendOutcome::Retry { after_ms, reason: format!("relay error {status}: {body}") },
            _ => SendOutcome::Permanent(format!("relay answered {status}: {body}")),
        }
    }

    /// One inbox page (oldest first), holding up to `wait` seconds for mail, with the relay's
    /// long-poll answer and what is left of the inbox budget.
    pub async fn inbox(&self, token: &str, wait: u64) -> Result<(InboxPageIn, LongPoll, Budget), TransportError> {
        let wait = wait.min(MAX_WAIT_SECS);
        let resp = self
            .http
            .get(self.url(&format!("/messages?limit=200&wait={wait}")))
            .bearer_auth(token)
            .timeout(Duration::from_secs(wait + 20))
            .send()
            .await
            .map_err(unreachable)?;
        let long_poll = match resp.headers().get("x-long-poll").and_then(|v| v.to_str().ok()) {
            Some("waited") => LongPoll::Waited,
            Some("unavailable") => LongPoll::Unavailable,
            _ => LongPoll::Off,
        };
        let budget = Budget::of(resp.headers());
        Ok((json_of(resp).await?, long_poll, budget))
    }

    /// Acknowledges (deletes) messages after they are committed locally.
    pub async fn ack(&self, token: &str, ids: &[i64]) -> Result<AckIn, TransportError> {
        let body = json!({ "ids": ids });
        self.post_json(token, "/messages/ack", &body).await
    }

    /// Sends several messages in one request (fan-out); partial success is normal.
    pub async fn batch(&self, token: &str, messages: &[Outgoing]) -> Result<BatchIn, TransportError> {
        let body = json!({ "messages": messages });
        self.post_json(token, "/messages/batch", &body).await
    }

    /// Opens (no token) or joins/re-polls (token) a rendezvous, holding up to `wait` seconds.
    pub async fn rendezvous(&self, token: &str, rv: Option<&str>, wait: u64) -> Result<RendezvousIn, TransportError> {
        let wait = wait.min(MAX_WAIT_SECS);
        let body = match rv {
            Some(t) => json!({"token": t, "wait": wait}),
            None => json!({"wait": wait}),
        };
        let resp = self
            .http
            .post(self.url("/rendezvous"))
            .bearer_auth(token)
            .timeout(Duration::from_secs(wait + 20))
            .json(&body)
            .send()
            .await
            .map_err(unreachable)?;
        json_of(resp).await
    }

    /// Token status.
    pub async fn token_info(&self, token: &str) -> Result<TokenInfoIn, TransportError> {
        json_of(self.http.get(self.url("/tokens/current")).bearer_auth(token).send().await.map_err(unreachable)?).await
    }

    /// Rotates the token; the old one is revoked before the answer is sent.
    pub async fn rotate(&self, token: &str) -> Result<RotatedIn, TransportError> {
        json_of(self.http.post(self.url("/tokens/rotate")).bearer_auth(token).send().await.map_err(unreachable)?).await
    }

    /// Creates a topic with these members (besides us); returns its `tp-` id.
    pub async fn topic_create(&self, token: &str, members: &[String]) -> Result<String, TransportError> {
        let v: Value = self.post_json(token, "/topics", &json!({})).await?;
        let id = v
            .get("id")
            .or_else(|| v.get("topic"))
            .and_then(Value::as_str)
            .ok_or_else(|| TransportError::Malformed("topic answer has no id".into()))?
            .to_owned();
        if !members.is_empty() {
            let _: Value =
                self.post_json(token, &format!("/topics/{id}/members"), &json!({ "members": members })).await?;
        }
        Ok(id)
    }

    /// The topics we belong to.
    pub async fn topics(&self, token: &str) -> Result<TopicsIn, TransportError> {
        json_of(self.http.get(self.url("/topics")).bearer_auth(token).send().await.map_err(unreachable)?).await
    }

    /// Adds members to a topic we own (adding a member twice is a no-op).
    pub async fn topic_add(&self, token: &str, topic: &str, ids: &[String]) -> Result<MembersAddedIn, TransportError> {
        self.post_json(token, &format!("/topics/{topic}/members"), &json!({ "members": ids })).await
    }

    /// Removes `id` from a topic (the owner removes anyone but itself; a member, itself).
    pub async fn topic_remove(&self, token: &str, topic: &str, id: &str) -> Result<(), TransportError> {
        self.delete(token, &format!("/topics/{topic}/members/{id}"), None).await
    }

    /// Deletes a topic we own (messages already sent are unaffected).
    pub async fn topic_delete(&self, token: &str, topic: &str) -> Result<(), TransportError> {
        self.delete(token, &format!("/topics/{topic}"), None).await
    }

    /// Gives up our claim under a rendezvous token (never the counterpart's).
    pub async fn rendezvous_release(&self, token: &str, rv: &str) -> Result<(), TransportError> {
        self.delete(token, "/rendezvous", Some(&json!({ "token": rv }))).await
    }

    async fn delete(&self, token: &str, path: &str, body: Option<&Value>) -> Result<(), TransportError> {
        let mut req = self.http.delete(self.url(path)).bearer_auth(token);
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(unreachable)?;
        if !resp.status().is_success() {
            return Err(status_error(resp).await);
        }
        Ok(())
    }

    /// A topic's roster (members with their keys).
    pub async fn topic_roster(&self, token: &str, topic: &str) -> Result<RosterIn, TransportError> {
        json_of(
            self.http
                .get(self.url(&format!("/topics/{topic}")))
                .bearer_auth(token)
                .send()
                .await
                .map_err(unreachable)?,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(remaining: u64, reset_in_secs: i64, now_ms: i64) -> Budget {
        Budget {
            remaining: Some(remaining),
            reset_unix_secs: Some(u64::try_from(now_ms / 1000 + reset_in_secs).unwrap_or(0)),
        }
    }

    #[test]
    fn polls_are_spread_over_what_is_left_of_the_budget() {
        let now = 1_800_000_000_000;
        assert_eq!(budget(PACE_BELOW, 600, now).pace_ms(now), None, "plenty left: no pause");
        assert_eq!(budget(PACE_BELOW - 1, 600, now).pace_ms(now), Some(60_000), "9 left, 10 min: one a minute");
        assert_eq!(budget(1, 600, now).pace_ms(now), Some(300_000));
        assert_eq!(budget(0, 600, now).pace_ms(now), Some(600_000), "none left: until the reset");
        assert_eq!(budget(0, -5, now).pace_ms(now), None, "a reset in the past: the window refilled");
        assert_eq!(Budget::default().pace_ms(now), None, "a relay without the headers");
    }
}
