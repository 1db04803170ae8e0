//! `cargo bench --bench controller_scale`: many pods bound to the virtual node at once, against
//! the RunPod simulator with a per-minute quota, on the real control plane. It prints figures;
//! it never fails on timing, only when something does not work.
//!
//! Figures: time from binding to the create request (p50/p99), RunPod calls per minute (all,
//! and without creates), creates per minute against what the quota leaves, the share of the
//! quota used during the backlog, calls per minute in steady state, 429s, apiserver pod writes
//! per pod, the controller's peak RSS, and the mass deletion: every pod deleted at once (default
//! grace period), the time until GPU billing ended for all (each RunPod pod stopped or
//! terminated) and until all were terminated, against the targets (1.3 × and 2.6 × the
//! time the quota needs for one call per pod, plus 30 s and 90 s).
//!
//! Each run prints, per 30 s of the backlog and of the mass deletion, the mix of calls the
//! simulator answered (stops, DELETEs, creates, reads, 429s); a table of every run closes.
//!
//! Environment:
//! - `CONTROLLER_BENCH_PODS` (default 1000): pods bound to the node (`--max-pods` follows);
//! - `CONTROLLER_BENCH_QUOTAS` (default `120,60`): the simulator's requests per minute, one
//!   run each (`CONTROLLER_BENCH_QUOTA` picks one);
//! - `CONTROLLER_BENCH_MODELS` (`fixed`, `sliding`, `gcra`; default all three, one run each;
//!   `CONTROLLER_BENCH_MODEL` picks one) and `CONTROLLER_BENCH_RESET` (`next`, `full`; default
//!   `next`): how the simulator counts the quota and what its `t` means;
//! - `CONTROLLER_BENCH_CONCURRENCY` (default 100, the workers a default `--max-pods` gives):
//!   pods reconciled at once, fewer than the pods, as on a node whose capacity was raised;
//! - `CONTROLLER_BENCH_STEADY_SECS` (default 60): how long steady state is measured once every
//!   pod has its RunPod pod;
//! - `CONTROLLER_BENCH_MINUTES` (default 25): stop measuring after this long even if not every
//!   pod has its RunPod pod (the figures say how many did);
//! - `CONTROLLER_BENCH_BIN`: the `runpod-kubelet` binary to measure (default: the one cargo
//!   built with this bench), e.g. a release build for the RSS figure;
//! - `CONTROLLER_BENCH_LOG`: keep the controller's log in this file, at
//!   `CONTROLLER_BENCH_LOG_LEVEL` (default `warn`; `debug` says why each pod write was made).
//!
//! At 60 requests per minute, 1000 creates take at least 17 minutes: that is the quota, not the
//! controller. `CONTROLLER_BENCH_PODS=200` gives the same per-minute figures in 4 minutes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, ensure};
use futures_util::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::control_plane::ControlPlane;
use support::controller::{API_KEY, SimulatorProcess};

