//! Arbitrary requests against relay-lite's real router (letagents routes, real SQLite store):
//! no input may panic the relay or get anything but a well-formed answer.
#![no_main]

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

struct Relay {
    rt: tokio::runtime::Runtime,
    router: axum::Router,
    _dir: tempfile::TempDir,
}

fn relay() -> &'static Relay {
    static RELAY: OnceLock<Relay> = OnceLock::new();
    RELAY.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut config = relay_lite::Config::new("127.0.0.1:0".parse().unwrap(), dir.path());
        config.limits.ip_requests_per_minute = 0;
        config.limits.sends_per_minute = 0;
        let (router, _state) = rt.block_on(relay_lite::app(&config)).unwrap();
        Relay { rt, router, _dir: dir }
    })
}

fuzz_target!(|data: &[u8]| {
    // Layout: selector byte, then fields separated by 0xff: id, query, drop header, host, body.
    let Some((&sel, rest)) = data.split_first() else { return };
    let mut parts = rest.splitn(5, |b| *b == 0xff);
    let mut field = || String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let (id, query, drop, host) = (field(), field(), field(), field());
    let body = parts.next().unwrap_or_default().to_vec();
    let (method, path) = match sel % 4 {
        0 => ("POST", format!("/v1/send/{id}")),
        1 => ("GET", format!("/v1/inbox/{id}")),
        2 => ("POST", format!("/v1/ack/{id}")),
        _ => ("GET", format!("/{id}")),
    };
    let uri = if query.is_empty() { path } else { format!("{path}?{query}") };
    let Ok(req) = Request::builder()
        .method(method)
        .uri(uri)
        .header("x-la-drop", drop)
        .header("host", host)
        .extension(axum::extract::ConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 9))))
        .body(Body::from(body))
    else {
        return;
    };
    let r = relay();
    let resp = r.rt.block_on(r.router.clone().oneshot(req)).unwrap();
    assert!(!resp.status().is_server_error(), "server error {} for a client's bad input", resp.status());
});
