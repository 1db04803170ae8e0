//! The runpod-kubelet admission webhook: the annotation contract shared with the controller, the
//! pure admission policy, and the HTTPS server that applies it.

pub mod admission;
pub mod cluster;
pub mod contract;
pub mod metrics;
pub mod pod;
pub mod policy;
pub mod registration;
pub mod review;
pub mod serve;
pub mod server;
