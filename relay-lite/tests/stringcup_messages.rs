//! Stringcup v2 messages over real HTTP: sends and their validation, idempotency, batches,
//! inbox pages, per-party numbering, acknowledgement, the pending limits (both kinds of `507`)
//! and long polling.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod pg_common;
mod sc_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sc_common::{b64, ciphertext, ct, message, relay, relay_config, relay_with, unb64};
use serde_json::{Value, json};
use switchboard_core::util::random_array;

#[tokio::test]
async fn a_send_is_stored_with_201_and_delivered_as_sent() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let body = message(&bob.id, &ct("hello bob"));
    let reply = relay.send_with(&alice, &body, None).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    assert_eq!(reply.body, json!({"sent_seq": 1, "status": "stored"}));
    let inbox = relay.inbox(&bob, "").await;
    assert_eq!(inbox["count"], 1);
    let m = &inbox["messages"][0];
    assert_eq!(m["id"], 1);
    assert_eq!(m["sender_id"], alice.id);
    assert_eq!(m["recipient_id"], bob.id);
    assert_eq!(m["header"], body["header"]);
    assert_eq!(m["ciphertext"], body["ciphertext"]);
    assert!(m["created_at"].is_string());
    // Reading does not delete.
    assert_eq!(relay.inbox(&bob, "").await["count"], 1);
}

/// The header and ciphertext of `shared/vectors/stringcup-v2.vectors.json`.
const VECTOR_EPHEMERAL_PUB: &str = "eaYx7t4b+cmPEgMs3q3Q56B5OY/HhriMyEbsia+FpRo=";
const VECTOR_IV: &str = "AAECAwQFBgcICQoL";
const VECTOR_CIPHERTEXT: &str = "btwHTFggkI6egrEjS8zLVW2WOmTtn8G/e4Awe8YV71o5+IJFP/xSYYpQcoBj1q0=";

#[tokio::test]
async fn the_published_vector_passes_through_byte_for_byte() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let header =
        json!({"version": 2, "algo": "x25519+ecies+aes256gcm", "ephemeral_pub": VECTOR_EPHEMERAL_PUB, "iv": VECTOR_IV});
    let body = json!({"recipient_id": bob.id, "header": header, "ciphertext": VECTOR_CIPHERTEXT});
    assert_eq!(relay.send_with(&alice, &body, None).await.status, 201);
    let m = &relay.inbox(&bob, "").await["messages"][0];
    assert_eq!(m["header"], header);
    assert_eq!(m["ciphertext"], VECTOR_CIPHERTEXT);
}

#[tokio::test]
async fn unpadded_base64_is_accepted_and_delivered_padded() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let mut body = message(&bob.id, &[9u8; 17]);
    let padded = body["ciphertext"].as_str().unwrap().to_owned();
    body["ciphertext"] = json!(padded.trim_end_matches('='));
    assert_eq!(relay.send_with(&alice, &body, None).await.status, 201);
    assert_eq!(relay.inbox(&bob, "").await["messages"][0]["ciphertext"], padded);
}

#[tokio::test]
async fn numbering_is_per_party_and_the_sender_never_learns_the_recipients_number() {
    let relay = relay().await;
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    assert_eq!(relay.send(&carol, &bob, "carol 1").await, 1);
    assert_eq!(relay.send(&carol, &bob, "carol 2").await, 2);
    assert_eq!(relay.send(&alice, &carol, "alice 1").await, 1);
    assert_eq!(relay.send(&alice, &bob, "alice 2").await, 2, "alice's own outbound count");
    assert_eq!(relay.inbox_ids(&bob).await, vec![1, 2, 3], "bob's own inbound count");
    assert_eq!(relay.inbox_ids(&carol).await, vec![1]);
    let bob_page = relay.inbox(&bob, "").await;
    assert_eq!(bob_page["messages"][2]["sender_id"], alice.id);
    // Acked numbers are never reused.
    relay.ack(&bob, &[3]).await;
    relay.send(&alice, &bob, "alice 3").await;
    assert_eq!(relay.inbox_ids(&bob).await, vec![1, 2, 4]);
}

