//! A Service's ready endpoints, read from its core/v1 Endpoints (served by every apiserver this
//! project supports): which TCP ports it has, and where one connection to a port goes.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::RwLock;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::runtime::reflector::{ObjectRef, Store};
use runpod_contract::network::{ServiceKey, ServiceView};

use super::bridge;
use super::guard::Candidate;

/// The plan's view of a Service: its TCP ports and whether any has a ready address.
pub fn service_view(service: &Service, endpoints: Option<&Endpoints>) -> Option<ServiceView> {
    let key = ServiceKey {
        namespace: service.metadata.namespace.clone()?,
        name: service.metadata.name.clone()?,
    };
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    let tcp_ports: Vec<u16> = spec
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| u16::try_from(p.port).ok())
        .collect();
    let ready = endpoints.is_some_and(|e| {
        e.subsets
            .iter()
            .flatten()
            .any(|s| s.addresses.as_ref().is_some_and(|a| !a.is_empty()))
    });
    Some(ServiceView {
        key,
        tcp_ports,
        ready,
    })
}

/// The ready addresses for `port` of `service`: the endpoint port named as the Service port is
/// (or the only one, for a Service with one unnamed port). An address in `never` (the
/// apiserver's, every Service's cluster IP, the controller's own: Endpoints can be written by
/// hand, and must not turn the bridge into a way to them) or a loopback, link-local or
/// unspecified address is never one, on any port.
pub(super) fn endpoints_for(
    service: &Service,
    endpoints: &Endpoints,
    port: u16,
    never: &HashSet<IpAddr>,
) -> Vec<Candidate> {
    let Some(service_port) = service
        .spec
        .as_ref()
        .and_then(|spec| spec.ports.as_ref())
        .and_then(|ports| {
            ports.iter().find(|p| {
                p.port == i32::from(port) && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
            })
        })
    else {
        return Vec::new();
    };
    let wanted = service_port.name.as_deref().unwrap_or("");
    endpoints
        .subsets
        .iter()
        .flatten()
        .filter_map(|subset| {
            let port = subset.ports.as_ref()?.iter().find(|p| {
                p.name.as_deref().unwrap_or("") == wanted
                    && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
            })?;
            let port = u16::try_from(port.port).ok()?;
            Some(subset.addresses.iter().flatten().filter_map(move |a| {
                let ip = a.ip.parse::<IpAddr>().ok()?.to_canonical();
                let pod = a
                    .target_ref
                    .as_ref()
                    .filter(|r| r.kind.as_deref() == Some("Pod"))
                    .and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)));
                Some(Candidate {
                    dial: SocketAddr::new(ip, port),
                    ip: Some(ip),
                    pod,
                    port,
                })
            }))
        })
        .flatten()
        .filter(|c| !never.contains(&c.dial.ip()) && !special(c.dial.ip()))
        .collect()
}

/// Addresses the controller's own host answers on, or that are not a pod's.
fn special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_unspecified(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

/// Every IP of the Endpoints (the apiserver's, `default/kubernetes`).
fn all_ips(endpoints: &Endpoints) -> impl Iterator<Item = IpAddr> + '_ {
    endpoints.subsets.iter().flatten().flat_map(|subset| {
        subset
            .addresses
            .iter()
            .flatten()
            .chain(subset.not_ready_addresses.iter().flatten())
            .filter_map(|address| address.ip.parse::<IpAddr>().ok())
            .map(|ip| ip.to_canonical())
    })
}

/// The cluster's Services and Endpoints as the watches last saw them.
pub struct ClusterEndpoints {
    pub services: Store<Service>,
    pub endpoints: Store<Endpoints>,
    /// The controller's own address (`--internal-ip`, the pod's IP).
    pub controller: Option<IpAddr>,
    /// What is never dialled, as of the last round (`refresh`).
    never: RwLock<HashSet<IpAddr>>,
    /// Ready burst pods behind each (Service, port): the controller's own listeners for them,
    /// as of the last round. Burst pods have no pod IP, so no Endpoints list them.
    bursts: RwLock<BurstBackends>,
}

/// The controller's listeners for ready burst pods, per (Service, Service port).
pub(super) type BurstBackends = HashMap<(ServiceKey, u16), Vec<Candidate>>;

impl ClusterEndpoints {
    pub fn new(
        services: Store<Service>,
        endpoints: Store<Endpoints>,
        controller: Option<IpAddr>,
    ) -> ClusterEndpoints {
        ClusterEndpoints {
            services,
            endpoints,
            controller,
            never: RwLock::default(),
            bursts: RwLock::default(),
        }
    }

    /// The ready burst pods' listeners found in the last round.
    pub(super) fn set_bursts(&self, bursts: BurstBackends) {
        *self.bursts.write().unwrap_or_else(|e| e.into_inner()) = bursts;
    }

    /// Recomputes what is never dialled: the apiserver's addresses, every Service's cluster
    /// IPs, the controller's own address.
    pub fn refresh(&self) {
        let mut never: HashSet<IpAddr> = self.controller.into_iter().collect();
        if let Some(apiserver) = self
            .endpoints
            .get(&ObjectRef::new("kubernetes").within("default"))
        {
            never.extend(all_ips(&apiserver));
        }
        for service in self.services.state() {
            let spec = service.spec.as_ref();
            let ips = spec
                .and_then(|s| s.cluster_ips.clone())
                .unwrap_or_default()
                .into_iter()
                .chain(spec.and_then(|s| s.cluster_ip.clone()));
            never.extend(
                ips.filter_map(|ip| ip.parse::<IpAddr>().ok())
                    .map(|ip| ip.to_canonical()),
            );
        }
        *self.never.write().unwrap_or_else(|e| e.into_inner()) = never;
    }

