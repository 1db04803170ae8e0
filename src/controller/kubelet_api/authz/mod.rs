//! Authorization of kubelet API requests, as a kubelet in webhook mode does it: the request's
//! method and path map to `nodes/<subresource>` on this node (`attributes`, pure), and a
//! SubjectAccessReview asks the apiserver whether the caller's certificate identity (CN the
//! user, O values the groups) may do that. Answers are cached briefly (allowed 5 min, denied
//! 30 s, the kubelet's defaults); a review that fails allows nothing.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::Api;
use kube::api::PostParams;

/// How long an allowed answer is reused (the kubelet's `authorization.webhook.cacheAuthorizedTTL`).
pub(crate) const ALLOWED_TTL: Duration = Duration::from_secs(5 * 60);
/// How long a denied answer is reused (`cacheUnauthorizedTTL`).
pub(crate) const DENIED_TTL: Duration = Duration::from_secs(30);
/// Answers kept at most; beyond it the one closest to expiring goes first.
pub(crate) const CACHE_CAPACITY: usize = 1024;
/// A review the apiserver has not answered by then fails the request.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The authenticated caller: a client certificate's CN and O values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// The group every authenticated caller is in, added as the kubelet's authenticator does.
const AUTHENTICATED: &str = "system:authenticated";

impl User {
    /// The user a verified client certificate (DER) names, as the apiserver's and the
    /// kubelet's x509 authenticator read it: the subject's CN, which must not be empty, is the
    /// user; its O values, then `system:authenticated`, the groups.
    pub(crate) fn from_certificate(der: &[u8]) -> Option<Self> {
        let subject = runpod_certs::inspect::subject(der).ok()?;
        let name = subject.common_name.filter(|cn| !cn.is_empty())?;
        let mut groups = subject.organizations;
        if !groups.iter().any(|g| g == AUTHENTICATED) {
            groups.push(AUTHENTICATED.to_owned());
        }
        Some(Self { name, groups })
    }
}

/// What a request asks of the node, in API terms: `<verb>` on `nodes/<subresource>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Attributes {
    pub verb: &'static str,
    pub subresource: &'static str,
}

/// The kubelet's mapping (`pkg/kubelet/server/auth.go`, `GetRequestAttributes`): the HTTP
/// method gives the verb, the path the subresource: `/stats`, `/metrics` and `/logs` and
/// below are `stats`, `metrics` and `log`; everything else, `/containerLogs` included, is
/// `proxy`. `None` for a method with no API verb: the kubelet would ask with an empty verb,
/// which only a wildcard rule allows; such a request is refused without asking. The streaming
/// paths (`/exec`, `/attach`, `/portForward`, `/run`) are `create` whatever the method: they
/// open a shell or a socket, so `get nodes/proxy` (which monitoring agents hold) must never
/// reach them (their handlers also accept POST only).
pub(crate) fn attributes(method: &Method, path: &str) -> Option<Attributes> {
    if is_streaming(path) {
        return Some(Attributes {
            verb: "create",
            subresource: "proxy",
        });
    }
    let verb = match *method {
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => return None,
    };
    let subresource = if is_subpath(path, "/stats") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs") {
        "log"
    } else {
        "proxy"
    };
    Some(Attributes { verb, subresource })
}

/// The paths that open a shell or a connection into a pod: the apiserver only ever POSTs them.
pub(crate) fn is_streaming(path: &str) -> bool {
    ["/exec", "/attach", "/portForward", "/run"]
        .iter()
        .any(|prefix| is_subpath(path, prefix))
}

/// `path` is `prefix` itself or below it (`/logs/x`, not `/logsx`); a trailing `/` on
/// `prefix` is ignored.
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The review asking whether `user` may do `attributes` on node `node`.
pub(crate) fn review(user: &User, attributes: Attributes, node: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            groups: Some(user.groups.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(attributes.verb.to_owned()),
                version: Some("v1".to_owned()),
                resource: Some("nodes".to_owned()),
                subresource: Some(attributes.subresource.to_owned()),
                name: Some(node.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// The apiserver's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    Allowed,
    /// With the authorizer's reason or evaluation error, when it gave one.
    Denied(String),
}

impl Decision {
    /// Only an explicit `allowed` allows; no opinion is a denial, as with a kubelet whose only
    /// authorizer is the webhook.
    pub(crate) fn of(status: &SubjectAccessReviewStatus) -> Self {
        if status.allowed {
            return Decision::Allowed;
        }
        let reason = [&status.reason, &status.evaluation_error]
            .into_iter()
            .flatten()
            .filter(|text| !text.is_empty())
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        Decision::Denied(reason)
    }

    fn ttl(&self) -> Duration {
        match self {
            Decision::Allowed => ALLOWED_TTL,
            Decision::Denied(_) => DENIED_TTL,
        }
    }
}

type Key = (User, Attributes);

/// Recent answers, each until its expiry, at most `capacity` of them.
#[derive(Debug)]
pub(crate) struct DecisionCache {
    entries: HashMap<Key, (Decision, Instant)>,
    capacity: usize,
}

impl DecisionCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity,
        }
    }

    /// The answer for `key` if it has not expired at `now`.
    pub(crate) fn get(&self, key: &Key, now: Instant) -> Option<Decision> {
        self.entries
            .get(key)
            .filter(|(_, expires)| now < *expires)
            .map(|(decision, _)| decision.clone())
    }

    /// Keeps `decision` for its TTL from `now`. When full, expired answers go first, then the
    /// one that would expire soonest.
    pub(crate) fn insert(&mut self, key: Key, decision: Decision, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, expires)| now < *expires);
            if self.entries.len() >= self.capacity {
                let soonest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(key, _)| key.clone());
                if let Some(soonest) = soonest {
                    self.entries.remove(&soonest);
                }
            }
        }
        let expires = now + decision.ttl();
        self.entries.insert(key, (decision, expires));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Sends a SubjectAccessReview and returns the apiserver's verdict.
