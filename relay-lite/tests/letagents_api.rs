//! The letagents v1 relay API over real HTTP against an in-process relay on a loopback port:
//! limits, logins, the identical 404, plain inbox and ack, and the relay's bookkeeping.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::time::Duration;

use common::{alice, bob, decode, envelope, relay, relay_with, small_envelope};
use ed25519_dalek::Signer as _;
use switchboard_core::protocol::letagents::relay_auth::{self, LOGIN_WINDOW_MS};
use switchboard_core::protocol::letagents::wire::ErrorBody;
use switchboard_core::util::{b64u, now_ms};

#[tokio::test]
async fn envelope_of_32768_bytes_is_accepted_and_32769_refused_with_413() {
    let relay = relay().await;
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, envelope("max", 32_768)).await, 202);
    let response = relay.send_raw(&alice.id, &alice.drop, envelope("over", 32_769)).await;
    assert_eq!(response.status(), 413);
    let body: ErrorBody = response.json().await.unwrap();
    assert_eq!(body.error, "too_large");
    let inbox = relay.inbox(&alice).await;
    assert_eq!(inbox.msgs.len(), 1);
    assert_eq!(decode(&inbox.msgs[0].ct).len(), 32_768);
}

#[tokio::test]
async fn two_hundredth_waiting_envelope_is_accepted_and_the_201st_refused_with_507() {
    let relay = relay_with(|c| c.limits.sends_per_minute = 1_000).await;
    let alice = alice();
    relay.inbox(&alice).await;
    for i in 1..=200 {
        assert_eq!(relay.send(&alice, small_envelope(&format!("{i}"))).await, 202, "send {i}");
    }
    let response = relay.send_raw(&alice.id, &alice.drop, small_envelope("201")).await;
    assert_eq!(response.status(), 507);
    assert_eq!(response.json::<ErrorBody>().await.unwrap().error, "mailbox_full");
    // Making room lets mail in again.
    assert_eq!(relay.ack(&alice, &[1]).await.acked, vec![1]);
    assert_eq!(relay.send(&alice, small_envelope("201 again")).await, 202);
}

#[tokio::test]
async fn sixty_first_send_in_a_minute_is_refused_with_429_and_retry_after() {
    let relay = relay().await;
    let (alice, bob) = (alice(), bob());
    relay.inbox(&alice).await;
    relay.inbox(&bob).await;
    for i in 1..=60 {
        assert_eq!(relay.send(&alice, small_envelope(&format!("{i}"))).await, 202, "send {i}");
    }
    let response = relay.send_raw(&alice.id, &alice.drop, small_envelope("61")).await;
    assert_eq!(response.status(), 429);
    let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(response.json::<ErrorBody>().await.unwrap().error, "rate_limited");
    // The limit is per mailbox.
    assert_eq!(relay.send(&bob, small_envelope("to bob")).await, 202);
}

#[tokio::test]
async fn per_ip_limit_refuses_with_429_and_retry_after() {
    let relay = relay_with(|c| c.limits.ip_requests_per_minute = 5).await;
    let alice = alice();
    relay.inbox(&alice).await;
    for i in 2..=5 {
        assert_eq!(relay.send(&alice, small_envelope(&format!("{i}"))).await, 202, "request {i}");
    }
    let response = relay.send_raw(&alice.id, &alice.drop, small_envelope("6")).await;
    assert_eq!(response.status(), 429);
    assert!(response.headers().contains_key("retry-after"));
    // Every endpoint counts, not only sends.
    let login = alice.login(&relay.host()).query();
    assert_eq!(relay.inbox_raw(&alice, &login).await.status(), 429);
}

