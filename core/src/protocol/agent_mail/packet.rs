//! Packets (§6.2): sender-signed `mail.submit` envelopes carrying HPKE ciphertext of a framed,
//! padded message, with the packet metadata and header bound in as AAD.
//!
//! - [`seal`] runs the sender's checks (signer, recipient, card usability, `receive_until`, time
//!   and size bounds) before encrypting, so it never produces a packet a relay must refuse.
//! - [`Packet::parse`] is what relays and recipients share: strict JSON, the closed packet shape,
//!   ciphertext length rules, size and intrinsic time bounds, then hash and signature.
//! - [`frame`] and [`unframe`] are the 4-byte length prefix and minimal zero padding to 1024.

use ed25519_dalek::SigningKey;
use zeroize::Zeroizing;

use super::card::{CardUnusable, MailboxCard};
use super::hpke::{self, ENC_LEN, HpkeError, TAG_LEN};
use super::message::{Message, MessageError};
use super::{Id16, MAX_PACKET_BYTES, MAX_RAW_BYTES, MAX_TTL_MS, PAD_BLOCK, PROTOCOL, SKEW_MS};
use crate::protocol::agent_identity::encoding::b64;
use crate::protocol::agent_identity::envelope::{ENVELOPE_OVERHEAD, Envelope, EnvelopeError, EnvelopeIn, Event};
use crate::protocol::agent_identity::json::{self, Object, Value};
use crate::protocol::agent_identity::shape::{self, ShapeError};
use crate::protocol::agent_identity::{AgentId, ErrorCode, Hash32};
use crate::util::Rng;

/// The packet event type.
pub const PACKET_TYPE: &str = "mail.submit";
/// Smallest ciphertext: one padded block and the tag.
pub const MIN_CIPHERTEXT: usize = PAD_BLOCK + TAG_LEN;

/// The closed packet header: the card it was encrypted to and the message deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketHeader {
    /// The recipient mailbox.
    pub mailbox_id: Id16,
    /// Hash of the verified card whose key was used.
    pub card_hash: Hash32,
    /// Equal to the message's `expires_at`.
    pub expires_at: i64,
}

impl PacketHeader {
    fn to_value(self) -> Value {
        Value::Object(
            Object::new()
                .with("mailbox_id", self.mailbox_id.to_string())
                .with("card_hash", self.card_hash.to_string())
                .with("expires_at", self.expires_at),
        )
    }

    fn from_value(value: &Value) -> Result<Self, ShapeError> {
        let obj = shape::object(value, "payload.header")?;
        shape::closed(obj, "payload.header", &["mailbox_id", "card_hash", "expires_at"], &[])?;
        Ok(Self {
            mailbox_id: Id16::parse(shape::string(obj, "payload.header", "mailbox_id")?)
                .ok_or_else(|| ShapeError::new("payload.header.mailbox_id", "not an id16"))?,
            card_hash: shape::hash(obj, "payload.header", "card_hash")?,
            expires_at: shape::timestamp(obj, "payload.header", "expires_at")?,
        })
    }
}

/// Why a packet was refused before decryption (the sender's or relay's fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Raw body or `JCS(packet)` beyond the protocol maximum.
    #[error("packet of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// Not a verified Identity envelope (JSON, shape, hash, signature).
    #[error("{0}")]
    Envelope(#[from] EnvelopeError),
    /// Not a closed `agent-mail/1.0` `mail.submit` packet.
    #[error("invalid packet: {0}")]
    Shape(#[from] ShapeError),
    /// Ciphertext shorter than 1040 bytes or not 16 modulo 1024.
    #[error("ciphertext length is not a padded frame plus tag")]
    CiphertextLength,
    /// Violates `created_at < header.expires_at <= created_at + MAX_TTL + 300000`.
    #[error("packet expiration is outside its intrinsic bounds")]
    Bounds,
    /// `created_at` more than five minutes ahead of the receiver's clock.
    #[error("packet is dated in the future")]
    FromTheFuture,
}

impl PacketError {
    /// The wire error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            PacketError::TooLarge(_) => ErrorCode::PayloadTooLarge,
            PacketError::Envelope(e) => e.code(),
            PacketError::FromTheFuture => ErrorCode::TimestampOutOfWindow,
            PacketError::Shape(_) | PacketError::CiphertextLength | PacketError::Bounds => ErrorCode::InvalidEvent,
        }
    }
}

