//! The node's SSH key pair, kept in a Secret (`<node>-ssh`, type `kubernetes.io/ssh-auth`) in
//! the controller's namespace so every replica and every restart uses the same key: a pod
//! created by one leader stays reachable by the next. Made on first use; an existing Secret is
//! only read (an operator's own key is never overwritten).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use crate::controller::kubelet_api::exec::ssh::NodeKey;

/// The Secret's keys, as `kubernetes.io/ssh-auth` names the private one.
pub const PRIVATE_KEY: &str = "ssh-privatekey";
pub const PUBLIC_KEY: &str = "ssh-publickey";

/// The default Secret name for a node.
pub fn secret_name(node: &str) -> String {
    format!("{node}-ssh")
}

/// The key in `namespace/name`, made and stored there if the Secret does not exist.
pub async fn ensure(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
) -> Result<NodeKey, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    // Two replicas starting together: the loser of the create reads the winner's key.
    for _ in 0..3 {
        match secrets.get_opt(name).await {
            Ok(Some(secret)) => return read(&secret, namespace, name),
            Ok(None) => {}
            Err(error) => return Err(format!("reading Secret {namespace}/{name}: {error}")),
        }
        let key = NodeKey::generate().map_err(|e| e.to_string())?;
        let private = key.private_openssh().map_err(|e| e.to_string())?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(
                    [
                        (
                            "app.kubernetes.io/managed-by".to_owned(),
                            "runpod-kubelet".to_owned(),
                        ),
                        ("runpod.io/node".to_owned(), node.to_owned()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            type_: Some("kubernetes.io/ssh-auth".to_owned()),
            data: Some(
                [
                    (PRIVATE_KEY.to_owned(), ByteString(private.into_bytes())),
                    (
                        PUBLIC_KEY.to_owned(),
                        ByteString(key.public_openssh().into_bytes()),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(%namespace, secret = %name, "made the node's SSH key");
                return Ok(key);
            }
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(format!("creating Secret {namespace}/{name}: {error}")),
        }
    }
    Err(format!(
        "Secret {namespace}/{name} kept appearing and vanishing"
    ))
}

fn read(secret: &Secret, namespace: &str, name: &str) -> Result<NodeKey, String> {
    let pem = secret
        .data
        .as_ref()
        .and_then(|data| data.get(PRIVATE_KEY))
        .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned())
        .ok_or_else(|| format!("Secret {namespace}/{name} has no {PRIVATE_KEY}"))?;
    NodeKey::from_openssh(&pem).map_err(|e| format!("Secret {namespace}/{name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_read_back_and_bad_ones_are_named() {
        let key = NodeKey::generate().unwrap();
        let secret = Secret {
            data: Some(
                [(
                    PRIVATE_KEY.to_owned(),
                    ByteString(key.private_openssh().unwrap().into_bytes()),
                )]
                .into(),
            ),
            ..Default::default()
        };
        let read_back = read(&secret, "ns", "n").unwrap();
        assert_eq!(read_back.public_openssh(), key.public_openssh());
        let empty = Secret::default();
        assert!(
            read(&empty, "ns", "n")
                .unwrap_err()
                .contains("no ssh-privatekey")
        );
        assert_eq!(secret_name("virtual-runpod"), "virtual-runpod-ssh");
    }
}
