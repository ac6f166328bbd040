//! Agent Identity envelope verification on arbitrary bytes, and on a valid envelope with
//! fuzzer-chosen byte edits: never panics, and nothing verifies unless it is the signed event.
//! Also drives the Agent ID, Agent URL, origin and request-JWT parsers with the same input.
#![no_main]

use std::sync::LazyLock;

use ed25519_dalek::SigningKey;
use libfuzzer_sys::fuzz_target;
use switchboard_core::protocol::agent_identity::envelope::{Envelope, Event};
use switchboard_core::protocol::agent_identity::json::{Object, Value};
use switchboard_core::protocol::agent_identity::jwt::{JwtPolicy, verify_request_jwt};
use switchboard_core::protocol::agent_identity::{AgentId, AgentUrl, Origin};

static SIGNED: LazyLock<(Envelope, Vec<u8>)> = LazyLock::new(|| {
    let key = SigningKey::from_bytes(&[7; 32]);
    let event = Event {
        protocol: "agent-profile/1.0".into(),
        event_type: "profile.update".into(),
        actor: AgentId::of(&key),
        created_at: 1_779_753_600_000,
        nonce: 1_779_753_600_000,
        payload: Value::Object(Object::new().with("name", "Fuzz \u{e9}\u{1f600}").with("n", 42i64)),
        extensions: Object::new(),
    };
    let env = event.sign(&key).expect("signs");
    let bytes = env.to_jcs();
    (env, bytes)
});

fuzz_target!(|data: &[u8]| {
    let (signed, signed_bytes) = &*SIGNED;
    if let Ok(env) = Envelope::parse(data, &[]) {
        let again = Envelope::parse(&env.to_jcs(), &[]).expect("a verified envelope re-verifies canonically");
        assert_eq!(again, env);
        assert_eq!(env.hash(), env.event().hash());
    }
    // Edits of a valid envelope: (position, xor) pairs.
    let mut edited = signed_bytes.clone();
    for pair in data.chunks_exact(3).take(8) {
        let at = usize::from(u16::from_le_bytes([pair[0], pair[1]])) % edited.len();
        edited[at] ^= pair[2];
    }
    if let Ok(env) = Envelope::parse(&edited, &[]) {
        assert_eq!(env.hash(), signed.hash(), "an edited envelope verified with another event");
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(id) = AgentId::parse(text) {
            assert_eq!(id.to_string(), text);
        }
        if let Ok(url) = AgentUrl::parse(text) {
            assert_eq!(url.to_string(), text);
        }
        if let Ok(origin) = Origin::parse(text) {
            assert_eq!(origin.as_str(), text);
        }
        let audience = Origin::parse("https://api.example.com").expect("origin");
        let _ = verify_request_jwt(text, &audience, 1_779_753_700, JwtPolicy::default());
    }
});
