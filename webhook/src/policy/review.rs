//! One pod's review, step by step: each step either passes on what it found or ends the review
//! with the verdict (`Err`), so [`Review::judge`] reads as the order the rules apply in.

use std::collections::BTreeMap;

use runpod_contract::pod::CompactString;

use runpod_contract::checks;
use runpod_contract::policy::Untouched;
use runpod_contract::provider::{self, Cloud};

use super::mutation::{self, Mutation};
use super::namespace_defaults::{no_ports_by_default, resolve_mode};
use super::{
    Context, PolicyConfig, Verdict, budget, interruptible, is_true, mounts_network_volume,
    rejection, retract, teams, untouched,
};
use crate::contract::{self, BurstMode};
use crate::pod::PodView;

/// A pod without annotations.
static NO_ANNOTATIONS: BTreeMap<CompactString, CompactString> = BTreeMap::new();

/// A step's result: what it found, or the verdict that ends the review (boxed: a verdict is
/// large and the early end is the rare path).
pub(super) type Step<T> = Result<T, Box<Verdict>>;

/// What every step reads: the pod, its surroundings and its effective annotations.
pub(super) struct Review<'a> {
    pub pod: &'a PodView,
    pub namespace: &'a str,
    pub context: &'a Context,
    pub config: &'a PolicyConfig,
    /// The pod's own annotations.
    pub annotations: &'a BTreeMap<CompactString, CompactString>,
    /// The pod's annotations, else its Job's.
    pub effective: checks::Effective<'a>,
    pub gpus: u32,
}

/// The cloud chosen, and what choosing it adds to the pod.
pub(super) struct Chosen {
    pub cloud: Cloud,
    /// `runpod.io/provider: cheapest` made the choice.
    pub by_cheapest: bool,
    /// The `cheapest` record written on the pod, so a later review keeps the choice.
    pub record: Option<String>,
}

/// How the pod is to be placed: its burst mode, and where it goes at creation.
struct Modes {
    mode: BurstMode,
    placement: BurstMode,
}

/// Ports found on the pod's containers when it names none.
struct Ports {
    /// `runpod.io/ports` to write on the pod, when it sets none.
    detected: Option<String>,
    warnings: Vec<String>,
}

impl<'a> Review<'a> {
    pub(super) fn new(
        pod: &'a PodView,
        namespace: &'a str,
        context: &'a Context,
        config: &'a PolicyConfig,
    ) -> Self {
        let annotations = pod.meta().annotations.as_ref().unwrap_or(&NO_ANNOTATIONS);
        Review {
            pod,
            namespace,
            context,
            config,
            annotations,
            effective: checks::Effective::resolve(annotations, context.job.as_ref()),
            gpus: checks::view_gpu_count(pod),
        }
    }

