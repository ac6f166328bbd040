//! letagents v1: device identities, sealed envelopes, relay authentication and receiving rules.
//!
//! Message flow:
//! - the sender builds an [`inner::Inner`], serializes it once, and [`envelope::seal`]s those exact
//!   bytes to the recipient's `box` key, signed with its own `sig` key;
//! - the relay stores the opaque envelope under the recipient's mailbox id (it never learns the
//!   sender) and hands it to the owner after a signed login ([`relay_auth`]);
//! - the recipient [`envelope::open`]s it (decrypt, verify against `inner.from`, check `inner.to`),
//!   then [`receive::decide`]s what to do in the seed's order: staleness, replays, contact rules.
//!
//! Byte-level choices follow `specs/letagents-profile.md`.

pub mod address;
pub mod envelope;
pub mod inner;
pub mod receive;
pub mod relay_auth;
pub mod wire;

pub use address::{Address, PeerKeys};
pub use envelope::{OpenError, Opened, open, seal};
pub use inner::{Inner, Kind};

/// Smallest possible envelope: magic, ephemeral key, nonce, one padded block and the tag.
pub const MIN_ENVELOPE: usize = 3 + 32 + 12 + 1024 + 16;
/// Largest envelope the relay and receivers accept (32 KiB).
pub const MAX_ENVELOPE: usize = 32 * 1024;
/// Messages older than this are dropped as stale (48 h).
pub const STALE_AFTER_MS: i64 = 48 * 3600 * 1000;
/// Messages dated further in the future than this are refused too: a far-future `ts` would
/// otherwise outlive the replay window.
pub const MAX_FUTURE_SKEW_MS: i64 = 10 * 60 * 1000;
