//! REST v2 pod shapes: responses decoded tolerantly (unknown fields ignored, nullable fields
//! defaulted, prices as numbers or strings), requests serialised strictly, because the service
//! answers 422 to any field its schema does not know.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::decode::{lenient_f64, lenient_u32, null_as_default, or_default};

/// Pod status as v2 reports it; values added by RunPod later read as `Unknown`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PodStatus {
    Provisioning,
    Starting,
    Running,
    Exited,
    Error,
    Terminated,
    #[serde(other)]
    #[default]
    Unknown,
}

impl PodStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PodStatus::Provisioning => "PROVISIONING",
            PodStatus::Starting => "STARTING",
            PodStatus::Running => "RUNNING",
            PodStatus::Exited => "EXITED",
            PodStatus::Error => "ERROR",
            PodStatus::Terminated => "TERMINATED",
            PodStatus::Unknown => "UNKNOWN",
        }
    }
}

/// `gpu` on a pod and in a create request. `count` is always sent (api-notes P11).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub id: String,
    #[serde(default = "one", deserialize_with = "count_or_one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

fn count_or_one<'de, D>(deserializer: D) -> Result<u32, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(lenient_u32(deserializer)?.unwrap_or(1))
}

/// One published port of a running pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimePort {
    #[serde(default, deserialize_with = "lenient_u32")]
    pub private: Option<u32>,
    #[serde(default, deserialize_with = "lenient_u32")]
    pub public: Option<u32>,
    #[serde(default, rename = "type")]
    pub protocol: Option<String>,
    #[serde(default)]
    pub ip: Option<String>,
}

/// `runtime.cpu` and `runtime.memory`: a utilization percentage (0–100).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Utilization {
    #[serde(default, deserialize_with = "lenient_f64")]
    pub util: Option<f64>,
}

/// One entry of `runtime.gpus`: compute and memory utilization percentages (0–100).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuUtilization {
    #[serde(default, deserialize_with = "lenient_f64")]
    pub util: Option<f64>,
    #[serde(default, deserialize_with = "lenient_f64")]
    pub memory_util: Option<f64>,
}

/// Telemetry of a running pod; null until the container is up (api-notes P6).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Runtime {
    #[serde(default, deserialize_with = "lenient_u32")]
    pub uptime: Option<u32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ports: Vec<RuntimePort>,
    /// The live utilization report: what `kubectl top` and the idle-GPU check read.
    #[serde(default, deserialize_with = "or_default")]
    pub cpu: Option<Utilization>,
    #[serde(default, deserialize_with = "or_default")]
    pub memory: Option<Utilization>,
    #[serde(default, deserialize_with = "or_default")]
    pub gpus: Vec<GpuUtilization>,
}

/// A RunPod pod as v2 returns it, reduced to what the controller reads. `Debug` shows env
/// names only and hides `args`: values may come from Kubernetes Secrets.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub status: PodStatus,
    #[serde(default, deserialize_with = "null_as_default")]
    pub actions: Vec<String>,
    #[serde(default, alias = "imageName")]
    pub image: Option<String>,
    #[serde(default)]
    pub args: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ports: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub gpu: Option<GpuSpec>,
    #[serde(default)]
    pub cloud: Option<String>,
    #[serde(default)]
    pub data_center_id: Option<String>,
    /// USD per hour; 0 when EXITED or TERMINATED.
    #[serde(default, deserialize_with = "lenient_f64", alias = "costPerHr")]
    pub cost: Option<f64>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub locked: bool,
    #[serde(default)]
    pub runtime: Option<Runtime>,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub started_at: Option<String>,
    /// The host machine (RunPod cannot be told to avoid one; shown in Events).
    #[serde(default)]
    pub machine_id: Option<String>,
    /// Read tolerantly: a malformed `ssh` costs exec, not the list.
    #[serde(default, deserialize_with = "or_default")]
    pub ssh: Option<Ssh>,
}

/// `ssh` of a v2 pod: `direct` once `22/tcp` has a public port.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ssh {
    #[serde(default)]
    pub direct: Option<SshDirect>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SshDirect {
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default, deserialize_with = "lenient_u32")]
    pub port: Option<u32>,
    #[serde(default)]
    pub username: Option<String>,
}

impl Pod {
    /// Published ports; empty until RunPod maps them, which can be well after RUNNING.
    pub fn published_ports(&self) -> &[RuntimePort] {
        self.runtime.as_ref().map_or(&[], |runtime| &runtime.ports)
    }
}

/// `{"pods": [...]}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodList {
    #[serde(default, deserialize_with = "null_as_default")]
    pub pods: Vec<Pod>,
}

