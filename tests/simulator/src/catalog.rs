//! `GET /v2/catalog/gpus[/{id}]` and `GET /v2/catalog/datacenters[/{id}]`.
//!
//! Availability comes from the scenario's per-data-centre stock and is the same for every
//! `product` context. The catalogue does not see `Capacity` faults: as on RunPod, it is not a
//! reservation (api-notes P2), so a create can still fail for a GPU listed as available.

use serde_json::{Value, json};

use crate::query::Query;
use crate::reply::Reply;
use crate::scenario::{
    Availability, COMPLIANCE, DataCenterSpec, GpuSpec, Scenario, VOLUME_TYPES, cuda_version,
};

/// The availability filters of the GPU endpoints.
#[derive(Debug)]
struct GpuOptions {
    availability: bool,
    count: u32,
    cloud: String,
    countries: Option<Vec<String>>,
    cuda_exact: Option<Vec<String>>,
    cuda_min: Option<(u32, u32)>,
}

const FILTERS_NEEDING_INCLUDE: [&str; 6] = [
    "product",
    "count",
    "cloud",
    "countryCodes",
    "cudaVersions",
    "minCudaVersion",
];

fn gpu_options(query: &Query) -> Result<GpuOptions, Reply> {
    let mut errors = Vec::new();
    let include = query.enum_list("include", &["AVAILABILITY"], &mut errors);
    if include.as_ref().is_some_and(|i| i.len() > 1) {
        errors.push("query.include: at most 1 item".to_owned());
    }
    let product = query.enum_list("product", &["POD", "CLUSTER", "SERVERLESS"], &mut errors);
    let count = query.integer("count", 1, u64::from(u32::MAX), &mut errors);
    let cloud = query.single("cloud");
    if let Some(cloud) = cloud
        && !matches!(cloud, "SECURE" | "COMMUNITY")
    {
        errors.push(format!(
            "query.cloud: {cloud:?} is not one of SECURE, COMMUNITY"
        ));
    }
    let countries = query.list("countryCodes");
    for code in countries.iter().flatten() {
        if code.len() != 2 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
            errors.push(format!(
                "query.countryCodes: {code:?} is not an uppercase ISO 3166-1 alpha-2 code"
            ));
        }
    }
    let cuda_exact = query.list("cudaVersions");
    for version in cuda_exact.iter().flatten() {
        if cuda_version(version).is_none() {
            errors.push(format!(
                "query.cudaVersions: {version:?} is not major.minor"
            ));
        }
    }
    let cuda_min = query.single("minCudaVersion").and_then(|text| {
        let parsed = if text.contains('.') {
            cuda_version(text)
        } else if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            text.parse().ok().map(|major| (major, 0))
        } else {
            None
        };
        if parsed.is_none() {
            errors.push(format!(
                "query.minCudaVersion: {text:?} is not major or major.minor"
            ));
        }
        parsed
    });
    if !errors.is_empty() {
        return Err(Reply::validation(errors));
    }
    let availability = include.is_some_and(|i| !i.is_empty());
    if availability {
        if product.is_none_or(|p| p.is_empty()) {
            return Err(Reply::problem(
                400,
                "product is required with include=AVAILABILITY",
            ));
        }
    } else if let Some(name) = FILTERS_NEEDING_INCLUDE.iter().find(|name| query.has(name)) {
        return Err(Reply::problem(
            400,
            format!("{name} is only valid together with include=AVAILABILITY"),
        ));
    }
    if cuda_exact.is_some() && cuda_min.is_some() {
        return Err(Reply::problem(
            400,
            "cudaVersions and minCudaVersion are mutually exclusive",
        ));
    }
    Ok(GpuOptions {
        availability,
        count: count.and_then(|c| u32::try_from(c).ok()).unwrap_or(1),
        cloud: cloud.unwrap_or("SECURE").to_owned(),
        countries,
        cuda_exact,
        cuda_min,
    })
}

