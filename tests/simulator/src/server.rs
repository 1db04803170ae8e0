//! Starting and stopping the simulator, and the handle tests use to inspect and steer it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::control;
use crate::exchange::Exchange;
use crate::faults::Fault;
use crate::ledger::LedgerEntry;
use crate::logs::LogSource;
use crate::pods::PodStatus;
use crate::routes;
use crate::scenario::Scenario;
use crate::state::Shared;

/// How often lifecycles are advanced for log followers (requests advance them themselves).
const TICK: Duration = Duration::from_millis(25);

/// The RunPod REST v2 simulator.
#[derive(Debug)]
pub struct Simulator;

impl Simulator {
    /// Binds 127.0.0.1:0 and serves in a background task until the handle is dropped or shut
    /// down. `api_key`: `None` accepts any bearer token, `Some` only that one.
    pub async fn start(
        scenario: Scenario,
        api_key: Option<String>,
    ) -> std::io::Result<SimulatorHandle> {
        scenario.validate().map_err(invalid)?;
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(scenario, api_key));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run(listener, shared.clone(), async move {
            let _ = stopped.await;
        }));
        Ok(SimulatorHandle {
            addr,
            shared,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// For the CLI: serves on an existing listener until `shutdown` resolves.
    pub async fn serve(
        listener: TcpListener,
        scenario: Scenario,
        api_key: Option<String>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        scenario.validate().map_err(invalid)?;
        let shared = Arc::new(Shared::new(scenario, api_key));
        run(listener, shared, shutdown).await
    }
}

fn invalid(error: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, error.to_string())
}

async fn run(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let ticker = tokio::spawn({
        let shared = shared.clone();
        async move {
            let mut interval = tokio::time::interval(TICK);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !shared.is_shutting_down() {
                interval.tick().await;
                shared.with_world(|_| ());
            }
        }
    });
    let app = routes::router(shared.clone());
    let stopping = shared.clone();
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            // Log streams end, so the graceful shutdown does not wait for them.
            stopping.begin_shutdown();
        })
        .await;
    shared.begin_shutdown();
    ticker.abort();
    result
}

/// A running simulator: its address, and inspection and control for tests.
#[derive(Debug)]
pub struct SimulatorHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl SimulatorHandle {
    /// The bound address (127.0.0.1 and an ephemeral port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the server root; clients append `/v2/...`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every pod ever created, in creation order.
    /// Every network volume ever created, with its bill so far.
    pub fn volumes(&self) -> Vec<crate::volumes::VolumeEntry> {
        self.shared.with_world(crate::state::World::volume_ledger)
    }

    pub fn ledger(&self) -> Vec<LedgerEntry> {
        control::ledger(&self.shared)
    }

    /// Every `/v2` request so far with its response.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.shared
            .with_world(|w| w.exchanges.iter().cloned().collect())
    }

    /// Adds a fault rule (after the existing ones). Rules with a non-error status are ignored
    /// with a warning.
    pub fn inject(&self, fault: Fault) {
        if let Err(problem) = fault.validate() {
            tracing::warn!(%problem, "runpod simulator: fault ignored");
            return;
        }
        self.shared.with_world(|w| w.faults.push(fault));
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        self.shared.with_world(|w| w.faults.clear());
    }

    /// Forces a pod into `status` now ("on command"); false if the pod is unknown or
    /// terminated. TERMINATED terminates it; RUNNING publishes ports after the ports delay.
    pub fn set_status(&self, pod_id: &str, status: PodStatus) -> bool {
        control::set_status(&self.shared, pod_id, status)
    }

    /// Appends a container log line; false if the pod is unknown or terminated.
    pub fn push_log(&self, pod_id: &str, line: &str) -> bool {
        control::push_log(&self.shared, pod_id, LogSource::Container, line)
    }

    /// Ledger entries with this name.
    pub fn pods_by_name(&self, name: &str) -> Vec<LedgerEntry> {
        self.ledger()
            .into_iter()
            .filter(|e| e.name == name)
            .collect()
    }

    /// Stops serving and waits (up to 5 s) for the server task to end.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl Drop for SimulatorHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
