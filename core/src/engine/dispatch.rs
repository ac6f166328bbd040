//! Where every request enters the runtime: the caller check (`handle_as`: the owner, or an agent
//! session limited to the messaging operations, `agents`), then `handle_core`, the one match
//! over [`Request`] that calls one function per operation. Protocol-specific and group
//! operations go to their channel or to `groups`.

use serde_json::{Value, json};

use super::agents::Caller;
use super::channels::{self, ContactAdd};
use super::{Error, Result, Runtime, people};
use crate::bridge::api::Request;
use crate::protocol::letagents::Kind;

impl Runtime {
    /// Handles one request from the owner.
    pub async fn handle(&self, req: Request, one_shot: bool) -> Result<Value> {
        self.handle_as(&Caller::Owner, req, one_shot).await
    }

    /// Handles one request from `caller`, applying its permissions and the delivery policy.
    pub async fn handle_as(&self, caller: &Caller, req: Request, one_shot: bool) -> Result<Value> {
        match caller {
            Caller::Owner => self.handle_owner(req, one_shot).await,
            Caller::Agent(agent) => self.handle_agent(agent, req, one_shot).await,
        }
    }

    /// Handles one request for the owner, after `handle_as` and the per-caller rules of `agents`
    /// applied the caller's permissions and the delivery policy. `one_shot` runtimes sync with
    /// the relay around it.
    pub(super) async fn handle_core(&self, req: Request, one_shot: bool) -> Result<Value> {
        match req {
            Request::Whoami => self.whoami().await,
            Request::Status => self.status().await,
            Request::Lan { on } => self.lan_request(on).await,
            Request::ContactAdd { address, name, allow, relay: _, no_hello } if people::looks_like_link(&address) => {
                let v = self.person_add(&address, name.as_deref(), allow.as_deref(), !no_hello).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                Ok(v)
            }
            asnet @ (Request::AsnetSetup { .. }
            | Request::AsnetRegister { .. }
            | Request::AsnetLookup { .. }
            | Request::AsnetConnect { .. }
            | Request::AsnetAccept { .. }
            | Request::AsnetConnections
            | Request::AsnetDisconnect { .. }
            | Request::AsnetStatus) => self.asnet_request(asnet).await,
            Request::ContactAdd { address, name, allow, relay, no_hello } => {
                let v = self
                    .contact_add(ContactAdd {
                        address: &address,
                        name: name.as_deref(),
                        allow: allow.as_deref(),
                        relay: relay.as_deref(),
                        hello: !no_hello,
                    })
                    .await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                Ok(v)
            }
            Request::ContactList => {
                if one_shot {
                    self.sync_best_effort().await;
                }
                self.contact_list().await
            }
            Request::ContactRequests => {
                if one_shot {
                    self.sync_best_effort().await;
                }
                Ok(Value::Array(
                    self.store().contacts(Some("pending")).await?.iter().map(|c| self.contact_dto(c)).collect(),
                ))
            }
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
            Request::Send { contact, text, kind, reply_to, from_agent, to_agent } => {
                let kind = match kind.as_deref().unwrap_or("send") {
                    "send" => Kind::Send,
                    "ask" => Kind::Ask,
                    "reply" => Kind::Reply,
                    other => {
                        return Err(Error::Invalid(format!("cannot send kind `{other}` (send, ask, reply)")));
                    }
                };
                if kind == Kind::Reply && reply_to.is_none() {
                    return Err(Error::Invalid("a reply needs --reply-to ID".into()));
                }
                let id = self
                    .send(
                        &contact,
                        kind,
                        Value::String(text),
                        reply_to.as_deref(),
                        from_agent.as_deref(),
                        to_agent.as_deref(),
                    )
                    .await?;
                // Queued (committed) now: a failed first attempt is the outbox's to retry, not
                // an error that would invite a duplicate.
                if one_shot && let Err(e) = self.flush_once(true).await {
                    tracing::warn!("message {id} is queued; sending it now failed: {e}");
                }
                self.message_view(&id).await
            }
            Request::MailSend { contact, text, subject, reply_to, attachments } => {
                let files = crate::protocol::agent_mail::attachment::decode(&attachments)?;
                let c = channels::agent_mail::parts::mail_contact(self, &contact, !files.is_empty()).await?;
                let kind = if reply_to.is_some() { "reply" } else { "send" };
                let out = channels::agent_mail::MailOut {
                    kind,
                    text: &text,
                    reply_to: reply_to.as_deref(),
                    subject: subject.as_deref(),
                    from_agent: None,
                    to_agent: None,
                    attachments: &files,
                };
                let id = self.inner.agent_mail.agent_mail_send(self, &c, out).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                self.message_view(&id).await
            }
            Request::MailSave { id, part, to } => channels::agent_mail::parts::save(self, &id, part, &to).await,
            Request::MailAttachment { id, part } => channels::agent_mail::parts::read_for_agent(self, &id, part).await,
            Request::Settings { allow_local_networks } => {
                channels::agent_mail::local_net::settings(self, allow_local_networks).await
            }
            Request::List { contact } => {
                let id = self.send(&contact, Kind::List, Value::String(String::new()), None, None, None).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                self.message_view(&id).await
            }
            Request::Inbox { all, wait_secs } => self.inbox(all, wait_secs, one_shot).await,
            Request::Message { id } => self.message_view(&id).await,
            Request::Conversation { contact, limit } => self.conversation(&contact, limit).await,
            Request::Log { search, limit } => {
                let rows = self.store().audit_log(search.as_deref(), limit.unwrap_or(200).clamp(1, 10_000)).await?;
                Ok(serde_json::to_value(rows).map_err(|e| Error::Bug(e.to_string()))?)
            }
            Request::AgentRegister { name, harness } => {
                self.agent_register(&name, harness.as_deref().unwrap_or("cli")).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                self.agents().await
            }
            Request::AgentUnregister { name } => {
                self.agent_unregister(&name).await?;
                if one_shot {
                    self.flush_once(true).await?;
                }
                self.agents().await
            }
            Request::AgentList => self.agents().await,
            Request::Flush => {
                self.flush_once(true).await?;
                Ok(json!({"queued": self.store().outbox_len().await?}))
            }
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
                if one_shot {
                    self.flush_once(true).await?;
                }
                Ok(v)
            }
            Request::TokenRotate => self.inner.stringcup.stringcup_rotate_if_due(self, true).await,
            Request::StringcupKeyUpdate => self.inner.stringcup.stringcup_key_update(self).await,
            Request::MailRotate => self.inner.agent_mail.agent_mail_rotate(self).await,
            Request::MailClose => self.inner.agent_mail.agent_mail_set_closed(self, true).await,
            Request::MailOpen => self.inner.agent_mail.agent_mail_set_closed(self, false).await,
            Request::SessionOpen { .. }
            | Request::SessionClose
            | Request::Read { .. }
            | Request::Wait { .. }
            | Request::Unread { .. }
            | Request::Ack { .. }
            | Request::ReviewList
            | Request::ReviewApprove { .. }
            | Request::ReviewReject { .. }
            | Request::Policy { .. }
            | Request::ContactReview { .. }
            | Request::Resume { .. }
            | Request::Dnd { .. } => Err(Error::Bug("agent and policy requests are routed by handle_as".into())),
            group @ (Request::GroupSession { .. }
            | Request::GroupInvite { .. }
            | Request::GroupInviteWait { .. }
            | Request::GroupJoin { .. }
            | Request::GroupList { .. }
            | Request::GroupSend { .. }
            | Request::GroupRead { .. }
            | Request::GroupMembers { .. }
            | Request::GroupRemove { .. }
            | Request::GroupLeave { .. }
            | Request::GroupSessionDelete { .. }
            | Request::GroupDeliveries { .. }
            | Request::GroupMode { .. }
            | Request::GroupResume { .. }
            | Request::GroupCreate { .. }
            | Request::GroupRename { .. }
            | Request::GroupHistory { .. }
            | Request::GroupInvites) => self.handle_group(None, group).await,
            Request::RelayTrusted => self.relays_trusted().await,
            Request::RelayTrust { url, cert_sha256 } => self.relay_trust(&url, &cert_sha256).await,
            Request::RelayUntrust { url } => self.relay_untrust(&url).await,
        }
    }
}
