//! End-to-end tests of the controller's high availability and of `controller drain`, on the
//! real control plane with the RunPod simulator:
//!
//! - two replicas elect one leader; a GPU pod runs on RunPod; the leader is SIGKILLed; the
//!   standby takes the Lease, writes its own address into the node, adopts the running pod
//!   (exactly one RunPod pod ever created for it), provisions a new pod, and serves `kubectl
//!   logs` through the apiserver;
//! - `controller drain` with the leader still running (as in a Helm pre-delete hook): the
//!   leader acknowledges the marker, every RunPod pod of this cluster and node is terminated,
//!   the node is removed, an untagged RunPod pod and another cluster's pod live on, the running
//!   controller creates nothing afterwards, and a second drain succeeds doing nothing;
//! - a leader frozen (SIGSTOP) past its lease is replaced; resumed, it exits non-zero without
//!   sending RunPod a single byte (its calls go through a counting proxy), and nothing is
//!   duplicated;
//! - SIGTERM on the leader releases the Lease and exits 0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams, PostParams};
use runpod_kubelet::http::ApiKey;
use runpod_kubelet::runpod::client::RunPodClient;
use runpod_kubelet::runpod::config::ClientConfig;
use runpod_kubelet::runpod::model::{CreatePodRequest, GpuSpec};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{API_KEY, ControllerProcess, SimulatorProcess, run_command};
use support::proxy::CountingProxy;
use support::wait;

const NODE: &str = "virtual-runpod";
const CLUSTER: &str = "e2e-ha";
const NS: &str = "default";
const ELECTION_LEASE: &str = "runpod-kubelet-virtual-runpod";
const WAIT: Duration = Duration::from_secs(120);

fn scenario() -> serde_json::Value {
    json!({
        "provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 300,
        "images": [{"match": "server", "logs": ["serving on 8888"]}]
    })
}

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_controller_ha controller_fails_over_and_drains",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

/// One replica: the controller process and its metrics address.
struct Replica {
    process: ControllerProcess,
    ip: &'static str,
    metrics: String,
}

impl Replica {
    fn start(
        control_plane: &ControlPlane,
        runpod_url: &str,
        ip: &'static str,
    ) -> anyhow::Result<Replica> {
        let metrics = support::webhook::free_port()?.to_string();
        let process = ControllerProcess::start_via(
            &control_plane.kubeconfig,
            &control_plane.ca_file(),
            runpod_url,
            ip,
            &[
                "--leader-elect",
                "true",
                "--cluster-id",
                CLUSTER,
                "--metrics-listen",
                &metrics,
                "--leader-elect-lease-duration",
                "6s",
                "--leader-elect-renew-deadline",
                "4s",
                "--leader-elect-retry-period",
                "1s",
            ],
        )?;
        Ok(Replica {
            process,
            ip,
            metrics,
        })
    }

    async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let response = reqwest::get(format!("http://{}{path}", self.metrics)).await?;
        Ok((response.status().as_u16(), response.text().await?))
    }

    /// A sample of this replica's metrics, by exact series name.
    async fn metric(&self, series: &str) -> anyhow::Result<Option<f64>> {
        support::controller::metric(&self.metrics, series).await
    }

    fn log_tail(&self) -> String {
        let log = self.process.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

const LEADER: &str = "runpod_kubelet_leader";
const LISTS_OK: &str = "runpod_kubelet_runpod_lists_total{outcome=\"ok\"}";

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let simulator = SimulatorProcess::start(&scenario())?;
    let mut replicas = Vec::new();
    let outcome = scenarios(control_plane, &client, &simulator, &mut replicas).await;
    if outcome.is_err() {
        for replica in &mut replicas {
            eprintln!(
                "--- controller {} log tail (alive: {}) ---\n{}",
                replica.ip,
                replica.process.alive(),
                replica.log_tail()
            );
        }
    }
    outcome
}

