//! One rate-limit window (minute, hour, day) as the limiter sees it. RunPod documents the
//! header names, not how its gateway counts, and gateways differ: fixed windows that reset at
//! `t`, sliding windows that count each request for `w` seconds after it arrived, token buckets
//! (GCRA) that refill continuously, with `t` meaning "until the next slot" or "until the whole
//! quota is back". Two rules hold under all of them:
//!
//! - **The client's own log.** Never more than `q` requests sent in any span of `w` seconds
//!   plus a margin (a request reaches the server a moment after it is sent). Whatever the
//!   model, a server whose quota is `q` per `w` accepts that, and a backlog still uses
//!   `q` per `w + margin` of it.
//! - **`r` as a ceiling.** The newest answer's `r` (less what was sent since) caps the log, so
//!   requests this client did not send (another controller on the same account, a restart)
//!   are respected. The ceiling holds until that answer's `t` has passed; after that one probe
//!   goes out to learn the new `r`, and a probe answered without a count lifts it, so a server
//!   that stops sending headers (or stalls) can never lock the limiter.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::{MAX_ANNOUNCED_WAIT, Priority, RESET_MARGIN};

/// Fewest of our own requests before a header-less 429 that teach a lower quota.
const LEARN_FROM: u32 = 5;

/// Spans without a header-less 429 before a learnt quota grows by one: a server whose quota
/// really is lower then refuses one request in this many windows.
pub(super) const RECOVER_AFTER_SPANS: u32 = 10;

/// Send log: (request number, when sent), oldest first.
pub(super) type SendLog = VecDeque<(u64, Instant)>;

/// One answer's `RateLimit` member for a window, with when its request was sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct Report {
    pub seq: u64,
    pub sent_at: Instant,
    pub remaining: u32,
    pub reset_secs: u64,
}

/// One answer's count, kept while answers to requests sent within the delivery margin of it
/// come in.
#[derive(Debug, Clone, Copy)]
struct Reported {
    seq: u64,
    sent_at: Instant,
    remaining: u32,
    until: Instant,
}

/// What the newest answer said was left.
#[derive(Debug, Clone, Copy)]
struct Ceiling {
    seq: u64,
    sent_at: Instant,
    /// `r` less the requests that may have raced the reported one.
    remaining: u32,
    /// After this the count is stale: one probe may go to learn a new one.
    until: Instant,
}

#[derive(Debug, Clone)]
pub(super) struct Window {
    pub name: String,
    pub quota: u32,
    pub length: Duration,
    ceiling: Option<Ceiling>,
    /// Counts reported for requests sent within the delivery margin of the newest reported one.
    reported: VecDeque<Reported>,
    /// The quota before a 429 lowered it (servers without headers), and when it was last
    /// lowered or raised again.
    guessed: Option<(u32, Instant)>,
}

/// How much room a window has now, and when it gets more (`None`: when an answer arrives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Room {
    pub left: u32,
    pub more_at: Option<Instant>,
    /// The room is a probe of a stale ceiling: it goes whatever the priority, as only its
    /// answer tells what is left.
    pub probe: bool,
}

impl Window {
    pub(super) fn new(name: &str, quota: u32, length: Duration) -> Window {
        Window {
            name: name.to_owned(),
            quota: quota.max(1),
            length: length.clamp(Duration::from_secs(1), MAX_ANNOUNCED_WAIT),
            ceiling: None,
            reported: VecDeque::new(),
            guessed: None,
        }
    }

    /// A window whose state on the server is unknown (a fresh process: a previous leader's
    /// requests may still count): the first request is a probe, whose answer says what is left.
    pub(super) fn unknown(name: &str, quota: u32, length: Duration, now: Instant) -> Window {
        Window {
            ceiling: Some(Ceiling {
                seq: 0,
                sent_at: now,
                remaining: 0,
                until: now,
            }),
            ..Window::new(name, quota, length)
        }
    }

