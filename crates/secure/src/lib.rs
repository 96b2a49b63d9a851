//! The secure layer of the layered architecture (paper 002 §V-A, docs/secure.md): for each group
//! a client joins securely, a key agreed by the group's members for every view the daemons
//! deliver, and the application's data sealed under it. A pure state machine like the protocols
//! under it: it takes the client session's events and the application's sends, and gives
//! commands for the session and events for the application; randomness is passed in. A group may
//! instead take its keys from the daemons (the integrated architecture, docs/integrated.md).

pub mod files;
mod group;
mod keygraph_member;
pub mod keyserver;
mod seal;

pub use seal::{reseal, sealed_view, ResealError, Resealing};

pub use keyserver::{KeyServerConfig, KeyServerEvent, KeyServerNode, KeyServerOutput};

pub use group::{
    Consumed, KeySource, SecureConfig, SecureEvent, SecureGroup, SecureViewInfo, ViewKey,
    MAX_CONSUMED,
};

use conclave_gka::{GkaError, ProtocolId};
use conclave_keygraph::{MemberError, RegisterError, ServerError, StateError};
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
    #[error("key graph: {0}")]
    KeyGraph(KeyGraphError),
}

/// Why a key-graph group's member or server refused a message of the service.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyGraphError {
    #[error("malformed service message: {0}")]
    Malformed(DecodeError),
    #[error("registration: {0}")]
    Register(RegisterError),
    #[error("rekey message: {0}")]
    Rekey(MemberError),
    /// A message only the group's key server sends, from someone else.
    #[error("{0} is not the group's key server")]
    NotServer(String),
    #[error("the key server {0} is not in the directory")]
    UnknownServer(String),
    #[error("view key: {0}")]
    ViewKey(&'static str),
    #[error("key server: {0}")]
    Server(ServerError),
    #[error("saved state: {0}")]
    State(StateError),
}

impl KeyGraphError {
    /// A short name of the kind of error, for records and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            KeyGraphError::Malformed(_) => "malformed",
            KeyGraphError::Register(RegisterError::UnknownIdentity(_)) => "unknown_identity",
            KeyGraphError::Register(RegisterError::NotInvited) => "not_invited",
            KeyGraphError::Register(RegisterError::BadSignature(_)) => "bad_signature",
            KeyGraphError::Register(_) => "registration",
            KeyGraphError::Rekey(MemberError::Stale { .. }) => "stale_rekey",
            KeyGraphError::Rekey(MemberError::BadSignature | MemberError::BadAuthPath) => {
                "forged_rekey"
            }
            KeyGraphError::Rekey(_) => "rekey",
            KeyGraphError::NotServer(_) => "not_server",
            KeyGraphError::UnknownServer(_) => "unknown_server",
            KeyGraphError::ViewKey(_) => "view_key",
            KeyGraphError::Server(_) => "server",
            KeyGraphError::State(_) => "state",
        }
    }
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
            SecureError::KeyGraph(e) => e.kind(),
        }
    }
}
