//! After each complete list: usage into the ledger the kubelet API serves, each pod's GPU and
//! cost series on `/metrics` (an ended pod's removed), idle-GPU spells and their Events, and
//! the longest wait for a cloud instance. The decisions are in `usage`, `idle` and
//! [`pod_figures`]; this is the thin shell that applies them.

use kube::Resource as _;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::controller::cached::{self, CachedPod};
use k8s_openapi::jiff::Timestamp;
use std::borrow::Cow;

use super::Report;
use super::idle::{self, IdleSettings, Spell};
use crate::controller::clock::elapsed;
use crate::controller::context::{Shared, Snapshot};
use crate::controller::metrics::{ControllerMetrics, PodLabels};
use crate::provider::{Instance, InstanceState, Provider};

/// What one pod shows on `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PodFigures {
    pub labels: PodLabels,
    pub gpu_util: Option<f64>,
    pub gpu_memory: Option<f64>,
    pub cost_per_hour: Option<f64>,
}

/// A pod is over once it has succeeded or failed, or is being deleted.
fn ended(pod: &CachedPod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
}

/// The live instance of each pod that has not ended, by pod UID.
pub(crate) fn pairs<'a>(
    snapshot: &'a Snapshot,
    pods: &'a HashMap<String, Arc<CachedPod>>,
) -> Vec<(&'a Arc<CachedPod>, &'a Instance)> {
    snapshot
        .instances
        .iter()
        .filter(|i| i.state.is_live())
        .filter_map(|i| {
            let pod = pods.get(i.tags.pod_uid.as_deref()?)?;
            (!ended(pod)).then_some((pod, i))
        })
        .collect()
}

/// Each pod's series: GPU figures from its live report, cost from its live instance.
pub(crate) fn pod_figures(
    pairs: &[(&Arc<CachedPod>, &Instance)],
    provider: &str,
) -> Vec<PodFigures> {
    pairs
        .iter()
        .map(|(pod, instance)| PodFigures {
            labels: PodLabels {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                pod: pod.metadata.name.clone().unwrap_or_default(),
                provider: provider.to_owned(),
            },
            gpu_util: instance.usage.as_ref().and_then(|u| u.gpu_util()),
            gpu_memory: instance.usage.as_ref().and_then(|u| u.gpu_memory()),
            cost_per_hour: instance.cost_per_hour,
        })
        .collect()
}

/// When the pod's wait on this node began: its `PodScheduled` condition's transition (an
/// offloaded pod waited on its own node first), else its creation.
fn waiting_since(pod: &CachedPod) -> Option<Timestamp> {
    crate::controller::pods::status::scheduled_or_created(&pod.metadata, pod.status.as_ref())
}

/// The longest wait, from scheduling onto the node, of a pod with no running instance yet.
pub(crate) fn longest_wait(
    pods: &HashMap<String, Arc<CachedPod>>,
    snapshot: &Snapshot,
    now: Timestamp,
) -> std::time::Duration {
    let running: HashSet<&str> = snapshot
        .instances
        .iter()
        .filter(|i| i.state == InstanceState::Running)
        .filter_map(|i| i.tags.pod_uid.as_deref())
        .collect();
    pods.iter()
        .filter(|(uid, pod)| !running.contains(uid.as_str()) && !ended(pod))
        .filter(|(_, pod)| {
            // Pods already Running in Kubernetes (a list lagging behind) are not waiting.
            pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running")
        })
        .filter_map(|(_, pod)| waiting_since(pod))
        .map(|since| elapsed(since, now))
        .max()
        .unwrap_or_default()
}

/// Removes the GPU series of `shown` (their cost, a price rather than a report, stays).
fn drop_gpu_series(metrics: &ControllerMetrics, shown: &HashSet<PodLabels>) {
    for labels in shown {
        metrics.pod_gpu_utilization.remove(labels);
        metrics.pod_gpu_memory_utilization.remove(labels);
    }
}

/// State kept between lists by the poller; lost on restart, which restarts idle windows.
#[derive(Debug, Default)]
pub(crate) struct UsageWatch {
    spells: HashMap<String, Spell>,
    shown: HashSet<PodLabels>,
}

