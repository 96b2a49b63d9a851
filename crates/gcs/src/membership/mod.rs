//! Daemon membership: the Totem membership algorithm (Amir et al., ACM TOCS 1995, §4), gather
//! and commit, as a pure state machine around the ring's [`Ordering`].
//!
//! A daemon that loses the token, or hears a daemon outside its ring (a join, or a merge detector
//! of another ring), *gathers*: it multicasts join messages with the daemons it hears of (`procs`)
//! and those it gave up on (`failed`), merging what others send, until every daemon of
//! `procs - failed` has sent it the same two sets (consensus); daemons that stay silent past the
//! consensus timeout are added to `failed`. The lowest daemon of the agreed set then sends the
//! commit token around the new ring: the first rotation collects each member's old ring, the
//! second installs the new ring everywhere, and the representative starts the regular token. The
//! transitional set of a member is the members whose old ring was its own, read from the commit
//! token. The representative of an operational ring announces it periodically (merge detection),
//! so that rings that come to hear each other merge.
//!
//! The commit token lists the new ring's members from the start (Totem's membership list), each
//! member fills in its entry, and a daemon takes part only in a ring whose members are exactly
//! the ones it agreed on; stale joins (that have not seen the newest ring) and stale commit tokens
//! are ignored. A daemon keeps nothing across a crash: it restarts as a new incarnation, which
//! ring ids carry so that a restarted daemon's rings never share an id with its earlier ones.
//!
//! Recovery (TOCS §4.3) and the installation of the new configuration (§4.4) follow the commit
//! token's second rotation. The new ring starts in recovery: each member retransmits on it,
//! marked with their origin, the messages of its old ring it holds above the lowest `aru` that
//! the members coming from that ring reported in the commit token, then a
//! [`Body::RecoveryDone`] marker. New messages wait. Once a member has delivered, in the new
//! ring's order, the marker of every member, it holds every message of its old ring that any
//! member coming with it holds; once the token shows that every member holds every marker (its
//! `aru` covered the last one on two successive visits), it delivers those by extended virtual
//! synchrony
//! ([`Ordering::finish`]): in the old regular configuration what may be delivered there, then the
//! transitional signal, the rest in the transitional configuration, then the new regular
//! configuration. A membership change during recovery sends the daemon back to gather with its
//! old ring's messages (and whatever recovery brought it) still held.
//!
//! The second condition matters: a member that loses the new ring after the others installed it
//! still holds everything they delivered of the old ring (it had every marker), goes back to
//! gather, and delivers those messages with its next configuration; had each member ended
//! recovery on its own markers alone, it could miss a safe message the others delivered in a
//! transitional configuration naming it.
//!
//! Departures from Totem: recovery ends on the markers rather than on the token's retransmission
//! flag, which is simpler to reason about with in-order delivery and costs one small message per
//! member. Every member retransmits every message it
//! holds above the low `aru`, not only those another member lacks: more traffic at a ring
//! change, no per-message bookkeeping. Messages accepted while the old ring was installed but
//! never sent on it (the ring broke first) are retransmitted too, as *unsequenced* messages of
//! the old ring, and delivered at the end of its transitional configuration by sender and
//! number: so every message is delivered in the configuration in which it was accepted, which is
//! what the group layer's views rest on. While gathering, nothing more of the old ring is
//! received or delivered.
//!
//! The parts, a file each: `gather`, `commit` (and the installation of a ring), `recovery`.

use crate::ordering::{
    body_bytes, Delivered, Dest, Ordering, OrderingConfig, OrderingError, PeerRefusal, Transmit,
};
use crate::time::Time;
use conclave_wire::gcs::{
    Body, Commit, CommitEntry, DaemonId, Join, Packet, RingId, MAX_RING_MEMBERS,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use timers::{Timer, TimerTable};

mod commit;
mod gather;
mod recovery;
mod timers;

/// Timeouts of the daemons' membership, as deployed by default (`[core.membership]` in the
/// daemon's configuration file).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MembershipConfig {
    pub ordering: OrderingConfig,
    /// No token for this long: the ring is broken.
    pub token_loss_ms: u64,
    /// Join messages are sent again this often while gathering.
    pub join_ms: u64,
    /// Daemons that have not agreed within this long are given up on.
    pub consensus_ms: u64,
    /// A commit token that does not come back within this long: gather again.
    pub commit_ms: u64,
    /// A representative announces its ring this often.
    pub merge_detect_ms: u64,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig {
            ordering: OrderingConfig::default(),
            token_loss_ms: 200,
            join_ms: 30,
            consensus_ms: 300,
            commit_ms: 200,
            merge_detect_ms: 100,
        }
    }
}

