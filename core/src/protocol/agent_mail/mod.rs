//! Agent Mail 1.0, sans-io: mailbox cards, messages, HPKE packets, and the sender's, recipient's
//! and relay's decisions as pure functions.
//!
//! Message flow:
//! - the recipient signs a [`card::MailboxCard`] (its Agent ID, a separate X25519 key, routes) and
//!   publishes it; a relay accepts it as a live write ([`relay::check_publish`]);
//! - the sender gets the card (directly, from a [`address::MailAddress`] route or a reply card),
//!   verifies and pins it ([`card::check_pin`]), builds an immutable [`message::Message`] and
//!   [`packet::seal`]s it: JCS, 4-byte length framing, zero padding to 1024, HPKE Base
//!   (X25519, HKDF-SHA256, ChaCha20-Poly1305) with the packet metadata and header as AAD, then an
//!   Ed25519 `mail.submit` envelope over the ciphertext;
//! - the relay checks the signature, bounds and its current card ([`relay::check_delivery`]) and
//!   stores the opaque packet; the owner lists and deletes with a request JWT
//!   ([`relay::authorize_owner`]);
//! - the recipient runs [`recipient`]'s steps in the spec's order: verify, sender policy, retained
//!   card, open and validate, deduplicate by `(recipient, from, message_id)`, persist.
//!
//! Nothing here awaits, reads a clock or touches storage: `now`, randomness, retained keys and
//! "have I seen this?" answers are parameters.

pub mod address;
pub mod attachment;
pub mod card;
pub mod hpke;
pub mod message;
pub mod packet;
pub mod recipient;
pub mod relay;

use std::fmt;

use super::agent_identity::encoding::{b64, b64_array};
use crate::util::Rng;

pub use address::MailAddress;
pub use card::{CardError, MailboxCard, Pin};
pub use message::{Message, Part};
pub use packet::{Packet, PacketHeader};

/// The protocol identifier.
pub const PROTOCOL: &str = "agent-mail/1.0";
/// One day in milliseconds.
pub const DAY_MS: i64 = 86_400_000;
/// Longest lifetime of cards and messages (30 days).
pub const MAX_TTL_MS: i64 = 30 * DAY_MS;
/// Permitted future clock skew.
pub const SKEW_MS: i64 = 300_000;
/// Protocol maximum of `JCS(packet)` in bytes.
pub const MAX_PACKET_BYTES: usize = 1_048_576;
/// Smallest `max_packet_bytes` a card may set.
pub const MIN_CARD_PACKET_BYTES: usize = 4096;
/// Most routes a card may list.
pub const MAX_ROUTES: usize = 8;
/// Padding block of the framed plaintext.
pub const PAD_BLOCK: usize = 1024;
/// Largest raw JSON body parsed as a card, packet or record: canonical packets up to the protocol
/// maximum, plus room for a little whitespace. Checked before parsing.
pub const MAX_RAW_BYTES: usize = MAX_PACKET_BYTES + 64 * 1024;

/// A 16-byte random identifier (`mailbox_id`, `message_id`, `thread_id`), canonical base64url.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Id16(pub [u8; 16]);

impl Id16 {
    /// A fresh random identifier (never derived from names or Agent IDs).
    pub fn random(rng: &mut dyn Rng) -> Self {
        let mut b = [0u8; 16];
        rng.fill(&mut b);
        Self(b)
    }

    /// Parses canonical base64url of exactly 16 bytes.
    pub fn parse(text: &str) -> Option<Self> {
        b64_array(text).map(Self)
    }
}

impl fmt::Display for Id16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&b64(&self.0))
    }
}

impl fmt::Debug for Id16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Id16({self})")
    }
}
