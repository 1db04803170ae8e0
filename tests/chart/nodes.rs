//! Several virtual nodes in one install (`nodes`): one more controller Deployment, metrics
//! Service and pre-delete drain Job per entry, with its provider's key, its own ports and pod
//! labels, and the one Vast.ai policy (`vastai`) shared by the webhook and every controller.

use serde_json::Value;

use super::{helm, of_kind, render};

/// The string arguments of an object's first container.
fn args_of(object: &Value) -> Vec<String> {
    object["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

fn named<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    of_kind(objects, kind)
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// Two more nodes: a Vast.ai one with its own ports and a second RunPod one.
const TWO_NODES: [&str; 9] = [
    "runpod.apiKey=k",
    "vastai.apiKey=vk",
    "vastai.regions={Europe,North America}",
    "nodes[0].name=virtual-vastai",
    "nodes[0].provider=vastai",
    "nodes[0].kubeletPort=10251",
    "nodes[0].metricsPort=9091",
    "nodes[1].name=virtual-runpod-2",
    "nodes[1].provider=runpod",
];

#[test]
fn each_extra_node_gets_its_own_controller_key_ports_and_drain() {
    let objects = render(&TWO_NODES);
    let names: Vec<&str> = of_kind(&objects, "Deployment")
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
    let main = args_of(named(&objects, "Deployment", "r-runpod-kubelet-controller"));
    for (node, provider, secret, var, ports) in [
        (
            "virtual-vastai",
            "vastai",
            "r-runpod-kubelet-vastai",
            "VAST_API_KEY",
            ("10251", "0.0.0.0:9091"),
        ),
        (
            "virtual-runpod-2",
            "runpod",
            "r-runpod-kubelet-runpod",
            "RUNPOD_API_KEY",
            ("10250", "0.0.0.0:9090"),
        ),
    ] {
        let name = format!("r-runpod-kubelet-controller-{node}");
        let deployment = named(&objects, "Deployment", &name);
        let args = args_of(deployment);
        assert_eq!(args[0], "controller", "{args:?}");
        assert_eq!(flag(&args, "--provider"), Some(provider), "{args:?}");
        assert_eq!(flag(&args, "--nodename"), Some(node), "{args:?}");
        assert_eq!(flag(&args, "--kubelet-port"), Some(ports.0), "{args:?}");
        assert_eq!(flag(&args, "--metrics-listen"), Some(ports.1), "{args:?}");
        let url = if provider == "vastai" {
            "--vastai-api-url"
        } else {
            "--runpod-api-url"
        };
        assert!(flag(&args, url).is_some(), "{args:?}");
        // The shared flags are the default controller's.
        for shared in [
            "--reconcile-interval",
            "--max-gpu-price",
            "--leader-elect-lease-duration",
        ] {
            assert_eq!(flag(&args, shared), flag(&main, shared), "{shared}");
        }
        assert!(args.contains(&"--leader-elect=true".to_owned()));
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let key = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == var)
            .unwrap_or_else(|| panic!("{node}: no {var}"));
        assert_eq!(key["valueFrom"]["secretKeyRef"]["name"], secret);
        assert_eq!(key["valueFrom"]["secretKeyRef"]["key"], var);
        let ports_of: Vec<String> = container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["containerPort"].to_string())
            .collect();
        assert_eq!(ports_of, [ports.0, &ports.1[8..]], "{node}");
        assert_eq!(
            deployment["spec"]["template"]["spec"]["serviceAccountName"],
            "r-runpod-kubelet-controller",
            "every controller shares the account"
        );
        let service = named(&objects, "Service", &format!("{name}-metrics"));
        assert_eq!(
            service["spec"]["ports"][0]["port"].to_string(),
            &ports.1[8..]
        );

        // Its own drain, before uninstall, with the same key.
        let drain = named(&objects, "Job", &format!("{name}-drain"));
        assert_eq!(
            drain["metadata"]["annotations"]["helm.sh/hook"],
            "pre-delete"
        );
        let args = args_of(drain);
        assert_eq!(args[..2], ["controller", "drain"], "{args:?}");
        assert_eq!(flag(&args, "--provider"), Some(provider), "{args:?}");
        assert_eq!(flag(&args, "--nodename"), Some(node), "{args:?}");
        assert!(flag(&args, url).is_some(), "{args:?}");
        let env = drain["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
        assert!(env.contains(var) && env.contains(secret), "{env}");
    }
    let drains = of_kind(&objects, "Job")
        .into_iter()
        .filter(|j| j["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete")
        .count();
    assert_eq!(drains, 3, "one drain per node");
    let secret = named(&objects, "Secret", "r-runpod-kubelet-vastai");
    assert_eq!(secret["data"]["VAST_API_KEY"], "dms=");

    // One Vast.ai policy: the webhook and every controller get the same flags.
    let webhook = args_of(named(&objects, "Deployment", "r-runpod-kubelet-webhook"));
    for deployment in of_kind(&objects, "Deployment") {
        let args = args_of(deployment);
        assert_eq!(
            flag(&args, "--vastai-regions"),
            Some("Europe,North America"),
            "{}",
            deployment["metadata"]["name"]
        );
        let policy = |args: &[String]| -> Vec<String> {
            args.iter()
                .enumerate()
                .filter(|(_, a)| a.starts_with("--vastai-") && *a != "--vastai-api-url")
                .flat_map(|(i, a)| [a.clone(), args.get(i + 1).cloned().unwrap_or_default()])
                .collect()
        };
        assert_eq!(policy(&args), policy(&webhook));
    }
}

/// Every Service and the controllers' Deployments select the pods of exactly one Deployment:
/// no node's metrics (or replicas) mix with another's.
#[test]
fn no_two_nodes_select_each_others_pods() {
    let objects = render(&TWO_NODES);
    let deployments = of_kind(&objects, "Deployment");
    let matches = |selector: &Value| -> Vec<&str> {
        deployments
            .iter()
            .filter(|d| {
                selector
                    .as_object()
                    .unwrap()
                    .iter()
                    .all(|(k, v)| &d["spec"]["template"]["metadata"]["labels"][k] == v)
            })
            .map(|d| d["metadata"]["name"].as_str().unwrap())
            .collect()
    };
    for service in of_kind(&objects, "Service") {
        let selected = matches(&service["spec"]["selector"]);
        assert_eq!(
            selected.len(),
            1,
            "{}: {selected:?}",
            service["metadata"]["name"]
        );
    }
    for deployment in &deployments {
        let selected = matches(&deployment["spec"]["selector"]["matchLabels"]);
        assert_eq!(selected, [deployment["metadata"]["name"].as_str().unwrap()]);
    }
    // Monitoring and the NetworkPolicy cover the extra controllers too.
    let mut sets = TWO_NODES.to_vec();
    sets.extend([
        "monitoring.serviceMonitor.enabled=true",
        "networkPolicy.enabled=true",
    ]);
    let objects = render(&sets);
    let services = of_kind(&objects, "Service");
    for node in ["virtual-vastai", "virtual-runpod-2"] {
        let name = format!("r-runpod-kubelet-controller-{node}");
        let service = named(&objects, "Service", &format!("{name}-metrics"));
        let monitors = of_kind(&objects, "ServiceMonitor")
            .into_iter()
            .filter(|m| {
                m["spec"]["selector"]["matchLabels"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .all(|(k, v)| &service["metadata"]["labels"][k] == v)
            })
            .count();
        assert_eq!(monitors, 1, "{node}: scraped by one ServiceMonitor");
        let pods = &named(&objects, "Deployment", &name)["spec"]["template"]["metadata"];
        let policies = of_kind(&objects, "NetworkPolicy")
            .into_iter()
            .filter(|p| {
                p["spec"]["podSelector"]["matchLabels"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .all(|(k, v)| &pods["labels"][k] == v)
            })
            .count();
        assert_eq!(policies, 1, "{node}: one NetworkPolicy");
    }
    assert_eq!(services.len(), 4, "webhook and three controllers' metrics");
}

#[test]
fn bad_nodes_and_policies_are_refused() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["nodes[0].name=n", "nodes[0].provider=aws"],
            "/nodes/0/provider",
        ),
        (&["nodes[0].provider=runpod"], "name"),
        (
            &["nodes[0].name=Not_A_Label", "nodes[0].provider=runpod"],
            "/nodes/0/name",
        ),
        (
            &["nodes[0].name=virtual-runpod", "nodes[0].provider=runpod"],
            "used twice",
        ),
        (
            &["vastai.regions={Europe}", "vastai.countries={DE}"],
            "not both",
        ),
        // A namespace's pods run on one node: two nodes listing it would bill either key.
        (
            &[
                "nodeNamespaces={team-a}",
                "nodes[0].name=team-a-node",
                "nodes[0].provider=runpod",
                "nodes[0].namespaces={team-a}",
            ],
            "listed by nodes virtual-runpod and team-a-node",
        ),
    ];
    super::assert_refused(&cases);
    // A Vast.ai node needs a key.
    let out = helm(&[
        "template",
        "r",
        "charts/runpod-kubelet",
        "--set",
        "runpod.apiKey=k",
        "--set",
        "nodes[0].name=v",
        "--set",
        "nodes[0].provider=vastai",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("vastai.apiKey"));
}

/// `nodes: []` (the default) renders nothing of the feature, not even with monitoring and the
/// NetworkPolicy on; the Vast.ai policy flags appear only when they differ from the binary's.
#[test]
fn without_nodes_nothing_new_renders() {
    let objects = render(&[
        "runpod.apiKey=k",
        "monitoring.serviceMonitor.enabled=true",
        "networkPolicy.enabled=true",
    ]);
    let text = serde_json::to_string(&objects).unwrap();
    for absent in [
        "node-controller",
        "runpod.io/node",
        "--provider",
        "--vastai",
        "-vastai",
    ] {
        assert!(!text.contains(absent), "{absent} rendered without nodes");
    }
    assert_eq!(of_kind(&objects, "Deployment").len(), 2);
    assert_eq!(of_kind(&objects, "ServiceMonitor").len(), 2);
    assert_eq!(of_kind(&objects, "NetworkPolicy").len(), 2);

    let objects = render(&[
        "runpod.apiKey=k",
        "vastai.countries={DE,FR}",
        "vastai.datacenterOnly=true",
        "vastai.verifiedOnly=false",
        "vastai.minReliability=0.9",
    ]);
    for name in ["r-runpod-kubelet-webhook", "r-runpod-kubelet-controller"] {
        let args = args_of(named(&objects, "Deployment", name));
        assert_eq!(flag(&args, "--vastai-countries"), Some("DE,FR"), "{name}");
        assert_eq!(
            flag(&args, "--vastai-min-reliability"),
            Some("0.9"),
            "{name}"
        );
        assert!(args.contains(&"--vastai-datacenter-only=true".to_owned()));
        assert!(args.contains(&"--vastai-verified-only=false".to_owned()));
    }
}

/// A node per team (`nodes[].namespaces`, `nodeNamespaces`) reaches each controller as
/// `--serve-namespaces`, the default budget reaches the webhook and every controller, and both
/// may read the budget ledgers in the release namespace only (the controllers also write them).
#[test]
fn a_node_per_team_and_the_default_budget_reach_every_component() {
    let objects = render(&[
        "runpod.apiKey=k",
        "nodeNamespaces={shared-a,shared-b}",
        "defaultBudgetPerHour=20",
        "nodes[0].name=team-b-node",
        "nodes[0].provider=runpod",
        "nodes[0].existingSecret=team-b-key",
        "nodes[0].namespaces={team-b}",
    ]);
    let main = args_of(named(&objects, "Deployment", "r-runpod-kubelet-controller"));
    assert_eq!(flag(&main, "--serve-namespaces"), Some("shared-a,shared-b"));
    let team = args_of(named(
        &objects,
        "Deployment",
        "r-runpod-kubelet-controller-team-b-node",
    ));
    assert_eq!(flag(&team, "--serve-namespaces"), Some("team-b"));
    let webhook = args_of(named(&objects, "Deployment", "r-runpod-kubelet-webhook"));
    for args in [&main, &team, &webhook] {
        assert_eq!(flag(args, "--default-budget-per-hour"), Some("20"));
        // Every component knows every binding, even of a node that is not registered.
        assert_eq!(
            flag(args, "--namespace-nodes"),
            Some(
                "shared-a=virtual-runpod@runpod,shared-b=virtual-runpod@runpod,team-b=team-b-node@runpod"
            )
        );
    }
    for (role, verbs) in [
        (
            "r-runpod-kubelet-controller-budgets",
            vec!["get", "list", "create", "update"],
        ),
        ("r-runpod-kubelet-webhook-budgets", vec!["get"]),
    ] {
        let role = named(&objects, "Role", role);
        assert_eq!(role["metadata"]["namespace"], "runpod-system");
        assert_eq!(
            role["rules"][0]["resources"],
            serde_json::json!(["configmaps"])
        );
        assert_eq!(role["rules"][0]["verbs"], serde_json::json!(verbs));
    }

    // Without them, no flag.
    let objects = render(&["runpod.apiKey=k"]);
    let main = args_of(named(&objects, "Deployment", "r-runpod-kubelet-controller"));
    assert_eq!(flag(&main, "--serve-namespaces"), None);
    assert_eq!(flag(&main, "--default-budget-per-hour"), None);
    assert_eq!(flag(&main, "--namespace-nodes"), None);
    // A budget that is not a number is refused at install, naming the value.
    super::assert_refused(&[(&["defaultBudgetPerHour=lots"], "/defaultBudgetPerHour")]);
}