#[tokio::test]
async fn malformed_sends_are_refused_with_400() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let good = message(&bob.id, &ct("x"));
    let mut cases: Vec<(&str, Value)> = Vec::new();
    let mut with = |name, edit: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        edit(&mut v);
        cases.push((name, v));
    };
    with("recipient is not an sc- id", &|v| v["recipient_id"] = json!("bob"));
    with("version 3", &|v| v["header"]["version"] = json!(3));
    with("other algorithm", &|v| v["header"]["algo"] = json!("x25519+ratchet"));
    with("ephemeral key of 31 bytes", &|v| v["header"]["ephemeral_pub"] = json!(b64(&[1; 31])));
    with("iv of 16 bytes", &|v| v["header"]["iv"] = json!(b64(&[1; 16])));
    with("ciphertext not base64", &|v| v["ciphertext"] = json!("***"));
    with("ciphertext shorter than a tag", &|v| v["ciphertext"] = json!(b64(&[1; 15])));
    with("unknown top-level field", &|v| v["sequence"] = json!(7));
    with("sender_id not a string", &|v| v["sender_id"] = json!(7));
    with("extra header field not a string", &|v| v["header"]["chain"] = json!(1));
    with("extra header field holding an object", &|v| v["header"]["purpose"] = json!({"nested": "x"}));
    with("extra header field with a bad name", &|v| v["header"]["no spaces"] = json!("x"));
    with("extra header field name too long", &|v| v["header"]["n".repeat(65)] = json!("x"));
    with("extra header field value too long", &|v| v["header"]["tag"] = json!("v".repeat(1025)));
    with("too many extra header fields", &|v| {
        for i in 0..17 {
            v["header"][format!("f{i}")] = json!("x");
        }
    });
    with("extra header fields too large together", &|v| {
        for i in 0..5 {
            v["header"][format!("f{i}")] = json!("v".repeat(1000));
        }
    });
    with("no header", &|v| {
        v.as_object_mut().unwrap().remove("header");
    });
    for (name, body) in cases {
        let reply = relay.send_with(&alice, &body, None).await;
        assert_eq!(reply.status, 400, "{name}: {:?}", reply.body);
        assert_eq!(reply.code(), "bad_request", "{name}");
    }
    let not_json = relay
        .call(
            relay.req(&alice, reqwest::Method::POST, "/messages").header("content-type", "application/json").body("{"),
        )
        .await;
    assert_eq!(not_json.status, 400);
    assert!(relay.inbox_ids(&bob).await.is_empty());
}

#[tokio::test]
async fn a_sender_id_naming_the_token_identity_is_accepted_and_any_other_is_403() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    // The reference client states its own id; that is what the relay would record anyway.
    let mut own = message(&bob.id, &ct("signed by me"));
    own["sender_id"] = json!(alice.id);
    let reply = relay.send_with(&alice, &own, Some("own")).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    // Claiming to be someone else is refused, stores nothing and does not consume the key.
    for claimed in [bob.id.as_str(), "sc-aaaaaaaaaaaaaaaaaaaaaaaa", "bob"] {
        let mut forged = message(&bob.id, &ct("forged"));
        forged["sender_id"] = json!(claimed);
        let reply = relay.send_with(&alice, &forged, Some("forged")).await;
        assert_eq!((reply.status, reply.code()), (403, "forbidden"), "{claimed}: {:?}", reply.body);
        assert!(reply.message().contains("sender_id"));
    }
    // A malformed body is still a 400, whatever it claims.
    let mut malformed = message(&bob.id, &ct("x"));
    malformed["sender_id"] = json!(bob.id);
    malformed["header"]["iv"] = json!("short");
    assert_eq!(relay.send_with(&alice, &malformed, None).await.status, 400);
    let page = relay.inbox(&bob, "").await;
    assert_eq!(page["count"], 1);
    assert_eq!(page["messages"][0]["sender_id"], alice.id);
    assert_eq!(relay.send_with(&alice, &message(&bob.id, &ct("x")), Some("forged")).await.status, 201);
    // In a batch the claim is checked per entry.
    let mut forged = message(&bob.id, &ct("y"));
    forged["sender_id"] = json!(bob.id);
    let mut fine = message(&bob.id, &ct("z"));
    fine["sender_id"] = json!(alice.id);
    let reply = relay.post(&alice, "/messages/batch", &json!({ "messages": [forged, fine] })).await;
    assert_eq!(reply.body["sent"][0]["index"], 1);
    assert_eq!(
        (reply.body["failed"][0]["index"].as_u64(), reply.body["failed"][0]["status"].as_u64()),
        (Some(0), Some(403))
    );
}

#[tokio::test]
async fn extra_header_fields_reach_the_recipient_unchanged() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    // What the reference client's pairing verification sends, plus the bounds' edges.
    let mut body = message(&bob.id, &ct("[stringcup] pairing verification"));
    body["header"]["purpose"] = json!("pairing-verify");
    body["header"]["tag"] = json!("9f".repeat(32));
    body["header"]["unicode.ok-1_"] = json!("caf\u{e9} \u{2713} \"quoted\"\n");
    body["header"]["n".repeat(64)] = json!("");
    body["header"]["long"] = json!("v".repeat(1024));
    let reply = relay.send_with(&alice, &body, None).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    let plain = message(&bob.id, &ct("no extras"));
    relay.send_with(&alice, &plain, None).await;
    let page = relay.inbox(&bob, "").await;
    assert_eq!(page["messages"][0]["header"], body["header"], "every field, byte for byte");
    assert_eq!(page["messages"][1]["header"], plain["header"], "no extras, none added");
    // In a batch too.
    let mut entry = message(&bob.id, &ct("batched"));
    entry["header"]["purpose"] = json!("fan-out");
    let reply = relay.post(&alice, "/messages/batch", &json!({ "messages": [entry.clone()] })).await;
    assert_eq!(reply.body["count"], 1, "{:?}", reply.body);
    assert_eq!(relay.inbox(&bob, "?since_id=2").await["messages"][0]["header"], entry["header"]);
}

