//! Which cloud a burst pod goes to (`runpod.io/provider`), and the Vast.ai policy at admission.

use runpod_contract::gpus::GpuPrices;
use runpod_contract::provider::CHEAPEST_CHOICE;
use runpod_contract::provider::{Cloud, PROVIDER};
use runpod_contract::vastai::VastPolicy;

use super::*;

fn vast_config() -> PolicyConfig {
    PolicyConfig {
        vastai: VastPolicy::from_flags(
            &["Europe".into(), "North America".into()],
            &[],
            false,
            true,
            0.98,
            Some(0.5),
        )
        .unwrap(),
        ..config()
    }
}

fn namespace_with(provider: &str) -> Context {
    let mut context = labelled_namespace();
    context
        .namespace_labels
        .insert(PROVIDER.to_owned(), provider.to_owned());
    context
}

/// Each cloud's nodes publish one small GPU (RunPod an RTX A4000, Vast.ai an RTX 4090) at these
/// prices per GPU-hour.
fn published(runpod: f64, vast: f64) -> BTreeMap<Cloud, GpuPrices> {
    [
        (
            Cloud::RunPod,
            GpuPrices::parse(&format!("RTXA4000x1-8:SECURE={runpod}")),
        ),
        (
            Cloud::VastAi,
            GpuPrices::parse(&format!("RTX4090x1={vast}")),
        ),
    ]
    .into()
}

/// What the simulators sell, roughly: RunPod's H100 dearer than Vast.ai's, its small GPU
/// cheaper; A6000s on RunPod only.
fn market() -> BTreeMap<Cloud, GpuPrices> {
    [
        (
            Cloud::RunPod,
            GpuPrices::parse(
                "RTXA4000x1-8:SECURE=0.25,RTXA6000x1-8:SECURE=0.49,H100x1-8:SECURE=2.99,\
                 H100x1-8:COMMUNITY=1.5",
            ),
        ),
        (
            Cloud::VastAi,
            GpuPrices::parse("RTX4090x1=0.4,H100x1=2.1,H100x2=2.0,storage=0.0002"),
        ),
    ]
    .into()
}

/// Caps high enough for an H100 on either cloud.
fn generous() -> PolicyConfig {
    let mut config = vast_config();
    config.max_gpu_price = Some(5.0);
    config.vastai.max_gpu_price = Some(5.0);
    config
}

fn always(pod: Value) -> Value {
    annotate(pod, contract::BURST_MODE, "always")
}

#[test]
fn a_vastai_namespace_sends_pods_to_the_vastai_node() {
    let (verdict, patched) = admit_with(
        &always(gpu_pod()),
        &namespace_with("vastai"),
        &vast_config(),
    );
    assert_bursts(&verdict);
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([{"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vastai", "effect": "NoSchedule"}])
    );
    assert_eq!(
        patched["spec"]["nodeSelector"],
        json!({"type": "virtual-kubelet", "virtual-kubelet.io/provider": "vastai"})
    );
    assert_eq!(annotations(&patched)[PROVIDER], "vastai");
    // A second review changes nothing.
    let again = decide(
        &typed(&patched),
        "ml",
        &namespace_with("vastai"),
        &vast_config(),
    );
    let Verdict::Allow { mutation, .. } = again else {
        panic!("{again:?}")
    };
    assert!(patch_for(&patched, &mutation).0.is_empty());
}

#[test]
fn runpod_pods_keep_their_patch_without_a_provider_annotation() {
    let (_, patched) = admit_with(&gpu_pod(), &labelled_namespace(), &vast_config());
    assert!(!annotations(&patched).contains_key(PROVIDER));
    assert_eq!(patched["spec"]["tolerations"][0]["value"], "runpod");
}

