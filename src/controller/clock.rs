//! Time between two readings of the wall clock, for the usage ledger, idle checks and drains.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// Time from `since` to `now`; zero when `now` is earlier (clocks of different hosts).
pub(crate) fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO)
}
