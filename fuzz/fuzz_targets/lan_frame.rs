//! LAN direct-delivery frames and bindings on arbitrary bytes: decoding never panics, what decodes
//! re-encodes to the same bytes (one encoding per value), no length prefix above 64 KiB is
//! accepted, and no decoded binding verifies unless an identity key really signed it. Relay
//! announcements likewise: canonical or refused, verified only against the key that signed them,
//! only for an https URL on the LAN, only within their window, and never after a one-byte change.
#![no_main]

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use libfuzzer_sys::fuzz_target;
use switchboard_core::protocol::lan::frame::{LEN_PREFIX, body_len};
use switchboard_core::protocol::lan::relay::canonical_lan_url;
use switchboard_core::protocol::lan::{
    Delivery, LanBinding, LanRequest, LanResponse, MAX_FRAME, ProtocolTag, RelayAnnouncement,
};

const NOW: i64 = 1_800_000_000_000;

fuzz_target!(|data: &[u8]| {
    // Whole frames, both directions: canonical or refused.
    if let Ok(req) = LanRequest::decode(data) {
        assert_eq!(req.encode(), data, "accepted request frame is not canonical");
        assert!(data.len() <= LEN_PREFIX + MAX_FRAME);
    }
    if let Ok(resp) = LanResponse::decode(data) {
        assert_eq!(resp.encode(), data, "accepted response frame is not canonical");
    }
    // Bodies on their own.
    if let Ok(req) = LanRequest::decode_body(data) {
        assert_eq!(req.encode().get(LEN_PREFIX..), Some(data));
    }
    if let Ok(resp) = LanResponse::decode_body(data) {
        assert_eq!(resp.encode().get(LEN_PREFIX..), Some(data));
    }
    // Length prefixes: nothing above the cap, nothing empty.
    if let Some(prefix) = data.first_chunk::<LEN_PREFIX>() {
        match body_len(*prefix) {
            Ok(n) => assert!((1..=MAX_FRAME).contains(&n)),
            Err(_) => {
                let n = u32::from_be_bytes(*prefix) as usize;
                assert!(n == 0 || n > MAX_FRAME);
            }
        }
    }

    // Bindings: canonical, never valid for a PeerId other than their own; checking a signature
    // against a key never panics.
    if let Ok(b) = LanBinding::decode(data) {
        assert_eq!(b.to_bytes(), data, "accepted binding is not canonical");
        assert!(b.check(b"not the peer", NOW).is_err());
        let _ = b.is_signed_by(&[9; 32]);
    }

    // Announcements: canonical; verifying against any key never panics, and one that verifies
    // names a canonical LAN URL.
    if let Ok(a) = RelayAnnouncement::decode(data) {
        assert_eq!(a.to_bytes(), data, "accepted announcement is not canonical");
        if let Ok(v) = a.verify(&[[9; 32]], NOW) {
            assert_eq!(canonical_lan_url(&v.url).as_deref(), Ok(v.url.as_str()));
        }
    }
    // Announcements signed over fuzzer-chosen URLs: signable exactly when the URL is an https LAN
    // URL; then verified by the signer's key only, and refused after any one-byte change.
    if let Some((&first, rest)) = data.split_first()
        && let Ok(url) = std::str::from_utf8(rest)
    {
        let key = SigningKey::from_bytes(&[first; 32]);
        let expiry = NOW + (i64::from(first) - 128) * 3_600_000;
        match RelayAnnouncement::sign(&key, url, [first; 32], expiry) {
            Ok(a) => {
                let canonical = canonical_lan_url(url).expect("signed a URL that is not a LAN URL");
                assert!(canonical.starts_with("https://"));
                assert_eq!(canonical_lan_url(&canonical).as_deref(), Ok(canonical.as_str()), "canonical form not stable");
                let own = key.verifying_key().to_bytes();
                let in_window = expiry + 10 * 60 * 1000 > NOW && expiry <= NOW + 25 * 3_600_000 + 10 * 60 * 1000;
                assert_eq!(a.verify(&[own], NOW).is_ok(), in_window);
                assert!(a.verify(&[[7; 32]], NOW).is_err(), "verified by a key that did not sign it");
                let req = LanRequest::Relay(a.clone());
                assert_eq!(LanRequest::decode(&req.encode()), Ok(req));
                let mut bytes = a.to_bytes();
                let i = usize::from(first) % bytes.len();
                if let Some(byte) = bytes.get_mut(i) {
                    *byte ^= 0x01 | (first & 0xf0);
                }
                if let Ok(changed) = RelayAnnouncement::decode(&bytes) {
                    assert!(changed.verify(&[own], NOW).is_err(), "a changed announcement verified (byte {i})");
                }
            }
            Err(_) => {
                let canonical = canonical_lan_url(url);
                assert!(canonical.is_err() || canonical.is_ok_and(|c| c.len() > 200));
            }
        }
    }

    // Bindings signed over fuzzer-chosen PeerIds and expiries verify exactly when in range,
    // survive a hello round trip, and fail after any one-byte change.
    if let Some((&first, rest)) = data.split_first() {
        let peer: Vec<u8> = rest.iter().copied().take(64).collect();
        if !peer.is_empty() {
            let key = SigningKey::from_bytes(&[first; 32]);
            let expiry = NOW + (i64::from(first) - 128) * 3_600_000;
            let b = LanBinding::sign(&key, &peer, expiry);
            let hello = LanRequest::Hello(vec![b.clone()]);
            assert_eq!(LanRequest::decode(&hello.encode()), Ok(hello));
            let pinned = BTreeMap::from([([7; 32], 0u8), (key.verifying_key().to_bytes(), 1u8)]);
            let judge = |b: &LanBinding| b.check(&peer, NOW).and_then(|t| t.admit(&pinned)).map(|v| v.contact);
            let ok = judge(&b) == Ok(1);
            let in_window = expiry + 10 * 60 * 1000 > NOW && expiry <= NOW + 25 * 3_600_000 + 10 * 60 * 1000;
            assert_eq!(ok, in_window, "expiry {expiry} verified={ok}");
            let mut bytes = b.to_bytes();
            let i = usize::from(first) % bytes.len();
            if let Some(byte) = bytes.get_mut(i) {
                *byte ^= 0x01 | (first & 0xf0);
            }
            if let Ok(changed) = LanBinding::decode(&bytes) {
                assert!(judge(&changed).is_err(), "a changed binding verified (byte {i})");
            }
        }
        // Deliveries of fuzzer bytes round-trip with their tag.
        let tag = if first & 1 == 0 { ProtocolTag::Letagents } else { ProtocolTag::AgentMail };
        if let Ok(d) = Delivery::new(tag, rest.to_vec()) {
            let f = LanRequest::Deliver(d.clone()).encode();
            assert_eq!(LanRequest::decode(&f), Ok(LanRequest::Deliver(d)));
        }
    }
});
