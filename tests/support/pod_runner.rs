//! A test-only stand-in kubelet: no container runtime exists here, so the pods that the chart
//! creates (hook Jobs, the webhook and controller Deployments) are scheduled by the real scheduler
//! onto a stand-in node, and this runner runs each pod's container as a local process of the
//! `runpod-kubelet` binary (the image's entrypoint) with the pod's arguments, its env (values,
//! field and Secret references), its Secret volumes (kept refreshed, as the kubelet does) and its
//! ServiceAccount token, and writes the pod status: Running and Ready (from the readiness probe)
//! while it runs, Succeeded or Failed with the exit code when it ends, so the Job controller
//! completes Jobs, Deployments become available and Helm goes on. Deleted pods get SIGTERM, then
//! are removed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use serde_json::json;

use super::nodes::FakeNode;

pub const NODE: &str = "standin";

/// A Secret volume: local directory, Secret name, and its items (key → path) or every key.
type SecretVolume = (PathBuf, String, Option<Vec<(String, String)>>);

struct Running {
    child: Child,
    name: String,
    namespace: String,
    dir: PathBuf,
    volumes: Vec<SecretVolume>,
    probe: Option<(String, u16, String)>,
    ready: Option<bool>,
    terminating_since: Option<Instant>,
    started_at: String,
}

#[derive(Default)]
struct State {
    running: HashMap<String, Running>,
    /// Pods whose container the test stopped (not restarted until resumed).
    stopped: std::collections::HashSet<String>,
    /// Pod name → log file, kept after the pod is gone.
    logs: BTreeMap<String, PathBuf>,
}

pub struct PodRunner {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
    heartbeat: tokio::task::JoinHandle<()>,
    _root: tempfile::TempDir,
}

struct Ctx {
    client: kube::Client,
    server: String,
    ca_pem: String,
    ip: String,
    root: PathBuf,
    state: Arc<Mutex<State>>,
}

