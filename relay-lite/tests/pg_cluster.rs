//! Three `relay-lite` processes on one PostgreSQL database, as a load balancer would spread
//! clients over them (one public URL, any instance takes any request):
//! - a websocket parked on C wakes within 200 ms of a send through A;
//! - a letmeknow long-poll parked on C wakes within 200 ms of a post through A;
//! - two commits at one epoch through A and B: exactly one `200`, the other `409` with the epoch;
//! - one invite id created through A and B at once: one `201`, one `409`; one join through A and
//!   B at once: one `204`, one `409`;
//! - a relay asked to serve a family PostgreSQL does not serve refuses to start, naming it.
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
        "--families",
        "letagents,letmeknow",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_postgres_refuses_to_start_with_a_family_postgres_does_not_serve() {
    let Some(pg) = pg_common::cluster() else { return };
    let url = pg.fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_relay-lite"))
        .args(["--listen", "127.0.0.1:0", "--data", dir.path().to_str().unwrap(), "--database", &url])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stringcup, agent-mail"), "{err}");
    assert!(err.contains("--families letagents,letmeknow"), "{err}");
}
