//! Stringcup v2 relay API (`/api/v2`), as the Stringcup seed specifies it; the relay stores
//! and forwards ciphertext it cannot read, and checks only sizes and encodings.
//!
//! - `POST /identities` registers an X25519 key and answers a relay-assigned `sc-` id and a
//!   bearer token (kept only as SHA-256); `PUT /identities` changes the caller's key or label;
//!   `GET /identities/{id}` is an exact lookup with fingerprints. `GET /tokens/current` and
//!   `POST /tokens/rotate` manage the token, which dies after 30 days unused.
//! - `POST /messages` (with an optional `Idempotency-Key`) and `POST /messages/batch` store
//!   messages after the pending limits; `GET /messages` pages the caller's inbox, optionally
//!   parked up to 25 s (`wait`) and woken by the commit itself; `POST /messages/ack` and
//!   `DELETE /messages/{id}` remove messages from the caller's own numbering only.
//! - `/topics` are membership directories with relay-assigned `tp-` ids, visible only to
//!   members; `/rendezvous` pairs two identities under a relay-issued `rv-` token.
//! - `GET /api/v2` advertises the limits; `GET /api/v2/stats` publishes coarse, suppressed
//!   counts and no timeline.
//! - Every authenticated request counts against one of three hourly budgets per identity
//!   (send, inbox, other) and answers `X-RateLimit-*`; a refusal is `429` with `Retry-After`.

mod identities;
mod messages;
mod rendezvous;
mod topics;

use std::collections::HashSet;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::parking::ParkingPool;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use data_encoding::{BASE32_NOPAD, BASE64, BASE64_NOPAD};
use serde::de::DeserializeOwned;
pub(crate) use switchboard_core::protocol::stringcup::wire::{is_identity_id, is_rendezvous_token, relay as wire};
use switchboard_core::util::{now_ms, random_array, sha256};

use crate::error::Error;
use crate::limits::{Quota, SlidingWindow, retry_after_secs};
use crate::store::stringcup::{Counts, TokenRow};
use crate::{AppState, StringcupLimits};

/// Most entries in one batch send.
pub const MAX_BATCH: usize = 200;
/// Most ids in one batch ack.
pub const MAX_ACK: usize = 200;
/// Largest and default inbox page.
pub const MAX_PAGE: usize = 200;
/// Inbox page when `limit` is absent.
pub const DEFAULT_PAGE: usize = 50;
/// Largest body of the small JSON requests (everything but sends).
const SMALL_BODY: usize = 64 * 1024;
/// The one header algorithm of v2.
pub const HEADER_ALGO: &str = "x25519+ecies+aes256gcm";

/// Which hourly budget a request counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetKind {
    /// Sends (single or batch).
    Send,
    /// Inbox reads, long-polls, acks and deletes.
    Inbox,
    /// Everything else authenticated.
    Other,
    /// Registrations, per client address.
    Register,
}

impl BudgetKind {
    fn name(self) -> &'static str {
        match self {
            Self::Send => "send",
            Self::Inbox => "inbox",
            Self::Other => "other",
            Self::Register => "register",
        }
    }
}

/// Stringcup's in-memory state: budgets, the long-poll pool, idempotency keys in flight and
/// the statistics snapshot.
pub(crate) struct StringcupState {
    sends: SlidingWindow,
    inbox: SlidingWindow,
    other: SlidingWindow,
    registrations: SlidingWindow,
    /// Parked inbox and rendezvous waits, shared per identity.
    pub(crate) parking: ParkingPool,
    in_flight: Mutex<HashSet<(String, String)>>,
    stats: Mutex<Option<(Instant, Counts)>>,
}

