//! The runtime's request/response vocabulary: what the CLI, the localhost bridge, the MCP server
//! and the UI may ask. Requests and answers are DTOs (plain JSON), never domain types.

use serde::{Deserialize, Serialize};

/// One operation on the runtime.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Our identities.
    Whoami,
    /// Runtime status.
    Status,
    /// Add a contact by address (sends a hello unless `no_hello`).
    ContactAdd {
        /// The address.
        address: String,
        /// Local name.
        #[serde(default)]
        name: Option<String>,
        /// Allowed kinds (default send, ask, reply, list).
        #[serde(default)]
        allow: Option<Vec<String>>,
        /// Their relay, if not ours.
        #[serde(default)]
        relay: Option<String>,
        /// Skip the hello.
        #[serde(default)]
        no_hello: bool,
    },
    /// All contacts.
    ContactList,
    /// Pending requests.
    ContactRequests,
    /// Accept a pending request.
    ContactAccept {
        /// Contact name.
        name: String,
    },
    /// Deny (delete) a pending request.
    ContactDeny {
        /// Contact name.
        name: String,
    },
    /// Mark verified (and accept a changed key).
    ContactVerify {
        /// Contact name.
        name: String,
    },
    /// Set the allowed kinds.
    ContactAllow {
        /// Contact name.
        name: String,
        /// Kinds.
        kinds: Vec<String>,
    },
    /// Append a per-agent rule.
    ContactRule {
        /// Contact name.
        name: String,
        /// Glob on their agent.
        from: String,
        /// Glob on our agent.
        to: String,
        /// allow | deny.
        action: String,
    },
    /// Send text.
    Send {
        /// Contact name.
        contact: String,
        /// Text.
        text: String,
        /// Kind: send (default), ask, reply.
        #[serde(default)]
        kind: Option<String>,
        /// For replies.
        #[serde(default)]
        reply_to: Option<String>,
        /// Our agent.
        #[serde(default)]
        from_agent: Option<String>,
        /// Their agent.
        #[serde(default)]
        to_agent: Option<String>,
    },
    /// Ask who is online.
    List {
        /// Contact name.
        contact: String,
    },
    /// New (or all) incoming messages.
    Inbox {
        /// Include already shown.
        #[serde(default)]
        all: bool,
        /// Long-poll up to this many seconds for something new.
        #[serde(default)]
        wait_secs: u64,
    },
    /// One message, in or out.
    Message {
        /// Message id.
        id: String,
    },
    /// The audit log.
    Log {
        /// Substring filter.
        #[serde(default)]
        search: Option<String>,
        /// Most rows.
        #[serde(default)]
        limit: Option<i64>,
    },
    /// Register a local agent (changes the roster).
    AgentRegister {
        /// Name.
        name: String,
        /// Harness.
        #[serde(default)]
        harness: Option<String>,
    },
    /// Unregister a local agent.
    AgentUnregister {
        /// Name.
        name: String,
    },
    /// Local agents.
    AgentList,
    /// Deliver whatever is queued now.
    Flush,
    /// Stringcup: open a rendezvous; returns the token to hand over.
    PairOpen,
    /// Stringcup: claim or re-poll a rendezvous until paired or the timeout.
    PairWait {
        /// The `rv-` token.
        token: String,
        /// Name for the new contact.
        #[serde(default)]
        name: Option<String>,
        /// Seconds to keep trying.
        #[serde(default = "default_pair_timeout")]
        timeout_secs: u64,
    },
    /// Stringcup: create a topic with these contacts.
    TopicCreate {
        /// Contact names.
        members: Vec<String>,
    },
    /// Stringcup: send to every pinned member of a topic in one batch.
    TopicSend {
        /// The `tp-` id.
        topic: String,
        /// Text.
        text: String,
    },
    /// Stringcup: rotate the API token now.
    TokenRotate,
}

fn default_pair_timeout() -> u64 {
    600
}

/// An error as it crosses to clients.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ApiError {
    /// Stable machine-readable code.
    pub code: String,
    /// Human-readable message.
    pub message: String,
}
