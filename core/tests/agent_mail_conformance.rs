//! The conformance list of Agent Mail §11 for the sender, recipient and (pure) relay roles, one
//! behaviour per test: tampering, wrong recipient, wrong card or header, expired and stale cards,
//! route changes, ciphertext and framing failures, signer rebinding, invalid outer signatures,
//! sender blocking, conflicting message IDs, duplicate re-encryption, lower-nonce arrival, key
//! rotation with queued old mail, reply binding, unauthorized reads and deletes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod agent_common;

use agent_common::FixedRng;
use ed25519_dalek::SigningKey;
use switchboard_core::protocol::agent_identity::encoding::b64;
use switchboard_core::protocol::agent_identity::envelope::{EnvelopeError, Event};
use switchboard_core::protocol::agent_identity::json::{Object, Value};
use switchboard_core::protocol::agent_identity::jwt::{JwtPolicy, sign_request_jwt};
use switchboard_core::protocol::agent_identity::live_write::{DEFAULT_WINDOW_MS, LiveWrite, NonceCacheEntry};
use switchboard_core::protocol::agent_identity::{AgentId, Hash32, Origin};
use switchboard_core::protocol::agent_mail::card::{CardPayload, CardUnusable, PinError, PinOutcome, check_pin};
use switchboard_core::protocol::agent_mail::hpke::{self, HpkeError};
use switchboard_core::protocol::agent_mail::message::{MessageError, ReplyError, check_reply};
use switchboard_core::protocol::agent_mail::packet::{
    self, FramingError, PacketError, PacketHeader, SealError, SealRequest, frame, seal, unframe,
};
use switchboard_core::protocol::agent_mail::recipient::{
    self, MessageCommitment, ReceiveError, RetainedKey, SenderPolicy, Verdict,
};
use switchboard_core::protocol::agent_mail::relay::{
    self, Admission, CurrentCard, Delivery, DeliveryResult, MailCode, RelayError,
};
use switchboard_core::protocol::agent_mail::{
    DAY_MS, Id16, MAX_TTL_MS, MailAddress, MailboxCard, Message, PROTOCOL, Packet, Part, Pin,
};
use switchboard_core::util::SeededRng;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

const T0: i64 = 1_790_726_400_000;
const MAILBOX: Id16 = Id16([7; 16]);

fn alice() -> SigningKey {
    SigningKey::from_bytes(&[0xa1; 32])
}

fn bob() -> SigningKey {
    SigningKey::from_bytes(&[0xb0; 32])
}

fn mallory() -> SigningKey {
    SigningKey::from_bytes(&[0x66; 32])
}

fn bob_box(generation: u8) -> StaticSecret {
    StaticSecret::from([0xb1 + generation; 32])
}

fn relay_origin() -> Origin {
    Origin::parse("https://relay.example").unwrap()
}

fn mirror_origin() -> Origin {
    Origin::parse("https://mirror.example").unwrap()
}

fn card_with(owner: &SigningKey, nonce: u64, secret: &StaticSecret, routes: &[Origin], created_at: i64) -> MailboxCard {
    MailboxCard::sign(
        owner,
        created_at,
        nonce,
        CardPayload {
            mailbox_id: MAILBOX,
            expires_at: created_at + DAY_MS,
            receive_until: created_at + 2 * DAY_MS,
            public_key: PublicKey::from(secret).to_bytes(),
            routes: routes.to_vec(),
            max_packet_bytes: 65536,
        },
    )
    .unwrap()
}

/// Bob's card, generation `g` (nonce 100 + g, key `bob_box(g)`), at relay and mirror.
fn bob_card(g: u8) -> MailboxCard {
    card_with(&bob(), 100 + u64::from(g), &bob_box(g), &[relay_origin(), mirror_origin()], T0)
}

fn letter(rng: &mut SeededRng, text: &str) -> Message {
    let mut m = Message::new(rng, AgentId::of(&alice()), AgentId::of(&bob()), T0, T0 + DAY_MS, vec![Part::text(text)]);
    m.subject = Some("hello".into());
    m
}

fn seal_to(card: &MailboxCard, message: &Message, nonce: u64, seed: u8) -> Packet {
    let req = SealRequest { sender: &alice(), card, message, created_at: T0, nonce };
    seal(&req, T0, &mut FixedRng(vec![seed; 32])).unwrap()
}

fn keys(generations: &[u8]) -> Vec<RetainedKey> {
    generations.iter().map(|g| RetainedKey { card: bob_card(*g), secret: bob_box(*g) }).collect()
}

fn bob_receives(
    packet_bytes: &[u8],
    keys: &[RetainedKey],
    now: i64,
) -> Result<(recipient::Opened, Verdict), ReceiveError> {
    recipient::receive(packet_bytes, None, &AgentId::of(&bob()), keys, now, |_| SenderPolicy::Allow, |_| None)
}

