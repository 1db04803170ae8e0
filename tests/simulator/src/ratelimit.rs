//! Per-user fixed-window rate limiting with the v2 `RateLimit` / `RateLimit-Policy` headers.
//!
//! Each window starts at the first counted request after the previous one expired, and resets
//! exactly `window_secs` later. Announced waits (`t=` and `Retry-After`) are whole seconds
//! rounded up, so a client that waits what it was told is never early. Requests refused with
//! 429 are not counted. The simulator has one user, so one set of windows for every key.

use std::time::{Duration, Instant};

use crate::scenario::RateLimitSpec;

/// Header values for one response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RateHeaders {
    /// `RateLimit: "minute";r=59;t=60, …`
    pub ratelimit: String,
    /// `RateLimit-Policy: "minute";q=60;w=60, …`
    pub policy: String,
}

/// The outcome of counting one request.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Counted; answer it. `None` headers when no window is configured.
    Allowed(Option<RateHeaders>),
    /// Over quota: 429 with `Retry-After` (seconds) naming the window that must reset.
    Limited {
        headers: RateHeaders,
        retry_after: u64,
        window: String,
    },
}

#[derive(Debug)]
struct Window {
    name: String,
    quota: u32,
    length: Duration,
    started: Option<Instant>,
    used: u32,
}

impl Window {
    fn expire(&mut self, now: Instant) {
        if let Some(reset) = self.reset_at()
            && now >= reset
        {
            self.started = None;
            self.used = 0;
        }
    }

    /// When the started window resets (`None`: not started, or too far away to represent).
    fn reset_at(&self) -> Option<Instant> {
        self.started?.checked_add(self.length)
    }

    /// Whole seconds until this window resets, rounded up; the full length if not started.
    fn reset_secs(&self, now: Instant) -> u64 {
        match self.started {
            Some(_) => match self.reset_at() {
                Some(reset) => ceil_secs(reset.saturating_duration_since(now)),
                None => ceil_secs(self.length),
            },
            None => ceil_secs(self.length),
        }
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The windows of the one simulated user.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    windows: Vec<Window>,
}

impl RateLimiter {
    pub fn new(specs: &[RateLimitSpec]) -> RateLimiter {
        RateLimiter {
            windows: specs
                .iter()
                .map(|spec| Window {
                    name: spec.name.clone(),
                    quota: spec.quota,
                    length: Duration::from_secs(spec.window_secs),
                    started: None,
                    used: 0,
                })
                .collect(),
        }
    }

    /// Counts a request at `now`, or refuses it when any window is used up.
    pub fn check(&mut self, now: Instant) -> Decision {
        for window in &mut self.windows {
            window.expire(now);
        }
        let exceeded = self
            .windows
            .iter()
            .filter(|w| w.used >= w.quota)
            .map(|w| (w.reset_secs(now).max(1), w.name.clone()))
            .max_by_key(|(secs, _)| *secs);
        if let Some((retry_after, window)) = exceeded {
            return Decision::Limited {
                headers: self.headers(now),
                retry_after,
                window,
            };
        }
        for window in &mut self.windows {
            window.started.get_or_insert(now);
            window.used += 1;
        }
        Decision::Allowed((!self.windows.is_empty()).then(|| self.headers(now)))
    }

    fn headers(&self, now: Instant) -> RateHeaders {
        let ratelimit = self
            .windows
            .iter()
            .map(|w| {
                format!(
                    "\"{}\";r={};t={}",
                    w.name,
                    w.quota.saturating_sub(w.used),
                    w.reset_secs(now)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let policy = self
            .windows
            .iter()
            .map(|w| format!("\"{}\";q={};w={}", w.name, w.quota, w.length.as_secs()))
            .collect::<Vec<_>>()
            .join(", ");
        RateHeaders { ratelimit, policy }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(quota: u32, secs: u64) -> RateLimiter {
        RateLimiter::new(&[RateLimitSpec {
            name: "minute".into(),
            quota,
            window_secs: secs,
        }])
    }

    #[test]
    fn counts_refuses_and_resets_exactly_at_the_announced_time() {
        let mut rl = limiter(2, 10);
        let t0 = Instant::now();
        let Decision::Allowed(Some(h)) = rl.check(t0) else {
            panic!("first request refused")
        };
        assert_eq!(h.ratelimit, "\"minute\";r=1;t=10");
        assert_eq!(h.policy, "\"minute\";q=2;w=10");
        assert!(matches!(
            rl.check(t0 + Duration::from_millis(1)),
            Decision::Allowed(_)
        ));
        let Decision::Limited {
            retry_after,
            window,
            headers,
        } = rl.check(t0 + Duration::from_millis(2500))
        else {
            panic!("third request allowed")
        };
        assert_eq!((retry_after, window.as_str()), (8, "minute"));
        assert_eq!(headers.ratelimit, "\"minute\";r=0;t=8");
        // Refused requests do not count, and the window resets exactly at t0 + 10 s.
        assert!(matches!(
            rl.check(t0 + Duration::from_millis(9999)),
            Decision::Limited { .. }
        ));
        assert!(matches!(
            rl.check(t0 + Duration::from_secs(10)),
            Decision::Allowed(_)
        ));
    }

    #[test]
    fn an_unstarted_window_announces_its_full_length() {
        let rl = limiter(5, 60);
        assert_eq!(rl.headers(Instant::now()).ratelimit, "\"minute\";r=5;t=60");
    }
}
