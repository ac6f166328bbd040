//! The engine: the one place that joins protocol state machines, the store and the transports.
//!
//! - Outgoing: a message is built, sealed and committed (message row + outbox row + audit) in one
//!   transaction before anything touches the network; the outbox worker then posts the exact bytes
//!   with bounded exponential backoff and jitter until the relay takes them.
//! - Incoming: each envelope is opened and judged by the sans-io `receive::decide`; every effect
//!   (seen id, message, contact change, receipt, audit) commits in one transaction, and only then
//!   is the relay told to delete it.
//! - A runtime is either long-lived (`daemon`, the desktop app: websocket + outbox worker) or
//!   one-shot (a CLI command with no daemon running: it syncs, does its work and exits).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Notify, broadcast, watch};

use crate::identity::DeviceIdentity;
use crate::identity::keystore::{Keystore, KeystoreError, KeystoreKind, KeystorePreference};
use crate::profile::Profile;
use crate::protocol::letagents::inner::RosterEntry;
use crate::protocol::letagents::{self as la, Kind, PeerKeys, STALE_AFTER_MS};
use crate::store::ContactState;
use crate::store::{self, Store};
use crate::transport::letagents::RelayClient;

mod agents;
mod asnet;
mod channels;
mod contacts;
mod delivery;
mod dispatch;
mod error;
mod groups;
mod lan;
mod outbox;
mod people;
mod relays;
mod supervise;

pub use agents::Caller;
pub use channels::Protocol;
pub use delivery::{LEASE_MS, SenderAuth, fence};
pub use error::{Error, Fault, Result};
pub use groups::random_handle;
pub use lan::LAN_DEFAULT_ON;
pub use outbox::FALL_BACK_UNREACHABLE_AFTER_MS;
pub use outbox::{BACKOFF_BASE_MS, BACKOFF_CAP_MS, backoff_ms};
pub use people::CHANNEL_ORDER;

use crate::util::{OsRng, b64u, b64u_array, hex_decode, now_ms};
use channels::{AgentMail, Letagents, Outgoing, Stringcup};

const DEFAULT_ALLOW: &str = "send,ask,reply,list";
/// Most pending contact requests kept; further hellos from strangers are dropped.
pub const MAX_PENDING_REQUESTS: i64 = 100;

/// Something a UI or waiting agent may care about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message was stored that `inbox` will show.
    Message {
        /// Its id.
        id: String,
    },
    /// A contact request arrived.
    Request {
        /// The pending contact's name.
        name: String,
    },
    /// An outgoing message changed state.
    Delivery {
        /// Its id.
        id: String,
        /// New state.
        state: String,
    },
    /// A contact's key changed.
    KeyChanged {
        /// The contact.
        name: String,
    },
    /// The operator resumed a conversation the loop guard had paused.
    Resumed {
        /// The contact's row id.
        contact_id: i64,
    },
    /// Do-not-disturb was switched on or off.
    Dnd {
        /// Whether it is on now.
        on: bool,
    },
    /// Operator input in a letmeknow group (the owner sent, resumed, or approved a held send):
    /// the loop guard counts from here and releases what it paused.
    GroupResumed {
        /// The group session.
        handle: String,
        /// The group.
        group: String,
    },
    /// A letmeknow group was renamed, or an invite to it was used or ended.
    GroupChanged {
        /// The group.
        group: String,
    },
    /// A letmeknow group message or alert from someone else was stored for a local session.
    GroupMessage {
        /// The group session.
        handle: String,
        /// The group.
        group: String,
        /// The row's id (a message id, or `alert:…`).
        id: String,
        /// The sender's display name (empty for an alert, which the runtime wrote).
        from: String,
        /// Sent by another group session of this profile (one's own message).
        own: bool,
    },
}

/// The relay connection as `status` reports it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RelayHealth {
    /// connected, disconnected, unknown.
    pub state: String,
    /// Last error.
    pub last_error: String,
    /// Last change (ms).
    pub since: i64,
}

