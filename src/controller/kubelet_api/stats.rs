//! What the kubelet API serves about usage, from the usage ledger: `/stats/summary` (the
//! kubelet Summary API, `stats.k8s.io/v1alpha1`) and `/metrics/resource` (the Prometheus text
//! metrics-server 0.6+ scrapes). Pure renderers: only pods with a live report appear.

use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::controller::usage::{ContainerUsage, NodeUsage, PodUsage};

/// The content type a kubelet answers `/metrics/resource` with.
pub(crate) const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeStats {
    pub node_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodStats {
    pub pod_ref: PodRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct PodRef {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ContainerStats {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CpuStats {
    pub time: String,
    pub usage_nano_cores: u64,
    pub usage_core_nano_seconds: u64,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MemoryStats {
    pub time: String,
    pub working_set_bytes: u64,
    pub usage_bytes: u64,
}

/// A non-negative figure rounded to an integer; nonsense (NaN, negative) reads as zero.
fn whole(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value.round() as u64
    } else {
        0
    }
}

fn cpu(at: Timestamp, cores: f64, seconds: f64) -> CpuStats {
    CpuStats {
        time: at.to_string(),
        usage_nano_cores: whole(cores * 1e9),
        usage_core_nano_seconds: whole(seconds * 1e9),
    }
}

fn memory(at: Timestamp, bytes: f64) -> MemoryStats {
    MemoryStats {
        time: at.to_string(),
        working_set_bytes: whole(bytes),
        usage_bytes: whole(bytes),
    }
}

fn container_stats(at: Timestamp, container: &ContainerUsage) -> ContainerStats {
    ContainerStats {
        name: container.name.clone(),
        start_time: container.start_time.map(|t| t.to_string()),
        cpu: container
            .cpu_cores
            .map(|cores| cpu(at, cores, container.cpu_seconds)),
        memory: container.memory_bytes.map(|bytes| memory(at, bytes)),
    }
}

/// Sums of a pod's containers; `None` when no container has the figure.
fn pod_totals(pod: &PodUsage) -> (Option<f64>, f64, Option<f64>) {
    let cores = pod.containers.iter().filter_map(|c| c.cpu_cores);
    let cores = cores.clone().next().map(|_| cores.sum::<f64>());
    let seconds = pod.containers.iter().map(|c| c.cpu_seconds).sum();
    let bytes = pod.containers.iter().filter_map(|c| c.memory_bytes);
    let bytes = bytes.clone().next().map(|_| bytes.sum::<f64>());
    (cores, seconds, bytes)
}

/// The Summary API document for `node_name`.
pub(crate) fn summary(node_name: &str, node: Option<NodeUsage>, pods: &[&PodUsage]) -> Summary {
    Summary {
        node: NodeStats {
            node_name: node_name.to_owned(),
            cpu: node.map(|n| cpu(n.at, n.cpu_cores, n.cpu_seconds)),
            memory: node.map(|n| memory(n.at, n.memory_bytes)),
        },
        pods: pods
            .iter()
            .map(|pod| {
                let (cores, seconds, bytes) = pod_totals(pod);
                PodStats {
                    pod_ref: PodRef {
                        name: pod.name.clone(),
                        namespace: pod.namespace.clone(),
                        uid: pod.uid.clone(),
                    },
                    start_time: pod.start_time.map(|t| t.to_string()),
                    containers: pod
                        .containers
                        .iter()
                        .map(|c| container_stats(pod.at, c))
                        .collect(),
                    cpu: cores.map(|cores| cpu(pod.at, cores, seconds)),
                    memory: bytes.map(|bytes| memory(pod.at, bytes)),
                }
            })
            .collect(),
    }
}

/// A label value escaped for the text format.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('"', "\\\"")
}

/// Milliseconds since the epoch, the text format's sample timestamp.
fn millis(at: Timestamp) -> i64 {
    at.as_millisecond()
}

/// One metric family: its HELP and TYPE lines and samples (labels, value, time).
struct Family<'a> {
    name: &'a str,
    help: &'a str,
    kind: &'a str,
    samples: Vec<(String, f64, Timestamp)>,
}

impl Family<'_> {
    fn write(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (labels, value, at) in &self.samples {
            let _ = writeln!(out, "{}{labels} {value} {}", self.name, millis(*at));
        }
    }
}

fn pod_labels(pod: &PodUsage) -> String {
    format!(
        "{{namespace=\"{}\",pod=\"{}\"}}",
        escape(&pod.namespace),
        escape(&pod.name)
    )
}

fn container_labels(pod: &PodUsage, container: &ContainerUsage) -> String {
    format!(
        "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
        escape(&container.name),
        escape(&pod.namespace),
        escape(&pod.name)
    )
}

/// The `/metrics/resource` text: the series a kubelet serves and metrics-server reads, each
/// sample stamped with the list it came from.
pub(crate) fn resource_metrics(node: Option<NodeUsage>, pods: &[&PodUsage]) -> String {
    let containers = || {
        pods.iter()
            .flat_map(|pod| pod.containers.iter().map(move |c| (*pod, c)))
    };
    let families = [
        Family {
            name: "container_cpu_usage_seconds_total",
            help: "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
            kind: "counter",
            samples: containers()
                .filter(|(_, c)| c.cpu_cores.is_some())
                .map(|(p, c)| (container_labels(p, c), c.cpu_seconds, p.at))
                .collect(),
        },
        Family {
            name: "container_memory_working_set_bytes",
            help: "[STABLE] Current working set of the container in bytes",
            kind: "gauge",
            samples: containers()
                .filter_map(|(p, c)| Some((container_labels(p, c), c.memory_bytes?, p.at)))
                .collect(),
        },
        Family {
            name: "container_start_time_seconds",
            help: "[STABLE] Start time of the container since unix epoch in seconds",
            kind: "gauge",
            samples: containers()
                .filter_map(|(p, c)| {
                    let start = c.start_time?;
                    Some((container_labels(p, c), start.as_second() as f64, p.at))
                })
                .collect(),
        },
        Family {
            name: "node_cpu_usage_seconds_total",
            help: "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
            kind: "counter",
            samples: node
                .map(|n| (String::new(), n.cpu_seconds, n.at))
                .into_iter()
                .collect(),
        },
        Family {
            name: "node_memory_working_set_bytes",
            help: "[STABLE] Current working set of the node in bytes",
            kind: "gauge",
            samples: node
                .map(|n| (String::new(), n.memory_bytes, n.at))
                .into_iter()
                .collect(),
        },
        Family {
            name: "pod_cpu_usage_seconds_total",
            help: "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
            kind: "counter",
            samples: pods
                .iter()
                .filter_map(|p| {
                    let (cores, seconds, _) = pod_totals(p);
                    cores.map(|_| (pod_labels(p), seconds, p.at))
                })
                .collect(),
        },
        Family {
            name: "pod_memory_working_set_bytes",
            help: "[STABLE] Current working set of the pod in bytes",
            kind: "gauge",
            samples: pods
                .iter()
                .filter_map(|p| {
                    let (_, _, bytes) = pod_totals(p);
                    bytes.map(|bytes| (pod_labels(p), bytes, p.at))
                })
                .collect(),
        },
    ];
    let mut out = String::new();
    for family in &families {
        family.write(&mut out);
    }
    out.push_str("# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n");
    out.push_str("# TYPE scrape_error gauge\nscrape_error 0\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_767_225_600 + seconds).unwrap()
    }

    fn pod() -> PodUsage {
        PodUsage {
            namespace: "ml".into(),
            name: "train\"er".into(),
            uid: "u1".into(),
            start_time: Some(at(-100)),
            at: at(0),
            live: true,
            containers: vec![ContainerUsage {
                name: "main".into(),
                start_time: Some(at(-90)),
                counting_since: at(-90),
                cpu_seconds: 12.5,
                cpu_cores: Some(0.75),
                memory_bytes: Some(1024.0),
            }],
        }
    }

    fn node() -> NodeUsage {
        NodeUsage {
            at: at(0),
            cpu_seconds: 40.0,
            cpu_cores: 0.75,
            memory_bytes: 1024.0,
        }
    }

    #[test]
    fn the_summary_has_the_kubelet_shape() {
        let pod = pod();
        let json = serde_json::to_value(summary("vn", Some(node()), &[&pod])).unwrap();
        let time = "2026-01-01T00:00:00Z";
        assert_eq!(
            json,
            serde_json::json!({
                "node": {"nodeName": "vn",
                    "cpu": {"time": time, "usageNanoCores": 750000000u64, "usageCoreNanoSeconds": 40000000000u64},
                    "memory": {"time": time, "workingSetBytes": 1024, "usageBytes": 1024}},
                "pods": [{
                    "podRef": {"name": "train\"er", "namespace": "ml", "uid": "u1"},
                    "startTime": "2025-12-31T23:58:20Z",
                    "containers": [{"name": "main", "startTime": "2025-12-31T23:58:30Z",
                        "cpu": {"time": time, "usageNanoCores": 750000000u64, "usageCoreNanoSeconds": 12500000000u64},
                        "memory": {"time": time, "workingSetBytes": 1024, "usageBytes": 1024}}],
                    "cpu": {"time": time, "usageNanoCores": 750000000u64, "usageCoreNanoSeconds": 12500000000u64},
                    "memory": {"time": time, "workingSetBytes": 1024, "usageBytes": 1024}
                }]
            })
        );
    }

    #[test]
    fn resource_metrics_carry_every_series_with_labels_and_times() {
        let pod = pod();
        let text = resource_metrics(Some(node()), &[&pod]);
        let stamp = at(0).as_millisecond();
        for line in [
            format!(
                "container_cpu_usage_seconds_total{{container=\"main\",namespace=\"ml\",pod=\"train\\\"er\"}} 12.5 {stamp}"
            ),
            format!(
                "container_memory_working_set_bytes{{container=\"main\",namespace=\"ml\",pod=\"train\\\"er\"}} 1024 {stamp}"
            ),
            format!(
                "container_start_time_seconds{{container=\"main\",namespace=\"ml\",pod=\"train\\\"er\"}} {} {stamp}",
                at(-90).as_second()
            ),
            format!("node_cpu_usage_seconds_total 40 {stamp}"),
            format!("node_memory_working_set_bytes 1024 {stamp}"),
            format!(
                "pod_cpu_usage_seconds_total{{namespace=\"ml\",pod=\"train\\\"er\"}} 12.5 {stamp}"
            ),
            format!(
                "pod_memory_working_set_bytes{{namespace=\"ml\",pod=\"train\\\"er\"}} 1024 {stamp}"
            ),
            "scrape_error 0".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        assert!(text.contains("# TYPE container_cpu_usage_seconds_total counter"));
    }

    #[test]
    fn a_figure_the_cloud_left_out_is_not_shown_as_zero() {
        let mut pod = pod();
        pod.containers[0].memory_bytes = None;
        let text = resource_metrics(None, &[&pod]);
        assert!(
            !text.contains("container_memory_working_set_bytes{"),
            "{text}"
        );
        assert!(!text.contains("pod_memory_working_set_bytes{"), "{text}");
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("node_cpu_usage_seconds_total "))
        );
        let json = serde_json::to_value(summary("vn", None, &[&pod])).unwrap();
        assert!(json["pods"][0]["containers"][0].get("memory").is_none());
        assert!(json["pods"][0].get("memory").is_none());
        assert!(json["node"].get("cpu").is_none());
    }
}