impl StringcupState {
    /// Fresh state for `limits`.
    pub(crate) fn new(limits: &StringcupLimits) -> Self {
        let hour = Duration::from_secs(3600);
        Self {
            sends: SlidingWindow::new(limits.sends_per_hour, hour),
            inbox: SlidingWindow::new(limits.inbox_requests_per_hour, hour),
            other: SlidingWindow::new(limits.other_requests_per_hour, hour),
            registrations: SlidingWindow::new(limits.registrations_per_hour_per_ip, hour),
            parking: ParkingPool::new(limits.long_poll_slots, limits.long_poll_per_identity),
            in_flight: Mutex::new(HashSet::new()),
            stats: Mutex::new(None),
        }
    }

    fn window(&self, kind: BudgetKind) -> &SlidingWindow {
        match kind {
            BudgetKind::Send => &self.sends,
            BudgetKind::Inbox => &self.inbox,
            BudgetKind::Other => &self.other,
            BudgetKind::Register => &self.registrations,
        }
    }

    /// Forgets budgets with nothing inside their window.
    pub(crate) fn prune(&self, now: Instant) {
        for kind in [BudgetKind::Send, BudgetKind::Inbox, BudgetKind::Other, BudgetKind::Register] {
            self.window(kind).prune(now);
        }
    }
}

/// The Stringcup routes, all under `/api/v2`.
pub(crate) fn routes(state: &AppState) -> Router<AppState> {
    let limits = &state.limits().stringcup;
    Router::new()
        .route("/api/v2", get(info))
        .route("/api/v2/stats", get(stats))
        .merge(identities::routes())
        .merge(messages::routes(limits))
        .merge(topics::routes())
        .merge(rendezvous::routes())
        .layer(middleware::from_fn(rate_limit_headers))
}

// ---- budgets and X-RateLimit-* ------------------------------------------------------------

/// Where the caller's budget check leaves its [`Quota`] for [`rate_limit_headers`], so every
/// answer (success or error) carries the headers.
#[derive(Debug, Clone, Default)]
struct QuotaSlot(Arc<Mutex<Option<(BudgetKind, Quota)>>>);

impl QuotaSlot {
    fn set(&self, kind: BudgetKind, quota: Quota) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((kind, quota));
    }

    fn take(&self) -> Option<(BudgetKind, Quota)> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Puts the `X-RateLimit-*` headers of the budget the request spent on its answer, whatever the
/// answer is.
async fn rate_limit_headers(mut request: Request, next: Next) -> Response {
    let slot = QuotaSlot::default();
    request.extensions_mut().insert(slot.clone());
    let mut response = next.run(request).await;
    if let Some((kind, quota)) = slot.take() {
        let headers = response.headers_mut();
        headers.insert(HeaderName::from_static("x-ratelimit-limit"), HeaderValue::from(quota.limit));
        headers.insert(HeaderName::from_static("x-ratelimit-remaining"), HeaderValue::from(quota.remaining));
        // A Unix time in seconds, as the reference client reads it (it subtracts its clock).
        let now = u64::try_from(now_ms() / 1000).unwrap_or(0);
        let reset = if quota.reset.is_zero() { now } else { now.saturating_add(retry_after_secs(quota.reset)) };
        headers.insert(HeaderName::from_static("x-ratelimit-reset"), HeaderValue::from(reset));
        headers.insert(HeaderName::from_static("x-ratelimit-bucket"), HeaderValue::from_static(kind.name()));
    }
    response
}

/// Counts one request against `kind` for `key`; records the quota for the headers.
fn spend(state: &AppState, slot: Option<&QuotaSlot>, kind: BudgetKind, key: &str) -> Result<(), Error> {
    let Some(taken) = state.shared().stringcup.window(kind).take(key, Instant::now()) else {
        return Ok(());
    };
    let quota = match taken {
        Ok(quota) => quota,
        Err(quota) => {
            if let Some(slot) = slot {
                slot.set(kind, quota);
            }
            return Err(Error::RateLimited { retry_after_secs: retry_after_secs(quota.reset) });
        }
    };
    if let Some(slot) = slot {
        slot.set(kind, quota);
    }
    Ok(())
}

/// The budget an authenticated route spends.
pub(crate) trait Budget {
    /// Which one.
    const KIND: BudgetKind;
}

