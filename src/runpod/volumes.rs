//! RunPod network volumes (`/v2/network-volumes`): what a PersistentVolumeClaim of this
//! project's StorageClass becomes. A volume lives in one data centre, grows but never shrinks,
//! and carries no tags: it is found again by its name, which the controller derives from the
//! claim's UID.

use reqwest::Method;
use serde::{Deserialize, Serialize};
use tracing::instrument;

use super::client::RunPodClient;
use super::error::ApiError;
use super::limiter::Priority;

/// A network volume as RunPod shows it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkVolume {
    pub id: String,
    #[serde(default)]
    pub name: String,
    /// GB.
    #[serde(default)]
    pub size: u32,
    #[serde(default)]
    pub data_center: String,
    #[serde(default, rename = "type")]
    pub tier: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeList {
    #[serde(default)]
    network_volumes: Vec<NetworkVolume>,
}

/// `POST /v2/network-volumes`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateVolume<'a> {
    pub name: &'a str,
    pub size: u32,
    pub data_center: &'a str,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub tier: Option<&'a str>,
}

#[derive(Serialize)]
struct Resize {
    size: u32,
}

impl RunPodClient {
    /// `GET /v2/network-volumes`: every volume of the account.
    #[instrument(skip(self), level = "debug")]
    pub async fn list_volumes(&self) -> Result<Vec<NetworkVolume>, ApiError> {
        let answer = self
            .send(
                "listNetworkVolumes",
                Priority::Routine,
                Method::GET,
                &["network-volumes"],
                &[],
                None,
            )
            .await?;
        Ok(Self::decode::<VolumeList>(&answer)?.network_volumes)
    }

    /// `POST /v2/network-volumes`, exactly once: an answer lost on the way is settled by the
    /// caller, which lists by name before it ever creates again.
    #[instrument(skip(self), level = "debug")]
    pub async fn create_volume_once(
        &self,
        request: &CreateVolume<'_>,
    ) -> Result<NetworkVolume, ApiError> {
        let answer = self
            .send_once(
                "createNetworkVolume",
                Priority::Create,
                Method::POST,
                &["network-volumes"],
                &[],
                Some(request),
            )
            .await?;
        Self::decode(&answer)
    }

    /// `PATCH /v2/network-volumes/{id}` with a larger size (RunPod never shrinks one).
    #[instrument(skip(self), level = "debug")]
    pub async fn resize_volume(&self, id: &str, size: u32) -> Result<NetworkVolume, ApiError> {
        let answer = self
            .send(
                "updateNetworkVolume",
                Priority::Create,
                Method::PATCH,
                &["network-volumes", id],
                &[],
                Some(&Resize { size }),
            )
            .await?;
        Self::decode(&answer)
    }

    /// `DELETE /v2/network-volumes/{id}`; `Ok(false)` when it was gone already.
    #[instrument(skip(self), level = "debug")]
    pub async fn delete_volume(&self, id: &str) -> Result<bool, ApiError> {
        match self
            .send(
                "deleteNetworkVolume",
                Priority::Cleanup,
                Method::DELETE,
                &["network-volumes", id],
                &[],
                None,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(ApiError::NotFound { .. }) => Ok(false),
            Err(error) => Err(error),
        }
    }
}
