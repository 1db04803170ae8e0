//! The pure translation of a Kubernetes pod into a Vast.ai create: one container, its image,
//! its environment (expanded once by the caller), its ports, and its command. Kubernetes
//! `command` replaces the image's entrypoint: in Vast.ai's `args` mode that is `onstart` (the
//! entrypoint) plus `args`; without a `command` the image's entrypoint stays and `args`
//! replaces its CMD.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use runpod_contract::PORTS;
use runpod_contract::env::command_words;

use super::label::Label;
use super::model::CreateRequest;
use crate::provider::{TAG_CLUSTER, TAG_NAMESPACE, TAG_NODE, TAG_POD_NAME, TAG_POD_UID};

/// Why a pod cannot be created on Vast.ai as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TranslateError {
    #[error("the pod has no containers")]
    NoContainer,
    #[error("Vast.ai runs one container per instance; this pod has {0}")]
    SeveralContainers(usize),
    #[error("container {0:?} has no image")]
    NoImage(String),
    #[error("annotation {annotation}: {message}")]
    Annotation {
        annotation: &'static str,
        message: String,
    },
}

/// The create for `pod`, labelled `label`, with `env` (the container's environment as
/// [`runpod_contract::env::ResolvedEnv::container_env`] expanded it) and `disk_gb`. The same
/// ownership tags as on RunPod go into the environment, after the user's (which cannot forge
/// them).
pub(crate) fn create_request(
    pod: &Pod,
    env: &BTreeMap<String, String>,
    label: &Label,
    disk_gb: u32,
) -> Result<CreateRequest, TranslateError> {
    let spec = pod.spec.as_ref().ok_or(TranslateError::NoContainer)?;
    let container = match spec.containers.as_slice() {
        [] => return Err(TranslateError::NoContainer),
        [container] => container,
        several => return Err(TranslateError::SeveralContainers(several.len())),
    };
    let image = container
        .image
        .clone()
        .filter(|image| !image.trim().is_empty())
        .ok_or_else(|| TranslateError::NoImage(container.name.clone()))?;
    let ports =
        runpod_contract::policy::ports(pod).map_err(|message| TranslateError::Annotation {
            annotation: PORTS,
            message,
        })?;
    let mut words = command_words(container, env);
    let entrypoint =
        if container.command.as_ref().is_some_and(|c| !c.is_empty()) && !words.is_empty() {
            Some(words.remove(0))
        } else {
            None
        };
    let args = (!words.is_empty() || entrypoint.is_some()).then_some(words);
    let mut env = env.clone();
    for (key, value) in [
        (TAG_CLUSTER, label.cluster().to_owned()),
        (TAG_NODE, label.node().to_owned()),
        (TAG_POD_UID, label.pod_uid().to_owned()),
        (
            TAG_NAMESPACE,
            pod.metadata.namespace.clone().unwrap_or_default(),
        ),
        (TAG_POD_NAME, pod.metadata.name.clone().unwrap_or_default()),
    ] {
        env.insert(key.to_owned(), value);
    }
    Ok(CreateRequest {
        image,
        disk_gb,
        label: label.to_string(),
        env,
        ports,
        entrypoint,
        args,
        // Registry credentials come from the pod's imagePullSecrets, read by the caller.
        registry: None,
        interruptible: None,
        price: None,
        price_cap: None,
    })
}

#[cfg(test)]
mod tests {
    use runpod_contract::env::ResolvedEnv;
    use runpod_contract::{PortProtocol, PortSpec};
    use serde_json::json;

    use super::*;

