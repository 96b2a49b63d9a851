//! The key server's registration exchange: how a member of a key-graph group gets its individual
//! key (docs/keygraph.md, "Registration").
//!
//! Three messages, all sent inside the group over the daemons, each naming its group, server,
//! member and the group view it belongs to:
//!
//! 1. `Invite` (server to member): a fresh 32-byte nonce, signed by the server.
//! 2. `Hello` (member to server): the nonce, the member's ephemeral Ristretto255 element, and the
//!    member's signature over all of it.
//! 3. `Welcome` (server to member): the server's ephemeral element, what the server tells the
//!    member on admitting it (its place in the key graph), and the server's signature over the
//!    transcript (both elements and everything the hello named) and that admission.
//!
//! Around the exchange, the service's messages ([`ServiceMsg`]): the registration messages, the
//! rekey messages (`lkh::RekeyMessage`, which authenticate themselves), the server's signed
//! binding of a group view to the group key its members seal under ([`ViewKeyMsg`]), and a
//! member's knock (it lacks its keys and asks to register again).
//!
//! ```text
//! service message: version u8 = 1 | kind u8 | body
//!   1 registration: a RegisterMsg         2 rekey: an lkh RekeyMessage
//!   3 view key: group | server | view id | epoch u64 | key id u64 | key version u64
//!               | count u32 | names | signature (u32 length, bytes)
//!   4 knock: group | view id
//!   5 late key: group | server | member | view id | epoch u64 | count u32 | names
//!               | sealed (u32 length, bytes) | signature (u32 length, bytes)
//!   6 invitations: group | server | view id | count u32 | (member | nonce) each
//!               | signature (u32 length, bytes): one signed message inviting many members
//! admission (in a welcome): version u8 = 1 | user u64 | slot u32 | epoch u64
//!   | graph u8 (0 star, 1 tree) | degree u32 | aead u8 (0 AES-256-GCM, 1 ChaCha20-Poly1305)
//! ```

use crate::client::GroupViewId;
use crate::codec::{DecodeError, Reader, Writer};
use crate::gcs::MAX_NAME_BYTES;

/// The registration format version this build speaks.
pub const VERSION: u8 = 1;
/// Bytes of a nonce.
pub const NONCE_BYTES: usize = 32;
/// Bytes of an ephemeral element (Ristretto255).
pub const ELEMENT_BYTES: usize = 32;
/// Largest signature (RSA-4096 is 512 bytes).
pub const MAX_SIGNATURE_BYTES: usize = 512;
/// Largest admission a welcome carries.
pub const MAX_ADMISSION_BYTES: usize = 256;

/// What every registration message names: the exchange it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    pub group: String,
    pub server: String,
    pub member: String,
    pub view: GroupViewId,
    /// The server's nonce for this member in this view.
    pub nonce: [u8; NONCE_BYTES],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterMsg {
    Invite {
        exchange: Exchange,
        signature: Vec<u8>,
    },
    Hello {
        exchange: Exchange,
        element: [u8; ELEMENT_BYTES],
        signature: Vec<u8>,
    },
    Welcome {
        exchange: Exchange,
        /// The member's element, echoed: the welcome answers one hello.
        member_element: [u8; ELEMENT_BYTES],
        element: [u8; ELEMENT_BYTES],
        /// What the server tells the member on admitting it, covered by the signature.
        admission: Vec<u8>,
        signature: Vec<u8>,
    },
}

const INVITE: u8 = 1;
const HELLO: u8 = 2;
const WELCOME: u8 = 3;

impl Exchange {
    /// The exchange's fields as signatures and the key derivation bind them.
    pub fn write(&self, w: &mut Writer) {
        w.name(&self.group, MAX_NAME_BYTES);
        w.name(&self.server, MAX_NAME_BYTES);
        w.name(&self.member, MAX_NAME_BYTES);
        crate::client::write_view(w, &self.view);
        w.raw(&self.nonce);
    }
    fn read(r: &mut Reader<'_>) -> Result<Exchange, DecodeError> {
        let group = r.name("group", MAX_NAME_BYTES)?;
        let server = r.name("server", MAX_NAME_BYTES)?;
        let member = r.name("member", MAX_NAME_BYTES)?;
        let view = crate::client::read_view(r)?;
        let nonce = array(r, "nonce")?;
        Ok(Exchange {
            group,
            server,
            member,
            view,
            nonce,
        })
    }
}

