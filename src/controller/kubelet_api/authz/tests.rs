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
        // A shell or a socket is `create` whatever the method.
        (Method::GET, "/exec/ns/pod/main", attrs("create", "proxy")),
        (Method::GET, "/portForward/ns/pod", attrs("create", "proxy")),
        (Method::PUT, "/attach/ns/pod/main", attrs("create", "proxy")),
        (Method::HEAD, "/run/ns/pod/main", attrs("create", "proxy")),
        (Method::GET, "/execx", attrs("get", "proxy")),
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

fn status(allowed: bool, reason: Option<&str>, error: Option<&str>) -> SubjectAccessReviewStatus {
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

/// Allows exactly `get` on `nodes/proxy`, as many monitoring agents hold.
struct GetProxyOnly;

impl Reviewer for GetProxyOnly {
    async fn review(
        &self,
        review: SubjectAccessReview,
    ) -> anyhow::Result<SubjectAccessReviewStatus> {
        let attributes = review.spec.resource_attributes.unwrap_or_default();
        let allowed = attributes.verb.as_deref() == Some("get")
            && attributes.subresource.as_deref() == Some("proxy");
        Ok(status(
            allowed,
            (!allowed).then_some("only get nodes/proxy"),
            None,
        ))
    }
}

#[tokio::test]
async fn get_on_nodes_proxy_opens_no_shell_and_no_socket() {
    use tower::ServiceExt as _;
    let router = axum::Router::new()
        .fallback(|| async { "upgraded\n" })
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(Authorizer::new(GetProxyOnly, "vnode".into())),
            authorize::<GetProxyOnly>,
        ))
        .layer(axum::Extension(Caller(Some(Arc::new(alice())))));
    for path in [
        "/exec/ns/pod/main?command=sh&stdin=1&tty=1",
        "/portForward/ns/pod",
        "/attach/ns/pod/main",
    ] {
        for method in [Method::GET, Method::POST] {
            let request = axum::http::Request::builder()
                .method(method.clone())
                .uri(path)
                .header("Upgrade", "SPDY/3.1")
                .header("Connection", "Upgrade")
                .body(axum::body::Body::empty())
                .unwrap();
            let status = router.clone().oneshot(request).await.unwrap().status();
            assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}");
        }
    }
    // A caller who may create gets a shell by POST only.
    let allowed = behind_authorization(
        vec![Ok(status(true, None, None)), Ok(status(true, None, None))],
        Some(alice()),
    );
    for (method, expected) in [
        (Method::GET, StatusCode::METHOD_NOT_ALLOWED),
        (Method::POST, StatusCode::OK),
    ] {
        let request = axum::http::Request::builder()
            .method(method.clone())
            .uri("/exec/ns/pod/main?command=sh")
            .body(axum::body::Body::empty())
            .unwrap();
        let status = allowed.clone().oneshot(request).await.unwrap().status();
        assert_eq!(status, expected, "{method}");
    }
    // The same get-only caller still reads logs.
    let request = axum::http::Request::builder()
        .uri("/containerLogs/ns/pod/main")
        .body(axum::body::Body::empty())
        .unwrap();
    assert_eq!(
        router.oneshot(request).await.unwrap().status(),
        StatusCode::OK
    );
}
