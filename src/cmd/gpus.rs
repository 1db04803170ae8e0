//! `runpod-kubelet gpus`: the placement candidates a pod with these requirements would get,
//! read from the live catalogue — what an operator checks before blaming "no capacity".

use clap::Args;
use runpod_contract::CloudType;
use runpod_kubelet::runpod::args::RunPodArgs;
use runpod_kubelet::runpod::select::{self, ClusterLimits, Requirements};

#[derive(Debug, Args)]
pub struct GpusArgs {
    #[command(flatten)]
    pub runpod: RunPodArgs,
    #[command(flatten)]
    pub cloud_ca: runpod_kubelet::http::CloudCaArgs,
    /// GPUs per pod.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), env = "RUNPOD_KUBELET_GPU_COUNT")]
    pub gpu_count: u32,
    /// Minimum VRAM per GPU in GB (like `runpod.io/required-gpu-memory`).
    #[arg(long, env = "RUNPOD_KUBELET_REQUIRED_GPU_MEMORY")]
    pub required_gpu_memory: Option<u32>,
    /// Allowed GPU type ids in preference order (like `runpod.io/gpu-types`).
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_GPU_TYPES")]
    pub gpu_types: Vec<String>,
    /// SECURE or COMMUNITY.
    #[arg(long, default_value = "SECURE", value_parser = cloud_type, env = "RUNPOD_KUBELET_CLOUD_TYPE")]
    pub cloud_type: CloudType,
    /// Maximum USD per hour for the whole pod (like `runpod.io/max-price`).
    #[arg(long, env = "RUNPOD_KUBELET_MAX_PRICE")]
    pub max_price: Option<f64>,
    /// The cluster's allowed data centres (comma-separated); empty allows any.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_DATACENTER_IDS")]
    pub datacenter_ids: Vec<String>,
    /// The cluster's cap in USD per GPU-hour.
    #[arg(long, default_value_t = 0.5, env = "RUNPOD_KUBELET_MAX_GPU_PRICE")]
    pub max_gpu_price: f64,
    /// Print JSON instead of a table.
    #[arg(long, env = "RUNPOD_KUBELET_JSON")]
    pub json: bool,
}

fn cloud_type(value: &str) -> Result<CloudType, String> {
    CloudType::parse(value).ok_or_else(|| format!("{value:?} is not SECURE or COMMUNITY"))
}

pub async fn run(args: GpusArgs) -> anyhow::Result<()> {
    let client = args.runpod.client(&args.cloud_ca)?;
    let catalogue = client.catalogue().await?;
    let limits = ClusterLimits {
        max_gpu_price: args.max_gpu_price,
        data_center_ids: args.datacenter_ids.clone(),
    };
    let requirements = Requirements {
        gpu_count: args.gpu_count,
        min_memory_gb: args.required_gpu_memory,
        gpu_types: args.gpu_types.clone(),
        cloud: args.cloud_type,
        max_price_per_hour: args.max_price,
        allowed_data_centers: args.datacenter_ids.clone(),
    };
    let candidates = select::candidates(&catalogue, &requirements, &limits);
    if args.json {
        let rows: Vec<_> = candidates
            .iter()
            .map(|c| {
                serde_json::json!({
                    "gpuId": c.gpu_id, "gpuCount": c.gpu_count, "cloud": c.cloud.as_str(),
                    "pricePerHour": c.price_per_hour, "memoryGb": c.memory_gb,
                    "dataCenterIds": c.data_center_ids,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if candidates.is_empty() {
        let cheapest = select::cheapest_price(&catalogue, args.cloud_type, args.gpu_count);
        println!(
            "no GPU type fits these requirements; the cheapest {}-GPU pod on {} costs {}",
            args.gpu_count,
            args.cloud_type.as_str(),
            cheapest.map_or("nothing (none offered)".to_owned(), |p| format!(
                "${p:.2}/h"
            ))
        );
        return Ok(());
    }
    println!(
        "{:<40} {:>5} {:>10} {:>6}  DATA CENTRES",
        "GPU", "COUNT", "USD/HOUR", "VRAM"
    );
    for c in &candidates {
        println!(
            "{:<40} {:>5} {:>10.2} {:>6}  {}",
            c.gpu_id,
            c.gpu_count,
            c.price_per_hour,
            c.memory_gb.map_or("?".to_owned(), |m| format!("{m}GB")),
            if c.data_center_ids.is_empty() {
                "any".to_owned()
            } else {
                c.data_center_ids.join(",")
            }
        );
    }
    Ok(())
}
