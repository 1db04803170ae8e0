//! Direct calls to a controller's kubelet API with client certificates the cluster CA signed
//! (issued with openssl, as `tests/control-plane/cluster.sh` issues the cluster's own).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, ensure};

/// A client certificate and key signed by the cluster CA.
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Identity {
    /// Issues `subject` (openssl's `/O=.../CN=...` form) with the cluster's `client` extensions.
    pub fn issue(pki: &Path, dir: &Path, name: &str, subject: &str) -> anyhow::Result<Self> {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        let csr = dir.join(format!("{name}.csr"));
        let config = pki.join("openssl.cnf");
        openssl(
            Command::new("openssl")
                .args(["req", "-new", "-nodes", "-newkey", "rsa:2048", "-config"])
                .arg(&config)
                .args(["-subj", subject, "-keyout"])
                .arg(&key)
                .arg("-out")
                .arg(&csr),
        )?;
        openssl(
            Command::new("openssl")
                .args(["x509", "-req", "-sha256", "-days", "1", "-set_serial"])
                .arg(format!("0x{:032x}", fastrand::u128(..) >> 1))
                .arg("-in")
                .arg(&csr)
                .arg("-CA")
                .arg(pki.join("ca.crt"))
                .arg("-CAkey")
                .arg(pki.join("ca.key"))
                .arg("-extfile")
                .arg(&config)
                .args(["-extensions", "client", "-out"])
                .arg(&cert),
        )?;
        Ok(Self { cert, key })
    }
}

fn openssl(command: &mut Command) -> anyhow::Result<()> {
    let output = command.output().context("running openssl")?;
    ensure!(
        output.status.success(),
        "openssl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// A direct HTTPS GET to the controller's kubelet port (its serving certificate is
/// self-signed): the status code and the body.
pub fn kubelet_get(
    port: u16,
    path: &str,
    identity: Option<&Identity>,
) -> anyhow::Result<(u16, String)> {
    kubelet_get_as(port, path, identity, None)
}

/// [`kubelet_get`], optionally with `Authorization: Bearer <token>` (as metrics-server calls).
pub fn kubelet_get_as(
    port: u16,
    path: &str,
    identity: Option<&Identity>,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let mut curl = Command::new("curl");
    curl.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"]);
    if let Some(identity) = identity {
        curl.arg("--cert").arg(&identity.cert);
        curl.arg("--key").arg(&identity.key);
    }
    if let Some(token) = token {
        curl.arg("-H").arg(format!("Authorization: Bearer {token}"));
    }
    let output = curl
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .context("running curl")?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').context("no status from curl")?;
    let code = code
        .parse()
        .with_context(|| format!("curl status {code:?} ({:?})", output.status))?;
    Ok((code, body.to_owned()))
}
