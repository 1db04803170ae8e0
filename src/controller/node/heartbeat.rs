//! The node's two heartbeats while this replica leads: the Lease renewed every few seconds, and
//! the status (conditions, taints, published prices) written every 30 s or at once when the
//! cloud's health changes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
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
pub async fn lease_loop(
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
pub async fn node_status_loop<P: Provider>(
    nodes: Api<Node>,
    config: NodeConfig,
    mut health: watch::Receiver<ApiHealth>,
    provider: Arc<P>,
    presence: Arc<Presence>,
) {
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

/// One status apply and one taint/annotation sync.
async fn write_node<P: Provider>(
    nodes: &Api<Node>,
    config: &NodeConfig,
    health: &ApiHealth,
    transitions: &TransitionTimes,
    provider: &P,
    presence: &Presence,
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
    let prices = provider.cheapest_prices();
    let cheapest = (!prices.is_empty()).then(|| runpod_contract::format_cheapest_prices(&prices));
    if let Err(error) = super::sync_spec(nodes, config, health, cheapest).await {
        warn!(error = %error, "updating the node's taints failed");
    }
}
