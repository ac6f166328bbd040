//! Supervision of the runtime's long-lived loops (receivers, outbox, housekeeping, group
//! followers, LAN, ASNET).
//!
//! - Each run of a loop is its own task, so a panic ends that run, not the supervisor.
//! - A run that ends before shutdown (it returned, failed or panicked) is logged and the loop is
//!   started again after a pause that doubles from [`Restart::first`] up to [`Restart::cap`]; a
//!   run that lasted [`Restart::healthy`] resets the pause, so a loop that fails once an hour is
//!   not held back by one that failed at start-up.
//! - Shutdown (the runtime's watch turning true) stops the supervisor: a run ending after it is
//!   not restarted, and a pause is cut short. Dropping or aborting the supervisor's task aborts
//!   the run it holds.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How a supervised loop is restarted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Restart {
    /// Pause before the first restart.
    pub first: Duration,
    /// Longest pause between restarts.
    pub cap: Duration,
    /// A run at least this long counts as healthy: the next failure starts from `first` again.
    pub healthy: Duration,
}

impl Restart {
    /// The runtime's loops: 1 s, doubling up to 30 s; a minute of running resets it.
    pub(crate) const RUNTIME: Self =
        Self { first: Duration::from_secs(1), cap: Duration::from_secs(30), healthy: Duration::from_secs(60) };

    /// The pause before restart number `n` (1 for the first) in a row.
    pub(crate) fn pause(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1).min(16)).unwrap_or(u32::MAX);
        self.first.saturating_mul(factor).min(self.cap)
    }
}

/// Aborts the run it holds when dropped (the supervisor's task was aborted or dropped).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Runs the loop `make` builds, under supervision (see the module doc), until `stop` turns true.
pub(crate) fn supervise<F, Fut>(
    name: String,
    mut stop: watch::Receiver<bool>,
    restart: Restart,
    mut make: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut in_a_row = 0u32;
        loop {
            if *stop.borrow() {
                return;
            }
            let started = Instant::now();
            let mut run = AbortOnDrop(tokio::spawn(make()));
            let outcome = (&mut run.0).await;
            if *stop.borrow() {
                return;
            }
            match outcome {
                Ok(()) => tracing::warn!("{name} stopped before shutdown; restarting it"),
                Err(e) if e.is_panic() => {
                    let payload = e.into_panic();
                    tracing::error!("{name} panicked ({}); restarting it", panic_text(payload.as_ref()));
                }
                Err(e) => tracing::warn!("{name} ended ({e}); restarting it"),
            }
            if started.elapsed() >= restart.healthy {
                in_a_row = 0;
            }
            in_a_row = in_a_row.saturating_add(1);
            let pause = restart.pause(in_a_row);
            tracing::debug!("{name}: restart {in_a_row} in a row after {pause:?}");
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const QUICK: Restart =
        Restart { first: Duration::from_millis(5), cap: Duration::from_millis(40), healthy: Duration::from_secs(60) };

    /// Waits until `runs` reaches `n` (at most 5 s).
    async fn runs_reach(runs: &AtomicU32, n: u32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while runs.load(Ordering::SeqCst) < n {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }

    /// A loop body: counts its runs; the first `fail_first` runs panic, later ones run until
    /// shutdown as the runtime's loops do.
    fn body(
        runs: Arc<AtomicU32>,
        stop: watch::Receiver<bool>,
        fail_first: u32,
        panic: bool,
    ) -> impl FnMut() -> futures_util::future::BoxFuture<'static, ()> + Send + 'static {
        move || {
            let runs = runs.clone();
            let mut stop = stop.clone();
            Box::pin(async move {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                if n < fail_first {
                    if panic {
                        panic!("run {n} fails on purpose");
                    }
                    return;
                }
                while !*stop.borrow() {
                    if stop.changed().await.is_err() {
                        return;
                    }
                }
            })
        }
    }

    #[tokio::test]
    async fn a_loop_that_panics_once_is_restarted_and_stops_on_shutdown() {
        let (tx, rx) = watch::channel(false);
        let runs = Arc::new(AtomicU32::new(0));
        let task = supervise("test loop".into(), rx.clone(), QUICK, body(runs.clone(), rx, 1, true));
        assert!(runs_reach(&runs, 2).await, "the loop was not started again after its panic");
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("supervisor stops on shutdown").unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 2, "a healthy run is not restarted");
    }

    #[tokio::test]
    async fn a_loop_that_returns_early_is_restarted_with_growing_pauses() {
        let (tx, rx) = watch::channel(false);
        let runs = Arc::new(AtomicU32::new(0));
        let started = Instant::now();
        let task = supervise("test loop".into(), rx.clone(), QUICK, body(runs.clone(), rx, 3, false));
        assert!(runs_reach(&runs, 4).await, "the loop was not restarted after returning");
        // Three restarts in a row: 5 + 10 + 20 ms of pauses at least.
        assert!(started.elapsed() >= Duration::from_millis(35), "restarted without backing off");
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("supervisor stops on shutdown").unwrap();
    }

    #[tokio::test]
    async fn shutdown_during_a_pause_ends_the_supervisor_without_a_restart() {
        let (tx, rx) = watch::channel(false);
        let runs = Arc::new(AtomicU32::new(0));
        let slow = Restart { first: Duration::from_secs(3600), ..QUICK };
        let task = supervise("test loop".into(), rx.clone(), slow, body(runs.clone(), rx, 1, false));
        assert!(runs_reach(&runs, 1).await);
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("shutdown cuts the pause short").unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn restart_pauses_double_up_to_the_cap() {
        let r = Restart::RUNTIME;
        let secs: Vec<u64> = (1..=8).map(|n| r.pause(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(r.pause(u32::MAX), Duration::from_secs(30));
    }
}
