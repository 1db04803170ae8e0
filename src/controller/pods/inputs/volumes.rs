//! configMap, secret, downwardAPI, projected and emptyDir volumes, resolved into the files the
//! container must see. RunPod has no volumes of this kind, so the completion wrapper writes
//! these files before the command runs (see `runpod::wrapper::materialise_script`); nothing a
//! pod mounts is silently dropped.
//!
//! The service-account token is the one exception: burst pods cannot reach the apiserver, and
//! shipping a cluster credential to a third-party cloud would leak it. The mount's `ca.crt` and
//! `namespace` are no credentials, and are shipped.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, Container, DownwardAPIVolumeFile, KeyToPath, Pod, SecretProjection,
    Volume, VolumeMount,
};

use crate::controller::pods::inputs::env::{self, EnvError, EnvSource, Kind};
use crate::provider::request::{MountedFile, Volumes};

/// Where the kubelet mounts the service-account token; never shipped to the cloud.
pub(crate) const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The files of the service-account mount that are shipped: the cluster's CA and the
/// namespace; anything else there (the token, under whatever path) stays in the cluster.
const SERVICE_ACCOUNT_FILES: [&str; 2] = ["ca.crt", "namespace"];

/// Largest mounted file: its base64 form travels in one env var, and Linux refuses to start a
/// process with an env string over 128 KiB (the container would never start, yet bill).
pub(crate) const MAX_FILE_BYTES: usize = 64 * 1024;
/// Largest total of mounted files (the whole env must fit too).
pub(crate) const MAX_TOTAL_BYTES: usize = 256 * 1024;

/// The kubelet's default file mode for these volumes (0644).
const DEFAULT_MODE: i32 = 0o644;

/// Why the mounts cannot be materialised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum VolumeError {
    #[error("volume {volume:?}: {source}")]
    Source { volume: String, source: EnvError },
    #[error("volumeMount {0:?} names no volume of the pod")]
    UnknownVolume(String),
    #[error(
        "volume {volume:?} is of a kind a burst pod cannot have ({kind}); only configMap, \
         secret, downwardAPI, projected and emptyDir volumes are materialised"
    )]
    Unsupported { volume: String, kind: String },
    #[error("path {0:?} in a volume is not a plain relative path")]
    BadPath(String),
    #[error(
        "mounted files are too large to ship to the cloud ({what}); the limit is {MAX_FILE_BYTES} bytes \
         per file and {MAX_TOTAL_BYTES} in all, because they travel in env vars"
    )]
    TooLarge { what: String },
}

