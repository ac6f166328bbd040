//! letmeknow wire decoding on arbitrary bytes: the PrivateMessage header parser, invite links,
//! invite blobs and the group log / invite API JSON bodies never panic, accept only canonical
//! encodings, and round-trip what they accept.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_core::protocol::letmeknow::header::{self, ContentType};
use switchboard_core::protocol::letmeknow::invite::{InviteKey, InviteLink, Role};
use switchboard_core::protocol::letmeknow::wire;
use switchboard_core::util::SeededRng;

/// JSON that parses must serialize and parse back to the same value.
fn json_round_trip<T>(data: &[u8])
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    if let Ok(value) = serde_json::from_slice::<T>(data) {
        let text = serde_json::to_vec(&value).expect("serialize");
        assert_eq!(serde_json::from_slice::<T>(&text).expect("reparse"), value);
    }
}

fuzz_target!(|data: &[u8]| {
    // Header parser on arbitrary bytes. Lengths are minimal varints, so the prefix up to the
    // content type is the unique encoding of what was parsed.
    if let Ok(h) = header::parse(data) {
        let mut prefix = vec![0, 1, 0, 2];
        header::encode_varint(h.group_id.len(), &mut prefix);
        prefix.extend_from_slice(&h.group_id);
        prefix.extend_from_slice(&h.epoch.to_be_bytes());
        prefix.push(match h.content_type {
            ContentType::Application => 1,
            ContentType::Commit => 3,
        });
        assert!(data.starts_with(&prefix), "accepted header is not canonical");
        // Any truncation of an accepted message is refused.
        assert!(header::parse(&data[..data.len() - 1]).is_err());
    }
    // Messages built from fuzzer-chosen parts parse back to the same header.
    if let Some((&first, rest)) = data.split_first() {
        let split = usize::from(first) % (rest.len() + 1);
        let (group_id, body) = rest.split_at(split);
        let epoch = u64::from(first).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let content_type = if first & 1 == 0 { ContentType::Application } else { ContentType::Commit };
        let built = header::build(group_id, epoch, content_type, body);
        let h = header::parse(&built).expect("built message parses");
        assert_eq!((h.group_id.as_slice(), h.epoch, h.content_type), (group_id, epoch, content_type));
    }

    if let Ok(text) = std::str::from_utf8(data) {
        // Invite links: what parses prints to a link that parses to the same invite.
        if let Ok(link) = InviteLink::parse(text) {
            let again = InviteLink::parse(&link.to_link()).expect("printed link parses");
            assert_eq!(again, link);
            assert_eq!(again.to_link(), link.to_link());
        }
        // Standard base64 is strict: what decodes re-encodes to the same text.
        if let Some(bytes) = wire::b64_decode(text) {
            assert_eq!(wire::b64(&bytes), text);
        }
    }

    // Invite blobs: arbitrary bytes never open; a sealed blob opens only under its own role.
    let key = InviteKey::derive(&[7; 32], "0123456789abcdef0123456789abcdef");
    assert!(key.open(Role::Join, data).is_err(), "arbitrary bytes opened as an invite blob");
    let sealed = key.seal(Role::Welcome, data, &mut SeededRng::new([3; 32])).expect("seal");
    assert_eq!(key.open(Role::Welcome, &sealed).expect("open"), data);
    assert!(key.open(Role::Join, &sealed).is_err(), "a welcome blob opened as a join blob");

    // API bodies.
    json_round_trip::<wire::RelayToClientPosted>(data);
    json_round_trip::<wire::RelayToClientEpoch>(data);
    json_round_trip::<wire::RelayToClientLogEntry>(data);
    json_round_trip::<Vec<wire::RelayToClientLogEntry>>(data);
    json_round_trip::<wire::ClientToRelayInvite>(data);
    json_round_trip::<wire::InviteData>(data);
    json_round_trip::<wire::JoinBlob>(data);
    json_round_trip::<wire::WelcomeBlob>(data);
});
