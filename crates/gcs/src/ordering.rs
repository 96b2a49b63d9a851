//! Totem single-ring ordering on one ring (Amir et al., ACM TOCS 1995, §3): the operational
//! state, as a pure state machine.
//!
//! The holder of the token stamps its new messages with consecutive sequence numbers, multicasts
//! them, answers the token's retransmission requests from its buffer, adds its own gaps to them,
//! updates the token's `aru` by the TOCS rule, and passes the token to its successor. Messages
//! are delivered in sequence order; a safe message waits until the `aru` seen on two successive
//! token visits covers it (every member then holds it, §3.2). Messages every member holds are
//! dropped from the buffer.
//!
//! Flow control is §3.3's: a per-visit limit, a window on the messages not yet everywhere and on
//! those sent in the last rotation (the token's `fcc`), and each member's share of the window in
//! proportion to its backlog (the token's `backlog`). A ring in recovery sends its recovery
//! messages first and holds new ones back ([`Ordering::recovering`]); when a ring ends,
//! [`Ordering::finish`] delivers what is left by extended virtual synchrony. Membership (§4) is
//! [`crate::membership`]'s.
//!
//! The Accelerated Ring (Babay and Amir, *Fast Total Ordering for Modern Data Centers*, ICDCS
//! 2016, §III): a holder assigns its new messages their sequence numbers, passes the token, and
//! only then sends them; a member asks for retransmission only of messages sent before its
//! previous visit (later ones may still be on their way). Departure from the paper: rather than
//! a part of its new messages before the token and the rest after, the holder sends all of them
//! after it, unless they are few and small (`light_visit`), when all go before it.
//!
//! Departures, for now: a lost token is retransmitted by the last holder (§3.1's token
//! retransmit timeout) and otherwise left to the membership's token-loss timeout; messages are not
//! batched into packets. An idle token rests at each member for `idle_hold_us`, and a member
//! with a message to send while it rests elsewhere multicasts a [`Packet::Wake`]: the member
//! resting it passes it on, and the others do not rest it until it has gone by (Totem has
//! neither; they trade an idle ring's processor time against a message's wait for the token).
//! A member holding a safe message it may not deliver yet claims one message of the token's
//! `backlog` until it does, so that the token rests only once every member has delivered
//! everything it holds.

use crate::seq_buffer::SeqBuffer;
use crate::time::Time;
use conclave_wire::gcs::{Body, DaemonId, Data, Packet, RingId, ServiceType, Token, MAX_RTR};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// Tunables of the ring's ordering, as deployed by default (the daemon's configuration file
/// sets them as `[core.membership.ordering]`; docs/daemon.md).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrderingConfig {
    /// The last token holder sends the token again if it hears nothing for this long.
    pub token_retransmit_ms: u64,
    /// Most messages (new and retransmitted) one token visit may send.
    pub max_per_visit: u32,
    /// Most messages between the token's `aru` and `seq` (sent but not yet everywhere).
    pub window: u64,
    /// Most messages a daemon queues before `submit` refuses.
    pub max_queued: usize,
    /// Most bytes of messages a daemon queues before `submit` refuses (one message always fits
    /// an empty queue): 10,000 messages of 128 KiB would be 1.3 GB.
    pub max_queued_bytes: usize,
    /// Most bytes of messages (new and retransmitted) one token visit may send, roughly (at
    /// least one message goes): large messages in a burst of `max_per_visit` would overflow the
    /// receivers' buffers and delay the token behind them.
    pub max_visit_bytes: usize,
    /// An idle token (nothing sent in the last rotation, nothing missing, no backlog on the
    /// token or at its holder, and no safe message waiting for delivery anywhere) is held this
    /// long (microseconds) before it is passed on, unless a message is submitted meanwhile (its
    /// daemon asks for the token: [`Packet::Wake`]); at most half `token_retransmit_ms` over the
    /// ring's members, so that a rotation of rests stays short beside the token-loss timeout,
    /// and a message whose wake was lost waits at most that (and the timer's rounding). Without
    /// it, an idle ring passes its token as fast as the network allows and keeps every daemon's
    /// processor busy. 0: never held.
    pub idle_hold_us: u64,
    /// A visit with at most this many new messages (and at most 16 KiB of them) sends them
    /// before the token rather than after it: a light ring's next holder has nothing to wait
    /// for, and the messages reach the others before the token wakes its next holder (which,
    /// on a busy machine, may run before the sender sends them). 0: always after, as the
    /// Accelerated Ring.
    pub light_visit: u32,
}

