//! Burst pods reach the cluster's Services (outbound) on the real control plane: the
//! controller's bridge over the simulator's real sshd for the RunPod pod, with remote forwards
//! bound to the pod's loopback and the pod's `/etc/hosts` naming them. A real TCP server on this
//! machine's address stands for each Service's endpoint (hand-written Endpoints, as for a
//! Service without a selector). Checked: the pod's own namespace's Service by every name; a
//! Service created after the pod; a Service without ready endpoints refused; another
//! namespace's Service absent, then reachable once the namespace's annotation asks and the
//! installation allows, and one the installation does not allow refused with an Event.
//! Inbound: a Service selecting the burst pod gets this project's EndpointSlice (read back from
//! the apiserver: the leader's address, ready) whose address and port reach the pod's port, and
//! `kubectl port-forward svc/NAME` reaches it too; and the pod reaches that Service (whose only
//! backend is a burst pod) outbound. A NetworkPolicy denying everything closes
//! both directions (with an Event) until it is deleted; policies with rules are judged per
//! connection: egress to a pod by its labels (the endpoint's `targetRef`) and port, to an
//! `ipBlock` on one port; ingress from a pod by its labels (found by the connection's source
//! address), not from an address no such pod has. Both come back after the controller is
//! SIGKILLed and restarted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Pod, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::net::{echo, upper_echo};
use support::pods::{gpu_pod, namespace, running};
use support::wait;
use support::webhook::WebhookProcess;

const NS: &str = "e2e-net";
const POD: &str = "trainer";
const WAIT: Duration = Duration::from_secs(120);
/// The controller's address (any 127.0.0.x reaches it).
const LEADER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 3));

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_network burst_pods_reach_cluster_services",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

/// This machine's first non-loopback IPv4 address: the apiserver refuses loopback endpoints.
fn host_address() -> anyhow::Result<IpAddr> {
    let out = std::process::Command::new("hostname").arg("-I").output()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .find(|a| a.is_ipv4() && !a.is_loopback())
        .context("this machine has no non-loopback IPv4 address for the test's endpoints")
}

/// A TCP server that greets each connection with `greeting`, then echoes one line.
fn greeter(greeting: &'static str) -> anyhow::Result<u16> {
    let listener = TcpListener::bind("0.0.0.0:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let _ = stream.write_all(format!("{greeting}\n").as_bytes());
                let mut buf = [0u8; 256];
                if let Ok(n) = stream.read(&mut buf) {
                    let _ = stream.write_all(&buf[..n]);
                }
            });
        }
    });
    Ok(port)
}

/// A Service of `port` without a selector, and its hand-written Endpoints (`ready`: the address
/// is ready; else not ready).
async fn service(
    client: &kube::Client,
    ns: &str,
    name: &str,
    port: u16,
    endpoint: Option<(IpAddr, u16, bool)>,
) -> anyhow::Result<()> {
    service_naming(client, ns, name, port, endpoint, None).await
}

/// `service`, whose endpoint names `pod` (`targetRef`, as the endpoints controller writes it).
async fn service_naming(
    client: &kube::Client,
    ns: &str,
    name: &str,
    port: u16,
    endpoint: Option<(IpAddr, u16, bool)>,
    pod: Option<&str>,
) -> anyhow::Result<()> {
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"ports": [{"name": "main", "port": port, "protocol": "TCP"}]}
            }))?,
        )
        .await?;
    if let Some((ip, target, ready)) = endpoint {
        let key = if ready {
            "addresses"
        } else {
            "notReadyAddresses"
        };
        let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), ns);
        endpoints
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "subsets": [{key: [match pod {
                                     None => json!({"ip": ip.to_string()}),
                                     Some(pod) => json!({"ip": ip.to_string(), "targetRef": {"kind": "Pod", "namespace": ns, "name": pod}}),
                                 }],
                                 "ports": [{"name": "main", "port": target, "protocol": "TCP"}]}]
                }))?,
            )
            .await?;
    }
    Ok(())
}

/// The pod's `/etc/hosts` in the simulator (the container's own file).
fn hosts_file(pod_id: &str) -> PathBuf {
    std::env::temp_dir()
        .join(format!("runpod-sim-{pod_id}"))
        .join("root/etc/hosts")
}

