//! The rules the webhook and the controller both apply to a pod: whether it opted in, and what
//! stops a remote cloud from running it as admitted. The controller repeats them for pods that
//! reached its node without admission.

use std::collections::BTreeMap;

use compact_str::CompactString;

use crate as contract;
use crate::PortSpec;
use crate::checks;
use crate::config::PolicyConfig;
use crate::pod::PodView;

/// Why a pod was let through without change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untouched {
    OptedOut,
    ExcludedNamespace,
    NotOptedIn,
    NotGpu,
    ModeNever,
    /// `fallback` or `delayed` pod that RunPod cannot run: it stays local (what an earlier
    /// review of ours added is taken back, so the mutation may not be empty), and a `delayed`
    /// one is not marked for the offloader.
    CannotBurst,
}

/// Reasons to leave a pod alone that need no lookup; checked first so that opted-out pods and
/// excluded namespaces never depend on the cluster being reachable.
pub fn screen(pod: &PodView, namespace: &str, config: &PolicyConfig) -> Option<Untouched> {
    if label(pod, contract::BURST_LABEL) == Some(contract::BURST_DISABLED) {
        return Some(Untouched::OptedOut);
    }
    if namespace == contract::SYSTEM_NAMESPACE || config.excluded_namespaces.contains(namespace) {
        return Some(Untouched::ExcludedNamespace);
    }
    None
}

/// Whether a pod opted in to bursting, and if not why: the pod label disables it, its
/// namespace is excluded, or neither the pod nor its namespace carries the opt-in label. The
/// webhook and the controller apply this one rule (a pod can reach the virtual node without
/// the webhook: `nodeName`, a RuntimeClass, a toleration of every taint).
pub fn opt_in(
    pod: &PodView,
    namespace: &str,
    namespace_labels: &BTreeMap<String, String>,
    config: &PolicyConfig,
) -> Result<(), Untouched> {
    if let Some(reason) = screen(pod, namespace, config) {
        return Err(reason);
    }
    let pod_opted_in = label(pod, contract::BURST_LABEL) == Some(contract::BURST_ENABLED);
    let namespace_opted_in = namespace_labels
        .get(contract::BURST_LABEL)
        .map(String::as_str)
        == Some(contract::BURST_ENABLED);
    let seed = config.accept_seed_tolerations && tolerates_the_seed_taint(pod);
    if pod_opted_in || namespace_opted_in || seed {
        Ok(())
    } else {
        Err(Untouched::NotOptedIn)
    }
}

/// What stops RunPod from running the pod as admitted (its own annotations, no Job lookup):
/// its shape (containers, init containers, volumes) and this cluster's policy (datacenters,
/// price cap). The controller re-checks these for pods that reached its node without admission.
pub fn cannot_run(pod: &PodView, config: &PolicyConfig) -> Vec<String> {
    let mut problems = checks::unsupported_shape(pod);
    let no_annotations = BTreeMap::new();
    let annotations = pod.meta().annotations.as_ref().unwrap_or(&no_annotations);
    let effective = checks::Effective::resolve(annotations, None);
    problems.extend(checks::policy_violations(
        &effective,
        checks::view_gpu_count(pod),
        config,
    ));
    // Detected ports RunPod cannot publish (too many http ports) keep a pod local at
    // admission too; an explicit `runpod.io/ports` was validated there.
    if effective.get(contract::PORTS).is_none()
        && let Err(problem) = checks::view_detect_ports(pod, &mut Vec::new())
    {
        problems.push(problem);
    }
    problems
}

/// The taint key the Go kubelet's node carried, and its RunPod value.
pub const SEED_TAINT_KEY: &str = "virtual-kubelet.io/provider";
pub const SEED_TAINT_VALUE: &str = "runpod";

