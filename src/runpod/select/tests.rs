use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::runpod::catalogue::{CloudCounts, CloudPrices, DataCenterStock};

// ---------------------------------------------------------------------------------------------
// Builders

fn gpu(id: &str, memory: Option<u32>, secure_price: f64) -> GpuType {
    GpuType {
        id: id.to_owned(),
        name: None,
        memory,
        secure: true,
        community: false,
        price: CloudPrices {
            secure: Some(secure_price),
            community: None,
        },
        max_count: CloudCounts::default(),
        availability: Some(Availability::High),
        data_centers: Vec::new(),
    }
}

fn with_dcs(mut gpu: GpuType, dcs: &[(&str, Availability)]) -> GpuType {
    gpu.data_centers = dcs
        .iter()
        .map(|(id, availability)| DataCenterStock {
            id: (*id).to_owned(),
            name: None,
            availability: *availability,
        })
        .collect();
    gpu
}

fn secure(gpus: Vec<GpuType>) -> Catalogue {
    Catalogue {
        secure: gpus,
        ..Catalogue::default()
    }
}

fn req() -> Requirements {
    Requirements {
        gpu_count: 1,
        min_memory_gb: None,
        gpu_types: Vec::new(),
        cloud: CloudType::Secure,
        max_price_per_hour: None,
        allowed_data_centers: Vec::new(),
    }
}