/// Spends the send budget.
#[derive(Debug)]
pub(crate) struct Sends;
/// Spends the inbox budget.
#[derive(Debug)]
pub(crate) struct Inbox;
/// Spends the "everything else" budget.
#[derive(Debug)]
pub(crate) struct Other;

impl Budget for Sends {
    const KIND: BudgetKind = BudgetKind::Send;
}
impl Budget for Inbox {
    const KIND: BudgetKind = BudgetKind::Inbox;
}
impl Budget for Other {
    const KIND: BudgetKind = BudgetKind::Other;
}

/// The authenticated caller, after its budget `B` allowed the request.
///
/// Check order: bearer token present and known (`401`), not expired by inactivity (`401`),
/// then the budget (`429`). The use is recorded (at most once per touch interval) before the
/// budget is checked: a refused request still shows the identity is alive.
#[derive(Debug)]
pub(crate) struct Caller<B> {
    /// The identity.
    pub id: String,
    /// SHA-256 of the presented token.
    pub token_hash: [u8; 32],
    /// When the token was issued (ms).
    pub token_created_ms: i64,
    /// When the token was last used, as the relay will count it for expiry (ms).
    pub last_used_ms: i64,
    budget: PhantomData<B>,
}

/// How stale the stored last use may get before a request writes it again: a minute, or a
/// quarter of the inactivity limit if that is shorter.
fn touch_interval(ttl_ms: i64) -> i64 {
    (ttl_ms / 4).clamp(0, 60_000)
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && token.len() <= 512).then_some(token)
}

impl<B: Budget + Send + Sync> FromRequestParts<AppState> for Caller<B> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let token = bearer(&parts.headers).ok_or(Error::Unauthorized("missing bearer token"))?;
        let token_hash = sha256(token.as_bytes());
        let store = state.store().stringcup();
        let TokenRow { identity, token_created_ms, token_last_used_ms } =
            store.by_token(&token_hash).await?.ok_or(Error::Unauthorized("unknown or revoked token"))?;
        let ttl = state.limits().stringcup.token_inactivity_ms;
        let now = now_ms();
        if now.saturating_sub(token_last_used_ms) > ttl {
            return Err(Error::Unauthorized("token expired after inactivity; register a new identity"));
        }
        let mut last_used_ms = token_last_used_ms;
        if now.saturating_sub(token_last_used_ms) >= touch_interval(ttl) {
            store.touch(&identity, now).await?;
            last_used_ms = now;
        }
        spend(state, parts.extensions.get::<QuotaSlot>(), B::KIND, &identity)?;
        Ok(Self { id: identity, token_hash, token_created_ms, last_used_ms, budget: PhantomData })
    }
}

// ---- long polling -------------------------------------------------------------------------

/// What a `wait` amounted to, for `X-Long-Poll` and `X-Long-Poll-Waited`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum LongPoll {
    /// No wait was requested.
    Off,
    /// Held (possibly for zero time, when there was something to answer at once).
    Waited(Duration),
    /// The pool of parked requests was full; answered at once.
    Unavailable,
}

impl LongPoll {
    /// Adds the headers to `response`.
    pub(crate) fn apply(self, response: &mut Response) {
        let headers = response.headers_mut();
        let (state, waited) = match self {
            Self::Off => ("off", None),
            Self::Waited(d) => ("waited", Some(d)),
            Self::Unavailable => ("unavailable", None),
        };
        headers.insert(HeaderName::from_static("x-long-poll"), HeaderValue::from_static(state));
        if let Some(waited) = waited
            && let Ok(value) = HeaderValue::from_str(&format!("{:.3}", waited.as_secs_f64()))
        {
            headers.insert(HeaderName::from_static("x-long-poll-waited"), value);
        }
    }
}

