//! The crash test: the controller is killed with SIGKILL at random moments (seeded; the seed is
//! printed, `CRASH_SEED=N` replays it) across more than 50 pod lifecycles (`CRASH_LIFECYCLES=N`
//! for a longer soak), while the simulator answers creates with 5xx after really creating,
//! answers 429, lags its list, omits every pod from some lists, goes down whole for a while and
//! answers slowly, in storms of 20 s with calms of 10 s between. The controller is restarted
//! after each kill. Once the faults stop and everything has converged, the ledger must show,
//! for every Kubernetes pod, at most one RunPod pod ever created (zero duplicates, not even
//! short-lived ones) and no RunPod pod alive for a deleted or finished pod; every batch pod must
//! have Succeeded with its exit code. First, deterministically: a pod deleted while its create's
//! answer was lost and the controller down has its instance's GPU billing ended before the pod
//! object goes; a create sent late, then SIGKILL, is found; a lost create followed by two empty
//! lists after the restart is not sent again. Last, `controller drain` with the controller dead
//! and a lost create hidden by empty lists leaves nothing billing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess, run_command};
use support::pods::{NODE, bound_gpu_pod, exit_code, live, namespace, node_ready, phase, uid};
use support::storms::Storms;
use support::wait;
use tokio::sync::Mutex;

const CLUSTER: &str = "e2e-crash";
const NS: &str = "crash";
/// Pod lifecycles in the CI-sized run; `CRASH_LIFECYCLES=N` runs a longer soak.
const LIFECYCLES: usize = 60;
const CONCURRENT: usize = 8;
/// How long a deleted pod's GPU may bill beyond its grace period, whatever happened to its
/// create's answer and however often the controller died.
const BILLING_AFTER_GRACE: Duration = Duration::from_secs(60);
/// Every wait for a pod is this generous: the controller may be down or settling.
const POD_WAIT: Duration = Duration::from_secs(300);

fn scenario() -> serde_json::Value {
    json!({
        "provisioning_ms": 800, "starting_ms": 400, "ports_ms": 200, "list_lag_ms": 1500,
        "rate_limits": [{"name": "minute", "quota": 100000, "window_secs": 60}],
        "images": [
            {"match": "batch", "outcome": "EXITED", "after_ms": 2500, "logs": ["working"], "exit_code": 0},
            {"match": "server", "logs": ["serving"]}
        ]
    })
}

fn main() -> std::process::ExitCode {
    support::harness::main("e2e_controller_crash", &ExtraFlags::default(), |cp| {
        Box::pin(run(cp))
    })
}

/// What the test does with a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Runs to completion (EXITED, exit code from the log) and must end Succeeded.
    Batch,
    /// Runs until the test deletes it once it is Running.
    DeletedRunning,
    /// Deleted soon after creation, often before or during its create.
    DeletedEarly,
}

struct Lifecycle {
    name: String,
    uid: String,
    kind: Kind,
    /// When the test deleted the pod, and the grace period it gave.
    deleted: Option<(Timestamp, i64)>,
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("e2e_controller_crash: seed {seed} (CRASH_SEED={seed} replays the schedule)");
    let client = control_plane.client().await?;
    let simulator = Arc::new(SimulatorProcess::start(&scenario())?);
    // The first scenario needs a settle time longer than a restart takes; the random run
    // then goes on with a short one.
    let controller = Arc::new(Mutex::new(ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &["--cluster-id", CLUSTER, "--create-settle", "30s"],
    )?));
    let mut outcome = crash_run(&client, &simulator, &controller, seed).await;
    if outcome.is_ok() {
        outcome =
            drained_while_unknown(&client, &simulator, &controller, &control_plane.kubeconfig)
                .await
                .context("drained after a lost create, with the controller dead");
    }
    // `CRASH_LOG=FILE` keeps every run's whole log for a look at what happened.
    if let Ok(path) = std::env::var("CRASH_LOG") {
        std::fs::write(&path, controller.lock().await.log())?;
    }
    if outcome.is_err() {
        eprintln!(
            "--- controller log tail (seed {seed}) ---\n{}",
            controller.lock().await.log_tail(120)
        );
    }
    outcome
}

