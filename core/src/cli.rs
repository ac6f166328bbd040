//! The `switchboard` command line: parses arguments, talks to the profile's runtime (over the
//! bridge, or in-process when none runs), and prints text or JSON.

// serde_json::Value indexing returns Null for missing keys; it cannot panic.
#![allow(clippy::indexing_slicing)]

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde_json::Value;

use crate::api::{ApiError, Request};
use crate::bridge::client::Conn;
use crate::engine::{InitOptions, Runtime};
use crate::profile::Profile;

/// Switchboard: let your agents talk to other people's agents, safely.
#[derive(Debug, Parser)]
#[command(name = "switchboard", version, about)]
pub struct Cli {
    /// Profile directory (default: $SWITCHBOARD_HOME, else the OS data dir's switchboard/profiles/default).
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create this profile's identity.
    Init {
        /// Your display name, as contacts see it.
        #[arg(long)]
        name: String,
        /// Relay base URL (https://..., or http:// on loopback).
        #[arg(long)]
        relay: String,
        /// Pin a self-signed relay certificate by its SHA-256 (hex).
        #[arg(long, value_name = "HEX")]
        relay_cert_sha256: Option<String>,
        /// Where to keep secret keys: auto (OS keyring, else a 0600 file), os-keyring, file.
        #[arg(long, env = "SWITCHBOARD_KEYSTORE", default_value = "auto")]
        keystore: crate::identity::keystore::KeystorePreference,
    },
    /// Show your addresses and safety numbers.
    Whoami,
    /// Show the runtime you are talking to.
    Status,
    /// Manage contacts.
    #[command(subcommand)]
    Contact(ContactCmd),
    /// Send a message (TEXT `-` reads standard input).
    Send(SendArgs),
    /// Ask a contact's device who is online (the roster arrives in the inbox).
    List {
        /// Contact name.
        contact: String,
    },
    /// Show messages no earlier `inbox` showed.
    Inbox {
        /// Show history too.
        #[arg(long)]
        all: bool,
        /// Wait up to SECONDS for something new.
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        wait: u64,
    },
    /// Show one message and its delivery state (and its attachments, by part index).
    Show {
        /// Message id.
        id: String,
    },
    /// Save attachment PART of message ID to a path you choose (never overwrites; the sender's
    /// file name is never used as a path). Nothing is opened.
    Save {
        /// Message id.
        id: String,
        /// The attachment's part index, as `show` lists it.
        part: i64,
        /// Where to write it (a file that does not exist yet).
        #[arg(long, value_name = "PATH")]
        to: std::path::PathBuf,
    },
    /// Show profile settings, or change them.
    Settings {
        /// Let public card fetches go into local networks (loopback, private, CGNAT,
        /// link-local): on or off. Unset, they may when your own relay is on one.
        #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
        allow_local_networks: Option<String>,
    },
    /// The audit log of everything sent and received.
    Log {
        /// Only rows containing this text.
        #[arg(long)]
        search: Option<String>,
        /// Most rows.
        #[arg(long, default_value_t = 200)]
        limit: i64,
    },
    /// Local agents (the roster contacts see).
    #[command(subcommand)]
    Agent(AgentCmd),
    /// Try to deliver queued messages now.
    Flush,
    /// Pair with an unknown Stringcup agent: no TOKEN opens a rendezvous and prints the token to
    /// hand over; TOKEN joins one. Both wait until paired and show the peer's safety number.
    Pair {
        /// A token the other side printed.
        token: Option<String>,
        /// Name for the new contact.
        #[arg(long)]
        name: Option<String>,
        /// Seconds to wait for the other side.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Stringcup topics (fan-out to several contacts in one request).
    #[command(subcommand)]
    Topic(TopicCmd),
    /// Rotate the Stringcup API token now (the runtime also rotates it before it expires).
    RotateToken,
    /// Give the Stringcup identity a new key (same id and inbox); contacts must verify it anew.
    RotateStringcupKey,
    /// Replace the Agent Mail card key now (the runtime also renews the card before it expires).
    RotateMailKey,
    /// Close the Agent Mail mailbox (no new mail accepted; what was accepted still arrives), or
    /// open it again.
    Mailbox {
        /// close or open.
        #[arg(value_parser = ["close", "open"])]
        state: String,
    },
    /// Run the profile's runtime headless.
    Daemon {
        /// Also serve this UI build (ui/dist) to browsers signed in with `switchboard ui`.
        #[arg(long, value_name = "DIR", env = "SWITCHBOARD_UI_DIR")]
        ui: Option<PathBuf>,
    },
    /// Print a single-use link that opens the UI in a browser (becomes the runtime if none runs;
    /// shows the first-run screen for a new profile).
    Ui {
        /// The UI build to serve (default: the checkout's ui/dist).
        #[arg(long, value_name = "DIR", env = "SWITCHBOARD_UI_DIR")]
        ui: Option<PathBuf>,
        /// Where a new profile keeps its secret keys: auto, os-keyring, file.
        #[arg(long, env = "SWITCHBOARD_KEYSTORE", default_value = "auto")]
        keystore: crate::identity::keystore::KeystorePreference,
    },
    /// Run a stdio MCP server for one agent session (starts the runtime if none runs).
    Mcp {
        /// The agent's name (as contacts see it in the roster).
        #[arg(long, env = "SWITCHBOARD_AGENT", default_value = "agent")]
        agent: String,
        /// The harness, for the roster.
        #[arg(long, default_value = "mcp")]
        harness: String,
    },
    /// letmeknow: an invite link to GROUP (a new group without one); waits for the join when no
    /// runtime is running. JSON: {"group", "link", "expires_at"}.
    Invite {
        /// The group (none creates one).
        group: Option<String>,
        /// The group session (default: the only one).
        #[arg(long)]
        handle: Option<String>,
    },
    /// letmeknow: join a group with an invite link. JSON: {"group", "members"}.
    Join {
        /// The link, including the part after '#'.
        link: String,
        /// The group session (default: the only one).
        #[arg(long)]
        handle: Option<String>,
    },
    /// letmeknow groups.
    #[command(subcommand)]
    Group(GroupCmd),
    /// Print an agent's deliveries as JSON lines as they become due (a harness monitor).
    Listen {
        /// The agent's name.
        #[arg(long, env = "SWITCHBOARD_AGENT", default_value = "agent")]
        agent: String,
        /// The harness, for the roster.
        #[arg(long, default_value = "claude-code")]
        harness: String,
        /// Stop after the first batch (or after --timeout seconds with nothing).
        #[arg(long)]
        once: bool,
        /// With --once: longest wait in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// Run a letmeknow group session with this handle (created if new; restarting with it
        /// resumes its groups); prints its group deliveries too.
        #[arg(long)]
        handle: Option<String>,
        /// Display name for a new group session.
        #[arg(long)]
        name: Option<String>,
    },
    /// Keep a Codex thread woken by deliveries (app-server: turn/start when idle, turn/steer mid-turn).
    Codex {
        /// The agent's name.
        #[arg(long, env = "SWITCHBOARD_AGENT", default_value = "codex")]
        agent: String,
        /// Resume this Codex thread instead of starting a new one.
        #[arg(long)]
        thread: Option<String>,
        /// Working directory for a new thread.
        #[arg(long)]
        cwd: Option<String>,
        /// Attach to the app-server listening on this Unix socket (`codex app-server --listen
        /// unix://PATH`) instead of running one.
        #[arg(long, value_name = "PATH", conflicts_with = "command")]
        socket: Option<std::path::PathBuf>,
        /// The app-server command after `--` (default: codex app-server).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Deliver an agent's queued messages into a harness hook (Claude Code hook JSON on stdout).
    Hook {
        /// The agent's name.
        #[arg(long, env = "SWITCHBOARD_AGENT", default_value = "agent")]
        agent: String,
        /// post-tool-use (only what is due: steer) or user-prompt-submit (everything queued).
        event: String,
    },
    /// Outbound agent messages held for your approval.
    #[command(subcommand)]
    Review(ReviewCmd),
    /// Show or change the delivery policy (review mode, loop guard, digest period).
    Policy {
        /// Outbound agent messages: auto (sent at once) or review (held for approval).
        #[arg(long)]
        review: Option<String>,
        /// Agent-to-agent messages per conversation without your input before it pauses.
        #[arg(long, value_name = "N")]
        loop_limit: Option<u32>,
        /// Seconds between digests of traffic not addressed to an agent.
        #[arg(long, value_name = "SECS")]
        digest: Option<u64>,
    },
    /// Resume a conversation the loop guard paused.
    Resume {
        /// Contact name.
        contact: String,
    },
    /// Do-not-disturb for the whole runtime: while on, no agent is woken (everything is kept and
    /// handed over when it goes off).
    Dnd {
        /// on, off, or status.
        #[arg(value_parser = ["on", "off", "status"], default_value = "status")]
        state: String,
    },
    /// The LAN layer: find contacts on the local network (mDNS) and deliver to them directly,
    /// the relay as fallback. Off by default; off opens no LAN socket.
    Lan {
        /// on, off, or status.
        #[arg(value_parser = ["on", "off", "status"], default_value = "status")]
        state: String,
    },
    /// ASNET/1, the email-borne agent network: your mailbox, registration, connections. Every
    /// challenge the service mails back waits in `review list` for your approval.
    #[command(subcommand)]
    Asnet(AsnetCmd),
    /// Your relay (`relay move`), and relays trusted by certificate besides it: those a contact
    /// announced on the LAN (signed by its key), and those you accepted.
    #[command(subcommand)]
    Relay(RelayCmd),
}

/// `relay` subcommands.
#[derive(Debug, Subcommand)]
pub enum RelayCmd {
    /// The trusted relays and who vouched for each.
    List,
    /// Trust the relay at URL with the certificate whose SHA-256 is given (compare it with the
    /// relay's host first: an `untrusted_relay` error shows both).
    Trust {
        /// The relay's URL.
        url: String,
        /// SHA-256 of its certificate (hex).
        cert_sha256: String,
    },
    /// Forget a trusted relay.
    Untrust {
        /// The relay's URL.
        url: String,
    },
    /// Move this profile to another relay (it must answer first): letagents and Agent Mail
    /// contacts are told, groups stay on the current relay, which is read for 48 h more. Refused
    /// while Stringcup contacts exist (their identities belong to the current relay).
    Move {
        /// The new relay's URL.
        url: String,
        /// SHA-256 of its certificate (hex) to pin, for a self-signed relay.
        #[arg(long)]
        cert_sha256: Option<String>,
    },
}

/// `asnet` subcommands.
#[derive(Debug, Subcommand)]
pub enum AsnetCmd {
    /// Set up the account: the service mailbox, your mailbox and its SMTP and IMAP servers. The
    /// password is read from standard input (or $SWITCHBOARD_ASNET_PASSWORD) into the keystore.
    Setup {
        /// The service mailbox (e.g. network@example.com).
        #[arg(long)]
        service: String,
        /// Your own mailbox, which sends the commands and receives the replies.
        #[arg(long)]
        mailbox: String,
        /// Login for both servers (default: the mailbox).
        #[arg(long)]
        username: Option<String>,
        /// SMTP server HOST:PORT.
        #[arg(long)]
        smtp: String,
        /// tls, starttls, or none (loopback servers only).
        #[arg(long, value_parser = ["tls", "starttls", "none"], default_value = "tls")]
        smtp_tls: String,
        /// Whether to log in to the SMTP server.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        smtp_auth: bool,
        /// IMAP server HOST:PORT.
        #[arg(long)]
        imap: String,
        /// tls, or none (loopback servers only).
        #[arg(long, value_parser = ["tls", "none"], default_value = "tls")]
        imap_tls: String,
    },
    /// Register this mailbox with the service (or change the discovery choice).
    Register {
        /// Publish a discovery marker (true) or withdraw it (false); absent keeps the choice.
        #[arg(long, action = clap::ArgAction::Set)]
        discovery: Option<bool>,
    },
    /// Look a member id up (public; the answer arrives by mail, see `asnet status`).
    Lookup {
        /// mem_…
        id: String,
    },
    /// Propose a connection to a member.
    Connect {
        /// mem_…
        id: String,
        /// Scopes, comma-separated: contact:email, profile:basic.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<String>,
    },
    /// Accept an invitation with the same or fewer scopes.
    Accept {
        /// req_… from the invitation.
        request: String,
        /// Scopes, comma-separated, a subset of the invitation's.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<String>,
    },
    /// Ask the service for your connections (challenged), and show the list as last reported.
    Connections,
    /// Remove the connection with a member.
    Disconnect {
        /// mem_…
        id: String,
    },
    /// Read the mailbox once and show the account, requests, challenges, invitations,
    /// connections and warnings.
    Status,
}

/// `review` subcommands.
#[derive(Debug, Subcommand)]
pub enum ReviewCmd {
    /// Held messages.
    List,
    /// Send a held message.
    Approve {
        /// Review id.
        id: i64,
    },
    /// Drop a held message.
    Reject {
        /// Review id.
        id: i64,
    },
}

/// `send` arguments.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// Contact name.
    pub contact: String,
    /// Text (`-` for standard input).
    pub text: String,
    /// Ask (expects a reply).
    #[arg(long)]
    pub ask: bool,
    /// Reply to this message id.
    #[arg(long, value_name = "ID")]
    pub reply_to: Option<String>,
    /// The sending agent.
    #[arg(long, value_name = "A")]
    pub from_agent: Option<String>,
    /// The target agent on their machine.
    #[arg(long, value_name = "B")]
    pub to_agent: Option<String>,
    /// Subject (Agent Mail contacts).
    #[arg(long)]
    pub subject: Option<String>,
    /// Attach a file (repeatable; Agent Mail contacts). Its base name is sent as an inert name;
    /// its media type comes from the extension.
    #[arg(long, value_name = "PATH")]
    pub attach: Vec<std::path::PathBuf>,
}

/// `contact` subcommands.
#[derive(Debug, Subcommand)]
pub enum ContactCmd {
    /// Add a contact by address (and send them a hello).
    Add {
        /// Their address.
        address: String,
        /// Local name.
        #[arg(long)]
        name: Option<String>,
        /// Allowed kinds (comma-separated: send,ask,reply,list).
        #[arg(long, value_delimiter = ',')]
        allow: Option<Vec<String>>,
        /// Their relay, if not yours.
        #[arg(long)]
        relay: Option<String>,
        /// Do not send a hello.
        #[arg(long)]
        no_hello: bool,
    },
    /// List contacts.
    List,
    /// Pending contact requests.
    Requests,
    /// Accept a request, optionally under a name of your choosing.
    Accept {
        /// Contact name (as the request came in).
        name: String,
        /// The name to keep them under (refused if a contact already has it).
        #[arg(long = "as", value_name = "NEWNAME")]
        new_name: Option<String>,
    },
    /// Make B's channels part of A: one contact, one conversation. Refused unless both show the
    /// same verified safety number, or you compared B's safety number with them and repeat it.
    Merge {
        /// The contact kept (A).
        name: String,
        /// The contact merged into it (B).
        other: String,
        /// B's safety number, as the refusal prints it, after comparing it with them.
        #[arg(long)]
        confirm_safety_number: Option<String>,
    },
    /// Take one channel out of a contact into a contact of its own.
    Split {
        /// The contact (a person with several channels).
        name: String,
        /// The channel's protocol: letagents, agent-mail or stringcup.
        protocol: String,
    },
    /// Deny a request (the peer stays blocked until you unblock it).
    Deny {
        /// Contact name.
        name: String,
    },
    /// Block a contact: what it sends is dropped before any agent sees it (Agent Mail: at the
    /// relay too), and nothing is sent to it.
    Block {
        /// Contact name.
        name: String,
    },
    /// Unblock a contact.
    Unblock {
        /// Contact name.
        name: String,
    },
    /// Mark verified after comparing safety numbers (also accepts a changed key).
    Verify {
        /// Contact name.
        name: String,
    },
    /// Set the kinds a contact may send.
    Allow {
        /// Contact name.
        name: String,
        /// Kinds (comma-separated).
        #[arg(value_delimiter = ',')]
        kinds: Vec<String>,
    },
    /// Outbound mode for agent messages to this contact: auto, review, or default (the policy's).
    Review {
        /// Contact name.
        name: String,
        /// auto | review | default.
        mode: String,
    },
    /// Append a per-agent rule (first match decides).
    Rule {
        /// Contact name.
        name: String,
        /// allow | deny.
        action: String,
        /// Glob on their agent (`*`, `prefix*`, name).
        #[arg(long, default_value = "*")]
        from: String,
        /// Glob on our agent.
        #[arg(long, default_value = "*")]
        to: String,
    },
}

/// `topic` subcommands.
#[derive(Debug, Subcommand)]
pub enum TopicCmd {
    /// Create a topic with these Stringcup contacts.
    Create {
        /// Contact names.
        members: Vec<String>,
    },
    /// Send to every member of a topic.
    Send {
        /// The `tp-` id.
        topic: String,
        /// Text.
        text: String,
    },
    /// The topics this profile belongs to.
    List,
    /// Add Stringcup contacts to a topic you own.
    Add {
        /// The `tp-` id.
        topic: String,
        /// Contact names.
        #[arg(required = true)]
        members: Vec<String>,
    },
    /// Remove a contact from a topic you own.
    Remove {
        /// The `tp-` id.
        topic: String,
        /// Contact name.
        member: String,
    },
    /// Leave a topic you belong to.
    Leave {
        /// The `tp-` id.
        topic: String,
    },
    /// Delete a topic you own (messages already sent stay).
    Delete {
        /// The `tp-` id.
        topic: String,
    },
}

/// `agent` subcommands.
#[derive(Debug, Subcommand)]
pub enum AgentCmd {
    /// Register a local agent.
    Register {
        /// Name.
        name: String,
        /// Harness (claude-code, codex, mcp, cli).
        #[arg(long)]
        harness: Option<String>,
    },
    /// Unregister a local agent.
    Unregister {
        /// Name.
        name: String,
    },
    /// List local agents.
    List,
}

/// letmeknow group commands.
#[derive(Debug, Subcommand)]
pub enum GroupCmd {
    /// The session's groups.
    List {
        /// The group session (default: the only one).
        #[arg(long)]
        handle: Option<String>,
    },
    /// Send to a group.
    Send {
        /// The group.
        group: String,
        /// The text.
        text: String,
        /// Address one member (by their safety number).
        #[arg(long)]
        to: Option<String>,
        /// The message id this answers.
        #[arg(long)]
        reply_to: Option<String>,
        /// The group session (default: the only one).
        #[arg(long)]
        handle: Option<String>,
    },
    /// A message and N levels of its causal history.
    Read {
        /// The message id.
        id: String,
        /// Levels of history.
        #[arg(long, default_value_t = 0)]
        ancestors: u32,
        /// The group session (default: the only one).
        #[arg(long)]
        handle: Option<String>,
    },
    /// Members: name, safety number, who invited them.
    Members {
        /// The group.
        group: String,
        /// The group session (default: the only one).
        #[arg(long)]
        handle: Option<String>,
    },
    /// Leave a group (the others commit your removal).
    Leave {
        /// The group.
        group: String,
        /// The group session (default: the only one).
        #[arg(long)]
        handle: Option<String>,
    },
    /// Delete a group session: leave its groups, then erase its keys and its decrypted log.
    DeleteSession {
        /// The group session.
        handle: String,
    },
    /// Remove a member (by their safety number).
    Remove {
        /// The group.
        group: String,
        /// The member's safety number, as `group members` shows it.
        #[arg(value_name = "SAFETY_NUMBER")]
        fingerprint: String,
        /// The group session (default: the only one).
        #[arg(long)]
        handle: Option<String>,
    },
    /// Outbound mode of the agent's sends to a group: auto (sent at once), review (held for
    /// `review approve`), or default (the `policy --review` setting).
    Mode {
        /// The group.
        group: String,
        /// auto, review or default.
        #[arg(value_parser = ["auto", "review", "default"])]
        mode: String,
        /// The group session (default: the only one).
        #[arg(long)]
        handle: Option<String>,
    },
    /// Resume a group the loop guard paused (releases what it held).
    Resume {
        /// The group.
        group: String,
        /// The group session (default: the only one).
        #[arg(long)]
        handle: Option<String>,
    },
}

/// A file to attach: its base name (inert), media type from the extension, bytes as base64url.
fn read_attachment(path: &std::path::Path) -> Result<crate::api::AttachmentIn, ApiError> {
    let bad = |m: String| ApiError::new("invalid_input", m);
    let data = std::fs::read(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| bad(format!("{} names no file", path.display())))?;
    let media_type = crate::protocol::agent_mail::attachment::media_type_for(&name).to_owned();
    Ok(crate::api::AttachmentIn { name, media_type: Some(media_type), data: crate::util::b64u(&data) })
}

fn to_request(cmd: Command) -> Result<Request, ApiError> {
    Ok(match cmd {
        Command::Whoami => Request::Whoami,
        Command::Status => Request::Status,
        Command::Contact(c) => match c {
            ContactCmd::Add { address, name, allow, relay, no_hello } => {
                Request::ContactAdd { address, name, allow, relay, no_hello }
            }
            ContactCmd::List => Request::ContactList,
            ContactCmd::Requests => Request::ContactRequests,
            ContactCmd::Accept { name, new_name } => Request::ContactAccept { name, new_name },
            ContactCmd::Merge { name, other, confirm_safety_number } => {
                Request::ContactMerge { name, other, confirm_safety_number }
            }
            ContactCmd::Split { name, protocol } => Request::ContactSplit { name, protocol },
            ContactCmd::Deny { name } => Request::ContactDeny { name },
            ContactCmd::Block { name } => Request::ContactBlock { name },
            ContactCmd::Unblock { name } => Request::ContactUnblock { name },
            ContactCmd::Verify { name } => Request::ContactVerify { name },
            ContactCmd::Allow { name, kinds } => Request::ContactAllow { name, kinds },
            ContactCmd::Rule { name, action, from, to } => Request::ContactRule { name, from, to, action },
            ContactCmd::Review { name, mode } => Request::ContactReview { name, mode: Some(mode) },
        },
        Command::Send(a) => {
            let text = if a.text == "-" {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s).map_err(|e| ApiError::new("invalid_input", e.to_string()))?;
                s
            } else {
                a.text
            };
            if a.subject.is_some() || !a.attach.is_empty() {
                let attachments = a.attach.iter().map(|p| read_attachment(p)).collect::<Result<Vec<_>, _>>()?;
                return Ok(Request::MailSend {
                    contact: a.contact,
                    text,
                    subject: a.subject,
                    reply_to: a.reply_to,
                    attachments,
                });
            }
            let kind = if a.ask {
                "ask"
            } else if a.reply_to.is_some() {
                "reply"
            } else {
                "send"
            };
            Request::Send {
                contact: a.contact,
                text,
                kind: Some(kind.into()),
                reply_to: a.reply_to,
                from_agent: a.from_agent,
                to_agent: a.to_agent,
            }
        }
        Command::List { contact } => Request::List { contact },
        Command::Inbox { all, wait } => Request::Inbox { all, wait_secs: wait },
        Command::Show { id } => Request::Message { id },
        Command::Save { id, part, to } => {
            // The runtime may run elsewhere (a daemon): it gets the path as this shell means it.
            let to = if to.is_absolute() {
                to
            } else {
                std::env::current_dir().map_err(|e| ApiError::new("invalid_input", e.to_string()))?.join(to)
            };
            Request::MailSave { id, part, to: to.to_string_lossy().into_owned() }
        }
        Command::Settings { allow_local_networks } => {
            Request::Settings { allow_local_networks: allow_local_networks.map(|v| v == "on") }
        }
        Command::Log { search, limit } => Request::Log { search, limit: Some(limit) },
        Command::Agent(a) => match a {
            AgentCmd::Register { name, harness } => Request::AgentRegister { name, harness },
            AgentCmd::Unregister { name } => Request::AgentUnregister { name },
            AgentCmd::List => Request::AgentList,
        },
        Command::Flush => Request::Flush,
        Command::Topic(TopicCmd::Create { members }) => Request::TopicCreate { members },
        Command::Topic(TopicCmd::Send { topic, text }) => Request::TopicSend { topic, text },
        Command::Topic(TopicCmd::List) => Request::TopicList,
        Command::Topic(TopicCmd::Add { topic, members }) => Request::TopicAdd { topic, members },
        Command::Topic(TopicCmd::Remove { topic, member }) => Request::TopicRemove { topic, member: Some(member) },
        Command::Topic(TopicCmd::Leave { topic }) => Request::TopicRemove { topic, member: None },
        Command::Topic(TopicCmd::Delete { topic }) => Request::TopicDelete { topic },
        Command::RotateToken => Request::TokenRotate,
        Command::RotateStringcupKey => Request::StringcupKeyUpdate,
        Command::RotateMailKey => Request::MailRotate,
        Command::Mailbox { state } => match state.as_str() {
            "close" => Request::MailClose,
            _ => Request::MailOpen,
        },
        Command::Review(ReviewCmd::List) => Request::ReviewList,
        Command::Review(ReviewCmd::Approve { id }) => Request::ReviewApprove { id, text: None },
        Command::Review(ReviewCmd::Reject { id }) => Request::ReviewReject { id },
        Command::Policy { review, loop_limit, digest } => Request::Policy { review, loop_limit, digest_secs: digest },
        Command::Resume { contact } => Request::Resume { contact },
        Command::Dnd { state } => Request::Dnd {
            on: match state.as_str() {
                "on" => Some(true),
                "off" => Some(false),
                _ => None,
            },
        },
        Command::Lan { state } => Request::Lan {
            on: match state.as_str() {
                "on" => Some(true),
                "off" => Some(false),
                _ => None,
            },
        },
        Command::Relay(RelayCmd::List) => Request::RelayTrusted,
        Command::Relay(RelayCmd::Trust { url, cert_sha256 }) => Request::RelayTrust { url, cert_sha256 },
        Command::Relay(RelayCmd::Untrust { url }) => Request::RelayUntrust { url },
        Command::Relay(RelayCmd::Move { url, cert_sha256 }) => Request::RelayMove { url, cert_sha256 },
        Command::Asnet(a) => match a {
            AsnetCmd::Setup { service, mailbox, username, smtp, smtp_tls, smtp_auth, imap, imap_tls } => {
                let password = match std::env::var("SWITCHBOARD_ASNET_PASSWORD") {
                    Ok(p) if !p.is_empty() => p,
                    _ => {
                        let mut s = String::new();
                        std::io::stdin()
                            .read_to_string(&mut s)
                            .map_err(|e| ApiError::new("invalid_input", e.to_string()))?;
                        s.trim_end_matches(['\r', '\n']).to_owned()
                    }
                };
                Request::AsnetSetup {
                    service,
                    mailbox,
                    username,
                    password: crate::api::Secret(password),
                    smtp,
                    smtp_tls: Some(smtp_tls),
                    smtp_auth: Some(smtp_auth),
                    imap,
                    imap_tls: Some(imap_tls),
                }
            }
            AsnetCmd::Register { discovery } => Request::AsnetRegister { discovery },
            AsnetCmd::Lookup { id } => Request::AsnetLookup { member_id: id },
            AsnetCmd::Connect { id, scopes } => Request::AsnetConnect { member_id: id, scopes },
            AsnetCmd::Accept { request, scopes } => Request::AsnetAccept { request_id: request, scopes },
            AsnetCmd::Connections => Request::AsnetConnections,
            AsnetCmd::Disconnect { id } => Request::AsnetDisconnect { member_id: id },
            AsnetCmd::Status => Request::AsnetStatus,
        },
        Command::Join { link, handle } => Request::GroupJoin { handle, link, timeout_secs: None },
        Command::Group(g) => match g {
            GroupCmd::List { handle } => Request::GroupList { handle },
            GroupCmd::Send { group, text, to, reply_to, handle } => {
                Request::GroupSend { handle, group, text, to, reply_to }
            }
            GroupCmd::Read { id, ancestors, handle } => Request::GroupRead { handle, id, ancestors: Some(ancestors) },
            GroupCmd::Members { group, handle } => Request::GroupMembers { handle, group },
            GroupCmd::Leave { group, handle } => Request::GroupLeave { handle, group },
            GroupCmd::DeleteSession { handle } => Request::GroupSessionDelete { handle },
            GroupCmd::Remove { group, fingerprint, handle } => Request::GroupRemove { handle, group, fingerprint },
            GroupCmd::Mode { group, mode, handle } => Request::GroupMode { handle, group, mode },
            GroupCmd::Resume { group, handle } => Request::GroupResume { handle, group },
        },
        Command::Init { .. }
        | Command::Daemon { .. }
        | Command::Ui { .. }
        | Command::Pair { .. }
        | Command::Mcp { .. }
        | Command::Listen { .. }
        | Command::Invite { .. }
        | Command::Codex { .. }
        | Command::Hook { .. } => {
            return Err(ApiError::new("internal", "not a runtime request"));
        }
    })
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// What a DTO's `sender_auth` code means, in the words the fence uses.
fn sender_auth_text(v: &Value) -> Option<&'static str> {
    match v["sender_auth"].as_str()? {
        "signed_end_to_end" => Some("sender signed end to end"),
        "asserted_by_relay" => Some("sender asserted by the relay, not authenticated end to end"),
        _ => None,
    }
}

