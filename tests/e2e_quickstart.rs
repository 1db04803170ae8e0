//! The README's quickstart, typed as written, on the real control plane with an apiserver that
//! verifies kubelet certificates (`--kubelet-certificate-authority`).
//!
//! Every command of the README's quickstart block is run by `bash` from the repository's root,
//! unchanged, in order. The test environment differs from a user's cluster in three things,
//! none of them in the README's text: `RUNPOD_API_KEY` is the RunPod simulator's key, a `helm`
//! on the PATH adds one values file to `helm install` (the simulator's URL, a single webhook
//! replica and free ports, since every stand-in pod shares this host), and the watch (`-w`) is
//! stopped once it shows the pod Completed, as a user would. A stand-in kubelet
//! (tests/support/pod_runner.rs) runs the chart's pods as local processes.
//!
//! Checked, against what the README shows: the node is listed Ready under its name; the Job's pod
//! runs on the virtual node and completes; `kubectl logs job/train` (through the verifying
//! apiserver) prints the container's log; the pod carries the cost, GPU type and datacenter
//! annotations; `describe` shows the controller's Events; and the RunPod pod is terminated.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::json;
use support::chart::{helm_binary, host_ip};
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{API_KEY, SimulatorProcess};
use support::pod_runner::PodRunner;
use support::wait;
use support::webhook::free_port;

/// The simulated container's log (the example Job prints its GPU and "done").
const LOG: [&str; 2] = ["GPU: NVIDIA RTX A4000", "done"];

fn main() -> std::process::ExitCode {
    let extra = ExtraFlags {
        apiserver: vec![
            // Webhooks behind a Service are dialled at an endpoint (no kube-proxy here).
            "--enable-aggregator-routing=true".to_owned(),
            "--kubelet-certificate-authority={pki}/ca.crt".to_owned(),
        ],
        ..ExtraFlags::default()
    };
    support::harness::main("e2e_quickstart readme_quickstart", &extra, |cp| {
        Box::pin(run(cp))
    })
}

/// One command of the quickstart, with the output lines the README shows under it.
#[derive(Debug)]
struct Step {
    command: String,
    shown: Vec<String>,
}

