//! Agent Mail 1.0 relay API, black box over HTTP: discovery, card publication (owner binding,
//! first-card route, nonces, resubmission), packet delivery (resubmission, tombstones, stale
//! cards, unknown mailboxes), and owner-authenticated lists and deletes (unauthorized reads and
//! deletes refused). Cards, packets and JWTs are built with core's public API; the relay's origins
//! are its configured public URLs (by default its loopback address), never the request's `Host`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod pg_common;

use ed25519_dalek::SigningKey;
use relay_lite::{Config, RunningRelay};
use serde_json::Value as J;
use switchboard_core::protocol::agent_identity::jwt::sign_request_jwt;
use switchboard_core::protocol::agent_identity::{AgentId, Origin};
use switchboard_core::protocol::agent_mail::card::CardPayload;
use switchboard_core::protocol::agent_mail::packet::{SealRequest, seal};
use switchboard_core::protocol::agent_mail::{DAY_MS, Id16, MailboxCard, Message, Packet, Part};
use switchboard_core::util::{SeededRng, now_ms};
use x25519_dalek::{PublicKey, StaticSecret};

struct Relay {
    relay: RunningRelay,
    http: reqwest::Client,
    origin: Origin,
    _dir: tempfile::TempDir,
}

impl Relay {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// A relay whose configuration `tweak` adjusted (limits, the Agent Mail clock).
    async fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir.path());
        tweak(&mut config);
        let relay = relay_lite::spawn(config).await.unwrap();
        let origin = Origin::parse(&format!("https://{}", relay.addr)).unwrap();
        Self { relay, http: reqwest::Client::new(), origin, _dir: dir }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.relay.url())
    }

    async fn post(&self, path: &str, body: Vec<u8>) -> (u16, J, reqwest::header::HeaderMap) {
        let r = self.http.post(self.url(path)).body(body).send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let bytes = r.bytes().await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(J::Null), headers)
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, J) {
        let mut req = self.http.get(self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(J::Null))
    }

    async fn delete(&self, path: &str, token: Option<&str>) -> (u16, J) {
        let mut req = self.http.delete(self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let bytes = r.bytes().await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(J::Null))
    }

    fn jwt(&self, key: &SigningKey) -> String {
        let now = now_ms() / 1000;
        sign_request_jwt(key, &self.origin, now - 5, now + 120, None)
    }
}

fn code(body: &J) -> &str {
    body["error"]["code"].as_str().unwrap_or("<none>")
}

fn bob() -> SigningKey {
    SigningKey::from_bytes(&[0xb0; 32])
}

fn alice() -> SigningKey {
    SigningKey::from_bytes(&[0xa1; 32])
}

fn mallory() -> SigningKey {
    SigningKey::from_bytes(&[0x66; 32])
}

const MAILBOX: Id16 = Id16([7; 16]);

fn card(owner: &SigningKey, nonce: u64, routes: &[Origin]) -> MailboxCard {
    let now = now_ms();
    let secret = StaticSecret::from([0xb1; 32]);
    MailboxCard::sign(
        owner,
        now,
        nonce,
        CardPayload {
            mailbox_id: MAILBOX,
            expires_at: now + DAY_MS,
            receive_until: now + 2 * DAY_MS,
            public_key: PublicKey::from(&secret).to_bytes(),
            routes: routes.to_vec(),
            max_packet_bytes: 65536,
        },
    )
    .unwrap()
}

fn packet(card: &MailboxCard, nonce: u64, text: &str) -> Packet {
    let now = now_ms();
    let mut rng = SeededRng::new([nonce as u8; 32]);
    let message =
        Message::new(&mut rng, AgentId::of(&alice()), *card.owner(), now, now + DAY_MS / 2, vec![Part::text(text)]);
    let req = SealRequest { sender: &alice(), card, message: &message, created_at: now, nonce };
    seal(&req, now, &mut rng).unwrap()
}

fn packets_path() -> String {
    format!("/v1/mailboxes/{MAILBOX}/packets")
}

