//! Pod lifecycle: PROVISIONING → STARTING → RUNNING → ports published, with the scenario's
//! delays and image rules (EXITED after a while, ERROR on a failed pull), and the system log
//! lines each transition writes.

use std::time::{Duration, Instant, SystemTime};

use crate::logs::LogSource;
use crate::pods::{PodRecord, PodStatus, PortMapping, Script};
use crate::scenario::{ImageRule, Outcome, Scenario};
use crate::state::Clock;

/// The scenario's lifecycle delays.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub provisioning: Duration,
    pub starting: Duration,
    pub ports: Duration,
}

impl From<&Scenario> for Timing {
    fn from(s: &Scenario) -> Timing {
        Timing {
            provisioning: Duration::from_millis(s.provisioning_ms),
            starting: Duration::from_millis(s.starting_ms),
            ports: Duration::from_millis(s.ports_ms),
        }
    }
}

/// A log line a transition produced, appended by the caller.
#[derive(Debug, Clone)]
pub(crate) struct LogEvent {
    pub pod_id: String,
    pub source: LogSource,
    pub line: String,
    pub ts: SystemTime,
}

/// Collects the log lines of transitions.
#[derive(Debug)]
pub(crate) struct Events<'a> {
    clock: &'a Clock,
    pub out: Vec<LogEvent>,
}

