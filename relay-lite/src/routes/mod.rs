//! The HTTP surface: one module per protocol, merged into one router that shares [`AppState`],
//! behind the per-IP rate limit; unknown paths get the JSON `404`.

pub mod agent_mail;
pub mod letagents;
pub mod letmeknow;
pub mod stringcup;

use std::net::SocketAddr;
use std::time::Instant;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::error::Error;
use crate::limits::retry_after_secs;

/// Every route of every protocol.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(agent_mail::routes(&state))
        .merge(letagents::routes(&state))
        .merge(letmeknow::routes(&state))
        .merge(stringcup::routes(&state))
        .fallback(no_route)
        .layer(middleware::from_fn_with_state(state.clone(), crate::conn::body_guard))
        .layer(middleware::from_fn_with_state(state.clone(), ip_limit))
        .with_state(state)
}

async fn no_route() -> Error {
    Error::NoRoute
}

/// Counts every request against its client address before anything else runs (before the body
/// is read). Without `ConnectInfo` (a router used in-process) there is no address to count.
async fn ip_limit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(ConnectInfo(peer)) = request.extensions().get::<ConnectInfo<SocketAddr>>()
        && let Err(wait) = state.shared().ip_rate.check(peer.ip(), Instant::now())
    {
        let retry_after_secs = retry_after_secs(wait);
        let response = Error::RateLimited { retry_after_secs }.into_response();
        if agent_mail::is_agent_mail_path(request.uri().path()) {
            return agent_mail::identity_shaped(response).await;
        }
        return response;
    }
    next.run(request).await
}

/// The request's `Host`, only to pick which of this relay's own names an answer that names
/// the relay uses (a discovery document, an invite page). Never used to verify anything:
/// signatures and tokens are checked against the configured names ([`crate::origin`]).
pub(crate) fn host_hint(headers: &HeaderMap) -> Option<&str> {
    headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok())
}
