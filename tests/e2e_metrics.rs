//! Burst pods you can watch, on the real control plane: two burst pods run on the simulator,
//! each reporting the utilization its env fixes (`SIM_*_UTIL`).
//!
//! Checked: through the apiserver's node proxy (what `kubectl get --raw` and metrics-server
//! use), `/stats/summary` and `/metrics/resource` show each pod's usage as the reported share of
//! its request (else its limit, else one core), and the CPU seconds grow at that rate; a caller
//! without RBAC (a client certificate, or a ServiceAccount token as metrics-server sends) gets
//! 403 naming `nodes/stats` or `nodes/metrics`, one granted exactly those gets 200 there and 403
//! for logs, a forged token 401; the controller's `/metrics` shows each pod's GPU utilization,
//! GPU memory utilization and cost; the idle pod gets exactly one `GpuIdle` Event and the busy
//! one none; every metric an alert or the dashboard uses is exported by the running webhook and
//! controller; once the pods are deleted, their series and stats are gone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeSet, HashMap};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::kubelet_client::{Identity, kubelet_get, kubelet_get_as};
use support::pods::{NODE, WAIT, bound_gpu_pod, events, gone, namespace, node_ready, running};
use support::wait;
use support::webhook::WebhookProcess;

const NS: &str = "watched";
/// The idle window of this test's controller: every GPU below 5% for this long.
const IDLE_AFTER: &str = "10s";
/// Lists to wait after the idle Event: several idle windows, so a second Event would show.
const LISTS_AFTER_IDLE: usize = 40;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_metrics burst_pods_report_usage_gpu_figures_and_idle_gpus",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let simulator = SimulatorProcess::start(&json!({
        "provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 200
    }))?;
    let webhook = WebhookProcess::start(&control_plane.kubeconfig, &[]).await?;
    let metrics = support::webhook::free_port()?.to_string();
    let controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &[
            "--cluster-id",
            "e2e-metrics",
            "--metrics-listen",
            &metrics,
            "--idle-gpu-after",
            IDLE_AFTER,
            "--idle-gpu-threshold",
            "5",
            // Every namespace has a (roomy) budget, so its spend and budget series exist.
            "--default-budget-per-hour",
            "100",
        ],
    )?;
    let outcome = scenario(
        &client,
        control_plane,
        &simulator,
        &controller,
        &webhook,
        &metrics,
    )
    .await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(80));
    }
    outcome
}

/// A one-GPU burst pod whose RunPod pod reports the figures in `env`.
fn reporting_pod(name: &str, resources: Value, env: &[(&str, &str)]) -> anyhow::Result<Pod> {
    let mut pod = bound_gpu_pod(name, "e2e/server:1", "Always");
    let container = pod
        .spec
        .as_mut()
        .and_then(|s| s.containers.first_mut())
        .context("no container")?;
    let mut resources: k8s_openapi::api::core::v1::ResourceRequirements =
        serde_json::from_value(resources)?;
    let limits = resources.limits.get_or_insert_with(Default::default);
    limits.insert(
        "nvidia.com/gpu".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
    );
    container.resources = Some(resources);
    container.env = Some(
        env.iter()
            .map(|(name, value)| k8s_openapi::api::core::v1::EnvVar {
                name: (*name).into(),
                value: Some((*value).into()),
                ..Default::default()
            })
            .collect(),
    );
    Ok(pod)
}

