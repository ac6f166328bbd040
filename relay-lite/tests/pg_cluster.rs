//! Three `relay-lite` processes on one PostgreSQL database, as a load balancer would spread
//! clients over them (one public URL, any instance takes any request):
//! - a websocket parked on C wakes within 200 ms of a send through A;
//! - a letmeknow long-poll parked on C wakes within 200 ms of a post through A;
//! - two commits at one epoch through A and B: exactly one `200`, the other `409` with the epoch;
//! - one invite id created through A and B at once: one `201`, one `409`; one join through A and
//!   B at once: one `204`, one `409`;
//! - a Stringcup long-poll parked on C wakes within 200 ms of a send through A;
//! - one Stringcup `Idempotency-Key` through A and B at once: one message, identical answers;
//! - an Agent Mail card published through A is served by C, and a packet delivered through B and
//!   C at once is stored once.
//!
//! Needs PostgreSQL (see `pg_common`): skipped with a reason without it, failed under
//! `SWITCHBOARD_REQUIRE_POSTGRES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
mod pg_common;

use std::time::{Duration, Instant};

use common::{BinRelay, Owner, http_client, small_envelope, start_binary};
use futures_util::{SinkExt as _, StreamExt as _};
use switchboard_core::protocol::letagents::wire::RelayToClient;
use switchboard_core::protocol::letmeknow::header::{ContentType, build};
use switchboard_core::protocol::letmeknow::new_id;
use switchboard_core::util::OsRng;
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;

/// The name every instance answers to (what clients sign logins for).
const PUBLIC: &str = "http://relay.test";
const HOST: &str = "relay.test";

struct Cluster {
    a: BinRelay,
    b: BinRelay,
    c: BinRelay,
    _dirs: Vec<tempfile::TempDir>,
}

async fn instance(url: &str, dirs: &mut Vec<tempfile::TempDir>) -> BinRelay {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    dirs.push(dir);
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--data",
        &data,
        "--database",
        url,
        "--public-url",
        PUBLIC,
        "--ip-requests-per-minute",
        "0",
    ];
    start_binary(&args, http_client()).await
}

async fn three_instances() -> Option<Cluster> {
    let pg = pg_common::cluster()?;
    let url = pg.fresh_database().await;
    let mut dirs = Vec::new();
    // One at a time: the first runs the migrations (concurrent starts wait on sqlx's lock too).
    let a = instance(&url, &mut dirs).await;
    let b = instance(&url, &mut dirs).await;
    let c = instance(&url, &mut dirs).await;
    Some(Cluster { a, b, c, _dirs: dirs })
}

