//! `--record FILE`: the daemon writes the history its node records (docs/history.md) as JSON
//! lines, so that a run of real daemons is judged by the same properties as a simulated one.
//! What is recorded, and how messages and views are named, is the node's
//! ([`conclave_node::record`]); here the lines go to the file, flushed before the datagrams of
//! the same step leave the daemon, so that even after a `kill -9` every message another daemon
//! delivers has its send on disk.
//!
//! Lines reach the file whole: a step's records are framed in a buffer of the daemon's own and
//! written out only as whole lines. A `kill -9` in the middle of a write can still cut the last
//! line short (the kernel stops a large write at a page); the reader drops such a cut last line
//! (`conclave_history::record::read`), and a daemon that opens its history again drops it from
//! the file before it appends, so that its first line is not glued onto the cut one. The cut
//! line's step never finished: its datagrams leave only after the flush.

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
    file: std::fs::File,
    /// Whole lines not yet written.
    lines: Vec<u8>,
}

/// Lines held before they are written even without a flush: a step that records more (a
/// configuration change with many groups) writes as it goes, whole lines only.
const HELD_BYTES: usize = 64 << 10;

impl HistoryFile {
    /// Opens the history for appending; a new file is readable by its owner only (it names every
    /// client and group, and holds what the daemon delivered: ciphertext for secure groups, but
    /// plain groups' messages in full). A last line an earlier incarnation left cut short is
    /// dropped first.
    pub fn create(path: &std::path::Path) -> std::io::Result<HistoryFile> {
        let mut o = std::fs::OpenOptions::new();
        o.create(true).read(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.mode(0o600);
        }
        let mut file = o.open(path)?;
        drop_cut_line(&mut file)?;
        Ok(HistoryFile {
            file,
            lines: Vec::with_capacity(HELD_BYTES),
        })
    }

    pub fn write(&mut self, r: &Record) {
        let start = self.lines.len();
        if serde_json::to_writer(&mut self.lines, r).is_err() {
            self.lines.truncate(start);
            return;
        }
        self.lines.push(b'\n');
        if self.lines.len() >= HELD_BYTES {
            self.flush();
        }
    }

    /// Puts what was written on disk (before the daemon sends the datagrams of the same step).
    pub fn flush(&mut self) {
        if !self.lines.is_empty() {
            // A full disk must not stop the daemon; the history is then incomplete, which the
            // checker will say.
            let _ = self.file.write_all(&self.lines);
            self.lines.clear();
        }
    }
}

impl Drop for HistoryFile {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Truncates `file` after its last newline: every line the daemon writes ends with one, so bytes
/// after the last are a line a `kill -9` cut short.
fn drop_cut_line(file: &mut std::fs::File) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata()?.len();
    let mut chunk = vec![0u8; 64 << 10];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let part = &mut chunk[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(part)?;
        if let Some(i) = part.iter().rposition(|&b| b == b'\n') {
            let keep = start + i as u64 + 1;
            if keep < len {
                file.set_len(keep)?;
            }
            return Ok(());
        }
        end = start;
    }
    // No newline at all: the file is one cut line.
    if len > 0 {
        file.set_len(0)?;
    }
    Ok(())
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

    fn record(t: u64) -> super::Record {
        super::Record {
            t,
            p: "c1".into(),
            inc: 0,
            ev: conclave_history::record::Event::Send {
                group: "g".into(),
                msg: format!("c1/0/{t}"),
                service: conclave_history::record::Service::Agreed,
                view: conclave_history::record::ViewId(3, "d1".into()),
                payload: "9f2c".repeat(50),
            },
        }
    }

    fn history(path: &std::path::Path) -> Vec<super::Record> {
        let f = std::fs::File::open(path).unwrap();
        conclave_history::record::read(std::io::BufReader::new(f)).unwrap()
    }

    #[test]
    fn only_whole_lines_reach_the_file_before_a_flush() {
        let path =
            std::env::temp_dir().join(format!("conclave-whole-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut h = super::HistoryFile::create(&path).unwrap();
        // Well past what is held: some lines are written out before any flush.
        for t in 0..1_000 {
            h.write(&record(t));
        }
        let text = std::fs::read(&path).unwrap();
        assert!(!text.is_empty(), "nothing written before the flush");
        assert_eq!(text.last(), Some(&b'\n'), "a line cut between two writes");
        let early = history(&path).len();
        h.flush();
        assert!(early < 1_000);
        assert_eq!(history(&path), (0..1_000).map(record).collect::<Vec<_>>());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_history_opened_again_drops_the_line_a_kill_cut_short() {
        let path = std::env::temp_dir().join(format!("conclave-cut-{}.jsonl", std::process::id()));
        for cut in [0usize, 1, 37] {
            let _ = std::fs::remove_file(&path);
            let mut h = super::HistoryFile::create(&path).unwrap();
            for t in 0..3 {
                h.write(&record(t));
            }
            h.flush();
            drop(h);
            // The next line, cut as a kill in the middle of its write leaves it.
            let whole = std::fs::read(&path).unwrap().len();
            let line = serde_json::to_string(&record(3)).unwrap();
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            std::io::Write::write_all(&mut f, &line.as_bytes()[..cut]).unwrap();
            drop(f);
            let mut h = super::HistoryFile::create(&path).unwrap();
            assert_eq!(std::fs::read(&path).unwrap().len(), whole, "cut at {cut}");
            h.write(&record(4));
            h.flush();
            let want: Vec<_> = [0, 1, 2, 4].into_iter().map(record).collect();
            assert_eq!(history(&path), want, "cut at {cut}");
        }
        // A file that is nothing but a cut line.
        std::fs::write(&path, b"{\"t\":1,\"p\"").unwrap();
        let mut h = super::HistoryFile::create(&path).unwrap();
        h.write(&record(5));
        h.flush();
        assert_eq!(history(&path), vec![record(5)]);
        let _ = std::fs::remove_file(&path);
    }
}