async fn scenarios(
    control_plane: &ControlPlane,
    client: &kube::Client,
    simulator: &SimulatorProcess,
    replicas: &mut Vec<Replica>,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);

    // Replica A leads first; B then waits as a standby.
    replicas.push(Replica::start(control_plane, &simulator.url, "127.0.0.1")?);
    node_address_is(&nodes, "127.0.0.1").await?;
    let holder_a = holder(&leases).await?.context("no election Lease holder")?;
    ensure!(holder_a.contains("_127.0.0.1_"), "holder {holder_a}");
    // B reaches RunPod through a proxy that counts what it sends.
    let proxy_b = CountingProxy::start(&simulator.url).await?;
    replicas.push(Replica::start(control_plane, &proxy_b.url, "127.0.0.2")?);
    let (a, b) = (&replicas[0], &replicas[1]);
    wait::until("B ready as a standby", WAIT, || async {
        Ok(b.get("/readyz")
            .await
            .ok()
            .filter(|(code, body)| *code == 200 && body == "standby"))
    })
    .await?;
    ensure!(b.metric(LEADER).await? == Some(0.0), "B's leader gauge");
    wait::until("A's leader gauge", WAIT, || async {
        Ok((a.metric(LEADER).await? == Some(1.0)).then_some(()))
    })
    .await?;

    // A GPU pod runs on RunPod under A.
    pods.create(&PostParams::default(), &gpu_pod("first"))
        .await?;
    let first = running(&pods, "first").await?;
    let first_uid = first.metadata.uid.clone().context("uid")?;
    let first_id = annotation(&first, "runpod.io/pod-id").context("no pod id")?;
    ensure!(ledger_for(simulator, &first_uid).await?.len() == 1);

    // SIGKILL the leader: B takes the Lease and the node's address.
    replicas[0].process.kill();
    let b = &replicas[1];
    let holder_b = wait::until("B holds the election Lease", WAIT, || async {
        Ok(holder(&leases).await?.filter(|h| h.contains("_127.0.0.2_")))
    })
    .await?;
    ensure!(holder_b != holder_a, "holder unchanged");
    node_address_is(&nodes, "127.0.0.2").await?;
    ensure!(b.metric(LEADER).await? == Some(1.0), "B's leader gauge");
    let port_b = b.process.kubelet_port;
    let node = nodes.get(NODE).await?;
    let port = node
        .status
        .and_then(|s| s.daemon_endpoints)
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port);
    ensure!(port == Some(i32::from(port_b)), "kubelet port {port:?}");

    // B adopts the running pod: after several of its lists, still one RunPod pod, same id.
    let lists = wait::until("B lists RunPod", WAIT, || async {
        Ok(b.metric(LISTS_OK).await?.filter(|n| *n >= 1.0))
    })
    .await?;
    wait::until("three more lists by B", WAIT, || async {
        Ok(b.metric(LISTS_OK)
            .await?
            .filter(|n| *n >= lists + 3.0)
            .map(|_| ()))
    })
    .await?;
    let entries = ledger_for(simulator, &first_uid).await?;
    ensure!(
        entries.len() == 1 && entries[0]["terminated_at"].is_null(),
        "first pod after failover: {entries:?}"
    );
    let first = pods.get("first").await?;
    ensure!(
        phase(&first) == Some("Running"),
        "phase {:?}",
        phase(&first)
    );
    ensure!(annotation(&first, "runpod.io/pod-id") == Some(first_id.clone()));

    // The new leader provisions a new pod and serves logs through the apiserver.
    pods.create(&PostParams::default(), &gpu_pod("second"))
        .await?;
    let second = running(&pods, "second").await?;
    let second_uid = second.metadata.uid.clone().context("uid")?;
    ensure!(ledger_for(simulator, &second_uid).await?.len() == 1);
    for name in ["first", "second"] {
        wait::until("kubectl logs through the new leader", WAIT, || async {
            let text = pods.logs(name, &LogParams::default()).await?;
            Ok(text.contains("serving on 8888").then_some(()))
        })
        .await
        .with_context(|| format!("logs of {name}"))?;
    }

    // A leader that cannot renew stops: B frozen (SIGSTOP) past its lease, C takes over; B,
    // resumed, finds its fence run out and exits non-zero without acting.
    replicas.push(Replica::start(control_plane, &simulator.url, "127.0.0.3")?);
    let c = &replicas[2];
    wait::until("C ready as a standby", WAIT, || async {
        Ok(c.get("/readyz")
            .await
            .ok()
            .filter(|(code, body)| *code == 200 && body == "standby"))
    })
    .await?;
    replicas[1].process.signal("STOP")?;
    wait::until("C holds the election Lease", WAIT, || async {
        Ok(holder(&leases).await?.filter(|h| h.contains("_127.0.0.3_")))
    })
    .await?;
    node_address_is(&nodes, "127.0.0.3").await?;
    let sent_before_resume = proxy_b.sent();
    replicas[1].process.signal("CONT")?;
    let b = &mut replicas[1];
    let status = exited(&mut b.process).await?;
    ensure!(
        !status.success(),
        "the resumed old leader exited with {status:?}"
    );
    ensure!(
        proxy_b.sent() == sent_before_resume,
        "the deposed leader called RunPod after it resumed ({} bytes)",
        proxy_b.sent() - sent_before_resume
    );
    ensure!(
        b.process.log().contains("leadership lost"),
        "the resumed old leader did not report losing the lease"
    );
    ensure!(
        holder(&leases)
            .await?
            .is_some_and(|h| h.contains("_127.0.0.3_")),
        "the Lease moved away from C"
    );
    for uid in [&first_uid, &second_uid] {
        let entries = ledger_for(simulator, uid).await?;
        ensure!(
            entries.len() == 1 && entries[0]["terminated_at"].is_null(),
            "after the second failover: {entries:?}"
        );
    }

    drain_with_the_leader_running(control_plane, client, simulator, &replicas[2]).await?;

    // SIGTERM: the leader releases the Lease and exits 0.
    let b = &mut replicas[2];
    b.process.terminate()?;
    let status = exited(&mut b.process).await?;
    ensure!(status.success(), "C exited with {status:?}");
    let lease = leases.get(ELECTION_LEASE).await?;
    ensure!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_ref())
            .is_none(),
        "Lease not released: {:?}",
        lease.spec
    );
    Ok(())
}

