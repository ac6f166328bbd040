//! Every case of the normative Agent Identity 1.0 vectors (Appendix A): keys, events (JCS, hash,
//! signature), signatures, Agent IDs, strict JSON, closed event shapes, Max-Seen-Nonce, origins,
//! Agent URLs, request JWTs and the live-write submission sequence.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod agent_common;

use std::collections::BTreeMap;

use agent_common::*;
use switchboard_core::protocol::agent_identity::ed25519::{SignatureError, verify_strict};
use switchboard_core::protocol::agent_identity::encoding::{Hash32, b64, b64_array};
use switchboard_core::protocol::agent_identity::envelope::{Envelope, EnvelopeError, Event};
use switchboard_core::protocol::agent_identity::json::{self, JsonError};
use switchboard_core::protocol::agent_identity::jwt::{JwtError, JwtPolicy, sign_request_jwt, verify_request_jwt};
use switchboard_core::protocol::agent_identity::live_write::{
    LiveWrite, LiveWriteError, NonceCacheEntry, apply_max_seen_nonce, check_live_write,
};
use switchboard_core::protocol::agent_identity::{AgentId, AgentUrl, ErrorCode, Origin};

#[test]
fn keys_derive_their_agent_ids() {
    for k in identity()["keys"].as_array().unwrap() {
        let key = signing_key(s(&k["seed"]));
        let id = AgentId::of(&key);
        assert_eq!(b64(id.public_key()), s(&k["public_key"]));
        assert_eq!(id.to_string(), s(&k["agent_id"]));
        assert_eq!(AgentId::parse(s(&k["agent_id"])), Ok(id));
    }
}

/// The extension members each vector event's protocol defines (Discourse's room binding).
fn extensions_of(event: &serde_json::Value) -> Vec<&str> {
    event.as_object().unwrap().keys().map(String::as_str).filter(|k| !EVENT_KEYS.contains(k)).collect()
}

const EVENT_KEYS: [&str; 6] = ["protocol", "type", "actor", "created_at", "nonce", "payload"];

#[test]
fn events_reproduce_jcs_hash_and_signature() {
    for v in identity()["events"].as_array().unwrap() {
        let name = s(&v["name"]);
        let ext = extensions_of(&v["event"]);
        let event = Event::from_value(&strict(&v["event"]), &ext).unwrap();
        assert_eq!(String::from_utf8(event.to_jcs()).unwrap(), s(&v["jcs"]), "{name}: jcs");
        assert_eq!(event.hash().to_string(), s(&v["hash"]), "{name}: hash");
        let envelope = event.sign(&signing_key(s(&v["seed"]))).unwrap();
        assert_eq!(b64(envelope.signature()), s(&v["signature"]), "{name}: signature");
        // And the signed envelope verifies when parsed back.
        let reparsed = Envelope::parse(&envelope.to_jcs(), &ext).unwrap();
        assert_eq!(reparsed, envelope, "{name}");
        // Canonicalizing the vector's JCS text is the identity.
        assert_eq!(json::canonicalize(s(&v["jcs"]).as_bytes()).unwrap(), s(&v["jcs"]).as_bytes(), "{name}");
    }
}

#[test]
fn signatures_verify_exactly_as_marked() {
    for v in identity()["signatures"].as_array().unwrap() {
        let name = s(&v["name"]);
        let key: [u8; 32] = b64_array(s(&v["public_key"])).unwrap();
        let message = Hash32::parse(s(&v["message"])).unwrap();
        let sig: [u8; 64] = b64_array(s(&v["signature"])).unwrap();
        let result = verify_strict(&key, message.as_bytes(), &sig);
        assert_eq!(result.is_ok(), v["valid"].as_bool().unwrap(), "{name}: {result:?}");
    }
}

#[test]
fn invalid_signatures_fail_for_the_stated_reason() {
    let by_name: BTreeMap<String, Result<(), SignatureError>> = identity()["signatures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let key: [u8; 32] = b64_array(s(&v["public_key"])).unwrap();
            let msg = Hash32::parse(s(&v["message"])).unwrap();
            let sig: [u8; 64] = b64_array(s(&v["signature"])).unwrap();
            (s(&v["name"]).to_owned(), verify_strict(&key, msg.as_bytes(), &sig))
        })
        .collect();
    assert_eq!(by_name["S not reduced (S + L)"], Err(SignatureError::NonReducedS));
    assert_eq!(by_name["non-canonical R encoding"], Err(SignatureError::NonCanonicalR));
    assert_eq!(
        by_name["non-canonical public key encoding of the identity point"],
        Err(SignatureError::NonCanonicalKey)
    );
    assert_eq!(
        by_name["small-order public key and R: identity with S = 0 verifies any message under a lenient verifier"],
        Err(SignatureError::SmallOrderKey)
    );
    assert_eq!(by_name["tampered message"], Err(SignatureError::Invalid));
}