fn limits() -> ClusterLimits {
    ClusterLimits {
        max_gpu_price: 10.0,
        data_center_ids: Vec::new(),
        cloud_types: Vec::new(),
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn ids(candidates: &[Candidate]) -> Vec<&str> {
    candidates.iter().map(|c| c.gpu_id.as_str()).collect()
}

fn place(catalogue: &Catalogue, requirements: &Requirements) -> Vec<Candidate> {
    candidates(catalogue, requirements, &limits())
}

fn pod_with(annotations: &[(&str, &str)], spec: Value) -> Pod {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "train", "namespace": "ml", "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

fn one_container(resources: Value) -> Value {
    json!({"containers": [{"name": "main", "image": "pytorch", "resources": resources}]})
}

fn gpu_pod(annotations: &[(&str, &str)]) -> Pod {
    pod_with(
        annotations,
        one_container(json!({"limits": {"nvidia.com/gpu": "1"}})),
    )
}

// ---------------------------------------------------------------------------------------------
// requirements()

#[test]
fn defaults_are_one_gpu_secure_and_no_restrictions() {
    let got = requirements(&gpu_pod(&[]), &limits()).unwrap();
    assert_eq!(got, req());
}

#[test]
fn annotations_are_parsed_with_the_contract_parsers() {
    let pod = gpu_pod(&[
        (contract::REQUIRED_GPU_MEMORY, " 24 "),
        (
            contract::GPU_TYPES,
            "NVIDIA  RTX A4500 , NVIDIA L4,NVIDIA  RTX A4500",
        ),
        (contract::MAX_PRICE, "1.5"),
        (contract::CLOUD_TYPE, "community"),
        (contract::DATACENTER_IDS, "EU-RO-1, US-KS-2"),
    ]);
    let got = requirements(&pod, &limits()).unwrap();
    assert_eq!(got.min_memory_gb, Some(24));
    // Double space kept verbatim (P10), ends trimmed, repeats dropped, order kept.
    assert_eq!(got.gpu_types, strings(&["NVIDIA  RTX A4500", "NVIDIA L4"]));
    assert_eq!(got.max_price_per_hour, Some(1.5));
    assert_eq!(got.cloud, CloudType::Community);
    assert_eq!(got.allowed_data_centers, strings(&["EU-RO-1", "US-KS-2"]));
}

#[test]
fn invalid_annotations_name_the_annotation_the_value_and_what_is_accepted() {
    let cases = [
        (contract::REQUIRED_GPU_MEMORY, "24GB", "whole number of GB"),
        (contract::REQUIRED_GPU_MEMORY, "0", "between 1 and 1024"),
        (contract::GPU_TYPES, "NVIDIA L4,,NVIDIA A40", "item 2"),
        (contract::GPU_TYPES, "", "is empty"),
        (
            contract::MAX_PRICE,
            "cheap",
            "positive number of USD per hour",
        ),
        (contract::MAX_PRICE, "-1", "positive number"),
        (contract::CLOUD_TYPE, "STANDARD", "SECURE or COMMUNITY"),
        (contract::DATACENTER_IDS, "EU-RO-1,", "item 2"),
    ];
    for (key, value, expected) in cases {
        let err = requirements(&gpu_pod(&[(key, value)]), &limits()).unwrap_err();
        assert!(
            matches!(&err, RequirementError::InvalidAnnotation { annotation, .. } if *annotation == key)
        );
        let message = err.to_string();
        assert!(message.contains(key), "{message}");
        assert!(message.contains(&format!("{value:?}")), "{message}");
        assert!(message.contains(expected), "{message}");
        assert!(
            message.contains("e.g.") || message.contains("use "),
            "{message}"
        );
    }
}

#[test]
fn datacenters_are_the_pod_list_narrowed_to_the_cluster_list() {
    let cluster = ClusterLimits {
        max_gpu_price: 10.0,
        data_center_ids: strings(&["US-KS-2", "EU-RO-1", "CA-MTL-1"]),
        cloud_types: Vec::new(),
    };
    // Both: intersection, in the pod's (preference) order.
    let pod = gpu_pod(&[(contract::DATACENTER_IDS, "EU-SE-1,EU-RO-1,US-KS-2")]);
    assert_eq!(
        requirements(&pod, &cluster).unwrap().allowed_data_centers,
        strings(&["EU-RO-1", "US-KS-2"])
    );
    // Pod sets none: the cluster's list.
    assert_eq!(
        requirements(&gpu_pod(&[]), &cluster)
            .unwrap()
            .allowed_data_centers,
        strings(&["US-KS-2", "EU-RO-1", "CA-MTL-1"])
    );
    // Cluster sets none: the pod's list.
    assert_eq!(
        requirements(&pod, &limits()).unwrap().allowed_data_centers,
        strings(&["EU-SE-1", "EU-RO-1", "US-KS-2"])
    );
    // Blank cluster ids restrict nothing.
    let blank = ClusterLimits {
        max_gpu_price: 10.0,
        data_center_ids: strings(&[""]),
        cloud_types: Vec::new(),
    };
    assert!(
        requirements(&gpu_pod(&[]), &blank)
            .unwrap()
            .allowed_data_centers
            .is_empty()
    );
}

#[test]
fn a_tier_the_installation_does_not_allow_buys_nothing_and_the_default_follows_the_list() {
    let secure_only = ClusterLimits {
        cloud_types: vec![CloudType::Secure],
        ..limits()
    };
    // Edited onto the pod after admission, or the list narrowed since: refused, not bought.
    let pod = gpu_pod(&[(contract::CLOUD_TYPE, "COMMUNITY")]);
    let err = requirements(&pod, &secure_only).unwrap_err();
    assert_eq!(
        err,
        RequirementError::CloudTypeNotAllowed {
            value: "COMMUNITY".to_owned(),
            allowed: vec![CloudType::Secure],
        }
    );
    assert!(err.to_string().contains("allowed: SECURE"), "{err}");
    assert_eq!(
        requirements(&gpu_pod(&[]), &secure_only).unwrap().cloud,
        CloudType::Secure
    );
    // An installation that allows only COMMUNITY: a pod naming no tier goes there.
    let community_only = ClusterLimits {
        cloud_types: vec![CloudType::Community],
        ..limits()
    };
    assert_eq!(
        requirements(&gpu_pod(&[]), &community_only).unwrap().cloud,
        CloudType::Community
    );
    assert!(
        requirements(&pod, &limits()).is_ok(),
        "an empty list allows any"
    );
}

#[test]
fn a_pod_list_disjoint_from_the_cluster_list_is_an_error() {
    let cluster = ClusterLimits {
        max_gpu_price: 10.0,
        data_center_ids: strings(&["US-KS-2", "EU-RO-1"]),
        cloud_types: Vec::new(),
    };
    let pod = gpu_pod(&[(contract::DATACENTER_IDS, "EU-SE-1, CA-MTL-1")]);
    let err = requirements(&pod, &cluster).unwrap_err();
    assert_eq!(
        err,
        RequirementError::NoAllowedDataCenter {
            value: "EU-SE-1, CA-MTL-1".to_owned(),
            requested: strings(&["EU-SE-1", "CA-MTL-1"]),
            allowed: strings(&["US-KS-2", "EU-RO-1"]),
        }
    );
    let message = err.to_string();
    for needle in [
        contract::DATACENTER_IDS,
        "EU-SE-1, CA-MTL-1",
        "allowed datacenters: US-KS-2, EU-RO-1",
        "remove the annotation",
    ] {
        assert!(message.contains(needle), "{message}");
    }
}

#[test]
fn gpu_count_comes_from_limits_or_requests_with_the_init_container_rule() {
    let count = |spec: Value| {
        requirements(&pod_with(&[], spec), &limits())
            .unwrap()
            .gpu_count
    };
    assert_eq!(
        count(one_container(json!({"limits": {"nvidia.com/gpu": "4"}}))),
        4
    );
    assert_eq!(
        count(one_container(json!({"requests": {"nvidia.com/gpu": "2"}}))),
        2
    );
    // A limit wins over a request.
    assert_eq!(
        count(one_container(json!({
            "limits": {"nvidia.com/gpu": "3"},
            "requests": {"nvidia.com/gpu": "1"}
        }))),
        3
    );
    // Sum over containers; the larger of that and each init container.
    let spec = json!({
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
        ],
        "initContainers": [
            {"name": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
        ],
    });
    assert_eq!(count(spec), 3);
    let spec = json!({
        "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "5"}}}],
    });
    assert_eq!(count(spec), 5);
    // A pod we place gets at least one GPU.
    assert_eq!(count(one_container(json!({}))), 1);
    assert_eq!(
        count(one_container(json!({"limits": {"nvidia.com/gpu": "0"}}))),
        1
    );
    let no_spec: Pod = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
    assert_eq!(requirements(&no_spec, &limits()).unwrap().gpu_count, 1);
}

// ---------------------------------------------------------------------------------------------
// candidates(): one test per rule

#[test]
fn unknown_and_blank_ids_are_never_candidates() {
    let catalogue = secure(vec![
        gpu("unknown", Some(24), 0.1),
        gpu("UNKNOWN", Some(24), 0.1),
        gpu("", Some(24), 0.1),
        gpu("  ", Some(24), 0.1),
        gpu("NVIDIA L4", Some(24), 0.4),
    ]);
    assert_eq!(ids(&place(&catalogue, &req())), ["NVIDIA L4"]);
}

#[test]
fn only_types_offered_and_priced_on_the_requested_cloud() {
    let mut community_only = gpu("NVIDIA A40", Some(48), 0.2);
    community_only.secure = false;
    community_only.community = true;
    community_only.price.community = Some(0.35);
    let mut unpriced = gpu("NVIDIA L4", Some(24), 0.0);
    unpriced.price.secure = None;
    let zero = gpu("NVIDIA A30", Some(24), 0.0);
    let negative = gpu("NVIDIA A5000", Some(24), -0.5);
    let infinite = gpu("NVIDIA H200", Some(141), f64::INFINITY);
    let fine = gpu("NVIDIA GeForce RTX 4090", Some(24), 0.44);
    let gpus = vec![community_only, unpriced, zero, negative, infinite, fine];
    let catalogue = Catalogue {
        secure: gpus.clone(),
        community: gpus,
        ..Catalogue::default()
    };
    assert_eq!(
        ids(&candidates(
            &catalogue,
            &req(),
            &ClusterLimits {
                max_gpu_price: f64::INFINITY,
                data_center_ids: Vec::new(),
                cloud_types: Vec::new(),
            }
        )),
        ["NVIDIA GeForce RTX 4090"]
    );
    let community = Requirements {
        cloud: CloudType::Community,
        ..req()
    };
    let got = place(&catalogue, &community);
    assert_eq!(ids(&got), ["NVIDIA A40"]);
    assert_eq!(got[0].price_per_gpu, 0.35);
    assert_eq!(got[0].cloud, CloudType::Community);
}

#[test]
fn the_community_list_is_read_for_community_pods() {
    // Stock differs per cloud: the secure list's entry must not be consulted.
    let mut secure_entry = gpu("NVIDIA A40", Some(48), 0.4);
    secure_entry.community = true;
    secure_entry.price.community = Some(0.3);
    let mut community_entry = secure_entry.clone();
    community_entry.availability = Some(Availability::None);
    let catalogue = Catalogue {
        secure: vec![secure_entry],
        community: vec![community_entry],
        ..Catalogue::default()
    };
    let community = Requirements {
        cloud: CloudType::Community,
        ..req()
    };
    assert!(place(&catalogue, &community).is_empty());
    assert_eq!(place(&catalogue, &req()).len(), 1);
}

#[test]
fn price_caps_apply_to_the_whole_pod_and_per_gpu() {
    let catalogue = secure(vec![
        gpu("cheap", Some(24), 0.3),
        gpu("mid", Some(24), 0.5),
        gpu("dear", Some(24), 2.0),
    ]);
    let two = Requirements {
        gpu_count: 2,
        ..req()
    };
    // Pod cap is for the whole pod: 2 × 0.5 = 1.0 fits 1.0, 2 × 2.0 does not.
    let capped = Requirements {
        max_price_per_hour: Some(1.0),
        ..two.clone()
    };
    let got = place(&catalogue, &capped);
    assert_eq!(ids(&got), ["cheap", "mid"]);
    assert_eq!(got[1].price_per_hour, 1.0);
    assert_eq!(got[1].price_per_gpu, 0.5);
    // Cluster cap is per GPU.
    let cluster = ClusterLimits {
        max_gpu_price: 0.4,
        data_center_ids: Vec::new(),
        cloud_types: Vec::new(),
    };
    assert_eq!(ids(&candidates(&catalogue, &two, &cluster)), ["cheap"]);
    // The smaller of the two wins.
    let tight = Requirements {
        max_price_per_hour: Some(0.5),
        ..two.clone()
    };
    assert!(candidates(&catalogue, &tight, &cluster).is_empty());
    // Float rounding at the boundary: 3 × 0.1 fits 0.3.
    let catalogue = secure(vec![gpu("tenth", Some(24), 0.1)]);
    let three = Requirements {
        gpu_count: 3,
        max_price_per_hour: Some(0.3),
        ..req()
    };
    assert_eq!(ids(&place(&catalogue, &three)), ["tenth"]);
    let cluster = ClusterLimits {
        max_gpu_price: 0.1,
        data_center_ids: Vec::new(),
        cloud_types: Vec::new(),
    };
    assert_eq!(ids(&candidates(&catalogue, &three, &cluster)), ["tenth"]);
}

#[test]
fn a_nan_cap_places_nothing() {
    let catalogue = secure(vec![gpu("NVIDIA L4", Some(24), 0.4)]);
    let broken = ClusterLimits {
        max_gpu_price: f64::NAN,
        data_center_ids: Vec::new(),
        cloud_types: Vec::new(),
    };
    let with_pod_cap = Requirements {
        max_price_per_hour: Some(5.0),
        ..req()
    };
    assert!(candidates(&catalogue, &with_pod_cap, &broken).is_empty());
    assert!(candidates(&catalogue, &req(), &broken).is_empty());
}

#[test]
fn memory_must_be_known_and_large_enough_when_required() {
    let catalogue = secure(vec![
        gpu("small", Some(16), 0.2),
        gpu("exact", Some(24), 0.3),
        gpu("big", Some(80), 2.0),
        gpu("mystery", None, 0.1),
    ]);
    let need = Requirements {
        min_memory_gb: Some(24),
        ..req()
    };
    assert_eq!(ids(&place(&catalogue, &need)), ["exact", "big"]);
    // Without a requirement unknown memory is fine.
    assert_eq!(
        ids(&place(&catalogue, &req())),
        ["mystery", "small", "exact", "big"]
    );
}

#[test]
fn the_per_pod_ceiling_excludes_only_when_known() {
    let mut four = gpu("four", Some(24), 0.3);
    four.max_count.secure = Some(4);
    four.max_count.community = Some(8);
    let open = gpu("open", Some(24), 0.4);
    let catalogue = secure(vec![four, open]);
    let eight = Requirements {
        gpu_count: 8,
        ..req()
    };
    assert_eq!(ids(&place(&catalogue, &eight)), ["open"]);
    let got = place(
        &catalogue,
        &Requirements {
            gpu_count: 4,
            ..req()
        },
    );
    assert_eq!(ids(&got), ["four", "open"]);
    assert!(got.iter().all(|c| c.gpu_count == 4));
}

#[test]
fn gpu_types_match_any_spelling_of_a_model_and_set_the_order() {
    let catalogue = secure(vec![
        gpu("NVIDIA RTX A4500", Some(20), 0.2),
        gpu("NVIDIA  RTX A4500", Some(20), 0.25),
        gpu("NVIDIA L4", Some(24), 0.4),
        gpu("NVIDIA A40", Some(48), 0.1),
    ]);
    let wanted = Requirements {
        gpu_types: strings(&["L4", "NVIDIA  RTX A4500", "nvidia a40"]),
        ..req()
    };
    // Preference order beats price; RunPod's two spellings of the A4500 are one model, and case
    // and spaces are ignored (one vocabulary for both clouds).
    assert_eq!(
        ids(&place(&catalogue, &wanted)),
        [
            "NVIDIA L4",
            "NVIDIA RTX A4500",
            "NVIDIA  RTX A4500",
            "NVIDIA A40"
        ]
    );
    let vast_spelling = Requirements {
        gpu_types: strings(&["RTX A4500"]),
        ..req()
    };
    assert_eq!(
        ids(&place(&catalogue, &vast_spelling)),
        ["NVIDIA RTX A4500", "NVIDIA  RTX A4500"]
    );
}

#[test]
fn types_with_no_stock_are_skipped_and_missing_stock_is_not_none() {
    let mut none = gpu("none", Some(24), 0.1);
    none.availability = Some(Availability::None);
    let mut unknown = gpu("unreported", Some(24), 0.2);
    unknown.availability = None;
    let mut odd = gpu("odd", Some(24), 0.3);
    odd.availability = Some(Availability::Unknown);
    let catalogue = secure(vec![none, unknown, odd]);
    assert_eq!(ids(&place(&catalogue, &req())), ["unreported", "odd"]);
}

#[test]
fn restricted_data_centres_keep_allowed_ones_with_stock_best_first() {
    use Availability::{High, Low, Medium, None as Out};
    let stocked = with_dcs(
        gpu("stocked", Some(24), 0.4),
        &[
            ("EU-RO-1", Low),
            ("US-KS-2", High),
            ("CA-MTL-1", Out),
            ("EU-SE-1", Medium),
        ],
    );
    let sold_out_here = with_dcs(
        gpu("elsewhere", Some(24), 0.2),
        &[("EU-RO-1", Out), ("US-TX-3", High)],
    );
    let no_detail = gpu("no-detail", Some(24), 0.3);
    let catalogue = secure(vec![stocked, sold_out_here, no_detail]);
    let restricted = Requirements {
        allowed_data_centers: strings(&["CA-MTL-1", "EU-RO-1", "US-TX-9", "US-KS-2"]),
        ..req()
    };
    let got = place(&catalogue, &restricted);
    assert_eq!(ids(&got), ["no-detail", "stocked"]);
    // Without per-DC stock: every allowed id, in the allowed order.
    assert_eq!(
        got[0].data_center_ids,
        strings(&["CA-MTL-1", "EU-RO-1", "US-TX-9", "US-KS-2"])
    );
    // With it: NONE and unlisted ids dropped (EU-SE-1 is not allowed), best stock first.
    assert_eq!(got[1].data_center_ids, strings(&["US-KS-2", "EU-RO-1"]));
}

#[test]
fn equal_stock_keeps_the_allowed_order() {
    use Availability::Medium;
    let catalogue = secure(vec![with_dcs(
        gpu("g", Some(24), 0.4),
        &[("A", Medium), ("B", Medium), ("C", Medium)],
    )]);
    let restricted = Requirements {
        allowed_data_centers: strings(&["C", "A", "B"]),
        ..req()
    };
    assert_eq!(
        place(&catalogue, &restricted)[0].data_center_ids,
        strings(&["C", "A", "B"])
    );
    // Unrestricted: by id.
    assert_eq!(
        place(&catalogue, &req())[0].data_center_ids,
        strings(&["A", "B", "C"])
    );
}

#[test]
fn unrestricted_data_centres_come_from_the_stock_list_or_are_left_to_runpod() {
    use Availability::{High, Low, None as Out, Unknown};
    let listed = with_dcs(
        gpu("listed", Some(24), 0.4),
        &[
            ("EU-RO-1", Low),
            ("US-KS-2", Out),
            ("CA-MTL-1", High),
            ("AP-JP-1", Unknown),
            ("EU-RO-1", High), // listed twice: best stock counts
        ],
    );
    let all_out = with_dcs(
        gpu("all-out", Some(24), 0.1),
        &[("EU-RO-1", Out), ("US-KS-2", Out)],
    );
    let silent = gpu("silent", Some(24), 0.5);
    let catalogue = secure(vec![listed, all_out, silent]);
    let got = place(&catalogue, &req());
    assert_eq!(ids(&got), ["listed", "silent"]);
    assert_eq!(
        got[0].data_center_ids,
        strings(&["CA-MTL-1", "EU-RO-1", "AP-JP-1"])
    );
    assert!(got[1].data_center_ids.is_empty());
}

#[test]
fn the_cluster_data_centre_list_applies_even_to_hand_built_requirements() {
    let catalogue = secure(vec![with_dcs(
        gpu("g", Some(24), 0.4),
        &[
            ("EU-RO-1", Availability::High),
            ("US-KS-2", Availability::Low),
        ],
    )]);
    let cluster = ClusterLimits {
        max_gpu_price: 10.0,
        data_center_ids: strings(&["US-KS-2"]),
        cloud_types: Vec::new(),
    };
    let got = candidates(&catalogue, &req(), &cluster);
    assert_eq!(got[0].data_center_ids, strings(&["US-KS-2"]));
    let outside = Requirements {
        allowed_data_centers: strings(&["EU-RO-1"]),
        ..req()
    };
    assert!(candidates(&catalogue, &outside, &cluster).is_empty());
}

#[test]
fn cheapest_first_with_deterministic_tie_breaks() {
    use Availability::{High, Low};
    let mut low_stock = gpu("b-low-stock", Some(24), 0.4);
    low_stock.availability = Some(Low);
    let high_stock = gpu("c-high-stock", Some(24), 0.4);
    let big = gpu("a-big", Some(48), 0.4);
    let no_memory = gpu("0-no-memory", None, 0.4);
    let twin_a = gpu("d-twin", Some(24), 0.4);
    let twin_b = gpu("c-twin", Some(24), 0.4);
    let cheap = with_dcs(gpu("z-cheap", Some(80), 0.2), &[("X", High)]);
    let catalogue = secure(vec![
        low_stock, high_stock, big, no_memory, twin_a, twin_b, cheap,
    ]);
    assert_eq!(
        ids(&place(&catalogue, &req())),
        [
            "z-cheap",
            // 0.4 and High stock: smaller memory first, then id, unknown memory last.
            "c-high-stock",
            "c-twin",
            "d-twin",
            "a-big",
            "0-no-memory",
            // Low stock after every High one.
            "b-low-stock",
        ]
    );
}

#[test]
fn stock_tie_break_uses_the_stock_of_the_allowed_data_centres() {
    use Availability::{High, Low};
    let a = with_dcs(gpu("a", Some(24), 0.4), &[("EU", Low), ("US", High)]);
    let b = with_dcs(gpu("b", Some(24), 0.4), &[("EU", High), ("US", Low)]);
    let catalogue = secure(vec![a, b]);
    let eu = Requirements {
        allowed_data_centers: strings(&["EU"]),
        ..req()
    };
    assert_eq!(ids(&place(&catalogue, &eu)), ["b", "a"]);
    let us = Requirements {
        allowed_data_centers: strings(&["US"]),
        ..req()
    };
    assert_eq!(ids(&place(&catalogue, &us)), ["a", "b"]);
}

#[test]
fn a_type_listed_twice_is_one_candidate_its_best_record() {
    let mut dear = gpu("NVIDIA L4", Some(24), 0.5);
    dear.max_count.secure = Some(8);
    let cheap = gpu("NVIDIA L4", Some(24), 0.4);
    let catalogue = secure(vec![dear, cheap]);
    let got = place(&catalogue, &req());
    assert_eq!(ids(&got), ["NVIDIA L4"]);
    assert_eq!(got[0].price_per_gpu, 0.4);
    // Repeated preferences do not repeat candidates either.
    let twice = Requirements {
        gpu_types: strings(&["NVIDIA L4", "NVIDIA L4"]),
        ..req()
    };
    assert_eq!(place(&catalogue, &twice).len(), 1);
}

#[test]
fn zero_gpus_places_nothing() {
    let catalogue = secure(vec![gpu("NVIDIA L4", Some(24), 0.4)]);
    let zero = Requirements {
        gpu_count: 0,
        ..req()
    };
    assert!(place(&catalogue, &zero).is_empty());
    assert_eq!(cheapest_price(&catalogue, CloudType::Secure, 0), None);
}

#[test]
fn cheapest_price_ignores_caps_but_not_availability() {
    let mut sold_out = gpu("sold-out", Some(24), 0.1);
    sold_out.availability = Some(Availability::None);
    let mut small_ceiling = gpu("one-only", Some(24), 0.15);
    small_ceiling.max_count.secure = Some(1);
    let dcs_out = with_dcs(
        gpu("dcs-out", Some(24), 0.12),
        &[("EU-RO-1", Availability::None)],
    );
    let catalogue = secure(vec![
        gpu("unknown", Some(24), 0.01),
        sold_out,
        small_ceiling,
        dcs_out,
        gpu("NVIDIA L4", Some(24), 0.4),
        gpu("NVIDIA H100", Some(80), 3.0),
    ]);
    assert_eq!(cheapest_price(&catalogue, CloudType::Secure, 1), Some(0.15));
    assert_eq!(cheapest_price(&catalogue, CloudType::Secure, 2), Some(0.8));
    assert_eq!(cheapest_price(&catalogue, CloudType::Community, 1), None);
    assert_eq!(
        cheapest_price(&Catalogue::default(), CloudType::Secure, 1),
        None
    );
}

#[test]
fn end_to_end_from_pod_annotations() {
    let pod = pod_with(
        &[
            (contract::REQUIRED_GPU_MEMORY, "24"),
            (contract::MAX_PRICE, "1"),
            (contract::DATACENTER_IDS, "EU-RO-1,US-KS-2"),
        ],
        one_container(json!({"limits": {"nvidia.com/gpu": "2"}})),
    );
    let cluster = ClusterLimits {
        max_gpu_price: 0.45,
        data_center_ids: strings(&["EU-RO-1"]),
        cloud_types: Vec::new(),
    };
    let requirements = requirements(&pod, &cluster).unwrap();
    let catalogue = secure(vec![
        with_dcs(
            gpu("NVIDIA GeForce RTX 4090", Some(24), 0.44),
            &[
                ("EU-RO-1", Availability::Low),
                ("US-KS-2", Availability::High),
            ],
        ),
        gpu("NVIDIA RTX A4000", Some(16), 0.2),
        gpu("NVIDIA A40", Some(48), 0.5),
    ]);
    let got = candidates(&catalogue, &requirements, &cluster);
    assert_eq!(
        got,
        [Candidate {
            gpu_id: "NVIDIA GeForce RTX 4090".to_owned(),
            gpu_count: 2,
            cloud: CloudType::Secure,
            data_center_ids: strings(&["EU-RO-1"]),
            price_per_gpu: 0.44,
            price_per_hour: 0.88,
            memory_gb: Some(24),
        }]
    );
}

// ---------------------------------------------------------------------------------------------
// Properties over random catalogues and requirements

/// Usable ids first (one with a double space, P10), then ids that must never be placed.
const ID_POOL: [&str; 9] = [
    "NVIDIA GeForce RTX 4090",
    "NVIDIA  RTX A4500",
    "NVIDIA RTX A4500",
    "NVIDIA L4",
    "NVIDIA A40",
    "NVIDIA H100 80GB HBM3",
    "unknown",
    "Unknown",
    "",
];
const DC_POOL: [&str; 4] = ["EU-RO-1", "US-KS-2", "CA-MTL-1", "EU-SE-1"];
const MEMORY_POOL: [u32; 6] = [8, 16, 20, 24, 48, 80];

/// Mostly ids that can be placed; `unknown` and blank ones now and then.
fn gpu_id() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        6 => prop::sample::select(ID_POOL[..6].to_vec()),
        1 => prop::sample::select(ID_POOL[6..].to_vec()),
    ]
}

fn availability() -> impl Strategy<Value = Availability> {
    prop::sample::select(vec![
        Availability::None,
        Availability::Low,
        Availability::Medium,
        Availability::High,
        Availability::Unknown,
    ])
}

fn cents(max: u32) -> impl Strategy<Value = f64> {
    // Small set of repeated prices so that ties happen, plus arbitrary cents.
    prop_oneof![
        prop::sample::select(vec![0.1, 0.2, 0.3, 0.44, 0.5, 1.0]),
        (1..=max).prop_map(|c| f64::from(c) / 100.0),
    ]
}

fn catalogue_price() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(0.0)),
        1 => Just(Some(-0.5)),
        20 => cents(300).prop_map(Some),
    ]
}