/// A verified packet: signature and hash checked, shape and intrinsic bounds valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    envelope: Envelope,
    header: PacketHeader,
    enc: [u8; 32],
    ciphertext: Vec<u8>,
    size: usize,
}

fn payload_value(header: PacketHeader, enc: &[u8; 32], ciphertext_b64: String) -> Value {
    Value::Object(
        Object::new().with("header", header.to_value()).with("enc", b64(enc)).with("ciphertext", ciphertext_b64),
    )
}

impl Packet {
    /// Parses and verifies a packet from raw bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, PacketError> {
        if bytes.len() > MAX_RAW_BYTES {
            return Err(PacketError::TooLarge(bytes.len()));
        }
        Self::from_owned(json::parse(bytes).map_err(EnvelopeError::from)?)
    }

    /// Verifies a packet given as a parsed value (e.g. inside a packet record).
    pub fn from_value(value: &Value) -> Result<Self, PacketError> {
        Self::from_owned(value.clone())
    }

    /// [`Packet::from_value`] taking ownership (no copy of the ciphertext text).
    pub fn from_owned(value: Value) -> Result<Self, PacketError> {
        let unverified = EnvelopeIn::from_owned(value, &[])?;
        let event = &unverified.event;
        if event.protocol != PROTOCOL {
            return Err(ShapeError::new("event.protocol", format!("expected {PROTOCOL}")).into());
        }
        if event.event_type != PACKET_TYPE {
            return Err(ShapeError::new("event.type", format!("expected {PACKET_TYPE}")).into());
        }
        let payload = shape::object(&event.payload, "payload")?;
        shape::closed(payload, "payload", &["header", "enc", "ciphertext"], &[])?;
        let header = PacketHeader::from_value(shape::member(payload, "payload", "header")?)?;
        let enc = shape::fixed::<ENC_LEN>(payload, "payload", "enc")?;
        let ciphertext = shape::bytes(payload, "payload", "ciphertext")?;
        if ciphertext.len() < MIN_CIPHERTEXT || ciphertext.len() % PAD_BLOCK != TAG_LEN {
            return Err(PacketError::CiphertextLength);
        }
        check_bounds(event.created_at, header.expires_at).map_err(|()| PacketError::Bounds)?;
        let envelope = unverified.verify()?;
        let size = envelope.jcs_len();
        if size > MAX_PACKET_BYTES {
            return Err(PacketError::TooLarge(size));
        }
        Ok(Self { envelope, header, enc, ciphertext, size })
    }

    /// The packet ID (the envelope's event hash). Never a message ID.
    pub fn id(&self) -> Hash32 {
        self.envelope.hash()
    }

    /// The verified sender.
    pub fn sender(&self) -> &AgentId {
        self.envelope.actor()
    }

    /// This signing's creation time.
    pub fn created_at(&self) -> i64 {
        self.envelope.event().created_at
    }

    /// This signing's nonce.
    pub fn nonce(&self) -> u64 {
        self.envelope.event().nonce
    }

    /// The header.
    pub fn header(&self) -> &PacketHeader {
        &self.header
    }

    /// The encapsulated key.
    pub fn enc(&self) -> &[u8; 32] {
        &self.enc
    }

    /// The HPKE ciphertext (with tag).
    pub fn ciphertext(&self) -> &[u8] {
        &self.ciphertext
    }

    /// The signed envelope.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// Byte length of UTF-8 `JCS(packet)`, the size every limit is measured against.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The AAD derived from the verified outer event.
    pub fn aad(&self) -> Vec<u8> {
        let e = self.envelope.event();
        aad(&e.actor, e.created_at, e.nonce, &self.header)
    }

    /// Refuses a packet dated more than five minutes after `now` (relays and recipients).
    pub fn check_not_future(&self, now_ms: i64) -> Result<(), PacketError> {
        if self.created_at() > now_ms.saturating_add(SKEW_MS) {
            return Err(PacketError::FromTheFuture);
        }
        Ok(())
    }

    /// The packet as JSON.
    pub fn to_value(&self) -> Value {
        self.envelope.to_value()
    }

    /// `JCS(packet)`: the bytes to submit and to retransmit unchanged.
    pub fn to_jcs(&self) -> Vec<u8> {
        self.envelope.to_jcs()
    }
}

