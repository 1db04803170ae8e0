//! Bearer tokens on the kubelet API, checked as a kubelet with webhook authentication checks
//! them: a TokenReview asks the apiserver whose token it is. metrics-server calls kubelets with
//! its ServiceAccount token, not a client certificate, so without this `kubectl top` would get
//! 401. A verified client certificate wins over a token; a token the apiserver does not vouch
//! for gets 401. Answers that name a user are cached for 2 minutes (the kubelet's
//! `authentication.webhook.cacheTTL`), refusals for 15 seconds (so forged tokens cannot make
//! the controller flood the apiserver); failures are not. The cache is keyed by the token's
//! SHA-256, never the token itself, and holds at most [`CACHE_CAPACITY`] entries.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::Api;
use kube::api::PostParams;

use crate::controller::kubelet_api::authz::{Caller, User};

/// How long a token that named a user is trusted without asking again.
pub(crate) const AUTHENTICATED_TTL: Duration = Duration::from_secs(2 * 60);
/// How long a token the apiserver refused is refused without asking again.
pub(crate) const REFUSED_TTL: Duration = Duration::from_secs(15);
/// Tokens remembered at most; a full cache drops its expired entries, else is emptied (the
/// next requests ask again).
pub(crate) const CACHE_CAPACITY: usize = 1024;
/// A review the apiserver has not answered by then fails the request.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The token of an `Authorization: Bearer ...` header, if there is one.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The user a TokenReview's answer names; `None` unless authenticated with a user name.
pub(crate) fn user_of(status: &TokenReviewStatus) -> Option<User> {
    if status.authenticated != Some(true) {
        return None;
    }
    let info = status.user.as_ref()?;
    let name = info.username.clone().filter(|n| !n.is_empty())?;
    Some(User {
        name,
        groups: info.groups.clone().unwrap_or_default(),
    })
}

/// Sends a TokenReview and returns the apiserver's answer.
pub(crate) trait TokenReviewer: Send + Sync {
    fn review_token(
        &self,
        token: String,
    ) -> impl Future<Output = anyhow::Result<TokenReviewStatus>> + Send;
}

