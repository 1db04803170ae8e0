//! `runpod-kubelet`: one binary for the admission webhook and (later) the RunPod provider.

mod certs_cmd;
mod cli;
mod controller_cmd;
mod gpus_cmd;
mod logging;
mod registration_cmd;
mod shutdown;
mod simulator_cmd;
mod supervise;
mod webhook_cmd;

use clap::Parser;

/// The webhook allocates a few short-lived JSON values per review; mimalloc keeps that cheap
/// across worker threads (about a fifth more reviews per second than glibc's malloc at 64
/// connections, `benches/wrk_compare.py`). Built without transparent huge pages (`no_thp`):
/// with them its arenas were backed by 2 MiB pages and the webhook's RSS rose by a third.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    logging::init(cli.log_format, &cli.log_level)?;
    // One crypto provider for every TLS user in the process (kube client, webhook server).
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        tracing::debug!("a rustls crypto provider was already installed");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            cli::Command::Webhook(args) => webhook_cmd::run(args).await,
            cli::Command::Certs(args) => certs_cmd::run(&args).await,
            cli::Command::WebhookConfiguration(args) => registration_cmd::run(&args),
            cli::Command::Simulator(args) => simulator_cmd::run(args).await,
            cli::Command::Gpus(args) => gpus_cmd::run(args).await,
            cli::Command::Controller(args) => controller_cmd::run(*args).await,
        }
    })
}
