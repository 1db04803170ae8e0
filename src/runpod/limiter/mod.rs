//! One client-wide rate limiter for the per-user RunPod quota. It starts from a configured
//! per-minute quota, then follows the `RateLimit-Policy` / `RateLimit` headers of every response,
//! so it never sends a request it already knows will be refused with 429, whatever window model
//! the server counts with (see `window.rs`).
//!
//! When the quota is short, money goes first: requests that end GPU billing (stops, and
//! terminations of pods still running), then terminations of stopped pods, then creates, then
//! status polls, catalogue reads and logs. But a poll that has waited [`ROUTINE_MAX_WAIT`] takes
//! every other slot with them: a finished pod is only seen through a poll, and its billing only
//! stopped after that, so a long queue of creates must not starve polling, nor a stream of overdue
//! log reads hold back deletes.

mod headers;
mod window;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use headers::header_list;
use window::{Report, SendLog, Window};

/// Which requests go first when the quota is short, most urgent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Stops, and terminations of pods that may still be running: each ends GPU billing.
    EndsBilling,
    /// Terminations of stopped pods: they still bill storage.
    Cleanup,
    /// Creates and updates: each starts billing, so they wait for everything that ends it.
    Create,
    /// Status polls, catalogue reads and logs.
    Routine,
}

impl Priority {
    /// The classes that queue ahead of routine requests, in order.
    const URGENT: [Priority; 3] = [Priority::EndsBilling, Priority::Cleanup, Priority::Create];

    fn urgent_index(self) -> Option<usize> {
        Self::URGENT.iter().position(|p| *p == self)
    }
}

/// Longest a routine request waits behind urgent ones; after that it takes turns with them.
pub const ROUTINE_MAX_WAIT: Duration = Duration::from_secs(30);

/// A request's place in line: overdue routine requests and urgent ones take turns, routine
/// ones come after both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Overdue,
    Urgent(Priority),
    Routine,
}

/// A request reaches the server within this after it is sent, and announced times may be
/// rounded either way by up to this much.
const RESET_MARGIN: Duration = Duration::from_secs(1);

/// Longest reset, wait or window believed from a header (a day window is the longest RunPod
/// has).
const MAX_ANNOUNCED_WAIT: Duration = Duration::from_secs(2 * 86_400);

#[derive(Debug)]
struct State {
    windows: Vec<Window>,
    /// Requests sent whose answer has not arrived yet: number → when sent.
    in_flight: BTreeMap<u64, Instant>,
    /// Every request sent that a window may still count, oldest first.
    sent: SendLog,
    next_seq: u64,
    /// Urgent requests waiting, per class of `Priority::URGENT`.
    urgent_waiting: [u32; 3],
    overdue_waiting: u32,
    /// The last slot went to an overdue request: while both kinds wait they take turns, so
    /// neither polls nor deletes can be held back by a stream of the other.
    last_was_overdue: bool,
    blocked_until: Option<Instant>,
    /// A `RateLimit-Policy` was seen: the windows are the server's, not a guess.
    policy_seen: bool,
    /// The request whose answer set the policy last.
    policy_seq: Option<u64>,
}

impl State {
    fn refresh(&mut self, now: Instant) {
        for window in &mut self.windows {
            window.recover(now);
        }
        let oldest_unanswered = self.in_flight.values().min().copied();
        let keep_from = self
            .windows
            .iter()
            .map(|window| {
                let from = window.needs_sends_since(now);
                // A 429 for an unanswered request counts the span before it was sent.
                oldest_unanswered
                    .and_then(|sent| sent.checked_sub(window.span()))
                    .map_or(from, |needed| from.min(needed))
            })
            .min();
        match keep_from {
            Some(from) => {
                while self.sent.front().is_some_and(|(_, at)| *at < from) {
                    self.sent.pop_front();
                }
            }
            None => self.sent.clear(),
        }
        if self.blocked_until.is_some_and(|until| until <= now) {
            self.blocked_until = None;
        }
    }

    /// Urgent requests of a more urgent class than `priority` that are waiting.
    fn urgent_ahead_of(&self, priority: Priority) -> u32 {
        let classes = priority.urgent_index().unwrap_or(Priority::URGENT.len());
        self.urgent_waiting[..classes].iter().sum()
    }

