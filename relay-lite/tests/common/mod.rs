//! Test helpers: an in-process relay on a loopback port, mailbox owners (`alice`, `bob`) who sign
//! logins and acks with core's `relay_auth`, and envelope bodies.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::net::SocketAddr;
use std::ops::Deref;
use std::process::Stdio;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use relay_lite::{Config, RunningRelay};
use switchboard_core::protocol::letagents::MIN_ENVELOPE;
use switchboard_core::protocol::letagents::relay_auth::{self, Login};
use switchboard_core::protocol::letagents::wire::{AckResponse, InboxResponse};
use switchboard_core::util::{b64u, b64u_decode, now_ms, random_array};

/// HTTP access to one relay at `addr`.
pub struct Api {
    pub http: reqwest::Client,
    pub addr: SocketAddr,
    pub scheme: &'static str,
}

/// A relay running in this process, with its data directory and an HTTP client.
pub struct TestRelay {
    pub relay: RunningRelay,
    pub dir: tempfile::TempDir,
    pub config: Config,
    pub api: Api,
}

impl Deref for TestRelay {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

pub fn http_client() -> reqwest::Client {
    relay_lite::tls::install_default_provider();
    reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap()
}

/// The seed's limits, except a generous per-IP limit (every test client is 127.0.0.1).
pub async fn relay() -> TestRelay {
    relay_with(|_| {}).await
}

/// A relay whose config `adjust` may change (limits, sweep interval).
pub async fn relay_with(adjust: impl FnOnce(&mut Config)) -> TestRelay {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir.path());
    config.limits.ip_requests_per_minute = 1_000_000;
    adjust(&mut config);
    let relay = relay_lite::spawn(config.clone()).await.unwrap();
    let api = Api { http: http_client(), addr: relay.addr, scheme: "http" };
    TestRelay { relay, dir, config, api }
}

impl TestRelay {
    /// Stops the relay and starts a new one on the same data directory (new port).
    pub async fn restart(self) -> Self {
        let TestRelay { relay, dir, mut config, mut api } = self;
        relay.shutdown().await.unwrap();
        config.listen = "127.0.0.1:0".parse().unwrap();
        let relay = relay_lite::spawn(config.clone()).await.unwrap();
        api.addr = relay.addr;
        TestRelay { relay, dir, config, api }
    }
}

impl Api {
    /// What a client signs as `host`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{}", self.scheme, self.addr, path)
    }

    /// `POST /v1/send/{id}` with a drop.
    pub async fn try_send_raw(&self, id: &str, drop: &[u8; 16], body: Vec<u8>) -> reqwest::Result<reqwest::Response> {
        self.http
            .post(self.url(&format!("/v1/send/{id}")))
            .header("x-la-drop", b64u(drop))
            .header("content-type", "application/octet-stream")
            .body(body)
            .send()
            .await
    }

    /// `POST /v1/send/{id}` with a drop.
    pub async fn send_raw(&self, id: &str, drop: &[u8; 16], body: Vec<u8>) -> reqwest::Response {
        self.try_send_raw(id, drop, body).await.unwrap()
    }

    /// Sends `body` to `owner`'s mailbox with the right drop; returns the status.
    pub async fn send(&self, owner: &Owner, body: Vec<u8>) -> reqwest::StatusCode {
        self.send_raw(&owner.id, &owner.drop, body).await.status()
    }

    /// A plain inbox read with the given login query.
    pub async fn inbox_raw(&self, owner: &Owner, query: &str) -> reqwest::Response {
        self.http.get(self.url(&format!("/v1/inbox/{}?{query}", owner.id))).send().await.unwrap()
    }

    /// Logs `owner` in (creating the mailbox) and returns the waiting envelopes.
    pub async fn inbox(&self, owner: &Owner) -> InboxResponse {
        let response = self.inbox_raw(owner, &owner.login(&self.host()).query()).await;
        assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
        response.json().await.unwrap()
    }

    /// A signed `POST /v1/ack`; returns the acked seqs.
    pub async fn ack(&self, owner: &Owner, seqs: &[i64]) -> AckResponse {
        let query = relay_auth::sign_ack(&owner.key, &self.host(), owner.next_ts(), seqs);
        let response = self.http.post(self.url(&format!("/v1/ack/{}?{query}", owner.id))).send().await.unwrap();
        assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
        response.json().await.unwrap()
    }

    /// `ws://` URL of `owner`'s inbox with a fresh login.
    pub fn ws_url(&self, owner: &Owner) -> String {
        let query = owner.login(&self.host()).query();
        format!("ws://{}/v1/inbox/{}?{query}", self.addr, owner.id)
    }
}

