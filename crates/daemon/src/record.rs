//! `--record FILE`: the daemon writes the history its node records (docs/history.md) as JSON
//! lines, so that a run of real daemons is judged by the same properties as a simulated one.
//! What is recorded, and how messages and views are named, is the node's
//! ([`conclave_node::record`]); here the lines go to the file, flushed before the datagrams of
//! the same step leave the daemon, so that even after a `kill -9` every message another daemon
//! delivers has its send on disk.

use conclave_history::Record;
/// How a history names a group view and a message (for records a client makes beside the
/// daemons').
pub use conclave_node::record::{group_view_id, message_name};
use std::io::Write;

/// Wall-clock microseconds since the Unix epoch.
pub fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

pub struct HistoryFile {
    out: std::io::BufWriter<std::fs::File>,
    dirty: bool,
}

impl HistoryFile {
    /// Opens the history for appending; a new file is readable by its owner only (it names every
    /// client and group, and holds what the daemon delivered: ciphertext for secure groups, but
    /// plain groups' messages in full).
    pub fn create(path: &std::path::Path) -> std::io::Result<HistoryFile> {
        let mut o = std::fs::OpenOptions::new();
        o.create(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.mode(0o600);
        }
        let f = o.open(path)?;
        Ok(HistoryFile {
            out: std::io::BufWriter::new(f),
            dirty: false,
        })
    }

    pub fn write(&mut self, r: &Record) {
        // A full disk must not stop the daemon; the history is then incomplete, which the
        // checker will say.
        let _ = serde_json::to_writer(&mut self.out, r);
        let _ = self.out.write_all(b"\n");
        self.dirty = true;
    }

    /// Puts what was written on disk (before the daemon sends the datagrams of the same step).
    pub fn flush(&mut self) {
        if self.dirty {
            let _ = self.out.flush();
            self.dirty = false;
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(unix)]
    #[test]
    fn a_new_history_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let path =
            std::env::temp_dir().join(format!("conclave-history-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let h = super::HistoryFile::create(&path).unwrap();
        drop(h);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        let _ = std::fs::remove_file(&path);
    }
}