/// Builds a packet bypassing every sender check: arbitrary plaintext, header and signer.
fn forge(signer: &SigningKey, card: &MailboxCard, header: PacketHeader, plaintext: &[u8], nonce: u64) -> Packet {
    let actor = AgentId::of(signer);
    let aad = packet::aad(&actor, T0, nonce, &header);
    let (enc, ct) =
        hpke::seal_base(&card.payload().public_key, hpke::INFO, &aad, plaintext, Zeroizing::new([0x33; 32])).unwrap();
    let header_value = Value::Object(
        Object::new()
            .with("mailbox_id", header.mailbox_id.to_string())
            .with("card_hash", header.card_hash.to_string())
            .with("expires_at", header.expires_at),
    );
    let payload = Object::new().with("header", header_value).with("enc", b64(&enc)).with("ciphertext", b64(&ct));
    let event = Event {
        protocol: PROTOCOL.into(),
        event_type: "mail.submit".into(),
        actor,
        created_at: T0,
        nonce,
        payload: Value::Object(payload),
        extensions: Object::new(),
    };
    Packet::parse(&event.sign(signer).unwrap().to_jcs()).unwrap()
}

fn header_for(card: &MailboxCard, message: &Message) -> PacketHeader {
    PacketHeader { mailbox_id: card.mailbox_id(), card_hash: card.hash(), expires_at: message.expires_at }
}

// ---------------------------------------------------------------- sender role

#[test]
fn contact_address_routes_are_only_where_to_fetch_the_card() {
    let card = bob_card(0);
    let addr = MailAddress::parse(&format!("{}?route=https://relay.example", card.stable_address())).unwrap();
    assert_eq!(addr.owner, AgentId::of(&bob()));
    assert_eq!(addr.mailbox_id, MAILBOX);
    assert_eq!(addr.card_urls(), vec![format!("https://relay.example/v1/mailboxes/{MAILBOX}/card")]);
    assert_eq!(addr.stable(), card.stable_address());
    assert_eq!(addr.to_string(), format!("{}?route=https://relay.example", card.stable_address()));
    // A Profile endpoint's card URL carries the same information.
    let (route, id) = relay_card_url(&addr);
    assert_eq!((route.as_str(), id), ("https://relay.example", MAILBOX));
    // Not a mail address.
    assert!(MailAddress::parse(&format!("{}/knowledge/{MAILBOX}", AgentId::of(&bob()))).is_err());
    assert!(MailAddress::parse(&format!("{}/mail/short", AgentId::of(&bob()))).is_err());
}

fn relay_card_url(addr: &MailAddress) -> (Origin, Id16) {
    switchboard_core::protocol::agent_mail::address::parse_card_url(&addr.card_urls()[0]).unwrap()
}

#[test]
fn pin_keeps_the_greatest_nonce_and_refuses_same_nonce_conflicts() {
    let v1 = bob_card(0);
    let v2 = bob_card(1);
    let pin = match check_pin(None, &v1).unwrap() {
        PinOutcome::Advanced(p) => p,
        PinOutcome::Same => unreachable!(),
    };
    assert_eq!(check_pin(Some(&pin), &v1), Ok(PinOutcome::Same));
    let pin2 = match check_pin(Some(&pin), &v2).unwrap() {
        PinOutcome::Advanced(p) => p,
        PinOutcome::Same => unreachable!(),
    };
    assert_eq!(check_pin(Some(&pin2), &v1), Err(PinError::Older));
    // Same nonce, different card (another key): conflict, the pin stays.
    let twin = card_with(&bob(), 101, &bob_box(9), &[relay_origin()], T0);
    assert_eq!(check_pin(Some(&pin2), &twin), Err(PinError::Conflict));
    // Another mailbox or owner never matches the pin.
    let foreign = card_with(&mallory(), 500, &bob_box(0), &[relay_origin()], T0);
    assert_eq!(check_pin(Some(&pin2), &foreign), Err(PinError::OtherMailbox));
    assert!(!pin2.discardable(T0 + MAX_TTL_MS));
    assert!(pin2.discardable(T0 + MAX_TTL_MS + 300_000));
}

#[test]
fn closed_or_expired_higher_card_still_pins_and_blocks_older_cards() {
    let open = bob_card(0);
    let closed = card_with(&bob(), 150, &bob_box(0), &[], T0);
    let pin = Pin::of(&closed);
    assert_eq!(check_pin(Some(&pin), &open), Err(PinError::Older));
    assert_eq!(closed.check_sendable(T0), Err(CardUnusable::Closed));
    let expired_later = card_with(&bob(), 160, &bob_box(0), &[relay_origin()], T0 - 2 * DAY_MS);
    assert_eq!(expired_later.check_sendable(T0), Err(CardUnusable::Expired));
    assert!(matches!(check_pin(Some(&pin), &expired_later), Ok(PinOutcome::Advanced(_))));
}