fn array<const N: usize>(r: &mut Reader<'_>, what: &'static str) -> Result<[u8; N], DecodeError> {
    Ok(r.take(N, what)?.try_into().expect("took N bytes"))
}

impl RegisterMsg {
    pub fn exchange(&self) -> &Exchange {
        match self {
            RegisterMsg::Invite { exchange: x, .. }
            | RegisterMsg::Hello { exchange: x, .. }
            | RegisterMsg::Welcome { exchange: x, .. } => x,
        }
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(VERSION);
        match self {
            RegisterMsg::Invite {
                exchange,
                signature,
            } => {
                w.u8(INVITE);
                exchange.write(&mut w);
                w.bytes(signature, MAX_SIGNATURE_BYTES);
            }
            RegisterMsg::Hello {
                exchange,
                element,
                signature,
            } => {
                w.u8(HELLO);
                exchange.write(&mut w);
                w.raw(element);
                w.bytes(signature, MAX_SIGNATURE_BYTES);
            }
            RegisterMsg::Welcome {
                exchange,
                member_element,
                element,
                admission,
                signature,
            } => {
                w.u8(WELCOME);
                exchange.write(&mut w);
                w.raw(member_element);
                w.raw(element);
                w.bytes(admission, MAX_ADMISSION_BYTES);
                w.bytes(signature, MAX_SIGNATURE_BYTES);
            }
        }
        w.into_vec()
    }
    pub fn decode(buf: &[u8]) -> Result<RegisterMsg, DecodeError> {
        let mut r = Reader::new(buf);
        let v = r.u8("version")?;
        if v != VERSION {
            return Err(DecodeError::BadVersion(v));
        }
        let tag = r.u8("registration kind")?;
        let exchange = match tag {
            INVITE | HELLO | WELCOME => Exchange::read(&mut r)?,
            tag => {
                return Err(DecodeError::BadTag {
                    what: "registration kind",
                    tag,
                })
            }
        };
        let msg = match tag {
            INVITE => RegisterMsg::Invite {
                exchange,
                signature: signature(&mut r)?,
            },
            HELLO => RegisterMsg::Hello {
                exchange,
                element: array(&mut r, "element")?,
                signature: signature(&mut r)?,
            },
            _ => RegisterMsg::Welcome {
                exchange,
                member_element: array(&mut r, "member element")?,
                element: array(&mut r, "element")?,
                admission: r.bytes("admission", MAX_ADMISSION_BYTES)?.to_vec(),
                signature: signature(&mut r)?,
            },
        };
        r.finish()?;
        Ok(msg)
    }
}

/// A message of the key-graph service, inside a secure group's `KeyGraph` message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceMsg<'a> {
    /// A registration message, undecoded ([`RegisterMsg`]).
    Register(&'a [u8]),
    /// A rekey message, undecoded (`lkh::RekeyMessage`).
    Rekey(&'a [u8]),
    ViewKey(ViewKeyMsg),
    /// A member that lacks its keys asks, in `view` of `group`, to register again.
    Knock {
        group: String,
        view: GroupViewId,
    },
    LateKey(LateKeyMsg),
    Invitations(InvitationsMsg),
}

/// Many members invited to register in one view, under one signature (a view with many new
/// members costs one message, not one per member).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvitationsMsg {
    pub group: String,
    pub server: String,
    pub view: GroupViewId,
    /// Each member and its nonce.
    pub invited: Vec<(String, [u8; NONCE_BYTES])>,
    pub signature: Vec<u8>,
}

/// Members one invitations message names at most (it stays under the daemons' payload limit).
pub const MAX_INVITED: usize = 1_000;

