//! Budgets per namespace (`runpod.io/budget-per-hour`), as pure decisions: whether a pod could
//! ever fit a budget (judged at admission against published prices), and whether it may be
//! created now (judged by the controller against what the namespace's live instances really
//! cost, plus creates in flight). Nothing running is ever stopped for a budget: these only say
//! whether to start something.
//!
//! Waiting pods start in creation order (strictly first come, first served within a namespace):
//! a small pod never overtakes a large one that waits, so the large one cannot starve while
//! small ones keep taking the room it needs.

pub mod ledger;

/// Namespace annotation: the most USD per hour the namespace's burst pods may cost together.
pub const BUDGET_PER_HOUR: &str = "runpod.io/budget-per-hour";
/// The reason of a pod waiting for budget (its Event and status).
pub const BUDGET_EXCEEDED: &str = "BudgetExceeded";
/// The reason of a pod that alone costs more than its namespace's whole budget (it waits for a
/// larger budget, outside the namespace's queue).
pub const BUDGET_TOO_SMALL: &str = "BudgetTooSmall";

/// Slack for sums of prices (`0.1 + 0.2` must fit `0.3`).
const SLACK: f64 = 1e-9;

/// Reads `runpod.io/budget-per-hour`: a decimal USD per hour, 0 or more (0 lets nothing start).
pub fn parse_budget(value: &str) -> Result<f64, String> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|budget| budget.is_finite() && *budget >= 0.0)
        .ok_or_else(|| {
            format!("{value:?} is not a number of USD per hour (0 or more), such as \"20\"")
        })
}

/// A namespace's budget: its annotation, else the installation's default; `Err` when the
/// annotation cannot be read (then nothing starts there: money first).
pub fn budget_of(
    annotations: &std::collections::BTreeMap<String, String>,
    default: Option<f64>,
) -> Option<Result<f64, String>> {
    match annotations.get(BUDGET_PER_HOUR) {
        Some(value) => Some(parse_budget(value)),
        None => default.map(Ok),
    }
}

/// At admission: a pod whose cheapest possible price (the lowest published price of a GPU type
/// it may use, times its GPU count) is above the whole budget could never start. `None` when
/// it could (or nothing is published to judge by).
pub fn never_fits(namespace: &str, budget: f64, cheapest: Option<(&str, f64)>) -> Option<String> {
    let (gpu, per_hour) = cheapest?;
    (per_hour > budget + SLACK).then(|| {
        format!(
            "namespace {namespace} has a budget of {budget:.3} USD/h ({BUDGET_PER_HOUR}), and \
             the cheapest GPU this pod may use ({gpu}) costs {per_hour:.3} USD/h: it could \
             never start; raise the budget or ask for a smaller or cheaper GPU"
        )
    })
}

/// What a namespace is spending, from the clouds' own figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spend {
    /// `costPerHr` / `dph_total` of its live instances, all clouds and nodes.
    pub billing: f64,
    /// The most the creates under way (sent, not yet listed) may cost.
    pub in_flight: f64,
    /// What the namespace's network volumes cost per hour (storage bills with no pod running).
    pub storage: f64,
}

impl Spend {
    /// Billing, starting and storage together.
    pub fn total(&self) -> f64 {
        self.billing + self.in_flight + self.storage
    }
}

/// Whether a pod may be created now.
#[derive(Debug, Clone, PartialEq)]
pub enum Room {
    Create,
    /// Wait, Pending with [`BUDGET_EXCEEDED`]; the message names budget, spend and price.
    Wait(String),
}

/// The one budget fit: `price` more on top of `spend` stays within `budget` (to [`SLACK`]).
/// The controller's create gate ([`room`]) and the webhook's admission warning both ask it.
pub fn fits(spend: f64, price: f64, budget: f64) -> bool {
    spend + price <= budget + SLACK
}

/// What a create that has room reserves, in USD/h: the most it may cost, which is its own cap
/// within what is left of the budget, but never below the price it was judged by (a reservation
/// smaller than the cheapest offer could start nothing).
pub fn reservation(budget: f64, spend: f64, price: f64, cap: Option<f64>) -> f64 {
    let left = (budget - spend).max(0.0);
    cap.map_or(left, |cap| cap.min(left)).max(price)
}

/// Lowers a pod's price caps to a reservation of `usd` per hour, so the cloud may charge no
/// more than was reserved: `runpod.io/max-price` always, Vast.ai's own cap when it is set; a
/// lower cap stays. Rounded down to 4 decimals.
pub fn lower_caps(annotations: &mut std::collections::BTreeMap<String, String>, usd: f64) {
    let usd = (usd * 10_000.0).floor() / 10_000.0;
    for key in [crate::MAX_PRICE, crate::vastai::PRICE_MAX] {
        let current = annotations
            .get(key)
            .and_then(|value| crate::parse_price(value).ok());
        let is_set = annotations.contains_key(key);
        if (key == crate::MAX_PRICE || is_set) && current.is_none_or(|cap| cap > usd) {
            annotations.insert(key.to_owned(), format!("{usd:.4}"));
        }
    }
}

