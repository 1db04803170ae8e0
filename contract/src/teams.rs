//! A node per team: which virtual node may run a namespace's burst pods, so that one team's pod
//! never bills another team's key. A namespace is bound by its label `runpod.io/node` or by a
//! node that lists it (`--serve-namespaces`, the chart's `nodes[].namespaces`, published on the
//! node as `runpod.io/serves-namespaces`). The webhook selects the node; every controller
//! refuses pods of namespaces bound elsewhere, however they reached its node.

use std::collections::BTreeMap;

use crate::provider::Cloud;

/// Namespace label: the virtual node that runs the namespace's burst pods.
pub const NODE_LABEL: &str = "runpod.io/node";
/// Node annotation (written by its controller): the namespaces it serves, comma-separated;
/// empty when it serves the namespaces bound to no node.
pub const SERVES_NAMESPACES: &str = "runpod.io/serves-namespaces";
/// The reason of a pod refused by a node its namespace is not bound to.
pub const WRONG_NODE: &str = "WrongNode";

/// A virtual node and the namespaces it lists (empty: it serves unbound namespaces).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub node: String,
    pub namespaces: Vec<String>,
}

impl Served {
    /// From the node's annotation.
    pub fn parse(node: &str, annotation: Option<&str>) -> Self {
        Self {
            node: node.to_owned(),
            namespaces: annotation
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|ns| !ns.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }
}

/// The installation's bindings as the chart gives them to every component
/// (`--namespace-nodes team-a=team-a-node@runpod,team-b=team-b-node@vastai`): known even while a
/// node is not registered, so a team's namespace is never taken for unbound while its node is
/// down, nor sent to the wrong cloud. Each node's cloud, when given, comes second.
pub type Assignments = (Vec<Served>, BTreeMap<String, Cloud>);

/// Reads `--namespace-nodes`.
pub fn parse_assignments(items: &[String]) -> Result<Assignments, String> {
    let mut nodes: Vec<Served> = Vec::new();
    let mut clouds = BTreeMap::new();
    for item in items.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
        let Some((namespace, node)) = item
            .split_once('=')
            .map(|(ns, node)| (ns.trim(), node.trim()))
            .filter(|(ns, node)| !ns.is_empty() && !node.is_empty())
        else {
            return Err(format!("{item:?} is not NAMESPACE=NODE[@CLOUD]"));
        };
        let node = match node.split_once('@') {
            Some((node, cloud)) => {
                let cloud = Cloud::parse(cloud.trim())
                    .ok_or_else(|| format!("{item:?}: {cloud:?} is not runpod or vastai"))?;
                clouds.insert(node.trim().to_owned(), cloud);
                node.trim()
            }
            None => node,
        };
        match nodes.iter_mut().find(|served| served.node == node) {
            Some(served) => served.namespaces.push(namespace.to_owned()),
            None => nodes.push(Served {
                node: node.to_owned(),
                namespaces: vec![namespace.to_owned()],
            }),
        }
    }
    Ok((nodes, clouds))
}

/// `known` with the nodes of `more` it does not name yet (a node's own word comes first).
pub fn with_more(mut known: Vec<Served>, more: &[Served]) -> Vec<Served> {
    for served in more {
        if !known.iter().any(|k| k.node == served.node) {
            known.push(served.clone());
        }
    }
    known
}

/// Where a namespace's pods may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// On this node only; `by_label` says how it was bound (for messages).
    Node { node: String, by_label: bool },
    /// On nodes that list no namespaces (all of them when none does).
    Unbound,
}

/// The binding of `namespace`: its label first, then the first node listing it.
pub fn binding(namespace: &str, label: Option<&str>, nodes: &[Served]) -> Binding {
    if let Some(node) = label.map(str::trim).filter(|node| !node.is_empty()) {
        return Binding::Node {
            node: node.to_owned(),
            by_label: true,
        };
    }
    match nodes
        .iter()
        .find(|served| served.namespaces.iter().any(|ns| ns == namespace))
    {
        Some(served) => Binding::Node {
            node: served.node.clone(),
            by_label: false,
        },
        None => Binding::Unbound,
    }
}

