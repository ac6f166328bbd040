//! Sending: a message (text first, then any attachments) built, sealed to the recipient's
//! pinned or fetched card and committed with its outbox row in one transaction; one delivery
//! attempt of the stored packet; re-encryption under a newer card after `stale_card`.

use crate::engine::outbox::{self, Sealed};
use crate::engine::{Error, Result, Runtime};
use crate::protocol::agent_identity::Origin;
use crate::protocol::agent_mail::attachment::check_outgoing;
use crate::protocol::agent_mail::message::MAX_SUBJECT_CHARS;
use crate::protocol::agent_mail::packet::{Packet, SealRequest, seal};
use crate::protocol::agent_mail::{MailAddress, Message, Part};
use crate::store::{self, Audit, ContactRow, OutboxRow};
use crate::transport::agent_mail::Delivered;
use crate::transport::letagents::SendOutcome;
use crate::util::{OsRng, now_ms};

use super::cards::{current_card, fetch_card, mail_client, take_nonce};
use super::receive::body_text;
use super::{AM, AmState, MESSAGE_TTL_MS, bug, parts};

/// A message to an Agent Mail contact, as the engine asks for it.
#[derive(Debug, Clone, Copy)]
pub(in crate::engine) struct MailOut<'a> {
    /// send | ask | reply.
    pub kind: &'a str,
    /// The text (its own first part; left out when empty and there are attachments).
    pub text: &'a str,
    /// The message this answers.
    pub reply_to: Option<&'a str>,
    /// A subject.
    pub subject: Option<&'a str>,
    /// Our local agent sending it.
    pub from_agent: Option<&'a str>,
    /// Their agent it is for.
    pub to_agent: Option<&'a str>,
    /// Files to carry as parts after the text.
    pub attachments: &'a [Part],
}

/// Builds, seals and queues `out` to `c`. Returns its `message_id`.
pub(super) async fn send(rt: &Runtime, st: &AmState, c: &ContactRow, out: MailOut<'_>) -> Result<String> {
    check_outgoing(out.text, out.attachments)?;
    let addr = MailAddress::parse(&c.address)
        .map_err(|_| Error::Invalid(format!("no mailbox known for `{}`: add their Agent Mail address", c.name)))?;
    let card = fetch_card(rt, st, &addr).await?;
    let (own_card, _) = current_card(rt).await?;
    let now = now_ms();
    let expires_at = (now + MESSAGE_TTL_MS).min(card.payload().receive_until);
    let mut message_parts = Vec::with_capacity(out.attachments.len() + 1);
    if !out.text.is_empty() || out.attachments.is_empty() {
        message_parts.push(Part::text(out.text));
    }
    message_parts.extend(out.attachments.iter().cloned());
    let mut message = match out.reply_to {
        Some(parent_id) => {
            let (bytes, subject) = rt
                .store()
                .am_received(&st.id.to_string(), &c.peer_id, parent_id)
                .await?
                .ok_or_else(|| Error::UnknownMessage(parent_id.into()))?;
            let parent = Message::parse(&bytes).map_err(|e| bug(format!("stored message: {e}")))?;
            let mut m = Message::reply(&parent, &mut OsRng, now, expires_at, message_parts);
            if !subject.is_empty() {
                m.subject = Some(if subject.starts_with("Re: ") { subject } else { format!("Re: {subject}") })
                    .filter(|s| s.chars().count() <= MAX_SUBJECT_CHARS);
            }
            m
        }
        None => Message::new(&mut OsRng, st.id, addr.owner, now, expires_at, message_parts),
    };
    if let Some(s) = out.subject {
        message.subject = Some(s.to_owned());
    }
    message.reply_card = Some(own_card);
    message.validate()?;
    let id = message.message_id.to_string();
    let route = card
        .payload()
        .routes
        .first()
        .cloned()
        .ok_or_else(|| Error::Peer("the mailbox is closed: its owner takes no new mail".into()))?;
    let body = body_text(&message);

    let mut tx = rt.store().pool.begin_with("BEGIN IMMEDIATE").await?;
    parts::check_room(&mut tx, out.attachments).await?;
    let nonce = take_nonce(&mut tx, now).await?;
    let packet = seal(
        &SealRequest { sender: &st.key, card: &card, message: &message, created_at: now, nonce },
        now,
        &mut OsRng,
    )?;
    super::receive::insert_am_message(&mut tx, "out", &message, &card.mailbox_id().to_string(), now).await?;
    let mailbox = card.mailbox_id().to_string();
    let payload = packet.to_jcs();
    let sealed = Sealed {
        id: &id,
        protocol: AM,
        contact: c,
        kind: out.kind,
        body: &body,
        reply_to: out.reply_to,
        from_agent: out.from_agent,
        to_agent: out.to_agent,
        ts: now,
        relay_url: route.as_str(),
        target: &mailbox,
        drop_code: &[],
        payload: &payload,
    };
    outbox::queue(&mut tx, sealed, now).await?;
    parts::store_parts(&mut tx, "out", &c.peer_id, &message, now).await?;
    rt.commit_queued(tx).await?;
    Ok(id)
}

