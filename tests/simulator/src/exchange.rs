//! What the simulator saw and answered: one [`Exchange`] per `/v2` request, so tests can check
//! every response against the OpenAPI contract afterwards (`SpecValidator::check_all`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The spec operations the simulator serves, named after their `operationId`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Operation {
    #[serde(rename = "listPods", alias = "ListPods")]
    ListPods,
    #[serde(rename = "createPod", alias = "CreatePod")]
    CreatePod,
    #[serde(rename = "getPod", alias = "GetPod")]
    GetPod,
    #[serde(rename = "updatePod", alias = "UpdatePod")]
    UpdatePod,
    #[serde(rename = "deletePod", alias = "DeletePod")]
    DeletePod,
    #[serde(rename = "podAction", alias = "PodAction")]
    PodAction,
    #[serde(rename = "getPodLogs", alias = "GetPodLogs")]
    GetPodLogs,
    #[serde(rename = "listGpuTypes", alias = "ListGpuTypes")]
    ListGpuTypes,
    #[serde(rename = "getGpuType", alias = "GetGpuType")]
    GetGpuType,
    #[serde(rename = "listDataCenters", alias = "ListDataCenters")]
    ListDataCenters,
    #[serde(rename = "getDataCenter", alias = "GetDataCenter")]
    GetDataCenter,
    #[serde(rename = "listNetworkVolumes")]
    ListNetworkVolumes,
    #[serde(rename = "createNetworkVolume")]
    CreateNetworkVolume,
    #[serde(rename = "getNetworkVolume")]
    GetNetworkVolume,
    #[serde(rename = "updateNetworkVolume")]
    UpdateNetworkVolume,
    #[serde(rename = "deleteNetworkVolume")]
    DeleteNetworkVolume,
}

impl Operation {
    /// Every operation, in spec order.
    pub const ALL: [Operation; 16] = [
        Operation::ListPods,
        Operation::CreatePod,
        Operation::GetPod,
        Operation::UpdatePod,
        Operation::DeletePod,
        Operation::PodAction,
        Operation::GetPodLogs,
        Operation::ListGpuTypes,
        Operation::GetGpuType,
        Operation::ListDataCenters,
        Operation::GetDataCenter,
        Operation::ListNetworkVolumes,
        Operation::CreateNetworkVolume,
        Operation::GetNetworkVolume,
        Operation::UpdateNetworkVolume,
        Operation::DeleteNetworkVolume,
    ];

    /// The spec's `operationId`, e.g. `"createPod"`.
    pub fn operation_id(&self) -> &'static str {
        match self {
            Operation::ListPods => "listPods",
            Operation::CreatePod => "createPod",
            Operation::GetPod => "getPod",
            Operation::UpdatePod => "updatePod",
            Operation::DeletePod => "deletePod",
            Operation::PodAction => "podAction",
            Operation::GetPodLogs => "getPodLogs",
            Operation::ListGpuTypes => "listGpuTypes",
            Operation::GetGpuType => "getGpuType",
            Operation::ListDataCenters => "listDataCenters",
            Operation::GetDataCenter => "getDataCenter",
            Operation::ListNetworkVolumes => "listNetworkVolumes",
            Operation::CreateNetworkVolume => "createNetworkVolume",
            Operation::GetNetworkVolume => "getNetworkVolume",
            Operation::UpdateNetworkVolume => "updateNetworkVolume",
            Operation::DeleteNetworkVolume => "deleteNetworkVolume",
        }
    }

    /// The operation with this `operationId`, if the simulator serves it.
    pub fn from_operation_id(id: &str) -> Option<Operation> {
        Operation::ALL
            .into_iter()
            .find(|op| op.operation_id() == id)
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.operation_id())
    }
}

/// One `/v2` request and the response the simulator gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    /// Arrival number (1, 2, …), taken when the rate limiter counted the request. Answers are
    /// recorded as they complete, so sort by this to see requests in the order the service
    /// counted them.
    #[serde(default)]
    pub arrival: u64,
    /// When the simulator recorded the answer, in milliseconds since the Unix epoch (for call
    /// mixes over time, e.g. the controller benchmark's per-30-seconds table).
    #[serde(default)]
    pub at_ms: u64,
    /// `GET`, `POST`, …
    pub method: String,
    /// The request path as sent, including the query string.
    pub path: String,
    /// The spec operation the path and method resolved to; `None` for unknown routes.
    pub operation: Option<Operation>,
    /// HTTP status of the response.
    pub status: u16,
    /// `Content-Type` of the response, if it had one.
    pub content_type: Option<String>,
    /// Response headers set by the simulator (lower-case names).
    pub headers: Vec<(String, String)>,
    /// Parsed JSON body; `None` for 204, SSE streams and non-JSON bodies.
    pub body: Option<Value>,
    /// The answer came from an injected fault (a status the test chose), not the service.
    #[serde(default)]
    pub injected: bool,
}

impl Exchange {
    /// The first response header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}
