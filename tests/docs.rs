//! The documentation holds together: the README stays short, every relative link and anchor
//! in the Markdown resolves, every task page says first what the reader will be able to do,
//! and every example is shown by some page. (The generated references have their own drift
//! tests in `src/reference/`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown file a reader reaches from the README.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("CHANGELOG.md"),
        root().join("SECURITY.md"),
        root().join("charts/README.md"),
        root().join("charts/runpod-kubelet/README.md"),
        root().join("deploy/README.md"),
        root().join("benches/README.md"),
    ];
    for dir in ["docs", "docs/reference"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "md") {
                files.push(path);
            }
        }
    }
    files.retain(|path| path.exists());
    files
}

/// GitHub's heading anchors: lower case, punctuation dropped but `-` and `_`, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// `](target)` links outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for link in links(&text) {
            if link.starts_with("http://")
                || link.starts_with("https://")
                || link.starts_with("mailto:")
            {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((link.as_str(), ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", file.display()));
                continue;
            }
            if !anchor.is_empty() {
                let body = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&body).contains(anchor) {
                    broken.push(format!("{}: {link} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_short() {
    let lines = std::fs::read_to_string(root().join("README.md"))
        .unwrap()
        .lines()
        .count();
    assert!(
        lines < 200,
        "README.md has {lines} lines; move detail into docs/"
    );
}

#[test]
fn every_task_page_starts_with_what_the_reader_can_do() {
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "md") || path.ends_with("README.md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let first_paragraph = text
            .lines()
            .find(|line| !line.starts_with('#') && !line.trim().is_empty())
            .unwrap_or_default();
        assert!(
            first_paragraph.starts_with("After this page you can"),
            "{} starts with {first_paragraph:?}",
            path.display()
        );
    }
}

#[test]
fn every_example_is_shown_by_a_page() {
    let pages: String = markdown_files()
        .iter()
        .map(|path| std::fs::read_to_string(path).unwrap())
        .collect();
    for entry in std::fs::read_dir(root().join("examples")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            pages.contains(&format!("examples/{name}")),
            "no page shows examples/{name}"
        );
    }
}

#[test]
fn no_internal_shorthand_leaks_into_the_docs() {
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for phrase in [
            "api-notes",
            "the seed",
            "(later)",
            "will hold",
            "until the chart exists",
        ] {
            assert!(
                !text.contains(phrase),
                "{} says {phrase:?}",
                Path::new(&file).display()
            );
        }
    }
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug(" Several virtual nodes, Vast.ai"),
        "several-virtual-nodes-vastai"
    );
    assert_eq!(slug(" `kubectl logs` fails"), "kubectl-logs-fails");
    assert_eq!(
        links("see [a](docs/a.md#b) and [c](https://x)\n```\n[d](e)\n```"),
        ["docs/a.md#b", "https://x"]
    );
}
