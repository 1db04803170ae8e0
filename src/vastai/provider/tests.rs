//! The Vast.ai provider's pure readings: states, labels, usage, exit codes, followed logs,
//! prices and constraints.

use serde_json::json;

use super::logs::{lines_of, new_lines};
use super::*;
use crate::vastai::model::Offer;

fn vast(value: serde_json::Value) -> model::Instance {
    serde_json::from_value(value).unwrap()
}

#[test]
fn states_labels_and_places_read_as_the_controller_needs() {
    let running = vast(json!({
        "id": 42, "label": "rpk:c1:virtual-vastai:u-1", "actual_status": "running",
        "public_ipaddr": "203.0.113.7", "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40022"}]},
        "dph_total": 0.41, "gpu_name": "RTX 4090", "geolocation": "Poland, PL", "start_date": 1.7e9
    }));
    let instance = to_instance(&running);
    assert_eq!(instance.id, "42");
    assert_eq!(instance.state, InstanceState::Running);
    assert_eq!(instance.tags.pod_uid.as_deref(), Some("u-1"));
    assert_eq!(instance.tags.cluster_id.as_deref(), Some("c1"));
    assert_eq!(instance.datacenter.as_deref(), Some("PL"));
    assert_eq!(instance.cost_per_hour, Some(0.41));
    assert_eq!(
        instance.endpoints[0].address.as_deref(),
        Some("203.0.113.7:40022")
    );
    assert!(instance.ports_ready());
    let unlabelled = to_instance(&vast(json!({"id": 1, "label": "my notebook"})));
    assert_eq!(unlabelled.tags, Tags::default());
    assert_eq!(unlabelled.state, InstanceState::Provisioning);
    for (status, message, state) in [
        ("loading", "", InstanceState::Starting),
        (
            "exited",
            "Container exited with code 3",
            InstanceState::Exited,
        ),
        ("offline", "", InstanceState::Error),
        ("unknown", "", InstanceState::Error),
        ("stopped", "", InstanceState::Error),
        (
            "created",
            "OCI runtime create failed: x",
            InstanceState::Error,
        ),
        ("created", "", InstanceState::Starting),
        ("scheduling", "", InstanceState::Unknown),
    ] {
        let instance = vast(json!({"id": 2, "actual_status": status, "status_msg": message}));
        assert_eq!(state_of(&instance), state, "{status} {message}");
    }
    let destroyed = vast(json!({"id": 4, "actual_status": "exited", "cur_state": "unloaded"}));
    assert_eq!(state_of(&destroyed), InstanceState::Terminated);
    let offline = to_instance(&vast(json!({"id": 3, "actual_status": "offline"})));
    assert!(
        offline
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("never runs again"),
        "{offline:?}"
    );
}

#[test]
fn a_running_instances_report_becomes_shares() {
    let report = json!({"id": 5, "actual_status": "running", "num_gpus": 2,
        "cpu_util": 0.25, "gpu_util": 0.9, "mem_usage": 4000.0, "mem_limit": 16000.0});
    let usage = to_instance(&vast(report.clone())).usage.unwrap();
    assert_eq!(usage.cpu, Some(0.25));
    assert_eq!(usage.memory, Some(0.25));
    assert_eq!(usage.gpus.len(), 2);
    assert_eq!(usage.gpu_util(), Some(0.9));
    // Not running, or nothing reported: no report (never zeros).
    let mut exited = report;
    exited["actual_status"] = json!("exited");
    assert!(to_instance(&vast(exited)).usage.is_none());
    let silent = json!({"id": 6, "actual_status": "running", "gpu_util": null});
    assert!(to_instance(&vast(silent)).usage.is_none());
}

#[test]
fn exit_codes_come_from_the_status_message() {
    assert_eq!(
        exit_code_from_status("Container exited with code 3"),
        Some(3)
    );
    assert_eq!(
        exit_code_from_status("container EXITED WITH CODE 0."),
        Some(0)
    );
    assert_eq!(exit_code_from_status("Container exited"), None);
    assert_eq!(exit_code_from_status(""), None);
}