impl PodRunner {
    /// Registers the stand-in node (Ready, untainted) and starts running what lands on it. `ip`
    /// is the address pods get (not loopback: Endpoints refuse loopback addresses).
    pub async fn start(
        client: kube::Client,
        server: String,
        ca_pem: String,
        ip: String,
    ) -> anyhow::Result<Self> {
        let mut node = FakeNode::local_gpu(NODE);
        node.allocatable = [
            ("cpu", "64"),
            ("memory", "256Gi"),
            ("pods", "110"),
            ("nvidia.com/gpu", "0"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let heartbeat = node.register(client.clone()).await?;
        let root = tempfile::Builder::new().prefix("standin-").tempdir()?;
        let state = Arc::new(Mutex::new(State::default()));
        let ctx = Ctx {
            client,
            server,
            ca_pem,
            ip,
            root: root.path().to_path_buf(),
            state: Arc::clone(&state),
        };
        let task = tokio::spawn(async move {
            loop {
                if let Err(error) = ctx.tick().await {
                    eprintln!("stand-in kubelet: {error:#}");
                }
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        });
        Ok(Self {
            state,
            task,
            heartbeat,
            _root: root,
        })
    }

    /// The logs of every pod whose name starts with `prefix`.
    pub fn logs(&self, prefix: &str) -> String {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .logs
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(name, path)| {
                format!(
                    "----- {name}\n{}",
                    std::fs::read_to_string(path).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops the container of the running pod whose name starts with `prefix` (as if it died
    /// and the kubelet could not restart it): the pod stays, not Ready.
    pub fn stop(&self, prefix: &str) -> usize {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let uids: Vec<String> = state
            .running
            .iter()
            .filter(|(_, r)| r.name.starts_with(prefix))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &uids {
            if let Some(mut running) = state.running.remove(uid) {
                let _ = running.child.kill();
                let _ = running.child.wait();
            }
            state.stopped.insert(uid.clone());
        }
        uids.len()
    }

    /// Lets stopped pods run again.
    pub fn resume(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.stopped.clear();
    }

    /// Names of the pods running now.
    pub fn running(&self) -> Vec<String> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.running.values().map(|r| r.name.clone()).collect()
    }
}

impl Drop for PodRunner {
    fn drop(&mut self) {
        self.task.abort();
        self.heartbeat.abort();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for running in state.running.values_mut() {
            let _ = running.child.kill();
            let _ = running.child.wait();
        }
    }
}

fn now() -> String {
    Timestamp::now().to_string()
}

impl Ctx {
    async fn tick(&self) -> anyhow::Result<()> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let listed = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={NODE}")))
            .await?;
        let mut seen = Vec::new();
        for pod in listed.items {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            seen.push(uid.clone());
            if let Err(error) = self.handle(&pod, &uid).await {
                eprintln!(
                    "stand-in kubelet: pod {}: {error:#}",
                    pod.metadata.name.clone().unwrap_or_default()
                );
            }
        }
        // Pods gone from the apiserver: their processes go too.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.running.retain(|uid, running| {
            let keep = seen.contains(uid);
            if !keep {
                let _ = running.child.kill();
                let _ = running.child.wait();
            }
            keep
        });
        Ok(())
    }

    async fn handle(&self, pod: &Pod, uid: &str) -> anyhow::Result<()> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            let gone = {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                match state.running.get_mut(uid) {
                    None => true,
                    Some(running) => {
                        let since = *running.terminating_since.get_or_insert_with(|| {
                            let _ = Command::new("kill")
                                .args(["-TERM", &running.child.id().to_string()])
                                .status();
                            Instant::now()
                        });
                        let exited = matches!(running.child.try_wait(), Ok(Some(_)));
                        if !exited && since.elapsed() > Duration::from_secs(20) {
                            let _ = running.child.kill();
                            let _ = running.child.wait();
                        }
                        exited || since.elapsed() > Duration::from_secs(20)
                    }
                }
            };
            if gone {
                self.state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .running
                    .remove(uid);
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid.to_owned()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                let _ = api.delete(&name, &params).await;
            }
            return Ok(());
        }
        if phase == "Succeeded" || phase == "Failed" {
            return Ok(());
        }
        let (known, stopped) = {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            (state.running.contains_key(uid), state.stopped.contains(uid))
        };
        if stopped {
            return self.write_ready(&api, &name, false, &now()).await;
        }
        if !known {
            let running = self.launch(pod).await?;
            let started = running.started_at.clone();
            let probe = running.probe.is_none();
            self.state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .running
                .insert(uid.to_owned(), running);
            // Without a readiness probe a running container is ready.
            return self.write_ready(&api, &name, probe, &started).await;
        }
        // Running: did it end? Refresh its volumes, probe it.
        let (exit, volumes, probe, dir, started, was_ready) = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let running = state.running.get_mut(uid).context("vanished")?;
            let exit = running.child.try_wait()?.map(|s| s.code().unwrap_or(137));
            (
                exit,
                running.volumes.clone(),
                running.probe.clone(),
                running.dir.clone(),
                running.started_at.clone(),
                running.ready,
            )
        };
        if let Some(code) = exit {
            self.state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .running
                .remove(uid);
            return self.write_terminated(&api, pod, code, &started).await;
        }
        self.materialise(&namespace, &dir, &volumes).await?;
        if let Some((scheme, port, path)) = probe {
            let ready = probe_ok(&scheme, port, &path).await;
            if was_ready != Some(ready) {
                self.write_ready(&api, &name, ready, &started).await?;
                if let Some(running) = self
                    .state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .running
                    .get_mut(uid)
                {
                    running.ready = Some(ready);
                }
            }
        }
        Ok(())
    }

    async fn launch(&self, pod: &Pod) -> anyhow::Result<Running> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let spec = pod.spec.as_ref().context("no spec")?;
        let container: &Container = spec.containers.first().context("no container")?;
        let dir = self.root.join(format!("{namespace}-{name}"));
        std::fs::create_dir_all(&dir)?;

