//! Daemon-to-daemon packets of the group communication core (docs/gcs.md): the Totem token,
//! data messages, join messages and the commit token of the membership protocol, and the merge
//! detector. Daemons are numbered (`DaemonId`) by the configuration; a ring is named by a
//! sequence number and its representative.

use crate::codec::{DecodeError, Reader, Writer};
use bytes::Bytes;
use compact_str::CompactString;
use std::sync::Arc;

/// The packet format version this build speaks.
pub const VERSION: u8 = 2;
/// Most daemons in one ring (and in a join's sets).
pub const MAX_RING_MEMBERS: usize = 256;
/// Most sequence numbers a token asks to have retransmitted.
pub const MAX_RTR: usize = 1024;
/// Largest client payload in one data message.
pub const MAX_PAYLOAD_BYTES: usize = 144_000;
/// Most groups one message is addressed to.
pub const MAX_GROUPS_PER_MESSAGE: usize = 100;
/// Longest group or client name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Most (client, group) memberships one daemon reports after a configuration change.
pub const MAX_STATE_ENTRIES: usize = 16_384;

pub type DaemonId = u32;

/// A client message's groups, each with the number of the view it was sent in. Held inline for
/// one group, the usual case: no allocation per message for the list, at each daemon it passes.
pub type MessageGroups = smallvec::SmallVec<[(CompactString, u64); 1]>;

/// A ring (a daemon configuration): its sequence number, its representative, and the
/// representative's incarnation (daemons keep nothing across a crash, so a restarted daemon may
/// count ring numbers again; its incarnation keeps its rings apart from its earlier ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RingId {
    pub seq: u64,
    pub rep: DaemonId,
    pub inc: u32,
}

/// The six service types, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceType {
    Unreliable = 0,
    Reliable = 1,
    Fifo = 2,
    Causal = 3,
    Agreed = 4,
    Safe = 5,
}

impl ServiceType {
    pub(crate) fn from_u8(v: u8) -> Result<Self, DecodeError> {
        Ok(match v {
            0 => ServiceType::Unreliable,
            1 => ServiceType::Reliable,
            2 => ServiceType::Fifo,
            3 => ServiceType::Causal,
            4 => ServiceType::Agreed,
            5 => ServiceType::Safe,
            tag => {
                return Err(DecodeError::BadTag {
                    what: "service type",
                    tag,
                })
            }
        })
    }
}

/// The regular token (TOCS §3.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub ring: RingId,
    /// Grows at every pass, so a retransmitted token is recognized.
    pub token_seq: u64,
    /// Highest sequence number assigned on this ring.
    pub seq: u64,
    /// All received up to: every member holds every message up to here.
    pub aru: u64,
    /// The member that last lowered `aru`.
    pub aru_id: Option<DaemonId>,
    /// Messages sent during the last rotation (flow control).
    pub fcc: u32,
    /// Messages waiting to be sent, summed over the ring (flow control).
    pub backlog: u32,
    /// Sequence numbers some member misses.
    pub rtr: Vec<u64>,
}

impl Token {
    /// The token a ring's representative creates: nothing sent, missing or waiting yet.
    pub fn new(ring: RingId) -> Token {
        Token {
            ring,
            token_seq: 0,
            seq: 0,
            aru: 0,
            aru_id: None,
            fcc: 0,
            backlog: 0,
            rtr: Vec::new(),
        }
    }
}