impl InvitationsMsg {
    /// What the server signs: everything but the signature, after a domain label.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.raw(b"conclave keyserver invitations v1");
        self.write_body(&mut w);
        w.into_vec()
    }
    /// The exchange this message opens for `member`, if it invites it.
    pub fn exchange(&self, member: &str) -> Option<Exchange> {
        let (_, nonce) = self.invited.iter().find(|(m, _)| m == member)?;
        Some(Exchange {
            group: self.group.clone(),
            server: self.server.clone(),
            member: member.to_owned(),
            view: self.view,
            nonce: *nonce,
        })
    }
    fn write_body(&self, w: &mut Writer) {
        w.name(&self.group, MAX_NAME_BYTES);
        w.name(&self.server, MAX_NAME_BYTES);
        crate::client::write_view(w, &self.view);
        w.count(self.invited.len(), MAX_INVITED);
        for (m, n) in &self.invited {
            w.name(m, MAX_NAME_BYTES);
            w.raw(n);
        }
    }
}

/// The group key a view is bound to, for one member registered after the view's key was
/// announced: sealed under a key from that member's individual key, and signed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LateKeyMsg {
    pub group: String,
    pub server: String,
    pub member: String,
    pub view: GroupViewId,
    pub epoch: u64,
    /// As the view key named them.
    pub excluded: Vec<String>,
    pub sealed: Vec<u8>,
    pub signature: Vec<u8>,
}

/// Bytes of a sealed group key (the key and the AEAD tag).
pub const LATE_SEALED_BYTES: usize = 48;

impl LateKeyMsg {
    /// What the server signs: everything but the signature, after a domain label.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.raw(b"conclave keyserver late key v1");
        self.write_body(&mut w);
        w.into_vec()
    }
    /// What the sealing binds: the group, the member, the view and the epoch.
    pub fn sealing_aad(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.raw(b"conclave keyserver late key sealing v1");
        w.name(&self.group, MAX_NAME_BYTES);
        w.name(&self.member, MAX_NAME_BYTES);
        crate::client::write_view(&mut w, &self.view);
        w.u64(self.epoch);
        w.into_vec()
    }
    fn write_body(&self, w: &mut Writer) {
        w.name(&self.group, MAX_NAME_BYTES);
        w.name(&self.server, MAX_NAME_BYTES);
        w.name(&self.member, MAX_NAME_BYTES);
        crate::client::write_view(w, &self.view);
        w.u64(self.epoch);
        write_names(w, &self.excluded);
        w.bytes(&self.sealed, LATE_SEALED_BYTES);
    }
}

fn write_names(w: &mut Writer, names: &[String]) {
    w.count(names.len(), u32::MAX as usize);
    for n in names {
        w.name(n, MAX_NAME_BYTES);
    }
}

fn read_names(r: &mut Reader<'_>) -> Result<Vec<String>, DecodeError> {
    let n = r.u32("excluded count")? as usize;
    // Each name takes at least two bytes: a count past that is a lie.
    if n > r.remaining() / 2 {
        return Err(DecodeError::TooLong {
            what: "excluded count",
            len: n,
            max: r.remaining() / 2,
        });
    }
    let mut names = Vec::with_capacity(n);
    for _ in 0..n {
        names.push(r.name("excluded member", MAX_NAME_BYTES)?);
    }
    Ok(names)
}

/// The server's word that the members of `view` seal under the group key of `epoch` (the key
/// `key_id`, `key_version` of the graph); `excluded` names the view's members that hold no keys
/// (not registered), which members must not count as holders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewKeyMsg {
    pub group: String,
    pub server: String,
    pub view: GroupViewId,
    pub epoch: u64,
    pub key_id: u64,
    pub key_version: u64,
    pub excluded: Vec<String>,
    pub signature: Vec<u8>,
}

const SERVICE_REGISTER: u8 = 1;
const SERVICE_REKEY: u8 = 2;
const SERVICE_VIEW_KEY: u8 = 3;
const SERVICE_KNOCK: u8 = 4;
const SERVICE_LATE_KEY: u8 = 5;
const SERVICE_INVITATIONS: u8 = 6;

