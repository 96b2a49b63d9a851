//! Key agreement messages: one signed envelope, and a body per protocol and step.
//!
//! The envelope names protocol, group, view and sender, so that a message of another group,
//! another run or another member cannot be mistaken for one of this run (paper 000 §3.2); the
//! view is the daemons' group view id, encoded as the client protocol encodes it. The signature
//! covers every byte before it. Group elements travel as opaque byte strings here;
//! the `gka` crate decodes them into its group and checks membership.

use crate::client::{read_view, write_view, GroupViewId};
use crate::codec::{DecodeError, Reader, Writer};

/// The envelope format version this build speaks (2: the view is a group view id, ring and
/// index, and the epoch, which always equalled the view, is gone).
pub const VERSION: u8 = 2;
/// Longest member or group name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Most members a message may list (and so the largest group a run supports).
pub const MAX_MEMBERS: usize = 4096;
/// Largest encoded group element (a 4096-bit MODP element is 512 bytes).
pub const MAX_ELEMENT_BYTES: usize = 512;
/// Largest signature (RSA-4096 is 512 bytes).
pub const MAX_SIGNATURE_BYTES: usize = 512;
/// Largest message body.
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// Most nodes in an encoded key tree (a binary tree over `MAX_MEMBERS` leaves).
pub const MAX_TREE_NODES: usize = 2 * MAX_MEMBERS - 1;
/// Longest node path (root to node) in a key tree.
pub const MAX_PATH_BITS: usize = 1024;

/// The five protocols, as numbered on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProtocolId {
    Gdh = 1,
    Ckd = 2,
    Tgdh = 3,
    Str = 4,
    Bd = 5,
}

impl ProtocolId {
    /// All five, in their wire order.
    pub const ALL: [ProtocolId; 5] = [
        ProtocolId::Gdh,
        ProtocolId::Ckd,
        ProtocolId::Tgdh,
        ProtocolId::Str,
        ProtocolId::Bd,
    ];
    pub fn from_u8(v: u8) -> Result<Self, DecodeError> {
        Ok(match v {
            1 => ProtocolId::Gdh,
            2 => ProtocolId::Ckd,
            3 => ProtocolId::Tgdh,
            4 => ProtocolId::Str,
            5 => ProtocolId::Bd,
            tag => {
                return Err(DecodeError::BadTag {
                    what: "protocol",
                    tag,
                })
            }
        })
    }
}

/// A signed key agreement message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub protocol: ProtocolId,
    pub group: String,
    /// The view of the run the message belongs to.
    pub view: GroupViewId,
    pub sender: String,
    /// The body's step tag, also inside the signed part.
    pub kind: u8,
    pub body: Vec<u8>,
    pub signature: Vec<u8>,
}

impl Envelope {
    /// The bytes the signature covers: everything but the signature.
    pub fn signed_part(&self) -> Vec<u8> {
        let mut w =
            Writer::with_capacity(self.body.len() + 64 + self.group.len() + self.sender.len());
        self.write_signed(&mut w);
        w.into_vec()
    }
    fn write_signed(&self, w: &mut Writer) {
        w.u8(VERSION);
        w.u8(self.protocol as u8);
        w.name(&self.group, MAX_NAME_BYTES);
        write_view(w, &self.view);
        w.name(&self.sender, MAX_NAME_BYTES);
        w.u8(self.kind);
        w.bytes(&self.body, MAX_BODY_BYTES);
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(self.body.len() + 128 + self.signature.len());
        self.write_signed(&mut w);
        w.bytes(&self.signature, MAX_SIGNATURE_BYTES);
        w.into_vec()
    }
    /// Decodes an envelope; returns it with the length of its signed part.
    /// The view an encoded envelope names, read without decoding the rest (nothing is checked
    /// beyond the fields up to the view).
    pub fn view_of(buf: &[u8]) -> Result<GroupViewId, DecodeError> {
        let mut r = Reader::new(buf);
        let v = r.u8("version")?;
        if v != VERSION {
            return Err(DecodeError::BadVersion(v));
        }
        ProtocolId::from_u8(r.u8("protocol")?)?;
        r.name("group", MAX_NAME_BYTES)?;
        read_view(&mut r)
    }

