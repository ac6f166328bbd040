//! Stringcup topics: create, list, add and remove members, delete, and the fan-out send (one
//! sealed message per member, queued together and posted as a batch).
//!
//! A topic lives on one relay, among identities that relay assigned: these operations go through
//! the identity of the profile's own relay, with contacts on that relay. Topics made on a relay
//! moved away from are not reached from here (a topic operation names no relay); the error says
//! so.

use serde_json::{Value, json};

use super::{Stringcup, TOPIC_BATCH_HOLD_MS, topic_path};
use crate::engine::{Error, Result, Runtime};
use crate::protocol::letagents::Kind;
use crate::protocol::stringcup::crypto;
use crate::protocol::stringcup::wire::Outgoing;
use crate::store::ContactState;
use crate::store::{self, Protocol};
use crate::transport::TransportError;
use crate::util::now_ms;

impl Stringcup {
    /// Creates a topic with these Stringcup contacts; returns its id.
    pub(in crate::engine) async fn topic_create(&self, rt: &Runtime, members: &[String]) -> Result<Value> {
        let me = self.stringcup_identity(rt).await?;
        let mut ids = Vec::new();
        for m in members {
            ids.push(self.member_id(rt, m).await?);
        }
        let topic = self.client().topic_create(&me.token, &ids).await?;
        Ok(json!({"topic": topic, "members": ids.len() + 1}))
    }

    /// The topics we belong to, owners and members named as our contacts where we know them.
    pub(in crate::engine) async fn topic_list(&self, rt: &Runtime) -> Result<Value> {
        let me = self.stringcup_identity(rt).await?;
        let mut out = Vec::new();
        for t in self.client().topics(&me.token).await?.topics {
            let owner = if t.owner_id == me.id { "me".to_owned() } else { self.name_of(rt, &t.owner_id).await? };
            out.push(json!({"topic": t.id, "owner": owner, "members": t.member_count}));
        }
        Ok(Value::Array(out))
    }

    /// Adds Stringcup contacts to a topic we own.
    pub(in crate::engine) async fn topic_add(&self, rt: &Runtime, topic: &str, members: &[String]) -> Result<Value> {
        let topic = topic_path(topic)?;
        let me = self.stringcup_identity(rt).await?;
        let mut ids = Vec::new();
        for m in members {
            ids.push(self.member_id(rt, m).await?);
        }
        let r = match self.client().topic_add(&me.token, topic, &ids).await {
            Ok(r) => r,
            Err(e) => return Err(self.topic_error(rt, topic, e).await),
        };
        Ok(
            json!({"topic": topic, "added": r.added.len(), "already_member": r.already_member.len(), "unknown": r.unknown}),
        )
    }

    /// Removes a contact from a topic we own, or (no member) leaves the topic.
    pub(in crate::engine) async fn topic_remove(
        &self,
        rt: &Runtime,
        topic: &str,
        member: Option<&str>,
    ) -> Result<Value> {
        let topic = topic_path(topic)?;
        let me = self.stringcup_identity(rt).await?;
        let id = match member {
            Some(m) => self.member_id(rt, m).await?,
            None => me.id.clone(),
        };
        if let Err(e) = self.client().topic_remove(&me.token, topic, &id).await {
            return Err(self.topic_error(rt, topic, e).await);
        }
        Ok(json!({"topic": topic, "removed": member.unwrap_or("me")}))
    }

    /// Deletes a topic we own.
    pub(in crate::engine) async fn topic_delete(&self, rt: &Runtime, topic: &str) -> Result<Value> {
        let topic = topic_path(topic)?;
        let me = self.stringcup_identity(rt).await?;
        if let Err(e) = self.client().topic_delete(&me.token, topic).await {
            return Err(self.topic_error(rt, topic, e).await);
        }
        Ok(json!({"topic": topic, "deleted": true}))
    }

    /// The Stringcup id of contact `name`, who must live on our own relay (a topic's members are
    /// identities of the relay it lives on).
    async fn member_id(&self, rt: &Runtime, name: &str) -> Result<String> {
        let c = rt.store().contact_by_name(name)?.ok_or_else(|| Error::UnknownContact(name.to_owned()))?;
        if c.protocol != Protocol::Stringcup {
            return Err(Error::Invalid(format!("`{name}` is not a Stringcup contact")));
        }
        if let Some(relay) = &c.relay_url {
            return Err(Error::Invalid(format!(
                "`{name}` lives on the relay at {relay}, which this profile moved away from: a topic lives on one \
                 relay, and topics here are on the relay at {}",
                rt.relay_url()
            )));
        }
        Ok(c.peer_id)
    }

