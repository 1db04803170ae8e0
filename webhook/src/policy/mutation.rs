//! The mutation of an admitted pod, decided on the typed pod and expressed as the JSON Patch
//! operations that touch only what changes.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::contract::{self, BurstMode};
use crate::pod::{NodeSelectorTermView, PodView, PreferredTermView, TolerationView};
use runpod_contract::provider::Cloud;

/// Changes to make to a pod; the default changes nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mutation {
    pub set_annotations: BTreeMap<String, String>,
    pub remove_annotations: Vec<String>,
    pub add_toleration: bool,
    /// The cloud whose virtual node the toleration and node selector name.
    pub cloud: Cloud,
    pub set_node_selector: BTreeMap<String, String>,
    pub prefer_local_nodes: bool,
    /// Indices in `spec.tolerations` to remove (what an earlier review of ours added).
    pub remove_tolerations: Vec<usize>,
    /// Indices in the preferred node-affinity terms to remove.
    pub remove_preferred_terms: Vec<usize>,
    /// Keys of `spec.nodeSelector` to remove.
    pub remove_node_selector: Vec<String>,
    /// The pod's required node affinity with its namespace's node binding in every term
    /// ([`pinned_terms`]).
    pub require_nodes: Option<Value>,
}

/// One JSON Patch operation, serialised as it is sent: a struct, not a `serde_json::Value`
/// object, so a review does not allocate a map and its keys for each operation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Op {
    op: &'static str,
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<OpValue>,
}

/// What an `add` puts at its path; what this webhook always adds the same way is typed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
enum OpValue {
    Text(String),
    Members(BTreeMap<String, String>),
    Json(Value),
    Toleration(ProviderToleration),
    Tolerations([ProviderToleration; 1]),
    Preference(LocalPreference),
    Preferences([LocalPreference; 1]),
    NodeAffinity(NodeAffinity),
    Affinity {
        #[serde(rename = "nodeAffinity")]
        node_affinity: NodeAffinity,
    },
}

/// The toleration of `cloud`'s virtual-node taint, as added to a pod.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct ProviderToleration {
    key: &'static str,
    operator: &'static str,
    value: &'static str,
    effect: &'static str,
}

impl ProviderToleration {
    fn of(cloud: Cloud) -> Self {
        Self {
            key: contract::PROVIDER_TAINT_KEY,
            operator: "Equal",
            value: cloud.as_str(),
            effect: "NoSchedule",
        }
    }
}

/// The preferred node-affinity term for nodes that are not virtual-kubelet nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct LocalPreference {
    weight: i32,
    preference: LocalTerm,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct LocalTerm {
    #[serde(rename = "matchExpressions")]
    match_expressions: [LocalExpression; 1],
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct LocalExpression {
    key: &'static str,
    operator: &'static str,
    values: [&'static str; 1],
}

impl LocalPreference {
    fn new() -> Self {
        Self {
            weight: LOCAL_PREFERENCE_WEIGHT,
            preference: LocalTerm {
                match_expressions: [LocalExpression {
                    key: contract::NODE_TYPE_LABEL,
                    operator: "NotIn",
                    values: [contract::NODE_TYPE_VALUE],
                }],
            },
        }
    }
}

/// A pod's new `nodeAffinity`: the local preference, the node binding, or both.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct NodeAffinity {
    #[serde(
        rename = "preferredDuringSchedulingIgnoredDuringExecution",
        skip_serializing_if = "Option::is_none"
    )]
    preferred: Option<[LocalPreference; 1]>,
    #[serde(
        rename = "requiredDuringSchedulingIgnoredDuringExecution",
        skip_serializing_if = "Option::is_none"
    )]
    required: Option<Value>,
}

