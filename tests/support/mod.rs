//! Shared harness of the end-to-end tests: a real control plane, the webhook as a process, fake
//! nodes that keep their Leases, and polling helpers.

#![allow(dead_code)]

pub mod chart;
pub mod control_plane;
pub mod controller;
pub mod harness;
pub mod kubelet_client;
pub mod net;
pub mod nodes;
pub mod pod_runner;
pub mod pods;
pub mod proxy;
pub mod storms;
pub mod wait;
pub mod webhook;
