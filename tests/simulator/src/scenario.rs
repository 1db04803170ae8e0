//! What the simulated RunPod account looks like: the GPU and data-centre catalogue, rate limits,
//! lifecycle timings, image behaviour and initial faults. Loaded from JSON so e2e tests and the
//! demo can describe a situation without code; every field is optional and falls back to
//! [`Scenario::default`], a realistic catalogue.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::faults::Fault;

/// The whole simulated world at start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// GPU types in catalogue order (`GET /v2/catalog/gpus`).
    pub gpus: Vec<GpuSpec>,
    /// Data centres in catalogue order; also the placement order when a create names none.
    pub data_centers: Vec<DataCenterSpec>,
    /// CPU flavours for CPU pods (`cpu: {id, vcpuCount}`).
    pub cpu_flavors: Vec<CpuFlavorSpec>,
    /// Pod templates a create may name in `templateId` (unknown ids answer 404).
    pub templates: Vec<TemplateSpec>,
    /// Rate-limit windows, in header order.
    pub rate_limits: Vec<RateLimitSpec>,
    /// PROVISIONING lasts this long before STARTING.
    pub provisioning_ms: u64,
    /// STARTING lasts this long before RUNNING.
    pub starting_ms: u64,
    /// Ports (and `ssh.direct`) are published this long after RUNNING (api-notes P6).
    pub ports_ms: u64,
    /// Pods younger than this are missing from `GET /v2/pods` (api-notes P3: the list lags).
    pub list_lag_ms: u64,
    /// How containers of matching images behave; the first matching rule applies.
    pub images: Vec<ImageRule>,
    /// Faults active from the start.
    pub faults: Vec<Fault>,
}

/// A GPU type, in the shape of the API's `GpuType` (camelCase names accepted too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// The id used in `gpu.id`, e.g. `NVIDIA GeForce RTX 4090`.
    pub id: String,
    /// Short display name, e.g. `RTX 4090`.
    pub name: String,
    /// VRAM in GB.
    pub memory: u32,
    #[serde(default)]
    pub manufacturer: Manufacturer,
    /// Offered on Secure Cloud.
    pub secure: bool,
    /// Offered on Community Cloud.
    pub community: bool,
    /// List prices in USD per GPU per hour.
    pub price: GpuPrice,
    /// Largest GPU count per pod on each cloud.
    #[serde(rename = "maxCount", alias = "max_count")]
    pub max_count: MaxCount,
    /// Serverless pool, or null.
    #[serde(default)]
    pub pool: Option<String>,
    /// CUDA versions machines with this GPU report (`major.minor`); empty for AMD.
    #[serde(
        default = "default_cuda_versions",
        rename = "cuda_versions",
        alias = "cudaVersions"
    )]
    pub cuda_versions: Vec<String>,
}

/// `GpuType.price`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuPrice {
    pub secure: f64,
    pub community: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serverless: Option<f64>,
}

/// `GpuType.maxCount`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxCount {
    pub secure: u32,
    pub community: u32,
}

/// `GpuManufacturer`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Manufacturer {
    #[default]
    Nvidia,
    Amd,
    Unknown,
}

impl Manufacturer {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Manufacturer::Nvidia => "NVIDIA",
            Manufacturer::Amd => "AMD",
            Manufacturer::Unknown => "UNKNOWN",
        }
    }
}

/// `AvailabilityLevel`, ordered NONE < LOW < MEDIUM < HIGH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Availability {
    None,
    Low,
    Medium,
    High,
}

impl Availability {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Availability::None => "NONE",
            Availability::Low => "LOW",
            Availability::Medium => "MEDIUM",
            Availability::High => "HIGH",
        }
    }
}

/// `DataCenterRegion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Region {
    NorthAmerica,
    SouthAmerica,
    Europe,
    Asia,
    MiddleEast,
    Africa,
    Oceania,
    Antarctica,
    Unknown,
}

