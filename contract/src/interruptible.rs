//! Interruptible capacity and disruptions: a pod may run on a Vast.ai bid (cheaper, and taken
//! away whenever a higher bid comes), and a pod whose instance the cloud took away, on either
//! cloud, says so the way Kubernetes does (`DisruptionTarget`), so a Job's `podFailurePolicy`
//! can tell the cloud's doing from the program's.

use std::collections::BTreeMap;
use std::time::Duration;

/// `"true"`/`"false"`, or a bid ceiling in USD/h: the pod may run on an interruptible bid (pod,
/// then its Job; a namespace label's value is the default of its pods).
pub const INTERRUPTIBLE: &str = "runpod.io/interruptible";
/// The most the pod bids, USD/h for the instance's compute; opts the pod in by itself.
pub const BID_PER_HOUR: &str = "runpod.io/bid-per-hour";

/// The pod condition a lost instance sets (Kubernetes' own name for a pod about to be
/// terminated by a disruption: a Job's `podFailurePolicy` matches it).
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// The condition's reason when a higher bid took the machine.
pub const OUTBID: &str = "Outbid";
/// The condition's reason when the cloud lost or removed the instance (host gone, removed
/// outside runpod-kubelet, stopped by the cloud).
pub const CLOUD_INSTANCE_LOST: &str = "CloudInstanceLost";
/// The price class under which a Vast.ai node publishes what a bid costs (beside its
/// on-demand prices, which have no class): only a pod that opted in is compared at it.
pub const BID_CLASS: &str = "INTERRUPTIBLE";
/// How long the machine of a lost instance is avoided for the next placement of its pod (and of
/// the pods its owner makes next).
pub const AVOID_MACHINE_FOR: Duration = Duration::from_secs(30 * 60);

/// Whether a pod's end with `reason` is the cloud's doing, not the program's.
pub fn is_disruption(reason: &str) -> bool {
    reason == OUTBID || reason == CLOUD_INSTANCE_LOST
}

/// What a pod asked for: run on a bid, at most `max_bid` USD/h when it says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interruptible {
    pub max_bid: Option<f64>,
}

/// Reads [`INTERRUPTIBLE`] and [`BID_PER_HOUR`] from effective annotations. `Ok(None)`: an
/// on-demand pod. `Err` names the annotation and what it accepts.
pub fn interruptible(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<Interruptible>, String> {
    interruptible_in(|key| annotations.get(key).map(String::as_str))
}

/// [`interruptible`] for annotations read through `annotation` (effective annotations are not
/// a map of their own).
pub fn interruptible_in<'a>(
    annotation: impl Fn(&str) -> Option<&'a str>,
) -> Result<Option<Interruptible>, String> {
    let get = |key: &str| {
        annotation(key)
            .map(|value| value.trim())
            .filter(|value| !value.is_empty())
    };
    /// What [`INTERRUPTIBLE`] says.
    enum Flag {
        Off,
        On,
        Ceiling(f64),
    }
    let flag = match get(INTERRUPTIBLE) {
        None => None,
        Some("true") => Some(Flag::On),
        Some("false") => Some(Flag::Off),
        Some(value) => Some(Flag::Ceiling(crate::parse_price(value).map_err(|_| {
            format!(
                "{INTERRUPTIBLE}: {value:?} is not \"true\", \"false\" or a bid ceiling in USD \
                 per hour"
            )
        })?)),
    };
    let bid = match get(BID_PER_HOUR) {
        None => None,
        Some(value) => Some(
            crate::parse_price(value).map_err(|problem| format!("{BID_PER_HOUR}: {problem}"))?,
        ),
    };
    match (flag, bid) {
        (Some(Flag::Off), Some(_)) => Err(format!(
            "{BID_PER_HOUR} is set but {INTERRUPTIBLE} is \"false\": remove one"
        )),
        (Some(Flag::Off), None) | (None, None) => Ok(None),
        (Some(Flag::Ceiling(a)), Some(b)) if (a - b).abs() > 1e-9 => Err(format!(
            "{INTERRUPTIBLE} names a bid ceiling of {a} USD/h and {BID_PER_HOUR} one of {b}: \
             give one"
        )),
        (Some(Flag::Ceiling(ceiling)), _) => Ok(Some(Interruptible {
            max_bid: Some(ceiling),
        })),
        (Some(Flag::On), None) => Ok(Some(Interruptible { max_bid: None })),
        (_, Some(bid)) => Ok(Some(Interruptible { max_bid: Some(bid) })),
    }
}

