//! End-to-end tests of Vast.ai as a second cloud, on the real control plane: the webhook, one
//! controller per cloud (`virtual-runpod` and `virtual-vastai`) and both simulators as processes.
//! A GPU Job in a namespace labelled `runpod.io/provider=vastai` bursts to Vast.ai inside the
//! allowed region and completes; a forbidden region is refused at admission; a RunPod namespace
//! still runs on RunPod; `cheapest` follows the published prices; lost create answers and a
//! SIGKILL of the controller leave exactly one instance per pod; deletion destroys instances.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use base64::Engine as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use serde_json::{Value, json};
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::{annotation, exit_code, phase};
use support::wait;
use support::webhook::WebhookProcess;

const VAST_NODE: &str = "virtual-vastai";
const RUNPOD_NODE: &str = "virtual-runpod";
const CLUSTER: &str = "e2e-cluster";
const WAIT: Duration = Duration::from_secs(180);

/// A market with cheaper offers outside Europe (which the policy must never buy) and enough
/// European ones for every pod of the test (each offer sells once).
fn offers() -> Value {
    let offer = |id: u64, geolocation: &str, dph_base: f64| {
        json!({"id": id, "machine_id": id, "host_id": id / 10, "gpu_name": "RTX 4090",
               "num_gpus": 1, "gpu_ram": 24564, "dph_base": dph_base, "storage_cost": 0.15,
               "geolocation": geolocation, "verification": "verified", "hosting_type": 1,
               "reliability": 0.995})
    };
    let mut all = vec![
        offer(100, "Texas, US", 0.11),
        offer(101, "Tokyo, JP", 0.12),
        offer(102, "Quebec, CA", 0.13),
    ];
    for i in 0..14 {
        let place = if i % 2 == 0 {
            "Poland, PL"
        } else {
            "Hesse, DE"
        };
        all.push(offer(200 + i, place, 0.30 + 0.01 * i as f64));
    }
    Value::Array(all)
}

fn vast_scenario() -> Value {
    json!({
        "offers": offers(),
        "provisioning_ms": 500, "loading_ms": 1000, "list_lag_ms": 1500, "log_ready_polls": 1,
        "images": [
            {"contains": "trainer", "behaviour": {"kind": "exit", "after_ms": 4000, "code": 0},
             "logs": ["epoch 1", "epoch 2"]},
            {"contains": "server", "behaviour": {"kind": "run"}, "logs": ["serving"]}
        ]
    })
}

fn runpod_scenario() -> Value {
    json!({
        "provisioning_ms": 500, "starting_ms": 500, "ports_ms": 500, "list_lag_ms": 500,
        "images": [{"match": "trainer", "outcome": "EXITED", "after_ms": 3000,
                    "logs": ["epoch 1"], "exit_code": 0}]
    })
}

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_vastai both_clouds_in_one_cluster",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

struct World {
    client: kube::Client,
    vast: SimulatorProcess,
    runpod: SimulatorProcess,
    /// The Vast.ai controller's metrics address.
    vast_metrics: String,
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let vast = SimulatorProcess::start_cloud("vastai", &vast_scenario())?;
    let runpod = SimulatorProcess::start(&runpod_scenario())?;
    let policy = ["--vastai-regions", "Europe", "--max-gpu-price", "2"];
    let webhook = WebhookProcess::start(&control_plane.kubeconfig, &policy).await?;
    webhook.register(&client, &["kube-system"]).await?;
    let vast_metrics = support::webhook::free_port()?.to_string();
    let mut vast_args = vec![
        "--provider",
        "vastai",
        "--nodename",
        VAST_NODE,
        "--vastai-api-url",
        &vast.url,
        "--cluster-id",
        CLUSTER,
        // The simulator's list lags creates by 1.5 s.
        "--vastai-read-lag",
        "5s",
        "--metrics-listen",
        &vast_metrics,
    ];
    vast_args.extend(policy);
    let mut vast_controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &runpod,
        &vast_args,
    )?;
    let runpod_controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &runpod,
        &["--cluster-id", CLUSTER],
    )?;
    let world = World {
        client,
        vast,
        runpod,
        vast_metrics: vast_metrics.clone(),
    };
    let outcome = scenarios(&world, &mut vast_controller).await;
    if outcome.is_err() {
        eprintln!(
            "--- vastai controller log tail ---\n{}\n--- runpod controller log tail ---\n{}",
            vast_controller.log_tail(80),
            runpod_controller.log_tail(30)
        );
    }
    outcome
}