impl Default for OrderingConfig {
    fn default() -> Self {
        OrderingConfig {
            token_retransmit_ms: 20,
            // Each visit costs the ring a pass of the token from one daemon to the next (a
            // wake-up, a datagram, a round of the protocol): with three daemons on two
            // processors, 200 a visit delivered 1 KiB agreed messages about a quarter faster
            // than 60, and 600 less than 200. Once the daemons spent less on each message, 300
            // delivered them 1.02-1.11 times as fast as 200 with one sender (six pairs, as
            // deployed), as fast with three; 250 and 400 less than 300, 350 about the same.
            max_per_visit: 300,
            // Above the messages of a rotation's visits at full load, so that it is the visits
            // that pace the ring; 600 to 2,000 delivered the same.
            window: 2_000,
            // Ten visits' worth keeps every visit full; more only holds memory (10,000 kept
            // 10 MiB of 1 KiB messages per daemon at full load, for no throughput).
            max_queued: 2_000,
            max_queued_bytes: 64 << 20,
            max_visit_bytes: 1 << 20,
            // Since a daemon with a message asks for the token, and a safe message keeps it from
            // resting, a longer rest only spares an idle ring its passes: as deployed at 1,000
            // agreed messages a second, 3 ms gave a p50 0.89 times that of 100 µs (twelve pairs
            // alternated; 1 ms did less in four), the daemons woken 5.3 times a message against
            // 6.3; at 100 and 10 a second p50 came out about 1.15 times, an idle ring costing the
            // daemons 4% of a processor against 7%.
            idle_hold_us: 3_000,
            // A visit of 1 KiB messages at 1,000 a second carries one or two; at full load, a
            // hundred or more, which go after the token.
            light_visit: 4,
        }
    }
}

impl OrderingConfig {
    /// Why these settings cannot work, if they cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.token_retransmit_ms == 0 {
            return Err("token_retransmit_ms must be above 0".into());
        }
        if self.max_per_visit == 0
            || self.window == 0
            || self.max_queued == 0
            || self.max_queued_bytes == 0
        {
            return Err(
                "max_per_visit, window, max_queued and max_queued_bytes must be above 0".into(),
            );
        }
        if self.max_visit_bytes == 0 {
            return Err("max_visit_bytes must be above 0".into());
        }
        Ok(())
    }
}

/// Why a daemon refused a peer's packet as one no correct daemon sends (hostile, corrupt, or
/// from a daemon that does not know the ring it claims). Packets that are merely late or of
/// another ring are part of the protocol and are not refusals.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerRefusal {
    #[error("undecodable: {0}")]
    Undecodable(#[from] conclave_wire::DecodeError),
    #[error("a ring sequence number no ring reaches")]
    RingSeqOutOfRange,
    #[error("a token whose numbers no ring could produce")]
    ImplausibleToken,
    #[error("a message from a daemon that is not a member of its ring")]
    NotAMember,
    #[error("a message numbered past what the ring could have sent")]
    BeyondWindow,
    #[error("a commit token that does not list this daemon exactly once")]
    BadCommit,
}

impl PeerRefusal {
    /// A short name for counting (metrics, status).
    pub fn name(&self) -> &'static str {
        match self {
            PeerRefusal::Undecodable(_) => "undecodable",
            PeerRefusal::RingSeqOutOfRange => "ring_seq_out_of_range",
            PeerRefusal::ImplausibleToken => "implausible_token",
            PeerRefusal::NotAMember => "not_a_member",
            PeerRefusal::BeyondWindow => "beyond_window",
            PeerRefusal::BadCommit => "bad_commit",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderingError {
    #[error("{max} messages already wait to be sent")]
    QueueFull { max: usize },
    #[error("{max_bytes} bytes of messages already wait to be sent")]
    QueueBytesFull { max_bytes: usize },
}

/// A packet to send: to one daemon, or to every other daemon of the ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dest {
    One(DaemonId),
    AllOthers,
}

#[derive(Clone, Debug)]
pub struct Transmit {
    pub to: Dest,
    pub packet: Packet,
}

/// Where a message retransmitted during recovery comes from: its old ring, its sequence number
/// there, its original sender.
pub type Origin = (RingId, u64, DaemonId);

/// An origin sequence number with this bit set names not a place in the old ring's order but the
/// sender's k-th message (k below the bit) that was accepted while the old ring was installed and
/// never ordered on it: the ring broke first. Such messages are delivered at the end of the old
/// ring's transitional configuration, by sender and k.
pub const UNSEQUENCED: u64 = 1 << 63;

/// Most bytes of new messages a light visit sends before its token (`light_visit` counts
/// them): a few large messages would hold the token behind datagrams of their own.
const LIGHT_VISIT_BYTES: usize = 16 * 1024;

/// A message delivered in the ring's total order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub seq: u64,
    pub sender: DaemonId,
    /// For a message of an old ring retransmitted during recovery: that ring, its sequence
    /// number there and its original sender.
    pub origin: Option<Origin>,
    pub body: Arc<Body>,
}

