//! The engine's Stringcup v2 side: one identity per relay's `/api/v2`, pinned peer keys,
//! idempotent sends through the outbox, the long-polled inbox, rendezvous pairing, topic fan-out
//! and token rotation.
//!
//! - Registration keeps the token durable (keystore) before any other use of it.
//! - An identity belongs to the relay that assigned it, and so do its contacts. The identity of
//!   the profile's own relay is the current one (new contacts, pairing, topics); after a relay
//!   move the old relay's identity is kept (`stringcup_identities`), and the contacts stored with
//!   that relay are still sent to and read through it (`docs/relay-move.md`).
//! - A peer's key is pinned at first sight; the fingerprint is always recomputed locally; a lookup
//!   that returns another key marks the contact changed and blocks sending until `verify`.
//! - An inbox message is committed (message, seen id, audit) before it is acknowledged; a
//!   redelivered one is recognised by its inbox number and dropped.
//! - Senders we do not know become pending requests; what they sent is held until accepted.
//!
//! Token rotation and key update live in `keys`, rendezvous pairing in `pairing`, topics in
//! `topics`.

mod keys;
mod pairing;
mod topics;

use serde_json::{Value, json};
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

use futures_util::future::BoxFuture;
use std::collections::BTreeMap;
use tokio::sync::Mutex;

use super::{Channel, ContactAdd};
use crate::engine::delivery::SenderAuth;
use crate::engine::outbox::{self, Sealed};
use crate::engine::relays::canonical_relay_url;
use crate::engine::{Error, Event, Result, Runtime, blocking, kinds_to_string};
use crate::identity::keystore::Keystore;
use crate::protocol::letagents::Kind;
use crate::protocol::stringcup::crypto::{self, fingerprint, fingerprint_short};
use crate::protocol::stringcup::wire::{InboxMessageIn, Outgoing, is_identity_id};
use crate::store::ContactState;
use crate::store::{self, Audit, ContactRow, NewContact, NewMessage, OutboxRow, Protocol, Store};
use crate::transport::TransportError;
use crate::transport::letagents::RelayClient;
use crate::transport::letagents::SendOutcome;
use crate::transport::stringcup::{self as sct, LongPoll, StringcupClient};
use crate::util::{OsRng, b64u, b64u_decode, hex, now_ms, random_array, sha256};

/// Renew the token when it has less than this left (30-day inactivity TTL).
const ROTATE_BEFORE_SECS: i64 = 7 * 24 * 3600;
/// The spec's normal poll interval (300 inbox requests per hour).
const POLL_INTERVAL_MS: u64 = 12_000;

/// Stringcup's channel: the `/api/v2` client on our relay and our identities, one per relay
/// (the own relay's registered the first time it is needed).
pub(in crate::engine) struct Stringcup {
    /// The client for the profile's own relay.
    client: std::sync::RwLock<StringcupClient>,
    /// Our identities by the relay that assigned each (canonical URL).
    ids: Mutex<BTreeMap<String, ScIdentity>>,
}

/// One of our Stringcup identities.
#[derive(Clone)]
struct ScIdentity {
    /// The relay that assigned it (canonical URL).
    relay: String,
    /// The keystore slot holding it.
    slot: String,
    id: String,
    secret: StaticSecret,
    token: String,
    /// Keys this identity had before a key update, newest first: what senders sealed to them
    /// before they saw the new key may still wait in the inbox ([`KEPT_OLD_KEYS`] at most).
    previous: Vec<StaticSecret>,
    /// A key saved before the relay was asked to take it: if the runtime stopped before the
    /// answer, the relay may hold it, so it opens mail too until the next key update settles it.
    pending: Option<StaticSecret>,
}

impl ScIdentity {
    /// Every secret that may open a message to us, the current one first.
    fn openers(&self) -> impl Iterator<Item = &StaticSecret> {
        std::iter::once(&self.secret).chain(self.pending.iter()).chain(self.previous.iter())
    }
}

/// How many keys from before key updates are kept to open mail sealed to them.
const KEPT_OLD_KEYS: usize = 2;

#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    id: String,
    secret: String,
    token: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    previous: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending: Option<String>,
}

fn secret_of(b64: &str) -> Result<StaticSecret> {
    let secret: [u8; 32] =
        b64u_decode(b64).and_then(|v| v.try_into().ok()).ok_or_else(|| Error::Bug("stringcup key length".into()))?;
    Ok(StaticSecret::from(secret))
}

/// A topic as it may go into a request path: the relay's `tp-` ids and legacy names, letters,
/// digits, `-` and `_` only (a `/`, `?` or `..` would address another resource of the relay).
fn topic_path(topic: &str) -> Result<&str> {
    let ok = !topic.is_empty()
        && topic.len() <= 64
        && topic.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok { Ok(topic) } else { Err(Error::Invalid(format!("`{topic}` is not a topic id (tp-…)"))) }
}

