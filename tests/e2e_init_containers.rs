//! Init containers of a burst pod on the real control plane, with the simulator running the
//! pod's command (the controller's wrapper) as a local process: an init container in the
//! container's image runs first, with its own command and env, and what it writes on the
//! pod's emptyDir is read by the container's command; while it runs the pod is Pending and
//! not Initialized, its status running; `kubectl logs -c` shows each container's own lines,
//! without the wrapper's markers. A failing init container (restartPolicy Never) fails the pod
//! without the container's command ever running. An init container of another image is
//! refused at admission, naming it. A `postStart` exec hook's marker is seen by the command.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{ContainerState, Pod};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::{namespace, phase};
use support::wait;
use support::webhook::WebhookProcess;

const NS: &str = "e2e-init";
const WAIT: Duration = Duration::from_secs(120);

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_init_containers init_containers_run_before_the_command",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

async fn run(cp: &ControlPlane) -> anyhow::Result<()> {
    let client = cp.client().await?;
    let simulator = SimulatorProcess::start(&json!({
        "provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 300,
        "images": [{"match": "e2e/run", "run": true}]
    }))?;
    let webhook = WebhookProcess::start(&cp.kubeconfig, &[]).await?;
    webhook.register(&client, &["kube-system"]).await?;
    let controller = ControllerProcess::start(&cp.kubeconfig, &cp.ca_file(), &simulator, &[])?;
    let outcome = scenarios(cp, &client).await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(60));
    }
    outcome
}

/// A burst pod of `image` whose container runs `main` and whose init containers are `inits`,
/// both mounting the emptyDir `work` at `dir` (no ServiceAccount files: the simulator runs
/// the command on this machine).
fn pod(name: &str, dir: &str, inits: serde_json::Value, main: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"runpod.io/burst-mode": "always"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "volumes": [{"name": "work", "emptyDir": {}}],
            "initContainers": inits,
            "containers": [{
                "name": "main", "image": "e2e/run:1",
                "command": ["sh", "-c", main],
                "env": [{"name": "ONLY_MAIN", "value": "main's"}],
                "volumeMounts": [{"name": "work", "mountPath": dir}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}
            }]
        }
    }))?)
}

