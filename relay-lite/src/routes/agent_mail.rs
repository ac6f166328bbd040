//! Agent Mail 1.0 relay API (`specs` seed §7.1, §8), built on the pure checks in
//! `switchboard_core::protocol::agent_mail::relay`.
//!
//! - `GET /.well-known/agent-mail`: the discovery document, `service` = the addressed origin.
//! - `POST /v1/mailboxes`: publish a signed card; `200` with the accepted record
//!   `{envelope, accepted_at}` (the original record on exact resubmission). The mailbox is bound
//!   to its first card's owner (`mailbox_conflict`); a new card needs a nonce above the current
//!   card's and the actor's service-wide maximum (`nonce_not_greater` with `Max-Seen-Nonce`).
//! - `GET /v1/mailboxes/{mailbox_id}/card`: the current card's accepted record (public).
//! - `POST /v1/mailboxes/{mailbox_id}/packets`: deliver a sender-signed packet; `202` with
//!   `{packet_id, accepted_at}`, the original result for a packet ID in accepted history
//!   (tombstones of deleted packets included); new packets are checked against the mailbox quota
//!   before anything is stored.
//! - `GET /v1/mailboxes/{mailbox_id}/packets?limit&cursor` and
//!   `DELETE /v1/mailboxes/{mailbox_id}/packets/{packet_id}`: owner request JWT (audience = this
//!   relay's origin, `sub` = the mailbox owner), verified before anything about the mailbox is
//!   revealed; delete answers `204` even for an absent packet and keeps the tombstone.
//!
//! - `PUT`/`DELETE /v1/mailboxes/{mailbox_id}/blocked/{agent_id}` (relay-lite's own endpoint;
//!   §7.4 defines none): the owner blocks or unblocks new packets from a sender, `204`. Blocked
//!   senders get `permission_denied`; accepted packets and exact retries are unaffected.
//!
//! This relay's origins are its configured public URLs ([`crate::origin`]), never the request's
//! `Host`: a first card must list one of them and owner JWTs must name one as audience. Every write is committed by the group-committing writer before the
//! answer. Errors use Identity's shape and the §8 codes (`crate::error::Error::AgentMail`).

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use serde::Deserialize;
use switchboard_core::protocol::agent_identity::http::ListPage;
use switchboard_core::protocol::agent_identity::json::{self, Value};
use switchboard_core::protocol::agent_identity::jwt::JwtPolicy;
use switchboard_core::protocol::agent_identity::{AgentId, ErrorCode};
use switchboard_core::protocol::agent_mail::card::MailboxCard;
use switchboard_core::protocol::agent_mail::packet::Packet;
use switchboard_core::protocol::agent_mail::{MAX_RAW_BYTES, relay};
use switchboard_core::util::now_ms;

use super::host_hint;
use crate::AppState;
use crate::error::Error;

/// The Agent Mail routes.
pub(crate) fn routes(_state: &AppState) -> Router<AppState> {
    Router::new()
        .route("/.well-known/agent-mail", get(discovery))
        .route("/v1/mailboxes", post(publish))
        .route("/v1/mailboxes/{mailbox_id}/card", get(card))
        .route("/v1/mailboxes/{mailbox_id}/packets", post(deliver).get(list))
        .route("/v1/mailboxes/{mailbox_id}/packets/{packet_id}", delete(remove))
        .route("/v1/mailboxes/{mailbox_id}/blocked/{agent_id}", put(block).delete(unblock))
        .layer(DefaultBodyLimit::max(MAX_RAW_BYTES))
        .layer(axum::middleware::map_response(identity_shaped))
}

/// Whether `path` is one of this protocol's (their errors take Identity's shape).
pub(crate) fn is_agent_mail_path(path: &str) -> bool {
    path == "/.well-known/agent-mail" || path == "/v1/mailboxes" || path.starts_with("/v1/mailboxes/")
}

