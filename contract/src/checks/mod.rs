//! The individual admission rules: effective annotations, their validation, what RunPod can run,
//! cluster policy (datacenters, price cap), GPU count and port detection; the container fields a
//! cloud does not apply or run are in `fields`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate as contract;
use crate::config::{OwningJob, PolicyConfig};
use crate::pod::{ContainerView, PodView, VolumeView};
use crate::{CloudType, PortSpec};

mod fields;
mod inits;
#[cfg(test)]
mod tests;

pub use fields::{
    Handler, handler_runs, unapplied_security_context, unapplied_security_context_message,
    unhonoured, unhonoured_message,
};
pub use inits::init_container_problems;

/// An effective annotation value and where it came from.
#[derive(Debug, Clone, Copy)]
pub struct Sourced<'a> {
    pub value: &'a str,
    /// Name of the Job it was inherited from, if not set on the pod.
    pub job: Option<&'a str>,
}

impl Sourced<'_> {
    /// A suffix for messages, so users know where to fix a value.
    pub fn origin(&self) -> String {
        self.job
            .map(|job| format!(" (inherited from Job {job})"))
            .unwrap_or_default()
    }
}

/// The user annotations in force for a pod: pod first, then its owning Job.
#[derive(Debug, Default)]
pub struct Effective<'a> {
    values: BTreeMap<&'static str, Sourced<'a>>,
}

impl<'a> Effective<'a> {
    /// `pod`: the pod's annotations, as the view (compact strings) or a typed pod holds them.
    pub fn resolve<K, V>(pod: &'a BTreeMap<K, V>, job: Option<&'a OwningJob>) -> Self
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        // Walks the annotations there are (a handful) instead of looking up every user
        // annotation in both maps; the pod's own value replaces its Job's.
        let mut values = BTreeMap::new();
        if let Some(job) = job {
            for (key, value) in &job.annotations {
                if let Some(key) = user_annotation(key) {
                    let job = Some(job.name.as_str());
                    values.insert(key, Sourced { value, job });
                }
            }
        }
        for (key, value) in pod {
            if let Some(key) = user_annotation(key.as_ref()) {
                let value = value.as_ref();
                values.insert(key, Sourced { value, job: None });
            }
        }
        Self { values }
    }

    pub fn get(&self, key: &str) -> Option<&Sourced<'a>> {
        self.values.get(key)
    }

    /// The value in force for `key`, wherever it comes from.
    pub fn value(&self, key: &str) -> Option<&'a str> {
        self.values.get(key).map(|sourced| sourced.value)
    }

    /// Every value in force, as a plain map (for readers that take annotations).
    pub fn values(&self) -> BTreeMap<String, String> {
        self.values
            .iter()
            .map(|(key, sourced)| ((*key).to_owned(), sourced.value.to_owned()))
            .collect()
    }

    /// Values inherited from the Job, to be written on the pod.
    pub fn inherited_from_job(&self) -> impl Iterator<Item = (&'static str, &'a str)> + '_ {
        self.values
            .iter()
            .filter(|(_, sourced)| sourced.job.is_some())
            .map(|(key, sourced)| (*key, sourced.value))
    }

    fn iter(&self) -> impl Iterator<Item = (&'static str, &Sourced<'a>)> {
        self.values.iter().map(|(key, sourced)| (*key, sourced))
    }
}

/// The user annotation `key` names, as the contract spells it.
fn user_annotation(key: &str) -> Option<&'static str> {
    contract::USER_ANNOTATIONS
        .iter()
        .find(|known| **known == key)
        .copied()
}

