//! The engine's letagents v1 side: contacts by address (a hello introduces us), sealed envelopes
//! through the shared outbox, the receiver's decision (`receive::decide`) with every effect in one
//! transaction, automatic receipts and rosters, and the websocket (or plain GET) inbox.
//!
//! - Outgoing: the inner message is signed and sealed to the pinned keys; the exact envelope is
//!   queued with the message and audit rows before any network I/O.
//! - Incoming: each envelope is opened and judged; seen id, message, contact change, queued
//!   receipt or roster and audit row commit together, and only then is the relay told to delete
//!   it. A burst (the frames the websocket already holds, an inbox page) commits up to 256
//!   envelopes per transaction. A lone envelope's common cases (a known contact's message,
//!   accepted, refused or dropped) are decided and committed on the caller's thread
//!   (`Store::decide_here`), by the same decision and statements.
//! - A running runtime keeps the websocket (ping every 20 s, reconnect with backoff, catch-up from
//!   the waiting backlog); a one-shot one syncs over HTTP.
//! - A relay move: each accepted contact is sent a signed `hello` carrying `moved_to`; one received
//!   from an accepted contact changes that contact's route (and pin, for that URL only) and shows
//!   a line, from anyone else it is dropped (`docs/relay-move.md`). The old relay is read with
//!   [`Letagents::drain_old`] while it drains.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::{Channel, ContactAdd, Outgoing};
use crate::engine::delivery::SenderAuth;
use crate::engine::outbox::{self, Sealed, backoff_ms};
use crate::engine::relays::{Take, canonical_relay_url, take_announcement};
use crate::engine::{DEFAULT_ALLOW, Error, Event, MAX_PENDING_REQUESTS, Result, Runtime, blocking, kinds_to_string};
use crate::protocol::lan::ProtocolTag;
use crate::protocol::letagents::inner::MovedTo;
use crate::protocol::letagents::inner::{ReceiptBody, ReceiptStatus};
use crate::protocol::letagents::receive::{AgentRule, ContactView, RuleAction, Verdict, accepted_status, decide};
use crate::protocol::letagents::wire::{ClientToRelay, RelayToClient};
use crate::protocol::letagents::{self as la, Address, Inner, Kind, PeerKeys};
use crate::store::ContactState;
use crate::store::{self, Audit, ContactRow, DeliveryPath, NewContact, NewMessage, OutboxRow, Protocol, RelayVouch};
use crate::transport::TransportError;
use crate::transport::letagents::{RelayClient, SendOutcome};
use crate::util::{OsRng, now_ms};

/// A client for a contact's relay and the certificate pin it was built with (none: web PKI).
type PinnedClient = (Option<[u8; 32]>, RelayClient);

/// letagents' channel: relay clients for contacts that live on other relays.
#[derive(Default)]
pub(in crate::engine) struct Letagents {
    peers: Mutex<BTreeMap<String, PinnedClient>>,
    /// Receive transactions committed (see [`Letagents::receive_transactions`]).
    receive_txs: AtomicU64,
}

/// Most envelopes of a burst committed in one transaction: bounds how long the write lock is
/// held (other writers wait behind it) and how much one failure sends back to the relay.
const BURST_TX: usize = 256;

/// From how many envelopes a burst chunk is opened on the blocking pool (fewer are opened in
/// place: handing them over would cost more than it frees).
const OPEN_OFF_RUNTIME: usize = 8;

/// What one received envelope leaves to do once its transaction has committed.
#[derive(Default)]
struct Received {
    /// Whether `inbox` will show it.
    showable: bool,
    /// The event to emit.
    event: Option<Event>,
}

impl Received {
    /// Emits the event and wakes the outbox (a receipt or roster may be queued); whether
    /// `inbox` will show it.
    fn publish(self, rt: &Runtime) -> bool {
        if let Some(e) = self.event {
            rt.emit(e);
        }
        rt.inner.outbox_wake.notify_one();
        self.showable
    }
}

/// The pinned keys of a letagents contact.
pub(in crate::engine) fn peer_keys(c: &ContactRow) -> Result<PeerKeys> {
    Ok(PeerKeys {
        sig: c.sig_pub.as_slice().try_into().map_err(|_| Error::Bug("stored sig key has the wrong length".into()))?,
        boxk: c.box_pub.as_slice().try_into().map_err(|_| Error::Bug("stored box key has the wrong length".into()))?,
    })
}

/// What `decide` needs to know of contact `c`, with its agent rules `rules` (from, to, action).
fn contact_view(c: &ContactRow, rules: Vec<(String, String, String)>) -> Result<ContactView> {
    Ok(ContactView {
        keys: peer_keys(c)?,
        allow: c.allow_kinds.split(',').filter_map(Kind::parse).collect(),
        rules: rules
            .into_iter()
            .map(|(from, to, action)| AgentRule {
                from,
                to,
                action: if action == "deny" { RuleAction::Deny } else { RuleAction::Allow },
            })
            .collect(),
        active: c.state == ContactState::Active,
    })
}

