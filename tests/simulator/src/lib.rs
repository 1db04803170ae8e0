//! A RunPod REST v2 simulator: same paths, shapes and status codes as `openapi-v2.json`, with
//! fault injection and a ledger of every pod ever created.
//!
//! RunPod cannot be reached from CI, so the project's RunPod client is tested against this
//! server. It follows the vendored spec and the pitfalls in `api-notes.md` (capacity 400s,
//! create-then-500, lagging lists, RUNNING before ports, rate-limit headers), and
//! [`contract::SpecValidator`] checks every recorded response against the spec.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use runpod_simulator::{Simulator, scenario::Scenario};
//! let sim = Simulator::start(Scenario::default(), Some("key".into())).await?;
//! let url = format!("{}/v2/pods", sim.base_url());
//! # let _ = url;
//! sim.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod contract;
pub mod scenario;

mod catalog;
mod control;
mod create;
mod default_catalog;
mod exchange;
mod faults;
mod ledger;
mod lifecycle;
mod logs;
mod pod_api;
mod pods;
mod process;
mod query;
mod ratelimit;
mod reply;
mod routes;
mod server;
mod ssh;
mod ssh_forward;
mod state;
mod timefmt;
mod volumes;

pub use exchange::{Exchange, Operation};
pub use faults::{Effect, Fault, Match};
pub use ledger::{LedgerEntry, duplicate_names, live_pods};
pub use pods::{PodStatus, SIM_CPU_UTIL, SIM_GPU_MEM_UTIL, SIM_GPU_UTIL, SIM_MEM_UTIL};
pub use server::{Simulator, SimulatorHandle};
pub use volumes::VolumeEntry;
