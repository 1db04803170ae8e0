//! A Vast.ai REST simulator: the routes runpod-kubelet uses (offer search, create from an offer,
//! get, the paginated v1 list, destroy, logs through a result URL), with Vast.ai's pitfalls
//! (`../shared/vastai/api-notes.md`): offers that vanish between search and buy, create answers
//! lost after the instance was made, a list that lags, instances stuck in `loading` or
//! `exited` after start, per-route rate limits without `Retry-After`, storage billed while
//! stopped. A ledger keeps every instance ever created and what it cost.
//!
//! The server is strict where the real one is loose: unknown search fields, unknown create
//! fields and malformed values are refused, so a client bug shows up here and not on a bill.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use vastai_simulator::{Scenario, VastSimulator};
//! let sim = VastSimulator::start(Scenario::default(), Some("key".into())).await?;
//! let url = format!("{}/api/v0/bundles/", sim.base_url());
//! # let _ = url;
//! sim.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod control;
mod faults;
mod filter;
mod instance;
mod ledger;
mod logs;
mod market;
mod ratelimit;
mod reply;
mod routes;
mod scenario;
mod server;
mod state;

pub use faults::{Effect, Fault, Match};
pub use instance::Status;
pub use ledger::{LedgerEntry, duplicate_labels, live_instances};
pub use ratelimit::{Route, RouteLimit};
pub use scenario::{Behaviour, ImageRule, OfferSpec, RateLimits, Scenario};
pub use server::{SimulatorHandle, VastSimulator};
