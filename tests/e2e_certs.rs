//! End-to-end tests of `runpod-kubelet certs` in the cluster against the real apiserver: first
//! install before the webhook configuration exists, caBundle patched with its own field manager
//! and kept when "Helm" re-applies the configuration, idempotent runs, a CA rotation whose
//! bundle overlaps (a webhook still serving the old certificate keeps admitting pods), two runs
//! racing, a reset caBundle re-injected, and `provided` mode never writing the user's Secret.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use runpod_certs::inspect;
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::wait;
use support::webhook::{WebhookProcess, https_get};

const NS: &str = "runpod-system";
const CONFIG: &str = "burst.runpod.io";
const SECRET: &str = "runpod-kubelet-webhook-tls";
const CA_SECRET: &str = "runpod-kubelet-webhook-tls-ca";

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_certs certs_rotate_in_the_cluster",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

/// Runs `runpod-kubelet certs ARGS` and returns its summary line.
fn certs(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .arg("certs")
        .args(["--namespace", NS, "--ip-addresses", "127.0.0.1"])
        .args(["--dns-names", "localhost"])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()?;
    ensure!(
        output.status.success(),
        "certs {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout)?;
    let line = stdout.lines().last().context("certs printed nothing")?;
    Ok(serde_json::from_str(line)?)
}

fn text(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

async fn secret(client: &kube::Client, name: &str) -> anyhow::Result<Secret> {
    Ok(Api::<Secret>::namespaced(client.clone(), NS)
        .get(name)
        .await?)
}

async fn ca_bundles(client: &kube::Client, name: &str) -> anyhow::Result<Vec<String>> {
    let config = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get(name)
        .await?;
    Ok(config
        .webhooks
        .unwrap_or_default()
        .iter()
        .map(|w| {
            String::from_utf8(
                w.client_config
                    .ca_bundle
                    .as_ref()
                    .map(|b| b.0.clone())
                    .unwrap_or_default(),
            )
            .unwrap()
        })
        .collect())
}

/// The configuration as the chart renders it (no caBundle), applied as Helm 4 does (server-side
/// apply, its own field manager).
async fn apply_like_helm(client: &kube::Client, url: &str) -> anyhow::Result<()> {
    let output = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .args(["webhook-configuration", "--url", url, "--name", CONFIG])
        .output()?;
    ensure!(output.status.success(), "webhook-configuration failed");
    let body: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    ensure!(
        body["webhooks"][0]["clientConfig"]
            .get("caBundle")
            .is_none(),
        "the chart's configuration must carry no caBundle"
    );
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(CONFIG, &PatchParams::apply("helm"), &Patch::Apply(&body))
        .await?;
    Ok(())
}

/// A burst pod goes through the webhook (dry run: nothing is kept); fails if the apiserver
/// cannot verify the webhook's certificate with the configuration's caBundle.
async fn admitted(client: &kube::Client) -> anyhow::Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "probe-", "annotations": {"runpod.io/burst-mode": "always"}},
        "spec": {"containers": [{"name": "c", "image": "cuda:12", "command": ["true"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))?;
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let created = Api::<Pod>::namespaced(client.clone(), "burst")
        .create(&params, &pod)
        .await
        .context("creating a burst pod through the webhook")?;
    let tolerations = created.spec.unwrap().tolerations.unwrap_or_default();
    ensure!(
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some("virtual-kubelet.io/provider")),
        "the webhook did not mutate the pod"
    );
    Ok(())
}

/// Copies the serving Secret into the webhook's files, as the kubelet refreshes a volume.
fn mount(secret: &Secret, dir: &Path) -> anyhow::Result<()> {
    for key in ["tls.key", "tls.crt"] {
        let tmp = dir.join(format!(".{key}.tmp"));
        std::fs::write(&tmp, text(secret, key))?;
        std::fs::rename(&tmp, dir.join(key))?;
    }
    Ok(())
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let kubeconfig = control_plane.kubeconfig.as_path();
    for (name, labels) in [
        (NS, json!({})),
        ("burst", json!({"runpod.io/burst": "enabled"})),
    ] {
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
    }

    // 1. Pre-install: no configuration yet. Both Secrets are made; nothing else.
    let first = certs(kubeconfig, &[])?;
    ensure!(
        first["ca"] == "created" && first["caBundle"] == "no-configuration",
        "first run: {first}"
    );
    let tls = secret(&client, SECRET).await?;
    let ca = secret(&client, CA_SECRET).await?;
    ensure!(tls.type_.as_deref() == Some("kubernetes.io/tls"));
    ensure!(
        inspect::signed_by(&text(&tls, "tls.crt"), &text(&ca, "ca.crt"))?,
        "serving certificate not signed by the stored CA"
    );
    ensure!(
        !tls.data.as_ref().unwrap().contains_key("ca.key"),
        "the CA key must stay out of the Secret the webhook mounts"
    );
    let names = inspect::subject_alt_names(&text(&tls, "tls.crt"))?;
    for wanted in [
        "runpod-kubelet-webhook.runpod-system.svc",
        "localhost",
        "127.0.0.1",
    ] {
        ensure!(
            names.iter().any(|n| n == wanted),
            "{wanted} not in {names:?}"
        );
    }

    // 2. The webhook starts on the Secret's files; the chart's configuration appears without a
    //    caBundle; the post-install run patches it, and a pod is admitted through TLS.
    let dir = tempfile::tempdir()?;
    mount(&tls, dir.path())?;
    let webhook = WebhookProcess::start_with_files(
        kubeconfig,
        dir,
        &text(&tls, "ca.crt"),
        &["--tls-reload-interval", "1s"],
    )
    .await?;
    let files = webhook_dir(&webhook);
    let url = format!("https://{}/mutate", webhook.addr);
    apply_like_helm(&client, &url).await?;
    ensure!(
        admitted(&client).await.is_err(),
        "a pod was admitted before any caBundle was set"
    );
    let post_install = certs(kubeconfig, &[])?;
    ensure!(
        post_install["ca"] == "kept"
            && post_install["serving"] == "kept"
            && post_install["caBundle"] == "patched",
        "post-install run: {post_install}"
    );
    admitted(&client).await?;
    let config = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get(CONFIG)
        .await?;
    let managers: Vec<String> = config
        .metadata
        .managed_fields
        .unwrap_or_default()
        .iter()
        .filter(|f| {
            serde_json::to_string(&f.fields_v1)
                .unwrap_or_default()
                .contains("caBundle")
        })
        .filter_map(|f| f.manager.clone())
        .collect();
    ensure!(
        managers == ["runpod-kubelet-certs"],
        "caBundle must be owned by the certs field manager alone, got {managers:?}"
    );

    // 3. Idempotent: nothing due, nothing written.
    let (tls_rv, ca_rv) = (
        tls.metadata.resource_version.clone(),
        ca.metadata.resource_version.clone(),
    );
    let again = certs(kubeconfig, &[])?;
    ensure!(
        again["ca"] == "kept" && again["serving"] == "kept" && again["caBundle"] == "unchanged",
        "idempotent run: {again}"
    );
    ensure!(secret(&client, SECRET).await?.metadata.resource_version == tls_rv);
    ensure!(secret(&client, CA_SECRET).await?.metadata.resource_version == ca_rv);

    // 4. "helm upgrade" re-applies the configuration: the caBundle stays.
    apply_like_helm(&client, &url).await?;
    admitted(&client)
        .await
        .context("after Helm re-applied the configuration")?;

    // 5. CA rotation with overlap: the bundle holds old and new CA; the webhook, still serving
    //    the old certificate, keeps admitting; after its files change it serves the new one.
    let old_ca = text(&ca, "ca.crt");
    let rotated = certs(kubeconfig, &["--rotate", "ca"])?;
    ensure!(
        rotated["ca"] == "rotated" && rotated["previousCas"] == 1,
        "{rotated}"
    );
    let ca = secret(&client, CA_SECRET).await?;
    let new_ca = text(&ca, "ca.crt");
    ensure!(new_ca != old_ca);
    for bundle in ca_bundles(&client, CONFIG).await? {
        let certs: Vec<Vec<u8>> = inspect::parse_bundle(&bundle)?
            .into_iter()
            .map(|c| c.der)
            .collect();
        ensure!(
            certs
                == vec![
                    inspect::parse_first(&new_ca)?.der,
                    inspect::parse_first(&old_ca)?.der
                ],
            "the bundle must hold the new CA then the old one"
        );
    }
    ensure!(
        https_get(webhook.addr, &new_ca, "/healthz").await.is_err(),
        "the webhook should still serve the old certificate"
    );
    admitted(&client)
        .await
        .context("old certificate during the overlap")?;
    mount(&secret(&client, SECRET).await?, &files)?;
    wait::until(
        "the webhook serving the new certificate",
        Duration::from_secs(30),
        || async {
            Ok(https_get(webhook.addr, &new_ca, "/healthz")
                .await
                .ok()
                .map(|_| ()))
        },
    )
    .await?;
    admitted(&client)
        .await
        .context("new certificate after the rotation")?;

    // 6. Someone resets the caBundle: the next run puts it back.
    let reset = json!({"webhooks": [{"name": format!("pods.{CONFIG}"), "clientConfig": {"caBundle": null}}]});
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(CONFIG, &PatchParams::default(), &Patch::Strategic(&reset))
        .await?;
    let reinjected = certs(kubeconfig, &[])?;
    ensure!(reinjected["caBundle"] == "patched", "{reinjected}");
    admitted(&client).await?;

    // 7. Two runs racing on a first install, then on a forced CA rotation: both succeed and the
    //    stored state is consistent (one CA, the serving certificate signed by it).
    for extra in [&[][..], &["--rotate", "ca"][..]] {
        let spawn = || {
            Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
                .arg("certs")
                .args(["--namespace", NS, "--secret-name", "race-tls"])
                .args(["--webhook-configuration", "absent.runpod.io"])
                .args(extra)
                .env("KUBECONFIG", kubeconfig)
                .output()
        };
        let (a, b) = std::thread::scope(|scope| {
            let a = scope.spawn(spawn);
            let b = scope.spawn(spawn);
            (a.join().unwrap(), b.join().unwrap())
        });
        for output in [a?, b?] {
            ensure!(
                output.status.success(),
                "a racing run failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let tls = secret(&client, "race-tls").await?;
        let ca = secret(&client, "race-tls-ca").await?;
        ensure!(inspect::signed_by(
            &text(&tls, "tls.crt"),
            &text(&ca, "ca.crt")
        )?);
        ensure!(text(&tls, "ca.crt") == text(&ca, "ca-bundle.crt"));
        ensure!(inspect::parse_bundle(&text(&ca, "ca-bundle.crt"))?.len() <= 3);
    }

    // 8. provided: the user's Secret is read, never written; its ca.crt becomes the caBundle.
    let user_dir = tempfile::tempdir()?;
    let output = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .args(["certs", "--out-dir"])
        .arg(user_dir.path())
        .args(["--ip-addresses", "127.0.0.1"])
        .output()?;
    ensure!(output.status.success());
    let read = |name: &str| std::fs::read_to_string(user_dir.path().join(name)).unwrap();
    let user: Secret = serde_json::from_value(json!({
        "metadata": {"name": "user-tls"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": read("tls.crt"), "tls.key": read("tls.key"), "ca.crt": read("ca.crt")}
    }))?;
    let user = Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &user)
        .await?;
    let provided = certs(
        kubeconfig,
        &["--mode", "provided", "--secret-name", "user-tls"],
    )?;
    ensure!(provided["caBundle"] == "patched", "{provided}");
    for bundle in ca_bundles(&client, CONFIG).await? {
        ensure!(bundle == read("ca.crt"), "caBundle is not the user's CA");
    }
    ensure!(
        secret(&client, "user-tls").await?.metadata.resource_version
            == user.metadata.resource_version,
        "provided mode wrote the user's Secret"
    );
    let missing = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .args(["certs", "--mode", "provided", "--namespace", NS])
        .args(["--secret-name", "nope"])
        .env("KUBECONFIG", kubeconfig)
        .output()?;
    if missing.status.success() {
        bail!("provided mode with a missing Secret must fail");
    }
    drop(webhook);

    // 9. Reload under load: three CA + serving rotations (certs run → Secret → the webhook's
    //    files) while a client keeps reviewing over new connections, each trusting the bundle
    //    the apiserver has at that moment: zero failed handshakes, zero failed reviews.
    reload_under_load(&client, kubeconfig).await?;
    Ok(())
}

async fn reload_under_load(client: &kube::Client, kubeconfig: &Path) -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let args = [
        "--secret-name",
        "load-tls",
        "--webhook-configuration",
        CONFIG,
    ];
    // The configuration now belongs to this Secret's CA.
    certs(kubeconfig, &args)?;
    let tls = secret(client, "load-tls").await?;
    let dir = tempfile::tempdir()?;
    mount(&tls, dir.path())?;
    let webhook = WebhookProcess::start_with_files(
        kubeconfig,
        dir,
        &text(&tls, "ca.crt"),
        &["--tls-reload-interval", "200ms"],
    )
    .await?;
    let files = webhook.dir().to_path_buf();
    let addr = webhook.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let reviews = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let load = {
        let (client, stop, reviews, failures) = (
            client.clone(),
            Arc::clone(&stop),
            Arc::clone(&reviews),
            Arc::clone(&failures),
        );
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                // The bundle the apiserver would use right now.
                let bundle = match ca_bundles(&client, CONFIG).await {
                    Ok(bundles) => bundles.into_iter().next().unwrap_or_default(),
                    Err(error) => {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("reading the bundle: {error}"));
                        continue;
                    }
                };
                match review(addr, &bundle, n).await {
                    Ok(()) => {
                        reviews.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(error) => failures.lock().unwrap().push(format!("{error:#}")),
                }
            }
        })
    };
    let mut per_rotation = Vec::new();
    for round in 1..=3 {
        let before = reviews.load(Ordering::SeqCst);
        let mut rotate = args.to_vec();
        rotate.extend(["--rotate", "ca"]);
        let result = certs(kubeconfig, &rotate)?;
        ensure!(result["ca"] == "rotated", "round {round}: {result}");
        // The kubelet refreshes Secret volumes some time after the Secret changed.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let tls = secret(client, "load-tls").await?;
        mount(&tls, &files)?;
        let new_ca = text(&secret(client, "load-tls-ca").await?, "ca.crt");
        wait::until(
            "the webhook serving the rotated certificate",
            Duration::from_secs(30),
            || async { Ok(https_get(addr, &new_ca, "/healthz").await.ok().map(|_| ())) },
        )
        .await?;
        // Keep the load on the new certificate for a while too.
        let settled = reviews.load(Ordering::SeqCst);
        wait::until("reviews after the reload", Duration::from_secs(30), || {
            let reviews = Arc::clone(&reviews);
            async move { Ok((reviews.load(Ordering::SeqCst) >= settled + 20).then_some(())) }
        })
        .await?;
        per_rotation.push(reviews.load(Ordering::SeqCst) - before);
    }
    stop.store(true, Ordering::SeqCst);
    load.await?;
    let failures = failures.lock().unwrap().clone();
    ensure!(
        failures.is_empty(),
        "{} failed handshakes or reviews out of {}; first: {:?}",
        failures.len(),
        reviews.load(Ordering::SeqCst),
        failures.first()
    );
    println!(
        "reload under load: {} reviews over 3 rotations ({per_rotation:?}), 0 failures",
        reviews.load(Ordering::SeqCst)
    );
    Ok(())
}

/// One AdmissionReview over a new TLS connection trusting `bundle`.
async fn review(addr: std::net::SocketAddr, bundle: &str, n: u64) -> anyhow::Result<()> {
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let uid = format!("load-{n}");
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "burst", "operation": "CREATE",
            "userInfo": {"username": "load"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "burst"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))?;
    let config = runpod_certs::client_config(bundle, &[b"http/1.1"])?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(rustls::pki_types::ServerName::try_from("localhost")?, tcp)
        .await
        .context("handshake")?;
    tls.write_all(
        format!(
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await?;
    tls.write_all(&body).await?;
    let mut response = String::new();
    tls.read_to_string(&mut response).await?;
    ensure!(
        response.starts_with("HTTP/1.1 200"),
        "review answered {response}"
    );
    let json = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    let review: serde_json::Value = serde_json::from_str(json).context("review body")?;
    ensure!(
        review["response"]["uid"] == uid.as_str() && review["response"]["allowed"] == true,
        "unexpected review {review}"
    );
    Ok(())
}

fn webhook_dir(webhook: &WebhookProcess) -> std::path::PathBuf {
    webhook.dir().to_path_buf()
}
