//! Who sent a report: the pod a projected service-account token is bound to, as a
//! `TokenReview` for the operator's audience says.
//!
//! [`KubeTokenReviewer`] asks the API server and caches what it accepted under the token's
//! SHA-256 (never the token itself) for at most [`DEFAULT_CACHE_TTL`], so ranks that report
//! every few seconds cost one review per token lifetime slice, not one per report. What it
//! rejected is remembered the same way, briefly ([`DEFAULT_REJECTED_TTL`], at most
//! [`DEFAULT_REJECTED_CAPACITY`] tokens): a forged token sent again and again costs one review
//! per slice, and a token the API server refused only for a moment (a pod it does not know
//! yet) is reviewed again soon. A review that could not be made (the API server unreachable)
//! is never remembered. The server's concurrency cap bounds how many reviews run at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};

/// The `extra` key a bound token's review names its pod under.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// The `extra` key a bound token's review names its pod's uid under.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// How a service account's username starts: `system:serviceaccount:<namespace>:<name>`.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// How long an accepted token is trusted without another review. The pod check that follows
/// every report still sees a deleted pod at once; this bounds only how long a revoked or
/// expired token of a pod that still exists keeps working.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(5 * 60);
/// How many accepted tokens are remembered; the oldest go first.
pub const DEFAULT_CACHE_CAPACITY: usize = 10_000;
/// How long a rejected token is answered 401 without another review: short, because a
/// rejection can be a moment's (the API server may not know a pod created a second ago).
pub const DEFAULT_REJECTED_TTL: Duration = Duration::from_secs(10);
/// How many rejected tokens are remembered; the oldest go first. Each entry is a hash and a
/// short reason: a few hundred KiB at most.
pub const DEFAULT_REJECTED_CAPACITY: usize = 4_096;
/// The longest rejection reason remembered, bytes (the API server's message is echoed).
const MAX_REASON_BYTES: usize = 256;

/// The pod a token is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The service account's (and so the pod's) namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// The pod's uid.
    pub pod_uid: String,
}

/// Why a token was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The token is invalid, expired, for another audience, or not a pod's: answered 401.
    #[error("{0}")]
    Unauthenticated(String),
    /// The review itself failed (the API server is unreachable, or refused the review):
    /// answered 503, the trainer retries with its next report.
    #[error("token review failed: {0}")]
    Unavailable(String),
}

/// Reviews a bearer token.
pub trait TokenReviewer: Send + Sync + 'static {
    /// The pod `token` is bound to.
    fn review(&self, token: String) -> BoxFuture<'static, Result<Identity, AuthError>>;

    /// What is already known of `token` without asking anyone (a cached review), if anything:
    /// the server answers it without taking one of its review permits.
    fn known(&self, _token: &str) -> Option<Result<Identity, AuthError>> {
        None
    }

    /// Refuses, before any review, what cannot be a token this reviewer would accept: the
    /// server asks it first, so garbage costs no `TokenReview` and no permit.
    fn precheck(&self, _token: &str) -> Result<(), AuthError> {
        Ok(())
    }
}

/// Why `token` cannot be a projected service-account token for `audience`, read from its
/// shape alone (nothing is verified here: the `TokenReview` that follows does that): a JWT of
/// three base64url parts whose header names a signing algorithm and whose claims list
/// `audience` in `aud` and carry an expiry. A token that passes may still be forged; one that
/// fails is refused without asking the API server, so a flood of garbage or of tokens meant
/// for someone else costs the flooder, not the API server.
pub fn precheck(token: &str, audience: &str) -> Result<(), String> {
    use base64::Engine as _;
    let parts: Vec<&str> = token.split('.').collect();
    let [header, claims, signature] = parts.as_slice() else {
        return Err(format!(
            "not a JWT: {} dot-separated parts, not 3",
            parts.len()
        ));
    };
    if signature.is_empty() {
        return Err("not a JWT: no signature".to_owned());
    }
    let decode = |what: &str, part: &str| -> Result<serde_json::Value, String> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|e| format!("not a JWT: its {what} is not base64url: {e}"))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("not a JWT: its {what} is not JSON: {e}"))
    };
    let header = decode("header", header)?;
    match header.get("alg").and_then(|a| a.as_str()) {
        Some(alg) if !alg.is_empty() && !alg.eq_ignore_ascii_case("none") => {}
        _ => return Err("the token is not signed (no alg, or alg none)".to_owned()),
    }
    let claims = decode("claims", claims)?;
    let listed = match claims.get("aud") {
        Some(serde_json::Value::String(aud)) => aud == audience,
        Some(serde_json::Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    };
    if !listed {
        return Err(format!("the token is not for the audience {audience}"));
    }
    if !claims.get("exp").is_some_and(serde_json::Value::is_number) {
        return Err("the token has no expiry: not a projected service-account token".to_owned());
    }
    Ok(())
}

