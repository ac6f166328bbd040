//! The letmeknow group log and invite API over real HTTP against an in-process relay on a
//! loopback port: every status code `specs/letmeknow-relay.md` names, the epoch compare-and-set,
//! long-polls woken by commits, retention that keeps the epoch, and invites that take one join
//! and one welcome and vanish at expiry. The relay reads only the PrivateMessage header, so the
//! messages here are well-formed headers around opaque bytes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::time::{Duration, Instant};

use common::{TestRelay, relay, relay_with};
use switchboard_core::protocol::letmeknow::header::{ContentType, build};
use switchboard_core::protocol::letmeknow::wire::{InviteData, RelayToClientLogEntry, b64, b64_decode};
use switchboard_core::protocol::letmeknow::{INVITE_TTL, new_id};
use switchboard_core::util::OsRng;

fn gid() -> String {
    new_id(&mut OsRng)
}

fn commit(gid: &str, epoch: u64) -> Vec<u8> {
    build(gid.as_bytes(), epoch, ContentType::Commit, b"commit")
}

fn app(gid: &str, epoch: u64, text: &str) -> Vec<u8> {
    build(gid.as_bytes(), epoch, ContentType::Application, text.as_bytes())
}

fn owner() -> String {
    switchboard_core::protocol::letmeknow::invite::new_owner_token(&mut OsRng)
}

async fn post(relay: &TestRelay, gid: &str, body: Vec<u8>) -> reqwest::Response {
    relay.http.post(relay.url(&format!("/g/{gid}/messages"))).body(body).send().await.unwrap()
}