#[tokio::test]
async fn extra_header_fields_count_against_the_pending_byte_limits() {
    let relay = relay_with(|l| l.inbox_max_pending_bytes_per_sender = 300).await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let mut body = message(&bob.id, &ciphertext("a", 100));
    body["header"]["pad"] = json!("p".repeat(200));
    // 100 bytes of ciphertext + 210 of encoded extras (`{"pad":"..."}`) is past the 300-byte share.
    let reply = relay.send_with(&alice, &body, None).await;
    assert_eq!((reply.status, reply.code()), (507, "sender_share_full"), "{:?}", reply.body);
    body["header"]["pad"] = json!("p".repeat(180));
    assert_eq!(relay.send_with(&alice, &body, None).await.status, 201);
}

#[tokio::test]
async fn a_send_to_an_unknown_recipient_is_404() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let nobody = format!("sc-{}", "q".repeat(24));
    let reply = relay.send_with(&alice, &message(&nobody, &ct("anyone?")), None).await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.message(), "Recipient identity not found");
}

#[tokio::test]
async fn a_ciphertext_of_exactly_256_kib_is_accepted_and_one_byte_more_is_413() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let max = 256 * 1024;
    let reply = relay.send_with(&alice, &message(&bob.id, &ciphertext("max", max)), None).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    let over = relay.send_with(&alice, &message(&bob.id, &ciphertext("over", max + 1)), None).await;
    assert_eq!(over.status, 413);
    assert_eq!(over.code(), "too_large");
    let inbox = relay.inbox(&bob, "").await;
    assert_eq!(inbox["count"], 1);
    assert_eq!(unb64(inbox["messages"][0]["ciphertext"].as_str().unwrap()).len(), max);
    // A body far past any ciphertext is cut off before it is read whole.
    let huge = "A".repeat(2 * max);
    let reply = relay.send_with(&alice, &json!({"recipient_id": bob.id, "ciphertext": huge, "pad": huge}), None).await;
    assert_eq!(reply.status, 413);
}

#[tokio::test]
async fn a_retry_with_the_same_idempotency_key_replays_200_and_stores_nothing_new() {
    a_retry_with_the_same_idempotency_key_replays_200_and_stores_nothing_new_on(relay().await).await;
}

/// The same scenario on a relay whose store is PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_retry_with_the_same_idempotency_key_replays_200_and_stores_nothing_new() {
    let Some(pg) = pg_common::cluster() else { return };
    let url = pg.fresh_database().await;
    let relay = relay_config(|c| c.database = Some(url)).await;
    assert!(relay.relay.state().store().is_postgres());
    a_retry_with_the_same_idempotency_key_replays_200_and_stores_nothing_new_on(relay).await;
}

async fn a_retry_with_the_same_idempotency_key_replays_200_and_stores_nothing_new_on(relay: sc_common::Relay) {
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let body = message(&bob.id, &ct("exactly once"));
    let first = relay.send_with(&alice, &body, Some("retry-1")).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body, json!({"sent_seq": 1, "status": "stored"}));
    let again = relay.send_with(&alice, &body, Some("retry-1")).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body, json!({"sent_seq": 1, "status": "stored", "idempotent_replay": true}));
    // A retry that re-encrypted the same message (fresh ephemeral key) is the same send too.
    let reencrypted = relay.send_with(&alice, &message(&bob.id, &ct("exactly once")), Some("retry-1")).await;
    assert_eq!(reencrypted.status, 200);
    assert_eq!(relay.inbox_ids(&bob).await, vec![1]);
    // A fresh key is a fresh message.
    assert_eq!(relay.send_with(&alice, &body, Some("retry-2")).await.status, 201);
    assert_eq!(relay.inbox_ids(&bob).await, vec![1, 2]);
}

