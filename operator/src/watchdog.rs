//! No reconcile may hang for ever: each runs under a time limit, and says at which stage it
//! is (the stage the round last entered), so that a round that takes long is reported with
//! where it waits, and one past the limit is abandoned and retried.
//!
//! Abandoning a round is safe: a routine slot goes back when dropped, an unanswered write is
//! decided again from the caches by the next round, and an expectation of a write that never
//! went out lapses with its time to live.

use std::sync::{Arc, Mutex};
use std::time::Duration;

tokio::task_local! {
    static STAGE: Arc<Mutex<&'static str>>;
}

/// Marks the stage the current reconcile enters (nothing outside a watched reconcile).
pub(crate) fn stage(name: &'static str) {
    let _ = STAGE.try_with(|s| {
        if let Ok(mut current) = s.lock() {
            *current = name;
        }
    });
}

/// How a watched reconcile ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Watched<T> {
    /// It finished, after warning once when it ran past `warn_after`.
    Done(T),
    /// It ran past the limit and was dropped at this stage.
    Abandoned(&'static str),
}

/// Runs `round`, logging a warning with its stage (`what` names the job) once it runs past
/// `warn_after`, and dropping it past `limit`.
pub(crate) async fn watch<T>(
    what: &str,
    warn_after: Duration,
    limit: Duration,
    round: impl Future<Output = T>,
) -> Watched<T> {
    let current = Arc::new(Mutex::new("start"));
    let read = |s: &Arc<Mutex<&'static str>>| s.lock().map(|g| *g).unwrap_or("unknown");
    let round = STAGE.scope(current.clone(), round);
    tokio::pin!(round);
    tokio::select! {
        done = &mut round => return Watched::Done(done),
        () = tokio::time::sleep(warn_after) => {}
    }
    tracing::warn!(job = what, stage = read(&current), after = ?warn_after, "a reconcile is taking long");
    let rest = limit.saturating_sub(warn_after).max(Duration::from_secs(1));
    match tokio::time::timeout(rest, &mut round).await {
        Ok(done) => Watched::Done(done),
        Err(_) => Watched::Abandoned(read(&current)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_round_past_the_limit_is_abandoned_with_the_stage_it_waits_in() {
        let secs = Duration::from_secs;
        let round = async {
            stage("carry out: actions");
            std::future::pending::<()>().await;
        };
        assert_eq!(
            watch("ns/job", secs(60), secs(300), round).await,
            Watched::Abandoned("carry out: actions")
        );
        let quick = async {
            stage("decide");
            tokio::time::sleep(secs(90)).await;
            7
        };
        assert_eq!(
            watch("ns/job", secs(60), secs(300), quick).await,
            Watched::Done(7)
        );
        // Outside a watched round, marking a stage does nothing.
        stage("nowhere");
    }
}