fn gpu_type() -> impl Strategy<Value = GpuType> {
    (
        (
            gpu_id(),
            prop::option::of(prop::sample::select(MEMORY_POOL.to_vec())),
            prop::bool::weighted(0.9),
            prop::bool::weighted(0.9),
        ),
        (catalogue_price(), catalogue_price()),
        (prop::option::of(0u32..=8), prop::option::of(0u32..=8)),
        prop::option::of(availability()),
        prop::collection::vec(
            (prop::sample::select(DC_POOL.to_vec()), availability()),
            0..5,
        ),
    )
        .prop_map(
            |((id, memory, secure, community), (ps, pc), (ms, mc), availability, dcs)| GpuType {
                id: id.to_owned(),
                name: None,
                memory,
                secure,
                community,
                price: CloudPrices {
                    secure: ps,
                    community: pc,
                },
                max_count: CloudCounts {
                    secure: ms,
                    community: mc,
                },
                availability,
                data_centers: dcs
                    .into_iter()
                    .map(|(id, availability)| DataCenterStock {
                        id: id.to_owned(),
                        name: None,
                        availability,
                    })
                    .collect(),
            },
        )
}

fn catalogue() -> impl Strategy<Value = Catalogue> {
    (
        prop::collection::vec(gpu_type(), 0..12),
        prop::collection::vec(gpu_type(), 0..12),
    )
        .prop_map(|(secure, community)| Catalogue {
            secure,
            community,
            ..Catalogue::default()
        })
}

