//! Whether a checkpoint file is whole, and the step stored in it: the chaos run reads the
//! job's `latest.pt` from its volume while the faults run, and a torn one (cut short, or with
//! bytes that do not match their checksum) is a violation, as is a step lower than one read
//! before.
//!
//! `torch.save` writes a zip archive of stored (uncompressed) entries, `<name>/data.pkl` among
//! them. The archive's central directory is at its end, so a file cut short does not open,
//! and every entry carries a CRC-32 that reading it checks. `data.pkl` pickles the trainer's
//! dict (`{"step": ..., "model": ..., ...}`) with its tensors as persistent ids, which no
//! crate reads: `e2e/checkpoint_step.py` reads the step with Python's standard library.

use std::io::{Cursor, Read};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::AsyncWriteExt;

/// Why `bytes` is not a whole `torch.save` archive, or `None` when it is.
pub fn torn(bytes: &[u8]) -> Option<String> {
    let mut archive = match zip::ZipArchive::new(Cursor::new(bytes)) {
        Ok(archive) => archive,
        Err(e) => {
            return Some(format!(
                "not a whole zip archive ({} bytes): {e}",
                bytes.len()
            ));
        }
    };
    let mut pickle = false;
    for i in 0..archive.len() {
        let mut entry = match archive.by_index(i) {
            Ok(entry) => entry,
            Err(e) => return Some(format!("entry {i}: {e}")),
        };
        let name = String::from_utf8_lossy(entry.name_raw()).into_owned();
        pickle |= name.ends_with("/data.pkl");
        // Reading an entry to its end checks its CRC-32.
        if let Err(e) = std::io::copy(&mut entry.by_ref(), &mut std::io::sink()) {
            return Some(format!("entry {name}: {e}"));
        }
    }
    (!pickle).then(|| "no data.pkl: not a torch.save archive".to_owned())
}