    fn pod(container: serde_json::Value, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "train-0", "namespace": "ml", "uid": "u-1", "annotations": annotations},
            "spec": {"containers": [container]}
        }))
        .unwrap()
    }

    fn label() -> Label {
        Label::new("prod-eu", "virtual-vastai", "u-1").unwrap()
    }

    #[test]
    fn a_command_becomes_the_entrypoint_and_args_follow() {
        let pod = pod(
            json!({"name": "main", "image": "pytorch/pytorch:2.4.0",
                   "command": ["python", "-c"], "args": ["print($(EPOCHS))", "$$(LITERAL)"],
                   "env": [{"name": "EPOCHS", "value": "3"},
                           {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                   "ports": [{"containerPort": 8888}, {"containerPort": 2222, "name": "ssh"}]}),
            json!({}),
        );
        let resolved = ResolvedEnv {
            env_from: BTreeMap::new(),
            value_from: BTreeMap::from([("TOKEN".to_owned(), "s3cr3t".to_owned())]),
        };
        let env = resolved.container_env(&pod.spec.as_ref().unwrap().containers[0]);
        let request = create_request(&pod, &env, &label(), 40).unwrap();
        assert_eq!(request.image, "pytorch/pytorch:2.4.0");
        assert_eq!(request.entrypoint.as_deref(), Some("python"));
        assert_eq!(
            request.args,
            Some(vec![
                "-c".to_owned(),
                "print(3)".to_owned(),
                "$(LITERAL)".to_owned()
            ])
        );
        assert_eq!(request.env["TOKEN"], "s3cr3t");
        assert_eq!(request.env[TAG_POD_UID], "u-1");
        assert_eq!(request.env[TAG_NAMESPACE], "ml");
        assert_eq!(request.label, "rpk:prod-eu:virtual-vastai:u-1");
        assert_eq!(request.disk_gb, 40);
        assert_eq!(
            request.ports,
            vec![
                PortSpec {
                    port: 8888,
                    protocol: PortProtocol::Http
                },
                PortSpec {
                    port: 2222,
                    protocol: PortProtocol::Tcp
                },
            ]
        );
    }

    #[test]
    fn args_alone_keep_the_image_entrypoint_and_annotated_ports_win() {
        let only_args = pod(
            json!({"name": "main", "image": "img", "args": ["serve"], "ports": [{"containerPort": 8888}]}),
            json!({"runpod.io/ports": "22/tcp"}),
        );
        let request = create_request(&only_args, &BTreeMap::new(), &label(), 20).unwrap();
        assert_eq!(request.entrypoint, None);
        assert_eq!(request.args, Some(vec!["serve".to_owned()]));
        assert_eq!(request.ports.len(), 1);
        assert_eq!(request.ports[0].port, 22);
        let plain = pod(json!({"name": "main", "image": "img"}), json!({}));
        let request = create_request(&plain, &BTreeMap::new(), &label(), 20).unwrap();
        assert_eq!((request.entrypoint, request.args), (None, None));
        let forged = pod(
            json!({"name": "main", "image": "img", "env": [{"name": TAG_CLUSTER, "value": "other"}]}),
            json!({}),
        );
        let env = BTreeMap::from([(TAG_CLUSTER.to_owned(), "other".to_owned())]);
        assert_eq!(
            create_request(&forged, &env, &label(), 20).unwrap().env[TAG_CLUSTER],
            "prod-eu"
        );
    }

    #[test]
    fn refuses_what_vastai_cannot_run() {
        let none: Pod =
            serde_json::from_value(json!({"metadata": {"uid": "u"}, "spec": {"containers": []}}))
                .unwrap();
        assert_eq!(
            create_request(&none, &BTreeMap::new(), &label(), 8),
            Err(TranslateError::NoContainer)
        );
        let two: Pod = serde_json::from_value(json!({"metadata": {"uid": "u"},
            "spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]}}))
        .unwrap();
        assert_eq!(
            create_request(&two, &BTreeMap::new(), &label(), 8),
            Err(TranslateError::SeveralContainers(2))
        );
        let no_image = pod(json!({"name": "main"}), json!({}));
        assert_eq!(
            create_request(&no_image, &BTreeMap::new(), &label(), 8),
            Err(TranslateError::NoImage("main".into()))
        );
        let bad_ports = pod(
            json!({"name": "main", "image": "i"}),
            json!({"runpod.io/ports": "80/udp"}),
        );
        assert!(matches!(
            create_request(&bad_ports, &BTreeMap::new(), &label(), 8),
            Err(TranslateError::Annotation {
                annotation: PORTS,
                ..
            })
        ));
    }
}