impl MembershipConfig {
    /// Why these settings cannot work, if they cannot.
    pub fn validate(&self) -> Result<(), String> {
        self.ordering.validate()?;
        if self.token_loss_ms <= self.ordering.token_retransmit_ms {
            return Err("token_loss_ms must be above token_retransmit_ms".into());
        }
        if [
            self.join_ms,
            self.consensus_ms,
            self.commit_ms,
            self.merge_detect_ms,
        ]
        .contains(&0)
        {
            return Err(
                "join_ms, consensus_ms, commit_ms and merge_detect_ms must be above 0".into(),
            );
        }
        Ok(())
    }
}

/// A configuration installed by this daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Configuration {
    pub ring: RingId,
    pub members: Vec<DaemonId>,
    /// Members that came from this daemon's previous ring.
    pub transitional: Vec<DaemonId>,
}

impl RingEvent {
    /// A message of `ring` delivered in its regular configuration.
    fn regular(ring: RingId, d: Delivered) -> RingEvent {
        RingEvent::Deliver {
            ring,
            seq: d.seq,
            sender: d.sender,
            body: d.body,
            transitional: false,
        }
    }
}

/// The phases of the membership protocol (TOCS §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Gather,
    Commit,
    Recovery,
    Operational,
}

/// What the ring layer tells the layer above, in the order it happens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RingEvent {
    /// A message this daemon submitted went out on `ring` (it is sent in that configuration);
    /// `seq` is 0 for one that `ring` never ordered (it broke first), which is delivered in its
    /// transitional configuration.
    Sent {
        ring: RingId,
        seq: u64,
        body: Arc<Body>,
    },
    /// A message of `ring`, in its regular configuration or (`transitional`) in the
    /// transitional configuration that follows it.
    Deliver {
        ring: RingId,
        seq: u64,
        sender: DaemonId,
        body: Arc<Body>,
        transitional: bool,
    },
    /// What follows until the next configuration is delivered in `ring`'s transitional
    /// configuration.
    TransitionalSignal { ring: RingId },
    /// A new regular configuration.
    Configuration(Configuration),
}

enum State {
    Gather {
        procs: BTreeSet<DaemonId>,
        failed: BTreeSet<DaemonId>,
        /// The last join each daemon sent: its procs and failed sets.
        heard: BTreeMap<DaemonId, (BTreeSet<DaemonId>, BTreeSet<DaemonId>)>,
        /// When each daemon's last join arrived.
        heard_at: BTreeMap<DaemonId, Time>,
        /// Consensus timeouts in this round so far.
        timeouts: u32,
    },
    Commit {
        ring: RingId,
        members: Vec<DaemonId>,
    },
    /// The new ring runs, carrying the old rings' messages (TOCS §4.3).
    Recovery {
        ordering: Box<Ordering>,
        /// Members that came from this daemon's old ring.
        transitional: Vec<DaemonId>,
        /// The highest sequence number of the old ring any of them delivered.
        max_delivered: u64,
        /// Members whose recovery marker was delivered.
        done: BTreeSet<DaemonId>,
        /// The sequence number of the last marker, once all are in.
        done_at: Option<u64>,
        /// New messages of members that installed the new ring before this one did.
        early: Vec<Delivered>,
    },
    Operational,
}

pub struct Membership {
    cfg: MembershipConfig,
    me: DaemonId,
    state: State,
    /// The regular configuration this daemon last installed: its ring, running while
    /// operational, frozen (its messages kept for recovery) from gather until the next one is
    /// installed.
    regular: Option<Box<Ordering>>,
    /// Messages submitted while no ring may send them (a ring forming), within the ordering's
    /// `max_queued` and `max_queued_bytes`.
    waiting: VecDeque<Body>,
    waiting_bytes: usize,
    max_ring_seq: u64,
    incarnation: u32,
    timers: TimerTable,
    out: VecDeque<Transmit>,
    events: VecDeque<RingEvent>,
}

/// Ring sequence numbers above this are refused: no ring gets there (one a microsecond would take
/// 146,000 years), and refusing them keeps `seq + 4` from overflowing on hostile input.
pub const MAX_RING_SEQ: u64 = 1 << 62;

fn ms(x: u64) -> Duration {
    Duration::from_millis(x)
}