impl TokenReviewer for kube::Client {
    async fn review_token(&self, token: String) -> anyhow::Result<TokenReviewStatus> {
        let api: Api<TokenReview> = Api::all(self.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token,
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let answered = api.create(&PostParams::default(), &review).await?;
        answered
            .status
            .ok_or_else(|| anyhow::anyhow!("the TokenReview came back without a status"))
    }
}

/// A token's cache key: its SHA-256, so no token is kept in memory longer than a request.
pub(crate) fn token_key(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// A cached answer: the user (`None`: refused) and until when it holds.
type Cache = HashMap<[u8; 32], (Option<User>, Instant)>;

/// Turns bearer tokens into users.
pub(crate) struct Authenticator<R> {
    reviewer: R,
    cache: Mutex<Cache>,
}

impl<R: TokenReviewer> Authenticator<R> {
    pub(crate) fn new(reviewer: R) -> Self {
        Self {
            reviewer,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        match self.cache.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The user `token` belongs to, `None` when the apiserver does not vouch for it.
    pub(crate) async fn authenticate(&self, token: &str) -> anyhow::Result<Option<User>> {
        let now = Instant::now();
        let key = token_key(token);
        if let Some((user, expires)) = self.cache().get(&key)
            && now < *expires
        {
            return Ok(user.clone());
        }
        let status =
            tokio::time::timeout(REVIEW_TIMEOUT, self.reviewer.review_token(token.to_owned()))
                .await
                .map_err(|_| anyhow::anyhow!("no answer within {REVIEW_TIMEOUT:?}"))??;
        let user = user_of(&status);
        let ttl = if user.is_some() {
            AUTHENTICATED_TTL
        } else {
            REFUSED_TTL
        };
        let mut cache = self.cache();
        if cache.len() >= CACHE_CAPACITY {
            cache.retain(|_, (_, expires)| now < *expires);
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
        }
        cache.insert(key, (user.clone(), now + ttl));
        Ok(user)
    }
}

/// The middleware before authorization: a request without a verified client certificate but
/// with a bearer token gets the token's user, or 401 (500 when the apiserver could not be
/// asked). Requests with neither go on as anonymous (and are refused by authorization).
pub(crate) async fn authenticate<R: TokenReviewer + 'static>(
    State(authenticator): State<Arc<Authenticator<R>>>,
    axum::Extension(Caller(caller)): axum::Extension<Caller>,
    mut request: Request,
    next: Next,
) -> Response {
    if caller.is_some() {
        return next.run(request).await;
    }
    let Some(token) = bearer(request.headers()).map(str::to_owned) else {
        return next.run(request).await;
    };
    match authenticator.authenticate(&token).await {
        Ok(Some(user)) => {
            request
                .extensions_mut()
                .insert(Caller(Some(Arc::new(user))));
            next.run(request).await
        }
        Ok(None) => (
            StatusCode::UNAUTHORIZED,
            "runpod-kubelet: the bearer token was not accepted by the apiserver\n",
        )
            .into_response(),
        Err(error) => {
            tracing::warn!(%error, "kubelet API token review failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("runpod-kubelet: Authentication error: {error}\n"),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::http::HeaderValue;
    use k8s_openapi::api::authentication::v1::UserInfo;

    use super::*;

    #[test]
    fn only_a_bearer_header_carries_a_token() {
        let headers = |value: &str| {
            let mut map = HeaderMap::new();
            map.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            map
        };
        assert_eq!(bearer(&headers("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&headers("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(&headers("Basic abc")), None);
        assert_eq!(bearer(&headers("Bearer ")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    fn answer(authenticated: bool, name: Option<&str>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            user: Some(UserInfo {
                username: name.map(str::to_owned),
                groups: Some(vec!["system:serviceaccounts".into()]),
                ..UserInfo::default()
            }),
            ..TokenReviewStatus::default()
        }
    }

    #[test]
    fn only_an_authenticated_answer_with_a_name_is_a_user() {
        let user = user_of(&answer(
            true,
            Some("system:serviceaccount:kube-system:metrics-server"),
        ))
        .unwrap();
        assert_eq!(
            user.name,
            "system:serviceaccount:kube-system:metrics-server"
        );
        assert_eq!(user.groups, ["system:serviceaccounts"]);
        assert_eq!(user_of(&answer(false, Some("x"))), None);
        assert_eq!(user_of(&answer(true, Some(""))), None);
        assert_eq!(user_of(&TokenReviewStatus::default()), None);
    }

    struct Counting {
        answer: TokenReviewStatus,
        sent: AtomicUsize,
    }

    impl TokenReviewer for Counting {
        async fn review_token(&self, _: String) -> anyhow::Result<TokenReviewStatus> {
            self.sent.fetch_add(1, Ordering::SeqCst);
            Ok(self.answer.clone())
        }
    }

    #[tokio::test]
    async fn users_and_refusals_are_cached_by_the_tokens_hash() {
        let known = Authenticator::new(Counting {
            answer: answer(true, Some("sa")),
            sent: AtomicUsize::new(0),
        });
        for _ in 0..3 {
            assert_eq!(known.authenticate("t").await.unwrap().unwrap().name, "sa");
        }
        assert_eq!(known.reviewer.sent.load(Ordering::SeqCst), 1);

        let refused = Authenticator::new(Counting {
            answer: answer(false, None),
            sent: AtomicUsize::new(0),
        });
        for _ in 0..5 {
            assert_eq!(refused.authenticate("forged").await.unwrap(), None);
        }
        assert_eq!(
            refused.reviewer.sent.load(Ordering::SeqCst),
            1,
            "a refusal is cached"
        );
        // Keyed by the SHA-256, never the raw token.
        let cache = refused.cache();
        assert_eq!(cache.len(), 1);
        assert!(cache.contains_key(&token_key("forged")));
        assert_eq!(
            token_key("abc")[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "SHA-256 of \"abc\""
        );
    }

    #[tokio::test]
    async fn the_cache_stays_bounded() {
        let refused = Authenticator::new(Counting {
            answer: answer(false, None),
            sent: AtomicUsize::new(0),
        });
        for i in 0..CACHE_CAPACITY + 10 {
            refused.authenticate(&format!("forged-{i}")).await.unwrap();
        }
        assert!(refused.cache().len() <= CACHE_CAPACITY);
    }
}
