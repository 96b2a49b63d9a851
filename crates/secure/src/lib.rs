//! The secure layer of the layered architecture (paper 002 §V-A, docs/secure.md): for each group
//! a client joins securely, a key agreed by the group's members for every view the daemons
//! deliver, and the application's data sealed under it. A pure state machine like the protocols
//! under it: it takes the client session's events and the application's sends, and gives
//! commands for the session and events for the application; randomness is passed in. A group may
//! instead take its keys from the daemons (the integrated architecture, docs/integrated.md).

pub mod files;
mod group;
mod seal;

pub use seal::{reseal, sealed_view, ResealError, Resealing};

pub use group::{
    Consumed, KeySource, SecureConfig, SecureEvent, SecureGroup, SecureViewInfo, ViewKey,
    MAX_CONSUMED,
};

use conclave_gka::{GkaError, ProtocolId};
use conclave_wire::client::GroupViewId;
use conclave_wire::DecodeError;

/// Why the secure layer refused an application's send, or input from a member.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecureError {
    #[error("a payload of {len} bytes is over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("{max} messages already wait for the group's key")]
    QueueFull { max: usize },
    #[error("not in the group")]
    NotJoined,
    #[error("malformed message: {0}")]
    Malformed(DecodeError),
    #[error("message of view {got:?}, the current view is {current:?}")]
    OtherView {
        got: GroupViewId,
        current: Option<GroupViewId>,
    },
    #[error("the sender is not a member of the secure view")]
    NotAMember,
    #[error("message does not open under the view's key")]
    OpenFailed,
    #[error("message number {counter} was opened before, or is too old to tell")]
    Replay { counter: u64 },
    #[error("{max} messages already wait for this member's key")]
    EarlyFull { max: usize },
    #[error("key agreement: {0}")]
    KeyAgreement(GkaError),
    #[error("the group runs {group_uses:?}; this member asked for {asked:?}")]
    ProtocolMismatch {
        group_uses: ProtocolId,
        asked: ProtocolId,
    },
    /// A member runs a key agreement while this one takes the group's keys from the daemons,
    /// or the other way round.
    #[error("the group's members take their keys from different places (this member: {mine})")]
    KeySourceMismatch { mine: KeySource },
}

impl SecureError {
    /// A short name of the kind of error, for records and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            SecureError::TooLarge { .. } => "too_large",
            SecureError::QueueFull { .. } => "queue_full",
            SecureError::NotJoined => "not_joined",
            SecureError::Malformed(_) => "malformed",
            SecureError::OtherView { .. } => "other_view",
            SecureError::NotAMember => "not_a_member",
            SecureError::OpenFailed => "open_failed",
            SecureError::Replay { .. } => "replay",
            SecureError::EarlyFull { .. } => "early_full",
            SecureError::KeyAgreement(_) => "key_agreement",
            SecureError::ProtocolMismatch { .. } => "protocol_mismatch",
            SecureError::KeySourceMismatch { .. } => "key_source_mismatch",
        }
    }
}
