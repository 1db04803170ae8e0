//! One GPU vocabulary for both clouds: canonical names spelled as SkyPilot spells its
//! accelerators (`H100`, `A100-80GB`, `RTXA6000`), each with its memory and every name RunPod
//! (`gpuTypeIds`) and Vast.ai (`gpu_name`) use for it. A pod's GPU-type annotations accept any of
//! these spellings, so one list means the same GPUs on either cloud and `cheapest` can compare
//! like with like.

mod cheapest;
mod index;
pub mod pod_price;
mod prices;

pub use cheapest::{Cheapest, Side, cheapest, recorded_choice};
pub use prices::{
    Fit, Fits, GPU_PRICES, GpuPrices, Need, PUBLISHED_AT_KEY, PriceKey, Quote, STALE_AFTER_SECS,
    STORAGE_KEY,
};

use crate::provider::Cloud;

/// One GPU model as both clouds sell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuModel {
    /// The canonical name.
    pub name: &'static str,
    /// VRAM per GPU, GB.
    pub memory_gb: u32,
    /// RunPod `gpuTypeIds` (verbatim; several where RunPod lists variants or typos).
    pub runpod: &'static [&'static str],
    /// Vast.ai `gpu_name`s, with spaces. Vast.ai gives one name to several memory sizes
    /// (`A100 SXM4` is 40 or 80 GB); the offer's `gpu_ram` tells them apart.
    pub vastai: &'static [&'static str],
}

impl GpuModel {
    /// This model's names on `cloud`.
    pub fn names_on(&self, cloud: Cloud) -> &'static [&'static str] {
        match cloud {
            Cloud::RunPod => self.runpod,
            Cloud::VastAi => self.vastai,
        }
    }
}

const fn model(
    name: &'static str,
    memory_gb: u32,
    runpod: &'static [&'static str],
    vastai: &'static [&'static str],
) -> GpuModel {
    GpuModel {
        name,
        memory_gb,
        runpod,
        vastai,
    }
}

