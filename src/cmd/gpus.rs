//! `runpod-kubelet gpus`: the GPU catalogue (the names pods may use on either cloud) with each
//! cloud's lowest price now; given a pod's requirements, the RunPod placement candidates it
//! would get — what an operator checks before blaming "no capacity".

use std::collections::BTreeMap;

use clap::Args;
use runpod_contract::provider::Cloud;
use runpod_contract::{CloudType, gpus};
use runpod_kubelet::runpod::args::RunPodArgs;
use runpod_kubelet::runpod::select::{self, ClusterLimits, Requirements};
use runpod_kubelet::vastai::args::{VastArgs, VastPolicyArgs};
use runpod_kubelet::vastai::select::OfferQuery;

#[derive(Debug, Args)]
pub(crate) struct GpusArgs {
    #[command(flatten)]
    pub runpod: RunPodArgs,
    #[command(flatten)]
    pub vastai: VastArgs,
    #[command(flatten)]
    pub vastai_policy: VastPolicyArgs,
    #[command(flatten)]
    pub cloud_ca: runpod_kubelet::http::CloudCaArgs,
    /// GPUs per pod (with any of these requirement flags, the RunPod placement candidates are
    /// printed instead of the catalogue).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), env = "RUNPOD_KUBELET_GPU_COUNT")]
    pub gpu_count: Option<u32>,
    /// Minimum VRAM per GPU in GB (like `runpod.io/required-gpu-memory`).
    #[arg(long, env = "RUNPOD_KUBELET_REQUIRED_GPU_MEMORY")]
    pub required_gpu_memory: Option<u32>,
    /// Allowed GPU types in preference order, any spelling of the catalogue (like
    /// `runpod.io/gpu-types`).
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_GPU_TYPES")]
    pub gpu_types: Vec<String>,
    /// SECURE or COMMUNITY (default SECURE).
    #[arg(long, value_parser = runpod_kubelet::flags::cloud_type, env = "RUNPOD_KUBELET_CLOUD_TYPE")]
    pub cloud_type: Option<CloudType>,
    /// Maximum USD per hour for the whole pod (like `runpod.io/max-price`).
    #[arg(long, env = "RUNPOD_KUBELET_MAX_PRICE")]
    pub max_price: Option<f64>,
    /// The cluster's allowed data centres (comma-separated); empty allows any.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_DATACENTER_IDS")]
    pub datacenter_ids: Vec<String>,
    /// The cluster's cap in USD per GPU-hour (for placement candidates).
    #[arg(long, default_value_t = 0.5, env = "RUNPOD_KUBELET_MAX_GPU_PRICE")]
    pub max_gpu_price: f64,
    /// Print JSON instead of a table.
    #[arg(long, env = "RUNPOD_KUBELET_JSON")]
    pub json: bool,
}

pub(crate) async fn run(args: GpusArgs) -> anyhow::Result<()> {
    let candidates_asked = args.gpu_count.is_some()
        || args.required_gpu_memory.is_some()
        || !args.gpu_types.is_empty()
        || args.cloud_type.is_some()
        || args.max_price.is_some();
    if candidates_asked {
        candidates(args).await
    } else {
        catalogue(args).await
    }
}

