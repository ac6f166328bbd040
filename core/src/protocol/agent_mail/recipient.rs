//! Recipient acceptance (§7.2) in the spec's order, as pure steps the caller cannot reorder:
//!
//! 1. [`verify`]: strict shape, hash, signature, size, claimed packet ID, future bound; then
//!    [`VerifiedPacket::admit`] applies local sender policy to the verified actor.
//! 2. [`AdmittedPacket::open`]: the retained card by `card_hash` (owner, mailbox, packet limit,
//!    `receive_until`; it need not be current), then
//! 3. HPKE with the AAD from the verified event, framing, strict JSON, JCS equality, message rules
//!    and the sender / recipient / expiration bindings.
//! 4. [`Opened::decide`]: deduplication by `(recipient, from, message_id)` from the caller's
//!    "seen" answer: identical is a duplicate (even after the deadline), different bytes are refused.
//! 5. A new message must be unexpired; the caller then persists its commitment and content
//!    atomically before acknowledging deletion at the relay.
//!
//! Errors carry a code for logs and tests only: a recipient never sends a public error or bounce.

use x25519_dalek::StaticSecret;
use zeroize::Zeroizing;

use super::card::MailboxCard;
use super::hpke::{self, HpkeError};
use super::message::{Message, MessageError};
use super::packet::{FramingError, Packet, PacketError, unframe};
use super::relay::MailCode;
use super::{Id16, SKEW_MS};
use crate::protocol::agent_identity::json::{self, JsonError};
use crate::protocol::agent_identity::shape::ShapeError;
use crate::protocol::agent_identity::{AgentId, ErrorCode, Hash32};

/// Local policy for a verified sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderPolicy {
    /// Process the packet (it may still land in an introduction queue).
    Allow,
    /// Refuse before decrypting, even mail already queued at the relay.
    Block,
}

/// A card of ours that is still retained, with the X25519 secret it advertised.
pub struct RetainedKey {
    /// The verified card.
    pub card: MailboxCard,
    /// Its secret (kept until the card's `receive_until`).
    pub secret: StaticSecret,
}

impl std::fmt::Debug for RetainedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetainedKey").field("card", &self.card.hash()).finish_non_exhaustive()
    }
}

/// Where the recipient's retained cards and secrets are looked up by `card_hash`.
pub trait RetainedKeys {
    /// The retained card with this hash and its secret.
    fn find(&self, card_hash: &Hash32) -> Option<(&MailboxCard, &StaticSecret)>;
}

impl RetainedKeys for [RetainedKey] {
    fn find(&self, card_hash: &Hash32) -> Option<(&MailboxCard, &StaticSecret)> {
        self.iter().find(|k| k.card.hash() == *card_hash).map(|k| (&k.card, &k.secret))
    }
}

impl RetainedKeys for Vec<RetainedKey> {
    fn find(&self, card_hash: &Hash32) -> Option<(&MailboxCard, &StaticSecret)> {
        self.as_slice().find(card_hash)
    }
}