impl Mutation {
    /// The JSON Patch operations for this mutation of `pod`. Built from the pod as reviewed, so
    /// a missing (or null) parent gets one `add` of the whole parent and existing ones get
    /// `add`s of their members; keys are escaped as JSON Pointer tokens.
    pub fn patch(&self, pod: &PodView) -> Vec<Op> {
        let mut ops = Vec::new();
        let annotations = pod.meta().annotations.as_ref();
        for key in &self.remove_annotations {
            ops.push(remove(&["metadata", "annotations", key]));
        }
        if !self.set_annotations.is_empty() {
            if pod.metadata.is_none() {
                // No metadata object (or a null one): there is no `/metadata` to add into.
                ops.push(add(
                    &["metadata"],
                    json!({"annotations": self.set_annotations}),
                ));
            } else {
                add_members(
                    &mut ops,
                    &["metadata", "annotations"],
                    annotations.is_some(),
                    &self.set_annotations,
                );
            }
        }
        self.removals(&mut ops);
        let spec = pod.spec.as_ref();
        let changes_spec = self.add_toleration
            || !self.set_node_selector.is_empty()
            || self.prefer_local_nodes
            || self.require_nodes.is_some();
        if changes_spec && spec.is_none() {
            ops.push(add(&["spec"], json!({})));
        }
        if self.add_toleration {
            let toleration = ProviderToleration::of(self.cloud);
            // Appended to the list, or the whole list where there is none.
            ops.push(if spec.is_some_and(|s| s.tolerations.is_some()) {
                add_value(
                    &["spec", "tolerations", "-"],
                    OpValue::Toleration(toleration),
                )
            } else {
                add_value(&["spec", "tolerations"], OpValue::Tolerations([toleration]))
            });
        }
        if !self.set_node_selector.is_empty() {
            let present = spec.is_some_and(|s| s.node_selector.is_some());
            add_members(
                &mut ops,
                &["spec", "nodeSelector"],
                present,
                &self.set_node_selector,
            );
        }
        self.affinity(spec, &mut ops);
        ops
    }

    /// The node-affinity additions (the local preference, the node binding), in one `add` where
    /// their parent is missing.
    fn affinity(&self, spec: Option<&crate::pod::SpecView>, ops: &mut Vec<Op>) {
        if !self.prefer_local_nodes && self.require_nodes.is_none() {
            return;
        }
        let affinity = spec.and_then(|s| s.affinity.as_ref());
        let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
        let members = || NodeAffinity {
            preferred: self.prefer_local_nodes.then(|| [LocalPreference::new()]),
            required: self.require_nodes.clone(),
        };
        match (affinity, node_affinity) {
            (None, _) => ops.push(add_value(
                &["spec", "affinity"],
                OpValue::Affinity {
                    node_affinity: members(),
                },
            )),
            (Some(_), None) => ops.push(add_value(
                &["spec", "affinity", "nodeAffinity"],
                OpValue::NodeAffinity(members()),
            )),
            (Some(_), Some(node_affinity)) => {
                let preferred = node_affinity
                    .preferred_during_scheduling_ignored_during_execution
                    .as_ref();
                if self.prefer_local_nodes {
                    ops.push(match preferred {
                        None => add_value(
                            &["spec", "affinity", "nodeAffinity", PREFERRED],
                            OpValue::Preferences([LocalPreference::new()]),
                        ),
                        Some(_) => add_value(
                            &["spec", "affinity", "nodeAffinity", PREFERRED, "-"],
                            OpValue::Preference(LocalPreference::new()),
                        ),
                    });
                }
                if let Some(required) = &self.require_nodes {
                    // `add` of an existing member replaces it.
                    ops.push(add(
                        &["spec", "affinity", "nodeAffinity", REQUIRED],
                        required.clone(),
                    ));
                }
            }
        }
    }

    /// Removals, highest index first so that each index still points at its item.
    fn removals(&self, ops: &mut Vec<Op>) {
        let mut tolerations = self.remove_tolerations.clone();
        tolerations.sort_unstable_by(|a, b| b.cmp(a));
        for index in tolerations {
            let index = index.to_string();
            ops.push(remove(&["spec", "tolerations", &index]));
        }
        let mut terms = self.remove_preferred_terms.clone();
        terms.sort_unstable_by(|a, b| b.cmp(a));
        for index in terms {
            let index = index.to_string();
            ops.push(remove(&[
                "spec",
                "affinity",
                "nodeAffinity",
                PREFERRED,
                &index,
            ]));
        }
        for key in &self.remove_node_selector {
            ops.push(remove(&["spec", "nodeSelector", key]));
        }
    }
}

