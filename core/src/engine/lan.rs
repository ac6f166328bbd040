//! The LAN path inside the runtime (issue 17): the on/off setting, the LAN key in the keystore,
//! the node's lifecycle in a long-lived runtime, direct delivery for the outbox and direct
//! receipt through the channels' own receive paths.
//!
//! - Setting: `meta.lan` (`switchboard lan on|off|status`, the bridge's `lan` request); off
//!   unless turned on (README: why). Off: no node, no LAN socket. `lan on` in a running daemon
//!   starts the node within a supervisor tick; `lan off` stops it at once.
//! - Key: keystore slot `lan`, a random Ed25519 key made here (never derived from an identity
//!   key), replaced after [`LAN_KEY_LIFETIME_MS`]; the node restarts with the new PeerId and
//!   fresh bindings signed by the letagents identity key and the Agent Mail key.
//! - Pins: active letagents and Agent Mail contacts (both authenticate the sender end to end)
//!   whose key is not awaiting re-verification, republished every supervisor tick.
//! - Outbox: a letagents or Agent Mail row for a nearby contact is offered directly first (one
//!   try, the node's ~2 s deadline); only `Stored` counts, anything else takes the relay in the
//!   same attempt. A delivery that fails or times out un-lists the peer before the outbox hears
//!   of it, so the next message does not try the link again.
//! - Relays: a profile whose own relay is pinned by certificate announces it, signed, to bound
//!   contacts; relays contacts announced are stored as trusted pins (`engine::relays`).
//! - Inbound: the bytes go through the channel's own receive (same replay protection, same
//!   transaction) with the path `direct`; `Stored` is answered only after that commit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::{Result, Runtime, blocking};
use crate::identity::keystore::{Keystore, KeystoreError};
use crate::protocol::lan::{LAN_KEY_LIFETIME_MS, LanBinding, LanKey, Refusal};
use crate::store::ContactState;
use crate::store::OutboxRow;
use crate::transport::lan::{self as node, ContactId, Inbound, LanConfig, LanHandle, LanIdentity, Pinned};
use crate::util::{OsRng, now_ms};

/// The LAN layer's default when the profile never set it: off (README, "LAN").
pub const LAN_DEFAULT_ON: bool = false;
/// How often the supervisor reconciles the node with the setting, the contacts and the key.
const SUPERVISOR_TICK: Duration = Duration::from_secs(2);

/// The runtime's LAN state.
pub(super) struct Lan {
    /// The running node (a sync lock: contact views read the nearby set without awaiting).
    handle: std::sync::Mutex<Option<LanHandle>>,
    /// Serialises starting and stopping.
    life: tokio::sync::Mutex<Life>,
    /// Set by `start_background`: only a long-lived runtime runs a node.
    long_lived: AtomicBool,
}

struct Life {
    pins: watch::Sender<Pinned>,
    key_created_at: i64,
    /// Whether the running node's bindings include the Agent Mail key (made lazily: when it
    /// appears later, the node restarts to bind it too).
    bound_agent_mail: bool,
}

impl Default for Lan {
    fn default() -> Self {
        Self {
            handle: std::sync::Mutex::new(None),
            life: tokio::sync::Mutex::new(Life {
                pins: watch::channel(Arc::new(BTreeMap::new())).0,
                key_created_at: 0,
                bound_agent_mail: false,
            }),
            long_lived: AtomicBool::new(false),
        }
    }
}

impl Lan {
    fn handle(&self) -> Option<LanHandle> {
        self.handle.lock().ok().and_then(|h| h.clone())
    }

    fn take_handle(&self) -> Option<LanHandle> {
        self.handle.lock().ok().and_then(|mut h| h.take())
    }

    /// Whether contact `id` has a bound, live LAN connection now.
    pub(super) fn is_nearby(&self, id: i64) -> bool {
        self.handle().is_some_and(|h| h.nearby().contains(&id))
    }

