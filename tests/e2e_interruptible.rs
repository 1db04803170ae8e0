//! Interruptible GPUs and disruptions on the real control plane, with the webhook and a
//! controller per cloud against both simulators. An interruptible Job on Vast.ai runs on a bid
//! (the instance bills the bid, not the on-demand price, and the pod's cost says so); outbid,
//! its pod fails with `DisruptionTarget=True` (reason `Outbid`), the instance is destroyed (a
//! stopped one bills storage), an Event says what it cost, and the Job's next pod runs on
//! another machine though the lost one still sells cheaper. A RunPod pod whose instance
//! vanishes fails with `DisruptionTarget` (reason `CloudInstanceLost`). A pod asking for a bid
//! on RunPod is refused at admission.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::{annotation, phase};
use support::wait;
use support::webhook::WebhookProcess;

const VAST_NODE: &str = "virtual-vastai";
const CLUSTER: &str = "e2e-cluster";
const WAIT: Duration = Duration::from_secs(180);
/// The machine the first bid lands on: its two offers are the cheapest.
const CHEAP_MACHINE: u64 = 301;
const OTHER_MACHINE: u64 = 302;

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_interruptible outbid_pods_are_disrupted",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

/// Two cheap offers on one machine and a dearer one on another: without the machine being
/// avoided, the Job's next pod would buy the second cheap offer, on the machine it just lost.
fn vast_scenario() -> Value {
    let offer = |id: u64, machine: u64, dph_base: f64| {
        json!({"id": id, "machine_id": machine, "host_id": machine, "gpu_name": "RTX 4090",
               "num_gpus": 1, "gpu_ram": 24564, "dph_base": dph_base, "storage_cost": 0.15,
               "geolocation": "Poland, PL", "verification": "verified", "hosting_type": 1,
               "reliability": 0.995})
    };
    json!({
        "offers": [offer(501, CHEAP_MACHINE, 0.30), offer(502, CHEAP_MACHINE, 0.31),
                   offer(503, OTHER_MACHINE, 0.40)],
        "provisioning_ms": 300, "loading_ms": 500, "list_lag_ms": 500, "log_ready_polls": 1,
        "images": [{"contains": "trainer", "behaviour": {"kind": "exit", "after_ms": 25000, "code": 0},
                    "logs": ["epoch 1"]}]
    })
}

fn runpod_scenario() -> Value {
    json!({"provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 300})
}

struct World {
    client: kube::Client,
    vast: SimulatorProcess,
    runpod: SimulatorProcess,
}

async fn run(cp: &ControlPlane) -> anyhow::Result<()> {
    let client = cp.client().await?;
    let vast = SimulatorProcess::start_cloud("vastai", &vast_scenario())?;
    let runpod = SimulatorProcess::start(&runpod_scenario())?;
    let webhook = WebhookProcess::start(&cp.kubeconfig, &[]).await?;
    webhook.register(&client, &["kube-system"]).await?;
    let vast_controller = ControllerProcess::start(
        &cp.kubeconfig,
        &cp.ca_file(),
        &runpod,
        &[
            "--provider",
            "vastai",
            "--nodename",
            VAST_NODE,
            "--vastai-api-url",
            &vast.url,
            "--cluster-id",
            CLUSTER,
            "--vastai-read-lag",
            "3s",
        ],
    )?;
    let runpod_controller = ControllerProcess::start(
        &cp.kubeconfig,
        &cp.ca_file(),
        &runpod,
        &["--cluster-id", CLUSTER],
    )?;
    let world = World {
        client,
        vast,
        runpod,
    };
    let outcome = scenarios(&world).await;
    if outcome.is_err() {
        eprintln!(
            "--- vastai controller log tail ---\n{}\n--- runpod controller log tail ---\n{}",
            vast_controller.log_tail(80),
            runpod_controller.log_tail(40)
        );
    }
    outcome
}

async fn scenarios(world: &World) -> anyhow::Result<()> {
    support::pods::node_ready_named(&world.client, VAST_NODE).await?;
    support::pods::node_ready_named(&world.client, "virtual-runpod").await?;
    a_bid_on_runpod_is_refused(world)
        .await
        .context("admission")?;
    outbid_job_reruns_elsewhere(world)
        .await
        .context("an outbid Job")?;
    vanished_runpod_pod_is_disrupted(world)
        .await
        .context("a vanished RunPod pod")?;
    Ok(())
}

/// RunPod has no interruptible capacity: a pod that asks for a bid there is refused, naming why.
async fn a_bid_on_runpod_is_refused(world: &World) -> anyhow::Result<()> {
    support::pods::namespace(&world.client, "e2e-ondemand", true).await?;
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), "e2e-ondemand");
    let mut pod = support::pods::gpu_pod("spot", "e2e/trainer:1", "Never");
    pod.metadata.annotations = Some(
        [
            ("runpod.io/burst-mode".to_owned(), "always".to_owned()),
            ("runpod.io/provider".to_owned(), "runpod".to_owned()),
            ("runpod.io/interruptible".to_owned(), "true".to_owned()),
        ]
        .into(),
    );
    match pods.create(&PostParams::default(), &pod).await {
        Err(kube::Error::Api(response)) => ensure!(
            response.code == 403 && response.message.contains("only Vast.ai"),
            "refused, but: {} {}",
            response.code,
            response.message
        ),
        Err(other) => bail!("refused for another reason: {other}"),
        Ok(_) => bail!("a bid on RunPod was admitted"),
    }
    Ok(())
}

