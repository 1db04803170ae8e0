//! The values a platform team sets on an ordinary company cluster, each checked where it must
//! land: on every object, every pod (controllers, webhook, hook Jobs, the CronJob), every
//! container, every ServiceAccount; a Vast.ai-only install; a node's own policy; the Go
//! kubelet chart's value names; the cloud proxy and CA bundle.

use serde_json::Value;

use super::{helm, of_kind, render};

/// `helm template` with a values file (YAML) besides a RunPod key.
fn render_values(values: &str) -> Result<Vec<Value>, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let out = helm(&[
        "template",
        "r",
        "charts/runpod-kubelet",
        "--namespace",
        "runpod-system",
        "-f",
        file.to_str().unwrap(),
    ]);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).unwrap();
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
        let value = serde_json::to_value(value).unwrap();
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// Every pod template the chart renders, with its owner's kind and name.
fn pod_templates(objects: &[Value]) -> Vec<(String, &Value)> {
    let mut pods = Vec::new();
    for object in objects {
        let name = format!("{}/{}", object["kind"], object["metadata"]["name"]);
        match object["kind"].as_str() {
            Some("Deployment" | "Job") => pods.push((name, &object["spec"]["template"])),
            Some("CronJob") => {
                pods.push((name, &object["spec"]["jobTemplate"]["spec"]["template"]))
            }
            _ => {}
        }
    }
    pods
}

fn args_of(pod: &Value) -> Vec<String> {
    pod["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().rposition(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

fn named<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

const PLATFORM: &str = r#"
runpod: {apiKey: k}
vastai: {apiKey: vk}
nodes: [{name: virtual-vastai, provider: vastai, kubeletPort: 10251, metricsPort: 9091}]
commonLabels: {team: platform}
podLabels: {cost-center: gpu}
priorityClassName: system-cluster-critical
extraEnv: [{name: EXTRA, value: "1"}]
extraEnvFrom: [{configMapRef: {name: extra-env}}]
extraVolumes: [{name: extra, emptyDir: {}}]
extraVolumeMounts: [{name: extra, mountPath: /extra}]
serviceAccount: {annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::1:role/r"}}
jobs:
  nodeSelector: {pool: system}
  tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [system]}]}]}}}
  resources: {requests: {cpu: 20m}}
certs: {}
webhook:
  hostNetwork: true
  topologySpreadConstraints: [{maxSkew: 2, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: x}}}]
  readinessProbe: {periodSeconds: 7, timeoutSeconds: 3}
  livenessProbe: {periodSeconds: 11, failureThreshold: 9}
  service: {annotations: {cloud.google.com/neg: '{"ingress": false}'}}
controller:
  hostNetwork: true
  kubeletPort: 10260
  dnsPolicy: Default
  topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: y}}}]
  readinessProbe: {timeoutSeconds: 4}
  livenessProbe: {periodSeconds: 13}
  service: {annotations: {prometheus.io/scrape: "true"}}
  extraArgs: [--max-gpu-price, "1.0"]
"#;

