//! Leader election on a coordination.k8s.io/v1 Lease (kube-lease-manager), so that two
//! replicas never reconcile at the same time.

use kube::Client;
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

/// A held Lease. Dropping it (or calling [`Leadership::release`]) gives it back.
pub struct Leadership {
    rx: watch::Receiver<bool>,
    task:
        JoinHandle<Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>>,
}

impl Leadership {
    /// Waits for the Lease and returns once this replica holds it.
    pub async fn acquire(client: Client, election: &LeaderElection) -> Result<Self, Error> {
        // The lease manager detects competing replicas through server-side apply conflicts, so
        // it keeps its own per-identity field manager.
        let manager = LeaseManagerBuilder::new(client, &election.lease_name)
            .with_namespace(&election.lease_namespace)
            .with_identity(&election.identity)
            .with_duration(election.lease_duration_seconds)
            .with_grace(election.renew_grace_seconds)
            .build()
            .await
            .map_err(|e| {
                Error::LeaderElection(format!(
                    "Lease {}/{}: {e}",
                    election.lease_namespace, election.lease_name
                ))
            })?;
        let (mut rx, task) = manager.watch().await;
        tracing::info!(lease = %election.lease_name, identity = %election.identity, "waiting for the leader Lease");
        while !*rx.borrow_and_update() {
            rx.changed()
                .await
                .map_err(|_| Error::LeaderElection("the lease manager stopped".to_owned()))?;
        }
        tracing::info!(lease = %election.lease_name, identity = %election.identity, "acquired the leader Lease");
        Ok(Self { rx, task })
    }

    /// Completes when this replica no longer holds the Lease.
    pub async fn lost(&mut self) {
        while *self.rx.borrow_and_update() {
            if self.rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Gives the Lease back so that a standby takes over at once.
    pub async fn release(self) {
        let Self { rx, task } = self;
        drop(rx);
        match task.await {
            Ok(Ok(_)) => tracing::info!("released the leader Lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the leader Lease"),
            Err(e) => tracing::warn!(error = %e, "lease manager task"),
        }
    }
}
