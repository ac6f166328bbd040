//! One channel per 1:1 protocol, behind one trait, chosen by one match over [`Protocol`].
//!
//! - The rest of the engine never asks which protocol a contact, an outbox row or an address
//!   belongs to: it asks [`Runtime::channel`] for the channel and calls it.
//! - A channel owns its protocol's state (identities, clients, locks) and its code: adding a
//!   contact, sealing and queuing a message (through `outbox::queue`, so every protocol shares
//!   one queue/commit/wake tail), one delivery attempt of a queued payload, draining what waits at
//!   the relay, and the long-lived receive loop.
//! - Adding a protocol: a variant in `store::Protocol` (its stored name), a file here
//!   implementing [`Channel`], and one arm in [`Runtime::channel`].

use futures_util::future::BoxFuture;
use serde_json::Value;

use super::delivery::SenderAuth;
use super::{Result, Runtime};
use crate::protocol::lan::ProtocolTag;
use crate::protocol::letagents::{Kind, STALE_AFTER_MS};
use crate::store::{ContactRow, OutboxRow};
use crate::transport::letagents::SendOutcome;

pub use crate::store::Protocol;

pub(super) mod agent_mail;
pub(super) mod letagents;
pub(super) mod stringcup;

pub(super) use agent_mail::AgentMail;
pub(super) use letagents::Letagents;
pub(super) use stringcup::Stringcup;

/// A contact to add, as the caller gave it.
#[derive(Debug, Clone, Copy)]
pub(super) struct ContactAdd<'a> {
    /// The address (its form says which protocol it is).
    pub address: &'a str,
    /// Local name, if the caller chose one.
    pub name: Option<&'a str>,
    /// Allowed kinds (default `send,ask,reply,list`).
    pub allow: Option<&'a [String]>,
    /// A relay override (letagents only).
    pub relay: Option<&'a str>,
    /// Whether to introduce ourselves (letagents' hello).
    pub hello: bool,
}

/// A message to send, before a channel shapes it for its protocol.
#[derive(Debug, Clone)]
pub(super) struct Outgoing<'a> {
    /// Its kind.
    pub kind: Kind,
    /// Text, or JSON for letagents' structured kinds.
    pub body: Value,
    /// The message it answers.
    pub reply_to: Option<&'a str>,
    /// The local agent sending it.
    pub from_agent: Option<&'a str>,
    /// The peer's agent it is for.
    pub to_agent: Option<&'a str>,
}

/// What a protocol does for the engine. Every method takes the runtime for the shared parts
/// (store, events, the outbox wake); the channel keeps its own state.
pub(super) trait Channel: Send + Sync {
    /// Whether `address` is written in this protocol's address form.
    fn claims_address(&self, address: &str) -> bool;