impl ViewKeyMsg {
    /// What the server signs: everything but the signature, after a domain label.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.raw(b"conclave keyserver view key v1");
        self.write_body(&mut w);
        w.into_vec()
    }
    fn write_body(&self, w: &mut Writer) {
        w.name(&self.group, MAX_NAME_BYTES);
        w.name(&self.server, MAX_NAME_BYTES);
        crate::client::write_view(w, &self.view);
        w.u64(self.epoch);
        w.u64(self.key_id);
        w.u64(self.key_version);
        write_names(w, &self.excluded);
    }
}

impl<'a> ServiceMsg<'a> {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(VERSION);
        match self {
            ServiceMsg::Register(b) => {
                w.u8(SERVICE_REGISTER);
                w.raw(b);
            }
            ServiceMsg::Rekey(b) => {
                w.u8(SERVICE_REKEY);
                w.raw(b);
            }
            ServiceMsg::ViewKey(v) => {
                w.u8(SERVICE_VIEW_KEY);
                v.write_body(&mut w);
                w.bytes(&v.signature, MAX_SIGNATURE_BYTES);
            }
            ServiceMsg::Knock { group, view } => {
                w.u8(SERVICE_KNOCK);
                w.name(group, MAX_NAME_BYTES);
                crate::client::write_view(&mut w, view);
            }
            ServiceMsg::LateKey(l) => {
                w.u8(SERVICE_LATE_KEY);
                l.write_body(&mut w);
                w.bytes(&l.signature, MAX_SIGNATURE_BYTES);
            }
            ServiceMsg::Invitations(i) => {
                w.u8(SERVICE_INVITATIONS);
                i.write_body(&mut w);
                w.bytes(&i.signature, MAX_SIGNATURE_BYTES);
            }
        }
        w.into_vec()
    }

    pub fn decode(buf: &'a [u8]) -> Result<ServiceMsg<'a>, DecodeError> {
        let mut r = Reader::new(buf);
        let v = r.u8("version")?;
        if v != VERSION {
            return Err(DecodeError::BadVersion(v));
        }
        let msg = match r.u8("service message kind")? {
            tag @ (SERVICE_REGISTER | SERVICE_REKEY) => {
                let body = r.take(r.remaining(), "service message body")?;
                if body.is_empty() {
                    return Err(DecodeError::Empty {
                        what: "service message body",
                    });
                }
                match tag {
                    SERVICE_REGISTER => ServiceMsg::Register(body),
                    _ => ServiceMsg::Rekey(body),
                }
            }
            SERVICE_VIEW_KEY => {
                let group = r.name("group", MAX_NAME_BYTES)?;
                let server = r.name("server", MAX_NAME_BYTES)?;
                let view = crate::client::read_view(&mut r)?;
                let epoch = r.u64("epoch")?;
                let key_id = r.u64("key id")?;
                let key_version = r.u64("key version")?;
                let excluded = read_names(&mut r)?;
                let signature = signature(&mut r)?;
                ServiceMsg::ViewKey(ViewKeyMsg {
                    group,
                    server,
                    view,
                    epoch,
                    key_id,
                    key_version,
                    excluded,
                    signature,
                })
            }
            SERVICE_LATE_KEY => {
                let group = r.name("group", MAX_NAME_BYTES)?;
                let server = r.name("server", MAX_NAME_BYTES)?;
                let member = r.name("member", MAX_NAME_BYTES)?;
                let view = crate::client::read_view(&mut r)?;
                let epoch = r.u64("epoch")?;
                let excluded = read_names(&mut r)?;
                let sealed = r.bytes("sealed key", LATE_SEALED_BYTES)?.to_vec();
                let signature = signature(&mut r)?;
                ServiceMsg::LateKey(LateKeyMsg {
                    group,
                    server,
                    member,
                    view,
                    epoch,
                    excluded,
                    sealed,
                    signature,
                })
            }
            SERVICE_INVITATIONS => {
                let group = r.name("group", MAX_NAME_BYTES)?;
                let server = r.name("server", MAX_NAME_BYTES)?;
                let view = crate::client::read_view(&mut r)?;
                let n = r.u32("invited count")? as usize;
                if n > MAX_INVITED || n > r.remaining() / (2 + NONCE_BYTES) {
                    return Err(DecodeError::TooLong {
                        what: "invited count",
                        len: n,
                        max: MAX_INVITED.min(r.remaining() / (2 + NONCE_BYTES)),
                    });
                }
                let mut invited = Vec::with_capacity(n);
                for _ in 0..n {
                    let m = r.name("invited member", MAX_NAME_BYTES)?;
                    invited.push((m, array(&mut r, "nonce")?));
                }
                let signature = signature(&mut r)?;
                ServiceMsg::Invitations(InvitationsMsg {
                    group,
                    server,
                    view,
                    invited,
                    signature,
                })
            }
            SERVICE_KNOCK => ServiceMsg::Knock {
                group: r.name("group", MAX_NAME_BYTES)?,
                view: crate::client::read_view(&mut r)?,
            },
            tag => {
                return Err(DecodeError::BadTag {
                    what: "service message kind",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(msg)
    }
}

/// What a welcome tells a member on admitting it: its place in the key graph, the epoch whose
/// rekey carries its first keys, and how the graph is built (so a member needs no configuration
/// of its own for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    pub user: u64,
    pub slot: u32,
    pub epoch: u64,
    /// `None`: a star; `Some(d)`: a tree of degree `d`.
    pub degree: Option<u32>,
    /// 0: AES-256-GCM, 1: ChaCha20-Poly1305.
    pub aead: u8,
}

impl Admission {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(VERSION);
        w.u64(self.user);
        w.u32(self.slot);
        w.u64(self.epoch);
        w.u8(u8::from(self.degree.is_some()));
        w.u32(self.degree.unwrap_or(0));
        w.u8(self.aead);
        w.into_vec()
    }
    pub fn decode(buf: &[u8]) -> Result<Admission, DecodeError> {
        let mut r = Reader::new(buf);
        let v = r.u8("version")?;
        if v != VERSION {
            return Err(DecodeError::BadVersion(v));
        }
        let user = r.u64("user")?;
        let slot = r.u32("slot")?;
        let epoch = r.u64("epoch")?;
        let tree = r.u8("graph")?;
        let degree = r.u32("degree")?;
        let degree = match tree {
            0 if degree == 0 => None,
            1 => Some(degree),
            tag => return Err(DecodeError::BadTag { what: "graph", tag }),
        };
        let aead = r.u8("aead")?;
        if aead > 1 {
            return Err(DecodeError::BadTag {
                what: "aead",
                tag: aead,
            });
        }
        r.finish()?;
        Ok(Admission {
            user,
            slot,
            epoch,
            degree,
            aead,
        })
    }
}

fn signature(r: &mut Reader<'_>) -> Result<Vec<u8>, DecodeError> {
    let s = r.bytes("signature", MAX_SIGNATURE_BYTES)?;
    if s.is_empty() {
        return Err(DecodeError::Empty { what: "signature" });
    }
    Ok(s.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcs::RingId;

    fn exchange() -> Exchange {
        Exchange {
            group: "feed".into(),
            server: "#ks#d1".into(),
            member: "#m7#d2".into(),
            view: GroupViewId {
                ring: RingId {
                    seq: 9,
                    rep: 1,
                    inc: 2,
                },
                index: 4,
            },
            nonce: [7; NONCE_BYTES],
        }
    }

    #[test]
    fn round_trips_and_refusals() {
        let msgs = [
            RegisterMsg::Invite {
                exchange: exchange(),
                signature: vec![9; 64],
            },
            RegisterMsg::Hello {
                exchange: exchange(),
                element: [1; 32],
                signature: vec![2; 64],
            },
            RegisterMsg::Welcome {
                exchange: exchange(),
                member_element: [1; 32],
                element: [3; 32],
                admission: vec![5; 20],
                signature: vec![4; 64],
            },
        ];
        for m in &msgs {
            let b = m.encode();
            assert_eq!(&RegisterMsg::decode(&b).unwrap(), m);
            for cut in 0..b.len() {
                assert!(RegisterMsg::decode(&b[..cut]).is_err(), "cut at {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert_eq!(RegisterMsg::decode(&long), Err(DecodeError::Trailing(1)));
        }
        let mut b = msgs[0].encode();
        b[0] = 2;
        assert_eq!(RegisterMsg::decode(&b), Err(DecodeError::BadVersion(2)));
        b[0] = VERSION;
        b[1] = 9;
        assert!(matches!(
            RegisterMsg::decode(&b),
            Err(DecodeError::BadTag { tag: 9, .. })
        ));
        let empty_sig = RegisterMsg::Hello {
            exchange: exchange(),
            element: [1; 32],
            signature: vec![],
        };
        assert_eq!(
            RegisterMsg::decode(&empty_sig.encode()),
            Err(DecodeError::Empty { what: "signature" })
        );
    }

    #[test]
    fn service_messages_round_trip_and_refuse_cuts() {
        let view_key = ViewKeyMsg {
            group: "feed".into(),
            server: "#ks#d1".into(),
            view: exchange().view,
            epoch: 12,
            key_id: 1,
            key_version: 40,
            excluded: vec!["#x#d2".into(), "#y#d3".into()],
            signature: vec![6; 64],
        };
        let register = RegisterMsg::Invite {
            exchange: exchange(),
            signature: vec![9; 64],
        }
        .encode();
        let msgs = [
            ServiceMsg::Register(&register),
            ServiceMsg::Rekey(&[1, 2, 3]),
            ServiceMsg::ViewKey(view_key.clone()),
            ServiceMsg::Knock {
                group: "feed".into(),
                view: exchange().view,
            },
            ServiceMsg::LateKey(LateKeyMsg {
                group: "feed".into(),
                server: "#ks#d1".into(),
                member: "#m7#d2".into(),
                view: exchange().view,
                epoch: 3,
                excluded: vec!["#x#d2".into()],
                sealed: vec![8; LATE_SEALED_BYTES],
                signature: vec![6; 64],
            }),
            ServiceMsg::Invitations(InvitationsMsg {
                group: "feed".into(),
                server: "#ks#d1".into(),
                view: exchange().view,
                invited: vec![("#m7#d2".into(), [1; 32]), ("#m8#d3".into(), [2; 32])],
                signature: vec![6; 64],
            }),
        ];
        for m in &msgs {
            let b = m.encode();
            assert_eq!(&ServiceMsg::decode(&b).unwrap(), m);
            for cut in 0..2 {
                assert!(ServiceMsg::decode(&b[..cut]).is_err());
            }
        }
        // Fixed-layout kinds refuse every cut and any trailing byte.
        for m in &msgs[2..] {
            let b = m.encode();
            for cut in 0..b.len() {
                assert!(ServiceMsg::decode(&b[..cut]).is_err(), "cut at {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert_eq!(ServiceMsg::decode(&long), Err(DecodeError::Trailing(1)));
        }
        // The signature covers every field but itself.
        let mut other = view_key.clone();
        other.signature = vec![1; 64];
        assert_eq!(other.signed_bytes(), view_key.signed_bytes());
        other.excluded.pop();
        assert_ne!(other.signed_bytes(), view_key.signed_bytes());
        // A count of names the bytes cannot hold is refused before anything is allocated.
        let mut b = ServiceMsg::ViewKey(view_key).encode();
        let at = b.len() - 64 - 4 - 2 * 6 - 4;
        b[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            ServiceMsg::decode(&b),
            Err(DecodeError::TooLong { .. })
        ));
    }

    #[test]
    fn admissions_round_trip_and_refuse_bad_fields() {
        for degree in [None, Some(4)] {
            let a = Admission {
                user: 7,
                slot: 3,
                epoch: 9,
                degree,
                aead: 1,
            };
            let b = a.encode();
            assert_eq!(Admission::decode(&b), Ok(a));
            for cut in 0..b.len() {
                assert!(Admission::decode(&b[..cut]).is_err());
            }
        }
        let mut b = Admission {
            user: 1,
            slot: 0,
            epoch: 1,
            degree: None,
            aead: 0,
        }
        .encode();
        let last = b.len() - 1;
        b[last] = 2;
        assert!(Admission::decode(&b).is_err());
        b[last] = 0;
        b[21] = 2;
        assert!(Admission::decode(&b).is_err());
    }
}
