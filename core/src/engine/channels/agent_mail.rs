//! The engine's Agent Mail 1.0 side: our mailbox (Agent ID key and card keys in the keystore,
//! cards published to the relay), contacts by mail address with pinned cards, sends through the
//! outbox, and the owner's polled mailbox list.
//!
//! - Every signed object (card or packet) takes the next nonce of our one sequence, committed
//!   before the object leaves. A card is republished with a higher nonce when it nears expiry
//!   (with a new X25519 key; older keys stay retained until their `receive_until`).
//! - A contact is added by address: its card is fetched from the address's routes, verified under
//!   the address's Agent ID and pinned (greatest nonce; same-nonce conflicts and older cards
//!   refused). Every message we send carries our current card as its reply card.
//! - A send commits the immutable message, the sealed packet (exact bytes every retry reuses) and
//!   the outbox row in one transaction; `stale_card` re-encrypts the same message under the
//!   recipient's newer card.
//! - Receiving runs `recipient`'s pipeline in the spec's order; a new message is committed (with
//!   its deduplication row, contact changes and audit) before the packet is deleted at the relay.
//!   Unknown senders become pending requests; replies are linked only when their bindings hold.

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use serde_json::{Value, json};
use sqlx::Row;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

use futures_util::future::BoxFuture;
use tokio::sync::Mutex;

use super::{Channel, ContactAdd};
use crate::engine::delivery::SenderAuth;
use crate::engine::outbox::{self, Sealed};
use crate::engine::{Error, Event, Result, Runtime, blocking};
use crate::identity::keystore::Keystore;
use crate::protocol::agent_identity::jwt::sign_request_jwt;
use crate::protocol::agent_identity::live_write::{apply_max_seen_nonce, next_nonce};
use crate::protocol::agent_identity::{AgentId, Hash32, Origin};
use crate::protocol::agent_mail::card::{CardPayload, PinOutcome, check_pin};
use crate::protocol::agent_mail::message::check_reply;
use crate::protocol::agent_mail::packet::{Packet, SealRequest, seal};
use crate::protocol::agent_mail::recipient::{
    MessageCommitment, ReceiveError, RetainedKey, SenderPolicy, Verdict, verify_packet,
};
use crate::protocol::agent_mail::relay::PacketRecord;
use crate::protocol::agent_mail::{DAY_MS, Id16, MAX_TTL_MS, MailAddress, MailboxCard, Message, Part, Pin};
use crate::protocol::letagents::{Kind, STALE_AFTER_MS};
use crate::store::{self, Audit, ContactRow, DeliveryPath, NewContact, NewMessage, OutboxRow, Protocol};
use crate::transport::TransportError;
use crate::transport::agent_mail::{Delivered, MailClient, Published};
use crate::transport::letagents::{RelayClient, SendOutcome};
use crate::util::{OsRng, b64u, b64u_array, b64u_decode, now_ms, random_array};

/// The protocol.
const AM: Protocol = Protocol::AgentMail;
/// How often a live runtime lists its mailbox (relay-lite does not hold list requests).
const POLL_INTERVAL_MS: i64 = 2_000;
/// A card is replaced (new key, higher nonce) when it has less than this left.
const RENEW_BEFORE_MS: i64 = 7 * DAY_MS;
/// Lifetime of the messages we send.
const MESSAGE_TTL_MS: i64 = 7 * DAY_MS;
/// Our cards' packet limit.
const CARD_MAX_PACKET_BYTES: usize = 1_048_576;
/// Page size of mailbox lists.
const LIST_LIMIT: usize = 100;

/// Agent Mail's channel: our mailbox identity, made the first time it is needed.
pub(in crate::engine) struct AgentMail {
    state: Mutex<Option<AmState>>,
}

/// Our Agent Mail identity: the Agent ID key, the mailbox and the card secrets by public key.
#[derive(Clone)]
struct AmState {
    key: SigningKey,
    id: AgentId,
    mailbox: Id16,
    origin: Origin,
    secrets: BTreeMap<[u8; 32], StaticSecret>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    seed: String,
    mailbox: String,
    /// Card secrets by public key (base64url both).
    keys: BTreeMap<String, String>,
}

fn slot(ks: &Keystore) -> std::result::Result<Keystore, crate::identity::keystore::KeystoreError> {
    ks.slot("agent_mail")
}

fn bug(e: impl std::fmt::Display) -> Error {
    Error::Bug(e.to_string())
}

/// The Agent Mail origin of a relay base URL: `https://` + its authority (a loopback relay served
/// over plain http still names itself by its `https` origin, as relay-lite does).
fn origin_of(relay_url: &str) -> Result<Origin> {
    let url = url::Url::parse(relay_url).map_err(|e| Error::Invalid(format!("relay URL: {e}")))?;
    let host = url.host_str().ok_or_else(|| Error::Invalid("relay URL has no host".into()))?;
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    };
    Origin::parse(&format!("https://{authority}")).map_err(|e| Error::Invalid(format!("relay origin: {e}")))
}

/// Loads the identity if this profile made one.
async fn load(store: &crate::store::Store, ks: &std::sync::Arc<Keystore>, relay_url: &str) -> Result<Option<AmState>> {
    if store.meta("agent_mail_id").await?.is_none() {
        return Ok(None);
    }
    let ks = ks.clone();
    let raw = blocking(move || slot(&ks)?.load()).await??.ok_or_else(|| bug("agent mail key missing"))?;
    let stored: Stored = serde_json::from_slice(&raw).map_err(|e| bug(format!("agent mail key: {e}")))?;
    let seed: [u8; 32] =
        b64u_decode(&stored.seed).and_then(|v| v.try_into().ok()).ok_or_else(|| bug("agent mail seed"))?;
    let key = SigningKey::from_bytes(&seed);
    let mut secrets = BTreeMap::new();
    for (public, secret) in &stored.keys {
        let p: [u8; 32] = b64u_decode(public).and_then(|v| v.try_into().ok()).ok_or_else(|| bug("card key"))?;
        let s: [u8; 32] = b64u_decode(secret).and_then(|v| v.try_into().ok()).ok_or_else(|| bug("card secret"))?;
        secrets.insert(p, StaticSecret::from(s));
    }
    let mailbox = Id16::parse(&stored.mailbox).ok_or_else(|| bug("agent mail mailbox"))?;
    Ok(Some(AmState { id: AgentId::of(&key), key, mailbox, origin: origin_of(relay_url)?, secrets }))
}

