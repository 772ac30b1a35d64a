//! The GPU resets a node still owes, kept in a file on the node (`--state-dir`) so that a
//! plugin restarted by an OOM kill, a rollout or its liveness probe goes on refusing a GPU
//! whose fault left no evidence it could read again.
//!
//! The file is JSON, written whole to a temporary file and renamed over the old one whenever
//! the owed set changes. It names the boot it was written in (`/proc/sys/kernel/random/boot_id`):
//! a node that rebooted has reset its GPUs, so a file of another boot owes nothing. A file that
//! cannot be read or parsed is named in a warning and owes nothing; its GPUs are judged afresh
//! from their evidence, as without the file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::health::OwedReset;

/// The file's name in the state directory.
pub(crate) const FILE_NAME: &str = "owed-resets.json";
/// Where the kernel names the current boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Saved {
    /// The boot the resets are owed in.
    boot_id: String,
    /// The owed resets, by GPU UUID.
    gpus: BTreeMap<String, OwedReset>,
}

/// The owed resets of one node, read at start and written on every change.
#[derive(Debug)]
pub(crate) struct OwedStore {
    path: PathBuf,
    boot_id: String,
    /// What the file holds now, so an unchanged set is not written again.
    written: BTreeMap<String, OwedReset>,
}

impl OwedStore {
    /// The store in `dir` for the current boot.
    pub(crate) fn open(dir: &Path) -> std::io::Result<Self> {
        let boot_id = std::fs::read_to_string(BOOT_ID)?.trim().to_owned();
        std::fs::create_dir_all(dir)?;
        Ok(Self::for_boot(dir, boot_id))
    }

    fn for_boot(dir: &Path, boot_id: String) -> Self {
        Self {
            path: dir.join(FILE_NAME),
            boot_id,
            written: BTreeMap::new(),
        }
    }

    /// The resets owed in this boot, as a previous run left them (none when there is no
    /// file, when it was written in another boot, or when it cannot be read).
    pub(crate) fn load(&mut self) -> BTreeMap<String, OwedReset> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeMap::new(),
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "cannot read the owed GPU resets; judging every GPU afresh");
                return BTreeMap::new();
            }
        };
        let saved: Saved = match serde_json::from_str(&text) {
            Ok(saved) => saved,
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "the owed GPU resets do not parse; judging every GPU afresh");
                return BTreeMap::new();
            }
        };
        if saved.boot_id != self.boot_id {
            tracing::info!(file = %self.path.display(), "the node rebooted since the owed GPU resets were written: its GPUs were reset");
            return BTreeMap::new();
        }
        self.written = saved.gpus.clone();
        saved.gpus
    }

    /// Writes `owed` when it differs from what the file holds. A failed write is logged
    /// and tried again at the next change.
    pub(crate) fn save(&mut self, owed: &BTreeMap<String, OwedReset>) {
        if *owed == self.written {
            return;
        }
        match self.write(owed) {
            Ok(()) => self.written = owed.clone(),
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "cannot write the owed GPU resets");
            }
        }
    }

    fn write(&self, owed: &BTreeMap<String, OwedReset>) -> std::io::Result<()> {
        let saved = Saved {
            boot_id: self.boot_id.clone(),
            gpus: owed.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&saved).map_err(std::io::Error::other)?;
        let tmp = self.path.with_extension("json.tmp");
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owed(uuid: &str) -> BTreeMap<String, OwedReset> {
        BTreeMap::from([(
            uuid.to_owned(),
            OwedReset {
                reason: "critical XID 62; waiting for a GPU reset".to_owned(),
                resets_at_fault: Some(3),
                seen_owed: false,
            },
        )])
    }

    /// What one run saves, the next run of the same boot loads; a run of another boot
    /// loads nothing (a reboot resets the GPUs).
    #[test]
    fn owed_resets_survive_a_restart_but_not_a_reboot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut first = OwedStore::for_boot(dir.path(), "boot-a".to_owned());
        assert!(first.load().is_empty(), "no file yet");
        first.save(&owed("GPU-1"));
        let mut again = OwedStore::for_boot(dir.path(), "boot-a".to_owned());
        assert_eq!(again.load(), owed("GPU-1"));
        let mut rebooted = OwedStore::for_boot(dir.path(), "boot-b".to_owned());
        assert!(rebooted.load().is_empty());
        // Cleared by the reset: the file says so.
        again.save(&BTreeMap::new());
        let mut after = OwedStore::for_boot(dir.path(), "boot-a".to_owned());
        assert!(after.load().is_empty());
    }

    /// A file that does not parse owes nothing, and the next save replaces it.
    #[test]
    fn a_file_that_does_not_parse_owes_nothing_and_is_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(FILE_NAME), "{not json").expect("write");
        let mut store = OwedStore::for_boot(dir.path(), "boot-a".to_owned());
        assert!(store.load().is_empty());
        store.save(&owed("GPU-2"));
        let mut again = OwedStore::for_boot(dir.path(), "boot-a".to_owned());
        assert_eq!(again.load(), owed("GPU-2"));
    }
}
