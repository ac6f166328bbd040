//! JSON Schema conformance of produced objects against `agent-mail-1.0.schema.json`, with a small
//! interpreter for exactly the keywords that schema uses (an unknown keyword or pattern fails the
//! test, so a schema change cannot be silently ignored). Patterns are matched by hand-written
//! predicates keyed by the exact pattern text.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod agent_common;

use agent_common::*;
use serde_json::{Value as J, json};
use switchboard_core::protocol::agent_identity::http::ListPage;
use switchboard_core::protocol::agent_identity::json::Value;
use switchboard_core::protocol::agent_identity::origin::Origin;
use switchboard_core::protocol::agent_mail::packet::{SealRequest, seal};
use switchboard_core::protocol::agent_mail::relay::{self, CurrentCard, DeliveryResult, PacketRecord};
use switchboard_core::protocol::agent_mail::{MailboxCard, Message};

struct Schema {
    root: J,
}

const B64: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn b64_chars(s: &str) -> bool {
    s.chars().all(|c| B64.contains(c))
}

/// `[A-Za-z0-9_-]{n}[last]` exactly.
fn fixed_b64(s: &str, n: usize, last: &str) -> bool {
    s.chars().count() == n + 1 && b64_chars(s) && s.chars().last().is_some_and(|c| last.contains(c))
}

fn pattern_matches(pattern: &str, s: &str) -> bool {
    let media_token = |t: &str| {
        let mut cs = t.chars();
        cs.next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && cs.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "!#$&^_.+-".contains(c))
    };
    match pattern {
        r"^did:agent:[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$(?![\s\S])" => {
            s.strip_prefix("did:agent:").is_some_and(|k| fixed_b64(k, 42, "AEIMQUYcgkosw048"))
        }
        r"^[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$(?![\s\S])" => fixed_b64(s, 42, "AEIMQUYcgkosw048"),
        r"^[A-Za-z0-9_-]{21}[AQgw]$(?![\s\S])" => fixed_b64(s, 21, "AQgw"),
        r"^[A-Za-z0-9_-]{85}[AQgw]$(?![\s\S])" => fixed_b64(s, 85, "AQgw"),
        r"^(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-][AQgw]|[A-Za-z0-9_-]{2}[AEIMQUYcgkosw048])?$(?![\s\S])" => {
            let tail = s.len() % 4;
            b64_chars(s)
                && match tail {
                    0 => true,
                    2 => s.ends_with(|c| "AQgw".contains(c)),
                    3 => s.ends_with(|c| "AEIMQUYcgkosw048".contains(c)),
                    _ => false,
                }
        }
        r"^https://[^/?#@\s]+$(?![\s\S])" => s
            .strip_prefix("https://")
            .is_some_and(|h| !h.is_empty() && !h.chars().any(|c| "/?#@".contains(c) || c.is_whitespace())),
        r":443$(?![\s\S])" => s.ends_with(":443"),
        r"^[a-z0-9][a-z0-9!#$&^_.+\-]*/[a-z0-9][a-z0-9!#$&^_.+\-]*$(?![\s\S])" => {
            s.split_once('/').is_some_and(|(t, st)| media_token(t) && media_token(st))
        }
        other => panic!("pattern not known to this interpreter: {other}"),
    }
}

impl Schema {
    fn load() -> Self {
        Self { root: serde_json::from_str(MAIL_SCHEMA).unwrap() }
    }

    fn def(&self, name: &str) -> &J {
        &self.root["$defs"][name]
    }

    fn resolve(&self, reference: &str) -> &J {
        let name = reference.strip_prefix("#/$defs/").unwrap_or_else(|| panic!("unsupported $ref {reference}"));
        self.def(name)
    }

