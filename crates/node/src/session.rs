//! One client connection as the node keeps it: where its handshake is, the bytes of a request
//! not yet complete, the replies framed for it and not yet handed out, and what was handed out
//! and not yet written. Every byte a connection can make the node hold is bounded here or in
//! [`crate::node`]'s budgets.

use bytes::Bytes;
use conclave_wire::client::{
    next_frame_within, ClientEvent, GroupViewId, Reply, Request, MAX_REQUEST_BYTES, MAX_SENT_RUN,
};
use conclave_wire::gcs::ServiceType;
use conclave_wire::DecodeError;

/// A connection, as its driver numbers it; once it has connected, also its client's id in the
/// core ([`conclave_gcs::ClientId`]).
pub type SessionId = conclave_gcs::ClientId;

/// Acknowledgements in a row of one group, service and view ([`Reply::SentRun`]).
pub(crate) struct SentRun {
    group: String,
    service: ServiceType,
    view: GroupViewId,
    count: u16,
}

/// What the node hands a driver for one connection.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionOutput {
    /// Framed replies, and how many: write them in order.
    Bytes(crate::frames::Frames, usize),
    /// Write what came before, then close the connection.
    Close,
}

/// Buffers kept for reuse per connection, and the largest kept: a pass under heavy load frames
/// a few hundred KiB for a client (in buffers of [`crate::node::CHUNK_BYTES`] and a frame), and
/// an idle connection should not hold a burst's worth.
const SPARE_BUFFERS: usize = 8;
const SPARE_MAX_BYTES: usize = 128 << 10;

pub(crate) struct Session {
    /// The client's qualified name and incarnation, once connected.
    pub client: Option<(String, u32)>,
    /// Requests read on this connection (a refusal names the one it refuses by its number).
    pub requests: u64,
    /// The start of a request that has not fully arrived.
    pub input: Vec<u8>,
    /// When the first byte of the incomplete request arrived (or the connection opened, until
    /// it has connected): the deadline runs from here.
    pub deadline: Option<conclave_gcs::Time>,
    /// Replies framed since the node last handed this session's output out.
    pub pending: crate::frames::Frames,
    pub pending_replies: usize,
    /// Acknowledgements of the client's messages not yet framed: framed as one reply before
    /// anything framed after them, or when the session's output is handed out.
    pub sent_run: Option<SentRun>,
    /// Handed out and not yet reported written.
    pub unwritten_bytes: usize,
    pub unwritten_replies: usize,
    /// Buffers the driver is done with, to frame into again: a fresh buffer per pass cost
    /// growing it step by step and the kernel zeroing its new pages.
    spare: Vec<Vec<u8>>,
    /// Groups whose keys the client asked the daemons for ([`Request::Keys`]), with the view
    /// it was last given while that view's key is not derived yet. Names of up to 24 bytes are
    /// held inline: at a configuration change the daemon derives a key for each of thousands of
    /// them in one pass, which would otherwise read each name from a cold allocation of its own.
    pub keyed: std::collections::BTreeMap<
        compact_str::CompactString,
        Option<conclave_wire::client::GroupViewId>,
    >,
    /// The name this connection asked for and the nonce it must sign, when the daemons know a
    /// key for that name ([`conclave_wire::client::Reply::Challenge`]).
    pub challenged: Option<(String, [u8; 32])>,
    /// The connection's channel binding, when it is TLS: a proof of a name must sign it too.
    pub binding: Option<[u8; 32]>,
    /// Groups the client joined without VS: with their keys from the daemons, this daemon
    /// reseals what is delivered in a later view than its key's (Optimized EVS, crate::reseal).
    pub evs: std::collections::BTreeSet<String>,
    /// The view of each such group the client was last given.
    pub evs_views: std::collections::BTreeMap<String, conclave_wire::client::GroupViewId>,
    /// A Spread client's session (docs/spread.md): its state beyond a Conclave client's.
    pub spread: Option<Box<crate::node::spread_session::SpreadSession>>,
}

impl Session {
    pub fn new() -> Session {
        Session {
            client: None,
            requests: 0,
            input: Vec::new(),
            deadline: None,
            pending: Default::default(),
            pending_replies: 0,
            sent_run: None,
            unwritten_bytes: 0,
            unwritten_replies: 0,
            spare: Vec::new(),
            keyed: Default::default(),
            challenged: None,
            binding: None,
            evs: Default::default(),
            evs_views: Default::default(),
            spread: None,
        }
    }

