//! Key-graph rekey messages (paper 001 §3-§4): one format for every key graph and rekeying
//! strategy.
//!
//! A rekey message names its group and epoch, the shape of the key graph after the change, the
//! group key it leads to (by id and version), who it is for, and a list of items. An item is one
//! AEAD ciphertext of one or more new keys under one key the recipients already hold; keys are
//! named by `KeyRef` (an id inside the graph and a version that grows with every change of that
//! key), so a member knows before decrypting whether it can. The authenticator comes last and
//! covers every byte before it: nothing, one signature, or one signature over a Merkle tree of the
//! whole batch of messages with this message's authentication path (§4).

use crate::codec::{DecodeError, Reader, Writer};

/// The rekey format version this build speaks.
pub const VERSION: u8 = 1;
/// Longest group name, in bytes.
pub const MAX_GROUP_NAME_BYTES: usize = 64;
/// Most items in one message (a star's leave sends `n - 1` items in one group-oriented message).
pub const MAX_ITEMS: usize = 1 << 16;
/// Most keys in one item (a complete key graph of 12 members sends a joiner 4,095 keys at once).
pub const MAX_KEYS_PER_ITEM: usize = 4096;
/// Bytes of one key in the clear.
pub const KEY_BYTES: usize = 32;
/// Bytes an AEAD adds to each item.
pub const TAG_BYTES: usize = 16;
/// Most messages one batch signature covers.
pub const MAX_BATCH_MESSAGES: usize = 1 << 24;
/// Longest Merkle authentication path (a tree over `MAX_BATCH_MESSAGES` leaves is 24 deep).
pub const MAX_AUTH_PATH: usize = 24;
/// Largest signature (RSA-4096 is 512 bytes).
pub const MAX_SIGNATURE_BYTES: usize = 512;

/// A key of the graph at one version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyRef {
    /// The k-node: `level << 32 | offset` in a tree, the member set as a bit mask in a complete
    /// graph.
    pub id: u64,
    /// The epoch at which the key got this value; a key changes at most once per epoch.
    pub version: u64,
}

/// The key graph after the change the message announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphShape {
    /// A key tree of the given degree whose leaves (individual keys) are `height` levels below
    /// the root.
    Tree { degree: u32, height: u8 },
    /// A star: one group key over the individual keys (a tree of height 1 and unbounded degree).
    Star,
    /// A complete key graph over the member slots set in `members`.
    Complete { members: u64 },
}

/// Who a message is sent to, as a set of key holders (subgroup multicast, §3.3 fn. 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipients {
    /// Every member of the group after the change.
    All,
    /// `userset(k)`: the holders of key `k`.
    Holders(u64),
    /// `userset(k) - userset(j)`.
    HoldersExcept(u64, u64),
}

/// One ciphertext: `keys` (new values) encrypted together under `under`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// Number of the encryption within its epoch; with the epoch it makes the AEAD nonce.
    pub seq: u32,
    pub under: KeyRef,
    pub keys: Vec<KeyRef>,
    /// `keys.len() * KEY_BYTES + TAG_BYTES` bytes.
    pub ciphertext: Vec<u8>,
}

impl Item {
    /// Appends the item's encoding.
    pub fn write(&self, w: &mut Writer) {
        w.u32(self.seq);
        write_keyref(w, &self.under);
        assert!(!self.keys.is_empty() && self.keys.len() <= MAX_KEYS_PER_ITEM);
        w.u16((self.keys.len() - 1) as u16);
        for k in &self.keys {
            write_keyref(w, k);
        }
        assert_eq!(self.ciphertext.len(), Item::ciphertext_len(self.keys.len()));
        w.raw(&self.ciphertext);
    }

    /// Bytes of the item's encoding.
    pub fn encoded_len(&self) -> usize {
        4 + 16 + 2 + 16 * self.keys.len() + self.ciphertext.len()
    }

