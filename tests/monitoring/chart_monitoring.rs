//! The chart's monitoring (each part off by default): ServiceMonitors that select each
//! component's Service, the PrometheusRule checked by `promtool check rules` and unit-tested by
//! `promtool test rules` (tests/monitoring/alerts_test.yaml, a test per alert), and the Grafana
//! dashboard ConfigMap. Whether every metric they use is exported is checked against the
//! running binaries by tests/e2e_metrics.rs.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use super::{of_kind, render, root};

const ALL_ON: [&str; 4] = [
    "runpod.apiKey=k",
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.grafanaDashboard.enabled=true",
];

/// `promtool`, which Debian's `prometheus` package ships (scripts/prerequisites.sh installs it).
fn promtool() -> PathBuf {
    let found = Command::new("sh")
        .args(["-c", "command -v promtool"])
        .output()
        .expect("sh");
    assert!(
        found.status.success(),
        "promtool is missing: run scripts/prerequisites.sh (apt-get install prometheus)"
    );
    PathBuf::from(String::from_utf8(found.stdout).unwrap().trim())
}

fn dashboards(objects: &[Value]) -> Vec<&Value> {
    of_kind(objects, "ConfigMap")
        .into_iter()
        .filter(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect()
}

#[test]
fn monitoring_is_off_by_default() {
    let objects = render(&["runpod.apiKey=k"]);
    assert!(of_kind(&objects, "ServiceMonitor").is_empty());
    assert!(of_kind(&objects, "PrometheusRule").is_empty());
    assert!(dashboards(&objects).is_empty());
    let on = render(&ALL_ON);
    assert_eq!(of_kind(&on, "ServiceMonitor").len(), 2);
    assert_eq!(of_kind(&on, "PrometheusRule").len(), 1);
    assert_eq!(dashboards(&on).len(), 1);
}

#[test]
fn each_service_monitor_selects_its_components_service_and_port() {
    let objects = render(&ALL_ON);
    let services = of_kind(&objects, "Service");
    for (component, port) in [("controller", "metrics"), ("webhook", "https")] {
        let monitor = of_kind(&objects, "ServiceMonitor")
            .into_iter()
            .find(|m| {
                m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == component
            })
            .unwrap_or_else(|| panic!("no ServiceMonitor for the {component}"));
        let selector = monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap();
        let selected: Vec<&&Value> = services
            .iter()
            .filter(|s| {
                selector
                    .iter()
                    .all(|(k, v)| &s["metadata"]["labels"][k] == v)
            })
            .collect();
        assert_eq!(selected.len(), 1, "{component}: {selected:?}");
        let ports = selected[0]["spec"]["ports"].as_array().unwrap();
        assert!(
            ports.iter().any(|p| p["name"] == port),
            "{component}: {ports:?}"
        );
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], port);
        assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    }
}

/// The rendered PrometheusRule's groups, as a rule file.
fn rule_file(sets: &[&str]) -> Value {
    let objects = render(sets);
    let rules = of_kind(&objects, "PrometheusRule");
    serde_json::json!({"groups": rules[0]["spec"]["groups"].clone()})
}

