//! Messages (B.2.5–B.3.6): idempotent single sends, batch sends with partial success, inbox
//! pages with long polling, batch and single acknowledgement.
//!
//! Send check order: token (`401`), send budget (`429`), body size (`413`), JSON and fields
//! (`400`, extra header fields included), ciphertext size (`413`), a `sender_id` other than
//! the token's identity (`403`), `Idempotency-Key` syntax (`400`), the same key in flight
//! (`409`); then, inside one write: replay (`200`) or reuse for another recipient (`422`),
//! recipient (`404`), pending limits per sender then per inbox (`507`), stored (`201`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{delete, post};
use serde::Deserialize;
use switchboard_core::util::now_ms;

use super::wire::{
    AckIn, AckOut, BatchFailed, BatchIn, BatchOut, BatchSent, DeletedOut, HeaderOut, InboxOut, MessageIn, MessageOut,
    SentOut,
};
use super::{
    Caller, DEFAULT_PAGE, HEADER_ALGO, InFlight, Inbox, MAX_ACK, MAX_BATCH, MAX_PAGE, SMALL_BODY, Sends, base64,
    base64_decode, base64_exact, identity_id, json_map, json_object, json_response, long_poll, parse_wait,
};
use crate::error::Error;
use crate::store::stringcup::{NewMessage, PendingCaps, SendOutcome, SendRequest, StoredMessage, inbox_key};
use crate::{AppState, StringcupLimits};

/// The header carrying a send's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Smallest ciphertext: the 16-byte GCM tag of an empty plaintext.
const MIN_CIPHERTEXT: usize = 16;

/// Largest body of a single send: the largest ciphertext in base64 plus room for the rest.
fn send_body_limit(limits: &StringcupLimits) -> usize {
    limits.message_max_bytes.div_ceil(3) * 4 + 16 * 1024
}

pub(super) fn routes(limits: &StringcupLimits) -> Router<AppState> {
    Router::new()
        .route("/api/v2/messages", post(send).layer(DefaultBodyLimit::max(send_body_limit(limits))).get(inbox))
        .route("/api/v2/messages/batch", post(batch).layer(DefaultBodyLimit::max(limits.batch_max_body_bytes)))
        .route("/api/v2/messages/ack", post(ack).layer(DefaultBodyLimit::max(SMALL_BODY)))
        .route("/api/v2/messages/{id}", delete(delete_one))
}

fn caps(limits: &StringcupLimits) -> PendingCaps {
    PendingCaps {
        inbox_messages: limits.inbox_max_pending_messages,
        inbox_bytes: limits.inbox_max_pending_bytes,
        sender_messages: limits.inbox_max_pending_per_sender,
        sender_bytes: limits.inbox_max_pending_bytes_per_sender,
    }
}

/// Most extra header fields on one message.
pub const MAX_HEADER_EXTRA_FIELDS: usize = 16;
/// Longest extra header field name, in bytes.
pub const MAX_HEADER_EXTRA_NAME: usize = 64;
/// Longest extra header field value, in bytes.
pub const MAX_HEADER_EXTRA_VALUE: usize = 1024;
/// Largest encoding of all extra header fields of one message (a JSON object), in bytes.
pub const MAX_HEADER_EXTRA_BYTES: usize = 4096;

/// Checks the extra header fields against their bounds and encodes them for storage: a JSON
/// object of strings, or `""` for none. Only strings are carried, so what the recipient reads
/// is byte for byte what the sender wrote.
fn header_extra(extra: serde_json::Map<String, serde_json::Value>) -> Result<String, Error> {
    if extra.is_empty() {
        return Ok(String::new());
    }
    if extra.len() > MAX_HEADER_EXTRA_FIELDS {
        return Err(Error::BadRequest(format!("a header carries at most {MAX_HEADER_EXTRA_FIELDS} extra fields")));
    }
    let mut fields = BTreeMap::new();
    for (name, value) in extra {
        let name_ok = (1..=MAX_HEADER_EXTRA_NAME).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !name_ok {
            return Err(Error::BadRequest(format!(
                "extra header field names are 1 to {MAX_HEADER_EXTRA_NAME} characters of A-Z, a-z, 0-9, `_`, `-` \
                 and `.`"
            )));
        }
        let serde_json::Value::String(value) = value else {
            return Err(Error::BadRequest(format!("extra header field `{name}` must be a string")));
        };
        if value.len() > MAX_HEADER_EXTRA_VALUE {
            return Err(Error::BadRequest(format!(
                "extra header field `{name}` is longer than {MAX_HEADER_EXTRA_VALUE} bytes"
            )));
        }
        fields.insert(name, value);
    }
    let encoded = serde_json::to_string(&fields).map_err(|e| Error::BadRequest(e.to_string()))?;
    if encoded.len() > MAX_HEADER_EXTRA_BYTES {
        return Err(Error::BadRequest(format!(
            "the extra header fields take more than {MAX_HEADER_EXTRA_BYTES} bytes"
        )));
    }
    Ok(encoded)
}

