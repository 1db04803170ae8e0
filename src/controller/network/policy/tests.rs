use std::sync::Arc;

use serde_json::json;

use super::*;

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "team", "labels": {"app": "web", "tier": "gpu"}},
        "spec": {"containers": [{"name": "main", "ports": [
            {"name": "http", "containerPort": 8080},
            {"name": "dns", "containerPort": 53, "protocol": "UDP"}
        ]}]}
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

fn peer_pod(namespace: &str, labels: serde_json::Value, ns_labels: serde_json::Value) -> PeerPod {
    PeerPod {
        namespace: namespace.into(),
        labels: serde_json::from_value(labels).unwrap(),
        namespace_labels: serde_json::from_value(ns_labels).unwrap(),
        ports: vec![("pg".into(), 5432)],
        ips: Vec::new(),
    }
}

fn ip(text: &str) -> Option<IpAddr> {
    Some(text.parse().unwrap())
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
        &selector(json!({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]})),
        &labels
    ));
}

#[test]
fn policies_restrict_the_directions_they_name_for_the_pods_they_select() {
    let policies = [
        policy(
            "deny-all",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        ),
        policy(
            "egress-open",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}),
        ),
        // No policyTypes and no egress: Ingress only.
        policy(
            "from-frontend",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "frontend"}}}]}]}),
        ),
        policy(
            "db-only",
            json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Egress"]}),
        ),
    ];
    let verdict = judge(&pod(), &policies);
    let egress = verdict.egress.unwrap();
    let ingress = verdict.ingress.unwrap();
    assert_eq!(egress.by, ["deny-all", "egress-open"]);
    assert_eq!(ingress.by, ["deny-all", "from-frontend"]);
    // egress-open's empty rule allows anything; deny-all adds no rule.
    assert!(!egress.denies_all());
    assert!(egress.allows(
        Peer {
            ip: None,
            pod: None
        },
        1,
        &[]
    ));
    assert!(ingress.names_pods() && !ingress.has_ip_blocks());
    // Only deny-all: nothing either way.
    let closed = judge(&pod(), &policies[..1]);
    assert!(closed.egress.unwrap().denies_all() && closed.ingress.unwrap().denies_all());
    // Another namespace's policy never selects the pod; one selecting other pods neither.
    let mut elsewhere = (*policies[0]).clone();
    elsewhere.metadata.namespace = Some("other".into());
    assert_eq!(judge(&pod(), &[Arc::new(elsewhere)]), Verdict::default());
    assert_eq!(judge(&pod(), &policies[3..]), Verdict::default());
}

#[test]
fn peers_are_judged_by_pod_namespace_and_address() {
    let verdict = judge(
        &pod(),
        &[policy(
            "egress",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [
                {"to": [{"podSelector": {"matchLabels": {"role": "db"}}}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"team": "ml"}},
                         "podSelector": {"matchLabels": {"app": "mlflow"}}}]},
                {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16"]}}]}
            ]}),
        )],
    );
    let egress = verdict.egress.unwrap();
    assert!(egress.names_pods() && egress.has_ip_blocks());
    let allows =
        |ip: Option<IpAddr>, pod: Option<&PeerPod>| egress.allows(Peer { ip, pod }, 5432, &[]);
    let db = peer_pod("team", json!({"role": "db"}), json!({}));
    let db_elsewhere = peer_pod("other", json!({"role": "db"}), json!({}));
    let mlflow = peer_pod("ml", json!({"app": "mlflow"}), json!({"team": "ml"}));
    let mlflow_unlabelled_ns = peer_pod("ml", json!({"app": "mlflow"}), json!({}));
    let other_in_ml = peer_pod("ml", json!({"app": "minio"}), json!({"team": "ml"}));
    // A podSelector alone: pods of the policy's own namespace only.
    assert!(allows(ip("192.168.1.5"), Some(&db)));
    assert!(!allows(ip("192.168.1.5"), Some(&db_elsewhere)));
    // Both selectors: both must match.
    assert!(allows(None, Some(&mlflow)));
    assert!(!allows(None, Some(&mlflow_unlabelled_ns)));
    assert!(!allows(None, Some(&other_in_ml)));
    // ipBlock: the address, minus the exceptions; a peer without an address never matches it.
    assert!(allows(ip("10.1.2.3"), None));
    assert!(!allows(ip("10.9.2.3"), None));
    assert!(!allows(ip("192.168.1.5"), None));
    assert!(!allows(None, None));
    assert!(
        allows(ip("::ffff:10.1.2.3"), None),
        "a v4-mapped address is its v4 address"
    );
}

#[test]
fn ports_by_number_range_name_and_protocol() {
    let verdict = judge(
        &pod(),
        &[policy(
            "ingress",
            json!({"podSelector": {}, "ingress": [
                {"ports": [{"port": 9000, "endPort": 9010}]},
                {"ports": [{"port": "http"}]},
                {"ports": [{"protocol": "UDP", "port": 7000}]},
                {"ports": [{"protocol": "TCP", "port": 6000}], "from": [{"ipBlock": {"cidr": "127.0.0.0/8"}}]}
            ]}),
        )],
    );
    let ingress = verdict.ingress.unwrap();
    let names = named_ports(&pod());
    assert_eq!(
        names,
        [("http".to_owned(), 8080)],
        "UDP ports are not TCP's"
    );
    let anyone = Peer {
        ip: ip("192.168.1.5"),
        pod: None,
    };
    let local = Peer {
        ip: ip("127.0.0.5"),
        pod: None,
    };
    assert!(ingress.allows(anyone, 9005, &names));
    assert!(!ingress.allows(anyone, 9011, &names));
    assert!(ingress.allows(anyone, 8080, &names));
    assert!(!ingress.allows(anyone, 8081, &names));
    assert!(
        !ingress.allows(anyone, 7000, &names),
        "a UDP rule allows no TCP"
    );
    assert!(!ingress.allows(anyone, 6000, &names));
    assert!(ingress.allows(local, 6000, &names));
    assert!(!ingress.names_pods());
}
