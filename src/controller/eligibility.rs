//! Which pods bound to the virtual node the controller runs. A pod can reach the node without
//! the webhook (`spec.nodeName`, a RuntimeClass, a toleration of every taint), so money is only
//! spent on pods that pass the webhook's own opt-in rule and the checks it can repeat here:
//! what RunPod can run (one container, no init containers, supported volumes) and this
//! cluster's policy (datacenters, price cap).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use runpod_contract as contract;
use runpod_contract::checks::gpu_count;
use runpod_contract::config::PolicyConfig;
use runpod_contract::pod::PodView;
use runpod_contract::policy::{self, Untouched};
use runpod_contract::teams::WRONG_NODE;

use crate::provider::CloudName;

/// Why the controller will not run a pod, for its Event and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The Event's and the status's reason.
    pub reason: &'static str,
    pub message: String,
    /// Fail the pod (its owner learns at once) rather than leave it Pending with the reason:
    /// only where no controller would re-create it in a loop.
    pub fail: bool,
}

/// A verdict as this leader took it, with what it depended on that can change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub refusal: Option<Refusal>,
    /// The pod's `runpod.io/burst` label then.
    pub label: Option<String>,
    pub at: Timestamp,
}

/// How long a "not opted in" verdict stands before the namespace's labels are read again
/// (a pod's own label is compared at every reconcile).
pub(crate) const NOT_OPTED_IN_RECHECK: Duration = Duration::from_secs(60);

impl Judged {
    /// Whether the verdict still applies: the pod's opt-in label is unchanged and, for a pod
    /// that did not opt in, its namespace was read recently enough (a user may opt in later;
    /// what a pod is does not change).
    pub fn still_holds(&self, label: Option<&str>, now: Timestamp) -> bool {
        if self.label.as_deref() != label {
            return false;
        }
        match &self.refusal {
            // Labels (opt-in, the node binding) can change: read them again now and then, for
            // a pod allowed to start too (its namespace may have moved to another node).
            Some(refusal) if refusal.reason != NOT_OPTED_IN && refusal.reason != WRONG_NODE => true,
            _ => Duration::try_from(now.duration_since(self.at))
                .is_ok_and(|age| age < NOT_OPTED_IN_RECHECK),
        }
    }
}

const NOT_OPTED_IN: &str = "NotOptedIn";

/// Owners that replace a failed pod at once: failing their pods would only churn.
const RECREATING_OWNERS: [&str; 4] = [
    "ReplicaSet",
    "DaemonSet",
    "StatefulSet",
    "ReplicationController",
];

/// Whether the pod needs its namespace's labels to be judged (it does not opt in itself).
pub(crate) fn needs_namespace_labels(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(contract::BURST_LABEL))
        .is_none_or(|value| value != contract::BURST_ENABLED)
}

/// A refusal because the pod's namespace is bound to another node.
fn wrong_node(message: String) -> Refusal {
    Refusal {
        reason: WRONG_NODE,
        message,
        fail: false,
    }
}