/// Parses a `wait` in seconds (fractions allowed), clamped to the configured maximum.
pub(crate) fn parse_wait(
    value: Option<&serde_json::Value>,
    text: Option<&str>,
    max_secs: u64,
) -> Result<Duration, Error> {
    let secs = match (value, text) {
        (Some(serde_json::Value::Null) | None, None) => return Ok(Duration::ZERO),
        (Some(v), _) => v.as_f64(),
        (None, Some(t)) => t.trim().parse::<f64>().ok(),
    };
    let secs = secs
        .filter(|s| s.is_finite() && *s >= 0.0)
        .ok_or_else(|| Error::BadRequest("wait must be a number of seconds from 0 to 25".into()))?;
    #[allow(clippy::cast_precision_loss)]
    let max = max_secs as f64;
    Ok(Duration::from_secs_f64(secs.min(max)))
}

/// Answers `check()` at once, or, when it is not ready and `wait` is positive, parks (taking a
/// slot of `pool` within `caller`'s share; `Unavailable` when there is none) until the hub
/// announces a change under `key`, the wait runs out or the relay closes, re-checking after
/// every change. There is no polling loop: the writer publishes to the hub right after the
/// commit.
pub(crate) async fn long_poll<T, F, Fut>(
    state: &AppState,
    (pool, caller): (&ParkingPool, &str),
    key: &str,
    wait: Duration,
    mut check: F,
) -> Result<(T, LongPoll), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(T, bool), Error>>,
{
    if wait.is_zero() {
        return Ok((check().await?.0, LongPoll::Off));
    }
    let hub = &state.shared().hub;
    // Subscribe before the first check, so a commit between the check and the wait still
    // wakes us.
    let mut changes = hub.subscribe(key);
    let result = async {
        let started = tokio::time::Instant::now();
        let (mut last, ready) = check().await?;
        if ready {
            return Ok((last, LongPoll::Waited(Duration::ZERO)));
        }
        let Ok(_slot) = pool.park(caller) else {
            return Ok((last, LongPoll::Unavailable));
        };
        let deadline = started + wait;
        let mut closing = state.shared().closing.subscribe();
        loop {
            if *closing.borrow_and_update() {
                break;
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { break },
                () = tokio::time::sleep_until(deadline) => break,
                changed = closing.changed() => if changed.is_err() { break },
            }
            changes.borrow_and_update();
            let (now, ready) = check().await?;
            last = now;
            if ready {
                break;
            }
        }
        Ok((last, LongPoll::Waited(started.elapsed())))
    }
    .await;
    drop(changes);
    hub.release(key);
    result
}

// ---- request bodies -----------------------------------------------------------------------

/// The body's bytes, or `413` / `400`.
fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, Error> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::PayloadTooLarge { what: "request body", limit }
        } else {
            Error::BadRequest(e.body_text())
        }
    })
}

/// Parses a JSON object body (an empty body counts as `{}` when `empty_ok`), refusing any of
/// the `refused` fields with its reason.
pub(crate) fn json_map(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
    empty_ok: bool,
    refused: &[(&str, &str)],
) -> Result<serde_json::Map<String, serde_json::Value>, Error> {
    let bytes = body_bytes(body, limit)?;
    let value: serde_json::Value = if empty_ok && bytes.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Object(serde_json::Map::new())
    } else {
        serde_json::from_slice(&bytes).map_err(|e| Error::BadRequest(format!("body is not valid JSON: {e}")))?
    };
    let serde_json::Value::Object(map) = value else {
        return Err(Error::BadRequest("body must be a JSON object".into()));
    };
    for (field, reason) in refused {
        if map.contains_key(*field) {
            return Err(Error::BadRequest(format!("`{field}` is not accepted: {reason}")));
        }
    }
    Ok(map)
}

/// [`json_map`], then deserialized into `T` (the map is moved, not copied: batch bodies are
/// large).
pub(crate) fn json_object<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
    empty_ok: bool,
    refused: &[(&str, &str)],
) -> Result<T, Error> {
    let map = json_map(body, limit, empty_ok, refused)?;
    serde_json::from_value(serde_json::Value::Object(map)).map_err(|e| Error::BadRequest(format!("invalid body: {e}")))
}

