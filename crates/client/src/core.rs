//! The pure part of a client session ([`SessionCore`]): the handshake, splitting the daemon's
//! byte stream into replies, checking commands before they travel, the groups the client is in
//! as the daemon says, and the window of messages on their way. No I/O here; [`crate::Client`]
//! drives it, and so can a simulator.
//!
//! Commands are checked once, by the same [`ClientCommand::validate`] the daemon runs, then
//! against what the session knows: the groups it is in or joining and not leaving. A join or
//! leave counts from when it is sent; the daemon's `Joined` or `Left` confirms it, and a refusal
//! (which names the request it refuses) rolls it back, so a join the daemon refused can be sent
//! again and a message to that group is refused here. A message takes one place in the window
//! per group, given back when the daemon acknowledges it in that group (`Sent`) or refuses it.

use bytes::{Bytes, BytesMut};
use conclave_wire::client::{
    frame, frame_multicast_into, next_frame, validate_multicast, ClientCommand, ClientEvent,
    Refusal, Reply, Request,
};
use conclave_wire::gcs::ServiceType;
use conclave_wire::DecodeError;
use std::collections::{BTreeMap, VecDeque};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("the daemon refused ({code}): {reason}")]
    Refused { code: Refusal, reason: String },
    #[error("the connection to the daemon is lost")]
    Disconnected,
    #[error("the daemon closed the session: {0}")]
    Closed(String),
    #[error("the daemon sent something undecodable: {0}")]
    Protocol(#[from] DecodeError),
    /// The application left more events untaken than the library holds; the session is closed,
    /// as the daemon would have closed it for not reading.
    #[error("{waiting} events were left untaken; the session is closed")]
    Overflow { waiting: usize },
    #[error("{0}")]
    Invalid(String),
    #[error("connecting: {0}")]
    Io(String),
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        ClientError::Io(e.to_string())
    }
}

/// Bytes of a buffer the daemon's stream is read into.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Splits replies off the daemon's byte stream. A message's payload is a view of the buffer it
/// was read into (see [`ClientEvent::Message`]).
/// Its `Debug` gives sizes only: what it read may hold a group's key (`ViewKey`) or a message.
#[derive(Default)]
pub struct ReplyDecoder {
    buf: BytesMut,
    /// Whole frames split off `buf` at once, decoded from `at` on: the frames of one read share
    /// one split, and each message's payload is a view of it. Split off frame by frame, a
    /// message cost six updates of the buffer's reference count instead of two.
    frames: Bytes,
    at: usize,
    /// The last view's member lists, shared with the next view that has the same ones.
    lists: conclave_wire::client::NameLists,
    /// What is left to hand out of a run of acknowledgements ([`Reply::SentRun`]).
    run: Option<(ClientEvent, u16)>,
}

impl ReplyDecoder {
    /// Room to read into. Once less than 16 KiB is free, the buffer is read into again from its
    /// start if no message read into it is still held, and otherwise a fresh one of
    /// [`READ_BUFFER_BYTES`] takes over (with the start of a reply that did not fit the last):
    /// a buffer a message keeps is never larger than that and such a start.
    pub fn buffer(&mut self) -> &mut BytesMut {
        if self.at == self.frames.len() {
            // Decoded: what keeps the buffer now is only what the application holds.
            self.frames = Bytes::new();
            self.at = 0;
        }
        if self.buf.capacity() - self.buf.len() < 16 * 1024
            && !self.buf.try_reclaim(READ_BUFFER_BYTES)
        {
            let mut fresh = BytesMut::with_capacity(self.buf.len() + READ_BUFFER_BYTES);
            fresh.extend_from_slice(&self.buf);
            self.buf = fresh;
        }
        &mut self.buf
    }

