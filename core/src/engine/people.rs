//! People: one contact per person across protocols (issue 20).
//!
//! - Our contact link ([`crate::protocol::contact_link`]) names every address of this profile,
//!   signed by the letagents identity key; `whoami` offers it first.
//! - Adding a link makes (or extends) one person: each listed protocol becomes a contact row of
//!   that person (a channel), named `<person>.<protocol>`; rows the person already had (an
//!   earlier bare address, a pending request) are taken in, keeping their rules and history.
//! - Sending to a person picks the first usable channel in [`CHANNEL_ORDER`]; the LAN direct path
//!   is tried inside a letagents or Agent Mail attempt by the outbox. When a channel fails (its
//!   relay unreachable, a permanent refusal, or its give-up time), the outbox hands the message
//!   to the next channel once: the first row becomes `rerouted`, the new one names it in
//!   `fallback_of`. A channel is never tried twice for one message.
//! - A person's conversation is every channel's messages in one list.

use serde_json::{Value, json};

use super::channels::{ContactAdd, Outgoing};
use super::{Error, Result, Runtime};
use crate::protocol::agent_mail::address::MailAddress;
use crate::protocol::contact_link::{ContactLink, LetagentsEntry, StringcupEntry};
use crate::protocol::letagents::Kind;
use crate::store::{self, ContactRow, OutboxRow, PersonRow, Protocol};
use crate::util::now_ms;

/// The order a person's channels are tried in.
pub const CHANNEL_ORDER: [Protocol; 3] = [Protocol::Letagents, Protocol::AgentMail, Protocol::Stringcup];

/// Whether `text` is written as a contact link (rather than a protocol address).
pub(super) fn looks_like_link(text: &str) -> bool {
    let t = text.trim();
    let lower = t.get(..12).map(str::to_ascii_lowercase);
    let body = if lower.as_deref() == Some("switchboard:") { t.get(12..).unwrap_or("") } else { t };
    let body = body.strip_prefix("//").unwrap_or(body);
    body.strip_prefix("sb")
        .is_some_and(|r| r.split_once('.').is_some_and(|(v, _)| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())))
}

fn rank(p: Protocol) -> usize {
    CHANNEL_ORDER.iter().position(|q| *q == p).unwrap_or(CHANNEL_ORDER.len())
}

fn usable(c: &ContactRow) -> bool {
    c.state == "active" && !c.blocked && c.changed_box_pub.is_none()
}

impl Runtime {
    /// Our contact link, signed now; `None` while a required part (letagents) is missing.
    pub(super) async fn own_contact_link(&self) -> Result<ContactLink> {
        let agent_mail = self
            .inner
            .agent_mail
            .agent_mail_whoami(self)
            .await
            .get("address")
            .and_then(Value::as_str)
            .and_then(|a| MailAddress::parse(a).ok());
        let stringcup = self.inner.stringcup.stringcup_whoami(self).await.get("id").and_then(Value::as_str).map(|id| {
            StringcupEntry { id: id.to_owned(), relay: self.inner.relay_url.trim_end_matches('/').to_owned() }
        });
        let name: String = self.inner.name.chars().take(crate::protocol::contact_link::MAX_NAME_CHARS).collect();
        Ok(ContactLink {
            name: name.trim().to_owned(),
            letagents: LetagentsEntry {
                address: self.inner.id.address(),
                relay: self.inner.relay_url.trim_end_matches('/').to_owned(),
            },
            agent_mail,
            stringcup,
        })
    }

    /// `whoami`'s first section: the link to share, with its one safety number.
    pub(super) async fn whoami_link(&self) -> Value {
        let link = match self.own_contact_link().await {
            Ok(l) => l,
            Err(e) => return json!({"error": e.to_string()}),
        };
        let channels: Vec<&str> = [
            Some(Protocol::Letagents.as_str()),
            link.agent_mail.as_ref().map(|_| Protocol::AgentMail.as_str()),
            link.stringcup.as_ref().map(|_| Protocol::Stringcup.as_str()),
        ]
        .into_iter()
        .flatten()
        .collect();
        match link.sign(&self.inner.id.sig) {
            Ok(text) => json!({"link": text, "safety_number": link.safety_number(), "channels": channels}),
            Err(e) => json!({"error": e.to_string()}),
        }
    }

