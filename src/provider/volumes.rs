//! Network volumes behind the seam: what a PersistentVolumeClaim of this project's
//! StorageClass becomes on a cloud that sells them (RunPod), and the one a pod mounts.

/// A cloud's network volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkVolume {
    pub id: String,
    /// Derived from the claim's UID: how a volume whose create answer was lost is found again.
    pub name: String,
    pub size_gb: u32,
    /// Where it is, and so where every pod mounting it runs.
    pub datacenter: String,
    pub tier: Option<String>,
}

/// What to create for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRequest {
    pub name: String,
    pub size_gb: u32,
    pub datacenter: String,
    pub tier: Option<String>,
}

/// The network volume a pod mounts, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    pub volume_id: String,
    /// The container's mountPath.
    pub path: String,
    pub datacenter: String,
}
