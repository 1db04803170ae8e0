//! The environment of a container as Kubernetes builds it, from what the controller read in the
//! cluster: one type for every cloud, expanded once per create.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

/// What the cluster supplied for one container (Secrets, ConfigMaps, the downward API).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvedEnv {
    /// Merged `envFrom` sources, in Kubernetes order (later sources win).
    pub env_from: BTreeMap<String, String>,
    /// Values of `env[].valueFrom` entries by variable name; missing optional ones are absent.
    pub value_from: BTreeMap<String, String>,
}

impl ResolvedEnv {
    /// The container's environment in Kubernetes order: `envFrom` first, then `env` entries in
    /// order (later ones win, values expanded against what came before). A `valueFrom` entry
    /// missing from [`Self::value_from`] was optional and is skipped.
    pub fn container_env(&self, container: &Container) -> BTreeMap<String, String> {
        let mut env = self.env_from.clone();
        for var in container.env.iter().flatten() {
            if var.value_from.is_some() {
                if let Some(value) = self.value_from.get(&var.name) {
                    env.insert(var.name.clone(), value.clone());
                }
            } else {
                let value = expand(var.value.as_deref().unwrap_or(""), &env);
                env.insert(var.name.clone(), value);
            }
        }
        env
    }
}

/// The container's `command` then `args`, each `$(VAR)`-expanded against `env`.
pub fn command_words(container: &Container, env: &BTreeMap<String, String>) -> Vec<String> {
    container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten())
        .map(|word| expand(word, env))
        .collect()
}

/// Kubernetes `$(VAR)` expansion in command, args and env values: defined variables are
/// replaced, `$$` escapes a `$`, and references to undefined variables stay as written.
pub fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 1..];
        if let Some(after) = tail.strip_prefix('$') {
            out.push('$');
            rest = after;
        } else if let Some(body) = tail.strip_prefix('(') {
            match body.find(')') {
                Some(close) => {
                    let name = &body[..close];
                    match env.get(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_kubernetes() {
        let env = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
        assert_eq!(expand("$(A)-$(B)-$$(A)-$-$(", &env), "1-$(B)-$(A)-$-$(");
        assert_eq!(expand("no refs", &env), "no refs");
        assert_eq!(expand("$$$(A)", &env), "$1");
    }
}