/// Before a create: the pod (which may cost up to `price` USD/h) starts only when the
/// namespace's spend plus that price stays within the budget and no pod of the namespace created
/// earlier still waits (`ahead` of them).
pub fn room(namespace: &str, budget: f64, spend: Spend, price: f64, ahead: usize) -> Room {
    if fits(spend.total(), price, budget) && ahead == 0 {
        return Room::Create;
    }
    let mut message = format!(
        "namespace {namespace} spends {:.3} USD/h ({:.3} billing, {:.3} starting{}) of its \
         budget of {budget:.3} USD/h; this pod costs up to {price:.3} USD/h",
        spend.total(),
        spend.billing,
        spend.in_flight,
        if spend.storage > 0.0 {
            format!(", {:.3} network volumes", spend.storage)
        } else {
            String::new()
        }
    );
    if ahead > 0 {
        message.push_str(&format!(
            "; {ahead} pod(s) of the namespace created earlier start first"
        ));
    }
    message.push_str(": it starts when room frees up (nothing running is stopped)");
    Room::Wait(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_is_the_cap_within_what_is_left_and_never_below_the_price() {
        // (budget, spend, price, cap) → reserved
        let cases = [
            ((10.0, 4.0, 1.0, None), 6.0),
            ((10.0, 4.0, 1.0, Some(2.0)), 2.0),
            ((10.0, 4.0, 1.0, Some(8.0)), 6.0),
            ((10.0, 9.5, 1.0, Some(2.0)), 1.0),
            ((10.0, 12.0, 0.5, None), 0.5),
        ];
        for ((budget, spend, price, cap), reserved) in cases {
            assert_eq!(
                reservation(budget, spend, price, cap),
                reserved,
                "{budget} {spend} {price} {cap:?}"
            );
        }
    }

    #[test]
    fn a_budget_comes_from_the_namespace_else_the_default() {
        let annotated: std::collections::BTreeMap<String, String> =
            [(BUDGET_PER_HOUR.to_owned(), "1.5".to_owned())].into();
        assert_eq!(budget_of(&annotated, Some(9.0)), Some(Ok(1.5)));
        assert_eq!(budget_of(&Default::default(), Some(9.0)), Some(Ok(9.0)));
        assert_eq!(budget_of(&Default::default(), None), None);
        let bad: std::collections::BTreeMap<String, String> =
            [(BUDGET_PER_HOUR.to_owned(), "lots".to_owned())].into();
        assert!(matches!(budget_of(&bad, None), Some(Err(_))));
    }

    #[test]
    fn budgets_parse_as_decimal_usd_per_hour() {
        assert_eq!(parse_budget(" 20 "), Ok(20.0));
        assert_eq!(parse_budget("0.5"), Ok(0.5));
        assert_eq!(parse_budget("0"), Ok(0.0));
        for bad in ["", "-1", "NaN", "inf", "$5", "5/h"] {
            assert!(parse_budget(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_pod_that_could_never_fit_is_named_with_its_cheapest_price() {
        let refusal = never_fits("team-a", 1.0, Some(("H100", 2.99))).unwrap();
        assert!(
            refusal.contains("budget of 1.000 USD/h")
                && refusal.contains("H100")
                && refusal.contains("2.990 USD/h"),
            "{refusal}"
        );
        assert_eq!(never_fits("team-a", 1.0, Some(("L4", 0.4))), None);
        assert_eq!(
            never_fits("team-a", 0.3, Some(("L4", 0.1 + 0.2))),
            None,
            "slack"
        );
        assert_eq!(never_fits("team-a", 0.0, None), None, "nothing published");
    }

    /// The scenario: a budget of 1 USD/h and pods of 0.4 USD/h.
    #[test]
    fn the_budget_decision_table() {
        let spend = |billing: f64, in_flight: f64| Spend {
            billing,
            in_flight,
            storage: 0.0,
        };
        let cases: [(&str, Spend, f64, usize, bool); 9] = [
            ("empty namespace", spend(0.0, 0.0), 0.4, 0, true),
            ("second pod", spend(0.4, 0.0), 0.4, 0, true),
            (
                "third pod would pass the budget",
                spend(0.8, 0.0),
                0.4,
                0,
                false,
            ),
            ("a create in flight counts", spend(0.4, 0.4), 0.4, 0, false),
            ("exactly at the budget", spend(0.6, 0.0), 0.4, 0, true),
            ("room frees up", spend(0.4, 0.0), 0.4, 0, true),
            ("an earlier pod waits first", spend(0.0, 0.0), 0.4, 1, false),
            (
                "a small pod does not overtake",
                spend(0.8, 0.0),
                0.1,
                1,
                false,
            ),
            (
                "zero budget starts nothing",
                spend(0.0, 0.0),
                0.01,
                0,
                false,
            ),
        ];
        for (what, spend, price, ahead, creates) in cases {
            let budget = if what.starts_with("zero") { 0.0 } else { 1.0 };
            let got = room("team-a", budget, spend, price, ahead);
            assert_eq!(got == Room::Create, creates, "{what}: {got:?}");
            if let Room::Wait(message) = got {
                assert!(
                    message.contains("of its budget") && message.contains("this pod costs up to"),
                    "{what}: {message}"
                );
                assert_eq!(message.contains("created earlier"), ahead > 0, "{what}");
            }
        }
    }

    #[test]
    fn the_budget_fit_allows_exactly_the_budget_and_not_a_cent_more() {
        for (spend, price, budget, fits_in) in [
            (0.0, 1.0, 1.0, true),
            (0.7, 0.3, 1.0, true),
            (0.1 + 0.2, 0.7, 1.0, true), // float noise within SLACK
            (0.7, 0.31, 1.0, false),
            (0.0, 0.01, 0.0, false),
        ] {
            assert_eq!(
                fits(spend, price, budget),
                fits_in,
                "{spend} + {price} in {budget}"
            );
        }
    }
}
