//! Persistent volumes on the real control plane (scheduler, PV controller), the webhook, the
//! controller and the RunPod simulator. A claim of the `runpod-network` StorageClass
//! (`WaitForFirstConsumer`) is provisioned when its first pod is scheduled: the scheduler picks
//! the virtual node, the controller makes one RunPod network volume named from the claim's UID
//! and a PV pre-bound to the claim with affinity to the node, the PV controller binds them, and
//! the pod's create carries `mounts.network` and the volume's datacenter. A volume create whose
//! answer is lost makes no second volume. A pod mounting a claim of another class is refused.
//! A file written on the volume by one pod is there for the next Job's pod on the claim (the
//! simulator keeps one directory per volume, seen by every pod that mounts it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::annotation;
use support::webhook::WebhookProcess;

const NS: &str = "e2e-vol";
const CLUSTER: &str = "e2e-vol-cluster";

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_volumes claims_become_network_volumes",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

async fn run(cp: &ControlPlane) -> anyhow::Result<()> {
    let client = cp.client().await?;
    let simulator = SimulatorProcess::start(
        &json!({"provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 300}),
    )?;
    let webhook = WebhookProcess::start(&cp.kubeconfig, &[]).await?;
    webhook.register(&client, &["kube-system"]).await?;
    let metrics = support::webhook::free_port()?.to_string();
    let mut controller = ControllerProcess::start(
        &cp.kubeconfig,
        &cp.ca_file(),
        &simulator,
        &["--cluster-id", CLUSTER, "--metrics-listen", &metrics],
    )?;
    let outcome = scenarios(cp, &client, &simulator, &metrics, &mut controller).await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(80));
        let log = controller.log();
        let storage: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("storage") || l.contains("Event") || l.contains("volume"))
            .collect();
        eprintln!(
            "--- controller log, storage lines ---\n{}",
            storage[storage.len().saturating_sub(40)..].join("\n")
        );
        let pods = Api::<Pod>::namespaced(client.clone(), NS)
            .list(&Default::default())
            .await;
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
            .list(&Default::default())
            .await;
        eprintln!(
            "--- pods ---\n{}\n--- claims ---\n{}",
            pods.map(|l| serde_json::to_string_pretty(&l.items).unwrap_or_default())
                .unwrap_or_default(),
            claims
                .map(|l| serde_json::to_string_pretty(&l.items).unwrap_or_default())
                .unwrap_or_default()
        );
        for name in ["trainer", "data", "second", "checkpoints"] {
            eprintln!(
                "events of {name}: {:?}",
                support::pods::events(&client, NS, name).await
            );
        }
    }
    outcome
}

