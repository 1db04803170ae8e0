//! What a pod brings to its cloud instance besides the container: environment, mounted files
//! and registry credentials, read from the pod and the objects it refers to.

pub mod env;
pub mod pull_secrets;
pub mod volumes;
