//! The kubelet API authorizes like a kubelet in webhook mode, on the real control plane: a
//! burst pod runs on the simulator, and its log is asked for directly at the controller's
//! kubelet port with client certificates the cluster CA signed (issued here with openssl, as
//! `tests/control-plane/cluster.sh` issues the cluster's own).
//!
//! Checked: `kubectl logs` through the apiserver works (its kubelet client certificate is in
//! `system:masters`); a user without RBAC gets 403 naming the user and `nodes/proxy`; once bound
//! a ClusterRole with `nodes/proxy` and `nodes/log` `get`, 200 with the log (after the 30 s a
//! denial is cached at most); a user whose certificate O names a bound group gets 200 at once; a
//! certificate without a CN (even with `O=system:masters`) and an anonymous request get 401.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::{bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{LogParams, PostParams};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::kubelet_client::{Identity, kubelet_get};
use support::pods::{bound_gpu_pod, namespace, node_ready, running};
use support::wait;

const NS: &str = "authz";
const LOG_LINE: &str = "serving on 8888";
/// Longer than the 30 s a denied answer is cached.
const AFTER_DENIAL: Duration = Duration::from_secs(90);

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_kubelet_authz kubelet_api_authorizes_with_subject_access_reviews",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let simulator = SimulatorProcess::start(&json!({
        "provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 200,
        "images": [{"match": "server", "logs": [LOG_LINE]}]
    }))?;
    let controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &["--cluster-id", "e2e-authz"],
    )?;
    let outcome = scenario(&client, control_plane, &controller).await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(60));
    }
    outcome
}

async fn scenario(
    client: &kube::Client,
    control_plane: &ControlPlane,
    controller: &ControllerProcess,
) -> anyhow::Result<()> {
    node_ready(client).await?;
    namespace(client, NS, true).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &bound_gpu_pod("server", "e2e/server:1", "Always"),
    )
    .await?;
    running(&pods, "server").await?;

    // 1. `kubectl logs`: the apiserver's kubelet client (O=system:masters) is allowed.
    wait::until(
        "kubectl logs through the apiserver",
        AFTER_DENIAL,
        || async {
            let text = pods.logs("server", &LogParams::default()).await?;
            Ok(text.contains(LOG_LINE).then_some(()))
        },
    )
    .await?;

    let certs = tempfile::tempdir()?;
    let pki = control_plane.pki_dir();
    let path = format!("/containerLogs/{NS}/server/main");
    let get = |identity: Option<&Identity>| kubelet_get(controller.kubelet_port, &path, identity);

    // 2. A user the cluster CA vouches for, without RBAC on the node: 403.
    let alice = Identity::issue(&pki, certs.path(), "alice", "/O=team-a/CN=alice")?;
    let (code, body) = get(Some(&alice))?;
    ensure!(code == 403, "alice without RBAC: {code} {body:?}");
    ensure!(
        body.contains("Forbidden")
            && body.contains("user=alice")
            && body.contains("verb=get")
            && body.contains("subresource=proxy"),
        "the 403 should name the user and what was asked: {body:?}"
    );
    ensure!(!body.contains(LOG_LINE), "a 403 carried the log: {body:?}");

    // 3. Bound a ClusterRole with nodes/proxy and nodes/log: 200 with the log, once the cached
    //    denial has expired.
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "node-log-reader"},
        "rules": [{"apiGroups": [""], "resources": ["nodes/proxy", "nodes/log"],
                   "verbs": ["get"]}]
    }))?;
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    for (name, kind, subject) in [
        ("alice-reads-node-logs", "User", "alice"),
        ("log-readers-read-node-logs", "Group", "log-readers"),
    ] {
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "node-log-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind,
                          "name": subject}]
        }))?;
        bindings.create(&PostParams::default(), &binding).await?;
    }
    let started = std::time::Instant::now();
    wait::until("alice allowed after the binding", AFTER_DENIAL, || async {
        let (code, body) = get(Some(&alice))?;
        match code {
            200 if body.contains(LOG_LINE) => Ok(Some(())),
            200 => bail!("200 without the log line: {body:?}"),
            403 => Ok(None),
            other => bail!("unexpected {other}: {body:?}"),
        }
    })
    .await?;
    eprintln!("alice allowed {:?} after the binding", started.elapsed());

    // 4. The certificate's O values are the groups: bob is in a bound group, never denied.
    let bob = Identity::issue(&pki, certs.path(), "bob", "/O=team-b/O=log-readers/CN=bob")?;
    let (code, body) = get(Some(&bob))?;
    ensure!(
        code == 200 && body.contains(LOG_LINE),
        "bob through his group: {code} {body:?}"
    );

    // 5. No user: a certificate without a CN, however privileged its groups, and no certificate.
    let nameless = Identity::issue(&pki, certs.path(), "nameless", "/O=system:masters")?;
    let (code, body) = get(Some(&nameless))?;
    ensure!(code == 401, "a certificate without a CN: {code} {body:?}");
    let (code, body) = get(None)?;
    ensure!(code == 401, "anonymous: {code} {body:?}");

    // 6. The apiserver's own requests still pass.
    let text = pods.logs("server", &LogParams::default()).await?;
    ensure!(text.contains(LOG_LINE), "kubectl logs at the end: {text:?}");

    // 7. The controller's own /metrics over TLS on the kubelet port, guarded as a kubelet's
    //    /metrics is: `get nodes/metrics` (alice may read logs, not metrics), never anonymous.
    let metrics =
        |identity: Option<&Identity>| kubelet_get(controller.kubelet_port, "/metrics", identity);
    let (code, body) = metrics(Some(&alice))?;
    ensure!(
        code == 403 && body.contains("subresource=metrics"),
        "alice reading /metrics: {code} {body:?}"
    );
    let (code, _) = metrics(None)?;
    ensure!(code == 401, "anonymous /metrics: {code}");
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "node-metrics-reader"},
        "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}]
    }))?;
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "prometheus-reads-node-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "node-metrics-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "prometheus"}]
    }))?;
    bindings.create(&PostParams::default(), &binding).await?;
    let prometheus = Identity::issue(&pki, certs.path(), "prometheus", "/CN=prometheus")?;
    wait::until("prometheus reading /metrics", AFTER_DENIAL, || async {
        let (code, body) = metrics(Some(&prometheus))?;
        match code {
            200 if body.contains("runpod_kubelet_leader") => Ok(Some(())),
            200 => bail!("200 without the controller's metrics: {body:?}"),
            403 => Ok(None),
            other => bail!("unexpected {other}: {body:?}"),
        }
    })
    .await?;
    Ok(())
}
