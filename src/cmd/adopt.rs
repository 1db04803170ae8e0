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
use runpod_kubelet::controller::adoption::record_name;
use runpod_kubelet::provider::{Instance, Provider};
use runpod_kubelet::runpod::args::RunPodArgs;
use runpod_kubelet::runpod::catalogue_cache::CatalogueCache;
use runpod_kubelet::runpod::provider::RunPodProvider;
use runpod_kubelet::runpod::select::ClusterLimits;

#[derive(Debug, Args)]
pub struct AdoptArgs {
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

/// An untagged RunPod pod and the Kubernetes pod it belongs to, if any: (namespace, name, uid).
type Link<'a> = (&'a Instance, Option<(String, String, String)>);

/// Links each untagged live instance to the pod on the node with its name whose
/// `runpod.io/pod-id` names it (both, as the Go kubelet linked them; a name alone is no proof).
fn link<'a>(instances: &'a [Instance], pods: &[Pod]) -> Vec<Link<'a>> {
    let mut untagged: Vec<&Instance> = instances
        .iter()
        .filter(|i| i.tags.none() && i.state.is_live())
        .collect();
    untagged.sort_by(|a, b| a.id.cmp(&b.id));
    untagged
        .into_iter()
        .map(|instance| {
            let owner = pods.iter().find(|pod| {
                pod.metadata.name.as_deref() == Some(instance.name.as_str())
                    && pod
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(runpod_contract::POD_ID))
                        == Some(&instance.id)
            });
            let owner = owner.map(|pod| {
                (
                    pod.metadata.namespace.clone().unwrap_or_default(),
                    pod.metadata.name.clone().unwrap_or_default(),
                    pod.metadata.uid.clone().unwrap_or_default(),
                )
            });
            (instance, owner)
        })
        .collect()
}

/// The line printed for a link.
fn line((instance, owner): &Link<'_>) -> String {
    match owner {
        Some((namespace, name, _)) => {
            format!("{} {} -> {namespace}/{name}", instance.id, instance.name)
        }
        None => format!("{} {} -> none", instance.id, instance.name),
    }
}

pub async fn run(args: AdoptArgs) -> anyhow::Result<()> {
    let (client, _) = crate::cmd::controller::kube_client(args.kubeconfig.as_ref()).await?;
    let runpod = args
        .runpod
        .client(&args.cloud_ca)
        .context("configuring the RunPod client")?;
    let limits = ClusterLimits {
        max_gpu_price: 0.0,
        data_center_ids: vec![],
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
    let links = link(&instances, &pods);
    for entry in &links {
        println!("{}", line(entry));
    }
    let adopted: BTreeMap<String, String> = links
        .iter()
        .filter_map(|(instance, owner)| {
            owner
                .as_ref()
                .map(|(_, _, uid)| (instance.id.clone(), uid.clone()))
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
        }
    }

    fn pod(namespace: &str, name: &str, id: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                "annotations": id.map(|id| serde_json::json!({"runpod.io/pod-id": id}))
                    .unwrap_or(serde_json::json!({}))}
        }))
        .unwrap()
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
        ];
        let lines: Vec<String> = link(&instances, &pods).iter().map(line).collect();
        assert_eq!(
            lines,
            [
                "a1 trainer -> ml/trainer",
                "b2 server -> none",
                "c3 notebook -> none"
            ]
        );
    }
}