#[tokio::test]
async fn login_outside_the_two_minute_window_is_refused() {
    let relay = relay().await;
    let alice = alice();
    let host = relay.host();
    let too_old = alice.login_at(&host, now_ms() - LOGIN_WINDOW_MS - 5_000);
    let response = relay.inbox_raw(&alice, &too_old.query()).await;
    assert_eq!(response.status(), 401);
    assert_eq!(response.json::<ErrorBody>().await.unwrap().error, "unauthorized");
    let too_new = alice.login_at(&host, now_ms() + LOGIN_WINDOW_MS + 5_000);
    assert_eq!(relay.inbox_raw(&alice, &too_new.query()).await.status(), 401);
    // Nothing was created: a sender still gets 404.
    assert_eq!(relay.send(&alice, small_envelope("x")).await, 404);
}

#[tokio::test]
async fn replayed_login_with_the_same_or_an_older_ts_is_refused() {
    let relay = relay().await;
    let alice = alice();
    let host = relay.host();
    let ts = now_ms();
    let login = alice.login_at(&host, ts);
    assert_eq!(relay.inbox_raw(&alice, &login.query()).await.status(), 200);
    assert_eq!(relay.inbox_raw(&alice, &login.query()).await.status(), 401, "same ts");
    let older = alice.login_at(&host, ts - 1);
    assert_eq!(relay.inbox_raw(&alice, &older.query()).await.status(), 401, "older ts");
    let newer = alice.login_at(&host, ts + 1);
    assert_eq!(relay.inbox_raw(&alice, &newer.query()).await.status(), 200);
}

#[tokio::test]
async fn login_with_a_bad_signature_is_refused() {
    let relay = relay().await;
    let (alice, bob) = (alice(), bob());
    // Alice's login string, signed by bob's key.
    let mut login = alice.login(&relay.host());
    let signed = relay_auth::inbox_message(&relay.host(), &alice.id, login.ts, &login.drop_hash);
    login.sig = b64u(&bob.key.sign(&signed).to_bytes());
    assert_eq!(relay.inbox_raw(&alice, &login.query()).await.status(), 401);
    // A garbled signature.
    let mut login = alice.login(&relay.host());
    login.sig = b64u(&[0u8; 64]);
    assert_eq!(relay.inbox_raw(&alice, &login.query()).await.status(), 401);
    assert_eq!(relay.send(&alice, small_envelope("x")).await, 404);
}

#[tokio::test]
async fn login_signed_for_another_relay_is_refused_whatever_the_host_header() {
    let relay = relay().await;
    let alice = alice();
    // Signed for another relay, presented to this one as addressed...
    let elsewhere = alice.login("relay.example");
    assert_eq!(relay.inbox_raw(&alice, &elsewhere.query()).await.status(), 401);
    // ...and with that relay's name in the Host header: the relay's name is its configuration,
    // not the request, so the replay is still refused (and nothing about the mailbox changes).
    let spoofed = relay
        .http
        .get(relay.url(&format!("/v1/inbox/{}?{}", alice.id, elsewhere.query())))
        .header("host", "relay.example")
        .send()
        .await
        .unwrap();
    assert_eq!(spoofed.status(), 401);
    assert_eq!(relay.send(&alice, small_envelope("x")).await, 404, "the spoofed login created the mailbox");
    // Signed for this relay's own name: valid whatever Host a proxy passes on.
    let here = alice.login(&relay.host());
    let response = relay
        .http
        .get(relay.url(&format!("/v1/inbox/{}?{}", alice.id, here.query())))
        .header("host", "relay.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // `localhost:PORT` names a loopback relay too.
    let local = alice.login(&format!("localhost:{}", relay.addr.port()));
    assert_eq!(relay.inbox_raw(&alice, &local.query()).await.status(), 200);
}

#[tokio::test]
async fn ack_signed_for_another_relay_is_refused_whatever_the_host_header() {
    let relay = relay().await;
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("keep me")).await, 202);
    let seq = relay.inbox(&alice).await.msgs[0].seq;
    let foreign = relay_auth::sign_ack(&alice.key, "relay.example", alice.next_ts(), &[seq]);
    let spoofed = relay
        .http
        .post(relay.url(&format!("/v1/ack/{}?{foreign}", alice.id)))
        .header("host", "relay.example")
        .send()
        .await
        .unwrap();
    assert_eq!(spoofed.status(), 401);
    assert_eq!(relay.inbox(&alice).await.msgs.len(), 1, "a foreign ack deleted mail");
}