async fn scenarios(
    cp: &ControlPlane,
    client: &kube::Client,
    simulator: &SimulatorProcess,
    metrics: &str,
    controller: &mut ControllerProcess,
) -> anyhow::Result<()> {
    support::pods::node_ready_named(client, "virtual-runpod").await?;
    support::pods::namespace(client, NS, true).await?;
    Api::<StorageClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "runpod-network"},
                "provisioner": "network-volume.runpod.io",
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
                "allowVolumeExpansion": true
            }))?,
        )
        .await?;
    first_pod_provisions_its_claim(client, simulator)
        .await
        .context("a claim provisioned for its first pod")?;
    a_file_is_there_for_the_next_job(cp, client)
        .await
        .context("a file on the volume, for the next Job")?;
    a_lost_create_answer_makes_no_second_volume(client, simulator)
        .await
        .context("a lost create answer")?;
    // Both volumes (22 and 10 GB) bill storage, published for the namespace.
    let expected = 32.0 * 0.07 / 720.0;
    let series = format!("runpod_kubelet_volume_cost_per_hour{{namespace=\"{NS}\"}}");
    support::wait::until(
        "the namespace's volume cost published",
        std::time::Duration::from_secs(60),
        || async {
            let value = support::controller::metric(metrics, &series).await?;
            Ok(value.filter(|v| (v - expected).abs() < 1e-6).map(|_| ()))
        },
    )
    .await?;
    // And counts against the namespace's budget: storage lines in its shared ledger.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    support::wait::until(
        "the volumes' storage in the namespace's budget ledger",
        std::time::Duration::from_secs(60),
        || async {
            let Some(ledger) = maps.get_opt(&format!("runpod-kubelet-budget-{NS}")).await? else {
                return Ok(None);
            };
            let stored: f64 = ledger
                .data
                .unwrap_or_default()
                .iter()
                .filter(|(key, _)| key.starts_with("volume."))
                .filter_map(|(_, line)| serde_json::from_str::<serde_json::Value>(line).ok())
                .filter(|line| line["state"] == "storage")
                .filter_map(|line| line["usd"].as_f64())
                .sum();
            Ok(((stored - expected).abs() < 1e-6).then_some(()))
        },
    )
    .await?;
    another_class_is_refused(client)
        .await
        .context("a claim of another class")?;
    a_grown_claim_grows_its_volume(client, simulator)
        .await
        .context("growing a claim")?;
    a_static_pv_binds_an_existing_volume(client, simulator)
        .await
        .context("a static PV")?;
    a_deleted_claim_deletes_its_volume(client, simulator)
        .await
        .context("deleting a claim")?;
    a_volume_goes_where_its_first_pod_may_run(client, simulator)
        .await
        .context("a claim whose first pod names its datacenters")?;
    a_pv_naming_its_volume_by_annotation_is_mounted(client, simulator)
        .await
        .context("a PV that names its volume by the annotation only")?;
    a_sigkill_mid_create_makes_no_second_volume(client, simulator, controller)
        .await
        .context("a SIGKILL while a volume's create is under way")?;
    let started = std::time::Instant::now();
    a_retained_volume_stays(client, simulator)
        .await
        .context("a claim of a Retain class deleted")?;
    println!("e2e_volumes: Retain case in {:?}", started.elapsed());
    // Last: a refused account holds the node's creates until its next list.
    a_refused_account_is_said_on_the_claim(client, simulator)
        .await
        .context("an account refused (402) while creating a pod with a claim")?;
    Ok(())
}

/// RunPod made the volume but its answer is slow, and the controller is SIGKILLed before it
/// arrives: the restarted controller finds the volume (the claim's marker and a list before
/// any create), never makes a second, and the claim binds to the one there is.
async fn a_sigkill_mid_create_makes_no_second_volume(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    controller: &mut ControllerProcess,
) -> anyhow::Result<()> {
    simulator
        .inject(
            &json!({"when": {"operation": "createNetworkVolume"}, "times": 1,
                        "effect": {"kind": "delay", "millis": 20000}}),
        )
        .await?;
    let uid = claim(client, "interrupted", "runpod-network", "10Gi").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &pod_with("survivor", "interrupted")?,
    )
    .await?;
    let name = format!("rpk-{CLUSTER}-{uid}");
    support::wait::until(
        "the volume made, its answer still on the way",
        std::time::Duration::from_secs(60),
        || async {
            let volumes = simulator.volumes().await?;
            Ok(volumes
                .iter()
                .any(|v| v["name"] == name.as_str())
                .then_some(()))
        },
    )
    .await?;
    controller.kill();
    controller.restart()?;
    support::pods::running(&pods, "survivor").await?;
    let volumes = simulator.volumes().await?;
    let made: Vec<&Value> = volumes
        .iter()
        .filter(|v| v["name"] == name.as_str())
        .collect();
    ensure!(made.len() == 1, "volumes for the claim: {made:?}");
    Ok(())
}

