//! `cargo bench --bench webhook_mutate`: load on `POST /mutate` of the real webhook binary over
//! TLS with HTTP/1.1 keep-alive, against the same load on a minimal rustls + hyper server that
//! answers a fixed body, both as separate processes on this machine.
//!
//! It prints figures and whether the targets are met; it never fails on timing, only when
//! something does not work (a server that does not start, failed requests).
//!
//! Environment:
//! - `WEBHOOK_BENCH_SECONDS`: measured seconds per run (default 5), after
//! - `WEBHOOK_BENCH_WARMUP_SECONDS`: unmeasured warm-up seconds per run (default 1);
//! - `WEBHOOK_BENCH_CONNECTIONS`: concurrent connections, comma-separated (default `1,16,64`);
//! - `WEBHOOK_BENCH_CLIENT_THREADS`: load generator threads (default 1: on 2 cores, one thread
//!   drives 64 connections and leaves the other core to the server).
//!
//! The bench re-executes itself with `WEBHOOK_BENCH_ROLE=fixed-server` to run the reference
//! server, so that both servers are measured the same way: another process behind a socket.

use std::convert::Infallible;
use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use base64::Engine as _;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use runpod_certs::{CertificateAuthority, ReloadingCertResolver, client_config, server_config};
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio_rustls::TlsConnector;

const ROLE_ENV: &str = "WEBHOOK_BENCH_ROLE";
const FIXED_SERVER_ROLE: &str = "fixed-server";
const CERT_ENV: &str = "WEBHOOK_BENCH_CERT";
const KEY_ENV: &str = "WEBHOOK_BENCH_KEY";

/// What the reference server answers to everything: about the size of a small review response.
const FIXED_BODY: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","allowed":true}}"#;

// What both this bench and `benches/wrk.sh` measure: one opted-in namespace, one Job with RunPod
// annotations, and a review of one of its pods.
const NAMESPACE: &str = "bench";
const JOB: &str = "trainer";
const NAMESPACE_AND_JOB: &str = include_str!("fixtures/namespace-and-job.json");
const REVIEW_TEMPLATE: &str = include_str!("fixtures/review.json");
const JOB_UID_PLACEHOLDER: &str = "JOB_UID";

// Targets from the issue.
const TARGET_P99_AT_1: Duration = Duration::from_micros(600);
const TARGET_RATIO_AT_64: f64 = 0.5;
const TARGET_RSS_BYTES: u64 = 30 * 1024 * 1024;

