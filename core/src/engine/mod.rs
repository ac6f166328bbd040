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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{Mutex, Notify, broadcast, watch};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::bridge::api::{ApiError, Request};
use crate::identity::DeviceIdentity;
use crate::identity::keystore::{Keystore, KeystoreError, KeystoreKind, KeystorePreference};
use crate::profile::Profile;
use crate::protocol::letagents::inner::{ReceiptBody, ReceiptStatus, RosterEntry};
use crate::protocol::letagents::receive::{AgentRule, ContactView, RuleAction, Verdict, accepted_status, decide};
use crate::protocol::letagents::wire::{ClientToRelay, RelayToClient};
use crate::protocol::letagents::{self as la, Address, Inner, Kind, PeerKeys, STALE_AFTER_MS};
use crate::store::{self, Audit, ContactRow, NewContact, NewMessage, OutboxRow, Store, StoreError};
use crate::transport::TransportError;
use crate::transport::letagents::{RelayClient, SendOutcome};
use crate::transport::stringcup::StringcupClient;

mod agent_mail;
mod agents;
mod delivery;
mod groups;
mod stringcup;

pub use agents::Caller;
pub use delivery::{LEASE_MS, fence};
pub use groups::random_handle;

const SC: &str = "stringcup";
use crate::util::{OsRng, b64u, b64u_array, hex_decode, now_ms, random_array};
use agent_mail::AM;

const PROTO: &str = "letagents";
const DEFAULT_ALLOW: &str = "send,ask,reply,list";
/// Most pending contact requests kept; further hellos from strangers are dropped.
pub const MAX_PENDING_REQUESTS: i64 = 100;
/// First retry delay.
pub const BACKOFF_BASE_MS: i64 = 500;
/// Largest retry delay.
pub const BACKOFF_CAP_MS: i64 = 30_000;

/// Engine errors, each with a stable code for clients.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `init` has not run for this profile.
    #[error("profile not initialised: run `switchboard init --name NAME --relay URL`")]
    NotInitialized,
    /// `init` already ran.
    #[error("profile already initialised")]
    AlreadyInitialized,
    /// No such contact.
    #[error("no contact named `{0}`")]
    UnknownContact(String),
    /// The name or peer is already a contact.
    #[error("{0}")]
    ContactExists(String),
    /// Sending is blocked until the user re-verifies.
    #[error("{0}'s key changed: compare the new safety number and run `switchboard contact verify {0}` before sending")]
    KeyChanged(String),
    /// The contact has not been accepted.
    #[error("`{0}` is a pending request: accept it first")]
    Pending(String),
    /// The caller gave something invalid.
    #[error("{0}")]
    Invalid(String),
    /// No message with that id.
    #[error("no message with id `{0}`")]
    UnknownMessage(String),
    /// Local storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The keystore failed.
    #[error(transparent)]
    Keystore(#[from] KeystoreError),
    /// The relay failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Profile files.
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
    /// Something that cannot happen did.
    #[error("internal error: {0}")]
    Bug(String),
    /// The caller (an agent session) may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The loop guard paused this conversation until the operator resumes it.
    #[error("{0}")]
    LoopGuard(String),
}

