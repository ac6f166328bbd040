//! letagents v1 relay API, byte for byte as `specs/letagents-profile.md` fixes it.
//!
//! - `POST /v1/send/{id}` with `x-la-drop`: checks size (`413`), framing (`400`: shorter than
//!   the smallest sealed envelope or no `LA1` magic), mailbox and drop (`404`, the same bytes for
//!   both failures), the mailbox's sliding-minute send limit (`429`) and capacity (`507`), then
//!   answers `202 {}` once the envelope is committed.
//! - `GET /v1/inbox/{id}?ts&drop_hash&sig`: a signed login (window, signature over the request's
//!   relay's own name, one of its configured public URLs and never the request's `Host`, `ts`
//!   newer than the last login, else `401`) that creates the mailbox or rotates its
//!   drop hash; then either a websocket (backlog `msg` frames, `ready`, live `msg` frames,
//!   `ack`/`ping` from the client) or `200 {"msgs":[...]}` with the 100 oldest.
//! - `POST /v1/ack/{id}?ts&seqs&sig`: signed over `seqs` exactly as sent; deletes the listed
//!   envelopes and answers the seqs that existed.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use switchboard_core::protocol::letagents::MIN_ENVELOPE;
use switchboard_core::protocol::letagents::relay_auth::{self, AuthError};
use switchboard_core::protocol::letagents::wire::{
    AckResponse, ClientToRelay, INBOX_PAGE, InboxResponse, RelayToClient, WaitingMsg,
};
use switchboard_core::util::{b64u, b64u_array, now_ms};
use tokio::sync::watch;

use crate::AppState;
use crate::error::Error;
use crate::limits::retry_after_secs;
use crate::store::{DepositOutcome, LoginOutcome, StoreError};

/// The header carrying the sender's proof that it holds the full address.
pub const DROP_HEADER: &str = "x-la-drop";
/// Most seqs one ack may list.
pub const MAX_ACK_SEQS: usize = 1000;
/// Largest frame a client may send on the websocket (acks and pings are tiny).
const MAX_CLIENT_FRAME: usize = 4096;
/// How often the relay pings an idle websocket (protocol-level ping; clients answer by library).
const KEEPALIVE_EVERY: Duration = Duration::from_secs(30);
/// A websocket with no frame from the client for this long is dropped as dead.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(75);

/// The letagents routes.
pub(crate) fn routes(state: &AppState) -> Router<AppState> {
    let max = state.limits().max_envelope;
    Router::new()
        .route("/v1/send/{id}", post(send).layer(DefaultBodyLimit::max(max)))
        .route("/v1/inbox/{id}", get(inbox))
        .route("/v1/ack/{id}", post(ack))
}

/// `202` body.
#[derive(Debug, Serialize)]
struct Accepted {}

#[derive(Debug, Deserialize)]
struct LoginQuery {
    ts: i64,
    drop_hash: String,
    sig: String,
}

#[derive(Debug, Deserialize)]
struct AckQuery {
    ts: i64,
    seqs: String,
    sig: String,
}

fn mailbox_id(path: Result<Path<String>, PathRejection>) -> Result<String, Error> {
    path.map(|Path(id)| id).map_err(|e| Error::BadRequest(e.body_text()))
}

fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Error> {
    query.map(|Query(q)| q).map_err(|e| Error::BadRequest(e.body_text()))
}

/// `ts` must be within `window` ms of the relay's clock (the seed's 2 minutes by default).
fn check_window(ts: i64, now: i64, window: i64) -> Result<(), AuthError> {
    if ts.abs_diff(now) > window.unsigned_abs() {
        return Err(AuthError::Window);
    }
    Ok(())
}

async fn send(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Accepted>), Error> {
    let limits = state.limits();
    let id = mailbox_id(path)?;
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::TooLarge { limit: limits.max_envelope }
        } else {
            Error::BadRequest(e.body_text())
        }
    })?;
    let drop = headers
        .get(DROP_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(b64u_array::<16>)
        .ok_or_else(|| Error::BadRequest(format!("missing or malformed {DROP_HEADER} header")))?;
    // Cheap framing checks only: the relay never looks inside an envelope.
    if body.len() < MIN_ENVELOPE || !body.starts_with(b"LA1") {
        return Err(Error::BadRequest("not a letagents v1 envelope".into()));
    }
    let drop_hash = relay_auth::drop_hash(&drop);
    // Unknown mailbox and wrong drop take the same path to the same response. Checked before
    // the rate limit so a stranger with a wrong drop cannot use up the real senders' minute.
    // Without a rate limit there is nothing to protect: the deposit checks the drop itself,
    // in the same statement that stores the envelope, so this read is skipped.
    if limits.sends_per_minute > 0 {
        match state.store().drop_hash(&id).await? {
            Some(stored) if stored == drop_hash => {}
            _ => return Err(Error::NoMailbox),
        }
        if let Err(wait) = state.shared().send_rate.check(&id, Instant::now()) {
            return Err(Error::RateLimited { retry_after_secs: retry_after_secs(wait) });
        }
    }
    let outcome = state
        .store()
        .deposit(&id, &drop_hash, body, limits.mailbox_capacity, now_ms())
        .await
        .map_err(Error::from_send)?;
    match outcome {
        DepositOutcome::Stored { seq } => {
            tracing::debug!(mailbox = %id, seq, "envelope stored");
            Ok((StatusCode::ACCEPTED, Json(Accepted {})))
        }
        DepositOutcome::NoMailbox => Err(Error::NoMailbox),
        DepositOutcome::Full => Err(Error::MailboxFull),
    }
}