    /// Errors found validating `v` against `schema` (empty when valid).
    fn check(&self, schema: &J, v: &J, path: &str, errors: &mut Vec<String>) {
        let obj = schema.as_object().unwrap();
        for (kw, arg) in obj {
            let mut fail = |msg: String| errors.push(format!("{path}: {kw}: {msg}"));
            match kw.as_str() {
                "$schema" | "$id" | "title" | "description" | "$defs" => {}
                "$ref" => self.check(self.resolve(arg.as_str().unwrap()), v, path, errors),
                "type" => {
                    let ok = match arg.as_str().unwrap() {
                        "object" => v.is_object(),
                        "array" => v.is_array(),
                        "string" => v.is_string(),
                        "integer" => v.is_i64() || v.is_u64(),
                        other => panic!("type {other}"),
                    };
                    if !ok {
                        fail(format!("not {arg}"));
                    }
                }
                "const" => {
                    if v != arg {
                        fail(format!("{v} != {arg}"));
                    }
                }
                "pattern" => {
                    if let Some(s) = v.as_str()
                        && !pattern_matches(arg.as_str().unwrap(), s)
                    {
                        fail(format!("{s:?} does not match"));
                    }
                }
                "minLength" | "maxLength" => {
                    if let Some(s) = v.as_str() {
                        let n = s.chars().count() as u64;
                        let bound = arg.as_u64().unwrap();
                        if (kw == "minLength" && n < bound) || (kw == "maxLength" && n > bound) {
                            fail(format!("length {n}"));
                        }
                    }
                }
                "minimum" | "maximum" => {
                    if let Some(n) = v.as_i64() {
                        let bound = arg.as_i64().unwrap();
                        if (kw == "minimum" && n < bound) || (kw == "maximum" && n > bound) {
                            fail(format!("{n}"));
                        }
                    }
                }
                "required" => {
                    if let Some(o) = v.as_object() {
                        for r in arg.as_array().unwrap() {
                            if !o.contains_key(r.as_str().unwrap()) {
                                fail(format!("missing {r}"));
                            }
                        }
                    }
                }
                "properties" => {
                    if let Some(o) = v.as_object() {
                        for (k, sub) in arg.as_object().unwrap() {
                            if let Some(child) = o.get(k) {
                                self.check(sub, child, &format!("{path}.{k}"), errors);
                            }
                        }
                    }
                }
                "additionalProperties" => {
                    if let (Some(o), Some(false)) = (v.as_object(), arg.as_bool()) {
                        let known = obj.get("properties").and_then(J::as_object);
                        for k in o.keys() {
                            if !known.is_some_and(|p| p.contains_key(k)) {
                                fail(format!("unexpected {k}"));
                            }
                        }
                    }
                }
                "items" => {
                    if let Some(a) = v.as_array() {
                        for (i, item) in a.iter().enumerate() {
                            self.check(arg, item, &format!("{path}[{i}]"), errors);
                        }
                    }
                }
                "minItems" | "maxItems" => {
                    if let Some(a) = v.as_array() {
                        let n = a.len() as u64;
                        let bound = arg.as_u64().unwrap();
                        if (kw == "minItems" && n < bound) || (kw == "maxItems" && n > bound) {
                            fail(format!("{n} items"));
                        }
                    }
                }
                "uniqueItems" => {
                    if let (Some(a), Some(true)) = (v.as_array(), arg.as_bool())
                        && a.iter().enumerate().any(|(i, x)| a[i + 1..].contains(x))
                    {
                        fail("duplicates".into());
                    }
                }
                "allOf" => {
                    for sub in arg.as_array().unwrap() {
                        self.check(sub, v, path, errors);
                    }
                }
                "oneOf" => {
                    let passing = arg
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|sub| {
                            let mut e = Vec::new();
                            self.check(sub, v, path, &mut e);
                            e.is_empty()
                        })
                        .count();
                    if passing != 1 {
                        fail(format!("{passing} alternatives match"));
                    }
                }
                "not" => {
                    let mut e = Vec::new();
                    self.check(arg, v, path, &mut e);
                    if e.is_empty() {
                        fail("forbidden form matches".into());
                    }
                }
                other => panic!("schema keyword not supported by this interpreter: {other}"),
            }
        }
    }

    fn errors(&self, def: &str, v: &J) -> Vec<String> {
        let mut errors = Vec::new();
        let schema = if def == "root" { &self.root } else { self.def(def) };
        self.check(schema, v, def, &mut errors);
        errors
    }

    fn assert_valid(&self, def: &str, v: &J) {
        let errors = self.errors(def, v);
        assert!(errors.is_empty(), "{def}: {errors:#?}");
    }
}

