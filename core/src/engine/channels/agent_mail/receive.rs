//! Receiving: the owner's mailbox listed page by page, every packet through `recipient`'s
//! pipeline in the spec's order, and a new message committed (deduplication row, contact
//! changes, attachments, audit) before the packet is deleted at the relay. Unknown senders
//! become pending requests; replies are linked only when their bindings hold.

use serde_json::Value;

use crate::engine::{Error, Event, Result, Runtime};
use crate::protocol::agent_identity::{AgentId, Hash32};
use crate::protocol::agent_mail::attachment::is_attachment;
use crate::protocol::agent_mail::message::check_reply;
use crate::protocol::agent_mail::recipient::{
    MessageCommitment, ReceiveError, RetainedKey, SenderPolicy, Verdict, verify_packet,
};
use crate::protocol::agent_mail::relay::PacketRecord;
use crate::protocol::agent_mail::{MailAddress, Message};
use crate::store::ContactState;
use crate::store::{self, Audit, DeliveryPath, NewContact, NewMessage};
use crate::transport::TransportError;
use crate::util::now_ms;

use super::cards::{mail_client, observe_card, retained};
use super::{AM, AmState, LIST_LIMIT, bug, default_name, owner_jwt, parts};

/// What one drain of the mailbox came to.
pub(super) struct Drained {
    /// Packets processed.
    pub processed: usize,
    /// Whether any of them is something `inbox` shows.
    pub showable: bool,
    /// The relay does not know our mailbox: publish our card again.
    pub republish: bool,
}

/// Lists our mailbox, processes every packet and deletes each after its commit.
pub(super) async fn drain(rt: &Runtime, st: &AmState) -> Result<Drained> {
    drain_with(rt, st, &mail_client(rt, st, &st.origin)?).await
}

/// [`drain`] through `client`, the relay whose origin is `st.origin` (a relay the profile moved
/// away from, read until its drain ends).
pub(super) async fn drain_with(
    rt: &Runtime,
    st: &AmState,
    client: &crate::transport::agent_mail::MailClient,
) -> Result<Drained> {
    let keys = retained(rt, st).await?;
    let mut cursor: Option<String> = None;
    let mut out = Drained { processed: 0, showable: false, republish: false };
    loop {
        let jwt = owner_jwt(st);
        let page = match client.list(&st.mailbox, &jwt, cursor.as_deref(), LIST_LIMIT).await {
            Ok(p) => p,
            Err(TransportError::Status { status: 404, code, .. }) if code == "mailbox_unavailable" => {
                // The relay does not know our mailbox (never published, or forgotten).
                rt.store().am_cards_unpublished().await?;
                out.republish = true;
                return Ok(out);
            }
            Err(e) => return Err(e.into()),
        };
        for item in &page.result {
            let (delete, shows) = process(rt, st, &keys, item, DeliveryPath::Relay).await?;
            out.showable |= shows;
            out.processed += 1;
            if let Some(packet_id) = delete {
                client.delete(&st.mailbox, &packet_id, &jwt).await?;
            }
        }
        match page.next_cursor {
            Some(c) if !page.result.is_empty() => cursor = Some(c),
            _ => return Ok(out),
        }
    }
}

/// A packet a nearby contact handed over directly (the LAN path): the same pipeline and
/// transaction as a listed one, under a record made here (its packet ID is the packet's hash, as
/// a relay's). Returns whether `inbox` shows it.
pub(super) async fn receive_direct(rt: &Runtime, st: &AmState, bytes: &[u8]) -> Result<bool> {
    let packet = crate::protocol::agent_mail::Packet::parse(bytes).map_err(|e| Error::Peer(e.to_string()))?;
    let record = PacketRecord { packet_id: packet.id(), packet, accepted_at: now_ms(), seq: 1 };
    let keys = retained(rt, st).await?;
    let (_, showable) = process(rt, st, &keys, &record.to_value(), DeliveryPath::Direct).await?;
    Ok(showable)
}

/// The text an agent or user sees: unnamed text parts in order; attachments (other parts, and
/// named files whatever their type) are named, never opened or shown (their bytes are kept apart
/// and handed out only on request).
pub(super) fn body_text(m: &Message) -> String {
    let mut out = Vec::new();
    for (i, p) in m.parts.iter().enumerate() {
        match p.as_text().filter(|_| !is_attachment(p)) {
            Some(t) => out.push(t.to_owned()),
            None => out.push(format!(
                "[attachment {i}: {} ({}, {} bytes), not opened]",
                p.display_name().unwrap_or_else(|| "unnamed".into()),
                p.media_type,
                p.data.len()
            )),
        }
    }
    out.join("\n")
}