    /// The next complete reply, if one has arrived. A run of acknowledgements comes out as
    /// its `Sent` events, one at a time, before whatever follows it.
    pub fn next_reply(&mut self) -> Result<Option<Reply>, DecodeError> {
        if let Some((sent, left)) = self.run.take() {
            if left > 1 {
                self.run = Some((sent.clone(), left - 1));
            }
            return Ok(Some(Reply::Event(sent)));
        }
        if self.at == self.frames.len() && !self.split_frames()? {
            return Ok(None);
        }
        let Some((body, used)) = next_frame(&self.frames[self.at..])? else {
            // Not reached: `frames` holds whole frames only.
            self.frames = Bytes::new();
            self.at = 0;
            return Ok(None);
        };
        let reply = Reply::decode_within(&self.frames, body, &mut self.lists);
        self.at += used;
        match reply?.into_sent_run() {
            Ok(run) => {
                self.run = Some(run);
                self.next_reply()
            }
            Err(reply) => Ok(Some(reply)),
        }
    }
}

impl std::fmt::Debug for ReplyDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyDecoder")
            .field("unread", &self.buf.len())
            .field("undecoded", &(self.frames.len() - self.at))
            .finish()
    }
}

impl ReplyDecoder {
    /// Splits the whole frames `buf` holds off it, into `frames`; false if it holds none. A
    /// malformed frame's header stays in `buf`, after the frames before it, and is reported
    /// once they are decoded.
    fn split_frames(&mut self) -> Result<bool, DecodeError> {
        let mut end = 0;
        loop {
            match next_frame(&self.buf[end..]) {
                Ok(Some((_, used))) => end += used,
                Ok(None) => break,
                Err(e) if end == 0 => return Err(e),
                Err(_) => break,
            }
        }
        if end == 0 {
            self.frames = Bytes::new();
            self.at = 0;
            return Ok(false);
        }
        self.frames = self.buf.split_to(end).freeze();
        self.at = 0;
        Ok(true)
    }
}

/// Payload bytes one place in the window stands for: a larger message takes a place for each
/// such part (rounded up) per group, so that the window bounds bytes on their way as well as
/// messages. The default window of 256 then holds at most 8 MiB of large messages, half of what a
/// daemon holds for one client by default (`max_held_bytes_per_client`); counted in messages
/// alone, 256 messages of 64 KiB passed it, and the daemon refused a sender's messages as fast
/// as the window gave their places back.
pub const PLACE_BYTES: usize = 32 << 10;

/// Places a message of `len` payload bytes takes in each of its `groups` groups, in a window of
/// `window` (never more than the window holds, so that every message can go).
pub fn places(len: usize, groups: usize, window: usize) -> usize {
    len.div_ceil(PLACE_BYTES)
        .clamp(1, (window / groups.max(1)).max(1))
}

/// What a reply means for the application and the window.
#[derive(Debug, PartialEq, Eq)]
pub enum Handled {
    /// Hand this to the application.
    Event(ClientEvent),
    /// A request of the application was refused.
    Refused { code: Refusal, reason: String },
    /// The session ended (the daemon closed it).
    Closed(String),
    /// The daemon asks the client to prove it holds the key of its name: sign
    /// [`conclave_wire::client::proof_message`] of these and send it ([`SessionCore::prove`]).
    Challenge { name: String, nonce: [u8; 32] },
    /// Nothing for the application (the handshake's reply).
    Nothing,
}

/// The client side of one session with a daemon.
#[derive(Debug)]
pub struct SessionCore {
    /// The name the daemon gave, once connected.
    name: Option<String>,
    /// Requests sent on this connection (the connect is the first).
    requests: u64,
    /// Groups joined, as the daemon confirmed them (with the VS flag).
    groups: BTreeMap<String, bool>,
    /// Joins and leaves sent and not yet confirmed, by request.
    joining: BTreeMap<u64, String>,
    leaving: BTreeMap<u64, String>,
    /// Messages sent and not yet acknowledged, by group, oldest first (a client's messages to
    /// one group are accepted in the order it sent them).
    unacked: BTreeMap<String, VecDeque<u64>>,
    /// The same messages, oldest first, with the groups that have not acknowledged them yet
    /// and the places each takes per group.
    pending: VecDeque<(u64, usize, usize)>,
    /// Places in the window, and how many are taken.
    window: usize,
    in_flight: usize,
    /// The daemon's stream, for a driver that hands it over as bytes.
    input: ReplyDecoder,
}

