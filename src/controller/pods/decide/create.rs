//! The create gate and the meaning of a failed provision, as pure decisions: each returns the
//! Event, the status and the next look that `write::apply` carries out, so no branch of the
//! create shell writes by itself.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::{Next, Note, Outcome};
use crate::controller::clock::elapsed;
use crate::controller::context::Settings;
use crate::controller::eligibility::Refusal;
use crate::controller::pods::SHORT;
use crate::controller::pods::status::View;
use crate::provider::{CloudName, ProvisionError};

/// What the create gate looks at, read by the shell from the pod, the list and its memory.
#[derive(Debug, Clone, Copy)]
pub struct CreateFacts {
    pub now: Timestamp,
    /// The latest record of a create sent for this pod, unless this leader knows it made
    /// nothing.
    pub marker: Option<Timestamp>,
    /// When the older of the two last complete lists was taken.
    pub confirmed_at: Option<Timestamp>,
    /// The provisioning clock: binding, or when a vanished instance is being replaced.
    pub clock_start: Option<Timestamp>,
    /// Backoff after a failed create.
    pub next_create_at: Option<Timestamp>,
    /// The cloud's API is down or the account refused.
    pub unavailable: bool,
}

/// A create was sent and its outcome is unknown here: only two complete lists in a row, both
/// taken long enough after it, may show that nothing exists.
/// The pod as the cloud should see it: with `--expose-ports none`, a pod that names no ports
/// (`runpod.io/ports`, written by the webhook when it admitted the pod) exposes none rather
/// than its declared `containerPort`s, however it reached the node.
pub fn with_default_ports(
    pod: &k8s_openapi::api::core::v1::Pod,
    expose_no_ports: bool,
) -> std::borrow::Cow<'_, k8s_openapi::api::core::v1::Pod> {
    let named = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(runpod_contract::PORTS));
    if named || !expose_no_ports {
        return std::borrow::Cow::Borrowed(pod);
    }
    let mut pod = pod.clone();
    pod.metadata.annotations.get_or_insert_default().insert(
        runpod_contract::PORTS.to_owned(),
        runpod_contract::PORTS_NONE.to_owned(),
    );
    std::borrow::Cow::Owned(pod)
}

/// What the pod's create Event says about exposure: every port the cloud publishes is reachable
/// from the internet, so the user reads which, and how to expose none.
pub fn exposure(
    ports: &[runpod_contract::PortSpec],
    endpoint: impl Fn(&runpod_contract::PortSpec) -> String,
) -> String {
    if ports.is_empty() {
        return "no port exposed".to_owned();
    }
    let endpoints: Vec<String> = ports.iter().map(endpoint).collect();
    format!(
        "PUBLIC endpoints on the internet: {} (set {}: {} to expose none)",
        endpoints.join(", "),
        runpod_contract::PORTS,
        runpod_contract::PORTS_NONE
    )
}

pub fn absence_unsettled(facts: &CreateFacts, create_settle: Duration) -> bool {
    facts.marker.is_some_and(|marker| {
        let settled_by = marker
            .checked_add(SignedDuration::try_from(create_settle).unwrap_or_default())
            .unwrap_or(marker);
        facts
            .confirmed_at
            .is_none_or(|confirmed| confirmed < settled_by)
    })
}

/// Whether the pod may be created now; `Some` says what to do instead. In order: the
/// provisioning timeout (it waits for the lists to settle, since an instance may be starting,
/// unless the cloud is down: then it still applies, and an instance that shows up later is
/// terminated), the backoff, an unavailable API (one wait for all pods, no create each), and
/// an earlier create not settled yet.
pub fn create_gate(facts: &CreateFacts, settings: &Settings, cloud: CloudName) -> Option<Outcome> {
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
            event: None,
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
pub fn refused(refusal: Refusal) -> Outcome {
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
        event: Some(note),
        status: Some(status),
        next: Next::AwaitChange,
    }
}

/// A pod that does not fit its namespace's budget now (`BudgetExceeded`) or ever
/// (`BudgetTooSmall`): Pending with the reason and the Event naming budget, spend and price;
/// looked at again at every list, to start when room frees up (or the budget grows).
pub fn budget_wait(reason: &'static str, message: String, settings: &Settings) -> Outcome {
    Outcome {
        event: Some(Note::warning(reason, message.clone())),
        status: Some(View::Waiting { reason, message }),
        next: Next::Requeue(settings.reconcile_interval),
    }
}

/// Whether a failed provision is known to have created nothing (its reservation can go).
pub fn made_nothing(error: &ProvisionError) -> bool {
    !matches!(error, ProvisionError::Unsettled(_))
}

