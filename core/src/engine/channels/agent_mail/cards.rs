//! Cards, ours and others': signing ours with the next nonce of our one sequence, the pin rule
//! for theirs, fetching a card from an address's routes (under the local-network policy), and
//! adding a contact by address.

use crate::engine::{Error, Result, Runtime};
use crate::protocol::agent_identity::AgentId;
use crate::protocol::agent_identity::Origin;
use crate::protocol::agent_identity::live_write::next_nonce;
use crate::protocol::agent_mail::card::{CardPayload, PinOutcome, check_pin};
use crate::protocol::agent_mail::recipient::RetainedKey;
use crate::protocol::agent_mail::{Id16, MAX_TTL_MS, MailAddress, MailboxCard, Pin};
use crate::store::ContactState;
use crate::store::{self, NewContact};
use crate::transport::agent_mail::MailClient;
use crate::transport::letagents::RelayClient;
use crate::util::{b64u, now_ms};

use super::{AM, AmState, CARD_MAX_PACKET_BYTES, bug, default_name, local_net};

/// The stored pin for `(owner, mailbox)` and its card.
pub(super) async fn pin_of(
    conn: &mut sqlx::SqliteConnection,
    owner: &AgentId,
    mailbox: &Id16,
) -> Result<Option<(Pin, MailboxCard)>> {
    let Some(bytes) = store::am_pin(conn, &owner.to_string(), &mailbox.to_string()).await? else { return Ok(None) };
    let card = MailboxCard::parse(&bytes).map_err(|e| bug(format!("stored pin: {e}")))?;
    Ok(Some((Pin::of(&card), card)))
}