/// What a data message carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A client's message to one or more groups.
    Client {
        /// Names held inline up to 24 bytes: no allocation per message for the usual names.
        client: CompactString,
        /// Each group, with the number (on this ring) of the group's view the message was sent
        /// in.
        groups: MessageGroups,
        service: ServiceType,
        payload: Bytes,
        /// What a Spread client's message carries beyond a Conclave client's.
        spread: Option<Box<SpreadMeta>>,
    },
    /// A client joins a group (`vs`: it wants flushes before view changes).
    GroupJoin {
        client: String,
        group: String,
        vs: bool,
    },
    GroupLeave {
        client: String,
        group: String,
    },
    /// A client's connection to its daemon ended: it leaves all its groups.
    ClientGone {
        client: String,
    },
    /// The sender has sent everything its clients sent in view number `view` (of this ring) of
    /// `group`: its part of the flush that ends that view.
    Flushed {
        group: String,
        view: u64,
    },
    /// After a configuration change: the group memberships of the sender's clients.
    GroupState {
        members: StateEntries,
    },
    /// During recovery (TOCS §4.3): the sender has retransmitted on the new ring every message
    /// of its old ring it holds that a member of the new ring may lack. Once a member has this
    /// marker from every member, in order, it holds everything of its old ring that anyone who
    /// came with it holds.
    RecoveryDone,
}

/// What a message of a Spread client carries beyond a Conclave client's (docs/spread.md): what
/// a Spread receiver is shown of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpreadMeta {
    /// The hint word as the sender wrote it (its `mess_type` and byte order), forwarded verbatim.
    pub hint: [u8; 4],
    /// The sender does not receive it.
    pub self_discard: bool,
    /// The destinations as the sender listed them, private groups and repeats included; empty
    /// when that list is the message's groups, in their order (the sender named each once), so
    /// the common message carries, decodes and frees no second copy of its names.
    pub names: Vec<String>,
}

/// Longest destination name of a Spread client's message.
pub const MAX_SPREAD_NAME_BYTES: usize = 31;

/// One client's membership of one group, as its daemon reports it after a configuration change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateEntry<'a> {
    pub client: &'a str,
    pub group: &'a str,
    /// The client asked for virtual synchrony.
    pub vs: bool,
    /// The group view the client last installed (its ring and number on that ring), if any.
    pub view: Option<(RingId, u64)>,
}

/// The group memberships of one daemon's clients, as its state-exchange message carries them.
/// Every name is in one buffer: a daemon with thousands of memberships sends, decodes, keeps
/// until every daemon has it, and frees a message of a few allocations, not two per membership.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateEntries {
    names: String,
    entries: Vec<PackedEntry>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PackedEntry {
    /// Where the client's and the group's names are in `names`: start and length.
    client: (u32, u32),
    group: (u32, u32),
    vs: bool,
    view: Option<(RingId, u64)>,
}

impl StateEntries {
    pub fn new() -> StateEntries {
        StateEntries::default()
    }

    pub fn with_capacity(entries: usize) -> StateEntries {
        StateEntries {
            names: String::with_capacity(entries * 16),
            entries: Vec::with_capacity(entries),
        }
    }

    pub fn push(&mut self, client: &str, group: &str, vs: bool, view: Option<(RingId, u64)>) {
        let client = self.store(client);
        let group = self.store(group);
        self.entries.push(PackedEntry {
            client,
            group,
            vs,
            view,
        });
    }

    fn store(&mut self, name: &str) -> (u32, u32) {
        let at = self.names.len();
        self.names.push_str(name);
        // Names are bounded (MAX_NAME_BYTES) and entries are (MAX_STATE_ENTRIES): far below
        // 4 GiB in all.
        (at as u32, name.len() as u32)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = StateEntry<'_>> + '_ {
        let name = |(at, len): (u32, u32)| &self.names[at as usize..(at + len) as usize];
        self.entries.iter().map(move |e| StateEntry {
            client: name(e.client),
            group: name(e.group),
            vs: e.vs,
            view: e.view,
        })
    }
}

impl<'a> FromIterator<StateEntry<'a>> for StateEntries {
    fn from_iter<I: IntoIterator<Item = StateEntry<'a>>>(iter: I) -> StateEntries {
        let mut out = StateEntries::new();
        for e in iter {
            out.push(e.client, e.group, e.vs, e.view);
        }
        out
    }
}

