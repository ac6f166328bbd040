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
//!   its deduplication row, contact changes, attachments and audit) before the packet is deleted
//!   at the relay. Unknown senders become pending requests; replies are linked only when their
//!   bindings hold.
//! - Files travel as parts after the text; received ones are stored apart and handed out only
//!   on request, never opened (`parts`).
//!
//! Files: `cards` (ours and the pins of theirs, contacts by address), `local_net` (the §8.1
//! policy for card fetches), `send`, `receive`, `parts`.

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

use super::{Channel, ContactAdd};
use crate::engine::delivery::SenderAuth;
use crate::engine::{Error, Result, Runtime, blocking};
use crate::identity::keystore::Keystore;
use crate::protocol::agent_identity::jwt::sign_request_jwt;
use crate::protocol::agent_identity::live_write::apply_max_seen_nonce;
use crate::protocol::agent_identity::{AgentId, Origin};
use crate::protocol::agent_mail::packet::Packet;
use crate::protocol::agent_mail::{DAY_MS, Id16, MailAddress};
use crate::protocol::lan::ProtocolTag;
use crate::protocol::letagents::{Kind, STALE_AFTER_MS};
use crate::store::{ContactRow, OutboxRow, Protocol};
use crate::transport::TransportError;
use crate::transport::agent_mail::{MailClient, Published};
use crate::transport::letagents::{RelayClient, SendOutcome};
use crate::util::{b64u, b64u_array, b64u_decode, now_ms, random_array};

mod cards;
pub(in crate::engine) mod local_net;
pub(in crate::engine) mod parts;
mod receive;
mod send;

pub(in crate::engine) use send::MailOut;

/// The protocol.
pub(in crate::engine) const AM: Protocol = Protocol::AgentMail;
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

/// Our owner JWT for the relay's mailbox operations.
fn owner_jwt(st: &AmState) -> String {
    let now = now_ms() / 1000;
    sign_request_jwt(&st.key, &st.origin, now - 5, now + 120, None)
}

/// A local name for an Agent ID nobody named yet.
fn default_name(id: &AgentId) -> String {
    let key = b64u(id.public_key());
    format!("mail-{}", key.chars().filter(char::is_ascii_alphanumeric).take(8).collect::<String>())
}

impl Channel for AgentMail {
    fn claims_address(&self, address: &str) -> bool {
        address.starts_with(crate::protocol::agent_identity::agent_id::AGENT_ID_PREFIX)
    }