/// Whether `node` (listing `serves`) may run pods of `namespace` bound as `binding`; `Err`
/// says why not, for the `WrongNode` Event.
pub fn may_run(
    namespace: &str,
    binding: &Binding,
    node: &str,
    serves: &[String],
) -> Result<(), String> {
    match binding {
        Binding::Node { node: bound, .. } if bound == node => Ok(()),
        Binding::Node {
            node: bound,
            by_label,
        } => Err(format!(
            "namespace {namespace} is bound to node {bound} ({}), not {node}: its pods run and \
             bill there only",
            if *by_label {
                format!("its label {NODE_LABEL}")
            } else {
                format!("that node serves it, {SERVES_NAMESPACES}")
            }
        )),
        Binding::Unbound if serves.is_empty() => Ok(()),
        Binding::Unbound => Err(format!(
            "node {node} serves only namespaces {} and namespace {namespace} is bound to no \
             node: label it {NODE_LABEL}={node} to run its pods here",
            serves.join(", ")
        )),
    }
}

/// The nodes an unbound namespace's pods may go to: those listing no namespaces, sorted (the
/// node cache has no order, and every webhook replica must write the same term); `None` when
/// no node lists any (no restriction).
pub fn unbound_nodes(nodes: &[Served]) -> Option<Vec<String>> {
    nodes
        .iter()
        .any(|served| !served.namespaces.is_empty())
        .then(|| {
            let mut unbound: Vec<String> = nodes
                .iter()
                .filter(|served| served.namespaces.is_empty())
                .map(|served| served.node.clone())
                .collect();
            unbound.sort();
            unbound.dedup();
            unbound
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<Served> {
        vec![
            Served::parse("team-a-node", Some("team-a, team-a-dev")),
            Served::parse("shared", None),
            Served::parse("team-b-node", Some("team-b")),
        ]
    }

    #[test]
    fn the_binding_table() {
        let nodes = nodes();
        let cases: [(&str, Option<&str>, &str, bool); 9] = [
            ("team-a", None, "team-a-node", true),
            ("team-a-dev", None, "team-a-node", true),
            ("team-a", None, "team-b-node", false),
            ("team-a", None, "shared", false),
            ("other", None, "shared", true),
            ("other", None, "team-a-node", false),
            ("other", Some("team-b-node"), "team-b-node", true),
            ("other", Some("team-b-node"), "shared", false),
            ("team-a", Some("shared"), "shared", true),
        ];
        for (namespace, label, node, allowed) in cases {
            let bound = binding(namespace, label, &nodes);
            let serves = &nodes
                .iter()
                .find(|served| served.node == node)
                .map(|served| served.namespaces.clone())
                .unwrap_or_default();
            assert_eq!(
                may_run(namespace, &bound, node, serves).is_ok(),
                allowed,
                "{namespace} ({label:?}) on {node}"
            );
        }
    }

    #[test]
    fn refusals_name_where_the_pods_belong() {
        let nodes = nodes();
        let message =
            may_run("team-a", &binding("team-a", None, &nodes), "shared", &[]).unwrap_err();
        assert!(message.contains("team-a-node"), "{message}");
        let message = may_run(
            "other",
            &binding("other", None, &nodes),
            "team-b-node",
            &["team-b".to_owned()],
        )
        .unwrap_err();
        assert!(message.contains("runpod.io/node=team-b-node"), "{message}");
    }

    #[test]
    fn the_installations_bindings_parse_by_node() {
        let (parsed, clouds) = parse_assignments(&[
            "team-a=team-a-node@runpod".to_owned(),
            " team-a-dev = team-a-node@runpod ".to_owned(),
            "team-b=team-b-node@vastai".to_owned(),
        ])
        .unwrap();
        assert_eq!(clouds["team-b-node"], Cloud::VastAi);
        assert!(parse_assignments(&["a=b@aws".to_owned()]).is_err());
        assert_eq!(
            parsed,
            vec![
                Served::parse("team-a-node", Some("team-a,team-a-dev")),
                Served::parse("team-b-node", Some("team-b")),
            ]
        );
        assert!(parse_assignments(&["team-a".to_owned()]).is_err());
        assert!(parse_assignments(&["=node".to_owned()]).is_err());
        // A registered node's own list wins over the installation's.
        let merged = with_more(vec![Served::parse("team-a-node", Some("x"))], &parsed);
        assert_eq!(merged[0].namespaces, vec!["x".to_owned()]);
        assert_eq!(merged.len(), 2);
    }

    #[test]
    fn unbound_namespaces_avoid_listing_nodes_once_any_lists() {
        assert_eq!(unbound_nodes(&nodes()), Some(vec!["shared".to_owned()]));
        let unordered = [
            Served::parse("z", None),
            Served::parse("team", Some("t")),
            Served::parse("a", None),
        ];
        assert_eq!(
            unbound_nodes(&unordered),
            Some(vec!["a".to_owned(), "z".to_owned()])
        );
        assert_eq!(unbound_nodes(&[Served::parse("a", Some(""))]), None);
    }
}
