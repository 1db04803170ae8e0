//! Burst pods outlive a controller outage: the tolerations that keep the node lifecycle
//! controller from evicting them while the virtual node is NotReady.

use std::time::Duration;

use k8s_openapi::api::core::v1::Toleration;

/// Taints the node lifecycle controller puts on an unhealthy node.
const OUTAGE_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// The tolerations with `not-ready`/`unreachable` NoExecute lengthened to `grace`, or `None`
/// when they already are: burst pods must outlive a controller outage, which the node
/// lifecycle controller would otherwise punish by evicting them after 300 s.
pub(crate) fn outage_tolerations(
    current: &[Toleration],
    grace: Duration,
) -> Option<Vec<Toleration>> {
    let seconds = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
    let mut next = current.to_vec();
    let mut changed = false;
    for key in OUTAGE_TAINTS {
        let existing = next.iter_mut().find(|t| {
            t.key.as_deref() == Some(key)
                && t.effect.as_deref().is_none_or(|e| e == "NoExecute")
                && t.operator.as_deref().is_none_or(|o| o == "Exists")
        });
        match existing {
            Some(toleration) => match toleration.toleration_seconds {
                // Unbounded already: leave it.
                None => {}
                Some(current) if current >= seconds => {}
                Some(_) => {
                    toleration.toleration_seconds = Some(seconds);
                    changed = true;
                }
            },
            None => {
                next.push(Toleration {
                    key: Some(key.to_owned()),
                    operator: Some("Exists".into()),
                    effect: Some("NoExecute".into()),
                    toleration_seconds: Some(seconds),
                    value: None,
                });
                changed = true;
            }
        }
    }
    changed.then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toleration(key: &str, seconds: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: seconds,
            value: None,
        }
    }

    #[test]
    fn default_outage_tolerations_are_lengthened_once() {
        let hour = Duration::from_secs(3600);
        let defaults = vec![
            toleration("node.kubernetes.io/not-ready", Some(300)),
            toleration("node.kubernetes.io/unreachable", Some(300)),
        ];
        let longer = outage_tolerations(&defaults, hour).unwrap();
        assert!(longer.iter().all(|t| t.toleration_seconds == Some(3600)));
        assert_eq!(longer.len(), 2);
        assert_eq!(outage_tolerations(&longer, hour), None);
        // Missing ones are added; unbounded ones are left alone.
        let added =
            outage_tolerations(&[toleration("node.kubernetes.io/not-ready", None)], hour).unwrap();
        assert_eq!(added.len(), 2);
        assert_eq!(added[0].toleration_seconds, None);
        assert_eq!(added[1].toleration_seconds, Some(3600));
    }
}