fn cloud() -> impl Strategy<Value = CloudType> {
    prop::sample::select(vec![CloudType::Secure, CloudType::Community])
}

fn id_list(pool: &'static [&'static str], max: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(prop::sample::select(pool.to_vec()), 0..=max)
        .prop_map(|items| items.into_iter().map(str::to_owned).collect())
}

fn requirements_strategy() -> impl Strategy<Value = Requirements> {
    (
        // Mostly small counts, so that price caps and ceilings leave several candidates.
        prop_oneof![4 => 1u32..=2, 1 => 1u32..=8],
        prop_oneof![
            3 => Just(None),
            1 => prop::sample::select(vec![8u32, 12, 24, 48, 80]).prop_map(Some),
        ],
        prop::collection::vec(gpu_id().prop_map(str::to_owned), 0..=5),
        cloud(),
        prop_oneof![1 => Just(None), 1 => cents(2000).prop_map(Some)],
        prop_oneof![1 => Just(Vec::new()), 1 => id_list(&DC_POOL, 3)],
    )
        .prop_map(
            |(gpu_count, min_memory_gb, gpu_types, cloud, max_price, dcs)| Requirements {
                gpu_count,
                min_memory_gb,
                gpu_types,
                cloud,
                max_price_per_hour: max_price,
                allowed_data_centers: dcs,
            },
        )
}