async fn scenario(
    client: &kube::Client,
    control_plane: &ControlPlane,
    simulator: &SimulatorProcess,
    controller: &ControllerProcess,
    webhook: &WebhookProcess,
    metrics: &str,
) -> anyhow::Result<()> {
    node_ready(client).await?;
    namespace(client, NS, true).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // busy: 40% of 2 requested cores = 0.8 cores; 25% of 4Gi requested = 1Gi; GPUs 80%/60%.
    let busy = reporting_pod(
        "busy",
        json!({"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}),
        &[
            ("SIM_CPU_UTIL", "40"),
            ("SIM_MEM_UTIL", "25"),
            ("SIM_GPU_UTIL", "80"),
            ("SIM_GPU_MEM_UTIL", "60"),
        ],
    )?;
    // idle: no CPU request or limit, so 10% of one core; 50% of the 2Gi limit; GPUs 1%/3%.
    let idle = reporting_pod(
        "idle",
        json!({"limits": {"memory": "2Gi"}}),
        &[
            ("SIM_CPU_UTIL", "10"),
            ("SIM_MEM_UTIL", "50"),
            ("SIM_GPU_UTIL", "1"),
            ("SIM_GPU_MEM_UTIL", "3"),
        ],
    )?;
    pods.create(&PostParams::default(), &busy).await?;
    pods.create(&PostParams::default(), &idle).await?;
    let busy = running(&pods, "busy").await?;
    let idle = running(&pods, "idle").await?;

    // 1. The Summary API through the apiserver, as `kubectl get --raw` asks for it.
    let summary_path = format!("/api/v1/nodes/{NODE}/proxy/stats/summary");
    let summary = wait::until("both pods in /stats/summary", WAIT, || async {
        let summary: Value = serde_json::from_str(&get_raw(client, &summary_path).await?)?;
        let ours = pods_in(&summary);
        Ok((ours.len() == 2).then_some(summary))
    })
    .await?;
    ensure!(summary["node"]["nodeName"] == NODE, "{summary}");
    let ours = pods_in(&summary);
    for (pod, cores, bytes) in [(&busy, 0.8, GIB), (&idle, 0.1, GIB)] {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let stats = ours[name];
        ensure!(
            stats["podRef"]["uid"] == pod.metadata.uid.clone().unwrap_or_default(),
            "{stats}"
        );
        ensure!(stats["startTime"].is_string(), "{stats}");
        let container = &stats["containers"][0];
        ensure!(container["name"] == "main", "{stats}");
        let nano_cores = container["cpu"]["usageNanoCores"].as_f64().unwrap_or(-1.0);
        ensure!(
            (nano_cores - cores * 1e9).abs() < 1.0,
            "{name}: {nano_cores} nanocores, expected {cores} cores: {stats}"
        );
        let working_set = container["memory"]["workingSetBytes"]
            .as_f64()
            .unwrap_or(-1.0);
        ensure!(
            (working_set - bytes).abs() < 1.0,
            "{name}: working set {working_set}, expected {bytes}: {stats}"
        );
    }

    // 2. /metrics/resource: the series metrics-server reads; CPU seconds grow at the rate.
    let resource_path = format!("/api/v1/nodes/{NODE}/proxy/metrics/resource");
    let series =
        "container_cpu_usage_seconds_total{container=\"main\",namespace=\"watched\",pod=\"busy\"}";
    let first = get_raw(client, &resource_path).await?;
    let (cpu_1, at_1) = sample(&first, series).with_context(|| format!("{series} in {first}"))?;
    for expected in [
        "container_memory_working_set_bytes{container=\"main\",namespace=\"watched\",pod=\"busy\"} 1073741824 ",
        "pod_memory_working_set_bytes{namespace=\"watched\",pod=\"idle\"} 1073741824 ",
        "container_start_time_seconds{container=\"main\",namespace=\"watched\",pod=\"busy\"} ",
        "pod_cpu_usage_seconds_total{namespace=\"watched\",pod=\"busy\"} ",
        "node_cpu_usage_seconds_total ",
        "node_memory_working_set_bytes ",
    ] {
        ensure!(
            first.lines().any(|l| l.starts_with(expected)),
            "{expected:?} missing:\n{first}"
        );
    }
    let (cpu_2, at_2) = wait::until("CPU seconds sampled 5 s later", WAIT, || async {
        let text = get_raw(client, &resource_path).await?;
        let (cpu, at) = sample(&text, series).context("busy's CPU series")?;
        Ok((at >= at_1 + 5000.0).then_some((cpu, at)))
    })
    .await?;
    let rate = (cpu_2 - cpu_1) / ((at_2 - at_1) / 1000.0);
    ensure!(
        (rate - 0.8).abs() < 0.01,
        "CPU seconds grew {cpu_1} -> {cpu_2} over {} ms: {rate} cores, expected 0.8",
        at_2 - at_1
    );

    // 3. Direct callers: SubjectAccessReviews for nodes/stats and nodes/metrics.
    check_authorization(client, control_plane, controller).await?;

    // 4. The controller's /metrics: GPU figures and cost per pod.
    for (pod, gpu, gpu_memory) in [("busy", 0.8, 0.6), ("idle", 0.01, 0.03)] {
        let labels = format!("{{namespace=\"{NS}\",pod=\"{pod}\",provider=\"runpod\"}}");
        for (family, expected) in [
            ("runpod_kubelet_pod_gpu_utilization_ratio", gpu),
            (
                "runpod_kubelet_pod_gpu_memory_utilization_ratio",
                gpu_memory,
            ),
        ] {
            let series = format!("{family}{labels}");
            let value = wait::until(&series, WAIT, || async {
                support::controller::metric(metrics, &series).await
            })
            .await?;
            ensure!(
                (value - expected).abs() < 1e-9,
                "{series} = {value}, expected {expected}"
            );
        }
        let cost = format!("runpod_kubelet_pod_cost_per_hour_usd{labels}");
        let value = support::controller::metric(metrics, &cost).await?;
        ensure!(value.is_some_and(|v| v > 0.0), "{cost} = {value:?}");
    }

    // 5. Idle GPUs: one GpuIdle Event for the idle pod, none for the busy one.
    let message = support::pods::event(client, NS, "idle", "GpuIdle").await?;
    ensure!(
        message.contains("below 5%") && message.contains("USD/h"),
        "{message}"
    );
    let lists = simulator.successful_lists().await?;
    wait::until("more lists after the idle Event", WAIT, || async {
        Ok((simulator.successful_lists().await? >= lists + LISTS_AFTER_IDLE).then_some(()))
    })
    .await?;
    ensure!(
        gpu_idle_events(client, "idle").await? == 1,
        "the idle pod got more than one GpuIdle Event: {:?}",
        events(client, NS, "idle").await?
    );
    ensure!(
        gpu_idle_events(client, "busy").await? == 0,
        "the busy pod got a GpuIdle Event: {:?}",
        events(client, NS, "busy").await?
    );
    let idle_pods = support::controller::metric(metrics, "runpod_kubelet_idle_gpu_pods").await?;
    ensure!(idle_pods == Some(1.0), "idle pods gauge: {idle_pods:?}");

    // 6. Every metric an alert or the dashboard uses is exported by the running binaries.
    every_monitored_metric_is_exported(metrics, webhook).await?;

    // 7. The pods end: their series and stats disappear.
    for name in ["busy", "idle"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    for name in ["busy", "idle"] {
        gone(&pods, name).await?;
    }
    wait::until("no series left for the deleted pods", WAIT, || async {
        Ok((pod_series(metrics).await? == 0).then_some(()))
    })
    .await?;
    wait::until("no stats left for the deleted pods", WAIT, || async {
        let summary: Value = serde_json::from_str(&get_raw(client, &summary_path).await?)?;
        let text = get_raw(client, &resource_path).await?;
        Ok((pods_in(&summary).is_empty() && !text.contains("namespace=\"watched\"")).then_some(()))
    })
    .await?;
    Ok(())
}

/// A GET through the apiserver (`kubectl get --raw PATH`).
async fn get_raw(client: &kube::Client, path: &str) -> anyhow::Result<String> {
    let request = http::Request::get(path).body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

/// This test's pods in a summary, by name.
fn pods_in(summary: &Value) -> HashMap<&str, &Value> {
    summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["podRef"]["namespace"] == NS)
        .filter(|p| p["containers"][0]["cpu"].is_object())
        .filter_map(|p| Some((p["podRef"]["name"].as_str()?, p)))
        .collect()
}

/// The value and timestamp (ms) of one series in Prometheus text.
fn sample(text: &str, series: &str) -> Option<(f64, f64)> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        let mut fields = rest.split(' ');
        let value = fields.next()?.parse().ok()?;
        let at = fields.next()?.parse().ok()?;
        Some((value, at))
    })
}

