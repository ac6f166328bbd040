//! Where every request enters the runtime, in two steps:
//!
//! 1. the caller check, [`Caller::admit`] (`agents`): the owner may do everything; an agent
//!    session gets the messaging operations, always as itself (the fields naming an agent or a
//!    group handle are set to its name), and is refused the rest;
//! 2. the one match over [`Request`] below: one arm per operation, each a call into the part
//!    that owns it (a channel, `groups`, `agents`, `asnet`, …). Where owner and agent differ
//!    (an agent's send goes through the delivery policy, the owner's is operator input), the arm
//!    says so by the caller.
//!
//! `one_shot` runtimes (a CLI command without a daemon) send what they queued before answering.

use serde_json::{Value, json};

use super::agents::Caller;
use super::channels::{self, ContactAdd};
use super::{Error, Result, Runtime, people};
use crate::api::Request;
use crate::protocol::letagents::Kind;

impl Runtime {
    /// Handles one request from the owner.
    pub async fn handle(&self, req: Request, one_shot: bool) -> Result<Value> {
        self.handle_as(&Caller::Owner, req, one_shot).await
    }

    /// Handles one request from `caller`: the caller check, then the one match.
    pub async fn handle_as(&self, caller: &Caller, req: Request, one_shot: bool) -> Result<Value> {
        let req = caller.admit(req)?;
        let agent = caller.agent();
        match req {
            Request::Whoami => self.whoami_for(agent).await,
            Request::Status => self.status().await,
            Request::Lan { on } => self.lan_request(on).await,

            // Contacts and people.
            Request::ContactAdd { address, name, allow, relay: _, no_hello } if people::looks_like_link(&address) => {
                let v = self.person_add(&address, name.as_deref(), allow.as_deref(), !no_hello).await?;
                self.flushed(one_shot, v).await
            }
            Request::ContactAdd { address, name, allow, relay, no_hello } => {
                let add = ContactAdd {
                    address: &address,
                    name: name.as_deref(),
                    allow: allow.as_deref(),
                    relay: relay.as_deref(),
                    hello: !no_hello,
                };
                let v = self.contact_add(add).await?;
                self.flushed(one_shot, v).await
            }
            Request::ContactList => self.contacts_for(agent, false, one_shot).await,
            Request::ContactRequests => self.contacts_for(agent, true, one_shot).await,
            Request::ContactAccept { name, new_name } => self.contact_accept(&name, new_name.as_deref()).await,
            Request::ContactDeny { name } => self.contact_deny(&name).await,
            // A person's name stands for every channel (verify: those its identity signed).
            Request::ContactBlock { name } => self.block_contact_or_person(&name, true).await,
            Request::ContactUnblock { name } => self.block_contact_or_person(&name, false).await,
            Request::ContactVerify { name } => self.verify_contact_or_person(&name).await,
            Request::ContactMerge { name, other, confirm_safety_number } => {
                self.contact_merge(&name, &other, confirm_safety_number.as_deref()).await
            }
            Request::ContactSplit { name, protocol } => self.contact_split(&name, &protocol).await,
            Request::ContactAllow { name, kinds } => self.contact_allow(&name, &kinds).await,
            Request::ContactRule { name, from, to, action } => self.contact_rule(&name, &from, &to, &action).await,
            Request::ContactReview { name, mode } => self.contact_review(&name, mode.as_deref()).await,

            // Messages.
            Request::Send { contact, text, kind, reply_to, from_agent, to_agent } => match agent {
                // `admit` set `from_agent` to the session's agent.
                Some(me) => self.agent_send(me, &contact, text, kind.as_deref(), reply_to, to_agent, one_shot).await,
                None => {
                    let kind = send_kind(kind.as_deref(), reply_to.as_deref())?;
                    let out = OwnerSend { kind, reply_to, from_agent, to_agent };
                    self.owner_send(&contact, text, out, one_shot).await
                }
            },
            Request::MailSend { contact, text, subject, reply_to, attachments } => {
                let id =
                    channels::agent_mail::parts::send_request(self, &contact, &text, subject, reply_to, &attachments)
                        .await?;
                self.flushed(one_shot, Value::Null).await?;
                self.message_view(&id).await
            }
            Request::MailSave { id, part, to } => channels::agent_mail::parts::save(self, &id, part, &to).await,
            // A peer's file, as untrusted data (attributed; UTF-8 content fenced); never opened.
            Request::MailAttachment { id, part } => channels::agent_mail::parts::read_for_agent(self, &id, part).await,
            Request::Settings { allow_local_networks } => {
                channels::agent_mail::local_net::settings(self, allow_local_networks).await
            }
            Request::List { contact } => {
                let id = self.send(&contact, Kind::List, Value::String(String::new()), None, None, None).await?;
                self.flushed(one_shot, Value::Null).await?;
                self.message_view(&id).await
            }
            Request::Inbox { all, wait_secs } => self.inbox(all, wait_secs, one_shot).await,
            Request::Message { id } => self.message_view(&id).await,
            Request::Conversation { contact, limit } => self.conversation(&contact, limit).await,
            Request::Log { search, limit } => {
                let rows = self.store().audit_log(search.as_deref(), limit.unwrap_or(200).clamp(1, 10_000)).await?;
                Ok(serde_json::to_value(rows).map_err(|e| Error::Bug(e.to_string()))?)
            }
            Request::Flush => {
                self.flush_once(true).await?;
                Ok(json!({"queued": self.store().outbox_len().await?}))
            }

            // Local agents and what they are handed.
            Request::AgentRegister { name, harness } => {
                self.agent_register(&name, harness.as_deref().unwrap_or("cli")).await?;
                self.flushed(one_shot, Value::Null).await?;
                self.agents().await
            }
            Request::AgentUnregister { name } => {
                self.agent_unregister(&name).await?;
                self.flushed(one_shot, Value::Null).await?;
                self.agents().await
            }
            Request::AgentList => self.agents().await,
            Request::SessionOpen { agent, harness } => self.session_open(&agent, harness.as_deref(), one_shot).await,
            Request::SessionClose => Err(Error::Invalid("only an agent session can close itself".into())),
            // `admit` named the session's own agent for an agent caller.
            Request::Read { agent, id, ancestors } => {
                let agent = self.named_agent(agent).await?;
                match id {
                    Some(id) => self.read_message(&agent, &id, ancestors.unwrap_or(0)).await,
                    None => self.take_queue(&agent, false).await,
                }
            }
            Request::Wait { agent, timeout_secs, paused_seen } => {
                let agent = self.named_agent(agent).await?;
                self.wait_queue(&agent, timeout_secs, paused_seen, one_shot).await
            }
            Request::Ack { lease, ids } => self.ack_lease(agent, &lease, ids.as_deref()).await,
            Request::Unread { agent } => {
                let agent = self.named_agent(agent).await?;
                Ok(json!({"agent": agent, "unread": self.unread(&agent).await?}))
            }

            // The owner's policy and review queue.
            Request::ReviewList => self.review_list().await,
            Request::ReviewApprove { id, text } => self.review_approve(id, text, one_shot).await,
            Request::ReviewReject { id } => self.review_reject(id).await,
            Request::Policy { review, loop_limit, digest_secs } => {
                self.set_policy(review, loop_limit, digest_secs).await
            }
            Request::Dnd { on: Some(on) } => self.set_dnd(on).await,
            Request::Dnd { on: None } => Ok(json!({"dnd": self.dnd().await?})),
            Request::Resume { contact } => self.resume(&contact).await,

            // Stringcup and Agent Mail specifics.
            Request::PairOpen => self.inner.stringcup.pair_open(self).await,
            Request::PairWait { token, name, timeout_secs } => {
                self.inner.stringcup.pair_wait(self, &token, name.as_deref(), timeout_secs.min(3600)).await
            }
            Request::TopicCreate { members } => self.inner.stringcup.topic_create(self, &members).await,
            Request::TopicList => self.inner.stringcup.topic_list(self).await,
            Request::TopicAdd { topic, members } => self.inner.stringcup.topic_add(self, &topic, &members).await,
            Request::TopicRemove { topic, member } => {
                self.inner.stringcup.topic_remove(self, &topic, member.as_deref()).await
            }
            Request::TopicDelete { topic } => self.inner.stringcup.topic_delete(self, &topic).await,
            Request::TopicSend { topic, text } => {
                let v = self.inner.stringcup.topic_send(self, &topic, &text).await?;
                self.flushed(one_shot, v).await
            }
            Request::TokenRotate => self.inner.stringcup.stringcup_rotate_if_due(self, true).await,
            Request::StringcupKeyUpdate => self.inner.stringcup.stringcup_key_update(self).await,
            Request::MailRotate => self.inner.agent_mail.agent_mail_rotate(self).await,
            Request::MailClose => self.inner.agent_mail.agent_mail_set_closed(self, true).await,
            Request::MailOpen => self.inner.agent_mail.agent_mail_set_closed(self, false).await,

            // ASNET/1: an agent's protected command waits for the owner's approval of its
            // challenge (the review item names the agent).
            asnet @ (Request::AsnetSetup { .. }
            | Request::AsnetRegister { .. }
            | Request::AsnetLookup { .. }
            | Request::AsnetConnect { .. }
            | Request::AsnetAccept { .. }
            | Request::AsnetConnections
            | Request::AsnetDisconnect { .. }
            | Request::AsnetStatus) => self.asnet_request(agent, asnet).await,

            // letmeknow. `admit` set an agent session's `handle` to its name (it is its own
            // member); the owner names one, or means the group's or the profile's only session.
            Request::GroupSession { handle, name } => self.lmk_session(handle.as_deref(), name.as_deref()).await,
            Request::GroupInvite { handle, group, ttl_secs } => {
                let h = self.invite_handle(handle, group.as_deref()).await?;
                self.lmk_invite(&h, group.as_deref(), ttl_secs).await
            }
            Request::GroupInviteWait { invite } => self.lmk_invite_wait(&invite).await,
            Request::GroupJoin { handle, link, timeout_secs } => {
                let h = match handle {
                    Some(h) => h,
                    None => self.lmk_owner_handle().await?,
                };
                self.lmk_join(&h, &link, timeout_secs).await
            }
            Request::GroupList { handle } => self.group_list(handle).await,
            Request::GroupSend { handle, group, text, to, reply_to } => {
                let h = self.group_handle(handle, &group).await?;
                match agent {
                    // Under the loop guard and the group's outbound mode.
                    Some(_) => self.lmk_agent_send(&h, &group, &text, to.as_deref(), reply_to.as_deref()).await,
                    // Operator input, which resets the group's loop guard.
                    None => {
                        let v = self.lmk_send(&h, &group, &text, to.as_deref(), reply_to.as_deref()).await?;
                        self.lmk_operator_input(&h, &group).await?;
                        Ok(v)
                    }
                }
            }
            Request::GroupRead { handle, id, ancestors } => {
                let h = self.resolve_handle(handle).await?;
                self.lmk_read(&h, &id, usize::try_from(ancestors.unwrap_or(0)).unwrap_or(usize::MAX)).await
            }
            Request::GroupMembers { handle, group } => {
                let h = self.group_handle(handle, &group).await?;
                self.lmk_sync_best_effort(&h, &group).await;
                self.lmk_members(&h, &group).await
            }
            Request::GroupRemove { handle, group, fingerprint } => {
                let h = self.group_handle(handle, &group).await?;
                self.lmk_remove(&h, &group, &fingerprint).await
            }
            Request::GroupSessionDelete { handle } => self.lmk_session_delete(&handle).await,
            Request::GroupLeave { handle, group } => {
                let h = self.group_handle(handle, &group).await?;
                self.lmk_leave(&h, &group).await
            }
            Request::GroupDeliveries { handle, wait_secs } => {
                let h = self.resolve_handle(handle).await?;
                self.lmk_wait(&h, wait_secs).await
            }
            Request::GroupMode { handle, group, mode } => {
                let h = self.group_handle(handle, &group).await?;
                self.lmk_set_mode(&h, &group, &mode).await
            }
            Request::GroupResume { handle, group } => self.group_resume(handle, &group).await,
            Request::GroupCreate { name } => self.lmk_create(&name).await,
            Request::GroupRename { group, name } => self.lmk_rename(&group, &name).await,
            Request::GroupHistory { handle, group, before, limit, mark_read } => {
                let h = self.group_handle(handle, &group).await?;
                // Only the owner looking marks rows read; an agent reads through its deliveries.
                self.lmk_history(&h, &group, before, limit, mark_read && agent.is_none()).await
            }
            Request::GroupInvites => Ok(self.lmk_invites()),

            // Relays other than the profile's own: pins a contact vouched for or the owner accepted.
            Request::RelayTrusted => self.relays_trusted().await,
            Request::RelayTrust { url, cert_sha256 } => self.relay_trust(&url, &cert_sha256).await,
            Request::RelayUntrust { url } => self.relay_untrust(&url).await,
            Request::RelayMovePlan => {
                let plan = self.relay_move_plan().await?;
                let mut v = serde_json::to_value(&plan).map_err(|e| Error::Bug(e.to_string()))?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("summary".into(), plan.summary().into());
                }
                Ok(v)
            }
            Request::RelayMove { url, cert_sha256 } => self.relay_move(&url, cert_sha256.as_deref()).await,
        }
    }

    /// `v`, after a one-shot runtime sent what the request queued.
    async fn flushed(&self, one_shot: bool, v: Value) -> Result<Value> {
        if one_shot {
            self.flush_once(true).await?;
        }
        Ok(v)
    }

    /// The owner's message: queued (committed), shown, and noted as operator input (which resets
    /// the conversation's loop guard).
    async fn owner_send(&self, contact: &str, text: String, out: OwnerSend, one_shot: bool) -> Result<Value> {
        let v = self.send_text(contact, text, out, one_shot).await?;
        let c = self.contact(contact).await?;
        // The message is queued; failing to note the operator's turn (a full disk) must not
        // report the send as failed.
        if let Err(e) = self.operator_input(c.id).await {
            tracing::warn!("noting the operator's send to {contact}: {e}");
        }
        Ok(v)
    }

    /// Queues one text message (an agent's once the delivery policy let it through) and shows it.
    pub(super) async fn send_text(&self, contact: &str, text: String, out: OwnerSend, one_shot: bool) -> Result<Value> {
        let OwnerSend { kind, reply_to, from_agent, to_agent } = out;
        let id = self
            .send(contact, kind, Value::String(text), reply_to.as_deref(), from_agent.as_deref(), to_agent.as_deref())
            .await?;
        // Queued (committed) now: a failed first attempt is the outbox's to retry, not an error
        // that would invite a duplicate.
        if one_shot && let Err(e) = self.flush_once(true).await {
            tracing::warn!("message {id} is queued; sending it now failed: {e}");
        }
        self.message_view(&id).await
    }
}

/// A text message's envelope fields, checked ([`send_kind`]).
#[derive(Debug)]
pub(super) struct OwnerSend {
    /// send, ask or reply.
    pub kind: Kind,
    /// The message answered (required for a reply).
    pub reply_to: Option<String>,
    /// The local agent sending it.
    pub from_agent: Option<String>,
    /// The peer's agent it is for.
    pub to_agent: Option<String>,
}

/// The kind a caller may send as text (`send` when unnamed); a reply must name its message.
pub(super) fn send_kind(kind: Option<&str>, reply_to: Option<&str>) -> Result<Kind> {
    let kind = match kind.unwrap_or("send") {
        "send" => Kind::Send,
        "ask" => Kind::Ask,
        "reply" => Kind::Reply,
        other => return Err(Error::Invalid(format!("cannot send kind `{other}` (send, ask, reply)"))),
    };
    if kind == Kind::Reply && reply_to.is_none() {
        return Err(Error::Invalid("a reply names the message it answers (reply_to)".into()));
    }
    Ok(kind)
}