async fn crash_run(
    client: &kube::Client,
    simulator: &Arc<SimulatorProcess>,
    controller: &Arc<Mutex<ControllerProcess>>,
    seed: u64,
) -> anyhow::Result<()> {
    node_ready(client).await?;
    namespace(client, NS, false).await?;
    let unknown = deleted_while_unknown(client, simulator, controller)
        .await
        .context("a pod deleted while its create's answer was lost and the controller down")?;
    {
        let mut controller = controller.lock().await;
        controller.push_args(&["--create-settle", "5s"]);
        controller.restart()?;
    }
    let late = late_create_then_kill(client, simulator, controller)
        .await
        .context("a create sent late, then SIGKILL")?;
    let restarted = restarted_into_empty_lists(client, simulator, controller)
        .await
        .context("a lost create, SIGKILL, and two empty lists after the restart")?;
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicU32::new(0));
    let killer = tokio::spawn(killer(
        controller.clone(),
        stop.clone(),
        kills.clone(),
        seed ^ 0x5eed,
    ));
    let injector =
        tokio::spawn(STORMS.inject(simulator.clone(), faults(), stop.clone(), seed ^ 0xfa17));

    let mut rng = fastrand::Rng::with_seed(seed);
    let mut tasks = tokio::task::JoinSet::new();
    let mut done: Vec<Lifecycle> = vec![unknown, late, restarted];
    let lifecycles = std::env::var("CRASH_LIFECYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(LIFECYCLES);
    for index in 0..lifecycles {
        while tasks.len() >= CONCURRENT {
            done.push(tasks.join_next().await.context("no task")???);
        }
        let kind = match rng.u8(0..10) {
            0..=3 => Kind::Batch,
            4..=6 => Kind::DeletedRunning,
            _ => Kind::DeletedEarly,
        };
        let early_delay = Duration::from_millis(rng.u64(0..4000));
        let running_for = Duration::from_millis(rng.u64(0..3000));
        let client = client.clone();
        tasks.spawn(async move {
            tokio::time::timeout(
                POD_WAIT,
                lifecycle(&client, index, kind, early_delay, running_for),
            )
            .await
            .with_context(|| format!("lifecycle {index} ({kind:?}) did not end"))?
        });
        tokio::time::sleep(Duration::from_millis(rng.u64(100..800))).await;
    }
    while let Some(result) = tasks.join_next().await {
        done.push(result??);
    }
    stop.store(true, Ordering::SeqCst);
    killer.await?;
    let injected = injector.await?;
    simulator.clear_faults().await?;
    {
        let mut controller = controller.lock().await;
        if !controller.alive() {
            controller.restart()?;
        }
    }
    println!(
        "e2e_controller_crash: {} lifecycles, {} SIGKILLs, {injected} fault rules injected",
        done.len(),
        kills.load(Ordering::SeqCst)
    );
    ensure!(
        kills.load(Ordering::SeqCst) >= 8,
        "too few kills to mean anything"
    );
    converge_and_check(client, simulator, &done).await
}

/// The pod's create, answered with a 500 after RunPod created it; the controller is killed
/// once the ledger shows the create, before any list could show it. Returns the pod's uid.
async fn lost_create_then_kill(
    pods: &Api<Pod>,
    simulator: &SimulatorProcess,
    controller: &Mutex<ControllerProcess>,
    name: &str,
) -> anyhow::Result<String> {
    simulator
        .inject(&json!({"when": {"operation": "createPod"},
                        "effect": {"kind": "create_then_fail", "status": 500}, "times": 1}))
        .await?;
    let created = pods
        .create(
            &PostParams::default(),
            &bound_gpu_pod(name, "e2e/server:1", "Always"),
        )
        .await?;
    let uid = uid(&created);
    wait::until("the create whose answer is lost", POD_WAIT, || async {
        let ledger = simulator.ledger().await?;
        Ok(ledger
            .iter()
            .any(|e| e["env"]["RUNPOD_KUBELET_POD_UID"] == uid.as_str())
            .then_some(()))
    })
    .await?;
    controller.lock().await.kill();
    Ok(uid)
}

