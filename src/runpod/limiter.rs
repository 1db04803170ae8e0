//! One client-wide rate limiter for the per-user RunPod quota. It starts from a configured
//! per-minute quota, then follows the `RateLimit-Policy` / `RateLimit` headers of every response,
//! so it never sends a request it already knows will be refused with 429. Creates and deletes
//! (money) go before status polling (information), but a poll that has waited
//! [`ROUTINE_MAX_WAIT`] takes every other slot with them: a finished pod is only seen through a
//! poll, and its billing only stopped after that, so a long queue of creates must not starve
//! polling, nor a stream of overdue log reads hold back deletes. The accounting of each window lives in
//! `window.rs`; this file orders the waiting requests and hands out permits.

mod headers;
mod window;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use headers::header_list;
use window::{Report, Window};

/// Which requests go first when the quota is short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Creates, deletes and actions: each one starts or stops billing.
    Urgent,
    /// Status polls, catalogue reads and logs.
    Routine,
}

/// Longest a routine request waits behind urgent ones; after that it takes turns with them.
pub const ROUTINE_MAX_WAIT: Duration = Duration::from_secs(30);

/// A request's place in line: overdue routine requests and urgent ones take turns, routine
/// ones come after both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Overdue,
    Urgent,
    Routine,
}

/// Resets are assumed this much later than announced, and requests sent this long before a
/// reset may count after it: a request reaches the server a moment after it is sent, and `t`
/// may be rounded either way.
const RESET_MARGIN: Duration = Duration::from_secs(1);

/// Longest reset, wait or window believed from a header (a day window is the longest RunPod
/// has).
const MAX_ANNOUNCED_WAIT: Duration = Duration::from_secs(2 * 86_400);

#[derive(Debug)]
struct State {
    windows: Vec<Window>,
    /// Requests sent whose answer has not arrived yet: number → when sent.
    in_flight: BTreeMap<u64, Instant>,
    /// (number, when sent) of the requests a coming reset may still need to count, oldest
    /// first.
    sent: VecDeque<(u64, Instant)>,
    next_seq: u64,
    urgent_waiting: u32,
    overdue_waiting: u32,
    /// The last slot went to an overdue request: while both kinds wait they take turns, so
    /// neither polls nor deletes can be held back by a stream of the other.
    last_was_overdue: bool,
    blocked_until: Option<Instant>,
}

impl State {
    fn refresh(&mut self, now: Instant) {
        let State {
            windows,
            sent,
            next_seq,
            ..
        } = self;
        for window in windows.iter_mut() {
            window.refresh(now, *next_seq, |since| sent_since(sent, since));
        }
        self.forget_old_sends();
        if self.blocked_until.is_some_and(|until| until <= now) {
            self.blocked_until = None;
        }
    }

    /// Drops send times no reset can need any more: those before every window's earliest
    /// possible reset, and before every unanswered request (an answer may move that earlier).
    fn forget_old_sends(&mut self) {
        let keep_from = self
            .windows
            .iter()
            .filter_map(Window::needs_sends_since)
            .chain(
                self.in_flight
                    .values()
                    .map(|sent| sent.checked_sub(RESET_MARGIN).unwrap_or(*sent)),
            )
            .min();
        match keep_from {
            Some(from) => {
                while self.sent.front().is_some_and(|(_, at)| *at < from) {
                    self.sent.pop_front();
                }
            }
            None => self.sent.clear(),
        }
    }

    /// Takes one slot from every window, or says until when to wait (`None`: until notified).
    fn try_take(&mut self, turn: Turn, now: Instant) -> Result<u64, Option<Instant>> {
        if let Some(until) = self.blocked_until {
            return Err(Some(until));
        }
        let ahead = match turn {
            Turn::Overdue if self.last_was_overdue => self.urgent_waiting,
            Turn::Overdue => 0,
            Turn::Urgent if self.last_was_overdue => 0,
            Turn::Urgent => self.overdue_waiting,
            Turn::Routine => self.overdue_waiting + self.urgent_waiting,
        };
        if ahead > 0 {
            return Err(None);
        }
        let priority = match turn {
            Turn::Overdue | Turn::Urgent => Priority::Urgent,
            Turn::Routine => Priority::Routine,
        };
        let wait_until = self
            .windows
            .iter()
            .filter_map(|window| window.wait_until(priority, now))
            .max();
        if wait_until.is_some() {
            return Err(wait_until);
        }
        for window in &mut self.windows {
            window.take(now);
        }
        self.last_was_overdue = turn == Turn::Overdue;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.insert(seq, now);
        self.sent.push_back((seq, now));
        Ok(seq)
    }

