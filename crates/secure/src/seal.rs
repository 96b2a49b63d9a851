//! Sealing application data under a view's group key.
//!
//! Each sender of a view gets its own key, HKDF of the group key with labels naming the group,
//! the view and the sender, so that members never share a (key, nonce) pair; the nonce is the
//! sender's count of messages in the view, which it never reuses (a fresh view is a fresh key,
//! and the count starts again). The associated data binds the group, the view, the sender, the
//! service type and the counter, so that a message cannot be moved to another group, view,
//! sender or service, or replayed under another number.
//!
//! A daemon that sends or delivers a message of an EVS group keyed by the daemons in a later view
//! than the one whose key sealed it (Optimized EVS, paper 002 §V-B3) opens it and seals it again
//! ([`reseal`]) under a key of its own for that view: HKDF of the view's group key with a label
//! naming the group, the view and the daemon, which the resealed message names. The nonce is the
//! daemon's count of messages it resealed (never reused in its run); the associated data still
//! binds the original sender and service, so the members open it as the sender's message.

use conclave_crypto::aead::{Aead, AeadAlg, AeadError, NONCE_BYTES, TAG_BYTES};
use conclave_crypto::{kdf, GroupKey};
use conclave_wire::client::GroupViewId;
use conclave_wire::gcs::ServiceType;
use conclave_wire::gcs::MAX_PAYLOAD_BYTES;
use conclave_wire::secure::{SecureMessage, DATA_OVERHEAD};

/// A sender's key for one view (or a daemon's, for what it reseals in the view).
pub(crate) struct SenderKey {
    aead: Aead,
    /// A daemon's key for resealing, with the daemon's name: its messages carry the resealed
    /// header.
    resealer: Option<String>,
}

impl SenderKey {
    /// The key daemon `daemon` reseals messages of `view` of `group` under.
    pub fn derive_resealer(
        alg: AeadAlg,
        group_key: &GroupKey,
        group: &str,
        view: &GroupViewId,
        daemon: &str,
    ) -> SenderKey {
        let info = kdf::info(&[
            b"conclave resealed key v1",
            group.as_bytes(),
            &view.to_bytes(),
            daemon.as_bytes(),
        ]);
        let key = kdf::derive::<32>(b"conclave", group_key.expose(), &info);
        SenderKey {
            aead: Aead::new(alg, &key),
            resealer: Some(daemon.to_owned()),
        }
    }

    fn header(&self, view: &GroupViewId, counter: u64) -> Vec<u8> {
        match &self.resealer {
            None => SecureMessage::data_header(view, counter),
            Some(daemon) => SecureMessage::resealed_header(view, counter, daemon),
        }
    }

    pub fn derive(
        alg: AeadAlg,
        group_key: &GroupKey,
        group: &str,
        view: &GroupViewId,
        sender: &str,
    ) -> SenderKey {
        // The view id as data messages carry it (after their version and tag bytes).
        let header = SecureMessage::data_header(view, 0);
        let info = kdf::info(&[
            b"conclave data key v1",
            group.as_bytes(),
            &header[2..2 + 24],
            sender.as_bytes(),
        ]);
        let key = kdf::derive::<32>(b"conclave", group_key.expose(), &info);
        SenderKey {
            aead: Aead::new(alg, &key),
            resealer: None,
        }
    }

    /// The payload of a group message carrying `plaintext`.
    pub fn seal(
        &self,
        group: &str,
        view: &GroupViewId,
        sender: &str,
        service: ServiceType,
        counter: u64,
        plaintext: &[u8],
    ) -> Vec<u8> {
        let header = self.header(view, counter);
        let at = header.len();
        let mut out = Vec::with_capacity(at + plaintext.len() + TAG_BYTES);
        out.extend_from_slice(&header);
        out.extend_from_slice(plaintext);
        with_aad(&header, group, sender, service, |aad| {
            self.aead.seal_tail(nonce(counter), aad, &mut out, at)
        });
        out
    }

    /// [`SenderKey::open`] of `buf`, in place: the plaintext is `buf[..len]`.
    #[allow(clippy::too_many_arguments)]
    pub fn open_in_place(
        &self,
        group: &str,
        view: &GroupViewId,
        sender: &str,
        service: ServiceType,
        counter: u64,
        buf: &mut [u8],
    ) -> Result<usize, AeadError> {
        let header = self.header(view, counter);
        with_aad(&header, group, sender, service, |aad| {
            self.aead.open_in_place(nonce(counter), aad, buf)
        })
    }

    pub fn open(
        &self,
        group: &str,
        view: &GroupViewId,
        sender: &str,
        service: ServiceType,
        counter: u64,
        sealed: &[u8],
    ) -> Result<Vec<u8>, AeadError> {
        let header = self.header(view, counter);
        with_aad(&header, group, sender, service, |aad| {
            self.aead.open(nonce(counter), aad, sealed)
        })
    }
}

