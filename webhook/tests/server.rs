//! The webhook server over real TLS: the AdmissionReview contract, bad input, protocols,
//! certificate reload and operational endpoints.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use support::*;

fn parse(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

#[tokio::test]
async fn gpu_pod_review_gets_a_json_patch_over_both_protocols() {
    let server = start(opted_in_cluster(), policy(), Duration::from_secs(60)).await;
    for h2 in [false, true] {
        let body = serde_json::to_vec(&review(gpu_pod())).unwrap();
        let reply = request(server.addr, &server.ca_pem, "POST", "/mutate", body, h2).await;
        assert_eq!(reply.status, 200);
        let expected_alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
        assert_eq!(reply.alpn.as_deref(), Some(expected_alpn));
        let review = parse(&reply.body);
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        let response = &review["response"];
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(response["patch"].as_str().unwrap())
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
        let mut pod = gpu_pod();
        json_patch::patch(&mut pod, &patch).unwrap();
        assert_eq!(
            pod["spec"]["tolerations"][0]["key"],
            "virtual-kubelet.io/provider"
        );
        assert_eq!(
            pod["metadata"]["annotations"]["runpod.io/ports"],
            "8888/http"
        );
    }
}

/// Reviews skip the router (`POST /mutate` goes to its handler directly): the apiserver's query
/// string still reaches it, and every other method or path is still the router's to refuse.
#[tokio::test]
async fn reviews_are_answered_with_the_apiservers_query_and_other_methods_are_refused() {
    let server = start(opted_in_cluster(), policy(), Duration::from_secs(60)).await;
    let body = serde_json::to_vec(&review(gpu_pod())).unwrap();
    for h2 in [false, true] {
        let reply = request(
            server.addr,
            &server.ca_pem,
            "POST",
            "/mutate?timeout=10s",
            body.clone(),
            h2,
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(parse(&reply.body)["response"]["patchType"], "JSONPatch");
        assert_eq!(
            reply.content_type.as_deref(),
            Some("application/json"),
            "h2: {h2}"
        );
        for (method, path, status) in [
            ("GET", "/mutate", 405),
            ("PUT", "/mutate", 405),
            ("POST", "/mutate/", 404),
            ("POST", "/Mutate", 404),
        ] {
            let reply = request(server.addr, &server.ca_pem, method, path, body.clone(), h2).await;
            assert_eq!(reply.status, status, "{method} {path} (h2: {h2})");
        }
    }
}

#[tokio::test]
async fn forbidden_datacenter_is_a_403_review_with_the_ids() {
    let server = start(opted_in_cluster(), policy(), Duration::from_secs(60)).await;
    let mut pod = gpu_pod();
    pod["metadata"]["annotations"] = json!({"runpod.io/datacenter-ids": "US-CA-2"});
    let reply = request(
        server.addr,
        &server.ca_pem,
        "POST",
        "/mutate",
        serde_json::to_vec(&review(pod)).unwrap(),
        false,
    )
    .await;
    assert_eq!(reply.status, 200, "a refusal is still a successful review");
    let response = &parse(&reply.body)["response"];
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("US-CA-2") && message.contains("EU-RO-1"),
        "{message}"
    );
}

#[tokio::test]
async fn bad_input_is_a_400_with_a_json_error() {
    let server = start(opted_in_cluster(), policy(), Duration::from_secs(60)).await;
    let mut wrong_kind = review(gpu_pod());
    wrong_kind["kind"] = json!("Pod");
    let mut wrong_version = review(gpu_pod());
    wrong_version["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut no_request = review(gpu_pod());
    no_request.as_object_mut().unwrap().remove("request");
    let mut no_object = review(gpu_pod());
    no_object["request"]
        .as_object_mut()
        .unwrap()
        .remove("object");
    let mut bad_pod = review(gpu_pod());
    bad_pod["request"]["object"]["spec"] = json!("not a spec");
    let mut huge = review(gpu_pod());
    huge["request"]["object"]["metadata"]["annotations"] =
        json!({"big": "x".repeat(3 * 1024 * 1024)});
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage", b"{not json".to_vec(), "not JSON"),
        ("empty", Vec::new(), "not JSON"),
        (
            "wrong kind",
            serde_json::to_vec(&wrong_kind).unwrap(),
            "expected apiVersion",
        ),
        (
            "wrong version",
            serde_json::to_vec(&wrong_version).unwrap(),
            "expected apiVersion",
        ),
        (
            "no request",
            serde_json::to_vec(&no_request).unwrap(),
            "no request",
        ),
        (
            "no object",
            serde_json::to_vec(&no_object).unwrap(),
            "object is missing",
        ),
        (
            "bad pod",
            serde_json::to_vec(&bad_pod).unwrap(),
            "not a valid Pod",
        ),
        ("over 3 MiB", serde_json::to_vec(&huge).unwrap(), "limit"),
    ];
    for (name, body, expected) in cases {
        for h2 in [false, true] {
            let reply = request(
                server.addr,
                &server.ca_pem,
                "POST",
                "/mutate",
                body.clone(),
                h2,
            )
            .await;
            assert_eq!(
                reply.status,
                400,
                "{name}: {}",
                String::from_utf8_lossy(&reply.body)
            );
            let error = parse(&reply.body)["error"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(error.contains(expected), "{name}: {error}");
        }
    }
}

#[tokio::test]
async fn other_resources_and_operations_are_allowed_unchanged() {
    let server = start(opted_in_cluster(), policy(), Duration::from_secs(60)).await;
    let mut deployment =
        review(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}));
    deployment["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    deployment["request"]["resource"] =
        json!({"group": "apps", "version": "v1", "resource": "deployments"});
    let mut update = review(gpu_pod());
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["oldObject"] = gpu_pod();
    let mut binding = review(gpu_pod());
    binding["request"]["subResource"] = json!("binding");
    for body in [deployment, update, binding] {
        let reply = request(
            server.addr,
            &server.ca_pem,
            "POST",
            "/mutate",
            serde_json::to_vec(&body).unwrap(),
            false,
        )
        .await;
        assert_eq!(reply.status, 200);
        let response = &parse(&reply.body)["response"];
        assert_eq!(response["allowed"], true);
        assert!(response.get("patch").is_none(), "{response}");
    }
}

#[tokio::test]
async fn an_unreadable_cluster_refuses_with_a_retryable_error() {
    let mut cluster = opted_in_cluster();
    cluster.fail_lookups = true;
    let server = start(cluster, policy(), Duration::from_secs(60)).await;
    let reply = request(
        server.addr,
        &server.ca_pem,
        "POST",
        "/mutate",
        serde_json::to_vec(&review(gpu_pod())).unwrap(),
        false,
    )
    .await;
    let response = &parse(&reply.body)["response"];
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 500);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("retried")
    );

    // Opted-out pods never depend on the cluster.
    let mut pod = gpu_pod();
    pod["metadata"]["labels"] = json!({"runpod.io/burst": "disabled"});
    let reply = request(
        server.addr,
        &server.ca_pem,
        "POST",
        "/mutate",
        serde_json::to_vec(&review(pod)).unwrap(),
        false,
    )
    .await;
    assert_eq!(parse(&reply.body)["response"]["allowed"], true);
}