/// The GPU catalogue with each cloud's lowest price per GPU-hour inside the policy, read from
/// each cloud whose key is in the environment.
async fn catalogue(args: GpusArgs) -> anyhow::Result<()> {
    let runpod_key = std::env::var_os(runpod_kubelet::runpod::config::API_KEY_ENV).is_some();
    let vast_key = std::env::var_os(runpod_kubelet::vastai::client::API_KEY_ENV).is_some();
    if !runpod_key && !vast_key {
        anyhow::bail!(
            "set {} or {} (or both) to read each cloud's prices",
            runpod_kubelet::runpod::config::API_KEY_ENV,
            runpod_kubelet::vastai::client::API_KEY_ENV
        );
    }
    let mut unknown = BTreeMap::new();
    let mut prices: BTreeMap<Cloud, BTreeMap<String, f64>> = BTreeMap::new();
    if runpod_key {
        let client = args.runpod.client(&args.cloud_ca)?;
        let catalogue = client.catalogue().await?;
        let sheet = select::price_sheet(&catalogue, &args.datacenter_ids);
        unknown.insert(Cloud::RunPod, sheet.unknown_gpus);
        prices.insert(Cloud::RunPod, sheet.prices.lowest_per_gpu());
    }
    if vast_key {
        let client = args.vastai.client(&args.cloud_ca)?;
        let policy = args
            .vastai_policy
            .policy(args.max_gpu_price)
            .map_err(anyhow::Error::msg)?;
        let mut sheet = runpod_kubelet::provider::PriceSheet::default();
        for query in OfferQuery::price_searches(&policy) {
            let offers = client.search(&query).await?;
            sheet.merge(runpod_kubelet::vastai::prices::price_sheet(
                &offers,
                query.disk_gb,
                query.interruptible.is_some(),
            ));
        }
        unknown.insert(Cloud::VastAi, sheet.unknown_gpus);
        prices.insert(Cloud::VastAi, sheet.prices.lowest_per_gpu());
    }
    let price = |cloud: Cloud, gpu: &str| prices.get(&cloud).and_then(|p| p.get(gpu)).copied();
    if args.json {
        let rows: Vec<_> = gpus::CATALOGUE
            .iter()
            .map(|model| {
                serde_json::json!({
                    "name": model.name, "memoryGb": model.memory_gb,
                    "runpod": {"names": model.runpod, "lowestPerGpuHour": price(Cloud::RunPod, model.name)},
                    "vastai": {"names": model.vastai, "lowestPerGpuHour": price(Cloud::VastAi, model.name)},
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let shown = |cloud: Cloud, gpu: &str| match (prices.contains_key(&cloud), price(cloud, gpu)) {
        (false, _) => "no key".to_owned(),
        (true, None) => "-".to_owned(),
        (true, Some(p)) => format!("{p:.2}"),
    };
    println!(
        "{:<16} {:>6} {:>8} {:>8}  NAMES (RunPod | Vast.ai)",
        "GPU", "VRAM", "RUNPOD", "VAST.AI"
    );
    for model in gpus::CATALOGUE {
        println!(
            "{:<16} {:>6} {:>8} {:>8}  {} | {}",
            model.name,
            format!("{}GB", model.memory_gb),
            shown(Cloud::RunPod, model.name),
            shown(Cloud::VastAi, model.name),
            model.runpod.join(", "),
            model.vastai.join(", ")
        );
    }
    println!(
        "Lowest USD per GPU-hour inside the policy (Vast.ai without disk); \"-\": not on sale \
         now. Pods may name a GPU in any of these spellings."
    );
    for (cloud, names) in unknown.iter().filter(|(_, names)| !names.is_empty()) {
        println!(
            "{} also sells GPUs this catalogue does not know (pods cannot name them): {}",
            cloud.display_name(),
            names.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}

/// The RunPod placement candidates for given requirements, cheapest first.
async fn candidates(args: GpusArgs) -> anyhow::Result<()> {
    let client = args.runpod.client(&args.cloud_ca)?;
    let catalogue = client.catalogue().await?;
    let limits = ClusterLimits {
        max_gpu_price: args.max_gpu_price,
        data_center_ids: args.datacenter_ids.clone(),
        cloud_types: Vec::new(),
    };
    let gpu_count = args.gpu_count.unwrap_or(1);
    let cloud = args.cloud_type.unwrap_or(CloudType::Secure);
    let requirements = Requirements {
        gpu_count,
        min_memory_gb: args.required_gpu_memory,
        gpu_types: args.gpu_types.clone(),
        cloud,
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
        let cheapest = select::cheapest_price(&catalogue, cloud, gpu_count);
        println!(
            "no GPU type fits these requirements; the cheapest {}-GPU pod on {} costs {}",
            gpu_count,
            cloud.as_str(),
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