/// What a daemon needs to reseal a message of one view of a group for its clients.
pub struct Resealing<'a> {
    pub alg: AeadAlg,
    pub group: &'a str,
    pub sender: &'a str,
    pub service: ServiceType,
    /// The resealing daemon's name.
    pub daemon: &'a str,
    /// The view the message is delivered in, and its key.
    pub view: GroupViewId,
    pub key: &'a GroupKey,
    /// The daemon's count of messages it resealed in `view` of the group (never reused).
    pub counter: u64,
}

/// Why a message could not be resealed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResealError {
    /// Not data sealed under another view's key: nothing to do.
    NotStale,
    /// The key of the view it was sealed under is not known.
    NoKey(GroupViewId),
    /// It does not open under that key: forged or altered.
    Forged,
    /// Resealed it would be longer than a message may be (it names its daemon).
    TooLarge,
}

/// The view whose key sealed `payload`, if it is data (or resealed data) of a secure group.
pub fn sealed_view(payload: &[u8]) -> Option<GroupViewId> {
    match SecureMessage::decode(payload) {
        Ok(SecureMessage::Data { view, .. } | SecureMessage::Resealed { view, .. }) => Some(view),
        _ => None,
    }
}

/// Reseals `payload`, data (or resealed data) sealed under another view's key
/// (`old_key(view)`), for `r.view` (see the module doc).
pub fn reseal(
    r: &Resealing<'_>,
    payload: &[u8],
    old_key: impl FnOnce(GroupViewId) -> Option<GroupKey>,
) -> Result<Vec<u8>, ResealError> {
    let (view, counter, by, sealed) = match SecureMessage::decode(payload) {
        Ok(SecureMessage::Data {
            view,
            counter,
            sealed,
        }) => (view, counter, None, sealed),
        Ok(SecureMessage::Resealed {
            view,
            counter,
            daemon,
            sealed,
        }) => (view, counter, Some(daemon), sealed),
        _ => return Err(ResealError::NotStale),
    };
    if view == r.view {
        return Err(ResealError::NotStale);
    }
    let old = old_key(view).ok_or(ResealError::NoKey(view))?;
    let key = match &by {
        None => SenderKey::derive(r.alg, &old, r.group, &view, r.sender),
        Some(daemon) => SenderKey::derive_resealer(r.alg, &old, r.group, &view, daemon),
    };
    let opened = key
        .open(r.group, &view, r.sender, r.service, counter, sealed)
        .map_err(|_| ResealError::Forged)?;
    let plain = zeroize::Zeroizing::new(opened);
    if plain.len() + DATA_OVERHEAD + 1 + r.daemon.len() > MAX_PAYLOAD_BYTES {
        return Err(ResealError::TooLarge);
    }
    let mine = SenderKey::derive_resealer(r.alg, r.key, r.group, &r.view, r.daemon);
    Ok(mine.seal(r.group, &r.view, r.sender, r.service, r.counter, &plain))
}

fn nonce(counter: u64) -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    n[NONCE_BYTES - 8..].copy_from_slice(&counter.to_be_bytes());
    n
}

/// Associated data that fits here is built on the stack (every message has some): the label,
/// the header, two names of at most 64 bytes and the service, each with its length.
const AAD_STACK_BYTES: usize = 256;

/// `f` of the associated data: `kdf::info` of the label, the header, the group, the sender and
/// the service.
fn with_aad<R>(
    header: &[u8],
    group: &str,
    sender: &str,
    service: ServiceType,
    f: impl FnOnce(&[u8]) -> R,
) -> R {
    let parts: [&[u8]; 5] = [
        b"conclave data v1",
        header,
        group.as_bytes(),
        sender.as_bytes(),
        &[service as u8],
    ];
    let len: usize = parts.iter().map(|p| 4 + p.len()).sum();
    if len > AAD_STACK_BYTES {
        return f(&kdf::info(&parts));
    }
    let mut buf = [0u8; AAD_STACK_BYTES];
    let mut at = 0;
    for p in parts {
        buf[at..at + 4].copy_from_slice(&(p.len() as u32).to_be_bytes());
        buf[at + 4..at + 4 + p.len()].copy_from_slice(p);
        at += 4 + p.len();
    }
    f(&buf[..at])
}

/// Which counters of one sender were opened in a view: the highest, and a window of the
/// [`WINDOW`] below it. A counter seen before, or further below the highest than the window, is
/// refused. The daemons deliver one sender's messages of a view almost in order (reordering is
/// bounded by the ring's window, a few thousand messages at most), so the window refuses nothing
/// that a correct run delivers.
#[derive(Debug)]
pub(crate) struct ReplayWindow {
    /// One more than the highest counter accepted (0: none yet).
    top: u64,
    bits: Box<[u64; WINDOW as usize / 64]>,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            top: 0,
            bits: Box::new([0; WINDOW as usize / 64]),
        }
    }
}

/// Counters kept below the highest one accepted.
pub(crate) const WINDOW: u64 = 4096;

