//! The `relay-lite` binary: parses flags (and an optional JSON config file with the same keys),
//! sets up logging on stderr and runs [`relay_lite::serve`].

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use relay_lite::asnet::{AsnetConfig, Smarthost};
use relay_lite::{Config, Limits, TlsMode};
use serde::Deserialize;
use switchboard_core::protocol::asnet::Mailbox;

/// A small relay for Switchboard's relay APIs (letagents v1).
///
/// Prints `relay-lite listening on <scheme>://<addr>` on stdout once it accepts connections
/// (and `certificate sha256 <hex>` before it when serving TLS). Logs go to stderr (RUST_LOG).
#[derive(Debug, Parser)]
#[command(name = "relay-lite", version)]
struct Cli {
    /// JSON file with any of the keys below (`"listen"`, `"data"`, `"tls-cert"`,
    /// `"max-envelope"`, ...); flags given on the command line win.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on, e.g. `0.0.0.0:443` or `127.0.0.1:0` (port 0 picks one).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Data directory (database, self-signed certificate).
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Store in this PostgreSQL database instead of SQLite in --data (`postgres://user@host/db`),
    /// so several relay-lite instances serve one database (every family).
    #[arg(long, value_name = "URL")]
    database: Option<String>,
    /// The API families to serve, comma-separated: letagents, letmeknow, stringcup, agent-mail
    /// [default: all].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    families: Vec<String>,
    /// PEM certificate chain.
    #[arg(long, value_name = "PEM", requires = "tls_key", conflicts_with = "tls_self_signed")]
    tls_cert: Option<PathBuf>,
    /// PEM private key.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Generate (once) and serve a self-signed certificate kept in the data directory.
    #[arg(long)]
    tls_self_signed: bool,
    /// A URL clients use for this relay, e.g. `https://relay.example` (repeatable, the first is
    /// the primary). Logins, acks and tokens must be signed for one of them; the request's Host
    /// header is never trusted. Default: `http(s)://ADDR:PORT` and `localhost:PORT` for a
    /// loopback --listen, `ADDR:PORT` for a specific address; required on 0.0.0.0.
    #[arg(long = "public-url", value_name = "URL")]
    public_url: Vec<String>,
    /// Largest envelope in bytes [default: 32768].
    #[arg(long, value_name = "N")]
    max_envelope: Option<usize>,
    /// Envelopes that may wait per mailbox [default: 200].
    #[arg(long, value_name = "N")]
    mailbox_capacity: Option<usize>,
    /// Sends per mailbox per sliding minute, 0 for no limit [default: 60].
    #[arg(long, value_name = "N")]
    sends_per_minute: Option<u32>,
    /// Requests per client IP per minute, 0 for no limit [default: 600].
    #[arg(long, value_name = "N")]
    ip_requests_per_minute: Option<u32>,
    /// Envelope retention in seconds [default: 172800 = 48 h].
    #[arg(long, value_name = "N")]
    retention_secs: Option<u64>,
    /// Erase mailboxes idle this long with nothing waiting, in seconds [default: 1209600 = 14 d].
    #[arg(long, value_name = "N")]
    idle_erase_secs: Option<u64>,
    /// How often to sweep expired envelopes and idle mailboxes, in seconds [default: 60].
    #[arg(long, value_name = "N")]
    sweep_interval_secs: Option<u64>,
    /// Cut off a request whose body has not arrived whole within this many seconds of its head
    /// [default: 60].
    #[arg(long, value_name = "N")]
    request_body_timeout_secs: Option<u64>,
    /// Open connections one client address (IPv4, or IPv6 /64) may hold, 0 for no limit
    /// [default: 256].
    #[arg(long, value_name = "N")]
    max_connections_per_ip: Option<usize>,
    /// Close a connection that has not sent a whole request head within this many seconds of
    /// being ready for one (new or idle keep-alive) [default: 30].
    #[arg(long, value_name = "N")]
    header_read_timeout_secs: Option<u64>,
    /// Enable the ASNET/1 email service with this service mailbox, e.g.
    /// `network@example.test` (needs the three other --asnet-* settings below).
    #[arg(long, value_name = "MAILBOX")]
    asnet_address: Option<String>,
    /// Where the ASNET SMTP listener binds, for the trusted MTA in front (e.g. `127.0.0.1:2525`).
    /// Only loopback and --asnet-smtp-peer addresses may connect.
    #[arg(long, value_name = "ADDR")]
    asnet_smtp_listen: Option<SocketAddr>,
    /// A non-loopback address of the trusted MTA allowed to connect (repeatable).
    #[arg(long = "asnet-smtp-peer", value_name = "IP")]
    asnet_smtp_peer: Vec<IpAddr>,
    /// Where ASNET replies are sent by SMTP: `HOST:PORT` of the trusted MTA (plain SMTP).
    #[arg(long, value_name = "HOST:PORT")]
    asnet_smarthost: Option<String>,
    /// The authserv-id whose `Authentication-Results` header the ASNET service trusts (the
    /// trusted MTA's, which must strip forged copies).
    #[arg(long, value_name = "ID")]
    asnet_authserv_id: Option<String>,
    /// ASNET attempts admitted per sender mailbox per rolling hour [default: 30].
    #[arg(long, value_name = "N")]
    asnet_sender_limit: Option<u32>,
    /// ASNET attempts admitted from everyone per rolling hour [default: 1000].
    #[arg(long, value_name = "N")]
    asnet_global_limit: Option<u32>,
}

