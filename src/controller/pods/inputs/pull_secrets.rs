//! Registry credentials for a pod's image, from its `imagePullSecrets` as a kubelet reads them
//! (`kubernetes.io/dockerconfigjson` or the older `dockercfg`): clouds that pull the image
//! themselves (Vast.ai's `image_login`) get the one login matching the image's registry.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

use crate::controller::pods::inputs::env::{EnvError, EnvSource, Kind, fetch_bytes};
use crate::provider::request::PullCredential;

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    /// base64 of `user:password`.
    #[serde(default)]
    auth: Option<String>,
}

/// Docker Hub's many spellings, as one host.
const DOCKER_HUB: &str = "docker.io";

/// `https://index.docker.io/v1/`, `ghcr.io/org`, `registry:5000` → the host part, with every
/// Docker Hub spelling as `docker.io`.
pub(crate) fn normalise_registry(key: &str) -> String {
    let without_scheme = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = without_scheme
        .split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" | "docker.io" => {
            DOCKER_HUB.to_owned()
        }
        _ => host,
    }
}

/// The registry an image reference pulls from: its first component when that names a host
/// (a `.` or `:` in it, or `localhost`), else Docker Hub.
pub(crate) fn image_registry(image: &str) -> String {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            normalise_registry(first)
        }
        _ => DOCKER_HUB.to_owned(),
    }
}

/// The logins a docker config holds (`{"auths": {...}}`, or the old bare map); entries without
/// a user and password are skipped.
pub(crate) fn parse_docker_config(bytes: &[u8]) -> Vec<PullCredential> {
    let auths = match serde_json::from_slice::<DockerConfig>(bytes) {
        Ok(config) if !config.auths.is_empty() => config.auths,
        _ => serde_json::from_slice::<BTreeMap<String, AuthEntry>>(bytes).unwrap_or_default(),
    };
    auths
        .into_iter()
        .filter_map(|(registry, entry)| {
            let (username, password) = match (entry.username, entry.password, entry.auth) {
                (Some(user), Some(password), _) if !user.is_empty() => (user, password),
                (_, _, Some(auth)) => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .ok()?;
                    let text = String::from_utf8(decoded).ok()?;
                    let (user, password) = text.split_once(':')?;
                    (user.to_owned(), password.to_owned())
                }
                _ => return None,
            };
            (!username.is_empty() && !password.is_empty()).then(|| PullCredential {
                registry: normalise_registry(&registry),
                username,
                password,
            })
        })
        .collect()
}

/// The login for `image` among `credentials`, if one names its registry.
pub(crate) fn credential_for<'a>(
    image: &str,
    credentials: &'a [PullCredential],
) -> Option<&'a PullCredential> {
    let registry = image_registry(image);
    credentials.iter().find(|c| c.registry == registry)
}

/// Every login of the pod's `imagePullSecrets`, in order. A missing Secret is skipped, as a
/// kubelet does (the pull may still work); a Secret that cannot be read is an error.
pub(crate) async fn logins(
    source: &impl EnvSource,
    pod: &Pod,
) -> Result<Vec<PullCredential>, EnvError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut credentials = Vec::new();
    let names = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.image_pull_secrets.as_ref())
        .into_iter()
        .flatten()
        .map(|reference| reference.name.as_str());
    for name in names {
        let Some(data) = fetch_bytes(source, Kind::Secret, namespace, name).await? else {
            continue;
        };
        for key in [".dockerconfigjson", ".dockercfg"] {
            if let Some(bytes) = data.get(key) {
                credentials.extend(parse_docker_config(bytes));
            }
        }
    }
    Ok(credentials)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_are_read_as_a_kubelet_reads_them() {
        assert_eq!(image_registry("pytorch/pytorch:2.4"), "docker.io");
        assert_eq!(image_registry("ubuntu"), "docker.io");
        assert_eq!(image_registry("ghcr.io/org/app:1"), "ghcr.io");
        assert_eq!(image_registry("localhost/app"), "localhost");
        assert_eq!(image_registry("registry:5000/app"), "registry:5000");
        assert_eq!(
            normalise_registry("https://index.docker.io/v1/"),
            "docker.io"
        );
        assert_eq!(normalise_registry("GHCR.io"), "ghcr.io");
    }

    #[test]
    fn docker_configs_give_logins_and_the_image_picks_one() {
        let auth = base64::engine::general_purpose::STANDARD.encode("bot:t0ken");
        let config = serde_json::json!({"auths": {
            "ghcr.io": {"username": "me", "password": "s3cr3t"},
            "https://index.docker.io/v1/": {"auth": auth},
            "empty.example": {}
        }});
        let credentials = parse_docker_config(config.to_string().as_bytes());
        assert_eq!(credentials.len(), 2, "{credentials:?}");
        let ghcr = credential_for("ghcr.io/org/app:1", &credentials).unwrap();
        assert_eq!(
            (ghcr.username.as_str(), ghcr.password.as_str()),
            ("me", "s3cr3t")
        );
        let hub = credential_for("org/app", &credentials).unwrap();
        assert_eq!(
            (hub.username.as_str(), hub.password.as_str()),
            ("bot", "t0ken")
        );
        assert!(credential_for("quay.io/org/app", &credentials).is_none());
        assert!(!format!("{credentials:?}").contains("s3cr3t"));
        // The old bare map, and garbage.
        let old = serde_json::json!({"quay.io": {"auth": auth}});
        assert_eq!(
            parse_docker_config(old.to_string().as_bytes())[0].registry,
            "quay.io"
        );
        assert!(parse_docker_config(b"not json").is_empty());
    }
}
