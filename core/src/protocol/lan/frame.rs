//! Direct-delivery frames: a 4-byte big-endian length and a body of at most
//! [`super::MAX_FRAME`] bytes. The length is checked before the body is read, so a peer
//! cannot make us buffer more.
//!
//! Body: version (1) ‖ kind ‖ payload.
//! - request `0x01` hello: count (u8, 1..=4) ‖ bindings;
//! - request `0x02` deliver: protocol tag ‖ the sealed bytes a relay would carry (non-empty);
//! - request `0x03` relay: a signed relay announcement ([`RelayAnnouncement`]), answered
//!   `stored` (taken) or `refused`;
//! - response `0x81` hello: the responder's bindings, sent only to a peer whose hello verified;
//! - response `0x82` stored: the receiver committed the message (or already had it);
//! - response `0x83` refused: one reason byte; the sender takes the relay.

use super::binding::{BindingError, LanBinding};
use super::relay::{AnnounceError, RelayAnnouncement};
use super::{MAX_BINDINGS, MAX_FRAME};

/// The frame format version.
pub const VERSION: u8 = 1;
/// Length of the length prefix.
pub const LEN_PREFIX: usize = 4;
/// Largest sealed payload a delivery frame carries: the body minus version, kind and tag.
pub const MAX_SEALED: usize = MAX_FRAME - 3;

const REQ_HELLO: u8 = 0x01;
const REQ_DELIVER: u8 = 0x02;
const REQ_RELAY: u8 = 0x03;
const RESP_HELLO: u8 = 0x81;
const RESP_STORED: u8 = 0x82;
const RESP_REFUSED: u8 = 0x83;

/// Why a frame was refused. All are the peer's fault except [`FrameError::TooLarge`] when we
/// build a frame (then it is the caller's: take the relay).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix or payload exceeds 64 KiB.
    #[error("frame larger than 64 KiB ({0} bytes)")]
    TooLarge(usize),
    /// Zero-length body, short read, or bytes after the end.
    #[error("frame truncated or with trailing bytes")]
    Length,
    /// Unknown version byte.
    #[error("unknown frame version {0}")]
    Version(u8),
    /// Unknown kind byte for this direction.
    #[error("unknown frame kind {0:#04x}")]
    Kind(u8),
    /// Unknown protocol tag.
    #[error("unknown protocol tag {0}")]
    Protocol(u8),
    /// Unknown refusal reason.
    #[error("unknown refusal reason {0}")]
    Reason(u8),
    /// A delivery with no bytes.
    #[error("empty delivery")]
    Empty,
    /// A binding inside a hello is malformed.
    #[error(transparent)]
    Binding(#[from] BindingError),
    /// A relay announcement is malformed.
    #[error(transparent)]
    Announcement(#[from] AnnounceError),
}

/// Which protocol's sealed bytes a delivery carries: both authenticate their sender end to end,
/// so the receiver judges them exactly as if the relay had handed them over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProtocolTag {
    /// A letagents v1 envelope.
    Letagents,
    /// An Agent Mail 1.0 packet.
    AgentMail,
}

impl ProtocolTag {
    fn byte(self) -> u8 {
        match self {
            ProtocolTag::Letagents => 1,
            ProtocolTag::AgentMail => 2,
        }
    }

    fn from_byte(b: u8) -> Result<Self, FrameError> {
        match b {
            1 => Ok(ProtocolTag::Letagents),
            2 => Ok(ProtocolTag::AgentMail),
            other => Err(FrameError::Protocol(other)),
        }
    }

    /// The protocol name the store and audit log use.
    pub fn as_str(self) -> &'static str {
        match self {
            ProtocolTag::Letagents => "letagents",
            ProtocolTag::AgentMail => "agent_mail",
        }
    }
}

/// Why a receiver did not store a delivery. The sender takes the relay in every case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No verified hello on this connection yet (or it expired).
    NotBound,
    /// The receiver's protocol code refused the bytes (they would be refused from the relay too).
    Invalid,
    /// The receiver does not take this protocol directly.
    Unsupported,
    /// The receiver could not commit now (busy, shutting down, storage error).
    Unavailable,
}

