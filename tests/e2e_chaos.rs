//! The chaos soak, per cloud: pod lifecycles (pods that succeed or fail, Jobs that complete or
//! fail through the real Job controller, pods deleted while running or right after creation,
//! with a grace period and without one) on the real control plane against each cloud's
//! simulator, while two replicas (leader and standby) are SIGKILLed and restarted at random
//! moments and the cloud answers with 5xx after creating, loses create answers, lags and empties
//! its lists, goes down whole and bursts 429s. The schedule comes from one seed, printed (
//! `CHAOS_SEED=N` replays it). At the end, from the simulators' own ledgers: no pod ever had two
//! instances, nothing of the cluster is alive, no deleted pod's GPU billed longer than its grace
//! period plus 60 s, and every pod ended as it should. The table of each cloud is printed.
//!
//! CI runs a short soak (`LIFECYCLES` per cloud); `CHAOS_LIFECYCLES=1000` is the long one
//! (`CHAOS_CLOUDS=runpod` or `vastai` runs one cloud, `CHAOS_CONCURRENT=N` pods at a time).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[path = "chaos/clouds.rs"]
mod clouds;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clouds::{Cloud, EXITS_THREE, EXITS_ZERO, Entry, SERVES};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::{exit_code, namespace, node_ready_named, phase, provider_toleration, uid};
use support::storms::Storms;
use support::wait;
use tokio::sync::Mutex;

const CLUSTER: &str = "e2e-chaos";
/// Lifecycles per cloud in the CI-sized run.
const LIFECYCLES: usize = 50;
const CONCURRENT: usize = 10;
/// How long a deleted pod's GPU may bill beyond its grace period.
const BILLING_AFTER_GRACE: f64 = 60.0;
/// Fewer SIGKILLs than this in a soak prove nothing about crashes; the lifecycles are paced so
/// that this many come while pods are in flight (the killer strikes in storms only, and a
/// short run may otherwise see two).
const MIN_KILLS: u32 = 3;
/// Every wait for a pod is this generous: the leader may be down or settling, and a pod may
/// meet several faults in a row. In the long Vast.ai run one pod's create took 5 minutes: 7
/// creates answered `no_such_ask`, two answered 5xx after buying (each waits the 30 s
/// settle time before another), 429s and leader changes; a pod that does not end in 10 is
/// stuck.
const POD_WAIT: Duration = Duration::from_secs(600);
/// Kills and new faults come in storms of 20 s, each followed by a calm of 25 s in which the
/// controller can make progress.
const STORMS: Storms = Storms {
    storm: Duration::from_secs(20),
    calm: Duration::from_secs(25),
};

fn main() -> std::process::ExitCode {
    support::harness::main("e2e_chaos", &ExtraFlags::default(), |cp| Box::pin(run(cp)))
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let seed = env_or("CHAOS_SEED", fastrand::u64(..));
    let lifecycles = env_or("CHAOS_LIFECYCLES", LIFECYCLES);
    let concurrent = env_or("CHAOS_CONCURRENT", CONCURRENT);
    println!("e2e_chaos: seed {seed} (CHAOS_SEED={seed} replays the schedule)");
    let clouds: Vec<Cloud> = match std::env::var("CHAOS_CLOUDS").as_deref() {
        Ok("runpod") => vec![Cloud::RunPod],
        Ok("vastai") => vec![Cloud::VastAi],
        _ => vec![Cloud::RunPod, Cloud::VastAi],
    };
    let mut outcomes = Vec::new();
    for cloud in clouds {
        let soak = Soak {
            cloud,
            seed,
            lifecycles,
            concurrent,
        };
        outcomes.push((cloud, soak.run(control_plane).await));
    }
    println!(
        "\n| cloud | lifecycles | SIGKILLs | fault rules | instances | create answers lost | duplicates | leaks | pods stuck | worst GPU billing after deletion |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (cloud, outcome) in &outcomes {
        if let Ok(report) = outcome {
            println!("| {} | {report} |", cloud.name());
        }
    }
    for (cloud, outcome) in outcomes {
        let report = outcome.with_context(|| format!("the {} soak (seed {seed})", cloud.name()))?;
        report
            .verdict()
            .with_context(|| format!("the {} soak (seed {seed})", cloud.name()))?;
    }
    Ok(())
}

/// One cloud's soak.
struct Soak {
    cloud: Cloud,
    seed: u64,
    lifecycles: usize,
    concurrent: usize,
}