/// The pod as the cloud should see it under a budget reservation of `usd` per hour: its price
/// caps (`runpod.io/max-price`, and Vast.ai's own when set) no higher than the reservation.
pub fn capped(pod: &k8s_openapi::api::core::v1::Pod, usd: f64) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = pod.clone();
    // Rounded down: the instance must never cost more than was reserved.
    let usd = (usd * 10_000.0).floor() / 10_000.0;
    let annotations = pod.metadata.annotations.get_or_insert_default();
    for key in [
        runpod_contract::MAX_PRICE,
        runpod_contract::vastai::PRICE_MAX,
    ] {
        let current = annotations
            .get(key)
            .and_then(|value| runpod_contract::parse_price(value).ok());
        let is_set = annotations.contains_key(key);
        if (key == runpod_contract::MAX_PRICE || is_set) && current.is_none_or(|cap| cap > usd) {
            annotations.insert(key.to_owned(), format!("{usd:.4}"));
        }
    }
    pod
}

/// The container's env or files cannot be built (a missing ConfigMap key, say): waiting, and
/// tried again, as a kubelet does.
pub fn config_error(message: String) -> Outcome {
    Outcome {
        event: Some(Note::warning("CreateContainerConfigError", message.clone())),
        status: Some(View::Waiting {
            reason: "CreateContainerConfigError",
            message,
        }),
        next: Next::Requeue(Duration::from_secs(10)),
    }
}

/// What a failed provision means for the pod, beside what to write.
#[derive(Debug, Clone)]
pub struct Failed {
    pub outcome: Outcome,
    /// The cloud said for sure that nothing was made: no settle wait before the next create.
    pub nothing_created: bool,
    /// No create before this time.
    pub next_create_at: Option<Timestamp>,
    /// The account is refused: the node says so.
    pub account_refused: Option<String>,
}