    /// The verdict on an opted-in pod (`Ok` and `Err` alike: `Err` ends the review early).
    pub(super) fn judge(&self) -> Step<Verdict> {
        // From here on the pod is ours to judge; controller-owned annotations never get
        // through.
        let mut mutation = self.cleanup();
        let Modes {
            mode,
            mut placement,
        } = self.modes(&mutation)?;
        let invalid = checks::validate_annotations(&self.effective);
        if !invalid.is_empty() {
            return Err(self.invalid(invalid));
        }
        let mut warnings = Vec::new();
        let nodes = teams::placement(self.pod, self.namespace, self.context, self.config);
        let chosen = self.choose_cloud(&nodes, &mut mutation.set_annotations, &mut warnings)?;
        let cloud = chosen.cloud;
        let ports = self.shapes(cloud, &mut placement, &mut mutation, &mut warnings)?;
        self.allowed_on(cloud)?;
        if cloud == Cloud::RunPod {
            self.volume_allowed()?;
        }
        let asked = interruptible::Asked {
            cloud,
            chose_cheapest: chosen.by_cheapest,
            gpus: self.gpus,
        };
        if let Some(refused) = asked.admit(
            self.pod,
            self.namespace,
            &self.effective,
            self.context,
            self.config,
            &mut mutation,
            &mut warnings,
        ) {
            return Err(Box::new(refused));
        }
        let pin = self.pin(&nodes, cloud, placement, &mut mutation, &mut warnings)?;
        match budget::check(
            self.namespace,
            &self.effective,
            self.gpus,
            cloud,
            self.config,
            self.context,
        ) {
            Ok(warning) => warnings.extend(warning),
            Err((code, problem)) => {
                return Err(Box::new(Verdict::Deny {
                    code,
                    reason: if code == 403 { "Forbidden" } else { "Invalid" }.to_owned(),
                    message: rejection(self.pod, self.namespace, &[problem]),
                }));
            }
        }
        if cloud == Cloud::RunPod
            && let Some(warning) = checks::cap_below_market(
                &self.effective,
                self.gpus,
                self.config,
                &self.context.cheapest_gpu_price,
            )
        {
            warnings.push(warning);
        }
        let closed = self.write_annotations(mode, &chosen, ports.detected, &mut mutation);
        warnings.extend(ports.warnings);
        self.advise(cloud, closed, &mut warnings);
        mutation::schedule_onto_cloud(self.pod, placement, cloud, &mut mutation, &mut warnings);
        if let Some(hosts) = pin {
            mutation.require_nodes = mutation::pinned_terms(self.pod, placement, &hosts);
        }
        Ok(Verdict::Allow {
            mutation,
            warnings,
            untouched: None,
        })
    }

    /// Removes the controller's annotations the pod carries. A `cheapest` record stays on a
    /// second review (reinvocation) when it names the cloud the pod is set to.
    fn cleanup(&self) -> Mutation {
        let annotations = self.annotations;
        let kept_record = annotations
            .get(provider::CHEAPEST_CHOICE)
            .and_then(|record| runpod_contract::gpus::recorded_choice(record))
            .is_some_and(|cloud| {
                annotations
                    .get(provider::PROVIDER)
                    .map(CompactString::as_str)
                    == Some(cloud.as_str())
            });
        Mutation {
            remove_annotations: contract::CONTROLLER_ANNOTATIONS
                .iter()
                .filter(|key| annotations.contains_key(**key))
                .filter(|key| !(kept_record && **key == provider::CHEAPEST_CHOICE))
                .map(|key| (*key).to_owned())
                .collect(),
            ..Mutation::default()
        }
    }

    /// The pod's burst mode; a CPU pod, or one that never bursts, ends the review untouched.
    fn modes(&self, mutation: &Mutation) -> Step<Modes> {
        let explicit_mode = self.effective.get(contract::BURST_MODE);
        let managed = is_true(&self.effective, contract::MANAGED);
        // Before the namespace default is read: a typo there must not block the namespace's
        // CPU pods, which are no candidates anyway.
        if self.gpus == 0 && explicit_mode.is_none() && !managed {
            return Err(Box::new(untouched(
                mutation.clone(),
                Vec::new(),
                Untouched::NotGpu,
            )));
        }
        let mode = resolve_mode(
            explicit_mode,
            managed,
            &self.context.namespace_labels,
            self.namespace,
        )
        .map_err(|problem| self.invalid(vec![problem]))?;
        if mode == BurstMode::Never {
            return Err(Box::new(untouched(
                mutation.clone(),
                Vec::new(),
                Untouched::ModeNever,
            )));
        }
        // Pinned at creation: the scheduler would bind the pod to a free local GPU within
        // milliseconds, long before the offloader could move it.
        let offload = is_true(&self.effective, contract::OFFLOAD);
        let placement = if offload { BurstMode::Always } else { mode };
        if self.gpus == 0 && placement == BurstMode::Always {
            // RunPod's v2 CPU pods are not dependable (api-notes: creates answered 501), and
            // the controller runs GPU pods only: refused here rather than Pending forever.
            let cause = if offload {
                format!("{} is true", contract::OFFLOAD)
            } else {
                format!("{} is always", contract::BURST_MODE)
            };
            return Err(self.invalid(vec![format!(
                "{cause} but the pod requests no {}; the virtual node runs GPU pods only: \
                 request a GPU or set {}: never",
                contract::GPU_RESOURCE,
                contract::BURST_MODE
            )]));
        }
        Ok(Modes { mode, placement })
    }

