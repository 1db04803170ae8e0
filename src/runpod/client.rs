//! The RunPod REST v2 HTTP client: one request path (rate limiter → bearer request → error
//! classification) and the retry rules for idempotent calls. Creates are never retried here;
//! `placement` owns that, because a failed create may still have made a billed pod.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, instrument};

use super::catalogue::{Catalogue, DataCenter, DataCenterList, GpuType, GpuTypeList};
use super::config::{ClientConfig, ConfigError, RetryPolicy};
use super::error::{ApiError, Recovery};
use super::limiter::{Permit, Priority, RateLimiter};
use super::metrics::RunPodMetrics;
use super::model::{CreatePodRequest, Pod, PodAction, PodList, PodStatus, UpdatePodRequest};
use crate::http::{ApiKey, api_client, error_chain};
use runpod_contract::CloudType;

/// What a DELETE found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    Terminated,
    /// 404: already gone, which is what was wanted (api-notes P8).
    AlreadyGone,
}

/// A successful response.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

/// The RunPod REST v2 client. Clone it freely: clones share the connection pool and limiter.
#[derive(Debug, Clone)]
pub struct RunPodClient {
    http: reqwest::Client,
    root: Url,
    key: ApiKey,
    limiter: Arc<RateLimiter>,
    config: Arc<ClientConfig>,
    metrics: Option<Arc<RunPodMetrics>>,
    recent: Arc<RecentCreates>,
}

/// Pods this client created lately, by name. RunPod's list lags behind a create (api-notes
/// P3), so a second `create_idempotent` for the same name soon after the first would not find
/// the pod in the list; this remembers it (until deleted, or for `RECENT_TTL`).
#[derive(Debug, Default)]
pub(crate) struct RecentCreates(
    std::sync::Mutex<std::collections::HashMap<String, (String, tokio::time::Instant)>>,
);

/// Far longer than any list lag seen; entries are dropped on delete anyway.
const RECENT_TTL: Duration = Duration::from_secs(600);

impl RecentCreates {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (String, tokio::time::Instant)>>
    {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn remember(&self, name: &str, pod_id: &str) {
        let mut map = self.lock();
        map.retain(|_, (_, at)| at.elapsed() < RECENT_TTL);
        map.insert(
            name.to_owned(),
            (pod_id.to_owned(), tokio::time::Instant::now()),
        );
    }

    pub(crate) fn pod_id(&self, name: &str) -> Option<String> {
        self.lock()
            .get(name)
            .filter(|(_, at)| at.elapsed() < RECENT_TTL)
            .map(|(id, _)| id.clone())
    }

    pub(crate) fn forget_pod(&self, pod_id: &str) {
        self.lock().retain(|_, (id, _)| id != pod_id);
    }
}

impl RunPodClient {
    /// Builds the client. TLS is rustls with the ring provider and the webpki roots.
    pub fn new(config: ClientConfig, key: ApiKey) -> Result<RunPodClient, ConfigError> {
        // Followed log streams sit idle for long stretches: keepalive notices dead peers.
        let (root, http) = api_client(
            "--runpod-api-url",
            &config.api_url,
            config.ca_file.as_deref(),
            config.connect_timeout,
            Some(Duration::from_secs(30)),
        )?;
        Ok(RunPodClient {
            http,
            root,
            key,
            limiter: RateLimiter::new(config.requests_per_minute),
            config: Arc::new(config),
            metrics: None,
            recent: Arc::default(),
        })
    }

    /// Records every call into these metrics.
    pub fn with_metrics(mut self, metrics: Arc<RunPodMetrics>) -> RunPodClient {
        self.metrics = Some(metrics);
        self
    }

    /// Counts one finished call (`operation` is the spec's operationId).
    pub(crate) fn record(
        &self,
        operation: &'static str,
        result: Result<(), &ApiError>,
        elapsed: Duration,
    ) {
        if let Some(metrics) = &self.metrics {
            metrics.record(
                operation,
                result.map_or_else(ApiError::kind, |()| "ok"),
                elapsed,
            );
            metrics.quota(&self.limiter.windows());
        }
    }

    /// The shared limiter (for metrics and tests).
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        &self.limiter
    }

    pub(crate) fn recent(&self) -> &RecentCreates {
        &self.recent
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.config.request_timeout
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.config.retry
    }

    pub(crate) fn logs_url(&self, pod_id: &str, query: &[(&str, String)]) -> Url {
        self.url(&["pods", pod_id, "logs"], query)
    }

    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Url {
        let mut url = self.root.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().push("v2").extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        url
    }

