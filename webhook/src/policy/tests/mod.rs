use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

fn config() -> PolicyConfig {
    PolicyConfig {
        allowed_datacenters: vec!["EU-RO-1".into(), "US-TX-3".into()],
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

fn labelled_namespace() -> Context {
    Context {
        namespace_labels: [(contract::BURST_LABEL.to_owned(), "enabled".to_owned())].into(),
        job: None,
        cheapest_gpu_price: BTreeMap::new(),
        gpu_prices: BTreeMap::new(),
        namespace_annotations: BTreeMap::new(),
        served: Vec::new(),
        namespace_spend: None,
        claim_provisioners: BTreeMap::new(),
        claim_datacenters: BTreeMap::new(),
        datacenter_gpus: BTreeMap::new(),
    }
}

fn gpu_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "ml"},
        "spec": {
            "containers": [{
                "name": "main",
                "image": "pytorch/pytorch",
                "ports": [{"containerPort": 8888}, {"containerPort": 22}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}
            }]
        }
    })
}

fn with(mut pod: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let mut target = &mut pod;
    for part in parent.split('/').filter(|p| !p.is_empty()) {
        if target.get(part).is_none() {
            target[part] = json!({});
        }
        target = target.get_mut(part).unwrap();
    }
    target[key.replace("~1", "/")] = value;
    pod
}

fn annotate(pod: Value, key: &str, value: &str) -> Value {
    with(
        pod,
        &format!("/metadata/annotations/{}", key.replace('/', "~1")),
        json!(value),
    )
}

fn typed(raw: &Value) -> PodView {
    serde_json::from_value(raw.clone()).unwrap()
}

/// The JSON Patch of a mutation of `raw`.
fn patch_for(raw: &Value, mutation: &Mutation) -> json_patch::Patch {
    let operations = serde_json::to_value(mutation.patch(&typed(raw))).expect("serialisable");
    serde_json::from_value(operations).expect("valid JSON Patch")
}

/// Decides, applies the patch to the raw pod, and returns both.
fn admit(raw: &Value, context: &Context) -> (Verdict, Value) {
    admit_with(raw, context, &config())
}

/// [`admit`] under another policy.
fn admit_with(raw: &Value, context: &Context, config: &PolicyConfig) -> (Verdict, Value) {
    admit_in_with("ml", raw, context, config)
}

/// [`admit_with`] in another namespace.
fn admit_in_with(
    namespace: &str,
    raw: &Value,
    context: &Context,
    config: &PolicyConfig,
) -> (Verdict, Value) {
    let verdict = decide(&typed(raw), namespace, context, config);
    let patched = match &verdict {
        Verdict::Allow { mutation, .. } => {
            let mut patched = raw.clone();
            json_patch::patch(&mut patched, &patch_for(raw, mutation)).expect("patch applies");
            patched
        }
        Verdict::Deny { .. } => raw.clone(),
    };
    (verdict, patched)
}

fn assert_idempotent(patched: &Value, context: &Context) {
    let verdict = decide(&typed(patched), "ml", context, &config());
    let Verdict::Allow { mutation, .. } = &verdict else {
        panic!("second review denied: {verdict:?}");
    };
    let again = patch_for(patched, mutation);
    assert!(again.0.is_empty(), "second review patched again: {again:?}");
}

/// The pod was admitted to burst (mutated for RunPod), not left alone.
fn assert_bursts(verdict: &Verdict) {
    assert!(
        matches!(
            verdict,
            Verdict::Allow {
                untouched: None,
                ..
            }
        ),
        "{verdict:?}"
    );
}

fn denial(verdict: &Verdict) -> (u16, &str) {
    match verdict {
        Verdict::Deny { code, message, .. } => (*code, message.as_str()),
        other => panic!("expected a denial, got {other:?}"),
    }
}

fn annotations(pod: &Value) -> &serde_json::Map<String, Value> {
    pod["metadata"]["annotations"].as_object().unwrap()
}

