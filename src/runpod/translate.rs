//! The pure translation of a Kubernetes pod's container into a RunPod `CreatePodRequest`.
//!
//! REST v2 has no entrypoint override: only `args`, a string handed to the image's
//! ENTRYPOINT. Kubernetes `command` and `args` are therefore joined, shell-quoted, into
//! `args`. For images that define only a CMD (most CUDA and PyTorch images) this behaves like
//! Kubernetes: the pod runs `command args…`. For images with an ENTRYPOINT, Kubernetes would
//! replace the ENTRYPOINT with `command`, while RunPod passes `command args…` to the
//! ENTRYPOINT as arguments; such images need a wrapper image or a RunPod template.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use runpod_contract::env::command_words;
use runpod_contract::{self as contract, DISK, PORTS, REGISTRY_AUTH_ID, TEMPLATE_ID};

use super::model::{CreatePodRequest, GpuSpec};
use super::select::Candidate;
use crate::provider::{TAG_CLUSTER, TAG_NAMESPACE, TAG_NODE, TAG_POD_NAME, TAG_POD_UID};

/// Set (`internal`) when the controller opened `22/tcp` for its own SSH (exec, port-forward)
/// and not because the pod asked: that port is then no endpoint of the pod.
pub(crate) const TAG_SSH: &str = "RUNPOD_KUBELET_SSH";
/// The env variable RunPod's images read the authorized SSH key from.
pub(crate) const PUBLIC_KEY_ENV: &str = "PUBLIC_KEY";

/// How the internet reaches `port` of pod `instance_id`: HTTP ports through RunPod's HTTPS
/// proxy, TCP ports as a public IP and port mapping.
pub(crate) fn endpoint(instance_id: &str, port: &contract::PortSpec) -> String {
    match port.protocol {
        contract::PortProtocol::Http => format!(
            "https://{instance_id}-{}.proxy.runpod.net ({port})",
            port.port
        ),
        contract::PortProtocol::Tcp => format!("{port} on a public IP and port"),
    }
}

/// RunPod accepts names of up to 191 characters (v1 schema); we stay under it.
pub(crate) const MAX_NAME_LEN: usize = 191;

/// Who is creating the pod.
#[derive(Debug, Clone)]
pub(crate) struct Origin<'a> {
    pub cluster_id: &'a str,
    pub node_name: &'a str,
    /// The node's SSH public key, for exec and port-forward (`--exec-ssh`); `None`: no SSH.
    pub ssh_public_key: Option<&'a str>,
}

/// Why a pod cannot be translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TranslateError {
    #[error("the pod has no uid yet")]
    NoUid,
    #[error("the pod has no containers")]
    NoContainer,
    #[error("RunPod runs one container per pod; this pod has {0}")]
    SeveralContainers(usize),
    #[error("container {0:?} has no image and the pod sets no {TEMPLATE_ID}")]
    NoImage(String),
    #[error("annotation {annotation}: {message}")]
    Annotation {
        annotation: &'static str,
        message: String,
    },
    #[error("command/args cannot be passed to RunPod: {0}")]
    Args(String),
}

/// The deterministic RunPod name of a Kubernetes pod: namespace, name and UID. The UID makes
/// it unique per pod incarnation; it is what the idempotency lookup searches for.
pub(crate) fn runpod_name(pod: &Pod) -> Result<String, TranslateError> {
    let uid = pod
        .metadata
        .uid
        .as_deref()
        .filter(|uid| !uid.is_empty())
        .ok_or(TranslateError::NoUid)?;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or("pod");
    let budget = MAX_NAME_LEN.saturating_sub(uid.len() + 2);
    let mut prefix = format!("{namespace}-{name}");
    if prefix.len() > budget {
        let mut end = budget;
        while !prefix.is_char_boundary(end) {
            end -= 1;
        }
        prefix.truncate(end);
    }
    Ok(format!("{prefix}-{uid}"))
}

/// Joins Kubernetes `command` and `args` into v2's single `args` string, POSIX-shell-quoted.
/// `None` when neither is set (the image's own CMD runs).
pub(crate) fn joined_args(
    container: &Container,
    env: &BTreeMap<String, String>,
) -> Result<Option<String>, TranslateError> {
    let words = command_words(container, env);
    if words.is_empty() {
        return Ok(None);
    }
    shlex::try_join(words.iter().map(String::as_str))
        .map(Some)
        .map_err(|e| TranslateError::Args(e.to_string()))
}

/// Ports for RunPod: the effective `runpod.io/ports` the webhook wrote, else detected from
/// the container's declared ports with the webhook's own rule (TCP only, at most 10 http).
pub(crate) fn ports(pod: &Pod) -> Result<Vec<String>, TranslateError> {
    let specs =
        runpod_contract::policy::ports(pod).map_err(|message| TranslateError::Annotation {
            annotation: PORTS,
            message,
        })?;
    Ok(specs
        .into_iter()
        .map(|spec| contract::format_ports(&[spec]))
        .collect())
}

