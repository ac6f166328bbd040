//! Whatever `inner` a sender signs, sealing then opening gives back exactly those bytes when it
//! validates, and a clear error when it does not; flipping any byte of the envelope is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::protocol::letagents as la;
use switchboard_core::util::SeededRng;

fuzz_target!(|data: &[u8]| {
    let Some((&flip, rest)) = data.split_first() else { return };
    let Ok(inner_json) = std::str::from_utf8(rest) else { return };
    let mut rng = SeededRng::new([7; 32]);
    let alice = DeviceIdentity::generate(&mut rng);
    let bob = DeviceIdentity::generate(&mut rng);
    let Ok(env) = la::seal(&alice.sig, &bob.keys(), inner_json, &mut rng) else { return };
    match la::open(&env, &bob.boxs, &bob.keys()) {
        Ok(opened) => assert_eq!(opened.inner_json, inner_json),
        Err(e) => assert!(!matches!(e, la::OpenError::Decrypt | la::OpenError::Framing | la::OpenError::Plain), "{e}"),
    }
    let mut bad = env.clone();
    let i = usize::from(flip) * 131 % bad.len();
    bad[i] ^= 1;
    assert!(la::open(&bad, &bob.boxs, &bob.keys()).is_err());
});