/// `kubectl logs` of the pod's `container`: stdout.
fn logs(cp: &ControlPlane, pod: &str, container: &str) -> anyhow::Result<String> {
    let output = Command::new("kubectl")
        .args(["-n", NS, "logs", pod, "-c", container])
        .env("KUBECONFIG", &cp.kubeconfig)
        .output()
        .context("running kubectl logs")?;
    ensure!(
        output.status.success(),
        "kubectl logs {pod} -c {container}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn init_state(pod: &Pod, index: usize) -> Option<ContainerState> {
    pod.status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .get(index)?
        .state
        .clone()
}

fn condition(pod: &Pod, kind: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
}

async fn scenarios(cp: &ControlPlane, client: &kube::Client) -> anyhow::Result<()> {
    support::pods::node_ready_named(client, "virtual-runpod").await?;
    namespace(client, NS, true).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let scratch = tempfile::tempdir()?;
    let dir = scratch.path().join("work").display().to_string();
    let go = scratch.path().join("go").display().to_string();

    // Two init containers in the container's image: the first writes its own env into the
    // shared emptyDir, the second waits for a file this test creates (so the pod is seen
    // initializing); then the container reads what the first wrote.
    let inits = json!([
        {"name": "fetch", "image": "e2e/run:1",
         "command": ["sh", "-c", format!("echo \"$GREETING:${{ONLY_MAIN:-none}}\" > {dir}/data; echo fetched")],
         "env": [{"name": "GREETING", "value": "hello from init"}],
         "volumeMounts": [{"name": "work", "mountPath": dir}]},
        {"name": "wait", "image": "e2e/run:1",
         "command": ["sh", "-c", format!("echo waiting; for i in $(seq 600); do [ -f {go} ] && break; sleep 0.2; done; echo went")]}
    ]);
    let main = format!("cat {dir}/data; echo \"main:$ONLY_MAIN:${{GREETING:-none}}\"");
    pods.create(
        &PostParams::default(),
        &pod("prepared", &dir, inits, &main)?,
    )
    .await?;
    let initializing = wait::until("the second init container running", WAIT, || async {
        let pod = pods.get("prepared").await?;
        let second_runs = init_state(&pod, 1).is_some_and(|s| s.running.is_some());
        Ok(second_runs.then_some(pod))
    })
    .await?;
    let first = init_state(&initializing, 0)
        .and_then(|s| s.terminated)
        .context("the first init container has not ended")?;
    ensure!(
        first.exit_code == 0 && first.reason.as_deref() == Some("Completed"),
        "the first init container: {first:?}"
    );
    ensure!(
        phase(&initializing) == Some("Pending")
            && condition(&initializing, "Initialized").as_deref() == Some("False"),
        "an initializing pod: {:?}",
        initializing.status
    );
    let main_state = initializing.status.as_ref().and_then(|s| {
        s.container_statuses.as_ref()?[0]
            .state
            .as_ref()?
            .waiting
            .as_ref()?
            .reason
            .clone()
    });
    ensure!(
        main_state.as_deref() == Some("PodInitializing"),
        "the container while initializing: {main_state:?}"
    );
    std::fs::write(&go, "")?;
    let done = wait::until("the prepared pod Succeeded", WAIT, || async {
        let pod = pods.get("prepared").await?;
        Ok((phase(&pod) == Some("Succeeded")).then_some(pod))
    })
    .await?;
    ensure!(
        condition(&done, "Initialized").as_deref() == Some("True"),
        "{:?}",
        done.status
    );
    for index in 0..2 {
        let ended = init_state(&done, index).and_then(|s| s.terminated);
        ensure!(
            ended.as_ref().is_some_and(|t| t.exit_code == 0),
            "init container {index}: {ended:?}"
        );
    }
    let main_log = logs(cp, "prepared", "main")?;
    ensure!(
        main_log == "hello from init:none\nmain:main's:none\n",
        "the container's log: {main_log:?}"
    );
    ensure!(logs(cp, "prepared", "fetch")? == "fetched\n", "fetch's log");
    ensure!(
        logs(cp, "prepared", "wait")? == "waiting\nwent\n",
        "wait's log"
    );

    // A failing init container: the pod fails, the container's command never runs.
    let failing = json!([{"name": "check", "image": "e2e/run:1",
                          "command": ["sh", "-c", "echo no database; exit 3"]}]);
    pods.create(
        &PostParams::default(),
        &pod("unprepared", &dir, failing, "echo main ran")?,
    )
    .await?;
    let failed = wait::until("the unprepared pod Failed", WAIT, || async {
        let pod = pods.get("unprepared").await?;
        Ok((phase(&pod) == Some("Failed")).then_some(pod))
    })
    .await?;
    let ended = init_state(&failed, 0)
        .and_then(|s| s.terminated)
        .context("the init container's end")?;
    ensure!(ended.exit_code == 3, "{ended:?}");
    ensure!(
        condition(&failed, "Initialized").as_deref() == Some("False"),
        "{:?}",
        failed.status
    );
    ensure!(
        logs(cp, "unprepared", "check")? == "no database\n",
        "check's log"
    );
    let never = logs(cp, "unprepared", "main")?;
    ensure!(
        !never.contains("main ran"),
        "the container ran after its init container failed: {never:?}"
    );

    // A postStart exec hook runs beside the command, which waits for its marker.
    let started = scratch.path().join("started").display().to_string();
    let mut hooked = pod(
        "hooked",
        &dir,
        json!([]),
        &format!(
            "for i in $(seq 300); do [ -f {started} ] && echo saw the hook && exit 0; sleep 0.1; done; exit 1"
        ),
    )?;
    hooked.spec.as_mut().context("spec")?.containers[0].lifecycle = Some(serde_json::from_value(
        json!({"postStart": {"exec": {"command": ["sh", "-c", format!("touch {started}")]}}}),
    )?);
    pods.create(&PostParams::default(), &hooked).await?;
    let ended = wait::until("the hooked pod ended", WAIT, || async {
        let pod = pods.get("hooked").await?;
        Ok(matches!(phase(&pod), Some("Succeeded" | "Failed")).then_some(pod))
    })
    .await?;
    ensure!(
        phase(&ended) == Some("Succeeded") && logs(cp, "hooked", "main")? == "saw the hook\n",
        "the command did not see the postStart hook's marker: {:?}",
        ended.status
    );

    // An init container of another image: refused at admission, named.
    let other = json!([{"name": "istio-init", "image": "istio/proxyv2", "command": ["true"]}]);
    let refused = pods
        .create(
            &PostParams::default(),
            &pod("other-image", &dir, other, "true")?,
        )
        .await;
    match refused {
        Err(kube::Error::Api(status)) => ensure!(
            status.message.contains("init containers (istio-init)"),
            "the refusal: {}",
            status.message
        ),
        other => anyhow::bail!("an init container of another image was admitted: {other:?}"),
    }
    Ok(())
}
