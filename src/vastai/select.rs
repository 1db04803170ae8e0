//! Which offers a pod may be bought on: the search body in Vast.ai's filter grammar, and the
//! same constraints re-checked on every returned row (servers have ignored filters before, and
//! the country lives in free text).

use std::time::Duration;

use serde_json::{Value, json};

use runpod_contract::interruptible::Interruptible;
use runpod_contract::provider::Cloud;
use runpod_contract::vastai::{Requirements, VastPolicy};

use super::model::{MIN_DISK_GB, Offer};

/// Vast.ai counts GPU memory in MB of 1000 (a 24 GB card says 24564 or 24576).
pub(crate) const MB_PER_GB: f64 = 1000.0;
/// The share of a model's nominal memory its cards report at least (an 80 GB card says 79 to
/// 82 thousand MB; the 40 GB card of the same name far less).
pub(crate) const NOMINAL_SHARE: f64 = 0.9;

/// Offers read by one price search: the cheapest this many inside the policy, any GPU count.
pub const PRICE_SEARCH_ROWS: u32 = 500;
/// Memory tiers (GB) of the price searches: the cheapest rows of each tier are read apart.
const PRICE_TIERS_GB: [u32; 5] = [0, 24, 40, 80, u32::MAX];

/// What an offer must satisfy: the pod's needs within the installation's policy.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferQuery {
    /// Wanted GPU names in any spelling of the GPU catalogue (`RTX4090`, `RTX 4090`); empty =
    /// any. Searched under Vast.ai's own names.
    pub gpu_names: Vec<String>,
    /// GPUs per machine; 0 = any count (the price search).
    pub num_gpus: u32,
    /// Per-GPU VRAM.
    pub min_gpu_memory_gb: Option<u32>,
    /// USD/h for the whole instance, storage included.
    pub max_price_per_hour: Option<f64>,
    /// ISO 3166 alpha-2 codes; empty = anywhere.
    pub countries: Vec<String>,
    pub verified_only: bool,
    pub datacenter_only: bool,
    /// 0..1.
    pub min_reliability: f64,
    /// Priced into `dph_total`, and the machine must have it free.
    pub disk_gb: u32,
    /// Rental time the offer must still have.
    pub min_duration: Option<Duration>,
    /// Rows asked for (a short fresh list: offers vanish).
    pub limit: u32,
    /// Host RAM the machine must have (the pod's memory request), GB.
    pub min_cpu_ram_gb: Option<f64>,
    /// CPU cores the machine must give (the pod's CPU request).
    pub min_cpu_cores: Option<f64>,
    /// Set: interruptible offers (`type: bid`), each bid on within the pod's ceiling.
    pub interruptible: Option<Interruptible>,
    /// Machines not to use (where this pod's or its owner's instance was lost lately).
    pub avoided_machines: Vec<u64>,
}

impl Default for OfferQuery {
    fn default() -> Self {
        OfferQuery {
            gpu_names: Vec::new(),
            num_gpus: 1,
            min_gpu_memory_gb: None,
            max_price_per_hour: None,
            countries: Vec::new(),
            verified_only: true,
            datacenter_only: false,
            min_reliability: 0.98,
            disk_gb: 20,
            min_duration: None,
            limit: 10,
            min_cpu_ram_gb: None,
            min_cpu_cores: None,
            interruptible: None,
            avoided_machines: Vec::new(),
        }
    }
}

impl OfferQuery {
    /// The search for a pod's requirements (read by [`runpod_contract::vastai::requirements`])
    /// under the installation's policy; `default_disk_gb` when the pod names no disk.
    pub fn for_pod(wanted: &Requirements, policy: &VastPolicy, default_disk_gb: u32) -> OfferQuery {
        OfferQuery {
            gpu_names: wanted.gpu_names.clone(),
            num_gpus: wanted.gpu_count.max(1),
            min_gpu_memory_gb: wanted.min_gpu_memory_gb,
            max_price_per_hour: wanted.max_price_per_hour,
            countries: wanted.countries.clone(),
            verified_only: policy.verified_only,
            datacenter_only: policy.datacenter_only,
            min_reliability: policy.min_reliability,
            disk_gb: wanted.disk_gb.unwrap_or(default_disk_gb),
            interruptible: wanted.interruptible,
            ..OfferQuery::default()
        }
    }