    /// A 429 without counts, with `before` of our requests sent in the span before it: when
    /// those plausibly explain it (at least a few: a lone request refused after a failover is
    /// the old leader's doing), the quota is at most that. Raised again by one per
    /// [`RECOVER_AFTER_SPANS`] spans without another such 429, up to what it was.
    pub(super) fn learn(&mut self, before: u32, now: Instant) {
        if before < self.quota.min(LEARN_FROM) || before >= self.quota {
            return;
        }
        let configured = self
            .guessed
            .map_or(self.quota, |(configured, _)| configured);
        self.quota = before;
        self.guessed = Some((configured, now));
    }

    /// Gives back one request of a lowered quota per span that passed without a 429.
    pub(super) fn recover(&mut self, now: Instant) {
        let span = self.span() * RECOVER_AFTER_SPANS;
        if let Some((configured, since)) = self.guessed
            && now >= since + span
        {
            self.quota = (self.quota + 1).min(configured);
            self.guessed = (self.quota < configured).then_some((configured, now));
        }
    }

    /// How long the log counts a request: the window plus the delivery margin.
    pub(super) fn span(&self) -> Duration {
        self.length + RESET_MARGIN
    }

    /// The room left at `now` under both rules.
    pub(super) fn room(&self, sent: &SendLog, now: Instant) -> Room {
        let span = self.span();
        let counted_from = now.checked_sub(span);
        let first = counted_from.map_or(0, |from| sent.partition_point(|(_, at)| *at <= from));
        let in_log = u32::try_from(sent.len() - first).unwrap_or(u32::MAX);
        let log = Room {
            left: self.quota.saturating_sub(in_log),
            more_at: sent.get(first).map(|(_, at)| *at + span),
            probe: false,
        };
        let Some(ceiling) = self.ceiling else {
            return log;
        };
        let counted = ceiling
            .remaining
            .saturating_sub(sent_after(sent, ceiling.seq));
        let by_ceiling = if now < ceiling.until {
            Room {
                left: counted,
                more_at: Some(ceiling.until),
                probe: false,
            }
        } else {
            // Stale: our own requests only free room as time passes, so what was left is still
            // left; beyond it one probe goes, whose answer says more.
            let probe = 1u32.saturating_sub(sent_since(sent, ceiling.until));
            Room {
                left: counted.max(probe),
                more_at: None,
                probe: probe > 0 && counted == 0,
            }
        };
        match by_ceiling.left.cmp(&log.left) {
            std::cmp::Ordering::Less => by_ceiling,
            std::cmp::Ordering::Greater => log,
            // Both bind: more room comes only when both give it.
            std::cmp::Ordering::Equal => Room {
                left: log.left,
                more_at: by_ceiling.more_at.zip(log.more_at).map(|(a, b)| a.max(b)),
                probe: by_ceiling.probe,
            },
        }
    }

    /// Until when a request of this priority must wait (`Err(None)`: until something changes),
    /// or `Ok` if it may go now.
    pub(super) fn admits(
        &self,
        priority: Priority,
        sent: &SendLog,
        now: Instant,
    ) -> Result<(), Option<Instant>> {
        let room = self.room(sent, now);
        let reserve = match priority {
            Priority::Routine => (self.quota / 10).min(self.quota.saturating_sub(1)),
            _ => 0,
        };
        if room.left > reserve || (room.probe && room.left > 0) {
            return Ok(());
        }
        if room.left == 0 {
            return Err(room.more_at);
        }
        // Held back only by the reserve left for creates and deletes: released when our own
        // requests free room soon anyway, so queued routine work still uses the whole quota. (A
        // count going stale frees nothing for sure: under a token bucket that is every second.)
        let soon = self.length / 12;
        match self.frees_at(sent, now) {
            // Nothing of ours is counted: the reserve would only guard against others.
            None => Ok(()),
            Some(frees) if frees <= now + soon => Ok(()),
            Some(frees) => {
                let release = frees - soon;
                // Wake earlier when a count goes stale: its probe may say more.
                Err(Some(room.more_at.map_or(release, |more| more.min(release))))
            }
        }
    }

    /// When the oldest of our requests this window counts stops counting.
    fn frees_at(&self, sent: &SendLog, now: Instant) -> Option<Instant> {
        let span = self.span();
        let first = now
            .checked_sub(span)
            .map_or(0, |from| sent.partition_point(|(_, at)| *at <= from));
        sent.get(first).map(|(_, at)| *at + span)
    }