/// The address `/etc/hosts` gives `name`, once it does.
async fn resolved(pod_id: &str, name: &str) -> anyhow::Result<IpAddr> {
    let file = hosts_file(pod_id);
    wait::until(&format!("{name} in the pod's /etc/hosts"), WAIT, || async {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        Ok(text.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            let address = words.next()?.parse::<IpAddr>().ok()?;
            words.any(|w| w == name).then_some(address)
        }))
    })
    .await
}

/// Connects as a process in the pod would, to `address:port`: the greeting and the echo.
fn talk(address: IpAddr, port: u16) -> anyhow::Result<String> {
    let mut stream =
        TcpStream::connect_timeout(&SocketAddr::new(address, port), Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"ping\n")?;
    let mut answer = String::new();
    let mut buf = [0u8; 256];
    while !answer.contains("ping") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        answer.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    Ok(answer)
}

/// Waits until `address:port` answers with `greeting`.
async fn answers(address: IpAddr, port: u16, greeting: &str) -> anyhow::Result<()> {
    wait::until(&format!("{greeting} through the bridge"), WAIT, || async {
        Ok(talk(address, port)
            .ok()
            .filter(|a| a.starts_with(greeting) && a.contains("ping"))
            .map(|_| ()))
    })
    .await
}

async fn run(cp: &ControlPlane) -> anyhow::Result<()> {
    let client = cp.client().await?;
    let simulator = SimulatorProcess::start(
        &json!({"provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 300}),
    )?;
    let webhook = WebhookProcess::start(&cp.kubeconfig, &[]).await?;
    webhook.register(&client, &["kube-system"]).await?;
    // The leader's address goes into EndpointSlices; the Services' endpoints are on this
    // machine's other address (the bridge never dials the controller's own).
    let mut controller = ControllerProcess::start_via(
        &cp.kubeconfig,
        &cp.ca_file(),
        &simulator.url,
        &LEADER.to_string(),
        &["--cluster-services-allowed", "ml/*"],
    )?;
    let outcome = scenarios(cp, &client, &mut controller).await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(80));
    }
    outcome
}

