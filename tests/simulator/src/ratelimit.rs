//! Per-user rate limiting with the v2 `RateLimit` / `RateLimit-Policy` headers, in each of the
//! window models gateways use (RunPod documents the header names, not the model): fixed
//! windows, sliding windows and GCRA token buckets, with `t` meaning "until the next slot" or
//! "until the whole quota is back", or no headers at all (429 + `Retry-After` only).
//!
//! Announced waits (`t=` and `Retry-After`) are whole seconds rounded up, so a client that
//! waits what it was told is never early. Requests refused with 429 are not counted. The
//! simulator has one user, so one set of windows for every key.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::scenario::{RateLimitSpec, ResetStyle, WindowModel};

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
    /// Counted; answer it. `None` headers when no window sends them.
    Allowed(Option<RateHeaders>),
    /// Over quota: 429 with `Retry-After` (seconds) naming the window that must free a slot.
    Limited {
        headers: Option<RateHeaders>,
        retry_after: u64,
        window: String,
    },
}

#[derive(Debug)]
struct Window {
    spec: RateLimitSpec,
    length: Duration,
    /// Fixed: when the current window started, and what it counted.
    started: Option<Instant>,
    used: u32,
    /// Sliding: arrival times still counted, oldest first.
    arrivals: VecDeque<Instant>,
    /// GCRA: the theoretical arrival time of the next request.
    tat: Option<Instant>,
}

impl Window {
    fn new(spec: &RateLimitSpec) -> Window {
        Window {
            spec: spec.clone(),
            length: Duration::from_secs(spec.window_secs.max(1)),
            started: None,
            used: 0,
            arrivals: VecDeque::new(),
            tat: None,
        }
    }

    fn quota(&self) -> u32 {
        self.spec.quota.max(1)
    }

    /// GCRA's emission interval: one token per this.
    fn interval(&self) -> Duration {
        self.length / self.quota()
    }

    /// Forgets what no longer counts at `now`.
    fn expire(&mut self, now: Instant) {
        if self
            .started
            .is_some_and(|started| now >= started + self.length)
        {
            self.started = None;
            self.used = 0;
        }
        while self
            .arrivals
            .front()
            .is_some_and(|arrival| *arrival + self.length <= now)
        {
            self.arrivals.pop_front();
        }
        if self.tat.is_some_and(|tat| tat <= now) {
            self.tat = None;
        }
    }

    /// Requests (or tokens) in use at `now`.
    fn in_use(&self, now: Instant) -> u32 {
        match self.spec.model {
            WindowModel::Fixed => self.used,
            WindowModel::Sliding => u32::try_from(self.arrivals.len()).unwrap_or(u32::MAX),
            WindowModel::Gcra => match self.tat {
                Some(tat) => {
                    let ahead = tat.saturating_duration_since(now).as_nanos();
                    let interval = self.interval().as_nanos().max(1);
                    u32::try_from(ahead.div_ceil(interval)).unwrap_or(u32::MAX)
                }
                None => 0,
            },
        }
    }

    /// How long until one more request fits.
    fn until_next_slot(&self, now: Instant) -> Duration {
        match self.spec.model {
            WindowModel::Fixed => match self.started {
                Some(started) => (started + self.length).saturating_duration_since(now),
                None => self.length,
            },
            WindowModel::Sliding => match self.arrivals.front() {
                Some(oldest) => (*oldest + self.length).saturating_duration_since(now),
                None => self.length,
            },
            WindowModel::Gcra => match self.tat {
                // The bucket frees one token when the TAT comes within the burst tolerance.
                Some(tat) => {
                    let in_use = self.in_use(now);
                    let keep = self.interval() * in_use.saturating_sub(1);
                    tat.saturating_duration_since(now).saturating_sub(keep)
                }
                None => self.interval(),
            },
        }
    }

    /// How long until the whole quota is back.
    fn until_full(&self, now: Instant) -> Duration {
        match self.spec.model {
            WindowModel::Fixed => self.until_next_slot(now),
            WindowModel::Sliding => match self.arrivals.back() {
                Some(newest) => (*newest + self.length).saturating_duration_since(now),
                None => self.length,
            },
            WindowModel::Gcra => match self.tat {
                Some(tat) => tat.saturating_duration_since(now),
                None => self.interval(),
            },
        }
    }

    fn reset_secs(&self, now: Instant) -> u64 {
        ceil_secs(match self.spec.reset {
            ResetStyle::Next => self.until_next_slot(now),
            ResetStyle::Full => self.until_full(now),
        })
    }