/// What the test did with a pod (or a Job's pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Exits 0 and must end Succeeded.
    Succeeds,
    /// Exits 3 and must end Failed with that code.
    Fails,
    /// A Job whose pod exits 0: the Job must complete.
    JobCompletes,
    /// A Job (no retries) whose pod exits 3: the Job must fail.
    JobFails,
    /// Deleted once Running, with this grace period.
    DeletedRunning(i64),
    /// Deleted soon after creation (often before or during its create), with this grace.
    DeletedEarly(i64),
}

impl Kind {
    fn pick(rng: &mut fastrand::Rng) -> Kind {
        let grace = if rng.bool() { 0 } else { 3 };
        match rng.u8(0..12) {
            0..=1 => Kind::Succeeds,
            2 => Kind::Fails,
            3..=4 => Kind::JobCompletes,
            5 => Kind::JobFails,
            6..=8 => Kind::DeletedRunning(grace),
            _ => Kind::DeletedEarly(grace),
        }
    }

    fn image(self) -> &'static str {
        match self {
            Kind::Succeeds | Kind::JobCompletes => EXITS_ZERO,
            Kind::Fails | Kind::JobFails => EXITS_THREE,
            Kind::DeletedRunning(_) | Kind::DeletedEarly(_) => SERVES,
        }
    }
}

/// One lifecycle as it went.
struct Lifecycle {
    name: String,
    kind: Kind,
    /// The pod's UID (a Job's pod once the Job created it).
    uid: Option<String>,
    /// When the test deleted the pod (seconds since the epoch) and the grace it gave.
    deleted: Option<(f64, i64)>,
}

/// A cloud's figures at the end of its soak.
struct Report {
    lifecycles: usize,
    kills: u32,
    faults: u32,
    instances: usize,
    ambiguous: usize,
    duplicates: Vec<String>,
    leaks: Vec<String>,
    stuck: Vec<String>,
    worst_billing: (f64, String),
    over: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} | {} | {} | {} | {} | {} | {} | {} | {:.1} s ({})",
            self.lifecycles,
            self.kills,
            self.faults,
            self.instances,
            self.ambiguous,
            self.duplicates.len(),
            self.leaks.len(),
            self.stuck.len(),
            self.worst_billing.0,
            self.worst_billing.1
        )
    }
}

impl Report {
    /// Every problem found, not only the first: a leak often comes with the pod it was for.
    fn verdict(&self) -> anyhow::Result<()> {
        let over = format!(
            "GPU billing went on longer than the grace period plus {BILLING_AFTER_GRACE} s after \
             these deletions"
        );
        let mut problems = Vec::new();
        for (what, found) in [
            ("pods with more than one instance", &self.duplicates),
            ("instances alive at the end", &self.leaks),
            (over.as_str(), &self.over),
            ("pods that did not end as they should", &self.stuck),
        ] {
            if !found.is_empty() {
                problems.push(format!("{what}:\n  {}", found.join("\n  ")));
            }
        }
        if self.kills < MIN_KILLS {
            problems.push(format!(
                "too few SIGKILLs ({}) to mean anything",
                self.kills
            ));
        }
        ensure!(problems.is_empty(), "{}", problems.join("\n"));
        Ok(())
    }
}

/// The two replicas (leader and standby) of the cloud's controller.
type Replicas = Arc<Mutex<Vec<ControllerProcess>>>;