/// Every malformed annotation, each with what is wrong and how to fix it.
pub fn validate_annotations(effective: &Effective<'_>) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, sourced) in effective.iter() {
        let value = sourced.value;
        let result: Result<(), String> = if value.trim().is_empty() {
            Err("is empty; set a value or remove the annotation".to_owned())
        } else {
            match key {
                contract::REQUIRED_GPU_MEMORY => contract::parse_gpu_memory(value).map(drop),
                contract::DATACENTER_IDS => contract::split_list(value).map(drop),
                // One vocabulary for both clouds: a name neither knows would match nothing.
                contract::GPU_TYPES | contract::vastai::GPU_FALLBACKS => {
                    contract::gpus::check_list(value)
                }
                contract::vastai::GPU_TYPE => match contract::gpus::resolve(value).is_empty() {
                    true => Err(contract::gpus::unknown(value.trim())),
                    false => Ok(()),
                },
                contract::MAX_PRICE => contract::parse_price(value).map(drop),
                contract::CLOUD_TYPE => CloudType::parse_named(value).map(drop),
                contract::PORTS => contract::parse_ports(value).map(drop),
                contract::DISK => contract::parse_disk(value).map(drop),
                contract::MANAGED | contract::OFFLOAD | contract::INIT_IN_MAIN_IMAGE => {
                    contract::parse_flag(value).map(drop)
                }
                contract::MAX_PENDING_TIME => contract::parse_max_pending_time(value).map(drop),
                contract::provider::PROVIDER => {
                    contract::provider::ProviderChoice::parse(value).map(drop)
                }
                contract::vastai::MEMORY | contract::vastai::DISK => {
                    contract::vastai::parse_gb(value).map(drop)
                }
                contract::vastai::PRICE_MAX => contract::parse_price(value).map(drop),
                contract::vastai::REGION => contract::vastai::Region::parse(value)
                    .map(drop)
                    .ok_or_else(|| {
                        format!(
                            "{value:?} is not one of {}",
                            contract::vastai::Region::ALL
                                .iter()
                                .map(|r| r.name())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    }),
                // Burst mode is judged when the mode is resolved; ids only need to be non-empty.
                _ => Ok(()),
            }
        };
        if let Err(problem) = result {
            problems.push(format!("annotation {key}{}: {problem}", sourced.origin()));
        }
    }
    // Read together: one may contradict the other.
    if let Err(problem) = contract::interruptible::interruptible_in(|key| effective.value(key)) {
        problems.push(format!("annotation {problem}"));
    }
    problems
}

/// What RunPod cannot run: it runs exactly one container, no init containers, and only volumes
/// whose content the controller can reproduce.
pub fn unsupported_shape(pod: &PodView) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return vec!["the pod has no spec".to_owned()];
    };
    if spec.containers.len() != 1 {
        problems.push(format!(
            "it has {} containers but a RunPod pod runs exactly one; move the others into \
             their own pods or set {}: never",
            spec.containers.len(),
            contract::BURST_MODE
        ));
    }
    problems.extend(init_container_problems(pod));
    // A network volume is mounted by the cloud, not written by the wrapper.
    let claim_volumes: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.claim.is_some())
        .map(|v| v.name.as_str())
        .collect();
    if let Some(problem) = spec
        .containers
        .first()
        .and_then(|c| mounts_without_command(c, &claim_volumes))
    {
        problems.push(problem);
    }
    for volume in spec.volumes.iter().flatten() {
        if let Some(kind) = unsupported_volume_kind(volume) {
            problems.push(format!(
                "volume {:?} is of type {kind}; RunPod pods support only configMap, secret, \
                 emptyDir, downwardAPI and projected service-account volumes",
                volume.name
            ));
        }
    }
    problems
}

/// The claims of the pod's `persistentVolumeClaim` volumes, in order.
pub fn claims(pod: &PodView) -> Vec<&str> {
    pod.spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .filter_map(|volume| volume.claim.as_deref())
        .collect()
}

/// What a pod's claims allow, given each claim's StorageClass provisioner (`None`: the claim
/// or its class cannot be found): `Ok(true)` when it mounts one RunPod network volume,
/// `Ok(false)` when it mounts no claim; `Err` lists why it cannot burst.
pub fn network_volume_claims(
    pod: &PodView,
    provisioner_of: impl Fn(&str) -> Option<String>,
) -> Result<bool, Vec<String>> {
    let claims = claims(pod);
    let mut problems = Vec::new();
    for claim in &claims {
        match provisioner_of(claim) {
            Some(provisioner) if provisioner == crate::volumes::PROVISIONER => {}
            Some(provisioner) => problems.push(format!(
                "PersistentVolumeClaim {claim:?} is provisioned by {provisioner}, which a burst \
                 pod cannot mount; only claims of a StorageClass of {} (the chart's {}) can",
                crate::volumes::PROVISIONER,
                crate::volumes::CLASS_NAME
            )),
            None => problems.push(format!(
                "PersistentVolumeClaim {claim:?} (or its StorageClass) does not exist; create it \
                 first, with StorageClass {}",
                crate::volumes::CLASS_NAME
            )),
        }
    }
    if claims.len() > 1 {
        problems.push(format!(
            "it mounts {} PersistentVolumeClaims; a RunPod pod mounts at most one network volume",
            claims.len()
        ));
    }
    if problems.is_empty() {
        Ok(!claims.is_empty())
    } else {
        Err(problems)
    }
}

