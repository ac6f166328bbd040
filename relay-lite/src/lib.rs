//! relay-lite: one small binary that serves Switchboard's relay APIs (letagents v1 and Stringcup
//! v2 today) over HTTPS, storing envelopes durably in SQLite.
//!
//! - [`Config`] says where to listen, where the data lives, which TLS to use and the [`Limits`];
//! - [`app`] opens the store and builds the axum [`Router`] (used in-process by tests and
//!   embedders that bring their own server);
//! - [`spawn`] binds a socket (port 0 works) and serves in the background, returning a
//!   [`RunningRelay`] with the bound address;
//! - [`serve`] is what the binary does: spawn, print the listening line, run until a signal.
//!
//! Layout: `asnet/` is the ASNET/1 email service (its own SMTP listener and database);
//! `routes/` holds one file per protocol, all sharing [`AppState`]; `store/` owns SQLite
//! (one group-committing writer task, a pool of readers); `limits` holds the rate limiters;
//! `hub` wakes websocket sessions and long-polls when mail commits; `error` maps every failure to
//! a status code.

pub mod asnet;
pub mod conn;
pub mod error;
pub mod hub;
pub mod limits;
pub mod origin;
pub mod parking;
pub mod routes;
pub mod store;
pub mod tls;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use serde::{Deserialize, Serialize};
use switchboard_core::protocol::letagents::MAX_ENVELOPE;
use switchboard_core::protocol::letagents::relay_auth::LOGIN_WINDOW_MS;
use tokio::task::JoinHandle;

pub use error::Error;
use hub::Hub;
use limits::{IpLimiter, SlidingWindow};
pub use origin::{PublicOrigins, PublicUrlError};
pub use store::Family;
use store::Store;

/// The limits a relay enforces; `Default` is the letagents v1 seed's values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Largest accepted envelope in bytes (bigger bodies get `413`).
    pub max_envelope: usize,
    /// Envelopes that may wait in one mailbox (the next one gets `507`).
    pub mailbox_capacity: usize,
    /// Envelopes older than this are deleted (ms).
    pub retention_ms: i64,
    /// Accepted sends per mailbox in any sliding 60-second window; 0 means no limit.
    pub sends_per_minute: u32,
    /// Requests per client IP (IPv6: per /64) per minute, any endpoint; 0 means no limit.
    pub ip_requests_per_minute: u32,
    /// A mailbox whose owner has not logged in or acked for this long, with nothing waiting, is
    /// erased entirely (ms).
    pub idle_erase_ms: i64,
    /// Login and ack timestamps must be within this distance of the relay's clock (ms).
    pub login_window_ms: i64,
    /// The Stringcup v2 API's limits.
    pub stringcup: StringcupLimits,
    /// The letmeknow group and invite API's limits.
    pub letmeknow: limits::LetmeknowLimits,
    /// The Agent Mail relay's per-mailbox storage quota.
    pub agent_mail: limits::AgentMailLimits,
    /// An HTTP/1 connection that has not sent a whole request head this long after it became
    /// ready for one (new, or idle between keep-alive requests) is closed (ms); this is what
    /// stops a client that trickles headers from holding a socket forever. Clients should drop
    /// idle pooled connections sooner (Switchboard's do, at 20 s).
    pub header_read_timeout_ms: u64,
    /// A request's body must arrive whole within this long of its head (ms), whatever its
    /// pace: a client trickling a body is cut off here.
    pub request_body_timeout_ms: u64,
    /// Connections one client address (IPv4, or IPv6 /64) may hold open at once; the next is
    /// closed on accept. 0 means no limit.
    pub max_connections_per_ip: usize,
    /// A websocket client that has not taken a frame within this long is dropped (ms): it has
    /// stopped reading, and it reconnects and catches up from the backlog.
    pub websocket_send_timeout_ms: u64,
    /// Request-body bytes the relay receives at once, across all requests: each request with a
    /// body reserves its `Content-Length` (a chunked one the largest body any route takes)
    /// before it is read, and a request that does not fit gets `503` with `Retry-After`.
    pub body_bytes_in_flight: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_envelope: MAX_ENVELOPE,
            mailbox_capacity: 200,
            retention_ms: 48 * 3600 * 1000,
            sends_per_minute: 60,
            ip_requests_per_minute: 600,
            idle_erase_ms: 14 * 24 * 3600 * 1000,
            login_window_ms: LOGIN_WINDOW_MS,
            stringcup: StringcupLimits::default(),
            letmeknow: limits::LetmeknowLimits::default(),
            agent_mail: limits::AgentMailLimits::default(),
            header_read_timeout_ms: 30_000,
            request_body_timeout_ms: 60_000,
            max_connections_per_ip: 256,
            websocket_send_timeout_ms: 10_000,
            body_bytes_in_flight: 256 * 1024 * 1024,
        }
    }
}

