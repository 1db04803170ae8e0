//! The provider controller (a virtual kubelet): registers the virtual node and keeps its Lease
//! and status, and runs one cloud instance per Kubernetes pod bound to it. The cloud sits
//! behind the `provider::Provider` seam; RunPod is `runpod_provider`.

pub mod adoption;
pub(crate) mod budget;
pub(crate) mod cached;
pub(crate) mod clock;
pub(crate) mod cloud;
pub mod context;
pub(crate) mod eligibility;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod kubelet_api;
pub mod leader;
pub(crate) mod memory;
pub mod metrics;
pub mod network;
pub mod node;
pub mod offload;
pub(crate) mod ops;
pub(crate) mod pods;
pub(crate) mod probes;
pub(crate) mod shell;
pub(crate) mod storage;
pub mod usage;

use std::sync::Arc;
use std::time::Duration;

use cached::CachedPod;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::provider::Provider;
use cloud::gate::{self, Gate, Gated};
use context::{Settings, Shared};
use leader::{ElectionConfig, Fence};
use metrics::ControllerMetrics;
use node::health::ApiHealth;
use node::presence::{self, Presence};
use node::{NodeConfig, heartbeat};

/// Everything `run` needs besides the provider.
pub struct Runtime {
    pub client: kube::Client,
    pub node: NodeConfig,
    pub settings: Settings,
    pub kubelet_listener: TcpListener,
    pub kubelet_tls: Arc<rustls::ServerConfig>,
    pub metrics_listener: Option<TcpListener>,
    pub registry: prometheus_client::registry::Registry,
    /// `/metrics` also on the plain listener (`--metrics-plain`); it is always on the kubelet
    /// API, over TLS, authenticated and authorized as `nodes/metrics`.
    pub plain_metrics: bool,
    pub metrics: Arc<ControllerMetrics>,
    pub concurrency: u16,
    /// Job offloading: when waiting `delayed` pods move to the virtual node.
    pub offload: offload::plan::OffloadSettings,
    /// `None`: no election (`--leader-elect=false`), this process leads at once.
    pub election: Option<ElectionConfig>,
}

/// What the leader runs with.
struct Leading {
    client: kube::Client,
    node: NodeConfig,
    settings: Settings,
    kubelet_listener: TcpListener,
    kubelet_tls: Arc<rustls::ServerConfig>,
    registry: Arc<prometheus_client::registry::Registry>,
    metrics: Arc<ControllerMetrics>,
    concurrency: u16,
    offload: offload::plan::OffloadSettings,
    readiness: watch::Sender<ops::LeaderReadiness>,
}

/// Runs the controller until `shutdown` resolves: `/healthz`, `/readyz` and `/metrics` on every
/// replica, everything else only while this replica leads. Returns an error when leadership is
/// lost (every leader task has been stopped by then; the process should exit non-zero).
pub async fn run<P: Provider>(
    provider: Arc<P>,
    runtime: Runtime,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let Runtime {
        client,
        node,
        settings,
        kubelet_listener,
        kubelet_tls,
        metrics_listener,
        registry,
        plain_metrics,
        metrics,
        concurrency,
        offload,
        election,
    } = runtime;
    let registry = Arc::new(registry);
    let (readiness, readiness_rx) = watch::channel(None);
    let ops = metrics_listener.map(|listener| {
        tokio::spawn(ops::serve(
            listener,
            plain_metrics.then(|| registry.clone()),
            readiness_rx,
        ))
    });
    let leading = Leading {
        client: client.clone(),
        node,
        settings,
        kubelet_listener,
        kubelet_tls,
        registry,
        metrics: metrics.clone(),
        concurrency,
        offload,
        readiness,
    };
    let result = match election {
        None => {
            metrics.leader.set(1);
            lead(provider, leading, Fence::open(), shutdown).await
        }
        Some(config) => leader::run_elected(
            client,
            config,
            metrics.leader.clone(),
            shutdown,
            move |fence, stop| {
                lead(provider, leading, fence, async move {
                    let _ = stop.await;
                })
            },
        )
        .await
        .map_err(anyhow::Error::from),
    };
    if let Some(ops) = ops {
        ops.abort();
    }
    result
}