/// One inbox page as the receive loop sees it.
struct Page {
    /// Messages processed (and acknowledged).
    count: usize,
    /// Whether any of them is something `inbox` shows.
    showable: bool,
    /// The relay has more waiting.
    more: bool,
    /// Whether the relay held the request.
    long_poll: LongPoll,
    /// What is left of the inbox budget.
    budget: sct::Budget,
}

/// How long a topic fan-out holds its queued entries from the outbox worker while its batch
/// request runs (longer than any request's timeout; released as soon as the batch answers).
const TOPIC_BATCH_HOLD_MS: i64 = 120_000;

/// The keystore slot of the first identity a profile registers.
const FIRST_SLOT: &str = "stringcup";

/// The keystore slot for an identity the relay at `relay` (canonical) assigns, when `taken`
/// slots are in use: the first one's, else one named by the URL's hash.
fn slot_for(relay: &str, taken: &[&str]) -> String {
    if taken.is_empty() {
        return FIRST_SLOT.to_owned();
    }
    let h = hex(&sha256(relay.as_bytes()));
    let short = format!("stringcup@{}", h.get(..8).unwrap_or(&h));
    if taken.contains(&short.as_str()) { format!("stringcup@{h}") } else { short }
}

/// A relay URL as identities are keyed: canonical, else as given without a trailing slash.
fn relay_key(url: &str) -> String {
    canonical_relay_url(url).unwrap_or_else(|_| url.trim_end_matches('/').to_owned())
}

/// Loads every identity this profile registered, by relay.
async fn load_identities(store: &Store, ks: &std::sync::Arc<Keystore>) -> Result<BTreeMap<String, ScIdentity>> {
    let mut out = BTreeMap::new();
    for row in store.stringcup_identities().await? {
        let ks = ks.clone();
        let slot = row.slot.clone();
        let raw = blocking(move || ks.slot(&slot)?.load())
            .await??
            .ok_or_else(|| Error::Bug(format!("stringcup key missing (slot {})", row.slot)))?;
        let stored: Stored = serde_json::from_slice(&raw).map_err(|e| Error::Bug(format!("stringcup key: {e}")))?;
        if stored.id != row.sc_id {
            return Err(Error::Bug(format!("keystore slot {} holds {}, not {}", row.slot, stored.id, row.sc_id)));
        }
        let relay = relay_key(&row.relay_url);
        if relay != row.relay_url {
            // Migration 0019 took the URL as `init` stored it: keyed canonical from now on, as the
            // contacts a move pins to it are.
            store.rekey_stringcup_identity(&row.relay_url, &relay).await?;
        }
        out.insert(
            relay.clone(),
            ScIdentity {
                relay,
                slot: row.slot,
                id: stored.id,
                secret: secret_of(&stored.secret)?,
                token: stored.token,
                previous: stored.previous.iter().map(|s| secret_of(s)).collect::<Result<_>>()?,
                pending: stored.pending.as_deref().map(secret_of).transpose()?,
            },
        );
    }
    Ok(out)
}

fn public_b64(secret: &StaticSecret) -> String {
    data_encoding::BASE64.encode(PublicKey::from(secret).as_bytes())
}

fn pinned_key(c: &ContactRow) -> Result<[u8; 32]> {
    c.box_pub.as_slice().try_into().map_err(|_| Error::Bug("stored stringcup key has the wrong length".into()))
}

impl Channel for Stringcup {
    fn claims_address(&self, address: &str) -> bool {
        is_identity_id(address)
    }