    /// What the cloud cannot run (shapes, claims, ports): refused for a pod that must burst,
    /// kept local for the others. A network volume claim makes the pod one that must burst.
    fn shapes(
        &self,
        cloud: Cloud,
        placement: &mut BurstMode,
        mutation: &mut Mutation,
        warnings: &mut Vec<String>,
    ) -> Step<Ports> {
        let mut unsupported = checks::unsupported_shape(self.pod);
        if cloud == Cloud::VastAi {
            unsupported.extend(checks::vastai_unsupported_shape(self.pod));
        }
        let network_volume = checks::network_volume_claims(self.pod, |claim| {
            self.context.claim_provisioners.get(claim).cloned()
        })
        .unwrap_or_else(|problems| {
            unsupported.extend(problems);
            false
        });
        // Its PV is the virtual node's alone: a local node could never mount it.
        if network_volume && unsupported.is_empty() && *placement != BurstMode::Always {
            *placement = BurstMode::Always;
            warnings.push(
                "runpod-kubelet: this pod mounts a RunPod network volume, so it runs on RunPod \
                 and never falls back to a local node"
                    .to_owned(),
            );
        }
        // Detected ports are not the user's value: too many of them make a pod RunPod cannot
        // run, judged per mode like the other shapes (an explicit annotation was validated).
        let mut ports = Ports {
            detected: None,
            warnings: Vec::new(),
        };
        let no_ports =
            no_ports_by_default(&self.context.namespace_labels, self.namespace, self.config)
                .map_err(|problem| self.invalid(vec![problem]))?;
        if self.effective.get(contract::PORTS).is_none() && no_ports {
            // Written on the pod, so the controller exposes nothing whatever its own default.
            ports.detected = Some(contract::PORTS_NONE.to_owned());
        } else if self.effective.get(contract::PORTS).is_none() {
            match checks::view_detect_ports(self.pod, &mut ports.warnings) {
                Ok(detected) => ports.detected = detected,
                Err(problem) => unsupported.push(problem),
            }
        }
        if unsupported.is_empty() {
            return Ok(ports);
        }
        let earlier = retract::earlier_review(self.pod);
        if earlier.is_some() {
            unsupported.push(retract::CHANGED_AFTER_REVIEW.to_owned());
        }
        // Kept local, its network volume claim would wait for a provisioner forever.
        if *placement == BurstMode::Always || mounts_network_volume(self.pod, self.context) {
            return Err(self.invalid(unsupported));
        }
        if let Some(earlier) = earlier {
            earlier.retract(mutation);
        }
        warnings.push(format!(
            "runpod-kubelet: this pod stays on local nodes because RunPod cannot run it: {}",
            unsupported.join("; ")
        ));
        Err(Box::new(untouched(
            std::mem::take(mutation),
            std::mem::take(warnings),
            Untouched::CannotBurst,
        )))
    }

    /// Refuses (403) a pod `cloud`'s policy does not allow.
    fn allowed_on(&self, cloud: Cloud) -> Step<()> {
        let forbidden = match cloud {
            Cloud::RunPod => self.policy_problems(cloud),
            Cloud::VastAi => self
                .policy_problems(cloud)
                .into_iter()
                .map(|problem| format!("annotation {problem}"))
                .collect(),
        };
        if forbidden.is_empty() {
            Ok(())
        } else {
            Err(self.forbidden(&forbidden))
        }
    }

