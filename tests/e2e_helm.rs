//! The chart installed for real: `helm install --wait` with its hooks against the real control
//! plane. A stand-in kubelet (tests/support/pod_runner.rs) runs the pods the chart creates (the
//! certs hook Jobs, the webhook and the controller) as local processes with their own
//! ServiceAccount tokens, env and arguments, so the RBAC, the hook order and the flags are the
//! chart's own; the RunPod simulator is the only stand-in for the outside world.
//!
//! Checked: `helm template | kubectl apply --dry-run=server`; after `helm install --wait` returns,
//! the caBundle verifies the serving certificate (first install); the node registers and a burst
//! pod is admitted through the Service, runs and `kubectl logs` reads it; verbs the components do not need are refused;
//! with the webhook stopped a `runtimeClassName: runpod` pod lands on the virtual node and runs;
//! `helm upgrade` rotates the CA with an overlapping bundle and changes the controller's flags;
//! `helm uninstall` drains: no webhook configuration, no node, nothing billing. A second node
//! (`nodes`: Vast.ai, against its simulator, on ports of its own) registers Ready beside the
//! RunPod one and is drained away by the uninstall too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "e2e_helm/helpers.rs"]
mod helpers;
mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use helpers::{ca_pems, gpu_pod, helm, host_ip, token_client, watch_ca_bundle};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, LogParams, Patch, PatchParams, PostParams};
use runpod_certs::inspect;
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{API_KEY, SimulatorProcess};
use support::pod_runner::PodRunner;
use support::wait;
use support::webhook::free_port;

const NS: &str = "runpod-system";
const RELEASE: &str = "r";
const FULL: &str = "r-runpod-kubelet";
const CONFIG: &str = "burst.runpod.io";
const NODE: &str = "virtual-runpod";
const VAST_NODE: &str = "virtual-vastai";
const WAIT: Duration = Duration::from_secs(120);

fn main() -> std::process::ExitCode {
    // Webhooks behind a Service are dialled at an endpoint (no kube-proxy here).
    let extra = ExtraFlags {
        apiserver: vec!["--enable-aggregator-routing=true".to_owned()],
        ..ExtraFlags::default()
    };
    support::harness::main("e2e_helm helm_install_upgrade_uninstall", &extra, |cp| {
        Box::pin(run(cp))
    })
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let kubeconfig = control_plane.kubeconfig.as_path();
    let ip = host_ip()?;
    let simulator = SimulatorProcess::start(&json!({
        "provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 200,
        "images": [{"match": "server", "logs": ["serving"]}]
    }))?;
    let vast = SimulatorProcess::start_cloud("vastai", &json!({}))?;
    let runner = PodRunner::start(
        client.clone(),
        control_plane.server_url()?,
        std::fs::read_to_string(control_plane.ca_file())?,
        ip.clone(),
    )
    .await?;
    let values_dir = tempfile::tempdir()?;
    let values = values_dir.path().join("values.json");
    let ports = (
        free_port()?.port(),
        free_port()?.port(),
        free_port()?.port(),
    );
    // The Vast.ai node's controller runs on this host too: ports of its own.
    let vast_ports = (free_port()?.port(), free_port()?.port());
    std::fs::write(
        &values,
        serde_json::to_vec(&json!({
            "runpod": {"apiKey": API_KEY, "apiUrl": simulator.url,
                       "datacenterIds": ["EU-RO-1", "US-TX-3"], "maxGpuPrice": 2},
            "log": {"format": "text", "level": "info"},
            "webhook": {"replicas": 1, "port": ports.0, "tlsReloadInterval": "1s"},
            "controller": {"kubeletPort": ports.1, "metricsPort": ports.2,
                           "clusterId": "e2e-helm", "reconcileInterval": "1s", "createSettle": "3s",
                           "drain": {"timeout": "2m"},
                           // Every stand-in pod shares this host's ports: the old controller
                           // goes before the new one starts.
                           "updateStrategy": {"type": "Recreate"}},
            // The policy flags reach the webhook and both controllers, which must accept them.
            "vastai": {"apiKey": API_KEY, "apiUrl": vast.url, "regions": ["Europe", "North America"],
                       "minReliability": 0.9},
            "nodes": [{"name": VAST_NODE, "provider": "vastai",
                       "kubeletPort": vast_ports.0, "metricsPort": vast_ports.1}]
        }))?,
    )?;
    let values = values.to_str().unwrap();

    let outcome = scenario(&client, kubeconfig, values, &runner, &simulator, &vast).await;
    if outcome.is_err() {
        for prefix in [
            &format!("{FULL}-certs")[..],
            &format!("{FULL}-webhook")[..],
            &format!("{FULL}-controller")[..],
        ] {
            let logs = runner.logs(prefix);
            let lines: Vec<String> = logs
                .lines()
                .map(|l| l.chars().take(400).collect())
                .collect();
            eprintln!("{}", lines[lines.len().saturating_sub(30)..].join("\n"));
        }
    }
    outcome
}