#[test]
fn agent_ids_parse_canonically() {
    let v = identity();
    for ok in v["agent_ids"]["valid"].as_array().unwrap() {
        let id = AgentId::parse(s(ok)).unwrap();
        assert_eq!(id.to_string(), s(ok));
    }
    for bad in v["agent_ids"]["invalid"].as_array().unwrap() {
        assert!(AgentId::parse(s(&bad["value"])).is_err(), "{}", s(&bad["name"]));
    }
}

#[test]
fn strict_json_accepts_and_rejects_as_marked() {
    let v = identity();
    for ok in v["json"]["valid"].as_array().unwrap() {
        let parsed = json::parse(s(&ok["text"]).as_bytes()).unwrap();
        // JCS: sorted keys, the surrogate pair as a literal code point, integers as digits.
        assert_eq!(
            json::to_jcs_string(&parsed),
            "{\"a\":\"😀\",\"m\":-9007199254740991,\"n\":9007199254740991}",
            "{}",
            s(&ok["name"])
        );
    }
    let expected: BTreeMap<&str, fn(&JsonError) -> bool> = BTreeMap::from([
        ("duplicate member name at the top level", (|e| matches!(e, JsonError::DuplicateKey(_))) as fn(&_) -> _),
        ("duplicate member name nested in a payload", |e| matches!(e, JsonError::DuplicateKey(_))),
        ("unpaired high surrogate", |e| matches!(e, JsonError::UnpairedSurrogate(_))),
        ("unpaired low surrogate", |e| matches!(e, JsonError::UnpairedSurrogate(_))),
        ("integer above the safe range", |e| matches!(e, JsonError::UnsafeInteger(_))),
        ("integer below the safe range", |e| matches!(e, JsonError::UnsafeInteger(_))),
    ]);
    for bad in v["json"]["invalid"].as_array().unwrap() {
        let name = s(&bad["name"]);
        let err = json::parse(s(&bad["text"]).as_bytes()).unwrap_err();
        assert!(expected[name](&err), "{name}: {err:?}");
        // An envelope containing it is refused as invalid_event.
        let err = Envelope::parse(s(&bad["text"]).as_bytes(), &[]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidEvent, "{name}");
    }
}

#[test]
fn closed_event_shapes_are_enforced() {
    for bad in identity()["events_closed_shape"]["invalid"].as_array().unwrap() {
        let err = Event::from_value(&strict(&bad["event"]), &[]).unwrap_err();
        assert!(matches!(err, EnvelopeError::Shape(_)), "{}: {err:?}", s(&bad["name"]));
        assert_eq!(err.code(), ErrorCode::InvalidEvent);
    }
}

#[test]
fn max_seen_nonce_is_bounded() {
    for v in identity()["max_seen_nonce"].as_array().unwrap() {
        let name = s(&v["name"]);
        let result = apply_max_seen_nonce(v["next_nonce"].as_u64().unwrap(), int(&v["now_ms"]), s(&v["header"]));
        if v["accepted"].as_bool().unwrap() {
            assert_eq!(result, Ok(v["next_after"].as_u64().unwrap()), "{name}");
        } else {
            assert!(result.is_err(), "{name}: {result:?}");
        }
    }
}

#[test]
fn origins_validate_as_marked() {
    let v = identity();
    for ok in v["origins"]["valid"].as_array().unwrap() {
        assert_eq!(Origin::parse(s(ok)).map(|o| o.to_string()), Ok(s(ok).to_owned()));
    }
    for bad in v["origins"]["invalid"].as_array().unwrap() {
        assert!(Origin::parse(s(bad)).is_err(), "{}", s(bad));
    }
}

