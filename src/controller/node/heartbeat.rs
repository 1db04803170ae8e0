//! The node's two heartbeats while this replica leads: the Lease renewed every few seconds, and
//! the status (conditions, taints, published prices per GPU type) written every 30 s or at once when the
//! cloud's health changes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use tokio::sync::watch;
use tracing::warn;

use super::health::ApiHealth;
use super::lease;
use super::presence::{NodeUid, Presence};
use super::{NodeConfig, TransitionTimes};
use crate::controller::metrics::{ControllerMetrics, OutcomeLabel};
use crate::provider::Provider;

/// How often the node's status is written when nothing changes.
const NODE_STATUS_INTERVAL: Duration = Duration::from_secs(30);

/// Renews the node Lease, owned by the node's current UID: at once when the node is registered
/// again (the garbage collector deletes a Lease whose owner is gone), not while it is missing.
pub(crate) async fn lease_loop(
    client: kube::Client,
    node: String,
    mut node_uid: NodeUid,
    metrics: Arc<ControllerMetrics>,
) {
    let mut interval = tokio::time::interval(lease::RENEW_INTERVAL);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            changed = node_uid.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let Some(uid) = node_uid.borrow_and_update().clone() else {
            continue;
        };
        match lease::renew(&client, &node, Some(&uid)).await {
            Ok(()) => {
                metrics
                    .lease_renewals
                    .get_or_create(&OutcomeLabel { outcome: "ok" })
                    .inc();
            }
            Err(error) => {
                metrics
                    .lease_renewals
                    .get_or_create(&OutcomeLabel { outcome: "error" })
                    .inc();
                warn!(error = %error, "renewing the node Lease failed");
            }
        }
    }
}

/// Writes the node's status and taints while our node exists: every 30 s, when the API health
/// changes, and at once when the node is registered again (a 404 asks for a new look).
pub(crate) async fn node_status_loop<P: Provider>(
    nodes: Api<Node>,
    config: NodeConfig,
    mut health: watch::Receiver<ApiHealth>,
    provider: Arc<P>,
    presence: Arc<Presence>,
    metrics: Arc<ControllerMetrics>,
) {
    let mut reported = BTreeSet::new();
    let mut node_uid = presence.subscribe();
    let mut written_uid = None;
    let mut transitions = TransitionTimes::default();
    loop {
        let current = health.borrow_and_update().clone();
        let uid = node_uid.borrow_and_update().clone();
        if uid.is_some() {
            if uid != written_uid {
                // A new node object: its conditions start now.
                if written_uid.is_some() {
                    transitions = TransitionTimes::default();
                }
                written_uid.clone_from(&uid);
            }
            write_node(
                &nodes,
                &config,
                &current,
                &transitions,
                &*provider,
                &presence,
                (&metrics, &mut reported),
            )
            .await;
        }
        let _ = tokio::time::timeout(NODE_STATUS_INTERVAL, async {
            tokio::select! {
                changed = health.changed() => changed,
                changed = node_uid.changed() => changed,
            }
        })
        .await;
    }
}

/// The per-type prices to publish, stamped with when they were read from the cloud (`fetched`,
/// else now), so that the webhook stops comparing them when this controller stops or its
/// refreshes keep failing; none while the cloud's API is unusable (its prices may be gone, and
/// nothing can be created there meanwhile) or once they are stale.
fn published_prices(
    prices: runpod_contract::gpus::GpuPrices,
    health: &ApiHealth,
    fetched: Option<i64>,
    now: i64,
) -> String {
    let at = fetched.unwrap_or(now);
    let stale = now - at > runpod_contract::gpus::STALE_AFTER_SECS;
    if prices.is_empty() || *health != ApiHealth::Available || stale {
        return String::new();
    }
    prices.stamped(at).format()
}

/// The class of a price from a cloud without classes, in `runpod.io/cheapest-gpu-price`.
const ANY_CLASS: &str = "ANY";

