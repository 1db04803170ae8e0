//! `runpod-kubelet simulator`: the RunPod REST v2 simulator (`tests/simulator`), or with
//! `--cloud vastai` the Vast.ai one (`tests/vastai-simulator`), as a process, for e2e tests
//! and the demo, which cannot reach either cloud. Plain HTTP on loopback by default; HTTPS with
//! `--tls-cert`/`--tls-key` (a cloud behind a corporate proxy, trusted through `--cloud-ca-file`).
//!
//! The API key comes from `RUNPOD_API_KEY` (`VAST_API_KEY` for Vast.ai) only (never a flag,
//! never logged): when set, only that key is accepted; when unset, any key is.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use runpod_simulator::Simulator;
use runpod_simulator::scenario::Scenario;
use tokio::net::TcpListener;
use vastai_simulator::VastSimulator;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

#[derive(Debug, Args)]
pub(crate) struct SimulatorArgs {
    /// Address to serve plain HTTP on; port 0 picks a free port (printed on start).
    #[arg(long, default_value = "127.0.0.1:8089", env = "RUNPOD_KUBELET_LISTEN")]
    pub listen: SocketAddr,
    /// JSON scenario (catalogue or offers, rate limits, timings, image rules, faults) in the
    /// chosen cloud's format; default: a realistic market.
    #[arg(long, env = "RUNPOD_KUBELET_SCENARIO")]
    pub scenario: Option<PathBuf>,
    /// Which cloud to simulate.
    #[arg(long, value_enum, default_value_t = SimulatedCloud::Runpod, env = "RUNPOD_KUBELET_SIMULATED_CLOUD")]
    pub cloud: SimulatedCloud,
    /// Serve HTTPS with this PEM certificate (and `--tls-key`) instead of plain HTTP.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// The clouds `simulator` can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SimulatedCloud {
    /// RunPod REST v2 (`/v2/...`); key from `RUNPOD_API_KEY`.
    Runpod,
    /// Vast.ai (`/api/v0/...`, `/api/v1/...`); key from `VAST_API_KEY`.
    Vastai,
}

pub(crate) async fn run(args: SimulatorArgs) -> anyhow::Result<()> {
    let (name, key_env) = match args.cloud {
        SimulatedCloud::Runpod => ("runpod", "RUNPOD_API_KEY"),
        SimulatedCloud::Vastai => ("vastai", "VAST_API_KEY"),
    };
    let loading = |path: &Path| format!("loading the simulator scenario {}", path.display());
    // Loaded before binding: a bad scenario fails without a port line.
    let scenario = match (args.cloud, &args.scenario) {
        (SimulatedCloud::Runpod, Some(path)) => {
            Scenarios::Runpod(Scenario::from_file(path).with_context(|| loading(path))?)
        }
        (SimulatedCloud::Runpod, None) => Scenarios::Runpod(Scenario::default()),
        (SimulatedCloud::Vastai, Some(path)) => Scenarios::Vastai(
            vastai_simulator::Scenario::from_file(path)
                .map_err(anyhow::Error::msg)
                .with_context(|| loading(path))?,
        ),
        (SimulatedCloud::Vastai, None) => Scenarios::Vastai(vastai_simulator::Scenario::default()),
    };
    let api_key = std::env::var(key_env).ok().filter(|key| !key.is_empty());
    let mut listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let scheme = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            // TLS ends here and the plain simulator serves behind it, on loopback.
            let plain = TcpListener::bind("127.0.0.1:0").await?;
            let backend = plain.local_addr()?;
            tokio::spawn(terminate_tls(listener, backend, tls_acceptor(cert, key)?));
            listener = plain;
            "https"
        }
        _ => "http",
    };
    // Tests parse this line for the real port (with --listen 127.0.0.1:0).
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{name} simulator listening on {scheme}://{addr}")?;
    stdout.flush()?;
    tracing::info!(
        listen = %addr,
        scenario = ?args.scenario,
        api_key_required = api_key.is_some(),
        "{name} simulator serving"
    );
    let shutdown = crate::shutdown::signal();
    match scenario {
        Scenarios::Runpod(scenario) => {
            Simulator::serve(listener, scenario, api_key, shutdown).await
        }
        Scenarios::Vastai(scenario) => {
            VastSimulator::serve(listener, scenario, api_key, shutdown).await
        }
    }
    .with_context(|| format!("serving the {name} simulator"))?;
    tracing::info!("{name} simulator stopped");
    Ok(())
}

/// The scenario of the chosen cloud.
enum Scenarios {
    Runpod(Scenario),
    Vastai(vastai_simulator::Scenario),
}

fn tls_acceptor(cert: &Path, key: &Path) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let resolver = std::sync::Arc::new(
        runpod_certs::ReloadingCertResolver::load(cert, key)
            .context("loading the simulator's certificate")?,
    );
    let mut config = runpod_certs::server_config(resolver)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
}

/// Accepts TLS on `public` and pipes each connection's plaintext to `backend`.
async fn terminate_tls(
    public: TcpListener,
    backend: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
) {
    loop {
        let Ok((stream, peer)) = public.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let mut tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(error) => {
                    tracing::info!(%peer, %error, "TLS handshake failed");
                    return;
                }
            };
            if let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await {
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            }
        });
    }
}
