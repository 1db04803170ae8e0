//! A real etcd + kube-apiserver + kube-scheduler + kube-controller-manager (1.20.2), started by
//! `tests/control-plane/cluster.sh` and stopped when the guard drops.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// Flags appended to a component's command line (no spaces inside one flag).
#[derive(Debug, Clone, Default)]
pub struct ExtraFlags {
    pub apiserver: Vec<String>,
    pub controller_manager: Vec<String>,
}

pub struct ControlPlane {
    dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/control-plane/cluster.sh")
}

impl ControlPlane {
    /// Builds the binaries if they are not cached yet, then starts a fresh cluster.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(&ExtraFlags::default())
    }

    /// Like [`ControlPlane::start`], with extra flags for some components (e.g. shorter
    /// eviction timeouts for outage tests); the defaults other tests use stay as they are.
    pub fn start_with(extra: &ExtraFlags) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("runpod-e2e-").tempdir()?;
        let output = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.path())
            .env("EXTRA_APISERVER_FLAGS", extra.apiserver.join(" "))
            .env(
                "EXTRA_CONTROLLER_MANAGER_FLAGS",
                extra.controller_manager.join(" "),
            )
            .output()
            .context("running cluster.sh")?;
        if !output.status.success() {
            bail!(
                "control plane did not start:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let kubeconfig = PathBuf::from(String::from_utf8(output.stdout)?.trim());
        Ok(Self { dir, kubeconfig })
    }

    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// The apiserver's URL.
    pub fn server_url(&self) -> anyhow::Result<String> {
        let env = std::fs::read_to_string(self.dir.path().join("env"))?;
        env.lines()
            .find_map(|l| l.strip_prefix("APISERVER_URL="))
            .map(str::to_owned)
            .context("no APISERVER_URL in the cluster's env file")
    }

    /// The cluster's CA (it signs the apiserver's client certificate towards kubelets).
    pub fn ca_file(&self) -> PathBuf {
        self.pki_dir().join("ca.crt")
    }

    /// The cluster's certificates and keys (`ca.key` included) and the `openssl.cnf` whose
    /// `client` section they were issued with.
    pub fn pki_dir(&self) -> PathBuf {
        self.dir.path().join("pki")
    }

    /// The tail of a component's log, for failure reports.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let path = self
            .dir
            .path()
            .join("logs")
            .join(format!("{component}.log"));
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}
