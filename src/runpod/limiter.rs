//! One client-wide rate limiter for the per-user RunPod quota. It starts from a configured
//! per-minute quota, then follows the `RateLimit-Policy` / `RateLimit` headers of every response,
//! so it never sends a request it already knows will be refused with 429. Creates and deletes
//! (money) go before status polling (information).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Which requests go first when the quota is short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Creates, deletes and actions: each one starts or stops billing.
    Urgent,
    /// Status polls, catalogue reads and logs.
    Routine,
}

/// Resets are assumed this much later than announced: the server anchors a window when it
/// receives the first request (after we sent it), and may round `t` down rather than up.
const RESET_MARGIN: Duration = Duration::from_secs(1);

/// Longest reset or wait believed from a header (a day window is the longest RunPod has).
const MAX_ANNOUNCED_WAIT: Duration = Duration::from_secs(2 * 86_400);

#[derive(Debug, Clone)]
struct Window {
    name: String,
    quota: u32,
    length: Duration,
    remaining: u32,
    /// `None` until a request starts the window.
    resets_at: Option<Instant>,
    /// The lowest `r` the service reported in this window: the truth once nothing is in
    /// flight, which undoes the caution taken while answers arrived out of order.
    lowest_reported: Option<u32>,
}

impl Window {
    fn new(name: &str, quota: u32, length: Duration) -> Window {
        Window {
            name: name.to_owned(),
            quota,
            length,
            remaining: quota,
            resets_at: None,
            lowest_reported: None,
        }
    }

    /// Slots routine requests leave for urgent ones: a tenth of the quota, so creates and
    /// deletes do not wait a whole window behind status polls. Near the end of the window the
    /// reserve is released (urgent work then waits at most that long), so queued routine work
    /// still uses the whole quota.
    fn urgent_reserve(&self, now: Instant) -> u32 {
        let release_at = self
            .resets_at
            .map(|reset| reset.checked_sub(self.length / 12));
        match release_at {
            Some(Some(release)) if now >= release => 0,
            _ => (self.quota / 10).min(self.quota.saturating_sub(1)),
        }
    }
}

#[derive(Debug)]
struct State {
    windows: Vec<Window>,
    /// Send order of the requests whose answer has not arrived yet.
    in_flight: BTreeSet<u64>,
    next_seq: u64,
    urgent_waiting: u32,
    blocked_until: Option<Instant>,
}

impl State {
    fn refresh(&mut self, now: Instant) {
        // Requests still unanswered may land in the new window.
        let in_flight = u32::try_from(self.in_flight.len()).unwrap_or(u32::MAX);
        for window in &mut self.windows {
            if window.resets_at.is_some_and(|reset| reset <= now) {
                window.remaining = window.quota.saturating_sub(in_flight);
                window.resets_at = None;
                window.lowest_reported = None;
            }
        }
        if self.blocked_until.is_some_and(|until| until <= now) {
            self.blocked_until = None;
        }
    }

