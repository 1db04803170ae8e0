//! `runpod-kubelet`: one binary for the admission webhook, the virtual kubelet (RunPod and
//! Vast.ai) and the certificate job; with the `simulator` feature (tests, the demo), the cloud
//! simulators too.

// A binary has no outside users: its items are `pub(crate)` at most.
#![warn(unreachable_pub)]

mod cli;
mod cmd;
mod logging;
mod shutdown;
mod supervise;

#[cfg(test)]
mod reference;

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
            cli::Command::Webhook(args) => cmd::webhook::run(args).await,
            cli::Command::Certs(args) => cmd::certs::run(&args).await,
            cli::Command::WebhookConfiguration(args) => cmd::registration::run(&args),
            #[cfg(feature = "simulator")]
            cli::Command::Simulator(args) => cmd::simulator::run(args).await,
            cli::Command::Gpus(args) => cmd::gpus::run(args).await,
            cli::Command::Controller(args) => cmd::controller::run(*args).await,
            cli::Command::Adopt(args) => cmd::adopt::run(args).await,
        }
    })
}
