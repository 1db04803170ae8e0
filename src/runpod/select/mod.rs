//! GPU placement: which GPU types (and data centres) to try for a pod, in which order.
//!
//! v2 creates one GPU type per request and never falls back server-side (api-notes P12), and the
//! catalogue is not a reservation (2.5, P2), so the controller needs an ordered list of
//! candidates to walk until one create is accepted. Everything here is a pure function of the
//! pod's effective annotations, the cluster's limits and the catalogue, so that every rule is
//! unit- and property-testable; I/O and retries live in the caller.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use runpod_contract::{self as contract, CloudType};

use super::catalogue::{Availability, Catalogue, GpuType};

mod prices;
#[cfg(test)]
mod tests;

pub use prices::price_sheet;

/// Slack for price comparisons, the same as the webhook's cap check: `3 × 0.1` must fit a cap
/// of `0.3`, although binary floating point computes `0.30000000000000004`.
pub const PRICE_SLACK: f64 = 1e-9;

/// What a pod needs from RunPod, read from the annotations the webhook wrote on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirements {
    /// GPUs per pod; [`requirements`] always yields at least 1 (the create request must always
    /// send `gpu.count`, api-notes P11).
    pub gpu_count: u32,
    /// Minimum VRAM per GPU in GB.
    pub min_memory_gb: Option<u32>,
    /// Allowed GPU types in preference order, in any spelling of the GPU catalogue (canonical,
    /// or either cloud's own); empty means any type.
    pub gpu_types: Vec<String>,
    pub cloud: CloudType,
    /// Most USD per hour for the whole pod (all its GPUs), from `runpod.io/max-price`.
    pub max_price_per_hour: Option<f64>,
    /// Data centres the pod may run in, already narrowed to the cluster's list; empty means no
    /// restriction.
    pub allowed_data_centers: Vec<String>,
}

/// The cluster-wide limits from the controller's flags.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterLimits {
    /// `--max-gpu-price`: most USD per GPU-hour any pod may cost (`f64::INFINITY`: no cap).
    pub max_gpu_price: f64,
    /// `--datacenter-ids`: the only data centres pods may run in; empty means any.
    pub data_center_ids: Vec<String>,
    /// `--allowed-cloud-types`: the only cloud tiers pods may run in; empty means any.
    pub cloud_types: Vec<CloudType>,
}

/// Why a pod's annotations cannot be turned into [`Requirements`]; each message names the
/// annotation, the value found and what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    #[error("annotation {annotation}={value:?} is invalid: {problem}; {hint}")]
    InvalidAnnotation {
        annotation: &'static str,
        value: String,
        problem: String,
        hint: &'static str,
    },
    #[error(
        "annotation {annotation}={value:?} names only datacenter(s) this cluster does not \
         allow ({requested}); allowed datacenters: {allowed}. Use one of the allowed ids, or \
         remove the annotation to use any allowed datacenter",
        annotation = contract::DATACENTER_IDS,
        requested = .requested.join(", "),
        allowed = .allowed.join(", ")
    )]
    NoAllowedDataCenter {
        value: String,
        requested: Vec<String>,
        allowed: Vec<String>,
    },
    #[error(
        "annotation {annotation}={value:?} asks for a cloud tier this cluster does not allow; \
         allowed: {allowed}. Remove the annotation or ask your platform team",
        annotation = contract::CLOUD_TYPE,
        allowed = contract::cloud_type_names(.allowed)
    )]
    CloudTypeNotAllowed {
        value: String,
        allowed: Vec<CloudType>,
    },
}

/// One placement to try: a GPU type on one cloud, in the listed data centres.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// `gpu.id` for the create request, verbatim from the catalogue (P10).
    pub gpu_id: String,
    /// `gpu.count`; always the pod's requirement (P11).
    pub gpu_count: u32,
    pub cloud: CloudType,
    /// `dataCenterIds` for the create request, best stock first; empty means "let RunPod
    /// choose" (only when neither the pod nor the cluster restricts data centres and the
    /// catalogue reports no per-data-centre stock).
    pub data_center_ids: Vec<String>,
    /// List price in USD per GPU-hour on `cloud`.
    pub price_per_gpu: f64,
    /// `price_per_gpu × gpu_count`: what the pod costs per hour.
    pub price_per_hour: f64,
    /// VRAM per GPU in GB, when the catalogue says.
    pub memory_gb: Option<u32>,
}