impl Membership {
    /// A daemon starting (or restarting): it gathers with whoever it hears. `incarnation` must
    /// grow with every start of this daemon (a boot counter, or the boot time in seconds): it
    /// keeps no state across a crash, and its incarnation in the ids of the rings it creates
    /// keeps them apart from its earlier incarnations' rings.
    pub fn new(cfg: MembershipConfig, me: DaemonId, incarnation: u32, now: Time) -> Membership {
        let mut m = Membership {
            cfg,
            me,
            state: State::Operational,
            regular: None,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            max_ring_seq: 0,
            incarnation,
            timers: TimerTable::default(),
            out: VecDeque::new(),
            events: VecDeque::new(),
        };
        m.gather(now, BTreeSet::new());
        m
    }

    /// The ring of the regular configuration this daemon last installed.
    pub fn ring(&self) -> Option<RingId> {
        self.regular.as_ref().map(|o| o.ring())
    }
    pub fn is_operational(&self) -> bool {
        matches!(self.state, State::Operational)
    }

    /// Where the daemon is in the membership protocol.
    pub fn phase(&self) -> Phase {
        match self.state {
            State::Gather { .. } => Phase::Gather,
            State::Commit { .. } => Phase::Commit,
            State::Recovery { .. } => Phase::Recovery,
            State::Operational => Phase::Operational,
        }
    }

    /// The members of the ring this daemon is operational in (empty while it gathers, commits or
    /// recovers).
    /// The current ring's progress, for status reports: (highest sequence number seen, all
    /// received up to, delivered up to, messages waiting to be sent).
    pub fn progress(&self) -> Option<(u64, u64, u64, usize)> {
        self.regular
            .as_ref()
            .map(|o| (o.high_seq(), o.my_aru(), o.delivered_up_to(), o.queued()))
    }

    pub fn ring_members(&self) -> Vec<DaemonId> {
        match (&self.state, &self.regular) {
            (State::Operational, Some(o)) => o.members().to_vec(),
            _ => Vec::new(),
        }
    }

    /// Messages this daemon has queued to send and not yet sent.
    pub fn queued(&self) -> usize {
        match (&self.state, &self.regular) {
            (State::Operational, Some(o)) => o.queued(),
            _ => self.waiting.len(),
        }
    }

    /// Whether [`Membership::submit`] would take a message now.
    pub fn can_submit(&self) -> bool {
        match (&self.state, &self.regular) {
            (State::Operational, Some(o)) => o.can_submit(),
            _ => {
                self.waiting.len() < self.cfg.ordering.max_queued
                    && self.waiting_bytes < self.cfg.ordering.max_queued_bytes
            }
        }
    }

    /// Queues a message to be sent to every daemon of the configuration in which it goes out
    /// (reported by [`RingEvent::Sent`]).
    pub fn submit(&mut self, body: Body) -> Result<(), OrderingError> {
        match (&self.state, &mut self.regular) {
            (State::Operational, Some(o)) => {
                let r = o.submit(body);
                // A wake for the token goes now, not with the next packet.
                self.out.extend(std::iter::from_fn(|| o.poll_transmit()));
                r
            }
            _ if self.waiting.len() >= self.cfg.ordering.max_queued => {
                Err(OrderingError::QueueFull {
                    max: self.cfg.ordering.max_queued,
                })
            }
            _ => {
                // As `can_submit` says (see `Ordering::submit`).
                let max_bytes = self.cfg.ordering.max_queued_bytes;
                if self.waiting_bytes >= max_bytes {
                    return Err(OrderingError::QueueBytesFull { max_bytes });
                }
                self.waiting_bytes += body_bytes(&body);
                self.waiting.push_back(body);
                Ok(())
            }
        }
    }

    /// Queues a message of the daemons' own protocol, never refused (see
    /// [`Ordering::submit_control`]).
    pub fn submit_control(&mut self, body: Body) {
        match (&self.state, &mut self.regular) {
            (State::Operational, Some(o)) => {
                o.submit_control(body);
                self.out.extend(std::iter::from_fn(|| o.poll_transmit()));
            }
            _ => {
                self.waiting_bytes += body_bytes(&body);
                self.waiting.push_back(body);
            }
        }
    }

    /// The members of the ring this daemon runs (the new one while recovering).
    fn members_of_ring(&self) -> Vec<DaemonId> {
        self.running_ordering()
            .map_or_else(Vec::new, |o| o.members().to_vec())
    }

    /// The ring this daemon runs, if any.
    fn running_ring(&self) -> Option<RingId> {
        self.running_ordering().map(|o| o.ring())
    }