#[tokio::test]
async fn fifty_concurrent_retries_store_exactly_one_message() {
    let relay = Arc::new(relay_with(|l| l.sends_per_hour = 100_000).await);
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let body = message(&bob.id, &ct("under pressure"));
    // Each client does what the seed asks: on 409, back off briefly and retry the same key.
    let attempts = (0..50).map(|_| {
        let (relay, alice, body) = (relay.clone(), alice.clone(), body.clone());
        tokio::spawn(async move {
            let mut conflicts = 0;
            loop {
                let reply = relay.send_with(&alice, &body, Some("the-one-key")).await;
                if reply.status != 409 {
                    return (reply, conflicts);
                }
                assert_eq!(reply.code(), "idempotency_in_flight");
                conflicts += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    });
    let (mut created, mut replayed, mut conflicts) = (0, 0, 0);
    for attempt in attempts.collect::<Vec<_>>() {
        let (reply, seen) = attempt.await.unwrap();
        conflicts += seen;
        match reply.status {
            201 => created += 1,
            200 => {
                assert_eq!(reply.body["idempotent_replay"], true);
                replayed += 1;
            }
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
        assert_eq!(reply.body["sent_seq"], 1, "every answer names the one stored send");
    }
    assert_eq!((created, replayed), (1, 49), "{conflicts} conflicts on the way");
    assert_eq!(relay.inbox_ids(&bob).await, vec![1], "exactly one message stored");
}

#[tokio::test]
async fn idempotency_keys_are_scoped_to_the_sender() {
    let relay = relay().await;
    let (alice, carol, bob) =
        (relay.register("alice").await, relay.register("carol").await, relay.register("bob").await);
    assert_eq!(relay.send_with(&alice, &message(&bob.id, &ct("a")), Some("shared")).await.status, 201);
    assert_eq!(relay.send_with(&carol, &message(&bob.id, &ct("c")), Some("shared")).await.status, 201);
    assert_eq!(relay.inbox_ids(&bob).await.len(), 2);
}

#[tokio::test]
async fn a_key_refused_with_400_or_404_is_released_for_the_corrected_retry() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let nobody = format!("sc-{}", "z".repeat(24));
    assert_eq!(relay.send_with(&alice, &message(&nobody, &ct("x")), Some("k")).await.status, 404);
    let mut bad = message(&bob.id, &ct("x"));
    bad["header"]["version"] = json!(1);
    assert_eq!(relay.send_with(&alice, &bad, Some("k")).await.status, 400);
    let ok = relay.send_with(&alice, &message(&bob.id, &ct("x")), Some("k")).await;
    assert_eq!(ok.status, 201, "{:?}", ok.body);
}

#[tokio::test]
async fn a_key_refused_with_507_is_released_too() {
    let relay = relay_with(|l| l.inbox_max_pending_per_sender = 1).await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    relay.send(&alice, &bob, "fills the share").await;
    assert_eq!(relay.send_with(&alice, &message(&bob.id, &ct("x")), Some("k")).await.status, 507);
    relay.ack(&bob, &[1]).await;
    assert_eq!(relay.send_with(&alice, &message(&bob.id, &ct("x")), Some("k")).await.status, 201);
}

#[tokio::test]
async fn a_key_reused_for_a_different_recipient_is_422() {
    let relay = relay().await;
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    assert_eq!(relay.send_with(&alice, &message(&bob.id, &ct("x")), Some("k")).await.status, 201);
    let reply = relay.send_with(&alice, &message(&carol.id, &ct("y")), Some("k")).await;
    assert_eq!(reply.status, 422);
    assert_eq!(reply.code(), "idempotency_key_reused");
    assert!(relay.inbox_ids(&carol).await.is_empty());
}

#[tokio::test]
async fn malformed_idempotency_keys_are_400() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    for key in ["has space", &"k".repeat(256), "tab\tkey", ""] {
        let reply = relay.send_with(&alice, &message(&bob.id, &ct("x")), Some(key)).await;
        assert_eq!(reply.status, 400, "{key:?}");
    }
    assert_eq!(relay.send_with(&alice, &message(&bob.id, &ct("x")), Some(&"k".repeat(255))).await.status, 201);
}

#[tokio::test]
async fn an_idempotency_key_is_forgotten_after_its_retention() {
    let relay = relay_with(|l| l.idempotency_ttl_ms = 300).await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let body = message(&bob.id, &ct("x"));
    assert_eq!(relay.send_with(&alice, &body, Some("k")).await.status, 201);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let later = relay.send_with(&alice, &body, Some("k")).await;
    assert_eq!((later.status, later.body["sent_seq"].as_i64()), (201, Some(2)));
}

#[tokio::test]
async fn a_batch_reports_partial_success_by_index() {
    let relay = relay().await;
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    let departed = format!("sc-{}", "d".repeat(24));
    let mut malformed = message(&carol.id, &ct("bad"));
    malformed["header"]["iv"] = json!("short");
    let entries = json!([
        message(&bob.id, &ct("to bob")),
        message(&departed, &ct("to nobody")),
        malformed,
        message(&carol.id, &ct("to carol")),
        "not even an object",
    ]);
    let reply = relay.post(&alice, "/messages/batch", &json!({ "messages": entries })).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.body["status"], "processed");
    assert_eq!(reply.body["count"], 2);
    assert_eq!(
        reply.body["sent"],
        json!([{"index": 0, "recipient_id": bob.id, "sent_seq": 1}, {"index": 3, "recipient_id": carol.id, "sent_seq": 2}])
    );
    let failed = reply.body["failed"].as_array().unwrap();
    let summary: Vec<(i64, u64)> =
        failed.iter().map(|f| (f["index"].as_i64().unwrap(), f["status"].as_u64().unwrap())).collect();
    assert_eq!(summary, vec![(1, 404), (2, 400), (4, 400)]);
    assert_eq!(failed[0]["recipient_id"], departed);
    assert_eq!(failed[0]["error"], "Recipient identity not found");
    assert!(failed[2]["recipient_id"].is_null());
    assert_eq!(relay.inbox_ids(&bob).await, vec![1]);
    assert_eq!(relay.inbox_ids(&carol).await, vec![1]);
}

#[tokio::test]
async fn a_batch_refuses_an_idempotency_key_and_more_than_200_entries() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let one = json!({ "messages": [message(&bob.id, &ct("x"))] });
    let keyed = relay
        .call(relay.req(&alice, reqwest::Method::POST, "/messages/batch").header("Idempotency-Key", "k").json(&one))
        .await;
    assert_eq!(keyed.status, 400);
    assert!(keyed.message().contains("Idempotency-Key"));
    let many: Vec<Value> = (0..201).map(|_| message(&bob.id, &ct("x"))).collect();
    assert_eq!(relay.post(&alice, "/messages/batch", &json!({ "messages": many })).await.status, 400);
    let exactly: Vec<Value> = (0..200).map(|_| message(&bob.id, &ct("x"))).collect();
    let reply = relay.post(&alice, "/messages/batch", &json!({ "messages": exactly })).await;
    assert_eq!((reply.status, reply.body["count"].as_u64()), (200, Some(200)));
    assert_eq!(relay.inbox_ids(&bob).await.len(), 200);
}

