//! The history of a node's run (docs/history.md), as the checker reads it: its clients' events
//! and its own daemon views. The node queues records here; the daemon writes them to its
//! `--record` file, the simulator collects them from every node into one history.
//!
//! Times are the node's clock plus a base the driver gives (the daemon: wall-clock microseconds
//! since the Unix epoch, so the files of several daemons on one machine merge into one history;
//! the simulator: zero, its clock being the same for every node). A message is named by its
//! sender, a digest of its payload and the group (`alice#d1:9f2c...@chat`): the daemons carry no
//! message number, so two messages with the same payload from one sender to one group would look
//! like one message delivered twice. Tests give every message its own payload.
//!
//! With [`Recorder::ring_messages`], the ring's own sends and deliveries of client messages are
//! recorded too (group "", messages named `r:` and the sender and digest), so that recovery and
//! extended virtual synchrony of the ring are checked as well as the groups on top.

use conclave_gcs::{ClientEvent, GroupViewId, RingEvent};
use conclave_history::wire::{client_event, Naming};
use conclave_history::{Event, Record, Service, ViewId};
use conclave_secure::{Consumed, SecureEvent};
use conclave_wire::gcs::{Body, DaemonId, RingId};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;

pub struct Recorder {
    /// Daemon names by id, for view ids.
    names: Vec<String>,
    /// Added to the node's clock for a record's time.
    base_us: u64,
    /// Also the ring's sends and deliveries of client messages.
    pub ring_messages: bool,
    out: VecDeque<Record>,
}

fn digest(payload: &[u8]) -> String {
    hex::encode(&Sha256::digest(payload)[..8])
}

/// A message's name in a history: its sender, a digest of its payload, its group.
pub fn message_name(sender: &str, group: &str, payload: &[u8]) -> String {
    format!("{sender}:{}@{group}", digest(payload))
}

/// A group view's id as histories name it, its ring's representative being `daemon`.
pub fn group_view_id(daemon: &str, v: GroupViewId) -> ViewId {
    ViewId(
        conclave_history::wire::group_view_number(v),
        format!("{daemon}.{}", v.ring.inc),
    )
}

/// The history's record of what a secure layer told its application (`None` for what the
/// history leaves out); `view` names a group view. Plaintexts are named by digest, keys by
/// fingerprint.
pub fn secure_event(ev: &SecureEvent, view: &dyn Fn(GroupViewId) -> ViewId) -> Option<Event> {
    Some(match ev {
        SecureEvent::View(v) => Event::SecureView {
            group: v.group.clone(),
            view: view(v.view),
            members: v.members.to_vec(),
            key: v.fingerprint.to_string(),
            without: v.without.clone(),
        },
        SecureEvent::Message {
            group,
            sender,
            view: v,
            payload,
            ..
        } => Event::SecureDeliver {
            msg: message_name(sender, group, payload),
            group: group.clone(),
            sender: sender.clone(),
            view: view(*v),
        },
        SecureEvent::Refused {
            group,
            sender,
            error,
        } => Event::SecureRefused {
            group: group.clone(),
            sender: sender.clone(),
            error: error.kind().into(),
        },
        _ => return None,
    })
}

/// The history's record of a key agreement message a secure layer's run took in.
pub fn consumed(group: &str, c: &Consumed, view: &dyn Fn(GroupViewId) -> ViewId) -> Event {
    Event::SecureConsumed {
        group: group.to_owned(),
        sender: c.sender.clone(),
        signed_for: view(c.signed_for),
        run: view(c.run),
    }
}

impl Recorder {
    pub fn new(names: Vec<String>, base_us: u64) -> Recorder {
        Recorder {
            names,
            base_us,
            ring_messages: false,
            out: VecDeque::new(),
        }
    }

    fn daemon(&self, id: DaemonId) -> String {
        self.names
            .get((id as usize).wrapping_sub(1))
            .cloned()
            .unwrap_or_else(|| format!("#{id}"))
    }

    pub fn ring_view(&self, ring: RingId) -> ViewId {
        ViewId(ring.seq, format!("{}.{}", self.daemon(ring.rep), ring.inc))
    }

