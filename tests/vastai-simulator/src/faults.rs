//! Fault injection: rules that make the simulator misbehave the way Vast.ai does (offers taken
//! between search and buy, create answers lost after the instance was made, errors, slow
//! answers). Rules are checked in insertion order after authentication and rate limiting; a
//! rule with `times: Some(n)` is removed once it has fired `n` times.

use serde::{Deserialize, Serialize};

use crate::ratelimit::Route;

/// One rule: when a request matches `when`, apply `effect` (at most `times` times).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    #[serde(default)]
    pub when: Match,
    pub effect: Effect,
    #[serde(default)]
    pub times: Option<u32>,
    /// Matching requests let through before the rule starts firing ("the list fails from the
    /// second call on").
    #[serde(default)]
    pub after: u32,
}

/// Conditions on a request; every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Match {
    pub route: Option<Route>,
    /// The offer a create names.
    pub offer_id: Option<u64>,
}

/// What a matching fault does. JSON: `{"kind":"status","status":502}`,
/// `{"kind":"no_such_ask"}`, `{"kind":"create_then_fail","status":502}`,
/// `{"kind":"create_then_stall","millis":5000}`, `{"kind":"delay","millis":200}`,
/// `{"kind":"empty_list"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Effect {
    /// Answer this error status (`{"success":false,"error":..,"msg":..}`), do nothing else.
    Status {
        status: u16,
        #[serde(default)]
        error: Option<String>,
    },
    /// Create only: someone else rented the offer just before us; 404 `no_such_ask`, and the
    /// offer is gone from the market.
    NoSuchAsk,
    /// Create only: the instance is created and billed, then this status is answered.
    CreateThenFail { status: u16 },
    /// Create only: the instance is created and billed, and the answer comes only after
    /// `millis` (the client times out: a lost answer).
    CreateThenStall { millis: u64 },
    /// Answer normally after this delay (the side effect happens at once).
    Delay { millis: u64 },
    /// List only: answer 200 with no instances, as a glitch or a lagging read replica might,
    /// while they still exist and bill.
    EmptyList,
}

impl Fault {
    pub fn new(when: Match, effect: Effect) -> Fault {
        Fault {
            when,
            effect,
            times: None,
            after: 0,
        }
    }

    /// The same rule, starting after `n` matching requests went through.
    pub fn after(mut self, n: u32) -> Fault {
        self.after = n;
        self
    }

    /// The same rule, firing only `n` times.
    pub fn times(mut self, n: u32) -> Fault {
        self.times = Some(n);
        self
    }

    /// Rejects rules the simulator cannot honour.
    pub fn validate(&self) -> Result<(), String> {
        match &self.effect {
            Effect::Status { status, .. } | Effect::CreateThenFail { status }
                if !(400..=599).contains(status) =>
            {
                Err(format!("fault status {status} is not an HTTP error status"))
            }
            Effect::NoSuchAsk | Effect::CreateThenFail { .. } | Effect::CreateThenStall { .. }
                if self.when.route.is_some_and(|route| route != Route::Create) =>
            {
                Err(format!("{:?} applies to creates only", self.effect))
            }
            _ => Ok(()),
        }
    }
}

impl Match {
    pub fn route(route: Route) -> Match {
        Match {
            route: Some(route),
            offer_id: None,
        }
    }

    fn matches(&self, route: Route, offer_id: Option<u64>) -> bool {
        self.route.is_none_or(|want| want == route)
            && self.offer_id.is_none_or(|want| Some(want) == offer_id)
    }
}

/// The active rules.
#[derive(Debug, Default)]
pub(crate) struct FaultSet(Vec<Fault>);

impl FaultSet {
    pub fn new(faults: Vec<Fault>) -> FaultSet {
        FaultSet(faults)
    }

    pub fn push(&mut self, fault: Fault) {
        self.0.push(fault);
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// The effect of the first rule matching the request, counting it as fired. Create-only
    /// effects never fire on other routes.
    pub fn fire(&mut self, route: Route, offer_id: Option<u64>) -> Option<Effect> {
        let applies = |fault: &Fault| {
            fault.when.matches(route, offer_id)
                && (route == Route::List || !matches!(fault.effect, Effect::EmptyList))
                && (route == Route::Create
                    || !matches!(
                        fault.effect,
                        Effect::NoSuchAsk
                            | Effect::CreateThenFail { .. }
                            | Effect::CreateThenStall { .. }
                    ))
        };
        let mut chosen = None;
        for (index, fault) in self.0.iter_mut().enumerate() {
            if !applies(fault) {
                continue;
            }
            if fault.after > 0 {
                fault.after -= 1;
                continue;
            }
            chosen = Some(index);
            break;
        }
        let index = chosen?;
        let fault = &mut self.0[index];
        let effect = fault.effect.clone();
        if let Some(times) = fault.times.as_mut() {
            *times = times.saturating_sub(1);
            if *times == 0 {
                self.0.remove(index);
            }
        }
        Some(effect)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_fire_in_order_and_expire() {
        let mut set = FaultSet::new(vec![
            Fault::new(Match::route(Route::Create), Effect::NoSuchAsk).times(1),
            Fault::new(Match::any_offer(7), Effect::Delay { millis: 5 }),
        ]);
        assert_eq!(set.fire(Route::Create, Some(1)), Some(Effect::NoSuchAsk));
        assert_eq!(set.fire(Route::Create, Some(1)), None, "fired once");
        assert_eq!(
            set.fire(Route::Create, Some(7)),
            Some(Effect::Delay { millis: 5 })
        );
        assert_eq!(set.fire(Route::Get, None), None);
    }

    #[test]
    fn a_rule_can_start_late() {
        let mut set = FaultSet::new(vec![
            Fault::new(Match::route(Route::List), Effect::Delay { millis: 1 }).after(2),
        ]);
        assert_eq!(set.fire(Route::List, None), None);
        assert_eq!(
            set.fire(Route::Get, None),
            None,
            "other routes do not count"
        );
        assert_eq!(set.fire(Route::List, None), None);
        assert!(set.fire(Route::List, None).is_some());
    }

    #[test]
    fn create_effects_never_fire_elsewhere() {
        let mut set = FaultSet::new(vec![Fault::new(
            Match::default(),
            Effect::CreateThenFail { status: 502 },
        )]);
        assert_eq!(set.fire(Route::List, None), None);
        assert!(set.fire(Route::Create, Some(3)).is_some());
        let bad = Fault::new(Match::route(Route::List), Effect::NoSuchAsk);
        assert!(bad.validate().is_err());
        let bad = Fault::new(
            Match::default(),
            Effect::Status {
                status: 200,
                error: None,
            },
        );
        assert!(bad.validate().is_err());
    }

    impl Match {
        fn any_offer(id: u64) -> Match {
            Match {
                route: None,
                offer_id: Some(id),
            }
        }
    }
}
