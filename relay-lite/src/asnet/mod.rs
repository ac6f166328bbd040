//! The ASNET/1 service in relay-lite: mail in by SMTP from the trusted MTA, the protocol core
//! over SQLite, replies out by SMTP to a smarthost.
//!
//! - [`smtp`] listens on `--asnet-smtp-listen` for loopback and configured peers only and reads
//!   one message per transaction (32 KiB raw limit while reading, bounded lines, timeouts);
//! - each message goes through the core's trusted MIME adapter (`mime::adapt`: RCPT TO is the
//!   service mailbox, MAIL FROM is the From, the configured authserv-id's
//!   `Authentication-Results` say SPF, DKIM and DMARC pass, the delivery id is the queue id of
//!   the topmost `Received:`), then `receive` runs and commits with its replies ([`store`]);
//! - the SMTP reply is `250` once that commit is done, whatever the outcome (a refusal is
//!   dropped, not bounced: no backscatter), `451` when the database failed (the MTA retries);
//! - [`dispatch`] sends queued replies to `--asnet-smarthost` with lettre: null reverse path,
//!   one send per second at most, retries with backoff, 15-minute expiry.
//!
//! Codes and bodies are never logged: only outcomes and reasons.

pub mod dispatch;
pub mod smtp;
pub mod store;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use switchboard_core::protocol::asnet::mime::{Policy, SmtpEnvelope, adapt};
use switchboard_core::protocol::asnet::{Config as CoreConfig, Limits as CoreLimits, Mailbox, Status};
use switchboard_core::util::now_ms;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinHandle;

pub use store::{AsnetDb, AsnetStoreError};

/// SMTP connections served at once; more wait in the accept queue.
pub const MAX_CONNECTIONS: usize = 64;

/// Where the smarthost is: a host name or address and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Smarthost {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl std::str::FromStr for Smarthost {
    type Err = String;

    /// Parses `HOST:PORT` (`[v6]:PORT` for an IPv6 address).
    fn from_str(text: &str) -> Result<Self, String> {
        let (host, port) = text.rsplit_once(':').ok_or_else(|| format!("{text}: expected HOST:PORT"))?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let port = port.parse::<u16>().map_err(|_| format!("{text}: bad port"))?;
        if host.is_empty() || port == 0 {
            return Err(format!("{text}: expected HOST:PORT"));
        }
        Ok(Self { host: host.to_owned(), port })
    }
}

/// The ASNET service's configuration (`--asnet-*` flags).
#[derive(Debug, Clone)]
pub struct AsnetConfig {
    /// The service mailbox (`--asnet-address`).
    pub address: Mailbox,
    /// Where the SMTP listener binds (`--asnet-smtp-listen`).
    pub smtp_listen: SocketAddr,
    /// Non-loopback addresses allowed to connect (`--asnet-smtp-peer`); loopback always is.
    pub smtp_peers: Vec<IpAddr>,
    /// Where replies are sent (`--asnet-smarthost`).
    pub smarthost: Smarthost,
    /// Whose `Authentication-Results` are trusted (`--asnet-authserv-id`).
    pub authserv_id: String,
    /// The inbound budgets (`--asnet-sender-limit`, `--asnet-global-limit`).
    pub limits: CoreLimits,
    /// SMTP timeouts.
    pub timeouts: smtp::Timeouts,
    /// How often expired state is swept.
    pub sweep_interval: Duration,
}

impl AsnetConfig {
    /// A config with the seed's budgets and RFC 5321 timeouts.
    pub fn new(address: Mailbox, smtp_listen: SocketAddr, smarthost: Smarthost, authserv_id: String) -> Self {
        Self {
            address,
            smtp_listen,
            smtp_peers: Vec::new(),
            smarthost,
            authserv_id,
            limits: CoreLimits::default(),
            timeouts: smtp::Timeouts::default(),
            sweep_interval: Duration::from_secs(60),
        }
    }
}

/// What one SMTP transaction's message turns into.
struct Service {
    policy: Policy,
    core: CoreConfig,
    db: AsnetDb,
    wake: Arc<Notify>,
}

impl smtp::Deliver for Service {
    async fn deliver(&self, mail_from: String, rcpt_to: String, raw: Vec<u8>) -> smtp::Reply {
        let rcpts = [rcpt_to];
        let envelope = match adapt(&raw, SmtpEnvelope { mail_from: &mail_from, rcpt_to: &rcpts }, &self.policy) {
            Ok(e) => e,
            Err(refusal) => {
                tracing::info!(reason = %refusal, "asnet: mail refused by the adapter");
                return smtp::Reply::new(250, format!("2.6.0 Dropped: {refusal}"));
            }
        };
        match self.db.receive(self.core.clone(), envelope, now_ms()).await {
            Ok(outcome) => {
                let status = match outcome.status {
                    Status::Processed => "processed",
                    Status::Ignored => "ignored",
                    Status::Rejected => "rejected",
                };
                let reason = outcome.reason.map_or("", |r| r.as_str());
                tracing::info!(status, reason, replies = outcome.outbox.len(), "asnet: command");
                if !outcome.outbox.is_empty() {
                    self.wake.notify_one();
                }
                if reason.is_empty() {
                    smtp::Reply::new(250, format!("2.0.0 Ok: {status}"))
                } else {
                    smtp::Reply::new(250, format!("2.0.0 Ok: {status} ({reason})"))
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "asnet: could not commit a command");
                smtp::Reply::new(451, "4.3.0 Local error, try again later")
            }
        }
    }
}