/// A message on the ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Data {
    pub ring: RingId,
    pub seq: u64,
    pub sender: DaemonId,
    /// Set when a member retransmits, during recovery, a message of its old ring: that ring,
    /// the message's sequence number there and its original sender (TOCS §4.3).
    pub origin: Option<(RingId, u64, DaemonId)>,
    /// Shared: a member keeps every message until all have it, and hands it on when delivering.
    pub body: Arc<Body>,
}

/// A join message of the gather phase (TOCS §4.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Join {
    pub sender: DaemonId,
    pub incarnation: u32,
    /// The highest ring sequence number the sender has seen.
    pub ring_seq: u64,
    pub procs: Vec<DaemonId>,
    pub failed: Vec<DaemonId>,
}

/// One member's entry in the commit token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitEntry {
    pub id: DaemonId,
    pub old_ring: RingId,
    pub old_aru: u64,
    pub high_delivered: u64,
    pub filled: bool,
}

/// The commit token of the membership protocol (TOCS §4.2): two rotations around the new ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    pub ring: RingId,
    pub rotation: u8,
    pub members: Vec<CommitEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    Token(Token),
    Data(Data),
    Join(Join),
    Commit(Commit),
    /// A representative's periodic announcement, so that rings that can hear each other merge.
    MergeDetect {
        ring: RingId,
    },
    /// A member with a message to send asks the ring for its idle token: whoever holds it
    /// passes it on now, and the others pass it on at once until it has gone by.
    Wake {
        ring: RingId,
    },
}

pub(crate) fn write_ring(w: &mut Writer, r: &RingId) {
    w.u64(r.seq);
    w.u32(r.rep);
    w.u32(r.inc);
}
pub(crate) fn read_ring(r: &mut Reader<'_>) -> Result<RingId, DecodeError> {
    Ok(RingId {
        seq: r.u64("ring seq")?,
        rep: r.u32("ring rep")?,
        inc: r.u32("ring incarnation")?,
    })
}
fn write_ids(w: &mut Writer, ids: &[DaemonId]) {
    w.count(ids.len(), MAX_RING_MEMBERS);
    for id in ids {
        w.u32(*id);
    }
}
fn read_ids(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<DaemonId>, DecodeError> {
    let n = r.count(what, MAX_RING_MEMBERS)?;
    let mut v = Vec::with_capacity(n.min(r.remaining() / 4));
    for _ in 0..n {
        let id = r.u32(what)?;
        // A set on the wire: a daemon named twice would count twice in consensus.
        if v.contains(&id) {
            return Err(DecodeError::Duplicate { what });
        }
        v.push(id);
    }
    Ok(v)
}
pub(crate) fn read_bool(r: &mut Reader<'_>, what: &'static str) -> Result<bool, DecodeError> {
    match r.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        tag => Err(DecodeError::BadTag { what, tag }),
    }
}

impl Body {
    fn write(&self, w: &mut Writer) {
        match self {
            Body::Client {
                client,
                groups,
                service,
                payload,
                spread,
            } => {
                w.u8(if spread.is_some() { 8 } else { 1 });
                w.name(client, MAX_NAME_BYTES);
                w.count(groups.len(), MAX_GROUPS_PER_MESSAGE);
                for (g, view) in groups {
                    w.name(g, MAX_NAME_BYTES);
                    w.u64(*view);
                }
                w.u8(*service as u8);
                w.bytes(payload, MAX_PAYLOAD_BYTES);
                if let Some(m) = spread {
                    w.raw(&m.hint);
                    w.u8(m.self_discard as u8);
                    w.count(m.names.len(), MAX_GROUPS_PER_MESSAGE);
                    for n in &m.names {
                        w.name(n, MAX_SPREAD_NAME_BYTES);
                    }
                }
            }
            Body::GroupJoin { client, group, vs } => {
                w.u8(2);
                w.name(client, MAX_NAME_BYTES);
                w.name(group, MAX_NAME_BYTES);
                w.u8(*vs as u8);
            }
            Body::GroupLeave { client, group } => {
                w.u8(3);
                w.name(client, MAX_NAME_BYTES);
                w.name(group, MAX_NAME_BYTES);
            }
            Body::ClientGone { client } => {
                w.u8(4);
                w.name(client, MAX_NAME_BYTES);
            }
            Body::Flushed { group, view } => {
                w.u8(5);
                w.name(group, MAX_NAME_BYTES);
                w.u64(*view);
            }
            Body::RecoveryDone => w.u8(6),
            Body::GroupState { members } => {
                w.u8(7);
                w.count(members.len(), MAX_STATE_ENTRIES);
                for e in members.iter() {
                    w.name(e.client, MAX_NAME_BYTES);
                    w.name(e.group, MAX_NAME_BYTES);
                    w.u8(e.vs as u8);
                    match &e.view {
                        None => w.u8(0),
                        Some((ring, index)) => {
                            w.u8(1);
                            write_ring(w, ring);
                            w.u64(*index);
                        }
                    }
                }
            }
        }
    }

