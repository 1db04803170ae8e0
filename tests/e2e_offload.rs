//! End-to-end tests of job offloading (issue 19): the real control plane (apiserver, scheduler,
//! Job controller), the webhook and the controller as processes, the RunPod simulator, and one
//! local GPU node whose kubelet the test plays (it writes Running, then Succeeded, on the pods
//! bound there, so the Job controller counts completions and the GPU frees).
//!
//! Managed Jobs (`runpod.io/managed: "true"`) get burst mode `delayed`: their pods run on the
//! local GPU or wait; the controller's offloader moves a waiting pod to the virtual node by
//! adding the toleration (same pod, same UID) after `--max-pending-time`, while more than
//! `--pending-job-threshold` pods wait, or on `runpod.io/offload: "true"`.
//!
//! Order (keeps the one local GPU simple): the offload annotation at creation with the GPU free;
//! max-pending-time with the GPU busy, alongside a pod RunPod cannot run, a Job whose own
//! max-pending-time overrides the flag and gets `runpod.io/offload` later; the threshold with a
//! second controller; a controller killed and restarted while pods wait and move.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::nodes::FakeNode;
use support::pods::{NODE, WAIT, event, events, ledger_for, namespace, node_ready, phase, uid};
use support::wait;
use support::webhook::WebhookProcess;

const LOCAL: &str = "local-gpu";
const NS: &str = "offload";
const PROVIDER: &str = "virtual-kubelet.io/provider";
/// The first controller's `--max-pending-time`, seconds.
const MAX_PENDING: f64 = 40.0;
/// How long before the limit the test still sees the pods waiting (scheduling slack below it).
const NOT_BEFORE: f64 = 35.0;
/// Past the limit by this much, a pod that should have moved would have (1 s reconciles).
const MARGIN: f64 = 10.0;

fn scenario() -> serde_json::Value {
    json!({
        "provisioning_ms": 500, "starting_ms": 500, "ports_ms": 300, "list_lag_ms": 500,
        "images": [
            {"match": "trainer", "outcome": "EXITED", "after_ms": 2000, "logs": ["done"],
             "exit_code": 0}
        ]
    })
}

fn main() -> std::process::ExitCode {
    support::harness::main("e2e_offload", &ExtraFlags::default(), |cp| {
        Box::pin(run(cp))
    })
}

struct Env<'a> {
    control_plane: &'a ControlPlane,
    client: kube::Client,
    simulator: SimulatorProcess,
    webhook: WebhookProcess,
    controller: Option<ControllerProcess>,
    /// The current controller's `--metrics-listen` address.
    metrics: String,
}

impl Env<'_> {
    /// Stops the running controller (if any) and starts one with these offloading flags. Every
    /// run has the same cluster id, so each recognises the RunPod pods of the ones before.
    fn start_controller(&mut self, flags: &[&str]) -> anyhow::Result<()> {
        if let Some(mut old) = self.controller.take() {
            old.kill();
        }
        let metrics = support::webhook::free_port()?.to_string();
        let mut args = vec!["--cluster-id", "e2e-offload", "--metrics-listen", &metrics];
        args.extend_from_slice(flags);
        let controller = ControllerProcess::start(
            &self.control_plane.kubeconfig,
            &self.control_plane.ca_file(),
            &self.simulator,
            &args,
        )?;
        self.controller = Some(controller);
        self.metrics = metrics;
        Ok(())
    }

    fn controller(&mut self) -> anyhow::Result<&mut ControllerProcess> {
        self.controller.as_mut().context("no controller running")
    }

    /// Waits until the current controller's metrics series reaches `at_least`; its value.
    async fn metric_at_least(&self, series: &str, at_least: f64) -> anyhow::Result<f64> {
        wait::until(&format!("{series} >= {at_least}"), WAIT, || async {
            let value = support::controller::metric(&self.metrics, series).await?;
            Ok(value.filter(|v| *v >= at_least))
        })
        .await
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), NS)
    }
}