fn main() -> ExitCode {
    // `cargo bench` passes `--bench` (and maybe a filter): arguments are ignored on purpose.
    let outcome = if std::env::var(ROLE_ENV).as_deref() == Ok(FIXED_SERVER_ROLE) {
        fixed_server::run()
    } else {
        run_bench()
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("webhook_mutate: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

struct Settings {
    warmup: Duration,
    measured: Duration,
    connections: Vec<usize>,
    client_threads: usize,
}

impl Settings {
    fn from_env() -> anyhow::Result<Self> {
        fn number<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
            match std::env::var(name) {
                Ok(text) => text
                    .trim()
                    .parse()
                    .map_err(|_| anyhow!("{name}={text:?} is not a number")),
                Err(_) => Ok(default),
            }
        }
        let connections = match std::env::var("WEBHOOK_BENCH_CONNECTIONS") {
            Ok(text) => text
                .split(',')
                .map(|n| n.trim().parse::<usize>().ok().filter(|n| *n > 0))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| anyhow!("WEBHOOK_BENCH_CONNECTIONS={text:?} is not a list"))?,
            Err(_) => vec![1, 16, 64],
        };
        let settings = Self {
            warmup: Duration::from_secs_f64(number("WEBHOOK_BENCH_WARMUP_SECONDS", 1.0)?),
            measured: Duration::from_secs_f64(number("WEBHOOK_BENCH_SECONDS", 5.0)?),
            connections,
            client_threads: number("WEBHOOK_BENCH_CLIENT_THREADS", 1)?,
        };
        ensure!(
            settings.measured > Duration::ZERO,
            "WEBHOOK_BENCH_SECONDS must be positive"
        );
        Ok(settings)
    }
}

fn run_bench() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let settings = Settings::from_env()?;
    let runtime = if settings.client_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(settings.client_threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(async {
        // On Ctrl-C the bench future is dropped, so the guards stop the control plane and the
        // servers (the control plane runs in its own session and would outlive us otherwise).
        tokio::select! {
            result = bench(&settings) => result,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        }
    })
}

async fn bench(settings: &Settings) -> anyhow::Result<()> {
    let work = tempfile::Builder::new()
        .prefix("webhook-bench-")
        .tempdir()?;
    let ca = CertificateAuthority::generate("webhook-bench-ca", Duration::from_secs(3600))?;
    let serving = ca.issue_serving(
        &["localhost"],
        &["127.0.0.1".parse()?],
        Duration::from_secs(3600),
    )?;
    let cert_path = work.path().join("tls.crt");
    let key_path = work.path().join("tls.key");
    std::fs::write(&cert_path, &serving.cert_pem)?;
    std::fs::write(&key_path, &serving.key_pem)?;
    let connector = TlsConnector::from(Arc::new(client_config(
        &ca.certificate().cert_pem,
        &[b"http/1.1"],
    )?));

    let started = Instant::now();
    let control_plane = ControlPlane::new()?;
    let kubeconfig = control_plane.start().await?;
    eprintln!(
        "control plane up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let job_uid = create_namespace_and_job(&kubeconfig).await?;
    let review = Bytes::from(representative_review(&job_uid)?);

    let webhook = Server::start_webhook(work.path(), &kubeconfig, &cert_path, &key_path).await?;
    let webhook_target = Target::new(webhook.addr, &connector, "/mutate", review.clone());
    webhook.wait_ready(&connector).await?;
    let (expected_webhook, patch_ops) = check_webhook_answer(&webhook_target).await?;
    let webhook_target = Target {
        expected: expected_webhook.clone(),
        ..webhook_target
    };

    let fixed = Server::start_fixed(&cert_path, &key_path).await?;
    let fixed_target = Target {
        expected: Bytes::from_static(FIXED_BODY),
        ..Target::new(fixed.addr, &connector, "/mutate", review.clone())
    };

    println!();
    println!(
        "webhook_mutate: POST /mutate, TLS (rustls) + HTTP/1.1 keep-alive, closed loop; \
         {} s warm-up + {} s measured per run; load generator: {} thread(s); {} CPU(s)",
        settings.warmup.as_secs_f64(),
        settings.measured.as_secs_f64(),
        settings.client_threads.max(1),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "review: {} bytes (GPU pod of Job {NAMESPACE}/{JOB}); webhook answer: {} bytes, allowed, \
         JSON Patch of {patch_ops} operations; fixed answer: {} bytes",
        review.len(),
        expected_webhook.len(),
        FIXED_BODY.len(),
    );
    println!();
    print_header();
    let mut results = Vec::new();
    for &connections in &settings.connections {
        for (name, server, target) in [
            ("webhook", &webhook, &webhook_target),
            ("fixed", &fixed, &fixed_target),
        ] {
            let result = run_load(target, connections, server.pid, settings).await?;
            print_row(name, connections, &result);
            results.push((name, connections, result));
        }
    }
    let webhook_memory = Memory::of(webhook.pid)?;
    let fixed_memory = Memory::of(fixed.pid)?;
    webhook.ensure_running()?;
    fixed.ensure_running()?;

    print_summary(&results, &webhook_memory, &fixed_memory);
    let errors: u64 = results.iter().map(|(_, _, r)| r.errors).sum();
    if errors > 0 {
        let examples: Vec<String> = results
            .iter()
            .filter_map(|(name, n, r)| r.first_error.as_ref().map(|e| format!("{name}@{n}: {e}")))
            .collect();
        bail!("{errors} request(s) failed; first: {}", examples.join("; "));
    }
    Ok(())
}

// ------------------------------------------------------------------ control plane

/// A control plane from tests/control-plane/cluster.sh, stopped on drop (also on error, panic
/// and Ctrl-C), before its directory is deleted.
struct ControlPlane {
    script: PathBuf,
    dir: tempfile::TempDir,
}

impl ControlPlane {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            script: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/control-plane/cluster.sh"),
            dir: tempfile::Builder::new()
                .prefix("webhook-bench-cluster-")
                .tempdir()?,
        })
    }

    /// Starts it; returns the admin kubeconfig path.
    async fn start(&self) -> anyhow::Result<PathBuf> {
        eprintln!("starting the control plane (about 10 s)...");
        let output = Command::new("bash")
            .arg(&self.script)
            .arg("start")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .context("running cluster.sh start")?;
        if !output.status.success() {
            bail!(
                "cluster.sh start failed ({}):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let kubeconfig = stdout
            .lines()
            .last()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .ok_or_else(|| anyhow!("cluster.sh start printed no kubeconfig path"))?;
        Ok(PathBuf::from(kubeconfig))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let stopped = std::process::Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !stopped.is_ok_and(|status| status.success()) {
            eprintln!(
                "webhook_mutate: could not stop the control plane in {}",
                self.dir.path().display()
            );
        }
    }
}

/// Creates the opted-in namespace and the Job the reviewed pod belongs to (the Job carries
/// RunPod annotations, so the webhook's Job lookup matters for the answer); returns the Job's uid.
async fn create_namespace_and_job(kubeconfig: &Path) -> anyhow::Result<String> {
    kubectl(
        kubeconfig,
        &["apply", "-f", "-"],
        Some(NAMESPACE_AND_JOB.to_owned()),
    )
    .await?;
    let uid = kubectl(
        kubeconfig,
        &[
            "get",
            "job",
            JOB,
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        None,
    )
    .await?;
    let uid = uid.trim().to_owned();
    ensure!(!uid.is_empty(), "Job {NAMESPACE}/{JOB} has no uid");
    Ok(uid)
}

async fn kubectl(
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<String>,
) -> anyhow::Result<String> {
    use tokio::io::AsyncWriteExt as _;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("running kubectl")?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).await?;
    }
    let output = child.wait_with_output().await?;
    if !output.status.success() {
        bail!(
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

// ------------------------------------------------------------------ the review

/// A pod of Job `trainer` as the apiserver sends it to a mutating webhook (defaults applied,
/// service-account token volume mounted, name not yet generated); `benches/wrk.sh` sends the
/// same review. Compact, as the apiserver sends it.
fn representative_review(job_uid: &str) -> anyhow::Result<Vec<u8>> {
    let review: Value =
        serde_json::from_str(&REVIEW_TEMPLATE.replace(JOB_UID_PLACEHOLDER, job_uid))?;
    Ok(serde_json::to_vec(&review)?)
}

/// Sends the review once and checks it is allowed with a patch; returns the answer (every later
/// answer must be identical) and the number of patch operations.
async fn check_webhook_answer(target: &Target) -> anyhow::Result<(Bytes, usize)> {
    let mut sender = connect(target).await?;
    let (status, body) = exchange(target, &mut sender).await?;
    ensure!(
        status == http::StatusCode::OK,
        "POST /mutate answered {status}: {}",
        String::from_utf8_lossy(&body)
    );
    let review: Value = serde_json::from_slice(&body)?;
    let response = &review["response"];
    ensure!(
        response["allowed"] == true && response["patchType"] == "JSONPatch",
        "the review was not allowed with a patch: {response}"
    );
    // Kubernetes sends `[]byte` as base64; it also decodes an array of numbers (what kube-rs
    // writes), so accept both.
    let patch: Vec<u8> = match &response["patch"] {
        Value::String(text) => base64::engine::general_purpose::STANDARD.decode(text)?,
        Value::Array(_) => serde_json::from_value(response["patch"].clone())?,
        _ => bail!("no patch in {response}"),
    };
    let patch: Vec<Value> = serde_json::from_slice(&patch)?;
    ensure!(!patch.is_empty(), "the patch is empty: {response}");
    Ok((body, patch.len()))
}

// ------------------------------------------------------------------ servers

/// A server process, killed on drop.
struct Server {
    addr: SocketAddr,
    pid: u32,
    /// Held only for `kill_on_drop`.
    _child: Child,
    log: Option<PathBuf>,
}

impl Server {
    async fn start_webhook(
        work: &Path,
        kubeconfig: &Path,
        cert: &Path,
        key: &Path,
    ) -> anyhow::Result<Self> {
        // The binary takes a fixed address: take a free port from the kernel and hand it over.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let log = work.join("webhook.log");
        let log_file = std::fs::File::create(&log)?;
        let child = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
            .arg("webhook")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .args(["--datacenter-ids", "EU-RO-1,US-TX-3"])
            .args(["--max-gpu-price", "0.5"])
            .args(["--log-level", "warn"])
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .context("starting the runpod-kubelet binary")?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("the webhook exited at once"))?;
        Ok(Self {
            addr,
            pid,
            _child: child,
            log: Some(log),
        })
    }

    /// Re-runs this bench executable as the fixed-body server; it prints its address.
    async fn start_fixed(cert: &Path, key: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(ROLE_ENV, FIXED_SERVER_ROLE)
            .env(CERT_ENV, cert)
            .env(KEY_ENV, key)
            // Its stdin is its lifeline: it exits when we close it (or die).
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting the fixed-body server")?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("the fixed-body server exited at once"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no stdout pipe"))?;
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .context("the fixed-body server did not start within 10 s")??
            .ok_or_else(|| anyhow!("the fixed-body server exited before listening"))?;
        let addr = line
            .strip_prefix("listening ")
            .and_then(|addr| addr.trim().parse().ok())
            .ok_or_else(|| anyhow!("unexpected line from the fixed-body server: {line:?}"))?;
        Ok(Self {
            addr,
            pid,
            _child: child,
            log: None,
        })
    }

    /// Polls `/readyz` until 200 (caches synced), failing if the process exits.
    async fn wait_ready(&self, connector: &TlsConnector) -> anyhow::Result<()> {
        let target = Target::new(self.addr, connector, "/readyz", Bytes::new());
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::from("no answer");
        while Instant::now() < deadline {
            self.ensure_running()?;
            match readyz(&target).await {
                Ok(status) if status == http::StatusCode::OK => return Ok(()),
                Ok(status) => last = format!("/readyz answered {status}"),
                Err(error) => last = format!("{error:#}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "the webhook was not ready within 60 s ({last}){}",
            self.log_tail()
        )
    }

    fn ensure_running(&self) -> anyhow::Result<()> {
        // `try_wait` needs `&mut`; /proc tells the same without reaping.
        let state = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        let running = state
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'));
        ensure!(
            running,
            "server process {} has exited{}",
            self.pid,
            self.log_tail()
        );
        Ok(())
    }

    fn log_tail(&self) -> String {
        let Some(text) = self
            .log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
        else {
            return String::new();
        };
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("; log tail:\n{tail}")
    }
}

async fn readyz(target: &Target) -> anyhow::Result<http::StatusCode> {
    let mut sender = connect(target).await?;
    let request = http::Request::get(target.path)
        .header(http::header::HOST, "localhost")
        .body(Full::new(Bytes::new()))?;
    let response = sender.send_request(request).await?;
    Ok(response.status())
}

/// The reference server: rustls with the project's server config and the same certificate,
/// hyper's auto (HTTP/1.1 + h2) connection builder like the webhook, a fixed answer.
mod fixed_server {
    use std::io::Read as _;

    use super::*;

    pub fn run() -> anyhow::Result<()> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cert = std::env::var(CERT_ENV).context(CERT_ENV)?;
        let key = std::env::var(KEY_ENV).context(KEY_ENV)?;
        let resolver = Arc::new(ReloadingCertResolver::load(cert, key)?);
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(resolver)?));
        // Exit when the parent closes our stdin, so no server outlives the bench.
        std::thread::spawn(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            std::process::exit(0);
        });
        // The same runtime as the webhook binary: multi-threaded, one worker per core.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            println!("listening {}", listener.local_addr()?);
            let builder = Arc::new(hyper_util::server::conn::auto::Builder::new(
                TokioExecutor::new(),
            ));
            loop {
                let (tcp, _) = listener.accept().await?;
                let _ = tcp.set_nodelay(true);
                let (acceptor, builder) = (acceptor.clone(), Arc::clone(&builder));
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(answer);
                    let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                });
            }
        })
    }

    async fn answer(
        request: http::Request<hyper::body::Incoming>,
    ) -> Result<http::Response<Full<Bytes>>, Infallible> {
        // Read the whole review, as any real handler must.
        let _ = request.into_body().collect().await;
        let mut response = http::Response::new(Full::new(Bytes::from_static(FIXED_BODY)));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Ok(response)
    }
}

