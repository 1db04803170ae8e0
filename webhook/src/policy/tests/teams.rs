//! Budgets and teams at admission: node binding selects the team's node, a pod that could
//! never fit its namespace's budget is refused, one that does not fit now is warned about.

use runpod_contract::budget::BUDGET_PER_HOUR;
use runpod_contract::gpus::GpuPrices;
use runpod_contract::provider::{Cloud, PROVIDER};
use runpod_contract::teams::{NODE_LABEL, Served};

use super::*;

const REQUIRED: &str = "requiredDuringSchedulingIgnoredDuringExecution";

fn teams() -> Vec<(Cloud, Served)> {
    vec![
        (Cloud::RunPod, Served::parse("team-a-node", Some("ml"))),
        (Cloud::RunPod, Served::parse("shared", None)),
        (Cloud::VastAi, Served::parse("team-b-node", Some("vision"))),
    ]
}

fn terms(pod: &Value) -> Vec<Value> {
    pod["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn hostname_term(hosts: &[&str]) -> Value {
    json!({"key": "kubernetes.io/hostname", "operator": "In", "values": hosts})
}

fn local_term() -> Value {
    json!({"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]})
}

fn denied(verdict: &Verdict) -> (u16, String) {
    match verdict {
        Verdict::Deny { code, message, .. } => (*code, message.clone()),
        other => panic!("admitted: {other:?}"),
    }
}

#[test]
fn a_bound_namespace_goes_to_its_node_by_name_in_every_mode() {
    let mut context = labelled_namespace();
    context.served = teams();
    let (verdict, always) = admit(
        &annotate(gpu_pod(), contract::BURST_MODE, "always"),
        &context,
    );
    assert_bursts(&verdict);
    assert_eq!(
        terms(&always),
        vec![json!({"matchExpressions": [hostname_term(&["team-a-node"])]})]
    );
    assert_idempotent(&always, &context);

    // fallback: a local node, or the team's node.
    let (_, fallback) = admit(&gpu_pod(), &context);
    assert_eq!(
        terms(&fallback),
        vec![
            json!({"matchExpressions": [local_term()]}),
            json!({"matchExpressions": [hostname_term(&["team-a-node"])]}),
        ]
    );
    assert!(prefers_local_nodes(&fallback), "the preference stays");
    assert_idempotent(&fallback, &context);
}

#[test]
fn the_pods_own_required_terms_keep_their_meaning() {
    let mut context = labelled_namespace();
    context.served = teams();
    let own = json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]});
    let pod = with(
        gpu_pod(),
        &format!("/spec/affinity/nodeAffinity/{REQUIRED}"),
        json!({"nodeSelectorTerms": [own]}),
    );
    let (_, patched) = admit(&pod, &context);
    let zone = json!({"key": "zone", "operator": "In", "values": ["a"]});
    assert_eq!(
        terms(&patched),
        vec![
            json!({"matchExpressions": [zone.clone(), local_term()]}),
            json!({"matchExpressions": [zone, hostname_term(&["team-a-node"])]}),
        ]
    );
    assert_idempotent(&patched, &context);
}

#[test]
fn the_label_binds_and_unbound_namespaces_avoid_the_teams_nodes() {
    let mut context = labelled_namespace();
    context.served = teams();
    context
        .namespace_labels
        .insert(NODE_LABEL.to_owned(), "shared".to_owned());
    // (A namespace no node lists: the label picks among the nodes serving unbound ones.)
    let (_, patched) = admit_in(
        "other",
        &annotate(gpu_pod(), contract::BURST_MODE, "always"),
        &context,
    );
    assert_eq!(
        terms(&patched)[0]["matchExpressions"][0],
        hostname_term(&["shared"])
    );

    // A namespace nobody lists goes to the nodes that list none.
    let mut unbound = labelled_namespace();
    unbound.served = vec![
        (Cloud::RunPod, Served::parse("team-a-node", Some("other"))),
        (Cloud::RunPod, Served::parse("shared", None)),
    ];
    let (_, patched) = admit(
        &annotate(gpu_pod(), contract::BURST_MODE, "always"),
        &unbound,
    );
    assert_eq!(
        terms(&patched)[0]["matchExpressions"][0],
        hostname_term(&["shared"])
    );

    // ... and is refused when every node lists its namespaces (in fallback it stays local).
    unbound.served.truncate(1);
    let always = annotate(gpu_pod(), contract::BURST_MODE, "always");
    let (code, message) = denied(&admit(&always, &unbound).0);
    assert_eq!(code, 403);
    assert!(message.contains("runpod.io/node"), "{message}");
    let (verdict, local) = admit(&gpu_pod(), &unbound);
    let Verdict::Allow {
        warnings,
        untouched,
        ..
    } = &verdict
    else {
        panic!("{verdict:?}")
    };
    assert_eq!(*untouched, Some(Untouched::CannotBurst));
    assert!(
        warnings.iter().any(|w| w.contains("stays on local nodes")),
        "{warnings:?}"
    );
    assert!(terms(&local).is_empty() && local["spec"]["tolerations"].is_null());

    // No node lists anything: no binding at all.
    let (_, free) = admit(
        &annotate(gpu_pod(), contract::BURST_MODE, "always"),
        &labelled_namespace(),
    );
    assert!(terms(&free).is_empty());
}