impl Error {
    /// The stable code clients see.
    pub fn code(&self) -> &'static str {
        match self {
            Error::NotInitialized => "not_initialized",
            Error::AlreadyInitialized => "already_initialized",
            Error::UnknownContact(_) => "unknown_contact",
            Error::ContactExists(_) => "contact_exists",
            Error::KeyChanged(_) => "key_changed",
            Error::Pending(_) => "pending_contact",
            Error::Invalid(_) => "invalid_input",
            Error::UnknownMessage(_) => "unknown_message",
            Error::Store(StoreError::DiskFull(_)) => "disk_full",
            Error::Store(_) => "store",
            Error::Keystore(_) => "keystore",
            Error::Transport(_) => "relay",
            Error::Profile(_) => "profile",
            Error::Bug(_) => "internal",
            Error::Forbidden(_) => "forbidden",
            Error::LoopGuard(_) => "loop_guard",
        }
    }

    /// As it crosses to clients.
    pub fn to_api(&self) -> ApiError {
        ApiError { code: self.code().into(), message: self.to_string() }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Store(e.into())
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

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
    sc: Mutex<Option<stringcup::ScIdentity>>,
    am: Mutex<Option<agent_mail::AmState>>,
    sc_client: StringcupClient,
    relay_url: String,
    relay: RelayClient,
    peers: Mutex<BTreeMap<String, RelayClient>>,
    events: broadcast::Sender<Event>,
    outbox_wake: Notify,
    listeners: AtomicUsize,
    health: std::sync::Mutex<RelayHealth>,
    shutdown: watch::Sender<bool>,
    /// letmeknow sessions and invite admissions.
    groups: groups::Groups,
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

/// Full-jitter exponential backoff: a delay in [d/2, d] with d = min(cap, base * 2^attempt).
pub fn backoff_ms(attempt: u32) -> i64 {
    let d = BACKOFF_BASE_MS.saturating_mul(1i64 << attempt.min(20)).min(BACKOFF_CAP_MS);
    let r = i64::from(u16::from_le_bytes(random_array::<2>()));
    d / 2 + (d / 2) * r / i64::from(u16::MAX)
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

fn peer_keys(c: &ContactRow) -> Result<PeerKeys> {
    Ok(PeerKeys {
        sig: c.sig_pub.as_slice().try_into().map_err(|_| Error::Bug("stored sig key has the wrong length".into()))?,
        boxk: c.box_pub.as_slice().try_into().map_err(|_| Error::Bug("stored box key has the wrong length".into()))?,
    })
}

/// Records an incoming envelope that was refused before it could be attributed to anyone.
async fn audit_dropped(conn: &mut sqlx::SqliteConnection, now: i64, detail: &str) -> Result<()> {
    let audit =
        Audit { direction: "in", protocol: PROTO, peer: "", message_id: "", kind: "", state: "dropped", detail };
    Ok(store::audit(conn, now, audit).await?)
}

/// A contact as clients see it.
pub fn contact_dto(c: &ContactRow) -> Value {
    let keys = peer_keys(c).ok();
    let (safety, new_safety) = if c.protocol == AM {
        // Agent Mail's identity is the Agent ID itself; cards (and their keys) rotate under it.
        (Some(c.peer_id.clone()), None)
    } else if c.protocol == SC {
        // Stringcup has one key: the short fingerprint is what people compare (B.7).
        let short =
            |k: &[u8]| <[u8; 32]>::try_from(k).ok().map(|k| crate::protocol::stringcup::crypto::fingerprint_short(&k));
        (short(&c.box_pub), c.changed_box_pub.as_deref().and_then(short))
    } else {
        let new = match (&keys, &c.changed_box_pub) {
            (Some(k), Some(b)) => {
                b.as_slice().try_into().ok().map(|boxk| PeerKeys { sig: k.sig, boxk }.safety_number())
            }
            _ => None,
        };
        (keys.map(|k| k.safety_number()), new)
    };
    json!({
        "name": c.name,
        "protocol": c.protocol,
        "id": c.peer_id,
        "address": c.address,
        "safety_number": safety,
        "verified": c.verified,
        "state": c.state,
        "allow": c.allow_kinds.split(',').filter(|s| !s.is_empty()).collect::<Vec<_>>(),
        "key_changed": c.changed_box_pub.is_some(),
        "new_safety_number": new_safety,
        "relay": c.relay_url,
        "roster": serde_json::from_str::<Value>(&c.roster).unwrap_or(Value::Array(vec![])),
        "request": c.request_body,
    })
}

fn message_dto(m: &store::MessageRow, contact: Option<&str>) -> Value {
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

        let mut tx = store.pool.begin().await?;
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
        // Log in once: a letagents mailbox exists from its owner's first login, so contacts can
        // reach us right away. A relay that is down now is not an error for init.
        if let Err(e) = rt.sync().await {
            tracing::warn!("could not reach the relay yet: {e}");
        }
        // Register a Stringcup identity on the same relay, if it serves /api/v2; otherwise the
        // runtime tries again whenever Stringcup is first needed.
        if let Err(e) = rt.stringcup_identity().await {
            tracing::info!("no Stringcup identity yet: {e}");
        }
        // An Agent Mail mailbox: keys and the first card are made locally; publishing it is
        // retried whenever the relay is next reached.
        rt.am_state().await?;
        if let Err(e) = rt.agent_mail_publish().await {
            tracing::info!("Agent Mail card not published yet: {e}");
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
        let sc = stringcup::load_identity(&store, &ks).await?;
        let sc_client = StringcupClient::new(&relay);
        let am = agent_mail::load(&store, &ks, &relay_url).await?;
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
                sc: Mutex::new(sc),
                am: Mutex::new(am),
                sc_client,
                relay_url,
                relay,
                peers: Mutex::new(BTreeMap::new()),
                events,
                outbox_wake: Notify::new(),
                listeners: AtomicUsize::new(0),
                health: std::sync::Mutex::new(RelayHealth { state: "unknown".into(), ..Default::default() }),
                shutdown,
                groups: groups::Groups::default(),
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

    // ----- requests -----------------------------------------------------------------------

    /// Handles one request for the owner, after `agents::handle_as` applied the caller's
    /// permissions and the delivery policy. `one_shot` runtimes sync with the relay around it.
    async fn handle_core(&self, req: Request, one_shot: bool) -> Result<Value> {
        match req {
            Request::Whoami => self.whoami().await,
            Request::Status => self.status().await,
            Request::ContactAdd { address, name, allow, relay, no_hello } => {
                let v =
                    self.contact_add(&address, name.as_deref(), allow.as_deref(), relay.as_deref(), !no_hello).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                Ok(v)
            }
            Request::ContactList => {
                if one_shot {
                    self.sync_best_effort().await;
                }
                Ok(Value::Array(self.store().contacts(None).await?.iter().map(contact_dto).collect()))
            }
            Request::ContactRequests => {
                if one_shot {
                    self.sync_best_effort().await;
                }
                Ok(Value::Array(self.store().contacts(Some("pending")).await?.iter().map(contact_dto).collect()))
            }
            Request::ContactAccept { name } => self.contact_accept(&name).await,
            Request::ContactDeny { name } => self.contact_deny(&name).await,
            Request::ContactVerify { name } => self.contact_verify(&name).await,
            Request::ContactAllow { name, kinds } => self.contact_allow(&name, &kinds).await,
            Request::ContactRule { name, from, to, action } => self.contact_rule(&name, &from, &to, &action).await,
            Request::Send { contact, text, kind, reply_to, from_agent, to_agent } => {
                let kind = match kind.as_deref().unwrap_or("send") {
                    "send" => Kind::Send,
                    "ask" => Kind::Ask,
                    "reply" => Kind::Reply,
                    other => {
                        return Err(Error::Invalid(format!("cannot send kind `{other}` (send, ask, reply)")));
                    }
                };
                if kind == Kind::Reply && reply_to.is_none() {
                    return Err(Error::Invalid("a reply needs --reply-to ID".into()));
                }
                let id = self
                    .send(
                        &contact,
                        kind,
                        Value::String(text),
                        reply_to.as_deref(),
                        from_agent.as_deref(),
                        to_agent.as_deref(),
                    )
                    .await?;
                // Queued (committed) now: a failed first attempt is the outbox's to retry, not
                // an error that would invite a duplicate.
                if one_shot && let Err(e) = self.flush_once(true).await {
                    tracing::warn!("message {id} is queued; sending it now failed: {e}");
                }
                self.message_view(&id).await
            }
            Request::MailSend { contact, text, subject, reply_to } => {
                let c = self.contact(&contact).await?;
                if c.protocol != AM {
                    return Err(Error::Invalid(format!("`{contact}` is not an Agent Mail contact")));
                }
                if c.state != "active" {
                    return Err(Error::Pending(contact));
                }
                let kind = if reply_to.is_some() { "reply" } else { "send" };
                let id =
                    self.agent_mail_send(&c, kind, &text, reply_to.as_deref(), subject.as_deref(), None, None).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                self.message_view(&id).await
            }
            Request::List { contact } => {
                let id = self.send(&contact, Kind::List, Value::String(String::new()), None, None, None).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                self.message_view(&id).await
            }
            Request::Inbox { all, wait_secs } => self.inbox(all, wait_secs, one_shot).await,
            Request::Message { id } => self.message_view(&id).await,
            Request::Conversation { contact, limit } => self.conversation(&contact, limit).await,
            Request::Log { search, limit } => {
                let rows = self.store().audit_log(search.as_deref(), limit.unwrap_or(200).clamp(1, 10_000)).await?;
                Ok(serde_json::to_value(rows).map_err(|e| Error::Bug(e.to_string()))?)
            }
            Request::AgentRegister { name, harness } => {
                self.agent_register(&name, harness.as_deref().unwrap_or("cli")).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                self.agents().await
            }
            Request::AgentUnregister { name } => {
                self.agent_unregister(&name).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                self.agents().await
            }
            Request::AgentList => self.agents().await,
            Request::Flush => {
                self.flush_once(true).await?;
                Ok(json!({"queued": self.store().outbox_len().await?}))
            }
            Request::PairOpen => self.pair_open().await,
            Request::PairWait { token, name, timeout_secs } => {
                self.pair_wait(&token, name.as_deref(), timeout_secs.min(3600)).await
            }
            Request::TopicCreate { members } => self.topic_create(&members).await,
            Request::TopicSend { topic, text } => {
                let v = self.topic_send(&topic, &text).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                Ok(v)
            }
            Request::TokenRotate => self.stringcup_rotate_if_due(true).await,
            Request::MailRotate => self.agent_mail_rotate().await,
            Request::SessionOpen { .. }
            | Request::SessionClose
            | Request::Read { .. }
            | Request::Wait { .. }
            | Request::Unread { .. }
            | Request::Ack { .. }
            | Request::ReviewList
            | Request::ReviewApprove { .. }
            | Request::ReviewReject { .. }
            | Request::Policy { .. }
            | Request::ContactReview { .. }
            | Request::Resume { .. }
            | Request::Dnd { .. } => Err(Error::Bug("agent and policy requests are routed by handle_as".into())),
            group @ (Request::GroupSession { .. }
            | Request::GroupInvite { .. }
            | Request::GroupInviteWait { .. }
            | Request::GroupJoin { .. }
            | Request::GroupList { .. }
            | Request::GroupSend { .. }
            | Request::GroupRead { .. }
            | Request::GroupMembers { .. }
            | Request::GroupRemove { .. }
            | Request::GroupLeave { .. }
            | Request::GroupDeliveries { .. }
            | Request::GroupMode { .. }
            | Request::GroupResume { .. }) => self.handle_group(None, group).await,
        }
    }

    async fn whoami(&self) -> Result<Value> {
        let keys = self.keys();
        Ok(json!({
            "name": self.inner.name,
            "profile": self.inner.profile.dir.display().to_string(),
            "keystore": self.inner.keystore,
            "letagents": {
                "address": self.inner.id.address().to_string(),
                "mailbox_id": keys.mailbox_id(),
                "safety_number": keys.safety_number(),
                "relay": self.inner.relay_url,
            },
            "stringcup": self.stringcup_whoami().await,
            "agent_mail": self.agent_mail_whoami().await,
        }))
    }

    async fn status(&self) -> Result<Value> {
        let health = self.inner.health.lock().map(|h| h.clone()).unwrap_or_default();
        Ok(json!({
            "pid": std::process::id(),
            "profile": self.inner.profile.dir.display().to_string(),
            "bridge": self.inner.profile.read_bridge_files().map(|(p, _)| format!("http://127.0.0.1:{p}")),
            "keystore": self.inner.keystore,
            "relays": [{"protocol": PROTO, "url": self.inner.relay_url, "health": health}],
            "outbox": self.store().outbox_len().await?,
            "agent_mail": self.agent_mail_whoami().await,
            "agents": self.store().agents().await?,
            "dnd": self.dnd().await?,
        }))
    }

    async fn agents(&self) -> Result<Value> {
        serde_json::to_value(self.store().agents().await?).map_err(|e| Error::Bug(e.to_string()))
    }

    async fn message_view(&self, id: &str) -> Result<Value> {
        let m = match self.store().message("out", id).await? {
            Some(m) => m,
            None => self.store().message("in", id).await?.ok_or_else(|| Error::UnknownMessage(id.into()))?,
        };
        let name = self.contact_name(m.contact_id).await?;
        let mut view = [message_dto(&m, name.as_deref())];
        self.agent_mail_decorate(&mut view).await?;
        let [view] = view;
        Ok(view)
    }

    async fn conversation(&self, name: &str, limit: Option<i64>) -> Result<Value> {
        let c = self.contact(name).await?;
        let rows: Vec<store::MessageRow> = sqlx::query_as(
            "SELECT * FROM (SELECT * FROM messages WHERE contact_id = ?1 AND kind NOT IN ('receipt', 'roster') \
             ORDER BY rowid_ DESC LIMIT ?2) ORDER BY rowid_",
        )
        .bind(c.id)
        .bind(limit.unwrap_or(500).clamp(1, 10_000))
        .fetch_all(&self.store().pool)
        .await?;
        Ok(Value::Array(rows.iter().map(|m| message_dto(m, Some(&c.name))).collect()))
    }

    async fn contact_name(&self, id: Option<i64>) -> Result<Option<String>> {
        let Some(id) = id else { return Ok(None) };
        Ok(sqlx::query_scalar("SELECT name FROM contacts WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.store().pool)
            .await?)
    }

    async fn contact(&self, name: &str) -> Result<ContactRow> {
        self.store().contact_by_name(name).await?.ok_or_else(|| Error::UnknownContact(name.into()))
    }

    async fn contact_add(
        &self,
        address: &str,
        name: Option<&str>,
        allow: Option<&[String]>,
        relay: Option<&str>,
        hello: bool,
    ) -> Result<Value> {
        if crate::protocol::stringcup::wire::is_identity_id(address.trim()) {
            return self.stringcup_contact_add(address.trim(), name, allow).await;
        }
        if address.trim().starts_with(crate::protocol::agent_identity::agent_id::AGENT_ID_PREFIX) {
            return self.agent_mail_contact_add(address.trim(), name, allow).await;
        }
        let addr = Address::parse(address).map_err(|e| Error::Invalid(e.to_string()))?;
        let drop =
            addr.drop.ok_or_else(|| Error::Invalid("the address has no drop code: ask for the full address".into()))?;
        if addr.keys == self.keys() {
            return Err(Error::Invalid("that is our own address".into()));
        }
        if let Some(r) = relay {
            crate::transport::letagents::parse_relay_url(r)?;
        }
        let allow = match allow {
            Some(kinds) => kinds_to_string(kinds)?,
            None => DEFAULT_ALLOW.to_owned(),
        };
        let peer_id = addr.keys.mailbox_id();
        let now = now_ms();
        let mut tx = self.store().pool.begin().await?;
        let existing = store::contact_by_peer(&mut tx, PROTO, &peer_id).await?;
        let name = match existing {
            Some(c) if c.state == "pending" => {
                // They asked first: adding them is accepting them.
                let new_name = name.unwrap_or(&c.name).to_owned();
                if new_name != c.name && store::name_taken(&mut tx, &new_name).await? {
                    return Err(Error::ContactExists(format!("a contact named `{new_name}` already exists")));
                }
                sqlx::query("UPDATE contacts SET name = ?, state = 'active', allow_kinds = ?, drop_code = ?, address = ?, relay_url = ? WHERE id = ?")
                    .bind(&new_name)
                    .bind(&allow)
                    .bind(drop.as_slice())
                    .bind(addr.to_string())
                    .bind(relay)
                    .bind(c.id)
                    .execute(&mut *tx)
                    .await?;
                new_name
            }
            Some(c) => {
                return Err(Error::ContactExists(format!("already a contact, as `{}`", c.name)));
            }
            None => {
                let name = name.map(str::to_owned).unwrap_or_else(|| peer_id.chars().take(8).collect());
                if name.trim().is_empty() || name.len() > 64 {
                    return Err(Error::Invalid("contact name must be 1 to 64 characters".into()));
                }
                if store::name_taken(&mut tx, &name).await? {
                    return Err(Error::ContactExists(format!("a contact named `{name}` already exists")));
                }
                store::insert_contact(
                    &mut tx,
                    &NewContact {
                        name: &name,
                        protocol: PROTO,
                        peer_id: &peer_id,
                        address: &addr.to_string(),
                        sig_pub: &addr.keys.sig,
                        box_pub: &addr.keys.boxk,
                        drop_code: Some(&drop),
                        relay_url: relay,
                        state: "active",
                        allow_kinds: &allow,
                        request_body: "",
                        now,
                    },
                )
                .await?;
                name
            }
        };
        tx.commit().await?;
        if hello {
            self.send(&name, Kind::Hello, Value::String(self.inner.name.clone()), None, None, None).await?;
        }
        Ok(contact_dto(&self.contact(&name).await?))
    }

    async fn contact_accept(&self, name: &str) -> Result<Value> {
        let c = self.contact(name).await?;
        if c.state != "pending" {
            return Err(Error::Invalid(format!("`{name}` is not a pending request")));
        }
        let mut tx = self.store().pool.begin().await?;
        sqlx::query("UPDATE contacts SET state = 'active' WHERE id = ?").bind(c.id).execute(&mut *tx).await?;
        // Messages that arrived with the request (Stringcup has no hello) are shown now.
        sqlx::query("UPDATE messages SET state = 'received', shown = 0 WHERE contact_id = ? AND state = 'held'")
            .bind(c.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(contact_dto(&self.contact(name).await?))
    }

    async fn contact_deny(&self, name: &str) -> Result<Value> {
        let c = self.contact(name).await?;
        if c.state != "pending" {
            return Err(Error::Invalid(format!("`{name}` is not a pending request")));
        }
        sqlx::query("DELETE FROM contacts WHERE id = ?").bind(c.id).execute(&self.store().pool).await?;
        Ok(json!({"denied": name}))
    }

    async fn contact_verify(&self, name: &str) -> Result<Value> {
        let c = self.contact(name).await?;
        let mut tx = self.store().pool.begin().await?;
        if let Some(new_box) = &c.changed_box_pub {
            sqlx::query("UPDATE contacts SET box_pub = ?, changed_box_pub = NULL, key_changed_at = NULL, address = ? WHERE id = ?")
                .bind(new_box)
                .bind(if c.protocol == SC {
                    c.address.clone()
                } else {
                    let mut a = Address::parse(&c.address).map_err(|e| Error::Bug(e.to_string()))?;
                    a.keys.boxk = new_box.as_slice().try_into().map_err(|_| Error::Bug("box key length".into()))?;
                    a.to_string()
                })
                .bind(c.id)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("UPDATE contacts SET verified = 1 WHERE id = ?").bind(c.id).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(contact_dto(&self.contact(name).await?))
    }

    async fn contact_allow(&self, name: &str, kinds: &[String]) -> Result<Value> {
        let c = self.contact(name).await?;
        let allow = kinds_to_string(kinds)?;
        sqlx::query("UPDATE contacts SET allow_kinds = ? WHERE id = ?")
            .bind(allow)
            .bind(c.id)
            .execute(&self.store().pool)
            .await?;
        Ok(contact_dto(&self.contact(name).await?))
    }

    async fn contact_rule(&self, name: &str, from: &str, to: &str, action: &str) -> Result<Value> {
        let c = self.contact(name).await?;
        if !matches!(action, "allow" | "deny") {
            return Err(Error::Invalid("rule action must be allow or deny".into()));
        }
        for g in [from, to] {
            if g.is_empty() || g.trim_end_matches('*').contains('*') {
                return Err(Error::Invalid(format!("`{g}` is not a glob (`*`, `prefix*` or a name)")));
            }
        }
        sqlx::query(
            "INSERT INTO agent_rules (contact_id, position, from_glob, to_glob, action) \
             VALUES (?1, (SELECT COALESCE(MAX(position), 0) + 1 FROM agent_rules WHERE contact_id = ?1), ?2, ?3, ?4)",
        )
        .bind(c.id)
        .bind(from)
        .bind(to)
        .bind(action)
        .execute(&self.store().pool)
        .await?;
        let rules = store::rules_for(&mut *self.store().pool.acquire().await?, c.id).await?;
        Ok(
            json!({"name": name, "rules": rules.iter().map(|(f, t, a)| json!({"from": f, "to": t, "action": a})).collect::<Vec<_>>()}),
        )
    }

    async fn agent_register(&self, name: &str, harness: &str) -> Result<()> {
        if name.is_empty() || name.len() > la::inner::MAX_AGENT_NAME || name.contains('/') {
            return Err(Error::Invalid("agent name must be 1 to 128 characters without `/`".into()));
        }
        sqlx::query(
            "INSERT INTO agents (name, harness, status, where_, updated_at) VALUES (?, ?, 'online', ?, ?) \
             ON CONFLICT(name) DO UPDATE SET harness = excluded.harness, status = 'online', updated_at = excluded.updated_at",
        )
        .bind(name)
        .bind(harness)
        .bind(format!("{}/{}", self.inner.name, name))
        .bind(now_ms())
        .execute(&self.store().pool)
        .await?;
        self.send_presence().await
    }

    async fn agent_unregister(&self, name: &str) -> Result<()> {
        let n = sqlx::query("DELETE FROM agents WHERE name = ?")
            .bind(name)
            .execute(&self.store().pool)
            .await?
            .rows_affected();
        if n == 0 {
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
        for c in self.store().contacts(Some("active")).await? {
            if c.changed_box_pub.is_some() || c.protocol != PROTO {
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
        let c = self.contact(name).await?;
        if c.state != "active" {
            return Err(Error::Pending(name.into()));
        }
        if c.changed_box_pub.is_some() {
            return Err(Error::KeyChanged(name.into()));
        }
        if c.protocol == SC {
            let text = body.as_str().ok_or_else(|| Error::Invalid("Stringcup carries text only".into()))?;
            if !matches!(kind, Kind::Send | Kind::Ask | Kind::Reply) {
                return Err(Error::Invalid(format!("`{}` is a letagents kind; Stringcup carries text", kind.as_str())));
            }
            return self.stringcup_send(&c, kind, text, reply_to, from_agent, to_agent).await;
        }
        if c.protocol == AM {
            let text = body.as_str().ok_or_else(|| Error::Invalid("Agent Mail carries text here".into()))?;
            if !matches!(kind, Kind::Send | Kind::Ask | Kind::Reply) {
                return Err(Error::Invalid(format!(
                    "`{}` is a letagents kind; Agent Mail carries text",
                    kind.as_str()
                )));
            }
            return self.agent_mail_send(&c, kind.as_str(), text, reply_to, None, from_agent, to_agent).await;
        }
        if let Some(r) = reply_to
            && !la::inner::is_uuid(r)
        {
            return Err(Error::Invalid(format!("`{r}` is not a message id")));
        }
        if c.drop_code.is_none() {
            return Err(Error::Invalid(format!("no drop code for `{name}`: add their full address")));
        }
        let mut inner = Inner::new(&self.keys(), &c.peer_id, now_ms(), uuid::Uuid::new_v4(), kind, body);
        if kind == Kind::Hello {
            inner.from = self.inner.id.address().to_string();
        }
        inner.reply_to = reply_to.map(str::to_owned);
        inner.from_agent = from_agent.map(str::to_owned);
        inner.to_agent = to_agent.map(str::to_owned);
        inner.validate().map_err(|e| Error::Invalid(e.to_string()))?;
        let mut tx = self.store().pool.begin().await?;
        self.queue_sealed(&mut tx, &c, &inner, kind).await?;
        tx.commit().await?;
        self.inner.outbox_wake.notify_one();
        Ok(inner.id)
    }

    /// Seals `inner` to contact `c` and records it in `tx`: the message row, the outbox entry with
    /// the exact envelope bytes every retry will reuse, and the audit row.
    async fn queue_sealed(
        &self,
        tx: &mut sqlx::SqliteConnection,
        c: &ContactRow,
        inner: &Inner,
        kind: Kind,
    ) -> Result<()> {
        let drop =
            c.drop_code.as_deref().ok_or_else(|| Error::Bug("queued to a contact without a drop code".into()))?;
        let json = serde_json::to_string(inner).map_err(|e| Error::Bug(e.to_string()))?;
        let envelope = la::seal(&self.inner.id.sig, &peer_keys(c)?, &json, &mut OsRng)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let now = now_ms();
        let relay = c.relay_url.clone().unwrap_or_else(|| self.inner.relay_url.clone());
        let body = match &inner.body {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        store::insert_message(
            tx,
            &NewMessage {
                id: &inner.id,
                direction: "out",
                protocol: PROTO,
                contact_id: Some(c.id),
                peer: &c.peer_id,
                kind: kind.as_str(),
                body: &body,
                reply_to: inner.reply_to.as_deref(),
                from_agent: inner.from_agent.as_deref(),
                to_agent: inner.to_agent.as_deref(),
                ts: inner.ts,
                state: "queued",
                hidden: true,
                now,
            },
        )
        .await?;
        let out = store::Queued {
            message_id: &inner.id,
            protocol: PROTO,
            kind: kind.as_str(),
            relay_url: &relay,
            target: &c.peer_id,
            peer: &c.peer_id,
            drop_code: drop,
            payload: &envelope,
        };
        store::enqueue(tx, out, now).await?;
        Ok(())
    }

    async fn client_for(&self, url: &str) -> Result<RelayClient> {
        if url == self.inner.relay_url {
            return Ok(self.inner.relay.clone());
        }
        let mut peers = self.inner.peers.lock().await;
        if let Some(c) = peers.get(url) {
            return Ok(c.clone());
        }
        let c = RelayClient::new(url, None)?;
        peers.insert(url.to_owned(), c.clone());
        Ok(c)
    }

    async fn attempt(&self, row: OutboxRow) -> Result<Attempt> {
        let now = now_ms();
        let outcome = if row.protocol == SC {
            self.stringcup_attempt(&row).await
        } else if row.protocol == AM {
            self.agent_mail_attempt(&row).await
        } else {
            let client = self.client_for(&row.relay_url).await?;
            client.send(&row.target, &row.drop_code, row.payload.clone()).await
        };
        match outcome {
            SendOutcome::Accepted => {
                self.store().outbox_sent(&row, now_ms()).await?;
                if !matches!(row.kind.as_str(), "receipt" | "roster" | "hello") {
                    self.emit(Event::Delivery { id: row.message_id.clone(), state: "relayed".into() });
                }
                Ok(Attempt::Accepted)
            }
            SendOutcome::Retry { after_ms, reason } => {
                if now - row.created_at > STALE_AFTER_MS {
                    self.store().outbox_failed(&row, &format!("gave up after 48 h: {reason}"), now).await?;
                    return Ok(Attempt::Later);
                }
                let attempt = u32::try_from(row.attempts).unwrap_or(u32::MAX);
                let delay = after_ms.unwrap_or(0).max(backoff_ms(attempt));
                self.store().outbox_retry(row.id, now + delay, &reason).await?;
                if reason.starts_with("unreachable") {
                    self.set_health("disconnected", &reason);
                    return Ok(Attempt::Unreachable);
                }
                Ok(Attempt::Later)
            }
            SendOutcome::Permanent(reason) => {
                self.store().outbox_failed(&row, &reason, now).await?;
                Ok(Attempt::Later)
            }
        }
    }

    /// One pass over the outbox: everything due now, or everything queued with `force` (an
    /// explicit flush, or a one-shot command that has no daemon to wait for). A relay found
    /// unreachable is not tried again in the same pass. Returns how many the relay accepted.
    pub async fn flush_once(&self, force: bool) -> Result<usize> {
        let until = if force { i64::MAX } else { now_ms() };
        let mut sent = 0;
        let mut down: Vec<String> = Vec::new();
        for row in self.store().due_outbox(until, 500).await? {
            if down.contains(&row.relay_url) {
                continue;
            }
            let url = row.relay_url.clone();
            match self.attempt(row).await? {
                Attempt::Accepted => sent += 1,
                Attempt::Unreachable => down.push(url),
                Attempt::Later => {}
            }
        }
        Ok(sent)
    }

    async fn outbox_loop(self) {
        let mut stop = self.inner.shutdown.subscribe();
        loop {
            if let Err(e) = self.flush_once(false).await {
                tracing::warn!("outbox: {e}");
            }
            let next = self.store().next_outbox_time().await.ok().flatten();
            let wait = next.map_or(60_000, |t| (t - now_ms()).clamp(10, 60_000));
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(1000))) => {}
                _ = self.inner.outbox_wake.notified() => {}
                _ = stop.changed() => return,
            }
        }
    }

    // ----- receiving ----------------------------------------------------------------------

    /// Processes one envelope from the relay and commits every effect. Returns true if it
    /// produced something `inbox` will show. Errors are local (the envelope must not be acked).
    pub async fn receive(&self, envelope: &[u8]) -> Result<bool> {
        let now = now_ms();
        let me = self.keys();
        let opened = match la::open(envelope, &self.inner.id.boxs, &me) {
            Ok(o) => o,
            Err(e) => {
                let mut conn = self.store().pool.acquire().await?;
                audit_dropped(&mut conn, now, &format!("refused envelope: {e}")).await?;
                return Ok(false);
            }
        };
        let peer = opened.sender().mailbox_id();
        let msg_id = opened.inner.id.clone();
        let kind = opened.kind;
        // IMMEDIATE: this transaction reads and then writes; a deferred one fails with
        // SQLITE_BUSY_SNAPSHOT when another writer (agent deliveries, the outbox) commits between.
        let mut tx = self.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        let contact = store::contact_by_peer(&mut tx, PROTO, &peer).await?;
        let view = match &contact {
            Some(c) => {
                let rules = store::rules_for(&mut tx, c.id)
                    .await?
                    .into_iter()
                    .map(|(from, to, action)| AgentRule {
                        from,
                        to,
                        action: if action == "deny" { RuleAction::Deny } else { RuleAction::Allow },
                    })
                    .collect();
                Some(ContactView {
                    keys: peer_keys(c)?,
                    allow: c.allow_kinds.split(',').filter_map(Kind::parse).collect(),
                    rules,
                    active: c.state == "active",
                })
            }
            None => None,
        };
        let seen = store::was_seen(&mut tx, PROTO, &peer, &msg_id).await?;
        let mut verdict = decide(&opened, view.as_ref(), seen, now);
        if verdict == Verdict::PendingRequest && contact.is_none() {
            // Strangers cannot grow the request list without bound.
            let pending: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM contacts WHERE state = 'pending'").fetch_one(&mut *tx).await?;
            if pending >= MAX_PENDING_REQUESTS {
                verdict = Verdict::Drop(la::receive::DropReason::UnknownSender);
            }
        }
        let audit_in = |state: &'static str, detail: String| (state, detail);
        let mut showable = false;
        let mut event = None;
        let (state, detail) = match &verdict {
            Verdict::Drop(reason) => audit_in("dropped", reason.as_str().to_owned()),
            Verdict::PendingRequest => {
                store::mark_seen(&mut tx, PROTO, &peer, &msg_id, opened.inner.ts).await?;
                let body = opened.inner.text().chars().take(64).collect::<String>();
                let full = opened.from.to_string();
                let drop = opened.from.drop.unwrap_or_default();
                match &contact {
                    Some(c) => {
                        sqlx::query("UPDATE contacts SET request_body = ?, drop_code = ?, address = ? WHERE id = ?")
                            .bind(&body)
                            .bind(drop.as_slice())
                            .bind(&full)
                            .bind(c.id)
                            .execute(&mut *tx)
                            .await?;
                        event = Some(Event::Request { name: c.name.clone() });
                    }
                    None => {
                        let base: String = body.chars().filter(|c| c.is_alphanumeric() || "-_.".contains(*c)).collect();
                        let base = if base.is_empty() { peer.chars().take(8).collect() } else { base };
                        let mut name = base.clone();
                        let mut n = 2;
                        while store::name_taken(&mut tx, &name).await? {
                            name = format!("{base}-{n}");
                            n += 1;
                        }
                        store::insert_contact(
                            &mut tx,
                            &NewContact {
                                name: &name,
                                protocol: PROTO,
                                peer_id: &peer,
                                address: &full,
                                sig_pub: &opened.from.keys.sig,
                                box_pub: &opened.from.keys.boxk,
                                drop_code: Some(&drop),
                                relay_url: None,
                                state: "pending",
                                allow_kinds: DEFAULT_ALLOW,
                                request_body: &body,
                                now,
                            },
                        )
                        .await?;
                        event = Some(Event::Request { name });
                    }
                }
                audit_in("request", body)
            }
            Verdict::RefreshAddress => {
                store::mark_seen(&mut tx, PROTO, &peer, &msg_id, opened.inner.ts).await?;
                if let (Some(c), Some(drop)) = (&contact, opened.from.drop) {
                    sqlx::query("UPDATE contacts SET drop_code = ?, address = ? WHERE id = ?")
                        .bind(drop.as_slice())
                        .bind(opened.from.to_string())
                        .bind(c.id)
                        .execute(&mut *tx)
                        .await?;
                }
                audit_in("received", "hello from a known contact: address refreshed".into())
            }
            Verdict::Refuse { reason, receipt } => {
                store::mark_seen(&mut tx, PROTO, &peer, &msg_id, opened.inner.ts).await?;
                if let (la::receive::RefuseReason::KeyChanged, Some(c)) = (reason, &contact) {
                    sqlx::query("UPDATE contacts SET changed_box_pub = ?, key_changed_at = ? WHERE id = ?")
                        .bind(opened.from.keys.boxk.as_slice())
                        .bind(now)
                        .bind(c.id)
                        .execute(&mut *tx)
                        .await?;
                    event = Some(Event::KeyChanged { name: c.name.clone() });
                }
                if *receipt && let Some(c) = &contact {
                    self.queue_receipt(&mut tx, c, &msg_id, ReceiptStatus::Refused, &reason.detail()).await?;
                }
                audit_in("refused", reason.detail())
            }
            Verdict::Accept { receipt } => {
                store::mark_seen(&mut tx, PROTO, &peer, &msg_id, opened.inner.ts).await?;
                let Some(c) = &contact else {
                    return Err(Error::Bug("accepted without a contact".into()));
                };
                let body = match &opened.inner.body {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let hidden = matches!(kind, Kind::Receipt | Kind::List);
                store::insert_message(
                    &mut tx,
                    &NewMessage {
                        id: &msg_id,
                        direction: "in",
                        protocol: PROTO,
                        contact_id: Some(c.id),
                        peer: &peer,
                        kind: kind.as_str(),
                        body: &body,
                        reply_to: opened.inner.reply_to.as_deref(),
                        from_agent: opened.inner.from_agent.as_deref(),
                        to_agent: opened.inner.to_agent.as_deref(),
                        ts: opened.inner.ts,
                        state: "received",
                        hidden,
                        now,
                    },
                )
                .await?;
                showable = !hidden;
                match kind {
                    Kind::Receipt => {
                        if let (Some(target), Ok(r)) =
                            (&opened.inner.reply_to, serde_json::from_value::<ReceiptBody>(opened.inner.body.clone()))
                        {
                            let state = if r.status == ReceiptStatus::Refused { "refused" } else { "delivered" };
                            let detail = format!(
                                "{}{}{}",
                                serde_json::to_value(r.status)
                                    .ok()
                                    .and_then(|v| v.as_str().map(str::to_owned))
                                    .unwrap_or_default(),
                                if r.detail.is_empty() { "" } else { ": " },
                                r.detail
                            );
                            if store::set_outgoing_state(&mut tx, target, &peer, state, &detail).await? {
                                store::audit(
                                    &mut tx,
                                    now,
                                    Audit {
                                        direction: "out",
                                        protocol: PROTO,
                                        peer: &peer,
                                        message_id: target,
                                        kind: "",
                                        state,
                                        detail: &detail,
                                    },
                                )
                                .await?;
                                event = Some(Event::Delivery { id: target.clone(), state: state.into() });
                            }
                        }
                    }
                    Kind::Roster => {
                        sqlx::query("UPDATE contacts SET roster = ? WHERE id = ?")
                            .bind(&body)
                            .bind(c.id)
                            .execute(&mut *tx)
                            .await?;
                    }
                    Kind::List => {
                        let roster = self.roster().await?;
                        self.queue_reply(&mut tx, c, Kind::Roster, roster, Some(&msg_id)).await?;
                    }
                    _ => {}
                }
                if *receipt {
                    let status = accepted_status(self.inner.listeners.load(Ordering::SeqCst) > 0);
                    self.queue_receipt(&mut tx, c, &msg_id, status, "").await?;
                }
                if showable {
                    event = Some(Event::Message { id: msg_id.clone() });
                }
                audit_in("received", String::new())
            }
        };
        store::audit(
            &mut tx,
            now,
            Audit {
                direction: "in",
                protocol: PROTO,
                peer: &peer,
                message_id: &msg_id,
                kind: kind.as_str(),
                state,
                detail: &detail,
            },
        )
        .await?;
        tx.commit().await?;
        if let Some(e) = event {
            self.emit(e);
        }
        self.inner.outbox_wake.notify_one();
        Ok(showable)
    }

    async fn queue_receipt(
        &self,
        tx: &mut sqlx::SqliteConnection,
        c: &ContactRow,
        about: &str,
        status: ReceiptStatus,
        detail: &str,
    ) -> Result<()> {
        let body = serde_json::to_value(ReceiptBody { status, detail: detail.into() })
            .map_err(|e| Error::Bug(e.to_string()))?;
        self.queue_reply(tx, c, Kind::Receipt, body, Some(about)).await
    }

    /// Seals and queues an automatic message inside the receiving transaction.
    async fn queue_reply(
        &self,
        tx: &mut sqlx::SqliteConnection,
        c: &ContactRow,
        kind: Kind,
        body: Value,
        reply_to: Option<&str>,
    ) -> Result<()> {
        if c.drop_code.is_none() {
            return Ok(());
        }
        let mut inner = Inner::new(&self.keys(), &c.peer_id, now_ms(), uuid::Uuid::new_v4(), kind, body);
        inner.reply_to = reply_to.map(str::to_owned);
        self.queue_sealed(tx, c, &inner, kind).await
    }

    /// Reads everything waiting at the relay for every protocol, processes and acks it.
    pub async fn sync(&self) -> Result<usize> {
        let n = self.sync_letagents().await?;
        let n = n + self.stringcup_sync().await?;
        Ok(n + self.agent_mail_sync().await?)
    }

    /// Reads everything waiting in the letagents mailbox (plain GET), processes and acks it.
    async fn sync_letagents(&self) -> Result<usize> {
        let mut total = 0;
        loop {
            let msgs = self.inner.relay.inbox(&self.inner.id.sig, &self.inner.id.drop).await?;
            self.set_health("reachable", "");
            let n = msgs.len();
            let mut done = Vec::with_capacity(n);
            for m in msgs {
                match crate::util::b64u_decode(&m.ct) {
                    Some(bytes) => {
                        self.receive(&bytes).await?;
                    }
                    None => {
                        let mut conn = self.store().pool.acquire().await?;
                        audit_dropped(&mut conn, now_ms(), "relay sent an envelope that is not base64url").await?;
                    }
                }
                done.push(m.seq);
            }
            if !done.is_empty() {
                self.inner.relay.ack(&self.inner.id.sig, &done).await?;
            }
            total += n;
            if n < la::wire::INBOX_PAGE {
                return Ok(total);
            }
        }
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
        let mut rows = self.store().inbox(all, 1000).await?;
        if rows.is_empty() && wait_secs > 0 {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_secs.min(3600));
            if one_shot {
                // No daemon: hold the letagents websocket and the Stringcup long-poll ourselves
                // until something arrives on either.
                let _ = tokio::time::timeout_at(deadline, async {
                    tokio::select! {
                        _ = self.websocket_session(true) => {}
                        _ = self.stringcup_receive_loop(true) => {}
                        _ = self.agent_mail_receive_loop(true) => {}
                    }
                })
                .await;
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
            rows = self.store().inbox(all, 1000).await?;
        }
        let mut names: BTreeMap<i64, String> = BTreeMap::new();
        for c in self.store().contacts(None).await? {
            names.insert(c.id, c.name);
        }
        let mut out: Vec<Value> = rows
            .iter()
            .map(|m| message_dto(m, m.contact_id.and_then(|id| names.get(&id)).map(String::as_str)))
            .collect();
        self.agent_mail_decorate(&mut out).await?;
        let ids: Vec<i64> = rows.iter().filter(|m| !m.shown).map(|m| m.rowid_).collect();
        self.store().mark_shown(&ids).await?;
        Ok(Value::Array(out))
    }

    /// One websocket session: catch up, then live delivery until the socket ends. With
    /// `until_showable`, returns as soon as something `inbox` shows arrives.
    async fn websocket_session(&self, until_showable: bool) -> Result<()> {
        let ws = self.inner.relay.connect(&self.inner.id.sig, &self.inner.id.drop).await?;
        self.set_health("connected", "");
        self.inner.outbox_wake.notify_one();
        let (mut tx, mut rx) = ws.split();
        let mut ping = tokio::time::interval(Duration::from_secs(20));
        ping.tick().await;
        let mut stop = self.inner.shutdown.subscribe();
        let mut awaiting_pong = false;
        loop {
            tokio::select! {
                frame = rx.next() => {
                    let Some(frame) = frame else { break };
                    let frame = frame.map_err(|e| TransportError::Unreachable(e.to_string()))?;
                    let WsMessage::Text(text) = frame else { continue };
                    let Ok(msg) = serde_json::from_str::<RelayToClient>(text.as_str()) else {
                        tracing::warn!("relay sent an unknown frame");
                        continue;
                    };
                    match msg {
                        RelayToClient::Msg { seq, ct } => {
                            let showable = match crate::util::b64u_decode(&ct) {
                                Some(bytes) => self.receive(&bytes).await?,
                                None => false,
                            };
                            let ack = serde_json::to_string(&ClientToRelay::Ack { seq }).map_err(|e| Error::Bug(e.to_string()))?;
                            tx.send(WsMessage::text(ack)).await.map_err(|e| TransportError::Unreachable(e.to_string()))?;
                            if showable && until_showable {
                                return Ok(());
                            }
                        }
                        RelayToClient::Ready => {}
                        RelayToClient::Pong => awaiting_pong = false,
                    }
                }
                _ = ping.tick() => {
                    if awaiting_pong {
                        return Err(TransportError::Unreachable("relay stopped answering pings".into()).into());
                    }
                    let p = serde_json::to_string(&ClientToRelay::Ping).map_err(|e| Error::Bug(e.to_string()))?;
                    tx.send(WsMessage::text(p)).await.map_err(|e| TransportError::Unreachable(e.to_string()))?;
                    awaiting_pong = true;
                }
                _ = stop.changed() => return Ok(()),
            }
        }
        Err(TransportError::Unreachable("relay closed the connection".into()).into())
    }

    async fn receiver_loop(self) {
        let mut attempt = 0u32;
        let mut stop = self.inner.shutdown.subscribe();
        loop {
            let started = tokio::time::Instant::now();
            let result = self.websocket_session(false).await;
            if *stop.borrow() {
                return;
            }
            if let Err(e) = result {
                tracing::info!("relay connection: {e}");
                self.set_health("disconnected", &e.to_string());
            }
            if started.elapsed() > Duration::from_secs(30) {
                attempt = 0;
            }
            let delay = backoff_ms(attempt);
            attempt = attempt.saturating_add(1);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(u64::try_from(delay).unwrap_or(1000))) => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn housekeeping_loop(self) {
        let mut stop = self.inner.shutdown.subscribe();
        loop {
            let _ = self.store().prune_seen(now_ms() - STALE_AFTER_MS - la::MAX_FUTURE_SKEW_MS - 3_600_000).await;
            if let Err(e) = self.stringcup_rotate_if_due(false).await {
                tracing::warn!("stringcup token: {e}");
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// Starts the long-lived loops (websocket receiver, outbox worker, housekeeping, letmeknow
    /// group followers).
    pub fn start_background(&self) -> Vec<tokio::task::JoinHandle<()>> {
        vec![
            tokio::spawn(self.clone().receiver_loop()),
            tokio::spawn({
                let rt = self.clone();
                async move {
                    let _ = rt.stringcup_receive_loop(false).await;
                }
            }),
            tokio::spawn({
                let rt = self.clone();
                async move {
                    let _ = rt.agent_mail_receive_loop(false).await;
                }
            }),
            tokio::spawn(self.clone().outbox_loop()),
            tokio::spawn(self.clone().housekeeping_loop()),
            tokio::spawn(self.clone().lmk_background_loop()),
        ]
    }

    /// Counts a live listener (an agent waiting for deliveries) while the guard lives.
    pub fn listening(&self) -> ListenerGuard<'_> {
        ListenerGuard::new(&self.inner.listeners)
    }
}

/// What one delivery attempt came to.
enum Attempt {
    Accepted,
    Unreachable,
    Later,
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
    use super::*;

    #[test]
    fn backoff_is_bounded_and_jittered() {
        for attempt in 0..40 {
            let d = backoff_ms(attempt);
            let full = (BACKOFF_BASE_MS << attempt.min(20)).min(BACKOFF_CAP_MS);
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d}");
        }
        assert!(backoff_ms(100) <= BACKOFF_CAP_MS);
    }

    #[test]
    fn allow_lists_are_validated() {
        assert_eq!(kinds_to_string(&["send,ask".into(), "ask".into()]).unwrap(), "send,ask");
        assert!(kinds_to_string(&["roster".into()]).is_err());
        assert!(kinds_to_string(&["bogus".into()]).is_err());
    }
}
