//! The helper subcommands as users run them: `certs` writes a usable CA and serving pair,
//! `webhook-configuration` prints a registration for it, and bad flags are refused clearly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Command;

fn runpod_kubelet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("binary runs")
}

#[test]
fn certs_and_webhook_configuration_fit_together() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let certs = runpod_kubelet(&[
        "certs",
        "--out-dir",
        out,
        "--dns-names",
        "hook.ns.svc",
        "--ip-addresses",
        "10.1.2.3",
    ]);
    assert!(
        certs.status.success(),
        "{}",
        String::from_utf8_lossy(&certs.stderr)
    );
    for file in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(dir.path().join(file).exists(), "{file} missing");
    }
    let key_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.path().join("tls.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(key_mode & 0o077, 0, "private key readable by others");
    runpod_certs::ReloadingCertResolver::load(
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
    )
    .unwrap();

    let ca_path = dir.path().join("ca.crt");
    let printed = runpod_kubelet(&[
        "webhook-configuration",
        "--service",
        "runpod-system/runpod-webhook:8443",
        "--ca-bundle",
        ca_path.to_str().unwrap(),
        "--exclude-namespaces",
        "kube-system,runpod-system",
    ]);
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let config: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
    assert_eq!(config["kind"], "MutatingWebhookConfiguration");
    let hook = &config["webhooks"][0];
    assert_eq!(hook["clientConfig"]["service"]["name"], "runpod-webhook");
    assert_eq!(hook["clientConfig"]["service"]["port"], 8443);
    assert_eq!(hook["clientConfig"]["service"]["path"], "/mutate");
    let bundle = hook["clientConfig"]["caBundle"].as_str().unwrap();
    let decoded = base64_decode(bundle);
    assert_eq!(
        decoded,
        std::fs::read(&ca_path).unwrap(),
        "caBundle is not the CA"
    );
}

#[test]
fn webhook_configuration_always_excludes_kube_system_and_the_webhook_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, "PEM").unwrap();
    let printed = runpod_kubelet(&[
        "webhook-configuration",
        "--service",
        "runpod-system/runpod-webhook:8443",
        "--ca-bundle",
        ca_path.to_str().unwrap(),
        "--exclude-namespaces",
        "team-a",
    ]);
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let config: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
    for hook in config["webhooks"].as_array().unwrap() {
        let excluded = &hook["namespaceSelector"]["matchExpressions"][0];
        assert_eq!(excluded["operator"], "NotIn");
        let values: Vec<&str> = excluded["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for namespace in ["kube-system", "runpod-system", "team-a"] {
            assert!(values.contains(&namespace), "{namespace} not in {values:?}");
        }
    }
}

/// The chart's `extraArgs` come after the flags it sets: the binary takes the last of a
/// repeated flag (a list is replaced, not appended to) instead of refusing the repeat.
#[test]
fn a_repeated_flag_takes_its_last_value() {
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, "PEM").unwrap();
    let printed = runpod_kubelet(&[
        "webhook-configuration",
        "--service",
        "runpod-system/first:8443",
        "--ca-bundle",
        ca_path.to_str().unwrap(),
        "--exclude-namespaces",
        "team-a",
        "--service",
        "runpod-system/second:8443",
        "--exclude-namespaces",
        "team-b",
    ]);
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let config: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
    for hook in config["webhooks"].as_array().unwrap() {
        assert_eq!(hook["clientConfig"]["service"]["name"], "second");
        let values = hook["namespaceSelector"]["matchExpressions"][0]["values"].to_string();
        assert!(
            values.contains("team-b") && !values.contains("team-a"),
            "{values}"
        );
    }
}

#[test]
fn certs_never_write_a_private_key_into_a_readable_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // Leftovers of an earlier run, world-readable, with a second name: writing the new key
    // into them (then chmod) would show it to everyone for a moment.
    for key in ["ca.key", "tls.key"] {
        let path = out.join(key);
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::hard_link(&path, dir.path().join(format!("{key}.link"))).unwrap();
    }
    let certs = runpod_kubelet(&["certs", "--out-dir", out.to_str().unwrap()]);
    assert!(
        certs.status.success(),
        "{}",
        String::from_utf8_lossy(&certs.stderr)
    );
    for key in ["ca.key", "tls.key"] {
        let old = std::fs::read_to_string(dir.path().join(format!("{key}.link"))).unwrap();
        assert_eq!(old, "old", "{key}: the new key went into the readable file");
        let mode = std::fs::metadata(out.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}: mode {mode:o}");
        assert!(
            std::fs::read_to_string(out.join(key))
                .unwrap()
                .contains("PRIVATE KEY")
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["ca.crt", "ca.key", "tls.crt", "tls.key"],
        "leftovers"
    );
}

#[test]
fn bad_flags_are_refused_with_a_message() {
    for price in ["free", "0", "NaN"] {
        let output = runpod_kubelet(&[
            "webhook",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--max-gpu-price",
            price,
        ]);
        assert!(!output.status.success(), "{price} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("not a positive number"),
            "{price}: {stderr}"
        );
    }

    for (flag, value) in [
        ("--tls-reload-interval", "0s"),
        ("--idle-timeout", "0s"),
        ("--max-connections", "0"),
        ("--max-concurrent-streams", "0"),
    ] {
        let output = runpod_kubelet(&["webhook", "--tls-cert", "c", "--tls-key", "k", flag, value]);
        assert!(!output.status.success(), "{flag} {value} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(flag) && stderr.contains("invalid value"),
            "{flag} {value}: {stderr}"
        );
    }

    for (flag, value) in [
        ("--idle-gpu-threshold", "150"),
        ("--idle-gpu-threshold", "100.5"),
        ("--idle-gpu-threshold", "busy"),
        ("--idle-gpu-after", "soon"),
    ] {
        let output = runpod_kubelet(&["controller", flag, value]);
        assert!(!output.status.success(), "{flag} {value} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(flag) && stderr.contains("invalid value"),
            "{flag} {value}: {stderr}"
        );
    }

    let missing = runpod_kubelet(&[
        "webhook",
        "--tls-cert",
        "/nonexistent/c.pem",
        "--tls-key",
        "/nonexistent/k.pem",
    ]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/c.pem"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
}

#[test]
fn the_webhook_exits_cleanly_after_sigterm_and_its_drain() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    assert!(
        runpod_kubelet(&["certs", "--out-dir", out])
            .status
            .success()
    );
    // A cluster that is never reached: the caches retry in the background, nothing blocks.
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n\
         current-context: x\n",
    )
    .unwrap();
    let port = support::webhook::free_port().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut webhook = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .args(["webhook", "--listen", &listen, "--shutdown-drain", "200ms"])
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("RUST_LOG")
        .stderr(std::fs::File::create(dir.path().join("webhook.log")).unwrap())
        .spawn()
        .unwrap();
    let bound = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(&listen).is_err() {
        assert!(std::time::Instant::now() < bound, "never listened");
        assert!(
            webhook.try_wait().unwrap().is_none(),
            "exited before serving"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let killed = Command::new("kill")
        .args(["-TERM", &webhook.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(status) = webhook.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > bound {
            let _ = webhook.kill();
            panic!("still running 30 s after SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(dir.path().join("webhook.log")).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("shutdown signal received"), "{stderr}");
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}