    fn count(&mut self, now: Instant) {
        match self.spec.model {
            WindowModel::Fixed => {
                self.started.get_or_insert(now);
                self.used += 1;
            }
            WindowModel::Sliding => self.arrivals.push_back(now),
            WindowModel::Gcra => {
                let from = self.tat.map_or(now, |tat| tat.max(now));
                self.tat = Some(from + self.interval());
            }
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
            windows: specs.iter().map(Window::new).collect(),
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
            .filter(|w| w.in_use(now) >= w.quota())
            .map(|w| {
                (
                    ceil_secs(w.until_next_slot(now)).max(1),
                    w.spec.name.clone(),
                )
            })
            .max_by_key(|(secs, _)| *secs);
        if let Some((retry_after, window)) = exceeded {
            return Decision::Limited {
                headers: self.headers(now),
                retry_after,
                window,
            };
        }
        for window in &mut self.windows {
            window.count(now);
        }
        Decision::Allowed(self.headers(now))
    }

    fn headers(&self, now: Instant) -> Option<RateHeaders> {
        let sending: Vec<&Window> = self.windows.iter().filter(|w| w.spec.headers).collect();
        if sending.is_empty() {
            return None;
        }
        let ratelimit = sending
            .iter()
            .map(|w| {
                format!(
                    "\"{}\";r={};t={}",
                    w.spec.name,
                    w.quota().saturating_sub(w.in_use(now)),
                    w.reset_secs(now)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let policy = sending
            .iter()
            .map(|w| {
                format!(
                    "\"{}\";q={};w={}",
                    w.spec.name,
                    w.quota(),
                    w.length.as_secs()
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        Some(RateHeaders { ratelimit, policy })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(quota: u32, secs: u64) -> RateLimiter {
        modelled(quota, secs, WindowModel::Fixed, ResetStyle::Next)
    }

    fn modelled(quota: u32, secs: u64, model: WindowModel, reset: ResetStyle) -> RateLimiter {
        RateLimiter::new(&[RateLimitSpec {
            name: "minute".into(),
            quota,
            window_secs: secs,
            model,
            reset,
            headers: true,
        }])
    }

    fn at(t0: Instant, millis: u64) -> Instant {
        t0 + Duration::from_millis(millis)
    }

    /// `RateLimit` of an allowed request, or `None` if refused.
    fn allowed(rl: &mut RateLimiter, now: Instant) -> Option<String> {
        match rl.check(now) {
            Decision::Allowed(headers) => Some(headers.map(|h| h.ratelimit).unwrap_or_default()),
            Decision::Limited { .. } => None,
        }
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
        assert_eq!(headers.unwrap().ratelimit, "\"minute\";r=0;t=8");
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
        assert_eq!(
            rl.headers(Instant::now()).unwrap().ratelimit,
            "\"minute\";r=5;t=60"
        );
    }

    #[test]
    fn a_sliding_window_counts_each_request_for_its_own_length() {
        let mut rl = modelled(2, 10, WindowModel::Sliding, ResetStyle::Next);
        let t0 = Instant::now();
        assert_eq!(allowed(&mut rl, t0).unwrap(), "\"minute\";r=1;t=10");
        assert_eq!(
            allowed(&mut rl, at(t0, 4000)).unwrap(),
            "\"minute\";r=0;t=6"
        );
        // A fixed window would have reset at 10 s; here the second request still counts.
        assert!(allowed(&mut rl, at(t0, 10_000)).is_some());
        assert!(allowed(&mut rl, at(t0, 10_500)).is_none());
        assert!(allowed(&mut rl, at(t0, 14_000)).is_some());
    }

    #[test]
    fn a_full_reset_moves_later_with_every_request() {
        let mut rl = modelled(5, 10, WindowModel::Sliding, ResetStyle::Full);
        let t0 = Instant::now();
        assert_eq!(allowed(&mut rl, t0).unwrap(), "\"minute\";r=4;t=10");
        assert_eq!(
            allowed(&mut rl, at(t0, 3000)).unwrap(),
            "\"minute\";r=3;t=10"
        );
        let mut gcra = modelled(10, 10, WindowModel::Gcra, ResetStyle::Full);
        assert_eq!(allowed(&mut gcra, t0).unwrap(), "\"minute\";r=9;t=1");
        assert_eq!(allowed(&mut gcra, t0).unwrap(), "\"minute\";r=8;t=2");
    }

    #[test]
    fn a_token_bucket_refills_one_token_per_interval() {
        let mut rl = modelled(4, 8, WindowModel::Gcra, ResetStyle::Next);
        let t0 = Instant::now();
        for _ in 0..4 {
            assert!(allowed(&mut rl, t0).is_some());
        }
        let Decision::Limited { retry_after, .. } = rl.check(at(t0, 500)) else {
            panic!("a fifth request fitted a bucket of four")
        };
        // One token comes back 2 s (8 s / 4) after the burst.
        assert_eq!(retry_after, 2);
        assert!(allowed(&mut rl, at(t0, 1999)).is_none());
        assert!(allowed(&mut rl, at(t0, 2000)).is_some());
        assert!(allowed(&mut rl, at(t0, 2500)).is_none());
        // Idle long enough, the whole bucket is back.
        for _ in 0..4 {
            assert!(allowed(&mut rl, at(t0, 40_000)).is_some());
        }
    }

    #[test]
    fn a_window_without_headers_still_refuses_with_retry_after() {
        let mut rl = RateLimiter::new(&[RateLimitSpec {
            quota: 1,
            window_secs: 5,
            headers: false,
            ..RateLimitSpec::default()
        }]);
        let t0 = Instant::now();
        assert!(matches!(rl.check(t0), Decision::Allowed(None)));
        let Decision::Limited {
            headers,
            retry_after,
            ..
        } = rl.check(t0)
        else {
            panic!("over quota allowed")
        };
        assert_eq!((headers, retry_after), (None, 5));
    }
}
