//! `charts/runpod-kubelet/README.md`: the chart's values with their defaults and the comments
//! above them in `values.yaml`, in file order.

use super::{cell, check, generated_by, root};

const PATH: &str = "charts/runpod-kubelet/README.md";

/// One documented key of `values.yaml`.
#[derive(Debug)]
struct Value {
    path: String,
    /// The default as written in `values.yaml`; `None` for a map of further keys.
    default: Option<String>,
    description: String,
    /// Indented lines of its comment: a YAML example.
    example: Vec<String>,
}

/// Reads the keys of `values.yaml` with the comment lines just above each. Keys are
/// `name:` at any indentation (two spaces per level); block lists do not occur in the file
/// (lists are written inline), which `every_leaf_is_documented` checks against a YAML parser.
fn values(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    // (indent, key, the path whose comment covers its children)
    let mut stack: Vec<(usize, String, Option<String>)> = Vec::new();
    // The last commented key of a run of keys at one indentation, which also covers the
    // uncommented keys below it up to a blank line (`tlsReloadInterval`, `shutdownDrain`, ...).
    let mut lead: Option<(usize, String)> = None;
    let mut comment: Vec<String> = Vec::new();
    let mut example: Vec<String> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() {
            comment.clear();
            example.clear();
            lead = None;
            continue;
        }
        if let Some(text) = trimmed.strip_prefix('#') {
            let text = text.strip_prefix(' ').unwrap_or(text);
            if text.starts_with("  ") {
                example.push(text.to_string());
            } else {
                comment.push(text.to_string());
            }
            continue;
        }
        let indent = line.len() - trimmed.len();
        let Some((key, rest)) = trimmed.split_once(':') else {
            continue;
        };
        while stack.last().is_some_and(|(level, _, _)| *level >= indent) {
            stack.pop();
        }
        let path = stack
            .iter()
            .map(|(_, key, _)| key.as_str())
            .chain([key])
            .collect::<Vec<_>>()
            .join(".");
        let rest = rest.trim();
        let covered_by = stack.iter().rev().find_map(|(_, _, covers)| covers.clone());
        let mut description = comment.join(" ");
        if description.is_empty() {
            let sibling = lead
                .as_ref()
                .filter(|(level, _)| *level == indent)
                .map(|(_, path)| path.clone());
            if let Some(other) = sibling.or_else(|| covered_by.clone()) {
                description = format!("See `{other}`.");
            }
        } else {
            lead = Some((indent, path.clone()));
        }
        if rest.is_empty() {
            let covers = if comment.is_empty() {
                covered_by
            } else {
                Some(path.clone())
            };
            stack.push((indent, key.to_string(), covers));
            if !comment.is_empty() || !example.is_empty() {
                out.push(Value {
                    path,
                    default: None,
                    description,
                    example: std::mem::take(&mut example),
                });
            }
        } else {
            out.push(Value {
                path,
                default: Some(rest.to_string()),
                description,
                example: std::mem::take(&mut example),
            });
        }
        comment.clear();
    }
    out
}

