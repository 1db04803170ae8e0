//! The webhook binary as a separate process, with its own CA and serving certificate, and its
//! registration with the apiserver.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::api::{Patch, PatchParams};
use runpod_certs::CertificateAuthority;
use runpod_webhook::registration::{Endpoint, Registration, mutating_webhook_configuration};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::wait;

pub const REGISTRATION_NAME: &str = "burst.runpod.io";

pub struct WebhookProcess {
    child: Child,
    pub addr: SocketAddr,
    pub ca_pem: String,
    _dir: tempfile::TempDir,
}

impl WebhookProcess {
    /// Starts `runpod-kubelet webhook` against the cluster of `kubeconfig` and waits until ready.
    pub async fn start(kubeconfig: &Path, extra_args: &[&str]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca =
            CertificateAuthority::generate("runpod-kubelet-e2e-ca", Duration::from_secs(86400))?;
        let serving = ca.issue_serving(
            &["localhost"],
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            Duration::from_secs(86400),
        )?;
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, &serving.cert_pem)?;
        std::fs::write(&key, &serving.key_pem)?;
        Self::start_with_files(kubeconfig, dir, &ca.certificate().cert_pem, extra_args).await
    }

    /// Starts the webhook serving `dir/tls.crt` and `dir/tls.key` (re-read when they change),
    /// trusting `ca_pem` for its own readiness probe.
    pub async fn start_with_files(
        kubeconfig: &Path,
        dir: tempfile::TempDir,
        ca_pem: &str,
        extra_args: &[&str],
    ) -> anyhow::Result<Self> {
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let addr = free_port()?;
        let log = std::fs::File::create(dir.path().join("webhook.log"))?;
        let child = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
            .arg("webhook")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .args(extra_args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUNPOD_KUBELET_LOG_LEVEL", "debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting the webhook")?;
        let process = Self {
            child,
            addr,
            ca_pem: ca_pem.to_owned(),
            _dir: dir,
        };
        wait::until("webhook readiness", Duration::from_secs(30), || {
            process.ready()
        })
        .await?;
        Ok(process)
    }

    async fn ready(&self) -> anyhow::Result<Option<()>> {
        let reply = https_get(self.addr, &self.ca_pem, "/readyz").await?;
        Ok(reply.starts_with("HTTP/1.1 200").then_some(()))
    }

    /// The directory holding the served `tls.crt` and `tls.key`.
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("webhook.log")).unwrap_or_default()
    }

    /// Stops the process (SIGKILL: the point is to have it gone).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Registers this webhook with the apiserver (both entries).
    pub async fn register(
        &self,
        client: &kube::Client,
        excluded_namespaces: &[&str],
    ) -> anyhow::Result<()> {
        let configuration = mutating_webhook_configuration(&Registration {
            name: REGISTRATION_NAME.into(),
            endpoint: Endpoint::Url(format!("https://{}/mutate", self.addr)),
            ca_bundle_pem: Some(self.ca_pem.clone().into_bytes()),
            failure_policy: "Fail".into(),
            excluded_namespaces: excluded_namespaces
                .iter()
                .map(|ns| (*ns).to_owned())
                .collect(),
            timeout_seconds: 10,
            match_conditions: false,
        });
        let mut body = serde_json::to_value(&configuration)?;
        body["apiVersion"] = "admissionregistration.k8s.io/v1".into();
        body["kind"] = "MutatingWebhookConfiguration".into();
        let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        api.patch(
            REGISTRATION_NAME,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&body),
        )
        .await?;
        Ok(())
    }
}

impl Drop for WebhookProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port for a process the test starts later. Drawn below the kernel's ephemeral range, so no
/// outgoing connection can take it between now and the bind, and from 24000 up, above the
/// control plane's draws (`cluster.sh`: 15000 to 24000), which bind theirs seconds later. A
/// port drawn once in this process is not drawn again. Where the ephemeral range leaves no room
/// below it, the kernel picks.
pub fn free_port() -> anyhow::Result<SocketAddr> {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static DRAWN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (24000u16, ephemeral_low);
    if high <= low + 100 {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        return Ok(listener.local_addr()?);
    }
    let mut drawn = DRAWN.lock().unwrap_or_else(|e| e.into_inner());
    let drawn = drawn.get_or_insert_with(HashSet::new);
    for _ in 0..500 {
        let port = fastrand::u16(low..high);
        if drawn.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            drawn.insert(port);
            return Ok(listener.local_addr()?);
        }
    }
    anyhow::bail!("no free port below {high} after 500 draws")
}

/// A minimal HTTPS GET over HTTP/1.1, returning the raw response head and body.
pub async fn https_get(addr: SocketAddr, ca_pem: &str, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = runpod_certs::client_config(ca_pem, &[b"http/1.1"])?;
    let tcp = TcpStream::connect(addr).await?;
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut response = String::new();
    tls.read_to_string(&mut response).await?;
    Ok(response)
}