/// One delivery attempt of a queued packet: the exact stored bytes.
pub(super) async fn attempt(rt: &Runtime, st: &AmState, row: &OutboxRow) -> SendOutcome {
    let client =
        match Origin::parse(&row.relay_url).map_err(|e| bug(e.to_string())).and_then(|o| mail_client(rt, st, &o)) {
            Ok(c) => c,
            Err(e) => return SendOutcome::Permanent(format!("route: {e}")),
        };
    match client.deliver(&row.target, row.payload.clone()).await {
        Delivered::Accepted(_) => SendOutcome::Accepted,
        Delivered::Other(o) => o,
        Delivered::StaleCard => match reseal(rt, st, row).await {
            Ok(()) => SendOutcome::Retry { after_ms: Some(0), reason: "re-encrypted under the newer card".into() },
            Err(e) => SendOutcome::Retry { after_ms: None, reason: format!("stale card: {e}") },
        },
    }
}

/// Re-encrypts a queued message under the recipient's newer card (same message, new packet).
async fn reseal(rt: &Runtime, st: &AmState, row: &OutboxRow) -> Result<()> {
    let (recipient, bytes) = rt
        .store()
        .am_sent(&st.id.to_string(), &row.message_id)
        .await?
        .ok_or_else(|| bug("queued message without its record"))?;
    let message = Message::parse(&bytes).map_err(|e| bug(format!("stored message: {e}")))?;
    let mut conn = rt.store().pool.acquire().await?;
    let c = store::contact_by_peer(&mut conn, AM, &recipient).await?.ok_or_else(|| bug("contact gone"))?;
    drop(conn);
    let addr = MailAddress::parse(&c.address).map_err(bug)?;
    let card = fetch_card(rt, st, &addr).await?;
    let old = Packet::parse(&row.payload).map_err(bug)?;
    if old.header().card_hash == card.hash() {
        return Err(Error::Peer("the recipient has published no newer card yet".into()));
    }
    let now = now_ms();
    let route = card
        .payload()
        .routes
        .first()
        .cloned()
        .ok_or_else(|| Error::Peer("the mailbox is closed: its owner takes no new mail".into()))?;
    let mut tx = rt.store().pool.begin_with("BEGIN IMMEDIATE").await?;
    let nonce = take_nonce(&mut tx, now).await?;
    let packet = seal(
        &SealRequest { sender: &st.key, card: &card, message: &message, created_at: now, nonce },
        now,
        &mut OsRng,
    )?;
    store::am_replace_queued_packet(&mut tx, row.id, &packet.to_jcs(), &card.mailbox_id().to_string(), route.as_str())
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
