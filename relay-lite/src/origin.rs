//! This relay's own public names, from configuration only: the authority a client signs as
//! `host` (letagents logins and acks) and the origin it names as a card route or a JWT `aud`
//! (Agent Mail). A request's `Host` header never decides what the relay is called: a login or a
//! token signed for another relay stays invalid here whatever `Host` it arrives with.
//!
//! - `--public-url URL` (repeatable, `"public-url": [...]` in `--config`) lists them, the first
//!   being the primary (used where the relay names itself, e.g. Agent Mail discovery);
//! - without it, a relay listening on loopback is `127.0.0.1:PORT` (or `[::1]:PORT`) and
//!   `localhost:PORT`, and one on a specific address is that `ADDR:PORT`; a relay on an
//!   unspecified address (`0.0.0.0`) has no name it could guess and refuses to start.
//!
//! Every name is checked independently of the request, so a TLS-terminating proxy may rewrite
//! `Host` freely.

use std::net::{IpAddr, SocketAddr};

use switchboard_core::protocol::agent_identity::Origin;
use url::Url;

/// Most public URLs one relay takes (each costs one signature check per refused login).
pub const MAX_PUBLIC_URLS: usize = 8;

/// A public URL that cannot name this relay.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PublicUrlError {
    /// Not a URL.
    #[error("public URL `{url}`: {reason}")]
    Malformed {
        /// The text given.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
    /// Neither `https` nor `http`.
    #[error("public URL `{0}` must be https:// (or http:// for a loopback relay)")]
    Scheme(String),
    /// Carries a path, query, fragment or credentials: a relay is named by scheme and authority.
    #[error("public URL `{0}` must be a bare origin like https://relay.example (no path, query or user)")]
    NotBare(String),
    /// Its authority is not an Agent Mail origin (a host this protocol cannot name).
    #[error("public URL `{url}` is not a usable origin: {reason}")]
    Origin {
        /// The text given.
        url: String,
        /// Why.
        reason: String,
    },
    /// More than [`MAX_PUBLIC_URLS`].
    #[error("at most {MAX_PUBLIC_URLS} public URLs")]
    TooMany,
    /// No URL was configured and the listening address names nothing a client could use.
    #[error(
        "listening on {0}, the relay cannot know the name clients use for it: give --public-url \
         (e.g. --public-url https://relay.example, repeatable)"
    )]
    Unnamed(SocketAddr),
}

/// One public name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PublicName {
    /// `scheme://authority`, as configured.
    url: String,
    /// `host[:port]`, the port left out when it is the scheme's default: what an HTTP client
    /// sends as `Host` and a letagents client signs.
    authority: String,
    /// `https://` + authority: the Agent Mail origin (a loopback relay on plain http still
    /// names itself by its https origin, as Switchboard's client does).
    origin: Origin,
}

/// This relay's public names: a primary and up to [`MAX_PUBLIC_URLS`]` - 1` others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicOrigins {
    primary: PublicName,
    others: Vec<PublicName>,
}

impl PublicOrigins {
    /// The names of the given URLs, first the primary; duplicates are dropped.
    pub fn parse<S: AsRef<str>>(urls: &[S]) -> Result<Self, PublicUrlError> {
        if urls.len() > MAX_PUBLIC_URLS {
            return Err(PublicUrlError::TooMany);
        }
        let mut names: Vec<PublicName> = Vec::with_capacity(urls.len());
        for text in urls {
            let name = parse_one(text.as_ref())?;
            if !names.iter().any(|n| n.authority == name.authority) {
                names.push(name);
            }
        }
        let mut names = names.into_iter();
        let primary = names
            .next()
            .ok_or_else(|| PublicUrlError::Malformed { url: String::new(), reason: "no public URL given".into() })?;
        Ok(Self { primary, others: names.collect() })
    }

    /// The names a relay bound to `addr` has without configuration: loopback gets its address
    /// and `localhost`, a specific address gets itself, an unspecified one none (an error).
    pub fn for_listen(addr: SocketAddr, tls: bool) -> Result<Self, PublicUrlError> {
        let scheme = if tls { "https" } else { "http" };
        let port = addr.port();
        let ip = match addr.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        if ip.is_unspecified() {
            return Err(PublicUrlError::Unnamed(addr));
        }
        let ip_text = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let mut urls = vec![format!("{scheme}://{ip_text}:{port}")];
        if ip.is_loopback() {
            urls.push(format!("{scheme}://localhost:{port}"));
        }
        Self::parse(&urls)
    }

    fn names(&self) -> impl Iterator<Item = &PublicName> {
        std::iter::once(&self.primary).chain(&self.others)
    }

    /// Whether `authority` (`host[:port]`) is one of this relay's names.
    pub fn has_authority(&self, authority: &str) -> bool {
        self.names().any(|n| n.authority.eq_ignore_ascii_case(authority))
    }

    /// Every authority, the primary first.
    pub fn authorities(&self) -> impl Iterator<Item = &str> {
        self.names().map(|n| n.authority.as_str())
    }