/// Resolves every mount of `container` (which must belong to `pod`).
pub(crate) async fn resolve(
    source: &impl EnvSource,
    pod: &Pod,
    container: &Container,
) -> Result<Volumes, VolumeError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let volumes: BTreeMap<&str, &Volume> = pod
        .spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .map(|v| (v.name.as_str(), v))
        .collect();
    let mut out = Volumes::default();
    for mount in container.volume_mounts.iter().flatten() {
        let mount_path = mount.mount_path.trim_end_matches('/');
        let volume = volumes
            .get(mount.name.as_str())
            .ok_or_else(|| VolumeError::UnknownVolume(mount.name.clone()));
        // A claim is no files: the controller mounts it as the instance's network volume.
        if let Ok(Some(claim)) = volume.as_ref().map(|v| v.persistent_volume_claim.as_ref()) {
            // The cloud mounts the whole volume, writable: a part of it, or read-only, would
            // put data where the pod does not expect it.
            if mount.sub_path.as_deref().is_some_and(|p| !p.is_empty())
                || mount.sub_path_expr.is_some()
                || mount.read_only == Some(true)
            {
                return Err(VolumeError::Unsupported {
                    volume: mount.name.clone(),
                    kind: "persistentVolumeClaim mounted with subPath or readOnly".into(),
                });
            }
            out.claims
                .push((claim.claim_name.clone(), mount_path.to_owned()));
            continue;
        }
        let contents = match volume {
            Ok(volume) => volume_files(source, namespace, pod, container, volume)
                .await
                .map_err(|error| match error {
                    Resolve::Env(source) => VolumeError::Source {
                        volume: volume.name.clone(),
                        source,
                    },
                    Resolve::Volume(error) => error,
                }),
            Err(error) => Err(error),
        };
        let contents = if mount_path == SERVICE_ACCOUNT_MOUNT {
            // The token never leaves; `ca.crt` and `namespace` are no credentials and go. A
            // volume that cannot be read here (a cluster without the `kube-root-ca.crt`
            // ConfigMap, say) is left out whole rather than hold the pod.
            out.skipped.push(mount.mount_path.clone());
            if let Ok(Some((mut files, _))) = contents {
                // Only the two files that are no credential, whatever the volume maps where.
                files.retain(|(path, _, _)| SERVICE_ACCOUNT_FILES.contains(&path.as_str()));
                let mut placed = Volumes::default();
                place(&mut placed, mount, mount_path, files)?;
                out.service_account.extend(placed.files);
            }
            continue;
        } else {
            contents?
        };
        let Some((contents, token_skipped)) = contents else {
            out.directories.push(mount_path.to_owned());
            continue;
        };
        if token_skipped {
            out.skipped.push(mount.mount_path.clone());
        }
        place(&mut out, mount, mount_path, contents)?;
    }
    check_sizes(&out.files)?;
    check_sizes(&out.service_account)?;
    Ok(out)
}

fn check_sizes(files: &[MountedFile]) -> Result<(), VolumeError> {
    if let Some(big) = files.iter().find(|f| f.content.len() > MAX_FILE_BYTES) {
        return Err(VolumeError::TooLarge {
            what: format!("{} has {} bytes", big.path, big.content.len()),
        });
    }
    let total: usize = files.iter().map(|f| f.content.len()).sum();
    if total > MAX_TOTAL_BYTES {
        return Err(VolumeError::TooLarge {
            what: format!("{} files with {total} bytes", files.len()),
        });
    }
    Ok(())
}

/// Maps a volume's files (relative paths) onto the mount, honouring `subPath`.
fn place(
    out: &mut Volumes,
    mount: &VolumeMount,
    mount_path: &str,
    contents: Contents,
) -> Result<(), VolumeError> {
    let sub_path = mount
        .sub_path
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('/'));
    let mut placed = false;
    for (relative, content, mode) in contents {
        check_relative(&relative)?;
        let target = match sub_path {
            None => format!("{mount_path}/{relative}"),
            Some(sub) if relative == sub => mount_path.to_owned(),
            Some(sub) => match relative.strip_prefix(sub).and_then(|r| r.strip_prefix('/')) {
                Some(rest) => format!("{mount_path}/{rest}"),
                None => continue,
            },
        };
        placed = true;
        out.files.push(MountedFile {
            path: target,
            content,
            mode: u32::try_from(mode & 0o777).unwrap_or(0o644),
        });
    }
    if !placed {
        out.directories.push(mount_path.to_owned());
    }
    Ok(())
}

fn check_relative(path: &str) -> Result<(), VolumeError> {
    let plain = !path.is_empty()
        && !path.starts_with('/')
        && path.split('/').all(|part| !part.is_empty() && part != "..");
    if plain {
        Ok(())
    } else {
        Err(VolumeError::BadPath(path.to_owned()))
    }
}

enum Resolve {
    Env(EnvError),
    Volume(VolumeError),
}

impl From<EnvError> for Resolve {
    fn from(error: EnvError) -> Self {
        Resolve::Env(error)
    }
}

/// A volume's files: relative path, content, mode.
type Contents = Vec<(String, Vec<u8>, i32)>;

