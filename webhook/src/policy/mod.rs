//! Admission policy as pure functions: a pod, what the cluster knows about its namespace and
//! owning Job, and the cluster's policy settings in; a verdict (patch, warnings, or a rejection)
//! out. No I/O here, so every rule is unit- and property-testable.

mod budget;
mod cheapest;
mod interruptible;
mod namespace_defaults;
pub use cheapest::price_on;
mod mutation;
mod retract;
mod teams;

use std::collections::BTreeMap;

use crate::contract::{self, BurstMode};
use crate::pod::PodView;
#[cfg(test)]
pub(crate) use checks::view_gpu_count;
pub use checks::{detect_ports, gpu_count};
pub use mutation::Mutation;
use namespace_defaults::{no_ports_by_default, resolve_mode};
use runpod_contract::checks;
pub use runpod_contract::config::{OwningJob, PolicyConfig};
use runpod_contract::gpus::Cheapest;
pub use runpod_contract::policy::{Untouched, cannot_run, opt_in, screen};
use runpod_contract::provider::{self, Cloud, ProviderChoice};

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
pub fn owning_job(pod: &PodView) -> Option<(String, String)> {
    pod.meta()
        .owner_references
        .as_ref()?
        .iter()
        .find(|owner| owner.kind == "Job" && owner.api_version.starts_with("batch/"))
        .map(|owner| (owner.name.clone(), owner.uid.clone()))
}