/// The `GpuType` JSON, or `None` when the filters drop it from the list.
fn gpu_json(scenario: &Scenario, gpu: &GpuSpec, opts: &GpuOptions, listing: bool) -> Option<Value> {
    let mut price = json!({"secure": gpu.price.secure, "community": gpu.price.community});
    if let (Some(serverless), Some(object)) = (gpu.price.serverless, price.as_object_mut()) {
        object.insert("serverless".to_owned(), json!(serverless));
    }
    let mut value = json!({
        "id": gpu.id,
        "name": gpu.name,
        "pool": gpu.pool,
        "manufacturer": gpu.manufacturer.as_str(),
        "memory": gpu.memory,
        "secure": gpu.secure,
        "community": gpu.community,
        "price": price,
        "maxCount": {"secure": gpu.max_count.secure, "community": gpu.max_count.community},
    });
    if !opts.availability {
        return Some(value);
    }
    let community = opts.cloud == "COMMUNITY";
    let (offered, max) = if community {
        (gpu.community, gpu.max_count.community)
    } else {
        (gpu.secure, gpu.max_count.secure)
    };
    // `cloud` selects which cloud's stock is reported, it does not narrow the list
    // (GpuCloudFilter: "Cloud type for availability and lowest-price calculations"): a type
    // not offered there stays listed, with no stock.
    let data_centers: Vec<&DataCenterSpec> = scenario
        .data_centers
        .iter()
        .filter(|dc| dc.gpu_availability.contains_key(&gpu.id))
        .filter(|dc| {
            opts.countries
                .as_ref()
                .is_none_or(|codes| dc.country.as_ref().is_some_and(|c| codes.contains(c)))
        })
        .collect();
    if listing && opts.countries.is_some() && data_centers.is_empty() {
        return None;
    }
    let versions: Vec<&String> = gpu
        .cuda_versions
        .iter()
        .filter(|v| {
            opts.cuda_exact
                .as_ref()
                .is_none_or(|exact| exact.contains(v))
        })
        .filter(|v| {
            opts.cuda_min
                .is_none_or(|min| cuda_version(v).is_some_and(|v| v >= min))
        })
        .collect();
    let cuda_filtered = opts.cuda_exact.is_some() || opts.cuda_min.is_some();
    let placeable = offered && opts.count <= max && (!cuda_filtered || !versions.is_empty());
    let level = |dc: &DataCenterSpec| {
        if placeable {
            dc.gpu_availability
                .get(&gpu.id)
                .copied()
                .unwrap_or(Availability::None)
        } else {
            Availability::None
        }
    };
    let overall = data_centers
        .iter()
        .map(|dc| level(dc))
        .max()
        .unwrap_or(Availability::None);
    let Some(object) = value.as_object_mut() else {
        return Some(value);
    };
    object.insert("availability".to_owned(), json!(overall.as_str()));
    if overall != Availability::None {
        let list: Vec<Value> = data_centers
            .iter()
            .map(|dc| json!({"id": dc.id, "name": dc.name, "availability": level(dc).as_str()}))
            .collect();
        object.insert("dataCenters".to_owned(), json!(list));
    }
    if !gpu.cuda_versions.is_empty() {
        let list: Vec<Value> = versions
            .iter()
            .map(|v| json!({"version": v, "available": overall != Availability::None}))
            .collect();
        object.insert("cudaVersions".to_owned(), json!(list));
    }
    Some(value)
}

/// `GET /v2/catalog/gpus`.
pub(crate) fn list_gpus(scenario: &Scenario, query: &Query) -> Reply {
    let opts = match gpu_options(query) {
        Ok(opts) => opts,
        Err(reply) => return reply,
    };
    let gpus: Vec<Value> = scenario
        .gpus
        .iter()
        .filter_map(|gpu| gpu_json(scenario, gpu, &opts, true))
        .collect();
    Reply::json(200, json!({"gpus": gpus}))
}

/// `GET /v2/catalog/gpus/{id}`.
pub(crate) fn get_gpu(scenario: &Scenario, id: &str, query: &Query) -> Reply {
    let opts = match gpu_options(query) {
        Ok(opts) => opts,
        Err(reply) => return reply,
    };
    match scenario
        .gpu(id)
        .and_then(|gpu| gpu_json(scenario, gpu, &opts, false))
    {
        Some(value) => Reply::json(200, value),
        None => Reply::not_found("GPU type"),
    }
}

#[derive(Debug)]
struct DcOptions {
    gpu: bool,
    cpu: bool,
    regions: Option<Vec<String>>,
    volume_types: Option<Vec<String>>,
    compliance: Option<Vec<String>>,
    global_network: Option<bool>,
}