#[tokio::test]
async fn a_relay_configured_with_a_public_url_verifies_logins_for_that_name() {
    let relay = relay_with(|c| c.public_urls = vec!["https://relay.example".into()]).await;
    let alice = alice();
    // Reached over loopback with no Host spoofing: the configured name is what counts.
    let named = alice.login("relay.example");
    assert_eq!(relay.inbox_raw(&alice, &named.query()).await.status(), 200);
    // Its listening address is not one of its names any more.
    let by_address = alice.login(&relay.host());
    assert_eq!(relay.inbox_raw(&alice, &by_address.query()).await.status(), 401);
}

#[tokio::test]
async fn wrong_drop_is_answered_exactly_like_an_unknown_mailbox() {
    let relay = relay().await;
    let (alice, stranger) = (alice(), bob());
    relay.inbox(&alice).await;
    let wrong_drop = relay.send_raw(&alice.id, &stranger.drop, small_envelope("x")).await;
    let unknown = relay.send_raw(&stranger.id, &stranger.drop, small_envelope("x")).await;
    assert_eq!(wrong_drop.status(), 404);
    assert_eq!(wrong_drop.status(), unknown.status());
    let header = |r: &reqwest::Response, name: &str| r.headers().get(name).cloned();
    assert_eq!(header(&wrong_drop, "content-type"), header(&unknown, "content-type"));
    assert_eq!(header(&wrong_drop, "content-length"), header(&unknown, "content-length"));
    let (a, b) = (wrong_drop.bytes().await.unwrap(), unknown.bytes().await.unwrap());
    assert_eq!(a, b);
    assert!(!a.is_empty());
}

#[tokio::test]
async fn a_later_login_rotates_the_drop() {
    let relay = relay().await;
    let mut alice = alice();
    relay.inbox(&alice).await;
    let old_drop = alice.drop;
    alice.drop = switchboard_core::util::random_array();
    relay.inbox(&alice).await;
    let with_old = relay.send_raw(&alice.id, &old_drop, small_envelope("old")).await;
    assert_eq!(with_old.status(), 404);
    assert_eq!(relay.send(&alice, small_envelope("new")).await, 202);
}

#[tokio::test]
async fn body_that_is_not_an_envelope_is_refused_with_400() {
    let relay = relay().await;
    let alice = alice();
    relay.inbox(&alice).await;
    let mut no_magic = small_envelope("x");
    no_magic[0] = b'X';
    assert_eq!(relay.send(&alice, no_magic).await, 400);
    let mut too_short = small_envelope("x");
    too_short.pop();
    assert_eq!(relay.send(&alice, too_short).await, 400);
    let no_drop =
        relay.http.post(relay.url(&format!("/v1/send/{}", alice.id))).body(small_envelope("x")).send().await.unwrap();
    assert_eq!(no_drop.status(), 400);
}

#[tokio::test]
async fn plain_inbox_returns_the_hundred_oldest_in_seq_order() {
    let relay = relay_with(|c| c.limits.sends_per_minute = 1_000).await;
    let alice = alice();
    relay.inbox(&alice).await;
    for i in 1..=120 {
        assert_eq!(relay.send(&alice, small_envelope(&format!("#{i}#"))).await, 202);
    }
    let inbox = relay.inbox(&alice).await;
    let seqs: Vec<i64> = inbox.msgs.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
    assert_eq!(decode(&inbox.msgs[41].ct), small_envelope("#42#"));
}