fn limits_strategy() -> impl Strategy<Value = ClusterLimits> {
    (
        prop_oneof![1 => cents(500), 1 => Just(f64::INFINITY)],
        prop_oneof![1 => Just(Vec::new()), 1 => id_list(&DC_POOL, 4)],
    )
        .prop_map(|(max_gpu_price, data_center_ids)| ClusterLimits {
            max_gpu_price,
            data_center_ids,
            cloud_types: Vec::new(),
        })
}

// The oracle: each rule written out plainly, from the catalogue entry alone.

/// `Some(list)` of allowed data centres (empty = any); `None` when the pod asks only for
/// data centres the cluster does not allow.
fn oracle_allowed(r: &Requirements, l: &ClusterLimits) -> Option<Vec<String>> {
    if r.allowed_data_centers.is_empty() {
        return Some(l.data_center_ids.clone());
    }
    let kept: Vec<String> = r
        .allowed_data_centers
        .iter()
        .filter(|dc| l.data_center_ids.is_empty() || l.data_center_ids.contains(dc))
        .cloned()
        .collect();
    if kept.is_empty() { None } else { Some(kept) }
}

fn oracle_price(g: &GpuType, cloud: CloudType) -> Option<f64> {
    let price = match cloud {
        CloudType::Secure => g.price.secure,
        CloudType::Community => g.price.community,
    };
    price.filter(|p| *p > 0.0)
}

