//! The async shell around the policy: parse, look up, decide, respond.

use std::collections::BTreeMap;

use crate::cluster::ClusterView;
use crate::metrics::Outcome;
use crate::policy::{self, Context, PolicyConfig, Verdict};
use crate::review::{self, AdmissionResponse, BadReview};

/// Answers one review body: the response to send and how it ended, or why the body is invalid.
pub async fn admit<C: ClusterView>(
    body: &[u8],
    cluster: &C,
    config: &PolicyConfig,
) -> Result<(AdmissionResponse, Outcome), BadReview> {
    let review::Reviewed { uid, creation } = review::read(body)?;
    let Some(creation) = creation else {
        return Ok((AdmissionResponse::allow(&uid), Outcome::Unchanged));
    };
    let verdict = match policy::screen(&creation.pod, &creation.namespace, config) {
        Some(reason) => Verdict::Allow {
            mutation: policy::Mutation::default(),
            warnings: Vec::new(),
            untouched: Some(reason),
        },
        None => match lookup_context(&creation, cluster, config).await {
            Ok(context) => policy::decide(&creation.pod, &creation.namespace, &context, config),
            Err(error) => {
                tracing::warn!(%error, namespace = %creation.namespace, "admission refused: lookup failed");
                let message = format!("runpod-kubelet {error}; the request can be retried");
                let response = AdmissionResponse::deny(&uid, 500, "InternalError", message);
                return Ok((response, Outcome::Error));
            }
        },
    };
    log_verdict(&creation, &verdict);
    let denied = matches!(verdict, Verdict::Deny { .. });
    let response = review::respond(&uid, &creation, verdict);
    let outcome = match (denied, response.allowed, response.is_patched()) {
        (true, _, _) => Outcome::Rejected,
        (false, false, _) => Outcome::Error,
        (false, true, true) => Outcome::Mutated,
        (false, true, false) => Outcome::Unchanged,
    };
    Ok((response, outcome))
}

async fn lookup_context<C: ClusterView>(
    creation: &review::PodCreation,
    cluster: &C,
    config: &PolicyConfig,
) -> Result<Context, crate::cluster::LookupError> {
    let namespace_labels: BTreeMap<String, String> =
        cluster.namespace_labels(&creation.namespace).await?;
    let job = match policy::owning_job(&creation.pod) {
        Some((name, uid)) => cluster.job(&creation.namespace, name, uid).await?,
        None => None,
    };
    let namespace_annotations = cluster.namespace_annotations(&creation.namespace).await;
    // The ledger is read only where a budget could make it matter.
    let namespace_spend = if namespace_annotations
        .contains_key(runpod_contract::budget::BUDGET_PER_HOUR)
        || config.default_budget.is_some()
    {
        cluster.namespace_spend(&creation.namespace).await
    } else {
        None
    };
    let mut claim_provisioners = BTreeMap::new();
    let mut claim_datacenters = BTreeMap::new();
    for claim in runpod_contract::checks::claims(&creation.pod) {
        if let Some(found) = cluster.claim(&creation.namespace, claim).await {
            claim_provisioners.insert(claim.to_owned(), found.provisioner);
            if let Some(datacenter) = found.datacenter {
                claim_datacenters.insert(claim.to_owned(), datacenter);
            }
        }
    }
    let datacenter_gpus = if claim_provisioners.is_empty() {
        BTreeMap::new()
    } else {
        cluster.datacenter_gpus()
    };
    Ok(Context {
        namespace_labels,
        job,
        claim_provisioners,
        claim_datacenters,
        cheapest_gpu_price: cluster.cheapest_gpu_prices(),
        gpu_prices: cluster.gpu_prices(),
        datacenter_gpus,
        namespace_annotations,
        served: cluster.served(),
        namespace_spend,
    })
}

fn log_verdict(creation: &review::PodCreation, verdict: &Verdict) {
    let name = creation
        .pod
        .meta()
        .name
        .as_deref()
        .or(creation.pod.meta().generate_name.as_deref())
        .unwrap_or_default();
    match verdict {
        Verdict::Deny { code, message, .. } => {
            tracing::info!(namespace = %creation.namespace, pod = name, code, %message, "pod rejected");
        }
        Verdict::Allow {
            untouched: Some(reason),
            ..
        } => {
            tracing::debug!(namespace = %creation.namespace, pod = name, ?reason, "pod admitted unchanged");
        }
        Verdict::Allow { .. } => {
            tracing::info!(namespace = %creation.namespace, pod = name, "pod admitted for RunPod bursting");
        }
    }
}
