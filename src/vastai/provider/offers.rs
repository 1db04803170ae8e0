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
