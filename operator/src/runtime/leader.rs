//! Leader election on a coordination.k8s.io/v1 Lease (kube-lease-manager), so that two
//! replicas never reconcile at the same time.
//!
//! The lease manager keeps saying "leader" while it cannot reach the API server: it only
//! learns of a loss from a read that succeeds. A standby takes a Lease whose renewal is
//! `lease_duration_seconds` old, so a leader cut off for that long would lead beside it once
//! the API server answers again (found by the chaos run: two replicas restarted the same
//! job). So a leader also watches its own renewals and steps down when the Lease has not
//! been renewed for its renew deadline ([`renew_deadline`]), before any standby may take it,
//! as client-go's `RenewDeadline` does.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::Error;

/// Where the Lease lives and who we are.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Lease name.
    pub lease_name: String,
    /// Lease namespace.
    pub lease_namespace: String,
    /// This replica's identity (pod name or hostname).
    pub identity: String,
    /// Seconds a holder keeps the Lease without renewing it.
    pub lease_duration_seconds: u64,
    /// Seconds before expiry at which the holder renews.
    pub renew_grace_seconds: u64,
}

/// How often a leader reads its Lease to see its own renewals.
const RENEWAL_CHECK: Duration = Duration::from_secs(1);

/// How old the Lease's last renewal may grow before its holder stops leading: five sixths of
/// the Lease's duration (at least a second short of it), so that a leader cut off from the
/// API server has stopped before a standby may take the Lease, and well after the holder
/// renews (`renew_grace_seconds` before expiry: half the duration, as `main` sets it).
pub fn renew_deadline(election: &LeaderElection) -> SignedDuration {
    let duration = SignedDuration::from_secs(
        i64::try_from(election.lease_duration_seconds).unwrap_or(i64::MAX),
    );
    duration - (duration / 6).max(SignedDuration::from_secs(1))
}

/// Whether a Lease last seen renewed at `renewed` is overdue at `now`.
fn overdue(renewed: Timestamp, now: Timestamp, deadline: SignedDuration) -> bool {
    now.duration_since(renewed) > deadline
}

/// A held Lease. Dropping it (or calling [`Leadership::release`]) gives it back.
pub struct Leadership {
    /// The Lease, read to see its renewals.
    lease: Api<Lease>,
    election: LeaderElection,
    rx: watch::Receiver<bool>,
    task:
        JoinHandle<Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>>,
}

impl Leadership {
    /// Waits for the Lease and returns once this replica holds it. An API server that cannot
    /// be reached (or refuses) is tried again: a standby, or a leader that just stepped down,
    /// waits out an outage of the control plane instead of exiting.
    pub async fn acquire(client: Client, election: &LeaderElection) -> Result<Self, Error> {
        let lease = Api::namespaced(client.clone(), &election.lease_namespace);
        let manager = build_manager(client, election).await;
        let (mut rx, task) = manager.watch().await;
        tracing::info!(lease = %election.lease_name, identity = %election.identity, "waiting for the leader Lease");
        while !*rx.borrow_and_update() {
            rx.changed()
                .await
                .map_err(|_| Error::LeaderElection("the lease manager stopped".to_owned()))?;
        }
        tracing::info!(lease = %election.lease_name, identity = %election.identity, "acquired the leader Lease");
        Ok(Self {
            lease,
            election: election.clone(),
            rx,
            task,
        })
    }

