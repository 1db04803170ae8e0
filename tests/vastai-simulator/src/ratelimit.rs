//! Per-route, per-caller rate limits as Vast.ai applies them: a minimum interval between calls
//! (a call that comes too early is refused and, with a penalty, pushes the next allowed call
//! further out) or a count per sliding window. Refusals carry no `Retry-After`.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The routes the simulator serves, for limits, faults and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// `POST /api/v0/bundles/`
    Search,
    /// `PUT /api/v0/asks/{id}/`
    Create,
    /// `GET /api/v0/instances/{id}/`
    Get,
    /// `GET /api/v1/instances/`
    List,
    /// `DELETE /api/v0/instances/{id}/`
    Destroy,
    /// `PUT /api/v0/instances/{id}/` (state, label)
    Manage,
    /// `PUT /api/v0/instances/request_logs/{id}/`
    Logs,
    /// `GET /api/v0/users/current/`
    User,
}

/// One route's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteLimit {
    /// Minimum time between two calls; 0 = none.
    #[serde(default)]
    pub interval_ms: u64,
    /// A refused call delays the next allowed one by this much from the refusal; 0 = none.
    #[serde(default)]
    pub penalty_ms: u64,
    /// At most this many calls per `window_ms`.
    #[serde(default)]
    pub per_window: Option<u32>,
    #[serde(default)]
    pub window_ms: u64,
}

impl RouteLimit {
    pub fn interval(ms: u64) -> RouteLimit {
        RouteLimit {
            interval_ms: ms,
            penalty_ms: 0,
            per_window: None,
            window_ms: 0,
        }
    }

    pub fn per_minute(calls: u32) -> RouteLimit {
        RouteLimit {
            interval_ms: 0,
            penalty_ms: 0,
            per_window: Some(calls),
            window_ms: 60_000,
        }
    }

    pub fn with_penalty(mut self, ms: u64) -> RouteLimit {
        self.penalty_ms = ms;
        self
    }

    /// Times divided by `factor` (at least 1 ms where they were set).
    pub fn scaled(&self, factor: u64) -> RouteLimit {
        let factor = factor.max(1);
        let scale = |ms: u64| if ms == 0 { 0 } else { (ms / factor).max(1) };
        RouteLimit {
            interval_ms: scale(self.interval_ms),
            penalty_ms: scale(self.penalty_ms),
            per_window: self.per_window,
            window_ms: scale(self.window_ms),
        }
    }

    /// The `threshold=` figure of the 429 text: seconds between calls.
    fn threshold(&self) -> String {
        match self.per_window {
            Some(calls) if self.interval_ms == 0 => {
                format!("{calls} per {}s", self.window_ms as f64 / 1000.0)
            }
            _ => format!("{}", self.interval_ms as f64 / 1000.0),
        }
    }
}

#[derive(Debug, Default)]
struct Pace {
    next_allowed: Option<Instant>,
    recent: VecDeque<Instant>,
}

/// Limits for every (route, caller) pair.
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    limits: HashMap<Route, RouteLimit>,
    paces: HashMap<(Route, String), Pace>,
}

impl Limiter {
    pub fn new(limits: &[(Route, RouteLimit)]) -> Limiter {
        Limiter {
            limits: limits.iter().copied().collect(),
            paces: HashMap::new(),
        }
    }

    /// `Err(detail)` when `caller` must not call `route` at `now`; an allowed call is counted.
    pub fn check(&mut self, route: Route, caller: &str, now: Instant) -> Result<(), String> {
        let Some(limit) = self.limits.get(&route).copied() else {
            return Ok(());
        };
        let pace = self.paces.entry((route, caller.to_owned())).or_default();
        let refuse = |pace: &mut Pace| {
            if limit.penalty_ms > 0 {
                pace.next_allowed = Some(now + Duration::from_millis(limit.penalty_ms));
            }
            Err(format!(
                "API requests too frequent endpoint threshold={}",
                limit.threshold()
            ))
        };
        if pace.next_allowed.is_some_and(|at| now < at) {
            return refuse(pace);
        }
        if let Some(calls) = limit.per_window {
            let window = Duration::from_millis(limit.window_ms);
            while pace
                .recent
                .front()
                .is_some_and(|at| now.saturating_duration_since(*at) >= window)
            {
                pace.recent.pop_front();
            }
            if pace.recent.len() >= calls as usize {
                return refuse(pace);
            }
            pace.recent.push_back(now);
        }
        if limit.interval_ms > 0 {
            pace.next_allowed = Some(now + Duration::from_millis(limit.interval_ms));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn an_interval_refuses_early_calls_and_the_penalty_pushes_the_next_one_out() {
        let start = Instant::now();
        let mut limiter = Limiter::new(&[(
            Route::Create,
            RouteLimit::interval(4_500).with_penalty(12_000),
        )]);
        assert!(limiter.check(Route::Create, "a", start).is_ok());
        let refused = limiter
            .check(Route::Create, "a", ms(start, 4_000))
            .unwrap_err();
        assert!(refused.contains("threshold=4.5"), "{refused}");
        // 4.5 s after the first call would have been fine without the penalty, and each
        // refusal restarts it.
        assert!(
            limiter
                .check(Route::Create, "a", ms(start, 15_000))
                .is_err()
        );
        assert!(
            limiter
                .check(Route::Create, "a", ms(start, 26_999))
                .is_err()
        );
        assert!(limiter.check(Route::Create, "a", ms(start, 38_999)).is_ok());
    }

    #[test]
    fn callers_and_routes_are_limited_separately() {
        let start = Instant::now();
        let mut limiter = Limiter::new(&[
            (Route::Get, RouteLimit::interval(2_000)),
            (Route::List, RouteLimit::interval(1_000)),
        ]);
        assert!(limiter.check(Route::Get, "a", start).is_ok());
        assert!(limiter.check(Route::Get, "b", start).is_ok());
        assert!(limiter.check(Route::List, "a", start).is_ok());
        assert!(
            limiter.check(Route::Destroy, "a", start).is_ok(),
            "unlimited route"
        );
        assert!(limiter.check(Route::Get, "a", ms(start, 1_999)).is_err());
        assert!(limiter.check(Route::Get, "a", ms(start, 2_000)).is_ok());
    }

    #[test]
    fn a_window_counts_calls() {
        let start = Instant::now();
        let mut limiter = Limiter::new(&[(Route::Search, RouteLimit::per_minute(10))]);
        for i in 0..10 {
            assert!(limiter.check(Route::Search, "a", ms(start, i)).is_ok());
        }
        assert!(
            limiter
                .check(Route::Search, "a", ms(start, 59_000))
                .is_err()
        );
        assert!(limiter.check(Route::Search, "a", ms(start, 60_000)).is_ok());
    }

    #[test]
    fn scaling_keeps_the_shape() {
        let limit = RouteLimit::interval(4_500).with_penalty(12_000).scaled(100);
        assert_eq!((limit.interval_ms, limit.penalty_ms), (45, 120));
        assert_eq!(RouteLimit::per_minute(10).scaled(1_000).window_ms, 60);
    }
}
