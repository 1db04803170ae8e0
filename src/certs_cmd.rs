//! `runpod-kubelet certs`: a CA and a serving certificate as PEM files (demo and manual
//! installs; rotation inside the cluster builds on the same generator).

use std::path::Path;

use anyhow::Context as _;
use runpod_certs::CertificateAuthority;

use crate::cli::CertsArgs;

pub fn run(args: &CertsArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let ca = CertificateAuthority::generate("runpod-kubelet-webhook-ca", args.validity * 10)?;
    let dns: Vec<&str> = args.dns_names.iter().map(String::as_str).collect();
    let serving = ca.issue_serving(&dns, &args.ip_addresses, args.validity)?;
    write(
        &args.out_dir.join("ca.crt"),
        &ca.certificate().cert_pem,
        false,
    )?;
    write(
        &args.out_dir.join("ca.key"),
        &ca.certificate().key_pem,
        true,
    )?;
    write(&args.out_dir.join("tls.crt"), &serving.cert_pem, false)?;
    write(&args.out_dir.join("tls.key"), &serving.key_pem, true)?;
    tracing::info!(dir = %args.out_dir.display(), "certificates written");
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
