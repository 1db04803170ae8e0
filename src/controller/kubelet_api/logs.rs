//! `GET /containerLogs/{namespace}/{pod}/{container}`: `kubectl logs` read from the cloud, with
//! the kubelet's parameters (`follow`, `tailLines`, `sinceSeconds`, `sinceTime`, `timestamps`,
//! `limitBytes`); bad ones are a 400.

use std::sync::Arc;

use crate::controller::cached;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

use super::ApiState;
use crate::provider::{LogEntry, LogOptions, Provider};

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct LogQuery {
    follow: Option<String>,
    tail_lines: Option<String>,
    since_seconds: Option<String>,
    since_time: Option<String>,
    timestamps: Option<String>,
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, format!("{message}\n")).into_response()
}

fn flag(value: &Option<String>, name: &str) -> Result<bool, String> {
    match value.as_deref() {
        None | Some("") | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(format!("{name}={other:?} is not a boolean")),
    }
}

/// The log options a query asks for, or a 400 naming the bad parameter.
fn options(query: &LogQuery, now: Timestamp) -> Result<(LogOptions, bool), String> {
    let follow = flag(&query.follow, "follow")?;
    let timestamps = flag(&query.timestamps, "timestamps")?;
    let tail_lines = match &query.tail_lines {
        None => None,
        Some(value) => Some(
            value
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
                .ok_or_else(|| format!("tailLines={value:?} is not a non-negative integer"))?,
        ),
    };
    let since = match (&query.since_seconds, &query.since_time) {
        (Some(_), Some(_)) => {
            return Err("sinceSeconds and sinceTime cannot both be set".into());
        }
        (Some(seconds), None) => {
            let seconds = seconds
                .parse::<i64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("sinceSeconds={seconds:?} is not a positive integer"))?;
            Some(
                now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
                    .unwrap_or(Timestamp::UNIX_EPOCH),
            )
        }
        (None, Some(time)) => Some(
            time.parse::<Timestamp>()
                .map_err(|_| format!("sinceTime={time:?} is not an RFC 3339 time"))?,
        ),
        (None, None) => None,
    };
    Ok((
        LogOptions {
            follow,
            tail_lines,
            since,
            container: None,
            init_containers: false,
        },
        timestamps,
    ))
}

