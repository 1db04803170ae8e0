//! The bridge's NetworkPolicy check for each connection it carries: the pure rules of
//! `policy`, and who the peer is. A peer is found by the pod an endpoint names (`targetRef`,
//! or the burst pod behind a listener) or, for a connection to the pod, by its source address
//! (the pod that has it); both are read from the apiserver and kept a few seconds, so a burst
//! of connections costs one lookup. A lookup that fails names no pod: rules naming pods do not
//! match it (fail closed).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::reflector::{ObjectRef, Store};

use super::policy::{self, Peer, PeerPod, Restriction, Verdict};

/// How long who a peer is stays known (a pod relabelled is judged anew after this).
const FRESH: Duration = Duration::from_secs(5);
/// Peers kept at most (beyond it, the stale ones go, then all).
const MAX_KEPT: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Address(IpAddr),
    Pod(String, String),
}

/// Who a peer was found to be (no pod: none, or the lookup failed), and when.
type Known = (Instant, Option<Arc<PeerPod>>);

/// Finds which pod a peer is.
pub(crate) struct Peers {
    client: kube::Client,
    namespaces: Store<Namespace>,
    kept: Mutex<HashMap<Key, Known>>,
}

impl Peers {
    pub(crate) fn new(client: kube::Client, namespaces: Store<Namespace>) -> Peers {
        Peers {
            client,
            namespaces,
            kept: Mutex::default(),
        }
    }

    fn recall(&self, key: &Key) -> Option<Option<Arc<PeerPod>>> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.get(key)
            .filter(|(at, _)| at.elapsed() < FRESH)
            .map(|(_, pod)| pod.clone())
    }

    fn keep(&self, key: Key, pod: Option<Arc<PeerPod>>) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= MAX_KEPT {
            kept.retain(|_, (at, _)| at.elapsed() < FRESH);
            if kept.len() >= MAX_KEPT {
                kept.clear();
            }
        }
        kept.insert(key, (Instant::now(), pod));
    }

    fn describe(&self, pod: &Pod) -> PeerPod {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let namespace_labels = self
            .namespaces
            .get(&ObjectRef::new(&namespace))
            .and_then(|ns| ns.metadata.labels.clone())
            .unwrap_or_default();
        PeerPod {
            namespace,
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            namespace_labels,
            ports: policy::named_ports(pod),
            ips: pod
                .status
                .iter()
                .flat_map(|s| s.pod_ips.iter().flatten().map(|ip| ip.ip.clone()))
                .chain(pod.status.as_ref().and_then(|s| s.pod_ip.clone()))
                .filter_map(|ip| ip.parse::<IpAddr>().ok())
                .map(|ip| ip.to_canonical())
                .collect(),
        }
    }

    /// The pod `namespace/name`, if it exists.
    async fn named(&self, namespace: &str, name: &str) -> Option<Arc<PeerPod>> {
        let key = Key::Pod(namespace.to_owned(), name.to_owned());
        if let Some(known) = self.recall(&key) {
            return known;
        }
        let found = match Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
        {
            Ok(pod) => pod.map(|pod| Arc::new(self.describe(&pod))),
            Err(error) => {
                tracing::warn!(namespace, pod = name, %error, "could not read a peer pod for NetworkPolicy rules; rules naming pods do not match it");
                return None;
            }
        };
        self.keep(key, found.clone());
        found
    }

    /// The pod whose address is `ip` (not a host-network pod, which shares its node's
    /// address; none where several have it).
    async fn at(&self, ip: IpAddr) -> Option<Arc<PeerPod>> {
        let key = Key::Address(ip);
        if let Some(known) = self.recall(&key) {
            return known;
        }
        let params = ListParams::default().fields(&format!("status.podIP={ip}"));
        let found = match Api::<Pod>::all(self.client.clone()).list(&params).await {
            Ok(list) => {
                let mut pods = list.items.into_iter().filter(|pod| {
                    !pod.spec
                        .as_ref()
                        .and_then(|s| s.host_network)
                        .unwrap_or(false)
                });
                match (pods.next(), pods.next()) {
                    (Some(pod), None) => Some(Arc::new(self.describe(&pod))),
                    _ => None,
                }
            }
            Err(error) => {
                tracing::warn!(%ip, %error, "could not find the pod of a peer address for NetworkPolicy rules; rules naming pods do not match it");
                return None;
            }
        };
        self.keep(key, found.clone());
        found
    }
}

