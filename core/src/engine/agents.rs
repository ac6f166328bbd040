//! Who is calling, and what each caller may do. The owner (the person: the CLI, the UI, scripts
//! holding the profile's 0600 bridge token) may do everything. An agent session holds a token
//! bound to one agent name: it gets the messaging operations, always as itself, under the delivery
//! policy (loop guard, review); everything that changes trust (contacts, rules, review decisions,
//! policy) stays with the owner, so a peer cannot talk an agent into it.
//!
//! - Session: the owner opens it (`SessionOpen`); only SHA-256 of the token is stored; the bridge
//!   clears all tokens when a runtime starts serving.
//! - Agent send: `from_agent` comes from the session, never from the request; the loop guard may
//!   refuse it; review mode holds it in the approval queue instead of sending.
//! - Owner send: operator input, which resets the conversation's loop guard.
//! - Do-not-disturb is the owner's switch too: an agent session cannot wake itself through it.

// serde_json::Value indexing returns Null for missing keys; it cannot panic.
#![allow(clippy::indexing_slicing)]

use serde_json::{Value, json};

use super::delivery::label_value;
use super::dispatch::{OwnerSend, send_kind};
use super::{Error, Result, Runtime};
use crate::api::Request;
use crate::identity::random_token;
use crate::store::ContactRow;
use crate::store::ContactState;
use crate::util::{now_ms, sha256};

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The profile's owner.
    Owner,
    /// A local agent session, by agent name.
    Agent(String),
}

fn op_name(req: &Request) -> String {
    serde_json::to_value(req).ok().and_then(|v| v["op"].as_str().map(str::to_owned)).unwrap_or_default()
}

impl Caller {
    /// The agent session's name; `None` for the owner.
    pub fn agent(&self) -> Option<&str> {
        match self {
            Self::Owner => None,
            Self::Agent(me) => Some(me),
        }
    }

    /// The caller check: `req` as this caller may make it, or why not. The owner may make every
    /// request. An agent session may make the messaging requests, always as itself: a field
    /// naming an agent must be empty or its own name and is set to it; a letmeknow `handle` is
    /// set to its name (the session is its own group member). Everything that changes trust
    /// (contacts, rules, review decisions, policy, group policy, the ASNET account) is refused.
    pub(super) fn admit(&self, req: Request) -> Result<Request> {
        let Self::Agent(me) = self else { return Ok(req) };
        let own = |named: Option<String>| match named {
            Some(other) if other != *me => {
                Err(Error::Forbidden(format!("this session is agent `{me}`; it cannot act as `{other}`")))
            }
            _ => Ok(Some(me.clone())),
        };
        let me_handle = || Some(me.clone());
        Ok(match req {
            Request::Whoami
            | Request::Status
            | Request::ContactList
            | Request::ContactRequests
            | Request::List { .. }
            | Request::MailAttachment { .. }
            | Request::Ack { .. }
            | Request::GroupInviteWait { .. } => req,
            Request::Send { contact, text, kind, reply_to, from_agent, to_agent } => {
                Request::Send { contact, text, kind, reply_to, from_agent: own(from_agent)?, to_agent }
            }
            Request::Read { agent, id, ancestors } => Request::Read { agent: own(agent)?, id, ancestors },
            Request::Wait { agent, timeout_secs, paused_seen } => {
                Request::Wait { agent: own(agent)?, timeout_secs, paused_seen }
            }
            Request::Unread { agent } => Request::Unread { agent: own(agent)? },
            Request::GroupSession { handle: _, name } => Request::GroupSession { handle: me_handle(), name },
            Request::GroupInvite { handle: _, group, ttl_secs } => {
                Request::GroupInvite { handle: me_handle(), group, ttl_secs }
            }
            Request::GroupJoin { handle: _, link, timeout_secs } => {
                Request::GroupJoin { handle: me_handle(), link, timeout_secs }
            }
            Request::GroupList { handle: _ } => Request::GroupList { handle: me_handle() },
            Request::GroupSend { handle: _, group, text, to, reply_to } => {
                Request::GroupSend { handle: me_handle(), group, text, to, reply_to }
            }
            Request::GroupRead { handle: _, id, ancestors } => {
                Request::GroupRead { handle: me_handle(), id, ancestors }
            }
            Request::GroupMembers { handle: _, group } => Request::GroupMembers { handle: me_handle(), group },
            Request::GroupLeave { handle: _, group } => Request::GroupLeave { handle: me_handle(), group },
            Request::GroupHistory { handle: _, group, before, limit, mark_read } => {
                Request::GroupHistory { handle: me_handle(), group, before, limit, mark_read }
            }
            Request::GroupDeliveries { handle: _, wait_secs } => {
                Request::GroupDeliveries { handle: me_handle(), wait_secs }
            }
            // ASNET/1: what an agent asks for goes out as the agent's and waits for the owner's
            // approval of its challenge; the account itself is the owner's.
            Request::AsnetSetup { .. } | Request::AsnetRegister { .. } => {
                return Err(Error::Forbidden(
                    "an agent may not set up or register the ASNET account: that is your operator's decision".into(),
                ));
            }
            Request::AsnetLookup { .. }
            | Request::AsnetConnect { .. }
            | Request::AsnetAccept { .. }
            | Request::AsnetConnections
            | Request::AsnetDisconnect { .. }
            | Request::AsnetStatus => req,
            other => {
                return Err(Error::Forbidden(format!(
                    "agent sessions may not `{}`: that is your operator's decision",
                    op_name(&other)
                )));
            }
        })
    }
}

