//! `kubectl exec` and `kubectl port-forward` on the kubelet API: `POST /exec/{ns}/{pod}/{c}`
//! and `/portForward/{ns}/{pod}`, upgraded to SPDY/3.1 as a kubelet does, and carried to the
//! pod over the cloud's SSH (`ssh`). Everything that can fail before the upgrade (a WebSocket
//! try, exec turned off, a cloud without SSH, a pod without an SSH address, a refused key)
//! is an HTTP error kubectl prints; nothing waits longer than the SSH connect bound.

pub(crate) mod portforward;
pub(crate) mod remotecommand;
pub mod ssh;

use std::sync::Arc;

use crate::controller::cached;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;

use super::ApiState;
use super::spdy::session::Session;
use crate::controller::shell::{self, Refusal};
use crate::provider::Provider;
use remotecommand::{ExecBackend, ExecEnd, ExecIo, ExecOptions};
use ssh::{Expected, NodeKey, Target};

pub use crate::controller::node::exec_key::ExecAccess;

const SPDY: &str = "SPDY/3.1";

/// A refusal before the upgrade, as a `metav1.Status`: kubectl decodes an upgrade's error body
/// as one (a plain-text body reaches the user as an empty "Error from server").
fn refuse(status: StatusCode, message: String) -> Response {
    let reason = match status {
        StatusCode::BAD_REQUEST => "BadRequest",
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        StatusCode::NOT_IMPLEMENTED => "NotImplemented",
        _ => "InternalError",
    };
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": status.as_u16(),
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// 400 for anything but a SPDY/3.1 upgrade (kubectl 1.30+ tries a WebSocket first and falls
/// back on this answer), before any other work.
fn spdy_upgrade(headers: &HeaderMap) -> Result<(), Box<Response>> {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if upgrade.eq_ignore_ascii_case(SPDY) {
        Ok(())
    } else {
        Err(Box::new(refuse(
            StatusCode::BAD_REQUEST,
            format!(
                "runpod-kubelet: this kubelet speaks {SPDY} for exec and port-forward (asked for {:?})",
                if upgrade.is_empty() {
                    "no upgrade"
                } else {
                    upgrade
                }
            ),
        )))
    }
}

/// Every `X-Stream-Protocol-Version` value offered.
fn offered(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect()
}

/// How long reading an instance's host keys from the cloud's log may take (an empty log takes
/// The pod, its SSH address, the key and the host keys it must present, or the error kubectl
/// shows.
async fn target<P: Provider>(
    state: &ApiState<P>,
    namespace: &str,
    name: &str,
    container: Option<&str>,
) -> Result<(Arc<Pod>, Target, NodeKey, Expected), Box<Response>> {
    // This node's shell first: "exec is off" is the answer whatever the pod.
    shell::access(&state.shared).map_err(refusal)?;
    let pod = exec_pod(state, namespace, name, container)?;
    let reach = shell::reach(&state.shared, &pod, namespace, name)
        .await
        .map_err(refusal)?;
    Ok((pod, reach.target, reach.key, reach.expected))
}

fn refusal(refusal: Refusal) -> Box<Response> {
    Box::new(refuse(refusal.status, refusal.message))
}

/// The pod on this node, with the container asked for, that exposes what exec needs.
fn exec_pod<P: Provider>(
    state: &ApiState<P>,
    namespace: &str,
    name: &str,
    container: Option<&str>,
) -> Result<Arc<Pod>, Box<Response>> {
    let Some(pod) = cached::get(&state.pods, namespace, name) else {
        return Err(Box::new(refuse(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{name} is not on this node"),
        )));
    };
    if let Some(container) = container {
        let known = pod
            .spec
            .as_ref()
            .is_some_and(|s| s.containers.iter().any(|c| c.name == container));
        if !known {
            return Err(Box::new(refuse(
                StatusCode::NOT_FOUND,
                format!("pod {namespace}/{name} has no container {container:?}"),
            )));
        }
    }
    if runpod_contract::exposes_nothing(
        pod.metadata.annotations.as_ref(),
        state.shared.settings.admission.expose_no_ports,
    ) {
        return Err(Box::new(refuse(
            StatusCode::BAD_REQUEST,
            runpod_contract::exec_refused_for_none(namespace, name),
        )));
    }
    Ok(pod)
}

/// Answers 101 and runs `serve` on the upgraded connection.
fn switch<F, Fut>(mut request: Request, protocol: &'static str, serve: F) -> Response
where
    F: FnOnce(Session) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => serve(Session::start(TokioIo::new(upgraded))).await,
            Err(error) => tracing::debug!(%error, "exec upgrade failed"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(SPDY));
    headers.insert(
        "x-stream-protocol-version",
        HeaderValue::from_static(protocol),
    );
    response
}

/// The pod's command over SSH.
struct SshExec(ssh::Session);

impl ExecBackend for SshExec {
    async fn exec(self, options: ExecOptions, io: ExecIo) -> ExecEnd {
        self.0.exec(&options, io).await
    }
}

pub(super) async fn exec<P: Provider>(
    State(state): State<Arc<ApiState<P>>>,
    Path((namespace, name, container)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    if let Err(response) = spdy_upgrade(request.headers()) {
        return *response;
    }
    let options = match ExecOptions::from_query(request.uri().query().unwrap_or_default()) {
        Ok(options) => options,
        Err(message) => return refuse(StatusCode::BAD_REQUEST, message),
    };
    let offers = offered(request.headers());
    let protocol = if offers.is_empty() {
        "channel.k8s.io"
    } else {
        match remotecommand::negotiate(&offers) {
            Some(protocol) => protocol,
            None => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    format!(
                        "none of the offered protocols {offers:?} is supported (supported: {:?})",
                        remotecommand::PROTOCOLS
                    ),
                );
            }
        }
    };
    let (pod, target, key, expected) =
        match target(&state, &namespace, &name, Some(&container)).await {
            Ok(found) => found,
            Err(response) => return *response,
        };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let session = match ssh::connect(&target, &uid, &key, &expected).await {
        Ok(session) => session,
        Err(error) => {
            return refuse(
                StatusCode::BAD_GATEWAY,
                format!("runpod-kubelet: pod {namespace}/{name}: {error}"),
            );
        }
    };
    tracing::info!(%namespace, pod = %name, tty = options.tty, "exec");
    switch(request, protocol, move |spdy| {
        remotecommand::serve(spdy, protocol, options, SshExec(session))
    })
}

