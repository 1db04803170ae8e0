//! The `runpod-kubelet` library: the RunPod REST v2 and Vast.ai clients and the provider controller.
//! The binary in `main.rs` wires these to the command line.

// What another crate does not use is `pub(crate)`: `pub` says someone outside depends on it.
#![warn(unreachable_pub)]

pub mod controller;
pub mod flags;
pub mod http;
pub mod provider;
pub mod runpod;
pub mod vastai;
