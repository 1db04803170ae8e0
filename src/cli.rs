//! Command line: every flag also reads `RUNPOD_KUBELET_<FLAG>` from the environment.

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "runpod-kubelet",
    version,
    about = "Burst Kubernetes GPU pods to RunPod and Vast.ai",
    // A repeated flag takes its last value (lists: the last list), so the chart's `extraArgs`,
    // which come last, override what the chart sets instead of failing the start.
    args_override_self = true
)]
pub(crate) struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "RUNPOD_KUBELET_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Log filter, e.g. `info` or `runpod_webhook=debug,info`.
    #[arg(
        long,
        global = true,
        default_value = "info",
        env = "RUNPOD_KUBELET_LOG_LEVEL"
    )]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the mutating admission webhook (HTTPS).
    Webhook(crate::cmd::webhook::WebhookArgs),
    /// Write a new CA and a serving certificate signed by it (PEM files).
    Certs(crate::cmd::certs::CertsArgs),
    /// Print the MutatingWebhookConfiguration (JSON) that routes opted-in pods to the webhook.
    WebhookConfiguration(crate::cmd::registration::RegistrationArgs),
    /// Serve a cloud simulator over plain HTTP (e2e tests and the demo): RunPod REST v2, or
    /// Vast.ai with `--cloud vastai`. The API key, if any, comes from `RUNPOD_API_KEY` or
    /// `VAST_API_KEY` only.
    #[cfg(feature = "simulator")]
    Simulator(crate::cmd::simulator::SimulatorArgs),
    /// Print the GPU catalogue (the names pods may use, each cloud's own names) with each
    /// cloud's lowest price now, read with `RUNPOD_API_KEY` and/or `VAST_API_KEY`; given
    /// requirements (`--gpu-count`, `--gpu-types`...), the RunPod placement candidates instead.
    Gpus(crate::cmd::gpus::GpusArgs),
    /// Run the virtual kubelet: register the virtual node and run the pods bound to it on
    /// RunPod or Vast.ai (`--provider`). The API key comes from `RUNPOD_API_KEY` or
    /// `VAST_API_KEY` only.
    Controller(Box<crate::cmd::controller::args::ControllerArgs>),
    /// Moving from the Go kubelet: list the account's RunPod pods without our tags and the
    /// Kubernetes pod each belongs to; without `--dry-run`, take over the linked ones (no
    /// restart). Needs `RUNPOD_API_KEY` and a kubeconfig.
    Adopt(crate::cmd::adopt::AdoptArgs),
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn flags_fall_back_to_environment_and_defaults() {
        let cli = Cli::try_parse_from([
            "runpod-kubelet",
            "webhook",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--datacenter-ids",
            "EU-RO-1,US-TX-3",
        ])
        .unwrap();
        let Command::Webhook(args) = cli.command else {
            panic!("parsed another subcommand");
        };
        assert_eq!(args.listen.port(), 8443);
        assert_eq!(args.datacenter_ids, vec!["EU-RO-1", "US-TX-3"]);
        assert_eq!(args.max_gpu_price, 0.5);
        assert!(args.exclude_namespaces.is_empty());
        assert_eq!(args.tls_reload_interval, Duration::from_secs(10));
    }

    /// The chart puts `extraArgs` after the flags it sets: the last one wins, for a subcommand's
    /// flags, a nested subcommand's and a list's (replaced, not appended).
    #[test]
    fn a_repeated_flag_takes_the_last_value() {
        let cli = Cli::try_parse_from([
            "runpod-kubelet",
            "webhook",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--max-gpu-price",
            "0.5",
            "--datacenter-ids",
            "EU-RO-1,US-TX-3",
            "--max-gpu-price",
            "1.0",
            "--datacenter-ids",
            "US-GA-1",
        ])
        .unwrap();
        let Command::Webhook(args) = cli.command else {
            panic!("parsed another subcommand");
        };
        assert_eq!(args.max_gpu_price, 1.0);
        assert_eq!(args.datacenter_ids, vec!["US-GA-1"]);

        let cli = Cli::try_parse_from([
            "runpod-kubelet",
            "controller",
            "--nodename",
            "a",
            "--max-pods",
            "10",
            "--nodename",
            "b",
            "--max-pods",
            "20",
        ])
        .unwrap();
        let Command::Controller(args) = cli.command else {
            panic!("parsed another subcommand");
        };
        assert_eq!(args.nodename, "b");
        assert_eq!(args.max_pods, 20);
    }
}
