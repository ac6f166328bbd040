//! Stringcup v2: stateless ECIES messages through a relay that assigns identities.
//!
//! Message flow:
//! - an identity is an X25519 key pair plus a server-assigned `sc-` id and a bearer token;
//! - the sender makes a fresh ephemeral key per message, derives the message key with
//!   HKDF-SHA256(salt `stringcup-v2-msg`, info `<sender_id>-><recipient_id>`) and encrypts with
//!   AES-256-GCM ([`crypto::seal`]); the relay stores the ciphertext in the recipient's inbox;
//! - the recipient [`crypto::open`]s it with its static key; nothing binds the sender's key, so
//!   peers pin each other's fingerprints ([`crypto::fingerprint`]) and refuse a change.

pub mod crypto;
pub mod wire;