/// Whether the pod itself tolerates `virtual-kubelet.io/provider=runpod` by key (operator
/// `Equal` with that value, or `Exists` on that key), as the Go kubelet's manifests did. A
/// toleration of every taint (no key) does not count, nor one a RuntimeClass added (the pod
/// names a `runtimeClassName`).
pub fn tolerates_the_seed_taint(pod: &PodView) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    if spec
        .runtime_class_name
        .as_deref()
        .is_some_and(|n| !n.is_empty())
    {
        return false;
    }
    spec.tolerations.iter().flatten().any(|t| {
        t.key.as_deref() == Some(SEED_TAINT_KEY)
            && match t.operator.as_deref() {
                Some("Exists") => true,
                None | Some("Equal") => t.value.as_deref() == Some(SEED_TAINT_VALUE),
                Some(_) => false,
            }
    })
}

fn label<'a>(pod: &'a PodView, key: &str) -> Option<&'a str> {
    pod.meta()
        .labels
        .as_ref()?
        .get(key)
        .map(CompactString::as_str)
}

/// The ports a cloud opens for a pod: the effective `runpod.io/ports` the webhook wrote, else
/// detected from the container's declared ports with the webhook's own rule. `Err` says what is
/// wrong with the value.
pub fn ports(pod: &k8s_openapi::api::core::v1::Pod) -> Result<Vec<PortSpec>, String> {
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(contract::PORTS))
        .cloned();
    let value = match annotated {
        Some(value) => Some(value),
        None => checks::detect_ports(pod, &mut Vec::new())?,
    };
    value.map_or(Ok(Vec::new()), |value| contract::parse_ports(&value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> PodView {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    }

    /// `--accept-seed-tolerations`: the Go kubelet's manifests (a toleration of the RunPod taint
    /// by key, no label) opt in; a tolerate-everything toleration, another provider's value, a
    /// RuntimeClass's toleration or the flag off do not.
    #[test]
    fn the_seed_toleration_opts_in_only_when_accepted() {
        let accepting = PolicyConfig {
            accept_seed_tolerations: true,
            ..PolicyConfig::default()
        };
        let no_labels = BTreeMap::new();
        let opted = |spec: serde_json::Value, config: &PolicyConfig| {
            opt_in(&pod(spec), "ml", &no_labels, config)
        };
        let equal = serde_json::json!({"tolerations": [{"key": "virtual-kubelet.io/provider",
            "operator": "Equal", "value": "runpod", "effect": "NoSchedule"}]});
        let exists = serde_json::json!({"tolerations": [{"key": "virtual-kubelet.io/provider",
            "operator": "Exists"}]});
        let no_operator = serde_json::json!({"tolerations": [{"key": "virtual-kubelet.io/provider",
            "value": "runpod"}]});
        assert_eq!(opted(equal.clone(), &accepting), Ok(()));
        assert_eq!(opted(exists, &accepting), Ok(()));
        assert_eq!(opted(no_operator, &accepting), Ok(()));
        assert_eq!(
            opted(equal.clone(), &PolicyConfig::default()),
            Err(Untouched::NotOptedIn)
        );
        for refused in [
            serde_json::json!({"tolerations": [{"operator": "Exists"}]}),
            serde_json::json!({"tolerations": [{"key": "virtual-kubelet.io/provider",
                "operator": "Equal", "value": "vastai"}]}),
            serde_json::json!({"tolerations": equal["tolerations"], "runtimeClassName": "runpod"}),
            serde_json::json!({"nodeName": "virtual-runpod"}),
        ] {
            assert_eq!(
                opted(refused.clone(), &accepting),
                Err(Untouched::NotOptedIn),
                "{refused}"
            );
        }
        // Opting out still wins.
        let mut out = pod(equal);
        out.metadata.as_mut().unwrap().labels = Some(
            [(
                contract::BURST_LABEL.into(),
                contract::BURST_DISABLED.into(),
            )]
            .into(),
        );
        assert_eq!(
            opt_in(&out, "ml", &no_labels, &accepting),
            Err(Untouched::OptedOut)
        );
    }
}
