//! SPDY/3.1, the stream multiplexer a kubelet speaks for `kubectl exec` and `kubectl
//! port-forward` after an HTTP/1.1 upgrade (the apiserver forwards kubectl's connection as is).
//! `frame` reads and writes frames (pure), `session` runs one connection.

mod dictionary;
pub(crate) mod frame;
pub(crate) mod session;