/// `POST /v2/pods`. Optional fields are omitted rather than sent as null. `Debug` shows env
/// names only and hides `args`: values may come from Kubernetes Secrets.
#[derive(Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatePodRequest {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_id: Option<String>,
    pub gpu: GpuSpec,
    /// Always explicit: an unpinned cloud can bill Secure prices (api-notes P9).
    pub cloud: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data_center_ids: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry: Option<String>,
    /// `{"network": [{"volumeId", "path"}]}`: the one network volume the pod mounts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mounts: Option<serde_json::Value>,
}

/// Env for `Debug`: names with redacted values.
struct RedactedEnv<'a>(&'a BTreeMap<String, String>);

impl std::fmt::Debug for RedactedEnv<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|key| (key, "<redacted>")))
            .finish()
    }
}

/// `args` for `Debug`: its length only. Kubernetes `$(VAR)` references are expanded into it
/// from env that includes Secret values.
struct RedactedArgs<'a>(&'a Option<String>);

impl std::fmt::Debug for RedactedArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(args) => write!(f, "Some(<redacted, {} bytes>)", args.len()),
            None => f.write_str("None"),
        }
    }
}

impl std::fmt::Debug for Pod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pod")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("status", &self.status)
            .field("actions", &self.actions)
            .field("image", &self.image)
            .field("args", &RedactedArgs(&self.args))
            .field("ports", &self.ports)
            .field("env", &RedactedEnv(&self.env))
            .field("gpu", &self.gpu)
            .field("cloud", &self.cloud)
            .field("data_center_id", &self.data_center_id)
            .field("cost", &self.cost)
            .field("locked", &self.locked)
            .field("runtime", &self.runtime)
            .field("created_at", &self.created_at)
            .field("started_at", &self.started_at)
            .finish()
    }
}

impl std::fmt::Debug for CreatePodRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatePodRequest")
            .field("name", &self.name)
            .field("image", &self.image)
            .field("template_id", &self.template_id)
            .field("gpu", &self.gpu)
            .field("cloud", &self.cloud)
            .field("data_center_ids", &self.data_center_ids)
            .field("disk", &self.disk)
            .field("ports", &self.ports)
            .field("env", &RedactedEnv(&self.env))
            .field("args", &RedactedArgs(&self.args))
            .field("registry", &self.registry)
            .field("mounts", &self.mounts)
            .finish()
    }
}

impl std::fmt::Debug for UpdatePodRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpdatePodRequest")
            .field("name", &self.name)
            .field("locked", &self.locked)
            .field("image", &self.image)
            .field("args", &RedactedArgs(&self.args))
            .field("env", &self.env.as_ref().map(RedactedEnv))
            .field("ports", &self.ports)
            .finish()
    }
}

/// `PATCH /v2/pods/{id}`: only the fields present change. Any change but `name`/`locked`
/// may reset the pod (api-notes 1.6), so the controller uses this sparingly.
#[derive(Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdatePodRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<String>>,
}