    /// Takes one slot from every window, or says until when to wait (`None`: until notified).
    fn try_take(&mut self, priority: Priority, now: Instant) -> Result<(), Option<Instant>> {
        if let Some(until) = self.blocked_until {
            return Err(Some(until));
        }
        if priority == Priority::Routine && self.urgent_waiting > 0 {
            return Err(None);
        }
        let mut wait_until: Option<Instant> = None;
        for window in &self.windows {
            let reserve = match priority {
                Priority::Urgent => 0,
                Priority::Routine => window.urgent_reserve(now),
            };
            if window.remaining <= reserve {
                let reset = window.resets_at.unwrap_or(now + window.length);
                // Held back only by the reserve: it is released a little before the reset.
                let until = match reset.checked_sub(window.length / 12) {
                    Some(release) if window.remaining > 0 && release > now => release,
                    _ => reset,
                };
                wait_until = Some(wait_until.map_or(until, |current| current.max(until)));
            }
        }
        if wait_until.is_some() {
            return Err(wait_until);
        }
        for window in &mut self.windows {
            window.remaining -= 1;
            if window.resets_at.is_none() {
                window.resets_at = Some(now + window.length + RESET_MARGIN);
            }
        }
        Ok(())
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
                windows: vec![Window::new(
                    "minute",
                    quota_per_minute.max(1),
                    Duration::from_secs(60),
                )],
                in_flight: BTreeSet::new(),
                next_seq: 0,
                urgent_waiting: 0,
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
        let _urgent = (priority == Priority::Urgent).then(|| UrgentWaiter::new(self));
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wait_until = {
                let mut state = self.lock();
                let now = Instant::now();
                state.refresh(now);
                match state.try_take(priority, now) {
                    Ok(()) => {
                        let seq = state.next_seq;
                        state.next_seq += 1;
                        state.in_flight.insert(seq);
                        return Permit {
                            limiter: Arc::clone(self),
                            seq,
                        };
                    }
                    Err(until) => until,
                }
            };
            match wait_until {
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
        // Other unanswered requests may or may not be in the reported count (answers arrive
        // out of order), so assume they are not; once nothing is in flight the lowest
        // reported value is exact again.
        let others_in_flight = u32::try_from(
            state
                .in_flight
                .iter()
                .filter(|other| **other != seq)
                .count(),
        )
        .unwrap_or(u32::MAX);
        let alone = others_in_flight == 0;
        if let Some(policy) = header_list(headers, "ratelimit-policy") {
            for member in policy {
                let (Some(quota), Some(length)) = (member.get("q"), member.get("w")) else {
                    continue;
                };
                let length = Duration::from_secs(length.max(1));
                let quota = u32::try_from(quota).unwrap_or(u32::MAX).max(1);
                match state.windows.iter_mut().find(|w| w.name == member.name) {
                    Some(window) => {
                        window.remaining = window.remaining.min(quota);
                        window.quota = quota;
                        window.length = length;
                    }
                    None => state.windows.push(Window::new(&member.name, quota, length)),
                }
            }
        }
        if let Some(live) = header_list(headers, "ratelimit") {
            for member in live {
                let (Some(remaining), Some(reset_secs)) = (member.get("r"), member.get("t")) else {
                    continue;
                };
                let Some(window) = state.windows.iter_mut().find(|w| w.name == member.name) else {
                    continue;
                };
                let wait = Duration::from_secs(reset_secs).min(MAX_ANNOUNCED_WAIT);
                let reported_reset = now + wait + RESET_MARGIN;
                let reported = u32::try_from(remaining)
                    .unwrap_or(u32::MAX)
                    .min(window.quota);
                let remaining = reported.saturating_sub(others_in_flight);
                if reset_secs == 0 {
                    // Describes a window that is ending right now.
                    continue;
                }
                match window.resets_at {
                    Some(current) if reported_reset <= current + window.length / 2 => {
                        // Same window: both are upper bounds, keep the tighter ones.
                        let lowest = window.lowest_reported.map_or(reported, |l| l.min(reported));
                        window.lowest_reported = Some(lowest);
                        window.remaining = if alone {
                            // Every request we sent has been counted: exact.
                            lowest
                        } else {
                            window.remaining.min(remaining)
                        };
                        window.resets_at = Some(current.min(reported_reset));
                    }
                    _ => {
                        window.remaining = remaining;
                        window.lowest_reported = Some(reported);
                        window.resets_at = Some(reported_reset);
                    }
                }
            }
        }
        if let Some(wait) = retry_after {
            let until = now + wait.min(MAX_ANNOUNCED_WAIT);
            state.blocked_until = Some(state.blocked_until.map_or(until, |u| u.max(until)));
        }
    }
}

/// Counts an urgent request as waiting for as long as its `acquire` future lives.
struct UrgentWaiter<'a>(&'a RateLimiter);

