//! Live-write rules (§6): exact resubmission, the time window, the service-wide nonce cache, and
//! the client's bounded `Max-Seen-Nonce` handling. Pure: the caller supplies history and cache
//! state and persists what these functions decide.

use super::envelope::{Envelope, MAX_SAFE_NONCE};
use super::error_code::ErrorCode;

/// The RECOMMENDED live-write window (300 s).
pub const DEFAULT_WINDOW_MS: i64 = 300_000;
/// Largest jump a client applies from one `Max-Seen-Nonce` header (2^32).
pub const MAX_NONCE_JUMP: u64 = 1 << 32;

/// The cached greatest accepted nonce of one actor, and until when that cache entry is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonceCacheEntry {
    /// Greatest accepted nonce.
    pub max_nonce: u64,
    /// The entry is valid while `now < valid_until` (acceptance time + twice the window).
    pub valid_until: i64,
}

impl NonceCacheEntry {
    /// Whether the entry still binds at `now`.
    pub fn is_valid(&self, now_ms: i64) -> bool {
        now_ms < self.valid_until
    }

    /// The entry after accepting `nonce` at `now`: the cache lives for twice the window from the
    /// most recent acceptance (§6.2), so an envelope dated one window ahead cannot come back.
    pub fn after_accept(previous: Option<&Self>, nonce: u64, now_ms: i64, window_ms: i64) -> Self {
        let max_nonce = previous.filter(|p| p.is_valid(now_ms)).map_or(nonce, |p| p.max_nonce.max(nonce));
        Self { max_nonce, valid_until: now_ms.saturating_add(window_ms.saturating_mul(2)) }
    }
}

/// What a receiver does with a live write that passed steps 1–5.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveWrite {
    /// New acceptance: apply it, record it in history and update the nonce cache.
    Accept,
    /// Exact resubmission of an accepted envelope: answer with the original result, change
    /// nothing, skip time and nonce checks.
    Resubmission,
}

/// Why a live write was refused (the writer's fault: stale, replayed or clock-skewed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LiveWriteError {
    /// `|now - created_at|` exceeds the window.
    #[error("created_at is outside the live-write window")]
    TimestampOutOfWindow,
    /// The nonce does not exceed the cached maximum (send it in `Max-Seen-Nonce`).
    #[error("nonce must be greater than {max_seen}")]
    NonceNotGreater {
        /// The effective maximum nonce.
        max_seen: u64,
    },
}

impl LiveWriteError {
    /// The Identity error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            LiveWriteError::TimestampOutOfWindow => ErrorCode::TimestampOutOfWindow,
            LiveWriteError::NonceNotGreater { .. } => ErrorCode::NonceNotGreater,
        }
    }
}

/// Steps 6–8 of §6.1 for a verified envelope. `in_history` says whether an envelope with the same
/// hash is in durable accepted history; `cache` is the actor's nonce cache entry, if any.
pub fn check_live_write(
    envelope: &Envelope,
    in_history: bool,
    cache: Option<&NonceCacheEntry>,
    now_ms: i64,
    window_ms: i64,
) -> Result<LiveWrite, LiveWriteError> {
    if in_history {
        return Ok(LiveWrite::Resubmission);
    }
    let event = envelope.event();
    if now_ms.abs_diff(event.created_at) > window_ms.unsigned_abs() {
        return Err(LiveWriteError::TimestampOutOfWindow);
    }
    if let Some(entry) = cache.filter(|c| c.is_valid(now_ms))
        && event.nonce <= entry.max_nonce
    {
        return Err(LiveWriteError::NonceNotGreater { max_seen: entry.max_nonce });
    }
    Ok(LiveWrite::Accept)
}

/// The clock-derived nonce for a new event: `max(last + 1, created_at)` (§6.2).
pub fn next_nonce(last: Option<u64>, created_at_ms: i64) -> u64 {
    let clock = u64::try_from(created_at_ms).unwrap_or(0).max(1);
    last.map_or(clock, |l| l.saturating_add(1).max(clock))
}

/// A `Max-Seen-Nonce` header a client must not apply (the service's fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaxSeenNonceError {
    /// Not a decimal safe integer.
    #[error("Max-Seen-Nonce is not a decimal safe integer")]
    Malformed,
    /// Would advance the nonce by more than 2^32: a faulty or hostile service.
    #[error("Max-Seen-Nonce {0} jumps too far ahead")]
    TooFar(u64),
}

/// A client's next nonce after a `Max-Seen-Nonce` header (§6.2): never more than 2^32 beyond
/// `max(next_nonce, now)`; advanced to `header + 1` when the header is at or past `next_nonce`.
pub fn apply_max_seen_nonce(next_nonce: u64, now_ms: i64, header: &str) -> Result<u64, MaxSeenNonceError> {
    if header.is_empty() || header.len() > 16 || !header.bytes().all(|b| b.is_ascii_digit()) {
        return Err(MaxSeenNonceError::Malformed);
    }
    let value: u64 = header.parse().map_err(|_| MaxSeenNonceError::Malformed)?;
    if value > MAX_SAFE_NONCE {
        return Err(MaxSeenNonceError::Malformed);
    }
    let base = next_nonce.max(u64::try_from(now_ms).unwrap_or(0));
    if value > base.saturating_add(MAX_NONCE_JUMP) || value >= MAX_SAFE_NONCE {
        return Err(MaxSeenNonceError::TooFar(value));
    }
    Ok(if value >= next_nonce { value + 1 } else { next_nonce })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_derived_nonces_stay_monotonic() {
        assert_eq!(next_nonce(None, 1000), 1000);
        assert_eq!(next_nonce(Some(1000), 1000), 1001);
        assert_eq!(next_nonce(Some(5), 1000), 1000);
        assert_eq!(next_nonce(None, 0), 1);
    }

    #[test]
    fn malformed_headers_are_refused() {
        for h in ["", "-1", "+5", "1.5", "0x10", "99999999999999999"] {
            assert_eq!(apply_max_seen_nonce(10, 1000, h), Err(MaxSeenNonceError::Malformed), "{h}");
        }
    }
}