#[test]
fn a_namespace_bound_to_another_clouds_node_goes_there_unless_the_pod_names_a_cloud() {
    let mut context = labelled_namespace();
    context.served = teams();
    let (_, patched) = admit_in("vision", &gpu_pod(), &context);
    assert_eq!(annotations(&patched)[PROVIDER], "vastai");
    assert_eq!(
        terms(&patched)[1]["matchExpressions"][0],
        hostname_term(&["team-b-node"])
    );
    let named = annotate(
        annotate(gpu_pod(), PROVIDER, "runpod"),
        contract::BURST_MODE,
        "always",
    );
    let (code, message) = denied(&admit_in("vision", &named, &context).0);
    assert_eq!(code, 403);
    assert!(
        message.contains("team-b-node") && message.contains("RunPod"),
        "{message}"
    );
}

/// The installation's bindings (the chart's `namespaces`) hold while the team's node is not
/// registered: its namespace is never taken for unbound.
#[test]
fn the_installations_bindings_hold_before_the_node_registers() {
    let mut context = labelled_namespace();
    context.served = vec![(Cloud::RunPod, Served::parse("shared", None))];
    let mut config = config();
    config.namespace_nodes = vec![Served::parse("team-a-node", Some("ml"))];
    config.node_clouds = [("team-a-node".to_owned(), Cloud::VastAi)].into();
    let (_, patched) = admit_with(
        &annotate(gpu_pod(), contract::BURST_MODE, "always"),
        &context,
        &config,
    );
    assert_eq!(
        terms(&patched)[0]["matchExpressions"][0],
        hostname_term(&["team-a-node"])
    );
    // ... on that node's cloud, which the installation names.
    assert_eq!(annotations(&patched)[PROVIDER], "vastai");
}

/// A user's own hostname term naming another node is not taken for the binding.
#[test]
fn a_users_hostname_term_is_no_binding() {
    let mut context = labelled_namespace();
    context.served = teams();
    let theirs = json!({"matchExpressions": [hostname_term(&["team-b-node"])]});
    let pod = with(
        annotate(gpu_pod(), contract::BURST_MODE, "always"),
        &format!("/spec/affinity/nodeAffinity/{REQUIRED}"),
        json!({"nodeSelectorTerms": [theirs]}),
    );
    let (_, patched) = admit(&pod, &context);
    assert_eq!(
        terms(&patched),
        vec![json!({"matchExpressions": [hostname_term(&["team-b-node"]),
            hostname_term(&["team-a-node"])]})]
    );
}

#[test]
fn a_pod_that_names_its_node_passes_unbound() {
    let mut context = labelled_namespace();
    context.served = teams();
    let pod = with(gpu_pod(), "/spec/nodeName", json!("team-b-node"));
    let (verdict, patched) = admit(&pod, &context);
    assert_bursts(&verdict);
    assert!(
        terms(&patched).is_empty(),
        "its node's controller judges it"
    );
}

fn gpus(count: u32) -> Value {
    let mut pod = gpu_pod();
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] =
        json!(count.to_string());
    pod
}