/// Decides what happens to a pod at creation.
pub fn decide(pod: &PodView, namespace: &str, context: &Context, config: &PolicyConfig) -> Verdict {
    if let Err(reason) = opt_in(pod, namespace, &context.namespace_labels, config) {
        return untouched(Mutation::default(), Vec::new(), reason);
    }

    // From here on the pod is ours to judge; controller-owned annotations never get through.
    let mut mutation = Mutation::default();
    let no_annotations = BTreeMap::new();
    let pod_annotations = pod.meta().annotations.as_ref().unwrap_or(&no_annotations);
    // A `cheapest` record stays on a second review (reinvocation) when it names the cloud the
    // pod is set to; any other is removed.
    let kept_record = pod_annotations
        .get(provider::CHEAPEST_CHOICE)
        .and_then(|record| runpod_contract::gpus::recorded_choice(record))
        .is_some_and(|cloud| {
            pod_annotations.get(provider::PROVIDER).map(String::as_str) == Some(cloud.as_str())
        });
    mutation.remove_annotations = contract::CONTROLLER_ANNOTATIONS
        .iter()
        .filter(|key| pod_annotations.contains_key(**key))
        .filter(|key| !(kept_record && **key == provider::CHEAPEST_CHOICE))
        .map(|key| (*key).to_owned())
        .collect();

    let effective = checks::Effective::resolve(pod_annotations, context.job.as_ref());
    let explicit_mode = effective.get(contract::BURST_MODE);
    let managed = is_true(&effective, contract::MANAGED);
    // Before the namespace default is read: a typo there must not block the namespace's
    // CPU pods, which are no candidates anyway.
    let gpus = checks::view_gpu_count(pod);
    if gpus == 0 && explicit_mode.is_none() && !managed {
        return untouched(mutation, Vec::new(), Untouched::NotGpu);
    }
    let mode = match resolve_mode(explicit_mode, managed, &context.namespace_labels, namespace) {
        Ok(mode) => mode,
        Err(problem) => return deny_invalid(pod, namespace, vec![problem]),
    };
    if mode == BurstMode::Never {
        return untouched(mutation, Vec::new(), Untouched::ModeNever);
    }
    // Pinned at creation: the scheduler would bind the pod to a free local GPU within
    // milliseconds, long before the offloader could move it.
    let offload = is_true(&effective, contract::OFFLOAD);
    let mut placement = if offload { BurstMode::Always } else { mode };
    if gpus == 0 && placement == BurstMode::Always {
        // RunPod's v2 CPU pods are not dependable (api-notes: creates answered 501), and the
        // controller runs GPU pods only: refused here rather than Pending forever.
        let cause = if offload {
            format!("{} is true", contract::OFFLOAD)
        } else {
            format!("{} is always", contract::BURST_MODE)
        };
        return deny_invalid(
            pod,
            namespace,
            vec![format!(
                "{cause} but the pod requests no {}; the virtual node runs GPU pods only: \
                 request a GPU or set {}: never",
                contract::GPU_RESOURCE,
                contract::BURST_MODE
            )],
        );
    }

    let mut warnings = Vec::new();
    let invalid = checks::validate_annotations(&effective);
    if !invalid.is_empty() {
        return deny_invalid(pod, namespace, invalid);
    }
    // The namespace's node binding: a namespace bound to one cloud's node goes to that cloud
    // unless the pod or namespace names another (refused below).
    let placement_of_nodes = teams::placement(pod, namespace, context, config);
    let bound_cloud = teams::only_cloud(&placement_of_nodes);
    let named_cloud = effective.get(provider::PROVIDER).is_some()
        || context.namespace_labels.contains_key(provider::PROVIDER);
    let choice = match provider_choice(
        &effective,
        &context.namespace_labels,
        namespace,
        bound_cloud
            .filter(|_| !named_cloud)
            .unwrap_or_else(|| config.default_cloud()),
    ) {
        Ok(ProviderChoice::Cloud(cloud)) if config.disabled_clouds.contains(&cloud) => {
            return deny_invalid(pod, namespace, vec![not_installed(cloud, config)]);
        }
        Ok(choice) => choice,
        Err(problem) => return deny_invalid(pod, namespace, vec![problem]),
    };
    // A choice `cheapest` made is recorded on the pod, so a later review keeps it.
    let chose_cheapest = choice == ProviderChoice::Cheapest;
    let mut cheapest_record = None;
    let cloud = match choice {
        ProviderChoice::Cloud(cloud) => cloud,
        ProviderChoice::Cheapest => {
            // What each cloud's policy minds about this pod.
            let policy_problems = |cloud: Cloud| match cloud {
                Cloud::RunPod => checks::policy_violations(&effective, gpus, config),
                Cloud::VastAi => {
                    runpod_contract::vastai::requirements(&effective.values(), gpus, &config.vastai)
                        .err()
                        .unwrap_or_default()
                }
            };
            // Only the clouds this pod may go to are compared; judged only for such pods.
            let fits = |cloud: Cloud| {
                policy_problems(cloud).is_empty()
                    && (cloud != Cloud::VastAi || checks::vastai_unsupported_shape(pod).is_empty())
            };
            // The installation's order: RunPod first, for ties and when nothing is published.
            let installed: Vec<Cloud> = Cloud::ALL
                .into_iter()
                .filter(|cloud| !config.disabled_clouds.contains(cloud))
                .filter(|cloud| bound_cloud.is_none_or(|bound| bound == *cloud))
                .collect();
            let mut clouds: Vec<Cloud> = installed
                .iter()
                .copied()
                .filter(|cloud| fits(*cloud))
                .collect();
            // Refused here only when every cloud's policy says no; a shape a cloud cannot run
            // is judged below per burst mode (a `fallback` pod then stays local).
            if clouds.is_empty()
                && !installed.is_empty()
                && installed
                    .iter()
                    .all(|cloud| !policy_problems(*cloud).is_empty())
            {
                let problems: Vec<String> = installed
                    .iter()
                    .map(|cloud| {
                        format!(
                            "{}: {}",
                            cloud.display_name(),
                            policy_problems(*cloud).join(", ")
                        )
                    })
                    .collect();
                return Verdict::Deny {
                    code: 403,
                    reason: "Forbidden".to_owned(),
                    message: rejection(
                        pod,
                        namespace,
                        &[format!(
                            "{} is cheapest but no cloud of this installation allows the pod \
                             ({})",
                            provider::PROVIDER,
                            problems.join("; ")
                        )],
                    ),
                };
            }
            // Only shapes stand in the way: the first installed cloud without a policy problem,
            // where the shape checks below decide.
            if clouds.is_empty()
                && let Some(cloud) = installed
                    .iter()
                    .copied()
                    .find(|cloud| policy_problems(*cloud).is_empty())
            {
                clouds.push(cloud);
            }
            // A namespace's interruptible default prices the pod as its own wish would.
            let priced_annotations = interruptible::with_namespace_default(
                pod_annotations,
                &effective,
                &context.namespace_labels,
            );
            let priced = checks::Effective::resolve(&priced_annotations, context.job.as_ref());
            let sides = cheapest::sides(&priced, gpus, config, &context.gpu_prices, &clouds);
            match runpod_contract::gpus::cheapest(&sides, config.default_cloud()) {
                Cheapest::Chose {
                    cloud,
                    warning,
                    record,
                } => {
                    warnings.push(warning);
                    cheapest_record = Some(record);
                    if cloud == Cloud::RunPod {
                        for (key, value) in cheapest::runpod_annotations(&effective) {
                            mutation.set_annotations.insert(key.to_owned(), value);
                        }
                    }
                    cloud
                }
                Cheapest::Refused(problem) => {
                    return Verdict::Deny {
                        code: 403,
                        reason: "Forbidden".to_owned(),
                        message: rejection(pod, namespace, &[problem]),
                    };
                }
            }
        }
    };
    let mut unsupported = checks::unsupported_shape(pod);
    if cloud == Cloud::VastAi {
        unsupported.extend(checks::vastai_unsupported_shape(pod));
    }
    let network_volume =
        checks::network_volume_claims(pod, |claim| context.claim_provisioners.get(claim).cloned())
            .unwrap_or_else(|problems| {
                unsupported.extend(problems);
                false
            });
    // Its PV is the virtual node's alone: a local node could never mount it.
    if network_volume && unsupported.is_empty() && placement != BurstMode::Always {
        placement = BurstMode::Always;
        warnings.push(
            "runpod-kubelet: this pod mounts a RunPod network volume, so it runs on RunPod \
             and never falls back to a local node"
                .to_owned(),
        );
    }
    // Detected ports are not the user's value: too many of them make a pod RunPod cannot run,
    // judged per mode like the other shapes (an explicit annotation was validated above).
    let mut port_warnings = Vec::new();
    let mut detected_ports = None;
    let no_ports = match no_ports_by_default(&context.namespace_labels, namespace, config) {
        Ok(no_ports) => no_ports,
        Err(problem) => return deny_invalid(pod, namespace, vec![problem]),
    };
    if effective.get(contract::PORTS).is_none() && no_ports {
        // Written on the pod, so the controller exposes nothing whatever its own default.
        detected_ports = Some(contract::PORTS_NONE.to_owned());
    } else if effective.get(contract::PORTS).is_none() {
        match checks::view_detect_ports(pod, &mut port_warnings) {
            Ok(ports) => detected_ports = ports,
            Err(problem) => unsupported.push(problem),
        }
    }
    if !unsupported.is_empty() {
        let earlier = retract::earlier_review(pod);
        if earlier.is_some() {
            unsupported.push(retract::CHANGED_AFTER_REVIEW.to_owned());
        }
        // Kept local, its network volume claim would wait for a provisioner forever.
        if placement == BurstMode::Always || mounts_network_volume(pod, context) {
            return deny_invalid(pod, namespace, unsupported);
        }
        if let Some(earlier) = earlier {
            earlier.retract(&mut mutation);
        }
        warnings.push(format!(
            "runpod-kubelet: this pod stays on local nodes because RunPod cannot run it: {}",
            unsupported.join("; ")
        ));
        return untouched(mutation, warnings, Untouched::CannotBurst);
    }
    let forbidden = match cloud {
        Cloud::RunPod => checks::policy_violations(&effective, gpus, config),
        Cloud::VastAi => {
            match runpod_contract::vastai::requirements(&effective.values(), gpus, &config.vastai) {
                Ok(_) => Vec::new(),
                Err(problems) => problems
                    .into_iter()
                    .map(|problem| format!("annotation {problem}"))
                    .collect(),
            }
        }
    };
    if !forbidden.is_empty() {
        return Verdict::Deny {
            code: 403,
            reason: "Forbidden".to_owned(),
            message: rejection(pod, namespace, &forbidden),
        };
    }
    let asked = interruptible::Asked {
        cloud,
        chose_cheapest,
        gpus,
    };
    if let Some(refused) = asked.admit(
        pod,
        namespace,
        &effective,
        context,
        config,
        &mut mutation,
        &mut warnings,
    ) {
        return refused;
    }

    let pin = match teams::hosts_on(&placement_of_nodes, cloud) {
        Ok(pin) => pin,
        // Only a `fallback` pod may stay local: a `delayed` one would be moved to a virtual
        // node later by the offloader, which knows no binding.
        Err(problem) if placement != BurstMode::Fallback => {
            return Verdict::Deny {
                code: 403,
                reason: "Forbidden".to_owned(),
                message: rejection(pod, namespace, &[problem]),
            };
        }
        // No node may take it: a `fallback` pod stays local, as with a shape the cloud cannot
        // run.
        Err(problem) => {
            if let Some(earlier) = retract::earlier_review(pod) {
                earlier.retract(&mut mutation);
            }
            warnings.push(format!(
                "runpod-kubelet: this pod stays on local nodes: {problem}"
            ));
            return untouched(mutation, warnings, Untouched::CannotBurst);
        }
    };
    match budget::check(namespace, &effective, gpus, cloud, config, context) {
        Ok(warning) => warnings.extend(warning),
        Err((code, problem)) => {
            return Verdict::Deny {
                code,
                reason: if code == 403 { "Forbidden" } else { "Invalid" }.to_owned(),
                message: rejection(pod, namespace, &[problem]),
            };
        }
    }

    if cloud == Cloud::RunPod
        && let Some(warning) =
            checks::cap_below_market(&effective, gpus, config, &context.cheapest_gpu_price)
    {
        warnings.push(warning);
    }

    // Effective values from the owning Job are written on the pod, so the controller and users
    // see one place.
    for (key, value) in effective.inherited_from_job() {
        mutation
            .set_annotations
            .insert(key.to_owned(), value.to_owned());
    }
    // No public port means no SSH port, and so no bridge to the cluster's network.
    let closed = detected_ports.as_deref() == Some(contract::PORTS_NONE)
        || effective.get(contract::PORTS).is_some_and(|ports| {
            ports
                .value
                .trim()
                .eq_ignore_ascii_case(contract::PORTS_NONE)
        });
    if let Some(ports) = detected_ports {
        mutation
            .set_annotations
            .insert(contract::PORTS.to_owned(), ports);
    }
    // The offloader reads the mode from the pod alone; what the namespace or `managed` chose is
    // written there (an explicit mode is on the pod already, or inherited above).
    if mode == BurstMode::Delayed && explicit_mode.is_none() {
        mutation
            .set_annotations
            .insert(contract::BURST_MODE.to_owned(), mode.as_str().to_owned());
    }
    // The cloud is written on the pod (the controllers' offloaders and users read it there)
    // unless it is the default and nothing else was asked for.
    let asked = pod_annotations.get(provider::PROVIDER).map(String::as_str);
    let inherited = mutation.set_annotations.contains_key(provider::PROVIDER);
    let differs = asked != Some(cloud.as_str());
    if inherited || (differs && (cloud != Cloud::RunPod || asked.is_some() || chose_cheapest)) {
        mutation
            .set_annotations
            .insert(provider::PROVIDER.to_owned(), cloud.as_str().to_owned());
    }
    if let Some(record) = cheapest_record {
        // Ours, not the user's: the controller repeats it in an Event.
        mutation
            .remove_annotations
            .retain(|key| key != provider::CHEAPEST_CHOICE);
        mutation
            .set_annotations
            .insert(provider::CHEAPEST_CHOICE.to_owned(), record);
    }
    warnings.extend(port_warnings);
    if closed && cloud == Cloud::RunPod {
        warnings.push(runpod_contract::network::NO_BRIDGE_WARNING.to_owned());
    }
    let wants_network = context
        .namespace_annotations
        .contains_key(runpod_contract::network::CLUSTER_SERVICES)
        || pod.spec.as_ref().is_some_and(|spec| {
            spec.containers
                .iter()
                .any(|c| c.ports.as_ref().is_some_and(|ports| !ports.is_empty()))
        });
    if cloud != Cloud::RunPod && wants_network {
        warnings.push(runpod_contract::network::no_bridge_on(cloud.display_name()));
    }
    // Never dropped silently: said here, and again in the controller's Event at create time
    // (a Job's pods have no one to read admission warnings).
    if let Some(unapplied) = checks::unapplied_security_context_message(pod, cloud.display_name()) {
        warnings.push(format!("runpod-kubelet: {unapplied}"));
    }
    if let Some(unhonoured) =
        checks::unhonoured_message(pod, cloud.display_name(), cloud == Cloud::RunPod)
    {
        warnings.push(format!("runpod-kubelet: {unhonoured}"));
    }
    mutation::schedule_onto_cloud(pod, placement, cloud, &mut mutation, &mut warnings);
    if let Some(hosts) = pin {
        mutation.require_nodes = mutation::pinned_terms(pod, placement, &hosts);
    }
    Verdict::Allow {
        mutation,
        warnings,
        untouched: None,
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

/// Why a pod asking for a cloud this installation does not run is refused.
fn not_installed(cloud: Cloud, config: &PolicyConfig) -> String {
    let installed: Vec<&str> = Cloud::ALL
        .into_iter()
        .filter(|c| !config.disabled_clouds.contains(c))
        .map(Cloud::as_str)
        .collect();
    format!(
        "{} is {cloud}, but this installation runs no {} node (it runs: {}); set {} to one of \
         those",
        provider::PROVIDER,
        cloud.display_name(),
        installed.join(", "),
        provider::PROVIDER
    )
}

/// What a burst pod asks for: the effective `runpod.io/provider` (pod, then Job), else the
/// namespace label, else the installation's default (RunPod unless it runs none).
fn provider_choice(
    effective: &checks::Effective<'_>,
    namespace_labels: &BTreeMap<String, String>,
    namespace: &str,
    default_cloud: Cloud,
) -> Result<ProviderChoice, String> {
    match effective.get(provider::PROVIDER) {
        // Validated with the other annotations.
        Some(sourced) => ProviderChoice::parse(sourced.value)
            .map_err(|problem| format!("annotation {}: {problem}", provider::PROVIDER)),
        None => match namespace_labels.get(provider::PROVIDER) {
            None => Ok(ProviderChoice::Cloud(default_cloud)),
            Some(value) => ProviderChoice::parse(value).map_err(|problem| {
                format!(
                    "namespace {namespace} has label {}: {problem}; fix the namespace label or \
                     set the pod annotation {}",
                    provider::PROVIDER,
                    provider::PROVIDER
                )
            }),
        },
    }
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
        .clone()
        .or_else(|| pod.meta().generate_name.as_ref().map(|g| format!("{g}*")))
        .unwrap_or_else(|| "<unnamed>".to_owned());
    format!(
        "runpod-kubelet rejected pod {namespace}/{name}: {}",
        problems.join("; ")
    )
}

#[cfg(test)]
mod tests;
