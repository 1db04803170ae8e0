//! Keeps the virtual node registered while this replica leads. A deleted node is registered
//! again at once: the cluster's PodGC force-deletes the pods of a node that stays missing for
//! its quarantine (40 s, checked every 20 s), so a quick return keeps every running pod. The
//! current node's UID is published for the Lease's owner reference, the status loop and
//! `/readyz`. A node deleted while marked by `controller drain` stays deleted: drain removes it
//! on purpose, and a node of that name without our label is never taken over.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::{Notify, watch};
use tracing::{error, info, warn};

use crate::controller::cloud::gate::{DrainState, drain_state};
use crate::controller::node::drain::is_ours;
use crate::controller::node::{self, NodeConfig, NodeError};

/// Pause between attempts to register a deleted node while the apiserver refuses.
const RETRY: Duration = Duration::from_secs(2);

/// The UID of our node while it exists; `None` while it is missing (or not ours).
pub(crate) type NodeUid = watch::Receiver<Option<String>>;

/// Shared by the keeper, the Lease and status loops and `/readyz`.
#[derive(Debug)]
pub(crate) struct Presence {
    uid: watch::Sender<Option<String>>,
    recheck: Notify,
}

impl Presence {
    /// Starts with the UID `lead` registered.
    pub(crate) fn new(uid: Option<String>) -> Arc<Presence> {
        Arc::new(Presence {
            uid: watch::channel(uid).0,
            recheck: Notify::new(),
        })
    }

    pub(crate) fn subscribe(&self) -> NodeUid {
        self.uid.subscribe()
    }

    /// A write found the node missing (404): look again at once, in case the watch missed the
    /// deletion.
    pub(crate) fn missing(&self) {
        self.recheck.notify_one();
    }

    fn publish(&self, uid: Option<String>) {
        self.uid.send_if_modified(|current| {
            let changed = *current != uid;
            *current = uid;
            changed
        });
    }
}

/// What one look at the node (or its absence) calls for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Our node exists, with this UID.
    Ours(Option<String>),
    /// A node of this name exists without our provider label: never touched.
    Foreign,
    /// Missing: register it again.
    Register,
    /// Missing after `controller drain` marked it: leave it gone.
    Drained,
}

/// Decides from the node (`None`: missing) and whether the last node seen was being drained.
pub(crate) fn seen(node: Option<&Node>, provider: &str, last_draining: bool) -> Seen {
    match node {
        Some(node) if is_ours(node, provider) => Seen::Ours(node.metadata.uid.clone()),
        Some(_) => Seen::Foreign,
        None if last_draining => Seen::Drained,
        None => Seen::Register,
    }
}

/// Follows the node until the task is aborted, registering it again whenever it goes missing.
pub(crate) async fn keep(nodes: Api<Node>, config: NodeConfig, presence: Arc<Presence>) {
    let mut stream = Box::pin(watcher::watch_object(nodes.clone(), &config.name).default_backoff());
    let mut draining = false;
    loop {
        let node = tokio::select! {
            event = stream.next() => match event {
                Some(Ok(node)) => node,
                Some(Err(error)) => {
                    warn!(%error, "watching the virtual node failed");
                    continue;
                }
                None => return,
            },
            () = presence.recheck.notified() => match nodes.get_opt(&config.name).await {
                Ok(node) => node,
                Err(error) => {
                    warn!(%error, "reading the virtual node failed");
                    continue;
                }
            },
        };
        if let Some(node) = &node {
            draining = matches!(drain_state(Some(node)), DrainState::Draining(_));
        }
        match seen(node.as_ref(), config.provider, draining) {
            Seen::Ours(uid) => presence.publish(uid),
            Seen::Foreign => {
                error!(node = %config.name, "a node of this name exists without our provider label; it is left alone");
                presence.publish(None);
            }
            Seen::Drained => {
                info!(node = %config.name, "the drained virtual node was removed; not registering it again");
                presence.publish(None);
            }
            Seen::Register => {
                presence.publish(None);
                warn!(node = %config.name, "the virtual node was deleted; registering it again");
                register_again(&nodes, &config, &presence).await;
            }
        }
    }
}

/// Registers until it works or a foreign node took the name.
async fn register_again(nodes: &Api<Node>, config: &NodeConfig, presence: &Presence) {
    loop {
        match node::register(nodes, config).await {
            Ok(registered) => {
                info!(node = %config.name, uid = ?registered.metadata.uid, "virtual node registered again");
                presence.publish(registered.metadata.uid);
                return;
            }
            Err(NodeError::NotOurs(..)) => {
                error!(node = %config.name, "a node of this name appeared without our provider label; it is left alone");
                return;
            }
            Err(NodeError::Kube(error)) => {
                warn!(%error, "registering the virtual node again failed; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;
    use runpod_contract::PROVIDER_TAINT_KEY;

    fn node(provider: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                uid: Some("uid-2".into()),
                labels: Some([(PROVIDER_TAINT_KEY.to_owned(), provider.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn a_missing_node_is_registered_again_unless_drain_removed_it() {
        assert_eq!(seen(None, "runpod", false), Seen::Register);
        assert_eq!(seen(None, "runpod", true), Seen::Drained);
        assert_eq!(
            seen(Some(&node("runpod")), "runpod", false),
            Seen::Ours(Some("uid-2".into()))
        );
        assert_eq!(seen(Some(&node("other")), "runpod", false), Seen::Foreign);
    }

    #[test]
    fn subscribers_see_the_current_uid() {
        let presence = Presence::new(Some("uid-1".into()));
        let mut uid = presence.subscribe();
        presence.publish(Some("uid-1".into()));
        assert!(!uid.has_changed().unwrap(), "same UID: no wake-up");
        presence.publish(None);
        assert_eq!(*uid.borrow_and_update(), None);
        presence.publish(Some("uid-2".into()));
        assert_eq!(uid.borrow_and_update().as_deref(), Some("uid-2"));
    }
}
