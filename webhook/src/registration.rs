//! The MutatingWebhookConfiguration that routes pods to this webhook, defined once for the demo,
//! the tests and (rendered as YAML) the chart. Two entries share one `/mutate` path: one selects
//! opted-in namespaces, one opted-in pods; pods that opted in neither way never reach the webhook,
//! so they can never be blocked by it (`failurePolicy: Fail` is safe).

use std::collections::BTreeSet;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use crate::contract;

/// Where the apiserver reaches the webhook.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// A URL (a webhook running outside the cluster, as in tests and the demo).
    Url(String),
    /// An in-cluster Service.
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
}

/// Inputs of the registration.
#[derive(Debug, Clone)]
pub struct Registration {
    pub name: String,
    pub endpoint: Endpoint,
    /// `None` leaves `caBundle` out, for a configuration whose bundle another writer owns
    /// (the chart: `runpod-kubelet certs` patches it with its own field manager).
    pub ca_bundle_pem: Option<Vec<u8>>,
    /// `Fail` (the default; safe because only opted-in pods reach the webhook) or `Ignore`.
    pub failure_policy: String,
    /// Never sent to the webhook; `kube-system` and a Service endpoint's namespace (the
    /// webhook's own) are always added.
    pub excluded_namespaces: Vec<String>,
    pub timeout_seconds: i32,
    /// Adds [`MATCH_CONDITION`] (apiservers 1.28 and later): of the opted-in pods, only those
    /// the webhook may change are sent, so an outage no longer blocks a namespace's CPU pods.
    pub match_conditions: bool,
}

/// The name of the one match condition.
pub const MATCH_CONDITION_NAME: &str = "gpu-pods-and-pods-that-name-runpod-kubelet";

/// A pod the webhook may change: one that asks for a GPU (any container, limits or requests),
/// carries an annotation of ours (a burst mode, an offload, or a controller-owned one to strip),
/// or belongs to a Job (whose annotations may set the mode). Everything else passes untouched
/// by [`crate::policy::decide`], so it need not be sent at all (a test holds the two together).
pub const MATCH_CONDITION: &str = "object.spec.containers.exists(c, has(c.resources) && \
((has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits) || \
(has(c.resources.requests) && 'nvidia.com/gpu' in c.resources.requests))) || \
(has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && \
((has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits) || \
(has(c.resources.requests) && 'nvidia.com/gpu' in c.resources.requests)))) || \
(has(object.metadata.annotations) && object.metadata.annotations.exists(k, \
k.startsWith('runpod.io/') || k.startsWith('vast.ai/'))) || \
(has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, \
o.kind == 'Job'))";

/// Label the apiserver (1.21+) sets on every namespace; on older servers it is absent and the
/// webhook's own `--exclude-namespaces` check does the job.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