/// RunPod answers a create with 402 (the balance is spent): the claim the pod mounts gets a
/// Warning naming the account, as its volume lives only while the account pays.
async fn a_refused_account_is_said_on_the_claim(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    simulator
        .inject(&json!({"when": {"operation": "createPod"}, "times": 1,
                        "effect": {"kind": "status", "status": 402,
                                   "detail": "Insufficient balance"}}))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let broke = in_datacenters(pod_with("broke", "regional")?, "US-TX-3");
    pods.create(&PostParams::default(), &broke).await?;
    support::wait::until(
        "the claim told of the refused account",
        std::time::Duration::from_secs(60),
        || async {
            let said = support::pods::events(client, NS, "regional").await?;
            Ok(said
                .iter()
                .any(|(reason, message)| {
                    reason == "AccountRefused" && message.contains("Insufficient balance")
                })
                .then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// `reclaimPolicy: Retain`: the claim goes, its volume and PV stay (they bill), and the PV's
/// Event says so.
async fn a_retained_volume_stays(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    Api::<StorageClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "runpod-keep"},
                "provisioner": "network-volume.runpod.io",
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Retain"
            }))?,
        )
        .await?;
    let uid = claim(client, "kept", "runpod-keep", "10Gi").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &pod_with("keeper", "kept")?)
        .await?;
    support::pods::running(&pods, "keeper").await?;
    let pv_name = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .get("kept")
        .await?
        .spec
        .and_then(|s| s.volume_name)
        .context("claim not bound")?;
    let now = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete("keeper", &now).await?;
    support::pods::gone(&pods, "keeper").await?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .delete("kept", &Default::default())
        .await?;
    let pvs = Api::<PersistentVolume>::all(client.clone());
    support::wait::until(
        "the PV Released",
        std::time::Duration::from_secs(60),
        || async {
            let pv = pvs.get(&pv_name).await?;
            Ok((pv.status.and_then(|s| s.phase).as_deref() == Some("Released")).then_some(()))
        },
    )
    .await?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(client.clone());
    support::wait::until(
        "the VolumeRetained Event on the PV",
        std::time::Duration::from_secs(60),
        || async {
            let listed = events.list(&Default::default()).await?;
            Ok(listed
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("VolumeRetained")
                        && e.involved_object.name.as_deref() == Some(pv_name.as_str())
                })
                .then_some(()))
        },
    )
    .await?;
    // Several passes later, both are still there.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    ensure!(
        pvs.get_opt(&pv_name).await?.is_some(),
        "the retained PV was deleted"
    );
    let name = format!("rpk-{CLUSTER}-{uid}");
    let volumes = simulator.volumes().await?;
    ensure!(
        volumes
            .iter()
            .any(|v| v["name"] == name.as_str() && v["deleted"] == false),
        "the retained volume was deleted: {volumes:?}"
    );
    Ok(())
}

/// A PV written by hand that names an existing volume only by `runpod.io/network-volume-id`
/// (no CSI source of ours): the pod mounts that volume, in the datacenter the cloud lists it in.
async fn a_pv_naming_its_volume_by_annotation_is_mounted(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let id = console_volume(simulator, "weights", 50, "US-TX-3").await?;
    Api::<PersistentVolume>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "weights",
                             "annotations": {"runpod.io/network-volume-id": id}},
                "spec": {"capacity": {"storage": "50G"}, "accessModes": ["ReadOnlyMany"],
                         "storageClassName": "runpod-network",
                         "hostPath": {"path": "/unused"}}
            }))?,
        )
        .await?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "weights"},
                "spec": {"storageClassName": "runpod-network", "accessModes": ["ReadOnlyMany"],
                         "resources": {"requests": {"storage": "50G"}}}
            }))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &pod_with("weigher", "weights")?)
        .await?;
    let running = support::pods::running(&pods, "weigher").await?;
    let entry = &instance_entry(simulator, &running).await?;
    ensure!(
        entry["mounts"]["network"][0]["volumeId"] == id.as_str()
            && entry["data_center_id"] == "US-TX-3",
        "the instance: {entry}"
    );
    Ok(())
}