/// Decodes standard base64, padded or not (the spec's examples are padded).
pub(crate) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    BASE64.decode(text.as_bytes()).or_else(|_| BASE64_NOPAD.decode(text.as_bytes())).ok()
}

/// Standard padded base64, what the relay writes.
pub(crate) fn base64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// Decodes a field that must be base64 of exactly `len` bytes.
pub(crate) fn base64_exact(field: &str, text: &str, len: usize) -> Result<Vec<u8>, Error> {
    base64_decode(text)
        .filter(|b| b.len() == len)
        .ok_or_else(|| Error::BadRequest(format!("{field} must be base64 of exactly {len} bytes")))
}

// ---- identifiers, tokens, fingerprints, times ---------------------------------------------

/// Lower-case base32 of fresh random bytes.
fn random_base32<const N: usize>() -> String {
    BASE32_NOPAD.encode(&random_array::<N>()).to_ascii_lowercase()
}

/// A fresh identity id: `sc-` + 24 base32 characters (120 bits).
pub(crate) fn new_identity_id() -> String {
    format!("sc-{}", random_base32::<15>())
}

/// A fresh topic id: `tp-` + 24 base32 characters (120 bits).
pub(crate) fn new_topic_id() -> String {
    format!("tp-{}", random_base32::<15>())
}

/// A fresh rendezvous token: `rv-` + 32 base32 characters (160 bits).
pub(crate) fn new_rendezvous_token() -> String {
    format!("rv-{}", random_base32::<20>())
}

/// A fresh bearer token (256 bits).
pub(crate) fn new_api_token() -> String {
    format!("sct-{}", random_base32::<32>())
}

/// `400` unless `text` is a well-formed identity id.
pub(crate) fn identity_id(field: &str, text: &str) -> Result<(), Error> {
    if is_identity_id(text) {
        Ok(())
    } else {
        Err(Error::BadRequest(format!("{field} must be `sc-` followed by 24 lower-case base32 characters")))
    }
}

/// `YYYY-MM-DD HH:MM:SS` in UTC, the seed's timestamp format.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", day_secs / 3600, day_secs % 3600 / 60, day_secs % 60)
}

// ---- GET /api/v2 and /api/v2/stats --------------------------------------------------------

async fn info(State(state): State<AppState>) -> Json<wire::Info> {
    let l = &state.limits().stringcup;
    Json(wire::Info {
        protocol: "stringcup".into(),
        version: 2,
        algo: HEADER_ALGO.into(),
        message_max_bytes: l.message_max_bytes,
        inbox_max_pending_messages: l.inbox_max_pending_messages,
        inbox_max_pending_bytes: l.inbox_max_pending_bytes,
        inbox_max_pending_per_sender: l.inbox_max_pending_per_sender,
        inbox_max_pending_bytes_per_sender: l.inbox_max_pending_bytes_per_sender,
        batch_max_messages: MAX_BATCH,
        batch_max_body_bytes: l.batch_max_body_bytes,
        ack_max_ids: MAX_ACK,
        inbox_page_max: MAX_PAGE,
        inbox_page_default: DEFAULT_PAGE,
        long_poll_max_wait_seconds: l.long_poll_max_secs,
        rate_limits: wire::RateLimits {
            send_per_hour: l.sends_per_hour,
            inbox_per_hour: l.inbox_requests_per_hour,
            other_per_hour: l.other_requests_per_hour,
            registrations_per_hour_per_ip: l.registrations_per_hour_per_ip,
        },
        token_inactivity_ttl_seconds: l.token_inactivity_ms / 1000,
        idempotency_key_ttl_seconds: l.idempotency_ttl_ms / 1000,
        rendezvous_ttl_seconds: l.rendezvous_ttl_ms / 1000,
        topic_max_members: l.topic_max_members,
        topic_max_add_per_call: l.topic_max_add,
    })
}

