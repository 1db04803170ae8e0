//! Fuzzes the whole review handler: any byte string must yield a response or a 400 error,
//! never a panic, and an admitted pod's patch must apply to it.
#![no_main]

use std::sync::OnceLock;

use runpod_webhook::admission::admit;
use runpod_webhook::cluster::MemoryCluster;
use runpod_webhook::policy::PolicyConfig;

fn cluster() -> &'static MemoryCluster {
    static CLUSTER: OnceLock<MemoryCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
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
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let config = PolicyConfig {
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
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() else {
        return;
    };
    if let Ok((response, _)) = runtime.block_on(admit(data, cluster(), &config)) {
        if let Some(patch) = response.decoded_patch() {
            let patch: json_patch::Patch =
                serde_json::from_slice(&patch).expect("patch is JSON Patch");
            let review: serde_json::Value =
                serde_json::from_slice(data).expect("admitted body is JSON");
            let mut object = review["request"]["object"].clone();
            json_patch::patch(&mut object, &patch).expect("patch applies to the reviewed object");
        }
    }
});