// ------------------------------------------------------------------ load generator

/// Where and what to send.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    connector: TlsConnector,
    path: &'static str,
    body: Bytes,
    /// The answer every request must get (empty: not checked).
    expected: Bytes,
}

impl Target {
    fn new(addr: SocketAddr, connector: &TlsConnector, path: &'static str, body: Bytes) -> Self {
        Self {
            addr,
            connector: connector.clone(),
            path,
            body,
            expected: Bytes::new(),
        }
    }
}

/// One TLS connection speaking HTTP/1.1 (keep-alive is hyper's default).
async fn connect(target: &Target) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let tcp = TcpStream::connect(target.addr).await?;
    tcp.set_nodelay(true)?;
    let tls = target
        .connector
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// One request and its whole answer.
async fn exchange(
    target: &Target,
    sender: &mut SendRequest<Full<Bytes>>,
) -> anyhow::Result<(http::StatusCode, Bytes)> {
    sender.ready().await?;
    let request = http::Request::post(target.path)
        .header(http::header::HOST, "localhost")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(target.body.clone()))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

struct RunResult {
    /// Requests started in the measured window.
    measured: u64,
    /// Requests/s over the measured window.
    throughput: f64,
    /// Latencies in nanoseconds.
    latency: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
    /// CPU the server process used per request (warm-up included), and cores it kept busy.
    server_cpu_per_request: Option<Duration>,
    server_cores: Option<f64>,
    client_cores: Option<f64>,
}