fn check_bounds(created_at: i64, expires_at: i64) -> Result<(), ()> {
    if created_at < expires_at && expires_at <= created_at.saturating_add(MAX_TTL_MS).saturating_add(SKEW_MS) {
        Ok(())
    } else {
        Err(())
    }
}

/// `JCS({protocol, type, actor, created_at, nonce, header})`: the packet metadata and header,
/// without `enc`, ciphertext, hash or signature.
pub fn aad(actor: &AgentId, created_at: i64, nonce: u64, header: &PacketHeader) -> Vec<u8> {
    let obj = Object::new()
        .with("protocol", PROTOCOL)
        .with("type", PACKET_TYPE)
        .with("actor", actor.to_string())
        .with("created_at", created_at)
        .with("nonce", Value::Int(i64::try_from(nonce).unwrap_or(i64::MAX)))
        .with("header", header.to_value());
    json::to_jcs(&Value::Object(obj))
}

/// Size of the framed plaintext for a JSON text of `json_len` bytes.
pub fn framed_len(json_len: usize) -> usize {
    (4 + json_len).div_ceil(PAD_BLOCK) * PAD_BLOCK
}

/// `I2OSP(len(json), 4) || json || zeros`, padded to the next multiple of 1024.
pub fn frame(json: &[u8]) -> Result<Zeroizing<Vec<u8>>, FramingError> {
    let len = u32::try_from(json.len()).map_err(|_| FramingError::Length)?;
    let mut out = Zeroizing::new(Vec::with_capacity(framed_len(json.len())));
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(json);
    out.resize(framed_len(json.len()), 0);
    Ok(out)
}

/// A decrypted plaintext that is not a valid frame (the sender's fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// The length prefix exceeds the plaintext, or the plaintext is shorter than the prefix.
    #[error("length prefix does not fit the plaintext")]
    Length,
    /// More padding than the minimum (or a size not a multiple of 1024).
    #[error("padding is not minimal")]
    NonMinimalPadding,
    /// A padding byte is not zero.
    #[error("padding is not zero")]
    NonZeroPadding,
}

/// The JSON text inside a framed plaintext, after checking the length, minimal padding and zeros.
pub fn unframe(plaintext: &[u8]) -> Result<&[u8], FramingError> {
    let (prefix, rest) = plaintext.split_first_chunk::<4>().ok_or(FramingError::Length)?;
    let len = usize::try_from(u32::from_be_bytes(*prefix)).map_err(|_| FramingError::Length)?;
    if len > rest.len() {
        return Err(FramingError::Length);
    }
    if plaintext.len() != framed_len(len) {
        return Err(FramingError::NonMinimalPadding);
    }
    let (json, padding) = rest.split_at(len);
    if padding.iter().any(|b| *b != 0) {
        return Err(FramingError::NonZeroPadding);
    }
    Ok(json)
}

/// What the sender signs and encrypts.
#[derive(Debug, Clone, Copy)]
pub struct SealRequest<'a> {
    /// The sender's identity key (the packet's actor; must be `message.from`).
    pub sender: &'a SigningKey,
    /// The recipient's verified, pinned card.
    pub card: &'a MailboxCard,
    /// The immutable message (retained unchanged for retries and re-encryption).
    pub message: &'a Message,
    /// This signing's creation time (normally `now`).
    pub created_at: i64,
    /// This signing's nonce (from the sender's one nonce sequence).
    pub nonce: u64,
}