    /// Learns from an answer to request `seq` (still in flight).
    fn observe(&mut self, seq: u64, headers: &HeaderMap, now: Instant) {
        let Some(&sent_at) = self.in_flight.get(&seq) else {
            return;
        };
        let others_in_flight =
            u32::try_from(self.in_flight.len().saturating_sub(1)).unwrap_or(u32::MAX);
        if let Some(policy) = header_list(headers, "ratelimit-policy") {
            for member in policy {
                let (Some(quota), Some(length)) = (member.get("q"), member.get("w")) else {
                    continue;
                };
                let length = Duration::from_secs(length.max(1));
                let quota = u32::try_from(quota).unwrap_or(u32::MAX).max(1);
                match self.windows.iter_mut().find(|w| w.name == member.name) {
                    Some(window) => window.set_policy(quota, length),
                    None => {
                        // New to us: this answer's count is the first thing known about it, so
                        // the window starts with this request; requests sent around it may be
                        // missing from that count.
                        let mut window = Window::new(&member.name, quota, length, seq);
                        let around = sent_at.checked_sub(RESET_MARGIN).unwrap_or(sent_at);
                        window.assume_unreported(sent_before(&self.sent, seq, around));
                        self.windows.push(window);
                    }
                }
            }
        }
        let mut applied = vec![false; self.windows.len()];
        if let Some(live) = header_list(headers, "ratelimit") {
            for member in live {
                let (Some(remaining), Some(reset_secs)) = (member.get("r"), member.get("t")) else {
                    continue;
                };
                let Some(index) = self.windows.iter().position(|w| w.name == member.name) else {
                    continue;
                };
                let report = Report {
                    seq,
                    sent_at,
                    remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                    reset_secs,
                    others_in_flight,
                };
                applied[index] = self.windows[index].apply(report, now);
            }
        }
        for (window, applied) in self.windows.iter_mut().zip(applied) {
            if !applied {
                window.unreported(seq);
            }
        }
    }

    /// Request `seq` ended without an answer (a timeout, a broken connection).
    fn unanswered(&mut self, seq: u64) {
        for window in &mut self.windows {
            window.unreported(seq);
        }
    }
}

/// Requests sent at or after `since`.
fn sent_since(sent: &VecDeque<(u64, Instant)>, since: Instant) -> u32 {
    let first = sent.partition_point(|(_, at)| *at < since);
    u32::try_from(sent.len() - first).unwrap_or(u32::MAX)
}

/// Requests numbered below `seq` and sent at or after `since`.
fn sent_before(sent: &VecDeque<(u64, Instant)>, seq: u64, since: Instant) -> u32 {
    let first = sent.partition_point(|(_, at)| *at < since);
    let end = sent.partition_point(|(number, _)| *number < seq);
    u32::try_from(end.saturating_sub(first)).unwrap_or(u32::MAX)
}

/// The shared limiter. Cheap to clone through `Arc`.
#[derive(Debug)]
pub struct RateLimiter {
    state: Mutex<State>,
    changed: Notify,
}

