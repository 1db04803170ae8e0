//! What the simulated Vast.ai marketplace looks like: the offers, lifecycle timings, how images
//! behave, rate limits and initial faults. Loadable from JSON; every field falls back to
//! [`Scenario::default`], a small realistic market.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::faults::Fault;
use crate::ratelimit::{Route, RouteLimit};

/// The whole simulated world at start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// Offers on the market; each can be bought once.
    pub offers: Vec<OfferSpec>,
    /// `actual_status` stays `null` (contract being provisioned) this long after a create.
    pub provisioning_ms: u64,
    /// Then `loading` (image pull) this long before `running`.
    pub loading_ms: u64,
    /// Instances younger than this are missing from the v1 list (reads lag a create).
    pub list_lag_ms: u64,
    /// How containers of matching images behave; the first matching rule applies.
    pub images: Vec<ImageRule>,
    pub rate_limits: RateLimits,
    /// A log result URL answers 404 this many times before the file is uploaded.
    pub log_ready_polls: u32,
    /// Account credit in USD (`GET /api/v0/users/current/`); creates are refused at zero.
    pub credit: f64,
    /// Faults active from the start.
    pub faults: Vec<Fault>,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            offers: default_offers(),
            provisioning_ms: 1_000,
            loading_ms: 5_000,
            list_lag_ms: 2_000,
            images: Vec::new(),
            rate_limits: RateLimits::default(),
            log_ready_polls: 2,
            credit: 100.0,
            faults: Vec::new(),
        }
    }
}

impl Scenario {
    /// Reads a JSON scenario file.
    pub fn from_file(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let scenario: Scenario = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Refuses scenarios the simulator cannot serve consistently.
    pub fn validate(&self) -> Result<(), String> {
        let mut ids = std::collections::BTreeSet::new();
        for offer in &self.offers {
            if !ids.insert(offer.id) {
                return Err(format!("offer id {} appears twice", offer.id));
            }
            if offer.num_gpus == 0 || offer.dph_base < 0.0 || offer.storage_cost < 0.0 {
                return Err(format!(
                    "offer {} needs at least one GPU and non-negative prices",
                    offer.id
                ));
            }
        }
        for fault in &self.faults {
            fault.validate()?;
        }
        Ok(())
    }

    /// How a container of `image` behaves.
    pub(crate) fn behaviour(&self, image: &str) -> (Behaviour, Vec<String>) {
        self.images
            .iter()
            .find(|rule| image.contains(&rule.contains))
            .map(|rule| (rule.behaviour.clone(), rule.logs.clone()))
            .unwrap_or((Behaviour::Run, Vec::new()))
    }
}

/// One offer (an ask): the fields of a search row that the simulator keeps; the rest are
/// derived (`dph_total`, `gpu_total_ram`, `storage_total_cost`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfferSpec {
    /// What a create buys (`PUT /api/v0/asks/{id}/`).
    pub id: u64,
    pub machine_id: u64,
    pub host_id: u64,
    /// With spaces, as on the wire: `RTX 4090`.
    pub gpu_name: String,
    pub num_gpus: u32,
    /// Per-GPU VRAM in MB (24 GB cards say 24564 or 24576).
    pub gpu_ram: u64,
    /// Compute USD/h for the whole offer.
    pub dph_base: f64,
    /// Storage USD per GB per month (720 h).
    pub storage_cost: f64,
    /// Free text ending in a country code, as hosts write it: `Texas, US`, `, US`, `US`.
    pub geolocation: String,
    /// `verified`, `unverified` or `deverified`.
    pub verification: String,
    /// 1 = datacenter tier ("Secure Cloud").
    pub hosting_type: u8,
    pub reliability: f64,
    #[serde(default = "yes")]
    pub rentable: bool,
    /// GB of disk the machine has free.
    #[serde(default = "default_disk_space")]
    pub disk_space: f64,
    /// Seconds of rental left on the offer.
    #[serde(default = "default_duration")]
    pub duration: f64,
    #[serde(default = "default_cuda")]
    pub cuda_max_good: f64,
    /// Mbit/s.
    #[serde(default = "default_inet")]
    pub inet_down: f64,
    #[serde(default = "default_inet")]
    pub inet_up: f64,
    #[serde(default = "default_ports")]
    pub direct_port_count: u32,
    #[serde(default = "default_ip")]
    pub public_ipaddr: String,
    /// `false`: the machine cannot start an instance now; a create with `cancel_unavail`
    /// answers 410, one without it leaves a stopped instance that bills storage.
    #[serde(default = "yes")]
    pub startable: bool,
}