impl Refusal {
    fn byte(self) -> u8 {
        match self {
            Refusal::NotBound => 1,
            Refusal::Invalid => 2,
            Refusal::Unsupported => 3,
            Refusal::Unavailable => 4,
        }
    }

    fn from_byte(b: u8) -> Result<Self, FrameError> {
        match b {
            1 => Ok(Refusal::NotBound),
            2 => Ok(Refusal::Invalid),
            3 => Ok(Refusal::Unsupported),
            4 => Ok(Refusal::Unavailable),
            other => Err(FrameError::Reason(other)),
        }
    }
}

/// Sealed bytes and their protocol, within the size cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    protocol: ProtocolTag,
    sealed: Vec<u8>,
}

impl Delivery {
    /// A delivery of `sealed`; `TooLarge` when it cannot go direct (use the relay), `Empty` for
    /// no bytes.
    pub fn new(protocol: ProtocolTag, sealed: Vec<u8>) -> Result<Self, FrameError> {
        if sealed.is_empty() {
            return Err(FrameError::Empty);
        }
        if sealed.len() > MAX_SEALED {
            return Err(FrameError::TooLarge(sealed.len() + 3));
        }
        Ok(Self { protocol, sealed })
    }

    /// The protocol.
    pub fn protocol(&self) -> ProtocolTag {
        self.protocol
    }

    /// The sealed bytes.
    pub fn sealed(&self) -> &[u8] {
        &self.sealed
    }

    /// The sealed bytes, owned.
    pub fn into_sealed(self) -> Vec<u8> {
        self.sealed
    }
}

/// What a peer asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LanRequest {
    /// The first request on a connection: the sender's bindings.
    Hello(Vec<LanBinding>),
    /// Sealed bytes to store.
    Deliver(Delivery),
    /// The sender's relay, signed by its identity key.
    Relay(RelayAnnouncement),
}

/// What a peer answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LanResponse {
    /// The responder's bindings (only to a verified peer).
    Hello(Vec<LanBinding>),
    /// Committed (or already held): the meaning of a relay's `202`.
    Stored,
    /// Not stored.
    Refused(Refusal),
}

/// Reads a length prefix: the body length, refused above 64 KiB or at zero before any body
/// byte is read.
pub fn body_len(prefix: [u8; LEN_PREFIX]) -> Result<usize, FrameError> {
    let len = usize::try_from(u32::from_be_bytes(prefix)).map_err(|_| FrameError::TooLarge(usize::MAX))?;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    if len == 0 {
        return Err(FrameError::Length);
    }
    Ok(len)
}

fn frame(kind: u8, payload: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut v = vec![0, 0, 0, 0, VERSION, kind];
    payload(&mut v);
    let len = u32::try_from(v.len() - LEN_PREFIX).unwrap_or(u32::MAX).to_be_bytes();
    if let Some(prefix) = v.get_mut(..LEN_PREFIX) {
        prefix.copy_from_slice(&len);
    }
    v
}

fn encode_bindings(bindings: &[LanBinding], out: &mut Vec<u8>) {
    let n = bindings.len().min(MAX_BINDINGS);
    out.push(u8::try_from(n).unwrap_or(0));
    for b in bindings.iter().take(n) {
        b.encode_into(out);
    }
}

fn decode_bindings(mut input: &[u8]) -> Result<Vec<LanBinding>, FrameError> {
    let (&n, rest) = input.split_first().ok_or(FrameError::Length)?;
    if n == 0 || usize::from(n) > MAX_BINDINGS {
        return Err(BindingError::Malformed("binding count").into());
    }
    input = rest;
    let mut out = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        let (b, rest) = LanBinding::decode_prefix(input)?;
        out.push(b);
        input = rest;
    }
    if !input.is_empty() {
        return Err(FrameError::Length);
    }
    Ok(out)
}

/// Splits a body into kind and payload after checking size and version.
fn open_body(body: &[u8]) -> Result<(u8, &[u8]), FrameError> {
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let (&version, rest) = body.split_first().ok_or(FrameError::Length)?;
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let (&kind, payload) = rest.split_first().ok_or(FrameError::Length)?;
    Ok((kind, payload))
}

