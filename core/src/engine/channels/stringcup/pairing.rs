//! Stringcup rendezvous pairing: open a relay-issued `rv-` token, or claim one and wait for the
//! peer, then pin the peer's key (its fingerprint recomputed locally).

use serde_json::{Value, json};

use super::Stringcup;
use crate::engine::{Error, Result, Runtime};
use crate::protocol::stringcup::crypto::{self, fingerprint, fingerprint_short};
use crate::protocol::stringcup::wire::is_rendezvous_token;
use crate::transport::TransportError;
use crate::transport::stringcup as sct;

impl Stringcup {
    /// Opens a rendezvous and returns the relay-issued token to hand over.
    pub(in crate::engine) async fn pair_open(&self, rt: &Runtime) -> Result<Value> {
        let me = self.stringcup_identity(rt).await?;
        let rv = self.client().rendezvous(&me.token, None, 0).await?;
        let token = rv.token.filter(|t| is_rendezvous_token(t)).ok_or_else(|| {
            Error::Transport(TransportError::Malformed("rendezvous answer carries no valid token".into()))
        })?;
        Ok(json!({"token": token, "role": rv.role}))
    }

    /// Claims (or re-polls) a rendezvous until paired or `timeout_secs` pass, then pins the peer.
    pub(in crate::engine) async fn pair_wait(
        &self,
        rt: &Runtime,
        token: &str,
        name: Option<&str>,
        timeout_secs: u64,
    ) -> Result<Value> {
        if !is_rendezvous_token(token) {
            return Err(Error::Invalid("not a rendezvous token (rv-…)".into()));
        }
        let me = self.stringcup_identity(rt).await?;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout_secs);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                // Give our side back, so the token cannot be completed later behind our back
                // (the claim would otherwise stand until the token expires).
                let released = self.client().rendezvous_release(&me.token, token).await;
                if let Err(e) = &released {
                    tracing::info!("releasing the rendezvous claim: {e}");
                }
                return Ok(json!({
                    "status": "timeout",
                    "detail": "no peer arrived before the deadline",
                    "released": released.is_ok(),
                }));
            }
            // At least one claim, however short the timeout (a hold is whole seconds).
            let hold = left.as_secs().clamp(1, sct::MAX_WAIT_SECS);
            let rv = match self.client().rendezvous(&me.token, Some(token), hold).await {
                Ok(rv) => rv,
                Err(TransportError::Status { status: 409, .. }) => {
                    return Err(Error::Invalid(
                        "another identity holds this side of the rendezvous: treat the token as leaked and open a new one"
                            .into(),
                    ));
                }
                Err(e) => return Err(e.into()),
            };
            let (Some(peer_id), Some(key_b64)) = (rv.peer_id, rv.peer_identity_public_key) else { continue };
            let key = crypto::decode_public_key(&key_b64)
                .ok_or_else(|| TransportError::Malformed("peer key is malformed".into()))?;
            let local = fingerprint(&key);
            if rv.peer_fingerprint.as_deref().is_some_and(|f| f != local) {
                return Err(
                    TransportError::Malformed("relay's fingerprint does not match the key it served".into()).into()
                );
            }
            let c = self
                .pin_contact(
                    rt,
                    &peer_id,
                    name.unwrap_or(&peer_id),
                    &key,
                    crate::engine::DEFAULT_ALLOW,
                    crate::store::ContactState::Active,
                    None,
                )
                .await?;
            return Ok(json!({
                "status": "paired",
                "role": rv.role,
                "contact": c.name,
                "peer_id": peer_id,
                "fingerprint": local,
                "fingerprint_short": fingerprint_short(&key),
            }));
        }
    }
}
