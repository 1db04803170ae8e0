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
pub const ALLOWED_TTL: Duration = Duration::from_secs(5 * 60);
/// How long a denied answer is reused (`cacheUnauthorizedTTL`).
pub const DENIED_TTL: Duration = Duration::from_secs(30);
/// Answers kept at most; beyond it the one closest to expiring goes first.
pub const CACHE_CAPACITY: usize = 1024;
/// A review the apiserver has not answered by then fails the request.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The authenticated caller: a client certificate's CN and O values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// The group every authenticated caller is in, added as the kubelet's authenticator does.
const AUTHENTICATED: &str = "system:authenticated";

impl User {
    /// The user a verified client certificate (DER) names, as the apiserver's and the
    /// kubelet's x509 authenticator read it: the subject's CN, which must not be empty, is the
    /// user; its O values, then `system:authenticated`, the groups.
    pub fn from_certificate(der: &[u8]) -> Option<Self> {
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
pub struct Attributes {
    pub verb: &'static str,
    pub subresource: &'static str,
}

/// The kubelet's mapping (`pkg/kubelet/server/auth.go`, `GetRequestAttributes`): the HTTP
/// method gives the verb, the path the subresource: `/stats`, `/metrics` and `/logs` and
/// below are `stats`, `metrics` and `log`; everything else, `/containerLogs` included, is
/// `proxy`. `None` for a method with no API verb: the kubelet would ask with an empty verb,
/// which only a wildcard rule allows; such a request is refused without asking.
pub fn attributes(method: &Method, path: &str) -> Option<Attributes> {
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

/// `path` is `prefix` itself or below it (`/logs/x`, not `/logsx`); a trailing `/` on
/// `prefix` is ignored.
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The review asking whether `user` may do `attributes` on node `node`.
pub fn review(user: &User, attributes: Attributes, node: &str) -> SubjectAccessReview {
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
pub enum Decision {
    Allowed,
    /// With the authorizer's reason or evaluation error, when it gave one.
    Denied(String),
}

impl Decision {
    /// Only an explicit `allowed` allows; no opinion is a denial, as with a kubelet whose only
    /// authorizer is the webhook.
    pub fn of(status: &SubjectAccessReviewStatus) -> Self {
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
pub struct DecisionCache {
    entries: HashMap<Key, (Decision, Instant)>,
    capacity: usize,
}

impl DecisionCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity,
        }
    }

    /// The answer for `key` if it has not expired at `now`.
    pub fn get(&self, key: &Key, now: Instant) -> Option<Decision> {
        self.entries
            .get(key)
            .filter(|(_, expires)| now < *expires)
            .map(|(decision, _)| decision.clone())
    }

    /// Keeps `decision` for its TTL from `now`. When full, expired answers go first, then the
    /// one that would expire soonest.
    pub fn insert(&mut self, key: Key, decision: Decision, now: Instant) {
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

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Sends a SubjectAccessReview and returns the apiserver's verdict.
pub trait Reviewer: Send + Sync {
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
pub struct Authorizer<R> {
    reviewer: R,
    node: String,
    cache: Mutex<DecisionCache>,
}

impl<R: Reviewer> Authorizer<R> {
    pub fn new(reviewer: R, node: String) -> Self {
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
    pub async fn authorize(&self, user: &User, attributes: Attributes) -> anyhow::Result<Decision> {
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
pub struct Caller(pub Option<Arc<User>>);

/// The 401 answer: either way of authenticating is accepted.
pub const UNAUTHENTICATED: &str = "runpod-kubelet: authentication required: a client certificate \
    from the cluster CA naming a user (CN), or a bearer token the apiserver accepts\n";

/// The middleware in front of every path: 401 without a user, 405 for a method with no API
/// verb, 403 when the apiserver does not allow the request, 500 when it could not be asked;
/// else the request goes on.
pub async fn authorize<R: Reviewer + 'static>(
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
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn the_401_names_both_ways_in() {
        assert!(UNAUTHENTICATED.contains("client certificate"));
        assert!(UNAUTHENTICATED.contains("bearer token"));
    }

    fn attrs(verb: &'static str, subresource: &'static str) -> Option<Attributes> {
        Some(Attributes { verb, subresource })
    }

    #[test]
    fn requests_map_to_node_subresources_like_the_kubelet() {
        let cases: &[(Method, &str, Option<Attributes>)] = &[
            (
                Method::GET,
                "/containerLogs/ns/pod/main",
                attrs("get", "proxy"),
            ),
            (Method::GET, "/logs", attrs("get", "log")),
            (Method::GET, "/logs/", attrs("get", "log")),
            (Method::GET, "/logs/syslog", attrs("get", "log")),
            (Method::GET, "/logsx", attrs("get", "proxy")),
            (Method::GET, "/stats/summary", attrs("get", "stats")),
            (Method::GET, "/stats", attrs("get", "stats")),
            (Method::GET, "/metrics", attrs("get", "metrics")),
            (Method::GET, "/metrics/cadvisor", attrs("get", "metrics")),
            (Method::GET, "/metricsz", attrs("get", "proxy")),
            (Method::GET, "/pods", attrs("get", "proxy")),
            (Method::GET, "/", attrs("get", "proxy")),
            (Method::POST, "/exec/ns/pod/main", attrs("create", "proxy")),
            (Method::PUT, "/x", attrs("update", "proxy")),
            (Method::PATCH, "/x", attrs("patch", "proxy")),
            (Method::DELETE, "/x", attrs("delete", "proxy")),
            (Method::HEAD, "/containerLogs/ns/pod/main", None),
            (Method::OPTIONS, "/logs", None),
        ];
        for (method, path, expected) in cases {
            assert_eq!(attributes(method, path), *expected, "{method} {path}");
        }
    }

    fn alice() -> User {
        User {
            name: "alice".into(),
            groups: vec!["team-a".into(), "system:authenticated".into()],
        }
    }

    #[test]
    fn the_review_names_the_user_groups_and_node_subresource() {
        let sar = review(
            &alice(),
            Attributes {
                verb: "get",
                subresource: "proxy",
            },
            "vnode",
        );
        assert_eq!(
            serde_json::to_value(&sar).unwrap(),
            serde_json::json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "metadata": {},
                "spec": {
                    "user": "alice",
                    "groups": ["team-a", "system:authenticated"],
                    "resourceAttributes": {
                        "verb": "get", "version": "v1", "resource": "nodes",
                        "subresource": "proxy", "name": "vnode"
                    }
                }
            })
        );
    }

    fn status(
        allowed: bool,
        reason: Option<&str>,
        error: Option<&str>,
    ) -> SubjectAccessReviewStatus {
        SubjectAccessReviewStatus {
            allowed,
            reason: reason.map(str::to_owned),
            evaluation_error: error.map(str::to_owned),
            ..SubjectAccessReviewStatus::default()
        }
    }

    #[test]
    fn only_an_explicit_allow_allows() {
        let cases = [
            (status(true, Some("RBAC: allowed"), None), Decision::Allowed),
            (status(false, None, None), Decision::Denied(String::new())),
            (
                status(false, Some("no rule"), None),
                Decision::Denied("no rule".into()),
            ),
            (
                status(false, Some(""), Some("webhook down")),
                Decision::Denied("webhook down".into()),
            ),
            (
                SubjectAccessReviewStatus {
                    denied: Some(true),
                    ..status(false, Some("denied"), Some("x"))
                },
                Decision::Denied("denied; x".into()),
            ),
        ];
        for (status, expected) in cases {
            assert_eq!(Decision::of(&status), expected, "{status:?}");
        }
    }

    fn key(name: &str) -> Key {
        (
            User {
                name: name.into(),
                groups: vec![],
            },
            Attributes {
                verb: "get",
                subresource: "proxy",
            },
        )
    }

    #[test]
    fn answers_expire_after_their_ttl() {
        let mut cache = DecisionCache::new(8);
        let t0 = Instant::now();
        cache.insert(key("allowed"), Decision::Allowed, t0);
        cache.insert(key("denied"), Decision::Denied("no".into()), t0);
        let just_before = |ttl: Duration| t0 + ttl - Duration::from_millis(1);
        assert_eq!(
            cache.get(&key("denied"), just_before(DENIED_TTL)),
            Some(Decision::Denied("no".into()))
        );
        assert_eq!(cache.get(&key("denied"), t0 + DENIED_TTL), None);
        assert_eq!(
            cache.get(&key("allowed"), just_before(ALLOWED_TTL)),
            Some(Decision::Allowed)
        );
        assert_eq!(cache.get(&key("allowed"), t0 + ALLOWED_TTL), None);
        assert_eq!(cache.get(&key("never"), t0), None);
        // Another attribute set of the same user is another question.
        let (user, _) = key("allowed");
        let log = (
            user,
            Attributes {
                verb: "get",
                subresource: "log",
            },
        );
        assert_eq!(cache.get(&log, t0), None);
    }

    #[test]
    fn a_full_cache_drops_expired_answers_then_the_soonest_to_expire() {
        let mut cache = DecisionCache::new(2);
        let t0 = Instant::now();
        cache.insert(key("a"), Decision::Allowed, t0);
        cache.insert(key("b"), Decision::Denied(String::new()), t0);
        // Full: "b" (denied, 30 s) expires before "a" (allowed, 5 min) and goes.
        cache.insert(key("c"), Decision::Allowed, t0 + Duration::from_secs(1));
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&key("b"), t0).is_none());
        assert!(cache.get(&key("a"), t0).is_some());
        // Replacing a kept key evicts nothing.
        cache.insert(key("a"), Decision::Denied(String::new()), t0);
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&key("c"), t0).is_some());
        // Once both have expired, both make room at once.
        let later = t0 + ALLOWED_TTL + Duration::from_secs(2);
        cache.insert(key("d"), Decision::Allowed, later);
        assert_eq!(cache.len(), 1);
        let mut none = DecisionCache::new(0);
        none.insert(key("a"), Decision::Allowed, t0);
        assert!(none.is_empty());
    }

    /// Answers from a script, counting the reviews it was sent.
    struct Scripted {
        answers: Mutex<Vec<anyhow::Result<SubjectAccessReviewStatus>>>,
        sent: AtomicUsize,
    }

    impl Reviewer for Scripted {
        async fn review(
            &self,
            review: SubjectAccessReview,
        ) -> anyhow::Result<SubjectAccessReviewStatus> {
            assert_eq!(
                review
                    .spec
                    .resource_attributes
                    .and_then(|a| a.name)
                    .as_deref(),
                Some("vnode")
            );
            self.sent.fetch_add(1, Ordering::SeqCst);
            self.answers.lock().unwrap().remove(0)
        }
    }

    #[tokio::test]
    async fn answers_are_cached_and_failures_are_not() {
        let authorizer = Authorizer::new(
            Scripted {
                answers: Mutex::new(vec![
                    Err(anyhow::anyhow!("apiserver unreachable")),
                    Ok(status(false, Some("no rule"), None)),
                    Ok(status(true, None, None)),
                ]),
                sent: AtomicUsize::new(0),
            },
            "vnode".into(),
        );
        let proxy = Attributes {
            verb: "get",
            subresource: "proxy",
        };
        let log = Attributes {
            verb: "get",
            subresource: "log",
        };
        assert!(authorizer.authorize(&alice(), proxy).await.is_err());
        // The failure was not remembered: the next request asks again, and is denied.
        assert_eq!(
            authorizer.authorize(&alice(), proxy).await.unwrap(),
            Decision::Denied("no rule".into())
        );
        assert_eq!(
            authorizer.authorize(&alice(), proxy).await.unwrap(),
            Decision::Denied("no rule".into())
        );
        assert_eq!(authorizer.reviewer.sent.load(Ordering::SeqCst), 2);
        assert_eq!(
            authorizer.authorize(&alice(), log).await.unwrap(),
            Decision::Allowed
        );
        assert_eq!(
            authorizer.authorize(&alice(), log).await.unwrap(),
            Decision::Allowed
        );
        assert_eq!(authorizer.reviewer.sent.load(Ordering::SeqCst), 3);
    }

    fn certificate(name: rcgen::DistinguishedName) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = name;
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_user_is_the_cn_and_the_groups_the_o_values_and_authenticated() {
        use rcgen::{DistinguishedName, DnType};
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, "team-a");
        name.push(DnType::CommonName, "alice");
        assert_eq!(User::from_certificate(&certificate(name)), Some(alice()));
        let mut already = DistinguishedName::new();
        already.push(DnType::OrganizationName, AUTHENTICATED);
        already.push(DnType::CommonName, "bob");
        assert_eq!(
            User::from_certificate(&certificate(already))
                .unwrap()
                .groups,
            [AUTHENTICATED]
        );
        // No CN, an empty CN, or no certificate at all: nobody.
        let mut no_cn = DistinguishedName::new();
        no_cn.push(DnType::OrganizationName, "system:masters");
        assert_eq!(User::from_certificate(&certificate(no_cn)), None);
        let mut empty_cn = DistinguishedName::new();
        empty_cn.push(DnType::CommonName, "");
        assert_eq!(User::from_certificate(&certificate(empty_cn)), None);
        assert_eq!(User::from_certificate(b"junk"), None);
    }

    /// A router answering 200 on every path behind the middleware, for `caller`.
    fn behind_authorization(
        answers: Vec<anyhow::Result<SubjectAccessReviewStatus>>,
        caller: Option<User>,
    ) -> axum::Router {
        let authorizer = Arc::new(Authorizer::new(
            Scripted {
                answers: Mutex::new(answers),
                sent: AtomicUsize::new(0),
            },
            "vnode".into(),
        ));
        axum::Router::new()
            .fallback(|| async { "the log\n" })
            .layer(axum::middleware::from_fn_with_state(
                authorizer,
                authorize::<Scripted>,
            ))
            .layer(axum::Extension(Caller(caller.map(Arc::new))))
    }

    async fn call(router: axum::Router, method: Method) -> (StatusCode, String) {
        use http_body_util::BodyExt as _;
        use tower::ServiceExt as _;
        let request = axum::http::Request::builder()
            .method(method)
            .uri("/containerLogs/ns/pod/main")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn requests_are_answered_by_the_review() {
        let allowed = behind_authorization(vec![Ok(status(true, None, None))], Some(alice()));
        assert_eq!(
            call(allowed, Method::GET).await,
            (StatusCode::OK, "the log\n".to_owned())
        );

        let denied = behind_authorization(
            vec![Ok(status(false, Some("no RBAC rule"), None))],
            Some(alice()),
        );
        let (code, body) = call(denied, Method::GET).await;
        assert_eq!(code, StatusCode::FORBIDDEN);
        assert_eq!(
            body,
            "runpod-kubelet: Forbidden (user=alice, verb=get, resource=nodes, subresource=proxy): no RBAC rule\n"
        );

        let failing = behind_authorization(
            vec![Err(anyhow::anyhow!("connection refused"))],
            Some(alice()),
        );
        let (code, body) = call(failing, Method::GET).await;
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            body.contains("Authorization error") && body.contains("connection refused"),
            "{body}"
        );

        // No review is asked for these: the script is empty and would panic.
        let (code, body) = call(behind_authorization(vec![], None), Method::GET).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "{body}");
        let (code, _) = call(behind_authorization(vec![], Some(alice())), Method::HEAD).await;
        assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test(start_paused = true)]
    async fn a_review_without_an_answer_fails() {
        struct Silent;
        impl Reviewer for Silent {
            async fn review(
                &self,
                _: SubjectAccessReview,
            ) -> anyhow::Result<SubjectAccessReviewStatus> {
                std::future::pending().await
            }
        }
        let authorizer = Authorizer::new(Silent, "vnode".into());
        let error = authorizer
            .authorize(
                &alice(),
                Attributes {
                    verb: "get",
                    subresource: "proxy",
                },
            )
            .await
            .unwrap_err();
        assert!(error.to_string().contains("no answer"), "{error}");
    }
}