    /// Adds the person a contact link names: one person row, one contact row per protocol.
    pub(super) async fn person_add(
        &self,
        text: &str,
        name: Option<&str>,
        allow: Option<&[String]>,
        hello: bool,
    ) -> Result<Value> {
        let link = ContactLink::parse(text)?;
        if link.identity_key() == self.keys().sig {
            return Err(Error::Invalid("that is our own contact link".into()));
        }
        let key = link.identity_key();
        let mut conn = self.store().pool.acquire().await?;
        let person = match store::person_by_key(&mut conn, &key).await? {
            Some(p) => p,
            None => {
                let name = name.unwrap_or(&link.name).trim().to_owned();
                if name.is_empty() || name.len() > 48 || name.contains('.') {
                    return Err(Error::Invalid("a person's name must be 1 to 48 characters without `.`".into()));
                }
                // A contact row of the same name clashes unless it is one of this person's own
                // channels (a request they sent, which joins the person below).
                let clash = match self.store().contact_by_name(&name).await? {
                    Some(c) => {
                        c.peer_id != link.letagents.address.keys.mailbox_id()
                            && link.agent_mail.as_ref().is_none_or(|a| c.peer_id != a.owner.to_string())
                            && link.stringcup.as_ref().is_none_or(|s| c.peer_id != s.id)
                    }
                    None => false,
                };
                if clash || store::person_name_taken(&mut conn, &name).await? {
                    return Err(Error::ContactExists(format!("a contact named `{name}` already exists")));
                }
                let id =
                    store::insert_person(&mut conn, &name, &key, &link.safety_number(), text.trim(), now_ms()).await?;
                self.store().person_by_id(id).await?.ok_or_else(|| Error::Bug("person just inserted".into()))?
            }
        };
        drop(conn);
        let own_relay = self.inner.relay_url.trim_end_matches('/');
        let mut added = Vec::new();
        let mut skipped = Vec::new();
        // Each channel, in the order they are tried.
        let mut wanted: Vec<(Protocol, String, String, Option<String>)> = vec![(
            Protocol::Letagents,
            link.letagents.address.to_string(),
            link.letagents.address.keys.mailbox_id(),
            (link.letagents.relay != own_relay).then(|| link.letagents.relay.clone()),
        )];
        if let Some(am) = &link.agent_mail {
            wanted.push((Protocol::AgentMail, am.to_string(), am.owner.to_string(), None));
        }
        match &link.stringcup {
            // Stringcup identities are looked up at our own relay.
            Some(sc) if sc.relay == own_relay => wanted.push((Protocol::Stringcup, sc.id.clone(), sc.id.clone(), None)),
            Some(sc) => skipped
                .push(json!({"protocol": "stringcup", "why": format!("registered at {}, not at our relay", sc.relay)})),
            None => {}
        }
        for (protocol, address, peer_id, relay) in wanted {
            match self.person_channel_add(&person, protocol, &address, &peer_id, relay.as_deref(), allow, hello).await {
                Ok(contact) => added.push(contact),
                Err(e) => {
                    tracing::warn!("{}: adding the {protocol} channel failed: {e}", person.name);
                    skipped.push(json!({"protocol": protocol, "why": e.to_string()}));
                }
            }
        }
        if added.is_empty() {
            return Err(Error::Invalid(format!("no channel of `{}` could be added: {skipped:?}", person.name)));
        }
        let mut v = self.person_dto(&person).await?;
        if let Some(o) = v.as_object_mut() {
            o.insert("skipped".into(), Value::Array(skipped));
        }
        Ok(v)
    }

    /// Adds (or takes in) one channel of `person`; returns the contact row's name.
    #[allow(clippy::too_many_arguments)]
    async fn person_channel_add(
        &self,
        person: &PersonRow,
        protocol: Protocol,
        address: &str,
        peer_id: &str,
        relay: Option<&str>,
        allow: Option<&[String]>,
        hello: bool,
    ) -> Result<String> {
        let existing = self.store().contact_by_peer(protocol, peer_id).await?;
        let name = match existing {
            // Already a contact (a bare address added earlier): it joins the person as it is.
            Some(c) if c.state == "active" => c.name,
            _ => {
                let name = format!("{}.{}", person.name, protocol.as_str());
                let req = ContactAdd { address, name: Some(&name), allow, relay, hello };
                self.channel(protocol).add_contact(self, req).await?
            }
        };
        let c = self.contact(&name).await?;
        let mut conn = self.store().pool.acquire().await?;
        store::set_contact_person(&mut conn, c.id, person.id).await?;
        Ok(name)
    }

