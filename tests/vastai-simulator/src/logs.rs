//! Logs the Vast.ai way: `PUT /api/v0/instances/request_logs/{id}/` answers a `result_url`; the
//! file appears there (unauthenticated GET) only after a few polls, as the upload is
//! asynchronous. `tail` keeps the last lines; `daemon_logs` gives the host daemon's lines.

use std::time::Instant;

use serde_json::{Value, json};

use crate::instance::{Instance, Status, Timings};
use crate::reply::Reply;
use crate::state::World;

/// A requested log file.
#[derive(Debug, Clone)]
pub(crate) struct LogRequest {
    pub instance_id: u64,
    pub tail: Option<usize>,
    pub daemon: bool,
    /// 404s left before the file is there.
    pub polls_left: u32,
}

/// Reads `{"tail":"1000","filter":"..","daemon_logs":"true"}` (strings, as the clients send).
fn parse_options(body: &[u8]) -> Result<(Option<usize>, bool), String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((None, false));
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let object = value.as_object().ok_or("the body must be a JSON object")?;
    let mut tail = None;
    let mut daemon = false;
    for (key, value) in object {
        let text = value
            .as_str()
            .ok_or_else(|| format!("{key} must be a string, as the CLI sends it"))?;
        match key.as_str() {
            "tail" => {
                tail = Some(
                    text.parse::<usize>()
                        .map_err(|_| format!("tail {text:?} is not a number"))?,
                )
            }
            "daemon_logs" => daemon = text == "true",
            "filter" => {}
            other => return Err(format!("unknown field {other:?}")),
        }
    }
    Ok((tail, daemon))
}

/// `PUT /api/v0/instances/request_logs/{id}/`.
pub(crate) fn request(
    world: &mut World,
    id: u64,
    body: &[u8],
    base_url: &str,
    ready_after: u32,
) -> Reply {
    if world
        .instances
        .get(&id)
        .is_none_or(|i| i.destroyed.is_some())
    {
        return Reply::error(404, "invalid_id", format!("instance {id} not found"));
    }
    let (tail, daemon) = match parse_options(body) {
        Ok(options) => options,
        Err(problem) => return Reply::invalid(problem),
    };
    let token: String = std::iter::repeat_with(|| world.rng.alphanumeric())
        .take(24)
        .collect();
    world.log_requests.insert(
        token.clone(),
        LogRequest {
            instance_id: id,
            tail,
            daemon,
            polls_left: ready_after,
        },
    );
    Reply::ok(json!({
        "success": true,
        "result_url": format!("{base_url}/_logs/{token}.log"),
        "msg": "Logs request queued; fetch result_url when it is ready",
    }))
}

/// The lines an instance has printed by `now`.
fn lines(instance: &Instance, now: Instant, timings: Timings, daemon: bool) -> Vec<String> {
    let (status, message) = instance.status(now, timings);
    if daemon {
        let mut lines = vec![format!("pulling image {}", instance.order.image)];
        if status == Status::Created {
            lines.push(message);
        }
        return lines;
    }
    if matches!(
        status,
        Status::Provisioning | Status::Created | Status::Loading
    ) {
        return Vec::new();
    }
    instance.logs.clone()
}

/// `GET /_logs/{token}.log`: 404 until uploaded, then the text.
pub(crate) fn fetch(world: &mut World, token: &str, now: Instant, timings: Timings) -> Reply {
    let Some(request) = world.log_requests.get_mut(token) else {
        return Reply::text(404, "NoSuchKey".to_owned());
    };
    if request.polls_left > 0 {
        request.polls_left -= 1;
        return Reply::text(404, "NoSuchKey".to_owned());
    }
    let request = request.clone();
    let Some(instance) = world.instances.get(&request.instance_id) else {
        return Reply::text(404, "NoSuchKey".to_owned());
    };
    let mut lines = lines(
        instance,
        instance.destroyed.unwrap_or(now),
        timings,
        request.daemon,
    );
    if let Some(tail) = request.tail {
        let skip = lines.len().saturating_sub(tail);
        lines.drain(..skip);
    }
    let mut text = lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    Reply::text(200, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_strings_and_unknown_ones_are_refused() {
        assert_eq!(parse_options(b""), Ok((None, false)));
        assert_eq!(
            parse_options(br#"{"tail":"2","daemon_logs":"true"}"#),
            Ok((Some(2), true))
        );
        assert!(parse_options(br#"{"tail":2}"#).is_err());
        assert!(parse_options(br#"{"lines":"2"}"#).is_err());
    }
}
