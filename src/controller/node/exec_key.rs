//! What this node's exec and port-forward run with: its SSH key pair, the host keys its pods'
//! sshd printed, and whether exec is served at all. A leaf (keys and state only, no I/O), so
//! the controller's shared settings hold it without importing the kubelet API that uses it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use russh::keys::PrivateKey;
use russh::keys::ssh_key::LineEnding;
use russh::keys::ssh_key::private::Ed25519Keypair;

/// Whether this node serves exec and port-forward, and with which key.
#[derive(Clone, Debug)]
pub enum ExecAccess {
    /// `--exec-ssh=false`.
    Off,
    /// The node's cloud offers no SSH into the container (the reason).
    Unsupported(String),
    /// The key could not be read or made (the reason).
    Unavailable(String),
    Ready {
        key: NodeKey,
        host_keys: HostKeys,
    },
}

/// A key that cannot be made or read.
#[derive(Debug, thiserror::Error)]
#[error("the key is not an OpenSSH private key: {0}")]
pub struct KeyError(String);

/// The node's key pair.
#[derive(Clone)]
pub struct NodeKey {
    private: Arc<PrivateKey>,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKey")
            .field("public", &self.public_openssh())
            .finish()
    }
}

impl NodeKey {
    /// A new ed25519 key from the operating system's randomness.
    pub fn generate() -> Result<NodeKey, KeyError> {
        let mut seed = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
            .map_err(|_| KeyError("no randomness".to_owned()))?;
        Ok(NodeKey {
            private: Arc::new(PrivateKey::from(Ed25519Keypair::from_seed(&seed))),
        })
    }

    pub fn from_openssh(pem: &str) -> Result<NodeKey, KeyError> {
        PrivateKey::from_openssh(pem)
            .map(|key| NodeKey {
                private: Arc::new(key),
            })
            .map_err(|e| KeyError(e.to_string()))
    }

    /// The private key in OpenSSH's format (for the node's Secret only).
    pub fn private_openssh(&self) -> Result<String, KeyError> {
        self.private
            .to_openssh(LineEnding::LF)
            .map(|pem| pem.to_string())
            .map_err(|e| KeyError(e.to_string()))
    }

    /// `ssh-ed25519 AAAA...`: what a pod's `PUBLIC_KEY` carries.
    pub fn public_openssh(&self) -> String {
        self.private.public_key().to_openssh().unwrap_or_default()
    }
}

impl NodeKey {
    /// The private key, for the SSH client's authentication.
    pub(crate) fn private(&self) -> Arc<PrivateKey> {
        self.private.clone()
    }
}

/// Host keys read from instances' logs, by instance id, until the pod's annotation (where
/// every replica finds them) shows them too.
#[derive(Clone, Debug, Default)]
pub struct HostKeys(Arc<Mutex<HashMap<String, Vec<String>>>>);

impl HostKeys {
    pub fn get(&self, instance: &str) -> Option<Vec<String>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(instance)
            .cloned()
    }

    pub fn insert(&self, instance: &str, fingerprints: Vec<String>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(instance.to_owned(), fingerprints);
    }

    /// Forgets instances that are gone.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|instance, _| live(instance));
    }
}