/// Errors that do not come from the Mail checks (a store failure, shutdown, the per-IP limit) are
/// relay-lite's flat `{"error": code, "message"}`; on these routes they take Identity's shape
/// `{"error": {"code", "message"}}` (status and headers such as `Retry-After` unchanged). Store
/// failures and shutdown use the added codes `internal_error` and `unavailable`.
pub(crate) async fn identity_shaped(response: Response) -> Response {
    if response.status().is_success() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return parts.status.into_response();
    };
    let flat = serde_json::from_slice::<serde_json::Value>(&bytes).ok().and_then(|v| {
        let code = v.get("error")?.as_str()?.to_owned();
        Some((code, v.get("message").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned()))
    });
    let Some((code, message)) = flat else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    let code = match code.as_str() {
        "internal" => "internal_error",
        "bad_request" => ErrorCode::InvalidRequest.as_str(),
        "too_large" => ErrorCode::PayloadTooLarge.as_str(),
        other => other,
    };
    let body = switchboard_core::protocol::agent_identity::http::ErrorBody::new(code, message).to_json();
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// The time (Unix ms): the system clock, or the configured test clock.
fn now(state: &AppState) -> i64 {
    state.shared().agent_mail_clock.as_ref().map_or_else(now_ms, |c| c.load(std::sync::atomic::Ordering::SeqCst))
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], json::to_jcs(value))
        .into_response()
}

fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Error> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::agent_mail(ErrorCode::PayloadTooLarge, format!("body larger than {MAX_RAW_BYTES} bytes"))
        } else {
            Error::agent_mail(ErrorCode::InvalidRequest, e.body_text())
        }
    })
}

fn path_text<T>(path: Result<Path<T>, PathRejection>) -> Result<T, Error> {
    path.map(|Path(p)| p).map_err(|e| Error::agent_mail(ErrorCode::InvalidRequest, e.body_text()))
}