impl<'a> UrgentWaiter<'a> {
    fn new(limiter: &'a RateLimiter) -> Self {
        limiter.lock().urgent_waiting += 1;
        UrgentWaiter(limiter)
    }
}

impl Drop for UrgentWaiter<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.urgent_waiting = state.urgent_waiting.saturating_sub(1);
        drop(state);
        self.0.changed.notify_waiters();
    }
}

/// One reserved slot. Hand it the response headers; dropping it without (a transport error)
/// keeps the slot spent, which is the safe assumption.
#[derive(Debug)]
pub struct Permit {
    limiter: Arc<RateLimiter>,
    seq: u64,
}

impl Permit {
    /// Learns from the response's rate-limit headers (and `Retry-After` on a 429).
    pub fn observe(self, headers: &HeaderMap, retry_after: Option<Duration>) {
        self.limiter.observe(self.seq, headers, retry_after);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.limiter.lock();
        state.in_flight.remove(&self.seq);
        drop(state);
        self.limiter.changed.notify_waiters();
    }
}

/// One member of a `RateLimit`/`RateLimit-Policy` list: `"minute";r=12;t=30`.
#[derive(Debug, PartialEq)]
struct Member {
    name: String,
    params: Vec<(String, u64)>,
}

impl Member {
    fn get(&self, key: &str) -> Option<u64> {
        self.params
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| *value)
    }
}

