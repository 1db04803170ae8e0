//! What a pod would cost on each cloud: the cheapest GPU type each cloud publishes that fits
//! the pod under its cap. One rule, used by the webhook (`runpod.io/provider: cheapest`, the
//! admission budget check) and by the controller's budget gate, so both judge a pod alike.

use std::collections::BTreeMap;

use crate::config::PolicyConfig;
use crate::gpus::{GpuPrices, Need, Side};
use crate::provider::Cloud;
use crate::{self as contract, CloudType, checks};

/// Disk a Vast.ai pod that names none is bought with (the controller's default).
const VASTAI_DEFAULT_DISK_GB: u32 = crate::vastai::DEFAULT_DISK_GB;

/// One side per cloud in `clouds` (the pod may use them, in the installation's order): the
/// cheapest fit under the pod's cap there, or `None` where no node has published prices.
pub fn sides(
    effective: &checks::Effective<'_>,
    gpus: u32,
    config: &PolicyConfig,
    prices: &BTreeMap<Cloud, GpuPrices>,
    clouds: &[Cloud],
) -> Vec<Side> {
    clouds
        .iter()
        .map(|cloud| {
            let (need, cap) = match cloud {
                Cloud::RunPod => runpod_need(effective, gpus, config),
                Cloud::VastAi => vastai_need(effective, gpus, config),
            };
            Side {
                cloud: *cloud,
                fits: prices
                    .get(cloud)
                    .filter(|published| !published.is_empty())
                    .map(|published| cheapest_fit(published, &need, cap)),
                cap,
            }
        })
        .collect()
}

/// What `cloud` would charge this pod at least: the cheapest published type that fits it under
/// its cap (`None` when none does), and the cap (USD per hour for the whole pod). The
/// controller's budget gate judges a create by these.
pub fn price_on(
    cloud: Cloud,
    annotations: &BTreeMap<String, String>,
    gpus: u32,
    config: &PolicyConfig,
    prices: &GpuPrices,
) -> (Option<crate::gpus::Fit>, Option<f64>) {
    let effective = checks::Effective::resolve(annotations, None);
    let cap = match cloud {
        Cloud::RunPod => runpod_need(&effective, gpus, config).1,
        Cloud::VastAi => vastai_need(&effective, gpus, config).1,
    };
    (
        fits_on(cloud, &effective, gpus, config, prices).within_cap,
        cap,
    )
}

/// The cheapest published fit of the pod on `cloud`, and the cheapest under its cap.
pub fn fits_on(
    cloud: Cloud,
    effective: &checks::Effective<'_>,
    gpus: u32,
    config: &PolicyConfig,
    prices: &GpuPrices,
) -> crate::gpus::Fits {
    let (need, cap) = match cloud {
        Cloud::RunPod => runpod_need(effective, gpus, config),
        Cloud::VastAi => vastai_need(effective, gpus, config),
    };
    cheapest_fit(prices, &need, cap)
}

/// The cheapest fit at the need's price class; an interruptible pod whose node has published
/// no bid price yet is judged at the on-demand price (it would never pay more).
fn cheapest_fit(prices: &GpuPrices, need: &Need, cap: Option<f64>) -> crate::gpus::Fits {
    let fits = prices.cheapest_fit(need, cap);
    if need.class.as_deref() == Some(crate::interruptible::BID_CLASS) && fits.cheapest.is_none() {
        let on_demand = Need {
            class: None,
            ..need.clone()
        };
        return prices.cheapest_fit(&on_demand, cap);
    }
    fits
}

/// What RunPod would place: `runpod.io/gpu-types`, `-required-gpu-memory`, the cloud class
/// (SECURE unless set), under the smaller of `runpod.io/max-price` and the installation's cap.
fn runpod_need(
    effective: &checks::Effective<'_>,
    gpus: u32,
    config: &PolicyConfig,
) -> (Need, Option<f64>) {
    let value = |key: &str| effective.get(key).map(|sourced| sourced.value);
    let count = gpus.max(1);
    let gpu_types = runpod_gpu_types(effective);
    let class = value(contract::CLOUD_TYPE)
        .and_then(CloudType::parse)
        .unwrap_or_else(|| CloudType::default_within(&config.allowed_cloud_types));
    let pod_cap = value(contract::MAX_PRICE).and_then(|v| contract::parse_price(v).ok());
    let cluster_cap = config
        .max_gpu_price
        .map(|per_gpu| per_gpu * f64::from(count));
    let cap = match (pod_cap, cluster_cap) {
        (Some(pod), Some(cluster)) => Some(pod.min(cluster)),
        (pod, cluster) => pod.or(cluster),
    };
    let need = Need {
        gpu_types,
        min_memory_gb: runpod_memory(effective),
        gpu_count: count,
        class: Some(class.as_str().to_owned()),
        disk_gb: 0,
    };
    (need, cap)
}

