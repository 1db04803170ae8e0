//! The cloud API's health as the node shows it: the poller sets it, the node's condition and
//! taint follow it, and creates wait while it is down.

/// Whether the cloud's API can be used right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiHealth {
    Available,
    /// Reason (CamelCase) and message.
    Unavailable {
        reason: String,
        message: String,
    },
}