impl SessionCore {
    /// A session that will hold at most `window` places of messages on their way (one per group
    /// for each [`PLACE_BYTES`] of a message, or part of it).
    pub fn new(window: usize) -> SessionCore {
        SessionCore {
            name: None,
            requests: 0,
            groups: BTreeMap::new(),
            joining: BTreeMap::new(),
            leaving: BTreeMap::new(),
            unacked: BTreeMap::new(),
            pending: VecDeque::new(),
            window: window.max(1),
            in_flight: 0,
            input: ReplyDecoder::default(),
        }
    }

    /// The connect request, framed.
    pub fn connect(&mut self, name: &str) -> Vec<u8> {
        self.requests += 1;
        frame(
            &Request::Connect {
                name: name.to_owned(),
            }
            .encode(),
        )
    }

    /// The proof of the client's name (its signature of the challenge), framed.
    pub fn prove(&mut self, signature: Vec<u8>) -> Vec<u8> {
        self.requests += 1;
        frame(&Request::Prove { signature }.encode())
    }

    /// The disconnect request, framed.
    pub fn disconnect(&mut self) -> Vec<u8> {
        self.requests += 1;
        frame(&Request::Disconnect.encode())
    }

    /// The request for `group`'s keys from the daemons ([`Request::Keys`]), framed: from now
    /// on each view of the group comes with its key ([`ClientEvent::ViewKey`]). Sent before the
    /// join, so that the first view has its key; a leave ends it.
    pub fn keys(&mut self, group: &str) -> Result<Vec<u8>, ClientError> {
        // The name's checks are a command's.
        let group = group.to_owned();
        ClientCommand::Leave {
            group: group.clone(),
        }
        .validate()
        .map_err(|(code, reason)| ClientError::Refused { code, reason })?;
        self.requests += 1;
        Ok(frame(&Request::Keys { group }.encode()))
    }

    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Groups the client is in, as the daemon confirmed them.
    pub fn groups(&self) -> impl Iterator<Item = &str> {
        self.groups.keys().map(String::as_str)
    }

    /// Places the window has free now.
    pub fn window_free(&self) -> usize {
        self.window - self.in_flight
    }

    /// Places a message of `len` bytes to `groups` groups takes in this session's window.
    pub fn places(&self, len: usize, groups: usize) -> usize {
        places(len, groups, self.window) * groups
    }

    fn joining(&self, g: &str) -> bool {
        self.joining.values().any(|x| x == g)
    }

    fn leaving(&self, g: &str) -> bool {
        self.leaving.values().any(|x| x == g)
    }

    /// In the group, or joining it, and not leaving it: as the daemon will see it.
    fn member(&self, g: &str) -> bool {
        (self.groups.contains_key(g) || self.joining(g)) && !self.leaving(g)
    }

    /// Checks a command without changing anything: what the daemon would refuse for its form,
    /// for the session's groups, or because a message could never fit the window.
    pub fn check(&self, cmd: &ClientCommand) -> Result<(), ClientError> {
        cmd.validate()
            .map_err(|(code, reason)| ClientError::Refused { code, reason })?;
        let refuse = |code, reason: String| Err(ClientError::Refused { code, reason });
        match cmd {
            ClientCommand::Join { group, .. } => {
                if self.member(group) || self.leaving(group) && self.joining(group) {
                    return refuse(
                        Refusal::AlreadyMember,
                        format!("already in group {group:?}"),
                    );
                }
            }
            ClientCommand::Leave { group } => {
                if !self.member(group) {
                    return refuse(Refusal::NotMember, format!("not in group {group:?}"));
                }
            }
            ClientCommand::Multicast { groups, .. } => self.check_groups(groups)?,
            // A group being left may still have a flush to acknowledge.
            ClientCommand::FlushAck { group, .. } => {
                if !self.groups.contains_key(group) && !self.joining(group) {
                    return refuse(Refusal::NotMember, format!("not in group {group:?}"));
                }
            }
        }
        Ok(())
    }

