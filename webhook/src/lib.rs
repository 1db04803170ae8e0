//! The runpod-kubelet admission webhook: the annotation contract shared with the controller, the
//! pure admission policy, and the HTTPS server that applies it.

// What another crate does not use is `pub(crate)`: `pub` says someone outside depends on it.
#![warn(unreachable_pub)]

pub mod admission;
pub mod cluster;
pub mod metrics;
pub mod policy;
pub mod registration;
pub mod review;
pub mod serve;
pub mod server;

/// The contract and the pod view live in `runpod-contract` (the controller and the clouds link it
/// without this server); re-exported so the webhook's paths stay as they were.
pub use runpod_contract as contract;
pub use runpod_contract::pod;