/// Reads a namespace label's value (`runpod.io/interruptible=true`): the default of its pods.
/// Labels cannot hold every decimal, so only `true` and `false` are taken there.
pub fn namespace_default(value: &str) -> Result<bool, String> {
    crate::parse_flag(value.trim())
        .map_err(|problem| format!("namespace label {INTERRUPTIBLE}: {problem}"))
}

/// The bid to send for an offer whose minimum bid is `min_bid`: a tenth over the minimum (a bid
/// at the minimum is the first one outbid), rounded up to a tenth of a cent, never over the
/// pod's ceiling; `None` when the ceiling is under the minimum (the offer is not for this pod).
pub fn bid_for(min_bid: f64, ceiling: Option<f64>) -> Option<f64> {
    if !min_bid.is_finite() || min_bid < 0.0 {
        return None;
    }
    // Rounded up to a tenth of a cent, floating-point dust aside (0.2 × 1.1 is 0.22).
    let wanted = ((min_bid * 1.1 * 1000.0 - 1e-6).ceil() / 1000.0).max(0.001);
    match ceiling {
        Some(ceiling) if ceiling + 1e-9 < min_bid => None,
        Some(ceiling) => Some(wanted.min(ceiling)),
        None => Some(wanted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<Option<Interruptible>, String> {
        interruptible(
            &pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn a_pod_opts_in_by_flag_ceiling_or_bid() {
        assert_eq!(read(&[]), Ok(None));
        assert_eq!(read(&[(INTERRUPTIBLE, "false")]), Ok(None));
        assert_eq!(
            read(&[(INTERRUPTIBLE, "true")]),
            Ok(Some(Interruptible { max_bid: None }))
        );
        assert_eq!(
            read(&[(INTERRUPTIBLE, "0.25")]),
            Ok(Some(Interruptible {
                max_bid: Some(0.25)
            }))
        );
        assert_eq!(
            read(&[(BID_PER_HOUR, "0.3")]),
            Ok(Some(Interruptible { max_bid: Some(0.3) }))
        );
        assert_eq!(
            read(&[(INTERRUPTIBLE, "true"), (BID_PER_HOUR, "0.3")]),
            Ok(Some(Interruptible { max_bid: Some(0.3) }))
        );
    }

    #[test]
    fn contradictions_and_junk_are_named() {
        for (pairs, names) in [
            (vec![(INTERRUPTIBLE, "yes")], INTERRUPTIBLE),
            (vec![(INTERRUPTIBLE, "-1")], INTERRUPTIBLE),
            (vec![(BID_PER_HOUR, "0")], BID_PER_HOUR),
            (vec![(BID_PER_HOUR, "cheap")], BID_PER_HOUR),
            (
                vec![(INTERRUPTIBLE, "false"), (BID_PER_HOUR, "0.3")],
                BID_PER_HOUR,
            ),
            (
                vec![(INTERRUPTIBLE, "0.2"), (BID_PER_HOUR, "0.3")],
                BID_PER_HOUR,
            ),
        ] {
            let problem = read(&pairs).expect_err("refused");
            assert!(problem.contains(names), "{problem}");
        }
    }

    #[test]
    fn the_bid_is_a_tenth_over_the_minimum_within_the_ceiling() {
        assert_eq!(bid_for(0.2, None), Some(0.22));
        assert_eq!(bid_for(0.2, Some(0.21)), Some(0.21));
        assert_eq!(bid_for(0.2, Some(0.2)), Some(0.2));
        assert_eq!(bid_for(0.2, Some(0.19)), None);
        assert_eq!(bid_for(0.0, None), Some(0.001));
        assert_eq!(bid_for(f64::NAN, None), None);
    }

    #[test]
    fn only_lost_instances_are_disruptions() {
        assert!(is_disruption(OUTBID));
        assert!(is_disruption(CLOUD_INSTANCE_LOST));
        assert!(!is_disruption("Error"));
        assert!(!is_disruption("ProvisioningTimeout"));
    }

    #[test]
    fn a_namespace_label_says_true_or_false() {
        assert_eq!(namespace_default("true"), Ok(true));
        assert_eq!(namespace_default("false"), Ok(false));
        assert!(namespace_default("0.3").is_err());
    }
}