#[tokio::test]
async fn discovery_names_the_addressed_origin() {
    let relay = Relay::start().await;
    let (status, doc) = relay.get("/.well-known/agent-mail", None).await;
    assert_eq!(status, 200);
    assert_eq!(doc["protocol"], "agent-mail/1.0");
    assert_eq!(doc["service"], relay.origin.as_str());
}

#[tokio::test]
async fn owner_tokens_and_first_cards_for_another_origin_are_refused_whatever_the_host_header() {
    let relay = Relay::start().await;
    let elsewhere = Origin::parse("https://relay.example").unwrap();
    let spoof = |req: reqwest::RequestBuilder| req.header(reqwest::header::HOST, "relay.example");
    // A first card that lists only the other relay, presented with its Host: refused, unbound.
    let foreign_card = card(&bob(), 100, std::slice::from_ref(&elsewhere));
    let r = spoof(relay.http.post(relay.url("/v1/mailboxes"))).body(foreign_card.to_jcs()).send().await.unwrap();
    assert_eq!(r.status(), 403, "{}", r.text().await.unwrap());
    assert_eq!(relay.get(&format!("/v1/mailboxes/{MAILBOX}/card"), None).await.0, 404);
    // The mailbox bound here, then an owner token minted for the other relay, with its Host.
    let current = card(&bob(), 101, &[relay.origin.clone(), elsewhere.clone()]);
    assert_eq!(relay.post("/v1/mailboxes", current.to_jcs()).await.0, 200);
    let p = packet(&current, 1, "secret");
    assert_eq!(relay.post(&packets_path(), p.to_jcs()).await.0, 202);
    let now = now_ms() / 1000;
    let foreign_token = sign_request_jwt(&bob(), &elsewhere, now - 5, now + 120, None);
    let list = spoof(relay.http.get(relay.url(&packets_path()))).bearer_auth(&foreign_token).send().await.unwrap();
    assert_eq!(list.status(), 401);
    let one = format!("{}/{}", packets_path(), p.id());
    let delete = spoof(relay.http.delete(relay.url(&one))).bearer_auth(&foreign_token).send().await.unwrap();
    assert_eq!(delete.status(), 401);
    let (status, page) = relay.get(&packets_path(), Some(&relay.jwt(&bob()))).await;
    assert_eq!((status, page["result"].as_array().unwrap().len()), (200, 1), "a foreign token deleted a packet");
    // Discovery never names a spoofed Host.
    let doc: J =
        spoof(relay.http.get(relay.url("/.well-known/agent-mail"))).send().await.unwrap().json().await.unwrap();
    assert_eq!(doc["service"], relay.origin.as_str());
}

#[tokio::test]
async fn publish_binds_the_mailbox_and_serves_the_current_card() {
    let relay = Relay::start().await;
    let first = card(&bob(), 100, std::slice::from_ref(&relay.origin));
    let (status, record, _) = relay.post("/v1/mailboxes", first.to_jcs()).await;
    assert_eq!(status, 200, "{record}");
    let accepted_at = record["accepted_at"].as_i64().unwrap();
    assert_eq!(record["envelope"]["event"]["nonce"], 100);
    // Exact resubmission: the original record.
    let (status, again, _) = relay.post("/v1/mailboxes", first.to_jcs()).await;
    assert_eq!((status, again["accepted_at"].as_i64().unwrap()), (200, accepted_at));
    let (status, read) = relay.get(&format!("/v1/mailboxes/{MAILBOX}/card"), None).await;
    assert_eq!((status, &read), (200, &record));
    // Another actor cannot take the mailbox.
    let (status, body, _) =
        relay.post("/v1/mailboxes", card(&mallory(), 200, std::slice::from_ref(&relay.origin)).to_jcs()).await;
    assert_eq!((status, code(&body)), (409, "mailbox_conflict"));
    // A card whose nonce does not exceed the current one.
    let (status, body, headers) =
        relay.post("/v1/mailboxes", card(&bob(), 99, std::slice::from_ref(&relay.origin)).to_jcs()).await;
    assert_eq!((status, code(&body)), (409, "nonce_not_greater"));
    assert_eq!(headers.get("max-seen-nonce").unwrap(), "100");
    // A newer card replaces it.
    let (status, _, _) =
        relay.post("/v1/mailboxes", card(&bob(), 101, std::slice::from_ref(&relay.origin)).to_jcs()).await;
    assert_eq!(status, 200);
    let (_, read) = relay.get(&format!("/v1/mailboxes/{MAILBOX}/card"), None).await;
    assert_eq!(read["envelope"]["event"]["nonce"], 101);
}