impl UsageWatch {
    /// Applies one complete list.
    pub(crate) async fn observe<P: Provider>(
        &mut self,
        shared: &Shared<P>,
        pods: &[Arc<CachedPod>],
        snapshot: &Snapshot,
    ) {
        let by_uid: HashMap<String, Arc<CachedPod>> = pods
            .iter()
            .filter_map(|p| Some((p.metadata.uid.clone()?, p.clone())))
            .collect();
        let pairs = pairs(snapshot, &by_uid);
        let existing: HashSet<String> = by_uid.keys().cloned().collect();
        {
            let mut ledger = shared.usage_ledger();
            ledger.observe(
                snapshot.taken_at,
                // One pod decoded at a time (for its containers), let go once folded in.
                pairs.iter().filter_map(|(pod, instance)| {
                    let usage = instance.usage.as_ref()?;
                    Some(Report {
                        pod: Cow::Owned(cached::decode(pod)?),
                        usage,
                        started_at: instance.started_at,
                    })
                }),
                &existing,
            );
        }
        let figures = pod_figures(&pairs, shared.provider.name());
        self.show(&shared.metrics, &figures);
        self.idle(shared, &pairs, snapshot.taken_at).await;
        shared
            .metrics
            .provisioning_longest_wait
            .set(longest_wait(&by_uid, snapshot, Timestamp::now()).as_secs_f64());
    }

    /// A list failed: no pod has a live report, so the kubelet API leaves every pod out and
    /// the per-pod GPU series go (an HPA must not act on figures frozen by a RunPod outage).
    pub(crate) fn outage<P: Provider>(&mut self, shared: &Shared<P>) {
        shared.usage_ledger().stale();
        drop_gpu_series(&shared.metrics, &self.shown);
    }

    /// Sets each pod's series and removes those of pods no longer shown.
    fn show(&mut self, metrics: &ControllerMetrics, figures: &[PodFigures]) {
        let mut shown = HashSet::new();
        for figure in figures {
            let families = [
                (&metrics.pod_gpu_utilization, figure.gpu_util),
                (&metrics.pod_gpu_memory_utilization, figure.gpu_memory),
                (&metrics.pod_cost_per_hour, figure.cost_per_hour),
            ];
            for (family, value) in families {
                match value {
                    Some(value) => {
                        family.get_or_create(&figure.labels).set(value);
                    }
                    None => {
                        family.remove(&figure.labels);
                    }
                }
            }
            shown.insert(figure.labels.clone());
        }
        for gone in self.shown.difference(&shown) {
            metrics.pod_gpu_utilization.remove(gone);
            metrics.pod_gpu_memory_utilization.remove(gone);
            metrics.pod_cost_per_hour.remove(gone);
        }
        self.shown = shown;
    }

