//! Model test of money first at scale: a mass deletion while every reconcile worker is busy.
//! Workers take pods from one queue in reconcile order: first pods deleted earlier whose
//! instances are stopped already (each a DELETE, storage only), then the pods just deleted
//! (requeued until their stop was sent and the grace period passed, then a DELETE). The
//! billing task looks at the deleted pods (`due`) and sends their stops, each in its own task,
//! through the real rate limiter. Property: with any number of pods, workers and any quota,
//! once the stops are asked for, no DELETE of a stopped instance is sent while a deleted
//! pod's instance still waits for its stop.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use proptest::prelude::*;

use super::*;
use crate::controller::fixtures::instance;
use crate::controller::memory::PodMemory;
use crate::controller::pods::decide::ends::{EndCall, due};
use crate::provider::InstanceState;
use crate::runpod::limiter::{Priority, RateLimiter};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Stop,
    Delete,
}

/// A pod deleted with the default grace period, with one running instance.
fn deleted(uid: &str) -> (Pod, Instance) {
    let mut pod = Pod::default();
    pod.metadata.uid = Some(uid.to_owned());
    pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-01-01T00:00:00Z".parse().unwrap(),
    ));
    let running = Instance {
        state: InstanceState::Running,
        ..instance(&format!("i-{uid}"), "c1", "vr", Some(uid))
    };
    (pod, running)
}

/// Runs the model; returns what was sent once every stop was asked for, until the last stop.
async fn mass_deletion(earlier: usize, now: usize, workers: usize, quota: u32) -> Vec<Sent> {
    let limiter = RateLimiter::new(quota);
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let memory: Arc<Mutex<Vec<PodMemory>>> = Arc::new(Mutex::new(vec![PodMemory::default(); now]));
    // When each pod's stop was sent, on the (paused) clock of the model.
    let stopped_at: Arc<Mutex<Vec<Option<tokio::time::Instant>>>> =
        Arc::new(Mutex::new(vec![None; now]));
    let pods: Vec<(Pod, Instance)> = (0..now).map(|i| deleted(&format!("u{i}"))).collect();
    // The workers' queue: the earlier pods' DELETEs, then the pods just deleted.
    let queue: Arc<Mutex<VecDeque<Option<usize>>>> = Arc::new(Mutex::new(
        std::iter::repeat_n(None, earlier)
            .chain((0..now).map(Some))
            .collect(),
    ));
    for _ in 0..workers {
        let (limiter, sent, stopped_at, queue) = (
            limiter.clone(),
            sent.clone(),
            stopped_at.clone(),
            queue.clone(),
        );
        tokio::spawn(async move {
            loop {
                let Some(work) = queue.lock().unwrap().pop_front() else {
                    return;
                };
                if let Some(pod) = work {
                    let stopped = stopped_at.lock().unwrap()[pod];
                    if stopped.is_none_or(|at| at.elapsed() < Duration::from_secs(30)) {
                        // Requeued: the billing task sends the stop, the grace period runs.
                        queue.lock().unwrap().push_back(Some(pod));
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        continue;
                    }
                }
                drop(limiter.acquire(Priority::Cleanup).await);
                sent.lock().unwrap().push(Sent::Delete);
            }
        });
    }
    // The workers are busy with the earlier DELETEs when the pods are deleted.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut stops = Vec::new();
    for (index, (pod, running)) in pods.iter().enumerate() {
        let calls = due(&pod.metadata, [running], &memory.lock().unwrap()[index]);
        for (instance, call) in calls {
            assert_eq!(call, EndCall::Stop);
            let id = instance.id.clone();
            memory.lock().unwrap()[index].ending.insert(id.clone());
            let (limiter, sent, memory, stopped_at) = (
                limiter.clone(),
                sent.clone(),
                memory.clone(),
                stopped_at.clone(),
            );
            stops.push(tokio::spawn(async move {
                drop(limiter.acquire(Priority::EndsBilling).await);
                sent.lock().unwrap().push(Sent::Stop);
                stopped_at.lock().unwrap()[index] = Some(tokio::time::Instant::now());
                let mut memory = memory.lock().unwrap();
                memory[index].ending.remove(&id);
                memory[index].stopped.insert(id);
            }));
        }
    }
    // A second look finds nothing more to send: each stop is asked for once.
    for (index, (pod, running)) in pods.iter().enumerate() {
        assert!(due(&pod.metadata, [running], &memory.lock().unwrap()[index]).is_empty());
    }
    // Each stop task is in the limiter's line from its first poll on.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let asked = sent.lock().unwrap().len();
    for stop in stops {
        stop.await.unwrap();
    }
    sent.lock().unwrap()[asked..].to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn no_delete_of_a_stopped_instance_while_a_stop_waits(
        earlier in 0usize..300,
        now in 1usize..300,
        workers in 1usize..48,
        quota in 10u32..200,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let after = runtime.block_on(mass_deletion(earlier, now, workers, quota));
        let stops = after.iter().filter(|s| **s == Sent::Stop).count();
        prop_assert!(stops <= now);
        let last_stop = after.iter().rposition(|s| *s == Sent::Stop);
        let first_delete = after.iter().position(|s| *s == Sent::Delete);
        if let (Some(last_stop), Some(first_delete)) = (last_stop, first_delete) {
            prop_assert!(
                last_stop < first_delete,
                "a DELETE went while stops waited: {:?}",
                &after[..(last_stop + 1).min(after.len())]
            );
        }
    }
}