/// One place a connection to a Service's port may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Where the bridge dials.
    pub dial: std::net::SocketAddr,
    /// The endpoint's own address, judged by `ipBlock` (a burst pod has none).
    pub ip: Option<IpAddr>,
    /// The pod it is (`namespace`, `name`): the endpoint's `targetRef`, or the burst pod.
    pub pod: Option<(String, String)>,
    /// The pod's port the connection reaches (the rules' ports are judged on it).
    pub port: u16,
}

/// One bridge's policy: what the rounds last judged for its pod, and who peers are.
pub(crate) struct Guard {
    verdict: RwLock<Verdict>,
    /// The bridged pod's named ports (an ingress rule's named port is the pod's own).
    own_ports: RwLock<Vec<(String, u16)>>,
    peers: Arc<Peers>,
}

impl Guard {
    pub(crate) fn new(peers: Arc<Peers>) -> Guard {
        Guard {
            verdict: RwLock::default(),
            own_ports: RwLock::default(),
            peers,
        }
    }

    /// The policies now selecting the pod, and the pod's named ports.
    pub(crate) fn set(&self, verdict: Verdict, own_ports: Vec<(String, u16)>) {
        *self.verdict.write().unwrap_or_else(|e| e.into_inner()) = verdict;
        *self.own_ports.write().unwrap_or_else(|e| e.into_inner()) = own_ports;
    }

    fn egress(&self) -> Option<Restriction> {
        self.verdict
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .egress
            .clone()
    }

    /// Whether the pod may open a connection to `candidate`.
    async fn allows_to(&self, restriction: &Restriction, candidate: &Candidate) -> bool {
        if restriction.denies_all() {
            return false;
        }
        let pod = match &candidate.pod {
            Some((namespace, name)) if restriction.names_pods() || restriction.names_ports() => {
                self.peers.named(namespace, name).await
            }
            _ => None,
        };
        // A hand-written Endpoints may name any pod: it is that pod only at one of its IPs.
        let pod = pod.filter(|pod| candidate.ip.is_none_or(|ip| pod.ips.contains(&ip)));
        let names = pod.as_ref().map(|p| p.ports.clone()).unwrap_or_default();
        let peer = Peer {
            ip: candidate.ip,
            pod: pod.as_deref(),
        };
        restriction.allows(peer, candidate.port, &names)
    }

    /// Where one of the pod's connections goes: one of `groups` (a Service's local endpoints
    /// and its burst pods) picked at even odds, then a random candidate in it that the pod's
    /// egress rules allow (the other group when none is).
    pub(crate) async fn choose(&self, groups: [Vec<Candidate>; 2]) -> Option<Candidate> {
        let [mut first, mut second] = groups;
        if fastrand::bool() {
            std::mem::swap(&mut first, &mut second);
        }
        let restriction = self.egress();
        for mut group in [first, second] {
            fastrand::shuffle(&mut group);
            for candidate in group {
                let allowed = match &restriction {
                    None => true,
                    Some(restriction) => self.allows_to(restriction, &candidate).await,
                };
                if allowed {
                    return Some(candidate);
                }
            }
        }
        None
    }

    /// Whether a connection from `source` may reach the pod's `port`.
    pub(crate) async fn allows_from(&self, source: IpAddr, port: u16) -> bool {
        let restriction = self
            .verdict
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .ingress
            .clone();
        let Some(restriction) = restriction else {
            return true;
        };
        if restriction.denies_all() {
            return false;
        }
        let source = source.to_canonical();
        let pod = if restriction.names_pods() {
            self.peers.at(source).await
        } else {
            None
        };
        let names = self
            .own_ports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let peer = Peer {
            ip: Some(source),
            pod: pod.as_deref(),
        };
        restriction.allows(peer, port, &names)
    }
}
