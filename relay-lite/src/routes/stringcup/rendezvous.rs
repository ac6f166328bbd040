//! Rendezvous (B.6.1): two identities meet under a relay-issued `rv-` token.
//!
//! - `POST` without `token` mints one (only its SHA-256 is stored) and makes the caller the
//!   initiator; with `token`, a caller that already holds a claim keeps its role, anybody else
//!   becomes the responder, and a second identity for a held role gets `409`. `role` in the
//!   body is refused (`400`); a malformed token is `400`, an unknown or expired one `404`.
//! - `wait` parks the request like an inbox long-poll until the counterpart claims.
//! - `DELETE` releases the caller's own claim only.

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use serde::Deserialize;
use switchboard_core::protocol::stringcup::crypto;
use switchboard_core::util::{now_ms, sha256};

use super::wire::{ReleasedOut, RendezvousIn, RendezvousOut};
use super::{
    Caller, Other, SMALL_BODY, is_rendezvous_token, json_object, json_response, long_poll, new_rendezvous_token,
    parse_wait, utc,
};
use crate::AppState;
use crate::error::{Conflict, Error};
use crate::store::stringcup::{
    JoinOutcome, JoinRendezvous, OpenRendezvous, Opened, ReleaseRendezvous, Role, rendezvous_key,
};

const UNKNOWN_TOKEN: &str = "no such rendezvous: tokens are issued by the relay and expire";

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/api/v2/rendezvous", post(claim).delete(release).layer(DefaultBodyLimit::max(SMALL_BODY)))
}

/// The SHA-256 of a well-formed token, or `400`.
fn token_hash(token: &str) -> Result<[u8; 32], Error> {
    if !is_rendezvous_token(token) {
        return Err(Error::BadRequest(
            "token must be `rv-` followed by 32 lower-case base32 characters, exactly as the relay issued it".into(),
        ));
    }
    Ok(sha256(token.as_bytes()))
}

async fn claim(
    State(state): State<AppState>,
    caller: Caller<Other>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let req = json_object::<RendezvousIn>(
        body,
        SMALL_BODY,
        true,
        &[("role", "roles are derived: omit `token` to open a rendezvous, give it to join one")],
    )?;
    let wait = parse_wait(req.wait.as_ref(), None, state.limits().stringcup.long_poll_max_secs)?;
    let store = state.store().stringcup();
    let (minted, hash, role) = match req.token {
        None => {
            let mut opened = None;
            for _ in 0..4 {
                let token = new_rendezvous_token();
                let hash = sha256(token.as_bytes());
                let now = now_ms();
                let expires_ms = now.saturating_add(state.limits().stringcup.rendezvous_ttl_ms);
                let open = OpenRendezvous { token_hash: hash.to_vec(), identity: caller.id.clone(), now, expires_ms };
                match store.open_rendezvous(open).await? {
                    Opened::Opened => {
                        opened = Some((token, hash));
                        break;
                    }
                    Opened::TokenTaken => {}
                    Opened::NoCaller => return Err(Error::Unauthorized("unknown or revoked token")),
                }
            }
            let (token, hash) = opened.ok_or(Error::Unavailable)?;
            (Some(token), hash, Role::Initiator)
        }
        Some(token) => {
            let hash = token_hash(&token)?;
            let join = JoinRendezvous { token_hash: hash.to_vec(), identity: caller.id.clone(), now: now_ms() };
            match store.join_rendezvous(join).await?.0 {
                JoinOutcome::Unknown => return Err(Error::NotFound(UNKNOWN_TOKEN)),
                JoinOutcome::RoleTaken => return Err(Error::Conflict(Conflict::RoleTaken)),
                JoinOutcome::Holds(role) => (None, hash, role),
            }
        }
    };
    let me = caller.id.as_str();
    let pool = (&state.shared().stringcup.parking, me);
    let (row, long_poll_state) = long_poll(&state, pool, &rendezvous_key(&hash), wait, move || async move {
        let row = store.rendezvous(&hash, now_ms()).await?;
        // Done waiting once paired, or once there is nothing left to wait for.
        let ready = row.as_ref().is_none_or(|r| r.claims.len() == 2 || !r.claims.iter().any(|(_, who)| who == me));
        Ok((row, ready))
    })
    .await?;
    let row = row.ok_or(Error::NotFound(UNKNOWN_TOKEN))?;
    if !row.claims.iter().any(|(r, who)| *r == role && who == me) {
        return Err(Error::NotFound("you hold no claim under this token"));
    }
    let peer_id = row.claims.iter().find(|(r, _)| *r != role).map(|(_, who)| who.clone());
    let peer = match &peer_id {
        Some(id) => store.identity(id).await?,
        None => None,
    };
    let (peer_fingerprint, peer_fingerprint_short) =
        peer.as_ref().map(|p| (crypto::fingerprint(&p.public_key), crypto::fingerprint_short(&p.public_key))).unzip();
    let body = RendezvousOut {
        status: if peer.is_some() { "paired" } else { "waiting" }.into(),
        token: minted.clone(),
        role: role.as_str().into(),
        my_id: caller.id.clone(),
        peer_id: peer.as_ref().map(|p| p.id.clone()),
        peer_identity_public_key: peer.as_ref().map(|p| super::base64(&p.public_key)),
        peer_fingerprint,
        peer_fingerprint_short,
        expires_at: utc(row.expires_ms),
    };
    let status = if minted.is_some() { StatusCode::CREATED } else { StatusCode::OK };
    let mut response = json_response(status, &body);
    long_poll_state.apply(&mut response);
    Ok(response)
}

#[derive(Debug, Deserialize)]
struct ReleaseQuery {
    token: Option<String>,
}

async fn release(
    State(state): State<AppState>,
    caller: Caller<Other>,
    query: Result<Query<ReleaseQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let Query(query) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
    let req = json_object::<RendezvousIn>(body, SMALL_BODY, true, &[])?;
    let token = req
        .token
        .or(query.token)
        .ok_or_else(|| Error::BadRequest("give the token in the body (`token`) or the query".into()))?;
    let hash = token_hash(&token)?;
    let release = ReleaseRendezvous { token_hash: hash.to_vec(), identity: caller.id, now: now_ms() };
    match state.store().stringcup().release_rendezvous(release).await? {
        Some(role) => {
            Ok(json_response(StatusCode::OK, &ReleasedOut { status: "released".into(), role: role.as_str().into() }))
        }
        None => Err(Error::NotFound("you hold no claim under this token")),
    }
}