fn offloaded(reason: &str) -> String {
    format!("runpod_kubelet_offloaded_total{{reason=\"{reason}\"}}")
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let simulator = SimulatorProcess::start(&scenario())?;
    let webhook = WebhookProcess::start(
        &control_plane.kubeconfig,
        &[
            "--datacenter-ids",
            "EU-RO-1,US-TX-3",
            "--max-gpu-price",
            "2",
        ],
    )
    .await?;
    webhook.register(&client, &["kube-system"]).await?;
    let heartbeat = FakeNode::local_gpu(LOCAL).register(client.clone()).await?;
    let mut env = Env {
        control_plane,
        client,
        simulator,
        webhook,
        controller: None,
        metrics: String::new(),
    };
    // The threshold is out of the way here: only max-pending-time and the annotation act.
    env.start_controller(&["--max-pending-time", "40", "--pending-job-threshold", "10"])?;
    let outcome = scenarios(&mut env).await;
    heartbeat.abort();
    if outcome.is_err() {
        let webhook_log = env.webhook.log();
        let lines: Vec<&str> = webhook_log.lines().collect();
        eprintln!(
            "--- webhook log tail ---\n{}",
            lines[lines.len().saturating_sub(30)..].join("\n")
        );
        if let Some(controller) = env.controller.as_mut() {
            eprintln!(
                "--- controller log tail (alive: {}) ---\n{}",
                controller.alive(),
                controller.log_tail(80)
            );
        }
    }
    outcome
}