#[tokio::test]
async fn batch_entries_sharing_an_ephemeral_key_are_refused() {
    let relay = relay().await;
    let (alice, bob, carol, dave) =
        (relay.register("a").await, relay.register("b").await, relay.register("c").await, relay.register("d").await);
    let shared = b64(&random_array::<32>());
    let mut to_bob = message(&bob.id, &ct("x"));
    let mut to_carol = message(&carol.id, &ct("y"));
    to_bob["header"]["ephemeral_pub"] = json!(shared);
    to_carol["header"]["ephemeral_pub"] = json!(shared);
    let entries = json!([to_bob, to_carol, message(&dave.id, &ct("z"))]);
    let reply = relay.post(&alice, "/messages/batch", &json!({ "messages": entries })).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["sent"].as_array().unwrap().len(), 1);
    assert_eq!(reply.body["sent"][0]["index"], 2);
    let failed: Vec<i64> =
        reply.body["failed"].as_array().unwrap().iter().map(|f| f["index"].as_i64().unwrap()).collect();
    assert_eq!(failed, vec![0, 1]);
    assert!(reply.body["failed"][0]["error"].as_str().unwrap().contains("ephemeral_pub"));
}

#[tokio::test]
async fn the_inbox_pages_with_limit_since_id_has_more_and_next_since_id() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    for i in 1..=5 {
        relay.send(&alice, &bob, &format!("m{i}")).await;
    }
    let ids = |page: &Value| -> Vec<i64> {
        page["messages"].as_array().unwrap().iter().map(|m| m["id"].as_i64().unwrap()).collect()
    };
    let page = relay.inbox(&bob, "?limit=2").await;
    assert_eq!((ids(&page), page["count"].as_u64(), page["has_more"].as_bool()), (vec![1, 2], Some(2), Some(true)));
    assert_eq!(page["next_since_id"], 2);
    let page = relay.inbox(&bob, "?limit=2&since_id=2").await;
    assert_eq!(
        (ids(&page), page["has_more"].as_bool(), page["next_since_id"].as_i64()),
        (vec![3, 4], Some(true), Some(4))
    );
    let page = relay.inbox(&bob, "?limit=2&since_id=4").await;
    assert_eq!(
        (ids(&page), page["has_more"].as_bool(), page["next_since_id"].as_i64()),
        (vec![5], Some(false), Some(5))
    );
    // An empty page echoes the cursor it was given, or null without one.
    let page = relay.inbox(&bob, "?since_id=5").await;
    assert_eq!(
        (page["count"].as_u64(), page["has_more"].as_bool(), page["next_since_id"].as_i64()),
        (Some(0), Some(false), Some(5))
    );
    let empty = relay.inbox(&alice, "").await;
    assert_eq!(empty, json!({"messages": [], "count": 0, "has_more": false, "next_since_id": null}));
    // The default page is 50; above 200 the page is clamped.
    for i in 6..=60 {
        relay.send(&alice, &bob, &format!("m{i}")).await;
    }
    let page = relay.inbox(&bob, "").await;
    assert_eq!((page["count"].as_u64(), page["has_more"].as_bool()), (Some(50), Some(true)));
    let page = relay.inbox(&bob, "?limit=1000").await;
    assert_eq!((page["count"].as_u64(), page["has_more"].as_bool()), (Some(60), Some(false)));
}

#[tokio::test]
async fn bad_paging_parameters_are_400() {
    let relay = relay().await;
    let bob = relay.register("bob").await;
    for query in ["?limit=0", "?limit=-1", "?limit=ten", "?since_id=-1", "?since_id=x", "?wait=-1", "?wait=soon"] {
        let reply = relay.get(&bob, &format!("/messages{query}")).await;
        assert_eq!(reply.status, 400, "{query}");
    }
}

#[tokio::test]
async fn a_batch_ack_reports_every_id_in_one_bucket_and_repeats_safely() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    for i in 1..=3 {
        relay.send(&alice, &bob, &format!("m{i}")).await;
    }
    let reply = relay.ack(&bob, &[1, 2, 2, 44]).await;
    assert_eq!(reply, json!({"status": "acknowledged", "acknowledged": [1, 2], "not_found": [44], "count": 2}));
    assert!(reply.get("forbidden").is_none());
    let again = relay.ack(&bob, &[1, 2, 44]).await;
    assert_eq!(again, json!({"status": "acknowledged", "acknowledged": [], "not_found": [1, 2, 44], "count": 0}));
    assert_eq!(relay.inbox_ids(&bob).await, vec![3]);
    let too_many: Vec<i64> = (1..=201).collect();
    assert_eq!(relay.post(&bob, "/messages/ack", &json!({ "ids": too_many })).await.status, 400);
    assert_eq!(relay.post(&bob, "/messages/ack", &json!({ "ids": ["1"] })).await.status, 400);
}