    /// Starts a request with the bearer key (marked sensitive, so never printed by reqwest).
    pub(crate) fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        self.http
            .request(method, url)
            .bearer_auth(self.key.expose())
    }

    /// One request, no retries: waits for the limiter, sends, classifies.
    pub(crate) async fn send_once(
        &self,
        operation: &'static str,
        priority: Priority,
        method: Method,
        segments: &[&str],
        query: &[(&str, String)],
        body: Option<&(dyn erased::Body + Sync)>,
    ) -> Result<Answer, ApiError> {
        let url = self.url(segments, query);
        let asked = tokio::time::Instant::now();
        let permit = self.limiter.acquire(priority).await;
        let started = tokio::time::Instant::now();
        if let Some(metrics) = &self.metrics {
            metrics.waited(operation, started - asked);
        }
        // reqwest's timeout covers the whole exchange, body included.
        let mut request = self
            .request(method.clone(), url)
            .timeout(self.config.request_timeout);
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_json());
        }
        let result = match self.respond(permit, request).await {
            Ok(response) => {
                let status = response.status();
                response
                    .bytes()
                    .await
                    .map(|body| Answer { status, body })
                    .map_err(|e| self.transport_error(&e))
            }
            Err(error) => Err(error),
        };
        let elapsed = started.elapsed();
        debug!(
            method = %method,
            path = %segments.join("/"),
            outcome = result.as_ref().map_or_else(ApiError::kind, |_| "ok"),
            elapsed_ms = elapsed.as_millis() as u64,
            "runpod request"
        );
        self.record(operation, result.as_ref().map(|_| ()), elapsed);
        result
    }

    /// Sends a request the limiter let go, learns from its rate-limit headers (and a 429's
    /// `Retry-After`), and turns an unsuccessful answer into its error. The caller reads, or
    /// streams, the body of a success.
    pub(crate) async fn respond(
        &self,
        permit: Permit,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ApiError> {
        let response = request.send().await.map_err(|e| self.transport_error(&e))?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        permit.observe(
            response.headers(),
            (status == StatusCode::TOO_MANY_REQUESTS)
                .then_some(retry_after.unwrap_or(Duration::from_secs(1))),
        );
        if status.is_success() {
            return Ok(response);
        }
        let body = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(&e))?;
        Err(ApiError::from_response(status.as_u16(), retry_after, &body))
    }

    pub(crate) fn transport_error(&self, error: &reqwest::Error) -> ApiError {
        if error.is_timeout() {
            ApiError::Timeout {
                timeout: self.config.request_timeout,
            }
        } else {
            ApiError::Transport {
                message: error_chain(error),
            }
        }
    }

    /// An idempotent request with retries for 429, 5xx and timeouts.
    pub(crate) async fn send(
        &self,
        operation: &'static str,
        priority: Priority,
        method: Method,
        segments: &[&str],
        query: &[(&str, String)],
        body: Option<&(dyn erased::Body + Sync)>,
    ) -> Result<Answer, ApiError> {
        let mut attempt = 0;
        let mut rate_limited = 0;
        loop {
            match self
                .send_once(operation, priority, method.clone(), segments, query, body)
                .await
            {
                Err(ApiError::RateLimited { .. }) if rate_limited < 10 => {
                    // The limiter already holds every request until Retry-After has passed.
                    rate_limited += 1;
                }
                Err(error)
                    if error.recovery() == Recovery::Retry
                        && attempt + 1 < self.config.retry.attempts =>
                {
                    let delay = self.config.retry.backoff(attempt);
                    debug!(error = %error, attempt, delay_ms = delay.as_millis() as u64, "retrying runpod request");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    pub(crate) fn decode<T: DeserializeOwned>(answer: &Answer) -> Result<T, ApiError> {
        serde_json::from_slice(&answer.body).map_err(|e| ApiError::Decode {
            status: answer.status.as_u16(),
            message: e.to_string(),
        })
    }

    /// `GET /v2/pods`: every pod of the account in one call.
    #[instrument(skip(self), level = "debug")]
    pub async fn list_pods(&self) -> Result<Vec<Pod>, ApiError> {
        let answer = self
            .send(
                "listPods",
                Priority::Routine,
                Method::GET,
                &["pods"],
                &[],
                None,
            )
            .await?;
        Ok(Self::decode::<PodList>(&answer)?.pods)
    }

    /// Live pods with exactly this name: the idempotency lookup (names are deterministic).
    pub async fn find_by_name(&self, name: &str, priority: Priority) -> Result<Vec<Pod>, ApiError> {
        let answer = self
            .send("listPods", priority, Method::GET, &["pods"], &[], None)
            .await?;
        Ok(Self::decode::<PodList>(&answer)?
            .pods
            .into_iter()
            .filter(|pod| pod.name == name && pod.status != PodStatus::Terminated)
            .collect())
    }

    /// `GET /v2/pods/{id}`; `None` when RunPod does not know it (any more).
    #[instrument(skip(self), level = "debug")]
    pub async fn get_pod(&self, id: &str) -> Result<Option<Pod>, ApiError> {
        match self
            .send(
                "getPod",
                Priority::Routine,
                Method::GET,
                &["pods", id],
                &[],
                None,
            )
            .await
        {
            Ok(answer) => Ok(Some(Self::decode(&answer)?)),
            Err(ApiError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// `POST /v2/pods`, exactly once. Use `placement::create_idempotent` instead: it knows
    /// what to do when this fails ambiguously.
    #[instrument(skip(self, request), fields(name = %request.name, gpu = %request.gpu.id), level = "debug")]
    pub async fn create_pod_once(&self, request: &CreatePodRequest) -> Result<Pod, ApiError> {
        let answer = self
            .send_once(
                "createPod",
                Priority::Create,
                Method::POST,
                &["pods"],
                &[],
                Some(request),
            )
            .await?;
        Self::decode(&answer)
    }

    /// `PATCH /v2/pods/{id}`.
    #[instrument(skip(self, update), level = "debug")]
    pub async fn update_pod(&self, id: &str, update: &UpdatePodRequest) -> Result<Pod, ApiError> {
        let answer = self
            .send(
                "updatePod",
                Priority::Create,
                Method::PATCH,
                &["pods", id],
                &[],
                Some(update),
            )
            .await?;
        Self::decode(&answer)
    }

    /// `DELETE /v2/pods/{id}`: terminates (stops billing). 404 means already done.
    pub async fn delete_pod(&self, id: &str) -> Result<Deleted, ApiError> {
        self.delete_pod_as(id, Priority::EndsBilling).await
    }

    /// `DELETE /v2/pods/{id}` queued as `priority`: a stopped pod's termination waits behind
    /// calls that end GPU billing.
    #[instrument(skip(self), level = "debug")]
    pub async fn delete_pod_as(&self, id: &str, priority: Priority) -> Result<Deleted, ApiError> {
        match self
            .send(
                "deletePod",
                priority,
                Method::DELETE,
                &["pods", id],
                &[],
                None,
            )
            .await
        {
            Ok(_) => {
                self.recent.forget_pod(id);
                Ok(Deleted::Terminated)
            }
            Err(ApiError::NotFound { .. }) => {
                self.recent.forget_pod(id);
                Ok(Deleted::AlreadyGone)
            }
            Err(error) => Err(error),
        }
    }

    /// `POST /v2/pods/{id}/action`; the pod for start/stop/restart, `None` for terminate.
    #[instrument(skip(self), level = "debug")]
    pub async fn pod_action(&self, id: &str, action: PodAction) -> Result<Option<Pod>, ApiError> {
        let body = ActionBody { action };
        let priority = match action {
            PodAction::Stop | PodAction::Terminate => Priority::EndsBilling,
            _ => Priority::Create,
        };
        let answer = match self
            .send(
                "podAction",
                priority,
                Method::POST,
                &["pods", id, "action"],
                &[],
                Some(&body),
            )
            .await
        {
            Ok(answer) => answer,
            // Terminating something already gone (e.g. on a retry) is done, as for DELETE.
            Err(ApiError::NotFound { .. }) if action == PodAction::Terminate => {
                self.recent.forget_pod(id);
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        if answer.status == StatusCode::NO_CONTENT || answer.body.is_empty() {
            Ok(None)
        } else {
            Ok(Some(Self::decode(&answer)?))
        }
    }

    /// `GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=..&count=..`.
    pub async fn gpu_types(&self, cloud: CloudType, count: u32) -> Result<Vec<GpuType>, ApiError> {
        let query = [
            ("include", "AVAILABILITY".to_owned()),
            ("product", "POD".to_owned()),
            ("cloud", cloud.as_str().to_owned()),
            ("count", count.max(1).to_string()),
        ];
        let answer = self
            .send(
                "listGpuTypes",
                Priority::Routine,
                Method::GET,
                &["catalog", "gpus"],
                &query,
                None,
            )
            .await?;
        Ok(Self::decode::<GpuTypeList>(&answer)?.gpus)
    }

    /// `GET /v2/catalog/datacenters`.
    pub async fn data_centers(&self) -> Result<Vec<DataCenter>, ApiError> {
        let answer = self
            .send(
                "listDataCenters",
                Priority::Routine,
                Method::GET,
                &["catalog", "datacenters"],
                &[],
                None,
            )
            .await?;
        Ok(Self::decode::<DataCenterList>(&answer)?.data_centers)
    }

    /// The whole catalogue for placement: both clouds' GPU lists and the data centres.
    pub async fn catalogue(&self) -> Result<Catalogue, ApiError> {
        let secure = self.gpu_types(CloudType::Secure, 1).await?;
        let community = self.gpu_types(CloudType::Community, 1).await?;
        let data_centers = self
            .data_centers()
            .await?
            .into_iter()
            .map(|dc| (dc.id.clone(), dc))
            .collect();
        Ok(Catalogue {
            secure,
            community,
            data_centers,
        })
    }
}

#[derive(Serialize)]
struct ActionBody {
    action: PodAction,
}

/// Request bodies without making `send` generic over every body type.
pub(crate) mod erased {
    /// Anything we send as a JSON body.
    pub(crate) trait Body {
        fn to_json(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize> Body for T {
        fn to_json(&self) -> Vec<u8> {
            // Our request types are plain structs of strings, numbers and maps: they always
            // serialise; an empty body would be refused by the service, not silently accepted.
            serde_json::to_vec(self).unwrap_or_default()
        }
    }
}

/// Longest `Retry-After` honoured: a larger value is a bug on the other side, not a reason
/// to stop for days (or to overflow a clock).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// `Retry-After` in seconds (the form RunPod uses), capped.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    value
        .parse::<u64>()
        .ok()
        .map(|secs| Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}