    /// The price searches: every GPU and count inside the policy, no price cap (the webhook
    /// applies each pod's), with the default disk. One search per memory tier of the GPU
    /// catalogue (by Vast.ai's own names), so that a market of thousands of cheap consumer
    /// cards cannot hide the H100s; and one without a GPU filter, which also shows GPUs the
    /// catalogue does not know. [`PRICE_SEARCH_ROWS`] rows each.
    pub fn price_searches(policy: &VastPolicy) -> Vec<OfferQuery> {
        let base = OfferQuery {
            countries: policy
                .countries
                .as_ref()
                .map(|c| c.iter().cloned().collect())
                .unwrap_or_default(),
            verified_only: policy.verified_only,
            datacenter_only: policy.datacenter_only,
            min_reliability: policy.min_reliability,
            disk_gb: runpod_contract::vastai::DEFAULT_DISK_GB,
            num_gpus: 0,
            limit: PRICE_SEARCH_ROWS,
            ..OfferQuery::default()
        };
        let tier = |low: u32, high: u32| {
            let names: Vec<String> = runpod_contract::gpus::CATALOGUE
                .iter()
                .filter(|m| (low..high).contains(&m.memory_gb))
                .flat_map(|m| m.vastai.iter().map(|n| (*n).to_owned()))
                .fold(Vec::new(), |mut names, name| {
                    if !names.contains(&name) {
                        names.push(name);
                    }
                    names
                });
            OfferQuery {
                gpu_names: names,
                ..base.clone()
            }
        };
        let mut searches: Vec<OfferQuery> = PRICE_TIERS_GB
            .windows(2)
            .map(|bounds| tier(bounds[0], bounds[1]))
            .filter(|query| !query.gpu_names.is_empty())
            .collect();
        // What a bid costs, for pods that opted in (any GPU, as the last search).
        let bids = OfferQuery {
            interruptible: Some(Interruptible { max_bid: None }),
            ..base.clone()
        };
        searches.push(base);
        searches.push(bids);
        searches
    }

    /// The body of `POST /api/v0/bundles/`: on-demand offers (interruptible ones for a pod that
    /// opted in, priced at their minimum bid), cheapest first.
    pub fn body(&self) -> Value {
        let mut body = json!({
            "reliability2": {"gte": self.min_reliability},
            "rentable": {"eq": true},
            "rented": {"eq": false},
            "external": {"eq": false},
            "disk_space": {"gte": self.disk()},
            "type": if self.interruptible.is_some() { "bid" } else { "on-demand" },
            "order": [["dph_total", "asc"]],
            "limit": self.limit.max(1),
            "allocated_storage": self.disk(),
        });
        let mut set = |key: &str, value: Value| {
            if let Some(object) = body.as_object_mut() {
                object.insert(key.to_owned(), value);
            }
        };
        if self.num_gpus > 0 {
            set("num_gpus", json!({"eq": self.num_gpus}));
        }
        if !self.gpu_names.is_empty() {
            let names = runpod_contract::gpus::names_on(&self.gpu_names, Cloud::VastAi);
            set("gpu_name", json!({"in": names}));
        }
        if let Some(mb) = self.gpu_ram_floor_mb() {
            set("gpu_ram", json!({"gte": mb}));
        }
        if let Some(price) = self.max_price_per_hour {
            set("dph_total", json!({"lte": price}));
        }
        if !self.countries.is_empty() {
            set("geolocation", json!({"in": self.countries}));
        }
        if self.verified_only {
            set("verified", json!({"eq": true}));
        }
        if self.datacenter_only {
            set("datacenter", json!({"eq": true}));
        }
        if let Some(duration) = self.min_duration {
            set("duration", json!({"gte": duration.as_secs()}));
        }
        if let Some(gb) = self.min_cpu_ram_gb {
            set("cpu_ram", json!({"gte": (gb * MB_PER_GB).ceil()}));
        }
        if let Some(cores) = self.min_cpu_cores {
            set("cpu_cores_effective", json!({"gte": cores}));
        }
        if !self.avoided_machines.is_empty() {
            set("machine_id", json!({"notin": self.avoided_machines}));
        }
        body
    }