#[tokio::test]
async fn signed_ack_deletes_and_reports_only_seqs_that_existed() {
    let relay = relay().await;
    let alice = alice();
    relay.inbox(&alice).await;
    for i in 1..=3 {
        assert_eq!(relay.send(&alice, small_envelope(&format!("{i}"))).await, 202);
    }
    assert_eq!(relay.ack(&alice, &[1, 3, 99]).await.acked, vec![1, 3]);
    let left: Vec<i64> = relay.inbox(&alice).await.msgs.iter().map(|m| m.seq).collect();
    assert_eq!(left, vec![2]);
    assert_eq!(relay.ack(&alice, &[1, 2]).await.acked, vec![2]);
}

#[tokio::test]
async fn ack_with_a_bad_signature_or_another_host_is_refused() {
    let relay = relay().await;
    let (alice, bob) = (alice(), bob());
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("1")).await, 202);
    let by_bob = relay_auth::sign_ack(&bob.key, &relay.host(), now_ms(), &[1]);
    let other_host = relay_auth::sign_ack(&alice.key, "relay.example", now_ms(), &[1]);
    for query in [by_bob, other_host] {
        let response = relay.http.post(relay.url(&format!("/v1/ack/{}?{query}", alice.id))).send().await.unwrap();
        assert_eq!(response.status(), 401);
    }
    assert_eq!(relay.inbox(&alice).await.msgs.len(), 1);
}

#[tokio::test]
async fn seq_keeps_growing_after_acks_and_a_restart() {
    let relay = relay().await;
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("1")).await, 202);
    assert_eq!(relay.send(&alice, small_envelope("2")).await, 202);
    assert_eq!(relay.ack(&alice, &[1, 2]).await.acked, vec![1, 2]);
    let relay = relay.restart().await;
    assert_eq!(relay.send(&alice, small_envelope("3")).await, 202);
    let seqs: Vec<i64> = relay.inbox(&alice).await.msgs.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![3]);
}

#[tokio::test]
async fn retention_sweep_deletes_envelopes_past_retention() {
    let relay = relay_with(|c| {
        c.limits.retention_ms = 300;
        c.sweep_interval = Duration::from_millis(50);
    })
    .await;
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("old")).await, 202);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(relay.inbox(&alice).await.msgs.is_empty());
    // The mailbox itself stays: it is not idle.
    assert_eq!(relay.send(&alice, small_envelope("new")).await, 202);
}

#[tokio::test]
async fn idle_mailbox_with_nothing_waiting_is_erased() {
    let relay = relay_with(|c| {
        c.limits.idle_erase_ms = 300;
        c.sweep_interval = Duration::from_millis(50);
    })
    .await;
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("x")).await, 202);
    assert_eq!(relay.ack(&alice, &[1]).await.acked, vec![1]);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(relay.send(&alice, small_envelope("after")).await, 404);
    // Logging in again creates it afresh.
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("again")).await, 202);
}

#[tokio::test]
async fn idle_mailbox_with_mail_waiting_is_kept() {
    let relay = relay_with(|c| {
        c.limits.idle_erase_ms = 300;
        c.sweep_interval = Duration::from_millis(50);
    })
    .await;
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("waiting")).await, 202);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(relay.send(&alice, small_envelope("still there")).await, 202);
}

#[tokio::test]
async fn unknown_path_gets_a_json_404() {
    let relay = relay().await;
    let response = relay.http.get(relay.url("/v1/nothing")).send().await.unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(response.json::<ErrorBody>().await.unwrap().error, "not_found");
}

/// Reads from `tcp` until the relay closes it (EOF or reset), failing after `within`.
async fn closed_within(tcp: &mut tokio::net::TcpStream, within: Duration) -> Duration {
    use tokio::io::AsyncReadExt as _;
    let start = std::time::Instant::now();
    let mut buf = [0_u8; 1024];
    loop {
        match tokio::time::timeout(within.saturating_sub(start.elapsed()), tcp.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return start.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the relay kept the connection open past {within:?}"),
        }
    }
}

