//! Talking to the cloud for all pods at once: the list poller (snapshots, API health), the
//! gate every cloud call passes (fence and drain marker), orphan collection and billing.

pub(crate) mod billing;
pub(crate) mod gate;
pub(crate) mod gc;
pub(crate) mod poller;