    /// Contact ids with a bound, live LAN connection now.
    pub(super) fn nearby(&self) -> BTreeSet<ContactId> {
        self.handle().map(|h| h.nearby()).unwrap_or_default()
    }
}

fn slot(ks: &Keystore) -> std::result::Result<Keystore, KeystoreError> {
    ks.slot("lan")
}

impl Runtime {
    /// Whether the LAN layer is switched on.
    pub(super) async fn lan_enabled(&self) -> Result<bool> {
        Ok(self.store().lan_setting().await?.unwrap_or(LAN_DEFAULT_ON))
    }

    /// The `lan` request: with `on` records the setting (and starts or stops the node of a
    /// long-lived runtime); answers the status either way.
    pub(super) async fn lan_request(&self, on: Option<bool>) -> Result<Value> {
        if let Some(on) = on {
            self.store().set_lan_setting(on).await?;
            if !on {
                self.lan_stop().await;
            } else if self.inner.lan.long_lived.load(Ordering::SeqCst) {
                self.lan_start().await?;
            }
        }
        self.lan_status().await
    }

    /// `lan status`, and the `lan` section of `status`.
    pub(super) async fn lan_status(&self) -> Result<Value> {
        let enabled = self.lan_enabled().await?;
        let handle = self.inner.lan.handle();
        let ids = self.inner.lan.nearby();
        let mut nearby: Vec<String> =
            self.store().contacts(None).await?.into_iter().filter(|c| ids.contains(&c.id)).map(|c| c.name).collect();
        nearby.sort();
        Ok(json!({
            "enabled": enabled,
            "running": handle.as_ref().is_some_and(LanHandle::is_running),
            "peer_id": handle.as_ref().map(LanHandle::peer_id),
            "listening": handle.as_ref().map(|h| h.listening().iter().map(ToString::to_string).collect::<Vec<_>>()),
            "nearby": nearby,
        }))
    }

    /// The current LAN key: loaded from the keystore, replaced (and saved first) when due.
    async fn lan_key(&self) -> Result<LanKey> {
        let ks = self.inner.keys.clone();
        let stored = blocking(move || slot(&ks)?.load()).await??;
        let stored = stored.and_then(|s| LanKey::from_secret(&s));
        let (key, new) = LanKey::current(stored, now_ms(), &mut OsRng);
        if new {
            let bytes = key.secret_bytes();
            let ks = self.inner.keys.clone();
            blocking(move || slot(&ks)?.save(&bytes)).await??;
        }
        Ok(key)
    }

    /// Pinned identity keys: active contacts of the channels the LAN carries, minus any whose key
    /// changed and awaits re-verification and any the owner blocked (a blocked contact gets no
    /// LAN connection: its binding verifies against no pin).
    async fn lan_pins(&self) -> Result<Pinned> {
        let mut map = BTreeMap::new();
        for c in self.store().contacts(Some(ContactState::Active)).await? {
            if self.channel(c.protocol).lan_tag().is_some()
                && !c.blocked
                && c.changed_box_pub.is_none()
                && let Ok(key) = <[u8; 32]>::try_from(c.sig_pub.as_slice())
            {
                map.insert(key, c.id);
            }
        }
        Ok(Arc::new(map))
    }

    /// Starts the node (unless running) with a current key and fresh bindings.
    async fn lan_start(&self) -> Result<()> {
        let mut life = self.inner.lan.life.lock().await;
        if self.inner.lan.handle().is_some_and(|h| h.is_running()) {
            return Ok(());
        }
        let key = self.lan_key().await?;
        let peer = key.peer_id_bytes();
        let expiry = key.binding_expiry();
        let mut bindings = vec![LanBinding::sign(&self.inner.id.sig, &peer, expiry)];
        let am = self.inner.agent_mail.signing_key().await;
        life.bound_agent_mail = am.is_some();
        if let Some(am) = am {
            bindings.push(LanBinding::sign(&am, &peer, expiry));
        }
        let relay = self.lan_relay_announcement(expiry).await;
        life.pins.send_replace(self.lan_pins().await?);
        life.key_created_at = key.created_at_ms();
        let (handle, inbound) =
            node::start(LanIdentity { key, bindings, relay }, life.pins.subscribe(), LanConfig::default())?;
        tracing::info!("lan: node {} started", handle.peer_id());
        tokio::spawn(self.clone().lan_inbound_loop(inbound));
        tokio::spawn(self.clone().lan_relays_loop(handle.watch_relays()));
        if let Ok(mut h) = self.inner.lan.handle.lock() {
            *h = Some(handle);
        }
        Ok(())
    }