struct ConnectionResult {
    all: u64,
    measured: u64,
    latency: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    // 1 µs .. 60 s at 3 significant digits.
    Ok(Histogram::new_with_bounds(1_000, 60_000_000_000, 3)?)
}

async fn run_load(
    target: &Target,
    connections: usize,
    server_pid: u32,
    settings: &Settings,
) -> anyhow::Result<RunResult> {
    // All connections are set up before the clock starts: handshakes are not what is measured.
    let senders = futures::future::try_join_all((0..connections).map(|_| connect(target))).await?;
    let target = Arc::new(target.clone());
    let start = Instant::now();
    let measure_from = start + settings.warmup;
    let end = measure_from + settings.measured;
    let (server_cpu_before, client_cpu_before) =
        (cpu_time(server_pid), cpu_time(std::process::id()));
    let mut tasks = Vec::with_capacity(connections);
    for sender in senders {
        let target = Arc::clone(&target);
        tasks.push(tokio::spawn(drive(target, sender, measure_from, end)));
    }
    let mut result = RunResult {
        measured: 0,
        throughput: 0.0,
        latency: histogram()?,
        errors: 0,
        first_error: None,
        server_cpu_per_request: None,
        server_cores: None,
        client_cores: None,
    };
    let mut all = 0;
    for task in tasks {
        let connection = task.await??;
        all += connection.all;
        result.measured += connection.measured;
        result.latency.add(&connection.latency)?;
        result.errors += connection.errors;
        result.first_error = result.first_error.or(connection.first_error);
    }
    let wall = start.elapsed();
    result.throughput = result.measured as f64 / settings.measured.as_secs_f64();
    if let (Some(before), Some(after)) = (server_cpu_before, cpu_time(server_pid)) {
        let used = after.saturating_sub(before);
        result.server_cores = Some(used.as_secs_f64() / wall.as_secs_f64());
        result.server_cpu_per_request =
            (all > 0).then(|| used / u32::try_from(all).unwrap_or(u32::MAX));
    }
    if let (Some(before), Some(after)) = (client_cpu_before, cpu_time(std::process::id())) {
        result.client_cores = Some(after.saturating_sub(before).as_secs_f64() / wall.as_secs_f64());
    }
    Ok(result)
}