const NODE: &str = "virtual-runpod";
const NAMESPACE: &str = "bench";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; a filter that names another bench skips this one.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filters.is_empty()
        && !filters
            .iter()
            .any(|f| "controller_scale".contains(f.as_str()))
    {
        return ExitCode::SUCCESS;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    match runtime.block_on(bench()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("controller_scale failed: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// A comma-separated list from `plural`, else the single value of `single`, else `default`.
fn list_env(plural: &str, single: &str, default: &str) -> Vec<String> {
    std::env::var(single)
        .or_else(|_| std::env::var(plural))
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|item| item.trim().to_owned())
        .filter(|item| !item.is_empty())
        .collect()
}

/// One run's figures, for the closing table.
#[derive(Debug, Clone)]
struct Figures {
    label: String,
    backlog_use: f64,
    /// The mean share of the quota the trailing minute held during the backlog.
    trailing_use: f64,
    rss_mib: f64,
    /// RSS after the steady minute, every pod running.
    running_mib: f64,
    /// The peak of the whole run, deletions included.
    peak_mib: f64,
    billing_ended: Option<f64>,
    billing_target: f64,
    terminated: Option<f64>,
    terminated_target: f64,
    refused: usize,
}

async fn bench() -> anyhow::Result<()> {
    let pods_wanted: usize = env_or("CONTROLLER_BENCH_PODS", 1000);
    let minutes: u64 = env_or("CONTROLLER_BENCH_MINUTES", 25);
    let reset = std::env::var("CONTROLLER_BENCH_RESET").unwrap_or_else(|_| "next".into());
    let quotas: Vec<u32> = list_env(
        "CONTROLLER_BENCH_QUOTAS",
        "CONTROLLER_BENCH_QUOTA",
        "120,60",
    )
    .iter()
    .map(|quota| quota.parse().context("CONTROLLER_BENCH_QUOTAS"))
    .collect::<anyhow::Result<_>>()?;
    let models = list_env(
        "CONTROLLER_BENCH_MODELS",
        "CONTROLLER_BENCH_MODEL",
        "fixed,sliding,gcra",
    );
    let mut all = Vec::new();
    for &quota in &quotas {
        for model in &models {
            all.push(one_run(pods_wanted, quota, model, &reset, minutes).await?);
        }
    }
    println!("\n== controller_scale: {pods_wanted} pods, every run");
    println!(
        "{:<28} {:>12} {:>15} {:>22} {:>22} {:>6} {:>13} {:>13} {:>13}",
        "run",
        "backlog use",
        "trailing min",
        "GPU billing ended",
        "all terminated",
        "429s",
        "peak, created",
        "RSS, running",
        "peak, all"
    );
    let show = |secs: Option<f64>, target: f64| {
        secs.map_or_else(
            || format!("never (<= {target:.0}s)"),
            |s| format!("{s:.0}s (<= {target:.0}s)"),
        )
    };
    for figures in &all {
        println!(
            "{:<28} {:>11.1}% {:>14.1}% {:>22} {:>22} {:>6} {:>9.1} MiB {:>9.1} MiB {:>9.1} MiB",
            figures.label,
            figures.backlog_use,
            figures.trailing_use,
            show(figures.billing_ended, figures.billing_target),
            show(figures.terminated, figures.terminated_target),
            figures.refused,
            figures.rss_mib,
            figures.running_mib,
            figures.peak_mib
        );
    }
    Ok(())
}

async fn one_run(
    pods_wanted: usize,
    quota: u32,
    model: &str,
    reset: &str,
    minutes: u64,
) -> anyhow::Result<Figures> {
    println!(
        "controller_scale: {pods_wanted} pods, quota {quota}/min ({model} window, t = {reset}), at most {minutes} min"
    );

    let control_plane = ControlPlane::start()?;
    let client = control_plane.client().await?;
    let simulator = SimulatorProcess::start(&json!({
        "provisioning_ms": 1000, "starting_ms": 1000, "ports_ms": 1000,
        "rate_limits": [{"name": "minute", "quota": quota, "window_secs": 60,
            "model": model, "reset": reset}],
        "images": [{"match": "bench", "logs": ["ready"]}]
    }))?;
    let metrics_port = support::webhook::free_port()?.port();
    let kubelet_port = support::webhook::free_port()?.port();
    let temporary_log = tempfile::NamedTempFile::new()?.into_temp_path();
    let log = std::env::var_os("CONTROLLER_BENCH_LOG")
        .map_or_else(|| temporary_log.to_path_buf(), std::path::PathBuf::from);
    let log_level = std::env::var("CONTROLLER_BENCH_LOG_LEVEL").unwrap_or_else(|_| "warn".into());
    let binary = std::env::var("CONTROLLER_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_runpod-kubelet").to_owned());
    println!("controller binary: {binary}");
    let mut controller = Command::new(&binary)
        .arg("controller")
        .args(["--nodename", NODE, "--runpod-api-url", &simulator.url])
        .args(["--kubelet-port", &kubelet_port.to_string()])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
        .args(["--max-pods", &pods_wanted.to_string()])
        .args(["--max-gpus", &pods_wanted.to_string()])
        .args([
            "--concurrency",
            &env_or("CONTROLLER_BENCH_CONCURRENCY", 100u16).to_string(),
        ])
        .args(["--max-gpu-price", "2", "--reconcile-interval", "10s"])
        // At 60 creates a minute, 1000 pods outlast the default 15 minutes.
        .args(["--provision-timeout", "2h"])
        .env("KUBECONFIG", &control_plane.kubeconfig)
        .env("RUNPOD_API_KEY", API_KEY)
        .env("RUNPOD_KUBELET_LOG_LEVEL", &log_level)
        // As the chart runs the controller (tests/chart.rs holds the chart to it).
        .env("MIMALLOC_PURGE_DELAY", "0")
        .env("MIMALLOC_ARENA_EAGER_COMMIT", "0")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting the controller")?;
    let result = measure(
        &client,
        &simulator,
        metrics_port,
        controller.id(),
        pods_wanted,
        quota,
        minutes,
    )
    .await
    .map(|mut figures| {
        figures.label = format!("{quota}/min {model} (t = {reset})");
        figures
    });
    let _ = controller.kill();
    let _ = controller.wait();
    if result.is_err() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!(
            "--- controller log tail ---\n{}",
            lines[lines.len().saturating_sub(30)..].join("\n")
        );
    }
    result
}

