//! The Vast.ai part of the contract: the seed Vast.ai kubelet's annotations, which keep working,
//! and the regions they name, mapped to ISO country codes as Vast.ai's own CLI maps them (the
//! notes' table). The webhook and the controller read them with these same parsers.

use std::fmt;

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
/// Written by the controller only: the instance running the pod.
pub const INSTANCE_ID: &str = "vast.ai/instance-id";

/// A continent as the seed's `vast.ai/region` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Region {
    NorthAmerica,
    SouthAmerica,
    Europe,
    Asia,
    Oceania,
    Africa,
}

impl Region {
    pub const ALL: [Region; 6] = [
        Region::NorthAmerica,
        Region::SouthAmerica,
        Region::Europe,
        Region::Asia,
        Region::Oceania,
        Region::Africa,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Region::NorthAmerica => "North America",
            Region::SouthAmerica => "South America",
            Region::Europe => "Europe",
            Region::Asia => "Asia",
            Region::Oceania => "Oceania",
            Region::Africa => "Africa",
        }
    }

    /// Case, `_` and spaces are ignored: `north_america`, `NorthAmerica`, `North America`.
    pub fn parse(value: &str) -> Option<Region> {
        let squash = |text: &str| -> String {
            text.chars()
                .filter(|c| *c != '_' && !c.is_whitespace())
                .map(|c| c.to_ascii_lowercase())
                .collect()
        };
        let wanted = squash(value);
        Region::ALL
            .into_iter()
            .find(|region| squash(region.name()) == wanted)
    }

    /// The ISO 3166 alpha-2 codes of the region (vast.py `REGIONS`).
    pub fn countries(self) -> &'static [&'static str] {
        match self {
            Region::NorthAmerica => &[
                "AG", "BS", "BB", "BZ", "CA", "CR", "CU", "DM", "DO", "SV", "GD", "GT", "HT", "HN",
                "JM", "MX", "NI", "PA", "KN", "LC", "VC", "TT", "US",
            ],
            Region::SouthAmerica => &[
                "AR", "BO", "BR", "CL", "CO", "EC", "FK", "GF", "GY", "PY", "PE", "SR", "UY", "VE",
            ],
            Region::Europe => &[
                "AL", "AD", "AT", "BY", "BE", "BA", "BG", "HR", "CY", "CZ", "DK", "EE", "FI", "FR",
                "DE", "GR", "HU", "IS", "IE", "IT", "LV", "LI", "LT", "LU", "MT", "MD", "MC", "ME",
                "NL", "MK", "NO", "PL", "PT", "RO", "RU", "SM", "RS", "SK", "SI", "ES", "SE", "CH",
                "UA", "GB", "VA", "XK",
            ],
            Region::Asia => &[
                "AF", "AM", "AZ", "BH", "BD", "BT", "BN", "KH", "CN", "GE", "IN", "ID", "IR", "IQ",
                "IL", "JP", "JO", "KZ", "KW", "KG", "LA", "LB", "MY", "MV", "MN", "MM", "NP", "KP",
                "OM", "PK", "PH", "QA", "SA", "SG", "KR", "LK", "SY", "TW", "TJ", "TH", "TL", "TR",
                "TM", "AE", "UZ", "VN", "YE", "HK", "MO",
            ],
            Region::Oceania => &[
                "AS", "AU", "CK", "FJ", "PF", "GU", "KI", "MH", "FM", "NR", "NC", "NZ", "NU", "MP",
                "PW", "PG", "PN", "WS", "SB", "TK", "TO", "TV", "VU", "WF",
            ],
            Region::Africa => &[
                "DZ", "AO", "BJ", "BW", "BF", "BI", "CV", "CM", "CF", "TD", "KM", "CG", "CD", "CI",
                "DJ", "EG", "GQ", "ER", "SZ", "ET", "GA", "GM", "GH", "GN", "GW", "KE", "LS", "LR",
                "LY", "MG", "MW", "ML", "MR", "MU", "MA", "MZ", "NA", "NE", "NG", "RW", "ST", "SN",
                "SC", "SL", "SO", "ZA", "SS", "SD", "TZ", "TG", "TN", "UG", "ZM", "ZW",
            ],
        }
    }

    /// The region a country belongs to, if any.
    pub fn of_country(code: &str) -> Option<Region> {
        Region::ALL.into_iter().find(|region| {
            region
                .countries()
                .iter()
                .any(|known| known.eq_ignore_ascii_case(code.trim()))
        })
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn regions_parse_loosely_and_map_to_countries() {
        for text in [
            "North America",
            "north_america",
            "NORTHAMERICA",
            " North  America ",
        ] {
            assert_eq!(Region::parse(text), Some(Region::NorthAmerica), "{text:?}");
        }
        assert_eq!(Region::parse("Middle East"), None);
        assert_eq!(Region::parse(""), None);
        assert!(Region::NorthAmerica.countries().contains(&"US"));
        assert_eq!(Region::of_country("gb"), Some(Region::Europe));
        assert_eq!(Region::of_country("TR"), Some(Region::Asia));
        assert_eq!(Region::of_country("UK"), None, "ISO codes only");
        // No country is in two regions, and every code is two capital letters.
        let mut seen = BTreeSet::new();
        for region in Region::ALL {
            for code in region.countries() {
                assert!(seen.insert(*code), "{code} twice");
                assert!(code.len() == 2 && code.chars().all(|c| c.is_ascii_uppercase()));
            }
            assert_eq!(Region::parse(&region.to_string()), Some(region));
        }
    }

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