/// The text an agent or user sees: text parts in order; other parts are named, never opened.
fn body_text(m: &Message) -> String {
    let mut out = Vec::new();
    for p in &m.parts {
        match p.as_text() {
            Some(t) => out.push(t.to_owned()),
            None => out.push(format!(
                "[attachment {} ({}, {} bytes), not opened]",
                p.display_name().unwrap_or_else(|| "unnamed".into()),
                p.media_type,
                p.data.len()
            )),
        }
    }
    out.join("\n")
}

/// The stored pin for `(owner, mailbox)` and its card.
async fn pin_of(
    conn: &mut sqlx::SqliteConnection,
    owner: &AgentId,
    mailbox: &Id16,
) -> Result<Option<(Pin, MailboxCard)>> {
    let row = sqlx::query("SELECT card FROM am_pins WHERE owner = ? AND mailbox_id = ?")
        .bind(owner.to_string())
        .bind(mailbox.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let bytes: Vec<u8> = row.get(0);
    let card = MailboxCard::parse(&bytes).map_err(|e| bug(format!("stored pin: {e}")))?;
    Ok(Some((Pin::of(&card), card)))
}

/// Applies the pin rule to a verified card and stores an advanced pin. Returns the card to use.
async fn observe_card(conn: &mut sqlx::SqliteConnection, card: &MailboxCard) -> Result<MailboxCard> {
    let current = pin_of(conn, card.owner(), &card.mailbox_id()).await?;
    match check_pin(current.as_ref().map(|(p, _)| p), card) {
        Ok(PinOutcome::Same) => Ok(card.clone()),
        Ok(PinOutcome::Advanced(pin)) => {
            sqlx::query(
                "INSERT INTO am_pins (owner, mailbox_id, nonce, card_hash, created_at, card) VALUES (?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (owner, mailbox_id) DO UPDATE SET nonce = excluded.nonce, card_hash = excluded.card_hash, \
                 created_at = excluded.created_at, card = excluded.card",
            )
            .bind(pin.owner.to_string())
            .bind(pin.mailbox_id.to_string())
            .bind(i64::try_from(pin.nonce).map_err(bug)?)
            .bind(pin.card_hash.to_string())
            .bind(pin.created_at)
            .bind(card.to_jcs())
            .execute(&mut *conn)
            .await?;
            Ok(card.clone())
        }
        Err(e) => match current {
            // An older or conflicting card from a route: keep using the pinned one.
            Some((_, pinned)) => {
                tracing::info!("agent mail: card refused by the pin ({e}); keeping the pinned card");
                Ok(pinned)
            }
            None => Err(Error::CardRefused(e)),
        },
    }
}

/// Takes the next nonce of our one sequence inside `tx`.
async fn take_nonce(tx: &mut sqlx::SqliteConnection, now: i64) -> Result<u64> {
    let last: Option<String> =
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'agent_mail_nonce'").fetch_optional(&mut *tx).await?;
    let nonce = next_nonce(last.and_then(|l| l.parse().ok()), now);
    store::set_meta(tx, "agent_mail_nonce", &nonce.to_string()).await?;
    Ok(nonce)
}

impl Channel for AgentMail {
    fn claims_address(&self, address: &str) -> bool {
        address.starts_with(crate::protocol::agent_identity::agent_id::AGENT_ID_PREFIX)
    }

    fn add_contact<'a>(&'a self, rt: &'a Runtime, req: ContactAdd<'a>) -> BoxFuture<'a, Result<String>> {
        Box::pin(self.agent_mail_contact_add(rt, req.address, req.name, req.allow))
    }

    fn send<'a>(
        &'a self,
        rt: &'a Runtime,
        c: &'a ContactRow,
        msg: super::Outgoing<'a>,
    ) -> BoxFuture<'a, Result<String>> {
        Box::pin(async move {
            let text = msg.body.as_str().ok_or_else(|| Error::Invalid("Agent Mail carries text here".into()))?;
            if !matches!(msg.kind, Kind::Send | Kind::Ask | Kind::Reply) {
                return Err(Error::Invalid(format!(
                    "`{}` is a letagents kind; Agent Mail carries text",
                    msg.kind.as_str()
                )));
            }
            let kind = msg.kind.as_str();
            self.agent_mail_send(rt, c, kind, text, msg.reply_to, None, msg.from_agent, msg.to_agent).await
        })
    }

    fn attempt<'a>(&'a self, rt: &'a Runtime, row: &'a OutboxRow) -> BoxFuture<'a, Result<SendOutcome>> {
        Box::pin(async move { Ok(self.agent_mail_attempt(rt, row).await) })
    }

    /// At the message's deadline (§7.3: retries reuse the packet until its expiration, and an
    /// expired message is never renewed), which the packet header carries.
    fn give_up_at(&self, row: &OutboxRow) -> Option<(i64, &'static str)> {
        match Packet::parse(&row.payload) {
            Ok(p) => Some((p.header().expires_at, "at the message's deadline")),
            Err(_) => Some((row.created_at.saturating_add(STALE_AFTER_MS), "after 48 h")),
        }
    }

    fn sync<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, Result<usize>> {
        Box::pin(self.agent_mail_sync(rt))
    }

    fn run<'a>(&'a self, rt: &'a Runtime, until_showable: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.agent_mail_receive_loop(rt, until_showable))
    }

    fn init<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, Result<()>> {
        // Keys and the first card are made locally; publishing it is retried whenever the relay
        // is next reached.
        Box::pin(async move {
            self.am_state(rt).await?;
            if let Err(e) = self.agent_mail_publish(rt).await {
                tracing::info!("Agent Mail card not published yet: {e}");
            }
            Ok(())
        })
    }

    fn housekeeping<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.agent_mail_forget_retired(rt).await {
                tracing::warn!("agent mail: erasing retired card keys: {e}");
            }
        })
    }

    fn whoami<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, (&'static str, Value)> {
        Box::pin(async move { ("agent_mail", self.agent_mail_whoami(rt).await) })
    }

    fn sender_auth(&self) -> SenderAuth {
        // Every packet is signed by the sender's Agent ID key (Identity §6.4), verified before admission.
        SenderAuth::SignedEndToEnd
    }

    fn safety_numbers(&self, c: &ContactRow) -> (Option<String>, Option<String>) {
        // Agent Mail's identity is the Agent ID itself; cards (and their keys) rotate under it.
        (Some(c.peer_id.clone()), None)
    }

    fn address_with_box(&self, c: &ContactRow, _new_box: &[u8]) -> Result<String> {
        // Cards rotate under the Agent ID, which is the address; no box key is pinned here.
        Ok(c.address.clone())
    }
}

