//! The group communication core of the daemons, as pure state machines (docs/gcs.md): the Totem
//! ordering of one ring ([`ordering`]), daemon membership with recovery and extended virtual
//! synchrony ([`membership`]), and client groups with views, flushes and the service types on
//! top ([`groups`], whose [`Daemon`] is what a daemon process runs).

pub mod groups;
pub mod id_map;
pub mod membership;
pub mod ordering;
mod seq_buffer;
pub mod testnet;
pub mod time;

pub use groups::{
    ClientCommand, ClientEvent, ClientId, Daemon, DaemonConfig, DaemonError, Delivery, GroupViewId,
    LocalEvent, Reason, OPEN_VIEW,
};
pub use id_map::{IdHasher, IdMap};
pub use membership::{Configuration, Membership, MembershipConfig, Phase, RingEvent};
pub use ordering::{
    Delivered, Dest, Finished, Ordering, OrderingConfig, OrderingError, PeerRefusal, Transmit,
};
pub use time::Time;
