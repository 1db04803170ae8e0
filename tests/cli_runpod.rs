//! The RunPod subcommands as users run them: `simulator` serves the v2 API on the port it
//! prints, and `gpus` reads the catalogue through it with the key from `RUNPOD_API_KEY` and
//! prints placement candidates that respect every constraint; without requirements, `gpus`
//! prints the GPU catalogue with each cloud's lowest price.

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
    simulator_of("runpod", "RUNPOD_API_KEY", KEY)
}

fn simulator_of(cloud: &str, key_env: &str, key: &str) -> Simulator {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .args(["simulator", "--cloud", cloud, "--listen", "127.0.0.1:0"])
        .env(key_env, key)
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
        .strip_prefix(&format!("{cloud} simulator listening on "))
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

#[test]
fn gpus_prints_the_catalogue_with_each_clouds_lowest_price() {
    const VAST_KEY: &str = "vast_CLI_TEST_KEY_7";
    let runpod = simulator();
    let vast = simulator_of("vastai", "VAST_API_KEY", VAST_KEY);
    let run = |keys: &[(&str, &str)], extra: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"));
        command
            .args(["gpus", "--runpod-api-url", &runpod.url])
            .args(["--vastai-api-url", &vast.url])
            .args(extra)
            .env_remove("RUNPOD_API_KEY")
            .env_remove("VAST_API_KEY")
            .env_remove("RUST_LOG");
        for (name, value) in keys {
            command.env(name, value);
        }
        command.output().unwrap()
    };
    let both = [("RUNPOD_API_KEY", KEY), ("VAST_API_KEY", VAST_KEY)];
    let out = run(&both, &["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let row = |name: &str| rows.iter().find(|r| r["name"] == name).unwrap().clone();
    // The simulators sell H100s on both clouds: each cloud's own names and price.
    let h100 = row("H100");
    assert_eq!(h100["memoryGb"], 80);
    assert_eq!(h100["runpod"]["names"][0], "NVIDIA H100 80GB HBM3");
    assert_eq!(h100["vastai"]["names"][0], "H100 SXM");
    let runpod_h100 = h100["runpod"]["lowestPerGpuHour"].as_f64().unwrap();
    let vast_h100 = h100["vastai"]["lowestPerGpuHour"].as_f64().unwrap();
    assert!(runpod_h100 > 0.0 && vast_h100 > 0.0, "{h100}");
    // RunPod's lowest H100 price is its community price (2.69) or below.
    assert!(runpod_h100 <= 2.69 + 1e-9, "{h100}");
    // Every spec name is listed.
    for name in ["H200", "H100", "A100-80GB", "RTXA6000", "RTX4090", "L4"] {
        assert!(rows.iter().any(|r| r["name"] == name), "{name}");
    }

    // The table, with one cloud's key only: the other says so.
    let out = run(&[("RUNPOD_API_KEY", KEY)], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text.lines().find(|l| l.starts_with("H100 ")).unwrap();
    assert!(
        line.contains("no key") && line.contains("NVIDIA H100 80GB HBM3 | H100 SXM"),
        "{line}"
    );

    // No key at all: a clear error naming both variables.
    let out = run(&[], &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("RUNPOD_API_KEY") && stderr.contains("VAST_API_KEY"),
        "{stderr}"
    );
}
