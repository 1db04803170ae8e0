//! Burst pods in the cluster's network, as pure decisions: which cluster Services a burst pod
//! reaches (its own namespace's, plus what its namespace's `runpod.io/cluster-services` asks
//! for within the installation's `--cluster-services-allowed`; never the apiserver), at which
//! loopback address in the pod each one answers, and the hosts lines that name it.
//!
//! Each Service gets its own loopback address (`127.a.b.c`, never `127.0.0.0/16`, where the
//! pod's own `localhost` services live), so two Services on one port do not collide and a name
//! resolves through the pod's ordinary `/etc/hosts`, without a resolver running in the pod.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

/// Namespace annotation: more Services the namespace's burst pods reach (`NS/NAME` or `NS/*`,
/// comma-separated), within what the installation allows.
pub const CLUSTER_SERVICES: &str = "runpod.io/cluster-services";

/// The admission warning of a RunPod pod that exposes nothing: no SSH path, so no bridge.
pub const NO_BRIDGE_WARNING: &str = "runpod-kubelet: runpod.io/ports: none opens no SSH port, so \
     this pod will not reach the cluster's Services by name and Services will not route to it \
     (docs/networking.md); remove the annotation (22/tcp is then opened for this node's key only) \
     if it needs the cluster's network";

/// The admission warning of a pod bound for a cloud that offers no shell, and so no bridge,
/// when it looks like it needs the cluster's network: its namespace names cluster Services
/// for it ([`CLUSTER_SERVICES`]), or it declares container ports a Service could route to.
pub fn no_bridge_on(cloud: &str) -> String {
    format!(
        "runpod-kubelet: {cloud} offers no SSH into its containers, so this pod will not reach \
         the cluster's Services by name and Services will not route to it (docs/networking.md: \
         RunPod only); run it on RunPod (runpod.io/provider: runpod) if it needs the cluster's \
         network"
    )
}

/// The first and last line of the block the controller owns in a pod's `/etc/hosts`.
pub const HOSTS_BEGIN: &str = "# runpod-kubelet: cluster services (begin)";
pub const HOSTS_END: &str = "# runpod-kubelet: cluster services (end)";

/// The installation's network settings (`--cluster-network`, `--cluster-services-allowed`,
/// `--cluster-domain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSettings {
    pub enabled: bool,
    pub allowed: Vec<Selector>,
    pub cluster_domain: String,
}

impl Default for NetworkSettings {
    fn default() -> Self {
        NetworkSettings {
            enabled: false,
            allowed: Vec::new(),
            cluster_domain: "cluster.local".to_owned(),
        }
    }
}

/// One entry of `runpod.io/cluster-services` or `--cluster-services-allowed`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Selector {
    /// `NS/*`: every Service of a namespace (`*/*`: every namespace).
    Namespace(String),
    /// `NS/NAME`.
    Service { namespace: String, name: String },
}

impl Selector {
    fn matches(&self, service: &ServiceKey) -> bool {
        match self {
            Selector::Namespace(namespace) => namespace == "*" || *namespace == service.namespace,
            Selector::Service { namespace, name } => {
                *namespace == service.namespace && *name == service.name
            }
        }
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selector::Namespace(namespace) => write!(f, "{namespace}/*"),
            Selector::Service { namespace, name } => write!(f, "{namespace}/{name}"),
        }
    }
}

/// Parses a comma-separated list of `NS/NAME` and `NS/*` (empty entries are skipped).
pub fn parse_selectors(value: &str) -> Result<Vec<Selector>, String> {
    let mut selectors = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((namespace, name)) = entry.split_once('/') else {
            return Err(format!(
                "{entry:?} is not NAMESPACE/SERVICE or NAMESPACE/* (e.g. ml/mlflow, data/*)"
            ));
        };
        let label = |part: &str| {
            part == "*"
                || (!part.is_empty()
                    && part.len() <= 63
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        };
        if !label(namespace) || !label(name) || (namespace == "*" && name != "*") {
            return Err(format!(
                "{entry:?} is not NAMESPACE/SERVICE or NAMESPACE/* with Kubernetes names (e.g. ml/mlflow, data/*)"
            ));
        }
        selectors.push(if name == "*" {
            Selector::Namespace(namespace.to_owned())
        } else {
            Selector::Service {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }
        });
    }
    Ok(selectors)
}

/// A Service, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub namespace: String,
    pub name: String,
}

