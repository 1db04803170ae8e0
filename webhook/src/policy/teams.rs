//! Teams at admission: which virtual nodes a namespace's pods may go to (its node binding). The
//! controllers enforce it before every create; the webhook refuses early and selects the node.

use runpod_contract::provider::Cloud;
use runpod_contract::teams::{self, Binding};

use super::{Context, PolicyConfig};
use crate::pod::PodView;

/// Where a namespace's burst pods may go.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Placement {
    /// Any node of the pod's cloud (no binding applies).
    Anywhere,
    /// Only these nodes (name, and cloud where the node is registered).
    Nodes {
        hosts: Vec<(String, Option<Cloud>)>,
        why: String,
    },
    /// No node may run them: why.
    Nowhere(String),
}

/// The namespace's binding, from its label and the nodes' lists. A pod that names its node
/// (`spec.nodeName`) is not bound here: that node's controller judges it.
pub(super) fn placement(
    pod: &PodView,
    namespace: &str,
    context: &Context,
    config: &PolicyConfig,
) -> Placement {
    let named = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.node_name.as_deref())
        .is_some_and(|node| !node.is_empty());
    if named {
        return Placement::Anywhere;
    }
    // The nodes' own lists first, then the installation's (a node not registered yet).
    let served = teams::with_more(
        context.served.iter().map(|(_, s)| s.clone()).collect(),
        &config.namespace_nodes,
    );
    // The registered node's cloud, else the installation's word for it.
    let cloud_of = |node: &str| {
        context
            .served
            .iter()
            .find(|(_, s)| s.node == node)
            .map(|(cloud, _)| *cloud)
            .or_else(|| config.node_clouds.get(node).copied())
    };
    let label = context
        .namespace_labels
        .get(teams::NODE_LABEL)
        .map(String::as_str);
    match teams::binding(namespace, label, &served) {
        Binding::Node { node, by_label } => Placement::Nodes {
            hosts: vec![(node.clone(), cloud_of(&node))],
            why: if by_label {
                format!(
                    "namespace {namespace} is bound to node {node} (label {})",
                    teams::NODE_LABEL
                )
            } else {
                format!("namespace {namespace} is served by node {node}")
            },
        },
        Binding::Refused(why) => Placement::Nowhere(why),
        Binding::Unbound => match teams::unbound_nodes(&served) {
            None => Placement::Anywhere,
            Some(nodes) if nodes.is_empty() => Placement::Nowhere(format!(
                "namespace {namespace} is bound to no node and every virtual node serves only \
                 the namespaces it lists: add it to a node's namespaces (the chart's \
                 nodes[].namespaces); a {} label alone cannot bind it to such a node",
                teams::NODE_LABEL
            )),
            Some(nodes) => Placement::Nodes {
                hosts: nodes
                    .iter()
                    .map(|node| (node.clone(), cloud_of(node)))
                    .collect(),
                why: format!(
                    "namespace {namespace} is bound to no node, so it goes to the nodes serving \
                     unbound namespaces ({})",
                    nodes.join(", ")
                ),
            },
        },
    }
}

/// The one cloud a placement allows, when all its known nodes are of one cloud.
pub(super) fn only_cloud(placement: &Placement) -> Option<Cloud> {
    let Placement::Nodes { hosts, .. } = placement else {
        return None;
    };
    let mut clouds = hosts.iter().filter_map(|(_, cloud)| *cloud);
    let first = clouds.next()?;
    clouds.all(|cloud| cloud == first).then_some(first)
}

/// The nodes of `cloud` the pod must be pinned to (`None`: no binding), or why it cannot go
/// anywhere.
pub(super) fn hosts_on(placement: &Placement, cloud: Cloud) -> Result<Option<Vec<String>>, String> {
    match placement {
        Placement::Anywhere => Ok(None),
        Placement::Nowhere(why) => Err(why.clone()),
        Placement::Nodes { hosts, why } => {
            let fitting: Vec<String> = hosts
                .iter()
                .filter(|(_, node_cloud)| node_cloud.is_none_or(|c| c == cloud))
                .map(|(node, _)| node.clone())
                .collect();
            if fitting.is_empty() {
                Err(format!(
                    "{why}, which runs on another cloud than {}: remove the pod's cloud choice \
                     or ask the platform team for a node of that cloud",
                    cloud.display_name()
                ))
            } else {
                Ok(Some(fitting))
            }
        }
    }
}
