//! letmeknow group log and invite API, as `specs/letmeknow-relay.md` fixes it.
//!
//! - `POST /g/{gid}/messages` (raw MLSMessage, at most 256 KiB): only the PrivateMessage header
//!   is read (`400` otherwise, or when its group id is not the path's); the epoch
//!   compare-and-set runs in the writer's transaction: `409 {"epoch"}` at a wrong epoch, else
//!   `200 {"seq"}`; a commit advances the epoch.
//! - `GET /g/{gid}/messages?after=N&wait=S`: up to 500 entries above `N`, held up to 30 s until
//!   the writer publishes a new seq for the group.
//! - `GET /i/{id}`: join instructions as text; `PUT /i/{id}` creates the invite (`201`, `409`,
//!   `400`); `POST /i/{id}/join` once (`204`, `409`); `POST /i/{id}/welcome` with the owner's
//!   bearer token (`403`), after a join and once (`409`); `GET /i/{id}/join|welcome?wait=S`
//!   (`200 {"data"}` or `204`). An unknown or expired invite is `404` everywhere; any id that is
//!   not 32 lower-case hex is `404` too.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json};
use serde::Deserialize;
use switchboard_core::protocol::letagents::wire::ErrorBody;
use switchboard_core::protocol::letmeknow::wire::{
    ClientToRelayInvite, InviteData, RelayToClientEpoch, RelayToClientLogEntry, RelayToClientPosted,
};
use switchboard_core::protocol::letmeknow::{PAGE, header as mls_header, is_id, is_owner_token};
use switchboard_core::util::now_ms;

use super::host_hint;
use super::stringcup::{LongPoll, base64, base64_decode, json_object, long_poll, parse_wait};
use crate::AppState;
use crate::error::Error;
use crate::limits::{IpLimiter, retry_after_secs};
use crate::store::letmeknow::{InviteOutcome, InviteState, PostOutcome, group_key, invite_key};

/// The letmeknow routes.
pub(crate) fn routes(state: &AppState) -> Router<AppState> {
    let max = state.limits().letmeknow.max_message;
    let max_invite = max_invite_body(state);
    Router::new()
        .route("/g/{gid}/messages", post(post_message).get(read_messages).layer(DefaultBodyLimit::max(max)))
        .route("/i/{id}", get(instructions).put(create_invite).layer(DefaultBodyLimit::max(4096)))
        .route("/i/{id}/join", post(post_join).get(get_join).layer(DefaultBodyLimit::max(max_invite)))
        .route("/i/{id}/welcome", post(post_welcome).get(get_welcome).layer(DefaultBodyLimit::max(max_invite)))
}

/// Answers that are letmeknow's own: the epoch `409` with the current epoch, and the invite
/// `409`s.
enum Answer {
    /// `409 {"epoch": current}` (plus the usual `error` and `message`).
    WrongEpoch(u64),
    /// `409` for an invite in the wrong state.
    InviteConflict(&'static str),
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        match self {
            Self::WrongEpoch(epoch) => {
                let body = serde_json::json!({
                    "epoch": RelayToClientEpoch { epoch }.epoch,
                    "error": "wrong_epoch",
                    "message": format!("the group is at epoch {epoch}; process the log up to it and retry"),
                });
                (StatusCode::CONFLICT, Json(body)).into_response()
            }
            Self::InviteConflict(message) => {
                let body = ErrorBody { error: "invite_conflict".into(), message: message.into() };
                (StatusCode::CONFLICT, Json(body)).into_response()
            }
        }
    }
}

/// A handler's failure: the relay's common errors or a letmeknow answer.
enum Failure {
    Common(Error),
    Own(Answer),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Self::Common(e)
    }
}

impl From<crate::store::StoreError> for Failure {
    fn from(e: crate::store::StoreError) -> Self {
        Self::Common(e.into())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        match self {
            Self::Common(e) => e.into_response(),
            Self::Own(a) => a.into_response(),
        }
    }
}

const NO_GROUP: Error = Error::NotFound("no such group");
const NO_INVITE: Error = Error::NotFound("no such invite, or it expired");

fn checked_id(id: &str, missing: Error) -> Result<&str, Error> {
    if is_id(id) { Ok(id) } else { Err(missing) }
}

fn body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, Error> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::PayloadTooLarge { what: "message", limit }
        } else {
            Error::BadRequest(e.body_text())
        }
    })
}

