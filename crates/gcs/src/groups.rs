//! Client groups on the daemons' ring: the daemon state machine that clients talk to
//! (docs/gcs.md, "Client groups on top").
//!
//! Every daemon sees the same ring messages in the same order, so every daemon computes the same
//! group views from them. Joins, leaves and client disconnections are ring messages. A group's
//! view changes by a *flush*: when a change is delivered, each daemon with members in the current
//! view asks its VS members for a flush acknowledgement, then sends a `Flushed` marker after
//! everything its clients sent in that view; once every such daemon's marker is delivered, the
//! new view is installed everywhere. From its marker until the new view, a daemon holds its
//! clients' new messages for the group; so every message is delivered in the view in which its
//! daemon accepted it (the client's view then), which is what D1 and D2 ask. A change delivered
//! while a flush is under way waits, and goes into the view that flush installs: one flush per
//! burst of changes.
//!
//! A daemon configuration change ends every group's view: the ring layer delivers the old ring's
//! last messages (in the transitional part, after a transitional signal to every member), then the
//! new configuration. Every daemon then sends the memberships of its own clients (`GroupState`);
//! once every member daemon's state is delivered, each group's new view (reason `network`) is its
//! members on the daemons of the new configuration, and the transitional set of a member is the
//! members of its previous view whose daemons came with its daemon from the old ring. Client
//! commands wait while a ring forms and until the states are in. Joins and leaves delivered in an
//! old ring's transitional part are left to the state exchange.
//!
//! View ids are the ring and a per-ring counter of the group's views; members are in name order.
//! A group with no members and nothing queued is forgotten; created again on the same ring, it
//! counts on from past every forgotten group's views, so no view id is used twice.
//!
//! A message may go to several groups: it is sent in the client's view of each, and carries each
//! group's view number.
//!
//! Departures: every service type is delivered in the ring's total order (unreliable, reliable,
//! FIFO and causal messages are not delivered ahead of it, docs/gcs.md says why), and safe
//! messages once stable; flush requests go to VS members before changes within a
//! configuration, not before a configuration change (which nobody can delay: the transitional
//! part stands in for it).

use crate::membership::{Membership, MembershipConfig, RingEvent};
use crate::ordering::{PeerRefusal, Transmit};
use conclave_wire::client::Bytes;
pub use conclave_wire::client::{ClientCommand, ClientEvent, GroupViewId, Reason};
use conclave_wire::client::{MessageRef, Refusal, MAX_VIEW_MEMBERS};
use conclave_wire::gcs::{
    Body, DaemonId, Packet, RingId, ServiceType, StateEntry, MAX_NAME_BYTES, MAX_STATE_ENTRIES,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// Limits and timeouts of a daemon's core, as deployed by default (`[core]` in the daemon's
/// configuration file).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    pub membership: MembershipConfig,
    /// Most clients connected at once.
    pub max_clients: usize,
    /// Most groups one client is in.
    pub max_groups_per_client: usize,
    /// Most commands of one client waiting for a view change to end.
    pub max_held_per_client: usize,
    /// Most bytes of them (one command always fits): a thousand messages of 128 KiB would be
    /// 128 MiB for one client.
    pub max_held_bytes_per_client: usize,
    /// Most joins and leaves of one client on their way into a view. A client that joins and
    /// leaves in a loop while a flush waits would otherwise grow its group's queue of changes
    /// for as long as the flush lasts; past this, its commands wait in its own queue (bounded by
    /// `max_held_per_client`).
    pub max_changes_per_client: usize,
    /// A VS client that has not acknowledged a flush request within this long is disconnected
    /// (milliseconds): one slow client must not hold its group's views back for ever.
    pub flush_timeout_ms: u64,
    /// Keep a copy of the ring layer's events for [`Daemon::poll_ring_event`] (to record the
    /// daemons' own history). Set by whoever runs the daemon, not by its configuration.
    #[serde(skip)]
    pub record_ring: bool,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            membership: MembershipConfig::default(),
            max_clients: 1_000,
            max_groups_per_client: 16,
            max_held_per_client: 1_000,
            max_held_bytes_per_client: 16 << 20,
            max_changes_per_client: 32,
            flush_timeout_ms: 2_000,
            record_ring: false,
        }
    }
}

