//! The one gate every cloud call passes: the leader fence (no call starts once the lease may be
//! someone else's) and the drain marker (nothing new is created on a node being drained).
//!
//! `runpod-kubelet controller drain` annotates the node with `runpod.io/draining: <token>`. The
//! leader closes the create gate as soon as it sees the marker (or the node is gone), waits for
//! creates already under way to return, and answers with `runpod.io/drain-acknowledged: <token>`;
//! from then on it creates nothing, so what drain terminates is never created again. The gate
//! starts closed until the node has been seen once.

use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use runpod_contract::{DRAIN_ACK_ANNOTATION, DRAINING_ANNOTATION};
use serde_json::json;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::controller::leader::Fence;
use crate::provider::{
    CloudName, Constraints, Ends, FinalLog, Instance, LogEntries, LogOptions, NetworkVolume,
    PriceSheet, Provider, ProviderError, ProvisionError, ProvisionRequest, Provisioned,
    VolumeRequest,
};

/// Whether creates are allowed, from the node as last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DrainState {
    /// The node has not been seen yet.
    Unknown,
    Open,
    /// Drained, with the token drain wrote.
    Draining(String),
    /// The node was deleted (drain's last step): nothing can run here any more.
    NodeGone,
}

/// The drain state a node (or its absence) means.
pub(crate) fn drain_state(node: Option<&Node>) -> DrainState {
    let Some(node) = node else {
        return DrainState::NodeGone;
    };
    match node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DRAINING_ANNOTATION))
    {
        Some(token) => DrainState::Draining(token.clone()),
        None => DrainState::Open,
    }
}

#[derive(Debug)]
struct GateState {
    drain: DrainState,
    creates_in_flight: usize,
}

/// Shared by the gated provider and the node watcher.
#[derive(Debug)]
pub(crate) struct Gate {
    fence: Fence,
    state: Mutex<GateState>,
    idle: Notify,
}

impl Gate {
    pub(crate) fn new(fence: Fence) -> Arc<Gate> {
        Arc::new(Gate {
            fence,
            state: Mutex::new(GateState {
                drain: DrainState::Unknown,
                creates_in_flight: 0,
            }),
            idle: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub(crate) fn fence(&self) -> &Fence {
        &self.fence
    }

    pub(crate) fn set_drain(&self, drain: DrainState) {
        self.lock().drain = drain;
    }

    pub(crate) fn drain(&self) -> DrainState {
        self.lock().drain.clone()
    }

    /// Admits one create, or says why not. Checked and counted under one lock, so that once
    /// the gate is closed the count can only go down.
    fn begin_create(self: &Arc<Self>, noun: &str) -> Result<CreatePermit, String> {
        if !self.fence.is_valid() {
            return Err("not the leader (lease not renewed): nothing is created".into());
        }
        let mut state = self.lock();
        match &state.drain {
            DrainState::Open => {
                state.creates_in_flight += 1;
                Ok(CreatePermit(self.clone()))
            }
            DrainState::Unknown => Err("the virtual node has not been read yet".into()),
            DrainState::Draining(_) => Err(format!(
                "the virtual node is being drained ({DRAINING_ANNOTATION}): no {noun} is created"
            )),
            DrainState::NodeGone => Err(format!(
                "the virtual node was removed: no {noun} is created"
            )),
        }
    }

    /// Waits until no create is under way.
    pub(crate) async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.lock().creates_in_flight == 0 {
                return;
            }
            notified.await;
        }
    }

    fn check_fence(&self) -> Result<(), ProviderError> {
        if self.fence.is_valid() {
            Ok(())
        } else {
            Err(ProviderError::Unavailable(
                "not the leader (lease not renewed): no call to the cloud".into(),
            ))
        }
    }
}

/// A create under way; dropping it (completion or cancellation) counts it out.
struct CreatePermit(Arc<Gate>);

impl Drop for CreatePermit {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.creates_in_flight = state.creates_in_flight.saturating_sub(1);
        drop(state);
        self.0.idle.notify_waiters();
    }
}

/// A provider whose every call passes the gate first.
pub(crate) struct Gated<P> {
    inner: Arc<P>,
    gate: Arc<Gate>,
}

impl<P> Gated<P> {
    pub(crate) fn new(inner: Arc<P>, gate: Arc<Gate>) -> Gated<P> {
        Gated { inner, gate }
    }
}