/// Every GPU either cloud sells that a pod may name, largest memory first within each cloud's
/// group. RunPod ids come from
/// its catalogue, Vast.ai names from its `gpu_names` list; the ids RunPod spells with a double
/// space or without one (`NVIDIA  RTX A4500`, `NVIDIA GeForce RTX 3080TI`) match through
/// [`normalize`].
pub const CATALOGUE: &[GpuModel] = &[
    model("B300", 288, &["NVIDIA B300 SXM6 AC"], &["B300"]),
    model("MI300X", 192, &["AMD Instinct MI300X OAM"], &[]),
    model("B200", 180, &["NVIDIA B200"], &["B200"]),
    model("H200-NVL", 143, &["NVIDIA H200 NVL"], &["H200 NVL"]),
    model("H200", 141, &["NVIDIA H200"], &["H200"]),
    model(
        "RTXPRO6000",
        96,
        &[
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        ],
        &["RTX PRO 6000 WS", "RTX PRO 6000 S"],
    ),
    model("H100-NVL", 94, &["NVIDIA H100 NVL"], &["H100 NVL"]),
    model("H100", 80, &["NVIDIA H100 80GB HBM3"], &["H100 SXM"]),
    model("H100-PCIE", 80, &["NVIDIA H100 PCIe"], &["H100 PCIE"]),
    model("A100-80GB", 80, &["NVIDIA A100-SXM4-80GB"], &["A100 SXM4"]),
    model(
        "A100-80GB-PCIE",
        80,
        &["NVIDIA A100 80GB PCIe"],
        &["A100 PCIE"],
    ),
    model("RTXA6000", 48, &["NVIDIA RTX A6000"], &["RTX A6000"]),
    model(
        "RTX6000-Ada",
        48,
        &["NVIDIA RTX 6000 Ada Generation"],
        &["RTX 6000Ada"],
    ),
    model("L40S", 48, &["NVIDIA L40S"], &["L40S"]),
    model("L40", 48, &["NVIDIA L40"], &["L40"]),
    model("A40", 48, &["NVIDIA A40"], &["A40"]),
    model("A100", 40, &["NVIDIA A100-SXM4-40GB"], &["A100 SXM4"]),
    model("A100-PCIE", 40, &[], &["A100 PCIE"]),
    model("RTX5090", 32, &["NVIDIA GeForce RTX 5090"], &["RTX 5090"]),
    model(
        "RTX5000-Ada",
        32,
        &["NVIDIA RTX 5000 Ada Generation", "NVIDIA A5000 Ada"],
        &["RTX 5000Ada"],
    ),
    model("RTXPRO4500", 32, &["NVIDIA RTX PRO 4500 Blackwell"], &[]),
    model(
        "V100-32GB",
        32,
        &["Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB"],
        &["Tesla V100"],
    ),
    model("RTX4090", 24, &["NVIDIA GeForce RTX 4090"], &["RTX 4090"]),
    model("RTX3090", 24, &["NVIDIA GeForce RTX 3090"], &["RTX 3090"]),
    model(
        "RTX3090-Ti",
        24,
        &["NVIDIA GeForce RTX 3090 Ti"],
        &["RTX 3090 Ti"],
    ),
    model("RTXA5000", 24, &["NVIDIA RTX A5000"], &["RTX A5000"]),
    model("L4", 24, &["NVIDIA L4"], &["L4"]),
    model("A30", 24, &["NVIDIA A30", "NVIDIA RTX A30"], &["A30"]),
    model("A10", 24, &[], &["A10"]),
    model("RTXA4500", 20, &["NVIDIA RTX A4500"], &["RTX A4500"]),
    model(
        "RTX4000-Ada",
        20,
        &["NVIDIA RTX 4000 Ada Generation"],
        &["RTX 4000Ada"],
    ),
    model(
        "RTX4000-Ada-SFF",
        20,
        &["NVIDIA RTX 4000 SFF Ada Generation"],
        &[],
    ),
    model("RTX5080", 16, &["NVIDIA GeForce RTX 5080"], &["RTX 5080"]),
    model("RTX4080", 16, &["NVIDIA GeForce RTX 4080"], &["RTX 4080"]),
    model(
        "RTX4080-SUPER",
        16,
        &["NVIDIA GeForce RTX 4080 SUPER"],
        &["RTX 4080S"],
    ),
    model(
        "RTX2000-Ada",
        16,
        &["NVIDIA RTX 2000 Ada Generation"],
        &["RTX 2000Ada"],
    ),
    model("RTXA4000", 16, &["NVIDIA RTX A4000"], &["RTX A4000"]),
    model(
        "V100",
        16,
        &[
            "Tesla V100-PCIE-16GB",
            "Tesla V100-SXM2-16GB",
            "Tesla V100-FHHL-16GB",
        ],
        &["Tesla V100"],
    ),
    model("T4", 16, &["Tesla T4"], &["Tesla T4"]),
    model(
        "RTX3080-Ti",
        12,
        &["NVIDIA GeForce RTX 3080 Ti"],
        &["RTX 3080 Ti"],
    ),
    model(
        "RTX4070-Ti",
        12,
        &["NVIDIA GeForce RTX 4070 Ti"],
        &["RTX 4070 Ti"],
    ),
    model("RTX3080", 10, &["NVIDIA GeForce RTX 3080"], &["RTX 3080"]),
    model("RTX3070", 8, &["NVIDIA GeForce RTX 3070"], &["RTX 3070"]),
    model("RTXA2000", 6, &["NVIDIA RTX A2000"], &["RTX A2000"]),
    // Sold on Vast.ai only (its `gpu_names`), so that pods may name them too.
    model("GH200", 96, &[], &["GH200 SXM"]),
    model("A800", 80, &[], &["A800 PCIE"]),
    model("RTX8000", 48, &[], &["Q RTX 8000"]),
    model("RTX6000", 24, &[], &["Q RTX 6000"]),
    model("P40", 24, &[], &["Tesla P40"]),
    model("TITAN-RTX", 24, &[], &["Titan RTX"]),
    model("RTX5070-Ti", 16, &[], &["RTX 5070 Ti"]),
    model("RTX5060-Ti", 16, &[], &["RTX 5060 Ti"]),
    model("RTX4060-Ti", 16, &[], &["RTX 4060 Ti"]),
    model("RTX4070-Ti-SUPER", 16, &[], &["RTX 4070 Ti SUPER"]),
    model("P100", 16, &[], &["Tesla P100"]),
    model("RTX5070", 12, &[], &["RTX 5070"]),
    model("RTX4070", 12, &[], &["RTX 4070"]),
    model("RTX4070-SUPER", 12, &[], &["RTX 4070S"]),
    model("RTX3060", 12, &[], &["RTX 3060"]),
    model("RTX2080-Ti", 11, &[], &["RTX 2080 Ti"]),
    model("GTX1080-Ti", 11, &[], &["GTX 1080 Ti"]),
    model("RTX3060-Ti", 8, &[], &["RTX 3060 Ti"]),
];

/// How names are compared: case, spaces and underscores (the Vast.ai CLI's spelling of a space)
/// ignored, so `RTX_4090`, `rtx 4090` and `RTX 4090` are one name.
pub fn normalize(name: &str) -> String {
    // GPU names are ASCII: byte by byte, without the Unicode case tables.
    if name.is_ascii() {
        return name
            .bytes()
            .filter(|b| !b.is_ascii_whitespace() && *b != b'\x0b' && *b != b'_')
            .map(|b| char::from(b.to_ascii_lowercase()))
            .collect();
    }
    name.chars()
        .filter(|c| !c.is_whitespace() && *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Whether `name` normalizes to `wanted` (already normalized), without building a string:
/// every admission review compares a Job's GPU names with every name in the catalogue.
pub fn normalizes_to(name: &str, wanted: &str) -> bool {
    name.chars()
        .filter(|c| !c.is_whitespace() && *c != '_')
        .flat_map(char::to_lowercase)
        .eq(wanted.chars())
}

/// The model with this canonical name.
pub fn by_name(name: &str) -> Option<&'static GpuModel> {
    index::INDEX.canonical(&normalize(name))
}

/// The models a name a user wrote stands for: its canonical model, else every model either
/// cloud sells under that name (Vast.ai's `A100 SXM4` is both `A100` and `A100-80GB`). Empty
/// for a name no cloud uses.
pub fn resolve(name: &str) -> Vec<&'static GpuModel> {
    let wanted = normalize(name);
    if let Some(model) = index::INDEX.canonical(&wanted) {
        return vec![model];
    }
    index::INDEX.sold_by_either_as(&wanted)
}