/// Issue 46: a claim's volume is made in a datacenter its first pod allows (the pod's
/// `runpod.io/datacenter-ids`, within the installation's), not the installation's first; and a
/// pod that could never run where a bound claim's volume is, is refused at admission.
async fn a_volume_goes_where_its_first_pod_may_run(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let uid = claim(client, "regional", "runpod-network", "10Gi").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let texan = in_datacenters(pod_with("texan", "regional")?, "US-TX-3");
    pods.create(&PostParams::default(), &texan).await?;
    let running = support::pods::running(&pods, "texan").await?;
    let name = format!("rpk-{CLUSTER}-{uid}");
    let volumes = simulator.volumes().await?;
    let volume = volumes
        .iter()
        .find(|v| v["name"] == name.as_str())
        .context("no volume for the claim")?;
    ensure!(
        volume["data_center"] == "US-TX-3",
        "the volume is not where its pod may run: {volume}"
    );
    let entry = &instance_entry(simulator, &running).await?;
    ensure!(
        entry["data_center_id"] == "US-TX-3",
        "the instance: {entry}"
    );
    // The claim is bound now: a pod that allows only EU-RO-1 could never mount it.
    let european = in_datacenters(pod_with("european", "regional")?, "EU-RO-1");
    match pods.create(&PostParams::default(), &european).await {
        Err(kube::Error::Api(status)) => ensure!(
            status.code == 403 && status.message.contains("US-TX-3"),
            "refused, but not for the volume's datacenter: {status:?}"
        ),
        other => anyhow::bail!("a pod that cannot run where its volume is was admitted: {other:?}"),
    }
    // Nor can one whose price cap no GPU offered in US-TX-3 meets (the node publishes what
    // each datacenter offers): refused, naming what is there.
    let mut cheap = pod_with("cheap", "regional")?;
    cheap
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("runpod.io/max-price".into(), "0.01".into());
    support::wait::until(
        "a pod whose cap nothing in US-TX-3 meets refused",
        std::time::Duration::from_secs(60),
        || async {
            match pods.create(&PostParams::default(), &cheap).await {
                Err(kube::Error::Api(status))
                    if status.code == 403 && status.message.contains("USD per GPU-hour") =>
                {
                    Ok(Some(()))
                }
                Err(kube::Error::Api(status)) => {
                    anyhow::bail!("refused, but not for its cap there: {status:?}")
                }
                Err(error) => Err(error.into()),
                // The node had not published yet: try again.
                Ok(_) => {
                    pods.delete("cheap", &Default::default()).await?;
                    support::pods::gone(&pods, "cheap").await?;
                    Ok(None)
                }
            }
        },
    )
    .await?;
    Ok(())
}

/// A volume made outside Kubernetes (in RunPod's console), named by a PV the operator writes,
/// is what a claim of the class binds to and a pod mounts; nothing new is made.
async fn a_static_pv_binds_an_existing_volume(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let id = console_volume(simulator, "datasets", 100, "EU-RO-1").await?;
    Api::<PersistentVolume>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "datasets"},
                "spec": {"capacity": {"storage": "100G"}, "accessModes": ["ReadOnlyMany"],
                         "storageClassName": "runpod-network",
                         "csi": {"driver": "network-volume.runpod.io", "volumeHandle": id,
                                 "volumeAttributes": {"dataCenter": "EU-RO-1"}}}
            }))?,
        )
        .await?;
    let before = simulator.volumes().await?.len();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "datasets"},
                "spec": {"storageClassName": "runpod-network", "accessModes": ["ReadOnlyMany"],
                         "resources": {"requests": {"storage": "100G"}}}
            }))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &pod_with("reader", "datasets")?)
        .await?;
    let running = support::pods::running(&pods, "reader").await?;
    let entry = &instance_entry(simulator, &running).await?;
    ensure!(
        entry["mounts"]["network"][0]["volumeId"] == id.as_str(),
        "the instance: {entry}"
    );
    ensure!(
        simulator.volumes().await?.len() == before,
        "a volume was made for a claim bound to an existing one"
    );
    Ok(())
}