#[test]
fn fallback_gpu_pod_gets_toleration_local_preference_and_ports() {
    let (verdict, patched) = admit(&gpu_pod(), &labelled_namespace());
    assert_bursts(&verdict);
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([{"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "runpod", "effect": "NoSchedule"}])
    );
    let preferred = &patched["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        preferred[0]["preference"]["matchExpressions"][0]["operator"],
        "NotIn"
    );
    assert_eq!(
        preferred[0]["preference"]["matchExpressions"][0]["values"],
        json!(["virtual-kubelet"])
    );
    assert!(
        patched["spec"].get("nodeSelector").is_none(),
        "fallback must not pin the pod"
    );
    assert_eq!(annotations(&patched)[contract::PORTS], "8888/http,22/tcp");
    assert_idempotent(&patched, &labelled_namespace());
}

#[test]
fn always_mode_from_namespace_label_pins_to_the_virtual_node() {
    let mut context = labelled_namespace();
    context
        .namespace_labels
        .insert(contract::NAMESPACE_MODE_LABEL.into(), "always".into());
    let (_, patched) = admit(&gpu_pod(), &context);
    assert_eq!(
        patched["spec"]["nodeSelector"],
        json!({"type": "virtual-kubelet", "virtual-kubelet.io/provider": "runpod"})
    );
    assert_eq!(
        patched["spec"]["tolerations"][0]["key"],
        "virtual-kubelet.io/provider"
    );
    assert!(patched["spec"].get("affinity").is_none());
    assert_idempotent(&patched, &context);
}

#[test]
fn pod_label_opts_in_without_namespace_label() {
    let pod = with(
        gpu_pod(),
        "/metadata/labels",
        json!({"runpod.io/burst": "enabled"}),
    );
    let (verdict, patched) = admit(&pod, &Context::default());
    assert_bursts(&verdict);
    assert!(patched["spec"]["tolerations"].is_array());
}

#[test]
fn pods_not_opted_in_or_opted_out_or_excluded_are_untouched() {
    let forged = annotate(gpu_pod(), contract::POD_ID, "stolen");
    let (verdict, patched) = admit(&forged, &Context::default());
    assert!(matches!(
        verdict,
        Verdict::Allow {
            untouched: Some(Untouched::NotOptedIn),
            ..
        }
    ));
    assert_eq!(patched, forged);

    let opted_out = with(
        forged.clone(),
        "/metadata/labels",
        json!({"runpod.io/burst": "disabled"}),
    );
    let (verdict, patched) = admit(&opted_out, &labelled_namespace());
    assert!(matches!(
        verdict,
        Verdict::Allow {
            untouched: Some(Untouched::OptedOut),
            ..
        }
    ));
    assert_eq!(patched, opted_out);

    let verdict = decide(
        &typed(&forged),
        "kube-system",
        &labelled_namespace(),
        &config(),
    );
    assert!(matches!(
        verdict,
        Verdict::Allow {
            untouched: Some(Untouched::ExcludedNamespace),
            ..
        }
    ));
}

#[test]
fn kube_system_is_excluded_whatever_else_is() {
    let others = PolicyConfig {
        excluded_namespaces: ["team-a".to_owned()].into(),
        ..config()
    };
    for namespace in ["kube-system", "team-a"] {
        let verdict = decide(
            &typed(&gpu_pod()),
            namespace,
            &labelled_namespace(),
            &others,
        );
        assert!(
            matches!(
                verdict,
                Verdict::Allow {
                    untouched: Some(Untouched::ExcludedNamespace),
                    ..
                }
            ),
            "{namespace}: {verdict:?}"
        );
    }
}

#[test]
fn controller_annotations_are_stripped_from_every_opted_in_pod() {
    let mut pod = gpu_pod();
    for key in contract::CONTROLLER_ANNOTATIONS {
        pod = annotate(pod, key, "forged");
    }
    pod = annotate(pod, "team", "ml");
    let (_, patched) = admit(&pod, &labelled_namespace());
    for key in contract::CONTROLLER_ANNOTATIONS {
        assert!(!annotations(&patched).contains_key(key), "{key} survived");
    }
    assert_eq!(annotations(&patched)["team"], "ml");

    // Even a pod that stays local (mode never) loses them.
    let never = annotate(pod, contract::BURST_MODE, "never");
    let (verdict, patched) = admit(&never, &labelled_namespace());
    assert!(matches!(
        verdict,
        Verdict::Allow {
            untouched: Some(Untouched::ModeNever),
            ..
        }
    ));
    assert!(!annotations(&patched).contains_key(contract::POD_ID));
    assert!(patched["spec"].get("tolerations").is_none());
}

#[test]
fn non_gpu_pods_pass_unless_the_mode_is_explicit() {
    let mut pod = gpu_pod();
    pod["spec"]["containers"][0]["resources"] = json!({});
    let (verdict, patched) = admit(&pod, &labelled_namespace());
    assert!(matches!(
        verdict,
        Verdict::Allow {
            untouched: Some(Untouched::NotGpu),
            ..
        }
    ));
    assert_eq!(patched, pod);

    // An explicit mode makes it a candidate: `fallback` gets the toleration...
    let explicit = annotate(pod.clone(), contract::BURST_MODE, "fallback");
    let (verdict, patched) = admit(&explicit, &labelled_namespace());
    assert_bursts(&verdict);
    assert!(tolerates_runpod(&patched));
    // ...but `always` without a GPU would wait forever on a node that runs GPU pods only.
    let always = annotate(pod, contract::BURST_MODE, "always");
    let (verdict, _) = admit(&always, &labelled_namespace());
    let (code, message) = denial(&verdict);
    assert_eq!(code, 422);
    assert!(message.contains("requests no nvidia.com/gpu"), "{message}");
}

#[test]
fn the_controller_shares_the_opt_in_rule_and_the_run_checks() {
    let config = config();
    let enabled: BTreeMap<String, String> =
        [(contract::BURST_LABEL.to_owned(), "enabled".to_owned())].into();
    let none = BTreeMap::new();
    let pod = typed(&gpu_pod());
    assert_eq!(opt_in(&pod, "ml", &enabled, &config), Ok(()));
    assert_eq!(
        opt_in(&pod, "ml", &none, &config),
        Err(Untouched::NotOptedIn)
    );
    assert_eq!(
        opt_in(&pod, "kube-system", &enabled, &config),
        Err(Untouched::ExcludedNamespace)
    );
    let labelled = typed(&with(
        gpu_pod(),
        "/metadata/labels",
        json!({contract::BURST_LABEL: "enabled"}),
    ));
    assert_eq!(opt_in(&labelled, "ml", &none, &config), Ok(()));
    let disabled = typed(&with(
        gpu_pod(),
        "/metadata/labels",
        json!({contract::BURST_LABEL: "disabled"}),
    ));
    assert_eq!(
        opt_in(&disabled, "ml", &enabled, &config),
        Err(Untouched::OptedOut)
    );

    assert!(cannot_run(&pod, &config).is_empty());
    let forbidden = typed(&annotate(gpu_pod(), contract::DATACENTER_IDS, "EU-SE-1"));
    let problems = cannot_run(&forbidden, &config);
    assert!(
        problems.len() == 1 && problems[0].contains("EU-SE-1"),
        "{problems:?}"
    );
    let two = typed(&with(
        gpu_pod(),
        "/spec/initContainers",
        json!([{"name": "init", "image": "busybox"}]),
    ));
    assert!(cannot_run(&two, &config)[0].contains("init containers"));
    let ports: Vec<Value> = (0..11)
        .map(|i| json!({"containerPort": 8000 + i, "name": format!("http-{i}")}))
        .collect();
    let mut raw = gpu_pod();
    raw["spec"]["containers"][0]["ports"] = json!(ports);
    let many = typed(&raw);
    assert_eq!(
        cannot_run(&many, &config).len(),
        1,
        "too many detected http ports"
    );
}

/// GPUs as the webhook counts them, checked against the controller's reading of the typed pod.
fn gpus(raw: &Value) -> u32 {
    let count = checks::view_gpu_count(&typed(raw));
    let pod: Pod = serde_json::from_value(raw.clone()).unwrap();
    assert_eq!(
        checks::gpu_count(&pod),
        count,
        "the two readings differ on {raw}"
    );
    count
}

#[test]
fn gpu_requests_count_as_well_as_limits() {
    let mut pod = gpu_pod();
    pod["spec"]["containers"][0]["resources"] = json!({"requests": {"nvidia.com/gpu": "2"}});
    assert_eq!(gpus(&pod), 2);
    pod["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "0"}});
    assert_eq!(gpus(&pod), 0);
    pod["spec"]["containers"][0]["resources"] =
        json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "3"}});
    assert_eq!(gpus(&pod), 1, "the limit wins");
    pod["spec"]["initContainers"] =
        json!([{"name": "prep", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]);
    assert_eq!(gpus(&pod), 4, "an init container's larger count wins");
    pod["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "500m"}});
    pod["spec"]["initContainers"] = json!([]);
    assert_eq!(gpus(&pod), 1, "a fraction still counts as one GPU");
}

#[test]
fn both_readings_detect_the_same_ports() {
    let mut pod = gpu_pod();
    pod["spec"]["containers"][0]["ports"] = json!([
        {"containerPort": 8888, "name": "jupyter"},
        {"containerPort": 22},
        {"containerPort": 53, "protocol": "UDP"},
        {"containerPort": 22, "protocol": "TCP"},
        {"containerPort": 0}
    ]);
    let (mut view_warnings, mut typed_warnings) = (Vec::new(), Vec::new());
    let view = checks::view_detect_ports(&typed(&pod), &mut view_warnings);
    let typed_pod: Pod = serde_json::from_value(pod).unwrap();
    let typed = checks::detect_ports(&typed_pod, &mut typed_warnings);
    assert_eq!(view, typed);
    assert_eq!(view_warnings, typed_warnings);
    assert_eq!(view.unwrap().as_deref(), Some("8888/http,22/tcp"));
    assert_eq!(view_warnings.len(), 1, "{view_warnings:?}");
}

#[test]
fn job_annotations_are_the_fallback_and_are_written_on_the_pod() {
    let pod = annotate(gpu_pod(), contract::CLOUD_TYPE, "COMMUNITY");
    let mut context = labelled_namespace();
    context.job = Some(OwningJob {
        name: "train".into(),
        annotations: [
            (contract::CLOUD_TYPE.to_owned(), "SECURE".to_owned()),
            (contract::REQUIRED_GPU_MEMORY.to_owned(), "24".to_owned()),
            (contract::BURST_MODE.to_owned(), "always".to_owned()),
            ("unrelated".to_owned(), "x".to_owned()),
        ]
        .into(),
    });
    let (_, patched) = admit(&pod, &context);
    let annotations = annotations(&patched);
    assert_eq!(
        annotations[contract::CLOUD_TYPE],
        "COMMUNITY",
        "pod value wins"
    );
    assert_eq!(annotations[contract::REQUIRED_GPU_MEMORY], "24");
    assert_eq!(annotations[contract::BURST_MODE], "always");
    assert!(!annotations.contains_key("unrelated"));
    assert_eq!(
        patched["spec"]["nodeSelector"]["type"], "virtual-kubelet",
        "Job's mode applies"
    );
    assert_idempotent(&patched, &context);
}

#[test]
fn forbidden_datacenters_are_refused_naming_offending_and_allowed_ids() {
    let pod = annotate(
        gpu_pod(),
        contract::DATACENTER_IDS,
        "EU-RO-1, US-CA-2,EU-SE-1",
    );
    let (verdict, _) = admit(&pod, &labelled_namespace());
    let (code, message) = denial(&verdict);
    assert_eq!(code, 403);
    assert!(message.contains("US-CA-2, EU-SE-1"), "{message}");
    assert!(
        message.contains("allowed datacenters: EU-RO-1, US-TX-3"),
        "{message}"
    );
    assert!(message.contains("ml/trainer"), "{message}");

    let allowed = annotate(gpu_pod(), contract::DATACENTER_IDS, "US-TX-3");
    assert!(matches!(
        admit(&allowed, &labelled_namespace()).0,
        Verdict::Allow { .. }
    ));

    let mut context = labelled_namespace();
    context.job = Some(OwningJob {
        name: "train".into(),
        annotations: [(contract::DATACENTER_IDS.to_owned(), "US-CA-2".to_owned())].into(),
    });
    let (verdict, _) = admit(&gpu_pod(), &context);
    assert!(denial(&verdict).1.contains("inherited from Job train"));
}

#[test]
fn any_datacenter_is_allowed_without_a_cluster_list() {
    let pod = annotate(gpu_pod(), contract::DATACENTER_IDS, "US-CA-2");
    let open = PolicyConfig {
        allowed_datacenters: vec![],
        ..config()
    };
    let verdict = decide(&typed(&pod), "ml", &labelled_namespace(), &open);
    assert_bursts(&verdict);
}

#[test]
fn malformed_annotations_are_all_reported() {
    let mut pod = gpu_pod();
    for (key, value) in [
        (contract::REQUIRED_GPU_MEMORY, "lots"),
        (contract::GPU_TYPES, "NVIDIA GeForce RTX 4090,,"),
        (contract::MAX_PRICE, "-2"),
        (contract::CLOUD_TYPE, "STANDARD"),
        (contract::PORTS, "8080/udp"),
        (contract::TEMPLATE_ID, " "),
        (contract::REGISTRY_AUTH_ID, ""),
        (contract::DISK, "1.5"),
        (contract::DATACENTER_IDS, ","),
    ] {
        pod = annotate(pod, key, value);
    }
    let (verdict, _) = admit(&pod, &labelled_namespace());
    let (code, message) = denial(&verdict);
    assert_eq!(code, 422);
    for key in [
        contract::REQUIRED_GPU_MEMORY,
        contract::GPU_TYPES,
        contract::MAX_PRICE,
        contract::CLOUD_TYPE,
        contract::PORTS,
        contract::TEMPLATE_ID,
        contract::REGISTRY_AUTH_ID,
        contract::DISK,
        contract::DATACENTER_IDS,
    ] {
        assert!(message.contains(key), "{key} missing from {message}");
    }
}

#[test]
fn bad_burst_modes_are_refused() {
    let pod = annotate(gpu_pod(), contract::BURST_MODE, "sometimes");
    let message = denial(&admit(&pod, &labelled_namespace()).0).1.to_owned();
    assert!(message.contains("fallback, always, never"), "{message}");

    let mut context = labelled_namespace();
    context
        .namespace_labels
        .insert(contract::NAMESPACE_MODE_LABEL.into(), "yes".into());
    let message = denial(&admit(&gpu_pod(), &context).0).1.to_owned();
    assert!(
        message.contains("namespace ml has label runpod.io/burst-mode"),
        "{message}"
    );
}

#[test]
fn a_bad_namespace_mode_blocks_only_gpu_pods() {
    let mut context = labelled_namespace();
    context
        .namespace_labels
        .insert(contract::NAMESPACE_MODE_LABEL.into(), "alwys".into());
    let mut nginx = gpu_pod();
    nginx["spec"]["containers"][0] = json!({"name": "web", "image": "nginx"});
    let (verdict, patched) = admit(&nginx, &context);
    assert!(
        matches!(
            verdict,
            Verdict::Allow {
                untouched: Some(Untouched::NotGpu),
                ..
            }
        ),
        "{verdict:?}"
    );
    assert_eq!(patched, nginx);

    let (code, message) = {
        let verdict = admit(&gpu_pod(), &context).0;
        let (code, message) = denial(&verdict);
        (code, message.to_owned())
    };
    assert_eq!(code, 422);
    assert!(message.contains("\"alwys\""), "{message}");
}

#[test]
fn price_cap_scales_with_gpu_count() {
    let pod = annotate(gpu_pod(), contract::MAX_PRICE, "0.9");
    let (code, message) = {
        let verdict = admit(&pod, &labelled_namespace()).0;
        let (code, message) = denial(&verdict);
        (code, message.to_owned())
    };
    assert_eq!(code, 403);
    assert!(message.contains("cap of 0.5"), "{message}");

    let mut two = pod;
    two["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("2");
    assert_bursts(&admit(&two, &labelled_namespace()).0);
}

#[test]
fn mounted_files_need_a_command_the_controller_can_wrap() {
    let mut pod = gpu_pod();
    pod["spec"]["volumes"] = json!([
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "token", "secret": {"secretName": "default-token-x"}}
    ]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
    ]);
    // Only the service-account token (never shipped): nothing to write, the pod bursts.
    assert_bursts(&admit(&pod, &labelled_namespace()).0);

    pod["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "cfg", "mountPath": "/etc/app"}));
    let always = annotate(pod.clone(), contract::BURST_MODE, "always");
    let verdict = admit(&always, &labelled_namespace()).0;
    let (code, message) = denial(&verdict);
    assert_eq!(code, 422);
    assert!(
        message.contains("/etc/app") && message.contains("set `command`"),
        "{message}"
    );

    pod["spec"]["containers"][0]["command"] = json!(["python", "serve.py"]);
    assert_bursts(&admit(&pod, &labelled_namespace()).0);
}

#[test]
fn pods_runpod_cannot_run_are_refused_in_always_and_kept_local_in_fallback() {
    let mut pod = gpu_pod();
    pod["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "sidecar", "image": "envoy"}));
    pod["spec"]["initContainers"] = json!([{"name": "fetch", "image": "busybox"}]);
    pod["spec"]["volumes"] = json!([
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
    ]);

    let (verdict, patched) = admit(&pod, &labelled_namespace());
    match &verdict {
        Verdict::Allow {
            untouched: Some(Untouched::CannotBurst),
            warnings,
            ..
        } => {
            assert!(warnings[0].contains("2 containers"), "{warnings:?}");
            assert!(
                warnings[0].contains("PersistentVolumeClaim \"data\""),
                "{warnings:?}"
            );
            assert!(!warnings[0].contains("\"cfg\""), "{warnings:?}");
        }
        other => panic!("expected a warning, got {other:?}"),
    }
    assert_eq!(patched, pod, "a pod that stays local is not mutated");

    let always = annotate(pod, contract::BURST_MODE, "always");
    let (code, message) = {
        let verdict = admit(&always, &labelled_namespace()).0;
        let (code, message) = denial(&verdict);
        (code, message.to_owned())
    };
    assert_eq!(code, 422);
    assert!(message.contains("init containers (fetch)"), "{message}");
}

#[test]
fn too_many_detected_http_ports_keep_fallback_pods_local_and_refuse_always_pods() {
    let mut pod = gpu_pod();
    let ports: Vec<Value> = (0..11)
        .map(|i| json!({"containerPort": 7000 + i, "name": format!("http-{i}")}))
        .collect();
    pod["spec"]["containers"][0]["ports"] = json!(ports);

    let (verdict, patched) = admit(&pod, &labelled_namespace());
    match &verdict {
        Verdict::Allow {
            untouched: Some(Untouched::CannotBurst),
            warnings,
            ..
        } => assert!(
            warnings.iter().any(|w| w.contains("stays on local nodes")
                && w.contains("at most 10")
                && w.contains(contract::PORTS)),
            "{warnings:?}"
        ),
        other => panic!("expected a local pod with a warning, got {other:?}"),
    }
    assert_eq!(patched, pod, "a pod that stays local is not mutated");

    let always = annotate(pod, contract::BURST_MODE, "always");
    let (code, message) = {
        let verdict = admit(&always, &labelled_namespace()).0;
        let (code, message) = denial(&verdict);
        (code, message.to_owned())
    };
    assert_eq!(code, 422);
    assert!(message.contains("at most 10"), "{message}");
}

/// What Istio's injector does after our first review: a second container and an init container.
fn inject_sidecar(mut pod: Value) -> Value {
    pod["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "istio-proxy", "image": "istio/proxyv2"}));
    pod["spec"]["initContainers"] = json!([{"name": "istio-init", "image": "istio/proxyv2"}]);
    pod
}

fn tolerates_runpod(pod: &Value) -> bool {
    pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["key"] == contract::PROVIDER_TAINT_KEY)
}

#[test]
fn a_fallback_pod_changed_by_an_injector_after_our_review_gets_our_changes_taken_back() {
    let mut pod = gpu_pod();
    pod["spec"]["tolerations"] = json!([{"key": "gpu", "operator": "Exists"}]);
    pod["spec"]["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
    ]}});
    let (verdict, patched) = admit(&pod, &labelled_namespace());
    assert_bursts(&verdict);
    assert!(tolerates_runpod(&patched));

    let injected = inject_sidecar(patched);
    let (verdict, local) = admit(&injected, &labelled_namespace());
    match &verdict {
        Verdict::Allow {
            untouched: Some(Untouched::CannotBurst),
            warnings,
            ..
        } => assert!(
            warnings
                .iter()
                .any(|w| w.contains("stays on local nodes") && w.contains("another webhook")),
            "{warnings:?}"
        ),
        other => panic!("expected a local pod with a warning, got {other:?}"),
    }
    assert!(!tolerates_runpod(&local), "{}", local["spec"]);
    assert_eq!(
        local["spec"]["tolerations"],
        json!([{"key": "gpu", "operator": "Exists"}]),
        "the user's toleration stays"
    );
    assert_eq!(
        local["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
        pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
        "only our preference is taken back"
    );
    assert!(local["spec"].get("nodeSelector").is_none());
    assert_eq!(local["spec"]["containers"].as_array().unwrap().len(), 2);
    assert_idempotent(&local, &labelled_namespace());
}

#[test]
fn a_fallback_pod_pinned_by_an_earlier_review_is_unpinned() {
    // A first review in always mode pinned it; the mode then resolved to fallback.
    let ours = json!({"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "runpod", "effect": "NoSchedule"});
    let mut pod = inject_sidecar(gpu_pod());
    pod["spec"]["tolerations"] = json!([ours, {"key": "gpu", "operator": "Exists"}, ours]);
    pod["spec"]["nodeSelector"] =
        json!({"type": "virtual-kubelet", "virtual-kubelet.io/provider": "runpod", "disk": "ssd"});
    let (_, local) = admit(&pod, &labelled_namespace());
    assert_eq!(
        local["spec"]["tolerations"],
        json!([{"key": "gpu", "operator": "Exists"}])
    );
    assert_eq!(local["spec"]["nodeSelector"], json!({"disk": "ssd"}));
    assert_idempotent(&local, &labelled_namespace());
}

#[test]
fn only_exact_copies_of_our_toleration_and_preference_are_taken_back() {
    // Near misses are the user's own: a tolerationSeconds, another weight, an extra matchFields.
    let ours = json!({"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "runpod", "effect": "NoSchedule"});
    let mut timed = ours.clone();
    timed["tolerationSeconds"] = json!(60);
    let term = |weight: i64, extra: Option<Value>| {
        let mut preference = json!({"matchExpressions": [
            {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]}
        ]});
        if let Some(fields) = extra {
            preference["matchFields"] = fields;
        }
        json!({"weight": weight, "preference": preference})
    };
    let mut pod = inject_sidecar(gpu_pod());
    pod["spec"]["tolerations"] = json!([timed, ours]);
    pod["spec"]["affinity"] = json!({"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution":
            [term(50, None), term(100, Some(json!([]))), term(100, None)]
    }});
    let (_, local) = admit(&pod, &labelled_namespace());
    assert_eq!(local["spec"]["tolerations"], json!([timed]));
    assert_eq!(
        local["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
        json!([term(50, None), term(100, Some(json!([])))])
    );
}

#[test]
fn an_always_pod_changed_by_an_injector_after_our_review_is_refused_saying_so() {
    let pod = annotate(gpu_pod(), contract::BURST_MODE, "always");
    let (verdict, patched) = admit(&pod, &labelled_namespace());
    assert_bursts(&verdict);
    let (code, message) = {
        let verdict = admit(&inject_sidecar(patched), &labelled_namespace()).0;
        let (code, message) = denial(&verdict);
        (code, message.to_owned())
    };
    assert_eq!(code, 422);
    assert!(
        message.contains("changed after runpod-kubelet's first review")
            && message.contains("another webhook"),
        "{message}"
    );
    assert!(message.contains("2 containers"), "{message}");

    // Without our earlier changes the refusal says nothing about another webhook.
    let fresh = annotate(inject_sidecar(gpu_pod()), contract::BURST_MODE, "always");
    let verdict = admit(&fresh, &labelled_namespace()).0;
    assert!(!denial(&verdict).1.contains("another webhook"));
}

#[test]
fn port_detection_follows_names_and_skips_udp() {
    let mut pod = gpu_pod();
    pod["spec"]["containers"][0]["ports"] = json!([
        {"containerPort": 7860, "name": "http-ui"},
        {"containerPort": 5353, "protocol": "UDP"},
        {"containerPort": 6006},
        {"containerPort": 6006, "name": "dup"}
    ]);
    let (verdict, patched) = admit(&pod, &labelled_namespace());
    assert_eq!(annotations(&patched)[contract::PORTS], "7860/http,6006/tcp");
    let Verdict::Allow { warnings, .. } = verdict else {
        panic!()
    };
    assert!(
        warnings.iter().any(|w| w.contains("5353/UDP")),
        "{warnings:?}"
    );

    let overridden = annotate(gpu_pod(), contract::PORTS, "9000/tcp");
    let (_, patched) = admit(&overridden, &labelled_namespace());
    assert_eq!(annotations(&patched)[contract::PORTS], "9000/tcp");

    let mut portless = gpu_pod();
    portless["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("ports");
    let (_, patched) = admit(&portless, &labelled_namespace());
    assert!(
        patched["metadata"].get("annotations").is_none(),
        "no empty ports annotation"
    );
}

#[test]
fn existing_tolerations_and_selectors_are_respected() {
    let mut pod = gpu_pod();
    pod["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    pod["spec"]["nodeSelector"] = json!({"type": "gpu-box", "zone/a~b": "1"});
    pod = annotate(pod, contract::BURST_MODE, "always");
    let (verdict, patched) = admit(&pod, &labelled_namespace());
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([{"operator": "Exists"}])
    );
    assert_eq!(patched["spec"]["nodeSelector"]["type"], "virtual-kubelet");
    assert_eq!(patched["spec"]["nodeSelector"]["zone/a~b"], "1");
    let Verdict::Allow { warnings, .. } = verdict else {
        panic!()
    };
    assert!(
        warnings.iter().any(|w| w.contains("type=gpu-box")),
        "{warnings:?}"
    );
}

#[test]
fn patch_applies_to_a_pod_without_metadata() {
    // Found by cargo-fuzz: no `metadata` key at all, so `/metadata/annotations` has no parent.
    let mut pod = gpu_pod();
    pod.as_object_mut().unwrap().remove("metadata");
    pod["spec"]["containers"][0]["ports"] = json!([{"containerPort": 8888}]);
    let pod_label_context = labelled_namespace();
    let (verdict, patched) = admit(&pod, &pod_label_context);
    assert_bursts(&verdict);
    assert_eq!(
        patched["metadata"]["annotations"][contract::PORTS],
        "8888/http"
    );
    assert_idempotent(&patched, &pod_label_context);
}

#[test]
fn patch_escapes_keys_and_creates_missing_parents() {
    let mut pod = gpu_pod();
    pod = annotate(pod, "example.com/a~b", "kept");
    pod = annotate(pod, contract::POD_ID, "forged");
    pod["spec"]["affinity"] = Value::Null;
    let (_, patched) = admit(&pod, &labelled_namespace());
    assert_eq!(annotations(&patched)["example.com/a~b"], "kept");
    assert!(!annotations(&patched).contains_key(contract::POD_ID));
    assert!(patched["spec"]["affinity"]["nodeAffinity"].is_object());
}

fn managed_job(annotations: &[(&str, &str)]) -> Context {
    let mut context = labelled_namespace();
    context.job = Some(OwningJob {
        name: "train".into(),
        annotations: annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    });
    context
}

fn prefers_local_nodes(pod: &Value) -> bool {
    pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|term| {
            term["preference"]["matchExpressions"][0]["values"] == json!(["virtual-kubelet"])
        })
}

/// A `delayed` pod: the preference and the burst pod's annotations, no toleration, no selector.
fn assert_delayed(verdict: &Verdict, patched: &Value) {
    assert_bursts(verdict);
    assert!(prefers_local_nodes(patched), "{}", patched["spec"]);
    assert!(!tolerates_runpod(patched), "{}", patched["spec"]);
    assert!(patched["spec"].get("nodeSelector").is_none());
    assert_eq!(annotations(patched)[contract::BURST_MODE], "delayed");
    assert_eq!(annotations(patched)[contract::PORTS], "8888/http,22/tcp");
}

#[test]
fn managed_on_the_pod_selects_delayed() {
    let pod = annotate(gpu_pod(), contract::MANAGED, "true");
    let (verdict, patched) = admit(&pod, &labelled_namespace());
    assert_delayed(&verdict, &patched);
    assert_idempotent(&patched, &labelled_namespace());

    // `false` is no opt-in: the namespace default (fallback) applies.
    let unmanaged = annotate(gpu_pod(), contract::MANAGED, "false");
    let (verdict, patched) = admit(&unmanaged, &labelled_namespace());
    assert_bursts(&verdict);
    assert!(tolerates_runpod(&patched));
}

#[test]
fn managed_on_the_job_selects_delayed_and_is_written_on_the_pod() {
    let context = managed_job(&[
        (contract::MANAGED, "true"),
        (contract::MAX_PENDING_TIME, "5m"),
    ]);
    let (verdict, patched) = admit(&gpu_pod(), &context);
    assert_delayed(&verdict, &patched);
    assert_eq!(annotations(&patched)[contract::MANAGED], "true");
    assert_eq!(annotations(&patched)[contract::MAX_PENDING_TIME], "5m");
    assert_idempotent(&patched, &context);
}

#[test]
fn an_explicit_mode_beats_managed() {
    let context = managed_job(&[(contract::MANAGED, "true")]);
    let (verdict, patched) = admit(&gpu_pod(), &context);
    assert_delayed(&verdict, &patched);
    let pod = annotate(gpu_pod(), contract::BURST_MODE, "always");
    let (verdict, patched) = admit(&pod, &context);
    assert_bursts(&verdict);
    assert_eq!(patched["spec"]["nodeSelector"]["type"], "virtual-kubelet");
    assert_eq!(annotations(&patched)[contract::BURST_MODE], "always");

    // The Job's explicit mode beats the pod's managed.
    let pod = annotate(gpu_pod(), contract::MANAGED, "true");
    let (verdict, patched) = admit(&pod, &labelled_namespace());
    assert_delayed(&verdict, &patched);
    let context = managed_job(&[(contract::BURST_MODE, "fallback")]);
    let (_, patched) = admit(&pod, &context);
    assert!(tolerates_runpod(&patched));
    assert_eq!(annotations(&patched)[contract::BURST_MODE], "fallback");
}

#[test]
fn managed_beats_the_namespace_label() {
    let mut context = managed_job(&[(contract::MANAGED, "true")]);
    context
        .namespace_labels
        .insert(contract::NAMESPACE_MODE_LABEL.into(), "always".into());
    let (verdict, patched) = admit(&gpu_pod(), &context);
    assert_delayed(&verdict, &patched);
}

#[test]
fn namespace_default_delayed_is_written_on_the_pod() {
    let mut context = labelled_namespace();
    context
        .namespace_labels
        .insert(contract::NAMESPACE_MODE_LABEL.into(), "delayed".into());
    let (verdict, patched) = admit(&gpu_pod(), &context);
    assert_delayed(&verdict, &patched);
    assert_idempotent(&patched, &context);

    // A CPU pod is no candidate under a namespace default.
    let mut cpu = gpu_pod();
    cpu["spec"]["containers"][0]["resources"] = json!({});
    let (verdict, patched) = admit(&cpu, &context);
    assert!(
        matches!(
            verdict,
            Verdict::Allow {
                untouched: Some(Untouched::NotGpu),
                ..
            }
        ),
        "{verdict:?}"
    );
    assert_eq!(patched, cpu);
}

#[test]
fn an_explicit_delayed_pod_keeps_its_own_annotation_and_user_tolerations() {
    let mut pod = annotate(gpu_pod(), contract::BURST_MODE, "Delayed");
    pod["spec"]["tolerations"] = json!([{"key": "gpu", "operator": "Exists"}]);
    let (verdict, patched) = admit(&pod, &labelled_namespace());
    assert_bursts(&verdict);
    assert_eq!(
        annotations(&patched)[contract::BURST_MODE],
        "Delayed",
        "the user's value is not rewritten"
    );
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([{"key": "gpu", "operator": "Exists"}])
    );
    assert!(prefers_local_nodes(&patched));
    assert_idempotent(&patched, &labelled_namespace());
}

#[test]
fn a_managed_pod_without_a_gpu_is_a_delayed_candidate() {
    let mut cpu = annotate(gpu_pod(), contract::MANAGED, "true");
    cpu["spec"]["containers"][0]["resources"] = json!({});
    let (verdict, patched) = admit(&cpu, &labelled_namespace());
    assert_bursts(&verdict);
    assert!(prefers_local_nodes(&patched));
    assert!(!tolerates_runpod(&patched));
    assert_eq!(annotations(&patched)[contract::BURST_MODE], "delayed");

    // ...but pinned to RunPod at creation it would wait forever: refused like `always`.
    let offload = annotate(cpu, contract::OFFLOAD, "true");
    let (code, message) = {
        let verdict = admit(&offload, &labelled_namespace()).0;
        let (code, message) = denial(&verdict);
        (code, message.to_owned())
    };
    assert_eq!(code, 422);
    assert!(
        message.contains("runpod.io/offload is true but the pod requests no nvidia.com/gpu"),
        "{message}"
    );
}

#[test]
fn a_delayed_pod_runpod_cannot_run_stays_local_unmarked() {
    let context = managed_job(&[(contract::MANAGED, "true")]);
    let pod = inject_sidecar(gpu_pod());
    let (verdict, patched) = admit(&pod, &context);
    match &verdict {
        Verdict::Allow {
            untouched: Some(Untouched::CannotBurst),
            warnings,
            ..
        } => assert!(
            warnings[0].contains("stays on local nodes") && warnings[0].contains("2 containers"),
            "{warnings:?}"
        ),
        other => panic!("expected a local pod with a warning, got {other:?}"),
    }
    assert_eq!(patched, pod, "not marked delayed, not mutated");

    // Too many detected http ports: the same.
    let mut ports = gpu_pod();
    let many: Vec<Value> = (0..11)
        .map(|i| json!({"containerPort": 7000 + i, "name": format!("http-{i}")}))
        .collect();
    ports["spec"]["containers"][0]["ports"] = json!(many);
    let (verdict, patched) = admit(&ports, &context);
    assert!(
        matches!(
            verdict,
            Verdict::Allow {
                untouched: Some(Untouched::CannotBurst),
                ..
            }
        ),
        "{verdict:?}"
    );
    assert_eq!(patched, ports);

    // From the namespace default: the same. A mode the user set stays (the controller
    // re-checks the shape itself).
    let mut namespace_default = labelled_namespace();
    namespace_default
        .namespace_labels
        .insert(contract::NAMESPACE_MODE_LABEL.into(), "delayed".into());
    let explicit = annotate(pod.clone(), contract::BURST_MODE, "delayed");
    for (pod, context) in [
        (&pod, &namespace_default),
        (&explicit, &labelled_namespace()),
    ] {
        let (verdict, patched) = admit(pod, context);
        assert!(
            matches!(
                verdict,
                Verdict::Allow {
                    untouched: Some(Untouched::CannotBurst),
                    ..
                }
            ),
            "{verdict:?}"
        );
        assert_eq!(&patched, pod);
    }
}

#[test]
fn a_cloud_tier_the_installation_does_not_allow_is_refused_naming_the_allowed_ones() {
    let secure_only = PolicyConfig {
        allowed_cloud_types: vec![contract::CloudType::Secure],
        ..config()
    };
    let community = annotate(gpu_pod(), contract::CLOUD_TYPE, "community");
    let verdict = admit_with(&community, &labelled_namespace(), &secure_only).0;
    let (code, message) = denial(&verdict);
    assert_eq!(code, 403);
    assert!(
        message.contains("COMMUNITY") && message.contains("allowed: SECURE"),
        "{message}"
    );
    // From the owning Job, the message says so.
    let mut context = labelled_namespace();
    context.job = Some(OwningJob {
        name: "train".into(),
        annotations: [(contract::CLOUD_TYPE.to_owned(), "COMMUNITY".to_owned())].into(),
    });
    let verdict = admit_with(&gpu_pod(), &context, &secure_only).0;
    assert!(denial(&verdict).1.contains("train"), "{verdict:?}");
    // SECURE, or no tier at all, passes; COMMUNITY passes once the installation lists it.
    let secure = annotate(gpu_pod(), contract::CLOUD_TYPE, "SECURE");
    assert_bursts(&admit_with(&secure, &labelled_namespace(), &secure_only).0);
    assert_bursts(&admit_with(&gpu_pod(), &labelled_namespace(), &secure_only).0);
    let both = PolicyConfig {
        allowed_cloud_types: vec![contract::CloudType::Secure, contract::CloudType::Community],
        ..config()
    };
    assert_bursts(&admit_with(&community, &labelled_namespace(), &both).0);
}

#[test]
fn a_security_context_the_cloud_does_not_apply_is_warned_about_by_field() {
    let in_container = |mut pod: Value, context: Value| {
        pod["spec"]["containers"][0]["securityContext"] = context;
        pod
    };
    let hardened = in_container(
        with(
            gpu_pod(),
            "/spec/securityContext",
            json!({"runAsUser": 1000, "fsGroup": 2000, "runAsNonRoot": true, "sysctls": []}),
        ),
        json!({"readOnlyRootFilesystem": true, "privileged": false,
               "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}),
    );
    assert_eq!(
        checks::unapplied_security_context(&typed(&hardened)),
        [
            "securityContext.fsGroup",
            "securityContext.runAsNonRoot",
            "securityContext.runAsUser",
            "containers[main].securityContext.allowPrivilegeEscalation",
            "containers[main].securityContext.capabilities",
            "containers[main].securityContext.readOnlyRootFilesystem",
        ]
    );
    let Verdict::Allow { warnings, .. } = admit(&hardened, &labelled_namespace()).0 else {
        panic!("a hardened pod still bursts");
    };
    let warning = warnings
        .iter()
        .find(|w| w.contains("does not apply"))
        .unwrap_or_else(|| panic!("no warning: {warnings:?}"));
    assert!(
        warning.contains("RunPod does not apply securityContext.fsGroup")
            && warning.contains("readOnlyRootFilesystem"),
        "{warning}"
    );
    // What asks for nothing beyond the cloud's defaults is honoured: no warning.
    let plain = in_container(
        gpu_pod(),
        json!({"privileged": false, "readOnlyRootFilesystem": false, "runAsNonRoot": false,
               "allowPrivilegeEscalation": true, "capabilities": {}}),
    );
    assert!(checks::unapplied_security_context(&typed(&plain)).is_empty());
    let Verdict::Allow { warnings, .. } = admit(&plain, &labelled_namespace()).0 else {
        panic!("denied");
    };
    assert!(
        !warnings.iter().any(|w| w.contains("does not apply")),
        "{warnings:?}"
    );
    // Whatever shape the field has, the review never fails on it.
    let odd = with(gpu_pod(), "/spec/securityContext", json!("root"));
    assert!(checks::unapplied_security_context(&typed(&odd)).is_empty());
}

/// Probes, hooks and memory/CPU limits a cloud does not honour are warned about, never
/// ignored silently.
#[test]
fn probes_hooks_and_limits_the_cloud_does_not_honour_are_warned_about_by_field() {
    let mut pod = gpu_pod();
    let main = &mut pod["spec"]["containers"][0];
    main["readinessProbe"] = json!({"httpGet": {"path": "/ready", "port": 8080}});
    main["livenessProbe"] = json!({"tcpSocket": {"port": 8080}});
    main["startupProbe"] = json!({"grpc": {"port": 9000}});
    main["lifecycle"] = json!({"postStart": {"exec": {"command": ["touch", "/tmp/up"]}},
                               "preStop": {"httpGet": {"port": 8080, "path": "/drain"}}});
    main["resources"]["limits"]["memory"] = json!("100Mi");
    assert_eq!(
        checks::unhonoured(&typed(&pod), true),
        [
            "containers[main].startupProbe",
            "containers[main].lifecycle.postStart",
            "containers[main].resources.limits.memory",
        ],
        "a container without a command has no wrapper to run its hook; gRPC probes do not \
         run; HTTP and TCP probes and an HTTP preStop run over SSH"
    );
    let unrun = checks::unhonoured(&typed(&pod), false);
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert!(
            unrun.contains(&format!("containers[main].{probe}")),
            "without a shell in the container no probe runs: {unrun:?}"
        );
    }
    let mut wrapped = pod.clone();
    wrapped["spec"]["containers"][0]["command"] = json!(["python", "serve.py"]);
    assert_eq!(
        checks::unhonoured(&typed(&wrapped), true),
        [
            "containers[main].startupProbe",
            "containers[main].resources.limits.memory",
        ],
        "RunPod's wrapper runs an exec postStart"
    );
    let mut https_pre_stop = wrapped.clone();
    https_pre_stop["spec"]["containers"][0]["lifecycle"]["preStop"] =
        json!({"httpGet": {"port": 8443, "scheme": "HTTPS"}});
    assert!(
        !checks::unhonoured(&typed(&https_pre_stop), true)
            .iter()
            .any(|field| field.contains("preStop")),
        "an HTTPS preStop runs over SSH, through TLS"
    );
    let mut exec_pre_stop = wrapped.clone();
    exec_pre_stop["spec"]["containers"][0]["lifecycle"]["preStop"] =
        json!({"exec": {"command": ["sh", "-c", "sleep 2"]}});
    assert!(
        !checks::unhonoured(&typed(&exec_pre_stop), true)
            .iter()
            .any(|field| field.contains("preStop")),
        "an exec preStop runs over SSH"
    );
    assert!(
        checks::unhonoured(&typed(&wrapped), false)
            .contains(&"containers[main].lifecycle.postStart".to_owned())
    );
    let Verdict::Allow { warnings, .. } = admit(&pod, &labelled_namespace()).0 else {
        panic!("the pod still bursts");
    };
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("RunPod does not run or enforce")
                && w.contains("containers[main].lifecycle.postStart")),
        "{warnings:?}"
    );
    // A pod that sets none of them hears nothing of it.
    let Verdict::Allow { warnings, .. } = admit(&gpu_pod(), &labelled_namespace()).0 else {
        panic!("denied");
    };
    assert!(
        !warnings
            .iter()
            .any(|w| w.contains("does not run or enforce")),
        "{warnings:?}"
    );
}

#[test]
fn policy_violations_of_delayed_pods_are_refused() {
    let pod = annotate(gpu_pod(), contract::DATACENTER_IDS, "US-CA-2");
    let pod = annotate(pod, contract::BURST_MODE, "delayed");
    let context = labelled_namespace();
    let (code, message) = {
        let verdict = admit(&pod, &context).0;
        let (code, message) = denial(&verdict);
        (code, message.to_owned())
    };
    assert_eq!(code, 403);
    assert!(message.contains("US-CA-2"), "{message}");
}

#[test]
fn offload_at_creation_gets_the_always_mutation_whatever_the_mode() {
    for (annotations, job) in [
        (
            vec![(contract::OFFLOAD, "true")],
            vec![(contract::MANAGED, "true")],
        ),
        (
            vec![],
            vec![(contract::MANAGED, "true"), (contract::OFFLOAD, "true")],
        ),
        (
            vec![
                (contract::OFFLOAD, "true"),
                (contract::BURST_MODE, "fallback"),
            ],
            vec![],
        ),
    ] {
        let mut pod = gpu_pod();
        for (key, value) in &annotations {
            pod = annotate(pod, key, value);
        }
        let context = managed_job(&job);
        let (verdict, patched) = admit(&pod, &context);
        assert_bursts(&verdict);
        assert_eq!(
            patched["spec"]["nodeSelector"],
            json!({"type": "virtual-kubelet", "virtual-kubelet.io/provider": "runpod"}),
            "{annotations:?} {job:?}"
        );
        assert!(tolerates_runpod(&patched), "{annotations:?} {job:?}");
        assert!(!prefers_local_nodes(&patched), "{annotations:?} {job:?}");
        assert_eq!(
            patched["metadata"]["annotations"][contract::OFFLOAD],
            "true"
        );
        assert_idempotent(&patched, &context);
    }

    // Shapes RunPod cannot run are refused, as for `always`.
    let pod = annotate(inject_sidecar(gpu_pod()), contract::OFFLOAD, "true");
    let (code, message) = {
        let verdict = admit(&pod, &managed_job(&[(contract::MANAGED, "true")])).0;
        let (code, message) = denial(&verdict);
        (code, message.to_owned())
    };
    assert_eq!(code, 422);
    assert!(message.contains("2 containers"), "{message}");
}

#[test]
fn bad_managed_offload_and_max_pending_time_values_are_refused_naming_them() {
    for (key, value) in [
        (contract::MANAGED, "yes"),
        (contract::OFFLOAD, "1"),
        (contract::MAX_PENDING_TIME, "soon"),
        (contract::MAX_PENDING_TIME, "-5"),
        (contract::MANAGED, ""),
    ] {
        let pod = annotate(gpu_pod(), key, value);
        let (code, message) = {
            let verdict = admit(&pod, &labelled_namespace()).0;
            let (code, message) = denial(&verdict);
            (code, message.to_owned())
        };
        assert_eq!(code, 422, "{key}={value:?}");
        assert!(message.contains(key), "{key}={value:?}: {message}");

        let (verdict, _) = admit(&gpu_pod(), &managed_job(&[(key, value)]));
        assert!(
            denial(&verdict).1.contains("inherited from Job train"),
            "{verdict:?}"
        );
    }
    for good in ["40", "40s", "1h30m"] {
        let pod = annotate(gpu_pod(), contract::MAX_PENDING_TIME, good);
        assert_bursts(&admit(&pod, &labelled_namespace()).0);
    }
}

#[test]
fn the_mode_list_in_refusals_names_delayed() {
    let pod = annotate(gpu_pod(), contract::BURST_MODE, "later");
    let message = denial(&admit(&pod, &labelled_namespace()).0).1.to_owned();
    assert!(message.contains("delayed"), "{message}");
    let mut context = labelled_namespace();
    context
        .namespace_labels
        .insert(contract::NAMESPACE_MODE_LABEL.into(), "later".into());
    let message = denial(&admit(&gpu_pod(), &context).0).1.to_owned();
    assert!(message.contains("delayed"), "{message}");
}

fn arb_annotation() -> impl Strategy<Value = (String, String)> {
    let keys = prop::sample::select(vec![
        contract::REQUIRED_GPU_MEMORY,
        contract::GPU_TYPES,
        contract::MAX_PRICE,
        contract::CLOUD_TYPE,
        contract::DATACENTER_IDS,
        contract::PORTS,
        contract::DISK,
        contract::BURST_MODE,
        contract::MANAGED,
        contract::OFFLOAD,
        contract::MAX_PENDING_TIME,
        contract::POD_ID,
        contract::COST_PER_HR,
        "example.com/x~y",
        "plain",
    ]);
    let values = prop::sample::select(vec![
        "24",
        "0.4",
        "0.9",
        "SECURE",
        "always",
        "fallback",
        "never",
        "delayed",
        "true",
        "false",
        "5m",
        "EU-RO-1",
        "US-CA-2",
        "8080/http,22/tcp",
        "80/udp",
        "",
        "x",
        "NVIDIA GeForce RTX 4090",
    ]);
    (keys, values).prop_map(|(k, v)| (k.to_owned(), v.to_owned()))
}

fn arb_pod() -> impl Strategy<Value = Value> {
    (
        prop::collection::btree_map("[a-z./~]{1,12}", "[a-z]{0,4}", 0..3).prop_map(|m| m),
        prop::collection::vec(arb_annotation(), 0..5),
        prop::option::of(prop::collection::vec(
            prop::sample::select(vec![
                json!({"operator": "Exists"}),
                json!({"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "runpod", "effect": "NoSchedule"}),
                json!({"key": "other", "operator": "Exists", "effect": "NoExecute"}),
            ]),
            0..3,
        )),
        prop::option::of(prop::collection::btree_map("[a-z/~]{1,8}", "[a-z-]{1,8}", 0..3)),
        prop::collection::vec((1u16..=65535, prop::option::of("(http|grpc)[a-z]{0,3}")), 0..4),
        0u32..3,
        prop::option::of(prop::sample::select(vec![
            json!({"podAffinity": {}}),
            // Ours, as an earlier review leaves it.
            json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {"matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]}]}}]}}),
        ])),
        prop::option::of(prop::sample::select(vec!["enabled", "disabled", "other"])),
        any::<bool>(),
    )
        .prop_map(|(labels, annotations, tolerations, selector, ports, gpus, affinity, burst_label, sidecar)| {
            let mut pod = json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "image": "i"}]}
            });
            let mut labels: BTreeMap<String, String> = labels;
            if let Some(burst) = burst_label {
                labels.insert(contract::BURST_LABEL.into(), burst.into());
            }
            if !labels.is_empty() {
                pod["metadata"]["labels"] = json!(labels);
            }
            if !annotations.is_empty() {
                let map: BTreeMap<String, String> = annotations.into_iter().collect();
                pod["metadata"]["annotations"] = json!(map);
            }
            if let Some(tolerations) = tolerations {
                pod["spec"]["tolerations"] = json!(tolerations);
            }
            if let Some(selector) = selector {
                pod["spec"]["nodeSelector"] = json!(selector);
            }
            if !ports.is_empty() {
                let ports: Vec<Value> = ports
                    .into_iter()
                    .map(|(port, name)| match name {
                        Some(name) => json!({"containerPort": port, "name": name}),
                        None => json!({"containerPort": port}),
                    })
                    .collect();
                pod["spec"]["containers"][0]["ports"] = json!(ports);
            }
            if gpus > 0 {
                pod["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": gpus.to_string()}});
            }
            if let Some(affinity) = affinity {
                pod["spec"]["affinity"] = affinity;
            }
            if sidecar {
                pod = inject_sidecar(pod);
            }
            pod
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any admitted pod: the patch applies, and reviewing the result again changes nothing.
    #[test]
    fn patches_apply_and_are_idempotent(
        pod in arb_pod(),
        namespace_enabled in any::<bool>(),
        namespace_mode in prop::option::of(prop::sample::select(vec!["fallback", "always", "delayed", "never"])),
    ) {
        let mut context = if namespace_enabled { labelled_namespace() } else { Context::default() };
        if let Some(mode) = namespace_mode {
            context.namespace_labels.insert(contract::NAMESPACE_MODE_LABEL.into(), mode.into());
        }
        let verdict = decide(&typed(&pod), "ml", &context, &config());
        if let Verdict::Allow { mutation, .. } = &verdict {
            let mut patched = pod.clone();
            let patch = patch_for(&pod, mutation);
            prop_assert!(json_patch::patch(&mut patched, &patch).is_ok(), "patch {:?} does not apply", patch);
            prop_assert!(serde_json::from_value::<Pod>(patched.clone()).is_ok());
            let again = decide(&typed(&patched), "ml", &context, &config());
            let Verdict::Allow { mutation, .. } = &again else {
                return Err(TestCaseError::fail(format!("second review denied: {again:?}")));
            };
            prop_assert!(patch_for(&patched, mutation).0.is_empty());
            // Controller-owned annotations never survive an opted-in, not opted-out pod.
            let opted_out = pod["metadata"]["labels"][contract::BURST_LABEL] == "disabled";
            let opted_in = namespace_enabled || pod["metadata"]["labels"][contract::BURST_LABEL] == "enabled";
            if opted_in && !opted_out {
                prop_assert!(patched["metadata"]["annotations"].get(contract::POD_ID).is_none());
            }
        }
    }
}

