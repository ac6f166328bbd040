//! Mailbox addresses (§3.3): the stable address `did:agent:<key>/mail/<mailbox_id>` and contact
//! addresses with one to eight `route` parameters; the fixed relay paths built from them.
//!
//! An address grants and proves nothing: its routes are only where to fetch a card, which must
//! then verify under the address's Agent ID and pass the pin rule.

use std::fmt;

use super::Id16;
use crate::protocol::agent_identity::agent_id::{AgentUrl, AgentUrlError};
use crate::protocol::agent_identity::origin::write_route_query;
use crate::protocol::agent_identity::{AgentId, Origin};

/// A parsed mailbox address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailAddress {
    /// The intended correspondent (trust it only if the address came from a trusted source).
    pub owner: AgentId,
    /// The mailbox.
    pub mailbox_id: Id16,
    /// Where the card may be fetched, in the sharer's order (empty for a stable address).
    pub routes: Vec<Origin>,
}

/// Why a string is not a mailbox address (the sharer's fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Not an Agent URL.
    #[error("{0}")]
    Url(#[from] AgentUrlError),
    /// An Agent URL, but not `/mail/<id16>`.
    #[error("not a mail address: the path must be /mail/<mailbox_id>")]
    NotMail,
    /// Not a card URL `https://<origin>/v1/mailboxes/<id16>/card`.
    #[error("not an Agent Mail card URL")]
    CardUrl,
}

impl MailAddress {
    /// Parses a stable or contact address.
    pub fn parse(text: &str) -> Result<Self, AddressError> {
        let url = AgentUrl::parse(text)?;
        let Some((protocol, resource)) = &url.resource else {
            return Err(AddressError::NotMail);
        };
        if protocol != "mail" {
            return Err(AddressError::NotMail);
        }
        let mailbox_id = Id16::parse(resource).ok_or(AddressError::NotMail)?;
        Ok(Self { owner: url.agent_id, mailbox_id, routes: url.routes })
    }

    /// The stable address (the pin key written as one string).
    pub fn stable(&self) -> String {
        format!("{}/mail/{}", self.owner, self.mailbox_id)
    }

    /// The card-read URLs of every route, in order.
    pub fn card_urls(&self) -> Vec<String> {
        self.routes.iter().map(|r| card_url(r, &self.mailbox_id)).collect()
    }
}

impl fmt::Display for MailAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.stable())?;
        write_route_query(f, &self.routes)
    }
}

/// `{route}/v1/mailboxes/{mailbox_id}/card`.
pub fn card_url(route: &Origin, mailbox_id: &Id16) -> String {
    format!("{route}/v1/mailboxes/{mailbox_id}/card")
}

/// `{route}/v1/mailboxes/{mailbox_id}/packets`.
pub fn packets_url(route: &Origin, mailbox_id: &Id16) -> String {
    format!("{route}/v1/mailboxes/{mailbox_id}/packets")
}

/// `{route}/v1/mailboxes`, where cards are published.
pub fn publish_url(route: &Origin) -> String {
    format!("{route}/v1/mailboxes")
}

/// Splits a card URL (a Profile `agent-mail` endpoint's `url`) into its route and mailbox.
pub fn parse_card_url(url: &str) -> Result<(Origin, Id16), AddressError> {
    let rest = url.strip_prefix("https://").ok_or(AddressError::CardUrl)?;
    let slash = rest.find('/').ok_or(AddressError::CardUrl)?;
    let (host, path) = rest.split_at(slash);
    let origin = Origin::parse(&format!("https://{host}")).map_err(|_| AddressError::CardUrl)?;
    let id = path.strip_prefix("/v1/mailboxes/").and_then(|p| p.strip_suffix("/card")).ok_or(AddressError::CardUrl)?;
    let mailbox_id = Id16::parse(id).ok_or(AddressError::CardUrl)?;
    Ok((origin, mailbox_id))
}
