//! The letagents relay client: post envelopes, read and ack the inbox, and the live websocket.

use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use url::Url;

use super::{TransportError, status_error, unreachable};
use crate::protocol::letagents::relay_auth::{Login, sign_ack};
use crate::protocol::letagents::wire::{AckResponse, InboxResponse, WaitingMsg};
use crate::util::{b64u, now_ms};

/// A websocket to the relay, over TLS or (loopback only) plain TCP.
pub type RelaySocket = WebSocketStream<Box<dyn AsyncStream>>;

/// An async byte stream (TCP or TLS over TCP).
pub trait AsyncStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> AsyncStream for T {}

/// What a send attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// `202`: stored by the relay.
    Accepted,
    /// Try again after this many ms (429, 507, 5xx, unreachable).
    Retry {
        /// Suggested delay.
        after_ms: Option<i64>,
        /// Why.
        reason: String,
    },
    /// Will never succeed as is (413, 400): give up.
    Permanent(String),
}

/// A client for one letagents relay.
#[derive(Clone)]
pub struct RelayClient {
    base: Url,
    host: String,
    http: reqwest::Client,
    tls: Arc<rustls::ClientConfig>,
    /// The last login timestamp this client signed; held while a login is on its way (see
    /// [`RelayClient::login_turn`]).
    last_login: Arc<tokio::sync::Mutex<i64>>,
}

impl std::fmt::Debug for RelayClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RelayClient({})", self.base)
    }
}

/// Whether `url`'s host is a loopback address (where plain HTTP is acceptable).
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    }
}

/// Checks a relay URL: https, or http on loopback only.
pub fn parse_relay_url(text: &str) -> Result<Url, TransportError> {
    let url =
        Url::parse(text.trim_end_matches('/')).map_err(|e| TransportError::Config(format!("bad relay URL: {e}")))?;
    match url.scheme() {
        "https" => Ok(url),
        "http" if is_loopback(&url) => Ok(url),
        "http" => Err(TransportError::Config("plain http is only allowed for a loopback relay; use https".into())),
        other => Err(TransportError::Config(format!("unsupported relay URL scheme `{other}`"))),
    }
}

fn authority(url: &Url) -> String {
    let host = match url.host() {
        Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
        Some(h) => h.to_string(),
        None => String::new(),
    };
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host,
    }
}

impl RelayClient {
    /// A client for `base` (e.g. `https://relay.example`), pinning `cert_sha256` if given.
    pub fn new(base: &str, cert_sha256: Option<[u8; 32]>) -> Result<Self, TransportError> {
        let tls = super::tls::client_config(cert_sha256).map_err(|e| TransportError::Config(e.to_string()))?;
        Self::with_tls(base, tls)
    }