#[test]
fn platform_values_land_on_every_object_pod_and_container() {
    let objects = render_values(PLATFORM).unwrap();
    for object in &objects {
        assert_eq!(
            object["metadata"]["labels"]["team"], "platform",
            "{} {} lacks commonLabels",
            object["kind"], object["metadata"]["name"]
        );
    }
    let pods = pod_templates(&objects);
    // Two controllers, the webhook, two drains, two key checks, two certs Jobs, the CronJob.
    assert_eq!(
        pods.len(),
        10,
        "{:?}",
        pods.iter().map(|p| &p.0).collect::<Vec<_>>()
    );
    for (owner, pod) in &pods {
        assert_eq!(pod["metadata"]["labels"]["cost-center"], "gpu", "{owner}");
        let spec = &pod["spec"];
        assert_eq!(
            spec["priorityClassName"], "system-cluster-critical",
            "{owner}"
        );
        let container = &spec["containers"][0];
        let env = container["env"].as_array().unwrap();
        assert!(env.iter().any(|e| e["name"] == "EXTRA"), "{owner}");
        assert_eq!(
            container["envFrom"][0]["configMapRef"]["name"], "extra-env",
            "{owner}"
        );
        assert!(
            container["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["mountPath"] == "/extra"),
            "{owner}"
        );
        assert!(
            spec["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == "extra"),
            "{owner}"
        );
        // Hardened as before, whatever else is set.
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{owner}");
        assert_eq!(
            container["securityContext"]["readOnlyRootFilesystem"], true,
            "{owner}"
        );
        let job = !owner.starts_with("\"Deployment\"");
        if job {
            assert_eq!(spec["nodeSelector"]["pool"], "system", "{owner}");
            assert_eq!(spec["tolerations"][0]["key"], "dedicated", "{owner}");
            assert!(spec["affinity"]["nodeAffinity"].is_object(), "{owner}");
            assert_eq!(container["resources"]["requests"]["cpu"], "20m", "{owner}");
            assert!(spec.get("hostNetwork").is_none(), "{owner}");
        } else {
            assert_eq!(spec["hostNetwork"], true, "{owner}");
        }
    }
    for account in of_kind(&objects, "ServiceAccount") {
        assert_eq!(
            account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
            "arn:aws:iam::1:role/r"
        );
    }

    let webhook = &named(&objects, "Deployment", "r-runpod-kubelet-webhook")["spec"]["template"];
    assert_eq!(webhook["spec"]["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(
        webhook["spec"]["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    let probe = &webhook["spec"]["containers"][0]["readinessProbe"];
    assert_eq!(
        (
            probe["periodSeconds"].as_u64(),
            probe["timeoutSeconds"].as_u64()
        ),
        (Some(7), Some(3))
    );
    assert_eq!(probe["httpGet"]["path"], "/readyz");
    let probe = &webhook["spec"]["containers"][0]["livenessProbe"];
    assert_eq!(
        (
            probe["periodSeconds"].as_u64(),
            probe["failureThreshold"].as_u64()
        ),
        (Some(11), Some(9))
    );
    let service = named(&objects, "Service", "r-runpod-kubelet-webhook");
    assert_eq!(
        service["metadata"]["annotations"]["cloud.google.com/neg"],
        "{\"ingress\": false}"
    );

    for name in [
        "r-runpod-kubelet-controller",
        "r-runpod-kubelet-controller-virtual-vastai",
    ] {
        let pod = &named(&objects, "Deployment", name)["spec"]["template"];
        assert_eq!(pod["spec"]["dnsPolicy"], "Default", "{name}");
        assert_eq!(
            pod["spec"]["topologySpreadConstraints"][0]["maxSkew"], 1,
            "{name}"
        );
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["readinessProbe"]["timeoutSeconds"], 4, "{name}");
        assert_eq!(container["livenessProbe"]["periodSeconds"], 13, "{name}");
        let service = named(&objects, "Service", &format!("{name}-metrics"));
        assert_eq!(
            service["metadata"]["annotations"]["prometheus.io/scrape"],
            "true"
        );
    }
    // extraArgs come after what the chart sets: the binary takes the last (tests/cli.rs).
    let controller =
        &named(&objects, "Deployment", "r-runpod-kubelet-controller")["spec"]["template"];
    let args = args_of(controller);
    let prices: Vec<usize> = args
        .iter()
        .enumerate()
        .filter(|(_, a)| *a == "--max-gpu-price")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(prices.len(), 2, "{args:?}");
    assert_eq!(args[prices[1] + 1], "1.0");
    assert_eq!(prices[1] + 2, args.len(), "extraArgs are last: {args:?}");
}

/// `controller.exposePorts` reaches the webhook and every controller alike (auto by default).
#[test]
fn expose_ports_reaches_the_webhook_and_every_controller() {
    for (value, expected) in [(None, "auto"), (Some("none"), "none")] {
        let mut values =
            "runpod: {apiKey: k}\nvastai: {apiKey: v}\nnodes: [{name: vast, provider: vastai}]\n"
                .to_owned();
        if let Some(value) = value {
            values.push_str(&format!("controller: {{exposePorts: {value}}}\n"));
        }
        let objects = render_values(&values).unwrap();
        let deployments = of_kind(&objects, "Deployment");
        assert_eq!(deployments.len(), 3);
        for deployment in deployments {
            let args = args_of(&deployment["spec"]["template"]);
            assert_eq!(flag(&args, "--expose-ports"), Some(expected), "{args:?}");
        }
    }
    let error =
        render_values("runpod: {apiKey: k}\ncontroller: {exposePorts: some}\n").unwrap_err();
    assert!(error.contains("/controller/exposePorts"), "{error}");
}

/// `runpod.allowedCloudTypes` (default SECURE only: COMMUNITY hosts are third parties) reaches
/// the webhook, which refuses other tiers, and every controller, which never buys them.
#[test]
fn allowed_cloud_types_reach_the_webhook_and_every_controller() {
    for (value, expected) in [
        (None, "SECURE"),
        (Some("[SECURE, COMMUNITY]"), "SECURE,COMMUNITY"),
    ] {
        let mut values =
            "vastai: {apiKey: v}\nnodes: [{name: vast, provider: vastai}]\n".to_owned();
        match value {
            Some(value) => values.push_str(&format!(
                "runpod: {{apiKey: k, allowedCloudTypes: {value}}}\n"
            )),
            None => values.push_str("runpod: {apiKey: k}\n"),
        }
        let objects = render_values(&values).unwrap();
        let deployments = of_kind(&objects, "Deployment");
        assert_eq!(deployments.len(), 3);
        for deployment in deployments {
            let args = args_of(&deployment["spec"]["template"]);
            assert_eq!(
                flag(&args, "--allowed-cloud-types"),
                Some(expected),
                "{args:?}"
            );
        }
    }
    for wrong in ["[STANDARD]", "[]"] {
        let error = render_values(&format!(
            "runpod: {{apiKey: k, allowedCloudTypes: {wrong}}}\n"
        ))
        .unwrap_err();
        assert!(error.contains("/runpod/allowedCloudTypes"), "{error}");
    }
}

/// `controller.acceptSeedTolerations` reaches the webhook and every controller; off, none.
#[test]
fn seed_tolerations_are_accepted_only_when_asked() {
    let on = render_values(
        "runpod: {apiKey: k}\nvastai: {apiKey: v}\nnodes: [{name: vast, provider: vastai}]\ncontroller: {acceptSeedTolerations: true}\n",
    )
    .unwrap();
    let deployments = of_kind(&on, "Deployment");
    assert_eq!(deployments.len(), 3);
    for deployment in deployments {
        let args = args_of(&deployment["spec"]["template"]);
        assert!(
            args.contains(&"--accept-seed-tolerations".to_owned()),
            "{args:?}"
        );
    }
    let off = render_values("runpod: {apiKey: k}\n").unwrap();
    assert!(
        !serde_json::to_string(&off)
            .unwrap()
            .contains("--accept-seed-tolerations")
    );
}

#[test]
fn a_host_network_controller_may_not_take_the_kubelets_port() {
    let error =
        render_values("runpod: {apiKey: k}\ncontroller: {hostNetwork: true}\n").unwrap_err();
    assert!(
        error.contains("kubeletPort 10250") && error.contains("controller.kubeletPort"),
        "{error}"
    );
}

#[test]
fn a_service_account_of_your_own_runs_every_component() {
    let objects =
        render_values("runpod: {apiKey: k}\nserviceAccount: {create: false, name: gpu-burst}\n")
            .unwrap();
    assert!(of_kind(&objects, "ServiceAccount").is_empty());
    for (owner, pod) in pod_templates(&objects) {
        assert_eq!(pod["spec"]["serviceAccountName"], "gpu-burst", "{owner}");
    }
    for binding in of_kind(&objects, "RoleBinding")
        .into_iter()
        .chain(of_kind(&objects, "ClusterRoleBinding"))
    {
        assert_eq!(
            binding["subjects"][0]["name"], "gpu-burst",
            "{}",
            binding["metadata"]["name"]
        );
    }
    let error =
        render_values("runpod: {apiKey: k}\nserviceAccount: {create: false}\n").unwrap_err();
    assert!(error.contains("serviceAccount.name"), "{error}");
}

#[test]
fn a_vastai_only_install_has_no_runpod_node_or_key() {
    let objects = render_values(
        "runpod: {enabled: false}\nvastai: {apiKey: vk}\nnodes: [{name: virtual-vastai, provider: vastai}]\n",
    )
    .unwrap();
    let names: Vec<String> = objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        !names.contains(&"Secret/r-runpod-kubelet-runpod".to_owned()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"Deployment/r-runpod-kubelet-controller".to_owned()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"Job/r-runpod-kubelet-controller-drain".to_owned()),
        "{names:?}"
    );
    assert!(names.contains(&"Deployment/r-runpod-kubelet-controller-virtual-vastai".to_owned()));
    assert!(names.contains(&"Job/r-runpod-kubelet-controller-virtual-vastai-drain".to_owned()));
    let webhook = &named(&objects, "Deployment", "r-runpod-kubelet-webhook")["spec"]["template"];
    assert_eq!(flag(&args_of(webhook), "--clouds"), Some("vastai"));
    for pod in pod_templates(&objects) {
        let env = pod.1["spec"]["containers"][0]["env"].to_string();
        assert!(!env.contains("RUNPOD_API_KEY"), "{}: {env}", pod.0);
    }

    let error = render_values("runpod: {enabled: false}\n").unwrap_err();
    assert!(
        error.contains("runpod.enabled is false and nodes lists no node"),
        "{error}"
    );
    let error =
        render_values("runpod: {enabled: false}\nnodes: [{name: second, provider: runpod}]\n")
            .unwrap_err();
    assert!(
        error.contains("\"second\" is a RunPod node but runpod.enabled is false"),
        "{error}"
    );
}

#[test]
fn a_node_sets_its_own_price_cap_datacenters_and_vastai_policy() {
    let objects = render_values(
        r#"
runpod: {apiKey: k, maxGpuPrice: 0.8, datacenterIds: [EU-RO-1, US-TX-3]}
vastai: {apiKey: vk, regions: [Europe, North America], verifiedOnly: true}
nodes:
  - {name: cheap, provider: runpod, maxGpuPrice: 0.3, datacenterIds: [US-TX-3]}
  - {name: vast-na, provider: vastai, vastai: {regions: [North America], verifiedOnly: false}}
"#,
    )
    .unwrap();
    let args = |name: &str| args_of(&named(&objects, "Deployment", name)["spec"]["template"]);
    let default = args("r-runpod-kubelet-controller");
    assert_eq!(flag(&default, "--max-gpu-price"), Some("0.8"));
    assert_eq!(flag(&default, "--datacenter-ids"), Some("EU-RO-1,US-TX-3"));
    let cheap = args("r-runpod-kubelet-controller-cheap");
    assert_eq!(flag(&cheap, "--max-gpu-price"), Some("0.3"));
    assert_eq!(flag(&cheap, "--datacenter-ids"), Some("US-TX-3"));
    let vast = args("r-runpod-kubelet-controller-vast-na");
    assert_eq!(flag(&vast, "--vastai-regions"), Some("North America"));
    assert!(
        vast.contains(&"--vastai-verified-only=false".to_owned()),
        "{vast:?}"
    );
    // The webhook keeps the installation-wide policy.
    let webhook = args("r-runpod-kubelet-webhook");
    assert_eq!(flag(&webhook, "--max-gpu-price"), Some("0.8"));
    assert_eq!(
        flag(&webhook, "--vastai-regions"),
        Some("Europe,North America")
    );
    assert_eq!(flag(&webhook, "--clouds"), Some("runpod,vastai"));

    let error = render_values(
        "runpod: {apiKey: k, maxGpuPrice: 0.5}\nnodes: [{name: dear, provider: runpod, maxGpuPrice: 2}]\n",
    )
    .unwrap_err();
    assert!(error.contains("above runpod.maxGpuPrice"), "{error}");
    // A node narrows the installation's places, never widens them.
    let error = render_values(
        "runpod: {apiKey: k, datacenterIds: [EU-RO-1]}\nnodes: [{name: far, provider: runpod, datacenterIds: [US-TX-3]}]\n",
    )
    .unwrap_err();
    assert!(error.contains("datacenter US-TX-3"), "{error}");
    let error = render_values(
        "runpod: {apiKey: k}\nvastai: {apiKey: v, regions: [Europe]}\nnodes: [{name: far, provider: vastai, vastai: {regions: [Asia]}}]\n",
    )
    .unwrap_err();
    assert!(error.contains("vastai.regions Asia"), "{error}");
}

#[test]
fn the_go_kubelet_charts_values_are_read_or_refused_by_name() {
    let objects = render(&[
        "runpod.apiKey=k",
        "kubelet.reconcileInterval=30",
        "kubelet.maxGpuPrice=0.4",
        "cluster.identifier=prod-eu",
    ]);
    let controller =
        args_of(&named(&objects, "Deployment", "r-runpod-kubelet-controller")["spec"]["template"]);
    assert_eq!(flag(&controller, "--reconcile-interval"), Some("30"));
    assert_eq!(flag(&controller, "--max-gpu-price"), Some("0.4"));
    assert_eq!(flag(&controller, "--cluster-id"), Some("prod-eu"));
    let webhook =
        args_of(&named(&objects, "Deployment", "r-runpod-kubelet-webhook")["spec"]["template"]);
    assert_eq!(flag(&webhook, "--max-gpu-price"), Some("0.4"));

    // A namespace other than the Go chart's default (and the release's) is refused by name.
    let error =
        render_values("runpod: {apiKey: k}\nkubelet: {namespace: gpu-system}\n").unwrap_err();
    assert!(error.contains("helm --namespace gpu-system"), "{error}");
    // The Go kubelet's image does not run this chart.
    let error = render_values(
        "runpod: {apiKey: k}\nimage: {repository: ghcr.io/bsvogler/runpod-kubelet, tag: latest}\n",
    )
    .unwrap_err();
    assert!(error.contains("the Go kubelet's image"), "{error}");
}

/// The Go kubelet chart's own default values.yaml installs: its pod settings reach the
/// controller, and what this chart does not use is named in NOTES.txt, not refused.
#[test]
fn the_go_kubelet_charts_default_values_install() {
    let go = std::fs::read_to_string("tests/chart/go-kubelet-values.yaml").unwrap();
    let objects = render_values(&go).unwrap();
    let controller = named(&objects, "Deployment", "r-runpod-kubelet-controller");
    assert_eq!(controller["spec"]["replicas"], 1);
    assert_eq!(
        controller["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"],
        "256Mi"
    );
    assert_eq!(
        flag(
            &args_of(&controller["spec"]["template"]),
            "--reconcile-interval"
        ),
        Some("30")
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, &go).unwrap();
    let out = helm(&[
        "install",
        "r",
        "charts/runpod-kubelet",
        "--namespace",
        "runpod-system",
        "--dry-run=client",
        "-f",
        file.to_str().unwrap(),
    ]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains(
            "values of the Go kubelet's chart that this chart ignores: health, \
             conduit, livenessProbe, readinessProbe, kubelet.healthServerAddress, \
             kubelet.namespace"
        ),
        "{printed}"
    );
    // Our own values name nothing of the kind.
    let out = helm(&[
        "install",
        "r",
        "charts/runpod-kubelet",
        "--namespace",
        "runpod-system",
        "--dry-run=client",
        "--set",
        "runpod.apiKey=k",
    ]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("Go kubelet's chart"));
}

#[test]
fn the_cloud_proxy_and_ca_bundle_reach_the_controllers_and_drains_only() {
    let objects = render_values(
        r#"
runpod: {apiKey: k}
cloud:
  proxy: {httpsProxy: "http://proxy.corp:3128", noProxy: "10.0.0.0/8,.svc,kubernetes.default"}
  caBundle: {existingConfigMap: corp-roots, key: roots.pem}
"#,
    )
    .unwrap();
    for (owner, pod) in pod_templates(&objects) {
        let container = &pod["spec"]["containers"][0];
        let env = container["env"].as_array().unwrap();
        let value = |name: &str| {
            env.iter()
                .find(|e| e["name"] == name)
                .map(|e| e["value"].clone())
        };
        let cloud = owner.contains("controller");
        if cloud {
            assert_eq!(
                value("HTTPS_PROXY"),
                Some("http://proxy.corp:3128".into()),
                "{owner}"
            );
            assert_eq!(
                value("NO_PROXY"),
                Some("10.0.0.0/8,.svc,kubernetes.default".into()),
                "{owner}"
            );
            assert_eq!(
                value("RUNPOD_KUBELET_CLOUD_CA_FILE"),
                Some("/etc/runpod-kubelet/cloud-ca/roots.pem".into()),
                "{owner}"
            );
            assert_eq!(
                pod["spec"]["volumes"][0]["configMap"]["name"], "corp-roots",
                "{owner}"
            );
            assert_eq!(
                container["volumeMounts"][0]["mountPath"],
                "/etc/runpod-kubelet/cloud-ca"
            );
        } else {
            assert_eq!(value("HTTPS_PROXY"), None, "{owner}");
        }
    }
    let error = render_values(
        "runpod: {apiKey: k}\ncloud: {caBundle: {existingSecret: a, existingConfigMap: b}}\n",
    )
    .unwrap_err();
    assert!(error.contains("not both"), "{error}");
}

/// The chart says which Kubernetes it needs, and its default image is the one the release
/// workflow pushes.
#[test]
fn the_chart_states_its_kubernetes_and_names_the_released_image() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let chart = std::fs::read_to_string(root.join("charts/runpod-kubelet/Chart.yaml")).unwrap();
    assert!(
        chart
            .lines()
            .any(|l| l.starts_with("kubeVersion: \">=1.20")),
        "{chart}"
    );
    let values = std::fs::read_to_string(root.join("charts/runpod-kubelet/values.yaml")).unwrap();
    let repository = values
        .lines()
        .find_map(|l| l.trim().strip_prefix("repository: "))
        .unwrap();
    let workflow = std::fs::read_to_string(root.join(".github/workflows/release.yml")).unwrap();
    assert!(
        workflow.contains(&format!("IMAGE: {repository}\n")),
        "{workflow}"
    );
    assert!(workflow.contains("platforms: linux/amd64,linux/arm64"));
    assert!(workflow.contains("helm push"));
}

/// The project's home is one address, named where users look: the chart's `home` and
/// `sources`, the README, SECURITY.md (where to report privately); the released image lives
/// under the same owner.
#[test]
fn the_project_home_is_named_where_users_look() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    let chart = read("charts/runpod-kubelet/Chart.yaml");
    let home = chart
        .lines()
        .find_map(|l| l.strip_prefix("home: "))
        .expect("Chart.yaml names a home")
        .trim()
        .to_owned();
    assert!(chart.contains(&format!("sources: [{home}]")), "{chart}");
    for file in ["README.md", "SECURITY.md"] {
        assert!(read(file).contains(&home), "{file} does not name {home}");
    }
    let owner = home
        .strip_prefix("https://github.com/")
        .and_then(|rest| rest.split('/').next())
        .unwrap();
    let values = read("charts/runpod-kubelet/values.yaml");
    assert!(
        values.contains(&format!("repository: ghcr.io/{owner}/")),
        "the image is not published under {owner}"
    );
}

/// The pre-install check of each node's key: one Job per node (the RunPod default node and each
/// `nodes` entry) with that node's key; a key the chart stores itself comes from a hook Secret
/// that exists only while the hooks run (the release's Secret is not there yet), an existing
/// Secret is read directly; no token is mounted; `controller.checkKey.enabled: false` renders none.
#[test]
fn each_nodes_key_is_checked_before_install() {
    let objects = render_values(
        r#"
runpod: {apiKey: k}
vastai: {existingSecret: vast-key, existingSecretKey: token}
nodes: [{name: vast, provider: vastai}]
"#,
    )
    .unwrap();
    let jobs: Vec<&Value> = of_kind(&objects, "Job")
        .into_iter()
        .filter(|j| {
            j["metadata"]["name"]
                .as_str()
                .unwrap()
                .ends_with("-check-key")
        })
        .collect();
    assert_eq!(jobs.len(), 2);
    for job in &jobs {
        assert_eq!(
            job["metadata"]["annotations"]["helm.sh/hook"],
            "pre-install,pre-upgrade"
        );
        assert_eq!(
            job["spec"]["template"]["spec"]["automountServiceAccountToken"],
            false
        );
    }
    let runpod = named(&objects, "Job", "r-runpod-kubelet-controller-check-key");
    let pod = &runpod["spec"]["template"];
    let args = args_of(pod);
    assert_eq!(&args[..2], ["controller", "check-key"]);
    // The default node, as its controller: no --provider (RunPod).
    assert_eq!(flag(&args, "--provider"), None);
    assert_eq!(
        flag(&args, "--api-key-secret"),
        Some("runpod-system/r-runpod-kubelet-runpod (key RUNPOD_API_KEY)")
    );
    let key = &pod["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "RUNPOD_API_KEY")
        .unwrap()["valueFrom"]["secretKeyRef"];
    assert_eq!(key["name"], "r-runpod-kubelet-check-key");
    let hook_secret = named(&objects, "Secret", "r-runpod-kubelet-check-key");
    assert_eq!(
        hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"],
        "-30"
    );
    assert!(hook_secret["data"].get("VAST_API_KEY").is_none());

    let vast = named(
        &objects,
        "Job",
        "r-runpod-kubelet-controller-vast-check-key",
    );
    let args = args_of(&vast["spec"]["template"]);
    assert_eq!(flag(&args, "--provider"), Some("vastai"));
    assert_eq!(
        flag(&args, "--api-key-secret"),
        Some("runpod-system/vast-key (key token)")
    );
    let env = vast["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(
        env.contains("\"vast-key\"") && env.contains("\"token\""),
        "{env}"
    );

    // The controllers name the same Secret in their messages.
    let controller = named(&objects, "Deployment", "r-runpod-kubelet-controller");
    assert_eq!(
        flag(
            &args_of(&controller["spec"]["template"]),
            "--api-key-secret"
        ),
        Some("runpod-system/r-runpod-kubelet-runpod (key RUNPOD_API_KEY)")
    );

    let off =
        render_values("runpod: {apiKey: k}\ncontroller: {checkKey: {enabled: false}}\n").unwrap();
    assert!(!off.iter().any(|o| {
        o["metadata"]["name"]
            .as_str()
            .unwrap()
            .contains("check-key")
    }));
}

/// The kubelet API's certificate: by default (and with `mode: csr`) every controller requests
/// it (`--kubelet-tls-csr`), keeps it in its node's Secret and approves its own node's request,
/// with RBAC for exactly those names; `approve: false` leaves approving to the cluster;
/// `self-signed` asks for nothing; a Secret of yours is mounted and passed as files;
/// cert-manager's Certificate names every node; the modes exclude each other.
#[test]
fn the_kubelet_certificate_comes_from_the_cluster_a_secret_or_cert_manager() {
    let base =
        "runpod: {apiKey: k}\nvastai: {apiKey: v}\nnodes: [{name: vast, provider: vastai}]\n";
    let rules_of = |objects: &[Value], kind: &str, name: &str, group: &str| -> Vec<Value> {
        named(objects, kind, name)["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["apiGroups"][0] == group)
            .cloned()
            .collect()
    };
    for values in [
        base.to_owned(),
        format!("{base}controller: {{kubeletTls: {{mode: csr}}}}\n"),
    ] {
        let csr = render_values(&values).unwrap();
        for (deployment, node) in [
            ("r-runpod-kubelet-controller", "virtual-runpod"),
            ("r-runpod-kubelet-controller-vast", "vast"),
        ] {
            let args = args_of(&named(&csr, "Deployment", deployment)["spec"]["template"]);
            assert!(args.contains(&"--kubelet-tls-csr".to_owned()), "{args:?}");
            assert!(
                args.contains(&"--kubelet-tls-approve".to_owned()),
                "{args:?}"
            );
            assert_eq!(
                flag(&args, "--kubelet-tls-secret"),
                Some(format!("runpod-system/{node}-kubelet-serving").as_str())
            );
        }
        // Shared: making requests and Secrets; each node's own names only in its own rules.
        let rules = rules_of(
            &csr,
            "ClusterRole",
            "r-runpod-kubelet-controller",
            "certificates.k8s.io",
        );
        assert_eq!(
            rules,
            [serde_json::json!({"apiGroups": ["certificates.k8s.io"],
                "resources": ["certificatesigningrequests"], "verbs": ["create"]})]
        );
        for (controller, node) in [
            ("r-runpod-kubelet-controller", "virtual-runpod"),
            ("r-runpod-kubelet-controller-vast", "vast"),
        ] {
            let own = format!("{controller}-own");
            let request = serde_json::json!([format!("{node}-serving-runpod-kubelet")]);
            assert_eq!(
                rules_of(&csr, "ClusterRole", &own, "certificates.k8s.io"),
                [
                    serde_json::json!({"apiGroups": ["certificates.k8s.io"],
                        "resources": ["certificatesigningrequests"], "resourceNames": request,
                        "verbs": ["get", "delete"]}),
                    serde_json::json!({"apiGroups": ["certificates.k8s.io"],
                        "resources": ["certificatesigningrequests/approval"],
                        "resourceNames": request, "verbs": ["update"]}),
                    serde_json::json!({"apiGroups": ["certificates.k8s.io"],
                        "resources": ["signers"], "resourceNames": ["kubernetes.io/kubelet-serving"],
                        "verbs": ["approve"]}),
                ]
            );
            let kept = rules_of(&csr, "Role", &own, "");
            assert!(
                kept.contains(
                    &serde_json::json!({"apiGroups": [""], "resources": ["secrets"],
                    "resourceNames": [format!("{node}-kubelet-serving")],
                    "verbs": ["get", "update"]})
                ),
                "{kept:?}"
            );
        }
    }
    let approver = render_values(&format!(
        "{base}controller: {{kubeletTls: {{mode: csr, approve: false}}}}\n"
    ))
    .unwrap();
    let rules = rules_of(
        &approver,
        "ClusterRole",
        "r-runpod-kubelet-controller",
        "certificates.k8s.io",
    );
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["verbs"], serde_json::json!(["create", "get"]));
    let args =
        args_of(&named(&approver, "Deployment", "r-runpod-kubelet-controller")["spec"]["template"]);
    assert!(
        !args.contains(&"--kubelet-tls-approve".to_owned()),
        "{args:?}"
    );
    let self_signed = render_values(&format!(
        "{base}controller: {{kubeletTls: {{mode: self-signed}}}}\n"
    ))
    .unwrap();
    let role = named(&self_signed, "ClusterRole", "r-runpod-kubelet-controller");
    assert!(!role.to_string().contains("certificatesigningrequests"));
    let args = args_of(
        &named(&self_signed, "Deployment", "r-runpod-kubelet-controller")["spec"]["template"],
    );
    assert!(!args.contains(&"--kubelet-tls-csr".to_owned()), "{args:?}");

    let secret = render_values(&format!(
        "{base}controller: {{kubeletTls: {{existingSecret: kubelet-tls}}}}\n"
    ))
    .unwrap();
    let pod = &named(&secret, "Deployment", "r-runpod-kubelet-controller-vast")["spec"]["template"];
    let args = args_of(pod);
    assert_eq!(
        flag(&args, "--kubelet-tls-cert"),
        Some("/etc/runpod-kubelet/kubelet-tls/tls.crt")
    );
    assert!(
        pod["spec"]["volumes"]
            .to_string()
            .contains("\"secretName\":\"kubelet-tls\"")
    );

    let managed = render_values(&format!(
        "{base}controller: {{kubeletTls: {{certManager: {{issuerRef: {{name: ca, kind: ClusterIssuer}}}}}}}}\n"
    ))
    .unwrap();
    let certificate = named(
        &managed,
        "Certificate",
        "r-runpod-kubelet-controller-kubelet-tls",
    );
    assert_eq!(
        certificate["spec"]["dnsNames"],
        serde_json::json!(["virtual-runpod", "vast"])
    );
    assert_eq!(certificate["spec"]["issuerRef"]["kind"], "ClusterIssuer");

    let error = render_values(&format!(
        "{base}controller: {{kubeletTls: {{mode: csr, existingSecret: x}}}}\n"
    ))
    .unwrap_err();
    assert!(error.contains("mode csr"), "{error}");
}

#[test]
fn exec_over_ssh_is_on_by_default_with_create_on_secrets_in_the_release_namespace_only() {
    let objects = render(&["runpod.apiKey=k"]);
    let controller =
        args_of(&named(&objects, "Deployment", "r-runpod-kubelet-controller")["spec"]["template"]);
    assert!(
        controller.contains(&"--exec-ssh=true".to_owned()),
        "{controller:?}"
    );
    let role = named(
        &objects,
        "ClusterRole",
        "r-runpod-kubelet-controller-ssh-key",
    );
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}])
    );
    // Bound in the release namespace only, never cluster-wide.
    let binding = named(
        &objects,
        "RoleBinding",
        "r-runpod-kubelet-controller-ssh-key",
    );
    assert_eq!(
        binding["roleRef"]["name"],
        "r-runpod-kubelet-controller-ssh-key"
    );
    assert!(binding["metadata"]["namespace"].is_string());
    assert!(
        objects.iter().all(|o| !(o["kind"] == "ClusterRoleBinding"
            && o["roleRef"]["name"] == "r-runpod-kubelet-controller-ssh-key")),
        "the SSH key role is bound cluster-wide"
    );

    let off = render(&["runpod.apiKey=k", "controller.execSsh=false"]);
    let controller =
        args_of(&named(&off, "Deployment", "r-runpod-kubelet-controller")["spec"]["template"]);
    assert!(
        controller.contains(&"--exec-ssh=false".to_owned()),
        "{controller:?}"
    );
    assert!(
        off.iter()
            .all(|o| o["metadata"]["name"] != "r-runpod-kubelet-controller-ssh-key"),
        "no SSH key RBAC with exec off"
    );
}