/// Whether the data centre can be sent for this entry.
fn oracle_dc_usable(g: &GpuType, dc: &str) -> bool {
    g.data_centers.is_empty()
        || g.data_centers
            .iter()
            .any(|s| s.id == dc && s.availability != Availability::None)
}

/// Every constraint but the data-centre ones, each named, for error messages.
fn oracle_violations(g: &GpuType, r: &Requirements, l: &ClusterLimits) -> Vec<&'static str> {
    let mut broken = Vec::new();
    let n = f64::from(r.gpu_count);
    if g.id.is_empty() || g.id.to_lowercase() == "unknown" {
        broken.push("id");
    }
    let offered = match r.cloud {
        CloudType::Secure => g.secure,
        CloudType::Community => g.community,
    };
    if !offered {
        broken.push("offered");
    }
    match oracle_price(g, r.cloud) {
        None => broken.push("priced"),
        Some(price) => {
            if price * n > l.max_gpu_price * n + PRICE_SLACK {
                broken.push("cluster price cap");
            }
            if let Some(max) = r.max_price_per_hour
                && price * n > max + PRICE_SLACK
            {
                broken.push("pod price cap");
            }
        }
    }
    if let Some(min) = r.min_memory_gb {
        match g.memory {
            Some(m) if m >= min => {}
            _ => broken.push("memory"),
        }
    }
    let ceiling = match r.cloud {
        CloudType::Secure => g.max_count.secure,
        CloudType::Community => g.max_count.community,
    };
    if let Some(ceiling) = ceiling
        && r.gpu_count > ceiling
    {
        broken.push("max count");
    }
    if !r.gpu_types.is_empty()
        && runpod_contract::gpus::preference(
            &r.gpu_types,
            runpod_contract::provider::Cloud::RunPod,
            &g.id,
            g.memory.map(f64::from),
        )
        .is_none()
    {
        broken.push("gpu types");
    }
    if g.availability == Some(Availability::None) {
        broken.push("overall stock");
    }
    broken
}