#[test]
fn a_forbidden_region_is_refused_naming_the_allowed_ones() {
    let pod = annotate(always(gpu_pod()), "vast.ai/region", "Asia");
    let (verdict, _) = admit_with(&pod, &namespace_with("vastai"), &vast_config());
    let (code, message) = denial(&verdict);
    assert_eq!(code, 403);
    assert!(
        message.contains("vast.ai/region") && message.contains("Europe, North America"),
        "{message}"
    );
    // The same pod on RunPod: the Vast.ai annotation is not RunPod's policy.
    let (verdict, _) = admit_with(&pod, &labelled_namespace(), &vast_config());
    assert_bursts(&verdict);
}

#[test]
fn a_price_above_the_cap_and_bad_values_are_refused() {
    let pod = annotate(always(gpu_pod()), "vast.ai/price-max", "2.0");
    let (verdict, _) = admit_with(&pod, &namespace_with("vastai"), &vast_config());
    let (code, message) = denial(&verdict);
    assert_eq!(code, 403);
    assert!(message.contains("above this cluster's limit"), "{message}");
    let pod = annotate(always(gpu_pod()), "vast.ai/memory", "lots");
    let (verdict, _) = admit_with(&pod, &namespace_with("vastai"), &vast_config());
    assert_eq!(denial(&verdict).0, 422);
    let pod = annotate(always(gpu_pod()), PROVIDER, "aws");
    let (verdict, _) = admit_with(&pod, &labelled_namespace(), &vast_config());
    let (code, message) = denial(&verdict);
    assert_eq!(code, 422);
    assert!(message.contains("runpod, vastai, cheapest"), "{message}");
    let (verdict, _) = admit_with(&always(gpu_pod()), &namespace_with("gcp"), &vast_config());
    assert!(
        denial(&verdict)
            .1
            .contains("namespace ml has label runpod.io/provider")
    );
}