const MEMORY_HINT: &str = "set the minimum VRAM per GPU as a whole number of GB, e.g. \"24\"";
const GPU_TYPES_HINT: &str = "list GPU names separated by commas, e.g. \"RTX4090,L4\" \
     (`runpod-kubelet gpus` lists them; RunPod's own ids work too)";
const PRICE_HINT: &str = "set the most USD per hour the whole pod may cost, e.g. \"1.5\"";
const CLOUD_HINT: &str = "use SECURE (the default) or COMMUNITY";
const DATACENTERS_HINT: &str = "list datacenter ids separated by commas, e.g. \"EU-RO-1,US-KS-2\"";

/// Reads the pod's effective annotations (the webhook already merged the Job's in) with the
/// same parsers admission used, so the controller understands exactly what admission accepted.
/// Admission validated them, but the controller re-checks: annotations can be edited later, and
/// the cluster's data-centre list can shrink after admission.
pub fn requirements(pod: &Pod, limits: &ClusterLimits) -> Result<Requirements, RequirementError> {
    let annotations = pod.metadata.annotations.as_ref();

    let min_memory_gb = annotation(
        annotations,
        contract::REQUIRED_GPU_MEMORY,
        MEMORY_HINT,
        contract::parse_gpu_memory,
    )?;
    let gpu_types = annotation(annotations, contract::GPU_TYPES, GPU_TYPES_HINT, owned_list)?
        .unwrap_or_default();
    let max_price_per_hour = annotation(
        annotations,
        contract::MAX_PRICE,
        PRICE_HINT,
        contract::parse_price,
    )?;
    let cloud = annotation(
        annotations,
        contract::CLOUD_TYPE,
        CLOUD_HINT,
        CloudType::parse_named,
    )?
    .unwrap_or_else(|| CloudType::default_within(&limits.cloud_types));
    // Admission refused it, but the annotation may have been edited since, or the list
    // narrowed: nothing is bought from a tier the installation does not allow.
    if !cloud.allowed_in(&limits.cloud_types) {
        return Err(RequirementError::CloudTypeNotAllowed {
            value: annotation_value(annotations, contract::CLOUD_TYPE)
                .unwrap_or_default()
                .to_owned(),
            allowed: limits.cloud_types.clone(),
        });
    }
    let requested = annotation(
        annotations,
        contract::DATACENTER_IDS,
        DATACENTERS_HINT,
        owned_list,
    )?
    .unwrap_or_default();

    let allowed_data_centers = intersect_data_centers(&requested, &limits.data_center_ids);
    if !requested.is_empty() && allowed_data_centers.is_empty() {
        return Err(RequirementError::NoAllowedDataCenter {
            value: annotation_value(annotations, contract::DATACENTER_IDS)
                .unwrap_or_default()
                .to_owned(),
            requested,
            allowed: intersect_data_centers(&[], &limits.data_center_ids),
        });
    }

    Ok(Requirements {
        gpu_count: runpod_contract::checks::gpu_count(pod).max(1),
        min_memory_gb,
        gpu_types,
        cloud,
        max_price_per_hour,
        allowed_data_centers,
    })
}

fn annotation_value<'a>(
    annotations: Option<&'a BTreeMap<String, String>>,
    key: &str,
) -> Option<&'a str> {
    annotations?.get(key).map(String::as_str)
}

/// Parses one annotation when present, wrapping the parser's complaint in an actionable error.
fn annotation<T>(
    annotations: Option<&BTreeMap<String, String>>,
    key: &'static str,
    hint: &'static str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, RequirementError> {
    let Some(value) = annotation_value(annotations, key) else {
        return Ok(None);
    };
    parse(value)
        .map(Some)
        .map_err(|problem| RequirementError::InvalidAnnotation {
            annotation: key,
            value: value.to_owned(),
            problem,
            hint,
        })
}

/// A comma-separated list, items trimmed at the ends only (ids may contain double spaces, P10),
/// repeated items dropped so that no id is tried twice.
fn owned_list(value: &str) -> Result<Vec<String>, String> {
    Ok(dedup(
        contract::split_list(value)?.into_iter().map(str::to_owned),
    ))
}

/// Keeps the first occurrence of each item, in order.
fn dedup(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut seen = BTreeSet::new();
    items
        .into_iter()
        .filter(|item| seen.insert(item.clone()))
        .collect()
}

