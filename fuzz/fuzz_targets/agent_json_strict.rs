//! Strict I-JSON parsing and JCS on arbitrary bytes: never panics; whatever is accepted is also
//! JSON to serde_json, its JCS form parses back to the same value, and JCS is idempotent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_core::protocol::agent_identity::json;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = json::parse(data) else { return };
    // Strict acceptance is a subset of ordinary JSON.
    assert!(serde_json::from_slice::<serde_json::Value>(data).is_ok(), "accepted text serde_json refuses");
    let jcs = json::to_jcs(&value);
    let again = json::parse(&jcs).expect("JCS output is strict JSON");
    assert_eq!(again, value, "JCS changed the value");
    assert_eq!(json::to_jcs(&again), jcs, "JCS is not idempotent");
    assert_eq!(json::canonicalize(data).as_deref(), Ok(jcs.as_slice()));
});