    /// What the session would refuse of a message to `groups` of `payload_len` bytes.
    pub fn check_multicast<G: AsRef<str>>(
        &self,
        groups: &[G],
        payload_len: usize,
    ) -> Result<(), ClientError> {
        validate_multicast(groups, payload_len)
            .map_err(|(code, reason)| ClientError::Refused { code, reason })?;
        self.check_groups(groups)
    }

    fn check_groups<G: AsRef<str>>(&self, groups: &[G]) -> Result<(), ClientError> {
        if let Some(g) = groups.iter().map(AsRef::as_ref).find(|g| !self.member(g)) {
            return Err(ClientError::Refused {
                code: Refusal::NotMember,
                reason: format!("not in group {g:?}"),
            });
        }
        if groups.len() > self.window {
            return Err(ClientError::Invalid(format!(
                "a message to {} groups needs a window of at least {} (it is {})",
                groups.len(),
                groups.len(),
                self.window
            )));
        }
        Ok(())
    }

    /// [`SessionCore::command`] of a message from borrowed parts, framed onto `out`: the
    /// sending path copies the payload once, into `out`.
    pub fn multicast_into(
        &mut self,
        service: ServiceType,
        groups: &[&str],
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ClientError> {
        self.check_multicast(groups, payload.len())?;
        self.count_multicast(groups, payload.len());
        frame_multicast_into(out, service, groups, payload);
        Ok(())
    }

    /// Counts a message that may go (checked, with room in the window) as sent.
    fn count_multicast<G: AsRef<str>>(&mut self, groups: &[G], payload_len: usize) {
        assert!(
            self.places(payload_len, groups.len()) <= self.window_free(),
            "a message is sent only with room in the window"
        );
        self.requests += 1;
        let k = self.requests;
        let each = places(payload_len, groups.len(), self.window);
        self.in_flight += each * groups.len();
        for g in groups {
            let g = g.as_ref();
            match self.unacked.get_mut(g) {
                Some(q) => q.push_back(k),
                None => {
                    self.unacked.insert(g.to_owned(), VecDeque::from([k]));
                }
            }
        }
        self.pending.push_back((k, groups.len(), each));
    }

    /// Checks a command and, if it may go, counts it and gives it framed. A message must have
    /// room in the window ([`SessionCore::window_free`]) first.
    pub fn command(&mut self, cmd: ClientCommand) -> Result<Vec<u8>, ClientError> {
        self.check(&cmd)?;
        if let ClientCommand::Multicast {
            groups, payload, ..
        } = &cmd
        {
            self.count_multicast(groups, payload.len());
            return Ok(frame(&Request::Command(cmd).encode()));
        }
        self.requests += 1;
        let k = self.requests;
        match &cmd {
            ClientCommand::Join { group, .. } => {
                self.joining.insert(k, group.clone());
            }
            ClientCommand::Leave { group } => {
                self.leaving.insert(k, group.clone());
            }
            ClientCommand::Multicast { .. } | ClientCommand::FlushAck { .. } => {}
        }
        Ok(frame(&Request::Command(cmd).encode()))
    }

    /// Room to read the daemon's bytes into.
    pub fn buffer(&mut self) -> &mut BytesMut {
        self.input.buffer()
    }

    /// What was read and not yet split into replies, for a driver that splits them itself from
    /// here on.
    pub fn take_input(&mut self) -> ReplyDecoder {
        std::mem::take(&mut self.input)
    }

    /// The next complete reply in what was read, handled.
    pub fn next_reply(&mut self) -> Result<Option<Handled>, DecodeError> {
        Ok(self.input.next_reply()?.map(|r| self.handle(r)))
    }

    /// What one reply of the daemon means: the session's state follows it. Replies should come
    /// through [`ReplyDecoder`], which hands a run of acknowledgements out one by one: a run
    /// given here whole counts all its acknowledgements but makes one event.
    pub fn handle(&mut self, reply: Reply) -> Handled {
        match reply {
            Reply::Connected { name } => {
                self.name = Some(name);
                Handled::Nothing
            }
            Reply::Challenge { name, nonce } => Handled::Challenge { name, nonce },
            Reply::Refused {
                request,
                code,
                reason,
            } => {
                self.joining.remove(&request);
                self.leaving.remove(&request);
                if let Some(at) = self.pending.iter().position(|(k, ..)| *k == request) {
                    let (_, left, each) = self.pending.remove(at).expect("found");
                    self.in_flight -= left * each;
                    for q in self.unacked.values_mut() {
                        q.retain(|k| *k != request);
                    }
                }
                Handled::Refused { code, reason }
            }
            // A decoder of the stream hands a run out as its events ([`ReplyDecoder`]); one
            // given whole counts all its acknowledgements, and the application hears of the run
            // once.
            run @ Reply::SentRun { .. } => {
                let Ok((sent, count)) = run.into_sent_run() else {
                    return Handled::Nothing;
                };
                if let ClientEvent::Sent { group, .. } = &sent {
                    for _ in 0..count {
                        self.acknowledged(group);
                    }
                }
                Handled::Event(sent)
            }
            Reply::Event(ClientEvent::Closed { reason }) => Handled::Closed(reason),
            Reply::Event(ev) => {
                match &ev {
                    ClientEvent::Joined { group, vs } => {
                        self.groups.insert(group.clone(), *vs);
                        confirmed(&mut self.joining, group);
                    }
                    ClientEvent::Left { group } => {
                        self.groups.remove(group);
                        confirmed(&mut self.leaving, group);
                    }
                    ClientEvent::Sent { group, .. } => self.acknowledged(group),
                    _ => {}
                }
                Handled::Event(ev)
            }
        }
    }

    /// The daemon accepted the oldest message in `group` still unacknowledged there (a client's
    /// messages to one group are accepted in the order it sent them).
    fn acknowledged(&mut self, group: &str) {
        let Some(k) = self.unacked.get_mut(group).and_then(VecDeque::pop_front) else {
            return;
        };
        if let Some(at) = self.pending.iter().position(|(p, ..)| *p == k) {
            let (_, left, each) = &mut self.pending[at];
            self.in_flight -= *each;
            *left -= 1;
            if *left == 0 {
                self.pending.remove(at);
            }
        }
    }
}

/// The daemon confirmed the oldest join (or leave) of `group` still on its way.
fn confirmed(asked: &mut BTreeMap<u64, String>, group: &str) {
    if let Some(k) = asked.iter().find(|(_, g)| *g == group).map(|(k, _)| *k) {
        asked.remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_wire::client::{GroupViewId, Reply};
    use conclave_wire::gcs::{RingId, ServiceType, MAX_PAYLOAD_BYTES};

    fn join(g: &str) -> ClientCommand {
        ClientCommand::Join {
            group: g.into(),
            vs: false,
        }
    }
    fn msg(groups: &[&str], n: usize) -> ClientCommand {
        ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            payload: vec![0; n].into(),
        }
    }
    fn sent(g: &str) -> Reply {
        Reply::Event(ClientEvent::Sent {
            group: g.into(),
            service: ServiceType::Agreed,
            payload: Default::default(),
            view: GroupViewId {
                ring: RingId {
                    seq: 1,
                    rep: 1,
                    inc: 0,
                },
                index: 0,
            },
        })
    }
    fn refused(request: u64, code: Refusal) -> Reply {
        Reply::Refused {
            request,
            code,
            reason: "no".into(),
        }
    }
    fn connected() -> SessionCore {
        let mut s = SessionCore::new(4);
        s.connect("a");
        s.handle(Reply::Connected {
            name: "a#d1".into(),
        });
        s
    }

    /// The replies `bytes` hold, read `chunk` bytes at a time.
    fn decoded_in_chunks(bytes: &[u8], chunk: usize) -> Vec<Reply> {
        let mut d = ReplyDecoder::default();
        let mut got = Vec::new();
        for c in bytes.chunks(chunk) {
            d.buffer().extend_from_slice(c);
            while let Some(r) = d.next_reply().unwrap() {
                got.push(r);
            }
        }
        got
    }

    #[test]
    fn replies_split_off_a_stream_in_any_chunking() {
        let replies = vec![
            Reply::Connected {
                name: "a#d1".into(),
            },
            Reply::Event(ClientEvent::Left { group: "g".into() }),
            refused(2, Refusal::NotMember),
        ];
        let bytes: Vec<u8> = replies.iter().flat_map(|r| frame(&r.encode())).collect();
        for chunk in [1, 3, 7, bytes.len()] {
            assert_eq!(decoded_in_chunks(&bytes, chunk), replies);
        }
        let mut d = ReplyDecoder::default();
        d.buffer().extend_from_slice(&[0, 0, 0, 2, 9, 9]);
        assert!(d.next_reply().is_err());
        // What came before a frame that cannot be read is handed out first, then the error:
        // a body that does not decode, and a length past the limit.
        let good = frame(&replies[1].encode());
        for bad in [vec![0, 0, 0, 2, 9, 9], vec![0xff; 8]] {
            let mut d = ReplyDecoder::default();
            d.buffer().extend_from_slice(&good);
            d.buffer().extend_from_slice(&good);
            d.buffer().extend_from_slice(&bad);
            assert_eq!(d.next_reply().unwrap().as_ref(), Some(&replies[1]));
            assert_eq!(d.next_reply().unwrap().as_ref(), Some(&replies[1]));
            assert!(d.next_reply().is_err());
        }
    }

    #[test]
    fn a_decoders_debug_shows_sizes_not_what_it_read() {
        let mut d = ReplyDecoder::default();
        let secret = frame(&message(b"k3y-bytes-of-a-group".to_vec()).encode());
        d.buffer().extend_from_slice(&secret);
        d.buffer().extend_from_slice(&secret[..10]);
        assert_eq!(
            format!("{d:?}"),
            format!(
                "ReplyDecoder {{ unread: {}, undecoded: 0 }}",
                secret.len() + 10
            )
        );
        assert!(d.next_reply().unwrap().is_some());
        assert_eq!(
            format!("{d:?}"),
            "ReplyDecoder { unread: 10, undecoded: 0 }"
        );
        // Nor does the session's, which holds one.
        let mut s = SessionCore::new(4);
        s.buffer().extend_from_slice(&secret);
        let shown = format!("{s:?}");
        assert!(
            shown.contains("ReplyDecoder") && !shown.contains("k3y"),
            "{shown}"
        );
    }

    /// A run of `count` acknowledgements in group `g`.
    fn run(g: &str, count: u16) -> Reply {
        let Reply::Event(ClientEvent::Sent {
            group,
            service,
            view,
            ..
        }) = sent(g)
        else {
            unreachable!()
        };
        Reply::SentRun {
            group,
            service,
            view,
            count,
        }
    }

    #[test]
    fn a_run_of_acknowledgements_comes_out_one_by_one_in_its_place() {
        let replies = [run("g", 3), message(vec![1; 10]), run("h", 1), run("g", 2)];
        let bytes: Vec<u8> = replies.iter().flat_map(|r| frame(&r.encode())).collect();
        let want = [
            sent("g"),
            sent("g"),
            sent("g"),
            message(vec![1; 10]),
            sent("h"),
            sent("g"),
            sent("g"),
        ];
        for chunk in [1, 5, bytes.len()] {
            assert_eq!(decoded_in_chunks(&bytes, chunk), want);
        }
    }

    #[test]
    fn a_run_given_whole_gives_back_the_places_of_all_it_acknowledges() {
        let mut s = connected(); // a window of 4
        s.command(join("a")).unwrap();
        for _ in 0..3 {
            s.command(msg(&["a"], 1)).unwrap();
        }
        assert_eq!(s.window_free(), 1);
        assert!(matches!(
            s.handle(run("a", 3)),
            Handled::Event(ClientEvent::Sent { .. })
        ));
        assert_eq!(s.window_free(), 4);
    }

    /// A delivery of `payload` to group g.
    fn message(payload: Vec<u8>) -> Reply {
        Reply::Event(ClientEvent::Message {
            group: "g".into(),
            sender: "a#d1".into(),
            service: ServiceType::Agreed,
            payload: payload.into(),
            view: GroupViewId {
                ring: RingId {
                    seq: 4,
                    rep: 1,
                    inc: 1,
                },
                index: 2,
            },
            transitional: false,
        })
    }

    #[test]
    fn a_messages_payload_is_a_view_of_what_was_read() {
        let message = |k: u8| message(vec![k; 1000]);
        let mut d = ReplyDecoder::default();
        for k in 0..3 {
            d.buffer().extend_from_slice(&frame(&message(k).encode()));
        }
        // The buffer read into, as addresses (compared, never dereferenced).
        let start = d.buffer().as_ptr();
        let read = start..start.wrapping_add(64 * 1024);
        for k in 0..3 {
            let r = d.next_reply().unwrap().unwrap();
            assert_eq!(r, message(k));
            let Reply::Event(ClientEvent::Message { payload, .. }) = r else {
                unreachable!()
            };
            assert!(read.contains(&payload.as_ptr()), "the payload was copied");
        }
        assert!(d.next_reply().unwrap().is_none());
    }

    #[test]
    fn read_buffers_stay_a_reads_size_and_the_start_of_a_reply() {
        let message = |k: u32| {
            let mut payload = vec![7; 900 + (k as usize * 37) % 300];
            payload[..4].copy_from_slice(&k.to_be_bytes());
            message(payload)
        };
        let sent: Vec<Reply> = (0..400).map(message).collect();
        let stream: Vec<u8> = sent.iter().flat_map(|r| frame(&r.encode())).collect();
        // Held by the application, or dropped at once: either way no buffer grows past a read's
        // size and the start of a reply.
        for hold in [true, false] {
            let mut d = ReplyDecoder::default();
            let (mut held, mut got) = (Vec::new(), 0);
            let mut at = 0;
            while at < stream.len() {
                let b = d.buffer();
                assert!(b.capacity() <= READ_BUFFER_BYTES + 1300, "{}", b.capacity());
                // A read takes what is free, up to 16 KiB.
                let n = (b.capacity() - b.len())
                    .min(16 * 1024)
                    .min(stream.len() - at);
                b.extend_from_slice(&stream[at..at + n]);
                at += n;
                while let Some(r) = d.next_reply().unwrap() {
                    assert_eq!(r, sent[got]);
                    got += 1;
                    if hold {
                        held.push(r);
                    }
                }
            }
            assert_eq!(got, sent.len());
        }
    }

    #[test]
    fn bad_commands_are_refused_before_they_travel() {
        let mut s = connected();
        let code = |s: &SessionCore, c: ClientCommand| match s.check(&c) {
            Err(ClientError::Refused { code, .. }) => Some(code),
            Err(e) => panic!("{e}"),
            Ok(()) => None,
        };
        assert_eq!(code(&s, msg(&["g"], 1)), Some(Refusal::NotMember));
        s.command(join("g")).unwrap();
        assert_eq!(code(&s, join("g")), Some(Refusal::AlreadyMember));
        assert_eq!(code(&s, msg(&["g"], 1)), None);
        assert_eq!(code(&s, msg(&["g", "g"], 1)), Some(Refusal::BadGroupList));
        assert_eq!(code(&s, msg(&[], 1)), Some(Refusal::BadGroupList));
        assert_eq!(
            code(&s, msg(&["g"], MAX_PAYLOAD_BYTES + 1)),
            Some(Refusal::PayloadTooLarge)
        );
        assert_eq!(code(&s, join("")), Some(Refusal::BadName));
        s.command(ClientCommand::Leave { group: "g".into() })
            .unwrap();
        assert_eq!(
            code(&s, ClientCommand::Leave { group: "g".into() }),
            Some(Refusal::NotMember)
        );
    }

    #[test]
    fn a_refused_join_is_rolled_back_and_a_confirmed_one_kept() {
        let mut s = connected();
        s.command(join("a")).unwrap(); // request 2
        s.command(join("b")).unwrap(); // request 3
        s.handle(Reply::Event(ClientEvent::Joined {
            group: "a".into(),
            vs: false,
        }));
        s.handle(refused(3, Refusal::TooManyGroups));
        assert_eq!(s.groups().collect::<Vec<_>>(), ["a"]);
        assert!(s.check(&msg(&["b"], 1)).is_err());
        assert!(s.check(&join("b")).is_ok());
        assert!(s.check(&msg(&["a"], 1)).is_ok());
    }

    #[test]
    fn a_large_message_takes_a_place_per_part_in_each_group() {
        let mut s = connected(); // a window of 4
        s.command(join("a")).unwrap();
        s.command(join("b")).unwrap();
        assert_eq!(s.places(1, 1), 1);
        assert_eq!(s.places(PLACE_BYTES, 1), 1);
        assert_eq!(s.places(PLACE_BYTES + 1, 1), 2);
        assert_eq!(s.places(PLACE_BYTES + 1, 2), 4);
        // Never more than the window: every message can go, alone.
        assert_eq!(s.places(100 * PLACE_BYTES, 1), 4);
        assert_eq!(s.places(100 * PLACE_BYTES, 2), 4);
        s.command(msg(&["a", "b"], PLACE_BYTES + 1)).unwrap(); // request 4: all four places
        assert_eq!(s.window_free(), 0);
        s.handle(sent("a"));
        assert_eq!(s.window_free(), 2);
        s.command(msg(&["a"], 2 * PLACE_BYTES)).unwrap(); // request 5
        assert_eq!(s.window_free(), 0);
        // A refusal gives back what is left of the message: its places in the groups that did
        // not take it.
        s.handle(refused(5, Refusal::TooManyHeld));
        assert_eq!(s.window_free(), 2);
        s.handle(sent("b"));
        assert_eq!(s.window_free(), 4);
    }

    #[test]
    fn the_window_counts_groups_and_refusals_give_places_back() {
        let mut s = connected();
        for g in ["a", "b", "c", "d", "e"] {
            s.command(join(g)).unwrap();
        }
        // A message to more groups than the window could ever hold.
        assert!(matches!(
            s.check(&msg(&["a", "b", "c", "d", "e"], 1)),
            Err(ClientError::Invalid(_))
        ));
        s.command(msg(&["a", "b"], 1)).unwrap(); // request 7
        s.command(msg(&["a"], 1)).unwrap(); // request 8
        assert_eq!(s.window_free(), 1);
        s.handle(sent("a"));
        assert_eq!(s.window_free(), 2);
        // The daemon refused request 8: its place comes back, and request 7 still waits in b.
        s.handle(refused(8, Refusal::TooManyHeld));
        assert_eq!(s.window_free(), 3);
        s.handle(sent("b"));
        assert_eq!(s.window_free(), 4);
        // An acknowledgement of nothing changes nothing.
        s.handle(sent("c"));
        assert_eq!(s.window_free(), 4);
    }
}
