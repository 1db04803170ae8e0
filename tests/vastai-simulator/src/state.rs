//! The simulator's shared state: the scenario and one lock around everything that changes.
//! The lock is never held across an `.await`; billing advances on every access and on a tick.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::faults::FaultSet;
use crate::instance::{Instance, Timings};
use crate::ledger::LedgerEntry;
use crate::logs::LogRequest;
use crate::ratelimit::{Limiter, Route};
use crate::scenario::{OfferSpec, Scenario};

/// Everything that changes while the simulator runs.
#[derive(Debug)]
pub(crate) struct World {
    /// Every instance ever created, destroyed ones included (the ledger).
    pub instances: BTreeMap<u64, Instance>,
    /// The market: offers not bought yet, by id.
    pub offers: BTreeMap<u64, OfferSpec>,
    /// Offers bought or taken by someone else: a create naming them answers `no_such_ask`.
    pub gone: BTreeSet<u64>,
    pub faults: FaultSet,
    pub limiter: Limiter,
    pub log_requests: HashMap<String, LogRequest>,
    /// Requests per route that got past authentication (refused ones included).
    pub counts: BTreeMap<Route, u64>,
    /// Requests per route refused with 429.
    pub limited: BTreeMap<Route, u64>,
    pub next_id: u64,
    pub rng: fastrand::Rng,
}

/// Shared by every request handler and the handle.
#[derive(Debug)]
pub(crate) struct Shared {
    pub scenario: Scenario,
    api_key: Option<String>,
    world: Mutex<World>,
    shutting_down: AtomicBool,
    /// Wall-clock at `start`, for epoch timestamps from monotonic instants.
    start: (Instant, SystemTime),
}

impl Shared {
    pub fn new(scenario: Scenario, api_key: Option<String>) -> Shared {
        let world = World {
            instances: BTreeMap::new(),
            offers: scenario.offers.iter().map(|o| (o.id, o.clone())).collect(),
            gone: BTreeSet::new(),
            faults: FaultSet::new(scenario.faults.clone()),
            limiter: Limiter::new(&scenario.rate_limits.0),
            log_requests: HashMap::new(),
            counts: BTreeMap::new(),
            limited: BTreeMap::new(),
            next_id: 7_000_001,
            rng: fastrand::Rng::new(),
        };
        Shared {
            scenario,
            api_key,
            world: Mutex::new(world),
            shutting_down: AtomicBool::new(false),
            start: (Instant::now(), SystemTime::now()),
        }
    }

    pub fn timings(&self) -> Timings {
        Timings {
            provisioning: Duration::from_millis(self.scenario.provisioning_ms),
            loading: Duration::from_millis(self.scenario.loading_ms),
        }
    }

    /// Epoch seconds at `at`.
    pub fn epoch(&self, at: Instant) -> f64 {
        let wall = self.start.1 + at.saturating_duration_since(self.start.0);
        wall.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64())
    }

    /// Whether `token` may call the API (`None` key: any non-empty token).
    pub fn accepts(&self, token: &str) -> bool {
        match &self.api_key {
            Some(key) => key == token,
            None => !token.is_empty(),
        }
    }

    /// Runs `f` on the world after billing every instance up to now.
    pub fn with_world<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
        let mut world = self.world.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let timings = self.timings();
        for instance in world.instances.values_mut() {
            instance.bill(now, timings);
        }
        f(&mut world)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// The ledger, in creation order.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        let timings = self.timings();
        self.with_world(|world| {
            let now = Instant::now();
            world
                .instances
                .values()
                .map(|instance| LedgerEntry {
                    id: instance.id,
                    offer_id: instance.offer.id,
                    label: instance.order.label.clone(),
                    image: instance.order.image.clone(),
                    env: instance.order.env.clone(),
                    ports: instance.order.ports.clone(),
                    disk: instance.order.disk,
                    runtype: instance.order.runtype.clone(),
                    onstart: instance.order.onstart.clone(),
                    args: instance.order.args.clone(),
                    image_login: instance.order.image_login,
                    gpu_name: instance.offer.gpu_name.clone(),
                    machine_id: instance.offer.machine_id,
                    bid: instance.order.bid,
                    outbid: instance.outbid,
                    num_gpus: instance.offer.num_gpus,
                    geolocation: instance.offer.geolocation.clone(),
                    dph_total: instance.dph_total(),
                    status: instance
                        .status(instance.destroyed.unwrap_or(now), timings)
                        .0,
                    created_at: instance.created_epoch,
                    destroyed_at: instance.destroyed_epoch,
                    gpu_billing_ended_at: instance.gpu_billing_ended(timings),
                    create_status: instance.create_status,
                    gpu_cost: instance.gpu_cost,
                    storage_cost: instance.storage_billed,
                })
                .collect()
        })
    }
}