impl Region {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Region::NorthAmerica => "NORTH_AMERICA",
            Region::SouthAmerica => "SOUTH_AMERICA",
            Region::Europe => "EUROPE",
            Region::Asia => "ASIA",
            Region::MiddleEast => "MIDDLE_EAST",
            Region::Africa => "AFRICA",
            Region::Oceania => "OCEANIA",
            Region::Antarctica => "ANTARCTICA",
            Region::Unknown => "UNKNOWN",
        }
    }
}

/// A data centre and the stock it has of each GPU type (missing = not offered there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataCenterSpec {
    /// e.g. `EU-RO-1`.
    pub id: String,
    pub name: String,
    pub region: Region,
    /// ISO 3166-1 alpha-2 country, for the catalogue's `countryCodes` filter.
    #[serde(default)]
    pub country: Option<String>,
    /// `Compliance` values, e.g. `GDPR`.
    #[serde(default)]
    pub compliance: Vec<String>,
    #[serde(default, rename = "globalNetwork", alias = "global_network")]
    pub global_network: bool,
    /// `STANDARD` and/or `HIGH_PERFORMANCE`.
    #[serde(default, rename = "networkVolumeTypes", alias = "network_volume_types")]
    pub network_volume_types: Vec<String>,
    /// GPU id → stock. A create is placeable here only when this is not NONE.
    #[serde(default, alias = "gpuAvailability")]
    pub gpu_availability: BTreeMap<String, Availability>,
    /// CPU flavour id → stock.
    #[serde(default, alias = "cpuAvailability")]
    pub cpu_availability: BTreeMap<String, Availability>,
}

/// A CPU flavour (`cpu.id`): memory and price scale with the vCPU count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuFlavorSpec {
    /// e.g. `cpu5c`.
    pub id: String,
    pub name: String,
    /// GB of RAM per vCPU.
    pub ram_gb_per_vcpu: u32,
    /// USD per vCPU per hour.
    pub price_per_vcpu: f64,
    /// Largest vCPU count.
    pub max_vcpu: u32,
}

/// Container settings a create can take from a template (`templateId`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateSpec {
    pub id: String,
    pub image: String,
    #[serde(default)]
    pub args: Option<String>,
    #[serde(default)]
    pub disk: Option<u32>,
    #[serde(default)]
    pub ports: Option<Vec<String>>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// One rate-limit window, e.g. `minute` 60/60 s. RunPod documents the header names, not how
/// its gateway counts; gateways count in any of these ways, so the simulator offers each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSpec {
    pub name: String,
    pub quota: u32,
    pub window_secs: u64,
    /// How requests are counted.
    #[serde(default)]
    pub model: WindowModel,
    /// What `t` in the `RateLimit` header means.
    #[serde(default)]
    pub reset: ResetStyle,
    /// Send `RateLimit` / `RateLimit-Policy` at all (`false`: only 429 + `Retry-After`).
    #[serde(default = "yes")]
    pub headers: bool,
}

fn yes() -> bool {
    true
}

impl Default for RateLimitSpec {
    fn default() -> Self {
        RateLimitSpec {
            name: "minute".into(),
            quota: 60,
            window_secs: 60,
            model: WindowModel::default(),
            reset: ResetStyle::default(),
            headers: true,
        }
    }
}

/// How a window counts requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowModel {
    /// A window starts at the first request after the previous one ended and resets
    /// `window_secs` later, all at once.
    #[default]
    Fixed,
    /// Each request counts for `window_secs` after it arrived.
    Sliding,
    /// A token bucket of `quota` tokens refilled at `quota / window_secs` per second (GCRA).
    Gcra,
}

/// What `t` says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResetStyle {
    /// Until the next slot frees (fixed: the reset; sliding: the oldest counted request
    /// expires; GCRA: the next token).
    #[default]
    Next,
    /// Until the whole quota is back: moves later with every request under sliding and GCRA.
    Full,
}