/// What the plan needs of a Service: its TCP ports, and whether a ready endpoint backs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceView {
    pub key: ServiceKey,
    pub tcp_ports: Vec<u16>,
    pub ready: bool,
}

/// One remote forward in the pod: connections to `address:port` there reach `service`'s port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Forward {
    pub address: Ipv4Addr,
    pub port: u16,
    pub service: ServiceKey,
}

/// What one pod reaches: its forwards, the hosts lines that name them, and the entries of its
/// namespace's annotation the installation does not allow (said in an Event).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub forwards: Vec<Forward>,
    pub hosts: Vec<String>,
    pub refused: Vec<Selector>,
}

/// The apiserver's Service: never bridged, whatever a list says.
fn is_apiserver(service: &ServiceKey) -> bool {
    service.namespace == "default" && service.name == "kubernetes"
}

/// Which of `services` a pod in `namespace` reaches, with `asked` from its namespace's
/// annotation, `allowed` the installation's list, in a cluster whose DNS domain is
/// `cluster_domain`. A Service without a ready endpoint gets no forward (a connection to it
/// is refused, as in the cluster) but keeps its name and address, so it works once ready.
pub fn plan(
    namespace: &str,
    asked: &[Selector],
    allowed: &[Selector],
    services: &[ServiceView],
    cluster_domain: &str,
) -> Plan {
    let refused: Vec<Selector> = asked
        .iter()
        .filter(|selector| !within(selector, allowed))
        .cloned()
        .collect();
    let reached: Vec<&ServiceView> = services
        .iter()
        .filter(|s| !is_apiserver(&s.key))
        .filter(|s| {
            s.key.namespace == namespace
                || (asked.iter().any(|a| a.matches(&s.key))
                    && allowed.iter().any(|a| a.matches(&s.key)))
        })
        .collect();
    let addresses = addresses(reached.iter().map(|s| &s.key));
    let mut forwards = Vec::new();
    let mut hosts = Vec::new();
    for service in reached {
        let Some(&address) = addresses.get(&service.key) else {
            continue;
        };
        let ServiceKey {
            namespace: ns,
            name,
        } = &service.key;
        let mut names = Vec::new();
        if ns == namespace {
            names.push(name.clone());
        }
        names.extend([
            format!("{name}.{ns}"),
            format!("{name}.{ns}.svc"),
            format!("{name}.{ns}.svc.{cluster_domain}"),
        ]);
        hosts.push(format!("{address} {}", names.join(" ")));
        if service.ready {
            let ports: BTreeSet<u16> = service.tcp_ports.iter().copied().collect();
            forwards.extend(ports.into_iter().map(|port| Forward {
                address,
                port,
                service: service.key.clone(),
            }));
        }
    }
    forwards.sort();
    Plan {
        forwards,
        hosts,
        refused,
    }
}

/// The plan for a pod whose sshd binds every remote forward to `127.0.0.1` whatever address is
/// asked (OpenSSH's `GatewayPorts no`, the default of images that start their own sshd): each
/// Service at `127.0.0.1`, and of two Services on one port only the first by name (the other
/// loses its forward and its names: the pod cannot tell them apart).
pub fn on_localhost(plan: &Plan) -> Plan {
    let localhost = Ipv4Addr::LOCALHOST;
    let mut ports = BTreeSet::new();
    let mut kept = BTreeSet::new();
    let mut forwards = Vec::new();
    let mut lost = BTreeSet::new();
    let mut by_service: BTreeMap<&ServiceKey, Vec<&Forward>> = BTreeMap::new();
    for forward in &plan.forwards {
        by_service
            .entry(&forward.service)
            .or_default()
            .push(forward);
    }
    for (service, service_forwards) in by_service {
        if service_forwards.iter().any(|f| ports.contains(&f.port)) {
            lost.insert(service.clone());
            continue;
        }
        for forward in service_forwards {
            ports.insert(forward.port);
            forwards.push(Forward {
                address: localhost,
                ..forward.clone()
            });
        }
        kept.insert(service.clone());
    }
    let addresses: BTreeMap<Ipv4Addr, &ServiceKey> = plan
        .forwards
        .iter()
        .map(|f| (f.address, &f.service))
        .collect();
    let hosts = plan
        .hosts
        .iter()
        .filter_map(|line| {
            let (address, names) = line.split_once(' ')?;
            let address: Ipv4Addr = address.parse().ok()?;
            match addresses.get(&address) {
                Some(service) if kept.contains(*service) => Some(format!("{localhost} {names}")),
                // A Service without a ready endpoint has no forward yet: no name either, so it
                // cannot take a port another Service holds.
                _ => None,
            }
        })
        .collect();
    forwards.sort();
    Plan {
        forwards,
        hosts,
        refused: plan.refused.clone(),
    }
}

