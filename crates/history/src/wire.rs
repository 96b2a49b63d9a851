//! A client's events, as a daemon reports them (`conclave_wire::client::ClientEvent`), turned
//! into history events. The simulator and the daemons' recorder both use it; they differ only in
//! how they name messages, views and payloads, which they pass in.

use crate::{Event, Service, ViewId};
use conclave_wire::client::{ClientEvent, GroupViewId};
use conclave_wire::gcs::ServiceType;

impl From<ServiceType> for Service {
    fn from(s: ServiceType) -> Service {
        match s {
            ServiceType::Unreliable => Service::Unreliable,
            ServiceType::Reliable => Service::Reliable,
            ServiceType::Fifo => Service::Fifo,
            ServiceType::Causal => Service::Causal,
            ServiceType::Agreed => Service::Agreed,
            ServiceType::Safe => Service::Safe,
        }
    }
}

/// A group view's number in the history: the ring's sequence number, then the view's number on
/// that ring, so that one process's views of a group are numbered in the order it installs them.
/// (Exact up to 2^32 views of one group on one ring and rings numbered below 2^32.)
pub fn group_view_number(v: GroupViewId) -> u64 {
    (v.ring.seq << 32) | v.index.min(u32::MAX as u64)
}

/// How a recorder names what it records.
pub struct Naming<'a> {
    /// A group view's id.
    pub view: &'a dyn Fn(GroupViewId) -> ViewId,
    /// A message's id, from its sender, group and payload.
    pub msg: &'a dyn Fn(&str, &str, &[u8]) -> String,
    /// A payload as text.
    pub payload: &'a dyn Fn(&[u8]) -> String,
}

/// The history event for an event of `client`; `None` for a flush request and a closed
/// session, which each recorder handles its own way, and for a view's key.
pub fn client_event(client: &str, ev: ClientEvent, n: &Naming) -> Option<Event> {
    Some(match ev {
        ClientEvent::Joined { group, vs } => Event::Join { group, vs },
        ClientEvent::Left { group } => Event::Leave { group },
        ClientEvent::Sent {
            group,
            service,
            payload,
            view,
        } => Event::Send {
            msg: (n.msg)(client, &group, &payload),
            service: service.into(),
            view: (n.view)(view),
            payload: (n.payload)(&payload),
            group,
        },
        ClientEvent::FlushAcked { group } => Event::FlushAck { group },
        ClientEvent::View {
            group,
            view,
            members,
            transitional,
            ..
        } => Event::View {
            group,
            view: (n.view)(view),
            members: members.to_vec(),
            transitional: transitional.to_vec(),
        },
        ClientEvent::TransitionalSignal { group } => Event::TransSignal { group },
        ClientEvent::Message {
            group,
            sender,
            service,
            payload,
            view,
            transitional,
        } => Event::Deliver {
            msg: (n.msg)(&sender, &group, &payload),
            sender,
            service: service.into(),
            view: (n.view)(view),
            transitional,
            payload: (n.payload)(&payload),
            group,
        },
        // A key is the secure layer's to record (as a secure view, by fingerprint).
        ClientEvent::FlushRequest { .. }
        | ClientEvent::Closed { .. }
        | ClientEvent::ViewKey { .. } => return None,
    })
}
