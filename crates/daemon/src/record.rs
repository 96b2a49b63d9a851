//! `--record FILE`: the daemon writes the history of its clients (and its own daemon views) as
//! JSON lines in the format the checker reads (docs/history.md), so that a run of real daemons
//! is judged by the same properties as a simulated one.
//!
//! Times are wall-clock microseconds since the Unix epoch, so the files of several daemons on one
//! machine merge into one history. A message is named by its sender, a digest of its payload and
//! the group (`alice#d1:9f2c...@chat`): the daemons carry no message number, so two messages
//! with the same payload from one sender to one group would look like one message delivered
//! twice. Tests give every message its own payload. Lines are written before the packets of the
//! same step leave the daemon, so even after a `kill -9` every message another daemon delivers
//! has its send on disk.

use conclave_gcs::{ClientEvent, GroupViewId};
use conclave_history::wire::{client_event, Naming};
use conclave_history::{Event, Record, ViewId};
use conclave_wire::gcs::RingId;
use sha2::{Digest, Sha256};
use std::io::Write;

/// Wall-clock microseconds since the Unix epoch.
pub fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

pub struct Recorder {
    out: std::io::BufWriter<std::fs::File>,
    /// Daemon names by id, for view ids.
    names: Vec<String>,
    dirty: bool,
}

impl Recorder {
    pub fn create(path: &std::path::Path, names: Vec<String>) -> std::io::Result<Recorder> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Recorder {
            out: std::io::BufWriter::new(f),
            names,
            dirty: false,
        })
    }

    fn daemon(&self, id: u32) -> String {
        self.names
            .get((id as usize).wrapping_sub(1))
            .cloned()
            .unwrap_or_else(|| format!("#{id}"))
    }

    pub fn ring_view(&self, ring: RingId) -> ViewId {
        ViewId(ring.seq, format!("{}.{}", self.daemon(ring.rep), ring.inc))
    }

    fn group_view(&self, v: GroupViewId) -> ViewId {
        ViewId(
            conclave_history::wire::group_view_number(v),
            format!("{}.{}", self.daemon(v.ring.rep), v.ring.inc),
        )
    }

    pub fn push(&mut self, p: &str, inc: u32, ev: Event) {
        let r = Record {
            t: wall_us(),
            p: p.to_owned(),
            inc,
            ev,
        };
        // A full disk must not stop the daemon; the history is then incomplete, which the
        // checker will say.
        let _ = serde_json::to_writer(&mut self.out, &r);
        let _ = self.out.write_all(b"\n");
        self.dirty = true;
    }

    /// One client event, as the history has it (`None` for events the history leaves out).
    pub fn client_event(&self, client: &str, ev: &ClientEvent) -> Option<Event> {
        let msg = |sender: &str, group: &str, payload: &[u8]| {
            let d = Sha256::digest(payload);
            format!("{sender}:{}@{group}", hex::encode(&d[..8]))
        };
        match ev {
            ClientEvent::Closed { .. } => Some(Event::Crash),
            ev => {
                let naming = Naming {
                    view: &|v| self.group_view(v),
                    msg: &msg,
                    payload: &|p: &[u8]| hex::encode(p),
                };
                client_event(client, ev.clone(), &naming)
            }
        }
    }

    /// Puts what was written on disk (before the daemon sends the packets of the same step).
    pub fn flush(&mut self) {
        if self.dirty {
            let _ = self.out.flush();
            self.dirty = false;
        }
    }
}
