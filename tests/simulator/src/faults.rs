//! Fault injection: rules that make the simulator misbehave the way RunPod does (402, 403, 5xx
//! after a real create, stock-outs the catalogue did not predict, slow answers, pods placed
//! outside the requested data centres).
//!
//! Rules are checked in insertion order after authentication and rate limiting. A rule with
//! `times: Some(n)` is removed once it has fired `n` times.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exchange::Operation;

/// One rule: when a request matches `when`, apply `effect` (at most `times` times).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// Which requests the rule applies to; an empty match applies to every request.
    #[serde(default)]
    pub when: Match,
    /// What happens to a matching request.
    pub effect: Effect,
    /// How many times the rule fires before it is removed; `None` = until cleared.
    #[serde(default)]
    pub times: Option<u32>,
}

/// Conditions on a request; every field that is set must match.
///
/// - `gpu_id`: the create body's `gpu.id`; for pod operations the pod's GPU type; for
///   `getGpuType` the GPU id in the path.
/// - `data_center_id`: for `createPod` the data centre placement picks (so a rule for
///   `EU-RO-1` fires when the pod would land there); for pod operations the pod's data centre;
///   for `getDataCenter` the id in the path. For [`Effect::Capacity`] it names the data centre
///   to take out of placement instead; for [`Effect::Misplace`] the data centre to put the pod
///   in (any other one with stock when unset).
/// - `pod_name`: the create body's `name`, or the existing pod's name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Match {
    pub operation: Option<Operation>,
    pub gpu_id: Option<String>,
    pub data_center_id: Option<String>,
    pub pod_name: Option<String>,
}

/// What a matching fault does.
///
/// JSON form (internally tagged): `{"kind":"status","status":402,"detail":"…"}`,
/// `{"kind":"create_then_fail","status":500}`, `{"kind":"delay","millis":2000}`,
/// `{"kind":"capacity"}`, `{"kind":"misplace"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Effect {
    /// Answer with this problem+json status and do nothing else.
    Status {
        status: u16,
        #[serde(default)]
        detail: Option<String>,
        /// Adds `Retry-After: <secs>` (useful with 429 and 503).
        #[serde(default)]
        retry_after: Option<u32>,
    },
    /// Do the operation for real (createPod creates and bills the pod), then answer this status
    /// (api-notes P3). On other operations the side effect also happens before the error.
    CreateThenFail { status: u16 },
    /// Answer normally, but only after this delay (the side effect happens at once).
    Delay { millis: u64 },
    /// createPod only: no capacity for the matching GPU type (in `data_center_id`, or
    /// everywhere when unset); create answers the capacity 400 if nothing else can be placed.
    Capacity,
    /// createPod only: the pod is placed in a data centre the request's `dataCenterIds` did not
    /// name (RunPod treats the list as a preference), one with stock of the GPU type. A request
    /// naming no data centres allows all of them, and is placed normally.
    Misplace,
    /// listPods only: answer 200 with an empty list, as a glitch or a lagging read replica
    /// might, while the pods still exist and bill.
    EmptyList,
}

impl Fault {
    /// A rule that fires until cleared.
    pub fn new(when: Match, effect: Effect) -> Fault {
        Fault {
            when,
            effect,
            times: None,
        }
    }

    /// The same rule, firing only `n` times.
    pub fn times(mut self, n: u32) -> Fault {
        self.times = Some(n);
        self
    }

    /// Rejects rules the simulator cannot honour (a status that is not an error status).
    pub fn validate(&self) -> Result<(), String> {
        match &self.effect {
            Effect::Status { status, .. } | Effect::CreateThenFail { status }
                if !(400..=599).contains(status) =>
            {
                Err(format!(
                    "fault status {status} is not an HTTP error status (400..=599)"
                ))
            }
            _ => Ok(()),
        }
    }
}

impl Match {
    /// Matches every request.
    pub fn any() -> Match {
        Match::default()
    }

    /// Matches one operation.
    pub fn operation(op: Operation) -> Match {
        Match {
            operation: Some(op),
            ..Match::default()
        }
    }

