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

/// The webhook allocates a few short-lived JSON trees per review; mimalloc keeps that cheap
/// across worker threads (measured with `cargo bench --bench webhook_mutate`).
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
