//! Pod logs: a per-pod store of container and system lines, and the SSE stream of
//! `GET /v2/pods/{id}/logs` (backlog, then follow until the pod is terminated).
//!
//! Event ids are `<ts>/<12-digit sequence>`: the spec says ids are the event timestamp, and the
//! sequence makes them unique when two lines share a timestamp, so a resume with
//! `Last-Event-ID` neither loses nor repeats a line. A bare RFC 3339 timestamp is accepted as
//! `Last-Event-ID` too (lines strictly after it).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::state::Shared;
use crate::timefmt;

/// Keep this many lines per pod (older ones are dropped).
const MAX_LINES_PER_POD: usize = 10_000;
/// An SSE comment is sent after this much silence so proxies keep the stream open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `LogSource`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogSource {
    Container,
    System,
}

impl LogSource {
    pub fn as_str(self) -> &'static str {
        match self {
            LogSource::Container => "container",
            LogSource::System => "system",
        }
    }

    pub fn parse(text: &str) -> Option<LogSource> {
        match text {
            "container" => Some(LogSource::Container),
            "system" => Some(LogSource::System),
            _ => None,
        }
    }
}

/// One log line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogLine {
    pub seq: u64,
    pub ts: SystemTime,
    pub source: LogSource,
    pub line: String,
}

impl LogLine {
    fn event_id(&self) -> String {
        format!("{}/{:012}", timefmt::format(self.ts), self.seq)
    }

    /// The SSE event text (`id:` and `data:` lines, blank line).
    pub fn sse(&self) -> String {
        let data = json!({
            "ts": timefmt::format(self.ts),
            "source": self.source.as_str(),
            "line": self.line,
        });
        format!("id: {}\ndata: {data}\n\n", self.event_id())
    }
}

/// Where the backlog starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Cursor {
    /// The last n lines.
    Tail(usize),
    /// Lines at or after this time (`since`).
    Since(SystemTime),
    /// Lines after this sequence number (`Last-Event-ID` from this endpoint).
    AfterSeq(u64),
    /// Lines strictly after this time (a bare timestamp as `Last-Event-ID`).
    AfterTs(SystemTime),
}

impl Cursor {
    /// Parses a `Last-Event-ID`.
    pub fn from_event_id(id: &str) -> Option<Cursor> {
        match id.trim().rsplit_once('/') {
            Some((ts, seq)) => {
                timefmt::parse(ts)?;
                if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                seq.parse().ok().map(Cursor::AfterSeq)
            }
            None => timefmt::parse(id).map(Cursor::AfterTs),
        }
    }
}

/// Every pod's lines, numbered by one global sequence.
#[derive(Debug)]
pub(crate) struct LogStore {
    next_seq: u64,
    last_ts: SystemTime,
    pods: HashMap<String, VecDeque<LogLine>>,
}

impl Default for LogStore {
    fn default() -> LogStore {
        LogStore {
            next_seq: 1,
            last_ts: SystemTime::UNIX_EPOCH,
            pods: HashMap::new(),
        }
    }
}

impl LogStore {
    /// Appends a line; timestamps never go backwards, so `since` and sequence order agree.
    pub fn append(&mut self, pod_id: &str, source: LogSource, line: &str, ts: SystemTime) {
        let ts = timefmt::truncate_micros(ts.max(self.last_ts));
        self.last_ts = ts;
        let lines = self.pods.entry(pod_id.to_owned()).or_default();
        lines.push_back(LogLine {
            seq: self.next_seq,
            ts,
            source,
            line: line.to_owned(),
        });
        self.next_seq += 1;
        if lines.len() > MAX_LINES_PER_POD {
            lines.pop_front();
        }
    }

