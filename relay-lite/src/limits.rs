//! Rate limiters: an exact sliding window for sends per mailbox, and a GCRA (one timestamp per
//! key) for requests per client IP, where the number of keys is up to the internet.
//!
//! Both answer "not now" with how long to wait, which becomes `Retry-After`. Both live in memory:
//! a restarted relay forgets them, which is acceptable for limits measured in a minute (and, for
//! Stringcup's hourly budgets, errs on the caller's side). [`SlidingWindow::take`] also reports
//! the [`Quota`] left, which Stringcup advertises in `X-RateLimit-*` headers.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// At most `limit` events per key in any window of `window`; exact (keeps the event times).
#[derive(Debug)]
pub struct SlidingWindow {
    limit: u32,
    window: Duration,
    events: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl SlidingWindow {
    /// A limiter allowing `limit` events per `window`; `limit` 0 means unlimited.
    pub fn new(limit: u32, window: Duration) -> Self {
        Self { limit, window, events: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, VecDeque<Instant>>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records an event for `key` at `now`, or says how long until one would be allowed.
    pub fn check(&self, key: &str, now: Instant) -> Result<(), Duration> {
        if self.limit == 0 {
            return Ok(());
        }
        let mut map = self.lock();
        let times = map.entry(key.to_owned()).or_default();
        while times.front().is_some_and(|t| now.saturating_duration_since(*t) >= self.window) {
            times.pop_front();
        }
        if times.len() >= self.limit as usize {
            let oldest = times.front().copied().unwrap_or(now);
            return Err((oldest + self.window).saturating_duration_since(now));
        }
        times.push_back(now);
        Ok(())
    }

    /// Like [`check`](Self::check), but says what is left of the budget either way: `Ok` with
    /// the quota after counting this event, `Err` with the quota (nothing remaining, `reset` =
    /// the wait) when refused. `None` when the limiter is unlimited.
    pub fn take(&self, key: &str, now: Instant) -> Option<Result<Quota, Quota>> {
        if self.limit == 0 {
            return None;
        }
        let refused = self.check(key, now).err();
        let map = self.lock();
        let times = map.get(key);
        let used = times.map_or(0, VecDeque::len);
        let reset = times
            .and_then(|t| t.front())
            .map_or(Duration::ZERO, |oldest| (*oldest + self.window).saturating_duration_since(now));
        let remaining = u32::try_from((self.limit as usize).saturating_sub(used)).unwrap_or(0);
        Some(match refused {
            None => Ok(Quota { limit: self.limit, remaining, reset }),
            Some(wait) => Err(Quota { limit: self.limit, remaining: 0, reset: wait }),
        })
    }

    /// Forgets keys with no event inside the window.
    pub fn prune(&self, now: Instant) {
        let window = self.window;
        self.lock().retain(|_, times| times.back().is_some_and(|t| now.saturating_duration_since(*t) < window));
    }
}

/// What is left of a budget: how many events the window allows, how many remain, and how long
/// until the oldest counted event leaves the window (when `remaining` next grows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Events allowed per window.
    pub limit: u32,
    /// Events still allowed now.
    pub remaining: u32,
    /// Time until one more event is allowed back.
    pub reset: Duration,
}

/// Requests per client per minute, by the generic cell rate algorithm: a burst of up to the
/// per-minute limit, refilled evenly. IPv6 clients are keyed by their /64, since one host
/// usually owns a whole /64.
#[derive(Debug)]
pub struct IpLimiter {
    per_minute: u32,
    /// Theoretical arrival time per client.
    tat: Mutex<HashMap<IpAddr, Instant>>,
}

impl IpLimiter {
    /// A limiter allowing `per_minute` requests per client; 0 means unlimited.
    pub fn new(per_minute: u32) -> Self {
        Self { per_minute, tat: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, Instant>> {
        self.tat.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key a client is counted under: its IPv4 address, or its IPv6 /64.
    pub fn key(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let bits = u128::from(v6) & !((1u128 << 64) - 1);
                    IpAddr::V6(bits.into())
                }
            },
        }
    }

    /// Counts a request from `ip` at `now`, or says how long until one would be allowed.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let interval = Duration::from_secs(60) / self.per_minute;
        let tolerance = Duration::from_secs(60).saturating_sub(interval);
        let mut map = self.lock();
        let tat = map.entry(Self::key(ip)).or_insert(now);
        let start = (*tat).max(now);
        let ahead = start.saturating_duration_since(now);
        if ahead > tolerance {
            return Err(ahead - tolerance);
        }
        *tat = start + interval;
        Ok(())
    }

    /// Forgets clients that are back to a full burst.
    pub fn prune(&self, now: Instant) {
        self.lock().retain(|_, tat| *tat > now);
    }
}

/// The limits of the letmeknow group and invite API; `Default` is `specs/letmeknow-relay.md`'s.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LetmeknowLimits {
    /// Largest MLSMessage or invite body in bytes (`413` above).
    pub max_message: usize,
    /// Group messages older than this are deleted (ms); the group's epoch is kept.
    pub retention_ms: i64,
    /// Longest long-poll hold (seconds).
    pub max_wait_secs: u64,
    /// Longest invite lifetime (seconds).
    pub max_invite_ttl_secs: u64,
    /// Accepted posts per group in any sliding 60-second window; 0 means no limit.
    pub posts_per_group_minute: u32,
    /// Reads (group logs, invites) that may be parked in a long-poll at once.
    pub long_poll_slots: usize,
    /// Of those, how many one client address (IPv4, or IPv6 /64) may hold; a wait beyond it is
    /// `429` with `Retry-After`. 0 means no per-address share.
    pub long_poll_per_ip: usize,
}

