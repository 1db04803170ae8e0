//! The per-GPU-type prices a RunPod node publishes: for each class and GPU count, every type
//! the catalogue offers in stock inside the installation's data centres, at its list price.
//! No price cap: the webhook applies each pod's own, and names a price above it in a refusal.

use std::collections::BTreeSet;

use runpod_contract::CloudType;
use runpod_contract::gpus::{self, GpuPrices};
use runpod_contract::provider::Cloud;

use super::{ClusterLimits, Requirements, candidates};
use crate::provider::PriceSheet;
use crate::runpod::catalogue::Catalogue;

/// Counts published: RunPod sells up to 8 GPUs per pod.
const MAX_COUNT: u32 = 8;

/// The price sheet of `catalogue` within the installation's data centres.
pub fn price_sheet(catalogue: &Catalogue, data_center_ids: &[String]) -> PriceSheet {
    let limits = ClusterLimits {
        max_gpu_price: f64::INFINITY,
        data_center_ids: data_center_ids.to_vec(),
        cloud_types: Vec::new(),
    };
    let mut observations: Vec<(&'static str, u32, Option<&'static str>, f64)> = Vec::new();
    let mut unknown = BTreeSet::new();
    for cloud in [CloudType::Secure, CloudType::Community] {
        for count in 1..=MAX_COUNT {
            let any = Requirements {
                gpu_count: count,
                min_memory_gb: None,
                gpu_types: Vec::new(),
                cloud,
                max_price_per_hour: None,
                allowed_data_centers: Vec::new(),
            };
            for candidate in candidates(catalogue, &any, &limits) {
                match gpus::identify(
                    Cloud::RunPod,
                    &candidate.gpu_id,
                    candidate.memory_gb.map(f64::from),
                ) {
                    Some(model) => observations.push((
                        model.name,
                        count,
                        Some(cloud.as_str()),
                        candidate.price_per_gpu,
                    )),
                    None => {
                        unknown.insert(candidate.gpu_id);
                    }
                }
            }
        }
    }
    PriceSheet {
        prices: GpuPrices::from_observations(observations, None),
        unknown_gpus: unknown,
        fetched_at: None,
        volume_gpus: volume_gpus(catalogue, data_center_ids),
    }
}

/// The GPU types each datacenter (of the installation's, when it names them) lists on Secure
/// Cloud, in stock now or not: where a network volume's pods can ever run, and on what.
fn volume_gpus(
    catalogue: &Catalogue,
    data_center_ids: &[String],
) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut offered: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for gpu in catalogue.gpus(CloudType::Secure) {
        let Some(model) = gpus::identify(Cloud::RunPod, &gpu.id, gpu.memory.map(f64::from)) else {
            continue;
        };
        for stock in &gpu.data_centers {
            if data_center_ids.is_empty() || data_center_ids.contains(&stock.id) {
                offered
                    .entry(stock.id.clone())
                    .or_default()
                    .insert(model.name.to_owned());
            }
        }
    }
    offered
}
