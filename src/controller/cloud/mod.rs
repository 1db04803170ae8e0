//! Talking to the cloud for all pods at once: the list poller (snapshots, API health), the
//! gate every cloud call passes (fence and drain marker), and the usage watch.

pub mod billing;
pub mod gate;
pub mod gc;
pub mod poller;
pub mod usage;