/// The meaning of a failed provision, the `failures`-th in a row for this pod.
pub fn provision_failed(
    error: &ProvisionError,
    failures: u32,
    facts: &CreateFacts,
    settings: &Settings,
) -> Failed {
    let backoff = Duration::from_secs(10u64.saturating_mul(1 << failures.min(5)).min(300));
    let quiet = |outcome| Failed {
        outcome,
        nothing_created: true,
        next_create_at: None,
        account_refused: None,
    };
    match error {
        ProvisionError::NoCandidates(message) | ProvisionError::NoCapacity(message) => {
            // Back at the provisioning deadline at the latest, to fail the pod on time.
            let until_deadline = facts.clock_start.map_or(backoff, |start| {
                settings
                    .provision_timeout
                    .saturating_sub(elapsed(start, facts.now))
                    + Duration::from_secs(1)
            });
            Failed {
                next_create_at: facts
                    .now
                    .checked_add(SignedDuration::try_from(backoff).unwrap_or_default())
                    .ok(),
                ..quiet(Outcome {
                    event: Some(Note::warning("NoGpuCapacity", message.clone())),
                    status: Some(View::Waiting {
                        reason: "NoGpuCapacity",
                        message: message.clone(),
                    }),
                    next: Next::Requeue(backoff.min(until_deadline)),
                })
            }
        }
        ProvisionError::Rejected(message) => quiet(Outcome::fail(
            "RunPodRejected",
            message.clone(),
            Next::AwaitChange,
        )),
        ProvisionError::AccountBlocked(message) => Failed {
            account_refused: Some(message.clone()),
            ..quiet(Outcome {
                event: Some(Note::warning("RunPodAccountRefused", message.clone())),
                status: None,
                next: Next::Requeue(settings.reconcile_interval),
            })
        },
        ProvisionError::Unsettled(message) => Failed {
            outcome: Outcome {
                event: Some(Note::warning(
                    "CreateUnsettled",
                    format!("{message}; looking for the pod before any new create"),
                )),
                status: None,
                next: Next::Requeue(settings.create_settle),
            },
            nothing_created: false,
            next_create_at: None,
            account_refused: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::settings;

    /// A create under a budget reservation asks the cloud for no more than was reserved.
    #[test]
    fn a_reservation_caps_what_the_cloud_may_charge() {
        let pod = |annotations: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "annotations": annotations}}))
            .unwrap()
        };
        let get = |pod: &k8s_openapi::api::core::v1::Pod, key: &str| {
            pod.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .cloned()
        };
        let plain = capped(&pod(serde_json::json!({})), 0.66666);
        assert_eq!(
            get(&plain, "runpod.io/max-price").as_deref(),
            Some("0.6666")
        );
        assert_eq!(get(&plain, "vast.ai/price-max"), None);
        let cheaper = capped(&pod(serde_json::json!({"runpod.io/max-price": "0.3"})), 1.0);
        assert_eq!(get(&cheaper, "runpod.io/max-price").as_deref(), Some("0.3"));
        let vast = capped(&pod(serde_json::json!({"vast.ai/price-max": "2"})), 1.0);
        assert_eq!(get(&vast, "vast.ai/price-max").as_deref(), Some("1.0000"));
        assert!(runpod_contract::parse_price("1.0000").is_ok());
        assert!(made_nothing(&ProvisionError::NoCapacity("x".into())));
        assert!(!made_nothing(&ProvisionError::Unsettled("x".into())));
    }

    /// The create Event names every public endpoint (RunPod's proxy URL for HTTP), or says
    /// nothing is exposed.
    #[test]
    fn the_create_event_says_what_is_public() {
        let ports = runpod_contract::parse_ports("8888/http,22/tcp").unwrap();
        let said = exposure(&ports, |port| format!("<{port} here>"));
        assert!(said.starts_with("PUBLIC endpoints"), "{said}");
        assert!(said.contains("<8888/http here>, <22/tcp here>"), "{said}");
        assert!(said.contains("runpod.io/ports: none"), "{said}");
        assert_eq!(exposure(&[], |_| unreachable!()), "no port exposed");
    }

    /// `--expose-ports none` hides declared ports of a pod that names none; a pod's own
    /// `runpod.io/ports` always wins; `auto` leaves the pod alone.
    #[test]
    fn expose_ports_none_applies_only_to_pods_that_name_no_ports() {
        let mut pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 8888}]}]}
        }))
        .unwrap();
        let ports = |pod: &k8s_openapi::api::core::v1::Pod| {
            runpod_contract::policy::ports(pod).unwrap().len()
        };
        assert_eq!(ports(&with_default_ports(&pod, false)), 1);
        assert_eq!(ports(&with_default_ports(&pod, true)), 0);
        pod.metadata.annotations =
            Some([(runpod_contract::PORTS.to_owned(), "8888/http".to_owned())].into());
        assert_eq!(ports(&with_default_ports(&pod, true)), 1);
    }

    fn at(time: &str) -> Timestamp {
        format!("2026-01-01T{time}Z").parse().unwrap()
    }

    fn facts() -> CreateFacts {
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

    fn describe(outcome: &Outcome) -> String {
        let status = match &outcome.status {
            Some(View::Failed { reason, .. }) => format!("failed {reason}"),
            Some(View::Waiting { reason, .. }) => format!("waiting {reason}"),
            Some(_) => "other".into(),
            None => "-".into(),
        };
        let event = outcome.event.as_ref().map_or("-", |note| note.reason);
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
        let note = outcome.event.unwrap();
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
    fn failed_provisions_back_off_fail_or_mark_the_account() {
        let cases = [
            (
                ProvisionError::NoCapacity("all out".into()),
                1,
                "NoGpuCapacity / waiting NoGpuCapacity / 20s",
                true,
                true,
                false,
            ),
            (
                ProvisionError::NoCandidates("none fits".into()),
                9,
                "NoGpuCapacity / waiting NoGpuCapacity / 300s",
                true,
                true,
                false,
            ),
            (
                ProvisionError::Rejected("bad image".into()),
                1,
                "RunPodRejected / failed RunPodRejected / change",
                true,
                false,
                false,
            ),
            (
                ProvisionError::AccountBlocked("402".into()),
                1,
                "RunPodAccountRefused / - / 10s",
                true,
                false,
                true,
            ),
            (
                ProvisionError::Unsettled("timed out".into()),
                1,
                "CreateUnsettled / - / 30s",
                false,
                false,
                false,
            ),
        ];
        for (error, failures, expected, nothing, backoff, account) in cases {
            let failed = provision_failed(&error, failures, &facts(), &settings());
            assert_eq!(describe(&failed.outcome), expected, "{error:?}");
            assert_eq!(failed.nothing_created, nothing, "{error:?}");
            assert_eq!(failed.next_create_at.is_some(), backoff, "{error:?}");
            assert_eq!(failed.account_refused.is_some(), account, "{error:?}");
        }
        // Near the provisioning deadline the next look comes at the deadline, not after the
        // backoff.
        let near = CreateFacts {
            clock_start: Some(at("00:45:05")),
            ..facts()
        };
        let failed = provision_failed(
            &ProvisionError::NoCapacity("x".into()),
            5,
            &near,
            &settings(),
        );
        assert_eq!(failed.outcome.next, Next::Requeue(Duration::from_secs(6)));
    }
}