struct Inner_ {
    profile: Profile,
    store: Store,
    id: DeviceIdentity,
    name: String,
    keystore: String,
    keys: Arc<Keystore>,
    /// The profile's own relay: replaced whole when the owner moves to another
    /// ([`Runtime::relay_move`]); everyone reads it through [`Runtime::relay_url`] and
    /// [`Runtime::relay`].
    own: std::sync::RwLock<OwnRelay>,
    /// Counts moves of the own relay: receive loops bound to the old relay end when it changes.
    relay_generation: watch::Sender<u64>,
    /// Held through a relay move, so two moves never interleave.
    moving: tokio::sync::Mutex<()>,
    /// The 1:1 protocols, each with its own state; `Runtime::channel` picks one.
    letagents: Letagents,
    stringcup: Stringcup,
    agent_mail: AgentMail,
    events: broadcast::Sender<Event>,
    outbox_wake: Notify,
    listeners: AtomicUsize,
    health: std::sync::Mutex<RelayHealth>,
    shutdown: watch::Sender<bool>,
    /// letmeknow sessions and invite admissions.
    groups: groups::Groups,
    /// The LAN layer (issue 17): setting, node, nearby contacts.
    lan: lan::Lan,
}

/// The profile's own relay: its URL (no trailing slash) and a client for it.
#[derive(Clone)]
struct OwnRelay {
    url: String,
    client: RelayClient,
}

/// One profile's runtime. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner_>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Runtime({})", self.inner.profile.dir.display())
    }
}

/// Options for `init`.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// Display name.
    pub name: String,
    /// Relay base URL.
    pub relay: String,
    /// Pinned relay certificate (hex SHA-256).
    pub relay_cert_sha256: Option<String>,
    /// Where to keep the secret keys.
    pub keystore: KeystorePreference,
}

/// First run's check that a relay answers at `url` (with the certificate `pin`, hex SHA-256, if
/// given), before an identity is made for it. `Runtime::init` itself accepts a relay that is down
/// (the command line may set up offline); a window asks this first, so the person hears what
/// failed instead of getting an identity without its relay addresses.
pub async fn check_relay(url: &str, pin: Option<&str>) -> Result<()> {
    let client = RelayClient::new(url, parse_pin(pin)?)?;
    client.probe().await.map_err(|e| {
        let why = match e {
            crate::transport::TransportError::Unreachable(why) => why,
            other => other.to_string(),
        };
        // The OS's error number means nothing to the person reading this.
        let why = without_os_error(&why);
        Error::Transport(crate::transport::TransportError::Unreachable(format!(
            "the relay at {} did not answer ({why})",
            url.trim_end_matches('/')
        )))
    })
}

/// `text` without the ` (os error N)` the OS's errors end with.
fn without_os_error(text: &str) -> String {
    let Some(at) = text.find(" (os error ") else { return text.to_owned() };
    let rest = text.get(at + " (os error ".len()..).unwrap_or_default();
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    match rest.get(digits..) {
        Some(after) if digits > 0 && after.starts_with(')') => {
            format!("{}{}", text.get(..at).unwrap_or_default(), after.get(1..).unwrap_or_default())
        }
        _ => text.to_owned(),
    }
}

fn parse_pin(hex: Option<&str>) -> Result<Option<[u8; 32]>> {
    match hex {
        None | Some("") => Ok(None),
        Some(h) => {
            let clean: String = h.chars().filter(|c| *c != ':').collect();
            let bytes = hex_decode(&clean).ok_or_else(|| Error::Invalid("certificate pin is not hex".into()))?;
            Ok(Some(
                bytes.try_into().map_err(|_| Error::Invalid("certificate pin must be 32 bytes of SHA-256".into()))?,
            ))
        }
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::Bug(e.to_string()))
}

fn kinds_to_string(kinds: &[String]) -> Result<String> {
    let mut out = Vec::new();
    for k in kinds.iter().flat_map(|k| k.split(',')).map(str::trim).filter(|k| !k.is_empty()) {
        let kind = Kind::parse(k).filter(|k| Kind::ALLOWABLE.contains(k));
        if kind.is_none() {
            return Err(Error::Invalid(format!("`{k}` is not an allowable kind (send, ask, reply, list)")));
        }
        if !out.contains(&k) {
            out.push(k);
        }
    }
    Ok(out.join(","))
}