fn print_text(kind: &str, v: &Value) {
    match kind {
        "relay_move" => {
            let m = &v["move"];
            println!("moved from {} to {}: {}", s(m, "from"), s(m, "to"), s(m, "summary"));
            print_text("whoami", v);
        }
        "whoami" => {
            println!("name:      {}", s(v, "name"));
            println!("profile:   {}", s(v, "profile"));
            println!("keystore:  {}", s(v, "keystore"));
            let link = &v["contact_link"];
            println!("contact link (share this one):");
            println!("  {}", s(link, "link"));
            println!("  safety number:    {}", s(link, "safety_number"));
            println!("protocol addresses (advanced):");
            let la = &v["letagents"];
            println!("letagents address:  {}", s(la, "address"));
            println!("  mailbox id:       {}", s(la, "mailbox_id"));
            println!("  safety number:    {}", s(la, "safety_number"));
            println!("  relay:            {}", s(la, "relay"));
            let sc = &v["stringcup"];
            if sc.is_object() {
                println!("stringcup id:       {}", s(sc, "id"));
                println!("  safety number:    {}  (key {})", s(sc, "fingerprint_short"), s(sc, "fingerprint"));
            } else {
                println!("stringcup:          not registered (the relay has no /api/v2, or was unreachable)");
            }
            let am = &v["agent_mail"];
            println!("agent mail address: {}", s(am, "address"));
            println!(
                "  card:             nonce {}, {}",
                am["card_nonce"],
                if am["published"].as_bool() == Some(true) { "published" } else { "not yet published" }
            );
        }
        "contacts" => {
            let list = v.as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                println!("(none)");
            }
            for c in list {
                let mut flags = vec![s(&c, "state").to_owned()];
                if c["verified"].as_bool() == Some(true) {
                    flags.push("verified".into());
                }
                if c["nearby"].as_bool() == Some(true) {
                    flags.push("nearby".into());
                }
                if c["key_changed"].as_bool() == Some(true) {
                    flags.push(format!("KEY CHANGED (new safety number {})", s(&c, "new_safety_number")));
                }
                if c["blocked"].as_bool() == Some(true) {
                    flags.push(format!("BLOCKED ({} dropped)", c["blocked_dropped"]));
                }
                if let Some(a) = sender_auth_text(&c) {
                    flags.push(a.into());
                }
                if c["person"].as_bool() == Some(true) {
                    println!(
                        "{:<16} {:<10} {}  [{}]",
                        s(&c, "name"),
                        "person",
                        s(&c, "safety_number"),
                        flags.join(", ")
                    );
                    for ch in c["channels"].as_array().cloned().unwrap_or_default() {
                        println!("  via {:<10} as {:<20} [{}]", s(&ch, "protocol"), s(&ch, "name"), s(&ch, "state"));
                    }
                    continue;
                }
                let req = s(&c, "request");
                let req = if req.is_empty() { String::new() } else { format!(" says \"{req}\"") };
                println!(
                    "{:<16} {:<10} {}  [{}]{req}",
                    s(&c, "name"),
                    s(&c, "protocol"),
                    s(&c, "safety_number"),
                    flags.join(", ")
                );
            }
        }
        "contact" => {
            println!(
                "{} ({}): safety number {}  [{}{}{}]{}",
                s(v, "name"),
                s(v, "protocol"),
                s(v, "safety_number"),
                s(v, "state"),
                if v["verified"].as_bool() == Some(true) { ", verified" } else { "" },
                if v["blocked"].as_bool() == Some(true) { ", BLOCKED" } else { "" },
                sender_auth_text(v).map(|a| format!("; {a}")).unwrap_or_default()
            );
            for ch in v["channels"].as_array().cloned().unwrap_or_default() {
                println!(
                    "  via {:<10} as {:<20} [{}{}]",
                    s(&ch, "protocol"),
                    s(&ch, "name"),
                    s(&ch, "state"),
                    if ch["verified"].as_bool() == Some(true) { ", verified" } else { "" }
                );
            }
            if v["relay_block"]["told"].as_bool() == Some(false) {
                println!("warning: the relay was not told: {}", s(&v["relay_block"], "error"));
            }
        }
        // A queued message is safe in the outbox: say so, so nobody sends it again by hand.
        "message" if s(v, "state") == "queued" => {
            println!("{}  queued (kept in the outbox and retried until it goes out)", s(v, "id"))
        }
        "message" => println!("{}  {}", s(v, "id"), s(v, "state")),
        "inbox" => {
            for m in v.as_array().cloned().unwrap_or_default() {
                let agent = match (m["from_agent"].as_str(), m["to_agent"].as_str()) {
                    (Some(f), Some(t)) => format!(" ({f} -> {t})"),
                    (Some(f), None) => format!(" ({f})"),
                    (None, Some(t)) => format!(" (-> {t})"),
                    _ => String::new(),
                };
                let body = match &m["body"] {
                    Value::String(t) => t.clone(),
                    other => other.to_string(),
                };
                let re = m["reply_to"].as_str().map(|r| format!(" re {r}")).unwrap_or_default();
                let subject = m["subject"].as_str().map(|t| format!(" \"{t}\"")).unwrap_or_default();
                let auth = sender_auth_text(&m).map(|a| format!(" ({a})")).unwrap_or_default();
                println!("[{}] {}{auth}{agent} {}{re}{subject}: {body}", s(&m, "id"), s(&m, "from"), s(&m, "kind"));
            }
        }
        "log" => {
            for r in v.as_array().cloned().unwrap_or_default() {
                println!(
                    "{} {:<3} {:<9} {:<8} {:<10} {}{} {}",
                    r["at"],
                    s(&r, "direction"),
                    s(&r, "protocol"),
                    s(&r, "kind"),
                    s(&r, "state"),
                    s(&r, "message_id"),
                    match s(&r, "path") {
                        "" => String::new(),
                        p => format!(" via {p}"),
                    },
                    s(&r, "detail")
                );
            }
        }
        "dnd" => println!("do-not-disturb: {}", if v["dnd"].as_bool() == Some(true) { "on" } else { "off" }),
        "lan" => {
            let on = v["enabled"].as_bool() == Some(true);
            let running = v["running"].as_bool() == Some(true);
            println!(
                "lan: {}{}",
                if on { "on" } else { "off" },
                match (on, running) {
                    (true, true) => format!(" (node {})", v["peer_id"].as_str().unwrap_or("")),
                    (true, false) => " (starts with the daemon or the app)".to_owned(),
                    _ => String::new(),
                }
            );
            let nearby: Vec<&str> =
                v["nearby"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
            if running {
                println!("nearby: {}", if nearby.is_empty() { "nobody".to_owned() } else { nearby.join(", ") });
            }
        }
        "asnet_status" => {
            println!("asnet: {} -> {}", s(v, "mailbox"), s(v, "service"));
            println!("member: {}", v["member_id"].as_str().unwrap_or("(not registered)"));
            if let Some(e) = v["sync_error"].as_str().or(v["last_error"].as_str()).filter(|e| !e.is_empty()) {
                println!("error: {e}");
            }
            for c in v["challenges"].as_array().into_iter().flatten().filter(|c| c["state"] == "pending") {
                println!("challenge waiting for `review approve`: {} {}", s(c, "challenge_id"), c["action"]);
            }
            for i in v["invitations"].as_array().into_iter().flatten() {
                println!("invitation {} from {} offering {}", s(i, "request_id"), s(i, "from_member_id"), i["scopes"]);
            }
            for c in v["connections"].as_array().into_iter().flatten() {
                println!("connected: {} {}", s(c, "member_id"), c["scopes"]);
            }
            for w in v["warnings"].as_array().into_iter().flatten() {
                println!("warning ({}): {}", s(w, "kind"), s(w, "detail"));
            }
        }
        _ => println!("{}", serde_json::to_string_pretty(v).unwrap_or_default()),
    }
}