impl AgentMail {
    /// The channel, with the mailbox this profile made (if any).
    pub(in crate::engine) async fn load(
        store: &crate::store::Store,
        ks: &std::sync::Arc<Keystore>,
        relay_url: &str,
    ) -> Result<AgentMail> {
        Ok(AgentMail { state: Mutex::new(load(store, ks, relay_url).await?) })
    }

    async fn save_am(&self, rt: &Runtime, st: &AmState) -> Result<()> {
        let stored = Stored {
            seed: b64u(st.key.as_bytes()),
            mailbox: st.mailbox.to_string(),
            keys: st.secrets.iter().map(|(p, s)| (b64u(p), b64u(s.as_bytes()))).collect(),
        };
        let bytes = Zeroizing::new(serde_json::to_vec(&stored).map_err(bug)?);
        let ks = rt.inner.keys.clone();
        blocking(move || slot(&ks)?.save(&bytes)).await??;
        Ok(())
    }

    /// Our identity, made (keys durable in the keystore, first card signed) the first time.
    async fn am_state(&self, rt: &Runtime) -> Result<AmState> {
        let mut guard = self.state.lock().await;
        if let Some(st) = guard.as_ref() {
            return Ok(st.clone());
        }
        let key = SigningKey::from_bytes(&random_array::<32>());
        let st = AmState {
            id: AgentId::of(&key),
            key,
            mailbox: Id16(random_array::<16>()),
            origin: origin_of(&rt.inner.relay_url)?,
            secrets: BTreeMap::new(),
        };
        let st = self.new_card(rt, st).await?;
        rt.store().set_meta("agent_mail_id", &st.id.to_string()).await?;
        *guard = Some(st.clone());
        Ok(st)
    }

    /// Signs a new card with a fresh X25519 key (durable in the keystore before the card exists).
    async fn new_card(&self, rt: &Runtime, mut st: AmState) -> Result<AmState> {
        let secret = StaticSecret::from(random_array::<32>());
        let public = PublicKey::from(&secret).to_bytes();
        st.secrets.insert(public, secret);
        self.save_am(rt, &st).await?;
        self.sign_card(rt, &st, public).await?;
        Ok(st)
    }

