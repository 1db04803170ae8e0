//! Vast.ai: the REST client (offer search, create from an offer, get, the paged v1 list,
//! destroy, logs), per-route pacing, error classification, and buying exactly one instance
//! per pod label.

pub mod args;
pub mod client;
pub mod error;
pub mod label;
pub mod limiter;
pub mod model;
pub mod placement;
pub mod prices;
pub mod provider;
pub mod select;
pub(crate) mod translate;
