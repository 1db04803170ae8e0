//! Buying exactly one instance per label. There is no idempotency key on Vast.ai's create, so:
//! an instance already carrying the label is adopted instead of buying; an offer taken between
//! search and buy (`no_such_ask`) moves on to the next offer; and after an unclear answer
//! (timeout, 5xx, cut connection) the label is looked up, through the lagging list, for the
//! whole grace window before anything else is bought. If a lookup itself fails nothing more is
//! bought: the caller tries again later, starting with the label lookup.

use std::time::Duration;

use super::client::VastClient;
use super::error::VastError;
use super::label::Label;
use super::model::{CreateRequest, Instance, Offer};

/// What one create attempt on one offer led to.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub offer_id: u64,
    pub error: VastError,
}

/// How the pod got its instance.
#[derive(Debug, Clone, PartialEq)]
pub enum Bought {
    /// Created now on `offer_id`.
    Created { instance_id: u64, offer_id: u64 },
    /// One carrying the label existed already (an earlier create, possibly one whose answer was
    /// lost): nothing was bought.
    Adopted { instance_id: u64 },
}

impl Bought {
    pub fn instance_id(&self) -> u64 {
        match self {
            Bought::Created { instance_id, .. } | Bought::Adopted { instance_id } => *instance_id,
        }
    }
}

/// Why nothing was bought (and, for `Unconfirmed`, why the caller must look again first).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BuyError {
    #[error("no offer could be bought: {}", summary(.0))]
    NoOffer(Vec<Attempt>),
    /// A definitive refusal (key, credit, invalid request): other offers would fail alike.
    #[error("Vast.ai refused the create: {0}")]
    Refused(VastError),
    /// A create may have happened and the label could not be looked up: nothing more is bought
    /// until a lookup answers.
    #[error("a create on offer {offer_id} may have succeeded and the label lookup failed: {error}")]
    Unconfirmed { offer_id: u64, error: VastError },
    /// The label could not be looked up before buying.
    #[error("looking up the instance label failed: {0}")]
    Lookup(VastError),
}

