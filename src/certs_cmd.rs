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

fn write(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}