    /// Signs and stores a card for `public` with the next nonce.
    async fn sign_card(&self, rt: &Runtime, st: &AmState, public: [u8; 32]) -> Result<MailboxCard> {
        let now = now_ms();
        let mut tx = rt.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        let nonce = take_nonce(&mut tx, now).await?;
        // A closed mailbox stays closed through renewals and key rotations (§4.2: `routes: []`).
        let closed = sqlx::query_scalar::<_, String>("SELECT value FROM meta WHERE key = 'agent_mail_closed'")
            .fetch_optional(&mut *tx)
            .await?
            .is_some_and(|v| v == "1");
        let payload = CardPayload {
            mailbox_id: st.mailbox,
            expires_at: now + MAX_TTL_MS,
            receive_until: now + 2 * MAX_TTL_MS,
            public_key: public,
            routes: if closed { Vec::new() } else { vec![st.origin.clone()] },
            max_packet_bytes: CARD_MAX_PACKET_BYTES,
        };
        let card = MailboxCard::sign(&st.key, now, nonce, payload).map_err(bug)?;
        sqlx::query(
            "INSERT INTO am_own_cards (card_hash, nonce, public_key, expires_at, receive_until, card, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(card.hash().to_string())
        .bind(i64::try_from(nonce).map_err(bug)?)
        .bind(b64u(&public))
        .bind(card.payload().expires_at)
        .bind(card.payload().receive_until)
        .bind(card.to_jcs())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(card)
    }

    /// Our current card and whether the relay has accepted it.
    async fn current_card(&self, rt: &Runtime) -> Result<(MailboxCard, bool)> {
        let row = sqlx::query("SELECT card, published_at FROM am_own_cards ORDER BY nonce DESC LIMIT 1")
            .fetch_optional(&rt.store().pool)
            .await?
            .ok_or_else(|| bug("no agent mail card"))?;
        let bytes: Vec<u8> = row.get(0);
        let published: i64 = row.get(1);
        Ok((MailboxCard::parse(&bytes).map_err(|e| bug(format!("own card: {e}")))?, published > 0))
    }

    /// Cards whose keys still open mail, with their secrets.
    async fn retained(&self, rt: &Runtime, st: &AmState) -> Result<Vec<RetainedKey>> {
        let rows = sqlx::query("SELECT card FROM am_own_cards WHERE receive_until > ? ORDER BY nonce DESC")
            .bind(now_ms())
            .fetch_all(&rt.store().pool)
            .await?;
        let mut out = Vec::new();
        for r in rows {
            let bytes: Vec<u8> = r.get(0);
            let card = MailboxCard::parse(&bytes).map_err(|e| bug(format!("own card: {e}")))?;
            if let Some(secret) = st.secrets.get(&card.payload().public_key) {
                out.push(RetainedKey { card, secret: secret.clone() });
            }
        }
        Ok(out)
    }

    /// A client for a route origin: our relay's own client (pinned, loopback http allowed) when
    /// it is our origin, web PKI otherwise.
    fn mail_client(&self, rt: &Runtime, st: &AmState, origin: &Origin) -> Result<MailClient> {
        if *origin == st.origin {
            return Ok(MailClient::new(&rt.inner.relay_url, rt.inner.relay.http().clone()));
        }
        let rc = RelayClient::new(origin.as_str(), None)?;
        Ok(MailClient::new(origin.as_str(), rc.http().clone()))
    }

    /// Publishes the current card if the relay has not accepted it yet, replacing it first when
    /// it nears expiry. A `nonce_not_greater` answer moves our sequence past the relay's maximum
    /// and signs the card again.
    pub(in crate::engine) async fn agent_mail_publish(&self, rt: &Runtime) -> Result<()> {
        let mut st = self.am_state(rt).await?;
        let (mut card, mut published) = self.current_card(rt).await?;
        if card.payload().expires_at - now_ms() < RENEW_BEFORE_MS {
            st = self.new_card(rt, st).await?;
            *self.state.lock().await = Some(st.clone());
            (card, published) = self.current_card(rt).await?;
        }
        if published {
            return Ok(());
        }
        let client = self.mail_client(rt, &st, &st.origin)?;
        for _ in 0..3 {
            match client.publish(card.to_jcs()).await? {
                Published::Accepted(record) => {
                    if record.card.hash() != card.hash() {
                        return Err(TransportError::Malformed("relay answered with another card".into()).into());
                    }
                    sqlx::query("UPDATE am_own_cards SET published_at = ? WHERE card_hash = ?")
                        .bind(now_ms())
                        .bind(card.hash().to_string())
                        .execute(&rt.store().pool)
                        .await?;
                    return Ok(());
                }
                Published::NonceTooLow(header) => {
                    let last: u64 =
                        rt.store().meta("agent_mail_nonce").await?.and_then(|v| v.parse().ok()).unwrap_or(0);
                    let next = match header {
                        Some(h) => apply_max_seen_nonce(last.saturating_add(1), now_ms(), &h)
                            .map_err(|e| TransportError::Malformed(e.to_string()))?,
                        None => last.saturating_add(1),
                    };
                    rt.store().set_meta("agent_mail_nonce", &next.saturating_sub(1).to_string()).await?;
                    card = self.sign_card(rt, &st, card.payload().public_key).await?;
                }
            }
        }
        Err(TransportError::Malformed("relay kept refusing our card nonce".into()).into())
    }

    /// A new card key now: a card with a higher nonce, published; the old key stays retained
    /// (until its card's `receive_until`) so mail already queued under it still opens.
    pub(in crate::engine) async fn agent_mail_rotate(&self, rt: &Runtime) -> Result<Value> {
        let st = self.am_state(rt).await?;
        let st = self.new_card(rt, st).await?;
        *self.state.lock().await = Some(st);
        self.agent_mail_publish(rt).await?;
        self.agent_mail_forget_retired(rt).await?;
        Ok(self.agent_mail_whoami(rt).await)
    }

    /// Closes the mailbox (`closed`) or opens it again: a card with the next nonce and the same
    /// key, with `routes: []` to close (§4.2: the relay then accepts no new packet and senders
    /// that fetch the card see the mailbox closed) or our relay to open. What was accepted before
    /// stays retrievable until it expires, so mail already queued still arrives.
    pub(in crate::engine) async fn agent_mail_set_closed(&self, rt: &Runtime, closed: bool) -> Result<Value> {
        let st = self.am_state(rt).await?;
        let (card, _) = self.current_card(rt).await?;
        rt.store().set_meta("agent_mail_closed", if closed { "1" } else { "0" }).await?;
        self.sign_card(rt, &st, card.payload().public_key).await?;
        self.agent_mail_publish(rt).await?;
        Ok(self.agent_mail_whoami(rt).await)
    }

    /// Erases the card secrets no card of ours can receive under any more (every card with that
    /// key is past its `receive_until`, §4.3/§10), from memory and from the keystore, then those
    /// cards. The current card's key always stays. Returns how many secrets were erased.
    pub(in crate::engine) async fn agent_mail_forget_retired(&self, rt: &Runtime) -> Result<usize> {
        let mut guard = self.state.lock().await;
        let Some(st) = guard.as_mut() else { return Ok(0) };
        let now = now_ms();
        let live: std::collections::BTreeSet<[u8; 32]> =
            rt.store().am_live_card_keys(now).await?.iter().filter_map(|k| b64u_array::<32>(k)).collect();
        if live.is_empty() {
            return Ok(0);
        }
        let mut next = st.clone();
        next.secrets.retain(|public, _| live.contains(public));
        let erased = st.secrets.len() - next.secrets.len();
        if erased > 0 {
            // The keystore first: a crash after it leaves cards whose secret is gone, which
            // `retained` skips; the other order could leave a secret no card accounts for.
            self.save_am(rt, &next).await?;
            *st = next;
        }
        rt.store().am_forget_cards(now).await?;
        Ok(erased)
    }

    /// Our contact address (stable address + our relay as route).
    fn address_of(st: &AmState) -> String {
        MailAddress { owner: st.id, mailbox_id: st.mailbox, routes: vec![st.origin.clone()] }.to_string()
    }

    pub(in crate::engine) async fn agent_mail_whoami(&self, rt: &Runtime) -> Value {
        let st = match self.am_state(rt).await {
            Ok(st) => st,
            Err(e) => return json!({"error": e.to_string()}),
        };
        let card = self.current_card(rt).await.ok();
        json!({
            "address": Self::address_of(&st),
            "agent_id": st.id.to_string(),
            "mailbox_id": st.mailbox.to_string(),
            "relay": st.origin.as_str(),
            "card_nonce": card.as_ref().map(|(c, _)| c.nonce()),
            "card_expires_at": card.as_ref().map(|(c, _)| c.payload().expires_at),
            "published": card.as_ref().is_some_and(|(_, p)| *p),
            "closed": card.as_ref().is_some_and(|(c, _)| c.payload().routes.is_empty()),
            "card_keys": st.secrets.len(),
        })
    }

    /// Fetches the card of `addr` from its routes in order and applies the pin. Falls back to the
    /// pinned card when no route answers.
    async fn fetch_card(&self, rt: &Runtime, st: &AmState, addr: &MailAddress) -> Result<MailboxCard> {
        let mut last_err = None;
        for route in &addr.routes {
            let client = self.mail_client(rt, st, route)?;
            match client.card(&addr.mailbox_id).await {
                Ok(rec) if rec.card.owner() == &addr.owner && rec.card.mailbox_id() == addr.mailbox_id => {
                    let mut conn = rt.store().pool.acquire().await?;
                    return observe_card(&mut conn, &rec.card).await;
                }
                Ok(_) => last_err = Some(Error::RelayServed("the route served a card for another mailbox".into())),
                Err(e) => last_err = Some(e.into()),
            }
        }
        let mut conn = rt.store().pool.acquire().await?;
        if let Some((_, card)) = pin_of(&mut conn, &addr.owner, &addr.mailbox_id).await? {
            return Ok(card);
        }
        Err(last_err.unwrap_or_else(|| Error::Invalid("the address has no route to fetch its card from".into())))
    }

    pub(in crate::engine) async fn agent_mail_contact_add(
        &self,
        rt: &Runtime,
        address: &str,
        name: Option<&str>,
        allow: Option<&[String]>,
    ) -> Result<String> {
        let st = self.am_state(rt).await?;
        let addr = MailAddress::parse(address)?;
        if addr.owner == st.id {
            return Err(Error::Invalid("that is our own Agent Mail address".into()));
        }
        let allow = match allow {
            Some(k) => crate::engine::kinds_to_string(k)?,
            None => crate::engine::DEFAULT_ALLOW.to_owned(),
        };
        let card = self.fetch_card(rt, &st, &addr).await?;
        let owner = addr.owner.to_string();
        let full = MailAddress { routes: card.payload().routes.clone(), ..addr.clone() }.to_string();
        let mut tx = rt.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        let name = match store::contact_by_peer(&mut tx, AM, &owner).await? {
            Some(c) if c.state == "pending" => {
                let new_name = name.unwrap_or(&c.name).to_owned();
                if new_name != c.name && store::name_taken(&mut tx, &new_name).await? {
                    return Err(Error::ContactExists(format!("a contact named `{new_name}` already exists")));
                }
                let accept = store::ContactUpdate {
                    name: Some(&new_name),
                    state: Some("active"),
                    allow_kinds: Some(&allow),
                    address: Some(&full),
                    ..Default::default()
                };
                store::update_contact(&mut tx, c.id, &accept).await?;
                store::release_held(&mut tx, c.id).await?;
                new_name
            }
            Some(c) => return Err(Error::ContactExists(format!("already a contact, as `{}`", c.name))),
            None => {
                let name = name.map(str::to_owned).unwrap_or_else(|| default_name(&addr.owner));
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
                        protocol: AM,
                        peer_id: &owner,
                        address: &full,
                        sig_pub: addr.owner.public_key(),
                        box_pub: addr.owner.public_key(),
                        drop_code: None,
                        relay_url: None,
                        state: "active",
                        allow_kinds: &allow,
                        request_body: "",
                        now: now_ms(),
                    },
                )
                .await?;
                name
            }
        };
        tx.commit().await?;
        Ok(name)
    }

    /// Builds, seals and queues a message to an Agent Mail contact. Returns its `message_id`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::engine) async fn agent_mail_send(
        &self,
        rt: &Runtime,
        c: &ContactRow,
        kind: &str,
        text: &str,
        reply_to: Option<&str>,
        subject: Option<&str>,
        from_agent: Option<&str>,
        to_agent: Option<&str>,
    ) -> Result<String> {
        let st = self.am_state(rt).await?;
        if let Err(e) = self.agent_mail_publish(rt).await {
            tracing::info!("agent mail: our card is not published yet: {e}");
        }
        let addr = MailAddress::parse(&c.address)
            .map_err(|_| Error::Invalid(format!("no mailbox known for `{}`: add their Agent Mail address", c.name)))?;
        let card = self.fetch_card(rt, &st, &addr).await?;
        let (own_card, _) = self.current_card(rt).await?;
        let now = now_ms();
        let expires_at = (now + MESSAGE_TTL_MS).min(card.payload().receive_until);
        let parts = vec![Part::text(text)];
        let mut message = match reply_to {
            Some(parent_id) => {
                let row = sqlx::query(
                    "SELECT message, subject FROM am_messages WHERE direction = 'in' AND recipient = ? AND sender = ? AND message_id = ?",
                )
                .bind(st.id.to_string())
                .bind(&c.peer_id)
                .bind(parent_id)
                .fetch_optional(&rt.store().pool)
                .await?
                .ok_or_else(|| Error::UnknownMessage(parent_id.into()))?;
                let bytes: Vec<u8> = row.get(0);
                let subject: String = row.get(1);
                let parent = Message::parse(&bytes).map_err(|e| bug(format!("stored message: {e}")))?;
                let mut m = Message::reply(&parent, &mut OsRng, now, expires_at, parts);
                if !subject.is_empty() {
                    m.subject = Some(if subject.starts_with("Re: ") { subject } else { format!("Re: {subject}") })
                        .filter(|s| s.chars().count() <= crate::protocol::agent_mail::message::MAX_SUBJECT_CHARS);
                }
                m
            }
            None => Message::new(&mut OsRng, st.id, addr.owner, now, expires_at, parts),
        };
        if let Some(s) = subject {
            message.subject = Some(s.to_owned());
        }
        message.reply_card = Some(own_card);
        message.validate()?;
        let id = message.message_id.to_string();
        let route =
            card.payload().routes.first().cloned().ok_or_else(|| Error::Invalid("the mailbox is closed".into()))?;

        let mut tx = rt.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        let nonce = take_nonce(&mut tx, now).await?;
        let packet = seal(
            &SealRequest { sender: &st.key, card: &card, message: &message, created_at: now, nonce },
            now,
            &mut OsRng,
        )?;
        insert_am_message(&mut tx, "out", &message, &card.mailbox_id().to_string(), now).await?;
        let mailbox = card.mailbox_id().to_string();
        let payload = packet.to_jcs();
        let sealed = Sealed {
            id: &id,
            protocol: AM,
            contact: c,
            kind,
            body: text,
            reply_to,
            from_agent,
            to_agent,
            ts: now,
            relay_url: route.as_str(),
            target: &mailbox,
            drop_code: &[],
            payload: &payload,
        };
        outbox::queue(&mut tx, sealed, now).await?;
        rt.commit_queued(tx).await?;
        Ok(id)
    }

    /// One delivery attempt of a queued packet: the exact stored bytes.
    pub(in crate::engine) async fn agent_mail_attempt(&self, rt: &Runtime, row: &OutboxRow) -> SendOutcome {
        let st = match self.am_state(rt).await {
            Ok(st) => st,
            Err(e) => return SendOutcome::Retry { after_ms: None, reason: format!("local: {e}") },
        };
        let client = match Origin::parse(&row.relay_url)
            .map_err(|e| bug(e.to_string()))
            .and_then(|o| self.mail_client(rt, &st, &o))
        {
            Ok(c) => c,
            Err(e) => return SendOutcome::Permanent(format!("route: {e}")),
        };
        match client.deliver(&row.target, row.payload.clone()).await {
            Delivered::Accepted(_) => SendOutcome::Accepted,
            Delivered::Other(o) => o,
            Delivered::StaleCard => match self.agent_mail_reseal(rt, &st, row).await {
                Ok(()) => SendOutcome::Retry { after_ms: Some(0), reason: "re-encrypted under the newer card".into() },
                Err(e) => SendOutcome::Retry { after_ms: None, reason: format!("stale card: {e}") },
            },
        }
    }

    /// Re-encrypts a queued message under the recipient's newer card (same message, new packet).
    async fn agent_mail_reseal(&self, rt: &Runtime, st: &AmState, row: &OutboxRow) -> Result<()> {
        let r = sqlx::query(
            "SELECT recipient, message FROM am_messages WHERE direction = 'out' AND sender = ? AND message_id = ?",
        )
        .bind(st.id.to_string())
        .bind(&row.message_id)
        .fetch_optional(&rt.store().pool)
        .await?
        .ok_or_else(|| bug("queued message without its record"))?;
        let recipient: String = r.get(0);
        let bytes: Vec<u8> = r.get(1);
        let message = Message::parse(&bytes).map_err(|e| bug(format!("stored message: {e}")))?;
        let mut conn = rt.store().pool.acquire().await?;
        let c = store::contact_by_peer(&mut conn, AM, &recipient).await?.ok_or_else(|| bug("contact gone"))?;
        drop(conn);
        let addr = MailAddress::parse(&c.address).map_err(bug)?;
        let card = self.fetch_card(rt, st, &addr).await?;
        let old = crate::protocol::agent_mail::Packet::parse(&row.payload).map_err(bug)?;
        if old.header().card_hash == card.hash() {
            return Err(Error::Invalid("no newer card is available yet".into()));
        }
        let now = now_ms();
        let route =
            card.payload().routes.first().cloned().ok_or_else(|| Error::Invalid("the mailbox is closed".into()))?;
        let mut tx = rt.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        let nonce = take_nonce(&mut tx, now).await?;
        let packet = seal(
            &SealRequest { sender: &st.key, card: &card, message: &message, created_at: now, nonce },
            now,
            &mut OsRng,
        )?;
        sqlx::query("UPDATE outbox SET payload = ?, target = ?, relay_url = ? WHERE id = ?")
            .bind(packet.to_jcs())
            .bind(card.mailbox_id().to_string())
            .bind(route.as_str())
            .bind(row.id)
            .execute(&mut *tx)
            .await?;
        let audit = Audit {
            direction: "out",
            protocol: AM.as_str(),
            peer: &recipient,
            message_id: &row.message_id,
            kind: &row.kind,
            state: "queued",
            detail: "re-encrypted under the recipient's newer card",
        };
        store::audit(&mut tx, now, audit).await?;
        tx.commit().await?;
        Ok(())
    }

    fn owner_jwt(st: &AmState) -> String {
        let now = now_ms() / 1000;
        sign_request_jwt(&st.key, &st.origin, now - 5, now + 120, None)
    }

    /// Blocks (or unblocks) `sender` at our relay, so that it stops accepting new packets from
    /// it (§7.4). Our own policy is applied before decryption anyway (§7.2 step 1); this keeps a
    /// blocked sender from filling the mailbox. Nothing to do before we have a mailbox.
    pub(in crate::engine) async fn agent_mail_block(&self, rt: &Runtime, sender: &str, blocked: bool) -> Result<()> {
        let Some(st) = self.state.lock().await.clone() else { return Ok(()) };
        let sender = AgentId::parse(sender).map_err(|e| bug(format!("stored Agent ID: {e}")))?;
        let client = self.mail_client(rt, &st, &st.origin)?;
        client.set_blocked(&st.mailbox, &sender, blocked, &Self::owner_jwt(&st)).await?;
        Ok(())
    }

    /// Lists our mailbox, processes every packet and deletes each after its commit. Zero when
    /// this profile has no Agent Mail identity yet. Returns (processed, any showable).
    async fn agent_mail_drain(&self, rt: &Runtime) -> Result<(usize, bool)> {
        let Some(st) = self.state.lock().await.clone() else { return Ok((0, false)) };
        let client = self.mail_client(rt, &st, &st.origin)?;
        let keys = self.retained(rt, &st).await?;
        let mut cursor: Option<String> = None;
        let mut total = 0;
        let mut showable = false;
        loop {
            let jwt = Self::owner_jwt(&st);
            let page = match client.list(&st.mailbox, &jwt, cursor.as_deref(), LIST_LIMIT).await {
                Ok(p) => p,
                Err(TransportError::Status { status: 404, code, .. }) if code == "mailbox_unavailable" => {
                    // The relay does not know our mailbox (never published, or forgotten).
                    sqlx::query("UPDATE am_own_cards SET published_at = 0").execute(&rt.store().pool).await?;
                    self.agent_mail_publish(rt).await?;
                    return Ok((total, showable));
                }
                Err(e) => return Err(e.into()),
            };
            for item in &page.result {
                let (delete, shows) = self.agent_mail_process(rt, &st, &keys, item, DeliveryPath::Relay).await?;
                showable |= shows;
                total += 1;
                if let Some(packet_id) = delete {
                    client.delete(&st.mailbox, &packet_id, &jwt).await?;
                }
            }
            match page.next_cursor {
                Some(c) if !page.result.is_empty() => cursor = Some(c),
                _ => return Ok((total, showable)),
            }
        }
    }

    /// The Agent ID key, when this profile has an Agent Mail identity (it signs the LAN binding).
    pub(in crate::engine) async fn signing_key(&self) -> Option<SigningKey> {
        self.state.lock().await.as_ref().map(|st| st.key.clone())
    }

    /// A packet a nearby contact handed over directly (the LAN path): the same pipeline and
    /// transaction as a listed one, under a record made here (its packet ID is the packet's
    /// hash, as a relay's). Returns whether `inbox` shows it.
    pub(in crate::engine) async fn receive_direct(&self, rt: &Runtime, bytes: &[u8]) -> Result<bool> {
        let Some(st) = self.state.lock().await.clone() else {
            return Err(Error::Invalid("this profile has no Agent Mail mailbox".into()));
        };
        let packet = crate::protocol::agent_mail::Packet::parse(bytes).map_err(|e| Error::Peer(e.to_string()))?;
        let record = PacketRecord { packet_id: packet.id(), packet, accepted_at: now_ms(), seq: 1 };
        let keys = self.retained(rt, &st).await?;
        let (_, showable) = self.agent_mail_process(rt, &st, &keys, &record.to_value(), DeliveryPath::Direct).await?;
        Ok(showable)
    }

    /// Drains the mailbox once (one-shot commands).
    pub(in crate::engine) async fn agent_mail_sync(&self, rt: &Runtime) -> Result<usize> {
        if self.state.lock().await.is_none() {
            return Ok(0);
        }
        if let Err(e) = self.agent_mail_publish(rt).await {
            tracing::debug!("agent mail publish: {e}");
        }
        match self.agent_mail_drain(rt).await {
            Ok((n, _)) => Ok(n),
            // A relay that is down or does not serve Agent Mail must not stop the other
            // protocols' sync; the mail stays queued at the relay.
            Err(Error::Transport(e)) => {
                tracing::info!("agent mail: {e}");
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Polls the mailbox forever (daemon), or until something showable arrives.
    pub(in crate::engine) async fn agent_mail_receive_loop(&self, rt: &Runtime, until_showable: bool) -> Result<()> {
        let mut stop = rt.inner.shutdown.subscribe();
        let mut failures = 0u32;
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let round = async {
                self.am_state(rt).await?;
                self.agent_mail_publish(rt).await?;
                self.agent_mail_drain(rt).await
            };
            let result = tokio::select! {
                r = round => r,
                _ = stop.changed() => return Ok(()),
            };
            match result {
                Ok((_, showable)) => {
                    failures = 0;
                    if showable && until_showable {
                        return Ok(());
                    }
                    self.am_pause(POLL_INTERVAL_MS, &mut stop).await;
                }
                Err(Error::Transport(TransportError::Status { status: 404 | 405, code, .. }))
                    if code != "mailbox_unavailable" =>
                {
                    tracing::info!("the relay does not serve Agent Mail (/v1/mailboxes)");
                    return Ok(());
                }
                Err(e) => {
                    tracing::info!("agent mail: {e}");
                    failures = failures.saturating_add(1);
                    self.am_pause(crate::engine::backoff_ms(failures).max(POLL_INTERVAL_MS), &mut stop).await;
                }
            }
        }
    }

    async fn am_pause(&self, ms: i64, stop: &mut tokio::sync::watch::Receiver<bool>) {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(1000))) => {}
            _ = stop.changed() => {}
        }
    }

    /// One listed packet: the recipient pipeline, then every effect in one transaction. Returns
    /// the packet ID to delete at the relay (after the commit) and whether `inbox` shows it.
    async fn agent_mail_process(
        &self,
        rt: &Runtime,
        st: &AmState,
        keys: &[RetainedKey],
        item: &crate::protocol::agent_identity::Value,
        path: DeliveryPath,
    ) -> Result<(Option<Hash32>, bool)> {
        let now = now_ms();
        let record = match PacketRecord::from_value(item) {
            Ok(r) => r,
            Err(e) => {
                self.am_audit(rt, "", "", "dropped", &format!("relay listed a malformed record: {e}")).await?;
                return Ok((None, false));
            }
        };
        let packet_id = record.packet_id;
        let refuse = |e: ReceiveError| format!("{} ({})", e, e.code().as_str());
        let verified = match verify_packet(record.packet, Some(&packet_id), now) {
            Ok(v) => v,
            Err(e) => {
                self.am_audit(rt, "", &packet_id.to_string(), "dropped", &refuse(e)).await?;
                return Ok((Some(packet_id), false));
            }
        };
        let sender = verified.sender().to_string();
        // §7.2 step 1: the profile's policy for the verified actor, before anything is decrypted.
        // A blocked contact is refused; a stranger is admitted and becomes a pending request
        // below, its mail held until the owner accepts.
        let blocked = rt.store().contact_by_peer(AM, &sender).await?.filter(|c| c.blocked);
        let policy = if blocked.is_some() { SenderPolicy::Block } else { SenderPolicy::Allow };
        let admitted = match verified.admit(policy) {
            Ok(a) => a,
            Err(e) => {
                let mut tx = rt.store().pool.begin().await?;
                if let Some(c) = &blocked {
                    store::count_blocked_drop(&mut tx, c.id).await?;
                }
                let detail = refuse(e);
                store::audit(&mut tx, now, audit_in(&sender, &packet_id.to_string(), "", "blocked", &detail)).await?;
                tx.commit().await?;
                return Ok((Some(packet_id), false));
            }
        };
        let opened = match admitted.open(&st.id, keys, now) {
            Ok(o) => o,
            Err(e) => {
                self.am_audit(rt, &sender, &packet_id.to_string(), "dropped", &refuse(e)).await?;
                return Ok((Some(packet_id), false));
            }
        };
        let message = &opened.message;
        let msg_id = message.message_id.to_string();
        let seen = self.am_commitment(rt, &st.id, &sender, &msg_id).await?;
        let commitment = match opened.decide(seen.as_ref(), now) {
            Ok(Verdict::Duplicate) => return Ok((Some(packet_id), false)),
            Ok(Verdict::New(c)) => c,
            Err(e) => {
                self.am_audit(rt, &sender, &msg_id, "refused", &refuse(e)).await?;
                return Ok((Some(packet_id), false));
            }
        };
        let _ = commitment;

        let mut tx = rt.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        // The deduplication row commits with everything else; a concurrent drain that got here
        // first makes this one a duplicate.
        if !insert_am_message(&mut tx, "in", message, &st.mailbox.to_string(), now).await? {
            return Ok((Some(packet_id), false));
        }
        let mut detail = Vec::new();
        // A reply card is verified with the message; it is pinned like any other card.
        let mut reply_address = None;
        if let Some(card) = &message.reply_card {
            match observe_card(&mut tx, card).await {
                Ok(pinned) if !pinned.is_closed() => {
                    reply_address = Some(
                        MailAddress {
                            owner: *pinned.owner(),
                            mailbox_id: pinned.mailbox_id(),
                            routes: pinned.payload().routes.clone(),
                        }
                        .to_string(),
                    );
                }
                Ok(_) => detail.push("reply card closes the mailbox".to_owned()),
                Err(e) => detail.push(format!("reply card not pinned: {e}")),
            }
        }
        // Replies are linked into the thread only when every binding holds.
        let mut reply_to = None;
        if let Some(parent_id) = message.in_reply_to {
            let parent: Option<Vec<u8>> = sqlx::query_scalar(
                "SELECT message FROM am_messages WHERE direction = 'out' AND sender = ? AND recipient = ? AND message_id = ?",
            )
            .bind(st.id.to_string())
            .bind(&sender)
            .bind(parent_id.to_string())
            .fetch_optional(&mut *tx)
            .await?;
            match parent.map(|b| Message::parse(&b)) {
                Some(Ok(p)) => match check_reply(&p, message) {
                    Ok(()) => reply_to = Some(parent_id.to_string()),
                    Err(e) => detail.push(format!("not linked to {parent_id}: {e}")),
                },
                Some(Err(e)) => return Err(bug(format!("stored message: {e}"))),
                None => detail.push(format!("answers {parent_id}, which we did not send to this sender")),
            }
        }
        let kind = if reply_to.is_some() { "reply" } else { "send" };
        let text = body_text(message);
        let mut contact = store::contact_by_peer(&mut tx, AM, &sender).await?;
        let mut event = None;
        if contact.is_none() {
            let pending = store::pending_requests(&mut tx).await?;
            if pending >= crate::engine::MAX_PENDING_REQUESTS {
                let d = "unknown_sender: too many pending requests";
                store::audit(&mut tx, now, audit_in(&sender, &msg_id, kind, "dropped", d)).await?;
                tx.commit().await?;
                return Ok((Some(packet_id), false));
            }
            let base = default_name(&message.from);
            let mut name = base.clone();
            let mut n = 2;
            while store::name_taken(&mut tx, &name).await? {
                name = format!("{base}-{n}");
                n += 1;
            }
            let request: String = message.subject.clone().unwrap_or_else(|| text.clone()).chars().take(64).collect();
            store::insert_contact(
                &mut tx,
                &NewContact {
                    name: &name,
                    protocol: AM,
                    peer_id: &sender,
                    address: reply_address.as_deref().unwrap_or(&sender),
                    sig_pub: message.from.public_key(),
                    box_pub: message.from.public_key(),
                    drop_code: None,
                    relay_url: None,
                    state: "pending",
                    allow_kinds: crate::engine::DEFAULT_ALLOW,
                    request_body: &request,
                    now,
                },
            )
            .await?;
            event = Some(Event::Request { name });
            contact = store::contact_by_peer(&mut tx, AM, &sender).await?;
        } else if let (Some(c), Some(a)) = (&contact, &reply_address) {
            store::update_contact(&mut tx, c.id, &store::ContactUpdate { address: Some(a), ..Default::default() })
                .await?;
        }
        let c = contact.ok_or_else(|| bug("contact vanished"))?;
        let held = c.state != "active";
        let allowed = c.allow_kinds.split(',').any(|k| k == kind);
        let (state, showable) = match (held, allowed) {
            (true, _) => ("request", false),
            (false, true) => ("received", true),
            (false, false) => ("refused", false),
        };
        if state != "refused" {
            store::insert_message(
                &mut tx,
                &NewMessage {
                    id: &msg_id,
                    direction: "in",
                    protocol: AM,
                    contact_id: Some(c.id),
                    peer: &sender,
                    kind,
                    body: &text,
                    reply_to: reply_to.as_deref(),
                    from_agent: None,
                    to_agent: None,
                    ts: message.created_at,
                    state: if held { "held" } else { "received" },
                    hidden: held,
                    now,
                },
            )
            .await?;
            store::set_message_path(&mut tx, "in", AM, &sender, &msg_id, path).await?;
        } else {
            detail.push(format!("kind `{kind}` is not allowed for this contact"));
        }
        let detail = detail.join("; ");
        store::audit(&mut tx, now, audit_in(&sender, &msg_id, kind, state, &detail)).await?;
        tx.commit().await?;
        if let Some(e) = event {
            rt.emit(e);
        }
        if showable {
            rt.emit(Event::Message { id: msg_id });
        }
        Ok((Some(packet_id), showable))
    }

    async fn am_commitment(
        &self,
        rt: &Runtime,
        me: &AgentId,
        sender: &str,
        msg_id: &str,
    ) -> Result<Option<MessageCommitment>> {
        let row = sqlx::query(
            "SELECT content_hash, expires_at FROM am_messages WHERE direction = 'in' AND recipient = ? AND sender = ? AND message_id = ?",
        )
        .bind(me.to_string())
        .bind(sender)
        .bind(msg_id)
        .fetch_optional(&rt.store().pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let hash: String = row.get(0);
        Ok(Some(MessageCommitment {
            content_hash: Hash32::parse(&hash).ok_or_else(|| bug("stored content hash"))?,
            expires_at: row.get(1),
        }))
    }

    async fn am_audit(&self, rt: &Runtime, peer: &str, id: &str, state: &str, detail: &str) -> Result<()> {
        let mut conn = rt.store().pool.acquire().await?;
        store::audit(&mut conn, now_ms(), audit_in(peer, id, "", state, detail)).await?;
        Ok(())
    }

    /// Adds `subject` and `thread` to Agent Mail message views.
    pub(in crate::engine) async fn agent_mail_decorate(&self, rt: &Runtime, views: &mut [Value]) -> Result<()> {
        for v in views.iter_mut() {
            if v.get("protocol").and_then(Value::as_str) != Some(AM.as_str()) {
                continue;
            }
            let (Some(id), Some(peer), Some(dir)) = (
                v.get("id").and_then(Value::as_str).map(str::to_owned),
                v.get("peer").and_then(Value::as_str).map(str::to_owned),
                v.get("direction").and_then(Value::as_str).map(str::to_owned),
            ) else {
                continue;
            };
            // The peer is the sender of what we received and the recipient of what we sent.
            let row = sqlx::query(
                "SELECT subject, thread_id FROM am_messages WHERE direction = ?1 AND message_id = ?3 \
                 AND ((?1 = 'in' AND sender = ?2) OR (?1 = 'out' AND recipient = ?2))",
            )
            .bind(&dir)
            .bind(&peer)
            .bind(&id)
            .fetch_optional(&rt.store().pool)
            .await?;
            if let (Some(row), Some(obj)) = (row, v.as_object_mut()) {
                let subject: String = row.get(0);
                let thread: String = row.get(1);
                obj.insert("subject".into(), if subject.is_empty() { Value::Null } else { Value::String(subject) });
                obj.insert("thread".into(), Value::String(thread));
            }
        }
        Ok(())
    }
}