async fn scenarios(env: &mut Env<'_>) -> anyhow::Result<()> {
    node_ready(&env.client).await?;
    namespace(&env.client, NS, true).await?;
    offload_annotation_at_creation(env)
        .await
        .context("runpod.io/offload on a Job with the local GPU free")?;
    max_pending_time(env).await.context(
        "max-pending-time; a pod RunPod cannot run; a Job's limit; runpod.io/offload later",
    )?;
    env.start_controller(&["--pending-job-threshold", "1", "--max-pending-time", "1h"])?;
    threshold(env).await.context("pending-job-threshold")?;
    env.start_controller(&["--max-pending-time", "15", "--pending-job-threshold", "10"])?;
    restart_while_waiting(env)
        .await
        .context("a controller restarted while pods wait and move")?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Scenarios

/// Scenario 3: `runpod.io/offload: "true"` on a managed Job while the local GPU is free: the
/// webhook mutates the pod like an `always` one, so it goes to the virtual node, not the free GPU.
async fn offload_annotation_at_creation(env: &Env<'_>) -> anyhow::Result<()> {
    ensure!(
        local_active(env).await?.is_empty(),
        "the local GPU should be free for this scenario"
    );
    env.jobs()
        .create(
            &PostParams::default(),
            &job(
                "direct",
                1,
                &[("runpod.io/managed", "true"), ("runpod.io/offload", "true")],
            ),
        )
        .await?;
    let pod = wait::until("the direct Job's pod bound", WAIT, || async {
        let pods = pods_of_job(env, "direct").await?;
        Ok(pods.into_iter().find(|p| node_of(p).is_some()))
    })
    .await?;
    ensure!(
        node_of(&pod) == Some(NODE),
        "runpod.io/offload pod bound to {:?} (the local GPU was free)",
        node_of(&pod)
    );
    let selector = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    ensure!(
        selector.get("type").map(String::as_str) == Some("virtual-kubelet"),
        "not mutated like always: nodeSelector {selector:?}"
    );
    ensure!(
        provider_tolerations(&pod) >= 1,
        "no provider toleration: {:?}",
        pod.spec.as_ref().map(|s| &s.tolerations)
    );
    job_succeeded(env, "direct", 1).await?;
    let entries = ledger_for(&env.simulator, &uid(&pod)).await?;
    ensure!(
        entries.len() == 1,
        "RunPod pods of the direct pod: {entries:?}"
    );
    Ok(())
}

/// Scenarios 1 and 2, and a Job's own limit. One GPU, a managed Job of three: one pod runs
/// locally, two wait and move after max-pending-time (not before), same UIDs, run on RunPod; a
/// pod RunPod cannot run (two containers) waits forever; a Job whose `runpod.io/max-pending-time`
/// is an hour keeps waiting past the flag's limit, then moves when `runpod.io/offload` is added.
async fn max_pending_time(env: &Env<'_>) -> anyhow::Result<()> {
    let pods = env.pods();
    let jobs = env.jobs();
    jobs.create(&PostParams::default(), &two_container_job("two-containers"))
        .await?;
    jobs.create(
        &PostParams::default(),
        &job("wait", 3, &[("runpod.io/managed", "true")]),
    )
    .await?;
    // One binds locally, two wait (the scheduler says unschedulable).
    let (local, waiting) = wait::until("one pod local, two waiting", WAIT, || async {
        let all = pods_of_job(env, "wait").await?;
        let local: Vec<Pod> = all
            .iter()
            .filter(|p| node_of(p) == Some(LOCAL))
            .cloned()
            .collect();
        let waiting: Vec<Pod> = all.iter().filter(|p| is_waiting(p)).cloned().collect();
        Ok((all.len() == 3 && local.len() == 1 && waiting.len() == 2)
            .then(|| (local[0].clone(), waiting)))
    })
    .await?;
    mark_running(&pods, &local).await?;
    let waiting_uids: Vec<String> = waiting.iter().map(uid).collect();
    for pod in &waiting {
        ensure!(
            provider_tolerations(pod) == 0,
            "a delayed pod was admitted with the virtual node's toleration: {:?}",
            pod.spec.as_ref().map(|s| &s.tolerations)
        );
    }
    let two = wait::until("the two-container pod waiting", WAIT, || async {
        let all = pods_of_job(env, "two-containers").await?;
        Ok(all.into_iter().find(is_waiting))
    })
    .await?;
    // The GPU is busy now, so this one waits too; an hour of its own limit.
    jobs.create(
        &PostParams::default(),
        &job(
            "late",
            1,
            &[
                ("runpod.io/managed", "true"),
                ("runpod.io/max-pending-time", "3600"),
            ],
        ),
    )
    .await?;
    let late = wait::until("the late Job's pod waiting", WAIT, || async {
        let all = pods_of_job(env, "late").await?;
        Ok(all.into_iter().find(is_waiting))
    })
    .await?;

    // Not moved before the limit: poll until 35 s after the first waiting pod was created.
    let first_created = waiting.iter().map(age_secs).fold(0.0_f64, f64::max);
    let window_end = tokio::time::Instant::now()
        + Duration::from_secs_f64((NOT_BEFORE - first_created).max(0.0));
    while tokio::time::Instant::now() < window_end {
        for name in waiting.iter().chain([&two, &late]).map(name_of) {
            let pod = pods.get(name).await?;
            ensure!(
                is_waiting(&pod) && provider_tolerations(&pod) == 0,
                "{name} moved or bound {:.0} s after its creation, before max-pending-time \
                 ({MAX_PENDING} s): node {:?}, tolerations {:?}",
                age_secs(&pod),
                node_of(&pod),
                pod.spec.as_ref().map(|s| &s.tolerations)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // Then both move to the virtual node: the same pods (UIDs), never re-created.
    let moved = wait::until("both waiting pods on the virtual node", WAIT, || async {
        let mut moved = Vec::new();
        for pod in &waiting {
            let now = pods.get(name_of(pod)).await?;
            if node_of(&now) == Some(NODE) {
                moved.push(now);
            }
        }
        Ok((moved.len() == 2).then_some(moved))
    })
    .await?;
    for pod in &moved {
        ensure!(
            waiting_uids.contains(&uid(pod)),
            "{} has a new UID {}",
            name_of(pod),
            uid(pod)
        );
        ensure!(
            provider_tolerations(pod) >= 1,
            "bound to the virtual node without the toleration"
        );
        let duplicates = duplicate_tolerations(pod)?;
        ensure!(
            duplicates.is_empty(),
            "duplicate tolerations {duplicates:?}"
        );
    }

    // The Job with its own hour-long limit still waits, well past the flag's 40 s; so does the
    // pod RunPod cannot run.
    let youngest = [&two, &late]
        .into_iter()
        .map(age_secs)
        .fold(f64::MAX, f64::min);
    tokio::time::sleep(Duration::from_secs_f64(
        (MAX_PENDING + MARGIN - youngest).max(0.0),
    ))
    .await;
    let late_now = pods.get(name_of(&late)).await?;
    ensure!(
        is_waiting(&late_now) && provider_tolerations(&late_now) == 0,
        "the Job's runpod.io/max-pending-time (3600) was not applied: moved at {:.0} s, node {:?}",
        age_secs(&late_now),
        node_of(&late_now)
    );
    cannot_run_stays_local(env, &two).await?;
    // Pods wait, the longest for more than 40 s.
    env.metric_at_least("runpod_kubelet_offload_waiting_pods", 1.0)
        .await?;
    env.metric_at_least("runpod_kubelet_offload_longest_wait_seconds", MAX_PENDING)
        .await?;

    // runpod.io/offload added to the Job later: its waiting pod moves (the hour is not up).
    jobs.patch(
        "late",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {"runpod.io/offload": "true"}}})),
    )
    .await?;
    let late_moved = wait::until("the late pod on the virtual node", WAIT, || async {
        let pod = pods.get(name_of(&late)).await?;
        Ok((node_of(&pod) == Some(NODE)).then_some(pod))
    })
    .await?;
    ensure!(
        uid(&late_moved) == uid(&late),
        "the late pod was re-created"
    );
    let message = event(&env.client, NS, name_of(&late), "Offloaded").await?;
    ensure!(
        message.contains("runpod.io/offload"),
        "the Offloaded Event does not name runpod.io/offload: {message}"
    );
    ensure!(
        env.metric_at_least(&offloaded("offload_annotation"), 1.0)
            .await?
            == 1.0,
        "offload_annotation moves"
    );

    // The moved pods run on RunPod and succeed; the test finishes the local one.
    for pod in &moved {
        wait::until(&format!("{} Succeeded", name_of(pod)), WAIT, || async {
            let now = pods.get(name_of(pod)).await?;
            Ok((phase(&now) == Some("Succeeded")).then_some(()))
        })
        .await?;
    }
    mark_succeeded(&pods, &local).await?;
    job_succeeded(env, "wait", 3).await?;
    job_succeeded(env, "late", 1).await?;
    let all = pods_of_job(env, "wait").await?;
    ensure!(
        all.len() == 3,
        "the Job ran {} pods for 3 completions",
        all.len()
    );
    let mut runpod_pods = 0;
    for pod in &all {
        let entries = ledger_for(&env.simulator, &uid(pod)).await?;
        let expected = usize::from(waiting_uids.contains(&uid(pod)));
        ensure!(
            entries.len() == expected,
            "{} ({}) has {} RunPod pods, expected {expected}",
            name_of(pod),
            node_of(pod).unwrap_or("unbound"),
            entries.len()
        );
        runpod_pods += entries.len();
    }
    ensure!(runpod_pods == 2, "{runpod_pods} RunPod pods for the Job");
    ensure!(
        ledger_for(&env.simulator, &uid(&local)).await?.is_empty(),
        "the local pod got a RunPod pod"
    );
    let message = event(&env.client, NS, name_of(&moved[0]), "Offloaded").await?;
    ensure!(
        message.contains("max-pending-time"),
        "the Offloaded Event does not name max-pending-time: {message}"
    );
    event(&env.client, NS, "wait", "Offloaded")
        .await
        .context("no Offloaded Event on the Job")?;
    ensure!(
        env.metric_at_least(&offloaded("max_pending_time"), 2.0)
            .await?
            == 2.0,
        "max_pending_time moves"
    );
    let entries = ledger_for(&env.simulator, &uid(&late)).await?;
    ensure!(
        entries.len() == 1,
        "RunPod pods of the late pod: {entries:?}"
    );

    // The pod RunPod cannot run still waits, and goes away with its Job.
    cannot_run_stays_local(env, &two).await?;
    jobs.delete("two-containers", &DeleteParams::background())
        .await?;
    pods.delete_collection(
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
        &ListParams::default().labels("job-name=two-containers"),
    )
    .await?;
    wait::until("the two-container pod gone", WAIT, || async {
        Ok(pods_of_job(env, "two-containers")
            .await?
            .is_empty()
            .then_some(()))
    })
    .await
}

