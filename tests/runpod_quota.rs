//! The client-wide limiter under the spec's example quota of 60 requests per minute: with
//! work queued, the client uses the quota (at least 95% of it) without a single 429, and
//! creates/deletes are not starved by status polling. Takes a little over a minute.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod runpod_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use runpod_kubelet::runpod::client::{ApiKey, ClientConfig, RunPodClient};
use runpod_simulator::scenario::{RateLimitSpec, Scenario};
use runpod_simulator::{Operation, Simulator};
use runpod_support::{candidate, request_for};

const KEY: &str = "rpa_QUOTA_TEST_KEY";
const QUOTA: u32 = 60;
/// One full window plus the start of the second: the second window's quota must be used too.
const RUN_FOR: Duration = Duration::from_secs(68);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_per_minute_is_used_without_a_429() {
    let sim = Simulator::start(
        Scenario {
            rate_limits: vec![RateLimitSpec {
                name: "minute".into(),
                quota: QUOTA,
                window_secs: 60,
            }],
            provisioning_ms: 100,
            starting_ms: 100,
            ports_ms: 100,
            ..Scenario::default()
        },
        Some(KEY.to_owned()),
    )
    .await
    .unwrap();
    // Start from a wrong guess on purpose: the headers must correct it.
    let client = RunPodClient::new(
        ClientConfig {
            api_url: sim.base_url(),
            requests_per_minute: 600,
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
    let mut exchanges = sim.exchanges();
    // Answers are recorded as they complete; the service counted them on arrival.
    exchanges.sort_by_key(|ex| ex.arrival);
    for worker in workers {
        worker.abort();
    }

    let refused = exchanges.iter().filter(|ex| ex.status == 429).count();
    let accepted = exchanges.iter().filter(|ex| ex.status != 429).count() as u32;
    let urgent = exchanges
        .iter()
        .filter(|ex| {
            matches!(
                ex.operation,
                Some(Operation::CreatePod | Operation::DeletePod)
            )
        })
        .count();
    println!(
        "quota {QUOTA}/min over {:?}: {accepted} requests answered ({} polls, {} create/delete cycles, {urgent} creates+deletes), {refused} refused with 429",
        started.elapsed(),
        polls.load(Ordering::Relaxed),
        cycles.load(Ordering::Relaxed),
    );
    assert_eq!(refused, 0, "the limiter sent requests the service refused");
    // Split the answered requests into the service's windows by the remaining count it
    // reported ("minute";r=..), which only rises when a new window starts.
    let remaining: Vec<u32> = exchanges
        .iter()
        .filter(|ex| ex.status != 429)
        .filter_map(|ex| minute_remaining(ex.header("ratelimit")?))
        .collect();
    assert_eq!(
        remaining.len() as u32,
        accepted,
        "every answer carries RateLimit"
    );
    let mut windows: Vec<u32> = Vec::new();
    let mut previous = u32::MAX;
    for r in remaining {
        if windows.is_empty() || r > previous.saturating_add(10) {
            windows.push(r);
        }
        let lowest = windows.last_mut().unwrap();
        *lowest = (*lowest).min(r);
        previous = r;
    }
    println!("lowest remaining per window: {windows:?}");
    assert!(
        windows.len() >= 2,
        "the client resumed after the window reset: {windows:?}"
    );
    // Every window that ended during the run was used to at least 95% of its quota.
    for lowest in &windows[..windows.len() - 1] {
        let used = QUOTA - lowest;
        assert!(
            f64::from(used) >= 0.95 * f64::from(QUOTA),
            "only {used} of {QUOTA} used in a window: {windows:?}"
        );
    }
    // Creates kept flowing while polls saturated the quota: the reserve lets two cycles
    // through per window (without it, one per window: polls drain each window at its start).
    assert!(cycles.load(Ordering::Relaxed) >= 3, "creates were starved");
    assert!(live_after_cleanup(&sim));
    let violations = runpod_simulator::contract::SpecValidator::load().check_all(&exchanges);
    assert!(violations.is_empty(), "{violations:#?}");
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

fn live_after_cleanup(sim: &runpod_simulator::SimulatorHandle) -> bool {
    // An aborted cycle may leave one pod; everything else was deleted.
    runpod_simulator::live_pods(&sim.ledger()).len() <= 1
}
