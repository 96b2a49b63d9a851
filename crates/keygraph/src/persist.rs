//! The key server's state at rest (docs/keygraph.md, "State at rest"): everything a restarted
//! server needs to go on where it stopped (configuration, epoch, members' slots, every key of the
//! graph with its version, queued requests, and the rekey messages and relocations not yet known
//! to be sent), sealed under a key only the server's identity can derive.
//!
//! The key: the identity signs a fixed, domain-separated message naming the group and a fresh
//! random salt (both schemes sign deterministically, and nothing else ever signs that message);
//! HKDF turns the signature into a 256-bit key. A fresh salt per save makes every save's key new,
//! so the AEAD nonce can be zero.
//!
//! Why the messages not yet sent are kept: rekey items are encrypted under keys the members hold,
//! with the epoch and the item's number as the nonce. A server that sent epoch `e + 1` and then
//! restarted from a state saved at epoch `e` would encrypt different keys under the same keys and
//! nonces: the caller saves after each rekey, before sending, and a restarted server sends what
//! the state holds again (members refuse what they already have as stale).

use crate::server::{Server, ServerError};
use conclave_crypto::aead::{Aead, AeadAlg};
use conclave_crypto::{CryptoRng, Identity};
use conclave_wire::{Reader, Writer};
use zeroize::Zeroizing;

const MAGIC: &[u8; 8] = b"CKSSTATE";
/// Version 2 added the annex: what the caller keeps beside the server (a service's names of its
/// members), sealed with it.
const VERSION: u8 = 2;
const SALT_BYTES: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("not a saved key server state")]
    NotState,
    #[error("saved state version {0} is not supported")]
    Version(u8),
    #[error("saved state is for group {0:?}")]
    OtherGroup(String),
    #[error("the state does not open with this identity (another server's, or altered)")]
    Open,
    #[error("saved state is damaged: {0}")]
    Damaged(&'static str),
    #[error("persistence needs a server identity")]
    NoIdentity,
    #[error("signing failed")]
    Sign,
    #[error(transparent)]
    Server(#[from] ServerError),
}

/// The key that seals `group`'s state with this salt.
fn state_key(
    identity: &Identity,
    group: &str,
    salt: &[u8],
) -> Result<Zeroizing<[u8; 32]>, StateError> {
    let mut msg = b"conclave keyserver state key v1".to_vec();
    msg.push(group.len() as u8);
    msg.extend_from_slice(group.as_bytes());
    msg.extend_from_slice(salt);
    let sig = Zeroizing::new(identity.sign(&msg).map_err(|_| StateError::Sign)?);
    Ok(conclave_crypto::kdf::derive::<32>(
        b"conclave keyserver state",
        &sig,
        &conclave_crypto::kdf::info(&[b"state key", group.as_bytes()]),
    ))
}

fn header(group: &str, salt: &[u8]) -> Vec<u8> {
    let mut w = Writer::new();
    w.raw(MAGIC);
    w.u8(VERSION);
    w.name(group, conclave_wire::lkh::MAX_GROUP_NAME_BYTES);
    w.raw(salt);
    w.into_vec()
}

impl Server {
    /// The server's whole state, sealed: what [`Server::restore`] takes back. Save after every
    /// rekey and before sending its messages (see the module doc).
    pub fn save(&self, rng: &mut dyn CryptoRng) -> Result<Vec<u8>, StateError> {
        self.save_with(rng, &[])
    }

    /// As [`Server::save`], with `annex`, the caller's own bytes, sealed beside the server's
    /// state: [`Server::restore_with`] gives them back.
    pub fn save_with(&self, rng: &mut dyn CryptoRng, annex: &[u8]) -> Result<Vec<u8>, StateError> {
        let identity = self.identity().ok_or(StateError::NoIdentity)?;
        let mut salt = [0u8; SALT_BYTES];
        rng.fill_bytes(&mut salt);
        let group = &self.config().group;
        let mut out = header(group, &salt);
        // Sized up front so that growing the buffer leaves no copies of keys behind.
        let mut w = Writer::with_capacity(4 + self.state_size_hint() + annex.len());
        w.u32(0);
        self.write_state(&mut w);
        let mut plain = w.into_vec();
        let len = (plain.len() - 4) as u32;
        plain[..4].copy_from_slice(&len.to_be_bytes());
        plain.extend_from_slice(annex);
        let plain = Zeroizing::new(plain);
        let key = state_key(identity, group, &salt)?;
        let aead = Aead::new(AeadAlg::ChaCha20Poly1305, &key);
        let sealed = aead.seal(
            [0; conclave_crypto::aead::NONCE_BYTES],
            &out,
            plain.as_slice(),
        );
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// A server from its saved state, with the identity that saved it. `group`, if given, must
    /// be the state's group.
    pub fn restore(
        bytes: &[u8],
        identity: Identity,
        group: Option<&str>,
    ) -> Result<Server, StateError> {
        Server::restore_with(bytes, identity, group).map(|(s, _)| s)
    }

    /// As [`Server::restore`], with the annex the state was saved with.
    pub fn restore_with(
        bytes: &[u8],
        identity: Identity,
        group: Option<&str>,
    ) -> Result<(Server, Zeroizing<Vec<u8>>), StateError> {
        let mut r = Reader::new(bytes);
        if r.take(MAGIC.len(), "magic").ok() != Some(&MAGIC[..]) {
            return Err(StateError::NotState);
        }
        let v = r.u8("version").map_err(|_| StateError::NotState)?;
        if v != VERSION {
            return Err(StateError::Version(v));
        }
        let saved_group = r
            .name("group", conclave_wire::lkh::MAX_GROUP_NAME_BYTES)
            .map_err(|_| StateError::NotState)?;
        if group.is_some_and(|g| g != saved_group) {
            return Err(StateError::OtherGroup(saved_group));
        }
        let salt = r
            .take(SALT_BYTES, "salt")
            .map_err(|_| StateError::NotState)?;
        let head = bytes.len() - r.remaining();
        let key = state_key(&identity, &saved_group, salt)?;
        let aead = Aead::new(AeadAlg::ChaCha20Poly1305, &key);
        let plain = Zeroizing::new(
            aead.open(
                [0; conclave_crypto::aead::NONCE_BYTES],
                &bytes[..head],
                &bytes[head..],
            )
            .map_err(|_| StateError::Open)?,
        );
        let mut inner = Reader::new(&plain);
        let len = inner
            .u32("state length")
            .map_err(|_| StateError::Damaged("truncated"))? as usize;
        let state = inner
            .take(len, "state")
            .map_err(|_| StateError::Damaged("truncated"))?;
        let server = Server::read_state(state, identity)?;
        if server.config().group != saved_group {
            return Err(StateError::Damaged("group differs from the header's"));
        }
        let annex = Zeroizing::new(plain[4 + len..].to_vec());
        Ok((server, annex))
    }
}

impl Server {
    /// The state decoder without the sealing, for the fuzzer: the sealed state is authenticated,
    /// but its decoder must hold against anything.
    #[cfg(fuzzing)]
    pub fn restore_unsealed(bytes: &[u8], identity: Identity) -> Result<Server, StateError> {
        Server::read_state(bytes, identity)
    }
    /// What [`Server::restore_unsealed`] takes.
    #[cfg(fuzzing)]
    pub fn save_unsealed(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.write_state(&mut w);
        w.into_vec()
    }
}