    /// Stops the node; no LAN socket stays open.
    async fn lan_stop(&self) {
        let _life = self.inner.lan.life.lock().await;
        if let Some(h) = self.inner.lan.take_handle() {
            h.shutdown().await;
            tracing::info!("lan: node stopped");
        }
    }

    /// Keeps the node in step with the setting, the contacts and the key's age, until shutdown
    /// (then stops it).
    pub(super) async fn lan_supervisor_loop(self) {
        self.inner.lan.long_lived.store(true, Ordering::SeqCst);
        let mut stop = self.inner.shutdown.subscribe();
        loop {
            if let Err(e) = self.lan_tick().await {
                tracing::warn!("lan: {e}");
            }
            tokio::select! {
                _ = tokio::time::sleep(SUPERVISOR_TICK) => {}
                _ = stop.changed() => break,
            }
        }
        self.lan_stop().await;
    }

    async fn lan_tick(&self) -> Result<()> {
        if !self.lan_enabled().await? {
            self.lan_stop().await;
            return Ok(());
        }
        let due = {
            let life = self.inner.lan.life.lock().await;
            let pins = self.lan_pins().await?;
            if **life.pins.borrow() != *pins {
                life.pins.send_replace(pins);
            }
            let running = self.inner.lan.handle().is_some_and(|h| h.is_running());
            let unbound_am = !life.bound_agent_mail && self.inner.agent_mail.signing_key().await.is_some();
            running && (now_ms() - life.key_created_at >= LAN_KEY_LIFETIME_MS || unbound_am)
        };
        if due {
            // A new day, a new PeerId (or a new identity to bind): restart with fresh bindings.
            self.lan_stop().await;
        }
        self.lan_start().await
    }

    /// Direct deliveries from bound contacts: each goes through its channel's receive path,
    /// committed before the answer.
    async fn lan_inbound_loop(self, mut inbound: mpsc::Receiver<Inbound>) {
        while let Some(msg) = inbound.recv().await {
            let sealed = msg.delivery.sealed();
            let result = match self.protocol_of_lan_tag(msg.delivery.protocol()) {
                Some(p) => self.channel(p).receive_direct(&self, sealed).await,
                None => Err(super::Error::Bug(format!("no channel takes {:?}", msg.delivery.protocol()))),
            };
            match result {
                Ok(_) => msg.reply.stored(),
                Err(e) => {
                    tracing::warn!("lan: direct delivery not stored: {e}");
                    msg.reply.refuse(Refusal::Unavailable);
                }
            }
        }
    }

    /// Offers an outbox row to its contact directly when that contact is nearby. `true` when the
    /// receiver stored it (committed); `false` means "take the relay".
    pub(super) async fn lan_try_direct(&self, row: &OutboxRow) -> bool {
        let Some(tag) = self.channel(row.protocol).lan_tag() else { return false };
        let Some(handle) = self.inner.lan.handle() else { return false };
        let nearby = handle.nearby();
        if nearby.is_empty() {
            return false;
        }
        let contact = match self.store().outbox_contact(row).await {
            Ok(Some(c)) if nearby.contains(&c) => c,
            _ => return false,
        };
        match handle.deliver(contact, tag, row.payload.clone()).await {
            Ok(_) => true,
            Err(e) => {
                tracing::info!("lan: direct delivery of {} failed, taking the relay: {e}", row.message_id);
                false
            }
        }
    }
}