/// The extra header fields as stored (see [`header_extra`]); a row that does not parse (never
/// written by this relay) delivers none rather than failing the page.
fn stored_header_extra(text: &str) -> BTreeMap<String, String> {
    if text.is_empty() {
        return BTreeMap::new();
    }
    serde_json::from_str(text).unwrap_or_default()
}

/// Validates one message from `sender`: recipient id shape, header version, algorithm and
/// field sizes, the extra header fields' bounds, the ciphertext's encoding and size, then the
/// optional `sender_id` (it must be `sender`: `403` otherwise). The ciphertext stays opaque.
fn parse_message(value: serde_json::Value, sender: &str, max: usize) -> Result<NewMessage, Error> {
    let m: MessageIn = serde_json::from_value(value).map_err(|e| Error::BadRequest(format!("invalid message: {e}")))?;
    identity_id("recipient_id", &m.recipient_id)?;
    if m.header.version != 2 {
        return Err(Error::BadRequest("header.version must be 2".into()));
    }
    if m.header.algo != HEADER_ALGO {
        return Err(Error::BadRequest(format!("header.algo must be `{HEADER_ALGO}`")));
    }
    let ephemeral_pub = base64_exact("header.ephemeral_pub", &m.header.ephemeral_pub, 32)?;
    let iv = base64_exact("header.iv", &m.header.iv, 12)?;
    let header_extra = header_extra(m.header.extra)?;
    // Refuse an oversized ciphertext before decoding it.
    if m.ciphertext.len() > max.div_ceil(3) * 4 + 4 {
        return Err(Error::PayloadTooLarge { what: "ciphertext", limit: max });
    }
    let ciphertext =
        base64_decode(&m.ciphertext).ok_or_else(|| Error::BadRequest("ciphertext must be base64".into()))?;
    if ciphertext.len() > max {
        return Err(Error::PayloadTooLarge { what: "ciphertext", limit: max });
    }
    if ciphertext.len() < MIN_CIPHERTEXT {
        return Err(Error::BadRequest("ciphertext is shorter than its 16-byte AES-GCM tag".into()));
    }
    // Checked last, so a malformed body is a 400 whatever it claims.
    if m.sender_id.as_deref().is_some_and(|claimed| claimed != sender) {
        return Err(Error::Forbidden("sender_id must be the identity your bearer token belongs to"));
    }
    Ok(NewMessage { recipient: m.recipient_id, ephemeral_pub, iv, header_extra, ciphertext })
}

/// The `Idempotency-Key`, if any: 1 to 255 printable ASCII characters, no spaces.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Error> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let bytes = value.as_bytes();
    let printable = bytes.iter().all(|b| (0x21..=0x7e).contains(b));
    match std::str::from_utf8(bytes) {
        Ok(key) if printable && (1..=255).contains(&key.len()) => Ok(Some(key.to_owned())),
        _ => {
            Err(Error::BadRequest("Idempotency-Key must be 1 to 255 printable ASCII characters without spaces".into()))
        }
    }
}

/// The error a single send answers for a refused outcome.
fn refusal(outcome: SendOutcome) -> Error {
    match outcome {
        SendOutcome::NoRecipient => Error::NotFound("Recipient identity not found"),
        SendOutcome::Full(limit) => Error::PendingFull(limit),
        SendOutcome::KeyReused => Error::IdempotencyKeyReused,
        SendOutcome::NoSender => Error::Unauthorized("unknown or revoked token"),
        // Not refusals; never asked.
        SendOutcome::Stored { .. } | SendOutcome::Replay { .. } => Error::Unavailable,
    }
}

fn new_send(state: &AppState, sender: &str, key: Option<String>, messages: Vec<NewMessage>) -> SendRequest {
    let limits = &state.limits().stringcup;
    let now = now_ms();
    SendRequest {
        sender: sender.to_owned(),
        idempotency_key: key,
        idempotency_expired_before: now.saturating_sub(limits.idempotency_ttl_ms),
        messages,
        caps: caps(limits),
        now,
    }
}

