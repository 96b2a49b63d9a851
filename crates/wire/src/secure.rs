//! What the secure layer puts in the payload of a group message (docs/secure.md): a key agreement
//! message, or application data sealed under the view's key.
//!
//! ```text
//! key agreement:  version u8 = 1 | tag u8 = 1 | to: u8 0 (every member) or 1 then a name
//!                 | envelope
//! data:           version u8 = 1 | tag u8 = 2 | view id (24 bytes) | counter u64 | sealed
//! resealed:       version u8 = 1 | tag u8 = 3 | view id (24 bytes) | counter u64
//!                 | daemon (name) | sealed
//! key graph:      version u8 = 1 | tag u8 = 4 | a key-graph service message
//!                 (`keyserver::ServiceMsg`: registration, rekey, view key or knock)
//! ```
//!
//! The view id of a data message names the key that sealed it (paper 002's Key_id, in the
//! clear). A resealed message is one a daemon opened because it was sealed under an older view's
//! key than the view it goes out or is delivered in, and sealed again under that view's key
//! (Optimized EVS, docs/integrated.md): its counter is that daemon's, and the daemon is named.
//!
//! A unicast of the key agreement travels to the whole group (the daemons have no private
//! groups) and names its one recipient; the others drop it unread. `sealed` is the AEAD
//! ciphertext of the application's payload with its 16-byte tag.

use crate::client::{read_view, write_view, GroupViewId};
use crate::codec::{DecodeError, Reader, Writer};
use crate::gcs::MAX_PAYLOAD_BYTES;

pub const VERSION: u8 = 1;
/// Longest member name a unicast can name (as the client protocol's names).
pub const MAX_NAME_BYTES: usize = crate::gcs::MAX_NAME_BYTES;
/// The AEAD tag's length.
pub const TAG_BYTES: usize = 16;
/// Bytes a sealed message adds to the application's payload: version, tag, view id, counter,
/// AEAD tag.
pub const DATA_OVERHEAD: usize = 2 + 24 + 8 + TAG_BYTES;
/// The largest application payload a secure group carries: the daemons' limit less the overhead.
pub const MAX_PLAINTEXT_BYTES: usize = MAX_PAYLOAD_BYTES - DATA_OVERHEAD;

const TAG_KEY_AGREEMENT: u8 = 1;
const TAG_DATA: u8 = 2;
const TAG_RESEALED: u8 = 3;
const TAG_KEY_GRAPH: u8 = 4;

fn header(tag: u8, view: &GroupViewId, counter: u64) -> Vec<u8> {
    let mut w = Writer::with_capacity(DATA_OVERHEAD);
    w.u8(VERSION);
    w.u8(tag);
    write_view(&mut w, view);
    w.u64(counter);
    w.into_vec()
}

/// A secure group's message, borrowing from the payload it was decoded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecureMessage<'a> {
    KeyAgreement {
        /// The one member a unicast is for; `None` for every member.
        to: Option<String>,
        envelope: &'a [u8],
    },
    Data {
        view: GroupViewId,
        /// The sender's count of messages sealed in this view, from 0: the AEAD nonce.
        counter: u64,
        sealed: &'a [u8],
    },
    /// Data a daemon sealed again under `view`'s key.
    Resealed {
        view: GroupViewId,
        /// The daemon's count of messages it resealed: the nonce.
        counter: u64,
        /// The daemon that resealed it (its key for the view is derived with its name).
        daemon: String,
        sealed: &'a [u8],
    },
    /// A message of a key-graph group's server or member (`keyserver::ServiceMsg`), undecoded.
    KeyGraph(&'a [u8]),
}