/// A contact as an agent sees it: local facts, and peer claims reduced to safe names.
fn agent_contact_dto(rt: &Runtime, c: &ContactRow) -> Value {
    let full = rt.contact_dto(c);
    let roster: Vec<Value> = full["roster"]
        .as_array()
        .map(|r| {
            r.iter()
                .take(64)
                .map(|e| {
                    json!({
                        "name": label_value(e["name"].as_str().unwrap_or("")),
                        "harness": label_value(e["harness"].as_str().unwrap_or("")),
                        "status": label_value(e["status"].as_str().unwrap_or("")),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "name": c.name,
        "protocol": c.protocol,
        "fingerprint": full["safety_number"],
        "verified": c.verified,
        "state": c.state,
        "allow": full["allow"],
        "key_changed": full["key_changed"],
        "sender_auth": full["sender_auth"],
        "blocked": c.blocked,
        "roster_claimed_by_peer": roster,
    })
}

impl Runtime {
    /// Opens an agent session for `agent` (registering it if new): a bearer token bound to it.
    pub(super) async fn session_open(&self, agent: &str, harness: Option<&str>, one_shot: bool) -> Result<Value> {
        let harness = harness.unwrap_or("mcp");
        self.agent_register(agent, harness).await?;
        if one_shot {
            self.flush_once(true).await?;
        }
        self.ensure_floor(agent).await?;
        let token = random_token();
        self.store().insert_agent_token(sha256(token.as_bytes()).as_slice(), agent, harness, now_ms()).await?;
        Ok(json!({"agent": agent, "token": token}))
    }

    /// The agent a queue request names: required, and registered.
    pub(super) async fn named_agent(&self, agent: Option<String>) -> Result<String> {
        let agent = agent.ok_or_else(|| Error::Invalid("name the agent".into()))?;
        self.require_agent(&agent).await?;
        Ok(agent)
    }

    /// `whoami`; an agent session also learns which agent it is.
    pub(super) async fn whoami_for(&self, agent: Option<&str>) -> Result<Value> {
        let mut v = self.whoami().await?;
        if let (Some(me), Some(o)) = (agent, v.as_object_mut()) {
            o.insert("agent".into(), Value::String(me.to_owned()));
        }
        Ok(v)
    }

    /// The contacts (`pending`: the requests). The owner sees everything; an agent session sees
    /// local facts and the peer's claims reduced to safe names.
    pub(super) async fn contacts_for(&self, agent: Option<&str>, pending: bool, one_shot: bool) -> Result<Value> {
        if one_shot {
            self.sync_best_effort().await;
        }
        if agent.is_none() && !pending {
            return self.contact_list().await;
        }
        let rows = self.store().contacts(if pending { Some(ContactState::Pending) } else { None }).await?;
        Ok(Value::Array(
            rows.iter()
                .map(|c| if agent.is_some() { agent_contact_dto(self, c) } else { self.contact_dto(c) })
                .collect(),
        ))
    }

    /// The owner's choice of review for one conversation's agent sends.
    /// Without `mode`, reads it (`default`: the profile's policy applies).
    pub(super) async fn contact_review(&self, name: &str, mode: Option<&str>) -> Result<Value> {
        let c = self.contact(name).await?;
        let Some(mode) = mode else {
            let mode = self.store().conversation_outbound(c.id).await?.unwrap_or_else(|| "default".into());
            return Ok(json!({"contact": name, "outbound": mode}));
        };
        if !matches!(mode, "auto" | "review" | "default") {
            return Err(Error::Invalid("mode must be auto, review or default".into()));
        }
        self.store().set_conversation_outbound(c.id, mode).await?;
        Ok(json!({"contact": name, "outbound": mode}))
    }

    /// The owner resumes a conversation the loop guard paused (operator input).
    pub(super) async fn resume(&self, contact: &str) -> Result<Value> {
        let c = self.contact(contact).await?;
        let released = self.operator_input(c.id).await?;
        Ok(json!({"contact": contact, "resumed": true, "released": released}))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn agent_send(
        &self,
        me: &str,
        contact: &str,
        text: String,
        kind: Option<&str>,
        reply_to: Option<String>,
        to_agent: Option<String>,
        one_shot: bool,
    ) -> Result<Value> {
        let k = send_kind(kind, reply_to.as_deref())?;
        let c = self.contact(contact).await?;
        let policy = self.policy()?;
        let hops = self.hops(c.id, i64::MAX).await?;
        if hops >= policy.loop_limit {
            return Err(Error::LoopGuard(format!(
                "loop guard: {hops} agent-to-agent messages with `{contact}` since your operator last took part \
                 (limit {}); this conversation is paused until your operator runs `switchboard resume {contact}`",
                policy.loop_limit
            )));
        }
        let outbound = self.store().conversation_outbound(c.id).await?;
        let review = match outbound.as_deref() {
            Some("review") => true,
            Some("auto") => false,
            _ => policy.review,
        };
        if review {
            if c.state != ContactState::Active {
                return Err(Error::Pending(contact.into()));
            }
            let id = self
                .store()
                .hold_send(me, c.id, k.as_str(), &text, reply_to.as_deref(), to_agent.as_deref(), now_ms())
                .await?;
            return Ok(json!({
                "id": Value::Null,
                "review_id": id,
                "state": "held_for_review",
                "detail": format!("held until your operator approves it (switchboard review approve {id})"),
            }));
        }
        let out = OwnerSend { kind: k, reply_to, from_agent: Some(me.into()), to_agent };
        self.send_text(contact, text, out, one_shot).await
    }

    /// Adds `handout: {agent, state}` to each incoming message view addressed to a local agent:
    /// whether that agent has been handed it yet. An agent's queue is classified when it asks,
    /// so a message it has not asked for since is `queued` (waiting); then handed, delivered
    /// (acknowledged), paused (loop guard) or skipped. `views` are the DTOs of `rows`, in order.
    pub(super) async fn handout_decorate(&self, rows: &[crate::store::MessageRow], views: &mut [Value]) -> Result<()> {
        let addressed: Vec<i64> =
            rows.iter().filter(|m| m.direction == "in" && m.to_agent.is_some()).map(|m| m.rowid_).collect();
        if addressed.is_empty() {
            return Ok(());
        }
        let found = self.store().handouts(&addressed).await?;
        let locals = self.store().agents().await?;
        for (m, view) in rows.iter().zip(views.iter_mut()) {
            let Some(to) = m.to_agent.as_deref().filter(|_| m.direction == "in") else { continue };
            let handout = match found.iter().find(|h| h.message == m.rowid_ && super::delivery::names(to, &h.agent)) {
                Some(h) => json!({"agent": h.agent, "state": h.state, "delivered_at": h.delivered_at}),
                None => match locals.iter().find(|a| super::delivery::names(to, &a.name)) {
                    Some(a) => json!({"agent": a.name, "state": "queued", "delivered_at": 0}),
                    // No local agent by that name: nobody here will pick it up.
                    None => continue,
                },
            };
            if let Some(o) = view.as_object_mut() {
                o.insert("handout".into(), handout);
            }
        }
        Ok(())
    }

    pub(super) async fn review_list(&self) -> Result<Value> {
        // A held message is for a contact (1:1) or for a letmeknow group (`group`, `to`).
        let rows = self.store().pending_reviews().await?;
        Ok(Value::Array(
            rows.iter()
                .map(|r| {
                    json!({
                        "id": r.id,
                        "agent": r.agent,
                        "contact": r.contact,
                        "group": r.group_id,
                        "to": r.to_fp,
                        "kind": r.kind,
                        "text": r.body,
                        "reply_to": r.reply_to,
                        "to_agent": r.to_agent,
                        "created_at": r.created_at,
                        // An ASNET challenge: approving sends VERIFY for exactly this action.
                        "asnet": r.challenge_id.as_ref().map(|id| json!({
                            "challenge_id": id,
                            "action": serde_json::from_str::<Value>(&r.body).unwrap_or(Value::Null),
                            "expires_at": r.expires_at,
                        })),
                    })
                })
                .collect(),
        ))
    }

    /// The owner approves review item `id`: an ASNET challenge is answered, a held message goes
    /// out (a one-shot runtime sends it before answering).
    /// The owner approves review item `id`; with `text`, the operator's edit is sent instead of
    /// what the agent wrote (an ASNET challenge is confirmed exactly as asked, never edited).
    pub(super) async fn review_approve(&self, id: i64, text: Option<String>, one_shot: bool) -> Result<Value> {
        if let Some(ch) = self.store().asnet_challenge_of_review(id).await? {
            if text.is_some() {
                return Err(Error::Invalid("an ASNET challenge is approved as asked, not edited".into()));
            }
            return self.asnet_approve(id, ch).await;
        }
        if let Some(text) = text {
            // The operator's edit replaces what the agent wrote, before anything is sent.
            if text.trim().is_empty() {
                return Err(Error::Invalid("the edited text is empty: reject the message instead".into()));
            }
            if !self.store().edit_review(id, &text).await? {
                return Err(Error::Invalid(format!("no pending review {id}")));
            }
        }
        let v = self.release_held(id).await?;
        if one_shot {
            self.flush_once(true).await?;
        }
        Ok(v)
    }

    /// The owner rejects review item `id` (an ASNET challenge goes unanswered).
    pub(super) async fn review_reject(&self, id: i64) -> Result<Value> {
        if let Some(ch) = self.store().asnet_challenge_of_review(id).await? {
            return self.asnet_reject(id, ch).await;
        }
        self.review_decide(id, "rejected", None).await
    }

    async fn release_held(&self, id: i64) -> Result<Value> {
        if let Some(g) = self.store().held_group_send(id).await? {
            // A group send: sent as the session that wrote it; approving is operator input.
            let (handle, gid) = (g.agent, g.group_id);
            let sent = self.lmk_send(&handle, &gid, &g.body, g.to_fp.as_deref(), g.reply_to.as_deref()).await?;
            self.lmk_operator_input(&handle, &gid).await?;
            let decided = self.review_decide(id, "approved", sent["id"].as_str()).await?;
            let mut v = sent;
            if let (Some(o), Value::Object(d)) = (v.as_object_mut(), decided) {
                o.extend(d);
            }
            return Ok(v);
        }
        let row = self.store().held_send(id).await?.ok_or_else(|| Error::Invalid(format!("no pending review {id}")))?;
        let k = send_kind(Some(&row.kind), row.reply_to.as_deref())?;
        let msg = self
            .send(
                &row.contact,
                k,
                Value::String(row.body),
                row.reply_to.as_deref(),
                Some(&row.agent),
                row.to_agent.as_deref(),
            )
            .await?;
        self.operator_input(row.contact_id).await?;
        self.review_decide(id, "approved", Some(&msg)).await?;
        self.message_view(&msg).await
    }

    async fn review_decide(&self, id: i64, state: &str, message_id: Option<&str>) -> Result<Value> {
        if !self.store().decide_review(id, state, message_id, now_ms()).await? {
            return Err(Error::Invalid(format!("no pending review {id}")));
        }
        Ok(json!({"review_id": id, "state": state, "message_id": message_id}))
    }

    pub(super) async fn set_policy(
        &self,
        review: Option<String>,
        loop_limit: Option<u32>,
        digest: Option<u64>,
    ) -> Result<Value> {
        if let Some(r) = review {
            if !matches!(r.as_str(), "auto" | "review") {
                return Err(Error::Invalid("review must be auto or review".into()));
            }
            self.store().set_meta("policy_review", &r).await?;
        }
        if let Some(n) = loop_limit {
            if n == 0 {
                return Err(Error::Invalid("the loop limit must be at least 1".into()));
            }
            self.store().set_meta("policy_loop_limit", &n.to_string()).await?;
        }
        if let Some(d) = digest {
            self.store().set_meta("policy_digest_secs", &d.min(86_400).to_string()).await?;
        }
        let p = self.policy()?;
        Ok(json!({
            "review": if p.review { "review" } else { "auto" },
            "loop_limit": p.loop_limit,
            "digest_secs": p.digest_ms / 1000,
        }))
    }

    /// The agent a session token belongs to, if it is one.
    pub async fn agent_for_token(&self, token: &str) -> Result<Option<String>> {
        if token.is_empty() {
            return Ok(None);
        }
        Ok(self.store().agent_for_token_hash(sha256(token.as_bytes()).as_slice()).await?)
    }

    /// Ends the session holding `token`; an agent left without sessions shows as offline.
    pub async fn close_session(&self, token: &str) -> Result<Value> {
        let hash = sha256(token.as_bytes());
        let agent = self.store().delete_agent_token(hash.as_slice()).await?;
        if let Some(a) = &agent {
            self.store().offline_unless_session(a, now_ms()).await?;
        }
        Ok(json!({"closed": agent}))
    }

    /// Forgets every agent session token (a runtime starting to serve: sessions of an earlier
    /// runtime must open again).
    pub async fn revoke_agent_tokens(&self) -> Result<()> {
        Ok(self.store().delete_agent_tokens().await?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn coder() -> Caller {
        Caller::Agent("coder".into())
    }

    fn code(r: Result<Request>) -> &'static str {
        r.map(|_| "ok").unwrap_or_else(|e| e.code())
    }

    #[test]
    fn the_owner_may_make_every_request_unchanged() {
        for req in [
            Request::ContactAccept { name: "bob".into(), new_name: None },
            Request::ReviewApprove { id: 1, text: None },
            Request::Read { agent: Some("reviewer".into()), id: None, ancestors: None },
            Request::GroupMode { handle: Some("h".into()), group: "g".into(), mode: "review".into() },
        ] {
            let before = serde_json::to_value(&req).unwrap();
            assert_eq!(serde_json::to_value(Caller::Owner.admit(req).unwrap()).unwrap(), before);
        }
    }

    #[test]
    fn an_agent_acts_only_as_itself() {
        let read = coder().admit(Request::Read { agent: None, id: None, ancestors: None }).unwrap();
        assert!(matches!(read, Request::Read { agent: Some(a), .. } if a == "coder"));
        let send = Request::Send {
            contact: "bob".into(),
            text: "hi".into(),
            kind: None,
            reply_to: None,
            from_agent: None,
            to_agent: None,
        };
        assert!(matches!(coder().admit(send).unwrap(), Request::Send { from_agent: Some(a), .. } if a == "coder"));
        for other in [
            Request::Read { agent: Some("reviewer".into()), id: None, ancestors: None },
            Request::Wait { agent: Some("reviewer".into()), timeout_secs: 1, paused_seen: None },
            Request::Unread { agent: Some("reviewer".into()) },
        ] {
            assert_eq!(code(coder().admit(other)), "forbidden");
        }
        // A group handle is the session's own name, whatever the request said.
        let join =
            coder().admit(Request::GroupJoin { handle: Some("owner".into()), link: "l".into(), timeout_secs: None });
        assert!(matches!(join.unwrap(), Request::GroupJoin { handle: Some(h), .. } if h == "coder"));
    }

    #[test]
    fn trust_decisions_stay_with_the_owner() {
        for req in [
            Request::ContactAdd { address: "a".into(), name: None, allow: None, relay: None, no_hello: false },
            Request::ContactAccept { name: "bob".into(), new_name: None },
            Request::ContactVerify { name: "bob".into() },
            Request::ReviewApprove { id: 1, text: None },
            Request::Policy { review: Some("auto".into()), loop_limit: None, digest_secs: None },
            Request::Resume { contact: "bob".into() },
            Request::Dnd { on: Some(false) },
            Request::SessionOpen { agent: "other".into(), harness: None },
            Request::GroupMode { handle: None, group: "g".into(), mode: "auto".into() },
            Request::GroupCreate { name: "x".into() },
            Request::GroupRemove { handle: None, group: "g".into(), fingerprint: "f".into() },
            Request::AsnetRegister { discovery: None },
            Request::RelayMove { url: "https://elsewhere.example".into(), cert_sha256: None },
        ] {
            let op = op_name(&req);
            assert_eq!(code(coder().admit(req)), "forbidden", "{op}");
        }
        assert_eq!(code(coder().admit(Request::AsnetLookup { member_id: "mem_x".into() })), "ok");
    }
}