/// The limits of the Stringcup v2 API (`/api/v2`); `Default` is the Stringcup seed's values
/// where it gives one (B.2.7, B.3, B.3.6, B.5, B.6.1) and relay-lite's documented choices
/// elsewhere. Rates are per identity and per sliding hour; 0 means no limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StringcupLimits {
    /// Largest ciphertext in bytes, after base64 decoding (bigger gets `413`).
    pub message_max_bytes: usize,
    /// Messages that may wait in one inbox across all senders (the next send gets `507`).
    pub inbox_max_pending_messages: u64,
    /// Ciphertext bytes that may wait in one inbox across all senders.
    pub inbox_max_pending_bytes: u64,
    /// Messages from one sender that may wait in one inbox.
    pub inbox_max_pending_per_sender: u64,
    /// Ciphertext bytes from one sender that may wait in one inbox.
    pub inbox_max_pending_bytes_per_sender: u64,
    /// Largest request body of `POST /api/v2/messages/batch` in bytes.
    pub batch_max_body_bytes: usize,
    /// Send requests (`/messages` and `/messages/batch`, a batch counting once) per hour.
    pub sends_per_hour: u32,
    /// Inbox requests (reads, long-polls, acks, deletes) per hour.
    pub inbox_requests_per_hour: u32,
    /// Every other authenticated request (identity update, tokens, topics, rendezvous) per
    /// hour.
    pub other_requests_per_hour: u32,
    /// Registrations per client IP (IPv6: per /64) per hour.
    pub registrations_per_hour_per_ip: u32,
    /// Longest `wait` in seconds; larger requests are clamped to it.
    pub long_poll_max_secs: u64,
    /// Requests that may be parked in a long-poll at once; beyond it `wait` answers at once with
    /// `X-Long-Poll: unavailable`.
    pub long_poll_slots: usize,
    /// Of those, how many one identity may hold (its inbox and rendezvous waits together); 0
    /// means no per-identity share.
    pub long_poll_per_identity: usize,
    /// A token unused for this long stops working and its identity is reclaimed (ms).
    pub token_inactivity_ms: i64,
    /// How long an `Idempotency-Key` is remembered (ms).
    pub idempotency_ttl_ms: i64,
    /// How long a rendezvous token lives after it is issued (ms).
    pub rendezvous_ttl_ms: i64,
    /// Most members of one topic, owner included.
    pub topic_max_members: usize,
    /// Most ids in one `POST /topics/{topic}/members`.
    pub topic_max_add: usize,
    /// Public statistics below this count are published as `null`.
    pub stats_min_count: u64,
    /// Public statistics are recomputed at most this often (ms), so they cannot time events.
    pub stats_refresh_ms: i64,
}

impl Default for StringcupLimits {
    fn default() -> Self {
        const KIB: u64 = 1024;
        let message_max_bytes = 256 * 1024;
        Self {
            message_max_bytes,
            inbox_max_pending_messages: 2000,
            inbox_max_pending_bytes: 64 * KIB * KIB,
            inbox_max_pending_per_sender: 200,
            inbox_max_pending_bytes_per_sender: 16 * KIB * KIB,
            // 200 entries of the largest ciphertext in base64, with room for the JSON around it.
            batch_max_body_bytes: 200 * (message_max_bytes.div_ceil(3) * 4 + 1024) + 4096,
            sends_per_hour: 100,
            inbox_requests_per_hour: 300,
            other_requests_per_hour: 600,
            registrations_per_hour_per_ip: 60,
            long_poll_max_secs: 25,
            long_poll_slots: 1024,
            long_poll_per_identity: 16,
            token_inactivity_ms: 30 * 24 * 3600 * 1000,
            idempotency_ttl_ms: 24 * 3600 * 1000,
            rendezvous_ttl_ms: 15 * 60 * 1000,
            topic_max_members: 200,
            topic_max_add: 100,
            stats_min_count: 10,
            stats_refresh_ms: 3600 * 1000,
        }
    }
}