/// Splits a whole frame (prefix and body) into its body, checking the prefix matches exactly.
fn split_frame(frame: &[u8]) -> Result<&[u8], FrameError> {
    let (prefix, body) = frame.split_first_chunk::<LEN_PREFIX>().ok_or(FrameError::Length)?;
    if body_len(*prefix)? != body.len() {
        return Err(FrameError::Length);
    }
    Ok(body)
}

impl LanRequest {
    /// The whole frame, prefix included. A hello with more than [`MAX_BINDINGS`] bindings sends
    /// the first four.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            LanRequest::Hello(b) => frame(REQ_HELLO, |out| encode_bindings(b, out)),
            LanRequest::Deliver(d) => frame(REQ_DELIVER, |out| {
                out.push(d.protocol.byte());
                out.extend_from_slice(&d.sealed);
            }),
            LanRequest::Relay(a) => frame(REQ_RELAY, |out| out.extend_from_slice(&a.to_bytes())),
        }
    }

    /// Decodes a body (what follows the length prefix).
    pub fn decode_body(body: &[u8]) -> Result<Self, FrameError> {
        match open_body(body)? {
            (REQ_HELLO, payload) => Ok(LanRequest::Hello(decode_bindings(payload)?)),
            (REQ_DELIVER, payload) => {
                let (&tag, sealed) = payload.split_first().ok_or(FrameError::Length)?;
                Ok(LanRequest::Deliver(Delivery::new(ProtocolTag::from_byte(tag)?, sealed.to_vec())?))
            }
            (REQ_RELAY, payload) => Ok(LanRequest::Relay(RelayAnnouncement::decode(payload)?)),
            (kind, _) => Err(FrameError::Kind(kind)),
        }
    }

    /// Decodes a whole frame.
    pub fn decode(frame: &[u8]) -> Result<Self, FrameError> {
        Self::decode_body(split_frame(frame)?)
    }
}

