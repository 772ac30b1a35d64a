//! The HTTP endpoint trainers report to: `POST /v1/progress` (the protocol is in the module
//! docs of [`crate::progress`]).
//!
//! A report is checked in this order, each step answering its own status: the bearer token's
//! presence (401), the content type (415), the body's size and arrival (413, 408), the JSON and
//! its ranges (400), the token's shape (401, without a review), the token review (401; 429 when
//! its source already has [`MAX_REVIEWS_PER_SOURCE`] reviews in flight; 503 when the review
//! cannot be made or too many are in flight), and the pod the token is bound to, which must be
//! that job's worker of that rank and attempt (403). Only then is the report recorded, and the job's reconcile woken
//! when the store says the plan should look.
//!
//! Only a token review that the reviewer cannot answer from its caches takes one of the
//! [`MAX_CONCURRENT_REVIEWS`] permits, so nothing a client does before that (a missing token,
//! a body that never comes, a forged token already rejected) holds one, and a rank whose token
//! is cached is never refused for load. Connections themselves are bounded by the listener
//! ([`trainyard_listen`]).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Deserialize;
use tokio::sync::{Semaphore, mpsc};
use trainyard_listen::HttpLimits;

use super::auth::{AuthError, Identity, TokenReviewer};
use super::store::{ProgressStore, Report};
use super::supervisors::{self, Order, Poll};
use crate::config::{PROGRESS_PATH, SUPERVISOR_PATH};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::cached_pod::CachedPod;
use crate::model::crd::{LABEL_ATTEMPT, LABEL_JOB, LABEL_RANK, MAX_STEP, TrainingJob};
use crate::model::seal::{self, SealKey, Sealed};
use crate::model::supervision::SupervisedState;

/// The largest body accepted; a report is about 150 bytes.
pub const MAX_BODY_BYTES: usize = 4 * 1024;
/// The largest bearer token accepted (a projected token is about 1 KiB).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// How many token reviews are in flight at once; a report that needs one more is answered 503
/// at once.
pub const MAX_CONCURRENT_REVIEWS: usize = 64;
/// How many of them one source address may hold: a pod that floods the port with tokens that
/// look right costs the API server at most this many reviews at a time, and leaves the other
/// permits to everyone else. A trainer needs one review per token it reports with.
pub const MAX_REVIEWS_PER_SOURCE: usize = 4;
/// How long a body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a token review may take while it holds one of the permits.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// A worker pod, as its labels and owner say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerIdentity {
    /// The pod's uid.
    pub uid: String,
    /// The job that controls it.
    pub job: String,
    /// That job's uid, from the pod's controller owner reference.
    pub job_uid: String,
    /// Its rank.
    pub rank: u32,
    /// Its attempt.
    pub attempt: u32,
}

/// Finds the worker a token's pod is.
pub trait PodLookup: Send + Sync + 'static {
    /// The worker `namespace/pod` is, or `None` when it is not a job's worker pod.
    fn worker(&self, namespace: &str, pod: &str) -> Option<WorkerIdentity>;
}

/// The worker the pod `meta` claims to be: a pod with the job, rank and attempt labels whose
/// controller owner reference names the `TrainingJob` its job label names. A label alone
/// proves nothing (anyone who can create a pod can set it), and neither does an owner
/// reference, which any pod creator can write too: [`WorkerPods`] also requires the reference's
/// uid to be the uid of the job of that name now.
pub fn worker_identity(meta: &ObjectMeta) -> Option<WorkerIdentity> {
    let labels = meta.labels.as_ref()?;
    let job = labels.get(LABEL_JOB)?;
    let controller = meta.owner_references.as_deref()?.iter().find(|o| {
        o.controller == Some(true)
            && o.kind == "TrainingJob"
            && o.api_version.starts_with("trainyard.dev/")
            && o.name == *job
    })?;
    Some(WorkerIdentity {
        uid: meta.uid.clone()?,
        job: job.clone(),
        job_uid: controller.uid.clone(),
        rank: labels.get(LABEL_RANK)?.parse().ok()?,
        attempt: labels.get(LABEL_ATTEMPT)?.parse().ok()?,
    })
}

/// The operator's pod and job caches as a [`PodLookup`]: a pod is a worker when its labels and
/// controller owner reference say so ([`worker_identity`]), that reference carries the uid of
/// the `TrainingJob` of that name in the cache, and the operator's seal covers that name, job,
/// rank and attempt ([`seal`]). Everything but the seal can be copied by anyone who may
/// create pods: a copy of a worker under another name, or with another attempt, is not one.
pub struct WorkerPods {
    /// The pods.
    pub pods: Store<CachedPod>,
    /// The jobs, malformed ones included.
    pub jobs: Store<DeserializeGuard<TrainingJob>>,
    /// The key the operator seals its worker pods with.
    pub seal: SealKey,
}

impl PodLookup for WorkerPods {
    fn worker(&self, namespace: &str, pod: &str) -> Option<WorkerIdentity> {
        let cached = self.pods.get(&ObjectRef::new(pod).within(namespace))?;
        let worker = worker_identity(&cached.metadata)?;
        let job = self
            .jobs
            .get(&ObjectRef::new(&worker.job).within(namespace))?;
        if job.meta().uid.as_deref() != Some(worker.job_uid.as_str()) {
            return None;
        }
        let sealed = self.seal.check(
            &cached.metadata,
            &seal::Worker {
                namespace,
                pod,
                job_uid: &worker.job_uid,
                rank: worker.rank,
                attempt: worker.attempt,
            },
        );
        (sealed != Sealed::Forged).then_some(worker)
    }
}

/// What the endpoint needs.
pub struct ProgressServer {
    /// Where reports go.
    pub store: Arc<ProgressStore>,
    /// Who sent them.
    pub reviewer: Arc<dyn TokenReviewer>,
    /// Which worker that is.
    pub pods: Arc<dyn PodLookup>,
    /// `trainyard_operator_progress_reports_total`.
    pub metrics: Arc<Metrics>,
    /// `(namespace, job)` to reconcile now. Sent with `try_send`: when the queue is full the
    /// wake is dropped, and the job's next change or periodic reconcile reads the store anyway.
    pub wake: mpsc::Sender<(String, String)>,
}

/// How a report was answered: the label of `trainyard_operator_progress_reports_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Accepted,
    Unauthenticated,
    Forbidden,
    Invalid,
    TooLarge,
    Overloaded,
    Throttled,
    UnknownJob,
    Internal,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::Forbidden => "forbidden",
            Outcome::Invalid => "invalid",
            Outcome::TooLarge => "too_large",
            Outcome::Overloaded => "overloaded",
            Outcome::Throttled => "throttled",
            Outcome::UnknownJob => "unknown_job",
            Outcome::Internal => "internal",
        }
    }
}

/// A report not accepted.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    outcome: Outcome,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, outcome: Outcome, message: impl Into<String>) -> Self {
        Self {
            status,
            outcome,
            message: message.into(),
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Outcome::Invalid, message)
    }

    fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, Outcome::Forbidden, message)
    }

    fn overloaded(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Outcome::Overloaded,
            message,
        )
    }
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn error_response(status: StatusCode, message: &str) -> Response {
    json_response(status, &serde_json::json!({ "error": message }))
}

/// The report as posted.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReportBody {
    job: String,
    rank: u32,
    attempt: u32,
    step: u64,
    #[serde(default)]
    loss: Option<f64>,
    #[serde(default)]
    checkpoint_step: Option<u64>,
    #[serde(default)]
    checkpoint_file: Option<String>,
    #[serde(default)]
    resumed_from: Option<u64>,
}

impl ReportBody {
    fn parse(bytes: &[u8]) -> Result<(String, Report), Refusal> {
        let body: ReportBody = serde_json::from_slice(bytes)
            .map_err(|e| Refusal::invalid(format!("invalid report: {e}")))?;
        if body.job.is_empty() {
            return Err(Refusal::invalid("job is empty"));
        }
        for (field, value) in [
            ("step", Some(body.step)),
            ("checkpointStep", body.checkpoint_step),
            ("resumedFrom", body.resumed_from),
        ] {
            if value.is_some_and(|v| v > MAX_STEP) {
                return Err(Refusal::invalid(format!(
                    "{field} is over the maximum {MAX_STEP}"
                )));
            }
        }
        if body.loss.is_some_and(|l| !l.is_finite()) {
            return Err(Refusal::invalid("loss is not finite"));
        }
        if let Some(file) = &body.checkpoint_file {
            if !trainyard_api::env::is_checkpoint_file_name(file) {
                return Err(Refusal::invalid(format!(
                    "checkpointFile must be a plain file name in the checkpoint directory (no \
                     '/', not hidden, at most {} bytes)",
                    trainyard_api::env::MAX_CHECKPOINT_FILE_BYTES
                )));
            }
            if body.checkpoint_step.is_none() {
                return Err(Refusal::invalid(
                    "checkpointFile names the checkpoint of checkpointStep, which is missing",
                ));
            }
        }
        Ok((
            body.job,
            Report {
                rank: body.rank,
                attempt: body.attempt,
                step: body.step,
                loss: body.loss,
                checkpoint_step: body.checkpoint_step,
                checkpoint_file: body.checkpoint_file,
                resumed_from: body.resumed_from,
            },
        ))
    }
}

