//! NetworkPolicies that select a burst pod, as the bridge applies them to the TCP connections
//! it carries, rule by rule. Egress is judged per connection the pod opens, against the
//! endpoint the bridge would dial (its pod's labels, its namespace's labels, the port, its
//! address for `ipBlock`); ingress per connection a Service routes to the pod, against the
//! connection's source (the pod that has that address, or the address itself for `ipBlock`).
//! A peer the bridge cannot identify as a pod matches only `ipBlock` peers: fail closed.
//! Everything here is pure; `peers` finds who a peer is.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A peer that is a pod: what the rules' selectors and named ports are judged against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PeerPod {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub namespace_labels: BTreeMap<String, String>,
    /// Its containers' named TCP ports.
    pub ports: Vec<(String, u16)>,
    /// Its pod IPs (an endpoint naming it at another address is not taken to be it).
    pub ips: Vec<IpAddr>,
}

/// The other end of one connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer<'a> {
    /// Its address, where it has one the bridge sees (a burst pod has none).
    pub ip: Option<IpAddr>,
    /// The pod it is, where the bridge could tell.
    pub pod: Option<&'a PeerPod>,
}

/// One rule of a policy: peers (`from` or `to`; empty: any) and ports (empty: any).
#[derive(Debug, Clone, PartialEq)]
struct Rule {
    /// The policy's namespace: a peer's `podSelector` alone selects pods there.
    namespace: String,
    peers: Vec<NetworkPolicyPeer>,
    ports: Vec<NetworkPolicyPort>,
}

/// The policies restricting one direction of one pod: a connection is carried when any of
/// their rules allows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Restriction {
    /// The policies' names, for the Event.
    pub by: Vec<String>,
    rules: Vec<Rule>,
}

/// What the policies selecting one pod let the bridge carry (`None`: that direction is not
/// restricted).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Verdict {
    /// The pod's outbound connections to the cluster's Services.
    pub egress: Option<Restriction>,
    /// Connections from the cluster's Services to the pod.
    pub ingress: Option<Restriction>,
}

impl Restriction {
    /// No rule allows anything: nothing in this direction is carried.
    pub(crate) fn denies_all(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether some rule names pods (the peer must then be looked up).
    pub(crate) fn names_pods(&self) -> bool {
        self.rules.iter().any(|rule| {
            rule.peers
                .iter()
                .any(|p| p.pod_selector.is_some() || p.namespace_selector.is_some())
        })
    }

    /// Whether some rule names a port (judged against the ports of the pod it refers to).
    pub(crate) fn names_ports(&self) -> bool {
        self.rules.iter().any(|rule| {
            rule.ports
                .iter()
                .any(|p| matches!(p.port, Some(IntOrString::String(_))))
        })
    }

    /// Whether some rule has an `ipBlock` peer (judged against the address the bridge sees).
    pub(crate) fn has_ip_blocks(&self) -> bool {
        self.rules
            .iter()
            .any(|rule| rule.peers.iter().any(|p| p.ip_block.is_some()))
    }

    /// Whether a TCP connection with `peer` on `port` (the port of the pod the rule's port
    /// names refer to: the destination's for egress, the selected pod's for ingress; `names`
    /// are that pod's named ports) is allowed.
    pub(crate) fn allows(&self, peer: Peer<'_>, port: u16, names: &[(String, u16)]) -> bool {
        self.rules.iter().any(|rule| {
            let port_ok =
                rule.ports.is_empty() || rule.ports.iter().any(|p| port_matches(p, port, names));
            let peer_ok = rule.peers.is_empty()
                || rule
                    .peers
                    .iter()
                    .any(|p| peer_matches(p, &rule.namespace, peer));
            port_ok && peer_ok
        })
    }
}

fn port_matches(rule: &NetworkPolicyPort, port: u16, names: &[(String, u16)]) -> bool {
    if rule.protocol.as_deref().unwrap_or("TCP") != "TCP" {
        return false;
    }
    match &rule.port {
        None => true,
        Some(IntOrString::Int(first)) => {
            let last = rule.end_port.unwrap_or(*first);
            (*first..=last).contains(&i32::from(port))
        }
        Some(IntOrString::String(name)) => names.iter().any(|(n, p)| n == name && *p == port),
    }
}

fn peer_matches(rule: &NetworkPolicyPeer, namespace: &str, peer: Peer<'_>) -> bool {
    if let Some(block) = &rule.ip_block {
        return peer
            .ip
            .is_some_and(|ip| in_block(ip, &block.cidr, block.except.as_deref()));
    }
    let Some(pod) = peer.pod else {
        return false;
    };
    match (&rule.namespace_selector, &rule.pod_selector) {
        (None, None) => false,
        (None, Some(pods)) => pod.namespace == namespace && matches(pods, &pod.labels),
        (Some(namespaces), pods) => {
            matches(namespaces, &pod.namespace_labels)
                && pods.as_ref().is_none_or(|s| matches(s, &pod.labels))
        }
    }
}

/// Whether `ip` is in `cidr` and in none of `except` (an unreadable CIDR contains nothing).
fn in_block(ip: IpAddr, cidr: &str, except: Option<&[String]>) -> bool {
    let within = |cidr: &str| {
        cidr.parse::<ipnet::IpNet>()
            .is_ok_and(|net| net.contains(&ip.to_canonical()))
    };
    within(cidr) && !except.unwrap_or_default().iter().any(|e| within(e))
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

/// The named TCP ports of a pod's containers.
pub(crate) fn named_ports(pod: &Pod) -> Vec<(String, u16)> {
    pod.spec
        .iter()
        .flat_map(|spec| spec.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.container_port).ok()?)))
        .collect()
}

/// The policies in `policies` that select `pod`, and the rules of each direction they restrict.
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
        let namespace = policy.metadata.namespace.clone().unwrap_or_default();
        let types: Vec<&str> = match &spec.policy_types {
            Some(types) => types.iter().map(String::as_str).collect(),
            None if spec.egress.is_some() => vec!["Ingress", "Egress"],
            None => vec!["Ingress"],
        };
        let rule = |peers: &Option<Vec<NetworkPolicyPeer>>,
                    ports: &Option<Vec<NetworkPolicyPort>>| Rule {
            namespace: namespace.clone(),
            peers: peers.clone().unwrap_or_default(),
            ports: ports.clone().unwrap_or_default(),
        };
        if types.contains(&"Egress") {
            let rules = spec.egress.iter().flatten().map(|r| rule(&r.to, &r.ports));
            restrict(&mut verdict.egress, &name, rules);
        }
        if types.contains(&"Ingress") {
            let rules = spec
                .ingress
                .iter()
                .flatten()
                .map(|r| rule(&r.from, &r.ports));
            restrict(&mut verdict.ingress, &name, rules);
        }
    }
    verdict
}

/// Adds a policy's rules to what restricts one direction.
fn restrict(direction: &mut Option<Restriction>, policy: &str, rules: impl Iterator<Item = Rule>) {
    let restriction = direction.get_or_insert_with(Restriction::default);
    restriction.by.push(policy.to_owned());
    restriction.rules.extend(rules);
}

#[cfg(test)]
mod tests;
