//! The Agent Mail recipient path on arbitrary bytes and on fuzzer-edited valid packets: never
//! panics; a packet that opens is always the one message actually sealed to bob; plaintext
//! framing is unique; relay checks never panic on any parsed packet.
#![no_main]

use std::sync::LazyLock;

use ed25519_dalek::SigningKey;
use libfuzzer_sys::fuzz_target;
use switchboard_core::protocol::agent_identity::AgentId;
use switchboard_core::protocol::agent_identity::origin::Origin;
use switchboard_core::protocol::agent_mail::card::CardPayload;
use switchboard_core::protocol::agent_mail::packet::{SealRequest, frame, seal, unframe};
use switchboard_core::protocol::agent_mail::recipient::{self, RetainedKey, SenderPolicy};
use switchboard_core::protocol::agent_mail::relay::{self, Admission};
use switchboard_core::protocol::agent_mail::{DAY_MS, Id16, MailboxCard, Message, Packet, Part};
use switchboard_core::util::SeededRng;
use x25519_dalek::{PublicKey, StaticSecret};

const NOW: i64 = 1_790_726_400_000;

struct World {
    bob: AgentId,
    keys: Vec<RetainedKey>,
    card: MailboxCard,
    message: Message,
    packet: Vec<u8>,
    relay: Origin,
}

static WORLD: LazyLock<World> = LazyLock::new(|| {
    let alice = SigningKey::from_bytes(&[0xa1; 32]);
    let bob = SigningKey::from_bytes(&[0xb0; 32]);
    let secret = StaticSecret::from([0xb1; 32]);
    let relay = Origin::parse("https://relay.example").expect("origin");
    let payload = CardPayload {
        mailbox_id: Id16([7; 16]),
        expires_at: NOW + DAY_MS,
        receive_until: NOW + 2 * DAY_MS,
        public_key: PublicKey::from(&secret).to_bytes(),
        routes: vec![relay.clone()],
        max_packet_bytes: 65536,
    };
    let card = MailboxCard::sign(&bob, NOW, 100, payload).expect("card");
    let mut rng = SeededRng::new([9; 32]);
    let mut message =
        Message::new(&mut rng, AgentId::of(&alice), AgentId::of(&bob), NOW, NOW + DAY_MS, vec![Part::text("hi")]);
    message.subject = Some("fuzz".into());
    let req = SealRequest { sender: &alice, card: &card, message: &message, created_at: NOW, nonce: 1 };
    let packet = seal(&req, NOW, &mut rng).expect("seal").to_jcs();
    World {
        bob: AgentId::of(&bob),
        keys: vec![RetainedKey { card: card.clone(), secret }],
        card,
        message,
        packet,
        relay,
    }
});

fn open(w: &World, bytes: &[u8]) -> Option<Message> {
    recipient::receive(bytes, None, &w.bob, &w.keys, NOW, |_| SenderPolicy::Allow, |_| None)
        .ok()
        .map(|(o, _)| o.message)
}

fuzz_target!(|data: &[u8]| {
    let w = &*WORLD;
    // Arbitrary bytes: nothing but the sealed message can ever open.
    if let Some(m) = open(w, data) {
        assert_eq!(m, w.message);
    }
    if let Ok(p) = Packet::parse(data) {
        let _ = relay::check_delivery(&p, &w.card.mailbox_id(), &w.relay, Some(&w.card), None, Admission::Allow, NOW);
    }
    // Edits of the valid packet.
    let mut edited = w.packet.clone();
    for pair in data.chunks_exact(3).take(8) {
        let at = usize::from(u16::from_le_bytes([pair[0], pair[1]])) % edited.len();
        edited[at] ^= pair[2];
    }
    if let Some(m) = open(w, &edited) {
        assert_eq!(m, w.message, "an edited packet opened to another message");
    }
    // Framing is unique: a valid frame is exactly the frame of its JSON.
    if let Ok(json) = unframe(data) {
        assert_eq!(frame(json).expect("frame").as_slice(), data);
    }
    if let Ok(m) = Message::parse(data) {
        assert_eq!(Message::parse(&m.to_jcs()).expect("canonical message parses"), m);
    }
});
