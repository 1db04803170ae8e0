//! Which cloud a burst pod goes to: the one it, its Job or its namespace names, the one its
//! namespace is bound to, the installation's default, or for `cheapest` the cloud whose
//! published prices are lowest among those whose policy allows the pod.

use std::collections::BTreeMap;

use runpod_contract::checks;
use runpod_contract::gpus::Cheapest;
use runpod_contract::provider::{self, Cloud, ProviderChoice};

use super::review::{Chosen, Review, Step};
use super::{cheapest, interruptible, teams};

impl Review<'_> {
    /// The pod's cloud, or its refusal. `cheapest`'s warning and the annotations it sets
    /// for RunPod are added to `warnings` and `set_annotations`.
    pub(super) fn choose_cloud(
        &self,
        nodes: &teams::Placement,
        set_annotations: &mut BTreeMap<String, String>,
        warnings: &mut Vec<String>,
    ) -> Step<Chosen> {
        // The namespace's node binding: a namespace bound to one cloud's node goes to that
        // cloud unless the pod or namespace names another (refused later).
        let bound_cloud = teams::only_cloud(nodes);
        let named_cloud = self.effective.get(provider::PROVIDER).is_some()
            || self
                .context
                .namespace_labels
                .contains_key(provider::PROVIDER);
        let fallback = bound_cloud
            .filter(|_| !named_cloud)
            .unwrap_or_else(|| self.config.default_cloud());
        let cloud = match provider_choice(
            &self.effective,
            &self.context.namespace_labels,
            self.namespace,
            fallback,
        ) {
            Ok(ProviderChoice::Cloud(cloud)) if self.config.disabled_clouds.contains(&cloud) => {
                return Err(self.invalid(vec![self.not_installed(cloud)]));
            }
            Ok(ProviderChoice::Cloud(cloud)) => cloud,
            Ok(ProviderChoice::Cheapest) => {
                return self.cheapest(bound_cloud, set_annotations, warnings);
            }
            Err(problem) => return Err(self.invalid(vec![problem])),
        };
        Ok(Chosen {
            cloud,
            by_cheapest: false,
            record: None,
        })
    }

    /// What `cloud`'s policy minds about this pod (empty: nothing).
    pub(super) fn policy_problems(&self, cloud: Cloud) -> Vec<String> {
        match cloud {
            Cloud::RunPod => checks::policy_violations(&self.effective, self.gpus, self.config),
            Cloud::VastAi => runpod_contract::vastai::requirements(
                &self.effective.values(),
                self.gpus,
                &self.config.vastai,
            )
            .err()
            .unwrap_or_default(),
        }
    }

    /// `cheapest`: only the clouds this pod may go to are compared.
    fn cheapest(
        &self,
        bound_cloud: Option<Cloud>,
        set_annotations: &mut BTreeMap<String, String>,
        warnings: &mut Vec<String>,
    ) -> Step<Chosen> {
        let fits = |cloud: Cloud| {
            self.policy_problems(cloud).is_empty()
                && (cloud != Cloud::VastAi || checks::vastai_unsupported_shape(self.pod).is_empty())
        };
        // The installation's order: RunPod first, for ties and when nothing is published.
        let installed: Vec<Cloud> = Cloud::ALL
            .into_iter()
            .filter(|cloud| !self.config.disabled_clouds.contains(cloud))
            .filter(|cloud| bound_cloud.is_none_or(|bound| bound == *cloud))
            .collect();
        let mut clouds: Vec<Cloud> = installed
            .iter()
            .copied()
            .filter(|cloud| fits(*cloud))
            .collect();
        // Refused here only when every cloud's policy says no; a shape a cloud cannot run is
        // judged later per burst mode (a `fallback` pod then stays local).
        if clouds.is_empty()
            && !installed.is_empty()
            && installed
                .iter()
                .all(|cloud| !self.policy_problems(*cloud).is_empty())
        {
            let problems: Vec<String> = installed
                .iter()
                .map(|cloud| {
                    format!(
                        "{}: {}",
                        cloud.display_name(),
                        self.policy_problems(*cloud).join(", ")
                    )
                })
                .collect();
            return Err(self.forbidden(&[format!(
                "{} is cheapest but no cloud of this installation allows the pod ({})",
                provider::PROVIDER,
                problems.join("; ")
            )]));
        }
        // Only shapes stand in the way: the first installed cloud without a policy problem,
        // where the shape checks decide.
        if clouds.is_empty()
            && let Some(cloud) = installed
                .iter()
                .copied()
                .find(|cloud| self.policy_problems(*cloud).is_empty())
        {
            clouds.push(cloud);
        }
        // A namespace's interruptible default prices the pod as its own wish would.
        let priced_annotations = interruptible::with_namespace_default(
            self.annotations,
            &self.effective,
            &self.context.namespace_labels,
        );
        let priced = checks::Effective::resolve(&priced_annotations, self.context.job.as_ref());
        let sides = cheapest::sides(
            &priced,
            self.gpus,
            self.config,
            &self.context.gpu_prices,
            &clouds,
        );
        match runpod_contract::gpus::cheapest(&sides, self.config.default_cloud()) {
            Cheapest::Chose {
                cloud,
                warning,
                record,
            } => {
                warnings.push(warning);
                if cloud == Cloud::RunPod {
                    for (key, value) in cheapest::runpod_annotations(&self.effective) {
                        set_annotations.insert(key.to_owned(), value);
                    }
                }
                Ok(Chosen {
                    cloud,
                    by_cheapest: true,
                    record: Some(record),
                })
            }
            Cheapest::Refused(problem) => Err(self.forbidden(&[problem])),
        }
    }

    /// Why a pod asking for a cloud this installation does not run is refused.
    fn not_installed(&self, cloud: Cloud) -> String {
        let installed: Vec<&str> = Cloud::ALL
            .into_iter()
            .filter(|c| !self.config.disabled_clouds.contains(c))
            .map(Cloud::as_str)
            .collect();
        format!(
            "{} is {cloud}, but this installation runs no {} node (it runs: {}); set {} to one \
             of those",
            provider::PROVIDER,
            cloud.display_name(),
            installed.join(", "),
            provider::PROVIDER
        )
    }
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
