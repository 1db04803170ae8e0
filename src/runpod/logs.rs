//! Pod logs over server-sent events (`GET /v2/pods/{id}/logs`), with `tail`, `since`, follow,
//! and resumption by `Last-Event-ID` when a followed stream drops.
//!
//! The service streams without an end marker. Without follow we stop at the first line newer
//! than the moment we asked (allowing for clock skew), when the backlog has gone quiet, or at
//! an overall deadline, whichever comes first. Without `tail` or `since` the whole retained
//! log (the service's maximum of 5000 lines) is asked for, as `kubectl logs` shows all.

use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use k8s_openapi::jiff::Timestamp;
use reqwest::Method;
use serde::Deserialize;
use tracing::debug;

use super::client::RunPodClient;
use super::error::{ApiError, Recovery};
use super::limiter::Priority;

/// Which log the service should stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSource {
    Container,
    System,
}

/// What to stream. `tail` is capped at the service's maximum of 5000.
#[derive(Debug, Clone, Default)]
pub struct LogRequest {
    pub source: Option<LogSource>,
    pub tail: Option<u32>,
    pub since: Option<Timestamp>,
    pub follow: bool,
    /// Resume after this event id (a previous line's `id`), instead of `tail`.
    pub after_id: Option<String>,
    /// Without follow: stop once no line arrived for this long (default 1 s; the first line
    /// gets `FIRST_LINE_WAIT`).
    pub quiet: Option<Duration>,
}

/// The service's largest `tail`.
pub const MAX_TAIL: u32 = 5000;
/// Without follow: how long the first line may take to arrive.
const FIRST_LINE_WAIT: Duration = Duration::from_secs(5);
/// Without follow: the longest a read may take, for a container that never goes quiet.
const READ_DEADLINE: Duration = Duration::from_secs(30);
/// Lines stamped up to this far after the request still count as backlog (server clocks).
const CLOCK_SKEW: Duration = Duration::from_secs(5);
/// Following: reopen a stream that has been silent this long (a half-open connection looks
/// exactly like a quiet container).
const IDLE_REOPEN: Duration = Duration::from_secs(300);
/// Following: the first wait before reopening a stream the service closed without sending a
/// line. It doubles with each such close up to `EMPTY_CLOSE_MAX_DELAY`, so a service that
/// keeps closing streams of a quiet pod does not take a routine limiter slot every half
/// second; a line arriving starts it over.
const EMPTY_CLOSE_FIRST_DELAY: Duration = Duration::from_secs(1);
const EMPTY_CLOSE_MAX_DELAY: Duration = Duration::from_secs(30);

/// One log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// The SSE event id; pass it as `after_id` to resume after this line.
    pub id: Option<String>,
    pub ts: Option<String>,
    pub source: Option<String>,
    pub line: String,
}

#[derive(Deserialize)]
struct Payload {
    #[serde(default)]
    ts: Option<String>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    line: Option<String>,
}

/// Log lines in order; ends when the log is complete (or the pod is gone, when following).
pub type LogStream = Pin<Box<dyn Stream<Item = Result<LogLine, ApiError>> + Send>>;

type Events = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

struct Cursor {
    client: RunPodClient,
    pod_id: String,
    request: LogRequest,
    asked_at: Timestamp,
    last_id: Option<String>,
    events: Option<Events>,
    /// The id the current stream resumed after: a service that repeats that event first
    /// (resuming "from" rather than "after" it) does not make us show it twice.
    resumed_after: Option<String>,
    lines_seen: u64,
    /// Whether a stream was ever opened: then a 404 on reopening means the pod is gone.
    opened: bool,
    deadline: tokio::time::Instant,
    failures: u32,
    /// Following: streams closed in a row without delivering a line.
    empty_closes: u32,
    /// Whether the current stream has delivered a line.
    stream_had_lines: bool,
    done: bool,
}

impl RunPodClient {
    /// Streams a pod's log lines. A followed stream reconnects with `Last-Event-ID` after a
    /// drop, so no line is lost or repeated; it ends when the pod is gone.
    pub fn logs(&self, pod_id: &str, request: LogRequest) -> LogStream {
        let cursor = Cursor {
            client: self.clone(),
            pod_id: pod_id.to_owned(),
            last_id: request.after_id.clone(),
            request,
            asked_at: Timestamp::now(),
            events: None,
            resumed_after: None,
            lines_seen: 0,
            opened: false,
            deadline: tokio::time::Instant::now() + READ_DEADLINE,
            failures: 0,
            empty_closes: 0,
            stream_had_lines: false,
            done: false,
        };
        Box::pin(futures_util::stream::unfold(
            cursor,
            |mut cursor| async move {
                let item = cursor.next_line().await?;
                Some((item, cursor))
            },
        ))
    }

