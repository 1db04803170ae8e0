//! The contract checker itself: it must flag responses that break the spec.

use runpod_simulator::{Exchange, Operation};
use serde_json::json;

use crate::support::spec;

fn exchange(
    method: &str,
    path: &str,
    status: u16,
    content_type: Option<&str>,
    body: Option<serde_json::Value>,
) -> Exchange {
    Exchange {
        arrival: 0,
        at_ms: 0,
        method: method.into(),
        path: path.into(),
        operation: Operation::ALL.into_iter().find(|op| {
            matches!(
                (method, op),
                ("DELETE", Operation::DeletePod) | ("GET", Operation::ListPods)
            )
        }),
        status,
        content_type: content_type.map(str::to_owned),
        headers: Vec::new(),
        body,
        injected: false,
    }
}

#[test]
fn the_checker_flags_error_statuses_the_operation_does_not_have() {
    let spec = spec();
    let problem = |status: u16| json!({"title": "t", "status": status, "detail": "d"});
    // getPod lists 401, 403, 404 and 429; a 400 or 409 there means the simulator drifted.
    let drifted = Exchange {
        operation: Some(Operation::GetPod),
        ..exchange(
            "GET",
            "/v2/pods/abc",
            409,
            Some("application/problem+json"),
            Some(problem(409)),
        )
    };
    let errors = spec.validate_exchange(&drifted).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("status 409"), "{errors:?}");
    // Unless a test injected it on purpose.
    let injected = Exchange {
        injected: true,
        ..drifted
    };
    assert_eq!(spec.validate_exchange(&injected), Ok(()));
    // createPod's description names 402; server errors and 429 are possible everywhere.
    for (path, method, operation, status) in [
        ("/v2/pods", "POST", Operation::CreatePod, 402),
        ("/v2/pods/abc", "GET", Operation::GetPod, 503),
    ] {
        let fine = Exchange {
            operation: Some(operation),
            ..exchange(
                method,
                path,
                status,
                Some("application/problem+json"),
                Some(problem(status)),
            )
        };
        assert_eq!(spec.validate_exchange(&fine), Ok(()), "{method} {status}");
    }
}

#[test]
fn the_checker_flags_shapes_statuses_bodies_and_content_types() {
    let spec = spec();
    let good = exchange(
        "GET",
        "/v2/pods?x=1",
        200,
        Some("application/json"),
        Some(json!({"pods": []})),
    );
    assert_eq!(spec.validate_exchange(&good), Ok(()));

    let missing_field = exchange(
        "GET",
        "/v2/pods",
        200,
        Some("application/json"),
        Some(json!({"pods": [{"id": "x"}]})),
    );
    assert!(spec.validate_exchange(&missing_field).is_err());

    let wrong_type = exchange(
        "GET",
        "/v2/pods",
        200,
        Some("text/plain"),
        Some(json!({"pods": []})),
    );
    assert!(spec.validate_exchange(&wrong_type).unwrap_err()[0].contains("content type"));

    let body_on_204 = exchange(
        "DELETE",
        "/v2/pods/abc",
        204,
        Some("application/json"),
        Some(json!({})),
    );
    assert!(spec.validate_exchange(&body_on_204).is_err());
    let clean_204 = exchange("DELETE", "/v2/pods/abc", 204, None, None);
    assert_eq!(spec.validate_exchange(&clean_204), Ok(()));

    let problem = json!({"title": "Not Found", "status": 404, "detail": "pod not found"});
    let not_problem = exchange(
        "DELETE",
        "/v2/pods/abc",
        404,
        Some("application/json"),
        Some(problem.clone()),
    );
    assert!(
        spec.validate_exchange(&not_problem).is_err(),
        "errors are application/problem+json"
    );
    let bad_problem = exchange(
        "DELETE",
        "/v2/pods/abc",
        404,
        Some("application/problem+json"),
        Some(json!({"error": "x"})),
    );
    assert!(spec.validate_exchange(&bad_problem).is_err());

    let mut no_retry = exchange(
        "GET",
        "/v2/pods",
        429,
        Some("application/problem+json"),
        Some(problem.clone()),
    );
    assert!(
        spec.validate_exchange(&no_retry).is_err(),
        "429 needs Retry-After"
    );
    no_retry.headers.push(("retry-after".into(), "3".into()));
    no_retry
        .headers
        .push(("ratelimit".into(), "minute;r=0".into()));
    assert!(spec.validate_exchange(&no_retry).unwrap_err()[0].contains("RateLimit"));

    let unknown_path_ok = exchange(
        "GET",
        "/v2/nope",
        404,
        Some("application/problem+json"),
        Some(problem),
    );
    let mut unknown_path_ok = unknown_path_ok;
    unknown_path_ok.operation = None;
    assert_eq!(spec.validate_exchange(&unknown_path_ok), Ok(()));
    let mut unknown_path_200 = exchange(
        "GET",
        "/v2/nope",
        200,
        Some("application/json"),
        Some(json!({})),
    );
    unknown_path_200.operation = None;
    assert!(spec.validate_exchange(&unknown_path_200).is_err());

    let mut mislabelled = good.clone();
    mislabelled.operation = Some(Operation::CreatePod);
    assert!(spec.validate_exchange(&mislabelled).is_err());

    let all = spec.check_all(&[good, missing_field, clean_204]);
    assert!(
        !all.is_empty() && all.iter().all(|v| v.starts_with("GET /v2/pods -> 200: ")),
        "{all:?}"
    );
}
