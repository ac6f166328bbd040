//! Connection-level defences, below the routes: a cap on the connections one client address may
//! hold open (checked when a connection is accepted, before TLS), an absolute deadline on every
//! request body, and the process's descriptor limit raised at start.
//!
//! - [`ConnLimiter`] counts open connections per client (IPv4 address or IPv6 /64, as the rate
//!   limiter keys them); [`LimitAcceptor`] refuses (closes at once) a connection over the cap and
//!   wraps the others in [`Counted`], which gives the slot back when the connection is dropped.
//! - `body_guard` gives a request's body one deadline from the moment the head arrived (a
//!   client that trickles a body, one byte every few seconds, fails the read at the deadline and
//!   its connection is closed, where a per-read timeout would be reset by every byte), and
//!   reserves the body's size from one [`BodyBudget`] shared by all requests before it is read,
//!   so many large bodies at once meet `503` instead of the memory limit.
//! - [`raise_nofile_limit`] lifts the soft descriptor limit to the hard one, so the cap, not the
//!   process, decides who is refused.

use std::collections::HashMap;
use std::future::{Ready, ready};
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::AppState;
use crate::limits::IpLimiter;

/// Open connections per client address.
#[derive(Debug)]
pub struct ConnLimiter {
    per_ip: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl ConnLimiter {
    /// A limiter allowing `per_ip` open connections per client; 0 means no limit.
    pub fn new(per_ip: usize) -> Arc<Self> {
        Arc::new(Self { per_ip, open: Mutex::new(HashMap::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a slot for a connection from `ip`, or `None` when it already holds the cap.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr) -> Option<ConnGuard> {
        let key = IpLimiter::key(ip);
        if self.per_ip > 0 {
            let mut open = self.lock();
            let count = open.entry(key).or_insert(0);
            if *count >= self.per_ip {
                return None;
            }
            *count += 1;
        }
        Some(ConnGuard { limiter: self.clone(), key })
    }

    /// Open connections from `ip` now.
    pub fn open(&self, ip: IpAddr) -> usize {
        self.lock().get(&IpLimiter::key(ip)).copied().unwrap_or(0)
    }
}

/// One open connection's slot; dropping it gives the slot back.
#[derive(Debug)]
pub struct ConnGuard {
    limiter: Arc<ConnLimiter>,
    key: IpAddr,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if self.limiter.per_ip == 0 {
            return;
        }
        let mut open = self.limiter.lock();
        if let Some(count) = open.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// The acceptor that applies a [`ConnLimiter`] (first in the chain, before any TLS handshake).
#[derive(Debug, Clone)]
pub struct LimitAcceptor {
    limiter: Arc<ConnLimiter>,
}

impl LimitAcceptor {
    /// An acceptor counting against `limiter`.
    pub fn new(limiter: Arc<ConnLimiter>) -> Self {
        Self { limiter }
    }
}

impl<S> axum_server::accept::Accept<TcpStream, S> for LimitAcceptor {
    type Stream = Counted<TcpStream>;
    type Service = S;
    type Future = Ready<io::Result<(Self::Stream, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let accepted = stream.peer_addr().and_then(|peer| match self.limiter.acquire(peer.ip()) {
            Some(guard) => Ok((Counted { inner: stream, _guard: guard }, service)),
            None => {
                tracing::debug!(%peer, "refused: too many open connections from this address");
                Err(io::Error::other("too many open connections from this address"))
            }
        });
        ready(accepted)
    }
}

/// A stream holding its connection's slot until it is dropped.
#[derive(Debug)]
pub struct Counted<T> {
    inner: T,
    _guard: ConnGuard,
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A request body that fails once its deadline passes, however it is being read.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

/// The error a body past its deadline reads as.
#[derive(Debug, thiserror::Error)]
#[error("request body not received within {0:?}")]
pub struct BodyDeadline(Duration);

impl HttpBody for DeadlineBody {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyDeadline(self.limit).into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Request-body bytes in flight across all requests, in KiB permits.
#[derive(Debug)]
pub struct BodyBudget {
    kib: Arc<Semaphore>,
    total_kib: u32,
    unknown_length_kib: u32,
}

impl BodyBudget {
    /// A budget of `bytes`; a body of unknown length reserves `largest_body` (capped at the
    /// whole budget, so one such request always fits an idle relay).
    pub fn new(bytes: u64, largest_body: u64) -> Self {
        let total_kib = kib(bytes).max(1);
        Self {
            kib: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            unknown_length_kib: kib(largest_body).clamp(1, total_kib),
        }
    }

    /// Reserves room for a body of `length` bytes (`None`: unknown), or `None` when the budget
    /// cannot hold it now.
    pub fn reserve(&self, length: Option<u64>) -> Option<OwnedSemaphorePermit> {
        let want = length.map_or(self.unknown_length_kib, |l| kib(l).clamp(1, self.total_kib));
        self.kib.clone().try_acquire_many_owned(want).ok()
    }

    /// KiB free now.
    pub fn available_kib(&self) -> usize {
        self.kib.available_permits()
    }
}

fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// Middleware: the request's body must fit the relay's [`BodyBudget`] now (else `503` with
/// `Retry-After`, before a byte of it is read) and arrive whole within
/// `Limits::request_body_timeout_ms` of its head. The reservation is held until the answer.
/// Bodies already complete (none, or small and buffered) are left alone.
pub(crate) async fn body_guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let length = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let Some(_reserved) = state.shared().body_budget.reserve(length) else {
        tracing::debug!(?length, "request body refused: the in-flight budget is spent");
        return crate::Error::Busy.into_response();
    };
    let limit = Duration::from_millis(state.limits().request_body_timeout_ms.max(1));
    let request =
        request.map(|inner| Body::new(DeadlineBody { inner, deadline: Box::pin(tokio::time::sleep(limit)), limit }));
    next.run(request).await
}

/// Raises the soft limit on open descriptors to the hard limit; returns the limit in force.
pub fn raise_nofile_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_counts_per_address_and_slots_come_back_on_drop() {
        let limiter = ConnLimiter::new(2);
        let a: IpAddr = "198.18.0.1".parse().unwrap();
        let b: IpAddr = "198.18.0.2".parse().unwrap();
        let first = limiter.acquire(a).unwrap();
        let _second = limiter.acquire(a).unwrap();
        assert!(limiter.acquire(a).is_none());
        assert!(limiter.acquire(b).is_some(), "another address has its own slots");
        drop(first);
        assert_eq!(limiter.open(a), 1);
        assert!(limiter.acquire(a).is_some());
    }

    #[test]
    fn ipv6_clients_share_their_64() {
        let limiter = ConnLimiter::new(1);
        let _one = limiter.acquire("2001:db8::1".parse().unwrap()).unwrap();
        assert!(limiter.acquire("2001:db8::2".parse().unwrap()).is_none());
        assert!(limiter.acquire("2001:db8:0:1::1".parse().unwrap()).is_some());
    }

    #[test]
    fn the_body_budget_holds_reservations_until_dropped() {
        let budget = BodyBudget::new(1024 * 1024, 70 * 1024 * 1024);
        let big = budget.reserve(Some(900 * 1024)).unwrap();
        assert!(budget.reserve(Some(200 * 1024)).is_none());
        let small = budget.reserve(Some(100)).unwrap();
        // Unknown length reserves the largest body, capped at the whole budget.
        assert!(budget.reserve(None).is_none());
        drop((big, small));
        let whole = budget.reserve(None).unwrap();
        assert_eq!(budget.available_kib(), 0);
        drop(whole);
        assert_eq!(budget.available_kib(), 1024);
    }

    #[test]
    fn zero_means_no_cap() {
        let limiter = ConnLimiter::new(0);
        let ip: IpAddr = "198.18.0.1".parse().unwrap();
        let guards: Vec<_> = (0..100).map(|_| limiter.acquire(ip).unwrap()).collect();
        assert_eq!(guards.len(), 100);
    }
}
