//! Backend calls with a deadline, each on a thread of its own.
//!
//! An NVML call can block for good (a GPU whose GSP stopped answering, a
//! driver stuck in a reset). Run on the monitor's path such a call would
//! stop every probe round, so health would stop following any GPU and the
//! liveness probe would restart a plugin that cannot be cured by a restart.
//! Here each call runs on its own short-lived thread and the caller waits
//! at most the deadline (`--gpu-call-timeout`): a call that misses it costs
//! its GPU (the caller marks it Unhealthy), nothing else.
//!
//! A call past its deadline keeps its thread until the call returns; until
//! then a new call under the same key is refused at once
//! ([`CallError::StillBlocked`]), so a GPU that never answers holds one
//! thread, not one per round.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Stack of a call's thread: NVML calls need little, and the process aims
/// at a small resident set.
const STACK_SIZE: usize = 256 * 1024;

/// Why a call gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CallError {
    /// The call did not return within the deadline; its thread is left to finish.
    #[error("did not return within {0:?}")]
    TimedOut(Duration),
    /// An earlier call under the same key has not returned yet.
    #[error("an earlier call has not returned for {0:?}")]
    StillBlocked(Duration),
    /// No thread could be started for the call.
    #[error("cannot start a thread for the call: {0}")]
    Spawn(String),
    /// The call panicked.
    #[error("the call panicked")]
    Panicked,
}

impl CallError {
    /// Whether the call (or one before it) is blocked: the thing called does not answer.
    pub(crate) fn is_blocked(&self) -> bool {
        matches!(self, Self::TimedOut(_) | Self::StillBlocked(_))
    }
}

/// Runs blocking calls on their own threads, each with `deadline`, at
/// most one at a time per key.
#[derive(Debug)]
pub(crate) struct BoundedCalls {
    deadline: Duration,
    /// Keys with a call in progress, and when it began.
    in_flight: Arc<Mutex<BTreeMap<String, Instant>>>,
}

impl BoundedCalls {
    /// Calls that each get `deadline`.
    pub(crate) fn new(deadline: Duration) -> Self {
        Self {
            deadline,
            in_flight: Arc::default(),
        }
    }

    /// Keys whose call has not returned yet (those past the deadline included).
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Runs `call` on a new thread and waits for it at most the deadline.
    /// While an earlier call under `key` has not returned, `call` is not run.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        key: &str,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, CallError> {
        {
            let mut in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(began) = in_flight.get(key) {
                return Err(CallError::StillBlocked(began.elapsed()));
            }
            in_flight.insert(key.to_string(), Instant::now());
        }
        let (answer, answered) = tokio::sync::oneshot::channel();
        let in_flight = Arc::clone(&self.in_flight);
        let owned_key = key.to_string();
        let spawned = std::thread::Builder::new()
            .name("gpu-call".into())
            .stack_size(STACK_SIZE)
            .spawn(move || {
                let result = std::panic::catch_unwind(AssertUnwindSafe(call));
                in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&owned_key);
                // The caller may have stopped waiting; the answer then goes nowhere.
                let _ = answer.send(result.map_err(|_| CallError::Panicked));
            });
        if let Err(e) = spawned {
            self.in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(key);
            return Err(CallError::Spawn(e.to_string()));
        }
        match tokio::time::timeout(self.deadline, answered).await {
            Ok(Ok(result)) => result,
            // The thread ended without answering: it can only have panicked.
            Ok(Err(_)) => Err(CallError::Panicked),
            Err(_) => Err(CallError::TimedOut(self.deadline)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Bounds a wait for a thread to finish: a hang limit, not a latency claim.
    const HANG_LIMIT: Duration = Duration::from_secs(30);

    async fn wait_idle(calls: &BoundedCalls) {
        let idle = tokio::time::timeout(HANG_LIMIT, async {
            while calls.in_flight() > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        idle.await.expect("the released call returns");
    }

    #[tokio::test]
    async fn a_call_that_returns_gives_its_answer() {
        let calls = BoundedCalls::new(HANG_LIMIT);
        assert_eq!(calls.call("a", || 7).await, Ok(7));
        assert_eq!(calls.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_blocked_call_costs_only_its_key_and_its_key_is_refused_until_it_returns() {
        let calls = BoundedCalls::new(Duration::from_millis(50));
        let (release, blocked) = mpsc::channel::<()>();
        let hung = calls.call("gpu-2", move || blocked.recv().is_ok()).await;
        assert_eq!(hung, Err(CallError::TimedOut(Duration::from_millis(50))));
        assert!(hung.unwrap_err().is_blocked());
        // The same GPU is not called again while its call hangs...
        let again = calls.call("gpu-2", || true).await;
        assert!(
            matches!(again, Err(CallError::StillBlocked(_))),
            "{again:?}"
        );
        // ...and every other GPU is.
        assert_eq!(calls.call("gpu-0", || 1).await, Ok(1));
        assert_eq!(calls.in_flight(), 1);
        release.send(()).unwrap();
        wait_idle(&calls).await;
        assert_eq!(calls.call("gpu-2", || 2).await, Ok(2));
    }

    #[tokio::test]
    async fn a_call_that_panics_is_an_error_and_frees_its_key() {
        let calls = BoundedCalls::new(HANG_LIMIT);
        let panicked = calls.call("a", || -> u8 { panic!("scripted") }).await;
        assert_eq!(panicked, Err(CallError::Panicked));
        assert!(!CallError::Panicked.is_blocked());
        assert_eq!(calls.in_flight(), 0);
        assert_eq!(calls.call("a", || 3).await, Ok(3));
    }
}
