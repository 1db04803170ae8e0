//! Network volumes (`/v2/network-volumes`): created in one data centre (10 to 4,096 GB,
//! `STANDARD` or `HIGH_PERFORMANCE`), grown but never shrunk, not deleted while a live pod
//! mounts one, billed per GB-month from create to delete. A pod's `mounts.network` names at
//! most one, which pins it to the volume's data centre.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::reply::Reply;
use crate::state::World;

/// USD per GB-month (RunPod's price under 1 TB); a month is 720 hours.
pub(crate) const PRICE_PER_GB_MONTH: f64 = 0.07;
const MONTH_HOURS: f64 = 720.0;
const MIN_GB: u64 = 10;
const MAX_GB: u64 = 4096;
const TIERS: [&str; 2] = ["STANDARD", "HIGH_PERFORMANCE"];

/// One network volume, alive or deleted.
#[derive(Debug, Clone)]
pub(crate) struct VolumeRecord {
    pub id: String,
    pub name: String,
    pub size: u64,
    pub data_center: String,
    pub tier: String,
    pub deleted: Option<Instant>,
    /// Size changes accepted (PATCH with a larger size).
    pub resizes: u32,
    /// GB-hours billed so far, to `last_billed`.
    pub gb_hours: f64,
    pub last_billed: Instant,
}

impl VolumeRecord {
    fn to_json(&self) -> Value {
        json!({"id": self.id, "name": self.name, "size": self.size,
               "dataCenter": self.data_center, "type": self.tier})
    }

    /// Bills the time since the last call at the current size.
    pub fn bill(&mut self, now: Instant) {
        let end = self.deleted.map_or(now, |deleted| deleted.min(now));
        if end > self.last_billed {
            self.gb_hours += self.size as f64 * (end - self.last_billed).as_secs_f64() / 3600.0;
            self.last_billed = end;
        }
    }
}

/// A volume as the control API's ledger shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeEntry {
    pub id: String,
    pub name: String,
    pub size: u64,
    pub data_center: String,
    pub tier: String,
    pub deleted: bool,
    pub resizes: u32,
    /// USD billed so far.
    pub cost: f64,
}

impl World {
    /// The live volume `id`.
    pub(crate) fn live_volume(&mut self, id: &str) -> Option<&mut VolumeRecord> {
        self.volumes
            .iter_mut()
            .find(|v| v.id == id && v.deleted.is_none())
    }