async fn send(
    State(state): State<AppState>,
    caller: Caller<Sends>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let limits = &state.limits().stringcup;
    let map = json_map(body, send_body_limit(limits), false, &[])?;
    let message = parse_message(serde_json::Value::Object(map), &caller.id, limits.message_max_bytes)?;
    let key = idempotency_key(&headers)?;
    let _in_flight = key.as_deref().map(|k| InFlight::claim(&state, &caller.id, k)).transpose()?;
    let outcomes = state
        .store()
        .stringcup()
        .send(new_send(&state, &caller.id, key, vec![message]))
        .await
        .map_err(Error::from_send)?;
    match outcomes.first().copied() {
        Some(SendOutcome::Stored { sent_seq, .. }) => {
            let body = SentOut { sent_seq, status: "stored".into(), idempotent_replay: None };
            Ok(json_response(StatusCode::CREATED, &body))
        }
        Some(SendOutcome::Replay { sent_seq }) => {
            let body = SentOut { sent_seq, status: "stored".into(), idempotent_replay: Some(true) };
            Ok(json_response(StatusCode::OK, &body))
        }
        Some(refused) => Err(refusal(refused)),
        None => Err(Error::Unavailable),
    }
}

fn failure(index: usize, recipient_id: Option<String>, error: &Error) -> BatchFailed {
    let (status, code) = error.status();
    BatchFailed { index, recipient_id, error: error.to_string(), code: code.into(), status: status.as_u16() }
}

async fn batch(
    State(state): State<AppState>,
    caller: Caller<Sends>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    if headers.contains_key(IDEMPOTENCY_KEY) {
        return Err(Error::BadRequest(
            "Idempotency-Key is not accepted on a batch (one key cannot describe many stores); retry a failed \
             entry with POST /api/v2/messages and its own key"
                .into(),
        ));
    }
    let limits = &state.limits().stringcup;
    let req = json_object::<BatchIn>(body, limits.batch_max_body_bytes, false, &[])?;
    if req.messages.len() > MAX_BATCH {
        return Err(Error::BadRequest(format!("a batch holds at most {MAX_BATCH} messages")));
    }
    let mut failed = Vec::new();
    let mut valid = Vec::new();
    for (index, entry) in req.messages.into_iter().enumerate() {
        let recipient_id = entry.get("recipient_id").and_then(serde_json::Value::as_str).map(str::to_owned);
        match parse_message(entry, &caller.id, limits.message_max_bytes) {
            Ok(message) => valid.push((index, message)),
            Err(e) => failed.push(failure(index, recipient_id, &e)),
        }
    }
    // One ephemeral key on two entries means one message key for two recipients: refuse all of
    // them rather than pick one.
    let mut uses: HashMap<Vec<u8>, usize> = HashMap::new();
    for (_, m) in &valid {
        *uses.entry(m.ephemeral_pub.clone()).or_default() += 1;
    }
    let (valid, reused): (Vec<_>, Vec<_>) =
        valid.into_iter().partition(|(_, m)| uses.get(&m.ephemeral_pub) == Some(&1));
    let reuse = Error::BadRequest(
        "header.ephemeral_pub appears on more than one entry: a message key must never be reused across \
         recipients; encrypt once per recipient"
            .into(),
    );
    for (index, m) in reused {
        failed.push(failure(index, Some(m.recipient), &reuse));
    }
    let mut sent = Vec::new();
    if !valid.is_empty() {
        let (indexes, messages): (Vec<usize>, Vec<NewMessage>) = valid.into_iter().unzip();
        let recipients: Vec<String> = messages.iter().map(|m| m.recipient.clone()).collect();
        let outcomes = state
            .store()
            .stringcup()
            .send(new_send(&state, &caller.id, None, messages))
            .await
            .map_err(Error::from_send)?;
        for ((index, recipient_id), outcome) in indexes.into_iter().zip(recipients).zip(outcomes) {
            match outcome {
                SendOutcome::Stored { sent_seq, .. } => sent.push(BatchSent { index, recipient_id, sent_seq }),
                refused => failed.push(failure(index, Some(recipient_id), &refusal(refused))),
            }
        }
    }
    failed.sort_by_key(|f| f.index);
    let count = sent.len();
    Ok(json_response(StatusCode::OK, &BatchOut { status: "processed".into(), sent, failed, count }))
}

/// `GET /api/v2/messages` parameters, parsed by hand for precise `400`s.
#[derive(Debug, Deserialize)]
struct InboxQuery {
    limit: Option<String>,
    since_id: Option<String>,
    wait: Option<String>,
}

fn message_out(recipient: &str, m: StoredMessage) -> MessageOut {
    MessageOut {
        id: m.id,
        sender_id: m.sender,
        recipient_id: recipient.to_owned(),
        header: HeaderOut {
            version: m.header_version,
            algo: m.header_algo,
            ephemeral_pub: base64(&m.ephemeral_pub),
            iv: base64(&m.iv),
            extra: stored_header_extra(&m.header_extra),
        },
        ciphertext: base64(&m.ciphertext),
        created_at: super::utc(m.created_ms),
    }
}