impl LanResponse {
    /// The whole frame, prefix included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            LanResponse::Hello(b) => frame(RESP_HELLO, |out| encode_bindings(b, out)),
            LanResponse::Stored => frame(RESP_STORED, |_| {}),
            LanResponse::Refused(r) => frame(RESP_REFUSED, |out| out.push(r.byte())),
        }
    }

    /// Decodes a body (what follows the length prefix).
    pub fn decode_body(body: &[u8]) -> Result<Self, FrameError> {
        match open_body(body)? {
            (RESP_HELLO, payload) => Ok(LanResponse::Hello(decode_bindings(payload)?)),
            (RESP_STORED, []) => Ok(LanResponse::Stored),
            (RESP_REFUSED, [reason]) => Ok(LanResponse::Refused(Refusal::from_byte(*reason)?)),
            (RESP_STORED | RESP_REFUSED, _) => Err(FrameError::Length),
            (kind, _) => Err(FrameError::Kind(kind)),
        }
    }

    /// Decodes a whole frame.
    pub fn decode(frame: &[u8]) -> Result<Self, FrameError> {
        Self::decode_body(split_frame(frame)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn binding() -> LanBinding {
        LanBinding::sign(&SigningKey::from_bytes(&[1; 32]), &[7; 38], 1_800_000_000_000)
    }

    fn prefix_of(frame: &[u8]) -> [u8; LEN_PREFIX] {
        *frame.first_chunk::<LEN_PREFIX>().unwrap()
    }

    #[test]
    fn delivery_of_exactly_64_kib_round_trips() {
        let d = Delivery::new(ProtocolTag::Letagents, vec![0xab; MAX_SEALED]).unwrap();
        let f = LanRequest::Deliver(d.clone()).encode();
        assert_eq!(f.len(), LEN_PREFIX + MAX_FRAME);
        assert_eq!(body_len(prefix_of(&f)), Ok(MAX_FRAME));
        assert_eq!(LanRequest::decode(&f), Ok(LanRequest::Deliver(d)));
    }

    #[test]
    fn delivery_one_byte_over_64_kib_is_refused() {
        assert_eq!(
            Delivery::new(ProtocolTag::AgentMail, vec![0; MAX_SEALED + 1]),
            Err(FrameError::TooLarge(MAX_FRAME + 1))
        );
        // A peer's length prefix one over the cap is refused before any body is read.
        assert_eq!(body_len(u32::try_from(MAX_FRAME + 1).unwrap().to_be_bytes()), Err(FrameError::TooLarge(65_537)));
        assert_eq!(body_len(u32::MAX.to_be_bytes()), Err(FrameError::TooLarge(u32::MAX as usize)));
        // And a body that long is refused even if handed over whole.
        let mut body = vec![VERSION, REQ_DELIVER, 1];
        body.resize(MAX_FRAME + 1, 0);
        assert_eq!(LanRequest::decode_body(&body), Err(FrameError::TooLarge(MAX_FRAME + 1)));
    }

    #[test]
    fn delivery_keeps_the_exact_sealed_bytes_and_tag() {
        let sealed: Vec<u8> = (0..=255).collect();
        let f = LanRequest::Deliver(Delivery::new(ProtocolTag::AgentMail, sealed.clone()).unwrap()).encode();
        assert_eq!(f.get(..7), Some(&[0, 0, 1, 3, VERSION, REQ_DELIVER, 2][..]));
        let LanRequest::Deliver(d) = LanRequest::decode(&f).unwrap() else { panic!("not a delivery") };
        assert_eq!((d.protocol(), d.into_sealed()), (ProtocolTag::AgentMail, sealed));
    }

    #[test]
    fn hello_and_responses_round_trip() {
        let relay =
            RelayAnnouncement::sign(&SigningKey::from_bytes(&[1; 32]), "https://198.18.0.1:8443", [3; 32], 1).unwrap();
        for req in [
            LanRequest::Hello(vec![binding()]),
            LanRequest::Hello(vec![binding(); MAX_BINDINGS]),
            LanRequest::Relay(relay),
        ] {
            assert_eq!(LanRequest::decode(&req.encode()), Ok(req));
        }
        for resp in [
            LanResponse::Hello(vec![binding(), binding()]),
            LanResponse::Stored,
            LanResponse::Refused(Refusal::NotBound),
            LanResponse::Refused(Refusal::Invalid),
            LanResponse::Refused(Refusal::Unsupported),
            LanResponse::Refused(Refusal::Unavailable),
        ] {
            assert_eq!(LanResponse::decode(&resp.encode()), Ok(resp));
        }
    }

    #[test]
    fn garbage_and_truncations_are_refused() {
        assert_eq!(body_len([0; 4]), Err(FrameError::Length));
        assert_eq!(LanRequest::decode_body(&[2, REQ_HELLO]), Err(FrameError::Version(2)));
        assert_eq!(LanRequest::decode_body(&[VERSION, 0x7f]), Err(FrameError::Kind(0x7f)));
        assert_eq!(LanRequest::decode_body(&[VERSION, RESP_STORED]), Err(FrameError::Kind(RESP_STORED)));
        assert_eq!(LanRequest::decode_body(&[VERSION, REQ_DELIVER, 9, 1]), Err(FrameError::Protocol(9)));
        assert_eq!(LanRequest::decode_body(&[VERSION, REQ_DELIVER, 1]), Err(FrameError::Empty));
        assert_eq!(LanResponse::decode_body(&[VERSION, RESP_STORED, 0]), Err(FrameError::Length));
        assert_eq!(LanResponse::decode_body(&[VERSION, RESP_REFUSED, 9]), Err(FrameError::Reason(9)));
        assert!(matches!(LanRequest::decode_body(&[VERSION, REQ_HELLO, 0]), Err(FrameError::Binding(_))));
        assert!(matches!(LanRequest::decode_body(&[VERSION, REQ_RELAY, 0]), Err(FrameError::Announcement(_))));
        let hello = LanRequest::Hello(vec![binding()]).encode();
        for cut in 0..hello.len() {
            assert!(LanRequest::decode(hello.get(..cut).unwrap()).is_err(), "hello cut at {cut} decoded");
        }
        let mut longer = hello.clone();
        longer.push(0);
        assert_eq!(LanRequest::decode(&longer), Err(FrameError::Length));
    }
}
