//! `did:agent:` Agent IDs (§3.2–3.3) and Agent URLs (§3.5).

use std::fmt;

use ed25519_dalek::SigningKey;

use super::encoding::{b64, b64_decode};
use super::origin::{Origin, OriginError, write_route_query};

/// The Agent ID prefix.
pub const AGENT_ID_PREFIX: &str = "did:agent:";
/// Most `route` parameters an Agent URL may carry.
pub const MAX_URL_ROUTES: usize = 8;

/// An Agent ID: the raw 32-byte Ed25519 public key, written `did:agent:<base64url>`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AgentId([u8; 32]);

/// Why a string is not an Agent ID (the sender's fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AgentIdError {
    /// The prefix is not exactly `did:agent:`.
    #[error("Agent ID does not start with did:agent:")]
    Prefix,
    /// The suffix is not canonical unpadded base64url.
    #[error("Agent ID key is not canonical base64url")]
    Encoding,
    /// The key is not 32 bytes.
    #[error("Agent ID key is not 32 bytes")]
    Length,
}

impl AgentId {
    /// Decodes an Agent ID (§3.3): exact prefix, canonical base64url, 32 bytes.
    pub fn parse(text: &str) -> Result<Self, AgentIdError> {
        let suffix = text.strip_prefix(AGENT_ID_PREFIX).ok_or(AgentIdError::Prefix)?;
        let bytes = b64_decode(suffix).ok_or(AgentIdError::Encoding)?;
        bytes.try_into().map(Self).map_err(|_| AgentIdError::Length)
    }

    /// The Agent ID of a raw public key.
    pub fn from_public_key(key: [u8; 32]) -> Self {
        Self(key)
    }

    /// The Agent ID of a signing key.
    pub fn of(key: &SigningKey) -> Self {
        Self(key.verifying_key().to_bytes())
    }

    /// The raw Ed25519 public key.
    pub fn public_key(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{AGENT_ID_PREFIX}{}", b64(&self.0))
    }
}

impl fmt::Debug for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AgentId({self})")
    }
}

/// A parsed Agent URL: `did:agent:<key>[/<protocol>/<resource>][?route=<origin>...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentUrl {
    /// The owning Agent ID.
    pub agent_id: AgentId,
    /// `(protocol, resource)` when the URL has a path.
    pub resource: Option<(String, String)>,
    /// Route hints in the sharer's order (unique, at most eight).
    pub routes: Vec<Origin>,
}

/// Why a string is not an Agent URL (the sharer's fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentUrlError {
    /// Non-ASCII, whitespace, a fragment or percent-encoding.
    #[error("Agent URL has forbidden characters")]
    Characters,
    /// The Agent ID part is malformed.
    #[error("Agent URL has a malformed Agent ID: {0}")]
    AgentId(#[from] AgentIdError),
    /// The path is not exactly `/<protocol>/<resource>` with valid segments.
    #[error("Agent URL path must be /<protocol>/<resource>")]
    Path,
    /// The query is empty or holds something other than `route=` parameters.
    #[error("Agent URL query must be one to eight route parameters")]
    Query,
    /// A route is not a serialized HTTPS origin.
    #[error("Agent URL route is not an origin: {0}")]
    Route(#[from] OriginError),
    /// A route appears twice.
    #[error("Agent URL repeats a route")]
    DuplicateRoute,
}

impl AgentUrl {
    /// Parses an Agent URL (§3.5).
    pub fn parse(text: &str) -> Result<Self, AgentUrlError> {
        if !text.bytes().all(|b| b.is_ascii_graphic()) || text.contains(['#', '%']) {
            return Err(AgentUrlError::Characters);
        }
        let (before_query, query) = match text.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (text, None),
        };
        let (id_text, path) = match before_query.split_once('/') {
            Some((id, p)) => (id, Some(p)),
            None => (before_query, None),
        };
        let agent_id = AgentId::parse(id_text)?;
        let resource = match path {
            None => None,
            Some(path) => {
                let (protocol, resource) = path.split_once('/').ok_or(AgentUrlError::Path)?;
                let protocol_ok = protocol.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
                    && protocol.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
                let resource_ok = !resource.is_empty()
                    && resource.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !protocol_ok || !resource_ok {
                    return Err(AgentUrlError::Path);
                }
                Some((protocol.to_owned(), resource.to_owned()))
            }
        };
        let mut routes: Vec<Origin> = Vec::new();
        if let Some(query) = query {
            for param in query.split('&') {
                let value = param.strip_prefix("route=").ok_or(AgentUrlError::Query)?;
                let origin = Origin::parse(value)?;
                if routes.contains(&origin) {
                    return Err(AgentUrlError::DuplicateRoute);
                }
                routes.push(origin);
            }
            if routes.is_empty() || routes.len() > MAX_URL_ROUTES {
                return Err(AgentUrlError::Query);
            }
        }
        Ok(Self { agent_id, resource, routes })
    }

    /// The stable form: the URL without its query. Two Agent URLs name the same resource exactly
    /// when their stable forms are equal.
    pub fn stable(&self) -> String {
        match &self.resource {
            Some((protocol, resource)) => format!("{}/{protocol}/{resource}", self.agent_id),
            None => self.agent_id.to_string(),
        }
    }
}

impl fmt::Display for AgentUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.stable())?;
        write_route_query(f, &self.routes)
    }
}
