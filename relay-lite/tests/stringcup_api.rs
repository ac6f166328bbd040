//! Stringcup v2 over real HTTP against an in-process relay: identities, tokens, the advertised
//! limits, budgets and their headers, and the public statistics. Messages, topics and
//! rendezvous have their own files.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod sc_common;

use std::time::Duration;

use reqwest::Method;
use sc_common::{Agent, all_bytes, b64, contains, ct, message, relay, relay_config, relay_with, unb64};
use serde_json::json;
use sha2::{Digest, Sha256};
use switchboard_core::util::{b64u, hex, random_array};

fn is_sc_id(id: &str) -> bool {
    id.strip_prefix("sc-").is_some_and(|rest| {
        rest.len() == 24 && rest.bytes().all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
    })
}

#[tokio::test]
async fn registration_assigns_an_sc_id_and_a_token_that_is_shown_once() {
    let relay = relay().await;
    let key = random_array::<32>();
    let reply =
        relay.register_raw(&json!({"identity_public_key": b64(&key), "algo": "x25519", "display_name": "alice"})).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    let body = &reply.body;
    assert!(is_sc_id(body["id"].as_str().unwrap()), "{}", body["id"]);
    assert_eq!(body["id_assigned"], true);
    assert_eq!(unb64(body["identity_public_key"].as_str().unwrap()), key);
    assert_eq!(body["algo"], "x25519");
    assert_eq!(body["display_name"], "alice");
    assert!(body["api_token"].as_str().unwrap().len() >= 43);
    for field in ["key_updated_at", "created_at"] {
        let at = body[field].as_str().unwrap();
        assert_eq!(at.len(), "2026-03-24 12:00:00".len(), "{field}: {at}");
    }
    let lookup = relay.call(relay.anon(Method::GET, &format!("/identities/{}", body["id"].as_str().unwrap()))).await;
    assert_eq!(lookup.status, 200);
    assert!(lookup.body.get("api_token").is_none(), "the token is never returned again");
}

#[tokio::test]
async fn registration_carrying_external_id_is_refused_with_400() {
    let relay = relay().await;
    let key = b64(&random_array::<32>());
    let reply = relay.register_raw(&json!({"identity_public_key": key, "external_id": "bob"})).await;
    assert_eq!(reply.status, 400);
    assert!(reply.message().contains("external_id"), "{}", reply.message());
    // Even an empty or null one: the field itself is the mistake.
    assert_eq!(relay.register_raw(&json!({"identity_public_key": key, "external_id": null})).await.status, 400);
}

#[tokio::test]
async fn registration_with_a_malformed_key_or_algorithm_is_refused_with_400() {
    let relay = relay().await;
    for body in [
        json!({"identity_public_key": b64(&[7u8; 31])}),
        json!({"identity_public_key": "not base64!"}),
        json!({"identity_public_key": b64(&[7u8; 32]), "algo": "ed25519"}),
        json!({"algo": "x25519"}),
        json!({"identity_public_key": b64(&[7u8; 32]), "display_name": "x".repeat(101)}),
        json!(["not", "an", "object"]),
    ] {
        let reply = relay.register_raw(&body).await;
        assert_eq!(reply.status, 400, "{body}: {:?}", reply.body);
        assert_eq!(reply.code(), "bad_request");
    }
}

#[tokio::test]
async fn re_registering_the_same_key_creates_a_different_identity() {
    let relay = relay().await;
    let key = b64(&random_array::<32>());
    let first = relay.register_raw(&json!({"identity_public_key": key})).await;
    let second = relay.register_raw(&json!({"identity_public_key": key})).await;
    assert_eq!((first.status, second.status), (201, 201));
    assert_ne!(first.body["id"], second.body["id"]);
    assert_ne!(first.body["api_token"], second.body["api_token"]);
}

#[tokio::test]
async fn lookup_is_exact_and_unauthenticated_and_carries_fingerprints_the_client_can_recompute() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let reply = relay.call(relay.anon(Method::GET, &format!("/identities/{}", alice.id))).await;
    assert_eq!(reply.status, 200);
    let digest = Sha256::digest(&alice.public_key);
    assert_eq!(reply.body["fingerprint"], format!("sha256:{}", b64u(&digest)));
    let short = hex(&digest[..8]);
    let grouped = format!("{}-{}-{}-{}", &short[0..4], &short[4..8], &short[8..12], &short[12..16]);
    assert_eq!(reply.body["fingerprint_short"], grouped);
    assert_eq!(reply.body["id"], alice.id);
    assert_eq!(unb64(reply.body["identity_public_key"].as_str().unwrap()), alice.public_key);
    assert!(reply.body["key_updated_at"].is_string());
    // Exact match only: a prefix, an unknown id, and no list endpoint.
    let unknown = format!("sc-{}", "a".repeat(24));
    assert_eq!(relay.call(relay.anon(Method::GET, &format!("/identities/{unknown}"))).await.status, 404);
    assert_eq!(relay.call(relay.anon(Method::GET, &format!("/identities/{}", &alice.id[..10]))).await.status, 400);
    assert_eq!(relay.call(relay.anon(Method::GET, "/identities")).await.status, 405);
}

