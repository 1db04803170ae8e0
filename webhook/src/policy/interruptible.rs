//! `runpod.io/interruptible` at admission: a pod may run on a Vast.ai bid only where it may go
//! to Vast.ai (RunPod stays on-demand); the warning shows what it bids beside the on-demand
//! price, and that an outbid pod fails with `DisruptionTarget`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use runpod_contract::checks::Effective;
use runpod_contract::config::PolicyConfig;
use runpod_contract::gpus::GpuPrices;
use runpod_contract::interruptible::{self, INTERRUPTIBLE, Interruptible};
use runpod_contract::pod::CompactString;
use runpod_contract::provider::{self, Cloud};

/// What admission does about a pod's interruptible wish.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Judged {
    /// Nothing asked (or `false`).
    OnDemand,
    /// Admitted on Vast.ai: warn; `write_flag`: the namespace asked, so the pod gets the
    /// annotation (the controller reads the pod alone).
    Bid { warning: String, write_flag: bool },
    /// The pod goes to RunPod anyway (the namespace's default, or `cheapest` chose RunPod):
    /// admitted on-demand, with this warning.
    RunPodOnDemand(String),
    /// The pod itself asks for a bid and names RunPod: refused with this message.
    Refused(String),
}

/// What `decide` knows of the pod when it judges its interruptible wish.
pub(super) struct Asked {
    pub cloud: Cloud,
    pub chose_cheapest: bool,
    pub gpus: u32,
}

impl Asked {
    /// Adds the warning and the namespace's annotation to the admission, or returns the
    /// refusal.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit(
        &self,
        pod: &crate::pod::PodView,
        namespace: &str,
        effective: &Effective<'_>,
        context: &super::Context,
        config: &PolicyConfig,
        mutation: &mut super::mutation::Mutation,
        warnings: &mut Vec<String>,
    ) -> Option<super::Verdict> {
        let judged = judge(
            effective,
            &context.namespace_labels,
            self.cloud,
            self.chose_cheapest,
            self.gpus,
            config,
            &context.gpu_prices,
        );
        match judged {
            Err(problem) => return Some(super::deny_invalid(pod, namespace, vec![problem])),
            Ok(Judged::Refused(problem)) => {
                return Some(super::Verdict::Deny {
                    code: 403,
                    reason: "Forbidden".to_owned(),
                    message: super::rejection(pod, namespace, &[problem]),
                });
            }
            Ok(Judged::RunPodOnDemand(warning)) => warnings.push(warning),
            Ok(Judged::Bid {
                warning,
                write_flag,
            }) => {
                warnings.push(warning);
                if write_flag {
                    mutation
                        .set_annotations
                        .insert(INTERRUPTIBLE.to_owned(), "true".to_owned());
                }
            }
            Ok(Judged::OnDemand) => {}
        }
        None
    }
}

/// The pod's annotations with the namespace's interruptible default added when neither the
/// pod nor its Job says anything (a malformed label adds nothing: it is refused later). Copied
/// only when the default is added.
pub(super) fn with_namespace_default<'a>(
    pod: &'a BTreeMap<CompactString, CompactString>,
    effective: &Effective<'_>,
    namespace_labels: &BTreeMap<String, String>,
) -> Cow<'a, BTreeMap<CompactString, CompactString>> {
    let silent = effective.get(INTERRUPTIBLE).is_none()
        && effective.get(interruptible::BID_PER_HOUR).is_none();
    if silent
        && namespace_labels
            .get(INTERRUPTIBLE)
            .is_some_and(|label| interruptible::namespace_default(label) == Ok(true))
    {
        let mut annotations = pod.clone();
        annotations.insert(INTERRUPTIBLE.into(), "true".into());
        Cow::Owned(annotations)
    } else {
        Cow::Borrowed(pod)
    }
}

