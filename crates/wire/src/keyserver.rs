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
}
