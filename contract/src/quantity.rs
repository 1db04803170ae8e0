//! Kubernetes resource quantities (`512Mi`, `8G`, `1.5`, `500m`, `1e3`) as numbers, for the
//! memory and CPU a pod requests of the machine its cloud picks.

/// The value of a quantity in base units (bytes for memory, cores for CPU); `None` when it is
/// not a quantity Kubernetes would accept, or is negative.
pub fn parse(quantity: &str) -> Option<f64> {
    let text = quantity.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0_f64.powi(2),
        "Gi" => 1024.0_f64.powi(3),
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        "Ei" => 1024.0_f64.powi(6),
        exponent => {
            let power: i32 = exponent.strip_prefix(['e', 'E'])?.parse().ok()?;
            10.0_f64.powi(power)
        }
    };
    let value = number * factor;
    (value.is_finite() && value >= 0.0).then_some(value)
}

/// The pod's first container's request of `resource` (`memory`, `cpu`), else its limit (a
/// limit alone is also the request, as Kubernetes defaults it), in base units.
pub fn requested(pod: &k8s_openapi::api::core::v1::Pod, resource: &str) -> Option<f64> {
    let resources = pod.spec.as_ref()?.containers.first()?.resources.as_ref()?;
    let of = |map: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| { map.as_ref()?.get(resource).and_then(|q| parse(&q.0)) };
    of(&resources.requests).or_else(|| of(&resources.limits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_kubernetes_reads_them() {
        assert_eq!(parse("512Mi"), Some(512.0 * 1024.0 * 1024.0));
        assert_eq!(parse("8Gi"), Some(8.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(parse("8G"), Some(8e9));
        assert_eq!(parse("1.5"), Some(1.5));
        assert_eq!(parse("500m"), Some(0.5));
        assert_eq!(parse("1e3"), Some(1000.0));
        assert_eq!(parse(" 2 "), Some(2.0));
        for bad in ["", "Gi", "8Gb", "-1", "1.2.3", "e3"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_request_wins_over_the_limit() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"memory": "16Gi"}, "limits": {"memory": "32Gi", "cpu": "4"}}}]}
        }))
        .unwrap();
        assert_eq!(requested(&pod, "memory"), Some(16.0 * 1024.0_f64.powi(3)));
        assert_eq!(requested(&pod, "cpu"), Some(4.0));
        assert_eq!(requested(&pod, "ephemeral-storage"), None);
    }
}