fn to_json(v: &Value) -> J {
    serde_json::to_value(v).unwrap()
}

#[test]
fn produced_cards_packets_and_messages_match_the_schema() {
    let schema = Schema::load();
    let v = mail();
    let sender = signing_key(s(&v["keys"]["sender_seed_hex"]));
    for e in v["envelopes"].as_object().unwrap().values() {
        let card = MailboxCard::parse(&bytes_of(e)).unwrap();
        schema.assert_valid("mailboxCardEnvelope", &to_json(&card.to_value()));
        schema.assert_valid("root", &to_json(&card.to_value()));
        let record = CurrentCard { card, accepted_at: 1 }.to_record();
        schema.assert_valid("cardAcceptedRecord", &to_json(&record));
    }
    for m in v["messages"].as_object().unwrap().values() {
        let msg = Message::from_value(&strict(m)).unwrap();
        schema.assert_valid("messagePayload", &to_json(&msg.to_value()));
    }
    let mut records = Vec::new();
    for (i, (name, e)) in v["encryptions"].as_object().unwrap().iter().enumerate() {
        let card = MailboxCard::parse(&bytes_of(&v["envelopes"][s(&e["card"])])).unwrap();
        let msg = Message::from_value(&strict(&v["messages"][s(&e["message"])])).unwrap();
        let req = SealRequest { sender: &sender, card: &card, message: &msg, created_at: int(&v["now"]), nonce: 900 };
        let packet = seal(&req, int(&v["now"]), &mut FixedRng(vec![i as u8 + 1; 32])).unwrap();
        schema.assert_valid("packetEnvelope", &to_json(&packet.to_value()));
        schema.assert_valid("root", &to_json(&packet.to_value()));
        let result = DeliveryResult { packet_id: packet.id(), accepted_at: 5 };
        schema.assert_valid("deliveryResult", &to_json(&result.to_value()));
        let record = PacketRecord { packet_id: packet.id(), packet, accepted_at: 5, seq: i as u64 + 1 };
        schema.assert_valid("packetRecord", &to_json(&record.to_value()));
        // Records round-trip through the client-side reader.
        assert_eq!(PacketRecord::from_value(&record.to_value()).unwrap(), record, "{name}");
        records.push(record.to_value());
    }
    let page = ListPage { result: records, next_cursor: Some("c1".into()) };
    schema.assert_valid("packetList", &to_json(&page.to_value()));
    let doc = relay::discovery_document(&Origin::parse("https://relay.example").unwrap());
    schema.assert_valid("discoveryDocument", &to_json(&doc.to_value()));
}

#[test]
fn the_schema_interpreter_rejects_what_the_schema_forbids() {
    let schema = Schema::load();
    let v = mail();
    let good = v["messages"]["message"].clone();
    let mut with_null = good.clone();
    with_null["subject"] = J::Null;
    assert!(!schema.errors("messagePayload", &with_null).is_empty());
    let mut extra = good.clone();
    extra["x"] = json!(1);
    assert!(!schema.errors("messagePayload", &extra).is_empty());
    let mut card = v["envelopes"]["card"].clone();
    card["event"]["payload"]["routes"] = json!(["https://a.example:443"]);
    assert!(!schema.errors("mailboxCardEnvelope", &card).is_empty());
    let mut packet = v["encryptions"]["original"]["packet"].clone();
    packet["event"]["payload"]["ciphertext"] = json!("AAAA");
    assert!(!schema.errors("packetEnvelope", &packet).is_empty());
    // And the strict parsers agree on each of these.
    assert!(Message::from_value(&strict(&with_null)).is_err());
    assert!(Message::from_value(&strict(&extra)).is_err());
    assert!(MailboxCard::parse(&bytes_of(&card)).is_err());
    assert!(switchboard_core::protocol::agent_mail::Packet::parse(&bytes_of(&packet)).is_err());
}