async fn measure(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    metrics_port: u16,
    controller_pid: u32,
    pods_wanted: usize,
    quota: u32,
    minutes: u64,
) -> anyhow::Result<Figures> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    support::wait::until("virtual node", Duration::from_secs(120), || async {
        Ok(nodes.get_opt(NODE).await?.map(|_| ()))
    })
    .await?;
    support::pods::namespace(client, NAMESPACE, false).await?;

    // Bind every pod at once (nodeName set: the scheduler's binding, without its pace).
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let bound_started = Instant::now();
    let bound_started_at = SystemTime::now();
    let bound: Vec<(String, SystemTime)> = futures_util::stream::iter(0..pods_wanted)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("bench-{i:04}"),
                        "labels": {"runpod.io/burst": "enabled"}},
                    "spec": {"nodeName": NODE, "restartPolicy": "Always",
                        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                        "containers": [{"name": "main", "image": "bench/server:1",
                            "command": ["serve"],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
                }))?;
                let created = pods.create(&PostParams::default(), &pod).await?;
                anyhow::Ok((created.metadata.uid.unwrap_or_default(), SystemTime::now()))
            }
        })
        .buffer_unordered(16)
        .try_collect()
        .await?;
    println!(
        "bound {} pods in {:.1}s",
        bound.len(),
        bound_started.elapsed().as_secs_f64()
    );
    let bound_at: HashMap<String, SystemTime> = bound.into_iter().collect();

    // Wait until every pod has its RunPod pod, or the time is up.
    let deadline = Instant::now() + Duration::from_secs(minutes * 60);
    let started = Instant::now();
    let mut created_at: HashMap<String, SystemTime> = HashMap::new();
    while created_at.len() < pods_wanted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(5)).await;
        for entry in simulator.ledger().await? {
            let uid = entry["env"]["RUNPOD_KUBELET_POD_UID"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if !bound_at.contains_key(&uid) || created_at.contains_key(&uid) {
                continue;
            }
            let at: k8s_openapi::jiff::Timestamp = entry["created_at"]
                .as_str()
                .context("created_at")?
                .parse()?;
            created_at.insert(uid, SystemTime::from(at));
        }
        print!(
            "\r{} of {pods_wanted} created after {:.0}s   ",
            created_at.len(),
            started.elapsed().as_secs_f64()
        );
        use std::io::Write as _;
        std::io::stdout().flush()?;
    }
    println!();
    let elapsed_minutes = started.elapsed().as_secs_f64() / 60.0;

    let mut latencies: Vec<f64> = created_at
        .iter()
        .filter_map(|(uid, created)| {
            created
                .duration_since(*bound_at.get(uid)?)
                .ok()
                .map(|d| d.as_secs_f64())
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };

    let exchanges = exchanges_of(simulator).await?;
    let backlog_started_ms = unix_ms(bound_started_at);
    println!("backlog, calls per 30 s after binding:");
    print_mix(&exchanges, backlog_started_ms, u64::MAX);
    let refused = exchanges.iter().filter(|e| e["status"] == 429).count();
    let creates = exchanges
        .iter()
        .filter(|e| e["operation"] == "createPod" && e["status"] != 429)
        .count();
    let calls = exchanges.len();
    let minutes_total = elapsed_minutes.max(1.0 / 60.0);
    let other_per_minute = (calls - creates) as f64 / minutes_total;
    let creates_per_minute = creates as f64 / minutes_total;
    let left_for_creates = (f64::from(quota) - other_per_minute).max(1.0);

    let metrics = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await?
        .text()
        .await?;
    let pod_writes = metric(&metrics, "runpod_kubelet_pod_writes_total").unwrap_or(f64::NAN);
    let status = std::fs::read_to_string(format!("/proc/{controller_pid}/status"))?;
    let kib = |field: &str| kib_of(&status, field);
    let rss_kib = kib("VmHWM:");

    println!("\n== controller_scale: {pods_wanted} pods, quota {quota}/min");
    println!(
        "created          {} of {pods_wanted} in {:.1} min",
        created_at.len(),
        elapsed_minutes
    );
    println!(
        "bind -> create   p50 {:.1}s  p99 {:.1}s",
        percentile(0.5),
        percentile(0.99)
    );
    println!(
        "RunPod calls     {:.1}/min in all, {:.1}/min besides creates (lists, catalogue)",
        calls as f64 / minutes_total,
        other_per_minute
    );
    println!(
        "creates          {:.1}/min = {:.0}% of the {:.1}/min the quota leaves (target >= 95%)",
        creates_per_minute,
        100.0 * creates_per_minute / left_for_creates,
        left_for_creates
    );
    println!(
        "                 (creates take {:.0}% of the whole quota)",
        100.0 * creates_per_minute / f64::from(quota)
    );
    println!("429s             {refused} (target 0)");
    println!(
        "pod writes       {:.1} per pod ({pod_writes} in all)",
        pod_writes / pods_wanted as f64
    );
    println!(
        "controller RSS   {:.1} MiB peak (target < 64); now {:.1} MiB: heap {:.1}, code and files {:.1}",
        rss_kib / 1024.0,
        kib("VmRSS:") / 1024.0,
        kib("RssAnon:") / 1024.0,
        kib("RssFile:") / 1024.0
    );
    let answered = calls - refused;
    println!(
        "quota use        {:.0}% of the quota during the backlog ({answered} calls answered in {:.1} min; target >= 95%)",
        100.0 * answered as f64 / (f64::from(quota) * minutes_total),
        elapsed_minutes
    );
    let last_create_ms = exchanges
        .iter()
        .filter(|e| e["operation"] == "createPod" && e["status"] != 429)
        .filter_map(|e| e["at_ms"].as_u64())
        .max()
        .unwrap_or(backlog_started_ms);
    let trailing_use = trailing_minute_use(&exchanges, backlog_started_ms, last_create_ms, quota);
    println!(
        "trailing minute  {trailing_use:.1}% of the quota on average, each second of the backlog after its first minute (target >= 95%)"
    );
    ensure!(!created_at.is_empty(), "no pod got a RunPod pod");

    let steady_secs: u64 = env_or("CONTROLLER_BENCH_STEADY_SECS", 60);
    let before = exchanges_of(simulator).await?.len();
    tokio::time::sleep(Duration::from_secs(steady_secs)).await;
    let after = exchanges_of(simulator).await?.len();
    println!(
        "steady state     {:.1} RunPod calls/min with {} pods running",
        (after - before) as f64 * 60.0 / steady_secs as f64,
        created_at.len()
    );
    let status = std::fs::read_to_string(format!("/proc/{controller_pid}/status"))?;
    let running_kib = kib_of(&status, "VmRSS:");
    println!(
        "controller RSS   {:.1} MiB with {} pods running: heap {:.1}, code and files {:.1} (target < 64)",
        running_kib / 1024.0,
        created_at.len(),
        kib_of(&status, "RssAnon:") / 1024.0,
        kib_of(&status, "RssFile:") / 1024.0
    );

    let backlog_use = 100.0 * answered as f64 / (f64::from(quota) * minutes_total);
    let (billing_ended, billing_target, terminated, terminated_target, refused_after) =
        mass_deletion(client, simulator, &bound_at, quota).await?;
    let status = std::fs::read_to_string(format!("/proc/{controller_pid}/status"))?;
    let peak_kib = kib_of(&status, "VmHWM:");
    println!(
        "controller RSS   {:.1} MiB peak over the whole run, deletions included",
        peak_kib / 1024.0
    );
    Ok(Figures {
        label: String::new(),
        backlog_use,
        trailing_use,
        rss_mib: rss_kib / 1024.0,
        running_mib: running_kib / 1024.0,
        peak_mib: peak_kib / 1024.0,
        billing_ended,
        billing_target,
        terminated,
        terminated_target,
        refused: refused + refused_after,
    })
}