    /// Takes one slot from every window, or says until when to wait (`None`: until notified).
    fn try_take(&mut self, turn: Turn, now: Instant) -> Result<u64, Option<Instant>> {
        if let Some(until) = self.blocked_until {
            return Err(Some(until));
        }
        let all_urgent: u32 = self.urgent_waiting.iter().sum();
        let ahead = match turn {
            Turn::Overdue if self.last_was_overdue => all_urgent,
            Turn::Overdue => 0,
            Turn::Urgent(priority) if self.last_was_overdue => self.urgent_ahead_of(priority),
            Turn::Urgent(priority) => self.overdue_waiting + self.urgent_ahead_of(priority),
            Turn::Routine => self.overdue_waiting + all_urgent,
        };
        if ahead > 0 {
            return Err(None);
        }
        let priority = match turn {
            // An overdue poll takes its turn at an urgent request's terms (no reserve).
            Turn::Overdue => Priority::Create,
            Turn::Urgent(priority) => priority,
            Turn::Routine => Priority::Routine,
        };
        let mut wait_until: Result<(), Option<Instant>> = Ok(());
        for window in &self.windows {
            if let Err(until) = window.admits(priority, &self.sent, now) {
                // The latest known wake-up; "until notified" if any window cannot say.
                wait_until = match (wait_until, until) {
                    (Ok(()), until) => Err(until),
                    (Err(Some(a)), Some(b)) => Err(Some(a.max(b))),
                    _ => Err(None),
                };
            }
        }
        wait_until?;
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
        // An older answer's policy must not undo a newer one's.
        let newest = self.policy_seq.is_none_or(|newest| seq >= newest);
        if let Some(policy) = header_list(headers, "ratelimit-policy").filter(|_| newest) {
            self.policy_seen = true;
            self.policy_seq = Some(seq);
            for member in policy {
                let (Some(quota), Some(length)) = (member.get("q"), member.get("w")) else {
                    continue;
                };
                let length = Duration::from_secs(length.max(1));
                let quota = u32::try_from(quota).unwrap_or(u32::MAX).max(1);
                match self.windows.iter_mut().find(|w| w.name == member.name) {
                    Some(window) => window.set_policy(quota, length),
                    None => self.windows.push(Window::new(&member.name, quota, length)),
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
                };
                self.windows[index].apply(report, now, &self.sent);
                applied[index] = true;
            }
        }
        for (window, applied) in self.windows.iter_mut().zip(applied) {
            if !applied {
                window.unreported(sent_at);
            }
        }
    }

    /// Requests still unanswered (`answered` just was) that were sent within the delivery
    /// margin before `seq`: they may have reached the server after it, so its count may not
    /// have them. (Ones answered already are not counted again: in a burst answered in order
    /// that left a sixth of the quota unused.)
    /// A 429 from a server that sends no counts: while no policy was ever announced, the
    /// configured quota was a guess, and what was sent before this request is an upper bound
    /// of the real one.
    fn learn_from_refusal(&mut self, seq: u64, now: Instant) {
        let Some(&sent_at) = self.in_flight.get(&seq) else {
            return;
        };
        if self.policy_seen {
            return;
        }
        for window in &mut self.windows {
            let from = sent_at.checked_sub(window.span());
            let before = self
                .sent
                .iter()
                .filter(|(number, at)| *number < seq && from.is_none_or(|from| *at > from))
                .count();
            window.learn(u32::try_from(before).unwrap_or(u32::MAX), now);
        }
    }

    /// Request `seq` ended without an answer (a timeout, a broken connection).
    fn unanswered(&mut self, seq: u64) {
        if let Some(&sent_at) = self.in_flight.get(&seq) {
            for window in &mut self.windows {
                window.unreported(sent_at);
            }
        }
    }
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
                windows: vec![Window::unknown(
                    "minute",
                    quota_per_minute,
                    Duration::from_secs(60),
                    Instant::now(),
                )],
                in_flight: BTreeMap::new(),
                sent: VecDeque::new(),
                next_seq: 0,
                urgent_waiting: [0; 3],
                overdue_waiting: 0,
                last_was_overdue: false,
                blocked_until: None,
                policy_seen: false,
                policy_seq: None,
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
        let _urgent = priority
            .urgent_index()
            .map(|class| Waiter::new(self, Queue::Urgent(class)));
        let overdue_at = (priority == Priority::Routine).then(|| Instant::now() + ROUTINE_MAX_WAIT);
        let mut overdue: Option<Waiter<'_>> = None;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if overdue.is_none() && overdue_at.is_some_and(|at| Instant::now() >= at) {
                overdue = Some(Waiter::new(self, Queue::Overdue));
            }
            let turn = match (priority, &overdue) {
                (Priority::Routine, Some(_)) => Turn::Overdue,
                (Priority::Routine, None) => Turn::Routine,
                (urgent, _) => Turn::Urgent(urgent),
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
        let mut state = self.lock();
        let now = Instant::now();
        state.refresh(now);
        state
            .windows
            .iter()
            .map(|window| {
                let left = window.room(&state.sent, now).left;
                (window.name.clone(), window.quota, left)
            })
            .collect()
    }

    fn observe(&self, seq: u64, headers: &HeaderMap, retry_after: Option<Duration>) {
        let now = Instant::now();
        let mut state = self.lock();
        state.observe(seq, headers, now);
        if retry_after.is_some() && headers.get("ratelimit").is_none() {
            state.learn_from_refusal(seq, now);
        }
        if let Some(wait) = retry_after {
            let until = now + wait.min(MAX_ANNOUNCED_WAIT);
            state.blocked_until = Some(state.blocked_until.map_or(until, |u| u.max(until)));
        }
    }
}

/// Which line a waiting request counts in.
#[derive(Debug, Clone, Copy)]
enum Queue {
    /// Index into `Priority::URGENT`.
    Urgent(usize),
    Overdue,
}

/// Counts a request as waiting ahead of others for as long as it lives (an urgent request from
/// its `acquire` on, a routine one once overdue); its end lets those behind it try again.
struct Waiter<'a> {
    limiter: &'a RateLimiter,
    queue: Queue,
}

impl<'a> Waiter<'a> {
    fn new(limiter: &'a RateLimiter, queue: Queue) -> Self {
        *Self::count(&mut limiter.lock(), queue) += 1;
        Waiter { limiter, queue }
    }

    fn count(state: &mut State, queue: Queue) -> &mut u32 {
        match queue {
            Queue::Urgent(class) => &mut state.urgent_waiting[class],
            Queue::Overdue => &mut state.overdue_waiting,
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut state = self.limiter.lock();
        let count = Self::count(&mut state, self.queue);
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