pub fn mutating_webhook_configuration(registration: &Registration) -> MutatingWebhookConfiguration {
    let client_config = WebhookClientConfig {
        ca_bundle: registration.ca_bundle_pem.clone().map(ByteString),
        url: match &registration.endpoint {
            Endpoint::Url(url) => Some(url.clone()),
            Endpoint::Service { .. } => None,
        },
        service: match &registration.endpoint {
            Endpoint::Service {
                namespace,
                name,
                port,
            } => Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some("/mutate".to_owned()),
                port: Some(*port),
            }),
            Endpoint::Url(_) => None,
        },
    };
    let not_excluded = requirement(NAMESPACE_NAME_LABEL, "NotIn", &excluded(registration));
    let entry = |name: &str, namespace_selector: LabelSelector, object_selector: LabelSelector| {
        MutatingWebhook {
            name: format!("{name}.{}", registration.name),
            admission_review_versions: vec!["v1".to_owned()],
            client_config: client_config.clone(),
            failure_policy: Some(registration.failure_policy.clone()),
            match_policy: Some("Equivalent".to_owned()),
            namespace_selector: Some(namespace_selector),
            object_selector: Some(object_selector),
            reinvocation_policy: Some("IfNeeded".to_owned()),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".to_owned()]),
                operations: Some(vec!["CREATE".to_owned()]),
                resources: Some(vec!["pods".to_owned()]),
                scope: Some("Namespaced".to_owned()),
            }]),
            side_effects: "None".to_owned(),
            timeout_seconds: Some(registration.timeout_seconds),
            match_conditions: registration.match_conditions.then(|| {
                vec![MatchCondition {
                    name: MATCH_CONDITION_NAME.to_owned(),
                    expression: MATCH_CONDITION.to_owned(),
                }]
            }),
        }
    };
    let opted_in_namespace = LabelSelector {
        match_labels: Some(
            [(
                contract::BURST_LABEL.to_owned(),
                contract::BURST_ENABLED.to_owned(),
            )]
            .into(),
        ),
        match_expressions: Some(vec![not_excluded.clone()]),
    };
    let not_opted_out_pod = LabelSelector {
        match_expressions: Some(vec![requirement(
            contract::BURST_LABEL,
            "NotIn",
            &[contract::BURST_DISABLED.to_owned()],
        )]),
        ..LabelSelector::default()
    };
    let any_namespace = LabelSelector {
        match_expressions: Some(vec![not_excluded]),
        ..LabelSelector::default()
    };
    let opted_in_pod = LabelSelector {
        match_labels: Some(
            [(
                contract::BURST_LABEL.to_owned(),
                contract::BURST_ENABLED.to_owned(),
            )]
            .into(),
        ),
        ..LabelSelector::default()
    };
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(registration.name.clone()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![
            entry("namespaces", opted_in_namespace, not_opted_out_pod),
            entry("pods", any_namespace, opted_in_pod),
        ]),
    }
}

/// The namespaces to leave out, sorted and without duplicates.
fn excluded(registration: &Registration) -> Vec<String> {
    let mut namespaces: BTreeSet<String> = registration
        .excluded_namespaces
        .iter()
        .map(|namespace| namespace.trim().to_owned())
        .filter(|namespace| !namespace.is_empty())
        .collect();
    namespaces.insert(contract::SYSTEM_NAMESPACE.to_owned());
    if let Endpoint::Service { namespace, .. } = &registration.endpoint {
        namespaces.insert(namespace.clone());
    }
    namespaces.into_iter().collect()
}

fn requirement(key: &str, operator: &str, values: &[String]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.to_owned(),
        operator: operator.to_owned(),
        values: Some(values.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_entries_select_namespaces_and_pods_and_never_fail_open_to_everything() {
        let config = mutating_webhook_configuration(&Registration {
            name: "burst.runpod.io".into(),
            endpoint: Endpoint::Url("https://127.0.0.1:8443/mutate".into()),
            ca_bundle_pem: Some(b"PEM".to_vec()),
            failure_policy: "Fail".into(),
            excluded_namespaces: vec!["kube-system".into(), "runpod-system".into()],
            timeout_seconds: 10,
            match_conditions: false,
        });
        let value = serde_json::to_value(&config).unwrap();
        let hooks = value["webhooks"].as_array().unwrap();
        assert_eq!(hooks.len(), 2);
        assert_eq!(
            hooks[0]["namespaceSelector"]["matchLabels"]["runpod.io/burst"],
            "enabled"
        );
        assert_eq!(
            hooks[0]["objectSelector"]["matchExpressions"][0]["values"][0],
            "disabled"
        );
        assert_eq!(
            hooks[1]["objectSelector"]["matchLabels"]["runpod.io/burst"],
            "enabled"
        );
        for hook in hooks {
            assert_eq!(hook["failurePolicy"], "Fail");
            assert_eq!(hook["sideEffects"], "None");
            assert_eq!(hook["reinvocationPolicy"], "IfNeeded");
            assert_eq!(hook["clientConfig"]["url"], "https://127.0.0.1:8443/mutate");
            assert_eq!(hook["rules"][0]["operations"][0], "CREATE");
            let excluded = &hook["namespaceSelector"]["matchExpressions"][0];
            assert_eq!(excluded["operator"], "NotIn");
            assert_eq!(excluded["values"][1], "runpod-system");
        }
    }
}