    fn group_view(&self, v: GroupViewId) -> ViewId {
        group_view_id(&self.daemon(v.ring.rep), v)
    }

    pub fn push(&mut self, now: conclave_gcs::Time, p: &str, inc: u32, ev: Event) {
        self.out.push_back(Record {
            t: self.base_us + now.as_micros(),
            p: p.to_owned(),
            inc,
            ev,
        });
    }

    /// The next record, in the order they were made.
    pub fn pop(&mut self) -> Option<Record> {
        self.out.pop_front()
    }

    /// One client event, as the history has it (`None` for events the history leaves out).
    pub fn client_event(&self, client: &str, ev: &ClientEvent) -> Option<Event> {
        match ev {
            ClientEvent::Closed { .. } => Some(Event::Crash),
            ClientEvent::Sent {
                group,
                service,
                payload,
                view,
            } if view.index == conclave_gcs::OPEN_VIEW => Some(Event::OpenSend {
                msg: message_name(client, group, payload),
                group: group.clone(),
                service: Service::from(*service),
                payload: hex::encode(payload),
            }),
            // Messages to a private group are a Spread client's to one client, outside any
            // group: the history leaves them out.
            ClientEvent::Message { view, .. } if view.index == conclave_gcs::OPEN_VIEW => None,
            ev => {
                let naming = Naming {
                    view: &|v| self.group_view(v),
                    msg: &message_name,
                    payload: &|p: &[u8]| hex::encode(p),
                };
                client_event(client, ev.clone(), &naming)
            }
        }
    }

    /// What the daemons' key agreement told this daemon, as the history has it.
    pub fn secure_event(&self, ev: &SecureEvent) -> Option<Event> {
        secure_event(ev, &|v| self.group_view(v))
    }

    /// The key of `view` of `group` this daemon hands a client (by its fingerprint alone).
    pub fn group_key(
        &self,
        group: &str,
        view: GroupViewId,
        key: &conclave_wire::client::KeyBytes,
    ) -> Event {
        Event::GroupKey {
            group: group.to_owned(),
            view: self.group_view(view),
            key: conclave_crypto::GroupKey::from_bytes(key.0)
                .fingerprint()
                .to_string(),
        }
    }

    /// A message the daemons' key agreement took in.
    pub fn consumed(&self, c: &Consumed) -> Event {
        consumed(crate::daemons_key::DAEMONS_GROUP, c, &|v| {
            self.group_view(v)
        })
    }

    /// One event of the ring layer, as the history has it (`None` for what it leaves out: the
    /// ring's own messages, and client messages unless [`Recorder::ring_messages`]).
    pub fn ring_event(&self, ev: &RingEvent) -> Option<Event> {
        let msg_of = |body: &Body| match body {
            Body::Client {
                client,
                service,
                payload,
                ..
            } if self.ring_messages => Some((
                Service::from(*service),
                format!("r:{client}:{}", digest(payload)),
                hex::encode(payload),
            )),
            _ => None,
        };
        Some(match ev {
            RingEvent::Configuration(c) => {
                let names = |ids: &[DaemonId]| ids.iter().map(|&i| self.daemon(i)).collect();
                Event::View {
                    group: String::new(),
                    view: self.ring_view(c.ring),
                    members: names(&c.members),
                    transitional: names(&c.transitional),
                }
            }
            RingEvent::TransitionalSignal { .. } => Event::TransSignal {
                group: String::new(),
            },
            RingEvent::Sent { ring, body, .. } => {
                let (service, msg, payload) = msg_of(body)?;
                Event::Send {
                    group: String::new(),
                    msg,
                    service,
                    view: self.ring_view(*ring),
                    payload,
                }
            }
            RingEvent::Deliver {
                ring,
                sender,
                body,
                transitional,
                ..
            } => {
                let (service, msg, payload) = msg_of(body)?;
                Event::Deliver {
                    group: String::new(),
                    msg,
                    sender: self.daemon(*sender),
                    service,
                    view: self.ring_view(*ring),
                    transitional: *transitional,
                    payload,
                }
            }
        })
    }
}