/// Every controller Deployment is held by `runpod.io/drain` and names itself to its controller
/// and its drain Job; the controller may read and patch exactly those Deployments. With the
/// drain off, neither is rendered.
#[test]
fn controller_deployments_are_held_until_their_node_is_drained() {
    let objects = render_values(
        "runpod: {apiKey: k}\nvastai: {apiKey: v}\nnodes: [{name: vast, provider: vastai}]\ncontroller: {drain: {timeout: 7m}}\n",
    )
    .unwrap();
    let names = [
        "r-runpod-kubelet-controller",
        "r-runpod-kubelet-controller-vast",
    ];
    for name in names {
        let deployment = named(&objects, "Deployment", name);
        assert_eq!(
            deployment["metadata"]["finalizers"],
            serde_json::json!(["runpod.io/drain"])
        );
        let owner = format!("runpod-system/{name}");
        assert_eq!(
            flag(
                &args_of(&deployment["spec"]["template"]),
                "--owner-deployment"
            ),
            Some(owner.as_str())
        );
        // The finalizer's drain takes as long as the uninstall's.
        assert_eq!(
            flag(&args_of(&deployment["spec"]["template"]), "--drain-timeout"),
            Some("7m")
        );
        let drain = named(&objects, "Job", &format!("{name}-drain"));
        assert_eq!(
            flag(&args_of(&drain["spec"]["template"]), "--owner-deployment"),
            Some(owner.as_str())
        );
    }
    // Each controller may read and patch its own Deployment only.
    for name in names {
        let role = named(&objects, "Role", &format!("{name}-own"));
        assert!(
            role["rules"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!({
                "apiGroups": ["apps"], "resources": ["deployments"],
                "resourceNames": [name], "verbs": ["get", "patch"]})),
            "{role}"
        );
    }
    // Without the finalizer, neither it nor the right.
    let plain =
        render_values("runpod: {apiKey: k}\ncontroller: {drain: {finalizer: false}}\n").unwrap();
    assert!(
        named(&plain, "Deployment", "r-runpod-kubelet-controller")["metadata"]
            .get("finalizers")
            .is_none()
    );
    assert!(
        !plain
            .iter()
            .any(|o| o.to_string().contains("owner-deployment")
                || o.to_string().contains("\"deployments\""))
    );
    let off =
        render_values("runpod: {apiKey: k}\ncontroller: {drain: {enabled: false}}\n").unwrap();
    let deployment = named(&off, "Deployment", "r-runpod-kubelet-controller");
    assert!(deployment["metadata"].get("finalizers").is_none());
    assert!(
        !off.iter()
            .any(|o| o.to_string().contains("owner-deployment"))
    );
}

