//! The simulator's shared state: the immutable scenario and one lock around everything that
//! changes (pods, logs, faults, rate-limit windows, recorded exchanges).
//!
//! The lock is never held across an `.await`. Pod lifecycles advance lazily: every access first
//! moves each pod to where its timers say it is now (a ticker does the same for log followers).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use tokio::sync::watch;

use crate::contract::SpecValidator;
use crate::exchange::Exchange;
use crate::faults::FaultSet;
use crate::lifecycle::{self, Events};
use crate::logs::{LogSource, LogStore};
use crate::pods::{PodRecord, PodStatus};
use crate::ratelimit::RateLimiter;
use crate::scenario::Scenario;
use crate::timefmt;

/// Maps monotonic instants to wall-clock timestamps, so timers use `Instant` and responses
/// still carry consistent RFC 3339 times.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    instant: Instant,
    system: SystemTime,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            instant: Instant::now(),
            system: SystemTime::now(),
        }
    }

    /// Wall-clock time of `at`, truncated to microseconds.
    pub fn system(&self, at: Instant) -> SystemTime {
        timefmt::truncate_micros(self.system + at.saturating_duration_since(self.instant))
    }
}

/// Everything that changes while the simulator runs.
#[derive(Debug)]
pub(crate) struct World {
    /// Every pod ever created, in creation order (terminated ones stay, for the ledger).
    pub pods: Vec<PodRecord>,
    index: HashMap<String, usize>,
    pub faults: FaultSet,
    pub limiter: RateLimiter,
    pub exchanges: VecDeque<Exchange>,
    /// Requests seen so far; numbers each [`Exchange`] by its arrival.
    arrivals: u64,
    pub logs: LogStore,
    pub rng: fastrand::Rng,
    /// Set when log followers should look again (a line was added, a pod terminated).
    dirty: bool,
    /// Every network volume ever created (deleted ones stay, for the ledger).
    pub volumes: Vec<crate::volumes::VolumeRecord>,
}

impl World {
    fn new(scenario: &Scenario) -> World {
        World {
            pods: Vec::new(),
            index: HashMap::new(),
            faults: FaultSet::new(scenario.faults.clone()),
            limiter: RateLimiter::new(&scenario.rate_limits),
            exchanges: VecDeque::new(),
            arrivals: 0,
            logs: LogStore::default(),
            rng: fastrand::Rng::new(),
            dirty: false,
            volumes: Vec::new(),
        }
    }

    /// The next arrival number: taken under the same lock as the rate-limit decision, so
    /// arrival order is the order the rate limiter counted requests in.
    pub fn next_arrival(&mut self) -> u64 {
        self.arrivals += 1;
        self.arrivals
    }

    /// Any pod, terminated or not.
    pub fn pod(&self, id: &str) -> Option<&PodRecord> {
        self.index.get(id).and_then(|&i| self.pods.get(i))
    }

    /// A pod that still exists (not terminated): what the API can see.
    pub fn live_pod_mut(&mut self, id: &str) -> Option<&mut PodRecord> {
        let i = *self.index.get(id)?;
        self.pods.get_mut(i).filter(|p| !p.is_terminated())
    }

    /// A pod that still exists (not terminated).
    pub fn live_pod(&self, id: &str) -> Option<&PodRecord> {
        self.pod(id).filter(|p| !p.is_terminated())
    }

    /// A fresh pod id: 14 lowercase alphanumerics, never reused.
    pub fn new_pod_id(&mut self) -> String {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        loop {
            let id: String = (0..14)
                .map(|_| char::from(ALPHABET[self.rng.usize(..ALPHABET.len())]))
                .collect();
            if !self.index.contains_key(&id) {
                return id;
            }
        }
    }

    pub fn insert_pod(&mut self, pod: PodRecord) {
        self.index.insert(pod.id.clone(), self.pods.len());
        self.pods.push(pod);
        self.dirty = true;
    }

    /// Appends a log line for a pod.
    pub fn log(&mut self, pod_id: &str, source: LogSource, line: &str, ts: SystemTime) {
        self.logs.append(pod_id, source, line, ts);
        self.dirty = true;
    }

    /// Terminates a live pod (ledger `terminated_at` set); false if unknown or already gone.
    pub fn terminate(&mut self, id: &str, now: Instant, clock: &Clock) -> bool {
        let Some(pod) = self.live_pod_mut(id) else {
            return false;
        };
        let ts = clock.system(now);
        pod.status = PodStatus::Terminated;
        pod.phase_since = now;
        pod.running_since = None;
        crate::lifecycle::unpublish(pod);
        pod.terminated_at = Some(ts);
        pod.stopped_at.get_or_insert(ts);
        let id = pod.id.clone();
        self.log(&id, LogSource::System, "Pod terminated", ts);
        true
    }

    /// Moves every live pod along its timers up to `now`.
    fn advance(&mut self, now: Instant, scenario: &Scenario, clock: &Clock) {
        let timing = lifecycle::Timing::from(scenario);
        let mut events = Events::new(clock);
        for pod in self.pods.iter_mut().filter(|p| !p.is_terminated()) {
            for output in crate::process::drain(&pod.id) {
                match output {
                    crate::process::Output::Line(line, at) => {
                        events.push(pod, LogSource::Container, line, at.min(now));
                    }
                    crate::process::Output::Exit(code, at) => {
                        lifecycle::process_ended(pod, code, at.min(now), &mut events);
                    }
                }
            }
            lifecycle::advance(pod, now, &timing, &mut self.rng, &mut events);
        }
        self.flush(events);
    }

    /// Appends the log lines transitions produced.
    pub fn flush(&mut self, events: Events<'_>) {
        for event in events.out {
            self.log(&event.pod_id, event.source, &event.line, event.ts);
        }
    }
}

/// State shared by the server, its handle and every request.
pub(crate) struct Shared {
    pub scenario: Scenario,
    api_key: Option<String>,
    pub spec: &'static SpecValidator,
    pub clock: Clock,
    world: Mutex<World>,
    changes: watch::Sender<u64>,
    shutting_down: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the API key.
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    pub fn new(scenario: Scenario, api_key: Option<String>) -> Shared {
        let world = World::new(&scenario);
        Shared {
            scenario,
            api_key,
            spec: SpecValidator::shared(),
            clock: Clock::new(),
            world: Mutex::new(world),
            changes: watch::channel(0).0,
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Whether this bearer token is accepted: any non-empty token when no key is configured,
    /// otherwise exactly the configured key.
    pub fn accepts(&self, token: &str) -> bool {
        match &self.api_key {
            Some(key) => constant_time_eq(key.as_bytes(), token.as_bytes()),
            None => !token.is_empty(),
        }
    }

    /// Runs `f` on the world after advancing every pod to now; wakes log followers if needed.
    pub fn with_world<R>(&self, f: impl FnOnce(&mut World) -> R) -> R {
        let now = Instant::now();
        let mut world = self.world.lock().unwrap_or_else(PoisonError::into_inner);
        world.advance(now, &self.scenario, &self.clock);
        let result = f(&mut world);
        let dirty = std::mem::take(&mut world.dirty);
        drop(world);
        if dirty {
            self.changes.send_modify(|v| *v = v.wrapping_add(1));
        }
        result
    }

    /// A receiver that changes whenever log followers should look again.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        let mut rx = self.changes.subscribe();
        rx.borrow_and_update();
        rx
    }

    /// Ends log streams so a graceful shutdown does not wait for them.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