impl ReplayWindow {
    /// Whether `counter` may be accepted (not seen, not too old); does not record it.
    pub fn fresh(&self, counter: u64) -> bool {
        // No sender gets there, and `accept` could not count past it.
        if counter == u64::MAX {
            return false;
        }
        if counter >= self.top {
            return true;
        }
        let behind = self.top - 1 - counter;
        behind < WINDOW && !self.bit(counter)
    }

    /// Records `counter` (after [`ReplayWindow::fresh`] said yes and the message opened).
    pub fn accept(&mut self, counter: u64) {
        if counter >= self.top {
            let shift = counter + 1 - self.top;
            if shift >= WINDOW {
                self.bits.fill(0);
            } else {
                for c in self.top..=counter {
                    self.clear(c);
                }
            }
            self.top = counter + 1;
        }
        let (w, b) = slot(counter);
        self.bits[w] |= 1 << b;
    }

    fn bit(&self, counter: u64) -> bool {
        let (w, b) = slot(counter);
        self.bits[w] & (1 << b) != 0
    }

    fn clear(&mut self, counter: u64) {
        let (w, b) = slot(counter);
        self.bits[w] &= !(1 << b);
    }
}

fn slot(counter: u64) -> (usize, u32) {
    let i = counter % WINDOW;
    ((i / 64) as usize, (i % 64) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_wire::gcs::RingId;

    fn view(index: u64) -> GroupViewId {
        GroupViewId {
            ring: RingId {
                seq: 4,
                rep: 1,
                inc: 0,
            },
            index,
        }
    }

    #[test]
    fn a_sealed_message_opens_only_as_it_was_sealed() {
        let gk = GroupKey::from_bytes([7; 32]);
        let alg = AeadAlg::Aes256Gcm;
        let k = SenderKey::derive(alg, &gk, "g", &view(1), "a#d1");
        let bytes = k.seal("g", &view(1), "a#d1", ServiceType::Agreed, 3, b"hello");
        let SecureMessage::Data {
            view: v,
            counter,
            sealed,
        } = SecureMessage::decode(&bytes).unwrap()
        else {
            panic!("data");
        };
        assert_eq!((v, counter), (view(1), 3));
        let open = |k: &SenderKey, g, v, s, svc, c| k.open(g, &v, s, svc, c, sealed);
        assert_eq!(
            open(&k, "g", view(1), "a#d1", ServiceType::Agreed, 3).unwrap(),
            b"hello"
        );
        for r in [
            open(&k, "h", view(1), "a#d1", ServiceType::Agreed, 3),
            open(&k, "g", view(2), "a#d1", ServiceType::Agreed, 3),
            open(&k, "g", view(1), "b#d1", ServiceType::Agreed, 3),
            open(&k, "g", view(1), "a#d1", ServiceType::Safe, 3),
            open(&k, "g", view(1), "a#d1", ServiceType::Agreed, 4),
        ] {
            assert_eq!(r, Err(AeadError::Auth));
        }
        // Another sender's key, another view's key, another group key: nothing opens.
        for other in [
            SenderKey::derive(alg, &gk, "g", &view(1), "b#d1"),
            SenderKey::derive(alg, &gk, "g", &view(2), "a#d1"),
            SenderKey::derive(alg, &GroupKey::from_bytes([8; 32]), "g", &view(1), "a#d1"),
        ] {
            assert_eq!(
                open(&other, "g", view(1), "a#d1", ServiceType::Agreed, 3),
                Err(AeadError::Auth)
            );
        }
        // Nothing of the plaintext is in the message.
        assert!(!bytes.windows(5).any(|w| w == b"hello"));
    }

    #[test]
    fn the_associated_data_is_the_same_on_the_stack_and_off_it() {
        let header = SecureMessage::data_header(&view(1), 9);
        let long = "x".repeat(300);
        for (group, sender) in [("g", "a#d1"), ("g", long.as_str())] {
            let got = with_aad(&header, group, sender, ServiceType::Fifo, |a| a.to_vec());
            let want = kdf::info(&[
                b"conclave data v1",
                &header,
                group.as_bytes(),
                sender.as_bytes(),
                &[ServiceType::Fifo as u8],
            ]);
            assert_eq!(got, want);
        }
    }

    #[test]
    fn the_window_refuses_repeats_and_the_too_old() {
        let mut w = ReplayWindow::default();
        for c in [0, 1, 5, 3] {
            assert!(w.fresh(c));
            w.accept(c);
        }
        for c in [0, 1, 3, 5] {
            assert!(!w.fresh(c), "{c}");
        }
        assert!(w.fresh(2) && w.fresh(4) && w.fresh(6));
        w.accept(5 + WINDOW);
        assert!(!w.fresh(2), "fell out of the window");
        assert!(w.fresh(6 + 1), "inside the window and never seen");
        assert!(!w.fresh(5 + WINDOW));
        w.accept(u64::MAX - 1);
        assert!(!w.fresh(u64::MAX - 1));
        assert!(w.fresh(u64::MAX - 2));
        assert!(!w.fresh(u64::MAX), "the last number is never taken");
    }
}