/// Why the controller must not create anything for `pod`, if it must not. A pod whose
/// namespace is bound to another node (`why_not_here`) is refused `WrongNode` before anything
/// but the reasons that say the node is not for it at all (not a GPU pod, not opted in).
pub(crate) fn refusal(
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
    policy: &PolicyConfig,
    cloud: CloudName,
    why_not_here: Option<String>,
) -> Option<Refusal> {
    let owner_kinds: Vec<&str> = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|owner| owner.kind.as_str())
        .collect();
    let recreated = owner_kinds
        .iter()
        .any(|kind| RECREATING_OWNERS.contains(kind));
    if owner_kinds.contains(&"DaemonSet") {
        return Some(Refusal {
            reason: "NotRunOnRunPod",
            message: format!("DaemonSet pods are not run on {}", cloud.title),
            fail: false,
        });
    }
    if gpu_count(pod) == 0 {
        return Some(Refusal {
            reason: "NotRunOnRunPod",
            message: format!(
                "the pod requests no {}: only GPU pods are run on {}",
                contract::GPU_RESOURCE,
                cloud.title
            ),
            fail: false,
        });
    }
    let view = match serde_json::to_value(pod).and_then(serde_json::from_value::<PodView>) {
        Ok(view) => view,
        Err(error) => {
            return Some(why_not_here.map(wrong_node).unwrap_or(Refusal {
                reason: "CannotRunOnRunPod",
                message: format!("the pod could not be read: {error}"),
                fail: false,
            }));
        }
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    if let Err(why) = policy::opt_in(&view, namespace, namespace_labels, policy) {
        let message = match why {
            Untouched::OptedOut => format!(
                "the pod has label {}={}",
                contract::BURST_LABEL,
                contract::BURST_DISABLED
            ),
            Untouched::ExcludedNamespace => {
                format!("namespace {namespace} is excluded from bursting")
            }
            _ => format!(
                "neither the pod nor namespace {namespace} has label {}={}",
                contract::BURST_LABEL,
                contract::BURST_ENABLED
            ),
        };
        return Some(Refusal {
            reason: NOT_OPTED_IN,
            message: format!("not run on {}: {message}", cloud.title),
            fail: false,
        });
    }
    if let Some(message) = why_not_here {
        return Some(wrong_node(message));
    }
    let problems = policy::cannot_run(&view, policy);
    if !problems.is_empty() {
        return Some(Refusal {
            reason: "CannotRunOnRunPod",
            message: format!(
                "{} cannot run this pod: {}",
                cloud.title,
                problems.join("; ")
            ),
            fail: !recreated,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy() -> PolicyConfig {
        PolicyConfig::from_flags(&[], &["EU-RO-1".into()], 0.5, Some("runpod-system".into()))
    }

    fn pod(extra: serde_json::Value) -> Pod {
        let mut base = json!({
            "metadata": {"name": "p", "namespace": "team"},
            "spec": {"containers": [{"name": "c", "image": "i", "command": ["run"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        });
        merge(&mut base, extra);
        serde_json::from_value(base).unwrap()
    }

    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        match (base, extra) {
            (serde_json::Value::Object(base), serde_json::Value::Object(extra)) => {
                for (key, value) in extra {
                    merge(base.entry(key).or_insert(serde_json::Value::Null), value);
                }
            }
            (base, extra) => *base = extra,
        }
    }

    fn enabled() -> BTreeMap<String, String> {
        [("runpod.io/burst".to_owned(), "enabled".to_owned())].into()
    }

    fn reason(refusal: Option<Refusal>) -> Option<(&'static str, bool)> {
        refusal.map(|r| (r.reason, r.fail))
    }

    #[test]
    fn each_rule_decides_with_its_reason() {
        let none = BTreeMap::new();
        let on = enabled();
        let owned_by = |kind: &str| {
            json!({"metadata": {"ownerReferences": [
                {"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u"}]}})
        };
        type Case<'a> = (
            &'a str,
            Pod,
            &'a BTreeMap<String, String>,
            Option<(&'a str, bool)>,
        );
        let cases: Vec<Case<'_>> = vec![
            ("opted-in namespace", pod(json!({})), &on, None),
            (
                "pod label opts in anywhere",
                pod(json!({"metadata": {"labels": {"runpod.io/burst": "enabled"}}})),
                &none,
                None,
            ),
            (
                "bound by nodeName from a namespace that never opted in",
                pod(json!({})),
                &none,
                Some(("NotOptedIn", false)),
            ),
            (
                "pod opted out in an opted-in namespace",
                pod(json!({"metadata": {"labels": {"runpod.io/burst": "disabled"}}})),
                &on,
                Some(("NotOptedIn", false)),
            ),
            (
                "kube-system, even labelled",
                pod(json!({"metadata": {"namespace": "kube-system",
                    "labels": {"runpod.io/burst": "enabled"}}})),
                &on,
                Some(("NotOptedIn", false)),
            ),
            (
                "the controller's own namespace",
                pod(json!({"metadata": {"namespace": "runpod-system"}})),
                &on,
                Some(("NotOptedIn", false)),
            ),
            (
                "a CPU pod tolerating every taint",
                pod(
                    json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {}}]}}),
                ),
                &on,
                Some(("NotRunOnRunPod", false)),
            ),
            (
                "a DaemonSet pod",
                pod(owned_by("DaemonSet")),
                &on,
                Some(("NotRunOnRunPod", false)),
            ),
            (
                "init containers: fails fast",
                pod(json!({"spec": {"initContainers": [{"name": "i", "image": "busybox"}]}})),
                &on,
                Some(("CannotRunOnRunPod", true)),
            ),
            (
                "a hostPath volume: fails fast",
                pod(json!({"spec": {"volumes": [{"name": "v", "hostPath": {"path": "/x"}}]}})),
                &on,
                Some(("CannotRunOnRunPod", true)),
            ),
            (
                "an NFS volume in a ReplicaSet pod: kept Pending, no churn",
                {
                    let mut p = pod(json!({"spec": {"volumes": [{"name": "v",
                        "nfs": {"server": "s", "path": "/"}}]}}));
                    p.metadata.owner_references =
                        pod(owned_by("ReplicaSet")).metadata.owner_references;
                    p
                },
                &on,
                Some(("CannotRunOnRunPod", false)),
            ),
            (
                "a forbidden datacenter",
                pod(json!({"metadata": {"annotations": {"runpod.io/datacenter-ids": "US-TX-3"}}})),
                &on,
                Some(("CannotRunOnRunPod", true)),
            ),
            (
                "a price above the cap",
                pod(json!({"metadata": {"annotations": {"runpod.io/max-price": "3"}}})),
                &on,
                Some(("CannotRunOnRunPod", true)),
            ),
        ];
        for (name, pod, labels, expected) in cases {
            assert_eq!(
                reason(refusal(&pod, labels, &policy(), CloudName::RUNPOD, None)),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn messages_say_what_to_change() {
        let refused = refusal(
            &pod(json!({})),
            &BTreeMap::new(),
            &policy(),
            CloudName::RUNPOD,
            None,
        )
        .unwrap();
        assert!(
            refused.message.contains("namespace team")
                && refused.message.contains("runpod.io/burst=enabled"),
            "{}",
            refused.message
        );
        let refused = refusal(
            &pod(json!({"metadata": {"annotations": {"runpod.io/datacenter-ids": "US-TX-3"}}})),
            &enabled(),
            &policy(),
            CloudName::RUNPOD,
            None,
        )
        .unwrap();
        assert!(refused.message.contains("US-TX-3") && refused.message.contains("EU-RO-1"));
    }

    #[test]
    fn a_not_opted_in_verdict_is_taken_again_when_the_pod_or_time_says_so() {
        let at: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let later = |secs: i64| {
            at.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
                .unwrap()
        };
        let not_opted_in = Judged {
            refusal: refusal(
                &pod(json!({})),
                &BTreeMap::new(),
                &policy(),
                CloudName::RUNPOD,
                None,
            ),
            label: None,
            at,
        };
        assert!(not_opted_in.still_holds(None, later(10)));
        assert!(
            !not_opted_in.still_holds(Some("enabled"), later(10)),
            "the pod opted in"
        );
        assert!(
            !not_opted_in.still_holds(None, later(61)),
            "the namespace may have"
        );
        let cannot = Judged {
            refusal: refusal(
                &pod(json!({"spec": {"initContainers": [{"name": "i", "image": "b"}]}})),
                &enabled(),
                &policy(),
                CloudName::RUNPOD,
                None,
            ),
            label: None,
            at,
        };
        assert!(
            cannot.still_holds(None, later(3600)),
            "what a pod is does not change"
        );
        let allowed = Judged {
            refusal: None,
            label: None,
            at,
        };
        assert!(allowed.still_holds(None, later(10)));
        assert!(
            !allowed.still_holds(None, later(61)),
            "its namespace may have been bound to another node"
        );
    }

    #[test]
    fn a_pod_bound_elsewhere_is_refused_before_what_it_could_run() {
        let elsewhere = || Some("namespace team is bound to node b".to_owned());
        let cannot = pod(json!({"spec": {"initContainers": [{"name": "i", "image": "b"}]}}));
        let judge = |pod: &Pod, labels: &BTreeMap<String, String>, elsewhere| {
            reason(refusal(
                pod,
                labels,
                &policy(),
                CloudName::RUNPOD,
                elsewhere,
            ))
        };
        assert_eq!(
            judge(&cannot, &enabled(), elsewhere()),
            Some(("WrongNode", false))
        );
        assert_eq!(
            judge(&cannot, &enabled(), None).map(|(reason, _)| reason),
            Some("CannotRunOnRunPod")
        );
        assert_eq!(
            judge(&pod(json!({})), &BTreeMap::new(), elsewhere()),
            Some(("NotOptedIn", false))
        );
        let no_gpu = pod(json!({"spec": {"containers": [{"name": "c", "image": "i"}]}}));
        assert_eq!(
            judge(&no_gpu, &enabled(), elsewhere()).map(|(reason, _)| reason),
            Some("NotRunOnRunPod")
        );
        assert_eq!(
            judge(&pod(json!({})), &enabled(), elsewhere()),
            Some(("WrongNode", false))
        );
        let at: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let judged = Judged {
            refusal: Some(wrong_node("namespace team is bound to node b".to_owned())),
            label: None,
            at,
        };
        let later = at
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(61))
            .unwrap();
        assert!(
            !judged.still_holds(None, later),
            "the namespace may be bound anew"
        );
    }

    #[test]
    fn only_pods_without_their_own_opt_in_need_the_namespace() {
        assert!(needs_namespace_labels(&pod(json!({}))));
        assert!(!needs_namespace_labels(&pod(
            json!({"metadata": {"labels": {"runpod.io/burst": "enabled"}}})
        )));
    }
}
