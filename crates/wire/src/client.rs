//! The client protocol between a client and its daemon (docs/gcs.md): requests (connect, join,
//! leave, multicast, flush acknowledgement, disconnect) and replies (the daemon's events for the
//! client, and refusals), each a versioned message in a length-prefixed frame for stream
//! transports (TCP, Unix sockets).
//!
//! A frame is a u32 big-endian length (at most [`MAX_FRAME_BYTES`]) and that many bytes: the
//! version, a tag and the fields. [`next_frame`] splits frames off a byte stream without trusting
//! the length.

use crate::codec::{DecodeError, Reader, Writer};
use crate::gcs::{
    read_bool, read_ring, write_ring, RingId, ServiceType, MAX_GROUPS_PER_MESSAGE, MAX_NAME_BYTES,
    MAX_PAYLOAD_BYTES,
};
pub use bytes::Bytes;
use std::sync::Arc;

/// The client protocol version this build speaks.
pub const CLIENT_VERSION: u8 = 4;
/// Most acknowledgements one [`Reply::SentRun`] carries.
pub const MAX_SENT_RUN: u16 = 4096;
/// Most members a view lists.
pub const MAX_VIEW_MEMBERS: usize = 16_384;
/// Longest refusal text, in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Largest frame body: a payload and room for every other field, or a view of the most members.
pub const MAX_FRAME_BYTES: usize = MAX_PAYLOAD_BYTES + 2 * MAX_VIEW_MEMBERS * (MAX_NAME_BYTES + 1);
/// Largest request body: a multicast of the largest payload to the most groups of the longest
/// names (version, tag, service, group count, names, payload length, payload). Replies may be
/// far larger (a view of 16,384 members); a daemon reads requests with this limit.
pub const MAX_REQUEST_BYTES: usize =
    3 + 4 + MAX_GROUPS_PER_MESSAGE * (1 + MAX_NAME_BYTES) + 4 + MAX_PAYLOAD_BYTES;

/// A group view: the ring it belongs to and the group's count of views on that ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupViewId {
    pub ring: RingId,
    pub index: u64,
}

impl GroupViewId {
    /// The id as the wire carries it (ring seq, rep, inc, then index; big-endian), for binding
    /// a key or a signature to the view.
    pub fn to_bytes(&self) -> [u8; 24] {
        // Written in place: a daemon binds a key to a view thousands of times after a
        // configuration change (a test checks this against the wire's own writing).
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&self.ring.seq.to_be_bytes());
        out[8..12].copy_from_slice(&self.ring.rep.to_be_bytes());
        out[12..16].copy_from_slice(&self.ring.inc.to_be_bytes());
        out[16..].copy_from_slice(&self.index.to_be_bytes());
        out
    }
}

/// Why a group view changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Join = 0,
    Leave = 1,
    Disconnect = 2,
    Network = 3,
}

/// What a connected client asks of its daemon about one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientCommand {
    Join {
        group: String,
        /// Ask for flush requests before each view change (virtual synchrony).
        vs: bool,
    },
    Leave {
        group: String,
    },
    /// To one group or several (each gets it in its own view; a client in several of them
    /// receives it once per group).
    Multicast {
        service: ServiceType,
        groups: Vec<String>,
        payload: Bytes,
    },
    /// A VS client has sent all it will send in `view` of `group` (the view named by the flush
    /// request it answers).
    FlushAck {
        group: String,
        view: GroupViewId,
    },
}

/// What a daemon tells (or records for) one of its clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// The daemon accepted the client's join.
    Joined {
        group: String,
        vs: bool,
    },
    /// The daemon accepted the client's leave; nothing more of the group reaches the client.
    Left {
        group: String,
    },
    /// The daemon accepted a message of the client: it is sent in `view`.
    Sent {
        group: String,
        service: ServiceType,
        payload: Bytes,
        view: GroupViewId,
    },
    FlushAcked {
        group: String,
    },
    /// The member lists are shared: a client in many groups of the same members (one group
    /// per shard of a service, say) holds one copy of them, decoded once (see
    /// [`Reply::decode_sharing`]).
    View {
        group: String,
        view: GroupViewId,
        members: Arc<[String]>,
        transitional: Arc<[String]>,
        reason: Reason,
    },
    /// What follows until the next view of `group` is delivered in the transitional part.
    TransitionalSignal {
        group: String,
    },
    /// A VS client must acknowledge before the view after `view` of `group` can be installed.
    FlushRequest {
        group: String,
        view: GroupViewId,
    },
    /// The daemon closed the client's session (it did not answer a flush request in time);
    /// the client is out of every group, as if it had disconnected.
    Closed {
        reason: String,
    },
    /// The key of `view` of `group`, which the daemons derived from their own key (the
    /// integrated architecture, docs/integrated.md): handed only to the view's members that
    /// asked for their group's keys ([`Request::Keys`]), after the view itself.
    ViewKey {
        group: String,
        view: GroupViewId,
        key: KeyBytes,
    },
    Message {
        group: String,
        sender: String,
        service: ServiceType,
        /// As the client library hands it over, a view of the buffer it was read into, not a
        /// copy: keeping it keeps that buffer (64 KiB, shared by the messages read into it; see
        /// the library's docs). An application that keeps a few small messages of many for long
        /// copies them (`Bytes::copy_from_slice`).
        payload: Bytes,
        view: GroupViewId,
        transitional: bool,
    },
}

impl ClientEvent {
    /// The group the event is about (none for the session's end).
    pub fn group(&self) -> Option<&str> {
        match self {
            ClientEvent::Joined { group, .. }
            | ClientEvent::Left { group }
            | ClientEvent::Sent { group, .. }
            | ClientEvent::FlushAcked { group }
            | ClientEvent::View { group, .. }
            | ClientEvent::ViewKey { group, .. }
            | ClientEvent::TransitionalSignal { group }
            | ClientEvent::FlushRequest { group, .. }
            | ClientEvent::Message { group, .. } => Some(group),
            ClientEvent::Closed { .. } => None,
        }
    }
}

/// A 32-byte key on its way from a daemon to a client. Wiped when dropped, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyBytes(pub [u8; 32]);

impl Drop for KeyBytes {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl std::fmt::Debug for KeyBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyBytes(<secret>)")
    }
}

