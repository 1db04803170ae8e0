//! Leader election on a Lease (kube-lease-manager acquires, renews and releases it) and the
//! fence that stops a leader acting before its lease could expire.
//!
//! The fence is our own: it trusts only what the apiserver stores. Every time the election
//! Lease is seen holding our identity with a `renewTime` r (written with our own clock), the
//! leader may act until r + renew deadline. The deadline is shorter than the lease duration, so
//! a leader that cannot renew (apiserver unreachable, process stalled) stops — and every cloud
//! call checks the fence before it starts — while the lease is still its own; a standby may
//! only take the lease at r + lease duration.

use std::future::Future;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

/// How the replicas elect a leader (client-go's names and defaults).
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    pub lease_name: String,
    pub namespace: String,
    /// Unique per replica.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Why the election settings cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElectionConfigError {
    #[error("--leader-elect-retry-period must be at least 1s")]
    RetryTooShort,
    #[error("--leader-elect-renew-deadline must be longer than --leader-elect-retry-period")]
    DeadlineNotAfterRetry,
    #[error(
        "--leader-elect-lease-duration must be longer than --leader-elect-renew-deadline (the difference is the margin for clock skew)"
    )]
    DurationNotAfterDeadline,
}

impl ElectionConfig {
    /// Checks the ordering retry < deadline < duration that the fence relies on.
    pub fn validate(&self) -> Result<(), ElectionConfigError> {
        if self.retry_period < Duration::from_secs(1) {
            return Err(ElectionConfigError::RetryTooShort);
        }
        if self.renew_deadline <= self.retry_period {
            return Err(ElectionConfigError::DeadlineNotAfterRetry);
        }
        if self.lease_duration.as_secs() <= self.renew_deadline.as_secs() {
            return Err(ElectionConfigError::DurationNotAfterDeadline);
        }
        Ok(())
    }

    /// kube-lease-manager renews when `grace` seconds are left; renewing every retry period
    /// means a grace of duration − retry.
    pub fn grace_secs(&self) -> u64 {
        self.lease_duration
            .as_secs()
            .saturating_sub(self.retry_period.as_secs().max(1))
            .max(1)
    }
}

/// A replica identity: the pod name (or host name), the address it serves on, and a random
/// suffix so that a restarted process never inherits its predecessor's lease.
pub fn identity(host: &str, address: &str) -> String {
    let suffix: String = (0..6).map(|_| fastrand::alphanumeric()).collect();
    format!("{host}_{address}_{}", suffix.to_lowercase())
}

/// Until when the Lease lets `identity` act, on the wall clock: `None` if it is not the holder.
pub fn valid_until(lease: &Lease, identity: &str, renew_deadline: Duration) -> Option<SystemTime> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed: SystemTime = spec.renew_time.as_ref()?.0.into();
    renewed.checked_add(renew_deadline)
}

/// Whether leader work may act now. Every cloud call and every reconcile asks it first.
#[derive(Debug, Clone)]
pub struct Fence {
    until: Option<watch::Receiver<Option<Instant>>>,
}

impl Fence {
    /// No election (`--leader-elect=false`): always open.
    pub fn open() -> Fence {
        Fence { until: None }
    }

    pub(crate) fn elected(until: watch::Receiver<Option<Instant>>) -> Fence {
        Fence { until: Some(until) }
    }

    /// True while the lease is ours and renewed within the renew deadline.
    pub fn is_valid(&self) -> bool {
        match &self.until {
            None => true,
            Some(until) => until.borrow().is_some_and(|until| Instant::now() < until),
        }
    }
}

/// Converts a wall-clock deadline into a monotonic one, as of now.
fn to_instant(until: SystemTime) -> Option<Instant> {
    let left = until.duration_since(SystemTime::now()).ok()?;
    Some(Instant::now() + left)
}

/// Why the process stops leading.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("leader election Lease {0}: {1}")]
    Lease(String, #[source] LeaseManagerError),
    #[error(
        "lost the leader election Lease (not renewed within the renew deadline, or taken by another replica); every leader task was stopped"
    )]
    Lost,
    #[error("leader work ended: {0}")]
    Work(#[source] anyhow::Error),
}