fn output_kind(cmd: &Command) -> &'static str {
    match cmd {
        Command::Whoami => "whoami",
        Command::Relay(RelayCmd::Move { .. }) => "relay_move",
        Command::Contact(ContactCmd::List | ContactCmd::Requests) => "contacts",
        Command::Contact(
            ContactCmd::Add { .. }
            | ContactCmd::Accept { .. }
            | ContactCmd::Verify { .. }
            | ContactCmd::Allow { .. }
            | ContactCmd::Block { .. }
            | ContactCmd::Merge { .. }
            | ContactCmd::Unblock { .. },
        ) => "contact",
        Command::Send(_) | Command::List { .. } => "message",
        Command::Inbox { .. } => "inbox",
        Command::Log { .. } => "log",
        Command::Dnd { .. } => "dnd",
        Command::Lan { .. } => "lan",
        Command::Asnet(AsnetCmd::Status) => "asnet_status",
        _ => "json",
    }
}

fn fail(json: bool, e: &ApiError) -> ExitCode {
    if json {
        eprintln!("{}", serde_json::json!({"error": e}));
    } else {
        eprintln!("error: {}", e.message);
    }
    ExitCode::FAILURE
}

async fn run(cli: Cli) -> Result<(), ApiError> {
    let profile = Profile::resolve(cli.home.clone()).map_err(|e| ApiError::new("profile", e.to_string()))?;
    let perr = |e: crate::profile::ProfileError| ApiError::new("profile", e.to_string());
    match cli.command {
        Command::Init { name, relay, relay_cert_sha256, keystore } => {
            let _lock = profile
                .try_lock()
                .map_err(perr)?
                .ok_or_else(|| ApiError::new("runtime_busy", "a runtime is using this profile"))?;
            let rt = Runtime::init(&profile, InitOptions { name, relay, relay_cert_sha256, keystore })
                .await
                .map_err(|e| e.to_api())?;
            let who = rt.handle(Request::Whoami, true).await.map_err(|e| e.to_api())?;
            if cli.json {
                println!("{who}")
            } else {
                print_text("whoami", &who)
            }
            Ok(())
        }
        Command::Daemon { ui } => daemon(profile, ui).await,
        Command::Ui { ui, keystore } => {
            crate::bridge::web::run_ui(profile, crate::bridge::web::UiOptions { dir: ui, keystore, json: cli.json })
                .await
        }
        Command::Mcp { agent, harness } => crate::bridge::mcp::serve_stdio(profile, &agent, &harness).await,
        Command::Listen { agent, harness, once, timeout, handle: None, name: None } => {
            listen(profile, &agent, &harness, once, timeout).await
        }
        Command::Listen { harness, once, timeout, handle, name, .. } => {
            listen_group(profile, handle, name, &harness, once, timeout).await
        }
        Command::Invite { group, handle } => {
            let conn = Conn::open(&profile).await?;
            let v = conn.call(Request::GroupInvite { handle, group, ttl_secs: None }).await?;
            let out = serde_json::json!({"group": v["group"], "link": v["link"], "expires_at": v["expires_at"]});
            if cli.json {
                println!("{out}");
            } else {
                println!("{}", s(&v, "link"));
                println!("group {}; single use, expires in 10 minutes", s(&v, "group"));
            }
            // With no runtime running, this process is the inviter's runtime: admit the join.
            if conn.is_local() {
                let admitted = conn.call(Request::GroupInviteWait { invite: s(&v, "invite").to_owned() }).await?;
                if !cli.json {
                    println!("admitted {} ({})", s(&admitted["joined"], "name"), s(&admitted["joined"], "fingerprint"));
                }
            }
            Ok(())
        }
        Command::Hook { agent, event } => hook(profile, &agent, &event).await,
        Command::Codex { agent, thread, cwd, socket, command } => {
            let opts = crate::bridge::codex::CodexOptions { agent, thread, cwd, command, socket };
            crate::bridge::codex::run(profile, opts, stop_signal()).await
        }
        Command::Pair { token, name, timeout } => {
            let conn = Conn::open(&profile).await?;
            let token = match token {
                Some(t) => t,
                None => {
                    let opened = conn.call(Request::PairOpen).await?;
                    let t = opened["token"].as_str().unwrap_or_default().to_owned();
                    if cli.json {
                        println!("{opened}");
                    } else {
                        println!("rendezvous token (hand it to the other side): {t}");
                        println!("waiting up to {timeout} s for them to join...");
                    }
                    t
                }
            };
            let paired = conn.call(Request::PairWait { token, name, timeout_secs: timeout }).await?;
            if cli.json {
                println!("{paired}");
            } else if paired["status"] == "paired" {
                println!(
                    "paired with {} as `{}`\nsafety number {} (key {})\ncompare it with them over a channel you trust, then: switchboard contact verify {}",
                    s(&paired, "peer_id"),
                    s(&paired, "contact"),
                    s(&paired, "fingerprint_short"),
                    s(&paired, "fingerprint"),
                    s(&paired, "contact")
                );
            } else {
                println!("not paired: {}", s(&paired, "detail"));
            }
            Ok(())
        }
        cmd => {
            let kind = output_kind(&cmd);
            let req = to_request(cmd)?;
            let conn = Conn::open(&profile).await?;
            if kind == "relay_move" && !cli.json {
                // What the move will do, before it does it (the UI asks; a command says).
                let plan = conn.call(Request::RelayMovePlan).await?;
                println!("moving: {}", s(&plan, "summary"));
            }
            let v = conn.call(req).await?;
            if cli.json {
                println!("{v}")
            } else {
                print_text(kind, &v)
            }
            Ok(())
        }
    }
}