#[tokio::test]
async fn update_reports_key_changed_and_moves_key_updated_at_only_when_the_key_changes() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let before = relay.call(relay.anon(Method::GET, &format!("/identities/{}", alice.id))).await.body;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let renamed = relay.put(&alice, "/identities", &json!({"display_name": "Alice"})).await;
    assert_eq!(renamed.status, 200, "{:?}", renamed.body);
    assert_eq!(renamed.body["key_changed"], false);
    assert_eq!(renamed.body["key_updated_at"], before["key_updated_at"]);
    assert_ne!(renamed.body["updated_at"], before["key_updated_at"], "updated_at moves for any change");
    assert_eq!(renamed.body["display_name"], "Alice");
    let same_key = relay.put(&alice, "/identities", &json!({"identity_public_key": b64(&alice.public_key)})).await;
    assert_eq!(same_key.body["key_changed"], false);
    assert_eq!(same_key.body["key_updated_at"], before["key_updated_at"]);
    let new_key = random_array::<32>();
    let rekeyed = relay.put(&alice, "/identities", &json!({"identity_public_key": b64(&new_key)})).await;
    assert_eq!(rekeyed.status, 200);
    assert_eq!(rekeyed.body["key_changed"], true);
    assert_ne!(rekeyed.body["key_updated_at"], before["key_updated_at"]);
    assert_ne!(rekeyed.body["fingerprint"], before["fingerprint"]);
    assert_eq!(rekeyed.body["id"], alice.id, "same identity, new key");
    let lookup = relay.call(relay.anon(Method::GET, &format!("/identities/{}", alice.id))).await.body;
    assert_eq!(unb64(lookup["identity_public_key"].as_str().unwrap()), new_key);
    let cleared = relay.put(&alice, "/identities", &json!({"display_name": null})).await;
    assert_eq!(cleared.body["display_name"], serde_json::Value::Null);
}

#[tokio::test]
async fn update_refuses_external_id_and_empty_changes_and_needs_a_token() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let reply = relay.put(&alice, "/identities", &json!({"external_id": "alice", "display_name": "x"})).await;
    assert_eq!(reply.status, 400);
    assert!(reply.message().contains("external_id"));
    assert_eq!(relay.put(&alice, "/identities", &json!({})).await.status, 400);
    let anonymous = relay.call(relay.anon(Method::PUT, "/identities").json(&json!({"display_name": "x"}))).await;
    assert_eq!(anonymous.status, 401);
}

#[tokio::test]
async fn missing_or_unknown_tokens_get_401_with_a_bearer_challenge() {
    let relay = relay().await;
    let stranger = Agent { id: String::new(), token: "sct-nope".into(), public_key: Vec::new() };
    for reply in [
        relay.call(relay.anon(Method::GET, "/messages")).await,
        relay.get(&stranger, "/messages").await,
        relay.call(relay.anon(Method::GET, "/messages").header("Authorization", "Basic abc")).await,
        relay.call(relay.anon(Method::GET, "/tokens/current")).await,
    ] {
        assert_eq!(reply.status, 401, "{:?}", reply.body);
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
        assert_eq!(reply.code(), "unauthorized");
    }
}

#[tokio::test]
async fn tokens_are_stored_only_as_sha256() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let rotated = relay.post(&alice, "/tokens/rotate", &json!({})).await.body["api_token"].as_str().unwrap().to_owned();
    let bytes = all_bytes(relay.dir.path());
    for token in [&alice.token, &rotated] {
        assert!(!contains(&bytes, token.as_bytes()), "a token is on disk in plain text");
    }
    assert!(contains(&bytes, &Sha256::digest(rotated.as_bytes())), "the current token's hash is what is kept");
}