/// What a `TokenReview` answer must show of the audience it was asked about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AudienceCheck {
    /// The answer lists the audience. An answer that lists none says the token is valid for
    /// the API server's own audience, not that it is for the operator's: refused.
    #[default]
    Listed,
    /// The API server's token authenticator does not report audiences, so an answer that
    /// lists none is taken as checked (`--progress-audience-unaware-reviewer`). An answer
    /// that lists others is still refused.
    UnawareReviewer,
}

/// The identity a `TokenReview` status proves for `audience`.
///
/// Accepts only an authenticated service-account token whose review lists `audience` (or,
/// with [`AudienceCheck::UnawareReviewer`], lists no audience at all) and the pod it is bound
/// to, by name and uid.
pub fn identity_from_status(
    status: &TokenReviewStatus,
    audience: &str,
    check: AudienceCheck,
) -> Result<Identity, AuthError> {
    let reject = |why: &str| Err(AuthError::Unauthenticated(why.to_owned()));
    if status.authenticated != Some(true) {
        return match status.error.as_deref() {
            Some(error) if !error.is_empty() => reject(&format!("invalid token: {error}")),
            _ => reject("invalid token"),
        };
    }
    let listed = status.audiences.as_deref().unwrap_or_default();
    if listed.is_empty() && check == AudienceCheck::Listed {
        return reject(&format!(
            "the token review lists no audience, so it does not show the token is for {audience}"
        ));
    }
    if !listed.is_empty() && !listed.iter().any(|a| a == audience) {
        return reject(&format!("the token is not for the audience {audience}"));
    }
    let Some(user) = &status.user else {
        return reject("the token review names no user");
    };
    let namespace = user
        .username
        .as_deref()
        .and_then(|u| u.strip_prefix(SERVICE_ACCOUNT_PREFIX))
        .and_then(|rest| rest.split_once(':'))
        .filter(|(ns, sa)| !ns.is_empty() && !sa.is_empty())
        .map(|(ns, _)| ns);
    let Some(namespace) = namespace else {
        return reject("the token is not a service account's");
    };
    let extra = |key: &str| -> Option<&str> {
        match user.extra.as_ref()?.get(key)?.as_slice() {
            [value] if !value.is_empty() => Some(value.as_str()),
            _ => None,
        }
    };
    let (Some(pod_name), Some(pod_uid)) = (extra(EXTRA_POD_NAME), extra(EXTRA_POD_UID)) else {
        return reject("the token is not bound to a pod");
    };
    Ok(Identity {
        namespace: namespace.to_owned(),
        pod_name: pod_name.to_owned(),
        pod_uid: pod_uid.to_owned(),
    })
}

/// A token's cache key: its SHA-256.
type TokenKey = [u8; 32];

