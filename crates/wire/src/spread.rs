//! Spread 4.x's client protocol (docs/spread.md), the daemon's side: the connection handshake,
//! the 48-byte message header in either byte order, the requests a client sends, and the data,
//! membership and other messages a daemon sends back. The byte layouts follow the Spread 4.4.0
//! library and daemon (`libspread/sp.c`, `daemon/session.c`, `daemon/groups.c`).
//!
//! Departures, all stricter than the 4.4.0 daemon (which mishandles such input):
//! - a request with any bit set beyond its one service bit (or its one of join, leave, kill) and
//!   `SELF_DISCARD` is refused: `REJECT_MESS` on a data message made every receiver lose its
//!   stream's framing, and the other daemon-only bits have no meaning from a client;
//! - a group name without a NUL in its 32 bytes, an empty one, or one with a byte outside
//!   `!`..`~` is refused (the 4.4.0 daemon read past the field; the Java client reads names up
//!   to their NUL with no bound);
//! - a data message is refused past [`MAX_MESSAGE_BODY_LEN`] less 32 bytes per group, a limit
//!   the 4.4.0 daemon checks and then aborts on a few hundred bytes below.

use bytes::Bytes;

/// Spread's default port; its Unix socket is `/tmp/4803`.
pub const DEFAULT_PORT: u16 = 4803;
/// Bytes of a group name field, NUL included.
pub const GROUP_NAME_BYTES: usize = 32;
/// Longest group name (or private group) a Spread client can use.
pub const MAX_GROUP_NAME: usize = GROUP_NAME_BYTES - 1;
/// Longest private name a client asks for.
pub const MAX_PRIVATE_NAME: usize = 10;
/// Longest daemon name a private group can hold.
pub const MAX_PROC_NAME: usize = 19;
/// Most destinations of one message.
pub const MAX_GROUPS_PER_MESSAGE: usize = 100;
/// Most bytes of data and destination names in one message.
pub const MAX_MESSAGE_BODY_LEN: usize = 144_000;
pub const HEADER_BYTES: usize = 48;
/// The client's choice of authentication methods: three NUL-padded 30-byte slots.
pub const AUTH_REPLY_BYTES: usize = 90;
const AUTH_SLOT_BYTES: usize = 30;
/// The version this daemon reports: the release its clients were built against.
pub const DAEMON_VERSION: [u8; 3] = [4, 4, 0];
/// The list of authentication methods offered: `NULL` alone.
pub const AUTH_LIST: &[u8] = b"\x05NULL ";
/// The accept byte of the handshake.
pub const ACCEPT_SESSION: u8 = 1;

/// The endian marker of a header's `type` and `hint` words: set by a little-endian writer.
pub const ENDIAN_MARK: u32 = 0x8000_0080;

pub const UNRELIABLE_MESS: u32 = 0x0000_0001;
pub const RELIABLE_MESS: u32 = 0x0000_0002;
pub const FIFO_MESS: u32 = 0x0000_0004;
pub const CAUSAL_MESS: u32 = 0x0000_0008;
pub const AGREED_MESS: u32 = 0x0000_0010;
pub const SAFE_MESS: u32 = 0x0000_0020;
pub const REGULAR_MESS: u32 = 0x0000_003f;
pub const SELF_DISCARD: u32 = 0x0000_0040;
pub const CAUSED_BY_JOIN: u32 = 0x0000_0100;
pub const CAUSED_BY_LEAVE: u32 = 0x0000_0200;
pub const CAUSED_BY_DISCONNECT: u32 = 0x0000_0400;
pub const CAUSED_BY_NETWORK: u32 = 0x0000_0800;
pub const REG_MEMB_MESS: u32 = 0x0000_1000;
pub const TRANSITION_MESS: u32 = 0x0000_2000;
pub const JOIN_MESS: u32 = 0x0001_0000;
pub const LEAVE_MESS: u32 = 0x0002_0000;
pub const KILL_MESS: u32 = 0x0004_0000;
pub const REJECT_MESS: u32 = 0x0040_0000;

/// The service bit of a service type.
pub fn service_bit(s: crate::gcs::ServiceType) -> u32 {
    use crate::gcs::ServiceType::*;
    match s {
        Unreliable => UNRELIABLE_MESS,
        Reliable => RELIABLE_MESS,
        Fifo => FIFO_MESS,
        Causal => CAUSAL_MESS,
        Agreed => AGREED_MESS,
        Safe => SAFE_MESS,
    }
}

/// The service type of a type word's service bit (safe if it has none of the others).
pub fn service_type(kind: u32) -> crate::gcs::ServiceType {
    use crate::gcs::ServiceType::*;
    match kind & REGULAR_MESS {
        UNRELIABLE_MESS => Unreliable,
        RELIABLE_MESS => Reliable,
        FIFO_MESS => Fifo,
        CAUSAL_MESS => Causal,
        AGREED_MESS => Agreed,
        _ => Safe,
    }
}

/// A refusal of a connection: one signed byte, then the daemon closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reject {
    Quota = -3,
    IllegalName = -5,
    NotUnique = -6,
    Version = -7,
    Auth = -9,
}

impl Reject {
    pub fn byte(self) -> u8 {
        self as i8 as u8
    }
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reject::Quota => "REJECT_QUOTA",
            Reject::IllegalName => "REJECT_ILLEGAL_NAME",
            Reject::NotUnique => "REJECT_NOT_UNIQUE",
            Reject::Version => "REJECT_VERSION",
            Reject::Auth => "REJECT_AUTH",
        })
    }
}

