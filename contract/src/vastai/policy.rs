//! What a Vast.ai pod asks for and what the installation allows, in one pure reading shared by
//! the webhook (which refuses a pod outside the policy, naming what is allowed) and the
//! controller (which searches offers only inside it). Where a `vast.ai/` annotation and its
//! generic `runpod.io/` counterpart are both given, the `vast.ai/` one wins.

use std::collections::{BTreeMap, BTreeSet};

use super::Region;
use crate as contract;

/// The installation's Vast.ai policy, from the flags both components take.
#[derive(Debug, Clone, PartialEq)]
pub struct VastPolicy {
    /// Countries instances may run in; `None` = anywhere.
    pub countries: Option<BTreeSet<String>>,
    /// How the allowed places were configured, for messages: regions or countries.
    pub allowed: String,
    pub datacenter_only: bool,
    pub verified_only: bool,
    pub min_reliability: f64,
    /// USD per GPU-hour, storage included.
    pub max_gpu_price: Option<f64>,
}

impl Default for VastPolicy {
    /// The flags' defaults: anywhere, verified hosts only, reliability 0.98, no price cap.
    fn default() -> Self {
        VastPolicy {
            countries: None,
            allowed: "anywhere".to_owned(),
            datacenter_only: false,
            verified_only: true,
            min_reliability: 0.98,
            max_gpu_price: None,
        }
    }
}

impl VastPolicy {
    /// `--vastai-regions` or `--vastai-countries` (not both), `--vastai-datacenter-only`,
    /// `--vastai-verified-only`, `--vastai-min-reliability`, `--max-gpu-price`.
    pub fn from_flags(
        regions: &[String],
        countries: &[String],
        datacenter_only: bool,
        verified_only: bool,
        min_reliability: f64,
        max_gpu_price: Option<f64>,
    ) -> Result<VastPolicy, String> {
        let regions: Vec<&str> = regions
            .iter()
            .map(|r| r.trim())
            .filter(|r| !r.is_empty())
            .collect();
        let codes: Vec<String> = countries
            .iter()
            .map(|c| c.trim().to_ascii_uppercase())
            .filter(|c| !c.is_empty())
            .collect();
        if !regions.is_empty() && !codes.is_empty() {
            return Err("give --vastai-regions or --vastai-countries, not both".into());
        }
        if !(0.0..=1.0).contains(&min_reliability) {
            return Err(format!(
                "--vastai-min-reliability {min_reliability} is not between 0 and 1"
            ));
        }
        let (countries, allowed) = if !regions.is_empty() {
            let parsed = regions
                .iter()
                .map(|name| {
                    Region::parse(name).ok_or_else(|| {
                        format!(
                            "--vastai-regions: {name:?} is not one of {}",
                            region_names(&Region::ALL)
                        )
                    })
                })
                .collect::<Result<Vec<Region>, String>>()?;
            let codes = parsed
                .iter()
                .flat_map(|region| region.countries().iter().map(|c| (*c).to_owned()))
                .collect();
            (Some(codes), format!("regions {}", region_names(&parsed)))
        } else if !codes.is_empty() {
            if let Some(bad) = codes
                .iter()
                .find(|c| c.len() != 2 || !c.chars().all(|ch| ch.is_ascii_uppercase()))
            {
                return Err(format!(
                    "--vastai-countries: {bad:?} is not a two-letter ISO country code"
                ));
            }
            let allowed = format!("countries {}", codes.join(","));
            (Some(codes.into_iter().collect()), allowed)
        } else {
            (None, "anywhere".to_owned())
        };
        Ok(VastPolicy {
            countries,
            allowed,
            datacenter_only,
            verified_only,
            min_reliability,
            max_gpu_price,
        })
    }
}