/// Waits to be elected, runs `work` while leading, and stops it when leadership ends.
///
/// `work` gets the fence and a future that resolves on a clean shutdown. When the lease is lost
/// the work is dropped at once (every task it spawned into its `JoinSet` is aborted) and
/// `Err(Lost)` returned: the caller exits non-zero and the Deployment restarts it as a standby,
/// as kube-controller-manager does. On `shutdown` the work is asked to stop, and the lease is
/// released so that a standby takes over at once.
pub async fn run_elected<W, Fut>(
    client: kube::Client,
    config: ElectionConfig,
    leader_gauge: Gauge,
    shutdown: impl Future<Output = ()> + Send + 'static,
    work: W,
) -> Result<(), LeaderError>
where
    W: FnOnce(Fence, tokio::sync::oneshot::Receiver<()>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let lease_ref = format!("{}/{}", config.namespace, config.lease_name);
    let manager = LeaseManagerBuilder::new(client.clone(), config.lease_name.clone())
        .with_namespace(config.namespace.clone())
        .with_identity(config.identity.clone())
        .with_duration(config.lease_duration.as_secs())
        .with_grace(config.grace_secs())
        .build()
        .await
        .map_err(|e| LeaderError::Lease(lease_ref.clone(), e))?;
    let (mut elected, manager_task) = manager.watch().await;

    let (until_tx, mut until_rx) = watch::channel::<Option<Instant>>(None);
    let observer = tokio::spawn(observe(
        Api::namespaced(client, &config.namespace),
        config.lease_name.clone(),
        config.identity.clone(),
        config.renew_deadline,
        until_tx,
    ));
    let fence = Fence::elected(until_rx.clone());
    let mut shutdown = Box::pin(shutdown);
    info!(lease = %lease_ref, identity = %config.identity, "waiting to be elected leader");

    // Standby until the manager says we hold the lease and the apiserver shows it renewed.
    loop {
        if *elected.borrow_and_update() && fence.is_valid() {
            break;
        }
        tokio::select! {
            _ = &mut shutdown => {
                info!("shutting down as a standby");
                observer.abort();
                release(elected, manager_task).await;
                return Ok(());
            }
            changed = elected.changed() => {
                if changed.is_err() {
                    observer.abort();
                    return Err(manager_gone(&lease_ref, manager_task).await);
                }
            }
            changed = until_rx.changed() => {
                if changed.is_err() {
                    return Err(LeaderError::Lost);
                }
            }
        }
    }

    info!(lease = %lease_ref, identity = %config.identity, "elected leader");
    leader_gauge.set(1);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let mut work = Box::pin(work(fence.clone(), stop_rx));
    let outcome = tokio::select! {
        result = &mut work => result.map_err(LeaderError::Work),
        () = lost(&fence, &mut elected, &mut until_rx) => {
            // Dropping the work aborts every leader task before anything else happens.
            drop(work);
            leader_gauge.set(0);
            error!(lease = %lease_ref, "leadership lost; stopping every leader task and exiting");
            observer.abort();
            manager_task.abort();
            return Err(LeaderError::Lost);
        }
        _ = &mut shutdown => {
            let _ = stop_tx.send(());
            // Still fenced: the work stops if the lease runs out while it winds down.
            tokio::select! {
                result = &mut work => result.map_err(LeaderError::Work),
                () = lost(&fence, &mut elected, &mut until_rx) => Ok(()),
            }
        }
    };
    drop(work);
    leader_gauge.set(0);
    observer.abort();
    release(elected, manager_task).await;
    outcome
}

/// Resolves when leadership ends: the manager says we lost it, or the fence runs out.
async fn lost(
    fence: &Fence,
    elected: &mut watch::Receiver<bool>,
    until: &mut watch::Receiver<Option<Instant>>,
) {
    loop {
        if !*elected.borrow_and_update() || !fence.is_valid() {
            return;
        }
        let deadline = (*until.borrow_and_update()).unwrap_or_else(Instant::now);
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {}
            changed = elected.changed() => if changed.is_err() { return; },
            changed = until.changed() => if changed.is_err() { return; },
        }
    }
}