/// How the relay speaks TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain HTTP; only allowed on a loopback address.
    Plain,
    /// A certificate chain and private key from PEM files.
    Files {
        /// PEM certificate chain, leaf first.
        cert: PathBuf,
        /// PEM private key (PKCS#8, PKCS#1 or SEC1).
        key: PathBuf,
    },
    /// A self-signed certificate generated once and kept in the data directory; peers pin its
    /// SHA-256 fingerprint.
    SelfSigned,
}

/// Everything a relay needs to start; build it with [`Config::new`] and adjust the fields.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to bind; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Directory holding the database (and a self-signed certificate, if any).
    pub data_dir: PathBuf,
    /// TLS choice.
    pub tls: TlsMode,
    /// Enforced limits.
    pub limits: Limits,
    /// How often the sweeper deletes expired envelopes and erases idle mailboxes.
    pub sweep_interval: Duration,
    /// This relay's public URLs (`https://relay.example`), the first the primary: what clients
    /// sign as `host` and name as `aud`. Empty: derived from `listen` (see [`origin`]); a
    /// relay on an unspecified address must be given them.
    pub public_urls: Vec<String>,
    /// Test hook: when set, the Agent Mail routes read the time (Unix ms) from here instead of
    /// the system clock, so fixed-time conformance vectors can be replayed over HTTP.
    pub agent_mail_clock: Option<Arc<std::sync::atomic::AtomicI64>>,
    /// The ASNET/1 email service (SMTP in, SMTP out), when enabled.
    pub asnet: Option<asnet::AsnetConfig>,
    /// A PostgreSQL URL (`postgres://…`): store there instead of SQLite in `data_dir`, so several
    /// instances can serve one database (every family).
    pub database: Option<String>,
    /// The API families to serve; empty means every family.
    pub families: Vec<Family>,
}

impl Config {
    /// A plain-HTTP config with the seed's limits, for `listen` (must be loopback) and `data_dir`.
    pub fn new(listen: SocketAddr, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            listen,
            data_dir: data_dir.into(),
            tls: TlsMode::Plain,
            limits: Limits::default(),
            sweep_interval: Duration::from_secs(60),
            public_urls: Vec::new(),
            agent_mail_clock: None,
            asnet: None,
            database: None,
            families: Vec::new(),
        }
    }

    /// The families this config serves: those named, or every one. Both backends serve every
    /// family ([`Family::ON_POSTGRES`] is all of them), so any choice works on either.
    pub fn served_families(&self) -> anyhow::Result<Vec<Family>> {
        let mut families = if self.families.is_empty() { Family::ALL.to_vec() } else { self.families.clone() };
        families.sort_unstable();
        families.dedup();
        Ok(families)
    }
}

/// State shared by every route: the store, the wake-up hub, limits and rate limiters.
#[derive(Clone)]
pub struct AppState {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("limits", &self.shared.limits).finish_non_exhaustive()
    }
}

pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) hub: Arc<Hub>,
    pub(crate) limits: Limits,
    /// This relay's own names ([`Config::public_urls`]).
    pub(crate) origins: Arc<PublicOrigins>,
    /// [`Limits::body_bytes_in_flight`], in KiB permits.
    pub(crate) body_budget: conn::BodyBudget,
    pub(crate) send_rate: SlidingWindow,
    pub(crate) ip_rate: IpLimiter,
    /// Posts per letmeknow group per minute.
    pub(crate) letmeknow_rate: SlidingWindow,
    /// Parked letmeknow reads (group logs and invites), shared per client address.
    pub(crate) letmeknow_parking: parking::ParkingPool,
    /// Stringcup budgets, long-poll pool, idempotency keys in flight, statistics snapshot.
    pub(crate) stringcup: routes::stringcup::StringcupState,
    /// Becomes `true` when the relay shuts down; websocket sessions watch it.
    pub(crate) closing: tokio::sync::watch::Sender<bool>,
    /// [`Config::agent_mail_clock`].
    pub(crate) agent_mail_clock: Option<Arc<std::sync::atomic::AtomicI64>>,
    /// The families served ([`Config::served_families`]).
    pub(crate) families: Vec<Family>,
}

