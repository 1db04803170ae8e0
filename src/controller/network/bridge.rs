//! One burst pod's bridge to the cluster's Services: one SSH connection (dialled from the
//! cluster, so nothing inbound is opened anywhere), a remote forward per (Service address,
//! port) bound to the pod's loopback, and the pod's `/etc/hosts` block naming them. Each
//! connection the pod makes comes back as a `forwarded-tcpip` channel, which is accepted only
//! for a route this bridge asked for and carried to a ready endpoint of that Service.

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use runpod_contract::network::{Forward, Plan, ServiceKey, hosts_command};
use tokio::sync::Semaphore;

use crate::controller::kubelet_api::exec::ssh::{self, Forwarded, Session, SshError};
use crate::controller::shell::Reach;

/// Connections one pod may have open through its bridge at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = 256;

/// How long dialling a Service's endpoint may take before the pod's connection is closed.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Picks a ready endpoint of a Service's port (the cluster's current view).
pub trait Endpoints: Send + Sync + 'static {
    fn pick(&self, service: &ServiceKey, port: u16) -> Option<SocketAddr>;
}

type Routes = Arc<RwLock<HashMap<(Ipv4Addr, u16), ServiceKey>>>;

/// Carries each forwarded connection to an endpoint of its Service.
struct Dialer {
    pod: String,
    routes: Routes,
    endpoints: Arc<dyn Endpoints>,
    permits: Arc<Semaphore>,
}

impl Forwarded for Dialer {
    fn accept(&self, channel: russh::Channel<russh::client::Msg>, address: &str, port: u32) {
        let route = address
            .parse::<Ipv4Addr>()
            .ok()
            .zip(u16::try_from(port).ok())
            .and_then(|key| {
                self.routes
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&key)
                    .cloned()
                    .map(|service| (service, key.1))
            });
        let endpoint = route
            .as_ref()
            .and_then(|(service, port)| self.endpoints.pick(service, *port));
        let permit = self.permits.clone().try_acquire_owned();
        let pod = self.pod.clone();
        let address = address.to_owned();
        tokio::spawn(async move {
            let (Some((service, _)), Some(endpoint), Ok(_permit)) = (route, endpoint, permit)
            else {
                tracing::debug!(%pod, %address, port, "a connection the bridge cannot carry (no route, no ready endpoint, or too many); closed");
                let _ = channel.close().await;
                return;
            };
            match tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(endpoint)).await
            {
                Ok(Ok(mut upstream)) => {
                    let mut stream = channel.into_stream();
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
                }
                Ok(Err(error)) => {
                    tracing::debug!(%pod, service = %format!("{}/{}", service.namespace, service.name), %endpoint, %error, "dialling the Service's endpoint failed");
                    let _ = channel.close().await;
                }
                Err(_) => {
                    tracing::debug!(%pod, %endpoint, "dialling the Service's endpoint timed out");
                    let _ = channel.close().await;
                }
            }
        });
    }
}

/// A pod's live bridge.
pub struct Bridge {
    session: Session,
    routes: Routes,
    forwarded: BTreeSet<Forward>,
    hosts: Option<Vec<String>>,
}

impl Bridge {
    /// Connects to the pod's sshd (its recorded host key only) for the pod `uid`.
    pub async fn open(
        reach: &Reach,
        uid: &str,
        endpoints: Arc<dyn Endpoints>,
    ) -> Result<Bridge, SshError> {
        let routes: Routes = Arc::default();
        let dialer = Arc::new(Dialer {
            pod: uid.to_owned(),
            routes: routes.clone(),
            endpoints,
            permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        });
        let session =
            ssh::connect_forwarding(&reach.target, uid, &reach.key, &reach.expected, dialer)
                .await?;
        Ok(Bridge {
            session,
            routes,
            forwarded: BTreeSet::new(),
            hosts: None,
        })
    }

    /// Whether the connection dropped (a new one is opened on the next round).
    pub fn is_closed(&self) -> bool {
        self.session.is_closed()
    }

    /// Brings the pod to `plan`: forwards added and removed, routes with them, the hosts block
    /// rewritten when it changed. Returns what failed (tried again on the next round).
    pub async fn apply(&mut self, plan: &Plan) -> Vec<String> {
        let mut problems = Vec::new();
        let wanted: BTreeSet<Forward> = plan.forwards.iter().cloned().collect();
        let gone: Vec<Forward> = self.forwarded.difference(&wanted).cloned().collect();
        for forward in gone {
            self.route(&forward, false);
            if let Err(error) = self
                .session
                .cancel_remote_forward(&forward.address.to_string(), forward.port)
                .await
            {
                problems.push(error.to_string());
            }
            self.forwarded.remove(&forward);
        }
        let new: Vec<Forward> = wanted.difference(&self.forwarded).cloned().collect();
        for forward in new {
            self.route(&forward, true);
            match self
                .session
                .remote_forward(&forward.address.to_string(), forward.port)
                .await
            {
                Ok(()) => {
                    self.forwarded.insert(forward);
                }
                Err(error) => {
                    self.route(&forward, false);
                    problems.push(error.to_string());
                }
            }
        }
        if self.hosts.as_ref() != Some(&plan.hosts) {
            match self.session.run(&hosts_command(&plan.hosts)).await {
                Ok(0) => self.hosts = Some(plan.hosts.clone()),
                Ok(code) => problems.push(format!(
                    "writing the pod's /etc/hosts exited with {code} (is the container's root filesystem writable?)"
                )),
                Err(error) => problems.push(format!("writing the pod's /etc/hosts: {error}")),
            }
        }
        problems
    }

    fn route(&self, forward: &Forward, on: bool) {
        let mut routes = self.routes.write().unwrap_or_else(|e| e.into_inner());
        let key = (forward.address, forward.port);
        if on {
            routes.insert(key, forward.service.clone());
        } else {
            routes.remove(&key);
        }
    }
}
