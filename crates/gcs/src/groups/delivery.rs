//! Delivering a client message to the local members that hold the view it was sent in, framed
//! from the ring's shared message.

use super::*;

impl Daemon {
    pub(super) fn on_deliver(
        &mut self,
        ring: RingId,
        sender: DaemonId,
        body: Arc<Body>,
        transitional: bool,
    ) {
        let current = self.config.as_ref().map(|c| c.0);
        if self
            .config
            .as_ref()
            .is_some_and(|c| c.0 == ring && !c.1.contains(&sender))
        {
            // Wire input is hostile: a daemon outside the configuration speaks for nobody.
            return;
        }
        // Client messages, the bulk, are read where they lie: the ring layer still holds them.
        if let Body::Client { client, groups, .. } = &*body {
            let mut spoken_for = None;
            for (index, (group, sent_in)) in groups.iter().enumerate() {
                if *sent_in == OPEN_VIEW {
                    // From outside the group: its sender's daemon must speak for it, and it is
                    // delivered in the view the group has here, now.
                    if !*spoken_for.get_or_insert_with(|| self.speaks_for(sender, client)) {
                        return;
                    }
                    self.deliver_open(&body, index, ring, transitional);
                    continue;
                }
                let Some(view) = self.groups.get(group.as_str()).and_then(|g| g.view) else {
                    continue;
                };
                if view.ring != ring || view.index != *sent_in {
                    // Sent in a view this daemon never installed: its ring broke before the
                    // flush that installs it ended here (the message reaches this daemon
                    // from the old ring's transitional part, past a hole). Nobody here may
                    // deliver it in another view.
                    continue;
                }
                let sender_in = self.groups[group.as_str()]
                    .members
                    .iter()
                    .any(|m| m.name == *client && m.daemon == sender);
                if !sender_in {
                    // Not sent in this view: a hostile or stale message.
                    continue;
                }
                self.deliver(&body, index, view, transitional);
            }
            return;
        }
        let foreign = match &*body {
            Body::GroupJoin { client, .. }
            | Body::GroupLeave { client, .. }
            | Body::ClientGone { client } => !self.speaks_for(sender, client),
            _ => false,
        };
        if foreign {
            return;
        }
        if let Body::GroupState { .. } = &*body {
            // Kept as shared: the ring's buffer holds the same message until every daemon has
            // it, and a state of thousands of memberships is not worth a copy.
            if Some(ring) != current || transitional {
                return;
            }
            let Some(states) = &mut self.syncing else {
                return;
            };
            states.insert(sender, body);
            let all = self
                .config
                .as_ref()
                .is_some_and(|c| c.1.iter().all(|d| states.contains_key(d)));
            if all {
                self.finish_sync();
            }
            return;
        }
        match Arc::unwrap_or_clone(body) {
            Body::Client { .. } | Body::GroupState { .. } => {}
            // Changes in an old ring's transitional part are left to the state exchange.
            _ if transitional || Some(ring) != current => {}
            Body::GroupJoin { client, group, vs } => {
                if check_name(&group).is_ok() {
                    let m = Member {
                        name: client,
                        daemon: sender,
                        vs,
                    };
                    self.queue_change(&group, Change::Join(m));
                }
            }
            Body::GroupLeave { client, group } => {
                self.queue_change(&group, Change::Leave(client, sender));
            }
            Body::ClientGone { client } => {
                if self.sync_backlog.is_some() {
                    self.wait_for_sync(None, Change::Gone(client, sender));
                    return;
                }
                // Every group where it is a member or has a join queued.
                let gs: Vec<String> = self
                    .groups
                    .iter()
                    .filter(|(_, g)| {
                        g.members.iter().any(|m| m.name == client)
                            || g.pending
                                .iter()
                                .any(|c| matches!(c, Change::Join(m) if m.name == client))
                            || g.flush.as_ref().is_some_and(
                                |f| matches!(&f.change, Change::Join(m) if m.name == client),
                            )
                    })
                    .map(|(n, _)| n.clone())
                    .collect();
                for g in gs {
                    self.queue_change(&g, Change::Gone(client.clone(), sender));
                }
            }
            // A marker of a flush that a configuration change ended is stale.
            Body::Flushed { .. } if self.syncing.is_some() => {}
            Body::Flushed { group, view } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    let index = g.view.map(|v| v.index);
                    if let Some(f) = g.flush.as_mut() {
                        if index == Some(view) && f.need.contains(&sender) {
                            f.got.insert(sender);
                        }
                    }
                }
                self.advance(&group);
            }
            Body::RecoveryDone => {}
        }
    }

    /// A message from outside its `index`th group (or to a private group, `#name`: the client
    /// `name`, if it is here), delivered in the group's current view on `ring`.
    fn deliver_open(&mut self, body: &Arc<Body>, index: usize, ring: RingId, transitional: bool) {
        let Body::Client { groups, .. } = &**body else {
            return;
        };
        let Some((group, _)) = groups.get(index) else {
            return;
        };
        if let Some(name) = group.strip_prefix('#') {
            // `#name#daemon` names a client; nothing else does (the daemons' own member of
            // their group, `#d1`, is nobody's to write to).
            let client = name.split_once('#').is_some_and(|(n, _)| !n.is_empty());
            if let Some(c) = self.clients.get(name).filter(|_| client) {
                self.events.push_back(LocalEvent::Message(Delivery {
                    client: c.id,
                    body: body.clone(),
                    index,
                    view: GroupViewId {
                        ring,
                        index: OPEN_VIEW,
                    },
                    transitional,
                }));
            }
            return;
        }
        match self.groups.get(group.as_str()).and_then(|g| g.view) {
            Some(view) if view.ring == ring => self.deliver(body, index, view, transitional),
            _ => {}
        }
    }

    /// A client message (`body`), for its `index`th group in that group's current view, to the
    /// local members holding that view.
    pub(super) fn deliver(
        &mut self,
        body: &Arc<Body>,
        index: usize,
        view: GroupViewId,
        transitional: bool,
    ) {
        let Body::Client { groups, .. } = &**body else {
            return;
        };
        let Some((group, _)) = groups.get(index) else {
            return;
        };
        // Not through `local_members`: this runs for every message at every member.
        for client in self.clients.values() {
            if client.views.get(group.as_str()) != Some(&view) {
                continue;
            }
            self.events.push_back(LocalEvent::Message(Delivery {
                client: client.id,
                body: body.clone(),
                index,
                view,
                transitional,
            }));
        }
    }
}