pub(super) async fn container_logs<P: Provider>(
    State(state): State<Arc<ApiState<P>>>,
    Path((namespace, name, container)): Path<(String, String, String)>,
    Query(query): Query<LogQuery>,
) -> Response {
    let (mut options, timestamps) = match options(&query, Timestamp::now()) {
        Ok(parsed) => parsed,
        Err(message) => return bad_request(message),
    };
    let Some(pod) = cached::get(&state.pods, &namespace, &name) else {
        return (
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{name} is not on this node\n"),
        )
            .into_response();
    };
    let known = pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.name == container)
    });
    if !known {
        return (
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{name} has no container {container:?}\n"),
        )
            .into_response();
    }
    // An init container's lines are its own part of the pod's one cloud container's log.
    let init = pod.spec.as_ref().is_some_and(|s| {
        s.init_containers
            .iter()
            .flatten()
            .any(|c| c.name == container)
    });
    if init {
        options.container = Some(container.clone());
    }
    options.init_containers = crate::controller::pods::status::inits::has_inits(&pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    // A finished container: its instance is terminated, so serve what was kept of its log.
    let kept = state.shared.remember(&uid, |m| {
        if init {
            let logs = m.final_init_logs.clone()?;
            let lines = logs
                .iter()
                .find(|(name, _)| *name == container)
                .map(|(_, lines)| lines.clone())
                .unwrap_or_default();
            Some(std::sync::Arc::new(lines))
        } else {
            m.final_log.clone()
        }
    });
    if let Some(kept) = kept {
        let text: String = kept_lines(&kept, &options)
            .map(|entry| log_line(entry, timestamps))
            .collect();
        return (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            text,
        )
            .into_response();
    }
    let instance_id = state.shared.pods_instance(&uid).map(|i| i.id).or_else(|| {
        state
            .shared
            .remember(&uid, |m| m.instance.as_ref().map(|(id, _)| id.clone()))
    });
    let Some(instance_id) = instance_id else {
        return (
            StatusCode::BAD_REQUEST,
            not_started(&pod, &container, state.shared.provider.cloud().title),
        )
            .into_response();
    };
    let lines = state
        .shared
        .provider
        .logs(&instance_id, options)
        .map(move |item| match item {
            Ok(entry) => {
                let text = log_line(&entry, timestamps);
                Ok::<_, std::io::Error>(text)
            }
            Err(error) => Err(std::io::Error::other(error.to_string())),
        });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// What `kubectl logs` says of a container with no instance: one that will never start (its
/// pod failed before it ran, refused, say) says why, as the pod's status does; any other is
/// waiting to start.
fn not_started(pod: &Pod, container: &str, cloud: &str) -> String {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.as_ref();
    let waiting = status
        .into_iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .find(|s| s.name == container)
        .and_then(|s| s.state.as_ref()?.waiting.as_ref());
    let failed = status.and_then(|s| s.phase.as_deref()) == Some("Failed");
    match waiting {
        Some(waiting) if failed => format!(
            "container {container:?} in pod {namespace}/{name} will never start: {}: {}\n",
            waiting.reason.as_deref().unwrap_or("Failed"),
            waiting.message.as_deref().unwrap_or_default()
        ),
        _ => format!(
            "container {container:?} in pod {namespace}/{name} is waiting to start on {cloud}\n"
        ),
    }
}

/// One line as `kubectl logs` shows it, with its timestamp first when asked for.
fn log_line(entry: &LogEntry, timestamps: bool) -> String {
    match (&entry.timestamp, timestamps) {
        (Some(ts), true) => format!("{ts} {}\n", entry.line),
        _ => format!("{}\n", entry.line),
    }
}

/// The kept lines `options` asks for: newer than `since` (lines without a readable timestamp
/// are kept), then the last `tail_lines`.
fn kept_lines<'a>(
    kept: &'a [LogEntry],
    options: &LogOptions,
) -> impl Iterator<Item = &'a LogEntry> + 'a {
    let since = options.since;
    let recent: Vec<&LogEntry> = kept
        .iter()
        .filter(move |entry| {
            let stamp = entry
                .timestamp
                .as_deref()
                .and_then(|ts| ts.parse::<Timestamp>().ok());
            match (since, stamp) {
                (Some(since), Some(stamp)) => stamp >= since,
                _ => true,
            }
        })
        .collect();
    let skip = options
        .tail_lines
        .map_or(0, |tail| recent.len().saturating_sub(tail as usize));
    recent.into_iter().skip(skip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> LogQuery {
        let text = pairs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        serde_urlencoded_like(&text)
    }

    fn serde_urlencoded_like(text: &str) -> LogQuery {
        let uri: axum::http::Uri = format!("/x?{text}").parse().unwrap();
        Query::<LogQuery>::try_from_uri(&uri).unwrap().0
    }

    /// A refused pod's containers say why they will never start; a pod still on its way says
    /// it is waiting.
    #[test]
    fn a_container_that_will_never_start_says_why() {
        let pod = |phase: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"initContainers": [{"name": "fetch"}], "containers": [{"name": "main"}]},
                "status": {"phase": phase,
                    "containerStatuses": [{"name": "main", "image": "i", "imageID": "",
                        "ready": false, "restartCount": 0,
                        "state": {"waiting": {"reason": "CannotRunOnRunPod",
                            "message": "RunPod cannot run this pod: init containers"}}}],
                    "initContainerStatuses": [{"name": "fetch", "image": "b", "imageID": "",
                        "ready": false, "restartCount": 0,
                        "state": {"waiting": {"reason": "CannotRunOnRunPod", "message": "m"}}}]}
            }))
            .unwrap()
        };
        assert_eq!(
            not_started(&pod("Failed"), "main", "RunPod"),
            "container \"main\" in pod ns/p will never start: CannotRunOnRunPod: RunPod cannot \
             run this pod: init containers\n"
        );
        assert!(not_started(&pod("Failed"), "fetch", "RunPod").contains("will never start"));
        assert_eq!(
            not_started(&pod("Pending"), "main", "RunPod"),
            "container \"main\" in pod ns/p is waiting to start on RunPod\n"
        );
    }

    #[test]
    fn log_parameters_parse_and_bad_ones_are_400() {
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let (opts, ts) = options(
            &query(&[
                ("follow", "true"),
                ("tailLines", "5"),
                ("sinceSeconds", "60"),
                ("timestamps", "true"),
            ]),
            now,
        )
        .unwrap();
        assert!(opts.follow && ts);
        assert_eq!(opts.tail_lines, Some(5));
        assert_eq!(opts.since.unwrap().to_string(), "2026-01-01T00:09:00Z");
        let (opts, _) = options(&query(&[("sinceTime", "2026-01-01T00:00:00Z")]), now).unwrap();
        assert_eq!(opts.since.unwrap().to_string(), "2026-01-01T00:00:00Z");
        for bad in [
            vec![("tailLines", "-1")],
            vec![("tailLines", "x")],
            vec![("sinceSeconds", "0")],
            vec![("sinceTime", "yesterday")],
            vec![("follow", "maybe")],
            vec![("sinceSeconds", "5"), ("sinceTime", "2026-01-01T00:00:00Z")],
        ] {
            let message = options(&query(&bad), now).unwrap_err();
            assert_eq!(
                bad_request(message).status(),
                StatusCode::BAD_REQUEST,
                "{bad:?}"
            );
        }
    }

    fn entry(ts: &str, line: &str) -> LogEntry {
        LogEntry {
            timestamp: Some(ts.to_owned()),
            line: line.to_owned(),
        }
    }

    #[test]
    fn kept_lines_honour_since_and_tail() {
        let kept = [
            entry("2026-11-23T10:00:00Z", "one"),
            entry("2026-11-23T10:00:10Z", "two"),
            entry("2026-11-23T10:00:20Z", "three"),
        ];
        let lines = |options: LogOptions| -> Vec<String> {
            kept_lines(&kept, &options)
                .map(|e| e.line.clone())
                .collect()
        };
        assert_eq!(lines(LogOptions::default()), ["one", "two", "three"]);
        let tail = LogOptions {
            tail_lines: Some(2),
            ..LogOptions::default()
        };
        assert_eq!(lines(tail), ["two", "three"]);
        let since = LogOptions {
            since: Some("2026-11-23T10:00:05Z".parse().unwrap()),
            tail_lines: Some(5),
            ..LogOptions::default()
        };
        assert_eq!(lines(since), ["two", "three"]);
    }
}
