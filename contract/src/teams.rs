//! A node per team: which virtual node may run a namespace's burst pods, so that one team's pod
//! never bills another team's key. The installation's lists are an allow-list: a node that
//! lists namespaces (`--serve-namespaces`, the chart's `nodes[].namespaces`, published on the
//! node as `runpod.io/serves-namespaces`) serves exactly those, and a node without a list
//! serves the namespaces no list names. A namespace's label `runpod.io/node` may only narrow
//! that choice: whoever may label a namespace must not be able to bill another team's key. The
//! webhook selects the node; every controller refuses pods of namespaces it does not serve,
//! however they reached its node.

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
    /// Nowhere: the namespace's label names a node the installation does not let serve it.
    Refused(String),
}

/// The binding of `namespace`: the node listing it, else the nodes listing none; its label
/// picks among those and is refused when it names a node outside them.
pub fn binding(namespace: &str, label: Option<&str>, nodes: &[Served]) -> Binding {
    let label = label.map(str::trim).filter(|node| !node.is_empty());
    let listing = nodes
        .iter()
        .find(|served| served.namespaces.iter().any(|ns| ns == namespace));
    match (label, listing) {
        (Some(node), Some(served)) if node == served.node => Binding::Node {
            node: node.to_owned(),
            by_label: true,
        },
        (Some(node), Some(served)) => Binding::Refused(format!(
            "namespace {namespace}'s label {NODE_LABEL}={node} names a node that does not \
             serve it: the installation binds it to node {} ({SERVES_NAMESPACES}); a label may \
             only choose among the nodes that serve the namespace",
            served.node
        )),
        (None, Some(served)) => Binding::Node {
            node: served.node.clone(),
            by_label: false,
        },
        (Some(node), None) => match nodes
            .iter()
            .find(|served| served.node == node && !served.namespaces.is_empty())
        {
            Some(served) => Binding::Refused(format!(
                "namespace {namespace}'s label {NODE_LABEL}={node} names a node that does not \
                 serve it: node {node} serves only namespaces {} (the installation's list); a \
                 label may only choose among the nodes that serve the namespace",
                served.namespaces.join(", ")
            )),
            // A node without a list (or not known yet) serves the namespaces no list names.
            None => Binding::Node {
                node: node.to_owned(),
                by_label: true,
            },
        },
        (None, None) => Binding::Unbound,
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
        Binding::Refused(why) => Err(why.clone()),
        Binding::Unbound if serves.is_empty() => Ok(()),
        Binding::Unbound => Err(format!(
            "node {node} serves only namespaces {} and namespace {namespace} is bound to no \
             node: add it to this node's namespaces (--serve-namespaces, the chart's \
             nodes[].namespaces) to run its pods here",
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
        let cases: [(&str, Option<&str>, &str, bool); 13] = [
            ("team-a", None, "team-a-node", true),
            ("team-a-dev", None, "team-a-node", true),
            ("team-a", None, "team-b-node", false),
            ("team-a", None, "shared", false),
            ("other", None, "shared", true),
            ("other", None, "team-a-node", false),
            // A label only narrows: it cannot hand a namespace to a node that lists others.
            ("other", Some("team-b-node"), "team-b-node", false),
            ("other", Some("team-b-node"), "shared", false),
            ("team-a", Some("shared"), "shared", false),
            ("team-a", Some("shared"), "team-a-node", false),
            ("team-a", Some("team-a-node"), "team-a-node", true),
            ("other", Some("shared"), "shared", true),
            ("other", Some("shared"), "team-b-node", false),
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
        assert!(message.contains("--serve-namespaces"), "{message}");
    }

    /// Issue 41, item 8: namespace `other` labelled with team B's node is refused by team B's
    /// node, with a message naming why.
    #[test]
    fn a_label_cannot_bill_another_teams_key() {
        let nodes = nodes();
        let bound = binding("other", Some("team-b-node"), &nodes);
        let message = may_run("other", &bound, "team-b-node", &["team-b".to_owned()]).unwrap_err();
        assert!(
            message.contains("serves only namespaces team-b"),
            "{message}"
        );
        assert!(message.contains("runpod.io/node=team-b-node"), "{message}");
        // Team B's node as its controller sees it: itself and the installation's lists only.
        let own = [Served::parse("team-b-node", Some("team-b"))];
        assert!(matches!(
            binding("other", Some("team-b-node"), &own),
            Binding::Refused(_)
        ));
        let taken = binding("team-a", Some("team-b-node"), &nodes);
        assert!(
            matches!(&taken, Binding::Refused(why) if why.contains("team-a-node")),
            "{taken:?}"
        );
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