/// `POST /v2/pods/{id}/action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PodAction {
    Start,
    Stop,
    Restart,
    Terminate,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_spec_example_and_drifted_shapes() {
        let spec = r#"{"id":"7h9k2m4n6p","name":"pytorch-training","image":"img","args":"","disk":50,
            "ports":["8888/http","22/tcp"],"env":{"A":"1"},"registry":null,"status":"RUNNING",
            "actions":["stop","restart","terminate"],"mounts":{},"gpu":{"id":"NVIDIA GeForce RTX 4090","count":1},
            "cloud":"SECURE","dataCenterId":"US-KS-2","cudaVersion":"12.8","ssh":{"proxy":null,"direct":null},
            "template":null,"cost":0.44,"locked":false,"globalNetworking":{"enabled":false},
            "runtime":{"uptime":3600,"ports":[{"private":22,"public":34446,"type":"tcp","ip":"195.26.233.3"}]},
            "createdAt":"2026-06-01T12:00:00Z","startedAt":"2026-06-01T12:02:00Z"}"#;
        let pod: Pod = serde_json::from_str(spec).unwrap();
        assert_eq!(pod.status, PodStatus::Running);
        assert_eq!(pod.cost, Some(0.44));
        assert_eq!(pod.published_ports()[0].public, Some(34446));
        assert_eq!(pod.gpu.unwrap().count, 1);

        // v1-style names, a string price, nulls, an unknown status and unknown fields.
        let drifted = r#"{"id":"x","imageName":"img","costPerHr":"0.74","env":null,"ports":null,
            "runtime":null,"status":"PAUSED","gpu":{"id":"g"},"brandNew":{"a":1}}"#;
        // Nulls where the spec promises values must not sink the whole list.
        let nulls = r#"{"pods":[{"id":"a","name":null,"status":null,"locked":null,"gpu":{"id":null,"count":null},
            "runtime":{}}, {"id":"b","name":"ok","status":"RUNNING"}]}"#;
        let list: PodList = serde_json::from_str(nulls).unwrap();
        assert_eq!(list.pods.len(), 2);
        assert_eq!(list.pods[0].status, PodStatus::Unknown);
        assert!(list.pods[0].published_ports().is_empty());
        let pod: Pod = serde_json::from_str(drifted).unwrap();
        assert_eq!(pod.image.as_deref(), Some("img"));
        assert_eq!(pod.cost, Some(0.74));
        assert_eq!(pod.status, PodStatus::Unknown);
        assert!(pod.env.is_empty() && pod.ports.is_empty() && pod.published_ports().is_empty());
        assert_eq!(pod.gpu.unwrap().count, 1);
    }

    #[test]
    fn debug_output_never_shows_env_values() {
        let pod: Pod =
            serde_json::from_str(r#"{"id":"x","env":{"TOKEN":"s3cr3t-value"}}"#).unwrap();
        let shown = format!("{pod:?}");
        assert!(
            shown.contains("TOKEN") && !shown.contains("s3cr3t-value"),
            "{shown}"
        );
    }

    #[test]
    fn debug_output_never_shows_args_which_may_hold_expanded_secrets() {
        // `$(TOKEN)` in a container's args is expanded from env that includes Secret values.
        let secret = "s3cr3t-value";
        let args = format!("python train.py --token {secret}");
        let request = CreatePodRequest {
            name: "n".into(),
            image: Some("img".into()),
            template_id: None,
            gpu: GpuSpec {
                id: "g".into(),
                count: 1,
            },
            cloud: "SECURE".into(),
            data_center_ids: vec![],
            disk: None,
            ports: vec![],
            env: BTreeMap::from([("TOKEN".into(), secret.into())]),
            args: Some(args.clone()),
            registry: None,
            mounts: None,
        };
        let update = UpdatePodRequest {
            args: Some(args.clone()),
            ..UpdatePodRequest::default()
        };
        let pod: Pod =
            serde_json::from_value(serde_json::json!({"id": "x", "args": args})).unwrap();
        for shown in [
            format!("{request:?}"),
            format!("{update:?}"),
            format!("{pod:?}"),
        ] {
            assert!(!shown.contains(secret), "{shown}");
            assert!(shown.contains("args"), "{shown}");
        }
    }

    #[test]
    fn create_request_omits_unset_fields_and_always_sends_gpu_count() {
        let request = CreatePodRequest {
            name: "n".into(),
            image: Some("img".into()),
            template_id: None,
            gpu: GpuSpec {
                id: "g".into(),
                count: 1,
            },
            cloud: "SECURE".into(),
            data_center_ids: vec![],
            disk: None,
            ports: vec![],
            env: BTreeMap::new(),
            args: None,
            registry: None,
            mounts: None,
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name":"n","image":"img","gpu":{"id":"g","count":1},"cloud":"SECURE"})
        );
    }

    #[test]
    fn runtime_utilization_decodes_and_a_malformed_report_costs_only_itself() {
        let pod: Pod = serde_json::from_str(
            r#"{"id":"p","status":"RUNNING","runtime":{"uptime":60,
            "cpu":{"util":45},"memory":{"util":"12.5"},
            "gpus":[{"util":94,"memoryUtil":78},{"util":null}]}}"#,
        )
        .unwrap();
        let runtime = pod.runtime.unwrap();
        assert_eq!(runtime.cpu.unwrap().util, Some(45.0));
        assert_eq!(runtime.memory.unwrap().util, Some(12.5));
        assert_eq!(runtime.gpus.len(), 2);
        assert_eq!(runtime.gpus[0].memory_util, Some(78.0));
        assert_eq!(runtime.gpus[1].util, None);

        let odd: Pod = serde_json::from_str(
            r#"{"id":"p","runtime":{"uptime":5,"cpu":"busy","memory":null,"gpus":"n/a",
            "ports":[{"private":22,"public":1,"type":"tcp","ip":"1.2.3.4"}]}}"#,
        )
        .unwrap();
        let runtime = odd.runtime.unwrap();
        assert_eq!(runtime.cpu, None);
        assert_eq!(runtime.memory, None);
        assert!(runtime.gpus.is_empty());
        assert_eq!(runtime.ports.len(), 1, "the rest of the report survives");
    }
}
