//! The async shell around the policy: parse, look up, decide, respond.

use std::collections::BTreeMap;

use kube::core::admission::AdmissionResponse;

use crate::cluster::ClusterView;
use crate::metrics::Outcome;
use crate::policy::{self, Context, PolicyConfig, Verdict};
use crate::review::{self, BadReview};

/// Answers one review body: the response to send and how it ended, or why the body is invalid.
pub async fn admit<C: ClusterView>(
    body: &[u8],
    cluster: &C,
    config: &PolicyConfig,
) -> Result<(AdmissionResponse, Outcome), BadReview> {
    let request = review::parse(body)?;
    let Some(creation) = review::pod_creation(&request)? else {
        return Ok((AdmissionResponse::from(&request), Outcome::Unchanged));
    };
    let verdict = match policy::screen(&creation.pod, &creation.namespace, config) {
        Some(reason) => Verdict::Allow {
            mutation: policy::Mutation::default(),
            warnings: Vec::new(),
            untouched: Some(reason),
        },
        None => match lookup_context(&creation, cluster).await {
            Ok(context) => policy::decide(&creation.pod, &creation.namespace, &context, config),
            Err(error) => {
                tracing::warn!(%error, namespace = %creation.namespace, "admission refused: lookup failed");
                let message = format!("runpod-kubelet {error}; the request can be retried");
                return Ok((review::internal_error(&request, message), Outcome::Error));
            }
        },
    };
    let (response, patched) = review::respond(&request, &creation, &verdict);
    let outcome = match (&verdict, patched) {
        (Verdict::Deny { .. }, _) => Outcome::Rejected,
        (_, true) => Outcome::Mutated,
        _ if !response.allowed => Outcome::Error,
        _ => Outcome::Unchanged,
    };
    log_verdict(&creation, &verdict);
    Ok((response, outcome))
}

async fn lookup_context<C: ClusterView>(
    creation: &review::PodCreation,
    cluster: &C,
) -> Result<Context, crate::cluster::LookupError> {
    let namespace_labels: BTreeMap<String, String> =
        cluster.namespace_labels(&creation.namespace).await?;
    let job = match policy::owning_job(&creation.pod) {
        Some((name, uid)) => cluster.job(&creation.namespace, &name, &uid).await?,
        None => None,
    };
    Ok(Context {
        namespace_labels,
        job,
    })
}

fn log_verdict(creation: &review::PodCreation, verdict: &Verdict) {
    let name = creation
        .pod
        .metadata
        .name
        .as_deref()
        .or(creation.pod.metadata.generate_name.as_deref())
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
