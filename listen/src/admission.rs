//! Which accepted connections a listener holds: at most its cap at once, and at most its
//! per-source share of them from one IP address.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The connections a listener holds, in total and per source address. A source leaves the
/// map with its last connection, so the map holds no more entries than the cap.
pub(crate) struct Admission {
    slots: Arc<Semaphore>,
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max_per_source: usize,
}

/// The cap that closed a connection at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cap {
    /// The listener's, `max_connections`.
    Global,
    /// Its source's share, `max_connections_per_source`.
    PerSource,
}

/// One held connection: its slot of the cap and its place in its source's count, both given
/// back when it is dropped, so that neither outlives the other.
pub(crate) struct Admitted {
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
    source: IpAddr,
    _slot: OwnedSemaphorePermit,
}

impl Admission {
    pub(crate) fn new(max_connections: usize, max_per_source: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_connections)),
            per_source: Arc::default(),
            max_per_source,
        }
    }

    /// A place for one more connection from `source`, or the cap it would go over. The
    /// source's share is checked first, so that a source at its share takes no slot of the
    /// cap from the others.
    pub(crate) fn admit(&self, source: IpAddr) -> Result<Admitted, Cap> {
        let mut per_source = lock(&self.per_source);
        let held = per_source.get(&source).copied().unwrap_or(0);
        if held >= self.max_per_source {
            return Err(Cap::PerSource);
        }
        let slot = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| Cap::Global)?;
        per_source.insert(source, held + 1);
        Ok(Admitted {
            per_source: self.per_source.clone(),
            source,
            _slot: slot,
        })
    }

    /// Connections held from `source`.
    #[cfg(test)]
    pub(crate) fn held_from(&self, source: IpAddr) -> Option<usize> {
        lock(&self.per_source).get(&source).copied()
    }

    /// Slots of the cap not held.
    #[cfg(test)]
    pub(crate) fn free_slots(&self) -> usize {
        self.slots.available_permits()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut per_source = lock(&self.per_source);
        if let Some(held) = per_source.get_mut(&self.source) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                per_source.remove(&self.source);
            }
        }
    }
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Global => "global",
            Self::PerSource => "per-source",
        })
    }
}

/// The map's lock: each update is whole, so a panic elsewhere cannot leave it torn.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
