//! Mailbox authentication: the signed strings for inbox logins and acks, built by clients and
//! checked by relays.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::util::{b64u, b64u_array, sha256};

/// Login and ack timestamps must be within this window of the relay's clock (2 minutes).
pub const LOGIN_WINDOW_MS: i64 = 2 * 60 * 1000;

/// The bytes an inbox login signs.
pub fn inbox_message(host: &str, id: &str, ts: i64, drop_hash: &str) -> Vec<u8> {
    format!("letagents-inbox-v1\n{host}\n{id}\n{ts}\n{drop_hash}").into_bytes()
}

/// The bytes an ack signs; `seqs` exactly as it appears in the query.
pub fn ack_message(host: &str, id: &str, ts: i64, seqs: &str) -> Vec<u8> {
    format!("letagents-ack-v1\n{host}\n{id}\n{ts}\n{seqs}").into_bytes()
}

/// `drop_hash` = b64u(SHA-256(drop)).
pub fn drop_hash(drop: &[u8; 16]) -> String {
    b64u(&sha256(drop))
}

/// Query parameters of a signed inbox login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    /// Unix ms.
    pub ts: i64,
    /// b64u(SHA-256(drop)).
    pub drop_hash: String,
    /// b64u signature.
    pub sig: String,
}

impl Login {
    /// Signs a login for `host`.
    pub fn sign(key: &SigningKey, host: &str, ts: i64, drop: &[u8; 16]) -> Self {
        let id = b64u(key.verifying_key().as_bytes());
        let drop_hash = drop_hash(drop);
        let sig = b64u(&key.sign(&inbox_message(host, &id, ts, &drop_hash)).to_bytes());
        Self { ts, drop_hash, sig }
    }

    /// The query string (`ts=..&drop_hash=..&sig=..`).
    pub fn query(&self) -> String {
        format!("ts={}&drop_hash={}&sig={}", self.ts, self.drop_hash, self.sig)
    }
}

/// Signs an ack of `seqs` (rendered as a comma-separated decimal list). Returns the query.
pub fn sign_ack(key: &SigningKey, host: &str, ts: i64, seqs: &[i64]) -> String {
    let id = b64u(key.verifying_key().as_bytes());
    let list = seqs.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let sig = b64u(&key.sign(&ack_message(host, &id, ts, &list)).to_bytes());
    format!("ts={ts}&seqs={list}&sig={sig}")
}

/// Why a relay refused a login or ack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The mailbox id is not a valid Ed25519 public key.
    #[error("mailbox id is not a valid public key")]
    BadId,
    /// The signature is malformed or does not verify.
    #[error("bad signature")]
    BadSignature,
    /// `ts` is outside the 2-minute window.
    #[error("timestamp outside the 2-minute window")]
    Window,
    /// `ts` is not newer than the last accepted login.
    #[error("login replayed (timestamp not newer than the last login)")]
    Replay,
    /// A parameter is malformed.
    #[error("malformed parameter `{0}`")]
    Param(&'static str),
}

/// Verifies `sig` (b64u) by mailbox `id` over `msg`.
pub fn verify(id: &str, msg: &[u8], sig: &str) -> Result<(), AuthError> {
    let pk = b64u_array::<32>(id).ok_or(AuthError::BadId)?;
    let vk = VerifyingKey::from_bytes(&pk).map_err(|_| AuthError::BadId)?;
    let sig = b64u_array::<64>(sig).ok_or(AuthError::BadSignature)?;
    vk.verify_strict(msg, &Signature::from_bytes(&sig)).map_err(|_| AuthError::BadSignature)
}

/// Checks that `ts` is within the window around `now`.
pub fn check_window(ts: i64, now: i64) -> Result<(), AuthError> {
    if (ts - now).abs() > LOGIN_WINDOW_MS {
        return Err(AuthError::Window);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_signature_verifies_only_for_its_host_and_values() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let id = b64u(key.verifying_key().as_bytes());
        let login = Login::sign(&key, "relay.example", 1000, &[1; 16]);
        let msg = inbox_message("relay.example", &id, 1000, &login.drop_hash);
        assert_eq!(verify(&id, &msg, &login.sig), Ok(()));
        let other_host = inbox_message("evil.example", &id, 1000, &login.drop_hash);
        assert_eq!(verify(&id, &other_host, &login.sig), Err(AuthError::BadSignature));
        let other_ts = inbox_message("relay.example", &id, 1001, &login.drop_hash);
        assert_eq!(verify(&id, &other_ts, &login.sig), Err(AuthError::BadSignature));
    }

    #[test]
    fn window_is_two_minutes_each_way() {
        assert!(check_window(0, LOGIN_WINDOW_MS).is_ok());
        assert!(check_window(0, LOGIN_WINDOW_MS + 1).is_err());
        assert!(check_window(LOGIN_WINDOW_MS + 1, 0).is_err());
    }
}