/// How containers of images containing `match` behave.
///
/// - `outcome: EXITED`: the pod runs, then moves to EXITED `after_ms` after RUNNING.
/// - `outcome: ERROR`: the image pull fails; the pod moves from STARTING to ERROR `after_ms`
///   after STARTING began and never reaches RUNNING (system log "pull access denied …").
/// - `logs`: container log lines emitted when the container starts running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRule {
    #[serde(rename = "match")]
    pub pattern: String,
    #[serde(default)]
    pub outcome: Option<Outcome>,
    #[serde(default)]
    pub after_ms: u64,
    #[serde(default)]
    pub logs: Vec<String>,
    /// With `outcome: EXITED`: the container's process ends with this code, as on RunPod: a
    /// pod whose command runs under runpod-kubelet's completion wrapper prints the code and
    /// stops itself (EXITED); any other container is restarted in place (uptime goes back, the
    /// pod stays RUNNING). Without it, the pod simply ends EXITED.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The container's command (`args`) runs for real, as a local process, once the pod runs:
    /// its output is the container's log and its end the container's exit (see `process`).
    #[serde(default)]
    pub run: bool,
}

/// Where a scripted container ends up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Outcome {
    Exited,
    Error,
}

/// Why a scenario could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("reading scenario {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("parsing scenario {path}: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("invalid scenario: {0}")]
    Invalid(String),
}

fn default_cuda_versions() -> Vec<String> {
    ["12.4", "12.6", "12.8"].map(str::to_owned).to_vec()
}

/// The spec's `Compliance` values (scenario validation and the catalogue's `compliance` filter).
pub(crate) const COMPLIANCE: [&str; 12] = [
    "GDPR",
    "ISO_IEC_27001",
    "ISO_14001",
    "PCI_DSS",
    "HITRUST",
    "SOC_1_TYPE_2",
    "SOC_2_TYPE_2",
    "SOC_3_TYPE_2",
    "ITAR",
    "FISMA_HIGH",
    "HIPAA",
    "RENEWABLE",
];
/// The spec's `VolumeType` values.
pub(crate) const VOLUME_TYPES: [&str; 2] = ["STANDARD", "HIGH_PERFORMANCE"];

impl Scenario {
    /// Reads a JSON scenario; missing fields take their [`Scenario::default`] values.
    pub fn from_file(path: &Path) -> Result<Scenario, ScenarioError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: shown.clone(),
            source,
        })?;
        let scenario: Scenario =
            serde_json::from_str(&text).map_err(|source| ScenarioError::Json {
                path: shown,
                source,
            })?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Checks the references and ranges serde cannot (unique ids, known GPU ids, quotas ≥ 1).
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let invalid = |msg: String| Err(ScenarioError::Invalid(msg));
        let gpu_ids = unique_ids("GPU", self.gpus.iter().map(|g| g.id.as_str()))?;
        unique_ids(
            "data centre",
            self.data_centers.iter().map(|d| d.id.as_str()),
        )?;
        let cpu_ids = unique_ids(
            "CPU flavour",
            self.cpu_flavors.iter().map(|c| c.id.as_str()),
        )?;
        unique_ids("template", self.templates.iter().map(|t| t.id.as_str()))?;
        unique_ids(
            "rate limit",
            self.rate_limits.iter().map(|r| r.name.as_str()),
        )?;
        for gpu in &self.gpus {
            let prices = [gpu.price.secure, gpu.price.community];
            if prices.iter().any(|p| !p.is_finite() || *p < 0.0) {
                return invalid(format!(
                    "GPU {:?} has a negative or non-finite price",
                    gpu.id
                ));
            }
            if let Some(v) = gpu.cuda_versions.iter().find(|v| cuda_version(v).is_none()) {
                return invalid(format!(
                    "GPU {:?}: CUDA version {v:?} is not major.minor",
                    gpu.id
                ));
            }
        }
        for dc in &self.data_centers {
            if let Some(gpu) = dc
                .gpu_availability
                .keys()
                .find(|g| !gpu_ids.contains(g.as_str()))
            {
                return invalid(format!("data centre {}: unknown GPU id {gpu:?}", dc.id));
            }
            if let Some(cpu) = dc
                .cpu_availability
                .keys()
                .find(|c| !cpu_ids.contains(c.as_str()))
            {
                return invalid(format!(
                    "data centre {}: unknown CPU flavour {cpu:?}",
                    dc.id
                ));
            }
            if let Some(c) = dc
                .compliance
                .iter()
                .find(|c| !COMPLIANCE.contains(&c.as_str()))
            {
                return invalid(format!("data centre {}: unknown compliance {c:?}", dc.id));
            }
            if let Some(v) = dc
                .network_volume_types
                .iter()
                .find(|v| !VOLUME_TYPES.contains(&v.as_str()))
            {
                return invalid(format!("data centre {}: unknown volume type {v:?}", dc.id));
            }
        }
        if let Some(rl) = self
            .rate_limits
            .iter()
            .find(|r| r.quota == 0 || r.window_secs == 0)
        {
            return invalid(format!(
                "rate limit {:?} needs quota ≥ 1 and window_secs ≥ 1",
                rl.name
            ));
        }
        if let Some(cpu) = self
            .cpu_flavors
            .iter()
            .find(|c| c.ram_gb_per_vcpu == 0 || c.max_vcpu < 2 || !c.price_per_vcpu.is_finite())
        {
            return invalid(format!(
                "CPU flavour {:?} has an invalid size or price",
                cpu.id
            ));
        }
        if let Some(t) = self
            .templates
            .iter()
            .find(|t| t.disk == Some(0) || t.image.is_empty())
        {
            return invalid(format!(
                "template {:?} needs an image and a disk of at least 1 GB",
                t.id
            ));
        }
        for fault in &self.faults {
            fault.validate().map_err(ScenarioError::Invalid)?;
        }
        Ok(())
    }

    /// The GPU type with this exact id.
    pub fn gpu(&self, id: &str) -> Option<&GpuSpec> {
        self.gpus.iter().find(|g| g.id == id)
    }

    /// The data centre with this exact id.
    pub fn data_center(&self, id: &str) -> Option<&DataCenterSpec> {
        self.data_centers.iter().find(|d| d.id == id)
    }
}

