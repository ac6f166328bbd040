//! The local-network policy for public fetches a peer's data points us at (Agent Mail §8.1: a
//! signed URL is not permission to reach private networks or local services).
//!
//! - [`is_local`] says which addresses count as local: loopback, private (RFC 1918), CGNAT
//!   (100.64.0.0/10), link-local, unique-local IPv6, unspecified (and their IPv4-mapped forms).
//! - [`guarded_client`] builds a client whose DNS resolver refuses a name when any address it
//!   resolves to is local, so the address checked is the address connected to (no second lookup
//!   between check and connect). A URL whose host is an IP literal never reaches a resolver;
//!   [`check_url`] checks it before the request.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::Url;

use super::TransportError;

/// What the user is told when a fetch is refused.
pub const REFUSED: &str = "this address points into a local network; allow local networks in settings to use it";

/// Whether `ip` is on a loopback, private, CGNAT, link-local, unique-local or unspecified range.
pub fn is_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_local_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_local_v4(v4),
            None => is_local_v6(v6),
        },
    }
}

fn is_local_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        // CGNAT, 100.64.0.0/10.
        || (a == 100 && (64..128).contains(&b))
        // "This network", 0.0.0.0/8.
        || a == 0
}

fn is_local_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        // Unique local, fc00::/7.
        || (first & 0xfe00) == 0xfc00
        // Link-local, fe80::/10.
        || (first & 0xffc0) == 0xfe80
}

/// Refuses `url` when its host is an IP literal on a local range (`localhost` too). A name is
/// left to the guarded resolver.
pub fn check_url(url: &Url) -> Result<(), TransportError> {
    let local = match url.host() {
        Some(url::Host::Ipv4(ip)) => is_local(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => is_local(IpAddr::V6(ip)),
        Some(url::Host::Domain(d)) => {
            d.eq_ignore_ascii_case("localhost") || d.to_ascii_lowercase().ends_with(".localhost")
        }
        None => false,
    };
    if local { Err(TransportError::LocalNetwork(REFUSED.into())) } else { Ok(()) }
}

/// A resolver that answers only when no resolved address is local.
#[derive(Debug, Clone, Copy, Default)]
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if addrs.is_empty() {
                return Err(format!("{host} resolves to no address").into());
            }
            if addrs.iter().any(|a| is_local(a.ip())) {
                return Err(Box::new(LocalRefused) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// The resolver's refusal, found again in a request error's causes.
#[derive(Debug, Clone, Copy)]
struct LocalRefused;

impl std::fmt::Display for LocalRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REFUSED)
    }
}

impl std::error::Error for LocalRefused {}

/// Whether `e` (a request error) is the guarded resolver's refusal.
pub fn is_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<LocalRefused>() || c.to_string() == REFUSED {
            return true;
        }
        cause = c.source();
    }
    false
}

/// A client for public fetches under the policy: web PKI (or `tls`), no redirects, and the
/// resolver that refuses local addresses.
pub fn guarded_client(tls: Option<rustls::ClientConfig>) -> Result<reqwest::Client, TransportError> {
    let tls = match tls {
        Some(t) => t,
        None => super::tls::client_config(None).map_err(|e| TransportError::Config(e.to_string()))?,
    };
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(PublicOnly))
        .build()
        .map_err(|e| TransportError::Config(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ranges_are_local_and_public_ones_are_not() {
        for local in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.1.1",
            "0.0.0.0",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_local(local.parse().unwrap()), "{local}");
        }
        for public in
            ["1.1.1.1", "100.63.255.255", "100.128.0.0", "172.32.0.1", "8.8.8.8", "2001:db8::1", "::ffff:8.8.8.8"]
        {
            assert!(!is_local(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn ip_literal_urls_are_checked_before_any_request() {
        assert!(check_url(&Url::parse("https://127.0.0.1:8443").unwrap()).is_err());
        assert!(check_url(&Url::parse("https://[fd00::1]").unwrap()).is_err());
        assert!(check_url(&Url::parse("https://localhost").unwrap()).is_err());
        assert!(check_url(&Url::parse("https://relay.example").unwrap()).is_ok());
        assert!(check_url(&Url::parse("https://93.184.216.34").unwrap()).is_ok());
    }

    #[tokio::test]
    async fn the_guarded_resolver_refuses_a_name_that_resolves_locally() {
        // `localhost` resolves to loopback through the system resolver, as any name could.
        let err = PublicOnly.resolve("localhost".parse().unwrap()).await.err().expect("refused");
        assert!(is_refusal(err.as_ref()), "{err}");
    }
}