async fn next_frame<S>(ws: &mut S) -> RelayToClient
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap().unwrap().unwrap();
        if let Message::Text(text) = frame {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_parked_on_c_wakes_within_200ms_of_a_send_through_a() {
    let Some(cl) = three_instances().await else { return };
    let alice = Owner::new();
    let url = format!("ws://{}/v1/inbox/{}?{}", cl.c.addr, alice.id, alice.login(HOST).query());
    let (mut ws, _) = connect_async(url.as_str()).await.unwrap();
    assert!(matches!(next_frame(&mut ws).await, RelayToClient::Ready));
    for round in 0..5 {
        let sent = Instant::now();
        assert_eq!(cl.a.send(&alice, small_envelope(&format!("r{round}"))).await, 202);
        match next_frame(&mut ws).await {
            RelayToClient::Msg { seq, .. } => assert_eq!(seq, round + 1),
            other => panic!("expected a msg frame, got {other:?}"),
        }
        let took = sent.elapsed();
        assert!(took < Duration::from_millis(200), "round {round}: C delivered {took:?} after A was sent to");
    }
    // B sees the same mailbox; its ack through B empties it for everybody.
    let ack = switchboard_core::protocol::letagents::relay_auth::sign_ack(&alice.key, HOST, alice.next_ts(), &[1, 2]);
    let r = cl.b.http.post(cl.b.url(&format!("/v1/ack/{}?{ack}", alice.id))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    ws.send(Message::Close(None)).await.unwrap();
}

fn commit(gid: &str, epoch: u64) -> Vec<u8> {
    build(gid.as_bytes(), epoch, ContentType::Commit, b"commit")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_parked_on_c_wakes_within_200ms_of_a_post_through_a() {
    let Some(cl) = three_instances().await else { return };
    let gid = new_id(&mut OsRng);
    let poll = {
        let (http, url) = (cl.c.http.clone(), cl.c.url(&format!("/g/{gid}/messages?after=0&wait=20")));
        tokio::spawn(async move {
            let r = http.get(url).send().await.unwrap();
            (Instant::now(), r.status(), r.json::<serde_json::Value>().await.unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    let r = cl.a.http.post(cl.a.url(&format!("/g/{gid}/messages"))).body(commit(&gid, 0)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let (answered, status, body) = poll.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body.as_array().map(Vec::len), Some(1), "{body}");
    let took = answered.duration_since(sent);
    assert!(took < Duration::from_millis(200), "C answered {took:?} after A took the post");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_at_one_epoch_through_a_and_b_exactly_one_wins_the_other_gets_409() {
    let Some(cl) = three_instances().await else { return };
    for round in 0..10 {
        let gid = new_id(&mut OsRng);
        let post = |relay: &BinRelay| {
            let (http, url) = (relay.http.clone(), relay.url(&format!("/g/{gid}/messages")));
            let body = commit(&gid, 0);
            tokio::spawn(async move {
                let r = http.post(url).body(body).send().await.unwrap();
                (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap())
            })
        };
        let (ra, rb) = (post(&cl.a), post(&cl.b));
        let mut answers = [ra.await.unwrap(), rb.await.unwrap()];
        answers.sort_by_key(|(status, _)| *status);
        assert_eq!(answers[0].0, 200, "round {round}: {answers:?}");
        assert_eq!(answers[0].1["seq"], 1);
        assert_eq!(answers[1].0, 409, "round {round}: {answers:?}");
        assert_eq!(answers[1].1["epoch"], 1);
        // And C agrees on the log.
        let r = cl.c.http.get(cl.c.url(&format!("/g/{gid}/messages?after=0"))).send().await.unwrap();
        assert_eq!(r.json::<serde_json::Value>().await.unwrap().as_array().map(Vec::len), Some(1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_invite_id_through_a_and_b_makes_one_invite_and_takes_one_join() {
    let Some(cl) = three_instances().await else { return };
    for round in 0..10 {
        let id = new_id(&mut OsRng);
        let owner = switchboard_core::protocol::letmeknow::invite::new_owner_token(&mut OsRng);
        let put = |relay: &BinRelay| {
            let (http, url) = (relay.http.clone(), relay.url(&format!("/i/{id}")));
            let body = serde_json::json!({"ttl": 600, "owner": owner});
            tokio::spawn(async move { http.put(url).json(&body).send().await.unwrap().status().as_u16() })
        };
        let (pa, pb) = (put(&cl.a), put(&cl.b));
        let mut created = [pa.await.unwrap(), pb.await.unwrap()];
        created.sort_unstable();
        assert_eq!(created, [201, 409], "round {round}");
        let join = |relay: &BinRelay, data: &str| {
            let (http, url) = (relay.http.clone(), relay.url(&format!("/i/{id}/join")));
            let body = serde_json::json!({ "data": data });
            tokio::spawn(async move { http.post(url).json(&body).send().await.unwrap().status().as_u16() })
        };
        let (ja, jb) = (join(&cl.a, "QUFB"), join(&cl.b, "QkJC"));
        let mut joined = [ja.await.unwrap(), jb.await.unwrap()];
        joined.sort_unstable();
        assert_eq!(joined, [204, 409], "round {round}");
    }
}

/// A registered Stringcup identity: id and bearer token.
struct ScAgent {
    id: String,
    token: String,
}

async fn sc_register(relay: &BinRelay, name: &str) -> ScAgent {
    let key = data_encoding::BASE64.encode(&switchboard_core::util::random_array::<32>());
    let body = serde_json::json!({"identity_public_key": key, "algo": "x25519", "display_name": name});
    let r = relay.http.post(relay.url("/api/v2/identities")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let body: serde_json::Value = r.json().await.unwrap();
    ScAgent { id: body["id"].as_str().unwrap().into(), token: body["api_token"].as_str().unwrap().into() }
}

fn sc_message(to: &ScAgent, text: &str) -> serde_json::Value {
    let b64 = |bytes: &[u8]| data_encoding::BASE64.encode(bytes);
    let mut ciphertext = text.as_bytes().to_vec();
    ciphertext.resize(text.len() + 16, b'.');
    serde_json::json!({
        "recipient_id": to.id,
        "header": {
            "version": 2,
            "algo": "x25519+ecies+aes256gcm",
            "ephemeral_pub": b64(&switchboard_core::util::random_array::<32>()),
            "iv": b64(&switchboard_core::util::random_array::<12>()),
        },
        "ciphertext": b64(&ciphertext),
    })
}

/// `POST /api/v2/messages` through `relay`: the status and the JSON answer.
async fn sc_send(
    relay: &BinRelay,
    from: &ScAgent,
    body: &serde_json::Value,
    key: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut request = relay.http.post(relay.url("/api/v2/messages")).bearer_auth(&from.token).json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let r = request.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stringcup_long_poll_parked_on_c_wakes_within_200ms_of_a_send_through_a() {
    let Some(cl) = three_instances().await else { return };
    let alice = sc_register(&cl.a, "alice").await;
    let bob = sc_register(&cl.b, "bob").await;
    for round in 0..5i64 {
        let poll = {
            let url = cl.c.url(&format!("/api/v2/messages?since_id={round}&wait=20"));
            let request = cl.c.http.get(url).bearer_auth(&bob.token);
            tokio::spawn(async move {
                let r = request.send().await.unwrap();
                (Instant::now(), r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sent = Instant::now();
        let (status, _) = sc_send(&cl.a, &alice, &sc_message(&bob, &format!("r{round}")), None).await;
        assert_eq!(status, 201);
        let (answered, status, body) = poll.await.unwrap();
        assert_eq!(status, 200, "{body}");
        let ids: Vec<i64> = body["messages"].as_array().unwrap().iter().map(|m| m["id"].as_i64().unwrap()).collect();
        assert_eq!(ids, vec![round + 1], "{body}");
        let took = answered.duration_since(sent);
        assert!(took < Duration::from_millis(200), "round {round}: C answered {took:?} after A took the send");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stringcup_idempotency_key_through_a_and_b_stores_one_message_with_identical_answers() {
    let Some(cl) = three_instances().await else { return };
    let alice = sc_register(&cl.a, "alice").await;
    let bob = sc_register(&cl.a, "bob").await;
    for round in 0..5 {
        let key = format!("retry-{round}");
        let body = sc_message(&bob, &format!("once {round}"));
        let (ra, rb) =
            tokio::join!(sc_send(&cl.a, &alice, &body, Some(&key)), sc_send(&cl.b, &alice, &body, Some(&key)));
        // One stored it (201), the other replayed it (200); both name the same sent_seq.
        let mut statuses = [ra.0, rb.0];
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 201], "round {round}: {ra:?} {rb:?}");
        assert_eq!(ra.1["sent_seq"], rb.1["sent_seq"], "round {round}: {ra:?} {rb:?}");
        assert_eq!((ra.1["status"].as_str(), rb.1["status"].as_str()), (Some("stored"), Some("stored")));
    }
    let r = cl.c.http.get(cl.c.url("/api/v2/messages?limit=100")).bearer_auth(&bob.token).send().await.unwrap();
    let inbox: serde_json::Value = r.json().await.unwrap();
    assert_eq!(inbox["count"], 5, "one message per key: {inbox}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_mail_card_published_through_a_is_served_by_c_and_a_packet_through_b_and_c_is_stored_once() {
    use ed25519_dalek::SigningKey;
    use switchboard_core::protocol::agent_identity::jwt::sign_request_jwt;
    use switchboard_core::protocol::agent_identity::{AgentId, Origin};
    use switchboard_core::protocol::agent_mail::card::CardPayload;
    use switchboard_core::protocol::agent_mail::packet::{SealRequest, seal};
    use switchboard_core::protocol::agent_mail::{DAY_MS, Id16, MailboxCard, Message, Part};
    use switchboard_core::util::{SeededRng, now_ms};

    let Some(cl) = three_instances().await else { return };
    // Every instance names itself by the public URL's https origin.
    let origin = Origin::parse("https://relay.test").unwrap();
    let (owner, sender) = (SigningKey::from_bytes(&[0xb0; 32]), SigningKey::from_bytes(&[0xa1; 32]));
    let mailbox = Id16([7; 16]);
    let now = now_ms();
    let payload = CardPayload {
        mailbox_id: mailbox,
        expires_at: now + DAY_MS,
        receive_until: now + 2 * DAY_MS,
        public_key: x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([0xb1; 32])).to_bytes(),
        routes: vec![origin.clone()],
        max_packet_bytes: 65536,
    };
    let card = MailboxCard::sign(&owner, now, 1, payload).unwrap();
    let r = cl.a.http.post(cl.a.url("/v1/mailboxes")).body(card.to_jcs()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = cl.c.http.get(cl.c.url(&format!("/v1/mailboxes/{mailbox}/card"))).send().await.unwrap();
    assert_eq!(r.status(), 200, "C serves the card A accepted");
    let packets = format!("/v1/mailboxes/{mailbox}/packets");
    for n in 1..=5u64 {
        let mut rng = SeededRng::new([n as u8; 32]);
        let message =
            Message::new(&mut rng, AgentId::of(&sender), *card.owner(), now, now + DAY_MS / 2, vec![Part::text("hi")]);
        let req = SealRequest { sender: &sender, card: &card, message: &message, created_at: now, nonce: n };
        let packet = seal(&req, now, &mut rng).unwrap().to_jcs();
        let deliver = |relay: &BinRelay| {
            let request = relay.http.post(relay.url(&packets)).body(packet.clone());
            async move {
                let r = request.send().await.unwrap();
                (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap())
            }
        };
        let (rb, rc) = tokio::join!(deliver(&cl.b), deliver(&cl.c));
        assert_eq!((rb.0, rc.0), (202, 202), "packet {n}: {rb:?} {rc:?}");
        assert_eq!(rb.1, rc.1, "packet {n}: both answers name the one acceptance");
    }
    let at = now_ms() / 1000;
    let jwt = sign_request_jwt(&owner, &origin, at - 5, at + 120, None);
    let r = cl.a.http.get(cl.a.url(&packets)).bearer_auth(jwt).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let page: serde_json::Value = r.json().await.unwrap();
    assert_eq!(page["result"].as_array().map(Vec::len), Some(5), "each packet stored once: {page}");
}