/// What Vast.ai cannot run beyond [`unsupported_shape`]: its instances get no files from the
/// controller (no wrapper writes them: an env entry holds at most 256 characters there), so a
/// container that mounts anything but the service-account token is refused.
pub fn vastai_unsupported_shape(pod: &PodView) -> Vec<String> {
    let Some(container) = pod.spec.as_ref().and_then(|spec| spec.containers.first()) else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    let mounts = mounted_paths(container);
    if !mounts.is_empty() {
        problems.push(format!(
            "it mounts volumes ({}), which Vast.ai instances cannot receive; pass the values as \
             env or use {}: runpod",
            mounts.join(", "),
            contract::provider::PROVIDER
        ));
    }
    let inits: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|spec| spec.init_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    if !inits.is_empty() {
        problems.push(format!(
            "it has init containers ({}), which Vast.ai cannot run (nothing runs commands in \
             its instances before the container's); use {}: runpod or fold them into the \
             container's command",
            inits.join(", "),
            contract::provider::PROVIDER
        ));
    }
    problems
}

/// Where the kubelet mounts the service-account token; the controller does not ship it.
const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The container's mount paths, but the service-account token's.
fn mounted_paths(container: &ContainerView) -> Vec<&str> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.mount_path.trim_end_matches('/') != SERVICE_ACCOUNT_MOUNT)
        .map(|m| m.mount_path.as_str())
        .collect()
}

/// The controller writes mounted files from a wrapper around the container's command; a
/// container that only runs its image's CMD cannot be wrapped, so its files would be lost.
fn mounts_without_command(container: &ContainerView, claim_volumes: &[&str]) -> Option<String> {
    let has_command = container.command.as_ref().is_some_and(|c| !c.is_empty())
        || container.args.as_ref().is_some_and(|a| !a.is_empty());
    if has_command {
        return None;
    }
    let mounts: Vec<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.mount_path.trim_end_matches('/') != SERVICE_ACCOUNT_MOUNT)
        .filter(|m| !claim_volumes.contains(&m.name.as_str()))
        .map(|m| m.mount_path.as_str())
        .collect();
    (!mounts.is_empty()).then(|| {
        format!(
            "it mounts volumes ({}) but sets no command; on RunPod those files are written by \
             a wrapper around the container's command, so set `command` (the image's \
             entrypoint) or set {}: never",
            mounts.join(", "),
            contract::BURST_MODE
        )
    })
}

fn unsupported_volume_kind(volume: &VolumeView) -> Option<String> {
    // A claim is judged by its StorageClass (`network_volume_claims`), which needs a lookup.
    if volume.simple_source || volume.claim.is_some() {
        return None;
    }
    if let Some(projected) = &volume.projected {
        let supported = projected.sources.iter().flatten().all(|source| {
            source.service_account_token.is_some()
                || source.config_map.is_some()
                || source.secret.is_some()
                || source.downward_api.is_some()
        });
        return (!supported).then(|| "projected (with unsupported sources)".to_owned());
    }
    // Name the type as the user wrote it.
    Some(
        volume
            .other_source
            .as_deref()
            .unwrap_or("unknown")
            .to_owned(),
    )
}

/// Why a pod may not mount claim `claim`, whose network volume is in `datacenter`: a volume
/// is in one datacenter on Secure Cloud, so the pod runs there or nowhere, and that place must
/// be one the installation and the pod (or its Job) allow.
pub fn volume_placement_problems(
    effective: &Effective<'_>,
    config: &PolicyConfig,
    claim: &str,
    datacenter: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    let volume = format!("PersistentVolumeClaim {claim:?} is a network volume in {datacenter}");
    let allowed = &config.allowed_datacenters;
    if !allowed.is_empty() && !allowed.iter().any(|id| id == datacenter) {
        problems.push(format!(
            "{volume}, which this installation does not allow (allowed datacenters: {}); the \
             pod could only run there",
            allowed.join(", ")
        ));
    }
    if let Some(sourced) = effective.get(contract::DATACENTER_IDS) {
        let asked = contract::split_list(sourced.value).unwrap_or_default();
        if !asked.is_empty() && !asked.contains(&datacenter) {
            problems.push(format!(
                "{volume}, but annotation {}{} allows only {}; the pod could only run there",
                contract::DATACENTER_IDS,
                sourced.origin(),
                asked.join(", ")
            ));
        }
    }
    if let Some(sourced) = effective.get(contract::CLOUD_TYPE)
        && CloudType::parse(sourced.value) == Some(CloudType::Community)
    {
        problems.push(format!(
            "{volume}, which RunPod attaches only on Secure Cloud, but annotation {}{} is {}",
            contract::CLOUD_TYPE,
            sourced.origin(),
            sourced.value
        ));
    }
    problems
}