#[tokio::test]
async fn card_refusals_use_the_spec_codes() {
    let relay = Relay::start().await;
    let elsewhere = Origin::parse("https://elsewhere.example").unwrap();
    let (status, body, _) = relay.post("/v1/mailboxes", card(&bob(), 100, &[elsewhere]).to_jcs()).await;
    assert_eq!((status, code(&body)), (403, "permission_denied"));
    let (status, body, _) = relay.post("/v1/mailboxes", b"{not json".to_vec()).await;
    assert_eq!(status / 100, 4, "{body}");
    let (status, body) = relay.get(&format!("/v1/mailboxes/{MAILBOX}/card"), None).await;
    assert_eq!((status, code(&body)), (404, "mailbox_unavailable"));
    let (status, body) = relay.get("/v1/mailboxes/not-an-id/card", None).await;
    assert_eq!((status, code(&body)), (400, "invalid_request"));
}

#[tokio::test]
async fn delivery_is_idempotent_and_tombstones_survive_deletion() {
    delivery_is_idempotent_and_tombstones_survive_deletion_on(Relay::start().await).await;
}

/// The same scenario on a relay whose store is PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_delivery_is_idempotent_and_tombstones_survive_deletion() {
    let Some(pg) = pg_common::cluster() else { return };
    let url = pg.fresh_database().await;
    let relay = Relay::start_with(|c| c.database = Some(url)).await;
    assert!(relay.relay.state().store().is_postgres());
    delivery_is_idempotent_and_tombstones_survive_deletion_on(relay).await;
}

async fn delivery_is_idempotent_and_tombstones_survive_deletion_on(relay: Relay) {
    let current = card(&bob(), 100, std::slice::from_ref(&relay.origin));
    assert_eq!(relay.post("/v1/mailboxes", current.to_jcs()).await.0, 200);
    let p = packet(&current, 1, "hello");
    let (status, result, _) = relay.post(&packets_path(), p.to_jcs()).await;
    assert_eq!(status, 202, "{result}");
    assert_eq!(result["packet_id"], p.id().to_string());
    let accepted_at = result["accepted_at"].as_i64().unwrap();
    assert_eq!(result.as_object().unwrap().len(), 2, "exactly packet_id and accepted_at");
    // Same bytes, same result.
    let (status, again, _) = relay.post(&packets_path(), p.to_jcs()).await;
    assert_eq!((status, &again), (202, &result));

    let token = relay.jwt(&bob());
    let (status, page) = relay.get(&packets_path(), Some(&token)).await;
    assert_eq!(status, 200, "{page}");
    let items = page["result"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["seq"], 1);
    assert_eq!(items[0]["packet_id"], p.id().to_string());
    assert_eq!(items[0]["accepted_at"], accepted_at);
    assert!(page.get("next_cursor").is_none());

    let one = format!("{}/{}", packets_path(), p.id());
    assert_eq!(relay.delete(&one, Some(&token)).await.0, 204);
    assert_eq!(relay.delete(&one, Some(&token)).await.0, 204, "deleting an absent packet is fine");
    let (_, page) = relay.get(&packets_path(), Some(&token)).await;
    assert!(page["result"].as_array().unwrap().is_empty());
    // The tombstone answers a retry with the original result and recreates nothing.
    let (status, again, _) = relay.post(&packets_path(), p.to_jcs()).await;
    assert_eq!((status, &again), (202, &result));
    let (_, page) = relay.get(&packets_path(), Some(&token)).await;
    assert!(page["result"].as_array().unwrap().is_empty());

    // The next packet gets the next seq.
    let q = packet(&current, 2, "again");
    assert_eq!(relay.post(&packets_path(), q.to_jcs()).await.0, 202);
    let (_, page) = relay.get(&packets_path(), Some(&token)).await;
    assert_eq!(page["result"][0]["seq"], 2);
}

