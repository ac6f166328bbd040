//! Parsing arbitrary text as a Switchboard contact link must never panic, and must never accept a
//! link that the identity key it names did not sign, or whose safety number is not its keys'.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_core::protocol::contact_link::ContactLink;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(link) = ContactLink::parse(text) {
        // Reaching here needs a valid Ed25519 signature by the key the link names, over exactly
        // this payload: what parsed must render to the same payload and keys.
        assert_eq!(link.letagents.address.keys.sig, link.identity_key());
        assert!(link.payload().contains(&link.safety_number()));
        assert!(text.trim().len() <= switchboard_core::protocol::contact_link::MAX_LINK_LEN);
    }
});