    /// Every volume ever created, billed to now.
    pub(crate) fn volume_ledger(&mut self) -> Vec<VolumeEntry> {
        let now = Instant::now();
        self.volumes
            .iter_mut()
            .map(|volume| {
                volume.bill(now);
                VolumeEntry {
                    id: volume.id.clone(),
                    name: volume.name.clone(),
                    size: volume.size,
                    data_center: volume.data_center.clone(),
                    tier: volume.tier.clone(),
                    deleted: volume.deleted.is_some(),
                    resizes: volume.resizes,
                    cost: volume.gb_hours * PRICE_PER_GB_MONTH / MONTH_HOURS,
                }
            })
            .collect()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateVolume {
    name: String,
    size: u64,
    data_center: String,
    #[serde(rename = "type")]
    tier: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateVolume {
    name: Option<String>,
    size: Option<u64>,
}

fn size_problem(size: u64) -> Option<Reply> {
    (!(MIN_GB..=MAX_GB).contains(&size)).then(|| {
        Reply::problem(
            400,
            format!("size must be between {MIN_GB} and {MAX_GB} GB, not {size}"),
        )
    })
}

/// `GET /v2/network-volumes`.
pub(crate) fn list(world: &World) -> Reply {
    let live: Vec<Value> = world
        .volumes
        .iter()
        .filter(|v| v.deleted.is_none())
        .map(VolumeRecord::to_json)
        .collect();
    Reply::json(200, json!({ "networkVolumes": live }))
}

/// `GET /v2/network-volumes/{id}`.
pub(crate) fn get(world: &mut World, id: &str) -> Reply {
    match world.live_volume(id) {
        Some(volume) => Reply::json(200, volume.to_json()),
        None => Reply::not_found("network volume"),
    }
}

/// `POST /v2/network-volumes`: in a data centre of the catalogue, within the size limits.
pub(crate) fn create(world: &mut World, data_centers: &[String], body: &[u8]) -> Reply {
    let request: CreateVolume = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(error) => return Reply::problem(400, format!("invalid request body: {error}")),
    };
    if request.name.trim().is_empty() {
        return Reply::problem(400, "name must not be empty");
    }
    if let Some(problem) = size_problem(request.size) {
        return problem;
    }
    if !data_centers.contains(&request.data_center) {
        return Reply::problem(
            400,
            format!("data center {:?} does not exist", request.data_center),
        );
    }
    let tier = request.tier.unwrap_or_else(|| TIERS[0].to_owned());
    if !TIERS.contains(&tier.as_str()) {
        return Reply::problem(400, format!("type {tier:?} is not one of {TIERS:?}"));
    }
    let id: String = std::iter::repeat_with(|| world.rng.lowercase())
        .take(10)
        .collect();
    let now = Instant::now();
    let volume = VolumeRecord {
        id,
        name: request.name,
        size: request.size,
        data_center: request.data_center,
        tier,
        deleted: None,
        resizes: 0,
        gb_hours: 0.0,
        last_billed: now,
    };
    let reply = Reply::json(201, volume.to_json());
    world.volumes.push(volume);
    reply
}

/// `PATCH /v2/network-volumes/{id}`: a new name, or a size at least the current one.
pub(crate) fn update(world: &mut World, id: &str, body: &[u8]) -> Reply {
    let request: UpdateVolume = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(error) => return Reply::problem(400, format!("invalid request body: {error}")),
    };
    if request.name.is_none() && request.size.is_none() {
        return Reply::problem(400, "at least one field must be given");
    }
    let now = Instant::now();
    let Some(volume) = world.live_volume(id) else {
        return Reply::not_found("network volume");
    };
    if let Some(size) = request.size {
        if let Some(problem) = size_problem(size) {
            return problem;
        }
        if size < volume.size {
            return Reply::problem(
                400,
                format!(
                    "network volume storage cannot be reduced ({} GB to {size} GB)",
                    volume.size
                ),
            );
        }
        if size > volume.size {
            volume.bill(now);
            volume.size = size;
            volume.resizes += 1;
        }
    }
    if let Some(name) = request.name {
        volume.name = name;
    }
    Reply::json(200, volume.to_json())
}

/// `DELETE /v2/network-volumes/{id}`: refused (403) while a live pod mounts it.
pub(crate) fn delete(world: &mut World, id: &str) -> Reply {
    let mounted_by = world
        .pods
        .iter()
        .filter(|pod| !pod.is_terminated())
        .find(|pod| mounted_volume(&pod.mounts).as_deref() == Some(id))
        .map(|pod| pod.id.clone());
    if let Some(pod) = mounted_by {
        // Undocumented: the spec lists no status for a volume in use; 403 is one it lists.
        return Reply::problem(
            403,
            format!("network volume {id} is in use by pod {pod}; terminate it first"),
        );
    }
    let now = Instant::now();
    let Some(volume) = world.live_volume(id) else {
        return Reply::not_found("network volume");
    };
    volume.bill(now);
    volume.deleted = Some(now);
    // Its files go with it.
    let _ = std::fs::remove_dir_all(directory(id));
    Reply::no_content()
}

/// The directory that holds a volume's files on this machine: every pod that mounts the volume
/// and whose sshd runs sees it at its mount path (see `ssh::start`), so a file one pod writes is
/// there for the next. Removed when the volume is deleted.
pub(crate) fn directory(id: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("runpod-sim-volume-{id}"))
}

/// The volume a pod's `mounts.network` names and the path it is mounted at.
pub(crate) fn mount_of(mounts: &Value) -> Option<(String, String)> {
    let entry = mounts.get("network")?.as_array()?.first()?;
    Some((
        entry.get("volumeId")?.as_str()?.to_owned(),
        entry.get("path")?.as_str()?.to_owned(),
    ))
}

/// The volume a create's (or a pod's) `mounts` names in `network`, if any.
pub(crate) fn mounted_volume(mounts: &Value) -> Option<String> {
    mounts
        .get("network")?
        .as_array()?
        .first()?
        .get("volumeId")?
        .as_str()
        .map(str::to_owned)
}

/// A create's `mounts.network`: at most one entry, naming a live volume with a path. `Ok`
/// gives its data centre (the pod must run there), `None` without one.
pub(crate) fn check_mount(world: &mut World, mounts: &Value) -> Result<Option<String>, Reply> {
    let Some(network) = mounts.get("network") else {
        return Ok(None);
    };
    let entries = network
        .as_array()
        .ok_or_else(|| Reply::problem(400, "mounts.network must be an array"))?;
    match entries.as_slice() {
        [] => Ok(None),
        [entry] => {
            let id = entry.get("volumeId").and_then(Value::as_str).unwrap_or("");
            let path = entry.get("path").and_then(Value::as_str).unwrap_or("");
            if !path.starts_with('/') {
                return Err(Reply::problem(
                    400,
                    "mounts.network[0].path must be an absolute path",
                ));
            }
            match world.live_volume(id) {
                Some(volume) => Ok(Some(volume.data_center.clone())),
                None => Err(Reply::problem(
                    400,
                    format!("network volume {id:?} does not exist"),
                )),
            }
        }
        _ => Err(Reply::problem(
            400,
            "mounts.network takes at most one network volume",
        )),
    }
}