#[tokio::test]
async fn another_identitys_message_cannot_be_acked_or_deleted_and_answers_404_not_403() {
    let relay = relay().await;
    let (alice, bob, mallory) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("mallory").await);
    relay.send(&alice, &bob, "for bob only").await;
    // Bob's message 1 exists, but mallory's number 1 names nothing in her own inbox.
    let ack = relay.ack(&mallory, &[1]).await;
    assert_eq!(ack["not_found"], json!([1]));
    let delete = relay.delete(&mallory, "/messages/1").await;
    assert_eq!(delete.status, 404);
    let never = relay.delete(&mallory, "/messages/999").await;
    assert_eq!((never.status, &never.body), (404, &delete.body), "existing elsewhere and never existing look alike");
    assert_eq!(relay.inbox_ids(&bob).await, vec![1]);
    let own = relay.delete(&bob, "/messages/1").await;
    assert_eq!(own.status, 200);
    assert_eq!(own.body, json!({"status": "acknowledged", "message_id": 1}));
    assert_eq!(relay.delete(&bob, "/messages/1").await.status, 404);
    assert_eq!(relay.delete(&bob, "/messages/one").await.status, 400);
}

#[tokio::test]
async fn the_per_sender_share_is_507_that_says_the_recipient_is_not_behind() {
    let relay = relay_with(|l| l.inbox_max_pending_per_sender = 3).await;
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    for i in 1..=3 {
        relay.send(&alice, &bob, &format!("m{i}")).await;
    }
    let full = relay.send_with(&alice, &message(&bob.id, &ct("m4")), None).await;
    assert_eq!(full.status, 507);
    assert_eq!(full.code(), "sender_share_full");
    assert!(full.message().contains("not behind"), "{}", full.message());
    // Other senders are unaffected.
    assert_eq!(relay.send_with(&carol, &message(&bob.id, &ct("c")), None).await.status, 201);
    // Draining makes room again.
    relay.ack(&bob, &[1]).await;
    assert_eq!(relay.send_with(&alice, &message(&bob.id, &ct("m4")), None).await.status, 201);
}

#[tokio::test]
async fn the_whole_inbox_limit_is_507_that_says_the_recipient_is_behind() {
    let relay = relay_with(|l| l.inbox_max_pending_messages = 3).await;
    let (alice, carol, dave, bob) = (
        relay.register("alice").await,
        relay.register("carol").await,
        relay.register("dave").await,
        relay.register("bob").await,
    );
    relay.send(&alice, &bob, "a1").await;
    relay.send(&alice, &bob, "a2").await;
    relay.send(&carol, &bob, "c1").await;
    let full = relay.send_with(&dave, &message(&bob.id, &ct("d1")), None).await;
    assert_eq!(full.status, 507);
    assert_eq!(full.code(), "inbox_full");
    assert!(full.message().contains("is behind"), "{}", full.message());
}

#[tokio::test]
async fn the_byte_limits_are_507_of_their_own_kind() {
    let relay = relay_with(|l| {
        l.inbox_max_pending_bytes_per_sender = 100;
        l.inbox_max_pending_bytes = 150;
    })
    .await;
    let (alice, carol, bob) =
        (relay.register("alice").await, relay.register("carol").await, relay.register("bob").await);
    assert_eq!(relay.send_with(&alice, &message(&bob.id, &ciphertext("a", 100)), None).await.status, 201);
    let share = relay.send_with(&alice, &message(&bob.id, &ciphertext("b", 16)), None).await;
    assert_eq!((share.status, share.code()), (507, "sender_share_full"));
    assert!(share.message().contains("bytes"));
    assert_eq!(relay.send_with(&carol, &message(&bob.id, &ciphertext("c", 50)), None).await.status, 201);
    let inbox = relay.send_with(&carol, &message(&bob.id, &ciphertext("d", 16)), None).await;
    assert_eq!((inbox.status, inbox.code()), (507, "inbox_full"));
    assert!(inbox.message().contains("bytes"));
}

#[tokio::test]
async fn a_full_recipient_fails_alone_in_a_batch() {
    let relay = relay_with(|l| l.inbox_max_pending_per_sender = 1).await;
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    relay.send(&alice, &bob, "fills bob's share").await;
    let entries = json!([message(&bob.id, &ct("x")), message(&carol.id, &ct("y"))]);
    let reply = relay.post(&alice, "/messages/batch", &json!({ "messages": entries })).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["sent"][0]["recipient_id"], carol.id);
    assert_eq!(reply.body["failed"][0]["status"], 507);
    assert_eq!(reply.body["failed"][0]["code"], "sender_share_full");
}

// ---- long polling -------------------------------------------------------------------------