    /// A person as clients see it: the contact fields a list shows, and its channels.
    pub(super) async fn person_dto(&self, p: &PersonRow) -> Result<Value> {
        let mut channels = self.store().person_channels(p.id).await?;
        channels.sort_by_key(|c| rank(c.protocol));
        let dtos: Vec<Value> = channels.iter().map(|c| self.contact_dto(c)).collect();
        let state = if channels.iter().any(|c| c.state == "active") { "active" } else { "pending" };
        Ok(json!({
            "name": p.name,
            "person": true,
            "protocol": "person",
            "safety_number": p.safety_number,
            "verified": !channels.is_empty() && channels.iter().all(|c| c.verified),
            "state": state,
            "blocked": !channels.is_empty() && channels.iter().all(|c| c.blocked),
            "key_changed": channels.iter().any(|c| c.changed_box_pub.is_some()),
            "address": p.link,
            "channels": dtos,
        }))
    }

    /// `contact list`: one entry per person (with its channels), then every contact of its own.
    pub(super) async fn contact_list(&self) -> Result<Value> {
        let mut out = Vec::new();
        for p in self.store().people().await? {
            out.push(self.person_dto(&p).await?);
        }
        for c in self.store().contacts(None).await? {
            if c.person_id.is_none() {
                out.push(self.contact_dto(&c));
            }
        }
        Ok(Value::Array(out))
    }

    /// The channel a message to person `p` goes on first.
    pub(super) async fn person_first_channel(&self, p: &PersonRow) -> Result<ContactRow> {
        let mut channels = self.store().person_channels(p.id).await?;
        channels.sort_by_key(|c| rank(c.protocol));
        channels.into_iter().find(usable).ok_or_else(|| Error::Pending(p.name.clone()))
    }

    /// Every message with person `p`, over all channels.
    pub(super) async fn person_conversation(&self, p: &PersonRow, limit: Option<i64>) -> Result<Value> {
        let rows = self.store().person_conversation(p.id, limit.unwrap_or(500).clamp(1, 10_000)).await?;
        let mut out = Vec::new();
        for m in &rows {
            let auth = self.channel(m.protocol).sender_auth();
            out.push(super::message_dto(m, Some(&p.name), auth));
        }
        Ok(Value::Array(out))
    }

    /// The outbox found `row`'s channel failing (`reason`): if its message is a person's and a
    /// later channel is usable, the message goes there instead, once. Returns whether it did.
    pub(super) async fn fall_back(&self, row: &OutboxRow, reason: &str) -> Result<bool> {
        let Some(kind) = Kind::parse(&row.kind).filter(|k| matches!(k, Kind::Send | Kind::Ask | Kind::Reply)) else {
            return Ok(false);
        };
        let Some(m) = self.store().message("out", &row.message_id).await? else { return Ok(false) };
        let Some(contact_id) = m.contact_id else { return Ok(false) };
        let Some(c) = self.store().contact_by_id(contact_id).await? else { return Ok(false) };
        let Some(person_id) = c.person_id else { return Ok(false) };
        if self.store().fell_back_from(&m.id).await? {
            return Ok(false);
        }
        let mut channels = self.store().person_channels(person_id).await?;
        channels.sort_by_key(|c| rank(c.protocol));
        // A reply's id belongs to the protocol it came from; on another channel it is sent as a
        // message of its own.
        let (kind, reply_to) = if kind == Kind::Reply { (Kind::Send, None) } else { (kind, m.reply_to.as_deref()) };
        let mut carried = None;
        for next in channels.into_iter().filter(|n| rank(n.protocol) > rank(row.protocol) && usable(n)) {
            let msg = Outgoing {
                kind,
                body: Value::String(m.body.clone()),
                reply_to,
                from_agent: m.from_agent.as_deref(),
                to_agent: m.to_agent.as_deref(),
            };
            match self.channel(next.protocol).send(self, &next, msg).await {
                Ok(id) => {
                    carried = Some((next, id));
                    break;
                }
                Err(e) => tracing::warn!("message {}: {} could not take it either: {e}", m.id, next.protocol),
            }
        }
        let Some((next, new_id)) = carried else { return Ok(false) };
        let detail = format!("{} failed ({reason}); sent on {} as {new_id}", row.protocol, next.protocol);
        let mut tx = self.store().pool.begin().await?;
        store::record_fallback(&mut tx, row.id, &m.id, &new_id, &detail).await?;
        tx.commit().await?;
        tracing::info!("message {}: {detail}", m.id);
        self.emit(super::Event::Delivery { id: m.id.clone(), state: "rerouted".into() });
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_told_from_addresses() {
        assert!(looks_like_link("switchboard:sb1.abc.def"));
        assert!(looks_like_link("SWITCHBOARD://sb1.abc.def"));
        assert!(looks_like_link("sb2.abc.def"));
        assert!(!looks_like_link("la1.abc.def"));
        assert!(!looks_like_link("sc-abcdefghijklmnopqrstuvwx"));
        assert!(!looks_like_link("sbx.abc"));
    }
}
