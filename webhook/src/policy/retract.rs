//! What an earlier review of ours left on a pod. With `reinvocationPolicy: IfNeeded` another
//! webhook (a sidecar injector: Istio, Linkerd, Vault agent) may change the pod after our first
//! review and have us called again; if the pod is then one RunPod cannot run, the toleration and
//! node selection we added would still let it onto the virtual node.

use crate::pod::PodView;
use runpod_contract::provider::Cloud;

use super::mutation::{self, Mutation};

/// Our scheduling changes found on a pod, by their exact form.
#[derive(Debug, Default)]
pub(super) struct EarlierReview {
    tolerations: Vec<usize>,
    preferred_terms: Vec<usize>,
    node_selector: Vec<String>,
}

/// Our earlier changes, when the pod carries our toleration together with our preferred node
/// affinity (fallback) or our whole node selector (always). The pair is the signature of our
/// review: a user's own toleration alone is left alone.
pub(super) fn earlier_review(pod: &PodView) -> Option<EarlierReview> {
    let spec = pod.spec.as_ref()?;
    let tolerations: Vec<usize> = spec
        .tolerations
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, toleration)| mutation::is_our_toleration(toleration))
        .map(|(index, _)| index)
        .collect();
    let preferred_terms: Vec<usize> = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, term)| mutation::is_our_preference(term))
        .map(|(index, _)| index)
        .collect();
    let selector = spec.node_selector.as_ref();
    let pinned_to = Cloud::ALL.into_iter().find(|cloud| {
        mutation::our_node_selector(*cloud)
            .iter()
            .all(|(key, value)| {
                selector
                    .and_then(|selector| selector.get(*key))
                    .is_some_and(|current| current == value)
            })
    });
    let pinned = pinned_to.is_some();
    let node_selector = match pinned_to {
        Some(cloud) => mutation::our_node_selector(cloud)
            .iter()
            .map(|(key, _)| (*key).to_owned())
            .collect(),
        None => Vec::new(),
    };
    let ours = !tolerations.is_empty() && (!preferred_terms.is_empty() || pinned);
    ours.then_some(EarlierReview {
        tolerations,
        preferred_terms,
        node_selector,
    })
}

impl EarlierReview {
    /// Takes back everything found, so that the pod really stays on local nodes.
    pub(super) fn retract(self, mutation: &mut Mutation) {
        mutation.remove_tolerations = self.tolerations;
        mutation.remove_preferred_terms = self.preferred_terms;
        mutation.remove_node_selector = self.node_selector;
    }
}

/// Said in warnings and refusals, so users look for the other webhook.
pub(super) const CHANGED_AFTER_REVIEW: &str = "it was changed after runpod-kubelet's first \
     review, by another webhook (a sidecar injector such as Istio, Linkerd or Vault agent); \
     keep that webhook away from this pod or set runpod.io/burst-mode: never";