#[tokio::test]
async fn delivery_refusals_use_the_spec_codes() {
    let relay = Relay::start().await;
    let old = card(&bob(), 100, std::slice::from_ref(&relay.origin));
    // Unknown mailbox.
    let (status, body, _) = relay.post(&packets_path(), packet(&old, 1, "x").to_jcs()).await;
    assert_eq!((status, code(&body)), (404, "mailbox_unavailable"));
    assert_eq!(relay.post("/v1/mailboxes", old.to_jcs()).await.0, 200);
    // Path mailbox differs from the header.
    let other = format!("/v1/mailboxes/{}/packets", Id16([8; 16]));
    let (status, body, _) = relay.post(&other, packet(&old, 2, "x").to_jcs()).await;
    assert_eq!((status, code(&body)), (400, "invalid_event"));
    // A packet for a replaced card is stale.
    let stale = packet(&old, 3, "x");
    assert_eq!(
        relay.post("/v1/mailboxes", card(&bob(), 101, std::slice::from_ref(&relay.origin)).to_jcs()).await.0,
        200
    );
    let (status, body, _) = relay.post(&packets_path(), stale.to_jcs()).await;
    assert_eq!((status, code(&body)), (409, "stale_card"));
    // A malformed packet.
    let (status, body, _) = relay.post(&packets_path(), b"{}".to_vec()).await;
    assert_eq!((status / 100, code(&body)), (4, "invalid_event"));
}

#[tokio::test]
async fn unauthorized_reads_and_deletes_are_refused() {
    let relay = Relay::start().await;
    let current = card(&bob(), 100, std::slice::from_ref(&relay.origin));
    assert_eq!(relay.post("/v1/mailboxes", current.to_jcs()).await.0, 200);
    let p = packet(&current, 1, "secret");
    assert_eq!(relay.post(&packets_path(), p.to_jcs()).await.0, 202);
    let one = format!("{}/{}", packets_path(), p.id());

    let (status, body) = relay.get(&packets_path(), None).await;
    assert_eq!((status, code(&body)), (401, "invalid_token"));
    let (status, body) = relay.get(&packets_path(), Some("not.a.jwt")).await;
    assert_eq!((status, code(&body)), (401, "invalid_token"));
    let wrong_audience = sign_request_jwt(
        &bob(),
        &Origin::parse("https://elsewhere.example").unwrap(),
        now_ms() / 1000 - 5,
        now_ms() / 1000 + 120,
        None,
    );
    let (status, body) = relay.get(&packets_path(), Some(&wrong_audience)).await;
    assert_eq!((status, code(&body)), (401, "invalid_token"));
    let mallory = relay.jwt(&mallory());
    let (status, body) = relay.get(&packets_path(), Some(&mallory)).await;
    assert_eq!((status, code(&body)), (403, "permission_denied"));
    let (status, body) = relay.delete(&one, Some(&mallory)).await;
    assert_eq!((status, code(&body)), (403, "permission_denied"));
    let (status, body) = relay.delete(&one, None).await;
    assert_eq!((status, code(&body)), (401, "invalid_token"));
    // Unknown mailbox, but only after the token verified.
    let unknown = format!("/v1/mailboxes/{}/packets", Id16([9; 16]));
    let (status, body) = relay.get(&unknown, Some(&mallory)).await;
    assert_eq!((status, code(&body)), (404, "mailbox_unavailable"));
    let (status, body) = relay.get(&unknown, None).await;
    assert_eq!((status, code(&body)), (401, "invalid_token"));
    // Nothing was deleted.
    let (status, page) = relay.get(&packets_path(), Some(&relay.jwt(&bob()))).await;
    assert_eq!((status, page["result"].as_array().unwrap().len()), (200, 1));
}

