//! Contacts as the owner manages them: looking one up by name (a person's name stands for its
//! first channel), the DTO clients see, adding (through the channel whose address form
//! matches), accepting, denying, blocking, verifying safety numbers, allow lists and rules.

use serde_json::{Value, json};

use super::channels::ContactAdd;
use super::{Error, Result, Runtime, kinds_to_string};
use crate::store::ContactState;
use crate::store::{self, ContactRow};
use crate::util::now_ms;

impl Runtime {
    pub(super) async fn contact(&self, name: &str) -> Result<ContactRow> {
        if let Some(c) = self.store().contact_by_name(name)? {
            return Ok(c);
        }
        // A person's name stands for the channel a message to them goes on first.
        match self.store().person_by_name(name)? {
            Some(p) => self.person_first_channel(&p).await,
            None => Err(Error::UnknownContact(name.into())),
        }
    }

    /// A contact as clients see it.
    pub(super) fn contact_dto(&self, c: &ContactRow) -> Value {
        let (safety, new_safety) = self.channel(c.protocol).safety_numbers(c);
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
            "sender_auth": self.channel(c.protocol).sender_auth().as_str(),
            "blocked": c.blocked,
            "blocked_dropped": c.blocked_dropped,
            "nearby": self.inner.lan.is_nearby(c.id),
        })
    }

    pub(super) async fn contact_add(&self, req: ContactAdd<'_>) -> Result<Value> {
        let address = req.address.trim();
        let channel = self.channel(self.protocol_of_address(address));
        let name = channel.add_contact(self, ContactAdd { address, ..req }).await?;
        Ok(self.contact_dto(&self.contact(&name).await?))
    }

    /// Accepts a pending request, under `new_name` if given (refused if a contact or person
    /// already has it).
    pub(super) async fn contact_accept(&self, name: &str, new_name: Option<&str>) -> Result<Value> {
        let c = self.contact(name).await?;
        if c.blocked {
            return Err(Error::Blocked(name.into()));
        }
        if c.state != ContactState::Pending {
            return Err(Error::Invalid(format!("`{name}` is not a pending request")));
        }
        let new_name = new_name.map(str::trim).filter(|n| *n != c.name);
        let mut tx = self.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(n) = new_name {
            super::people::check_name_free(&mut tx, n).await?;
        }
        let accept = store::ContactUpdate { state: Some(ContactState::Active), name: new_name, ..Default::default() };
        store::update_contact(&mut tx, c.id, &accept).await?;
        // Messages that arrived with the request (Stringcup has no hello) are shown now.
        store::release_held(&mut tx, c.id).await?;
        tx.commit().await?;
        Ok(self.contact_dto(&self.contact(new_name.unwrap_or(name)).await?))
    }

    /// Denies a pending request: the peer is blocked (not forgotten), so it cannot ask again
    /// until the owner unblocks it.
    pub(super) async fn contact_deny(&self, name: &str) -> Result<Value> {
        let c = self.contact(name).await?;
        if c.state != ContactState::Pending || c.blocked {
            return Err(Error::Invalid(format!("`{name}` is not a pending request")));
        }
        let mut v = self.contact_block(name, true).await?;
        if let Some(o) = v.as_object_mut() {
            o.insert("denied".into(), json!(name));
        }
        Ok(v)
    }

    /// Blocks or unblocks a contact of any protocol: locally first (what it sends is dropped
    /// before any agent sees it), then, for Agent Mail, at our relay too (§7.4), so that the
    /// relay stops accepting its packets. The local block holds even when the relay cannot be
    /// told; the answer says whether it was (`relay`).
    pub(super) async fn contact_block(&self, name: &str, blocked: bool) -> Result<Value> {
        let c = self.contact(name).await?;
        let mut tx = self.store().pool.begin_with("BEGIN IMMEDIATE").await?;
        store::set_blocked(&mut tx, c.id, blocked, now_ms()).await?;
        let audit = store::Audit {
            direction: "out",
            protocol: c.protocol.as_str(),
            peer: &c.peer_id,
            message_id: "",
            kind: "",
            state: if blocked { "blocked" } else { "unblocked" },
            detail: if blocked { "the owner blocked this contact" } else { "the owner unblocked this contact" },
        };
        store::audit(&mut tx, now_ms(), audit).await?;
        tx.commit().await?;
        let relay = match self.channel(c.protocol).block_at_relay(self, &c.peer_id, blocked) {
            Some(tell) => match tell.await {
                Ok(()) => json!({"told": true}),
                Err(e) => {
                    tracing::warn!("{}: the relay was not told about {name}'s block: {e}", c.protocol);
                    json!({"told": false, "error": e.to_string()})
                }
            },
            None => Value::Null,
        };
        let mut v = self.contact_dto(&self.contact(name).await?);
        if let Some(o) = v.as_object_mut() {
            o.insert("relay_block".into(), relay);
        }
        Ok(v)
    }

    pub(super) async fn contact_verify(&self, name: &str) -> Result<Value> {
        let c = self.contact(name).await?;
        let mut tx = self.store().write_tx().await?;
        if let Some(new_box) = &c.changed_box_pub {
            let address = self.channel(c.protocol).address_with_box(&c, new_box)?;
            let adopt = store::ContactUpdate {
                box_pub: Some(new_box),
                changed_box_pub: Some(None),
                key_changed_at: Some(None),
                address: Some(&address),
                ..Default::default()
            };
            store::update_contact(&mut tx, c.id, &adopt).await?;
        }
        store::update_contact(&mut tx, c.id, &store::ContactUpdate { verified: Some(true), ..Default::default() })
            .await?;
        tx.commit().await?;
        Ok(self.contact_dto(&self.contact(name).await?))
    }

    pub(super) async fn contact_allow(&self, name: &str, kinds: &[String]) -> Result<Value> {
        let c = self.contact(name).await?;
        let allow = kinds_to_string(kinds)?;
        self.store()
            .update_contact(c.id, &store::ContactUpdate { allow_kinds: Some(&allow), ..Default::default() })
            .await?;
        Ok(self.contact_dto(&self.contact(name).await?))
    }

    pub(super) async fn contact_rule(&self, name: &str, from: &str, to: &str, action: &str) -> Result<Value> {
        let c = self.contact(name).await?;
        if !matches!(action, "allow" | "deny") {
            return Err(Error::Invalid("rule action must be allow or deny".into()));
        }
        for g in [from, to] {
            if g.is_empty() || g.trim_end_matches('*').contains('*') {
                return Err(Error::Invalid(format!("`{g}` is not a glob (`*`, `prefix*` or a name)")));
            }
        }
        let rules = self.store().add_rule(c.id, from, to, action).await?;
        Ok(
            json!({"name": name, "rules": rules.iter().map(|(f, t, a)| json!({"from": f, "to": t, "action": a})).collect::<Vec<_>>()}),
        )
    }
}
