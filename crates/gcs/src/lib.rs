//! The group communication core of the daemons, as pure state machines (docs/gcs.md): so far the
//! Totem ordering of one ring ([`ordering`]); membership, client groups and virtual synchrony
//! come next.

pub mod membership;
pub mod ordering;

pub use membership::{Configuration, Membership, MembershipConfig, RingEvent};
pub use ordering::{Delivered, Dest, Finished, Ordering, OrderingConfig, OrderingError, Transmit};