    /// Also require this GPU type.
    pub fn gpu(mut self, gpu_id: &str) -> Match {
        self.gpu_id = Some(gpu_id.to_owned());
        self
    }

    /// Also require this data centre.
    pub fn data_center(mut self, data_center_id: &str) -> Match {
        self.data_center_id = Some(data_center_id.to_owned());
        self
    }

    /// Also require this pod name.
    pub fn pod_name(mut self, name: &str) -> Match {
        self.pod_name = Some(name.to_owned());
        self
    }

    fn matches(&self, ctx: &MatchContext<'_>) -> bool {
        fn field(want: &Option<String>, have: Option<&str>) -> bool {
            want.as_deref().is_none_or(|want| have == Some(want))
        }
        self.operation.is_none_or(|op| ctx.operation == Some(op))
            && field(&self.gpu_id, ctx.gpu_id)
            && field(&self.data_center_id, ctx.data_center_id)
            && field(&self.pod_name, ctx.pod_name)
    }
}

/// What is known about a request when faults are matched.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MatchContext<'a> {
    pub operation: Option<Operation>,
    pub gpu_id: Option<&'a str>,
    pub data_center_id: Option<&'a str>,
    pub pod_name: Option<&'a str>,
}

/// The response-level faults that match one request.
#[derive(Debug, Default)]
pub(crate) struct Fired {
    /// Sum of the matching `Delay`s.
    pub delay: Duration,
    /// The first matching `Status` or `CreateThenFail`.
    pub effect: Option<Effect>,
    /// Rule indices to pass to [`FaultSet::consume`] once the request is answered.
    pub used: Vec<usize>,
}

/// The active rules.
#[derive(Debug, Default)]
pub(crate) struct FaultSet {
    rules: Vec<Fault>,
}

impl FaultSet {
    pub fn new(rules: Vec<Fault>) -> FaultSet {
        FaultSet { rules }
    }

    pub fn push(&mut self, fault: Fault) {
        if fault.times != Some(0) {
            self.rules.push(fault);
        }
    }

    pub fn clear(&mut self) {
        self.rules.clear();
    }

    /// Every matching `Delay` and the first matching `Status`/`CreateThenFail`. Read-only:
    /// indices stay valid until [`FaultSet::consume`].
    pub fn response_faults(&self, ctx: &MatchContext<'_>) -> Fired {
        let mut fired = Fired::default();
        for (index, rule) in self.rules.iter().enumerate() {
            if !rule.when.matches(ctx) {
                continue;
            }
            match &rule.effect {
                Effect::Delay { millis } => {
                    fired.delay = fired.delay.saturating_add(Duration::from_millis(*millis));
                    fired.used.push(index);
                }
                Effect::Status { .. } | Effect::CreateThenFail { .. } | Effect::EmptyList
                    if fired.effect.is_none() =>
                {
                    fired.effect = Some(rule.effect.clone());
                    fired.used.push(index);
                }
                _ => {}
            }
        }
        fired
    }

    /// The first `Capacity` rule that takes `data_center_id` out of placement for this create.
    /// Read-only: the caller commits the rules that really fired with [`FaultSet::consume`].
    pub fn capacity_block(&self, ctx: &MatchContext<'_>, data_center_id: &str) -> Option<usize> {
        self.rules.iter().position(|rule| {
            matches!(rule.effect, Effect::Capacity)
                && rule
                    .when
                    .operation
                    .is_none_or(|op| op == Operation::CreatePod)
                && rule
                    .when
                    .gpu_id
                    .as_deref()
                    .is_none_or(|g| ctx.gpu_id == Some(g))
                && rule
                    .when
                    .pod_name
                    .as_deref()
                    .is_none_or(|n| ctx.pod_name == Some(n))
                && rule
                    .when
                    .data_center_id
                    .as_deref()
                    .is_none_or(|dc| dc == data_center_id)
        })
    }

