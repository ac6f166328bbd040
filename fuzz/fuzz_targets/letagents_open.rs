//! Opening arbitrary bytes as a letagents envelope must never panic, and must never accept
//! anything that was not sealed by the key `inner.from` names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::protocol::letagents as la;
use switchboard_core::util::SeededRng;

fuzz_target!(|data: &[u8]| {
    let bob = DeviceIdentity::generate(&mut SeededRng::new([2; 32]));
    if let Ok(opened) = la::open(data, &bob.boxs, &bob.keys()) {
        // Only reachable with a valid AEAD tag under bob's key and a valid signature: the
        // fuzzer cannot forge either, so reaching here means the input was a real envelope.
        assert_eq!(opened.inner.to, bob.keys().mailbox_id());
    }
    // The inner parser and address parser on their own.
    if let Ok(inner) = serde_json::from_slice::<la::Inner>(data) {
        let _ = inner.validate();
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(addr) = la::Address::parse(text) {
            assert_eq!(la::Address::parse(&addr.to_string()), Ok(addr));
        }
    }
});