#[tokio::test]
async fn an_inbox_read_without_wait_says_long_poll_off() {
    let relay = relay().await;
    let bob = relay.register("bob").await;
    for query in ["", "?wait=0"] {
        let reply = relay.get(&bob, &format!("/messages{query}")).await;
        assert_eq!(reply.header("x-long-poll"), Some("off"));
        assert!(reply.header("x-long-poll-waited").is_none());
    }
}

#[tokio::test]
async fn a_long_poll_is_woken_the_moment_a_message_is_stored() {
    let relay = Arc::new(relay().await);
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    for round in 0..3 {
        let poll = {
            let (relay, bob) = (relay.clone(), bob.clone());
            tokio::spawn(async move {
                let reply = relay.get(&bob, "/messages?wait=20").await;
                (reply, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        relay.send(&alice, &bob, &format!("wake {round}")).await;
        let sent_at = Instant::now();
        let (reply, answered_at) = poll.await.unwrap();
        let latency = answered_at.saturating_duration_since(sent_at);
        assert!(latency < Duration::from_millis(250), "round {round}: answered {latency:?} after the send");
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body["count"], 1);
        assert_eq!(reply.header("x-long-poll"), Some("waited"));
        let waited: f64 = reply.header("x-long-poll-waited").unwrap().parse().unwrap();
        assert!((0.2..2.0).contains(&waited), "waited {waited}");
        let id = reply.body["messages"][0]["id"].as_i64().unwrap();
        relay.ack(&bob, &[id]).await;
    }
}

/// A long-poll woken by a commit answers from the messages the writer hands the hub, without
/// reading them back: its page must be exactly what a read of the inbox returns (ids, sender,
/// header with its extra fields, ciphertext, time, `has_more` and the cursor), for a batch
/// waking it with more than a page and for a single send.
#[tokio::test]
async fn a_woken_long_poll_answers_exactly_what_a_read_of_the_inbox_returns() {
    a_woken_long_poll_answers_exactly_what_a_read_of_the_inbox_returns_on(Arc::new(relay().await)).await;
}

/// The same on a relay whose store is PostgreSQL (its own writer hands the hub the messages too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_woken_long_poll_answers_exactly_what_a_read_of_the_inbox_returns() {
    let Some(pg) = pg_common::cluster() else { return };
    let url = pg.fresh_database().await;
    let relay = relay_config(|c| c.database = Some(url)).await;
    assert!(relay.relay.state().store().is_postgres());
    a_woken_long_poll_answers_exactly_what_a_read_of_the_inbox_returns_on(Arc::new(relay)).await;
}

async fn a_woken_long_poll_answers_exactly_what_a_read_of_the_inbox_returns_on(relay: Arc<sc_common::Relay>) {
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let park = |query: &'static str| {
        let (relay, bob) = (relay.clone(), bob.clone());
        tokio::spawn(async move { relay.get(&bob, &format!("/messages?wait=20&{query}")).await })
    };
    // A batch of three wakes a poll that takes two: a full page and `has_more`.
    let poll = park("limit=2");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let entries: Vec<Value> = (0..3).map(|i| message(&bob.id, &ct(&format!("batch {i}")))).collect();
    let sent = relay.post(&alice, "/messages/batch", &json!({ "messages": entries })).await;
    assert_eq!(sent.body["count"], 3, "{:?}", sent.body);
    let woken = poll.await.unwrap();
    assert_eq!(woken.header("x-long-poll"), Some("waited"));
    assert_eq!(woken.body["count"], 2);
    assert_eq!(woken.body["has_more"], true);
    assert_eq!(woken.body, relay.get(&bob, "/messages?limit=2").await.body);

    // A single send with extra header fields wakes a poll past the batch.
    let poll = park("since_id=3");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut one = message(&bob.id, &ct("with extras"));
    one["header"]["purpose"] = json!("test");
    one["header"]["chain"] = json!("c-1");
    assert_eq!(relay.send_with(&alice, &one, Some("single-1")).await.status, 201);
    let woken = poll.await.unwrap();
    assert_eq!(woken.header("x-long-poll"), Some("waited"));
    assert_eq!(woken.body["count"], 1);
    assert_eq!(woken.body["messages"][0]["header"]["purpose"], "test");
    assert_eq!(woken.body, relay.get(&bob, "/messages?since_id=3").await.body);
}

#[tokio::test]
async fn a_long_poll_with_nothing_arriving_holds_for_the_wait_and_says_so() {
    let relay = relay().await;
    let bob = relay.register("bob").await;
    let started = Instant::now();
    let reply = relay.get(&bob, "/messages?wait=1").await;
    let held = started.elapsed();
    assert!(held >= Duration::from_millis(950) && held < Duration::from_secs(3), "{held:?}");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["count"], 0);
    assert_eq!(reply.header("x-long-poll"), Some("waited"));
    let waited: f64 = reply.header("x-long-poll-waited").unwrap().parse().unwrap();
    assert!((0.95..2.0).contains(&waited), "waited {waited}");
}