pub(super) fn render() -> String {
    let text = std::fs::read_to_string(root().join("charts/runpod-kubelet/values.yaml")).unwrap();
    let mut out = generated_by("charts/runpod-kubelet/values.yaml");
    out.push_str(
        "# The runpod-kubelet chart\n\n\
         Installs runpod-kubelet on a cluster: the admission webhook (2 replicas, a \
         PodDisruptionBudget), one controller Deployment per virtual node (leader-elected), the \
         webhook certificate's hook Jobs and CronJob, a key check before install and upgrade, \
         a drain before uninstall, a `runpod` RuntimeClass and least-privilege RBAC; \
         optionally ServiceMonitors, alerts and a Grafana dashboard. Helm 3 or 4, Kubernetes \
         1.20 or later. `values.schema.json` checks every value: a wrong one fails `helm \
         install` naming it.\n\n\
         ```sh\n\
         kubectl create namespace runpod-system\n\
         kubectl -n runpod-system create secret generic runpod-api-key --from-literal=RUNPOD_API_KEY=...\n\
         helm install runpod-kubelet charts/runpod-kubelet -n runpod-system \\\n  \
         --set runpod.existingSecret=runpod-api-key -f my-values.yaml --wait\n\
         ```\n\n\
         Upgrade with the same values file (`helm upgrade ... -f my-values.yaml`), not \
         `--reuse-values`. The guides: [installing](../../docs/install.md), \
         [upgrading](../../docs/upgrading.md), [monitoring](../../docs/monitoring.md), \
         [certificates](../../docs/certificates.md).\n\n\
         ## Values\n\n\
         | key | default | description |\n|---|---|---|\n",
    );
    let all = values(&text);
    for value in &all {
        let default = match &value.default {
            Some(default) => format!("`{}`", default.replace('|', "\\|")),
            None => String::new(),
        };
        let example = if value.example.is_empty() {
            String::new()
        } else {
            " Example below.".to_string()
        };
        out.push_str(&format!(
            "| `{}` | {} | {}{} |\n",
            value.path,
            default,
            cell(&value.description),
            example
        ));
    }
    for value in all.iter().filter(|value| !value.example.is_empty()) {
        out.push_str(&format!("\n### Example: `{}`\n\n```yaml\n", value.path));
        let strip = value
            .example
            .iter()
            .map(|line| line.len() - line.trim_start().len())
            .min()
            .unwrap_or(0);
        for line in &value.example {
            out.push_str(&line[strip.min(line.len())..]);
            out.push('\n');
        }
        out.push_str("```\n");
    }
    out
}

/// Every leaf of `values.yaml` (as a YAML parser reads it) has a row.
fn leaves(prefix: &str, value: &serde_yaml::Value, out: &mut Vec<String>) {
    match value {
        serde_yaml::Value::Mapping(map) if !map.is_empty() => {
            for (key, value) in map {
                let key = key.as_str().unwrap_or_default();
                let path = if prefix.is_empty() {
                    key.to_string()
                } else {
                    format!("{prefix}.{key}")
                };
                leaves(&path, value, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

#[test]
fn every_leaf_is_documented() {
    let text = std::fs::read_to_string(root().join("charts/runpod-kubelet/values.yaml")).unwrap();
    let parsed: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let mut expected = Vec::new();
    leaves("", &parsed, &mut expected);
    let rows: Vec<String> = values(&text)
        .into_iter()
        .filter(|value| value.default.is_some())
        .map(|value| value.path)
        .collect();
    // A row written inline (`requests: {cpu: 10m}`) covers the leaves inside it.
    let covers = |row: &String, leaf: &String| leaf == row || leaf.starts_with(&format!("{row}."));
    for leaf in &expected {
        let covering = rows.iter().filter(|row| covers(row, leaf)).count();
        assert_eq!(covering, 1, "{leaf} is covered by {covering} rows");
    }
    for row in &rows {
        assert!(
            expected.iter().any(|leaf| covers(row, leaf)),
            "{row} is no value"
        );
    }
}

#[test]
fn every_value_is_described() {
    let text = std::fs::read_to_string(root().join("charts/runpod-kubelet/values.yaml")).unwrap();
    let bare: Vec<String> = values(&text)
        .into_iter()
        .filter(|value| value.description.is_empty())
        .map(|value| value.path)
        .collect();
    assert!(
        bare.is_empty(),
        "values.yaml keys without a comment: {bare:?}"
    );
}

#[test]
fn a_comment_belongs_to_the_key_below_it() {
    let parsed = values("# one\na:\n  # two\n  b: 1\n  d: 2\n\n# gone\n\nc: []\n");
    let summary: Vec<(&str, Option<&str>, &str)> = parsed
        .iter()
        .map(|v| {
            (
                v.path.as_str(),
                v.default.as_deref(),
                v.description.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("a", None, "one"),
            ("a.b", Some("1"), "two"),
            ("a.d", Some("2"), "See `a.b`."),
            ("c", Some("[]"), "")
        ]
    );
}

#[test]
fn chart_readme_is_in_step() {
    check(PATH, &render());
}