    fn read(r: &mut Reader<'_>) -> Result<Body, DecodeError> {
        Ok(match r.u8("body")? {
            tag @ (1 | 8) => {
                let client = r.name_ref("client", MAX_NAME_BYTES)?.into();
                let n = r.count("groups", MAX_GROUPS_PER_MESSAGE)?;
                if n == 0 {
                    return Err(DecodeError::Empty { what: "groups" });
                }
                let mut groups = MessageGroups::with_capacity(n.min(r.remaining() / 2));
                for _ in 0..n {
                    let g: CompactString = r.name_ref("group", MAX_NAME_BYTES)?.into();
                    // A member of the group would receive the message twice.
                    if groups.iter().any(|(x, _): &(CompactString, u64)| *x == g) {
                        return Err(DecodeError::Duplicate { what: "groups" });
                    }
                    groups.push((g, r.u64("view")?));
                }
                let service = ServiceType::from_u8(r.u8("service type")?)?;
                let payload = r.payload("payload", MAX_PAYLOAD_BYTES)?;
                let spread = if tag == 8 {
                    let hint: [u8; 4] = r.take(4, "hint")?.try_into().expect("4 bytes");
                    let self_discard = read_bool(r, "self discard")?;
                    let n = r.count("spread names", MAX_GROUPS_PER_MESSAGE)?;
                    let mut names = Vec::with_capacity(n.min(r.remaining() / 2));
                    for _ in 0..n {
                        names.push(r.name("spread name", MAX_SPREAD_NAME_BYTES)?);
                    }
                    Some(Box::new(SpreadMeta {
                        hint,
                        self_discard,
                        names,
                    }))
                } else {
                    None
                };
                Body::Client {
                    client,
                    groups,
                    service,
                    payload,
                    spread,
                }
            }
            2 => Body::GroupJoin {
                client: r.name("client", MAX_NAME_BYTES)?,
                group: r.name("group", MAX_NAME_BYTES)?,
                vs: read_bool(r, "vs")?,
            },
            3 => Body::GroupLeave {
                client: r.name("client", MAX_NAME_BYTES)?,
                group: r.name("group", MAX_NAME_BYTES)?,
            },
            4 => Body::ClientGone {
                client: r.name("client", MAX_NAME_BYTES)?,
            },
            5 => Body::Flushed {
                group: r.name("group", MAX_NAME_BYTES)?,
                view: r.u64("view")?,
            },
            6 => Body::RecoveryDone,
            7 => {
                let n = r.count("state entries", MAX_STATE_ENTRIES)?;
                let mut members = StateEntries::with_capacity(n.min(r.remaining() / 6));
                let mut seen = std::collections::HashSet::with_capacity(members.entries.capacity());
                for _ in 0..n {
                    let client = r.name_ref("client", MAX_NAME_BYTES)?;
                    let group = r.name_ref("group", MAX_NAME_BYTES)?;
                    // One client's membership of one group, once.
                    if !seen.insert((client, group)) {
                        return Err(DecodeError::Duplicate {
                            what: "state entries",
                        });
                    }
                    let vs = read_bool(r, "vs")?;
                    let view = match r.u8("state view")? {
                        0 => None,
                        1 => Some((read_ring(r)?, r.u64("view index")?)),
                        tag => {
                            return Err(DecodeError::BadTag {
                                what: "state view",
                                tag,
                            })
                        }
                    };
                    members.push(client, group, vs, view);
                }
                Body::GroupState { members }
            }
            tag => return Err(DecodeError::BadTag { what: "body", tag }),
        })
    }
}