#[tokio::test]
async fn metrics_count_outcomes_and_readiness_follows_the_caches() {
    let cluster = opted_in_cluster();
    cluster.synced.store(false, Ordering::Release);
    let server = start(cluster, policy(), Duration::from_secs(60)).await;
    let ready = request(
        server.addr,
        &server.ca_pem,
        "GET",
        "/readyz",
        Vec::new(),
        false,
    )
    .await;
    assert_eq!(ready.status, 503);
    server.cluster.synced.store(true, Ordering::Release);
    let ready = request(
        server.addr,
        &server.ca_pem,
        "GET",
        "/readyz",
        Vec::new(),
        false,
    )
    .await;
    assert_eq!(ready.status, 200);
    assert_eq!(
        request(
            server.addr,
            &server.ca_pem,
            "GET",
            "/healthz",
            Vec::new(),
            true
        )
        .await
        .status,
        200
    );

    request(
        server.addr,
        &server.ca_pem,
        "POST",
        "/mutate",
        serde_json::to_vec(&review(gpu_pod())).unwrap(),
        false,
    )
    .await;
    request(
        server.addr,
        &server.ca_pem,
        "POST",
        "/mutate",
        b"nope".to_vec(),
        false,
    )
    .await;
    let metrics = request(
        server.addr,
        &server.ca_pem,
        "GET",
        "/metrics",
        Vec::new(),
        false,
    )
    .await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains(r#"runpod_kubelet_admissions_total{outcome="mutated"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"runpod_kubelet_admissions_total{outcome="invalid"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("runpod_kubelet_admission_duration_seconds_count 2"),
        "{text}"
    );
}

