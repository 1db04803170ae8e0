//! Vast.ai has no log stream: `kubectl logs` reads the tail through `request_logs`, and `-f`
//! reads it again every few seconds, yielding the lines not shown yet, until the container ends.

use std::time::Duration;

use super::{InstanceState, state_of};
use crate::provider::{LogEntry, ProviderError};
use crate::vastai::client::VastClient;

/// Lines asked for on each poll of a followed log.
const FOLLOW_TAIL: u32 = 1000;
/// How often a followed log is read again.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(5);

/// The lines of `current` that `previous` had not shown: `current` is a newer tail of the same
/// log, so the longest end of `previous` that it starts with is skipped. Without overlap (the log
/// moved on by more than a tail) everything is new.
pub(super) fn new_lines<'a>(previous: &[String], current: &'a [String]) -> &'a [String] {
    if previous.is_empty() {
        return current;
    }
    // The newest position in `current` where the whole end of `previous` (up to the overlap)
    // lines up.
    let longest = previous.len().min(current.len());
    for overlap in (1..=longest).rev() {
        if current[..overlap] == previous[previous.len() - overlap..] {
            return &current[overlap..];
        }
    }
    current
}

pub(super) fn lines_of(text: &str) -> Vec<String> {
    text.lines().map(str::to_owned).collect()
}

pub(super) fn entries(lines: &[String]) -> Vec<LogEntry> {
    lines
        .iter()
        .map(|line| LogEntry {
            timestamp: None,
            line: line.clone(),
        })
        .collect()
}

/// The log as a stream: one read, or with `follow` a read every [`FOLLOW_INTERVAL`] yielding
/// the new lines, until the instance no longer runs.
pub(super) fn async_stream(
    client: VastClient,
    id: Option<u64>,
    tail: Option<u32>,
    follow: bool,
) -> impl futures_util::Stream<Item = Result<LogEntry, ProviderError>> + Send {
    struct State {
        client: VastClient,
        id: Option<u64>,
        tail: Option<u32>,
        follow: bool,
        previous: Vec<String>,
        pending: std::collections::VecDeque<LogEntry>,
        first: bool,
        done: bool,
    }
    let state = State {
        client,
        id,
        tail,
        follow,
        previous: Vec::new(),
        pending: Default::default(),
        first: true,
        done: false,
    };
    futures_util::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(entry) = state.pending.pop_front() {
                return Some((Ok(entry), state));
            }
            if state.done {
                return None;
            }
            let id = state.id?;
            if !state.first {
                tokio::time::sleep(FOLLOW_INTERVAL).await;
                // The container ended or the instance is gone: one last read, then the end.
                let running = match state.client.get(id).await {
                    Ok(Some(instance)) => matches!(
                        state_of(&instance),
                        InstanceState::Running | InstanceState::Starting
                    ),
                    _ => false,
                };
                if !running {
                    state.done = true;
                }
            }
            let asked = if state.first {
                state.tail.unwrap_or(FOLLOW_TAIL).min(FOLLOW_TAIL)
            } else {
                FOLLOW_TAIL
            };
            let text = match state.client.logs(id, asked).await {
                Ok(text) => text,
                Err(error) => {
                    state.done = true;
                    return Some((Err(super::provider_error(error)), state));
                }
            };
            let current = lines_of(&text);
            let fresh = new_lines(&state.previous, &current).to_vec();
            state.pending.extend(entries(&fresh));
            state.previous = current;
            state.first = false;
            if !state.follow {
                state.done = true;
            }
        }
    })
}