async fn scenarios(world: &World, vast_controller: &mut ControllerProcess) -> anyhow::Result<()> {
    let vast_node = node_ready(&world.client, VAST_NODE)
        .await
        .context("the Vast.ai node")?;
    let labels = vast_node.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels
            .get("virtual-kubelet.io/provider")
            .map(String::as_str)
            == Some("vastai"),
        "labels {labels:?}"
    );
    let taints = serde_json::to_value(&vast_node.spec.as_ref().unwrap().taints)?;
    for effect in ["NoSchedule", "PreferNoSchedule"] {
        ensure!(
            taints
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t["key"] == "virtual-kubelet.io/provider"
                    && t["value"] == "vastai"
                    && t["effect"] == effect),
            "taints {taints}"
        );
    }
    node_ready(&world.client, RUNPOD_NODE)
        .await
        .context("the RunPod node")?;

    job_bursts_to_vastai(world).await.context("a Vast.ai Job")?;
    forbidden_region_is_refused(world)
        .await
        .context("a forbidden region")?;
    runpod_namespace_stays_on_runpod(world)
        .await
        .context("a RunPod Job")?;
    cheapest_follows_the_published_prices(world)
        .await
        .context("cheapest")?;
    lost_answers_and_a_crash_buy_once(world, vast_controller)
        .await
        .context("lost create answers and SIGKILL")?;
    deletion_destroys_the_instance(world)
        .await
        .context("deletion")?;
    a_memory_request_no_machine_has_is_refused(world)
        .await
        .context("a memory request no machine has")?;
    orphans_are_destroyed_and_strangers_kept(world)
        .await
        .context("garbage collection")?;
    Ok(())
}

/// 1. A plain GPU Job with the seed's annotations, in a `runpod.io/provider=vastai` namespace.
async fn job_bursts_to_vastai(world: &World) -> anyhow::Result<()> {
    let ns = "e2e-vast";
    namespace(&world.client, ns, &[("runpod.io/provider", "vastai")]).await?;
    let annotations = json!({"vast.ai/gpu-type": "RTX 4090", "vast.ai/region": "Europe",
                             "vast.ai/disk": "30GB"});
    // A private image: the pod's imagePullSecrets become the instance's registry login.
    let auth = base64::engine::general_purpose::STANDARD.encode("e2e-bot:pull-t0ken");
    let config = json!({"auths": {"https://index.docker.io/v1/": {"auth": auth}}});
    Api::<Secret>::namespaced(world.client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "regcred"}, "type": "kubernetes.io/dockerconfigjson",
                "stringData": {".dockerconfigjson": config.to_string()}
            }))?,
        )
        .await?;
    create_job(
        &world.client,
        ns,
        "train",
        "e2e/trainer:1",
        1,
        &annotations,
        Some("regcred"),
    )
    .await?;
    job_succeeds(&world.client, ns, "train", 1).await?;
    let pod = pods_of_job(&world.client, ns, "train").await?.remove(0);
    let uid = pod.metadata.uid.clone().context("uid")?;
    ensure!(phase(&pod) == Some("Succeeded"), "phase {:?}", phase(&pod));
    ensure!(
        exit_code(&pod) == Some(0),
        "exit code {:?}",
        exit_code(&pod)
    );
    ensure!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(VAST_NODE),
        "not on the Vast.ai node"
    );
    ensure!(
        annotation(&pod, "runpod.io/provider") == Some("vastai"),
        "provider annotation {:?}",
        annotation(&pod, "runpod.io/provider")
    );
    let entries = labelled(&world.vast, &uid).await?;
    ensure!(entries.len() == 1, "instances for the pod: {entries:?}");
    let entry = &entries[0];
    ensure!(
        annotation(&pod, "vast.ai/instance-id") == Some(entry["id"].to_string().as_str()),
        "vast.ai/instance-id {:?} for instance {}",
        annotation(&pod, "vast.ai/instance-id"),
        entry["id"]
    );
    ensure!(
        annotation(&pod, "runpod.io/pod-id").is_none(),
        "a RunPod id on a Vast.ai pod"
    );
    let geolocation = entry["geolocation"].as_str().unwrap_or_default();
    ensure!(
        geolocation == "Poland, PL" && annotation(&pod, "runpod.io/datacenter") == Some("PL"),
        "not the cheapest European offer: {geolocation}, {:?}",
        annotation(&pod, "runpod.io/datacenter")
    );
    ensure!(entry["gpu_name"] == "RTX 4090", "GPU {}", entry["gpu_name"]);
    ensure!(
        entry["image_login"] == true,
        "the registry login was not sent: {entry}"
    );
    ensure!(entry["disk"] == 30.0, "disk {}", entry["disk"]);
    ensure!(
        entry["label"] == format!("rpk:{CLUSTER}:{VAST_NODE}:{uid}"),
        "label {}",
        entry["label"]
    );
    ensure!(
        !entry["destroyed_at"].is_null(),
        "the finished pod's instance still bills"
    );
    let created = support::pods::event(
        &world.client,
        ns,
        pod.metadata.name.as_deref().unwrap(),
        "RunPodPodCreated",
    )
    .await?;
    ensure!(
        created.starts_with(&format!("Vast.ai instance {}: ", entry["id"])),
        "Event {created:?}"
    );
    // Everything a person reads about a Vast.ai pod names Vast.ai: no Event message, status
    // message or container id says RunPod (Event reasons keep their names).
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    for (reason, message) in support::pods::events(&world.client, ns, name).await? {
        ensure!(
            !message.contains("RunPod") && !message.contains("runpod://"),
            "Event {reason} of a Vast.ai pod names RunPod: {message:?}"
        );
    }
    let status = serde_json::to_string(&pod.status)?;
    ensure!(
        !status.contains("RunPod") && !status.contains("runpod://"),
        "the status of a Vast.ai pod names RunPod: {status}"
    );
    let container_id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone())
        .unwrap_or_default();
    // Set once the controller saw the instance running (a very short Job may end first).
    ensure!(
        container_id.is_empty() || container_id == format!("vastai://{}", entry["id"]),
        "container id {container_id:?}"
    );
    // The instance is gone, yet `kubectl logs` (through the apiserver) shows its output.
    let log = Api::<Pod>::namespaced(world.client.clone(), ns)
        .logs(pod.metadata.name.as_deref().unwrap(), &LogParams::default())
        .await?;
    ensure!(log.contains("epoch 2"), "log {log:?}");
    Ok(())
}

