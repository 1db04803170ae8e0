//! `runpod-kubelet controller drain`: nothing of this cluster and node left billing, then the
//! virtual node removed. Made for uninstalling (the chart runs it as a pre-delete hook, while
//! the controller still runs), so it first stops the running leader from creating anything:
//!
//! 1. the node (only if it carries our provider label) is cordoned and marked
//!    `runpod.io/draining: <token>`; if a controller is alive (node Lease fresh), drain waits for
//!    its `runpod.io/drain-acknowledged: <token>`: the leader's create gate is closed and no
//!    create is under way (see `gate`);
//! 2. every live cloud instance tagged with this cluster id and node is terminated, and the list
//!    is read again until three lists in a row show none (`clear`), all taken at least the
//!    create settle time after the drain began when the node's pods record a create whose
//!    instance no list shows (a create whose answer was lost may be missing from lists that
//!    long: it is caught and terminated);
//! 3. the Kubernetes pods bound to the node are removed (a controller restarted after this
//!    finds nothing to create), then the node itself (with a UID precondition).
//!
//! Untagged instances and other clusters' or nodes' are never touched. A second run finds
//! nothing to do and succeeds.

pub(crate) mod clear;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use runpod_contract::{DRAIN_ACK_ANNOTATION, DRAINING_ANNOTATION, PROVIDER_TAINT_KEY};
use serde_json::json;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::controller::clock::elapsed;
use crate::controller::node::lease::{LEASE_DURATION, NODE_LEASE_NAMESPACE};
use crate::provider::{Instance, LISTS_TO_CONFIRM, Provider, ProviderError};
use clear::ClearLists;

/// What to drain and how long to try.
#[derive(Debug, Clone)]
pub struct DrainConfig {
    pub node_name: String,
    pub cluster_id: String,
    pub timeout: Duration,
    /// Pause between lists.
    pub poll_interval: Duration,
    /// How long a live controller gets to acknowledge the marker.
    pub ack_wait: Duration,
    /// How long a created instance may be missing from lists (the controller's
    /// `--create-settle`): lists count as showing nothing only from that long after the
    /// latest create recorded on the node's pods.
    pub create_settle: Duration,
    /// Where `runpod-kubelet adopt` recorded the instances it took over: they are drained too.
    pub adoption_namespace: String,
}

/// What a drain did.
#[derive(Debug, Default)]
pub struct DrainReport {
    pub terminated: Vec<String>,
    pub pods_removed: usize,
    pub node_removed: bool,
    /// A node of that name exists but is not ours: left alone.
    pub foreign_node: bool,
}

/// Why a drain did not finish.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("timed out after {timeout:?}; still billing: {left}")]
    TimedOut { timeout: Duration, left: String },
    /// Retrying a refused key only waits out the timeout: drain stops at once, naming what the
    /// pods on the node say may still bill (the cloud cannot be asked).
    #[error("{message}; drain stopped without terminating anything. May still bill: {may_bill}")]
    Refused { message: String, may_bill: String },
}

/// Live instances tagged with this cluster id and node: the only ones drain may touch.
pub fn ours_live<'a>(
    instances: &'a [Instance],
    cluster_id: &'a str,
    node_name: &'a str,
) -> impl Iterator<Item = &'a Instance> + 'a {
    instances.iter().filter(move |i| {
        i.state.is_live()
            && i.tags.cluster_id.as_deref() == Some(cluster_id)
            && i.tags.node_name.as_deref() == Some(node_name)
    })
}

/// Whether the node is ours to mark and remove.
pub fn is_ours(node: &Node, provider: &str) -> bool {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PROVIDER_TAINT_KEY))
        .map(String::as_str)
        == Some(provider)
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Whether a controller renewed the node Lease recently (it will see and answer the marker).
pub fn controller_alive(lease: Option<&Lease>, now: Timestamp) -> bool {
    lease
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.renew_time.as_ref())
        .is_some_and(|renewed| elapsed(renewed.0, now) < LEASE_DURATION)
}

