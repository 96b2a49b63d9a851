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
//!
//! The parts, a file each: clients' commands accepted or held (`clients`), the flush of each
//! change (`flush`), the state exchange after a configuration change (`exchange`), views
//! installed at the local clients (`views`), and deliveries (`delivery`).

use crate::membership::{Membership, MembershipConfig, RingEvent};
use crate::ordering::{PeerRefusal, Transmit};
use crate::time::Time;
use conclave_wire::client::Bytes;
pub use conclave_wire::client::{ClientCommand, ClientEvent, GroupViewId, Reason};
use conclave_wire::client::{MessageRef, Refusal, MAX_VIEW_MEMBERS};
use conclave_wire::gcs::{
    Body, DaemonId, Packet, RingId, ServiceType, SpreadMeta, StateEntries, MAX_NAME_BYTES,
    MAX_STATE_ENTRIES,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

mod clients;
mod delivery;
mod exchange;
mod flush;
mod views;

use clients::command_bytes;
pub use delivery::{Delivery, LocalEvent};

/// How the core knows a connected client: an id its driver picks at [`Daemon::connect`] (the
/// node uses the connection's), so that a command and an event reach their client without a
/// lookup by name. Names are what the daemons tell each other and what views list.
pub type ClientId = u64;

/// Most group changes kept while the daemons exchange their group states after a configuration
/// change. Correct daemons come nowhere near it: the exchange lasts a rotation or two of the
/// token, and each client has at most `max_changes_per_client` joins and leaves on their way,
/// with `max_clients × max_groups_per_client` held to [`MAX_STATE_ENTRIES`] per daemon. Past it,
/// a flood from a faulty daemon is dropped (the same changes at every daemon, see
/// `Daemon::wait_for_sync`) instead of growing without bound.
pub const MAX_SYNC_BACKLOG: usize = 4 * MAX_STATE_ENTRIES;

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
    /// The daemons' names by id, when client names end in `#` and their daemon's name (as the
    /// node names them): a daemon then speaks only for clients of its own, and a join, leave,
    /// departure or state entry naming another daemon's client is dropped and counted
    /// ([`Daemon::foreign_names`]). Empty: names are not checked. Set by whoever runs the daemon.
    #[serde(skip)]
    pub daemon_names: BTreeMap<DaemonId, String>,
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
            daemon_names: BTreeMap::new(),
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
    #[error("no client {0} is connected")]
    UnknownClient(ClientId),
    #[error("client {0:?} is already connected")]
    AlreadyConnected(String),
    #[error("client id {0} is in use")]
    ClientIdInUse(ClientId),
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
            DaemonError::UnknownClient(_) | DaemonError::ClientIdInUse(_) => Refusal::BadRequest,
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
    deadline: Time,
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
    id: ClientId,
    /// Groups joined, as accepted (with the VS flag).
    groups: BTreeMap<String, bool>,
    /// Groups as they will be once every waiting command is accepted.
    intent: BTreeMap<String, bool>,
    /// The view of each group this client has installed (since it last joined it).
    views: BTreeMap<String, GroupViewId>,
    /// Commands not yet accepted, in order, one queue per group: a view change of one group
    /// holds back nothing of another (and a flush acknowledgement never waits behind a message
    /// to a group that is changing view).
    held: BTreeMap<String, VecDeque<Held>>,
    held_count: usize,
    /// Bytes of them ([`command_bytes`]).
    held_bytes: usize,
    /// Flush acknowledgements among them: the only commands that can go while the ring
    /// takes no more messages.
    held_acks: usize,
    /// Joins and leaves sent on the ring and not yet applied (or dropped) by the groups.
    changes: usize,
    /// A Spread client: its views come with their sets of members ([`LocalEvent::SpreadView`]).
    spread: bool,
}

/// The view number a message carries for a group its sender is not in, or a private group
/// (Spread's open groups, [`Daemon::connect_spread`]): it is delivered in the view the group has
/// where the ring orders it.
pub const OPEN_VIEW: u64 = u64::MAX;

/// A client's command waiting to be accepted, with what a Spread client's message carries beyond
/// it.
type Held = (ClientCommand, Option<Box<SpreadMeta>>);

/// Most held messages of one client that may keep their payloads as views of the buffers their
/// daemon read them into: the client library's default window, so that its senders' messages
/// held at full load are not copied.
const HELD_VIEWS: usize = 256;

