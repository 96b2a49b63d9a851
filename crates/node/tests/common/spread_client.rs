//! The client side of Spread 4.x's protocol, written for the tests from the protocol's
//! description (its byte tables), apart from the daemon's implementation: what libspread sends,
//! and how `SP_scat_receive` and `SP_get_memb_info` read what the daemon sends back.
#![allow(dead_code)]

pub const UNRELIABLE: u32 = 0x01;
pub const RELIABLE: u32 = 0x02;
pub const FIFO: u32 = 0x04;
pub const CAUSAL: u32 = 0x08;
pub const AGREED: u32 = 0x10;
pub const SAFE: u32 = 0x20;
pub const SELF_DISCARD: u32 = 0x40;
pub const JOIN: u32 = 0x1_0000;
pub const LEAVE: u32 = 0x2_0000;
pub const KILL: u32 = 0x4_0000;
pub const REJECT: u32 = 0x40_0000;
pub const REG_MEMB: u32 = 0x1000;
pub const TRANSITION: u32 = 0x2000;
pub const CAUSED_BY_JOIN: u32 = 0x100;
pub const CAUSED_BY_LEAVE: u32 = 0x200;
pub const CAUSED_BY_DISCONNECT: u32 = 0x400;
pub const CAUSED_BY_NETWORK: u32 = 0x800;
const MARK: u32 = 0x8000_0080;

/// `SP_connect`'s first bytes: version 4.4.0, the membership flag and priority 1, the name.
pub fn connect(name: &str, membership: bool) -> Vec<u8> {
    let mut b = vec![4, 4, 0, 0x10 | membership as u8, name.len() as u8];
    b.extend_from_slice(name.as_bytes());
    b
}

/// The 90-byte choice of `NULL` authentication.
pub fn null_auth() -> Vec<u8> {
    let mut b = vec![0u8; 90];
    b[..4].copy_from_slice(b"NULL");
    b
}

/// What the daemon answered a handshake: the method list, and the private group (or the reject
/// code).
#[derive(Debug, PartialEq)]
pub enum Handshake {
    Accepted {
        methods: Vec<u8>,
        version: [u8; 3],
        private_group: String,
        used: usize,
    },
    Rejected(i8),
    Incomplete,
}

/// Reads the daemon's side of a handshake as `SP_connect` does.
pub fn handshake(b: &[u8]) -> Handshake {
    let Some(&len) = b.first() else {
        return Handshake::Incomplete;
    };
    if (len as i8) < 0 {
        return Handshake::Rejected(len as i8);
    }
    let l = len as usize;
    let Some(methods) = b.get(1..1 + l) else {
        return Handshake::Incomplete;
    };
    let at = 1 + l;
    let Some(&accept) = b.get(at) else {
        return Handshake::Incomplete;
    };
    if accept != 1 {
        return Handshake::Rejected(accept as i8);
    }
    let Some(v) = b.get(at + 1..at + 4) else {
        return Handshake::Incomplete;
    };
    let Some(&p) = b.get(at + 4) else {
        return Handshake::Incomplete;
    };
    let Some(pg) = b.get(at + 5..at + 5 + p as usize) else {
        return Handshake::Incomplete;
    };
    Handshake::Accepted {
        methods: methods.to_vec(),
        version: [v[0], v[1], v[2]],
        private_group: String::from_utf8(pg.to_vec()).unwrap(),
        used: at + 5 + p as usize,
    }
}

fn field(name: &str) -> [u8; 32] {
    let mut f = [0u8; 32];
    f[..name.len()].copy_from_slice(name.as_bytes());
    f
}

/// A request as `SP_internal_multicast` lays it out, little- or big-endian (as the Java client).
pub fn request(
    big_endian: bool,
    kind: u32,
    own: &str,
    groups: &[&str],
    mess_type: i16,
    data: &[u8],
) -> Vec<u8> {
    let int = |v: u32| {
        if big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let mark = if big_endian { 0 } else { MARK };
    let mut b = Vec::new();
    b.extend_from_slice(&int(kind | mark));
    b.extend_from_slice(&field(own));
    b.extend_from_slice(&int(groups.len() as u32));
    b.extend_from_slice(&int(((mess_type as u16 as u32) << 8) & 0x00ff_ff00 | mark));
    b.extend_from_slice(&int(data.len() as u32));
    for g in groups {
        b.extend_from_slice(&field(g));
    }
    b.extend_from_slice(data);
    b
}

/// One message as the C library returns it.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Data {
        service: u32,
        sender: String,
        groups: Vec<String>,
        mess_type: i16,
        endian_mismatch: bool,
        data: Vec<u8>,
    },
    Membership {
        service: u32,
        group: String,
        members: Vec<String>,
        /// The receiver's index among the members (the library's `mess_type`).
        index: usize,
        gid: [u32; 3],
        vs_sets: Vec<Vec<String>>,
        /// The set holding the receiver, found through the body's offset.
        local: Vec<String>,
    },
    Transitional {
        group: String,
        gid: [u32; 3],
    },
    SelfLeave {
        group: String,
    },
    Reject {
        old_type: u32,
        groups: Vec<String>,
        data: Vec<u8>,
    },
}

