//! Budgets at admission: whether a pod could ever fit its namespace's budget (refused if not)
//! and whether it fits now (a warning: it waits Pending). The rules are
//! `runpod_contract::budget`'s, which the controllers apply before every create.

use runpod_contract::budget::{self, budget_of};
use runpod_contract::checks;
use runpod_contract::provider::Cloud;

use super::{Context, PolicyConfig};

/// A refusal at admission: code and message.
pub(super) type Refusal = (u16, String);

/// The namespace's budget against the pod's cheapest published price on `cloud`: a refusal
/// when it could never fit, a warning when it does not fit now.
pub(super) fn check(
    namespace: &str,
    effective: &checks::Effective<'_>,
    gpus: u32,
    cloud: Cloud,
    config: &PolicyConfig,
    context: &Context,
) -> Result<Option<String>, Refusal> {
    let budget = match budget_of(&context.namespace_annotations, config.default_budget) {
        None => return Ok(None),
        Some(Err(problem)) => {
            return Err((
                422,
                format!(
                    "namespace {namespace} has annotation {}: {problem}; ask the platform team \
                     to fix it",
                    budget::BUDGET_PER_HOUR
                ),
            ));
        }
        Some(Ok(budget)) => budget,
    };
    let Some(prices) = context.gpu_prices.get(&cloud) else {
        return Ok(None);
    };
    let fits = super::cheapest::fits_on(cloud, effective, gpus, config, prices);
    let cheapest = fits.cheapest.as_ref().map(|fit| (fit.gpu, fit.per_hour));
    if let Some(refusal) = budget::never_fits(namespace, budget, cheapest) {
        return Err((403, refusal));
    }
    let price = fits.within_cap.or(fits.cheapest).map(|fit| fit.per_hour);
    Ok(match (context.namespace_spend, price) {
        (Some(spend), Some(price)) if !budget::fits(spend, price, budget) => Some(format!(
            "runpod-kubelet: namespace {namespace} spends {spend:.3} USD/h of its budget of \
             {budget:.3} USD/h now and this pod costs at least {price:.3} USD/h: it waits \
             Pending ({}) until room frees up",
            budget::BUDGET_EXCEEDED
        )),
        _ => None,
    })
}
