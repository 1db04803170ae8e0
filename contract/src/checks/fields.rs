//! The container fields a burst pod sets that a cloud does not apply (security context) or run
//! (probes, hooks, limits), said at admission and in the controller's Event; and the one rule
//! for which probe and hook handlers the controller runs.

use compact_str::CompactString;

use crate as contract;
use crate::pod::PodView;

/// The `securityContext` fields a pod sets that a cloud instance does not apply: the container
/// runs as its image's user, with a writable root filesystem and the cloud's own capabilities
/// and seccomp profile. A value that asks for nothing beyond that (`privileged: false`,
/// `readOnlyRootFilesystem: false`, `runAsNonRoot: false`, `allowPrivilegeEscalation: true`) is
/// honoured as it is and not listed. Paths as `kubectl explain` names them.
pub fn unapplied_security_context(pod: &PodView) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut unapplied = Vec::new();
    let mut read = |prefix: String, context: Option<&serde_json::Value>| {
        let Some(fields) = context.and_then(serde_json::Value::as_object) else {
            return;
        };
        for (field, value) in fields {
            let honoured = match (field.as_str(), value) {
                (_, serde_json::Value::Null) => true,
                ("privileged" | "readOnlyRootFilesystem" | "runAsNonRoot", value) => {
                    value.as_bool() == Some(false)
                }
                ("allowPrivilegeEscalation", value) => value.as_bool() == Some(true),
                (_, serde_json::Value::Array(items)) => items.is_empty(),
                (_, serde_json::Value::Object(items)) => items.is_empty(),
                _ => false,
            };
            if !honoured {
                unapplied.push(format!("{prefix}securityContext.{field}"));
            }
        }
    };
    read(String::new(), spec.security_context.as_ref());
    for container in &spec.containers {
        read(
            format!("containers[{}].", container.name),
            container.security_context.as_ref(),
        );
    }
    unapplied
}

/// [`unapplied_security_context`] as the admission warning and the controller's Event say it;
/// `None` when everything the pod sets is honoured.
pub fn unapplied_security_context_message(pod: &PodView, cloud: &str) -> Option<String> {
    let unapplied = unapplied_security_context(pod);
    (!unapplied.is_empty()).then(|| {
        format!(
            "{cloud} does not apply {}: the container runs as its image's user (root unless the \
             image sets USER), with a writable root filesystem and {cloud}'s default \
             capabilities; keep such pods local with {}: never",
            unapplied.join(", "),
            contract::BURST_MODE
        )
    })
}

/// The container fields a burst pod sets that no cloud container honours yet: probes (Ready
/// follows the container's start, and nothing restarts it on a failed probe), lifecycle hooks
/// (never run, but for the `exec_post_start` case below), and memory or CPU limits (not enforced inside the cloud's container: a
/// `ulimit` would break CUDA's address space, so none is set). Paths as `kubectl explain`
/// names them.
///
/// `in_container`: the cloud runs things inside the container (RunPod with the node's SSH
/// connection): probes (`exec`, `tcpSocket`, HTTP or HTTPS `httpGet`), the `preStop` hook
/// (`exec` or HTTP or HTTPS `httpGet`, before the stop), an `exec` `postStart` hook of a
/// container that sets its command or args (RunPod's completion wrapper runs it) and an HTTP or
/// HTTPS `httpGet` `postStart` hook (run over SSH once the container runs); those are then
/// honoured.
pub fn unhonoured(pod: &PodView, in_container: bool) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut unhonoured = Vec::new();
    for container in &spec.containers {
        let at = |field: &str| format!("containers[{}].{field}", container.name);
        let set = |value: &Option<serde_json::Value>| {
            value.as_ref().is_some_and(|value| !value.is_null())
        };
        for (field, value) in [
            ("startupProbe", &container.startup_probe),
            ("livenessProbe", &container.liveness_probe),
            ("readinessProbe", &container.readiness_probe),
        ] {
            if set(value) && !(in_container && value.as_ref().is_some_and(probe_runs)) {
                unhonoured.push(at(field));
            }
        }
        let given =
            |words: &Option<Vec<CompactString>>| words.as_ref().is_some_and(|w| !w.is_empty());
        let wrapped = given(&container.command) || given(&container.args);
        if let Some(hooks) = container.lifecycle.as_ref().and_then(|l| l.as_object()) {
            for (hook, value) in hooks {
                let exec = value.get("exec").is_some_and(|exec| !exec.is_null());
                let runs = in_container
                    && match hook.as_str() {
                        // Over SSH: a command, or an HTTP GET to the container's loopback.
                        "preStop" => exec || (!value["httpGet"].is_null() && probe_runs(value)),
                        // `exec` by the wrapper, beside the command; an HTTP GET over SSH
                        // once the container runs, before its probes.
                        "postStart" => {
                            (exec && wrapped)
                                || (!value["httpGet"].is_null()
                                    && probe_runs(value)
                                    && loopback_host(value))
                        }
                        _ => false,
                    };
                if !value.is_null() && !runs {
                    unhonoured.push(at(&format!("lifecycle.{hook}")));
                }
            }
        }
        let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
        for (resource, value) in [
            ("memory", limits.and_then(|l| l.memory.as_ref())),
            ("cpu", limits.and_then(|l| l.cpu.as_ref())),
        ] {
            // `null` reads as `None`.
            if value.is_some() {
                unhonoured.push(at(&format!("resources.limits.{resource}")));
            }
        }
    }
    unhonoured
}

