//! Whether a checkpoint file is whole: the chaos run reads the job's `latest.pt` from its
//! volume while the faults run, and a torn one (cut short, or with bytes that do not match
//! their checksum) is a violation.
//!
//! `torch.save` writes a zip archive of stored (uncompressed) entries, `<name>/data.pkl` among
//! them. The archive's central directory is at its end, so a file cut short does not open,
//! and every entry carries a CRC-32 that reading it checks.

use std::io::{Cursor, Read};

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
}