/// A message of this ring delivered when the ring ends ([`Ordering::finish`]): in the regular
/// configuration or in the transitional one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub seq: u64,
    pub sender: DaemonId,
    pub body: Arc<Body>,
    pub transitional: bool,
}

/// A message's size on the wire, roughly (for the visit's byte budget).
pub(crate) fn body_bytes(b: &Body) -> usize {
    64 + match b {
        Body::Client {
            payload,
            groups,
            spread,
            ..
        } => {
            payload.len()
                + groups.iter().map(|(g, _)| g.len() + 8).sum::<usize>()
                + spread.as_ref().map_or(0, |m| {
                    m.names.iter().map(|n| n.len() + 1).sum::<usize>() + 8
                })
        }
        Body::GroupState { members } => members
            .iter()
            .map(|m| m.client.len() + m.group.len() + 32)
            .sum(),
        _ => 0,
    }
}

fn service_of(d: &Data) -> ServiceType {
    match &*d.body {
        // Retransmissions of an old ring are delivered by the membership layer, in the old
        // ring's order; here they only need to arrive in order.
        Body::Client { service, .. } if d.origin.is_none() => *service,
        // Membership of client groups travels agreed.
        _ => ServiceType::Agreed,
    }
}

/// One daemon's part in the ring.
pub struct Ordering {
    cfg: OrderingConfig,
    me: DaemonId,
    ring: RingId,
    members: Vec<DaemonId>,
    /// Received and not yet dropped, by sequence number.
    buffer: SeqBuffer<Data>,
    /// Every message up to here received.
    my_aru: u64,
    /// Highest sequence number heard of.
    high_seq: u64,
    delivered: u64,
    /// `aru` of the token on this and the previous visit.
    aru_now: u64,
    aru_prev: u64,
    last_token_seq: u64,
    /// The token as last passed on, and when, for retransmission.
    last_sent: Option<(Token, Time)>,
    queue: VecDeque<Body>,
    /// Bytes of `queue` (as `body_bytes` counts them).
    queue_bytes: usize,
    /// Messages accepted while this ring was the installed one but never ordered on it, by
    /// sender and number: this member's own, and others' received during recovery.
    unsequenced: BTreeMap<(DaemonId, u64), Arc<Body>>,
    next_unsequenced: u64,
    /// Recovery retransmissions of an old ring, sent before anything of `queue`.
    recovery: VecDeque<(Option<Origin>, Arc<Body>)>,
    /// While recovering, the messages of `queue` wait: they belong to the configuration this
    /// ring becomes once recovery ends.
    hold_queue: bool,
    out: VecDeque<Transmit>,
    delivered_out: VecDeque<Delivered>,
    sent_out: VecDeque<(u64, Arc<Body>)>,
    /// The token's `seq` when this member last held it.
    prev_visit_seq: u64,
    /// What this member added to the token's `fcc` and `backlog` on its last visit.
    last_fcc: u64,
    last_backlog: u64,
    started: bool,
    refused: u64,
    /// The refusals of the packet being handled, for whoever handed it in.
    refusals: Vec<PeerRefusal>,
    /// An idle token being held, and until when.
    held: Option<(Token, Time)>,
    /// This member asked for the token since it last held it ([`Packet::Wake`]).
    woke: bool,
    /// Another member asked for the token: it is not held here until it has gone by.
    wanted: bool,
}

