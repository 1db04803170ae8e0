//! A container's probes as the prober runs them: what to do, and when, with the kubelet's
//! defaults for every timing field left unset.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use runpod_contract::checks::{Handler, handler_runs};

/// Which probe: they differ in what a failure does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// Until it succeeds, the others wait; failing restarts the container.
    Startup,
    /// Failing restarts the container.
    Liveness,
    /// Gates Ready.
    Readiness,
}

impl Kind {
    /// As the kubelet names it in its Events ("Liveness probe failed: ...").
    pub(crate) fn title(self) -> &'static str {
        match self {
            Kind::Startup => "Startup",
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
        }
    }
}

/// What a probe does inside the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Check {
    /// A command; exit code 0 is success.
    Exec(Vec<String>),
    /// An HTTP GET to the container's loopback; 200 to 399 is success. `https`: over TLS,
    /// the certificate not checked (as the kubelet does).
    Http {
        https: bool,
        /// The name said in TLS (SNI): `httpGet.host` only, as the kubelet dials that host; a
        /// `Host` header does not change it.
        server_name: Option<String>,
        port: u16,
        path: String,
        host: Option<String>,
        headers: Vec<(String, String)>,
    },
    /// A TCP connection to the container's loopback that opens is success.
    Tcp { port: u16 },
}

/// One probe with its timing (the kubelet's defaults filled in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    pub kind: Kind,
    pub check: Check,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

/// The container's `postStart` `httpGet` hook, which the prober runs once per container start,
/// before its probes (an `exec` one is the wrapper's, beside the command); `Err` says why it
/// cannot run.
pub(crate) fn post_start_http(container: &Container) -> Option<Result<Check, String>> {
    let http = container
        .lifecycle
        .as_ref()?
        .post_start
        .as_ref()?
        .http_get
        .as_ref()?;
    // The kubelet connects to `host`; from the cloud only the container's loopback is reached.
    if let Some(host) = http
        .host
        .as_deref()
        .map(str::trim)
        .filter(|h| !h.is_empty())
        && !matches!(host, "localhost" | "127.0.0.1" | "::1")
    {
        return Some(Err(format!(
            "the postStart hook's httpGet.host {host:?} is not reached from the cloud (only the \
             container's own loopback is)"
        )));
    }
    Some(http_check(http, container, "postStart hook"))
}

/// The probes of `container` the prober can run, in the order startup, liveness, readiness,
/// and why each other one cannot run (a gRPC probe, a port name the container does
/// not declare, no handler): those are left out, the others still run.
pub(crate) fn specs(container: &Container) -> (Vec<Spec>, Vec<String>) {
    let probes = [
        (Kind::Startup, container.startup_probe.as_ref()),
        (Kind::Liveness, container.liveness_probe.as_ref()),
        (Kind::Readiness, container.readiness_probe.as_ref()),
    ];
    let mut specs = Vec::new();
    let mut unrunnable = Vec::new();
    for (kind, probe) in probes {
        let Some(probe) = probe else { continue };
        match spec(kind, probe, container) {
            Ok(spec) => specs.push(spec),
            Err(why) => unrunnable.push(why),
        }
    }
    (specs, unrunnable)
}

fn seconds(value: Option<i32>, default: u64, least: u64) -> Duration {
    let secs = value.map_or(default, |v| u64::try_from(v).unwrap_or(0));
    Duration::from_secs(secs.max(least))
}

fn count(value: Option<i32>, default: u32) -> u32 {
    value
        .map_or(default, |v| u32::try_from(v).unwrap_or(1))
        .max(1)
}

fn spec(kind: Kind, probe: &Probe, container: &Container) -> Result<Spec, String> {
    let name = kind.title().to_lowercase();
    let handler = if probe.exec.is_some() {
        Handler::Exec
    } else if let Some(http) = &probe.http_get {
        Handler::HttpGet {
            scheme: http.scheme.as_deref(),
        }
    } else if probe.tcp_socket.is_some() {
        Handler::TcpSocket
    } else {
        Handler::Other
    };
    handler_runs(handler).map_err(|why| format!("the {name} probe {why}"))?;
    let check = if let Some(exec) = &probe.exec {
        let command = exec.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Err(format!("the {name} probe's exec command is empty"));
        }
        Check::Exec(command)
    } else if let Some(http) = &probe.http_get {
        http_check(http, container, &format!("{name} probe"))?
    } else if let Some(tcp) = &probe.tcp_socket {
        Check::Tcp {
            port: port(&tcp.port, container, &format!("{name} probe"))?,
        }
    } else {
        return Err(format!("the {name} probe has no handler"));
    };
    // Readiness and startup may need several successes; liveness and startup exactly one, as
    // the API server insists.
    let success_threshold = match kind {
        Kind::Readiness => count(probe.success_threshold, 1),
        Kind::Liveness | Kind::Startup => 1,
    };
    Ok(Spec {
        kind,
        check,
        initial_delay: seconds(probe.initial_delay_seconds, 0, 0),
        period: seconds(probe.period_seconds, 10, 1),
        timeout: seconds(probe.timeout_seconds, 1, 1),
        success_threshold,
        failure_threshold: count(probe.failure_threshold, 3),
    })
}