        // Secret volumes, by mount path.
        let mut volumes = Vec::new();
        let mut mounts: Vec<(String, PathBuf)> = Vec::new();
        let mut token_dir = None;
        for mount in container.volume_mounts.iter().flatten() {
            let Some(volume) = spec.volumes.iter().flatten().find(|v| v.name == mount.name) else {
                continue;
            };
            let Some(secret) = &volume.secret else {
                continue;
            };
            let local = dir.join(format!("vol-{}", volume.name));
            std::fs::create_dir_all(&local)?;
            let items = secret.items.as_ref().map(|items| {
                items
                    .iter()
                    .map(|i| (i.key.clone(), i.path.clone()))
                    .collect()
            });
            volumes.push((
                local.clone(),
                secret.secret_name.clone().unwrap_or_default(),
                items,
            ));
            if mount.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount" {
                token_dir = Some(local.clone());
            }
            mounts.push((mount.mount_path.clone(), local));
        }
        self.materialise(&namespace, &dir, &volumes).await?;

        // The pod's ServiceAccount token, as a kubeconfig (the binary reads KUBECONFIG first).
        let token = match &token_dir {
            Some(dir) => std::fs::read_to_string(dir.join("token"))?,
            None => String::new(),
        };
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            serde_json::to_string(&json!({
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": self.server,
                    "certificate-authority-data": base64_encode(self.ca_pem.as_bytes())}}],
                "users": [{"name": "sa", "user": {"token": token.trim()}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
                "current-context": "c"
            }))?,
        )?;

        let rewrite = |arg: &str| -> String {
            for (mount_path, local) in &mounts {
                if let Some(rest) = arg.strip_prefix(mount_path.as_str()) {
                    return format!("{}{rest}", local.display());
                }
            }
            arg.to_owned()
        };
        let mut argv: Vec<String> = container
            .command
            .iter()
            .flatten()
            .chain(container.args.iter().flatten())
            .map(|a| rewrite(a))
            .collect();
        if container.command.as_ref().is_some_and(|c| !c.is_empty()) {
            argv.remove(0);
        }

        let mut env: Vec<(String, String)> = Vec::new();
        for var in container.env.iter().flatten() {
            let value = if let Some(value) = &var.value {
                value.clone()
            } else if let Some(from) = &var.value_from {
                if let Some(field) = &from.field_ref {
                    match field.field_path.as_str() {
                        "metadata.namespace" => namespace.clone(),
                        "metadata.name" => name.clone(),
                        "status.podIP" | "status.hostIP" => self.ip.clone(),
                        "spec.nodeName" => NODE.to_owned(),
                        "spec.serviceAccountName" => {
                            spec.service_account_name.clone().unwrap_or_default()
                        }
                        other => anyhow::bail!("unsupported fieldRef {other}"),
                    }
                } else if let Some(key) = &from.secret_key_ref {
                    let secret = Api::<Secret>::namespaced(self.client.clone(), &namespace)
                        .get(&key.name)
                        .await?;
                    let bytes = secret
                        .data
                        .and_then(|d| d.get(&key.key).cloned())
                        .context("secretKeyRef key missing")?;
                    String::from_utf8(bytes.0)?
                } else {
                    anyhow::bail!("unsupported valueFrom for {}", var.name)
                }
            } else {
                String::new()
            };
            env.push((var.name.clone(), value));
        }

        let log_path = dir.join("container.log");
        let log = std::fs::File::create(&log_path)?;
        let child = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
            .args(&argv)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .env("KUBECONFIG", &kubeconfig)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {argv:?}"))?;
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .logs
            .insert(name.clone(), log_path);

        let probe = container.readiness_probe.as_ref().and_then(|probe| {
            let get = probe.http_get.as_ref()?;
            let port = match &get.port {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => {
                    u16::try_from(*p).ok()?
                }
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(named) => {
                    let port = container
                        .ports
                        .iter()
                        .flatten()
                        .find(|p| p.name.as_deref() == Some(named.as_str()))?;
                    u16::try_from(port.container_port).ok()?
                }
            };
            Some((
                get.scheme.clone().unwrap_or_else(|| "HTTP".to_owned()),
                port,
                get.path.clone().unwrap_or_else(|| "/".to_owned()),
            ))
        });
        Ok(Running {
            child,
            name,
            namespace,
            dir,
            volumes,
            probe,
            ready: None,
            terminating_since: None,
            started_at: now(),
        })
    }

    /// Writes the Secret volumes' files, each replaced atomically when it changed.
    async fn materialise(
        &self,
        namespace: &str,
        _dir: &Path,
        volumes: &[SecretVolume],
    ) -> anyhow::Result<()> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        for (local, secret_name, items) in volumes {
            let Some(secret) = api.get_opt(secret_name).await? else {
                continue;
            };
            let data = secret.data.unwrap_or_default();
            let files: Vec<(String, Vec<u8>)> = match items {
                Some(items) => items
                    .iter()
                    .filter_map(|(key, path)| data.get(key).map(|v| (path.clone(), v.0.clone())))
                    .collect(),
                None => data.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect(),
            };
            for (path, bytes) in files {
                let target = local.join(&path);
                if std::fs::read(&target).ok().as_deref() == Some(bytes.as_slice()) {
                    continue;
                }
                let tmp = local.join(format!(".{path}.tmp"));
                std::fs::write(&tmp, &bytes)?;
                std::fs::rename(&tmp, &target)?;
            }
        }
        Ok(())
    }

    async fn write_ready(
        &self,
        api: &Api<Pod>,
        name: &str,
        ready: bool,
        started: &str,
    ) -> anyhow::Result<()> {
        let status = if ready { "True" } else { "False" };
        let now = now();
        let patch = json!({"status": {
            "phase": "Running",
            "hostIP": self.ip, "podIP": self.ip, "podIPs": [{"ip": self.ip}],
            "startTime": started,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": started},
                {"type": "Ready", "status": status, "lastTransitionTime": now},
                {"type": "ContainersReady", "status": status, "lastTransitionTime": now},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": started}
            ],
            "containerStatuses": [{"name": container_name(api, name).await, "ready": ready,
                "restartCount": 0, "image": "runpod-kubelet", "imageID": "", "started": true,
                "state": {"running": {"startedAt": started}}}]
        }});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn write_terminated(
        &self,
        api: &Api<Pod>,
        pod: &Pod,
        code: i32,
        started: &str,
    ) -> anyhow::Result<()> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let container = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .map(|c| c.name.clone())
            .unwrap_or_default();
        let now = now();
        let patch = json!({"status": {
            "phase": if code == 0 { "Succeeded" } else { "Failed" },
            "hostIP": self.ip, "podIP": self.ip, "startTime": started,
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
            ],
            "containerStatuses": [{"name": container, "ready": false, "restartCount": 0,
                "image": "runpod-kubelet", "imageID": "", "started": false,
                "state": {"terminated": {"exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" },
                    "startedAt": started, "finishedAt": now}}}]
        }});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}

async fn container_name(api: &Api<Pod>, name: &str) -> String {
    api.get(name)
        .await
        .ok()
        .and_then(|p| p.spec)
        .and_then(|s| s.containers.first().map(|c| c.name.clone()))
        .unwrap_or_default()
}

async fn probe_ok(scheme: &str, port: u16, path: &str) -> bool {
    let url = format!("{}://127.0.0.1:{port}{path}", scheme.to_ascii_lowercase());
    let output = tokio::process::Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "2",
        ])
        .arg(&url)
        .output()
        .await;
    match output {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .parse::<u16>()
            .is_ok_and(|code| (200..400).contains(&code)),
        Err(_) => false,
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