/// The token of `Authorization: Bearer <token>`, if it is one of a sane size.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer")
        && !token.is_empty()
        && token.len() <= MAX_TOKEN_BYTES
        && !token.contains(' '))
    .then(|| token.to_owned())
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

struct ServerShared {
    server: Arc<ProgressServer>,
    permits: Semaphore,
    per_source: PerSource,
}

/// Token reviews in flight by source address, each source at most
/// [`MAX_REVIEWS_PER_SOURCE`]; a source leaves the map with its last review, so it holds no
/// more entries than there are reviews in flight.
#[derive(Default)]
struct PerSource(std::sync::Mutex<HashMap<IpAddr, usize>>);

impl PerSource {
    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        // A count is updated whole under the lock: a panic elsewhere cannot tear it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more review for `source`, unless it holds as many as it may.
    fn take(&self, source: IpAddr) -> Option<SourceSlot<'_>> {
        let mut counts = self.counts();
        let held = counts.entry(source).or_insert(0);
        if *held >= MAX_REVIEWS_PER_SOURCE {
            return None;
        }
        *held += 1;
        Some(SourceSlot { of: self, source })
    }
}

/// A review of one source in flight; given back when dropped.
struct SourceSlot<'a> {
    of: &'a PerSource,
    source: IpAddr,
}

impl Drop for SourceSlot<'_> {
    fn drop(&mut self) {
        let mut counts = self.of.counts();
        if let Some(held) = counts.get_mut(&self.source) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                counts.remove(&self.source);
            }
        }
    }
}

/// Reads the body within [`BODY_TIMEOUT`], refusing one that is late, too large or unreadable.
async fn read_body(request: Request) -> Result<Bytes, Refusal> {
    match tokio::time::timeout(BODY_TIMEOUT, Bytes::from_request(request, &())).await {
        Err(_) => Err(Refusal::new(
            StatusCode::REQUEST_TIMEOUT,
            Outcome::Invalid,
            "the body did not arrive in time",
        )),
        Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                Outcome::TooLarge,
                format!("the body is over {MAX_BODY_BYTES} bytes"),
            ))
        }
        Ok(Err(rejection)) => Err(Refusal::invalid(rejection.body_text())),
        Ok(Ok(bytes)) => Ok(bytes),
    }
}

/// The pod `token` was issued to: from what the reviewer knows, or else from a review within
/// [`REVIEW_TIMEOUT`] that holds one of the permits.
async fn review(
    shared: &ServerShared,
    token: String,
    source: Option<IpAddr>,
) -> Result<Identity, Refusal> {
    let reviewer = shared.server.reviewer.as_ref();
    if let Err(AuthError::Unauthenticated(why) | AuthError::Unavailable(why)) =
        reviewer.precheck(&token)
    {
        return Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            Outcome::Unauthenticated,
            why,
        ));
    }
    let answer = match reviewer.known(&token) {
        Some(known) => known,
        None => {
            // Refused for its source alone: not the channel's trouble, the other ranks'
            // reports still count.
            let _slot = match source {
                Some(source) => Some(shared.per_source.take(source).ok_or_else(|| {
                    Refusal::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        Outcome::Throttled,
                        format!(
                            "{source} has {MAX_REVIEWS_PER_SOURCE} token reviews in flight already"
                        ),
                    )
                })?),
                None => None,
            };
            let Ok(_permit) = shared.permits.try_acquire() else {
                return Err(Refusal::overloaded("overloaded"));
            };
            match tokio::time::timeout(REVIEW_TIMEOUT, reviewer.review(token)).await {
                Err(_) => return Err(Refusal::overloaded("the token review timed out")),
                Ok(answer) => answer,
            }
        }
    };
    match answer {
        Err(AuthError::Unavailable(why)) => {
            tracing::warn!(%why, "progress report: token review failed");
            Err(Refusal::overloaded("the token cannot be reviewed now"))
        }
        Err(AuthError::Unauthenticated(why)) => Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            Outcome::Unauthenticated,
            why,
        )),
        Ok(identity) => Ok(identity),
    }
}

/// Checks that the token's pod is `job`'s worker of the report's rank and attempt; the uid of
/// the job it belongs to.
fn check_worker(
    pods: &dyn PodLookup,
    identity: &Identity,
    job: &str,
    report: &Report,
) -> Result<String, Refusal> {
    let pod = format!("{}/{}", identity.namespace, identity.pod_name);
    let worker = token_worker(pods, identity)?;
    if worker.job != job {
        return Err(Refusal::forbidden(format!(
            "pod {pod} is a worker of job {}, not {job}",
            worker.job
        )));
    }
    if worker.rank != report.rank {
        return Err(Refusal::forbidden(format!(
            "pod {pod} is rank {}, not rank {}",
            worker.rank, report.rank
        )));
    }
    if worker.attempt != report.attempt {
        return Err(Refusal::forbidden(format!(
            "pod {pod} runs attempt {}, not attempt {}",
            worker.attempt, report.attempt
        )));
    }
    Ok(worker.job_uid)
}

/// What a POST to the endpoint carries, before its body is parsed.
struct Posted {
    token: String,
    /// The connection's peer (the listener puts it on every request).
    source: Option<IpAddr>,
    bytes: Bytes,
}

impl Posted {
    /// The bearer token, the peer and the body of a JSON POST (read within [`BODY_TIMEOUT`]).
    async fn read(request: Request) -> Result<Self, Refusal> {
        let Some(token) = bearer(request.headers()) else {
            return Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                Outcome::Unauthenticated,
                "Authorization: Bearer <token> is missing or malformed",
            ));
        };
        if !is_json(request.headers()) {
            return Err(Refusal::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Outcome::Invalid,
                "Content-Type is not application/json",
            ));
        }
        let source = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| peer.ip());
        let bytes = read_body(request).await?;
        Ok(Self {
            token,
            source,
            bytes,
        })
    }
}

/// The check of a request ended without an answer: a bug of ours, not load, counted apart so
/// that an alert on "overloaded" means load.
fn ended_early(log: &str, noun: &str, e: &tokio::task::JoinError) -> Refusal {
    tracing::error!(error = %e, "{log}: the check ended early");
    Refusal::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        Outcome::Internal,
        format!("the {noun}'s check ended early: {e}"),
    )
}

/// The worker pod the token was issued to, as the caches know it.
fn token_worker(pods: &dyn PodLookup, identity: &Identity) -> Result<WorkerIdentity, Refusal> {
    let pod = format!("{}/{}", identity.namespace, identity.pod_name);
    let Some(worker) = pods.worker(&identity.namespace, &identity.pod_name) else {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            Outcome::UnknownJob,
            format!("pod {pod} is not a worker of any existing TrainingJob"),
        ));
    };
    if worker.uid != identity.pod_uid {
        return Err(Refusal::forbidden(format!(
            "pod {pod} is not the pod the token was issued to"
        )));
    }
    Ok(worker)
}

/// A supervisor's poll as posted (`examples/trainyard_launch.py`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PollBody {
    job: String,
    rank: u32,
    attempt: u32,
    state: String,
    #[serde(default)]
    exit_code: Option<i32>,
    /// For an exit: how many seconds before this poll the trainer exited (the supervisor's
    /// clock); absent, the exit is dated when it is heard.
    #[serde(default)]
    exited_seconds_ago: Option<f64>,
    /// How long a continue may be held for a change of the job's directive (seconds; at most
    /// [`supervisors::MAX_HOLD`]): absent or 0, it is answered at once.
    #[serde(default)]
    wait_seconds: Option<f64>,
    /// A standby still warming what its start needs (its spare interpreter importing).
    #[serde(default)]
    warming: bool,
}

/// An optional number of seconds of a poll, at most `max` (absent: zero); anything but a
/// finite number of at least 0 is refused, naming `field`.
fn seconds_field(field: &str, value: Option<f64>, max: Duration) -> Result<Duration, Refusal> {
    match value {
        None => Ok(Duration::ZERO),
        Some(v) if v.is_finite() && v >= 0.0 => {
            Ok(Duration::from_secs_f64(v.min(max.as_secs_f64())))
        }
        Some(v) => Err(Refusal::invalid(format!(
            "{field} must be a number of seconds, at least 0, not {v}"
        ))),
    }
}

/// A checked poll: its job, the poll, and how long a continue may be held.
struct CheckedPoll {
    job: String,
    poll: Poll,
    hold: Duration,
}

impl PollBody {
    /// The job and the poll (its pod uid still empty: the token names the pod).
    fn parse(bytes: &[u8]) -> Result<CheckedPoll, Refusal> {
        let body: PollBody = serde_json::from_slice(bytes)
            .map_err(|e| Refusal::invalid(format!("invalid poll: {e}")))?;
        if body.job.is_empty() {
            return Err(Refusal::invalid("job is empty"));
        }
        let hold = seconds_field("waitSeconds", body.wait_seconds, supervisors::MAX_HOLD)?;
        let exited_ago = seconds_field(
            "exitedSecondsAgo",
            body.exited_seconds_ago,
            supervisors::MAX_EXIT_AGE,
        )?;
        let state = match (body.state.as_str(), body.exit_code) {
            ("running", _) => SupervisedState::Running,
            ("stopped", _) => SupervisedState::Stopped,
            ("exited", Some(code)) if code != 0 => SupervisedState::Exited(code),
            ("exited", _) => {
                return Err(Refusal::invalid(
                    "state exited needs a non-zero exitCode (a trainer that exits 0 ends its \
                     supervisor)",
                ));
            }
            (other, _) => {
                return Err(Refusal::invalid(format!(
                    "state must be running, exited or stopped, not {other:?}"
                )));
            }
        };
        Ok(CheckedPoll {
            job: body.job,
            poll: Poll {
                pod_uid: String::new(),
                rank: body.rank,
                attempt: body.attempt,
                state,
                exited_ago,
                warming: body.warming,
            },
            hold,
        })
    }
}