impl Packet {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(64);
        self.encode_into(&mut w);
        w.into_vec()
    }

    /// The bytes of the packet's encoding for a client's message (which a daemon uses to choose
    /// the datagram a packet goes in before encoding it there), and a small guess for the other
    /// packets: they are small, or rare.
    pub fn size_hint(&self) -> usize {
        const RING: usize = 16;
        const GUESS: usize = 96;
        match self {
            Packet::Data(d) => match &*d.body {
                Body::Client {
                    client,
                    groups,
                    payload,
                    spread,
                    ..
                } => {
                    let origin = if d.origin.is_some() { 1 + RING + 12 } else { 1 };
                    let header = 2 + RING + 12 + origin;
                    let groups: usize = groups.iter().map(|(g, _)| 1 + g.len() + 8).sum();
                    let spread = spread.as_ref().map_or(0, |m| {
                        4 + 1 + 4 + m.names.iter().map(|n| 1 + n.len()).sum::<usize>()
                    });
                    header + 1 + (1 + client.len()) + 4 + groups + 1 + 4 + payload.len() + spread
                }
                _ => GUESS,
            },
            Packet::Token(t) => GUESS + t.rtr.len() * 8,
            _ => GUESS,
        }
    }

    /// Appends the packet's encoding to `w` (a daemon encodes its packets straight into the
    /// datagrams that carry them).
    pub fn encode_into(&self, w: &mut Writer) {
        w.u8(VERSION);
        match self {
            Packet::Token(t) => {
                w.u8(1);
                write_ring(w, &t.ring);
                w.u64(t.token_seq);
                w.u64(t.seq);
                w.u64(t.aru);
                match t.aru_id {
                    None => w.u8(0),
                    Some(id) => {
                        w.u8(1);
                        w.u32(id);
                    }
                }
                w.u32(t.fcc);
                w.u32(t.backlog);
                w.count(t.rtr.len(), MAX_RTR);
                for s in &t.rtr {
                    w.u64(*s);
                }
            }
            Packet::Data(d) => {
                w.u8(2);
                write_ring(w, &d.ring);
                w.u64(d.seq);
                w.u32(d.sender);
                match &d.origin {
                    None => w.u8(0),
                    Some((ring, seq, sender)) => {
                        w.u8(1);
                        write_ring(w, ring);
                        w.u64(*seq);
                        w.u32(*sender);
                    }
                }
                d.body.write(w);
            }
            Packet::Join(j) => {
                w.u8(3);
                w.u32(j.sender);
                w.u32(j.incarnation);
                w.u64(j.ring_seq);
                write_ids(w, &j.procs);
                write_ids(w, &j.failed);
            }
            Packet::Commit(c) => {
                w.u8(4);
                write_ring(w, &c.ring);
                w.u8(c.rotation);
                w.count(c.members.len(), MAX_RING_MEMBERS);
                for m in &c.members {
                    w.u32(m.id);
                    write_ring(w, &m.old_ring);
                    w.u64(m.old_aru);
                    w.u64(m.high_delivered);
                    w.u8(m.filled as u8);
                }
            }
            Packet::MergeDetect { ring } => {
                w.u8(5);
                write_ring(w, ring);
            }
            Packet::Wake { ring } => {
                w.u8(6);
                write_ring(w, ring);
            }
        }
    }

    pub fn decode(buf: &[u8]) -> Result<Packet, DecodeError> {
        Packet::read(Reader::new(buf))
    }

    /// [`Packet::decode`], with the payloads of client messages views of `buf`, not copies.
    pub fn decode_shared(buf: &Bytes) -> Result<Packet, DecodeError> {
        Packet::read(Reader::shared(buf))
    }

    fn read(mut r: Reader<'_>) -> Result<Packet, DecodeError> {
        let v = r.u8("version")?;
        if v != VERSION {
            return Err(DecodeError::BadVersion(v));
        }
        let p = match r.u8("packet")? {
            1 => {
                let ring = read_ring(&mut r)?;
                let token_seq = r.u64("token seq")?;
                let seq = r.u64("seq")?;
                let aru = r.u64("aru")?;
                let aru_id = match r.u8("aru id")? {
                    0 => None,
                    1 => Some(r.u32("aru id")?),
                    tag => {
                        return Err(DecodeError::BadTag {
                            what: "aru id",
                            tag,
                        })
                    }
                };
                let fcc = r.u32("fcc")?;
                let backlog = r.u32("backlog")?;
                let n = r.count("rtr", MAX_RTR)?;
                let mut rtr = Vec::with_capacity(n.min(r.remaining() / 8));
                for _ in 0..n {
                    rtr.push(r.u64("rtr")?);
                }
                Packet::Token(Token {
                    ring,
                    token_seq,
                    seq,
                    aru,
                    aru_id,
                    fcc,
                    backlog,
                    rtr,
                })
            }
            2 => {
                let ring = read_ring(&mut r)?;
                let seq = r.u64("seq")?;
                let sender = r.u32("sender")?;
                let origin = match r.u8("origin")? {
                    0 => None,
                    1 => Some((
                        read_ring(&mut r)?,
                        r.u64("origin seq")?,
                        r.u32("origin sender")?,
                    )),
                    tag => {
                        return Err(DecodeError::BadTag {
                            what: "origin",
                            tag,
                        })
                    }
                };
                let body = Arc::new(Body::read(&mut r)?);
                Packet::Data(Data {
                    ring,
                    seq,
                    sender,
                    origin,
                    body,
                })
            }
            3 => Packet::Join(Join {
                sender: r.u32("sender")?,
                incarnation: r.u32("incarnation")?,
                ring_seq: r.u64("ring seq")?,
                procs: read_ids(&mut r, "procs")?,
                failed: read_ids(&mut r, "failed")?,
            }),
            4 => {
                let ring = read_ring(&mut r)?;
                let rotation = r.u8("rotation")?;
                let n = r.count("commit members", MAX_RING_MEMBERS)?;
                let mut members = Vec::with_capacity(n.min(r.remaining() / 37));
                for _ in 0..n {
                    let id = r.u32("member")?;
                    if members.iter().any(|m: &CommitEntry| m.id == id) {
                        return Err(DecodeError::Duplicate {
                            what: "commit members",
                        });
                    }
                    members.push(CommitEntry {
                        id,
                        old_ring: read_ring(&mut r)?,
                        old_aru: r.u64("old aru")?,
                        high_delivered: r.u64("high delivered")?,
                        filled: read_bool(&mut r, "filled")?,
                    });
                }
                Packet::Commit(Commit {
                    ring,
                    rotation,
                    members,
                })
            }
            5 => Packet::MergeDetect {
                ring: read_ring(&mut r)?,
            },
            6 => Packet::Wake {
                ring: read_ring(&mut r)?,
            },
            tag => {
                return Err(DecodeError::BadTag {
                    what: "packet",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ring() -> impl Strategy<Value = RingId> {
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(seq, rep, inc)| RingId {
            seq,
            rep,
            inc,
        })
    }
    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9.#-]{1,16}"
    }
    fn service() -> impl Strategy<Value = ServiceType> {
        (0u8..6).prop_map(|v| ServiceType::from_u8(v).unwrap())
    }
    fn body() -> impl Strategy<Value = Body> {
        prop_oneof![
            (
                name(),
                prop::collection::btree_map(name(), any::<u64>(), 1..4),
                service(),
                prop::collection::vec(any::<u8>(), 0..64),
                prop::option::of((
                    any::<[u8; 4]>(),
                    any::<bool>(),
                    prop::collection::vec(name(), 0..4)
                )),
            )
                .prop_map(|(client, groups, service, payload, spread)| Body::Client {
                    client: client.into(),
                    groups: groups.into_iter().map(|(g, v)| (g.into(), v)).collect(),
                    service,
                    payload: payload.into(),
                    spread: spread.map(|(hint, self_discard, names)| {
                        Box::new(SpreadMeta {
                            hint,
                            self_discard,
                            names,
                        })
                    }),
                }),
            (name(), name(), any::<bool>()).prop_map(|(client, group, vs)| Body::GroupJoin {
                client,
                group,
                vs
            }),
            (name(), name()).prop_map(|(client, group)| Body::GroupLeave { client, group }),
            name().prop_map(|client| Body::ClientGone { client }),
            (name(), any::<u64>()).prop_map(|(group, view)| Body::Flushed { group, view }),
            Just(Body::RecoveryDone),
            prop::collection::vec(
                (
                    name(),
                    name(),
                    any::<bool>(),
                    prop::option::of((ring(), any::<u64>()))
                ),
                0..5
            )
            .prop_map(|mut m| Body::GroupState {
                members: {
                    m.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
                    m.dedup_by(|a, b| (&a.0, &a.1) == (&b.0, &b.1));
                    m
                }
                .iter()
                .map(|(client, group, vs, view)| StateEntry {
                    client,
                    group,
                    vs: *vs,
                    view: *view
                })
                .collect()
            }),
        ]
    }
    fn packet() -> impl Strategy<Value = Packet> {
        prop_oneof![
            (
                ring(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<Option<u32>>(),
                any::<u32>(),
                any::<u32>(),
                prop::collection::vec(any::<u64>(), 0..8)
            )
                .prop_map(|(ring, token_seq, seq, aru, aru_id, fcc, backlog, rtr)| {
                    Packet::Token(Token {
                        ring,
                        token_seq,
                        seq,
                        aru,
                        aru_id,
                        fcc,
                        backlog,
                        rtr,
                    })
                }),
            (
                ring(),
                any::<u64>(),
                any::<u32>(),
                prop::option::of((ring(), any::<u64>(), any::<u32>())),
                body()
            )
                .prop_map(|(ring, seq, sender, origin, body)| Packet::Data(Data {
                    ring,
                    seq,
                    sender,
                    origin,
                    body: Arc::new(body),
                })),
            (
                any::<u32>(),
                any::<u32>(),
                any::<u64>(),
                prop::collection::btree_set(any::<u32>(), 0..8),
                prop::collection::btree_set(any::<u32>(), 0..8)
            )
                .prop_map(|(sender, incarnation, ring_seq, procs, failed)| {
                    Packet::Join(Join {
                        sender,
                        incarnation,
                        ring_seq,
                        procs: procs.into_iter().collect(),
                        failed: failed.into_iter().collect(),
                    })
                }),
            (
                ring(),
                any::<u8>(),
                prop::collection::btree_map(
                    any::<u32>(),
                    (ring(), any::<u64>(), any::<u64>(), any::<bool>()),
                    0..6
                )
            )
                .prop_map(|(ring, rotation, m)| Packet::Commit(Commit {
                    ring,
                    rotation,
                    members: m
                        .into_iter()
                        .map(
                            |(id, (old_ring, old_aru, high_delivered, filled))| CommitEntry {
                                id,
                                old_ring,
                                old_aru,
                                high_delivered,
                                filled
                            }
                        )
                        .collect()
                })),
            ring().prop_map(|ring| Packet::MergeDetect { ring }),
            ring().prop_map(|ring| Packet::Wake { ring }),
        ]
    }

    #[test]
    fn member_lists_that_name_one_member_twice_are_refused() {
        let join = Packet::Join(Join {
            sender: 1,
            incarnation: 0,
            ring_seq: 1,
            procs: vec![1, 2, 2],
            failed: vec![],
        });
        assert!(matches!(
            Packet::decode(&join.encode()),
            Err(DecodeError::Duplicate { what: "procs" })
        ));
        let entry = |id| CommitEntry {
            id,
            old_ring: RingId {
                seq: 1,
                rep: 1,
                inc: 0,
            },
            old_aru: 0,
            high_delivered: 0,
            filled: false,
        };
        let commit = Packet::Commit(Commit {
            ring: entry(1).old_ring,
            rotation: 0,
            members: vec![entry(1), entry(3), entry(1)],
        });
        assert!(matches!(
            Packet::decode(&commit.encode()),
            Err(DecodeError::Duplicate { .. })
        ));
        let mut twice = StateEntries::new();
        for client in ["a", "b", "a"] {
            twice.push(client, "g", false, None);
        }
        let twice = Body::GroupState { members: twice };
        let data = |body| {
            Packet::Data(Data {
                ring: entry(1).old_ring,
                seq: 1,
                sender: 1,
                origin: None,
                body: Arc::new(body),
            })
        };
        assert!(Packet::decode(&data(twice).encode()).is_err());
        let to_g_twice = Body::Client {
            client: "c".into(),
            groups: smallvec::smallvec![("g".into(), 1), ("g".into(), 2)],
            service: ServiceType::Agreed,
            payload: Default::default(),
            spread: None,
        };
        assert!(Packet::decode(&data(to_g_twice).encode()).is_err());
    }

    proptest! {
        #[test]
        fn round_trip(p in packet()) {
            let bytes = p.encode();
            prop_assert_eq!(Packet::decode(&bytes).unwrap(), p);
        }

        #[test]
        fn truncated_or_extended_packets_are_errors(p in packet(), cut in any::<prop::sample::Index>()) {
            let bytes = p.encode();
            prop_assert!(Packet::decode(&bytes[..cut.index(bytes.len())]).is_err());
            let mut longer = bytes.clone();
            longer.push(7);
            prop_assert_eq!(Packet::decode(&longer).unwrap_err(), DecodeError::Trailing(1));
        }

        #[test]
        fn a_client_messages_size_hint_is_its_size(p in packet()) {
            if let Packet::Data(d) = &p {
                if let Body::Client { .. } = &*d.body {
                    prop_assert_eq!(p.size_hint(), p.encode().len());
                }
            }
        }

        #[test]
        fn shared_decoding_decodes_alike_and_copies_no_payload(p in packet()) {
            let bytes = Bytes::from(p.encode());
            let q = Packet::decode_shared(&bytes).unwrap();
            if let Packet::Data(d) = &q {
                if let Body::Client { payload, .. } = &*d.body {
                    if !payload.is_empty() {
                        let within = bytes.as_ptr_range();
                        prop_assert!(within.contains(&payload.as_ptr()));
                    }
                }
            }
            prop_assert_eq!(q, p);
        }

        #[test]
        fn garbage_never_panics(junk in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = Packet::decode(&junk);
            let _ = Packet::decode_shared(&Bytes::from(junk));
        }
    }

    #[test]
    fn a_client_message_to_no_group_is_refused() {
        let p = Packet::Data(Data {
            ring: RingId {
                seq: 1,
                rep: 1,
                inc: 0,
            },
            seq: 1,
            sender: 1,
            origin: None,
            body: Arc::new(Body::ClientGone { client: "c".into() }),
        });
        let mut bytes = p.encode();
        // Rewrite the body as a client message with zero groups.
        let at = bytes.len() - 3;
        bytes.truncate(at);
        bytes.extend_from_slice(&[1, 1, b'c', 0, 0, 0, 0, 4, 0, 0, 0, 0]);
        assert_eq!(
            Packet::decode(&bytes),
            Err(DecodeError::Empty { what: "groups" })
        );
    }
}
