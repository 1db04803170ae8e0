//! CPU and memory usage of burst pods, from the cloud's shares. A cloud reports what share of
//! its CPU and memory a pod uses, not amounts, so usage is that share of what the container
//! asked for: CPU share × the CPU request (else the limit, else 1 core), memory share × the
//! memory request (else the limit; no figure without either). Cumulative CPU seconds are the
//! integral of that usage over the lists, kept per container and never going back. Pure: the
//! poller folds each list in, the kubelet API reads the result.

pub mod idle;
pub(crate) mod watch;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;

use crate::provider::Usage;

/// Why a quantity could not be read.
/// What one container asked for, the base its usage share applies to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Asked {
    pub cpu_cores: f64,
    /// `None`: neither a request nor a limit, so no memory figure can be derived.
    pub memory_bytes: Option<f64>,
}

/// CPU request, else limit, else 1 core; memory request, else limit.
pub fn asked(container: &Container) -> Asked {
    Asked {
        cpu_cores: runpod_contract::quantity::requested(container, "cpu").unwrap_or(1.0),
        memory_bytes: runpod_contract::quantity::requested(container, "memory"),
    }
}

/// One container's usage at one list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContainerSample {
    pub cpu_cores: Option<f64>,
    pub memory_bytes: Option<f64>,
}

/// The share of `asked` that `usage` reports; a figure the cloud left out stays out.
pub fn scale(asked: Asked, usage: &Usage) -> ContainerSample {
    ContainerSample {
        cpu_cores: usage.cpu.map(|share| share * asked.cpu_cores),
        memory_bytes: usage
            .memory
            .zip(asked.memory_bytes)
            .map(|(share, bytes)| share * bytes),
    }
}

/// A container's running totals.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerUsage {
    pub name: String,
    /// The later of the container's real start and this process's first report of it: the
    /// CPU count starts then, so a new controller process (whose count starts at 0) reports a
    /// new start, which metrics-server and Prometheus read as a new container, not as a
    /// cumulative counter going back.
    pub start_time: Option<Timestamp>,
    /// When this process first had a report of the container.
    pub counting_since: Timestamp,
    /// Integrated CPU core-seconds since this controller first saw the container report.
    pub cpu_seconds: f64,
    pub cpu_cores: Option<f64>,
    pub memory_bytes: Option<f64>,
}

/// The start time a container's CPU count is reported against: its real start, unless this
/// process began counting later.
fn counted_from(start: Option<Timestamp>, counting_since: Timestamp) -> Timestamp {
    start.map_or(counting_since, |start| start.max(counting_since))
}

/// A pod's latest report and totals.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUsage {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub start_time: Option<Timestamp>,
    /// When the list this report came from was asked for.
    pub at: Timestamp,
    /// Whether the latest list carried a live report; only such pods are shown.
    pub live: bool,
    pub containers: Vec<ContainerUsage>,
}

/// One pod's report in a list: the Kubernetes pod, the cloud's shares, and when its instance
/// started (a fallback for the start times Kubernetes does not have yet).
pub struct Report<'a> {
    /// Decoded for the report where the pod comes from the cache (which keeps its spec as
    /// text), borrowed otherwise.
    pub pod: Cow<'a, Pod>,
    pub usage: &'a Usage,
    pub started_at: Option<Timestamp>,
}

/// Usage of every pod seen with a report, folded in list by list.
#[derive(Debug, Default)]
pub struct UsageLedger {
    pods: HashMap<String, PodUsage>,
    /// The node's integrated CPU seconds: the sum of every container's increments, so it never
    /// goes back when a pod ends.
    node_cpu_seconds: f64,
    /// When the last list was folded in.
    last_list: Option<Timestamp>,
}

/// The node's totals: CPU seconds of every pod ever reported, memory of those live now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeUsage {
    pub at: Timestamp,
    pub cpu_seconds: f64,
    pub cpu_cores: f64,
    pub memory_bytes: f64,
}