#[tokio::test]
async fn tokens_current_reports_the_thirty_day_inactivity_window() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let reply = relay.get(&alice, "/tokens/current").await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let body = &reply.body;
    assert_eq!(body["identity_id"], alice.id);
    assert_eq!(body["inactivity_ttl_days"], 30);
    let expires_in = body["expires_in_seconds"].as_i64().unwrap();
    assert!((30 * 86_400 - 120..=30 * 86_400).contains(&expires_in), "{expires_in}");
    for field in ["created_at", "last_used_at", "expires_at"] {
        assert!(body[field].is_string(), "{field}");
    }
}

#[tokio::test]
async fn rotation_revokes_the_old_token_and_keeps_identity_and_inbox() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    relay.send(&bob, &alice, "before rotation").await;
    let reply = relay.post(&alice, "/tokens/rotate", &json!({})).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.body["previous_token"], "revoked");
    assert_eq!(reply.body["identity_id"], alice.id);
    let fresh = Agent { token: reply.body["api_token"].as_str().unwrap().to_owned(), ..alice.clone() };
    assert_ne!(fresh.token, alice.token);
    assert_eq!(relay.get(&alice, "/messages").await.status, 401, "the old token is revoked");
    assert_eq!(relay.post(&alice, "/tokens/rotate", &json!({})).await.status, 401);
    let inbox = relay.inbox(&fresh, "").await;
    assert_eq!(inbox["count"], 1, "same identity, same inbox");
    assert_eq!(inbox["messages"][0]["recipient_id"], alice.id);
}

#[tokio::test]
async fn a_token_unused_past_the_inactivity_limit_stops_working_and_its_identity_is_reclaimed() {
    let relay = relay_with(|l| l.token_inactivity_ms = 1500).await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    relay.send(&bob, &alice, "uncollectable").await;
    // Bob stays active; alice does not.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(relay.get(&bob, "/messages").await.status, 200);
    }
    let reply = relay.get(&alice, "/messages").await;
    assert_eq!(reply.status, 401);
    assert!(reply.message().contains("expired"), "{}", reply.message());
    relay.sweep().await;
    let lookup = relay.call(relay.anon(Method::GET, &format!("/identities/{}", alice.id))).await;
    assert_eq!(lookup.status, 404, "a reclaimed identity is gone");
    let reply = relay.send_with(&bob, &message(&alice.id, &ct("late")), None).await;
    assert_eq!(reply.status, 404);
    assert_eq!(relay.get(&bob, "/tokens/current").await.status, 200, "an active identity is kept");
}

#[tokio::test]
async fn api_root_advertises_the_seed_limits() {
    let relay = relay_config(|_| {}).await;
    let reply = relay.call(relay.anon(Method::GET, "")).await;
    assert_eq!(reply.status, 200);
    let body = &reply.body;
    assert_eq!(body["message_max_bytes"], 262_144);
    assert_eq!(body["inbox_max_pending_messages"], 2000);
    assert_eq!(body["inbox_max_pending_bytes"], 64 * 1024 * 1024);
    assert_eq!(body["inbox_max_pending_per_sender"], 200);
    assert_eq!(body["inbox_max_pending_bytes_per_sender"], 16 * 1024 * 1024);
    assert_eq!(body["batch_max_messages"], 200);
    assert_eq!(body["long_poll_max_wait_seconds"], 25);
    assert_eq!(body["rate_limits"]["send_per_hour"], 100);
    assert_eq!(body["rate_limits"]["inbox_per_hour"], 300);
    assert_eq!(body["token_inactivity_ttl_seconds"], 30 * 86_400);
    assert_eq!(body["topic_max_members"], 200);
}

#[tokio::test]
async fn api_root_advertises_configured_limits() {
    let relay = relay_with(|l| {
        l.message_max_bytes = 1000;
        l.inbox_max_pending_per_sender = 7;
    })
    .await;
    let body = relay.call(relay.anon(Method::GET, "")).await.body;
    assert_eq!(body["message_max_bytes"], 1000);
    assert_eq!(body["inbox_max_pending_per_sender"], 7);
}