#[tokio::test]
async fn a_client_that_trickles_its_request_head_is_cut_off_at_the_header_timeout() {
    use tokio::io::AsyncWriteExt as _;
    let relay = relay_with(|c| c.limits.header_read_timeout_ms = 400).await;
    let addr = relay.addr;
    // Slowloris: a partial head, then one more header line now and then, never the blank line.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /v1/inbox/x HTTP/1.1\r\nHost: relay\r\n").await.unwrap();
    let trickle = async {
        for i in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow.write_all(format!("X-Slow-{i}: 1\r\n").as_bytes()).await.is_err() {
                return;
            }
        }
    };
    trickle.await;
    let took = closed_within(&mut slow, Duration::from_secs(3)).await;
    assert!(took < Duration::from_secs(3));
    // A keep-alive connection left idle is closed too, after answering its request.
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /nowhere HTTP/1.1\r\nHost: relay\r\n\r\n").await.unwrap();
    let idle_for = closed_within(&mut idle, Duration::from_secs(3)).await;
    assert!(idle_for >= Duration::from_millis(300), "closed after {idle_for:?}, before the timeout");
    // A connection that never sends a byte is closed at the same timeout.
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let silent_for = closed_within(&mut silent, Duration::from_secs(3)).await;
    assert!(silent_for >= Duration::from_millis(300), "closed after {silent_for:?}, before the timeout");
    // Whole requests in time are served as ever.
    let ok = common::http_client().get(relay.url("/nowhere")).send().await.unwrap();
    assert_eq!(ok.status(), 404);
}

#[tokio::test]
async fn a_client_that_trickles_its_request_body_is_cut_off_at_the_body_deadline() {
    use tokio::io::AsyncWriteExt as _;
    let relay = relay_with(|c| c.limits.request_body_timeout_ms = 800).await;
    let alice = alice();
    relay.inbox(&alice).await;
    // A whole head promising 30,000 bytes, then one byte every 100 ms: every read makes progress,
    // so only a deadline on the whole body (not a per-read timeout) ends it.
    let mut slow = tokio::net::TcpStream::connect(&relay.addr).await.unwrap();
    let head = format!(
        "POST /v1/send/{} HTTP/1.1\r\nHost: relay\r\nx-la-drop: {}\r\nContent-Length: 30000\r\n\r\n",
        alice.id,
        b64u(&alice.drop)
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    let trickle = async {
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow.write_all(b".").await.is_err() {
                return;
            }
        }
    };
    trickle.await;
    let took = started.elapsed() + closed_within(&mut slow, Duration::from_secs(3)).await;
    assert!(took < Duration::from_secs(5), "cut off after {took:?}");
    // Nothing of it was stored, and a whole send in time still works.
    assert!(relay.inbox(&alice).await.msgs.is_empty());
    assert_eq!(relay.send(&alice, small_envelope("in time")).await, 202);
}

#[tokio::test]
async fn connections_over_the_per_address_cap_are_closed_and_other_addresses_still_served() {
    use tokio::io::AsyncWriteExt as _;
    let relay = relay_with(|c| c.limits.max_connections_per_ip = 8).await;
    // 127.0.0.1 holds its 8 connections idle (each has sent a partial head)...
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut tcp = tokio::net::TcpStream::connect(&relay.addr).await.unwrap();
        tcp.write_all(b"GET /nowhere HTTP/1.1\r\n").await.unwrap();
        held.push(tcp);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // ...so its ninth is closed at once.
    let mut ninth = tokio::net::TcpStream::connect(&relay.addr).await.unwrap();
    let _ = ninth.write_all(b"GET /nowhere HTTP/1.1\r\nHost: relay\r\n\r\n").await;
    closed_within(&mut ninth, Duration::from_secs(2)).await;
    // Another address (127.0.0.2 is loopback too) is served as ever.
    let other =
        reqwest::Client::builder().local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap()).build().unwrap();
    assert_eq!(other.get(relay.url("/nowhere")).send().await.unwrap().status(), 404);
    // Closing one gives its slot back.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fresh = common::http_client().get(relay.url("/nowhere")).send().await.unwrap();
    assert_eq!(fresh.status(), 404);
}