#[test]
fn a_followed_log_yields_each_line_once() {
    let lines = |text: &str| lines_of(text);
    let first = lines("a\nb\nc");
    assert_eq!(new_lines(&[], &first), &first[..]);
    let second = lines("b\nc\nd\ne");
    assert_eq!(new_lines(&first, &second), &lines("d\ne")[..]);
    let same = lines("b\nc\nd\ne");
    assert!(new_lines(&second, &same).is_empty());
    // Repeated lines: the longest overlap wins.
    let repeated = lines("x\nx");
    assert_eq!(new_lines(&repeated, &lines("x\nx\nx")), &lines("x")[..]);
    // No overlap: the log moved on by more than a tail.
    assert_eq!(new_lines(&first, &lines("q\nr")), &lines("q\nr")[..]);
}

#[test]
fn prices_are_per_gpu() {
    let offer = |num_gpus: u32, dph_total: f64| -> Offer {
        serde_json::from_value(json!({"id": 1, "gpu_name": "RTX 4090", "gpu_ram": 24564,
            "num_gpus": num_gpus, "dph_total": dph_total}))
        .unwrap()
    };
    let sheet = crate::vastai::prices::price_sheet(&[offer(2, 0.6), offer(1, 0.4)], 20, false);
    assert_eq!(
        sheet.prices.lowest_per_class("ANY"),
        [("ANY".to_owned(), 0.3)]
    );
    assert!(
        crate::vastai::prices::price_sheet(&[], 20, false)
            .prices
            .is_empty()
    );
}

#[test]
fn constraints_follow_the_policy_and_the_pod() {
    let policy =
        VastPolicy::from_flags(&["Europe".into()], &[], false, true, 0.98, Some(0.5)).unwrap();
    let client = VastClient::new(
        crate::vastai::client::VastConfig::default(),
        crate::vastai::client::VastKey::new("k".into()).unwrap(),
    )
    .unwrap();
    let provider = VastaiProvider::new(client, policy, "c1".into(), "virtual-vastai".into());
    let constraints = provider.constraints(&annotated(&[])).unwrap();
    assert!(constraints.allowed_datacenters.contains(&"PL".to_owned()));
    assert!(!constraints.allowed_datacenters.contains(&"US".to_owned()));
    assert_eq!(constraints.max_price_per_hour, Some(1.0), "0.5 per GPU x 2");
    assert!(
        provider
            .constraints(&annotated(&[("vast.ai/region", "Asia")]))
            .is_err()
    );
}

/// Per-pod annotations map, for tests of [`VastaiProvider::constraints`].
fn annotated(pairs: &[(&str, &str)]) -> Pod {
    let annotations: std::collections::BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": "u-1", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "img",
                 "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
    }))
    .unwrap_or_default()
}

#[test]
fn only_what_vastai_took_away_is_a_disruption() {
    let read = |value: serde_json::Value| disruption_of(&vast(value));
    assert_eq!(
        read(
            json!({"id": 1, "actual_status": "stopped", "intended_status": "running", "is_bid": true})
        ),
        Some(Disruption::Outbid)
    );
    assert_eq!(
        read(
            json!({"id": 1, "actual_status": "stopped", "intended_status": "running", "is_bid": false})
        ),
        Some(Disruption::Lost),
        "an on-demand instance stopped by Vast.ai (credit, contract end)"
    );
    for status in ["offline", "unknown", "frozen"] {
        assert_eq!(
            read(json!({"id": 1, "actual_status": status})),
            Some(Disruption::Lost),
            "{status}"
        );
    }
    for status in ["running", "loading", "exited", "created"] {
        assert_eq!(
            read(json!({"id": 1, "actual_status": status})),
            None,
            "{status}"
        );
    }
    assert_eq!(
        read(
            json!({"id": 1, "actual_status": "created", "status_msg": "OCI runtime create failed"})
        ),
        None,
        "a broken image is the pod's own failure"
    );
    assert_eq!(
        read(json!({"id": 1, "actual_status": "stopped", "cur_state": "unloaded", "is_bid": true})),
        None,
        "destroyed"
    );
    let outbid = to_instance(&vast(json!({
        "id": 9, "machine_id": 4711, "actual_status": "stopped", "intended_status": "running",
        "is_bid": true, "dph_total": 0.21
    })));
    assert_eq!(outbid.disruption, Some(Disruption::Outbid));
    assert_eq!(outbid.machine.as_deref(), Some("4711"));
    assert!(
        outbid
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("outbid"),
        "{:?}",
        outbid.message
    );
}
