//! Writes the EndpointSlices that `slices` decides: a server-side apply of each one that
//! changed, a delete of each one no longer wanted, and now and then a sweep of every slice this
//! project manages (a previous leader's, a pod's that is gone). `discovery.k8s.io/v1` where the
//! apiserver serves it, else `v1beta1` (Kubernetes 1.20).

use std::collections::HashMap;
use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use tokio::time::Instant;

use super::slices::{MANAGED_BY, MANAGED_BY_LABEL};

/// How often every managed slice is listed to remove those nobody wants.
const SWEEP: Duration = Duration::from_secs(60);

/// A slice by namespace and name.
pub(super) type SliceKey = (String, String);

pub(super) struct Publisher {
    client: kube::Client,
    resource: ApiResource,
    applied: HashMap<SliceKey, serde_json::Value>,
    swept_at: Option<Instant>,
}

impl Publisher {
    /// Picks the EndpointSlice version the apiserver serves.
    pub(super) async fn new(client: kube::Client) -> Publisher {
        let v1 = resource("v1");
        let probe: Api<DynamicObject> = Api::all_with(client.clone(), &v1);
        let resource = match probe.list(&ListParams::default().limit(1)).await {
            Err(kube::Error::Api(status)) if status.code == 404 => resource("v1beta1"),
            _ => v1,
        };
        Publisher {
            client,
            resource,
            applied: HashMap::new(),
            // Not at once: a new leader's view of the node's pods may still be partial, and a
            // sweep now would delete the slices of pods it has not seen yet.
            swept_at: Some(Instant::now()),
        }
    }

    /// `discovery.k8s.io/VERSION`, for the slices' bodies.
    pub(super) fn api_version(&self) -> String {
        self.resource.api_version.clone()
    }

    /// What was last written for `key`.
    pub(super) fn applied(&self, key: &SliceKey) -> Option<&serde_json::Value> {
        self.applied.get(key)
    }

    /// Makes the managed slices `desired`.
    pub(super) async fn publish(&mut self, desired: HashMap<SliceKey, serde_json::Value>) {
        for (key, body) in &desired {
            if self.applied.get(key) == Some(body) {
                continue;
            }
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &key.0, &self.resource);
            let params = PatchParams::apply("runpod-kubelet").force();
            match api.patch(&key.1, &params, &Patch::Apply(body)).await {
                Ok(_) => {
                    self.applied.insert(key.clone(), body.clone());
                }
                Err(error) => {
                    tracing::warn!(namespace = %key.0, slice = %key.1, %error, "writing an EndpointSlice failed; retrying");
                }
            }
        }
        let gone: Vec<SliceKey> = self
            .applied
            .keys()
            .filter(|key| !desired.contains_key(*key))
            .cloned()
            .collect();
        for key in gone {
            if self.delete(&key).await {
                self.applied.remove(&key);
            }
        }
        if self.swept_at.is_none_or(|at| at.elapsed() >= SWEEP) {
            self.sweep(&desired).await;
        }
    }

    /// Deletes every managed slice that is not `desired`.
    async fn sweep(&mut self, desired: &HashMap<SliceKey, serde_json::Value>) {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &self.resource);
        let params = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
        let Ok(list) = api.list(&params).await else {
            return;
        };
        self.swept_at = Some(Instant::now());
        for slice in list.items {
            let (Some(namespace), Some(name)) = (slice.metadata.namespace, slice.metadata.name)
            else {
                continue;
            };
            let key = (namespace, name);
            if !desired.contains_key(&key) && self.delete(&key).await {
                self.applied.remove(&key);
            }
        }
    }

    async fn delete(&self, key: &SliceKey) -> bool {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.0, &self.resource);
        match api.delete(&key.1, &DeleteParams::default()).await {
            Ok(_) => true,
            Err(kube::Error::Api(status)) if status.code == 404 => true,
            Err(error) => {
                tracing::warn!(namespace = %key.0, slice = %key.1, %error, "deleting an EndpointSlice failed; retrying");
                false
            }
        }
    }
}

fn resource(version: &str) -> ApiResource {
    ApiResource {
        group: "discovery.k8s.io".into(),
        version: version.into(),
        api_version: format!("discovery.k8s.io/{version}"),
        kind: "EndpointSlice".into(),
        plural: "endpointslices".into(),
    }
}