/// Why a daemon refused a request; the refusal's text says more. A code this build does not know
/// (from a newer daemon) decodes as [`Refusal::Other`].
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Undecodable, over the size limit, or out of place (a command before the connect).
    BadRequest,
    /// A second connect on one connection.
    AlreadyConnected,
    /// A client of this name is connected already.
    NameTaken,
    /// A client or group name that is not valid.
    BadName,
    TooManyClients,
    /// A leave, message or acknowledgement for a group the client is not in.
    NotMember,
    /// A join of a group the client is in (or joining).
    AlreadyMember,
    TooManyGroups,
    /// Too many of the client's commands already wait for a view change.
    TooManyHeld,
    PayloadTooLarge,
    /// A message to no group, too many, or one group twice.
    BadGroupList,
    /// The connect, or a request begun, did not arrive in time.
    Timeout,
    /// The daemon holds as many bytes of incomplete requests as it may.
    Overloaded,
    /// The client may not do this: a group of the daemons' own, or one the daemons' access
    /// policy keeps it out of.
    NotAllowed,
    Other(u8),
}

impl Refusal {
    pub fn code(self) -> u8 {
        match self {
            Refusal::BadRequest => 1,
            Refusal::AlreadyConnected => 2,
            Refusal::NameTaken => 3,
            Refusal::BadName => 4,
            Refusal::TooManyClients => 5,
            Refusal::NotMember => 6,
            Refusal::AlreadyMember => 7,
            Refusal::TooManyGroups => 8,
            Refusal::TooManyHeld => 9,
            Refusal::PayloadTooLarge => 10,
            Refusal::BadGroupList => 11,
            Refusal::Timeout => 12,
            Refusal::Overloaded => 13,
            Refusal::NotAllowed => 14,
            Refusal::Other(c) => c,
        }
    }

    pub fn from_code(c: u8) -> Refusal {
        match c {
            1 => Refusal::BadRequest,
            2 => Refusal::AlreadyConnected,
            3 => Refusal::NameTaken,
            4 => Refusal::BadName,
            5 => Refusal::TooManyClients,
            6 => Refusal::NotMember,
            7 => Refusal::AlreadyMember,
            8 => Refusal::TooManyGroups,
            9 => Refusal::TooManyHeld,
            10 => Refusal::PayloadTooLarge,
            11 => Refusal::BadGroupList,
            12 => Refusal::Timeout,
            13 => Refusal::Overloaded,
            14 => Refusal::NotAllowed,
            c => Refusal::Other(c),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Refusal::BadRequest => "bad request",
            Refusal::AlreadyConnected => "already connected",
            Refusal::NameTaken => "name taken",
            Refusal::BadName => "bad name",
            Refusal::TooManyClients => "too many clients",
            Refusal::NotMember => "not a member",
            Refusal::AlreadyMember => "already a member",
            Refusal::TooManyGroups => "too many groups",
            Refusal::TooManyHeld => "too many commands waiting",
            Refusal::PayloadTooLarge => "payload too large",
            Refusal::BadGroupList => "bad group list",
            Refusal::Timeout => "too late",
            Refusal::Overloaded => "daemon overloaded",
            Refusal::NotAllowed => "not allowed",
            Refusal::Other(c) => return write!(f, "refusal {c}"),
        };
        f.write_str(s)
    }
}

impl ClientCommand {
    /// The checks of a command that need no state: names, the group list, the payload's size.
    /// The client library makes them before a command travels, the daemon again when it
    /// arrives; one function, so both refuse the same commands for the same reasons.
    pub fn validate(&self) -> Result<(), (Refusal, String)> {
        match self {
            ClientCommand::Join { group, .. }
            | ClientCommand::Leave { group }
            | ClientCommand::FlushAck { group, .. } => check_name("group", group),
            ClientCommand::Multicast {
                groups, payload, ..
            } => validate_multicast(groups, payload.len()),
        }
    }
}

