//! `runpod-kubelet simulator`: the RunPod REST v2 simulator (`tests/simulator`) as a process,
//! for e2e tests and the demo, which cannot reach RunPod. Plain HTTP on loopback by default.
//!
//! The API key comes from `RUNPOD_API_KEY` only (never a flag, never logged): when set, only
//! that bearer token is accepted; when unset, any bearer token is.

use std::io::Write as _;

use anyhow::Context as _;
use runpod_simulator::Simulator;
use runpod_simulator::scenario::Scenario;
use tokio::net::TcpListener;

use crate::cli::SimulatorArgs;

pub async fn run(args: SimulatorArgs) -> anyhow::Result<()> {
    let scenario = match &args.scenario {
        Some(path) => Scenario::from_file(path)
            .with_context(|| format!("loading the simulator scenario {}", path.display()))?,
        None => Scenario::default(),
    };
    let api_key = std::env::var("RUNPOD_API_KEY")
        .ok()
        .filter(|key| !key.is_empty());
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    // Tests parse this line for the real port (with --listen 127.0.0.1:0).
    let mut stdout = std::io::stdout();
    writeln!(stdout, "runpod simulator listening on http://{addr}")?;
    stdout.flush()?;
    tracing::info!(
        listen = %addr,
        scenario = ?args.scenario,
        api_key_required = api_key.is_some(),
        "runpod simulator serving"
    );
    Simulator::serve(listener, scenario, api_key, crate::shutdown::signal())
        .await
        .context("serving the runpod simulator")?;
    tracing::info!("runpod simulator stopped");
    Ok(())
}
