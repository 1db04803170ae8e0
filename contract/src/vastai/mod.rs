//! The Vast.ai part of the contract: the seed Vast.ai kubelet's annotations, which keep working,
//! and the regions they name, mapped to ISO country codes as Vast.ai's own CLI maps them (the
//! notes' table). The webhook and the controller read them with these same parsers.

mod policy;
mod region;

pub use policy::{Requirements, VastPolicy, requirements};
pub use region::Region;

/// GPU type, as Vast.ai spells it (`RTX 4090`).
pub const GPU_TYPE: &str = "vast.ai/gpu-type";
/// Further acceptable GPU types, comma-separated.
pub const GPU_FALLBACKS: &str = "vast.ai/gpu-fallbacks";
/// USD per hour for the whole instance, storage included.
pub const PRICE_MAX: &str = "vast.ai/price-max";
/// One of [`Region::ALL`]; empty = anywhere the installation allows.
pub const REGION: &str = "vast.ai/region";
/// Per-GPU VRAM, e.g. `24GB`.
pub const MEMORY: &str = "vast.ai/memory";
/// Disk, e.g. `50GB`.
pub const DISK: &str = "vast.ai/disk";
/// Disk of a pod that names none (GB), bought and priced with every instance.
pub const DEFAULT_DISK_GB: u32 = 20;
/// Written by the controller only: the instance running the pod.
pub const INSTANCE_ID: &str = "vast.ai/instance-id";

/// Reads `vast.ai/memory` and `vast.ai/disk`: whole GB with an optional `GB` suffix (`24GB`,
/// `24 gb`, `24`), 1..=65536.
pub fn parse_gb(value: &str) -> Result<u32, String> {
    let trimmed = value.trim();
    let number = trimmed
        .strip_suffix("GB")
        .or_else(|| trimmed.strip_suffix("gb"))
        .or_else(|| trimmed.strip_suffix("Gb"))
        .unwrap_or(trimmed)
        .trim();
    number
        .parse::<u32>()
        .ok()
        .filter(|gb| (1..=65_536).contains(gb))
        .ok_or_else(|| format!("{value:?} is not a whole number of GB such as 24GB"))
}

/// Reads `vast.ai/gpu-type` plus `vast.ai/gpu-fallbacks`: names in order, each once; names keep
/// their inner spaces (`RTX 4090`).
pub fn gpu_names(gpu_type: Option<&str>, fallbacks: Option<&str>) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Vec::new();
    if let Some(first) = gpu_type.map(str::trim).filter(|t| !t.is_empty()) {
        names.push(first.to_owned());
    }
    if let Some(rest) = fallbacks.filter(|f| !f.trim().is_empty()) {
        for name in crate::split_list(rest)? {
            if !names.iter().any(|known| known == name) {
                names.push(name.to_owned());
            }
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_gpu_names() {
        assert_eq!(parse_gb("24GB"), Ok(24));
        assert_eq!(parse_gb(" 24 gb "), Ok(24));
        assert_eq!(parse_gb("50"), Ok(50));
        for bad in ["", "0GB", "24TB", "1.5GB", "-3", "GB"] {
            assert!(parse_gb(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            gpu_names(Some(" RTX 4090 "), Some("RTX 3090, RTX 4090,A100 SXM4")),
            Ok(vec![
                "RTX 4090".to_owned(),
                "RTX 3090".to_owned(),
                "A100 SXM4".to_owned()
            ])
        );
        assert_eq!(gpu_names(None, None), Ok(Vec::new()));
        assert!(gpu_names(Some("RTX 4090"), Some("RTX 3090,,")).is_err());
    }
}