#[tokio::test]
async fn lists_page_in_seq_order_with_an_opaque_cursor() {
    let relay = Relay::start().await;
    let current = card(&bob(), 100, std::slice::from_ref(&relay.origin));
    assert_eq!(relay.post("/v1/mailboxes", current.to_jcs()).await.0, 200);
    for n in 1..=3 {
        assert_eq!(relay.post(&packets_path(), packet(&current, n, "m").to_jcs()).await.0, 202);
    }
    let token = relay.jwt(&bob());
    let (status, page) = relay.get(&format!("{}?limit=2", packets_path()), Some(&token)).await;
    assert_eq!(status, 200, "{page}");
    let seqs: Vec<i64> = page["result"].as_array().unwrap().iter().map(|r| r["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, vec![1, 2]);
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    let (_, page) = relay.get(&format!("{}?limit=2&cursor={cursor}", packets_path()), Some(&token)).await;
    let seqs: Vec<i64> = page["result"].as_array().unwrap().iter().map(|r| r["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, vec![3]);
    assert!(page.get("next_cursor").is_none());
    for bad in ["limit=0", "limit=1001", "limit=x", "cursor=zz"] {
        let (status, body) = relay.get(&format!("{}?{bad}", packets_path()), Some(&token)).await;
        assert_eq!((status, code(&body)), (400, "invalid_request"), "{bad}");
    }
}

#[tokio::test]
async fn the_owner_blocks_new_packets_from_a_sender() {
    let relay = Relay::start().await;
    let current = card(&bob(), 100, std::slice::from_ref(&relay.origin));
    assert_eq!(relay.post("/v1/mailboxes", current.to_jcs()).await.0, 200);
    let before = packet(&current, 1, "before");
    let (_, accepted, _) = relay.post(&packets_path(), before.to_jcs()).await;
    let blocked = format!("/v1/mailboxes/{MAILBOX}/blocked/{}", AgentId::of(&alice()));
    let put = |token: Option<String>| {
        let mut req = relay.http.put(relay.url(&blocked));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    // Only the owner may change the policy.
    let r = put(Some(relay.jwt(&mallory()))).await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(put(None).await.unwrap().status().as_u16(), 401);
    assert_eq!(put(Some(relay.jwt(&bob()))).await.unwrap().status().as_u16(), 204);
    // New packets are refused; the exact retry of an accepted one still answers; nothing is erased.
    let (status, body, _) = relay.post(&packets_path(), packet(&current, 2, "after").to_jcs()).await;
    assert_eq!((status, code(&body)), (403, "permission_denied"));
    let (status, again, _) = relay.post(&packets_path(), before.to_jcs()).await;
    assert_eq!((status, &again), (202, &accepted));
    let (_, page) = relay.get(&packets_path(), Some(&relay.jwt(&bob()))).await;
    assert_eq!(page["result"].as_array().unwrap().len(), 1);
    // Unblocking admits new packets again.
    assert_eq!(relay.delete(&blocked, Some(&relay.jwt(&bob()))).await.0, 204);
    assert_eq!(relay.post(&packets_path(), packet(&current, 3, "later").to_jcs()).await.0, 202);
}

/// The derived vectors' `relay_lifecycle`, replayed over HTTP with the relay's Agent Mail clock
/// set to each step's `now` and the relay configured with the vectors' origin as its public URL: every step's
/// outcome, status, `accepted_at`, and the owner's list (`seqs`) afterwards.
#[tokio::test]
async fn derived_vectors_relay_lifecycle_replays_over_http() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../core/tests/vectors/agent-mail-1.0.vectors.derived.json");
    let v: J = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let lc = &v["relay_lifecycle"];
    let origin = lc["origin"].as_str().unwrap().to_owned();
    let vectors_now = v["now"].as_i64().unwrap();
    let token = lc["owner_token"].as_str().unwrap();
    let mailbox = lc["mailbox_id"].as_str().unwrap();
    let packets = format!("/v1/mailboxes/{mailbox}/packets");

    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(AtomicI64::new(vectors_now));
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir.path());
    config.agent_mail_clock = Some(clock.clone());
    config.public_urls = vec![origin];
    let relay = relay_lite::spawn(config).await.unwrap();
    let http = reqwest::Client::new();
    let base = relay.url();
    let send = |req: reqwest::RequestBuilder| async {
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, serde_json::from_slice::<J>(&r.bytes().await.unwrap()).unwrap_or(J::Null))
    };
    let card_jcs =
        |name: &str| MailboxCard::parse(&serde_json::to_vec(&v["envelopes"][name]).unwrap()).unwrap().to_jcs();
    let packet_jcs = |name: &str| v["encryptions"][name]["packet_jcs"].as_str().unwrap().as_bytes().to_vec();
    let packet_id = |name: &str| Packet::parse(&packet_jcs(name)).unwrap().id();
    let status_of = |code: &str| match code {
        "mailbox_unavailable" => 404,
        "stale_card" | "mailbox_conflict" | "nonce_not_greater" => 409,
        "packet_expired" => 410,
        "timestamp_out_of_window" => 400,
        other => panic!("unmapped vector code {other}"),
    };

    for (i, step) in lc["steps"].as_array().unwrap().iter().enumerate() {
        let op = step["op"].as_str().unwrap();
        let label = format!("step {i} ({op} {})", step.get("card").or(step.get("packet")).unwrap_or(&J::Null));
        let (status, body) = match op {
            "publish" => {
                clock.store(step["now"].as_i64().unwrap(), Ordering::SeqCst);
                let body = card_jcs(step["card"].as_str().unwrap());
                send(http.post(format!("{base}/v1/mailboxes")).body(body)).await
            }
            "deliver" => {
                clock.store(step["now"].as_i64().unwrap(), Ordering::SeqCst);
                let body = packet_jcs(step["packet"].as_str().unwrap());
                send(http.post(format!("{base}{packets}")).body(body)).await
            }
            "delete" => {
                clock.store(vectors_now, Ordering::SeqCst);
                let id = packet_id(step["packet"].as_str().unwrap());
                send(http.delete(format!("{base}{packets}/{id}")).bearer_auth(token)).await
            }
            other => panic!("{other}"),
        };
        match step.get("result").and_then(J::as_str) {
            None => assert_eq!(status, 204, "{label}: {body}"),
            Some("ok") => {
                assert_eq!(status, if op == "publish" { 200 } else { 202 }, "{label}: {body}");
                if let Some(at) = step.get("accepted_at") {
                    assert_eq!(body["accepted_at"], *at, "{label}: accepted_at");
                }
            }
            Some(expected) => {
                assert_eq!((status, code(&body)), (status_of(expected), expected), "{label}: {body}");
            }
        }
        clock.store(vectors_now, Ordering::SeqCst);
        let (status, page) = send(http.get(format!("{base}{packets}")).bearer_auth(token)).await;
        assert_eq!(status, 200, "{label}: list {page}");
        let seqs: Vec<&J> = page["result"].as_array().unwrap().iter().map(|r| &r["seq"]).collect();
        let want: Vec<&J> = step["seqs"].as_array().unwrap().iter().collect();
        assert_eq!(seqs, want, "{label}: seqs");
        assert_eq!(seqs.len() as i64, step["stored"].as_i64().unwrap(), "{label}: stored");
    }
    relay.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_mailbox_quota_comes_from_the_limits() {
    let relay = Relay::start_with(|c| c.limits.agent_mail.mailbox_max_packets = 2).await;
    let current = card(&bob(), 100, std::slice::from_ref(&relay.origin));
    assert_eq!(relay.post("/v1/mailboxes", current.to_jcs()).await.0, 200);
    let fits: Vec<Packet> = (1..=2).map(|n| packet(&current, n, "fits")).collect();
    for p in &fits {
        assert_eq!(relay.post(&packets_path(), p.to_jcs()).await.0, 202);
    }
    let over = packet(&current, 3, "over");
    let (status, body, _) = relay.post(&packets_path(), over.to_jcs()).await;
    assert_eq!((status, code(&body)), (429, "rate_limited"), "{body}");
    // An exact retry of an accepted packet is still answered; deleting one frees room.
    assert_eq!(relay.post(&packets_path(), fits[0].to_jcs()).await.0, 202);
    let token = relay.jwt(&bob());
    assert_eq!(relay.delete(&format!("{}/{}", packets_path(), fits[0].id()), Some(&token)).await.0, 204);
    assert_eq!(relay.post(&packets_path(), over.to_jcs()).await.0, 202);
}

#[tokio::test]
async fn the_per_ip_limit_answers_in_the_identity_error_shape() {
    let relay = Relay::start_with(|c| c.limits.ip_requests_per_minute = 3).await;
    for _ in 0..3 {
        assert_eq!(relay.get("/.well-known/agent-mail", None).await.0, 200);
    }
    let r = relay.http.get(relay.url("/.well-known/agent-mail")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().get("retry-after").is_some());
    let body: J = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(code(&body), "rate_limited", "{body}");
    assert!(body["error"]["message"].is_string());
}

#[tokio::test]
async fn store_failures_answer_in_the_identity_error_shape() {
    let relay = Relay::start().await;
    relay.relay.state().close().await;
    let (status, body, _) =
        relay.post("/v1/mailboxes", card(&bob(), 100, std::slice::from_ref(&relay.origin)).to_jcs()).await;
    assert_eq!((status, code(&body)), (503, "unavailable"), "{body}");
}

#[tokio::test]
async fn the_sweep_keeps_tombstones_through_packet_expiry_then_forgets_the_mailbox() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};

    let start = now_ms();
    let clock = Arc::new(AtomicI64::new(start));
    let relay = Relay::start_with(|c| c.agent_mail_clock = Some(clock.clone())).await;
    let current = card(&bob(), 100, std::slice::from_ref(&relay.origin));
    assert_eq!(relay.post("/v1/mailboxes", current.to_jcs()).await.0, 200);
    let p = packet(&current, 1, "short-lived");
    assert_eq!(relay.post(&packets_path(), p.to_jcs()).await.0, 202);
    let token = relay.jwt(&bob());
    assert_eq!(relay.delete(&format!("{}/{}", packets_path(), p.id()), Some(&token)).await.0, 204);

    // Before the packet expires the sweep keeps its tombstone: a retry is the original result.
    relay.relay.state().sweep_now().await.unwrap();
    assert_eq!(relay.post(&packets_path(), p.to_jcs()).await.0, 202);
    // Past its expiry the tombstone is reclaimed, and the same bytes are now simply expired.
    clock.store(p.header().expires_at + 1, Ordering::SeqCst);
    relay.relay.state().sweep_now().await.unwrap();
    let (status, body, _) = relay.post(&packets_path(), p.to_jcs()).await;
    assert_eq!((status, code(&body)), (410, "packet_expired"), "{body}");

    // Past the card's receive_until the mailbox, its binding and its card are forgotten.
    assert_eq!(relay.get(&format!("/v1/mailboxes/{MAILBOX}/card"), None).await.0, 200);
    clock.store(current.payload().receive_until, Ordering::SeqCst);
    relay.relay.state().sweep_now().await.unwrap();
    let (status, body) = relay.get(&format!("/v1/mailboxes/{MAILBOX}/card"), None).await;
    assert_eq!((status, code(&body)), (404, "mailbox_unavailable"));
}

/// A packet whose message (and so the packet) expires `ttl` ms after now.
fn packet_ttl(card: &MailboxCard, nonce: u64, text: &str, ttl: i64) -> Packet {
    let now = now_ms();
    let mut rng = SeededRng::new([nonce as u8; 32]);
    let message = Message::new(&mut rng, AgentId::of(&alice()), *card.owner(), now, now + ttl, vec![Part::text(text)]);
    let req = SealRequest { sender: &alice(), card, message: &message, created_at: now, nonce };
    seal(&req, now, &mut rng).unwrap()
}

/// The stored per-mailbox counters (packets, bytes), read from the relay's database file.
async fn counters(dir: &std::path::Path) -> (i64, i64) {
    use sqlx::ConnectOptions as _;
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join(relay_lite::store::DB_FILE))
        .read_only(true)
        .connect()
        .await
        .unwrap();
    let row: (i64, i64) = sqlx::query_as("SELECT stored_packets, stored_bytes FROM am_mailboxes WHERE mailbox_id = ?")
        .bind(MAILBOX.to_string())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    row
}

