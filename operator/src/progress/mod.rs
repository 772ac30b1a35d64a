//! The progress channel: trainers report their step, loss and checkpoints to the operator over
//! HTTP, and the reconcile reads what they reported from an in-memory store.
//!
//! What it is for: the plan can tell a hung gang from a working one (a step that stops
//! advancing), count the steps a preemption lost (the step reported before it minus the step
//! the next attempt resumed from), and, when a worker's node gets a termination notice, ask the
//! trainers for a checkpoint before the node goes and learn when it is saved.
//!
//! # The protocol
//!
//! The trainer finds the endpoint in `TRAINYARD_PROGRESS_URL` and its token in the file
//! `TRAINYARD_PROGRESS_TOKEN_FILE` (re-read on every report: the kubelet rotates it), and sends
//!
//! ```text
//! POST /v1/progress
//! Authorization: Bearer <token>
//! Content-Type: application/json
//!
//! {"job": "train", "rank": 0, "attempt": 2, "step": 1200, "loss": 1.73,
//!  "checkpointStep": 1000, "resumedFrom": 800}
//! ```
//!
//! `loss` (finite), `checkpointStep` (the latest checkpoint this rank knows is saved) and
//! `resumedFrom` (the step this attempt loaded from `RESUME_FROM`) are optional; the steps are
//! at most [`crate::model::crd::MAX_STEP`]; unknown fields are ignored. The answer is
//! `200 {"checkpoint": bool}`: `true` asks the trainer to save a checkpoint at the next step
//! boundary and report its `checkpointStep`. Errors answer `{"error": "..."}` with 400 (bad
//! JSON or values), 401 (no, malformed or invalid token, or one for another audience), 403 (the
//! token's pod is not that job's worker of that rank and attempt), 404, 405, 408 (a body that
//! does not arrive), 413 (a body over 4 KiB), 415 (not JSON) or 503 (overloaded, or the token
//! cannot be reviewed now). Every answer is counted in
//! `trainyard_operator_progress_reports_total{outcome}`.
//!
//! # Security model
//!
//! The token is the pod's projected service-account token for the operator's audience. The
//! operator reviews it with a `TokenReview` ([`auth::KubeTokenReviewer`]) that names that
//! audience and accepts it only when the answer lists that audience back, so a token minted
//! for anything else (the API server's default audience included) is refused; an answer that
//! lists no audience is refused too unless the operator is told its API server's token
//! authenticator does not report them ([`auth::AudienceCheck`]). It accepts only tokens bound
//! to a pod: the review names the pod and its uid. The pod must then be in the operator's pod
//! cache with that uid, be controlled (owner reference, by uid) by the `TrainingJob` of that
//! name in the operator's job cache, which its `trainyard.dev/job` label names, and carry the
//! rank and attempt labels the report claims ([`server::WorkerPods`]). So a pod can report only
//! for its own job, rank and attempt, in its own namespace; a pod that only looks like a
//! worker (the labels and an owner reference with the job's name, which anyone who may create
//! pods can write) cannot; and a token that leaks out of a pod stops working once the pod is
//! gone.
//!
//! # Bounds
//!
//! The listener bounds connections, how long a request head may take and how large it may be
//! ([`trainyard_listen`]). A report takes one of [`server::MAX_CONCURRENT_REVIEWS`] permits only
//! for a token review the reviewer cannot answer from its caches, after its token is well
//! formed and its body has arrived; without a permit it is answered 503 at once. So neither a
//! missing token, nor a body that never comes, nor a flood of one forged token holds a permit,
//! and a rank whose token is cached is never refused for load. The store gets an entry only
//! from a report that passed every check (at most one per job with worker pods, ranks at most
//! the job's workers). Reviewed tokens are cached by their SHA-256: accepted ones for five
//! minutes, at most 10,000 of them (1,000 ranks reporting every 5 s cost no TokenReviews in
//! the steady state), rejected ones for ten seconds, at most 4,096.
//!
//! Modules: [`store`] (pure, what the reconcile reads), [`auth`] (token reviews and their
//! cache), [`server`] (the HTTP endpoint and the pod check).

pub mod auth;
pub mod server;
pub mod store;
pub mod supervisors;

pub use auth::{AudienceCheck, AuthError, Identity, TokenReviewer};
pub use server::{PodLookup, ProgressServer, WorkerIdentity, serve};
pub use store::ProgressStore;