    /// A client for `base` with a given TLS configuration (e.g. one that remembers a refused
    /// certificate: [`super::tls::client_config_witnessed`]).
    pub fn with_tls(base: &str, tls: rustls::ClientConfig) -> Result<Self, TransportError> {
        let base = parse_relay_url(base)?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls.clone())
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            // Drop idle connections before a relay does (relay-lite closes them after 30 s), so
            // a request is never written onto a connection the relay is closing.
            .pool_idle_timeout(Duration::from_secs(20))
            // Every protocol's authenticated requests (owner JWTs, bearer tokens, signed logins)
            // go through this client; a redirect would carry them to another origin (Agent Mail
            // §8.1: MUST NOT follow redirects for authenticated requests). A 3xx is an answer.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| TransportError::Config(e.to_string()))?;
        let host = authority(&base);
        Ok(Self { base, host, http, tls: Arc::new(tls), last_login: Arc::new(tokio::sync::Mutex::new(0)) })
    }

    /// Whether anything answers at the relay's URL: the host resolves, the port accepts, TLS
    /// completes (with the pinned certificate). Any HTTP status counts as an answer; the error
    /// says what failed.
    pub async fn probe(&self) -> Result<(), TransportError> {
        match self.http.get(self.endpoint("/")).timeout(Duration::from_secs(10)).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let mut why = Vec::new();
                let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(&e);
                while let Some(c) = cause {
                    why.push(c.to_string());
                    cause = c.source();
                }
                // The innermost cause is the one a person can act on (refused, no such host,
                // certificate not the pinned one).
                let what =
                    if e.is_timeout() { "no answer within 10 s".to_owned() } else { why.pop().unwrap_or_default() };
                Err(TransportError::Unreachable(if what.is_empty() { e.to_string() } else { what }))
            }
        }
    }

    /// The TLS configuration this client was built with (the relay's pin, if any).
    pub fn tls_config(&self) -> rustls::ClientConfig {
        (*self.tls).clone()
    }

    /// The relay's base URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// The HTTP client (TLS configured, pinned if asked), shared by other protocols on the same
    /// relay.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    fn endpoint(&self, path: &str) -> String {
        format!("{}{}", self.base.as_str().trim_end_matches('/'), path)
    }

    /// This client's turn to log in, with a timestamp strictly newer than its last login. The
    /// relay refuses a login not newer than the last one it accepted, so two logins signed
    /// concurrently (an inbox read while the websocket reconnects) must reach it in the order
    /// they were signed: the caller holds the turn until the relay has answered the login.
    async fn login_turn(&self) -> (tokio::sync::MutexGuard<'_, i64>, i64) {
        let mut last = self.last_login.lock().await;
        // Several logins in one millisecond (or a clock stepped back) step past the last one.
        let ts = now_ms().max(*last + 1);
        *last = ts;
        (last, ts)
    }

    /// `POST /v1/send/<id>`.
    pub async fn send(&self, target: &str, drop: &[u8], envelope: Vec<u8>) -> SendOutcome {
        let resp = self
            .http
            .post(self.endpoint(&format!("/v1/send/{target}")))
            .header("x-la-drop", b64u(drop))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(envelope)
            .send()
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                return SendOutcome::Retry { after_ms: None, reason: format!("unreachable: {e}") };
            }
        };
        let status = resp.status().as_u16();
        match status {
            202 => SendOutcome::Accepted,
            // 404: the mailbox does not exist yet (its owner never logged in) or the drop is
            // wrong; the owner may still come online, so keep trying within the retention window.
            404 | 429 | 507 | 500..=599 => match status_error(resp).await {
                TransportError::Status { status, body, retry_after, .. } => SendOutcome::Retry {
                    after_ms: retry_after.map(|s| i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)),
                    reason: format!("relay answered {status}: {body}"),
                },
                other => SendOutcome::Retry { after_ms: None, reason: other.to_string() },
            },
            _ => SendOutcome::Permanent(status_error(resp).await.to_string()),
        }
    }

    /// `GET /v1/inbox/<id>` without upgrade: up to 100 waiting envelopes.
    pub async fn inbox(&self, key: &SigningKey, drop: &[u8; 16]) -> Result<Vec<WaitingMsg>, TransportError> {
        let id = b64u(key.verifying_key().as_bytes());
        let (turn, ts) = self.login_turn().await;
        let login = Login::sign(key, &self.host, ts, drop);
        let resp = self
            .http
            .get(self.endpoint(&format!("/v1/inbox/{id}?{}", login.query())))
            .send()
            .await
            .map_err(unreachable)?;
        std::mem::drop(turn);
        if !resp.status().is_success() {
            return Err(status_error(resp).await);
        }
        let body: InboxResponse = resp.json().await.map_err(|e| TransportError::Malformed(e.to_string()))?;
        Ok(body.msgs)
    }

    /// `POST /v1/ack/<id>`.
    pub async fn ack(&self, key: &SigningKey, seqs: &[i64]) -> Result<Vec<i64>, TransportError> {
        let id = b64u(key.verifying_key().as_bytes());
        let query = sign_ack(key, &self.host, now_ms(), seqs);
        let resp = self.http.post(self.endpoint(&format!("/v1/ack/{id}?{query}"))).send().await.map_err(unreachable)?;
        if !resp.status().is_success() {
            return Err(status_error(resp).await);
        }
        let body: AckResponse = resp.json().await.map_err(|e| TransportError::Malformed(e.to_string()))?;
        Ok(body.acked)
    }

    /// Opens the inbox websocket.
    pub async fn connect(&self, key: &SigningKey, drop: &[u8; 16]) -> Result<RelaySocket, TransportError> {
        let id = b64u(key.verifying_key().as_bytes());
        let host = self.base.host_str().ok_or_else(|| TransportError::Config("relay URL has no host".into()))?;
        let port = self.base.port_or_known_default().unwrap_or(443);
        let tcp =
            tokio::time::timeout(Duration::from_secs(10), TcpStream::connect((host.trim_matches(['[', ']']), port)))
                .await
                .map_err(|_| TransportError::Unreachable("connect timed out".into()))?
                .map_err(unreachable)?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn AsyncStream> = if self.base.scheme() == "https" {
            let name = rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
                .map_err(|e| TransportError::Config(e.to_string()))?;
            let tls =
                tokio_rustls::TlsConnector::from(self.tls.clone()).connect(name, tcp).await.map_err(unreachable)?;
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        // The login is signed once the connection stands, and its turn held only through the
        // handshake (bounded), which is where the relay accepts or refuses it.
        let (turn, ts) = self.login_turn().await;
        let login = Login::sign(key, &self.host, ts, drop);
        let mut ws_url = self.base.clone();
        let scheme = if self.base.scheme() == "https" { "wss" } else { "ws" };
        ws_url.set_scheme(scheme).map_err(|()| TransportError::Config("cannot build websocket URL".into()))?;
        let ws_url = format!("{}/v1/inbox/{id}?{}", ws_url.as_str().trim_end_matches('/'), login.query());

        let handshake = tokio::time::timeout(Duration::from_secs(30), tokio_tungstenite::client_async(ws_url, stream))
            .await
            .map_err(|_| TransportError::Unreachable("websocket handshake timed out".into()))?;
        std::mem::drop(turn);
        let (ws, _resp) = handshake.map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(resp) => TransportError::Status {
                status: resp.status().as_u16(),
                code: String::new(),
                body: String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned(),
                retry_after: None,
            },
            other => unreachable(other),
        })?;
        Ok(ws)
    }
}
