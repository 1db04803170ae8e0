//! `docs/reference/annotations.md`: the contract's list of names (`runpod_contract::names`).

use runpod_contract::names::{Kind, NAMES, Name};

use super::{cell, check, generated_by};

const PATH: &str = "docs/reference/annotations.md";

fn row(entry: &Name) -> String {
    format!(
        "| `{}` | {} | {} | {} | {} | {} |\n",
        entry.name,
        cell(entry.on),
        cell(entry.meaning),
        cell(entry.values),
        cell(entry.written_by.describe()),
        cell(entry.read_by)
    )
}

fn section(out: &mut String, title: &str, intro: &str, keep: impl Fn(&Name) -> bool) {
    out.push_str(&format!("## {title}\n\n{intro}\n\n"));
    out.push_str(
        "| name | on | meaning | values | written by | read by |\n|---|---|---|---|---|---|\n",
    );
    for entry in NAMES.iter().filter(|entry| keep(entry)) {
        out.push_str(&row(entry));
    }
    out.push('\n');
}

pub(super) fn render() -> String {
    let mut out = generated_by("the contract crate's list (contract/src/names.rs)");
    out.push_str(
        "# Labels, annotations and taints\n\n\
         Every name runpod-kubelet reads or writes, who may write it and who reads it. A pod \
         annotation is read from the pod first, then from its owning Job; the webhook writes \
         the values it took from the Job onto the pod. An annotation present but empty is \
         refused at admission.\n\n",
    );
    section(
        &mut out,
        "Opting in (labels)",
        "Set by the platform team on namespaces (and `runpod.io/burst` on single pods).",
        |e| e.kind == Kind::Label && e.on != "virtual node",
    );
    section(
        &mut out,
        "Budgets (namespace annotations)",
        "Set by the platform team on namespaces ([budgets and teams](../budgets-and-teams.md)).",
        |e| e.kind == Kind::Annotation && e.on == "namespace",
    );
    section(
        &mut out,
        "What a pod asks for (annotations)",
        "Set by whoever writes the pod or its Job; the webhook checks each at admission and \
         refuses a bad value with a message naming it.",
        |e| e.kind == Kind::Annotation && e.written_by == runpod_contract::names::Writer::User,
    );
    section(
        &mut out,
        "What the controller reports (annotations)",
        "Written by the controller only: the webhook removes them from every new opted-in pod, \
         and a forged value is overwritten and never acted on.",
        |e| {
            e.kind == Kind::Annotation
                && e.on == "pod"
                && e.written_by != runpod_contract::names::Writer::User
        },
    );
    section(
        &mut out,
        "On the virtual node",
        "The labels, annotations and taints of each virtual node.",
        |e| e.on == "virtual node",
    );
    section(
        &mut out,
        "On the controllers' own objects",
        "Written and read by the controllers in the release namespace; do not edit them.",
        |e| e.on.starts_with("ConfigMap"),
    );
    out.trim_end().to_string() + "\n"
}

#[test]
fn annotations_reference_is_in_step() {
    check(PATH, &render());
}

#[test]
fn every_name_is_in_one_section() {
    let rendered = render();
    for entry in NAMES {
        assert!(
            rendered.contains(&format!("| `{}` |", entry.name)),
            "{}",
            entry.name
        );
    }
}
