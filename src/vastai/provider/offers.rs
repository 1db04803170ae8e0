//! Searching offers for a pod and saying which one was bought.

use runpod_contract::vastai::Requirements;

use super::VastaiProvider;
use crate::provider::ProvisionError;
use crate::vastai::error::VastError;
use crate::vastai::model::{self, Offer};
use crate::vastai::placement::Bought;
use crate::vastai::select::OfferQuery;

impl VastaiProvider {
    /// The offers that match the pod now, less the GPU types it must not try; none is an
    /// error that says what was searched for.
    pub(super) async fn offers(
        &self,
        query: &OfferQuery,
        wanted: &Requirements,
        excluded_gpu_types: &[String],
    ) -> Result<Vec<Offer>, ProvisionError> {
        let offers: Vec<Offer> = self
            .client
            .search(query)
            .await
            .map_err(|error| match error {
                VastError::Unauthorized { .. } => ProvisionError::AccountBlocked(error.to_string()),
                other => ProvisionError::NoCandidates(format!("searching Vast.ai offers: {other}")),
            })?
            .into_iter()
            .filter(|offer| !excluded_gpu_types.contains(&offer.gpu_name))
            .collect();
        if offers.is_empty() {
            if let Some(refusal) = self.too_big(query, excluded_gpu_types).await {
                return Err(refusal);
            }
            return Err(ProvisionError::NoCandidates(format!(
                "no Vast.ai offer matches the pod now (GPU {}, x{}, at most {} USD/h, {}, \
                 reliability >= {})",
                if wanted.gpu_names.is_empty() {
                    "any".to_owned()
                } else {
                    wanted.gpu_names.join(" or ")
                },
                query.num_gpus,
                query
                    .max_price_per_hour
                    .map_or("any".to_owned(), |p| format!("{p:.3}")),
                self.policy.allowed,
                self.policy.min_reliability
            )));
        }
        Ok(offers)
    }

    /// With no offer for the pod: when offers do match it but for its memory or CPU request,
    /// the refusal that says so (no machine has what the pod asks for, so waiting would only
    /// bill nothing and tell the user nothing); else `None` (nothing matches now, or the search
    /// failed: the pod waits as before).
    async fn too_big(
        &self,
        query: &OfferQuery,
        excluded_gpu_types: &[String],
    ) -> Option<ProvisionError> {
        if query.min_cpu_ram_gb.is_none() && query.min_cpu_cores.is_none() {
            return None;
        }
        let loose = OfferQuery {
            min_cpu_ram_gb: None,
            min_cpu_cores: None,
            ..query.clone()
        };
        let offers: Vec<Offer> = self
            .client
            .search(&loose)
            .await
            .ok()?
            .into_iter()
            .filter(|offer| !excluded_gpu_types.contains(&offer.gpu_name))
            .collect();
        refusal_for_requests(query, &offers)
    }
}

/// The refusal of a pod whose memory or CPU request no offer in `offers` (those that match it
/// otherwise) meets, naming the most they have; `None` when there are none to compare.
fn refusal_for_requests(query: &OfferQuery, offers: &[Offer]) -> Option<ProvisionError> {
    if offers.is_empty() {
        return None;
    }
    let most =
        |field: fn(&Offer) -> Option<f64>| offers.iter().filter_map(field).fold(0.0_f64, f64::max);
    let ram_gb = most(|o| o.cpu_ram) / 1000.0;
    let cores = most(|o| o.cpu_cores_effective);
    let mut asked = Vec::new();
    if let Some(gb) = query.min_cpu_ram_gb {
        asked.push(format!(
            "{gb:.1} GB of host RAM (the most offered: {ram_gb:.1} GB)"
        ));
    }
    if let Some(wanted) = query.min_cpu_cores {
        asked.push(format!("{wanted} CPU cores (the most offered: {cores})"));
    }
    Some(ProvisionError::Rejected(format!(
        "no Vast.ai machine that matches the pod has {}, which its memory and CPU requests (else \
         limits) ask for; lower them, or keep the pod local with {}: never",
        asked.join(" and "),
        runpod_contract::BURST_MODE
    )))
}

#[cfg(test)]
#[test]
fn a_request_no_offer_meets_is_refused_naming_the_most_offered() {
    let offer = |ram_mb: f64, cores: f64| -> Offer {
        serde_json::from_value(serde_json::json!({
            "id": 1, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24000.0,
            "dph_total": 0.4, "cpu_ram": ram_mb, "cpu_cores_effective": cores
        }))
        .unwrap()
    };
    let query = OfferQuery {
        min_cpu_ram_gb: Some(2048.0),
        ..OfferQuery::default()
    };
    let Some(ProvisionError::Rejected(message)) =
        refusal_for_requests(&query, &[offer(64_000.0, 16.0), offer(256_000.0, 32.0)])
    else {
        panic!("not refused");
    };
    assert!(
        message.contains("2048.0 GB of host RAM (the most offered: 256.0 GB)"),
        "{message}"
    );
    assert!(!message.contains("CPU cores"), "{message}");
    assert!(refusal_for_requests(&query, &[]).is_none());
}

/// What the buy chose, for the create Event: the offer, its GPUs, its price (the bid's for an
/// interruptible instance) and country, or that an existing instance was adopted.
pub(super) fn bought_summary(
    bought: &Bought,
    offers: &[Offer],
    create: &model::CreateRequest,
) -> String {
    match bought {
        Bought::Created { offer_id, .. } => offers
            .iter()
            .find(|offer| offer.id == *offer_id)
            .map(|offer| {
                let price = match create.priced_for(offer).and_then(|c| c.price) {
                    Some(bid) => format!("an interruptible bid of {bid:.3} USD/h"),
                    None => format!("{:.3} USD/h", offer.dph_total),
                };
                format!(
                    "Vast.ai offer {} ({} x{} at {price} in {})",
                    offer.id,
                    offer.gpu_name,
                    offer.num_gpus,
                    offer.country().unwrap_or_else(|| "?".to_owned())
                )
            })
            .unwrap_or_else(|| format!("Vast.ai offer {offer_id}")),
        Bought::Adopted { .. } => "adopted the Vast.ai instance that already existed".into(),
    }
}
