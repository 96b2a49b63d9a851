//! Encrypting new keys under keys the recipients hold.
//!
//! Paper 001 used DES-CBC; an item here is one AEAD ciphertext (AES-256-GCM by default) whose
//! associated data binds the group, the epoch, the item's number and every key reference it
//! carries, so an item cannot be replayed into another epoch or relabelled. The nonce is the epoch
//! and the item's number: each key belongs to one group, and one group's server never numbers two
//! encryptions of one epoch alike. So a key must never serve two servers, nor one server started
//! twice: the server's own keys are fresh random values, and the individual keys it is given must
//! be fresh as well (the paper's are the session keys of the admission exchange).

use conclave_crypto::aead::{Aead, AeadAlg, AeadError, NONCE_BYTES};
use conclave_wire::lkh::{Item, KeyRef, KEY_BYTES};
use zeroize::Zeroizing;

fn nonce(epoch: u64, seq: u32) -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    n[..8].copy_from_slice(&epoch.to_be_bytes());
    n[8..].copy_from_slice(&seq.to_be_bytes());
    n
}

fn aad(group: &str, epoch: u64, seq: u32, under: &KeyRef, keys: &[KeyRef]) -> Vec<u8> {
    let mut a = Vec::with_capacity(48 + group.len() + 16 * keys.len());
    write_aad(&mut a, group, epoch, seq, under, keys);
    a
}

fn write_aad(a: &mut Vec<u8>, group: &str, epoch: u64, seq: u32, under: &KeyRef, keys: &[KeyRef]) {
    a.extend_from_slice(b"conclave lkh item v1");
    a.push(group.len() as u8);
    a.extend_from_slice(group.as_bytes());
    a.extend_from_slice(&epoch.to_be_bytes());
    a.extend_from_slice(&seq.to_be_bytes());
    for k in core::iter::once(under).chain(keys) {
        a.extend_from_slice(&k.id.to_be_bytes());
        a.extend_from_slice(&k.version.to_be_bytes());
    }
}

/// An item of the epoch being built, by its place in [`Sealer::items`].
pub(crate) type ItemId = u32;

/// Numbers the encryptions of one epoch, counts them, and keeps them: a message lists items by
/// id, so an item shared by several messages is encrypted and encoded once.
pub(crate) struct Sealer<'a> {
    pub alg: AeadAlg,
    pub group: &'a str,
    pub epoch: u64,
    pub next_seq: u32,
    /// Keys encrypted (what paper 001 Table 2 counts).
    pub keys_encrypted: u64,
    pub items: Vec<Item>,
    aad: Vec<u8>,
}

impl<'a> Sealer<'a> {
    pub fn new(alg: AeadAlg, group: &'a str, epoch: u64) -> Sealer<'a> {
        Sealer {
            alg,
            group,
            epoch,
            next_seq: 0,
            keys_encrypted: 0,
            items: Vec::new(),
            aad: Vec::with_capacity(128),
        }
    }
}

impl Sealer<'_> {
    pub fn seal(
        &mut self,
        under: KeyRef,
        under_key: &[u8; 32],
        keys: &[(KeyRef, &[u8; 32])],
    ) -> ItemId {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.keys_encrypted += keys.len() as u64;
        let refs: Vec<KeyRef> = keys.iter().map(|(r, _)| *r).collect();
        // The plaintext goes straight into the ciphertext's buffer and is encrypted in place.
        let mut ciphertext = Vec::with_capacity(Item::ciphertext_len(keys.len()));
        for (_, k) in keys {
            ciphertext.extend_from_slice(&k[..]);
        }
        self.aad.clear();
        write_aad(&mut self.aad, self.group, self.epoch, seq, &under, &refs);
        Aead::new(self.alg, under_key).seal_in_place(
            nonce(self.epoch, seq),
            &self.aad,
            &mut ciphertext,
        );
        self.items.push(Item {
            seq,
            under,
            keys: refs,
            ciphertext,
        });
        seq
    }
}

/// Decrypts an item of a message of `group` and `epoch` with `under_key`; the new keys come back in
/// the item's order. Members use it; so can an auditor checking who could read what.
pub fn open(
    alg: AeadAlg,
    group: &str,
    epoch: u64,
    item: &Item,
    under_key: &[u8; 32],
) -> Result<Vec<Zeroizing<[u8; 32]>>, AeadError> {
    let plain = Zeroizing::new(Aead::new(alg, under_key).open(
        nonce(epoch, item.seq),
        &aad(group, epoch, item.seq, &item.under, &item.keys),
        &item.ciphertext,
    )?);
    Ok(plain
        .chunks_exact(KEY_BYTES)
        .map(|c| {
            let mut k = Zeroizing::new([0u8; 32]);
            k.copy_from_slice(c);
            k
        })
        .collect())
}