fn alerts(rules: &Value) -> Vec<String> {
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let promtool = promtool();
    let dir = tempfile::tempdir().unwrap();
    let rules = rule_file(&ALL_ON);
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_yaml::to_string(&rules).unwrap(),
    )
    .unwrap();
    let tests = std::fs::read_to_string(root().join("tests/monitoring/alerts_test.yaml")).unwrap();
    std::fs::write(dir.path().join("alerts_test.yaml"), &tests).unwrap();

    for args in [
        ["check", "rules", "rules.yaml"],
        ["test", "rules", "alerts_test.yaml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Every alert has a unit test in which it fires.
    let tests: Value = serde_yaml::from_str(&tests).unwrap();
    let tested: Vec<&str> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .filter_map(|a| a["alertname"].as_str())
        .collect();
    let alerts = alerts(&rules);
    assert_eq!(alerts.len(), 13, "{alerts:?}");
    for alert in &alerts {
        assert!(
            tested.contains(&alert.as_str()),
            "{alert} has no unit test that fires it"
        );
    }
}

/// Alerts without the chart's ServiceMonitors: the scrape job is the user's own, so no rule
/// may depend on `up` or the chart's job names (the node-not-Ready alert would fire forever,
/// the certificate alert never).
#[test]
fn alert_rules_without_the_service_monitors_use_no_job() {
    let rules = rule_file(&["runpod.apiKey=k", "monitoring.prometheusRule.enabled=true"]);
    let text = serde_yaml::to_string(&rules).unwrap();
    assert!(!text.contains("up{"), "{text}");
    assert!(!text.contains("job="), "{text}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), &text).unwrap();
    // Scraped under a job of the user's own: a leading controller is Ready, an expiring
    // certificate alerts.
    let tests = r#"
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'runpod_kubelet_leader{job="mine",namespace="runpod-system",instance="a"}'
        values: '1x30'
      - series: 'runpod_kubelet_certificate_expiry_timestamp_seconds{job="mine",namespace="runpod-system",instance="b"}'
        values: '518400x30'
    alert_rule_test:
      - eval_time: 20m
        alertname: RunPodKubeletVirtualNodeNotReady
        exp_alerts: []
      - eval_time: 0m
        alertname: RunPodKubeletWebhookCertificateExpiring
        exp_alerts:
          - exp_labels: {severity: warning, namespace: runpod-system}
            exp_annotations:
              summary: The webhook's serving certificate expires in 6d 0h 0m 0s
              description: >-
                Rotation has not happened: check the certs CronJob (or cert-manager). Once it
                expires the apiserver cannot call the webhook and burst pods are refused.
  - interval: 1m
    input_series:
      - series: 'runpod_kubelet_leader{job="mine",namespace="runpod-system",instance="a"}'
        values: '0x30'
    alert_rule_test:
      - eval_time: 10m
        alertname: RunPodKubeletVirtualNodeNotReady
        exp_alerts:
          - exp_labels: {severity: critical, namespace: runpod-system}
            exp_annotations:
              summary: The virtual node virtual-runpod is not Ready
              description: >-
                No runpod-kubelet controller is up and leading, so the virtual node's Lease is
                not renewed: new burst pods wait, and running ones keep billing unwatched.
"#;
    std::fs::write(dir.path().join("t.yaml"), tests).unwrap();
    for args in [
        ["check", "rules", "rules.yaml"],
        ["test", "rules", "t.yaml"],
    ] {
        let out = Command::new(promtool())
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_spend_alert_follows_its_value() {
    let mut sets = ALL_ON.to_vec();
    sets.push("monitoring.spendAlertPerHour=25");
    let rules = rule_file(&sets);
    let spend = rules["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["alert"] == "RunPodKubeletSpendHigh")
        .unwrap();
    let expr = spend["expr"].as_str().unwrap();
    assert!(expr.trim_end().ends_with("> 25"), "{expr}");
}

#[test]
fn the_dashboard_is_labelled_for_the_sidecar_and_has_every_row() {
    let objects = render(&ALL_ON);
    let config_map = dashboards(&objects)[0];
    let text = config_map["data"]["runpod-kubelet.json"].as_str().unwrap();
    let dashboard: Value = serde_json::from_str(text).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    let rows: Vec<&str> = panels
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert_eq!(
        rows,
        [
            "Spend",
            "Budgets",
            "Pods",
            "GPU utilization",
            "Cloud API",
            "Admissions",
            "Certificates"
        ]
    );
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{panel}");
        assert!(targets.iter().all(|t| t["expr"].is_string()), "{panel}");
    }
    // Every cloud alike: the Cloud API panels read the provider-labelled families, split by
    // provider, and no panel reads the RunPod-only series kept for one release.
    let all: Vec<&str> = panels
        .iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .filter_map(|t| t["expr"].as_str())
        .collect();
    assert!(
        all.iter().all(|e| !e.contains("runpod_kubelet_runpod_")),
        "{all:?}"
    );
    let cloud_api: Vec<&&str> = all
        .iter()
        .filter(|e| e.contains("runpod_kubelet_cloud_api_requests_total"))
        .collect();
    assert!(cloud_api.len() >= 3, "{all:?}");
    assert!(
        cloud_api.iter().all(|e| e.contains("provider")),
        "{cloud_api:?}"
    );
    // Only the leader reports the API's state; a standby exports 0, so the figure is the
    // leader's, never a min over the replicas.
    let exprs: Vec<&str> = panels
        .iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .filter_map(|t| t["expr"].as_str())
        .filter(|e| e.contains("runpod_kubelet_cloud_api_available"))
        .collect();
    assert!(!exprs.is_empty());
    for expr in exprs {
        assert!(
            expr.contains("runpod_kubelet_leader == 1") && !expr.contains("min("),
            "{expr}"
        );
    }
}