    fn add_contact<'a>(&'a self, rt: &'a Runtime, req: ContactAdd<'a>) -> BoxFuture<'a, Result<String>> {
        Box::pin(self.stringcup_contact_add(rt, req.address, req.name, req.allow))
    }

    fn send<'a>(
        &'a self,
        rt: &'a Runtime,
        c: &'a ContactRow,
        msg: super::Outgoing<'a>,
    ) -> BoxFuture<'a, Result<String>> {
        Box::pin(async move {
            let text = msg.body.as_str().ok_or_else(|| Error::Invalid("Stringcup carries text only".into()))?;
            // The Stringcup plaintext is the text alone (B.2): no kind, no correlation (B.6.1 §3),
            // no addressing of the peer's agents. Refused rather than recorded here and lost on
            // the wire; `from_agent` is ours and stays local.
            let lost = match msg.kind {
                Kind::Send => None,
                Kind::Ask | Kind::Reply => Some("the kind (ask/reply)"),
                _ => Some("a letagents kind"),
            };
            let lost = lost
                .or(msg.reply_to.map(|_| "which message this replies to"))
                .or(msg.to_agent.map(|_| "the addressed agent"));
            if let Some(what) = lost {
                return Err(Error::NotCarried { protocol: "Stringcup", what });
            }
            self.stringcup_send(rt, c, msg.kind, text, msg.reply_to, msg.from_agent, msg.to_agent).await
        })
    }

    fn attempt<'a>(&'a self, rt: &'a Runtime, row: &'a OutboxRow) -> BoxFuture<'a, Result<SendOutcome>> {
        Box::pin(async move { Ok(self.stringcup_attempt(rt, row).await) })
    }

    /// Never: nothing expires at a Stringcup relay, and a 507 means "not stored yet", never a
    /// permanent failure (B.3.6); the message waits, with its last error, until the inbox drains.
    fn give_up_at(&self, _row: &OutboxRow) -> Option<(i64, &'static str)> {
        None
    }

    fn sync<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, Result<usize>> {
        Box::pin(self.stringcup_sync(rt))
    }

    fn run<'a>(&'a self, rt: &'a Runtime, until_showable: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.stringcup_receive_loop(rt, until_showable))
    }

    fn init<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, Result<()>> {
        // Register an identity on the same relay, if it serves /api/v2; otherwise the runtime
        // tries again whenever Stringcup is first needed.
        Box::pin(async move {
            if let Err(e) = self.stringcup_identity(rt).await {
                tracing::info!("no Stringcup identity yet: {e}");
            }
            Ok(())
        })
    }

    fn housekeeping<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.stringcup_rotate_if_due(rt, false).await {
                tracing::warn!("stringcup token: {e}");
            }
            self.stringcup_rotate_kept(rt).await;
        })
    }

    fn whoami<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, (&'static str, Value)> {
        Box::pin(async move { ("stringcup", self.stringcup_whoami(rt).await) })
    }

    fn sender_auth(&self) -> SenderAuth {
        // Seed 003 B.6: the relay matches `sender_id` to the token; the ciphertext does not bind the sender.
        SenderAuth::AssertedByRelay
    }

    fn safety_numbers(&self, c: &ContactRow) -> (Option<String>, Option<String>) {
        // Stringcup has one key: the short fingerprint is what people compare (B.7).
        let short = |k: &[u8]| <[u8; 32]>::try_from(k).ok().map(|k| fingerprint_short(&k));
        (short(&c.box_pub), c.changed_box_pub.as_deref().and_then(short))
    }

    fn address_with_box(&self, c: &ContactRow, _new_box: &[u8]) -> Result<String> {
        // The address is the identity id; the key is not part of it.
        Ok(c.address.clone())
    }
}

impl Stringcup {
    /// The channel, with the identity this profile registered (if any).
    pub(in crate::engine) async fn load(
        store: &Store,
        ks: &std::sync::Arc<Keystore>,
        relay: &RelayClient,
    ) -> Result<Stringcup> {
        Ok(Stringcup {
            client: std::sync::RwLock::new(StringcupClient::new(relay)),
            ids: Mutex::new(load_identities(store, ks).await?),
        })
    }