const REGIONS: [&str; 9] = [
    "NORTH_AMERICA",
    "SOUTH_AMERICA",
    "EUROPE",
    "ASIA",
    "MIDDLE_EAST",
    "AFRICA",
    "OCEANIA",
    "ANTARCTICA",
    "UNKNOWN",
];

fn dc_options(query: &Query, filters: bool) -> Result<DcOptions, Reply> {
    let mut errors = Vec::new();
    let include = query
        .enum_list(
            "include",
            &["GPU_AVAILABILITY", "CPU_AVAILABILITY"],
            &mut errors,
        )
        .unwrap_or_default();
    let mut opts = DcOptions {
        gpu: include.iter().any(|i| i == "GPU_AVAILABILITY"),
        cpu: include.iter().any(|i| i == "CPU_AVAILABILITY"),
        regions: None,
        volume_types: None,
        compliance: None,
        global_network: None,
    };
    if filters {
        opts.regions = query.enum_list("regions", &REGIONS, &mut errors);
        opts.volume_types = query.enum_list("networkVolumeTypes", &VOLUME_TYPES, &mut errors);
        opts.compliance = query.enum_list("compliance", &COMPLIANCE, &mut errors);
        opts.global_network = query.boolean("globalNetwork", &mut errors);
    }
    if errors.is_empty() {
        Ok(opts)
    } else {
        Err(Reply::validation(errors))
    }
}

fn dc_json(scenario: &Scenario, dc: &DataCenterSpec, opts: &DcOptions) -> Value {
    let mut value = json!({
        "id": dc.id,
        "name": dc.name,
        "region": dc.region.as_str(),
        "globalNetwork": dc.global_network,
        "networkVolumeTypes": dc.network_volume_types,
        "compliance": dc.compliance,
    });
    let Some(object) = value.as_object_mut() else {
        return value;
    };
    if opts.gpu {
        let list: Vec<Value> = scenario
            .gpus
            .iter()
            .filter_map(|gpu| {
                let level = dc.gpu_availability.get(&gpu.id)?;
                Some(json!({"id": gpu.id, "name": gpu.name, "availability": level.as_str()}))
            })
            .collect();
        if !list.is_empty() {
            object.insert("gpuAvailability".to_owned(), json!(list));
        }
    }
    if opts.cpu {
        let list: Vec<Value> = scenario
            .cpu_flavors
            .iter()
            .filter_map(|cpu| {
                let level = dc.cpu_availability.get(&cpu.id)?;
                Some(json!({"id": cpu.id, "name": cpu.name, "availability": level.as_str()}))
            })
            .collect();
        if !list.is_empty() {
            object.insert("cpuAvailability".to_owned(), json!(list));
        }
    }
    value
}

/// `GET /v2/catalog/datacenters`: `regions` OR-ed, `networkVolumeTypes` and `compliance`
/// AND-ed, families AND-ed.
pub(crate) fn list_data_centers(scenario: &Scenario, query: &Query) -> Reply {
    let opts = match dc_options(query, true) {
        Ok(opts) => opts,
        Err(reply) => return reply,
    };
    let list: Vec<Value> = scenario
        .data_centers
        .iter()
        .filter(|dc| {
            opts.regions
                .as_ref()
                .is_none_or(|r| r.is_empty() || r.iter().any(|r| r == dc.region.as_str()))
                && opts
                    .volume_types
                    .as_ref()
                    .is_none_or(|v| v.iter().all(|v| dc.network_volume_types.contains(v)))
                && opts
                    .compliance
                    .as_ref()
                    .is_none_or(|c| c.iter().all(|c| dc.compliance.contains(c)))
                && opts.global_network.is_none_or(|g| g == dc.global_network)
        })
        .map(|dc| dc_json(scenario, dc, &opts))
        .collect();
    Reply::json(200, json!({"dataCenters": list}))
}

/// `GET /v2/catalog/datacenters/{id}`.
pub(crate) fn get_data_center(scenario: &Scenario, id: &str, query: &Query) -> Reply {
    let opts = match dc_options(query, false) {
        Ok(opts) => opts,
        Err(reply) => return reply,
    };
    match scenario.data_center(id) {
        Some(dc) => Reply::json(200, dc_json(scenario, dc, &opts)),
        None => Reply::not_found("data center"),
    }
}
