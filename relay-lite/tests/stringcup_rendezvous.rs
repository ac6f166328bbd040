//! Stringcup v2 rendezvous over real HTTP: issued tokens, derived roles, pairing with keys and
//! fingerprints, `409` for a third claimant, parked waits, releases and expiry.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod sc_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sc_common::{Agent, Relay, all_bytes, b64, contains, relay, relay_with};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use switchboard_core::util::b64u;

/// Opens a rendezvous as `who`; returns the token.
async fn open(relay: &Relay, who: &Agent) -> String {
    let reply = relay.post(who, "/rendezvous", &json!({})).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    reply.body["token"].as_str().unwrap().to_owned()
}

async fn claim(relay: &Relay, who: &Agent, token: &str) -> sc_common::Reply {
    relay.post(who, "/rendezvous", &json!({ "token": token })).await
}

fn is_rv_token(token: &str) -> bool {
    token.strip_prefix("rv-").is_some_and(|rest| {
        rest.len() == 32 && rest.bytes().all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
    })
}

fn assert_paired_with(body: &Value, me: &Agent, peer: &Agent, role: &str) {
    assert_eq!(body["status"], "paired", "{body}");
    assert_eq!(body["role"], role);
    assert_eq!(body["my_id"], me.id);
    assert_eq!(body["peer_id"], peer.id);
    assert_eq!(body["peer_identity_public_key"], b64(&peer.public_key));
    assert_eq!(body["peer_fingerprint"], format!("sha256:{}", b64u(&Sha256::digest(&peer.public_key))));
    assert!(body["expires_at"].is_string());
}

#[tokio::test]
async fn opening_issues_a_token_and_waits_for_a_peer() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let reply = relay.call(relay.req(&alice, reqwest::Method::POST, "/rendezvous")).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    assert!(is_rv_token(reply.body["token"].as_str().unwrap()), "{}", reply.body["token"]);
    assert_eq!(reply.body["status"], "waiting");
    assert_eq!(reply.body["role"], "initiator");
    assert_eq!(reply.body["my_id"], alice.id);
    assert!(reply.body["peer_id"].is_null());
    assert!(reply.body.get("peer_id").is_some(), "peer_id is present as null");
}

#[tokio::test]
async fn joining_pairs_both_sides_with_each_others_key_and_fingerprint() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let token = open(&relay, &alice).await;
    let joined = claim(&relay, &bob, &token).await;
    assert_eq!(joined.status, 200, "{:?}", joined.body);
    assert_paired_with(&joined.body, &bob, &alice, "responder");
    assert!(joined.body.get("token").is_none(), "the token is only in the answer that issued it");
    // The initiator re-polls with its own token and keeps its side.
    let repoll = claim(&relay, &alice, &token).await;
    assert_eq!(repoll.status, 200);
    assert_paired_with(&repoll.body, &alice, &bob, "initiator");
    // So does the responder.
    assert_paired_with(&claim(&relay, &bob, &token).await.body, &bob, &alice, "responder");
}

#[tokio::test]
async fn a_third_claimant_gets_409_and_the_pair_is_untouched() {
    let relay = relay().await;
    let (alice, bob, mallory) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("mallory").await);
    let token = open(&relay, &alice).await;
    assert_eq!(claim(&relay, &bob, &token).await.status, 200);
    let third = claim(&relay, &mallory, &token).await;
    assert_eq!(third.status, 409);
    assert_eq!(third.code(), "role_taken");
    assert!(third.message().contains("compromised"));
    assert_paired_with(&claim(&relay, &alice, &token).await.body, &alice, &bob, "initiator");
}

#[tokio::test]
async fn a_role_in_the_body_is_refused_and_only_issued_tokens_are_accepted() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let with_role = relay.post(&alice, "/rendezvous", &json!({"role": "initiator"})).await;
    assert_eq!(with_role.status, 400);
    assert!(with_role.message().contains("role"));
    let token = open(&relay, &alice).await;
    assert_eq!(relay.post(&alice, "/rendezvous", &json!({"token": token, "role": "responder"})).await.status, 400);
    for invented in ["let-us-meet", "rv-short", &token.to_uppercase()] {
        assert_eq!(claim(&relay, &alice, invented).await.status, 400, "{invented}");
    }
    let unknown = format!("rv-{}", "a".repeat(32));
    assert_eq!(claim(&relay, &alice, &unknown).await.status, 404);
    assert_eq!(relay.post(&alice, "/rendezvous", &json!({"wait": "soon"})).await.status, 400);
}

#[tokio::test]
async fn rendezvous_tokens_are_stored_hashed() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let token = open(&relay, &alice).await;
    assert_eq!(claim(&relay, &bob, &token).await.status, 200);
    let bytes = all_bytes(relay.dir.path());
    assert!(!contains(&bytes, token.as_bytes()), "the token is on disk in plain text");
    assert!(contains(&bytes, &Sha256::digest(token.as_bytes())));
}