/// One connection's closed loop: the next request leaves as soon as the answer is in.
async fn drive(
    target: Arc<Target>,
    mut sender: SendRequest<Full<Bytes>>,
    measure_from: Instant,
    end: Instant,
) -> anyhow::Result<ConnectionResult> {
    let mut result = ConnectionResult {
        all: 0,
        measured: 0,
        latency: histogram()?,
        errors: 0,
        first_error: None,
    };
    loop {
        let started = Instant::now();
        if started >= end {
            break;
        }
        let outcome = exchange(&target, &mut sender).await;
        let elapsed = started.elapsed();
        result.all += 1;
        let problem = match outcome {
            Ok((status, body)) if status != http::StatusCode::OK => {
                Some(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)))
            }
            Ok((_, body)) if !target.expected.is_empty() && body != target.expected => Some(
                format!("unexpected answer: {}", String::from_utf8_lossy(&body)),
            ),
            Ok(_) => None,
            Err(error) => {
                // The connection is likely gone: count it and carry on with a new one.
                let reconnected = connect(&target).await;
                let message = format!("{error:#}");
                match reconnected {
                    Ok(new_sender) => sender = new_sender,
                    Err(reconnect_error) => {
                        result.errors += 1;
                        result.first_error.get_or_insert(format!(
                            "{message}; reconnecting failed: {reconnect_error:#}"
                        ));
                        break;
                    }
                }
                Some(message)
            }
        };
        if let Some(problem) = problem {
            result.errors += 1;
            result.first_error.get_or_insert(problem);
        } else if started >= measure_from {
            result.measured += 1;
            let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
            result.latency.saturating_record(nanos);
        }
    }
    Ok(result)
}