/// A message body as stored: a string as it is, anything else as its JSON.
fn stored_body(body: &Value) -> String {
    match body {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The writes of an accepted message from contact `c` (mailbox `peer`): its id marked seen, the
/// message row (hidden from `inbox` for a receipt or a list), and the path that carried it.
fn accepted_stmts(opened: &la::Opened, c: &ContactRow, peer: &str, path: DeliveryPath, now: i64) -> [store::Stmt; 3] {
    let msg_id = &opened.inner.id;
    let body = stored_body(&opened.inner.body);
    let message = NewMessage {
        id: msg_id,
        direction: "in",
        protocol: Protocol::Letagents,
        contact_id: Some(c.id),
        peer,
        kind: opened.kind.as_str(),
        body: &body,
        reply_to: opened.inner.reply_to.as_deref(),
        from_agent: opened.inner.from_agent.as_deref(),
        to_agent: opened.inner.to_agent.as_deref(),
        ts: opened.inner.ts,
        state: "received",
        hidden: matches!(opened.kind, Kind::Receipt | Kind::List),
        now,
    };
    [
        store::mark_seen_stmt(Protocol::Letagents, peer, msg_id, opened.inner.ts),
        store::insert_message_stmt(&message),
        store::set_message_path_stmt("in", Protocol::Letagents, peer, msg_id, path),
    ]
}

/// Records an incoming envelope that was refused before it could be attributed to anyone.
async fn audit_dropped(conn: &mut sqlx::SqliteConnection, now: i64, detail: &str) -> Result<()> {
    let audit = Audit {
        direction: "in",
        protocol: Protocol::Letagents.as_str(),
        peer: "",
        message_id: "",
        kind: "",
        state: "dropped",
        detail,
    };
    Ok(store::audit(conn, now, audit).await?)
}

/// A verified move notice from accepted contact `c` (its signature named the contact; nothing
/// else here is trusted): its route becomes the relay it names, that relay's certificate pin is
/// taken as the contact's vouch for that URL only (as a LAN announcement is: never over another
/// party's pin), and the conversation shows a line. It is not an instruction for anyone: no agent
/// sees it. Inside the receiving transaction; `Err` says why the notice changed nothing.
async fn take_move(
    rt: &Runtime,
    tx: &mut sqlx::SqliteConnection,
    c: &ContactRow,
    moved: &MovedTo,
    inner: &Inner,
    now: i64,
) -> Result<std::result::Result<String, String>> {
    let url = match canonical_relay_url(&moved.url) {
        Ok(u) => u,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let pin = match moved.pin() {
        Ok(p) => p,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let own = url == rt.relay_url().trim_end_matches('/');
    let mut note = String::new();
    if let (Some(pin), false) = (pin, own) {
        let known = store::trusted_relay(tx, &url).await?;
        let vouch = RelayVouch::Contact { id: c.id, expires_at: 0 };
        match take_announcement(known.as_ref(), c.id, &vouch, &pin) {
            Take::Store => store::trust_relay(tx, &url, &pin, &vouch, now).await?,
            Take::Known => {}
            Take::Conflict => {
                note = " (its certificate differs from the one already trusted for that URL, which stays)".into();
            }
        }
    }
    let route = store::ContactUpdate { relay_url: Some(Some(&url)), ..Default::default() };
    store::update_contact(tx, c.id, &route).await?;
    store::insert_message(
        tx,
        &NewMessage {
            id: &inner.id,
            direction: "in",
            protocol: Protocol::Letagents,
            contact_id: Some(c.id),
            peer: &c.peer_id,
            kind: MOVED_KIND,
            body: &url,
            reply_to: None,
            from_agent: None,
            to_agent: None,
            ts: inner.ts,
            state: "received",
            hidden: false,
            now,
        },
    )
    .await?;
    tracing::info!("letagents: contact {} moved to the relay at {url}{note}", c.name);
    Ok(Ok(url))
}

/// The stored kind of a move notice (sent or received): a line in the conversation, never a
/// message an agent is handed.
pub(in crate::engine) const MOVED_KIND: &str = "moved";

impl Channel for Letagents {
    fn claims_address(&self, address: &str) -> bool {
        Address::parse(address).is_ok()
    }

    fn add_contact<'a>(&'a self, rt: &'a Runtime, req: ContactAdd<'a>) -> BoxFuture<'a, Result<String>> {
        Box::pin(self.contact_add(rt, req))
    }

    fn send<'a>(&'a self, rt: &'a Runtime, c: &'a ContactRow, msg: Outgoing<'a>) -> BoxFuture<'a, Result<String>> {
        Box::pin(self.seal_and_queue(rt, c, msg))
    }

    fn attempt<'a>(&'a self, rt: &'a Runtime, row: &'a OutboxRow) -> BoxFuture<'a, Result<SendOutcome>> {
        Box::pin(async move {
            let client = self.client_for(rt, &row.relay_url).await?;
            Ok(client.send(&row.target, &row.drop_code, row.payload.clone()).await)
        })
    }

    fn sync<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, Result<usize>> {
        Box::pin(self.sync_letagents(rt))
    }

    fn run<'a>(&'a self, rt: &'a Runtime, until_showable: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if until_showable {
                self.websocket_session(rt, true).await
            } else {
                self.receiver_loop(rt).await;
                Ok(())
            }
        })
    }

    fn init<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, Result<()>> {
        // Log in once: a letagents mailbox exists from its owner's first login, so contacts can
        // reach us right away. A relay that is down now is not an error for init.
        Box::pin(async move {
            if let Err(e) = self.sync_letagents(rt).await {
                tracing::warn!("could not reach the relay yet: {e}");
            }
            Ok(())
        })
    }

    fn whoami<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, (&'static str, Value)> {
        Box::pin(async move {
            let keys = rt.keys();
            let v = json!({
                "address": rt.inner.id.address().to_string(),
                "mailbox_id": keys.mailbox_id(),
                "safety_number": keys.safety_number(),
                "relay": rt.relay_url(),
            });
            ("letagents", v)
        })
    }

    fn sender_auth(&self) -> SenderAuth {
        // The envelope's inner message is signed by the sender's Ed25519 key, checked on open.
        SenderAuth::SignedEndToEnd
    }

    fn safety_numbers(&self, c: &ContactRow) -> (Option<String>, Option<String>) {
        let keys = peer_keys(c).ok();
        let new = match (&keys, &c.changed_box_pub) {
            (Some(k), Some(b)) => {
                b.as_slice().try_into().ok().map(|boxk| PeerKeys { sig: k.sig, boxk }.safety_number())
            }
            _ => None,
        };
        (keys.map(|k| k.safety_number()), new)
    }

    fn address_with_box(&self, c: &ContactRow, new_box: &[u8]) -> Result<String> {
        let mut a = Address::parse(&c.address).map_err(|e| Error::Bug(e.to_string()))?;
        a.keys.boxk = new_box.try_into().map_err(|_| Error::Bug("box key length".into()))?;
        Ok(a.to_string())
    }

    fn carries_roster(&self) -> bool {
        true
    }

    fn lan_tag(&self) -> Option<ProtocolTag> {
        // The inner message is signed by the sender's key: a LAN peer cannot speak for anyone.
        Some(ProtocolTag::Letagents)
    }

    fn receive_direct<'a>(&'a self, rt: &'a Runtime, sealed: &'a [u8]) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.receive_via(rt, sealed, DeliveryPath::Direct))
    }
}