    /// The least VRAM per GPU to search for: the pod's own minimum, and for models asked by
    /// canonical name most of their memory (cards report a little over or under the nominal
    /// size), so that a name Vast.ai gives to two sizes finds the size asked for.
    fn gpu_ram_floor_mb(&self) -> Option<f64> {
        let own = self.min_gpu_memory_gb.map(|gb| f64::from(gb) * MB_PER_GB);
        let models = runpod_contract::gpus::memory_floor_gb(&self.gpu_names, Cloud::VastAi)
            .map(|gb| f64::from(gb) * MB_PER_GB * NOMINAL_SHARE);
        match (own, models) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    fn disk(&self) -> u32 {
        self.disk_gb.max(MIN_DISK_GB)
    }

    /// Why a returned row is outside the query, if it is: a server may ignore a filter.
    pub fn rejects(&self, offer: &Offer) -> Option<String> {
        self.rejects_gpus(offer)
            .or_else(|| self.rejects_host(offer))
    }

    /// The GPUs' model, count, memory and price.
    fn rejects_gpus(&self, offer: &Offer) -> Option<String> {
        let id = offer.id;
        // By model: Vast.ai's `A100 SXM4` is a 40 GB or an 80 GB card, and `A100-80GB` wants
        // only the second.
        if !self.gpu_names.is_empty()
            && runpod_contract::gpus::preference(
                &self.gpu_names,
                Cloud::VastAi,
                &offer.gpu_name,
                Some(offer.gpu_ram / MB_PER_GB),
            )
            .is_none()
        {
            return Some(format!(
                "offer {id}: GPU {:?} was not asked for",
                offer.gpu_name
            ));
        }
        if self.num_gpus > 0 && offer.num_gpus != self.num_gpus {
            return Some(format!(
                "offer {id}: {} GPUs, not {}",
                offer.num_gpus, self.num_gpus
            ));
        }
        if let Some(gb) = self.min_gpu_memory_gb
            && offer.gpu_ram < f64::from(gb) * MB_PER_GB
        {
            return Some(format!(
                "offer {id}: {} MB per GPU, under {gb} GB",
                offer.gpu_ram
            ));
        }
        if let Some(cap) = self.max_price_per_hour
            && (!offer.dph_total.is_finite() || offer.dph_total > cap)
        {
            return Some(format!(
                "offer {id}: {} USD/h, above {cap}",
                offer.dph_total
            ));
        }
        None
    }

    /// Where the host is, how it is rated, and whether the pod may have it now.
    fn rejects_host(&self, offer: &Offer) -> Option<String> {
        let id = offer.id;
        if !self.countries.is_empty() {
            match offer.country() {
                Some(code) if self.countries.iter().any(|c| c.eq_ignore_ascii_case(&code)) => {}
                Some(code) => {
                    return Some(format!(
                        "offer {id}: host in {code}, not an allowed country"
                    ));
                }
                None => {
                    return Some(format!(
                        "offer {id}: host location {:?} names no country",
                        offer.geolocation.as_deref().unwrap_or("")
                    ));
                }
            }
        }
        if self.verified_only && offer.verification.as_deref() != Some("verified") {
            return Some(format!("offer {id}: host not verified"));
        }
        if self.datacenter_only && offer.hosting_type != Some(1) {
            return Some(format!("offer {id}: host not in the datacenter tier"));
        }
        if !offer
            .reliability()
            .is_some_and(|r| r >= self.min_reliability)
        {
            return Some(format!(
                "offer {id}: reliability under {}",
                self.min_reliability
            ));
        }
        if offer.rentable == Some(false) || offer.rented == Some(true) {
            return Some(format!("offer {id}: not rentable"));
        }
        if offer
            .disk_space
            .is_some_and(|free| free < f64::from(self.disk()))
        {
            return Some(format!(
                "offer {id}: less than {} GB of disk free",
                self.disk()
            ));
        }
        if let (Some(min), Some(left)) = (self.min_duration, offer.duration)
            && left < min.as_secs_f64()
        {
            return Some(format!("offer {id}: rental ends too soon"));
        }
        // A filter a server ignored must not put the pod back where it was just lost.
        if offer
            .machine_id
            .is_some_and(|machine| self.avoided_machines.contains(&machine))
        {
            return Some(format!("offer {id}: a machine this pod lost lately"));
        }
        if let Some(asked) = self.interruptible
            && offer
                .min_bid
                .and_then(|min| runpod_contract::interruptible::bid_for(min, asked.max_bid))
                .is_none()
        {
            return Some(format!(
                "offer {id}: its minimum bid is over the pod's bid ceiling (or unknown)"
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query() -> OfferQuery {
        OfferQuery {
            gpu_names: vec!["RTX 4090".into()],
            num_gpus: 1,
            min_gpu_memory_gb: Some(24),
            max_price_per_hour: Some(0.5),
            countries: vec!["US".into(), "CA".into()],
            verified_only: true,
            datacenter_only: true,
            min_reliability: 0.98,
            disk_gb: 50,
            min_duration: Some(Duration::from_secs(86_400)),
            limit: 5,
            min_cpu_ram_gb: None,
            min_cpu_cores: None,
            interruptible: None,
            avoided_machines: Vec::new(),
        }
    }

    #[test]
    fn an_interruptible_pod_searches_bids_and_skips_lost_machines() {
        let bidding = OfferQuery {
            interruptible: Some(runpod_contract::interruptible::Interruptible {
                max_bid: Some(0.3),
            }),
            avoided_machines: vec![4711],
            ..query()
        };
        let body = bidding.body();
        assert_eq!(body["type"], "bid");
        assert_eq!(body["machine_id"], json!({"notin": [4711]}));
        assert_eq!(query().body()["type"], "on-demand");
        assert!(query().body().get("machine_id").is_none());
        let fine = Offer {
            min_bid: Some(0.2),
            machine_id: Some(1),
            ..offer()
        };
        assert_eq!(bidding.rejects(&fine), None);
        let lost_here = Offer {
            machine_id: Some(4711),
            ..fine.clone()
        };
        assert!(bidding.rejects(&lost_here).unwrap().contains("lost lately"));
        let over = Offer {
            min_bid: Some(0.35),
            ..fine.clone()
        };
        assert!(bidding.rejects(&over).unwrap().contains("bid ceiling"));
        let unpriced = Offer {
            min_bid: None,
            ..fine
        };
        assert!(bidding.rejects(&unpriced).is_some());
    }

    /// The pod's memory and CPU requests choose machines that have them.
    #[test]
    fn memory_and_cpu_requests_filter_the_machines() {
        let plain = query().body();
        assert!(plain.get("cpu_ram").is_none() && plain.get("cpu_cores_effective").is_none());
        let body = OfferQuery {
            min_cpu_ram_gb: Some(64.5),
            min_cpu_cores: Some(6.0),
            ..query()
        }
        .body();
        assert_eq!(body["cpu_ram"], json!({"gte": 64500.0}));
        assert_eq!(body["cpu_cores_effective"], json!({"gte": 6.0}));
    }

    fn offer() -> Offer {
        serde_json::from_value(json!({
            "id": 1, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "dph_total": 0.42,
            "reliability2": 0.99, "verification": "verified", "hosting_type": 1,
            "geolocation": "Texas, US", "rentable": true, "rented": false,
            "disk_space": 400, "duration": 864000
        }))
        .unwrap()
    }

    #[test]
    fn the_body_speaks_the_grammar() {
        let body = query().body();
        assert_eq!(body["gpu_name"], json!({"in": ["RTX 4090"]}));
        assert_eq!(
            body["gpu_ram"],
            json!({"gte": 24000.0}),
            "MB of 1000 per GPU"
        );
        assert_eq!(body["dph_total"], json!({"lte": 0.5}));
        assert_eq!(body["geolocation"], json!({"in": ["US", "CA"]}));
        assert_eq!(body["verified"], json!({"eq": true}));
        assert_eq!(body["datacenter"], json!({"eq": true}));
        assert_eq!(body["reliability2"], json!({"gte": 0.98}));
        assert_eq!(body["rented"], json!({"eq": false}));
        assert_eq!(body["allocated_storage"], json!(50));
        assert_eq!(body["duration"], json!({"gte": 86_400}));
        assert_eq!(body["order"], json!([["dph_total", "asc"]]));
        let open = OfferQuery {
            verified_only: false,
            ..OfferQuery::default()
        }
        .body();
        for absent in [
            "gpu_name",
            "gpu_ram",
            "dph_total",
            "geolocation",
            "verified",
            "datacenter",
        ] {
            assert!(open.get(absent).is_none(), "{absent}");
        }
    }

    #[test]
    fn canonical_names_search_under_vastais_names_and_rows_are_checked_by_model() {
        let query = OfferQuery {
            gpu_names: vec!["A100-80GB".into(), "rtx4090".into()],
            ..OfferQuery::default()
        };
        assert_eq!(
            query.body()["gpu_name"],
            json!({"in": ["A100 SXM4", "RTX 4090"]})
        );
        // Searched above the 40 GB cards of the same name (the RTX 4090's 24 GB is the floor
        // of the two models); a pod's own higher minimum wins.
        assert_eq!(query.body()["gpu_ram"], json!({"gte": 21600.0}));
        let only_80 = OfferQuery {
            gpu_names: vec!["A100-80GB".into()],
            ..OfferQuery::default()
        };
        assert_eq!(only_80.body()["gpu_ram"], json!({"gte": 72000.0}));
        let vast_spelling = OfferQuery {
            gpu_names: vec!["A100 SXM4".into()],
            min_gpu_memory_gb: Some(30),
            ..OfferQuery::default()
        };
        assert_eq!(vast_spelling.body()["gpu_ram"], json!({"gte": 30000.0}));
        let row = |name: &str, ram: f64| {
            let mut offer = offer();
            offer.gpu_name = name.into();
            offer.gpu_ram = ram;
            offer.reliability2 = Some(0.99);
            query.rejects(&offer)
        };
        assert_eq!(row("A100 SXM4", 81_920.0), None);
        assert!(
            row("A100 SXM4", 40_960.0).is_some(),
            "the 40 GB card Vast.ai names alike is not an A100-80GB"
        );
        assert_eq!(row("RTX 4090", 24_564.0), None);
        assert!(row("RTX 3090", 24_564.0).is_some());
    }

    #[test]
    fn price_searches_cover_every_memory_tier_and_the_unknown() {
        let policy =
            VastPolicy::from_flags(&["Europe".into()], &[], false, true, 0.98, Some(0.5)).unwrap();
        let searches = OfferQuery::price_searches(&policy);
        assert_eq!(searches.len(), 6, "{searches:?}");
        let tier_of = |name: &str| {
            searches
                .iter()
                .position(|q| q.gpu_names.iter().any(|n| n == name))
        };
        assert_eq!(tier_of("H100 SXM"), Some(3));
        assert_eq!(
            tier_of("A100 SXM4"),
            Some(2),
            "40 GB A100s are sold under it too"
        );
        assert_eq!(tier_of("RTX 4090"), Some(1));
        assert_eq!(tier_of("RTX 3060"), Some(0));
        for query in &searches {
            let body = query.body();
            assert!(body.get("num_gpus").is_none(), "any count: {body}");
            assert!(body.get("dph_total").is_none(), "no price cap: {body}");
            assert!(body.get("gpu_ram").is_none(), "Vast.ai's own names: {body}");
            assert!(
                body["geolocation"]["in"]
                    .as_array()
                    .is_some_and(|c| !c.is_empty())
            );
        }
        assert!(
            searches[4].gpu_names.is_empty() && searches[4].interruptible.is_none(),
            "the on-demand one that sees every GPU"
        );
        assert!(
            searches[5].gpu_names.is_empty() && searches[5].body()["type"] == "bid",
            "bids last, every GPU"
        );
        assert!(
            searches[..5]
                .iter()
                .all(|q| q.body()["type"] == "on-demand")
        );
    }

    #[test]
    fn a_pods_requirements_and_the_policy_make_the_query() {
        let policy =
            VastPolicy::from_flags(&["Europe".into()], &[], true, true, 0.99, Some(1.0)).unwrap();
        let pod = std::collections::BTreeMap::from([
            ("vast.ai/gpu-type".to_owned(), "RTX 4090".to_owned()),
            ("vast.ai/region".to_owned(), "Europe".to_owned()),
        ]);
        let wanted = runpod_contract::vastai::requirements(&pod, 2, &policy).unwrap();
        let query = OfferQuery::for_pod(&wanted, &policy, 30);
        assert_eq!(query.gpu_names, vec!["RTX 4090"]);
        assert_eq!(query.num_gpus, 2);
        assert_eq!(query.max_price_per_hour, Some(2.0));
        assert!(query.countries.contains(&"DE".to_owned()));
        assert!(query.datacenter_only && query.verified_only);
        assert_eq!(query.min_reliability, 0.99);
        assert_eq!(query.disk_gb, 30);
    }

    #[test]
    fn every_constraint_is_checked_again_on_the_row() {
        assert_eq!(query().rejects(&offer()), None);
        let with = |change: fn(&mut Offer)| {
            let mut offer = offer();
            change(&mut offer);
            query().rejects(&offer)
        };
        let cases: [fn(&mut Offer); 12] = [
            |o| o.gpu_name = "RTX 3090".into(),
            |o| o.num_gpus = 2,
            |o| o.gpu_ram = 23_999.0,
            |o| o.dph_total = 0.51,
            |o| o.geolocation = Some("Poland, PL".into()),
            |o| o.geolocation = Some("California, United States".into()),
            |o| o.verification = Some("deverified".into()),
            |o| o.hosting_type = Some(0),
            |o| o.reliability2 = Some(0.97),
            |o| o.rented = Some(true),
            |o| o.disk_space = Some(10.0),
            |o| o.duration = Some(3_600.0),
        ];
        for (i, case) in cases.into_iter().enumerate() {
            assert!(with(case).is_some(), "case {i} should be rejected");
        }
        assert!(
            with(|o| o.dph_total = f64::NAN).is_some(),
            "NaN is no price under a cap"
        );
    }
}