fn yes() -> bool {
    true
}
fn default_disk_space() -> f64 {
    500.0
}
fn default_duration() -> f64 {
    30.0 * 86_400.0
}
fn default_cuda() -> f64 {
    12.8
}
fn default_inet() -> f64 {
    900.0
}
fn default_ports() -> u32 {
    64
}
fn default_ip() -> String {
    "203.0.113.10".to_owned()
}

/// How a container behaves once its image is pulled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Behaviour {
    /// Runs until destroyed.
    Run,
    /// Never leaves `loading` (an image pull that never ends).
    LoadingForever,
    /// Runs for `after_ms`, then the container exits: `exited`, "Container exited with code N".
    Exit { after_ms: u64, code: i32 },
    /// Stays `created` with an "OCI runtime create failed" message; never starts.
    OciError,
}

/// Images whose name contains `contains` behave as `behaviour` and print `logs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRule {
    pub contains: String,
    pub behaviour: Behaviour,
    #[serde(default)]
    pub logs: Vec<String>,
}

/// Per-route limits; an absent route is unlimited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimits(pub Vec<(Route, RouteLimit)>);

impl Default for RateLimits {
    /// The documented values: search 10 per minute; create 4.5 s apart with a 12 s penalty;
    /// destroy 3 s; get 2 s; list, manage and logs 1 s.
    fn default() -> Self {
        RateLimits(vec![
            (Route::Search, RouteLimit::per_minute(10)),
            (
                Route::Create,
                RouteLimit::interval(4_500).with_penalty(12_000),
            ),
            (Route::Destroy, RouteLimit::interval(3_000)),
            (Route::Get, RouteLimit::interval(2_000)),
            (Route::List, RouteLimit::interval(1_000)),
            (Route::Manage, RouteLimit::interval(1_000)),
            (Route::Logs, RouteLimit::interval(1_000)),
        ])
    }
}

impl RateLimits {
    /// No limits at all.
    pub fn none() -> RateLimits {
        RateLimits(Vec::new())
    }

