//! The ownership marker every instance carries from its first moment: `label`, set in the
//! create call itself, naming the cluster, the virtual node and the pod UID. Reconciling by
//! label is how a lost create answer or a crashed controller never buys a second instance,
//! and how instances of other clusters (or unlabelled ones) are never touched.

use std::fmt;

/// Prefix of every label this project writes.
const PREFIX: &str = "rpk";
/// Vast.ai accepts at most 256 characters in a create's label.
pub const MAX_LABEL_LEN: usize = 256;

/// `rpk:<cluster>:<node>:<pod uid>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label {
    cluster: String,
    node: String,
    pod_uid: String,
}

impl Label {
    /// Refuses parts that would make the label ambiguous (a `:`, whitespace, empty) or too
    /// long.
    pub fn new(cluster: &str, node: &str, pod_uid: &str) -> Result<Label, String> {
        for (what, part) in [
            ("cluster id", cluster),
            ("node name", node),
            ("pod UID", pod_uid),
        ] {
            if part.is_empty() || part.contains(':') || part.chars().any(char::is_whitespace) {
                return Err(format!(
                    "the {what} {part:?} cannot go into a Vast.ai label (empty, ':' or whitespace)"
                ));
            }
        }
        let label = Label {
            cluster: cluster.to_owned(),
            node: node.to_owned(),
            pod_uid: pod_uid.to_owned(),
        };
        let length = label.to_string().len();
        if length > MAX_LABEL_LEN {
            return Err(format!(
                "the Vast.ai label would be {length} characters; at most {MAX_LABEL_LEN}"
            ));
        }
        Ok(label)
    }

    /// Reads a label this project wrote; anything else (unlabelled, another tool's) is `None`.
    pub fn parse(text: &str) -> Option<Label> {
        let mut parts = text.strip_prefix(PREFIX)?.strip_prefix(':')?.split(':');
        let (cluster, node, uid) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        Label::new(cluster, node, uid).ok()
    }

    /// Whether the instance is this node's to manage: labels of other clusters or nodes, and
    /// unlabelled instances, are never touched.
    pub fn belongs_to(&self, cluster: &str, node: &str) -> bool {
        self.cluster == cluster && self.node == node
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn pod_uid(&self) -> &str {
        &self.pod_uid
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}:{}:{}:{}",
            self.cluster, self.node, self.pod_uid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_and_refuse_ambiguity() {
        let label = Label::new("prod-eu", "virtual-vastai", "0d4c5e1a-7b7e").unwrap();
        assert_eq!(
            label.to_string(),
            "rpk:prod-eu:virtual-vastai:0d4c5e1a-7b7e"
        );
        assert_eq!(Label::parse(&label.to_string()), Some(label.clone()));
        assert_eq!(label.pod_uid(), "0d4c5e1a-7b7e");
        for bad in [("a:b", "n", "u"), ("c", "", "u"), ("c", "n", "u u")] {
            assert!(Label::new(bad.0, bad.1, bad.2).is_err(), "{bad:?}");
        }
        assert!(Label::new(&"c".repeat(250), "n", "u").is_err());
        for foreign in [
            "",
            "my training job",
            "rpk:a:b",
            "rpk:a:b:c:d",
            "xrpk:a:b:c",
        ] {
            assert_eq!(Label::parse(foreign), None, "{foreign:?}");
        }
    }
}