/// The files of one volume, and whether a service-account token source was left out; `None`
/// for an emptyDir.
async fn volume_files(
    source: &impl EnvSource,
    namespace: &str,
    pod: &Pod,
    container: &Container,
    volume: &Volume,
) -> Result<Option<(Contents, bool)>, Resolve> {
    if volume.empty_dir.is_some() {
        return Ok(None);
    }
    let mut files = Vec::new();
    let mut token_skipped = false;
    if let Some(cm) = &volume.config_map {
        let default_mode = cm.default_mode.unwrap_or(DEFAULT_MODE);
        let object = Object {
            kind: Kind::ConfigMap,
            name: &cm.name,
            items: cm.items.as_deref(),
            optional: cm.optional.unwrap_or(false),
        };
        object
            .files(source, namespace, default_mode, &mut files)
            .await?;
    } else if let Some(secret) = &volume.secret {
        let default_mode = secret.default_mode.unwrap_or(DEFAULT_MODE);
        let object = Object {
            kind: Kind::Secret,
            name: secret.secret_name.as_deref().unwrap_or_default(),
            items: secret.items.as_deref(),
            optional: secret.optional.unwrap_or(false),
        };
        object
            .files(source, namespace, default_mode, &mut files)
            .await?;
    } else if let Some(downward) = &volume.downward_api {
        let default_mode = downward.default_mode.unwrap_or(DEFAULT_MODE);
        for item in downward.items.iter().flatten() {
            files.push(downward_file(pod, container, item, default_mode)?);
        }
    } else if let Some(projected) = &volume.projected {
        let default_mode = projected.default_mode.unwrap_or(DEFAULT_MODE);
        for projection in projected.sources.iter().flatten() {
            if let Some(cm) = &projection.config_map {
                config_map_projection(cm)
                    .files(source, namespace, default_mode, &mut files)
                    .await?;
            } else if let Some(secret) = &projection.secret {
                secret_projection(secret)
                    .files(source, namespace, default_mode, &mut files)
                    .await?;
            } else if let Some(downward) = &projection.downward_api {
                for item in downward.items.iter().flatten() {
                    files.push(downward_file(pod, container, item, default_mode)?);
                }
            } else if projection.service_account_token.is_some() {
                token_skipped = true;
            } else {
                return Err(Resolve::Volume(VolumeError::Unsupported {
                    volume: volume.name.clone(),
                    kind: "projected (with an unsupported source)".into(),
                }));
            }
        }
    } else {
        return Err(Resolve::Volume(VolumeError::Unsupported {
            volume: volume.name.clone(),
            kind: volume_kind(volume),
        }));
    }
    Ok(Some((files, token_skipped)))
}

fn config_map_projection(cm: &ConfigMapProjection) -> Object<'_> {
    Object {
        kind: Kind::ConfigMap,
        name: &cm.name,
        items: cm.items.as_deref(),
        optional: cm.optional.unwrap_or(false),
    }
}

fn secret_projection(secret: &SecretProjection) -> Object<'_> {
    Object {
        kind: Kind::Secret,
        name: &secret.name,
        items: secret.items.as_deref(),
        optional: secret.optional.unwrap_or(false),
    }
}

/// A ConfigMap or Secret as a volume source.
struct Object<'a> {
    kind: Kind,
    name: &'a str,
    items: Option<&'a [KeyToPath]>,
    optional: bool,
}

