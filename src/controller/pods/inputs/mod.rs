//! What a pod brings to its cloud instance besides the container: environment, mounted files
//! and registry credentials, read from the pod and the objects it refers to.

pub(crate) mod env;
pub(crate) mod pull_secrets;
pub(crate) mod volumes;
