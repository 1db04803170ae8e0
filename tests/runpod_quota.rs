//! The client-wide limiter under the spec's example quota of 60 requests per minute, against
//! each window model a gateway may count with (fixed windows, sliding windows, GCRA token
//! buckets; `t` as "until the next slot" or "until the whole quota is back"; a server that
//! sends no counts at all): with work queued, the client uses the quota (at least 95% of it)
//! without a single 429, and creates/deletes are not starved by status polling. The models run
//! side by side; the whole test takes a little over a minute.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod runpod_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use runpod_kubelet::http::ApiKey;
use runpod_kubelet::runpod::client::RunPodClient;
use runpod_kubelet::runpod::config::ClientConfig;
use runpod_simulator::scenario::{RateLimitSpec, ResetStyle, Scenario, WindowModel};
use runpod_simulator::{Operation, Simulator};
use runpod_support::{candidate, request_for};

const KEY: &str = "rpa_QUOTA_TEST_KEY";
const QUOTA: u32 = 60;
const WINDOW: Duration = Duration::from_secs(60);
/// One full window plus the start of the second: the second window's quota must be used too.
const RUN_FOR: Duration = Duration::from_secs(68);

/// What one server model let through.
#[derive(Debug)]
struct Outcome {
    label: String,
    accepted: u32,
    refused: usize,
    polls: u32,
    cycles: u32,
    urgent: usize,
    elapsed: Duration,
    leftovers: usize,
    violations: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_per_minute_is_used_without_a_429_under_every_window_model() {
    let models = [
        (WindowModel::Fixed, ResetStyle::Next, true),
        (WindowModel::Sliding, ResetStyle::Full, true),
        (WindowModel::Sliding, ResetStyle::Next, true),
        (WindowModel::Gcra, ResetStyle::Full, true),
        (WindowModel::Gcra, ResetStyle::Next, true),
        // No counts at all: the configured quota is all the client knows.
        (WindowModel::Sliding, ResetStyle::Next, false),
    ];
    let outcomes =
        futures_util::future::join_all(models.into_iter().map(|(model, reset, headers)| {
            use_the_quota(RateLimitSpec {
                name: "minute".into(),
                quota: QUOTA,
                window_secs: WINDOW.as_secs(),
                model,
                reset,
                headers,
            })
        }))
        .await;
    for outcome in &outcomes {
        println!(
            "{}: {} requests answered in {:?} ({} polls, {} create/delete cycles, {} creates+deletes), {} refused with 429",
            outcome.label,
            outcome.accepted,
            outcome.elapsed,
            outcome.polls,
            outcome.cycles,
            outcome.urgent,
            outcome.refused
        );
    }
    for outcome in &outcomes {
        let label = &outcome.label;
        assert_eq!(
            outcome.refused, 0,
            "{label}: the limiter sent requests the service refused"
        );
        // From a fresh quota, a server of `QUOTA` per window lets at most a quota per window
        // started through (a token bucket a little more): at least 95% of that was used.
        let windows = outcome.elapsed.as_secs_f64() / WINDOW.as_secs_f64();
        let possible = f64::from(QUOTA) * windows.ceil();
        assert!(
            f64::from(outcome.accepted) >= 0.95 * possible,
            "{label}: only {} of {possible} used",
            outcome.accepted
        );
        // Creates kept flowing while polls saturated the quota.
        assert!(outcome.cycles >= 3, "{label}: creates were starved");
        // An aborted cycle may leave one pod; everything else was deleted.
        assert!(outcome.leftovers <= 1, "{label}: pods left behind");
        assert_eq!(outcome.violations, 0, "{label}: contract violations");
    }
}

async fn use_the_quota(spec: RateLimitSpec) -> Outcome {
    let label = format!(
        "{:?} window, t = {:?}{}",
        spec.model,
        spec.reset,
        if spec.headers { "" } else { ", no headers" }
    );
    let headers = spec.headers;
    let sim = Simulator::start(
        Scenario {
            rate_limits: vec![spec],
            provisioning_ms: 100,
            starting_ms: 100,
            ports_ms: 100,
            ..Scenario::default()
        },
        Some(KEY.to_owned()),
    )
    .await
    .unwrap();
    // With headers, start from a wrong guess on purpose: the headers must correct it. Without
    // them the configured quota is the only source, so it is right.
    let client = RunPodClient::new(
        ClientConfig {
            api_url: sim.base_url(),
            requests_per_minute: if headers { 600 } else { QUOTA },
            ..ClientConfig::default()
        },
        ApiKey::new(KEY.to_owned()).unwrap(),
    )
    .unwrap();
    // Learn the real policy with the first request, like a controller's first list.
    client.list_pods().await.unwrap();
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let polls = Arc::new(AtomicU32::new(0));
    let cycles = Arc::new(AtomicU32::new(0));
    let mut workers = Vec::new();
    // Four concurrent pollers (status polls, log streams…) plus creates and deletes: answers
    // arrive out of order, which the limiter must handle without a 429 or wasted quota.
    for _ in 0..4 {
        let (client, stop, polls) = (client.clone(), Arc::clone(&stop), Arc::clone(&polls));
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                client.list_pods().await.unwrap();
                polls.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    {
        let (client, stop, cycles) = (client.clone(), Arc::clone(&stop), Arc::clone(&cycles));
        workers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let name = format!("quota-{n}");
                let placed = client
                    .create_idempotent(
                        &name,
                        &[candidate("NVIDIA GeForce RTX 4090", &[])],
                        request_for(&name),
                    )
                    .await
                    .unwrap();
                client.delete_pod(&placed.pod.id).await.unwrap();
                cycles.fetch_add(1, Ordering::Relaxed);
                // A create every few seconds, like pods arriving.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
    }
    tokio::time::sleep(RUN_FOR.saturating_sub(started.elapsed())).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let exchanges = sim.exchanges();
    for worker in workers {
        worker.abort();
    }
    let refused = exchanges.iter().filter(|ex| ex.status == 429).count();
    // Less the first list, which ran before the clock started.
    let accepted =
        (exchanges.iter().filter(|ex| ex.status != 429).count() as u32).saturating_sub(1);
    let urgent = exchanges
        .iter()
        .filter(|ex| {
            matches!(
                ex.operation,
                Some(Operation::CreatePod | Operation::DeletePod)
            )
        })
        .count();
    if headers {
        let reported = exchanges
            .iter()
            .filter(|ex| ex.status != 429)
            .filter_map(|ex| minute_remaining(ex.header("ratelimit")?))
            .count() as u32;
        assert_eq!(
            reported,
            accepted + 1,
            "{label}: every answer carries RateLimit"
        );
    }
    let violations = runpod_simulator::contract::SpecValidator::load()
        .check_all(&exchanges)
        .len();
    Outcome {
        label,
        accepted,
        refused,
        polls: polls.load(Ordering::Relaxed),
        cycles: cycles.load(Ordering::Relaxed),
        urgent,
        elapsed,
        leftovers: runpod_simulator::live_pods(&sim.ledger()).len(),
        violations,
    }
}

/// `r` of the `minute` member of a `RateLimit` header.
fn minute_remaining(header: &str) -> Option<u32> {
    let member = header
        .split(',')
        .find(|m| m.trim().starts_with("\"minute\""))?;
    member
        .split(';')
        .find_map(|param| param.trim().strip_prefix("r="))?
        .parse()
        .ok()
}