/// The leader's work: the node, its Lease, the RunPod list loop and GC, the pods and the
/// kubelet API. Every cloud call passes the gate (fence and drain marker).
async fn lead<P: Provider>(
    provider: Arc<P>,
    leading: Leading,
    fence: Fence,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let Leading {
        client,
        node,
        settings,
        kubelet_listener,
        kubelet_tls,
        registry,
        metrics,
        concurrency,
        offload,
        readiness,
    } = leading;
    let gate = Gate::new(fence.clone());
    let provider = Arc::new(Gated::new(provider, gate.clone()));
    let nodes: Api<Node> = Api::all(client.clone());
    let registered = node::register(&nodes, &node).await?;
    let presence = Presence::new(registered.metadata.uid);
    info!(node = %node.name, address = %node.internal_ip, port = node.kubelet_port, "virtual node registered");

    let (health_tx, health_rx) = watch::channel(ApiHealth::Available);
    let (snapshot_tx, snapshot_rx) = watch::channel(None);
    let shared = Arc::new(Shared::new(
        client.clone(),
        provider.clone(),
        settings.clone(),
        snapshot_rx,
        health_tx.clone(),
        metrics.clone(),
    ));

    let mut tasks = tokio::task::JoinSet::new();
    // The controller wants a shutdown future that is also Sync.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tasks.spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(());
    });
    spawn_node_tasks(
        &mut tasks,
        NodeTasks {
            client: &client,
            nodes: &nodes,
            node: &node,
            gate,
            presence: &presence,
            health: health_rx,
            metrics: &metrics,
        },
        provider.clone(),
    );

    let (controller, tick_tx) = pod_controller(&client, &node.name, concurrency, stop_rx);
    let store = controller.store();

    tasks.spawn(cloud::poller::run(
        shared.clone(),
        store.clone(),
        snapshot_tx,
        health_tx,
        tick_tx.clone(),
    ));
    tasks.spawn(cloud::billing::run(shared.clone(), store.clone()));
    tasks.spawn(probes::run(shared.clone(), store.clone(), tick_tx));
    tasks.spawn(budget::sync::run(shared.clone(), store.clone()));
    tasks.spawn(kubelet_api::serve(
        kubelet_listener,
        kubelet_tls,
        shared.clone(),
        store.clone(),
        registry,
    ));
    tasks.spawn(offload::run(shared.clone(), offload, fence.clone()));
    tasks.spawn(network::run(shared.clone(), store.clone()));
    tasks.spawn(storage::run(shared.clone()));
    if let Some(owner) = settings.owner_deployment.clone() {
        tasks.spawn(node::removal::hold(
            client.clone(),
            owner,
            provider.clone(),
            drain_config(&settings),
        ));
    }
    readiness.send_replace(Some(ops::leader_ready(
        store.clone(),
        shared.clone(),
        presence.subscribe(),
    )));

    reconcile_pods(controller, fence, metrics, shared).await;
    tasks.abort_all();
    Ok(())
}

/// What the node's own tasks need.
struct NodeTasks<'a> {
    client: &'a kube::Client,
    nodes: &'a Api<Node>,
    node: &'a NodeConfig,
    gate: Arc<Gate>,
    presence: &'a Arc<Presence>,
    health: watch::Receiver<ApiHealth>,
    metrics: &'a Arc<ControllerMetrics>,
}

/// The node's own tasks: the fence's watch of the node, its presence, its Lease and its status.
fn spawn_node_tasks<P: Provider>(
    tasks: &mut tokio::task::JoinSet<()>,
    with: NodeTasks<'_>,
    provider: Arc<Gated<P>>,
) {
    tasks.spawn(gate::watch_node(
        with.nodes.clone(),
        with.node.name.clone(),
        with.gate,
    ));
    tasks.spawn(presence::keep(
        with.nodes.clone(),
        with.node.clone(),
        with.presence.clone(),
    ));
    tasks.spawn(heartbeat::lease_loop(
        with.client.clone(),
        with.node.name.clone(),
        with.presence.subscribe(),
        with.metrics.clone(),
    ));
    tasks.spawn(heartbeat::node_status_loop(
        with.nodes.clone(),
        with.node.clone(),
        with.health,
        provider,
        with.presence.clone(),
        with.metrics.clone(),
    ));
}

/// Reconciles the node's pods until shutdown; no pod write starts once the lease may be
/// someone else's.
async fn reconcile_pods<P: Provider>(
    controller: Controller<CachedPod>,
    fence: Fence,
    metrics: Arc<ControllerMetrics>,
    shared: Arc<Shared<Gated<P>>>,
) {
    let errors = metrics;
    controller
        .run(
            move |pod, ctx| {
                let fence = fence.clone();
                async move {
                    // No pod write starts once the lease may be someone else's.
                    if !fence.is_valid() {
                        return Ok(Action::await_change());
                    }
                    pods::reconcile(pod, ctx).await
                }
            },
            move |_pod, error: &pods::ReconcileError, _ctx| {
                warn!(error = %error, kind = error.metric_label(), "reconcile failed; retrying");
                errors
                    .reconcile_errors
                    .get_or_create(&metrics::KindLabel {
                        kind: error.metric_label(),
                    })
                    .inc();
                Action::requeue(Duration::from_secs(5))
            },
            shared,
        )
        .for_each(|_| async {})
        .await;
}

/// The controller of the pods bound to node `name`, and the sender that asks it to reconcile
/// every pod (the poller's and the prober's trigger). It stops when `stop` fires.
fn pod_controller(
    client: &kube::Client,
    name: &str,
    concurrency: u16,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> (Controller<CachedPod>, mpsc::Sender<()>) {
    let pods: Api<CachedPod> = Api::all(client.clone());
    let watch_config = watcher::Config::default().fields(&format!("spec.nodeName={name}"));
    let (tick_tx, tick_rx) = mpsc::channel::<()>(1);
    let ticks =
        futures_util::stream::unfold(
            tick_rx,
            |mut rx| async move { rx.recv().await.map(|t| (t, rx)) },
        );
    // The cache keeps every pod of the node for as long as it is there, compactly (`cached`).
    let (reader, writer) = reflector::store();
    let watched = watcher(pods, watch_config)
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let controller = Controller::for_stream(watched, reader)
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .reconcile_all_on(ticks)
        .graceful_shutdown_on(async move {
            let _ = stop.await;
        });
    (controller, tick_tx)
}

/// How the node's removal drains it (the owner Deployment's deletion holds until it has).
fn drain_config(settings: &Settings) -> node::drain::DrainConfig {
    node::drain::DrainConfig {
        node_name: settings.node_name.clone(),
        cluster_id: settings.cluster_id.clone(),
        timeout: settings.drain_timeout,
        poll_interval: Duration::from_secs(2),
        ack_wait: Duration::from_secs(60),
        create_settle: settings.create_settle,
        adoption_namespace: settings.adoption_namespace.clone(),
    }
}