/// The double bill the random run found: a create's answer lost, the controller killed, and
/// the first two lists after its restart (past the settle time) empty. Two lists that omit
/// every pod prove nothing: the pod must run on its one RunPod pod, never a second.
async fn restarted_into_empty_lists(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    controller: &Mutex<ControllerProcess>,
) -> anyhow::Result<Lifecycle> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let name = "restarted".to_owned();
    let uid = lost_create_then_kill(&pods, simulator, controller, &name).await?;
    // Past the settle time (5 s), so the empty lists alone would decide.
    tokio::time::sleep(Duration::from_secs(6)).await;
    simulator
        .inject(&json!({"when": {"operation": "listPods"}, "effect": {"kind": "empty_list"}, "times": 2}))
        .await?;
    controller.lock().await.restart()?;
    runs_on_one_instance(
        &pods,
        simulator,
        name,
        &uid,
        "the pod whose create was lost",
    )
    .await
}

/// Waits until the pod runs, lets some more lists pass, and checks that one RunPod pod was
/// ever created for it; then deletes it.
async fn runs_on_one_instance(
    pods: &Api<Pod>,
    simulator: &SimulatorProcess,
    name: String,
    uid: &str,
    what: &str,
) -> anyhow::Result<Lifecycle> {
    wait::until(&format!("{what} Running"), POD_WAIT, || async {
        let pod = pods.get(&name).await?;
        Ok((phase(&pod) == Some("Running")).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let entries: Vec<_> = simulator
        .ledger()
        .await?
        .into_iter()
        .filter(|e| e["env"]["RUNPOD_KUBELET_POD_UID"] == uid)
        .map(|e| e["id"].clone())
        .collect();
    ensure!(entries.len() == 1, "RunPod pods for {what}: {entries:?}");
    pods.delete(&name, &DeleteParams::default()).await?;
    Ok(Lifecycle {
        name,
        uid: uid.to_owned(),
        kind: Kind::DeletedRunning,
        deleted: Some((Timestamp::now(), 30)),
    })
}

/// Uninstalling after a crash: a create's answer lost, the controller dead for good (its node
/// Lease gone), and `controller drain` run while the first lists omit every pod. Drain must
/// find and terminate the instance: nothing of this cluster may bill after it succeeds.
async fn drained_while_unknown(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    controller: &Mutex<ControllerProcess>,
    kubeconfig: &std::path::Path,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let uid = lost_create_then_kill(&pods, simulator, controller, "drained").await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    leases.delete(NODE, &DeleteParams::default()).await?;
    // Drain's first look (the key check) and its next four lists (about 6 s) show nothing:
    // enough for three empty lists in a row, but not for the settle time drain must wait
    // since the node's pods record a create.
    simulator
        .inject(&json!({"when": {"operation": "listPods"}, "effect": {"kind": "empty_list"}, "times": 5}))
        .await?;
    let drain = [
        "controller",
        "drain",
        "--nodename",
        NODE,
        "--cluster-id",
        CLUSTER,
        "--create-settle",
        "15s",
        "--timeout",
        "90s",
    ];
    let (status, log) = run_command(kubeconfig, simulator, &drain)?;
    ensure!(status.success(), "drain failed ({status:?}):\n{log}");
    let alive: Vec<_> = simulator
        .ledger()
        .await?
        .into_iter()
        .filter(|e| e["env"]["RUNPOD_KUBELET_CLUSTER"] == CLUSTER && live(e))
        .map(|e| (e["id"].clone(), e["env"]["RUNPOD_KUBELET_POD_UID"].clone()))
        .collect();
    ensure!(
        alive.is_empty(),
        "still billing after drain succeeded (the lost create was pod {uid}): {alive:?}"
    );
    Ok(())
}

/// A pod deleted while nobody knows its instance: the create's answer was lost (a 500 after
/// RunPod created the pod), the controller died before a list showed it, and the first list
/// of its successor omits it. The pod must stay until the lists could show its instance, and
/// that instance's GPU billing must end before the pod object goes (not later, by garbage
/// collection of an instance whose pod is gone).
async fn deleted_while_unknown(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    controller: &Mutex<ControllerProcess>,
) -> anyhow::Result<Lifecycle> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let name = "unknown".to_owned();
    let uid = lost_create_then_kill(&pods, simulator, controller, &name).await?;
    pods.delete(&name, &DeleteParams::default()).await?;
    let deleted = Some((Timestamp::now(), 30));
    simulator
        .inject(&json!({"when": {"operation": "listPods"}, "effect": {"kind": "empty_list"}, "times": 1}))
        .await?;
    controller.lock().await.restart()?;
    let removed_at = wait::until("the deleted pod removed", POD_WAIT, || async {
        Ok(pods.get_opt(&name).await?.is_none().then(Timestamp::now))
    })
    .await?;
    let entries: Vec<serde_json::Value> = simulator
        .ledger()
        .await?
        .into_iter()
        .filter(|e| e["env"]["RUNPOD_KUBELET_POD_UID"] == uid.as_str())
        .collect();
    ensure!(entries.len() == 1, "RunPod pods for the pod: {entries:?}");
    let ended = ["gpu_billing_ended_at", "stopped_at", "terminated_at"]
        .iter()
        .filter_map(|field| entries[0][*field].as_str())
        .filter_map(|at| at.parse::<Timestamp>().ok())
        .min();
    ensure!(
        ended.is_some_and(|ended| ended <= removed_at),
        "GPU billing of the deleted pod's instance {} ended at {ended:?}, after its pod was \
         removed (seen gone at {removed_at})",
        entries[0]["id"]
    );
    Ok(Lifecycle {
        name,
        uid,
        kind: Kind::DeletedRunning,
        deleted,
    })
}

/// The deterministic worst case: RunPod holds the create back with 429s, so it is sent well
/// after the create marker was written; the controller dies right after sending it, and the
/// new one starts while the list still lags behind the create. It must find that pod, not
/// create a second.
async fn late_create_then_kill(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    controller: &Mutex<ControllerProcess>,
) -> anyhow::Result<Lifecycle> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    simulator
        .inject(&json!({"when": {"operation": "createPod"},
                        "effect": {"kind": "status", "status": 429, "retry_after": 3}, "times": 2}))
        .await?;
    let name = "late".to_owned();
    let created = pods
        .create(
            &PostParams::default(),
            &bound_gpu_pod(&name, "e2e/server:1", "Always"),
        )
        .await?;
    let uid = uid(&created);
    let mut ledger_polls = tokio::time::interval(Duration::from_millis(50));
    let deadline = tokio::time::Instant::now() + POD_WAIT;
    loop {
        ledger_polls.tick().await;
        let ledger = simulator.ledger().await?;
        if ledger
            .iter()
            .any(|e| e["env"]["RUNPOD_KUBELET_POD_UID"] == uid.as_str())
        {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the late create never came"
        );
    }
    controller.lock().await.restart()?;
    runs_on_one_instance(&pods, simulator, name, &uid, "the late create").await
}

/// One pod's life, as the test drives it.
async fn lifecycle(
    client: &kube::Client,
    index: usize,
    kind: Kind,
    early_delay: Duration,
    running_for: Duration,
) -> anyhow::Result<Lifecycle> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let name = format!("p{index:03}");
    let image = match kind {
        Kind::Batch => "e2e/batch:1",
        _ => "e2e/server:1",
    };
    let restart = match kind {
        Kind::Batch => "Never",
        _ => "Always",
    };
    let created = pods
        .create(
            &PostParams::default(),
            &bound_gpu_pod(&name, image, restart),
        )
        .await?;
    let uid = uid(&created);
    let delete = DeleteParams {
        grace_period_seconds: Some(3),
        ..DeleteParams::default()
    };
    let mut deleted = None;
    match kind {
        Kind::Batch => {
            wait::until(&format!("{name} finished"), POD_WAIT, || async {
                let pod = pods.get(&name).await?;
                Ok(matches!(phase(&pod), Some("Succeeded" | "Failed")).then_some(()))
            })
            .await?;
        }
        Kind::DeletedRunning => {
            wait::until(&format!("{name} Running"), POD_WAIT, || async {
                let pod = pods.get(&name).await?;
                Ok((phase(&pod) == Some("Running")).then_some(()))
            })
            .await?;
            tokio::time::sleep(running_for).await;
            pods.delete(&name, &delete).await?;
            deleted = Some((Timestamp::now(), 3));
        }
        Kind::DeletedEarly => {
            tokio::time::sleep(early_delay).await;
            pods.delete(&name, &delete).await?;
            deleted = Some((Timestamp::now(), 3));
        }
    }
    Ok(Lifecycle {
        name,
        uid,
        kind,
        deleted,
    })
}

