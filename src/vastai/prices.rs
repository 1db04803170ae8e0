//! The per-GPU-type prices a Vast.ai node publishes, from one search of the market inside the
//! installation's policy: per catalogue GPU and GPU count the lowest compute price per GPU-hour,
//! and the lowest disk price, so that the webhook can price a pod's own disk in.

use std::collections::BTreeSet;

use runpod_contract::gpus::{self, GpuPrices};
use runpod_contract::interruptible::{BID_CLASS, bid_for};
use runpod_contract::provider::Cloud;

use super::model::Offer;
use super::select::{MB_PER_GB, NOMINAL_SHARE};
use crate::provider::PriceSheet;

/// Hours in the month Vast.ai prices disk by.
const MONTH_HOURS: f64 = 720.0;

/// The price sheet of the offers a search returned, with `disk_gb` priced into their totals.
/// `bids`: a bid search's rows, published as what a bid costs (a tenth over the minimum) under
/// [`BID_CLASS`].
pub fn price_sheet(offers: &[Offer], disk_gb: u32, bids: bool) -> PriceSheet {
    let mut observations = Vec::new();
    let mut unknown = BTreeSet::new();
    let mut storage: Option<f64> = None;
    for offer in offers {
        if offer.num_gpus == 0 {
            continue;
        }
        let Some(model) = gpus::identify(
            Cloud::VastAi,
            &offer.gpu_name,
            Some(offer.gpu_ram / MB_PER_GB),
        ) else {
            if !offer.gpu_name.trim().is_empty() {
                unknown.insert(offer.gpu_name.clone());
            }
            continue;
        };
        // A smaller variant sold under the model's name (an 8 GB RTX 4060 Ti) is not that
        // model: a pod's search for it skips such cards too.
        if offer.gpu_ram < f64::from(model.memory_gb) * MB_PER_GB * NOMINAL_SHARE {
            continue;
        }
        let disk = offer
            .storage_cost
            .filter(|cost| cost.is_finite() && *cost >= 0.0)
            .map(|cost| cost / MONTH_HOURS);
        if let Some(per_gb_hour) = disk {
            storage = Some(storage.map_or(per_gb_hour, |s| s.min(per_gb_hour)));
        }
        let base = if bids {
            match offer.min_bid.and_then(|min| bid_for(min, None)) {
                Some(bid) => bid,
                None => continue,
            }
        } else {
            offer
                .dph_base
                .unwrap_or_else(|| offer.dph_total - disk.unwrap_or(0.0) * f64::from(disk_gb))
        };
        observations.push((
            model.name,
            offer.num_gpus,
            bids.then_some(BID_CLASS),
            base / f64::from(offer.num_gpus),
        ));
    }
    PriceSheet {
        prices: GpuPrices::from_observations(observations, storage),
        unknown_gpus: unknown,
        ..PriceSheet::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(name: &str, gpus: u32, ram: f64, base: f64) -> Offer {
        serde_json::from_value(serde_json::json!({
            "id": 1, "gpu_name": name, "num_gpus": gpus, "gpu_ram": ram,
            "dph_base": base, "dph_total": base + 0.004, "storage_cost": 0.144,
        }))
        .unwrap()
    }

    #[test]
    fn offers_become_prices_per_model_and_count_with_unknown_gpus_reported() {
        let sheet = price_sheet(
            &[
                offer("H100 SXM", 1, 81_559.0, 2.2),
                offer("H100 SXM", 1, 81_559.0, 1.9),
                offer("H100 SXM", 2, 81_559.0, 4.0),
                offer("A100 SXM4", 1, 40_960.0, 0.7),
                offer("A100 SXM4", 1, 81_920.0, 1.1),
                offer("Quantum X9", 1, 24_000.0, 0.1),
                offer("RTX 4060 Ti", 1, 8_188.0, 0.05),
            ],
            20,
            false,
        );
        let text = sheet.prices.format();
        assert!(text.contains("H100x1=1.9"), "{text}");
        assert!(text.contains("H100x2=2"), "per GPU: {text}");
        assert!(
            text.contains("A100x1=0.7") && text.contains("A100-80GBx1=1.1"),
            "{text}"
        );
        assert!(text.contains("storage=0.0002"), "{text}");
        assert!(
            !text.contains("RTX4060-Ti"),
            "the 8 GB variant is not the 16 GB model: {text}"
        );
        assert_eq!(
            sheet.unknown_gpus.into_iter().collect::<Vec<_>>(),
            ["Quantum X9"]
        );
        // Without dph_base the disk comes off the total.
        let mut total_only = offer("L4", 1, 23_034.0, 0.0);
        total_only.dph_base = None;
        total_only.dph_total = 0.3 + 0.0002 * 20.0;
        let sheet = price_sheet(&[total_only], 20, false);
        assert_eq!(sheet.prices.format(), "storage=0.0002,L4x1=0.3");
    }

    #[test]
    fn a_bid_search_publishes_what_a_bid_costs_under_its_class() {
        let mut cheap = offer("RTX 4090", 1, 24_564.0, 0.2);
        cheap.min_bid = Some(0.2);
        let mut unpriced = offer("H100 SXM", 1, 81_559.0, 1.0);
        unpriced.min_bid = None;
        let sheet = price_sheet(&[cheap.clone(), unpriced], 20, true);
        let text = sheet.prices.format();
        assert!(text.contains("RTX4090x1:INTERRUPTIBLE=0.22"), "{text}");
        assert!(!text.contains("H100"), "no minimum bid, no price: {text}");
        let on_demand = price_sheet(&[cheap], 20, false).prices.format();
        assert!(!on_demand.contains("INTERRUPTIBLE"), "{on_demand}");
    }
}