    /// Ciphertext length for `n` keys.
    pub fn ciphertext_len(n: usize) -> usize {
        n * KEY_BYTES + TAG_BYTES
    }
}

/// The authenticator of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    None,
    /// One signature over this message alone.
    Signed {
        signature: Vec<u8>,
    },
    /// One signature over the Merkle root of `leaf_count` messages; `path` holds the sibling
    /// digests from this message's leaf up (levels where the node has no sibling are skipped).
    Batch {
        leaf_index: u32,
        leaf_count: u32,
        path: Vec<[u8; 32]>,
        signature: Vec<u8>,
    },
}

/// A rekey message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RekeyMessage {
    pub group: String,
    pub epoch: u64,
    pub shape: GraphShape,
    /// The group key every recipient holds once it has applied the message.
    pub group_key: KeyRef,
    pub recipients: Recipients,
    pub items: Vec<Item>,
    pub auth: Auth,
}

fn write_keyref(w: &mut Writer, k: &KeyRef) {
    w.u64(k.id);
    w.u64(k.version);
}
fn read_keyref(r: &mut Reader<'_>, what: &'static str) -> Result<KeyRef, DecodeError> {
    Ok(KeyRef {
        id: r.u64(what)?,
        version: r.u64(what)?,
    })
}

impl RekeyMessage {
    /// Appends the authenticated part (everything but the authenticator) to `w`.
    pub fn write_body(&self, w: &mut Writer) {
        Self::write_header(
            w,
            &self.group,
            self.epoch,
            self.shape,
            self.group_key,
            self.recipients,
            self.items.len(),
        );
        for it in &self.items {
            it.write(w);
        }
    }

    /// Appends everything before the items; `items` of them must follow (see [`Item::write`]).
    pub fn write_header(
        w: &mut Writer,
        group: &str,
        epoch: u64,
        shape: GraphShape,
        group_key: KeyRef,
        recipients: Recipients,
        items: usize,
    ) {
        w.u8(VERSION);
        w.name(group, MAX_GROUP_NAME_BYTES);
        w.u64(epoch);
        match shape {
            GraphShape::Tree { degree, height } => {
                w.u8(1);
                w.u32(degree);
                w.u8(height);
            }
            GraphShape::Star => w.u8(2),
            GraphShape::Complete { members } => {
                w.u8(3);
                w.u64(members);
            }
        }
        write_keyref(w, &group_key);
        match recipients {
            Recipients::All => w.u8(0),
            Recipients::Holders(k) => {
                w.u8(1);
                w.u64(k);
            }
            Recipients::HoldersExcept(k, j) => {
                w.u8(2);
                w.u64(k);
                w.u64(j);
            }
        }
        w.count(items, MAX_ITEMS);
    }

    /// The authenticated bytes.
    pub fn body(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(self.encoded_len_hint());
        self.write_body(&mut w);
        w.into_vec()
    }

    fn encoded_len_hint(&self) -> usize {
        64 + self
            .items
            .iter()
            .map(|i| 24 + 16 * i.keys.len() + i.ciphertext.len())
            .sum::<usize>()
    }

