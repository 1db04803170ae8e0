//! Whether this pod may get an instance from this node, judged once per pod by this leader:
//! the webhook's opt-in rule and the checks it can repeat, and the namespace's binding to a
//! node. Reads the namespace (and, for a binding, the other virtual nodes).

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use runpod_contract as contract;

use crate::controller::context::Shared;
use crate::controller::eligibility::{self, Judged, Refusal};
use crate::controller::pods::ReconcileError;
use crate::provider::Provider;

/// Why this pod must get no instance, judged once per pod by this leader: the webhook's
/// opt-in rule and the checks it can repeat (see `eligibility`).
pub(super) async fn eligibility<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
) -> Result<Option<Refusal>, ReconcileError> {
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(contract::BURST_LABEL))
        .cloned();
    let now = Timestamp::now();
    if let Some(judged) = ctx.remember(uid, |m| m.refusal.clone())
        && judged.still_holds(label.as_deref(), now)
    {
        return Ok(judged.refusal);
    }
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let name = pod.metadata.namespace.as_deref().unwrap_or("default");
    // The namespace's labels: its opt-in and its node binding.
    let labels = match namespaces.get_metadata_opt(name).await {
        Ok(namespace) => namespace
            .and_then(|ns| ns.metadata.labels)
            .unwrap_or_default(),
        // A pod that opts in itself is judged without them (manifests from an older chart),
        // unless nodes are bound to teams: then the namespace's binding must be known.
        Err(kube::Error::Api(status))
            if status.code == 403
                && !eligibility::needs_namespace_labels(pod)
                && ctx.settings.serve_namespaces.is_empty()
                && ctx.settings.admission.namespace_nodes.is_empty() =>
        {
            Default::default()
        }
        Err(error) => match error {
            // Said on the pod rather than retried in silence (manifests from an older chart).
            kube::Error::Api(status) if status.code == 403 => {
                return Ok(Some(Refusal {
                    reason: "NamespaceUnreadable",
                    message: format!(
                        "the controller may not read namespace {name} to check its opt-in \
                         label and node binding (RBAC: namespaces get); grant it, or give the \
                         pod the label {}={}",
                        contract::BURST_LABEL,
                        contract::BURST_ENABLED
                    ),
                    fail: false,
                }));
            }
            error => return Err(error.into()),
        },
    };
    let why_not_here = wrong_node(ctx, name, &labels).await?;
    let refusal = eligibility::refusal(
        pod,
        &labels,
        &ctx.settings.admission,
        ctx.provider.cloud(),
        why_not_here,
    );
    ctx.remember(uid, |m| {
        m.refusal = Some(Judged {
            refusal: refusal.clone(),
            label,
            at: now,
        })
    });
    Ok(refusal)
}

/// Why this node must not run pods of `namespace`, if it must not: the namespace's label
/// `runpod.io/node`, else the nodes listing it (this node's own list from its flags, the
/// others' from their annotations).
async fn wrong_node<P: Provider>(
    ctx: &Shared<P>,
    namespace: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<Option<String>, ReconcileError> {
    use runpod_contract::teams::{self, Served};
    let label = labels.get(teams::NODE_LABEL).map(String::as_str);
    let node = &ctx.settings.node_name;
    let serves = &ctx.settings.serve_namespaces;
    let installed = &ctx.settings.admission.namespace_nodes;
    let mut nodes = vec![Served {
        node: node.clone(),
        namespaces: serves.clone(),
    }];
    let listed = |nodes: &[Served]| {
        nodes
            .iter()
            .any(|served| served.namespaces.iter().any(|ns| ns == namespace))
    };
    if !listed(&nodes) && !listed(installed) {
        // Only another node listing the namespace can bind it now (a label may not override
        // that node's list, so it is looked for with a label too).
        let all: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.client.clone());
        let listed = all
            .list_metadata(&kube::api::ListParams::default().labels("type=virtual-kubelet"))
            .await?;
        nodes.extend(
            listed
                .items
                .iter()
                .filter(|other| other.metadata.name.as_deref() != Some(node))
                .map(|other| {
                    Served::parse(
                        other.metadata.name.as_deref().unwrap_or_default(),
                        other
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(teams::SERVES_NAMESPACES))
                            .map(String::as_str),
                    )
                }),
        );
    }
    // The nodes' own lists first, then the installation's (a node that is not registered).
    let nodes = teams::with_more(nodes, installed);
    let binding = teams::binding(namespace, label, &nodes);
    Ok(teams::may_run(namespace, &binding, node, serves).err())
}
