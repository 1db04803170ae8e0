//! The gates before any create, as pure decisions: this node may not run the pod, the
//! provisioning timeout, the backoff, an unavailable API, an earlier create not settled, the
//! namespace's budget, and inputs that cannot be built. Each returns the Event, the status and
//! the next look that `write::apply` carries out.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use runpod_contract::CREATE_REQUESTED;

use super::{Next, Note, Outcome};
use crate::controller::clock::elapsed;
use crate::controller::context::Settings;
use crate::controller::eligibility::Refusal;
use crate::controller::pods::SHORT;
use crate::controller::pods::status::{View, annotation};
use crate::provider::CloudName;

/// What the create gate looks at, read by the shell from the pod, the list and its memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CreateFacts {
    pub now: Timestamp,
    /// The latest record of a create sent for this pod, unless this leader knows it made
    /// nothing.
    pub marker: Option<Timestamp>,
    /// When the oldest of the last complete lists that all must omit an instance was taken.
    pub confirmed_at: Option<Timestamp>,
    /// The provisioning clock: binding, or when a vanished instance is being replaced.
    pub clock_start: Option<Timestamp>,
    /// Backoff after a failed create.
    pub next_create_at: Option<Timestamp>,
    /// The cloud's API is down or the account refused.
    pub unavailable: bool,
}

/// The latest record of a create sent for `pod`: the later of its `runpod.io/create-requested`
/// annotation and this leader's own (`marked_at`: the pod cache may lag behind a marker just
/// written); none when this leader knows its last provision made nothing.
///
/// Never later than `now`: a record from the future (a user's edit, a skewed clock) would keep
/// every create, and a deleted pod's removal, waiting forever.
pub(crate) fn create_marker(
    pod: &Pod,
    marked_at: Option<Timestamp>,
    nothing_created: bool,
    now: Timestamp,
) -> Option<Timestamp> {
    annotation(pod, CREATE_REQUESTED)
        .map(|m| m.parse::<Timestamp>().unwrap_or(Timestamp::UNIX_EPOCH))
        .into_iter()
        .chain(marked_at)
        .max()
        .map(|marker| marker.min(now))
        .filter(|_| !nothing_created)
}

/// A create was sent and its outcome is unknown here: only complete lists in a row
/// (`provider::LISTS_TO_CONFIRM`), all taken long enough after it, may show that nothing
/// exists.
pub(crate) fn absence_unsettled(facts: &CreateFacts, create_settle: Duration) -> bool {
    unsettled(facts.marker, facts.confirmed_at, create_settle)
}

/// Whether a create recorded at `marker` may have made an instance that lists confirmed at
/// `confirmed_at` (the oldest of the last complete lists that all must omit it) cannot show yet.
pub(crate) fn unsettled(
    marker: Option<Timestamp>,
    confirmed_at: Option<Timestamp>,
    create_settle: Duration,
) -> bool {
    marker.is_some_and(|marker| {
        let settled_by = marker
            .checked_add(SignedDuration::try_from(create_settle).unwrap_or_default())
            .unwrap_or(marker);
        confirmed_at.is_none_or(|confirmed| confirmed < settled_by)
    })
}

/// Whether the pod may be created now; `Some` says what to do instead. In order: the
/// provisioning timeout (it waits for the lists to settle, since an instance may be starting,
/// unless the cloud is down: then it still applies, and an instance that shows up later is
/// terminated), the backoff, an unavailable API (one wait for all pods, no create each), and
/// an earlier create not settled yet.
pub(crate) fn create_gate(
    facts: &CreateFacts,
    settings: &Settings,
    cloud: CloudName,
) -> Option<Outcome> {
    let unsettled = absence_unsettled(facts, settings.create_settle);
    if let Some(start) = facts.clock_start
        && elapsed(start, facts.now) > settings.provision_timeout
        && (!unsettled || facts.unavailable)
    {
        let message = format!(
            "no {} could be started within {}",
            cloud.instance,
            humantime::format_duration(settings.provision_timeout)
        );
        return Some(Outcome::fail(
            "ProvisioningTimeout",
            message,
            Next::Requeue(SHORT),
        ));
    }
    if let Some(next_at) = facts.next_create_at
        && next_at > facts.now
    {
        return Some(Outcome::requeue(elapsed(facts.now, next_at).max(SHORT)));
    }
    if facts.unavailable {
        return Some(Outcome {
            events: Vec::new(),
            describes: None,
            status: Some(View::Waiting {
                reason: "RunPodUnavailable",
                message: format!("waiting for the {} API", cloud.title),
            }),
            next: Next::Requeue(settings.reconcile_interval),
        });
    }
    if unsettled {
        return Some(Outcome::requeue(SHORT));
    }
    None
}