    fn add_contact<'a>(&'a self, rt: &'a Runtime, req: ContactAdd<'a>) -> BoxFuture<'a, Result<String>> {
        Box::pin(async move {
            let st = self.am_state(rt).await?;
            cards::add_contact(rt, &st, req.address, req.name, req.allow).await
        })
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
            let out = MailOut {
                kind,
                text,
                reply_to: msg.reply_to,
                subject: None,
                from_agent: msg.from_agent,
                to_agent: msg.to_agent,
                attachments: &[],
            };
            self.agent_mail_send(rt, c, out).await
        })
    }

    fn attempt<'a>(&'a self, rt: &'a Runtime, row: &'a OutboxRow) -> BoxFuture<'a, Result<SendOutcome>> {
        Box::pin(async move {
            Ok(match self.am_state(rt).await {
                Ok(st) => send::attempt(rt, &st, row).await,
                Err(e) => SendOutcome::Retry { after_ms: None, reason: format!("local: {e}") },
            })
        })
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

    fn lan_tag(&self) -> Option<ProtocolTag> {
        Some(ProtocolTag::AgentMail)
    }

    fn block_at_relay<'a>(
        &'a self,
        rt: &'a Runtime,
        peer: &'a str,
        blocked: bool,
    ) -> Option<BoxFuture<'a, Result<()>>> {
        // §7.1: the relay refuses a blocked sender's packets before they are stored.
        Some(Box::pin(self.agent_mail_block(rt, peer, blocked)))
    }

    fn receive_direct<'a>(&'a self, rt: &'a Runtime, sealed: &'a [u8]) -> BoxFuture<'a, Result<bool>> {
        Box::pin(AgentMail::receive_direct(self, rt, sealed))
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
            origin: origin_of(&rt.relay_url())?,
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
        cards::sign_card(rt, &st, public).await?;
        Ok(st)
    }

    /// it nears expiry. A `nonce_not_greater` answer moves our sequence past the relay's maximum
    /// and signs the card again.
    pub(in crate::engine) async fn agent_mail_publish(&self, rt: &Runtime) -> Result<()> {
        let mut st = self.am_state(rt).await?;
        let (mut card, mut published) = cards::current_card(rt).await?;
        // A card routing to another relay than ours (the owner moved relay, and the runtime may
        // have stopped before the new card was signed) is replaced like an expiring one.
        let routed_elsewhere = card.payload().routes.first().is_some_and(|first| *first != st.origin);
        if routed_elsewhere {
            cards::sign_card(rt, &st, card.payload().public_key).await?;
            (card, published) = cards::current_card(rt).await?;
        }
        if card.payload().expires_at - now_ms() < RENEW_BEFORE_MS {
            st = self.new_card(rt, st).await?;
            *self.state.lock().await = Some(st.clone());
            (card, published) = cards::current_card(rt).await?;
        }
        if published {
            return Ok(());
        }
        let client = cards::mail_client(rt, &st, &st.origin)?;
        for _ in 0..3 {
            match client.publish(card.to_jcs()).await? {
                Published::Accepted(record) => {
                    if record.card.hash() != card.hash() {
                        return Err(TransportError::Malformed("relay answered with another card".into()).into());
                    }
                    rt.store().am_card_published(&card.hash().to_string(), now_ms()).await?;
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
                    card = cards::sign_card(rt, &st, card.payload().public_key).await?;
                }
            }
        }
        Err(TransportError::Malformed("relay kept refusing our card nonce".into()).into())
    }

    /// The owner moved to another relay: our origin becomes the new relay's. Then
    /// [`Self::agent_mail_publish_moved`].
    pub(in crate::engine) async fn agent_mail_switch_relay(&self, rt: &Runtime) -> Result<()> {
        if let Some(st) = self.state.lock().await.as_mut() {
            st.origin = origin_of(&rt.relay_url())?;
        }
        Ok(())
    }

    /// A card with the next nonce routing to the relay moved to (and, for the grace period, the
    /// old one: seed 002 §4.3), signed (same key) and published there, then on `old` (through
    /// `old_client`), where contacts whose address names the old route fetch it: a contact that
    /// pinned our old card takes this one (higher nonce) at its next send, and sends to the new
    /// relay. A relay that does not answer now gets it when it is next reached
    /// ([`Self::agent_mail_publish`] replaces any card whose first route is elsewhere).
    pub(in crate::engine) async fn agent_mail_publish_moved(
        &self,
        rt: &Runtime,
        old_client: Option<&RelayClient>,
    ) -> Result<()> {
        let Some(st) = self.state.lock().await.clone() else { return Ok(()) };
        let (card, _) = cards::current_card(rt).await?;
        cards::sign_card(rt, &st, card.payload().public_key).await?;
        if let Err(e) = self.agent_mail_publish(rt).await {
            tracing::info!("Agent Mail card not published to the new relay yet: {e}");
        }
        if let Some(old) = old_client {
            let (card, _) = cards::current_card(rt).await?;
            let client = MailClient::new(old.base().as_str().trim_end_matches('/'), old.http().clone());
            match client.publish(card.to_jcs()).await {
                Ok(Published::Accepted(_)) => {}
                Ok(Published::NonceTooLow(_)) => {
                    tracing::info!("Agent Mail: the old relay holds a newer card than the moved one")
                }
                Err(e) => tracing::info!("Agent Mail card not published to the old relay: {e}"),
            }
        }
        Ok(())
    }

    /// Reads our mailbox on a relay moved away from (`old`, at `old_url`) and processes what
    /// peers sent there before they learned the move. Answers how many packets it processed.
    pub(in crate::engine) async fn agent_mail_drain_old(
        &self,
        rt: &Runtime,
        old_url: &str,
        old: &RelayClient,
    ) -> Result<usize> {
        let Some(mut st) = self.state.lock().await.clone() else { return Ok(0) };
        st.origin = origin_of(old_url)?;
        let client = MailClient::new(old.base().as_str().trim_end_matches('/'), old.http().clone());
        Ok(receive::drain_with(rt, &st, &client).await?.processed)
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
        let (card, _) = cards::current_card(rt).await?;
        rt.store().set_meta("agent_mail_closed", if closed { "1" } else { "0" }).await?;
        cards::sign_card(rt, &st, card.payload().public_key).await?;
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
        let card = cards::current_card(rt).await.ok();
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

    /// Our address, with our Agent ID key's signature binding it to the contact link's identity
    /// key (the letagents `sig` key): the link's `agent_mail` line. `None` without a mailbox.
    pub(in crate::engine) async fn agent_mail_link_entry(
        &self,
        rt: &Runtime,
        identity: &[u8; 32],
    ) -> Option<(crate::protocol::agent_mail::address::MailAddress, [u8; 64])> {
        let st = self.am_state(rt).await.ok()?;
        let address = crate::protocol::agent_mail::address::MailAddress::parse(&Self::address_of(&st)).ok()?;
        let proof = crate::protocol::contact_link::bind_agent_mail(&st.key, identity, &address);
        Some((address, proof))
    }

    /// Builds, seals and queues a message to an Agent Mail contact. Returns its `message_id`.
    pub(in crate::engine) async fn agent_mail_send(
        &self,
        rt: &Runtime,
        c: &ContactRow,
        out: MailOut<'_>,
    ) -> Result<String> {
        let st = self.am_state(rt).await?;
        if let Err(e) = self.agent_mail_publish(rt).await {
            tracing::info!("agent mail: our card is not published yet: {e}");
        }
        send::send(rt, &st, c, out).await
    }

    /// Lists our mailbox, processes every packet and deletes each after its commit (nothing
    /// before this profile has an Agent Mail identity); publishes our card again when the relay
    /// no longer knows the mailbox.
    async fn agent_mail_drain(&self, rt: &Runtime) -> Result<receive::Drained> {
        let Some(st) = self.state.lock().await.clone() else {
            return Ok(receive::Drained { processed: 0, showable: false, republish: false });
        };
        let drained = receive::drain(rt, &st).await?;
        if drained.republish {
            self.agent_mail_publish(rt).await?;
        }
        Ok(drained)
    }

    /// Adds `subject`, `thread` and `attachments` to Agent Mail message views.
    pub(in crate::engine) async fn agent_mail_decorate(&self, rt: &Runtime, views: &mut [Value]) -> Result<()> {
        receive::decorate(rt, views).await
    }

    /// Blocks (or unblocks) `sender` at our relay, so that it stops accepting new packets from
    /// it (§7.4). Our own policy is applied before decryption anyway (§7.2 step 1); this keeps a
    /// blocked sender from filling the mailbox. Nothing to do before we have a mailbox.
    pub(in crate::engine) async fn agent_mail_block(&self, rt: &Runtime, sender: &str, blocked: bool) -> Result<()> {
        let Some(st) = self.state.lock().await.clone() else { return Ok(()) };
        let sender = AgentId::parse(sender).map_err(|e| bug(format!("stored Agent ID: {e}")))?;
        let client = cards::mail_client(rt, &st, &st.origin)?;
        client.set_blocked(&st.mailbox, &sender, blocked, &owner_jwt(&st)).await?;
        Ok(())
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
        let showable = receive::receive_direct(rt, &st, bytes).await?;
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
            Ok(d) => Ok(d.processed),
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
                Ok(receive::Drained { showable, .. }) => {
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
}
