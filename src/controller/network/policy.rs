//! NetworkPolicies that select a burst pod, as the bridge honours them today: fail closed. A
//! direction (egress: the pod's outbound connections; ingress: what Services route to it) that
//! a policy restricts is carried only when every such policy allows everything in it (an empty
//! rule `{}`); any other rule is one the bridge does not judge yet, so it carries nothing in
//! that direction and says so in an Event, rather than ignore the policy.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// What the policies selecting one pod let the bridge carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Policies that restrict the pod's outbound connections with rules the bridge does not
    /// judge (outbound is then not carried).
    pub egress_blocked_by: Vec<String>,
    /// Likewise for connections to the pod (its EndpointSlices are then not written).
    pub ingress_blocked_by: Vec<String>,
}

/// Whether `selector` matches `labels` (matchLabels and matchExpressions; an empty selector
/// matches everything).
pub(crate) fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_label = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expression = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // An operator this version does not know matches nothing: fail closed.
            _ => false,
        }
    });
    by_label && by_expression
}

/// The policies in `policies` that select `pod`, and what they leave the bridge to carry.
pub(crate) fn judge(pod: &Pod, policies: &[std::sync::Arc<NetworkPolicy>]) -> Verdict {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let mut verdict = Verdict::default();
    for policy in policies {
        if policy.metadata.namespace != pod.metadata.namespace {
            continue;
        }
        let Some(spec) = &policy.spec else {
            continue;
        };
        // An absent podSelector is the empty one: every pod of the namespace.
        if !spec
            .pod_selector
            .as_ref()
            .is_none_or(|selector| matches(selector, labels))
        {
            continue;
        }
        let name = policy.metadata.name.clone().unwrap_or_default();
        let types: Vec<&str> = match &spec.policy_types {
            Some(types) => types.iter().map(String::as_str).collect(),
            None if spec.egress.is_some() => vec!["Ingress", "Egress"],
            None => vec!["Ingress"],
        };
        if types.contains(&"Egress") && !spec.egress.iter().flatten().any(allows_all_egress) {
            verdict.egress_blocked_by.push(name.clone());
        }
        if types.contains(&"Ingress") && !spec.ingress.iter().flatten().any(allows_all_ingress) {
            verdict.ingress_blocked_by.push(name);
        }
    }
    verdict
}

fn allows_all_egress(rule: &NetworkPolicyEgressRule) -> bool {
    rule.to.as_ref().is_none_or(Vec::is_empty) && rule.ports.as_ref().is_none_or(Vec::is_empty)
}

fn allows_all_ingress(rule: &NetworkPolicyIngressRule) -> bool {
    rule.from.as_ref().is_none_or(Vec::is_empty) && rule.ports.as_ref().is_none_or(Vec::is_empty)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "team", "labels": {"app": "web", "tier": "gpu"}}
        }))
        .unwrap()
    }

    fn policy(name: &str, spec: serde_json::Value) -> Arc<NetworkPolicy> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "team"},
                "spec": spec
            }))
            .unwrap(),
        )
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels = pod().metadata.labels.unwrap();
        let selector = |value| serde_json::from_value::<LabelSelector>(value).unwrap();
        assert!(matches(&selector(json!({})), &labels));
        assert!(matches(
            &selector(json!({"matchLabels": {"app": "web"}})),
            &labels
        ));
        assert!(!matches(
            &selector(json!({"matchLabels": {"app": "db"}})),
            &labels
        ));
        assert!(matches(
            &selector(json!({"matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gpu", "cpu"]},
                {"key": "zone", "operator": "DoesNotExist"},
                {"key": "app", "operator": "NotIn", "values": ["db"]}
            ]})),
            &labels
        ));
        assert!(!matches(
            &selector(
                json!({"matchExpressions": [{"key": "app", "operator": "Exists"}, {"key": "x", "operator": "Exists"}]})
            ),
            &labels
        ));
        assert!(!matches(
            &selector(
                json!({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]})
            ),
            &labels
        ));
    }

    #[test]
    fn restricting_policies_block_their_direction_and_allow_all_rules_do_not() {
        let policies = [
            // Default deny of everything for every pod of the namespace.
            policy(
                "deny-all",
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
            ),
            // Allows all egress: nothing blocked by it.
            policy(
                "egress-open",
                json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}),
            ),
            // A rule with peers the bridge does not judge.
            policy(
                "from-frontend",
                json!({"podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "frontend"}}}]}]}),
            ),
            // Selects other pods only.
            policy(
                "db-only",
                json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Egress"]}),
            ),
        ];
        let verdict = judge(&pod(), &policies);
        assert_eq!(verdict.egress_blocked_by, ["deny-all"]);
        assert_eq!(verdict.ingress_blocked_by, ["deny-all", "from-frontend"]);
        let open = judge(&pod(), &policies[1..2]);
        assert_eq!(open, Verdict::default());
        // Another namespace's policy never selects the pod.
        let mut elsewhere = (*policies[0]).clone();
        elsewhere.metadata.namespace = Some("other".into());
        assert_eq!(judge(&pod(), &[Arc::new(elsewhere)]), Verdict::default());
    }
}