/// Why a packet was not accepted as correspondence. All are the sender's (or a relay's) fault
/// except [`ReceiveError::UnknownCard`], which can also mean a key we no longer retain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiveError {
    /// Step 1: not a valid packet (shape, hash, signature, size, future date).
    #[error("{0}")]
    Packet(#[from] PacketError),
    /// Step 1: the relay's claimed packet ID is not the packet's hash.
    #[error("packet ID does not match the packet")]
    PacketIdMismatch,
    /// Step 1: local policy blocks this sender.
    #[error("sender is blocked")]
    SenderBlocked,
    /// Step 2: no retained card has this `card_hash`.
    #[error("no retained card with this hash")]
    UnknownCard,
    /// Step 2: the card is not ours.
    #[error("card is not owned by the local recipient")]
    NotOurCard,
    /// Step 2: the header's mailbox is not the card's.
    #[error("header mailbox differs from the card's")]
    MailboxMismatch,
    /// Step 2: the packet exceeds the card's `max_packet_bytes`.
    #[error("packet exceeds the card's limit")]
    OverCardLimit,
    /// Step 2: `header.expires_at` is after the card's `receive_until`.
    #[error("packet outlives the card's receive_until")]
    BeyondReceiveUntil,
    /// Step 3: HPKE failed (tampered, wrong key, or metadata changed after encryption).
    #[error("decryption failed: {0}")]
    Decrypt(HpkeError),
    /// Step 3: the plaintext frame is malformed.
    #[error("framing: {0}")]
    Framing(#[from] FramingError),
    /// Step 3: the framed text is not strict JSON.
    #[error("plaintext: {0}")]
    PlaintextJson(JsonError),
    /// Step 3: the framed JSON is not exactly `JCS(parsed message)`.
    #[error("plaintext is not canonical JSON")]
    NotCanonical,
    /// Step 3: the message is invalid.
    #[error("message: {0}")]
    Message(#[from] MessageError),
    /// Step 3: `from` is not the packet signer.
    #[error("message.from is not the packet signer")]
    SenderMismatch,
    /// Step 3: `to` is not the card owner (the local recipient).
    #[error("message.to is not the recipient")]
    RecipientMismatch,
    /// Step 3: inner and outer expirations differ.
    #[error("message and header expirations differ")]
    ExpiryMismatch,
    /// Step 3: message creation is more than five minutes after now or after the packet.
    #[error("message is dated in the future")]
    MessageFromTheFuture,
    /// Step 4: the same `(recipient, from, message_id)` with different content.
    #[error("message ID reused with different content")]
    ConflictingMessage,
    /// Step 5: a new message past its deadline.
    #[error("message expired")]
    MessageExpired,
}

impl ReceiveError {
    /// The code a relay-style error would carry (for logs and conformance tests).
    pub fn code(&self) -> MailCode {
        match self {
            ReceiveError::Packet(e) => MailCode::Identity(e.code()),
            ReceiveError::SenderBlocked => MailCode::Identity(ErrorCode::PermissionDenied),
            ReceiveError::NotOurCard => MailCode::Identity(ErrorCode::InvalidActor),
            ReceiveError::OverCardLimit => MailCode::Identity(ErrorCode::PayloadTooLarge),
            ReceiveError::MessageFromTheFuture => MailCode::Identity(ErrorCode::TimestampOutOfWindow),
            ReceiveError::MessageExpired => MailCode::PacketExpired,
            _ => MailCode::Identity(ErrorCode::InvalidEvent),
        }
    }
}

/// A packet that passed the pre-decryption checks of step 1.
#[derive(Debug, Clone)]
pub struct VerifiedPacket(Packet);

/// A packet whose sender local policy admits.
#[derive(Debug, Clone)]
pub struct AdmittedPacket(Packet);

/// Step 1: verify a fetched packet before anything else. `claimed_id` is the relay's
/// `packet_id` from the record, if any.
pub fn verify(bytes: &[u8], claimed_id: Option<&Hash32>, now_ms: i64) -> Result<VerifiedPacket, ReceiveError> {
    verify_packet(Packet::parse(bytes)?, claimed_id, now_ms)
}

/// Step 1 on an already parsed packet (e.g. from a packet record).
pub fn verify_packet(packet: Packet, claimed_id: Option<&Hash32>, now_ms: i64) -> Result<VerifiedPacket, ReceiveError> {
    if claimed_id.is_some_and(|id| *id != packet.id()) {
        return Err(ReceiveError::PacketIdMismatch);
    }
    packet.check_not_future(now_ms)?;
    Ok(VerifiedPacket(packet))
}

impl VerifiedPacket {
    /// The verified sender, for the policy lookup.
    pub fn sender(&self) -> &AgentId {
        self.0.sender()
    }

    /// The packet.
    pub fn packet(&self) -> &Packet {
        &self.0
    }

    /// Applies local sender policy (end of step 1). A relay's admission never replaces this.
    pub fn admit(self, policy: SenderPolicy) -> Result<AdmittedPacket, ReceiveError> {
        match policy {
            SenderPolicy::Allow => Ok(AdmittedPacket(self.0)),
            SenderPolicy::Block => Err(ReceiveError::SenderBlocked),
        }
    }
}

/// A decrypted, fully validated message and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The packet ID (relay-side identity; never used for message deduplication).
    pub packet_id: Hash32,
    /// The card the packet was encrypted to.
    pub card_hash: Hash32,
    /// The local recipient.
    pub recipient: AgentId,
    /// The message.
    pub message: Message,
    /// `SHA3-256(JCS(message))`.
    pub content_hash: Hash32,
}

/// The durable deduplication key `(recipient, from, message_id)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DedupKey {
    /// The local recipient.
    pub recipient: AgentId,
    /// The message's sender.
    pub sender: AgentId,
    /// The logical message ID.
    pub message_id: Id16,
}

/// What is persisted per deduplication key until the message expires: a content commitment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageCommitment {
    /// `SHA3-256(JCS(message))`.
    pub content_hash: Hash32,
    /// Keep the commitment at least until this time.
    pub expires_at: i64,
}

