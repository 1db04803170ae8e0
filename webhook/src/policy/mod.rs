//! Admission policy as pure functions: a pod, what the cluster knows about its namespace and
//! owning Job, and the cluster's policy settings in; a verdict (patch, warnings, or a rejection)
//! out. No I/O here, so every rule is unit- and property-testable.

mod budget;
mod cheapest;
mod choice;
mod interruptible;
mod namespace_defaults;
pub use cheapest::price_on;
mod mutation;
mod retract;
mod review;
mod teams;

use std::collections::BTreeMap;

use crate::contract;
use crate::pod::PodView;
#[cfg(test)]
pub(crate) use checks::view_gpu_count;
pub use checks::{detect_ports, gpu_count};
pub use mutation::{Mutation, Op};
use runpod_contract::checks;
pub use runpod_contract::config::{OwningJob, PolicyConfig};
pub use runpod_contract::policy::{Untouched, cannot_run, opt_in, screen};
use runpod_contract::provider::Cloud;

/// What the cluster knows about the pod's surroundings, looked up by the caller.
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub namespace_labels: BTreeMap<String, String>,
    /// Annotations of the owning Job, when the pod has one and it still exists.
    pub job: Option<OwningJob>,
    /// Cheapest GPU price per cloud type (USD per GPU-hour) as the virtual node publishes it;
    /// empty when no node has published one yet.
    pub cheapest_gpu_price: BTreeMap<String, f64>,
    /// The prices per GPU type each cloud's virtual nodes publish (all its nodes' together),
    /// for `runpod.io/provider: cheapest`; a cloud without published prices is absent.
    pub gpu_prices: BTreeMap<Cloud, runpod_contract::gpus::GpuPrices>,
    /// The namespace's annotations (its budget).
    pub namespace_annotations: BTreeMap<String, String>,
    /// Each virtual node: its cloud and the namespaces it lists (node binding).
    pub served: Vec<(Cloud, runpod_contract::teams::Served)>,
    /// What the namespace spends now (its budget ledger), when known.
    pub namespace_spend: Option<f64>,
    /// The pod's claims → their StorageClass's provisioner (absent: not found).
    pub claim_provisioners: BTreeMap<String, String>,
    /// The pod's claims → the datacenter their network volume is in, where known.
    pub claim_datacenters: BTreeMap<String, String>,
    /// The GPU types each datacenter offers where network volumes are (read only for pods
    /// that mount a claim).
    pub datacenter_gpus: BTreeMap<String, std::collections::BTreeSet<String>>,
}

/// The decision for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Admit. `untouched` says why a pod does not burst; its mutation then only cleans up
    /// (controller annotations, our own earlier changes) and is often empty.
    Allow {
        mutation: Mutation,
        warnings: Vec<String>,
        untouched: Option<Untouched>,
    },
    /// Refuse, with an HTTP-style code (403 policy, 422 invalid) and a message for the user.
    Deny {
        code: u16,
        reason: String,
        message: String,
    },
}

/// The owning Job of a pod, if any (ownerReference of kind Job in group batch).
pub fn owning_job(pod: &PodView) -> Option<(&str, &str)> {
    pod.meta()
        .owner_references
        .as_ref()?
        .iter()
        .find(|owner| owner.kind == "Job" && owner.api_version.starts_with("batch/"))
        .map(|owner| (owner.name.as_str(), owner.uid.as_str()))
}

/// Decides what happens to a pod at creation.
pub fn decide(pod: &PodView, namespace: &str, context: &Context, config: &PolicyConfig) -> Verdict {
    if let Err(reason) = opt_in(pod, namespace, &context.namespace_labels, config) {
        return untouched(Mutation::default(), Vec::new(), reason);
    }
    match review::Review::new(pod, namespace, context, config).judge() {
        Ok(verdict) => verdict,
        Err(verdict) => *verdict,
    }
}

/// Whether the pod mounts a claim of this project's StorageClass (only the virtual node can
/// have its volume).
fn mounts_network_volume(pod: &PodView, context: &Context) -> bool {
    checks::claims(pod).iter().any(|claim| {
        context.claim_provisioners.get(*claim).map(String::as_str)
            == Some(runpod_contract::volumes::PROVISIONER)
    })
}

/// Whether a flag annotation is in force; a malformed value is not, and is refused later by
/// [`checks::validate_annotations`].
fn is_true(effective: &checks::Effective<'_>, key: &str) -> bool {
    effective
        .get(key)
        .is_some_and(|sourced| contract::parse_flag(sourced.value) == Ok(true))
}

fn untouched(mutation: Mutation, warnings: Vec<String>, reason: Untouched) -> Verdict {
    Verdict::Allow {
        mutation,
        warnings,
        untouched: Some(reason),
    }
}

fn deny_invalid(pod: &PodView, namespace: &str, problems: Vec<String>) -> Verdict {
    Verdict::Deny {
        code: 422,
        reason: "Invalid".to_owned(),
        message: rejection(pod, namespace, &problems),
    }
}

fn rejection(pod: &PodView, namespace: &str, problems: &[String]) -> String {
    let name = pod
        .meta()
        .name
        .as_deref()
        .map(str::to_owned)
        .or_else(|| pod.meta().generate_name.as_ref().map(|g| format!("{g}*")))
        .unwrap_or_else(|| "<unnamed>".to_owned());
    format!(
        "runpod-kubelet rejected pod {namespace}/{name}: {}",
        problems.join("; ")
    )
}

#[cfg(test)]
mod tests;