/// The connect message a client opens with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connect {
    pub version: [u8; 3],
    /// The client wants membership messages.
    pub membership: bool,
    pub priority: u8,
    /// The private name asked for; empty: the daemon picks one.
    pub name: String,
}

impl Connect {
    /// `major * 10000 + minor * 100 + patch`, as Spread compares versions.
    pub fn version_number(&self) -> u32 {
        let [a, b, c] = self.version;
        a as u32 * 10_000 + b as u32 * 100 + c as u32
    }

    /// Libraries from 3.16.0 negotiate the authentication method.
    pub fn negotiates_auth(&self) -> bool {
        self.version_number() >= 31_600
    }

    /// Libraries from 3.15.0 send and expect the patch byte of a version.
    pub fn has_patch(&self) -> bool {
        self.version_number() >= 31_500
    }

    /// The connect message at the start of `input`, and its length; `Ok(None)` while it is
    /// incomplete. A version too old or a name Spread does not allow is refused with the reject
    /// a Spread daemon sends.
    pub fn parse(input: &[u8]) -> Result<Option<(Connect, usize)>, Reject> {
        let (Some(&major), Some(&minor)) = (input.first(), input.get(1)) else {
            return Ok(None);
        };
        // The patch byte comes from libraries past 3.14 alone.
        let patched = major as u32 * 10_000 + minor as u32 * 100 > 31_400;
        let at = if patched { 3 } else { 2 };
        let (Some(&flags), Some(&len)) = (input.get(at), input.get(at + 1)) else {
            return Ok(None);
        };
        let version = [major, minor, if patched { input[2] } else { 0 }];
        let c = |name| Connect {
            version,
            membership: flags % 2 == 1,
            priority: flags / 16,
            name,
        };
        if c(String::new()).version_number() < 30_100 {
            return Err(Reject::Version);
        }
        let len = len as usize;
        if len > MAX_PRIVATE_NAME {
            return Err(Reject::IllegalName);
        }
        let Some(name) = input.get(at + 2..at + 2 + len) else {
            return Ok(None);
        };
        if !name.iter().all(|&b| private_name_byte(b)) {
            return Err(Reject::IllegalName);
        }
        let name = String::from_utf8(name.to_vec()).map_err(|_| Reject::IllegalName)?;
        Ok(Some((c(name), at + 2 + len)))
    }

    /// The bytes of this connect message (what a client sends).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.version[0], self.version[1]];
        if self.version[0] as u32 * 10_000 + self.version[1] as u32 * 100 > 31_400 {
            out.push(self.version[2]);
        }
        out.push(self.membership as u8 | (self.priority << 4));
        out.push(self.name.len() as u8);
        out.extend_from_slice(self.name.as_bytes());
        out
    }
}

/// Bytes Spread allows in a private name and a group name a client joins: `$` to `~`.
pub fn private_name_byte(b: u8) -> bool {
    (36..=126).contains(&b)
}

/// Checks a client's choice of authentication methods: every slot used must name `NULL`, and
/// at least one must.
pub fn check_auth_reply(reply: &[u8; AUTH_REPLY_BYTES]) -> Result<(), Reject> {
    let mut chosen = 0;
    for slot in reply.chunks(AUTH_SLOT_BYTES) {
        if slot[0] == 0 {
            break;
        }
        let end = slot.iter().position(|&b| b == 0).unwrap_or(slot.len());
        if &slot[..end] != b"NULL" {
            return Err(Reject::Auth);
        }
        chosen += 1;
    }
    if chosen == 0 {
        return Err(Reject::Auth);
    }
    Ok(())
}

/// The client's choice of `NULL` authentication, as the Spread libraries send it.
pub fn null_auth_reply() -> [u8; AUTH_REPLY_BYTES] {
    let mut r = [0u8; AUTH_REPLY_BYTES];
    r[..4].copy_from_slice(b"NULL");
    r
}

/// The daemon's acceptance of a session: the accept byte, its version (with the patch byte if
/// the client's library expects one) and the session's private group.
pub fn accept_reply(connect: &Connect, private_group: &str) -> Vec<u8> {
    let mut out = vec![ACCEPT_SESSION, DAEMON_VERSION[0], DAEMON_VERSION[1]];
    if connect.has_patch() {
        out.push(DAEMON_VERSION[2]);
    }
    out.push(private_group.len() as u8);
    out.extend_from_slice(private_group.as_bytes());
    out
}

/// A message header, its integers in this machine's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The type word without its endian marker.
    pub kind: u32,
    pub private_group: [u8; GROUP_NAME_BYTES],
    pub num_groups: i32,
    /// The hint word as it was on the wire: forwarded verbatim.
    pub hint: [u8; 4],
    pub data_len: i32,
}

impl Header {
    /// Reads a header in the byte order its `type` word's marker says.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Header {
        let word = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        // The marker reads the same in either order.
        let little = u32::from_le_bytes(word(0)) & ENDIAN_MARK == ENDIAN_MARK;
        let int = |i| match little {
            true => u32::from_le_bytes(word(i)),
            false => u32::from_be_bytes(word(i)),
        };
        let mut private_group = [0u8; GROUP_NAME_BYTES];
        private_group.copy_from_slice(&b[4..36]);
        Header {
            kind: int(0) & !ENDIAN_MARK,
            private_group,
            num_groups: int(36) as i32,
            hint: word(40),
            data_len: int(44) as i32,
        }
    }

    /// Writes the header little-endian, marked so.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.kind | ENDIAN_MARK).to_le_bytes());
        out.extend_from_slice(&self.private_group);
        out.extend_from_slice(&self.num_groups.to_le_bytes());
        out.extend_from_slice(&self.hint);
        out.extend_from_slice(&self.data_len.to_le_bytes());
    }

    /// The same header big-endian (as the Java client writes it), for tests of either order.
    pub fn encode_big_endian_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.kind & !ENDIAN_MARK).to_be_bytes());
        out.extend_from_slice(&self.private_group);
        out.extend_from_slice(&self.num_groups.to_be_bytes());
        out.extend_from_slice(&self.hint);
        out.extend_from_slice(&self.data_len.to_be_bytes());
    }
}