async fn outbid_job_reruns_elsewhere(world: &World) -> anyhow::Result<()> {
    let ns = "e2e-spot";
    support::pods::namespace_labelled(
        &world.client,
        ns,
        &[
            ("runpod.io/burst", "enabled"),
            ("runpod.io/provider", "vastai"),
        ],
    )
    .await?;
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "train", "annotations": {"runpod.io/interruptible": "true"}},
        "spec": {"backoffLimit": 2, "template": {
            "metadata": {"annotations": {"runpod.io/burst-mode": "always"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main",
                "image": "e2e/trainer:1", "command": ["python", "train.py"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }))?;
    Api::<Job>::namespaced(world.client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await?;
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), ns);

    // The first pod runs on a bid: the instance bills the bid, and the pod's cost says so.
    let first = wait::until("the Job's first pod running", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("job-name=train"))
            .await?;
        Ok(list.items.into_iter().find(|pod| {
            phase(pod) == Some("Running") && annotation(pod, "vast.ai/instance-id").is_some()
        }))
    })
    .await?;
    let first_name = first.metadata.name.clone().context("name")?;
    ensure!(
        annotation(&first, "runpod.io/interruptible") == Some("true"),
        "the Job's annotation was not written on the pod"
    );
    let id: u64 = annotation(&first, "vast.ai/instance-id")
        .context("instance id")?
        .parse()?;
    let entry = instance(&world.vast, id).await?;
    ensure!(
        entry["machine_id"] == CHEAP_MACHINE,
        "the first bid is not on the cheapest machine: {entry}"
    );
    let bid = entry["bid"]
        .as_f64()
        .with_context(|| format!("rented on-demand, not on a bid: {entry}"))?;
    ensure!(
        bid < 0.30,
        "a bid of {bid} is not under the on-demand 0.30 USD/h"
    );
    let cost = wait::until("the pod's cost annotation", WAIT, || async {
        Ok(pods
            .get(&first_name)
            .await?
            .metadata
            .annotations
            .and_then(|a| a.get("runpod.io/cost-per-hr").cloned()))
    })
    .await?;
    let billed = entry["dph_total"].as_f64().context("dph_total")?;
    ensure!(
        (cost.parse::<f64>()? - billed).abs() < 0.001,
        "the pod says {cost} USD/h, the bid instance bills {billed}"
    );

    // Outbid: the pod is disrupted, not failed by its program, and the instance is destroyed.
    world
        .vast
        .post(&format!("/_sim/instances/{id}/outbid"), &json!({}))
        .await?;
    let failed = wait::until("the outbid pod Failed", WAIT, || async {
        let pod = pods.get(&first_name).await?;
        Ok((phase(&pod) == Some("Failed")).then_some(pod))
    })
    .await?;
    let condition = disruption_target(&failed)?;
    ensure!(
        condition.status == "True" && condition.reason.as_deref() == Some("Outbid"),
        "condition {condition:?}"
    );
    ensure!(
        condition
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("outbid"),
        "condition message {:?}",
        condition.message
    );
    let said = support::pods::event(&world.client, ns, &first_name, "Outbid").await?;
    ensure!(
        said.contains("USD") && said.contains(&format!("machine {CHEAP_MACHINE} is avoided")),
        "the Event: {said}"
    );
    wait::until("the outbid instance destroyed", WAIT, || async {
        let entry = instance(&world.vast, id).await?;
        Ok((!entry["destroyed_at"].is_null()).then_some(()))
    })
    .await?;

    // The Job runs the pod again, on the other machine, and completes.
    let jobs: Api<Job> = Api::namespaced(world.client.clone(), ns);
    wait::until("the Job complete", WAIT, || async {
        let status = jobs.get("train").await?.status.unwrap_or_default();
        Ok((status.succeeded.unwrap_or(0) == 1).then_some(()))
    })
    .await?;
    let list = pods
        .list(&ListParams::default().labels("job-name=train"))
        .await?;
    let second = list
        .items
        .iter()
        .find(|pod| phase(pod) == Some("Succeeded"))
        .context("no pod of the Job succeeded")?;
    let second_id: u64 = annotation(second, "vast.ai/instance-id")
        .context("the second pod's instance id")?
        .parse()?;
    let second_entry = instance(&world.vast, second_id).await?;
    ensure!(
        second_entry["machine_id"] == OTHER_MACHINE,
        "the next pod went back to the machine it lost: {second_entry}"
    );
    ensure!(
        second_entry["bid"].is_f64(),
        "the next pod is not on a bid: {second_entry}"
    );
    let ledger = world.vast.ledger().await?;
    ensure!(
        ledger.iter().all(|e| !e["destroyed_at"].is_null()),
        "an instance still bills: {ledger:?}"
    );
    Ok(())
}