    /// Every Agent Mail origin, the primary first.
    pub fn origins(&self) -> impl Iterator<Item = &Origin> {
        self.names().map(|n| &n.origin)
    }

    /// The primary name's origin.
    pub fn primary_origin(&self) -> &Origin {
        &self.primary.origin
    }

    /// The primary URL (`scheme://authority`).
    pub fn primary_url(&self) -> &str {
        &self.primary.url
    }

    /// The name a `Host` header selects when it is one of ours, else the primary: only for
    /// answers that name the relay, never for verifying anything.
    fn addressed(&self, host: Option<&str>) -> &PublicName {
        host.and_then(|h| self.names().find(|n| n.authority.eq_ignore_ascii_case(h))).unwrap_or(&self.primary)
    }

    /// The URL (`scheme://authority`) a `Host` header selects (see `Self::addressed`).
    pub fn addressed_url(&self, host: Option<&str>) -> &str {
        &self.addressed(host).url
    }

    /// The Agent Mail origin a `Host` header selects (see `Self::addressed`).
    pub fn addressed_origin(&self, host: Option<&str>) -> &Origin {
        &self.addressed(host).origin
    }

    /// Every configured URL, the primary first.
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.names().map(|n| n.url.as_str())
    }
}

fn parse_one(text: &str) -> Result<PublicName, PublicUrlError> {
    let trimmed = text.trim_end_matches('/');
    let url =
        Url::parse(trimmed).map_err(|e| PublicUrlError::Malformed { url: text.to_owned(), reason: e.to_string() })?;
    let scheme = url.scheme();
    if scheme != "https" && scheme != "http" {
        return Err(PublicUrlError::Scheme(text.to_owned()));
    }
    if !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
        || !matches!(url.path(), "" | "/")
    {
        return Err(PublicUrlError::NotBare(text.to_owned()));
    }
    let host = match url.host() {
        Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
        Some(h) => h.to_string(),
        None => return Err(PublicUrlError::NotBare(text.to_owned())),
    };
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host,
    };
    let origin = Origin::parse(&format!("https://{authority}"))
        .map_err(|e| PublicUrlError::Origin { url: text.to_owned(), reason: e.to_string() })?;
    Ok(PublicName { url: format!("{scheme}://{authority}"), authority, origin })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_port_is_left_out_like_a_host_header() {
        let o = PublicOrigins::parse(&["https://Relay.Example:443/", "http://127.0.0.1:8470"]).unwrap();
        assert_eq!(o.authorities().collect::<Vec<_>>(), ["relay.example", "127.0.0.1:8470"]);
        assert_eq!(o.primary_origin().as_str(), "https://relay.example");
        assert_eq!(o.origins().nth(1).unwrap().as_str(), "https://127.0.0.1:8470");
        assert!(o.has_authority("RELAY.example"));
        assert!(!o.has_authority("relay.example:8443"));
        assert_eq!(o.addressed_url(Some("127.0.0.1:8470")), "http://127.0.0.1:8470");
        assert_eq!(o.addressed_url(Some("evil.example")), "https://relay.example");
        assert_eq!(o.addressed_origin(None).as_str(), "https://relay.example");
    }

    #[test]
    fn loopback_listen_names_the_address_and_localhost() {
        let o = PublicOrigins::for_listen("127.0.0.1:8470".parse().unwrap(), false).unwrap();
        assert_eq!(o.authorities().collect::<Vec<_>>(), ["127.0.0.1:8470", "localhost:8470"]);
        assert_eq!(o.primary_url(), "http://127.0.0.1:8470");
        let v6 = PublicOrigins::for_listen("[::1]:9".parse().unwrap(), true).unwrap();
        assert_eq!(v6.authorities().collect::<Vec<_>>(), ["[::1]:9", "localhost:9"]);
    }

    #[test]
    fn specific_address_names_itself_and_unspecified_names_nothing() {
        let o = PublicOrigins::for_listen("198.18.0.2:8443".parse().unwrap(), true).unwrap();
        assert_eq!(o.authorities().collect::<Vec<_>>(), ["198.18.0.2:8443"]);
        let any: SocketAddr = "0.0.0.0:443".parse().unwrap();
        assert_eq!(PublicOrigins::for_listen(any, true), Err(PublicUrlError::Unnamed(any)));
    }

    #[test]
    fn urls_that_are_not_bare_origins_are_refused() {
        for bad in ["https://relay.example/path", "https://u@relay.example", "https://relay.example?x=1"] {
            assert!(matches!(PublicOrigins::parse(&[bad]), Err(PublicUrlError::NotBare(_))), "{bad}");
        }
        assert!(matches!(PublicOrigins::parse(&["ftp://relay.example"]), Err(PublicUrlError::Scheme(_))));
        assert!(matches!(PublicOrigins::parse(&["not a url"]), Err(PublicUrlError::Malformed { .. })));
        assert_eq!(PublicOrigins::parse(&["https://a.example"; 9]), Err(PublicUrlError::TooMany));
    }
}