impl Soak {
    async fn run(&self, control_plane: &ControlPlane) -> anyhow::Result<Report> {
        let client = control_plane.client().await?;
        namespace(&client, self.cloud.namespace(), false).await?;
        let simulator = Arc::new(SimulatorProcess::start_cloud(
            self.cloud.name(),
            &self.cloud.scenario(self.lifecycles),
        )?);
        let mut args = self.cloud.controller_args(CLUSTER, &simulator.url);
        args.extend(
            [
                "--leader-elect",
                "true",
                "--leader-elect-lease-duration",
                "6s",
                "--leader-elect-renew-deadline",
                "4s",
                "--leader-elect-retry-period",
                "1s",
            ]
            .iter()
            .map(|s| (*s).to_owned()),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut processes = Vec::new();
        for ip in ["127.0.0.2", "127.0.0.3"] {
            processes.push(ControllerProcess::start_via(
                &control_plane.kubeconfig,
                &control_plane.ca_file(),
                &simulator.url,
                ip,
                &args,
            )?);
        }
        let replicas: Replicas = Arc::new(Mutex::new(processes));
        let outcome = self.chaos(&client, &simulator, &replicas).await;
        // `CHAOS_LOG=DIR` keeps each replica's whole log there.
        if let Some(dir) = std::env::var_os("CHAOS_LOG") {
            for (index, replica) in replicas.lock().await.iter().enumerate() {
                let path =
                    std::path::Path::new(&dir).join(format!("{}-{index}.log", self.cloud.name()));
                std::fs::write(path, replica.log())?;
            }
        }
        if outcome
            .as_ref()
            .map_or(true, |report| report.verdict().is_err())
        {
            for (index, replica) in replicas.lock().await.iter().enumerate() {
                eprintln!(
                    "--- {} replica {index} log tail (seed {}) ---\n{}",
                    self.cloud.name(),
                    self.seed,
                    replica.log_tail(80)
                );
            }
        }
        outcome
    }

    async fn chaos(
        &self,
        client: &kube::Client,
        simulator: &Arc<SimulatorProcess>,
        replicas: &Replicas,
    ) -> anyhow::Result<Report> {
        node_ready_named(client, self.cloud.node()).await?;
        self.deleted_while_down(client, simulator, replicas)
            .await
            .context("a pod deleted with no grace while no replica ran")?;
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let kills = Arc::new(AtomicU32::new(0));
        let killer = tokio::spawn(killer(
            replicas.clone(),
            stop.clone(),
            kills.clone(),
            self.seed ^ 0x5eed,
        ));
        let injector = tokio::spawn(STORMS.inject(
            simulator.clone(),
            self.cloud.faults(),
            stop.clone(),
            self.seed ^ 0xfa17,
        ));
        let mut rng = fastrand::Rng::with_seed(self.seed);
        let mut tasks = tokio::task::JoinSet::new();
        let mut done = Vec::new();
        let mut stuck = Vec::new();
        let mut collect = |result: Result<anyhow::Result<Lifecycle>, _>| match result {
            Ok(Ok(lifecycle)) => done.push(lifecycle),
            Ok(Err(error)) => stuck.push(format!("{error:#}")),
            Err(error) => stuck.push(format!("a lifecycle task failed: {error}")),
        };
        for index in 0..self.lifecycles {
            while tasks.len() >= self.concurrent {
                if let Some(result) = tasks.join_next().await {
                    collect(result);
                }
            }
            // The last lifecycle starts after the MIN_KILLS-th SIGKILL, the others in step.
            let due = MIN_KILLS as usize * index / self.lifecycles.saturating_sub(1).max(1);
            while (kills.load(Ordering::SeqCst) as usize) < due {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let kind = Kind::pick(&mut rng);
            let wait = Duration::from_millis(rng.u64(0..4000));
            let pod = Drive {
                client: client.clone(),
                cloud: self.cloud,
                name: format!("c{index:04}"),
                kind,
                wait,
            };
            tasks.spawn(async move {
                let name = pod.name.clone();
                let cleanup = (pod.client.clone(), pod.cloud);
                let driven = tokio::time::timeout(POD_WAIT, pod.drive())
                    .await
                    .with_context(|| format!("{name} ({kind:?}) did not end in {POD_WAIT:?}"))
                    .and_then(|driven| driven);
                if driven.is_err() {
                    // Counted as stuck; removed so that its instance, if any, is not also
                    // counted as a leak at the end (the controller must still end it).
                    give_up(&cleanup.0, cleanup.1, &name, kind).await;
                }
                driven
            });
            tokio::time::sleep(Duration::from_millis(rng.u64(50..500))).await;
        }
        while let Some(result) = tasks.join_next().await {
            collect(result);
        }
        stop.store(true, Ordering::SeqCst);
        killer.await?;
        let faults = injector.await?;
        simulator.clear_faults().await?;
        for replica in replicas.lock().await.iter_mut() {
            if !replica.alive() {
                replica.restart()?;
            }
        }
        let kills = kills.load(Ordering::SeqCst);
        println!(
            "e2e_chaos {}: {} lifecycles driven in {:.0} s, {kills} SIGKILLs, {faults} fault rules",
            self.cloud.name(),
            self.lifecycles,
            started.elapsed().as_secs_f64()
        );
        let mut report = self.check(client, simulator, &done).await?;
        report.stuck.extend(stuck);
        report.kills = kills;
        report.faults = faults;
        Ok(report)
    }

    /// What the soak found first: a pod deleted with no grace period while no replica ran
    /// (or led) is gone before any replica sees it leave. Its instance must stop billing at
    /// the first list after the restart, asked of the cluster, not after the settle time (set
    /// to ten minutes here, so only the fresh look can end it in time).
    async fn deleted_while_down(
        &self,
        client: &kube::Client,
        simulator: &SimulatorProcess,
        replicas: &Replicas,
    ) -> anyhow::Result<()> {
        let pods: Api<Pod> = Api::namespaced(client.clone(), self.cloud.namespace());
        let drive = Drive {
            client: client.clone(),
            cloud: self.cloud,
            name: "down".to_owned(),
            kind: Kind::DeletedRunning(0),
            wait: Duration::ZERO,
        };
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "down", "labels": {"runpod.io/burst": "enabled"}},
            "spec": drive.pod_spec(),
        }))?;
        let uid = uid(&pods.create(&PostParams::default(), &pod).await?);
        wait::until("the pod Running", POD_WAIT, || async {
            let pod = pods.get("down").await?;
            Ok((phase(&pod) == Some("Running")).then_some(()))
        })
        .await?;
        for replica in replicas.lock().await.iter_mut() {
            replica.kill();
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        pods.delete("down", &params).await?;
        let deleted_at = clouds::now();
        for replica in replicas.lock().await.iter_mut() {
            replica.push_args(&["--create-settle", "10m"]);
            replica.restart()?;
        }
        let ended = wait::until("its instance's GPU billing ended", POD_WAIT, || async {
            let ledger = self.ledger(simulator).await?;
            let entry = ledger
                .iter()
                .find(|e| e.pod_uid.as_deref() == Some(uid.as_str()));
            Ok(entry.and_then(|e| e.billing_ended))
        })
        .await?;
        let billed = ended - deleted_at;
        println!(
            "e2e_chaos {}: a pod deleted while no replica ran billed {billed:.1} s after its deletion",
            self.cloud.name()
        );
        ensure!(
            billed <= BILLING_AFTER_GRACE,
            "its GPU billed {billed:.1} s after the deletion"
        );
        for replica in replicas.lock().await.iter_mut() {
            replica.push_args(&["--create-settle", "30s"]);
            replica.restart()?;
        }
        Ok(())
    }

    /// Once every pod has ended, reads the ledger.
    async fn check(
        &self,
        client: &kube::Client,
        simulator: &SimulatorProcess,
        done: &[Lifecycle],
    ) -> anyhow::Result<Report> {
        let pods: Api<Pod> = Api::namespaced(client.clone(), self.cloud.namespace());
        let mut stuck = Vec::new();
        for lifecycle in done {
            if let Err(error) = ended_as_it_should(&pods, lifecycle).await {
                stuck.push(format!(
                    "{} ({:?}): {error:#}",
                    lifecycle.name, lifecycle.kind
                ));
            }
        }
        let ours = |entry: &Entry| entry.cluster.as_deref() == Some(CLUSTER);
        // Every pod is finished or deleted: nothing of this cluster may bill any more.
        let all_ended = wait::until("no instance of this cluster alive", POD_WAIT, || async {
            let ledger = self.ledger(simulator).await?;
            Ok((!ledger.iter().any(|e| ours(e) && e.live)).then_some(()))
        })
        .await;
        let ledger: Vec<Entry> = self
            .ledger(simulator)
            .await?
            .into_iter()
            .filter(ours)
            .collect();
        let leaks: Vec<String> = match all_ended {
            Ok(()) => Vec::new(),
            Err(_) => ledger
                .iter()
                .filter(|e| e.live)
                .map(|e| format!("{} (pod {:?})", e.id, e.pod_uid))
                .collect(),
        };
        let mut per_uid: BTreeMap<&str, Vec<&Entry>> = BTreeMap::new();
        for entry in &ledger {
            if let Some(uid) = entry.pod_uid.as_deref() {
                per_uid.entry(uid).or_default().push(entry);
            }
        }
        let duplicates = per_uid
            .iter()
            .filter(|(_, entries)| entries.len() > 1)
            .map(|(uid, entries)| {
                let who = done
                    .iter()
                    .find(|l| l.uid.as_deref() == Some(*uid))
                    .map_or("?".to_owned(), |l| format!("{} ({:?})", l.name, l.kind));
                let ids: Vec<String> = entries
                    .iter()
                    .map(|e| format!("{} (create {})", e.id, e.create_status))
                    .collect();
                format!("{who}: {}", ids.join(", "))
            })
            .collect();
        let (worst_billing, over) = billing_after_deletion(done, &per_uid);
        let ambiguous = ledger
            .iter()
            .filter(|e| !matches!(e.create_status, 200 | 201))
            .count();
        Ok(Report {
            lifecycles: done.len() + stuck.len(),
            kills: 0,
            faults: 0,
            instances: ledger.len(),
            ambiguous,
            duplicates,
            leaks,
            stuck,
            worst_billing,
            over,
        })
    }

    async fn ledger(&self, simulator: &SimulatorProcess) -> anyhow::Result<Vec<Entry>> {
        Ok(simulator
            .ledger()
            .await?
            .iter()
            .map(|raw| clouds::entry(self.cloud, raw))
            .collect())
    }
}