/// 2. A region outside the installation's policy is refused, naming what is allowed.
async fn forbidden_region_is_refused(world: &World) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), "e2e-vast");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "in-asia", "annotations": {"vast.ai/region": "Asia",
                     "runpod.io/burst-mode": "always"}},
        "spec": {"containers": [{"name": "main", "image": "e2e/server:1",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))?;
    match pods.create(&PostParams::default(), &pod).await {
        Ok(_) => bail!("a pod asking for Asia was admitted"),
        Err(kube::Error::Api(status)) => {
            ensure!(
                status.message.contains("Asia") && status.message.contains("Europe"),
                "refusal {:?}",
                status.message
            );
        }
        Err(other) => return Err(other.into()),
    }
    Ok(())
}

/// 3. A namespace without the provider label still bursts to RunPod.
async fn runpod_namespace_stays_on_runpod(world: &World) -> anyhow::Result<()> {
    let ns = "e2e-runpod";
    namespace(&world.client, ns, &[]).await?;
    let before = world.vast.ledger().await?.len();
    create_job(
        &world.client,
        ns,
        "train",
        "e2e/trainer:1",
        1,
        &json!({}),
        None,
    )
    .await?;
    job_succeeds(&world.client, ns, "train", 1).await?;
    let pod = pods_of_job(&world.client, ns, "train").await?.remove(0);
    ensure!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(RUNPOD_NODE),
        "not on the RunPod node"
    );
    let uid = pod.metadata.uid.clone().context("uid")?;
    let on_runpod = support::pods::ledger_for(&world.runpod, &uid).await?;
    ensure!(on_runpod.len() == 1, "RunPod pods: {on_runpod:?}");
    ensure!(
        world.vast.ledger().await?.len() == before,
        "a RunPod pod bought a Vast.ai instance"
    );
    Ok(())
}