/// Well-formed values this cluster does not allow: datacenters outside the allowed list, a price
/// above the cap.
pub fn policy_violations(
    effective: &Effective<'_>,
    gpus: u32,
    config: &PolicyConfig,
) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(sourced) = effective.get(contract::DATACENTER_IDS)
        && !config.allowed_datacenters.is_empty()
    {
        let requested = contract::split_list(sourced.value).unwrap_or_default();
        let offending: Vec<&str> = requested
            .into_iter()
            .filter(|id| {
                !config
                    .allowed_datacenters
                    .iter()
                    .any(|allowed| allowed == id)
            })
            .collect();
        if !offending.is_empty() {
            problems.push(format!(
                "annotation {}{} asks for datacenter(s) {} that this cluster does not \
                     allow; allowed datacenters: {}. Remove the forbidden ids or leave the \
                     annotation out to use any allowed datacenter",
                contract::DATACENTER_IDS,
                sourced.origin(),
                offending.join(", "),
                config.allowed_datacenters.join(", ")
            ));
        }
    }
    let cloud_type = effective
        .get(contract::CLOUD_TYPE)
        .and_then(|sourced| CloudType::parse(sourced.value).map(|cloud| (sourced, cloud)));
    if let Some((sourced, cloud)) = cloud_type
        && !cloud.allowed_in(&config.allowed_cloud_types)
    {
        problems.push(format!(
            "annotation {}{} asks for RunPod's {} cloud, which this cluster does not allow \
             (its hosts are third parties that would receive the pod's Secret env and registry \
             login); allowed: {}. Remove the annotation or ask your platform team",
            contract::CLOUD_TYPE,
            sourced.origin(),
            cloud.as_str(),
            contract::cloud_type_names(&config.allowed_cloud_types)
        ));
    }
    if let (Some(sourced), Some(per_gpu)) =
        (effective.get(contract::MAX_PRICE), config.max_gpu_price)
    {
        let billed_gpus = gpus.max(1);
        let cap = per_gpu * f64::from(billed_gpus);
        if let Ok(price) = contract::parse_price(sourced.value)
            && price > cap + 1e-9
        {
            problems.push(format!(
                "annotation {}{} is {price} USD/h, above this cluster's cap of {cap} USD/h \
                     ({per_gpu} per GPU x {billed_gpus} GPU); lower it to at most {cap}",
                contract::MAX_PRICE,
                sourced.origin()
            ));
        }
    }
    problems
}

/// The admission warning for a price cap below the cheapest GPU on the pod's cloud right now:
/// not a refusal (prices move), but the pod would wait for capacity until it times out.
pub fn cap_below_market(
    effective: &Effective<'_>,
    gpus: u32,
    config: &PolicyConfig,
    cheapest_per_gpu: &BTreeMap<String, f64>,
) -> Option<String> {
    let billed_gpus = gpus.max(1);
    // The cap's source is only written into the warning, so it is only said then.
    let asked = effective.get(contract::MAX_PRICE);
    let cap = match asked {
        Some(sourced) => contract::parse_price(sourced.value).ok()?,
        None => config.max_gpu_price? * f64::from(billed_gpus),
    };
    let cloud = effective
        .get(contract::CLOUD_TYPE)
        .and_then(|sourced| CloudType::parse(sourced.value))
        .unwrap_or_else(|| CloudType::default_within(&config.allowed_cloud_types));
    let per_gpu = *cheapest_per_gpu.get(cloud.as_str())?;
    let cheapest = per_gpu * f64::from(billed_gpus);
    (cap + 1e-9 < cheapest).then(|| {
        let source = match asked {
            Some(sourced) => format!("annotation {}{}", contract::MAX_PRICE, sourced.origin()),
            None => "this cluster's --max-gpu-price".to_owned(),
        };
        format!(
            "runpod-kubelet: the price cap of {cap} USD/h ({source}) is below the cheapest \
             {cloud} GPU on RunPod right now ({per_gpu} USD/h per GPU x {billed_gpus}); the pod \
             waits for a GPU at that price and fails with ProvisioningTimeout if none appears",
            cloud = cloud.as_str()
        )
    })
}