/// A GPU the cloud sells that the catalogue does not know cannot be asked for or compared: each
/// new name is logged once, and the count is a metric.
fn note_unknown_gpus(
    unknown: &BTreeSet<String>,
    reported: &mut BTreeSet<String>,
    metrics: &ControllerMetrics,
) {
    for name in unknown.difference(reported) {
        warn!(
            gpu = %name,
            "the cloud sells a GPU the GPU catalogue does not know: pods cannot name it and \
             `cheapest` does not compare it until a release adds it"
        );
    }
    reported.extend(unknown.iter().cloned());
    metrics
        .unknown_gpu_types
        .set(i64::try_from(unknown.len()).unwrap_or(i64::MAX));
}

/// One status apply and one taint/annotation sync.
async fn write_node<P: Provider>(
    nodes: &Api<Node>,
    config: &NodeConfig,
    health: &ApiHealth,
    transitions: &TransitionTimes,
    provider: &P,
    presence: &Presence,
    (metrics, reported): (&ControllerMetrics, &mut BTreeSet<String>),
) {
    match super::apply_status(nodes, config, health, transitions).await {
        Ok(()) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {
            warn!(node = %config.name, "the virtual node is missing; registering it again");
            presence.missing();
            return;
        }
        Err(error) => warn!(error = %error, "writing the node status failed"),
    }
    let sheet = provider.price_sheet();
    note_unknown_gpus(&sheet.unknown_gpus, reported, metrics);
    let mut annotations = Vec::new();
    if !sheet.prices.is_empty() {
        let lowest = sheet.prices.lowest_per_class(ANY_CLASS);
        annotations.push((
            runpod_contract::CHEAPEST_GPU_PRICE,
            runpod_contract::format_cheapest_prices(&lowest),
        ));
    }
    annotations.push((
        runpod_contract::gpus::GPU_PRICES,
        published_prices(
            sheet.prices,
            health,
            sheet.fetched_at,
            Timestamp::now().as_second(),
        ),
    ));
    if !sheet.volume_gpus.is_empty() {
        annotations.push((
            runpod_contract::volumes::DATACENTER_GPUS,
            runpod_contract::volumes::format_datacenter_gpus(&sheet.volume_gpus),
        ));
    }
    let serves = config.serves.join(",");
    annotations.push((runpod_contract::teams::SERVES_NAMESPACES, serves));
    if let Err(error) = super::sync_spec(nodes, config, health, &annotations).await {
        warn!(error = %error, "updating the node's taints failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_are_stamped_and_withdrawn_while_the_cloud_is_unusable() {
        let prices = runpod_contract::gpus::GpuPrices::parse("H100x1-8:SECURE=2.99");
        let published = published_prices(prices.clone(), &ApiHealth::Available, None, 1_000_123);
        assert_eq!(published, "at=999900,H100x1-8:SECURE=2.99");
        // Stamped with when they were read: a refresh that keeps failing lets them go stale.
        let read_earlier = published_prices(
            prices.clone(),
            &ApiHealth::Available,
            Some(999_500),
            1_000_123,
        );
        assert_eq!(read_earlier, "at=999300,H100x1-8:SECURE=2.99");
        assert_eq!(
            published_prices(prices.clone(), &ApiHealth::Available, Some(0), 1_000_123),
            ""
        );
        let down = ApiHealth::Unavailable {
            reason: "APIUnreachable".into(),
            message: "down".into(),
        };
        assert_eq!(published_prices(prices, &down, None, 1_000_123), "");
        assert_eq!(
            published_prices(Default::default(), &ApiHealth::Available, None, 1),
            ""
        );
    }

    #[test]
    fn unknown_gpus_are_reported_once_and_counted_while_sold() {
        let metrics = ControllerMetrics::default();
        let mut reported = BTreeSet::new();
        let sold = BTreeSet::from(["Quantum X9".to_owned(), "NVIDIA Z100".to_owned()]);
        note_unknown_gpus(&sold, &mut reported, &metrics);
        assert_eq!(metrics.unknown_gpu_types.get(), 2);
        assert_eq!(reported, sold, "each name is logged once");
        // One stops being sold: the gauge follows, the names stay reported.
        let fewer = BTreeSet::from(["Quantum X9".to_owned()]);
        note_unknown_gpus(&fewer, &mut reported, &metrics);
        assert_eq!(metrics.unknown_gpu_types.get(), 1);
        assert_eq!(reported.len(), 2);
    }
}