/// A name in a 32-byte field, NUL-padded; a longer name is cut to 31 bytes.
pub fn name_field(name: &str) -> [u8; GROUP_NAME_BYTES] {
    let mut f = [0u8; GROUP_NAME_BYTES];
    let b = name.as_bytes();
    let n = b.len().min(MAX_GROUP_NAME);
    f[..n].copy_from_slice(&b[..n]);
    f
}

/// The name in a 32-byte field: the bytes before its NUL, 1 to 31 of `!` to `~`.
pub fn read_name_field(f: &[u8]) -> Result<&str, RequestError> {
    let end = f
        .iter()
        .take(GROUP_NAME_BYTES)
        .position(|&b| b == 0)
        .ok_or(RequestError::NameUnterminated)?;
    let name = &f[..end];
    if name.is_empty() || !name.iter().all(|b| (33..=126).contains(b)) {
        return Err(RequestError::BadName);
    }
    // Printable ASCII is UTF-8.
    std::str::from_utf8(name).map_err(|_| RequestError::BadName)
}

/// A request from a client, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Multicast {
        /// The one service bit of [`REGULAR_MESS`].
        service: u32,
        self_discard: bool,
        /// The destinations as the client listed them (groups and private groups).
        groups: Vec<String>,
        /// The hint word, verbatim: the application's `mess_type` and the sender's endian mark.
        hint: [u8; 4],
        data: Bytes,
    },
    Join(String),
    Leave(String),
    /// `KILL_MESS`: the client disconnects.
    Kill,
}

/// Why a request is refused; the daemon closes the session.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the type {0:#010x} asks for no one service, join, leave or kill")]
    BadType(u32),
    #[error("the type {0:#010x} carries bits no client sets")]
    DaemonBits(u32),
    #[error("the sender field is not this session's private group")]
    NotOwnGroup,
    #[error("{0} groups, outside 0 to {MAX_GROUPS_PER_MESSAGE}")]
    BadGroupCount(i32),
    #[error("the hint word has bits outside the message type and endian mark")]
    BadHint,
    #[error("{0} bytes of data and names, outside 0 to {MAX_MESSAGE_BODY_LEN}")]
    TooLong(i64),
    #[error("a group name has no NUL in its 32 bytes")]
    NameUnterminated,
    #[error("a group name is empty or has a byte outside '!' to '~'")]
    BadName,
    #[error("a join, leave or kill names {0} groups, not one")]
    NotOneGroup(i32),
    #[error("a join or leave names a group Spread does not allow")]
    BadGroup,
    #[error("a data message names no destination")]
    NoGroups,
}

/// What a valid header announces: how many names and data bytes follow.
pub fn check_header(h: &Header, private_group: &str) -> Result<(usize, usize), RequestError> {
    let service = (h.kind & REGULAR_MESS).count_ones();
    let control = (h.kind & (JOIN_MESS | LEAVE_MESS | KILL_MESS)).count_ones();
    if service + control != 1 {
        return Err(RequestError::BadType(h.kind));
    }
    let allowed = REGULAR_MESS | SELF_DISCARD | JOIN_MESS | LEAVE_MESS | KILL_MESS;
    if h.kind & !allowed != 0 || (control == 1 && h.kind & SELF_DISCARD != 0) {
        return Err(RequestError::DaemonBits(h.kind));
    }
    let own = match h.private_group.iter().position(|&b| b == 0) {
        Some(end) => &h.private_group[..end],
        None => &h.private_group[..MAX_GROUP_NAME],
    };
    if own != private_group.as_bytes() {
        return Err(RequestError::NotOwnGroup);
    }
    if !(0..=MAX_GROUPS_PER_MESSAGE as i32).contains(&h.num_groups) {
        return Err(RequestError::BadGroupCount(h.num_groups));
    }
    let hint = u32::from_le_bytes(h.hint);
    if hint & !(ENDIAN_MARK | 0x00ff_ff00) != 0 {
        return Err(RequestError::BadHint);
    }
    let total = h.data_len as i64 + GROUP_NAME_BYTES as i64 * h.num_groups as i64;
    if h.data_len < 0 || total > (MAX_MESSAGE_BODY_LEN - HEADER_BYTES) as i64 {
        return Err(RequestError::TooLong(total));
    }
    if control == 1 && h.num_groups != 1 {
        return Err(RequestError::NotOneGroup(h.num_groups));
    }
    if service == 1 && h.num_groups == 0 {
        return Err(RequestError::NoGroups);
    }
    Ok((h.num_groups as usize, h.data_len as usize))
}