/// A `what` name's refusal, if it is empty or too long.
fn check_name(what: &str, n: &str) -> Result<(), (Refusal, String)> {
    if n.is_empty() || n.len() > MAX_NAME_BYTES {
        return Err((
            Refusal::BadName,
            format!("a {what} name is 1 to {MAX_NAME_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// What a daemon would refuse of a message to `groups` of `payload_len` bytes, for its form.
pub fn validate_multicast<G: AsRef<str>>(
    groups: &[G],
    payload_len: usize,
) -> Result<(), (Refusal, String)> {
    if groups.is_empty() || groups.len() > MAX_GROUPS_PER_MESSAGE {
        return Err((
            Refusal::BadGroupList,
            format!("a message goes to 1 to {MAX_GROUPS_PER_MESSAGE} groups"),
        ));
    }
    for (i, g) in groups.iter().enumerate() {
        let g = g.as_ref();
        check_name("group", g)?;
        if groups[..i].iter().any(|h| h.as_ref() == g) {
            return Err((Refusal::BadGroupList, format!("group {g:?} is named twice")));
        }
    }
    if payload_len > MAX_PAYLOAD_BYTES {
        return Err((
            Refusal::PayloadTooLarge,
            format!("a payload is at most {MAX_PAYLOAD_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// Appends to `out` the framed request of a message, as
/// `frame(&Request::Command(ClientCommand::Multicast { .. }).encode())` gives it, from borrowed
/// parts (the client library's sending path: no list, name or payload copied on the way). The
/// message must pass [`validate_multicast`].
pub fn frame_multicast_into<G: AsRef<str>>(
    out: &mut Vec<u8>,
    service: ServiceType,
    groups: &[G],
    payload: &[u8],
) {
    frame_with(out, |w| write_multicast(w, service, groups, payload));
}

fn write_multicast<G: AsRef<str>>(
    w: &mut Writer,
    service: ServiceType,
    groups: &[G],
    payload: &[u8],
) {
    w.u8(4);
    w.u8(service as u8);
    w.count(groups.len(), MAX_GROUPS_PER_MESSAGE);
    for g in groups {
        w.name(g.as_ref(), MAX_NAME_BYTES);
    }
    w.bytes(payload, MAX_PAYLOAD_BYTES);
}

/// From a client to its daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// The first request of a connection: the client's name.
    Connect {
        name: String,
    },
    Command(ClientCommand),
    /// The client is leaving: it leaves every group.
    Disconnect,
    /// Hand the client the daemons' key of every view of `group` it is given from now on
    /// ([`ClientEvent::ViewKey`]): the group's keys come from the daemons (the integrated
    /// architecture), not from a key agreement among its members.
    Keys {
        group: String,
    },
    /// The answer to a [`Reply::Challenge`]: the client's signature of
    /// [`proof_message`] with the identity key the daemons' configuration lists for its name.
    Prove {
        signature: Vec<u8>,
    },
}

/// Longest signature a [`Request::Prove`] carries.
pub const MAX_SIGNATURE_BYTES: usize = 128;

/// What a client signs to prove its name: a label, the name the daemon gave it (which names the
/// daemon) and the daemon's fresh nonce, so that a proof serves one connection to one daemon;
/// over TLS also the connection's channel binding (its exporter, [`TLS_EXPORTER_LABEL`]), so
/// that a proof made on one TLS connection cannot be relayed onto another.
pub fn proof_message(name: &str, nonce: &[u8; 32], binding: Option<&[u8; 32]>) -> Vec<u8> {
    let mut w = Writer::with_capacity(96);
    w.raw(b"conclave client proof v1");
    w.name(name, MAX_NAME_BYTES);
    w.raw(nonce);
    if let Some(b) = binding {
        w.raw(b"tls-exporter");
        w.raw(b);
    }
    w.into_vec()
}

/// The label of the TLS exporter (RFC 8446 §7.5, no context, 32 bytes) both ends of a TLS
/// connection take its channel binding from.
pub const TLS_EXPORTER_LABEL: &[u8] = b"EXPORTER-conclave-client-proof";

/// From a daemon to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The connection is accepted under `name`.
    Connected {
        name: String,
    },
    /// The name the client asked for is one the daemons know a key for: it must prove it holds
    /// that key ([`Request::Prove`]) before it is connected as `name`.
    Challenge {
        name: String,
        nonce: [u8; 32],
    },
    Event(ClientEvent),
    /// `count` [`ClientEvent::Sent`] of `group`, `service` and `view` in a row, in one reply:
    /// a sender's acknowledgements are half of what its daemon writes to it, and one each cost
    /// a frame to write and decode for a few bytes of news. A stream's decoder hands them out
    /// one by one (as `conclave_client`'s does), so an application never sees a run.
    SentRun {
        group: String,
        service: ServiceType,
        view: GroupViewId,
        /// From 1 to [`MAX_SENT_RUN`] (a daemon sends a lone acknowledgement as a `Sent`).
        count: u16,
    },
    /// A request was refused (the connection goes on unless the daemon closes it).
    Refused {
        /// Which request of the connection, counting from 1 (the connect).
        request: u64,
        code: Refusal,
        reason: String,
    },
}

/// A view id on the wire: the ring (seq u64, rep u32, inc u32), then the index (u64), big-endian.
/// Key agreement envelopes (`gka`) name their view with it too.
pub(crate) fn write_view(w: &mut Writer, v: &GroupViewId) {
    write_ring(w, &v.ring);
    w.u64(v.index);
}

pub(crate) fn read_view(r: &mut Reader<'_>) -> Result<GroupViewId, DecodeError> {
    Ok(GroupViewId {
        ring: read_ring(r)?,
        index: r.u64("view index")?,
    })
}

fn write_names(w: &mut Writer, names: &[String]) {
    w.count(names.len(), MAX_VIEW_MEMBERS);
    for n in names {
        w.name(n, MAX_NAME_BYTES);
    }
}

/// The member lists of the last view a decoder read, and their bytes on the wire.
#[derive(Debug, Default)]
pub struct NameLists {
    members: SharedNames,
    transitional: SharedNames,
}

#[derive(Debug, Default)]
struct SharedNames {
    bytes: Vec<u8>,
    names: Option<Arc<[String]>>,
}

impl SharedNames {
    /// A list of names: the one held if the wire's bytes are the same, else decoded (and held).
    fn read(
        &mut self,
        r: &mut Reader<'_>,
        what: &'static str,
    ) -> Result<Arc<[String]>, DecodeError> {
        let start = r.position();
        let mut scan = r.clone();
        let n = scan.count(what, MAX_VIEW_MEMBERS)?;
        for _ in 0..n {
            scan.name_ref(what, MAX_NAME_BYTES)?;
        }
        let bytes = r.take(scan.position() - start, what)?;
        if let Some(names) = self.names.as_ref().filter(|_| self.bytes == bytes) {
            return Ok(names.clone());
        }
        let names: Arc<[String]> = read_names(&mut Reader::new(bytes), what)?.into();
        self.bytes.clear();
        self.bytes.extend_from_slice(bytes);
        self.names = Some(names.clone());
        Ok(names)
    }
}

fn read_names(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<String>, DecodeError> {
    let n = r.count(what, MAX_VIEW_MEMBERS)?;
    let mut v = Vec::with_capacity(n.min(r.remaining() / 2));
    for _ in 0..n {
        v.push(r.name(what, MAX_NAME_BYTES)?);
    }
    Ok(v)
}

/// A text cut to [`MAX_TEXT_BYTES`], at a character boundary.
fn write_text(w: &mut Writer, text: &str) {
    let mut end = text.len().min(MAX_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    w.bytes(&text.as_bytes()[..end], MAX_TEXT_BYTES);
}

fn read_text(r: &mut Reader<'_>, what: &'static str) -> Result<String, DecodeError> {
    let b = r.bytes(what, MAX_TEXT_BYTES)?;
    Ok(core::str::from_utf8(b)
        .map_err(|_| DecodeError::BadUtf8 { what })?
        .to_owned())
}

fn service(r: &mut Reader<'_>) -> Result<ServiceType, DecodeError> {
    ServiceType::from_u8(r.u8("service type")?)
}

fn group(r: &mut Reader<'_>) -> Result<String, DecodeError> {
    r.name("group", MAX_NAME_BYTES)
}

/// Checks the version and returns the reader after it.
fn open(mut r: Reader<'_>) -> Result<Reader<'_>, DecodeError> {
    let v = r.u8("version")?;
    if v != CLIENT_VERSION {
        return Err(DecodeError::BadVersion(v));
    }
    Ok(r)
}

impl Request {
    /// The message (without its frame length).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(32);
        w.u8(CLIENT_VERSION);
        match self {
            Request::Connect { name } => {
                w.u8(1);
                w.name(name, MAX_NAME_BYTES);
            }
            Request::Command(ClientCommand::Join { group, vs }) => {
                w.u8(2);
                w.name(group, MAX_NAME_BYTES);
                w.u8(*vs as u8);
            }
            Request::Command(ClientCommand::Leave { group }) => {
                w.u8(3);
                w.name(group, MAX_NAME_BYTES);
            }
            Request::Command(ClientCommand::Multicast {
                service,
                groups,
                payload,
            }) => write_multicast(&mut w, *service, groups, payload),
            Request::Command(ClientCommand::FlushAck { group, view }) => {
                w.u8(5);
                w.name(group, MAX_NAME_BYTES);
                write_view(&mut w, view);
            }
            Request::Disconnect => w.u8(6),
            Request::Keys { group } => {
                w.u8(7);
                w.name(group, MAX_NAME_BYTES);
            }
            Request::Prove { signature } => {
                w.u8(8);
                w.bytes(signature, MAX_SIGNATURE_BYTES);
            }
        }
        w.into_vec()
    }

    pub fn decode(buf: &[u8]) -> Result<Request, DecodeError> {
        Request::read(Reader::new(buf))
    }

    /// [`Request::decode`] of `buf`, a part of `all`, with a message's payload a view of `all`,
    /// not a copy (a daemon decodes what it reads this way).
    pub fn decode_within(all: &Bytes, buf: &[u8]) -> Result<Request, DecodeError> {
        Request::read(Reader::shared_within(all, buf))
    }

    fn read(r: Reader<'_>) -> Result<Request, DecodeError> {
        let mut r = open(r)?;
        let req = match r.u8("request")? {
            1 => Request::Connect {
                name: r.name("client name", MAX_NAME_BYTES)?,
            },
            2 => Request::Command(ClientCommand::Join {
                group: group(&mut r)?,
                vs: read_bool(&mut r, "vs")?,
            }),
            3 => Request::Command(ClientCommand::Leave {
                group: group(&mut r)?,
            }),
            4 => {
                let service = service(&mut r)?;
                let n = r.count("groups", MAX_GROUPS_PER_MESSAGE)?;
                if n == 0 {
                    return Err(DecodeError::Empty { what: "groups" });
                }
                let mut groups = Vec::with_capacity(n.min(r.remaining() / 2));
                for _ in 0..n {
                    groups.push(group(&mut r)?);
                }
                Request::Command(ClientCommand::Multicast {
                    service,
                    groups,
                    payload: r.payload("payload", MAX_PAYLOAD_BYTES)?,
                })
            }
            5 => Request::Command(ClientCommand::FlushAck {
                group: group(&mut r)?,
                view: read_view(&mut r)?,
            }),
            6 => Request::Disconnect,
            7 => Request::Keys {
                group: group(&mut r)?,
            },
            8 => Request::Prove {
                signature: r.bytes("signature", MAX_SIGNATURE_BYTES)?.to_vec(),
            },
            tag => {
                return Err(DecodeError::BadTag {
                    what: "request",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(req)
    }
}

impl Reply {
    /// The message (without its frame length).
    pub fn encode(&self) -> Vec<u8> {
        self.encode_after(Vec::with_capacity(64))
    }

    /// Appends the reply in its frame to `out` (what [`frame`] of [`Reply::encode`] gives,
    /// without the copies: a daemon writes every delivery this way).
    pub fn frame_into(&self, out: &mut Vec<u8>) {
        frame_with(out, |w| self.write(w));
    }

    fn encode_after(&self, buf: Vec<u8>) -> Vec<u8> {
        let mut w = Writer::from_vec(buf);
        w.u8(CLIENT_VERSION);
        self.write(&mut w);
        w.into_vec()
    }

    /// The message after its version.
    fn write(&self, w: &mut Writer) {
        match self {
            Reply::Connected { name } => {
                w.u8(1);
                w.name(name, MAX_NAME_BYTES);
            }
            Reply::Challenge { name, nonce } => {
                w.u8(13);
                w.name(name, MAX_NAME_BYTES);
                w.raw(nonce);
            }
            Reply::SentRun {
                group,
                service,
                view,
                count,
            } => {
                write_acknowledged(w, 14, group, *service, view);
                w.u16(*count);
            }
            Reply::Refused {
                request,
                code,
                reason,
            } => {
                w.u8(2);
                w.u64(*request);
                w.u8(code.code());
                write_text(w, reason);
            }
            Reply::Event(ev) => match ev {
                ClientEvent::Joined { group, vs } => {
                    w.u8(3);
                    w.name(group, MAX_NAME_BYTES);
                    w.u8(*vs as u8);
                }
                ClientEvent::Left { group } => {
                    w.u8(4);
                    w.name(group, MAX_NAME_BYTES);
                }
                ClientEvent::Sent {
                    group,
                    service,
                    payload,
                    view,
                } => {
                    write_acknowledged(w, 5, group, *service, view);
                    w.bytes(payload, MAX_PAYLOAD_BYTES);
                }
                ClientEvent::FlushAcked { group } => {
                    w.u8(6);
                    w.name(group, MAX_NAME_BYTES);
                }
                ClientEvent::View {
                    group,
                    view,
                    members,
                    transitional,
                    reason,
                } => {
                    w.u8(7);
                    w.name(group, MAX_NAME_BYTES);
                    write_view(w, view);
                    write_names(w, members);
                    write_names(w, transitional);
                    w.u8(*reason as u8);
                }
                ClientEvent::TransitionalSignal { group } => {
                    w.u8(8);
                    w.name(group, MAX_NAME_BYTES);
                }
                ClientEvent::FlushRequest { group, view } => {
                    w.u8(9);
                    w.name(group, MAX_NAME_BYTES);
                    write_view(w, view);
                }
                ClientEvent::Closed { reason } => {
                    w.u8(11);
                    write_text(w, reason);
                }
                ClientEvent::ViewKey { group, view, key } => write_view_key(w, group, view, key),
                ClientEvent::Message {
                    group,
                    sender,
                    service,
                    payload,
                    view,
                    transitional,
                } => MessageRef {
                    group,
                    sender,
                    service: *service,
                    view: *view,
                    transitional: *transitional,
                    payload,
                }
                .write(w),
            },
        }
    }

    pub fn decode(buf: &[u8]) -> Result<Reply, DecodeError> {
        Reply::decode_sharing(buf, &mut NameLists::default())
    }

    /// A run of acknowledgements as the `Sent` event each of them stands for, and their count;
    /// any other reply is given back as it is.
    pub fn into_sent_run(self) -> Result<(ClientEvent, u16), Reply> {
        match self {
            Reply::SentRun {
                group,
                service,
                view,
                count,
            } => Ok((
                ClientEvent::Sent {
                    group,
                    service,
                    payload: Bytes::new(),
                    view,
                },
                count,
            )),
            reply => Err(reply),
        }
    }

    /// [`Reply::decode`], taking a view's member lists from `lists` when they are the ones it
    /// holds, byte for byte: after a configuration change a client in hundreds of groups of
    /// the same members gets a view of each, and decodes and keeps their names once.
    pub fn decode_sharing(buf: &[u8], lists: &mut NameLists) -> Result<Reply, DecodeError> {
        Reply::read(Reader::new(buf), lists)
    }

    /// [`Reply::decode_sharing`] of `buf`, a part of `all`, with a message's payload a view of
    /// `all`, not a copy (the client library decodes the frames one read brought this way, all
    /// of them views of one buffer). A `buf` outside `all` is decoded with copies.
    pub fn decode_within(
        all: &Bytes,
        buf: &[u8],
        lists: &mut NameLists,
    ) -> Result<Reply, DecodeError> {
        Reply::read(Reader::shared_within(all, buf), lists)
    }

    fn read(r: Reader<'_>, lists: &mut NameLists) -> Result<Reply, DecodeError> {
        let mut r = open(r)?;
        let ev = |e| Reply::Event(e);
        let reply = match r.u8("reply")? {
            1 => Reply::Connected {
                name: r.name("client name", MAX_NAME_BYTES)?,
            },
            2 => Reply::Refused {
                request: r.u64("refused request")?,
                code: Refusal::from_code(r.u8("refusal code")?),
                reason: read_text(&mut r, "refusal")?,
            },
            3 => ev(ClientEvent::Joined {
                group: group(&mut r)?,
                vs: read_bool(&mut r, "vs")?,
            }),
            4 => ev(ClientEvent::Left {
                group: group(&mut r)?,
            }),
            5 => ev(ClientEvent::Sent {
                group: group(&mut r)?,
                service: service(&mut r)?,
                view: read_view(&mut r)?,
                payload: r.payload("payload", MAX_PAYLOAD_BYTES)?,
            }),
            6 => ev(ClientEvent::FlushAcked {
                group: group(&mut r)?,
            }),
            7 => ev(ClientEvent::View {
                group: group(&mut r)?,
                view: read_view(&mut r)?,
                members: lists.members.read(&mut r, "members")?,
                transitional: lists.transitional.read(&mut r, "transitional set")?,
                reason: match r.u8("reason")? {
                    0 => Reason::Join,
                    1 => Reason::Leave,
                    2 => Reason::Disconnect,
                    3 => Reason::Network,
                    tag => {
                        return Err(DecodeError::BadTag {
                            what: "reason",
                            tag,
                        })
                    }
                },
            }),
            8 => ev(ClientEvent::TransitionalSignal {
                group: group(&mut r)?,
            }),
            9 => ev(ClientEvent::FlushRequest {
                group: group(&mut r)?,
                view: read_view(&mut r)?,
            }),
            11 => ev(ClientEvent::Closed {
                reason: read_text(&mut r, "reason")?,
            }),
            13 => Reply::Challenge {
                name: r.name("client name", MAX_NAME_BYTES)?,
                nonce: r.take(32, "nonce")?.try_into().expect("32 bytes"),
            },
            14 => Reply::SentRun {
                group: group(&mut r)?,
                service: service(&mut r)?,
                view: read_view(&mut r)?,
                count: match r.u16("acknowledgements")? {
                    0 => {
                        return Err(DecodeError::Empty {
                            what: "run of acknowledgements",
                        })
                    }
                    n @ 1..=MAX_SENT_RUN => n,
                    n => {
                        return Err(DecodeError::TooLong {
                            what: "run of acknowledgements",
                            len: n as usize,
                            max: MAX_SENT_RUN as usize,
                        })
                    }
                },
            },
            12 => ev(ClientEvent::ViewKey {
                group: group(&mut r)?,
                view: read_view(&mut r)?,
                key: KeyBytes(r.take(32, "view key")?.try_into().expect("32 bytes")),
            }),
            10 => ev(ClientEvent::Message {
                group: group(&mut r)?,
                sender: r.name("sender", MAX_NAME_BYTES)?,
                service: service(&mut r)?,
                view: read_view(&mut r)?,
                transitional: read_bool(&mut r, "transitional")?,
                payload: r.payload("payload", MAX_PAYLOAD_BYTES)?,
            }),
            tag => return Err(DecodeError::BadTag { what: "reply", tag }),
        };
        r.finish()?;
        Ok(reply)
    }
}

/// Appends to `out` a frame whose message is the version, then what `write` writes.
fn frame_with(out: &mut Vec<u8>, write: impl FnOnce(&mut Writer)) {
    frame_with_tail(out, 0, write)
}

/// [`frame_with`] of a message that `tail` more bytes, not written here, complete.
fn frame_with_tail(out: &mut Vec<u8>, tail: usize, write: impl FnOnce(&mut Writer)) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut w = Writer::from_vec(std::mem::take(out));
    w.u8(CLIENT_VERSION);
    write(&mut w);
    *out = w.into_vec();
    let len = out.len() - start - 4 + tail;
    assert!(len <= MAX_FRAME_BYTES, "a frame over the limit");
    out[start..start + 4].copy_from_slice(&(len as u32).to_be_bytes());
}

/// A delivery's fields, borrowed: framed exactly as `Reply::Event(ClientEvent::Message { .. })`,
/// without building the event (a daemon frames one per delivery to each local member, and the
/// names need not be copied for it).
#[derive(Clone, Copy, Debug)]
pub struct MessageRef<'a> {
    pub group: &'a str,
    pub sender: &'a str,
    pub service: ServiceType,
    pub view: GroupViewId,
    pub transitional: bool,
    pub payload: &'a [u8],
}

impl MessageRef<'_> {
    /// Appends the reply in its frame to `out`, as [`Reply::frame_into`] does.
    pub fn frame_into(&self, out: &mut Vec<u8>) {
        frame_with(out, |w| self.write(w));
    }

    /// [`MessageRef::frame_into`] up to the payload's bytes, which the caller sends right
    /// after: the payload is the message's last field, so the two together are its frame.
    pub fn frame_head_into(&self, out: &mut Vec<u8>) {
        frame_with_tail(out, self.payload.len(), |w| self.write_head(w));
    }

    fn write(&self, w: &mut Writer) {
        self.write_head(w);
        w.raw(self.payload);
    }

    /// The message up to its payload's bytes (its length included).
    fn write_head(&self, w: &mut Writer) {
        w.u8(10);
        w.name(self.group, MAX_NAME_BYTES);
        w.name(self.sender, MAX_NAME_BYTES);
        w.u8(self.service as u8);
        write_view(w, &self.view);
        w.u8(self.transitional as u8);
        w.count(self.payload.len(), MAX_PAYLOAD_BYTES);
    }
}

/// The head a `Sent` (tag 5) and a run of them (tag 14) share: what is acknowledged.
fn write_acknowledged(
    w: &mut Writer,
    tag: u8,
    group: &str,
    service: ServiceType,
    view: &GroupViewId,
) {
    w.u8(tag);
    w.name(group, MAX_NAME_BYTES);
    w.u8(service as u8);
    write_view(w, view);
}

fn write_view_key(w: &mut Writer, group: &str, view: &GroupViewId, key: &KeyBytes) {
    w.u8(12);
    w.name(group, MAX_NAME_BYTES);
    write_view(w, view);
    w.raw(&key.0);
}

/// Appends `Reply::Event(ClientEvent::ViewKey { .. })` in its frame to `out`, from borrowed
/// fields: after a configuration change a daemon hands a key for each of thousands of groups,
/// and the event would copy each group's name only to be written and dropped.
pub fn frame_view_key_into(out: &mut Vec<u8>, group: &str, view: &GroupViewId, key: &KeyBytes) {
    frame_with(out, |w| write_view_key(w, group, view, key));
}

/// A message in its frame: the length, then the message.
pub fn frame(message: &[u8]) -> Vec<u8> {
    assert!(message.len() <= MAX_FRAME_BYTES, "a frame over the limit");
    let mut out = Vec::with_capacity(4 + message.len());
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Splits the first frame off a stream: `Ok(None)` while it is incomplete, the message and the
/// bytes it took otherwise; a length over the limit is an error (the connection should close).
pub fn next_frame(stream: &[u8]) -> Result<Option<(&[u8], usize)>, DecodeError> {
    next_frame_within(stream, MAX_FRAME_BYTES)
}

/// [`next_frame`] with a smaller limit on the frame's length (a daemon reads requests with
/// [`MAX_REQUEST_BYTES`]).
pub fn next_frame_within(stream: &[u8], max: usize) -> Result<Option<(&[u8], usize)>, DecodeError> {
    let Some(len) = stream.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if len > max {
        return Err(DecodeError::TooLong {
            what: "frame",
            len,
            max,
        });
    }
    Ok(stream.get(4..4 + len).map(|m| (m, 4 + len)))
}

#[cfg(test)]
mod frame_into_tests {
    use super::*;

    #[test]
    fn a_run_of_acknowledgements_is_refused_empty_or_past_its_bound() {
        let run = |count| Reply::SentRun {
            group: "g".into(),
            service: ServiceType::Agreed,
            view: GroupViewId {
                ring: crate::gcs::RingId {
                    seq: 1,
                    rep: 1,
                    inc: 0,
                },
                index: 2,
            },
            count,
        };
        for ok in [1, 2, MAX_SENT_RUN] {
            assert_eq!(Reply::decode(&run(ok).encode()).unwrap(), run(ok));
        }
        assert!(matches!(
            Reply::decode(&run(0).encode()),
            Err(DecodeError::Empty { .. })
        ));
        assert!(matches!(
            Reply::decode(&run(MAX_SENT_RUN + 1).encode()),
            Err(DecodeError::TooLong { len, .. }) if len == MAX_SENT_RUN as usize + 1
        ));
    }

    #[test]
    fn frame_into_appends_what_frame_gives() {
        let replies = [
            Reply::Connected {
                name: "a#d1".into(),
            },
            Reply::Refused {
                request: 2,
                code: Refusal::NotMember,
                reason: "no".into(),
            },
            Reply::Event(ClientEvent::Left { group: "g".into() }),
        ];
        let mut out = b"xy".to_vec();
        let mut want = b"xy".to_vec();
        for r in &replies {
            r.frame_into(&mut out);
            want.extend(frame(&r.encode()));
        }
        assert_eq!(out, want);
    }

    #[test]
    fn a_borrowed_message_frames_as_the_event_does() {
        let m = MessageRef {
            group: "g",
            sender: "a#d1",
            service: ServiceType::Safe,
            view: GroupViewId {
                ring: RingId {
                    seq: 7,
                    rep: 2,
                    inc: 1,
                },
                index: 3,
            },
            transitional: true,
            payload: b"payload",
        };
        let ev = Reply::Event(ClientEvent::Message {
            group: m.group.into(),
            sender: m.sender.into(),
            service: m.service,
            payload: m.payload.to_vec().into(),
            view: m.view,
            transitional: m.transitional,
        });
        let (mut out, mut want) = (b"xy".to_vec(), b"xy".to_vec());
        m.frame_into(&mut out);
        ev.frame_into(&mut want);
        assert_eq!(out, want);
        assert_eq!(Reply::decode(&out[6..]).unwrap(), ev);
        // The head and then the payload are the same frame.
        for payload in [&b""[..], b"p", &[7u8; 70_000][..]] {
            let m = MessageRef { payload, ..m };
            let (mut whole, mut split) = (b"xy".to_vec(), b"xy".to_vec());
            m.frame_into(&mut whole);
            m.frame_head_into(&mut split);
            assert_eq!(split.len(), whole.len() - payload.len());
            split.extend_from_slice(payload);
            assert_eq!(split, whole);
        }
    }

    #[test]
    fn views_of_the_same_members_share_their_lists() {
        let view = |group: &str, members: &[&str], transitional: &[&str]| {
            Reply::Event(ClientEvent::View {
                group: group.into(),
                view: GroupViewId {
                    ring: RingId {
                        seq: 1,
                        rep: 1,
                        inc: 0,
                    },
                    index: 2,
                },
                members: members.iter().map(|m| m.to_string()).collect(),
                transitional: transitional.iter().map(|m| m.to_string()).collect(),
                reason: Reason::Network,
            })
        };
        let lists_of = |r: &Reply| match r {
            Reply::Event(ClientEvent::View {
                members,
                transitional,
                ..
            }) => (members.clone(), transitional.clone()),
            _ => panic!("a view"),
        };
        let sent = [
            view("g1", &["a#d1", "b#d2"], &["a#d1"]),
            view("g2", &["a#d1", "b#d2"], &["a#d1"]),
            view("g3", &["a#d1", "c#d3"], &["a#d1"]),
            view("g4", &["a#d1", "c#d3"], &["c#d3"]),
        ];
        let mut lists = NameLists::default();
        let got: Vec<Reply> = sent
            .iter()
            .map(|r| Reply::decode_sharing(&r.encode(), &mut lists).unwrap())
            .collect();
        assert_eq!(got, sent);
        let l: Vec<_> = got.iter().map(lists_of).collect();
        assert!(Arc::ptr_eq(&l[0].0, &l[1].0) && Arc::ptr_eq(&l[0].1, &l[1].1));
        assert!(!Arc::ptr_eq(&l[1].0, &l[2].0) && Arc::ptr_eq(&l[1].1, &l[2].1));
        assert!(Arc::ptr_eq(&l[2].0, &l[3].0) && !Arc::ptr_eq(&l[2].1, &l[3].1));
        // A list cut short is refused, whatever the decoder holds.
        let bytes = sent[0].encode();
        assert!(Reply::decode_sharing(&bytes[..bytes.len() - 4], &mut lists).is_err());
        assert_eq!(Reply::decode_sharing(&bytes, &mut lists).unwrap(), sent[0]);
    }

    #[test]
    fn a_borrowed_view_key_frames_as_the_event_does() {
        let view = GroupViewId {
            ring: RingId {
                seq: 9,
                rep: 4,
                inc: 2,
            },
            index: 5,
        };
        let key = KeyBytes([0x42; 32]);
        let ev = Reply::Event(ClientEvent::ViewKey {
            group: "g1".into(),
            view,
            key: key.clone(),
        });
        let (mut out, mut want) = (b"xy".to_vec(), b"xy".to_vec());
        frame_view_key_into(&mut out, "g1", &view, &key);
        ev.frame_into(&mut want);
        assert_eq!(out, want);
        assert_eq!(Reply::decode(&out[6..]).unwrap(), ev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_largest_request_is_exactly_the_request_limit() {
        let largest = Request::Command(ClientCommand::Multicast {
            service: ServiceType::Safe,
            groups: (0..MAX_GROUPS_PER_MESSAGE)
                .map(|i| format!("{i:0>width$}", width = MAX_NAME_BYTES))
                .collect(),
            payload: Bytes::from(vec![0; MAX_PAYLOAD_BYTES]),
        });
        let framed = frame(&largest.encode());
        assert_eq!(framed.len(), 4 + MAX_REQUEST_BYTES);
        assert!(next_frame_within(&framed, MAX_REQUEST_BYTES)
            .unwrap()
            .is_some());
        let mut over = framed.clone();
        over[..4].copy_from_slice(&(MAX_REQUEST_BYTES as u32 + 1).to_be_bytes());
        assert!(next_frame_within(&over, MAX_REQUEST_BYTES).is_err());
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9.#-]{1,16}"
    }
    fn service() -> impl Strategy<Value = ServiceType> {
        (0u8..6).prop_map(|v| ServiceType::from_u8(v).unwrap())
    }
    fn view() -> impl Strategy<Value = GroupViewId> {
        (any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(
            |(seq, rep, inc, index)| GroupViewId {
                ring: RingId { seq, rep, inc },
                index,
            },
        )
    }
    fn payload() -> impl Strategy<Value = Bytes> {
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from)
    }
    fn command() -> impl Strategy<Value = ClientCommand> {
        prop_oneof![
            (name(), any::<bool>()).prop_map(|(group, vs)| ClientCommand::Join { group, vs }),
            name().prop_map(|group| ClientCommand::Leave { group }),
            (service(), prop::collection::vec(name(), 1..4), payload()).prop_map(
                |(service, groups, payload)| ClientCommand::Multicast {
                    service,
                    groups,
                    payload,
                }
            ),
            (name(), view()).prop_map(|(group, view)| ClientCommand::FlushAck { group, view }),
        ]
    }
    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            name().prop_map(|name| Request::Connect { name }),
            command().prop_map(Request::Command),
            Just(Request::Disconnect),
            name().prop_map(|group| Request::Keys { group }),
            prop::collection::vec(any::<u8>(), 0..=MAX_SIGNATURE_BYTES)
                .prop_map(|signature| Request::Prove { signature }),
        ]
    }
    fn event() -> impl Strategy<Value = ClientEvent> {
        let names = || prop::collection::vec(name(), 0..5);
        let reason = prop_oneof![
            Just(Reason::Join),
            Just(Reason::Leave),
            Just(Reason::Disconnect),
            Just(Reason::Network)
        ];
        prop_oneof![
            (name(), any::<bool>()).prop_map(|(group, vs)| ClientEvent::Joined { group, vs }),
            name().prop_map(|group| ClientEvent::Left { group }),
            (name(), service(), payload(), view()).prop_map(|(group, service, payload, view)| {
                ClientEvent::Sent {
                    group,
                    service,
                    payload,
                    view,
                }
            }),
            name().prop_map(|group| ClientEvent::FlushAcked { group }),
            (name(), view(), names(), names(), reason).prop_map(
                |(group, view, members, transitional, reason)| ClientEvent::View {
                    group,
                    view,
                    members: members.into(),
                    transitional: transitional.into(),
                    reason,
                }
            ),
            name().prop_map(|group| ClientEvent::TransitionalSignal { group }),
            (name(), view()).prop_map(|(group, view)| ClientEvent::FlushRequest { group, view }),
            "[ -~]{0,40}".prop_map(|reason| ClientEvent::Closed { reason }),
            (name(), view(), any::<[u8; 32]>()).prop_map(|(group, view, key)| {
                ClientEvent::ViewKey {
                    group,
                    view,
                    key: KeyBytes(key),
                }
            }),
            (name(), name(), service(), payload(), view(), any::<bool>()).prop_map(
                |(group, sender, service, payload, view, transitional)| ClientEvent::Message {
                    group,
                    sender,
                    service,
                    payload,
                    view,
                    transitional,
                }
            ),
        ]
    }
    fn reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            name().prop_map(|name| Reply::Connected { name }),
            (name(), any::<[u8; 32]>()).prop_map(|(name, nonce)| Reply::Challenge { name, nonce }),
            (any::<u64>(), any::<u8>(), "[ -~]{0,40}").prop_map(|(request, code, reason)| {
                Reply::Refused {
                    request,
                    code: Refusal::from_code(code),
                    reason,
                }
            }),
            (name(), service(), view(), 1..=MAX_SENT_RUN).prop_map(
                |(group, service, view, count)| Reply::SentRun {
                    group,
                    service,
                    view,
                    count,
                }
            ),
            event().prop_map(Reply::Event),
        ]
    }

    proptest! {
        #[test]
        fn a_view_id_in_bytes_is_as_the_wire_writes_it(v in view()) {
            let mut w = Writer::new();
            write_view(&mut w, &v);
            prop_assert_eq!(&v.to_bytes()[..], w.as_slice());
        }

        #[test]
        fn requests_round_trip(q in request()) {
            prop_assert_eq!(Request::decode(&q.encode()).unwrap(), q);
        }

        #[test]
        fn shared_reply_decoding_decodes_alike_and_copies_no_payload(
            p in reply(),
            before in prop::collection::vec(any::<u8>(), 0..40),
            after in prop::collection::vec(any::<u8>(), 0..40),
        ) {
            // The reply among other bytes, as one frame among those of a read.
            let encoded = p.encode();
            let all = Bytes::from([&before[..], &encoded[..], &after[..]].concat());
            let buf = &all[before.len()..before.len() + encoded.len()];
            let q = Reply::decode_within(&all, buf, &mut NameLists::default()).unwrap();
            if let Reply::Event(ClientEvent::Message { payload, .. } | ClientEvent::Sent { payload, .. }) = &q {
                if !payload.is_empty() {
                    prop_assert!(buf.as_ptr_range().contains(&payload.as_ptr()));
                }
            }
            prop_assert_eq!(q, p);
        }

        #[test]
        fn garbage_replies_never_panic(junk in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = Reply::decode(&junk);
            let all = Bytes::from(junk);
            let _ = Reply::decode_within(&all, &all, &mut NameLists::default());
        }

        #[test]
        fn replies_round_trip(p in reply()) {
            prop_assert_eq!(Reply::decode(&p.encode()).unwrap(), p);
        }

        #[test]
        fn truncated_or_extended_messages_are_errors(q in request(), p in reply(), cut in 0usize..64) {
            let (q, p) = (q.encode(), p.encode());
            if cut < q.len() {
                prop_assert!(Request::decode(&q[..cut]).is_err());
            }
            if cut < p.len() {
                prop_assert!(Reply::decode(&p[..cut]).is_err());
            }
            prop_assert!(Request::decode(&[&q[..], &[0]].concat()).is_err());
            prop_assert!(Reply::decode(&[&p[..], &[0]].concat()).is_err());
        }

        #[test]
        fn frames_split_a_stream(qs in prop::collection::vec(request(), 0..6)) {
            let stream: Vec<u8> = qs.iter().flat_map(|q| frame(&q.encode())).collect();
            let mut rest = &stream[..];
            let mut got = Vec::new();
            while let Some((m, used)) = next_frame(rest).unwrap() {
                got.push(Request::decode(m).unwrap());
                rest = &rest[used..];
            }
            prop_assert!(rest.is_empty());
            prop_assert_eq!(got, qs);
        }
    }

    #[test]
    fn an_oversized_frame_length_is_refused_before_reading() {
        let mut b = ((MAX_FRAME_BYTES + 1) as u32).to_be_bytes().to_vec();
        b.extend_from_slice(&[0; 8]);
        assert!(matches!(next_frame(&b), Err(DecodeError::TooLong { .. })));
        assert_eq!(next_frame(&[0, 0]).unwrap(), None);
        assert_eq!(next_frame(&[0, 0, 0, 5, 1]).unwrap(), None);
    }

    #[test]
    fn refusal_codes_round_trip_and_unknown_ones_are_kept() {
        for c in 0..=255u8 {
            assert_eq!(Refusal::from_code(c).code(), c);
        }
        assert_eq!(Refusal::from_code(200), Refusal::Other(200));
    }

    #[test]
    fn the_shared_checks_refuse_malformed_commands() {
        let msg = |groups: &[&str], n: usize| ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            payload: Bytes::from(vec![0; n]),
        };
        let code = |c: ClientCommand| c.validate().err().map(|e| e.0);
        assert_eq!(code(msg(&["a", "b"], 10)), None);
        assert_eq!(code(msg(&[], 1)), Some(Refusal::BadGroupList));
        assert_eq!(code(msg(&["a", "a"], 1)), Some(Refusal::BadGroupList));
        assert_eq!(
            code(msg(&["a"], MAX_PAYLOAD_BYTES + 1)),
            Some(Refusal::PayloadTooLarge)
        );
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(code(msg(&[&long], 1)), Some(Refusal::BadName));
        let join = |g: &str| ClientCommand::Join {
            group: g.into(),
            vs: false,
        };
        assert_eq!(code(join("")), Some(Refusal::BadName));
        assert_eq!(code(join("g")), None);
    }

    #[test]
    fn a_long_refusal_is_cut_at_a_character_boundary() {
        let reason = "é".repeat(MAX_TEXT_BYTES);
        let refusal = Reply::Refused {
            request: 1,
            code: Refusal::BadName,
            reason,
        };
        let Reply::Refused { reason: got, .. } = Reply::decode(&refusal.encode()).unwrap() else {
            panic!("not a refusal");
        };
        assert!(got.len() <= MAX_TEXT_BYTES && got.chars().all(|c| c == 'é'));
    }
}

#[cfg(test)]
mod shared_decode_tests {
    use super::*;

    #[test]
    fn a_request_decoded_within_a_buffer_has_its_payload_as_a_view_of_it() {
        let req = Request::Command(ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: vec!["g".into()],
            payload: Bytes::from(vec![9u8; 100]),
        });
        let body = req.encode();
        let mut stream = vec![0u8; 5];
        stream.extend_from_slice(&body);
        let all = Bytes::from(stream);
        let within = Request::decode_within(&all, &all[5..]).unwrap();
        assert_eq!(within, req);
        let Request::Command(ClientCommand::Multicast { payload, .. }) = within else {
            unreachable!()
        };
        assert!(all.as_ptr_range().contains(&payload.as_ptr()));
        // A part outside the buffer is copied out, as by `decode`.
        let other = body.clone();
        let copied = Request::decode_within(&all, &other).unwrap();
        assert_eq!(copied, req);
        let Request::Command(ClientCommand::Multicast { payload, .. }) = copied else {
            unreachable!()
        };
        assert!(!all.as_ptr_range().contains(&payload.as_ptr()));
    }
}

#[cfg(test)]
mod multicast_frame_tests {
    use super::*;

    #[test]
    fn a_message_framed_from_borrowed_parts_is_the_request_framed() {
        let groups = ["g", "h2", "a-longer-group-name-of-some-bytes"];
        for n in [1, 2, 3] {
            for payload in [vec![], vec![5u8; 1], vec![9u8; 70_000]] {
                let owned = frame(
                    &Request::Command(ClientCommand::Multicast {
                        service: ServiceType::Safe,
                        groups: groups[..n].iter().map(|g| g.to_string()).collect(),
                        payload: Bytes::from(payload.clone()),
                    })
                    .encode(),
                );
                let mut out = vec![1, 2, 3];
                frame_multicast_into(&mut out, ServiceType::Safe, &groups[..n], &payload);
                assert_eq!(&out[..3], &[1, 2, 3]);
                assert_eq!(out[3..], owned[..]);
            }
        }
    }

    #[test]
    fn borrowed_parts_are_validated_as_the_command_is() {
        let long = "n".repeat(MAX_NAME_BYTES + 1);
        let cases: [(&[&str], usize, Option<Refusal>); 7] = [
            (&[], 1, Some(Refusal::BadGroupList)),
            (&["g", "g"], 1, Some(Refusal::BadGroupList)),
            (&[""], 1, Some(Refusal::BadName)),
            (&["g", &long], 1, Some(Refusal::BadName)),
            (
                &["g"],
                MAX_PAYLOAD_BYTES + 1,
                Some(Refusal::PayloadTooLarge),
            ),
            (&["g", "h"], MAX_PAYLOAD_BYTES, None),
            (&["g"], 0, None),
        ];
        for (groups, len, want) in cases {
            let cmd = ClientCommand::Multicast {
                service: ServiceType::Agreed,
                groups: groups.iter().map(|g| g.to_string()).collect(),
                payload: Bytes::from(vec![0u8; len]),
            };
            let got = validate_multicast(groups, len);
            assert_eq!(
                got.as_ref().err().map(|(code, _)| *code),
                want,
                "{groups:?} {len}"
            );
            assert_eq!(got, cmd.validate());
        }
        let too_many: Vec<String> = (0..=MAX_GROUPS_PER_MESSAGE)
            .map(|k| format!("g{k}"))
            .collect();
        assert_eq!(
            validate_multicast(&too_many, 1).map_err(|(code, _)| code),
            Err(Refusal::BadGroupList)
        );
    }
}