/// A message as clients see it; `auth` is what its protocol proves about the sender (shown on
/// incoming messages).
fn message_dto(m: &store::MessageRow, contact: Option<&str>, auth: SenderAuth) -> Value {
    let body = match m.kind.as_str() {
        "roster" | "receipt" => serde_json::from_str(&m.body).unwrap_or(Value::String(m.body.clone())),
        _ => Value::String(m.body.clone()),
    };
    json!({
        "id": m.id,
        "protocol": m.protocol,
        "direction": m.direction,
        "from": if m.direction == "in" { contact.unwrap_or(&m.peer) } else { "me" },
        "to": if m.direction == "out" { contact.unwrap_or(&m.peer) } else { "me" },
        "peer": m.peer,
        "kind": m.kind,
        "body": body,
        "reply_to": m.reply_to,
        "from_agent": m.from_agent,
        "to_agent": m.to_agent,
        "ts": m.ts,
        "state": m.state,
        "detail": m.detail,
        "sender_auth": if m.direction == "in" { Value::from(auth.as_str()) } else { Value::Null },
        "path": m.path,
        "fallback_of": m.fallback_of,
    })
}

impl Runtime {
    /// Creates the profile: keys in the keystore, public values in the database.
    pub async fn init(profile: &Profile, opts: InitOptions) -> Result<Runtime> {
        profile.ensure_dir()?;
        if opts.name.trim().is_empty() || opts.name.len() > 64 {
            return Err(Error::Invalid("name must be 1 to 64 characters".into()));
        }
        crate::transport::letagents::parse_relay_url(&opts.relay)?;
        let pin = parse_pin(opts.relay_cert_sha256.as_deref())?;
        let store = Store::open(&profile.db_path()).await?;
        if store.meta("name").await?.is_some() {
            return Err(Error::AlreadyInitialized);
        }
        let account = uuid::Uuid::new_v4().to_string();
        let dir = profile.dir.clone();
        let acct = account.clone();
        let pref = opts.keystore;
        let keystore = blocking(move || Keystore::choose(pref, &dir, &acct)).await??;
        let id = DeviceIdentity::generate(&mut OsRng);
        let secret = id.secret_bytes();
        let ks = Arc::new(keystore);
        let ks2 = ks.clone();
        blocking(move || ks2.save(&secret)).await??;

        let mut tx = store.write_tx().await?;
        for (k, v) in [
            ("name", opts.name.trim().to_owned()),
            ("relay_url", opts.relay.trim_end_matches('/').to_owned()),
            ("relay_cert_sha256", pin.map(|p| crate::util::hex(&p)).unwrap_or_default()),
            ("keystore", ks.kind().as_str().to_owned()),
            ("keystore_note", ks.fallback_reason.clone().unwrap_or_default()),
            ("account", account),
            ("letagents_drop", b64u(&id.drop)),
            ("letagents_sig_pub", b64u(&id.keys().sig)),
        ] {
            store::set_meta(&mut tx, k, &v).await?;
        }
        tx.commit().await?;
        drop(store);
        let rt = Self::open(profile).await?;
        // Each protocol's first contact with the relay (log in, register, publish): a relay that
        // is down now is not an error for init; the runtime tries again when next needed.
        for p in Protocol::ALL {
            rt.channel(p).init(&rt).await?;
        }
        Ok(rt)
    }

