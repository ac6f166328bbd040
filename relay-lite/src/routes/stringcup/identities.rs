//! Identities and their tokens (B.1, B.5): registration with a relay-assigned id, updates by
//! token, exact lookup with fingerprints, token status and rotation.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};
use switchboard_core::protocol::stringcup::crypto;
use switchboard_core::util::{now_ms, sha256};

use super::wire::{IdentityOut, RegisterIn, Registered, RotatedOut, TokenOut, UpdateIn, UpdatedOut};
use super::{
    BudgetKind, Caller, Other, QuotaSlot, SMALL_BODY, base64, base64_exact, identity_id, json_object, json_response,
    new_api_token, new_identity_id, spend, utc,
};
use crate::AppState;
use crate::error::Error;
use crate::limits::IpLimiter;
use crate::store::stringcup::{IdentityRow, Register, Rotate, Update};

/// Longest display name, in characters.
const MAX_DISPLAY_NAME: usize = 100;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v2/identities", post(register).put(update).layer(DefaultBodyLimit::max(SMALL_BODY)))
        .route("/api/v2/identities/{id}", get(lookup))
        .route("/api/v2/tokens/current", get(current))
        .route("/api/v2/tokens/rotate", post(rotate))
}

/// The public record of `row`.
pub(super) fn identity_out(row: &IdentityRow) -> IdentityOut {
    let (fingerprint, fingerprint_short) =
        (crypto::fingerprint(&row.public_key), crypto::fingerprint_short(&row.public_key));
    IdentityOut {
        id: row.id.clone(),
        identity_public_key: base64(&row.public_key),
        algo: row.algo.clone(),
        display_name: (!row.display_name.is_empty()).then(|| row.display_name.clone()),
        fingerprint,
        fingerprint_short,
        key_updated_at: utc(row.key_updated_ms),
        created_at: utc(row.created_ms),
    }
}

fn check_algo(algo: Option<&str>) -> Result<(), Error> {
    match algo {
        None | Some("x25519") => Ok(()),
        Some(_) => Err(Error::BadRequest("algo must be `x25519`".into())),
    }
}

fn display_name(name: &str) -> Result<String, Error> {
    if name.chars().count() > MAX_DISPLAY_NAME || name.chars().any(char::is_control) {
        return Err(Error::BadRequest(format!(
            "display_name must be at most {MAX_DISPLAY_NAME} characters without control characters"
        )));
    }
    Ok(name.to_owned())
}

async fn register(
    State(state): State<AppState>,
    connect: Option<Extension<ConnectInfo<SocketAddr>>>,
    slot: Option<Extension<QuotaSlot>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    if let Some(Extension(ConnectInfo(peer))) = connect {
        let client = IpLimiter::key(peer.ip()).to_string();
        spend(&state, slot.as_ref().map(|Extension(s)| s), BudgetKind::Register, &client)?;
    }
    let req = json_object::<RegisterIn>(
        body,
        SMALL_BODY,
        false,
        &[("external_id", "the relay assigns identifiers; read yours from `id` in the answer")],
    )?;
    check_algo(req.algo.as_deref())?;
    let public_key = base64_exact("identity_public_key", &req.identity_public_key, 32)?;
    let display_name = display_name(req.display_name.as_deref().unwrap_or_default())?;
    // 120-bit ids and 256-bit tokens do not collide; the retry only makes that certain.
    for _ in 0..4 {
        let (id, api_token) = (new_identity_id(), new_api_token());
        let now = now_ms();
        let register = Register {
            id: id.clone(),
            public_key: public_key.clone(),
            display_name: display_name.clone(),
            token_hash: sha256(api_token.as_bytes()).to_vec(),
            now,
        };
        if state.store().stringcup().register(register).await? {
            tracing::debug!(identity = %id, "stringcup identity registered");
            let row = IdentityRow {
                id,
                public_key: public_key.clone(),
                algo: "x25519".into(),
                display_name: display_name.clone(),
                key_updated_ms: now,
                updated_ms: now,
                created_ms: now,
            };
            let body = Registered { identity: identity_out(&row), id_assigned: true, api_token };
            return Ok(json_response(StatusCode::CREATED, &body));
        }
    }
    Err(Error::Unavailable)
}

async fn update(
    State(state): State<AppState>,
    caller: Caller<Other>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let req = json_object::<UpdateIn>(
        body,
        SMALL_BODY,
        false,
        &[("external_id", "an identity's id never changes; the caller is identified by its token")],
    )?;
    check_algo(req.algo.as_deref())?;
    let public_key =
        req.identity_public_key.as_deref().map(|k| base64_exact("identity_public_key", k, 32)).transpose()?;
    let display_name = match &req.display_name {
        None => None,
        Some(serde_json::Value::Null) => Some(String::new()),
        Some(serde_json::Value::String(name)) => Some(display_name(name)?),
        Some(_) => return Err(Error::BadRequest("display_name must be a string or null".into())),
    };
    if public_key.is_none() && display_name.is_none() {
        return Err(Error::BadRequest("nothing to update: give identity_public_key and/or display_name".into()));
    }
    let update = Update { identity: caller.id, public_key, display_name, now: now_ms() };
    let updated =
        state.store().stringcup().update(update).await?.ok_or(Error::Unauthorized("unknown or revoked token"))?;
    let body = UpdatedOut {
        identity: identity_out(&updated.row),
        key_changed: updated.key_changed,
        updated_at: utc(updated.row.updated_ms),
    };
    Ok(json_response(StatusCode::OK, &body))
}

async fn lookup(State(state): State<AppState>, path: Result<Path<String>, PathRejection>) -> Result<Response, Error> {
    let Path(id) = path.map_err(|e| Error::BadRequest(e.body_text()))?;
    identity_id("identity id", &id)?;
    let row = state.store().stringcup().identity(&id).await?.ok_or(Error::NotFound("no such identity"))?;
    Ok(json_response(StatusCode::OK, &identity_out(&row)))
}

async fn current(State(state): State<AppState>, caller: Caller<Other>) -> Response {
    let ttl = state.limits().stringcup.token_inactivity_ms;
    let expires = caller.last_used_ms.saturating_add(ttl);
    let body = TokenOut {
        identity_id: caller.id,
        created_at: utc(caller.token_created_ms),
        last_used_at: utc(caller.last_used_ms),
        expires_at: utc(expires),
        expires_in_seconds: (expires.saturating_sub(now_ms()) / 1000).max(0),
        inactivity_ttl_days: ttl / (24 * 3600 * 1000),
        inactivity_ttl_seconds: ttl / 1000,
    };
    json_response(StatusCode::OK, &body)
}

async fn rotate(State(state): State<AppState>, caller: Caller<Other>) -> Result<Response, Error> {
    let api_token = new_api_token();
    let now = now_ms();
    let rotate = Rotate {
        identity: caller.id.clone(),
        old_hash: caller.token_hash.to_vec(),
        new_hash: sha256(api_token.as_bytes()).to_vec(),
        now,
    };
    // The old token is revoked in the same commit that stores the new one, before we answer.
    if !state.store().stringcup().rotate(rotate).await? {
        return Err(Error::Unauthorized("unknown or revoked token"));
    }
    let ttl = state.limits().stringcup.token_inactivity_ms;
    let body = RotatedOut {
        identity_id: caller.id,
        api_token,
        created_at: utc(now),
        expires_at: utc(now.saturating_add(ttl)),
        previous_token: "revoked".into(),
    };
    Ok(json_response(StatusCode::OK, &body))
}