/// GpuIdle Events on a pod, counting repeats of one Event.
async fn gpu_idle_events(client: &kube::Client, pod: &str) -> anyhow::Result<i32> {
    let api: Api<Event> = Api::namespaced(client.clone(), NS);
    let list = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("GpuIdle"))
        .map(|e| {
            let series = e.series.as_ref().and_then(|s| s.count).unwrap_or(1);
            e.count.unwrap_or(1).max(series)
        })
        .sum())
}

/// Series of this test's pods on the controller's /metrics.
async fn pod_series(metrics: &str) -> anyhow::Result<usize> {
    let text = reqwest::get(format!("http://{metrics}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("namespace=\"watched\""))
        .count())
}

/// 403 without RBAC naming the subresource; 200 once granted nodes/stats and nodes/metrics,
/// which still do not open logs. Callers present a client certificate, or a ServiceAccount
/// token as metrics-server does (checked by a TokenReview; a forged one gets 401).
async fn check_authorization(
    client: &kube::Client,
    control_plane: &ControlPlane,
    controller: &ControllerProcess,
) -> anyhow::Result<()> {
    let port = controller.kubelet_port;
    let certs = tempfile::tempdir()?;
    let pki = control_plane.pki_dir();
    let carol = Identity::issue(&pki, certs.path(), "carol", "/O=team-c/CN=carol")?;
    for (path, subresource) in [
        ("/stats/summary", "subresource=stats"),
        ("/metrics/resource", "subresource=metrics"),
    ] {
        let (code, body) = kubelet_get(port, path, Some(&carol))?;
        ensure!(
            code == 403 && body.contains("user=carol") && body.contains(subresource),
            "carol without RBAC on {path}: {code} {body:?}"
        );
        ensure!(!body.contains("watched"), "a 403 carried stats: {body:?}");
        let (code, _) = kubelet_get(port, path, None)?;
        ensure!(code == 401, "anonymous on {path}: {code}");
    }
    let token = service_account_token(client).await?;
    let (code, body) = kubelet_get_as(port, "/metrics/resource", None, Some(&token))?;
    ensure!(
        code == 403 && body.contains("user=system:serviceaccount:watched:default"),
        "a ServiceAccount without RBAC: {code} {body:?}"
    );
    let (code, body) = kubelet_get_as(port, "/stats/summary", None, Some("forged"))?;
    ensure!(code == 401, "a forged token: {code} {body:?}");

    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "node-metrics-reader"},
        "rules": [{"apiGroups": [""], "resources": ["nodes/stats", "nodes/metrics"],
                   "verbs": ["get"]}]
    }))?;
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "metrics-readers-read-node-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "node-metrics-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "metrics-readers"},
                     {"kind": "ServiceAccount", "name": "default", "namespace": NS}]
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    let dave = Identity::issue(&pki, certs.path(), "dave", "/O=metrics-readers/CN=dave")?;
    wait::until("dave allowed stats through his group", WAIT, || async {
        let (code, body) = kubelet_get(port, "/stats/summary", Some(&dave))?;
        match code {
            200 if body.contains("\"watched\"") => Ok(Some(())),
            200 => bail!("200 without this test's pods: {body:?}"),
            403 => Ok(None),
            other => bail!("unexpected {other}: {body:?}"),
        }
    })
    .await?;
    wait::until("the ServiceAccount allowed metrics", WAIT, || async {
        let (code, body) = kubelet_get_as(port, "/metrics/resource", None, Some(&token))?;
        match code {
            200 if body.contains("container_cpu_usage_seconds_total{") => Ok(Some(())),
            403 => Ok(None),
            other => bail!("unexpected {other}: {body:?}"),
        }
    })
    .await?;
    let (code, body) = kubelet_get(port, "/metrics/resource", Some(&dave))?;
    ensure!(
        code == 200 && body.contains("container_cpu_usage_seconds_total{"),
        "dave on /metrics/resource: {code} {body:?}"
    );
    let (code, body) = kubelet_get(port, &format!("/containerLogs/{NS}/busy/main"), Some(&dave))?;
    ensure!(
        code == 403 && body.contains("subresource=proxy"),
        "stats rights opened logs: {code} {body:?}"
    );
    Ok(())
}

