//! What is in flight on one connection: the idle timeout and the header deadline both read it,
//! the connection's service writes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Requests in flight on one connection, how many have started, and when the last one started
/// or ended.
pub(super) struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    requests_started: AtomicU64,
    /// Milliseconds after `started`.
    last_change_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            requests_started: AtomicU64::new(0),
            last_change_ms: AtomicU64::new(0),
        }
    }

    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Requests whose headers were complete and handed to the service.
    pub(super) fn requests_started(&self) -> u64 {
        self.requests_started.load(Ordering::Acquire)
    }

    fn touch(&self) {
        let elapsed = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_change_ms.store(elapsed, Ordering::Release);
    }

    /// How long nothing has been in flight; zero while something is.
    pub(super) fn idle_for(&self) -> Duration {
        if self.in_flight() > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last_change_ms.load(Ordering::Acquire));
        self.started.elapsed().saturating_sub(last)
    }

    /// When the connection becomes idle for `timeout` if nothing happens meanwhile.
    pub(super) fn idle_deadline(&self, timeout: Duration) -> Instant {
        Instant::now() + timeout.saturating_sub(self.idle_for())
    }
}

/// Ends a request's activity when its handler finishes (or is dropped).
pub(super) struct InFlight(Arc<Activity>);

impl InFlight {
    /// A request's headers are complete and it is handed to the service.
    pub(super) fn start(activity: Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.requests_started.fetch_add(1, Ordering::AcqRel);
        activity.touch();
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
