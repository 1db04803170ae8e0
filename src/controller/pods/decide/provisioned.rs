//! What is sent for a pod and what a provision's outcome writes, as pure decisions: the pod
//! as the cloud should see it, the Events of a create that made an instance, and the meaning
//! of a failed one.

use std::borrow::Cow;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::gates::CreateFacts;
use super::{Next, Note, Outcome};
use crate::controller::clock::elapsed;
use crate::controller::context::Settings;
use crate::controller::pods::status::View;
use crate::provider::{ProvisionError, Provisioned};

/// The pod as the cloud should see it: its default ports (see [`with_default_ports`]) and,
/// under a budget reservation of `reserved` USD per hour, price caps no higher than that.
pub(crate) fn shaped(pod: &Pod, expose_no_ports: bool, reserved: Option<f64>) -> Cow<'_, Pod> {
    let pod = with_default_ports(pod, expose_no_ports);
    match reserved {
        Some(usd) => Cow::Owned(capped(&pod, usd)),
        None => pod,
    }
}

/// The pod as the cloud should see it: with `--expose-ports none`, a pod that names no ports
/// (`runpod.io/ports`, written by the webhook when it admitted the pod) exposes none rather
/// than its declared `containerPort`s, however it reached the node.
pub(crate) fn with_default_ports(pod: &Pod, expose_no_ports: bool) -> Cow<'_, Pod> {
    let named = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(runpod_contract::PORTS));
    if named || !expose_no_ports {
        return Cow::Borrowed(pod);
    }
    let mut pod = pod.clone();
    pod.metadata.annotations.get_or_insert_default().insert(
        runpod_contract::PORTS.to_owned(),
        runpod_contract::PORTS_NONE.to_owned(),
    );
    Cow::Owned(pod)
}

/// The pod as the cloud should see it under a budget reservation of `usd` per hour: its price
/// caps (`runpod.io/max-price`, and Vast.ai's own when set) no higher than the reservation.
pub(crate) fn capped(pod: &Pod, usd: f64) -> Pod {
    let mut pod = pod.clone();
    runpod_contract::budget::lower_caps(pod.metadata.annotations.get_or_insert_default(), usd);
    pod
}

/// On the first attempt, `cheapest`'s choice and its prices, repeated where users read Events,
/// when it chose this node's cloud.
pub(crate) fn cheapest_note(pod: &Pod, cloud: &str) -> Option<Note> {
    let choice = pod
        .metadata
        .annotations
        .as_ref()?
        .get(runpod_contract::provider::CHEAPEST_CHOICE)?;
    runpod_contract::gpus::recorded_choice(choice)
        .is_some_and(|chosen| chosen.as_str() == cloud)
        .then(|| Note {
            warning: false,
            reason: "CheapestChosen",
            message: format!("{}=cheapest {choice}", runpod_contract::provider::PROVIDER),
        })
}

/// The Event for volumes left out because they hold a cluster credential (the ServiceAccount
/// token), if any were.
pub(crate) fn token_not_mounted(skipped: &[String], title: &str, noun: &str) -> Option<Note> {
    (!skipped.is_empty()).then(|| Note {
        warning: false,
        reason: "ServiceAccountTokenNotMounted",
        message: format!(
            "the service-account token in {} is not mounted on {title}: {noun}s cannot reach \
             the cluster's apiserver, and a cluster credential is not shipped to the cloud",
            skipped.join(", ")
        ),
    })
}

/// What the pod's create Event says about exposure: every port the cloud publishes is reachable
/// from the internet, so the user reads which, and how to expose none.
pub(crate) fn exposure(
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

/// A create that made an instance, as its Events describe it.
pub(crate) struct Created<'a> {
    pub made: &'a Provisioned,
    /// The pod as it was sent.
    pub pod: &'a Pod,
    /// `RunPod pod`, `Vast.ai instance`.
    pub noun: &'a str,
    /// The cloud's name.
    pub title: &'a str,
    /// What the create opened for the node's shell access, when it did.
    pub shell_opened: Option<&'a str>,
    /// The cloud runs things in the container: `exec` hooks (`postStart` of containers that
    /// set a command) and probes, over the node's SSH connection.
    pub in_container: bool,
    /// How the internet reaches a port of the instance.
    pub endpoint: &'a dyn Fn(&runpod_contract::PortSpec) -> String,
}

/// What is written before a create is sent: the Events decided so far, and the pod waiting
/// on its instance.
pub(crate) fn sending(notes: Vec<Note>, noun: &str) -> Outcome {
    Outcome {
        events: notes,
        describes: None,
        status: Some(View::Waiting {
            reason: "ContainerCreating",
            message: format!("creating the {noun}"),
        }),
        next: Next::AwaitChange,
    }
}

/// What a create that made an instance writes: its Events ([`created_notes`]) and the
/// instance's annotations; the pod is looked at again after `interval`.
pub(crate) fn described(created: &Created<'_>, interval: Duration) -> Outcome {
    Outcome {
        events: created_notes(created),
        describes: Some(created.made.instance.clone()),
        status: None,
        next: Next::Requeue(interval),
    }
}

