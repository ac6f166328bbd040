//! Shared helpers for the Agent Identity / Agent Mail vector and conformance tests: the vectors
//! (embedded, so tests never depend on a path outside the crate), strict re-parsing of vector
//! fragments, hex, and a "random" source that replays fixed bytes.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use ed25519_dalek::SigningKey;
use serde_json::Value as J;
use switchboard_core::protocol::agent_identity::json::{self, Value};
use switchboard_core::util::{Rng, hex_decode};
use x25519_dalek::StaticSecret;

pub const IDENTITY_VECTORS: &str = include_str!("../vectors/agent-identity-1.0.vectors.json");
pub const MAIL_VECTORS: &str = include_str!("../vectors/agent-mail-1.0.vectors.derived.json");
pub const MAIL_SCHEMA: &str = include_str!("../vectors/agent-mail-1.0.schema.json");

pub fn identity() -> J {
    serde_json::from_str(IDENTITY_VECTORS).unwrap()
}

pub fn mail() -> J {
    serde_json::from_str(MAIL_VECTORS).unwrap()
}

/// A vector fragment as bytes (member order is irrelevant: everything is hashed through JCS).
pub fn bytes_of(v: &J) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// A vector fragment strictly re-parsed.
pub fn strict(v: &J) -> Value {
    json::parse(&bytes_of(v)).unwrap()
}

pub fn hex32(text: &str) -> [u8; 32] {
    hex_decode(text).unwrap().try_into().unwrap()
}

pub fn signing_key(seed_hex: &str) -> SigningKey {
    SigningKey::from_bytes(&hex32(seed_hex))
}

pub fn x25519_secret(hex: &str) -> StaticSecret {
    StaticSecret::from(hex32(hex))
}

pub fn s(v: &J) -> &str {
    v.as_str().unwrap()
}

pub fn int(v: &J) -> i64 {
    v.as_i64().unwrap()
}

/// Replays fixed bytes as "randomness" (deterministic ephemeral keys from the vectors).
pub struct FixedRng(pub Vec<u8>);

impl Rng for FixedRng {
    fn fill(&mut self, buf: &mut [u8]) {
        assert!(self.0.len() >= buf.len(), "FixedRng exhausted");
        let rest = self.0.split_off(buf.len());
        buf.copy_from_slice(&self.0);
        self.0 = rest;
    }
}
