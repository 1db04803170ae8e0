//! Client-side pacing per route. Vast.ai limits each route separately (search 10 per minute,
//! creates 4.5 s apart with a penalty for coming early, ...) and sends no `Retry-After`, so the
//! client keeps under the limits itself and, after a 429, backs off the route it hit.
//!
//! Pure: callers pass the time and sleep until the instant they get back.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// The client's routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    Search,
    Create,
    Get,
    List,
    Destroy,
    Logs,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Search => "search",
            Route::Create => "create",
            Route::Get => "get",
            Route::List => "list",
            Route::Destroy => "destroy",
            Route::Logs => "logs",
        }
    }
}

/// How often one route may be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// Minimum time between two calls.
    pub interval: Duration,
    /// At most `.0` calls per `.1`.
    pub window: Option<(u32, Duration)>,
    /// How long the route stays shut after a refusal. Vast.ai's create refuses every call for
    /// its penalty after one came early, and each refusal starts the penalty again: calls
    /// paced at the interval into a penalty would be refused for as long as they queue.
    pub penalty: Duration,
}

impl Pace {
    pub const fn interval(interval: Duration) -> Pace {
        Pace {
            interval,
            window: None,
            penalty: Duration::ZERO,
        }
    }

    /// The same pace, shut for `penalty` after a refusal.
    pub const fn with_penalty(mut self, penalty: Duration) -> Pace {
        self.penalty = penalty;
        self
    }
}

/// The paces of every route.
#[derive(Debug, Clone, PartialEq)]
pub struct Paces(pub HashMap<Route, Pace>);

impl Default for Paces {
    /// Just over the documented limits: search 10 per minute and 6 s apart, creates 4.6 s,
    /// destroys 3.1 s, gets 2.1 s, lists and logs 1.1 s.
    fn default() -> Self {
        let ms = Duration::from_millis;
        Paces(HashMap::from([
            (
                Route::Search,
                Pace {
                    interval: ms(6_000),
                    window: Some((10, ms(60_000))),
                    penalty: Duration::ZERO,
                },
            ),
            (
                Route::Create,
                Pace::interval(ms(4_600)).with_penalty(ms(12_500)),
            ),
            (Route::Destroy, Pace::interval(ms(3_100))),
            (Route::Get, Pace::interval(ms(2_100))),
            (Route::List, Pace::interval(ms(1_100))),
            (Route::Logs, Pace::interval(ms(1_100))),
        ]))
    }
}

impl Paces {
    /// No pacing (tests against an unlimited simulator).
    pub fn none() -> Paces {
        Paces(HashMap::new())
    }

    /// Every interval and window divided by `divisor` (tests against a simulator whose limits
    /// are divided alike); 1 leaves them as they are.
    pub fn divided(self, divisor: u32) -> Paces {
        let divisor = divisor.max(1);
        Paces(
            self.0
                .into_iter()
                .map(|(route, pace)| {
                    let pace = Pace {
                        interval: pace.interval / divisor,
                        window: pace.window.map(|(calls, length)| (calls, length / divisor)),
                        penalty: pace.penalty / divisor,
                    };
                    (route, pace)
                })
                .collect(),
        )
    }
}

#[derive(Debug, Default)]
struct Slot {
    next: Option<Instant>,
    recent: VecDeque<Instant>,
    /// How many refusals the route has had: a call reserved before one must not go out into
    /// the hold it started.
    refusals: u64,
}

/// A reserved call: when it may start, and the route's refusals when it was reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub start: Instant,
    refusals: u64,
}

/// Reserves call times per route.
#[derive(Debug)]
pub struct Pacer {
    paces: Paces,
    slots: HashMap<Route, Slot>,
}

impl Pacer {
    pub fn new(paces: Paces) -> Pacer {
        Pacer {
            paces,
            slots: HashMap::new(),
        }
    }

    /// When a call on `route` asked for at `now` may start; the slot is taken.
    pub fn reserve(&mut self, route: Route, now: Instant) -> Instant {
        self.reservation(route, now).start
    }