    fn client(&self) -> StringcupClient {
        // Only ever replaced whole, so a poisoned lock still holds a usable client.
        self.client.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The owner moved to another relay: the client points at `relay`. The old relay's identity
    /// stays (its contacts live there and are reached through it); the new relay's is the one
    /// held from an earlier stay there, else [`Self::stringcup_register_moved`] registers one.
    pub(in crate::engine) fn stringcup_switch_relay(&self, relay: &RelayClient) {
        *self.client.write().unwrap_or_else(std::sync::PoisonError::into_inner) = StringcupClient::new(relay);
    }

    /// Registers an identity on the relay moved to unless one is held there; a relay that does
    /// not serve `/api/v2` now is asked again when Stringcup is next needed.
    pub(in crate::engine) async fn stringcup_register_moved(&self, rt: &Runtime) {
        if let Err(e) = self.stringcup_identity(rt).await {
            tracing::info!("no Stringcup identity on the new relay yet: {e}");
        }
    }

    async fn save_identity(&self, rt: &Runtime, id: &ScIdentity) -> Result<()> {
        let stored = Stored {
            id: id.id.clone(),
            secret: b64u(id.secret.as_bytes()),
            token: id.token.clone(),
            previous: id.previous.iter().map(|k| b64u(k.as_bytes())).collect(),
            pending: id.pending.as_ref().map(|k| b64u(k.as_bytes())),
        };
        let bytes = Zeroizing::new(serde_json::to_vec(&stored).map_err(|e| Error::Bug(e.to_string()))?);
        let ks = rt.inner.keys.clone();
        let slot = id.slot.clone();
        blocking(move || ks.slot(&slot)?.save(&bytes)).await??;
        Ok(())
    }

    /// Our identity on the profile's own relay, registering one there the first time.
    async fn stringcup_identity(&self, rt: &Runtime) -> Result<ScIdentity> {
        let relay = relay_key(&rt.relay_url());
        let mut guard = self.ids.lock().await;
        if let Some(id) = guard.get(&relay) {
            return Ok(id.clone());
        }
        let secret = StaticSecret::from(random_array::<32>());
        let reg = self.client().register(&public_b64(&secret), &rt.inner.name).await?;
        if !is_identity_id(&reg.id) {
            return Err(TransportError::Malformed(format!("relay assigned an invalid id `{}`", reg.id)).into());
        }
        let taken: Vec<&str> = guard.values().map(|i| i.slot.as_str()).collect();
        let slot = slot_for(&relay, &taken);
        let id = ScIdentity {
            relay: relay.clone(),
            slot,
            id: reg.id,
            secret,
            token: reg.api_token,
            previous: Vec::new(),
            pending: None,
        };
        // The token is shown once: it is durable before anything else uses it (the keystore
        // first, then the row naming its slot).
        self.save_identity(rt, &id).await?;
        rt.store().set_stringcup_identity(&relay, &id.id, &id.slot, now_ms()).await?;
        guard.insert(relay, id.clone());
        Ok(id)
    }

    /// Our identity on the own relay, if registered.
    async fn registered(&self, rt: &Runtime) -> Option<ScIdentity> {
        self.ids.lock().await.get(&relay_key(&rt.relay_url())).cloned()
    }

    /// A client for the relay at `relay` (canonical): the own relay's, else one verifying the pin
    /// stored for it.
    async fn client_for(&self, rt: &Runtime, relay: &str) -> Result<StringcupClient> {
        if relay == relay_key(&rt.relay_url()) {
            return Ok(self.client());
        }
        Ok(StringcupClient::new(&rt.foreign_relay(relay).await?.client))
    }

    /// The identity (and a client for its relay) that reaches a contact stored with `relay`
    /// (`None`: our own relay): the own relay's, or one kept from before a move.
    async fn identity_at(&self, rt: &Runtime, relay: Option<&str>) -> Result<(StringcupClient, ScIdentity)> {
        let own = relay_key(&rt.relay_url());
        let relay = relay.map_or_else(|| own.clone(), relay_key);
        if relay == own {
            return Ok((self.client(), self.stringcup_identity(rt).await?));
        }
        let me = self.ids.lock().await.get(&relay).cloned().ok_or_else(|| {
            Error::Invalid(format!("this profile holds no Stringcup identity on the relay at {relay}"))
        })?;
        Ok((self.client_for(rt, &relay).await?, me))
    }

    /// The identities kept from relays moved away from that still have contacts there.
    async fn kept_in_use(&self, rt: &Runtime) -> Result<Vec<ScIdentity>> {
        let own = relay_key(&rt.relay_url());
        let rows = rt.store().stringcup_identities().await?;
        let ids = self.ids.lock().await;
        Ok(rows
            .iter()
            .map(|r| relay_key(&r.relay_url))
            .zip(rows.iter().map(|r| r.contacts))
            .filter(|(relay, contacts)| *relay != own && *contacts > 0)
            .filter_map(|(relay, _)| ids.get(&relay).cloned())
            .collect())
    }

    pub(in crate::engine) async fn stringcup_whoami(&self, rt: &Runtime) -> Value {
        match self.registered(rt).await {
            Some(me) => {
                let key = PublicKey::from(&me.secret).to_bytes();
                let mut v = json!({
                    "id": me.id,
                    "fingerprint": fingerprint(&key),
                    "fingerprint_short": fingerprint_short(&key),
                    "relay": format!("{}/api/v2", rt.relay_url()),
                });
                // Identities kept on relays moved away from, for the contacts that live there.
                let rows = rt.store().stringcup_identities().await.unwrap_or_default();
                let kept: Vec<Value> = rows
                    .iter()
                    .filter(|r| relay_key(&r.relay_url) != me.relay)
                    .map(|r| json!({"id": r.sc_id, "relay": r.relay_url, "contacts": r.contacts}))
                    .collect();
                if !kept.is_empty()
                    && let Some(o) = v.as_object_mut()
                {
                    o.insert("other_relays".into(), kept.into());
                }
                v
            }
            None => Value::Null,
        }
    }

    /// Looks `id` up at `client`'s relay and returns its key (the fingerprint is recomputed
    /// locally by callers).
    async fn stringcup_lookup_at(&self, client: &StringcupClient, id: &str) -> Result<([u8; 32], Option<String>)> {
        let rec = client.identity(id).await?;
        if rec.id != id {
            return Err(TransportError::Malformed("lookup answered for another identity".into()).into());
        }
        let key = crypto::decode_public_key(&rec.identity_public_key)
            .ok_or_else(|| TransportError::Malformed("lookup returned a malformed key".into()))?;
        Ok((key, rec.display_name))
    }

    /// Looks `id` up at the profile's own relay.
    async fn stringcup_lookup(&self, id: &str) -> Result<([u8; 32], Option<String>)> {
        self.stringcup_lookup_at(&self.client(), id).await
    }

    /// Pins `key` for `id`: a new contact (stored with `relay`, `None` for our own relay), a
    /// pending one accepted, or a key change marked on a known one.
    #[allow(clippy::too_many_arguments)]
    async fn pin_contact(
        &self,
        rt: &Runtime,
        id: &str,
        name: &str,
        key: &[u8; 32],
        allow: &str,
        state: ContactState,
        relay: Option<&str>,
    ) -> Result<ContactRow> {
        let now = now_ms();
        let mut tx = rt.store().write_tx().await?;
        match store::contact_by_peer(&mut tx, Protocol::Stringcup, id).await? {
            Some(c) if c.box_pub.as_slice() != key => {
                let changed = store::ContactUpdate {
                    changed_box_pub: Some(Some(key.as_slice())),
                    key_changed_at: Some(Some(now)),
                    ..Default::default()
                };
                store::update_contact(&mut tx, c.id, &changed).await?;
                tx.commit().await?;
                rt.emit(Event::KeyChanged { name: c.name.clone() });
                return Err(Error::KeyChanged(c.name));
            }
            Some(c) if c.state == ContactState::Pending && state == ContactState::Active => {
                let accept = store::ContactUpdate {
                    state: Some(ContactState::Active),
                    allow_kinds: Some(allow),
                    ..Default::default()
                };
                store::update_contact(&mut tx, c.id, &accept).await?;
                store::release_held(&mut tx, c.id).await?;
            }
            Some(_) => {}
            None => {
                let mut unique = name.to_owned();
                let mut n = 2;
                while store::name_taken(&mut tx, &unique).await? {
                    unique = format!("{name}-{n}");
                    n += 1;
                }
                store::insert_contact(
                    &mut tx,
                    &NewContact {
                        name: &unique,
                        protocol: Protocol::Stringcup,
                        peer_id: id,
                        address: id,
                        sig_pub: &[],
                        box_pub: key,
                        drop_code: None,
                        relay_url: relay,
                        state,
                        allow_kinds: allow,
                        request_body: "",
                        now,
                    },
                )
                .await?;
            }
        }
        tx.commit().await?;
        let mut conn = rt.store().pool.acquire().await?;
        store::contact_by_peer(&mut conn, Protocol::Stringcup, id)
            .await?
            .ok_or_else(|| Error::Bug("pinned contact vanished".into()))
    }

    pub(in crate::engine) async fn stringcup_contact_add(
        &self,
        rt: &Runtime,
        id: &str,
        name: Option<&str>,
        allow: Option<&[String]>,
    ) -> Result<String> {
        let me = self.stringcup_identity(rt).await?;
        if id == me.id {
            return Err(Error::Invalid("that is our own Stringcup id".into()));
        }
        let allow = match allow {
            Some(k) => kinds_to_string(k)?,
            None => crate::engine::DEFAULT_ALLOW.to_owned(),
        };
        if let Some(n) = name
            && rt.store().contact_by_name(n)?.is_some_and(|c| c.peer_id != id)
        {
            return Err(Error::ContactExists(format!("a contact named `{n}` already exists")));
        }
        let mut conn = rt.store().pool.acquire().await?;
        if let Some(c) = store::contact_by_peer(&mut conn, Protocol::Stringcup, id).await?
            && c.state == ContactState::Active
        {
            return Err(Error::ContactExists(format!("already a contact, as `{}`", c.name)));
        }
        drop(conn);
        let (key, display) = self.stringcup_lookup(id).await?;
        let default_name = display.filter(|d| !d.trim().is_empty()).unwrap_or_else(|| id.chars().take(11).collect());
        let c =
            self.pin_contact(rt, id, name.unwrap_or(&default_name), &key, &allow, ContactState::Active, None).await?;
        Ok(c.name)
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::engine) async fn stringcup_send(
        &self,
        rt: &Runtime,
        c: &ContactRow,
        kind: Kind,
        text: &str,
        reply_to: Option<&str>,
        from_agent: Option<&str>,
        to_agent: Option<&str>,
    ) -> Result<String> {
        // Through our identity on the relay the contact lives on.
        let (client, me) = self.identity_at(rt, c.relay_url.as_deref()).await?;
        // Check the pin against a fresh lookup; a relay that cannot be reached now does not stop
        // the send (the pinned key is what we encrypt to).
        if let Ok((key, _)) = self.stringcup_lookup_at(&client, &c.peer_id).await
            && key.as_slice() != c.box_pub.as_slice()
        {
            let relay = c.relay_url.as_deref();
            self.pin_contact(rt, &c.peer_id, &c.name, &key, &c.allow_kinds, ContactState::Active, relay).await?;
        }
        let now = now_ms();
        let mut tx = rt.store().write_tx().await?;
        let id = Self::seal_and_queue(&mut tx, &me, c, kind, text, (reply_to, from_agent, to_agent), now).await?;
        rt.commit_queued(tx).await?;
        Ok(id)
    }

    /// Seals `text` for `c` and queues it in `tx`; returns the message id, which doubles as the
    /// Idempotency-Key every retry reuses.
    #[allow(clippy::too_many_arguments)]
    async fn seal_and_queue(
        tx: &mut sqlx::SqliteConnection,
        me: &ScIdentity,
        c: &ContactRow,
        kind: Kind,
        text: &str,
        (reply_to, from_agent, to_agent): (Option<&str>, Option<&str>, Option<&str>),
        now: i64,
    ) -> Result<String> {
        let (header, ciphertext) = crypto::seal(&me.id, &c.peer_id, &pinned_key(c)?, text, &mut OsRng)?;
        let body = serde_json::to_vec(&Outgoing { recipient_id: c.peer_id.clone(), header, ciphertext })
            .map_err(|e| Error::Bug(e.to_string()))?;
        let id = uuid::Uuid::new_v4().hyphenated().to_string();
        let sealed = Sealed {
            id: &id,
            protocol: Protocol::Stringcup,
            contact: c,
            kind: kind.as_str(),
            body: text,
            reply_to,
            from_agent,
            to_agent,
            ts: now,
            // The relay that assigned `me`, where the contact lives: the attempt sends through it.
            relay_url: &me.relay,
            target: &c.peer_id,
            drop_code: &[],
            payload: &body,
        };
        outbox::queue(tx, sealed, now).await?;
        Ok(id)
    }

    /// One delivery attempt of a queued Stringcup message.
    pub(in crate::engine) async fn stringcup_attempt(&self, rt: &Runtime, row: &OutboxRow) -> SendOutcome {
        // The identity it was sealed from: the one of the relay it was queued for.
        let (client, me) = match self.identity_at(rt, Some(&row.relay_url)).await {
            Ok(at) => at,
            Err(e) => return SendOutcome::Retry { after_ms: None, reason: format!("unreachable: {e}") },
        };
        match client.send(&me.token, &row.payload, &row.message_id).await {
            sct::SendOutcome::Stored => SendOutcome::Accepted,
            sct::SendOutcome::Retry { after_ms, reason } => SendOutcome::Retry { after_ms, reason },
            sct::SendOutcome::Permanent(reason) => SendOutcome::Permanent(reason),
        }
    }

    /// Records an inbox message dropped before decryption: from a blocked sender (counted and
    /// audited as `blocked`, never stored or shown; the relay names the sender), or naming as
    /// its sender a contact who lives on another relay (one relay cannot speak for another's
    /// identities).
    async fn drop_unopened(rt: &Runtime, sender: &str, msg_id: &str, blocked: Option<i64>, now: i64) -> Result<()> {
        let mut tx = rt.store().write_tx().await?;
        store::mark_seen(&mut tx, Protocol::Stringcup, sender, msg_id, now).await?;
        if let Some(id) = blocked {
            store::count_blocked_drop(&mut tx, id).await?;
        }
        let (state, detail) = match blocked {
            Some(_) => ("blocked", "sender is blocked"),
            None => ("dropped", "sender_id is a contact on another relay than the one that delivered it"),
        };
        let audit = Audit {
            direction: "in",
            protocol: Protocol::Stringcup.as_str(),
            peer: sender,
            message_id: msg_id,
            kind: "send",
            state,
            detail,
        };
        store::audit(&mut tx, now, audit).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Processes one inbox message of identity `me` (read through `client`, its relay's) and
    /// commits it. Returns whether `inbox` will show it.
    async fn stringcup_process(
        &self,
        rt: &Runtime,
        client: &StringcupClient,
        me: &ScIdentity,
        m: &InboxMessageIn,
    ) -> Result<bool> {
        let now = now_ms();
        let msg_id = format!("{}/{}", me.id, m.id);
        let sender = m.sender_id.as_str();
        let mut conn = rt.store().pool.acquire().await?;
        if store::was_seen(&mut conn, Protocol::Stringcup, sender, &msg_id).await? {
            return Ok(false);
        }
        let mut contact = store::contact_by_peer(&mut conn, Protocol::Stringcup, sender).await?;
        // The relay names the sender: one relay cannot speak for a contact who lives on another.
        let own = relay_key(&rt.relay_url());
        let elsewhere =
            contact.as_ref().is_some_and(|c| c.relay_url.as_deref().map_or_else(|| own.clone(), relay_key) != me.relay);
        let blocked = contact.as_ref().filter(|c| c.blocked).map(|c| c.id);
        if elsewhere || blocked.is_some() {
            // Boxed: this rare path's futures would otherwise enlarge every call's stack frame.
            Box::pin(Self::drop_unopened(rt, sender, &msg_id, blocked, now)).await?;
            return Ok(false);
        }
        let pending = store::pending_requests(&mut conn).await?;
        drop(conn);
        // Strangers cannot grow the request list without bound (as with letagents hellos).
        let room = pending < crate::engine::MAX_PENDING_REQUESTS;
        if contact.is_none() && is_identity_id(sender) && room {
            // A stranger: pin its key now and hold what it sent until the user accepts.
            let (key, display) = self.stringcup_lookup_at(client, sender).await?;
            let name = display
                .map(|d| d.chars().filter(|c| c.is_alphanumeric() || "-_.".contains(*c)).take(32).collect::<String>())
                .filter(|d| !d.is_empty())
                .unwrap_or_else(|| sender.chars().take(11).collect());
            let relay = (me.relay != own).then_some(me.relay.as_str());
            let allow = crate::engine::DEFAULT_ALLOW;
            contact = Some(self.pin_contact(rt, sender, &name, &key, allow, ContactState::Pending, relay).await?);
            rt.emit(Event::Request { name });
        }
        // The current key, else one from before a key update (mail sealed before the sender
        // saw the new key); the first error is the one reported.
        let mut plain = crypto::open(sender, &me.id, &me.secret, &m.header, &m.ciphertext);
        if plain.is_err()
            && let Some(text) =
                me.openers().skip(1).find_map(|k| crypto::open(sender, &me.id, k, &m.header, &m.ciphertext).ok())
        {
            plain = Ok(text);
        }
        let mut tx = rt.store().write_tx().await?;
        // The request was committed on its own (above) and the owner may have accepted it since:
        // held or shown is decided on the contact as it is now, inside this write (else a message
        // would be held for an accepted contact and never shown).
        if contact.is_some() {
            contact = store::contact_by_peer(&mut tx, Protocol::Stringcup, sender).await?.or(contact);
        }
        store::mark_seen(&mut tx, Protocol::Stringcup, sender, &msg_id, now).await?;
        let (state, detail, showable) = match (&contact, plain) {
            (_, Err(e)) => ("dropped", format!("undecryptable: {e}"), false),
            (None, Ok(_)) if !room => ("dropped", "unknown_sender: too many pending requests".to_owned(), false),
            (None, Ok(_)) => ("dropped", "sender id is malformed".to_owned(), false),
            (Some(c), Ok(_)) if c.state == ContactState::Active && !c.allow_kinds.split(',').any(|k| k == "send") => {
                ("refused", "kind `send` is not allowed for this contact".to_owned(), false)
            }
            (Some(c), Ok(text)) => {
                let held = c.state != ContactState::Active;
                store::insert_message(
                    &mut tx,
                    &NewMessage {
                        id: &msg_id,
                        direction: "in",
                        protocol: Protocol::Stringcup,
                        contact_id: Some(c.id),
                        peer: sender,
                        kind: "send",
                        body: &text,
                        reply_to: None,
                        from_agent: None,
                        to_agent: None,
                        ts: now,
                        state: if held { "held" } else { "received" },
                        hidden: held,
                        now,
                    },
                )
                .await?;
                if held {
                    ("request", "held until the contact is accepted".to_owned(), false)
                } else {
                    ("received", String::new(), true)
                }
            }
        };
        let audit = Audit {
            direction: "in",
            protocol: Protocol::Stringcup.as_str(),
            peer: sender,
            message_id: &msg_id,
            kind: "send",
            state,
            detail: &detail,
        };
        store::audit(&mut tx, now, audit).await?;
        tx.commit().await?;
        if showable {
            rt.emit(Event::Message { id: msg_id });
        }
        Ok(showable)
    }

    /// Reads one inbox page (holding up to `wait` s), commits each message, then acks the page.
    /// Returns (messages processed, any showable, more waiting, long-poll state).
    async fn stringcup_page(&self, rt: &Runtime, client: &StringcupClient, me: &ScIdentity, wait: u64) -> Result<Page> {
        let (page, long_poll, budget) = client.inbox(&me.token, wait).await?;
        let mut showable = false;
        let mut ids = Vec::with_capacity(page.messages.len());
        for m in &page.messages {
            showable |= self.stringcup_process(rt, client, me, m).await?;
            ids.push(m.id);
        }
        if !ids.is_empty() {
            client.ack(&me.token, &ids).await?;
        }
        Ok(Page { count: ids.len(), showable, more: page.has_more, long_poll, budget })
    }

    /// Drains the inbox of `me` (through `client`) without waiting.
    async fn drain(&self, rt: &Runtime, client: &StringcupClient, me: &ScIdentity) -> Result<usize> {
        let mut total = 0;
        loop {
            let page = self.stringcup_page(rt, client, me, 0).await?;
            total += page.count;
            if !page.more || page.count == 0 {
                return Ok(total);
            }
        }
    }

    /// Drains the inbox of each identity kept on a relay moved away from that still has contacts
    /// there. A relay that is down is logged and skipped: it must not stop the others.
    pub(in crate::engine) async fn stringcup_read_kept(&self, rt: &Runtime) -> usize {
        let kept = match self.kept_in_use(rt).await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!("stringcup identities: {e}");
                return 0;
            }
        };
        let mut n = 0;
        for me in kept {
            let read = async { self.drain(rt, &self.client_for(rt, &me.relay).await?, &me).await };
            match read.await {
                Ok(k) => n += k,
                Err(e) => tracing::info!("stringcup inbox on the relay at {}: {e}", me.relay),
            }
        }
        n
    }

    /// Reads the kept identities' inboxes every [`POLL_INTERVAL_MS`] (the spec's normal pace),
    /// for as long as the runtime runs: their contacts cannot follow a move, so there is no end.
    pub(in crate::engine) async fn stringcup_kept_loop(&self, rt: &Runtime) {
        let mut stop = rt.inner.shutdown.subscribe();
        let mut moved = rt.inner.relay_generation.subscribe();
        loop {
            if self.stringcup_read_kept(rt).await > 0 {
                rt.inner.outbox_wake.notify_one();
            }
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(POLL_INTERVAL_MS)) => {}
                r = moved.changed() => if r.is_err() { return },
                _ = stop.changed() => return,
            }
        }
    }

    /// Drains the own identity's inbox without waiting (zero when it has none), then the kept
    /// identities' (their errors are logged, not returned: an old relay that is down must not
    /// fail a sync).
    pub(in crate::engine) async fn stringcup_sync(&self, rt: &Runtime) -> Result<usize> {
        let mut total = 0;
        if let Some(me) = self.registered(rt).await {
            total += self.drain(rt, &self.client(), &me).await?;
        }
        Ok(total + self.stringcup_read_kept(rt).await)
    }

    /// Long-polls the inbox forever (daemon), or until something showable arrives.
    pub(in crate::engine) async fn stringcup_receive_loop(&self, rt: &Runtime, until_showable: bool) -> Result<()> {
        let mut stop = rt.inner.shutdown.subscribe();
        let mut failures = 0u32;
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let me = match self.stringcup_identity(rt).await {
                Ok(me) => me,
                Err(Error::Transport(TransportError::Status { status: 404 | 405, .. })) => {
                    tracing::info!("the relay does not serve Stringcup (/api/v2)");
                    return Ok(());
                }
                Err(e) => {
                    tracing::debug!("stringcup: {e}");
                    failures = failures.saturating_add(1);
                    self.pause(crate::engine::backoff_ms(failures).max(5_000), &mut stop).await;
                    continue;
                }
            };
            let client = self.client();
            let page = tokio::select! {
                page = self.stringcup_page(rt, &client, &me, sct::MAX_WAIT_SECS) => page,
                _ = stop.changed() => return Ok(()),
            };
            match page {
                Ok(page) => {
                    failures = 0;
                    if page.showable && until_showable {
                        return Ok(());
                    }
                    // A relay that did not hold the request must not be polled at full speed, and
                    // the inbox budget must last until it refills.
                    let mut wait = page.budget.pace_ms(now_ms());
                    if !page.more && page.long_poll != LongPoll::Waited {
                        wait = wait.max(Some(i64::try_from(POLL_INTERVAL_MS).unwrap_or(12_000)));
                    }
                    if let Some(ms) = wait {
                        self.pause(ms, &mut stop).await;
                    }
                }
                Err(e) => {
                    tracing::info!("stringcup inbox: {e}");
                    failures = failures.saturating_add(1);
                    let mut wait = crate::engine::backoff_ms(failures);
                    // A 429 says when to come back (B.8); asking sooner only spends more.
                    if let Error::Transport(TransportError::Status { status: 429, retry_after: Some(secs), .. }) = &e {
                        wait = wait.max(i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX));
                    }
                    self.pause(wait, &mut stop).await;
                }
            }
        }
    }

    async fn pause(&self, ms: i64, stop: &mut tokio::sync::watch::Receiver<bool>) {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(1000))) => {}
            _ = stop.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_relays_identity_has_its_own_keystore_slot() {
        let a = "https://relay-a.example";
        assert_eq!(slot_for(a, &[]), "stringcup", "a profile's first identity, where it always was");
        let h = hex(&sha256(a.as_bytes()));
        let short = format!("stringcup@{}", &h[..8]);
        assert_eq!(slot_for(a, &["stringcup"]), short);
        assert_eq!(slot_for(a, &["stringcup", &short]), format!("stringcup@{h}"), "never one already in use");
        assert_ne!(slot_for("https://relay-b.example", &["stringcup"]), short);
    }

    #[test]
    fn only_a_plain_topic_id_goes_into_a_request_path() {
        assert!(topic_path("tp-cucxeqysmwr2a45nzo34h6lz").is_ok());
        assert!(topic_path("legacy_name-2").is_ok());
        for bad in ["", "x/../../messages", "tp-a?x=1", "a b", "tp-%2e%2e", &"a".repeat(65)] {
            assert!(topic_path(bad).is_err(), "{bad}");
        }
    }
}
