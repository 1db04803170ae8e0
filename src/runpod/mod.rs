//! RunPod REST v2: typed client, error classification, rate limiting, GPU placement and the
//! pure translation of a Kubernetes container into a create request.

pub mod args;
pub(crate) mod catalogue;
pub mod catalogue_cache;
pub mod client;
pub mod config;
pub(crate) mod decode;
pub mod error;
pub mod limiter;
pub mod logs;
pub mod metrics;
pub mod model;
pub mod placement;
pub mod provider;
pub mod select;
pub(crate) mod translate;
pub(crate) mod volumes;
pub(crate) mod wrapper;