#[test]
fn sender_refuses_expired_closed_and_future_cards() {
    let mut rng = SeededRng::new([1; 32]);
    let msg = letter(&mut rng, "hi");
    let expired = bob_card(0);
    let req = SealRequest { sender: &alice(), card: &expired, message: &msg, created_at: T0 + DAY_MS, nonce: 1 };
    assert_eq!(seal(&req, T0 + DAY_MS, &mut FixedRng(vec![1; 32])), Err(SealError::Card(CardUnusable::Expired)));
    let future = card_with(&bob(), 101, &bob_box(0), &[relay_origin()], T0 + 300_001);
    let req = SealRequest { sender: &alice(), card: &future, message: &msg, created_at: T0, nonce: 1 };
    assert_eq!(seal(&req, T0, &mut FixedRng(vec![1; 32])), Err(SealError::Card(CardUnusable::NotYetValid)));
    let closed = card_with(&bob(), 102, &bob_box(0), &[], T0);
    let req = SealRequest { sender: &alice(), card: &closed, message: &msg, created_at: T0, nonce: 1 };
    assert_eq!(seal(&req, T0, &mut FixedRng(vec![1; 32])), Err(SealError::Card(CardUnusable::Closed)));
}

#[test]
fn sender_binds_signer_recipient_and_card_lifetime() {
    let mut rng = SeededRng::new([2; 32]);
    let card = bob_card(0);
    let msg = letter(&mut rng, "hi");
    // Signer rebinding at the source: mallory cannot sign alice's message.
    let req = SealRequest { sender: &mallory(), card: &card, message: &msg, created_at: T0, nonce: 1 };
    assert_eq!(seal(&req, T0, &mut FixedRng(vec![1; 32])), Err(SealError::WrongSender));
    // Wrong card: a message to bob sealed to mallory's card.
    let other = card_with(&mallory(), 1, &bob_box(0), &[relay_origin()], T0);
    let req = SealRequest { sender: &alice(), card: &other, message: &msg, created_at: T0, nonce: 1 };
    assert_eq!(seal(&req, T0, &mut FixedRng(vec![1; 32])), Err(SealError::WrongRecipient));
    // The deadline may not outlive the card's receive_until.
    let mut long = msg.clone();
    long.expires_at = card.payload().receive_until + 1;
    let req = SealRequest { sender: &alice(), card: &card, message: &long, created_at: T0, nonce: 1 };
    assert_eq!(seal(&req, T0, &mut FixedRng(vec![1; 32])), Err(SealError::BeyondReceiveUntil));
    // An expired message is never silently renewed.
    let req = SealRequest { sender: &alice(), card: &card, message: &msg, created_at: T0, nonce: 1 };
    let late = msg.expires_at;
    assert_eq!(seal(&req, late, &mut FixedRng(vec![1; 32])), Err(SealError::Card(CardUnusable::Expired)));
    let mut short = msg.clone();
    short.expires_at = T0 + 1000;
    let req = SealRequest { sender: &alice(), card: &card, message: &short, created_at: T0, nonce: 1 };
    assert_eq!(seal(&req, T0 + 1000, &mut FixedRng(vec![1; 32])), Err(SealError::MessageExpired));
    // A message dated after its packet.
    let mut later = msg.clone();
    later.created_at = T0 + 300_001;
    let req = SealRequest { sender: &alice(), card: &card, message: &later, created_at: T0, nonce: 1 };
    assert_eq!(seal(&req, T0, &mut FixedRng(vec![1; 32])), Err(SealError::MessageAfterPacket));
}