    /// [`Pacer::reserve`], remembering the route's refusals so far for [`Pacer::still_good`].
    pub fn reservation(&mut self, route: Route, now: Instant) -> Reservation {
        let pace = self.paces.0.get(&route).copied();
        let slot = self.slots.entry(route).or_default();
        let mut start = slot.next.map_or(now, |next| next.max(now));
        if let Some(Pace {
            window: Some((calls, length)),
            ..
        }) = pace
        {
            while slot
                .recent
                .front()
                .is_some_and(|at| start.saturating_duration_since(*at) >= length)
            {
                slot.recent.pop_front();
            }
            if slot.recent.len() >= calls as usize
                && let Some(oldest) = slot.recent.front()
            {
                start = start.max(*oldest + length);
                slot.recent.pop_front();
            }
            slot.recent.push_back(start);
        }
        let interval = pace.map_or(Duration::ZERO, |pace| pace.interval);
        slot.next = Some(start + interval);
        Reservation {
            start,
            refusals: slot.refusals,
        }
    }

    /// Whether a call reserved earlier may go out now: not if the route was refused since
    /// (it would land in the hold that refusal started); it reserves again instead.
    pub fn still_good(&self, route: Route, reservation: Reservation) -> bool {
        self.slots
            .get(&route)
            .is_none_or(|slot| slot.refusals == reservation.refusals)
    }

    /// For a route with a quota window: its name (`search/60s`) and the calls left in the
    /// window at `now`, counting those already reserved.
    pub fn window_left(&self, route: Route, now: Instant) -> Option<(String, u32)> {
        let (calls, length) = self.paces.0.get(&route)?.window?;
        let used = self.slots.get(&route).map_or(0, |slot| {
            slot.recent
                .iter()
                .filter(|at| at.checked_add(length).is_some_and(|end| end > now))
                .count()
        });
        let used = u32::try_from(used).unwrap_or(u32::MAX);
        Some((
            format!("{}/{}s", route.as_str(), length.as_secs()),
            calls.saturating_sub(used),
        ))
    }

