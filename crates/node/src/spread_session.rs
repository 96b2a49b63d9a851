//! Sessions of Spread 4.x clients (docs/spread.md): the handshake, Spread's requests turned into
//! the core's commands, and the core's events framed as Spread's messages
//! ([`conclave_wire::spread`] has the bytes).
//!
//! A Spread client is a client of the core like any other, named `name#daemon`, so views list
//! Spread and Conclave clients alike and messages of either reach both. What differs:
//! - it joins without virtual synchrony's flush (Spread's library has no flush acknowledgement):
//!   what it sends is delivered in the view its daemon sends it in;
//! - it receives one copy of a message addressed to several of its groups, with the destinations
//!   as the sender listed them, and none of its own if it sent with `SELF_DISCARD`;
//! - its views come with Spread's group id, member order and sets of members
//!   ([`conclave_gcs::LocalEvent::SpreadView`]).

use super::*;
use conclave_wire::client::Reason;
use conclave_wire::gcs::{Body, SpreadMeta};
use conclave_wire::spread::{self as sp, Connect, GroupId, Reject};
use std::collections::BTreeMap;
use std::sync::Weak;

/// Messages the daemon may have queued for the ring before it takes its Spread clients' requests
/// no further (and on below three quarters of it): Spread has no window, and without a bound its
/// clients filled the ring's queue to its limit (ten thousand messages), where each message costs
/// more.
const SPREAD_QUEUE: usize = 1024;

/// Bytes of a Spread client's input kept while a message of its waits; past them the driver reads
/// it no further. About what the driver reads ahead, and one largest request.
pub(crate) const MAX_PAUSED_INPUT: usize = 256 * 1024 + sp::HEADER_BYTES + sp::MAX_MESSAGE_BODY_LEN;

/// A Spread client's messages the core may hold (in one queue, in the client's order) before its
/// daemon takes its requests no further: the core sends them as the ring makes room, at the
/// token's visit, instead of waiting for the daemon to read on.
const SPREAD_HELD: usize = 64;

/// Longest a paused Spread client's reading waits for a step with no packet to send
/// ([`Node::resume_sessions`]).
const RESUME_WAIT: Duration = Duration::from_millis(1);

/// Where a Spread session is.
pub(crate) enum Stage {
    /// Waiting for the connect message.
    Connect,
    /// The authentication list is sent; waiting for the client's choice.
    Auth(Connect, String),
    Open,
}

pub(crate) struct SpreadSession {
    pub stage: Stage,
    /// The client asked for membership messages.
    pub membership: bool,
    /// `#name#daemon`.
    pub private_group: String,
    /// The id of the view of each group this client was last shown.
    pub ids: BTreeMap<String, GroupId>,
    /// The message delivered last: a message to several of the client's groups is delivered to
    /// it once. Weak: its payload is a view of the datagram it came in, which an idle session
    /// must not keep (the allocation stays, so no other message can take its address).
    pub last: Option<Weak<Body>>,
    /// Its requests are not read further until the core has room for its next message
    /// ([`Node::session_paused`]).
    pub paused: bool,
    /// Bytes of its input counted among the node's incomplete requests (none while paused).
    pub counted: usize,
}

impl SpreadSession {
    pub fn new() -> SpreadSession {
        SpreadSession {
            stage: Stage::Connect,
            membership: false,
            private_group: String::new(),
            ids: BTreeMap::new(),
            last: None,
            paused: false,
            counted: 0,
        }
    }
}

/// A view's id as Spread clients compare it (for equality alone): the ring's representative, a
/// mix of its sequence number and incarnation, and the view's number on the ring.
pub(crate) fn group_id(v: conclave_wire::client::GroupViewId) -> GroupId {
    GroupId {
        proc_id: v.ring.rep,
        time: (v.ring.seq as u32) ^ ((v.ring.seq >> 32) as u32) ^ v.ring.inc.rotate_left(16),
        index: v.index as u32,
    }
}