/// Scenario 2: the managed pod RunPod cannot run (two containers, two GPUs: it never fits the
/// local node either) waits, unscheduled, without the toleration or the virtual node's selector,
/// past max-pending-time.
async fn cannot_run_stays_local(env: &Env<'_>, two: &Pod) -> anyhow::Result<()> {
    let now = env.pods().get(name_of(two)).await?;
    ensure!(
        uid(&now) == uid(two),
        "the two-container pod was re-created"
    );
    ensure!(
        age_secs(&now) > MAX_PENDING + MARGIN,
        "checked too early ({:.0} s)",
        age_secs(&now)
    );
    let selector = now
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    ensure!(
        is_waiting(&now)
            && provider_tolerations(&now) == 0
            && selector.get("type").map(String::as_str) != Some("virtual-kubelet"),
        "a pod RunPod cannot run was moved after {:.0} s: node {:?}, tolerations {:?}, \
         nodeSelector {selector:?}",
        age_secs(&now),
        node_of(&now),
        now.spec.as_ref().map(|s| &s.tolerations)
    );
    ensure!(
        !events(&env.client, NS, name_of(two))
            .await?
            .iter()
            .any(|(reason, _)| reason == "Offloaded"),
        "an Offloaded Event on a pod RunPod cannot run"
    );
    ensure!(ledger_for(&env.simulator, &uid(two)).await?.is_empty());
    Ok(())
}