/// A `/proc/PID/status` field in KiB (`NaN` when absent).
fn kib_of(status: &str, field: &str) -> f64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}

/// The mean share of `quota` that the answered calls of the trailing 60 s held, sampled each
/// second from one minute after `from_ms` until `until_ms` (simulator time): what a strict
/// server counting each call for a minute sees. `NaN` for a backlog shorter than that.
fn trailing_minute_use(
    exchanges: &[serde_json::Value],
    from_ms: u64,
    until_ms: u64,
    quota: u32,
) -> f64 {
    let mut times: Vec<u64> = exchanges
        .iter()
        .filter(|e| e["status"] != 429)
        .filter_map(|e| e["at_ms"].as_u64())
        .collect();
    times.sort_unstable();
    let mut shares = Vec::new();
    let mut at = from_ms + 60_000;
    while at <= until_ms {
        let first = times.partition_point(|t| *t + 60_000 <= at);
        let last = times.partition_point(|t| *t <= at);
        shares.push((last - first) as f64 / f64::from(quota));
        at += 1000;
    }
    if shares.is_empty() {
        return f64::NAN;
    }
    100.0 * shares.iter().sum::<f64>() / shares.len() as f64
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The kind of call an exchange was, for the call mix.
fn kind(exchange: &serde_json::Value) -> &'static str {
    if exchange["status"] == 429 {
        return "429";
    }
    match exchange["operation"].as_str().unwrap_or_default() {
        "createPod" => "create",
        "deletePod" => "DELETE",
        // The only action the controller sends is `stop` (terminations are DELETEs).
        "podAction" => "stop",
        _ => "read",
    }
}