fn token_key(token: &str) -> TokenKey {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// Reviewed tokens by their hash, oldest first, for a fixed time and up to a fixed count: what
/// a review answered (an identity, or why the token was rejected).
#[derive(Debug)]
pub(crate) struct TokenCache<V> {
    capacity: usize,
    ttl: Duration,
    entries: HashMap<TokenKey, (V, Instant)>,
    /// Insertion order, for expiry and eviction; an element whose time differs from its entry's
    /// is stale and skipped.
    order: VecDeque<(TokenKey, Instant)>,
}

impl<V: Clone> TokenCache<V> {
    pub(crate) fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity,
            ttl,
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub(crate) fn get(&self, key: &TokenKey, now: Instant) -> Option<V> {
        let (value, at) = self.entries.get(key)?;
        (now.saturating_duration_since(*at) < self.ttl).then(|| value.clone())
    }

    pub(crate) fn insert(&mut self, key: TokenKey, value: V, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        while let Some(&(_, at)) = self.order.front()
            && now.saturating_duration_since(at) >= self.ttl
        {
            self.pop_oldest();
        }
        // A token inserted again leaves its older element in `order` stale: drop the stale ones
        // once they could make up half of it.
        self.entries.remove(&key);
        if self.order.len() >= 2 * self.capacity {
            let entries = &self.entries;
            self.order
                .retain(|(k, at)| entries.get(k).is_some_and(|(_, t)| t == at));
        }
        while self.entries.len() >= self.capacity {
            self.pop_oldest();
        }
        self.entries.insert(key, (value, now));
        self.order.push_back((key, now));
    }

    fn pop_oldest(&mut self) {
        if let Some((key, at)) = self.order.pop_front()
            && self.entries.get(&key).is_some_and(|(_, t)| *t == at)
        {
            self.entries.remove(&key);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// What the reviewer remembers: accepted tokens for long, rejected ones briefly.
#[derive(Debug)]
struct Reviewed {
    accepted: TokenCache<Identity>,
    rejected: TokenCache<Arc<str>>,
}

impl Reviewed {
    fn get(&self, key: &TokenKey, now: Instant) -> Option<Result<Identity, AuthError>> {
        if let Some(identity) = self.accepted.get(key, now) {
            return Some(Ok(identity));
        }
        let why = self.rejected.get(key, now)?;
        Some(Err(AuthError::Unauthenticated(why.to_string())))
    }

    /// Remembers an answer of the API server; a review that could not be made is not one.
    fn remember(&mut self, key: TokenKey, answer: &Result<Identity, AuthError>, now: Instant) {
        match answer {
            Ok(identity) => self.accepted.insert(key, identity.clone(), now),
            Err(AuthError::Unauthenticated(why)) => {
                self.rejected.insert(key, Arc::from(truncated(why)), now);
            }
            Err(AuthError::Unavailable(_)) => {}
        }
    }
}

/// `why`, cut to at most [`MAX_REASON_BYTES`] on a character boundary.
fn truncated(why: &str) -> &str {
    let mut end = why.len().min(MAX_REASON_BYTES);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    &why[..end]
}

/// Reviews tokens with the API server (`TokenReview`, create; the operator's ClusterRole needs
/// it) for one audience, and caches what it answered.
#[derive(Clone)]
pub struct KubeTokenReviewer {
    client: kube::Client,
    audience: Arc<str>,
    check: AudienceCheck,
    cache: Arc<Mutex<Reviewed>>,
}

impl KubeTokenReviewer {
    /// A reviewer for `audience` with the default caches, that requires answers to list it.
    pub fn new(client: kube::Client, audience: impl Into<String>) -> Self {
        Self::with_cache(client, audience, DEFAULT_CACHE_CAPACITY, DEFAULT_CACHE_TTL)
    }

    /// A reviewer that remembers up to `capacity` accepted tokens for `ttl` each (and rejected
    /// ones as [`DEFAULT_REJECTED_CAPACITY`] and [`DEFAULT_REJECTED_TTL`] say).
    pub fn with_cache(
        client: kube::Client,
        audience: impl Into<String>,
        capacity: usize,
        ttl: Duration,
    ) -> Self {
        Self {
            client,
            audience: Arc::from(audience.into()),
            check: AudienceCheck::default(),
            cache: Arc::new(Mutex::new(Reviewed {
                accepted: TokenCache::new(capacity, ttl),
                rejected: TokenCache::new(DEFAULT_REJECTED_CAPACITY, DEFAULT_REJECTED_TTL),
            })),
        }
    }

    /// The same reviewer, checking answers' audiences as `check` says.
    pub fn checking_audiences(mut self, check: AudienceCheck) -> Self {
        self.check = check;
        self
    }

    /// How many accepted tokens are cached.
    #[cfg(test)]
    pub fn cached(&self) -> usize {
        lock(&self.cache).accepted.len()
    }

    /// How many rejected tokens are cached.
    #[cfg(test)]
    pub fn cached_rejections(&self) -> usize {
        lock(&self.cache).rejected.len()
    }
}

fn lock(cache: &Mutex<Reviewed>) -> MutexGuard<'_, Reviewed> {
    // Every update leaves the caches whole; a panic elsewhere cannot tear them.
    cache.lock().unwrap_or_else(|e| e.into_inner())
}

impl TokenReviewer for KubeTokenReviewer {
    fn review(&self, token: String) -> BoxFuture<'static, Result<Identity, AuthError>> {
        let key = token_key(&token);
        if let Some(known) = lock(&self.cache).get(&key, Instant::now()) {
            return futures::future::ready(known).boxed();
        }
        let api = Api::<TokenReview>::all(self.client.clone());
        let (audience, check, cache) = (self.audience.clone(), self.check, self.cache.clone());
        async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token),
                    audiences: Some(vec![audience.to_string()]),
                },
                ..TokenReview::default()
            };
            let reviewed = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| AuthError::Unavailable(e.to_string()))?;
            let answer =
                identity_from_status(&reviewed.status.unwrap_or_default(), &audience, check);
            lock(&cache).remember(key, &answer, Instant::now());
            answer
        }
        .boxed()
    }

    fn known(&self, token: &str) -> Option<Result<Identity, AuthError>> {
        lock(&self.cache).get(&token_key(token), Instant::now())
    }

    fn precheck(&self, token: &str) -> Result<(), AuthError> {
        precheck(token, &self.audience).map_err(AuthError::Unauthenticated)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::authentication::v1::UserInfo;
    use serde_json::{Value, json};

    use super::*;

    const AUDIENCE: &str = "trainyard-progress";

    fn bound_status() -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(vec![AUDIENCE.to_owned()]),
            user: Some(UserInfo {
                username: Some("system:serviceaccount:ml:trainer".to_owned()),
                extra: Some(BTreeMap::from([
                    (EXTRA_POD_NAME.to_owned(), vec!["train-worker-0".to_owned()]),
                    (EXTRA_POD_UID.to_owned(), vec!["uid-0".to_owned()]),
                ])),
                ..UserInfo::default()
            }),
            error: None,
        }
    }

    fn unauthenticated(status: &TokenReviewStatus) -> bool {
        matches!(
            identity_from_status(status, AUDIENCE, AudienceCheck::Listed),
            Err(AuthError::Unauthenticated(_))
        )
    }

    fn pod_0() -> Identity {
        Identity {
            namespace: "ml".to_owned(),
            pod_name: "train-worker-0".to_owned(),
            pod_uid: "uid-0".to_owned(),
        }
    }

    #[test]
    fn a_bound_service_account_token_for_the_audience_names_its_pod() {
        for check in [AudienceCheck::Listed, AudienceCheck::UnawareReviewer] {
            assert_eq!(
                identity_from_status(&bound_status(), AUDIENCE, check),
                Ok(pod_0())
            );
        }
    }

    #[test]
    fn an_answer_without_audiences_is_refused_unless_the_reviewer_is_audience_unaware() {
        for audiences in [None, Some(vec![])] {
            let mut status = bound_status();
            status.audiences = audiences.clone();
            assert_eq!(
                identity_from_status(&status, AUDIENCE, AudienceCheck::Listed),
                Err(AuthError::Unauthenticated(format!(
                    "the token review lists no audience, so it does not show the token is for {AUDIENCE}"
                ))),
                "{audiences:?}: valid for the API server, not shown to be for the operator"
            );
            assert_eq!(
                identity_from_status(&status, AUDIENCE, AudienceCheck::UnawareReviewer),
                Ok(pod_0()),
                "{audiences:?}"
            );
        }
        let mut other = bound_status();
        other.audiences = Some(vec!["https://kubernetes.default.svc".to_owned()]);
        assert!(matches!(
            identity_from_status(&other, AUDIENCE, AudienceCheck::UnawareReviewer),
            Err(AuthError::Unauthenticated(_))
        ));
    }

    #[test]
    fn an_unauthenticated_token_is_refused() {
        let mut status = bound_status();
        status.authenticated = Some(false);
        status.error = Some("token is expired".to_owned());
        assert_eq!(
            identity_from_status(&status, AUDIENCE, AudienceCheck::Listed),
            Err(AuthError::Unauthenticated(
                "invalid token: token is expired".to_owned()
            ))
        );
        status.authenticated = None;
        assert!(unauthenticated(&status));
    }

    #[test]
    fn a_token_for_another_audience_is_refused() {
        let mut status = bound_status();
        status.audiences = Some(vec!["https://kubernetes.default.svc".to_owned()]);
        assert!(unauthenticated(&status));
    }

    #[test]
    fn a_token_not_bound_to_a_pod_is_refused() {
        for key in [EXTRA_POD_NAME, EXTRA_POD_UID] {
            let mut status = bound_status();
            let user = status.user.as_mut().expect("user");
            user.extra.as_mut().expect("extra").remove(key);
            assert_eq!(
                identity_from_status(&status, AUDIENCE, AudienceCheck::Listed),
                Err(AuthError::Unauthenticated(
                    "the token is not bound to a pod".to_owned()
                )),
                "without {key}"
            );
        }
        let mut two_pods = bound_status();
        two_pods.user.as_mut().expect("user").extra = Some(BTreeMap::from([
            (
                EXTRA_POD_NAME.to_owned(),
                vec!["a".to_owned(), "b".to_owned()],
            ),
            (EXTRA_POD_UID.to_owned(), vec!["uid-0".to_owned()]),
        ]));
        assert!(unauthenticated(&two_pods));
    }

    #[test]
    fn a_token_of_a_user_or_node_is_refused() {
        for username in ["alice", "system:node:n-1", "system:serviceaccount:ml", ""] {
            let mut status = bound_status();
            status.user.as_mut().expect("user").username = Some(username.to_owned());
            assert!(unauthenticated(&status), "{username}");
        }
    }

    fn identity(n: usize) -> Identity {
        Identity {
            namespace: "ml".to_owned(),
            pod_name: format!("p-{n}"),
            pod_uid: format!("u-{n}"),
        }
    }

    #[test]
    fn the_token_cache_expires_entries_and_evicts_the_oldest_beyond_its_capacity() {
        let start = Instant::now();
        let ttl = Duration::from_secs(300);
        let mut cache = TokenCache::new(3, ttl);
        for n in 0..5 {
            cache.insert(
                token_key(&format!("t{n}")),
                identity(n),
                start + Duration::from_secs(n as u64),
            );
            assert!(cache.len() <= 3);
        }
        let now = start + Duration::from_secs(10);
        assert_eq!(cache.get(&token_key("t0"), now), None, "evicted");
        assert_eq!(cache.get(&token_key("t4"), now), Some(identity(4)));
        assert_eq!(
            cache.get(&token_key("t2"), start + Duration::from_secs(2) + ttl),
            None,
            "expired"
        );
        // Re-inserting keeps one entry per token.
        for _ in 0..10 {
            cache.insert(token_key("t4"), identity(4), now);
        }
        assert_eq!(cache.len(), 3);
        assert!(cache.order.len() <= 6);
        // Expired entries go before live ones are evicted.
        let late = start + ttl + Duration::from_secs(3);
        cache.insert(token_key("t9"), identity(9), late);
        assert_eq!(cache.get(&token_key("t4"), late), Some(identity(4)));
        assert_eq!(cache.get(&token_key("t9"), late), Some(identity(9)));
        assert!(cache.entries.keys().all(|k| *k != token_key("t3")));
    }

    /// A JWT-shaped token for [`AUDIENCE`] (it passes [`precheck`]) that [`reviewing_client`]
    /// answers as `marker` (carried as its signature).
    pub(crate) fn jwt(marker: &str) -> String {
        jwt_with(
            &json!({"alg": "RS256", "kid": "k"}),
            &json!({"aud": [AUDIENCE], "exp": 4_102_444_800_u64, "sub": "system:serviceaccount:ml:trainer"}),
            marker,
        )
    }

    fn jwt_with(header: &Value, claims: &Value, marker: &str) -> String {
        use base64::Engine as _;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        format!(
            "{}.{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes()),
            b64(marker.as_bytes())
        )
    }

    /// The marker a [`jwt`] carries, or the token itself when it is not one.
    fn marker_of(token: &str) -> String {
        use base64::Engine as _;
        let parts: Vec<&str> = token.split('.').collect();
        let [_, _, signature] = parts.as_slice() else {
            return token.to_owned();
        };
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(signature)
            .ok()
            .and_then(|m| String::from_utf8(m).ok())
            .unwrap_or_else(|| token.to_owned())
    }

    /// Garbage, unsigned tokens and tokens for another audience fail the shape check; a
    /// projected token for the audience passes it (the review still decides).
    #[test]
    fn only_a_signed_jwt_for_the_audience_with_an_expiry_passes_the_precheck() {
        assert_eq!(precheck(&jwt("good:ml:p"), AUDIENCE), Ok(()));
        let one_audience = json!({"aud": AUDIENCE, "exp": 1});
        let signed = json!({"alg": "RS256"});
        assert_eq!(
            precheck(&jwt_with(&signed, &one_audience, "x"), AUDIENCE),
            Ok(())
        );
        let refused = |token: &str, says: &str| {
            let why = precheck(token, AUDIENCE).expect_err(token);
            assert!(why.contains(says), "{token}: {why}");
        };
        refused("forged", "1 dot-separated parts");
        refused("a.b.c.d", "4 dot-separated parts");
        refused("a.b.", "no signature");
        refused("!!.b.c", "header is not base64url");
        refused(
            &jwt_with(&json!({"alg": "none"}), &one_audience, "x"),
            "not signed",
        );
        refused(&jwt_with(&json!({}), &one_audience, "x"), "not signed");
        let other = json!({"aud": ["https://kubernetes.default.svc"], "exp": 1});
        refused(
            &jwt_with(&signed, &other, "x"),
            "not for the audience trainyard-progress",
        );
        refused(
            &jwt_with(&signed, &json!({"exp": 1}), "x"),
            "not for the audience",
        );
        refused(
            &jwt_with(&signed, &json!({"aud": AUDIENCE}), "x"),
            "no expiry",
        );
        let not_json = {
            use base64::Engine as _;
            let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
            format!(
                "{}.{}.{}",
                b64("{\"alg\":\"RS256\"}"),
                b64("not json"),
                b64("x")
            )
        };
        refused(&not_json, "claims is not JSON");
    }

    /// A client whose TokenReviews are answered by token (or the marker of a [`jwt`]):
    /// `good:<ns>:<pod>` is a bound token of
    /// pod `<pod>` (uid `uid-<pod>`) in `<ns>`, `noaud:<ns>:<pod>` the same from a server that
    /// lists no audiences, anything else is refused. Counts the reviews and keeps the last
    /// request body.
    pub(crate) fn reviewing_client() -> (kube::Client, Arc<AtomicUsize>, Arc<Mutex<Value>>) {
        let count = Arc::new(AtomicUsize::new(0));
        let last = Arc::new(Mutex::new(Value::Null));
        let (counter, recorder) = (count.clone(), last.clone());
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (counter, recorder) = (counter.clone(), recorder.clone());
            async move {
                let (parts, body) = request.into_parts();
                assert_eq!(parts.method, http::Method::POST);
                assert_eq!(
                    parts.uri.path(),
                    "/apis/authentication.k8s.io/v1/tokenreviews"
                );
                let sent: Value =
                    serde_json::from_slice(&body.collect_bytes().await?).unwrap_or(Value::Null);
                counter.fetch_add(1, Ordering::SeqCst);
                let token = marker_of(sent["spec"]["token"].as_str().unwrap_or_default());
                let status = match token.split(':').collect::<Vec<_>>().as_slice() {
                    [kind @ ("good" | "noaud"), ns, pod] => json!({
                        "authenticated": true,
                        "audiences": if *kind == "good" { sent["spec"]["audiences"].clone() } else { Value::Null },
                        "user": {"username": format!("system:serviceaccount:{ns}:trainer"),
                                 "extra": {EXTRA_POD_NAME: [pod], EXTRA_POD_UID: [format!("uid-{pod}")]}},
                    }),
                    _ => json!({"authenticated": false, "error": "invalid bearer token"}),
                };
                *recorder.lock().expect("last") = sent.clone();
                let mut answer = sent;
                answer["status"] = status;
                let response = http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&answer).expect("json"),
                    ))
                    .expect("response");
                Ok::<_, kube::Error>(response)
            }
        });
        (kube::Client::new(service, "default"), count, last)
    }

    #[tokio::test]
    async fn a_review_names_the_audience_and_its_answer_is_cached() {
        let (client, reviews, last) = reviewing_client();
        let reviewer = KubeTokenReviewer::new(client, AUDIENCE);

        let good = "good:ml:train-worker-0".to_owned();
        let first = reviewer.review(good.clone()).await;
        assert_eq!(
            first,
            Ok(Identity {
                namespace: "ml".to_owned(),
                pod_name: "train-worker-0".to_owned(),
                pod_uid: "uid-train-worker-0".to_owned(),
            })
        );
        assert_eq!(
            last.lock().expect("last")["spec"],
            json!({"token": good, "audiences": [AUDIENCE]})
        );
        assert_eq!(reviewer.review(good.clone()).await, first);
        assert_eq!(reviews.load(Ordering::SeqCst), 1, "the second was cached");
        assert_eq!(reviewer.cached(), 1);

        let refused = Err(AuthError::Unauthenticated(
            "invalid token: invalid bearer token".to_owned(),
        ));
        for _ in 0..3 {
            assert_eq!(reviewer.review("forged".to_owned()).await, refused);
        }
        assert_eq!(
            reviews.load(Ordering::SeqCst),
            2,
            "a forged token sent again is answered from the cache"
        );
        assert_eq!(reviewer.known("forged"), Some(refused));
        assert_eq!(reviewer.known(&good), Some(first));
        assert_eq!(reviewer.known("never-seen"), None);
        assert_eq!((reviewer.cached(), reviewer.cached_rejections()), (1, 1));
    }

    #[tokio::test]
    async fn rejected_tokens_are_remembered_up_to_a_bound() {
        let (client, reviews, _) = reviewing_client();
        let reviewer = KubeTokenReviewer::new(client, AUDIENCE);
        let forged = DEFAULT_REJECTED_CAPACITY + 100;
        for i in 0..forged {
            assert!(reviewer.review(format!("forged-{i}")).await.is_err());
            assert!(reviewer.cached_rejections() <= DEFAULT_REJECTED_CAPACITY);
        }
        assert_eq!(reviewer.cached_rejections(), DEFAULT_REJECTED_CAPACITY);
        assert_eq!(reviews.load(Ordering::SeqCst), forged);
        // The newest are remembered, the oldest forgotten.
        assert!(reviewer.known(&format!("forged-{}", forged - 1)).is_some());
        assert_eq!(reviewer.known("forged-0"), None);
        let long = "x".repeat(4 * MAX_REASON_BYTES);
        assert_eq!(truncated(&long).len(), MAX_REASON_BYTES);
        assert_eq!(truncated("ünïcödé"), "ünïcödé");
    }

    #[tokio::test]
    async fn an_answer_without_audiences_is_refused_by_default() {
        let (client, _, _) = reviewing_client();
        let strict = KubeTokenReviewer::new(client.clone(), AUDIENCE);
        assert!(matches!(
            strict.review("noaud:ml:p".to_owned()).await,
            Err(AuthError::Unauthenticated(_))
        ));
        let unaware = KubeTokenReviewer::new(client, AUDIENCE)
            .checking_audiences(AudienceCheck::UnawareReviewer);
        assert_eq!(
            unaware
                .review("noaud:ml:p".to_owned())
                .await
                .map(|i| i.pod_name),
            Ok("p".to_owned())
        );
    }

    #[tokio::test]
    async fn a_failed_review_is_unavailable_not_unauthenticated_and_never_cached() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async {
                let body = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                              "code": 403, "reason": "Forbidden", "message": "no"});
                Ok::<_, kube::Error>(
                    http::Response::builder()
                        .status(403)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(
                            serde_json::to_vec(&body).expect("json"),
                        ))
                        .expect("response"),
                )
            }
        });
        let reviewer = KubeTokenReviewer::new(kube::Client::new(service, "default"), AUDIENCE);
        for _ in 0..2 {
            assert!(matches!(
                reviewer.review("good:ml:p".to_owned()).await,
                Err(AuthError::Unavailable(_))
            ));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "each review was asked for");
        assert_eq!(reviewer.known("good:ml:p"), None);
        assert_eq!(reviewer.cached_rejections(), 0);
    }
}