/// A pod this controller will not run: the Event, and the pod failed or left Pending with the
/// reason; looked at again only when it changes.
pub(crate) fn refused(refusal: Refusal) -> Outcome {
    let note = Note::warning(refusal.reason, refusal.message.clone());
    let status = if refusal.fail {
        View::Failed {
            reason: refusal.reason,
            message: refusal.message,
        }
    } else {
        View::Waiting {
            reason: refusal.reason,
            message: refusal.message,
        }
    };
    Outcome {
        events: vec![note],
        describes: None,
        status: Some(status),
        next: Next::AwaitChange,
    }
}

/// A pod that does not fit its namespace's budget now (`BudgetExceeded`) or ever
/// (`BudgetTooSmall`): Pending with the reason and the Event naming budget, spend and price;
/// looked at again at every list, to start when room frees up (or the budget grows).
pub(crate) fn budget_wait(reason: &'static str, message: String, settings: &Settings) -> Outcome {
    Outcome {
        events: vec![Note::warning(reason, message.clone())],
        describes: None,
        status: Some(View::Waiting { reason, message }),
        next: Next::Requeue(settings.reconcile_interval),
    }
}

/// The container's env or files cannot be built (a missing ConfigMap key, say): waiting, and
/// tried again, as a kubelet does.
pub(crate) fn config_error(message: String) -> Outcome {
    Outcome {
        events: vec![Note::warning("CreateContainerConfigError", message.clone())],
        describes: None,
        status: Some(View::Waiting {
            reason: "CreateContainerConfigError",
            message,
        }),
        next: Next::Requeue(Duration::from_secs(10)),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::controller::fixtures::settings;

    pub(in crate::controller::pods::decide) fn at(time: &str) -> Timestamp {
        format!("2026-01-01T{time}Z").parse().unwrap()
    }

    pub(in crate::controller::pods::decide) fn facts() -> CreateFacts {
        CreateFacts {
            now: at("01:00:00"),
            marker: None,
            confirmed_at: Some(at("00:59:50")),
            clock_start: Some(at("00:59:00")),
            next_create_at: None,
            unavailable: false,
        }
    }

    /// The gate's answer as (event reason, status reason, next look), or "create".
    fn gate(facts: CreateFacts) -> String {
        match create_gate(&facts, &settings(), CloudName::VASTAI) {
            None => "create".into(),
            Some(outcome) => describe(&outcome),
        }
    }

    pub(in crate::controller::pods::decide) fn describe(outcome: &Outcome) -> String {
        let status = match &outcome.status {
            Some(View::Failed { reason, .. }) => format!("failed {reason}"),
            Some(View::Waiting { reason, .. }) => format!("waiting {reason}"),
            Some(_) => "other".into(),
            None => "-".into(),
        };
        let event = outcome.events.first().map_or("-", |note| note.reason);
        let next = match outcome.next {
            Next::Requeue(after) => format!("{}s", after.as_secs()),
            Next::AwaitChange => "change".into(),
        };
        format!("{event} / {status} / {next}")
    }

    #[test]
    fn the_create_gate_in_order() {
        let late = CreateFacts {
            clock_start: Some(at("00:40:00")),
            ..facts()
        };
        let marked = CreateFacts {
            marker: Some(at("00:59:45")),
            ..facts()
        };
        let cases = [
            ("nothing stands in the way", facts(), "create"),
            (
                "past the provisioning timeout",
                late,
                "ProvisioningTimeout / failed ProvisioningTimeout / 2s",
            ),
            (
                "past the timeout, but an earlier create may still show up",
                CreateFacts {
                    marker: Some(at("00:59:45")),
                    ..late
                },
                "- / - / 2s",
            ),
            (
                "past the timeout with the cloud down: fails anyway",
                CreateFacts {
                    marker: Some(at("00:59:45")),
                    unavailable: true,
                    ..late
                },
                "ProvisioningTimeout / failed ProvisioningTimeout / 2s",
            ),
            (
                "backing off",
                CreateFacts {
                    next_create_at: Some(at("01:00:40")),
                    ..facts()
                },
                "- / - / 40s",
            ),
            (
                "the backoff is over",
                CreateFacts {
                    next_create_at: Some(at("00:59:59")),
                    ..facts()
                },
                "create",
            ),
            (
                "the cloud is down",
                CreateFacts {
                    unavailable: true,
                    ..facts()
                },
                "- / waiting RunPodUnavailable / 10s",
            ),
            ("an earlier create not settled", marked, "- / - / 2s"),
            (
                "an earlier create settled by two lists",
                CreateFacts {
                    confirmed_at: Some(at("01:00:20")),
                    ..marked
                },
                "create",
            ),
        ];
        for (case, facts, expected) in cases {
            assert_eq!(gate(facts), expected, "{case}");
        }
    }

    #[test]
    fn gate_messages_name_the_cloud() {
        let late = CreateFacts {
            clock_start: Some(at("00:40:00")),
            ..facts()
        };
        let outcome = create_gate(&late, &settings(), CloudName::VASTAI).unwrap();
        let note = outcome.events.into_iter().next().unwrap();
        assert_eq!(
            note.message,
            "no Vast.ai instance could be started within 15m"
        );
        let down = CreateFacts {
            unavailable: true,
            ..facts()
        };
        match create_gate(&down, &settings(), CloudName::RUNPOD)
            .unwrap()
            .status
        {
            Some(View::Waiting { message, .. }) => {
                assert_eq!(message, "waiting for the RunPod API")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusals_fail_or_wait_and_config_errors_retry() {
        let refusal = |fail| Refusal {
            reason: "CannotRunOnRunPod",
            message: "two containers".into(),
            fail,
        };
        assert_eq!(
            describe(&refused(refusal(true))),
            "CannotRunOnRunPod / failed CannotRunOnRunPod / change"
        );
        assert_eq!(
            describe(&refused(refusal(false))),
            "CannotRunOnRunPod / waiting CannotRunOnRunPod / change"
        );
        assert_eq!(
            describe(&config_error("configmap x not found".into())),
            "CreateContainerConfigError / waiting CreateContainerConfigError / 10s"
        );
    }

    #[test]
    fn the_create_marker_is_the_later_record_unless_nothing_was_made() {
        let mut pod = Pod::default();
        let now = at("00:10:00");
        let create_marker = |pod: &Pod, marked, nothing| create_marker(pod, marked, nothing, now);
        assert_eq!(create_marker(&pod, None, false), None);
        assert_eq!(
            create_marker(&pod, Some(at("00:00:05")), false),
            Some(at("00:00:05"))
        );
        pod.metadata.annotations =
            Some([(CREATE_REQUESTED.to_owned(), at("00:00:09").to_string())].into());
        assert_eq!(
            create_marker(&pod, Some(at("00:00:05")), false),
            Some(at("00:00:09"))
        );
        assert_eq!(
            create_marker(&pod, Some(at("00:00:12")), false),
            Some(at("00:00:12"))
        );
        assert_eq!(create_marker(&pod, Some(at("00:00:12")), true), None);
        // An unreadable record still counts as a create sent (long ago).
        pod.metadata.annotations = Some([(CREATE_REQUESTED.to_owned(), "junk".to_owned())].into());
        assert_eq!(
            create_marker(&pod, None, false),
            Some(Timestamp::UNIX_EPOCH)
        );
        // A record from the future counts as now.
        pod.metadata.annotations = Some(
            [(
                CREATE_REQUESTED.to_owned(),
                "2099-01-01T00:00:00Z".to_owned(),
            )]
            .into(),
        );
        assert_eq!(create_marker(&pod, None, false), Some(now));
    }

    #[test]
    fn a_create_settles_once_lists_taken_after_it_had_time_to_show_it() {
        let settle = Duration::from_secs(30);
        let marker = Some(at("00:00:00"));
        assert!(!unsettled(None, None, settle));
        assert!(unsettled(marker, None, settle));
        assert!(unsettled(marker, Some(at("00:00:29")), settle));
        assert!(!unsettled(marker, Some(at("00:00:30")), settle));
    }
}
