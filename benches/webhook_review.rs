//! `cargo bench --bench webhook_review`: the webhook's own work on one review, without TLS,
//! HTTP or an apiserver: read the review, look up (in memory), judge, build the patch and write
//! the answer. It runs `runpod_webhook::admission::admit` and `review::encode` in a loop on
//! `fixtures/review.json` (a Job's GPU pod) with the Namespace and Job of
//! `fixtures/namespace-and-job.json`, under the allocator the binary uses.
//!
//! What the TLS benches measure is this plus the server; on this 2-core machine the server
//! alone (rustls, hyper, tokio) costs about what nginx does per request, so this loop is the
//! part of the webhook / nginx ratio the webhook's code decides.
//!
//! Prints microseconds per review (the best of `WEBHOOK_REVIEW_ROUNDS` rounds, default 5, of
//! `WEBHOOK_REVIEW_ITERATIONS` reviews each, default 50 000). Fails only when the review is
//! not admitted with a patch.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context as _, bail};
use runpod_kubelet::flags as runpod_flags;
use runpod_webhook::admission::admit;
use runpod_webhook::cluster::MemoryCluster;
use runpod_webhook::contract::vastai::VastPolicy;
use runpod_webhook::policy::PolicyConfig;
use serde_json::Value;

/// As in the binary (`src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const JOB_UID: &str = "0b6c1e0e-1111-2222-3333-444455556666";

fn env_number(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .with_context(|| format!("{name}={value} is not a number")),
        Err(_) => Ok(default),
    }
}

fn strings(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// The review body and a cluster holding its Namespace and Job, from the benches' fixtures.
fn fixture() -> anyhow::Result<(Vec<u8>, MemoryCluster)> {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/fixtures");
    let review = std::fs::read_to_string(fixtures.join("review.json"))?.replace("JOB_UID", JOB_UID);
    let review: Value = serde_json::from_str(&review)?;
    let list: Value = serde_json::from_str(&std::fs::read_to_string(
        fixtures.join("namespace-and-job.json"),
    )?)?;
    let mut cluster = MemoryCluster::default();
    for item in list["items"].as_array().into_iter().flatten() {
        let meta = &item["metadata"];
        let name = meta["name"].as_str().unwrap_or_default().to_owned();
        match item["kind"].as_str() {
            Some("Namespace") => {
                cluster.namespaces.insert(name, strings(&meta["labels"]));
            }
            Some("Job") => {
                let namespace = meta["namespace"].as_str().unwrap_or_default().to_owned();
                cluster.jobs.insert(
                    (namespace, name),
                    (JOB_UID.to_owned(), strings(&meta["annotations"])),
                );
            }
            _ => {}
        }
    }
    Ok((serde_json::to_vec(&review)?, cluster))
}

/// The policy the binary builds from the flags `benches/wrk_compare.py` starts the webhook with
/// (`--datacenter-ids EU-RO-1,US-TX-3 --max-gpu-price 0.5`), the other flags at their defaults.
fn config() -> anyhow::Result<PolicyConfig> {
    let datacenters = ["EU-RO-1".to_owned(), "US-TX-3".to_owned()];
    let mut config = PolicyConfig::from_flags(&[], &datacenters, 0.5, None);
    config.vastai = VastPolicy {
        max_gpu_price: Some(0.5),
        ..VastPolicy::default()
    };
    config.allowed_cloud_types =
        vec![runpod_flags::cloud_type("SECURE").map_err(anyhow::Error::msg)?];
    Ok(config)
}

fn run() -> anyhow::Result<()> {
    let rounds = env_number("WEBHOOK_REVIEW_ROUNDS", 5)?.max(1);
    let iterations = env_number("WEBHOOK_REVIEW_ITERATIONS", 50_000)?.max(1);
    let (body, cluster) = fixture()?;
    let config = config()?;
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let review = || {
        runtime.block_on(async {
            let (response, _) = admit(&body, &cluster, &config).await?;
            anyhow::Ok(runpod_webhook::review::encode(&response))
        })
    };
    let answer: Value = serde_json::from_slice(&review()?)?;
    let response = &answer["response"];
    if response["allowed"] != Value::Bool(true) || response["patchType"] != "JSONPatch" {
        bail!("the fixture's review was not admitted with a patch: {answer}");
    }
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let started = Instant::now();
        for _ in 0..iterations {
            std::hint::black_box(review()?);
        }
        best = best.min(started.elapsed().as_secs_f64() * 1e6 / iterations as f64);
    }
    println!(
        "webhook_review: {:.2} µs per review (best of {rounds} rounds of {iterations}; {} \
         bytes in, {} out)",
        best,
        body.len(),
        serde_json::to_vec(&answer)?.len()
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("webhook_review: {error:#}");
            ExitCode::FAILURE
        }
    }
}