    /// A packet from daemon `from`. One no correct daemon sends is refused with its reason
    /// (and changes nothing, or nothing but what it already changed before it was found out).
    pub fn handle_packet(
        &mut self,
        now: Time,
        from: DaemonId,
        packet: Packet,
    ) -> Result<(), PeerRefusal> {
        let seq = match &packet {
            Packet::Join(j) => j.ring_seq,
            Packet::Commit(c) => c.ring.seq,
            Packet::MergeDetect { ring } | Packet::Wake { ring } => ring.seq,
            Packet::Token(t) => t.ring.seq,
            Packet::Data(d) => d.ring.seq,
        };
        if seq > MAX_RING_SEQ {
            return Err(PeerRefusal::RingSeqOutOfRange);
        }
        match packet {
            Packet::Join(j) => self.on_join(now, from, j),
            Packet::Commit(c) => self.handle_commit(now, c)?,
            Packet::MergeDetect { ring } => {
                self.max_ring_seq = self.max_ring_seq.max(ring.seq);
                if let State::Operational = self.state {
                    if Some(ring) != self.running_ring() && ring.rep != self.me {
                        // Another ring can hear us: merge.
                        self.gather(now, [ring.rep].into_iter().collect());
                    }
                }
            }
            p @ (Packet::Token(_) | Packet::Data(_) | Packet::Wake { .. }) => {
                let (loss, me) = (now + ms(self.cfg.token_loss_ms), self.me);
                let Some(ordering) = self.running_ordering_mut() else {
                    return Ok(());
                };
                let token_of_ring = matches!(&p, Packet::Token(t) if t.ring == ordering.ring());
                // Only a member of the ring may ask for its token: anyone else would keep it
                // from ever resting.
                if matches!(p, Packet::Wake { .. })
                    && (from == me || !ordering.members().contains(&from))
                {
                    return Ok(());
                }
                ordering.handle_packet(now, p);
                if token_of_ring {
                    self.timers.set(Timer::TokenLoss, loss);
                }
                self.drain_ordering(now);
            }
        }
        self.take_refusal()
    }

    /// The first refusal the orderings found in the packet just handled.
    fn take_refusal(&mut self) -> Result<(), PeerRefusal> {
        let mut all = Vec::new();
        if let Some(o) = self.regular.as_mut() {
            all.extend(o.take_refusals());
        }
        if let State::Recovery { ordering, .. } = &mut self.state {
            all.extend(ordering.take_refusals());
        }
        all.into_iter().next().map_or(Ok(()), Err)
    }

    pub fn handle_timeout(&mut self, now: Time) {
        if self.timers.expired(Timer::TokenLoss, now) || self.timers.expired(Timer::Commit, now) {
            self.gather(now, BTreeSet::new());
            return;
        }
        if self.timers.expired(Timer::Consensus, now) {
            self.give_up_on_silent(now);
        } else if self.timers.expired(Timer::Join, now) {
            self.send_join(now);
        }
        let Some(ordering) = self.running_ordering_mut() else {
            return;
        };
        ordering.handle_timeout(now);
        let (ring, rep) = (ordering.ring(), ordering.members().first().copied());
        if self.timers.expired(Timer::MergeDetect, now) {
            self.timers
                .set(Timer::MergeDetect, now + ms(self.cfg.merge_detect_ms));
            if rep == Some(self.me) {
                self.out.push_back(Transmit {
                    to: Dest::AllOthers,
                    packet: Packet::MergeDetect { ring },
                });
            }
        }
        self.drain_ordering(now);
    }

    /// Whether this daemon rests its ring's idle token.
    pub fn holds_idle_token(&self) -> bool {
        self.running_ordering()
            .is_some_and(Ordering::holds_idle_token)
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        let ring = self.running_ordering().and_then(|o| o.poll_timeout());
        match (self.timers.next(), ring) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The ring this daemon runs: the new one while recovering, the regular one while
    /// operational; none while it gathers or commits (the regular ring is frozen then).
    fn running_ordering(&self) -> Option<&Ordering> {
        match (&self.state, &self.regular) {
            (State::Recovery { ordering, .. }, _) => Some(ordering),
            (State::Operational, Some(o)) => Some(o),
            _ => None,
        }
    }

    fn running_ordering_mut(&mut self) -> Option<&mut Ordering> {
        match (&mut self.state, &mut self.regular) {
            (State::Recovery { ordering, .. }, _) => Some(ordering),
            (State::Operational, Some(o)) => Some(o),
            _ => None,
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    /// Whether a packet waits to be sent.
    pub fn has_transmit(&self) -> bool {
        !self.out.is_empty()
    }

    /// The packet [`Membership::poll_transmit`] gives next.
    pub fn peek_transmit(&self) -> Option<&Transmit> {
        self.out.front()
    }

    /// What happened, in order: messages sent and delivered, transitional signals,
    /// configurations.
    pub fn poll_event(&mut self) -> Option<RingEvent> {
        self.events.pop_front()
    }
}