/// The commands of the README's quickstart block (continuation lines joined, comments dropped),
/// each with the `# ` comment lines that follow it (what the README says it prints).
fn quickstart(readme: &str) -> anyhow::Result<Vec<Step>> {
    let section = readme
        .split("## Quickstart on your cluster")
        .nth(1)
        .context("the README has no quickstart section")?;
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .context("the quickstart has no sh block")?;
    let mut steps: Vec<Step> = Vec::new();
    let mut pending = String::new();
    for line in block.lines() {
        let trimmed = line.trim();
        if pending.is_empty() && trimmed.starts_with('#') {
            // A comment right under a command is what it prints; others introduce a step.
            if let Some(step) = steps.last_mut()
                && let Some(shown) = trimmed.strip_prefix("# ")
                && !shown.is_empty()
                && shown.split_whitespace().count() > 1
                && !shown.chars().next().is_some_and(char::is_numeric)
                && !shown.starts_with("or,")
            {
                step.shown.push(shown.to_owned());
            }
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        // A trailing comment is the README's explanation, not part of the command.
        let code = match trimmed.find("  #") {
            Some(at) => trimmed[..at].trim_end(),
            None => trimmed,
        };
        match code.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(code);
                steps.push(Step {
                    command: std::mem::take(&mut pending),
                    shown: Vec::new(),
                });
            }
        }
    }
    ensure!(pending.is_empty(), "the quickstart ends in a continuation");
    ensure!(steps.len() >= 8, "only {} quickstart commands", steps.len());
    Ok(steps)
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let simulator = SimulatorProcess::start(&json!({
        "provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 200,
        "images": [{"match": "pytorch", "logs": LOG, "outcome": "EXITED", "after_ms": 3000, "exit_code": 0}]
    }))?;
    let runner = PodRunner::start(
        client.clone(),
        control_plane.server_url()?,
        std::fs::read_to_string(control_plane.ca_file())?,
        host_ip()?,
    )
    .await?;

    // What this host needs and a user's cluster does not, given to `helm install` only.
    let dir = tempfile::tempdir()?;
    let values = dir.path().join("test-environment.json");
    std::fs::write(
        &values,
        serde_json::to_vec(&json!({
            "runpod": {"apiUrl": simulator.url},
            "webhook": {"replicas": 1, "port": free_port()?.port()},
            "controller": {"kubeletPort": free_port()?.port(), "metricsPort": free_port()?.port(),
                           "updateStrategy": {"type": "Recreate"}},
        }))?,
    )?;
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin)?;
    let helm = bin.join("helm");
    std::fs::write(
        &helm,
        format!(
            "#!/bin/sh\nif [ \"$1\" = install ]; then exec {} \"$@\" -f {}; fi\nexec {} \"$@\"\n",
            helm_binary()?.display(),
            values.display(),
            helm_binary()?.display()
        ),
    )?;
    std::fs::set_permissions(&helm, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let readme = std::fs::read_to_string(root.join("README.md"))?;
    let steps = quickstart(&readme)?;
    let shell = |command: &str| {
        let mut shell = Command::new("bash");
        shell
            .args(["-euo", "pipefail", "-c", command])
            .current_dir(root)
            .env("KUBECONFIG", &control_plane.kubeconfig)
            .env("PATH", &path)
            .env("RUNPOD_API_KEY", API_KEY);
        shell
    };

    let mut outputs = Vec::new();
    let outcome: anyhow::Result<()> = async {
        for step in &steps {
            eprintln!("$ {}", step.command);
            let output = if step.command.split_whitespace().any(|word| word == "-w") {
                watch_until_completed(shell(&step.command))?
            } else if step.command.starts_with("kubectl get nodes") {
                // The node registers within seconds of the install; a user looks again.
                let command = step.command.clone();
                wait::until(
                    "the virtual node listed Ready",
                    Duration::from_secs(60),
                    || {
                        let out = shell(&command).output();
                        async move {
                            let out = out?;
                            let text = String::from_utf8_lossy(&out.stdout).into_owned();
                            Ok(text.contains(" Ready ").then_some(text))
                        }
                    },
                )
                .await?
            } else {
                let out = shell(&step.command)
                    .output()
                    .with_context(|| format!("running {}", step.command))?;
                ensure!(
                    out.status.success(),
                    "`{}` failed: {}{}",
                    step.command,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                String::from_utf8_lossy(&out.stdout).into_owned()
            };
            eprint!("{output}");
            outputs.push(output);
        }
        Ok(())
    }
    .await;
    if let Err(error) = outcome {
        for prefix in ["runpod-kubelet-webhook", "runpod-kubelet-controller"] {
            let logs = runner.logs(prefix);
            let lines: Vec<&str> = logs.lines().collect();
            eprintln!("{}", lines[lines.len().saturating_sub(30)..].join("\n"));
        }
        return Err(error);
    }

    // What the README shows is what the user sees.
    for (step, output) in steps.iter().zip(&outputs) {
        for shown in &step.shown {
            // Names and states, not ages or versions.
            let words: Vec<&str> = shown.split_whitespace().collect();
            if step.command.starts_with("kubectl get nodes") {
                let row = output
                    .lines()
                    .find(|line| line.split_whitespace().next() == words.first().copied())
                    .with_context(|| format!("`{}` does not list {shown:?}", step.command))?;
                let got: Vec<&str> = row.split_whitespace().take(3).collect();
                ensure!(
                    got == words[..3],
                    "`{}` printed {row:?}, README shows {shown:?}",
                    step.command
                );
            } else if step.command.contains("grep 'runpod.io/'") {
                for annotation in words.iter().filter(|w| w.starts_with("runpod.io/")) {
                    ensure!(
                        output.contains(annotation),
                        "the pod lacks {annotation} the README shows: {output}"
                    );
                }
            }
        }
    }
    let find = |prefix: &str| {
        steps
            .iter()
            .zip(&outputs)
            .find(|(step, _)| step.command.starts_with(prefix))
            .map(|(_, output)| output.as_str())
            .with_context(|| format!("the quickstart has no `{prefix}`"))
    };
    let logs = find("kubectl -n ml-team logs job/train")?;
    // The container's lines, in order (the completion wrapper's own lines never reach
    // `kubectl logs`: docs/runpod.md).
    ensure!(
        logs.lines().take(LOG.len()).collect::<Vec<_>>() == LOG,
        "kubectl logs printed {logs:?}, the container printed {LOG:?}"
    );
    let described = find("kubectl -n ml-team describe pod")?;
    ensure!(
        described
            .lines()
            .any(|line| line.starts_with("Node:") && line.contains(" virtual-runpod/")),
        "the pod did not run on the virtual node: {described}"
    );
    // The Events the README names in its comment.
    let named = readme
        .lines()
        .find(|line| line.starts_with("kubectl -n ml-team describe pod"))
        .and_then(|line| line.split("# Events:").nth(1))
        .context("the README names no Events under describe")?;
    for reason in named.split(',').map(str::trim) {
        ensure!(
            described.contains(&format!("Normal  {reason} ")),
            "describe shows no {reason} Event: {described}"
        );
    }
    ensure!(
        !described.contains("ProvisioningTimeout") && !described.contains("Failed"),
        "the pod did not simply complete: {described}"
    );

    // The Job completed, and its RunPod pod no longer bills.
    let ledger = simulator.ledger().await?;
    ensure!(ledger.len() == 1, "one RunPod pod for one Job: {ledger:?}");
    wait::until(
        "the RunPod pod terminated",
        Duration::from_secs(60),
        || async {
            let ledger = simulator.ledger().await?;
            Ok(ledger
                .iter()
                .all(|pod| !pod["terminated_at"].is_null())
                .then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// Runs a `kubectl … -w` until a line shows the pod Completed on the virtual node (or three
/// minutes pass), then stops it; returns what it printed.
fn watch_until_completed(mut command: Command) -> anyhow::Result<String> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut printed = String::new();
    let done = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains("Completed") && line.contains("virtual-runpod");
                printed.push_str(&line);
                printed.push('\n');
                if done {
                    break true;
                }
            }
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    if !done {
        bail!("the watch never showed the pod Completed on virtual-runpod:\n{printed}");
    }
    Ok(printed)
}