impl Node {
    /// A connection opened on the Spread port. Past the connection limit it gets Spread's
    /// `REJECT_QUOTA` and is closed.
    pub fn open_spread_session(&mut self, now: Time, id: SessionId) -> Result<(), NodeError> {
        self.input(now);
        if id == DAEMONS_MEMBER || self.sessions.contains_key(&id) {
            return Err(NodeError::SessionExists(id));
        }
        if self.sessions.len() >= self.cfg.sessions.max_connections {
            self.metrics.spread_refused.fetch_add(1, Relaxed);
            let out = SessionOutput::Bytes(vec![Reject::Quota.byte()].into(), 1);
            self.session_out.push_back((id, out));
            self.session_out.push_back((id, SessionOutput::Close));
            return Ok(());
        }
        let mut session = Session::new();
        session.spread = Some(Box::new(SpreadSession::new()));
        self.sessions.insert(id, session);
        self.metrics
            .connections
            .store(self.sessions.len() as u64, Relaxed);
        let deadline = self.now + Duration::from_millis(self.cfg.sessions.handshake_ms);
        self.set_deadline(id, Some(deadline));
        Ok(())
    }

    /// Bytes from a Spread client: the handshake's, then requests.
    pub(super) fn spread_bytes(&mut self, id: SessionId, bytes: &[u8]) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.spread.as_deref().is_some_and(|sp| sp.paused) {
            // Nothing is read past a message that waits (a later one, to another group, would
            // overtake it); the input waits with it, up to a bound, and then the driver reads
            // no further.
            let was_full = s.input.len() >= MAX_PAUSED_INPUT;
            s.input.extend_from_slice(bytes);
            if !was_full && s.input.len() >= MAX_PAUSED_INPUT {
                let at = self.now + Duration::from_millis(self.cfg.sessions.request_ms);
                self.set_deadline(id, Some(at));
            }
            return;
        }
        let mut held = std::mem::take(&mut s.input);
        let counted = s
            .spread
            .as_deref_mut()
            .map_or(0, |sp| std::mem::take(&mut sp.counted));
        self.incomplete_bytes -= counted;
        let had = !held.is_empty();
        let data: &[u8] = if held.is_empty() {
            bytes
        } else {
            held.extend_from_slice(bytes);
            &held
        };
        let mut used = 0;
        let mut pg: Option<String> = None;
        loop {
            let Some(stage) = self.spread(id).map(|sp| match &sp.stage {
                Stage::Connect => 0,
                Stage::Auth(..) => 1,
                Stage::Open => 2,
            }) else {
                return;
            };
            let rest = &data[used..];
            match stage {
                0 => match Connect::parse(rest) {
                    Err(r) => return self.spread_reject(id, r),
                    Ok(None) => break,
                    Ok(Some((c, n))) => {
                        used += n;
                        self.spread_connect(id, c);
                    }
                },
                1 => {
                    let Some(reply) = rest.first_chunk::<{ sp::AUTH_REPLY_BYTES }>() else {
                        break;
                    };
                    used += sp::AUTH_REPLY_BYTES;
                    if let Err(r) = sp::check_auth_reply(reply) {
                        return self.spread_reject(id, r);
                    }
                    let Some(Stage::Auth(c, q)) = self
                        .spread_mut(id)
                        .map(|sp| std::mem::replace(&mut sp.stage, Stage::Open))
                    else {
                        return;
                    };
                    self.spread_admit(id, c, q);
                }
                _ => {
                    if pg.is_none() {
                        pg = self.spread(id).map(|sp| sp.private_group.clone());
                    }
                    match sp::next_request(rest, pg.as_deref().unwrap_or_default()) {
                        Err(e) => {
                            self.metrics.spread_refused.fetch_add(1, Relaxed);
                            tracing::debug!(session = id, error = %e, "Spread session closed");
                            return self.close(id, None);
                        }
                        Ok(None) => break,
                        Ok(Some((
                            sp::Request::Multicast {
                                ref data,
                                ref groups,
                                ..
                            },
                            _,
                        ))) if !self.daemon.has_room(id, data.len() + 32 * groups.len()) => {
                            // Read no further until the core has room: Spread's daemons stop
                            // reading a client that sends faster than they order.
                            if let Some(s) = self.spread_mut(id) {
                                s.paused = true;
                            }
                            self.paused.insert(id);
                            break;
                        }
                        Ok(Some((req, n))) => {
                            used += n;
                            if let Some(s) = self.sessions.get_mut(&id) {
                                s.requests += 1;
                            }
                            let message = matches!(req, sp::Request::Multicast { .. });
                            self.spread_request(id, req);
                            self.client_events();
                            if message
                                && (self.daemon.held_count(id) >= SPREAD_HELD
                                    || self.daemon.membership().queued() >= SPREAD_QUEUE)
                            {
                                // The ring takes no more for now: what follows waits here, in
                                // the session's input, rather than in the core's queues (whose
                                // upkeep costs every packet), and its client waits on TCP.
                                if let Some(s) = self.spread_mut(id) {
                                    s.paused = true;
                                }
                                self.paused.insert(id);
                                break;
                            }
                        }
                    }
                }
            }
        }
        // Parsed from `held` (the earlier input and these bytes): what is left stays in it.
        let rest = if had {
            held.drain(..used);
            held
        } else {
            data[used..].to_vec()
        };
        let now = self.now;
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        let open = s.client.is_some();
        let paused = s.spread.as_ref().is_some_and(|s| s.paused);
        let left = rest.len();
        s.input = rest;
        if paused {
            // Waiting on the daemon, not on the client: the input is the session's own (bounded
            // by MAX_PAUSED_INPUT), not part of the budget for requests still arriving. A client
            // whose input stays full past `request_ms` is closed (see `spread_bytes`).
            let full = left >= MAX_PAUSED_INPUT;
            let at = now + Duration::from_millis(self.cfg.sessions.request_ms);
            self.set_deadline(id, full.then_some(at));
            return;
        }
        if let Some(sp) = s.spread.as_deref_mut() {
            sp.counted = left;
        }
        self.incomplete_bytes += left;
        if open {
            if left == 0 {
                self.set_deadline(id, None);
            } else if !had || used > 0 {
                let at = now + Duration::from_millis(self.cfg.sessions.request_ms);
                self.set_deadline(id, Some(at));
            }
        }
        self.metrics
            .incomplete_bytes
            .store(self.incomplete_bytes as u64, Relaxed);
        if left > 0 && self.incomplete_bytes > self.cfg.sessions.max_incomplete_bytes {
            self.metrics.closed_limits.fetch_add(1, Relaxed);
            self.close(id, None);
        }
    }

    /// Whether the driver should read no more of connection `id` for now: a Spread client that
    /// sends faster than the daemons order its messages is read no further (TCP's flow control
    /// then holds it back) until the core has room for them again.
    pub fn session_paused(&self, id: SessionId) -> bool {
        self.paused.contains(&id)
            && self
                .sessions
                .get(&id)
                .is_some_and(|s| s.input.len() >= MAX_PAUSED_INPUT)
    }

    /// Reads on in the paused sessions the core has room for again, in a step with no packet to
    /// send.
    ///
    /// A step that passes the token on hands its datagrams out only once it is done, and
    /// reading a client's waiting requests (hundreds of them) took up to a millisecond: read
    /// there, it held the token and so the whole ring, and Spread clients got 0.8 of the
    /// throughput of Conclave's, whose requests are read in steps of their own. So when there is
    /// a packet to send, the reading waits for a step of its own, at once ([`Node::poll_timeout`]);
    /// a step with packets that comes first (the driver picks among ready inputs) defers it
    /// again, but never past [`RESUME_WAIT`].
    pub(super) fn resume_sessions(&mut self) {
        if self.paused.is_empty() {
            self.resume_at = None;
            return;
        }
        let overdue = self.resume_at.is_some_and(|t| self.now >= t + RESUME_WAIT);
        if self.daemon.has_transmit() && !overdue {
            if self.resume_at.is_none() && self.paused.iter().any(|id| self.resumable(*id)) {
                self.resume_at = Some(self.now);
            }
            return;
        }
        self.resume_at = None;
        // What the core did meanwhile (a waiting message accepted) is told and recorded before
        // a request read now can end the session.
        self.client_events();
        let ready: Vec<SessionId> = self
            .paused
            .iter()
            .copied()
            .filter(|id| self.resumable(*id))
            .collect();
        for id in ready {
            self.paused.remove(&id);
            if let Some(s) = self.spread_mut(id) {
                s.paused = false;
                self.spread_bytes(id, &[]);
            }
        }
    }

    /// Whether the core has room for paused session `id`'s messages again (or it is gone).
    fn resumable(&self, id: SessionId) -> bool {
        (self.daemon.held_count(id) < SPREAD_HELD / 2
            && self.daemon.membership().queued() < SPREAD_QUEUE * 3 / 4)
            || !self.sessions.contains_key(&id)
    }

    fn spread(&self, id: SessionId) -> Option<&SpreadSession> {
        self.sessions.get(&id)?.spread.as_deref()
    }

    fn spread_mut(&mut self, id: SessionId) -> Option<&mut SpreadSession> {
        self.sessions.get_mut(&id)?.spread.as_deref_mut()
    }

    /// Refuses the handshake: one byte, then the connection closes.
    fn spread_reject(&mut self, id: SessionId, r: Reject) {
        self.metrics.spread_refused.fetch_add(1, Relaxed);
        tracing::debug!(session = id, reject = %r, "Spread connection refused");
        self.frame(id, |out| out.push(r.byte()));
        self.close(id, None);
    }

    fn spread_connect(&mut self, id: SessionId, c: Connect) {
        let name = if c.name.is_empty() {
            // As Spread names an anonymous client: `r<random>-<connection>`, 9 bytes at most,
            // again until it is free.
            let mut tries = 0;
            loop {
                let k = rand_core::RngCore::next_u32(&mut self.rng) % 9999;
                let mut n = format!("r{k}-{id}");
                n.truncate(sp::MAX_PRIVATE_NAME - 1);
                let q = qualified_name(&n, &self.name).unwrap_or_default();
                tries += 1;
                if !self.daemon.has_client(&q) || tries > 100 {
                    break n;
                }
            }
        } else {
            c.name.clone()
        };
        let Ok(q) = qualified_name(&name, &self.name) else {
            return self.spread_reject(id, Reject::IllegalName);
        };
        if self.daemon.has_client(&q) {
            return self.spread_reject(id, Reject::NotUnique);
        }
        // `NULL` authentication proves nothing: a name the daemons know a key for, or any name
        // where every client must prove one, is not for a Spread client.
        if self.client_keys.contains_key(&name) || self.cfg.sessions.require_client_keys {
            self.metrics.client_proofs_refused.fetch_add(1, Relaxed);
            return self.spread_reject(id, Reject::Auth);
        }
        let Some(s) = self.spread_mut(id) else {
            return;
        };
        s.membership = c.membership;
        s.private_group = format!("#{q}");
        if c.negotiates_auth() {
            s.stage = Stage::Auth(c, q);
            self.frame(id, |out| out.extend_from_slice(sp::AUTH_LIST));
        } else {
            s.stage = Stage::Open;
            self.spread_admit(id, c, q);
        }
    }

    fn spread_admit(&mut self, id: SessionId, c: Connect, q: String) {
        if let Err(e) = self.daemon.connect_spread(id, &q) {
            let r = match e {
                conclave_gcs::DaemonError::AlreadyConnected(_) => Reject::NotUnique,
                conclave_gcs::DaemonError::TooManyClients { .. } => Reject::Quota,
                _ => Reject::IllegalName,
            };
            return self.spread_reject(id, r);
        }
        let inc = self.next_client_inc();
        let pg = format!("#{q}");
        if let Some(s) = self.sessions.get_mut(&id) {
            s.client = Some((q, inc));
        }
        self.set_deadline(id, None);
        self.metrics.clients.fetch_add(1, Relaxed);
        self.frame(id, |out| out.extend_from_slice(&sp::accept_reply(&c, &pg)));
    }

    fn spread_request(&mut self, id: SessionId, req: sp::Request) {
        let now = self.now;
        let Some(s) = self.sessions.get(&id) else {
            return;
        };
        if s.client.is_none() {
            return;
        }
        // The name access rules speak of; a message has none to check in the common case, no
        // rules at all, and takes no copy of it.
        let private = |node: &Node| {
            let s = node.sessions.get(&id);
            private_name(s.and_then(|s| s.client.as_ref())).to_owned()
        };
        match req {
            sp::Request::Kill => {
                self.client_events();
                self.close(id, None)
            }
            sp::Request::Join(group) => {
                if let Err(d) = Access::new(&self.cfg.access).join(&private(self), &group) {
                    self.metrics.access_refusals.fetch_add(1, Relaxed);
                    tracing::debug!(session = id, refusal = %d, "Spread join refused");
                    return self.spread_refuse(id, sp::JOIN_MESS, &[&group], sp::PLAIN_HINT, &[]);
                }
                let cmd = ClientCommand::Join {
                    group: group.clone(),
                    vs: false,
                };
                match self.daemon.handle_client(now, id, cmd) {
                    // Spread ignores a join of a group the client is in.
                    Ok(()) | Err(conclave_gcs::DaemonError::AlreadyMember { .. }) => {}
                    Err(_) => self.spread_refuse(id, sp::JOIN_MESS, &[&group], sp::PLAIN_HINT, &[]),
                }
            }
            sp::Request::Leave(group) => {
                let cmd = ClientCommand::Leave {
                    group: group.clone(),
                };
                match self.daemon.handle_client(now, id, cmd) {
                    // And a leave of a group it is not in.
                    Ok(()) | Err(conclave_gcs::DaemonError::NotMember { .. }) => {}
                    Err(_) => {
                        self.spread_refuse(id, sp::LEAVE_MESS, &[&group], sp::PLAIN_HINT, &[])
                    }
                }
            }
            sp::Request::Multicast {
                service,
                self_discard,
                groups,
                hint,
                data,
            } => {
                // Each group once; a Spread receiver is shown the list as it was sent.
                let mut dest: Vec<String> = Vec::with_capacity(groups.len());
                for g in &groups {
                    if !dest.contains(g) {
                        dest.push(g.clone());
                    }
                }
                let listed_once = dest.len() == groups.len();
                let kind = service | if self_discard { sp::SELF_DISCARD } else { 0 };
                let cmd = ClientCommand::Multicast {
                    service: sp::service_type(service),
                    groups: dest,
                    payload: data.clone(),
                };
                if !self.cfg.access.is_empty() {
                    // Sending to a group from outside it takes what joining it takes: a rule's
                    // `send` list speaks of the group's members.
                    let access = Access::new(&self.cfg.access);
                    let private = private(self);
                    let outside = match &cmd {
                        ClientCommand::Multicast { groups, .. } => groups
                            .iter()
                            .filter(|g| !g.starts_with('#') && !self.daemon.is_member(id, g))
                            .try_for_each(|g| access.join(&private, g)),
                        _ => Ok(()),
                    };
                    if let Err(d) = outside.and_then(|()| access.command(&private, &cmd)) {
                        self.metrics.access_refusals.fetch_add(1, Relaxed);
                        tracing::debug!(session = id, refusal = %d, "Spread message refused");
                        let names: Vec<&str> = groups.iter().map(String::as_str).collect();
                        return self.spread_refuse(id, kind, &names, hint, &data);
                    }
                }
                let meta = SpreadMeta {
                    hint,
                    self_discard,
                    names: if listed_once {
                        Vec::new()
                    } else {
                        groups.clone()
                    },
                };
                match self
                    .daemon
                    .handle_client_with(now, id, cmd, Some(Box::new(meta)))
                {
                    Ok(()) => {
                        self.metrics.messages_accepted.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        tracing::debug!(session = id, error = %e, "Spread message refused");
                        let names: Vec<&str> = groups.iter().map(String::as_str).collect();
                        self.spread_refuse(id, kind, &names, hint, &data);
                    }
                }
            }
        }
    }

    /// Answers a request with Spread's `REJECT_MESS`.
    fn spread_refuse(
        &mut self,
        id: SessionId,
        kind: u32,
        groups: &[&str],
        hint: [u8; 4],
        data: &[u8],
    ) {
        self.metrics.spread_rejects.fetch_add(1, Relaxed);
        let Some(pg) = self.spread(id).map(|s| s.private_group.clone()) else {
            return;
        };
        self.frame(id, |out| {
            sp::write_reject(out, kind, &pg, groups, hint, data)
        });
    }

    /// A message delivered to a Spread client: once, however many of its groups it went to.
    pub(super) fn spread_deliver(&mut self, d: &Delivery) {
        let id = d.client();
        if let Some(r) = self.recorder.as_mut() {
            let (_, ev) = LocalEvent::Message(d.clone()).into_event();
            if let Some((client, inc)) = self.sessions.get(&id).and_then(|s| s.client.as_ref()) {
                if let Some(e) = r.client_event(client, &ev) {
                    r.push(self.now, client, *inc, e);
                }
            }
        }
        let body = d.body();
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        let Some(sp_s) = s.spread.as_deref_mut() else {
            return;
        };
        if sp_s
            .last
            .as_ref()
            .is_some_and(|l| std::ptr::eq(l.as_ptr(), Arc::as_ptr(body)))
        {
            return;
        }
        sp_s.last = Some(Arc::downgrade(body));
        let Body::Client {
            client,
            groups,
            service,
            payload,
            spread,
        } = &**body
        else {
            return;
        };
        let own = s.client.as_ref().is_some_and(|(n, _)| n == client);
        let self_discard = spread.as_ref().is_some_and(|m| m.self_discard);
        if own && self_discard {
            return;
        }
        self.metrics.messages_delivered.fetch_add(1, Relaxed);
        let kind = sp::service_bit(*service) | if self_discard { sp::SELF_DISCARD } else { 0 };
        let hint = spread.as_ref().map_or(sp::PLAIN_HINT, |m| m.hint);
        self.frame(id, |out| match spread.as_deref() {
            Some(m) if !m.names.is_empty() => {
                let names = m.names.iter().map(String::as_str);
                sp::write_delivery(out, kind, client, names, hint, payload)
            }
            _ => {
                let names = groups.iter().map(|(g, _)| g.as_str());
                sp::write_delivery(out, kind, client, names, hint, payload)
            }
        });
    }

    /// An event of the core for a Spread client.
    pub(super) fn spread_event(&mut self, id: SessionId, ev: ClientEvent, sets: &[Vec<String>]) {
        let Some(s) = self.spread(id) else {
            return;
        };
        let membership = s.membership;
        match ev {
            ClientEvent::View {
                group,
                view,
                members,
                transitional,
                reason,
            } => {
                self.metrics.group_views.fetch_add(1, Relaxed);
                let gid = group_id(view);
                if let Some(s) = self.spread_mut(id) {
                    s.ids.insert(group.clone(), gid);
                }
                if !membership {
                    return;
                }
                let own = self
                    .sessions
                    .get(&id)
                    .and_then(|s| s.client.as_ref())
                    .map(|(n, _)| n.clone())
                    .unwrap_or_default();
                let cause = match reason {
                    Reason::Join => sp::CAUSED_BY_JOIN,
                    Reason::Leave => sp::CAUSED_BY_LEAVE,
                    Reason::Disconnect => sp::CAUSED_BY_DISCONNECT,
                    Reason::Network => sp::CAUSED_BY_NETWORK,
                };
                if reason != Reason::Network && sets.iter().all(Vec::is_empty) && !sets.is_empty() {
                    // A view that changed nobody (a join past the group's size limit is
                    // ignored): Spread has no such message.
                    return;
                }
                let mut sets: Vec<Vec<String>> = match (reason, sets.is_empty()) {
                    (_, false) => sets.to_vec(),
                    (Reason::Network, true) => vec![transitional.to_vec()],
                    _ => vec![vec![own.clone()]],
                };
                let members = self.spread_order(members.to_vec());
                for set in &mut sets {
                    *set = self.spread_order(std::mem::take(set));
                }
                // Spread orders the sets by where their first member is.
                sets.sort_by_key(|set| members.iter().position(|m| set.first() == Some(m)));
                let local = match reason {
                    Reason::Network => sets.iter().position(|set| set.contains(&own)),
                    _ => Some(0),
                }
                .unwrap_or(0);
                let names: Vec<String> = members.iter().map(|m| format!("#{m}")).collect();
                let sets: Vec<Vec<String>> = sets
                    .iter()
                    .map(|set| set.iter().map(|m| format!("#{m}")).collect())
                    .collect();
                self.frame(id, |out| {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    let sets: Vec<Vec<&str>> = sets
                        .iter()
                        .map(|s| s.iter().map(String::as_str).collect())
                        .collect();
                    sp::write_membership(out, cause, &group, &names, gid, &sets, local)
                });
            }
            ClientEvent::TransitionalSignal { group } => {
                let gid = self.spread(id).and_then(|s| s.ids.get(&group).copied());
                if let (true, Some(gid)) = (membership, gid) {
                    self.frame(id, |out| sp::write_transitional(out, &group, gid));
                }
            }
            ClientEvent::Left { group } => {
                if let Some(s) = self.spread_mut(id) {
                    s.ids.remove(&group);
                }
                if membership {
                    self.frame(id, |out| sp::write_self_leave(out, &group));
                }
            }
            ClientEvent::Closed { .. } => {
                // The core has disconnected it already.
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.client = None;
                }
                self.metrics.clients.fetch_sub(1, Relaxed);
                self.close(id, None);
            }
            ClientEvent::Message { .. } => {
                // Framed from the ring's message (`spread_deliver`).
            }
            ClientEvent::Joined { .. }
            | ClientEvent::Sent { .. }
            | ClientEvent::FlushAcked { .. }
            | ClientEvent::FlushRequest { .. }
            | ClientEvent::ViewKey { .. } => {}
        }
    }

    /// Members in Spread's order: by their daemon's place in the configuration, then by private
    /// group name.
    fn spread_order(&self, mut members: Vec<String>) -> Vec<String> {
        let place = |m: &str| {
            m.rsplit_once('#')
                .and_then(|(_, d)| self.cfg.id_of(d))
                .unwrap_or(DaemonId::MAX)
        };
        members.sort_by(|a, b| place(a).cmp(&place(b)).then_with(|| a.cmp(b)));
        members
    }
}