/// The claim asks for more: one PATCH grows the volume, then the PV and the claim say so.
async fn a_grown_claim_grows_its_volume(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS);
    claims
        .patch(
            "checkpoints",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"resources": {"requests": {"storage": "30G"}}}}),
            ),
        )
        .await?;
    support::wait::until(
        "the claim's new size",
        std::time::Duration::from_secs(60),
        || async {
            let pvc = claims.get("checkpoints").await?;
            let capacity = pvc
                .status
                .and_then(|s| s.capacity)
                .and_then(|c| c.get("storage").map(|q| q.0.clone()));
            Ok((capacity.as_deref() == Some("30G")).then_some(()))
        },
    )
    .await?;
    let uid = claims
        .get("checkpoints")
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    let volumes = simulator.volumes().await?;
    let volume = volumes
        .iter()
        .find(|v| v["name"] == format!("rpk-{CLUSTER}-{uid}").as_str())
        .context("the claim's volume")?;
    ensure!(
        volume["size"] == 30 && volume["resizes"] == 1,
        "grown once to 30 GB: {volume}"
    );
    Ok(())
}

/// Reclaim `Delete`: once the pod is gone and its claim deleted, the volume is deleted (it
/// bills storage), then its PV.
async fn a_deleted_claim_deletes_its_volume(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .get("data")
        .await?;
    let pv_name = pvc
        .spec
        .and_then(|s| s.volume_name)
        .context("claim not bound")?;
    // The last user of the claim: the resuming Job's pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let resumer = job_pod(&pods, "resume").await?;
    Api::<Job>::namespaced(client.clone(), NS)
        .delete("resume", &kube::api::DeleteParams::background())
        .await?;
    support::pods::gone(&pods, &resumer).await?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .delete("data", &Default::default())
        .await?;
    let name = format!("rpk-{CLUSTER}-{}", pvc.metadata.uid.unwrap_or_default());
    support::wait::until(
        "the volume deleted",
        std::time::Duration::from_secs(120),
        || async {
            let volumes = simulator.volumes().await?;
            Ok(volumes
                .iter()
                .any(|v| v["name"] == name.as_str() && v["deleted"] == true)
                .then_some(()))
        },
    )
    .await?;
    support::wait::until(
        "its PV deleted",
        std::time::Duration::from_secs(60),
        || async {
            Ok(Api::<PersistentVolume>::all(client.clone())
                .get_opt(&pv_name)
                .await?
                .is_none()
                .then_some(()))
        },
    )
    .await?;
    let live = simulator.volumes().await?;
    ensure!(
        live.iter().filter(|v| v["deleted"] == false).count() == 2,
        "the other claims' volumes (checkpoints, datasets) are kept: {live:?}"
    );
    Ok(())
}

async fn claim(
    client: &kube::Client,
    name: &str,
    class: &str,
    size: &str,
) -> anyhow::Result<String> {
    let created = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": size}}}
            }))?,
        )
        .await?;
    created.metadata.uid.context("claim uid")
}

/// A GPU pod that mounts `claim` at `/data` (bursting as its namespace says: `fallback`).
fn pod_with(name: &str, claim: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never",
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            "containers": [{"name": "main", "image": "e2e/server:1",
                "command": ["python", "serve.py"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))?)
}