/// Judges the pod's (or its Job's, or its namespace's) interruptible wish for `cloud`. `Err`:
/// the namespace label is malformed (the pod's own annotations were validated before).
pub(super) fn judge(
    effective: &Effective<'_>,
    namespace_labels: &BTreeMap<String, String>,
    cloud: Cloud,
    chose_cheapest: bool,
    gpus: u32,
    config: &PolicyConfig,
    prices: &BTreeMap<Cloud, GpuPrices>,
) -> Result<Judged, String> {
    let own = interruptible::interruptible_in(|key| effective.value(key))?;
    let said_by_pod = effective.get(INTERRUPTIBLE).is_some()
        || effective.get(interruptible::BID_PER_HOUR).is_some();
    let asked = match (own, said_by_pod, namespace_labels.get(INTERRUPTIBLE)) {
        (Some(asked), _, _) => Some((asked, false)),
        // The pod (or Job) said `false`: the namespace's default does not apply.
        (None, true, _) => None,
        (None, false, Some(label)) => interruptible::namespace_default(label)?
            .then_some((Interruptible { max_bid: None }, true)),
        (None, false, None) => None,
    };
    let Some((asked, from_namespace)) = asked else {
        return Ok(Judged::OnDemand);
    };
    if cloud == Cloud::RunPod {
        if from_namespace || chose_cheapest {
            return Ok(Judged::RunPodOnDemand(format!(
                "runpod-kubelet: {INTERRUPTIBLE} is set but this pod goes to RunPod, which has \
                 no interruptible capacity: it runs on-demand"
            )));
        }
        return Ok(Judged::Refused(format!(
            "{INTERRUPTIBLE} asks for an interruptible bid, which only Vast.ai offers (RunPod's \
             interruptible pods are leaving its API), but this pod goes to RunPod; set {} to \
             vastai or cheapest, or remove {INTERRUPTIBLE}",
            provider::PROVIDER
        )));
    }
    // What the node publishes: a bid's price for this pod, and the on-demand one beside it.
    let published = prices.get(&Cloud::VastAi);
    let mut values = effective.values();
    values.insert(INTERRUPTIBLE.to_owned(), "true".to_owned());
    let cheapest = |values: &BTreeMap<String, String>| {
        published
            .and_then(|published| {
                let effective = Effective::resolve(values, None);
                runpod_contract::gpus::pod_price::fits_on(
                    Cloud::VastAi,
                    &effective,
                    gpus,
                    config,
                    published,
                )
                .cheapest
            })
            .map(|fit| fit.per_hour)
    };
    let bid_from = cheapest(&values);
    values.remove(INTERRUPTIBLE);
    values.remove(interruptible::BID_PER_HOUR);
    let on_demand = cheapest(&values)
        .map(|price| format!(", where on-demand starts at {price:.3} USD/h"))
        .unwrap_or_default();
    let from = bid_from
        .map(|price| format!(" from {price:.3} USD/h"))
        .unwrap_or_default();
    let bid = match asked.max_bid {
        Some(ceiling) => format!("bids{from}, at most {ceiling} USD/h"),
        None => format!("bids{from}, a tenth over each machine's minimum bid"),
    };
    Ok(Judged::Bid {
        warning: format!(
            "runpod-kubelet: this pod runs on a Vast.ai interruptible bid ({bid}{on_demand}); \
             outbid, its instance is stopped and destroyed and the pod fails with condition \
             DisruptionTarget (restartPolicy Always: a new instance)"
        ),
        write_flag: from_namespace,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(
        pod: &[(&str, &str)],
        namespace: &[(&str, &str)],
        cloud: Cloud,
        cheapest: bool,
    ) -> Result<Judged, String> {
        let annotations: BTreeMap<String, String> = pod
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let labels: BTreeMap<String, String> = namespace
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let effective = Effective::resolve(&annotations, None);
        judge(
            &effective,
            &labels,
            cloud,
            cheapest,
            1,
            &PolicyConfig::default(),
            &BTreeMap::new(),
        )
    }

    #[test]
    fn a_bid_is_admitted_on_vastai_with_a_warning() {
        let Ok(Judged::Bid {
            warning,
            write_flag,
        }) = judged(&[(INTERRUPTIBLE, "0.3")], &[], Cloud::VastAi, false)
        else {
            panic!("not a bid");
        };
        assert!(!write_flag);
        assert!(warning.contains("at most 0.3 USD/h"), "{warning}");
        assert!(
            !warning.contains("on-demand starts"),
            "nothing published: {warning}"
        );
        assert!(warning.contains("DisruptionTarget"), "{warning}");
        let Ok(Judged::Bid { write_flag, .. }) =
            judged(&[], &[(INTERRUPTIBLE, "true")], Cloud::VastAi, false)
        else {
            panic!("the namespace's default");
        };
        assert!(write_flag, "the namespace's choice is written on the pod");
    }

    #[test]
    fn runpod_refuses_a_pods_own_wish_and_runs_a_namespaces_on_demand() {
        match judged(&[(INTERRUPTIBLE, "true")], &[], Cloud::RunPod, false) {
            Ok(Judged::Refused(message)) => {
                assert!(message.contains("only Vast.ai"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            judged(&[], &[(INTERRUPTIBLE, "true")], Cloud::RunPod, false),
            Ok(Judged::RunPodOnDemand(_))
        ));
        assert!(matches!(
            judged(&[(INTERRUPTIBLE, "true")], &[], Cloud::RunPod, true),
            Ok(Judged::RunPodOnDemand(_))
        ));
    }

    #[test]
    fn nothing_asked_or_false_is_on_demand_and_a_bad_label_is_named() {
        assert_eq!(judged(&[], &[], Cloud::VastAi, false), Ok(Judged::OnDemand));
        assert_eq!(
            judged(
                &[(INTERRUPTIBLE, "false")],
                &[(INTERRUPTIBLE, "true")],
                Cloud::VastAi,
                false
            ),
            Ok(Judged::OnDemand),
            "the pod's false wins over the namespace"
        );
        let problem = judged(&[], &[(INTERRUPTIBLE, "yes")], Cloud::VastAi, false).unwrap_err();
        assert!(problem.contains("namespace label"), "{problem}");
    }

    #[test]
    fn the_warning_shows_the_bid_beside_the_on_demand_price() {
        let annotations: BTreeMap<String, String> =
            [(INTERRUPTIBLE.to_owned(), "true".to_owned())].into();
        let effective = Effective::resolve(&annotations, None);
        let prices: BTreeMap<Cloud, GpuPrices> = [(
            Cloud::VastAi,
            GpuPrices::parse("RTX4090x1=0.4,RTX4090x1:INTERRUPTIBLE=0.22"),
        )]
        .into();
        let Ok(Judged::Bid { warning, .. }) = judge(
            &effective,
            &BTreeMap::new(),
            Cloud::VastAi,
            false,
            1,
            &PolicyConfig::default(),
            &prices,
        ) else {
            panic!("not a bid");
        };
        assert!(warning.contains("bids from 0.220 USD/h"), "{warning}");
        assert!(
            warning.contains("on-demand starts at 0.400 USD/h"),
            "{warning}"
        );
    }

    #[test]
    fn a_namespace_default_prices_a_silent_pod_as_interruptible() {
        let labels: BTreeMap<String, String> =
            [(INTERRUPTIBLE.to_owned(), "true".to_owned())].into();
        let silent = BTreeMap::new();
        let priced = with_namespace_default(&silent, &Effective::resolve(&silent, None), &labels);
        assert_eq!(
            priced.get(INTERRUPTIBLE).map(CompactString::as_str),
            Some("true")
        );
        let refuses: BTreeMap<CompactString, CompactString> =
            [(INTERRUPTIBLE.into(), "false".into())].into();
        let kept = with_namespace_default(&refuses, &Effective::resolve(&refuses, None), &labels);
        assert!(
            matches!(kept, Cow::Borrowed(_)),
            "nothing to add, nothing copied"
        );
        assert_eq!(
            kept.get(INTERRUPTIBLE).map(CompactString::as_str),
            Some("false")
        );
        let unlabelled = with_namespace_default(
            &silent,
            &Effective::resolve(&silent, None),
            &BTreeMap::new(),
        );
        assert!(unlabelled.is_empty());
    }
}
