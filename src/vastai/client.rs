//! The Vast.ai HTTP client: one request path (pacer → bearer request → classification), retries
//! with backoff for calls that are safe to repeat, and the read, destroy and log calls. Creates
//! are sent once here; [`super::placement`] decides what follows an unclear answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use reqwest::{Method, Url};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::debug;

use super::error::VastError;
use super::label::Label;
use super::limiter::{Pacer, Paces, Route};
use super::model::{
    CreateReply, CreateRequest, GetReply, Instance, ListPage, LogsReply, Offer, SearchReply,
};
use super::select::OfferQuery;
use crate::http::{ApiKey, KeyError, api_client, error_chain};
use crate::provider::metrics::CloudApi;

/// The environment variable holding the key; never a flag, so it stays out of `ps` output.
pub const API_KEY_ENV: &str = "VAST_API_KEY";

/// The v1 list's page size limit.
const PAGE: u32 = 25;
/// A list longer than this many pages is refused (a cursor that never ends).
const MAX_PAGES: usize = 400;

/// The key: the shared key type (redacted `Debug`, no `Display`, header-safe) under Vast.ai's
/// variable and messages.
#[derive(Debug, Clone)]
pub struct VastKey(ApiKey);

impl VastKey {
    /// Reads `VAST_API_KEY`.
    pub fn from_env() -> Result<VastKey, ConfigError> {
        VastKey::new(std::env::var(API_KEY_ENV).map_err(|_| ConfigError::MissingKey)?)
    }

    pub fn new(key: String) -> Result<VastKey, ConfigError> {
        ApiKey::new(key).map(VastKey).map_err(|error| match error {
            KeyError::Malformed => ConfigError::MalformedKey,
            KeyError::Missing => ConfigError::MissingKey,
        })
    }
}

/// Start-up problems with the client configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "{API_KEY_ENV} is not set or empty; put the Vast.ai API key in that variable (from a Secret)"
    )]
    MissingKey,
    #[error("{API_KEY_ENV} contains characters that cannot be sent in an HTTP header")]
    MalformedKey,
    #[error(transparent)]
    Setup(#[from] crate::http::SetupError),
}

pub use crate::http::RetryPolicy;

/// Vast.ai's timings: its lists lag a create by up to minutes.
pub fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        attempts: 4,
        base_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(30),
        lookup_attempts: 8,
        lookup_interval: Duration::from_secs(15),
    }
}

/// Polls of a log's result URL, `interval` apart, before giving up.
#[derive(Debug, Clone, Copy)]
pub struct LogPolls {
    pub count: u32,
    pub interval: Duration,
}

impl Default for LogPolls {
    fn default() -> Self {
        LogPolls {
            count: 30,
            interval: Duration::from_millis(500),
        }
    }
}

/// Client settings, from the controller's flags.
#[derive(Debug, Clone)]
pub struct VastConfig {
    /// Server root, e.g. `https://console.vast.ai`; `/api/v0/...` and `/api/v1/...` are appended.
    pub api_url: String,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub paces: Paces,
    pub retry: RetryPolicy,
    pub log_polls: LogPolls,
    /// PEM roots added to the compiled-in ones (`--cloud-ca-file`).
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for VastConfig {
    fn default() -> Self {
        VastConfig {
            api_url: "https://console.vast.ai".to_owned(),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            paces: Paces::default(),
            retry: retry_policy(),
            log_polls: LogPolls::default(),
            ca_file: None,
        }
    }
}

/// What a destroy found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destroyed {
    Destroyed,
    /// 404: gone already, which is what was wanted.
    AlreadyGone,
}

/// The Vast.ai client. Clones share the connection pool, the pacer and the memory of recent
/// creates.
#[derive(Debug, Clone)]
pub struct VastClient {
    http: reqwest::Client,
    root: Url,
    key: VastKey,
    pacer: Arc<Mutex<Pacer>>,
    config: Arc<VastConfig>,
    recent: Arc<Mutex<HashMap<String, u64>>>,
    /// Offers this client bought or found gone lately (`placement`): pods that searched at the
    /// same time got the same cheapest offers, and each create on one already taken is refused
    /// but spends a create slot (4.6 s).
    pub(super) taken_offers: Arc<Mutex<HashMap<u64, tokio::time::Instant>>>,
    /// Every call is counted here (provider `vastai`), when set.
    metrics: Option<CloudApi>,
}