async fn first_pod_provisions_its_claim(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let uid = claim(client, "data", "runpod-network", "20Gi").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &pod_with("trainer", "data")?)
        .await?;
    let running = support::pods::running(&pods, "trainer").await?;
    ensure!(
        running.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("virtual-runpod"),
        "not on the virtual node"
    );
    // One volume, named from the claim's UID, in the installation's first datacenter.
    let volumes = simulator.volumes().await?;
    ensure!(volumes.len() == 1, "volumes: {volumes:?}");
    let volume = &volumes[0];
    ensure!(
        volume["name"] == format!("rpk-{CLUSTER}-{uid}")
            && volume["data_center"] == "EU-RO-1"
            && volume["size"] == 22,
        "volume {volume}"
    );
    let volume_id = volume["id"].as_str().context("volume id")?.to_owned();
    // The claim is bound to our PV, pinned to the virtual node.
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .get("data")
        .await?;
    let pv_name = pvc
        .spec
        .and_then(|s| s.volume_name)
        .context("claim not bound")?;
    ensure!(pv_name == format!("pvc-{uid}"), "bound to {pv_name}");
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name)
        .await?;
    let pv_json = serde_json::to_value(&pv)?;
    ensure!(
        pv_json["spec"]["csi"]["volumeHandle"] == volume_id.as_str()
            && pv_json["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"]
                [0]["values"][0]
                == "virtual-runpod",
        "PV {pv_json}"
    );
    // The instance mounts it, in its datacenter.
    let entry = &instance_entry(simulator, &running).await?;
    ensure!(
        entry["mounts"] == json!({"network": [{"volumeId": volume_id, "path": "/data"}]})
            && entry["data_center_id"] == "EU-RO-1"
            && entry["cloud"] == "SECURE",
        "the instance: {entry}"
    );
    Ok(())
}

/// A checkpoint written on the volume by the first pod (through `kubectl exec`, in the pod's
/// files) is read by the pod of a Job started on the same claim after the first pod and its
/// instance are gone: the data lives with the volume, not the instance.
async fn a_file_is_there_for_the_next_job(
    cp: &ControlPlane,
    client: &kube::Client,
) -> anyhow::Result<()> {
    let written = exec(
        cp,
        "trainer",
        "echo epoch-7 > \"$RUNPOD_KUBELET_SSH_ROOT/data/checkpoint\"",
    )?;
    ensure!(
        written.is_empty(),
        "writing the checkpoint said {written:?}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("trainer", &Default::default()).await?;
    support::pods::gone(&pods, "trainer").await?;
    let mut template = serde_json::to_value(pod_with("resume", "data")?)?;
    template["metadata"] = json!({"labels": {"app": "resume"}});
    Api::<Job>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "resume"},
                "spec": {"backoffLimit": 0, "template": template}
            }))?,
        )
        .await?;
    let resumer = job_pod(&pods, "resume").await?;
    support::pods::running(&pods, &resumer).await?;
    let read = exec(
        cp,
        &resumer,
        "cat \"$RUNPOD_KUBELET_SSH_ROOT/data/checkpoint\"",
    )?;
    ensure!(
        read == "epoch-7\n",
        "the next Job's pod read {read:?} from the volume"
    );
    Ok(())
}

/// The name of the (one) pod of a Job, once there is one.
async fn job_pod(pods: &Api<Pod>, job: &str) -> anyhow::Result<String> {
    support::wait::until(
        &format!("a pod of Job {job}"),
        std::time::Duration::from_secs(60),
        || async {
            let listed = pods
                .list(&kube::api::ListParams::default().labels(&format!("job-name={job}")))
                .await?;
            Ok(listed.items.into_iter().find_map(|pod| pod.metadata.name))
        },
    )
    .await
}

