//! The Agent Mail 1.0 relay client for one route origin (`/v1/mailboxes`): card publish and read,
//! sender-signed packet delivery, and the owner's list and delete with a request JWT.
//!
//! Bodies are sent and read as bytes: cards and packets are JCS the caller built, answers are
//! parsed by the sans-io types (`CurrentCard::from_record`, `DeliveryResult::parse`,
//! `ListPage::parse`), never by serde.

use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};

use super::letagents::SendOutcome;
use super::{TransportError, status_error, unreachable};
use crate::protocol::agent_identity::http::ListPage;
use crate::protocol::agent_identity::{AgentId, Hash32};
use crate::protocol::agent_mail::Id16;
use crate::protocol::agent_mail::relay::{CurrentCard, DeliveryResult};

/// Largest answer body read (a full page of maximal packets is far below this).
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// What a card publication came to.
#[derive(Debug)]
pub enum Published {
    /// Accepted (or the same card again): the relay's record.
    Accepted(Box<CurrentCard>),
    /// `nonce_not_greater`: the relay's `Max-Seen-Nonce`, if it sent one.
    NonceTooLow(Option<String>),
}

/// What a delivery attempt came to.
#[derive(Debug)]
pub enum Delivered {
    /// `202`: stored (or already in accepted history).
    Accepted(DeliveryResult),
    /// `409 stale_card`: the packet names a card that is no longer current.
    StaleCard,
    /// Anything else, as the outbox understands it.
    Other(SendOutcome),
}

/// A client for one Agent Mail relay origin.
#[derive(Debug, Clone)]
pub struct MailClient {
    base: String,
    http: reqwest::Client,
}

async fn bytes_of(resp: reqwest::Response) -> Result<Vec<u8>, TransportError> {
    if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
        return Err(TransportError::Malformed("answer too large".into()));
    }
    let bytes = resp.bytes().await.map_err(unreachable)?;
    if bytes.len() > MAX_ANSWER {
        return Err(TransportError::Malformed("answer too large".into()));
    }
    Ok(bytes.to_vec())
}

/// An error answer in Identity's shape (`{"error": {"code", "message"}}`), its code read before the
/// body is cut for messages.
async fn mail_error(resp: reqwest::Response) -> TransportError {
    match status_error(resp).await {
        TransportError::Status { status, code, body, retry_after } if code.is_empty() => {
            let code = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.pointer("/error/code").and_then(serde_json::Value::as_str).map(str::to_owned))
                .unwrap_or_default();
            TransportError::Status { status, code, body, retry_after }
        }
        e => e,
    }
}

fn malformed(e: impl std::fmt::Display) -> TransportError {
    TransportError::Malformed(e.to_string())
}