/// Resolves when the process is asked to stop (Ctrl-C or SIGTERM).
async fn stop_signal() {
    let term = async {
        #[cfg(unix)]
        {
            if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                s.recv().await;
                return;
            }
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// The loop both `listen` modes share: ask the runtime with `req`, print the answer as the JSON
/// lines `lines` makes of it, and only once they are written and flushed ack the answer's lease
/// (1:1 deliveries or group deliveries alike). Killed before the ack, or unable to write, the
/// messages are handed out again once the lease expires, marked `redelivered`.
async fn listen_loop(
    session: &crate::bridge::session::AgentSession,
    once: bool,
    req: impl Fn() -> Request,
    lines: impl Fn(&Value) -> Vec<Value>,
) -> Result<(), ApiError> {
    use std::io::Write;
    loop {
        let v = session.call(req()).await?;
        let mut out = std::io::stdout().lock();
        for line in lines(&v) {
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                return Ok(());
            }
        }
        drop(out);
        if let Some(lease) = v["lease"].as_str() {
            session.call(Request::Ack { lease: lease.to_owned(), ids: None }).await?;
        }
        if once {
            return Ok(());
        }
    }
}

/// `line` with the fields of `item` added.
fn with_fields(mut line: Value, item: &Value) -> Value {
    if let (Some(o), Some(d)) = (line.as_object_mut(), item.as_object()) {
        o.extend(d.clone());
    }
    line
}

async fn listen(profile: Profile, agent: &str, harness: &str, once: bool, timeout: u64) -> Result<(), ApiError> {
    let session = crate::bridge::session::AgentSession::open(profile, agent, harness).await?;
    let wait = if once { timeout } else { 60 };
    let run = listen_loop(
        &session,
        once,
        || Request::Wait { agent: None, timeout_secs: wait, paused_seen: None },
        |v| {
            let list = v["deliveries"].as_array().cloned().unwrap_or_default();
            let head = serde_json::json!({"type": "message", "agent": agent, "unread": v["unread"]});
            list.iter().map(|d| with_fields(head.clone(), d)).collect()
        },
    );
    let result = tokio::select! {
        r = run => r,
        _ = stop_signal() => Ok(()),
    };
    session.close().await;
    result
}

/// `listen --handle/--name`: an agent session that is also a letmeknow member; prints its
/// session line, then its group deliveries (fenced peer text, steer or digest) as JSON lines,
/// acking each batch once printed.
async fn listen_group(
    profile: Profile,
    handle: Option<String>,
    name: Option<String>,
    harness: &str,
    once: bool,
    timeout: u64,
) -> Result<(), ApiError> {
    let handle = handle.unwrap_or_else(crate::engine::random_handle);
    let session = crate::bridge::session::AgentSession::open(profile, &handle, harness).await?;
    let run = async {
        let me = session.call(Request::GroupSession { handle: None, name }).await?;
        let line = serde_json::json!({"type": "session", "handle": me["handle"], "name": me["name"], "fingerprint": me["fingerprint"]});
        println!("{line}");
        let wait = if once { timeout.min(30) } else { 30 };
        listen_loop(
            &session,
            once,
            || Request::GroupDeliveries { handle: None, wait_secs: wait },
            |v| {
                let mut lines = Vec::new();
                if v["omitted"].as_u64().unwrap_or(0) > 0 {
                    lines.push(
                        serde_json::json!({"type": "omitted", "handle": handle, "count": v["omitted"], "note": v["note"]}),
                    );
                }
                let head = serde_json::json!({"type": "group", "handle": handle});
                let items = v["items"].as_array().cloned().unwrap_or_default();
                lines.extend(items.iter().map(|d| with_fields(head.clone(), d)));
                lines
            },
        )
        .await
    };
    let result = tokio::select! {
        r = run => r,
        _ = stop_signal() => Ok(()),
    };
    session.close().await;
    result
}

async fn hook(profile: Profile, agent: &str, event: &str) -> Result<(), ApiError> {
    use std::io::Write;
    let (req, name) = match event {
        "post-tool-use" => {
            (Request::Wait { agent: Some(agent.into()), timeout_secs: 0, paused_seen: None }, "PostToolUse")
        }
        "user-prompt-submit" => {
            (Request::Read { agent: Some(agent.into()), id: None, ancestors: None }, "UserPromptSubmit")
        }
        other => {
            return Err(ApiError::new(
                "invalid_input",
                format!("unknown hook event `{other}` (post-tool-use, user-prompt-submit)"),
            ));
        }
    };
    let conn = Conn::open(&profile).await?;
    let v = conn.call(req).await?;
    let list = v["deliveries"].as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        return Ok(());
    }
    let mut context = format!("[switchboard] {} message(s) for agent {agent} from peers:", list.len());
    for d in &list {
        context.push_str("\n\n");
        context.push_str(d["text"].as_str().unwrap_or_default());
    }
    let line = serde_json::json!({"hookSpecificOutput": {"hookEventName": name, "additionalContext": context}});
    let mut out = std::io::stdout().lock();
    let printed = writeln!(out, "{line}").and_then(|()| out.flush());
    drop(out);
    // Printed and flushed: Claude Code has the messages. Not printed, they come again after the
    // lease timeout.
    printed.map_err(|e| ApiError::new("io", format!("cannot write the hook output: {e}")))?;
    if let Some(lease) = v["lease"].as_str() {
        conn.call(Request::Ack { lease: lease.to_owned(), ids: None }).await?;
    }
    Ok(())
}