    /// Adds (or accepts) a contact by its address. Returns the contact's name.
    fn add_contact<'a>(&'a self, rt: &'a Runtime, req: ContactAdd<'a>) -> BoxFuture<'a, Result<String>>;

    /// Seals `msg` to active contact `c` and queues it (message, outbox and audit rows in one
    /// transaction, then the outbox wakes). Returns the message id.
    fn send<'a>(&'a self, rt: &'a Runtime, c: &'a ContactRow, msg: Outgoing<'a>) -> BoxFuture<'a, Result<String>>;

    /// One delivery attempt of a queued payload (the exact stored bytes).
    fn attempt<'a>(&'a self, rt: &'a Runtime, row: &'a OutboxRow) -> BoxFuture<'a, Result<SendOutcome>>;

    /// Reads everything waiting at the relay once, commits and acknowledges it. Returns how many.
    fn sync<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, Result<usize>>;

    /// Receives until shutdown (a running runtime), or until something `inbox` shows arrives.
    fn run<'a>(&'a self, rt: &'a Runtime, until_showable: bool) -> BoxFuture<'a, Result<()>>;

    /// First contact with the relay when the profile is created; failures are logged, not fatal,
    /// unless local state could not be made.
    fn init<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, Result<()>>;

    /// The hourly chores (token rotation and the like).
    fn housekeeping<'a>(&'a self, _rt: &'a Runtime) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// Our section of `whoami`: its key and value.
    fn whoami<'a>(&'a self, rt: &'a Runtime) -> BoxFuture<'a, (&'static str, Value)>;

    /// The safety number people compare for `c`, and the one of a changed key waiting for
    /// `verify`.
    fn safety_numbers(&self, c: &ContactRow) -> (Option<String>, Option<String>);

    /// The contact's address once `verify` adopts the changed box key `new_box`.
    fn address_with_box(&self, c: &ContactRow, new_box: &[u8]) -> Result<String>;

    /// When a payload the relay keeps refusing with a retryable answer is given up (`failed`),
    /// and why; `None`: never, it stays queued (with its last error) until it goes through.
    /// The default is letagents' rule: receivers drop envelopes older than 48 h.
    fn give_up_at(&self, row: &OutboxRow) -> Option<(i64, &'static str)> {
        Some((row.created_at.saturating_add(STALE_AFTER_MS), "after 48 h"))
    }

    /// What this protocol proves about who sent a message (the fence label and DTOs say it).
    fn sender_auth(&self) -> SenderAuth;

    /// Whether contacts of this protocol are told our roster when local agents change.
    fn carries_roster(&self) -> bool {
        false
    }

    /// Tells the relay the owner (un)blocked `peer`, where the protocol has a relay-side block
    /// (Agent Mail); `None`: it has none, the block is ours alone.
    fn block_at_relay<'a>(
        &'a self,
        _rt: &'a Runtime,
        _peer: &'a str,
        _blocked: bool,
    ) -> Option<BoxFuture<'a, Result<()>>> {
        None
    }

    /// The tag this protocol's sealed bytes carry when delivered directly over the LAN; `None`:
    /// never directly (the LAN layer carries only protocols whose sender is authenticated end to
    /// end, so a LAN peer cannot speak for anyone). Its contacts' keys are what LAN bindings are
    /// checked against.
    fn lan_tag(&self) -> Option<ProtocolTag> {
        None
    }

    /// Receives one payload a bound LAN peer delivered directly (tagged [`Channel::lan_tag`]) and
    /// commits it; true if it produced something `inbox` will show.
    fn receive_direct<'a>(&'a self, _rt: &'a Runtime, _sealed: &'a [u8]) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async { Err(super::Error::Bug("this protocol is never delivered directly".into())) })
    }
}

impl Runtime {
    /// The channel of `protocol`: the one place the engine forks by protocol.
    pub(super) fn channel(&self, protocol: Protocol) -> &dyn Channel {
        match protocol {
            Protocol::Letagents => &self.inner.letagents,
            Protocol::Stringcup => &self.inner.stringcup,
            Protocol::AgentMail => &self.inner.agent_mail,
        }
    }

    /// Processes one letagents envelope as if the relay had delivered it and commits every
    /// effect; true if it produced something `inbox` will show. For benches and tools that
    /// measure the receive path without a relay (`core/benches/store.rs`).
    pub async fn receive_letagents(&self, envelope: &[u8]) -> Result<bool> {
        self.inner.letagents.receive(self, envelope).await
    }

    /// Processes letagents envelopes as if the relay had handed them over in one burst (one
    /// transaction per 256); per envelope, whether it produced something `inbox` will show. For
    /// benches (`core/benches/store.rs`).
    pub async fn receive_letagents_burst(&self, envelopes: &[Vec<u8>]) -> Result<Vec<bool>> {
        self.inner.letagents.receive_burst(self, envelopes).await
    }

    /// How many letagents receive transactions this runtime has committed: one per envelope
    /// received alone, one per chunk of a burst. Tests count them.
    pub fn letagents_receive_transactions(&self) -> u64 {
        self.inner.letagents.receive_transactions()
    }

    /// The protocol whose direct LAN deliveries carry `tag`.
    pub(super) fn protocol_of_lan_tag(&self, tag: ProtocolTag) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| self.channel(*p).lan_tag() == Some(tag))
    }

    /// The protocol whose address form `address` has. An address no channel claims goes to
    /// letagents, the first protocol, whose parser says what is wrong with it.
    pub(super) fn protocol_of_address(&self, address: &str) -> Protocol {
        Protocol::ALL.into_iter().find(|p| self.channel(*p).claims_address(address)).unwrap_or(Protocol::ALL[0])
    }
}