fn summary(attempts: &[Attempt]) -> String {
    if attempts.is_empty() {
        return "no offers matched".to_owned();
    }
    attempts
        .iter()
        .map(|attempt| format!("offer {}: {}", attempt.offer_id, attempt.error.kind()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What to do after a create answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Done(u64),
    /// Nothing was bought on this offer: try the next one.
    NextOffer,
    /// Maybe bought: look the label up before anything else.
    Confirm,
    /// Nothing was bought and no other offer would do better.
    Stop,
}

/// The rule, as a table.
pub fn after_create(result: &Result<u64, VastError>) -> Next {
    match result {
        Ok(id) => Next::Done(*id),
        Err(error) if error.create_may_have_happened() => Next::Confirm,
        // Offer-specific: gone, cannot start, not ours, or a 2xx saying no.
        Err(
            VastError::NoSuchAsk { .. } | VastError::Forbidden { .. } | VastError::Refused { .. },
        ) => Next::NextOffer,
        Err(_) => Next::Stop,
    }
}

/// How long an offer this client bought, or found gone, is skipped: longer than searches lag.
const OFFER_TAKEN_FOR: Duration = Duration::from_secs(120);

impl VastClient {
    fn offer_taken(&self, offer_id: u64) -> bool {
        let now = tokio::time::Instant::now();
        self.taken()
            .get(&offer_id)
            .is_some_and(|at| now.saturating_duration_since(*at) < OFFER_TAKEN_FOR)
    }

    fn take_offer(&self, offer_id: u64) {
        let now = tokio::time::Instant::now();
        let mut taken = self.taken();
        taken.retain(|_, at| now.saturating_duration_since(*at) < OFFER_TAKEN_FOR);
        taken.insert(offer_id, now);
    }

    fn taken(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, tokio::time::Instant>> {
        self.taken_offers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The instance to adopt among those carrying the label: the oldest (there should be one).
fn oldest(found: &[Instance]) -> Option<u64> {
    found.iter().map(|instance| instance.id).min()
}

impl VastClient {
    /// Buys one instance for `label` on the first offer that can be had, in order, or adopts
    /// the one that already carries it. The request goes out with `label` as its label.
    pub async fn buy(
        &self,
        label: &Label,
        offers: &[Offer],
        request: &CreateRequest,
    ) -> Result<Bought, BuyError> {
        let request = &CreateRequest {
            label: label.to_string(),
            ..request.clone()
        };
        let existing = self.find_by_label(label).await.map_err(BuyError::Lookup)?;
        if let Some(instance_id) = oldest(&existing) {
            return Ok(Bought::Adopted { instance_id });
        }
        let mut attempts = Vec::new();
        for offer in offers {
            // An interruptible pod bids per offer; an offer it cannot bid on is skipped.
            let Some(priced) = request.priced_for(offer) else {
                continue;
            };
            // Bought by another pod since this search, or found gone: a create would be
            // refused and take a create slot.
            if self.offer_taken(offer.id) {
                continue;
            }
            let result = self.create_once(offer.id, &priced).await;
            let next = after_create(&result);
            if matches!(next, Next::Done(_) | Next::Confirm)
                || matches!(result, Err(VastError::NoSuchAsk { .. }))
            {
                self.take_offer(offer.id);
            }
            match next {
                Next::Done(instance_id) => {
                    return Ok(Bought::Created {
                        instance_id,
                        offer_id: offer.id,
                    });
                }
                Next::Confirm => {
                    if let Some(instance_id) = self.confirm(label, offer.id).await? {
                        return Ok(Bought::Adopted { instance_id });
                    }
                }
                Next::Stop => {
                    if let Err(error) = result {
                        return Err(BuyError::Refused(error));
                    }
                }
                Next::NextOffer => {}
            }
            if let Err(error) = result {
                attempts.push(Attempt {
                    offer_id: offer.id,
                    error,
                });
            }
        }
        Err(BuyError::NoOffer(attempts))
    }

    /// Looks the label up for the grace window after an unclear create: the instance, or
    /// `None` once every lookup agreed there is none.
    async fn confirm(&self, label: &Label, offer_id: u64) -> Result<Option<u64>, BuyError> {
        let retry = self.retry_policy().clone();
        for lookup in 0..retry.lookup_attempts.max(1) {
            if lookup > 0 {
                tokio::time::sleep(retry.lookup_interval).await;
            }
            let found = self
                .find_by_label(label)
                .await
                .map_err(|error| BuyError::Unconfirmed { offer_id, error })?;
            if let Some(id) = oldest(&found) {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// How long [`Self::buy`] waits out an unclear create before it may buy elsewhere.
    pub fn grace_window(&self) -> Duration {
        let retry = self.retry_policy();
        retry.lookup_interval * retry.lookup_attempts.saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_follows_a_create() {
        let err = |status: u16, body: &str| Err(VastError::from_response(status, body.as_bytes()));
        assert_eq!(after_create(&Ok(7)), Next::Done(7));
        assert_eq!(
            after_create(&err(
                404,
                r#"{"error":"invalid_args","msg":"no_such_ask Instance type by id 5"}"#
            )),
            Next::NextOffer
        );
        assert_eq!(
            after_create(&err(410, r#"{"error":"no_such_ask"}"#)),
            Next::NextOffer
        );
        // The client already waited out 429s; the next offer would meet the same limit.
        assert_eq!(after_create(&err(429, "too frequent")), Next::Stop);
        assert_eq!(
            after_create(&err(403, r#"{"msg":"Offer 5 is not your own"}"#)),
            Next::NextOffer
        );
        assert_eq!(after_create(&err(502, "Bad Gateway")), Next::Confirm);
        assert_eq!(
            after_create(&Err(VastError::Timeout {
                timeout: Duration::from_secs(30)
            })),
            Next::Confirm
        );
        assert_eq!(
            after_create(&err(401, r#"{"error":"auth_error"}"#)),
            Next::Stop
        );
        assert_eq!(after_create(&err(402, "{}")), Next::Stop);
        assert_eq!(
            after_create(&err(400, r#"{"error":"invalid_args","msg":"disk"}"#)),
            Next::Stop
        );
    }
}