/// Why sealing was refused. All are local: the caller asked for something the spec forbids.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The message itself is invalid.
    #[error("invalid message: {0}")]
    Message(#[from] MessageError),
    /// `message.from` is not the signing key's Agent ID.
    #[error("message.from is not the signer")]
    WrongSender,
    /// `message.to` is not the card's owner.
    #[error("message.to is not the card owner")]
    WrongRecipient,
    /// The card cannot be used now (expired, closed, future-dated).
    #[error("card unusable: {0}")]
    Card(#[from] CardUnusable),
    /// `message.expires_at` is after the card's `receive_until`.
    #[error("message outlives the card's receive_until")]
    BeyondReceiveUntil,
    /// The message deadline has passed: expired messages are never silently renewed.
    #[error("message expired")]
    MessageExpired,
    /// `message.created_at` is more than five minutes after the packet's `created_at`.
    #[error("message is dated after the packet")]
    MessageAfterPacket,
    /// The packet's `created_at` and the deadline violate the intrinsic bounds.
    #[error("packet creation time and expiration are out of bounds")]
    Bounds,
    /// `JCS(packet)` would exceed the card's or the protocol's limit.
    #[error("packet would be {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        /// Predicted `JCS(packet)` size.
        size: usize,
        /// The effective limit.
        limit: usize,
    },
    /// The card key is unusable for HPKE.
    #[error("encryption failed: {0}")]
    Hpke(#[from] HpkeError),
    /// Signing failed (a bug).
    #[error("signing failed: {0}")]
    Envelope(#[from] EnvelopeError),
}

/// Seals `req.message` to `req.card` as a signed packet. `rng` supplies the ephemeral X25519
/// secret (fresh for every call; a retry of the same packet reuses the returned bytes instead).
pub fn seal(req: &SealRequest<'_>, now_ms: i64, rng: &mut dyn Rng) -> Result<Packet, SealError> {
    let SealRequest { sender, card, message, created_at, nonce } = *req;
    message.validate()?;
    let sender_id = AgentId::of(sender);
    if message.from != sender_id {
        return Err(SealError::WrongSender);
    }
    if message.to != *card.owner() {
        return Err(SealError::WrongRecipient);
    }
    card.check_sendable(now_ms)?;
    if message.expires_at > card.payload().receive_until {
        return Err(SealError::BeyondReceiveUntil);
    }
    if now_ms >= message.expires_at {
        return Err(SealError::MessageExpired);
    }
    if message.created_at > created_at.saturating_add(SKEW_MS) {
        return Err(SealError::MessageAfterPacket);
    }
    check_bounds(created_at, message.expires_at).map_err(|()| SealError::Bounds)?;

    let header = PacketHeader { mailbox_id: card.mailbox_id(), card_hash: card.hash(), expires_at: message.expires_at };
    let json = Zeroizing::new(message.to_jcs());
    let plaintext = frame(&json).map_err(|_| SealError::TooLarge { size: usize::MAX, limit: MAX_PACKET_BYTES })?;

    // Predict the size before encrypting: base64url length depends only on byte length and the
    // ciphertext string needs no escaping, so an empty placeholder plus its encoded length is exact.
    let ciphertext_len = plaintext.len() + TAG_LEN;
    let event = |payload: Value| Event {
        protocol: PROTOCOL.to_owned(),
        event_type: PACKET_TYPE.to_owned(),
        actor: sender_id,
        created_at,
        nonce,
        payload,
        extensions: Object::new(),
    };
    let skeleton = event(payload_value(header, &[0; 32], String::new())).to_jcs().len();
    let size = skeleton + ENVELOPE_OVERHEAD + (ciphertext_len * 4).div_ceil(3);
    let limit = card.payload().max_packet_bytes.min(MAX_PACKET_BYTES);
    if size > limit {
        return Err(SealError::TooLarge { size, limit });
    }

    let aad = aad(&sender_id, created_at, nonce, &header);
    let mut sk_e = Zeroizing::new([0u8; 32]);
    rng.fill(sk_e.as_mut());
    let (enc, ciphertext) = hpke::seal_base(&card.payload().public_key, hpke::INFO, &aad, &plaintext, sk_e)?;
    let envelope = event(payload_value(header, &enc, b64(&ciphertext))).sign(sender)?;
    let size = envelope.jcs_len();
    Ok(Packet { envelope, header, enc, ciphertext, size })
}
