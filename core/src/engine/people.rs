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
//! - A reply to a person goes back on the channel the replied-to message arrived on, while that
//!   channel is usable; the outbox falls back from there as for any other message.
//! - A person's conversation is every channel's messages in one list.
//! - The owner merges two contacts into one person (`contact merge A B`: B's channels join A)
//!   only when both show the same verified safety number or the owner confirms B's number after
//!   comparing it, and splits a channel back out into a contact of its own (`contact split`).
//! - Verifying a person marks every channel the person's link signed (a merged person without a
//!   link: every channel showing the person's safety number); blocking a person blocks every
//!   channel.

use serde_json::{Value, json};

use super::channels::{ContactAdd, Outgoing};
use super::{Error, Result, Runtime};
use crate::protocol::contact_link::{ContactLink, LetagentsEntry, StringcupEntry};
use crate::protocol::letagents::Kind;
use crate::store::ContactState;
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

/// A person's name: 1 to 48 characters without `.` (their channels are `<person>.<protocol>`).
fn check_person_name(name: &str) -> Result<()> {
    if name.trim().is_empty() || name.trim() != name || name.len() > 48 || name.contains('.') {
        return Err(Error::Invalid(format!(
            "a person's name must be 1 to 48 characters without `.` or surrounding spaces (not `{name}`)"
        )));
    }
    Ok(())
}

/// Refuses `name` for a contact row or a person if either already has it.
pub(super) async fn check_name_free(conn: &mut sqlx::SqliteConnection, name: &str) -> Result<()> {
    if name.trim().is_empty() || name.trim() != name || name.len() > 64 {
        return Err(Error::Invalid(format!("a contact name must be 1 to 64 characters (not `{name}`)")));
    }
    if store::name_taken(&mut *conn, name).await? || store::person_name_taken(&mut *conn, name).await? {
        return Err(Error::ContactExists(format!("a contact named `{name}` already exists: choose another name")));
    }
    Ok(())
}

/// Safety numbers as people type them back: case and spacing do not matter.
fn same_number(a: &str, b: &str) -> bool {
    let norm = |s: &str| s.chars().filter(|c| !c.is_whitespace()).flat_map(char::to_lowercase).collect::<String>();
    !norm(a).is_empty() && norm(a) == norm(b)
}

/// What `contact merge` acts on: a person (named directly or by one of its channels), or a
/// contact of its own.
enum Entry {
    Person(PersonRow),
    Contact(Box<ContactRow>),
}

fn rank(p: Protocol) -> usize {
    CHANNEL_ORDER.iter().position(|q| *q == p).unwrap_or(CHANNEL_ORDER.len())
}

fn usable(c: &ContactRow) -> bool {
    c.state == ContactState::Active && !c.blocked && c.changed_box_pub.is_none()
}