pub(crate) trait Reviewer: Send + Sync {
    fn review(
        &self,
        review: SubjectAccessReview,
    ) -> impl Future<Output = anyhow::Result<SubjectAccessReviewStatus>> + Send;
}

impl Reviewer for kube::Client {
    async fn review(
        &self,
        review: SubjectAccessReview,
    ) -> anyhow::Result<SubjectAccessReviewStatus> {
        let api: Api<SubjectAccessReview> = Api::all(self.clone());
        let answered = api.create(&PostParams::default(), &review).await?;
        answered
            .status
            .ok_or_else(|| anyhow::anyhow!("the SubjectAccessReview came back without a status"))
    }
}

/// Decides kubelet API requests for one node.
pub(crate) struct Authorizer<R> {
    reviewer: R,
    node: String,
    cache: Mutex<DecisionCache>,
}

impl<R: Reviewer> Authorizer<R> {
    pub(crate) fn new(reviewer: R, node: String) -> Self {
        Self {
            reviewer,
            node,
            cache: Mutex::new(DecisionCache::new(CACHE_CAPACITY)),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, DecisionCache> {
        match self.cache.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Whether `user` may do `attributes` on the node: a cached answer, else a review. An error
    /// (the apiserver unreachable, the review refused or late) is not cached.
    pub(crate) async fn authorize(
        &self,
        user: &User,
        attributes: Attributes,
    ) -> anyhow::Result<Decision> {
        let key = (user.clone(), attributes);
        if let Some(decision) = self.cache().get(&key, Instant::now()) {
            return Ok(decision);
        }
        let review = review(user, attributes, &self.node);
        let status = tokio::time::timeout(REVIEW_TIMEOUT, self.reviewer.review(review))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {REVIEW_TIMEOUT:?}"))??;
        let decision = Decision::of(&status);
        self.cache().insert(key, decision.clone(), Instant::now());
        Ok(decision)
    }
}

/// The user the TLS peer's verified client certificate names; `None` for an anonymous peer
/// (or a certificate without a CN). Set on each connection's service.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub Option<Arc<User>>);

/// The 401 answer: either way of authenticating is accepted.
pub(crate) const UNAUTHENTICATED: &str = "runpod-kubelet: authentication required: a client certificate \
    from the cluster CA naming a user (CN), or a bearer token the apiserver accepts\n";

/// The middleware in front of every path: 401 without a user, 405 for a method with no API
/// verb, 403 when the apiserver does not allow the request, 500 when it could not be asked;
/// else the request goes on.
pub(crate) async fn authorize<R: Reviewer + 'static>(
    State(authorizer): State<Arc<Authorizer<R>>>,
    axum::Extension(Caller(caller)): axum::Extension<Caller>,
    request: Request,
    next: Next,
) -> Response {
    let Some(user) = caller else {
        return (StatusCode::UNAUTHORIZED, UNAUTHENTICATED).into_response();
    };
    let Some(attributes) = attributes(request.method(), request.uri().path()) else {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "runpod-kubelet: method {} is not served\n",
                request.method()
            ),
        )
            .into_response();
    };
    let asked = format!(
        "user={}, verb={}, resource=nodes, subresource={}",
        user.name, attributes.verb, attributes.subresource
    );
    match authorizer.authorize(&user, attributes).await {
        // A shell or a socket is only ever opened by POST (as the apiserver sends it): any
        // other method is refused before anything is upgraded.
        Ok(Decision::Allowed)
            if is_streaming(request.uri().path()) && request.method() != Method::POST =>
        {
            (
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "runpod-kubelet: {} is served for POST only (asked with {})\n",
                    request.uri().path(),
                    request.method()
                ),
            )
                .into_response()
        }
        Ok(Decision::Allowed) => next.run(request).await,
        Ok(Decision::Denied(reason)) => {
            tracing::info!(user = %user.name, groups = ?user.groups, verb = attributes.verb,
                subresource = attributes.subresource, %reason, "kubelet API request forbidden");
            let reason = if reason.is_empty() {
                String::new()
            } else {
                format!(": {reason}")
            };
            (
                StatusCode::FORBIDDEN,
                format!("runpod-kubelet: Forbidden ({asked}){reason}\n"),
            )
                .into_response()
        }
        Err(error) => {
            tracing::warn!(user = %user.name, %error, "kubelet API authorization failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("runpod-kubelet: Authorization error ({asked}): {error}\n"),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests;