#[tokio::test]
async fn only_tls_12_and_13_are_offered() {
    let server = start(opted_in_cluster(), policy(), Duration::from_secs(60)).await;
    let tls = tls_connect(server.addr, &server.ca_pem, &[b"http/1.1"])
        .await
        .unwrap();
    let version = tls.get_ref().1.protocol_version();
    assert_eq!(version, Some(rustls::ProtocolVersion::TLSv1_3));
    // openssl can still speak TLS 1.1: the server must refuse it.
    // tokio's Command: a blocking call would starve the server running on this runtime.
    let output = tokio::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &server.addr.to_string(),
            "-tls1_1",
            "-brief",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    if let Ok(output) = output {
        assert!(
            !output.status.success(),
            "TLS 1.1 handshake succeeded: {}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
    let tls12 = tokio::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &server.addr.to_string(),
            "-tls1_2",
            "-brief",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    if let Ok(output) = tls12 {
        assert!(
            output.status.success(),
            "TLS 1.2 refused: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_are_served_without_a_failed_handshake() {
    let server = Arc::new(start(opted_in_cluster(), policy(), Duration::from_millis(50)).await);
    let first_leaf = request(
        server.addr,
        &server.ca_pem,
        "GET",
        "/healthz",
        Vec::new(),
        false,
    )
    .await
    .leaf;

    let failures = Arc::new(AtomicUsize::new(0));
    let handshakes = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..2 {
        let (server, failures, handshakes, stop) = (
            server.clone(),
            failures.clone(),
            handshakes.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                match tls_connect(server.addr, &server.ca_pem, &[b"http/1.1"]).await {
                    Ok(_) => handshakes.fetch_add(1, Ordering::AcqRel),
                    Err(_) => failures.fetch_add(1, Ordering::AcqRel),
                };
            }
        }));
    }
    // A rotation written in two steps: certificate first, key a little later. In between the
    // pair does not match and the old one must stay in service.
    let issued = server
        .ca
        .issue_serving(
            &["localhost"],
            &["127.0.0.1".parse().unwrap()],
            Duration::from_secs(3600),
        )
        .unwrap();
    std::fs::write(&server.cert_path, &issued.cert_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        server.resolver.current_leaf().unwrap().to_vec(),
        first_leaf,
        "half-written pair was loaded"
    );
    std::fs::write(&server.key_path, &issued.key_pem).unwrap();

    let mut rotated = false;
    for _ in 0..100 {
        let leaf = request(
            server.addr,
            &server.ca_pem,
            "GET",
            "/healthz",
            Vec::new(),
            false,
        )
        .await
        .leaf;
        if leaf != first_leaf {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Release);
    for client in clients {
        client.await.unwrap();
    }
    assert!(rotated, "the new certificate was never served");
    assert!(handshakes.load(Ordering::Acquire) > 10);
    assert_eq!(
        failures.load(Ordering::Acquire),
        0,
        "handshakes failed during rotation"
    );
}

/// `runpod_kubelet_certificate_expiry_timestamp_seconds` as scraped, if present.
async fn scraped_expiry(server: &TestServer) -> Option<u64> {
    let metrics = request(
        server.addr,
        &server.ca_pem,
        "GET",
        "/metrics",
        Vec::new(),
        false,
    )
    .await;
    String::from_utf8_lossy(&metrics.body)
        .lines()
        .find_map(|line| line.strip_prefix("runpod_kubelet_certificate_expiry_timestamp_seconds "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn metrics_report_the_served_certificate_expiry_and_follow_rotation() {
    let before = unix_now();
    let server = start(opted_in_cluster(), policy(), Duration::from_millis(50)).await;
    let after = unix_now();
    let expiry = scraped_expiry(&server).await.expect("no expiry metric");
    // The test certificate is valid for an hour from its issue.
    assert!(
        (before + 3600..=after + 3601).contains(&expiry),
        "{expiry} not an hour after {before}"
    );

    let rotated_at = unix_now();
    write_serving_cert_valid_for(
        &server.ca,
        &server.cert_path,
        &server.key_path,
        Duration::from_secs(7200),
    );
    let mut followed = false;
    for _ in 0..200 {
        if scraped_expiry(&server)
            .await
            .is_some_and(|expiry| expiry >= rotated_at + 7200)
        {
            followed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(followed, "the metric did not follow the rotation");
}