impl AppState {
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The store, for tests and tools that inspect or sweep it directly.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Whether this relay serves `family`.
    pub fn serves(&self, family: Family) -> bool {
        self.shared.families.contains(&family)
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// This relay's public names.
    pub fn origins(&self) -> &Arc<PublicOrigins> {
        &self.shared.origins
    }

    /// Runs one sweep now: deletes envelopes past retention, erases idle empty mailboxes that
    /// no websocket is watching, reclaims Stringcup identities whose token expired, forgets old
    /// idempotency keys and expired rendezvous, and forgets stale rate-limiter entries.
    pub async fn sweep_now(&self) -> Result<store::SweepReport, store::StoreError> {
        sweep_once(&self.shared).await
    }

    /// Tells websocket sessions to close (they send close code 1001).
    pub fn begin_close(&self) {
        self.shared.closing.send_replace(true);
    }

    /// Closes websocket sessions, then stops the writer after it commits what is queued and
    /// closes the database.
    pub async fn close(&self) {
        self.begin_close();
        self.shared.store.close().await;
    }
}

async fn sweep_once(shared: &Shared) -> Result<store::SweepReport, store::StoreError> {
    let now = switchboard_core::util::now_ms();
    let limits = &shared.limits;
    let serves = |family| shared.families.contains(&family);
    let mut report = store::SweepReport::default();
    if serves(Family::Letagents) {
        report = shared
            .store
            .sweep(now, now.saturating_sub(limits.retention_ms), now.saturating_sub(limits.idle_erase_ms))
            .await?;
    }
    if serves(Family::Stringcup) {
        sweep_stringcup(shared, now).await?;
    }
    if serves(Family::Letmeknow) {
        let lmk = shared.store.lmk_sweep(now.saturating_sub(limits.letmeknow.retention_ms), now).await?;
        if lmk.messages > 0 || lmk.invites > 0 {
            tracing::info!(messages = lmk.messages, invites = lmk.invites, "letmeknow swept");
        }
    }
    if serves(Family::AgentMail) {
        let am_now = shared.agent_mail_clock.as_ref().map_or(now, |c| c.load(std::sync::atomic::Ordering::SeqCst));
        let am = shared.store.am_sweep(am_now).await?;
        if am.packets > 0 || am.mailboxes > 0 {
            tracing::info!(packets = am.packets, mailboxes = am.mailboxes, nonces = am.nonces, "agent mail swept");
        }
    }
    let instant = std::time::Instant::now();
    shared.stringcup.prune(instant);
    shared.letmeknow_rate.prune(instant);
    shared.send_rate.prune(instant);
    shared.ip_rate.prune(instant);
    shared.hub.prune();
    Ok(report)
}

async fn sweep_stringcup(shared: &Shared, now: i64) -> Result<(), store::StoreError> {
    let sc = &shared.limits.stringcup;
    let swept = shared
        .store
        .stringcup()
        .sweep(store::stringcup::Sweep {
            now,
            tokens_unused_since: now.saturating_sub(sc.token_inactivity_ms),
            idempotency_before: now.saturating_sub(sc.idempotency_ttl_ms),
        })
        .await?;
    if swept.identities > 0 || swept.rendezvous > 0 {
        tracing::info!(
            identities = swept.identities,
            rendezvous = swept.rendezvous,
            idempotency_keys = swept.idempotency_keys,
            "stringcup swept"
        );
    }
    Ok(())
}

/// Opens the store in `config.data_dir` (creating it and running migrations), starts the
/// writer and the sweeper, and returns the router with its state.
///
/// The router expects `ConnectInfo<SocketAddr>` for the per-IP limit (without it the IP limit
/// is skipped); [`spawn`] provides it.
pub async fn app(config: &Config) -> anyhow::Result<(Router, AppState)> {
    let origins = Arc::new(if config.public_urls.is_empty() {
        PublicOrigins::for_listen(config.listen, config.tls != TlsMode::Plain)?
    } else {
        PublicOrigins::parse(&config.public_urls)?
    });
    let families = config.served_families()?;
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data directory {}", config.data_dir.display()))?;
    let hub = Arc::new(Hub::default());
    let store = match &config.database {
        Some(url) => Store::open_postgres(url, hub.clone()).await.context("opening the PostgreSQL store")?,
        None => Store::open(&config.data_dir, hub.clone())
            .await
            .with_context(|| format!("opening the store in {}", config.data_dir.display()))?,
    };
    let limits = config.limits.clone();
    let shared = Arc::new(Shared {
        store,
        hub,
        send_rate: SlidingWindow::new(limits.sends_per_minute, Duration::from_secs(60)),
        ip_rate: IpLimiter::new(limits.ip_requests_per_minute),
        letmeknow_rate: SlidingWindow::new(limits.letmeknow.posts_per_group_minute, Duration::from_secs(60)),
        letmeknow_parking: parking::ParkingPool::new(
            limits.letmeknow.long_poll_slots,
            limits.letmeknow.long_poll_per_ip,
        ),
        stringcup: routes::stringcup::StringcupState::new(&limits.stringcup),
        limits,
        origins,
        body_budget: conn::BodyBudget::new(config.limits.body_bytes_in_flight, max_body(&config.limits)),
        closing: tokio::sync::watch::channel(false).0,
        agent_mail_clock: config.agent_mail_clock.clone(),
        families,
    });
    spawn_sweeper(Arc::downgrade(&shared), config.sweep_interval);
    let state = AppState { shared };
    Ok((routes::router(state.clone()), state))
}

/// The largest body any route takes (what a chunked body of unknown length reserves).
fn max_body(limits: &Limits) -> u64 {
    let largest = [
        limits.max_envelope,
        limits.stringcup.batch_max_body_bytes,
        limits.letmeknow.max_message.saturating_mul(4) / 3 + 1024,
        switchboard_core::protocol::agent_mail::MAX_RAW_BYTES,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    u64::try_from(largest).unwrap_or(u64::MAX)
}

fn spawn_sweeper(shared: Weak<Shared>, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            match sweep_once(&shared).await {
                Ok(report) if report.expired > 0 || report.erased > 0 => {
                    tracing::info!(expired = report.expired, erased = report.erased, "swept");
                }
                Ok(_) => {}
                Err(store::StoreError::Closed) => return,
                Err(e) => tracing::warn!(error = %e, "sweep failed"),
            }
        }
    });
}