/// What Vast.ai would buy: the pod's Vast.ai requirements, its disk priced in.
fn vastai_need(
    effective: &checks::Effective<'_>,
    gpus: u32,
    config: &PolicyConfig,
) -> (Need, Option<f64>) {
    match crate::vastai::requirements(&effective.values(), gpus, &config.vastai) {
        Ok(wanted) => (
            Need {
                gpu_types: wanted.gpu_names,
                min_memory_gb: wanted.min_gpu_memory_gb,
                gpu_count: wanted.gpu_count,
                // Bid prices are compared only for a pod that opted in.
                class: wanted
                    .interruptible
                    .map(|_| crate::interruptible::BID_CLASS.to_owned()),
                disk_gb: wanted.disk_gb.unwrap_or(VASTAI_DEFAULT_DISK_GB),
            },
            wanted.max_price_per_hour,
        ),
        // Not reached: a pod Vast.ai cannot take is no side.
        Err(_) => (Need::default(), Some(0.0)),
    }
}

/// The GPU types a RunPod placement takes: `runpod.io/gpu-types`, else (one vocabulary for both
/// clouds) the pod's `vast.ai/gpu-type` and `-fallbacks`.
fn runpod_gpu_types(effective: &checks::Effective<'_>) -> Vec<String> {
    let value = |key: &str| effective.get(key).map(|sourced| sourced.value);
    match value(contract::GPU_TYPES) {
        Some(types) => contract::split_list(types)
            .map(|names| names.into_iter().map(str::to_owned).collect())
            .unwrap_or_default(),
        None => contract::vastai::gpu_names(
            value(contract::vastai::GPU_TYPE),
            value(contract::vastai::GPU_FALLBACKS),
        )
        .unwrap_or_default(),
    }
}

/// The least VRAM a RunPod placement takes: `runpod.io/required-gpu-memory`, else
/// `vast.ai/memory`.
fn runpod_memory(effective: &checks::Effective<'_>) -> Option<u32> {
    let value = |key: &str| effective.get(key).map(|sourced| sourced.value);
    match value(contract::REQUIRED_GPU_MEMORY) {
        Some(memory) => contract::parse_gpu_memory(memory).ok(),
        None => value(contract::vastai::MEMORY)
            .and_then(|v| contract::vastai::parse_gb(v).ok())
            .filter(|gb| *gb <= 1024),
    }
}

/// When `cheapest` sends to RunPod a pod that named its GPUs or memory only with Vast.ai's
/// annotations: the RunPod annotations to write on it, so that RunPod places what was compared
/// (the controller reads `runpod.io/` only).
pub fn runpod_annotations(effective: &checks::Effective<'_>) -> Vec<(&'static str, String)> {
    let mut written = Vec::new();
    if effective.get(contract::GPU_TYPES).is_none() {
        let types = runpod_gpu_types(effective);
        if !types.is_empty() {
            written.push((contract::GPU_TYPES, types.join(",")));
        }
    }
    if effective.get(contract::REQUIRED_GPU_MEMORY).is_none()
        && let Some(memory) = runpod_memory(effective)
    {
        written.push((contract::REQUIRED_GPU_MEMORY, memory.to_string()));
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::string_map as annotations;

    #[test]
    fn only_a_pod_that_opted_in_is_priced_at_a_bid() {
        let config = PolicyConfig::default();
        let both = GpuPrices::parse("RTX4090x1=0.4,RTX4090x1:INTERRUPTIBLE=0.22");
        let price = |pairs: &[(&str, &str)], prices: &GpuPrices| {
            price_on(Cloud::VastAi, &annotations(pairs), 1, &config, prices)
                .0
                .map(|fit| fit.per_hour)
        };
        assert_eq!(price(&[], &both), Some(0.4), "on-demand");
        assert_eq!(
            price(&[(crate::interruptible::INTERRUPTIBLE, "true")], &both),
            Some(0.22)
        );
        // No bid price published yet: judged at the on-demand price, never at none.
        let on_demand_only = GpuPrices::parse("RTX4090x1=0.4");
        assert_eq!(
            price(
                &[(crate::interruptible::INTERRUPTIBLE, "true")],
                &on_demand_only
            ),
            Some(0.4)
        );
    }
}
