//! The chart rendered without a cluster, for e2e checks against the running binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, ensure};
use serde_json::Value;

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The cached Helm binary (scripts/helm.sh installs it).
pub fn helm_binary() -> anyhow::Result<PathBuf> {
    let out = Command::new("bash")
        .arg(root().join("scripts/helm.sh"))
        .output()?;
    ensure!(out.status.success(), "scripts/helm.sh failed");
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// `helm template` of the chart with `sets`, as JSON objects.
pub fn render(sets: &[&str]) -> anyhow::Result<Vec<Value>> {
    let mut command = Command::new(helm_binary()?);
    command.args([
        "template",
        "r",
        "charts/runpod-kubelet",
        "--namespace",
        "runpod-system",
    ]);
    for set in sets {
        command.args(["--set", set]);
    }
    let out = command
        .current_dir(root())
        .output()
        .context("running helm")?;
    ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc)?;
        let value = serde_json::to_value(value)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// Every PromQL expression of the chart's alerts and dashboard, with where it comes from.
pub fn monitoring_queries() -> anyhow::Result<Vec<(String, String)>> {
    let objects = render(&[
        "runpod.apiKey=k",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.grafanaDashboard.enabled=true",
    ])?;
    let mut queries = Vec::new();
    for object in &objects {
        if object["kind"] == "PrometheusRule" {
            for group in object["spec"]["groups"].as_array().into_iter().flatten() {
                for rule in group["rules"].as_array().into_iter().flatten() {
                    let name = rule["alert"].as_str().unwrap_or("?").to_owned();
                    let expr = rule["expr"].as_str().context("a rule without expr")?;
                    queries.push((format!("alert {name}"), expr.to_owned()));
                }
            }
        }
        if object["kind"] == "ConfigMap" && object["metadata"]["labels"]["grafana_dashboard"] == "1"
        {
            for text in object["data"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(_, v)| v)
            {
                let dashboard: Value = serde_json::from_str(text.as_str().unwrap_or_default())?;
                for panel in dashboard["panels"].as_array().into_iter().flatten() {
                    for target in panel["targets"].as_array().into_iter().flatten() {
                        let title = panel["title"].as_str().unwrap_or("?");
                        let expr = target["expr"].as_str().context("a target without expr")?;
                        queries.push((format!("panel {title:?}"), expr.to_owned()));
                    }
                }
            }
        }
    }
    ensure!(
        queries.iter().any(|(from, _)| from.starts_with("alert"))
            && queries.iter().any(|(from, _)| from.starts_with("panel")),
        "no alerts or no dashboard rendered"
    );
    Ok(queries)
}

/// Runs helm with the cluster's kubeconfig; returns stdout, fails with stderr.
pub fn helm(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(helm_binary()?)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .current_dir(root())
        .output()?;
    ensure!(
        out.status.success(),
        "helm {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// This machine's first non-loopback IPv4 address (Endpoints refuse loopback ones).
pub fn host_ip() -> anyhow::Result<String> {
    let out = Command::new("hostname").arg("-I").output()?;
    String::from_utf8(out.stdout)?
        .split_whitespace()
        .find(|a| {
            a.parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| !ip.is_loopback())
        })
        .map(str::to_owned)
        .context("no non-loopback IPv4 address")
}
