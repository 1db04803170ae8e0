//! One rate-limit window (minute, hour, day) as the limiter sees it: how many more requests
//! it may send before the server's window resets, and when that is.
//!
//! The server counts a request when it arrives, in fixed windows that start with the first
//! request after the previous window ended. What this client knows is only what it sent and
//! what answers said, so every bound errs towards sending less:
//! - `resets_at` is never before the server's window really ends, and `earliest_reset` never
//!   after. Requests sent between the two may count in the next server window, so they are
//!   charged to the next window too.
//! - A reset never waits on answers: requests still unanswered from long ago cannot count in
//!   the next window, so a stalled RunPod cannot lock the limiter (deletes must go out).
//! - Reported counts lower the estimate; only once every request has been answered is the
//!   lowest report (less the requests nothing was learnt from) taken as the truth.

use std::time::Duration;

use tokio::time::Instant;

use super::{MAX_ANNOUNCED_WAIT, Priority, RESET_MARGIN};

/// One answer's `RateLimit` member for a window, with when its request was sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct Report {
    pub seq: u64,
    pub sent_at: Instant,
    pub remaining: u32,
    pub reset_secs: u64,
    /// Other requests still unanswered (any of them may be missing from `remaining`).
    pub others_in_flight: u32,
}

#[derive(Debug, Clone)]
pub(super) struct Window {
    pub name: String,
    pub quota: u32,
    pub length: Duration,
    pub remaining: u32,
    /// When the server's window has surely ended; `None` while nothing is charged to it.
    pub resets_at: Option<Instant>,
    /// The earliest the server's window may end (`None` with `resets_at`).
    earliest_reset: Option<Instant>,
    /// `resets_at` is a bound guessed at the last reset from requests carried over: the first
    /// request sent in this window may start the server's window later, and moves it.
    anchored: bool,
    /// Requests numbered from this on belong to this window. Answers to older ones describe
    /// a window that has ended, or were charged as carried over: they are not applied.
    first_seq: u64,
    /// The lowest `r` the server reported for this window.
    lowest_reported: Option<u32>,
    /// Requests charged to this window that no applied report covers (no header, a timeout,
    /// carried over): any of them may be missing from every reported count.
    unreported: u32,
}

impl Window {
    /// A window nothing is charged to yet; requests from `first_seq` on belong to it.
    pub fn new(name: &str, quota: u32, length: Duration, first_seq: u64) -> Window {
        Window {
            name: name.to_owned(),
            quota,
            length: length.min(MAX_ANNOUNCED_WAIT),
            remaining: quota,
            resets_at: None,
            earliest_reset: None,
            anchored: false,
            first_seq,
            lowest_reported: None,
            unreported: 0,
        }
    }

    /// Starts the next window once this one has surely ended. `sent_since(t)` counts the
    /// requests sent at or after `t`; `next_seq` is the number the next request will get.
    pub fn refresh(&mut self, now: Instant, next_seq: u64, sent_since: impl Fn(Instant) -> u32) {
        // Each pass moves `earliest_reset` a window later, past every request sent (all were
        // sent before `now`), so this ends; the bound only guards against a wrong clock.
        for _ in 0..64 {
            let (Some(reset), Some(earliest)) = (self.resets_at, self.earliest_reset) else {
                return;
            };
            if reset > now {
                return;
            }
            // A request reaches the server within the margin, so these may have landed after
            // its reset, in the next window (possibly starting it).
            let carried = sent_since(earliest.checked_sub(RESET_MARGIN).unwrap_or(earliest));
            self.first_seq = next_seq;
            self.lowest_reported = None;
            self.unreported = carried;
            self.remaining = self.quota.saturating_sub(carried);
            self.anchored = false;
            if carried == 0 {
                self.resets_at = None;
                self.earliest_reset = None;
                return;
            }
            // Carried requests reached the server by `reset` plus the margin; a window they
            // started ends a window length after that, and not before `earliest` plus one.
            self.resets_at = Some(reset + self.length + RESET_MARGIN);
            self.earliest_reset = Some(earliest + self.length);
        }
        self.resets_at = Some(now + self.length + RESET_MARGIN);
    }

