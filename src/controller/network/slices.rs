//! Inbound, as pure decisions: which Services select a burst pod, which of the pod's ports
//! they target, and the EndpointSlice this project keeps for each (Service, pod): the leader's
//! address and the port it listens on for that pod port, ready while the pod is Ready and its
//! bridge is up. Burst pods have no pod IP, so the cluster's own EndpointSlice controller lists
//! none of them; these slices are theirs alone.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

/// `endpointslice.kubernetes.io/managed-by` of the slices this project keeps.
pub(crate) const MANAGED_BY: &str = "runpod-kubelet.runpod.io";
pub(crate) const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Whether `service` routes to `pod`: same namespace, a selector that is not empty, every one
/// of its labels on the pod.
pub(crate) fn selects(service: &Service, pod: &Pod) -> bool {
    if service.metadata.namespace != pod.metadata.namespace {
        return false;
    }
    let Some(spec) = &service.spec else {
        return false;
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return false;
    }
    let Some(selector) = spec.selector.as_ref().filter(|s| !s.is_empty()) else {
        return false;
    };
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The pod's port a Service port goes to: its `targetPort` (a number, or the name of one of the
/// pod's TCP container ports), else its `port`. `None` for UDP/SCTP or a name the pod lacks.
pub(crate) fn target_port(port: &ServicePort, pod: &Pod) -> Option<u16> {
    if port.protocol.as_deref().unwrap_or("TCP") != "TCP" {
        return None;
    }
    match &port.target_port {
        None => u16::try_from(port.port).ok(),
        Some(IntOrString::Int(number)) => u16::try_from(*number).ok(),
        Some(IntOrString::String(name)) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| {
                p.name.as_deref() == Some(name.as_str())
                    && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
            })
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// Where connections to `service`'s ports reach `pod` through its bridge: (Service port, its
/// target port on the pod, the controller's `own` port for it) for each port that reaches the pod, so that other
/// burst pods reach a Service whose backends are burst pods (which have no pod IP).
pub(crate) fn burst_ports(
    service: &Service,
    pod: &Pod,
    own: impl Fn(u16) -> Option<u16>,
) -> Vec<(u16, u16, u16)> {
    service
        .spec
        .iter()
        .flat_map(|spec| spec.ports.iter().flatten())
        .filter_map(|port| {
            let target = target_port(port, pod)?;
            Some((u16::try_from(port.port).ok()?, target, own(target)?))
        })
        .collect()
}

/// The slice's name: the Service's, cut to leave room, and the pod's UID (unique per pair).
pub(crate) fn slice_name(service: &str, pod_uid: &str) -> String {
    let service: String = service.chars().take(200).collect();
    let uid: String = pod_uid.chars().filter(|c| *c != '-').take(16).collect();
    format!("{service}-runpod-{uid}")
}

/// The EndpointSlice for `service` and `pod` (the fields both `discovery.k8s.io/v1` and
/// `v1beta1` share): one endpoint at `address`, with the Service's ports at the controller's
/// `own` port for each target port; `None` when none of its ports reaches the pod.
pub(crate) fn slice(
    service: &Service,
    pod: &Pod,
    address: IpAddr,
    own: impl Fn(u16) -> Option<u16>,
    ready: bool,
    api_version: &str,
) -> Option<serde_json::Value> {
    let namespace = service.metadata.namespace.as_deref()?;
    let name = service.metadata.name.as_deref()?;
    let uid = pod.metadata.uid.as_deref()?;
    let ports: Vec<serde_json::Value> = service
        .spec
        .as_ref()?
        .ports
        .iter()
        .flatten()
        .filter_map(|port| {
            let target = target_port(port, pod)?;
            Some(json!({
                "name": port.name.clone().unwrap_or_default(),
                "port": own(target)?,
                "protocol": "TCP",
            }))
        })
        .collect();
    if ports.is_empty() {
        return None;
    }
    let mut owner = json!({"apiVersion": "v1", "kind": "Service", "name": name});
    if let Some(service_uid) = &service.metadata.uid {
        owner["uid"] = json!(service_uid);
    }
    Some(json!({
        "apiVersion": api_version,
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name(name, uid),
            "namespace": namespace,
            "labels": {
                SERVICE_NAME_LABEL: name,
                MANAGED_BY_LABEL: MANAGED_BY,
            },
            "ownerReferences": [owner],
        },
        "addressType": if address.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": [{
            "addresses": [address.to_string()],
            "conditions": {"ready": ready},
            "targetRef": {
                "kind": "Pod",
                "namespace": namespace,
                "name": pod.metadata.name.clone().unwrap_or_default(),
                "uid": uid,
            },
        }],
        "ports": ports,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "team", "uid": "1234-5678-9abc",
                         "labels": {"app": "web", "tier": "gpu"}},
            "spec": {"containers": [{"name": "c", "image": "i",
                     "ports": [{"name": "http", "containerPort": 8080}, {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]}
        }))
        .unwrap()
    }

    fn service(selector: serde_json::Value, ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "team", "uid": "svc-uid"},
            "spec": {"selector": selector, "ports": ports}
        }))
        .unwrap()
    }

    #[test]
    fn a_service_selects_a_pod_with_all_its_labels_in_its_namespace() {
        let ports = json!([{"port": 80}]);
        assert!(selects(
            &service(json!({"app": "web"}), ports.clone()),
            &pod()
        ));
        assert!(!selects(
            &service(json!({"app": "web", "x": "y"}), ports.clone()),
            &pod()
        ));
        assert!(!selects(&service(json!({}), ports.clone()), &pod()));
        let mut elsewhere = service(json!({"app": "web"}), ports);
        elsewhere.metadata.namespace = Some("other".into());
        assert!(!selects(&elsewhere, &pod()));
    }

    #[test]
    fn a_burst_backend_is_each_service_port_whose_target_has_a_listener() {
        let svc = service(
            json!({"app": "web"}),
            json!([{"name": "a", "port": 80, "targetPort": "http"},
                   {"name": "b", "port": 9000, "targetPort": 9100},
                   {"name": "e", "port": 53, "protocol": "UDP"}]),
        );
        // Only 8080 (the pod's `http`) has a listener, at 40001.
        let own = |target: u16| (target == 8080).then_some(40001);
        assert_eq!(burst_ports(&svc, &pod(), own), vec![(80, 8080, 40001)]);
        assert!(burst_ports(&svc, &pod(), |_| None).is_empty());
    }

    #[test]
    fn target_ports_by_number_by_name_or_the_port_itself() {
        let svc = service(
            json!({"app": "web"}),
            json!([{"name": "a", "port": 80, "targetPort": "http"},
                   {"name": "b", "port": 9000, "targetPort": 9100},
                   {"name": "c", "port": 7000},
                   {"name": "d", "port": 81, "targetPort": "missing"},
                   {"name": "e", "port": 53, "protocol": "UDP"}]),
        );
        let got: Vec<Option<u16>> = svc
            .spec
            .as_ref()
            .unwrap()
            .ports
            .iter()
            .flatten()
            .map(|p| target_port(p, &pod()))
            .collect();
        assert_eq!(got, [Some(8080), Some(9100), Some(7000), None, None]);
    }

    #[test]
    fn the_slice_points_at_the_leader_with_its_own_ports_and_names_its_service() {
        let svc = service(
            json!({"app": "web"}),
            json!([{"name": "http", "port": 80, "targetPort": "http"}, {"name": "gone", "port": 81, "targetPort": "missing"}]),
        );
        let own = |target: u16| (target == 8080).then_some(41000);
        let body = slice(
            &svc,
            &pod(),
            "10.0.0.9".parse().unwrap(),
            own,
            true,
            "discovery.k8s.io/v1",
        )
        .unwrap();
        assert_eq!(body["metadata"]["labels"][SERVICE_NAME_LABEL], "web");
        assert_eq!(body["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "svc-uid");
        assert_eq!(body["addressType"], "IPv4");
        assert_eq!(body["endpoints"][0]["addresses"][0], "10.0.0.9");
        assert_eq!(body["endpoints"][0]["conditions"]["ready"], true);
        assert_eq!(body["endpoints"][0]["targetRef"]["name"], "web-0");
        assert_eq!(
            body["ports"],
            json!([{"name": "http", "port": 41000, "protocol": "TCP"}])
        );
        assert_eq!(body["metadata"]["name"], "web-runpod-123456789abc");
        // Nothing listened on yet: no slice.
        assert!(
            slice(
                &svc,
                &pod(),
                "10.0.0.9".parse().unwrap(),
                |_| None,
                true,
                "v"
            )
            .is_none()
        );
    }
}
