//! The create marker that makes a create crash-safe: written before anything is sent, moved
//! on while a provision is in flight, so a successor never misses a create sent before this
//! process died.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use runpod_contract::CREATE_REQUESTED;
use serde_json::json;
use tracing::warn;

use crate::controller::context::Shared;
use crate::provider::{Provider, ProvisionError, ProvisionRequest, Provisioned};

/// Writes `runpod.io/create-requested` with the current time, remembering it first: the next
/// reconcile may see a pod cache that does not show the marker yet.
pub(super) async fn mark_create_requested<P>(
    ctx: &Shared<P>,
    uid: &str,
    pods: &Api<Pod>,
    name: &str,
) -> Result<(), kube::Error> {
    let now = Timestamp::now();
    ctx.remember(uid, |m| m.create_marked_at = Some(now));
    let patch = json!({"metadata": {"annotations": {CREATE_REQUESTED: now.to_string()}}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// How often the create marker is moved on while a provision is in flight.
pub(crate) fn marker_refresh(create_settle: Duration) -> Duration {
    (create_settle / 4).max(Duration::from_millis(250))
}

/// Provisions while keeping the create marker fresh. A provision can send its creates long
/// after the marker was written (the rate limiter holds them, 429s and 5xx are retried, the
/// catalogue is slow): a successor that waited only `--create-settle` after an old marker could
/// then miss a pod sent just before this process died, and create a second one. So the marker
/// is rewritten every quarter of the settle time: every create is sent at most that long after
/// the last marker, and the list a successor waits for (taken `--create-settle` after it)
/// shows it. If the marker cannot be written, the provision is abandoned (nothing more is sent)
/// and its outcome is treated as unknown.
pub(super) async fn provision_marked<P: Provider>(
    ctx: &Shared<P>,
    pods: &Api<Pod>,
    name: &str,
    request: ProvisionRequest<'_>,
) -> Result<Provisioned, ProvisionError> {
    let every = marker_refresh(ctx.settings.create_settle);
    let uid = request.pod.metadata.uid.clone().unwrap_or_default();
    let provision = ctx.provider.provision(request);
    tokio::pin!(provision);
    let mut next = tokio::time::Instant::now() + every;
    loop {
        tokio::select! {
            outcome = &mut provision => return outcome,
            () = tokio::time::sleep_until(next) => {
                if let Err(error) = mark_create_requested(ctx, &uid, pods, name).await {
                    warn!(error = %error, "cannot move the create marker on; abandoning the create");
                    return Err(ProvisionError::Unsettled(format!(
                        "the create was abandoned (its marker could not be written: {error})"
                    )));
                }
                next = tokio::time::Instant::now() + every;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_create_marker_moves_on_four_times_per_settle_window() {
        // A create is sent at most this long after the last marker; the list a successor
        // waits for is taken a whole settle window after it, leaving 3/4 for the list lag.
        assert_eq!(
            marker_refresh(Duration::from_secs(30)),
            Duration::from_millis(7500)
        );
        assert_eq!(
            marker_refresh(Duration::from_millis(400)),
            Duration::from_millis(250)
        );
    }
}
