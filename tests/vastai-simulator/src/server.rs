//! Starting and stopping the simulator, and the handle tests use to inspect and steer it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::faults::Fault;
use crate::instance::{Instance, Status};
use crate::ledger::LedgerEntry;
use crate::ratelimit::Route;
use crate::routes;
use crate::scenario::{OfferSpec, Scenario};
use crate::state::Shared;

/// How often billing advances while nobody calls.
const TICK: Duration = Duration::from_millis(50);

/// The Vast.ai simulator.
#[derive(Debug)]
pub struct VastSimulator;

impl VastSimulator {
    /// Binds 127.0.0.1:0 and serves in a background task until the handle is dropped or shut
    /// down. `api_key`: `None` accepts any key, `Some` only that one.
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
        run(listener, Arc::new(Shared::new(scenario, api_key)), shutdown).await
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
            while !shared.is_shutting_down() {
                interval.tick().await;
                shared.with_world(|_| ());
            }
        }
    });
    let result = axum::serve(listener, routes::router(shared.clone()))
        .with_graceful_shutdown(shutdown)
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
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the server root; clients append `/api/v0/...`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every instance ever created, in id order, with its bill so far.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        self.shared.ledger()
    }

    /// Ledger entries carrying `label`.
    pub fn instances_labelled(&self, label: &str) -> Vec<LedgerEntry> {
        self.ledger()
            .into_iter()
            .filter(|entry| entry.label.as_deref() == Some(label))
            .collect()
    }

    /// Requests `route` received after authentication (rate-limited ones included).
    pub fn requests(&self, route: Route) -> u64 {
        self.shared
            .with_world(|world| world.counts.get(&route).copied().unwrap_or(0))
    }

    /// Requests to `route` refused with 429.
    pub fn rate_limited(&self, route: Route) -> u64 {
        self.shared
            .with_world(|world| world.limited.get(&route).copied().unwrap_or(0))
    }

    /// Adds a fault rule after the existing ones; an invalid rule is ignored with a warning.
    pub fn inject(&self, fault: Fault) {
        if let Err(problem) = fault.validate() {
            tracing::warn!(%problem, "vastai simulator: fault ignored");
            return;
        }
        self.shared.with_world(|world| world.faults.push(fault));
    }

    pub fn clear_faults(&self) {
        self.shared.with_world(|world| world.faults.clear());
    }

    /// Forces an instance into `status` (`offline`, `unknown`, `exited`, `stopped`...); false
    /// when it is unknown or destroyed.
    pub fn set_status(&self, id: u64, status: Status) -> bool {
        self.with_live(id, |instance| instance.forced = Some(status))
    }

    /// Appends a container log line; false when the instance is unknown or destroyed.
    pub fn push_log(&self, id: u64, line: &str) -> bool {
        self.with_live(id, |instance| instance.logs.push(line.to_owned()))
    }

    fn with_live(&self, id: u64, change: impl FnOnce(&mut Instance)) -> bool {
        self.shared.with_world(|world| {
            world
                .instances
                .get_mut(&id)
                .filter(|instance| instance.destroyed.is_none())
                .map(change)
                .is_some()
        })
    }

    /// Puts an offer on the market (replacing one with the same id).
    pub fn add_offer(&self, offer: OfferSpec) {
        self.shared.with_world(|world| {
            world.gone.remove(&offer.id);
            world.offers.insert(offer.id, offer);
        });
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
