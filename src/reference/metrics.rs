//! `docs/reference/metrics.md`: the metrics each component registers, from the registries the
//! binaries build (the controller's `/metrics` and the webhook's).

use prometheus_client::registry::Registry;

use super::{cell, check, generated_by};

const PATH: &str = "docs/reference/metrics.md";

/// One family as the text encoding announces it.
struct Family {
    name: String,
    kind: String,
    unit: String,
    help: String,
    /// Label names of its first sample (histogram `le` left out).
    labels: Vec<String>,
}

/// Reads the `# HELP`/`# TYPE`/`# UNIT` lines of an OpenMetrics text exposition.
fn families(exposition: &str) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# ") else {
            if let (Some(family), Some((_, labels))) = (out.last_mut(), line.split_once('{'))
                && family.labels.is_empty()
            {
                family.labels = labels
                    .split(',')
                    .filter_map(|pair| pair.split_once('=').map(|(name, _)| name.trim()))
                    .filter(|name| *name != "le")
                    .map(str::to_string)
                    .collect();
            }
            continue;
        };
        let mut parts = rest.splitn(3, ' ');
        let (Some(what), Some(name)) = (parts.next(), parts.next()) else {
            continue;
        };
        let text = parts.next().unwrap_or_default().to_string();
        if out.last().is_none_or(|family| family.name != name) {
            out.push(Family {
                name: name.to_string(),
                kind: String::new(),
                unit: String::new(),
                help: String::new(),
                labels: Vec::new(),
            });
        }
        let Some(family) = out.last_mut() else {
            continue;
        };
        match what {
            "HELP" => family.help = text,
            "TYPE" => family.kind = text,
            "UNIT" => family.unit = text,
            _ => {}
        }
    }
    out
}

/// The name a query uses: counters are exported with `_total`.
fn series_name(family: &Family) -> String {
    if family.kind == "counter" {
        format!("{}_total", family.name)
    } else {
        family.name.clone()
    }
}

fn table(out: &mut String, exposition: &str) {
    out.push_str("| metric | type | labels | meaning |\n|---|---|---|---|\n");
    let mut all = families(exposition);
    all.sort_by(|a, b| a.name.cmp(&b.name));
    for family in all {
        let unit = if family.unit.is_empty() {
            String::new()
        } else {
            format!(" (unit: {})", family.unit)
        };
        let labels: Vec<String> = family.labels.iter().map(|l| format!("`{l}`")).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {}{} |\n",
            series_name(&family),
            family.kind,
            labels.join(", "),
            cell(&family.help),
            unit
        ));
    }
    out.push('\n');
}

fn controller_exposition() -> String {
    // As `runpod-kubelet controller` builds it.
    let mut registry = Registry::with_prefix("runpod_kubelet");
    let cloud_api = runpod_kubelet::provider::metrics::CloudApiMetrics::register(&mut registry);
    let runpod = runpod_kubelet::runpod::metrics::RunPodMetrics::register(
        &mut registry,
        cloud_api.for_provider("runpod"),
    );
    let controller =
        runpod_kubelet::controller::metrics::ControllerMetrics::register(&mut registry);
    runpod.add_example_series();
    cloud_api.for_provider("vastai").add_example_series();
    controller.add_example_series();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

pub(super) fn render() -> String {
    let mut out = generated_by(
        "the registered metrics (src/controller/metrics.rs, src/provider/metrics.rs, src/runpod/metrics.rs, webhook/src/metrics.rs)",
    );
    out.push_str(
        "# Metrics\n\n\
         What each component serves on `/metrics` (Prometheus text format). The chart's \
         ServiceMonitors scrape both (`monitoring.serviceMonitor.enabled`); the alerts and the \
         dashboard use only these, plus Prometheus's own `up`. What the kubelet API serves \
         for metrics-server (`/metrics/resource`, `/stats/summary`) is described in \
         [the kubelet API page](../kubelet-api.md).\n\n",
    );
    out.push_str(
        "## The controller\n\n\
         Plain HTTP on `--metrics-listen` (chart: `controller.metricsPort`, default 9090), \
         served by every replica; the per-pod series (`namespace`, `pod`, `provider` labels) \
         come from the leader and end when the pod does.\n\n",
    );
    table(&mut out, &controller_exposition());
    out.push_str(
        "## The webhook\n\n\
         HTTPS on the webhook's port (chart: `webhook.port`, default 8443), path `/metrics`.\n\n",
    );
    table(
        &mut out,
        &runpod_webhook::metrics::Metrics::default().render(),
    );
    out.trim_end().to_string() + "\n"
}

#[test]
fn metrics_reference_is_in_step() {
    check(PATH, &render());
}

/// A family registered without an example series would be missing from the reference:
/// count the registrations in the source against the families the exposition shows.
#[test]
fn every_registered_family_is_in_the_reference() {
    let registrations = |path: &str| {
        std::fs::read_to_string(super::root().join(path))
            .unwrap()
            .matches("registry.register(")
            .count()
    };
    let controller = families(&controller_exposition());
    assert_eq!(
        controller.len(),
        registrations("src/controller/metrics.rs")
            + registrations("src/runpod/metrics.rs")
            + registrations("src/provider/metrics.rs")
    );
    let webhook = families(&runpod_webhook::metrics::Metrics::default().render());
    assert_eq!(webhook.len(), registrations("webhook/src/metrics.rs"));
    for family in controller.iter().chain(&webhook) {
        assert!(
            !family.help.trim().is_empty(),
            "{} has no help",
            family.name
        );
    }
}