    /// A 429 on `route` at `now`: the route is shut for its penalty or `backoff`, whichever
    /// is longer, and every call reserved before it reserves again, from the end of the hold
    /// on. The queue restarts there: the slots it had reserved are given up (a hold counted
    /// after them would delay the route by the whole queue once more), and so are the window
    /// places they took.
    pub fn refused(&mut self, route: Route, now: Instant, backoff: Duration) {
        let penalty = self
            .paces
            .0
            .get(&route)
            .map_or(Duration::ZERO, |pace| pace.penalty);
        let slot = self.slots.entry(route).or_default();
        slot.next = Some(now + backoff.max(penalty));
        slot.recent.retain(|at| *at <= now);
        slot.refusals += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn three_searches_a_minute() -> Pacer {
        Pacer::new(Paces(HashMap::from([(
            Route::Search,
            Pace {
                interval: Duration::ZERO,
                window: Some((3, ms(60_000))),
                penalty: Duration::ZERO,
            },
        )])))
    }

    #[test]
    fn divided_paces_keep_their_shape() {
        let paces = Paces::default().divided(10);
        assert_eq!(paces.0[&Route::Create].interval, ms(460));
        assert_eq!(paces.0[&Route::Create].penalty, ms(1_250));
        assert_eq!(paces.0[&Route::Search].window, Some((10, ms(6_000))));
        assert_eq!(Paces::default().divided(1), Paces::default());
        assert_eq!(Paces::default().divided(0), Paces::default());
    }

    #[test]
    fn calls_on_one_route_are_spaced_and_routes_are_independent() {
        let start = Instant::now();
        let mut pacer = Pacer::new(Paces::default());
        assert_eq!(pacer.reserve(Route::Create, start), start);
        assert_eq!(pacer.reserve(Route::Create, start), start + ms(4_600));
        assert_eq!(pacer.reserve(Route::Create, start), start + ms(9_200));
        assert_eq!(pacer.reserve(Route::Get, start), start, "another route");
        // A caller that comes late is not held.
        let late = start + ms(60_000);
        assert_eq!(pacer.reserve(Route::Create, late), late);
    }

    #[test]
    fn a_window_caps_the_calls_in_it() {
        let start = Instant::now();
        let mut pacer = three_searches_a_minute();
        for _ in 0..3 {
            assert_eq!(pacer.reserve(Route::Search, start), start);
        }
        assert_eq!(pacer.reserve(Route::Search, start), start + ms(60_000));
    }

    #[test]
    fn a_refusal_delays_the_route_only() {
        let start = Instant::now();
        let mut pacer = Pacer::new(Paces::none());
        pacer.refused(Route::List, start, ms(5_000));
        assert_eq!(pacer.reserve(Route::List, start), start + ms(5_000));
        assert_eq!(pacer.reserve(Route::Get, start), start);
    }

    /// Calls queued at the create interval must not walk into the penalty one refusal starts:
    /// Vast.ai restarts the penalty on each early call, so they would all be refused.
    #[test]
    fn a_refusal_shuts_the_route_for_its_penalty_and_queued_calls_reserve_again() {
        let start = Instant::now();
        let mut pacer = Pacer::new(Paces::default());
        let first = pacer.reservation(Route::Create, start);
        let queued = pacer.reservation(Route::Create, start);
        assert_eq!(queued.start, start + ms(4_600));
        // The first call is refused (another client of the key went just before).
        pacer.refused(Route::Create, start + ms(100), ms(700));
        assert!(!pacer.still_good(Route::Create, first));
        assert!(
            !pacer.still_good(Route::Create, queued),
            "reserved before the refusal"
        );
        let again = pacer.reservation(Route::Create, start + ms(4_600));
        assert_eq!(
            again.start,
            start + ms(12_600),
            "the whole penalty, not the backoff"
        );
        assert!(pacer.still_good(Route::Create, again));
        // A route without a penalty holds for the backoff only.
        pacer.refused(Route::Get, start, ms(700));
        assert_eq!(pacer.reserve(Route::Get, start), start + ms(700));
    }

    /// A refusal delays a queue by the hold, not by the hold after the whole queue: five
    /// creates queued 4.6 s apart, the first refused, go out from the penalty's end on.
    #[test]
    fn a_refused_queue_restarts_at_the_end_of_the_hold() {
        let start = Instant::now();
        let mut pacer = Pacer::new(Paces::default());
        let queued: Vec<Reservation> = (0..5)
            .map(|_| pacer.reservation(Route::Create, start))
            .collect();
        assert_eq!(queued[4].start, start + ms(18_400));
        pacer.refused(Route::Create, start + ms(100), ms(700));
        // Each waiter wakes at its old slot and reserves again, in that order.
        let starts: Vec<Instant> = queued
            .iter()
            .map(|old| {
                assert!(!pacer.still_good(Route::Create, *old));
                pacer.reservation(Route::Create, old.start).start
            })
            .collect();
        let expected: Vec<Instant> = (0..5).map(|k| start + ms(12_600 + 4_600 * k)).collect();
        assert_eq!(starts, expected);
    }

    /// Search slots given up by a refusal do not fill its window.
    #[test]
    fn a_refusal_frees_the_window_places_of_the_calls_it_sends_back() {
        let start = Instant::now();
        let mut pacer = three_searches_a_minute();
        let _sent = pacer.reservation(Route::Search, start);
        let _later = pacer.reservation(Route::Search, start + ms(1_000));
        let _latest = pacer.reservation(Route::Search, start + ms(2_000));
        pacer.refused(Route::Search, start + ms(500), ms(700));
        assert_eq!(
            pacer.reserve(Route::Search, start + ms(1_200)),
            start + ms(1_200),
            "one place is used, by the call sent before the refusal"
        );
    }
}