impl VastClient {
    pub fn new(config: VastConfig, key: VastKey) -> Result<VastClient, ConfigError> {
        let (root, http) = api_client(
            "--vastai-api-url",
            &config.api_url,
            config.ca_file.as_deref(),
            config.connect_timeout,
            None,
        )?;
        Ok(VastClient {
            http,
            root,
            key,
            pacer: Arc::new(Mutex::new(Pacer::new(config.paces.clone()))),
            config: Arc::new(config),
            recent: Arc::default(),
            taken_offers: Arc::default(),
            metrics: None,
        })
    }

    /// Records every call: requests, latency, 429s and the pacer's state.
    pub fn with_metrics(mut self, metrics: CloudApi) -> VastClient {
        self.metrics = Some(metrics);
        self
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.config.retry
    }

    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Url {
        let mut url = self.root.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            // Every official client keeps the trailing slash.
            path.pop_if_empty().push("api").extend(segments).push("");
        }
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        url
    }

    /// One call, no retries: waits for the route's slot, sends, classifies. A 2xx comes back
    /// as its body.
    async fn send_once(
        &self,
        route: Route,
        method: Method,
        url: Url,
        body: Option<&Value>,
    ) -> Result<bytes::Bytes, VastError> {
        let asked = tokio::time::Instant::now();
        loop {
            let (reservation, left) = {
                let mut pacer = self.pacer();
                let now = tokio::time::Instant::now();
                (pacer.reservation(route, now), pacer.window_left(route, now))
            };
            if let Some((window, remaining)) = left
                && let Some(metrics) = &self.metrics
            {
                metrics.quota(&window, remaining);
            }
            tokio::time::sleep_until(reservation.start).await;
            // Refused while this call waited: going out now would land in the route's hold.
            if self.pacer().still_good(route, reservation) {
                break;
            }
        }
        if let Some(metrics) = &self.metrics {
            metrics.waited(route.as_str(), asked.elapsed());
        }
        let sent = tokio::time::Instant::now();
        let mut request = self
            .http
            .request(method, url)
            .bearer_auth(self.key.0.expose())
            .timeout(self.config.request_timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let result = async {
            let response = request.send().await.map_err(|e| self.transport(&e))?;
            let status = response.status().as_u16();
            let bytes = response.bytes().await.map_err(|e| self.transport(&e))?;
            if (200..300).contains(&status) {
                Ok(bytes)
            } else {
                Err(VastError::from_response(status, &bytes))
            }
        }
        .await;
        let outcome = result.as_ref().map_or_else(VastError::kind, |_| "ok");
        debug!(route = route.as_str(), outcome, "vastai call");
        if let Some(metrics) = &self.metrics {
            metrics.record(route.as_str(), outcome, sent.elapsed());
        }
        if let Err(VastError::RateLimited { .. }) = &result {
            // No Retry-After: the route shuts for its penalty, or a backoff of our own.
            let backoff = self.config.retry.backoff(0);
            self.pacer()
                .refused(route, tokio::time::Instant::now(), backoff);
        }
        result
    }

    fn transport(&self, error: &reqwest::Error) -> VastError {
        if error.is_timeout() {
            VastError::Timeout {
                timeout: self.config.request_timeout,
            }
        } else {
            VastError::Transport {
                message: error_chain(error),
            }
        }
    }

    /// A call that is safe to repeat, with backoff on 429, 5xx and transport failures.
    async fn send(
        &self,
        route: Route,
        method: Method,
        url: Url,
        body: Option<&Value>,
    ) -> Result<bytes::Bytes, VastError> {
        let attempts = self.config.retry.attempts.max(1);
        let mut attempt = 0;
        loop {
            match self
                .send_once(route, method.clone(), url.clone(), body)
                .await
            {
                Err(error) if error.is_transient() && attempt + 1 < attempts => {
                    let delay = self.config.retry.backoff(attempt);
                    debug!(
                        route = route.as_str(),
                        error = error.kind(),
                        ?delay,
                        "vastai retry"
                    );
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Offers matching `query`, cheapest first, each re-checked against it (rows outside are
    /// dropped).
    pub async fn search(&self, query: &OfferQuery) -> Result<Vec<Offer>, VastError> {
        let url = self.url(&["v0", "bundles"], &[]);
        let bytes = self
            .send(Route::Search, Method::POST, url, Some(&query.body()))
            .await?;
        let reply: SearchReply = decode(&bytes)?;
        Ok(reply
            .offers
            .into_iter()
            .filter(|offer| match query.rejects(offer) {
                Some(reason) => {
                    debug!(%reason, "vastai offer dropped");
                    false
                }
                None => true,
            })
            .collect())
    }

    /// One create on one offer: the new instance id, or why not. Never repeated here, except
    /// after a 429 (a refusal: nothing was bought).
    pub async fn create_once(
        &self,
        offer_id: u64,
        request: &CreateRequest,
    ) -> Result<u64, VastError> {
        let url = self.url(&["v0", "asks", &offer_id.to_string()], &[]);
        let body = request.body();
        let attempts = self.config.retry.attempts.max(1);
        let mut attempt = 0;
        let bytes = loop {
            match self
                .send_once(Route::Create, Method::PUT, url.clone(), Some(&body))
                .await
            {
                Err(VastError::RateLimited { .. }) if attempt + 1 < attempts => {
                    tokio::time::sleep(self.config.retry.backoff(attempt)).await;
                    attempt += 1;
                }
                other => break other?,
            }
        };
        let reply: CreateReply = decode(&bytes)?;
        match (reply.success, reply.new_contract) {
            (Some(false), _) => Err(VastError::Refused {
                detail: reply.msg.or(reply.error).unwrap_or_default(),
            }),
            (_, Some(id)) => {
                self.remember(&request.label, id);
                Ok(id)
            }
            // A 2xx without an id: something may have been bought.
            (_, None) => Err(VastError::Decode {
                status: 200,
                message: "the create answer has no new_contract".to_owned(),
            }),
        }
    }

    /// One instance; `None` when it does not exist (any more).
    pub async fn get(&self, id: u64) -> Result<Option<Instance>, VastError> {
        let url = self.url(
            &["v0", "instances", &id.to_string()],
            &[("owner", "me".to_owned())],
        );
        match self.send(Route::Get, Method::GET, url, None).await {
            Ok(bytes) => Ok(decode::<GetReply>(&bytes)?.instances),
            Err(VastError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Every instance matching `select_filters` (e.g. `{"label": {"eq": ...}}`), all pages.
    pub async fn list(&self, filters: &Value) -> Result<Vec<Instance>, VastError> {
        let mut instances = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut query = vec![
                ("limit", PAGE.to_string()),
                ("select_filters", filters.to_string()),
                ("order_by", json!([{"col": "id", "dir": "asc"}]).to_string()),
            ];
            if let Some(token) = &token {
                query.push(("after_token", token.clone()));
            }
            let url = self.url(&["v1", "instances"], &query);
            let page: ListPage = decode(&self.send(Route::List, Method::GET, url, None).await?)?;
            for row in page.instances {
                let labelled_ours = row
                    .get("label")
                    .and_then(Value::as_str)
                    .and_then(Label::parse)
                    .is_some();
                match serde_json::from_value::<Instance>(row) {
                    Ok(instance) => instances.push(instance),
                    // One of ours must never be missing from a list that counts as complete.
                    Err(error) if labelled_ours => {
                        return Err(VastError::Decode {
                            status: 200,
                            message: format!("a labelled instance could not be read: {error}"),
                        });
                    }
                    Err(error) => debug!(%error, "vastai list row of another tool skipped"),
                }
            }
            match page.next_token.filter(|next| !next.is_empty()) {
                Some(next) if token.as_ref() == Some(&next) => {
                    return Err(VastError::Decode {
                        status: 200,
                        message: "the list repeated its page cursor".to_owned(),
                    });
                }
                Some(next) => token = Some(next),
                None => return Ok(instances),
            }
        }
        Err(VastError::Decode {
            status: 200,
            message: format!("the list did not end within {MAX_PAGES} pages"),
        })
    }

    /// Every instance carrying `label`, oldest first, including one this client created
    /// lately that the lagging list does not show yet.
    pub async fn find_by_label(&self, label: &Label) -> Result<Vec<Instance>, VastError> {
        let text = label.to_string();
        let mut found = self.list(&json!({"label": {"eq": text}})).await?;
        // The server filters; this is our own guard against a filter it ignored.
        found.retain(|instance| instance.label.as_deref() == Some(text.as_str()));
        let recent = self.recent().get(&text).copied();
        if let Some(id) = recent
            && !found.iter().any(|instance| instance.id == id)
            && let Some(instance) = self.get(id).await?
        {
            found.push(instance);
        }
        found.sort_by_key(|instance| instance.id);
        Ok(found)
    }

    /// Destroys an instance (never stops it: a stopped instance bills storage).
    pub async fn destroy(&self, id: u64) -> Result<Destroyed, VastError> {
        let url = self.url(&["v0", "instances", &id.to_string()], &[]);
        let outcome = match self
            .send(Route::Destroy, Method::DELETE, url, Some(&json!({})))
            .await
        {
            Ok(_) => Destroyed::Destroyed,
            Err(VastError::NotFound { .. }) => Destroyed::AlreadyGone,
            Err(error) => return Err(error),
        };
        self.recent().retain(|_, known| *known != id);
        Ok(outcome)
    }

    /// The last `tail` lines of the container's log: `request_logs`, then the result URL,
    /// polled (without the key: it is another host) until the upload is there.
    pub async fn logs(&self, id: u64, tail: u32) -> Result<String, VastError> {
        let url = self.url(&["v0", "instances", "request_logs", &id.to_string()], &[]);
        let body = json!({"tail": tail.to_string()});
        let reply: LogsReply = decode(
            &self
                .send(Route::Logs, Method::PUT, url, Some(&body))
                .await?,
        )?;
        let result_url = reply
            .result_url
            .filter(|url| !url.is_empty())
            .ok_or_else(|| VastError::Refused {
                detail: reply
                    .msg
                    .unwrap_or_else(|| "no result_url in the answer".to_owned()),
            })?;
        let result_url = Url::parse(&result_url).map_err(|e| VastError::Decode {
            status: 200,
            message: format!("result_url is not a URL: {e}"),
        })?;
        let polls = self.config.log_polls;
        for _ in 0..polls.count.max(1) {
            let response = self
                .http
                .get(result_url.clone())
                .timeout(self.config.request_timeout)
                .send()
                .await
                .map_err(|e| self.transport(&e))?;
            let status = response.status().as_u16();
            if status == 200 {
                let bytes = response.bytes().await.map_err(|e| self.transport(&e))?;
                return Ok(String::from_utf8_lossy(&bytes).into_owned());
            }
            if status != 404 && status != 403 {
                return Err(VastError::Unexpected {
                    status,
                    detail: "reading the log file".to_owned(),
                });
            }
            tokio::time::sleep(polls.interval).await;
        }
        Err(VastError::Timeout {
            timeout: polls.interval * polls.count.max(1),
        })
    }

    /// Whether this client created `id` and has not destroyed it: a read that says it does
    /// not exist then only lags the create.
    pub fn created_lately(&self, id: u64) -> bool {
        self.recent().values().any(|known| *known == id)
    }

    fn remember(&self, label: &str, id: u64) {
        self.recent().insert(label.to_owned(), id);
    }

    fn recent(&self) -> MutexGuard<'_, HashMap<String, u64>> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pacer(&self) -> MutexGuard<'_, Pacer> {
        self.pacer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, VastError> {
    serde_json::from_slice(bytes).map_err(|e| VastError::Decode {
        status: 200,
        message: e.to_string(),
    })
}