async fn scenarios(
    cp: &ControlPlane,
    client: &kube::Client,
    controller: &mut ControllerProcess,
) -> anyhow::Result<()> {
    let host = host_address()?;
    support::pods::node_ready_named(client, "virtual-runpod").await?;
    namespace(client, NS, true).await?;
    namespace(client, "ml", false).await?;
    let db_port = greeter("db-here")?;
    service(client, NS, "db", 5432, Some((host, db_port, true))).await?;
    service(client, NS, "starting", 6379, Some((host, db_port, false))).await?;
    let mlflow_port = greeter("mlflow-here")?;
    service(
        client,
        "ml",
        "mlflow",
        5000,
        Some((host, mlflow_port, true)),
    )
    .await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut pod = gpu_pod(POD, "e2e/server:1", "Never");
    pod.metadata.annotations =
        Some([("runpod.io/burst-mode".to_owned(), "always".to_owned())].into());
    pod.metadata.labels = Some([("app".to_owned(), "trainer".to_owned())].into());
    pods.create(&PostParams::default(), &pod).await?;
    let pod = running(&pods, POD).await?;
    let pod_id = wait::until("the pod's RunPod id", WAIT, || async {
        let pod = pods.get(POD).await?;
        Ok(support::pods::annotation(&pod, "runpod.io/pod-id").map(str::to_owned))
    })
    .await?;
    drop(pod);

    // The pod's own namespace: every name a local pod would use, one address.
    let db = resolved(&pod_id, "db").await?;
    for name in [
        "db.e2e-net",
        "db.e2e-net.svc",
        "db.e2e-net.svc.cluster.local",
    ] {
        ensure!(
            resolved(&pod_id, name).await? == db,
            "{name} is not db's address"
        );
    }
    ensure!(
        db.to_string().starts_with("127.") && db != IpAddr::from([127, 0, 0, 1]),
        "db resolves to {db}, not an address of its own on the pod's loopback"
    );
    answers(db, 5432, "db-here").await?;

    // Not ready: named (it may become ready) but refused, as in the cluster.
    let starting = resolved(&pod_id, "starting").await?;
    ensure!(starting != db, "two Services share one address");
    ensure!(
        TcpStream::connect_timeout(&SocketAddr::new(starting, 6379), Duration::from_secs(3))
            .is_err(),
        "a Service without ready endpoints accepted a connection"
    );

    // Created after the pod started: reachable within seconds.
    let cache_port = greeter("cache-here")?;
    service(client, NS, "cache", 6380, Some((host, cache_port, true))).await?;
    let cache = resolved(&pod_id, "cache.e2e-net.svc").await?;
    answers(cache, 6380, "cache-here").await?;

    // Another namespace: not reachable until the namespace asks, and only what is allowed.
    let hosts = std::fs::read_to_string(hosts_file(&pod_id))?;
    ensure!(
        !hosts.contains("mlflow"),
        "ml/mlflow reachable unasked:\n{hosts}"
    );
    ensure!(
        !hosts.contains("kubernetes"),
        "the apiserver is named in the pod:\n{hosts}"
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            NS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "runpod.io/cluster-services": "ml/mlflow,kube-system/*"
            }}})),
        )
        .await?;
    let mlflow = resolved(&pod_id, "mlflow.ml.svc.cluster.local").await?;
    answers(mlflow, 5000, "mlflow-here").await?;
    let refused = support::pods::event(client, NS, POD, "ClusterServicesRefused").await?;
    ensure!(
        refused.contains("kube-system/*") && !refused.contains("ml/mlflow"),
        "the refusal Event: {refused}"
    );
    let hosts = std::fs::read_to_string(hosts_file(&pod_id))?;
    ensure!(
        !hosts.contains(".kube-system"),
        "kube-system reachable though not allowed:\n{hosts}"
    );

    // Inbound: a Service selecting the pod; the pod's port is a server on its loopback.
    let pod_port = upper_echo()?;
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {"selector": {"app": "trainer"},
                         "ports": [{"name": "http", "port": 80, "targetPort": pod_port}]}
            }))?,
        )
        .await?;
    let reached = inbound(client, LEADER).await?;
    through_service(cp, pod_port)?;
    // A Service whose only backend is a burst pod (no pod IP, so no Endpoints list it) is
    // reachable outbound too: here from the pod itself, through the controller's listener.
    let web = resolved(&pod_id, "web.e2e-net.svc").await?;
    wait::until("the burst-only Service web, outbound", WAIT, || async {
        Ok(
            (echo(SocketAddr::new(web, 80), "hairpin").ok().as_deref() == Some("HAIRPIN"))
                .then_some(()),
        )
    })
    .await?;

    // A NetworkPolicy that denies everything to and from the pod: the bridge carries nothing,
    // and says so, until it is deleted.
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), NS);
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "deny-all"},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
            }))?,
        )
        .await?;
    let said = support::pods::event(client, NS, POD, "NetworkPolicyApplied").await?;
    ensure!(said.contains("deny-all"), "the policy Event: {said}");
    wait::until("outbound closed by the policy", WAIT, || async {
        let hosts = std::fs::read_to_string(hosts_file(&pod_id)).unwrap_or_default();
        let refused =
            TcpStream::connect_timeout(&SocketAddr::new(db, 5432), Duration::from_secs(3)).is_err();
        Ok((!hosts.contains(" db ") && refused).then_some(()))
    })
    .await?;
    wait::until("inbound closed by the policy", WAIT, || async {
        Ok(echo(reached, "closed?").is_err().then_some(()))
    })
    .await?;
    policies
        .delete("deny-all", &kube::api::DeleteParams::default())
        .await?;
    answers(db, 5432, "db-here").await?;
    let reached = inbound(client, LEADER).await?;

    policies_by_rule(client, &pod_id, host, reached, (db, cache, mlflow)).await?;

    // The controller SIGKILLed mid-stream: the pod's open connection ends (no half-open hang),
    // and the next leader's bridge carries new connections again, both ways.
    let mut open = TcpStream::connect_timeout(&SocketAddr::new(db, 5432), Duration::from_secs(5))?;
    open.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut greeting = [0u8; 8];
    open.read_exact(&mut greeting)?;
    ensure!(
        &greeting[..7] == b"db-here",
        "the open connection's greeting"
    );
    controller.kill();
    let mut rest = [0u8; 16];
    match open.read(&mut rest) {
        Ok(0) => {}
        Ok(n) => anyhow::bail!("the open connection carried {n} bytes after the SIGKILL"),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            anyhow::bail!("the open connection hangs half-open after the controller's SIGKILL")
        }
        Err(_) => {}
    }
    controller.restart()?;
    answers(db, 5432, "db-here").await?;
    answers(mlflow, 5000, "mlflow-here").await?;
    let again = wait::until("a new inbound port after the restart", WAIT, || async {
        let now = inbound(client, LEADER).await?;
        Ok((now != reached).then_some(now))
    })
    .await?;
    ensure!(again.ip() == LEADER, "the slice moved to {again}");
    Ok(())
}

