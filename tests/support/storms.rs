//! Storms and calms for the soaks: kills and new faults come in storms, each followed by a
//! calm in which the controller can make progress (a controller killed every few seconds while
//! the cloud fails a third of its calls forever must never double-bill or leak, but need not
//! finish pods).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::controller::SimulatorProcess;

/// How long storms and calms last.
#[derive(Debug, Clone, Copy)]
pub struct Storms {
    pub storm: Duration,
    pub calm: Duration,
}

impl Storms {
    /// Whether `since` (the start of the run) is in a storm now.
    pub fn stormy(&self, since: tokio::time::Instant) -> bool {
        let period = (self.storm + self.calm).as_millis();
        since.elapsed().as_millis() % period < self.storm.as_millis()
    }

    /// Injects one of `faults` (seeded) every 0.5-2.5 s of the storms until `stop`; a calm
    /// clears what a storm left queued (an outage's remaining 503s). Returns how many rules it
    /// injected.
    pub async fn inject(
        self,
        simulator: Arc<SimulatorProcess>,
        faults: Vec<serde_json::Value>,
        stop: Arc<AtomicBool>,
        seed: u64,
    ) -> u32 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut injected = 0;
        let since = tokio::time::Instant::now();
        let mut cleared = false;
        while !stop.load(Ordering::SeqCst) {
            if !self.stormy(since) {
                if !cleared && let Err(error) = simulator.clear_faults().await {
                    eprintln!("clearing the faults failed: {error:#}");
                }
                cleared = true;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            cleared = false;
            let fault = &faults[rng.usize(..faults.len())];
            match simulator.inject(fault).await {
                Ok(()) => injected += 1,
                Err(error) => eprintln!("injecting a fault failed: {error:#}"),
            }
            tokio::time::sleep(Duration::from_millis(rng.u64(500..2500))).await;
        }
        injected
    }
}
