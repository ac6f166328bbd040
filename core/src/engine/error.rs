//! The engine's errors: one enum, every variant documented, each saying whose fault it is
//! ([`Fault`]) and carrying a stable code. Clients see `{code, message}` ([`Error::to_api`]);
//! the codes and messages are a contract (CLI, bridge, MCP, UI) and do not change when a
//! variant is split for precision: several variants share `invalid_input`.
//!
//! Protocol errors convert with `?` (`#[from]`) and keep their own message, so the engine does
//! not flatten them into strings.

use crate::api::ApiError;
use crate::identity::keystore::KeystoreError;
use crate::mls::MlsError;
use crate::protocol::agent_mail::attachment::AttachmentError;
use crate::protocol::agent_mail::card::PinError;
use crate::protocol::{agent_mail, letagents, letmeknow, stringcup};
use crate::store::StoreError;
use crate::transport::TransportError;

/// Who is at fault when an operation fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The caller (the operator, an agent, a script) asked for something invalid or not allowed.
    Caller,
    /// A peer sent something we refuse.
    Peer,
    /// The relay failed, was unreachable, or served something inconsistent.
    Relay,
    /// Local state: the disk, the database, the keystore, profile files.
    Local,
    /// Something that cannot happen did.
    Bug,
}

/// Engine errors, each with a stable code for clients.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `init` has not run for this profile.
    #[error("profile not initialised: run `switchboard init --name NAME --relay URL`")]
    NotInitialized,
    /// `init` already ran.
    #[error("profile already initialised")]
    AlreadyInitialized,
    /// No such contact.
    #[error("no contact named `{0}`")]
    UnknownContact(String),
    /// The name or peer is already a contact.
    #[error("{0}")]
    ContactExists(String),
    /// Sending is blocked until the user re-verifies.
    #[error("{0}'s key changed: compare the new safety number and run `switchboard contact verify {0}` before sending")]
    KeyChanged(String),
    /// The contact has not been accepted.
    #[error("`{0}` is a pending request: accept it first")]
    Pending(String),
    /// The owner blocked this contact: nothing is sent to it or taken from it.
    #[error("`{0}` is blocked: run `switchboard contact unblock {0}` first")]
    Blocked(String),
    /// The caller gave something invalid.
    #[error("{0}")]
    Invalid(String),
    /// A merge of two contacts whose safety numbers the owner has not compared (or that are not
    /// both verified and equal): the message prints both numbers and how to confirm.
    #[error(
        "`{a}` and `{b}` are not known to be the same person. Compare both safety numbers with them over a channel you trust:\n  {a}: {a_number}\n  {b}: {b_number}\nIf they are the same person: switchboard contact merge {a} {b} --confirm-safety-number '{b_number}'"
    )]
    SafetyNumberUnconfirmed {
        /// The contact kept.
        a: String,
        /// Its safety number.
        a_number: String,
        /// The contact merged in.
        b: String,
        /// Its safety number (what the confirmation must repeat).
        b_number: String,
    },
    /// The caller gave a malformed letagents address.
    #[error(transparent)]
    Address(#[from] letagents::address::AddressError),
    /// The caller gave a malformed Agent Mail address.
    #[error("mail address: {0}")]
    MailAddress(#[from] agent_mail::address::AddressError),
    /// The caller gave a contact link that is malformed or forged (its sharer's fault, or a
    /// forger's).
    #[error(transparent)]
    ContactLink(#[from] crate::protocol::contact_link::LinkError),
    /// The caller gave a malformed letmeknow invite link.
    #[error(transparent)]
    InviteLink(#[from] letmeknow::invite::InviteError),
    /// A letagents message the caller composed breaks the protocol's rules.
    #[error(transparent)]
    LetagentsMessage(#[from] letagents::inner::InnerError),
    /// An Agent Mail message the caller composed breaks the protocol's rules.
    #[error(transparent)]
    MailMessage(#[from] agent_mail::message::MessageError),
    /// A letagents envelope could not be sealed (too large, or an unusable pinned key).
    #[error(transparent)]
    LetagentsSeal(#[from] letagents::envelope::SealError),
    /// A Stringcup message could not be sealed to the pinned key.
    #[error(transparent)]
    StringcupSeal(#[from] stringcup::crypto::SealError),
    /// An Agent Mail packet could not be sealed to the recipient's card.
    #[error(transparent)]
    MailSeal(#[from] agent_mail::packet::SealError),
    /// Files to send, or an attachment asked for, break a rule (see the variant).
    #[error(transparent)]
    Attachment(#[from] agent_mail::attachment::AttachmentError),
    /// A mailbox card failed the pin rule and no card was pinned before.
    #[error("card refused: {0}")]
    CardRefused(#[from] PinError),
    /// A peer's input (MLS message, join request, Welcome) is malformed or does not verify.
    #[error("{0}")]
    Peer(String),
    /// The relay served something inconsistent with what was asked (another mailbox's card, no
    /// Welcome in time).
    #[error("{0}")]
    RelayServed(String),
    /// No group member has the fingerprint the caller named.
    #[error("no member has fingerprint {0}")]
    UnknownMember(String),
    /// No message with that id.
    #[error("no message with id `{0}`")]
    UnknownMessage(String),
    /// No session of this profile is (or was) in that group.
    #[error("you are not in group {0}")]
    UnknownGroup(String),
    /// Local storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The keystore failed.
    #[error(transparent)]
    Keystore(#[from] KeystoreError),
    /// The relay failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Profile files.
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
    /// The LAN layer could not start (its socket or mDNS; local).
    #[error(transparent)]
    Lan(#[from] crate::transport::lan::LanError),
    /// The ASNET account's mail server (SMTP or IMAP) could not be reached or refused us.
    #[error("mail server: {0}")]
    MailServer(String),
    /// ASNET is not set up for this profile.
    #[error("ASNET is not set up: run `switchboard asnet setup` first")]
    AsnetNotSetUp,
    /// Something that cannot happen did.
    #[error("internal error: {0}")]
    Bug(String),
    /// The caller (an agent session) may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The loop guard paused this conversation until the operator resumes it.
    #[error("{0}")]
    LoopGuard(String),

    /// The relay at `url` presented a certificate that is neither valid in the web PKI nor
    /// pinned (by the profile, by a contact's signed LAN announcement, or by the owner). The
    /// owner may trust it after comparing its SHA-256 with the relay's host (`relay trust`).
    #[error(
        "the relay at {url} presented a certificate this profile does not trust (SHA-256 {cert_sha256}); if that is the relay you expect, trust it with: switchboard relay trust {url} {cert_sha256}"
    )]
    UntrustedRelay {
        /// The relay's URL.
        url: String,
        /// The SHA-256 (hex) of the certificate it presented.
        cert_sha256: String,
    },

    /// The contact's protocol has no place for part of the message, which would silently be lost.
    #[error("{protocol} carries only the text, so {what} would not reach the peer: send it as a plain message")]
    NotCarried { protocol: &'static str, what: &'static str },
}

impl Error {
    /// The stable code clients see.
    pub fn code(&self) -> &'static str {
        match self {
            Error::NotInitialized => "not_initialized",
            Error::AlreadyInitialized => "already_initialized",
            Error::UnknownContact(_) => "unknown_contact",
            Error::ContactExists(_) => "contact_exists",
            Error::KeyChanged(_) => "key_changed",
            Error::Pending(_) => "pending_contact",
            Error::Blocked(_) => "blocked_contact",
            Error::SafetyNumberUnconfirmed { .. } => "safety_number_unconfirmed",
            Error::Invalid(_)
            | Error::Address(_)
            | Error::MailAddress(_)
            | Error::InviteLink(_)
            | Error::LetagentsMessage(_)
            | Error::MailMessage(_)
            | Error::LetagentsSeal(_)
            | Error::StringcupSeal(_)
            | Error::MailSeal(_)
            | Error::CardRefused(_)
            | Error::Peer(_)
            | Error::RelayServed(_)
            | Error::UnknownMember(_)
            | Error::NotCarried { .. } => "invalid_input",
            Error::Attachment(AttachmentError::NoSuchPart { .. }) => "unknown_message",
            Error::Attachment(AttachmentError::StorageFull(_) | AttachmentError::Write { .. }) => "store",
            Error::Attachment(_) => "invalid_input",
            Error::Transport(crate::transport::TransportError::LocalNetwork(_)) => "local_network",
            Error::ContactLink(_) => "invalid_contact_link",
            Error::UnknownMessage(_) => "unknown_message",
            Error::UnknownGroup(_) => "unknown_group",
            Error::Store(StoreError::DiskFull(_)) => "disk_full",
            Error::Store(_) => "store",
            Error::Keystore(_) => "keystore",
            Error::Transport(_) => "relay",
            Error::Profile(_) => "profile",
            Error::Lan(_) => "lan",
            Error::MailServer(_) => "mail_server",
            Error::AsnetNotSetUp => "not_set_up",
            Error::Bug(_) => "internal",
            Error::Forbidden(_) => "forbidden",
            Error::UntrustedRelay { .. } => "untrusted_relay",
            Error::LoopGuard(_) => "loop_guard",
        }
    }

    /// Whose fault it is.
    pub fn fault(&self) -> Fault {
        match self {
            Error::NotInitialized
            | Error::AlreadyInitialized
            | Error::UnknownContact(_)
            | Error::ContactExists(_)
            | Error::KeyChanged(_)
            | Error::Pending(_)
            | Error::Blocked(_)
            | Error::Invalid(_)
            | Error::SafetyNumberUnconfirmed { .. }
            | Error::Address(_)
            | Error::MailAddress(_)
            | Error::InviteLink(_)
            | Error::LetagentsMessage(_)
            | Error::MailMessage(_)
            | Error::LetagentsSeal(_)
            | Error::MailSeal(_)
            | Error::UnknownMember(_)
            | Error::UnknownMessage(_)
            | Error::UnknownGroup(_)
            | Error::Forbidden(_)
            | Error::LoopGuard(_)
            | Error::NotCarried { .. }
            | Error::AsnetNotSetUp => Fault::Caller,
            // The key we seal to is the one the peer published.
            Error::StringcupSeal(_) | Error::CardRefused(_) | Error::Peer(_) => Fault::Peer,
            Error::Attachment(AttachmentError::StorageFull(_) | AttachmentError::Write { .. }) => Fault::Local,
            Error::Attachment(_) => Fault::Caller,
            // The user's own setting refused what a peer's address points at.
            Error::Transport(crate::transport::TransportError::LocalNetwork(_)) => Fault::Caller,
            // A link is the sharer's word: damaged or forged, it is theirs (or a forger's).
            Error::ContactLink(_) => Fault::Peer,
            // The user's own mail server stands where a relay stands for the other protocols.
            Error::RelayServed(_) | Error::Transport(_) | Error::MailServer(_) => Fault::Relay,
            // The relay's certificate is not one anyone this profile trusts vouched for.
            Error::UntrustedRelay { .. } => Fault::Relay,
            Error::Store(_) | Error::Keystore(_) | Error::Profile(_) | Error::Lan(_) => Fault::Local,
            Error::Bug(_) => Fault::Bug,
        }
    }

    /// As it crosses to clients.
    pub fn to_api(&self) -> ApiError {
        let data = match self {
            Error::UntrustedRelay { url, cert_sha256 } => {
                Some(serde_json::json!({"url": url, "cert_sha256": cert_sha256}))
            }
            _ => None,
        };
        ApiError { data, code: self.code().into(), message: self.to_string() }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Store(e.into())
    }
}

impl From<MlsError> for Error {
    /// Input from a peer or the relay that MLS refuses is the peer's; damaged local state or a
    /// refused operation in our own state is a bug.
    fn from(e: MlsError) -> Self {
        match e {
            MlsError::Peer(_) | MlsError::Unprocessable(_) => Error::Peer(e.to_string()),
            MlsError::Corrupt(_) | MlsError::Local(_) => Error::Bug(e.to_string()),
        }
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_errors_keep_the_code_and_message_clients_saw_as_invalid_input() {
        let e: Error = letagents::Address::parse("la1.nope").map(|_| ()).unwrap_err().into();
        let before = Error::Invalid(letagents::Address::parse("la1.nope").map(|_| ()).unwrap_err().to_string());
        assert_eq!(e.to_api(), before.to_api());
        assert_eq!(e.fault(), Fault::Caller);

        let e: Error = agent_mail::MailAddress::parse("nope").map(|_| ()).unwrap_err().into();
        let parse = agent_mail::MailAddress::parse("nope").map(|_| ()).unwrap_err();
        assert_eq!(e.to_api(), Error::Invalid(format!("mail address: {parse}")).to_api());
    }

    #[test]
    fn mls_errors_say_whether_the_peer_or_we_are_at_fault() {
        let peer: Error = MlsError::Peer("bad signature".into()).into();
        assert_eq!((peer.code(), peer.fault()), ("invalid_input", Fault::Peer));
        assert_eq!(peer.to_string(), MlsError::Peer("bad signature".into()).to_string());
        let ours: Error = MlsError::Corrupt("snapshot".into()).into();
        assert_eq!((ours.code(), ours.fault()), ("internal", Fault::Bug));
    }

    #[test]
    fn unknown_member_reads_as_before() {
        let e = Error::UnknownMember("ab12".into());
        assert_eq!(e.to_api(), Error::Invalid("no member has fingerprint ab12".into()).to_api());
    }
}