/// Whether some model answers to `name` (what [`resolve`] finds is not empty), without
/// collecting the models: every review of a Job's pod checks each of its GPU names.
pub fn is_known(name: &str) -> bool {
    let wanted = normalize(name);
    index::INDEX.canonical(&wanted).is_some()
        || index::INDEX.is_sold_as(Cloud::RunPod, &wanted)
        || index::INDEX.is_sold_as(Cloud::VastAi, &wanted)
}

/// The model a cloud's own name for the GPU it sells denotes; where one name covers several
/// memory sizes, the size closest to `memory_gb` (the largest when unknown). `None` for a name
/// the catalogue does not know (a GPU the cloud has started to sell since).
pub fn identify(cloud: Cloud, name: &str, memory_gb: Option<f64>) -> Option<&'static GpuModel> {
    let matches = index::INDEX.sold_as(cloud, &normalize(name));
    let mut matches = matches.into_iter();
    let first = matches.next()?;
    let Some(memory) = memory_gb.filter(|m| m.is_finite()) else {
        return Some(first);
    };
    let distance = |m: &GpuModel| (f64::from(m.memory_gb) - memory).abs();
    Some(matches.fold(first, |best, m| {
        if distance(m) < distance(best) {
            m
        } else {
            best
        }
    }))
}

/// Where a GPU a cloud sells (its own name, and its memory when known) comes in a pod's list of
/// wanted GPU names: the first entry naming it verbatim (case and spaces ignored) or standing
/// for its model. `None` when the list does not ask for it.
pub fn preference(
    wanted: &[String],
    cloud: Cloud,
    name: &str,
    memory_gb: Option<f64>,
) -> Option<usize> {
    let own = normalize(name);
    let model = identify(cloud, name, memory_gb);
    wanted.iter().position(|asked| {
        let asked_name = normalize(asked);
        if asked_name == own {
            return true;
        }
        // This cloud's own spelling means exactly the GPUs it sells under that name (the Go
        // kubelets' meaning); a canonical name or the other cloud's spelling, its models.
        !is_own_spelling(cloud, &asked_name)
            && model.is_some_and(|model| resolve(asked).iter().any(|m| m.name == model.name))
    })
}

/// Whether `normalized` is a name `cloud` itself sells GPUs under (and not a canonical name).
fn is_own_spelling(cloud: Cloud, normalized: &str) -> bool {
    index::INDEX.canonical(normalized).is_none() && index::INDEX.is_sold_as(cloud, normalized)
}

/// A cloud's names to search for the wanted names, in order, each once: a canonical name (or
/// the other cloud's spelling) becomes this cloud's names for its models; this cloud's own
/// spelling, and a name the catalogue does not know, are kept as written.
pub fn names_on(wanted: &[String], cloud: Cloud) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for asked in wanted {
        let models = if is_own_spelling(cloud, &normalize(asked)) {
            Vec::new()
        } else {
            resolve(asked)
        };
        let own: Vec<String> = if models.is_empty() {
            vec![asked.trim().to_owned()]
        } else {
            models
                .iter()
                .flat_map(|m| m.names_on(cloud).iter().map(|n| (*n).to_owned()))
                .collect()
        };
        for name in own {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// The least memory per GPU (GB) of the models the wanted names stand for on `cloud`, to search
/// with: a cloud name that covers several sizes (Vast.ai's `A100 SXM4`) then skips the smaller
/// cards an `A100-80GB` pod does not want. `None` (no floor) when a name is the cloud's own
/// spelling (it means every size sold under it) or unknown.
pub fn memory_floor_gb(wanted: &[String], cloud: Cloud) -> Option<u32> {
    let mut least: Option<u32> = None;
    for asked in wanted {
        if is_own_spelling(cloud, &normalize(asked)) {
            return None;
        }
        let smallest = resolve(asked).iter().map(|m| m.memory_gb).min()?;
        least = Some(least.map_or(smallest, |l| l.min(smallest)));
    }
    least
}

/// Why a GPU name is refused, listing what is known.
pub fn unknown(name: &str) -> String {
    format!(
        "{name:?} is not a GPU runpod-kubelet knows; use a name from `runpod-kubelet gpus` \
         ({}), or either cloud's own spelling of one (`NVIDIA H100 80GB HBM3`, `H100 SXM`)",
        CATALOGUE
            .iter()
            .map(|m| m.name)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Checks a comma-separated list of GPU names: well formed, and every name known.
pub fn check_list(value: &str) -> Result<(), String> {
    let names = crate::split_list(value)?;
    match names.iter().find(|name| !is_known(name)) {
        Some(name) => Err(unknown(name)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
