//! Idle GPUs cost money: a pod whose GPUs all stay below `--idle-gpu-threshold` for
//! `--idle-gpu-after` is reported once per idle spell (a Warning Event `GpuIdle`) and counted.
//! Nothing is stopped: that is the owner's call. The decision is a pure function of the last
//! state, the sample and the clock; the state lives in memory only, so a restarted controller
//! starts every window again instead of firing at once on a pod idle since before it started.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::controller::clock::elapsed;

/// `--idle-gpu-threshold` and `--idle-gpu-after`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdleSettings {
    /// Utilization ratio (0..=1) below which a GPU counts as idle.
    pub threshold: f64,
    /// How long every GPU must stay below it; zero turns the check off.
    pub after: Duration,
}

impl Default for IdleSettings {
    fn default() -> Self {
        Self {
            threshold: 0.05,
            after: Duration::from_secs(30 * 60),
        }
    }
}

/// An idle spell in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spell {
    /// The first sample below the threshold.
    pub since: Timestamp,
    /// Reported already: the pod counts as idle and gets no second Event this spell.
    pub reported: bool,
}

/// What one sample decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub spell: Option<Spell>,
    /// `Some(idle time)` when the Event is due now.
    pub report: Option<Duration>,
}

/// Folds one sample into the spell. `busiest` is the busiest GPU's utilization in this list,
/// `None` without a live report (no GPU figure): that neither extends nor ends a spell. A
/// sample at or above the threshold ends it, so the next spell is reported again.
pub fn step(
    spell: Option<Spell>,
    busiest: Option<f64>,
    now: Timestamp,
    settings: IdleSettings,
) -> Step {
    if settings.after.is_zero() {
        return Step {
            spell: None,
            report: None,
        };
    }
    let Some(busiest) = busiest else {
        return Step {
            spell,
            report: None,
        };
    };
    if busiest >= settings.threshold {
        return Step {
            spell: None,
            report: None,
        };
    }
    let mut spell = spell.unwrap_or(Spell {
        since: now,
        reported: false,
    });
    let idle_for = elapsed(spell.since, now);
    let report = (!spell.reported && idle_for >= settings.after).then_some(idle_for);
    spell.reported |= report.is_some();
    Step {
        spell: Some(spell),
        report,
    }
}

/// The Event's message: how long and what it costs.
pub fn message(idle_for: Duration, threshold: f64, cost_per_hour: Option<f64>) -> String {
    let idle = humantime::format_duration(Duration::from_secs(idle_for.as_secs()));
    let cost = cost_per_hour.map_or_else(
        || "an unknown cost per hour".to_owned(),
        |c| format!("{c:.3} USD/h"),
    );
    format!(
        "every GPU of this pod has been below {:.0}% utilization for {idle} while it bills {cost}; nothing is stopped: delete the pod if it is no longer needed",
        threshold * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minutes: i64) -> Timestamp {
        Timestamp::from_second(1_767_225_600 + minutes * 60).unwrap()
    }

    const SETTINGS: IdleSettings = IdleSettings {
        threshold: 0.05,
        after: Duration::from_secs(30 * 60),
    };

    /// Runs samples (minute, busiest GPU) from a fresh controller; returns the minutes at
    /// which an Event was due, and whether the pod counts as idle at the end.
    fn run(samples: &[(i64, Option<f64>)], settings: IdleSettings) -> (Vec<i64>, bool) {
        let mut spell = None;
        let mut reports = Vec::new();
        for (minute, busiest) in samples {
            let next = step(spell, *busiest, at(*minute), settings);
            if next.report.is_some() {
                reports.push(*minute);
            }
            spell = next.spell;
        }
        (reports, spell.is_some_and(|s| s.reported))
    }

    #[test]
    fn idle_spells_are_reported_once_each() {
        let idle = Some(0.01);
        let busy = Some(0.9);
        type Case = (&'static str, Vec<(i64, Option<f64>)>, Vec<i64>, bool);
        let cases: [Case; 9] = [
            (
                "idle past the window: once",
                vec![(0, idle), (20, idle), (30, idle), (40, idle), (90, idle)],
                vec![30],
                true,
            ),
            (
                "idle but not long enough",
                vec![(0, idle), (29, idle)],
                vec![],
                false,
            ),
            (
                "a spike inside the window resets it",
                vec![(0, idle), (20, busy), (21, idle), (45, idle), (51, idle)],
                vec![51],
                true,
            ),
            (
                "busy all along",
                vec![(0, busy), (40, busy), (80, busy)],
                vec![],
                false,
            ),
            (
                "the threshold itself is busy",
                vec![(0, Some(0.05)), (40, Some(0.05))],
                vec![],
                false,
            ),
            (
                "a new spell after work is reported again",
                vec![(0, idle), (30, idle), (31, busy), (32, idle), (62, idle)],
                vec![30, 62],
                true,
            ),
            (
                "busy at the end: no longer idle",
                vec![(0, idle), (30, idle), (31, busy)],
                vec![30],
                false,
            ),
            (
                "a missing report neither ends nor extends",
                vec![(0, idle), (10, None), (30, idle)],
                vec![30],
                true,
            ),
            (
                "no report at all",
                vec![(0, None), (60, None)],
                vec![],
                false,
            ),
        ];
        for (name, samples, expected, idle_at_end) in cases {
            assert_eq!(run(&samples, SETTINGS), (expected, idle_at_end), "{name}");
        }
    }

    #[test]
    fn a_restarted_controller_starts_the_window_again() {
        // The first controller saw 25 idle minutes; its successor starts with no spell, so a
        // pod idle for hours is reported only a full window after the restart.
        let (before, _) = run(&[(0, Some(0.0)), (25, Some(0.0))], SETTINGS);
        assert!(before.is_empty());
        let (after, idle) = run(
            &[(26, Some(0.0)), (50, Some(0.0)), (56, Some(0.0))],
            SETTINGS,
        );
        assert_eq!((after, idle), (vec![56], true));
    }

    #[test]
    fn zero_turns_the_check_off() {
        let off = IdleSettings {
            after: Duration::ZERO,
            ..SETTINGS
        };
        assert_eq!(
            run(&[(0, Some(0.0)), (600, Some(0.0))], off),
            (vec![], false)
        );
    }

    #[test]
    fn the_message_names_the_idle_time_and_the_cost() {
        let text = message(Duration::from_secs(1830), 0.05, Some(0.44));
        assert!(text.contains("30m 30s"), "{text}");
        assert!(text.contains("0.440 USD/h"), "{text}");
        assert!(text.contains("below 5%"), "{text}");
    }
}
