//! `kubectl exec` and `kubectl port-forward` on the kubelet API.

pub mod portforward;
pub mod remotecommand;
pub mod ssh;