    /// Every interval, penalty and window divided by `factor` (fast tests, same shape).
    pub fn scaled(&self, factor: u64) -> RateLimits {
        RateLimits(
            self.0
                .iter()
                .map(|(route, limit)| (*route, limit.scaled(factor)))
                .collect(),
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn offer(
    id: u64,
    gpu_name: &str,
    num_gpus: u32,
    gpu_ram: u64,
    dph_base: f64,
    geolocation: &str,
    verification: &str,
    hosting_type: u8,
    reliability: f64,
) -> OfferSpec {
    OfferSpec {
        id,
        machine_id: id / 10,
        host_id: id / 100,
        gpu_name: gpu_name.to_owned(),
        num_gpus,
        gpu_ram,
        dph_base,
        storage_cost: 0.15,
        geolocation: geolocation.to_owned(),
        verification: verification.to_owned(),
        hosting_type,
        reliability,
        rentable: true,
        disk_space: default_disk_space(),
        duration: default_duration(),
        cuda_max_good: default_cuda(),
        inet_down: default_inet(),
        inet_up: default_inet(),
        direct_port_count: default_ports(),
        public_ipaddr: default_ip(),
        startable: true,
    }
}

/// A small market with the geolocation spellings hosts use and offers on both sides of the
/// usual policy lines (verified, datacenter, reliability).
fn default_offers() -> Vec<OfferSpec> {
    vec![
        offer(
            1001,
            "RTX 4090",
            1,
            24564,
            0.40,
            "Texas, US",
            "verified",
            1,
            0.995,
        ),
        offer(
            1002,
            "RTX 4090",
            1,
            24576,
            0.30,
            "Poland, PL",
            "verified",
            0,
            0.990,
        ),
        offer(
            1003,
            "RTX 4090",
            1,
            24564,
            0.25,
            ", US",
            "unverified",
            0,
            0.970,
        ),
        offer(1004, "RTX 4090", 2, 24564, 0.70, "US", "verified", 1, 0.999),
        offer(
            1005,
            "RTX 4090",
            1,
            24564,
            0.35,
            "Yutakachō, Shinagawa District, Tokyo, JP",
            "verified",
            1,
            0.992,
        ),
        offer(
            1006,
            "RTX 4090",
            1,
            24564,
            0.20,
            "California, United States",
            "verified",
            1,
            0.999,
        ),
        offer(
            2001,
            "RTX 3090",
            1,
            24576,
            0.18,
            "Quebec, CA",
            "verified",
            0,
            0.985,
        ),
        offer(
            2002,
            "RTX 3090",
            1,
            24576,
            0.22,
            "Germany, DE",
            "verified",
            1,
            0.996,
        ),
        offer(
            3001,
            "A100 SXM4",
            8,
            81920,
            9.60,
            "Virginia, US",
            "verified",
            1,
            0.999,
        ),
        offer(
            3002,
            "A100 SXM4",
            1,
            40960,
            1.10,
            "Netherlands, NL",
            "verified",
            1,
            0.998,
        ),
        offer(
            4001,
            "H100 SXM",
            1,
            81559,
            2.40,
            "Oregon, US",
            "verified",
            1,
            0.999,
        ),
        offer(
            4002,
            "H100 SXM",
            1,
            81559,
            1.90,
            "Sweden, SE",
            "deverified",
            0,
            0.900,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_scenario_is_valid_and_round_trips() {
        let scenario = Scenario::default();
        scenario.validate().unwrap();
        let text = serde_json::to_string(&scenario).unwrap();
        let back: Scenario = serde_json::from_str(&text).unwrap();
        assert_eq!(back, scenario);
    }

    #[test]
    fn scenario_files_are_read_and_checked() {
        let path =
            std::env::temp_dir().join(format!("vastai-scenario-{}.json", std::process::id()));
        std::fs::write(&path, r#"{"list_lag_ms": 5, "offers": []}"#).unwrap();
        let scenario = Scenario::from_file(&path).unwrap();
        assert_eq!(scenario.list_lag_ms, 5);
        assert!(scenario.offers.is_empty());
        std::fs::write(&path, r#"{"list_lag": 5}"#).unwrap();
        assert!(
            Scenario::from_file(&path).is_err(),
            "unknown fields are refused"
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn duplicate_offer_ids_are_refused() {
        let mut scenario = Scenario::default();
        let first = scenario.offers[0].clone();
        scenario.offers.push(first);
        assert!(scenario.validate().unwrap_err().contains("twice"));
    }

    #[test]
    fn image_rules_apply_in_order() {
        let scenario = Scenario {
            images: vec![
                ImageRule {
                    contains: "stuck".into(),
                    behaviour: Behaviour::LoadingForever,
                    logs: Vec::new(),
                },
                ImageRule {
                    contains: "batch".into(),
                    behaviour: Behaviour::Exit {
                        after_ms: 10,
                        code: 3,
                    },
                    logs: vec!["done".into()],
                },
            ],
            ..Scenario::default()
        };
        assert_eq!(
            scenario.behaviour("org/stuck-batch").0,
            Behaviour::LoadingForever
        );
        assert_eq!(scenario.behaviour("org/batch").1, vec!["done".to_owned()]);
        assert_eq!(scenario.behaviour("org/serve").0, Behaviour::Run);
    }
}
