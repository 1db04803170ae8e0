//! Kubernetes resource quantities (`512Mi`, `8G`, `1.5`, `500m`, `1e3`) as numbers: the memory
//! and CPU a container asks for, read by the clouds' placement and the usage figures.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a Kubernetes quantity")]
    Malformed(String),
}

/// A Kubernetes quantity (`500m`, `2`, `1.5Gi`, `1e9`, `128M`) as a number.
pub fn parse_quantity(text: &str) -> Result<f64, QuantityError> {
    let malformed = || QuantityError::Malformed(text.to_owned());
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| malformed())?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => {
            let power: i32 = exponent[1..].parse().map_err(|_| malformed())?;
            10f64.powi(power)
        }
        _ => return Err(malformed()),
    };
    let value = number * factor;
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(malformed())
    }
}

/// The container's request of `resource` (`memory`, `cpu`), else its limit (a limit alone is
/// also the request, as Kubernetes defaults it), in base units (bytes, cores); unreadable or
/// zero values count as unset.
pub fn requested(container: &Container, resource: &str) -> Option<f64> {
    let resources = container.resources.as_ref()?;
    let read = |map: &Option<BTreeMap<String, Quantity>>| {
        map.as_ref()
            .and_then(|m| m.get(resource))
            .and_then(|q| parse_quantity(&q.0).ok())
            .filter(|v| *v > 0.0)
    };
    read(&resources.requests).or_else(|| read(&resources.limits))
}

/// [`requested`] of the pod's first container.
pub fn pod_requested(pod: &k8s_openapi::api::core::v1::Pod, resource: &str) -> Option<f64> {
    requested(pod.spec.as_ref()?.containers.first()?, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        let cases = [
            ("500m", 0.5),
            ("2", 2.0),
            ("1.5", 1.5),
            ("1Gi", 1073741824.0),
            ("512Mi", 536870912.0),
            ("128M", 128e6),
            ("1e3", 1000.0),
            ("2E", 2e18),
            ("100k", 1e5),
            ("250u", 250e-6),
        ];
        for (text, value) in cases {
            let read = parse_quantity(text).unwrap();
            assert!((read - value).abs() <= value * 1e-12, "{text}: {read}");
        }
        for bad in ["", "abc", "1Qi", "-1", "1e", "m"] {
            assert!(parse_quantity(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_request_wins_over_the_limit() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"memory": "16Gi"}, "limits": {"memory": "32Gi", "cpu": "4"}}}]}
        }))
        .unwrap();
        assert_eq!(
            pod_requested(&pod, "memory"),
            Some(16.0 * 1024.0_f64.powi(3))
        );
        assert_eq!(pod_requested(&pod, "cpu"), Some(4.0));
        assert_eq!(pod_requested(&pod, "ephemeral-storage"), None);
    }
}