fn describe(left: &[&Instance]) -> String {
    left.iter()
        .map(|i| {
            format!(
                "{} ({}, pod uid {})",
                i.id,
                i.state.as_str(),
                i.tags.pod_uid.as_deref().unwrap_or("-")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs the drain.
pub async fn drain<P: Provider>(
    client: kube::Client,
    provider: &P,
    config: &DrainConfig,
) -> Result<DrainReport, DrainError> {
    let deadline = Instant::now() + config.timeout;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut report = DrainReport::default();
    let node = nodes.get_opt(&config.node_name).await?;
    let our_node = match &node {
        Some(node) if is_ours(node, provider.name()) => Some(node.clone()),
        Some(_) => {
            warn!(node = %config.node_name, "a node of this name exists without our provider label; it is left alone");
            report.foreign_node = true;
            None
        }
        None => None,
    };

    // A refused key is known before the node is touched: nothing is marked or cordoned, the
    // running controller goes on as before.
    if let Err(ProviderError::KeyRefused(message) | ProviderError::Account(message)) =
        provider.list().await
    {
        return Err(refused(provider, &client, &config.node_name, &message).await);
    }
    if let Some(node) = &our_node {
        mark(&client, &nodes, node, config, deadline).await?;
    }

    until_clear(&client, provider, config, deadline, &mut report).await?;

    if node.is_none() || our_node.is_some() {
        report.pods_removed = remove_pods(&client, &config.node_name).await?;
    }
    if let Some(node) = our_node {
        report.node_removed = delete_node(&nodes, &node).await?;
    }
    Ok(report)
}

/// Why lists that showed nothing do not end the drain yet.
fn not_yet_clear(lists: &ClearLists) -> String {
    match lists.waiting(std::time::Instant::now()) {
        Some(wait) => format!(
            "none listed, but a create recorded on the node's pods may not show in lists for {} s more",
            wait.as_secs()
        ),
        None => format!(
            "none listed, but only {} of {LISTS_TO_CONFIRM} lists in a row showed nothing so far",
            lists.clear()
        ),
    }
}

/// Terminates until lists in a row show nothing of ours alive ([`ClearLists`]), or the time
/// is up.
async fn until_clear<P: Provider>(
    client: &kube::Client,
    provider: &P,
    config: &DrainConfig,
    deadline: Instant,
    report: &mut DrainReport,
) -> Result<(), DrainError> {
    // Terminate until lists in a row show nothing of ours alive, all asked late enough to show
    // any create sent before the leader acknowledged (or died): the settle time from now on
    // when the node's pods record a create whose instance no list shows.
    let settle = config.create_settle.max(provider.read_lag());
    let mut lists = ClearLists::default();
    let mut records = clear::create_records(&bound_pods(client, &config.node_name).await?);
    // Only a create whose instance no list shows yet may be one the lists will show late (a
    // list that fails proves nothing: every recorded create counts then).
    let listed = match provider.list().await {
        Ok(instances) => instances,
        Err(error) => {
            warn!(%error, "listing instances failed; every create on record holds the drain");
            Vec::new()
        }
    };
    if clear::unseen_creates(&records, &listed, &config.cluster_id, &config.node_name) {
        lists.hold(std::time::Instant::now(), settle);
    }
    loop {
        let Some(left) = pass(client, provider, config, deadline, &mut lists, report).await? else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            return Err(DrainError::TimedOut {
                timeout: config.timeout,
                left,
            });
        }
        tokio::time::sleep(config.poll_interval).await;
        // A create recorded since (by a leader that did not acknowledge) holds the drain again.
        // A failed read is read again next time: one apiserver hiccup does not end the drain.
        match bound_pods(client, &config.node_name).await {
            Ok(pods) => {
                let now_records = clear::create_records(&pods);
                if now_records
                    .iter()
                    .any(|(uid, marker)| records.get(uid) != Some(marker))
                {
                    lists.hold(std::time::Instant::now(), settle);
                }
                records = now_records;
            }
            Err(error) => warn!(%error, "reading the node's pods failed; retrying"),
        }
    }
}

/// One pass: a list, and the terminates it calls for. `None` once the lists say nothing is
/// left; else what this pass leaves unsettled, said if the time is up.
async fn pass<P: Provider>(
    client: &kube::Client,
    provider: &P,
    config: &DrainConfig,
    deadline: Instant,
    lists: &mut ClearLists,
    report: &mut DrainReport,
) -> Result<Option<String>, DrainError> {
    let asked = std::time::Instant::now();
    // What this pass leaves unsettled: said if the time is up.
    let left = match provider.list().await {
        Ok(mut instances) => {
            // Adopted instances carry no tags of ours: the record says they are this node's.
            let record = crate::controller::adoption::load(
                client,
                &config.adoption_namespace,
                &config.node_name,
            )
            .await;
            match record {
                Err(error) => {
                    lists.failed();
                    warn!(%error, "reading the adoption record failed; retrying");
                    format!("unknown: reading the adoption record failed: {error}")
                }
                Ok(record) => {
                    let owner = crate::controller::adoption::Owner {
                        cluster_id: &config.cluster_id,
                        node_name: &config.node_name,
                    };
                    for instance in &mut instances {
                        crate::controller::adoption::tag(instance, &record, owner);
                    }
                    let live: Vec<&Instance> =
                        ours_live(&instances, &config.cluster_id, &config.node_name).collect();
                    if lists.seen(asked, live.is_empty()) {
                        return Ok(None);
                    }
                    if live.is_empty() {
                        not_yet_clear(lists)
                    } else {
                        if Instant::now() >= deadline {
                            return Err(DrainError::TimedOut {
                                timeout: config.timeout,
                                left: describe(&live),
                            });
                        }
                        terminate_all(provider, &live, report).await;
                        describe(&live)
                    }
                }
            }
        }
        Err(ProviderError::KeyRefused(message) | ProviderError::Account(message)) => {
            return Err(refused(provider, client, &config.node_name, &message).await);
        }
        Err(error) => {
            lists.failed();
            warn!(%error, cloud = provider.name(), "listing instances failed; retrying");
            format!(
                "unknown: listing {}s failed: {error}",
                provider.instance_noun()
            )
        }
    };
    Ok(Some(left))
}

/// One terminate for each live instance; a failure is tried again at the next list.
async fn terminate_all<P: Provider>(provider: &P, live: &[&Instance], report: &mut DrainReport) {
    for instance in live {
        info!(instance = %instance.id, state = instance.state.as_str(), pod_uid = ?instance.tags.pod_uid, "terminating");
        match provider
            .terminate(&instance.id, instance.state.termination_ends())
            .await
        {
            Ok(()) => {
                if !report.terminated.contains(&instance.id) {
                    report.terminated.push(instance.id.clone());
                }
            }
            Err(error) => {
                warn!(instance = %instance.id, %error, "terminating failed; retrying")
            }
        }
    }
}

/// Deletes the node, only the one that was read (its UID); `false` when it is gone already.
async fn delete_node(nodes: &Api<Node>, node: &Node) -> Result<bool, DrainError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: node.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match nodes
        .delete(node.metadata.name.as_deref().unwrap_or_default(), &params)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// Cordons and marks the node, then waits for a live controller's acknowledgement.
async fn mark(
    client: &kube::Client,
    nodes: &Api<Node>,
    node: &Node,
    config: &DrainConfig,
    deadline: Instant,
) -> Result<(), DrainError> {
    // A drain that ran before keeps its token, so its acknowledgement still counts.
    let token = annotation(node, DRAINING_ANNOTATION)
        .map(str::to_owned)
        .unwrap_or_else(|| {
            let suffix: String = (0..6).map(|_| fastrand::alphanumeric()).collect();
            format!("{}-{suffix}", Timestamp::now())
        });
    let annotations: BTreeMap<&str, &str> = [(DRAINING_ANNOTATION, token.as_str())].into();
    let patch = json!({"metadata": {"annotations": annotations}, "spec": {"unschedulable": true}});
    nodes
        .patch(
            &config.node_name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    info!(node = %config.node_name, %token, "node cordoned and marked for draining");

    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let lease = leases.get_opt(&config.node_name).await?;
    if !controller_alive(lease.as_ref(), Timestamp::now()) {
        info!("no controller renews the node Lease; not waiting for an acknowledgement");
        return Ok(());
    }
    let ack_deadline = deadline.min(Instant::now() + config.ack_wait);
    loop {
        match nodes.get_opt(&config.node_name).await? {
            Some(node) if annotation(&node, DRAIN_ACK_ANNOTATION) == Some(token.as_str()) => {
                info!("the controller acknowledged the drain: it creates nothing more");
                return Ok(());
            }
            Some(_) => {}
            None => return Ok(()),
        }
        if Instant::now() >= ack_deadline {
            warn!(
                "the controller did not acknowledge the drain; terminating anyway, and holding on while it records creates"
            );
            return Ok(());
        }
        tokio::time::sleep(config.poll_interval.min(Duration::from_secs(1))).await;
    }
}

/// The error of a drain the cloud refuses to serve.
async fn refused<P: Provider>(
    provider: &P,
    client: &kube::Client,
    node_name: &str,
    message: &str,
) -> DrainError {
    DrainError::Refused {
        message: format!("{} refused the key: {message}", provider.cloud().title),
        may_bill: may_bill(client, node_name).await,
    }
}

/// What the pods bound to the node name as their instances: what may still bill when the cloud
/// cannot be listed.
async fn may_bill(client: &kube::Client, node_name: &str) -> String {
    let pods: Api<Pod> = Api::all(client.clone());
    let bound = match pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await
    {
        Ok(bound) => bound.items,
        Err(error) => return format!("unknown (listing the node's pods failed: {error})"),
    };
    let named: Vec<String> = bound
        .iter()
        .filter_map(|pod| {
            let annotations = pod.metadata.annotations.as_ref()?;
            let id = [
                runpod_contract::POD_ID,
                runpod_contract::vastai::INSTANCE_ID,
            ]
            .into_iter()
            .find_map(|key| annotations.get(key))?;
            Some(format!(
                "{id} (pod {}/{})",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            ))
        })
        .collect();
    if named.is_empty() {
        "no pod on the node names an instance (instances created without one cannot be known \
         here: check the cloud's console)"
            .to_owned()
    } else {
        named.join(", ")
    }
}

/// Removes the pods bound to the node at once (grace 0): their cloud instances are gone, and
/// a controller restarted later must find nothing to create.
/// The pods bound to the node.
async fn bound_pods(client: &kube::Client, node_name: &str) -> Result<Vec<Pod>, kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let bound = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await?;
    Ok(bound.items)
}

async fn remove_pods(client: &kube::Client, node_name: &str) -> Result<usize, kube::Error> {
    let mut removed = 0;
    for pod in bound_pods(client, node_name).await? {
        let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            continue;
        };
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match Api::<Pod>::namespaced(client.clone(), namespace)
            .delete(name, &params)
            .await
        {
            Ok(_) => removed += 1,
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(error) => return Err(error),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{InstanceState, Tags};
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;

    fn instance(
        id: &str,
        cluster: Option<&str>,
        node: Option<&str>,
        state: InstanceState,
    ) -> Instance {
        Instance {
            ssh: None,
            machine: None,
            disruption: None,
            id: id.into(),
            name: id.into(),
            tags: Tags {
                cluster_id: cluster.map(str::to_owned),
                node_name: node.map(str::to_owned),
                pod_uid: Some("u".into()),
            },
            state,
            uptime_secs: None,
            cost_per_hour: None,
            gpu_type: None,
            datacenter: None,
            endpoints: vec![],
            ip: None,
            created_at: None,
            started_at: None,
            message: None,
            usage: None,
        }
    }

    #[test]
    fn drain_touches_only_live_instances_of_this_cluster_and_node() {
        let all = vec![
            instance("mine", Some("c1"), Some("vr"), InstanceState::Running),
            instance("mine-exited", Some("c1"), Some("vr"), InstanceState::Exited),
            instance(
                "mine-gone",
                Some("c1"),
                Some("vr"),
                InstanceState::Terminated,
            ),
            instance(
                "other-cluster",
                Some("c2"),
                Some("vr"),
                InstanceState::Running,
            ),
            instance(
                "other-node",
                Some("c1"),
                Some("vr2"),
                InstanceState::Running,
            ),
            instance("untagged", None, None, InstanceState::Running),
        ];
        let ids: Vec<_> = ours_live(&all, "c1", "vr").map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["mine", "mine-exited"]);
        let left: Vec<&Instance> = ours_live(&all, "c1", "vr").collect();
        assert!(describe(&left).contains("mine-exited (exited, pod uid u)"));
    }

    #[test]
    fn only_a_node_with_our_provider_label_is_ours() {
        let labelled = |value: &str| Node {
            metadata: ObjectMeta {
                labels: Some([(PROVIDER_TAINT_KEY.to_owned(), value.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        assert!(is_ours(&labelled("runpod"), "runpod"));
        assert!(!is_ours(&labelled("other"), "runpod"));
        assert!(!is_ours(&Node::default(), "runpod"));
    }

    #[test]
    fn a_controller_is_alive_while_its_node_lease_is_fresh() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let lease = |renewed: &str| Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(renewed.parse().unwrap())),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        assert!(controller_alive(Some(&lease("2026-01-01T00:00:50Z")), now));
        assert!(!controller_alive(Some(&lease("2026-01-01T00:00:00Z")), now));
        assert!(!controller_alive(None, now));
    }
}