/// One daemon: the ring ([`Membership`]) and the client groups on it.
pub struct Daemon {
    cfg: DaemonConfig,
    me: DaemonId,
    ring: Membership,
    /// The current configuration: its ring and the daemons that came with this one from the
    /// previous.
    config: Option<(RingId, Vec<DaemonId>, Vec<DaemonId>)>,
    /// After a configuration change, the group states received so far; `None` once all are in.
    /// Each as delivered: shared with the ring's buffer, not copied.
    syncing: Option<BTreeMap<DaemonId, Arc<Body>>>,
    /// Changes delivered during the state exchange, applied to the new group map (a group name,
    /// or none for a client gone from every group).
    sync_backlog: Option<Vec<(Option<String>, Change)>>,
    /// Changes dropped past [`MAX_SYNC_BACKLOG`], since this daemon started.
    sync_dropped: u64,
    /// Names of other daemons' clients a daemon spoke for, dropped, since this daemon started.
    foreign_names: u64,
    groups: BTreeMap<String, Group>,
    /// A group is forgotten once it has no members and nothing queued; one created again on
    /// the same ring numbers its views from here, past every view a forgotten group had, so a
    /// view id is never used twice.
    first_count: u64,
    clients: BTreeMap<String, Client>,
    /// The name of each connected client, by the id its connection gave it.
    names: crate::IdMap<ClientId, Arc<str>>,
    events: VecDeque<LocalEvent>,
    ring_log: VecDeque<RingEvent>,
    /// The time of the input being handled.
    now: Time,
    /// Deadlines of flushes waiting for local acknowledgements, earliest first, some of them
    /// stale (the flush ended or was acknowledged): [`Daemon::poll_timeout`] drops those as it
    /// meets them, instead of scanning every group at every call (with thousands of groups that
    /// scan was a tenth of the daemon's time).
    flush_deadlines:
        std::cell::RefCell<std::collections::BinaryHeap<std::cmp::Reverse<(Time, String)>>>,
}

fn check_name(s: &str) -> Result<(), DaemonError> {
    if s.is_empty() || s.len() > MAX_NAME_BYTES {
        return Err(DaemonError::BadName);
    }
    Ok(())
}