impl Object<'_> {
    async fn files(
        &self,
        source: &impl EnvSource,
        namespace: &str,
        default_mode: i32,
        files: &mut Contents,
    ) -> Result<(), EnvError> {
        let Some(data) = env::fetch_bytes(source, self.kind, namespace, self.name).await? else {
            if self.optional {
                return Ok(());
            }
            return Err(EnvError::MissingObject {
                kind: self.kind.name(),
                name: self.name.to_owned(),
            });
        };
        match self.items {
            None => files.extend(
                data.into_iter()
                    .map(|(key, value)| (key, value, default_mode)),
            ),
            Some(items) => {
                for item in items {
                    match data.get(&item.key) {
                        Some(value) => files.push((
                            item.path.clone(),
                            value.clone(),
                            item.mode.unwrap_or(default_mode),
                        )),
                        None if self.optional => {}
                        None => {
                            return Err(EnvError::MissingKey {
                                kind: self.kind.name(),
                                name: self.name.to_owned(),
                                key: item.key.clone(),
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// One downwardAPI file; whole `metadata.labels`/`annotations` are written as the kubelet
/// does (`key="value"` lines, sorted).
fn downward_file(
    pod: &Pod,
    container: &Container,
    item: &DownwardAPIVolumeFile,
    default_mode: i32,
) -> Result<(String, Vec<u8>, i32), EnvError> {
    let mode = item.mode.unwrap_or(default_mode);
    let content = if let Some(field) = &item.field_ref {
        match field.field_path.as_str() {
            "metadata.labels" => key_value_lines(pod.metadata.labels.as_ref()),
            "metadata.annotations" => key_value_lines(pod.metadata.annotations.as_ref()),
            path => env::field_value(pod, path)?,
        }
    } else if let Some(resource) = &item.resource_field_ref {
        env::resource_value(container, &resource.resource)
    } else {
        String::new()
    };
    Ok((item.path.clone(), content.into_bytes(), mode))
}

fn key_value_lines(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(key, value)| format!("{key}={value:?}\n"))
        .collect()
}

/// The volume's source kind as the API names it (`persistentVolumeClaim`, `hostPath`, …).
fn volume_kind(volume: &Volume) -> String {
    serde_json::to_value(volume)
        .ok()
        .and_then(|value| {
            value
                .as_object()?
                .keys()
                .find(|key| key.as_str() != "name")
                .cloned()
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::pods::inputs::env::tests::{Maps, map};
    use serde_json::json;

    fn source() -> Maps {
        Maps {
            secrets: [(
                "creds".to_owned(),
                [("token".to_owned(), vec![0, 159, 146, 150])].into(),
            )]
            .into(),
            config_maps: [(
                "settings".to_owned(),
                map(&[("app.yaml", "lr: 0.1\n"), ("other", "x")]),
            )]
            .into(),
        }
    }

    fn pod(volumes: serde_json::Value, mounts: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": "u-1",
                         "labels": {"team": "vision", "app": "train"}},
            "spec": {"volumes": volumes, "containers": [{
                "name": "main", "image": "img", "volumeMounts": mounts,
                "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "8Gi"}}}]}
        }))
        .unwrap()
    }

    async fn run(pod: &Pod) -> Result<Volumes, VolumeError> {
        resolve(&source(), pod, &pod.spec.as_ref().unwrap().containers[0]).await
    }

    fn file<'a>(volumes: &'a Volumes, path: &str) -> &'a MountedFile {
        volumes
            .files
            .iter()
            .find(|f| f.path == path)
            .unwrap_or_else(|| panic!("no {path} in {volumes:?}"))
    }

    #[tokio::test]
    async fn config_map_secret_and_downward_volumes_become_files() {
        let pod = pod(
            json!([
                {"name": "cfg", "configMap": {"name": "settings"}},
                {"name": "sec", "secret": {"secretName": "creds", "defaultMode": 0o400,
                 "items": [{"key": "token", "path": "keys/token"}]}},
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "mem", "resourceFieldRef": {"resource": "limits.memory"}, "mode": 0o600}]}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "token", "secret": {"secretName": "default-token-abcde"}}
            ]),
            json!([
                {"name": "cfg", "mountPath": "/etc/app/"},
                {"name": "sec", "mountPath": "/secrets"},
                {"name": "info", "mountPath": "/etc/podinfo"},
                {"name": "scratch", "mountPath": "/scratch"},
                {"name": "cfg", "mountPath": "/opt/app.yaml", "subPath": "app.yaml"},
                {"name": "token", "mountPath": SERVICE_ACCOUNT_MOUNT}
            ]),
        );
        let volumes = run(&pod).await.unwrap();
        assert_eq!(file(&volumes, "/etc/app/app.yaml").content, b"lr: 0.1\n");
        assert_eq!(file(&volumes, "/etc/app/other").mode, 0o644);
        let token = file(&volumes, "/secrets/keys/token");
        assert_eq!(
            token.content,
            vec![0, 159, 146, 150],
            "bytes kept as they are"
        );
        assert_eq!(token.mode, 0o400);
        assert_eq!(
            file(&volumes, "/etc/podinfo/labels").content,
            b"app=\"train\"\nteam=\"vision\"\n"
        );
        assert_eq!(file(&volumes, "/etc/podinfo/name").content, b"train");
        assert_eq!(file(&volumes, "/etc/podinfo/mem").content, b"8Gi");
        assert_eq!(file(&volumes, "/etc/podinfo/mem").mode, 0o600);
        assert_eq!(file(&volumes, "/opt/app.yaml").content, b"lr: 0.1\n");
        assert_eq!(volumes.files.len(), 7, "{volumes:?}");
        assert_eq!(volumes.directories, ["/scratch"]);
        assert_eq!(volumes.skipped, [SERVICE_ACCOUNT_MOUNT]);
        assert!(
            !format!("{volumes:?}").contains("lr: 0.1"),
            "no contents in logs"
        );
    }

    /// Both forms of the service-account mount (the legacy token Secret, and the projected
    /// `kube-api-access` volume) ship `ca.crt` and `namespace`, never the token.
    #[tokio::test]
    async fn the_service_account_mount_keeps_its_ca_and_namespace_but_not_the_token() {
        let mut source = source();
        source.secrets.insert(
            "default-token-abcde".to_owned(),
            [
                ("token".to_owned(), b"secret-jwt".to_vec()),
                ("ca.crt".to_owned(), b"CA PEM".to_vec()),
                ("namespace".to_owned(), b"ml".to_vec()),
            ]
            .into(),
        );
        source
            .config_maps
            .insert("kube-root-ca.crt".to_owned(), map(&[("ca.crt", "CA PEM")]));
        let legacy = pod(
            json!([{"name": "sa", "secret": {"secretName": "default-token-abcde"}}]),
            json!([{"name": "sa", "mountPath": SERVICE_ACCOUNT_MOUNT}]),
        );
        let remapped = pod(
            json!([{"name": "sa", "secret": {"secretName": "default-token-abcde", "items": [
                {"key": "token", "path": "jwt"}, {"key": "ca.crt", "path": "ca.crt"},
                {"key": "namespace", "path": "namespace"}]}}]),
            json!([{"name": "sa", "mountPath": SERVICE_ACCOUNT_MOUNT}]),
        );
        let projected = pod(
            json!([{"name": "kube-api-access-x1", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
            ]}}]),
            json!([{"name": "kube-api-access-x1", "mountPath": SERVICE_ACCOUNT_MOUNT}]),
        );
        for pod in [legacy, remapped, projected] {
            let container = pod.spec.as_ref().unwrap().containers[0].clone();
            let volumes = resolve(&source, &pod, &container).await.unwrap();
            assert!(volumes.files.is_empty(), "{volumes:?}");
            let written = &volumes.service_account;
            let mut paths: Vec<&str> = written.iter().map(|f| f.path.as_str()).collect();
            paths.sort();
            let ca = format!("{SERVICE_ACCOUNT_MOUNT}/ca.crt");
            let namespace = format!("{SERVICE_ACCOUNT_MOUNT}/namespace");
            assert_eq!(paths, [ca.as_str(), namespace.as_str()], "{volumes:?}");
            let ca_file = written.iter().find(|f| f.path == ca).unwrap();
            assert_eq!(ca_file.content, b"CA PEM");
            assert!(
                !written.iter().any(|f| f.content == b"secret-jwt"),
                "the token stays in the cluster"
            );
            assert_eq!(volumes.skipped, [SERVICE_ACCOUNT_MOUNT], "and it is said");
        }
    }

    #[tokio::test]
    async fn missing_objects_and_keys_follow_optional() {
        let missing = pod(
            json!([{"name": "cfg", "configMap": {"name": "gone"}}]),
            json!([{"name": "cfg", "mountPath": "/cfg"}]),
        );
        assert!(matches!(
            run(&missing).await,
            Err(VolumeError::Source {
                source: EnvError::MissingObject { .. },
                ..
            })
        ));
        let optional = pod(
            json!([{"name": "cfg", "configMap": {"name": "gone", "optional": true}}]),
            json!([{"name": "cfg", "mountPath": "/cfg"}]),
        );
        let volumes = run(&optional).await.unwrap();
        assert!(volumes.files.is_empty());
        assert_eq!(volumes.directories, ["/cfg"]);
        let missing_key = pod(
            json!([{"name": "cfg", "configMap": {"name": "settings",
                    "items": [{"key": "nope", "path": "nope"}]}}]),
            json!([{"name": "cfg", "mountPath": "/cfg"}]),
        );
        assert!(matches!(
            run(&missing_key).await,
            Err(VolumeError::Source {
                source: EnvError::MissingKey { .. },
                ..
            })
        ));
    }

    #[tokio::test]
    async fn projected_sources_merge_and_other_kinds_are_refused() {
        let projected = pod(
            json!([{"name": "all", "projected": {"sources": [
                {"configMap": {"name": "settings", "items": [{"key": "other", "path": "o"}]}},
                {"secret": {"name": "creds"}},
                {"downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                {"serviceAccountToken": {"path": "token-sa", "expirationSeconds": 3600}}
            ]}}]),
            json!([{"name": "all", "mountPath": "/all"}]),
        );
        let volumes = run(&projected).await.unwrap();
        let paths: Vec<&str> = volumes.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["/all/o", "/all/token", "/all/ns"]);
        assert_eq!(
            volumes.skipped,
            ["/all"],
            "the token source is left out, and said so"
        );
        let claim = pod(
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]),
            json!([{"name": "data", "mountPath": "/data"}]),
        );
        // A claim is no files: it is the instance's network volume, judged at create.
        let claimed = run(&claim).await.unwrap();
        assert_eq!(claimed.claims, [("data".to_owned(), "/data".to_owned())]);
        assert!(claimed.files.is_empty() && claimed.directories.is_empty());
        let host = pod(
            json!([{"name": "h", "hostPath": {"path": "/x"}}]),
            json!([{"name": "h", "mountPath": "/h"}]),
        );
        assert_eq!(
            run(&host).await,
            Err(VolumeError::Unsupported {
                volume: "h".into(),
                kind: "hostPath".into()
            })
        );
        let escape = pod(
            json!([{"name": "cfg", "configMap": {"name": "settings",
                    "items": [{"key": "other", "path": "../../etc/passwd"}]}}]),
            json!([{"name": "cfg", "mountPath": "/cfg"}]),
        );
        assert!(matches!(run(&escape).await, Err(VolumeError::BadPath(_))));
    }

    #[tokio::test]
    async fn files_too_large_for_env_are_refused_before_any_create() {
        let mut source = source();
        source.config_maps.insert(
            "big".into(),
            [("model.bin".to_owned(), vec![0u8; MAX_FILE_BYTES + 1])].into(),
        );
        let pod = pod(
            json!([{"name": "big", "configMap": {"name": "big"}}]),
            json!([{"name": "big", "mountPath": "/big"}]),
        );
        let error = resolve(&source, &pod, &pod.spec.as_ref().unwrap().containers[0])
            .await
            .unwrap_err();
        assert!(matches!(error, VolumeError::TooLarge { .. }), "{error}");
        assert!(error.to_string().contains("/big/model.bin"), "{error}");
    }
}