/// 4. `cheapest` picks the cloud whose node publishes the lower price, and writes it.
async fn cheapest_follows_the_published_prices(world: &World) -> anyhow::Result<()> {
    let prices = wait::until("both nodes publish a price", WAIT, || async {
        let mut prices = BTreeMap::new();
        for (node, cloud) in [(RUNPOD_NODE, "runpod"), (VAST_NODE, "vastai")] {
            let node = Api::<Node>::all(world.client.clone()).get(node).await?;
            let published = node
                .metadata
                .annotations
                .unwrap_or_default()
                .get("runpod.io/cheapest-gpu-price")
                .cloned();
            let lowest = published.and_then(|value| {
                value
                    .split(',')
                    .filter_map(|entry| entry.split_once('=')?.1.parse::<f64>().ok())
                    .min_by(f64::total_cmp)
            });
            if let Some(lowest) = lowest {
                prices.insert(cloud, lowest);
            }
        }
        Ok((prices.len() == 2).then_some(prices))
    })
    .await?;
    let expected = if prices["vastai"] < prices["runpod"] {
        "vastai"
    } else {
        "runpod"
    };
    let ns = "e2e-cheapest";
    namespace(&world.client, ns, &[("runpod.io/provider", "cheapest")]).await?;
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "cheap", "annotations": {"runpod.io/burst-mode": "always"}},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "e2e/trainer:1",
                 "command": ["python", "train.py"],
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))?;
    let created = pods.create(&PostParams::default(), &pod).await?;
    ensure!(
        annotation(&created, "runpod.io/provider") == Some(expected),
        "cheapest chose {:?}, prices {prices:?}",
        annotation(&created, "runpod.io/provider")
    );
    let selector = created
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    ensure!(
        selector
            .get("virtual-kubelet.io/provider")
            .map(String::as_str)
            == Some(expected),
        "node selector {selector:?}"
    );
    let done = wait::until("the cheapest pod ends", WAIT, || async {
        let pod = pods.get("cheap").await?;
        if phase(&pod) == Some("Failed") {
            bail!("the cheapest pod failed: {:?}", pod.status);
        }
        Ok((phase(&pod) == Some("Succeeded")).then_some(pod))
    })
    .await?;
    let node = format!("virtual-{expected}");
    ensure!(
        done.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()),
        "ran on {:?}",
        done.spec.as_ref().and_then(|s| s.node_name.clone())
    );
    Ok(())
}