async fn drain_with_the_leader_running(
    control_plane: &ControlPlane,
    client: &kube::Client,
    simulator: &SimulatorProcess,
    leader: &Replica,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    // Two RunPod pods drain must not touch: one untagged, one of another cluster.
    let template = ledger_for_cluster(simulator).await?.remove(0);
    let runpod = RunPodClient::new(
        ClientConfig {
            api_url: simulator.url.clone(),
            ..ClientConfig::default()
        },
        ApiKey::new(API_KEY.into())?,
    )?;
    let foreign = |name: &str, env: BTreeMap<String, String>| CreatePodRequest {
        name: name.into(),
        image: Some("e2e/server:1".into()),
        template_id: None,
        gpu: GpuSpec {
            id: template["gpu_id"].as_str().unwrap_or_default().into(),
            count: 1,
        },
        cloud: template["cloud"].as_str().unwrap_or("SECURE").into(),
        data_center_ids: vec![],
        disk: None,
        ports: vec![],
        env,
        args: None,
        registry: None,
        mounts: None,
    };
    let untagged = runpod
        .create_pod_once(&foreign("untagged", BTreeMap::new()))
        .await?
        .id;
    let other_env = BTreeMap::from([
        (
            "RUNPOD_KUBELET_CLUSTER".to_owned(),
            "another-cluster".to_owned(),
        ),
        ("RUNPOD_KUBELET_NODE".to_owned(), NODE.to_owned()),
        (
            "RUNPOD_KUBELET_POD_UID".to_owned(),
            "not-in-this-cluster".to_owned(),
        ),
    ]);
    let other = runpod
        .create_pod_once(&foreign("other-cluster", other_env))
        .await?
        .id;

    let drain = [
        "controller",
        "drain",
        "--nodename",
        NODE,
        "--cluster-id",
        CLUSTER,
        "--timeout",
        "90s",
        // As the controllers': drain waits this long for creates they may have sent.
        "--create-settle",
        "3s",
    ];
    let (status, log) = run_command(&control_plane.kubeconfig, simulator, &drain)?;
    ensure!(status.success(), "drain failed ({status:?}):\n{log}");
    ensure!(
        log.contains("the controller acknowledged the drain"),
        "the running leader did not acknowledge:\n{log}"
    );

    let ledger = simulator.ledger().await?;
    let live_ours: Vec<_> = ledger
        .iter()
        .filter(|e| e["env"]["RUNPOD_KUBELET_CLUSTER"] == CLUSTER && e["terminated_at"].is_null())
        .collect();
    ensure!(
        live_ours.is_empty(),
        "still billing after drain: {live_ours:?}"
    );
    for id in [&untagged, &other] {
        let entry = ledger
            .iter()
            .find(|e| e["id"] == id.as_str())
            .context("entry")?;
        ensure!(
            entry["terminated_at"].is_null(),
            "drain touched {id}: {entry}"
        );
    }
    ensure!(nodes.get_opt(NODE).await?.is_none(), "node still there");
    ensure!(
        pods.list(&ListParams::default()).await?.items.is_empty(),
        "pods bound to the node still there"
    );

    // The running leader creates nothing afterwards, even for a pod bound to the node.
    let created_before = ledger.len();
    let lists = leader.metric(LISTS_OK).await?.unwrap_or_default();
    let late = pods
        .create(&PostParams::default(), &gpu_pod("late"))
        .await?;
    let late_uid = late.metadata.uid.clone().context("uid")?;
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    wait::until(
        "the leader refuses to create for the late pod",
        WAIT,
        || async {
            let list = events.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .any(|e| {
                    e.involved_object.uid.as_deref() == Some(late_uid.as_str())
                        && e.message
                            .as_deref()
                            .is_some_and(|m| m.contains("no RunPod pod is created"))
                })
                .then_some(()))
        },
    )
    .await?;
    wait::until("three more lists by the leader", WAIT, || async {
        Ok(leader
            .metric(LISTS_OK)
            .await?
            .filter(|n| *n >= lists + 3.0)
            .map(|_| ()))
    })
    .await?;
    let ledger = simulator.ledger().await?;
    ensure!(
        ledger.len() == created_before,
        "created after drain: {:?}",
        &ledger[created_before..]
    );

    // A second drain finds nothing to do.
    let (status, log) = run_command(&control_plane.kubeconfig, simulator, &drain)?;
    ensure!(status.success(), "second drain failed ({status:?}):\n{log}");
    ensure!(simulator.ledger().await?.len() == created_before);
    Ok(())
}