/// GPUs a (typed) pod asks for: the controller's reading of the same rule as [`view_gpu_count`].
pub fn gpu_count(pod: &Pod) -> u32 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    fn gpu(container: &k8s_openapi::api::core::v1::Container) -> Option<&str> {
        let resources = container.resources.as_ref()?;
        let limit = resources
            .limits
            .as_ref()
            .and_then(|l| l.get(contract::GPU_RESOURCE));
        let request = resources
            .requests
            .as_ref()
            .and_then(|r| r.get(contract::GPU_RESOURCE));
        limit.or(request).map(|quantity| quantity.0.as_str())
    }
    count_gpus(
        spec.containers.iter().map(gpu),
        spec.init_containers.iter().flatten().map(gpu),
    )
}

/// GPUs the pod under review asks for.
pub fn view_gpu_count(pod: &PodView) -> u32 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    fn gpu(container: &ContainerView) -> Option<&str> {
        container.resources.as_ref()?.gpu()
    }
    count_gpus(
        spec.containers.iter().map(gpu),
        spec.init_containers.iter().flatten().map(gpu),
    )
}

/// Kubernetes' rule for init containers: the larger of their maximum and the sum over the
/// regular containers (each a GPU quantity, if the container asks for any).
fn count_gpus<'a>(
    regular: impl Iterator<Item = Option<&'a str>>,
    init: impl Iterator<Item = Option<&'a str>>,
) -> u32 {
    let regular: u32 = regular
        .map(|quantity| quantity.map_or(0, quantity_count))
        .fold(0, u32::saturating_add);
    let init = init
        .map(|quantity| quantity.map_or(0, quantity_count))
        .max()
        .unwrap_or(0);
    regular.max(init)
}

/// Extended resources are whole numbers; anything else non-zero still counts as one GPU.
fn quantity_count(quantity: &str) -> u32 {
    let text = quantity.trim();
    match text.parse::<u32>() {
        Ok(count) => count,
        Err(_) if text.is_empty() || text.chars().all(|c| c == '0' || c == '.') => 0,
        Err(_) => 1,
    }
}

/// A declared container port, from either reading of a pod.
struct DeclaredPort<'a> {
    number: i32,
    name: Option<&'a str>,
    protocol: Option<&'a str>,
}

/// The `runpod.io/ports` value auto-detected from a (typed) pod's container ports: the
/// controller's reading of the same rule as [`view_detect_ports`].
pub fn detect_ports(pod: &Pod, warnings: &mut Vec<String>) -> Result<Option<String>, String> {
    let containers = pod.spec.iter().flat_map(|spec| spec.containers.iter());
    let ports = containers
        .flat_map(|c| c.ports.iter().flatten())
        .map(|port| DeclaredPort {
            number: port.container_port,
            name: port.name.as_deref(),
            protocol: port.protocol.as_deref(),
        });
    ports_annotation(ports, warnings)
}

/// The `runpod.io/ports` value auto-detected from the container ports of the pod under review;
/// `None` when it declares no port RunPod can expose.
pub fn view_detect_ports(
    pod: &PodView,
    warnings: &mut Vec<String>,
) -> Result<Option<String>, String> {
    let containers = pod.spec.iter().flat_map(|spec| spec.containers.iter());
    let ports = containers
        .flat_map(|c| c.ports.iter().flatten())
        .map(|port| DeclaredPort {
            number: port.container_port,
            name: port.name.as_deref(),
            protocol: port.protocol.as_deref(),
        });
    ports_annotation(ports, warnings)
}

fn ports_annotation<'a>(
    declared: impl Iterator<Item = DeclaredPort<'a>>,
    warnings: &mut Vec<String>,
) -> Result<Option<String>, String> {
    let mut ports: Vec<PortSpec> = Vec::new();
    for port in declared {
        let protocol = port.protocol.unwrap_or("TCP");
        if protocol != "TCP" {
            warnings.push(format!(
                "runpod-kubelet: container port {}/{protocol} is not exposed; RunPod forwards \
                 only TCP and HTTP",
                port.number
            ));
            continue;
        }
        let Some(number) = u16::try_from(port.number).ok().filter(|p| *p > 0) else {
            continue;
        };
        if ports.iter().any(|known| known.port == number) {
            continue;
        }
        ports.push(PortSpec {
            port: number,
            protocol: contract::detected_protocol(number, port.name),
        });
    }
    if ports.is_empty() {
        return Ok(None);
    }
    let value = contract::format_ports(&ports);
    // The written value must pass the same validation when the pod is reviewed again.
    contract::parse_ports(&value).map_err(|problem| {
        format!(
            "the container ports cannot all be exposed on RunPod ({problem}); set the \
             annotation {} to the ports to expose",
            contract::PORTS
        )
    })?;
    Ok(Some(value))
}