    async fn open_logs(
        &self,
        pod_id: &str,
        request: &LogRequest,
        last_id: Option<&str>,
    ) -> Result<Events, ApiError> {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(source) = request.source {
            let source = match source {
                LogSource::Container => "container",
                LogSource::System => "system",
            };
            query.push(("source", source.to_owned()));
        }
        if last_id.is_none() {
            let tail = match (request.tail, request.since) {
                (Some(tail), _) => Some(tail),
                (None, None) => Some(MAX_TAIL),
                (None, Some(_)) => None,
            };
            if let Some(tail) = tail {
                query.push(("tail", tail.min(MAX_TAIL).to_string()));
            }
            if let Some(since) = request.since {
                query.push(("since", since.to_string()));
            }
        }
        let url = self.logs_url(pod_id, &query);
        let permit = self.limiter().acquire(Priority::Routine).await;
        let mut builder = self
            .request(Method::GET, url)
            .header("accept", "text/event-stream");
        if let Some(id) = last_id {
            builder = builder.header("last-event-id", id);
        }
        let started = tokio::time::Instant::now();
        // The timeout covers the answer's headers only: the stream itself is open-ended.
        let timeout = self.request_timeout();
        let response = match tokio::time::timeout(timeout, self.respond(permit, builder)).await {
            Ok(response) => response,
            Err(_) => Err(ApiError::Timeout { timeout }),
        };
        // Latency here is time to the stream's headers.
        self.record(
            "getPodLogs",
            response.as_ref().map(|_| ()),
            started.elapsed(),
        );
        let response = response?;
        Ok(Box::pin(response.bytes_stream().eventsource()))
    }
}

impl Cursor {
    /// The next line, an error that ends the stream, or `None` at the end.
    async fn next_line(&mut self) -> Option<Result<LogLine, ApiError>> {
        let policy = self.client.retry_policy().clone();
        loop {
            if self.done {
                return None;
            }
            let events = match self.events.as_mut() {
                Some(events) => events,
                None => match self
                    .client
                    .open_logs(&self.pod_id, &self.request, self.last_id.as_deref())
                    .await
                {
                    Ok(events) => {
                        self.opened = true;
                        self.stream_had_lines = false;
                        self.resumed_after.clone_from(&self.last_id);
                        self.events.insert(events)
                    }
                    Err(error) => {
                        if self.opened && error.recovery() == Recovery::Gone {
                            // The pod went away while we followed it: the log is complete.
                            self.done = true;
                            return None;
                        }
                        if error.recovery() == Recovery::Retry
                            && self.failures + 1 < policy.attempts
                        {
                            self.failures += 1;
                            tokio::time::sleep(policy.backoff(self.failures - 1)).await;
                            continue;
                        }
                        self.done = true;
                        return Some(Err(error));
                    }
                },
            };
            let next = if self.request.follow {
                match tokio::time::timeout(IDLE_REOPEN, events.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        debug!(pod_id = %self.pod_id, "log stream silent; reopening");
                        self.events = None;
                        continue;
                    }
                }
            } else {
                let quiet = if self.lines_seen == 0 {
                    FIRST_LINE_WAIT
                } else {
                    self.request.quiet.unwrap_or(Duration::from_secs(1))
                };
                let wait = quiet.min(
                    self.deadline
                        .saturating_duration_since(tokio::time::Instant::now()),
                );
                match tokio::time::timeout(wait, events.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        self.done = true;
                        return None;
                    }
                }
            };
            match next {
                Some(Ok(event)) => match self.take(&event) {
                    Taken::Line(line) => return Some(Ok(line)),
                    Taken::Skip => {}
                    Taken::End => return None,
                },
                Some(Err(error)) => {
                    debug!(pod_id = %self.pod_id, error = %error, "log stream broke");
                    self.events = None;
                    if !self.request.follow {
                        self.done = true;
                        return None;
                    }
                    self.failures += 1;
                    if self.failures >= policy.attempts {
                        self.done = true;
                        return Some(Err(ApiError::Transport {
                            message: format!("log stream kept breaking: {error}"),
                        }));
                    }
                    tokio::time::sleep(policy.backoff(self.failures - 1)).await;
                }
                None => {
                    if !self.closed(&policy).await {
                        return None;
                    }
                }
            }
        }
    }

    /// One event of the stream: a line to hand on (remembered as the place to resume after),
    /// one to skip (no line, or the one resumed after), or the end of a non-follow read (a
    /// line newer than when it was asked for).
    fn take(&mut self, event: &Event) -> Taken {
        self.failures = 0;
        let Some(line) = decode(event) else {
            return Taken::Skip;
        };
        if let Some(resumed) = self.resumed_after.take()
            && line.id.as_deref() == Some(resumed.as_str())
        {
            return Taken::Skip;
        }
        let horizon = self
            .asked_at
            .checked_add(CLOCK_SKEW)
            .unwrap_or(self.asked_at);
        if !self.request.follow && newer_than(&line, horizon) {
            self.done = true;
            return Taken::End;
        }
        self.lines_seen += 1;
        self.stream_had_lines = true;
        self.empty_closes = 0;
        if line.id.is_some() {
            self.last_id.clone_from(&line.id);
        }
        Taken::Line(line)
    }

    /// The server closed the stream. Following: reconnect after the last line (it answers 404
    /// once the pod is gone, which ends the stream); a quiet but living pod is followed for as
    /// long as the caller wants. `false` when the read is over.
    async fn closed(&mut self, policy: &crate::runpod::config::RetryPolicy) -> bool {
        self.events = None;
        if !self.request.follow {
            self.done = true;
            return false;
        }
        let delay = if self.stream_had_lines {
            policy.backoff(self.failures.min(4))
        } else {
            self.empty_closes = self.empty_closes.saturating_add(1);
            empty_close_delay(self.empty_closes)
        };
        debug!(
            pod_id = %self.pod_id,
            empty_closes = self.empty_closes,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "log stream closed; reopening"
        );
        tokio::time::sleep(delay).await;
        true
    }
}