/// The create request for `pod` on `candidate`; `env` is the container's environment as
/// [`runpod_contract::env::ResolvedEnv::container_env`] expanded it.
pub(crate) fn create_request(
    pod: &Pod,
    env: &BTreeMap<String, String>,
    origin: &Origin<'_>,
    candidate: &Candidate,
) -> Result<CreatePodRequest, TranslateError> {
    let spec = pod.spec.as_ref().ok_or(TranslateError::NoContainer)?;
    let container = match spec.containers.as_slice() {
        [] => return Err(TranslateError::NoContainer),
        [container] => container,
        several => return Err(TranslateError::SeveralContainers(several.len())),
    };
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let annotation = |key: &str| {
        annotations
            .get(key)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let template_id = annotation(TEMPLATE_ID);
    let image = container
        .image
        .clone()
        .filter(|image| !image.trim().is_empty());
    if image.is_none() && template_id.is_none() {
        return Err(TranslateError::NoImage(container.name.clone()));
    }
    let disk = annotation(DISK)
        .map(|value| {
            contract::parse_disk(&value).map_err(|message| TranslateError::Annotation {
                annotation: DISK,
                message,
            })
        })
        .transpose()?;

    let mut env = env.clone();
    let args = joined_args(container, &env)?;
    let uid = pod.metadata.uid.clone().ok_or(TranslateError::NoUid)?;
    for (key, value) in [
        (TAG_CLUSTER, origin.cluster_id.to_owned()),
        (TAG_NODE, origin.node_name.to_owned()),
        (TAG_POD_UID, uid),
        (
            TAG_NAMESPACE,
            pod.metadata.namespace.clone().unwrap_or_default(),
        ),
        (TAG_POD_NAME, pod.metadata.name.clone().unwrap_or_default()),
    ] {
        env.insert(key.to_owned(), value);
    }
    let mut ports = ports(pod)?;
    // `none` means nothing public: not even the controller's own SSH port.
    let none = contract::exposes_nothing(pod.metadata.annotations.as_ref(), false);
    if let Some(key) = origin.ssh_public_key.filter(|_| !none) {
        // RunPod's images start sshd with this key (one per line: a key of the pod's own
        // stays authorized); the port is ours unless the pod asked.
        let keys = match env.get(PUBLIC_KEY_ENV).map(|own| own.trim()) {
            Some(own) if !own.is_empty() => format!("{own}\n{key}"),
            _ => key.to_owned(),
        };
        env.insert(PUBLIC_KEY_ENV.to_owned(), keys);
        if !ports.iter().any(|p| p == "22/tcp") {
            ports.push("22/tcp".to_owned());
            env.insert(TAG_SSH.to_owned(), "internal".to_owned());
        }
    }

    Ok(CreatePodRequest {
        name: runpod_name(pod)?,
        image,
        template_id,
        gpu: GpuSpec {
            id: candidate.gpu_id.clone(),
            count: candidate.gpu_count.max(1),
        },
        cloud: candidate.cloud.as_str().to_owned(),
        data_center_ids: candidate.data_center_ids.clone(),
        disk,
        ports,
        env,
        args,
        registry: annotation(REGISTRY_AUTH_ID),
        mounts: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_ports_are_reached_through_the_proxy_and_tcp_ports_directly() {
        let ports = contract::parse_ports("8888/http,22/tcp").unwrap();
        assert_eq!(
            endpoint("abc123", &ports[0]),
            "https://abc123-8888.proxy.runpod.net (8888/http)"
        );
        assert_eq!(
            endpoint("abc123", &ports[1]),
            "22/tcp on a public IP and port"
        );
    }
    use runpod_contract::CloudType;
    use runpod_contract::env::ResolvedEnv;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn gpu_pod(container: serde_json::Value, annotations: serde_json::Value) -> Pod {
        pod(json!({
            "metadata": {"name": "train-0", "namespace": "ml", "uid": "0d4c5e1a-7b7e-4c1e-9a55-3f1f2b9e8c01",
                          "annotations": annotations},
            "spec": {"containers": [container]}
        }))
    }

    fn candidate() -> Candidate {
        Candidate {
            gpu_id: "NVIDIA GeForce RTX 4090".into(),
            gpu_count: 2,
            cloud: CloudType::Community,
            data_center_ids: vec!["EU-RO-1".into()],
            price_per_gpu: 0.31,
            price_per_hour: 0.62,
            memory_gb: Some(24),
        }
    }

    const ORIGIN: Origin<'static> = Origin {
        cluster_id: "prod-eu",
        node_name: "virtual-runpod",
        ssh_public_key: None,
    };

    #[test]
    fn translates_a_gpu_container() {
        let pod = gpu_pod(
            json!({"name": "main", "image": "pytorch/pytorch:2.4.0",
                   "command": ["python", "-c"], "args": ["print('hi there')", "$(EPOCHS)", "$$(LITERAL)"],
                   "env": [{"name": "EPOCHS", "value": "3"},
                           {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                           {"name": "OPTIONAL", "valueFrom": {"secretKeyRef": {"name": "s", "key": "gone", "optional": true}}},
                           {"name": "MSG", "value": "epochs=$(EPOCHS) from=$(FROM_CM) $(UNDEFINED)"}],
                   "ports": [{"containerPort": 8888}, {"containerPort": 2222, "name": "ssh"}]}),
            json!({"runpod.io/disk": "40", "runpod.io/container-registry-auth-id": "reg-1",
                   "runpod.io/templateId": "tmpl-9"}),
        );
        let resolved = ResolvedEnv {
            env_from: BTreeMap::from([
                ("FROM_CM".into(), "cm".into()),
                ("EPOCHS".into(), "1".into()),
            ]),
            value_from: BTreeMap::from([("TOKEN".into(), "s3cr3t".into())]),
        };
        let env = resolved.container_env(&pod.spec.as_ref().unwrap().containers[0]);
        let request = create_request(&pod, &env, &ORIGIN, &candidate()).unwrap();
        assert_eq!(
            request.name,
            "ml-train-0-0d4c5e1a-7b7e-4c1e-9a55-3f1f2b9e8c01"
        );
        assert_eq!(request.image.as_deref(), Some("pytorch/pytorch:2.4.0"));
        assert_eq!(request.template_id.as_deref(), Some("tmpl-9"));
        assert_eq!(request.registry.as_deref(), Some("reg-1"));
        assert_eq!(request.disk, Some(40));
        assert_eq!(request.gpu.count, 2);
        assert_eq!(request.cloud, "COMMUNITY");
        assert_eq!(request.data_center_ids, vec!["EU-RO-1"]);
        assert_eq!(
            request.args.as_deref(),
            Some(r#"python -c "print('hi there')" 3 '$(LITERAL)'"#)
        );
        // The joined string splits back into exactly the Kubernetes words.
        assert_eq!(
            shlex::split(request.args.as_deref().unwrap()).unwrap(),
            vec!["python", "-c", "print('hi there')", "3", "$(LITERAL)"]
        );
        // env entries override envFrom, expand against earlier values, skip missing optionals.
        assert_eq!(request.env["EPOCHS"], "3");
        assert_eq!(request.env["TOKEN"], "s3cr3t");
        assert!(
            !format!("{request:?}").contains("s3cr3t"),
            "Debug hides Secret values"
        );
        assert!(!request.env.contains_key("OPTIONAL"));
        assert_eq!(request.env["MSG"], "epochs=3 from=cm $(UNDEFINED)");
        assert_eq!(request.env[TAG_CLUSTER], "prod-eu");
        assert_eq!(request.env[TAG_NODE], "virtual-runpod");
        assert_eq!(
            request.env[TAG_POD_UID],
            "0d4c5e1a-7b7e-4c1e-9a55-3f1f2b9e8c01"
        );
        assert_eq!(request.env[TAG_NAMESPACE], "ml");
        // Without the annotation, ports are detected like the webhook does.
        assert_eq!(request.ports, vec!["8888/http", "2222/tcp"]);
        // The request is what the spec accepts: no nulls, gpu.count always present.
        let body = serde_json::to_value(&request).unwrap();
        assert_eq!(
            body["gpu"],
            json!({"id": "NVIDIA GeForce RTX 4090", "count": 2})
        );
    }

    #[test]
    fn the_nodes_ssh_key_and_an_internal_port_22_are_sent() {
        let origin = Origin {
            ssh_public_key: Some("ssh-ed25519 AAAAnode"),
            ..ORIGIN
        };
        let pod = gpu_pod(
            json!({"name": "main", "image": "img", "ports": [{"containerPort": 8888}]}),
            json!({}),
        );
        let request = create_request(&pod, &BTreeMap::new(), &origin, &candidate()).unwrap();
        assert_eq!(request.ports, vec!["8888/http", "22/tcp"]);
        assert_eq!(request.env[PUBLIC_KEY_ENV], "ssh-ed25519 AAAAnode");
        assert_eq!(request.env[TAG_SSH], "internal");
        // A pod that asked for 22/tcp and brings its own key: both keys, no internal tag.
        let pod = gpu_pod(
            json!({"name": "main", "image": "img"}),
            json!({"runpod.io/ports": "22/tcp"}),
        );
        let own = BTreeMap::from([(PUBLIC_KEY_ENV.to_owned(), "ssh-rsa AAAAmine".to_owned())]);
        let request = create_request(&pod, &own, &origin, &candidate()).unwrap();
        assert_eq!(request.ports, vec!["22/tcp"]);
        assert_eq!(
            request.env[PUBLIC_KEY_ENV],
            "ssh-rsa AAAAmine\nssh-ed25519 AAAAnode"
        );
        assert!(!request.env.contains_key(TAG_SSH));
        // Exec off: nothing of it.
        let request = create_request(&pod, &BTreeMap::new(), &ORIGIN, &candidate()).unwrap();
        assert!(!request.env.contains_key(PUBLIC_KEY_ENV));
    }

    /// Issue 41, item 13: `none` means nothing public, the controller's 22/tcp included.
    #[test]
    fn a_pod_that_exposes_none_gets_no_ssh_port_and_no_key() {
        let origin = Origin {
            ssh_public_key: Some("ssh-ed25519 AAAAnode"),
            ..ORIGIN
        };
        let pod = gpu_pod(
            json!({"name": "main", "image": "img", "ports": [{"containerPort": 8888}]}),
            json!({"runpod.io/ports": "none"}),
        );
        let request = create_request(&pod, &BTreeMap::new(), &origin, &candidate()).unwrap();
        assert!(request.ports.is_empty(), "{:?}", request.ports);
        assert!(!request.env.contains_key(PUBLIC_KEY_ENV));
        assert!(!request.env.contains_key(TAG_SSH));
    }

    #[test]
    fn annotated_ports_win_and_no_command_keeps_the_image_cmd() {
        let pod = gpu_pod(
            json!({"name": "main", "image": "img", "ports": [{"containerPort": 8888}]}),
            json!({"runpod.io/ports": "8000/http,22/tcp"}),
        );
        let request = create_request(&pod, &BTreeMap::new(), &ORIGIN, &candidate()).unwrap();
        assert_eq!(request.ports, vec!["8000/http", "22/tcp"]);
        assert_eq!(request.args, None);
        assert_eq!(request.disk, None);
        assert_eq!(request.registry, None);
    }

    #[test]
    fn user_env_cannot_forge_the_ownership_tags() {
        let pod = gpu_pod(
            json!({"name": "main", "image": "img", "env": [{"name": TAG_CLUSTER, "value": "someone-else"}]}),
            json!({}),
        );
        let request = create_request(&pod, &BTreeMap::new(), &ORIGIN, &candidate()).unwrap();
        assert_eq!(request.env[TAG_CLUSTER], "prod-eu");
    }

    #[test]
    fn refuses_what_runpod_cannot_run() {
        let no_uid = pod(
            json!({"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        );
        assert_eq!(
            create_request(&no_uid, &BTreeMap::new(), &ORIGIN, &candidate()),
            Err(TranslateError::NoUid)
        );
        let two = pod(json!({"metadata": {"name": "a", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "i"}, {"name": "d", "image": "i"}]}}));
        assert_eq!(
            create_request(&two, &BTreeMap::new(), &ORIGIN, &candidate()),
            Err(TranslateError::SeveralContainers(2))
        );
        let bad_disk = gpu_pod(
            json!({"name": "c", "image": "i"}),
            json!({"runpod.io/disk": "lots"}),
        );
        assert!(matches!(
            create_request(&bad_disk, &BTreeMap::new(), &ORIGIN, &candidate()),
            Err(TranslateError::Annotation {
                annotation: DISK,
                ..
            })
        ));
        let nul = gpu_pod(
            json!({"name": "c", "image": "i", "args": ["a\u{0}b"]}),
            json!({}),
        );
        assert!(matches!(
            create_request(&nul, &BTreeMap::new(), &ORIGIN, &candidate()),
            Err(TranslateError::Args(_))
        ));
    }

    #[test]
    fn names_are_deterministic_unique_and_bounded() {
        let long = "x".repeat(300);
        let pod = |name: &str, uid: &str| gpu_pod_named(name, uid);
        fn gpu_pod_named(name: &str, uid: &str) -> Pod {
            serde_json::from_value(
                json!({"metadata": {"name": name, "namespace": "ns", "uid": uid}}),
            )
            .unwrap()
        }
        let a = runpod_name(&pod("job-a", "uid-1")).unwrap();
        assert_eq!(a, runpod_name(&pod("job-a", "uid-1")).unwrap());
        assert_ne!(a, runpod_name(&pod("job-a", "uid-2")).unwrap());
        let bounded = runpod_name(&pod(&long, "0d4c5e1a-7b7e-4c1e-9a55-3f1f2b9e8c01")).unwrap();
        assert!(bounded.len() <= MAX_NAME_LEN);
        assert!(bounded.ends_with("-0d4c5e1a-7b7e-4c1e-9a55-3f1f2b9e8c01"));
    }
}