/// The request whose checked header is `h`, from the names and data that followed it.
pub fn parse_request(h: &Header, names: &[u8], data: &[u8]) -> Result<Request, RequestError> {
    let mut groups = Vec::with_capacity(names.len() / GROUP_NAME_BYTES);
    for f in names.chunks(GROUP_NAME_BYTES) {
        groups.push(read_name_field(f)?.to_owned());
    }
    if h.kind & KILL_MESS != 0 {
        return Ok(Request::Kill);
    }
    if h.kind & (JOIN_MESS | LEAVE_MESS) != 0 {
        let g = groups.pop().ok_or(RequestError::NotOneGroup(0))?;
        if g.len() > MAX_GROUP_NAME || !g.bytes().all(private_name_byte) {
            return Err(RequestError::BadGroup);
        }
        return Ok(if h.kind & JOIN_MESS != 0 {
            Request::Join(g)
        } else {
            Request::Leave(g)
        });
    }
    Ok(Request::Multicast {
        service: h.kind & REGULAR_MESS,
        self_discard: h.kind & SELF_DISCARD != 0,
        groups,
        hint: h.hint,
        data: Bytes::copy_from_slice(data),
    })
}

/// The next request in `stream` from the session of `private_group`, and the bytes it took;
/// `Ok(None)` while incomplete. A header is checked as soon as it is in, before its body.
pub fn next_request(
    stream: &[u8],
    private_group: &str,
) -> Result<Option<(Request, usize)>, RequestError> {
    let Some(head) = stream.first_chunk::<HEADER_BYTES>() else {
        return Ok(None);
    };
    let h = Header::decode(head);
    let (groups, data) = check_header(&h, private_group)?;
    let names_end = HEADER_BYTES + groups * GROUP_NAME_BYTES;
    let end = names_end + data;
    if stream.len() < end {
        return Ok(None);
    }
    let r = parse_request(
        &h,
        &stream[HEADER_BYTES..names_end],
        &stream[names_end..end],
    )?;
    Ok(Some((r, end)))
}

/// How many bytes the request begun in `stream` still lacks: the header's until it is in, then
/// the names' and data's. A header that does not check lacks none: reading it refuses it.
pub fn missing(stream: &[u8], private_group: &str) -> usize {
    let Some(head) = stream.first_chunk::<HEADER_BYTES>() else {
        return HEADER_BYTES - stream.len();
    };
    match check_header(&Header::decode(head), private_group) {
        Ok((groups, data)) => {
            (HEADER_BYTES + groups * GROUP_NAME_BYTES + data).saturating_sub(stream.len())
        }
        Err(_) => 0,
    }
}

/// The hint word of a message whose sender gave no `mess_type` (a Conclave client's), in this
/// daemon's order.
pub const PLAIN_HINT: [u8; 4] = ENDIAN_MARK.to_le_bytes();

/// Appends a data message: `kind` its service bit (and `SELF_DISCARD` if the sender set it),
/// `sender` the sender's private group, `groups` the destinations as the sender listed them.
pub fn write_data(
    out: &mut Vec<u8>,
    kind: u32,
    sender: &str,
    groups: &[&str],
    hint: [u8; 4],
    data: &[u8],
) {
    write_message(
        out,
        kind,
        name_field(sender),
        groups.iter().copied(),
        hint,
        data,
    );
}

/// [`write_data`] for a message a daemon delivers: `client` the sender's name (`name#daemon`),
/// whose private group is `#` and the name, with nothing allocated on the way.
pub fn write_delivery<'a>(
    out: &mut Vec<u8>,
    kind: u32,
    client: &str,
    groups: impl ExactSizeIterator<Item = &'a str>,
    hint: [u8; 4],
    data: &[u8],
) {
    let mut sender = [0u8; GROUP_NAME_BYTES];
    sender[0] = b'#';
    let b = client.as_bytes();
    let n = b.len().min(MAX_GROUP_NAME - 1);
    sender[1..=n].copy_from_slice(&b[..n]);
    write_message(out, kind, sender, groups, hint, data);
}

fn write_message<'a>(
    out: &mut Vec<u8>,
    kind: u32,
    sender: [u8; GROUP_NAME_BYTES],
    groups: impl ExactSizeIterator<Item = &'a str>,
    hint: [u8; 4],
    data: &[u8],
) {
    out.reserve(HEADER_BYTES + GROUP_NAME_BYTES * groups.len() + data.len());
    Header {
        kind,
        private_group: sender,
        num_groups: groups.len() as i32,
        hint,
        data_len: data.len() as i32,
    }
    .encode_into(out);
    for g in groups {
        out.extend_from_slice(&name_field(g));
    }
    out.extend_from_slice(data);
}

/// Appends the refusal of a request (`REJECT_MESS`): the request's header with its type
/// replaced and one more group, its type in 4 bytes, its destinations and the sender's own
/// private group (in place of the last of 100), and its data.
pub fn write_reject(
    out: &mut Vec<u8>,
    kind: u32,
    private_group: &str,
    groups: &[&str],
    hint: [u8; 4],
    data: &[u8],
) {
    let mut names: Vec<&str> = groups
        .iter()
        .copied()
        .take(MAX_GROUPS_PER_MESSAGE)
        .collect();
    if names.len() == MAX_GROUPS_PER_MESSAGE {
        names.pop();
    }
    names.push(private_group);
    Header {
        kind: REJECT_MESS | (kind & SELF_DISCARD),
        private_group: name_field(private_group),
        num_groups: names.len() as i32,
        hint,
        data_len: data.len() as i32,
    }
    .encode_into(out);
    out.extend_from_slice(&(kind | ENDIAN_MARK).to_le_bytes());
    for g in names {
        out.extend_from_slice(&name_field(g));
    }
    out.extend_from_slice(data);
}

/// A group id as Spread clients see it (and compare, for equality alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct GroupId {
    pub proc_id: u32,
    pub time: u32,
    pub index: u32,
}

