//! Agent Mail §8.1's local-network policy for public card fetches from an address's routes: a
//! route into a local network is fetched only when the profile allows local networks.
//!
//! The setting is the `allow_local_networks` meta value (`1`/`0`). Unset, local networks are
//! allowed exactly when the profile's own relay is itself on a loopback or private address (the
//! same-network use Switchboard is made for); otherwise they must be allowed explicitly.

use std::net::IpAddr;

use crate::engine::{Result, Runtime};
use crate::protocol::agent_identity::Origin;
use crate::transport::TransportError;
use crate::transport::agent_mail::MailClient;
use crate::transport::local_net::{check_url, guarded_client, is_local};

use super::AmState;
use super::cards::mail_client;

/// The meta key of the setting.
pub(in crate::engine) const SETTING: &str = "allow_local_networks";

/// The explicit setting, if the user made one.
pub(in crate::engine) async fn setting(rt: &Runtime) -> Result<Option<bool>> {
    Ok(rt.store().meta(SETTING).await?.and_then(|v| match v.as_str() {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }))
}

/// The profile settings, after setting `allow_local_networks` when given.
pub(in crate::engine) async fn settings(rt: &Runtime, allow_local_networks: Option<bool>) -> Result<serde_json::Value> {
    if let Some(allow) = allow_local_networks {
        rt.store().set_meta(SETTING, if allow { "1" } else { "0" }).await?;
    }
    let explicit = setting(rt).await?;
    Ok(serde_json::json!({
        "allow_local_networks": allowed(rt).await?,
        "allow_local_networks_default": explicit.is_none(),
    }))
}

/// Whether card fetches may go into local networks now.
pub(in crate::engine) async fn allowed(rt: &Runtime) -> Result<bool> {
    match setting(rt).await? {
        Some(explicit) => Ok(explicit),
        None => Ok(own_relay_is_local(&rt.relay_url()).await),
    }
}

/// Whether the profile's relay is on a loopback or private address (every address its host
/// resolves to, for a name).
pub(in crate::engine) async fn own_relay_is_local(relay_url: &str) -> bool {
    let Ok(url) = url::Url::parse(relay_url) else { return false };
    match url.host() {
        Some(url::Host::Ipv4(ip)) => is_local(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => is_local(IpAddr::V6(ip)),
        Some(url::Host::Domain(d)) => {
            let port = url.port_or_known_default().unwrap_or(443);
            match tokio::net::lookup_host((d, port)).await {
                Ok(addrs) => {
                    let addrs: Vec<_> = addrs.collect();
                    !addrs.is_empty() && addrs.iter().all(|a| is_local(a.ip()))
                }
                Err(_) => false,
            }
        }
        None => false,
    }
}

/// The client a card is fetched with from `route`: the usual one when local networks are
/// allowed; otherwise one that refuses local addresses (an IP literal before any request, a
/// name in the resolver the connection uses).
pub(super) fn card_client(rt: &Runtime, st: &AmState, route: &Origin, allow_local: bool) -> Result<MailClient> {
    if allow_local {
        return mail_client(rt, st, route);
    }
    // Our own origin is reached at the relay URL the profile was made with, pinned as usual.
    let (base, tls) = if *route == st.origin {
        (rt.relay_url(), Some(rt.relay().tls_config()))
    } else {
        (route.as_str().to_owned(), None)
    };
    let url = url::Url::parse(&base).map_err(|e| TransportError::Config(format!("route URL: {e}")))?;
    check_url(&url)?;
    Ok(MailClient::new(&base, guarded_client(tls)?))
}