    /// Counts the acknowledgement of one more of the client's messages: it joins the run
    /// waiting if it is of the same group, service and view, and otherwise the run waiting is
    /// framed and a new one starts. Whether a run was framed (so that the limits on what the
    /// client leaves unread are checked, as for any reply).
    pub fn sent(&mut self, group: String, service: ServiceType, view: GroupViewId) -> bool {
        if let Some(run) = &mut self.sent_run {
            if run.count < MAX_SENT_RUN
                && run.view == view
                && run.service == service
                && run.group == group
            {
                run.count += 1;
                return false;
            }
        }
        let framed = self.sent_run.is_some();
        self.frame_sent_run();
        self.sent_run = Some(SentRun {
            group,
            service,
            view,
            count: 1,
        });
        framed
    }

    /// Whether all the session has waiting is one acknowledgement, which may wait for another
    /// reply to go with. Two or more go at once: their sender sends faster than its messages
    /// are delivered, and may be waiting on its window. (Holding back runs of any length made
    /// one sender over TCP about 6% slower, in four alternated pairs; and a client whose window
    /// holds only a few messages would send them a few per delivery.)
    pub fn only_a_lone_acknowledgement(&self) -> bool {
        self.pending.is_empty() && self.sent_run.as_ref().is_some_and(|r| r.count == 1)
    }

    /// Frames the run of acknowledgements waiting, if any: one `Sent` alone as itself.
    pub fn frame_sent_run(&mut self) {
        let Some(SentRun {
            group,
            service,
            view,
            count,
        }) = self.sent_run.take()
        else {
            return;
        };
        let reply = match count {
            1 => Reply::Event(ClientEvent::Sent {
                group,
                service,
                payload: Bytes::new(),
                view,
            }),
            _ => Reply::SentRun {
                group,
                service,
                view,
                count,
            },
        };
        reply.frame_into(self.pending.bytes_mut());
        self.pending_replies += 1;
    }

    /// Whether nothing is framed or waiting to be.
    pub fn nothing_pending(&self) -> bool {
        self.pending.is_empty() && self.sent_run.is_none()
    }

    /// An empty buffer to frame into, reused if the driver gave one back.
    pub fn buffer(&mut self, room: usize) -> Vec<u8> {
        self.spare.pop().unwrap_or_else(|| Vec::with_capacity(room))
    }

    pub fn give_back(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > SPARE_MAX_BYTES {
            return;
        }
        if self.spare.len() < SPARE_BUFFERS {
            buf.clear();
            self.spare.push(buf);
        }
    }
}

/// The next request in `stream`, and the bytes it took; `Ok(None)` while incomplete. A frame
/// longer than the largest valid request is refused before its body arrives.
/// With `shared`, the buffer `stream` is a part of, a message's payload is a view of it.
pub(crate) fn next_request(
    stream: &[u8],
    shared: Option<&Bytes>,
) -> Result<Option<(Request, usize)>, RequestError> {
    match next_frame_within(stream, MAX_REQUEST_BYTES) {
        Err(e) => Err(RequestError::Frame(e)),
        Ok(None) => Ok(None),
        Ok(Some((body, used))) => match match shared {
            Some(all) => Request::decode_within(all, body),
            None => Request::decode(body),
        } {
            Ok(r) => Ok(Some((r, used))),
            Err(e) => Err(RequestError::Undecodable(e)),
        },
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    #[error("bad frame: {0}")]
    Frame(DecodeError),
    #[error("undecodable request: {0}")]
    Undecodable(DecodeError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reseal::tests::view;
    use conclave_wire::client::next_frame;

    /// The acknowledgements a session framed, as (group, view index, count).
    fn framed(s: &Session) -> Vec<(String, u64, u16)> {
        let bytes = s.pending.to_vec();
        let mut at = 0;
        let mut out = Vec::new();
        while let Some((body, used)) = next_frame(&bytes[at..]).unwrap() {
            at += used;
            out.push(match Reply::decode(body).unwrap() {
                Reply::SentRun {
                    group, view, count, ..
                } => (group, view.index, count),
                Reply::Event(ClientEvent::Sent { group, view, .. }) => (group, view.index, 1),
                r => panic!("not an acknowledgement: {r:?}"),
            });
        }
        out
    }

    #[test]
    fn a_run_ends_at_its_bound_and_at_a_new_view() {
        let mut s = Session::new();
        let agreed = ServiceType::Agreed;
        let mut runs_framed = 0;
        for _ in 0..MAX_SENT_RUN as usize + 1 {
            runs_framed += s.sent("g".into(), agreed, view(1)) as usize;
        }
        runs_framed += s.sent("g".into(), agreed, view(2)) as usize;
        s.frame_sent_run();
        assert!(!s.nothing_pending() && s.sent_run.is_none());
        assert_eq!(
            framed(&s),
            [
                ("g".to_string(), 1, MAX_SENT_RUN),
                ("g".to_string(), 1, 1),
                ("g".to_string(), 2, 1),
            ]
        );
        assert_eq!(runs_framed, 2);
        assert_eq!(s.pending_replies, 3);
    }
}