async fn scenario(
    client: &kube::Client,
    kubeconfig: &Path,
    values: &str,
    runner: &PodRunner,
    simulator: &SimulatorProcess,
    vast: &SimulatorProcess,
) -> anyhow::Result<()> {
    // 0. The rendered chart passes the apiserver's own validation (server-side dry run).
    let rendered = helm(
        kubeconfig,
        &[
            "template",
            RELEASE,
            "charts/runpod-kubelet",
            "--namespace",
            NS,
            "-f",
            values,
            "--dry-run=server",
        ],
    )?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    let mut dry_run = Command::new("kubectl")
        .args(["apply", "--dry-run=server", "-f", "-", "--kubeconfig"])
        .arg(kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    std::io::Write::write_all(&mut dry_run.stdin.take().unwrap(), rendered.as_bytes())?;
    let dry_run = dry_run.wait_with_output()?;
    ensure!(
        dry_run.status.success(),
        "kubectl apply --dry-run=server refused the chart: {}",
        String::from_utf8_lossy(&dry_run.stderr)
    );

    // 1. helm install --wait, hooks included.
    helm(
        kubeconfig,
        &[
            "install",
            RELEASE,
            "charts/runpod-kubelet",
            "--namespace",
            NS,
            "-f",
            values,
            "--wait",
            "--timeout",
            "4m",
        ],
    )
    .context("helm install")?;
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let tls = Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("{FULL}-webhook-tls"))
        .await?;
    let serving = String::from_utf8(tls.data.as_ref().unwrap()["tls.crt"].0.clone())?;
    let configuration = configurations.get(CONFIG).await?;
    for webhook in configuration.webhooks.unwrap_or_default() {
        let bundle = String::from_utf8(
            webhook
                .client_config
                .ca_bundle
                .context("no caBundle once helm install --wait returned")?
                .0,
        )?;
        let first = inspect::parse_bundle(&bundle)?;
        ensure!(
            first
                .iter()
                .any(|ca| inspect::signed_by(&serving, &inspect::pem_of(&ca.der)).unwrap_or(false)),
            "the caBundle does not verify the serving certificate after install"
        );
    }

    // 2. Both nodes register; a burst pod goes through the webhook (via the Service) and runs.
    for node in [NODE, VAST_NODE] {
        wait::until(&format!("the virtual node {node} Ready"), WAIT, || async {
            let node = Api::<Node>::all(client.clone()).get_opt(node).await?;
            Ok(node
                .and_then(|n| n.status)
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                .then_some(()))
        })
        .await?;
    }
    // By default each controller requests its kubelet certificate, approves its own node's
    // request and keeps what the cluster issued, all under the chart's RBAC.
    for node in [NODE, VAST_NODE] {
        let secrets = Api::<Secret>::namespaced(client.clone(), NS);
        let name = format!("{node}-kubelet-serving");
        wait::until(
            &format!("the kept kubelet certificate {name}"),
            WAIT,
            || async {
                Ok(secrets
                    .get_opt(&name)
                    .await?
                    .filter(|s| s.type_.as_deref() == Some("kubernetes.io/tls"))
                    .map(drop))
            },
        )
        .await?;
    }
    let vast_node = Api::<Node>::all(client.clone()).get(VAST_NODE).await?;
    let provider = vast_node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("virtual-kubelet.io/provider"));
    ensure!(
        provider.map(String::as_str) == Some("vastai"),
        "the Vast.ai node's provider label: {provider:?}"
    );
    for (name, labels) in [
        ("team", json!({"runpod.io/burst": "enabled"})),
        ("plain", json!({})),
    ] {
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?,
            )
            .await?;
        wait::until(
            &format!("the default ServiceAccount token in {name}"),
            WAIT,
            || async {
                let sa = Api::<ServiceAccount>::namespaced(client.clone(), name)
                    .get_opt("default")
                    .await?;
                Ok(sa
                    .and_then(|sa| sa.secrets)
                    .is_some_and(|s| !s.is_empty())
                    .then_some(()))
            },
        )
        .await?;
    }
    let burst = gpu_pod("burst", json!({"runpod.io/burst-mode": "always"}), None);
    let created = Api::<Pod>::namespaced(client.clone(), "team")
        .create(&PostParams::default(), &burst)
        .await
        .context("a burst pod through the chart's webhook")?;
    ensure!(
        created
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_ref())
            .is_some_and(|t| t
                .iter()
                .any(|t| t.key.as_deref() == Some("virtual-kubelet.io/provider"))),
        "the webhook did not mutate the burst pod"
    );
    running_on_virtual_node(client, "team", "burst").await?;
    // `kubectl logs`: the kubelet API asks the apiserver (a SubjectAccessReview, under the
    // controller's own ServiceAccount) whether the apiserver's kubelet client may read them.
    wait::until("kubectl logs of the burst pod", WAIT, || async {
        let text = Api::<Pod>::namespaced(client.clone(), "team")
            .logs("burst", &LogParams::default())
            .await?;
        Ok(text.contains("serving").then_some(()))
    })
    .await?;
    // The release namespace is excluded. On 1.20 the `kubernetes.io/metadata.name` label the
    // configuration's NotIn selector relies on does not exist yet (1.21), so an opted-in pod
    // there does reach the webhook: its own exclusion (POD_NAMESPACE) must leave it untouched.
    let mut own = gpu_pod(
        "own-namespace",
        json!({"runpod.io/burst-mode": "always"}),
        None,
    );
    own.metadata.labels = Some([("runpod.io/burst".to_owned(), "enabled".to_owned())].into());
    let own = Api::<Pod>::namespaced(client.clone(), NS)
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &own,
        )
        .await?;
    ensure!(
        own.spec
            .as_ref()
            .and_then(|s| s.tolerations.as_ref())
            .is_none_or(|t| t
                .iter()
                .all(|t| t.key.as_deref() != Some("virtual-kubelet.io/provider"))),
        "a pod in the release namespace was mutated"
    );

    // 3. RBAC: the components' own tokens are refused what they do not need.
    let controller_client = token_client(client, kubeconfig, &format!("{FULL}-controller")).await?;
    let refused = Api::<Secret>::namespaced(controller_client.clone(), "team")
        .list(&ListParams::default())
        .await;
    ensure!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "the controller may list Secrets: {refused:?}"
    );
    let webhook_client = token_client(client, kubeconfig, &format!("{FULL}-webhook")).await?;
    let refused = Api::<Pod>::namespaced(webhook_client, "team")
        .create(&PostParams::default(), &gpu_pod("x", json!({}), None))
        .await;
    ensure!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "the webhook may create pods: {refused:?}"
    );

    // 4. The webhook stopped: a labelled namespace is blocked (failurePolicy Fail), but a pod
    //    with runtimeClassName: runpod lands on the virtual node and runs. The controller runs
    //    only pods that opted in (issue 22): in its namespace that never did, the pod is
    //    refused (`NotOptedIn`, nothing created) until it opts in with its own label, which an
    //    update can add (the webhook sees creates only).
    ensure!(
        runner.stop(&format!("{FULL}-webhook")) == 1,
        "no webhook pod running"
    );
    let blocked = Api::<Pod>::namespaced(client.clone(), "team")
        .create(&PostParams::default(), &gpu_pod("blocked", json!({}), None))
        .await;
    ensure!(
        blocked.is_err(),
        "the webhook is stopped, yet a burst pod was admitted"
    );
    let by_class = Api::<Pod>::namespaced(client.clone(), "plain")
        .create(
            &PostParams::default(),
            &gpu_pod("by-class", json!({}), Some("runpod")),
        )
        .await?;
    let selector = by_class.spec.as_ref().and_then(|s| s.node_selector.clone());
    ensure!(
        selector.is_some_and(|s| s.get("type").map(String::as_str) == Some("virtual-kubelet")),
        "the RuntimeClass's node selector was not merged into the pod"
    );
    support::pods::event(client, "plain", "by-class", "NotOptedIn").await?;
    Api::<Pod>::namespaced(client.clone(), "plain")
        .patch(
            "by-class",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"runpod.io/burst": "enabled"}}})),
        )
        .await?;
    running_on_virtual_node(client, "plain", "by-class").await?;
    runner.resume();

    // 5. helm upgrade: a CA rotation with overlap (pre-upgrade hook) and a changed controller flag.
    //    Every change the configuration goes through meanwhile is watched: Helm never takes the
    //    caBundle away (it renders none), so there is no moment without one.
    let ca_before = ca_pems(client).await?.0;
    let watched = watch_ca_bundle(client).await?;
    helm(
        kubeconfig,
        &[
            "upgrade",
            RELEASE,
            "charts/runpod-kubelet",
            "--namespace",
            NS,
            "-f",
            values,
            "--set",
            "certs.rotate=ca",
            "--set",
            "controller.reconcileInterval=2s",
            "--wait",
            "--timeout",
            "4m",
        ],
    )
    .context("helm upgrade")?;
    let (changes, without_bundle) = watched.finish().await;
    ensure!(
        changes > 0,
        "the upgrade changed the configuration's caBundle: no event seen"
    );
    ensure!(
        without_bundle == 0,
        "{without_bundle} of {changes} versions of the configuration during the upgrade had no caBundle"
    );
    let (ca_after, bundle) = ca_pems(client).await?;
    ensure!(ca_after != ca_before, "the CA did not rotate");
    let in_bundle: Vec<Vec<u8>> = inspect::parse_bundle(&bundle)?
        .into_iter()
        .map(|c| c.der)
        .collect();
    ensure!(
        in_bundle
            == vec![
                inspect::parse_first(&ca_after)?.der,
                inspect::parse_first(&ca_before)?.der
            ],
        "the bundle must hold the new and the old CA"
    );
    for webhook in configurations
        .get(CONFIG)
        .await?
        .webhooks
        .unwrap_or_default()
    {
        ensure!(webhook.client_config.ca_bundle.map(|b| b.0) == Some(bundle.clone().into_bytes()));
    }
    let deployment = Api::<Deployment>::namespaced(client.clone(), NS)
        .get(&format!("{FULL}-controller"))
        .await?;
    let deployment = serde_json::to_value(&deployment)?;
    let args: Vec<String> = serde_json::from_value(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
    )?;
    let at = args
        .iter()
        .position(|a| a == "--reconcile-interval")
        .unwrap();
    ensure!(
        args[at + 1] == "2s",
        "the upgrade did not change the flag: {args:?}"
    );
    wait::until("the upgraded controller running", WAIT, || async {
        let pods = Api::<Pod>::namespaced(client.clone(), NS)
            .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
            .await?;
        Ok(pods
            .items
            .iter()
            .any(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.spec.as_ref().unwrap().containers[0]
                        .args
                        .as_ref()
                        .is_some_and(|a| a.iter().any(|x| x == "2s"))
                    && runner.running().contains(p.metadata.name.as_ref().unwrap())
            })
            .then_some(()))
    })
    .await?;
    let after_upgrade = Api::<Pod>::namespaced(client.clone(), "team")
        .create(
            &PostParams::default(),
            &gpu_pod(
                "after-upgrade",
                json!({"runpod.io/burst-mode": "always"}),
                None,
            ),
        )
        .await;
    wait::until(
        "the webhook admitting again after the rotation",
        WAIT,
        || async {
            let attempt = Api::<Pod>::namespaced(client.clone(), "team")
                .create(
                    &PostParams {
                        dry_run: true,
                        ..PostParams::default()
                    },
                    &gpu_pod("probe", json!({"runpod.io/burst-mode": "always"}), None),
                )
                .await;
            Ok(attempt.is_ok().then_some(()))
        },
    )
    .await?;
    drop(after_upgrade);

    // 5b. Dropping a node from `nodes` while it still exists would leave its instances with no
    //     controller and no drain: the upgrade is refused, and the node is still served.
    let refused = helm(
        kubeconfig,
        &[
            "upgrade",
            RELEASE,
            "charts/runpod-kubelet",
            "--namespace",
            NS,
            "-f",
            values,
            "--set-json",
            "nodes=[]",
        ],
    );
    let message = format!(
        "{:#}",
        refused.err().context("dropping a live node was allowed")?
    );
    ensure!(
        message.contains(&format!(
            "{VAST_NODE:?} was removed but its virtual node still exists"
        )),
        "refusal {message}"
    );
    support::pods::node_ready_named(client, VAST_NODE).await?;

    // 5c. Removed without Helm (a GitOps prune, kubectl delete): the Vast.ai controller's
    //     Deployment is held by its finalizer until its leader has drained the node: the
    //     running instance is destroyed, the node removed, then the Deployment goes.
    let team = Api::<Pod>::namespaced(client.clone(), "team");
    team.create(
        &PostParams::default(),
        &gpu_pod(
            "on-vast",
            json!({"runpod.io/burst-mode": "always", "runpod.io/provider": "vastai"}),
            None,
        ),
    )
    .await?;
    wait::until("team/on-vast Running on the Vast.ai node", WAIT, || async {
        let pod = team.get("on-vast").await?;
        let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(VAST_NODE);
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        Ok((on_node && running).then_some(()))
    })
    .await?;
    ensure!(
        vast.ledger()
            .await?
            .iter()
            .any(|e| e["destroyed_at"].is_null()),
        "no Vast.ai instance runs"
    );
    let vast_controller = format!("{FULL}-controller-{VAST_NODE}");
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), NS);
    deployments
        .delete(&vast_controller, &Default::default())
        .await?;
    wait::until("the Vast.ai controller's Deployment gone", WAIT, || async {
        Ok(deployments
            .get_opt(&vast_controller)
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    let billing: Vec<serde_json::Value> = vast
        .ledger()
        .await?
        .into_iter()
        .filter(|e| e["destroyed_at"].is_null())
        .collect();
    ensure!(
        billing.is_empty(),
        "Vast.ai instances bill after their controller was removed: {billing:?}"
    );
    ensure!(
        Api::<Node>::all(client.clone())
            .get_opt(VAST_NODE)
            .await?
            .is_none(),
        "the removed controller's node is still there"
    );

    // 6. helm uninstall: the drain runs first; nothing is left billing or blocking.
    helm(
        kubeconfig,
        &[
            "uninstall",
            RELEASE,
            "--namespace",
            NS,
            "--wait",
            "--timeout",
            "4m",
        ],
    )
    .context("helm uninstall")?;
    ensure!(
        configurations.get_opt(CONFIG).await?.is_none(),
        "a webhook configuration was left behind"
    );
    let ledger = simulator.ledger().await?;
    ensure!(!ledger.is_empty(), "no RunPod pod was ever created");
    let billing: Vec<&serde_json::Value> = ledger
        .iter()
        .filter(|p| p["terminated_at"].is_null())
        .collect();
    ensure!(
        billing.is_empty(),
        "RunPod pods still billing after uninstall: {billing:?}"
    );
    wait::until("the virtual node removed", WAIT, || async {
        Ok(Api::<Node>::all(client.clone())
            .get_opt(NODE)
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    // The Vast.ai node's own drain removed it too.
    wait::until("the Vast.ai node removed", WAIT, || async {
        Ok(Api::<Node>::all(client.clone())
            .get_opt(VAST_NODE)
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    Ok(())
}

async fn running_on_virtual_node(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<()> {
    wait::until(&format!("{ns}/{name} Running on {NODE}"), WAIT, || async {
        let pod = Api::<Pod>::namespaced(client.clone(), ns).get(name).await?;
        let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE);
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        Ok((on_node && running).then_some(()))
    })
    .await
}