fn oracle_has_usable_dc(g: &GpuType, r: &Requirements, l: &ClusterLimits) -> bool {
    match oracle_allowed(r, l) {
        None => false,
        Some(allowed) if allowed.is_empty() => {
            g.data_centers.is_empty()
                || g.data_centers
                    .iter()
                    .any(|s| s.availability != Availability::None)
        }
        Some(allowed) => allowed.iter().any(|dc| oracle_dc_usable(g, dc)),
    }
}

fn oracle_satisfies(g: &GpuType, r: &Requirements, l: &ClusterLimits) -> bool {
    oracle_violations(g, r, l).is_empty() && oracle_has_usable_dc(g, r, l)
}

/// Catalogue entries a candidate may have come from: same id, price and memory.
fn sources<'a>(cat: &'a Catalogue, r: &Requirements, c: &Candidate) -> Vec<&'a GpuType> {
    cat.gpus(r.cloud)
        .iter()
        .filter(|g| {
            g.id == c.gpu_id
                && oracle_price(g, r.cloud) == Some(c.price_per_gpu)
                && g.memory == c.memory_gb
        })
        .collect()
}

/// Property (d) for one candidate and one possible source entry.
fn dc_problems(g: &GpuType, r: &Requirements, l: &ClusterLimits, c: &Candidate) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(allowed) = oracle_allowed(r, l) else {
        return vec!["placed although nothing is allowed".to_owned()];
    };
    let unique: BTreeSet<&String> = c.data_center_ids.iter().collect();
    if unique.len() != c.data_center_ids.len() {
        problems.push("repeated data centre".to_owned());
    }
    for dc in &c.data_center_ids {
        if !allowed.is_empty() && !allowed.contains(dc) {
            problems.push(format!("{dc} not allowed"));
        }
        if !oracle_dc_usable(g, dc) {
            problems.push(format!("{dc} has no stock"));
        }
        if allowed.is_empty() && !g.data_centers.iter().any(|s| s.id == *dc) {
            problems.push(format!("{dc} invented"));
        }
    }
    if !allowed.is_empty() && c.data_center_ids.is_empty() {
        problems.push("restricted but no data centre sent".to_owned());
    }
    if allowed.is_empty() && g.data_centers.is_empty() && !c.data_center_ids.is_empty() {
        problems.push("data centres sent without per-DC stock".to_owned());
    }
    // Best stock first.
    let rank = |dc: &String| {
        g.data_centers
            .iter()
            .filter(|s| s.id == *dc)
            .map(|s| s.availability.rank())
            .max()
            .unwrap_or(0)
    };
    if c.data_center_ids
        .windows(2)
        .any(|w| rank(&w[0]) < rank(&w[1]))
    {
        problems.push("data centres not ordered by stock".to_owned());
    }
    problems
}

/// Property (c): cheapest first without a preference list, the list's order with one; and the
/// same input always gives the same answer.
fn check_order(cat: &Catalogue, r: &Requirements, l: &ClusterLimits) -> Result<(), TestCaseError> {
    let got = candidates(cat, r, l);
    if r.gpu_types.is_empty() {
        for pair in got.windows(2) {
            prop_assert!(
                pair[0].price_per_hour <= pair[1].price_per_hour,
                "{} before {}",
                pair[0].price_per_hour,
                pair[1].price_per_hour
            );
        }
    } else {
        // Matched by model, so two ids of one model (RunPod's double-space typos) share a place.
        let position = |c: &Candidate| {
            runpod_contract::gpus::preference(
                &r.gpu_types,
                runpod_contract::provider::Cloud::RunPod,
                &c.gpu_id,
                c.memory_gb.map(f64::from),
            )
        };
        let positions: Vec<Option<usize>> = got.iter().map(position).collect();
        prop_assert!(positions.iter().all(Option::is_some), "{positions:?}");
        prop_assert!(positions.windows(2).all(|w| w[0] <= w[1]), "{positions:?}");
    }
    prop_assert_eq!(candidates(cat, r, l), got);
    Ok(())
}

