//! LAN direct delivery (issue 17): the sans-io half of the peer-to-peer path.
//!
//! - Each profile keeps a **LAN key** ([`binding::LanKey`]): a random Ed25519 key, never derived
//!   from an identity key, rotated daily. Its libp2p PeerId is all mDNS shows the network.
//! - A **binding** ([`binding::LanBinding`]) ties that PeerId to one of the profile's identity keys
//!   (letagents `sig`, Agent Mail owner key): an identity signature over
//!   `switchboard-lan-v1\n` ‖ PeerId ‖ expiry. It is the first request on every connection; a
//!   peer none of whose bindings verifies against a pinned contact's key gets nothing else. The
//!   binding does not name the key, so a stranger cannot tell whose it is.
//! - A **frame** ([`frame`]) is a 4-byte big-endian length and a body of at most [`MAX_FRAME`]
//!   bytes: a hello (bindings), or a delivery carrying the exact sealed bytes a relay would carry
//!   with their protocol tag. The receiver answers `Stored` only after its own commit, the meaning
//!   of a relay's `202`; anything else sends the same bytes through the relay.
//! - A **relay announcement** ([`relay`]): once a connection is bound both ways, a profile whose
//!   relay is pinned by certificate (the relay the desktop app hosts) tells the peer its URL and
//!   certificate SHA-256, signed by its identity key; the receiver checks it against the keys
//!   that peer proved and may then use that relay (groups on a LAN without internet).

pub mod binding;
pub mod frame;
pub mod relay;

pub use binding::{
    BindingError, BoundPeer, LanBinding, LanKey, PinnedKeys, TimelyBinding, VerifiedBinding, verify_hello,
};
pub use frame::{Delivery, FrameError, LanRequest, LanResponse, ProtocolTag, Refusal};
pub use relay::{AnnounceError, RelayAnnouncement, VerifiedRelay};

/// Largest frame body (64 KiB); bigger messages take the relay.
pub const MAX_FRAME: usize = 64 * 1024;
/// Most bindings one hello carries (one per identity a profile has, with room to spare).
pub const MAX_BINDINGS: usize = 4;
/// How long a LAN key is used before a new one is made (daily rotation).
pub const LAN_KEY_LIFETIME_MS: i64 = 24 * 3600 * 1000;
/// A binding outlives its key's rotation by this much, so a connection made just before the
/// rotation is not cut mid-delivery.
pub const BINDING_GRACE_MS: i64 = 3600 * 1000;
/// Clock difference tolerated between two machines on a LAN.
pub const CLOCK_SKEW_MS: i64 = 10 * 60 * 1000;
/// The latest expiry a receiver accepts, measured from its own clock: a binding claiming more is
/// refused, so a leaked one cannot be replayed for long.
pub const MAX_BINDING_VALIDITY_MS: i64 = LAN_KEY_LIFETIME_MS + BINDING_GRACE_MS + CLOCK_SKEW_MS;
