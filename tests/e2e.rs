//! End-to-end tests of the admission webhook against a real kube-apiserver, kube-scheduler and
//! kube-controller-manager (Job controller, node lifecycle), through the real
//! MutatingWebhookConfiguration path over TLS.
//!
//! A custom harness: the control plane is started once, scenarios run in order (the last one
//! stops the webhook), and everything is torn down even when a scenario fails.
//! Run one scenario with `cargo test --test e2e -- NAME_SUBSTRING`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use futures::future::BoxFuture;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use support::control_plane::ControlPlane;
use support::nodes::FakeNode;
use support::wait;
use support::webhook::WebhookProcess;
use tokio::sync::Mutex;

const VIRTUAL_NODE: &str = "virtual-runpod";
const LOCAL_NODE: &str = "local-gpu";
const WAIT: Duration = Duration::from_secs(60);

struct Env {
    client: kube::Client,
    webhook: Mutex<Option<WebhookProcess>>,
}

type Scenario = fn(Arc<Env>) -> BoxFuture<'static, anyhow::Result<()>>;

const SCENARIOS: &[(&str, Scenario)] = &[
    ("always_mode_gpu_job_runs_on_the_virtual_node", |env| {
        Box::pin(always_mode(env))
    }),
    ("fallback_mode_prefers_the_local_gpu_then_bursts", |env| {
        Box::pin(fallback_mode(env))
    }),
    (
        "job_annotations_are_the_fallback_for_pod_annotations",
        |env| Box::pin(job_annotation_fallback(env)),
    ),
    (
        "unlabelled_namespace_is_untouched_unless_the_pod_opts_in",
        |env| Box::pin(unlabelled_namespace(env)),
    ),
    ("forbidden_datacenter_is_refused_by_the_apiserver", |env| {
        Box::pin(forbidden_datacenter(env))
    }),
    ("controller_annotations_cannot_be_forged", |env| {
        Box::pin(forged_annotations(env))
    }),
    ("webhook_down_blocks_only_opted_in_namespaces", |env| {
        Box::pin(webhook_down(env))
    }),
];

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected: Vec<&(&str, Scenario)> = SCENARIOS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if selected.is_empty() {
        println!("no e2e scenario matches {filters:?}");
        return ExitCode::SUCCESS;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start tokio: {error}");
            return ExitCode::FAILURE;
        }
    };
    let control_plane = match ControlPlane::start() {
        Ok(control_plane) => control_plane,
        Err(error) => {
            eprintln!("e2e setup failed: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let failed = runtime.block_on(run(&control_plane, &selected));
    if failed > 0 {
        eprintln!(
            "--- kube-apiserver log tail ---\n{}",
            control_plane.log_tail("kube-apiserver", 40)
        );
        eprintln!(
            "--- kube-scheduler log tail ---\n{}",
            control_plane.log_tail("kube-scheduler", 20)
        );
    }
    drop(runtime);
    drop(control_plane);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn run(control_plane: &ControlPlane, selected: &[&(&str, Scenario)]) -> usize {
    let env = match setup(control_plane).await {
        Ok(env) => Arc::new(env),
        Err(error) => {
            eprintln!("e2e setup failed: {error:#}");
            return selected.len();
        }
    };
    println!("\nrunning {} e2e scenarios", selected.len());
    let mut failed = 0;
    for (name, scenario) in selected {
        let started = std::time::Instant::now();
        let outcome = tokio::spawn(scenario(env.clone())).await;
        let elapsed = started.elapsed();
        match outcome {
            Ok(Ok(())) => println!("e2e {name} ... ok ({elapsed:.1?})"),
            Ok(Err(error)) => {
                failed += 1;
                println!("e2e {name} ... FAILED ({elapsed:.1?})\n  {error:#}");
            }
            Err(panic) => {
                failed += 1;
                println!("e2e {name} ... FAILED (panicked: {panic})");
            }
        }
    }
    if failed > 0
        && let Some(webhook) = env.webhook.lock().await.as_ref()
    {
        eprintln!("--- webhook log tail ---\n{}", tail(&webhook.log(), 40));
    }
    println!(
        "\ne2e result: {} passed; {failed} failed",
        selected.len() - failed
    );
    failed
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

async fn setup(control_plane: &ControlPlane) -> anyhow::Result<Env> {
    let client = control_plane.client().await?;
    FakeNode::virtual_runpod(VIRTUAL_NODE)
        .register(client.clone())
        .await?;
    FakeNode::local_gpu(LOCAL_NODE)
        .register(client.clone())
        .await?;
    let webhook = WebhookProcess::start(
        &control_plane.kubeconfig,
        &["--datacenter-ids", "EU-RO-1,US-TX-3"],
    )
    .await?;
    webhook.register(&client, &["kube-system"]).await?;
    Ok(Env {
        client,
        webhook: Mutex::new(Some(webhook)),
    })
}

// ---------------------------------------------------------------------------------------------
// Scenarios

async fn always_mode(env: Arc<Env>) -> anyhow::Result<()> {
    let ns = "e2e-always";
    namespace(
        &env,
        ns,
        &[
            ("runpod.io/burst", "enabled"),
            ("runpod.io/burst-mode", "always"),
        ],
    )
    .await?;
    // A plain GPU Job: nothing about RunPod in its manifest.
    create_job(&env, ns, gpu_job("train", 1, BTreeMap::new())).await?;
    let pods = bound_pods_of_job(&env, ns, "train", 1).await?;
    let pod = &pods[0];
    ensure!(
        has_provider_toleration(pod),
        "no RunPod toleration: {:?}",
        pod.spec.as_ref().map(|s| &s.tolerations)
    );
    let selector = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    ensure!(
        selector.get("type").map(String::as_str) == Some("virtual-kubelet"),
        "nodeSelector {selector:?}"
    );
    ensure!(
        annotation(pod, "runpod.io/ports") == Some("8888/http,22/tcp"),
        "ports {:?}",
        annotation(pod, "runpod.io/ports")
    );
    ensure!(
        node_of(pod) == Some(VIRTUAL_NODE),
        "always-mode pod bound to {:?} although the local GPU was free",
        node_of(pod)
    );
    delete_namespace(&env, ns).await
}

async fn fallback_mode(env: Arc<Env>) -> anyhow::Result<()> {
    let ns = "e2e-fallback";
    namespace(&env, ns, &[("runpod.io/burst", "enabled")]).await?;
    // Two GPU pods at once, one local GPU: the scheduler must put one locally, one on RunPod.
    create_job(&env, ns, gpu_job("sweep", 2, BTreeMap::new())).await?;
    let pods = bound_pods_of_job(&env, ns, "sweep", 2).await?;
    let mut nodes: Vec<&str> = pods.iter().filter_map(node_of).collect();
    nodes.sort_unstable();
    ensure!(
        nodes == [LOCAL_NODE, VIRTUAL_NODE],
        "pods bound to {nodes:?}"
    );
    for pod in &pods {
        ensure!(
            has_provider_toleration(pod),
            "fallback pod lacks the toleration"
        );
        let spec = pod.spec.as_ref().context("no spec")?;
        ensure!(
            spec.node_selector
                .as_ref()
                .is_none_or(|s| !s.contains_key("type")),
            "fallback pod pinned"
        );
        let preferred = serde_json::to_value(&spec.affinity)?;
        let expression = &preferred["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            [0]["preference"]["matchExpressions"][0];
        ensure!(
            expression["operator"] == "NotIn" && expression["values"][0] == "virtual-kubelet",
            "affinity {preferred}"
        );
    }
    // Free the local GPU for later scenarios (no kubelet here to finish graceful deletion).
    delete_namespace(&env, ns).await
}

async fn job_annotation_fallback(env: Arc<Env>) -> anyhow::Result<()> {
    let ns = "e2e-jobannotations";
    namespace(&env, ns, &[("runpod.io/burst", "enabled")]).await?;
    let annotations: BTreeMap<String, String> = [
        ("runpod.io/burst-mode", "always"),
        ("runpod.io/required-gpu-memory", "24"),
        ("runpod.io/datacenter-ids", "EU-RO-1"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    create_job(&env, ns, gpu_job("annotated", 1, annotations)).await?;
    let pods = bound_pods_of_job(&env, ns, "annotated", 1).await?;
    let pod = &pods[0];
    ensure!(
        annotation(pod, "runpod.io/required-gpu-memory") == Some("24"),
        "memory not inherited: {:?}",
        pod.metadata.annotations
    );
    ensure!(
        annotation(pod, "runpod.io/datacenter-ids") == Some("EU-RO-1"),
        "datacenters not inherited"
    );
    ensure!(
        node_of(pod) == Some(VIRTUAL_NODE),
        "Job's burst-mode always not applied: bound to {:?}",
        node_of(pod)
    );

    // A Job asking for a forbidden datacenter gets no pods, and says why in its events.
    let forbidden: BTreeMap<String, String> =
        [("runpod.io/datacenter-ids".to_owned(), "US-CA-2".to_owned())].into();
    create_job(&env, ns, gpu_job("forbidden", 1, forbidden)).await?;
    wait::until(
        "a FailedCreate event naming the forbidden datacenter",
        WAIT,
        || async {
            let events: Api<k8s_openapi::api::core::v1::Event> =
                Api::namespaced(env.client.clone(), ns);
            let list = events.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("FailedCreate")
                        && e.message.as_deref().unwrap_or_default().contains("US-CA-2")
                })
                .then_some(()))
        },
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let forbidden_pods = pods
        .list(&ListParams::default().labels("job-name=forbidden"))
        .await?;
    ensure!(
        forbidden_pods.items.is_empty(),
        "a pod of the forbidden Job was created"
    );
    delete_namespace(&env, ns).await
}

async fn unlabelled_namespace(env: Arc<Env>) -> anyhow::Result<()> {
    let ns = "e2e-plain";
    namespace(&env, ns, &[]).await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let created = pods
        .create(&PostParams::default(), &gpu_pod("plain", &[], &[]))
        .await?;
    ensure!(
        !has_provider_toleration(&created),
        "pod in an unlabelled namespace was mutated"
    );
    ensure!(
        created
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key("runpod.io/ports")),
        "ports written"
    );

    // The pod label alone opts a pod in, in any namespace.
    let opted_in = pods
        .create(
            &PostParams::default(),
            &gpu_pod(
                "opted-in",
                &[("runpod.io/burst", "enabled")],
                &[("runpod.io/burst-mode", "always")],
            ),
        )
        .await?;
    ensure!(
        has_provider_toleration(&opted_in),
        "pod-label opt-in ignored"
    );
    let bound = wait::until("opted-in pod bound", WAIT, || async {
        Ok(pods.get("opted-in").await?.spec.and_then(|s| s.node_name))
    })
    .await?;
    ensure!(bound == VIRTUAL_NODE, "opted-in pod bound to {bound}");

    // And the opt-out label wins over an opted-in namespace.
    namespace(&env, "e2e-optout", &[("runpod.io/burst", "enabled")]).await?;
    let optout: Api<Pod> = Api::namespaced(env.client.clone(), "e2e-optout");
    let kept = optout
        .create(
            &PostParams::default(),
            &gpu_pod("kept-local", &[("runpod.io/burst", "disabled")], &[]),
        )
        .await?;
    ensure!(!has_provider_toleration(&kept), "opted-out pod was mutated");
    delete_namespace(&env, "e2e-optout").await?;
    delete_namespace(&env, ns).await
}

async fn forbidden_datacenter(env: Arc<Env>) -> anyhow::Result<()> {
    let ns = "e2e-compliance";
    namespace(&env, ns, &[("runpod.io/burst", "enabled")]).await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let pod = gpu_pod(
        "eu-only",
        &[],
        &[("runpod.io/datacenter-ids", "EU-RO-1,US-CA-2")],
    );
    match pods.create(&PostParams::default(), &pod).await {
        Ok(_) => bail!("the apiserver admitted a pod asking for a forbidden datacenter"),
        Err(kube::Error::Api(status)) => {
            ensure!(
                status.code == 403,
                "code {} ({})",
                status.code,
                status.message
            );
            ensure!(
                status.message.contains("US-CA-2"),
                "message lacks the offending id: {}",
                status.message
            );
            ensure!(
                status.message.contains("EU-RO-1, US-TX-3"),
                "message lacks the allowed ids: {}",
                status.message
            );
        }
        Err(other) => bail!("unexpected error: {other}"),
    }
    ensure!(
        pods.get_opt("eu-only").await?.is_none(),
        "refused pod exists"
    );
    // RunPod's community hosts are third parties: not allowed unless the installation says so.
    let community = gpu_pod("community", &[], &[("runpod.io/cloud-type", "COMMUNITY")]);
    match pods.create(&PostParams::default(), &community).await {
        Ok(_) => bail!("the apiserver admitted a pod asking for a cloud tier not allowed"),
        Err(kube::Error::Api(status)) => ensure!(
            status.code == 403 && status.message.contains("allowed: SECURE"),
            "code {} ({})",
            status.code,
            status.message
        ),
        Err(other) => bail!("unexpected error: {other}"),
    }
    delete_namespace(&env, ns).await
}

async fn forged_annotations(env: Arc<Env>) -> anyhow::Result<()> {
    let ns = "e2e-forgery";
    namespace(&env, ns, &[("runpod.io/burst", "enabled")]).await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let forged = gpu_pod(
        "forger",
        &[],
        &[
            ("runpod.io/pod-id", "someone-elses-pod"),
            ("runpod.io/cost-per-hr", "0"),
        ],
    );
    let created = pods.create(&PostParams::default(), &forged).await?;
    ensure!(
        annotation(&created, "runpod.io/pod-id").is_none(),
        "forged pod-id survived admission"
    );
    ensure!(
        annotation(&created, "runpod.io/cost-per-hr").is_none(),
        "forged cost survived admission"
    );
    delete_namespace(&env, ns).await
}

async fn webhook_down(env: Arc<Env>) -> anyhow::Result<()> {
    if let Some(mut webhook) = env.webhook.lock().await.take() {
        webhook.kill();
    }
    namespace(&env, "e2e-down-plain", &[]).await?;
    namespace(&env, "e2e-down-labelled", &[("runpod.io/burst", "enabled")]).await?;
    let plain: Api<Pod> = Api::namespaced(env.client.clone(), "e2e-down-plain");
    plain
        .create(&PostParams::default(), &gpu_pod("unaffected", &[], &[]))
        .await
        .context("a pod in an unlabelled namespace was blocked while the webhook was down")?;
    // Proof that the webhook is registered and really down: an opted-in pod is refused.
    let labelled: Api<Pod> = Api::namespaced(env.client.clone(), "e2e-down-labelled");
    match labelled
        .create(&PostParams::default(), &gpu_pod("blocked", &[], &[]))
        .await
    {
        Ok(_) => {
            bail!("an opted-in pod was admitted without the webhook (failurePolicy not Fail?)")
        }
        Err(kube::Error::Api(status)) => ensure!(
            status.message.contains("burst.runpod.io"),
            "{}",
            status.message
        ),
        Err(other) => bail!("unexpected error: {other}"),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Helpers

async fn namespace(env: &Env, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    let object: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
    namespaces.create(&PostParams::default(), &object).await?;
    // Pods cannot be created before the ServiceAccount controller made the default account.
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), name);
    wait::until(
        &format!("default ServiceAccount in {name}"),
        WAIT,
        || async {
            Ok(accounts
                .get_opt("default")
                .await?
                .filter(|sa| sa.secrets.as_ref().is_some_and(|s| !s.is_empty()))
                .map(drop))
        },
    )
    .await
}

async fn delete_namespace(env: &Env, name: &str) -> anyhow::Result<()> {
    // Pods bound to nodes without a kubelet never finish graceful deletion: force them.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), name);
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), name);
    let background = kube::api::DeleteParams::background();
    for job in jobs.list(&ListParams::default()).await?.items {
        if let Some(job_name) = job.metadata.name {
            jobs.delete(&job_name, &background).await?;
        }
    }
    let force = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete_collection(&force, &ListParams::default())
        .await?;
    Api::<Namespace>::all(env.client.clone())
        .delete(name, &Default::default())
        .await?;
    Ok(())
}

fn gpu_container() -> serde_json::Value {
    json!({
        "name": "train",
        "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
        "command": ["python", "-c", "print('hello')"],
        "ports": [{"containerPort": 8888}, {"containerPort": 22}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}}
    })
}

fn gpu_job(name: &str, parallelism: i32, annotations: BTreeMap<String, String>) -> Job {
    let job = json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [gpu_container()]}}
        }
    });
    serde_json::from_value(job).unwrap_or_default()
}

fn gpu_pod(name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"restartPolicy": "Never", "containers": [gpu_container()]}
    }))
    .unwrap_or_default()
}

async fn create_job(env: &Env, ns: &str, job: Job) -> anyhow::Result<()> {
    Api::<Job>::namespaced(env.client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
}

/// Waits until the Job has `count` pods, all bound to a node.
async fn bound_pods_of_job(
    env: &Env,
    ns: &str,
    job: &str,
    count: usize,
) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let selector = format!("job-name={job}");
    wait::until(
        &format!("{count} bound pods of Job {ns}/{job}"),
        WAIT,
        || async {
            let list = pods.list(&ListParams::default().labels(&selector)).await?;
            let bound = list.items.iter().filter(|p| node_of(p).is_some()).count();
            Ok((list.items.len() == count && bound == count).then_some(list.items))
        },
    )
    .await
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn has_provider_toleration(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|tolerations| {
            tolerations.iter().any(|t| {
                t.key.as_deref() == Some("virtual-kubelet.io/provider")
                    && t.value.as_deref() == Some("runpod")
                    && t.effect.as_deref() == Some("NoSchedule")
            })
        })
}
