//! The relay this app hosts when the first-run screen says "host one on this machine": an
//! embedded relay-lite serving every relay API from the profile directory.
//!
//! - Data: `<profile>/relay-lite/` (SQLite and the self-signed certificate), so it lives and dies
//!   with the profile.
//! - Listening: every interface (`0.0.0.0`), port 8471 (another port when that one is taken at
//!   first run), so peers on the same network can reach it and so can this machine over loopback.
//! - TLS: relay-lite's self-signed certificate, kept in the data directory and reused across
//!   restarts. Clients refuse plain HTTP anywhere but loopback, so a LAN relay must speak TLS;
//!   with no web PKI name for a LAN address, peers pin the certificate by its SHA-256 (`switchboard
//!   init --relay URL --relay-cert-sha256 HEX`).
//! - URL: `https://<this machine's LAN address>:<port>`, chosen at first run and recorded in the
//!   profile and in the app settings; the app restarts the relay on the same port at every launch.
//! - Names: relay-lite checks logins and tokens against the names it is configured with, never
//!   a request's `Host`; the hosted relay is named by its recorded URL, its current LAN URL (when
//!   the address moved) and `https://127.0.0.1:<port>` / `https://localhost:<port>`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use relay_lite::{Config, RunningRelay, TlsMode};
use serde::{Deserialize, Serialize};

/// The port tried first.
pub const DEFAULT_PORT: u16 = 8471;

/// Why the hosted relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostedError {
    /// relay-lite refused to start (port taken, data directory, certificate).
    #[error("the hosted relay could not start on port {port}: {reason}")]
    Start {
        /// The port asked for.
        port: u16,
        /// relay-lite's error.
        reason: String,
    },
    /// relay-lite served no certificate (a bug: the hosted relay always serves TLS).
    #[error("the hosted relay is not serving TLS")]
    NoTls,
}

/// What is remembered about the hosted relay (in the app settings) to start it again.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostedRelayConfig {
    /// The port it listens on, on every interface.
    pub port: u16,
    /// The URL the profile and its peers use.
    pub url: String,
    /// Hex SHA-256 of its certificate (what peers pin).
    pub cert_sha256: String,
}

/// A running hosted relay.
pub struct HostedRelay {
    relay: RunningRelay,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Hex SHA-256 of the certificate it serves.
    pub cert_sha256: String,
}

impl std::fmt::Debug for HostedRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostedRelay").field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// The hosted relay's data directory inside a profile.
pub fn data_dir(profile_dir: &Path) -> PathBuf {
    profile_dir.join("relay-lite")
}

/// This machine's address on its network: the source address the OS picks for a route off the
/// machine (no packet is sent). Loopback when there is no such route.
pub fn lan_ip() -> IpAddr {
    let probe = || -> std::io::Result<IpAddr> {
        let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        // TEST-NET-1 (RFC 5737): connect() on UDP only picks a route.
        s.connect((Ipv4Addr::new(192, 0, 2, 1), 9))?;
        Ok(s.local_addr()?.ip())
    };
    match probe() {
        Ok(ip) if !ip.is_unspecified() => ip,
        _ => IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

/// `https://<ip>:<port>`.
fn https_url(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V6(ip) => format!("https://[{ip}]:{port}"),
        IpAddr::V4(ip) => format!("https://{ip}:{port}"),
    }
}

/// A port free on every interface right now (the OS picks it), for a relay whose public URL
/// must be known before it binds.
fn free_port() -> Result<u16, HostedError> {
    std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| HostedError::Start { port: 0, reason: e.to_string() })
}

impl HostedRelay {
    /// Starts relay-lite on every interface at `port` (0 picks one), with its self-signed
    /// certificate, data under the profile, named by `url` (the recorded one; the current LAN
    /// URL when `None`) and by loopback.
    pub async fn start(profile_dir: &Path, port: u16, url: Option<&str>) -> Result<Self, HostedError> {
        let port = if port == 0 { free_port()? } else { port };
        let listen = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        let mut config = Config::new(listen, data_dir(profile_dir));
        config.tls = TlsMode::SelfSigned;
        let current = https_url(lan_ip(), port);
        let mut names: Vec<String> = url.map(str::to_owned).into_iter().collect();
        for name in [current, https_url(Ipv4Addr::LOCALHOST.into(), port), format!("https://localhost:{port}")] {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        config.public_urls = names;
        // relay-lite's start-up future is not provably `Send` (sqlx's higher-ranked bounds), and
        // app commands must be: it runs to completion on a blocking thread of the same runtime,
        // where the relay's own tasks are spawned as usual.
        let rt = tokio::runtime::Handle::current();
        let started = tokio::task::spawn_blocking(move || rt.block_on(relay_lite::spawn(config)))
            .await
            .map_err(|e| HostedError::Start { port, reason: e.to_string() })?;
        let relay = started.map_err(|e| HostedError::Start { port, reason: format!("{e:#}") })?;
        let cert = relay.cert_sha256.ok_or(HostedError::NoTls)?;
        let addr = relay.addr;
        Ok(Self { relay, addr, cert_sha256: switchboard_core::util::hex(&cert) })
    }

    /// First run: the default port, or any free one when it is taken.
    pub async fn start_first(profile_dir: &Path, port: u16) -> Result<Self, HostedError> {
        match Self::start(profile_dir, port, None).await {
            Ok(r) => Ok(r),
            Err(e) if port != 0 => {
                tracing::info!("{e}; hosting on another port");
                Self::start(profile_dir, 0, None).await
            }
            Err(e) => Err(e),
        }
    }

    /// The URL peers on this network (and this profile) use.
    pub fn lan_url(&self) -> String {
        https_url(lan_ip(), self.addr.port())
    }

    /// What to remember to start it again.
    pub fn config(&self, url: String) -> HostedRelayConfig {
        HostedRelayConfig { port: self.addr.port(), url, cert_sha256: self.cert_sha256.clone() }
    }

    /// Whether it accepts connections on loopback right now.
    pub fn accepting(&self) -> bool {
        let local = SocketAddr::from((Ipv4Addr::LOCALHOST, self.addr.port()));
        TcpStream::connect_timeout(&local, Duration::from_secs(1)).is_ok()
    }

    /// Stops it and closes its store.
    pub async fn stop(self) {
        if let Err(e) = self.relay.shutdown().await {
            tracing::warn!("hosted relay: {e:#}");
        }
    }
}