#[test]
fn sender_respects_card_and_protocol_size_limits_exactly() {
    let mut rng = SeededRng::new([3; 32]);
    let mut card_payload = bob_card(0).payload().clone();
    card_payload.max_packet_bytes = 4096;
    let small = MailboxCard::sign(&bob(), T0, 120, card_payload).unwrap();
    let mut msg = letter(&mut rng, "x");
    // Grow the attachment until the packet no longer fits; the predicted size must be exact.
    let mut last_ok = None;
    for len in (0..4096).step_by(64) {
        msg.parts = vec![Part::bytes("application/octet-stream", vec![0; len], Some("a.bin"))];
        let req = SealRequest { sender: &alice(), card: &small, message: &msg, created_at: T0, nonce: 1 };
        match seal(&req, T0, &mut FixedRng(vec![5; 32])) {
            Ok(p) => {
                assert!(p.size() <= 4096);
                assert_eq!(p.size(), p.to_jcs().len());
                last_ok = Some(p.size());
            }
            Err(SealError::TooLarge { size, limit }) => {
                assert_eq!(limit, 4096);
                assert!(size > 4096);
                break;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(last_ok.is_some());
}

#[test]
fn retries_reuse_the_packet_and_reencryption_keeps_the_message() {
    let mut rng = SeededRng::new([4; 32]);
    let msg = letter(&mut rng, "once");
    let first = seal_to(&bob_card(0), &msg, 10, 1);
    // A retry is the same bytes (the caller keeps them); a new card means a new packet.
    let again = Packet::parse(&first.to_jcs()).unwrap();
    assert_eq!(again.id(), first.id());
    let rotated = seal_to(&bob_card(1), &msg, 11, 2);
    assert_ne!(rotated.id(), first.id());
    assert_eq!(rotated.header().expires_at, first.header().expires_at);
    let keys = keys(&[0, 1]);
    let a = bob_receives(&first.to_jcs(), &keys, T0).unwrap().0;
    let b = bob_receives(&rotated.to_jcs(), &keys, T0).unwrap().0;
    assert_eq!(a.message, b.message);
    assert_eq!(a.dedup_key(), b.dedup_key());
    assert_ne!(a.packet_id, b.packet_id, "packet IDs and message IDs are never interchanged");
}

// ---------------------------------------------------------------- recipient role

#[test]
fn tampering_with_any_signed_field_is_refused_before_decryption() {
    let mut rng = SeededRng::new([5; 32]);
    let p = seal_to(&bob_card(0), &letter(&mut rng, "t"), 10, 1);
    let text = String::from_utf8(p.to_jcs()).unwrap();
    for (from, to) in [
        ("\"nonce\":10", "\"nonce\":11"),
        (&format!("\"expires_at\":{}", T0 + DAY_MS), &format!("\"expires_at\":{}", T0 + DAY_MS - 1)),
        ("\"ciphertext\":\"", "\"ciphertext\":\"A"),
    ] {
        let tampered = text.replacen(from, to, 1);
        assert_ne!(tampered, text);
        let err = bob_receives(tampered.as_bytes(), &keys(&[0]), T0).unwrap_err();
        assert!(
            matches!(
                err,
                ReceiveError::Packet(PacketError::Envelope(EnvelopeError::HashMismatch))
                    | ReceiveError::Packet(PacketError::CiphertextLength)
                    | ReceiveError::Packet(PacketError::Shape(_))
            ),
            "{from}: {err:?}"
        );
    }
}

#[test]
fn invalid_outer_signature_is_refused_before_hpke() {
    let mut rng = SeededRng::new([6; 32]);
    let p = seal_to(&bob_card(0), &letter(&mut rng, "s"), 10, 1);
    let mut v = p.to_value();
    if let Value::Object(o) = &mut v {
        o.insert("signature", Value::from(b64(&[1u8; 64])));
    }
    let bytes = switchboard_core::protocol::agent_identity::json::to_jcs(&v);
    let err = bob_receives(&bytes, &keys(&[0]), T0).unwrap_err();
    assert!(matches!(err, ReceiveError::Packet(PacketError::Envelope(EnvelopeError::Signature(_)))), "{err:?}");
    assert_eq!(err.code(), MailCode::Identity(switchboard_core::protocol::agent_identity::ErrorCode::InvalidSignature));
}

#[test]
fn signer_rebinding_with_a_valid_signature_fails_decryption() {
    let mut rng = SeededRng::new([7; 32]);
    let p = seal_to(&bob_card(0), &letter(&mut rng, "mine"), 10, 1);
    // Mallory re-signs alice's exact payload under her own key.
    let mut event = p.envelope().event().clone();
    event.actor = AgentId::of(&mallory());
    let rebound = event.sign(&mallory()).unwrap();
    let err = bob_receives(&rebound.to_jcs(), &keys(&[0]), T0).unwrap_err();
    assert_eq!(err, ReceiveError::Decrypt(HpkeError::Open));
}

#[test]
fn changed_header_or_metadata_resigned_by_the_sender_fails_decryption() {
    let mut rng = SeededRng::new([8; 32]);
    let card = bob_card(0);
    let p = seal_to(&card, &letter(&mut rng, "h"), 10, 1);
    // Point the header at another retained card of bob's (wrong card), re-signed by alice.
    let other = bob_card(1);
    let mut event = p.envelope().event().clone();
    if let Value::Object(payload) = &mut event.payload {
        let mut header = payload.get("header").unwrap().as_object().unwrap().clone();
        header.insert("card_hash", Value::from(other.hash().to_string()));
        payload.insert("header", Value::Object(header));
    }
    let resigned = event.sign(&alice()).unwrap();
    let err = bob_receives(&resigned.to_jcs(), &keys(&[0, 1]), T0).unwrap_err();
    assert_eq!(err, ReceiveError::Decrypt(HpkeError::Open));
    // A header pointing at a card we never retained.
    let unknown = forge(&alice(), &card, PacketHeader { card_hash: Hash32([9; 32]), ..*p.header() }, &[0; 1024], 11);
    assert_eq!(bob_receives(&unknown.to_jcs(), &keys(&[0]), T0).unwrap_err(), ReceiveError::UnknownCard);
    // The header names another mailbox than the card's.
    let other_box = forge(&alice(), &card, PacketHeader { mailbox_id: Id16([1; 16]), ..*p.header() }, &[0; 1024], 12);
    assert_eq!(bob_receives(&other_box.to_jcs(), &keys(&[0]), T0).unwrap_err(), ReceiveError::MailboxMismatch);
}

#[test]
fn message_for_another_recipient_is_refused() {
    let mut rng = SeededRng::new([9; 32]);
    let card = bob_card(0);
    let mut msg = letter(&mut rng, "to carol");
    msg.to = AgentId::of(&mallory());
    let p = forge(&alice(), &card, header_for(&card, &msg), &frame(&msg.to_jcs()).unwrap(), 10);
    assert_eq!(bob_receives(&p.to_jcs(), &keys(&[0]), T0).unwrap_err(), ReceiveError::RecipientMismatch);
    // And a packet opened by someone whose card this is not.
    let good = seal_to(&card, &letter(&mut rng, "bob"), 11, 1);
    let err = recipient::receive(
        &good.to_jcs(),
        None,
        &AgentId::of(&mallory()),
        &keys(&[0]),
        T0,
        |_| SenderPolicy::Allow,
        |_| None,
    )
    .unwrap_err();
    assert_eq!(err, ReceiveError::NotOurCard);
}

#[test]
fn inner_sender_and_expiry_must_match_the_packet() {
    let mut rng = SeededRng::new([10; 32]);
    let card = bob_card(0);
    let msg = letter(&mut rng, "x");
    // Mallory signs a packet whose plaintext claims to be from alice.
    let p = forge(&mallory(), &card, header_for(&card, &msg), &frame(&msg.to_jcs()).unwrap(), 10);
    assert_eq!(bob_receives(&p.to_jcs(), &keys(&[0]), T0).unwrap_err(), ReceiveError::SenderMismatch);
    let header = PacketHeader { expires_at: msg.expires_at - 1, ..header_for(&card, &msg) };
    let p = forge(&alice(), &card, header, &frame(&msg.to_jcs()).unwrap(), 11);
    assert_eq!(bob_receives(&p.to_jcs(), &keys(&[0]), T0).unwrap_err(), ReceiveError::ExpiryMismatch);
}

#[test]
fn framing_and_plaintext_failures_are_refused() {
    let mut rng = SeededRng::new([11; 32]);
    let card = bob_card(0);
    let msg = letter(&mut rng, "frame");
    let json = msg.to_jcs();
    let header = header_for(&card, &msg);
    let open = |plain: &[u8], nonce: u64| {
        bob_receives(&forge(&alice(), &card, header, plain, nonce).to_jcs(), &keys(&[0]), T0).unwrap_err()
    };
    // Non-zero padding.
    let mut plain = frame(&json).unwrap().to_vec();
    *plain.last_mut().unwrap() = 1;
    assert_eq!(open(&plain, 1), ReceiveError::Framing(FramingError::NonZeroPadding));
    // Non-minimal padding: one extra block.
    let mut plain = frame(&json).unwrap().to_vec();
    plain.extend_from_slice(&[0; 1024]);
    assert_eq!(open(&plain, 2), ReceiveError::Framing(FramingError::NonMinimalPadding));
    // Length prefix beyond the plaintext.
    let mut plain = frame(&json).unwrap().to_vec();
    plain[..4].copy_from_slice(&5000u32.to_be_bytes());
    assert_eq!(open(&plain, 3), ReceiveError::Framing(FramingError::Length));
    // Valid JSON that is not JCS (a space).
    let spaced = [b"{ ".as_slice(), &json[1..]].concat();
    assert_eq!(open(&frame(&spaced).unwrap(), 4), ReceiveError::NotCanonical);
    // Not UTF-8 / not JSON.
    assert!(matches!(open(&frame(b"\xff\xfe").unwrap(), 5), ReceiveError::PlaintextJson(_)));
    // A null where a string belongs.
    let nulled = String::from_utf8(json.clone()).unwrap().replace("\"subject\":\"hello\"", "\"subject\":null");
    assert!(matches!(open(&frame(nulled.as_bytes()).unwrap(), 6), ReceiveError::Message(MessageError::Shape(_))));
    // Unknown member.
    let extra = String::from_utf8(json.clone()).unwrap().replacen("{", "{\"aa\":1,", 1);
    assert!(matches!(open(&frame(extra.as_bytes()).unwrap(), 7), ReceiveError::Message(MessageError::Shape(_))));
    // Text part that is not UTF-8.
    let mut bad_text = msg.clone();
    bad_text.parts = vec![Part::bytes("text/plain", vec![0xff], None)];
    let v = bad_text.to_jcs();
    assert_eq!(open(&frame(&v).unwrap(), 8), ReceiveError::Message(MessageError::TextEncoding(0)));
    // unframe on its own.
    assert_eq!(unframe(&[0, 0, 0]), Err(FramingError::Length));
    assert_eq!(unframe(&frame(b"{}").unwrap()), Ok(b"{}".as_slice()));
}

#[test]
fn ciphertext_that_is_not_a_padded_frame_is_refused_before_signature_checks() {
    let mut rng = SeededRng::new([12; 32]);
    let p = seal_to(&bob_card(0), &letter(&mut rng, "c"), 10, 1);
    let mut event = p.envelope().event().clone();
    if let Value::Object(payload) = &mut event.payload {
        payload.insert("ciphertext", Value::from(b64(&[0u8; 1041])));
    }
    let env = event.sign(&alice()).unwrap();
    assert_eq!(Packet::parse(&env.to_jcs()), Err(PacketError::CiphertextLength));
}

#[test]
fn future_dated_packets_and_messages_are_refused() {
    let mut rng = SeededRng::new([13; 32]);
    let card = bob_card(0);
    let p = seal_to(&card, &letter(&mut rng, "f"), 10, 1);
    assert_eq!(
        bob_receives(&p.to_jcs(), &keys(&[0]), T0 - 300_001).unwrap_err(),
        ReceiveError::Packet(PacketError::FromTheFuture)
    );
    let mut msg = letter(&mut rng, "later");
    msg.created_at = T0 + 300_001;
    msg.expires_at = T0 + DAY_MS;
    let p = forge(&alice(), &card, header_for(&card, &msg), &frame(&msg.to_jcs()).unwrap(), 11);
    assert_eq!(bob_receives(&p.to_jcs(), &keys(&[0]), T0 + 300_001).unwrap_err(), ReceiveError::MessageFromTheFuture);
}

#[test]
fn claimed_packet_id_must_be_the_packet_hash() {
    let mut rng = SeededRng::new([14; 32]);
    let p = seal_to(&bob_card(0), &letter(&mut rng, "id"), 10, 1);
    let err = recipient::verify(&p.to_jcs(), Some(&Hash32([0; 32])), T0).unwrap_err();
    assert_eq!(err, ReceiveError::PacketIdMismatch);
    assert!(recipient::verify(&p.to_jcs(), Some(&p.id()), T0).is_ok());
}

#[test]
fn blocked_sender_is_refused_before_decryption_at_recipient_and_relay() {
    let mut rng = SeededRng::new([15; 32]);
    let card = bob_card(0);
    let p = seal_to(&card, &letter(&mut rng, "spam"), 10, 1);
    // Recipient: the verified actor is blocked; no key is even needed.
    let err =
        recipient::receive(&p.to_jcs(), None, &AgentId::of(&bob()), &keys(&[]), T0, |_| SenderPolicy::Block, |_| None)
            .unwrap_err();
    assert_eq!(err, ReceiveError::SenderBlocked);
    // Relay: new acceptance refused as permission_denied...
    let err = relay::check_delivery(&p, &MAILBOX, &relay_origin(), Some(&card), None, Admission::Deny, T0).unwrap_err();
    assert_eq!(err.code().as_str(), "permission_denied");
    // ...but an exact retry of an already accepted packet is still an idempotent lookup.
    let done = DeliveryResult { packet_id: p.id(), accepted_at: T0 };
    assert_eq!(
        relay::check_delivery(&p, &MAILBOX, &relay_origin(), Some(&card), Some(&done), Admission::Deny, T0 + 5),
        Ok(Delivery::Resubmission(done))
    );
}

#[test]
fn conflicting_message_ids_are_refused_and_never_overwrite() {
    let mut rng = SeededRng::new([16; 32]);
    let card = bob_card(0);
    let msg = letter(&mut rng, "first");
    let (opened, verdict) = bob_receives(&seal_to(&card, &msg, 10, 1).to_jcs(), &keys(&[0]), T0).unwrap();
    let Verdict::New(commitment) = verdict else { panic!("not new") };
    let mut edited = msg.clone();
    edited.parts = vec![Part::text("edited")];
    let (reopened, _) = bob_receives(&seal_to(&card, &edited, 11, 2).to_jcs(), &keys(&[0]), T0).unwrap();
    assert_eq!(reopened.dedup_key(), opened.dedup_key());
    assert_eq!(reopened.decide(Some(&commitment), T0), Err(ReceiveError::ConflictingMessage));
    assert_eq!(ReceiveError::ConflictingMessage.code().as_str(), "invalid_event");
}

#[test]
fn duplicate_reencryption_is_one_inbox_item_even_after_the_deadline() {
    let mut rng = SeededRng::new([17; 32]);
    let msg = letter(&mut rng, "dup");
    let a = seal_to(&bob_card(0), &msg, 10, 1);
    let b = seal_to(&bob_card(1), &msg, 11, 2);
    let keys = keys(&[0, 1]);
    let (first, verdict) = bob_receives(&a.to_jcs(), &keys, T0).unwrap();
    let Verdict::New(stored) = verdict else { panic!() };
    let second = recipient::receive(
        &b.to_jcs(),
        None,
        &AgentId::of(&bob()),
        &keys,
        T0,
        |_| SenderPolicy::Allow,
        |k| {
            assert_eq!(*k, first.dedup_key());
            Some(stored)
        },
    )
    .unwrap();
    assert_eq!(second.1, Verdict::Duplicate);
    // Retransmitted after its deadline: still a duplicate, not a new item.
    let (late, _) = bob_receives(&a.to_jcs(), &keys, T0).unwrap();
    assert_eq!(late.decide(Some(&stored), msg.expires_at + 1), Ok(Verdict::Duplicate));
    // Forgotten once expired: never newly accepted.
    assert_eq!(late.decide(None, msg.expires_at), Err(ReceiveError::MessageExpired));
    assert_eq!(late.commitment(), MessageCommitment { content_hash: msg.content_hash(), expires_at: msg.expires_at });
}

#[test]
fn expired_historical_card_still_opens_queued_mail() {
    let mut rng = SeededRng::new([18; 32]);
    let card = bob_card(0);
    let p = seal_to(&card, &letter(&mut rng, "queued"), 10, 1);
    // The card expired (T0 + DAY); the message deadline is T0 + DAY too, so read just before.
    let now = card.payload().expires_at - 1;
    assert_eq!(card.check_sendable(now + 1), Err(CardUnusable::Expired));
    assert!(bob_receives(&p.to_jcs(), &keys(&[0]), now).is_ok());
}

#[test]
fn key_rotation_keeps_queued_old_mail_readable_with_the_retained_key() {
    let mut rng = SeededRng::new([19; 32]);
    let old = seal_to(&bob_card(0), &letter(&mut rng, "old"), 10, 1);
    let new = seal_to(&bob_card(1), &letter(&mut rng, "new"), 11, 2);
    // After rotation bob keeps both keys until the old card's receive_until.
    let both = keys(&[0, 1]);
    assert!(bob_receives(&old.to_jcs(), &both, T0).is_ok());
    assert!(bob_receives(&new.to_jcs(), &both, T0).is_ok());
    // Erasing the old key too early loses queued mail.
    assert_eq!(bob_receives(&old.to_jcs(), &keys(&[1]), T0).unwrap_err(), ReceiveError::UnknownCard);
}

#[test]
fn lower_nonce_packet_arriving_later_is_accepted_by_relay_and_recipient() {
    let mut rng = SeededRng::new([20; 32]);
    let card = bob_card(0);
    let later = seal_to(&card, &letter(&mut rng, "second"), 500, 1);
    let earlier = seal_to(&card, &letter(&mut rng, "first"), 400, 2);
    for p in [&later, &earlier] {
        assert_eq!(
            relay::check_delivery(p, &MAILBOX, &relay_origin(), Some(&card), None, Admission::Allow, T0),
            Ok(Delivery::Accept)
        );
        assert!(matches!(bob_receives(&p.to_jcs(), &keys(&[0]), T0).unwrap().1, Verdict::New(_)));
    }
}

#[test]
fn replies_carry_every_binding_and_reply_cards_must_be_the_senders() {
    let mut rng = SeededRng::new([21; 32]);
    let parent = letter(&mut rng, "question");
    let mut reply = Message::reply(&parent, &mut rng, T0 + 1, T0 + DAY_MS, vec![Part::text("answer")]);
    assert_eq!(check_reply(&parent, &reply), Ok(()));
    assert_eq!(reply.thread_id, parent.thread_id);
    assert_ne!(reply.message_id, parent.message_id);
    let mut wrong = reply.clone();
    wrong.thread_id = Id16([0; 16]);
    assert_eq!(check_reply(&parent, &wrong), Err(ReplyError::Thread));
    let mut wrong = reply.clone();
    wrong.to = AgentId::of(&mallory());
    assert_eq!(check_reply(&parent, &wrong), Err(ReplyError::Parties));
    let mut wrong = reply.clone();
    wrong.in_reply_to = None;
    assert_eq!(check_reply(&parent, &wrong), Err(ReplyError::Parent));
    // Reply cards are verified and must belong to `from`.
    reply.reply_card = Some(bob_card(0));
    assert_eq!(reply.validate(), Ok(()));
    let round = Message::parse(&reply.to_jcs()).unwrap();
    assert_eq!(round, reply);
    reply.reply_card = Some(card_with(&mallory(), 1, &bob_box(0), &[relay_origin()], T0));
    assert_eq!(reply.validate(), Err(MessageError::ReplyCardOwner));
    // ...and a forged embedded card fails verification on parse.
    let mut forged = parent.clone();
    forged.reply_card = Some(card_with(&alice(), 1, &bob_box(0), &[relay_origin()], T0));
    let text = String::from_utf8(forged.to_jcs()).unwrap().replacen("\"nonce\":1", "\"nonce\":2", 1);
    assert!(matches!(Message::parse(text.as_bytes()), Err(MessageError::ReplyCard(_))));
}

// ---------------------------------------------------------------- relay role (pure checks)

#[test]
fn relay_binds_the_mailbox_to_the_first_card_that_lists_it() {
    let card = card_with(&bob(), 100, &bob_box(0), &[mirror_origin()], T0);
    assert_eq!(
        relay::check_publish(&card, &relay_origin(), None, None, T0, DEFAULT_WINDOW_MS),
        Err(RelayError::FirstCardOmitsRelay)
    );
    let card = bob_card(0);
    assert_eq!(relay::check_publish(&card, &relay_origin(), None, None, T0, DEFAULT_WINDOW_MS), Ok(LiveWrite::Accept));
    let current = CurrentCard { card: card.clone(), accepted_at: T0 };
    let foreign = card_with(&mallory(), 900, &bob_box(0), &[relay_origin()], T0);
    assert_eq!(
        relay::check_publish(&foreign, &relay_origin(), Some(&current), None, T0, DEFAULT_WINDOW_MS),
        Err(RelayError::MailboxConflict)
    );
    // Outside the live-write window: a stale write even though the nonce is higher.
    let stale = card_with(&bob(), 105, &bob_box(0), &[relay_origin()], T0 - 300_001);
    let err = relay::check_publish(&stale, &relay_origin(), Some(&current), None, T0, DEFAULT_WINDOW_MS).unwrap_err();
    assert_eq!(err.code().as_str(), "timestamp_out_of_window");
    // The service-wide nonce cache also binds other mailboxes of the same actor.
    let cache = NonceCacheEntry { max_nonce: 200, valid_until: T0 + 600_000 };
    let err = relay::check_publish(&bob_card(1), &relay_origin(), Some(&current), Some(&cache), T0, DEFAULT_WINDOW_MS)
        .unwrap_err();
    assert_eq!(err.max_seen_nonce(), Some(200));
    assert_eq!(err.code().as_str(), "nonce_not_greater");
    assert_eq!(current.to_record().as_object().unwrap().len(), 2);
    assert_eq!(
        CurrentCard::from_record(&switchboard_core::protocol::agent_identity::json::to_jcs(&current.to_record())),
        Ok(current.clone())
    );
    assert!(current.forgettable(card.payload().receive_until));
}

#[test]
fn route_changes_move_delivery_and_stale_cards_are_refused() {
    let mut rng = SeededRng::new([22; 32]);
    let v0 = bob_card(0);
    let msg = letter(&mut rng, "route");
    let p0 = seal_to(&v0, &msg, 10, 1);
    // Bob moves to the mirror only: the relay stops accepting, the mirror accepts the new card's packets.
    let moved = card_with(&bob(), 101, &bob_box(1), &[mirror_origin()], T0);
    let p1 = seal_to(&moved, &msg, 11, 2);
    let at = |origin: &Origin, p: &Packet, current: &MailboxCard| {
        relay::check_delivery(p, &MAILBOX, origin, Some(current), None, Admission::Allow, T0)
    };
    assert_eq!(at(&relay_origin(), &p1, &moved), Err(RelayError::MailboxUnavailable));
    assert_eq!(at(&mirror_origin(), &p1, &moved), Ok(Delivery::Accept));
    // A packet for the old card at a relay whose current card is newer: stale_card.
    assert_eq!(at(&mirror_origin(), &p0, &moved), Err(RelayError::StaleCard));
    // A relay left with the old card rejects packets for the newer one.
    let both = card_with(&bob(), 102, &bob_box(1), &[relay_origin(), mirror_origin()], T0);
    let p2 = seal_to(&both, &msg, 12, 3);
    assert_eq!(at(&relay_origin(), &p2, &v0), Err(RelayError::StaleCard));
    // An expired current card is stale too; an expired packet is packet_expired.
    let err = relay::check_delivery(
        &p0,
        &MAILBOX,
        &relay_origin(),
        Some(&v0),
        None,
        Admission::Allow,
        v0.payload().expires_at,
    )
    .unwrap_err();
    assert_eq!(err, RelayError::StaleCard);
    assert_eq!(RelayError::PacketExpired.code().http_status(), 410);
    // The path must name the header's mailbox.
    assert_eq!(
        relay::check_delivery(&p0, &Id16([3; 16]), &relay_origin(), Some(&v0), None, Admission::Allow, T0),
        Err(RelayError::PathMismatch)
    );
}

#[test]
fn unauthorized_reads_and_deletes_are_refused() {
    let card = bob_card(0);
    let now = T0 / 1000;
    let bob_token = sign_request_jwt(&bob(), &relay_origin(), now, now + 300, None);
    let alice_token = sign_request_jwt(&alice(), &relay_origin(), now, now + 300, None);
    let mirror_token = sign_request_jwt(&bob(), &mirror_origin(), now, now + 300, None);
    let auth =
        |t: &str, owner: Option<&AgentId>| relay::authorize_owner(t, &relay_origin(), owner, now, JwtPolicy::default());
    assert_eq!(auth(&bob_token, Some(card.owner())), Ok(AgentId::of(&bob())));
    assert_eq!(auth(&alice_token, Some(card.owner())), Err(RelayError::PermissionDenied));
    assert_eq!(auth(&mirror_token, Some(card.owner())).unwrap_err().code().as_str(), "invalid_token");
    assert_eq!(auth("garbage", None).unwrap_err().code().as_str(), "invalid_token");
    assert_eq!(auth(&bob_token, None), Err(RelayError::MailboxUnavailable));
    assert_eq!(relay::bearer_token(&format!("Bearer {bob_token}")), Some(bob_token.as_str()));
    assert_eq!(relay::bearer_token("Basic abc"), None);
}

#[test]
fn list_limits_and_path_identifiers_are_validated() {
    assert_eq!(relay::parse_list_limit(None), Ok(100));
    assert_eq!(relay::parse_list_limit(Some("1000")), Ok(1000));
    for bad in ["0", "1001", "-1", "01", "", "1e3", "abc"] {
        assert_eq!(relay::parse_list_limit(Some(bad)).unwrap_err().code().as_str(), "invalid_request", "{bad}");
    }
    assert_eq!(relay::parse_mailbox_path(&MAILBOX.to_string()), Ok(MAILBOX));
    assert!(relay::parse_mailbox_path("AAECAwQFBgcICQoLDA0ODx").is_err());
    assert!(relay::parse_packet_path("x").is_err());
}

#[test]
fn content_stays_inert() {
    let part = Part::bytes("application/x-sh", b"rm -rf /".to_vec(), Some("../run.sh"));
    assert_eq!(part.as_text(), None);
    assert_eq!(part.display_name().as_deref(), Some("_._run.sh"));
}