#[test]
fn a_cap_below_the_cheapest_gpu_warns_without_refusing() {
    let mut context = labelled_namespace();
    context.cheapest_gpu_price = contract::parse_cheapest_prices("SECURE=0.6,COMMUNITY=0.25,bogus");
    let warned = |verdict: &Verdict| match verdict {
        Verdict::Allow {
            warnings,
            untouched: None,
            ..
        } => warnings
            .iter()
            .find(|w| w.contains("below the cheapest"))
            .cloned(),
        other => panic!("expected the pod to burst, got {other:?}"),
    };
    // The cluster cap (0.5 per GPU) is below SECURE's 0.6.
    let pod = gpu_pod();
    let warning = warned(&admit(&pod, &context).0).expect("a warning");
    assert!(
        warning.contains("--max-gpu-price") && warning.contains("0.6"),
        "{warning}"
    );
    // COMMUNITY is cheaper than the cap: no warning.
    let community = annotate(pod.clone(), contract::CLOUD_TYPE, "community");
    assert_eq!(warned(&admit(&community, &context).0), None);
    // The pod's own cap counts, for all its GPUs: 1.0 < 2 x 0.6.
    let mut two = annotate(pod.clone(), contract::MAX_PRICE, "1.0");
    two["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("2");
    let warning = warned(&admit(&two, &context).0).expect("a warning");
    assert!(
        warning.contains(contract::MAX_PRICE) && warning.contains("x 2"),
        "{warning}"
    );
    // Nothing published yet: nothing to say.
    assert_eq!(warned(&admit(&pod, &labelled_namespace()).0), None);
}

#[test]
fn cheapest_prices_round_trip_through_the_node_annotation() {
    let prices = vec![
        ("SECURE".to_owned(), 0.34),
        ("COMMUNITY".to_owned(), 0.2195),
    ];
    let parsed = contract::parse_cheapest_prices(&contract::format_cheapest_prices(&prices));
    assert_eq!(parsed, prices.into_iter().collect());
    assert!(contract::parse_cheapest_prices("SECURE=-1,COMMUNITY=NaN,=").is_empty());
}

mod claims;
mod match_condition;
mod provider;
mod teams;

/// Issue 45: an `httpGet` `postStart` hook runs over SSH once the container runs (no wrapper
/// needed), so it is honoured where the cloud offers a shell, and warned about elsewhere.
#[test]
fn an_http_post_start_hook_runs_where_there_is_a_shell() {
    let mut pod = gpu_pod();
    pod["spec"]["containers"][0]["lifecycle"] =
        json!({"postStart": {"httpGet": {"port": 8080, "path": "/warm"}}});
    assert!(
        checks::unhonoured(&typed(&pod), true).is_empty(),
        "{:?}",
        checks::unhonoured(&typed(&pod), true)
    );
    assert_eq!(
        checks::unhonoured(&typed(&pod), false),
        ["containers[main].lifecycle.postStart"]
    );
    let mut elsewhere = pod.clone();
    elsewhere["spec"]["containers"][0]["lifecycle"]["postStart"]["httpGet"]["host"] =
        json!("warmup.example");
    assert_eq!(
        checks::unhonoured(&typed(&elsewhere), true),
        ["containers[main].lifecycle.postStart"],
        "a hook to another host is not reached from the cloud"
    );
    let mut other_scheme = pod.clone();
    other_scheme["spec"]["containers"][0]["lifecycle"]["postStart"]["httpGet"]["scheme"] =
        json!("GOPHER");
    assert_eq!(
        checks::unhonoured(&typed(&other_scheme), true),
        ["containers[main].lifecycle.postStart"]
    );
}

#[test]
fn init_containers_in_the_containers_image_run_and_others_are_refused_by_name() {
    let config = config();
    let mut base = gpu_pod();
    base["spec"]["containers"][0]["command"] = json!(["python", "train.py"]);
    base["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "work", "mountPath": "/work/"}]);
    base["spec"]["volumes"] = json!([{"name": "work", "emptyDir": {}}]);
    let with_inits = |inits: Value| typed(&with(base.clone(), "/spec/initContainers", inits));
    // Same image, own command, the container's mount at the same path: runs.
    let good = with_inits(json!([{"name": "prep", "image": "pytorch/pytorch",
        "command": ["sh", "-c", "touch /work/ready"],
        "volumeMounts": [{"name": "work", "mountPath": "/work"}]}]));
    assert!(
        cannot_run(&good, &config).is_empty(),
        "{:?}",
        cannot_run(&good, &config)
    );
    // Another image: refused, named; allowed when the pod says its commands are there.
    let other = json!([{"name": "fetch", "image": "busybox", "command": ["true"]}]);
    let problems = cannot_run(&with_inits(other.clone()), &config);
    assert!(
        problems.len() == 1 && problems[0].contains("init containers (fetch)"),
        "{problems:?}"
    );
    let allowed = annotate(
        with(base.clone(), "/spec/initContainers", other),
        contract::INIT_IN_MAIN_IMAGE,
        "true",
    );
    assert!(cannot_run(&typed(&allowed), &config).is_empty());
    // No command, a mount the container lacks, a sidecar: each refused, naming it.
    let problems = cannot_run(
        &with_inits(json!([
            {"name": "bare", "image": "pytorch/pytorch"},
            {"name": "elsewhere", "image": "pytorch/pytorch", "command": ["true"],
             "volumeMounts": [{"name": "work", "mountPath": "/other"}]},
            {"name": "proxy", "image": "pytorch/pytorch", "command": ["true"], "restartPolicy": "Always"}
        ])),
        &config,
    );
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems[0].contains("\"bare\" sets no command"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("\"elsewhere\" mounts volume \"work\" at \"/other\""),
        "{problems:?}"
    );
    assert!(
        problems[2].contains("\"proxy\" is a sidecar"),
        "{problems:?}"
    );
    // The container must set a command: the init containers run before it.
    let mut no_command = with(
        base,
        "/spec/initContainers",
        json!([{"name": "prep",
        "image": "pytorch/pytorch", "command": ["true"]}]),
    );
    no_command["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("command");
    let problems = cannot_run(&typed(&no_command), &config);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("the container sets no command")),
        "{problems:?}"
    );
    // A bad value of the annotation is refused as any other.
    let annotations: BTreeMap<String, String> =
        [(contract::INIT_IN_MAIN_IMAGE.to_owned(), "yes".to_owned())].into();
    let effective = checks::Effective::resolve(&annotations, None);
    let problems = checks::validate_annotations(&effective);
    assert!(
        problems.len() == 1 && problems[0].contains(contract::INIT_IN_MAIN_IMAGE),
        "{problems:?}"
    );
}