impl Letagents {
    async fn contact_add(&self, rt: &Runtime, req: ContactAdd<'_>) -> Result<String> {
        let ContactAdd { address, name, allow, relay, hello } = req;
        let addr = Address::parse(address)?;
        let drop =
            addr.drop.ok_or_else(|| Error::Invalid("the address has no drop code: ask for the full address".into()))?;
        if addr.keys == rt.keys() {
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
        let mut tx = rt.store().write_tx().await?;
        let existing = store::contact_by_peer(&mut tx, Protocol::Letagents, &peer_id).await?;
        let name = match existing {
            Some(c) if c.state == ContactState::Pending => {
                // They asked first: adding them is accepting them.
                let new_name = name.unwrap_or(&c.name).to_owned();
                if new_name != c.name && store::name_taken(&mut tx, &new_name).await? {
                    return Err(Error::ContactExists(format!("a contact named `{new_name}` already exists")));
                }
                let accept = store::ContactUpdate {
                    name: Some(&new_name),
                    state: Some(ContactState::Active),
                    allow_kinds: Some(&allow),
                    drop_code: Some(drop.as_slice()),
                    address: Some(&addr.to_string()),
                    relay_url: Some(relay),
                    ..Default::default()
                };
                store::update_contact(&mut tx, c.id, &accept).await?;
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
                        protocol: Protocol::Letagents,
                        peer_id: &peer_id,
                        address: &addr.to_string(),
                        sig_pub: &addr.keys.sig,
                        box_pub: &addr.keys.boxk,
                        drop_code: Some(&drop),
                        relay_url: relay,
                        state: ContactState::Active,
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
            rt.send(&name, Kind::Hello, Value::String(rt.inner.name.clone()), None, None, None).await?;
        }
        Ok(name)
    }

    /// Builds the signed inner message, seals it and queues it.
    async fn seal_and_queue(&self, rt: &Runtime, c: &ContactRow, msg: Outgoing<'_>) -> Result<String> {
        let Outgoing { kind, body, reply_to, from_agent, to_agent } = msg;
        let name = &c.name;
        if let Some(r) = reply_to
            && !la::inner::is_uuid(r)
        {
            return Err(Error::Invalid(format!("`{r}` is not a message id")));
        }
        if c.drop_code.is_none() {
            return Err(Error::Invalid(format!("no drop code for `{name}`: add their full address")));
        }
        let mut inner = Inner::new(&rt.keys(), &c.peer_id, now_ms(), uuid::Uuid::new_v4(), kind, body);
        if kind == Kind::Hello {
            inner.from = rt.inner.id.address().to_string();
        }
        inner.reply_to = reply_to.map(str::to_owned);
        inner.from_agent = from_agent.map(str::to_owned);
        inner.to_agent = to_agent.map(str::to_owned);
        inner.validate()?;
        // Sealed before the transaction (the write lock is not held over the crypto), whose
        // statements then go in one trip, or on the caller's thread (`store::BatchTx`).
        let stmts = self.sealed_stmts(rt, c, &inner, kind.as_str(), None)?;
        let mut tx = rt.store().batch_tx().await?;
        for stmt in stmts {
            tx.queue(stmt);
        }
        rt.commit_batch_queued(tx).await?;
        Ok(inner.id)
    }

    /// Seals `inner` to contact `c` and records it in `tx`: the message row, the outbox entry with
    /// the exact envelope bytes every retry will reuse, and the audit row. The message row keeps
    /// `stored_kind` and `stored_body` (default: the wire body).
    async fn queue_sealed(
        &self,
        rt: &Runtime,
        tx: &mut sqlx::SqliteConnection,
        c: &ContactRow,
        inner: &Inner,
        stored_kind: &str,
        stored_body: Option<&str>,
    ) -> Result<()> {
        let stmts = self.sealed_stmts(rt, c, inner, stored_kind, stored_body)?;
        Ok(crate::store::Stmt::execute_all(stmts, tx).await?)
    }

    /// [`Self::queue_sealed`]'s sealing, and its writes as statements to run or queue.
    fn sealed_stmts(
        &self,
        rt: &Runtime,
        c: &ContactRow,
        inner: &Inner,
        stored_kind: &str,
        stored_body: Option<&str>,
    ) -> Result<[crate::store::Stmt; 3]> {
        let drop =
            c.drop_code.as_deref().ok_or_else(|| Error::Bug("queued to a contact without a drop code".into()))?;
        let json = serde_json::to_string(inner).map_err(|e| Error::Bug(e.to_string()))?;
        let envelope = la::seal(&rt.inner.id.sig, &peer_keys(c)?, &json, &mut OsRng)?;
        let now = now_ms();
        let relay = c.relay_url.clone().unwrap_or_else(|| rt.relay_url());
        let body = match (stored_body, &inner.body) {
            (Some(b), _) => b.to_owned(),
            (None, Value::String(s)) => s.clone(),
            (None, other) => other.to_string(),
        };
        let sealed = Sealed {
            id: &inner.id,
            protocol: Protocol::Letagents,
            contact: c,
            kind: stored_kind,
            body: &body,
            reply_to: inner.reply_to.as_deref(),
            from_agent: inner.from_agent.as_deref(),
            to_agent: inner.to_agent.as_deref(),
            ts: inner.ts,
            relay_url: &relay,
            target: &c.peer_id,
            drop_code: drop,
            payload: &envelope,
        };
        Ok(outbox::queue_stmts(sealed, now))
    }

    async fn client_for(&self, rt: &Runtime, url: &str) -> Result<RelayClient> {
        if url == rt.relay_url() {
            return Ok(rt.relay());
        }
        // A contact's relay that a LAN announcement or the owner pinned (engine::relays), else
        // the web PKI; a client is rebuilt when the pin changes.
        let pin = rt.trusted_relay_pin(url).await?;
        let mut peers = self.peers.lock().await;
        if let Some((p, c)) = peers.get(url)
            && *p == pin
        {
            return Ok(c.clone());
        }
        let c = RelayClient::new(url, pin)?;
        peers.insert(url.to_owned(), (pin, c.clone()));
        Ok(c)
    }

    /// Processes one envelope from the relay and commits every effect. Returns true if it
    /// produced something `inbox` will show. Errors are local (the envelope must not be acked).
    pub(in crate::engine) async fn receive(&self, rt: &Runtime, envelope: &[u8]) -> Result<bool> {
        self.receive_via(rt, envelope, DeliveryPath::Relay).await
    }

    /// [`Self::receive`] for an envelope that came by `path` (a nearby contact hands it over
    /// directly): the same decision and transaction, the path recorded on the message and the
    /// audit row.
    pub(in crate::engine) async fn receive_via(
        &self,
        rt: &Runtime,
        envelope: &[u8],
        path: DeliveryPath,
    ) -> Result<bool> {
        let opened = la::open(envelope, &rt.inner.id.boxs, &rt.keys());
        let received = self.receive_all(rt, vec![opened], path).await?;
        let showable: Vec<bool> = received.into_iter().map(|r| r.publish(rt)).collect();
        Ok(showable.contains(&true))
    }

    /// Decides and commits opened (or refused) envelopes, in order: from the first, as many as
    /// are the common case ([`Self::receive_here`]) in one transaction on the caller's thread;
    /// the rest, from the first it declines (or all, when it cannot run there), in one
    /// transaction through sqlx ([`Self::receive_opened`], which decides every case). The
    /// results, in order; nothing is published yet. On an error nothing of the failing
    /// transaction is kept (the first may have committed).
    async fn receive_all(
        &self,
        rt: &Runtime,
        opened: Vec<std::result::Result<la::Opened, la::OpenError>>,
        path: DeliveryPath,
    ) -> Result<Vec<Received>> {
        let here = rt
            .store()
            .decide_here(|here| {
                let mut done = Vec::new();
                for o in &opened {
                    match self.receive_here(rt, here, o, path)? {
                        Some(received) => done.push(received),
                        None => break,
                    }
                }
                Ok::<_, Error>((!done.is_empty()).then_some(done))
            })
            .await?;
        let mut received = here.unwrap_or_default();
        if !received.is_empty() {
            self.receive_txs.fetch_add(1, Ordering::Relaxed);
        }
        if received.len() < opened.len() {
            // IMMEDIATE: this transaction reads and then writes; a deferred one fails with
            // SQLITE_BUSY_SNAPSHOT when another writer (agent deliveries, the outbox) commits
            // between.
            let mut tx = rt.store().write_tx().await?;
            let skip = received.len();
            for o in opened.into_iter().skip(skip) {
                received.push(self.receive_opened(rt, &mut tx, o, path).await?);
            }
            tx.commit().await?;
            self.receive_txs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(received)
    }

    /// Processes a burst of envelopes from the relay (what a websocket or an inbox page hands
    /// over at once), in order, each by exactly the rules of [`Self::receive`], committing them
    /// together: one transaction per [`BURST_TX`] envelopes instead of one each (two where the
    /// caller's thread leaves the rest of a chunk to sqlx: [`Self::receive_all`]). Envelopes are
    /// opened (the crypto) before the write lock is taken. Returns, per envelope, whether it
    /// produced something `inbox` will show. On an error nothing of the failing transaction is
    /// kept and the caller must not ack any envelope of it (those before it committed already
    /// and their results are lost with the error: the relay delivers them again and the seen
    /// ids drop them).
    pub(in crate::engine) async fn receive_burst(&self, rt: &Runtime, envelopes: &[Vec<u8>]) -> Result<Vec<bool>> {
        let mut showable = Vec::with_capacity(envelopes.len());
        let me = rt.keys();
        for chunk in envelopes.chunks(BURST_TX) {
            // Opening is CPU work (an X25519 agreement, a signature check, the AEAD; ~0.4 ms each
            // in a debug build): a large chunk runs on the blocking pool, so a backlog does not
            // hold one of the runtime's workers (and whatever else is scheduled on it) for 100 ms.
            let opened: Vec<_> = if chunk.len() >= OPEN_OFF_RUNTIME {
                let (owned, rt2) = (chunk.to_vec(), rt.clone());
                blocking(move || owned.iter().map(|e| la::open(e, &rt2.inner.id.boxs, &me)).collect()).await?
            } else {
                chunk.iter().map(|e| la::open(e, &rt.inner.id.boxs, &me)).collect()
            };
            let received = self.receive_all(rt, opened, DeliveryPath::Relay).await?;
            showable.extend(received.into_iter().map(|r| r.publish(rt)));
        }
        Ok(showable)
    }

    /// How many receive transactions have committed: one per envelope received alone, one per
    /// burst chunk, and one more where the caller's thread left the rest of either to sqlx.
    pub(in crate::engine) fn receive_transactions(&self) -> u64 {
        self.receive_txs.load(Ordering::Relaxed)
    }

    /// [`Self::receive_opened`]'s common cases, decided inside a transaction on the caller's
    /// thread (`Store::decide_here`: no trip per statement): a message (not a receipt, roster
    /// or list, and no move notice) from a known contact that is not blocked, accepted, refused
    /// (but for a changed key) or dropped, by the same decision (`decide`) and the same
    /// statements as there. `None` for every other case (nothing written), which
    /// `receive_opened` decides.
    fn receive_here(
        &self,
        rt: &Runtime,
        here: &store::Here<'_>,
        opened: &std::result::Result<la::Opened, la::OpenError>,
        path: DeliveryPath,
    ) -> Result<Option<Received>> {
        let Ok(opened) = opened else { return Ok(None) };
        if opened.inner.moved_to.is_some() || matches!(opened.kind, Kind::Receipt | Kind::Roster | Kind::List) {
            return Ok(None);
        }
        let now = now_ms();
        let peer = opened.sender().mailbox_id();
        let Some(c) = here.contact_by_peer(Protocol::Letagents, &peer)?.filter(|c| !c.blocked) else {
            return Ok(None);
        };
        let view = contact_view(&c, here.rules_for(c.id)?)?;
        let msg_id = &opened.inner.id;
        let seen = here.was_seen(Protocol::Letagents, &peer, msg_id)?;
        let audit = |state, detail| Audit {
            direction: "in",
            protocol: Protocol::Letagents.as_str(),
            peer: &peer,
            message_id: msg_id,
            kind: opened.kind.as_str(),
            state,
            detail,
        };
        match decide(opened, Some(&view), seen, now) {
            Verdict::Drop(reason) => {
                here.run(&store::audit_stmt(now, audit("dropped", reason.as_str()), Some(path)))?;
                Ok(Some(Received::default()))
            }
            Verdict::Accept { receipt } => {
                for stmt in accepted_stmts(opened, &c, &peer, path, now) {
                    here.run(&stmt)?;
                }
                if receipt {
                    let status = accepted_status(rt.inner.listeners.load(Ordering::SeqCst) > 0);
                    for stmt in self.receipt_stmts(rt, &c, msg_id, status, "")? {
                        here.run(&stmt)?;
                    }
                }
                here.run(&store::audit_stmt(now, audit("received", ""), Some(path)))?;
                Ok(Some(Received { showable: true, event: Some(Event::Message { id: msg_id.clone() }) }))
            }
            Verdict::Refuse { reason, receipt } if reason != la::receive::RefuseReason::KeyChanged => {
                here.run(&store::mark_seen_stmt(Protocol::Letagents, &peer, msg_id, opened.inner.ts))?;
                let detail = reason.detail();
                if receipt {
                    for stmt in self.receipt_stmts(rt, &c, msg_id, ReceiptStatus::Refused, &detail)? {
                        here.run(&stmt)?;
                    }
                }
                here.run(&store::audit_stmt(now, audit("refused", &detail), Some(path)))?;
                Ok(Some(Received::default()))
            }
            Verdict::PendingRequest | Verdict::RefreshAddress | Verdict::Refuse { .. } => Ok(None),
        }
    }

    /// The decision on one opened (or refused) envelope and every effect of it, written into
    /// `tx`; the caller commits and then publishes the result.
    async fn receive_opened(
        &self,
        rt: &Runtime,
        tx: &mut sqlx::SqliteConnection,
        opened: std::result::Result<la::Opened, la::OpenError>,
        path: DeliveryPath,
    ) -> Result<Received> {
        let now = now_ms();
        let opened = match opened {
            Ok(o) => o,
            Err(e) => {
                audit_dropped(tx, now, &format!("refused envelope: {e}")).await?;
                return Ok(Received::default());
            }
        };
        let peer = opened.sender().mailbox_id();
        let msg_id = opened.inner.id.clone();
        let kind = opened.kind;
        let contact = store::contact_by_peer(tx, Protocol::Letagents, &peer).await?;
        // A blocked sender (the signature names it) is dropped here: no request, no receipt, no
        // message; counted and audited.
        if let Some(c) = contact.as_ref().filter(|c| c.blocked) {
            store::count_blocked_drop(tx, c.id).await?;
            let audit = Audit {
                direction: "in",
                protocol: Protocol::Letagents.as_str(),
                peer: &peer,
                message_id: &msg_id,
                kind: kind.as_str(),
                state: "blocked",
                detail: "sender is blocked",
            };
            store::audit(tx, now, audit).await?;
            return Ok(Received::default());
        }
        let view = match &contact {
            Some(c) => Some(contact_view(c, store::rules_for(tx, c.id).await?)?),
            None => None,
        };
        let seen = store::was_seen(tx, Protocol::Letagents, &peer, &msg_id).await?;
        let mut verdict = decide(&opened, view.as_ref(), seen, now);
        // A move notice counts only from an accepted contact: from anyone else it is not a
        // request either (a real one is a plain hello).
        if opened.inner.moved_to.is_some() && verdict == Verdict::PendingRequest {
            verdict = Verdict::Drop(match &contact {
                Some(_) => la::receive::DropReason::NotAccepted,
                None => la::receive::DropReason::UnknownSender,
            });
        }
        if verdict == Verdict::PendingRequest && contact.is_none() {
            // Strangers cannot grow the request list without bound.
            let pending = store::pending_requests(tx).await?;
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
                store::mark_seen(tx, Protocol::Letagents, &peer, &msg_id, opened.inner.ts).await?;
                let body = opened.inner.text().chars().take(64).collect::<String>();
                let full = opened.from.to_string();
                let drop = opened.from.drop.unwrap_or_default();
                match &contact {
                    Some(c) => {
                        let request = store::ContactUpdate {
                            request_body: Some(&body),
                            drop_code: Some(drop.as_slice()),
                            address: Some(&full),
                            ..Default::default()
                        };
                        store::update_contact(tx, c.id, &request).await?;
                        event = Some(Event::Request { name: c.name.clone() });
                    }
                    None => {
                        let base: String = body.chars().filter(|c| c.is_alphanumeric() || "-_.".contains(*c)).collect();
                        let base = if base.is_empty() { peer.chars().take(8).collect() } else { base };
                        let mut name = base.clone();
                        let mut n = 2;
                        while store::name_taken(tx, &name).await? {
                            name = format!("{base}-{n}");
                            n += 1;
                        }
                        store::insert_contact(
                            tx,
                            &NewContact {
                                name: &name,
                                protocol: Protocol::Letagents,
                                peer_id: &peer,
                                address: &full,
                                sig_pub: &opened.from.keys.sig,
                                box_pub: &opened.from.keys.boxk,
                                drop_code: Some(&drop),
                                relay_url: None,
                                state: ContactState::Pending,
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
                store::mark_seen(tx, Protocol::Letagents, &peer, &msg_id, opened.inner.ts).await?;
                if let (Some(c), Some(drop)) = (&contact, opened.from.drop) {
                    let address = opened.from.to_string();
                    let refresh = store::ContactUpdate {
                        drop_code: Some(drop.as_slice()),
                        address: Some(&address),
                        ..Default::default()
                    };
                    store::update_contact(tx, c.id, &refresh).await?;
                }
                match (&contact, &opened.inner.moved_to) {
                    (Some(c), Some(moved)) => match take_move(rt, &mut *tx, c, moved, &opened.inner, now).await? {
                        Ok(url) => {
                            showable = true;
                            event = Some(Event::Message { id: msg_id.clone() });
                            audit_in("received", format!("moved to the relay at {url}"))
                        }
                        Err(why) => audit_in("refused", format!("move notice not taken: {why}")),
                    },
                    _ => audit_in("received", "hello from a known contact: address refreshed".into()),
                }
            }
            Verdict::Refuse { reason, receipt } => {
                store::mark_seen(tx, Protocol::Letagents, &peer, &msg_id, opened.inner.ts).await?;
                if let (la::receive::RefuseReason::KeyChanged, Some(c)) = (reason, &contact) {
                    let changed = store::ContactUpdate {
                        changed_box_pub: Some(Some(opened.from.keys.boxk.as_slice())),
                        key_changed_at: Some(Some(now)),
                        ..Default::default()
                    };
                    store::update_contact(tx, c.id, &changed).await?;
                    event = Some(Event::KeyChanged { name: c.name.clone() });
                }
                if *receipt && let Some(c) = &contact {
                    self.queue_receipt(rt, tx, c, &msg_id, ReceiptStatus::Refused, &reason.detail()).await?;
                }
                audit_in("refused", reason.detail())
            }
            Verdict::Accept { receipt } => {
                let Some(c) = &contact else {
                    return Err(Error::Bug("accepted without a contact".into()));
                };
                store::Stmt::execute_all(accepted_stmts(&opened, c, &peer, path, now), tx).await?;
                let hidden = matches!(kind, Kind::Receipt | Kind::List);
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
                            if store::set_outgoing_state(tx, target, &peer, state, &detail).await? {
                                store::audit(
                                    tx,
                                    now,
                                    Audit {
                                        direction: "out",
                                        protocol: Protocol::Letagents.as_str(),
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
                        let body = stored_body(&opened.inner.body);
                        let roster = store::ContactUpdate { roster: Some(&body), ..Default::default() };
                        store::update_contact(tx, c.id, &roster).await?;
                    }
                    Kind::List => {
                        let roster = rt.roster().await?;
                        self.queue_reply(rt, tx, c, Kind::Roster, roster, Some(&msg_id)).await?;
                    }
                    _ => {}
                }
                if *receipt {
                    let status = accepted_status(rt.inner.listeners.load(Ordering::SeqCst) > 0);
                    self.queue_receipt(rt, tx, c, &msg_id, status, "").await?;
                }
                if showable {
                    event = Some(Event::Message { id: msg_id.clone() });
                }
                audit_in("received", String::new())
            }
        };
        store::audit_via(
            tx,
            now,
            Audit {
                direction: "in",
                protocol: Protocol::Letagents.as_str(),
                peer: &peer,
                message_id: &msg_id,
                kind: kind.as_str(),
                state,
                detail: &detail,
            },
            Some(path),
        )
        .await?;
        Ok(Received { showable, event })
    }

    async fn queue_receipt(
        &self,
        rt: &Runtime,
        tx: &mut sqlx::SqliteConnection,
        c: &ContactRow,
        about: &str,
        status: ReceiptStatus,
        detail: &str,
    ) -> Result<()> {
        Ok(store::Stmt::execute_all(self.receipt_stmts(rt, c, about, status, detail)?, tx).await?)
    }

    /// [`Self::queue_receipt`]'s receipt, sealed, as the statements that queue it.
    fn receipt_stmts(
        &self,
        rt: &Runtime,
        c: &ContactRow,
        about: &str,
        status: ReceiptStatus,
        detail: &str,
    ) -> Result<Vec<store::Stmt>> {
        let body = serde_json::to_value(ReceiptBody { status, detail: detail.into() })
            .map_err(|e| Error::Bug(e.to_string()))?;
        self.reply_stmts(rt, c, Kind::Receipt, body, Some(about))
    }

    /// Seals and queues an automatic message inside the receiving transaction.
    async fn queue_reply(
        &self,
        rt: &Runtime,
        tx: &mut sqlx::SqliteConnection,
        c: &ContactRow,
        kind: Kind,
        body: Value,
        reply_to: Option<&str>,
    ) -> Result<()> {
        Ok(store::Stmt::execute_all(self.reply_stmts(rt, c, kind, body, reply_to)?, tx).await?)
    }

    /// [`Self::queue_reply`]'s message, sealed, as the statements that queue it (none to a
    /// contact without a drop code).
    fn reply_stmts(
        &self,
        rt: &Runtime,
        c: &ContactRow,
        kind: Kind,
        body: Value,
        reply_to: Option<&str>,
    ) -> Result<Vec<store::Stmt>> {
        if c.drop_code.is_none() {
            return Ok(Vec::new());
        }
        let mut inner = Inner::new(&rt.keys(), &c.peer_id, now_ms(), uuid::Uuid::new_v4(), kind, body);
        inner.reply_to = reply_to.map(str::to_owned);
        Ok(self.sealed_stmts(rt, c, &inner, kind.as_str(), None)?.into())
    }

    /// Tells every accepted letagents contact that this profile now receives at `url` (pinned by
    /// `pin_hex` when not empty): a signed `hello` carrying `moved_to`, queued to the relay where
    /// each contact lives, in one transaction. Answers how many were told.
    pub(in crate::engine) async fn notify_moved(&self, rt: &Runtime, url: &str, pin_hex: &str) -> Result<usize> {
        let contacts = rt.store().contacts(Some(ContactState::Active)).await?;
        let moved_to = MovedTo { url: url.to_owned(), cert_sha256: Some(pin_hex.to_owned()).filter(|p| !p.is_empty()) };
        let mut tx = rt.store().write_tx().await?;
        let mut told = 0;
        for c in contacts.iter().filter(|c| c.protocol == Protocol::Letagents && !c.blocked && c.drop_code.is_some()) {
            let mut inner = Inner::new(
                &rt.keys(),
                &c.peer_id,
                now_ms(),
                uuid::Uuid::new_v4(),
                Kind::Hello,
                Value::String(rt.inner.name.clone()),
            );
            inner.from = rt.inner.id.address().to_string();
            inner.moved_to = Some(moved_to.clone());
            inner.validate()?;
            // The stored row is the conversation's line (the relay); the wire body is our name.
            self.queue_sealed(rt, &mut tx, c, &inner, MOVED_KIND, Some(url)).await?;
            told += 1;
        }
        rt.commit_queued(tx).await?;
        Ok(told)
    }

    /// Receives the base64url envelopes a relay handed over together ([`Self::receive_burst`]);
    /// one that is not base64url is audited and dropped. True if any produced something `inbox`
    /// will show.
    async fn receive_frames(&self, rt: &Runtime, cts: impl IntoIterator<Item = String>) -> Result<bool> {
        let mut envelopes = Vec::new();
        for ct in cts {
            match crate::util::b64u_decode(&ct) {
                Some(bytes) => envelopes.push(bytes),
                None => {
                    let mut conn = rt.store().pool.acquire().await?;
                    audit_dropped(&mut conn, now_ms(), "relay sent an envelope that is not base64url").await?;
                }
            }
        }
        Ok(self.receive_burst(rt, &envelopes).await?.into_iter().any(|s| s))
    }

    /// Reads everything waiting in the letagents mailbox (plain GET), processes and acks it.
    async fn sync_letagents(&self, rt: &Runtime) -> Result<usize> {
        let n = self.sync_at(rt, &rt.relay()).await?;
        rt.set_health("reachable", "");
        Ok(n)
    }

    /// Reads our mailbox on the relay at `url`, which the profile moved away from (its pin, if
    /// it had one, is in `trusted_relays`): what contacts sent there before they learned the move.
    pub(in crate::engine) async fn drain_old(&self, rt: &Runtime, url: &str) -> Result<usize> {
        let client = self.client_for(rt, url).await?;
        self.sync_at(rt, &client).await
    }

    async fn sync_at(&self, rt: &Runtime, relay: &RelayClient) -> Result<usize> {
        let mut total = 0;
        loop {
            let msgs = relay.inbox(&rt.inner.id.sig, &rt.inner.id.drop).await?;
            let n = msgs.len();
            let done: Vec<i64> = msgs.iter().map(|m| m.seq).collect();
            self.receive_frames(rt, msgs.into_iter().map(|m| m.ct)).await?;
            if !done.is_empty() {
                relay.ack(&rt.inner.id.sig, &done).await?;
            }
            total += n;
            if n < la::wire::INBOX_PAGE {
                return Ok(total);
            }
        }
    }

    /// One websocket session: catch up, then live delivery until the socket ends. With
    /// `until_showable`, returns as soon as something `inbox` shows arrives.
    async fn websocket_session(&self, rt: &Runtime, until_showable: bool) -> Result<()> {
        let ws = rt.relay().connect(&rt.inner.id.sig, &rt.inner.id.drop).await?;
        rt.set_health("connected", "");
        rt.inner.outbox_wake.notify_one();
        let (mut tx, mut rx) = ws.split();
        let mut ping = tokio::time::interval(Duration::from_secs(20));
        ping.tick().await;
        let mut stop = rt.inner.shutdown.subscribe();
        let mut awaiting_pong = false;
        loop {
            tokio::select! {
                frame = rx.next() => {
                    let Some(frame) = frame else { break };
                    let frame = frame.map_err(|e| TransportError::Unreachable(e.to_string()))?;
                    // The frames the socket already holds join this one's transaction (a
                    // burst: the backlog on connect, or senders faster than our commits).
                    let mut frames = vec![frame];
                    let mut closed = false;
                    while frames.len() < BURST_TX {
                        match rx.next().now_or_never() {
                            Some(Some(f)) => frames.push(f.map_err(|e| TransportError::Unreachable(e.to_string()))?),
                            Some(None) => {
                                closed = true;
                                break;
                            }
                            None => break,
                        }
                    }
                    let mut seqs = Vec::with_capacity(frames.len());
                    let mut cts = Vec::with_capacity(frames.len());
                    for frame in frames {
                        let WsMessage::Text(text) = frame else { continue };
                        match serde_json::from_str::<RelayToClient>(text.as_str()) {
                            Ok(RelayToClient::Msg { seq, ct }) => {
                                seqs.push(seq);
                                cts.push(ct);
                            }
                            Ok(RelayToClient::Ready) => {}
                            Ok(RelayToClient::Pong) => awaiting_pong = false,
                            Err(_) => tracing::warn!("relay sent an unknown frame"),
                        }
                    }
                    let showable = self.receive_frames(rt, cts).await?;
                    // Acks only after the commit: an envelope is deleted once it is ours.
                    for seq in seqs {
                        let ack = serde_json::to_string(&ClientToRelay::Ack { seq }).map_err(|e| Error::Bug(e.to_string()))?;
                        tx.feed(WsMessage::text(ack)).await.map_err(|e| TransportError::Unreachable(e.to_string()))?;
                    }
                    tx.flush().await.map_err(|e| TransportError::Unreachable(e.to_string()))?;
                    if showable && until_showable {
                        return Ok(());
                    }
                    if closed {
                        break;
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

    async fn receiver_loop(&self, rt: &Runtime) {
        let mut attempt = 0u32;
        let mut stop = rt.inner.shutdown.subscribe();
        loop {
            let started = tokio::time::Instant::now();
            let result = self.websocket_session(rt, false).await;
            if *stop.borrow() {
                return;
            }
            if let Err(e) = result {
                tracing::info!("relay connection: {e}");
                rt.set_health("disconnected", &e.to_string());
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
}