/// A count as published: `None` below the threshold, else rounded down to a multiple of it.
fn coarse(n: u64, min: u64) -> Option<u64> {
    if n < min {
        return None;
    }
    Some(if min > 1 { n - n % min } else { n })
}

async fn stats(State(state): State<AppState>) -> Result<Json<wire::Stats>, Error> {
    let limits = &state.limits().stringcup;
    let refresh = Duration::from_millis(u64::try_from(limits.stats_refresh_ms).unwrap_or(0));
    let cached = *state.shared().stringcup.stats.lock().unwrap_or_else(PoisonError::into_inner);
    let counts = match cached {
        Some((at, counts)) if at.elapsed() < refresh => counts,
        _ => {
            let counts = state.store().stringcup().counts().await?;
            *state.shared().stringcup.stats.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((Instant::now(), counts));
            counts
        }
    };
    let min = limits.stats_min_count;
    Ok(Json(wire::Stats {
        identities: coarse(counts.identities, min),
        topics: coarse(counts.topics, min),
        messages_pending: coarse(counts.messages_pending, min),
        messages_stored_total: coarse(counts.messages_stored, min),
        suppressed_below: min,
        rounded_down_to_multiple_of: min.max(1),
        refreshed_at_most_every_seconds: limits.stats_refresh_ms / 1000,
    }))
}

/// `(status, json)` as a response.
pub(crate) fn json_response<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    (status, Json(body)).into_response()
}

/// Keys of idempotent sends in flight, per sender: a second request with the same key while
/// the first is being stored gets `409` instead of queueing behind it.
pub(crate) struct InFlight<'a> {
    state: &'a StringcupState,
    key: (String, String),
}

impl<'a> InFlight<'a> {
    /// Claims `(sender, key)`, or `409`.
    pub(crate) fn claim(state: &'a AppState, sender: &str, key: &str) -> Result<Self, Error> {
        let sc = &state.shared().stringcup;
        let entry = (sender.to_owned(), key.to_owned());
        if !sc.in_flight.lock().unwrap_or_else(PoisonError::into_inner).insert(entry.clone()) {
            return Err(Error::Conflict(crate::error::Conflict::IdempotencyInFlight));
        }
        Ok(Self { state: sc, key: entry })
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.state.in_flight.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.key);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn utc_renders_the_seed_format() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_774_353_600_000), "2026-03-24 12:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
    }

    #[test]
    fn issued_identifiers_have_their_documented_shapes() {
        assert!(is_identity_id(&new_identity_id()));
        assert!(crate::store::stringcup::is_topic_id(&new_topic_id()));
        assert!(is_rendezvous_token(&new_rendezvous_token()));
        assert!(is_identity_id("sc-cucxeqysmwr2a45nzo34h6lz"));
        assert!(!is_identity_id("bob"));
        assert!(!is_identity_id("sc-CUCXEQYSMWR2A45NZO34H6LZ"));
        assert_ne!(new_identity_id(), new_identity_id());
    }

    #[test]
    fn small_counts_are_suppressed_and_the_rest_rounded() {
        assert_eq!(coarse(9, 10), None);
        assert_eq!(coarse(10, 10), Some(10));
        assert_eq!(coarse(1234, 10), Some(1230));
        assert_eq!(coarse(3, 0), Some(3));
    }

    #[test]
    fn wait_is_clamped_and_junk_refused() {
        assert_eq!(parse_wait(None, Some("99"), 25).unwrap(), Duration::from_secs(25));
        assert_eq!(parse_wait(None, Some("0.5"), 25).unwrap(), Duration::from_millis(500));
        assert_eq!(parse_wait(None, None, 25).unwrap(), Duration::ZERO);
        assert!(parse_wait(None, Some("-1"), 25).is_err());
        assert!(parse_wait(None, Some("soon"), 25).is_err());
        assert!(parse_wait(Some(&serde_json::json!("5")), None, 25).is_err());
    }
}