fn unique_ids<'a>(
    what: &str,
    ids: impl Iterator<Item = &'a str>,
) -> Result<BTreeSet<&'a str>, ScenarioError> {
    let mut seen = BTreeSet::new();
    for id in ids {
        if id.is_empty() || !seen.insert(id) {
            return Err(ScenarioError::Invalid(format!(
                "{what} id {id:?} is empty or appears twice"
            )));
        }
    }
    Ok(seen)
}

/// `major.minor` → (major, minor), compared numerically (12.11 > 12.2).
pub(crate) fn cuda_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(major) || !digits(minor) {
        return None;
    }
    Some((major.parse().ok()?, minor.parse().ok()?))
}

impl Default for Scenario {
    fn default() -> Scenario {
        Scenario {
            gpus: crate::default_catalog::gpus(),
            data_centers: crate::default_catalog::data_centers(),
            cpu_flavors: crate::default_catalog::cpu_flavors(),
            templates: crate::default_catalog::templates(),
            rate_limits: vec![
                RateLimitSpec {
                    name: "minute".into(),
                    quota: 60,
                    window_secs: 60,
                    ..RateLimitSpec::default()
                },
                RateLimitSpec {
                    name: "hour".into(),
                    quota: 3000,
                    window_secs: 3600,
                    ..RateLimitSpec::default()
                },
                RateLimitSpec {
                    name: "day".into(),
                    quota: 50000,
                    window_secs: 86400,
                    ..RateLimitSpec::default()
                },
            ],
            provisioning_ms: 1500,
            starting_ms: 1500,
            ports_ms: 1000,
            list_lag_ms: 500,
            images: Vec::new(),
            faults: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn default_is_valid_and_partial_files_fill_in_defaults() {
        Scenario::default().validate().unwrap();
        let partial: Scenario = serde_json::from_str(r#"{"provisioning_ms": 10}"#).unwrap();
        assert_eq!(partial.provisioning_ms, 10);
        assert_eq!(partial.gpus, Scenario::default().gpus);
    }

    #[test]
    fn cuda_versions_compare_numerically() {
        assert!(cuda_version("12.11") > cuda_version("12.2"));
        assert_eq!(cuda_version("12"), None);
        assert_eq!(cuda_version("a.b"), None);
    }
}