/// The Events of a create that made an instance, in order: offers refused before it, what was
/// made and what of it is public, what of the pod's securityContext was not applied (said
/// where a Job's pods are read), and a possible duplicate still to come.
pub(crate) fn created_notes(created: &Created<'_>) -> Vec<Note> {
    let made = created.made;
    let mut notes = Vec::new();
    if !made.refusals.is_empty() {
        notes.push(Note {
            warning: false,
            reason: "CapacityRetries",
            message: format!("refused before success: {}", made.refusals.join("; ")),
        });
    }
    // The controller's own port, published like the pod's: say so.
    let shell = match created.shell_opened {
        Some(opened)
            if !runpod_contract::exposes_nothing(
                created.pod.metadata.annotations.as_ref(),
                false,
            ) =>
        {
            format!("{opened}; ")
        }
        _ => String::new(),
    };
    notes.push(Note {
        warning: false,
        reason: "RunPodPodCreated",
        message: format!(
            "{} {}: {}; {shell}{}",
            created.noun,
            made.instance.id,
            made.summary,
            exposure(
                &runpod_contract::policy::ports(created.pod).unwrap_or_default(),
                created.endpoint
            )
        ),
    });
    let view = serde_json::to_value(created.pod)
        .and_then(serde_json::from_value::<runpod_contract::pod::PodView>)
        .ok();
    if let Some(view) = &view {
        let checks = [
            (
                "SecurityContextNotApplied",
                runpod_contract::checks::unapplied_security_context_message(view, created.title),
            ),
            (
                "PodFieldsNotHonoured",
                runpod_contract::checks::unhonoured_message(
                    view,
                    created.title,
                    created.in_container,
                ),
            ),
        ];
        for (reason, message) in checks {
            notes.extend(message.map(|message| Note::warning(reason, message)));
        }
    }
    if made.possibly_duplicated {
        // Every later list is checked for a second instance with this UID tag, which the
        // duplicate handling terminates at once.
        notes.push(Note::warning(
            "PossibleDuplicate",
            format!(
                "an earlier create may also have made a {}; it will be terminated as soon as {} \
                 lists it",
                created.noun, created.title
            ),
        ));
    }
    notes
}

/// Whether a failed provision is known to have created nothing (its reservation can go).
pub(crate) fn made_nothing(error: &ProvisionError) -> bool {
    !matches!(error, ProvisionError::Unsettled(_))
}

/// What a failed provision means for the pod, beside what to write.
#[derive(Debug, Clone)]
pub(crate) struct Failed {
    pub outcome: Outcome,
    /// The cloud said for sure that nothing was made: no settle wait before the next create.
    pub nothing_created: bool,
    /// No create before this time.
    pub next_create_at: Option<Timestamp>,
    /// The account is refused: the node says so.
    pub account_refused: Option<String>,
}

/// The meaning of a failed provision, the `failures`-th in a row for this pod.
pub(crate) fn provision_failed(
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
                    events: vec![Note::warning("NoGpuCapacity", message.clone())],
                    describes: None,
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
                events: vec![Note::warning("RunPodAccountRefused", message.clone())],
                describes: None,
                status: None,
                next: Next::Requeue(settings.reconcile_interval),
            })
        },
        ProvisionError::Unsettled(message) => Failed {
            outcome: Outcome {
                events: vec![Note::warning(
                    "CreateUnsettled",
                    format!("{message}; looking for the pod before any new create"),
                )],
                describes: None,
                status: None,
                next: Next::Requeue(settings.create_settle),
            },
            nothing_created: false,
            next_create_at: None,
            account_refused: None,
        },
    }
}

/// What a claim's owner is told when the account was refused while creating a pod that mounts
/// it: the account is what keeps the volume (storage bills while no pod runs, and at a zero
/// balance the cloud stops the pods).
pub(crate) fn account_refused_for_claim(cloud: &str, pod: &str, message: &str) -> String {
    format!(
        "{cloud} refused the account while creating pod {pod}: {message}. This claim's \
         network volume keeps its data only while the account is in good standing: at a zero \
         balance {cloud} stops every pod"
    )
}

#[cfg(test)]
mod tests {
    use super::super::gates::tests::{at, describe, facts};
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

    /// A create's Events, in order: refusals before it, what was made with its shell port and
    /// public endpoints, the securityContext not applied, a possible duplicate.
    #[test]
    fn a_create_says_what_was_made_what_is_public_and_what_was_not_applied() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": {"runpod.io/ports": "8888/http"}},
            "spec": {"containers": [{"name": "c", "image": "i",
                     "securityContext": {"runAsUser": 1000}}]}
        }))
        .unwrap();
        let made = Provisioned {
            instance: crate::controller::fixtures::instance("abc", "c", "n", Some("u")),
            summary: "A4000 x1".into(),
            refusals: vec!["A6000: no capacity".into()],
            duplicates: Vec::new(),
            possibly_duplicated: true,
        };
        let created = Created {
            made: &made,
            pod: &pod,
            noun: "Cloud pod",
            title: "Cloud",
            shell_opened: Some("22/tcp for exec"),
            in_container: false,
            endpoint: &|port| format!("<{port}>"),
        };
        let notes = created_notes(&created);
        let reasons: Vec<&str> = notes.iter().map(|n| n.reason).collect();
        assert_eq!(
            reasons,
            [
                "CapacityRetries",
                "RunPodPodCreated",
                "SecurityContextNotApplied",
                "PossibleDuplicate"
            ]
        );
        assert_eq!(
            notes[1].message,
            "Cloud pod abc: A4000 x1; 22/tcp for exec; PUBLIC endpoints on the internet: \
             <8888/http> (set runpod.io/ports: none to expose none)"
        );
        assert!(notes[2].warning && notes[3].warning && !notes[1].warning);
        // A pod that exposes nothing does not get the shell port mentioned either.
        let mut hidden = pod.clone();
        hidden
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("runpod.io/ports".into(), "none".into());
        let quiet = Provisioned {
            refusals: Vec::new(),
            possibly_duplicated: false,
            ..made.clone()
        };
        let notes = created_notes(&Created {
            made: &quiet,
            pod: &hidden,
            ..created
        });
        assert_eq!(notes[0].message, "Cloud pod abc: A4000 x1; no port exposed");
    }
}
