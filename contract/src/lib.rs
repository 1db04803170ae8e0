//! The contract of runpod-kubelet, shared by the webhook, the controller and every cloud client:
//! annotation and label names with their parsers, the pod view admission reads, the opt-in and
//! "can this pod run remotely" rules, and the container environment as Kubernetes builds it.
//! Pure code only, so linking it costs no HTTP stack.

mod annotations;
pub mod budget;
pub mod checks;
pub mod config;
pub mod env;
pub mod gpus;
pub mod interruptible;
pub mod names;
pub mod network;
pub mod pod;
pub mod policy;
pub mod provider;
pub mod quantity;
pub mod teams;
pub mod vastai;
pub mod volumes;

#[cfg(test)]
mod test_support;

pub use annotations::*;