#[tokio::test]
async fn a_waiting_initiator_is_woken_when_the_responder_claims() {
    let relay = Arc::new(relay().await);
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let token = open(&relay, &alice).await;
    let waiting = {
        let (relay, alice, token) = (relay.clone(), alice.clone(), token.clone());
        tokio::spawn(async move {
            let reply = relay.post(&alice, "/rendezvous", &json!({"token": token, "wait": 20})).await;
            (reply, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(claim(&relay, &bob, &token).await.status, 200);
    let claimed_at = Instant::now();
    let (reply, answered_at) = waiting.await.unwrap();
    assert!(answered_at.saturating_duration_since(claimed_at) < Duration::from_millis(500));
    assert_paired_with(&reply.body, &alice, &bob, "initiator");
    assert_eq!(reply.header("x-long-poll"), Some("waited"));
}

#[tokio::test]
async fn a_mint_with_wait_and_no_peer_holds_and_still_returns_the_token() {
    let relay = relay().await;
    let alice = relay.register("alice").await;
    let started = Instant::now();
    let reply = relay.post(&alice, "/rendezvous", &json!({"wait": 1})).await;
    assert!(started.elapsed() >= Duration::from_millis(950));
    assert_eq!(reply.status, 201);
    assert_eq!(reply.body["status"], "waiting");
    assert!(is_rv_token(reply.body["token"].as_str().unwrap()));
    assert_eq!(reply.header("x-long-poll"), Some("waited"));
}

#[tokio::test]
async fn a_full_pool_answers_a_rendezvous_wait_as_unavailable() {
    let relay = Arc::new(relay_with(|l| l.long_poll_slots = 1).await);
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let parked = {
        let (relay, alice) = (relay.clone(), alice.clone());
        tokio::spawn(async move { relay.get(&alice, "/messages?wait=3").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reply = relay.post(&bob, "/rendezvous", &json!({"wait": 20})).await;
    assert_eq!(reply.status, 201);
    assert_eq!(reply.header("x-long-poll"), Some("unavailable"));
    assert_eq!(reply.body["status"], "waiting");
    parked.await.unwrap();
}

#[tokio::test]
async fn releasing_gives_up_only_the_callers_own_claim() {
    let relay = relay().await;
    let (alice, bob, carol) =
        (relay.register("alice").await, relay.register("bob").await, relay.register("carol").await);
    let token = open(&relay, &alice).await;
    assert_eq!(claim(&relay, &bob, &token).await.status, 200);
    // Nobody can release a claim they do not hold.
    let not_mine =
        relay.call(relay.req(&carol, reqwest::Method::DELETE, "/rendezvous").json(&json!({"token": token}))).await;
    assert_eq!(not_mine.status, 404);
    let released =
        relay.call(relay.req(&bob, reqwest::Method::DELETE, "/rendezvous").json(&json!({"token": token}))).await;
    assert_eq!(released.status, 200);
    assert_eq!(released.body, json!({"status": "released", "role": "responder"}));
    let after = claim(&relay, &alice, &token).await;
    assert_eq!(after.body["status"], "waiting", "the initiator keeps its claim");
    // The freed role can be claimed by another identity.
    assert_paired_with(&claim(&relay, &carol, &token).await.body, &carol, &alice, "responder");
    let by_query = relay.delete(&alice, &format!("/rendezvous?token={token}")).await;
    assert_eq!(by_query.body["role"], "initiator");
    assert_eq!(relay.delete(&alice, &format!("/rendezvous?token={token}")).await.status, 404);
}

#[tokio::test]
async fn an_expired_token_is_unknown() {
    let relay = relay_with(|l| l.rendezvous_ttl_ms = 300).await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let token = open(&relay, &alice).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(claim(&relay, &bob, &token).await.status, 404);
    relay.sweep().await;
    assert_eq!(claim(&relay, &alice, &token).await.status, 404);
}

#[tokio::test]
async fn a_restarted_relay_keeps_each_claimant_on_its_side() {
    let relay = relay().await;
    let (alice, bob) = (relay.register("alice").await, relay.register("bob").await);
    let token = open(&relay, &alice).await;
    assert_eq!(claim(&relay, &bob, &token).await.status, 200);
    let sc_common::Relay { relay: running, dir, mut config, http } = relay;
    running.shutdown().await.unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    let running = relay_lite::spawn(config.clone()).await.unwrap();
    let relay = sc_common::Relay { relay: running, dir, config, http };
    assert_paired_with(&claim(&relay, &alice, &token).await.body, &alice, &bob, "initiator");
    assert_paired_with(&claim(&relay, &bob, &token).await.body, &bob, &alice, "responder");
}