/// Scenario 4: `--pending-job-threshold 1` (and an hour's max-pending-time): three managed pods
/// wait for a busy GPU, the two longest-waiting move, one keeps waiting; when the GPU frees, that
/// one runs locally and is never moved.
async fn threshold(env: &Env<'_>) -> anyhow::Result<()> {
    let pods = env.pods();
    let blocker = occupy_local_gpu(env, "blocker-queue").await?;
    env.jobs()
        .create(
            &PostParams::default(),
            &job("queue", 3, &[("runpod.io/managed", "true")]),
        )
        .await?;
    let (moved, left) = wait::until("two pods moved, one waiting", WAIT, || async {
        let all = pods_of_job(env, "queue").await?;
        let moved: Vec<Pod> = all
            .iter()
            .filter(|p| node_of(p) == Some(NODE))
            .cloned()
            .collect();
        let left: Vec<Pod> = all.iter().filter(|p| is_waiting(p)).cloned().collect();
        Ok((all.len() == 3 && moved.len() == 2 && left.len() == 1)
            .then(|| (moved, left[0].clone())))
    })
    .await?;
    let message = event(&env.client, NS, name_of(&moved[0]), "Offloaded").await?;
    ensure!(
        message.contains("threshold"),
        "the Offloaded Event does not name the threshold: {message}"
    );
    // At most one may wait: over ten reconcile intervals the last one stays where it is.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = pods.get(name_of(&left)).await?;
        ensure!(
            is_waiting(&now) && provider_tolerations(&now) == 0,
            "the only waiting pod moved (threshold 1): node {:?}",
            node_of(&now)
        );
    }
    ensure!(
        env.metric_at_least(&offloaded("threshold"), 2.0).await? == 2.0,
        "threshold moves"
    );

    // The GPU frees: the waiting pod binds there, the same pod, never moved.
    mark_succeeded(&pods, &blocker).await?;
    let local = wait::until("the waiting pod bound locally", WAIT, || async {
        let pod = pods.get(name_of(&left)).await?;
        Ok(node_of(&pod).is_some().then_some(pod))
    })
    .await?;
    ensure!(
        node_of(&local) == Some(LOCAL) && uid(&local) == uid(&left),
        "the waiting pod went to {:?} (uid {} was {})",
        node_of(&local),
        uid(&local),
        uid(&left)
    );
    ensure!(
        provider_tolerations(&local) == 0,
        "a locally bound pod got the toleration"
    );
    mark_running(&pods, &local).await?;
    for pod in &moved {
        wait::until(&format!("{} Succeeded", name_of(pod)), WAIT, || async {
            let now = pods.get(name_of(pod)).await?;
            Ok((phase(&now) == Some("Succeeded")).then_some(()))
        })
        .await?;
    }
    mark_succeeded(&pods, &local).await?;
    job_succeeded(env, "queue", 3).await?;
    let after = pods.get(name_of(&local)).await?;
    ensure!(
        provider_tolerations(&after) == 0,
        "a pod that ran locally was given the toleration"
    );
    ensure!(
        ledger_for(&env.simulator, &uid(&local)).await?.is_empty(),
        "the local pod got a RunPod pod"
    );
    for pod in &moved {
        let entries = ledger_for(&env.simulator, &uid(pod)).await?;
        ensure!(entries.len() == 1, "{}: {entries:?}", name_of(pod));
    }
    ensure!(
        support::controller::metric(&env.metrics, &offloaded("threshold")).await? == Some(2.0),
        "threshold moves after the GPU freed"
    );
    Ok(())
}