/// The data centres a pod may use: its own list (in its order, which is its preference)
/// narrowed to the cluster's; the cluster's list when the pod names none; empty (any) when
/// neither restricts. Blank ids are ignored, so a flag given as `""` restricts nothing.
fn intersect_data_centers(pod: &[String], cluster: &[String]) -> Vec<String> {
    let pod: Vec<String> = dedup(pod.iter().filter(|id| !id.trim().is_empty()).cloned());
    let cluster: Vec<String> = dedup(cluster.iter().filter(|id| !id.trim().is_empty()).cloned());
    if cluster.is_empty() {
        pod
    } else if pod.is_empty() {
        cluster
    } else {
        pod.into_iter().filter(|id| cluster.contains(id)).collect()
    }
}

/// The placement decision: every GPU type of `requirements.cloud` that can take the pod, best
/// first — in the pod's `gpu-types` order when it gives one, otherwise cheapest per hour first;
/// ties go to more stock, then less memory (keep big GPUs for pods that need them), then the
/// id, so the order is total and deterministic. A type listed twice in the catalogue yields
/// one candidate, its best-ranked record.
///
/// The caller tries them in order; stock is only a hint (P2), so it ranks but never guarantees.
/// A requirement of 0 GPUs yields nothing ([`requirements`] never produces it; a create
/// without a GPU count fails anyway, P11). The cluster's limits are applied again here, so
/// that even hand-built requirements can never place outside them.
pub fn candidates(
    catalogue: &Catalogue,
    requirements: &Requirements,
    limits: &ClusterLimits,
) -> Vec<Candidate> {
    let count = requirements.gpu_count;
    if count == 0 {
        return Vec::new();
    }
    let Some(cap) = price_cap(requirements, limits) else {
        return Vec::new();
    };
    let allowed =
        intersect_data_centers(&requirements.allowed_data_centers, &limits.data_center_ids);
    let pod_restricts = requirements
        .allowed_data_centers
        .iter()
        .any(|id| !id.trim().is_empty());
    if pod_restricts && allowed.is_empty() {
        // Nothing the pod asks for is allowed: never fall back to "anywhere".
        return Vec::new();
    }

    let mut ranked: Vec<Ranked> = catalogue
        .gpus(requirements.cloud)
        .iter()
        .filter_map(|gpu| evaluate(gpu, requirements, cap, &allowed))
        .collect();
    ranked.sort_by(Ranked::cmp);
    let mut seen = BTreeSet::new();
    ranked
        .into_iter()
        .filter(|r| seen.insert(r.candidate.gpu_id.clone()))
        .map(|r| r.candidate)
        .collect()
}

/// Cheapest hourly price of `gpu_count` GPUs of any type offered, priced and in stock on
/// `cloud`, ignoring every price cap, memory, type and data-centre wish (`None` when nothing is
/// available). Used to warn that a price cap is below anything RunPod offers; being the lowest
/// price over the widest set, it never warns when some type would fit the cap.
pub fn cheapest_price(catalogue: &Catalogue, cloud: CloudType, gpu_count: u32) -> Option<f64> {
    let anything = Requirements {
        gpu_count,
        min_memory_gb: None,
        gpu_types: Vec::new(),
        cloud,
        max_price_per_hour: None,
        allowed_data_centers: Vec::new(),
    };
    let no_limits = ClusterLimits {
        max_gpu_price: f64::INFINITY,
        data_center_ids: Vec::new(),
        cloud_types: Vec::new(),
    };
    candidates(catalogue, &anything, &no_limits)
        .into_iter()
        .map(|candidate| candidate.price_per_hour)
        .reduce(f64::min)
}

/// The most the pod may cost per hour: the smaller of its own cap and the cluster's per-GPU
/// cap times the GPU count. `None` (place nothing) when either is NaN: a broken cap must not
/// silently become "no cap", which `f64::min` would do.
fn price_cap(requirements: &Requirements, limits: &ClusterLimits) -> Option<f64> {
    let cluster = limits.max_gpu_price * f64::from(requirements.gpu_count);
    let pod = requirements.max_price_per_hour.unwrap_or(f64::INFINITY);
    if cluster.is_nan() || pod.is_nan() {
        return None;
    }
    Some(cluster.min(pod))
}

/// `unknown` is what the API reports for CPU pods and a placeholder entry (api-notes 4.1); it
/// and blank ids cannot be sent as `gpu.id`.
fn usable_id(id: &str) -> bool {
    let id = id.trim();
    !id.is_empty() && !id.eq_ignore_ascii_case("unknown")
}