impl RateLimiter {
    /// Starts with one `minute` window of `quota_per_minute` until the service says more.
    pub fn new(quota_per_minute: u32) -> Arc<RateLimiter> {
        Arc::new(RateLimiter {
            state: Mutex::new(State {
                windows: vec![Window::new(
                    "minute",
                    quota_per_minute.max(1),
                    Duration::from_secs(60),
                    0,
                )],
                in_flight: BTreeMap::new(),
                sent: VecDeque::new(),
                next_seq: 0,
                urgent_waiting: 0,
                overdue_waiting: 0,
                last_was_overdue: false,
                blocked_until: None,
            }),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the counters inconsistent enough to
        // matter more than stopping all RunPod traffic would, so keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until a request may be sent without a 429, then reserves its slot.
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> Permit {
        let _urgent = (priority == Priority::Urgent).then(|| Waiter::urgent(self));
        let overdue_at = (priority == Priority::Routine).then(|| Instant::now() + ROUTINE_MAX_WAIT);
        let mut overdue: Option<Waiter<'_>> = None;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if overdue.is_none() && overdue_at.is_some_and(|at| Instant::now() >= at) {
                overdue = Some(Waiter::overdue(self));
            }
            let turn = match (priority, &overdue) {
                (Priority::Urgent, _) => Turn::Urgent,
                (Priority::Routine, Some(_)) => Turn::Overdue,
                (Priority::Routine, None) => Turn::Routine,
            };
            let wait_until = {
                let mut state = self.lock();
                let now = Instant::now();
                state.refresh(now);
                match state.try_take(turn, now) {
                    Ok(seq) => {
                        return Permit {
                            limiter: Arc::clone(self),
                            seq,
                            answered: false,
                        };
                    }
                    Err(until) => until,
                }
            };
            // A routine request also wakes when it becomes overdue.
            let wake_at = match (turn, overdue_at) {
                (Turn::Routine, Some(at)) => Some(wait_until.map_or(at, |until| until.min(at))),
                _ => wait_until,
            };
            match wake_at {
                Some(until) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(until) => {}
                        () = &mut notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Requests sent whose answer has not arrived yet.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight.len()
    }

    /// What the limiter currently believes about each window: (name, quota, remaining).
    pub fn windows(&self) -> Vec<(String, u32, u32)> {
        self.lock()
            .windows
            .iter()
            .map(|window| (window.name.clone(), window.quota, window.remaining))
            .collect()
    }

    fn observe(&self, seq: u64, headers: &HeaderMap, retry_after: Option<Duration>) {
        let now = Instant::now();
        let mut state = self.lock();
        state.observe(seq, headers, now);
        if let Some(wait) = retry_after {
            let until = now + wait.min(MAX_ANNOUNCED_WAIT);
            state.blocked_until = Some(state.blocked_until.map_or(until, |u| u.max(until)));
        }
    }
}

/// Counts a request as waiting ahead of others for as long as it lives (an urgent request from
/// its `acquire` on, a routine one once overdue); its end lets those behind it try again.
struct Waiter<'a> {
    limiter: &'a RateLimiter,
    count: fn(&mut State) -> &mut u32,
}

impl<'a> Waiter<'a> {
    fn urgent(limiter: &'a RateLimiter) -> Self {
        Self::new(limiter, |state| &mut state.urgent_waiting)
    }

    fn overdue(limiter: &'a RateLimiter) -> Self {
        Self::new(limiter, |state| &mut state.overdue_waiting)
    }

    fn new(limiter: &'a RateLimiter, count: fn(&mut State) -> &mut u32) -> Self {
        *count(&mut limiter.lock()) += 1;
        Waiter { limiter, count }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut state = self.limiter.lock();
        let count = (self.count)(&mut state);
        *count = count.saturating_sub(1);
        drop(state);
        self.limiter.changed.notify_waiters();
    }
}

/// One reserved slot. Hand it the response headers; dropping it without (a transport error)
/// keeps the slot spent, which is the safe assumption.
#[derive(Debug)]
pub struct Permit {
    limiter: Arc<RateLimiter>,
    seq: u64,
    answered: bool,
}

impl Permit {
    /// Learns from the response's rate-limit headers (and `Retry-After` on a 429).
    pub fn observe(mut self, headers: &HeaderMap, retry_after: Option<Duration>) {
        self.limiter.observe(self.seq, headers, retry_after);
        self.answered = true;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.limiter.lock();
        if !self.answered {
            state.unanswered(self.seq);
        }
        state.in_flight.remove(&self.seq);
        drop(state);
        self.limiter.changed.notify_waiters();
    }
}

#[cfg(test)]
mod model_tests;

#[cfg(test)]
mod tests;