impl DaemonConfig {
    /// Why these settings cannot work, if they cannot.
    pub fn validate(&self) -> Result<(), String> {
        self.membership.validate()?;
        if [
            self.max_clients,
            self.max_groups_per_client,
            self.max_held_per_client,
            self.max_held_bytes_per_client,
            self.max_changes_per_client,
        ]
        .contains(&0)
        {
            return Err("max_clients, max_groups_per_client, max_held_per_client, \
                 max_held_bytes_per_client and max_changes_per_client must be above 0"
                .into());
        }
        if self.flush_timeout_ms == 0 {
            return Err("flush_timeout_ms must be above 0".into());
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DaemonError {
    #[error("no client {0:?} is connected")]
    UnknownClient(String),
    #[error("client {0:?} is already connected")]
    AlreadyConnected(String),
    #[error("{max} clients are already connected")]
    TooManyClients { max: usize },
    #[error("a name must be 1 to {MAX_NAME_BYTES} bytes")]
    BadName,
    #[error("{client:?} is not in group {group:?}")]
    NotMember { client: String, group: String },
    #[error("{client:?} is already in group {group:?}")]
    AlreadyMember { client: String, group: String },
    #[error("a client may be in at most {max} groups")]
    TooManyGroups { max: usize },
    #[error("{max} commands of this client already wait")]
    TooManyHeld { max: usize },
    #[error("{max_bytes} bytes of this client's commands already wait")]
    TooManyHeldBytes { max_bytes: usize },
    /// A command malformed in itself ([`ClientCommand::validate`]: names, the group list, the
    /// payload's size).
    #[error("{reason}")]
    Malformed { code: Refusal, reason: String },
}

impl DaemonError {
    /// The code a client is refused with.
    pub fn refusal(&self) -> Refusal {
        match self {
            DaemonError::UnknownClient(_) => Refusal::BadRequest,
            DaemonError::AlreadyConnected(_) => Refusal::NameTaken,
            DaemonError::TooManyClients { .. } => Refusal::TooManyClients,
            DaemonError::BadName => Refusal::BadName,
            DaemonError::NotMember { .. } => Refusal::NotMember,
            DaemonError::AlreadyMember { .. } => Refusal::AlreadyMember,
            DaemonError::TooManyGroups { .. } => Refusal::TooManyGroups,
            DaemonError::TooManyHeld { .. } | DaemonError::TooManyHeldBytes { .. } => {
                Refusal::TooManyHeld
            }
            DaemonError::Malformed { code, .. } => *code,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Member {
    name: String,
    daemon: DaemonId,
    vs: bool,
}

#[derive(Clone, Debug)]
enum Change {
    Join(Member),
    /// A client (of the daemon named) leaves the group, or is gone from every group.
    Leave(String, DaemonId),
    Gone(String, DaemonId),
}

struct Flush {
    /// Daemons with members in the view being closed.
    need: BTreeSet<DaemonId>,
    got: BTreeSet<DaemonId>,
    /// Local VS members whose acknowledgement this daemon waits for.
    awaiting: BTreeSet<String>,
    /// Local members that acknowledged: they send nothing more in this view.
    acked: BTreeSet<String>,
    marker_sent: bool,
    change: Change,
    /// Local VS members that have not acknowledged by then are disconnected.
    deadline: u64,
}

#[derive(Default)]
struct Group {
    view: Option<GroupViewId>,
    /// The current view's members, in name order.
    members: Vec<Member>,
    /// The number of this group's next view on the current ring.
    count: u64,
    pending: VecDeque<Change>,
    flush: Option<Flush>,
}

struct Client {
    /// Its name, shared by every delivery queued for it.
    name: Arc<str>,
    /// Groups joined, as accepted (with the VS flag).
    groups: BTreeMap<String, bool>,
    /// Groups as they will be once every waiting command is accepted.
    intent: BTreeMap<String, bool>,
    /// The view of each group this client has installed (since it last joined it).
    views: BTreeMap<String, GroupViewId>,
    /// Commands not yet accepted, in order, one queue per group: a view change of one group
    /// holds back nothing of another (and a flush acknowledgement never waits behind a message
    /// to a group that is changing view).
    held: BTreeMap<String, VecDeque<ClientCommand>>,
    held_count: usize,
    /// Bytes of them ([`command_bytes`]).
    held_bytes: usize,
    /// Flush acknowledgements among them: the only commands that can go while the ring
    /// takes no more messages.
    held_acks: usize,
    /// Joins and leaves sent on the ring and not yet applied (or dropped) by the groups.
    changes: usize,
}

/// One daemon: the ring ([`Membership`]) and the client groups on it.
pub struct Daemon {
    cfg: DaemonConfig,
    me: DaemonId,
    ring: Membership,
    /// The current configuration: its ring and the daemons that came with this one from the
    /// previous.
    config: Option<(RingId, Vec<DaemonId>, Vec<DaemonId>)>,
    /// After a configuration change, the group states received so far; `None` once all are in.
    syncing: Option<BTreeMap<DaemonId, Vec<StateEntry>>>,
    /// Changes delivered during the state exchange, applied to the new group map (a group name,
    /// or none for a client gone from every group).
    sync_backlog: Option<Vec<(Option<String>, Change)>>,
    groups: BTreeMap<String, Group>,
    /// A group is forgotten once it has no members and nothing queued; one created again on
    /// the same ring numbers its views from here, past every view a forgotten group had, so a
    /// view id is never used twice.
    first_count: u64,
    clients: BTreeMap<String, Client>,
    events: VecDeque<LocalEvent>,
    ring_log: VecDeque<RingEvent>,
    /// The time of the input being handled.
    now: u64,
}

fn check_name(s: &str) -> Result<(), DaemonError> {
    if s.is_empty() || s.len() > MAX_NAME_BYTES {
        return Err(DaemonError::BadName);
    }
    Ok(())
}

impl Daemon {
    /// A daemon starting (or restarting as `incarnation`, see [`Membership::new`]).
    pub fn new(mut cfg: DaemonConfig, me: DaemonId, incarnation: u32, now: u64) -> Daemon {
        // Every membership of every client must fit in one group state.
        cfg.max_groups_per_client = cfg.max_groups_per_client.clamp(1, MAX_STATE_ENTRIES);
        cfg.max_clients = cfg
            .max_clients
            .min(MAX_STATE_ENTRIES / cfg.max_groups_per_client);
        let ring = Membership::new(cfg.membership.clone(), me, incarnation, now);
        Daemon {
            cfg,
            me,
            ring,
            config: None,
            syncing: None,
            sync_backlog: None,
            groups: BTreeMap::new(),
            first_count: 0,
            clients: BTreeMap::new(),
            events: VecDeque::new(),
            ring_log: VecDeque::new(),
            now,
        }
    }

    /// The daemon ring layer (for its state: ring, members, operational).
    pub fn membership(&self) -> &Membership {
        &self.ring
    }

    /// Groups this daemon keeps state for (a group with no members and nothing queued is
    /// forgotten).
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Whether client commands are being accepted: the ring is operational and the group
    /// states of the current configuration are all in.
    pub fn ready(&self) -> bool {
        self.ring.is_operational() && self.syncing.is_none() && self.config.is_some()
    }

    pub fn connect(&mut self, client: &str) -> Result<(), DaemonError> {
        check_name(client)?;
        if self.clients.contains_key(client) {
            return Err(DaemonError::AlreadyConnected(client.to_owned()));
        }
        if self.clients.len() >= self.cfg.max_clients {
            return Err(DaemonError::TooManyClients {
                max: self.cfg.max_clients,
            });
        }
        self.clients.insert(
            client.to_owned(),
            Client {
                name: Arc::from(client),
                groups: BTreeMap::new(),
                intent: BTreeMap::new(),
                views: BTreeMap::new(),
                held: BTreeMap::new(),
                held_count: 0,
                held_bytes: 0,
                held_acks: 0,
                changes: 0,
            },
        );
        Ok(())
    }

    /// The client's connection ended: it leaves every group; what it had not had accepted is
    /// dropped.
    pub fn disconnect(&mut self, now: u64, client: &str) -> Result<(), DaemonError> {
        self.now = now;
        let c = self
            .clients
            .remove(client)
            .ok_or_else(|| DaemonError::UnknownClient(client.to_owned()))?;
        for g in c.groups.keys() {
            if let Some(f) = self.groups.get_mut(g).and_then(|g| g.flush.as_mut()) {
                f.awaiting.remove(client);
            }
        }
        // Always announced: a state already sent on this ring may list the client.
        self.ring.submit_control(Body::ClientGone {
            client: client.to_owned(),
        });
        // A flush may have waited for it alone.
        for g in c.groups.keys() {
            self.advance(g);
        }
        self.after(now);
        Ok(())
    }

    pub fn handle_client(
        &mut self,
        now: u64,
        client: &str,
        cmd: ClientCommand,
    ) -> Result<(), DaemonError> {
        cmd.validate()
            .map_err(|(code, reason)| DaemonError::Malformed { code, reason })?;
        let max_held = self.cfg.max_held_per_client;
        let max_groups = self.cfg.max_groups_per_client;
        let c = self
            .clients
            .get_mut(client)
            .ok_or_else(|| DaemonError::UnknownClient(client.to_owned()))?;
        if c.held_count >= max_held {
            return Err(DaemonError::TooManyHeld { max: max_held });
        }
        // With something waiting, this command will wait too.
        let max_bytes = self.cfg.max_held_bytes_per_client;
        if c.held_count > 0 && c.held_bytes + command_bytes(&cmd) > max_bytes {
            return Err(DaemonError::TooManyHeldBytes { max_bytes });
        }
        let not_member = |group: &str| DaemonError::NotMember {
            client: client.to_owned(),
            group: group.to_owned(),
        };
        match &cmd {
            ClientCommand::Join { group, vs } => {
                if c.intent.contains_key(group) {
                    return Err(DaemonError::AlreadyMember {
                        client: client.to_owned(),
                        group: group.clone(),
                    });
                }
                if c.intent.len() >= max_groups {
                    return Err(DaemonError::TooManyGroups { max: max_groups });
                }
                c.intent.insert(group.clone(), *vs);
            }
            ClientCommand::Leave { group } => {
                if c.intent.remove(group).is_none() {
                    return Err(not_member(group));
                }
            }
            ClientCommand::Multicast { groups, .. } => {
                if let Some(g) = groups.iter().find(|g| !c.intent.contains_key(*g)) {
                    return Err(not_member(g));
                }
            }
            // A client leaving the group may still have a flush to acknowledge.
            ClientCommand::FlushAck { group, .. } => {
                if !c.intent.contains_key(group) && !c.groups.contains_key(group) {
                    return Err(not_member(group));
                }
            }
        }
        // With nothing of the client's waiting, a command that can go now skips the queue (the
        // common case, and the queue's bookkeeping was a fair part of a message's cost).
        let cmd = if c.held_count == 0 && self.ready() {
            self.now = now;
            match self.try_accept(client, cmd) {
                Ok(()) => {
                    self.after(now);
                    return Ok(());
                }
                Err(cmd) => cmd,
            }
        } else {
            cmd
        };
        let Some(c) = self.clients.get_mut(client) else {
            return Err(DaemonError::UnknownClient(client.to_owned()));
        };
        let group = match &cmd {
            ClientCommand::Join { group, .. }
            | ClientCommand::Leave { group }
            | ClientCommand::FlushAck { group, .. } => group.clone(),
            // A message to several groups waits in the queue of the first.
            ClientCommand::Multicast { groups, .. } => groups[0].clone(),
        };
        if matches!(cmd, ClientCommand::FlushAck { .. }) {
            c.held_acks += 1;
        }
        c.held_bytes += command_bytes(&cmd);
        c.held.entry(group).or_default().push_back(cmd);
        c.held_count += 1;
        self.after(now);
        Ok(())
    }

    /// A packet from daemon `from`. Input no correct daemon sends is refused with its reason
    /// ([`PeerRefusal`]); undecodable input changes nothing.
    pub fn handle_packet(
        &mut self,
        now: u64,
        from: DaemonId,
        bytes: &[u8],
    ) -> Result<(), PeerRefusal> {
        let p = Packet::decode(bytes)?;
        let r = self.ring.handle_packet(now, from, p);
        // What the packet changed before it was found out is followed through.
        self.after(now);
        r
    }

    pub fn handle_timeout(&mut self, now: u64) {
        self.now = now;
        self.ring.handle_timeout(now);
        // VS clients that let a flush wait too long are closed.
        let late: Vec<String> = self
            .groups
            .values()
            .filter_map(|g| g.flush.as_ref())
            .filter(|f| f.deadline <= now)
            .flat_map(|f| f.awaiting.iter().cloned())
            .collect();
        for c in late {
            self.emit(
                &c,
                ClientEvent::Closed {
                    reason: "no flush acknowledgement in time".into(),
                },
            );
            let _ = self.disconnect(now, &c);
        }
        self.after(now);
    }

    pub fn poll_timeout(&self) -> Option<u64> {
        let flush = self
            .groups
            .values()
            .filter_map(|g| g.flush.as_ref())
            .filter(|f| !f.awaiting.is_empty())
            .map(|f| f.deadline)
            .min();
        match (self.ring.poll_timeout(), flush) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.ring.poll_transmit()
    }

    /// The ring layer's events, if [`DaemonConfig::record_ring`] is set.
    pub fn poll_ring_event(&mut self) -> Option<RingEvent> {
        self.ring_log.pop_front()
    }

    /// Whether [`Daemon::poll_event`] has an event.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event for one of this daemon's clients.
    pub fn poll_event(&mut self) -> Option<(String, ClientEvent)> {
        self.events.pop_front().map(LocalEvent::into_event)
    }

    /// The next event for one of this daemon's clients, with a delivery left in the ring's
    /// message (for a caller that only reads it, as the daemon process framing it for its
    /// client does).
    pub fn pop_event(&mut self) -> Option<LocalEvent> {
        self.events.pop_front()
    }

    /// The daemon-level events of the ring (configurations, deliveries) are consumed here; this
    /// runs after every input.
    fn after(&mut self, now: u64) {
        self.now = now;
        loop {
            while let Some(ev) = self.ring.poll_event() {
                if self.cfg.record_ring {
                    self.ring_log.push_back(ev.clone());
                }
                self.on_ring(ev);
            }
            if !self.pump() {
                break;
            }
        }
    }

    fn emit(&mut self, client: &str, ev: ClientEvent) {
        self.events
            .push_back(LocalEvent::Event(client.to_owned(), ev));
    }

    /// Local clients that have installed the current view of `group`.
    fn local_members(&self, group: &str) -> Vec<String> {
        let Some(view) = self.groups.get(group).and_then(|g| g.view) else {
            return Vec::new();
        };
        self.clients
            .iter()
            .filter(|(_, c)| c.views.get(group) == Some(&view))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Installs `view` of `group` at the local clients among `members` that are in the group,
    /// each with its transitional set: `stayed` for those in `before`, itself for the others. A
    /// client with no view of the group yet gets its first one from its own join (`joiner`) or a
    /// state exchange: a member of the same name may be an earlier connection of it, whose
    /// departure is still on its way.
    fn emit_view(
        &mut self,
        group: &str,
        view: GroupViewId,
        members: &[String],
        before: &[String],
        reason: Reason,
        joiners: &[String],
    ) {
        let stayed: Vec<String> = members
            .iter()
            .filter(|m| before.contains(m))
            .cloned()
            .collect();
        self.emit_view_with(group, view, members, reason, joiners, |c, came| {
            if came && before.iter().any(|b| b == c) {
                stayed.clone()
            } else {
                vec![c.to_owned()]
            }
        });
    }

    /// As [`Daemon::emit_view`], with each client's transitional set from `trans(client, had a
    /// view)`.
    fn emit_view_with(
        &mut self,
        group: &str,
        view: GroupViewId,
        members: &[String],
        reason: Reason,
        joiners: &[String],
        trans: impl Fn(&str, bool) -> Vec<String>,
    ) {
        let local: Vec<String> = self
            .clients
            .iter()
            .filter(|(n, c)| {
                c.groups.contains_key(group)
                    && members.contains(n)
                    && (c.views.contains_key(group)
                        || reason == Reason::Network
                        || joiners.contains(n))
            })
            .map(|(n, _)| n.clone())
            .collect();
        for c in local {
            // A client that installed no view of the group since it joined comes alone.
            let transitional = trans(&c, self.clients[&c].views.contains_key(group));
            if let Some(cl) = self.clients.get_mut(&c) {
                cl.views.insert(group.to_owned(), view);
            }
            self.emit(
                &c,
                ClientEvent::View {
                    group: group.to_owned(),
                    view,
                    members: members.to_vec(),
                    transitional,
                    reason,
                },
            );
        }
    }

    fn on_ring(&mut self, ev: RingEvent) {
        match ev {
            RingEvent::Sent { .. } => {}
            RingEvent::TransitionalSignal { ring } => {
                let names: Vec<String> = self.groups.keys().cloned().collect();
                for g in names {
                    // Only views of the ring that ends have a transitional part.
                    if self.groups[&g].view.is_some_and(|v| v.ring == ring) {
                        for c in self.local_members(&g) {
                            self.emit(&c, ClientEvent::TransitionalSignal { group: g.clone() });
                        }
                    }
                    if let Some(gr) = self.groups.get_mut(&g) {
                        // The state exchange decides what the ring could not finish.
                        gr.flush = None;
                        gr.pending.clear();
                    }
                }
            }
            RingEvent::Configuration(c) => {
                // A client's view counts as where it comes from only if it is a view of the
                // ring that just ended: after a ring on which the groups never settled, the
                // daemons that come together did not necessarily come together from the
                // client's view, and may have delivered different parts of it.
                let previous = self.config.as_ref().map(|c| c.0);
                self.config = Some((c.ring, c.members.clone(), c.transitional.clone()));
                self.syncing = Some(BTreeMap::new());
                self.sync_backlog = Some(Vec::new());
                for g in self.groups.values_mut() {
                    g.flush = None;
                    g.pending.clear();
                }
                // Every change a client sent went on the ring that ended: applied, or left to
                // the state exchange.
                for c in self.clients.values_mut() {
                    c.changes = 0;
                }
                let mut members = Vec::new();
                for (name, cl) in &self.clients {
                    for (g, vs) in &cl.groups {
                        if members.len() < MAX_STATE_ENTRIES {
                            members.push(StateEntry {
                                client: name.clone(),
                                group: g.clone(),
                                vs: *vs,
                                view: cl
                                    .views
                                    .get(g)
                                    .filter(|v| Some(v.ring) == previous)
                                    .map(|v| (v.ring, v.index)),
                            });
                        }
                    }
                }
                self.ring.submit_control(Body::GroupState { members });
            }
            RingEvent::Deliver {
                ring,
                sender,
                body,
                transitional,
                ..
            } => self.on_deliver(ring, sender, body, transitional),
        }
    }

    fn on_deliver(&mut self, ring: RingId, sender: DaemonId, body: Arc<Body>, transitional: bool) {
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
            for (index, (group, sent_in)) in groups.iter().enumerate() {
                let Some(view) = self.groups.get(group).and_then(|g| g.view) else {
                    continue;
                };
                if view.ring != ring || view.index != *sent_in {
                    // Sent in a view this daemon never installed: its ring broke before the
                    // flush that installs it ended here (the message reaches this daemon
                    // from the old ring's transitional part, past a hole). Nobody here may
                    // deliver it in another view.
                    continue;
                }
                let sender_in = self.groups[group]
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
        match Arc::unwrap_or_clone(body) {
            Body::Client { .. } => {}
            Body::GroupState { members } => {
                if Some(ring) != current || transitional {
                    return;
                }
                let Some(states) = &mut self.syncing else {
                    return;
                };
                states.insert(sender, members);
                let all = self
                    .config
                    .as_ref()
                    .is_some_and(|c| c.1.iter().all(|d| states.contains_key(d)));
                if all {
                    self.finish_sync();
                }
            }
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
                if let Some(backlog) = &mut self.sync_backlog {
                    backlog.push((None, Change::Gone(client, sender)));
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

    /// A client message (`body`), for its `index`th group in that group's current view, to the
    /// local members holding that view.
    fn deliver(&mut self, body: &Arc<Body>, index: usize, view: GroupViewId, transitional: bool) {
        let Body::Client { groups, .. } = &**body else {
            return;
        };
        let Some((group, _)) = groups.get(index) else {
            return;
        };
        // Not through `local_members`: this runs for every message at every member.
        for client in self.clients.values() {
            if client.views.get(group) != Some(&view) {
                continue;
            }
            self.events.push_back(LocalEvent::Message(Delivery {
                client: client.name.clone(),
                body: body.clone(),
                index,
                view,
                transitional,
            }));
        }
    }

    fn queue_change(&mut self, group: &str, change: Change) {
        // During the state exchange, changes wait for the new group map.
        if let Some(backlog) = &mut self.sync_backlog {
            backlog.push((Some(group.to_owned()), change));
            return;
        }
        // Only groups that exist (a join creates one); a bounded number per client is enforced
        // where clients join.
        if !self.groups.contains_key(group) && !matches!(change, Change::Join(_)) {
            self.consumed(&change);
            return;
        }
        let count = self.first_count;
        self.groups
            .entry(group.to_owned())
            .or_insert_with(|| Group {
                count,
                ..Group::default()
            })
            .pending
            .push_back(change);
        if self.syncing.is_none() {
            self.advance(group);
        }
    }

    /// Starts, continues or ends the flush of `group`.
    fn advance(&mut self, group: &str) {
        if self.syncing.is_some() {
            return;
        }
        loop {
            let me = self.me;
            let Some(g) = self.groups.get_mut(group) else {
                return;
            };
            if g.flush.is_none() {
                let Some(change) = g.pending.pop_front() else {
                    if g.members.is_empty() {
                        self.first_count = self.first_count.max(g.count);
                        self.groups.remove(group);
                    }
                    return;
                };
                if !changes_anything(&g.members, &change) {
                    self.consumed(&change);
                    continue;
                }
                let need: BTreeSet<DaemonId> = g.members.iter().map(|m| m.daemon).collect();
                g.flush = Some(Flush {
                    need,
                    got: BTreeSet::new(),
                    awaiting: BTreeSet::new(),
                    acked: BTreeSet::new(),
                    marker_sent: false,
                    change,
                    deadline: self.now + self.cfg.flush_timeout_ms * 1000,
                });
                // The VS clients here that hold the view being closed (a member of the same name
                // that has not installed it is a later connection, or one that left and joined
                // again: it has nothing to flush).
                let awaiting: Vec<String> = self
                    .local_members(group)
                    .into_iter()
                    .filter(|c| self.clients[c].groups.get(group) == Some(&true))
                    .collect();
                // (Local members exist only where the group has a view.)
                let view = self.groups[group].view;
                for (c, view) in awaiting.into_iter().zip(std::iter::repeat(view)) {
                    let Some(view) = view else { break };
                    self.emit(
                        &c,
                        ClientEvent::FlushRequest {
                            group: group.to_owned(),
                            view,
                        },
                    );
                    if let Some(f) = self.groups.get_mut(group).and_then(|g| g.flush.as_mut()) {
                        f.awaiting.insert(c);
                    }
                }
            }
            let g = self.groups.get_mut(group).expect("present");
            let index = g.view.map_or(0, |v| v.index);
            let f = g.flush.as_mut().expect("flushing");
            if f.need.contains(&me) && !f.marker_sent && f.awaiting.is_empty() {
                f.marker_sent = true;
                self.ring.submit_control(Body::Flushed {
                    group: group.to_owned(),
                    view: index,
                });
            }
            if !f.got.is_superset(&f.need) {
                return;
            }
            // Every change delivered meanwhile goes into the same view: each daemon has the same
            // ones queued when the last marker arrives, and a burst of joins and leaves costs one
            // flush.
            let f = g.flush.take().expect("flushing");
            let mut changes = vec![f.change];
            changes.extend(g.pending.drain(..));
            self.install_changes(group, changes);
        }
    }

    fn next_view(&mut self, group: &str) -> GroupViewId {
        let ring = self.config.as_ref().expect("a configuration").0;
        let g = self.groups.get_mut(group).expect("present");
        let id = GroupViewId {
            ring,
            index: g.count,
        };
        g.count += 1;
        g.view = Some(id);
        id
    }

    /// A join or leave has been applied to a view, or dropped: its client may send another.
    fn consumed(&mut self, change: &Change) {
        let client = match change {
            Change::Join(m) if m.daemon == self.me => &m.name,
            Change::Leave(n, d) if *d == self.me => n,
            _ => return,
        };
        if let Some(c) = self.clients.get_mut(client) {
            c.changes = c.changes.saturating_sub(1);
        }
    }

    /// Installs the view that `changes` make of the current one (the reason is the first's).
    fn install_changes(&mut self, group: &str, changes: Vec<Change>) {
        for c in &changes {
            self.consumed(c);
        }
        let g = self.groups.get_mut(group).expect("present");
        let old: Vec<String> = g.members.iter().map(|m| m.name.clone()).collect();
        let mut joiners = Vec::new();
        let mut reason = None;
        for change in changes {
            let r = match change {
                Change::Join(m) => {
                    // Past the limit a join is ignored, the same way everywhere.
                    let room = g.members.len() < MAX_VIEW_MEMBERS;
                    if room && !g.members.iter().any(|x| x.name == m.name) {
                        joiners.push(m.name.clone());
                        g.members.push(m);
                    }
                    Reason::Join
                }
                Change::Leave(n, d) => {
                    g.members.retain(|m| m.name != n || m.daemon != d);
                    joiners.retain(|j| *j != n);
                    Reason::Leave
                }
                Change::Gone(n, d) => {
                    g.members.retain(|m| m.name != n || m.daemon != d);
                    joiners.retain(|j| *j != n);
                    Reason::Disconnect
                }
            };
            reason.get_or_insert(r);
        }
        g.members.sort_by(|a, b| a.name.cmp(&b.name));
        let view = self.next_view(group);
        let members: Vec<String> = self.groups[group]
            .members
            .iter()
            .map(|m| m.name.clone())
            .collect();
        let reason = reason.unwrap_or(Reason::Join);
        // One who left and joined again within the batch comes alone.
        let stayed: Vec<String> = old.into_iter().filter(|m| !joiners.contains(m)).collect();
        self.emit_view(group, view, &members, &stayed, reason, &joiners);
    }

    /// Every daemon's group state is in: each group's view on the new configuration. A member's
    /// transitional set is the members that reported the same previous view as it, from daemons
    /// that came with this one.
    fn finish_sync(&mut self) {
        let Some(states) = self.syncing.take() else {
            return;
        };
        let backlog = self.sync_backlog.take().unwrap_or_default();
        self.first_count = 0;
        for g in self.groups.values_mut() {
            g.flush = None;
            g.pending.clear();
        }
        let (_, _, came_with) = self.config.clone().expect("a configuration");
        type Prev = Option<(RingId, u64)>;
        let mut next: BTreeMap<String, Vec<(Member, Prev)>> = BTreeMap::new();
        for (daemon, entries) in states {
            for e in entries {
                if check_name(&e.client).is_err() || check_name(&e.group).is_err() {
                    continue;
                }
                let ms = next.entry(e.group).or_default();
                if ms.len() < MAX_VIEW_MEMBERS && !ms.iter().any(|(m, _)| m.name == e.client) {
                    let m = Member {
                        name: e.client,
                        daemon,
                        vs: e.vs,
                    };
                    ms.push((m, e.view.filter(|_| came_with.contains(&daemon))));
                }
            }
        }
        let names: BTreeSet<String> = self.groups.keys().chain(next.keys()).cloned().collect();
        for group in names {
            let mut entries = next.remove(&group).unwrap_or_default();
            entries.sort_by(|a, b| a.0.name.cmp(&b.0.name));
            let g = self.groups.entry(group.clone()).or_default();
            g.count = 0;
            g.members = entries.iter().map(|(m, _)| m.clone()).collect();
            if g.members.is_empty() {
                self.groups.remove(&group);
                continue;
            }
            let view = self.next_view(&group);
            let members: Vec<String> = entries.iter().map(|(m, _)| m.name.clone()).collect();
            let prev_of = |c: &str| {
                entries
                    .iter()
                    .find(|(m, _)| m.name == c)
                    .and_then(|(_, p)| *p)
            };
            let trans = |c: &str, had: bool| match prev_of(c) {
                Some(p) if had => entries
                    .iter()
                    .filter(|(_, q)| *q == Some(p))
                    .map(|(m, _)| m.name.clone())
                    .collect(),
                _ => vec![c.to_owned()],
            };
            self.emit_view_with(&group, view, &members, Reason::Network, &[], trans);
        }
        // The changes delivered meanwhile, in their order.
        for (group, change) in backlog {
            match group {
                Some(g) => self.queue_change(&g, change),
                None => {
                    let names: Vec<String> = self.groups.keys().cloned().collect();
                    for g in names {
                        self.queue_change(&g, change.clone());
                    }
                }
            }
        }
    }

    /// Accepts what clients have waiting, in each client's order per group, as far as it can.
    /// Returns whether anything was accepted.
    fn pump(&mut self) -> bool {
        if !self.ready() {
            return false;
        }
        let mut any = false;
        // Called after every packet and command: while the ring takes no more messages, only a
        // queue holding an acknowledgement is worth a look.
        let submit = self.ring.can_submit();
        let queues: Vec<(String, String)> = self
            .clients
            .iter()
            .filter(|(_, c)| submit || c.held_acks > 0)
            .flat_map(|(n, c)| c.held.keys().map(move |g| (n.clone(), g.clone())))
            .collect();
        for (name, group) in queues {
            while let Some(q) = self.held_mut(&name, &group) {
                let Some(head) = q.pop_front() else {
                    break;
                };
                // A message to several groups may wait for another group's view, and a join or
                // leave for the client's earlier ones to be applied; a flush acknowledgement
                // behind them does not wait (that group's flush may be what they wait for), and
                // they then go in the next view.
                let ack = matches!(head, ClientCommand::FlushAck { .. });
                let bytes = command_bytes(&head);
                let ack_behind = match &head {
                    ClientCommand::Multicast { groups, .. } if groups.len() == 1 => None,
                    _ => q
                        .iter()
                        .position(|c| matches!(c, ClientCommand::FlushAck { .. })),
                };
                let head = match self.try_accept(&name, head) {
                    Ok(()) => {
                        self.accepted(&name, &group, ack, bytes);
                        any = true;
                        continue;
                    }
                    Err(head) => head,
                };
                let Some(q) = self.held_mut(&name, &group) else {
                    break;
                };
                q.push_front(head);
                let Some(ack) = ack_behind.and_then(|i| q.remove(i + 1)) else {
                    break;
                };
                let ack_bytes = command_bytes(&ack);
                match self.try_accept(&name, ack) {
                    Ok(()) => {
                        self.accepted(&name, &group, true, ack_bytes);
                        any = true;
                    }
                    Err(ack) => {
                        if let Some(q) = self.held_mut(&name, &group) {
                            q.insert(ack_behind.unwrap_or(0) + 1, ack);
                        }
                        break;
                    }
                }
            }
        }
        any
    }

    fn held_mut(&mut self, client: &str, group: &str) -> Option<&mut VecDeque<ClientCommand>> {
        self.clients.get_mut(client)?.held.get_mut(group)
    }

    /// A command taken from the client's queue for `group` was accepted.
    fn accepted(&mut self, client: &str, group: &str, ack: bool, bytes: usize) {
        if let Some(c) = self.clients.get_mut(client) {
            c.held_count -= 1;
            c.held_bytes -= bytes;
            c.held_acks -= usize::from(ack);
            if c.held.get(group).is_some_and(|q| q.is_empty()) {
                c.held.remove(group);
            }
        }
    }

    /// Accepts one command if it can go now; gives it back if not.
    fn try_accept(&mut self, client: &str, cmd: ClientCommand) -> Result<(), ClientCommand> {
        if matches!(
            cmd,
            ClientCommand::Join { .. } | ClientCommand::Leave { .. }
        ) {
            let Some(c) = self.clients.get_mut(client) else {
                return Err(cmd);
            };
            if c.changes >= self.cfg.max_changes_per_client {
                return Err(cmd);
            }
        }
        // Everything but an acknowledgement goes on the ring.
        if !matches!(cmd, ClientCommand::FlushAck { .. }) && !self.ring.can_submit() {
            return Err(cmd);
        }
        match cmd {
            ClientCommand::Join { group, vs } => {
                self.submit(Body::GroupJoin {
                    client: client.to_owned(),
                    group: group.clone(),
                    vs,
                });
                if let Some(c) = self.clients.get_mut(client) {
                    c.groups.insert(group.clone(), vs);
                    c.changes += 1;
                }
                self.emit(client, ClientEvent::Joined { group, vs });
                Ok(())
            }
            ClientCommand::Leave { group } => {
                self.submit(Body::GroupLeave {
                    client: client.to_owned(),
                    group: group.clone(),
                });
                if let Some(c) = self.clients.get_mut(client) {
                    c.groups.remove(&group);
                    c.views.remove(&group);
                    c.changes += 1;
                }
                if let Some(f) = self.groups.get_mut(&group).and_then(|g| g.flush.as_mut()) {
                    f.awaiting.remove(client);
                }
                self.emit(
                    client,
                    ClientEvent::Left {
                        group: group.clone(),
                    },
                );
                self.advance(&group);
                Ok(())
            }
            ClientCommand::Multicast {
                service,
                groups,
                payload,
            } => {
                // Sent in the client's current view of every group, or not yet.
                let mut views = Vec::with_capacity(groups.len());
                for group in &groups {
                    let view = self.groups.get(group).and_then(|g| g.view.map(|v| (g, v)));
                    let Some((g, view)) = view else {
                        return Err(ClientCommand::Multicast {
                            service,
                            groups,
                            payload,
                        });
                    };
                    let in_view = self
                        .clients
                        .get(client)
                        .is_some_and(|c| c.views.get(group) == Some(&view));
                    let held_back = g
                        .flush
                        .as_ref()
                        .is_some_and(|f| f.marker_sent || f.acked.contains(client));
                    if !in_view || held_back {
                        return Err(ClientCommand::Multicast {
                            service,
                            groups,
                            payload,
                        });
                    }
                    views.push(view);
                }
                let sent: Vec<(String, GroupViewId)> = groups.into_iter().zip(views).collect();
                for (group, view) in &sent {
                    self.emit(
                        client,
                        ClientEvent::Sent {
                            group: group.clone(),
                            service,
                            payload: payload.clone(),
                            view: *view,
                        },
                    );
                }
                self.submit(Body::Client {
                    client: client.to_owned(),
                    groups: sent.into_iter().map(|(g, v)| (g, v.index)).collect(),
                    service,
                    payload,
                });
                Ok(())
            }
            ClientCommand::FlushAck { group, view } => {
                // Only an acknowledgement of the flush under way counts; one of a flush that a
                // configuration change cut short, or of an earlier view, is stale.
                let current = self.groups.get(&group).and_then(|g| g.view);
                let flush = self
                    .groups
                    .get_mut(&group)
                    .and_then(|g| g.flush.as_mut())
                    .filter(|f| current == Some(view) && f.awaiting.contains(client));
                if let Some(f) = flush {
                    f.awaiting.remove(client);
                    f.acked.insert(client.to_owned());
                    self.emit(
                        client,
                        ClientEvent::FlushAcked {
                            group: group.clone(),
                        },
                    );
                    self.advance(&group);
                }
                Ok(())
            }
        }
    }

    /// Submits a message after [`Membership::can_submit`] said it would be taken.
    fn submit(&mut self, body: Body) {
        let r = self.ring.submit(body);
        debug_assert!(r.is_ok(), "checked before");
    }
}

/// What a waiting command holds, roughly: its payload, and room for its names.
fn command_bytes(cmd: &ClientCommand) -> usize {
    64 + match cmd {
        ClientCommand::Multicast {
            payload, groups, ..
        } => payload.len() + groups.iter().map(String::len).sum::<usize>(),
        _ => 0,
    }
}

/// Whether applying `change` to a view of `members` changes it.
fn changes_anything(members: &[Member], change: &Change) -> bool {
    match change {
        Change::Join(m) => !members.iter().any(|x| x.name == m.name),
        Change::Leave(n, d) | Change::Gone(n, d) => {
            members.iter().any(|x| &x.name == n && x.daemon == *d)
        }
    }
}

/// An event for one of a daemon's clients. A delivery, the bulk of them, stays in the ring's
/// shared message: queueing it copies no name and no payload.
#[derive(Clone, Debug)]
pub enum LocalEvent {
    Event(String, ClientEvent),
    Message(Delivery),
}

impl LocalEvent {
    /// The event as the client receives it.
    pub fn into_event(self) -> (String, ClientEvent) {
        match self {
            LocalEvent::Event(c, ev) => (c, ev),
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
                (d.client.to_string(), ev)
            }
        }
    }
}

/// A client message delivered to one local client: the ring's message and which of its groups.
#[derive(Clone, Debug)]
pub struct Delivery {
    client: Arc<str>,
    /// Always a [`Body::Client`] with a group at `index` (checked in `Daemon::deliver`).
    body: Arc<Body>,
    index: usize,
    view: GroupViewId,
    transitional: bool,
}

static NO_PAYLOAD: Bytes = Bytes::new();

impl Delivery {
    pub fn client(&self) -> &str {
        &self.client
    }

    fn payload(&self) -> &Bytes {
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