async fn inbox(
    State(state): State<AppState>,
    caller: Caller<Inbox>,
    query: Result<Query<InboxQuery>, QueryRejection>,
) -> Result<Response, Error> {
    let Query(q) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
    let limit = match q.limit.as_deref() {
        None => DEFAULT_PAGE,
        Some(text) => match text.trim().parse::<u64>() {
            Ok(n) if n >= 1 => usize::try_from(n).unwrap_or(MAX_PAGE).min(MAX_PAGE),
            _ => return Err(Error::BadRequest(format!("limit must be an integer from 1 to {MAX_PAGE}"))),
        },
    };
    let since = match q.since_id.as_deref() {
        None => None,
        Some(text) => match text.trim().parse::<i64>() {
            Ok(n) if n >= 0 => Some(n),
            _ => return Err(Error::BadRequest("since_id must be a non-negative integer".into())),
        },
    };
    let wait = parse_wait(None, q.wait.as_deref(), state.limits().stringcup.long_poll_max_secs)?;
    let store = state.store();
    let me = caller.id.as_str();
    let after = since.unwrap_or(0);
    let pool = (&state.shared().stringcup.parking, me);
    let key = inbox_key(me);
    let hub = &state.shared().hub;
    // Where the inbox stood when the first check found nothing above the cursor: the newest id
    // given out by then (ids are given out in commit order, one after another).
    let parked_at = AtomicI64::new(-1);
    let parked_at = &parked_at;
    let (mut page, long_poll_state) = long_poll(&state, pool, &key, wait, || {
        // After a wake-up, what committed since parking is the hub's run of the messages the
        // writer just stored, if it holds every one of them from the id after `parked_at` on;
        // otherwise (another instance's commit, a broken run) the store is read. A message
        // acknowledged by another request between its commit and this answer is still handed
        // out once (delivery is at least once; the repeated ack finds it gone).
        let from = parked_at.load(Ordering::Relaxed);
        let run = if from >= 0 { hub.recent_stringcup_after(&key, from) } else { None };
        async move {
            if let Some(run) = run {
                return Ok((run.iter().take(limit + 1).map(|m| StoredMessage::clone(m)).collect(), true));
            }
            // One extra row says whether more remain.
            let rows = store.stringcup().inbox(me, after, limit + 1).await?;
            if rows.is_empty() && !wait.is_zero() && parked_at.load(Ordering::Relaxed) < 0 {
                let newest = store.stringcup().newest_inbox_id(me).await?;
                parked_at.store(newest.max(after), Ordering::Relaxed);
            }
            let ready = !rows.is_empty();
            Ok((rows, ready))
        }
    })
    .await?;
    let has_more = page.len() > limit;
    page.truncate(limit);
    let next_since_id = page.last().map(|m| m.id).or(since);
    let messages: Vec<MessageOut> = page.into_iter().map(|m| message_out(me, m)).collect();
    let body = InboxOut { count: messages.len(), messages, has_more, next_since_id };
    let mut response = json_response(StatusCode::OK, &body);
    long_poll_state.apply(&mut response);
    Ok(response)
}

async fn ack(
    State(state): State<AppState>,
    caller: Caller<Inbox>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let req = json_object::<AckIn>(body, SMALL_BODY, false, &[])?;
    if req.ids.len() > MAX_ACK {
        return Err(Error::BadRequest(format!("an ack lists at most {MAX_ACK} ids")));
    }
    let mut seen = HashSet::new();
    let ids: Vec<i64> = req.ids.into_iter().filter(|id| seen.insert(*id)).collect();
    let out = state.store().stringcup().ack(&caller.id, ids).await?;
    let body = AckOut {
        status: "acknowledged".into(),
        count: out.acknowledged.len(),
        acknowledged: out.acknowledged,
        not_found: out.not_found,
    };
    Ok(json_response(StatusCode::OK, &body))
}

async fn delete_one(
    State(state): State<AppState>,
    caller: Caller<Inbox>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Error> {
    let Path(id) = path.map_err(|e| Error::BadRequest(e.body_text()))?;
    let id: i64 = id.parse().map_err(|_| Error::BadRequest("message id must be an integer".into()))?;
    let out = state.store().stringcup().ack(&caller.id, vec![id]).await?;
    if out.acknowledged.is_empty() {
        // The lookup is scoped to the caller's inbox: another identity's message cannot be
        // named, so there is nothing a 403 could distinguish.
        return Err(Error::NotFound("no such message in your inbox"));
    }
    Ok(json_response(StatusCode::OK, &DeletedOut { status: "acknowledged".into(), message_id: id }))
}
