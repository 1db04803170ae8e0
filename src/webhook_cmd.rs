//! `runpod-kubelet webhook`: wires flags, the cluster caches, certificate reload and the server.

use std::sync::Arc;

use anyhow::Context as _;
use runpod_certs::{ReloadingCertResolver, server_config};
use runpod_webhook::cluster::KubeCluster;
use runpod_webhook::policy::PolicyConfig;
use runpod_webhook::serve::{ServeOptions, serve_tls};
use runpod_webhook::server::AppState;
use tokio::net::TcpListener;

use crate::cli::WebhookArgs;
use crate::supervise::Supervisor;

pub async fn run(args: WebhookArgs) -> anyhow::Result<()> {
    let policy = policy_config(&args, std::env::var("POD_NAMESPACE").ok())?;
    let resolver = Arc::new(
        ReloadingCertResolver::load(&args.tls_cert, &args.tls_key)
            .context("loading the serving certificate")?,
    );
    let tls = Arc::new(server_config(resolver.clone())?);
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (KUBECONFIG or in-cluster config)")?;
    let mut supervisor = Supervisor::default();
    let (cluster, cache_tasks) = KubeCluster::start(client);
    for (name, task) in cache_tasks {
        supervisor.adopt(name, task);
    }
    let state = Arc::new(AppState::new(cluster, policy, resolver.clone()));
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(
        listen = %listener.local_addr()?,
        datacenters = ?state.policy.allowed_datacenters,
        max_gpu_price = args.max_gpu_price,
        nodename = %args.nodename,
        "webhook serving"
    );

    // Certificates keep being reloaded through the drain, until the server is done.
    let watch = resolver.watch(args.tls_reload_interval, std::future::pending());
    supervisor.spawn("certificate reload", async move {
        if let Err(error) = watch.await {
            tracing::error!(%error, "certificate reload stopped");
        }
    });
    let mut failure = None;
    let stop = async {
        tokio::select! {
            () = crate::shutdown::signal() => tracing::info!("shutdown signal received"),
            error = supervisor.failed() => {
                tracing::error!(%error, "shutting down: a background task stopped");
                failure = Some(error);
            }
        }
    };
    serve_tls(listener, tls, state, serve_options(&args), stop).await;
    match failure {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

fn serve_options(args: &WebhookArgs) -> ServeOptions {
    ServeOptions {
        shutdown_drain: args.shutdown_drain,
        idle_timeout: args.idle_timeout,
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        max_concurrent_streams: args.max_concurrent_streams,
        ..ServeOptions::default()
    }
}

fn policy_config(
    args: &WebhookArgs,
    own_namespace: Option<String>,
) -> anyhow::Result<PolicyConfig> {
    let mut config = PolicyConfig::from_flags(
        &args.exclude_namespaces,
        &args.datacenter_ids,
        args.max_gpu_price,
        own_namespace,
    );
    config.vastai = args
        .vastai_policy
        .policy(args.max_gpu_price)
        .map_err(anyhow::Error::msg)?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn flag_defaults_are_the_server_defaults() {
        let cli = Cli::try_parse_from([
            "runpod-kubelet",
            "webhook",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
        ])
        .unwrap();
        let Command::Webhook(args) = cli.command else {
            panic!("parsed another subcommand");
        };
        assert_eq!(serve_options(&args), ServeOptions::default());
    }
}