/// How long `switchboard daemon` waits for a one-shot command that holds the profile (such a
/// command runs its own runtime in-process and is done in moments; `inbox --wait` is the longest).
const DAEMON_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Takes the profile for the daemon. A runtime that serves a bridge (another daemon, the app)
/// refuses it at once; a one-shot command is waited for, up to [`DAEMON_LOCK_WAIT`].
async fn lock_for_daemon(profile: &Profile) -> Result<crate::profile::ProfileLock, ApiError> {
    let busy = |m: String| ApiError::new("runtime_busy", m);
    let deadline = std::time::Instant::now() + DAEMON_LOCK_WAIT;
    let mut told = false;
    loop {
        if let Some(lock) = profile.try_lock().map_err(|x| ApiError::new("profile", x.to_string()))? {
            return Ok(lock);
        }
        let holder = profile.lock_holder().map(|p| format!(" (pid {p})")).unwrap_or_default();
        let dir = profile.dir.display();
        if profile.read_bridge_files().is_some() {
            return Err(busy(format!(
                "another runtime{holder} already owns {dir} and serves its bridge; commands use it as it is"
            )));
        }
        if std::time::Instant::now() >= deadline {
            return Err(busy(format!(
                "another runtime{holder} has owned {dir} for {} s without a bridge; stop it and start the daemon again",
                DAEMON_LOCK_WAIT.as_secs()
            )));
        }
        if !told {
            eprintln!("switchboard daemon: waiting for the command{holder} using {dir} to finish");
            told = true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn daemon(profile: Profile, ui: Option<PathBuf>) -> Result<(), ApiError> {
    let e = |code: &str, m: String| ApiError::new(code, m);
    let _lock = lock_for_daemon(&profile).await?;
    let rt = Runtime::open(&profile).await.map_err(|x| x.to_api())?;
    // Listen for SIGTERM before the bridge files announce us: a client may signal at once.
    #[cfg(unix)]
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let ui = ui.map(|dir| crate::bridge::web::WebUi { dir: Some(dir), ..Default::default() });
    let bridge = crate::bridge::serve_with(rt.clone(), ui).await.map_err(|x| e("bridge", x.to_string()))?;
    let tasks = rt.start_background();
    println!("switchboard daemon: profile {} bridge http://{}", profile.dir.display(), bridge.addr);
    let term = async {
        #[cfg(unix)]
        if let Some(s) = sigterm.as_mut() {
            s.recv().await;
            return;
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    rt.shutdown();
    bridge.abort();
    profile.remove_bridge_files();
    for t in tasks {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), t).await;
    }
    Ok(())
}

/// Entry point of the `switchboard` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SWITCHBOARD_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let json = cli.json;
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            return fail(json, &ApiError::new("internal", e.to_string()));
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(json, &e),
    }
}