/// Scenario 5: the controller is killed while two managed pods wait, started again, and killed
/// and started again just after the first move: every pod moves once (one RunPod pod each, no
/// duplicate toleration) and the Job completes.
async fn restart_while_waiting(env: &mut Env<'_>) -> anyhow::Result<()> {
    let pods = env.pods();
    let blocker = occupy_local_gpu(env, "blocker-resume").await?;
    env.jobs()
        .create(
            &PostParams::default(),
            &job("resume", 2, &[("runpod.io/managed", "true")]),
        )
        .await?;
    let waiting = wait::until("two pods waiting", WAIT, || async {
        let all = pods_of_job(env, "resume").await?;
        Ok((all.len() == 2 && all.iter().all(is_waiting)).then_some(all))
    })
    .await?;
    // Down for a few seconds while they wait (their 15 s count from their creation).
    env.controller()?.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.controller()?.restart()?;
    // As soon as one has moved, kill and start it again.
    wait::until("a pod moved", WAIT, || async {
        for pod in &waiting {
            if provider_tolerations(&pods.get(name_of(pod)).await?) > 0 {
                return Ok(Some(()));
            }
        }
        Ok(None)
    })
    .await?;
    env.controller()?.restart()?;
    for pod in &waiting {
        let done = wait::until(&format!("{} Succeeded", name_of(pod)), WAIT, || async {
            let now = pods.get(name_of(pod)).await?;
            Ok((phase(&now) == Some("Succeeded")).then_some(now))
        })
        .await?;
        ensure!(
            node_of(&done) == Some(NODE) && uid(&done) == uid(pod),
            "{} ran on {:?} (uid {})",
            name_of(pod),
            node_of(&done),
            uid(&done)
        );
        let duplicates = duplicate_tolerations(&done)?;
        ensure!(
            duplicates.is_empty(),
            "{} was moved twice: duplicate tolerations {duplicates:?}",
            name_of(pod)
        );
        let entries = ledger_for(&env.simulator, &uid(&done)).await?;
        ensure!(
            entries.len() == 1,
            "{} has {} RunPod pods: {entries:?}",
            name_of(pod),
            entries.len()
        );
    }
    job_succeeded(env, "resume", 2).await?;
    ensure!(
        pods_of_job(env, "resume").await?.len() == 2,
        "the Job ran more pods than it asked for"
    );
    mark_succeeded(&pods, &blocker).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// A GPU Job of `parallelism` pods (as many completions), the simulator's "trainer" image.
fn job(name: &str, parallelism: i32, annotations: &[(&str, &str)]) -> Job {
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "e2e/trainer:1",
                    "command": ["python", "train.py"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }))
    .unwrap()
}

/// A managed Job whose pod RunPod cannot run: two containers, a GPU each (so it never fits the
/// one local GPU either).
fn two_container_job(name: &str) -> Job {
    let container = |name: &str| {
        json!({"name": name, "image": "e2e/trainer:1", "command": ["python", "train.py"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"runpod.io/managed": "true"}},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [container("a"), container("b")]}}}
    }))
    .unwrap()
}