/// The running service: its bound SMTP address and tasks.
pub struct RunningAsnet {
    /// The SMTP listener's address (the real port when the config asked for port 0).
    pub smtp_addr: SocketAddr,
    db: AsnetDb,
    closing: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for RunningAsnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningAsnet").field("smtp_addr", &self.smtp_addr).finish_non_exhaustive()
    }
}

impl RunningAsnet {
    /// The database (for operators and tests).
    pub fn db(&self) -> &AsnetDb {
        &self.db
    }

    /// Stops accepting, stops the dispatcher and the sweeper, closes the database.
    pub async fn shutdown(self) {
        self.closing.send_replace(true);
        for task in self.tasks {
            task.abort();
            let _ = task.await;
        }
        self.db.close().await;
    }
}

/// Whether `peer` may talk to the listener.
fn peer_allowed(peer: IpAddr, allowed: &[IpAddr]) -> bool {
    let peer = match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    peer.is_loopback() || allowed.contains(&peer)
}

/// Opens the database in `data_dir`, binds the SMTP listener and starts the dispatcher and the
/// sweeper.
pub async fn start(config: AsnetConfig, data_dir: &Path) -> anyhow::Result<RunningAsnet> {
    let db = AsnetDb::open(data_dir)
        .await
        .with_context(|| format!("opening {}", data_dir.join(store::DB_FILE).display()))?;
    let listener = TcpListener::bind(config.smtp_listen)
        .await
        .with_context(|| format!("binding the ASNET SMTP listener on {}", config.smtp_listen))?;
    let smtp_addr = listener.local_addr()?;
    let wake = Arc::new(Notify::new());
    let mut core = CoreConfig::new(config.address.clone());
    core.limits = config.limits;
    let service = Arc::new(Service {
        policy: Policy { service: config.address.clone(), authserv_id: config.authserv_id.clone() },
        core,
        db: db.clone(),
        wake: wake.clone(),
    });
    let (closing, _) = watch::channel(false);
    let hostname = config.address.domain().to_owned();
    let accept = tokio::spawn(accept_loop(listener, service, config.clone(), hostname, closing.subscribe()));
    let dispatcher = dispatch::Dispatcher::new(db.clone(), &config.smarthost, config.address.clone(), wake)?;
    let dispatch = tokio::spawn(dispatcher.run(closing.subscribe()));
    let sweep = tokio::spawn(sweep_loop(db.clone(), config.sweep_interval));
    tracing::info!(%smtp_addr, service = %config.address, "asnet: SMTP listener up");
    Ok(RunningAsnet { smtp_addr, db, closing, tasks: vec![accept, dispatch, sweep] })
}

async fn accept_loop(
    listener: TcpListener,
    service: Arc<Service>,
    config: AsnetConfig,
    hostname: String,
    mut closing: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = closing.changed() => return,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "asnet: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = closing.changed() => return,
        };
        if !peer_allowed(peer.ip(), &config.smtp_peers) {
            tracing::warn!(%peer, "asnet: SMTP connection from an untrusted address refused");
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt as _;
                let mut stream = stream;
                let refusal = smtp::Reply::new(554, "5.7.1 Not a trusted relay").render();
                let _ = tokio::time::timeout(Duration::from_secs(5), stream.write_all(refusal.as_bytes())).await;
                drop(permit);
            });
            continue;
        }
        // Replies are small and answer pipelined commands one by one: without this, Nagle and
        // delayed ACKs hold each one back by tens of milliseconds.
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let session = smtp::Session::new(config.address.clone(), hostname.clone());
        let timeouts = config.timeouts;
        tokio::spawn(async move {
            if let Err(e) = smtp::serve_connection(stream, session, timeouts, service.as_ref()).await {
                tracing::debug!(%peer, error = %e, "asnet: SMTP connection ended with an error");
            }
            drop(permit);
        });
    }
}

async fn sweep_loop(db: AsnetDb, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = db.sweep(now_ms()).await {
            tracing::warn!(error = %e, "asnet: sweep failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_loopback_and_configured_peers_may_connect() {
        let peer: IpAddr = "198.18.0.7".parse().unwrap();
        assert!(peer_allowed("127.0.0.1".parse().unwrap(), &[]));
        assert!(peer_allowed("::1".parse().unwrap(), &[]));
        assert!(peer_allowed("::ffff:127.0.0.1".parse().unwrap(), &[]));
        assert!(!peer_allowed(peer, &[]));
        assert!(peer_allowed(peer, &[peer]));
        assert!(peer_allowed("::ffff:198.18.0.7".parse().unwrap(), &[peer]));
    }

    #[test]
    fn smarthost_parses_host_and_port() {
        assert_eq!("mx.example.test:25".parse(), Ok(Smarthost { host: "mx.example.test".into(), port: 25 }));
        assert_eq!("[::1]:2525".parse(), Ok(Smarthost { host: "::1".into(), port: 2525 }));
        assert!("mx.example.test".parse::<Smarthost>().is_err());
        assert!("mx:0".parse::<Smarthost>().is_err());
    }
}