/// The address of a pod allowed in by the ingress rule, and of no pod.
const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 5));
const STRANGER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 6));

/// NetworkPolicies with rules, judged per connection by the bridge; deleted at the end.
async fn policies_by_rule(
    client: &kube::Client,
    pod_id: &str,
    host: IpAddr,
    reached: SocketAddr,
    (db, cache, mlflow): (IpAddr, IpAddr, IpAddr),
) -> anyhow::Result<()> {
    // Pods that stand for a database and a client: on a node of their own that nothing runs.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "e2e-elsewhere"}}))?,
        )
        .await?;
    stand_in(client, "db-0", "db", Some(host)).await?;
    // An endpoint that names db-0 at another address is not db-0.
    stand_in(client, "db-1", "db", Some(IpAddr::from([127, 0, 0, 7]))).await?;
    stand_in(client, "client-0", "client", Some(CLIENT)).await?;
    // The Service pg, whose endpoint names the pod db-0 (as the endpoints controller writes),
    // and fake-db, whose endpoint (the same address) names db-1, which has another address.
    let pg_port = greeter("pg-here")?;
    let at = Some((host, pg_port, true));
    service_naming(client, NS, "pg", 5433, at, Some("db-0")).await?;
    service_naming(client, NS, "fake-db", 5434, at, Some("db-1")).await?;
    let fake = resolved(pod_id, "fake-db").await?;
    answers(fake, 5434, "pg-here").await?;
    let pg = resolved(pod_id, "pg").await?;
    answers(pg, 5433, "pg-here").await?;

    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), NS);
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), NS);
    let cache_endpoint = {
        let endpoints = endpoints.get("cache").await?;
        endpoints.subsets.unwrap_or_default()[0]
            .ports
            .clone()
            .unwrap_or_default()[0]
            .port
    };
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "egress-by-rule"},
                "spec": {"podSelector": {"matchLabels": {"app": "trainer"}},
                         "policyTypes": ["Egress"],
                         "egress": [
                             {"to": [{"podSelector": {"matchLabels": {"role": "db"}}}],
                              "ports": [{"port": pg_port, "protocol": "TCP"}]},
                             {"to": [{"ipBlock": {"cidr": format!("{host}/32")}}],
                              "ports": [{"port": cache_endpoint}]}
                         ]}
            }))?,
        )
        .await?;
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "from-clients"},
                "spec": {"podSelector": {"matchLabels": {"app": "trainer"}},
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}
            }))?,
        )
        .await?;
    for (policy, direction) in [("egress-by-rule", "egress"), ("from-clients", "ingress")] {
        wait::until(&format!("the Event applying {policy}"), WAIT, || async {
            let events = support::pods::events(client, NS, POD).await?;
            Ok(events
                .iter()
                .any(|(reason, message)| {
                    reason == "NetworkPolicyApplied"
                        && message.contains(policy)
                        && message.contains(&format!("restricts its {direction}"))
                })
                .then_some(()))
        })
        .await?;
    }
    // Egress: db's endpoint names no pod and is on another port: closed; pg (a db pod) and the
    // cache (the ipBlock, its port) still answer; mlflow (neither) is closed.
    wait::until("db closed by the egress rules", WAIT, || async {
        Ok((!talk(db, 5432).unwrap_or_default().starts_with("db-here")).then_some(()))
    })
    .await?;
    answers(pg, 5433, "pg-here").await?;
    answers(cache, 6380, "cache-here").await?;
    ensure!(
        !talk(fake, 5434).unwrap_or_default().starts_with("pg-here"),
        "an endpoint naming a db pod at an address not its own was taken for it"
    );
    ensure!(
        !talk(mlflow, 5000)
            .unwrap_or_default()
            .starts_with("mlflow-here"),
        "mlflow reached though no egress rule allows it"
    );
    // Ingress: from the client pod's address, yes; from an address no such pod has, no.
    wait::until("a stranger refused by the ingress rules", WAIT, || async {
        Ok((echo_from(STRANGER, reached, "stranger")
            .await
            .unwrap_or_default()
            != "STRANGER")
            .then_some(()))
    })
    .await?;
    let answer = echo_from(CLIENT, reached, "client here").await?;
    ensure!(
        answer == "CLIENT HERE",
        "the client pod was not let in: {answer:?}"
    );

    for name in ["egress-by-rule", "from-clients"] {
        policies
            .delete(name, &kube::api::DeleteParams::default())
            .await?;
    }
    answers(db, 5432, "db-here").await?;
    wait::until("a stranger let in again", WAIT, || async {
        Ok((echo_from(STRANGER, reached, "again")
            .await
            .unwrap_or_default()
            == "AGAIN")
            .then_some(()))
    })
    .await?;
    Ok(())
}

