//! Talking to the cloud for all pods at once: the list poller (snapshots, API health), the
//! gate every cloud call passes (fence and drain marker), orphan collection and billing.

pub mod billing;
pub mod gate;
pub mod gc;
pub mod poller;