impl<P: Provider> Provider for Gated<P> {
    fn id_annotation(&self) -> &'static str {
        self.inner.id_annotation()
    }

    fn read_lag(&self) -> std::time::Duration {
        self.inner.read_lag()
    }

    fn cloud(&self) -> CloudName {
        self.inner.cloud()
    }

    fn shell_access(&self) -> crate::provider::ShellAccess {
        self.inner.shell_access()
    }

    fn runs_post_start_hooks(&self) -> bool {
        self.inner.runs_post_start_hooks()
    }

    fn accept_shell_key(&self, public_key: String) {
        self.inner.accept_shell_key(public_key);
    }

    fn endpoint(&self, instance_id: &str, port: &runpod_contract::PortSpec) -> String {
        self.inner.endpoint(instance_id, port)
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        self.gate.check_fence()?;
        self.inner.list().await
    }

    async fn lookup(&self, id: &str) -> Result<Option<Instance>, ProviderError> {
        self.gate.check_fence()?;
        self.inner.lookup(id).await
    }

    fn constraints(&self, pod: &Pod) -> Result<Constraints, String> {
        self.inner.constraints(pod)
    }

    async fn provision(
        &self,
        request: ProvisionRequest<'_>,
    ) -> Result<Provisioned, ProvisionError> {
        let _permit = self
            .gate
            .begin_create(self.inner.instance_noun())
            .map_err(ProvisionError::NoCandidates)?;
        self.inner.provision(request).await
    }

    async fn stop(&self, id: &str) -> Result<bool, ProviderError> {
        self.gate.check_fence()?;
        self.inner.stop(id).await
    }

    async fn restart(&self, id: &str) -> Result<bool, ProviderError> {
        self.gate.check_fence()?;
        self.inner.restart(id).await
    }

    async fn terminate(&self, id: &str, ends: Ends) -> Result<(), ProviderError> {
        self.gate.check_fence()?;
        self.inner.terminate(id, ends).await
    }

    async fn final_log(&self, id: &str) -> Result<FinalLog, ProviderError> {
        self.gate.check_fence()?;
        self.inner.final_log(id).await
    }

    /// Reading a log costs nothing and changes nothing: not gated.
    fn logs(&self, id: &str, options: LogOptions) -> LogEntries {
        self.inner.logs(id, options)
    }

    /// A read of the log too: not gated.
    async fn init_progress(
        &self,
        id: &str,
    ) -> Result<crate::provider::InitProgress, ProviderError> {
        self.inner.init_progress(id).await
    }

    /// A read of the log too: not gated.
    async fn ssh_host_keys(&self, id: &str) -> Result<Vec<String>, ProviderError> {
        self.inner.ssh_host_keys(id).await
    }

    /// A read, like `lookup`: not gated.
    async fn origin(
        &self,
        id: &str,
    ) -> Result<Option<crate::provider::InstanceOrigin>, ProviderError> {
        self.inner.origin(id).await
    }

    fn price_sheet(&self) -> PriceSheet {
        self.inner.price_sheet()
    }

    fn network_volumes(&self) -> bool {
        self.inner.network_volumes()
    }

    async fn default_volume_datacenter(&self, wanted: &[String]) -> Option<String> {
        self.inner.default_volume_datacenter(wanted).await
    }

    async fn list_volumes(&self) -> Result<Vec<NetworkVolume>, ProviderError> {
        self.gate.check_fence()?;
        self.inner.list_volumes().await
    }

    /// A create like an instance's: a draining node makes none, and its drain waits for one
    /// under way.
    async fn create_volume(&self, request: &VolumeRequest) -> Result<NetworkVolume, ProviderError> {
        let _permit = self
            .gate
            .begin_create("network volume")
            .map_err(ProviderError::Unavailable)?;
        self.inner.create_volume(request).await
    }

    async fn resize_volume(&self, id: &str, size_gb: u32) -> Result<NetworkVolume, ProviderError> {
        self.gate.check_fence()?;
        self.inner.resize_volume(id, size_gb).await
    }

    async fn delete_volume(&self, id: &str) -> Result<bool, ProviderError> {
        self.gate.check_fence()?;
        self.inner.delete_volume(id).await
    }
}

/// Follows the node: closes the create gate when it is drained or removed, and acknowledges a
/// drain once no create is under way.
pub(crate) async fn watch_node(nodes: Api<Node>, name: String, gate: Arc<Gate>) {
    let mut stream = Box::pin(watcher::watch_object(nodes.clone(), &name).default_backoff());
    let mut acknowledged: Option<String> = None;
    while let Some(event) = stream.next().await {
        let node = match event {
            Ok(node) => node,
            Err(error) => {
                warn!(%error, "watching the virtual node failed");
                continue;
            }
        };
        let state = drain_state(node.as_ref());
        if state != gate.drain() {
            info!(node = %name, state = ?state, "node drain state");
        }
        gate.set_drain(state.clone());
        let DrainState::Draining(token) = state else {
            acknowledged = None;
            continue;
        };
        let already = node
            .as_ref()
            .and_then(|n| n.metadata.annotations.as_ref())
            .and_then(|a| a.get(DRAIN_ACK_ANNOTATION))
            == Some(&token);
        if already || acknowledged.as_ref() == Some(&token) {
            continue;
        }
        gate.wait_idle().await;
        if !gate.fence().is_valid() {
            continue;
        }
        let patch = json!({"metadata": {"annotations": {DRAIN_ACK_ANNOTATION: token}}});
        match nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(node = %name, "drain acknowledged: no create is under way or will start");
                acknowledged = Some(token);
            }
            Err(error) => warn!(%error, "acknowledging the drain failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn node(annotations: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn a_marker_or_a_missing_node_closes_the_gate() {
        assert_eq!(drain_state(Some(&node(&[]))), DrainState::Open);
        assert_eq!(
            drain_state(Some(&node(&[(DRAINING_ANNOTATION, "t1")]))),
            DrainState::Draining("t1".into())
        );
        assert_eq!(drain_state(None), DrainState::NodeGone);
    }

    #[tokio::test]
    async fn creates_wait_for_the_node_and_stop_at_a_drain() {
        let gate = Gate::new(Fence::open());
        assert!(
            gate.begin_create("RunPod pod").is_err(),
            "closed until the node is seen"
        );
        gate.set_drain(DrainState::Open);
        let permit = gate.begin_create("RunPod pod").unwrap();
        gate.set_drain(DrainState::Draining("t".into()));
        let refused = gate.begin_create("RunPod pod").err().unwrap();
        assert!(refused.contains("drained"), "{refused}");
        // The create under way holds the drain acknowledgement back until it returns.
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.wait_idle().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(permit);
        waiting.await.unwrap();
    }

    #[tokio::test]
    async fn an_invalid_fence_refuses_every_call() {
        let (tx, rx) = tokio::sync::watch::channel(None);
        drop(tx);
        let gate = Gate::new(Fence::elected(rx));
        gate.set_drain(DrainState::Open);
        assert!(gate.begin_create("RunPod pod").is_err());
        assert!(gate.check_fence().is_err());
    }
}
