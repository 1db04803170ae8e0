//! One GPU vocabulary and `cheapest` that fits, on the real control plane with the webhook, a
//! RunPod and a Vast.ai node and both simulators: Vast.ai sells the cheaper H100 and RunPod the
//! cheaper RTX 4090, so an H100 Job goes to Vast.ai and an RTX 4090 Job to RunPod, each named
//! in the canonical vocabulary; a pod whose cap no H100 fits is refused naming each cloud's
//! cheapest fit; an unknown GPU name is refused listing the known ones; and the Vast.ai
//! controller's `/metrics` counts its API requests and creates under `provider="vastai"`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::{annotation, phase};
use support::wait;
use support::webhook::WebhookProcess;

const NS: &str = "gpu-shoppers";
const RUNPOD_NODE: &str = "virtual-runpod";
const VAST_NODE: &str = "virtual-vastai";
const WAIT: Duration = Duration::from_secs(240);
const IMAGE: &str = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime";
/// High enough for an H100 on either cloud.
const POLICY: [&str; 6] = [
    "--datacenter-ids",
    "EU-RO-1,US-TX-3",
    "--max-gpu-price",
    "4",
    "--vastai-regions",
    "Europe",
];

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_cheapest cheapest_fits_the_pod",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

fn runpod_scenario() -> Value {
    json!({
        "provisioning_ms": 500, "starting_ms": 500, "ports_ms": 500, "list_lag_ms": 500,
        "images": [{"match": "pytorch/pytorch", "outcome": "EXITED", "after_ms": 3000,
                    "logs": ["done"], "exit_code": 0}]
    })
}

/// European H100s well below RunPod's (2.99 secure), and RTX 4090s above RunPod's (0.44).
fn vast_scenario() -> Value {
    let offer = |id: u32, name: &str, ram: u32, base: f64| {
        json!({"id": id, "machine_id": id, "host_id": id / 10, "gpu_name": name, "num_gpus": 1,
               "gpu_ram": ram, "dph_base": base, "storage_cost": 0.15,
               "geolocation": "Hesse, DE", "verification": "verified", "hosting_type": 1,
               "reliability": 0.995})
    };
    let mut offers = Vec::new();
    for i in 0..4 {
        offers.push(offer(
            500 + i,
            "H100 SXM",
            81_559,
            1.90 + 0.05 * f64::from(i),
        ));
        offers.push(offer(
            600 + i,
            "RTX 4090",
            24_564,
            0.60 + 0.01 * f64::from(i),
        ));
    }
    json!({
        "offers": offers,
        "provisioning_ms": 500, "loading_ms": 1000, "list_lag_ms": 1500, "log_ready_polls": 1,
        "images": [{"contains": "pytorch/pytorch", "behaviour": {"kind": "exit", "after_ms": 3000, "code": 0},
                    "logs": ["trained"]}]
    })
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let runpod = SimulatorProcess::start(&runpod_scenario())?;
    let vast = SimulatorProcess::start_cloud("vastai", &vast_scenario())?;
    let webhook = WebhookProcess::start(&control_plane.kubeconfig, &POLICY).await?;
    webhook.register(&client, &["kube-system"]).await?;
    let vast_metrics = support::webhook::free_port()?.to_string();
    let mut vast_args = vec![
        "--provider",
        "vastai",
        "--nodename",
        VAST_NODE,
        "--vastai-api-url",
        &vast.url,
        "--vastai-read-lag",
        "5s",
        "--metrics-listen",
        &vast_metrics,
    ];
    vast_args.extend(POLICY);
    let vast_controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &runpod,
        &vast_args,
    )?;
    let runpod_controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &runpod,
        &POLICY,
    )?;
    let outcome = scenario(&client, &vast_metrics).await;
    if outcome.is_err() {
        eprintln!(
            "--- runpod controller log tail ---\n{}\n--- vastai controller log tail ---\n{}\n--- webhook log ---\n{}",
            runpod_controller.log_tail(60),
            vast_controller.log_tail(60),
            webhook.log()
        );
    }
    outcome
}

/// The Job's one pod, once the Job has succeeded.
async fn job_pod(client: &kube::Client, job: &str) -> anyhow::Result<Pod> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    wait::until(&format!("Job {job} complete"), WAIT, || async {
        let status = jobs.get(job).await?.status.unwrap_or_default();
        if status.failed.unwrap_or(0) > 0 {
            bail!("Job {job} failed: {status:?}");
        }
        Ok((status.succeeded.unwrap_or(0) == 1).then_some(()))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut list = pods
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await?
        .items;
    ensure!(list.len() == 1, "Job {job} has {} pods", list.len());
    Ok(list.remove(0))
}

fn job(name: &str, annotations: &Value) -> anyhow::Result<Job> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"annotations": annotations},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "train", "image": IMAGE, "command": ["python", "train.py"],
                "resources": {"limits": {"nvidia.com/gpu": 1}}
            }]}
        }}
    }))?)
}

fn pod(name: &str, annotations: &Value) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "train", "image": IMAGE, "command": ["python", "train.py"],
            "resources": {"limits": {"nvidia.com/gpu": 1}}
        }]}
    }))?)
}

/// The admission refusal of a pod: (HTTP code, message).
async fn refusal(pods: &Api<Pod>, pod: &Pod) -> anyhow::Result<(u16, String)> {
    match pods.create(&PostParams::default(), pod).await {
        Ok(created) => bail!("admitted: {:?}", created.metadata.annotations),
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(other) => Err(other.into()),
    }
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref())
}