#[tokio::test]
async fn a_wait_above_the_maximum_is_clamped() {
    let relay = relay_with(|l| l.long_poll_max_secs = 1).await;
    let bob = relay.register("bob").await;
    let started = Instant::now();
    let reply = relay.get(&bob, "/messages?wait=25").await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(reply.header("x-long-poll"), Some("waited"));
}

#[tokio::test]
async fn a_long_poll_with_mail_waiting_answers_at_once() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    relay.send(&alice, &bob, "already here").await;
    let started = Instant::now();
    let reply = relay.get(&bob, "/messages?wait=20").await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(reply.body["count"], 1);
    assert_eq!(reply.header("x-long-poll"), Some("waited"));
    assert_eq!(reply.header("x-long-poll-waited"), Some("0.000"));
}

#[tokio::test]
async fn a_full_long_poll_pool_answers_unavailable_at_once() {
    let relay = Arc::new(relay_with(|l| l.long_poll_slots = 1).await);
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    let parked = {
        let (relay, bob) = (relay.clone(), bob.clone());
        tokio::spawn(async move { relay.get(&bob, "/messages?wait=20").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let refused = relay.get(&carol, "/messages?wait=20").await;
    assert!(started.elapsed() < Duration::from_secs(2), "answered at once");
    assert_eq!(refused.status, 200);
    assert_eq!(refused.header("x-long-poll"), Some("unavailable"));
    assert!(refused.header("x-long-poll-waited").is_none());
    assert_eq!(refused.body["count"], 0);
    // The parked request still gets its mail, and then the slot is free again.
    relay.send(&alice, &bob, "for the parked one").await;
    let reply = parked.await.unwrap();
    assert_eq!((reply.body["count"].as_u64(), reply.header("x-long-poll")), (Some(1), Some("waited")));
    let poll = {
        let (relay, carol) = (relay.clone(), carol.clone());
        tokio::spawn(async move { relay.get(&carol, "/messages?wait=20").await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    relay.send(&alice, &carol, "now there is room").await;
    assert_eq!(poll.await.unwrap().header("x-long-poll"), Some("waited"));
}

#[tokio::test]
async fn one_identity_cannot_take_the_long_poll_pool_from_others() {
    let relay = Arc::new(
        relay_with(|l| {
            l.long_poll_slots = 64;
            l.long_poll_per_identity = 4;
        })
        .await,
    );
    let (alice, bob, mallory) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("mallory").await);
    // Mallory asks for 20 waits at once: her share is 4, the rest are answered at once.
    let waits: Vec<_> = (0..20)
        .map(|_| {
            let (relay, mallory) = (relay.clone(), mallory.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let reply = relay.get(&mallory, "/messages?wait=3").await;
                (started.elapsed(), reply.header("x-long-poll").map(str::to_owned))
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Bob still parks, and his wait ends with the message sent to him.
    let parked = {
        let (relay, bob) = (relay.clone(), bob.clone());
        tokio::spawn(async move { relay.get(&bob, "/messages?wait=20").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.send(&alice, &bob, "you still get through").await;
    let reply = parked.await.unwrap();
    assert_eq!((reply.body["count"].as_u64(), reply.header("x-long-poll")), (Some(1), Some("waited")));
    let mut held = 0;
    for wait in waits {
        let (took, state) = wait.await.unwrap();
        match state.as_deref() {
            Some("waited") => {
                held += 1;
                assert!(took >= Duration::from_secs(2), "a parked wait ended early: {took:?}");
            }
            Some("unavailable") => assert!(took < Duration::from_secs(2), "refused late: {took:?}"),
            other => panic!("unexpected X-Long-Poll {other:?}"),
        }
    }
    assert_eq!(held, 4, "mallory parked more than her share");
}

#[tokio::test]
async fn request_bodies_in_flight_share_one_budget_and_the_overflow_is_503_with_retry_after() {
    use tokio::io::AsyncWriteExt as _;
    let relay = relay_config(|c| {
        c.limits.body_bytes_in_flight = 1024 * 1024;
        c.limits.request_body_timeout_ms = 20_000;
    })
    .await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    // Alice starts a 900 KiB batch and sends half of it: its whole length is reserved.
    let mut slow = tokio::net::TcpStream::connect(relay.relay.addr).await.unwrap();
    let head = format!(
        "POST /api/v2/messages/batch HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        alice.token,
        900 * 1024
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(&vec![b' '; 450 * 1024]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Another large body does not fit now: 503 with Retry-After, before it is read.
    let entries: Vec<_> = (0..4).map(|i| message(&bob.id, &ciphertext(&format!("big {i}"), 50 * 1024))).collect();
    let refused = relay.post(&bob, "/messages/batch", &json!({ "messages": entries.clone() })).await;
    assert_eq!(refused.status, 503, "{:?}", refused.body);
    assert_eq!(refused.header("retry-after"), Some("1"));
    // A small send still fits in what is left.
    assert!(relay.send(&bob, &alice, "small still fits").await > 0);
    // Alice gives up; her reservation is released and the large body goes through.
    drop(slow);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let accepted = relay.post(&bob, "/messages/batch", &json!({ "messages": entries })).await;
    assert!(accepted.status < 300, "{} {:?}", accepted.status, accepted.body);
}