/// Removes what a failed lifecycle left: its Job (with its pod) or its pod, at once.
async fn give_up(client: &kube::Client, cloud: Cloud, name: &str, kind: Kind) {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        propagation_policy: Some(kube::api::PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    let removed = match kind {
        Kind::JobCompletes | Kind::JobFails => {
            Api::<Job>::namespaced(client.clone(), cloud.namespace())
                .delete(name, &params)
                .await
                .map(|_| ())
        }
        _ => Api::<Pod>::namespaced(client.clone(), cloud.namespace())
            .delete(name, &params)
            .await
            .map(|_| ()),
    };
    if let Err(error) = removed {
        eprintln!("removing {name} after its lifecycle failed: {error}");
    }
}

/// Whether a lifecycle's pod ended as its kind says: a plain pod in its phase with its exit
/// code, a deleted pod removed.
async fn ended_as_it_should(pods: &Api<Pod>, lifecycle: &Lifecycle) -> anyhow::Result<()> {
    let name = &lifecycle.name;
    let expected = match lifecycle.kind {
        Kind::Succeeds => ("Succeeded", 0),
        Kind::Fails => ("Failed", 3),
        Kind::JobCompletes | Kind::JobFails => return Ok(()),
        Kind::DeletedRunning(_) | Kind::DeletedEarly(_) => {
            return wait::until(&format!("{name} removed"), POD_WAIT, || async {
                Ok(pods.get_opt(name).await?.is_none().then_some(()))
            })
            .await;
        }
    };
    let pod = pods.get(name).await?;
    ensure!(
        phase(&pod) == Some(expected.0) && exit_code(&pod) == Some(expected.1),
        "ended {:?} with code {:?} ({:?})",
        phase(&pod),
        exit_code(&pod),
        pod.status.as_ref().and_then(|s| s.message.clone())
    );
    Ok(())
}

/// The longest GPU billing after a deletion (seconds, and whose), and each deletion whose
/// billing went on past its grace period plus `BILLING_AFTER_GRACE`. An instance created after
/// the deletion bills from its creation.
fn billing_after_deletion(
    done: &[Lifecycle],
    per_uid: &BTreeMap<&str, Vec<&Entry>>,
) -> ((f64, String), Vec<String>) {
    let mut worst = (0.0_f64, "none".to_owned());
    let mut over = Vec::new();
    for lifecycle in done {
        let (Some((deleted_at, grace)), Some(uid)) = (lifecycle.deleted, lifecycle.uid.as_deref())
        else {
            continue;
        };
        for entry in per_uid.get(uid).into_iter().flatten() {
            let from = entry.created.max(deleted_at);
            let Some(ended) = entry.billing_ended else {
                over.push(format!(
                    "{}: {} never stopped billing",
                    lifecycle.name, entry.id
                ));
                continue;
            };
            let billed = (ended - from).max(0.0);
            if billed > worst.0 {
                worst = (billed, format!("{} {:?}", lifecycle.name, lifecycle.kind));
            }
            if billed > grace as f64 + BILLING_AFTER_GRACE {
                over.push(format!(
                    "{} ({:?}): {} billed {billed:.1} s after its deletion",
                    lifecycle.name, lifecycle.kind, entry.id
                ));
            }
        }
    }
    (worst, over)
}

/// One pod's (or Job's) life, as the test drives it.
struct Drive {
    client: kube::Client,
    cloud: Cloud,
    name: String,
    kind: Kind,
    /// How long a deleted pod lives first (after Running, or after its creation).
    wait: Duration,
}

impl Drive {
    /// The pod, bound to the cloud's node, opted in by its own label.
    fn pod_spec(&self) -> serde_json::Value {
        let restart = "Never";
        json!({
            "nodeName": self.cloud.node(),
            "restartPolicy": restart,
            "tolerations": [provider_toleration()],
            "containers": [{"name": "main", "image": self.kind.image(),
                "command": ["python", "run.py"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        })
    }

    async fn drive(self) -> anyhow::Result<Lifecycle> {
        match self.kind {
            Kind::JobCompletes | Kind::JobFails => self.job().await,
            _ => self.pod().await,
        }
    }

    async fn pod(self) -> anyhow::Result<Lifecycle> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.cloud.namespace());
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": self.name, "labels": {"runpod.io/burst": "enabled"}},
            "spec": self.pod_spec(),
        }))?;
        let created = pods.create(&PostParams::default(), &pod).await?;
        let uid = uid(&created);
        let name = &self.name;
        let mut deleted = None;
        match self.kind {
            Kind::Succeeds | Kind::Fails => {
                wait::until(&format!("{name} finished"), POD_WAIT, || async {
                    let pod = pods.get(name).await?;
                    Ok(matches!(phase(&pod), Some("Succeeded" | "Failed")).then_some(()))
                })
                .await?;
            }
            Kind::DeletedRunning(grace) | Kind::DeletedEarly(grace) => {
                if matches!(self.kind, Kind::DeletedRunning(_)) {
                    wait::until(&format!("{name} Running"), POD_WAIT, || async {
                        let pod = pods.get(name).await?;
                        Ok((phase(&pod) == Some("Running")).then_some(()))
                    })
                    .await?;
                }
                tokio::time::sleep(self.wait).await;
                let params = DeleteParams {
                    grace_period_seconds: Some(u32::try_from(grace).unwrap_or(0)),
                    ..DeleteParams::default()
                };
                deleted = Some((clouds::now(), grace));
                pods.delete(name, &params).await?;
            }
            Kind::JobCompletes | Kind::JobFails => unreachable!("Jobs are driven by job()"),
        }
        Ok(Lifecycle {
            name: self.name,
            kind: self.kind,
            uid: Some(uid),
            deleted,
        })
    }

    /// A Job of one pod (no retries) through the real Job controller; the Job must complete
    /// or fail as its image says.
    async fn job(self) -> anyhow::Result<Lifecycle> {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), self.cloud.namespace());
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.cloud.namespace());
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": self.name},
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"labels": {"runpod.io/burst": "enabled"}},
                "spec": self.pod_spec()}}
        }))?;
        jobs.create(&PostParams::default(), &job).await?;
        let name = &self.name;
        let (succeeded, failed) = wait::until(&format!("Job {name} ended"), POD_WAIT, || async {
            let job = jobs.get(name).await?;
            let status = job.status.unwrap_or_default();
            let (succeeded, failed) = (status.succeeded.unwrap_or(0), status.failed.unwrap_or(0));
            Ok((succeeded + failed > 0).then_some((succeeded, failed)))
        })
        .await?;
        let want_success = self.kind == Kind::JobCompletes;
        ensure!(
            (succeeded, failed) == if want_success { (1, 0) } else { (0, 1) },
            "Job {name} ({:?}) ended with {succeeded} succeeded and {failed} failed pods",
            self.kind
        );
        let listed = pods
            .list(&ListParams::default().labels(&format!("job-name={name}")))
            .await?;
        let uid = listed.items.first().map(uid);
        Ok(Lifecycle {
            name: self.name,
            kind: self.kind,
            uid,
            deleted: None,
        })
    }
}

/// SIGKILLs a replica (leader or standby, at random) at random moments of the storms, and
/// starts it again.
async fn killer(replicas: Replicas, stop: Arc<AtomicBool>, kills: Arc<AtomicU32>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let since = tokio::time::Instant::now();
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.u64(3000..10_000))).await;
        if stop.load(Ordering::SeqCst) || !STORMS.stormy(since) {
            continue;
        }
        let mut replicas = replicas.lock().await;
        let index = rng.usize(..replicas.len());
        replicas[index].kill();
        kills.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(rng.u64(0..1500))).await;
        if let Err(error) = replicas[index].restart() {
            eprintln!("restarting replica {index} failed: {error:#}");
        }
    }
}