async fn scenario(client: &kube::Client, vast_metrics: &str) -> anyhow::Result<()> {
    for node in [RUNPOD_NODE, VAST_NODE] {
        support::pods::node_ready_named(client, node)
            .await
            .with_context(|| format!("node {node}"))?;
    }
    // Both nodes publish their prices per GPU type, H100s included.
    let nodes: Api<Node> = Api::all(client.clone());
    for node in [RUNPOD_NODE, VAST_NODE] {
        let published = wait::until(&format!("{node} publishes GPU prices"), WAIT, || async {
            let node = nodes.get(node).await?;
            Ok(annotation_of(&node, "runpod.io/gpu-prices").filter(|v| v.contains("H100x1")))
        })
        .await?;
        ensure!(
            published.contains("RTX4090x1"),
            "{node} publishes {published}"
        );
    }
    // The webhook's node cache follows the nodes' watch.
    tokio::time::sleep(Duration::from_secs(2)).await;
    support::pods::namespace(client, NS, true).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    // An H100 Job and an RTX 4090 Job, both `cheapest`, in the canonical names.
    let cheapest = |gpu: &str| {
        json!({"runpod.io/provider": "cheapest", "runpod.io/gpu-types": gpu,
               "runpod.io/burst-mode": "always"})
    };
    jobs.create(&PostParams::default(), &job("h100", &cheapest("H100"))?)
        .await?;
    jobs.create(
        &PostParams::default(),
        &job("rtx4090", &cheapest("RTX4090"))?,
    )
    .await?;

    // Nothing fits a cap of 1.5 USD/h: refused, naming each cloud's cheapest H100.
    let capped = json!({"runpod.io/provider": "cheapest", "runpod.io/gpu-types": "H100",
                        "runpod.io/burst-mode": "always", "runpod.io/max-price": "1.5"});
    let (code, message) = refusal(&pods, &pod("capped", &capped)?).await?;
    ensure!(code == 403, "{code}: {message}");
    for needed in [
        "RunPod's cheapest fit H100",
        "Vast.ai's cheapest fit H100",
        "1.500 USD/h",
    ] {
        ensure!(
            message.contains(needed),
            "the refusal lacks {needed:?}: {message}"
        );
    }
    // An unknown name is refused listing the known ones.
    let unknown = json!({"runpod.io/gpu-types": "H100X", "runpod.io/burst-mode": "always"});
    let (code, message) = refusal(&pods, &pod("unknown", &unknown)?).await?;
    ensure!(code == 422, "{code}: {message}");
    ensure!(
        message.contains("\"H100X\" is not a GPU runpod-kubelet knows")
            && message.contains("A100-80GB")
            && message.contains("RTXA6000"),
        "{message}"
    );

    let h100 = job_pod(client, "h100").await?;
    ensure!(
        node_of(&h100) == Some(VAST_NODE),
        "the H100 Job ran on {:?}, not where the H100 is cheaper",
        node_of(&h100)
    );
    ensure!(phase(&h100) == Some("Succeeded"), "{:?}", phase(&h100));
    let choice = annotation(&h100, "runpod.io/cheapest-choice").unwrap_or_default();
    ensure!(
        choice.starts_with("chose Vast.ai") && choice.contains("RunPod H100 at 2.990 USD/h"),
        "runpod.io/cheapest-choice {choice:?}"
    );
    let name = h100.metadata.name.clone().context("name")?;
    let event = support::pods::event(client, NS, &name, "CheapestChosen").await?;
    ensure!(
        event.contains("Vast.ai H100 at") && event.contains("RunPod H100 at 2.990"),
        "CheapestChosen: {event}"
    );

    let small = job_pod(client, "rtx4090").await?;
    ensure!(
        node_of(&small) == Some(RUNPOD_NODE),
        "the RTX 4090 Job ran on {:?}, not where the RTX 4090 is cheaper",
        node_of(&small)
    );
    ensure!(
        annotation(&small, "runpod.io/gpu-type") == Some("NVIDIA GeForce RTX 4090"),
        "RunPod placed {:?} for the canonical RTX4090",
        annotation(&small, "runpod.io/gpu-type")
    );

    // The Vast.ai controller counts its own calls and creates under its provider label.
    let text = reqwest::get(format!("http://{vast_metrics}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await?;
    let sample = |series: &str| {
        text.lines().find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
    };
    let searches = sample(
        r#"runpod_kubelet_cloud_api_requests_total{provider="vastai",operation="search",outcome="ok"}"#,
    );
    ensure!(
        searches.is_some_and(|n| n >= 1.0),
        "searches {searches:?}\n{text}"
    );
    let creates = sample(r#"runpod_kubelet_cloud_creates_total{provider="vastai"}"#);
    ensure!(
        creates.is_some_and(|n| n >= 1.0),
        "creates {creates:?}\n{text}"
    );
    ensure!(
        text.contains(r#"runpod_kubelet_cloud_api_request_duration_seconds_count{provider="vastai",operation="create"}"#),
        "no create latency\n{text}"
    );
    ensure!(
        sample("runpod_kubelet_runpod_creates_total").unwrap_or(0.0) == 0.0,
        "Vast.ai creates counted as RunPod's\n{text}"
    );
    Ok(())
}

fn annotation_of(node: &Node, key: &str) -> Option<String> {
    node.metadata.annotations.as_ref()?.get(key).cloned()
}