fn region_names(regions: &[Region]) -> String {
    regions
        .iter()
        .map(|r| r.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a pod needs from an offer, inside the policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirements {
    /// Vast.ai GPU names in order of preference; empty = any.
    pub gpu_names: Vec<String>,
    pub gpu_count: u32,
    pub min_gpu_memory_gb: Option<u32>,
    /// USD/h for the whole instance, storage included: the pod's cap, within the policy's.
    pub max_price_per_hour: Option<f64>,
    /// Where it may run; empty = anywhere.
    pub countries: Vec<String>,
    pub disk_gb: Option<u32>,
    /// Set: the pod may run on an interruptible bid (at most its ceiling, when it names one).
    pub interruptible: Option<crate::interruptible::Interruptible>,
}

/// The host countries a pod may use: its `vast.ai/region` within the cluster's allowed
/// countries, else those (empty: anywhere). A region unknown or wholly outside is a problem.
fn countries(region: Option<&str>, policy: &VastPolicy, problems: &mut Vec<String>) -> Vec<String> {
    let allowed: Vec<String> = policy
        .countries
        .as_ref()
        .map(|allowed| allowed.iter().cloned().collect())
        .unwrap_or_default();
    let Some(name) = region else {
        return allowed;
    };
    let Some(region) = Region::parse(name) else {
        problems.push(format!(
            "{}: {name:?} is not one of {}",
            super::REGION,
            region_names(&Region::ALL)
        ));
        return allowed;
    };
    let inside: Vec<String> = region
        .countries()
        .iter()
        .filter(|code| {
            policy
                .countries
                .as_ref()
                .is_none_or(|allowed| allowed.contains(**code))
        })
        .map(|code| (*code).to_owned())
        .collect();
    if inside.is_empty() {
        problems.push(format!(
            "{}: {} is outside this cluster's allowed {}",
            super::REGION,
            region.name(),
            policy.allowed
        ));
    }
    inside
}

/// Reads a pod's annotations against the policy. `Err` lists every problem: malformed values,
/// and (mentioning what is allowed) a region or price outside the policy.
pub fn requirements(
    annotations: &BTreeMap<String, String>,
    gpu_count: u32,
    policy: &VastPolicy,
) -> Result<Requirements, Vec<String>> {
    let get = |key: &str| {
        annotations
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    };
    let mut problems = Vec::new();
    let mut read = |key: &str, result: Result<u32, String>| match result {
        Ok(value) => Some(value),
        Err(problem) => {
            problems.push(format!("{key}: {problem}"));
            None
        }
    };
    let gpu_count = gpu_count.max(1);
    let memory = match (get(super::MEMORY), get(contract::REQUIRED_GPU_MEMORY)) {
        (Some(value), _) => read(super::MEMORY, super::parse_gb(value)),
        (None, Some(value)) => read(
            contract::REQUIRED_GPU_MEMORY,
            contract::parse_gpu_memory(value),
        ),
        (None, None) => None,
    };
    let disk = match (get(super::DISK), get(contract::DISK)) {
        (Some(value), _) => read(super::DISK, super::parse_gb(value)),
        (None, Some(value)) => read(contract::DISK, contract::parse_disk(value)),
        (None, None) => None,
    };
    let (names_key, names) = match (
        get(super::GPU_TYPE),
        get(super::GPU_FALLBACKS),
        get(contract::GPU_TYPES),
    ) {
        (None, None, Some(generic)) => (
            contract::GPU_TYPES,
            contract::split_list(generic)
                .map(|names| names.iter().map(|n| (*n).to_owned()).collect()),
        ),
        (first, rest, _) => (super::GPU_FALLBACKS, super::gpu_names(first, rest)),
    };
    let gpu_names = names.unwrap_or_else(|problem| {
        problems.push(format!("{names_key}: {problem}"));
        Vec::new()
    });
    let price = match (get(super::PRICE_MAX), get(contract::MAX_PRICE)) {
        (Some(value), _) => Some((super::PRICE_MAX, contract::parse_price(value))),
        (None, Some(value)) => Some((contract::MAX_PRICE, contract::parse_price(value))),
        (None, None) => None,
    };
    let mut max_price_per_hour = None;
    if let Some((key, parsed)) = price {
        match parsed {
            Ok(price) => max_price_per_hour = Some(price),
            Err(problem) => problems.push(format!("{key}: {problem}")),
        }
    }
    let policy_cap = policy
        .max_gpu_price
        .map(|per_gpu| per_gpu * f64::from(gpu_count));
    match (max_price_per_hour, policy_cap) {
        (Some(asked), Some(cap)) if asked > cap + 1e-9 => problems.push(format!(
            "a price cap of {asked} USD/h is above this cluster's limit of {cap} USD/h for {gpu_count} GPU(s)"
        )),
        (None, Some(cap)) => max_price_per_hour = Some(cap),
        _ => {}
    }
    let countries = countries(get(super::REGION), policy, &mut problems);
    let interruptible =
        crate::interruptible::interruptible(annotations).unwrap_or_else(|problem| {
            problems.push(problem);
            None
        });
    // The bid is the compute's price; the instance's cap counts its storage too.
    if let (Some(ceiling), Some(cap)) = (
        interruptible.and_then(|asked| asked.max_bid),
        max_price_per_hour,
    ) && ceiling > cap + 1e-9
    {
        problems.push(format!(
            "a bid ceiling of {ceiling} USD/h is above the pod's price cap of {cap} USD/h"
        ));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Requirements {
        gpu_names,
        gpu_count,
        min_gpu_memory_gb: memory,
        max_price_per_hour,
        countries,
        disk_gb: disk,
        interruptible,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::string_map as annotations;

    fn europe() -> VastPolicy {
        VastPolicy::from_flags(&["Europe".into()], &[], false, true, 0.98, Some(1.0)).unwrap()
    }

    #[test]
    fn policies_come_from_regions_or_countries() {
        let policy = VastPolicy::from_flags(
            &["europe".into(), "North_America".into()],
            &[],
            true,
            true,
            0.99,
            None,
        )
        .unwrap();
        let countries = policy.countries.as_ref().unwrap();
        assert!(countries.contains("DE") && countries.contains("US") && !countries.contains("JP"));
        assert_eq!(policy.allowed, "regions Europe, North America");
        let policy =
            VastPolicy::from_flags(&[], &["de".into(), " PL".into()], false, true, 0.98, None)
                .unwrap();
        assert_eq!(policy.allowed, "countries DE,PL");
        assert_eq!(
            VastPolicy::from_flags(&[], &[], false, true, 0.98, None)
                .unwrap()
                .countries,
            None
        );
        assert!(
            VastPolicy::from_flags(&["Europe".into()], &["DE".into()], false, true, 0.98, None)
                .is_err()
        );
        assert!(
            VastPolicy::from_flags(&["Atlantis".into()], &[], false, true, 0.98, None).is_err()
        );
        assert!(VastPolicy::from_flags(&[], &["UK1".into()], false, true, 0.98, None).is_err());
        assert!(VastPolicy::from_flags(&[], &[], false, true, 1.5, None).is_err());
    }

    #[test]
    fn the_seed_annotations_win_over_the_generic_ones() {
        let pod = annotations(&[
            (super::super::GPU_TYPE, "RTX 4090"),
            (super::super::GPU_FALLBACKS, "RTX 3090"),
            (contract::GPU_TYPES, "A100 SXM4"),
            (super::super::MEMORY, "24GB"),
            (contract::REQUIRED_GPU_MEMORY, "80"),
            (super::super::DISK, "50GB"),
            (contract::DISK, "10"),
            (super::super::PRICE_MAX, "0.8"),
            (contract::MAX_PRICE, "0.1"),
            (super::super::REGION, "Europe"),
        ]);
        let wanted = requirements(&pod, 1, &europe()).unwrap();
        assert_eq!(wanted.gpu_names, vec!["RTX 4090", "RTX 3090"]);
        assert_eq!(wanted.min_gpu_memory_gb, Some(24));
        assert_eq!(wanted.disk_gb, Some(50));
        assert_eq!(wanted.max_price_per_hour, Some(0.8));
        assert!(wanted.countries.contains(&"PL".to_owned()));
        let generic = annotations(&[
            (contract::GPU_TYPES, "A100 SXM4,H100 SXM"),
            (contract::REQUIRED_GPU_MEMORY, "80"),
            (contract::DISK, "10"),
        ]);
        let wanted = requirements(&generic, 2, &europe()).unwrap();
        assert_eq!(wanted.gpu_names, vec!["A100 SXM4", "H100 SXM"]);
        assert_eq!(wanted.min_gpu_memory_gb, Some(80));
        assert_eq!(wanted.disk_gb, Some(10));
        assert_eq!(
            wanted.max_price_per_hour,
            Some(2.0),
            "the policy's cap for two GPUs"
        );
        assert_eq!(wanted.countries.len(), Region::Europe.countries().len());
    }

    #[test]
    fn outside_the_policy_is_refused_naming_what_is_allowed() {
        let asia = annotations(&[(super::super::REGION, "Asia")]);
        let problems = requirements(&asia, 1, &europe()).unwrap_err();
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("Asia is outside this cluster's allowed regions Europe"),
            "{problems:?}"
        );
        let pricey = annotations(&[(super::super::PRICE_MAX, "3")]);
        let problems = requirements(&pricey, 2, &europe()).unwrap_err();
        assert!(
            problems[0].contains("above this cluster's limit of 2 USD/h"),
            "{problems:?}"
        );
        let broken = annotations(&[
            (super::super::MEMORY, "lots"),
            (super::super::REGION, "Atlantis"),
            (super::super::PRICE_MAX, "free"),
        ]);
        assert_eq!(requirements(&broken, 1, &europe()).unwrap_err().len(), 3);
        let bad_types = annotations(&[(contract::GPU_TYPES, "A100 SXM4,,")]);
        let problems = requirements(&bad_types, 1, &europe()).unwrap_err();
        assert!(problems[0].starts_with(contract::GPU_TYPES), "{problems:?}");
        // Without a country policy a region narrows the search to its countries.
        let open = VastPolicy::from_flags(&[], &[], false, true, 0.98, None).unwrap();
        let wanted =
            requirements(&annotations(&[(super::super::REGION, "oceania")]), 1, &open).unwrap();
        assert!(wanted.countries.contains(&"AU".to_owned()));
        assert_eq!(wanted.max_price_per_hour, None);
    }
}