impl Default for LetmeknowLimits {
    fn default() -> Self {
        use switchboard_core::protocol::letmeknow as lmk;
        Self {
            max_message: lmk::MAX_MESSAGE,
            retention_ms: 7 * 24 * 3600 * 1000,
            max_wait_secs: lmk::MAX_WAIT_SECS,
            max_invite_ttl_secs: lmk::MAX_INVITE_TTL,
            posts_per_group_minute: 600,
            long_poll_slots: 1024,
            long_poll_per_ip: 64,
        }
    }
}

/// The limits of the Agent Mail 1.0 relay (`/v1/mailboxes`): what one mailbox may hold. A new
/// packet over either is refused with `rate_limited` before anything is stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AgentMailLimits {
    /// Most undeleted, unexpired packets per mailbox.
    pub mailbox_max_packets: u32,
    /// Most undeleted, unexpired packet bytes per mailbox.
    pub mailbox_max_bytes: u64,
}

impl Default for AgentMailLimits {
    fn default() -> Self {
        Self { mailbox_max_packets: 10_000, mailbox_max_bytes: 256 * 1024 * 1024 }
    }
}

impl AgentMailLimits {
    /// The store's quota.
    pub fn quota(&self) -> crate::store::agent_mail::Quota {
        crate::store::agent_mail::Quota {
            packets: i64::from(self.mailbox_max_packets),
            bytes: i64::try_from(self.mailbox_max_bytes).unwrap_or(i64::MAX),
        }
    }
}

/// `Retry-After` seconds for a wait: rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sliding_window_allows_the_limit_then_refuses_until_the_oldest_ages_out() {
        let w = SlidingWindow::new(3, Duration::from_secs(60));
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(w.check("m", t0 + Duration::from_secs(i)).is_ok());
        }
        let wait = w.check("m", t0 + Duration::from_secs(10)).unwrap_err();
        assert_eq!(wait, Duration::from_secs(50));
        assert!(w.check("other", t0).is_ok(), "keys are independent");
        assert!(w.check("m", t0 + Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn take_reports_the_remaining_budget_and_the_wait_when_refused() {
        let w = SlidingWindow::new(2, Duration::from_secs(3600));
        let t0 = Instant::now();
        let q = w.take("a", t0).unwrap().unwrap();
        assert_eq!((q.limit, q.remaining, q.reset), (2, 1, Duration::from_secs(3600)));
        let q = w.take("a", t0 + Duration::from_secs(600)).unwrap().unwrap();
        assert_eq!((q.remaining, q.reset), (0, Duration::from_secs(3000)));
        let q = w.take("a", t0 + Duration::from_secs(1200)).unwrap().unwrap_err();
        assert_eq!((q.remaining, q.reset), (0, Duration::from_secs(2400)));
        assert!(SlidingWindow::new(0, Duration::from_secs(1)).take("a", t0).is_none());
    }

    #[test]
    fn gcra_allows_a_burst_of_the_limit_then_one_per_interval() {
        let l = IpLimiter::new(60);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..60 {
            assert!(l.check(ip, t0).is_ok());
        }
        let wait = l.check(ip, t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(1));
        assert!(l.check(ip, t0 + Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn ipv6_clients_share_a_limit_per_64() {
        let l = IpLimiter::new(1);
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2::ffff".parse().unwrap();
        let t0 = Instant::now();
        assert!(l.check(a, t0).is_ok());
        assert!(l.check(b, t0).is_err());
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