    /// Steps every pod's idle spell; publishes the Events that are due.
    async fn idle<P: Provider>(
        &mut self,
        shared: &Shared<P>,
        pairs: &[(&Arc<CachedPod>, &Instance)],
        now: Timestamp,
    ) {
        let settings: IdleSettings = shared.settings.idle;
        let mut spells = HashMap::new();
        let mut due = Vec::new();
        for (pod, instance) in pairs {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let busiest = instance.usage.as_ref().and_then(|u| u.gpu_busiest());
            let step = idle::step(self.spells.get(&uid).copied(), busiest, now, settings);
            if let Some(idle_for) = step.report {
                due.push((
                    (*pod).clone(),
                    idle::message(idle_for, settings.threshold, instance.cost_per_hour),
                ));
            }
            if let Some(spell) = step.spell {
                spells.insert(uid, spell);
            }
        }
        self.spells = spells;
        let idle = self.spells.values().filter(|s| s.reported).count();
        shared
            .metrics
            .idle_gpu_pods
            .set(i64::try_from(idle).unwrap_or(i64::MAX));
        for (pod, message) in due {
            shared
                .event(&pod.object_ref(&()), true, "GpuIdle", message)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Tags, Usage};
    use serde_json::json;

    fn pod(uid: &str, phase: &str, created: &str) -> Arc<CachedPod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": format!("p-{uid}"), "namespace": "ns", "uid": uid,
                    "creationTimestamp": created},
                "status": {"phase": phase}
            }))
            .unwrap(),
        )
    }

    fn instance(id: &str, uid: &str, state: InstanceState, usage: Option<Usage>) -> Instance {
        Instance {
            ssh: None,
            machine: None,
            disruption: None,
            id: id.into(),
            name: id.into(),
            tags: Tags {
                cluster_id: Some("c".into()),
                node_name: Some("n".into()),
                pod_uid: Some(uid.into()),
            },
            state,
            uptime_secs: None,
            cost_per_hour: Some(0.44),
            gpu_type: None,
            datacenter: None,
            endpoints: vec![],
            ip: None,
            created_at: None,
            started_at: None,
            message: None,
            usage,
        }
    }

    fn snapshot(instances: Vec<Instance>) -> Snapshot {
        Snapshot {
            taken_at: "2026-01-01T01:00:00Z".parse().unwrap(),
            instances,
            confirmed_at: None,
        }
    }

    #[test]
    fn figures_cover_live_pods_only_and_leave_out_unreported_gpus() {
        let gpus = Usage {
            cpu: Some(0.1),
            memory: None,
            gpus: vec![
                crate::provider::GpuUsage {
                    util: Some(0.2),
                    memory: Some(0.5),
                },
                crate::provider::GpuUsage {
                    util: Some(0.6),
                    memory: None,
                },
            ],
        };
        let pods: HashMap<String, Arc<CachedPod>> = [
            ("a".to_owned(), pod("a", "Running", "2026-01-01T00:00:00Z")),
            ("b".to_owned(), pod("b", "Running", "2026-01-01T00:00:00Z")),
            (
                "c".to_owned(),
                pod("c", "Succeeded", "2026-01-01T00:00:00Z"),
            ),
        ]
        .into();
        let snapshot = snapshot(vec![
            instance("i-a", "a", InstanceState::Running, Some(gpus)),
            instance("i-b", "b", InstanceState::Starting, None),
            instance("i-c", "c", InstanceState::Running, Some(Usage::default())),
            instance("i-x", "unknown", InstanceState::Running, None),
        ]);
        let mut figures = pod_figures(&pairs(&snapshot, &pods), "runpod");
        figures.sort_by(|x, y| x.labels.pod.cmp(&y.labels.pod));
        assert_eq!(figures.len(), 2, "{figures:?}");
        assert_eq!(figures[0].labels.pod, "p-a");
        assert_eq!(figures[0].labels.provider, "runpod");
        assert!((figures[0].gpu_util.unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(figures[0].gpu_memory, Some(0.5));
        assert_eq!(figures[1].gpu_util, None, "no report: no figure");
        assert_eq!(figures[1].cost_per_hour, Some(0.44));
    }

    #[test]
    fn the_longest_wait_counts_pods_without_a_running_instance() {
        let now: Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let pods: HashMap<String, Arc<CachedPod>> = [
            (
                "run".to_owned(),
                pod("run", "Running", "2026-01-01T00:00:00Z"),
            ),
            (
                "wait".to_owned(),
                pod("wait", "Pending", "2026-01-01T00:50:00Z"),
            ),
            (
                "old".to_owned(),
                pod("old", "Pending", "2026-01-01T00:30:00Z"),
            ),
            (
                "done".to_owned(),
                pod("done", "Failed", "2026-01-01T00:00:00Z"),
            ),
        ]
        .into();
        let snapshot = snapshot(vec![
            instance("i-run", "run", InstanceState::Running, None),
            instance("i-old", "old", InstanceState::Running, None),
        ]);
        assert_eq!(
            longest_wait(&pods, &snapshot, now),
            std::time::Duration::from_secs(600)
        );
        // An offloaded pod, created an hour ago, waited on its own node until bound here 2
        // minutes ago: its wait here is 2 minutes.
        let mut offloaded: CachedPod = (*pod("moved", "Pending", "2026-01-01T00:00:00Z")).clone();
        offloaded.status.as_mut().unwrap().conditions = Some(
            serde_json::from_value(json!([{"type": "PodScheduled", "status": "True",
                "lastTransitionTime": "2026-01-01T00:58:00Z"}]))
            .unwrap(),
        );
        let moved: HashMap<String, Arc<CachedPod>> =
            [("moved".to_owned(), Arc::new(offloaded))].into();
        assert_eq!(
            longest_wait(&moved, &snapshot, now),
            std::time::Duration::from_secs(120)
        );
        assert_eq!(
            longest_wait(&HashMap::new(), &snapshot, now),
            std::time::Duration::ZERO
        );
    }

    #[test]
    fn an_ended_pods_series_are_removed() {
        let metrics = ControllerMetrics::default();
        let mut watch = UsageWatch::default();
        let figure = |pod: &str| PodFigures {
            labels: PodLabels {
                namespace: "ns".into(),
                pod: pod.into(),
                provider: "runpod".into(),
            },
            gpu_util: Some(0.5),
            gpu_memory: Some(0.25),
            cost_per_hour: Some(0.44),
        };
        let count = |metrics: &ControllerMetrics| {
            let mut registry = prometheus_client::registry::Registry::default();
            registry.register("u", "", metrics.pod_gpu_utilization.clone());
            registry.register("m", "", metrics.pod_gpu_memory_utilization.clone());
            registry.register("c", "", metrics.pod_cost_per_hour.clone());
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text.lines().filter(|l| !l.starts_with('#')).count()
        };
        watch.show(&metrics, &[figure("a"), figure("b")]);
        assert_eq!(count(&metrics), 6);
        // A failed list: the GPU series go, the prices stay.
        drop_gpu_series(&metrics, &watch.shown);
        assert_eq!(count(&metrics), 2);
        watch.show(&metrics, &[figure("a"), figure("b")]);
        assert_eq!(count(&metrics), 6);
        watch.show(&metrics, &[figure("b")]);
        assert_eq!(count(&metrics), 3);
        watch.show(&metrics, &[]);
        assert_eq!(count(&metrics), 0);
    }
}