/// Requirements that leave most of the catalogue eligible: no caps, memory or data centres; a
/// shuffled type list (or none).
fn loose_requirements() -> impl Strategy<Value = Requirements> {
    (
        prop_oneof![
            1 => Just(Vec::new()),
            3 => prop::sample::subsequence(ID_POOL.to_vec(), 2..=ID_POOL.len()).prop_shuffle(),
        ],
        cloud(),
        1u32..=2,
    )
        .prop_map(|(types, cloud, gpu_count)| Requirements {
            gpu_count,
            gpu_types: types.into_iter().map(str::to_owned).collect(),
            cloud,
            ..req()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// (a) Every candidate satisfies every constraint, re-checked from a catalogue entry.
    #[test]
    fn prop_every_candidate_satisfies_every_constraint(
        cat in catalogue(), r in requirements_strategy(), l in limits_strategy()
    ) {
        for c in candidates(&cat, &r, &l) {
            let sources = sources(&cat, &r, &c);
            prop_assert!(!sources.is_empty(), "{c:?} matches no catalogue entry");
            let fine = sources.iter().any(|g| {
                oracle_violations(g, &r, &l).is_empty() && oracle_has_usable_dc(g, &r, &l)
            });
            let why: Vec<_> = sources.iter().map(|g| oracle_violations(g, &r, &l)).collect();
            prop_assert!(fine, "{c:?} breaks {why:?}");
            prop_assert_eq!(c.cloud, r.cloud);
            prop_assert_eq!(c.price_per_hour, c.price_per_gpu * f64::from(r.gpu_count));
        }
    }

    /// (b) No type that satisfies every constraint is missing, and no id appears twice.
    #[test]
    fn prop_no_eligible_type_is_missing(
        cat in catalogue(), r in requirements_strategy(), l in limits_strategy()
    ) {
        let got = candidates(&cat, &r, &l);
        let expected: BTreeSet<&str> = cat
            .gpus(r.cloud)
            .iter()
            .filter(|g| oracle_satisfies(g, &r, &l))
            .map(|g| g.id.as_str())
            .collect();
        let actual: BTreeSet<&str> = got.iter().map(|c| c.gpu_id.as_str()).collect();
        prop_assert_eq!(&actual, &expected);
        prop_assert_eq!(actual.len(), got.len(), "an id appears twice");
    }

    /// (c) Cheapest first without a preference list; the list's order with one.
    #[test]
    fn prop_candidates_are_ordered(
        cat in catalogue(), r in requirements_strategy(), l in limits_strategy()
    ) {
        check_order(&cat, &r, &l)?;
    }

    /// (c) again, with only the type list constraining, so that long lists get ordered.
    #[test]
    fn prop_candidates_are_ordered_when_few_constraints_apply(
        cat in catalogue(), r in loose_requirements()
    ) {
        let unlimited = ClusterLimits {
            max_gpu_price: f64::INFINITY,
            data_center_ids: Vec::new(),
            cloud_types: Vec::new(),
        };
        check_order(&cat, &r, &unlimited)?;
    }

    /// (d) Data centres are allowed ones with stock, best first.
    #[test]
    fn prop_data_centres_are_allowed_and_in_stock(
        cat in catalogue(), r in requirements_strategy(), l in limits_strategy()
    ) {
        for c in candidates(&cat, &r, &l) {
            let problems: Vec<Vec<String>> = sources(&cat, &r, &c)
                .iter()
                .map(|g| dc_problems(g, &r, &l, &c))
                .collect();
            prop_assert!(problems.iter().any(Vec::is_empty), "{c:?}: {problems:?}");
        }
    }

    /// (e) Every candidate asks for exactly the pod's GPU count (P11).
    #[test]
    fn prop_gpu_count_is_always_the_requirement(
        cat in catalogue(), r in requirements_strategy(), l in limits_strategy()
    ) {
        for c in candidates(&cat, &r, &l) {
            prop_assert_eq!(c.gpu_count, r.gpu_count);
        }
    }

    /// The warning helper is a lower bound of every unconstrained candidate's price.
    #[test]
    fn prop_cheapest_price_is_a_lower_bound(
        cat in catalogue(), r in requirements_strategy(), l in limits_strategy()
    ) {
        let cheapest = cheapest_price(&cat, r.cloud, r.gpu_count);
        let got = candidates(&cat, &r, &l);
        if let Some(first) = got.iter().map(|c| c.price_per_hour).reduce(f64::min) {
            prop_assert!(cheapest.is_some_and(|p| p <= first));
        }
    }
}

/// Issue 46: what each datacenter offers on Secure Cloud, in stock now or not, within the
/// installation's datacenters: what admission judges a network volume pod's cap against.
#[test]
fn the_price_sheet_says_what_each_datacenter_offers_for_volumes() {
    let catalogue = secure(vec![
        with_dcs(
            gpu("NVIDIA H100 80GB HBM3", Some(80), 2.99),
            &[
                ("US-TX-3", Availability::None),
                ("EU-RO-1", Availability::High),
            ],
        ),
        with_dcs(
            gpu("NVIDIA L40S", Some(48), 0.86),
            &[("US-TX-3", Availability::Low)],
        ),
        with_dcs(
            gpu("Mystery GPU", Some(12), 0.1),
            &[("US-TX-3", Availability::High)],
        ),
    ]);
    let all = price_sheet(&catalogue, &[]).volume_gpus;
    assert_eq!(
        all.get("US-TX-3")
            .map(|g| g.iter().cloned().collect::<Vec<_>>()),
        Some(vec!["H100".to_owned(), "L40S".to_owned()])
    );
    assert_eq!(all.len(), 2);
    let only = price_sheet(&catalogue, &["EU-RO-1".to_owned()]).volume_gpus;
    assert_eq!(only.keys().cloned().collect::<Vec<_>>(), ["EU-RO-1"]);
}