/// Calls per 30 s from `from_ms` (simulator time) until `until_ms`: stops, DELETEs, creates,
/// reads and 429s.
fn print_mix(exchanges: &[serde_json::Value], from_ms: u64, until_ms: u64) {
    let mut buckets: std::collections::BTreeMap<u64, [usize; 5]> = Default::default();
    for exchange in exchanges {
        let at = exchange["at_ms"].as_u64().unwrap_or(0);
        if at < from_ms || at >= until_ms {
            continue;
        }
        let column = match kind(exchange) {
            "stop" => 0,
            "DELETE" => 1,
            "create" => 2,
            "read" => 3,
            _ => 4,
        };
        buckets.entry((at - from_ms) / 30_000).or_default()[column] += 1;
    }
    println!(
        "  {:>9} {:>6} {:>7} {:>7} {:>6} {:>5}",
        "seconds", "stops", "DELETEs", "creates", "reads", "429s"
    );
    for (bucket, [stops, deletes, creates, reads, refused]) in buckets {
        println!(
            "  {:>4}-{:<4} {stops:>6} {deletes:>7} {creates:>7} {reads:>6} {refused:>5}",
            bucket * 30,
            bucket * 30 + 30
        );
    }
}

async fn exchanges_of(simulator: &SimulatorProcess) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(reqwest::get(format!("{}/_sim/exchanges", simulator.url))
        .await?
        .json()
        .await?)
}

/// When GPU billing ended and when the RunPod pod was terminated.
type End = (Option<SystemTime>, Option<SystemTime>);