async fn discovery(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, Error> {
    let origin = state.origins().addressed_origin(host_hint(&headers));
    Ok(json_response(StatusCode::OK, &relay::discovery_document(origin).to_value()))
}

async fn publish(State(state): State<AppState>, raw: Result<Bytes, BytesRejection>) -> Result<Response, Error> {
    let raw = body(raw)?;
    let card = MailboxCard::parse(&raw).map_err(relay::RelayError::from)?;
    // A first card must list one of this relay's names; the primary when it lists none, which
    // the publish check then refuses.
    let origins = state.origins();
    let origin = origins.origins().find(|o| card.lists_route(o)).unwrap_or_else(|| origins.primary_origin()).clone();
    let published = state.store().am_publish(card, origin, now(&state)).await??;
    if !published.resubmission {
        tracing::debug!(mailbox = %published.current.card.mailbox_id(), "agent mail card accepted");
    }
    Ok(json_response(StatusCode::OK, &published.current.to_record()))
}

async fn card(State(state): State<AppState>, path: Result<Path<String>, PathRejection>) -> Result<Response, Error> {
    let mailbox = relay::parse_mailbox_path(&path_text(path)?)?;
    let current = state.store().am_card(&mailbox).await?.ok_or(relay::RelayError::MailboxUnavailable)?;
    Ok(json_response(StatusCode::OK, &current.to_record()))
}

async fn deliver(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let mailbox = relay::parse_mailbox_path(&path_text(path)?)?;
    let raw = body(raw)?;
    let packet = Packet::parse(&raw).map_err(relay::RelayError::from)?;
    let quota = state.shared().limits.agent_mail.quota();
    let result = state.store().am_deliver(packet, mailbox, state.origins().clone(), quota, now(&state)).await??;
    Ok(json_response(StatusCode::ACCEPTED, &result.to_value()))
}

/// Authorizes the mailbox owner's request JWT; returns nothing about the mailbox before the
/// token verified.
async fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    mailbox: &switchboard_core::protocol::agent_mail::Id16,
) -> Result<(), Error> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(relay::bearer_token)
        .ok_or_else(|| Error::agent_mail(ErrorCode::InvalidToken, "missing bearer token"))?;
    // The token is checked first (with no owner), so a bad token learns nothing. Its audience
    // must be one of this relay's configured origins: the one it verifies for is kept.
    let now_secs = now(state) / 1000;
    let mut first_error = None;
    let mut audience = None;
    for origin in state.origins().origins() {
        match relay::authorize_owner(token, origin, None, now_secs, JwtPolicy::default()) {
            Ok(_) | Err(relay::RelayError::MailboxUnavailable) => {
                audience = Some(origin);
                break;
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let Some(origin) = audience else {
        return Err(first_error.map_or_else(|| Error::agent_mail(ErrorCode::InvalidToken, "no audience"), Error::from));
    };
    let owner = state.store().am_card(mailbox).await?.map(|c| *c.card.owner());
    relay::authorize_owner(token, origin, owner.as_ref(), now_secs, JwtPolicy::default())?;
    Ok(())
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

/// The opaque cursor is the last listed `seq` in decimal.
fn parse_cursor(raw: Option<&str>) -> Result<u64, Error> {
    let Some(raw) = raw else { return Ok(0) };
    let bad = || Error::from(relay::RelayError::InvalidRequest("malformed cursor".into()));
    if raw.is_empty() || raw.len() > 16 || !raw.bytes().all(|b| b.is_ascii_digit()) || raw.starts_with('0') {
        return Err(bad());
    }
    raw.parse().map_err(|_| bad())
}

async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Error> {
    let mailbox = relay::parse_mailbox_path(&path_text(path)?)?;
    authorize(&state, &headers, &mailbox).await?;
    let Query(query) = query.map_err(|e| Error::agent_mail(ErrorCode::InvalidRequest, e.body_text()))?;
    let limit = relay::parse_list_limit(query.limit.as_deref())?;
    let after = parse_cursor(query.cursor.as_deref())?;
    let mut rows = state.store().am_list(&mailbox, after, limit + 1, now(&state)).await?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next_cursor = if more { rows.last().map(|r| r.seq.to_string()) } else { None };
    let mut result = Vec::with_capacity(rows.len());
    for row in rows {
        let packet = Packet::parse(&row.body).map_err(|e| {
            Error::Store(crate::store::StoreError::Database(std::sync::Arc::new(sqlx::Error::Decode(
                format!("stored packet: {e}").into(),
            ))))
        })?;
        let record = relay::PacketRecord { packet_id: packet.id(), packet, accepted_at: row.accepted_at, seq: row.seq };
        result.push(record.to_value());
    }
    Ok(json_response(StatusCode::OK, &ListPage { result, next_cursor }.to_value()))
}

async fn remove(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, Error> {
    let (mailbox, packet_id) = path_text(path)?;
    let mailbox = relay::parse_mailbox_path(&mailbox)?;
    let packet_id = relay::parse_packet_path(&packet_id)?;
    authorize(&state, &headers, &mailbox).await?;
    state.store().am_delete(mailbox, packet_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn set_block(
    state: &AppState,
    headers: &HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    blocked: bool,
) -> Result<StatusCode, Error> {
    let (mailbox, sender) = path_text(path)?;
    let mailbox = relay::parse_mailbox_path(&mailbox)?;
    let sender =
        AgentId::parse(&sender).map_err(|e| Error::agent_mail(ErrorCode::InvalidRequest, format!("agent_id: {e}")))?;
    authorize(state, headers, &mailbox).await?;
    state.store().am_block(mailbox, sender, blocked).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn block(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, Error> {
    set_block(&state, &headers, path, true).await
}

async fn unblock(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, Error> {
    set_block(&state, &headers, path, false).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_canonical_decimal_seqs() {
        assert_eq!(parse_cursor(None).unwrap(), 0);
        assert_eq!(parse_cursor(Some("42")).unwrap(), 42);
        assert!(parse_cursor(Some("042")).is_err());
        assert!(parse_cursor(Some("")).is_err());
        assert!(parse_cursor(Some("-1")).is_err());
    }
}