#[test]
fn agent_urls_parse_into_their_components() {
    let v = identity();
    for ok in v["agent_urls"]["valid"].as_array().unwrap() {
        let text = s(&ok["value"]);
        let url = AgentUrl::parse(text).unwrap();
        let p = &ok["parsed"];
        assert_eq!(url.agent_id.to_string(), s(&p["agent_id"]), "{text}");
        match (&url.resource, p.get("protocol")) {
            (Some((protocol, resource)), Some(want)) => {
                assert_eq!(protocol, s(want));
                assert_eq!(resource, s(&p["resource"]));
            }
            (None, None) => {}
            other => panic!("{text}: {other:?}"),
        }
        let routes: Vec<&str> = url.routes.iter().map(Origin::as_str).collect();
        let want: Vec<&str> = p["routes"].as_array().unwrap().iter().map(s).collect();
        assert_eq!(routes, want, "{text}");
        assert_eq!(url.to_string(), text, "round trip");
    }
    for bad in v["agent_urls"]["invalid"].as_array().unwrap() {
        assert!(AgentUrl::parse(s(&bad["value"])).is_err(), "{}", s(&bad["name"]));
    }
}

fn jwt_policy(v: &serde_json::Value) -> JwtPolicy {
    JwtPolicy { max_lifetime_secs: int(&v["max_ttl_secs"]), ..JwtPolicy::default() }
}

#[test]
fn request_jwts_verify_as_marked() {
    let all = identity();
    let v = &all["request_jwts"];
    let audience = Origin::parse(s(&v["audience"])).unwrap();
    let now = int(&v["now_secs"]);
    for ok in v["valid"].as_array().unwrap() {
        let claims = verify_request_jwt(s(&ok["token"]), &audience, now, jwt_policy(v)).unwrap();
        let want = &ok["claims"];
        assert_eq!(claims.subject.to_string(), s(&want["iss"]));
        assert_eq!(claims.subject.to_string(), s(&want["sub"]));
        assert_eq!(claims.audience.as_str(), s(&want["aud"]));
        assert_eq!((claims.iat, claims.exp), (int(&want["iat"]), int(&want["exp"])));
        // Ed25519 is deterministic: the token is reproduced byte for byte.
        let key = signing_key(s(&all["keys"][0]["seed"]));
        assert_eq!(sign_request_jwt(&key, &audience, claims.iat, claims.exp, None), s(&ok["token"]));
    }
    let expected: BTreeMap<&str, JwtError> = BTreeMap::from([
        ("algorithm other than EdDSA", JwtError::Algorithm),
        ("kid differs from iss", JwtError::Subject),
        ("sub differs from iss", JwtError::Subject),
        ("audience with a path", JwtError::Audience),
        ("audience of another origin", JwtError::Audience),
        ("expired", JwtError::Lifetime),
        ("exp not after iat", JwtError::Lifetime),
        ("lifetime above the maximum", JwtError::Lifetime),
        ("signed by a key other than kid", JwtError::Signature),
        ("tampered signature", JwtError::Signature),
        ("two compact parts", JwtError::Malformed),
    ]);
    for bad in v["invalid"].as_array().unwrap() {
        let name = s(&bad["name"]);
        let err = verify_request_jwt(s(&bad["token"]), &audience, now, jwt_policy(v)).unwrap_err();
        assert_eq!(err, expected[name], "{name}");
    }
}

#[test]
fn submission_sequence_produces_every_outcome_in_order() {
    let all = identity();
    let v = &all["submissions"];
    let window = int(&v["window_ms"]);
    let envelopes: BTreeMap<String, Envelope> = v["envelopes"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, e)| {
            let env = Envelope::parse(&bytes_of(e), &[]).unwrap();
            assert_eq!(env.hash().to_string(), s(&e["hash"]));
            (name.clone(), env)
        })
        .collect();
    // One nonce store across the whole sequence; history is what each step lists.
    let mut cache: BTreeMap<AgentId, NonceCacheEntry> = BTreeMap::new();
    for step in v["steps"].as_array().unwrap() {
        let name = s(&step["name"]);
        let env = &envelopes[s(&step["envelope"])];
        let now = int(&step["now_ms"]);
        let in_history = step["accepted"].as_array().unwrap().iter().any(|a| envelopes[s(a)].hash() == env.hash());
        let outcome = check_live_write(env, in_history, cache.get(env.actor()), now, window);
        let got = match outcome {
            Ok(LiveWrite::Accept) => {
                let entry = NonceCacheEntry::after_accept(cache.get(env.actor()), env.event().nonce, now, window);
                cache.insert(*env.actor(), entry);
                "accepted"
            }
            Ok(LiveWrite::Resubmission) => "resubmission",
            Err(e @ LiveWriteError::TimestampOutOfWindow) | Err(e @ LiveWriteError::NonceNotGreater { .. }) => {
                e.code().as_str()
            }
        };
        assert_eq!(got, s(&step["expected"]), "{name}");
    }
}
