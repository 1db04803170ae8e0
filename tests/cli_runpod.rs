//! The RunPod subcommands as users run them: `simulator` serves the v2 API on the port it
//! prints, and `gpus` reads the catalogue through it with the key from `RUNPOD_API_KEY` and
//! prints placement candidates that respect every constraint.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const KEY: &str = "rpa_CLI_TEST_KEY_42";

struct Simulator {
    child: Child,
    url: String,
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn simulator() -> Simulator {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .args(["simulator", "--listen", "127.0.0.1:0"])
        .env("RUNPOD_API_KEY", KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("runpod simulator listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    Simulator { child, url }
}

fn gpus(url: &str, key: Option<&str>, extra: &[&str]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"));
    command
        .args(["gpus", "--runpod-api-url", url])
        .args(extra)
        .env_remove("RUNPOD_API_KEY")
        .env_remove("RUST_LOG");
    if let Some(key) = key {
        command.env("RUNPOD_API_KEY", key);
    }
    command.output().unwrap()
}

/// Two GPUs of at least 48 GB, in two allowed data centres, at most $2 per GPU-hour.
const REQUIREMENTS: [&str; 8] = [
    "--required-gpu-memory",
    "48",
    "--datacenter-ids",
    "EU-RO-1,US-TX-3",
    "--max-gpu-price",
    "2",
    "--gpu-count",
    "2",
];

#[test]
fn gpus_lists_constrained_candidates_from_the_simulator() {
    let sim = simulator();
    let out = gpus(
        &sim.url,
        Some(KEY),
        &[REQUIREMENTS.as_slice(), &["--json"]].concat(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!rows.is_empty());
    let mut previous = 0.0;
    for row in &rows {
        assert!(row["memoryGb"].as_u64().unwrap() >= 48, "{row}");
        let price = row["pricePerHour"].as_f64().unwrap();
        assert!(price <= 4.0 + 1e-9 && price >= previous, "{row}");
        previous = price;
        assert_eq!(row["gpuCount"], 2);
        for dc in row["dataCenterIds"].as_array().unwrap() {
            assert!(
                ["EU-RO-1", "US-TX-3"].contains(&dc.as_str().unwrap()),
                "{row}"
            );
        }
    }
    // The human-readable table carries the same first choice.
    let table = gpus(&sim.url, Some(KEY), &REQUIREMENTS);
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.lines()
            .nth(1)
            .unwrap()
            .starts_with(rows[0]["gpuId"].as_str().unwrap()),
        "{text}"
    );
}

#[test]
fn gpus_needs_the_key_from_the_environment_and_never_prints_it() {
    let sim = simulator();
    let missing = gpus(&sim.url, None, &[]);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("RUNPOD_API_KEY"), "{stderr}");

    let wrong = gpus(&sim.url, Some("rpa_WRONG_KEY_999"), &[]);
    assert!(!wrong.status.success());
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(stderr.contains("401"), "{stderr}");
    assert!(!stderr.contains("rpa_WRONG_KEY_999"));

    // There is no flag for the key.
    let flag = gpus(&sim.url, Some(KEY), &["--runpod-api-key", KEY]);
    assert!(!flag.status.success());
}