    /// Every Service, as the plan sees it: ready too where a ready burst pod backs it.
    pub fn views(&self) -> Vec<ServiceView> {
        let bursts = self.bursts.read().unwrap_or_else(|e| e.into_inner());
        self.services
            .state()
            .iter()
            .filter_map(|service| {
                let at = ObjectRef::new(service.metadata.name.as_deref()?)
                    .within(service.metadata.namespace.as_deref()?);
                let endpoints = self.endpoints.get(&at);
                let mut view = service_view(service, endpoints.as_deref())?;
                view.ready |= bursts.keys().any(|(key, _)| *key == view.key);
                Some(view)
            })
            .collect()
    }
}

impl bridge::Endpoints for ClusterEndpoints {
    fn candidates(&self, service: &ServiceKey, port: u16) -> [Vec<Candidate>; 2] {
        let at = ObjectRef::new(&service.name).within(&service.namespace);
        let local = self
            .services
            .get(&at)
            .zip(
                self.endpoints
                    .get(&ObjectRef::new(&service.name).within(&service.namespace)),
            )
            .map(|(svc, endpoints)| {
                let never = self.never.read().unwrap_or_else(|e| e.into_inner());
                endpoints_for(&svc, &endpoints, port, &never)
            })
            .unwrap_or_default();
        // The controller's own listeners, for burst pods behind the Service: never in an
        // Endpoints object, so `never` (which holds the controller's address) does not apply.
        let bursts = self.bursts.read().unwrap_or_else(|e| e.into_inner());
        let burst = bursts
            .get(&(service.clone(), port))
            .cloned()
            .unwrap_or_default();
        [local, burst]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(ports: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "team"},
            "spec": {"ports": ports}
        }))
        .unwrap()
    }

    fn endpoints(subsets: serde_json::Value) -> Endpoints {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "team"},
            "subsets": subsets
        }))
        .unwrap()
    }

    #[test]
    fn a_port_goes_to_the_endpoint_port_of_the_same_name_on_a_ready_address() {
        let svc = service(serde_json::json!([
            {"name": "sql", "port": 5432, "targetPort": 15432},
            {"name": "metrics", "port": 9187}
        ]));
        let eps = endpoints(serde_json::json!([{
            "addresses": [{"ip": "10.1.0.7",
                           "targetRef": {"kind": "Pod", "namespace": "team", "name": "db-0"}}],
            "notReadyAddresses": [{"ip": "10.1.0.8"}],
            "ports": [{"name": "metrics", "port": 19187}, {"name": "sql", "port": 15432}]
        }]));
        let dialled = |eps: &Endpoints, port, never: &HashSet<IpAddr>| -> Vec<SocketAddr> {
            endpoints_for(&svc, eps, port, never)
                .into_iter()
                .map(|c| c.dial)
                .collect()
        };
        let found = endpoints_for(&svc, &eps, 5432, &HashSet::new());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].dial, "10.1.0.7:15432".parse().unwrap());
        assert_eq!(found[0].ip, Some("10.1.0.7".parse().unwrap()));
        assert_eq!(found[0].port, 15432);
        assert_eq!(
            found[0].pod,
            Some(("team".to_owned(), "db-0".to_owned())),
            "targetRef names the pod"
        );
        assert_eq!(
            dialled(&eps, 9187, &HashSet::new()),
            ["10.1.0.7:19187".parse::<SocketAddr>().unwrap()]
        );
        assert!(dialled(&eps, 80, &HashSet::new()).is_empty());
        // Never what is excluded (the apiserver, cluster IPs, the controller) on any port,
        // whatever hand-written Endpoints say, also written as IPv4-mapped IPv6; never loopback.
        let never: HashSet<IpAddr> = ["10.1.0.7".parse().unwrap()].into();
        assert!(dialled(&eps, 5432, &never).is_empty());
        let mapped = endpoints(serde_json::json!([{
            "addresses": [{"ip": "::ffff:10.1.0.7"}],
            "ports": [{"name": "sql", "port": 15432}]
        }]));
        assert!(dialled(&mapped, 5432, &never).is_empty());
        let local = endpoints(serde_json::json!([{
            "addresses": [{"ip": "127.0.0.1"}, {"ip": "169.254.169.254"}, {"ip": "::ffff:127.0.0.1"}],
            "ports": [{"name": "sql", "port": 5432}]
        }]));
        assert!(dialled(&local, 5432, &HashSet::new()).is_empty());
        let view = service_view(&svc, Some(&eps)).unwrap();
        assert_eq!(view.tcp_ports, [5432, 9187]);
        assert!(view.ready);
    }

    #[test]
    fn without_ready_addresses_nothing_is_picked_and_the_service_is_not_ready() {
        let svc = service(serde_json::json!([{"port": 80, "protocol": "TCP"}]));
        let eps = endpoints(serde_json::json!([{
            "notReadyAddresses": [{"ip": "10.1.0.8"}],
            "ports": [{"port": 8080}]
        }]));
        assert!(endpoints_for(&svc, &eps, 80, &HashSet::new()).is_empty());
        assert!(!service_view(&svc, Some(&eps)).unwrap().ready);
        assert!(!service_view(&svc, None).unwrap().ready);
        let udp = service(serde_json::json!([{"port": 53, "protocol": "UDP"}]));
        assert!(service_view(&udp, None).unwrap().tcp_ports.is_empty());
    }
}