/// Releases the lease (closing the channel makes the manager release it and stop).
async fn release(
    elected: watch::Receiver<bool>,
    manager_task: tokio::task::JoinHandle<
        kube_lease_manager::Result<kube_lease_manager::LeaseManager>,
    >,
) {
    drop(elected);
    match tokio::time::timeout(Duration::from_secs(5), manager_task).await {
        Ok(Ok(Ok(_))) => info!("leader election Lease released"),
        Ok(Ok(Err(error))) => warn!(%error, "releasing the leader election Lease failed"),
        Ok(Err(error)) => warn!(%error, "the leader election task failed"),
        Err(_) => warn!("releasing the leader election Lease timed out"),
    }
}

async fn manager_gone(
    lease_ref: &str,
    manager_task: tokio::task::JoinHandle<
        kube_lease_manager::Result<kube_lease_manager::LeaseManager>,
    >,
) -> LeaderError {
    match manager_task.await {
        Ok(Err(error)) => LeaderError::Lease(lease_ref.to_owned(), error),
        _ => LeaderError::Lost,
    }
}

/// Watches the election Lease and publishes until when we may act.
async fn observe(
    api: Api<Lease>,
    name: String,
    identity: String,
    renew_deadline: Duration,
    until: watch::Sender<Option<Instant>>,
) {
    let mut stream = Box::pin(watcher::watch_object(api, &name).default_backoff());
    while let Some(event) = stream.next().await {
        match event {
            Ok(lease) => {
                let next = lease
                    .as_ref()
                    .and_then(|lease| valid_until(lease, &identity, renew_deadline))
                    .and_then(to_instant);
                until.send_replace(next);
            }
            // The watcher retries by itself; the fence runs out meanwhile if it must.
            Err(error) => warn!(%error, "watching the leader election Lease failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn config(duration: u64, deadline: u64, retry: u64) -> ElectionConfig {
        ElectionConfig {
            lease_name: "l".into(),
            namespace: "default".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(duration),
            renew_deadline: Duration::from_secs(deadline),
            retry_period: Duration::from_secs(retry),
        }
    }

    fn lease(holder: Option<&str>, renewed: Option<&str>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                renew_time: renewed.map(|t| MicroTime(t.parse().unwrap())),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn settings_need_retry_before_deadline_before_duration() {
        assert_eq!(config(15, 10, 2).validate(), Ok(()));
        assert_eq!(
            config(15, 15, 2).validate(),
            Err(ElectionConfigError::DurationNotAfterDeadline)
        );
        assert_eq!(
            config(15, 2, 2).validate(),
            Err(ElectionConfigError::DeadlineNotAfterRetry)
        );
        assert_eq!(
            config(15, 10, 0).validate(),
            Err(ElectionConfigError::RetryTooShort)
        );
        // Renewing every retry period: renew when duration − retry is left.
        assert_eq!(config(15, 10, 2).grace_secs(), 13);
    }

    #[test]
    fn only_our_renewed_lease_lets_us_act_until_renew_plus_deadline() {
        let deadline = Duration::from_secs(10);
        let ours = lease(Some("me"), Some("2026-01-01T00:00:00Z"));
        let until = valid_until(&ours, "me", deadline).unwrap();
        let renewed: SystemTime = "2026-01-01T00:00:00Z"
            .parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap()
            .into();
        assert_eq!(until.duration_since(renewed).unwrap(), deadline);
        assert!(valid_until(&ours, "other", deadline).is_none());
        assert!(valid_until(&lease(None, Some("2026-01-01T00:00:00Z")), "me", deadline).is_none());
        assert!(valid_until(&lease(Some("me"), None), "me", deadline).is_none());
    }

    #[test]
    fn a_deadline_in_the_past_closes_the_fence() {
        let past = SystemTime::now() - Duration::from_secs(1);
        assert!(to_instant(past).is_none());
        let (tx, rx) = watch::channel(to_instant(SystemTime::now() + Duration::from_secs(60)));
        let fence = Fence::elected(rx);
        assert!(fence.is_valid());
        tx.send_replace(to_instant(past));
        assert!(!fence.is_valid());
        assert!(Fence::open().is_valid());
    }

    #[test]
    fn identities_differ_per_process() {
        let a = identity("host", "10.0.0.1");
        let b = identity("host", "10.0.0.1");
        assert!(a.starts_with("host_10.0.0.1_"));
        assert_ne!(a, b);
    }
}
