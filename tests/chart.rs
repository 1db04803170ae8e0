//! The Helm chart without a cluster: `helm lint`, values.schema.json refusing bad values with a
//! clear message, the webhook configuration exactly as `runpod-kubelet webhook-configuration`
//! prints it (and without a caBundle), least privilege and hardened pods, the certificate modes,
//! the monitoring parts (`monitoring`), several virtual nodes in one install (`nodes`), and
//! `deploy/` in step with the chart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

#[path = "support/chart.rs"]
#[allow(dead_code)]
mod chart;
#[path = "monitoring/chart_monitoring.rs"]
mod monitoring;
#[path = "chart/nodes.rs"]
mod nodes;
#[path = "chart/values.rs"]
mod values;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn helm(args: &[&str]) -> Output {
    Command::new(chart::helm_binary().expect("scripts/helm.sh"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("running helm")
}

/// `helm template` with these `--set`s, as JSON objects.
fn render(sets: &[&str]) -> Vec<Value> {
    chart::render(sets).unwrap()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn helm_lint_passes() {
    let out = helm(&["lint", "charts/runpod-kubelet", "--set", "runpod.apiKey=k"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `--set controller.idleGpuAfter=0` (the documented "off") arrives as an integer.
#[test]
fn idle_gpu_after_takes_bare_seconds_as_an_integer() {
    for value in ["0", "1800", "30m"] {
        let set = format!("controller.idleGpuAfter={value}");
        let objects = render(&["runpod.apiKey=k", &set]);
        let args: Vec<String> = of_kind(&objects, "Deployment")
            .iter()
            .flat_map(|d| d["spec"]["template"]["spec"]["containers"][0]["args"].as_array())
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect();
        let at = args
            .iter()
            .position(|a| a == "--idle-gpu-after")
            .unwrap_or_else(|| panic!("{args:?}"));
        assert_eq!(args[at + 1], value, "{args:?}");
    }
    let out = helm(&[
        "template",
        "r",
        "charts/runpod-kubelet",
        "--set",
        "runpod.apiKey=k",
        "--set",
        "controller.idleGpuAfter=-1",
    ]);
    assert!(!out.status.success());
}

/// Each set of `--set` values (with a RunPod key) fails `helm template`, saying the text given.
fn assert_refused(cases: &[(&[&str], &str)]) {
    for (sets, expected) in cases {
        let mut args = vec![
            "template",
            "r",
            "charts/runpod-kubelet",
            "--set",
            "runpod.apiKey=k",
        ];
        for set in *sets {
            args.extend(["--set", set]);
        }
        let out = helm(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{sets:?} was accepted");
        assert!(stderr.contains(expected), "{sets:?}: {stderr}");
    }
}

#[test]
fn wrong_values_fail_with_a_clear_message() {
    let cases: [(&[&str], &str); 5] = [
        (&["controller.replicas=3"], "/controller/replicas"),
        (
            &["webhook.failurePolicy=Sometimes"],
            "/webhook/failurePolicy",
        ),
        (&["certs.mode=provided"], "/certs/secretName"),
        (&["runpod.maxGpuPrice=-1"], "/runpod/maxGpuPrice"),
        (&["webhook.replica=2"], "replica"),
    ];
    assert_refused(&cases);
    let out = helm(&["template", "r", "charts/runpod-kubelet"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("runpod.existingSecret"));
}

#[test]
fn the_webhook_configuration_is_what_the_binary_prints_without_a_ca_bundle() {
    for conditions in [true, false] {
        let objects = render(&[
            "runpod.apiKey=k",
            "webhook.failurePolicy=Ignore",
            "webhook.timeoutSeconds=5",
            "webhook.excludeNamespaces={team-a,kube-system}",
            &format!("webhook.matchConditions={conditions}"),
        ]);
        let rendered = of_kind(&objects, "MutatingWebhookConfiguration");
        assert_eq!(rendered.len(), 1);
        let printed = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
            .args([
                "webhook-configuration",
                "--service",
                "runpod-system/r-runpod-kubelet-webhook:443",
            ])
            .args(["--failure-policy", "Ignore", "--timeout-seconds", "5"])
            .args(["--exclude-namespaces", "team-a,kube-system"])
            .args(conditions.then_some("--match-conditions"))
            .output()
            .unwrap();
        assert!(printed.status.success());
        let printed: Value = serde_json::from_slice(&printed.stdout).unwrap();
        assert_eq!(rendered[0]["webhooks"], printed["webhooks"]);
        assert_eq!(
            rendered[0]["webhooks"][0]["matchConditions"][0]["expression"]
                .as_str()
                .is_some(),
            conditions
        );
        assert_eq!(rendered[0]["metadata"]["name"], printed["metadata"]["name"]);
        for hook in rendered[0]["webhooks"].as_array().unwrap() {
            assert!(
                hook["clientConfig"].get("caBundle").is_none(),
                "caBundle must not be rendered"
            );
        }
    }
}

/// `webhook.matchConditions: auto` renders them where the apiserver has them (1.28 and later)
/// and leaves them out before, where an apiserver would refuse the field.
#[test]
fn match_conditions_follow_the_apiserver_version() {
    for (version, expected) in [("1.27.9", false), ("1.28.0", true), ("1.31.2", true)] {
        let out = helm(&[
            "template",
            "r",
            "charts/runpod-kubelet",
            "--set",
            "runpod.apiKey=k",
            "--kube-version",
            version,
            "--show-only",
            "templates/webhook-configuration.yaml",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.matches("matchConditions:").count(),
            if expected { 2 } else { 0 },
            "{version}: {text}"
        );
    }
}

#[test]
fn pods_are_hardened_and_rbac_has_no_wildcards() {
    let objects = render(&["runpod.apiKey=k"]);
    let mut containers = 0;
    for object in &objects {
        let spec = match object["kind"].as_str().unwrap() {
            "Deployment" | "Job" => &object["spec"]["template"]["spec"],
            "CronJob" => &object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            _ => continue,
        };
        assert_eq!(
            spec["securityContext"]["runAsNonRoot"], true,
            "{}",
            object["metadata"]["name"]
        );
        assert_eq!(
            spec["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        for container in spec["containers"].as_array().unwrap() {
            containers += 1;
            let sc = &container["securityContext"];
            assert_eq!(sc["readOnlyRootFilesystem"], true);
            assert_eq!(sc["allowPrivilegeEscalation"], false);
            assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
            assert!(container["resources"]["requests"].is_object());
        }
    }
    assert_eq!(
        containers, 7,
        "webhook, controller, certs pre and post hooks, certs cron, drain, check-key"
    );
    for role in of_kind(&objects, "ClusterRole")
        .into_iter()
        .chain(of_kind(&objects, "Role"))
    {
        for rule in role["rules"].as_array().unwrap() {
            for field in ["verbs", "resources", "apiGroups"] {
                assert!(
                    !rule[field].as_array().unwrap().iter().any(|v| v == "*"),
                    "wildcard in {}",
                    role["metadata"]["name"]
                );
            }
        }
    }
    for binding in of_kind(&objects, "ClusterRoleBinding") {
        assert_ne!(binding["roleRef"]["name"], "cluster-admin");
    }
    // Secrets: the controller may only GET them (for pods' env), never list or watch.
    let controller = of_kind(&objects, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "r-runpod-kubelet-controller")
        .unwrap();
    let secrets = controller["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x == "secrets")
        })
        .unwrap();
    assert_eq!(secrets["verbs"], serde_json::json!(["get"]));
    // The kubelet API's SubjectAccessReviews: create only.
    let reviews = controller["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"] == serde_json::json!(["subjectaccessreviews"]))
        .unwrap();
    assert_eq!(
        reviews["apiGroups"],
        serde_json::json!(["authorization.k8s.io"])
    );
    assert_eq!(reviews["verbs"], serde_json::json!(["create"]));
}

#[test]
fn certificate_modes_render_what_they_need() {
    let helm_mode = render(&["runpod.apiKey=k"]);
    let jobs = of_kind(&helm_mode, "Job");
    for (job, hooks) in [
        ("r-runpod-kubelet-certs-pre", "pre-install,pre-upgrade"),
        ("r-runpod-kubelet-certs-post", "post-install,post-upgrade"),
    ] {
        let certs_job = jobs.iter().find(|j| j["metadata"]["name"] == job).unwrap();
        assert_eq!(certs_job["metadata"]["annotations"]["helm.sh/hook"], hooks);
    }
    // A forced rotation happens once per upgrade, before the release changes.
    let forced = render(&["runpod.apiKey=k", "certs.rotate=ca"]);
    let args_of = |name: &str| {
        of_kind(&forced, "Job")
            .into_iter()
            .find(|j| j["metadata"]["name"] == name)
            .unwrap()["spec"]["template"]["spec"]["containers"][0]["args"]
            .clone()
    };
    assert!(
        args_of("r-runpod-kubelet-certs-pre")
            .to_string()
            .contains("--rotate")
    );
    assert!(
        !args_of("r-runpod-kubelet-certs-post")
            .to_string()
            .contains("--rotate")
    );
    let drain = jobs
        .iter()
        .find(|j| j["metadata"]["name"] == "r-runpod-kubelet-controller-drain")
        .unwrap();
    assert_eq!(
        drain["metadata"]["annotations"]["helm.sh/hook"],
        "pre-delete"
    );
    let args = &drain["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(args[0], "controller");
    assert!(args.as_array().unwrap().iter().any(|a| a == "drain"));
    assert_eq!(of_kind(&helm_mode, "CronJob").len(), 1);

    let cert_manager = render(&["runpod.apiKey=k", "certs.mode=cert-manager"]);
    assert!(of_kind(&cert_manager, "CronJob").is_empty());
    assert_eq!(of_kind(&cert_manager, "Certificate").len(), 2);
    let config = of_kind(&cert_manager, "MutatingWebhookConfiguration")[0];
    assert_eq!(
        config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "runpod-system/r-runpod-kubelet-webhook"
    );

    // (The kubelet API's own certificate, kept in a Secret in csr mode, is another matter:
    // tests/chart/values.rs.)
    let provided = render(&[
        "runpod.apiKey=k",
        "certs.mode=provided",
        "certs.secretName=mine",
        "controller.kubeletTls.mode=self-signed",
    ]);
    for role in of_kind(&provided, "Role") {
        for rule in role["rules"].as_array().unwrap() {
            if rule["resources"][0] == "secrets" {
                assert_eq!(
                    rule["verbs"],
                    serde_json::json!(["get"]),
                    "provided mode never writes"
                );
            }
        }
    }
    let deployment = of_kind(&provided, "Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "r-runpod-kubelet-webhook")
        .unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        "mine"
    );

    let existing = render(&["runpod.existingSecret=theirs"]);
    assert!(of_kind(&existing, "Secret").is_empty());
}

#[test]
fn deploy_manifests_match_the_chart() {
    let out = Command::new("bash")
        .arg(root().join("scripts/render-deploy.sh"))
        .arg("--stdout")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read_to_string(root().join("deploy/runpod-kubelet.yaml")).unwrap();
    assert!(
        committed == String::from_utf8(out.stdout).unwrap(),
        "deploy/runpod-kubelet.yaml drifted from the chart: run scripts/render-deploy.sh"
    );
}

/// The README's quickstart `helm install` line, as typed (Helm's `--set` passes `0.5` as a
/// string): `helm template` with the same chart path and values renders, and the cap reaches
/// the webhook and the controller as written. Decimal values given the same way elsewhere are
/// accepted too.
#[test]
fn the_readmes_helm_install_line_renders_as_typed() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find("helm install ")
        .expect("the quickstart's helm install");
    let mut command = String::new();
    for line in readme[start..].lines() {
        command.push_str(line.trim_end().trim_end_matches('\\'));
        command.push(' ');
        if !line.trim_end().ends_with('\\') {
            break;
        }
    }
    let words = shlex::split(&command).expect("a shell line");
    assert_eq!(&words[..2], ["helm", "install"]);
    // `helm install NAME CHART ...` is `helm template NAME CHART ...`, minus what needs a
    // cluster.
    let mut args: Vec<&str> = vec!["template"];
    args.extend(
        words[2..]
            .iter()
            .map(String::as_str)
            .filter(|word| *word != "--wait"),
    );
    let output = helm(&args);
    assert!(
        output.status.success(),
        "`{command}` is refused: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("\"0.5\""), "the cap is not passed on");
    for set in [
        "monitoring.spendAlertPerHour=2.5",
        "controller.idleGpuThreshold=7.5",
    ] {
        if let Err(error) = chart::render(&["runpod.apiKey=k", set]) {
            panic!("--set {set}: {error}");
        }
    }
    for bad in ["runpod.maxGpuPrice=0", "runpod.maxGpuPrice=cheap"] {
        assert!(
            chart::render(&["runpod.apiKey=k", bad]).is_err(),
            "--set {bad} was accepted"
        );
    }
}

/// The controllers may change, delete and renew the heartbeat of the release's own virtual
/// nodes only: never a real node or its Lease (issue 42).
#[test]
fn node_and_lease_writes_are_limited_to_the_releases_nodes() {
    let objects = render(&[
        "runpod.apiKey=k",
        "nodes[0].name=team-a",
        "nodes[0].provider=runpod",
        "nodes[0].existingSecret=team-a-key",
    ]);
    let expected = serde_json::json!(["virtual-runpod", "team-a"]);
    let mut checked = 0;
    for role in of_kind(&objects, "ClusterRole")
        .into_iter()
        .chain(of_kind(&objects, "Role"))
    {
        for rule in role["rules"].as_array().into_iter().flatten() {
            let resources: Vec<&str> = rule["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let verbs: Vec<&str> = rule["verbs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let writes = verbs
                .iter()
                .any(|v| ["patch", "update", "delete"].contains(v));
            let node_lease = role["metadata"]["namespace"] == "kube-node-lease";
            let nodes = resources
                .iter()
                .any(|r| *r == "nodes" || *r == "nodes/status");
            if (nodes || (node_lease && resources.contains(&"leases"))) && writes {
                assert_eq!(rule["resourceNames"], expected, "{rule}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 3, "only {checked} rules checked");
}

/// `commonLabels` reach every pod the chart runs, as the values promise (podLabels win on a
/// clash) (issue 42).
#[test]
fn common_labels_reach_every_pod() {
    let objects = render(&[
        "runpod.apiKey=k",
        "commonLabels.team=platform",
        "commonLabels.cost-center=gpu",
        "podLabels.cost-center=override",
    ]);
    let mut pods = 0;
    for object in &objects {
        let spec = &object["spec"];
        let template = if spec["jobTemplate"].is_object() {
            &spec["jobTemplate"]["spec"]["template"]
        } else {
            &spec["template"]
        };
        if !template.is_object() {
            continue;
        }
        let labels = &template["metadata"]["labels"];
        assert_eq!(labels["team"], "platform", "{}", object["metadata"]["name"]);
        assert_eq!(
            labels["cost-center"], "override",
            "{}",
            object["metadata"]["name"]
        );
        pods += 1;
    }
    assert!(pods >= 5, "only {pods} pod templates");
}

/// The controller runs with the allocator settings its memory figures were measured with
/// (`benches/controller_scale.rs` sets the same), and the webhook without them.
#[test]
fn the_controller_gives_freed_memory_back() {
    let objects = render(&["runpod.apiKey=k"]);
    let mut controllers = 0;
    for deployment in of_kind(&objects, "Deployment") {
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let args = container["args"].as_array().cloned().unwrap_or_default();
        let env = container["env"].as_array().cloned().unwrap_or_default();
        let value = |name: &str| {
            env.iter()
                .find(|e| e["name"] == name)
                .map(|e| e["value"].clone())
        };
        if args.first().and_then(Value::as_str) == Some("controller") {
            controllers += 1;
            assert_eq!(value("MIMALLOC_PURGE_DELAY"), Some(Value::from("0")));
            assert_eq!(value("MIMALLOC_ARENA_EAGER_COMMIT"), Some(Value::from("0")));
        } else {
            assert_eq!(
                value("MIMALLOC_PURGE_DELAY"),
                None,
                "{}",
                deployment["metadata"]["name"]
            );
        }
    }
    assert!(controllers >= 1, "no controller Deployment rendered");

    // A user's own value replaces the default: one entry per name (server-side apply refuses
    // a list with two).
    let objects = render(&[
        "runpod.apiKey=k",
        "extraEnv[0].name=MIMALLOC_PURGE_DELAY",
        "extraEnv[0].value=250",
    ]);
    let mut checked = 0;
    for deployment in of_kind(&objects, "Deployment") {
        for container in deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let env = container["env"].as_array().cloned().unwrap_or_default();
            let mut names: Vec<&str> = env.iter().filter_map(|e| e["name"].as_str()).collect();
            let all = names.len();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), all, "repeated env names: {env:?}");
            let purge: Vec<&Value> = env
                .iter()
                .filter(|e| e["name"] == "MIMALLOC_PURGE_DELAY")
                .map(|e| &e["value"])
                .collect();
            assert_eq!(purge, [&Value::from(250)], "the user's value, once");
            checked += 1;
        }
    }
    assert!(checked >= 2, "only {checked} containers checked");
}

/// The binary's version, the chart's `version` and `appVersion` and the CHANGELOG agree: a
/// released version has its CHANGELOG section, a development version is the Unreleased one's.
#[test]
fn versions_agree() {
    let binary = env!("CARGO_PKG_VERSION");
    let chart = std::fs::read_to_string(root().join("charts/runpod-kubelet/Chart.yaml")).unwrap();
    let chart: serde_yaml::Value = serde_yaml::from_str(&chart).unwrap();
    assert_eq!(chart["appVersion"].as_str(), Some(binary));
    assert_eq!(chart["version"].as_str(), Some(binary));
    let changelog = std::fs::read_to_string(root().join("CHANGELOG.md")).unwrap();
    if binary.contains('-') {
        let unreleased = changelog
            .split("\n## ")
            .find(|section| section.starts_with("Unreleased"))
            .expect("an Unreleased section");
        assert!(
            unreleased.contains(&format!("`{binary}`")),
            "Unreleased does not name {binary}"
        );
    } else {
        assert!(
            changelog.contains(&format!("\n## {binary}\n")),
            "no section for {binary}"
        );
    }
}

/// Bringing one's own ServiceAccount changes which account the pods run as, never the names of
/// the release's objects (the documented commands and the node alert use those) (issue 42).
#[test]
fn own_service_account_keeps_the_releases_names() {
    let names = |sets: &[&str]| -> Vec<String> {
        render(sets)
            .iter()
            .filter(|o| {
                ["Deployment", "Service", "Job", "CronJob"]
                    .contains(&o["kind"].as_str().unwrap_or_default())
            })
            .map(|o| format!("{} {}", o["kind"], o["metadata"]["name"]))
            .collect()
    };
    let own = [
        "runpod.apiKey=k",
        "serviceAccount.create=false",
        "serviceAccount.name=platform-sa",
    ];
    assert_eq!(names(&own), names(&["runpod.apiKey=k"]));
    let objects = render(&own);
    let controller = of_kind(&objects, "Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "r-runpod-kubelet-controller")
        .expect("the controller");
    assert_eq!(
        controller["spec"]["template"]["spec"]["serviceAccountName"],
        "platform-sa"
    );
}

/// `docs/reference/rbac.md`, the RBAC table a reviewer signs, rendered from the chart with its
/// default values (each ServiceAccount, where its rights apply, and on what): it fails when the
/// committed table is out of step with the chart; `scripts/render-docs.sh` writes it.
#[test]
fn the_rbac_reference_is_the_rendered_charts() {
    let objects = render(&["runpod.apiKey=k"]);
    let roles: std::collections::BTreeMap<(String, String), &Value> = objects
        .iter()
        .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole")
        .map(|o| {
            let key = (
                o["kind"].as_str().unwrap().to_owned(),
                o["metadata"]["name"].as_str().unwrap().to_owned(),
            );
            (key, o)
        })
        .collect();
    // (account, scope, api groups, resources, names, verbs)
    let mut rows: Vec<[String; 6]> = Vec::new();
    let list = |value: &Value| -> String {
        value
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|i| match i.as_str() {
                        Some("") => "core".to_owned(),
                        Some(text) => text.to_owned(),
                        None => i.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    for binding in objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
    {
        let scope = match binding["metadata"]["namespace"].as_str() {
            Some(namespace) => format!("namespace {namespace}"),
            None => "cluster".to_owned(),
        };
        let role_key = (
            binding["roleRef"]["kind"].as_str().unwrap().to_owned(),
            binding["roleRef"]["name"].as_str().unwrap().to_owned(),
        );
        let role = roles
            .get(&role_key)
            .unwrap_or_else(|| panic!("{role_key:?}"));
        for subject in binding["subjects"].as_array().unwrap() {
            let account = subject["name"].as_str().unwrap().to_owned();
            for rule in role["rules"].as_array().unwrap() {
                rows.push([
                    account.clone(),
                    scope.clone(),
                    list(&rule["apiGroups"]),
                    list(&rule["resources"]),
                    list(&rule["resourceNames"]),
                    list(&rule["verbs"]),
                ]);
            }
        }
    }
    rows.sort();
    rows.dedup();
    let mut text = String::from(
        "<!-- Generated by scripts/render-docs.sh from the chart's RBAC (helm template, default \
         values); do not edit. -->\n\n# RBAC\n\nEvery right the chart grants with its default \
         values (release `r` in `runpod-system`), by ServiceAccount: where it applies, on what, \
         and which verbs. A names column limits the rule to those objects. With every node \
         listing its namespaces, the controller's Secret and ConfigMap `get` moves from the \
         cluster to those namespaces ([install](../install.md#what-each-component-may-do)).\n\n\
         | ServiceAccount | scope | API groups | resources | names | verbs |\n\
         |---|---|---|---|---|---|\n",
    );
    for row in rows {
        text.push_str(&format!(
            "| {} |\n",
            row.iter()
                .map(|cell| if cell.is_empty() {
                    "-".to_owned()
                } else {
                    format!("`{cell}`")
                })
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    let path = root().join("docs/reference/rbac.md");
    if std::env::var_os("UPDATE_REFERENCE").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "docs/reference/rbac.md is out of step with the chart: run scripts/render-docs.sh"
    );
}