async fn exited(process: &mut ControllerProcess) -> anyhow::Result<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(status) = process.exit_status() {
            return Ok(status);
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the controller did not exit"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn gpu_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"runpod.io/burst": "enabled"}},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Always",
            "containers": [{"name": "main", "image": "e2e/server:1",
                "command": ["python", "-m", "http.server", "8888"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap()
}

async fn running(pods: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait::until(&format!("{name} Running"), WAIT, || async {
        let pod = pods.get(name).await?;
        Ok((phase(&pod) == Some("Running")).then_some(pod))
    })
    .await
}

async fn node_address_is(nodes: &Api<Node>, ip: &str) -> anyhow::Result<()> {
    wait::until(&format!("node InternalIP {ip}"), WAIT, || async {
        let Some(node) = nodes.get_opt(NODE).await? else {
            return Ok(None);
        };
        let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
        Ok((addresses.len() == 1
            && addresses[0].type_ == "InternalIP"
            && addresses[0].address == ip)
            .then_some(()))
    })
    .await
}

async fn holder(leases: &Api<Lease>) -> anyhow::Result<Option<String>> {
    Ok(leases
        .get_opt(ELECTION_LEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

async fn ledger_for(
    simulator: &SimulatorProcess,
    uid: &str,
) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(simulator
        .ledger()
        .await?
        .into_iter()
        .filter(|e| e["env"]["RUNPOD_KUBELET_POD_UID"] == uid)
        .collect())
}

async fn ledger_for_cluster(
    simulator: &SimulatorProcess,
) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(simulator
        .ledger()
        .await?
        .into_iter()
        .filter(|e| e["env"]["RUNPOD_KUBELET_CLUSTER"] == CLUSTER)
        .collect())
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn annotation(pod: &Pod, key: &str) -> Option<String> {
    pod.metadata.annotations.as_ref()?.get(key).cloned()
}