    /// Until when a request of this priority must wait, or `None` if it may go now.
    pub fn wait_until(&self, priority: Priority, now: Instant) -> Option<Instant> {
        let reserve = match priority {
            Priority::Urgent => 0,
            Priority::Routine => self.urgent_reserve(now),
        };
        if self.remaining > reserve {
            return None;
        }
        // `None` only while nothing is charged, when `remaining` is the whole quota.
        let reset = self.resets_at.unwrap_or(now + self.length + RESET_MARGIN);
        // Held back only by the reserve: it is released a little before the reset.
        Some(match reset.checked_sub(self.length / 12) {
            Some(release) if self.remaining > 0 && release > now => release,
            _ => reset,
        })
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

    /// Charges one request sent now.
    pub fn take(&mut self, now: Instant) {
        self.remaining = self.remaining.saturating_sub(1);
        // The server's window may start with this request: it ends a length after it arrives.
        let full = now + self.length + RESET_MARGIN;
        match self.resets_at {
            None => {
                self.resets_at = Some(full);
                self.earliest_reset = Some(now + self.length);
            }
            Some(reset) if !self.anchored => self.resets_at = Some(reset.max(full)),
            Some(_) => {}
        }
        self.anchored = true;
    }

    /// Follows a `RateLimit-Policy` member.
    pub fn set_policy(&mut self, quota: u32, length: Duration) {
        self.quota = quota;
        self.length = length.min(MAX_ANNOUNCED_WAIT);
        self.remaining = if self.resets_at.is_none() {
            quota
        } else {
            self.remaining.min(quota)
        };
    }

    /// Applies a reported count and reset, observed `now`; `false` if it says nothing about
    /// the current window (then the request counts as unreported).
    pub fn apply(&mut self, report: Report, now: Instant) -> bool {
        if report.seq < self.first_seq || report.reset_secs == 0 {
            // An older window's count, or one ending this very moment.
            return false;
        }
        let wait = Duration::from_secs(report.reset_secs).min(MAX_ANNOUNCED_WAIT);
        // `t` counts from when the request arrived (after it was sent, before this answer),
        // rounded either way by up to a second (the margin).
        let ends_by = now + wait + RESET_MARGIN;
        let ends_after = (report.sent_at + wait)
            .checked_sub(RESET_MARGIN)
            .unwrap_or(report.sent_at);
        let reported = report.remaining.min(self.quota);
        let lowest = self
            .lowest_reported
            .map_or(reported, |lowest| lowest.min(reported));
        self.lowest_reported = Some(lowest);
        self.remaining = if report.others_in_flight == 0 {
            // Every request has been answered: the latest counted one reported the lowest
            // value, and only requests nothing was learnt from may have come after it.
            lowest.saturating_sub(self.unreported)
        } else {
            self.remaining
                .min(reported.saturating_sub(report.others_in_flight))
        };
        self.resets_at = Some(self.resets_at.map_or(ends_by, |reset| reset.min(ends_by)));
        self.earliest_reset = Some(
            self.earliest_reset
                .map_or(ends_after, |earliest| earliest.min(ends_after)),
        );
        self.anchored = true;
        true
    }

    /// A request of this window ended without a report for it.
    pub fn unreported(&mut self, seq: u64) {
        if seq >= self.first_seq {
            self.unreported = self.unreported.saturating_add(1);
        }
    }

    /// Requests sent before this window was known that its first report may not cover.
    pub fn assume_unreported(&mut self, count: u32) {
        self.unreported = self.unreported.saturating_add(count);
    }

    /// The earliest send time a future reset may still need to count (`None`: none).
    pub fn needs_sends_since(&self) -> Option<Instant> {
        self.earliest_reset
            .map(|earliest| earliest.checked_sub(RESET_MARGIN).unwrap_or(earliest))
    }
}