    /// Refuses (403) a pod whose network volume is where it may not run: it could run only
    /// there. A claim not provisioned yet, without a class datacenter, is judged when its
    /// first pod lands (the controller then chooses among the allowed datacenters).
    fn volume_allowed(&self) -> Step<()> {
        let problems: Vec<String> = checks::claims(self.pod)
            .into_iter()
            .filter(|claim| {
                self.context
                    .claim_provisioners
                    .get(*claim)
                    .map(String::as_str)
                    == Some(runpod_contract::volumes::PROVISIONER)
            })
            .filter_map(|claim| Some((claim, self.context.claim_datacenters.get(claim)?)))
            .flat_map(|(claim, datacenter)| {
                let mut problems = checks::volume_placement_problems(
                    &self.effective,
                    self.config,
                    claim,
                    datacenter,
                );
                if problems.is_empty() {
                    problems.extend(self.volume_priced(claim, datacenter));
                }
                problems
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(self.forbidden(&problems))
        }
    }

    /// Why no GPU the pod may use is offered in its volume's datacenter under its price cap,
    /// naming what is there and at what price; `None` when one is, or nothing is published to
    /// judge by (the controller then judges at create time).
    fn volume_priced(&self, claim: &str, datacenter: &str) -> Option<String> {
        let offered = self.context.datacenter_gpus.get(datacenter)?;
        let published = self.context.gpu_prices.get(&Cloud::RunPod)?;
        let there = runpod_contract::gpus::GpuPrices {
            quotes: published
                .quotes
                .iter()
                .filter(|q| offered.contains(&q.key.gpu))
                .filter(|q| {
                    q.key.class.as_deref() == Some(runpod_contract::CloudType::Secure.as_str())
                })
                .cloned()
                .collect(),
            ..published.clone()
        };
        if there.is_empty() {
            return None;
        }
        let (fit, cap) = super::cheapest::price_on(
            Cloud::RunPod,
            &self.effective.values(),
            self.gpus,
            self.config,
            &there,
        );
        if fit.is_some() {
            return None;
        }
        let listed: Vec<String> = there
            .lowest_per_gpu()
            .iter()
            .map(|(gpu, per_gpu)| format!("{gpu} at {per_gpu:.3} USD per GPU-hour"))
            .collect();
        let wanted = cap.map_or("its GPU requirements".to_owned(), |cap| {
            format!("its GPU requirements within its price cap of {cap:.3} USD/h")
        });
        Some(format!(
            "PersistentVolumeClaim {claim:?} is a network volume in {datacenter}, where the pod \
             must run, and no GPU type offered there (Secure Cloud) meets {wanted}: {}",
            listed.join(", ")
        ))
    }

    /// The nodes the namespace's binding allows on `cloud` (`None`: any). No node may take it:
    /// a `fallback` pod stays local, any other is refused (a `delayed` one would be moved to a
    /// virtual node later by the offloader, which knows no binding).
    fn pin(
        &self,
        nodes: &teams::Placement,
        cloud: Cloud,
        placement: BurstMode,
        mutation: &mut Mutation,
        warnings: &mut Vec<String>,
    ) -> Step<Option<Vec<String>>> {
        match teams::hosts_on(nodes, cloud) {
            Ok(pin) => Ok(pin),
            Err(problem) if placement != BurstMode::Fallback => Err(self.forbidden(&[problem])),
            Err(problem) => {
                if let Some(earlier) = retract::earlier_review(self.pod) {
                    earlier.retract(mutation);
                }
                warnings.push(format!(
                    "runpod-kubelet: this pod stays on local nodes: {problem}"
                ));
                Err(Box::new(untouched(
                    std::mem::take(mutation),
                    std::mem::take(warnings),
                    Untouched::CannotBurst,
                )))
            }
        }
    }

    /// Writes on the pod what the controllers and users read there. Returns whether the pod
    /// exposes no public port (so no SSH port, and no bridge to the cluster's network).
    fn write_annotations(
        &self,
        mode: BurstMode,
        chosen: &Chosen,
        detected_ports: Option<String>,
        mutation: &mut Mutation,
    ) -> bool {
        let set = &mut mutation.set_annotations;
        // Effective values from the owning Job are written on the pod, so the controller and
        // users see one place.
        for (key, value) in self.effective.inherited_from_job() {
            set.insert(key.to_owned(), value.to_owned());
        }
        let closed = detected_ports.as_deref() == Some(contract::PORTS_NONE)
            || self.effective.get(contract::PORTS).is_some_and(|ports| {
                ports
                    .value
                    .trim()
                    .eq_ignore_ascii_case(contract::PORTS_NONE)
            });
        if let Some(ports) = detected_ports {
            set.insert(contract::PORTS.to_owned(), ports);
        }
        // The offloader reads the mode from the pod alone; what the namespace or `managed`
        // chose is written there (an explicit mode is on the pod already, or inherited above).
        if mode == BurstMode::Delayed && self.effective.get(contract::BURST_MODE).is_none() {
            set.insert(contract::BURST_MODE.to_owned(), mode.as_str().to_owned());
        }
        // The cloud is written on the pod (the controllers' offloaders and users read it
        // there) unless it is the default and nothing else was asked for.
        let cloud = chosen.cloud;
        let asked = self
            .annotations
            .get(provider::PROVIDER)
            .map(CompactString::as_str);
        let inherited = set.contains_key(provider::PROVIDER);
        let differs = asked != Some(cloud.as_str());
        if inherited
            || (differs && (cloud != Cloud::RunPod || asked.is_some() || chosen.by_cheapest))
        {
            set.insert(provider::PROVIDER.to_owned(), cloud.as_str().to_owned());
        }
        if let Some(record) = &chosen.record {
            // Ours, not the user's: the controller repeats it in an Event.
            mutation
                .remove_annotations
                .retain(|key| key != provider::CHEAPEST_CHOICE);
            mutation
                .set_annotations
                .insert(provider::CHEAPEST_CHOICE.to_owned(), record.clone());
        }
        closed
    }

    /// Warnings about what the pod will not get on `cloud`. Never dropped silently: said
    /// here, and again in the controller's Event at create time (a Job's pods have no one to
    /// read admission warnings).
    fn advise(&self, cloud: Cloud, closed: bool, warnings: &mut Vec<String>) {
        if closed && cloud == Cloud::RunPod {
            warnings.push(runpod_contract::network::NO_BRIDGE_WARNING.to_owned());
        }
        let wants_network = self
            .context
            .namespace_annotations
            .contains_key(runpod_contract::network::CLUSTER_SERVICES)
            || self.pod.spec.as_ref().is_some_and(|spec| {
                spec.containers
                    .iter()
                    .any(|c| c.ports.as_ref().is_some_and(|ports| !ports.is_empty()))
            });
        if cloud != Cloud::RunPod && wants_network {
            warnings.push(runpod_contract::network::no_bridge_on(cloud.display_name()));
        }
        if let Some(unapplied) =
            checks::unapplied_security_context_message(self.pod, cloud.display_name())
        {
            warnings.push(format!("runpod-kubelet: {unapplied}"));
        }
        if let Some(unhonoured) =
            checks::unhonoured_message(self.pod, cloud.display_name(), cloud == Cloud::RunPod)
        {
            warnings.push(format!("runpod-kubelet: {unhonoured}"));
        }
    }

    /// A 422: the pod or its surroundings say something invalid.
    pub(super) fn invalid(&self, problems: Vec<String>) -> Box<Verdict> {
        Box::new(super::deny_invalid(self.pod, self.namespace, problems))
    }

    /// A 403: the pod is valid but not allowed.
    pub(super) fn forbidden(&self, problems: &[String]) -> Box<Verdict> {
        Box::new(Verdict::Deny {
            code: 403,
            reason: "Forbidden".to_owned(),
            message: rejection(self.pod, self.namespace, problems),
        })
    }
}
