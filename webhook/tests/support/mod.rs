//! In-process webhook over real TLS, with a fake cluster, for the server tests.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use runpod_certs::{CertificateAuthority, ReloadingCertResolver, client_config, server_config};
use runpod_webhook::cluster::{ClusterView, MemoryCluster};
use runpod_webhook::policy::PolicyConfig;
use runpod_webhook::serve::{ServeOptions, serve_tls};
use runpod_webhook::server::AppState;
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

/// A webhook under test; `C` is its cluster view.
pub struct TestServer<C = MemoryCluster> {
    pub addr: SocketAddr,
    pub ca_pem: String,
    pub ca: CertificateAuthority,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub resolver: Arc<ReloadingCertResolver>,
    pub cluster: Arc<C>,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
}

impl<C> TestServer<C> {
    /// What SIGTERM does to the webhook binary.
    pub fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Waits until `serve_tls` has returned; false if it is still running after `bound`.
    pub async fn finished_within(&mut self, bound: Duration) -> bool {
        let Some(served) = self.served.as_mut() else {
            return true;
        };
        let done = tokio::time::timeout(bound, served).await.is_ok();
        if done {
            self.served = None;
        }
        done
    }
}

pub fn write_serving_cert(ca: &CertificateAuthority, cert_path: &PathBuf, key_path: &PathBuf) {
    write_serving_cert_valid_for(ca, cert_path, key_path, Duration::from_secs(3600));
}

pub fn write_serving_cert_valid_for(
    ca: &CertificateAuthority,
    cert_path: &PathBuf,
    key_path: &PathBuf,
    valid_for: Duration,
) {
    let issued = ca
        .issue_serving(&["localhost"], &["127.0.0.1".parse().unwrap()], valid_for)
        .unwrap();
    std::fs::write(cert_path, issued.cert_pem).unwrap();
    std::fs::write(key_path, issued.key_pem).unwrap();
}

pub async fn start(
    cluster: MemoryCluster,
    policy: PolicyConfig,
    reload_every: Duration,
) -> TestServer {
    start_with(cluster, policy, reload_every, ServeOptions::default()).await
}

pub async fn start_with<C: ClusterView>(
    cluster: C,
    policy: PolicyConfig,
    reload_every: Duration,
    options: ServeOptions,
) -> TestServer<C> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::generate("test-ca", Duration::from_secs(3600)).unwrap();
    let cert_path = dir.path().join("tls.crt");
    let key_path = dir.path().join("tls.key");
    write_serving_cert(&ca, &cert_path, &key_path);
    let resolver = Arc::new(ReloadingCertResolver::load(&cert_path, &key_path).unwrap());
    let tls = Arc::new(server_config(resolver.clone()).unwrap());
    let cluster = Arc::new(cluster);
    let state = Arc::new(AppState::new(cluster.clone(), policy, resolver.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let (watch_stop, watch_stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(resolver.clone().watch(reload_every, async move {
        let _ = watch_stopped.await;
    }));
    let served = tokio::spawn(async move {
        serve_tls(listener, tls, state, options, shutdown).await;
        let _ = watch_stop.send(());
    });
    TestServer {
        addr,
        ca_pem: ca.certificate().cert_pem.clone(),
        ca,
        cert_path,
        key_path,
        resolver,
        cluster,
        _dir: dir,
        stop: Some(stop),
        served: Some(served),
    }
}

/// Result of one request: status, body, the negotiated ALPN protocol, and the served leaf.
pub struct Reply {
    pub status: http::StatusCode,
    pub body: Bytes,
    pub alpn: Option<Vec<u8>>,
    pub leaf: Vec<u8>,
    pub content_type: Option<String>,
}

pub async fn tls_connect(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let config = client_config(ca_pem, alpn).map_err(std::io::Error::other)?;
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

pub async fn request(
    addr: SocketAddr,
    ca_pem: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
    h2: bool,
) -> Reply {
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let tls = tls_connect(addr, ca_pem, alpn)
        .await
        .expect("TLS handshake");
    let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let io = hyper_util::rt::TokioIo::new(tls);
    let req = http::Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    };
    let status = response.status();
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        body,
        alpn: negotiated,
        leaf,
        content_type,
    }
}

pub fn review(object: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": object,
            "dryRun": false
        }
    })
}

pub fn gpu_pod() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "ml"},
        "spec": {"containers": [{
            "name": "main", "image": "pytorch/pytorch",
            "ports": [{"containerPort": 8888}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}
        }]}
    })
}

pub fn opted_in_cluster() -> MemoryCluster {
    let mut cluster = MemoryCluster::default();
    cluster.namespaces.insert(
        "ml".into(),
        [("runpod.io/burst".to_owned(), "enabled".to_owned())].into(),
    );
    cluster.synced.store(true, Ordering::Release);
    cluster
}

pub fn policy() -> PolicyConfig {
    PolicyConfig {
        allowed_datacenters: vec!["EU-RO-1".into()],
        allowed_cloud_types: Vec::new(),
        max_gpu_price: Some(0.5),
        excluded_namespaces: ["kube-system".to_owned()].into(),
        vastai: Default::default(),
        disabled_clouds: Default::default(),
        expose_no_ports: false,
        accept_seed_tolerations: false,
        default_budget: None,
        namespace_nodes: Vec::new(),
        node_clouds: Default::default(),
    }
}
