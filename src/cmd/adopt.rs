//! `runpod-kubelet adopt [--dry-run]`: moving from the Go kubelet. Lists the RunPod pods of the
//! account that carry no tags of ours and, for each, the Kubernetes pod it belongs to as the Go
//! kubelet linked them: a pod on the virtual node with the RunPod pod's name whose
//! `runpod.io/pod-id` names it. Without `--dry-run` the linked ones are taken over without a
//! restart: their ids go into the node's adoption record (`controller::adoption`), and the
//! controller tracks, terminates and collects them like its own. Unlinked ones are left alone.
//! An explicit operator act: the controller never trusts a pod id it did not write.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use runpod_kubelet::controller::adoption::{made_for, record_name};
use runpod_kubelet::provider::{Instance, InstanceOrigin, Provider};
use runpod_kubelet::runpod::args::RunPodArgs;
use runpod_kubelet::runpod::catalogue_cache::CatalogueCache;
use runpod_kubelet::runpod::provider::RunPodProvider;
use runpod_kubelet::runpod::select::ClusterLimits;

#[derive(Debug, Args)]
pub(crate) struct AdoptArgs {
    /// Print what would be taken over, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The virtual node the Go kubelet ran (its pods are bound to it).
    #[arg(
        long,
        default_value = "virtual-runpod",
        env = "RUNPOD_KUBELET_NODENAME"
    )]
    pub nodename: String,
    /// The controller's cluster id (accepted as the controller takes it; adoption needs none).
    #[arg(long, env = "RUNPOD_KUBELET_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    #[command(flatten)]
    pub runpod: RunPodArgs,
    #[command(flatten)]
    pub cloud_ca: runpod_kubelet::http::CloudCaArgs,
    /// The controller's namespace, where the adoption record lives; default: `POD_NAMESPACE`,
    /// else `default`.
    #[arg(long, env = "RUNPOD_KUBELET_ADOPTION_NAMESPACE")]
    pub adoption_namespace: Option<String>,
    /// The kubeconfig (same as KUBECONFIG).
    #[arg(long, env = "RUNPOD_KUBELET_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// What an untagged RunPod pod belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owner {
    /// The one Kubernetes pod that claims it: (namespace, name, uid).
    Pod(String, String, String),
    /// No pod claims it.
    None,
    /// Several pods claim it, or one made after it (a `runpod.io/pod-id` is a user-editable
    /// annotation): none is trusted.
    Ambiguous(Vec<String>),
}

/// An untagged RunPod pod and what it belongs to.
type Link<'a> = (&'a Instance, Owner);

/// Links each untagged live instance to the pod on the node with its name whose
/// `runpod.io/pod-id` names it (both, as the Go kubelet linked them; a name alone is no proof),
/// made before the instance (the Go kubelet created it for an existing pod; a pod made later
/// with that name and annotation is someone else's claim), and whose image and literal env the
/// instance was made with (`origins`, by instance id: what the user cannot write onto an old
/// pod). Two claimants: no link.
fn link<'a>(
    instances: &'a [Instance],
    pods: &[Pod],
    origins: &BTreeMap<String, InstanceOrigin>,
) -> Vec<Link<'a>> {
    let mut untagged: Vec<&Instance> = instances
        .iter()
        .filter(|i| i.tags.none() && i.state.is_live())
        .collect();
    untagged.sort_by(|a, b| a.id.cmp(&b.id));
    untagged
        .into_iter()
        .map(|instance| {
            let claimants: Vec<&Pod> = pods
                .iter()
                .filter(|pod| {
                    pod.metadata.name.as_deref() == Some(instance.name.as_str())
                        && pod
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(runpod_contract::POD_ID))
                            == Some(&instance.id)
                })
                .collect();
            let qualified = |pod: &Pod| -> String {
                format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default()
                )
            };
            let owner = match claimants.as_slice() {
                [] => Owner::None,
                [pod] => {
                    let made = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
                    let before = match (made, instance.created_at) {
                        (Some(made), Some(created)) => made <= created,
                        // Without both times nothing can be compared: the link stands.
                        _ => true,
                    };
                    let origin = match origins.get(&instance.id) {
                        Some(origin) => made_for(pod, origin),
                        None => Err("what it was made with is unknown".to_owned()),
                    };
                    if let Err(differs) = origin {
                        Owner::Ambiguous(vec![format!("{} ({differs})", qualified(pod))])
                    } else if before {
                        Owner::Pod(
                            pod.metadata.namespace.clone().unwrap_or_default(),
                            pod.metadata.name.clone().unwrap_or_default(),
                            pod.metadata.uid.clone().unwrap_or_default(),
                        )
                    } else {
                        Owner::Ambiguous(vec![format!(
                            "{} (made after the instance)",
                            qualified(pod)
                        )])
                    }
                }
                several => Owner::Ambiguous(several.iter().map(|p| qualified(p)).collect()),
            };
            (instance, owner)
        })
        .collect()
}