/// What one event of the log stream means for the read.
enum Taken {
    Line(LogLine),
    Skip,
    End,
}

/// The wait before reopening after the `n`-th (1-based) empty close in a row: doubling from
/// `EMPTY_CLOSE_FIRST_DELAY` to `EMPTY_CLOSE_MAX_DELAY`, jittered so many followers spread out.
fn empty_close_delay(n: u32) -> Duration {
    let backoff = super::config::RetryPolicy {
        base_delay: EMPTY_CLOSE_FIRST_DELAY,
        max_delay: EMPTY_CLOSE_MAX_DELAY,
        ..super::config::retry_policy()
    };
    backoff.backoff(n.saturating_sub(1))
}

fn decode(event: &Event) -> Option<LogLine> {
    if event.data.is_empty() {
        return None;
    }
    let id = (!event.id.is_empty()).then(|| event.id.clone());
    match serde_json::from_str::<Payload>(&event.data) {
        Ok(payload) => Some(LogLine {
            id,
            ts: payload.ts,
            source: payload.source,
            line: payload.line.unwrap_or_default(),
        }),
        // Not the documented JSON: show the raw text rather than lose the line.
        Err(_) => Some(LogLine {
            id,
            ts: None,
            source: None,
            line: event.data.clone(),
        }),
    }
}

fn newer_than(line: &LogLine, moment: Timestamp) -> bool {
    line.ts
        .as_deref()
        .and_then(|ts| ts.parse::<Timestamp>().ok())
        .is_some_and(|ts| ts > moment)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, data: &str) -> Event {
        Event {
            event: String::new(),
            data: data.to_owned(),
            id: id.to_owned(),
            retry: None,
        }
    }

    #[test]
    fn decodes_the_documented_payload_and_keeps_odd_ones() {
        let line = decode(&event(
            "2026-06-01T12:02:03Z/000000000001",
            r#"{"ts":"2026-06-01T12:02:03Z","source":"container","line":"Model loaded."}"#,
        ))
        .unwrap();
        assert_eq!(line.line, "Model loaded.");
        assert_eq!(
            line.id.as_deref(),
            Some("2026-06-01T12:02:03Z/000000000001")
        );
        assert_eq!(decode(&event("", "plain text")).unwrap().line, "plain text");
        assert!(decode(&event("x", "")).is_none());
    }

    #[test]
    fn lines_after_the_request_end_a_non_following_read() {
        let asked = "2026-06-01T12:00:00Z".parse::<Timestamp>().unwrap();
        let line = |ts: &str| LogLine {
            id: None,
            ts: Some(ts.to_owned()),
            source: None,
            line: String::new(),
        };
        assert!(newer_than(&line("2026-06-01T12:00:01.5Z"), asked));
        assert!(!newer_than(&line("2026-06-01T11:59:59Z"), asked));
        assert!(!newer_than(&line("garbage"), asked));
    }
}