/// The recipient's decision for a valid message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// New correspondence: atomically persist the commitment and message, then acknowledge
    /// (delete at the relay) and apply consent and content policy. No execution authority.
    New(MessageCommitment),
    /// Already retained: no new inbox item or action; the packet may be deleted at the relay.
    Duplicate,
}

impl AdmittedPacket {
    /// Steps 2 and 3: find the retained card, decrypt with the verified AAD, validate.
    pub fn open(self, me: &AgentId, keys: &(impl RetainedKeys + ?Sized), now_ms: i64) -> Result<Opened, ReceiveError> {
        let packet = self.0;
        let header = *packet.header();
        let (card, secret) = keys.find(&header.card_hash).ok_or(ReceiveError::UnknownCard)?;
        if card.owner() != me {
            return Err(ReceiveError::NotOurCard);
        }
        if card.mailbox_id() != header.mailbox_id {
            return Err(ReceiveError::MailboxMismatch);
        }
        if packet.size() > card.payload().max_packet_bytes {
            return Err(ReceiveError::OverCardLimit);
        }
        if header.expires_at > card.payload().receive_until {
            return Err(ReceiveError::BeyondReceiveUntil);
        }

        let plaintext: Zeroizing<Vec<u8>> =
            hpke::open_base(secret, packet.enc(), hpke::INFO, &packet.aad(), packet.ciphertext())
                .map_err(ReceiveError::Decrypt)?;
        let text = unframe(&plaintext)?;
        let value = json::parse(text).map_err(ReceiveError::PlaintextJson)?;
        if json::to_jcs(&value) != text {
            return Err(ReceiveError::NotCanonical);
        }
        if value.contains_null() {
            // No Mail field accepts null; the typed reader would refuse it too, this names it.
            return Err(MessageError::Shape(ShapeError::new("message", "null is not allowed")).into());
        }
        let message = Message::from_value(&value)?;
        if message.from != *packet.sender() {
            return Err(ReceiveError::SenderMismatch);
        }
        if message.to != *card.owner() || message.to != *me {
            return Err(ReceiveError::RecipientMismatch);
        }
        if message.expires_at != header.expires_at {
            return Err(ReceiveError::ExpiryMismatch);
        }
        if message.created_at > now_ms.saturating_add(SKEW_MS)
            || message.created_at > packet.created_at().saturating_add(SKEW_MS)
        {
            return Err(ReceiveError::MessageFromTheFuture);
        }
        let content_hash = Hash32::of(text);
        Ok(Opened { packet_id: packet.id(), card_hash: header.card_hash, recipient: *me, message, content_hash })
    }
}

impl Opened {
    /// The deduplication key to look up.
    pub fn dedup_key(&self) -> DedupKey {
        DedupKey { recipient: self.recipient, sender: self.message.from, message_id: self.message.message_id }
    }

    /// The commitment to persist for a new message.
    pub fn commitment(&self) -> MessageCommitment {
        MessageCommitment { content_hash: self.content_hash, expires_at: self.message.expires_at }
    }

    /// Steps 4 and 5, given the commitment already stored under [`Opened::dedup_key`] (if any).
    pub fn decide(&self, seen: Option<&MessageCommitment>, now_ms: i64) -> Result<Verdict, ReceiveError> {
        match seen {
            Some(c) if c.content_hash == self.content_hash => Ok(Verdict::Duplicate),
            Some(_) => Err(ReceiveError::ConflictingMessage),
            None if now_ms >= self.message.expires_at => Err(ReceiveError::MessageExpired),
            None => Ok(Verdict::New(self.commitment())),
        }
    }
}

/// All five steps in order. `policy` is asked about the verified sender; `seen` returns the
/// commitment stored under the deduplication key, if any.
pub fn receive(
    bytes: &[u8],
    claimed_id: Option<&Hash32>,
    me: &AgentId,
    keys: &(impl RetainedKeys + ?Sized),
    now_ms: i64,
    policy: impl FnOnce(&AgentId) -> SenderPolicy,
    seen: impl FnOnce(&DedupKey) -> Option<MessageCommitment>,
) -> Result<(Opened, Verdict), ReceiveError> {
    let verified = verify(bytes, claimed_id, now_ms)?;
    let decision = policy(verified.sender());
    let opened = verified.admit(decision)?.open(me, keys, now_ms)?;
    let verdict = opened.decide(seen(&opened.dedup_key()).as_ref(), now_ms)?;
    Ok((opened, verdict))
}
