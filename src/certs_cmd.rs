//! `runpod-kubelet certs`: a CA and a serving certificate, either as PEM files (demo and manual
//! installs) or, in the cluster, as Secrets that are renewed when due and whose CA bundle is
//! kept in the webhook configuration (`cluster`).

mod cluster;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use anyhow::Context as _;
use runpod_certs::CertificateAuthority;

use crate::cli::{CertsArgs, CertsMode};

pub async fn run(args: &CertsArgs) -> anyhow::Result<()> {
    let mode = args.mode.unwrap_or(if args.out_dir.is_some() {
        CertsMode::Files
    } else {
        CertsMode::Helm
    });
    match mode {
        CertsMode::Files => write_files(args),
        CertsMode::Helm | CertsMode::Provided => cluster::run(args, mode).await,
    }
}

fn write_files(args: &CertsArgs) -> anyhow::Result<()> {
    let out_dir = args
        .out_dir
        .as_ref()
        .context("--mode files needs --out-dir")?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let ca = CertificateAuthority::generate("runpod-kubelet-webhook-ca", args.validity * 10)?;
    let mut dns: Vec<&str> = args.dns_names.iter().map(String::as_str).collect();
    let mut ips = args.ip_addresses.clone();
    if dns.is_empty() && ips.is_empty() {
        dns.push("localhost");
        ips.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let serving = ca.issue_serving(&dns, &ips, args.validity)?;
    write(&out_dir.join("ca.crt"), &ca.certificate().cert_pem, false)?;
    write(&out_dir.join("ca.key"), &ca.certificate().key_pem, true)?;
    write(&out_dir.join("tls.crt"), &serving.cert_pem, false)?;
    write(&out_dir.join("tls.key"), &serving.key_pem, true)?;
    tracing::info!(dir = %out_dir.display(), "certificates written");
    Ok(())
}

/// Writes a new file next to `path` and renames it into place: a private key is never in a
/// file anyone else can read, not even for a moment, and a reader never sees half a file.
fn write(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let temporary = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written =
        write_new(&temporary, contents, secret).and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

fn write_new(path: &Path, contents: &str, secret: bool) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path)?;
    std::io::Write::write_all(&mut file, contents.as_bytes())?;
    file.sync_all()
}