/// A relay serving in the background.
pub struct RunningRelay {
    /// The bound address (the real port when the config asked for port 0).
    pub addr: SocketAddr,
    /// SHA-256 of the leaf certificate's DER, when serving TLS.
    pub cert_sha256: Option<[u8; 32]>,
    /// The ASNET service, when enabled (its SMTP address and database).
    pub asnet: Option<asnet::RunningAsnet>,
    state: AppState,
    handle: axum_server::Handle<SocketAddr>,
    task: JoinHandle<std::io::Result<()>>,
}

impl std::fmt::Debug for RunningRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningRelay").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl RunningRelay {
    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        if self.cert_sha256.is_some() { "https" } else { "http" }
    }

    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme(), self.addr)
    }

    /// The shared state (store access, manual sweeps).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Stops accepting, gives open requests and websockets a moment to finish, then closes
    /// the store.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.state.begin_close();
        self.handle.graceful_shutdown(Some(Duration::from_secs(2)));
        let served = self.task.await;
        if let Some(asnet) = self.asnet {
            asnet.shutdown().await;
        }
        self.state.close().await;
        served.context("server task panicked")?.context("server failed")?;
        Ok(())
    }
}

/// Binds `config.listen` and serves in the background.
///
/// Refuses plain HTTP on a non-loopback address.
pub async fn spawn(config: Config) -> anyhow::Result<RunningRelay> {
    tls::install_default_provider();
    let tls = tls::load(&config.tls, &config.data_dir, config.listen)?;
    if tls.is_none() && !config.listen.ip().is_loopback() {
        anyhow::bail!(
            "refusing plain HTTP on {}: letagents relays are HTTPS-only; give --tls-cert and \
             --tls-key, or --tls-self-signed (plain HTTP is allowed on loopback only)",
            config.listen
        );
    }
    if config.database.is_some() && config.asnet.is_some() {
        // Its store is one SQLite file under --data: several instances would each have their own.
        anyhow::bail!("the ASNET/1 service runs on SQLite only: run it on a relay without --database");
    }
    let listener = bind(config.listen).with_context(|| format!("binding {}", config.listen))?;
    let addr = listener.local_addr()?;
    // Names derived from the listening address need the real port when it was 0.
    let (router, state) = app(&Config { listen: addr, ..config.clone() }).await?;
    let asnet = match config.asnet.clone() {
        Some(a) => Some(asnet::start(a, &config.data_dir).await?),
        None => None,
    };
    let handle = axum_server::Handle::new();
    let make_service = router.into_make_service_with_connect_info::<SocketAddr>();
    let cert_sha256 = tls.as_ref().map(|t| t.cert_sha256);
    conn::raise_nofile_limit();
    let limit = conn::LimitAcceptor::new(conn::ConnLimiter::new(config.limits.max_connections_per_ip));
    let header_timeout = Some(Duration::from_millis(config.limits.header_read_timeout_ms.max(1)));
    let task = match tls {
        Some(t) => {
            // TLS handshakes have axum-server's own 10 s limit.
            let rustls = axum_server::tls_rustls::RustlsConfig::from_config(t.server_config);
            let mut server =
                axum_server::from_tcp_rustls(listener, rustls)?.map(|tls| tls.acceptor(limit)).handle(handle.clone());
            // hyper's header timeout starts at a request's first byte: a connection that sends
            // nothing at all needs this one.
            server = server.first_request_timeout(header_timeout);
            server.http_builder().http1().header_read_timeout(header_timeout);
            tokio::spawn(server.serve(make_service))
        }
        None => {
            let mut server = axum_server::from_tcp(listener)?
                .acceptor(limit)
                .handle(handle.clone())
                .first_request_timeout(header_timeout);
            server.http_builder().http1().header_read_timeout(header_timeout);
            tokio::spawn(server.serve(make_service))
        }
    };
    let names: Vec<&str> = state.origins().urls().collect();
    tracing::info!(%addr, tls = cert_sha256.is_some(), public = ?names, "relay-lite serving");
    Ok(RunningRelay { addr, cert_sha256, asnet, state, handle, task })
}

