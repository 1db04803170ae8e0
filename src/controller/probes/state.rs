//! What a run of probes means, as the kubelet counts it: a result flips only after its
//! threshold of the same answers in a row; the startup probe holds the others back until it
//! succeeds; a liveness or startup probe that fails its threshold restarts the container.

use std::collections::HashMap;
use std::time::Duration;

use super::spec::{Kind, Spec};

/// What the probes say of a pod's container, for its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probed {
    /// `None`: no readiness probe (the ports decide).
    pub ready: Option<bool>,
    /// The startup probe succeeded, or there is none.
    pub started: bool,
}

/// The counters of one probe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Counter {
    successes: u32,
    failures: u32,
    /// The result as it stands: `None` until the first threshold is met.
    result: Option<bool>,
}

/// Every probe of one container since it (re)started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Probing {
    counters: HashMap<Kind, Counter>,
}

/// What one answer changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing anybody needs to hear of.
    Nothing,
    /// The probe failed (an `Unhealthy` Event), its result unchanged or now failed.
    Unhealthy,
    /// The container must be restarted (it failed its liveness or startup probe).
    Restart,
}

impl Probing {
    /// Whether `kind` runs now: liveness and readiness only once the startup probe (if any)
    /// has succeeded.
    pub(crate) fn runs(&self, kind: Kind, has_startup: bool) -> bool {
        kind == Kind::Startup && !self.started(has_startup)
            || kind != Kind::Startup && self.started(has_startup)
    }

    /// Whether the container counts as started: no startup probe, or it succeeded.
    pub(crate) fn started(&self, has_startup: bool) -> bool {
        !has_startup || self.result(Kind::Startup) == Some(true)
    }

    /// Whether the container is ready: never before it started (its startup probe passed),
    /// then its readiness probe's result (not ready until it first succeeds); `None` without
    /// either probe (the ports decide).
    pub(crate) fn ready(&self, has_readiness: bool, has_startup: bool) -> Option<bool> {
        (has_readiness || has_startup).then(|| {
            self.started(has_startup)
                && (!has_readiness || self.result(Kind::Readiness) == Some(true))
        })
    }

    fn result(&self, kind: Kind) -> Option<bool> {
        self.counters.get(&kind).and_then(|c| c.result)
    }

    /// Counts one answer of `spec`'s probe.
    pub(crate) fn observe(&mut self, spec: &Spec, success: bool) -> Verdict {
        let counter = self.counters.entry(spec.kind).or_default();
        if success {
            counter.failures = 0;
            counter.successes = counter.successes.saturating_add(1);
            if counter.successes >= spec.success_threshold {
                counter.result = Some(true);
            }
            return Verdict::Nothing;
        }
        counter.successes = 0;
        counter.failures = counter.failures.saturating_add(1);
        if counter.failures < spec.failure_threshold {
            return Verdict::Unhealthy;
        }
        counter.result = Some(false);
        match spec.kind {
            Kind::Readiness => Verdict::Unhealthy,
            Kind::Liveness | Kind::Startup => {
                // The container starts over, and so do its probes.
                self.counters.clear();
                Verdict::Restart
            }
        }
    }

    /// The container restarted (by the cloud, or after a probe): everything starts over.
    pub(crate) fn restarted(&mut self) {
        self.counters.clear();
    }
}

/// When a probe is due next: `initial_delay` after the container started for the first run,
/// then every `period` after the last.
pub(crate) fn next_run(
    spec: &Spec,
    running_for: Duration,
    last_run_ago: Option<Duration>,
) -> Duration {
    match last_run_ago {
        None => spec.initial_delay.saturating_sub(running_for),
        Some(ago) => spec.period.saturating_sub(ago),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::probes::spec::Check;

    fn spec(kind: Kind, success: u32, failure: u32) -> Spec {
        Spec {
            kind,
            check: Check::Tcp { port: 80 },
            initial_delay: Duration::from_secs(5),
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    #[test]
    fn readiness_needs_its_successes_in_a_row_and_its_failures_to_go_back() {
        let readiness = spec(Kind::Readiness, 2, 3);
        let mut probing = Probing::default();
        assert_eq!(
            probing.ready(true, false),
            Some(false),
            "not ready before a success"
        );
        assert_eq!(probing.ready(false, false), None, "no probe: ports decide");
        assert_eq!(probing.observe(&readiness, true), Verdict::Nothing);
        assert_eq!(probing.ready(true, false), Some(false));
        probing.observe(&readiness, true);
        assert_eq!(probing.ready(true, false), Some(true));
        assert_eq!(probing.observe(&readiness, false), Verdict::Unhealthy);
        probing.observe(&readiness, false);
        assert_eq!(
            probing.ready(true, false),
            Some(true),
            "two failures of three"
        );
        assert_eq!(probing.observe(&readiness, false), Verdict::Unhealthy);
        assert_eq!(probing.ready(true, false), Some(false));
        // A readiness failure never restarts.
        assert_eq!(probing.observe(&readiness, false), Verdict::Unhealthy);
    }

    #[test]
    fn liveness_restarts_after_its_threshold_and_starts_over() {
        let liveness = spec(Kind::Liveness, 1, 2);
        let mut probing = Probing::default();
        assert_eq!(probing.observe(&liveness, false), Verdict::Unhealthy);
        assert_eq!(probing.observe(&liveness, true), Verdict::Nothing);
        assert_eq!(
            probing.observe(&liveness, false),
            Verdict::Unhealthy,
            "the success reset the count"
        );
        assert_eq!(probing.observe(&liveness, false), Verdict::Restart);
        assert_eq!(
            probing,
            Probing::default(),
            "the new container's probes start over"
        );
    }

    #[test]
    fn the_startup_probe_holds_the_others_back() {
        let startup = spec(Kind::Startup, 1, 3);
        let mut probing = Probing::default();
        assert!(probing.runs(Kind::Startup, true));
        assert!(!probing.runs(Kind::Liveness, true));
        assert!(!probing.runs(Kind::Readiness, true));
        assert!(!probing.started(true));
        assert_eq!(probing.ready(true, true), Some(false));
        assert_eq!(
            probing.ready(false, true),
            Some(false),
            "not ready before it started"
        );
        probing.observe(&startup, true);
        assert!(probing.started(true));
        assert_eq!(
            probing.ready(false, true),
            Some(true),
            "started, no readiness probe"
        );
        assert!(
            !probing.runs(Kind::Startup, true),
            "it runs until it succeeds, then no more"
        );
        assert!(probing.runs(Kind::Liveness, true));
        // Without a startup probe everything runs at once.
        assert!(Probing::default().runs(Kind::Readiness, false));
        assert!(!Probing::default().runs(Kind::Startup, false));
        // A startup probe that fails its threshold restarts the container.
        let mut failing = Probing::default();
        failing.observe(&startup, false);
        failing.observe(&startup, false);
        assert_eq!(failing.observe(&startup, false), Verdict::Restart);
    }

    #[test]
    fn the_first_run_waits_for_the_initial_delay_then_every_period() {
        let s = spec(Kind::Readiness, 1, 3);
        assert_eq!(
            next_run(&s, Duration::from_secs(2), None),
            Duration::from_secs(3)
        );
        assert_eq!(next_run(&s, Duration::from_secs(9), None), Duration::ZERO);
        assert_eq!(
            next_run(&s, Duration::from_secs(60), Some(Duration::from_secs(4))),
            Duration::from_secs(6)
        );
        assert_eq!(
            next_run(&s, Duration::from_secs(60), Some(Duration::from_secs(11))),
            Duration::ZERO
        );
    }
}