fn budgeted(budget: &str, spend: Option<f64>) -> Context {
    let mut context = labelled_namespace();
    context
        .namespace_annotations
        .insert(BUDGET_PER_HOUR.to_owned(), budget.to_owned());
    context.namespace_spend = spend;
    context.gpu_prices = [(
        Cloud::RunPod,
        GpuPrices::parse("RTXA4000x1-8:SECURE=0.4,H100x1-8:SECURE=2.99"),
    )]
    .into();
    context
}

#[test]
fn a_pod_that_could_never_fit_the_budget_is_refused_naming_both() {
    let h100 = annotate(gpu_pod(), contract::GPU_TYPES, "H100");
    let (code, message) = denied(&admit(&h100, &budgeted("1", None)).0);
    assert_eq!(code, 403);
    assert!(
        message.contains("budget of 1.000 USD/h") && message.contains("2.990 USD/h"),
        "{message}"
    );
    // Two small GPUs fit a budget of 1; three do not.
    let two = gpus(2);
    assert_bursts(&admit(&two, &budgeted("1", None)).0);
    let three = gpus(3);
    let (code, _) = denied(&admit(&three, &budgeted("1", None)).0);
    assert_eq!(code, 403);
}

#[test]
fn a_full_namespace_is_warned_about_and_a_bad_budget_refused() {
    let (verdict, _) = admit(&gpu_pod(), &budgeted("1", Some(0.8)));
    let Verdict::Allow { warnings, .. } = &verdict else {
        panic!("{verdict:?}")
    };
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("BudgetExceeded") && w.contains("0.800")),
        "{warnings:?}"
    );
    let (verdict, _) = admit(&gpu_pod(), &budgeted("1", Some(0.4)));
    let Verdict::Allow { warnings, .. } = &verdict else {
        panic!("{verdict:?}")
    };
    assert!(
        !warnings.iter().any(|w| w.contains("BudgetExceeded")),
        "{warnings:?}"
    );
    let (code, message) = denied(&admit(&gpu_pod(), &budgeted("a lot", None)).0);
    assert_eq!(code, 422);
    assert!(message.contains(BUDGET_PER_HOUR), "{message}");
}

#[test]
fn the_installations_default_budget_applies_without_an_annotation() {
    let mut context = budgeted("1", None);
    context.namespace_annotations.clear();
    let mut config = config();
    config.default_budget = Some(0.1);
    let (code, _) = denied(&admit_with(&gpu_pod(), &context, &config).0);
    assert_eq!(code, 403);
}

fn admit_in(namespace: &str, raw: &Value, context: &Context) -> (Verdict, Value) {
    admit_in_with(namespace, raw, context, &provider_config())
}

/// A policy Vast.ai accepts the test pod under (any region).
fn provider_config() -> PolicyConfig {
    PolicyConfig {
        vastai: runpod_contract::vastai::VastPolicy::from_flags(
            &[],
            &[],
            false,
            false,
            0.0,
            Some(0.5),
        )
        .unwrap(),
        ..config()
    }
}

/// Issue 41, item 8: whoever may label a namespace cannot send its pods to another team's
/// node: the label only chooses among the nodes that serve the namespace.
#[test]
fn a_namespace_label_naming_another_teams_node_is_refused() {
    let mut context = labelled_namespace();
    context.served = teams();
    context
        .namespace_labels
        .insert(NODE_LABEL.to_owned(), "team-b-node".to_owned());
    let always = annotate(gpu_pod(), contract::BURST_MODE, "always");
    let (code, message) = denied(&admit_in("other", &always, &context).0);
    assert_eq!(code, 403);
    assert!(
        message.contains("serves only namespaces vision"),
        "{message}"
    );
    // A namespace another team's node lists cannot be taken by a label either.
    let (code, message) = denied(&admit_in("ml", &always, &context).0);
    assert_eq!(code, 403);
    assert!(message.contains("team-a-node"), "{message}");
    // The label still picks a node that serves the namespace.
    context
        .namespace_labels
        .insert(NODE_LABEL.to_owned(), "team-a-node".to_owned());
    let (verdict, patched) = admit_in("ml", &always, &context);
    assert_bursts(&verdict);
    assert_eq!(
        terms(&patched)[0]["matchExpressions"][0],
        hostname_term(&["team-a-node"])
    );
}