async fn post_json(relay: &TestRelay, gid: &str, body: Vec<u8>) -> (u16, serde_json::Value) {
    let r = post(relay, gid, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn read(relay: &TestRelay, gid: &str, query: &str) -> Vec<RelayToClientLogEntry> {
    let r = relay.http.get(relay.url(&format!("/g/{gid}/messages?{query}"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

async fn put_invite(relay: &TestRelay, id: &str, body: serde_json::Value) -> u16 {
    relay.http.put(relay.url(&format!("/i/{id}"))).json(&body).send().await.unwrap().status().as_u16()
}

async fn invite(relay: &TestRelay, ttl: u64) -> (String, String) {
    let (id, owner) = (new_id(&mut OsRng), owner());
    assert_eq!(put_invite(relay, &id, serde_json::json!({"ttl": ttl, "owner": owner})).await, 201);
    (id, owner)
}

async fn post_blob(relay: &TestRelay, id: &str, role: &str, token: Option<&str>, data: &[u8]) -> u16 {
    let mut req = relay.http.post(relay.url(&format!("/i/{id}/{role}"))).json(&InviteData { data: b64(data) });
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await.unwrap().status().as_u16()
}

async fn get_blob(relay: &TestRelay, id: &str, role: &str, wait: u64) -> (u16, Option<Vec<u8>>) {
    let r = relay.http.get(relay.url(&format!("/i/{id}/{role}?wait={wait}"))).send().await.unwrap();
    let status = r.status().as_u16();
    if status == 200 {
        let body: InviteData = r.json().await.unwrap();
        (status, Some(b64_decode(&body.data).unwrap()))
    } else {
        (status, None)
    }
}

#[tokio::test]
async fn a_commit_must_target_the_current_epoch_and_advances_it() {
    let relay = relay().await;
    let g = gid();
    assert_eq!(post_json(&relay, &g, commit(&g, 0)).await, (200, serde_json::json!({"seq": 1})));
    let (status, body) = post_json(&relay, &g, commit(&g, 0)).await;
    assert_eq!((status, body["epoch"].as_u64()), (409, Some(1)), "the loser of the race learns the epoch");
    assert_eq!(post_json(&relay, &g, app(&g, 1, "hi")).await, (200, serde_json::json!({"seq": 2})));
    let (status, body) = post_json(&relay, &g, app(&g, 0, "stale")).await;
    assert_eq!((status, body["epoch"].as_u64()), (409, Some(1)), "application messages from an old epoch");
    let (status, body) = post_json(&relay, &g, commit(&g, 5)).await;
    assert_eq!((status, body["epoch"].as_u64()), (409, Some(1)), "a commit from the future");
    assert_eq!(post_json(&relay, &g, commit(&g, 1)).await.0, 200);
    let log = read(&relay, &g, "after=0").await;
    assert_eq!(log.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(b64_decode(&log[1].data).unwrap(), app(&g, 1, "hi"));
    // Groups are independent.
    let other = gid();
    assert_eq!(post_json(&relay, &other, commit(&other, 0)).await, (200, serde_json::json!({"seq": 1})));
}

#[tokio::test]
async fn anything_but_an_application_or_commit_private_message_for_this_group_is_400() {
    let relay = relay().await;
    let g = gid();
    let mut public = commit(&g, 0);
    public[3] = 1;
    let mut proposal = commit(&g, 0);
    proposal[4 + 1 + 32 + 8] = 2;
    let mut trailing = commit(&g, 0);
    trailing.push(0);
    for body in [b"garbage".to_vec(), Vec::new(), public, proposal, trailing, commit(&gid(), 0)] {
        let r = post(&relay, &g, body).await;
        assert_eq!(r.status(), 400);
        assert_eq!(r.json::<serde_json::Value>().await.unwrap()["error"], "bad_request");
    }
    assert!(read(&relay, &g, "").await.is_empty(), "nothing was stored");
}

#[tokio::test]
async fn ids_that_are_not_32_lower_case_hex_are_404() {
    let relay = relay().await;
    let g = gid();
    for bad in [g.to_uppercase(), g[..31].to_owned(), format!("{g}0"), "zz".repeat(16)] {
        assert_eq!(post(&relay, &bad, commit(&bad, 0)).await.status(), 404, "{bad}");
        let r = relay.http.get(relay.url(&format!("/g/{bad}/messages"))).send().await.unwrap();
        assert_eq!(r.status(), 404);
        assert_eq!(put_invite(&relay, &bad, serde_json::json!({"ttl": 60, "owner": owner()})).await, 404);
    }
}

#[tokio::test]
async fn a_message_of_256_kib_is_accepted_and_one_byte_more_is_413() {
    let relay = relay().await;
    let g = gid();
    let overhead = build(g.as_bytes(), 0, ContentType::Application, &[0; 100_000]).len() - 100_000;
    let fits = build(g.as_bytes(), 0, ContentType::Application, &vec![1; 256 * 1024 - overhead]);
    assert_eq!(fits.len(), 256 * 1024);
    assert_eq!(post(&relay, &g, fits).await.status(), 200);
    let over = build(g.as_bytes(), 0, ContentType::Application, &vec![1; 256 * 1024 - overhead + 1]);
    let r = post(&relay, &g, over).await;
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["error"], "too_large");
}

#[tokio::test]
async fn an_oversized_join_or_welcome_is_413_naming_the_real_limit() {
    let relay = relay().await;
    let (id, owner) = invite(&relay, 60).await;
    let limit = (256 * 1024) * 4 / 3 + 1024;
    for role in ["join", "welcome"] {
        let body = format!("{{\"data\":\"{}\"}}", "A".repeat(limit));
        let r = relay
            .http
            .post(relay.url(&format!("/i/{id}/{role}")))
            .bearer_auth(&owner)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 413, "{role}");
        let body: serde_json::Value = r.json().await.unwrap();
        let message = body["message"].as_str().unwrap_or_default().to_owned();
        assert!(message.contains(&format!("{limit} bytes")), "{role}: {body}");
        assert!(!message.contains(&usize::MAX.to_string()), "{role}: {body}");
    }
}

#[tokio::test]
async fn posts_past_the_per_group_rate_are_429_with_retry_after() {
    let relay = relay_with(|c| c.limits.letmeknow.posts_per_group_minute = 3).await;
    let g = gid();
    for i in 0..3 {
        assert_eq!(post(&relay, &g, app(&g, 0, &format!("{i}"))).await.status(), 200);
    }
    let r = post(&relay, &g, app(&g, 0, "too many")).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let other = gid();
    assert_eq!(post(&relay, &other, app(&other, 0, "x")).await.status(), 200, "limits are per group");
}

#[tokio::test]
async fn reads_return_entries_after_the_cursor_at_most_500_and_refuse_a_bad_cursor() {
    let relay = relay_with(|c| c.limits.letmeknow.posts_per_group_minute = 0).await;
    let g = gid();
    for i in 0..502 {
        assert_eq!(post(&relay, &g, app(&g, 0, &format!("{i}"))).await.status(), 200);
    }
    let page = read(&relay, &g, "after=0").await;
    assert_eq!(page.len(), 500);
    assert_eq!((page[0].seq, page[499].seq), (1, 500));
    let rest = read(&relay, &g, "after=500").await;
    assert_eq!(rest.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![501, 502]);
    assert!(read(&relay, &g, "after=502").await.is_empty());
    assert!(read(&relay, &gid(), "after=0").await.is_empty(), "an unwritten group reads empty");
    for bad in ["after=-1", "after=x", "wait=-3", "wait=abc"] {
        let r = relay.http.get(relay.url(&format!("/g/{g}/messages?{bad}"))).send().await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
}

#[tokio::test]
async fn a_long_poll_is_woken_at_once_by_a_new_message() {
    let relay = relay().await;
    let g = gid();
    let url = relay.url(&format!("/g/{g}/messages?after=0&wait=30"));
    let http = relay.http.clone();
    let started = Instant::now();
    let waiter =
        tokio::spawn(async move { http.get(url).send().await.unwrap().json::<Vec<RelayToClientLogEntry>>().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(post(&relay, &g, commit(&g, 0)).await.status(), 200);
    let got = waiter.await.unwrap().unwrap();
    assert_eq!(got.len(), 1);
    assert!(started.elapsed() < Duration::from_secs(5), "woken by the commit, not the timeout");
}

#[tokio::test]
async fn a_long_poll_ends_empty_and_the_wait_is_capped() {
    let relay = relay_with(|c| c.limits.letmeknow.max_wait_secs = 1).await;
    let g = gid();
    let started = Instant::now();
    assert!(read(&relay, &g, "after=0&wait=600").await.is_empty());
    let held = started.elapsed();
    assert!(held >= Duration::from_millis(900) && held < Duration::from_secs(5), "held {held:?}");
}

#[tokio::test]
async fn retention_deletes_old_messages_but_the_epoch_survives() {
    let relay = relay_with(|c| c.limits.letmeknow.retention_ms = 1).await;
    let g = gid();
    assert_eq!(post(&relay, &g, commit(&g, 0)).await.status(), 200);
    assert_eq!(post(&relay, &g, commit(&g, 1)).await.status(), 200);
    tokio::time::sleep(Duration::from_millis(20)).await;
    relay.relay.state().sweep_now().await.unwrap();
    assert!(read(&relay, &g, "after=0").await.is_empty(), "the log is gone");
    let (status, body) = post_json(&relay, &g, commit(&g, 0)).await;
    assert_eq!((status, body["epoch"].as_u64()), (409, Some(2)), "the epoch is not");
    assert_eq!(post_json(&relay, &g, commit(&g, 2)).await, (200, serde_json::json!({"seq": 3})), "nor the seq");
}

#[tokio::test]
async fn an_invite_is_created_once_and_its_values_are_checked() {
    let relay = relay().await;
    let (id, owner) = invite(&relay, INVITE_TTL).await;
    assert_eq!(put_invite(&relay, &id, serde_json::json!({"ttl": 60, "owner": owner})).await, 409);
    let fresh = new_id(&mut OsRng);
    for bad in [
        serde_json::json!({"ttl": 0, "owner": owner}),
        serde_json::json!({"ttl": 86_401, "owner": owner}),
        serde_json::json!({"ttl": -1, "owner": owner}),
        serde_json::json!({"ttl": 60, "owner": owner.to_uppercase()}),
        serde_json::json!({"ttl": 60, "owner": &owner[..63]}),
        serde_json::json!({"ttl": 60}),
        serde_json::json!([1]),
    ] {
        assert_eq!(put_invite(&relay, &fresh, bad.clone()).await, 400, "{bad}");
    }
    let r = relay.http.put(relay.url(&format!("/i/{fresh}"))).body("not json").send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(put_invite(&relay, &fresh, serde_json::json!({"ttl": 86_400, "owner": owner})).await, 201);
}

#[tokio::test]
async fn a_plain_get_of_an_invite_explains_how_to_join() {
    let relay = relay().await;
    let (id, _) = invite(&relay, 60).await;
    let r = relay.http.get(relay.url(&format!("/i/{id}"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = r.text().await.unwrap();
    // The relay's own URL (here its loopback default, plain http), as the invite links its clients make.
    assert!(text.contains(&format!("switchboard join 'http://{}/i/{id}#", relay.host())), "{text}");
    let r = relay.http.get(relay.url(&format!("/i/{}", new_id(&mut OsRng)))).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn an_invite_takes_one_join_then_one_welcome_from_its_owner_only() {
    let relay = relay().await;
    let (id, owner) = invite(&relay, 60).await;
    assert_eq!(get_blob(&relay, &id, "join", 0).await, (204, None));
    assert_eq!(post_blob(&relay, &id, "welcome", Some(&owner), b"early").await, 409, "no join yet");
    assert_eq!(post_blob(&relay, &id, "join", None, b"key package").await, 204);
    assert_eq!(post_blob(&relay, &id, "join", None, b"second joiner").await, 409);
    assert_eq!(get_blob(&relay, &id, "join", 0).await, (200, Some(b"key package".to_vec())));
    assert_eq!(get_blob(&relay, &id, "welcome", 0).await, (204, None));
    assert_eq!(post_blob(&relay, &id, "welcome", None, b"forged").await, 403, "no owner token");
    assert_eq!(post_blob(&relay, &id, "welcome", Some(&self::owner()), b"forged").await, 403, "wrong token");
    assert_eq!(post_blob(&relay, &id, "welcome", Some("short"), b"forged").await, 403, "malformed token");
    assert_eq!(post_blob(&relay, &id, "welcome", Some(&owner), b"welcome").await, 204);
    assert_eq!(post_blob(&relay, &id, "welcome", Some(&owner), b"again").await, 409);
    assert_eq!(get_blob(&relay, &id, "welcome", 0).await, (200, Some(b"welcome".to_vec())));
    let r = relay
        .http
        .post(relay.url(&format!("/i/{id}/join")))
        .json(&serde_json::json!({"data": "not base64!"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn long_polls_on_an_invite_are_woken_by_the_join_and_the_welcome() {
    let relay = relay().await;
    let (id, owner) = invite(&relay, 60).await;
    let (http, join_url, welcome_url) = (
        relay.http.clone(),
        relay.url(&format!("/i/{id}/join?wait=30")),
        relay.url(&format!("/i/{id}/welcome?wait=30")),
    );
    let started = Instant::now();
    let inviter = tokio::spawn({
        let http = http.clone();
        async move { http.get(join_url).send().await.unwrap().json::<InviteData>().await.unwrap() }
    });
    let joiner =
        tokio::spawn(async move { http.get(welcome_url).send().await.unwrap().json::<InviteData>().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(post_blob(&relay, &id, "join", None, b"kp").await, 204);
    assert_eq!(b64_decode(&inviter.await.unwrap().data).unwrap(), b"kp");
    assert_eq!(post_blob(&relay, &id, "welcome", Some(&owner), b"w").await, 204);
    assert_eq!(b64_decode(&joiner.await.unwrap().data).unwrap(), b"w");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn an_expired_invite_is_404_for_every_call_and_is_deleted() {
    let relay = relay().await;
    let (id, owner) = invite(&relay, 1).await;
    assert_eq!(post_blob(&relay, &id, "join", None, b"kp").await, 204);
    // A hold never outlasts the invite.
    let started = Instant::now();
    assert_eq!(get_blob(&relay, &id, "welcome", 30).await.0, 404);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(get_blob(&relay, &id, "join", 0).await.0, 404);
    assert_eq!(post_blob(&relay, &id, "join", None, b"kp").await, 404);
    assert_eq!(post_blob(&relay, &id, "welcome", Some(&owner), b"w").await, 404);
    let r = relay.http.get(relay.url(&format!("/i/{id}"))).send().await.unwrap();
    assert_eq!(r.status(), 404);
    relay.relay.state().sweep_now().await.unwrap();
    // The id is free again once the expired invite is gone.
    assert_eq!(put_invite(&relay, &id, serde_json::json!({"ttl": 60, "owner": owner})).await, 201);
    assert_eq!(get_blob(&relay, &id, "join", 0).await.0, 204, "a fresh invite, no old join");
}

#[tokio::test]
async fn unknown_invites_are_404() {
    let relay = relay().await;
    let id = new_id(&mut OsRng);
    assert_eq!(get_blob(&relay, &id, "join", 0).await.0, 404);
    assert_eq!(get_blob(&relay, &id, "welcome", 0).await.0, 404);
    assert_eq!(post_blob(&relay, &id, "join", None, b"kp").await, 404);
    assert_eq!(post_blob(&relay, &id, "welcome", Some(&owner()), b"w").await, 404);
}

#[tokio::test]
async fn one_address_parking_reads_on_random_groups_cannot_starve_another() {
    let relay = relay_with(|c| {
        c.limits.letmeknow.long_poll_slots = 64;
        c.limits.letmeknow.long_poll_per_ip = 8;
    })
    .await;
    // 127.0.0.1 parks 200 reads of groups that do not exist: 8 are held, the rest are refused at
    // once with 429 and Retry-After (so a client backs off instead of asking again in a loop).
    let attacker = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let polls: Vec<_> = (0..200)
        .map(|_| {
            let url = relay.url(&format!("/g/{}/messages?after=0&wait=3", gid()));
            let attacker = attacker.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let r = attacker.get(url).send().await.unwrap();
                (started.elapsed(), r.status().as_u16(), r.headers().contains_key("retry-after"))
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // 127.0.0.2 (loopback too) parks on a real group and is woken by the next post.
    let g = gid();
    assert_eq!(post(&relay, &g, build(g.as_bytes(), 0, ContentType::Application, b"first")).await.status(), 200);
    let other = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let url = relay.url(&format!("/g/{g}/messages?after=1&wait=20"));
    let reader = tokio::spawn(async move {
        let started = Instant::now();
        let r = other.get(url).send().await.unwrap();
        (started.elapsed(), r.status().as_u16(), r.json::<Vec<RelayToClientLogEntry>>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(post(&relay, &g, build(g.as_bytes(), 0, ContentType::Application, b"second")).await.status(), 200);
    let (took, status, entries) = reader.await.unwrap();
    assert_eq!((status, entries.len()), (200, 1), "after {took:?}");
    assert!(took >= Duration::from_millis(250), "answered before the post: not parked ({took:?})");
    let (mut held, mut refused) = (0, 0);
    for poll in polls {
        match poll.await.unwrap() {
            (took, 200, _) if took >= Duration::from_secs(2) => held += 1,
            (took, 429, true) if took < Duration::from_secs(2) => refused += 1,
            other => panic!("unexpected answer to a parked read: {other:?}"),
        }
    }
    assert_eq!((held, refused), (8, 192));
}