/// Least privilege per team: when every node lists the namespaces it serves, no ClusterRole
/// reads Secrets or ConfigMaps; each node's controller reads them through a Role in each of its
/// own namespaces, bound to its own ServiceAccount only, and reads just the nodes' SSH keys in
/// the release namespace. While some node serves unlisted namespaces, the cluster-wide `get`
/// stays (its pods may be anywhere).
#[test]
fn team_nodes_read_only_their_own_namespaces_secrets_as_their_own_accounts() {
    let values = "runpod: {apiKey: k}\nnodeNamespaces: [ml]\n\
                  nodes: [{name: team-a, provider: runpod, existingSecret: ka, namespaces: [a1, a2]}]\n";
    let objects = render_values(values).unwrap();
    let cluster_role = named(&objects, "ClusterRole", "r-runpod-kubelet-controller");
    assert!(
        !cluster_role.to_string().contains("\"secrets\""),
        "a ClusterRole reads Secrets: {cluster_role}"
    );
    let team_account = "r-runpod-kubelet-controller-team-a";
    named(&objects, "ServiceAccount", team_account);
    let deployment = named(&objects, "Deployment", team_account);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        team_account
    );
    let drain = named(&objects, "Job", &format!("{team_account}-drain"));
    assert_eq!(
        drain["spec"]["template"]["spec"]["serviceAccountName"],
        team_account
    );
    let bindings: Vec<(&str, &str, &str)> = objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding")
        .filter(|o| {
            o["metadata"]["name"]
                .as_str()
                .unwrap()
                .ends_with("-pod-inputs")
        })
        .map(|o| {
            (
                o["metadata"]["namespace"].as_str().unwrap(),
                o["roleRef"]["name"].as_str().unwrap(),
                o["subjects"][0]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        bindings,
        [
            (
                "ml",
                "r-runpod-kubelet-controller-pod-inputs",
                "r-runpod-kubelet-controller"
            ),
            (
                "a1",
                "r-runpod-kubelet-controller-team-a-pod-inputs",
                team_account
            ),
            (
                "a2",
                "r-runpod-kubelet-controller-team-a-pod-inputs",
                team_account
            ),
        ]
    );
    let role = objects
        .iter()
        .find(|o| o["kind"] == "Role" && o["metadata"]["namespace"] == "a1")
        .unwrap();
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get"]}])
    );
    // Both accounts hold the shared rights (nodes, pods, Leases...).
    let subjects = &named(
        &objects,
        "ClusterRoleBinding",
        "r-runpod-kubelet-controller",
    )["subjects"];
    assert_eq!(subjects.as_array().unwrap().len(), 2, "{subjects}");
    // What is one node's alone (its SSH key, its Deployment, its certificate) is bound to that
    // node's account only: team-a cannot read the default node's key, nor patch its Deployment.
    for (controller, node, account) in [
        (
            "r-runpod-kubelet-controller",
            "virtual-runpod",
            "r-runpod-kubelet-controller",
        ),
        (team_account, "team-a", team_account),
    ] {
        let own = named(&objects, "Role", &format!("{controller}-own"));
        assert!(
            own["rules"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!({
                "apiGroups": [""], "resources": ["secrets"],
                "resourceNames": [format!("{node}-ssh")], "verbs": ["get"]})),
            "{own}"
        );
        let binding = named(&objects, "RoleBinding", &format!("{controller}-own"));
        assert_eq!(binding["subjects"].as_array().unwrap().len(), 1);
        assert_eq!(binding["subjects"][0]["name"], account);
    }
    assert!(
        !objects.iter().any(|o| o["kind"] == "Role"
            && !o["metadata"]["name"].as_str().unwrap().ends_with("-own")
            && o.to_string().contains("-ssh\"")),
        "a shared Role names a node's SSH key"
    );

    // A node serving unlisted namespaces: the cluster-wide get stays, and one account.
    let open = render_values("runpod: {apiKey: k}\n").unwrap();
    let cluster_role = named(&open, "ClusterRole", "r-runpod-kubelet-controller");
    assert!(cluster_role.to_string().contains("\"secrets\""));
    assert!(!open.iter().any(|o| {
        o["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("-pod-inputs"))
    }));
}

/// `/metrics` stays off the node's IP unless asked: with `controller.hostNetwork` (or
/// `plainMetrics: false`) the plain listener serves no metrics, and the controllers'
/// ServiceMonitor scrapes them over TLS on the kubelet port with Prometheus's token.
#[test]
fn metrics_are_served_plain_only_off_the_host_network_unless_asked() {
    for (values, plain) in [
        ("runpod: {apiKey: k}\n", true),
        (
            "runpod: {apiKey: k}\ncontroller: {hostNetwork: true, kubeletPort: 10260}\n",
            false,
        ),
        (
            "runpod: {apiKey: k}\ncontroller: {plainMetrics: false}\n",
            false,
        ),
        (
            "runpod: {apiKey: k}\ncontroller: {hostNetwork: true, kubeletPort: 10260, plainMetrics: true}\n",
            true,
        ),
        // A self-signed kubelet certificate could not be verified by the TLS scrape.
        (
            "runpod: {apiKey: k}\ncontroller: {hostNetwork: true, kubeletPort: 10260, kubeletTls: {mode: self-signed}}\n",
            true,
        ),
    ] {
        let objects = render_values(&format!(
            "{values}monitoring: {{serviceMonitor: {{enabled: true}}}}\n"
        ))
        .unwrap();
        let args = args_of(
            &named(&objects, "Deployment", "r-runpod-kubelet-controller")["spec"]["template"],
        );
        assert!(
            args.contains(&format!("--metrics-plain={plain}")),
            "{values}: {args:?}"
        );
        let monitor = named(&objects, "ServiceMonitor", "r-runpod-kubelet-controller");
        let endpoint = &monitor["spec"]["endpoints"][0];
        let service = named(&objects, "Service", "r-runpod-kubelet-controller-metrics");
        if plain {
            assert_eq!(endpoint["port"], "metrics", "{values}");
            assert!(endpoint.get("scheme").is_none());
        } else {
            assert_eq!(endpoint["port"], "kubelet", "{values}");
            assert_eq!(endpoint["scheme"], "https");
            assert!(
                service["spec"]["ports"].to_string().contains("\"kubelet\""),
                "{service}"
            );
        }
    }
}