/// Applies the pin rule to a verified card and stores an advanced pin. Returns the card to use.
pub(super) async fn observe_card(conn: &mut sqlx::SqliteConnection, card: &MailboxCard) -> Result<MailboxCard> {
    let current = pin_of(conn, card.owner(), &card.mailbox_id()).await?;
    match check_pin(current.as_ref().map(|(p, _)| p), card) {
        Ok(PinOutcome::Same) => Ok(card.clone()),
        Ok(PinOutcome::Advanced(pin)) => {
            let row = store::PinRow {
                owner: &pin.owner.to_string(),
                mailbox_id: &pin.mailbox_id.to_string(),
                nonce: i64::try_from(pin.nonce).map_err(bug)?,
                card_hash: &pin.card_hash.to_string(),
                created_at: pin.created_at,
                card: &card.to_jcs(),
            };
            store::am_set_pin(conn, &row).await?;
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
pub(super) async fn take_nonce(tx: &mut sqlx::SqliteConnection, now: i64) -> Result<u64> {
    let last = store::meta_in(tx, "agent_mail_nonce").await?;
    let nonce = next_nonce(last.and_then(|l| l.parse().ok()), now);
    store::set_meta(tx, "agent_mail_nonce", &nonce.to_string()).await?;
    Ok(nonce)
}

/// Signs and stores a card for `public` with the next nonce.
pub(super) async fn sign_card(rt: &Runtime, st: &AmState, public: [u8; 32]) -> Result<MailboxCard> {
    let now = now_ms();
    let mut tx = rt.store().pool.begin_with("BEGIN IMMEDIATE").await?;
    let nonce = take_nonce(&mut tx, now).await?;
    // A closed mailbox stays closed through renewals and key rotations (§4.2: `routes: []`).
    let closed = store::meta_in(&mut tx, "agent_mail_closed").await?.is_some_and(|v| v == "1");
    let payload = CardPayload {
        mailbox_id: st.mailbox,
        expires_at: now + MAX_TTL_MS,
        receive_until: now + 2 * MAX_TTL_MS,
        public_key: public,
        routes: if closed { Vec::new() } else { routes(&mut tx, st, now).await? },
        max_packet_bytes: CARD_MAX_PACKET_BYTES,
    };
    let card = MailboxCard::sign(&st.key, now, nonce, payload).map_err(bug)?;
    let row = store::NewOwnCard {
        card_hash: &card.hash().to_string(),
        nonce: i64::try_from(nonce).map_err(bug)?,
        public_key: &b64u(&public),
        expires_at: card.payload().expires_at,
        receive_until: card.payload().receive_until,
        card: &card.to_jcs(),
    };
    store::am_insert_own_card(&mut tx, &row, now).await?;
    tx.commit().await?;
    Ok(card)
}

/// Our card's routes: our relay's origin first (senders deliver to the first), then, while they
/// are read after a move, the relays moved away from (seed 002 §4.3: the old route stays for the
/// grace period, and a contact whose address still names it fetches the new card there).
async fn routes(tx: &mut sqlx::SqliteConnection, st: &AmState, now: i64) -> Result<Vec<Origin>> {
    let mut out = vec![st.origin.clone()];
    for url in store::draining_relay_urls(tx, now).await? {
        if let Ok(o) = super::origin_of(&url)
            && !out.contains(&o)
        {
            out.push(o);
        }
    }
    Ok(out)
}

/// Our current card and whether the relay has accepted it.
pub(super) async fn current_card(rt: &Runtime) -> Result<(MailboxCard, bool)> {
    let row = rt.store().am_current_card().await?.ok_or_else(|| bug("no agent mail card"))?;
    Ok((MailboxCard::parse(&row.card).map_err(|e| bug(format!("own card: {e}")))?, row.published))
}

/// Cards whose keys still open mail, with their secrets.
pub(super) async fn retained(rt: &Runtime, st: &AmState) -> Result<Vec<RetainedKey>> {
    let mut out = Vec::new();
    for bytes in rt.store().am_receiving_cards(now_ms()).await? {
        let card = MailboxCard::parse(&bytes).map_err(|e| bug(format!("own card: {e}")))?;
        if let Some(secret) = st.secrets.get(&card.payload().public_key) {
            out.push(RetainedKey { card, secret: secret.clone() });
        }
    }
    Ok(out)
}

/// A client for a route origin: our relay's own client (pinned, loopback http allowed) when it
/// is our origin, web PKI otherwise.
pub(super) fn mail_client(rt: &Runtime, st: &AmState, origin: &Origin) -> Result<MailClient> {
    if *origin == st.origin {
        return Ok(MailClient::new(&rt.relay_url(), rt.relay().http().clone()));
    }
    // A loopback relay names itself by its `https` origin while serving plain http (as
    // relay-lite does, and as `origin_of` maps our own): reach such an origin over http.
    let loopback = url::Url::parse(origin.as_str()).ok().is_some_and(|u| match u.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    });
    if loopback {
        let plain = origin.as_str().replacen("https://", "http://", 1);
        let rc = RelayClient::new(&plain, None)?;
        return Ok(MailClient::new(&plain, rc.http().clone()));
    }
    let rc = RelayClient::new(origin.as_str(), None)?;
    Ok(MailClient::new(origin.as_str(), rc.http().clone()))
}

/// Fetches the card of `addr` from its routes in order and applies the pin. Falls back to the
/// pinned card when no route answers. A route into a local network is fetched only when the
/// profile allows local networks (§8.1), through a client whose resolver checks every address
/// it hands to the connection.
pub(super) async fn fetch_card(rt: &Runtime, st: &AmState, addr: &MailAddress) -> Result<MailboxCard> {
    let allow_local = local_net::allowed(rt).await?;
    let mut last_err = None;
    for route in &addr.routes {
        let fetched = match local_net::card_client(rt, st, route, allow_local) {
            Ok(client) => client.card(&addr.mailbox_id).await.map_err(Error::from),
            Err(e) => Err(e),
        };
        match fetched {
            Ok(rec) if rec.card.owner() == &addr.owner && rec.card.mailbox_id() == addr.mailbox_id => {
                let mut conn = rt.store().pool.acquire().await?;
                return observe_card(&mut conn, &rec.card).await;
            }
            Ok(_) => last_err = Some(Error::RelayServed("the route served a card for another mailbox".into())),
            Err(e) => last_err = Some(e),
        }
    }
    let mut conn = rt.store().pool.acquire().await?;
    if let Some((_, card)) = pin_of(&mut conn, &addr.owner, &addr.mailbox_id).await? {
        return Ok(card);
    }
    Err(last_err.unwrap_or_else(|| Error::Invalid("the address has no route to fetch its card from".into())))
}

/// Adds (or accepts) the contact at `address`: its card fetched, verified and pinned.
pub(super) async fn add_contact(
    rt: &Runtime,
    st: &AmState,
    address: &str,
    name: Option<&str>,
    allow: Option<&[String]>,
) -> Result<String> {
    let addr = MailAddress::parse(address)?;
    if addr.owner == st.id {
        return Err(Error::Invalid("that is our own Agent Mail address".into()));
    }
    let allow = match allow {
        Some(k) => crate::engine::kinds_to_string(k)?,
        None => crate::engine::DEFAULT_ALLOW.to_owned(),
    };
    let card = fetch_card(rt, st, &addr).await?;
    let owner = addr.owner.to_string();
    let full = MailAddress { routes: card.payload().routes.clone(), ..addr.clone() }.to_string();
    let mut tx = rt.store().pool.begin_with("BEGIN IMMEDIATE").await?;
    let name = match store::contact_by_peer(&mut tx, AM, &owner).await? {
        Some(c) if c.state == ContactState::Pending => {
            let new_name = name.unwrap_or(&c.name).to_owned();
            if new_name != c.name && store::name_taken(&mut tx, &new_name).await? {
                return Err(Error::ContactExists(format!("a contact named `{new_name}` already exists")));
            }
            let accept = store::ContactUpdate {
                name: Some(&new_name),
                state: Some(ContactState::Active),
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
                    state: ContactState::Active,
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