    /// Appends an authenticator to an encoded body.
    pub fn write_auth(auth: &Auth, w: &mut Writer) {
        match auth {
            Auth::None => w.u8(0),
            Auth::Signed { signature } => {
                w.u8(1);
                w.bytes(signature, MAX_SIGNATURE_BYTES);
            }
            Auth::Batch {
                leaf_index,
                leaf_count,
                path,
                signature,
            } => {
                w.u8(2);
                w.u32(*leaf_index);
                w.u32(*leaf_count);
                assert!(path.len() <= MAX_AUTH_PATH);
                w.u8(path.len() as u8);
                for h in path {
                    w.raw(h);
                }
                w.bytes(signature, MAX_SIGNATURE_BYTES);
            }
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(self.encoded_len_hint() + 600);
        self.write_body(&mut w);
        Self::write_auth(&self.auth, &mut w);
        w.into_vec()
    }

    /// Decodes a message; returns it with the length of its authenticated part.
    pub fn decode(buf: &[u8]) -> Result<(RekeyMessage, usize), DecodeError> {
        let mut r = Reader::new(buf);
        let v = r.u8("version")?;
        if v != VERSION {
            return Err(DecodeError::BadVersion(v));
        }
        let group = r.name("group", MAX_GROUP_NAME_BYTES)?;
        let epoch = r.u64("epoch")?;
        let shape = match r.u8("graph shape")? {
            1 => GraphShape::Tree {
                degree: r.u32("degree")?,
                height: r.u8("height")?,
            },
            2 => GraphShape::Star,
            3 => GraphShape::Complete {
                members: r.u64("members")?,
            },
            tag => {
                return Err(DecodeError::BadTag {
                    what: "graph shape",
                    tag,
                })
            }
        };
        let group_key = read_keyref(&mut r, "group key")?;
        let recipients = match r.u8("recipients")? {
            0 => Recipients::All,
            1 => Recipients::Holders(r.u64("recipients")?),
            2 => Recipients::HoldersExcept(r.u64("recipients")?, r.u64("recipients")?),
            tag => {
                return Err(DecodeError::BadTag {
                    what: "recipients",
                    tag,
                })
            }
        };
        let n = r.count("items", MAX_ITEMS)?;
        // Every item takes at least 4 + 16 + 2 + 16 + 48 bytes: never reserve past the input.
        let mut items = Vec::with_capacity(n.min(r.remaining() / 86));
        for _ in 0..n {
            let seq = r.u32("item seq")?;
            let under = read_keyref(&mut r, "item key")?;
            let nkeys = r.u16("item key count")? as usize + 1;
            if nkeys > MAX_KEYS_PER_ITEM {
                return Err(DecodeError::TooLong {
                    what: "item keys",
                    len: nkeys,
                    max: MAX_KEYS_PER_ITEM,
                });
            }
            let mut keys = Vec::with_capacity(nkeys.min(r.remaining() / 16));
            for _ in 0..nkeys {
                keys.push(read_keyref(&mut r, "item new key")?);
            }
            let ciphertext = r
                .take(Item::ciphertext_len(nkeys), "item ciphertext")?
                .to_vec();
            items.push(Item {
                seq,
                under,
                keys,
                ciphertext,
            });
        }
        let body_len = r.position();
        let auth = match r.u8("auth")? {
            0 => Auth::None,
            1 => Auth::Signed {
                signature: r.bytes("signature", MAX_SIGNATURE_BYTES)?.to_vec(),
            },
            2 => {
                let leaf_index = r.u32("leaf index")?;
                let leaf_count = r.u32("leaf count")?;
                if leaf_count as usize > MAX_BATCH_MESSAGES {
                    return Err(DecodeError::TooLong {
                        what: "batch",
                        len: leaf_count as usize,
                        max: MAX_BATCH_MESSAGES,
                    });
                }
                let plen = r.u8("auth path")? as usize;
                if plen > MAX_AUTH_PATH {
                    return Err(DecodeError::TooLong {
                        what: "auth path",
                        len: plen,
                        max: MAX_AUTH_PATH,
                    });
                }
                let mut path = Vec::with_capacity(plen);
                for _ in 0..plen {
                    let mut h = [0u8; 32];
                    h.copy_from_slice(r.take(32, "auth path")?);
                    path.push(h);
                }
                Auth::Batch {
                    leaf_index,
                    leaf_count,
                    path,
                    signature: r.bytes("signature", MAX_SIGNATURE_BYTES)?.to_vec(),
                }
            }
            tag => return Err(DecodeError::BadTag { what: "auth", tag }),
        };
        r.finish()?;
        Ok((
            RekeyMessage {
                group,
                epoch,
                shape,
                group_key,
                recipients,
                items,
                auth,
            },
            body_len,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn keyref() -> impl Strategy<Value = KeyRef> {
        (any::<u64>(), any::<u64>()).prop_map(|(id, version)| KeyRef { id, version })
    }

    fn item() -> impl Strategy<Value = Item> {
        (
            any::<u32>(),
            keyref(),
            prop::collection::vec(keyref(), 1..5),
        )
            .prop_flat_map(|(seq, under, keys)| {
                let n = Item::ciphertext_len(keys.len());
                prop::collection::vec(any::<u8>(), n..=n).prop_map(move |ciphertext| Item {
                    seq,
                    under,
                    keys: keys.clone(),
                    ciphertext,
                })
            })
    }

    fn message() -> impl Strategy<Value = RekeyMessage> {
        let shape = prop_oneof![
            (any::<u32>(), any::<u8>())
                .prop_map(|(degree, height)| GraphShape::Tree { degree, height }),
            Just(GraphShape::Star),
            any::<u64>().prop_map(|members| GraphShape::Complete { members }),
        ];
        let recipients = prop_oneof![
            Just(Recipients::All),
            any::<u64>().prop_map(Recipients::Holders),
            (any::<u64>(), any::<u64>()).prop_map(|(a, b)| Recipients::HoldersExcept(a, b)),
        ];
        let auth = prop_oneof![
            Just(Auth::None),
            prop::collection::vec(any::<u8>(), 0..80)
                .prop_map(|signature| Auth::Signed { signature }),
            (
                any::<u32>(),
                any::<u32>().prop_map(|c| c % (MAX_BATCH_MESSAGES as u32 + 1)),
                prop::collection::vec(any::<[u8; 32]>(), 0..MAX_AUTH_PATH),
                prop::collection::vec(any::<u8>(), 0..80)
            )
                .prop_map(|(leaf_index, leaf_count, path, signature)| Auth::Batch {
                    leaf_index,
                    leaf_count,
                    path,
                    signature
                }),
        ];
        (
            "[a-z]{1,20}",
            any::<u64>(),
            shape,
            keyref(),
            recipients,
            prop::collection::vec(item(), 0..6),
            auth,
        )
            .prop_map(
                |(group, epoch, shape, group_key, recipients, items, auth)| RekeyMessage {
                    group,
                    epoch,
                    shape,
                    group_key,
                    recipients,
                    items,
                    auth,
                },
            )
    }

    proptest! {
        #[test]
        fn round_trip(m in message()) {
            let bytes = m.encode();
            let (back, body_len) = RekeyMessage::decode(&bytes).unwrap();
            prop_assert_eq!(&back, &m);
            prop_assert_eq!(&bytes[..body_len], &m.body()[..]);
        }

        #[test]
        fn truncation_and_garbage_are_errors(m in message(), cut in any::<prop::sample::Index>(), junk in prop::collection::vec(any::<u8>(), 0..200)) {
            let bytes = m.encode();
            let at = cut.index(bytes.len());
            prop_assert!(RekeyMessage::decode(&bytes[..at]).is_err());
            let _ = RekeyMessage::decode(&junk);
            let mut longer = bytes.clone();
            longer.push(0);
            prop_assert_eq!(RekeyMessage::decode(&longer).unwrap_err(), DecodeError::Trailing(1));
        }
    }

    #[test]
    fn oversized_counts_are_refused_before_allocation() {
        let m = RekeyMessage {
            group: "g".into(),
            epoch: 1,
            shape: GraphShape::Star,
            group_key: KeyRef { id: 1, version: 1 },
            recipients: Recipients::All,
            items: vec![],
            auth: Auth::None,
        };
        let mut bytes = m.body();
        let n = bytes.len();
        bytes[n - 4..].copy_from_slice(&(MAX_ITEMS as u32 + 1).to_be_bytes());
        assert!(matches!(
            RekeyMessage::decode(&bytes),
            Err(DecodeError::TooLong { what: "items", .. })
        ));
    }
}