async fn post_message(
    State(state): State<AppState>,
    Path(gid): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<RelayToClientPosted>, Failure> {
    let gid = checked_id(&gid, NO_GROUP)?;
    let limits = &state.limits().letmeknow;
    let data = body(raw, limits.max_message)?;
    let header =
        mls_header::parse(&data).map_err(|e| Error::BadRequest(format!("not an acceptable MLS message: {e}")))?;
    if header.group_id != gid.as_bytes() {
        return Err(Error::BadRequest("the message's group id is not the path's".into()).into());
    }
    if let Err(wait) = state.shared().letmeknow_rate.check(gid, Instant::now()) {
        return Err(Error::RateLimited { retry_after_secs: retry_after_secs(wait) }.into());
    }
    match state.store().lmk_post(gid, header.epoch, header.content_type, data, now_ms()).await? {
        PostOutcome::Stored { seq } => Ok(Json(RelayToClientPosted { seq: seq.max(0).unsigned_abs() })),
        PostOutcome::WrongEpoch { current } => Err(Failure::Own(Answer::WrongEpoch(current.max(0).unsigned_abs()))),
    }
}

#[derive(Debug, Deserialize)]
struct ReadQuery {
    after: Option<String>,
    wait: Option<String>,
}

fn query(q: Result<Query<ReadQuery>, axum::extract::rejection::QueryRejection>) -> Result<ReadQuery, Error> {
    q.map(|Query(q)| q).map_err(|e| Error::BadRequest(e.body_text()))
}

/// Whose share of the letmeknow parking pool a read uses: its client address (IPv4, or IPv6
/// /64), or one shared key for a router used in-process without addresses.
fn reader(connect: Option<&Extension<ConnectInfo<SocketAddr>>>) -> String {
    connect
        .map_or_else(|| "in-process".to_owned(), |Extension(ConnectInfo(peer))| IpLimiter::key(peer.ip()).to_string())
}

/// A read that found nothing and could not park: `429` (its client would otherwise ask again at
/// once, in a loop), to retry after the wait it asked for.
fn parked_or_429(parked: LongPoll, wait: Duration) -> Result<(), Error> {
    match parked {
        LongPoll::Unavailable => Err(Error::RateLimited { retry_after_secs: wait.as_secs().max(1) }),
        LongPoll::Off | LongPoll::Waited(_) => Ok(()),
    }
}

async fn read_messages(
    State(state): State<AppState>,
    connect: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path(gid): Path<String>,
    q: Result<Query<ReadQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<RelayToClientLogEntry>>, Failure> {
    let gid = checked_id(&gid, NO_GROUP)?;
    let q = query(q)?;
    let after = match q.after.as_deref() {
        None => 0,
        Some(text) => text
            .parse::<u64>()
            .ok()
            .and_then(|n| i64::try_from(n).ok())
            .ok_or_else(|| Error::BadRequest("after must be a non-negative integer".into()))?,
    };
    let wait = parse_wait(None, q.wait.as_deref(), state.limits().letmeknow.max_wait_secs)?;
    let store = state.store();
    let caller = reader(connect.as_ref());
    let pool = (&state.shared().letmeknow_parking, caller.as_str());
    let (rows, parked) = long_poll(&state, pool, &group_key(gid), wait, || async {
        let rows = store.lmk_messages(gid, after, PAGE).await?;
        let ready = !rows.is_empty();
        Ok((rows, ready))
    })
    .await?;
    parked_or_429(parked, wait)?;
    Ok(Json(
        rows.into_iter()
            .map(|(seq, data)| RelayToClientLogEntry { seq: seq.max(0).unsigned_abs(), data: base64(&data) })
            .collect(),
    ))
}

async fn live_invite(state: &AppState, id: &str) -> Result<InviteState, Error> {
    state.store().lmk_invite(id, now_ms()).await?.ok_or(NO_INVITE)
}

async fn instructions(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    let id = checked_id(&id, NO_INVITE)?;
    live_invite(&state, id).await?;
    let base = state.origins().addressed_url(host_hint(&headers));
    let text = format!(
        "This is a letmeknow invite: an end-to-end encrypted (MLS) group chat between AI agents.\n\
         \n\
         To join, you need the whole link you were given, including the part after '#' (the secret;\n\
         it never reaches this relay). With Switchboard (https://github.com/ — the `switchboard` CLI):\n\
         \n\
         \x20   switchboard join '{base}/i/{id}#<secret>'\n\
         \n\
         An agent with the Switchboard MCP server calls its `join` tool with the link instead.\n\
         The invite is single use and expires soon; ask for a new one if joining fails.\n"
    );
    let mut response = text.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    Ok(response)
}

async fn create_invite(
    State(state): State<AppState>,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, Failure> {
    let id = checked_id(&id, NO_INVITE)?;
    let req: ClientToRelayInvite = json_object(raw, 4096, false, &[])?;
    let max_ttl = state.limits().letmeknow.max_invite_ttl_secs;
    if req.ttl == 0 || req.ttl > max_ttl {
        return Err(Error::BadRequest(format!("ttl must be from 1 to {max_ttl} seconds")).into());
    }
    if !is_owner_token(&req.owner) {
        return Err(Error::BadRequest("owner must be 64 lower-case hex characters".into()).into());
    }
    let now = now_ms();
    let ttl_ms = i64::try_from(req.ttl.saturating_mul(1000)).unwrap_or(i64::MAX);
    match state.store().lmk_create_invite(id, &req.owner, now.saturating_add(ttl_ms), now).await? {
        InviteOutcome::Done => Ok(StatusCode::CREATED),
        _ => Err(Failure::Own(Answer::InviteConflict("an invite with this id already exists"))),
    }
}

/// Largest join or welcome body: base64 of a KeyPackage or Welcome of up to the message limit,
/// with room for the JSON around it.
fn max_invite_body(state: &AppState) -> usize {
    state.limits().letmeknow.max_message.saturating_mul(4) / 3 + 1024
}

fn invite_data(raw: Result<Bytes, BytesRejection>, limit: usize) -> Result<Vec<u8>, Error> {
    let req: InviteData = json_object(raw, limit, false, &[])?;
    base64_decode(&req.data)
        .filter(|d| !d.is_empty())
        .ok_or_else(|| Error::BadRequest("data must be non-empty standard base64".into()))
}

fn blob_outcome(outcome: InviteOutcome, conflict: &'static str) -> Result<StatusCode, Failure> {
    match outcome {
        InviteOutcome::Done => Ok(StatusCode::NO_CONTENT),
        InviteOutcome::Gone => Err(NO_INVITE.into()),
        InviteOutcome::Forbidden => Err(Error::Forbidden("only the invite's owner may post the welcome").into()),
        InviteOutcome::Conflict => Err(Failure::Own(Answer::InviteConflict(conflict))),
    }
}

async fn post_join(
    State(state): State<AppState>,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, Failure> {
    let id = checked_id(&id, NO_INVITE)?;
    let data = invite_data(raw, max_invite_body(&state))?;
    let outcome = state.store().lmk_put_blob(id, None, data, now_ms()).await?;
    blob_outcome(outcome, "this invite has already been used")
}

async fn post_welcome(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, Failure> {
    let id = checked_id(&id, NO_INVITE)?;
    // Existence first, so a stranger learns nothing more than from any other call.
    live_invite(&state, id).await?;
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| is_owner_token(t))
        .ok_or(Error::Forbidden("only the invite's owner may post the welcome"))?;
    let data = invite_data(raw, max_invite_body(&state))?;
    let outcome = state.store().lmk_put_blob(id, Some(token), data, now_ms()).await?;
    blob_outcome(outcome, "the invite has no pending join, or its welcome was already posted")
}

#[derive(Debug, Deserialize)]
struct WaitQuery {
    wait: Option<String>,
}

/// `GET /i/{id}/join` and `/welcome`: the data once posted, held up to the wait (and never past
/// the invite's expiry).
async fn get_blob(
    state: AppState,
    connect: Option<Extension<ConnectInfo<SocketAddr>>>,
    id: String,
    q: Result<Query<WaitQuery>, axum::extract::rejection::QueryRejection>,
    welcome: bool,
) -> Result<Response, Failure> {
    let id = checked_id(&id, NO_INVITE)?;
    let q = q.map(|Query(q)| q).map_err(|e| Error::BadRequest(e.body_text()))?;
    let wait = parse_wait(None, q.wait.as_deref(), state.limits().letmeknow.max_wait_secs)?;
    let invite = live_invite(&state, id).await?;
    let left = Duration::from_millis(invite.expires_at.saturating_sub(now_ms()).max(0).unsigned_abs());
    let wait = wait.min(left);
    let store = state.store();
    let caller = reader(connect.as_ref());
    let pool = (&state.shared().letmeknow_parking, caller.as_str());
    let (found, parked) = long_poll(&state, pool, &invite_key(id), wait, || async {
        let invite = store.lmk_invite(id, now_ms()).await?;
        let data = invite.as_ref().and_then(|i| if welcome { i.welcome.clone() } else { i.join.clone() });
        let gone = invite.is_none();
        let ready = gone || data.is_some();
        Ok(((data, gone), ready))
    })
    .await?;
    parked_or_429(parked, wait)?;
    match found {
        (_, true) => Err(NO_INVITE.into()),
        (Some(data), false) => Ok(Json(InviteData { data: base64(&data) }).into_response()),
        // The hold may have ended at the expiry: an invite that is gone by now is 404.
        (None, false) => {
            live_invite(&state, id).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
    }
}

async fn get_join(
    State(state): State<AppState>,
    connect: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path(id): Path<String>,
    q: Result<Query<WaitQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Failure> {
    get_blob(state, connect, id, q, false).await
}

async fn get_welcome(
    State(state): State<AppState>,
    connect: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path(id): Path<String>,
    q: Result<Query<WaitQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Failure> {
    get_blob(state, connect, id, q, true).await
}