impl<'a> Events<'a> {
    pub fn new(clock: &'a Clock) -> Events<'a> {
        Events {
            clock,
            out: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, pod: &PodRecord, source: LogSource, line: String, at: Instant) {
        self.out.push(LogEvent {
            pod_id: pod.id.clone(),
            source,
            line,
            ts: self.clock.system(at),
        });
    }

    /// A system log line at `at`.
    pub fn system(&mut self, pod: &PodRecord, line: impl Into<String>, at: Instant) {
        self.push(pod, LogSource::System, line.into(), at);
    }
}

/// The first image rule whose `match` is a substring of the image.
pub(crate) fn script_for(image: &str, rules: &[ImageRule]) -> Script {
    rules
        .iter()
        .find(|rule| image.contains(&rule.pattern))
        .map(|rule| Script {
            outcome: rule.outcome.map(|o| (o, rule.after_ms)),
            logs: rule.logs.clone(),
            exit_code: rule.exit_code,
            run: rule.run,
        })
        .unwrap_or_default()
}

/// (Re)starts a pod's run: PROVISIONING now, with the image's script.
pub(crate) fn begin_run(
    pod: &mut PodRecord,
    at: Instant,
    rules: &[ImageRule],
    ev: &mut Events<'_>,
) {
    pod.status = PodStatus::Provisioning;
    pod.phase_since = at;
    pod.running_since = None;
    unpublish(pod);
    pod.script = script_for(&pod.image, rules);
    if let Some(enabled) = pod.global_networking_next.take() {
        pod.global_networking = enabled;
    }
    ev.system(
        pod,
        format!("Provisioning pod on a machine in {}", pod.data_center_id),
        at,
    );
}

/// Restarts the container in place: STARTING now (ports are re-published later, with new
/// public ports, as on RunPod where mappings change on every reset).
pub(crate) fn restart_container(
    pod: &mut PodRecord,
    at: Instant,
    rules: &[ImageRule],
    ev: &mut Events<'_>,
) {
    pod.script = script_for(&pod.image, rules);
    if let Some(enabled) = pod.global_networking_next.take() {
        pod.global_networking = enabled;
    }
    enter_starting(pod, at, ev);
}

fn enter_starting(pod: &mut PodRecord, at: Instant, ev: &mut Events<'_>) {
    pod.gpu_billing_ended_at = None;
    pod.status = PodStatus::Starting;
    pod.phase_since = at;
    pod.running_since = None;
    unpublish(pod);
    ev.system(pod, format!("Pulling image {}", pod.image), at);
}

/// RUNNING from `at`: `startedAt` set, container log lines of the script emitted.
pub(crate) fn enter_running(pod: &mut PodRecord, at: Instant, ev: &mut Events<'_>) {
    pod.gpu_billing_ended_at = None;
    pod.status = PodStatus::Running;
    pod.phase_since = at;
    pod.running_since = Some(at);
    pod.started_at = Some(ev.clock.system(at));
    unpublish(pod);
    ev.system(pod, format!("Image pulled: {}", pod.image), at);
    ev.system(pod, "Container started", at);
    for line in pod.script.logs.clone() {
        ev.push(pod, LogSource::Container, line, at);
    }
    if pod.script.run {
        crate::process::start(&pod.id, &pod.args, &pod.env);
    }
}

/// The command that runs for real ended with `code` (see `process`): as a scripted exit does,
/// a wrapped pod stops (EXITED; the wrapper printed its code itself), any other container is
/// restarted in place and its command run again.
pub(crate) fn process_ended(pod: &mut PodRecord, code: i32, at: Instant, ev: &mut Events<'_>) {
    if pod.status != PodStatus::Running {
        return;
    }
    if pod.args.contains(WRAPPER_MARK) {
        enter_stopped(pod, PodStatus::Exited, at);
        ev.system(pod, "Container exited", at);
    } else {
        restarted_in_place(pod, code, at, ev);
        crate::process::start(&pod.id, &pod.args, &pod.env);
    }
}

/// RunPod restarts a container whose process ended (not under the wrapper) in place: the pod
/// stays RUNNING, its uptime starts again.
fn restarted_in_place(pod: &mut PodRecord, code: i32, at: Instant, ev: &mut Events<'_>) {
    ev.system(
        pod,
        format!("Container exited with code {code}; restarting it"),
        at,
    );
    pod.running_since = Some(at);
    pod.phase_since = at;
}

/// EXITED or ERROR from `at` (runtime and ports gone).
pub(crate) fn enter_stopped(pod: &mut PodRecord, status: PodStatus, at: Instant) {
    // GPU billing ends here (it resumes if the pod is started again).
    // To the microsecond, as every time the ledger serves.
    pod.gpu_billing_ended_at = Some(crate::timefmt::truncate_micros(
        pod.created_at + at.saturating_duration_since(pod.created_instant),
    ));
    pod.status = status;
    pod.phase_since = at;
    pod.running_since = None;
    unpublish(pod);
}

/// Forces a status "on command" (control API / `SimulatorHandle::set_status`). The scripted
/// image outcome is dropped for this run, so a forced RUNNING pod stays RUNNING.
pub(crate) fn force(pod: &mut PodRecord, status: PodStatus, at: Instant, ev: &mut Events<'_>) {
    pod.script.outcome = None;
    ev.system(pod, format!("Status set to {status} by the simulator"), at);
    match status {
        PodStatus::Provisioning => {
            pod.status = PodStatus::Provisioning;
            pod.phase_since = at;
            pod.running_since = None;
            unpublish(pod);
        }
        PodStatus::Starting => enter_starting(pod, at, ev),
        PodStatus::Running => enter_running(pod, at, ev),
        PodStatus::Exited | PodStatus::Error | PodStatus::Terminated => {
            enter_stopped(pod, status, at);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    ToStarting,
    ToRunning,
    PullFailed,
    PublishPorts,
    Exit,
}

/// Applies every transition whose time has come, each stamped at its own due time.
pub(crate) fn advance(
    pod: &mut PodRecord,
    now: Instant,
    timing: &Timing,
    rng: &mut fastrand::Rng,
    ev: &mut Events<'_>,
) {
    // Bounded: each step either changes status or publishes ports once.
    for _ in 0..8 {
        let Some((due, step)) = next_step(pod, timing) else {
            return;
        };
        if due > now {
            return;
        }
        match step {
            Step::ToStarting => enter_starting(pod, due, ev),
            Step::ToRunning => enter_running(pod, due, ev),
            Step::PullFailed => {
                enter_stopped(pod, PodStatus::Error, due);
                let repo = pod.image.split(':').next().unwrap_or_default().to_owned();
                ev.system(
                    pod,
                    format!(
                        "Error response from daemon: pull access denied for {repo}, repository \
                         does not exist or may require 'docker login'"
                    ),
                    due,
                );
            }
            Step::PublishPorts => publish_ports(pod, rng, due, ev),
            Step::Exit => process_exit(pod, due, ev),
        }
    }
}

/// The text by which the simulator recognises runpod-kubelet's completion wrapper in `args`.
pub const WRAPPER_MARK: &str = "runpod-kubelet: exit-code=";

/// The container's process ended. Under the completion wrapper it prints its code and stops
/// its own pod (EXITED); otherwise RunPod restarts the container in place, as it does for
/// every pod, so the uptime goes back and the pod stays RUNNING.
fn process_exit(pod: &mut PodRecord, due: Instant, ev: &mut Events<'_>) {
    let wrapped = pod.args.contains(WRAPPER_MARK);
    match pod.script.exit_code {
        Some(code) if !wrapped => {
            restarted_in_place(pod, code, due, ev);
            for line in pod.script.logs.clone() {
                ev.push(pod, LogSource::Container, line, due);
            }
        }
        code => {
            if wrapped {
                let line = format!("{WRAPPER_MARK}{}", code.unwrap_or(0));
                ev.push(pod, LogSource::Container, line, due);
                ev.system(pod, "Pod stopped by runpodctl", due);
            }
            enter_stopped(pod, PodStatus::Exited, due);
            ev.system(pod, "Container exited", due);
        }
    }
}

fn next_step(pod: &PodRecord, timing: &Timing) -> Option<(Instant, Step)> {
    // A delay too long to represent never elapses.
    let after = |base: Instant, d: Duration, step: Step| base.checked_add(d).map(|at| (at, step));
    let ms = Duration::from_millis;
    match pod.status {
        PodStatus::Provisioning => after(pod.phase_since, timing.provisioning, Step::ToStarting),
        PodStatus::Starting => match pod.script.outcome {
            Some((Outcome::Error, delay)) => after(pod.phase_since, ms(delay), Step::PullFailed),
            _ => after(pod.phase_since, timing.starting, Step::ToRunning),
        },
        PodStatus::Running => {
            let since = pod.running_since.unwrap_or(pod.phase_since);
            let ports = if pod.published.is_none() {
                after(since, timing.ports, Step::PublishPorts)
            } else {
                None
            };
            let exit = match pod.script.outcome {
                Some((Outcome::Exited, delay)) => after(since, ms(delay), Step::Exit),
                _ => None,
            };
            match (ports, exit) {
                (Some(p), Some(e)) => Some(if e.0 < p.0 { e } else { p }),
                (p, e) => p.or(e),
            }
        }
        PodStatus::Exited | PodStatus::Error | PodStatus::Terminated => None,
    }
}

/// One public port per requested port (random 10000–60000, distinct).
fn publish_ports(pod: &mut PodRecord, rng: &mut fastrand::Rng, at: Instant, ev: &mut Events<'_>) {
    let mut published: Vec<PortMapping> = Vec::new();
    for spec in &pod.ports {
        let Some((port, kind)) = parse_port(spec) else {
            continue;
        };
        // 22/tcp with a PUBLIC_KEY: the image's sshd, served for real.
        if port == 22
            && kind == "tcp"
            && let Some(started) = crate::ssh::start(&pod.id, &pod.env, &pod.args, &pod.mounts)
        {
            if let Some(line) = started.log_line {
                ev.push(pod, LogSource::Container, line, at);
            }
            published.push(PortMapping {
                private: port,
                public: started.port,
                kind: kind.to_owned(),
                loopback: true,
            });
            continue;
        }
        // Create and PATCH allow at most MAX_PORTS ports, far fewer than the range holds.
        let mut public = rng.u32(10000..=60000);
        while published.iter().any(|p| p.public == public) {
            public = if public >= 60000 { 10000 } else { public + 1 };
        }
        published.push(PortMapping {
            private: port,
            public,
            kind: kind.to_owned(),
            loopback: false,
        });
    }
    pod.published = Some(published);
}

/// Ports gone (the container stopped or restarts): its sshd goes with them.
pub(crate) fn unpublish(pod: &mut PodRecord) {
    crate::process::stop(&pod.id);
    if pod.published.take().is_some() {
        crate::ssh::stop(&pod.id);
    }
}

/// `"8888/http"` → (8888, "http"); `None` unless the port is 1..=65535 and the protocol is
/// `http` or `tcp`.
pub(crate) fn parse_port(spec: &str) -> Option<(u32, &str)> {
    let (port, kind) = spec.split_once('/')?;
    if !matches!(kind, "http" | "tcp")
        || port.is_empty()
        || !port.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let port: u32 = port.parse().ok()?;
    (1..=65535).contains(&port).then_some((port, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_parse_strictly() {
        assert_eq!(parse_port("8888/http"), Some((8888, "http")));
        assert_eq!(parse_port("22/tcp"), Some((22, "tcp")));
        assert_eq!(parse_port("22/udp"), None);
        assert_eq!(parse_port("0/tcp"), None);
        assert_eq!(parse_port("+1/tcp"), None);
        assert_eq!(parse_port("8888"), None);
    }
}