const PREFERRED: &str = "preferredDuringSchedulingIgnoredDuringExecution";
const REQUIRED: &str = "requiredDuringSchedulingIgnoredDuringExecution";

/// The pod's required node affinity with the node binding `hosts` (by `kubernetes.io/hostname`)
/// added into each of its own terms: in `always` mode only those nodes; otherwise those nodes
/// or any local node (`type NotIn virtual-kubelet`), so a `fallback` pod still runs locally.
/// `None` when every term carries a binding already (a second review).
pub(super) fn pinned_terms(pod: &PodView, mode: BurstMode, hosts: &[String]) -> Option<Value> {
    let host = json!({"key": HOSTNAME_LABEL, "operator": "In", "values": hosts});
    let local = json!({"key": contract::NODE_TYPE_LABEL, "operator": "NotIn",
        "values": [contract::NODE_TYPE_VALUE]});
    let alternatives: Vec<Value> = if mode == BurstMode::Always {
        vec![host]
    } else {
        vec![local, host]
    };
    let existing: Vec<Value> = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .and_then(|required| required.get("nodeSelectorTerms"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let expressions = |term: &Value| -> Vec<Value> {
        term.get("matchExpressions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    // Ours exactly: a term of the user's naming other nodes is no binding of ours.
    let binds = |expression: &Value| *expression == alternatives[alternatives.len() - 1];
    let already = !existing.is_empty()
        && existing
            .iter()
            .any(|term| expressions(term).iter().any(binds))
        && existing.iter().all(|term| {
            expressions(term)
                .iter()
                .any(|e| binds(e) || (mode != BurstMode::Always && alternatives[0] == *e))
        });
    if already {
        return None;
    }
    let own = if existing.is_empty() {
        vec![json!({})]
    } else {
        existing
    };
    let mut terms = Vec::new();
    for term in &own {
        for alternative in &alternatives {
            let mut term = term.clone();
            let mut all = expressions(&term);
            all.push(alternative.clone());
            if let Some(object) = term.as_object_mut() {
                object.insert("matchExpressions".to_owned(), Value::Array(all));
            }
            terms.push(term);
        }
    }
    Some(json!({"nodeSelectorTerms": terms}))
}

/// Every node's own name, as kubelets (and our virtual nodes) label it.
pub(super) const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Adds what makes the scheduler place the pod per its mode, skipping what is already there.
pub(super) fn schedule_onto_cloud(
    pod: &PodView,
    mode: BurstMode,
    cloud: Cloud,
    mutation: &mut Mutation,
    warnings: &mut Vec<String>,
) {
    let spec = pod.spec.as_ref();
    let tolerations = spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    // `delayed` pods wait for a local GPU: the offloader adds the toleration when it moves them.
    mutation.cloud = cloud;
    mutation.add_toleration = matches!(mode, BurstMode::Always | BurstMode::Fallback)
        && !tolerations
            .iter()
            .any(|t| tolerates_provider_taint(t, cloud));
    match mode {
        BurstMode::Always => {
            let existing = spec.and_then(|s| s.node_selector.as_ref());
            for (key, value) in our_node_selector(cloud) {
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
        BurstMode::Fallback | BurstMode::Delayed => {
            let preferred = spec
                .and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                });
            let present = preferred
                .into_iter()
                .flatten()
                .any(|term| is_our_preference_term(&term.preference));
            mutation.prefer_local_nodes = !present;
        }
        BurstMode::Never => {}
    }
}

/// The toleration exactly as this webhook adds it ([`ProviderToleration`]): these four
/// fields and no `tolerationSeconds`.
pub(super) fn is_our_toleration(toleration: &TolerationView) -> bool {
    toleration.key.as_deref() == Some(contract::PROVIDER_TAINT_KEY)
        && toleration.operator.as_deref() == Some("Equal")
        && toleration
            .value
            .as_deref()
            .and_then(Cloud::parse)
            .is_some_and(|cloud| toleration.value.as_deref() == Some(cloud.as_str()))
        && toleration.effect.as_deref() == Some("NoSchedule")
        && toleration.toleration_seconds.is_none()
}

/// The preferred node-affinity term exactly as this webhook adds it ([`LocalPreference`]).
pub(super) fn is_our_preference(term: &PreferredTermView) -> bool {
    term.weight == LOCAL_PREFERENCE_WEIGHT && is_our_preference_term(&term.preference)
}

/// The `preference` of [`LocalPreference`]: one `NotIn` expression on the node type.
fn is_our_preference_term(term: &NodeSelectorTermView) -> bool {
    let [expression] = term.match_expressions.as_deref().unwrap_or_default() else {
        return false;
    };
    term.match_fields.is_none()
        && expression.key == contract::NODE_TYPE_LABEL
        && expression.operator == "NotIn"
        && expression
            .values
            .as_deref()
            .is_some_and(|values| values == [contract::NODE_TYPE_VALUE])
}

/// The node selector entries `always` mode adds for `cloud`.
pub(super) fn our_node_selector(cloud: Cloud) -> [(&'static str, &'static str); 2] {
    [
        (contract::NODE_TYPE_LABEL, contract::NODE_TYPE_VALUE),
        (contract::PROVIDER_TAINT_KEY, cloud.as_str()),
    ]
}

/// Kubernetes' toleration matching, for the NoSchedule taint of `cloud`'s node.
fn tolerates_provider_taint(toleration: &TolerationView, cloud: Cloud) -> bool {
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
                && toleration.value.as_deref().unwrap_or_default() == cloud.as_str()
        }
        _ => false,
    };
    effect_matches && key_matches
}

const LOCAL_PREFERENCE_WEIGHT: i32 = 100;

fn add(path: &[&str], value: Value) -> Op {
    add_value(path, OpValue::Json(value))
}

fn add_value(path: &[&str], value: OpValue) -> Op {
    Op {
        op: "add",
        path: pointer(path),
        value: Some(value),
    }
}

fn remove(path: &[&str]) -> Op {
    Op {
        op: "remove",
        path: pointer(path),
        value: None,
    }
}

/// Adds map entries: the whole map when it is missing, else one member at a time.
fn add_members(
    ops: &mut Vec<Op>,
    path: &[&str],
    present: bool,
    entries: &BTreeMap<String, String>,
) {
    if present {
        for (key, value) in entries {
            let mut member = path.to_vec();
            member.push(key);
            ops.push(add_value(&member, OpValue::Text(value.clone())));
        }
    } else {
        ops.push(add_value(path, OpValue::Members(entries.clone())));
    }
}

/// A JSON Pointer (RFC 6901) from unescaped tokens.
fn pointer(tokens: &[&str]) -> String {
    let length = tokens.iter().map(|token| token.len() + 1).sum();
    let mut pointer = String::with_capacity(length);
    for token in tokens {
        pointer.push('/');
        if !token.contains(['~', '/']) {
            pointer.push_str(token);
            continue;
        }
        for c in token.chars() {
            match c {
                '~' => pointer.push_str("~0"),
                '/' => pointer.push_str("~1"),
                c => pointer.push(c),
            }
        }
    }
    pointer
}

#[cfg(test)]
mod tests {
    use super::pointer;

    /// RFC 6901: `~` is written `~0` and `/` is written `~1`, plain tokens as they are.
    #[test]
    fn pointers_escape_tilde_and_slash() {
        assert_eq!(
            pointer(&["metadata", "annotations"]),
            "/metadata/annotations"
        );
        assert_eq!(
            pointer(&["a~b/c", "runpod.io/ports"]),
            "/a~0b~1c/runpod.io~1ports"
        );
        assert_eq!(pointer(&["~1", ""]), "/~01/");
        assert_eq!(pointer(&[]), "");
    }
}
