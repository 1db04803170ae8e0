//! A pod whose instance the cloud took away (outbid, host lost, removed outside
//! runpod-kubelet): Kubernetes' disruption, not the program's failure. The pod fails with
//! `DisruptionTarget=True` (a Job's `podFailurePolicy` can ignore it), or, `restartPolicy:
//! Always`, gets a new instance; the Event says what happened and what it cost.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use runpod_contract::interruptible::{AVOID_MACHINE_FOR, CLOUD_INSTANCE_LOST};

use super::{Next, Note, Outcome};
use crate::controller::clock::elapsed;
use crate::controller::pods::status::View;
use crate::provider::{CloudName, Disruption, Instance};

/// What a lost instance means for its pod.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Lost {
    /// `true`: `restartPolicy: Always`; a new instance is made (the Event says so, the pod
    /// keeps running); `false`: the pod fails with `reason` and `message`.
    pub replace: bool,
    pub reason: &'static str,
    pub message: String,
    /// The Event: what happened, what it cost, what comes next.
    pub note: Note,
}

fn always(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .is_none_or(|policy| policy == "Always")
}

/// `instance`, listed, was taken away by the cloud (`disruption`).
pub(crate) fn lost(
    pod: &Pod,
    instance: &Instance,
    disruption: Disruption,
    cloud: CloudName,
    now: Timestamp,
) -> Lost {
    let reason = disruption.reason();
    let message = instance.message.clone().unwrap_or_else(|| {
        format!(
            "{} {} was taken away by {}",
            cloud.instance, instance.id, cloud.title
        )
    });
    let replace = always(pod);
    let avoided = instance
        .machine
        .as_deref()
        .map(|machine| {
            format!(
                "; machine {machine} is avoided for {}",
                humantime::format_duration(AVOID_MACHINE_FOR)
            )
        })
        .unwrap_or_default();
    let next = if replace {
        "creating a new one (restartPolicy Always)"
    } else {
        "the pod fails with DisruptionTarget"
    };
    let note = Note::warning(
        reason,
        format!("{message}{}{avoided}; {next}", cost(instance, now)),
    );
    Lost {
        replace,
        reason,
        message,
        note,
    }
}

/// What the lost instance cost: its price and how long it ran, when the cloud said.
fn cost(instance: &Instance, now: Timestamp) -> String {
    let Some(price) = instance.cost_per_hour.filter(|p| p.is_finite() && *p > 0.0) else {
        return String::new();
    };
    match instance.started_at.or(instance.created_at) {
        Some(since) => {
            let ran = elapsed(since, now);
            let spent = price * ran.as_secs_f64() / 3600.0;
            format!(
                "; it ran {} at {price:.3} USD/h, about {spent:.3} USD",
                humantime::format_duration(std::time::Duration::from_secs(ran.as_secs()))
            )
        }
        None => format!("; it cost {price:.3} USD/h"),
    }
}

/// The pod's instance is gone from the cloud (the cloud answered 404 for its id) while the pod
/// was not finished: lost by the cloud (or removed outside runpod-kubelet). A pod with
/// `restartPolicy: Always` gets a new instance, as a kubelet restarts its container; any other
/// pod fails with `DisruptionTarget` and is never created again.
#[derive(Debug, Clone)]
pub(crate) struct Vanished {
    pub replace: bool,
    pub outcome: Outcome,
}

pub(crate) fn vanished(pod: &Pod, id: &str, cloud: CloudName) -> Vanished {
    let message = format!(
        "{} {id} no longer exists (lost by {}, or terminated outside runpod-kubelet)",
        cloud.instance, cloud.title
    );
    if always(pod) && id != "(unknown)" {
        let note = Note::warning(
            CLOUD_INSTANCE_LOST,
            format!("{message}; creating a new one (restartPolicy Always)"),
        );
        return Vanished {
            replace: true,
            outcome: Outcome {
                events: vec![note],
                describes: None,
                status: None,
                next: Next::Requeue(crate::controller::pods::SHORT),
            },
        };
    }
    Vanished {
        replace: false,
        outcome: Outcome {
            events: vec![Note::warning(CLOUD_INSTANCE_LOST, message.clone())],
            describes: None,
            status: Some(View::Failed {
                reason: CLOUD_INSTANCE_LOST,
                message,
            }),
            next: Next::AwaitChange,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::InstanceState;

    fn pod(policy: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"restartPolicy": policy, "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap()
    }

    fn instance(price: Option<f64>, started: Option<Timestamp>) -> Instance {
        Instance {
            cost_per_hour: price,
            started_at: started,
            machine: Some("4711".into()),
            message: Some("Vast.ai instance 9 was outbid: a higher bid took machine 4711".into()),
            state: InstanceState::Error,
            disruption: Some(Disruption::Outbid),
            ..crate::controller::fixtures::instance("9", "c1", "vr", Some("u"))
        }
    }

    #[test]
    fn an_outbid_batch_pod_fails_and_the_event_says_what_it_cost() {
        let now: Timestamp = "2026-11-29T10:00:00Z".parse().unwrap();
        let started: Timestamp = "2026-11-29T09:30:00Z".parse().unwrap();
        let lost = lost(
            &pod("Never"),
            &instance(Some(0.2), Some(started)),
            Disruption::Outbid,
            CloudName::VASTAI,
            now,
        );
        assert!(!lost.replace);
        assert_eq!(lost.reason, "Outbid");
        assert_eq!(lost.note.reason, "Outbid");
        assert!(lost.note.warning);
        let said = &lost.note.message;
        assert!(said.contains("outbid"), "{said}");
        assert!(
            said.contains("30m at 0.200 USD/h, about 0.100 USD"),
            "{said}"
        );
        assert!(said.contains("machine 4711 is avoided for 30m"), "{said}");
        assert!(said.contains("DisruptionTarget"), "{said}");
    }

    #[test]
    fn a_lost_always_pod_gets_a_new_instance() {
        let lost = lost(
            &pod("Always"),
            &Instance {
                message: None,
                machine: None,
                ..instance(None, None)
            },
            Disruption::Lost,
            CloudName::VASTAI,
            Timestamp::now(),
        );
        assert!(lost.replace);
        assert_eq!(lost.reason, "CloudInstanceLost");
        assert!(
            lost.note.message.contains("creating a new one"),
            "{}",
            lost.note.message
        );
        assert!(
            !lost.note.message.contains("avoided"),
            "no machine, nothing avoided"
        );
        assert!(!lost.note.message.contains("USD"), "no price, no cost");
    }
}
