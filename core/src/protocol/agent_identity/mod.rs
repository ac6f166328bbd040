//! Agent Identity 1.0, sans-io: what Agent Mail (and later protocols) build on.
//!
//! - [`agent_id`]: `did:agent:` IDs and Agent URLs; [`origin`]: serialized HTTPS origins.
//! - [`json`]: strict I-JSON parsing and RFC 8785 JCS; [`encoding`]: canonical base64url, SHA3-256.
//! - [`ed25519`]: deterministic (strict, cofactorless) Ed25519 verification.
//! - [`envelope`]: signed event envelopes, verified on parse (§6.1 steps 1–5).
//! - [`live_write`]: resubmission, time window and nonce-cache decisions (steps 6–8), and the
//!   client's bounded `Max-Seen-Nonce` handling.
//! - [`jwt`]: request JWTs for authenticated reads; [`http`]: error bodies, lists, accepted records,
//!   discovery documents; [`error_code`]: the shared error codes (a leaf every part reports with).
//!
//! Nothing here reads a clock, a disk or the network: time is a parameter, state is the caller's.

pub mod agent_id;
pub mod ed25519;
pub mod encoding;
pub mod envelope;
pub mod error_code;
pub mod http;
pub mod json;
pub mod jwt;
pub mod live_write;
pub mod origin;
pub mod shape;

pub use agent_id::{AgentId, AgentUrl};
pub use encoding::Hash32;
pub use envelope::{Envelope, EnvelopeError, EnvelopeIn, Event};
pub use error_code::ErrorCode;
pub use json::{Object, Value};
pub use origin::Origin;
