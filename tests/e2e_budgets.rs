//! Budgets and teams on the real control plane with the webhook: two RunPod nodes, each with
//! its own account (a simulator accepting only that team's key, with its own ledger), each
//! serving one team's namespace.
//!
//! - Team A has a budget of 1 USD/h and its pods cost 0.4 USD/h: two run, the third waits
//!   Pending `BudgetExceeded` (its Event names budget, spend and price) and starts when one
//!   finishes; a pod whose cheapest GPU alone costs more than the budget is refused at admission.
//! - Each team's pods run only on its node and bill only its key; a team B pod sent to team A's
//!   node by `spec.nodeName` is refused `WrongNode` and nothing is created for it.
//! - Team A's controller is SIGKILLed while room frees up; after its restart the namespace
//!   still never spent more than its budget at any instant (from the account's ledger).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess, metric};
use support::pods::{annotation, phase, running, uid};
use support::wait;
use support::webhook::WebhookProcess;

const TEAM_A: &str = "team-a";
const TEAM_B: &str = "team-b";
const NODE_A: &str = "team-a-node";
const NODE_B: &str = "team-b-node";
const KEY_A: &str = "team-a-key-0123456789";
const KEY_B: &str = "team-b-key-9876543210";
const WAIT: Duration = Duration::from_secs(180);
const POLICY: [&str; 4] = [
    "--datacenter-ids",
    "EU-RO-1,US-TX-3",
    "--max-gpu-price",
    "2",
];

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_budgets budgets_and_teams",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

/// An account whose cheapest GPU (an RTX A4000) costs 0.4 USD/h and whose H100 costs 1.5.
fn account() -> Value {
    let gpu = |id: &str, name: &str, memory: u32, price: f64| {
        json!({"id": id, "name": name, "memory": memory, "secure": true, "community": true,
               "price": {"secure": price, "community": price},
               "maxCount": {"secure": 8, "community": 8}})
    };
    json!({
        "provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 300,
        "gpus": [
            gpu("NVIDIA RTX A4000", "RTX A4000", 16, 0.4),
            gpu("NVIDIA H100 80GB HBM3", "H100 SXM", 80, 1.5),
        ],
        "data_centers": [{"id": "EU-RO-1", "name": "EU-RO-1", "region": "EUROPE",
            "gpu_availability": {"NVIDIA RTX A4000": "HIGH", "NVIDIA H100 80GB HBM3": "HIGH"}}]
    })
}

struct Team {
    simulator: SimulatorProcess,
    controller: ControllerProcess,
}

fn start_team(
    control_plane: &ControlPlane,
    node: &str,
    namespace: &str,
    key: &str,
    metrics: &str,
) -> anyhow::Result<Team> {
    let simulator =
        SimulatorProcess::start_keyed("runpod", &account(), &["--listen", "127.0.0.1:0"], key)?;
    let controller = ControllerProcess::start_with_env(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator.url,
        &[
            "--nodename",
            node,
            "--serve-namespaces",
            namespace,
            "--metrics-listen",
            metrics,
        ],
        &[("RUNPOD_API_KEY", key)],
    )?;
    Ok(Team {
        simulator,
        controller,
    })
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let webhook = WebhookProcess::start(&control_plane.kubeconfig, &POLICY).await?;
    webhook.register(&client, &["kube-system"]).await?;
    let metrics_a = support::webhook::free_port()?.to_string();
    let metrics_b = support::webhook::free_port()?.to_string();
    let mut team_a = start_team(control_plane, NODE_A, TEAM_A, KEY_A, &metrics_a)?;
    let team_b = start_team(control_plane, NODE_B, TEAM_B, KEY_B, &metrics_b)?;
    let outcome = scenario(&client, &mut team_a, &team_b, &metrics_a).await;
    if outcome.is_err() {
        eprintln!(
            "--- team A controller log tail ---\n{}\n--- team B controller log tail ---\n{}\n--- webhook log ---\n{}",
            team_a.controller.log_tail(80),
            team_b.controller.log_tail(40),
            webhook.log()
        );
    }
    outcome
}

fn pod(name: &str, annotations: &Value, node_name: Option<&str>) -> anyhow::Result<Pod> {
    let mut pod = json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "train", "image": "python:3.12-slim", "command": ["python", "train.py"],
            "resources": {"limits": {"nvidia.com/gpu": 1}}
        }]}
    });
    if let Some(node) = node_name {
        pod["spec"]["nodeName"] = json!(node);
    }
    Ok(serde_json::from_value(pod)?)
}