impl Runtime {
    /// Our contact link, signed now; `None` while a required part (letagents) is missing.
    pub(super) async fn own_contact_link(&self) -> Result<ContactLink> {
        let agent_mail =
            self.inner.agent_mail.agent_mail_link_entry(self, &self.inner.id.sig.verifying_key().to_bytes()).await;
        let stringcup =
            self.inner.stringcup.stringcup_whoami(self).await.get("id").and_then(Value::as_str).map(|id| {
                StringcupEntry { id: id.to_owned(), relay: self.relay_url().trim_end_matches('/').to_owned() }
            });
        let name: String = self.inner.name.chars().take(crate::protocol::contact_link::MAX_NAME_CHARS).collect();
        Ok(ContactLink {
            name: name.trim().to_owned(),
            letagents: LetagentsEntry {
                address: self.inner.id.address(),
                relay: self.relay_url().trim_end_matches('/').to_owned(),
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
                let clash = match self.store().contact_by_name(&name)? {
                    Some(c) => {
                        c.peer_id != link.letagents.address.keys.mailbox_id()
                            && link.agent_mail.as_ref().is_none_or(|(a, _)| c.peer_id != a.owner.to_string())
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
        let own_relay = self.relay_url();
        let own_relay = own_relay.trim_end_matches('/');
        let mut added = Vec::new();
        let mut skipped = Vec::new();
        // Each channel, in the order they are tried.
        let mut wanted: Vec<(Protocol, String, String, Option<String>)> = vec![(
            Protocol::Letagents,
            link.letagents.address.to_string(),
            link.letagents.address.keys.mailbox_id(),
            (link.letagents.relay != own_relay).then(|| link.letagents.relay.clone()),
        )];
        if let Some((am, _)) = &link.agent_mail {
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
            // Another person's channel is never taken over by a link: that is a merge, which
            // needs the safety numbers compared.
            Some(c) if c.person_id.is_some_and(|id| id != person.id) => {
                return Err(Error::Invalid(format!(
                    "that {protocol} address is already a channel of another contact (`{}`); merge them after comparing safety numbers",
                    c.name
                )));
            }
            // A Stringcup id proves nothing about who holds it (server-assigned, no signing
            // key), so a link cannot claim an existing Stringcup contact for its person.
            Some(c) if protocol == Protocol::Stringcup && c.person_id.is_none() => {
                return Err(Error::Invalid(format!(
                    "that Stringcup id is already your contact `{}`; merge them after comparing safety numbers",
                    c.name
                )));
            }
            // Already a contact (a bare address added earlier) whose key the link proves: it
            // joins the person as it is.
            Some(c) if c.state == ContactState::Active => c.name,
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
        let mut channels = self.store().person_channels(p.id)?;
        channels.sort_by_key(|c| rank(c.protocol));
        let signed = self.signed_channels(p).await?;
        let mut dtos = Vec::new();
        for c in &channels {
            let mut dto = self.contact_dto(c);
            let reachable = usable(c) && !self.store().last_send_failed(c.id).await?;
            if let Some(o) = dto.as_object_mut() {
                o.insert("reachable".into(), Value::Bool(reachable));
            }
            dtos.push(dto);
        }
        let state = if channels.iter().any(|c| c.state == ContactState::Active) {
            ContactState::Active
        } else {
            ContactState::Pending
        };
        Ok(json!({
            "name": p.name,
            "person": true,
            "protocol": "person",
            "safety_number": p.safety_number,
            // The one safety number was compared: every channel it stands for is verified.
            "verified": !signed.is_empty() && signed.iter().all(|c| c.verified),
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
        let mut channels = self.store().person_channels(p.id)?;
        channels.sort_by_key(|c| rank(c.protocol));
        let blocked = !channels.is_empty() && channels.iter().all(|c| c.blocked);
        channels
            .into_iter()
            .find(usable)
            .ok_or_else(|| if blocked { Error::Blocked(p.name.clone()) } else { Error::Pending(p.name.clone()) })
    }

    /// The channel a message to person `p` goes on: for a reply, the channel the replied-to
    /// message arrived on while it is usable; otherwise the first usable one. A reply on
    /// Stringcup, which carries the text alone, goes as a plain message (as a fallback does).
    pub(super) async fn person_route<'a>(
        &self,
        p: &PersonRow,
        kind: Kind,
        reply_to: Option<&'a str>,
    ) -> Result<(ContactRow, Kind, Option<&'a str>)> {
        let mut came_on = None;
        if let Some(id) = reply_to
            && let Some(m) = self.store().message("in", id)?
            && let Some(contact_id) = m.contact_id
            && let Some(c) = self.store().contact_by_id(contact_id)?
            && c.person_id == Some(p.id)
            && usable(&c)
        {
            came_on = Some(c);
        }
        let c = match came_on {
            Some(c) => c,
            None => self.person_first_channel(p).await?,
        };
        if c.protocol == Protocol::Stringcup && kind == Kind::Reply {
            return Ok((c, Kind::Send, None));
        }
        Ok((c, kind, reply_to))
    }

    /// Whether person `p`'s identity vouches for channel `c`'s key: its link lists that key (a
    /// Stringcup entry names the id, not its key), or, for a merged person without a link, the
    /// channel shows the person's safety number. A changed key is never vouched for.
    fn signed_by_person(&self, p: &PersonRow, link: Option<&ContactLink>, c: &ContactRow) -> bool {
        if c.changed_box_pub.is_some() {
            return false;
        }
        match link {
            Some(l) => match c.protocol {
                Protocol::Letagents => {
                    c.sig_pub == l.letagents.address.keys.sig && c.box_pub == l.letagents.address.keys.boxk
                }
                Protocol::AgentMail => l.agent_mail.as_ref().is_some_and(|(a, _)| a.owner.to_string() == c.peer_id),
                Protocol::Stringcup => false,
            },
            None => self.channel(c.protocol).safety_numbers(c).0.is_some_and(|n| same_number(&n, &p.safety_number)),
        }
    }

    /// The channels of `p` its identity vouches for (see [`Self::signed_by_person`]).
    async fn signed_channels(&self, p: &PersonRow) -> Result<Vec<ContactRow>> {
        let link = ContactLink::parse(&p.link).ok();
        let channels = self.store().person_channels(p.id)?;
        Ok(channels.into_iter().filter(|c| self.signed_by_person(p, link.as_ref(), c)).collect())
    }

    /// `contact verify PERSON`: every channel the person's identity vouches for is marked
    /// verified (the owner compared the one safety number); others keep their own state.
    pub(super) async fn person_verify(&self, p: &PersonRow) -> Result<Value> {
        let signed = self.signed_channels(p).await?;
        if signed.is_empty() {
            return Err(Error::Invalid(format!(
                "no channel of `{}` carries the key their safety number stands for: verify a channel by its name",
                p.name
            )));
        }
        let mut tx = self.store().write_tx().await?;
        for c in &signed {
            store::update_contact(&mut tx, c.id, &store::ContactUpdate { verified: Some(true), ..Default::default() })
                .await?;
        }
        tx.commit().await?;
        self.person_dto(p).await
    }

    /// `contact block|unblock PERSON`: every channel, each as `contact block` does it.
    pub(super) async fn person_block(&self, p: &PersonRow, blocked: bool) -> Result<Value> {
        let mut relay = serde_json::Map::new();
        for c in self.store().person_channels(p.id)? {
            let v = self.contact_block(&c.name, blocked).await?;
            relay.insert(c.protocol.as_str().to_owned(), v.get("relay_block").cloned().unwrap_or(Value::Null));
        }
        let mut v = self.person_dto(p).await?;
        if let Some(o) = v.as_object_mut() {
            o.insert("relay_block".into(), Value::Object(relay));
        }
        Ok(v)
    }

    /// `contact block|unblock NAME` for a person or a contact.
    pub(super) async fn block_contact_or_person(&self, name: &str, blocked: bool) -> Result<Value> {
        match self.store().person_by_name(name)? {
            Some(p) => self.person_block(&p, blocked).await,
            None => self.contact_block(name, blocked).await,
        }
    }

    /// `contact verify NAME` for a person or a contact.
    pub(super) async fn verify_contact_or_person(&self, name: &str) -> Result<Value> {
        match self.store().person_by_name(name)? {
            Some(p) => self.person_verify(&p).await,
            None => self.contact_verify(name).await,
        }
    }

    async fn entry(&self, name: &str) -> Result<Entry> {
        if let Some(p) = self.store().person_by_name(name)? {
            return Ok(Entry::Person(p));
        }
        let c = self.store().contact_by_name(name)?.ok_or_else(|| Error::UnknownContact(name.into()))?;
        match c.person_id {
            Some(id) => {
                Ok(Entry::Person(self.store().person_by_id(id).await?.ok_or_else(|| Error::Bug("person gone".into()))?))
            }
            None => Ok(Entry::Contact(Box::new(c))),
        }
    }

    /// An entry's safety number, whether the owner verified it, and its channels.
    async fn entry_parts(&self, e: &Entry) -> Result<(String, bool, Vec<ContactRow>)> {
        Ok(match e {
            Entry::Person(p) => {
                let signed = self.signed_channels(p).await?;
                let verified = !signed.is_empty() && signed.iter().all(|c| c.verified);
                (p.safety_number.clone(), verified, self.store().person_channels(p.id)?)
            }
            Entry::Contact(c) => {
                (self.channel(c.protocol).safety_numbers(c).0.unwrap_or_default(), c.verified, vec![(**c).clone()])
            }
        })
    }

    /// `contact merge A B`: B's channels become channels of A's person (A becomes a person if it
    /// was a contact of its own). Allowed when both show the same verified safety number, or
    /// when `confirm` repeats B's safety number (the owner compared it); refused otherwise with
    /// both numbers. A person has at most one channel per protocol.
    pub(super) async fn contact_merge(&self, a: &str, b: &str, confirm: Option<&str>) -> Result<Value> {
        let (ea, eb) = (self.entry(a).await?, self.entry(b).await?);
        let (a_number, a_verified, a_channels) = self.entry_parts(&ea).await?;
        let (b_number, b_verified, b_channels) = self.entry_parts(&eb).await?;
        if a_channels.iter().any(|x| b_channels.iter().any(|y| x.id == y.id)) {
            return Err(Error::Invalid(format!("`{a}` and `{b}` are already one contact")));
        }
        let agreed = a_verified && b_verified && same_number(&a_number, &b_number);
        if !agreed && !confirm.is_some_and(|n| same_number(n, &b_number)) {
            return Err(Error::SafetyNumberUnconfirmed { a: a.into(), a_number, b: b.into(), b_number });
        }
        for y in &b_channels {
            if y.state != ContactState::Active {
                return Err(Error::Pending(y.name.clone()));
            }
            if let Some(x) = a_channels.iter().find(|x| x.protocol == y.protocol) {
                return Err(Error::Invalid(format!(
                    "`{a}` already has a {} channel (`{}`): a person has one channel per protocol; split it off first",
                    y.protocol, x.name
                )));
            }
        }
        let mut tx = self.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        // The person kept: A's; or, for a contact of its own, B's renamed, or a new one keyed by
        // a letagents channel (the key a contact link of theirs would be signed with).
        let (person_id, person_name) = match (&ea, &eb) {
            (Entry::Person(p), _) => (p.id, p.name.clone()),
            (Entry::Contact(c), other) => {
                check_person_name(&c.name)?;
                if store::person_name_taken(&mut tx, &c.name).await? {
                    return Err(Error::ContactExists(format!("a contact named `{}` already exists", c.name)));
                }
                let id = match other {
                    Entry::Person(q) => q.id,
                    Entry::Contact(d) => {
                        let keyed = [&**c, &**d].into_iter().find(|x| x.protocol == Protocol::Letagents).ok_or_else(|| {
                            Error::Invalid(format!(
                                "a new person needs a letagents channel (its key is the one their contact link would be signed with): neither `{a}` nor `{b}` is a letagents contact; add their contact link instead"
                            ))
                        })?;
                        if let Some(p) = store::person_by_key(&mut tx, &keyed.sig_pub).await? {
                            return Err(Error::Invalid(format!(
                                "`{}` has the same identity key as person `{}`: merge into `{}` instead",
                                keyed.name, p.name, p.name
                            )));
                        }
                        let number = self.channel(keyed.protocol).safety_numbers(keyed).0.unwrap_or_default();
                        store::insert_person(&mut tx, &c.name, &keyed.sig_pub, &number, "", now_ms()).await?
                    }
                };
                // A's row gives its name to the person and takes `<name>.<protocol>`.
                let channel_name = format!("{}.{}", c.name, c.protocol.as_str());
                check_name_free(&mut tx, &channel_name).await?;
                store::rename_contact(&mut tx, c.id, &channel_name).await?;
                store::rename_person(&mut tx, id, &c.name).await?;
                store::set_contact_person(&mut tx, c.id, id).await?;
                (id, c.name.clone())
            }
        };
        for y in &b_channels {
            store::set_contact_person(&mut tx, y.id, person_id).await?;
            // A channel follows its person's name when that name is free.
            let wanted = format!("{person_name}.{}", y.protocol.as_str());
            if y.name != wanted && check_name_free(&mut tx, &wanted).await.is_ok() {
                store::rename_contact(&mut tx, y.id, &wanted).await?;
            }
        }
        if let (Entry::Person(p), Entry::Person(q)) = (&ea, &eb)
            && p.id != q.id
        {
            store::delete_person(&mut tx, q.id).await?;
        }
        tx.commit().await?;
        let person = self.store().person_by_id(person_id).await?.ok_or_else(|| Error::Bug("merged person".into()))?;
        self.person_dto(&person).await
    }

    /// `contact split PERSON PROTOCOL`: that channel leaves the person and becomes a contact of
    /// its own (same row: name, keys, rules, history). A person keeps at least one channel.
    pub(super) async fn contact_split(&self, name: &str, protocol: &str) -> Result<Value> {
        let p = self
            .store()
            .person_by_name(name)?
            .ok_or_else(|| Error::Invalid(format!("`{name}` is not a person with several channels")))?;
        let protocol = Protocol::parse(&protocol.trim().replace('_', "-")).ok_or_else(|| {
            Error::Invalid(format!("`{protocol}` is not a protocol (letagents, agent-mail, stringcup)"))
        })?;
        let channels = self.store().person_channels(p.id)?;
        let c = channels
            .iter()
            .find(|c| c.protocol == protocol)
            .ok_or_else(|| Error::Invalid(format!("`{name}` has no {protocol} channel")))?;
        if channels.len() < 2 {
            return Err(Error::Invalid(format!("{protocol} is `{name}`'s only channel: there is nothing to split")));
        }
        let mut tx = self.store().write_tx().await?;
        store::clear_contact_person(&mut tx, c.id).await?;
        tx.commit().await?;
        let split = self.store().contact_by_id(c.id)?.ok_or_else(|| Error::Bug("split contact".into()))?;
        Ok(json!({"person": self.person_dto(&p).await?, "contact": self.contact_dto(&split)}))
    }

    /// Every message with person `p`, over all channels.
    pub(super) async fn person_conversation(&self, p: &PersonRow, limit: Option<i64>) -> Result<Value> {
        let rows = self.store().person_conversation(p.id, limit.unwrap_or(500).clamp(1, 10_000)).await?;
        let mut out = Vec::new();
        for m in &rows {
            let auth = self.channel(m.protocol).sender_auth();
            let mut dto = super::message_dto(m, Some(&p.name), auth);
            // A message another channel carried names the channel it was first queued on.
            if !m.fallback_of.is_empty()
                && let Some(first) = self.store().message("out", &m.fallback_of)?
                && let Some(o) = dto.as_object_mut()
            {
                o.insert("moved_from".into(), json!(first.protocol));
            }
            out.push(dto);
        }
        self.handout_decorate(&rows, &mut out).await?;
        Ok(Value::Array(out))
    }

    /// The outbox found `row`'s channel failing (`reason`): if its message is a person's and a
    /// later channel is usable, the message goes there instead, once. Returns whether it did.
    pub(super) async fn fall_back(&self, row: &OutboxRow, reason: &str) -> Result<bool> {
        let Some(kind) = Kind::parse(&row.kind).filter(|k| matches!(k, Kind::Send | Kind::Ask | Kind::Reply)) else {
            return Ok(false);
        };
        let Some(m) = self.store().message("out", &row.message_id)? else { return Ok(false) };
        let Some(contact_id) = m.contact_id else { return Ok(false) };
        let Some(c) = self.store().contact_by_id(contact_id)? else { return Ok(false) };
        let Some(person_id) = c.person_id else { return Ok(false) };
        if self.store().fell_back_from(&m.id).await? {
            return Ok(false);
        }
        let mut channels = self.store().person_channels(person_id)?;
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
        let mut tx = self.store().write_tx().await?;
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