#[tokio::test]
async fn budgets_answer_ratelimit_headers_and_429_with_retry_after() {
    let relay = relay_with(|l| l.sends_per_hour = 3).await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    for remaining in [2, 1, 0] {
        let reply = relay.send_with(&alice, &message(&bob.id, &ct("hi")), None).await;
        assert_eq!(reply.status, 201);
        assert_eq!(reply.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(reply.header("x-ratelimit-remaining"), Some(remaining.to_string().as_str()));
        assert_eq!(reply.header("x-ratelimit-bucket"), Some("send"));
        // A Unix time (the reference client subtracts its own clock from it).
        let reset: u64 = reply.header("x-ratelimit-reset").unwrap().parse().unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert!((now + 3500..=now + 3601).contains(&reset), "reset {reset}, now {now}");
    }
    let refused = relay.send_with(&alice, &message(&bob.id, &ct("one too many")), None).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.code(), "rate_limited");
    let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((3500..=3600).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(relay.inbox_ids(&bob).await.len(), 3, "the refused send stored nothing");
    // Budgets are per identity and per kind.
    assert_eq!(relay.send_with(&bob, &message(&alice.id, &ct("mine")), None).await.status, 201);
    let inbox = relay.get(&alice, "/messages").await;
    assert_eq!(inbox.status, 200);
    assert_eq!(inbox.header("x-ratelimit-bucket"), Some("inbox"));
    assert_eq!(inbox.header("x-ratelimit-limit"), Some("300"));
}

#[tokio::test]
async fn a_batch_counts_once_against_the_send_budget() {
    let relay = relay_with(|l| l.sends_per_hour = 2).await;
    let alice = relay.register("alice").await;
    let mut others = Vec::new();
    for name in ["bob", "carol", "dave"] {
        others.push(relay.register(name).await);
    }
    let entries: Vec<_> = others.iter().map(|o| message(&o.id, &ct("fan-out"))).collect();
    let reply = relay.post(&alice, "/messages/batch", &json!({ "messages": entries })).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["count"], 3);
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("1"));
}

#[tokio::test]
async fn inbox_budget_refuses_polls_past_the_hourly_count() {
    let relay = relay_with(|l| l.inbox_requests_per_hour = 2).await;
    let alice = relay.register("alice").await;
    assert_eq!(relay.get(&alice, "/messages").await.status, 200);
    assert_eq!(relay.post(&alice, "/messages/ack", &json!({"ids": [1]})).await.status, 200);
    let refused = relay.get(&alice, "/messages?wait=5").await;
    assert_eq!(refused.status, 429);
    assert!(refused.headers.contains_key("retry-after"));
}

#[tokio::test]
async fn registrations_are_limited_per_client_address() {
    let relay = relay_config(|c| c.limits.stringcup.registrations_per_hour_per_ip = 2).await;
    let key = b64(&random_array::<32>());
    for _ in 0..2 {
        assert_eq!(relay.register_raw(&json!({"identity_public_key": key})).await.status, 201);
    }
    let refused = relay.register_raw(&json!({"identity_public_key": key})).await;
    assert_eq!(refused.status, 429);
    assert!(refused.headers.contains_key("retry-after"));
    assert_eq!(refused.header("x-ratelimit-bucket"), Some("register"));
}

#[tokio::test]
async fn stats_suppress_small_counts_and_publish_no_timeline() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    relay.send(&alice, &bob, "a conversation of two").await;
    let reply = relay.call(relay.anon(Method::GET, "/stats")).await;
    assert_eq!(reply.status, 200);
    let body = reply.body.as_object().unwrap();
    for field in ["identities", "topics", "messages_pending", "messages_stored_total"] {
        assert!(body[field].is_null(), "{field} is below the threshold and must be suppressed");
    }
    for (key, value) in body {
        assert!(!key.ends_with("_at") && !value.is_array() && !value.is_object(), "{key} looks like a timeline");
    }
    let text = reply.body.to_string();
    for leak in ["hourly", "timeline", "series", &alice.id, &bob.id] {
        assert!(!text.contains(leak), "stats mention {leak}: {text}");
    }
}

#[tokio::test]
async fn stats_publish_coarse_counts_past_the_threshold() {
    let relay = relay_with(|l| {
        l.stats_min_count = 5;
        l.stats_refresh_ms = 0;
    })
    .await;
    let mut agents = Vec::new();
    for i in 0..7 {
        agents.push(relay.register(&format!("agent {i}")).await);
    }
    let body = relay.call(relay.anon(Method::GET, "/stats")).await.body;
    assert_eq!(body["identities"], 5, "7 rounds down to a multiple of 5");
    assert!(body["messages_pending"].is_null());
    assert_eq!(body["suppressed_below"], 5);
}

#[tokio::test]
async fn stats_are_a_snapshot_that_does_not_track_single_events() {
    let relay = relay_with(|l| l.stats_min_count = 1).await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let before = relay.call(relay.anon(Method::GET, "/stats")).await.body;
    relay.send(&alice, &bob, "invisible to the stats for an hour").await;
    let after = relay.call(relay.anon(Method::GET, "/stats")).await.body;
    assert_eq!(before, after);
}