/// A probe's or hook's handler, as far as running it on a cloud goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler<'a> {
    Exec,
    TcpSocket,
    HttpGet {
        scheme: Option<&'a str>,
    },
    /// gRPC, or none the controller knows.
    Other,
}

impl<'a> Handler<'a> {
    /// The handler a probe or hook (as JSON) sets.
    pub fn of(probe: &'a serde_json::Value) -> Handler<'a> {
        let has = |field: &str| probe.get(field).is_some_and(|value| !value.is_null());
        if has("exec") {
            Handler::Exec
        } else if has("httpGet") {
            Handler::HttpGet {
                scheme: probe
                    .pointer("/httpGet/scheme")
                    .and_then(serde_json::Value::as_str),
            }
        } else if has("tcpSocket") {
            Handler::TcpSocket
        } else {
            Handler::Other
        }
    }
}

/// Whether the controller's prober runs a handler: an `exec`, a `tcpSocket`, or an `httpGet`
/// over HTTP or HTTPS (no gRPC, no other scheme); if not, why (to follow "the liveness probe
/// "). The one rule for the admission warning and the prober.
pub fn handler_runs(handler: Handler<'_>) -> Result<(), &'static str> {
    match handler {
        Handler::Exec | Handler::TcpSocket => Ok(()),
        Handler::HttpGet {
            scheme: Some(scheme),
        } if !scheme.eq_ignore_ascii_case("HTTP") && !scheme.eq_ignore_ascii_case("HTTPS") => {
            Err("uses a scheme other than HTTP or HTTPS, which is not run on a cloud")
        }
        Handler::HttpGet { .. } => Ok(()),
        Handler::Other => Err("has no exec, httpGet or tcpSocket handler that can run on a cloud"),
    }
}

/// Whether an `httpGet` hook goes to the container itself (no `host`, or a loopback one): the
/// cloud's side reaches nothing else.
fn loopback_host(hook: &serde_json::Value) -> bool {
    match hook
        .pointer("/httpGet/host")
        .and_then(serde_json::Value::as_str)
    {
        None => true,
        Some(host) => matches!(host.trim(), "" | "localhost" | "127.0.0.1" | "::1"),
    }
}

fn probe_runs(probe: &serde_json::Value) -> bool {
    handler_runs(Handler::of(probe)).is_ok()
}

/// [`unhonoured`] as the admission warning and the controller's Event say it; `None` when the
/// pod sets none of them.
pub fn unhonoured_message(pod: &PodView, cloud: &str, in_container: bool) -> Option<String> {
    let unhonoured = unhonoured(pod, in_container);
    (!unhonoured.is_empty()).then(|| {
        format!(
            "{cloud} does not run or enforce {}: probes are not run (Ready follows the \
             container's start, and a failing probe restarts nothing), those lifecycle hooks \
             are not run, and memory and CPU limits are not enforced inside the container; keep pods \
             that rely on them local with {}: never",
            unhonoured.join(", "),
            contract::BURST_MODE
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_tcp_http_and_https_handlers_run_grpc_does_not() {
        let http = |scheme| Handler::HttpGet { scheme };
        let cases = [
            (Handler::Exec, true),
            (Handler::TcpSocket, true),
            (http(None), true),
            (http(Some("http")), true),
            (http(Some("HTTPS")), true),
            (http(Some("ftp")), false),
            (Handler::Other, false),
        ];
        for (handler, runs) in cases {
            assert_eq!(handler_runs(handler).is_ok(), runs, "{handler:?}");
        }
        assert!(
            handler_runs(http(Some("ftp")))
                .unwrap_err()
                .contains("HTTP or HTTPS")
        );
    }

    #[test]
    fn a_handler_is_read_from_json_as_the_api_server_sends_it() {
        let read = |value: serde_json::Value| {
            let handler = Handler::of(&value);
            format!("{handler:?}")
        };
        assert_eq!(
            read(serde_json::json!({"exec": {"command": ["true"]}})),
            "Exec"
        );
        assert_eq!(
            read(serde_json::json!({"tcpSocket": {"port": 80}})),
            "TcpSocket"
        );
        assert_eq!(
            read(serde_json::json!({"httpGet": {"port": 80, "scheme": "HTTPS"}})),
            "HttpGet { scheme: Some(\"HTTPS\") }"
        );
        assert_eq!(read(serde_json::json!({"grpc": {"port": 80}})), "Other");
        assert_eq!(read(serde_json::json!({"exec": null})), "Other");
    }
}