/// One listed packet: the recipient pipeline, then every effect in one transaction. Returns
/// the packet ID to delete at the relay (after the commit) and whether `inbox` shows it.
pub(super) async fn process(
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
            am_audit(rt, "", "", "dropped", &format!("relay listed a malformed record: {e}")).await?;
            return Ok((None, false));
        }
    };
    let packet_id = record.packet_id;
    let refuse = |e: ReceiveError| format!("{} ({})", e, e.code().as_str());
    let verified = match verify_packet(record.packet, Some(&packet_id), now) {
        Ok(v) => v,
        Err(e) => {
            am_audit(rt, "", &packet_id.to_string(), "dropped", &refuse(e)).await?;
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
            let mut tx = rt.store().write_tx().await?;
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
            am_audit(rt, &sender, &packet_id.to_string(), "dropped", &refuse(e)).await?;
            return Ok((Some(packet_id), false));
        }
    };
    let message = &opened.message;
    let msg_id = message.message_id.to_string();
    let seen = commitment(rt, &st.id, &sender, &msg_id).await?;
    let commitment = match opened.decide(seen.as_ref(), now) {
        Ok(Verdict::Duplicate) => return Ok((Some(packet_id), false)),
        Ok(Verdict::New(c)) => c,
        Err(e) => {
            am_audit(rt, &sender, &msg_id, "refused", &refuse(e)).await?;
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
        let parent = store::am_sent_to(&mut tx, &st.id.to_string(), &sender, &parent_id.to_string()).await?;
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
                state: ContactState::Pending,
                allow_kinds: crate::engine::DEFAULT_ALLOW,
                request_body: &request,
                now,
            },
        )
        .await?;
        event = Some(Event::Request { name });
        contact = store::contact_by_peer(&mut tx, AM, &sender).await?;
    } else if let (Some(c), Some(a)) = (&contact, &reply_address) {
        store::update_contact(&mut tx, c.id, &store::ContactUpdate { address: Some(a), ..Default::default() }).await?;
    }
    let c = contact.ok_or_else(|| bug("contact vanished"))?;
    let held = c.state != ContactState::Active;
    let allowed = c.allow_kinds.split(',').any(|k| k == kind);
    let (state, showable) = match (held, allowed) {
        (true, _) => ("request", false),
        (false, true) => ("received", true),
        (false, false) => ("refused", false),
    };
    if state != "refused" {
        let rowid = store::insert_message(
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
        if let Some(note) = parts::store_received(&mut tx, rowid, message, now).await? {
            detail.push(note);
        }
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

async fn commitment(rt: &Runtime, me: &AgentId, sender: &str, msg_id: &str) -> Result<Option<MessageCommitment>> {
    let Some((hash, expires_at)) = rt.store().am_received_commitment(&me.to_string(), sender, msg_id).await? else {
        return Ok(None);
    };
    Ok(Some(MessageCommitment {
        content_hash: Hash32::parse(&hash).ok_or_else(|| bug("stored content hash"))?,
        expires_at,
    }))
}

async fn am_audit(rt: &Runtime, peer: &str, id: &str, state: &str, detail: &str) -> Result<()> {
    let mut conn = rt.store().pool.acquire().await?;
    store::audit(&mut conn, now_ms(), audit_in(peer, id, "", state, detail)).await?;
    Ok(())
}

/// Adds `subject`, `thread` and `attachments` (index, name, media type, size; never the bytes)
/// to Agent Mail message views.
pub(super) async fn decorate(rt: &Runtime, views: &mut [Value]) -> Result<()> {
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
        let found = rt.store().am_subject_thread(&dir, &peer, &id).await?;
        let rowid = match rt.store().message(&dir, &id)? {
            Some(m) if m.protocol == AM && m.peer == peer => Some(m.rowid_),
            _ => None,
        };
        let attachments = match rowid {
            Some(r) => rt.store().attachments(r).await?,
            None => Vec::new(),
        };
        if let Some(obj) = v.as_object_mut() {
            if let Some((subject, thread)) = found {
                obj.insert("subject".into(), if subject.is_empty() { Value::Null } else { Value::String(subject) });
                obj.insert("thread".into(), Value::String(thread));
            }
            obj.insert("attachments".into(), parts::listing(&attachments));
        }
    }
    Ok(())
}

fn audit_in<'a>(peer: &'a str, id: &'a str, kind: &'a str, state: &'a str, detail: &'a str) -> Audit<'a> {
    Audit { direction: "in", protocol: AM.as_str(), peer, message_id: id, kind, state, detail }
}

/// Records a message in `am_messages`. Returns false when `(recipient, sender, message_id)` is
/// already there (the durable deduplication key).
pub(super) async fn insert_am_message(
    tx: &mut sqlx::SqliteConnection,
    direction: &str,
    m: &Message,
    mailbox: &str,
    now: i64,
) -> Result<bool> {
    let row = store::AmMessageRow {
        direction,
        recipient: &m.to.to_string(),
        sender: &m.from.to_string(),
        message_id: &m.message_id.to_string(),
        thread_id: &m.thread_id.to_string(),
        subject: m.subject.as_deref().unwrap_or_default(),
        in_reply_to: &m.in_reply_to.map(|i| i.to_string()).unwrap_or_default(),
        content_hash: &m.content_hash().to_string(),
        expires_at: m.expires_at,
        mailbox_id: mailbox,
        message: &m.to_jcs(),
        created_at: now,
    };
    Ok(store::am_insert_message(tx, &row).await?)
}
