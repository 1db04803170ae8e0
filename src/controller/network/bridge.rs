//! One burst pod's bridge to the cluster: one SSH connection (dialled from the cluster, so
//! nothing inbound is opened anywhere on the cloud's side).
//!
//! Outbound, a remote forward per (Service address, port) bound to the pod's loopback, and the
//! pod's `/etc/hosts` block naming them: each connection the pod makes comes back as a
//! `forwarded-tcpip` channel, accepted only for a route this bridge asked for and carried to a
//! ready endpoint of that Service.
//!
//! Inbound, a listener on the controller per container port that a Service selecting the pod
//! targets: each connection to it goes to the pod's loopback on that port (`direct-tcpip`), and
//! the EndpointSlices this project keeps point there.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use runpod_contract::network::{
    Forward, Plan, ServiceKey, bound_to_localhost, hosts_command, listening, on_localhost,
};
use tokio::sync::Semaphore;

use super::guard::{Candidate, Guard};
use crate::controller::kubelet_api::exec::ssh::{self, Forwarded, Session, SshError};
use crate::controller::shell::Reach;

/// Connections one pod may have open through its bridge at once; more are closed at once.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// How long dialling a Service's endpoint may take before the pod's connection is closed.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long something that failed in the pod (a forward, the hosts file) waits before it is
/// tried again.
const RETRY_FAILED: Duration = Duration::from_secs(60);

fn forward_key(forward: &Forward) -> String {
    format!("forward {}:{}", forward.address, forward.port)
}

/// The ready endpoints of a Service's port (the cluster's current view): its local
/// endpoints, and the burst pods behind it.
pub(crate) trait Endpoints: Send + Sync + 'static {
    fn candidates(&self, service: &ServiceKey, port: u16) -> [Vec<Candidate>; 2];
}

type Routes = Arc<RwLock<HashMap<(Ipv4Addr, u16), ServiceKey>>>;