/// A GPU pod that never bursts (opted out), bound to the local GPU and Running.
async fn occupy_local_gpu(env: &Env<'_>, name: &str) -> anyhow::Result<Pod> {
    ensure!(
        local_active(env).await?.is_empty(),
        "the local GPU is still busy"
    );
    let pods = env.pods();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"runpod.io/burst": "disabled"}},
        "spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "e2e/trainer:1",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let bound = wait::until(&format!("{name} bound locally"), WAIT, || async {
        let pod = pods.get(name).await?;
        Ok((node_of(&pod) == Some(LOCAL)).then_some(pod))
    })
    .await?;
    mark_running(&pods, &bound).await?;
    Ok(bound)
}

/// The pods on the local node that hold its GPU (not finished).
async fn local_active(env: &Env<'_>) -> anyhow::Result<Vec<String>> {
    let list = Api::<Pod>::all(env.client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={LOCAL}")))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|p| !matches!(phase(p), Some("Succeeded" | "Failed")))
        .map(|p| name_of(p).to_owned())
        .collect())
}

async fn pods_of_job(env: &Env<'_>, job: &str) -> anyhow::Result<Vec<Pod>> {
    Ok(env
        .pods()
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await?
        .items)
}

async fn job_succeeded(env: &Env<'_>, name: &str, count: i32) -> anyhow::Result<()> {
    let jobs = env.jobs();
    wait::until(
        &format!("Job {name} with {count} succeeded"),
        WAIT,
        || async {
            let job = jobs.get(name).await?;
            let status = job.status.unwrap_or_default();
            if status.failed.unwrap_or(0) > 0 {
                bail!("Job {name} has failed pods: {status:?}");
            }
            Ok((status.succeeded.unwrap_or(0) == count).then_some(()))
        },
    )
    .await
}

/// The test's stand-in kubelet for the local node: the container started.
async fn mark_running(pods: &Api<Pod>, pod: &Pod) -> anyhow::Result<()> {
    let now = Timestamp::now().to_string();
    let patch = json!({"status": {
        "phase": "Running", "startTime": now,
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}
        ],
        "containerStatuses": [{"name": container_of(pod), "ready": true, "restartCount": 0,
            "image": "e2e/trainer:1", "imageID": "", "started": true,
            "state": {"running": {"startedAt": now}}}]
    }});
    pods.patch_status(name_of(pod), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The test's stand-in kubelet for the local node: the container exited 0 (the GPU frees).
async fn mark_succeeded(pods: &Api<Pod>, pod: &Pod) -> anyhow::Result<()> {
    let now = Timestamp::now().to_string();
    let patch = json!({"status": {
        "phase": "Succeeded",
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "PodCompleted",
             "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "False", "reason": "PodCompleted",
             "lastTransitionTime": now}
        ],
        "containerStatuses": [{"name": container_of(pod), "ready": false, "restartCount": 0,
            "image": "e2e/trainer:1", "imageID": "", "started": false,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                "startedAt": now, "finishedAt": now}}}]
    }});
    pods.patch_status(name_of(pod), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn container_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

fn name_of(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// Pending, unbound, and the scheduler has said it cannot place it (`PodScheduled=False`).
fn is_waiting(pod: &Pod) -> bool {
    let unschedulable = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "PodScheduled" && c.status == "False")
        });
    phase(pod) == Some("Pending") && node_of(pod).is_none() && unschedulable
}

/// Seconds since the pod's creation (its timestamp has whole seconds: never less than the
/// real age).
fn age_secs(pod: &Pod) -> f64 {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| Timestamp::now().duration_since(t.0).as_secs_f64())
        .unwrap_or_default()
}

/// How many tolerations the pod has for the virtual node's taints.
fn provider_tolerations(pod: &Pod) -> usize {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .map_or(0, |t| {
            t.iter()
                .filter(|t| t.key.as_deref() == Some(PROVIDER))
                .count()
        })
}

/// Tolerations that appear more than once, entry for entry.
fn duplicate_tolerations(pod: &Pod) -> anyhow::Result<Vec<serde_json::Value>> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    let mut seen: Vec<serde_json::Value> = Vec::new();
    let mut duplicates = Vec::new();
    for toleration in &tolerations {
        let value = serde_json::to_value(toleration)?;
        if seen.contains(&value) {
            duplicates.push(value);
        } else {
            seen.push(value);
        }
    }
    Ok(duplicates)
}
