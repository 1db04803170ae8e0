//! The RunPod simulator and the controller as separate processes, as users run them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

pub const API_KEY: &str = "e2e-key-0123456789";

/// `runpod-kubelet simulator` on a free port.
pub struct SimulatorProcess {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl SimulatorProcess {
    pub fn start(scenario: &serde_json::Value) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("scenario.json");
        std::fs::write(&path, serde_json::to_vec(scenario)?)?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
            .args(["simulator", "--listen", "127.0.0.1:0", "--scenario"])
            .arg(&path)
            .env("RUNPOD_API_KEY", API_KEY)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the simulator")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let url = line
            .trim()
            .rsplit(' ')
            .next()
            .filter(|u| u.starts_with("http://"))
            .with_context(|| format!("unexpected simulator output {line:?}"))?
            .to_owned();
        Ok(Self {
            child,
            url,
            _dir: dir,
        })
    }

    /// Every RunPod pod ever created, with its termination time.
    pub async fn ledger(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let body = reqwest::get(format!("{}/_sim/ledger", self.url))
            .await?
            .error_for_status()?
            .json::<Vec<serde_json::Value>>()
            .await?;
        Ok(body)
    }
}

impl Drop for SimulatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `runpod-kubelet controller` against the simulator.
pub struct ControllerProcess {
    child: Child,
    pub kubelet_port: u16,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl ControllerProcess {
    pub fn start(
        kubeconfig: &Path,
        client_ca: &Path,
        simulator: &SimulatorProcess,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_at(kubeconfig, client_ca, simulator, "127.0.0.1", extra)
    }

    /// A controller advertising `internal_ip` (any 127.0.0.x reaches it: it listens on all
    /// addresses), so that two replicas are told apart by the node's address.
    pub fn start_at(
        kubeconfig: &Path,
        client_ca: &Path,
        simulator: &SimulatorProcess,
        internal_ip: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_via(kubeconfig, client_ca, &simulator.url, internal_ip, extra)
    }

    /// As `start_at`, reaching RunPod at `runpod_url` (e.g. a counting proxy).
    pub fn start_via(
        kubeconfig: &Path,
        client_ca: &Path,
        runpod_url: &str,
        internal_ip: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("controller.log");
        let kubelet_port = super::webhook::free_port()?.port();
        let child = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
            .arg("controller")
            .args(["--runpod-api-url", runpod_url])
            .args(["--kubelet-port", &kubelet_port.to_string()])
            .arg("--kubelet-client-ca")
            .arg(client_ca)
            .args(["--internal-ip", internal_ip])
            .args(["--reconcile-interval", "1s", "--create-settle", "3s"])
            .args([
                "--datacenter-ids",
                "EU-RO-1,US-TX-3",
                "--max-gpu-price",
                "2",
            ])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUNPOD_API_KEY", API_KEY)
            .env("RUNPOD_KUBELET_LOG_LEVEL", "info,runpod_kubelet=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting the controller")?;
        Ok(Self {
            child,
            kubelet_port,
            log,
            _dir: dir,
        })
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL: the process dies without releasing anything.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM: a clean shutdown.
    pub fn terminate(&self) -> anyhow::Result<()> {
        self.signal("TERM")
    }

    /// Sends a signal by name (`STOP` freezes the process, `CONT` resumes it).
    pub fn signal(&self, name: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()?;
        anyhow::ensure!(status.success(), "kill -{name} failed");
        Ok(())
    }

    /// The exit status once the process has ended.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

/// Runs `runpod-kubelet <args>` to completion against the simulator; its status and stderr.
pub fn run_command(
    kubeconfig: &Path,
    simulator: &SimulatorProcess,
    args: &[&str],
) -> anyhow::Result<(std::process::ExitStatus, String)> {
    let output = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .args(args)
        .args(["--runpod-api-url", &simulator.url])
        .env("KUBECONFIG", kubeconfig)
        .env("RUNPOD_API_KEY", API_KEY)
        .output()
        .context("running runpod-kubelet")?;
    Ok((
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