/// A RunPod pod whose instance goes away behind our back fails as a disruption.
async fn vanished_runpod_pod_is_disrupted(world: &World) -> anyhow::Result<()> {
    let ns = "e2e-ondemand";
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), ns);
    let mut pod = support::pods::gpu_pod("lost", "e2e/server:1", "Never");
    pod.metadata.annotations =
        Some([("runpod.io/burst-mode".to_owned(), "always".to_owned())].into());
    pods.create(&PostParams::default(), &pod).await?;
    let running = support::pods::running(&pods, "lost").await?;
    let id = annotation(&running, "runpod.io/pod-id")
        .context("RunPod id")?
        .to_owned();
    world
        .runpod
        .post(
            &format!("/_sim/pods/{id}/status"),
            &json!({"status": "TERMINATED"}),
        )
        .await?;
    let failed = wait::until("the vanished pod Failed", WAIT, || async {
        let pod = pods.get("lost").await?;
        Ok((phase(&pod) == Some("Failed")).then_some(pod))
    })
    .await?;
    let condition = disruption_target(&failed)?;
    ensure!(
        condition.status == "True" && condition.reason.as_deref() == Some("CloudInstanceLost"),
        "condition {condition:?}"
    );
    support::pods::event(&world.client, ns, "lost", "CloudInstanceLost").await?;
    Ok(())
}

/// The pod's `DisruptionTarget` condition.
fn disruption_target(pod: &Pod) -> anyhow::Result<k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "DisruptionTarget"))
        .cloned()
        .context("no DisruptionTarget condition")
}

/// The Vast.ai ledger entry of instance `id`.
async fn instance(vast: &SimulatorProcess, id: u64) -> anyhow::Result<Value> {
    vast.ledger()
        .await?
        .into_iter()
        .find(|e| e["id"] == id)
        .with_context(|| format!("instance {id} not in the ledger"))
}