    /// The sequence number the next line will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The backlog for a new stream.
    pub fn backlog(&self, pod_id: &str, filter: Option<LogSource>, cursor: Cursor) -> Vec<LogLine> {
        let Some(lines) = self.pods.get(pod_id) else {
            return Vec::new();
        };
        let matching = lines
            .iter()
            .filter(|l| filter.is_none_or(|source| l.source == source));
        match cursor {
            Cursor::Tail(n) => {
                let all: Vec<&LogLine> = matching.collect();
                all[all.len().saturating_sub(n)..]
                    .iter()
                    .map(|l| (*l).clone())
                    .collect()
            }
            Cursor::Since(t) => matching.filter(|l| l.ts >= t).cloned().collect(),
            Cursor::AfterSeq(seq) => matching.filter(|l| l.seq > seq).cloned().collect(),
            Cursor::AfterTs(t) => matching.filter(|l| l.ts > t).cloned().collect(),
        }
    }

    /// Lines numbered `from_seq` or later.
    pub fn newer(&self, pod_id: &str, filter: Option<LogSource>, from_seq: u64) -> Vec<LogLine> {
        self.backlog(pod_id, filter, Cursor::AfterSeq(from_seq.saturating_sub(1)))
    }
}

struct Follow {
    shared: Arc<Shared>,
    pod_id: String,
    filter: Option<LogSource>,
    next_seq: u64,
    pending: Option<Bytes>,
    changes: tokio::sync::watch::Receiver<u64>,
    done: bool,
}

/// The SSE body: `backlog`, then every new matching line until the pod is terminated.
/// `changes` must have been subscribed before the backlog was read, and `next_seq` is the
/// store's `next_seq()` at that moment, so no line falls between backlog and follow.
pub(crate) fn stream(
    shared: Arc<Shared>,
    pod_id: String,
    filter: Option<LogSource>,
    backlog: Vec<LogLine>,
    next_seq: u64,
    changes: tokio::sync::watch::Receiver<u64>,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let first: String = backlog.iter().map(LogLine::sse).collect();
    let state = Follow {
        shared,
        pod_id,
        filter,
        next_seq,
        pending: (!first.is_empty()).then(|| Bytes::from(first)),
        changes,
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(chunk) = st.pending.take() {
                return Some((Ok(chunk), st));
            }
            if st.done {
                return None;
            }
            let (lines, next_seq, ended) = st.shared.with_world(|world| {
                let ended = world.pod(&st.pod_id).is_none_or(|pod| pod.is_terminated());
                (
                    world.logs.newer(&st.pod_id, st.filter, st.next_seq),
                    world.logs.next_seq(),
                    ended,
                )
            });
            st.next_seq = next_seq;
            st.done = ended || st.shared.is_shutting_down();
            if !lines.is_empty() {
                st.pending = Some(Bytes::from(
                    lines.iter().map(LogLine::sse).collect::<String>(),
                ));
                continue;
            }
            if st.done {
                return None;
            }
            tokio::select! {
                changed = st.changes.changed() => {
                    if changed.is_err() {
                        st.done = true;
                    }
                }
                () = tokio::time::sleep(KEEP_ALIVE) => {
                    st.pending = Some(Bytes::from_static(b": keep-alive\n\n"));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_select_exactly_the_lines_after_them() {
        let mut store = LogStore::default();
        let t0 = SystemTime::now();
        for (i, source) in [
            LogSource::System,
            LogSource::Container,
            LogSource::Container,
        ]
        .into_iter()
        .enumerate()
        {
            store.append("p", source, &format!("line {i}"), t0);
        }
        let all = store.backlog("p", None, Cursor::Tail(100));
        assert_eq!(all.len(), 3);
        let tail = store.backlog("p", Some(LogSource::Container), Cursor::Tail(1));
        assert_eq!(tail[0].line, "line 2");
        let id = all[1].event_id();
        let Some(Cursor::AfterSeq(seq)) = Cursor::from_event_id(&id) else {
            panic!("{id} did not parse")
        };
        let rest = store.backlog("p", None, Cursor::AfterSeq(seq));
        assert_eq!(rest, all[2..].to_vec());
        assert_eq!(Cursor::from_event_id("garbage"), None);
    }
}