#[test]
fn mounted_files_are_refused_on_vastai_only() {
    let pod = with(
        always(gpu_pod()),
        "/spec/containers",
        json!([{"name": "main", "image": "pytorch/pytorch", "command": ["python"],
                "volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
    );
    let pod = with(
        pod,
        "/spec/volumes",
        json!([{"name": "cfg", "configMap": {"name": "app"}}]),
    );
    let (verdict, _) = admit_with(&pod, &namespace_with("vastai"), &vast_config());
    assert!(
        denial(&verdict)
            .1
            .contains("Vast.ai instances cannot receive")
    );
    let (verdict, _) = admit_with(&pod, &labelled_namespace(), &vast_config());
    assert_bursts(&verdict);
}

#[test]
fn cheapest_picks_the_cloud_with_the_lower_published_price_and_says_why() {
    let mut context = namespace_with("cheapest");
    context.gpu_prices = published(0.44, 0.31);
    let (verdict, patched) = admit_with(&always(gpu_pod()), &context, &vast_config());
    let Verdict::Allow { warnings, .. } = &verdict else {
        panic!("{verdict:?}")
    };
    assert_eq!(annotations(&patched)[PROVIDER], "vastai");
    assert_eq!(patched["spec"]["tolerations"][0]["value"], "vastai");
    assert!(
        warnings.iter().any(|w| w.contains("chose Vast.ai")),
        "{warnings:?}"
    );
    context.gpu_prices = published(0.2, 0.31);
    let (_, patched) = admit_with(&always(gpu_pod()), &context, &vast_config());
    assert_eq!(annotations(&patched)[PROVIDER], "runpod");
    assert_eq!(
        patched["spec"]["nodeSelector"]["virtual-kubelet.io/provider"],
        "runpod"
    );
    // Once chosen, the choice stays: a later review does not move the pod.
    context.gpu_prices = published(0.9, 0.31);
    let again = decide(&typed(&patched), "ml", &context, &vast_config());
    let Verdict::Allow { mutation, .. } = again else {
        panic!("{again:?}")
    };
    assert!(patch_for(&patched, &mutation).0.is_empty());
}

#[test]
fn cheapest_leaves_out_the_clouds_the_pod_cannot_use() {
    let mut context = namespace_with("cheapest");
    context.gpu_prices = published(0.44, 0.31);
    // Outside the Vast.ai policy: RunPod, although dearer.
    let asia = annotate(always(gpu_pod()), "vast.ai/region", "Asia");
    let (verdict, patched) = admit_with(&asia, &context, &vast_config());
    assert_bursts(&verdict);
    assert_eq!(annotations(&patched)[PROVIDER], "runpod");
    // A forbidden RunPod datacenter: Vast.ai.
    let forbidden = annotate(always(gpu_pod()), contract::DATACENTER_IDS, "US-CA-2");
    let (verdict, patched) = admit_with(&forbidden, &context, &vast_config());
    assert_bursts(&verdict);
    assert_eq!(annotations(&patched)[PROVIDER], "vastai");
}

/// A Vast.ai-only install (`--clouds vastai`): a pod naming no cloud goes to Vast.ai, and one
/// asking for RunPod, which has no node there, is refused naming what is installed.
#[test]
fn an_installation_without_runpod_sends_pods_to_vastai_and_refuses_runpod() {
    let config = PolicyConfig {
        disabled_clouds: [Cloud::RunPod].into(),
        ..vast_config()
    };
    let (verdict, patched) = admit_with(&always(gpu_pod()), &labelled_namespace(), &config);
    assert_bursts(&verdict);
    assert_eq!(patched["spec"]["tolerations"][0]["value"], "vastai");
    assert_eq!(
        patched["spec"]["nodeSelector"]["virtual-kubelet.io/provider"],
        "vastai"
    );

    let runpod = annotate(always(gpu_pod()), PROVIDER, "runpod");
    let verdict = decide(&typed(&runpod), "ml", &labelled_namespace(), &config);
    let Verdict::Deny { message, .. } = &verdict else {
        panic!("{verdict:?}")
    };
    assert!(
        message.contains("runs no RunPod node") && message.contains("it runs: vastai"),
        "{message}"
    );

    // `cheapest` compares only what is installed, however cheap RunPod is.
    let mut context = namespace_with("cheapest");
    context.gpu_prices = published(0.1, 0.31);
    let (_, patched) = admit_with(&always(gpu_pod()), &context, &config);
    assert_eq!(annotations(&patched)[PROVIDER], "vastai");
    // No price published at all: still never the cloud without a node.
    context.gpu_prices.clear();
    let (_, patched) = admit_with(&always(gpu_pod()), &context, &config);
    assert_eq!(patched["spec"]["tolerations"][0]["value"], "vastai");
}

/// `runpod.io/ports: none` on the pod, the namespace label `runpod.io/ports=none`, or the
/// installation's `--expose-ports none`: the pod's declared ports are not exposed, and the
/// pod carries `none` so the controller publishes nothing. A pod's own ports still win over
/// the defaults; a namespace label other than none/auto is refused.
#[test]
fn ports_can_be_closed_by_the_pod_the_namespace_or_the_installation() {
    let closed = annotate(always(gpu_pod()), contract::PORTS, "none");
    let (verdict, patched) = admit_with(&closed, &labelled_namespace(), &config());
    assert_bursts(&verdict);
    assert_eq!(annotations(&patched)[contract::PORTS], "none");
    // Said at admission: no SSH port, so no bridge to the cluster's network.
    let Verdict::Allow { warnings, .. } = &verdict else {
        panic!("{verdict:?}")
    };
    assert!(
        warnings
            .iter()
            .any(|w| w == runpod_contract::network::NO_BRIDGE_WARNING),
        "{warnings:?}"
    );

    let (open_verdict, open) = admit_with(&always(gpu_pod()), &labelled_namespace(), &config());
    let Verdict::Allow { warnings, .. } = &open_verdict else {
        panic!("{open_verdict:?}")
    };
    assert!(
        !warnings
            .iter()
            .any(|w| w == runpod_contract::network::NO_BRIDGE_WARNING),
        "{warnings:?}"
    );
    assert_ne!(
        annotations(&open)[contract::PORTS],
        "none",
        "declared ports are detected"
    );

    let mut namespace = labelled_namespace();
    namespace
        .namespace_labels
        .insert(contract::PORTS.to_owned(), "none".to_owned());
    let (verdict, patched) = admit_with(&always(gpu_pod()), &namespace, &config());
    assert_bursts(&verdict);
    assert_eq!(annotations(&patched)[contract::PORTS], "none");
    let own = annotate(always(gpu_pod()), contract::PORTS, "8888/http");
    let (_, patched) = admit_with(&own, &namespace, &config());
    assert_eq!(annotations(&patched)[contract::PORTS], "8888/http");

    let closed_install = PolicyConfig {
        expose_no_ports: true,
        ..config()
    };
    let (_, patched) = admit_with(&always(gpu_pod()), &labelled_namespace(), &closed_install);
    assert_eq!(annotations(&patched)[contract::PORTS], "none");

    namespace
        .namespace_labels
        .insert(contract::PORTS.to_owned(), "8888-http".to_owned());
    let verdict = decide(&typed(&always(gpu_pod())), "ml", &namespace, &config());
    let Verdict::Deny { message, .. } = &verdict else {
        panic!("{verdict:?}")
    };
    assert!(message.contains("can say only none"), "{message}");
}

#[test]
fn cheapest_compares_the_gpu_the_pod_needs_not_each_clouds_cheapest() {
    let mut context = namespace_with("cheapest");
    context.gpu_prices = market();
    let h100 = annotate(always(gpu_pod()), contract::GPU_TYPES, "H100");
    let (verdict, patched) = admit_with(&h100, &context, &generous());
    let Verdict::Allow { warnings, .. } = &verdict else {
        panic!("{verdict:?}")
    };
    assert_eq!(
        annotations(&patched)[PROVIDER],
        "vastai",
        "Vast.ai's H100 is cheaper, although RunPod sells the cheapest small GPU"
    );
    let warning = warnings
        .iter()
        .find(|w| w.contains("cheapest chose Vast.ai"))
        .unwrap_or_else(|| panic!("{warnings:?}"));
    assert!(
        warning.contains("RunPod H100 at 2.990 USD/h")
            && warning.contains("Vast.ai H100 at 2.104 USD/h"),
        "both prices: {warning}"
    );
    let record = annotations(&patched)[CHEAPEST_CHOICE].as_str().unwrap();
    assert!(
        record.starts_with("chose Vast.ai") && record.contains("2.990"),
        "{record}"
    );

    // In RunPod's community class its H100 is the cheaper one.
    let community = annotate(h100.clone(), contract::CLOUD_TYPE, "COMMUNITY");
    let (_, patched) = admit_with(&community, &context, &generous());
    assert_eq!(annotations(&patched)[PROVIDER], "runpod");

    // Any GPU: the cheapest small one, RunPod's.
    let (_, patched) = admit_with(&always(gpu_pod()), &context, &generous());
    assert_eq!(annotations(&patched)[PROVIDER], "runpod");

    // A type only RunPod sells goes there, in Vast.ai's spelling as well.
    let a6000 = annotate(always(gpu_pod()), contract::GPU_TYPES, "RTX A6000");
    let (_, patched) = admit_with(&a6000, &context, &generous());
    assert_eq!(annotations(&patched)[PROVIDER], "runpod");

    // 48 GB or more: only H100s fit on Vast.ai, the A6000 on RunPod.
    let big = annotate(always(gpu_pod()), contract::REQUIRED_GPU_MEMORY, "48");
    let (_, patched) = admit_with(&big, &context, &generous());
    assert_eq!(annotations(&patched)[PROVIDER], "runpod");
}

#[test]
fn cheapest_refuses_when_nothing_fits_the_cap_and_names_each_clouds_cheapest_fit() {
    let mut context = namespace_with("cheapest");
    context.gpu_prices = market();
    let h100 = annotate(always(gpu_pod()), contract::GPU_TYPES, "H100");
    // vast_config caps both clouds at 0.5 USD per GPU-hour.
    let (verdict, _) = admit_with(&h100, &context, &vast_config());
    let (code, message) = denial(&verdict);
    assert_eq!(code, 403);
    assert!(
        message
            .contains("RunPod's cheapest fit H100 at 2.990 USD/h is above the cap of 0.500 USD/h")
            && message.contains("Vast.ai's cheapest fit H100 at 2.104 USD/h"),
        "{message}"
    );
    // A cloud that has published nothing yet takes the pod, with a warning saying why.
    context.gpu_prices.remove(&Cloud::VastAi);
    let (verdict, patched) = admit_with(&h100, &context, &vast_config());
    let Verdict::Allow { warnings, .. } = &verdict else {
        panic!("{verdict:?}")
    };
    assert_eq!(annotations(&patched)[PROVIDER], "vastai");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("Vast.ai has published no prices yet")),
        "{warnings:?}"
    );
}

#[test]
fn a_forged_cheapest_record_is_removed_and_unknown_gpu_names_are_refused() {
    let forged = annotate(always(gpu_pod()), CHEAPEST_CHOICE, "chose RunPod: free");
    let (verdict, patched) = admit(&forged, &labelled_namespace());
    assert_bursts(&verdict);
    assert!(annotations(&patched).get(CHEAPEST_CHOICE).is_none());
    // A record naming another cloud than the pod's is removed too; one naming the pod's own
    // cloud (our record, reviewed again) stays.
    let other = annotate(
        annotate(always(gpu_pod()), PROVIDER, "runpod"),
        CHEAPEST_CHOICE,
        "chose Vast.ai: cheaper",
    );
    let (_, patched) = admit(&other, &labelled_namespace());
    assert!(annotations(&patched).get(CHEAPEST_CHOICE).is_none());
    let ours = annotate(
        annotate(always(gpu_pod()), PROVIDER, "runpod"),
        CHEAPEST_CHOICE,
        "chose RunPod: RunPod L4 at 0.400 USD/h",
    );
    let (_, patched) = admit(&ours, &labelled_namespace());
    assert!(annotations(&patched).get(CHEAPEST_CHOICE).is_some());

    for (key, value) in [
        (contract::GPU_TYPES, "H100,H100X"),
        ("vast.ai/gpu-type", "H100X"),
        ("vast.ai/gpu-fallbacks", "RTX 4090,H100X"),
    ] {
        let pod = annotate(always(gpu_pod()), key, value);
        let (verdict, _) = admit_with(&pod, &labelled_namespace(), &vast_config());
        let (code, message) = denial(&verdict);
        assert_eq!(code, 422, "{key}");
        assert!(
            message.contains("\"H100X\" is not a GPU runpod-kubelet knows")
                && message.contains("A100-80GB")
                && message.contains(key),
            "{message}"
        );
    }
    // Either cloud's spelling, and the canonical one, in any case.
    for value in ["h100", "NVIDIA H100 80GB HBM3", "H100 SXM", "rtx_4090"] {
        let pod = annotate(always(gpu_pod()), contract::GPU_TYPES, value);
        let (verdict, _) = admit(&pod, &labelled_namespace());
        assert_bursts(&verdict);
    }
}

#[test]
fn cheapest_with_only_vastai_names_compares_and_places_those_gpus_on_runpod_too() {
    let mut context = namespace_with("cheapest");
    context.gpu_prices = market();
    // Asked as Vast.ai's H100 only; RunPod's community H100 (1.5) beats Vast.ai's (2.1).
    let pod = annotate(
        annotate(always(gpu_pod()), "vast.ai/gpu-type", "H100 SXM"),
        contract::CLOUD_TYPE,
        "COMMUNITY",
    );
    let (verdict, patched) = admit_with(&pod, &context, &generous());
    assert_bursts(&verdict);
    assert_eq!(annotations(&patched)[PROVIDER], "runpod");
    assert_eq!(
        annotations(&patched)[contract::GPU_TYPES],
        "H100 SXM",
        "RunPod places the GPU that was compared"
    );
    // In the secure class Vast.ai's is cheaper: nothing is written for RunPod.
    let secure = annotate(always(gpu_pod()), "vast.ai/gpu-type", "H100 SXM");
    let (_, patched) = admit_with(&secure, &context, &generous());
    assert_eq!(annotations(&patched)[PROVIDER], "vastai");
    assert!(annotations(&patched).get(contract::GPU_TYPES).is_none());
}

#[test]
fn cheapest_refuses_a_pod_no_cloud_would_take_naming_each_clouds_reason() {
    let mut context = namespace_with("cheapest");
    context.gpu_prices = market();
    // A forbidden RunPod datacenter and a region outside the Vast.ai policy.
    let pod = annotate(
        annotate(always(gpu_pod()), contract::DATACENTER_IDS, "US-CA-2"),
        "vast.ai/region",
        "Asia",
    );
    let (verdict, _) = admit_with(&pod, &context, &vast_config());
    let (code, message) = denial(&verdict);
    assert_eq!(code, 403);
    assert!(
        message.contains("no cloud of this installation allows the pod")
            && message.contains("RunPod: ")
            && message.contains("US-CA-2")
            && message.contains("Vast.ai: ")
            && message.contains("Asia"),
        "{message}"
    );
}

#[test]
fn cheapest_keeps_a_fallback_pod_only_a_shape_stops_local() {
    // A Vast.ai-only installation and a pod mounting a ConfigMap: Vast.ai cannot run it, which
    // is a shape, not a policy: in `fallback` it stays local with a warning, as before.
    let config = PolicyConfig {
        disabled_clouds: [Cloud::RunPod].into(),
        ..vast_config()
    };
    let mut context = namespace_with("cheapest");
    context.gpu_prices = market();
    let pod = with(
        with(
            gpu_pod(),
            "/spec/containers",
            json!([{"name": "main", "image": "pytorch/pytorch", "command": ["python"],
                    "volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        ),
        "/spec/volumes",
        json!([{"name": "cfg", "configMap": {"name": "app"}}]),
    );
    let (verdict, _) = admit_with(&pod, &context, &config);
    let Verdict::Allow {
        untouched,
        warnings,
        ..
    } = &verdict
    else {
        panic!("{verdict:?}")
    };
    assert_eq!(*untouched, Some(Untouched::CannotBurst), "{warnings:?}");
}

/// A cloud without a shell has no bridge: a pod that looks like it needs the cluster's network
/// (container ports a Service could route to, or a namespace naming cluster Services) is told
/// so at admission; one that does not is not.
#[test]
fn a_vastai_pod_that_needs_the_cluster_network_is_told_it_gets_none() {
    let said = |pod: &Value, context: &Context| {
        let (verdict, _) = admit_with(pod, context, &vast_config());
        let Verdict::Allow { warnings, .. } = verdict else {
            panic!("{verdict:?}")
        };
        warnings
            .iter()
            .any(|w| *w == runpod_contract::network::no_bridge_on("Vast.ai"))
    };
    assert!(said(&always(gpu_pod()), &namespace_with("vastai")));
    let mut portless = always(gpu_pod());
    portless["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("ports");
    assert!(!said(&portless, &namespace_with("vastai")));
    let mut asks = namespace_with("vastai");
    asks.namespace_annotations.insert(
        runpod_contract::network::CLUSTER_SERVICES.to_owned(),
        "ml/*".to_owned(),
    );
    assert!(said(&portless, &asks));
    // RunPod has the bridge.
    assert!(!said(&always(gpu_pod()), &labelled_namespace()));
}