    pub fn decode(buf: &[u8]) -> Result<(Envelope, usize), DecodeError> {
        let mut r = Reader::new(buf);
        let v = r.u8("version")?;
        if v != VERSION {
            return Err(DecodeError::BadVersion(v));
        }
        let protocol = ProtocolId::from_u8(r.u8("protocol")?)?;
        let group = r.name("group", MAX_NAME_BYTES)?;
        let view = read_view(&mut r)?;
        let sender = r.name("sender", MAX_NAME_BYTES)?;
        let kind = r.u8("kind")?;
        let body = r.bytes("body", MAX_BODY_BYTES)?.to_vec();
        let signed_len = r.position();
        let signature = r.bytes("signature", MAX_SIGNATURE_BYTES)?.to_vec();
        r.finish()?;
        Ok((
            Envelope {
                protocol,
                group,
                view,
                sender,
                kind,
                body,
                signature,
            },
            signed_len,
        ))
    }
}

fn write_elem(w: &mut Writer, e: &[u8]) {
    w.bytes(e, MAX_ELEMENT_BYTES);
}
fn read_elem(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<u8>, DecodeError> {
    Ok(r.bytes(what, MAX_ELEMENT_BYTES)?.to_vec())
}
fn write_names(w: &mut Writer, names: &[String]) {
    w.count(names.len(), MAX_MEMBERS);
    for n in names {
        w.name(n, MAX_NAME_BYTES);
    }
}
fn read_names(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<String>, DecodeError> {
    let n = r.count(what, MAX_MEMBERS)?;
    let mut v = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        v.push(r.name(what, MAX_NAME_BYTES)?);
    }
    Ok(v)
}
fn write_named_elems(w: &mut Writer, v: &[(String, Vec<u8>)]) {
    w.count(v.len(), MAX_MEMBERS);
    for (n, e) in v {
        w.name(n, MAX_NAME_BYTES);
        write_elem(w, e);
    }
}
fn read_named_elems(
    r: &mut Reader<'_>,
    what: &'static str,
) -> Result<Vec<(String, Vec<u8>)>, DecodeError> {
    let n = r.count(what, MAX_MEMBERS)?;
    let mut v = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        let name = r.name(what, MAX_NAME_BYTES)?;
        v.push((name, read_elem(r, what)?));
    }
    Ok(v)
}
fn write_opt_elem(w: &mut Writer, e: &Option<Vec<u8>>) {
    match e {
        None => w.u8(0),
        Some(e) => {
            w.u8(1);
            write_elem(w, e);
        }
    }
}
fn read_opt_elem(r: &mut Reader<'_>, what: &'static str) -> Result<Option<Vec<u8>>, DecodeError> {
    match r.u8(what)? {
        0 => Ok(None),
        1 => Ok(Some(read_elem(r, what)?)),
        tag => Err(DecodeError::BadTag { what, tag }),
    }
}

/// GDH (paper 000 Figs 1-2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GdhMsg {
    /// The upflow token passed along the new members; `roster` is the new GDH order.
    Upflow { roster: Vec<String>, token: Vec<u8> },
    /// The last new member's broadcast of the token without its own contribution.
    Downflow { roster: Vec<String>, token: Vec<u8> },
    /// A member's token with its contribution factored out, to the new controller.
    FactorOut { value: Vec<u8> },
    /// The controller's list of partial keys.
    Partials {
        roster: Vec<String>,
        partials: Vec<(String, Vec<u8>)>,
    },
}