#[tokio::test]
async fn the_quota_counters_stay_right_across_delete_sweep_and_restart() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};

    const HOUR_MS: i64 = 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(AtomicI64::new(now_ms()));
    let config = |clock: &Arc<AtomicI64>| {
        let mut c = Config::new("127.0.0.1:0".parse().unwrap(), dir.path());
        c.limits.agent_mail.mailbox_max_packets = 3;
        c.agent_mail_clock = Some(clock.clone());
        c
    };
    let mut relay = relay_lite::spawn(config(&clock)).await.unwrap();
    let http = reqwest::Client::new();
    let origin = Origin::parse(&format!("https://{}", relay.addr)).unwrap();
    let current = card(&bob(), 100, std::slice::from_ref(&origin));
    let post = |relay: &RunningRelay, path: String, body: Vec<u8>| {
        let req = http.post(format!("{}{path}", relay.url())).body(body);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(post(&relay, "/v1/mailboxes".into(), current.to_jcs()).await, 200);
    assert_eq!(counters(dir.path()).await, (0, 0));

    let short = packet_ttl(&current, 1, "short", HOUR_MS);
    let long: Vec<Packet> = (2..=6).map(|n| packet_ttl(&current, n, "long", DAY_MS / 2)).collect();
    let size = |p: &Packet| p.size() as i64;
    for p in [&short, &long[0], &long[1]] {
        assert_eq!(post(&relay, packets_path(), p.to_jcs()).await, 202);
    }
    assert_eq!(counters(dir.path()).await, (3, size(&short) + size(&long[0]) + size(&long[1])));
    assert_eq!(post(&relay, packets_path(), long[2].to_jcs()).await, 429);

    // Delete frees one packet, once; the tombstone's retry changes nothing.
    let token = {
        let now = now_ms() / 1000;
        sign_request_jwt(&bob(), &origin, now - 5, now + 120, None)
    };
    for _ in 0..2 {
        let url = format!("{}{}/{}", relay.url(), packets_path(), long[0].id());
        assert_eq!(http.delete(url).bearer_auth(&token).send().await.unwrap().status().as_u16(), 204);
    }
    assert_eq!(post(&relay, packets_path(), long[0].to_jcs()).await, 202);
    assert_eq!(counters(dir.path()).await, (2, size(&short) + size(&long[1])));
    assert_eq!(post(&relay, packets_path(), long[2].to_jcs()).await, 202);
    assert_eq!(counters(dir.path()).await, (3, size(&short) + size(&long[1]) + size(&long[2])));

    // Past the short packet's expiry, before any sweep: the counters still hold it, and the
    // quota counts exactly (only two live packets), so one more fits.
    clock.store(short.header().expires_at + 1, Ordering::SeqCst);
    assert_eq!(post(&relay, packets_path(), long[3].to_jcs()).await, 202);
    assert_eq!(counters(dir.path()).await.0, 4);
    assert_eq!(post(&relay, packets_path(), long[4].to_jcs()).await, 429);

    // The sweep reclaims the expired packet and recounts.
    relay.state().sweep_now().await.unwrap();
    let live = size(&long[1]) + size(&long[2]) + size(&long[3]);
    assert_eq!(counters(dir.path()).await, (3, live));

    // A restart keeps them: still full, and a delete still frees exactly one.
    relay.shutdown().await.unwrap();
    relay = relay_lite::spawn(config(&clock)).await.unwrap();
    let origin2 = Origin::parse(&format!("https://{}", relay.addr)).unwrap();
    assert_eq!(counters(dir.path()).await, (3, live));
    let token = {
        let now = clock.load(Ordering::SeqCst) / 1000;
        sign_request_jwt(&bob(), &origin2, now - 5, now + 120, None)
    };
    let url = format!("{}{}/{}", relay.url(), packets_path(), long[1].id());
    assert_eq!(http.delete(url).bearer_auth(&token).send().await.unwrap().status().as_u16(), 204);
    assert_eq!(counters(dir.path()).await, (2, live - size(&long[1])));
    relay.shutdown().await.unwrap();
}