/// A pod labelled `role` on the node `e2e-elsewhere` (tolerating its taints), with `address`
/// as its pod IP.
async fn stand_in(
    client: &kube::Client,
    name: &str,
    role: &str,
    address: Option<IpAddr>,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"role": role}},
            "spec": {"nodeName": "e2e-elsewhere",
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "main", "image": "e2e/stand-in:1"}]}
        }))?,
    )
    .await?;
    if let Some(ip) = address {
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}}),
            ),
        )
        .await?;
    }
    Ok(())
}

/// One line to `at` from the local address `source`, and what comes back ("" when closed).
async fn echo_from(source: IpAddr, at: SocketAddr, text: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    let mut conn = tokio::time::timeout(Duration::from_secs(5), socket.connect(at)).await??;
    conn.write_all(text.as_bytes()).await?;
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf)).await??;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// The Service `web`'s EndpointSlice of this project, read from the apiserver, once it is ready
/// at the leader's address and its address carries connections to the pod; that address.
async fn inbound(client: &kube::Client, leader: IpAddr) -> anyhow::Result<SocketAddr> {
    let resource = kube::discovery::ApiResource {
        group: "discovery.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "discovery.k8s.io/v1beta1".into(),
        kind: "EndpointSlice".into(),
        plural: "endpointslices".into(),
    };
    let slices: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), NS, &resource);
    wait::until("web's EndpointSlice, ready and reaching the pod", WAIT, || async {
        let list = slices
            .list(&kube::api::ListParams::default().labels(
                "kubernetes.io/service-name=web,endpointslice.kubernetes.io/managed-by=runpod-kubelet.runpod.io",
            ))
            .await?;
        for slice in list.items {
            let endpoint = &slice.data["endpoints"][0];
            let ready = endpoint["conditions"]["ready"] == true;
            let address = endpoint["addresses"][0].as_str().unwrap_or_default();
            let port = slice.data["ports"][0]["port"].as_u64().unwrap_or_default();
            ensure!(
                slice.data["ports"][0]["name"] == "http",
                "the slice's port is not named as the Service's: {}",
                slice.data
            );
            ensure!(endpoint["targetRef"]["name"] == POD, "targetRef: {}", endpoint);
            let Ok(ip) = address.parse::<IpAddr>() else { continue };
            let Ok(port) = u16::try_from(port) else { continue };
            if !ready || ip != leader {
                continue;
            }
            let at = SocketAddr::new(ip, port);
            if echo(at, "hello burst").ok().as_deref() == Some("HELLO BURST") {
                return Ok(Some(at));
            }
        }
        Ok(None)
    })
    .await
}

/// `kubectl port-forward svc/web`: kubectl picks the pod behind the Service.
fn through_service(cp: &ControlPlane, pod_port: u16) -> anyhow::Result<()> {
    use std::io::BufRead as _;
    let local = support::webhook::free_port()?.port();
    let mut forward = std::process::Command::new("kubectl")
        .args([
            "-n",
            NS,
            "port-forward",
            "--address",
            "127.0.0.1",
            "svc/web",
        ])
        .arg(format!("{local}:80"))
        .env("KUBECONFIG", &cp.kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let result = (|| {
        // Kept open: kubectl writes a line per connection and dies on a closed pipe.
        let stdout = forward.stdout.take().context("stdout")?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let first = lines.next().context("port-forward printed nothing")??;
        ensure!(
            first.contains(&pod_port.to_string()),
            "kubectl did not forward to the pod's port {pod_port}: {first}"
        );
        let answer = echo(SocketAddr::from(([127, 0, 0, 1], local)), "via service")?;
        ensure!(
            answer == "VIA SERVICE",
            "port-forward svc/web answered {answer:?}"
        );
        Ok(())
    })();
    let _ = forward.kill();
    let mut stderr = String::new();
    if let Some(mut pipe) = forward.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    result.with_context(|| format!("kubectl port-forward svc/web stderr: {stderr}"))
}