/// Storms of 20 s and calms of 10 s (`support::storms`).
const STORMS: Storms = Storms {
    storm: Duration::from_secs(20),
    calm: Duration::from_secs(10),
};

/// Kills the controller with SIGKILL at random moments of the storms and starts it again.
async fn killer(
    controller: Arc<Mutex<ControllerProcess>>,
    stop: Arc<AtomicBool>,
    kills: Arc<AtomicU32>,
    seed: u64,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let since = tokio::time::Instant::now();
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.u64(1000..5000))).await;
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if !STORMS.stormy(since) {
            continue;
        }
        let mut process = controller.lock().await;
        process.kill();
        kills.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(rng.u64(0..1000))).await;
        if let Err(error) = process.restart() {
            eprintln!("restarting the controller failed: {error:#}");
        }
    }
}

/// What RunPod does wrong in the storms: creates that fail after creating, 429s, slow answers,
/// lists that omit every pod, whole-API outages.
fn faults() -> Vec<serde_json::Value> {
    vec![
        json!({"when": {"operation": "createPod"}, "effect": {"kind": "create_then_fail", "status": 500}, "times": 1}),
        json!({"when": {"operation": "createPod"}, "effect": {"kind": "create_then_fail", "status": 502}, "times": 1}),
        json!({"when": {"operation": "createPod"}, "effect": {"kind": "status", "status": 503}, "times": 1}),
        json!({"when": {"operation": "createPod"}, "effect": {"kind": "status", "status": 429, "retry_after": 1}, "times": 2}),
        json!({"when": {"operation": "listPods"}, "effect": {"kind": "status", "status": 429, "retry_after": 1}, "times": 2}),
        json!({"when": {"operation": "listPods"}, "effect": {"kind": "delay", "millis": 2500}, "times": 2}),
        json!({"when": {"operation": "createPod"}, "effect": {"kind": "delay", "millis": 2000}, "times": 1}),
        json!({"when": {"operation": "deletePod"}, "effect": {"kind": "status", "status": 503}, "times": 1}),
        json!({"effect": {"kind": "delay", "millis": 800}, "times": 5}),
        // Lists that omit every pod, a whole-API outage, a burst of 429s.
        json!({"when": {"operation": "listPods"}, "effect": {"kind": "empty_list"}, "times": 2}),
        json!({"effect": {"kind": "status", "status": 503}, "times": 12}),
        json!({"effect": {"kind": "status", "status": 429, "retry_after": 1}, "times": 8}),
    ]
}