fn name(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).expect("a NUL in every name");
    String::from_utf8(b[..end].to_vec()).unwrap()
}

/// Splits the messages off `stream` as the library reads them; the bytes used.
pub fn messages(stream: &[u8], own: &str) -> (Vec<Message>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while stream.len() >= at + 48 {
        let h = &stream[at..at + 48];
        let word = |i: usize| [h[i], h[i + 1], h[i + 2], h[i + 3]];
        let raw_type = u32::from_le_bytes(word(0));
        // This machine is little-endian: a header without the marker is swapped.
        let swap = raw_type & MARK != MARK;
        let int = |w: [u8; 4]| {
            if swap {
                u32::from_be_bytes(w)
            } else {
                u32::from_le_bytes(w)
            }
        };
        let service = int(word(0)) & !MARK;
        let num_groups = int(word(36)) as i32;
        let data_len = int(word(44)) as i32;
        assert!(num_groups >= 0 && data_len >= 0, "ILLEGAL_MESSAGE");
        let extra = if service & REJECT != 0 { 4 } else { 0 };
        let end = at + 48 + extra + 32 * num_groups as usize + data_len as usize;
        if stream.len() < end {
            break;
        }
        let names_at = at + 48 + extra;
        let groups: Vec<String> = (0..num_groups as usize)
            .map(|k| name(&stream[names_at + 32 * k..names_at + 32 * k + 32]))
            .collect();
        let body = &stream[names_at + 32 * num_groups as usize..end];
        let hint = word(40);
        let hint_swap = u32::from_le_bytes(hint) & MARK != MARK;
        let hint = if hint_swap {
            u32::from_be_bytes(hint)
        } else {
            u32::from_le_bytes(hint)
        };
        let header_name = name(&h[4..36]);
        let body_int = |o: usize| int([body[o], body[o + 1], body[o + 2], body[o + 3]]);
        let m = if service & REJECT != 0 {
            Message::Reject {
                old_type: int([
                    stream[at + 48],
                    stream[at + 49],
                    stream[at + 50],
                    stream[at + 51],
                ]) & !MARK,
                groups,
                data: body.to_vec(),
            }
        } else if service & 0x3f != 0 {
            Message::Data {
                service,
                sender: header_name,
                groups,
                mess_type: ((hint & !MARK) >> 8) as u16 as i16,
                endian_mismatch: hint_swap,
                data: body.to_vec(),
            }
        } else if service & REG_MEMB != 0 {
            let gid = [body_int(0), body_int(4), body_int(8)];
            let num_sets = body_int(12) as usize;
            let offset = body_int(16) as usize;
            let mut sets = Vec::new();
            let mut local = Vec::new();
            let mut o = 20;
            for _ in 0..num_sets {
                let n = body_int(o) as usize;
                let set: Vec<String> = (0..n)
                    .map(|k| name(&body[o + 4 + 32 * k..o + 36 + 32 * k]))
                    .collect();
                if o - 20 == offset {
                    local = set.clone();
                }
                o += 4 + 32 * n;
                sets.push(set);
            }
            assert_eq!(o, body.len(), "the sets fill the body");
            Message::Membership {
                service,
                group: header_name,
                index: groups.iter().position(|g| g == own).unwrap_or(usize::MAX),
                members: groups,
                gid,
                vs_sets: sets,
                local,
            }
        } else if service & TRANSITION != 0 {
            Message::Transitional {
                group: header_name,
                gid: [body_int(0), body_int(4), body_int(8)],
            }
        } else if service == CAUSED_BY_LEAVE {
            Message::SelfLeave { group: header_name }
        } else {
            panic!("unknown message type {service:#x}");
        };
        out.push(m);
        at = end;
    }
    (out, at)
}