/// Each Kubernetes pod UID's [`End`].
type Ends = HashMap<String, End>;

async fn ends_of(
    simulator: &SimulatorProcess,
    uids: &HashMap<String, SystemTime>,
) -> anyhow::Result<Ends> {
    let time = |value: &serde_json::Value| -> Option<SystemTime> {
        let at: k8s_openapi::jiff::Timestamp = value.as_str()?.parse().ok()?;
        Some(SystemTime::from(at))
    };
    Ok(simulator
        .ledger()
        .await?
        .iter()
        .filter_map(|entry| {
            let uid = entry["env"]["RUNPOD_KUBELET_POD_UID"].as_str()?;
            uids.contains_key(uid).then(|| {
                (
                    uid.to_owned(),
                    (time(&entry["stopped_at"]), time(&entry["terminated_at"])),
                )
            })
        })
        .collect())
}

/// Deletes every pod at once (default grace period, as `kubectl delete` does) and follows the
/// RunPod pods until all are terminated.
async fn mass_deletion(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    uids: &HashMap<String, SystemTime>,
    quota: u32,
) -> anyhow::Result<(Option<f64>, f64, Option<f64>, f64, usize)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let count = ends_of(simulator, uids).await?.len();
    // The quota's time for one call per RunPod pod.
    let quota_secs = count as f64 * 60.0 / f64::from(quota);
    let billing_target = 1.3 * quota_secs + 30.0;
    let terminated_target = 2.6 * quota_secs + 90.0;
    let deleted_at = SystemTime::now();
    pods.delete_collection(
        &kube::api::DeleteParams::default(),
        &kube::api::ListParams::default(),
    )
    .await?;
    let give_up = Instant::now() + Duration::from_secs_f64(2.0 * terminated_target + 120.0);
    let ends = loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let ends = ends_of(simulator, uids).await?;
        let terminated = ends.values().filter(|(_, end)| end.is_some()).count();
        let stopped = ends.values().filter(|(stop, _)| stop.is_some()).count();
        print!(
            "\rdeletion: {stopped} of {count} no longer billing GPU, {terminated} terminated after {:.0}s   ",
            deleted_at.elapsed().unwrap_or_default().as_secs_f64()
        );
        use std::io::Write as _;
        std::io::stdout().flush()?;
        if terminated == count || Instant::now() >= give_up {
            break ends;
        }
    };
    println!();
    let after = |at: &Option<SystemTime>| {
        at.and_then(|at| at.duration_since(deleted_at).ok())
            .map(|d| d.as_secs_f64())
    };
    let latest = |pick: fn(&End) -> &Option<SystemTime>| {
        ends.values()
            .map(|end| after(pick(end)))
            .try_fold(0.0f64, |latest, at| Some(latest.max(at?)))
    };
    let left = ends.values().filter(|(_, end)| end.is_none()).count();
    let show = |secs: Option<f64>| secs.map_or_else(|| "never".to_owned(), |s| format!("{s:.0}s"));
    println!(
        "mass deletion    GPU billing ended for all {count} after {} (target <= {billing_target:.0}s)",
        show(latest(|end| &end.0))
    );
    println!(
        "                 all terminated after {} (target <= {terminated_target:.0}s), {left} left",
        show(latest(|end| &end.1))
    );
    let exchanges = exchanges_of(simulator).await?;
    println!("mass deletion, calls per 30 s after the deletion:");
    print_mix(&exchanges, unix_ms(deleted_at), u64::MAX);
    let refused_after = exchanges
        .iter()
        .filter(|e| e["status"] == 429 && e["at_ms"].as_u64().unwrap_or(0) >= unix_ms(deleted_at))
        .count();
    println!(
        "429s overall     {}",
        exchanges.iter().filter(|e| e["status"] == 429).count()
    );
    ensure!(left == 0, "{left} RunPod pods left after the mass deletion");
    Ok((
        latest(|end| &end.0),
        billing_target,
        latest(|end| &end.1),
        terminated_target,
        refused_after,
    ))
}

/// The value of an unlabelled metric in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
}