impl MailClient {
    /// A client posting to `base` (the route origin, or the loopback URL it is served on) with
    /// `http` (TLS configured, pinned or web PKI).
    pub fn new(base: &str, http: reqwest::Client) -> Self {
        Self { base: base.trim_end_matches('/').to_owned(), http }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn json(body: Vec<u8>) -> (HeaderValue, Vec<u8>) {
        (HeaderValue::from_static("application/json"), body)
    }

    /// `POST /v1/mailboxes` with a signed card (JCS).
    pub async fn publish(&self, card: Vec<u8>) -> Result<Published, TransportError> {
        let (ct, body) = Self::json(card);
        let resp = self
            .http
            .post(self.url("/v1/mailboxes"))
            .header(CONTENT_TYPE, ct)
            .body(body)
            .send()
            .await
            .map_err(unreachable)?;
        if resp.status() == StatusCode::OK {
            let bytes = bytes_of(resp).await?;
            return CurrentCard::from_record(&bytes).map(|c| Published::Accepted(Box::new(c))).map_err(malformed);
        }
        let max_seen = resp.headers().get("Max-Seen-Nonce").and_then(|v| v.to_str().ok()).map(str::to_owned);
        match mail_error(resp).await {
            TransportError::Status { code, .. } if code == "nonce_not_greater" => Ok(Published::NonceTooLow(max_seen)),
            e => Err(e),
        }
    }

    /// `GET /v1/mailboxes/{id}/card`: the current card, verified (the caller checks owner, mailbox
    /// and pin).
    pub async fn card(&self, mailbox: &Id16) -> Result<CurrentCard, TransportError> {
        let resp = self.http.get(self.url(&format!("/v1/mailboxes/{mailbox}/card"))).send().await.map_err(|e| {
            if super::local_net::is_refusal(&e) {
                TransportError::LocalNetwork(super::local_net::REFUSED.into())
            } else {
                unreachable(e)
            }
        })?;
        if !resp.status().is_success() {
            return Err(mail_error(resp).await);
        }
        CurrentCard::from_record(&bytes_of(resp).await?).map_err(malformed)
    }

    /// `POST /v1/mailboxes/{id}/packets` with the exact packet bytes (every retry reuses them).
    pub async fn deliver(&self, mailbox: &str, packet: Vec<u8>) -> Delivered {
        let (ct, body) = Self::json(packet);
        let resp =
            self.http.post(self.url(&format!("/v1/mailboxes/{mailbox}/packets"))).header(CONTENT_TYPE, ct).body(body);
        let resp = match resp.send().await {
            Ok(r) => r,
            Err(e) => {
                return Delivered::Other(SendOutcome::Retry { after_ms: None, reason: format!("unreachable: {e}") });
            }
        };
        if resp.status() == StatusCode::ACCEPTED {
            return match bytes_of(resp).await.and_then(|b| DeliveryResult::parse(&b).map_err(malformed)) {
                Ok(r) => Delivered::Accepted(r),
                Err(e) => Delivered::Other(SendOutcome::Retry { after_ms: None, reason: format!("bad answer: {e}") }),
            };
        }
        let TransportError::Status { status, code, body, retry_after } = mail_error(resp).await else {
            return Delivered::Other(SendOutcome::Retry { after_ms: None, reason: "unreadable answer".into() });
        };
        let after_ms = retry_after.map(|s| i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX));
        match (status, code.as_str()) {
            (409, "stale_card") => Delivered::StaleCard,
            (429, _) | (507, _) => {
                Delivered::Other(SendOutcome::Retry { after_ms, reason: format!("{status}: {body}") })
            }
            (s, _) if s >= 500 => {
                Delivered::Other(SendOutcome::Retry { after_ms, reason: format!("{status}: {body}") })
            }
            _ => Delivered::Other(SendOutcome::Permanent(format!("{status} {code}: {body}"))),
        }
    }

    /// `GET /v1/mailboxes/{id}/packets` as the owner.
    pub async fn list(
        &self,
        mailbox: &Id16,
        jwt: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ListPage, TransportError> {
        let mut url = format!("/v1/mailboxes/{mailbox}/packets?limit={limit}");
        if let Some(c) = cursor {
            url.push_str("&cursor=");
            url.push_str(&url::form_urlencoded::byte_serialize(c.as_bytes()).collect::<String>());
        }
        let resp = self
            .http
            .get(self.url(&url))
            .header(AUTHORIZATION, format!("Bearer {jwt}"))
            .send()
            .await
            .map_err(unreachable)?;
        if !resp.status().is_success() {
            return Err(mail_error(resp).await);
        }
        ListPage::parse(&bytes_of(resp).await?).map_err(malformed)
    }

    /// `PUT` (block) or `DELETE` (unblock) `/v1/mailboxes/{id}/blocked/{agent_id}` as the owner:
    /// the relay stops (or resumes) accepting new packets from `sender` (`204`). relay-lite's
    /// endpoint; Agent Mail §7.4 leaves the admission API to the relay.
    pub async fn set_blocked(
        &self,
        mailbox: &Id16,
        sender: &AgentId,
        blocked: bool,
        jwt: &str,
    ) -> Result<(), TransportError> {
        let url = self.url(&format!("/v1/mailboxes/{mailbox}/blocked/{sender}"));
        let req = if blocked { self.http.put(url) } else { self.http.delete(url) };
        let resp = req.header(AUTHORIZATION, format!("Bearer {jwt}")).send().await.map_err(unreachable)?;
        if resp.status() != StatusCode::NO_CONTENT {
            return Err(mail_error(resp).await);
        }
        Ok(())
    }

    /// `DELETE /v1/mailboxes/{id}/packets/{packet_id}` as the owner (`204`, also when absent).
    pub async fn delete(&self, mailbox: &Id16, packet_id: &Hash32, jwt: &str) -> Result<(), TransportError> {
        let resp = self
            .http
            .delete(self.url(&format!("/v1/mailboxes/{mailbox}/packets/{packet_id}")))
            .header(AUTHORIZATION, format!("Bearer {jwt}"))
            .send()
            .await
            .map_err(unreachable)?;
        if resp.status() != StatusCode::NO_CONTENT {
            return Err(mail_error(resp).await);
        }
        Ok(())
    }
}