/// The script that prints the step of the `torch.save` archive on its stdin.
const STEP_SCRIPT: &str = "e2e/checkpoint_step.py";
/// How long reading one step may take: the script parses a pickle of a few KiB.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// The training step stored in the `torch.save` archive `bytes` (whole: see [`torn`]), read
/// by `python3 e2e/checkpoint_step.py` (the host has no torch; the script imports and runs
/// nothing from the file).
pub async fn step(bytes: &[u8]) -> Result<u64> {
    let script = crate::repo_root().join(STEP_SCRIPT);
    let mut child = tokio::process::Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting python3 {}", script.display()))?;
    let mut stdin = child.stdin.take().context("no stdin to python3")?;
    let write = async move {
        let written = stdin.write_all(bytes).await;
        drop(stdin); // the end of the archive
        written
    };
    // Written while the output is read: neither side waits for the other.
    let (written, output) = tokio::time::timeout(STEP_TIMEOUT, async {
        tokio::join!(write, child.wait_with_output())
    })
    .await
    .with_context(|| format!("{STEP_SCRIPT} did not answer within {STEP_TIMEOUT:?}"))?;
    let output = output.with_context(|| format!("waiting for {STEP_SCRIPT}"))?;
    if !output.status.success() {
        bail!(
            "{STEP_SCRIPT} ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    // A script that succeeded without reading all of its input read no archive.
    written.with_context(|| format!("writing {} bytes to {STEP_SCRIPT}", bytes.len()))?;
    let printed = String::from_utf8_lossy(&output.stdout);
    printed
        .trim()
        .parse()
        .with_context(|| format!("{STEP_SCRIPT} printed {:?}, not a step", printed.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use zip::write::SimpleFileOptions;

    /// An archive laid out as `torch.save` writes one.
    fn checkpoint() -> Vec<u8> {
        let mut out = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let stored =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        for (name, data) in [
            ("latest/data.pkl", b"pickled state".as_slice()),
            ("latest/data/0", &[7u8; 4096]),
            ("latest/version", b"3\n"),
        ] {
            out.start_file(name, stored).expect("entry");
            out.write_all(data).expect("data");
        }
        out.finish().expect("archive").into_inner()
    }

    #[test]
    fn a_whole_checkpoint_is_not_torn() {
        assert_eq!(torn(&checkpoint()), None);
    }

    #[test]
    fn a_checkpoint_cut_short_is_torn() {
        let whole = checkpoint();
        for cut in [0, 10, whole.len() / 2, whole.len() - 1] {
            assert!(
                torn(&whole[..cut]).is_some(),
                "cut at {cut} of {}",
                whole.len()
            );
        }
    }

    #[test]
    fn a_checkpoint_whose_data_does_not_match_its_checksum_is_torn() {
        let mut bad = checkpoint();
        let at = bad
            .windows(4)
            .position(|w| w == [7u8; 4])
            .expect("the tensor's bytes");
        bad[at] = 8;
        let why = torn(&bad).expect("torn");
        assert!(why.contains("latest/data/0"), "{why}");
    }

    #[test]
    fn an_archive_without_a_pickle_is_not_a_checkpoint() {
        let mut out = zip::ZipWriter::new(Cursor::new(Vec::new()));
        out.start_file("other.txt", SimpleFileOptions::default())
            .expect("entry");
        out.write_all(b"x").expect("data");
        let bytes = out.finish().expect("archive").into_inner();
        assert!(torn(&bytes).is_some_and(|w| w.contains("data.pkl")));
    }

    /// Writes a `torch.save`-like archive to stdout: `data.pkl` pickles the dict `argv[1]`
    /// names with a `persistent_id` for each storage (as torch does), globals that rebuild
    /// objects, and (`code`) a call of `os.mkdir(argv[2])` that an unpickler must not make; a
    /// tensor of 1 MiB makes the archive larger than a pipe's buffer.
    const ARCHIVE_PY: &str = r#"
import collections, io, os, pickle, sys, zipfile

class Storage:
    pass

class Rebuild:
    def __reduce__(self):
        return (collections.OrderedDict, ([("storage", Storage())],))

class Mkdir:
    def __reduce__(self):
        return (os.mkdir, (sys.argv[2],))

class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", "FloatStorage", "0", "cpu", 4)
        return None

model = collections.OrderedDict(weight=Rebuild())
model._metadata = {"": {"version": 1}}
optimizer = {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}
states = {
    "step": {"step": 7, "model": model, "optimizer": optimizer, "rng": Rebuild(), "world_size": 3},
    "no-step": {"model": model},
    "code": {"step": 3, "run": Mkdir()},
}
data = io.BytesIO()
Pickler(data, protocol=2).dump(states[sys.argv[1]])
archive = io.BytesIO()
with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
    z.writestr("latest/data.pkl", data.getvalue())
    z.writestr("latest/data/0", bytes(1 << 20))
    z.writestr("latest/version", "3\n")
sys.stdout.buffer.write(archive.getvalue())
"#;

    /// The archive [`ARCHIVE_PY`] writes for `state`, or `None` where there is no python3.
    fn pickled(state: &str, path: &std::path::Path) -> Option<Vec<u8>> {
        let out = std::process::Command::new("python3")
            .args(["-c", ARCHIVE_PY, state])
            .arg(path)
            .output();
        let Ok(out) = out else {
            println!("no python3: the checkpoint step script is not tested");
            return None;
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(out.stdout)
    }

    #[tokio::test]
    async fn the_step_is_read_from_a_pickle_with_persistent_ids_without_torch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some(archive) = pickled("step", dir.path()) else {
            return;
        };
        assert_eq!(torn(&archive), None);
        assert_eq!(step(&archive).await.expect("the step"), 7);
    }

    #[tokio::test]
    async fn reading_the_step_runs_nothing_from_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let made = dir.path().join("made");
        let Some(archive) = pickled("code", &made) else {
            return;
        };
        assert_eq!(step(&archive).await.expect("the step"), 3);
        assert!(!made.exists(), "the pickle's os.mkdir ran");
    }

    #[tokio::test]
    async fn a_file_without_a_step_has_none_and_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some(archive) = pickled("no-step", dir.path()) else {
            return;
        };
        let why = format!("{:#}", step(&archive).await.expect_err("no step"));
        assert!(
            why.contains(r#"latest/data.pkl has no non-negative integer "step": None"#),
            "{why}"
        );
        let why = format!("{:#}", step(b"not an archive").await.expect_err("no zip"));
        assert!(why.contains("not a zip archive"), "{why}");
        let why = format!("{:#}", step(&checkpoint()).await.expect_err("no pickle"));
        assert!(why.contains("does not unpickle"), "{why}");
    }
}
