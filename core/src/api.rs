//! The runtime's request/response vocabulary: what the CLI, the localhost bridge, the MCP server
//! and the UI may ask. Requests and answers are DTOs (plain JSON), never domain types. It sits
//! beneath the engine (which matches on [`Request`] once, in `engine::dispatch`) and its clients
//! (`bridge`, `cli`, the desktop app), so the engine depends on no client.

use serde::{Deserialize, Serialize};

pub use crate::protocol::agent_mail::attachment::AttachmentIn;

/// One operation on the runtime.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Our identities (`stringcup.other_relays`: the Stringcup identities kept on relays moved
    /// away from, `{id, relay, contacts}`, present only when there are any).
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
        /// The name to keep them under (default: the name the request came in with). Refused
        /// if a contact or person already has it.
        #[serde(default)]
        new_name: Option<String>,
    },
    /// Owner only: make `other`'s channels part of `name`'s person (one contact, one
    /// conversation). Refused unless both show the same verified safety number or
    /// `confirm_safety_number` repeats `other`'s safety number, which the refusal prints.
    ContactMerge {
        /// The contact (or person) kept.
        name: String,
        /// The contact (or person) merged into it.
        other: String,
        /// `other`'s safety number, after the owner compared it with them.
        #[serde(default)]
        confirm_safety_number: Option<String>,
    },
    /// Owner only: take one channel (by protocol) out of a person into a contact of its own.
    ContactSplit {
        /// The person.
        name: String,
        /// letagents, agent-mail or stringcup.
        protocol: String,
    },
    /// Deny a pending request: the peer is blocked until the owner unblocks it.
    ContactDeny {
        /// Contact name.
        name: String,
    },
    /// Block a contact (any protocol; Agent Mail at the relay too): what it sends is dropped.
    ContactBlock {
        /// Contact name.
        name: String,
    },
    /// Unblock a contact.
    ContactUnblock {
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
    /// Agent Mail: send text with a subject (a reply keeps its parent's thread).
    MailSend {
        /// Contact name (an Agent Mail contact).
        contact: String,
        /// Text.
        text: String,
        /// Subject.
        #[serde(default)]
        subject: Option<String>,
        /// The message this answers.
        #[serde(default)]
        reply_to: Option<String>,
        /// Files carried as parts after the text (Agent Mail only; a person's Agent Mail
        /// channel is chosen when there are any).
        #[serde(default)]
        attachments: Vec<AttachmentIn>,
    },
    /// Agent Mail: writes attachment `part` of message `id` to `to`, an absolute path the user
    /// chose (never one made of the sender's name); refuses to overwrite anything. Owner only.
    MailSave {
        /// Message id.
        id: String,
        /// The attachment's part index (as listed with the message).
        part: i64,
        /// Absolute path of a file that does not exist yet.
        to: String,
    },
    /// Agent Mail: attachment `part` of message `id` with its bytes (base64url; UTF-8 content
    /// also as fenced text for an agent). Nothing is opened.
    MailAttachment {
        /// Message id.
        id: String,
        /// The attachment's part index.
        part: i64,
    },
    /// Profile settings: answers them, changing those given. Owner only.
    Settings {
        /// Whether public card fetches may go into local networks (loopback, private, CGNAT,
        /// link-local, unique-local). Unset: allowed only when our own relay is on one.
        #[serde(default)]
        allow_local_networks: Option<bool>,
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
    /// Every message with one contact, both directions, oldest first (a UI's conversation view).
    Conversation {
        /// Contact name.
        contact: String,
        /// Most messages (the newest are kept; default 500).
        #[serde(default)]
        limit: Option<i64>,
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
    /// Stringcup: the topics we belong to.
    TopicList,
    /// Stringcup: add contacts to a topic we own.
    TopicAdd {
        /// The `tp-` id.
        topic: String,
        /// Contact names.
        members: Vec<String>,
    },
    /// Stringcup: remove a contact from a topic we own, or leave it (no member).
    TopicRemove {
        /// The `tp-` id.
        topic: String,
        /// The contact to remove; none: ourselves.
        #[serde(default)]
        member: Option<String>,
    },
    /// Stringcup: delete a topic we own.
    TopicDelete {
        /// The `tp-` id.
        topic: String,
    },
    /// Stringcup: rotate the API token now.
    TokenRotate,
    /// Stringcup: a new identity key for the same id and inbox (B.1.2). Contacts who pinned the
    /// old key must verify the new one. Answers `{updated, fingerprint, fingerprint_short,
    /// previous_fingerprint}`.
    StringcupKeyUpdate,
    /// Agent Mail: a new card key now (higher nonce, published; the old key stays retained).
    MailRotate,
    /// Agent Mail: closes the mailbox (a card with no routes: no new mail is accepted; what was
    /// accepted still arrives). Answers the Agent Mail part of `whoami`.
    MailClose,
    /// Agent Mail: opens a closed mailbox again (a card with our relay as its route).
    MailOpen,
    /// Opens an agent session (owner only): registers the agent in the roster and returns a
    /// token bound to its name. Requests made with that token act as that agent and no other.
    SessionOpen {
        /// The agent's name.
        agent: String,
        /// Its harness (claude-code, codex, mcp, cli).
        #[serde(default)]
        harness: Option<String>,
    },
    /// Ends the calling agent's session: its token stops working.
    SessionClose,
    /// An agent's queued deliveries (all of them, fenced), or with `id` one message and its reply
    /// chain. The owner names the agent; an agent session reads its own queue.
    Read {
        /// The agent (owner callers only).
        #[serde(default)]
        agent: Option<String>,
        /// One message instead of the queue.
        #[serde(default)]
        id: Option<String>,
        /// With `id`: how many messages up the reply chain to include.
        #[serde(default)]
        ancestors: Option<u32>,
    },
    /// Waits up to `timeout_secs` for deliveries that are due (addressed to the agent: at once;
    /// other traffic: on the digest tick), then returns everything queued.
    Wait {
        /// The agent (owner callers only).
        #[serde(default)]
        agent: Option<String>,
        /// Longest wait; 0 only looks.
        #[serde(default)]
        timeout_secs: u64,
        /// The `paused_by_loop_guard` count the caller last saw. Given, the wait also ends as
        /// soon as the count differs, so the caller learns at once that the loop guard paused
        /// a conversation (nothing due is handed out for it).
        #[serde(default)]
        paused_seen: Option<i64>,
    },
    /// Acks a lease that `wait` or `read` handed out, once the harness has its messages: they
    /// become delivered. Unacked, they are handed out again (`redelivered`) after the lease
    /// timeout. An agent session acks only its own leases; the owner acks any. Group leases
    /// (`G…`, from `GroupDeliveries`) are acked the same way: their items become read.
    Ack {
        /// The `lease` of the `wait`, `read` or `group_deliveries` response.
        lease: String,
        /// Only these message ids of the lease (default: all of them).
        #[serde(default)]
        ids: Option<Vec<String>>,
    },
    /// The calling agent's unread count (the owner names the agent).
    Unread {
        /// The agent (owner callers only).
        #[serde(default)]
        agent: Option<String>,
    },
    /// Outbound agent messages held for review.
    ReviewList,
    /// Approves a held message: it is sent as its agent wrote it, or as the operator edited it.
    ReviewApprove {
        /// Review id.
        id: i64,
        /// The operator's edit of the text, sent instead of the agent's (not for an ASNET
        /// challenge, whose action is signed as asked).
        #[serde(default)]
        text: Option<String>,
    },
    /// Rejects a held message: it is never sent.
    ReviewReject {
        /// Review id.
        id: i64,
    },
    /// The delivery policy; fields given are changed first.
    Policy {
        /// Global outbound mode for agent messages: auto or review.
        #[serde(default)]
        review: Option<String>,
        /// Agent-to-agent messages per conversation without operator input before the loop
        /// guard pauses it.
        #[serde(default)]
        loop_limit: Option<u32>,
        /// Seconds between digests of traffic not addressed to an agent.
        #[serde(default)]
        digest_secs: Option<u64>,
    },
    /// Per-contact outbound mode for agent messages: auto, review or default (the global one);
    /// without `mode`, reads it.
    ContactReview {
        /// Contact name.
        name: String,
        /// auto | review | default.
        #[serde(default)]
        mode: Option<String>,
    },
    /// Operator input: resumes a conversation the loop guard paused and releases what it held.
    Resume {
        /// Contact name.
        contact: String,
    },
    /// Do-not-disturb, runtime-wide (owner only): with `on` sets it, without reads it. While on,
    /// no agent is woken (agent queues and group deliveries hand over nothing new); everything
    /// is kept and handed over once it is off. Answers `{"dnd": bool}`.
    Dnd {
        /// On or off; absent: only report.
        #[serde(default)]
        on: Option<bool>,
    },
    /// ASNET/1 (owner only): sets up this profile's account: the service mailbox, the user's
    /// own mailbox and its SMTP (sending) and IMAP (reading) servers. The password goes to the
    /// profile's keystore. `none` TLS is accepted for loopback servers only.
    AsnetSetup {
        /// The service mailbox.
        service: String,
        /// The user's own mailbox (commands are sent from it, replies read from it).
        mailbox: String,
        /// The login for both servers (default: the mailbox).
        #[serde(default)]
        username: Option<String>,
        /// The password (kept in the keystore, never in the database).
        password: Secret,
        /// SMTP server `HOST:PORT`.
        smtp: String,
        /// tls (default), starttls, none.
        #[serde(default)]
        smtp_tls: Option<String>,
        /// Whether SMTP logs in (default true).
        #[serde(default)]
        smtp_auth: Option<bool>,
        /// IMAP server `HOST:PORT`.
        imap: String,
        /// tls (default), none.
        #[serde(default)]
        imap_tls: Option<String>,
    },
    /// ASNET/1: asks the service to register (or re-register) this mailbox. The challenge comes
    /// back as a review item.
    AsnetRegister {
        /// The discovery choice; absent keeps the current one.
        #[serde(default)]
        discovery: Option<bool>,
    },
    /// ASNET/1: a public lookup of a member id (the answer arrives by mail: see `asnet_status`).
    AsnetLookup {
        /// `mem_…`.
        member_id: String,
    },
    /// ASNET/1: proposes a connection to a member with these scopes.
    AsnetConnect {
        /// `mem_…`.
        member_id: String,
        /// Scopes (`contact:email`, `profile:basic`).
        scopes: Vec<String>,
    },
    /// ASNET/1: accepts an invitation with the same or fewer scopes.
    AsnetAccept {
        /// `req_…` from the invitation.
        request_id: String,
        /// Scopes, a subset of the invitation's.
        scopes: Vec<String>,
    },
    /// ASNET/1: asks the service for the connection list (a private read, challenged) and
    /// answers the list as last reported.
    AsnetConnections,
    /// ASNET/1: removes the connection (and pending offers) with a member.
    AsnetDisconnect {
        /// `mem_…`.
        member_id: String,
    },
    /// ASNET/1: reads the mailbox once and reports the account, requests, challenges,
    /// invitations, connections, lookups and warnings.
    AsnetStatus,
    /// The LAN layer (owner only): with `on` switches it on or off (a running runtime starts or
    /// stops its node), without only reports. Answers `{enabled, running, peer_id, listening,
    /// nearby}`.
    Lan {
        /// On or off; absent: only report.
        #[serde(default)]
        on: Option<bool>,
    },
    /// Relays trusted by certificate pin besides the profile's own (owner only): each with its
    /// URL, certificate SHA-256 and who vouched for it (`source` `contact` with the contact's
    /// name, or `you`).
    RelayTrusted,
    /// The owner trusts the relay at `url` with the certificate whose SHA-256 is `cert_sha256`
    /// (after an `untrusted_relay` error showed both). Answers the list.
    RelayTrust {
        /// The relay's URL.
        url: String,
        /// SHA-256 of its certificate (hex).
        cert_sha256: String,
    },
    /// Forgets a trusted relay's pin. Answers the list.
    RelayUntrust {
        /// The relay's URL.
        url: String,
    },
    /// What `relay_move` would do now (owner only): `{from, letagents, agent_mail, stringcup,
    /// groups, drain_hours, summary}`: contacts told, groups and Stringcup contacts that stay on
    /// the current relay, and how long it is still read.
    RelayMovePlan,
    /// Moves the profile to another relay (owner only) once that relay answers: re-registers
    /// what lives on a relay (letagents mailbox, a Stringcup identity, an Agent Mail card routing
    /// there), tells letagents contacts (a signed notice) and Agent Mail contacts (a new card on
    /// both relays), keeps groups on the relay their log lives on and Stringcup contacts on the
    /// relay that assigned their ids (reached through the identity it assigned us, which is
    /// kept), reads the old relay for 48 h, and answers `whoami` with `move` (what was done).
    RelayMove {
        /// The new relay's URL.
        url: String,
        /// SHA-256 of its certificate (hex) to pin; absent: the web PKI.
        #[serde(default)]
        cert_sha256: Option<String>,
    },
    /// letmeknow: opens (or creates, with a random two-word handle) a group session; `name` is
    /// the display name its credential carries. Agent sessions always act as their own handle.
    GroupSession {
        /// The session's handle (default: the profile's only one, or a new one).
        #[serde(default)]
        handle: Option<String>,
        /// Display name for a new session.
        #[serde(default)]
        name: Option<String>,
    },
    /// letmeknow: an invite link to `group` (a new group when none is given); this runtime admits
    /// the joiner. Answers `{group, link, expires_at, invite}`.
    GroupInvite {
        /// The session (owner callers; default: the only one).
        #[serde(default)]
        handle: Option<String>,
        /// The group; none creates one.
        #[serde(default)]
        group: Option<String>,
        /// Invite lifetime (default 600 s).
        #[serde(default)]
        ttl_secs: Option<u64>,
    },
    /// letmeknow: waits for the admission of an invite this runtime opened.
    GroupInviteWait {
        /// The invite id (from `GroupInvite`).
        invite: String,
    },
    /// letmeknow: joins with an invite link. Answers `{group, members}`.
    GroupJoin {
        /// The session (owner callers; default: the only one).
        #[serde(default)]
        handle: Option<String>,
        /// The link, secret fragment included.
        link: String,
        /// Longest wait for the Welcome (default 660 s).
        #[serde(default)]
        timeout_secs: Option<u64>,
    },
    /// letmeknow: the session's groups (each entry names its `handle`).
    GroupList {
        /// The session (owner callers; default: every session's groups).
        #[serde(default)]
        handle: Option<String>,
    },
    /// letmeknow: sends to a group; `after` is filled from the read frontier.
    GroupSend {
        /// The session (owner callers; default: the only one).
        #[serde(default)]
        handle: Option<String>,
        /// The group.
        group: String,
        /// The text.
        text: String,
        /// A member's fingerprint to address.
        #[serde(default)]
        to: Option<String>,
        /// The message id answered (covered by `after`).
        #[serde(default)]
        reply_to: Option<String>,
    },
    /// letmeknow: a message and `ancestors` levels of its causal history.
    GroupRead {
        /// The session (owner callers; default: the only one).
        #[serde(default)]
        handle: Option<String>,
        /// The message id.
        id: String,
        /// Levels of `after` history.
        #[serde(default)]
        ancestors: Option<u32>,
    },
    /// letmeknow: members as this session sees them (name, fingerprint, who invited them).
    GroupMembers {
        /// The session (owner callers; default: the only one).
        #[serde(default)]
        handle: Option<String>,
        /// The group.
        group: String,
    },
    /// letmeknow: removes a member (a commit).
    GroupRemove {
        /// The session (owner callers; default: the only one).
        #[serde(default)]
        handle: Option<String>,
        /// The group.
        group: String,
        /// The member's fingerprint.
        fingerprint: String,
    },
    /// letmeknow (owner only): deletes a group session: leaves its groups, then erases its MLS
    /// state and decrypted log. Answers `{handle, deleted, left, not_told}`.
    GroupSessionDelete {
        /// The session.
        handle: String,
    },
    /// letmeknow: leaves a group (asks the others to commit the removal).
    GroupLeave {
        /// The session (owner callers; default: the only one).
        #[serde(default)]
        handle: Option<String>,
        /// The group.
        group: String,
    },
    /// letmeknow (owner only): the outbound mode of the session's agent sends to `group`: auto
    /// (sent at once), review (held in the review queue for approval) or default (the profile's
    /// `policy --review`). Answers `{group, handle, mode}`.
    GroupMode {
        /// The session (default: the only one).
        #[serde(default)]
        handle: Option<String>,
        /// The group.
        group: String,
        /// auto | review | default.
        mode: String,
    },
    /// letmeknow (owner only): operator input in `group`: the loop guard counts from here and
    /// releases what it paused. Answers `{group, handle, resumed, released}`.
    GroupResume {
        /// The session (default: the only one).
        #[serde(default)]
        handle: Option<String>,
        /// The group.
        group: String,
    },
    /// letmeknow (owner only): a new group named `name` (the person's local name for it), made
    /// by the owner's default session (created when needed). Answers `{group, name, handle}`.
    GroupCreate {
        /// The group's local name.
        name: String,
    },
    /// letmeknow (owner only): renames a group locally (members never see it).
    GroupRename {
        /// The group.
        group: String,
        /// The new name.
        name: String,
    },
    /// letmeknow: a page of a group's local log as a conversation shows it, oldest first: the
    /// newest `limit` rows (default 200) before row `before`. With `mark_read` (owner only, and
    /// only for the owner's default session while no agent acts as it) the rows shown enter the
    /// session's read frontier.
    /// Answers `{group, name, handle, messages}`.
    GroupHistory {
        /// The session (owner callers; default: the owner's session in the group, else any).
        #[serde(default)]
        handle: Option<String>,
        /// The group.
        group: String,
        /// Rows before this row (`row` of an earlier answer); none: the newest.
        #[serde(default)]
        before: Option<i64>,
        /// How many rows.
        #[serde(default)]
        limit: Option<u32>,
        /// The person saw them: mark them read.
        #[serde(default)]
        mark_read: bool,
    },
    /// letmeknow (owner only): the invites this runtime opened since it started, with what became
    /// of each (`waiting`, `used` by whom, `expired`, `failed`).
    GroupInvites,
    /// letmeknow: reads every group's log, waiting up to `wait_secs` for something new, and
    /// returns what is due to the session (the last 20 plus how many earlier were omitted) under
    /// a `lease` to `Ack` once the harness has them; unacked, they come again (`redelivered`)
    /// after the lease timeout.
    GroupDeliveries {
        /// The session (owner callers; default: the only one).
        #[serde(default)]
        handle: Option<String>,
        /// Longest wait; 0 only looks.
        #[serde(default)]
        wait_secs: u64,
    },
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
    /// What a client acts on, for the codes that carry more than words: `untrusted_relay`
    /// `{url, cert_sha256}`. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl ApiError {
    /// An error with `code` and `message`, and no data.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into(), data: None }
    }
}

/// A secret in a request (a password): serialized as given, never printed by `Debug`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}