    /// The first `Misplace` rule that applies to this create, and the data centre it names.
    /// Read-only, like [`FaultSet::capacity_block`].
    pub fn misplace(&self, ctx: &MatchContext<'_>) -> Option<(usize, Option<&str>)> {
        self.rules.iter().enumerate().find_map(|(index, rule)| {
            let applies = matches!(rule.effect, Effect::Misplace)
                && rule
                    .when
                    .operation
                    .is_none_or(|op| op == Operation::CreatePod)
                && rule
                    .when
                    .gpu_id
                    .as_deref()
                    .is_none_or(|g| ctx.gpu_id == Some(g))
                && rule
                    .when
                    .pod_name
                    .as_deref()
                    .is_none_or(|n| ctx.pod_name == Some(n));
            applies.then_some((index, rule.when.data_center_id.as_deref()))
        })
    }

    /// Counts one firing for each rule index (duplicates count once) and drops exhausted rules.
    pub fn consume(&mut self, indices: &[usize]) {
        let mut index = 0;
        self.rules.retain_mut(|rule| {
            let fired = indices.contains(&index);
            index += 1;
            if fired && let Some(times) = rule.times.as_mut() {
                *times = times.saturating_sub(1);
                return *times > 0;
            }
            true
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn json_form_round_trips() {
        let text = r#"{"when":{"operation":"createPod","gpu_id":"NVIDIA L40S"},
                       "effect":{"kind":"status","status":402,"detail":"no money"},"times":1}"#;
        let fault: Fault = serde_json::from_str(text).unwrap();
        assert_eq!(fault.when.operation, Some(Operation::CreatePod));
        assert_eq!(fault.times, Some(1));
        let back: Fault = serde_json::from_value(serde_json::to_value(&fault).unwrap()).unwrap();
        assert_eq!(back, fault);
        let capacity: Fault = serde_json::from_str(r#"{"effect":{"kind":"capacity"}}"#).unwrap();
        assert_eq!(capacity.effect, Effect::Capacity);
        let misplace: Fault = serde_json::from_str(r#"{"effect":{"kind":"misplace"}}"#).unwrap();
        assert_eq!(misplace.effect, Effect::Misplace);
        assert!(
            serde_json::from_str::<Fault>(r#"{"effect":{"kind":"capacity"},"bogus":1}"#).is_err()
        );
    }

    #[test]
    fn misplace_matches_creates_of_its_gpu_only() {
        let set = FaultSet::new(vec![Fault::new(
            Match::operation(Operation::CreatePod)
                .gpu("NVIDIA L40S")
                .data_center("EU-SE-1"),
            Effect::Misplace,
        )]);
        let create = |gpu| MatchContext {
            operation: Some(Operation::CreatePod),
            gpu_id: Some(gpu),
            ..MatchContext::default()
        };
        assert_eq!(
            set.misplace(&create("NVIDIA L40S")),
            Some((0, Some("EU-SE-1")))
        );
        assert_eq!(set.misplace(&create("NVIDIA A100")), None);
        // It never answers on its own.
        assert!(set.response_faults(&create("NVIDIA L40S")).effect.is_none());
    }

    #[test]
    fn times_counts_down_and_order_decides() {
        let mut set = FaultSet::new(vec![
            Fault::new(
                Match::operation(Operation::GetPod),
                Effect::Status {
                    status: 500,
                    detail: None,
                    retry_after: None,
                },
            )
            .times(1),
            Fault::new(
                Match::any(),
                Effect::Status {
                    status: 503,
                    detail: None,
                    retry_after: None,
                },
            ),
        ]);
        let ctx = MatchContext {
            operation: Some(Operation::GetPod),
            ..MatchContext::default()
        };
        let first = set.response_faults(&ctx);
        assert!(matches!(
            first.effect,
            Some(Effect::Status { status: 500, .. })
        ));
        set.consume(&first.used);
        let second = set.response_faults(&ctx);
        assert!(matches!(
            second.effect,
            Some(Effect::Status { status: 503, .. })
        ));
    }
}