/// The line printed for a link.
fn line((instance, owner): &Link<'_>) -> String {
    match owner {
        Owner::Pod(namespace, name, _) => {
            format!("{} {} -> {namespace}/{name}", instance.id, instance.name)
        }
        Owner::None => format!("{} {} -> none", instance.id, instance.name),
        Owner::Ambiguous(claims) => format!(
            "{} {} -> none (not trusted: claimed by {})",
            instance.id,
            instance.name,
            claims.join(", ")
        ),
    }
}

pub(crate) async fn run(args: AdoptArgs) -> anyhow::Result<()> {
    let (client, _) = crate::cmd::controller::kube_client(args.kubeconfig.as_ref()).await?;
    let runpod = args
        .runpod
        .client(&args.cloud_ca)
        .context("configuring the RunPod client")?;
    let limits = ClusterLimits {
        max_gpu_price: 0.0,
        data_center_ids: vec![],
        cloud_types: Vec::new(),
    };
    let provider = RunPodProvider::new(
        runpod,
        CatalogueCache::new(),
        limits,
        args.cluster_id.clone().unwrap_or_default(),
        args.nodename.clone(),
    );
    let instances = provider
        .list()
        .await
        .context("listing the account's RunPod pods")?;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", args.nodename)))
        .await
        .context("listing the pods on the node")?
        .items;
    // What each claimed untagged instance was made with (one read per claimed instance).
    let mut origins = BTreeMap::new();
    for instance in instances
        .iter()
        .filter(|i| i.tags.none() && i.state.is_live())
    {
        let claimed = pods.iter().any(|pod| {
            pod.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(runpod_contract::POD_ID))
                == Some(&instance.id)
        });
        if !claimed {
            continue;
        }
        let origin = provider
            .origin(&instance.id)
            .await
            .with_context(|| format!("reading RunPod pod {}", instance.id))?;
        if let Some(origin) = origin {
            origins.insert(instance.id.clone(), origin);
        }
    }
    let links = link(&instances, &pods, &origins);
    for entry in &links {
        println!("{}", line(entry));
    }
    let adopted: BTreeMap<String, String> = links
        .iter()
        .filter_map(|(instance, owner)| match owner {
            Owner::Pod(_, _, uid) => Some((instance.id.clone(), uid.clone())),
            _ => None,
        })
        .collect();
    if args.dry_run || adopted.is_empty() {
        eprintln!(
            "{} linked, {} without a pod{}",
            adopted.len(),
            links.len() - adopted.len(),
            if args.dry_run {
                " (dry run: nothing changed)"
            } else {
                ""
            }
        );
        return Ok(());
    }
    // A record in a namespace the controller does not read would change nothing, silently.
    anyhow::ensure!(
        args.adoption_namespace.is_some() || std::env::var_os("POD_NAMESPACE").is_some(),
        "pass --adoption-namespace: the namespace the controller runs in (its record is read there)"
    );
    let namespace =
        crate::cmd::controller::args::adoption_namespace(args.adoption_namespace.as_deref());
    record(&client, &namespace, &args.nodename, &adopted).await?;
    eprintln!(
        "adopted {} (recorded in ConfigMap {namespace}/{}); {} without a pod left alone",
        adopted.len(),
        record_name(&args.nodename),
        links.len() - adopted.len()
    );
    Ok(())
}