/// Checks that the token's pod is `job`'s worker of the poll's rank (of any attempt: a kept
/// pod's label moves to the next attempt while its supervisor still reports the last); the
/// uid of the job it belongs to.
fn check_supervisor(
    pods: &dyn PodLookup,
    identity: &Identity,
    job: &str,
    rank: u32,
) -> Result<String, Refusal> {
    let pod = format!("{}/{}", identity.namespace, identity.pod_name);
    let worker = token_worker(pods, identity)?;
    if worker.job != job || worker.rank != rank {
        return Err(Refusal::forbidden(format!(
            "pod {pod} is rank {} of job {}, not rank {rank} of {job}",
            worker.rank, worker.job
        )));
    }
    Ok(worker.job_uid)
}

/// Checks and records one supervisor's poll; the answer is its order, and how long the
/// directive tells a stopped supervisor to hold (0: unsaid).
async fn handle_poll(shared: Arc<ServerShared>, request: Request) -> Result<(Order, u32), Refusal> {
    // As for reports: what a poll says held when it arrived.
    let arrived = jiff::Timestamp::now();
    let Posted {
        token,
        source,
        bytes,
    } = Posted::read(request).await?;
    let CheckedPoll {
        job,
        mut poll,
        hold,
    } = PollBody::parse(&bytes)?;
    // As for reports: the review lands in the cache even when the supervisor stops waiting.
    let checked = tokio::spawn(async move {
        let identity = review(&shared, token, source).await?;
        let server = &shared.server;
        let board = &server.store.supervisors;
        let job_uid = check_supervisor(server.pods.as_ref(), &identity, &job, poll.rank)?;
        poll.pod_uid = identity.pod_uid;
        let ns = identity.namespace;
        // A poll that may be held registers before the answer is read: a change from then on
        // ends the wait.
        let changes = (!hold.is_zero()).then(|| board.changes(&ns, &job, &job_uid));
        let changed = changes.as_ref().map(|c| c.notified());
        tokio::pin!(changed);
        if let Some(changed) = changed.as_mut().as_pin_mut() {
            changed.enable();
        }
        let answered = board.poll(&ns, &job, &job_uid, poll.clone(), arrived);
        if answered.wake {
            let _ = server.wake.try_send((ns.clone(), job.clone()));
        }
        // Only a continue to a poll that may be held waits.
        let Some(changed) = changed
            .as_pin_mut()
            .filter(|_| answered.order == Order::Continue)
        else {
            return Ok((answered.order, board.hold_seconds(&ns, &job, &job_uid)));
        };
        let _ = tokio::time::timeout(hold, changed).await;
        // Heard again at the answer: a held supervisor is never taken for a quiet one.
        let order = board.answer_held(&ns, &job, &job_uid, &poll, jiff::Timestamp::now());
        Ok((order, board.hold_seconds(&ns, &job, &job_uid)))
    });
    checked
        .await
        .unwrap_or_else(|e| Err(ended_early("supervisor poll", "poll", &e)))
}

async fn supervise(State(shared): State<Arc<ServerShared>>, request: Request) -> Response {
    let (outcome, response) = match handle_poll(shared.clone(), request).await {
        Ok((order, hold)) => {
            let mut answer = order.to_json();
            if hold > 0 {
                answer["holdSeconds"] = serde_json::json!(hold);
            }
            (Outcome::Accepted, json_response(StatusCode::OK, &answer))
        }
        Err(rejection) => {
            tracing::debug!(
                outcome = rejection.outcome.label(),
                message = %rejection.message,
                "supervisor poll refused"
            );
            (
                rejection.outcome,
                error_response(rejection.status, &rejection.message),
            )
        }
    };
    shared.server.metrics.count_supervisor_poll(outcome.label());
    response
}

/// Records the report as of its arrival (`arrived`), and wakes the job's reconcile when the
/// store says so; whether to checkpoint.
fn record(
    server: &ProgressServer,
    namespace: String,
    job: String,
    job_uid: &str,
    report: &Report,
    arrived: jiff::Timestamp,
) -> bool {
    let recorded = server
        .store
        .record(&namespace, &job, job_uid, report, arrived);
    if recorded.wake {
        // Full: dropped; the reconcile that is due reads the store anyway.
        let _ = server.wake.try_send((namespace, job));
    }
    recorded.checkpoint
}

/// Checks and records one report; the answer is whether to checkpoint.
///
/// The review and the record run in a task of their own, to the end, even when the trainer
/// stops waiting: a trainer gives a report 2 s (docs/env-contract.md), and a review over a
/// slow API server takes longer (1 s of latency each way: every first report of a pod timed
/// out, was dropped with its review, and was never cached, so no rank of the job ever counted
/// as reporting and a lost node waited for NotReady). Now the review lands in the cache and
/// the report in the store, and the trainer's next report is answered from the cache.
async fn handle(shared: Arc<ServerShared>, request: Request) -> Result<bool, Refusal> {
    // A report says the rank was alive when it arrived, not once its token was reviewed (up
    // to 10 s later): the lost-peer rule compares it with a failure's time.
    let arrived = jiff::Timestamp::now();
    let Posted {
        token,
        source,
        bytes,
    } = Posted::read(request).await?;
    let (job, report) = ReportBody::parse(&bytes)?;

    let checked = tokio::spawn(async move {
        let identity = review(&shared, token, source)
            .await
            .inspect_err(|rejection| {
                if rejection.outcome == Outcome::Overloaded {
                    shared.server.store.refused(jiff::Timestamp::now());
                }
            })?;
        let server = &shared.server;
        let job_uid = check_worker(server.pods.as_ref(), &identity, &job, &report)?;
        Ok(record(
            server,
            identity.namespace,
            job,
            &job_uid,
            &report,
            arrived,
        ))
    });
    checked
        .await
        .unwrap_or_else(|e| Err(ended_early("progress report", "report", &e)))
}

async fn report(State(shared): State<Arc<ServerShared>>, request: Request) -> Response {
    let (outcome, response) = match handle(shared.clone(), request).await {
        Ok(checkpoint) => (
            Outcome::Accepted,
            json_response(
                StatusCode::OK,
                &serde_json::json!({ "checkpoint": checkpoint }),
            ),
        ),
        Err(rejection) => {
            tracing::debug!(
                outcome = rejection.outcome.label(),
                message = %rejection.message,
                "progress report refused"
            );
            (
                rejection.outcome,
                error_response(rejection.status, &rejection.message),
            )
        }
    };
    shared.server.metrics.count_report(outcome.label());
    response
}

async fn not_found() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "no such path; reports go to /v1/progress",
    )
}

async fn method_not_allowed() -> Response {
    let mut response = error_response(StatusCode::METHOD_NOT_ALLOWED, "reports are POSTed");
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}

/// The endpoint: `POST /v1/progress`, with at most [`MAX_CONCURRENT_REVIEWS`] token reviews
/// in flight.
pub fn router(server: Arc<ProgressServer>) -> Router {
    router_with_permits(server, MAX_CONCURRENT_REVIEWS)
}

fn router_with_permits(server: Arc<ProgressServer>, permits: usize) -> Router {
    let shared = Arc::new(ServerShared {
        server,
        permits: Semaphore::new(permits),
        per_source: PerSource::default(),
    });
    Router::new()
        .route(PROGRESS_PATH, post(report))
        .route(SUPERVISOR_PATH, post(supervise))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(shared)
}

/// Binds the progress endpoint with the default limits ([`HttpLimits::PROGRESS`]); the
/// returned future serves until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    server: Arc<ProgressServer>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = std::io::Result<()>>), Error> {
    serve_within(addr, server, HttpLimits::PROGRESS, shutdown).await
}