impl UsageLedger {
    /// Folds in one list taken at `at`: pods with a report get a new sample (CPU seconds grow
    /// by the reported usage over the time since their previous sample), the others are marked
    /// not live, and pods in none of `existing` (deleted from the cluster) are forgotten.
    pub fn observe<'a>(
        &mut self,
        at: Timestamp,
        reports: impl IntoIterator<Item = Report<'a>>,
        existing: &HashSet<String>,
    ) {
        self.pods.retain(|uid, _| existing.contains(uid));
        let was_live: HashSet<String> = self
            .pods
            .values()
            .filter(|p| p.live)
            .map(|p| p.uid.clone())
            .collect();
        self.stale();
        for report in reports {
            let Some(uid) = report.pod.metadata.uid.clone() else {
                continue;
            };
            let increment = self.fold(&uid, at, &report, was_live.contains(&uid));
            self.node_cpu_seconds += increment;
        }
        self.last_list = Some(at);
    }

    /// A list failed: no pod has a live report any more, so every pod is left out until a
    /// list carries its report again (a RunPod outage must not serve old figures as live).
    pub fn stale(&mut self) {
        for pod in self.pods.values_mut() {
            pod.live = false;
        }
    }

    /// Updates one pod; returns the CPU seconds it added. A pod that was not live in the
    /// previous list restarts its integration: nothing is known of the gap, so nothing is
    /// added for it.
    fn fold(&mut self, uid: &str, at: Timestamp, report: &Report<'_>, was_live: bool) -> f64 {
        let pod = &*report.pod;
        let status = pod.status.as_ref();
        let start_time = status
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
            .or(report.started_at);
        let entry = self.pods.entry(uid.to_owned()).or_insert_with(|| PodUsage {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_owned(),
            start_time,
            at,
            live: true,
            containers: Vec::new(),
        });
        let seconds = if was_live {
            crate::controller::clock::elapsed(entry.at, at).as_secs_f64()
        } else {
            0.0
        };
        // A clock that goes back must not move the base back (the next sample would count
        // the same time twice).
        entry.at = entry.at.max(at);
        entry.live = true;
        entry.start_time = start_time.or(entry.start_time);
        let mut added = 0.0;
        let containers = pod.spec.as_ref().map_or(&[][..], |s| &s.containers[..]);
        for container in containers {
            let sample = scale(asked(container), report.usage);
            let container_start = status
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|statuses| statuses.iter().find(|c| c.name == container.name))
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.as_ref())
                .map(|t| t.0)
                .or(start_time);
            match entry
                .containers
                .iter_mut()
                .find(|c| c.name == container.name)
            {
                Some(known) => {
                    let increment = sample.cpu_cores.unwrap_or(0.0) * seconds;
                    known.cpu_seconds += increment;
                    added += increment;
                    known.cpu_cores = sample.cpu_cores;
                    known.memory_bytes = sample.memory_bytes;
                    known.start_time = Some(counted_from(container_start, known.counting_since));
                }
                // The first report starts the count: nothing is known of the time before.
                None => entry.containers.push(ContainerUsage {
                    name: container.name.clone(),
                    start_time: Some(counted_from(container_start, at)),
                    counting_since: at,
                    cpu_seconds: 0.0,
                    cpu_cores: sample.cpu_cores,
                    memory_bytes: sample.memory_bytes,
                }),
            }
        }
        added
    }

    /// Pods whose latest list carried a report, by namespace and name.
    pub fn live(&self) -> Vec<&PodUsage> {
        let mut pods: Vec<&PodUsage> = self.pods.values().filter(|p| p.live).collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }

    /// The node's totals as of the last list; `None` before the first one.
    pub fn node(&self) -> Option<NodeUsage> {
        let at = self.last_list?;
        let live = self.live();
        let containers = live.iter().flat_map(|p| &p.containers);
        Some(NodeUsage {
            at,
            cpu_seconds: self.node_cpu_seconds,
            cpu_cores: containers.clone().filter_map(|c| c.cpu_cores).sum(),
            memory_bytes: containers.filter_map(|c| c.memory_bytes).sum(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container(resources: serde_json::Value) -> Container {
        serde_json::from_value(json!({"name": "main", "resources": resources})).unwrap()
    }

    #[test]
    fn the_share_applies_to_the_request_else_the_limit_else_one_core() {
        let usage = Usage {
            cpu: Some(0.5),
            memory: Some(0.25),
            gpus: vec![],
        };
        let cases = [
            (
                json!({"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}),
                Some(1.0),
                Some(1073741824.0),
            ),
            (
                json!({"limits": {"cpu": "500m", "memory": "1Gi"}}),
                Some(0.25),
                Some(268435456.0),
            ),
            (json!({}), Some(0.5), None),
            (json!({"requests": {"cpu": "garbage"}}), Some(0.5), None),
        ];
        for (resources, cpu, memory) in cases {
            let sample = scale(asked(&container(resources.clone())), &usage);
            assert_eq!(sample.cpu_cores, cpu, "{resources}");
            assert_eq!(sample.memory_bytes, memory, "{resources}");
        }
        let silent = scale(asked(&container(json!({}))), &Usage::default());
        assert_eq!(silent.cpu_cores, None, "no report, no figure");
    }

    fn pod(uid: &str, cpu: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{uid}"), "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "main",
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]},
            "status": {"startTime": "2026-01-01T00:00:00Z"}
        }))
        .unwrap()
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_767_225_600 + seconds).unwrap()
    }

    fn share(cpu: f64) -> Usage {
        Usage {
            cpu: Some(cpu),
            memory: Some(0.5),
            gpus: vec![],
        }
    }

    #[test]
    fn cpu_seconds_integrate_the_usage_and_never_go_back() {
        let a = pod("a", "2");
        let b = pod("b", "1");
        let existing: HashSet<String> = ["a".into(), "b".into()].into();
        let mut ledger = UsageLedger::default();
        let report = |pod, usage| Report {
            pod: Cow::Borrowed(pod),
            usage,
            started_at: None,
        };
        let busy = share(0.5);
        let idle = share(0.0);
        ledger.observe(at(0), [report(&a, &busy), report(&b, &busy)], &existing);
        ledger.observe(at(10), [report(&a, &busy), report(&b, &busy)], &existing);
        let live = ledger.live();
        assert_eq!(live.len(), 2);
        // 0.5 × 2 cores for 10 s.
        assert_eq!(live[0].containers[0].cpu_seconds, 10.0);
        assert_eq!(live[0].containers[0].cpu_cores, Some(1.0));
        assert_eq!(live[0].containers[0].memory_bytes, Some(536870912.0));
        assert_eq!(live[1].containers[0].cpu_seconds, 5.0);
        assert_eq!(ledger.node().unwrap().cpu_seconds, 15.0);

        // `b` has no report in this list: left out, never shown as zero.
        ledger.observe(at(20), [report(&a, &idle)], &existing);
        let live = ledger.live();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].uid, "a");
        assert_eq!(live[0].containers[0].cpu_seconds, 10.0, "idle adds nothing");

        // `b` is deleted: forgotten; the node's total keeps what it used.
        let only_a: HashSet<String> = ["a".into()].into();
        ledger.observe(at(30), [report(&a, &busy)], &only_a);
        assert_eq!(ledger.live().len(), 1);
        let node = ledger.node().unwrap();
        assert_eq!(node.cpu_seconds, 25.0);
        assert_eq!(node.cpu_cores, 1.0);

        // A clock that goes back adds nothing and takes nothing away.
        ledger.observe(at(5), [report(&a, &busy)], &only_a);
        assert_eq!(ledger.live()[0].containers[0].cpu_seconds, 20.0);
    }

    #[test]
    fn a_failed_list_leaves_every_pod_out_and_a_gap_adds_nothing() {
        let a = pod("a", "2");
        let existing: HashSet<String> = ["a".into()].into();
        let busy = share(0.5);
        let report = || Report {
            pod: Cow::Borrowed(&a),
            usage: &busy,
            started_at: None,
        };
        let mut ledger = UsageLedger::default();
        ledger.observe(at(0), [report()], &existing);
        ledger.observe(at(10), [report()], &existing);
        assert_eq!(ledger.live()[0].containers[0].cpu_seconds, 10.0);

        // RunPod is down: the lists fail, the old report is not served as live.
        ledger.stale();
        assert!(ledger.live().is_empty());
        assert_eq!(ledger.node().unwrap().cpu_cores, 0.0);

        // Back 10 minutes later: the count restarts, it does not jump by 600 s.
        ledger.observe(at(610), [report()], &existing);
        assert_eq!(ledger.live()[0].containers[0].cpu_seconds, 10.0);
        assert_eq!(ledger.node().unwrap().cpu_seconds, 10.0);
        ledger.observe(at(620), [report()], &existing);
        assert_eq!(ledger.live()[0].containers[0].cpu_seconds, 20.0);

        // A pod missing from one list restarts as well.
        ledger.observe(at(630), [], &existing);
        ledger.observe(at(1230), [report()], &existing);
        assert_eq!(ledger.live()[0].containers[0].cpu_seconds, 20.0);

        // A clock that goes back keeps the later base: no time counted twice.
        ledger.observe(at(1200), [report()], &existing);
        ledger.observe(at(1240), [report()], &existing);
        assert_eq!(ledger.live()[0].containers[0].cpu_seconds, 30.0);
    }

    #[test]
    fn start_times_come_from_kubernetes_else_the_instance() {
        let mut bare = pod("c", "1");
        bare.status = None;
        let usage = share(0.1);
        let mut ledger = UsageLedger::default();
        ledger.observe(
            at(0),
            [Report {
                pod: Cow::Borrowed(&bare),
                usage: &usage,
                started_at: Some(at(-60)),
            }],
            &["c".to_owned()].into(),
        );
        let live = ledger.live();
        assert_eq!(live[0].start_time, Some(at(-60)));
        // The CPU count starts with this process's first report: that is the container's
        // start as far as a cumulative counter goes (a restarted controller is a new start,
        // never a counter going back).
        assert_eq!(live[0].containers[0].start_time, Some(at(0)));
        ledger.observe(
            at(10),
            [Report {
                pod: Cow::Borrowed(&bare),
                usage: &usage,
                started_at: Some(at(-60)),
            }],
            &["c".to_owned()].into(),
        );
        assert_eq!(ledger.live()[0].containers[0].start_time, Some(at(0)));
        assert_eq!(
            counted_from(Some(at(50)), at(0)),
            at(50),
            "a later real start"
        );
        assert!(UsageLedger::default().node().is_none());
    }
}