/// Adds `adopted` to the node's record (made when missing); earlier entries stay.
async fn record(
    client: &kube::Client,
    namespace: &str,
    node: &str,
    adopted: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let name = record_name(node);
    if maps.get_opt(&name).await?.is_none() {
        let map: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "runpod-kubelet-adopt"}},
            "data": adopted,
        }))?;
        match maps.create(&PostParams::default(), &map).await {
            Ok(_) => return Ok(()),
            // Made meanwhile: merge into it below.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error).context("creating the adoption record"),
        }
    }
    maps.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": adopted})),
    )
    .await
    .context("updating the adoption record")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use runpod_kubelet::provider::{InstanceState, Tags};

    use super::*;

    fn instance(id: &str, name: &str, tags: Tags) -> Instance {
        Instance {
            id: id.into(),
            name: name.into(),
            tags,
            state: InstanceState::Running,
            uptime_secs: None,
            cost_per_hour: None,
            gpu_type: None,
            datacenter: None,
            endpoints: vec![],
            ip: None,
            created_at: None,
            started_at: None,
            message: None,
            usage: None,
            ssh: None,
            machine: None,
            disruption: None,
        }
    }

    fn pod(namespace: &str, name: &str, id: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                "annotations": id.map(|id| serde_json::json!({"runpod.io/pod-id": id}))
                    .unwrap_or(serde_json::json!({}))},
            "spec": {"containers": [{"name": "main", "image": "team/trainer:1",
                "env": [{"name": "MODE", "value": "train"}]}]}
        }))
        .unwrap()
    }

    /// What the Go kubelet made `ids` with: the pods' image and env.
    fn made_as_the_pods(ids: &[&str]) -> BTreeMap<String, InstanceOrigin> {
        ids.iter()
            .map(|id| {
                let origin = InstanceOrigin {
                    image: Some("team/trainer:1".into()),
                    env: [("MODE".to_owned(), "train".to_owned())].into(),
                };
                ((*id).to_owned(), origin)
            })
            .collect()
    }

    /// Issue 41, item 12: a same-named pod in another namespace, annotated with an orphaned
    /// instance's id, links nothing: the instance was not made with its image and env.
    #[test]
    fn a_claim_the_instance_was_not_made_for_links_nothing() {
        let instances = vec![instance("a1", "trainer", Tags::default())];
        let mut intruder = pod("other", "trainer", Some("a1"));
        if let Some(spec) = intruder.spec.as_mut() {
            spec.containers[0].env = None;
        }
        let mut origins = made_as_the_pods(&["a1"]);
        if let Some(origin) = origins.get_mut("a1") {
            origin.env.insert("MODE".into(), "serve".into());
        }
        let lines: Vec<String> = link(&instances, &[intruder.clone()], &origins)
            .iter()
            .map(line)
            .collect();
        assert_eq!(
            lines,
            [
                "a1 trainer -> none (not trusted: claimed by other/trainer (its environment has variables the pod does not set (MODE)))"
            ]
        );
        // Another image: not linked either; nor when the cloud does not say.
        let mut other_image = made_as_the_pods(&["a1"]);
        if let Some(origin) = other_image.get_mut("a1") {
            origin.image = Some("someone/else:2".into());
        }
        let claimant = pod("ml", "trainer", Some("a1"));
        for origins in [other_image, BTreeMap::new()] {
            let links = link(&instances, std::slice::from_ref(&claimant), &origins);
            assert!(
                matches!(links[0].1, Owner::Ambiguous(_)),
                "{:?}",
                links[0].1
            );
        }
        // The Go kubelet's own: linked.
        let links = link(&instances, &[claimant], &made_as_the_pods(&["a1"]));
        assert!(matches!(links[0].1, Owner::Pod(..)));
    }

    /// A RunPod pod is linked only when both its name and the pod's `runpod.io/pod-id` agree;
    /// our own (tagged) instances are never listed.
    #[test]
    fn links_need_the_name_and_the_pod_id() {
        let ours = Tags {
            cluster_id: Some("c".into()),
            node_name: Some("n".into()),
            pod_uid: Some("u".into()),
        };
        let instances = vec![
            instance("a1", "trainer", Tags::default()),
            instance("b2", "server", Tags::default()),
            instance("c3", "notebook", Tags::default()),
            instance("d4", "mine", ours),
        ];
        let pods = vec![
            pod("ml", "trainer", Some("a1")),
            // The name matches, the id does not: not linked.
            pod("ml", "server", Some("zz")),
            pod("ml", "mine", Some("d4")),
            // Two pods claim c3: neither is trusted.
            pod("ml", "notebook", Some("c3")),
            pod("other", "notebook", Some("c3")),
        ];
        let origins = made_as_the_pods(&["a1", "b2", "c3"]);
        let lines: Vec<String> = link(&instances, &pods, &origins).iter().map(line).collect();
        assert_eq!(
            lines,
            [
                "a1 trainer -> ml/trainer",
                "b2 server -> none",
                "c3 notebook -> none (not trusted: claimed by ml/notebook, other/notebook)"
            ]
        );

        // A pod made after the instance (someone claiming it later) is not trusted.
        let mut old = instance("e5", "late", Tags::default());
        old.created_at = Some("2026-01-01T00:00:00Z".parse().unwrap());
        let mut late = pod("ml", "late", Some("e5"));
        late.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-02-01T00:00:00Z".parse().unwrap(),
            ));
        let old = [old];
        let lines: Vec<String> = link(&old, &[late], &made_as_the_pods(&["e5"]))
            .iter()
            .map(line)
            .collect();
        assert_eq!(
            lines,
            ["e5 late -> none (not trusted: claimed by ml/late (made after the instance))"]
        );
    }
}
