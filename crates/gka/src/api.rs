//! The interface every key agreement protocol implements, and the types that cross it.

use conclave_crypto::{Fingerprint, GroupKey, Meter, PublicIdentity};
use conclave_wire::gka::ProtocolId;
use conclave_wire::DecodeError;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A member's private name, unique in the system.
pub type MemberId = String;

/// Why the group's membership changed. Informational: every protocol derives what to do from the
/// member list and the transitional set, so that cascaded and combined events need no special case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MembershipEvent {
    Init,
    Join,
    Leave,
    Merge,
    Partition,
}

/// A group view as the group communication layer delivers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub group: String,
    /// Unique and increasing per group.
    pub view_id: u64,
    /// Members in the order agreed by the group communication layer (the same at every member).
    pub members: Vec<MemberId>,
    pub event: MembershipEvent,
    /// The members of this view that came with this member directly from its previous view,
    /// itself included (the EVS transitional set). Members that move together report equal sets.
    pub transitional: Vec<MemberId>,
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
    pub view_id: u64,
}

/// The outcome of a run: the key of one secure view.
#[derive(Clone, Debug)]
pub struct SecureView {
    pub group: String,
    pub view_id: u64,
    /// Equals `view_id`: a key's epoch changes exactly when the secure view changes.
    pub epoch: u64,
    pub members: Vec<MemberId>,
    pub key: GroupKey,
    /// Fingerprint of the raw agreed secret before the KDF binds it to the view. Tests use it to
    /// show that freshness does not rest on the view id alone.
    pub secret_fingerprint: Fingerprint,
}

/// The public keys of all members that may take part (the papers assume such a PKI).
#[derive(Clone, Debug, Default)]
pub struct Directory {
    keys: BTreeMap<MemberId, PublicIdentity>,
}

impl Directory {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn insert(&mut self, member: MemberId, key: PublicIdentity) {
        self.keys.insert(member, key);
    }
    pub fn get(&self, member: &str) -> Option<&PublicIdentity> {
        self.keys.get(member)
    }
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
    #[error("message of view {got} is stale (current view {current})")]
    Stale { got: u64, current: u64 },
    #[error("message of view {got} is from the future (current view {current})")]
    Future { got: u64, current: u64 },
    #[error("message epoch {got} does not match the run's epoch {expected}")]
    WrongEpoch { expected: u64, got: u64 },
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
    /// Height of the key tree of the current run (TGDH, STR), for cost reports.
    fn tree_height(&self) -> Option<usize> {
        None
    }
}
