//! The reply dispatcher: sends the ASNET outbox to the smarthost by SMTP (lettre), following the
//! protocol core's decisions (`outbox::next`): at least one second between sends, retries with
//! backoff at most five times, nothing sent after a reply's 15 minutes.
//!
//! - the pacer row is written before each attempt, so a crash cannot speed sends up;
//! - an entry is written back after its attempt; a crash in between sends it again with the same
//!   `X-ASNET-Response-ID` (clients deduplicate by it, as the seed requires);
//! - replies go out with the null reverse path (`MAIL FROM:<>`, RFC 3834 §3.3): an automatic
//!   reply must not draw bounces or auto-replies back to the service;
//! - the smarthost connection is plain SMTP: it is the trusted MTA (loopback or a private link),
//!   which does TLS onwards.

use std::sync::Arc;
use std::time::Duration;

use lettre::address::Envelope;
use lettre::{AsyncSmtpTransport, AsyncTransport as _, Tokio1Executor};
use switchboard_core::protocol::asnet::Mailbox;
use switchboard_core::protocol::asnet::mime::render_reply;
use switchboard_core::protocol::asnet::outbox::{self, Attempt, Entry, Next};
use switchboard_core::util::now_ms;
use tokio::sync::{Notify, watch};

use super::{AsnetDb, AsnetStoreError, Smarthost};

/// How long one SMTP send may take.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// With nothing queued, look again this often anyway (expiry bookkeeping).
const IDLE_RECHECK: Duration = Duration::from_secs(60);

/// What to do after one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Step again at once.
    No,
    /// Nothing may be sent before this time (Unix ms).
    Until(i64),
    /// Nothing is queued.
    Idle,
}

/// Sends queued replies.
pub struct Dispatcher {
    db: AsnetDb,
    transport: AsyncSmtpTransport<Tokio1Executor>,
    service: Mailbox,
    wake: Arc<Notify>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").field("service", &self.service).finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher sending to `smarthost` as `service`; `wake` is notified when replies are
    /// queued.
    pub fn new(db: AsnetDb, smarthost: &Smarthost, service: Mailbox, wake: Arc<Notify>) -> anyhow::Result<Self> {
        let transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(smarthost.host.as_str())
            .port(smarthost.port)
            .timeout(Some(SEND_TIMEOUT))
            .build();
        Ok(Self { db, transport, service, wake })
    }

    /// Runs until `closing` turns true.
    pub async fn run(self, mut closing: watch::Receiver<bool>) {
        loop {
            if *closing.borrow() {
                return;
            }
            let wait = match self.step(now_ms()).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "asnet: outbox step failed");
                    Wait::Until(now_ms().saturating_add(1000))
                }
            };
            let sleep = match wait {
                Wait::No => continue,
                Wait::Until(at) => Duration::from_millis(u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0)),
                Wait::Idle => IDLE_RECHECK,
            };
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = self.wake.notified() => {}
                _ = closing.changed() => return,
            }
        }
    }

    /// One decision at `now`: expire, pick, send at most one reply.
    pub async fn step(&self, now: i64) -> Result<Wait, AsnetStoreError> {
        self.db.expire_outbox(now).await?;
        let entries = self.db.queued().await?;
        let mut pacer = self.db.pacer().await?;
        match outbox::next(&entries, &pacer, now) {
            Next::Idle => Ok(Wait::Idle),
            Next::WaitUntil(at) => Ok(Wait::Until(at)),
            Next::Send(index) => {
                let Some(mut entry) = entries.get(index).cloned() else { return Ok(Wait::No) };
                pacer.record_send(now);
                self.db.save_pacer(&pacer).await?;
                let attempt = self.send(&entry, now).await;
                entry.record(attempt, now_ms());
                self.db.save_entry(&entry).await?;
                tracing::info!(
                    response_id = %entry.response_id,
                    kind = %entry.kind,
                    ?attempt,
                    state = entry.state.as_str(),
                    "asnet: reply attempt"
                );
                Ok(Wait::No)
            }
        }
    }

    async fn send(&self, entry: &Entry, now: i64) -> Attempt {
        let Ok(to) = entry.to.as_str().parse::<lettre::Address>() else {
            return Attempt::Permanent;
        };
        let Ok(envelope) = Envelope::new(None, vec![to]) else {
            return Attempt::Permanent;
        };
        let raw = render_reply(entry, &self.service, now);
        match self.transport.send_raw(&envelope, &raw).await {
            Ok(_) => Attempt::Sent,
            Err(e) if e.is_permanent() => {
                tracing::warn!(error = %e, "asnet: smarthost refused a reply permanently");
                Attempt::Permanent
            }
            Err(e) => {
                tracing::warn!(error = %e, "asnet: smarthost unavailable");
                Attempt::Temporary
            }
        }
    }
}