    /// A topic request's failure: a topic the own relay does not know may be one made on a relay
    /// moved away from, which these operations do not reach.
    async fn topic_error(&self, rt: &Runtime, topic: &str, e: TransportError) -> Error {
        if matches!(e, TransportError::Status { status: 404, .. })
            && let Ok(kept) = self.kept_in_use(rt).await
            && !kept.is_empty()
        {
            let relays: Vec<&str> = kept.iter().map(|k| k.relay.as_str()).collect();
            return Error::Invalid(format!(
                "the relay at {} knows no topic {topic}; a topic made on a relay this profile moved away from ({}) is \
                 not reached from here",
                rt.relay_url(),
                relays.join(", ")
            ));
        }
        e.into()
    }

    /// Our contact's name for Stringcup id `id`, else the id.
    async fn name_of(&self, rt: &Runtime, id: &str) -> Result<String> {
        let mut conn = rt.store().pool.acquire().await?;
        Ok(store::contact_by_peer(&mut conn, Protocol::Stringcup, id).await?.map_or_else(|| id.to_owned(), |c| c.name))
    }

    /// Sends `text` to every member of `topic` we have pinned, in one batch request. Members with
    /// no pin or a different key are skipped and reported.
    pub(in crate::engine) async fn topic_send(&self, rt: &Runtime, topic: &str, text: &str) -> Result<Value> {
        let topic = topic_path(topic)?;
        let me = self.stringcup_identity(rt).await?;
        let roster = match self.client().topic_roster(&me.token, topic).await {
            Ok(r) => r,
            Err(e) => return Err(self.topic_error(rt, topic, e).await),
        };
        let mut skipped = Vec::new();
        let mut targets = Vec::new();
        for m in roster.members.iter().filter(|m| m.id != me.id) {
            let mut conn = rt.store().pool.acquire().await?;
            let c = store::contact_by_peer(&mut conn, Protocol::Stringcup, &m.id).await?;
            let served = crypto::decode_public_key(&m.identity_public_key);
            // Only a contact of this relay (an id elsewhere is another identity).
            let c = c.filter(|c| c.relay_url.is_none());
            match c {
                Some(c) if c.blocked => skipped.push(json!({"id": m.id, "reason": "blocked"})),
                Some(c)
                    if c.state == ContactState::Active
                        && c.changed_box_pub.is_none()
                        && served.is_some_and(|k| k.as_slice() == c.box_pub.as_slice()) =>
                {
                    targets.push(c)
                }
                Some(c) if served.is_some_and(|k| k.as_slice() != c.box_pub.as_slice()) => {
                    skipped.push(json!({"id": m.id, "reason": "key differs from the pinned one"}))
                }
                Some(_) => skipped.push(json!({"id": m.id, "reason": "contact not active"})),
                None => skipped.push(json!({"id": m.id, "reason": "not a contact (no pinned key)"})),
            }
        }
        // The batch is the first attempt. The entries are queued (so nothing is lost if we stop
        // here) but held from the outbox worker until the batch has answered: the batch carries
        // no Idempotency-Key (B.3.1), so a worker posting the same payload meanwhile would make
        // the relay store it twice. What the batch did not store is released to the worker,
        // which retries each entry with its own key. A crash after the relay stored the batch and
        // before `outbox_sent` commits can still deliver one entry twice, after the hold.
        let now = now_ms();
        let mut tx = rt.store().write_tx().await?;
        let mut queued = Vec::new();
        for c in &targets {
            let id = Self::seal_and_queue(&mut tx, &me, c, Kind::Send, text, (None, None, None), now).await?;
            store::outbox_hold(&mut tx, &id, now + TOPIC_BATCH_HOLD_MS).await?;
            queued.push(id);
        }
        tx.commit().await?;
        let mut rows = Vec::new();
        for id in &queued {
            rows.extend(rt.store().outbox_row(id, Protocol::Stringcup).await?);
        }
        let entries: Vec<Outgoing> = rows.iter().filter_map(|r| serde_json::from_slice(&r.payload).ok()).collect();
        let mut sent = 0;
        if !entries.is_empty() && entries.len() == rows.len() {
            match self.client().batch(&me.token, &entries).await {
                Ok(result) => {
                    for s in result.sent {
                        if let Some(row) = rows.get(s.index) {
                            rt.store().outbox_sent(row, now_ms()).await?;
                            sent += 1;
                        }
                    }
                }
                Err(e) => tracing::info!("topic batch: {e}; the outbox sends each message on its own"),
            }
        }
        rt.store().outbox_release(&queued, now_ms()).await?;
        rt.inner.outbox_wake.notify_one();
        Ok(json!({"topic": topic, "sent": sent, "queued": queued.len() - sent, "messages": queued, "skipped": skipped}))
    }
}