fn audit_in<'a>(peer: &'a str, id: &'a str, kind: &'a str, state: &'a str, detail: &'a str) -> Audit<'a> {
    Audit { direction: "in", protocol: AM.as_str(), peer, message_id: id, kind, state, detail }
}

/// A local name for an Agent ID nobody named yet.
fn default_name(id: &AgentId) -> String {
    let key = b64u(id.public_key());
    format!("mail-{}", key.chars().filter(char::is_ascii_alphanumeric).take(8).collect::<String>())
}

/// Records a message in `am_messages`. Returns false when `(recipient, sender, message_id)` is
/// already there (the durable deduplication key).
async fn insert_am_message(
    tx: &mut sqlx::SqliteConnection,
    direction: &str,
    m: &Message,
    mailbox: &str,
    now: i64,
) -> Result<bool> {
    let n = sqlx::query(
        "INSERT INTO am_messages (direction, recipient, sender, message_id, thread_id, subject, in_reply_to, \
         content_hash, expires_at, mailbox_id, message, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT DO NOTHING",
    )
    .bind(direction)
    .bind(m.to.to_string())
    .bind(m.from.to_string())
    .bind(m.message_id.to_string())
    .bind(m.thread_id.to_string())
    .bind(m.subject.clone().unwrap_or_default())
    .bind(m.in_reply_to.map(|i| i.to_string()).unwrap_or_default())
    .bind(m.content_hash().to_string())
    .bind(m.expires_at)
    .bind(mailbox)
    .bind(m.to_jcs())
    .bind(now)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    Ok(n > 0)
}