impl GroupId {
    fn write(&self, out: &mut Vec<u8>) {
        for v in [self.proc_id, self.time, self.index] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// Appends a regular membership message of `group`: `cause` one of the `CAUSED_BY_*` bits,
/// `members` in Spread's order, `vs_sets` the sets of members that came into the view together
/// (for a join, leave or disconnect: the one member concerned), `local` the index of the set
/// holding the receiver.
pub fn write_membership(
    out: &mut Vec<u8>,
    cause: u32,
    group: &str,
    members: &[&str],
    id: GroupId,
    vs_sets: &[Vec<&str>],
    local: usize,
) {
    let sets: usize = vs_sets.iter().map(|s| 4 + GROUP_NAME_BYTES * s.len()).sum();
    let offset: usize = vs_sets[..local.min(vs_sets.len())]
        .iter()
        .map(|s| 4 + GROUP_NAME_BYTES * s.len())
        .sum();
    Header {
        kind: REG_MEMB_MESS | cause,
        private_group: name_field(group),
        num_groups: members.len() as i32,
        hint: PLAIN_HINT,
        data_len: (20 + sets) as i32,
    }
    .encode_into(out);
    for m in members {
        out.extend_from_slice(&name_field(m));
    }
    id.write(out);
    out.extend_from_slice(&(vs_sets.len() as u32).to_le_bytes());
    out.extend_from_slice(&(offset as u32).to_le_bytes());
    for s in vs_sets {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        for m in s {
            out.extend_from_slice(&name_field(m));
        }
    }
}

/// Appends a transitional signal of `group`, `old` the id of the view that turned transitional.
pub fn write_transitional(out: &mut Vec<u8>, group: &str, old: GroupId) {
    Header {
        kind: TRANSITION_MESS,
        private_group: name_field(group),
        num_groups: 0,
        hint: PLAIN_HINT,
        data_len: 12,
    }
    .encode_into(out);
    old.write(out);
}

/// Appends the message telling a member it left `group`.
pub fn write_self_leave(out: &mut Vec<u8>, group: &str) {
    Header {
        kind: CAUSED_BY_LEAVE,
        private_group: name_field(group),
        num_groups: 0,
        hint: PLAIN_HINT,
        data_len: 0,
    }
    .encode_into(out);
}

/// The client's side (for `conclave user --spread` and the simulator's Spread clients): what a
/// Spread library sends, and the daemon's messages as it reads them. Input from a daemon is
/// checked as any wire input is: a malformed message is an error, never a panic.
pub mod client {
    use super::*;
    use crate::DecodeError;

    /// The connect message of a 4.4.0 library (membership messages on or off) and its choice of
    /// `NULL` authentication, which may follow at once.
    pub fn hello(name: &str, membership: bool) -> Vec<u8> {
        let mut b = Connect {
            version: DAEMON_VERSION,
            membership,
            priority: 0,
            name: name.to_owned(),
        }
        .encode();
        b.extend_from_slice(&null_auth_reply());
        b
    }

    /// The daemon's side of the handshake at the start of `stream`: the private group and the
    /// bytes it took; `Ok(None)` while incomplete; `Err` with the reject code.
    pub fn accepted(stream: &[u8]) -> Result<Option<(String, usize)>, i8> {
        let Some(&len) = stream.first() else {
            return Ok(None);
        };
        if (len as i8) < 0 {
            return Err(len as i8);
        }
        let at = 1 + len as usize;
        let Some(&accept) = stream.get(at) else {
            return Ok(None);
        };
        if accept != ACCEPT_SESSION {
            return Err(accept as i8);
        }
        let Some(&p) = stream.get(at + 4) else {
            return Ok(None);
        };
        let end = at + 5 + p as usize;
        let Some(name) = stream.get(at + 5..end) else {
            return Ok(None);
        };
        let name = std::str::from_utf8(name).map_err(|_| Reject::IllegalName as i8)?;
        Ok(Some((name.to_owned(), end)))
    }

    /// A request, little-endian: `kind` its type bits, `own` the client's private group.
    pub fn request(kind: u32, own: &str, groups: &[&str], mess_type: u16, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + 32 * groups.len() + data.len());
        let hint = ((mess_type as u32) << 8) | ENDIAN_MARK;
        write_data(&mut out, kind, own, groups, hint.to_le_bytes(), data);
        out
    }

    /// A message from the daemon.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Message {
        Data {
            kind: u32,
            sender: String,
            groups: Vec<String>,
            mess_type: u16,
            /// The sender's machine had the other byte order.
            endian_mismatch: bool,
            data: Vec<u8>,
        },
        Membership {
            kind: u32,
            group: String,
            members: Vec<String>,
            id: GroupId,
            vs_sets: Vec<Vec<String>>,
            /// The index in `vs_sets` of the set holding the receiver.
            local: usize,
        },
        Transitional {
            group: String,
            id: GroupId,
        },
        SelfLeave {
            group: String,
        },
        Reject {
            old_kind: u32,
            groups: Vec<String>,
            data: Vec<u8>,
        },
    }

    fn name_of(f: &[u8]) -> Result<String, DecodeError> {
        let end = f.iter().position(|&b| b == 0).ok_or(DecodeError::TooLong {
            what: "group name",
            len: f.len(),
            max: MAX_GROUP_NAME,
        })?;
        String::from_utf8(f[..end].to_vec())
            .map_err(|_| DecodeError::BadUtf8 { what: "group name" })
    }

