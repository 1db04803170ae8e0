//! The registration's match condition (`registration::MATCH_CONDITION`) leaves out only pods
//! the webhook would not change: for every pod the CEL expression rejects, `decide` neither
//! patches, warns nor refuses. Evaluated with a CEL interpreter on the pod as JSON, as the
//! apiserver evaluates it on `object`.

use super::*;
use crate::registration::MATCH_CONDITION;

thread_local! {
    static PROGRAM: cel_interpreter::Program =
        cel_interpreter::Program::compile(MATCH_CONDITION).expect("CEL compiles");
}

fn sent(pod: &Value) -> bool {
    let mut context = cel_interpreter::Context::default();
    context
        .add_variable("object", pod.clone())
        .expect("pod as CEL value");
    match PROGRAM.with(|program| program.execute(&context)) {
        Ok(cel_interpreter::Value::Bool(sent)) => sent,
        other => panic!("the condition must be a bool: {other:?}"),
    }
}

#[test]
fn gpu_pods_pods_with_our_annotations_and_job_pods_are_sent() {
    let cpu = json!({"metadata": {"name": "web", "annotations": {"team": "a"}},
                     "spec": {"containers": [{"name": "m", "resources": {"limits": {"cpu": "1"}}}]}});
    assert!(!sent(&cpu));
    assert!(sent(&gpu_pod()));
    let mut requests = cpu.clone();
    requests["spec"]["containers"][0]["resources"] = json!({"requests": {"nvidia.com/gpu": "1"}});
    assert!(sent(&requests));
    let mut init = cpu.clone();
    init["spec"]["initContainers"] =
        json!([{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]);
    assert!(sent(&init));
    assert!(sent(&annotate(cpu.clone(), contract::BURST_MODE, "always")));
    assert!(sent(&annotate(cpu.clone(), "vast.ai/gpu-type", "RTX 4090")));
    let mut job = cpu.clone();
    job["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "t", "uid": "u"}]);
    assert!(sent(&job));
    let mut replica = cpu;
    replica["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u"}]);
    assert!(!sent(&replica));
}

#[test]
fn every_controller_owned_annotation_is_sent_to_be_stripped() {
    for key in contract::CONTROLLER_ANNOTATIONS {
        let pod = json!({"metadata": {"name": "p", "annotations": {*key: "forged"}},
                         "spec": {"containers": [{"name": "m"}]}});
        assert!(sent(&pod), "{key}");
    }
}

fn arb_any_pod() -> impl Strategy<Value = Value> {
    let annotation = prop::option::of(prop::sample::select(vec![
        (contract::BURST_MODE, "always"),
        (contract::BURST_MODE, "never"),
        (contract::BURST_MODE, "delayed"),
        (contract::MANAGED, "true"),
        (contract::OFFLOAD, "true"),
        (contract::POD_ID, "forged"),
        (contract::PORTS, "8888/http"),
        ("vast.ai/gpu-type", "RTX 4090"),
        ("team", "a"),
    ]));
    let gpu = prop::option::of(prop::sample::select(vec!["limits", "requests", "init"]));
    let owner = prop::option::of(prop::sample::select(vec!["Job", "ReplicaSet"]));
    (annotation, gpu, owner, any::<bool>()).prop_map(|(annotation, gpu, owner, label)| {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "m", "image": "i",
                                     "resources": {"limits": {"cpu": "1"}}}]}});
        if let Some((key, value)) = annotation {
            pod = annotate(pod, key, value);
        }
        match gpu {
            Some("limits") => {
                pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("1")
            }
            Some("requests") => {
                pod["spec"]["containers"][0]["resources"]["requests"] =
                    json!({"nvidia.com/gpu": "1"})
            }
            Some(_) => {
                pod["spec"]["initContainers"] =
                    json!([{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])
            }
            None => {}
        }
        if let Some(kind) = owner {
            let api = if kind == "Job" { "batch/v1" } else { "apps/v1" };
            pod["metadata"]["ownerReferences"] =
                json!([{"apiVersion": api, "kind": kind, "name": "o", "uid": "u"}]);
        }
        if label {
            pod["metadata"]["labels"] = json!({contract::BURST_LABEL: "enabled"});
        }
        pod
    })
}

proptest! {
    // Most generated pods are sent (and skipped here): allow for it.
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    })]

    /// A pod the condition leaves out would have been left as it is: no patch, no warning, no
    /// refusal, whatever the namespace's opt-in and mode or the owning Job's annotations.
    #[test]
    fn a_pod_not_sent_is_one_the_webhook_would_not_change(
        pod in arb_any_pod(),
        namespace_mode in prop::option::of(prop::sample::select(vec!["fallback", "always", "delayed"])),
        job_mode in prop::option::of(prop::sample::select(vec!["always", "never"])),
    ) {
        prop_assume!(!sent(&pod));
        let mut context = labelled_namespace();
        if let Some(mode) = namespace_mode {
            context.namespace_labels.insert(contract::NAMESPACE_MODE_LABEL.into(), mode.into());
        }
        // Only a Job's pods can have a Job (and those are always sent).
        if let Some(mode) = job_mode.filter(|_| owning_job(&typed(&pod)).is_some()) {
            context.job = Some(OwningJob {
                name: "o".into(),
                annotations: [(contract::BURST_MODE.to_owned(), mode.to_owned())].into(),
            });
        }
        match decide(&typed(&pod), "ml", &context, &config()) {
            Verdict::Allow { mutation, warnings, untouched } => {
                prop_assert!(untouched.is_some(), "{pod}");
                prop_assert!(mutation.patch(&typed(&pod)).is_empty(), "{pod}");
                prop_assert!(warnings.is_empty(), "{pod}: {warnings:?}");
            }
            denied => prop_assert!(false, "{pod}: {denied:?}"),
        }
    }
}