impl<'a> SecureMessage<'a> {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            SecureMessage::KeyAgreement { to, envelope } => {
                let mut w = Writer::with_capacity(envelope.len() + 4 + MAX_NAME_BYTES);
                w.u8(VERSION);
                w.u8(TAG_KEY_AGREEMENT);
                match to {
                    None => w.u8(0),
                    Some(name) => {
                        w.u8(1);
                        w.name(name, MAX_NAME_BYTES);
                    }
                }
                w.raw(envelope);
                w.into_vec()
            }
            SecureMessage::Data {
                view,
                counter,
                sealed,
            } => {
                let mut w = Writer::with_capacity(sealed.len() + DATA_OVERHEAD);
                w.raw(&Self::data_header(view, *counter));
                w.raw(sealed);
                w.into_vec()
            }
            SecureMessage::Resealed {
                view,
                counter,
                daemon,
                sealed,
            } => {
                let mut w = Writer::with_capacity(sealed.len() + DATA_OVERHEAD + 20);
                w.raw(&Self::resealed_header(view, *counter, daemon));
                w.raw(sealed);
                w.into_vec()
            }
            SecureMessage::KeyGraph(body) => {
                let mut w = Writer::with_capacity(body.len() + 2);
                w.u8(VERSION);
                w.u8(TAG_KEY_GRAPH);
                w.raw(body);
                w.into_vec()
            }
        }
    }

    /// The bytes before the ciphertext of a resealed message (bound into its associated data).
    pub fn resealed_header(view: &GroupViewId, counter: u64, daemon: &str) -> Vec<u8> {
        let mut h = header(TAG_RESEALED, view, counter);
        let mut w = Writer::with_capacity(daemon.len() + 2);
        w.name(daemon, MAX_NAME_BYTES);
        h.extend_from_slice(&w.into_vec());
        h
    }

    /// The bytes before the ciphertext of a data message, which its sender also binds into the
    /// AEAD's associated data.
    pub fn data_header(view: &GroupViewId, counter: u64) -> Vec<u8> {
        header(TAG_DATA, view, counter)
    }

    pub fn decode(buf: &'a [u8]) -> Result<SecureMessage<'a>, DecodeError> {
        let mut r = Reader::new(buf);
        let v = r.u8("version")?;
        if v != VERSION {
            return Err(DecodeError::BadVersion(v));
        }
        match r.u8("secure message tag")? {
            TAG_KEY_AGREEMENT => {
                let to = match r.u8("recipient flag")? {
                    0 => None,
                    1 => Some(r.name("recipient", MAX_NAME_BYTES)?),
                    tag => {
                        return Err(DecodeError::BadTag {
                            what: "recipient flag",
                            tag,
                        })
                    }
                };
                let envelope = r.take(r.remaining(), "envelope")?;
                if envelope.is_empty() {
                    return Err(DecodeError::Empty { what: "envelope" });
                }
                Ok(SecureMessage::KeyAgreement { to, envelope })
            }
            tag @ (TAG_DATA | TAG_RESEALED) => {
                let view = read_view(&mut r)?;
                let counter = r.u64("counter")?;
                let daemon = match tag {
                    TAG_RESEALED => Some(r.name("resealing daemon", MAX_NAME_BYTES)?),
                    _ => None,
                };
                let sealed = r.take(r.remaining(), "sealed payload")?;
                if sealed.len() < TAG_BYTES {
                    return Err(DecodeError::Truncated {
                        what: "sealed payload",
                        need: TAG_BYTES - sealed.len(),
                    });
                }
                Ok(match daemon {
                    None => SecureMessage::Data {
                        view,
                        counter,
                        sealed,
                    },
                    Some(daemon) => SecureMessage::Resealed {
                        view,
                        counter,
                        daemon,
                        sealed,
                    },
                })
            }
            TAG_KEY_GRAPH => {
                let body = r.take(r.remaining(), "key graph message")?;
                if body.is_empty() {
                    return Err(DecodeError::Empty {
                        what: "key graph message",
                    });
                }
                Ok(SecureMessage::KeyGraph(body))
            }
            tag => Err(DecodeError::BadTag {
                what: "secure message",
                tag,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcs::RingId;
    use proptest::prelude::*;

    fn view(seq: u64, rep: u32, inc: u32, index: u64) -> GroupViewId {
        GroupViewId {
            ring: RingId { seq, rep, inc },
            index,
        }
    }

    proptest! {
        #[test]
        fn data_round_trips(seq: u64, rep: u32, inc: u32, index: u64, counter: u64,
                            sealed in proptest::collection::vec(any::<u8>(), TAG_BYTES..200)) {
            let m = SecureMessage::Data { view: view(seq, rep, inc, index), counter, sealed: &sealed };
            let bytes = m.encode();
            prop_assert_eq!(bytes.len(), sealed.len() + DATA_OVERHEAD - TAG_BYTES);
            prop_assert_eq!(SecureMessage::decode(&bytes).unwrap(), m);
            let daemon = format!("d{}", rep % 100);
            let m = SecureMessage::Resealed { view: view(seq, rep, inc, index), counter, daemon: daemon.clone(), sealed: &sealed };
            let bytes = m.encode();
            prop_assert_eq!(bytes.len(), sealed.len() + DATA_OVERHEAD - TAG_BYTES + 1 + daemon.len());
            prop_assert_eq!(SecureMessage::decode(&bytes).unwrap(), m);
        }

        #[test]
        fn key_agreement_round_trips(to in proptest::option::of("[a-z#0-9]{1,64}"),
                                     envelope in proptest::collection::vec(any::<u8>(), 1..200)) {
            let m = SecureMessage::KeyAgreement { to, envelope: &envelope };
            let bytes = m.encode();
            prop_assert_eq!(SecureMessage::decode(&bytes).unwrap(), m);
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = SecureMessage::decode(&bytes);
        }
    }

    #[test]
    fn malformed_messages_are_typed_errors() {
        assert_eq!(
            SecureMessage::decode(&[]),
            Err(DecodeError::Truncated {
                what: "version",
                need: 1
            })
        );
        assert_eq!(
            SecureMessage::decode(&[9, 1]),
            Err(DecodeError::BadVersion(9))
        );
        assert!(matches!(
            SecureMessage::decode(&[VERSION, 7]),
            Err(DecodeError::BadTag { tag: 7, .. })
        ));
        // A key agreement message with no envelope.
        assert!(matches!(
            SecureMessage::decode(&[VERSION, TAG_KEY_AGREEMENT, 0]),
            Err(DecodeError::Empty { .. })
        ));
        // Data too short to hold its tag.
        let mut short = SecureMessage::data_header(&view(1, 1, 0, 1), 0);
        short.extend([0; TAG_BYTES - 1]);
        assert!(matches!(
            SecureMessage::decode(&short),
            Err(DecodeError::Truncated { .. })
        ));
    }
}