    /// The next message in `stream`, and the bytes it took; `Ok(None)` while incomplete.
    pub fn next_message(stream: &[u8]) -> Result<Option<(Message, usize)>, DecodeError> {
        let Some(head) = stream.first_chunk::<HEADER_BYTES>() else {
            return Ok(None);
        };
        let h = Header::decode(head);
        let bad = |what| DecodeError::TooLong {
            what,
            len: 0,
            max: 0,
        };
        if h.num_groups < 0 || h.num_groups as usize > crate::client::MAX_VIEW_MEMBERS {
            return Err(bad("group count"));
        }
        if h.data_len < 0 || h.data_len as usize > 4 << 20 {
            return Err(bad("data length"));
        }
        let little = u32::from_le_bytes(*head.first_chunk::<4>().expect("4 bytes")) & ENDIAN_MARK
            == ENDIAN_MARK;
        let int = |b: &[u8]| {
            let w: [u8; 4] = b.try_into().expect("4 bytes");
            if little {
                u32::from_le_bytes(w)
            } else {
                u32::from_be_bytes(w)
            }
        };
        let extra = if h.kind & REJECT_MESS != 0 { 4 } else { 0 };
        let names_at = HEADER_BYTES + extra;
        let body_at = names_at + GROUP_NAME_BYTES * h.num_groups as usize;
        let end = body_at + h.data_len as usize;
        if stream.len() < end {
            return Ok(None);
        }
        let groups = stream[names_at..body_at]
            .chunks(GROUP_NAME_BYTES)
            .map(name_of)
            .collect::<Result<Vec<_>, _>>()?;
        let body = &stream[body_at..end];
        let header_name = name_of(&h.private_group)?;
        let m = if h.kind & REJECT_MESS != 0 {
            Message::Reject {
                old_kind: int(&stream[HEADER_BYTES..names_at]) & !ENDIAN_MARK,
                groups,
                data: body.to_vec(),
            }
        } else if h.kind & REGULAR_MESS != 0 {
            let hint = u32::from_le_bytes(h.hint);
            let mismatch = hint & ENDIAN_MARK != ENDIAN_MARK;
            let hint = if mismatch { hint.swap_bytes() } else { hint };
            Message::Data {
                kind: h.kind,
                sender: header_name,
                groups,
                mess_type: ((hint & !ENDIAN_MARK) >> 8) as u16,
                endian_mismatch: mismatch,
                data: body.to_vec(),
            }
        } else if h.kind & REG_MEMB_MESS != 0 {
            let word = |o: usize| body.get(o..o + 4).map(int).ok_or(bad("membership body"));
            let id = GroupId {
                proc_id: word(0)?,
                time: word(4)?,
                index: word(8)?,
            };
            let sets = word(12)? as usize;
            let offset = word(16)? as usize;
            let mut vs_sets = Vec::new();
            let mut local = None;
            let mut o = 20;
            for _ in 0..sets.min(body.len() / 4) {
                let n = word(o)? as usize;
                if o - 20 == offset {
                    local = Some(vs_sets.len());
                }
                let names = body
                    .get(o + 4..o + 4 + GROUP_NAME_BYTES * n.min(body.len()))
                    .ok_or(bad("vs set"))?;
                vs_sets.push(
                    names
                        .chunks(GROUP_NAME_BYTES)
                        .map(name_of)
                        .collect::<Result<Vec<_>, _>>()?,
                );
                o += 4 + GROUP_NAME_BYTES * n;
            }
            if vs_sets.len() != sets || o != body.len() {
                return Err(bad("vs sets"));
            }
            Message::Membership {
                kind: h.kind,
                group: header_name,
                members: groups,
                id,
                vs_sets,
                local: local.ok_or(bad("local vs set offset"))?,
            }
        } else if h.kind & TRANSITION_MESS != 0 {
            let word = |o: usize| body.get(o..o + 4).map(int).ok_or(bad("transitional body"));
            Message::Transitional {
                group: header_name,
                id: GroupId {
                    proc_id: word(0)?,
                    time: word(4)?,
                    index: word(8)?,
                },
            }
        } else if h.kind == CAUSED_BY_LEAVE {
            Message::SelfLeave { group: header_name }
        } else {
            return Err(DecodeError::BadTag {
                what: "Spread message type",
                tag: 0,
            });
        };
        Ok(Some((m, end)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u32, own: &str, groups: i32, data: i32) -> Header {
        Header {
            kind,
            private_group: name_field(own),
            num_groups: groups,
            hint: (0x1234u32 << 8 | ENDIAN_MARK).to_le_bytes(),
            data_len: data,
        }
    }

    #[test]
    fn a_delivery_is_the_data_message_of_its_senders_private_group() {
        let hint = (7u32 << 8 | ENDIAN_MARK).to_le_bytes();
        for client in ["a#d1", "longer-name-of-a-client#daemon-name-x"] {
            let mut by_name = Vec::new();
            let sender = format!("#{client}");
            write_data(
                &mut by_name,
                AGREED_MESS,
                &sender,
                &["g1", "g2"],
                hint,
                b"data",
            );
            let mut delivered = Vec::new();
            let groups = ["g1", "g2"].into_iter();
            write_delivery(&mut delivered, AGREED_MESS, client, groups, hint, b"data");
            assert_eq!(by_name, delivered, "{client}");
        }
    }

    #[test]
    fn connect_messages_parse_and_refuse_as_spread_does() {
        let c = Connect {
            version: [4, 4, 0],
            membership: true,
            priority: 1,
            name: "probe".into(),
        };
        let bytes = c.encode();
        assert_eq!(bytes, b"\x04\x04\x00\x11\x05probe");
        assert_eq!(Connect::parse(&bytes), Ok(Some((c.clone(), bytes.len()))));
        for n in 0..bytes.len() {
            assert_eq!(Connect::parse(&bytes[..n]), Ok(None), "{n} bytes");
        }
        // A 3.14 library sends no patch byte.
        let old = Connect::parse(b"\x03\x0e\x01\x02ab").unwrap().unwrap();
        assert_eq!(old.0.version, [3, 14, 0]);
        assert!(!old.0.has_patch() && !old.0.negotiates_auth());
        assert_eq!(Connect::parse(b"\x03\x00\x01\x00"), Err(Reject::Version));
        assert_eq!(
            Connect::parse(b"\x04\x04\x00\x01\x0babcdefghijk"),
            Err(Reject::IllegalName)
        );
        assert_eq!(
            Connect::parse(b"\x04\x04\x00\x01\x03a#b"),
            Err(Reject::IllegalName)
        );
        assert_eq!(Reject::Auth.byte(), 0xf7);
        assert_eq!(Reject::Quota.byte(), 0xfd);
    }

    #[test]
    fn auth_replies() {
        assert_eq!(check_auth_reply(&null_auth_reply()), Ok(()));
        assert_eq!(check_auth_reply(&[0; 90]), Err(Reject::Auth));
        let mut pword = [0u8; 90];
        pword[..5].copy_from_slice(b"PWORD");
        assert_eq!(check_auth_reply(&pword), Err(Reject::Auth));
        let mut two = null_auth_reply();
        two[30..34].copy_from_slice(b"NULL");
        assert_eq!(check_auth_reply(&two), Ok(()));
    }

    #[test]
    fn headers_read_in_either_order() {
        let h = header(AGREED_MESS | SELF_DISCARD, "#a#d", 2, 7);
        let (mut le, mut be) = (Vec::new(), Vec::new());
        h.encode_into(&mut le);
        h.encode_big_endian_into(&mut be);
        assert_eq!(le.len(), HEADER_BYTES);
        assert_eq!(&le[..4], &[0xd0, 0, 0, 0x80]);
        assert_eq!(&be[..4], &[0, 0, 0, 0x50]);
        assert_eq!(Header::decode(le.as_slice().try_into().unwrap()), h);
        assert_eq!(Header::decode(be.as_slice().try_into().unwrap()), h);
    }

    #[test]
    fn headers_are_checked_as_the_daemon_does() {
        let own = "#a#d";
        let ok = |h: &Header| check_header(h, own);
        assert_eq!(ok(&header(SAFE_MESS, own, 1, 10)), Ok((1, 10)));
        assert_eq!(ok(&header(JOIN_MESS, own, 1, 0)), Ok((1, 0)));
        assert!(matches!(
            ok(&header(0, own, 1, 0)),
            Err(RequestError::BadType(_))
        ));
        assert!(matches!(
            ok(&header(SAFE_MESS | FIFO_MESS, own, 1, 0)),
            Err(RequestError::BadType(_))
        ));
        assert!(matches!(
            ok(&header(SAFE_MESS | JOIN_MESS, own, 1, 0)),
            Err(RequestError::BadType(_))
        ));
        assert!(matches!(
            ok(&header(AGREED_MESS | REJECT_MESS, own, 1, 0)),
            Err(RequestError::DaemonBits(_))
        ));
        assert!(matches!(
            ok(&header(0x0008_0000, own, 1, 0)),
            Err(RequestError::BadType(_))
        ));
        assert_eq!(
            ok(&header(SAFE_MESS, "#b#d", 1, 0)),
            Err(RequestError::NotOwnGroup)
        );
        assert_eq!(
            ok(&header(SAFE_MESS, own, 101, 0)),
            Err(RequestError::BadGroupCount(101))
        );
        assert_eq!(
            ok(&header(SAFE_MESS, own, -1, 0)),
            Err(RequestError::BadGroupCount(-1))
        );
        let mut h = header(SAFE_MESS, own, 1, 0);
        h.hint = [0x81, 0, 0, 0x80];
        assert_eq!(ok(&h), Err(RequestError::BadHint));
        assert_eq!(ok(&header(SAFE_MESS, own, 1, 143_920)), Ok((1, 143_920)));
        assert!(matches!(
            ok(&header(SAFE_MESS, own, 1, 143_921)),
            Err(RequestError::TooLong(_))
        ));
        assert!(matches!(
            ok(&header(SAFE_MESS, own, 0, -5)),
            Err(RequestError::TooLong(_))
        ));
        assert_eq!(
            ok(&header(JOIN_MESS, own, 2, 0)),
            Err(RequestError::NotOneGroup(2))
        );
        assert_eq!(
            ok(&header(SAFE_MESS, own, 0, 0)),
            Err(RequestError::NoGroups)
        );
    }

    #[test]
    fn requests_split_off_a_stream() {
        let own = "#a#d";
        let mut s = Vec::new();
        write_data(
            &mut s,
            FIFO_MESS,
            own,
            &["g", "#b#d"],
            [0x80, 2, 0, 0x80],
            b"hi",
        );
        header(JOIN_MESS, own, 1, 0).encode_into(&mut s);
        s.extend_from_slice(&name_field("g"));
        let first = HEADER_BYTES + 64 + 2;
        for n in 0..first {
            assert_eq!(next_request(&s[..n], own), Ok(None));
            let lacks = if n < HEADER_BYTES {
                HEADER_BYTES
            } else {
                first
            };
            assert_eq!(missing(&s[..n], own), lacks - n);
        }
        let (r, used) = next_request(&s, own).unwrap().unwrap();
        assert_eq!(used, first);
        assert_eq!(
            r,
            Request::Multicast {
                service: FIFO_MESS,
                self_discard: false,
                groups: vec!["g".into(), "#b#d".into()],
                hint: [0x80, 2, 0, 0x80],
                data: Bytes::from_static(b"hi"),
            }
        );
        assert_eq!(
            next_request(&s[used..], own),
            Ok(Some((Request::Join("g".into()), HEADER_BYTES + 32)))
        );
        let mut bad = Vec::new();
        header(JOIN_MESS, own, 1, 0).encode_into(&mut bad);
        bad.extend_from_slice(&[b'x'; 32]);
        assert_eq!(next_request(&bad, own), Err(RequestError::NameUnterminated));
        let mut bad = Vec::new();
        header(JOIN_MESS, own, 1, 0).encode_into(&mut bad);
        bad.extend_from_slice(&name_field("#x"));
        assert_eq!(next_request(&bad, own), Err(RequestError::BadGroup));
    }

    #[test]
    fn a_membership_message_is_laid_out_as_spread_lays_it_out() {
        let mut out = Vec::new();
        let id = GroupId {
            proc_id: 0x7f00_0001,
            time: 0x6b03_f340,
            index: 1,
        };
        write_membership(
            &mut out,
            CAUSED_BY_JOIN,
            "pgrp",
            &["#probe#localhost"],
            id,
            &[vec!["#probe#localhost"]],
            0,
        );
        let mut want = vec![0x80, 0x11, 0, 0x80];
        want.extend_from_slice(&name_field("pgrp"));
        want.extend_from_slice(&[1, 0, 0, 0, 0x80, 0, 0, 0x80, 0x38, 0, 0, 0]);
        want.extend_from_slice(&name_field("#probe#localhost"));
        want.extend_from_slice(&[1, 0, 0, 0x7f, 0x40, 0xf3, 0x03, 0x6b, 1, 0, 0, 0]);
        want.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
        want.extend_from_slice(&name_field("#probe#localhost"));
        assert_eq!(out, want);
        // Two sets: the receiver's is the second, 36 bytes past the first set's start.
        let mut out = Vec::new();
        write_membership(
            &mut out,
            CAUSED_BY_NETWORK,
            "g",
            &["#p1#d1", "#p2#d2"],
            id,
            &[vec!["#p1#d1"], vec!["#p2#d2"]],
            1,
        );
        let body = &out[HEADER_BYTES + 64..];
        assert_eq!(body.len(), 92);
        assert_eq!(&body[16..20], &[36, 0, 0, 0]);
    }

    #[test]
    fn the_client_reads_what_the_daemon_writes() {
        use client::{next_message, Message};
        let id = GroupId {
            proc_id: 1,
            time: 2,
            index: 3,
        };
        let mut s = Vec::new();
        write_data(
            &mut s,
            SAFE_MESS,
            "#a#d",
            &["g", "#b#d"],
            [0, 0x12, 0x34, 0],
            b"x",
        );
        write_membership(
            &mut s,
            CAUSED_BY_NETWORK,
            "g",
            &["#a#d", "#b#e"],
            id,
            &[vec!["#a#d"], vec!["#b#e"]],
            1,
        );
        write_transitional(&mut s, "g", id);
        write_self_leave(&mut s, "g");
        write_reject(&mut s, AGREED_MESS, "#a#d", &["g"], PLAIN_HINT, b"y");
        let want = [
            Message::Data {
                kind: SAFE_MESS,
                sender: "#a#d".into(),
                groups: vec!["g".into(), "#b#d".into()],
                mess_type: 0x1234,
                endian_mismatch: true,
                data: b"x".to_vec(),
            },
            Message::Membership {
                kind: REG_MEMB_MESS | CAUSED_BY_NETWORK,
                group: "g".into(),
                members: vec!["#a#d".into(), "#b#e".into()],
                id,
                vs_sets: vec![vec!["#a#d".into()], vec!["#b#e".into()]],
                local: 1,
            },
            Message::Transitional {
                group: "g".into(),
                id,
            },
            Message::SelfLeave { group: "g".into() },
            Message::Reject {
                old_kind: AGREED_MESS,
                groups: vec!["g".into(), "#a#d".into()],
                data: b"y".to_vec(),
            },
        ];
        let mut at = 0;
        for w in want {
            for n in at..s.len().min(at + HEADER_BYTES + 8) {
                if let Ok(Some((_, used))) = next_message(&s[at..n]) {
                    assert!(at + used <= n, "a message within what arrived");
                }
            }
            let (m, used) = next_message(&s[at..]).unwrap().unwrap();
            assert_eq!(m, w);
            at += used;
        }
        assert_eq!(at, s.len());
        let mut hello = client::hello("me", true);
        assert_eq!(Connect::parse(&hello).unwrap().unwrap().1, 7);
        assert_eq!(hello.split_off(7), null_auth_reply());
        let mut acc = AUTH_LIST.to_vec();
        acc.extend_from_slice(&accept_reply(
            &Connect::parse(b"\x04\x04\x00\x01\x02me")
                .unwrap()
                .unwrap()
                .0,
            "#me#d",
        ));
        assert_eq!(
            client::accepted(&acc),
            Ok(Some(("#me#d".into(), acc.len())))
        );
        assert_eq!(client::accepted(&acc[..acc.len() - 1]), Ok(None));
        assert_eq!(client::accepted(&[0xf7]), Err(-9));
    }
}