/// A listening socket with SO_REUSEADDR, so a restarted relay can take its port back at once.
fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(1024)?;
    listener.into_std()
}

/// Runs the relay until Ctrl-C or SIGTERM: prints `certificate sha256 <hex>` when serving TLS,
/// then exactly one line `relay-lite listening on <scheme>://<addr>` on stdout.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let relay = spawn(config).await?;
    // Listen for signals before announcing the address: whoever reads the line may signal at once.
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    {
        let mut out = std::io::stdout().lock();
        if let Some(fp) = relay.cert_sha256 {
            writeln!(out, "certificate sha256 {}", switchboard_core::util::hex(&fp))?;
        }
        if let Some(asnet) = &relay.asnet {
            writeln!(out, "asnet smtp listening on {}", asnet.smtp_addr)?;
        }
        writeln!(out, "relay-lite listening on {}", relay.url())?;
        out.flush()?;
    }
    #[cfg(unix)]
    shutdown_signal(term.ok()).await;
    #[cfg(not(unix))]
    shutdown_signal().await;
    tracing::info!("shutting down");
    relay.shutdown().await
}

#[cfg(unix)]
async fn shutdown_signal(term: Option<tokio::signal::unix::Signal>) {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match term {
            Some(mut s) => {
                s.recv().await;
            }
            None => {
                tracing::warn!("cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(not(unix))]
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
