//! Property-based fuzzing of the review handler, run with every `cargo test` (the cargo-fuzz
//! target in `webhook/fuzz` goes deeper). Arbitrary bytes and structurally damaged reviews must
//! give a response or a 400 error, never a panic; an admitted patch must apply.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use runpod_webhook::admission::admit;
use runpod_webhook::cluster::MemoryCluster;
use runpod_webhook::policy::PolicyConfig;
use serde_json::{Value, json};

fn config() -> PolicyConfig {
    PolicyConfig {
        allowed_datacenters: vec!["EU-RO-1".into()],
        allowed_cloud_types: Vec::new(),
        max_gpu_price: Some(0.5),
        excluded_namespaces: ["kube-system".to_owned()].into(),
        vastai: Default::default(),
        disabled_clouds: Default::default(),
        expose_no_ports: false,
        accept_seed_tolerations: false,
        default_budget: None,
        namespace_nodes: Vec::new(),
        node_clouds: Default::default(),
    }
}

fn cluster() -> MemoryCluster {
    let mut cluster = MemoryCluster::default();
    cluster.namespaces.insert(
        "ml".into(),
        [("runpod.io/burst".to_owned(), "enabled".to_owned())].into(),
    );
    // Published prices, so that `cheapest` pods take the comparison path.
    cluster.gpu_prices = [
        (
            runpod_webhook::contract::provider::Cloud::RunPod,
            runpod_webhook::contract::gpus::GpuPrices::parse(
                "H100x1-8:SECURE=2.99,RTX4090x1-8:SECURE=0.44",
            ),
        ),
        (
            runpod_webhook::contract::provider::Cloud::VastAi,
            runpod_webhook::contract::gpus::GpuPrices::parse(
                "H100x1=2.1,RTX4090x1=0.6,storage=0.0002",
            ),
        ),
    ]
    .into();
    // A budget, its ledger and a node per team, so budget and binding judgements run too.
    cluster.namespace_annotations.insert(
        "ml".into(),
        [("runpod.io/budget-per-hour".to_owned(), "1".to_owned())].into(),
    );
    cluster.spend.insert("ml".into(), 0.8);
    cluster.served = vec![
        (
            runpod_webhook::contract::provider::Cloud::RunPod,
            runpod_webhook::contract::teams::Served::parse("team-node", Some("ml")),
        ),
        (
            runpod_webhook::contract::provider::Cloud::VastAi,
            runpod_webhook::contract::teams::Served::parse("shared", None),
        ),
    ];
    cluster
}

fn seed() -> Value {
    serde_json::from_str(include_str!("../fuzz/seeds/gpu-pod.json")).unwrap()
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[ -~]{0,12}".prop_map(Value::String),
        Just(json!("nvidia.com/gpu")),
        Just(json!("runpod.io/burst-mode")),
        Just(json!("runpod.io/provider")),
        Just(json!("cheapest")),
        Just(json!("runpod.io/gpu-types")),
        Just(json!("H100 SXM")),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z./~]{1,10}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Replaces the value at a random path of the seed review with arbitrary JSON.
fn damage(mut review: Value, path: &[prop::sample::Index], replacement: Value) -> Value {
    let mut pointer = String::new();
    let mut target = &review;
    for index in path {
        let step = match target {
            Value::Object(map) if !map.is_empty() => map
                .keys()
                .nth(index.index(map.len()))
                .map(|key| (key.replace('~', "~0").replace('/', "~1"), &map[key])),
            Value::Array(items) if !items.is_empty() => {
                let at = index.index(items.len());
                Some((at.to_string(), &items[at]))
            }
            _ => None,
        };
        let Some((token, next)) = step else { break };
        pointer.push('/');
        pointer.push_str(&token);
        target = next;
    }
    if let Some(slot) = review.pointer_mut(&pointer) {
        *slot = replacement;
    }
    review
}

fn check(body: &[u8]) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    if let Ok((response, _)) = runtime.block_on(admit(body, &cluster(), &config()))
        && let Some(patch) = response.decoded_patch()
    {
        let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
        let review: Value = serde_json::from_slice(body).unwrap();
        let mut object = review["request"]["object"].clone();
        prop_assert!(
            json_patch::patch(&mut object, &patch).is_ok(),
            "patch does not apply"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
        check(&body)?;
    }

    #[test]
    fn damaged_reviews_never_panic(
        path in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        replacement in arb_json(),
    ) {
        let body = serde_json::to_vec(&damage(seed(), &path, replacement)).unwrap();
        check(&body)?;
    }

    #[test]
    fn a_review_with_a_byte_that_is_not_utf8_is_refused(
        at in any::<prop::sample::Index>(),
        byte in 0x80u8..=0xff,
    ) {
        // Wherever the byte lands, even in a field the webhook never reads, the body is not
        // JSON, so it gets a 400 and never a verdict.
        let mut body = serde_json::to_vec(&seed()).unwrap();
        let at = at.index(body.len());
        body[at] = byte;
        prop_assume!(std::str::from_utf8(&body).is_err());
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        prop_assert!(runtime.block_on(admit(&body, &cluster(), &config())).is_err());
    }
}