// ------------------------------------------------------------------ process figures

/// CPU time of all threads of a process (scheduler statistics, nanoseconds).
fn cpu_time(pid: u32) -> Option<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let path = task.ok()?.path().join("schedstat");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        total += text
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(Duration::from_nanos(total))
}

/// Resident memory now and at its peak, from /proc/PID/status.
struct Memory {
    rss: u64,
    peak: u64,
}

impl Memory {
    fn of(pid: u32) -> anyhow::Result<Self> {
        let file = std::fs::File::open(format!("/proc/{pid}/status"))?;
        let (mut rss, mut peak) = (None, None);
        for line in BufReader::new(file).lines() {
            let line = line?;
            let kib = |rest: &str| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .map(|k| k * 1024)
            };
            if let Some(rest) = line.strip_prefix("VmRSS:") {
                rss = kib(rest);
            } else if let Some(rest) = line.strip_prefix("VmHWM:") {
                peak = kib(rest);
            }
        }
        Ok(Self {
            rss: rss.ok_or_else(|| anyhow!("no VmRSS for pid {pid}"))?,
            peak: peak.ok_or_else(|| anyhow!("no VmHWM for pid {pid}"))?,
        })
    }
}

// ------------------------------------------------------------------ report

fn micros(nanos: u64) -> String {
    format!("{:.0}", nanos as f64 / 1_000.0)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn print_header() {
    println!(
        "{:<8} {:>5} {:>9} {:>10} {:>8} {:>8} {:>8} {:>8} {:>6} {:>11} {:>9} {:>9}",
        "server",
        "conns",
        "requests",
        "req/s",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "max µs",
        "errors",
        "srv CPU/req",
        "srv cores",
        "gen cores"
    );
}

fn print_row(name: &str, connections: usize, result: &RunResult) {
    let latency = &result.latency;
    let cpu = result.server_cpu_per_request.map_or("n/a".to_owned(), |d| {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    });
    let cores = |c: Option<f64>| c.map_or("n/a".to_owned(), |c| format!("{c:.2}"));
    println!(
        "{:<8} {:>5} {:>9} {:>10.0} {:>8} {:>8} {:>8} {:>8} {:>6} {:>11} {:>9} {:>9}",
        name,
        connections,
        result.measured,
        result.throughput,
        micros(latency.value_at_quantile(0.50)),
        micros(latency.value_at_quantile(0.90)),
        micros(latency.value_at_quantile(0.99)),
        micros(latency.max()),
        result.errors,
        cpu,
        cores(result.server_cores),
        cores(result.client_cores),
    );
}

fn print_summary(results: &[(&str, usize, RunResult)], webhook: &Memory, fixed: &Memory) {
    let find = |name: &str, n: usize| {
        results
            .iter()
            .find(|(server, conns, _)| *server == name && *conns == n)
            .map(|(_, _, result)| result)
    };
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!();
    println!("throughput webhook / fixed:");
    let mut connections: Vec<usize> = results.iter().map(|(_, n, _)| *n).collect();
    connections.dedup();
    for &n in &connections {
        if let (Some(w), Some(f)) = (find("webhook", n), find("fixed", n)) {
            println!(
                "  {n:>3} conn: {:.0} / {:.0} req/s = {:.0}%   p99 {} / {} µs",
                w.throughput,
                f.throughput,
                100.0 * w.throughput / f.throughput.max(f64::MIN_POSITIVE),
                micros(w.latency.value_at_quantile(0.99)),
                micros(f.latency.value_at_quantile(0.99)),
            );
        }
    }
    println!(
        "memory: webhook RSS {} (peak {}); fixed server RSS {} (peak {})",
        mib(webhook.rss),
        mib(webhook.peak),
        mib(fixed.rss),
        mib(fixed.peak)
    );
    println!();
    println!("targets:");
    match find("webhook", 1) {
        Some(w) => {
            let p99 = w.latency.value_at_quantile(0.99);
            println!(
                "  p99 @ 1 conn: {} µs (target < {} µs): {}",
                micros(p99),
                TARGET_P99_AT_1.as_micros(),
                met(u128::from(p99) < TARGET_P99_AT_1.as_nanos())
            );
        }
        None => println!("  p99 @ 1 conn: not run"),
    }
    match (find("webhook", 64), find("fixed", 64)) {
        (Some(w), Some(f)) => {
            let ratio = w.throughput / f.throughput.max(f64::MIN_POSITIVE);
            println!(
                "  throughput @ 64 conns: {:.0}% of the fixed-body server (target >= {:.0}%): {}",
                100.0 * ratio,
                100.0 * TARGET_RATIO_AT_64,
                met(ratio >= TARGET_RATIO_AT_64)
            );
            println!(
                "  errors @ 64 conns: {} (target 0): {}",
                w.errors,
                met(w.errors == 0)
            );
        }
        _ => println!("  throughput @ 64 conns: not run"),
    }
    println!(
        "  webhook RSS: peak {} (target < {}): {}",
        mib(webhook.peak),
        mib(TARGET_RSS_BYTES),
        met(webhook.peak < TARGET_RSS_BYTES)
    );
}