impl Ordering {
    /// A member of `ring` with `members` in ring order.
    pub fn new(
        cfg: OrderingConfig,
        me: DaemonId,
        ring: RingId,
        members: Vec<DaemonId>,
    ) -> Ordering {
        assert!(members.contains(&me), "a member of its own ring");
        Ordering {
            cfg,
            me,
            ring,
            members,
            buffer: SeqBuffer::default(),
            my_aru: 0,
            high_seq: 0,
            delivered: 0,
            aru_now: 0,
            aru_prev: 0,
            last_token_seq: 0,
            last_sent: None,
            queue: VecDeque::new(),
            queue_bytes: 0,
            unsequenced: BTreeMap::new(),
            next_unsequenced: 0,
            recovery: VecDeque::new(),
            hold_queue: false,
            out: VecDeque::new(),
            delivered_out: VecDeque::new(),
            sent_out: VecDeque::new(),
            prev_visit_seq: 0,
            last_fcc: 0,
            last_backlog: 0,
            started: false,
            refused: 0,
            refusals: Vec::new(),
            held: None,
            woke: false,
            wanted: false,
        }
    }

    pub fn ring(&self) -> RingId {
        self.ring
    }
    /// The ring's members, in ring order.
    pub fn members(&self) -> &[DaemonId] {
        &self.members
    }
    pub fn high_seq(&self) -> u64 {
        self.high_seq
    }
    pub fn delivered_up_to(&self) -> u64 {
        self.delivered
    }
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }
    /// Packets refused as impossible (hostile or corrupt).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    fn refuse(&mut self, why: PeerRefusal) {
        self.refused += 1;
        self.refusals.push(why);
    }

    /// The refusals since the last call (of the packets handled meanwhile).
    pub fn take_refusals(&mut self) -> Vec<PeerRefusal> {
        std::mem::take(&mut self.refusals)
    }

    fn successor(&self) -> DaemonId {
        let i = self
            .members
            .iter()
            .position(|m| *m == self.me)
            .expect("member");
        self.members[(i + 1) % self.members.len()]
    }

    /// A ring in recovery (TOCS §4.3): it sends `recovery` (retransmissions of an old ring, then
    /// the [`Body::RecoveryDone`] marker) and holds back new messages until
    /// [`Ordering::end_recovery`].
    pub fn recovering(
        cfg: OrderingConfig,
        me: DaemonId,
        ring: RingId,
        members: Vec<DaemonId>,
        recovery: Vec<(Option<Origin>, Arc<Body>)>,
    ) -> Ordering {
        let mut o = Ordering::new(cfg, me, ring, members);
        o.recovery = recovery.into();
        o.hold_queue = true;
        o
    }

    /// Recovery is over: new messages may go out.
    pub fn end_recovery(&mut self) {
        self.hold_queue = false;
    }

    /// Every member holds every message up to here (the token's `aru` on two successive visits).
    pub fn stable_up_to(&self) -> u64 {
        self.aru_now.min(self.aru_prev)
    }

    /// Every message up to here received.
    pub fn my_aru(&self) -> u64 {
        self.my_aru
    }

    /// What recovery retransmits of this ring: the messages held with sequence numbers above
    /// `low`, then every unsequenced message held.
    pub fn for_recovery(&self, low: u64) -> Vec<(Option<Origin>, Arc<Body>)> {
        let sequenced = self
            .buffer
            .from(low.saturating_add(1))
            .map(|(_, d)| (Some((self.ring, d.seq, d.sender)), d.body.clone()));
        let unsequenced = self
            .unsequenced
            .iter()
            .map(|((sender, k), b)| (Some((self.ring, UNSEQUENCED | k, *sender)), b.clone()));
        sequenced.chain(unsequenced).collect()
    }

    /// The ring has ended: messages accepted while it was installed and not sent on it become
    /// unsequenced messages of it, delivered in its transitional configuration. Returns them
    /// (they are sent now, in this ring's configuration).
    pub fn close_unsent(&mut self, unsent: impl IntoIterator<Item = Body>) -> Vec<Arc<Body>> {
        let mut out = Vec::new();
        self.queue_bytes = 0;
        for b in self.queue.drain(..).chain(unsent) {
            if self.next_unsequenced >= 2 * self.cfg.max_queued as u64 {
                // Past what a member may have waiting (see `insert_recovered`): never sent.
                break;
            }
            let b = Arc::new(b);
            self.unsequenced
                .insert((self.me, self.next_unsequenced), b.clone());
            self.next_unsequenced += 1;
            out.push(b);
        }
        out
    }

    /// Adds a message of this ring that another member retransmitted during recovery; nothing
    /// is delivered (the ring has ended: [`Ordering::finish`] delivers).
    pub fn insert_recovered(&mut self, seq: u64, sender: DaemonId, body: Arc<Body>) {
        // Only this ring's members sent on it; anything else is hostile, and would let the
        // unsequenced store grow with every sender id.
        if !self.members.contains(&sender) {
            self.refuse(PeerRefusal::NotAMember);
            return;
        }
        if seq & UNSEQUENCED != 0 {
            // No member accepts more than its queue holds while a ring is installed.
            let k = seq & !UNSEQUENCED;
            if k < 2 * self.cfg.max_queued as u64 {
                self.unsequenced.entry((sender, k)).or_insert(body);
            } else {
                self.refuse(PeerRefusal::BeyondWindow);
            }
            return;
        }
        if seq == 0 || seq <= self.delivered || self.buffer.contains(seq) {
            return;
        }
        if seq > self.horizon() {
            self.refuse(PeerRefusal::BeyondWindow);
            return;
        }
        self.high_seq = self.high_seq.max(seq);
        self.buffer.insert(
            seq,
            Data {
                ring: self.ring,
                seq,
                sender,
                origin: None,
                body,
            },
        );
        while self.buffer.contains(self.my_aru + 1) {
            self.my_aru += 1;
        }
    }

    /// The ring has ended and recovery is over: delivers what is left, by extended virtual
    /// synchrony (Moser et al., ICDCS 1994; TOCS §4.4). Members that came to the next ring
    /// together now hold the same messages of this one. In the regular configuration: in
    /// order, everything up to `max_delivered` (some of them delivered it there already), then
    /// on while there is no hole and no safe message (its stability in the whole old ring is
    /// unknown). The rest, holes skipped, in the transitional configuration, and after them the
    /// unsequenced messages, by sender and number.
    pub fn finish(&mut self, max_delivered: u64) -> Vec<Finished> {
        let mut out = Vec::new();
        let mut s = self.delivered + 1;
        while let Some(d) = self.buffer.get(s) {
            if s > max_delivered && service_of(d) == ServiceType::Safe {
                break;
            }
            out.push(Finished {
                seq: s,
                sender: d.sender,
                body: d.body.clone(),
                transitional: false,
            });
            s += 1;
        }
        for (seq, d) in self.buffer.from(s) {
            out.push(Finished {
                seq,
                sender: d.sender,
                body: d.body.clone(),
                transitional: true,
            });
        }
        for ((sender, k), body) in std::mem::take(&mut self.unsequenced) {
            out.push(Finished {
                seq: UNSEQUENCED | k,
                sender,
                body,
                transitional: true,
            });
        }
        self.delivered = self.buffer.last().unwrap_or(self.delivered);
        self.buffer.clear();
        out
    }

    /// Whether [`Ordering::submit`] would take a message now.
    pub fn can_submit(&self) -> bool {
        self.queue.len() < self.cfg.max_queued && self.queue_bytes < self.cfg.max_queued_bytes
    }

    /// Queues a message for the next token visit.
    pub fn submit(&mut self, body: Body) -> Result<(), OrderingError> {
        if self.queue.len() >= self.cfg.max_queued {
            return Err(OrderingError::QueueFull {
                max: self.cfg.max_queued,
            });
        }
        // Taken while the bytes queued are under the budget, exactly as `can_submit` says: the
        // daemon acknowledges a client's message once it was told there is room, so a refusal
        // here would lose an acknowledged message (as 8 KiB messages once were, at the edge).
        if self.queue_bytes >= self.cfg.max_queued_bytes {
            return Err(OrderingError::QueueBytesFull {
                max_bytes: self.cfg.max_queued_bytes,
            });
        }
        self.queue_bytes += body_bytes(&body);
        self.queue.push_back(body);
        self.want_token();
        Ok(())
    }

    /// A message to send: a token held here goes at once (at the next `handle_timeout`); one
    /// that may be resting elsewhere is asked for ([`Packet::Wake`]), once a visit. Whether it
    /// rests cannot be told from here (the member just after this one may have taken the token
    /// this member passed on as idle), so it asks once every visit (without asking, a message
    /// at a daemon the token had just left waited out the holds of the others: agreed
    /// delivery's p99 as deployed at 1,000 messages a second was 1.4 ms, with it 0.5 ms). It
    /// does not ask when its last visit left something on the token (messages sent, or a
    /// backlog): until its next visit takes that off, no member rests the token, so the token
    /// is on its way here. Under full load that is every visit.
    fn want_token(&mut self) {
        if self.held.is_some() {
            self.release_held();
        } else if !self.woke
            && self.started
            && self.cfg.idle_hold_us > 0
            && self.last_fcc + self.last_backlog == 0
        {
            self.woke = true;
            self.out.push_back(Transmit {
                to: Dest::AllOthers,
                packet: Packet::Wake { ring: self.ring },
            });
        }
    }

    /// The token held here goes at the next `handle_timeout`.
    fn release_held(&mut self) {
        if let Some((_, until)) = &mut self.held {
            *until = Time::ZERO;
        }
    }

    /// Queues a message of the daemons' own protocol (a flush marker, a group state, a notice
    /// of a client's departure). Their number is bounded by the groups and clients, not by the
    /// traffic, so they are never refused: a full queue of client messages must not lose them.
    pub fn submit_control(&mut self, body: Body) {
        self.queue_bytes += body_bytes(&body);
        self.queue.push_back(body);
        self.want_token();
    }

    /// The representative (the first member) creates the first token.
    pub fn start(&mut self, now: Time) {
        if self.started {
            return;
        }
        self.started = true;
        if self.members[0] == self.me {
            self.on_token(now, Token::new(self.ring));
        }
    }

    pub fn handle_packet(&mut self, now: Time, packet: Packet) {
        match packet {
            // A token seen before is a retransmission this member already answered.
            Packet::Token(t) if t.ring == self.ring && t.token_seq > self.last_token_seq => {
                if !self.plausible(&t) {
                    self.refuse(PeerRefusal::ImplausibleToken);
                    return;
                }
                self.started = true;
                // A newer token proves that the one this member passed on arrived: nothing to
                // send again while this one rests here (a rotation of rests, each rounded up by
                // the daemon's timer, could otherwise outlast the retransmission timeout).
                if self
                    .last_sent
                    .as_ref()
                    .is_some_and(|(s, _)| t.token_seq >= s.token_seq)
                {
                    self.last_sent = None;
                }
                if self
                    .held
                    .as_ref()
                    .is_some_and(|(h, _)| h.token_seq >= t.token_seq)
                {
                    return;
                }
                if self.idle(&t) && !self.wanted {
                    self.held = Some((t, now + self.hold()));
                    return;
                }
                self.held = None;
                self.on_token(now, t);
            }
            Packet::Wake { ring } if ring == self.ring => {
                if self.held.is_some() {
                    self.release_held();
                } else {
                    self.wanted = true;
                }
            }
            Packet::Data(d) if d.ring == self.ring => {
                // A message newer than the token this member passed on proves a later holder
                // got it (TOCS §3.1); an old one may be a late retransmission and proves nothing.
                if self.last_sent.as_ref().is_some_and(|(t, _)| d.seq > t.seq) {
                    self.last_sent = None;
                }
                self.on_data(d)
            }
            // Other rings and membership packets belong to the membership protocol.
            _ => {}
        }
    }

    /// The furthest ahead of this member's `aru` a sequence number can legitimately be: the
    /// windows bound what the ring sends before everyone has it.
    fn horizon(&self) -> u64 {
        self.my_aru
            .saturating_add(4 * (self.cfg.window + self.cfg.max_per_visit as u64))
    }

    /// Wire input is hostile: a token whose numbers no ring could produce is refused. A newer
    /// token has numbered every message this member holds.
    fn plausible(&self, t: &Token) -> bool {
        t.aru <= t.seq && self.my_aru <= t.seq && t.seq <= self.horizon() && t.token_seq < u64::MAX
    }

    fn on_data(&mut self, d: Data) {
        if d.seq <= self.my_aru || self.buffer.contains(d.seq) || d.seq == 0 {
            return;
        }
        if !self.members.contains(&d.sender) {
            self.refuse(PeerRefusal::NotAMember);
            return;
        }
        if d.seq > self.horizon() {
            self.refuse(PeerRefusal::BeyondWindow);
            return;
        }
        self.high_seq = self.high_seq.max(d.seq);
        self.buffer.insert(d.seq, d);
        self.advance();
    }

    /// Raises `my_aru` over what arrived, then delivers what may be delivered.
    fn advance(&mut self) {
        while self.buffer.contains(self.my_aru + 1) {
            self.my_aru += 1;
        }
        let safe_to = self.aru_now.min(self.aru_prev);
        while self.delivered < self.my_aru {
            let s = self.delivered + 1;
            let d = self.buffer.get(s).expect("held up to my_aru");
            if service_of(d) == ServiceType::Safe && s > safe_to {
                break;
            }
            self.delivered = s;
            self.delivered_out.push_back(Delivered {
                seq: s,
                sender: d.sender,
                origin: d.origin,
                body: d.body.clone(),
            });
        }
        // Drop what every member holds and this member delivered.
        let keep_from = safe_to.min(self.delivered) + 1;
        self.buffer.drop_below(keep_from);
    }

    fn on_token(&mut self, now: Time, mut t: Token) {
        (self.woke, self.wanted) = (false, false);
        self.last_token_seq = t.token_seq;
        self.aru_prev = self.aru_now;
        self.aru_now = t.aru;
        self.high_seq = self.high_seq.max(t.seq);
        // Answer retransmission requests, within the visit's budget (TOCS §3.3 counts
        // retransmissions in the flow control as new messages): the rest stay on the token for
        // the next holder that has them. Unbounded, a member far behind asks for hundreds of
        // messages at once, and the burst that answers overflows the receivers' buffers and is
        // lost again.
        let mut still = Vec::new();
        let mut resent = 0u64;
        let mut bytes = 0usize;
        for s in std::mem::take(&mut t.rtr) {
            match self.buffer.get(s) {
                Some(d)
                    if resent < self.cfg.max_per_visit as u64
                        && (resent == 0 || bytes < self.cfg.max_visit_bytes) =>
                {
                    resent += 1;
                    bytes = bytes.saturating_add(body_bytes(&d.body));
                    self.out.push_back(Transmit {
                        to: Dest::AllOthers,
                        packet: Packet::Data(d.clone()),
                    })
                }
                _ => still.push(s),
            }
        }
        // Ask for what this member misses, of what was sent before its previous visit: later
        // messages may still be on their way, as holders pass the token before sending them
        // (Accelerated Ring; a light visit's go before it, which only makes them earlier).
        let ask_to = t.seq.min(self.prev_visit_seq);
        self.prev_visit_seq = t.seq;
        for s in self.my_aru + 1..=ask_to {
            if still.len() >= MAX_RTR {
                break;
            }
            if !self.buffer.contains(s) && !still.contains(&s) {
                still.push(s);
            }
        }
        t.rtr = still;
        // New messages, within the windows (TOCS §3.3): at most `max_per_visit`; the ring's
        // messages not yet everywhere and those sent in the last rotation each within `window`;
        // and this member's share of the window in proportion to its backlog. The token's `fcc`
        // and `backlog` are sums over the ring: each member takes out what it put in on its last
        // visit and puts in what it does now.
        let mine_before = self.queue.len() + self.recovery.len();
        let mine_now = if self.hold_queue {
            self.recovery.len()
        } else {
            mine_before
        } as u64;
        let others_fcc = (t.fcc as u64).saturating_sub(self.last_fcc);
        let others_backlog = (t.backlog as u64).saturating_sub(self.last_backlog);
        let total_backlog = others_backlog + mine_now;
        let share = if total_backlog == 0 {
            0
        } else {
            // Rounded up, so that every member with a backlog sends at least one message.
            (self.cfg.window * mine_now).div_ceil(total_backlog)
        };
        let in_flight = t.seq.saturating_sub(t.aru);
        let room = self
            .cfg
            .window
            .saturating_sub(in_flight)
            .min(self.cfg.window.saturating_sub(others_fcc))
            .min(share)
            .min((self.cfg.max_per_visit as u64).saturating_sub(resent));
        let mut sent = 0;
        let mut fresh = Vec::new();
        let mut fresh_bytes = 0usize;
        while sent < room && (sent + resent == 0 || bytes < self.cfg.max_visit_bytes) {
            let (origin, body) = if let Some(r) = self.recovery.pop_front() {
                r
            } else if self.hold_queue {
                break;
            } else if let Some(b) = self.queue.pop_front() {
                self.queue_bytes -= body_bytes(&b);
                (None, Arc::new(b))
            } else {
                break;
            };
            t.seq += 1;
            sent += 1;
            bytes = bytes.saturating_add(body_bytes(&body));
            fresh_bytes = fresh_bytes.saturating_add(body_bytes(&body));
            if origin.is_none() && *body != Body::RecoveryDone {
                self.sent_out.push_back((t.seq, body.clone()));
            }
            let d = Data {
                ring: self.ring,
                seq: t.seq,
                sender: self.me,
                origin,
                body,
            };
            fresh.push(Transmit {
                to: Dest::AllOthers,
                packet: Packet::Data(d.clone()),
            });
            self.buffer.insert(t.seq, d);
        }
        self.high_seq = self.high_seq.max(t.seq);
        while self.buffer.contains(self.my_aru + 1) {
            self.my_aru += 1;
        }
        // The aru rule of TOCS §3.1.
        if self.my_aru < t.aru || t.aru_id == Some(self.me) || t.aru_id.is_none() {
            t.aru = self.my_aru;
            t.aru_id = if t.aru == t.seq { None } else { Some(self.me) };
        }
        // What this visit lets this member deliver, first: what it then holds and may not
        // deliver yet waits behind a safe message whose `aru` it has not seen twice, that is for
        // the token's next visits. It claims one message of backlog meanwhile, so that no member
        // rests the token (`idle`) while a safe message waits anywhere: rested, the token kept
        // safe delivery waiting out the holds (at 1,000 messages a second as deployed, p50 was
        // 1.5 ms without the claim, 0.38 ms with it). The claim goes with its next visit, as any
        // backlog does.
        self.advance();
        let waiting_safe = u64::from(self.delivered < self.my_aru);
        let left = mine_now.saturating_sub(sent);
        t.fcc = (others_fcc + sent + resent).min(u32::MAX as u64) as u32;
        t.backlog = (others_backlog + left + waiting_safe).min(u32::MAX as u64) as u32;
        self.last_fcc = sent + resent;
        self.last_backlog = left + waiting_safe;
        // The successor accepts it for its higher number; `last_token_seq` stays at the number
        // received, so that on a ring of one the token comes back to its only member.
        t.token_seq += 1;
        self.last_sent = Some((t.clone(), now));
        // The Accelerated Ring (Babay and Amir, ICDCS 2016, §III): the token goes first, its
        // sequence numbers already assigned, and the new messages follow while it travels, so the
        // next holder need not wait for them. A light visit's few go first (`light_visit`).
        let token = Transmit {
            to: Dest::One(self.successor()),
            packet: Packet::Token(t),
        };
        if fresh.len() <= self.cfg.light_visit as usize && fresh_bytes <= LIGHT_VISIT_BYTES {
            self.out.extend(fresh);
            self.out.push_back(token);
        } else {
            self.out.push_back(token);
            self.out.extend(fresh);
        }
    }

    /// How long an idle token rests here: `idle_hold_us`, but a rotation of rests within half
    /// the token's retransmission timeout (a large ring rests it less at each member), before
    /// the daemon's timer rounds each rest up to the millisecond.
    fn hold(&self) -> Duration {
        let rotation = self.cfg.token_retransmit_ms.saturating_mul(1000) / 2;
        let share = rotation / self.members.len().max(1) as u64;
        Duration::from_micros(self.cfg.idle_hold_us.min(share))
    }

    /// Whether a token may be held: nothing is on its way, missing or waiting anywhere (a safe
    /// message waiting for delivery counts in the token's `backlog`).
    fn idle(&self, t: &Token) -> bool {
        self.cfg.idle_hold_us > 0
            && !self.hold_queue
            && self.recovery.is_empty()
            && self.queue.is_empty()
            && t.rtr.is_empty()
            && t.fcc == 0
            && t.backlog == 0
            && t.aru == t.seq
            && self.my_aru == t.seq
    }

    /// The token retransmission timer, and the end of a token's hold.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.held.as_ref().is_some_and(|(_, until)| *until <= now) {
            let (t, _) = self.held.take().expect("held");
            self.on_token(now, t);
        }
        let retransmit_after = self.retransmit_after();
        if let Some((t, at)) = &mut self.last_sent {
            if now >= *at + retransmit_after {
                *at = now;
                let t = t.clone();
                let to = self.successor();
                self.out.push_back(Transmit {
                    to: Dest::One(to),
                    packet: Packet::Token(t),
                });
            }
        }
    }

    fn retransmit_after(&self) -> Duration {
        Duration::from_millis(self.cfg.token_retransmit_ms)
    }

    /// Whether this member rests an idle token.
    pub fn holds_idle_token(&self) -> bool {
        self.held.is_some()
    }

    /// When `handle_timeout` wants to run next.
    pub fn poll_timeout(&self) -> Option<Time> {
        let retransmit = self
            .last_sent
            .as_ref()
            .map(|(_, at)| *at + self.retransmit_after());
        let hold = self.held.as_ref().map(|(_, until)| *until);
        match (retransmit, hold) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    pub fn poll_delivery(&mut self) -> Option<Delivered> {
        self.delivered_out.pop_front()
    }

    /// Messages of the queue as they are first sent: their sequence number and body.
    pub fn poll_sent(&mut self) -> Option<(u64, Arc<Body>)> {
        self.sent_out.pop_front()
    }
}