/// Binds the progress endpoint; the returned future serves within `limits` until `shutdown`
/// completes.
pub async fn serve_within(
    addr: SocketAddr,
    server: Arc<ProgressServer>,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = std::io::Result<()>>), Error> {
    let store = server.store.clone();
    let turned_away: trainyard_listen::TurnedAway =
        Arc::new(move || store.refused(jiff::Timestamp::now()));
    let app = router(server);
    let serving =
        trainyard_listen::serve_telling("progress", addr, app, limits, Some(turned_away), shutdown)
            .await?;
    Ok(serving)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::body::Body;
    use futures::FutureExt;
    use futures::future::BoxFuture;
    use serde_json::{Value, json};
    use tower::ServiceExt;

    use super::*;
    use crate::model::supervision::Directive;
    use crate::progress::auth::tests::{jwt, reviewing_client};
    use crate::progress::auth::{Identity, KubeTokenReviewer};

    /// Tokens `tok-<pod>` of pods in `ml`, each a worker `<job>-worker-<rank>` (uid
    /// `uid-<pod>`) of attempt 1; `bad` is refused. While `gate` is closed, reviews wait.
    #[derive(Default)]
    struct FakeReviewer {
        gate: Option<Arc<Semaphore>>,
        waiting: Arc<AtomicUsize>,
    }

    impl TokenReviewer for FakeReviewer {
        fn review(&self, token: String) -> BoxFuture<'static, Result<Identity, AuthError>> {
            let gate = self.gate.clone();
            let waiting = self.waiting.clone();
            async move {
                if let Some(gate) = gate {
                    waiting.fetch_add(1, Ordering::SeqCst);
                    let _open = gate.acquire().await.expect("gate");
                }
                match token.strip_prefix("tok-") {
                    Some(pod) => Ok(Identity {
                        namespace: "ml".to_owned(),
                        pod_name: pod.to_owned(),
                        pod_uid: format!("uid-{pod}"),
                    }),
                    None => Err(AuthError::Unauthenticated("invalid token".to_owned())),
                }
            }
            .boxed()
        }
    }

    /// Workers `<job>-worker-<rank>` of attempt 1 in `ml`, for the jobs and ranks listed.
    struct FakePods(HashMap<String, WorkerIdentity>);

    impl FakePods {
        fn of(jobs: &[(&str, u32)]) -> Self {
            let mut pods = HashMap::new();
            for &(job, workers) in jobs {
                for rank in 0..workers {
                    let name = format!("{job}-worker-{rank}");
                    pods.insert(
                        name.clone(),
                        WorkerIdentity {
                            uid: format!("uid-{name}"),
                            job: job.to_owned(),
                            job_uid: format!("uid-job-{job}"),
                            rank,
                            attempt: 1,
                        },
                    );
                }
            }
            Self(pods)
        }
    }

    impl PodLookup for FakePods {
        fn worker(&self, namespace: &str, pod: &str) -> Option<WorkerIdentity> {
            (namespace == "ml").then(|| self.0.get(pod).cloned())?
        }
    }

    struct ServerHarness {
        router: Router,
        server: Arc<ProgressServer>,
        woken: mpsc::Receiver<(String, String)>,
    }

    fn harness_with(
        reviewer: Arc<dyn TokenReviewer>,
        pods: impl PodLookup + 'static,
        permits: usize,
    ) -> ServerHarness {
        let (wake, woken) = mpsc::channel(16);
        let server = Arc::new(ProgressServer {
            store: Arc::new(ProgressStore::default()),
            reviewer,
            pods: Arc::new(pods),
            metrics: Arc::new(Metrics::new()),
            wake,
        });
        ServerHarness {
            router: router_with_permits(server.clone(), permits),
            server,
            woken,
        }
    }

    fn harness() -> ServerHarness {
        harness_with(
            Arc::new(FakeReviewer::default()),
            FakePods::of(&[("train", 2), ("other", 1)]),
            MAX_CONCURRENT_REVIEWS,
        )
    }

    fn request(token: Option<&str>, body: impl Into<Body>) -> Request {
        let mut builder = Request::builder()
            .method("POST")
            .uri(PROGRESS_PATH)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        builder.body(body.into()).expect("request")
    }

    async fn send(router: &Router, request: Request) -> (StatusCode, Value) {
        let response = router.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn post(router: &Router, token: &str, body: Value) -> (StatusCode, Value) {
        send(router, request(Some(token), body.to_string())).await
    }

    fn good(rank: u32, step: u64) -> Value {
        json!({"job": "train", "rank": rank, "attempt": 1, "step": step})
    }

    fn counted(server: &ProgressServer, outcome: &str) -> bool {
        let line = format!("trainyard_operator_progress_reports_total{{outcome=\"{outcome}\"}} 1");
        server.metrics.render().lines().any(|l| l == line)
    }

    #[tokio::test]
    async fn a_good_report_is_recorded_and_answered_without_a_checkpoint() {
        let mut h = harness();
        let body = json!({"job": "train", "rank": 1, "attempt": 1, "step": 42, "loss": 2.5,
                          "checkpointStep": 40, "resumedFrom": 0, "someFutureField": [1]});
        let (status, answer) = post(&h.router, "tok-train-worker-1", body).await;
        assert_eq!(
            (status, answer),
            (StatusCode::OK, json!({"checkpoint": false}))
        );
        let p = h.server.store.snapshot("ml", "train").expect("recorded");
        assert_eq!((p.attempt, p.step()), (1, Some(42)));
        assert_eq!(p.ranks[&1].loss, Some(2.5));
        assert_eq!((p.checkpoint_step, p.resumed_from), (Some(40), Some(0)));
        assert!(counted(&h.server, "accepted"));
        assert_eq!(
            h.woken.try_recv(),
            Ok(("ml".to_owned(), "train".to_owned()))
        );
    }

    #[tokio::test]
    async fn a_checkpoint_file_is_recorded_only_as_a_plain_name_with_its_step() {
        let mut h = harness();
        for (body, refused) in [
            (
                json!({"checkpointStep": 40, "checkpointFile": "../latest.pt"}),
                "checkpointFile",
            ),
            (
                json!({"checkpointStep": 40, "checkpointFile": ".fence"}),
                "checkpointFile",
            ),
            (json!({"checkpointFile": "step-40-a1.pt"}), "checkpointStep"),
        ] {
            let mut report = good(0, 42);
            report
                .as_object_mut()
                .expect("object")
                .extend(body.as_object().expect("object").clone());
            let (status, answer) = post(&h.router, "tok-train-worker-0", report).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
            assert!(
                answer["error"]
                    .as_str()
                    .is_some_and(|e| e.contains(refused)),
                "{answer}"
            );
        }
        assert!(h.server.store.snapshot("ml", "train").is_none());
        let report = json!({"job": "train", "rank": 0, "attempt": 1, "step": 42,
                            "checkpointStep": 40, "checkpointFile": "step-000000040-a1.pt"});
        let (status, _) = post(&h.router, "tok-train-worker-0", report).await;
        assert_eq!(status, StatusCode::OK);
        let p = h.server.store.snapshot("ml", "train").expect("recorded");
        assert_eq!(p.checkpoint_step, Some(40));
        assert_eq!(p.checkpoint_file.as_deref(), Some("step-000000040-a1.pt"));
        let _ = h.woken.try_recv();
    }

    /// A bug in checking a report (here, a pod lookup that panics) answers 500 and is
    /// counted as `internal`, not as load.
    #[tokio::test]
    async fn a_check_that_panics_is_an_internal_error_not_overload() {
        struct Panicking;
        impl PodLookup for Panicking {
            fn worker(&self, _: &str, _: &str) -> Option<WorkerIdentity> {
                panic!("a bug in the lookup")
            }
        }
        let h = harness_with(
            Arc::new(FakeReviewer::default()),
            Panicking,
            MAX_CONCURRENT_REVIEWS,
        );
        let (status, _) = post(&h.router, "tok-train-worker-0", good(0, 1)).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(counted(&h.server, "internal"));
        assert!(!counted(&h.server, "overloaded"));
    }

    /// A trainer gives a report 2 s; over a slow API server the review takes longer. The
    /// report whose trainer stopped waiting is still reviewed and recorded (a rank that
    /// reports counts as reporting), and its review is not cancelled halfway.
    #[tokio::test]
    async fn a_report_whose_trainer_stopped_waiting_is_still_reviewed_and_recorded() {
        let gate = Arc::new(Semaphore::new(0));
        let reviewer = FakeReviewer {
            gate: Some(gate.clone()),
            waiting: Arc::default(),
        };
        let waiting = reviewer.waiting.clone();
        let h = harness_with(
            Arc::new(reviewer),
            FakePods::of(&[("train", 2)]),
            MAX_CONCURRENT_REVIEWS,
        );
        let sent = post(&h.router, "tok-train-worker-1", good(1, 7));
        let gave_up = tokio::time::timeout(Duration::from_millis(50), sent).await;
        assert!(gave_up.is_err(), "the review waits at the gate");
        assert_eq!(waiting.load(Ordering::SeqCst), 1);
        assert!(h.server.store.snapshot("ml", "train").is_none());
        gate.add_permits(1);
        let recorded = async {
            loop {
                if let Some(p) = h.server.store.snapshot("ml", "train") {
                    return p;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let p = tokio::time::timeout(Duration::from_secs(5), recorded)
            .await
            .expect("the report is recorded after its trainer left");
        assert_eq!((p.attempt, p.step()), (1, Some(7)));
        assert!(
            h.server.store.last_refusal().is_none(),
            "nothing was refused"
        );
    }

    /// A report whose review takes seconds (a pod's first report, a new token, a slow API
    /// server) is dated when it arrived: the rank was alive then, not once reviewed, and the
    /// lost-peer rule compares that time with a failure's.
    #[tokio::test]
    async fn a_report_is_dated_when_it_arrives_not_when_its_token_is_reviewed() {
        let gate = Arc::new(Semaphore::new(0));
        let reviewer = FakeReviewer {
            gate: Some(gate.clone()),
            waiting: Arc::default(),
        };
        let h = harness_with(
            Arc::new(reviewer),
            FakePods::of(&[("train", 2)]),
            MAX_CONCURRENT_REVIEWS,
        );
        let before = jiff::Timestamp::now();
        let router = h.router.clone();
        let sent =
            tokio::spawn(async move { post(&router, "tok-train-worker-1", good(1, 7)).await });
        tokio::time::sleep(Duration::from_millis(600)).await;
        let reviewed = jiff::Timestamp::now();
        gate.add_permits(1);
        let _ = sent.await;
        let p = h.server.store.snapshot("ml", "train").expect("recorded");
        let at = p.ranks[&1].reported_at;
        assert!(
            before <= at && at < reviewed,
            "reported at {at}, arrived from {before}, reviewed at {reviewed}"
        );
    }

    #[tokio::test]
    async fn a_plain_step_advance_does_not_wake_the_reconcile() {
        let mut h = harness();
        post(&h.router, "tok-train-worker-0", good(0, 1)).await;
        assert!(h.woken.try_recv().is_ok(), "the attempt's first report");
        post(&h.router, "tok-train-worker-0", good(0, 2)).await;
        assert!(h.woken.try_recv().is_err());
        post(&h.router, "tok-train-worker-1", good(1, 2)).await;
        assert!(h.woken.try_recv().is_ok(), "a rank's first report");
        let saved =
            json!({"job": "train", "rank": 1, "attempt": 1, "step": 3, "checkpointStep": 3});
        post(&h.router, "tok-train-worker-1", saved).await;
        assert!(h.woken.try_recv().is_ok(), "a newer checkpoint");
    }

    #[tokio::test]
    async fn a_full_wake_queue_drops_the_wake_and_still_accepts() {
        let (wake, _woken) = mpsc::channel(1);
        let h = harness();
        let server = Arc::new(ProgressServer {
            store: h.server.store.clone(),
            reviewer: h.server.reviewer.clone(),
            pods: h.server.pods.clone(),
            metrics: h.server.metrics.clone(),
            wake,
        });
        let router = router(server);
        for rank in 0..2 {
            let (status, _) =
                post(&router, &format!("tok-train-worker-{rank}"), good(rank, 1)).await;
            assert_eq!(status, StatusCode::OK);
        }
    }

    #[tokio::test]
    async fn a_requested_checkpoint_is_asked_for_until_it_is_reported_saved() {
        let h = harness();
        post(&h.router, "tok-train-worker-0", good(0, 100)).await;
        h.server.store.request_checkpoint("ml", "train", 1);
        let ask = (StatusCode::OK, json!({"checkpoint": true}));
        assert_eq!(
            post(&h.router, "tok-train-worker-0", good(0, 101)).await,
            ask
        );
        assert_eq!(
            post(&h.router, "tok-train-worker-1", good(1, 101)).await,
            ask
        );
        let early =
            json!({"job": "train", "rank": 0, "attempt": 1, "step": 102, "checkpointStep": 99});
        assert_eq!(post(&h.router, "tok-train-worker-0", early).await, ask);
        let saved =
            json!({"job": "train", "rank": 0, "attempt": 1, "step": 103, "checkpointStep": 102});
        let done = (StatusCode::OK, json!({"checkpoint": false}));
        assert_eq!(post(&h.router, "tok-train-worker-0", saved).await, done);
        assert_eq!(
            post(&h.router, "tok-train-worker-1", good(1, 104)).await,
            done
        );
        let p = h.server.store.snapshot("ml", "train").expect("recorded");
        assert_eq!(
            (p.checkpoint_requested, p.checkpoint_step),
            (None, Some(102))
        );
    }

    #[tokio::test]
    async fn a_report_of_a_new_attempt_keeps_the_previous_attempts_step() {
        let mut pods = FakePods::of(&[("train", 1)]);
        let h0 = harness();
        post(&h0.router, "tok-train-worker-0", good(0, 500)).await;
        // The same store, now the pod of attempt 2 (a new pod of the same name).
        pods.0.insert(
            "train-worker-0".to_owned(),
            WorkerIdentity {
                uid: "uid-train-worker-0".to_owned(),
                job: "train".to_owned(),
                job_uid: "uid-job-train".to_owned(),
                rank: 0,
                attempt: 2,
            },
        );
        let server = Arc::new(ProgressServer {
            store: h0.server.store.clone(),
            reviewer: h0.server.reviewer.clone(),
            pods: Arc::new(pods),
            metrics: h0.server.metrics.clone(),
            wake: h0.server.wake.clone(),
        });
        let router = router(server.clone());
        let resumed =
            json!({"job": "train", "rank": 0, "attempt": 2, "step": 450, "resumedFrom": 450});
        assert_eq!(
            post(&router, "tok-train-worker-0", resumed).await.0,
            StatusCode::OK
        );
        let p = server.store.snapshot("ml", "train").expect("recorded");
        assert_eq!(
            (p.attempt, p.previous_attempt_step, p.resumed_from),
            (2, Some(500), Some(450))
        );
    }

    #[tokio::test]
    async fn a_missing_or_malformed_bearer_token_is_unauthenticated() {
        let h = harness();
        let (status, answer) = send(&h.router, request(None, good(0, 1).to_string())).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(answer["error"].as_str().expect("error").contains("Bearer"));
        for value in ["Basic abc", "Bearer", "Bearer ", "tok-train-worker-0"] {
            let mut req = request(None, good(0, 1).to_string());
            req.headers_mut()
                .insert(header::AUTHORIZATION, HeaderValue::from_static(value));
            assert_eq!(
                send(&h.router, req).await.0,
                StatusCode::UNAUTHORIZED,
                "{value}"
            );
        }
        let huge = format!("tok-{}", "x".repeat(MAX_TOKEN_BYTES));
        assert_eq!(
            post(&h.router, &huge, good(0, 1)).await.0,
            StatusCode::UNAUTHORIZED
        );
        assert!(h.server.store.is_empty());
    }

    #[tokio::test]
    async fn an_invalid_token_or_one_for_another_audience_is_unauthenticated() {
        let h = harness();
        let (status, answer) = post(&h.router, "bad", good(0, 1)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(answer, json!({"error": "invalid token"}));
        assert!(counted(&h.server, "unauthenticated"));
        assert!(h.server.store.is_empty());

        // The real reviewer: a token the API server refuses for the audience.
        let (client, _, _) = reviewing_client();
        let h = harness_with(
            Arc::new(KubeTokenReviewer::new(client, "trainyard-progress")),
            FakePods::of(&[("train", 1)]),
            MAX_CONCURRENT_REVIEWS,
        );
        assert_eq!(
            post(&h.router, "a-token-for-the-api-server", good(0, 1))
                .await
                .0,
            StatusCode::UNAUTHORIZED
        );
    }

    async fn poll(router: &Router, token: &str, body: Value) -> (StatusCode, Value) {
        let request = Request::builder()
            .method("POST")
            .uri(SUPERVISOR_PATH)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::from(body.to_string()))
            .expect("request");
        send(router, request).await
    }

    #[tokio::test]
    async fn a_supervisors_poll_is_recorded_wakes_its_job_and_is_answered_from_the_directive() {
        let mut h = harness();
        let running = json!({"job": "train", "rank": 1, "attempt": 1, "state": "running"});
        let (status, answer) = poll(&h.router, "tok-train-worker-1", running.clone()).await;
        assert_eq!(
            (status, answer),
            (StatusCode::OK, json!({"action": "continue"}))
        );
        assert_eq!(
            h.woken.try_recv(),
            Ok(("ml".to_owned(), "train".to_owned()))
        );
        let seen = h
            .server
            .store
            .supervisors
            .snapshot("ml", "train", "uid-job-train");
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (seen[0].pod_uid.as_str(), seen[0].rank, seen[0].attempt),
            ("uid-train-worker-1", 1, 1)
        );
        // The same again changes nothing: no wake.
        poll(&h.router, "tok-train-worker-1", running.clone()).await;
        assert!(h.woken.try_recv().is_err());

        // Attempt 2 decided: stop; once stopped and allowed, start with the environment.
        let mut directive = Directive {
            attempt: 2,
            ..Directive::default()
        };
        let store = &h.server.store.supervisors;
        store.publish(
            "ml",
            "train",
            "uid-job-train",
            Some(directive.clone()),
            &["uid-train-worker-1"],
        );
        let (_, answer) = poll(&h.router, "tok-train-worker-1", running).await;
        assert_eq!(answer, json!({"action": "stop", "attempt": 2}));
        directive.start.insert(
            "uid-train-worker-1".to_owned(),
            vec![("TRAINYARD_ATTEMPT".to_owned(), "2".to_owned())],
        );
        store.publish(
            "ml",
            "train",
            "uid-job-train",
            Some(directive),
            &["uid-train-worker-1"],
        );
        let stopped = json!({"job": "train", "rank": 1, "attempt": 1, "state": "stopped"});
        let (_, answer) = poll(&h.router, "tok-train-worker-1", stopped).await;
        assert_eq!(
            answer,
            json!({"action": "start", "attempt": 2, "env": {"TRAINYARD_ATTEMPT": "2"}})
        );
        let line = "trainyard_operator_supervisor_polls_total{outcome=\"accepted\"} 4";
        assert!(h.server.metrics.render().lines().any(|l| l == line));
        // A standby says it still warms; without the field, it does not.
        let warming = |on: Option<bool>| {
            let mut body = json!({"job": "train", "rank": 1, "attempt": 1, "state": "stopped"});
            if let Some(on) = on {
                body["warming"] = json!(on);
            }
            body
        };
        for (said, seen) in [(Some(true), true), (None, false), (Some(false), false)] {
            poll(&h.router, "tok-train-worker-1", warming(said)).await;
            let board = store.snapshot("ml", "train", "uid-job-train");
            assert_eq!(board[0].warming, seen, "{said:?}");
        }
    }

    /// A directive that says how long to hold puts `holdSeconds` in every answer of its job.
    #[tokio::test]
    async fn every_answer_carries_the_hold_the_directive_tells() {
        let h = harness();
        h.server.store.supervisors.publish(
            "ml",
            "train",
            "uid-job-train",
            Some(Directive {
                attempt: 2,
                hold_seconds: 110,
                ..Directive::default()
            }),
            &["uid-train-worker-1"],
        );
        let exited =
            json!({"job": "train", "rank": 1, "attempt": 1, "state": "exited", "exitCode": 1});
        let (_, answer) = poll(&h.router, "tok-train-worker-1", exited).await;
        assert_eq!(answer, json!({"action": "continue", "holdSeconds": 110}));
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_poll_is_answered_as_soon_as_its_jobs_directive_changes() {
        let h = harness();
        let running = json!({"job": "train", "rank": 1, "attempt": 1, "state": "running",
                             "waitSeconds": 60});
        // Nothing changes: held for the server's most, then continue (the clock is paused:
        // it moves on only when every task waits).
        let started = tokio::time::Instant::now();
        let (_, answer) = poll(&h.router, "tok-train-worker-1", running.clone()).await;
        assert_eq!(answer, json!({"action": "continue"}));
        assert_eq!(
            started.elapsed(),
            supervisors::MAX_HOLD,
            "held until the limit"
        );
        // Attempt 2 decided while a poll is held: that poll answers stop at once.
        let held = tokio::spawn({
            let router = h.router.clone();
            async move { poll(&router, "tok-train-worker-1", running).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!held.is_finished(), "held");
        h.server.store.supervisors.publish(
            "ml",
            "train",
            "uid-job-train",
            Some(Directive {
                attempt: 2,
                ..Directive::default()
            }),
            &["uid-train-worker-1"],
        );
        let changed_at = tokio::time::Instant::now();
        let (_, answer) = held.await.expect("the poll");
        assert_eq!(answer, json!({"action": "stop", "attempt": 2}));
        assert_eq!(
            changed_at.elapsed(),
            Duration::ZERO,
            "answered at the change"
        );
        // A bad wait is refused, naming the field.
        let bad = json!({"job": "train", "rank": 1, "attempt": 1, "state": "running",
                         "waitSeconds": -1});
        let (status, answer) = poll(&h.router, "tok-train-worker-1", bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(answer.to_string().contains("waitSeconds"), "{answer}");
    }

    #[tokio::test]
    async fn a_supervisor_may_speak_only_for_its_own_pods_rank_and_in_known_states() {
        let h = harness();
        for (token, body, status) in [
            (
                "tok-train-worker-0",
                json!({"job": "train", "rank": 1, "attempt": 1, "state": "running"}),
                StatusCode::FORBIDDEN,
            ),
            (
                "tok-other-worker-0",
                json!({"job": "train", "rank": 0, "attempt": 1, "state": "running"}),
                StatusCode::FORBIDDEN,
            ),
            (
                "tok-train-worker-0",
                json!({"job": "train", "rank": 0, "attempt": 1, "state": "exited"}),
                StatusCode::BAD_REQUEST,
            ),
            (
                "tok-train-worker-0",
                json!({"job": "train", "rank": 0, "attempt": 1, "state": "exited", "exitCode": 0}),
                StatusCode::BAD_REQUEST,
            ),
            (
                "tok-train-worker-0",
                json!({"job": "train", "rank": 0, "attempt": 1, "state": "sleeping"}),
                StatusCode::BAD_REQUEST,
            ),
            (
                "tok-train-worker-0",
                json!({"job": "train", "rank": 0, "attempt": 1, "state": "exited", "exitCode": 1,
                       "exitedSecondsAgo": -1}),
                StatusCode::BAD_REQUEST,
            ),
            (
                "bad",
                json!({"job": "train", "rank": 0, "attempt": 1, "state": "running"}),
                StatusCode::UNAUTHORIZED,
            ),
        ] {
            let (got, _) = poll(&h.router, token, body.clone()).await;
            assert_eq!(got, status, "{token} {body}");
        }
        assert!(h.server.store.supervisors.is_empty());
        // A kept pod's label moves on while its supervisor reports the attempt it ran: any
        // attempt is its own.
        let (got, _) = poll(
            &h.router,
            "tok-train-worker-0",
            json!({"job": "train", "rank": 0, "attempt": 0, "state": "exited", "exitCode": 1}),
        )
        .await;
        assert_eq!(got, StatusCode::OK);
    }

    #[tokio::test]
    async fn a_token_of_another_jobs_pod_is_forbidden() {
        let h = harness();
        let (status, answer) = post(&h.router, "tok-other-worker-0", good(0, 1)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(
            answer,
            json!({"error": "pod ml/other-worker-0 is a worker of job other, not train"})
        );
        assert!(counted(&h.server, "forbidden"));
        assert!(h.server.store.is_empty());
    }

    #[tokio::test]
    async fn a_token_of_a_pod_that_is_no_worker_is_forbidden_as_unknown_job() {
        let h = harness();
        let (status, _) = post(&h.router, "tok-some-web-server", good(0, 1)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(counted(&h.server, "unknown_job"));
        assert!(h.server.store.is_empty());
    }

    #[tokio::test]
    async fn a_rank_other_than_the_pods_own_is_forbidden() {
        let h = harness();
        for rank in [1, 2, 7] {
            let (status, _) = post(&h.router, "tok-train-worker-0", good(rank, 1)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "rank {rank}");
        }
        assert!(h.server.store.is_empty());
    }

    #[tokio::test]
    async fn an_attempt_other_than_the_pods_own_is_forbidden() {
        let h = harness();
        for attempt in [0, 2] {
            let body = json!({"job": "train", "rank": 0, "attempt": attempt, "step": 1});
            let (status, answer) = post(&h.router, "tok-train-worker-0", body).await;
            assert_eq!(status, StatusCode::FORBIDDEN);
            assert!(
                answer["error"].as_str().expect("error").contains("attempt"),
                "{answer}"
            );
        }
        assert!(h.server.store.is_empty());
    }

    #[tokio::test]
    async fn a_replaced_pods_token_is_forbidden() {
        let reviewer = Arc::new(FakeReviewer::default());
        let mut pods = FakePods::of(&[("train", 1)]);
        pods.0.get_mut("train-worker-0").expect("pod").uid = "uid-of-the-new-pod".to_owned();
        let h = harness_with(reviewer, pods, MAX_CONCURRENT_REVIEWS);
        assert_eq!(
            post(&h.router, "tok-train-worker-0", good(0, 1)).await.0,
            StatusCode::FORBIDDEN
        );
    }

    #[tokio::test]
    async fn a_body_over_4_kib_is_too_large() {
        let h = harness();
        let mut body = good(0, 1);
        body["padding"] = json!("x".repeat(MAX_BODY_BYTES));
        let (status, answer) = post(&h.router, "tok-train-worker-0", body).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(answer["error"].is_string());
        // Without a length up front (chunked) as well.
        let chunks = futures::stream::iter(
            (0..5).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 1024]))),
        );
        let req = request(Some("tok-train-worker-0"), Body::from_stream(chunks));
        assert_eq!(send(&h.router, req).await.0, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(counted_n(&h.server, "too_large", 2));
        assert!(h.server.store.is_empty());
    }

    fn counted_n(server: &ProgressServer, outcome: &str, n: u32) -> bool {
        let line =
            format!("trainyard_operator_progress_reports_total{{outcome=\"{outcome}\"}} {n}");
        server.metrics.render().lines().any(|l| l == line)
    }

    #[tokio::test]
    async fn bad_json_and_out_of_range_values_are_invalid() {
        let h = harness();
        let cases: Vec<(String, &str)> = vec![
            ("{".to_owned(), "invalid report"),
            (json!({"job": "train", "rank": 0, "attempt": 1}).to_string(), "step"),
            (
                json!({"job": "train", "rank": -1, "attempt": 1, "step": 1}).to_string(),
                "invalid report",
            ),
            (
                json!({"job": "train", "rank": 0, "attempt": 1, "step": MAX_STEP + 1}).to_string(),
                "step",
            ),
            (
                json!({"job": "train", "rank": 0, "attempt": 1, "step": 1, "checkpointStep": u64::MAX}).to_string(),
                "checkpointStep",
            ),
            (
                json!({"job": "train", "rank": 0, "attempt": 1, "step": 1, "resumedFrom": MAX_STEP + 1}).to_string(),
                "resumedFrom",
            ),
            (
                r#"{"job": "train", "rank": 0, "attempt": 1, "step": 1, "loss": NaN}"#.to_owned(),
                "invalid report",
            ),
            (
                r#"{"job": "train", "rank": 0, "attempt": 1, "step": 1, "loss": 1e999}"#.to_owned(),
                "invalid report",
            ),
            (
                json!({"job": "", "rank": 0, "attempt": 1, "step": 1}).to_string(),
                "job",
            ),
        ];
        for (body, names) in &cases {
            let (status, answer) =
                send(&h.router, request(Some("tok-train-worker-0"), body.clone())).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            let error = answer["error"].as_str().expect("error");
            assert!(error.contains(names), "{body}: {error}");
        }
        let mut text = request(Some("tok-train-worker-0"), good(0, 1).to_string());
        text.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert_eq!(
            send(&h.router, text).await.0,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        assert!(counted_n(&h.server, "invalid", cases.len() as u32 + 1));
        assert!(h.server.store.is_empty());
    }

    #[test]
    fn an_overflowing_loss_is_invalid() {
        for loss in ["-1e309", "1e400"] {
            let body = format!(r#"{{"job":"j","rank":0,"attempt":0,"step":1,"loss":{loss}}}"#);
            assert!(ReportBody::parse(body.as_bytes()).is_err(), "{loss}");
        }
    }

    #[tokio::test]
    async fn an_unknown_path_is_404_and_another_method_405() {
        let h = harness();
        let mut req = request(Some("tok-train-worker-0"), good(0, 1).to_string());
        *req.uri_mut() = "/v1/other".parse().expect("uri");
        let (status, answer) = send(&h.router, req).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(answer["error"].is_string());
        let mut req = request(Some("tok-train-worker-0"), "");
        *req.method_mut() = axum::http::Method::GET;
        let response = h.router.clone().oneshot(req).await.expect("infallible");
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers()[header::ALLOW], "POST");
    }

    #[tokio::test]
    async fn reports_beyond_the_concurrency_cap_are_overloaded() {
        let gate = Arc::new(Semaphore::new(0));
        let reviewer = Arc::new(FakeReviewer {
            gate: Some(gate.clone()),
            waiting: Arc::new(AtomicUsize::new(0)),
        });
        let waiting = reviewer.waiting.clone();
        let h = harness_with(reviewer, FakePods::of(&[("train", 4)]), 3);
        let held: Vec<_> = (0..3)
            .map(|rank| {
                let router = h.router.clone();
                tokio::spawn(async move {
                    post(&router, &format!("tok-train-worker-{rank}"), good(rank, 1)).await
                })
            })
            .collect();
        while waiting.load(Ordering::SeqCst) < 3 {
            tokio::task::yield_now().await;
        }
        let (status, answer) = post(&h.router, "tok-train-worker-3", good(3, 1)).await;
        assert_eq!(
            (status, answer),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "overloaded"})
            )
        );
        assert!(counted(&h.server, "overloaded"));

        gate.add_permits(3);
        for task in held {
            assert_eq!(task.await.expect("join").0, StatusCode::OK);
        }
        assert_eq!(
            post(&h.router, "tok-train-worker-3", good(3, 1)).await.0,
            StatusCode::OK,
            "the permits came back"
        );
    }

    #[tokio::test]
    async fn bodies_that_never_come_hold_no_permit() {
        let h = harness_with(
            Arc::new(FakeReviewer::default()),
            FakePods::of(&[("train", 1)]),
            4,
        );
        let never =
            || Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>());
        // Twice as many as there are permits: without a token, and with a forged one.
        let tokenless: Vec<_> = (0..8)
            .map(|_| tokio::spawn(send_owned(h.router.clone(), request(None, never()))))
            .collect();
        let forged: Vec<_> = (0..8)
            .map(|i| {
                let req = request(Some(&format!("forged-{i}")), never());
                tokio::spawn(send_owned(h.router.clone(), req))
            })
            .collect();
        for task in tokenless {
            let (status, _) = task.await.expect("join");
            assert_eq!(status, StatusCode::UNAUTHORIZED, "refused before its body");
        }
        // The forged ones wait for their bodies, holding nothing the ranks need.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(forged.iter().all(|t| !t.is_finished()));
        for rank in 0..3 {
            assert_eq!(
                post(&h.router, "tok-train-worker-0", good(0, rank)).await.0,
                StatusCode::OK
            );
        }
        for task in forged {
            task.abort();
        }
    }

    async fn send_owned(router: Router, request: Request) -> (StatusCode, Value) {
        send(&router, request).await
    }

    #[tokio::test]
    async fn a_forged_token_sent_again_costs_no_second_review() {
        let (client, reviews, _) = reviewing_client();
        let h = harness_with(
            Arc::new(KubeTokenReviewer::new(client, "trainyard-progress")),
            FakePods::of(&[("train", 1)]),
            MAX_CONCURRENT_REVIEWS,
        );
        let forged = jwt("forged");
        for _ in 0..50 {
            assert_eq!(
                post(&h.router, &forged, good(0, 1)).await.0,
                StatusCode::UNAUTHORIZED
            );
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 1);
        assert!(counted_n(&h.server, "unauthenticated", 50));
    }

    /// One source holds at most [`MAX_REVIEWS_PER_SOURCE`] reviews: its next report that needs
    /// one is 429 at once, without a review or the channel's trouble, while another source is
    /// still reviewed.
    #[tokio::test]
    async fn one_source_holds_at_most_its_share_of_the_token_reviews() {
        let gate = Arc::new(Semaphore::new(0));
        let reviewer = FakeReviewer {
            gate: Some(gate.clone()),
            waiting: Arc::default(),
        };
        let waiting = reviewer.waiting.clone();
        let h = harness_with(
            Arc::new(reviewer),
            FakePods::of(&[("train", 8)]),
            MAX_CONCURRENT_REVIEWS,
        );
        let from = |ip: [u8; 4], rank: u32| {
            let mut req = request(
                Some(&format!("tok-train-worker-{rank}")),
                good(rank, 1).to_string(),
            );
            let peer = SocketAddr::from((ip, 40000));
            req.extensions_mut().insert(ConnectInfo(peer));
            tokio::spawn(send_owned(h.router.clone(), req))
        };
        let held: Vec<_> = (0..4).map(|rank| from([10, 0, 0, 1], rank)).collect();
        while waiting.load(Ordering::SeqCst) < 4 {
            tokio::task::yield_now().await;
        }
        let (status, answer) = from([10, 0, 0, 1], 4).await.expect("join");
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
        assert!(counted(&h.server, "throttled"));
        assert_eq!(
            h.server.store.last_refusal(),
            None,
            "not the channel's trouble"
        );
        let other = from([10, 0, 0, 2], 5);
        while waiting.load(Ordering::SeqCst) < 5 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(8);
        for task in held.into_iter().chain([other]) {
            assert_eq!(task.await.expect("join").0, StatusCode::OK);
        }
        // The source's slots came back: it is reviewed again.
        assert_eq!(
            from([10, 0, 0, 1], 6).await.expect("join").0,
            StatusCode::OK
        );
    }

    /// What cannot be a projected token for the operator's audience (garbage, another
    /// audience's token) is refused from its shape: no review, no permit, no trouble of the
    /// channel.
    #[tokio::test]
    async fn a_garbage_token_makes_no_token_review() {
        let (client, reviews, _) = reviewing_client();
        let h = harness_with(
            Arc::new(KubeTokenReviewer::new(client, "trainyard-progress")),
            FakePods::of(&[("train", 1)]),
            0,
        );
        for i in 0..100 {
            let (status, answer) = post(&h.router, &format!("garbage-{i}"), good(0, 1)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            assert!(
                answer["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("not a JWT")),
                "{answer}"
            );
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 0, "no TokenReview was made");
        assert_eq!(h.server.store.last_refusal(), None);
        assert!(counted_n(&h.server, "unauthenticated", 100));
    }

    #[tokio::test]
    async fn a_cached_token_is_answered_without_a_permit() {
        let (client, reviews, _) = reviewing_client();
        let reviewer = Arc::new(KubeTokenReviewer::new(client, "trainyard-progress"));
        let (known, forged) = (jwt("good:ml:train-worker-0"), jwt("forged"));
        reviewer.review(known.clone()).await.expect("accepted");
        let _ = reviewer.review(forged.clone()).await;
        // No permit at all: only what the reviewer already knows can be answered.
        let h = harness_with(reviewer, FakePods::of(&[("train", 1)]), 0);
        assert_eq!(post(&h.router, &known, good(0, 1)).await.0, StatusCode::OK);
        assert_eq!(
            post(&h.router, &forged, good(0, 1)).await.0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            post(&h.router, &jwt("good:ml:train-worker-1"), good(1, 1)).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "overloaded"})
            )
        );
        assert_eq!(
            reviews.load(Ordering::SeqCst),
            2,
            "no review without a permit"
        );
    }

    #[tokio::test]
    async fn a_token_review_that_cannot_be_made_is_503() {
        struct Down;
        impl TokenReviewer for Down {
            fn review(&self, _: String) -> BoxFuture<'static, Result<Identity, AuthError>> {
                futures::future::ready(Err(AuthError::Unavailable("connection refused".into())))
                    .boxed()
            }
        }
        let h = harness_with(Arc::new(Down), FakePods::of(&[("train", 1)]), 4);
        assert_eq!(h.server.store.last_refusal(), None);
        let before = jiff::Timestamp::now();
        assert_eq!(
            post(&h.router, "tok-train-worker-0", good(0, 1)).await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        // The store remembers that the endpoint refused a report: the rank is not quiet.
        assert!(h.server.store.last_refusal().is_some_and(|at| at >= before));
    }

    #[tokio::test]
    async fn a_thousand_ranks_of_two_jobs_keep_two_entries_and_a_bounded_token_cache() {
        const RANKS: u32 = 1_000;
        let pods = FakePods::of(&[("a", RANKS), ("b", RANKS)]);
        let (client, reviews, _) = reviewing_client();
        let reviewer = Arc::new(KubeTokenReviewer::new(client, "trainyard-progress"));
        let h = harness_with(reviewer.clone(), pods, MAX_CONCURRENT_REVIEWS);
        for round in 0..2u64 {
            for job in ["a", "b"] {
                for rank in 0..RANKS {
                    let token = jwt(&format!("good:ml:{job}-worker-{rank}"));
                    let body = json!({"job": job, "rank": rank, "attempt": 1, "step": round});
                    assert_eq!(post(&h.router, &token, body).await.0, StatusCode::OK);
                }
            }
        }
        assert_eq!(h.server.store.len(), 2);
        assert_eq!(
            h.server.store.snapshot("ml", "a").expect("a").ranks.len(),
            RANKS as usize
        );
        assert_eq!(reviewer.cached(), 2 * RANKS as usize);
        assert_eq!(
            reviews.load(Ordering::SeqCst),
            2 * RANKS as usize,
            "the second round was served from the cache"
        );

        // A cache smaller than the ranks stays at its bound.
        let (client, _, _) = reviewing_client();
        let small = Arc::new(KubeTokenReviewer::with_cache(
            client,
            "trainyard-progress",
            300,
            Duration::from_secs(300),
        ));
        let h = harness_with(small.clone(), FakePods::of(&[("a", RANKS)]), 8);
        for rank in 0..RANKS {
            let token = jwt(&format!("good:ml:a-worker-{rank}"));
            let body = json!({"job": "a", "rank": rank, "attempt": 1, "step": 1});
            assert_eq!(post(&h.router, &token, body).await.0, StatusCode::OK);
            assert!(small.cached() <= 300);
        }
        assert_eq!(h.server.store.len(), 1);
    }

    use crate::model::seal::SEAL_ANNOTATION;

    /// The operator's caches holding the job `ml/train` (uid `uid-1`) and `pods`.
    fn worker_pods(pods: Vec<CachedPod>) -> WorkerPods {
        use kube::runtime::{reflector, watcher};

        let (pod_store, mut pod_writer) = reflector::store::<CachedPod>();
        for p in pods {
            pod_writer.apply_watcher_event(&watcher::Event::Apply(p));
        }
        let (job_store, mut job_writer) = reflector::store::<DeserializeGuard<TrainingJob>>();
        let job = DeserializeGuard(Ok(crate::fixtures::job_yaml("workers: 2")));
        job_writer.apply_watcher_event(&watcher::Event::Apply(job));
        WorkerPods {
            pods: pod_store,
            jobs: job_store,
            seal: test_seal(),
        }
    }

    fn test_seal() -> SealKey {
        SealKey::new(b"test key", None)
    }

    /// A pod of `ml` named `name`, sealed as the operator would for what its labels say.
    fn labelled_pod(name: &str, labels: Value, owner: Value) -> CachedPod {
        let rank = labels[LABEL_RANK].as_str().and_then(|r| r.parse().ok());
        let attempt = labels[LABEL_ATTEMPT].as_str().and_then(|a| a.parse().ok());
        let seal = rank.zip(attempt).map(|(rank, attempt)| {
            test_seal().seal(&seal::Worker {
                namespace: "ml",
                pod: name,
                job_uid: "uid-1",
                rank,
                attempt,
            })
        });
        forged_pod(name, labels, owner, seal)
    }

    fn forged_pod(name: &str, labels: Value, owner: Value, seal: Option<String>) -> CachedPod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                         "labels": labels, "ownerReferences": owner,
                         "annotations": seal.map(|s| json!({SEAL_ANNOTATION: s}))},
        }))
        .expect("pod")
    }

    /// A namespace user copies a worker, seal and all, under another name, or relabels a copy
    /// to a later attempt: neither is a worker. The real pod is.
    #[test]
    fn a_copy_of_a_worker_under_another_name_or_attempt_is_no_worker() {
        let labels = json!({LABEL_JOB: "train", LABEL_RANK: "0", LABEL_ATTEMPT: "1"});
        let real = labelled_pod(
            "train-worker-0",
            labels.clone(),
            owner("TrainingJob", "train", "uid-1"),
        );
        let seal = real
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SEAL_ANNOTATION))
            .cloned();
        let huge = json!({LABEL_JOB: "train", LABEL_RANK: "0", LABEL_ATTEMPT: "4294967295"});
        let pods = worker_pods(vec![
            real,
            forged_pod(
                "train-worker-0-copy",
                labels.clone(),
                owner("TrainingJob", "train", "uid-1"),
                seal.clone(),
            ),
            forged_pod(
                "copy-huge",
                huge,
                owner("TrainingJob", "train", "uid-1"),
                seal,
            ),
            forged_pod(
                "unsealed",
                labels,
                owner("TrainingJob", "train", "uid-1"),
                None,
            ),
        ]);
        assert!(pods.worker("ml", "train-worker-0").is_some());
        for name in ["train-worker-0-copy", "copy-huge", "unsealed"] {
            assert_eq!(pods.worker("ml", name), None, "{name}");
        }
    }

    fn owner(kind: &str, name: &str, uid: &str) -> Value {
        json!([{"apiVersion": "trainyard.dev/v1alpha1", "kind": kind, "name": name,
                "uid": uid, "controller": true}])
    }

    #[test]
    fn a_worker_is_a_pod_the_job_controls_with_rank_and_attempt_labels() {
        let labels = json!({LABEL_JOB: "train", LABEL_RANK: "1", LABEL_ATTEMPT: "3"});
        let pods = worker_pods(vec![
            labelled_pod(
                "train-worker-1",
                labels.clone(),
                owner("TrainingJob", "train", "uid-1"),
            ),
            labelled_pod("labelled-only", labels.clone(), json!([])),
            labelled_pod(
                "owned-by-another",
                labels.clone(),
                owner("TrainingJob", "other", "uid-1"),
            ),
            labelled_pod("a-job-pod", labels.clone(), owner("Job", "train", "uid-1")),
            labelled_pod(
                "no-rank",
                json!({LABEL_JOB: "train", LABEL_ATTEMPT: "3"}),
                owner("TrainingJob", "train", "uid-1"),
            ),
        ]);
        assert_eq!(
            pods.worker("ml", "train-worker-1"),
            Some(WorkerIdentity {
                uid: "uid-train-worker-1".to_owned(),
                job: "train".to_owned(),
                job_uid: "uid-1".to_owned(),
                rank: 1,
                attempt: 3,
            })
        );
        for name in [
            "labelled-only",
            "owned-by-another",
            "a-job-pod",
            "no-rank",
            "absent",
        ] {
            assert_eq!(pods.worker("ml", name), None, "{name}");
        }
        assert_eq!(pods.worker("other-ns", "train-worker-1"), None);
    }

    #[tokio::test]
    async fn a_pod_whose_owner_reference_names_the_job_under_another_uid_is_no_worker() {
        let labels = json!({LABEL_JOB: "train", LABEL_RANK: "0", LABEL_ATTEMPT: "1"});
        let pods = worker_pods(vec![
            // Named, labelled and owned by name like a worker; the uid is made up, or that of
            // a deleted job of the same name.
            labelled_pod(
                "train-worker-0",
                labels.clone(),
                owner("TrainingJob", "train", "forged-uid"),
            ),
            labelled_pod(
                "lookalike",
                labels.clone(),
                owner("TrainingJob", "train", ""),
            ),
        ]);
        assert_eq!(pods.worker("ml", "train-worker-0"), None);
        assert_eq!(pods.worker("ml", "lookalike"), None);
        // Nor is a pod of a job the cache does not hold.
        let orphan = worker_pods(vec![labelled_pod(
            "gone-worker-0",
            json!({LABEL_JOB: "gone", LABEL_RANK: "0", LABEL_ATTEMPT: "1"}),
            owner("TrainingJob", "gone", "uid-1"),
        )]);
        assert_eq!(orphan.worker("ml", "gone-worker-0"), None);

        // Through the endpoint: the report is refused, and the job's progress stays its own.
        let h = harness_with(
            Arc::new(FakeReviewer::default()),
            FakePods(HashMap::new()),
            MAX_CONCURRENT_REVIEWS,
        );
        let server = Arc::new(ProgressServer {
            store: h.server.store.clone(),
            reviewer: h.server.reviewer.clone(),
            pods: Arc::new(pods),
            metrics: h.server.metrics.clone(),
            wake: h.server.wake.clone(),
        });
        let (status, _) = post(&router(server), "tok-train-worker-0", good(0, 1)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(h.server.store.is_empty());
    }

    #[tokio::test]
    async fn serve_answers_reports_over_tcp_and_stops_on_shutdown() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let h = harness();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr, serving) = serve(
            "127.0.0.1:0".parse().expect("addr"),
            h.server.clone(),
            async {
                let _ = rx.await;
            },
        )
        .await
        .expect("bind");
        let serving = tokio::spawn(serving);
        let body = good(0, 7).to_string();
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(
            format!(
                "POST {PROGRESS_PATH} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer tok-train-worker-0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.ends_with(r#"{"checkpoint":false}"#), "{out}");
        let _ = tx.send(());
        serving.await.expect("join").expect("stops cleanly");
    }
}
