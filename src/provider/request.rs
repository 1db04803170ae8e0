//! What the controller hands a cloud for one pod: the pod, its resolved environment, the files
//! it mounts and its registry logins. Built by `controller::pods::inputs`, read by each cloud's
//! translation; neither side owns the other's types.

use k8s_openapi::api::core::v1::{Container, Pod};
pub(crate) use runpod_contract::env::ResolvedEnv;

use super::ProvisionError;

/// What the controller asks of the cloud for one pod.
#[derive(Debug, Clone)]
pub struct ProvisionRequest<'a> {
    pub pod: &'a Pod,
    pub env: &'a ResolvedEnv,
    /// What the cluster supplied for each init container, in the pod's order.
    pub init_env: &'a [ResolvedEnv],
    /// Files the container mounts (configMap, secret, downwardAPI, emptyDir).
    pub volumes: &'a Volumes,
    /// GPU types not to try for this pod (e.g. one that was placed outside its datacenters).
    pub excluded_gpu_types: &'a [String],
    /// The login of the pod's `imagePullSecrets` for its container's image registry, if one
    /// names it (resolved by the controller), for clouds that pull with it.
    pub pull_credential: Option<&'a PullCredential>,
    /// Machines not to place the pod on (where its or its owner's instance was lost lately),
    /// for clouds that let the buyer choose the machine.
    pub avoided_machines: &'a [String],
    /// The network volume the pod mounts (a claim of this project's StorageClass), which pins
    /// it to the volume's datacenter.
    pub network_volume: Option<&'a super::VolumeMount>,
}

impl<'a> ProvisionRequest<'a> {
    /// The pod's one container, or the refusal both clouds give a pod without one.
    pub fn container(&self) -> Result<&'a Container, ProvisionError> {
        self.pod
            .spec
            .as_ref()
            .and_then(|spec| spec.containers.first())
            .ok_or_else(|| ProvisionError::Rejected("the pod has no containers".to_owned()))
    }
}

/// One file the container must find at `path`.
#[derive(Clone, PartialEq, Eq)]
pub struct MountedFile {
    /// Absolute path in the container.
    pub path: String,
    pub content: Vec<u8>,
    /// Permission bits, e.g. `0o644`.
    pub mode: u32,
}

impl std::fmt::Debug for MountedFile {
    // Contents come from Secrets: never in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountedFile")
            .field("path", &self.path)
            .field("content", &format_args!("<{} bytes>", self.content.len()))
            .field("mode", &format_args!("{:o}", self.mode))
            .finish()
    }
}

/// Everything the container mounts, ready to be written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Volumes {
    pub files: Vec<MountedFile>,
    /// Mount points of emptyDir volumes and of volumes that resolved to no file.
    pub directories: Vec<String>,
    /// Mount paths deliberately not materialised (the service-account token), for an Event.
    pub skipped: Vec<String>,
    /// The ServiceAccount mount's files other than the token (`ca.crt`, `namespace`): every
    /// pod has them, and none needs them to run, so a cloud writes them where it writes files
    /// for this pod anyway and leaves them out where it cannot (never refusing a pod for them).
    pub service_account: Vec<MountedFile>,
    /// PersistentVolumeClaims the container mounts: (claim name, mount path). The controller
    /// turns one of this project's StorageClass into the instance's network volume.
    pub claims: Vec<(String, String)>,
}

impl Volumes {
    /// Nothing to write: the container can run without a prelude.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.directories.is_empty()
    }
}

/// One registry login. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct PullCredential {
    /// The registry host as the secret names it, normalised (`ghcr.io`, `docker.io`).
    pub registry: String,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for PullCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PullCredential({}@{}, <password redacted>)",
            self.username, self.registry
        )
    }
}