/// `kubectl exec POD -- sh -c SCRIPT` (a real kubectl through the apiserver): its stdout, or
/// an error with its stderr. The simulator runs the script in the pod's working directory with
/// the pod's files under `$RUNPOD_KUBELET_SSH_ROOT`.
///
/// A pod that turned Ready may not have its SSH address listed yet (the kubelet API answers
/// so, "retry in a moment"): that answer is retried for up to a minute.
fn exec(cp: &ControlPlane, pod: &str, script: &str) -> anyhow::Result<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let output = loop {
        let output = std::process::Command::new("kubectl")
            .args(["-n", NS, "exec", pod, "--", "sh", "-c", script])
            .env("KUBECONFIG", &cp.kubeconfig)
            .stdin(std::process::Stdio::null())
            .output()
            .context("running kubectl exec")?;
        let not_yet = String::from_utf8_lossy(&output.stderr).contains("retry in a moment");
        if output.status.success() || !not_yet || std::time::Instant::now() > deadline {
            break output;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    ensure!(
        output.status.success(),
        "kubectl exec {pod}: {}; {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

async fn a_lost_create_answer_makes_no_second_volume(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    simulator
        .inject(
            &json!({"when": {"operation": "createNetworkVolume"}, "times": 1,
                        "effect": {"kind": "create_then_fail", "status": 502}}),
        )
        .await?;
    let uid = claim(client, "checkpoints", "runpod-network", "10G").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &pod_with("second", "checkpoints")?)
        .await?;
    support::pods::running(&pods, "second").await?;
    let name = format!("rpk-{CLUSTER}-{uid}");
    let volumes = simulator.volumes().await?;
    let made: Vec<&Value> = volumes
        .iter()
        .filter(|v| v["name"] == name.as_str())
        .collect();
    ensure!(made.len() == 1, "volumes for the claim: {made:?}");
    let said = support::pods::events(client, NS, "checkpoints").await?;
    ensure!(
        said.iter()
            .any(|(reason, _)| reason == "ProvisioningFailed"),
        "the lost answer was not said on the claim: {said:?}"
    );
    Ok(())
}

async fn another_class_is_refused(client: &kube::Client) -> anyhow::Result<()> {
    Api::<StorageClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "local-disk"}, "provisioner": "example.com/local",
                "volumeBindingMode": "WaitForFirstConsumer"
            }))?,
        )
        .await?;
    claim(client, "scratch", "local-disk", "10Gi").await?;
    let mut pod = pod_with("local", "scratch")?;
    pod.metadata.annotations =
        Some([("runpod.io/burst-mode".to_owned(), "always".to_owned())].into());
    match Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
    {
        Err(kube::Error::Api(response)) => ensure!(
            response.message.contains("example.com/local"),
            "refused, but: {}",
            response.message
        ),
        Err(other) => bail!("refused for another reason: {other}"),
        Ok(_) => bail!("a pod with another class's claim was sent to RunPod"),
    }
    Ok(())
}

/// A volume made outside Kubernetes (as in RunPod's console); its id.
async fn console_volume(
    simulator: &SimulatorProcess,
    name: &str,
    size: u32,
    datacenter: &str,
) -> anyhow::Result<String> {
    // The account's rate limit is shared with the controller's calls: a 429 (which creates
    // nothing) is waited out as its Retry-After says, as a console user would.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let answer = loop {
        let answer = reqwest::Client::new()
            .post(format!("{}/v2/network-volumes", simulator.url))
            .bearer_auth(support::controller::API_KEY)
            .json(&json!({"name": name, "size": size, "dataCenter": datacenter}))
            .send()
            .await?;
        if answer.status() != reqwest::StatusCode::TOO_MANY_REQUESTS
            || std::time::Instant::now() > deadline
        {
            break answer;
        }
        let wait = answer
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(2)
            .clamp(1, 30);
        tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
    };
    let made: Value = answer.error_for_status()?.json().await?;
    Ok(made["id"].as_str().context("volume id")?.to_owned())
}

/// The ledger's entry of the pod's instance (by the pod's `runpod.io/pod-id`).
async fn instance_entry(simulator: &SimulatorProcess, pod: &Pod) -> anyhow::Result<Value> {
    let pod_id = annotation(pod, "runpod.io/pod-id").context("RunPod id")?;
    simulator
        .ledger()
        .await?
        .into_iter()
        .find(|e| e["id"] == pod_id)
        .context("the instance is not in the ledger")
}

/// `pod` allowing only `ids` (`runpod.io/datacenter-ids`).
fn in_datacenters(mut pod: Pod, ids: &str) -> Pod {
    pod.metadata
        .annotations
        .get_or_insert_default()
        .insert("runpod.io/datacenter-ids".into(), ids.into());
    pod
}
