//! Authenticated requests never follow redirects (Agent Mail §8.1 MUST NOT): a relay-like server
//! on real HTTP answers every request with `307` to a second server, which must see nothing of
//! the owner JWT, the Stringcup bearer token or the letagents envelope.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use switchboard_core::protocol::agent_mail::Id16;
use switchboard_core::transport::agent_mail::MailClient;
use switchboard_core::transport::letagents::{RelayClient, SendOutcome};
use switchboard_core::transport::stringcup::StringcupClient;
use switchboard_core::util::OsRng;

/// Serves `app` on a loopback port; its base URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticated_requests_do_not_follow_a_307() {
    // Where a followed redirect would land: records every request and its credentials.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let elsewhere = serve(Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let log = log.clone();
        async move {
            let auth = headers.get(header::AUTHORIZATION).map(|v| v.to_str().unwrap_or("").to_owned());
            log.lock().unwrap().push(format!("{uri} {auth:?}"));
            StatusCode::OK
        }
    }))
    .await;
    // The "relay": every request is sent on, with a temporary redirect that keeps method and body.
    let target = elsewhere.clone();
    let relay = serve(Router::new().fallback(move |uri: Uri| {
        let to = format!("{target}{uri}");
        async move { (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, to)]) }
    }))
    .await;

    let rc = RelayClient::new(&relay, None).unwrap();
    let mail = MailClient::new(&relay, rc.http().clone());
    let mailbox = Id16::random(&mut OsRng);
    let listed = mail.list(&mailbox, "owner-jwt-secret", None, 10).await;
    assert!(listed.is_err(), "a 307 is not a mailbox page");
    let packet = switchboard_core::protocol::agent_identity::Hash32([7; 32]);
    assert!(mail.delete(&mailbox, &packet, "owner-jwt-secret").await.is_err());
    let sc = StringcupClient::new(&rc);
    assert!(sc.inbox("stringcup-token-secret", 0).await.is_err());
    let sent = rc.send("AAAAAAAAAAAAAAAAAAAAAA", &[1; 16], b"sealed envelope".to_vec()).await;
    assert!(!matches!(sent, SendOutcome::Accepted), "{sent:?}");

    // Nothing, credentials included, reached the other origin.
    let seen = seen.lock().unwrap().clone();
    assert!(seen.is_empty(), "followed a redirect: {seen:?}");
}
