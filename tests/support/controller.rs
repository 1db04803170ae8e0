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
        Self::start_cloud("runpod", scenario)
    }

    /// The simulator of `cloud` (`runpod` or `vastai`), accepting [`API_KEY`].
    pub fn start_cloud(cloud: &str, scenario: &serde_json::Value) -> anyhow::Result<Self> {
        Self::start_with(cloud, scenario, &["--listen", "127.0.0.1:0"])
    }

    /// The simulator with more flags (`--listen`, `--tls-cert`/`--tls-key`: its url is then
    /// `https://`).
    pub fn start_with(
        cloud: &str,
        scenario: &serde_json::Value,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_keyed(cloud, scenario, extra, API_KEY)
    }

    /// The simulator of one account: it accepts `key` only, and its ledger is that account's.
    pub fn start_keyed(
        cloud: &str,
        scenario: &serde_json::Value,
        extra: &[&str],
        key: &str,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("scenario.json");
        std::fs::write(&path, serde_json::to_vec(scenario)?)?;
        // A benchmark may run a copied binary while the tree is rebuilt.
        let binary = std::env::var_os("RUNPOD_SIMULATOR_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_runpod-kubelet").into());
        let mut child = Command::new(binary)
            .args(["simulator", "--cloud", cloud, "--scenario"])
            .arg(&path)
            .args(extra)
            .env("RUNPOD_API_KEY", key)
            .env("VAST_API_KEY", key)
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
            .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
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

impl SimulatorProcess {
    /// Adds a fault rule (`runpod_simulator::Fault` as JSON).
    pub async fn inject(&self, fault: &serde_json::Value) -> anyhow::Result<()> {
        reqwest::Client::new()
            .post(format!("{}/_sim/faults", self.url))
            .json(fault)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// Every network volume ever created (RunPod simulator), with its bill.
    pub async fn volumes(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        Ok(reqwest::get(format!("{}/_sim/volumes", self.url))
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// POSTs `body` to a control path of the simulator (`/_sim/...`), which must answer 2xx.
    pub async fn post(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<()> {
        reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// Removes every fault rule.
    pub async fn clear_faults(&self) -> anyhow::Result<()> {
        reqwest::Client::new()
            .delete(format!("{}/_sim/faults", self.url))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// Creates a RunPod pod directly through the API, as someone else using the account would.
    pub async fn create_pod(&self, body: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let pod = reqwest::Client::new()
            .post(format!("{}/v2/pods", self.url))
            .bearer_auth(API_KEY)
            .json(body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(pod)
    }

    /// How many lists have been answered with 200 so far: tests wait for "N more lists" to
    /// know the controller has seen the simulator's current state.
    pub async fn successful_lists(&self) -> anyhow::Result<usize> {
        Ok(self
            .exchanges()
            .await?
            .iter()
            .filter(|e| e["operation"] == "listPods" && e["status"] == 200)
            .count())
    }

    /// Every recorded exchange (method, path, status, ...).
    pub async fn exchanges(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        Ok(reqwest::get(format!("{}/_sim/exchanges", self.url))
            .await?
            .error_for_status()?
            .json()
            .await?)
    }
}

impl Drop for SimulatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One sample of a controller's `/metrics` at `address` (host:port), by exact series name.
pub async fn metric(address: &str, series: &str) -> anyhow::Result<Option<f64>> {
    let text = reqwest::get(format!("http://{address}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok(text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    }))
}

/// `runpod-kubelet controller` against the simulator.
pub struct ControllerProcess {
    child: Child,
    pub kubelet_port: u16,
    args: Vec<std::ffi::OsString>,
    env: Vec<(String, String)>,
    kubeconfig: std::path::PathBuf,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// Defaults every e2e controller gets unless `extra` names the flag itself.
/// One replica without election unless a test asks for it (`--leader-elect true`): a restarted
/// process then leads at once instead of waiting for its predecessor's lease to run out.
const DEFAULTS: [(&str, &str); 5] = [
    ("--leader-elect", "false"),
    ("--reconcile-interval", "1s"),
    ("--create-settle", "3s"),
    ("--datacenter-ids", "EU-RO-1,US-TX-3"),
    ("--max-gpu-price", "2"),
];

impl ControllerProcess {
    pub fn start(
        kubeconfig: &Path,
        client_ca: &Path,
        simulator: &SimulatorProcess,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_via(kubeconfig, client_ca, &simulator.url, "127.0.0.1", extra)
    }

    /// A controller advertising `internal_ip` (any 127.0.0.x reaches it: it listens on all
    /// addresses) and reaching RunPod at `runpod_url` (the simulator or a counting proxy).
    pub fn start_via(
        kubeconfig: &Path,
        client_ca: &Path,
        runpod_url: &str,
        internal_ip: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_full(kubeconfig, client_ca, runpod_url, internal_ip, extra, &[])
    }

    /// A controller with more environment variables (e.g. `HTTPS_PROXY`).
    pub fn start_with_env(
        kubeconfig: &Path,
        client_ca: &Path,
        runpod_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::start_full(kubeconfig, client_ca, runpod_url, "127.0.0.1", extra, env)
    }

    fn start_full(
        kubeconfig: &Path,
        client_ca: &Path,
        runpod_url: &str,
        internal_ip: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("controller.log");
        let mut args: Vec<std::ffi::OsString> = vec![
            "controller".into(),
            "--runpod-api-url".into(),
            runpod_url.into(),
            "--kubelet-client-ca".into(),
            client_ca.into(),
            "--internal-ip".into(),
            internal_ip.into(),
        ];
        for (flag, value) in DEFAULTS {
            if !extra.contains(&flag) {
                args.push(flag.into());
                args.push(value.into());
            }
        }
        args.extend(extra.iter().map(Into::into));
        let (child, kubelet_port) = spawn(&args, &env, kubeconfig, &log)?;
        Ok(Self {
            child,
            kubelet_port,
            args,
            env,
            kubeconfig: kubeconfig.to_owned(),
            log,
            _dir: dir,
        })
    }

    /// The whole log of every run of this controller (restarts append).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL: no shutdown code runs, as when a node dies or the OOM killer strikes.
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

    /// Starts the controller again with the same flags (a new kubelet port).
    /// More flags for the next restart (they come last, so they win).
    pub fn push_args(&mut self, extra: &[&str]) {
        self.args.extend(extra.iter().map(Into::into));
    }

    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let (child, port) = spawn(&self.args, &self.env, &self.kubeconfig, &self.log)?;
        self.child = child;
        self.kubelet_port = port;
        Ok(())
    }
}

fn spawn(
    args: &[std::ffi::OsString],
    env: &[(String, String)],
    kubeconfig: &Path,
    log: &Path,
) -> anyhow::Result<(Child, u16)> {
    let kubelet_port = super::webhook::free_port()?.port();
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    // A long soak runs a copied binary while the tree is rebuilt.
    let binary = std::env::var_os("RUNPOD_KUBELET_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_runpod-kubelet").into());
    let child = Command::new(binary)
        .args(args)
        .args(["--kubelet-port", &kubelet_port.to_string()])
        .env("KUBECONFIG", kubeconfig)
        .env("RUNPOD_API_KEY", API_KEY)
        .env("VAST_API_KEY", API_KEY)
        .env("RUNPOD_KUBELET_LOG_LEVEL", "info,runpod_kubelet=debug")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("starting the controller")?;
    Ok((child, kubelet_port))
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
        self.kill();
    }
}