    /// Opens an initialised profile. The caller holds the profile lock.
    pub async fn open(profile: &Profile) -> Result<Runtime> {
        if !profile.is_initialized() {
            return Err(Error::NotInitialized);
        }
        let store = Store::open(&profile.db_path()).await?;
        let meta = |k: &'static str| {
            let store = store.clone();
            async move { store.meta(k).await.map(Option::unwrap_or_default) }
        };
        let name = meta("name").await?;
        if name.is_empty() {
            return Err(Error::NotInitialized);
        }
        let kind = KeystoreKind::parse(&meta("keystore").await?).ok_or(Error::NotInitialized)?;
        let note = meta("keystore_note").await?;
        let account = meta("account").await?;
        let drop = b64u_array::<16>(&meta("letagents_drop").await?).ok_or_else(|| Error::Bug("drop code".into()))?;
        let dir = profile.dir.clone();
        let ks = blocking(move || Keystore::open(kind, &dir, &account)).await??;
        let mut keystore_desc = ks.describe();
        if kind == KeystoreKind::File && !note.is_empty() {
            keystore_desc = format!("file {} (0600; {note})", profile.dir.join("keys.secret").display());
        }
        let ks = Arc::new(ks);
        let ks2 = ks.clone();
        let secret = blocking(move || ks2.load()).await??.ok_or(KeystoreError::Corrupt)?;
        let id = DeviceIdentity::from_secret(&secret, drop).ok_or(KeystoreError::Corrupt)?;
        if b64u(&id.keys().sig) != meta("letagents_sig_pub").await? {
            return Err(Error::Keystore(KeystoreError::Corrupt));
        }
        let relay_url = meta("relay_url").await?;
        let pin = parse_pin(Some(&meta("relay_cert_sha256").await?))?;
        let relay = RelayClient::new(&relay_url, pin)?;
        let stringcup = Stringcup::load(&store, &ks, &relay).await?;
        let agent_mail = AgentMail::load(&store, &ks, &relay_url).await?;
        let (events, _) = broadcast::channel(256);
        let (shutdown, _) = watch::channel(false);
        Ok(Runtime {
            inner: Arc::new(Inner_ {
                profile: profile.clone(),
                store,
                id,
                name,
                keystore: keystore_desc,
                keys: ks,
                own: std::sync::RwLock::new(OwnRelay { url: relay_url, client: relay }),
                relay_generation: watch::channel(0).0,
                moving: tokio::sync::Mutex::new(()),
                letagents: Letagents::default(),
                stringcup,
                agent_mail,
                events,
                outbox_wake: Notify::new(),
                listeners: AtomicUsize::new(0),
                health: std::sync::Mutex::new(RelayHealth { state: "unknown".into(), ..Default::default() }),
                shutdown,
                groups: groups::Groups::default(),
                lan: lan::Lan::default(),
            }),
        })
    }

    /// The store (tests and the bridge read it).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.inner.profile
    }

    /// Subscribes to events.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    /// Our letagents keys.
    pub fn keys(&self) -> PeerKeys {
        self.inner.id.keys()
    }

    /// The URL of the profile's own relay (no trailing slash).
    pub fn relay_url(&self) -> String {
        self.own_relay().url
    }

    /// A client for the profile's own relay.
    pub(crate) fn relay(&self) -> RelayClient {
        self.own_relay().client
    }

    fn own_relay(&self) -> OwnRelay {
        // A poisoned lock still holds a whole value: it is only ever replaced, never half-written.
        self.inner.own.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Asks background loops to stop.
    pub fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
    }

    fn emit(&self, e: Event) {
        let _ = self.inner.events.send(e);
    }

    fn set_health(&self, state: &str, err: &str) {
        if let Ok(mut h) = self.inner.health.lock()
            && (h.state != state || h.last_error != err)
        {
            *h = RelayHealth { state: state.into(), last_error: err.into(), since: now_ms() };
        }
    }

    async fn whoami(&self) -> Result<Value> {
        let mut v = serde_json::Map::new();
        v.insert("name".into(), json!(self.inner.name));
        v.insert("profile".into(), json!(self.inner.profile.dir.display().to_string()));
        v.insert("keystore".into(), json!(self.inner.keystore));
        // The one thing to share: every address below, signed, with one safety number.
        v.insert("contact_link".into(), self.whoami_link().await);
        // One section per protocol: a new channel shows up here (and in the UI) by itself.
        for p in Protocol::ALL {
            let (key, section) = self.channel(p).whoami(self).await;
            v.insert(key.into(), section);
        }
        Ok(Value::Object(v))
    }

    async fn status(&self) -> Result<Value> {
        let health = self.inner.health.lock().map(|h| h.clone()).unwrap_or_default();
        Ok(json!({
            "pid": std::process::id(),
            "profile": self.inner.profile.dir.display().to_string(),
            "bridge": self.inner.profile.read_bridge_files().map(|(p, _)| format!("http://127.0.0.1:{p}")),
            "keystore": self.inner.keystore,
            "relays": self.relays_status(health).await?,
            "outbox": self.store().outbox_len().await?,
            "agent_mail": self.inner.agent_mail.agent_mail_whoami(self).await,
            "agents": self.store().agents().await?,
            "dnd": self.dnd().await?,
            "lan": self.lan_status().await?,
        }))
    }

    /// The relays the profile reads, its own first: its own with the connection's health and
    /// what lives there, then each other one still read (drained after a move, kept for
    /// Stringcup contacts, a group's log) with why.
    async fn relays_status(&self, health: RelayHealth) -> Result<Value> {
        let own = self.relay_url();
        let d = self.store().own_relay_dependents(&own).await?;
        let mut relays = vec![json!({
            "url": own,
            "own": true,
            // The live connection is the letagents inbox's websocket.
            "protocol": Protocol::Letagents,
            "health": health,
            // The people whose letagents and Agent Mail messages reach us here.
            "people": d.people_told,
            "stringcup": d.stringcup,
            "groups": d.groups,
        })];
        for r in self.store().other_relays(own.trim_end_matches('/'), now_ms()).await? {
            relays.push(json!({
                "url": r.url,
                "own": false,
                "drain_until": r.drain_until,
                "stringcup": r.stringcup,
                "groups": r.groups,
            }));
        }
        Ok(Value::Array(relays))
    }

    async fn agents(&self) -> Result<Value> {
        serde_json::to_value(self.store().agents().await?).map_err(|e| Error::Bug(e.to_string()))
    }

    async fn message_view(&self, id: &str) -> Result<Value> {
        let m = match self.store().message("out", id)? {
            Some(m) => m,
            None => self.store().message("in", id)?.ok_or_else(|| Error::UnknownMessage(id.into()))?,
        };
        let name = match m.contact_id {
            Some(id) => self.store().display_names(&[id])?.remove(&id),
            None => None,
        };
        let mut view = [message_dto(&m, name.as_deref(), self.channel(m.protocol).sender_auth())];
        self.inner.agent_mail.agent_mail_decorate(self, &mut view).await?;
        let [view] = view;
        Ok(view)
    }

    async fn conversation(&self, name: &str, limit: Option<i64>) -> Result<Value> {
        if let Some(p) = self.store().person_by_name(name)? {
            return self.person_conversation(&p, limit).await;
        }
        let c = self.contact(name).await?;
        let rows = self.store().conversation_page(c.id, limit.unwrap_or(500).clamp(1, 10_000)).await?;
        let auth = self.channel(c.protocol).sender_auth();
        let mut views: Vec<Value> = rows.iter().map(|m| message_dto(m, Some(&c.name), auth)).collect();
        self.inner.agent_mail.agent_mail_decorate(self, &mut views).await?;
        self.handout_decorate(&rows, &mut views).await?;
        Ok(Value::Array(views))
    }

    async fn agent_register(&self, name: &str, harness: &str) -> Result<()> {
        if name.is_empty() || name.len() > la::inner::MAX_AGENT_NAME || name.contains('/') {
            return Err(Error::Invalid("agent name must be 1 to 128 characters without `/`".into()));
        }
        self.store().register_agent(name, harness, &format!("{}/{}", self.inner.name, name), now_ms()).await?;
        self.send_presence().await
    }

    async fn agent_unregister(&self, name: &str) -> Result<()> {
        if !self.store().unregister_agent(name).await? {
            return Err(Error::Invalid(format!("no local agent named `{name}`")));
        }
        self.send_presence().await
    }

    async fn roster(&self) -> Result<Value> {
        let entries: Vec<RosterEntry> = self
            .store()
            .agents()
            .await?
            .into_iter()
            .map(|a| RosterEntry { name: a.name, harness: a.harness, status: a.status, where_: a.where_ })
            .collect();
        serde_json::to_value(entries).map_err(|e| Error::Bug(e.to_string()))
    }

    /// The set of local agents changed: tell every active contact.
    async fn send_presence(&self) -> Result<()> {
        let roster = self.roster().await?;
        for c in self.store().contacts(Some(ContactState::Active)).await? {
            if c.changed_box_pub.is_some() || !self.channel(c.protocol).carries_roster() {
                continue;
            }
            self.send(&c.name, Kind::Roster, roster.clone(), None, None, None).await?;
        }
        Ok(())
    }

    // ----- sending ------------------------------------------------------------------------

    /// Builds, seals and queues a message to contact `name`. Returns its id.
    pub async fn send(
        &self,
        name: &str,
        kind: Kind,
        body: Value,
        reply_to: Option<&str>,
        from_agent: Option<&str>,
        to_agent: Option<&str>,
    ) -> Result<String> {
        // A person: the first usable channel in `CHANNEL_ORDER`; the outbox falls back from there.
        // A reply goes back on the channel its message came from, while that channel is usable.
        let (c, kind, reply_to) = match self.store().person_by_name(name)? {
            Some(p) => self.person_route(&p, kind, reply_to).await?,
            None => (self.contact(name).await?, kind, reply_to),
        };
        if c.blocked {
            return Err(Error::Blocked(name.into()));
        }
        if c.state != ContactState::Active {
            return Err(Error::Pending(name.into()));
        }
        if c.changed_box_pub.is_some() {
            return Err(Error::KeyChanged(name.into()));
        }
        let msg = Outgoing { kind, body, reply_to, from_agent, to_agent };
        self.channel(c.protocol).send(self, &c, msg).await
    }

    /// Reads everything waiting at the relay for every protocol, processes and acks it.
    pub async fn sync(&self) -> Result<usize> {
        let mut n = 0;
        for p in Protocol::ALL {
            n += self.channel(p).sync(self).await?;
        }
        // Relays moved away from, while they drain.
        n += self.drain_old_relays().await;
        Ok(n)
    }

    async fn sync_best_effort(&self) {
        if let Err(e) = self.sync().await {
            tracing::debug!("sync: {e}");
        }
        let _ = self.flush_once(true).await;
    }

    async fn inbox(&self, all: bool, wait_secs: u64, one_shot: bool) -> Result<Value> {
        let mut events = self.subscribe();
        let _listening = ListenerGuard::new(&self.inner.listeners);
        if one_shot {
            self.sync().await?;
            let _ = self.flush_once(true).await;
        }
        let rows = self.store().inbox(all, 1000)?;
        if rows.is_empty() && wait_secs > 0 {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_secs.min(3600));
            if one_shot {
                // No daemon: hold the letagents websocket and the Stringcup long-poll ourselves
                // until something arrives on either.
                let runs = Protocol::ALL.map(|p| self.channel(p).run(self, true));
                let _ = tokio::time::timeout_at(deadline, futures_util::future::select_all(runs)).await;
                let _ = self.flush_once(true).await;
            } else {
                loop {
                    match tokio::time::timeout_at(deadline, events.recv()).await {
                        Ok(Ok(Event::Message { .. })) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => break,
                        Ok(Ok(_)) => continue,
                        Ok(Err(_)) | Err(_) => break,
                    }
                }
            }
            let new = self.store().inbox(all, 1000)?;
            return self.hand_inbox(&new).await;
        }
        self.hand_inbox(&rows).await
    }

    /// The inbox's answer: `rows` as views (senders by display name: a channel of a person by
    /// the person's), marked shown.
    async fn hand_inbox(&self, rows: &[crate::store::MessageRow]) -> Result<Value> {
        let mut ids: Vec<i64> = rows.iter().filter_map(|m| m.contact_id).collect();
        ids.sort_unstable();
        ids.dedup();
        let names = self.store().display_names(&ids)?;
        let mut out: Vec<Value> = rows
            .iter()
            .map(|m| {
                message_dto(
                    m,
                    m.contact_id.and_then(|id| names.get(&id)).map(String::as_str),
                    self.channel(m.protocol).sender_auth(),
                )
            })
            .collect();
        self.inner.agent_mail.agent_mail_decorate(self, &mut out).await?;
        let ids: Vec<i64> = rows.iter().filter(|m| !m.shown).map(|m| m.rowid_).collect();
        self.store().mark_shown(&ids).await?;
        Ok(Value::Array(out))
    }

    async fn housekeeping_loop(self) {
        let mut stop = self.inner.shutdown.subscribe();
        loop {
            let _ = self.store().prune_seen(now_ms() - STALE_AFTER_MS - la::MAX_FUTURE_SKEW_MS - 3_600_000).await;
            // The decrypted group log goes after the group TTL (seed 001, "Crypto").
            let ttl_ms = i64::try_from(crate::protocol::letmeknow::LOG_TTL_SECS * 1000).unwrap_or(i64::MAX);
            if let Err(e) = self.store().expire_group_log(now_ms() - ttl_ms).await {
                tracing::warn!("deleting the group log past its TTL: {e}");
            }
            // Deleted rows free their rowids for reuse: the gap check reads whole logs again.
            self.inner.groups.forget_gap_marks();
            for p in Protocol::ALL {
                self.channel(p).housekeeping(&self).await;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// Starts the long-lived loops (websocket receiver, outbox worker, housekeeping, letmeknow
    /// group followers, the LAN supervisor).
    /// Each runs under `supervise::supervise`: one that ends or panics before shutdown is
    /// logged and started again after a backoff (up to 30 s).
    pub fn start_background(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let restart = supervise::Restart::RUNTIME;
        let stop = || self.inner.shutdown.subscribe();
        let mut loops: Vec<_> = Protocol::ALL
            .into_iter()
            .map(|p| {
                let rt = self.clone();
                supervise::supervise(format!("{p} receiver"), stop(), restart, move || {
                    let rt = rt.clone();
                    async move {
                        // A receiver is bound to the relay it started on: when the owner moves,
                        // it ends there and starts again on the new one.
                        let mut moved = rt.inner.relay_generation.subscribe();
                        moved.borrow_and_update();
                        loop {
                            tokio::select! {
                                r = rt.channel(p).run(&rt, false) => {
                                    if let Err(e) = r {
                                        tracing::warn!("{p} receiver stopped: {e}");
                                    }
                                    return;
                                }
                                changed = moved.changed() => {
                                    if changed.is_err() {
                                        return;
                                    }
                                    tracing::info!("{p} receiver: the relay moved, starting again there");
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        let rt = self.clone();
        loops.push(supervise::supervise("outbox".into(), stop(), restart, move || rt.clone().outbox_loop()));
        let rt = self.clone();
        loops
            .push(supervise::supervise("housekeeping".into(), stop(), restart, move || rt.clone().housekeeping_loop()));
        let rt = self.clone();
        loops.push(supervise::supervise("letmeknow followers".into(), stop(), restart, move || {
            rt.clone().lmk_background_loop()
        }));
        let rt = self.clone();
        loops.push(supervise::supervise("LAN supervisor".into(), stop(), restart, move || {
            rt.clone().lan_supervisor_loop()
        }));
        let rt = self.clone();
        loops.push(supervise::supervise("ASNET".into(), stop(), restart, move || rt.clone().asnet_loop()));
        let rt = self.clone();
        loops.push(supervise::supervise("old relays".into(), stop(), restart, move || rt.clone().old_relays_loop()));
        let rt = self.clone();
        loops.push(supervise::supervise("stringcup on old relays".into(), stop(), restart, move || {
            let rt = rt.clone();
            async move { rt.inner.stringcup.stringcup_kept_loop(&rt).await }
        }));
        loops
    }

    /// Counts a live listener (an agent waiting for deliveries) while the guard lives.
    pub fn listening(&self) -> ListenerGuard<'_> {
        ListenerGuard::new(&self.inner.listeners)
    }
}

/// While alive, incoming messages are receipted as `pushed` rather than `queued`.
#[derive(Debug)]
pub struct ListenerGuard<'a>(&'a AtomicUsize);

impl<'a> ListenerGuard<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Self(n)
    }
}

impl Drop for ListenerGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_relay_that_does_not_answer_is_described_without_the_os_error_number() {
        assert_eq!(super::without_os_error("Connection refused (os error 111)"), "Connection refused");
        assert_eq!(super::without_os_error("x (Connection refused (os error 111))"), "x (Connection refused)");
        assert_eq!(super::without_os_error("timed out"), "timed out");
        assert_eq!(super::without_os_error("odd (os error x)"), "odd (os error x)");
    }

    use super::*;

    #[test]
    fn allow_lists_are_validated() {
        assert_eq!(kinds_to_string(&["send,ask".into(), "ask".into()]).unwrap(), "send,ask");
        assert!(kinds_to_string(&["roster".into()]).is_err());
        assert!(kinds_to_string(&["bogus".into()]).is_err());
    }
}