fn wants_websocket(headers: &HeaderMap) -> bool {
    headers.get(header::UPGRADE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

async fn inbox(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    login: Result<Query<LoginQuery>, QueryRejection>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, Error> {
    let id = mailbox_id(path)?;
    let login = query(login)?;
    let now = now_ms();
    check_window(login.ts, now, state.limits().login_window_ms)?;
    if b64u_array::<32>(&login.drop_hash).is_none() {
        return Err(AuthError::Param("drop_hash").into());
    }
    signed_for_us(&state, &id, &login.sig, |host| relay_auth::inbox_message(host, &id, login.ts, &login.drop_hash))?;
    // Refuse a broken upgrade before the login is recorded, so the client can retry with it.
    let upgrade = match upgrade {
        Ok(upgrade) => Some(upgrade),
        Err(e) if wants_websocket(&headers) => return Err(Error::BadRequest(e.body_text())),
        Err(_) => None,
    };
    match state.store().login(&id, &login.drop_hash, login.ts, now).await? {
        LoginOutcome::Replay => return Err(AuthError::Replay.into()),
        LoginOutcome::Created => tracing::info!(mailbox = %id, "mailbox created"),
        LoginOutcome::Updated => {}
    }
    match upgrade {
        Some(upgrade) => Ok(upgrade
            .max_message_size(MAX_CLIENT_FRAME)
            .max_frame_size(MAX_CLIENT_FRAME)
            .on_upgrade(move |socket| session(state, id, socket))),
        None => {
            let waiting = state.store().waiting(&id, 0, INBOX_PAGE).await?;
            let msgs = waiting.into_iter().map(|w| WaitingMsg { seq: w.seq, ct: b64u(&w.body) }).collect();
            Ok(Json(InboxResponse { msgs }).into_response())
        }
    }
}

/// Verifies `sig` by mailbox `id` over the message `signed(host)` for one of this relay's own
/// names: a login or ack signed for any other relay is refused whatever `Host` it arrives with.
fn signed_for_us(state: &AppState, id: &str, sig: &str, signed: impl Fn(&str) -> Vec<u8>) -> Result<(), AuthError> {
    let mut outcome = Err(AuthError::BadSignature);
    for host in state.origins().authorities() {
        outcome = relay_auth::verify(id, &signed(host), sig);
        if outcome.is_ok() || matches!(outcome, Err(AuthError::BadId)) {
            break;
        }
    }
    outcome
}

/// Parses `N,N,...` (empty means none).
fn parse_seqs(text: &str) -> Result<Vec<i64>, AuthError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let seqs = text
        .split(',')
        .map(|s| s.parse::<i64>().map_err(|_| AuthError::Param("seqs")))
        .collect::<Result<Vec<_>, _>>()?;
    if seqs.len() > MAX_ACK_SEQS {
        return Err(AuthError::Param("seqs"));
    }
    Ok(seqs)
}

async fn ack(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    ack: Result<Query<AckQuery>, QueryRejection>,
) -> Result<Json<AckResponse>, Error> {
    let id = mailbox_id(path)?;
    let ack = query(ack)?;
    let now = now_ms();
    check_window(ack.ts, now, state.limits().login_window_ms)?;
    let seqs = parse_seqs(&ack.seqs)?;
    signed_for_us(&state, &id, &ack.sig, |host| relay_auth::ack_message(host, &id, ack.ts, &ack.seqs))?;
    let acked = state.store().ack(&id, seqs, now).await?;
    Ok(Json(AckResponse { acked }))
}

/// Why a websocket session ended early.
#[derive(Debug, thiserror::Error)]
enum SessionEnd {
    #[error("websocket: {0}")]
    Socket(#[from] axum::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("encoding a frame: {0}")]
    Json(#[from] serde_json::Error),
    #[error("client silent for {KEEPALIVE_TIMEOUT:?}")]
    Silent,
    /// The client stopped reading: a frame could not be handed to its socket in time. Dropping
    /// it frees what it held; it reconnects and catches up from the backlog.
    #[error("client not reading: a frame waited {0:?}")]
    Stalled(Duration),
}

async fn session(state: AppState, id: String, mut socket: WebSocket) {
    let hub = &state.shared().hub;
    let mut newest = hub.subscribe(&id);
    match run_session(&state, &id, &mut socket, &mut newest).await {
        Ok(()) => tracing::debug!(mailbox = %id, "websocket closed"),
        Err(e) => tracing::debug!(mailbox = %id, error = %e, "websocket ended"),
    }
    drop(newest);
    hub.release(&id);
}

/// Hands `message` to the socket, or ends the session when the client has not made room for it
/// within the relay's websocket send timeout (a client that never reads would otherwise hold
/// the session, and everything queued for it, forever: the keepalive check never runs while a
/// send blocks).
async fn send_within(state: &AppState, socket: &mut WebSocket, message: Message) -> Result<(), SessionEnd> {
    let limit = Duration::from_millis(state.limits().websocket_send_timeout_ms.max(1));
    tokio::time::timeout(limit, socket.send(message)).await.map_err(|_| SessionEnd::Stalled(limit))??;
    Ok(())
}

async fn send_frame(state: &AppState, socket: &mut WebSocket, frame: &RelayToClient) -> Result<(), SessionEnd> {
    let text = serde_json::to_string(frame)?;
    send_within(state, socket, Message::Text(text.into())).await
}

/// Sends every envelope above `sent`, in seq order; returns the last seq sent.
///
/// After the session's first read (`live`), envelopes committed since are taken from the hub
/// when it holds all of them (the bytes the writer just committed), without reading them back;
/// otherwise, and always for the backlog, they are read from the store.
async fn push_waiting(
    state: &AppState,
    id: &str,
    socket: &mut WebSocket,
    newest: &mut watch::Receiver<i64>,
    mut sent: i64,
    live: bool,
) -> Result<i64, SessionEnd> {
    // Whatever committed before this point is read below; later commits wake us again.
    newest.borrow_and_update();
    if live && let Some(recent) = state.shared().hub.recent_envelopes_after(id, sent) {
        for (seq, body) in recent {
            send_frame(state, socket, &RelayToClient::Msg { seq, ct: b64u(&body) }).await?;
            sent = seq;
        }
        return Ok(sent);
    }
    loop {
        let page = state.store().waiting(id, sent, INBOX_PAGE).await?;
        let full = page.len() == INBOX_PAGE;
        for w in page {
            send_frame(state, socket, &RelayToClient::Msg { seq: w.seq, ct: b64u(&w.body) }).await?;
            sent = w.seq;
        }
        if !full {
            return Ok(sent);
        }
    }
}

async fn run_session(
    state: &AppState,
    id: &str,
    socket: &mut WebSocket,
    newest: &mut watch::Receiver<i64>,
) -> Result<(), SessionEnd> {
    let mut closing = state.shared().closing.subscribe();
    let mut keepalive = tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE_EVERY, KEEPALIVE_EVERY);
    let mut heard = tokio::time::Instant::now();
    let mut sent = push_waiting(state, id, socket, newest, 0, false).await?;
    send_frame(state, socket, &RelayToClient::Ready).await?;
    loop {
        if *closing.borrow_and_update() {
            let frame = CloseFrame { code: close_code::AWAY, reason: "relay shutting down".into() };
            send_within(state, socket, Message::Close(Some(frame))).await?;
            return Ok(());
        }
        tokio::select! {
            changed = newest.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                sent = push_waiting(state, id, socket, newest, sent, true).await?;
            }
            _ = closing.changed() => {}
            _ = keepalive.tick() => {
                if heard.elapsed() > KEEPALIVE_TIMEOUT {
                    return Err(SessionEnd::Silent);
                }
                send_within(state, socket, Message::Ping(Bytes::new())).await?;
            }
            incoming = socket.recv() => {
                let Some(incoming) = incoming else { return Ok(()) };
                heard = tokio::time::Instant::now();
                match incoming? {
                    Message::Text(text) => match serde_json::from_str::<ClientToRelay>(&text) {
                        Ok(ClientToRelay::Ack { seq }) => {
                            state.store().ack(id, vec![seq], now_ms()).await?;
                        }
                        Ok(ClientToRelay::Ping) => send_frame(state, socket, &RelayToClient::Pong).await?,
                        Err(e) => tracing::debug!(mailbox = %id, error = %e, "ignoring a frame"),
                    },
                    Message::Close(_) => return Ok(()),
                    // Binary frames mean nothing here; protocol pings are answered by the
                    // library, and pongs only show the client is alive.
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn seqs_parse_as_a_comma_list_and_empty_is_none() {
        assert_eq!(parse_seqs("1,2,30").unwrap(), vec![1, 2, 30]);
        assert_eq!(parse_seqs("").unwrap(), Vec::<i64>::new());
        assert!(parse_seqs("1,,2").is_err());
        assert!(parse_seqs("1, 2").is_err());
    }

    #[test]
    fn window_is_inclusive_at_its_edge() {
        assert!(check_window(0, 120_000, 120_000).is_ok());
        assert!(check_window(0, 120_001, 120_000).is_err());
        assert!(check_window(i64::MIN, i64::MAX, 120_000).is_err());
    }
}
