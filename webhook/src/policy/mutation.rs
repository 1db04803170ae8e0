//! The mutation of an admitted pod, decided on the typed pod and applied to the raw JSON the
//! apiserver sent (so fields unknown to our API types survive and the patch touches only what
//! changes).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use serde_json::{Map, Value, json};

use crate::contract::{self, BurstMode};

/// Changes to make to a pod; the default changes nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mutation {
    pub set_annotations: BTreeMap<String, String>,
    pub remove_annotations: Vec<String>,
    pub add_toleration: bool,
    pub set_node_selector: BTreeMap<String, String>,
    pub prefer_local_nodes: bool,
}

impl Mutation {
    pub fn is_empty(&self) -> bool {
        *self == Mutation::default()
    }

    /// The pod with this mutation applied. Parents that are missing (or null) are created.
    pub fn apply(&self, raw: &Value) -> Value {
        let mut pod = raw.clone();
        if self.is_empty() {
            return pod;
        }
        if !self.set_annotations.is_empty() || !self.remove_annotations.is_empty() {
            let annotations = object_at(&mut pod, &["metadata", "annotations"]);
            for key in &self.remove_annotations {
                annotations.remove(key);
            }
            for (key, value) in &self.set_annotations {
                annotations.insert(key.clone(), Value::String(value.clone()));
            }
        }
        if self.add_toleration {
            array_at(&mut pod, &["spec", "tolerations"]).push(provider_toleration_json());
        }
        if !self.set_node_selector.is_empty() {
            let selector = object_at(&mut pod, &["spec", "nodeSelector"]);
            for (key, value) in &self.set_node_selector {
                selector.insert(key.clone(), Value::String(value.clone()));
            }
        }
        if self.prefer_local_nodes {
            array_at(
                &mut pod,
                &[
                    "spec",
                    "affinity",
                    "nodeAffinity",
                    "preferredDuringSchedulingIgnoredDuringExecution",
                ],
            )
            .push(local_preference_json());
        }
        pod
    }
}

/// Adds what makes the scheduler place the pod per its mode, skipping what is already there.
pub(super) fn schedule_onto_runpod(
    pod: &Pod,
    mode: BurstMode,
    mutation: &mut Mutation,
    warnings: &mut Vec<String>,
) {
    let spec = pod.spec.as_ref();
    let tolerations = spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    mutation.add_toleration = !tolerations.iter().any(tolerates_provider_taint);
    match mode {
        BurstMode::Always => {
            let existing = spec.and_then(|s| s.node_selector.as_ref());
            for (key, value) in [
                (contract::NODE_TYPE_LABEL, contract::NODE_TYPE_VALUE),
                (contract::PROVIDER_TAINT_KEY, contract::PROVIDER_TAINT_VALUE),
            ] {
                match existing.and_then(|selector| selector.get(key)) {
                    Some(current) if current == value => {}
                    current => {
                        if let Some(current) = current {
                            warnings.push(format!(
                                "runpod-kubelet: nodeSelector {key}={current} replaced by \
                                 {key}={value} (burst mode always)"
                            ));
                        }
                        mutation
                            .set_node_selector
                            .insert(key.to_owned(), value.to_owned());
                    }
                }
            }
        }
        BurstMode::Fallback => {
            let preferred = spec
                .and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                });
            let wanted = local_preference_json();
            let present = preferred.into_iter().flatten().any(|term| {
                serde_json::to_value(term)
                    .is_ok_and(|value| value["preference"] == wanted["preference"])
            });
            mutation.prefer_local_nodes = !present;
        }
        BurstMode::Never => {}
    }
}

/// Kubernetes' toleration matching, for the provider's NoSchedule taint.
fn tolerates_provider_taint(toleration: &Toleration) -> bool {
    let effect_matches = toleration
        .effect
        .as_deref()
        .is_none_or(|effect| effect.is_empty() || effect == "NoSchedule");
    let key = toleration.key.as_deref().unwrap_or_default();
    let operator = toleration.operator.as_deref().unwrap_or("Equal");
    let key_matches = match (key.is_empty(), operator) {
        (true, "Exists") => true,
        (false, "Exists") => key == contract::PROVIDER_TAINT_KEY,
        (false, "Equal") => {
            key == contract::PROVIDER_TAINT_KEY
                && toleration.value.as_deref().unwrap_or_default() == contract::PROVIDER_TAINT_VALUE
        }
        _ => false,
    };
    effect_matches && key_matches
}

fn provider_toleration_json() -> Value {
    json!({
        "key": contract::PROVIDER_TAINT_KEY,
        "operator": "Equal",
        "value": contract::PROVIDER_TAINT_VALUE,
        "effect": "NoSchedule",
    })
}

/// Prefer nodes that are not virtual-kubelet nodes.
fn local_preference_json() -> Value {
    json!({
        "weight": 100,
        "preference": {
            "matchExpressions": [{
                "key": contract::NODE_TYPE_LABEL,
                "operator": "NotIn",
                "values": [contract::NODE_TYPE_VALUE],
            }],
        },
    })
}

/// The object at `path`, creating objects (replacing nulls and non-objects) on the way.
fn object_at<'a>(root: &'a mut Value, path: &[&str]) -> &'a mut Map<String, Value> {
    let mut current = root;
    for key in path {
        current = ensure_object(current)
            .entry((*key).to_owned())
            .or_insert(Value::Null);
    }
    ensure_object(current)
}

fn array_at<'a>(root: &'a mut Value, path: &[&str]) -> &'a mut Vec<Value> {
    let (last, parents) = match path.split_last() {
        Some(split) => split,
        None => return ensure_array(root),
    };
    let parent = object_at(root, parents);
    ensure_array(parent.entry((*last).to_owned()).or_insert(Value::Null))
}

fn ensure_object(value: &mut Value) -> &mut Map<String, Value> {
    if !value.is_object() {
        *value = Value::Object(Map::new());
    }
    match value {
        Value::Object(map) => map,
        _ => unreachable!("just made an object"),
    }
}

fn ensure_array(value: &mut Value) -> &mut Vec<Value> {
    if !value.is_array() {
        *value = Value::Array(Vec::new());
    }
    match value {
        Value::Array(items) => items,
        _ => unreachable!("just made an array"),
    }
}