impl Daemon {
    /// A daemon starting (or restarting as `incarnation`, see [`Membership::new`]).
    pub fn new(mut cfg: DaemonConfig, me: DaemonId, incarnation: u32, now: Time) -> Daemon {
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
            sync_dropped: 0,
            foreign_names: 0,
            groups: BTreeMap::new(),
            flush_deadlines: Default::default(),
            first_count: 0,
            clients: BTreeMap::new(),
            names: crate::IdMap::default(),
            events: VecDeque::new(),
            ring_log: VecDeque::new(),
            now,
        }
    }

    /// Client names another daemon spoke for that are not its clients' (dropped; see
    /// [`DaemonConfig::daemon_names`]), since this daemon started.
    pub fn foreign_names(&self) -> u64 {
        self.foreign_names
    }

    /// Whether daemon `sender` may speak for `client`: a client's name ends in `#` and its
    /// daemon's name (when the names are known). A daemon that does otherwise is faulty or
    /// hostile: it could put another daemon's client into a group, or take it out.
    pub(super) fn speaks_for(&mut self, sender: DaemonId, client: &str) -> bool {
        if self.cfg.daemon_names.is_empty() {
            return true;
        }
        let own = self.cfg.daemon_names.get(&sender).is_some_and(|d| {
            client
                .strip_suffix(d.as_str())
                .is_some_and(|p| p.ends_with('#'))
        });
        if !own {
            self.foreign_names += 1;
        }
        own
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

    /// Whether client `id` may have a message of `bytes` more wait for a view change without
    /// being refused for holding too much ([`DaemonError::TooManyHeld`],
    /// [`DaemonError::TooManyHeldBytes`]): a Spread client is read no further until it may (its
    /// protocol has no refusal for load: Spread's daemons stop reading such a client).
    pub fn has_room(&self, id: ClientId, bytes: usize) -> bool {
        let Some(c) = self.names.get(&id).and_then(|n| self.clients.get(&**n)) else {
            return true;
        };
        c.held_count < self.cfg.max_held_per_client
            && (c.held_count == 0
                || c.held_bytes + 64 + bytes <= self.cfg.max_held_bytes_per_client)
    }

    /// Whether client `id` is in `group`, or has asked to join it.
    pub fn is_member(&self, id: ClientId, group: &str) -> bool {
        self.names
            .get(&id)
            .and_then(|n| self.clients.get(&**n))
            .is_some_and(|c| c.intent.contains_key(group) || c.groups.contains_key(group))
    }

    /// How many of client `id`'s commands wait for a view change or room on the ring.
    pub fn held_count(&self, id: ClientId) -> usize {
        self.names
            .get(&id)
            .and_then(|n| self.clients.get(&**n))
            .map_or(0, |c| c.held_count)
    }

    /// Whether a client of this name is connected here.
    pub fn has_client(&self, name: &str) -> bool {
        self.clients.contains_key(name)
    }

    /// Clients connected.
    pub fn client_count(&self) -> usize {
        self.clients.len()
    }

    /// Group changes dropped past [`MAX_SYNC_BACKLOG`] since this daemon started.
    pub fn sync_changes_dropped(&self) -> u64 {
        self.sync_dropped
    }

    /// Whether client commands are being accepted: the ring is operational and the group
    /// states of the current configuration are all in.
    pub fn ready(&self) -> bool {
        self.ring.is_operational() && self.syncing.is_none() && self.config.is_some()
    }

    /// A client connects as `client`, known from now on by `id` (which the caller picks, and
    /// may reuse once the client has disconnected).
    pub fn connect(&mut self, id: ClientId, client: &str) -> Result<(), DaemonError> {
        check_name(client)?;
        if self.clients.contains_key(client) {
            return Err(DaemonError::AlreadyConnected(client.to_owned()));
        }
        if self.names.contains_key(&id) {
            return Err(DaemonError::ClientIdInUse(id));
        }
        if self.clients.len() >= self.cfg.max_clients {
            return Err(DaemonError::TooManyClients {
                max: self.cfg.max_clients,
            });
        }
        self.clients.insert(
            client.to_owned(),
            Client {
                id,
                groups: BTreeMap::new(),
                intent: BTreeMap::new(),
                views: BTreeMap::new(),
                held: BTreeMap::new(),
                held_count: 0,
                held_bytes: 0,
                held_acks: 0,
                changes: 0,
                spread: false,
            },
        );
        self.names.insert(id, Arc::from(client));
        Ok(())
    }

    /// [`Daemon::connect`] for a client of Spread's protocol: its views come with the sets of
    /// members that came into them together ([`LocalEvent::SpreadView`]).
    pub fn connect_spread(&mut self, id: ClientId, client: &str) -> Result<(), DaemonError> {
        self.connect(id, client)?;
        if let Some(c) = self.clients.get_mut(client) {
            c.spread = true;
        }
        Ok(())
    }

    /// The client's connection ended: it leaves every group; what it had not had accepted is
    /// dropped.
    pub fn disconnect(&mut self, now: Time, id: ClientId) -> Result<(), DaemonError> {
        self.now = now;
        let name = self
            .names
            .remove(&id)
            .ok_or(DaemonError::UnknownClient(id))?;
        let client = &*name;
        let c = self
            .clients
            .remove(client)
            .ok_or(DaemonError::UnknownClient(id))?;
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
        now: Time,
        id: ClientId,
        cmd: ClientCommand,
    ) -> Result<(), DaemonError> {
        self.handle_client_with(now, id, cmd, None)
    }

    /// [`Daemon::handle_client`], for a Spread client's message with what it carries beyond a
    /// Conclave client's (`spread`, ignored on other commands).
    pub fn handle_client_with(
        &mut self,
        now: Time,
        id: ClientId,
        cmd: ClientCommand,
        spread: Option<Box<SpreadMeta>>,
    ) -> Result<(), DaemonError> {
        cmd.validate()
            .map_err(|(code, reason)| DaemonError::Malformed { code, reason })?;
        let name = self
            .names
            .get(&id)
            .cloned()
            .ok_or(DaemonError::UnknownClient(id))?;
        let client = &*name;
        let max_held = self.cfg.max_held_per_client;
        let max_groups = self.cfg.max_groups_per_client;
        let c = self
            .clients
            .get_mut(client)
            .ok_or(DaemonError::UnknownClient(id))?;
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
            // A Spread client may send to groups it is not in, and to private groups.
            ClientCommand::Multicast { .. } if c.spread => {}
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
            match self.try_accept(client, (cmd, spread)) {
                Ok(()) => {
                    self.after(now);
                    return Ok(());
                }
                Err(held) => held,
            }
        } else {
            (cmd, spread)
        };
        let ring_takes = self.ready() && self.ring.can_submit();
        let Some(c) = self.clients.get_mut(client) else {
            return Err(DaemonError::UnknownClient(id));
        };
        let group = match &cmd.0 {
            // A Spread client's commands wait in one queue: Spread keeps a sender's order
            // across groups (and its clients acknowledge no flushes).
            _ if c.spread => String::new(),
            ClientCommand::Join { group, .. }
            | ClientCommand::Leave { group }
            | ClientCommand::FlushAck { group, .. } => group.clone(),
            // A message to several groups waits in the queue of the first.
            ClientCommand::Multicast { groups, .. } => groups[0].clone(),
        };
        if matches!(cmd.0, ClientCommand::FlushAck { .. }) {
            c.held_acks += 1;
        }
        c.held_bytes += command_bytes(&cmd.0);
        let mut cmd = cmd;
        match &mut cmd.0 {
            // The payload may be a view of the buffer the daemon read it into (up to 64 KiB),
            // with other requests that go on without it. A message that waits for its group
            // while the ring takes messages keeps a copy of its own, and so does every message
            // past a client's first HELD_VIEWS: what a client has held stays within its byte
            // budget plus HELD_VIEWS buffers. Below that, one held because the ring takes no more
            // (a full ring, a configuration change) waits with the rest of its read: no copy,
            // which at full load would be one per message.
            ClientCommand::Multicast { payload, .. }
                if ring_takes || c.held_count >= HELD_VIEWS =>
            {
                *payload = Bytes::copy_from_slice(payload);
            }
            _ => {}
        }
        c.held.entry(group).or_default().push_back(cmd);
        c.held_count += 1;
        self.after(now);
        Ok(())
    }

    /// A packet from daemon `from`. Input no correct daemon sends is refused with its reason
    /// ([`PeerRefusal`]); undecodable input changes nothing.
    pub fn handle_packet(
        &mut self,
        now: Time,
        from: DaemonId,
        bytes: &Bytes,
    ) -> Result<(), PeerRefusal> {
        // Client payloads stay views of the datagram: no copy, no allocation per message.
        let p = Packet::decode_shared(bytes)?;
        let r = self.ring.handle_packet(now, from, p);
        // What the packet changed before it was found out is followed through.
        self.after(now);
        r
    }

    pub fn handle_timeout(&mut self, now: Time) {
        self.now = now;
        self.ring.handle_timeout(now);
        // VS clients that let a flush wait too long are closed. Every flush that awaits a
        // client has its deadline in the heap: the groups whose deadline passed are found there,
        // not by a scan of every group at every timer (thousands of groups, most of them
        // settled).
        let mut late: Vec<String> = Vec::new();
        let deadlines = self.flush_deadlines.get_mut();
        while let Some(std::cmp::Reverse((t, _))) = deadlines.peek() {
            if *t > now {
                break;
            }
            let Some(std::cmp::Reverse((t, group))) = deadlines.pop() else {
                break;
            };
            if let Some(f) = self.groups.get(&group).and_then(|g| g.flush.as_ref()) {
                if f.deadline == t {
                    late.extend(f.awaiting.iter().cloned());
                }
            }
        }
        for c in late {
            let Some(id) = self.clients.get(&c).map(|c| c.id) else {
                continue;
            };
            // The core closes the client itself (once, though it may be late in several groups);
            // its `Closed` event is the last it gets.
            self.emit(
                &c,
                ClientEvent::Closed {
                    reason: "no flush acknowledgement in time".into(),
                },
            );
            let _ = self.disconnect(now, id);
        }
        self.after(now);
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        let mut deadlines = self.flush_deadlines.borrow_mut();
        let flush = loop {
            let Some(std::cmp::Reverse((t, group))) = deadlines.peek() else {
                break None;
            };
            let live = self
                .groups
                .get(group)
                .and_then(|g| g.flush.as_ref())
                .is_some_and(|f| f.deadline == *t && !f.awaiting.is_empty());
            if live {
                break Some(*t);
            }
            deadlines.pop();
        };
        match (self.ring.poll_timeout(), flush) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.ring.poll_transmit()
    }

    /// Whether a packet waits to be sent ([`Daemon::poll_transmit`]).
    pub fn has_transmit(&self) -> bool {
        self.ring.has_transmit()
    }

    /// The packet [`Daemon::poll_transmit`] gives next.
    pub fn peek_transmit(&self) -> Option<&Transmit> {
        self.ring.peek_transmit()
    }

    /// The ring layer's events, if [`DaemonConfig::record_ring`] is set.
    pub fn poll_ring_event(&mut self) -> Option<RingEvent> {
        self.ring_log.pop_front()
    }

    /// Whether [`Daemon::poll_event`] has an event.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event for one of this daemon's clients, in the order the core made them (which
    /// is each client's order). A delivery stays in the ring's shared message, for a caller that
    /// only reads it (the node frames it for its client from there);
    /// [`LocalEvent::into_event`] gives the event as the client receives it.
    pub fn poll_event(&mut self) -> Option<LocalEvent> {
        self.events.pop_front()
    }

    /// The daemon-level events of the ring (configurations, deliveries) are consumed here; this
    /// runs after every input.
    fn after(&mut self, now: Time) {
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
        if let Some(c) = self.clients.get(client) {
            self.events.push_back(LocalEvent::Event(c.id, ev));
        }
    }

    /// Submits a message after [`Membership::can_submit`] said it would be taken.
    fn submit(&mut self, body: Body) {
        let r = self.ring.submit(body);
        debug_assert!(r.is_ok(), "checked before");
    }
}