/// 5. Half the create answers are lost and the controller is SIGKILLed while it creates: every
///    pod still gets exactly one instance, and none bills once the Job is done.
async fn lost_answers_and_a_crash_buy_once(
    world: &World,
    controller: &mut ControllerProcess,
) -> anyhow::Result<()> {
    let ns = "e2e-vast-crash";
    namespace(&world.client, ns, &[("runpod.io/provider", "vastai")]).await?;
    // Every other create makes the instance, then answers 502.
    for after in [0, 2] {
        world
            .vast
            .inject(
                &json!({"when": {"route": "create"}, "after": after, "times": 1,
                            "effect": {"kind": "create_then_fail", "status": 502}}),
            )
            .await?;
    }
    create_job(
        &world.client,
        ns,
        "batch",
        "e2e/trainer:2",
        4,
        &json!({}),
        None,
    )
    .await?;
    // The first create has gone out (answered or not): kill the controller mid-way.
    wait::until("a first instance is bought", WAIT, || async {
        let ledger = world.vast.ledger().await?;
        Ok(ledger
            .iter()
            .any(|e| e["image"] == "e2e/trainer:2")
            .then_some(()))
    })
    .await?;
    controller.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    controller.restart()?;
    job_succeeds(&world.client, ns, "batch", 4).await?;
    world.vast.clear_faults().await?;
    let pods = pods_of_job(&world.client, ns, "batch").await?;
    let ledger = world.vast.ledger().await?;
    let mine: Vec<&Value> = ledger
        .iter()
        .filter(|e| e["image"] == "e2e/trainer:2")
        .collect();
    ensure!(
        mine.iter().any(|e| e["create_status"] == 502),
        "no create answer was lost: {mine:?}"
    );
    let mut per_label: BTreeMap<String, usize> = BTreeMap::new();
    for entry in &mine {
        *per_label
            .entry(entry["label"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    ensure!(
        per_label.values().all(|count| *count == 1),
        "a label was bought twice: {per_label:?}"
    );
    ensure!(
        mine.len() == pods.len(),
        "{} instances for {} pods",
        mine.len(),
        pods.len()
    );
    let live: Vec<&&Value> = mine
        .iter()
        .filter(|e| e["destroyed_at"].is_null())
        .collect();
    ensure!(
        wait_all_destroyed(&world.vast, "e2e/trainer:2").await?,
        "instances still billing: {live:?}"
    );
    Ok(())
}

/// 6. Deleting a running pod destroys its instance.
async fn deletion_destroys_the_instance(world: &World) -> anyhow::Result<()> {
    let ns = "e2e-vast";
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "server", "annotations": {"runpod.io/burst-mode": "always"}},
        "spec": {"containers": [{"name": "main", "image": "e2e/server:1",
                 "env": [{"name": "SIM_GPU_UTIL", "value": "73"}],
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let running = wait::until("the server runs", WAIT, || async {
        let pod = pods.get("server").await?;
        Ok((phase(&pod) == Some("Running")).then_some(pod))
    })
    .await?;
    let uid = running.metadata.uid.clone().context("uid")?;
    ensure!(
        labelled(&world.vast, &uid).await?.len() == 1,
        "one instance for the server"
    );
    // Its GPU utilization, as Vast.ai reports it, on the controller's /metrics.
    let series = format!(
        "runpod_kubelet_pod_gpu_utilization_ratio{{namespace=\"{ns}\",pod=\"server\",provider=\"vastai\"}}"
    );
    let gpu = wait::until(&series, WAIT, || async {
        support::controller::metric(&world.vast_metrics, &series).await
    })
    .await?;
    ensure!((gpu - 0.73).abs() < 1e-9, "{series} = {gpu}");
    pods.delete("server", &DeleteParams::default()).await?;
    support::pods::gone(&pods, "server").await?;
    wait::until("the ended pod's series removed", WAIT, || async {
        let value = support::controller::metric(&world.vast_metrics, &series).await?;
        Ok(value.is_none().then_some(()))
    })
    .await?;
    let entries = labelled(&world.vast, &uid).await?;
    ensure!(
        entries.len() == 1 && !entries[0]["destroyed_at"].is_null(),
        "after deletion: {entries:?}"
    );
    let live: Vec<Value> = world
        .vast
        .ledger()
        .await?
        .into_iter()
        .filter(|e| e["destroyed_at"].is_null())
        .collect();
    ensure!(live.is_empty(), "instances still billing: {live:?}");
    Ok(())
}

/// A pod whose memory request no offered machine has fails with the reason (the most
/// offered), and nothing is bought.
async fn a_memory_request_no_machine_has_is_refused(world: &World) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), "e2e-vast");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "huge", "annotations": {"runpod.io/burst-mode": "always"}},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "e2e/server:1",
                 "resources": {"requests": {"memory": "4000Gi"},
                               "limits": {"nvidia.com/gpu": "1"}}}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let failed = wait::until("the huge pod refused", WAIT, || async {
        let pod = pods.get("huge").await?;
        Ok((phase(&pod) == Some("Failed")).then_some(pod))
    })
    .await?;
    let message = failed
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    ensure!(
        message.contains("GB of host RAM (the most offered: 128.0 GB)"),
        "the refusal: {message}"
    );
    let uid = failed.metadata.uid.clone().context("uid")?;
    ensure!(
        labelled(&world.vast, &uid).await?.is_empty(),
        "an instance was bought for a pod no machine can hold"
    );
    pods.delete("huge", &DeleteParams::default()).await?;
    Ok(())
}