    /// Completes when this replica no longer holds the Lease: the lease manager says so, or
    /// the Lease has not been renewed within its [`renew_deadline`].
    pub async fn lost(&mut self) {
        let rx = &mut self.rx;
        let held = async move {
            while *rx.borrow_and_update() {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            () = held => {}
            age = renewal_overdue(&self.lease, &self.election) => tracing::warn!(
                lease = %self.election.lease_name,
                not_renewed_for_s = age.as_secs(),
                "the leader Lease was not renewed within its renew deadline: stepping down"
            ),
        }
    }

    /// Gives the Lease back so that a standby takes over at once.
    pub async fn release(self) {
        let Self { rx, task, .. } = self;
        drop(rx);
        match task.await {
            Ok(Ok(_)) => tracing::info!("released the leader Lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the leader Lease"),
            Err(e) => tracing::warn!(error = %e, "lease manager task"),
        }
    }
}

/// The lease manager of `election`, once the API server answers its first read (tried again
/// with a growing pause, up to [`MAX_BUILD_PAUSE`]).
async fn build_manager(
    client: Client,
    election: &LeaderElection,
) -> kube_lease_manager::LeaseManager {
    let mut pause = RENEWAL_CHECK;
    loop {
        // The lease manager detects competing replicas through server-side apply conflicts,
        // so it keeps its own per-identity field manager.
        let built = LeaseManagerBuilder::new(client.clone(), &election.lease_name)
            .with_namespace(&election.lease_namespace)
            .with_identity(&election.identity)
            .with_duration(election.lease_duration_seconds)
            .with_grace(election.renew_grace_seconds)
            .build()
            .await;
        match built {
            Ok(manager) => return manager,
            Err(e) => tracing::warn!(
                lease = %election.lease_name,
                namespace = %election.lease_namespace,
                error = %e,
                retry_in = ?pause,
                "cannot read the leader Lease"
            ),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_BUILD_PAUSE);
    }
}

/// The longest pause between two tries to read the Lease.
const MAX_BUILD_PAUSE: Duration = Duration::from_secs(10);

/// Completes, with the renewal's age, once the Lease's last renewal seen is older than the
/// [`renew_deadline`]. Reads the Lease every [`RENEWAL_CHECK`]; a read that fails (the API
/// server away) leaves the last renewal seen, which then ages on this replica's clock, the
/// clock the lease manager stamps its renewals with.
///
/// A read may take as long as the deadline leaves (found with 1 s of API latency each way: a
/// read bounded to one second never came back, so a leader whose renewals all went through
/// stepped down every 13 s and the replicas took turns).
async fn renewal_overdue(lease: &Api<Lease>, election: &LeaderElection) -> SignedDuration {
    let deadline = renew_deadline(election);
    // Just acquired: renewed no earlier than now minus one check.
    let mut renewed =
        Timestamp::now() - SignedDuration::try_from(RENEWAL_CHECK).unwrap_or_default();
    let mut tick = tokio::time::interval(RENEWAL_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Timestamp::now();
        if overdue(renewed, now, deadline) {
            return now.duration_since(renewed);
        }
        let left = deadline - now.duration_since(renewed);
        let wait = Duration::try_from(left).unwrap_or(RENEWAL_CHECK);
        let read = tokio::time::timeout(wait, lease.get_opt(&election.lease_name)).await;
        if let Ok(Ok(Some(l))) = read {
            let spec = l.spec.unwrap_or_default();
            if spec.holder_identity.as_deref() == Some(election.identity.as_str())
                && let Some(t) = spec.renew_time
            {
                renewed = renewed.max(t.0);
            }
        }
        let now = Timestamp::now();
        if overdue(renewed, now, deadline) {
            return now.duration_since(renewed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn election(duration: u64, grace: u64) -> LeaderElection {
        LeaderElection {
            lease_name: "l".to_owned(),
            lease_namespace: "ns".to_owned(),
            identity: "me".to_owned(),
            lease_duration_seconds: duration,
            renew_grace_seconds: grace,
        }
    }

    #[test]
    fn a_leader_stops_after_it_would_have_renewed_and_before_a_standby_may_take_over() {
        // The defaults: 15 s, renewed 7 s before expiry (at 8 s).
        let deadline = renew_deadline(&election(15, 7));
        assert_eq!(deadline, SignedDuration::from_millis(12_500));
        let renewed = Timestamp::from_second(1_700_000_000).expect("time");
        let at = |s: i64| renewed + SignedDuration::from_secs(s);
        // A renewal due at 8 s that is four seconds late is no loss.
        assert!(!overdue(renewed, at(12), deadline));
        // Past the deadline, still before the standby may take it at 15 s: stop.
        assert!(overdue(renewed, at(13), deadline));
        assert!(deadline < SignedDuration::from_secs(15));
        // The component tests' replicas: 6 s, renewed at 3 s, a second short of expiry.
        assert_eq!(
            renew_deadline(&election(6, 3)),
            SignedDuration::from_secs(5)
        );
    }

    /// Found with 1 s of API latency each way: every read of the Lease took longer than the
    /// one second the check gave it, so a leader whose renewals went through stepped down.
    #[tokio::test]
    async fn a_slow_api_server_does_not_make_a_renewing_leader_step_down() {
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| async move {
            // Every read answers after 1.5 s with the Lease renewed as it is read.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let renewed = Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
                .to_string();
            let lease = serde_json::json!({"apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease", "metadata": {"name": "l", "namespace": "ns"},
                "spec": {"holderIdentity": "me", "renewTime": renewed}});
            Ok::<_, kube::Error>(crate::fixtures::json_response(200, &lease))
        });
        let client = Client::new(service, "default");
        let lease: Api<Lease> = Api::namespaced(client, "ns");
        // A 6-s Lease (the component tests'): the deadline is 5 s, longer than a read.
        let el = election(6, 3);
        let stepped_down =
            tokio::time::timeout(Duration::from_secs(8), renewal_overdue(&lease, &el)).await;
        assert!(stepped_down.is_err(), "stepped down: {stepped_down:?}");
    }

    /// Found by the chaos run (seed 1, after the Lease fixes): a leader that stepped down
    /// while the API server restarted exited, because its next campaign could not read the
    /// Lease. The campaign reads it again, with a pause that doubles up to
    /// [`MAX_BUILD_PAUSE`], until the API server answers.
    #[tokio::test(start_paused = true)]
    async fn a_campaign_reads_again_a_lease_it_cannot_read_with_a_growing_pause() {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorder = asked.clone();
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            let asked = recorder.clone();
            async move {
                let n = {
                    let mut asked = asked.lock().expect("log");
                    asked.push(tokio::time::Instant::now());
                    asked.len()
                };
                // The API server is away for the first five reads, then serves the Lease.
                let (code, answer) = if n <= 5 {
                    (
                        503,
                        serde_json::json!({"kind": "Status", "apiVersion": "v1",
                            "status": "Failure", "reason": "ServiceUnavailable", "code": 503}),
                    )
                } else {
                    (
                        200,
                        serde_json::json!({"apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease", "metadata": {"name": "l", "namespace": "ns"},
                            "spec": {}}),
                    )
                };
                Ok::<_, kube::Error>(crate::fixtures::json_response(code, &answer))
            }
        });
        let client = Client::new(service, "default");
        let built = tokio::time::timeout(
            Duration::from_secs(300),
            build_manager(client, &election(15, 5)),
        )
        .await;
        assert!(
            built.is_ok(),
            "the campaign gave up or never read the Lease"
        );
        let asked = asked.lock().expect("log").clone();
        let pauses: Vec<u64> = asked.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 10], "pauses between the reads");
    }
}