/// Carries each forwarded connection to an endpoint of its Service.
struct Dialer {
    pod: String,
    routes: Routes,
    endpoints: Arc<dyn Endpoints>,
    guard: Arc<Guard>,
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
        let groups = route
            .as_ref()
            .map(|(service, port)| self.endpoints.candidates(service, *port));
        let permit = self.permits.clone().try_acquire_owned();
        let pod = self.pod.clone();
        let address = address.to_owned();
        let guard = self.guard.clone();
        tokio::spawn(async move {
            // A ready endpoint the pod's NetworkPolicies allow it to reach.
            let endpoint = match groups {
                Some(groups) => guard.choose(groups).await.map(|c| c.dial),
                None => None,
            };
            let (Some((service, _)), Some(endpoint), Ok(_permit)) = (route, endpoint, permit)
            else {
                tracing::debug!(%pod, %address, port, "a connection the bridge cannot carry (no route, no ready endpoint its NetworkPolicies allow, or too many); closed");
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
pub(crate) struct Bridge {
    session: Arc<tokio::sync::RwLock<Session>>,
    routes: Routes,
    forwarded: BTreeSet<Forward>,
    hosts: Option<Vec<String>>,
    /// What failed, and when: tried again only after `RETRY_FAILED` (a read-only hosts file or
    /// a refused forward is not retried, and warned about, every round).
    failed: HashMap<String, Instant>,
    /// Inbound listeners by the pod's port: the controller's port, and its accept loop.
    inbound: HashMap<u16, (u16, tokio::task::AbortHandle)>,
    permits: Arc<Semaphore>,
    /// The NetworkPolicies selecting the pod, applied to each connection either way.
    guard: Arc<Guard>,
    /// The pod's sshd binds every remote forward to `127.0.0.1` (`GatewayPorts no`): plans are
    /// carried out on localhost (`on_localhost`).
    localhost: bool,
}

/// What one `apply` did.
pub(crate) struct Applied {
    /// What failed (tried again on the next round).
    pub problems: Vec<String>,
    /// The pod's sshd ignored the asked addresses: reconnect with `localhost`.
    pub sshd_binds_localhost: bool,
}

impl Drop for Bridge {
    /// Stops its listeners and ends its connection, so that nothing of it outlives it (the
    /// connections it still carries, its remote forwards in the pod).
    fn drop(&mut self) {
        for (_, (_, listener)) in self.inbound.drain() {
            listener.abort();
        }
        let session = self.session.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { session.read().await.disconnect().await });
        }
    }
}

impl Bridge {
    /// Connects to the pod's sshd (its recorded host key only) for the pod `uid`.
    pub(crate) async fn open(
        reach: &Reach,
        uid: &str,
        endpoints: Arc<dyn Endpoints>,
        guard: Arc<Guard>,
        localhost: bool,
    ) -> Result<Bridge, SshError> {
        let routes: Routes = Arc::default();
        let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let dialer = Arc::new(Dialer {
            pod: uid.to_owned(),
            routes: routes.clone(),
            endpoints,
            guard: guard.clone(),
            permits: permits.clone(),
        });
        let session =
            ssh::connect_forwarding(&reach.target, uid, &reach.key, &reach.expected, dialer)
                .await?;
        Ok(Bridge {
            session: Arc::new(tokio::sync::RwLock::new(session)),
            routes,
            forwarded: BTreeSet::new(),
            hosts: None,
            failed: HashMap::new(),
            inbound: HashMap::new(),
            permits,
            guard,
            localhost,
        })
    }

    /// The NetworkPolicies now selecting the pod (judged each round) and its named ports.
    pub(crate) fn set_policy(
        &self,
        verdict: super::policy::Verdict,
        own_ports: Vec<(String, u16)>,
    ) {
        self.guard.set(verdict, own_ports);
    }

    /// Whether the connection dropped (a new one is opened on the next round).
    pub(crate) async fn is_closed(&self) -> bool {
        self.session.read().await.is_closed()
    }

    /// Whether this bridge carries its plans out on `127.0.0.1`.
    pub(crate) fn on_localhost(&self) -> bool {
        self.localhost
    }

    /// The controller's port that reaches the pod's `port`, while it is listened on.
    pub(crate) fn inbound_port(&self, port: u16) -> Option<u16> {
        self.inbound.get(&port).map(|(own, _)| *own)
    }

    /// Listens (on the controller's address `bind`, the one EndpointSlices name, at a port the
    /// system picks) for each of the pod's `ports` that a Service targets, and stops listening
    /// for the others.
    pub(crate) async fn expose(
        &mut self,
        ports: &BTreeSet<u16>,
        bind: std::net::IpAddr,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        self.inbound.retain(|port, (_, listener)| {
            let keep = ports.contains(port);
            if !keep {
                listener.abort();
            }
            keep
        });
        for &port in ports {
            if self.inbound.contains_key(&port) {
                continue;
            }
            match tokio::net::TcpListener::bind((bind, 0)).await {
                Ok(listener) => {
                    let own = listener.local_addr().map(|a| a.port()).unwrap_or_default();
                    let task = tokio::spawn(carry_inbound(
                        listener,
                        port,
                        self.session.clone(),
                        self.permits.clone(),
                        self.guard.clone(),
                    ));
                    self.inbound.insert(port, (own, task.abort_handle()));
                }
                Err(error) => {
                    problems.push(format!("listening for the pod's port {port}: {error}"))
                }
            }
        }
        problems
    }

    /// Brings the pod to `plan`: forwards added and removed, routes with them, the hosts block
    /// rewritten when it changed. Returns what failed (tried again on the next round).
    pub(crate) async fn apply(&mut self, plan: &Plan) -> Applied {
        let localhost_plan;
        let plan = if self.localhost {
            localhost_plan = on_localhost(plan);
            &localhost_plan
        } else {
            plan
        };
        let mut problems = Vec::new();
        let mut added = false;
        let wanted: BTreeSet<Forward> = plan.forwards.iter().cloned().collect();
        let gone: Vec<Forward> = self.forwarded.difference(&wanted).cloned().collect();
        for forward in gone {
            self.route(&forward, false);
            if let Err(error) = self
                .session
                .read()
                .await
                .cancel_remote_forward(&forward.address.to_string(), forward.port)
                .await
            {
                problems.push(error.to_string());
            }
            self.forwarded.remove(&forward);
        }
        self.failed.retain(|_, at| at.elapsed() < RETRY_FAILED);
        let new: Vec<Forward> = wanted
            .difference(&self.forwarded)
            .filter(|f| !self.failed.contains_key(&forward_key(f)))
            .cloned()
            .collect();
        for forward in new {
            self.route(&forward, true);
            match self
                .session
                .write()
                .await
                .remote_forward(&forward.address.to_string(), forward.port)
                .await
            {
                Ok(()) => {
                    self.forwarded.insert(forward);
                    added = true;
                }
                Err(error) => {
                    self.route(&forward, false);
                    self.failed.insert(forward_key(&forward), Instant::now());
                    problems.push(error.to_string());
                }
            }
        }
        let hosts_key = format!("hosts {:?}", plan.hosts);
        if self.hosts.as_ref() != Some(&plan.hosts) && !self.failed.contains_key(&hosts_key) {
            let written = self
                .session
                .read()
                .await
                .run(&hosts_command(&plan.hosts))
                .await;
            let problem = match written {
                Ok(0) => None,
                Ok(code) => Some(format!(
                    "writing the pod's /etc/hosts exited with {code} (is the container's root filesystem writable?)"
                )),
                Err(error) => Some(format!("writing the pod's /etc/hosts: {error}")),
            };
            match problem {
                None => self.hosts = Some(plan.hosts.clone()),
                Some(problem) => {
                    self.failed.insert(hosts_key, Instant::now());
                    problems.push(problem);
                }
            }
        }
        let sshd_binds_localhost = added && !self.localhost && self.binds_localhost().await;
        Applied {
            problems,
            sshd_binds_localhost,
        }
    }

    /// Whether the pod's sshd bound the new forwards to `127.0.0.1` instead of the asked
    /// addresses (read from the pod's `/proc/net/tcp`; unknown counts as no).
    async fn binds_localhost(&self) -> bool {
        // Only what the sshd granted: a forward it refused proves nothing about where it binds.
        let granted = Plan {
            forwards: self.forwarded.iter().cloned().collect(),
            ..Plan::default()
        };
        let table = self.session.read().await.output("cat /proc/net/tcp").await;
        match table {
            Ok((0, text)) => {
                bound_to_localhost(&granted, &listening(&String::from_utf8_lossy(&text)))
            }
            _ => false,
        }
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

/// Carries each connection to `listener` that the pod's NetworkPolicies allow from its source
/// to the pod's `port` over the bridge's connection.
async fn carry_inbound(
    listener: tokio::net::TcpListener,
    port: u16,
    session: Arc<tokio::sync::RwLock<Session>>,
    permits: Arc<Semaphore>,
    guard: Arc<Guard>,
) {
    while let Ok((mut client, source)) = listener.accept().await {
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            continue;
        };
        let session = session.clone();
        let guard = guard.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if !guard.allows_from(source.ip(), port).await {
                tracing::debug!(port, %source, "a connection to the pod its NetworkPolicies do not allow; closed");
                return;
            }
            let opened = session.read().await.forward(port).await;
            match opened {
                Ok(mut stream) => {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut stream).await;
                }
                Err(error) => {
                    tracing::debug!(port, %error, "an inbound connection could not reach the pod")
                }
            }
        });
    }
}
