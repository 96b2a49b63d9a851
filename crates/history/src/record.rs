//! The history format: one JSON object per line, one line per event at one process.
//!
//! A process is a client (or a daemon, for daemon views) with an incarnation number that grows
//! at each restart. Lines of one process incarnation appear in the order it did them; `t` is the
//! time of the event in microseconds (simulated or wall clock), used only to order events of
//! different processes where the properties need it (a send before its deliveries, events after
//! stabilization). The simulator and the daemons (`--record`) write this format; the checker
//! reads it.
//!
//! ```text
//! {"t":10,"p":"c1","inc":0,"ev":"join","group":"g","vs":true}
//! {"t":12,"p":"c1","inc":0,"ev":"view","group":"g","view":[3,"d1"],"members":["c1","c2"],"transitional":["c1"]}
//! {"t":15,"p":"c1","inc":0,"ev":"send","group":"g","msg":"c1/0/1","service":"agreed","view":[3,"d1"],"payload":"9f2c"}
//! {"t":16,"p":"c2","inc":0,"ev":"deliver","group":"g","msg":"c1/0/1","sender":"c1","service":"agreed","view":[3,"d1"],"transitional":false,"payload":"9f2c"}
//! ```

use serde::{Deserialize, Serialize};

/// Longest line the reader accepts, in bytes.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// A view identifier: a sequence number and the process that made the view. Ordered by sequence
/// number first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ViewId(pub u64, pub String);

impl core::fmt::Display for ViewId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}@{}", self.0, self.1)
    }
}

/// The six service types, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Service {
    Unreliable,
    Reliable,
    Fifo,
    Causal,
    Agreed,
    Safe,
}

impl Service {
    pub fn at_least_fifo(self) -> bool {
        self >= Service::Fifo
    }
    pub fn at_least_causal(self) -> bool {
        self >= Service::Causal
    }
    pub fn at_least_agreed(self) -> bool {
        self >= Service::Agreed
    }
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The process asked to join `group`; `vs` if it asked for virtual synchrony (flushes).
    Join { group: String, vs: bool },
    /// The process left `group` (its request took effect); nothing of the group reaches it after.
    Leave { group: String },
    /// A view of `group` installed (for daemon views, `group` is empty).
    View {
        group: String,
        view: ViewId,
        members: Vec<String>,
        /// The members that came straight from the process's previous view into this one.
        transitional: Vec<String>,
    },
    /// The current view of `group` turned transitional: what follows until the next view is
    /// delivered in its transitional part.
    TransSignal { group: String },
    /// A VS member acknowledged the flush of its current view of `group`.
    FlushAck { group: String },
    Send {
        group: String,
        msg: String,
        service: Service,
        view: ViewId,
        payload: String,
    },
    /// The process sent `msg` to `group` without being a member (a Spread client: Spread's
    /// groups are open): it is delivered in whichever view the group has where it is ordered,
    /// so no view of the sender's is named.
    OpenSend {
        group: String,
        msg: String,
        service: Service,
        payload: String,
    },
    Deliver {
        group: String,
        msg: String,
        sender: String,
        service: Service,
        view: ViewId,
        transitional: bool,
        payload: String,
    },
    /// The secure layer installed a secure view of `group`: its key is agreed. `key` is the
    /// key's fingerprint, never the key.
    SecureView {
        group: String,
        view: ViewId,
        /// The key's holders: the view's members but `without`.
        members: Vec<String>,
        key: String,
        /// Members of the view that hold no key of it (a key-graph group's members the server
        /// could not register in time).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        without: Vec<String>,
    },
    /// The process serves the keys of `group` from a key graph (a key server): it is in the
    /// group's views but is not one of its secure members.
    KeyServer { group: String },
    /// The secure layer refused input from `sender` (`error`: what kind of refusal).
    SecureRefused {
        group: String,
        sender: String,
        error: String,
    },
    /// The application handed `msg` to the secure layer of `group` (`msg` names it by sender
    /// and a digest of its plaintext; the layer seals it in the secure view it goes out in).
    SecureSend { group: String, msg: String },
    /// The secure layer opened `msg` from `sender` and delivered it in secure view `view`, the
    /// view whose key it was sealed under.
    SecureDeliver {
        group: String,
        msg: String,
        sender: String,
        view: ViewId,
    },
    /// The key agreement run of secure view `run` took in a message of `sender` that names
    /// view `signed_for` under its signature (K5: the two are one).
    SecureConsumed {
        group: String,
        sender: String,
        signed_for: ViewId,
        run: ViewId,
    },
    /// The process's daemon handed it the key of view `view` of `group`, derived from the
    /// daemons' key (the integrated architecture); `key` is the key's fingerprint.
    GroupKey {
        group: String,
        view: ViewId,
        key: String,
    },
    /// An attacker on the wire sent the daemon a datagram of its own making (`kind`: a replay,
    /// an altered copy, a forgery, garbage, or one from an address no daemon has); `taken` is
    /// how many packets of it the daemon's core took (the link must refuse it: 0).
    Hostile { kind: String, taken: u64 },
    /// The process crashed (this incarnation ends).
    Crash,
    /// Faults stopped; `processes` are alive and connected from here on (liveness is checked
    /// from this line).
    Stable { processes: Vec<String> },
}

/// One line of a history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub t: u64,
    #[serde(default)]
    pub p: String,
    #[serde(default)]
    pub inc: u32,
    #[serde(flatten)]
    pub ev: Event,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("line {line}: {source}")]
    Json {
        line: usize,
        source: serde_json::Error,
    },
    /// `len`: the bytes of it read before it was refused (the rest is not read).
    #[error("line {line} is over the limit of {MAX_LINE_BYTES} bytes")]
    TooLong { line: usize, len: usize },
    #[error("reading the history: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads a history; blank lines are skipped. A last line without its newline that ends before