impl GdhMsg {
    pub fn kind(&self) -> u8 {
        match self {
            GdhMsg::Upflow { .. } => 1,
            GdhMsg::Downflow { .. } => 2,
            GdhMsg::FactorOut { .. } => 3,
            GdhMsg::Partials { .. } => 4,
        }
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            GdhMsg::Upflow { roster, token } | GdhMsg::Downflow { roster, token } => {
                write_names(&mut w, roster);
                write_elem(&mut w, token);
            }
            GdhMsg::FactorOut { value } => write_elem(&mut w, value),
            GdhMsg::Partials { roster, partials } => {
                write_names(&mut w, roster);
                write_named_elems(&mut w, partials);
            }
        }
        w.into_vec()
    }
    pub fn decode(kind: u8, body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        let m = match kind {
            1 | 2 => {
                let roster = read_names(&mut r, "roster")?;
                let token = read_elem(&mut r, "token")?;
                if kind == 1 {
                    GdhMsg::Upflow { roster, token }
                } else {
                    GdhMsg::Downflow { roster, token }
                }
            }
            3 => GdhMsg::FactorOut {
                value: read_elem(&mut r, "factor-out")?,
            },
            4 => GdhMsg::Partials {
                roster: read_names(&mut r, "roster")?,
                partials: read_named_elems(&mut r, "partials")?,
            },
            tag => {
                return Err(DecodeError::BadTag {
                    what: "gdh kind",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(m)
    }
}

/// CKD (paper 000 Figs 3-4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CkdMsg {
    /// The controller's long-term DH share, to the members it has no channel with yet.
    Hello {
        controller_share: Vec<u8>,
        recipients: Vec<String>,
    },
    /// A member's long-term DH share, back to the controller.
    Response { member_share: Vec<u8> },
    /// The group secret, exponentiated with each member's pairwise key.
    KeyDist {
        roster: Vec<String>,
        entries: Vec<(String, Vec<u8>)>,
    },
}

impl CkdMsg {
    pub fn kind(&self) -> u8 {
        match self {
            CkdMsg::Hello { .. } => 1,
            CkdMsg::Response { .. } => 2,
            CkdMsg::KeyDist { .. } => 3,
        }
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            CkdMsg::Hello {
                controller_share,
                recipients,
            } => {
                write_elem(&mut w, controller_share);
                write_names(&mut w, recipients);
            }
            CkdMsg::Response { member_share } => write_elem(&mut w, member_share),
            CkdMsg::KeyDist { roster, entries } => {
                write_names(&mut w, roster);
                write_named_elems(&mut w, entries);
            }
        }
        w.into_vec()
    }
    pub fn decode(kind: u8, body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        let m = match kind {
            1 => CkdMsg::Hello {
                controller_share: read_elem(&mut r, "controller share")?,
                recipients: read_names(&mut r, "recipients")?,
            },
            2 => CkdMsg::Response {
                member_share: read_elem(&mut r, "member share")?,
            },
            3 => CkdMsg::KeyDist {
                roster: read_names(&mut r, "roster")?,
                entries: read_named_elems(&mut r, "entries")?,
            },
            tag => {
                return Err(DecodeError::BadTag {
                    what: "ckd kind",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(m)
    }
}

/// One node of a key tree's shape in preorder: a leaf is an index into the view's member list;
/// a stale node is one a membership event invalidated, whose blinded key the run will compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeNode {
    Leaf { index: u16, stale: bool },
    Internal { stale: bool },
}

/// A path from the root: `false` is left, `true` is right.
pub type NodePath = Vec<bool>;

fn write_path(w: &mut Writer, p: &NodePath) {
    assert!(p.len() <= MAX_PATH_BITS);
    w.u16(p.len() as u16);
    let mut bytes = vec![0u8; p.len().div_ceil(8)];
    for (i, b) in p.iter().enumerate() {
        if *b {
            bytes[i / 8] |= 0x80 >> (i % 8);
        }
    }
    w.raw(&bytes);
}
fn read_path(r: &mut Reader<'_>) -> Result<NodePath, DecodeError> {
    let n = r.u16("path length")? as usize;
    if n > MAX_PATH_BITS {
        return Err(DecodeError::TooLong {
            what: "path",
            len: n,
            max: MAX_PATH_BITS,
        });
    }
    let bytes = r.take(n.div_ceil(8), "path")?;
    // One encoding per path: the unused low bits of the last byte must be zero.
    if !n.is_multiple_of(8) && bytes[n / 8] & (0xff >> (n % 8)) != 0 {
        return Err(DecodeError::Padding { what: "path" });
    }
    Ok((0..n)
        .map(|i| bytes[i / 8] & (0x80 >> (i % 8)) != 0)
        .collect())
}

/// TGDH (paper 000 §4.3, Figs 5-6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TgdhMsg {
    /// The first round of a merge: a side's tree shape in preorder (no blinded key but the
    /// side's root's, when it is known), and whether a leaf key of the side was drawn in this run.
    Shape {
        nodes: Vec<ShapeNode>,
        root_bk: Option<Vec<u8>>,
        fresh: bool,
    },
    /// Blinded keys a sponsor computed, by node path in the tree all members now share.
    Update { bks: Vec<(NodePath, Vec<u8>)> },
}

impl TgdhMsg {
    pub fn kind(&self) -> u8 {
        match self {
            TgdhMsg::Shape { .. } => 1,
            TgdhMsg::Update { .. } => 2,
        }
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            TgdhMsg::Shape {
                nodes,
                root_bk,
                fresh,
            } => {
                w.count(nodes.len(), MAX_TREE_NODES);
                // One bit per node (1: internal), one per node (1: stale), then the leaves'
                // member indexes.
                let mut kinds = vec![0u8; nodes.len().div_ceil(8)];
                let mut stale = kinds.clone();
                for (i, n) in nodes.iter().enumerate() {
                    let (internal, s) = match n {
                        ShapeNode::Internal { stale } => (true, *stale),
                        ShapeNode::Leaf { stale, .. } => (false, *stale),
                    };
                    if internal {
                        kinds[i / 8] |= 0x80 >> (i % 8);
                    }
                    if s {
                        stale[i / 8] |= 0x80 >> (i % 8);
                    }
                }
                w.raw(&kinds);
                w.raw(&stale);
                for n in nodes {
                    if let ShapeNode::Leaf { index, .. } = n {
                        w.u16(*index);
                    }
                }
                write_opt_elem(&mut w, root_bk);
                w.u8(*fresh as u8);
            }
            TgdhMsg::Update { bks } => {
                w.count(bks.len(), MAX_TREE_NODES);
                for (p, e) in bks {
                    write_path(&mut w, p);
                    write_elem(&mut w, e);
                }
            }
        }
        w.into_vec()
    }
    pub fn decode(kind: u8, body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        let m = match kind {
            1 => {
                let n = r.count("tree nodes", MAX_TREE_NODES)?;
                let kinds = r.take(n.div_ceil(8), "tree shape")?;
                let stale = r.take(n.div_ceil(8), "stale nodes")?;
                for bits in [kinds, stale] {
                    if !n.is_multiple_of(8) && bits[n / 8] & (0xff >> (n % 8)) != 0 {
                        return Err(DecodeError::Padding { what: "tree shape" });
                    }
                }
                let bit = |bits: &[u8], i: usize| bits[i / 8] & (0x80 >> (i % 8)) != 0;
                let mut nodes = Vec::with_capacity(n);
                for i in 0..n {
                    let stale = bit(stale, i);
                    nodes.push(if bit(kinds, i) {
                        ShapeNode::Internal { stale }
                    } else {
                        ShapeNode::Leaf {
                            index: r.u16("leaf index")?,
                            stale,
                        }
                    });
                }
                let root_bk = read_opt_elem(&mut r, "root bk")?;
                let fresh = match r.u8("fresh")? {
                    0 => false,
                    1 => true,
                    tag => return Err(DecodeError::BadTag { what: "fresh", tag }),
                };
                TgdhMsg::Shape {
                    nodes,
                    root_bk,
                    fresh,
                }
            }
            2 => {
                let n = r.count("updates", MAX_TREE_NODES)?;
                let mut bks = Vec::with_capacity(n.min(r.remaining()));
                for _ in 0..n {
                    let p = read_path(&mut r)?;
                    bks.push((p, read_elem(&mut r, "bk")?));
                }
                TgdhMsg::Update { bks }
            }
            tag => {
                return Err(DecodeError::BadTag {
                    what: "tgdh kind",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(m)
    }
}

/// STR (paper 000 §4.4, Figs 7-8). Positions count leaves from the bottom of the chain (0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StrMsg {
    /// The first round of a merge: a side's chain, bottom-up, each member as its index in the
    /// view's member list with its leaf's blinded key when the message carries it, and the
    /// blinded keys of the nodes the sponsor computed, by position (the top node's among them,
    /// unless the chain is one leaf).
    Chain {
        leaves: Vec<(u16, Option<Vec<u8>>)>,
        nodes: Vec<(u32, Vec<u8>)>,
    },
    /// A refreshed leaf and recomputed internal blinded keys, by position.
    Update {
        leaf: Option<(u32, Vec<u8>)>,
        internal: Vec<(u32, Vec<u8>)>,
    },
    /// The first round of a merge, from the bottom member of a side that may be stacked on
    /// another: its side's leaf blinded keys the sponsor does not hold, by view index.
    Leaves { leaves: Vec<(u16, Vec<u8>)> },
}

impl StrMsg {
    pub fn kind(&self) -> u8 {
        match self {
            StrMsg::Chain { .. } => 1,
            StrMsg::Update { .. } => 2,
            StrMsg::Leaves { .. } => 3,
        }
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            StrMsg::Chain { leaves, nodes } => {
                w.count(leaves.len(), MAX_MEMBERS);
                for (index, e) in leaves {
                    w.u16(*index);
                    write_opt_elem(&mut w, e);
                }
                w.count(nodes.len(), MAX_MEMBERS);
                for (pos, e) in nodes {
                    w.u32(*pos);
                    write_elem(&mut w, e);
                }
            }
            StrMsg::Update { leaf, internal } => {
                match leaf {
                    None => w.u8(0),
                    Some((pos, e)) => {
                        w.u8(1);
                        w.u32(*pos);
                        write_elem(&mut w, e);
                    }
                }
                w.count(internal.len(), MAX_MEMBERS);
                for (pos, e) in internal {
                    w.u32(*pos);
                    write_elem(&mut w, e);
                }
            }
            StrMsg::Leaves { leaves } => {
                w.count(leaves.len(), MAX_MEMBERS);
                for (index, e) in leaves {
                    w.u16(*index);
                    write_elem(&mut w, e);
                }
            }
        }
        w.into_vec()
    }
    pub fn decode(kind: u8, body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        let m = match kind {
            1 => {
                let n = r.count("chain leaves", MAX_MEMBERS)?;
                let mut leaves = Vec::with_capacity(n.min(r.remaining()));
                for _ in 0..n {
                    let index = r.u16("leaf index")?;
                    leaves.push((index, read_opt_elem(&mut r, "leaf bk")?));
                }
                let n = r.count("chain nodes", MAX_MEMBERS)?;
                let mut nodes = Vec::with_capacity(n.min(r.remaining()));
                for _ in 0..n {
                    let pos = r.u32("node position")?;
                    nodes.push((pos, read_elem(&mut r, "node bk")?));
                }
                StrMsg::Chain { leaves, nodes }
            }
            2 => {
                let leaf = match r.u8("leaf flag")? {
                    0 => None,
                    1 => {
                        let pos = r.u32("leaf position")?;
                        Some((pos, read_elem(&mut r, "leaf bk")?))
                    }
                    tag => {
                        return Err(DecodeError::BadTag {
                            what: "leaf flag",
                            tag,
                        })
                    }
                };
                let n = r.count("internal updates", MAX_MEMBERS)?;
                let mut internal = Vec::with_capacity(n.min(r.remaining()));
                for _ in 0..n {
                    let pos = r.u32("internal position")?;
                    internal.push((pos, read_elem(&mut r, "internal bk")?));
                }
                StrMsg::Update { leaf, internal }
            }
            3 => {
                let n = r.count("leaves", MAX_MEMBERS)?;
                let mut leaves = Vec::with_capacity(n.min(r.remaining()));
                for _ in 0..n {
                    let index = r.u16("leaf index")?;
                    leaves.push((index, read_elem(&mut r, "leaf bk")?));
                }
                StrMsg::Leaves { leaves }
            }
            tag => {
                return Err(DecodeError::BadTag {
                    what: "str kind",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(m)
    }
}

/// BD (paper 000 Fig 9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BdMsg {
    /// Round 1: `Z_i = g^{r_i}`.
    Z { z: Vec<u8> },
    /// Round 2: `X_i = (Z_{i+1}/Z_{i-1})^{r_i}`.
    X { x: Vec<u8> },
}

impl BdMsg {
    pub fn kind(&self) -> u8 {
        match self {
            BdMsg::Z { .. } => 1,
            BdMsg::X { .. } => 2,
        }
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            BdMsg::Z { z } => write_elem(&mut w, z),
            BdMsg::X { x } => write_elem(&mut w, x),
        }
        w.into_vec()
    }
    pub fn decode(kind: u8, body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        let m = match kind {
            1 => BdMsg::Z {
                z: read_elem(&mut r, "z")?,
            },
            2 => BdMsg::X {
                x: read_elem(&mut r, "x")?,
            },
            tag => {
                return Err(DecodeError::BadTag {
                    what: "bd kind",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests;
