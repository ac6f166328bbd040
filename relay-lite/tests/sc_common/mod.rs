//! Stringcup v2 test helpers: an in-process relay on a loopback port (`relay`, `relay_with`),
//! registered agents (`Agent`: id, token, key) and requests that answer a [`Reply`] with the
//! status, headers and JSON body. The relay is only ever reached over real HTTP.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::Path;
use std::time::Duration;

use data_encoding::BASE64;
use relay_lite::{Config, RunningRelay, StringcupLimits};
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use switchboard_core::util::random_array;

/// A relay running in this process, with its data directory and an HTTP client.
pub struct Relay {
    pub relay: RunningRelay,
    pub dir: tempfile::TempDir,
    pub config: Config,
    pub http: reqwest::Client,
}

/// A registered identity.
#[derive(Debug, Clone)]
pub struct Agent {
    pub id: String,
    pub token: String,
    pub public_key: Vec<u8>,
}

/// An answer: status, headers and the body as JSON (`Null` when empty or not JSON).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The error code of an error body.
    pub fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or_default()
    }

    /// The human message of an error body.
    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }
}

/// The seed's limits, except generous per-IP limits (every test client is 127.0.0.1).
pub async fn relay() -> Relay {
    relay_with(|_| {}).await
}

/// A relay whose Stringcup limits `adjust` may change.
pub async fn relay_with(adjust: impl FnOnce(&mut StringcupLimits)) -> Relay {
    relay_config(|c| adjust(&mut c.limits.stringcup)).await
}

/// A relay whose whole config `adjust` may change.
pub async fn relay_config(adjust: impl FnOnce(&mut Config)) -> Relay {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), dir.path());
    config.limits.ip_requests_per_minute = 1_000_000;
    config.limits.stringcup.registrations_per_hour_per_ip = 1_000_000;
    adjust(&mut config);
    let relay = relay_lite::spawn(config.clone()).await.unwrap();
    relay_lite::tls::install_default_provider();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    Relay { relay, dir, config, http }
}

/// Standard base64, as Stringcup writes binary values.
pub fn b64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// Decodes standard base64.
pub fn unb64(text: &str) -> Vec<u8> {
    BASE64.decode(text.as_bytes()).unwrap()
}

/// A message body for `to` with a fresh ephemeral key and IV and the given ciphertext.
pub fn message(to: &str, ciphertext: &[u8]) -> Value {
    json!({
        "recipient_id": to,
        "header": {
            "version": 2,
            "algo": "x25519+ecies+aes256gcm",
            "ephemeral_pub": b64(&random_array::<32>()),
            "iv": b64(&random_array::<12>()),
        },
        "ciphertext": b64(ciphertext),
    })
}

/// A ciphertext of `n` bytes (tag included) that reads as `text` where it fits.
pub fn ciphertext(text: &str, n: usize) -> Vec<u8> {
    let mut out = text.as_bytes().to_vec();
    out.resize(n.max(16), b'.');
    out
}

/// A short ciphertext.
pub fn ct(text: &str) -> Vec<u8> {
    ciphertext(text, text.len() + 16)
}

/// Every byte of every file in `dir` (the database, its WAL).
pub fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            out.extend(std::fs::read(path).unwrap());
        }
    }
    out
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl Relay {
    /// `http://addr/api/v2` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}/api/v2{path}", self.relay.url())
    }

    /// Sends `request` and collects the reply.
    pub async fn call(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply { status, headers, body }
    }

    /// An unauthenticated request.
    pub fn anon(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path))
    }

    /// A request with `who`'s bearer token.
    pub fn req(&self, who: &Agent, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.anon(method, path).bearer_auth(&who.token)
    }

    pub async fn get(&self, who: &Agent, path: &str) -> Reply {
        self.call(self.req(who, reqwest::Method::GET, path)).await
    }

    pub async fn post(&self, who: &Agent, path: &str, body: &Value) -> Reply {
        self.call(self.req(who, reqwest::Method::POST, path).json(body)).await
    }

    pub async fn put(&self, who: &Agent, path: &str, body: &Value) -> Reply {
        self.call(self.req(who, reqwest::Method::PUT, path).json(body)).await
    }

    pub async fn delete(&self, who: &Agent, path: &str) -> Reply {
        self.call(self.req(who, reqwest::Method::DELETE, path)).await
    }

    /// `POST /identities` with `body`.
    pub async fn register_raw(&self, body: &Value) -> Reply {
        self.call(self.anon(reqwest::Method::POST, "/identities").json(body)).await
    }

    /// Registers a fresh key labelled `name`.
    pub async fn register(&self, name: &str) -> Agent {
        let public_key = random_array::<32>().to_vec();
        let reply = self
            .register_raw(&json!({"identity_public_key": b64(&public_key), "algo": "x25519", "display_name": name}))
            .await;
        assert_eq!(reply.status, 201, "{:?}", reply.body);
        Agent {
            id: reply.body["id"].as_str().unwrap().to_owned(),
            token: reply.body["api_token"].as_str().unwrap().to_owned(),
            public_key,
        }
    }

    /// `POST /messages` from `from` to `to`, with an optional idempotency key.
    pub async fn send_with(&self, from: &Agent, body: &Value, key: Option<&str>) -> Reply {
        let mut request = self.req(from, reqwest::Method::POST, "/messages").json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        self.call(request).await
    }

    /// Sends `text` from `from` to `to`; asserts `201` and returns `sent_seq`.
    pub async fn send(&self, from: &Agent, to: &Agent, text: &str) -> i64 {
        let reply = self.send_with(from, &message(&to.id, &ct(text)), None).await;
        assert_eq!(reply.status, 201, "{:?}", reply.body);
        reply.body["sent_seq"].as_i64().unwrap()
    }

    /// `who`'s inbox page for `query` (e.g. `?limit=2`); asserts `200`.
    pub async fn inbox(&self, who: &Agent, query: &str) -> Value {
        let reply = self.get(who, &format!("/messages{query}")).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        reply.body
    }

    /// The ids in `who`'s inbox (first page of up to 200).
    pub async fn inbox_ids(&self, who: &Agent) -> Vec<i64> {
        let page = self.inbox(who, "?limit=200").await;
        page["messages"].as_array().unwrap().iter().map(|m| m["id"].as_i64().unwrap()).collect()
    }

    /// Acks `ids` for `who`; asserts `200`.
    pub async fn ack(&self, who: &Agent, ids: &[i64]) -> Value {
        let reply = self.post(who, "/messages/ack", &json!({ "ids": ids })).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        reply.body
    }

    /// Runs a sweep now (identity reclamation, key and rendezvous expiry).
    pub async fn sweep(&self) {
        self.relay.state().sweep_now().await.unwrap();
    }
}
