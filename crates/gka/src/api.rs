//! The interface every key agreement protocol implements, and the types that cross it.

use conclave_crypto::{Fingerprint, GroupKey, Meter, PublicIdentity};
use conclave_wire::client::ClientEvent;
use conclave_wire::gka::ProtocolId;
use conclave_wire::DecodeError;
use std::collections::BTreeMap;
use std::sync::Arc;

// The daemons' names for a view and for why it changed: a view here is the view a client session
// delivers, so that the two layers share one vocabulary.
pub use conclave_wire::client::{GroupViewId, Reason};
pub use conclave_wire::gcs::RingId;

/// A member's private name, unique in the system.
pub type MemberId = String;

/// A group view as the group communication layer delivers it (see [`View::from_event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub group: String,
    /// The daemons' id of the view: its ring, then the group's count of views on that ring.
    /// Unique per group, and increasing at each member for as long as its client session lasts:
    /// a daemon installs only rings of a higher sequence number than the one it is in, and a
    /// group's index grows within a ring. A member that connects again (to a restarted or
    /// another daemon) may see smaller ids, and must start as a new member.
    pub view_id: GroupViewId,
    /// Members in the order agreed by the group communication layer (the same at every member).
    /// Shared, not copied: at n = 1,024 copying the names costs a member more than its share of
    /// an event's exponentiations.
    pub members: Arc<[MemberId]>,
    /// Why the view changed. Informational: every protocol derives what to do from the member
    /// list and the transitional set, so that cascaded and combined events need no special case.
    pub reason: Reason,
    /// The members of this view that came with this member directly from its previous view,
    /// itself included (the EVS transitional set). Members that move together report equal sets.
    pub transitional: Vec<MemberId>,
}

impl View {
    /// The view that a client session's [`ClientEvent::View`] announces, field for field, ready
    /// for [`KeyAgreement::handle_view`]; `None` for every other event. A secure layer feeds each
    /// view its session delivers straight through this.
    pub fn from_event(event: &ClientEvent) -> Option<View> {
        match event {
            ClientEvent::View { .. } => View::from_owned_event(event.clone()),
            _ => None,
        }
    }

    /// [`View::from_event`], taking the event's member list rather than copying it.
    pub fn from_owned_event(event: ClientEvent) -> Option<View> {
        match event {
            ClientEvent::View {
                group,
                view,
                members,
                transitional,
                reason,
            } => Some(View {
                group,
                view_id: view,
                members,
                reason,
                transitional: transitional.to_vec(),
            }),
            _ => None,
        }
    }
}

/// Where a protocol message goes. A broadcast reaches every *other* member of the view: the
/// sender has already applied its own message when it sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dest {
    Broadcast,
    Unicast(MemberId),
}

/// The delivery service a message needs from the layer below. Both must respect causality
/// (a message is never delivered before one its sender had delivered when it sent it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Fifo,
    Agreed,
}

/// A message the protocol asks the layer below to send.
#[derive(Clone, Debug)]
pub struct Transmit {
    pub dest: Dest,
    pub order: Order,
    pub payload: Vec<u8>,
    /// The view the message belongs to; the layer below drops it if that view is gone.
    pub view_id: GroupViewId,
}

/// The outcome of a run: the key of one secure view.
#[derive(Clone, Debug)]
pub struct SecureView {
    pub group: String,
    pub view_id: GroupViewId,
    /// How many keys this member has agreed in this group, this one included (1 for the first):
    /// a local count, one up with every key, that names a key more briefly than its view id. It
    /// is not agreed: members that joined at different times count the same key differently.
    pub epoch: u64,
    /// The view's members, shared with the view.
    pub members: Arc<[MemberId]>,
    pub key: GroupKey,
    /// Fingerprint of the raw agreed secret before the KDF binds it to the view. Tests use it to
    /// show that freshness does not rest on the view id alone.
    pub secret_fingerprint: Fingerprint,
}