/// 7. An instance labelled for this cluster and node whose pod does not exist is destroyed;
///    another cluster's and an unlabelled one on the same account are never touched.
async fn orphans_are_destroyed_and_strangers_kept(world: &World) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    // The same account as the controller: creates share its 4.5 s pace, so a 429 waits.
    let buy = |offer: u64, label: String| {
        let http = http.clone();
        let url = format!("{}/api/v0/asks/{offer}/", world.vast.url);
        let body = json!({"client_id": "me", "image": "someone/else:1", "disk": 10,
                          "label": label, "env": {}, "runtype": "args", "cancel_unavail": true});
        async move {
            for _ in 0..10 {
                let response = http
                    .put(&url)
                    .bearer_auth(support::controller::API_KEY)
                    .json(&body)
                    .send()
                    .await?;
                if response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
                    tokio::time::sleep(Duration::from_secs(13)).await;
                    continue;
                }
                let reply: Value = response.error_for_status()?.json().await?;
                return reply["new_contract"]
                    .as_u64()
                    .context("no new_contract in the create answer");
            }
            bail!("the create stayed rate-limited")
        }
    };
    let orphan = buy(100, format!("rpk:{CLUSTER}:{VAST_NODE}:no-such-pod")).await?;
    let foreign = buy(101, format!("rpk:other-cluster:{VAST_NODE}:some-pod")).await?;
    let unlabelled = buy(102, "my notebook".to_owned()).await?;
    let state = |ledger: &[Value], id: u64| {
        ledger
            .iter()
            .find(|e| e["id"] == id)
            .map(|e| e["destroyed_at"].is_null())
    };
    wait::until("the orphan destroyed", WAIT, || async {
        let ledger = world.vast.ledger().await?;
        Ok((state(&ledger, orphan) == Some(false)).then_some(()))
    })
    .await?;
    // Several more GC passes later, the strangers still run.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ledger = world.vast.ledger().await?;
    ensure!(
        state(&ledger, foreign) == Some(true) && state(&ledger, unlabelled) == Some(true),
        "another cluster's or an unlabelled instance was touched: {ledger:?}"
    );
    Ok(())
}

async fn wait_all_destroyed(vast: &SimulatorProcess, image: &str) -> anyhow::Result<bool> {
    wait::until("every instance destroyed", WAIT, || async {
        let ledger = vast.ledger().await?;
        Ok(ledger
            .iter()
            .filter(|e| e["image"] == image)
            .all(|e| !e["destroyed_at"].is_null())
            .then_some(true))
    })
    .await
}

/// Ledger entries whose label names the pod `uid`.
async fn labelled(vast: &SimulatorProcess, uid: &str) -> anyhow::Result<Vec<Value>> {
    Ok(vast
        .ledger()
        .await?
        .into_iter()
        .filter(|e| {
            e["label"]
                .as_str()
                .is_some_and(|label| label.ends_with(&format!(":{uid}")))
        })
        .collect())
}

async fn node_ready(client: &kube::Client, name: &str) -> anyhow::Result<Node> {
    support::pods::node_ready_named(client, name).await
}

/// A burst-enabled namespace with more labels, once its ServiceAccount exists.
async fn namespace(
    client: &kube::Client,
    name: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<()> {
    let mut all = labels.to_vec();
    all.push(("runpod.io/burst", "enabled"));
    support::pods::namespace_labelled(client, name, &all).await
}

async fn create_job(
    client: &kube::Client,
    ns: &str,
    name: &str,
    image: &str,
    completions: u32,
    annotations: &Value,
    pull_secret: Option<&str>,
) -> anyhow::Result<()> {
    let mut template_annotations = annotations.clone();
    template_annotations["runpod.io/burst-mode"] = json!("always");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "completions": completions, "parallelism": completions,
                 "template": {"metadata": {"annotations": template_annotations},
                 "spec": {"restartPolicy": "Never",
                  "containers": [{"name": "main", "image": image,
                      "command": ["python", "train.py"],
                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }))?;
    let mut job = job;
    if let (Some(secret), Some(spec)) = (
        pull_secret,
        job.spec
            .as_mut()
            .and_then(|spec| spec.template.spec.as_mut()),
    ) {
        spec.image_pull_secrets = Some(vec![k8s_openapi::api::core::v1::LocalObjectReference {
            name: secret.to_owned(),
        }]);
    }
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
}

async fn job_succeeds(
    client: &kube::Client,
    ns: &str,
    name: &str,
    count: i32,
) -> anyhow::Result<()> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    wait::until(&format!("Job {name} complete"), WAIT, || async {
        let status = jobs.get(name).await?.status.unwrap_or_default();
        if status.failed.unwrap_or(0) > 0 {
            bail!("Job {name} failed: {status:?}");
        }
        Ok((status.succeeded.unwrap_or(0) == count).then_some(()))
    })
    .await
}

async fn pods_of_job(client: &kube::Client, ns: &str, job: &str) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await?;
    ensure!(!list.items.is_empty(), "no pod of Job {job}");
    Ok(list.items)
}