/// An `httpGet` action (of a probe or a hook, `what`) as the prober sends it: HTTP or HTTPS,
/// a `Host` header taking the place of `host`, the path absolute.
pub(crate) fn http_check(
    http: &HTTPGetAction,
    container: &Container,
    what: &str,
) -> Result<Check, String> {
    handler_runs(Handler::HttpGet {
        scheme: http.scheme.as_deref(),
    })
    .map_err(|why| format!("the {what} {why}"))?;
    let server_name = http.host.clone().filter(|host| !host.is_empty());
    let mut host = server_name.clone();
    let mut headers = Vec::new();
    for header in http.http_headers.iter().flatten() {
        if header.name.eq_ignore_ascii_case("host") {
            host = Some(header.value.clone());
        } else {
            headers.push((header.name.clone(), header.value.clone()));
        }
    }
    let path = http
        .path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or("/".into());
    let path = if path.starts_with('/') {
        path
    } else {
        format!("/{path}")
    };
    Ok(Check::Http {
        https: http
            .scheme
            .as_deref()
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("HTTPS")),
        server_name,
        port: port(&http.port, container, what)?,
        path,
        host,
        headers,
    })
}

/// A probe's or hook's port: a number, or the name of one of the container's ports.
fn port(value: &IntOrString, container: &Container, what: &str) -> Result<u16, String> {
    let number = match value {
        IntOrString::Int(number) => i64::from(*number),
        IntOrString::String(name) => match name.parse::<i64>() {
            Ok(number) => number,
            Err(_) => container
                .ports
                .iter()
                .flatten()
                .find(|port| port.name.as_deref() == Some(name.as_str()))
                .map(|port| i64::from(port.container_port))
                .ok_or_else(|| {
                    format!("the {what}'s port {name:?} is not a port of the container")
                })?,
        },
    };
    u16::try_from(number)
        .ok()
        .filter(|port| *port > 0)
        .ok_or_else(|| format!("the {what}'s port {number} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(value: serde_json::Value) -> Container {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn probes_are_read_with_the_kubelets_defaults() {
        let c = container(serde_json::json!({
            "name": "main",
            "ports": [{"name": "web", "containerPort": 8080}],
            "startupProbe": {"tcpSocket": {"port": 8080}, "failureThreshold": 30, "periodSeconds": 2},
            "livenessProbe": {"httpGet": {"port": "web", "path": "healthz",
                              "httpHeaders": [{"name": "Host", "value": "example"},
                                              {"name": "X-Probe", "value": "1"}]}},
            "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]},
                               "successThreshold": 2, "timeoutSeconds": 5, "initialDelaySeconds": 3}
        }));
        let (specs, unrunnable) = specs(&c);
        assert!(unrunnable.is_empty(), "{unrunnable:?}");
        assert_eq!(specs.len(), 3);
        assert_eq!(specs[0].kind, Kind::Startup);
        assert_eq!(specs[0].check, Check::Tcp { port: 8080 });
        assert_eq!(specs[0].failure_threshold, 30);
        assert_eq!(specs[0].period, Duration::from_secs(2));
        assert_eq!(
            specs[1].check,
            Check::Http {
                https: false,
                server_name: None,
                port: 8080,
                path: "/healthz".into(),
                host: Some("example".into()),
                headers: vec![("X-Probe".into(), "1".into())],
            }
        );
        assert_eq!(specs[1].period, Duration::from_secs(10));
        assert_eq!(specs[1].timeout, Duration::from_secs(1));
        assert_eq!(specs[1].failure_threshold, 3);
        assert_eq!(
            specs[2].check,
            Check::Exec(vec!["cat".into(), "/tmp/ready".into()])
        );
        assert_eq!(specs[2].success_threshold, 2);
        assert_eq!(specs[2].timeout, Duration::from_secs(5));
        assert_eq!(specs[2].initial_delay, Duration::from_secs(3));
    }

    #[test]
    fn an_https_probe_runs_over_tls() {
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "livenessProbe": {"httpGet": {"port": 8443, "scheme": "HTTPS", "path": "/live"}}
        }))
        .unwrap();
        let (specs, unrunnable) = specs(&container);
        assert!(unrunnable.is_empty(), "{unrunnable:?}");
        assert!(matches!(
            &specs[0].check,
            Check::Http { https: true, port: 8443, path, .. } if path == "/live"
        ));
    }

    #[test]
    fn a_probe_that_cannot_run_is_named() {
        let cases = [
            (
                serde_json::json!({"httpGet": {"port": 443, "scheme": "FTP"}}),
                "other than HTTP or HTTPS",
            ),
            (
                serde_json::json!({"tcpSocket": {"port": "grpc"}}),
                "\"grpc\" is not a port",
            ),
            (
                serde_json::json!({"tcpSocket": {"port": 70000}}),
                "out of range",
            ),
            (serde_json::json!({"exec": {"command": []}}), "empty"),
            (
                serde_json::json!({"grpc": {"port": 9000}}),
                "no exec, httpGet or tcpSocket",
            ),
        ];
        for (probe, expected) in cases {
            let c = container(serde_json::json!({"name": "main", "readinessProbe": probe,
                "livenessProbe": {"exec": {"command": ["true"]}}}));
            let (runnable, unrunnable) = specs(&c);
            assert_eq!(unrunnable.len(), 1, "{unrunnable:?}");
            assert!(unrunnable[0].contains(expected), "{unrunnable:?}");
            assert_eq!(runnable.len(), 1, "the liveness probe still runs");
            assert_eq!(runnable[0].kind, Kind::Liveness);
        }
        let none = container(serde_json::json!({"name": "main"}));
        assert_eq!(specs(&none), (Vec::new(), Vec::new()));
    }
}