    /// Follows a `RateLimit-Policy` member.
    pub(super) fn set_policy(&mut self, quota: u32, length: Duration) {
        self.quota = quota.max(1);
        self.length = length.clamp(Duration::from_secs(1), MAX_ANNOUNCED_WAIT);
    }

    /// Takes a reported count, observed `now`. The ceiling is the newest reported request's
    /// (`C`). Its count is the lowest `r` reported for requests sent within the delivery margin
    /// before `C` (the server may have taken them in any order; the one it took last has every
    /// one of them), less the requests sent in that margin before `C` that have no count here
    /// (still unanswered, or ended without one: the server may have taken them after). It goes
    /// stale at `C`'s reset. An older request's count only corrects `C`'s ceiling while it
    /// stands; it never brings back one that went away, nor moves when it goes stale.
    pub(super) fn apply(&mut self, report: Report, now: Instant, sent: &SendLog) {
        let wait = Duration::from_secs(report.reset_secs).min(MAX_ANNOUNCED_WAIT);
        self.reported.push_back(Reported {
            seq: report.seq,
            sent_at: report.sent_at,
            remaining: report.remaining.min(self.quota),
            until: now + wait + RESET_MARGIN,
        });
        let Some(newest) = self.reported.iter().max_by_key(|r| r.seq).copied() else {
            return;
        };
        let from = newest
            .sent_at
            .checked_sub(RESET_MARGIN)
            .unwrap_or(newest.sent_at);
        self.reported.retain(|r| r.sent_at >= from);
        let Some(lowest) = self.reported.iter().min_by_key(|r| r.remaining).copied() else {
            return;
        };
        // The log is in send order: only its tail from `from` is looked at (every answer comes
        // through here).
        let first = sent.partition_point(|(_, at)| *at < from);
        let uncounted = sent
            .range(first..)
            .filter(|(seq, _)| *seq < newest.seq)
            .filter(|(seq, _)| !self.reported.iter().any(|r| r.seq == *seq))
            .count();
        let remaining = lowest
            .remaining
            .saturating_sub(u32::try_from(uncounted).unwrap_or(u32::MAX));
        if report.seq == newest.seq {
            self.ceiling = Some(Ceiling {
                seq: newest.seq,
                sent_at: newest.sent_at,
                remaining,
                until: newest.until,
            });
        } else if let Some(ceiling) = self.ceiling.as_mut()
            && ceiling.seq == newest.seq
        {
            ceiling.remaining = remaining;
        }
    }

    /// A request sent at `sent_at` ended without a count for this window: if it was the probe
    /// of a stale ceiling, nothing more will be learnt that way, so only the log counts.
    pub(super) fn unreported(&mut self, sent_at: Instant) {
        if self.ceiling.is_some_and(|ceiling| sent_at >= ceiling.until) {
            self.ceiling = None;
        }
    }

    /// The earliest send time this window may still need to count, `now` or when an
    /// unanswered request was sent (a 429 for it counts what was sent in the span before).
    pub(super) fn needs_sends_since(&self, now: Instant) -> Instant {
        let log_from = now.checked_sub(self.span()).unwrap_or(now);
        match self.ceiling {
            Some(ceiling) => {
                let from = ceiling
                    .sent_at
                    .checked_sub(RESET_MARGIN)
                    .unwrap_or(ceiling.sent_at);
                log_from.min(from)
            }
            None => log_from,
        }
    }
}

/// Requests sent at or after `since`.
fn sent_since(sent: &SendLog, since: Instant) -> u32 {
    let first = sent.partition_point(|(_, at)| *at < since);
    u32::try_from(sent.len() - first).unwrap_or(u32::MAX)
}

/// Requests numbered after `seq`.
fn sent_after(sent: &SendLog, seq: u64) -> u32 {
    let first = sent.partition_point(|(number, _)| *number <= seq);
    u32::try_from(sent.len() - first).unwrap_or(u32::MAX)
}
