//! Live delivery over the letagents inbox websocket: backlog, `ready`, live mail, acks, pings.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::time::{Duration, Instant};

use common::{alice, decode, relay, small_envelope};
use futures_util::{SinkExt as _, StreamExt as _};
use switchboard_core::protocol::letagents::wire::{ClientToRelay, RelayToClient};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn open(url: &str) -> Socket {
    connect_async(url).await.unwrap().0
}

async fn next_frame(ws: &mut Socket) -> RelayToClient {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("no frame within 5 s")
            .expect("socket closed")
            .unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(text.as_str()).unwrap();
        }
    }
}

async fn send_frame(ws: &mut Socket, frame: &ClientToRelay) {
    ws.send(Message::text(serde_json::to_string(frame).unwrap())).await.unwrap();
}

fn msg(frame: RelayToClient) -> (i64, Vec<u8>) {
    match frame {
        RelayToClient::Msg { seq, ct } => (seq, decode(&ct)),
        other => panic!("expected a msg frame, got {other:?}"),
    }
}

#[tokio::test]
async fn websocket_sends_waiting_envelopes_then_ready_then_live_mail_promptly() {
    let relay = relay().await;
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("one")).await, 202);
    assert_eq!(relay.send(&alice, small_envelope("two")).await, 202);

    let mut ws = open(&relay.ws_url(&alice)).await;
    assert_eq!(msg(next_frame(&mut ws).await), (1, small_envelope("one")));
    assert_eq!(msg(next_frame(&mut ws).await), (2, small_envelope("two")));
    assert_eq!(next_frame(&mut ws).await, RelayToClient::Ready);

    let sent = Instant::now();
    assert_eq!(relay.send(&alice, small_envelope("live")).await, 202);
    assert_eq!(msg(next_frame(&mut ws).await), (3, small_envelope("live")));
    let took = sent.elapsed();
    assert!(took < Duration::from_millis(500), "live delivery took {took:?}");
}

#[tokio::test]
async fn websocket_ack_deletes_the_envelope() {
    let relay = relay().await;
    let alice = alice();
    relay.inbox(&alice).await;
    assert_eq!(relay.send(&alice, small_envelope("one")).await, 202);
    assert_eq!(relay.send(&alice, small_envelope("two")).await, 202);
    let mut ws = open(&relay.ws_url(&alice)).await;
    assert_eq!(msg(next_frame(&mut ws).await).0, 1);
    assert_eq!(msg(next_frame(&mut ws).await).0, 2);
    assert_eq!(next_frame(&mut ws).await, RelayToClient::Ready);
    send_frame(&mut ws, &ClientToRelay::Ack { seq: 1 }).await;
    // The session handles frames in order: the pong means the ack is committed.
    send_frame(&mut ws, &ClientToRelay::Ping).await;
    assert_eq!(next_frame(&mut ws).await, RelayToClient::Pong);
    let left: Vec<i64> = relay.inbox(&alice).await.msgs.iter().map(|m| m.seq).collect();
    assert_eq!(left, vec![2]);
}

#[tokio::test]
async fn websocket_ping_is_answered_with_pong() {
    let relay = relay().await;
    let alice = alice();
    let mut ws = open(&relay.ws_url(&alice)).await;
    assert_eq!(next_frame(&mut ws).await, RelayToClient::Ready);
    for _ in 0..3 {
        send_frame(&mut ws, &ClientToRelay::Ping).await;
        assert_eq!(next_frame(&mut ws).await, RelayToClient::Pong);
    }
}

#[tokio::test]
async fn websocket_login_is_checked_like_a_plain_login() {
    let relay = relay().await;
    let alice = alice();
    let url = relay.ws_url(&alice);
    let _first = open(&url).await;
    // The same login again is a replay.
    match connect_async(url.as_str()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 401);
        }
        other => panic!("replayed websocket login was not refused: {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn two_sessions_for_one_mailbox_both_get_live_mail() {
    let relay = relay().await;
    let alice = alice();
    let mut first = open(&relay.ws_url(&alice)).await;
    let mut second = open(&relay.ws_url(&alice)).await;
    assert_eq!(next_frame(&mut first).await, RelayToClient::Ready);
    assert_eq!(next_frame(&mut second).await, RelayToClient::Ready);
    assert_eq!(relay.send(&alice, small_envelope("both")).await, 202);
    assert_eq!(msg(next_frame(&mut first).await).0, 1);
    assert_eq!(msg(next_frame(&mut second).await).0, 1);
}

#[tokio::test]
async fn shutting_down_closes_websockets_with_going_away() {
    let common::TestRelay { relay: running, dir: _dir, api, .. } = relay().await;
    let alice = alice();
    let mut ws = open(&api.ws_url(&alice)).await;
    assert_eq!(next_frame(&mut ws).await, RelayToClient::Ready);
    let started = Instant::now();
    running.shutdown().await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(1500), "shutdown waited on the socket");
    let frame = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.unwrap();
    match frame {
        Some(Ok(Message::Close(Some(close)))) => assert_eq!(u16::from(close.code), 1001),
        other => panic!("expected a close frame, got {other:?}"),
    }
}

/// RSS of this process (the relay runs in it), from /proc.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_websocket_client_that_stops_reading_is_dropped_at_the_send_timeout_and_loses_nothing() {
    let relay = common::relay_with(|c| {
        c.limits.websocket_send_timeout_ms = 500;
        c.limits.sends_per_minute = 0;
    })
    .await;
    let alice = alice();
    relay.inbox(&alice).await;
    for i in 0..200 {
        assert_eq!(relay.send(&alice, common::envelope(&format!("{i:03}"), 32 * 1024)).await, 202);
    }
    let before = rss_kib();
    // Clients with a small receive buffer that read nothing after the handshake: 6.5 MB of
    // backlog each cannot fit in their sockets, so the relay's sends block.
    let mut stalled = Vec::new();
    for _ in 0..10 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let tcp = socket.connect(relay.addr).await.unwrap();
        stalled.push(tokio_tungstenite::client_async(relay.ws_url(&alice), tcp).await.unwrap().0);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = rss_kib();
    // Reading now drains what the kernel buffered, then finds the relay gone: it never got as
    // far as `ready`.
    for mut ws in stalled {
        let mut frames = 0;
        let ended = loop {
            match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
                Ok(None | Some(Err(_))) => break true,
                Ok(Some(Ok(Message::Close(_)))) => break true,
                Ok(Some(Ok(Message::Text(text)))) => {
                    frames += 1;
                    assert!(!text.as_str().contains("\"ready\""), "the relay sent the whole backlog");
                }
                Ok(Some(Ok(_))) => {}
                Err(_) => break false,
            }
        };
        assert!(ended, "the relay kept a client that did not read ({frames} frames buffered)");
        assert!(frames < 200, "{frames}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "RSS: {before} KiB before the stalled clients, {held} KiB while held, {} KiB after they were dropped",
        rss_kib()
    );
    // Nothing was lost: a reading client gets all 200, then ready.
    let mut ws = open(&relay.ws_url(&alice)).await;
    for i in 0..200 {
        let (_, body) = msg(next_frame(&mut ws).await);
        assert!(body.starts_with(format!("LA1{i:03}").as_bytes()));
    }
    assert_eq!(next_frame(&mut ws).await, RelayToClient::Ready);
}