/// The IPv4 addresses and ports listening in `/proc/net/tcp` (state `0A`).
pub fn listening(proc_net_tcp: &str) -> BTreeSet<(Ipv4Addr, u16)> {
    proc_net_tcp
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            if state != "0A" {
                return None;
            }
            let (ip, port) = local.split_once(':')?;
            let ip = u32::from_str_radix(ip, 16).ok()?;
            let port = u16::from_str_radix(port, 16).ok()?;
            Some((Ipv4Addr::from(ip.swap_bytes()), port))
        })
        .collect()
}

/// Whether what is listening shows an sshd that ignored the asked addresses: a forward's port
/// listens on `127.0.0.1` and not on the forward's own address.
pub fn bound_to_localhost(plan: &Plan, listening: &BTreeSet<(Ipv4Addr, u16)>) -> bool {
    plan.forwards.iter().any(|f| {
        f.address != Ipv4Addr::LOCALHOST
            && !listening.contains(&(f.address, f.port))
            && listening.contains(&(Ipv4Addr::LOCALHOST, f.port))
    })
}

/// Whether everything `selector` asks for is inside `allowed`.
fn within(selector: &Selector, allowed: &[Selector]) -> bool {
    allowed.iter().any(|allowed| match (allowed, selector) {
        (Selector::Namespace(any), _) if any == "*" => true,
        (Selector::Namespace(ns), Selector::Namespace(asked)) => ns == asked,
        (Selector::Namespace(ns), Selector::Service { namespace, .. }) => ns == namespace,
        (Selector::Service { .. }, Selector::Namespace(_)) => false,
        (a @ Selector::Service { .. }, b @ Selector::Service { .. }) => a == b,
    })
}

/// A loopback address per Service: from a hash of its name, so that it stays the same across
/// restarts and leaders, moved on to the next free one in name order on a collision.
pub fn addresses<'a>(
    services: impl IntoIterator<Item = &'a ServiceKey>,
) -> BTreeMap<ServiceKey, Ipv4Addr> {
    let sorted: BTreeSet<&ServiceKey> = services.into_iter().collect();
    let mut taken = BTreeSet::new();
    let mut addresses = BTreeMap::new();
    for key in sorted {
        let mut hash = fnv1a(format!("{}/{}", key.namespace, key.name).as_bytes());
        let address = loop {
            let address = loopback(hash);
            if taken.insert(address) {
                break address;
            }
            hash = hash.wrapping_add(1);
        };
        addresses.insert(key.clone(), address);
    }
    addresses
}