/// The config file: the flags' names as keys.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    data: Option<PathBuf>,
    database: Option<String>,
    #[serde(default)]
    families: Vec<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    #[serde(default)]
    tls_self_signed: bool,
    #[serde(default)]
    public_url: Vec<String>,
    max_envelope: Option<usize>,
    mailbox_capacity: Option<usize>,
    sends_per_minute: Option<u32>,
    ip_requests_per_minute: Option<u32>,
    retention_secs: Option<u64>,
    idle_erase_secs: Option<u64>,
    sweep_interval_secs: Option<u64>,
    header_read_timeout_secs: Option<u64>,
    request_body_timeout_secs: Option<u64>,
    max_connections_per_ip: Option<usize>,
    asnet_address: Option<String>,
    asnet_smtp_listen: Option<SocketAddr>,
    #[serde(default)]
    asnet_smtp_peer: Vec<IpAddr>,
    asnet_smarthost: Option<String>,
    asnet_authserv_id: Option<String>,
    asnet_sender_limit: Option<u32>,
    asnet_global_limit: Option<u32>,
}

fn secs_to_ms(secs: u64) -> i64 {
    i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// The ASNET service's settings, from flags over the file; `None` when no key is given.
fn asnet_config(cli: &Cli, file: &FileConfig) -> anyhow::Result<Option<AsnetConfig>> {
    let address = cli.asnet_address.clone().or(file.asnet_address.clone());
    let listen = cli.asnet_smtp_listen.or(file.asnet_smtp_listen);
    let smarthost = cli.asnet_smarthost.clone().or(file.asnet_smarthost.clone());
    let authserv_id = cli.asnet_authserv_id.clone().or(file.asnet_authserv_id.clone());
    let (address, listen, smarthost, authserv_id) = match (address, listen, smarthost, authserv_id) {
        (None, None, None, None) => return Ok(None),
        (Some(a), Some(l), Some(s), Some(i)) => (a, l, s, i),
        _ => anyhow::bail!(
            "the ASNET service needs all of asnet-address, asnet-smtp-listen, asnet-smarthost and asnet-authserv-id"
        ),
    };
    let address = Mailbox::parse(&address).map_err(|e| anyhow::anyhow!("asnet-address {address}: {e}"))?;
    let smarthost: Smarthost = smarthost.parse().map_err(|e| anyhow::anyhow!("asnet-smarthost {e}"))?;
    if authserv_id.is_empty() || !authserv_id.bytes().all(|b| b.is_ascii_graphic() && b != b';') {
        anyhow::bail!("asnet-authserv-id must be a non-empty token (a host name, usually)");
    }
    let mut config = AsnetConfig::new(address, listen, smarthost, authserv_id);
    config.smtp_peers =
        if cli.asnet_smtp_peer.is_empty() { file.asnet_smtp_peer.clone() } else { cli.asnet_smtp_peer.clone() };
    if let Some(n) = cli.asnet_sender_limit.or(file.asnet_sender_limit) {
        config.limits.per_sender = n;
    }
    if let Some(n) = cli.asnet_global_limit.or(file.asnet_global_limit) {
        config.limits.global = n;
    }
    Ok(Some(config))
}

fn config(cli: Cli) -> anyhow::Result<Config> {
    let file = match &cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str::<FileConfig>(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => FileConfig::default(),
    };
    let asnet = asnet_config(&cli, &file)?;
    let listen = cli.listen.or(file.listen).context("--listen is required")?;
    let data_dir = cli.data.or(file.data).context("--data is required")?;
    let cli_tls = cli.tls_cert.is_some() || cli.tls_self_signed;
    let (cert, key, self_signed) = if cli_tls {
        (cli.tls_cert, cli.tls_key, cli.tls_self_signed)
    } else {
        (file.tls_cert, file.tls_key, file.tls_self_signed)
    };
    let tls = match (cert, key, self_signed) {
        (Some(cert), Some(key), false) => TlsMode::Files { cert, key },
        (None, None, true) => TlsMode::SelfSigned,
        (None, None, false) => TlsMode::Plain,
        _ => anyhow::bail!("give both tls-cert and tls-key, or tls-self-signed, not a mix"),
    };
    let mut limits = Limits::default();
    if let Some(n) = cli.max_envelope.or(file.max_envelope) {
        limits.max_envelope = n;
    }
    if let Some(n) = cli.mailbox_capacity.or(file.mailbox_capacity) {
        limits.mailbox_capacity = n;
    }
    if let Some(n) = cli.sends_per_minute.or(file.sends_per_minute) {
        limits.sends_per_minute = n;
    }
    if let Some(n) = cli.ip_requests_per_minute.or(file.ip_requests_per_minute) {
        limits.ip_requests_per_minute = n;
    }
    if let Some(secs) = cli.retention_secs.or(file.retention_secs) {
        limits.retention_ms = secs_to_ms(secs);
    }
    if let Some(secs) = cli.idle_erase_secs.or(file.idle_erase_secs) {
        limits.idle_erase_ms = secs_to_ms(secs);
    }
    if let Some(secs) = cli.header_read_timeout_secs.or(file.header_read_timeout_secs) {
        limits.header_read_timeout_ms = secs.saturating_mul(1000);
    }
    if let Some(secs) = cli.request_body_timeout_secs.or(file.request_body_timeout_secs) {
        limits.request_body_timeout_ms = secs.saturating_mul(1000);
    }
    if let Some(n) = cli.max_connections_per_ip.or(file.max_connections_per_ip) {
        limits.max_connections_per_ip = n;
    }
    if limits.max_envelope == 0
        || limits.mailbox_capacity == 0
        || limits.header_read_timeout_ms == 0
        || limits.request_body_timeout_ms == 0
    {
        anyhow::bail!(
            "max-envelope, mailbox-capacity, header-read-timeout-secs and request-body-timeout-secs must be positive"
        );
    }
    let sweep = cli.sweep_interval_secs.or(file.sweep_interval_secs).unwrap_or(60);
    let mut config = Config::new(listen, data_dir);
    config.tls = tls;
    config.limits = limits;
    config.sweep_interval = Duration::from_secs(sweep.max(1));
    config.asnet = asnet;
    config.public_urls = if cli.public_url.is_empty() { file.public_url } else { cli.public_url };
    config.database = cli.database.or(file.database);
    let families = if cli.families.is_empty() { file.families } else { cli.families };
    config.families = families
        .iter()
        .map(|name| relay_lite::Family::parse(name.trim()).with_context(|| format!("unknown family {name:?}")))
        .collect::<anyhow::Result<_>>()?;
    config.served_families()?;
    // Fail before binding: a relay that cannot name itself would refuse every login. (Plain
    // HTTP off loopback is refused at start anyway, with its own message.)
    let would_serve = config.tls != TlsMode::Plain || config.listen.ip().is_loopback();
    if !config.public_urls.is_empty() {
        relay_lite::PublicOrigins::parse(&config.public_urls)?;
    } else if would_serve {
        relay_lite::PublicOrigins::for_listen(config.listen, config.tls != TlsMode::Plain)?;
    }
    Ok(config)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("relay_lite=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = config(Cli::parse())?;
    relay_lite::serve(config).await
}