/// The reason a pod's container waits with, if it waits.
fn waiting_reason(pod: &Pod) -> Option<String> {
    support::pods::container_state(pod)?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

async fn waits_for_budget(pods: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait::until(
        &format!("pod {name} Pending BudgetExceeded"),
        WAIT,
        || async {
            let pod = pods.get(name).await?;
            if phase(&pod) == Some("Running") {
                bail!("pod {name} runs over the budget");
            }
            Ok((waiting_reason(&pod).as_deref() == Some("BudgetExceeded")).then_some(pod))
        },
    )
    .await
}

/// The account's ledger lines (live or not) of one Kubernetes pod.
async fn lines_of(simulator: &SimulatorProcess, pod: &Pod) -> anyhow::Result<Vec<Value>> {
    support::pods::ledger_for(simulator, &uid(pod)).await
}

/// Ends a pod's container on the cloud, as a finished training run would.
async fn finish(simulator: &SimulatorProcess, pod: &Pod) -> anyhow::Result<()> {
    let id = annotation(pod, "runpod.io/pod-id").context("no RunPod pod id")?;
    reqwest::Client::new()
        .post(format!("{}/_sim/pods/{id}/status", simulator.url))
        .json(&json!({"status": "EXITED"}))
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

/// The most the account was billing at any instant (sum of `cost_per_hr` of the pods created
/// and whose GPU billing had not ended then: exited, stopped or terminated), from its ledger.
fn peak_spend(ledger: &[Value]) -> anyhow::Result<f64> {
    let time = |value: &Value| -> anyhow::Result<Option<k8s_openapi::jiff::Timestamp>> {
        value
            .as_str()
            .map(str::parse)
            .transpose()
            .map_err(Into::into)
    };
    // (instant, end before start at the same instant, change)
    let mut changes: Vec<(k8s_openapi::jiff::Timestamp, u8, f64)> = Vec::new();
    for line in ledger.iter().filter(|l| !l["created_at"].is_null()) {
        let Some(created) = time(&line["created_at"])? else {
            continue;
        };
        if line["create_status"]
            .as_u64()
            .is_some_and(|status| status >= 300)
        {
            continue;
        }
        let cost = line["cost_per_hr"]
            .as_f64()
            .context("a line without cost_per_hr")?;
        changes.push((created, 1, cost));
        let ends = [
            time(&line["gpu_billing_ended_at"])?,
            time(&line["stopped_at"])?,
            time(&line["terminated_at"])?,
        ];
        if let Some(end) = ends.into_iter().flatten().min() {
            changes.push((end, 0, -cost));
        }
    }
    changes.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut peak) = (0.0_f64, 0.0_f64);
    for (_, _, change) in changes {
        now += change;
        peak = peak.max(now);
    }
    Ok(peak)
}

async fn scenario(
    client: &kube::Client,
    team_a: &mut Team,
    team_b: &Team,
    metrics_a: &str,
) -> anyhow::Result<()> {
    // Both nodes say which namespaces they serve and publish their prices.
    let nodes: Api<Node> = Api::all(client.clone());
    for (node, serves) in [(NODE_A, TEAM_A), (NODE_B, TEAM_B)] {
        support::pods::node_ready_named(client, node).await?;
        wait::until(
            &format!("{node} publishes what it serves and its prices"),
            WAIT,
            || async {
                let node = nodes.get(node).await?;
                let annotations = node.metadata.annotations.unwrap_or_default();
                let prices = annotations
                    .get("runpod.io/gpu-prices")
                    .cloned()
                    .unwrap_or_default();
                Ok((annotations
                    .get("runpod.io/serves-namespaces")
                    .map(String::as_str)
                    == Some(serves)
                    && prices.contains("RTXA4000"))
                .then_some(()))
            },
        )
        .await?;
    }
    support::pods::namespace_annotated(
        client,
        TEAM_A,
        &[("runpod.io/burst", "enabled")],
        &[("runpod.io/budget-per-hour", "1")],
    )
    .await?;
    support::pods::namespace(client, TEAM_B, true).await?;
    let pods_a: Api<Pod> = Api::namespaced(client.clone(), TEAM_A);
    let pods_b: Api<Pod> = Api::namespaced(client.clone(), TEAM_B);

    // An H100 alone (1.5 USD/h) could never fit 1 USD/h: refused at admission.
    let h100 = pod("h100", &json!({"runpod.io/gpu-types": "H100"}), None)?;
    match pods_a.create(&PostParams::default(), &h100).await {
        Ok(_) => bail!("a pod over the whole budget was admitted"),
        Err(kube::Error::Api(status)) => ensure!(
            status.code == 403
                && status.message.contains("budget of 1.000 USD/h")
                && status.message.contains("1.500 USD/h"),
            "{status:?}"
        ),
        Err(other) => return Err(other.into()),
    }

    // Three pods of 0.4 USD/h under 1 USD/h: two run, the third waits.
    for name in ["p1", "p2", "p3"] {
        pods_a
            .create(&PostParams::default(), &pod(name, &json!({}), None)?)
            .await?;
        // Creation order is by the second.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let p1 = running(&pods_a, "p1").await?;
    let p2 = running(&pods_a, "p2").await?;
    let p3 = waits_for_budget(&pods_a, "p3").await?;
    for running in [&p1, &p2] {
        ensure!(
            running.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE_A),
            "team A's pod runs on another node"
        );
    }
    let message = support::pods::event(client, TEAM_A, "p3", "BudgetExceeded").await?;
    ensure!(
        message.contains("budget of 1.000 USD/h")
            && message.contains("spends 0.800 USD/h")
            && message.contains("0.400 USD/h"),
        "{message}"
    );
    // It keeps waiting: nothing is created for it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    ensure!(
        lines_of(&team_a.simulator, &p3).await?.is_empty(),
        "p3 was created"
    );
    ensure!(phase(&pods_a.get("p3").await?) == Some("Pending"));
    let spend = format!("runpod_kubelet_namespace_spend_per_hour{{namespace=\"{TEAM_A}\"}}");
    let budget = format!("runpod_kubelet_namespace_budget_per_hour{{namespace=\"{TEAM_A}\"}}");
    wait::until("spend and budget on /metrics", WAIT, || async {
        let now = (
            metric(metrics_a, &spend).await?,
            metric(metrics_a, &budget).await?,
        );
        Ok((now == (Some(0.8), Some(1.0))).then_some(()))
    })
    .await?;
    // The ledger every node shares, in the controllers' namespace.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let ledger = maps.get("runpod-kubelet-budget-team-a").await?;
    ensure!(
        ledger.data.unwrap_or_default().len() == 2,
        "the shared ledger holds the two running pods"
    );

    // p1 finishes: p3 starts.
    finish(&team_a.simulator, &p1).await?;
    let p3 = running(&pods_a, "p3").await?;
    wait::until("p1 ended", WAIT, || async {
        let phase = phase(&pods_a.get("p1").await?).map(str::to_owned);
        Ok(matches!(phase.as_deref(), Some("Succeeded" | "Failed")).then_some(()))
    })
    .await?;

    // Team B's pod runs on its node and bills its key only.
    pods_b
        .create(&PostParams::default(), &pod("q1", &json!({}), None)?)
        .await?;
    let q1 = running(&pods_b, "q1").await?;
    ensure!(q1.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE_B));
    ensure!(lines_of(&team_b.simulator, &q1).await?.len() == 1);
    ensure!(
        lines_of(&team_a.simulator, &q1).await?.is_empty(),
        "team B billed on A's key"
    );
    for pod in [&p1, &p2, &p3] {
        ensure!(lines_of(&team_a.simulator, pod).await?.len() == 1);
        ensure!(
            lines_of(&team_b.simulator, pod).await?.is_empty(),
            "team A billed on B's key"
        );
    }

    // A team B pod sent to team A's node by name: refused, nothing created anywhere.
    let intruder = pods_b
        .create(
            &PostParams::default(),
            &pod("intruder", &json!({}), Some(NODE_A))?,
        )
        .await?;
    let message = support::pods::event(client, TEAM_B, "intruder", "WrongNode").await?;
    ensure!(message.contains(NODE_B), "{message}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    ensure!(lines_of(&team_a.simulator, &intruder).await?.is_empty());
    ensure!(lines_of(&team_b.simulator, &intruder).await?.is_empty());
    let intruder = pods_b.get("intruder").await?;
    ensure!(waiting_reason(&intruder).as_deref() == Some("WrongNode"));

    // Two more pods wait; p2 finishes and the controller is killed while room frees up.
    for name in ["p4", "p5"] {
        pods_a
            .create(&PostParams::default(), &pod(name, &json!({}), None)?)
            .await?;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    waits_for_budget(&pods_a, "p4").await?;
    waits_for_budget(&pods_a, "p5").await?;
    finish(&team_a.simulator, &p2).await?;
    wait::until("p2's instance terminated", WAIT, || async {
        let lines = lines_of(&team_a.simulator, &p2).await?;
        Ok(lines.iter().all(|l| !support::pods::live(l)).then_some(()))
    })
    .await?;
    team_a.controller.kill();
    team_a.controller.restart()?;
    let p4 = running(&pods_a, "p4").await?;
    let p5 = waits_for_budget(&pods_a, "p5").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    ensure!(
        lines_of(&team_a.simulator, &p5).await?.is_empty(),
        "p5 was created"
    );
    ensure!(
        lines_of(&team_a.simulator, &p4).await?.len() == 1,
        "one instance for p4"
    );

    // At no instant did team A's account bill more than the budget.
    let ledger = team_a.simulator.ledger().await?;
    let peak = peak_spend(&ledger)?;
    ensure!(
        peak <= 1.0 + 1e-9,
        "team A billed {peak} USD/h at one instant"
    );
    ensure!(peak >= 0.8 - 1e-9, "the budget was never reached: {peak}");
    Ok(())
}