/// A candidate with what it is ranked by.
struct Ranked {
    /// Position in the pod's `gpu-types` list; 0 for all when it gives none.
    preference: usize,
    /// Best stock rank among the candidate's data centres (overall stock without per-DC data).
    stock: u8,
    candidate: Candidate,
}

impl Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (&self.candidate, &other.candidate);
        self.preference
            .cmp(&other.preference)
            .then_with(|| a.price_per_hour.total_cmp(&b.price_per_hour))
            .then_with(|| other.stock.cmp(&self.stock))
            .then_with(|| memory_key(a.memory_gb).cmp(&memory_key(b.memory_gb)))
            .then_with(|| a.gpu_id.cmp(&b.gpu_id))
    }
}

/// Smaller memory first; unknown memory after every known size.
fn memory_key(memory: Option<u32>) -> (bool, u32) {
    (memory.is_none(), memory.unwrap_or(0))
}

/// One catalogue entry against every rule; `None` when it cannot take the pod.
fn evaluate(
    gpu: &GpuType,
    requirements: &Requirements,
    cap: f64,
    allowed: &[String],
) -> Option<Ranked> {
    let cloud = requirements.cloud;
    let count = requirements.gpu_count;
    if !usable_id(&gpu.id) || !gpu.offered_on(cloud) {
        return None;
    }
    let price_per_gpu = gpu.price_on(cloud).filter(|price| price.is_finite())?;
    let price_per_hour = price_per_gpu * f64::from(count);
    if price_per_hour > cap + PRICE_SLACK {
        return None;
    }
    if let Some(min) = requirements.min_memory_gb
        && gpu.memory.is_none_or(|memory| memory < min)
    {
        return None;
    }
    if let Some(ceiling) = gpu.max_count_on(cloud)
        && count > ceiling
    {
        return None;
    }
    let preference = if requirements.gpu_types.is_empty() {
        0
    } else {
        // A canonical name or Vast.ai's name matches every id of its models; a RunPod id
        // matches itself (case and spaces ignored).
        contract::gpus::preference(
            &requirements.gpu_types,
            contract::provider::Cloud::RunPod,
            &gpu.id,
            gpu.memory.map(f64::from),
        )?
    };
    if gpu.availability == Some(Availability::None) {
        return None;
    }
    let (data_center_ids, stock) = usable_data_centers(gpu, allowed)?;
    Some(Ranked {
        preference,
        stock,
        candidate: Candidate {
            gpu_id: gpu.id.clone(),
            gpu_count: count,
            cloud,
            data_center_ids,
            price_per_gpu,
            price_per_hour,
            memory_gb: gpu.memory,
        },
    })
}

/// The data centres to send for `gpu`, best stock first, with the best stock rank; `None` when
/// no usable one remains.
///
/// With a restriction: the allowed ids where the GPU's stock is not NONE; an id missing from a
/// non-empty stock list is not usable; without per-DC stock all allowed ids are kept, in order.
/// Without a restriction: the ids of the stock list that are not NONE, or an empty list ("let
/// RunPod choose") when the catalogue has no per-DC stock at all. Ties keep the allowed
/// order, or the id order when unrestricted, so the request is deterministic.
fn usable_data_centers(gpu: &GpuType, allowed: &[String]) -> Option<(Vec<String>, u8)> {
    if gpu.data_centers.is_empty() {
        let overall = gpu.availability.unwrap_or(Availability::Unknown).rank();
        return Some((allowed.to_vec(), overall));
    }
    // Best stock per id, in case the catalogue lists a data centre twice.
    let mut stock: BTreeMap<&str, u8> = BTreeMap::new();
    for dc in &gpu.data_centers {
        if dc.id.trim().is_empty() {
            continue;
        }
        let rank = stock.entry(dc.id.as_str()).or_insert(0);
        *rank = (*rank).max(dc.availability.rank());
    }
    let mut usable: Vec<(u8, &str)> = if allowed.is_empty() {
        // BTreeMap iteration is id order, the unrestricted tie-break.
        stock.iter().map(|(id, rank)| (*rank, *id)).collect()
    } else {
        allowed
            .iter()
            .filter_map(|id| Some((*stock.get(id.as_str())?, id.as_str())))
            .collect()
    };
    usable.retain(|(rank, _)| *rank > 0);
    // Stable: equal stock keeps the order built above.
    usable.sort_by_key(|(rank, _)| Reverse(*rank));
    let best = usable.first()?.0;
    Some((
        usable.into_iter().map(|(_, id)| id.to_owned()).collect(),
        best,
    ))
}
