//! The seed's regions, mapped to ISO country codes as Vast.ai's own CLI maps them.

use std::fmt;

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
}