/// The token of the test namespace's default ServiceAccount (its token Secret).
async fn service_account_token(client: &kube::Client) -> anyhow::Result<String> {
    let account = Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .get("default")
        .await?;
    let secret = account
        .secrets
        .unwrap_or_default()
        .into_iter()
        .find_map(|s| s.name)
        .context("the default ServiceAccount has no token Secret")?;
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get(&secret)
        .await?;
    let token = secret
        .data
        .and_then(|d| d.get("token").cloned())
        .context("no token in the Secret")?;
    Ok(String::from_utf8(token.0)?)
}

/// Metric names in Prometheus text: every sample's name, and for each TYPE line the names its
/// samples take (`_total` for counters; `_bucket`, `_sum`, `_count` for histograms), so a
/// family with no sample yet still counts as exported.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut fields = rest.split_whitespace();
            let (Some(name), Some(kind)) = (fields.next(), fields.next()) else {
                continue;
            };
            names.insert(name.to_owned());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            if end > 0 {
                names.insert(line[..end].to_owned());
            }
        }
    }
    names
}

/// The project's metric names a PromQL expression uses.
fn used_names(expr: &str) -> Vec<&str> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("runpod_kubelet_") {
        let tail = &rest[start..];
        let end = tail.find(|c| !is_name(c)).unwrap_or(tail.len());
        names.push(&tail[..end]);
        rest = &tail[end..];
    }
    names
}

async fn every_monitored_metric_is_exported(
    metrics: &str,
    webhook: &WebhookProcess,
) -> anyhow::Result<()> {
    let controller_text = reqwest::get(format!("http://{metrics}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await?;
    let reply = support::webhook::https_get(webhook.addr, &webhook.ca_pem, "/metrics").await?;
    ensure!(
        reply.starts_with("HTTP/1.1 200"),
        "webhook /metrics: {reply}"
    );
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let mut exported = exported_names(&controller_text);
    exported.extend(exported_names(body));
    let queries = support::chart::monitoring_queries()?;
    let mut missing = Vec::new();
    let mut used = 0;
    for (from, expr) in &queries {
        ensure!(
            !expr.contains("kube_"),
            "{from} uses kube-state-metrics, which is not assumed: {expr}"
        );
        for name in used_names(expr) {
            used += 1;
            if !exported.contains(name) {
                missing.push(format!("{from}: {name}"));
            }
        }
    }
    ensure!(
        used > 20,
        "too few metric names found in {} queries",
        queries.len()
    );
    ensure!(
        missing.is_empty(),
        "used by the chart but exported by neither binary:\n{}\nexported: {exported:?}",
        missing.join("\n")
    );
    Ok(())
}