/// Waits until every pod has converged, then checks the ledger.
async fn converge_and_check(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    done: &[Lifecycle],
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for lifecycle in done {
        let name = &lifecycle.name;
        match lifecycle.kind {
            Kind::Batch => {
                let pod = pods.get(name).await?;
                ensure!(
                    phase(&pod) == Some("Succeeded") && exit_code(&pod) == Some(0),
                    "batch pod {name} ended {:?} with code {:?}: {:?}",
                    phase(&pod),
                    exit_code(&pod),
                    pod.status.as_ref().and_then(|s| s.message.clone())
                );
            }
            _ => {
                wait::until(&format!("{name} removed"), POD_WAIT, || async {
                    Ok(pods.get_opt(name).await?.is_none().then_some(()))
                })
                .await?;
            }
        }
    }
    // Every pod is finished or deleted: nothing of this cluster may bill any more.
    let ledger = wait::until("no RunPod pod of this cluster alive", POD_WAIT, || async {
        let ledger = simulator.ledger().await?;
        let alive = ledger
            .iter()
            .any(|e| e["env"]["RUNPOD_KUBELET_CLUSTER"] == CLUSTER && live(e));
        Ok((!alive).then_some(ledger))
    })
    .await;
    let ledger = match ledger {
        Ok(ledger) => ledger,
        Err(error) => {
            let alive: Vec<_> = simulator
                .ledger()
                .await?
                .into_iter()
                .filter(|e| e["env"]["RUNPOD_KUBELET_CLUSTER"] == CLUSTER && live(e))
                .map(|e| (e["id"].clone(), e["env"]["RUNPOD_KUBELET_POD_NAME"].clone()))
                .collect();
            return Err(error.context(format!("still alive: {alive:?}")));
        }
    };
    let mut per_uid: BTreeMap<String, Vec<&serde_json::Value>> = BTreeMap::new();
    for entry in &ledger {
        if let Some(uid) = entry["env"]["RUNPOD_KUBELET_POD_UID"].as_str() {
            per_uid.entry(uid.to_owned()).or_default().push(entry);
        }
    }
    let ambiguous = ledger.iter().filter(|e| e["create_status"] != 201).count();
    let duplicates: Vec<String> = done
        .iter()
        .filter_map(|l| {
            let entries = per_uid.get(&l.uid)?;
            (entries.len() > 1).then(|| {
                let ids: Vec<String> = entries
                    .iter()
                    .map(|e| format!("{} (create {})", e["id"], e["create_status"]))
                    .collect();
                format!("{} ({:?}): {}", l.name, l.kind, ids.join(", "))
            })
        })
        .collect();
    println!(
        "e2e_controller_crash: {} RunPod pods created, {} of them answered with an error after creating",
        ledger.len(),
        ambiguous
    );
    ensure!(
        duplicates.is_empty(),
        "duplicate RunPod pods:\n  {}",
        duplicates.join("\n  ")
    );
    let (worst, over) = billing_after_deletion(done, &per_uid);
    println!(
        "e2e_controller_crash: longest GPU billing after a deletion: {:.1} s ({})",
        worst.0, worst.1
    );
    ensure!(
        over.is_empty(),
        "GPU billing went on longer than the grace period plus {BILLING_AFTER_GRACE:?} after \
         these deletions:\n  {}",
        over.join("\n  ")
    );
    let batch_created = done
        .iter()
        .filter(|l| l.kind != Kind::DeletedEarly)
        .all(|l| per_uid.contains_key(&l.uid));
    ensure!(
        batch_created,
        "a pod that ran has no RunPod pod in the ledger"
    );
    Ok(())
}