/// Parses a structured-field list header; a malformed header is ignored, not fatal.
fn header_list(headers: &HeaderMap, name: &str) -> Option<Vec<Member>> {
    // A list may be split over several header lines; they join with commas.
    let lines: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    if lines.is_empty() {
        return None;
    }
    let value = lines.join(", ");
    let list: sfv::List = sfv::Parser::new(&value).parse().ok()?;
    Some(
        list.into_iter()
            .filter_map(|entry| match entry {
                sfv::ListEntry::Item(item) => {
                    let name = match &item.bare_item {
                        sfv::BareItem::String(text) => text.as_str().to_owned(),
                        sfv::BareItem::Token(token) => token.as_str().to_owned(),
                        _ => return None,
                    };
                    let params = item
                        .params
                        .iter()
                        .filter_map(|(key, value)| {
                            let value = i64::from(value.as_integer()?);
                            Some((key.as_str().to_owned(), u64::try_from(value).ok()?))
                        })
                        .collect();
                    Some(Member { name, params })
                }
                sfv::ListEntry::InnerList(_) => None,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(live: &str, policy: &str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert("ratelimit", HeaderValue::from_str(live).unwrap());
        map.insert("ratelimit-policy", HeaderValue::from_str(policy).unwrap());
        map
    }

    #[test]
    fn parses_the_spec_examples() {
        let map = headers(
            r#""minute";r=0;t=12, "hour";r=2800;t=1812, "day";r=49500;t=45012"#,
            r#""minute";q=60;w=60, "hour";q=3000;w=3600, "day";q=50000;w=86400"#,
        );
        let live = header_list(&map, "ratelimit").unwrap();
        assert_eq!(live.len(), 3);
        assert_eq!(live[1].name, "hour");
        assert_eq!(live[1].get("r"), Some(2800));
        assert_eq!(live[2].get("t"), Some(45012));
        let policy = header_list(&map, "ratelimit-policy").unwrap();
        assert_eq!(policy[0].get("q"), Some(60));
        let mut broken = HeaderMap::new();
        broken.insert("ratelimit", HeaderValue::from_static("\"minute;r=0"));
        assert!(header_list(&broken, "ratelimit").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn never_exceeds_the_configured_quota_before_any_header() {
        let limiter = RateLimiter::new(5);
        let start = Instant::now();
        for _ in 0..5 {
            drop(limiter.acquire(Priority::Urgent).await);
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        drop(limiter.acquire(Priority::Urgent).await);
        // The sixth waits for the local window (a minute plus the margin).
        assert!(start.elapsed() >= Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn follows_the_headers_and_waits_for_the_announced_reset() {
        let limiter = RateLimiter::new(60);
        let permit = limiter.acquire(Priority::Routine).await;
        permit.observe(
            &headers(
                r#""minute";r=0;t=7, "hour";r=10;t=100"#,
                r#""minute";q=60;w=60, "hour";q=3000;w=3600"#,
            ),
            None,
        );
        assert_eq!(
            limiter.windows(),
            vec![("minute".into(), 60, 0), ("hour".into(), 3000, 10)]
        );
        let start = Instant::now();
        drop(limiter.acquire(Priority::Urgent).await);
        // The announced 7 s plus the safety margin: never early.
        assert_eq!(start.elapsed(), Duration::from_secs(7) + RESET_MARGIN);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_blocks_everyone() {
        let limiter = RateLimiter::new(60);
        limiter
            .acquire(Priority::Urgent)
            .await
            .observe(&HeaderMap::new(), Some(Duration::from_secs(12)));
        let start = Instant::now();
        drop(limiter.acquire(Priority::Routine).await);
        assert_eq!(start.elapsed(), Duration::from_secs(12));
    }

    /// Runs the labelled acquisitions (spawned in this order) and returns (label, time) in the
    /// order they got their slot.
    async fn race(
        limiter: &Arc<RateLimiter>,
        contenders: &[(&'static str, Priority)],
    ) -> Vec<(&'static str, Instant)> {
        let order = Arc::new(Mutex::new(Vec::new()));
        let tasks: Vec<_> = contenders
            .iter()
            .map(|&(label, priority)| {
                let limiter = Arc::clone(limiter);
                let order = Arc::clone(&order);
                tokio::spawn(async move {
                    let _permit = limiter.acquire(priority).await;
                    order.lock().unwrap().push((label, Instant::now()));
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        order.lock().unwrap().clone()
    }

    #[tokio::test(start_paused = true)]
    async fn routine_requests_leave_a_reserve_for_urgent_ones_until_the_window_ends() {
        let limiter = RateLimiter::new(20);
        // 20 per minute: routine requests leave the last 2 slots to urgent ones.
        let start = Instant::now();
        let permit = limiter.acquire(Priority::Routine).await;
        permit.observe(
            &headers(r#""minute";r=3;t=30"#, r#""minute";q=20;w=60"#),
            None,
        );
        drop(limiter.acquire(Priority::Routine).await);
        let order = race(
            &limiter,
            &[
                ("poll", Priority::Routine),
                ("create", Priority::Urgent),
                ("delete", Priority::Urgent),
            ],
        )
        .await;
        let labels: Vec<_> = order.iter().map(|(label, _)| *label).collect();
        assert_eq!(labels, vec!["create", "delete", "poll"]);
        assert_eq!(order[1].1, start, "urgent requests did not wait");
        // The reserve was used up, so the poll waited for the window to end.
        assert_eq!(order[2].1 - start, Duration::from_secs(30) + RESET_MARGIN);
    }

    #[tokio::test(start_paused = true)]
    async fn unused_reserve_is_released_near_the_end_of_the_window() {
        let limiter = RateLimiter::new(20);
        let start = Instant::now();
        let permit = limiter.acquire(Priority::Routine).await;
        permit.observe(
            &headers(r#""minute";r=2;t=60"#, r#""minute";q=20;w=60"#),
            None,
        );
        drop(limiter.acquire(Priority::Routine).await);
        // Two reserved slots left; in the last twelfth of the window a poll may take them.
        assert_eq!(start.elapsed(), Duration::from_secs(55) + RESET_MARGIN);
    }

    #[tokio::test(start_paused = true)]
    async fn urgent_requests_overtake_routine_ones_queued_before_them() {
        let limiter = RateLimiter::new(20);
        let start = Instant::now();
        let permit = limiter.acquire(Priority::Routine).await;
        permit.observe(
            &headers(r#""minute";r=0;t=10"#, r#""minute";q=20;w=60"#),
            None,
        );
        let order = race(
            &limiter,
            &[
                ("poll 1", Priority::Routine),
                ("poll 2", Priority::Routine),
                ("create", Priority::Urgent),
            ],
        )
        .await;
        let labels: Vec<_> = order.iter().map(|(label, _)| *label).collect();
        assert_eq!(labels[0], "create");
        assert!(
            order
                .iter()
                .all(|(_, at)| *at - start == Duration::from_secs(10) + RESET_MARGIN)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_requests_are_assumed_uncounted_until_all_are_in() {
        let limiter = RateLimiter::new(60);
        let policy = r#""minute";q=60;w=60"#;
        let earlier = limiter.acquire(Priority::Routine).await;
        let later = limiter.acquire(Priority::Routine).await;
        // r=5 while another request is unanswered: it may not be counted yet.
        later.observe(&headers(r#""minute";r=5;t=30"#, policy), None);
        assert_eq!(limiter.windows(), vec![("minute".into(), 60, 4)]);
        let third = limiter.acquire(Priority::Routine).await;
        assert_eq!(limiter.windows(), vec![("minute".into(), 60, 3)]);
        // An older, higher count never raises the estimate while requests are in flight.
        earlier.observe(&headers(r#""minute";r=6;t=30"#, policy), None);
        assert_eq!(limiter.windows(), vec![("minute".into(), 60, 3)]);
        // Everything answered: the lowest reported count is exact.
        third.observe(&headers(r#""minute";r=4;t=30"#, policy), None);
        assert_eq!(limiter.windows(), vec![("minute".into(), 60, 4)]);
        assert_eq!(limiter.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn caution_taken_for_out_of_order_answers_is_undone_once_all_are_in() {
        let limiter = RateLimiter::new(60);
        let policy = r#""minute";q=60;w=60"#;
        let first = limiter.acquire(Priority::Routine).await;
        let second = limiter.acquire(Priority::Routine).await;
        // The service counted the second request first: the first's answer says r=5, but
        // the limiter cannot know the second is already in that count, so it assumes 4.
        first.observe(&headers(r#""minute";r=5;t=30"#, policy), None);
        assert_eq!(limiter.windows(), vec![("minute".into(), 60, 4)]);
        second.observe(&headers(r#""minute";r=6;t=30"#, policy), None);
        // Nothing in flight any more: the lowest reported value is the truth.
        assert_eq!(limiter.windows(), vec![("minute".into(), 60, 5)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_split_over_header_lines_and_absurd_waits_are_handled() {
        let limiter = RateLimiter::new(60);
        let mut map = HeaderMap::new();
        map.append(
            "ratelimit",
            HeaderValue::from_static(r#""minute";r=10;t=30"#),
        );
        map.append("ratelimit", HeaderValue::from_static(r#""hour";r=5;t=900"#));
        map.append(
            "ratelimit-policy",
            HeaderValue::from_static(r#""minute";q=60;w=60"#),
        );
        map.append(
            "ratelimit-policy",
            HeaderValue::from_static(r#""hour";q=3000;w=3600"#),
        );
        limiter.acquire(Priority::Routine).await.observe(&map, None);
        assert_eq!(
            limiter.windows(),
            vec![("minute".into(), 60, 10), ("hour".into(), 3000, 5)]
        );
        // A nonsensical Retry-After neither panics nor blocks for longer than the cap.
        limiter
            .acquire(Priority::Routine)
            .await
            .observe(&HeaderMap::new(), Some(Duration::from_secs(u64::MAX / 2)));
        let start = Instant::now();
        drop(limiter.acquire(Priority::Urgent).await);
        assert_eq!(start.elapsed(), MAX_ANNOUNCED_WAIT);
    }
}
