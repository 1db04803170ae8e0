//! The `main` of a harness = false e2e file: filter by name, start a control plane, run the
//! scenarios on a runtime, report like libtest.

use std::future::Future;
use std::pin::Pin;

use super::control_plane::{ControlPlane, ExtraFlags};

/// The scenarios of one file, given the control plane they share.
pub type Scenarios =
    for<'a> fn(&'a ControlPlane) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + 'a>>;

/// Runs `scenarios` unless the command line filters them out by `name`.
pub fn main(name: &str, extra: &ExtraFlags, scenarios: Scenarios) -> std::process::ExitCode {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
        println!("no scenario of {name} matches {filters:?}");
        return std::process::ExitCode::SUCCESS;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("no runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let control_plane = match ControlPlane::start_with(extra) {
        Ok(cp) => cp,
        Err(error) => {
            eprintln!("e2e setup failed: {error:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let started = std::time::Instant::now();
    match runtime.block_on(scenarios(&control_plane)) {
        Ok(()) => {
            println!("{name} ... ok ({:?})", started.elapsed());
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            println!("{name} ... FAILED\n  {error:#}");
            eprintln!(
                "--- kube-apiserver log tail ---\n{}",
                control_plane.log_tail("kube-apiserver", 20)
            );
            std::process::ExitCode::FAILURE
        }
    }
}