/// The longest GPU billing after a deletion (seconds, and whose), and each deletion whose
/// billing went on past its grace period plus `BILLING_AFTER_GRACE`. Billing of an instance
/// ends at its first stop, end or termination in RunPod's ledger; one created after the
/// deletion bills from its creation.
fn billing_after_deletion(
    done: &[Lifecycle],
    per_uid: &BTreeMap<String, Vec<&serde_json::Value>>,
) -> ((f64, String), Vec<String>) {
    let time = |value: &serde_json::Value| value.as_str().and_then(|t| t.parse::<Timestamp>().ok());
    let mut worst = (0.0_f64, "none".to_owned());
    let mut over = Vec::new();
    for lifecycle in done {
        let Some((deleted_at, grace)) = lifecycle.deleted else {
            continue;
        };
        for entry in per_uid.get(&lifecycle.uid).into_iter().flatten() {
            let from = time(&entry["created_at"]).map_or(deleted_at, |c| c.max(deleted_at));
            let ended = ["gpu_billing_ended_at", "stopped_at", "terminated_at"]
                .iter()
                .filter_map(|field| time(&entry[*field]))
                .min();
            let Some(ended) = ended else {
                over.push(format!(
                    "{}: {} never stopped billing",
                    lifecycle.name, entry["id"]
                ));
                continue;
            };
            let billed = ended.duration_since(from).as_secs_f64().max(0.0);
            if billed > worst.0 {
                worst = (billed, format!("{} ({:?})", lifecycle.name, lifecycle.kind));
            }
            let bound = grace as f64 + BILLING_AFTER_GRACE.as_secs_f64();
            if billed > bound {
                over.push(format!(
                    "{} ({:?}): {} billed {billed:.1} s after its deletion",
                    lifecycle.name, lifecycle.kind, entry["id"]
                ));
            }
        }
    }
    (worst, over)
}