/// Opens forwarded connections as channels of one SSH connection (reconnecting if it drops),
/// not a handshake each: browsers open many at once, and sshd limits unauthenticated starts.
#[derive(Clone)]
struct SshForwarder {
    target: Target,
    uid: String,
    key: NodeKey,
    expected: Expected,
    connection: Arc<tokio::sync::Mutex<Arc<ssh::Session>>>,
}

impl portforward::Forwarder for SshForwarder {
    async fn connect(&self, port: u16) -> Result<Box<dyn portforward::Connection>, String> {
        let session = {
            let mut current = self.connection.lock().await;
            if current.is_closed() {
                let fresh = ssh::connect(&self.target, &self.uid, &self.key, &self.expected)
                    .await
                    .map_err(|e| e.to_string())?;
                *current = Arc::new(fresh);
            }
            current.clone()
        };
        session.forward(port).await.map_err(|e| e.to_string())
    }
}

pub(super) async fn port_forward<P: Provider>(
    State(state): State<Arc<ApiState<P>>>,
    Path((namespace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    if let Err(response) = spdy_upgrade(request.headers()) {
        return *response;
    }
    let offers = offered(request.headers());
    if !offers.is_empty()
        && !offers
            .iter()
            .flat_map(|o| o.split(','))
            .any(|o| o.trim() == portforward::PROTOCOL)
    {
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "none of the offered protocols {offers:?} is supported (supported: [\"{}\"])",
                portforward::PROTOCOL
            ),
        );
    }
    let (pod, target, key, expected) = match target(&state, &namespace, &name, None).await {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    // The connection up front, so a refused key or a missing sshd is an error kubectl shows
    // at once rather than on the first forwarded connection.
    let connection = match ssh::connect(&target, &uid, &key, &expected).await {
        Ok(connection) => connection,
        Err(error) => {
            return refuse(
                StatusCode::BAD_GATEWAY,
                format!("runpod-kubelet: pod {namespace}/{name}: {error}"),
            );
        }
    };
    tracing::info!(%namespace, pod = %name, "port-forward");
    let forwarder = SshForwarder {
        target,
        uid,
        key,
        expected,
        connection: Arc::new(tokio::sync::Mutex::new(Arc::new(connection))),
    };
    switch(request, portforward::PROTOCOL, move |spdy| {
        portforward::serve(spdy, forwarder)
    })
}

pub(super) async fn attach() -> Response {
    refuse(
        StatusCode::NOT_IMPLEMENTED,
        "runpod-kubelet: kubectl attach is not supported (the container's own console is the cloud's); kubectl exec works: kubectl exec -it POD -- sh".to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41, item 5: the record on the pod survives a restart (a new, empty cache still
    /// finds it), and a replacement instance's keys are read anew rather than the old ones'
    /// being demanded of it.
    #[test]
    fn only_spdy_upgrades_pass() {
        let mut headers = HeaderMap::new();
        assert!(spdy_upgrade(&headers).is_err());
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        let refused = *spdy_upgrade(&headers).unwrap_err();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        headers.insert(header::UPGRADE, HeaderValue::from_static("spdy/3.1"));
        assert!(spdy_upgrade(&headers).is_ok());
    }

    #[test]
    fn every_offered_version_is_read() {
        let mut headers = HeaderMap::new();
        headers.append(
            "x-stream-protocol-version",
            HeaderValue::from_static("v4.channel.k8s.io"),
        );
        headers.append(
            "x-stream-protocol-version",
            HeaderValue::from_static("v3.channel.k8s.io"),
        );
        assert_eq!(
            offered(&headers),
            ["v4.channel.k8s.io", "v3.channel.k8s.io"]
        );
    }
}