/// its record does is dropped: it is what a process killed in the middle of writing its history
/// leaves (every line a writer finishes ends with a newline). Any other line that does not parse
/// is an error.
pub fn read(mut input: impl std::io::BufRead) -> Result<Vec<Record>, ReadError> {
    use std::io::{BufRead, Read};
    let mut out = Vec::new();
    let mut line = Vec::new();
    for i in 1.. {
        line.clear();
        // One byte past the limit and its newline tells a line over the limit.
        let n = (&mut input)
            .take(MAX_LINE_BYTES as u64 + 2)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        let ended = line.last() == Some(&b'\n');
        if ended {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        if line.len() > MAX_LINE_BYTES {
            return Err(ReadError::TooLong {
                line: i,
                len: line.len(),
            });
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        match serde_json::from_slice(&line) {
            Ok(r) => out.push(r),
            Err(e) if !ended && e.is_eof() => break,
            Err(source) => return Err(ReadError::Json { line: i, source }),
        }
    }
    Ok(out)
}

/// Writes a history as JSON lines.
pub fn write(records: &[Record], mut out: impl std::io::Write) -> std::io::Result<()> {
    for r in records {
        serde_json::to_writer(&mut out, r)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

impl Record {
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("records serialize")
    }
    /// The group the event is about, if any.
    pub fn group(&self) -> Option<&str> {
        match &self.ev {
            Event::Join { group, .. }
            | Event::Leave { group }
            | Event::View { group, .. }
            | Event::TransSignal { group }
            | Event::FlushAck { group }
            | Event::Send { group, .. }
            | Event::OpenSend { group, .. }
            | Event::Deliver { group, .. }
            | Event::SecureView { group, .. }
            | Event::SecureRefused { group, .. }
            | Event::SecureSend { group, .. }
            | Event::SecureDeliver { group, .. }
            | Event::SecureConsumed { group, .. }
            | Event::GroupKey { group, .. }
            | Event::KeyServer { group } => Some(group),
            Event::Crash | Event::Stable { .. } | Event::Hostile { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_lines_parse_and_round_trip() {
        let text = r#"{"t":10,"p":"c1","inc":0,"ev":"join","group":"g","vs":true}
{"t":12,"p":"c1","inc":0,"ev":"view","group":"g","view":[3,"d1"],"members":["c1","c2"],"transitional":["c1"]}

{"t":15,"p":"c1","inc":0,"ev":"send","group":"g","msg":"c1/0/1","service":"agreed","view":[3,"d1"],"payload":"9f2c"}
{"t":16,"p":"c2","inc":0,"ev":"deliver","group":"g","msg":"c1/0/1","sender":"c1","service":"agreed","view":[3,"d1"],"transitional":false,"payload":"9f2c"}
{"t":99,"ev":"stable","processes":["c1","c2"]}
"#;
        let recs = read(text.as_bytes()).unwrap();
        assert_eq!(recs.len(), 5);
        let mut out = Vec::new();
        write(&recs, &mut out).unwrap();
        assert_eq!(read(&out[..]).unwrap(), recs);
        assert!(read(&b"{\"t\":1,\"ev\":\"nope\"}"[..]).is_err());
    }

    #[test]
    fn a_last_line_cut_short_is_dropped_and_nothing_else() {
        let whole =
            "{\"t\":10,\"p\":\"c1\",\"inc\":0,\"ev\":\"join\",\"group\":\"g\",\"vs\":true}\n";
        let next = "{\"t\":11,\"p\":\"c1\",\"inc\":0,\"ev\":\"leave\",\"group\":\"g\"}";
        let one = read(whole.as_bytes()).unwrap();
        assert_eq!(one.len(), 1);
        // Cut anywhere, the last line is dropped.
        for last in [next, whole.trim_end()] {
            for cut in 1..last.len() {
                let text = format!("{whole}{}", &last[..cut]);
                assert_eq!(read(text.as_bytes()).unwrap(), one, "{last} cut at {cut}");
            }
        }
        // Whole but for its newline, it is read.
        assert_eq!(read(format!("{whole}{next}").as_bytes()).unwrap().len(), 2);
        // A cut line followed by more is no cut last line, nor is a short line with its newline.
        let glued = format!("{whole}{}{whole}", &next[..20]);
        assert!(matches!(
            read(glued.as_bytes()),
            Err(ReadError::Json { line: 2, .. })
        ));
        let ended = format!("{whole}{}\n", &next[..20]);
        assert!(matches!(
            read(ended.as_bytes()),
            Err(ReadError::Json { line: 2, .. })
        ));
        // A last line that is whole and wrong is an error, newline or not.
        assert!(read(format!("{whole}{{\"t\":1,\"ev\":\"nope\"}}").as_bytes()).is_err());
        // Windows line ends and blank lines are fine.
        assert_eq!(
            read(format!("\r\n{}", whole.replace('\n', "\r\n")).as_bytes()).unwrap(),
            one
        );
    }

    #[test]
    fn a_line_over_the_limit_is_refused_without_reading_it_all() {
        /// What comes after the line's first 1 MiB and 64 KiB: reading it is an error.
        struct Beyond;
        impl std::io::Read for Beyond {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("read past the limit"))
            }
        }
        use std::io::Read;
        let head = format!(
            "{{\"t\":1,\"p\":\"{}",
            "x".repeat(MAX_LINE_BYTES + (64 << 10))
        );
        let input = std::io::BufReader::new(head.as_bytes().chain(Beyond));
        let got = read(input);
        assert!(
            matches!(got, Err(ReadError::TooLong { line: 1, .. })),
            "{got:?}"
        );
    }
}