/// An event for one of a daemon's clients. A delivery, the bulk of them, stays in the ring's
/// shared message: queueing it copies no name and no payload.
#[derive(Clone, Debug)]
pub enum LocalEvent {
    Event(ClientId, ClientEvent),
    Message(Delivery),
    /// A view of a group for a Spread client ([`Daemon::connect_spread`]), with the sets of its
    /// members that came into it together (each set in name order; for a join, leave or
    /// departure, the one set of the members concerned), as Spread shows them.
    SpreadView {
        client: ClientId,
        view: ClientEvent,
        sets: Vec<Vec<String>>,
    },
    /// A Spread client's message to a group it is not in was accepted (there is no view to
    /// name: it is delivered in the view the group has where the ring orders it).
    OpenSent {
        client: ClientId,
        group: String,
        service: ServiceType,
        payload: Bytes,
    },
}

impl LocalEvent {
    /// The event as the client receives it.
    pub fn into_event(self) -> (ClientId, ClientEvent) {
        match self {
            LocalEvent::Event(c, ev) => (c, ev),
            LocalEvent::SpreadView { client, view, .. } => (client, view),
            LocalEvent::OpenSent {
                client,
                group,
                service,
                payload,
            } => (
                client,
                ClientEvent::Sent {
                    group,
                    service,
                    payload,
                    // No view: the ring's and the open number, as the message carries it.
                    view: GroupViewId {
                        ring: RingId {
                            seq: 0,
                            rep: 0,
                            inc: 0,
                        },
                        index: OPEN_VIEW,
                    },
                },
            ),
            LocalEvent::Message(d) => {
                let m = d.message();
                let ev = ClientEvent::Message {
                    group: m.group.to_owned(),
                    sender: m.sender.to_owned(),
                    service: m.service,
                    payload: d.payload().clone(),
                    view: m.view,
                    transitional: m.transitional,
                };
                (d.client, ev)
            }
        }
    }
}

/// A client message delivered to one local client: the ring's message and which of its groups.
#[derive(Clone, Debug)]
pub struct Delivery {
    client: ClientId,
    /// Always a [`Body::Client`] with a group at `index` (checked in `Daemon::deliver`).
    body: Arc<Body>,
    index: usize,
    view: GroupViewId,
    transitional: bool,
}

static NO_PAYLOAD: Bytes = Bytes::new();

impl Delivery {
    pub fn client(&self) -> ClientId {
        self.client
    }

    /// The ring's message: one for all its deliveries (at this daemon, to every client and
    /// group), always a [`Body::Client`].
    pub fn body(&self) -> &Arc<Body> {
        &self.body
    }

    /// The message's payload, as the ring holds it (a view of the buffer it arrived in).
    pub fn payload(&self) -> &Bytes {
        match &*self.body {
            Body::Client { payload, .. } => payload,
            _ => &NO_PAYLOAD,
        }
    }

    /// The delivery's fields, to frame for the client ([`MessageRef::frame_into`]).
    pub fn message(&self) -> MessageRef<'_> {
        let (group, sender, service) = match &*self.body {
            Body::Client {
                client,
                groups,
                service,
                ..
            } => (
                groups.get(self.index).map_or("", |g| g.0.as_str()),
                client.as_str(),
                *service,
            ),
            // Never made (see the field's doc).
            _ => ("", "", ServiceType::Unreliable),
        };
        MessageRef {
            group,
            sender,
            service,
            view: self.view,
            transitional: self.transitional,
            payload: self.payload(),
        }
    }
}