/// The public keys of all members that may take part (the papers assume such a PKI).
#[derive(Clone, Debug, Default)]
pub struct Directory {
    keys: BTreeMap<MemberId, PublicIdentity>,
    shared_verifications: Option<VerificationMemo>,
}

/// Signatures already found good by a member holding the same directory. Only simulated members
/// in one process share a directory this way (see [`Directory::share_verifications`]).
pub type VerificationMemo = Arc<std::sync::Mutex<std::collections::HashSet<[u8; 32]>>>;

impl Directory {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn insert(&mut self, member: MemberId, key: PublicIdentity) {
        self.keys.insert(member, key);
        if let Some(memo) = &self.shared_verifications {
            memo.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// Lets the members that share this directory share their signature verifications: once
    /// one has found a signature good, the others take its word (and still count the
    /// verification as theirs). For a testbed that simulates hundreds of members in one process,
    /// where n members verifying each of O(n) broadcasts costs minutes that no real member
    /// spends; never for a real member, whose directory is its own.
    pub fn share_verifications(&mut self, on: bool) {
        self.shared_verifications = on.then(Default::default);
    }

    /// Whether `digest` signed as `sig` by `member` was found good already (when shared).
    pub(crate) fn verified_before(&self, member: &str, digest: &[u8], sig: &[u8]) -> Option<bool> {
        let memo = self.shared_verifications.as_ref()?;
        let id = verification_id(member, self.get(member)?, digest, sig);
        Some(memo.lock().unwrap_or_else(|p| p.into_inner()).contains(&id))
    }

    /// Remembers a good signature (when verifications are shared).
    pub(crate) fn remember_verified(&self, member: &str, digest: &[u8], sig: &[u8]) {
        if let Some(memo) = &self.shared_verifications {
            let Some(key) = self.get(member) else {
                return;
            };
            let id = verification_id(member, key, digest, sig);
            memo.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
        }
    }
    /// The key of `member`. A member's name as views list it is its private name qualified by
    /// its daemon (`alice#d1`); an entry under the private name alone (`alice`) serves it on every
    /// daemon, and an entry under the qualified name on that daemon only.
    pub fn get(&self, member: &str) -> Option<&PublicIdentity> {
        self.keys.get(member).or_else(|| {
            member
                .split_once('#')
                .and_then(|(private, _)| self.keys.get(private))
        })
    }

    /// The names listed, and their keys.
    pub fn iter(&self) -> impl Iterator<Item = (&MemberId, &PublicIdentity)> {
        self.keys.iter()
    }
}

/// What a good verdict covers: the signer's name and public key, the signed digest and the
/// signature, each length-prefixed.
fn verification_id(member: &str, key: &PublicIdentity, digest: &[u8], sig: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let key_bytes: Vec<u8> = match key {
        PublicIdentity::Ed25519(vk) => vk.to_bytes().to_vec(),
        PublicIdentity::Rsa(der) => der.as_ref().clone(),
    };
    let mut h = sha2::Sha256::new();
    for part in [member.as_bytes(), &key_bytes, digest, sig] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

pub type SharedDirectory = Arc<std::sync::RwLock<Directory>>;

/// Everything that can go wrong on input. An error from `handle_message` leaves the protocol's
/// state as it was; an error from `handle_view` means the view was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GkaError {
    #[error("malformed message: {0}")]
    Malformed(#[from] DecodeError),
    #[error("message is for protocol {got:?}, this group runs {expected:?}")]
    WrongProtocol {
        expected: ProtocolId,
        got: ProtocolId,
    },
    #[error("message is for group {0:?}")]
    ForeignGroup(String),
    #[error("message of view {got:?} is stale (current view {current:?})")]
    Stale {
        got: GroupViewId,
        current: GroupViewId,
    },
    #[error("message of view {got:?} is from the future (current view {current:?})")]
    Future {
        got: GroupViewId,
        current: GroupViewId,
    },
    #[error("sender {claimed:?} in the message, but it came from {actual:?}")]
    SenderMismatch { claimed: String, actual: String },
    #[error("sender {0:?} is not a member of the current view")]
    NotAMember(String),
    #[error("no public key for {0:?}")]
    UnknownMember(String),
    #[error("bad signature from {0:?}")]
    BadSignature(String),
    #[error("message already processed (replay)")]
    Replay,
    #[error("{0:?} sent more messages in this run than any protocol needs")]
    TooManyMessages(String),
    #[error("message out of place: {0}")]
    Misplaced(&'static str),
    #[error("invalid group element: {0}")]
    BadElement(#[from] conclave_crypto::GroupError),
    #[error("no view has been installed yet")]
    NoView,
    #[error("invalid view: {0}")]
    InvalidView(&'static str),
    #[error("signing failed")]
    Sign,
}

/// One member's side of a group key agreement protocol: a pure state machine.
///
/// Inputs are views and received messages; outputs are drained with `poll_transmit` and
/// `poll_key`. A member drains transmits after every input, then keys. No method does I/O, reads
/// a clock or uses a global RNG; the RNG is passed in.
pub trait KeyAgreement: Send {
    fn protocol(&self) -> ProtocolId;
    fn me(&self) -> &str;
    /// A new view: abandons any run in progress and starts the run for this view.
    fn handle_view(
        &mut self,
        rng: &mut dyn conclave_crypto::CryptoRng,
        view: View,
    ) -> Result<(), GkaError>;
    /// A protocol message `from` a member, as delivered by the layer below.
    fn handle_message(
        &mut self,
        rng: &mut dyn conclave_crypto::CryptoRng,
        from: &str,
        bytes: &[u8],
    ) -> Result<(), GkaError>;
    fn poll_transmit(&mut self) -> Option<Transmit>;
    /// The key of the current view, once the run is complete. Deriving it may cost work that
    /// does not delay anybody else, so it is done here, after the transmits are drained.
    fn poll_key(&mut self) -> Option<SecureView>;
    /// Operations counted since this member was created.
    fn meter(&self) -> Meter;
    /// True while a run has started and not yet produced its key.
    fn in_progress(&self) -> bool;
    /// A copy of this member's whole state, secrets included, to go back to: a layer above that
    /// finds a completed run was not completed by the members that came with it (its own last
    /// message never reached them) resumes from the copy it kept at the last run they all
    /// completed.
    fn clone_box(&self) -> Box<dyn KeyAgreement>;
    /// A copy in memory of its own: like [`KeyAgreement::clone_box`], but TGDH's key trees and
    /// STR's chains (their nodes, names and blinded keys) are copied rather than shared, once
    /// each however many places of the state share them, so that they lie together as in a
    /// member that holds its state alone. The rest is as `clone_box` copies it (the protocols
    /// without a tree or chain copy nothing more). The testbed's replays start from one: a
    /// simulated member's tree is spread among the allocations of every other member of the
    /// simulation, which a real member's is not.
    fn own_copy(&self) -> Box<dyn KeyAgreement> {
        self.clone_box()
    }
    /// Height of the key tree of the current run (TGDH, STR), for cost reports.
    fn tree_height(&self) -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_view_event_is_a_view_and_nothing_else_is() {
        let view_id = GroupViewId {
            ring: RingId {
                seq: 12,
                rep: 2,
                inc: 1,
            },
            index: 3,
        };
        let event = ClientEvent::View {
            group: "g".into(),
            view: view_id,
            members: vec!["a#d1".into(), "b#d2".into()].into(),
            transitional: vec!["a#d1".into()].into(),
            reason: Reason::Network,
        };
        assert_eq!(
            View::from_event(&event),
            Some(View {
                group: "g".into(),
                view_id,
                members: vec!["a#d1".into(), "b#d2".into()].into(),
                reason: Reason::Network,
                transitional: vec!["a#d1".into()],
            })
        );
        let flush = ClientEvent::FlushRequest {
            group: "g".into(),
            view: view_id,
        };
        assert_eq!(View::from_event(&flush), None);
    }
}
