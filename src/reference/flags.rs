//! `docs/reference/flags.md`: every subcommand's flags from the clap definitions.

use clap::{Arg, Command, CommandFactory};

use super::{cell, check, generated_by};
use crate::cli::Cli;

const PATH: &str = "docs/reference/flags.md";

/// Flags clap adds itself.
fn is_builtin(arg: &Arg) -> bool {
    matches!(arg.get_id().as_str(), "help" | "version")
}

fn help_of(arg: &Arg) -> String {
    arg.get_long_help()
        .or_else(|| arg.get_help())
        .map(|help| help.to_string())
        .unwrap_or_default()
}

fn name_of(arg: &Arg) -> String {
    match arg.get_long() {
        Some(long) => {
            let mut name = format!("`--{long}`");
            for alias in arg.get_all_aliases().unwrap_or_default() {
                name.push_str(&format!(" (alias `--{alias}`)"));
            }
            name
        }
        None => format!("`<{}>`", arg.get_id().as_str().to_uppercase()),
    }
}

fn default_of(arg: &Arg) -> String {
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|value| value.to_string_lossy().into_owned())
        .collect();
    if arg.is_required_set() {
        "required".to_string()
    } else if defaults.is_empty() {
        String::new()
    } else {
        format!("`{}`", defaults.join(","))
    }
}

fn values_of(arg: &Arg) -> String {
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|value| !value.is_hide_set())
        .map(|value| format!("`{}`", value.get_name()))
        .collect();
    // A plain boolean flag lists `true`/`false`; that says nothing the default does not.
    if values.is_empty() || values == ["`true`", "`false`"] {
        String::new()
    } else {
        format!(" One of {}.", values.join(", "))
    }
}

/// One flag's table row.
fn row(arg: &Arg) -> String {
    let env = arg
        .get_env()
        .map(|env| format!("`{}`", env.to_string_lossy()))
        .unwrap_or_default();
    format!(
        "| {} | {} | {} | {}{} |\n",
        name_of(arg),
        env,
        default_of(arg),
        cell(&help_of(arg)),
        values_of(arg)
    )
}

fn render_command(out: &mut String, path: &str, command: &Command) {
    out.push_str(&format!("## `{path}`\n\n"));
    if let Some(about) = command.get_long_about().or_else(|| command.get_about()) {
        out.push_str(&format!("{}\n\n", cell(&about.to_string())));
    }
    let (hidden, shown): (Vec<&Arg>, Vec<&Arg>) = command
        .get_arguments()
        .filter(|arg| !is_builtin(arg) && !arg.is_global_set())
        .partition(|arg| arg.is_hide_set());
    if !shown.is_empty() {
        out.push_str("| flag | environment | default | meaning |\n|---|---|---|---|\n");
        for arg in shown {
            out.push_str(&row(arg));
        }
        out.push('\n');
    }
    if !hidden.is_empty() {
        let names: Vec<String> = hidden.iter().map(|arg| name_of(arg)).collect();
        out.push_str(&format!(
            "Accepted and ignored, for the Go kubelet's command lines: {}.\n\n",
            names.join(", ")
        ));
    }
    for sub in command.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        render_command(out, &format!("{path} {}", sub.get_name()), sub);
    }
}

pub(super) fn render() -> String {
    let cli = Cli::command();
    let mut out = generated_by("the command line's definitions (src/cli.rs, src/cmd/)");
    out.push_str(
        "# Command-line flags\n\n\
         Every flag of every subcommand of `runpod-kubelet`, with the environment variable that \
         sets it when the flag is absent. A flag given twice takes its last value (a list flag \
         is replaced, not appended to), so the chart's `extraArgs`, which come last, win. \
         Durations read `90s`, `5m`, `1h30m`; where noted, bare seconds too.\n\n",
    );
    out.push_str("## Global flags (every subcommand)\n\n");
    out.push_str("| flag | environment | default | meaning |\n|---|---|---|---|\n");
    for arg in cli.get_arguments().filter(|arg| arg.is_global_set()) {
        out.push_str(&row(arg));
    }
    out.push('\n');
    for sub in cli.get_subcommands() {
        render_command(&mut out, &format!("runpod-kubelet {}", sub.get_name()), sub);
    }
    out.trim_end().to_string() + "\n"
}

/// Every flag a user can see says what it does.
fn undocumented(command: &Command, path: &str, missing: &mut Vec<String>) {
    for arg in command.get_arguments() {
        if !is_builtin(arg) && !arg.is_hide_set() && help_of(arg).trim().is_empty() {
            missing.push(format!("{path} --{}", arg.get_id()));
        }
    }
    for sub in command.get_subcommands() {
        if sub.get_about().is_none() && sub.get_name() != "help" {
            missing.push(format!("{path} {} (no about)", sub.get_name()));
        }
        undocumented(sub, &format!("{path} {}", sub.get_name()), missing);
    }
}

#[test]
fn every_flag_has_a_help_line() {
    let mut missing = Vec::new();
    undocumented(&Cli::command(), "runpod-kubelet", &mut missing);
    assert!(missing.is_empty(), "flags without help: {missing:?}");
}

#[test]
fn the_help_names_both_clouds() {
    let mut cli = Cli::command();
    let help = cli.render_long_help().to_string();
    assert!(
        help.contains("RunPod") && help.contains("Vast.ai"),
        "{help}"
    );
    let controller = cli
        .find_subcommand_mut("controller")
        .map(|command| command.render_long_help().to_string())
        .unwrap_or_default();
    assert!(
        controller.contains("RunPod") && controller.contains("Vast.ai"),
        "{controller}"
    );
}

#[test]
fn flags_reference_is_in_step() {
    check(PATH, &render());
}