/// `127.a.b.c` with `a` in 1..=254 and `c` in 1..=254: outside `127.0.0.0/16`, never a
/// network or broadcast-looking address.
fn loopback(hash: u32) -> Ipv4Addr {
    let a = 1 + (hash % 254) as u8;
    let b = ((hash / 254) % 256) as u8;
    let c = 1 + ((hash / (254 * 256)) % 254) as u8;
    Ipv4Addr::new(127, a, b, c)
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

/// The shell command that replaces the controller's block in the pod's `/etc/hosts` with
/// `lines` (in place: in a container `/etc/hosts` is a mounted file that cannot be renamed
/// over). The file's other lines are kept or nothing is written: a `sed` that fails (or is
/// missing) fails the command. `RUNPOD_KUBELET_SSH_ROOT` prefixes the path where the wrapper is
/// tested outside a container. Every line is a quoted literal (names are validated DNS names).
pub fn hosts_command(lines: &[String]) -> String {
    let mut block = vec![HOSTS_BEGIN.to_owned()];
    block.extend(lines.iter().map(|line| line.replace('\'', "")));
    block.push(HOSTS_END.to_owned());
    let quoted: Vec<String> = block.iter().map(|line| format!("'{line}'")).collect();
    format!(
        "f=\"${{RUNPOD_KUBELET_SSH_ROOT:-}}/etc/hosts\"; t=\"$f.runpod-kubelet.$$\"; \
         if [ -f \"$f\" ]; then sed '/^{begin}$/,/^{end}$/d' \"$f\" >\"$t\" || {{ rm -f \"$t\"; exit 1; }}; \
         else : >\"$t\" || exit 1; fi; \
         printf '%s\\n' {lines} >>\"$t\" && cat \"$t\" >\"$f\"; s=$?; rm -f \"$t\"; exit $s",
        begin = HOSTS_BEGIN,
        end = HOSTS_END,
        lines = quoted.join(" "),
    )
}

/// `--cluster-domain`: DNS labels separated by dots (it is written into the pod's hosts file).
pub fn parse_cluster_domain(value: &str) -> Result<String, String> {
    let domain = value.trim().trim_matches('.').to_ascii_lowercase();
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if domain.is_empty() || !domain.split('.').all(label_ok) {
        return Err(format!(
            "{value:?} is not a DNS domain (lowercase labels separated by dots, e.g. cluster.local)"
        ));
    }
    Ok(domain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(namespace: &str, name: &str, ports: &[u16], ready: bool) -> ServiceView {
        ServiceView {
            key: ServiceKey {
                namespace: namespace.into(),
                name: name.into(),
            },
            tcp_ports: ports.to_vec(),
            ready,
        }
    }

    fn names(plan: &Plan) -> Vec<String> {
        plan.forwards
            .iter()
            .map(|f| format!("{}/{}:{}", f.service.namespace, f.service.name, f.port))
            .collect()
    }

    #[test]
    fn parses_selectors_and_refuses_what_is_not_one() {
        assert_eq!(
            parse_selectors(" ml/mlflow, data/* ,").unwrap(),
            vec![
                Selector::Service {
                    namespace: "ml".into(),
                    name: "mlflow".into()
                },
                Selector::Namespace("data".into())
            ]
        );
        assert_eq!(
            parse_selectors("*/*").unwrap(),
            [Selector::Namespace("*".into())]
        );
        for bad in ["mlflow", "ml/", "/x", "ML/x", "*/x", "a/b/c"] {
            assert!(parse_selectors(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn own_namespace_by_default_others_only_when_asked_and_allowed_never_the_apiserver() {
        let services = [
            service("team", "postgres", &[5432], true),
            service("ml", "mlflow", &[5000], true),
            service("ml", "other", &[80], true),
            service("secret", "vault", &[8200], true),
            service("default", "kubernetes", &[443], true),
        ];
        let none = plan("team", &[], &[], &services, "cluster.local");
        assert_eq!(names(&none), ["team/postgres:5432"]);

        let asked = parse_selectors("ml/mlflow,secret/*,default/*").unwrap();
        let allowed = parse_selectors("ml/*,default/*").unwrap();
        let widened = plan("team", &asked, &allowed, &services, "cluster.local");
        let mut got = names(&widened);
        got.sort();
        assert_eq!(got, ["ml/mlflow:5000", "team/postgres:5432"]);
        assert_eq!(widened.refused, [Selector::Namespace("secret".into())]);

        // Even an installation that allows everything never bridges the apiserver.
        let everything = parse_selectors("*/*").unwrap();
        let all = plan("default", &everything, &everything, &services, "c.l");
        assert!(
            !names(&all)
                .iter()
                .any(|n| n.starts_with("default/kubernetes"))
        );
    }

    #[test]
    fn names_resolve_as_in_the_cluster_and_unready_services_keep_a_name_without_a_forward() {
        let services = [
            service("team", "db", &[5432, 5432, 9187], true),
            service("ml", "mlflow", &[5000], false),
        ];
        let asked = parse_selectors("ml/mlflow").unwrap();
        let plan = plan("team", &asked, &asked, &services, "cluster.local");
        assert_eq!(names(&plan), ["team/db:5432", "team/db:9187"]);
        let db = plan.hosts.iter().find(|l| l.contains(" db ")).unwrap();
        assert!(db.ends_with(" db db.team db.team.svc db.team.svc.cluster.local"));
        let mlflow = plan.hosts.iter().find(|l| l.contains("mlflow")).unwrap();
        // Another namespace's Service has no short name, as in the cluster's DNS search path.
        assert!(mlflow.ends_with(" mlflow.ml mlflow.ml.svc mlflow.ml.svc.cluster.local"));
    }

    #[test]
    fn every_service_has_its_own_stable_loopback_address() {
        let keys: Vec<ServiceKey> = (0..3000)
            .map(|i| ServiceKey {
                namespace: format!("ns{}", i % 7),
                name: format!("svc-{i}"),
            })
            .collect();
        let first = addresses(&keys);
        let distinct: BTreeSet<&Ipv4Addr> = first.values().collect();
        assert_eq!(distinct.len(), keys.len());
        for address in first.values() {
            let [a, _, _, c] = address.octets();
            assert_eq!(address.octets()[0], 127);
            assert!(a >= 1 && (1..=254).contains(&c), "{address}");
        }
        // The same Service keeps its address when others come and go.
        let some = addresses(&keys[..10]);
        let subset_kept = keys[..10]
            .iter()
            .filter(|k| some.get(*k) == first.get(*k))
            .count();
        assert!(subset_kept >= 9);
    }

    #[test]
    fn an_sshd_that_binds_localhost_only_gets_one_service_per_port_on_127_0_0_1() {
        let services = [
            service("team", "a", &[5432], true),
            service("team", "b", &[5432, 8080], true),
            service("team", "c", &[6379], true),
            service("team", "d", &[9000], false),
        ];
        let plan = plan("team", &[], &[], &services, "cluster.local");
        let local = on_localhost(&plan);
        assert_eq!(names(&local), ["team/a:5432", "team/c:6379"]);
        assert!(
            local
                .forwards
                .iter()
                .all(|f| f.address == Ipv4Addr::LOCALHOST)
        );
        assert_eq!(local.hosts.len(), 2);
        assert!(local.hosts.iter().all(|l| l.starts_with("127.0.0.1 ")));
        assert!(
            local
                .hosts
                .iter()
                .any(|l| l.ends_with(" c c.team c.team.svc c.team.svc.cluster.local"))
        );
        assert!(!local.hosts.iter().any(|l| l.contains(" b ")));
    }

    #[test]
    fn reads_listening_sockets_and_tells_an_sshd_that_ignored_the_address() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0\n\
   1: 0302017F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0\n\
   2: 0100007F:0051 0100007F:9999 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 100 0 0 10 0\n";
        let open = listening(table);
        assert_eq!(
            open,
            BTreeSet::from([
                (Ipv4Addr::new(127, 0, 0, 1), 5432),
                (Ipv4Addr::new(127, 1, 2, 3), 80)
            ])
        );
        let forward = |a: [u8; 4], port| Plan {
            forwards: vec![Forward {
                address: Ipv4Addr::from(a),
                port,
                service: ServiceKey {
                    namespace: "n".into(),
                    name: "s".into(),
                },
            }],
            ..Plan::default()
        };
        assert!(bound_to_localhost(&forward([127, 9, 9, 9], 5432), &open));
        assert!(!bound_to_localhost(&forward([127, 1, 2, 3], 80), &open));
        assert!(!bound_to_localhost(&forward([127, 9, 9, 9], 81), &open));
    }

    #[test]
    fn the_hosts_command_replaces_only_its_own_block() {
        let dir = std::env::temp_dir().join(format!("hosts-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        let file = dir.join("etc/hosts");
        std::fs::write(&file, "127.0.0.1 localhost\n10.0.0.5 mine\n").unwrap();
        let run = |lines: &[String]| {
            let status = std::process::Command::new("sh")
                .arg("-c")
                .arg(hosts_command(lines))
                .env("RUNPOD_KUBELET_SSH_ROOT", &dir)
                .status()
                .unwrap();
            assert!(status.success());
            std::fs::read_to_string(&file).unwrap()
        };
        let once = run(&["127.9.9.9 db db.team".to_owned()]);
        assert!(once.starts_with("127.0.0.1 localhost\n10.0.0.5 mine\n"));
        assert!(once.contains("127.9.9.9 db db.team\n"));
        let twice = run(&["127.8.8.8 cache".to_owned()]);
        assert!(!twice.contains("db.team"), "{twice}");
        assert_eq!(twice.matches(HOSTS_BEGIN).count(), 1);
        assert!(twice.contains("127.8.8.8 cache\n"));
        assert!(twice.contains("10.0.0.5 mine"));
        // A sed that fails (here: none on the PATH) changes nothing.
        let kept = std::fs::read_to_string(&file).unwrap();
        let status = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(hosts_command(&["127.7.7.7 x".to_owned()]))
            .env("RUNPOD_KUBELET_SSH_ROOT", &dir)
            .env("PATH", "/nonexistent")
            .status()
            .unwrap();
        assert!(!status.success());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), kept);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cluster_domains_are_dns_names() {
        assert_eq!(
            parse_cluster_domain(" Cluster.Local. ").unwrap(),
            "cluster.local"
        );
        for bad in ["", "a..b", "x'y", "a b", "a/b"] {
            assert!(parse_cluster_domain(bad).is_err(), "{bad}");
        }
    }
}