/// The `relay-lite` binary, started as a child process.
pub struct BinRelay {
    pub child: tokio::process::Child,
    /// Lines printed before the listening line.
    pub preamble: Vec<String>,
    pub api: Api,
    _stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Deref for BinRelay {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

/// Starts the binary with `args` and waits for `relay-lite listening on ...`.
pub async fn start_binary(args: &[&str], http: reqwest::Client) -> BinRelay {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_relay-lite"))
        .args(args)
        .env("RUST_LOG", std::env::var("RELAY_LITE_TEST_LOG").unwrap_or("relay_lite=warn".into()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut preamble = Vec::new();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = lines.next_line().await.unwrap().expect("relay-lite exited before listening");
            match line.strip_prefix("relay-lite listening on ") {
                Some(url) => return url.to_owned(),
                None => preamble.push(line),
            }
        }
    })
    .await
    .expect("relay-lite did not print its address");
    let (scheme, addr) = url.split_once("://").unwrap();
    let scheme = if scheme == "https" { "https" } else { "http" };
    let api = Api { http, addr: addr.parse().unwrap(), scheme };
    BinRelay { child, preamble, api, _stdout: lines }
}

/// A mailbox owner: signing key, drop and mailbox id.
pub struct Owner {
    pub key: SigningKey,
    pub drop: [u8; 16],
    pub id: String,
    last_ts: AtomicI64,
}

impl Owner {
    pub fn new() -> Self {
        let key = SigningKey::from_bytes(&random_array::<32>());
        let id = b64u(key.verifying_key().as_bytes());
        Self { key, drop: random_array(), id, last_ts: AtomicI64::new(0) }
    }

    /// A timestamp newer than any this owner used, close to now.
    pub fn next_ts(&self) -> i64 {
        let mut current = self.last_ts.load(Ordering::SeqCst);
        loop {
            let next = now_ms().max(current + 1);
            match self.last_ts.compare_exchange(current, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return next,
                Err(actual) => current = actual,
            }
        }
    }

    /// A fresh login signed for `host`.
    pub fn login(&self, host: &str) -> Login {
        Login::sign(&self.key, host, self.next_ts(), &self.drop)
    }

    /// A login with a chosen timestamp.
    pub fn login_at(&self, host: &str, ts: i64) -> Login {
        Login::sign(&self.key, host, ts, &self.drop)
    }
}

pub fn alice() -> Owner {
    Owner::new()
}

pub fn bob() -> Owner {
    Owner::new()
}

/// An envelope-shaped body of `len` bytes: `LA1`, then `tag`, then filler.
pub fn envelope(tag: &str, len: usize) -> Vec<u8> {
    let mut body = b"LA1".to_vec();
    body.extend_from_slice(tag.as_bytes());
    body.resize(len.max(MIN_ENVELOPE), b'.');
    body.truncate(len.max(MIN_ENVELOPE));
    body
}

/// The smallest envelope, tagged.
pub fn small_envelope(tag: &str) -> Vec<u8> {
    envelope(tag, MIN_ENVELOPE)
}

pub fn decode(ct: &str) -> Vec<u8> {
    b64u_decode(ct).unwrap()
}
