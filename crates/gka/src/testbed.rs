//! An in-memory group communication layer for key agreement: views, FIFO and agreed delivery
//! with virtual synchrony, and cost accounting along the critical path. Tests, `conclave gka run`
//! and the E1 benchmark drive the real protocol code through it.
//!
//! Delivery is one global queue (a total order that respects causality), a broadcast is delivered
//! to all its recipients at once, and a member's own messages count as delivered to it when sent.
//! When a membership event hits a component, the queued messages of its old view are first
//! delivered to the recipients that stay with their sender (the VS flush: members that move
//! together deliver the same messages), replies to them are not sent, and then the new views are
//! installed. Messages to or from members that split away are dropped.
//!
//! Costs: every message carries the cost of the longest chain of computation that led to it
//! (operations counted by the sender's meter, and measured compute time, each maximized
//! separately over incoming chains); a view's critical path is the longest chain that ends at a
//! member's key. This is the serial cost Table II of paper 000 counts.
//!
//! Views are numbered 1, 2, ... in the order they are installed; the protocols see view `n` as
//! [`view_id_of`]`(n)`, the `n`th view on one daemon ring ([`RING`]).

use crate::api::{
    Dest, GkaError, GroupViewId, KeyAgreement, MemberId, Reason, RingId, SecureView,
    SharedDirectory, Transmit, View,
};
use crate::script::{Action, Step};
use crate::{bd, ckd, gdh, str_proto, tgdh};
use conclave_crypto::{Fingerprint, Group, Identity, Meter, SigScheme};
use conclave_wire::gka::ProtocolId;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

/// The one ring the testbed's views are on. Nothing in the protocols depends on whether a view
/// starts a new ring: they only compare view ids and bind them into keys.
pub const RING: RingId = RingId {
    seq: 1,
    rep: 1,
    inc: 1,
};

/// The view id of the testbed's view number `n`.
pub fn view_id_of(n: u64) -> GroupViewId {
    GroupViewId {
        ring: RING,
        index: n,
    }
}

/// What made a view: the script's verb, which `conclave gka run` prints, and the reason the
/// daemons would give, which is all the protocols see.
type Cause = (&'static str, Reason);
const INIT: Cause = ("init", Reason::Join);
const JOIN: Cause = ("join", Reason::Join);
const LEAVE: Cause = ("leave", Reason::Leave);
const PARTITION: Cause = ("partition", Reason::Network);
const MERGE: Cause = ("merge", Reason::Network);

/// Creates one member's protocol state machine.
pub fn new_member<G: Group>(
    protocol: ProtocolId,
    me: &str,
    group: &str,
    identity: Identity,
    directory: SharedDirectory,
    rng: &mut dyn conclave_crypto::CryptoRng,
) -> Box<dyn KeyAgreement> {
    match protocol {
        ProtocolId::Gdh => Box::new(gdh::Gdh::<G>::new(me, group, identity, directory)),
        ProtocolId::Ckd => Box::new(ckd::Ckd::<G>::new(me, group, identity, directory, rng)),
        ProtocolId::Tgdh => Box::new(tgdh::Tgdh::<G>::new(me, group, identity, directory)),
        ProtocolId::Str => Box::new(str_proto::Str::<G>::new(me, group, identity, directory)),
        ProtocolId::Bd => Box::new(bd::Bd::<G>::new(me, group, identity, directory)),
    }
}

/// The cost of a chain of computation.
#[derive(Clone, Copy, Debug, Default)]
struct Path {
    meter: Meter,
    time_ns: u64,
    round: u32,
}

impl Path {
    fn join(&mut self, other: &Path) {
        if other.meter.weight() > self.meter.weight() {
            self.meter = other.meter;
        }
        self.time_ns = self.time_ns.max(other.time_ns);
        self.round = self.round.max(other.round);
    }
}

struct Member {
    ka: Box<dyn KeyAgreement>,
    /// The member's own randomness, so that its inputs can be replayed on a copy of its state.
    rng: ChaCha20Rng,
    /// The number of the view this member is in (0 before its first).
    view_id: u64,
    path: Path,
}

/// What one member's step produced, before the testbed's books take it in.
struct Outcome {
    result: Result<(), GkaError>,
    main_delta: Meter,
    main_ns: u64,
    /// The member's path once it had handled the input: what its messages carry.
    send_path: Path,
    out: Vec<Transmit>,
    key_delta: Meter,
    key_ns: u64,
    keys: Vec<SecureView>,
}

impl Member {
    /// Handles one input, then drains the member's messages and keys, timing and counting each
    /// part; touches nothing but the member.
    fn compute(&mut self, input: &Input, measure: bool) -> Outcome {
        let before = self.ka.meter();
        let input = input.delivered();
        let t0 = measure.then(Instant::now);
        let result = input.apply(self.ka.as_mut(), &mut self.rng);
        let main_ns = t0.map(|t| t.elapsed().as_nanos() as u64).unwrap_or(0);
        let main_delta = self.ka.meter().since(&before);
        self.path.meter.add(&main_delta);
        self.path.time_ns += main_ns;
        let send_path = self.path;
        let mut out = Vec::new();
        while let Some(t) = self.ka.poll_transmit() {
            out.push(t);
        }
        // Then the member derives its own key, off everyone else's path.
        let before = self.ka.meter();
        let t0 = measure.then(Instant::now);
        let mut keys = Vec::new();
        while let Some(k) = self.ka.poll_key() {
            keys.push(k);
        }
        let key_ns = t0.map(|t| t.elapsed().as_nanos() as u64).unwrap_or(0);
        let key_delta = self.ka.meter().since(&before);
        self.path.meter.add(&key_delta);
        self.path.time_ns += key_ns;
        Outcome {
            result,
            main_delta,
            main_ns,
            send_path,
            out,
            key_delta,
            key_ns,
            keys,
        }
    }
}

/// One member's input in a batch: the member, the path of the message and the recorded step that
/// sent it (none for a view), and the input.
type BatchStep = (MemberId, Option<(Path, Option<usize>)>, Input);

/// Fewer members than this in one step are not worth the threads.
const PARALLEL_BATCH: usize = 16;

impl Clone for Member {
    fn clone(&self) -> Self {
        Member {
            ka: self.ka.clone_box(),
            rng: self.rng.clone(),
            view_id: self.view_id,
            path: self.path,
        }
    }
}

#[derive(Clone)]
struct Packet {
    from: MemberId,
    to: Vec<MemberId>,
    view_id: u64,
    payload: std::sync::Arc<[u8]>,
    path: Path,
    /// The recorded step that sent it, while recording.
    origin: Option<usize>,
}

/// One input to a member.
#[derive(Clone)]
enum Input {
    View(View),
    Message(MemberId, std::sync::Arc<[u8]>),
}

impl Input {
    /// The input as a member process would hold it on arrival: a view's names freshly decoded
    /// into its own memory, not shared with other simulated members (whose use of them would
    /// leave them in the cache for it).
    fn delivered(&self) -> Input {
        match self {
            Input::View(v) => Input::View(View {
                members: v.members.to_vec().into(),
                ..v.clone()
            }),
            Input::Message(from, payload) => Input::Message(from.clone(), payload.clone()),
        }
    }
    /// Hands the input to `ka`. A member is given its view by value, so the caller makes its
    /// copy ([`Input::delivered`]) before the clock starts: decoding n names is the client
    /// library's work, not the protocol's.
    fn apply(self, ka: &mut dyn KeyAgreement, rng: &mut ChaCha20Rng) -> Result<(), GkaError> {
        match self {
            Input::View(v) => ka.handle_view(rng, v),
            Input::Message(from, payload) => ka.handle_message(rng, &from, &payload),
        }
    }
}

/// A member's input while recording: what it was, in which view, after which step it came.
struct RecordedStep {
    member: MemberId,
    input: Input,
    /// The view the member was in when the input had been handled.
    view_id: u64,
    /// The step that sent the message (none for a view).
    origin: Option<usize>,
    /// The view whose key this step produced, if any.
    key_view: Option<u64>,
    /// Time taken in place: handling the input, then deriving keys.
    main_ns: u64,
    key_ns: u64,
    /// Operations counted in each part.
    main_ops: Meter,
    key_ops: Meter,
}

/// The members' states when recording began, and every input since.
#[derive(Default)]
struct Recording {
    start: BTreeMap<MemberId, (Box<dyn KeyAgreement>, ChaCha20Rng)>,
    steps: Vec<RecordedStep>,
    /// The critical chain last found, by view (replays of one view reuse it).
    chain: Option<(u64, Option<std::sync::Arc<CriticalChain>>)>,
}

/// Where a step of the critical chain starts.
#[derive(Clone, Copy)]
enum From {
    Start,
    /// After the member's previous step (its key derivation included).
    Prev(usize),
    /// After the step that sent the message (before that step derived keys).
    Sender(usize),
}

/// The chain of steps that is a view's critical path (see [`critical_chain`]).
struct CriticalChain {
    /// Steps in order, each with where it starts.
    steps: Vec<(usize, From)>,
    /// Each member on the chain, with all its steps up to its last one on the chain.
    members: Vec<(MemberId, Vec<usize>)>,
}

/// What happened in one view, as `conclave gka run` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct ViewRecord {
    /// The view's number (its id is [`view_id_of`]`(view)`).
    pub view: u64,
    /// What made the view: `init`, `join`, `leave`, `merge` or `partition`.
    pub event: &'static str,
    pub members: Vec<MemberId>,
    /// Key fingerprint per member.
    pub keys: BTreeMap<MemberId, String>,
    pub rounds: u32,
    pub messages: u64,
    pub unicasts: u64,
    pub broadcasts: u64,
    /// Bytes of all the messages sent, envelopes and signatures included (a broadcast counted
    /// once).
    pub bytes: u64,
    /// Totals over all members of the view.
    pub exps: u64,
    pub sigs: u64,
    pub verifs: u64,
    pub decodes: u64,
    /// Along the critical path.
    pub exps_critical: u64,
    pub sigs_critical: u64,
    pub verifs_critical: u64,
    pub decodes_critical: u64,
    /// Serial computation time along the critical path, in microseconds.
    pub compute_us: f64,
    /// Every member's computation added up, in microseconds: what members that share a
    /// processor spend between them.
    pub compute_total_us: f64,
    #[serde(skip)]
    pub secret_fingerprints: BTreeMap<MemberId, Fingerprint>,
    #[serde(skip)]
    pub compute_ns: u64,
}

#[derive(Clone, Default)]
struct ViewStats {
    event: &'static str,
    members: Vec<MemberId>,
    keys: BTreeMap<MemberId, SecureView>,
    unicasts: u64,
    broadcasts: u64,
    bytes: u64,
    rounds: u32,
    total: Meter,
    critical: Path,
    critical_time_ns: u64,
    /// Every member's computation, added up.
    total_time_ns: u64,
    done: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TestbedError {
    #[error("line {line}: {msg}")]
    Script { line: usize, msg: String },
    #[error("identity generation failed")]
    Identity,
}

/// The in-memory transport with its members.
pub struct Testbed<G: Group> {
    protocol: ProtocolId,
    scheme: SigScheme,
    group: String,
    rng: ChaCha20Rng,
    directory: SharedDirectory,
    identities: BTreeMap<MemberId, Identity>,
    members: BTreeMap<MemberId, Member>,
    /// Component views: view number -> members in agreed order.
    components: BTreeMap<u64, Vec<MemberId>>,
    queue: VecDeque<Packet>,
    next_view_id: u64,
    stats: BTreeMap<u64, ViewStats>,
    /// Completed views, in completion order.
    pub records: Vec<ViewRecord>,
    /// Errors returned by protocols on honest input (a correct run has none).
    pub errors: Vec<(MemberId, GkaError)>,
    /// Keys every member ever obtained, for the secrecy checks.
    pub key_log: Vec<(MemberId, SecureView)>,
    /// Messages delivered so far.
    pub delivered: u64,
    /// Whether to measure compute time (off makes tests faster and fully deterministic).
    pub measure_time: bool,
    /// Whether the members that receive one message (or one view) compute on all the
    /// processor's threads. The run is the same; only in-place times change (off by default).
    pub parallel: bool,
    recording: Option<Recording>,
    _g: std::marker::PhantomData<G>,
}

/// The cost of a chain of steps: the operations counted along it, then its time in place.
#[derive(Clone, Copy, Default)]
struct ChainCost {
    ops: Meter,
    ns: u64,
}

impl ChainCost {
    /// Chains compare by their operations (as the view's critical counts do), then by time:
    /// two chains of equal operations have equal counts, whichever is kept.
    fn rank(&self) -> ((u64, u64, u64, u64, u64), u64) {
        (self.ops.weight(), self.ns)
    }
    fn plus(mut self, ops: &Meter, ns: u64) -> Self {
        self.ops.add(ops);
        self.ns += ns;
        self
    }
}

/// The critical path of the view numbered `view` among recorded `steps`: the chain of steps
/// that ended at a member's key with the most operations counted along it (the path the view's
/// critical counts describe), the latest in place among equals. `None` if the view produced
/// no key. Ranking by time alone could pick a chain that in-place noise made late (members
/// compute on several threads in a large group), with fewer operations than the counts give.
fn critical_chain(steps: &[RecordedStep], view: u64) -> Option<CriticalChain> {
    // In place: each step's chain up to sending its messages, and up to being done.
    let mut send_at = vec![ChainCost::default(); steps.len()];
    let mut done_at = vec![ChainCost::default(); steps.len()];
    let mut pred = vec![From::Start; steps.len()];
    let mut last: std::collections::HashMap<&str, usize> = Default::default();
    for (i, st) in steps.iter().enumerate() {
        let prev = match st.input {
            Input::View(_) => None,
            Input::Message(..) => last
                .get(st.member.as_str())
                .copied()
                .filter(|&j| steps[j].view_id == st.view_id),
        };
        let (a, b) = (
            prev.map(|j| done_at[j]).unwrap_or_default(),
            st.origin.map(|o| send_at[o]).unwrap_or_default(),
        );
        pred[i] = match (prev, st.origin) {
            (Some(_), Some(o)) if b.rank() > a.rank() => From::Sender(o),
            (Some(j), _) => From::Prev(j),
            (None, Some(o)) => From::Sender(o),
            (None, None) => From::Start,
        };
        let from = if b.rank() > a.rank() { b } else { a };
        send_at[i] = from.plus(&st.main_ops, st.main_ns);
        done_at[i] = send_at[i].plus(&st.key_ops, st.key_ns);
        last.insert(st.member.as_str(), i);
    }
    let end = (0..steps.len())
        .filter(|&i| steps[i].key_view == Some(view))
        .max_by_key(|&i| done_at[i].rank())?;
    let mut chain = vec![end];
    while let From::Prev(j) | From::Sender(j) = pred[*chain.last().expect("not empty")] {
        chain.push(j);
    }
    chain.reverse();
    // Each member on the chain, alone, up to its last step on it.
    let mut upto: BTreeMap<&str, usize> = BTreeMap::new();
    for &i in &chain {
        let e = upto.entry(steps[i].member.as_str()).or_insert(i);
        *e = (*e).max(i);
    }
    let mut members: BTreeMap<&str, Vec<usize>> = upto.keys().map(|m| (*m, Vec::new())).collect();
    for (i, st) in steps.iter().enumerate() {
        if let Some(own) = members.get_mut(st.member.as_str()) {
            if i <= upto[st.member.as_str()] {
                own.push(i);
            }
        }
    }
    Some(CriticalChain {
        steps: chain.into_iter().map(|i| (i, pred[i])).collect(),
        members: members
            .into_iter()
            .map(|(m, own)| (m.to_owned(), own))
            .collect(),
    })
}

/// A copy of the group as it stands, to run different events from one set-up. The copy shares
/// the directory (identities are set up before the group is) and records nothing.
impl<G: Group> Clone for Testbed<G> {
    fn clone(&self) -> Self {
        Testbed {
            protocol: self.protocol,
            scheme: self.scheme,
            group: self.group.clone(),
            rng: self.rng.clone(),
            directory: self.directory.clone(),
            identities: self.identities.clone(),
            members: self.members.clone(),
            components: self.components.clone(),
            queue: self.queue.clone(),
            next_view_id: self.next_view_id,
            stats: self.stats.clone(),
            records: self.records.clone(),
            errors: self.errors.clone(),
            key_log: self.key_log.clone(),
            delivered: self.delivered,
            measure_time: self.measure_time,
            parallel: self.parallel,
            recording: None,
            _g: std::marker::PhantomData,
        }
    }
}

impl<G: Group> Testbed<G> {
    pub fn new(protocol: ProtocolId, scheme: SigScheme, seed: u64) -> Self {
        Testbed {
            protocol,
            scheme,
            group: "g".into(),
            rng: ChaCha20Rng::seed_from_u64(seed),
            directory: Default::default(),
            identities: BTreeMap::new(),
            members: BTreeMap::new(),
            components: BTreeMap::new(),
            queue: VecDeque::new(),
            next_view_id: 1,
            stats: BTreeMap::new(),
            records: Vec::new(),
            errors: Vec::new(),
            key_log: Vec::new(),
            delivered: 0,
            measure_time: true,
            parallel: false,
            recording: None,
            _g: Default::default(),
        }
    }

    /// Uses an identity made elsewhere for `name` (benchmarks share RSA identities between runs,
    /// since generating them is slow).
    pub fn adopt_identity(&mut self, name: &str, id: Identity) {
        self.directory
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), id.public());
        self.identities.insert(name.to_owned(), id);
    }

    /// Lets the simulated members share their signature verifications (see
    /// [`Directory::share_verifications`](crate::Directory::share_verifications)): a broadcast is
    /// verified once, not by each of its n receivers. For building large groups quickly; the
    /// members' counts of verifications stay as they were, their measured times do not.
    pub fn share_verifications(&mut self, on: bool) {
        self.directory
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .share_verifications(on);
    }

    /// Pre-generates identities (RSA key generation is slow; benchmarks do it before timing).
    pub fn provision(&mut self, names: &[MemberId]) -> Result<(), TestbedError> {
        for n in names {
            if !self.identities.contains_key(n) {
                let id = Identity::generate(self.scheme, &mut self.rng)
                    .map_err(|_| TestbedError::Identity)?;
                self.directory
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(n.clone(), id.public());
                self.identities.insert(n.clone(), id);
            }
        }
        Ok(())
    }

    /// Members of every component, by view number.
    pub fn components(&self) -> &BTreeMap<u64, Vec<MemberId>> {
        &self.components
    }

    pub fn member_names(&self) -> Vec<MemberId> {
        self.members.keys().cloned().collect()
    }

    /// The key tree height a member reports (TGDH, STR).
    pub fn tree_height(&self, name: &str) -> Option<usize> {
        self.members.get(name).and_then(|m| m.ka.tree_height())
    }

    /// Members that started a run and have not finished it.
    pub fn stuck(&self) -> Vec<MemberId> {
        self.members
            .iter()
            .filter(|(_, m)| m.ka.in_progress())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Direct access to a member, for tests that inject hostile input.
    pub fn member_mut(&mut self, name: &str) -> Option<&mut (dyn KeyAgreement + 'static)> {
        self.members.get_mut(name).map(|m| m.ka.as_mut())
    }

    pub fn rng(&mut self) -> &mut ChaCha20Rng {
        &mut self.rng
    }

    fn create(&mut self, name: &str) -> Result<(), TestbedError> {
        self.provision(&[name.to_owned()])?;
        let id = self.identities[name].clone();
        let ka = new_member::<G>(
            self.protocol,
            name,
            &self.group,
            id,
            self.directory.clone(),
            &mut self.rng,
        );
        let rng =
            ChaCha20Rng::seed_from_u64(rand_chacha::rand_core::RngCore::next_u64(&mut self.rng));
        if let Some(rec) = self.recording.as_mut() {
            rec.start
                .insert(name.to_owned(), (ka.clone_box(), rng.clone()));
        }
        self.members.insert(
            name.to_owned(),
            Member {
                ka,
                rng,
                view_id: 0,
                path: Path::default(),
            },
        );
        Ok(())
    }

    fn component_of(&self, name: &str) -> Option<u64> {
        self.members
            .get(name)
            .map(|m| m.view_id)
            .filter(|v| self.components.contains_key(v))
    }

    /// The component the group's events apply to: the largest (oldest on ties).
    fn main_component(&self) -> Option<u64> {
        self.components
            .iter()
            .max_by_key(|(v, m)| (m.len(), std::cmp::Reverse(**v)))
            .map(|(v, _)| *v)
    }

    /// Runs a whole script.
    pub fn run_script(&mut self, steps: &[Step]) -> Result<(), TestbedError> {
        for step in steps {
            match step.after {
                None => self.run_until_quiet(),
                Some(k) => self.run_messages(k),
            }
            self.apply(&step.action)
                .map_err(|msg| TestbedError::Script {
                    line: step.line,
                    msg,
                })?;
        }
        self.run_until_quiet();
        Ok(())
    }

    /// Applies one membership event (flushing the affected components first).
    pub fn apply(&mut self, action: &Action) -> Result<(), String> {
        let fresh = |me: &Self, names: &[MemberId]| -> Result<(), String> {
            let set: BTreeSet<&MemberId> = names.iter().collect();
            if set.len() != names.len() {
                return Err("a member is named twice".into());
            }
            if let Some(n) = names.iter().find(|n| me.members.contains_key(*n)) {
                return Err(format!("{n} is already a member"));
            }
            Ok(())
        };
        match action {
            Action::Init(names) => {
                fresh(self, names)?;
                if !self.components.is_empty() {
                    return Err("init: the group already exists".into());
                }
                for n in names {
                    self.create(n).map_err(|e| e.to_string())?;
                }
                self.install(BTreeMap::from([(0, names.clone())]), INIT);
            }
            Action::Join(name) => {
                fresh(self, std::slice::from_ref(name))?;
                let main = self
                    .main_component()
                    .ok_or("join: no group yet (init first)")?;
                self.create(name).map_err(|e| e.to_string())?;
                let mut members = self.components[&main].clone();
                members.push(name.clone());
                self.install(BTreeMap::from([(main, members)]), JOIN);
            }
            Action::Leave(name) => {
                let comp = self
                    .component_of(name)
                    .ok_or_else(|| format!("leave: {name} is not a member"))?;
                let members: Vec<MemberId> = self.components[&comp]
                    .iter()
                    .filter(|m| *m != name)
                    .cloned()
                    .collect();
                self.install(BTreeMap::from([(comp, members)]), LEAVE);
                self.members.remove(name);
            }
            Action::Partition(names) => {
                let set: BTreeSet<&MemberId> = names.iter().collect();
                let mut changes = BTreeMap::new();
                for n in names {
                    let c = self
                        .component_of(n)
                        .ok_or_else(|| format!("partition: {n} is not a member"))?;
                    let rest: Vec<MemberId> = self.components[&c]
                        .iter()
                        .filter(|m| !set.contains(m))
                        .cloned()
                        .collect();
                    changes.insert(c, rest);
                }
                let mut split = names.clone();
                // Keep the agreed order of the components they come from.
                split.sort_by_key(|n| {
                    let c = self.component_of(n).unwrap_or(0);
                    (c, self.components[&c].iter().position(|m| m == n))
                });
                let mut views: BTreeMap<u64, Vec<MemberId>> =
                    changes.into_iter().filter(|(_, m)| !m.is_empty()).collect();
                views.insert(0, split);
                self.install(views, PARTITION);
            }
            Action::Merge(names) => {
                let main = self
                    .main_component()
                    .ok_or("merge: no group yet (init first)")?;
                let (new, old): (Vec<MemberId>, Vec<MemberId>) = names
                    .iter()
                    .cloned()
                    .partition(|n| !self.members.contains_key(n));
                if old.iter().any(|n| self.component_of(n) == Some(main)) {
                    return Err("merge: a named member is already in the group".into());
                }
                if !new.is_empty() {
                    // Members never seen before first form their own group, then merge.
                    fresh(self, &new)?;
                    for n in &new {
                        self.create(n).map_err(|e| e.to_string())?;
                    }
                    self.install(BTreeMap::from([(0, new.clone())]), INIT);
                    self.run_until_quiet();
                }
                let set: BTreeSet<&MemberId> = names.iter().collect();
                let mut views: BTreeMap<u64, Vec<MemberId>> = BTreeMap::new();
                let mut joining: Vec<MemberId> = Vec::new();
                let sources: BTreeSet<u64> =
                    names.iter().filter_map(|n| self.component_of(n)).collect();
                for c in sources {
                    let comp = self.components[&c].clone();
                    joining.extend(comp.iter().filter(|m| set.contains(m)).cloned());
                    let rest: Vec<MemberId> =
                        comp.into_iter().filter(|m| !set.contains(m)).collect();
                    if !rest.is_empty() {
                        views.insert(c, rest);
                    } else {
                        views.insert(c, Vec::new());
                    }
                }
                let mut members = self.components[&main].clone();
                members.extend(joining);
                views.insert(main, members);
                let views = views.into_iter().filter(|(_, m)| !m.is_empty()).collect();
                // Components emptied by the merge disappear.
                self.install(views, MERGE);
            }
        }
        Ok(())
    }

    /// The VS flush: delivers the queued messages of the components about to change to the
    /// recipients that stay with their sender, and what those deliveries make them send, until
    /// nothing is left (a member acknowledges a flush only after sending what its last input
    /// made it send); messages between members that part are dropped.
    fn flush(&mut self, comps: &[u64], new_comp_of: &BTreeMap<MemberId, u64>) {
        let comps: BTreeSet<u64> = comps.iter().copied().collect();
        loop {
            let (work, keep): (VecDeque<Packet>, VecDeque<Packet>) =
                std::mem::take(&mut self.queue)
                    .into_iter()
                    .partition(|p| comps.contains(&p.view_id));
            self.queue = keep;
            if work.is_empty() {
                break;
            }
            for p in work {
                let sender_new = new_comp_of.get(&p.from).copied().filter(|c| *c != u64::MAX);
                let to: Vec<MemberId> = p
                    .to
                    .iter()
                    .filter(|m| sender_new.is_some() && new_comp_of.get(*m).copied() == sender_new)
                    .cloned()
                    .collect();
                if !to.is_empty() {
                    self.deliver(Packet { to, ..p });
                }
            }
        }
    }

    /// Replaces the given components (old view number -> new member list; 0 for a new component) by
    /// new views, after the flush.
    fn install(&mut self, views: BTreeMap<u64, Vec<MemberId>>, (event, reason): Cause) {
        // Which new component each member of an affected component ends up in.
        let mut new_comp_of: BTreeMap<MemberId, u64> = BTreeMap::new();
        for (i, (_, ms)) in views.iter().enumerate() {
            for m in ms {
                new_comp_of.insert(m.clone(), i as u64 + 1);
            }
        }
        let mut affected: BTreeSet<u64> = views.keys().copied().filter(|v| *v != 0).collect();
        for ms in views.values() {
            for m in ms {
                if let Some(c) = self.component_of(m) {
                    affected.insert(c);
                }
            }
        }
        let affected: Vec<u64> = affected.into_iter().collect();
        for c in &affected {
            if let Some(ms) = self.components.get(c) {
                for m in ms {
                    new_comp_of.entry(m.clone()).or_insert(u64::MAX);
                }
            }
        }
        self.flush(&affected, &new_comp_of);
        for c in &affected {
            self.components.remove(c);
        }
        // Components that go on get their view numbers first; a split-off group (key 0) comes last,
        // so that on a tie the group's events keep applying to the part that went on.
        let mut ordered: Vec<(u64, Vec<MemberId>)> = views.into_iter().collect();
        ordered.sort_by_key(|(k, _)| (*k == 0, *k));
        for (_, members) in ordered {
            if members.is_empty() {
                continue;
            }
            let number = self.next_view_id;
            self.next_view_id += 1;
            self.components.insert(number, members.clone());
            self.stats.insert(
                number,
                ViewStats {
                    event,
                    members: members.clone(),
                    ..Default::default()
                },
            );
            let prevs: BTreeMap<MemberId, u64> = members
                .iter()
                .map(|m| (m.clone(), self.members[m].view_id))
                .collect();
            // Members that come from the same view share their transitional set.
            let mut by_prev: BTreeMap<u64, Vec<MemberId>> = BTreeMap::new();
            for m in &members {
                if prevs[m] != 0 {
                    by_prev.entry(prevs[m]).or_default().push(m.clone());
                }
            }
            let mut batch = Vec::with_capacity(members.len());
            for m in &members {
                let transitional = match prevs[m] {
                    0 => vec![m.clone()],
                    prev => by_prev[&prev].clone(),
                };
                let view = View {
                    group: self.group.clone(),
                    view_id: view_id_of(number),
                    members: members.clone().into(),
                    reason,
                    transitional,
                };
                let member = self.members.get_mut(m).expect("member exists");
                member.view_id = number;
                member.path = Path::default();
                batch.push((m.clone(), None, Input::View(view)));
            }
            self.step_many(batch);
        }
    }

    /// Runs one input of each of several members, in order, with cost accounting, then drains
    /// their outputs; with each, the path of the message it handles and the recorded step that
    /// sent it. One member's step
    /// never depends on another's in the same batch (their outputs are only queued), so with
    /// [`parallel`](Self::parallel) on the members compute on several threads; the books are
    /// kept afterwards in the batch's order, so the run is the same either way.
    fn step_many(&mut self, batch: Vec<BatchStep>) {
        let measure = self.measure_time;
        let mut work: Vec<(MemberId, Input, Option<usize>)> = Vec::with_capacity(batch.len());
        for (name, incoming, input) in batch {
            let Some(member) = self.members.get_mut(&name) else {
                continue;
            };
            if let Some((p, _)) = incoming {
                member.path.join(&p);
            }
            let step_id = self.recording.as_mut().map(|rec| {
                rec.chain = None;
                rec.steps.push(RecordedStep {
                    member: name.clone(),
                    input: input.clone(),
                    view_id: 0,
                    origin: incoming.and_then(|(_, o)| o),
                    key_view: None,
                    main_ns: 0,
                    key_ns: 0,
                    main_ops: Meter::default(),
                    key_ops: Meter::default(),
                });
                rec.steps.len() - 1
            });
            work.push((name, input, step_id));
        }
        let threads = if self.parallel && work.len() >= PARALLEL_BATCH {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            1
        };
        let index: std::collections::HashMap<&str, usize> = if threads > 1 {
            work.iter()
                .enumerate()
                .map(|(i, (n, _, _))| (n.as_str(), i))
                .collect()
        } else {
            Default::default()
        };
        let mut outcomes: Vec<Option<Outcome>> = (0..work.len()).map(|_| None).collect();
        if threads > 1 && index.len() == work.len() {
            // The members stay where they are: each thread gets its share of them by reference.
            let mut jobs: Vec<(usize, &mut Member)> = self
                .members
                .iter_mut()
                .filter_map(|(n, m)| index.get(n.as_str()).map(|&i| (i, m)))
                .collect();
            let chunk = jobs.len().div_ceil(threads).max(1);
            let work = &work;
            let run = |part: &mut [(usize, &mut Member)]| {
                part.iter_mut()
                    .map(|(i, m)| (*i, m.compute(&work[*i].1, measure)))
                    .collect::<Vec<_>>()
            };
            let done = std::thread::scope(|scope| {
                let mut parts = jobs.chunks_mut(chunk);
                let first = parts.next().expect("a non-empty batch");
                let others: Vec<_> = parts.map(|part| scope.spawn(move || run(part))).collect();
                let mut all = run(first);
                for h in others {
                    all.extend(h.join().expect("a member's step panicked"));
                }
                all
            });
            for (i, o) in done {
                outcomes[i] = Some(o);
            }
        } else {
            for (o, (name, input, _)) in outcomes.iter_mut().zip(&work) {
                let member = self.members.get_mut(name).expect("checked above");
                *o = Some(member.compute(input, measure));
            }
        }
        for ((name, _, step_id), outcome) in work.into_iter().zip(outcomes) {
            self.account(&name, step_id, outcome.expect("every member computed"));
        }
    }

    /// The testbed's books for one member's step: costs, errors, queued messages, keys.
    fn account(&mut self, name: &str, step_id: Option<usize>, o: Outcome) {
        let member = self.members.get_mut(name).expect("a member of the batch");
        let view_id = member.view_id;
        let final_path = member.path;
        let send_path = Path {
            round: o.send_path.round + 1,
            ..o.send_path
        };
        if let Some(s) = self.stats.get_mut(&view_id) {
            s.total.add(&o.main_delta);
            s.total.add(&o.key_delta);
            s.total_time_ns += o.main_ns + o.key_ns;
        }
        if let Err(e) = o.result {
            self.errors.push((name.to_owned(), e));
        }
        for t in o.out {
            if t.view_id != view_id_of(view_id) {
                continue;
            }
            let (to, unicast) = match t.dest {
                Dest::Broadcast => (
                    self.components
                        .get(&view_id)
                        .map(|ms| ms.iter().filter(|m| *m != name).cloned().collect())
                        .unwrap_or_default(),
                    false,
                ),
                Dest::Unicast(m) => (vec![m], true),
            };
            if let Some(s) = self.stats.get_mut(&view_id) {
                if unicast {
                    s.unicasts += 1;
                } else {
                    s.broadcasts += 1;
                }
                s.bytes += t.payload.len() as u64;
                s.rounds = s.rounds.max(send_path.round);
            }
            self.queue.push_back(Packet {
                from: name.to_owned(),
                to,
                view_id,
                payload: t.payload.into(),
                path: send_path,
                origin: step_id,
            });
        }
        if let (Some(rec), Some(id)) = (self.recording.as_mut(), step_id) {
            let st = &mut rec.steps[id];
            st.view_id = view_id;
            st.key_view = o.keys.last().map(|k| k.view_id.index);
            st.main_ns = o.main_ns;
            st.key_ns = o.key_ns;
            st.main_ops = o.main_delta;
            st.key_ops = o.key_delta;
        }
        for k in o.keys {
            self.key_log.push((name.to_owned(), k.clone()));
            // The testbed's view numbers are the indexes on its one ring.
            if let Some(s) = self.stats.get_mut(&k.view_id.index) {
                if final_path.meter.weight() > s.critical.meter.weight() {
                    s.critical.meter = final_path.meter;
                }
                s.critical_time_ns = s.critical_time_ns.max(final_path.time_ns);
                s.keys.insert(name.to_owned(), k);
            }
            self.check_view_done(view_id);
        }
    }

    fn check_view_done(&mut self, view_id: u64) {
        let Some(s) = self.stats.get_mut(&view_id) else {
            return;
        };
        if s.done || s.keys.len() != s.members.len() {
            return;
        }
        s.done = true;
        let rec = ViewRecord {
            view: view_id,
            event: s.event,
            members: s.members.clone(),
            keys: s
                .keys
                .iter()
                .map(|(m, k)| (m.clone(), k.key.fingerprint().to_string()))
                .collect(),
            rounds: s.rounds,
            messages: s.unicasts + s.broadcasts,
            unicasts: s.unicasts,
            broadcasts: s.broadcasts,
            bytes: s.bytes,
            exps: s.total.exps,
            sigs: s.total.sigs,
            verifs: s.total.verifs,
            decodes: s.total.decodes,
            exps_critical: s.critical.meter.exps,
            sigs_critical: s.critical.meter.sigs,
            verifs_critical: s.critical.meter.verifs,
            decodes_critical: s.critical.meter.decodes,
            compute_us: s.critical_time_ns as f64 / 1000.0,
            compute_total_us: s.total_time_ns as f64 / 1000.0,
            secret_fingerprints: s
                .keys
                .iter()
                .map(|(m, k)| (m.clone(), k.secret_fingerprint))
                .collect(),
            compute_ns: s.critical_time_ns,
        };
        self.records.push(rec);
    }

    fn deliver(&mut self, p: Packet) {
        self.delivered += 1;
        let batch =
            p.to.iter()
                .filter(|to| {
                    self.members
                        .get(*to)
                        .is_some_and(|m| m.view_id == p.view_id)
                })
                .map(|to| {
                    (
                        to.clone(),
                        Some((p.path, p.origin)),
                        Input::Message(p.from.clone(), p.payload.clone()),
                    )
                })
                .collect();
        self.step_many(batch);
    }

    /// Delivers queued messages until none is left.
    pub fn run_until_quiet(&mut self) {
        while let Some(p) = self.queue.pop_front() {
            self.deliver(p);
        }
    }

    /// Delivers at most `k` queued messages.
    pub fn run_messages(&mut self, k: usize) {
        for _ in 0..k {
            match self.queue.pop_front() {
                Some(p) => self.deliver(p),
                None => break,
            }
        }
    }

    /// The queued messages as (sender, recipients, bytes), for tests that replay or tamper.
    pub fn queue_snapshot(&self) -> Vec<(MemberId, Vec<MemberId>, Vec<u8>)> {
        self.queue
            .iter()
            .map(|p| (p.from.clone(), p.to.clone(), p.payload.to_vec()))
            .collect()
    }

    /// The private identity of a member, for tests that play a misbehaving insider.
    pub fn identity(&self, name: &str) -> Option<&Identity> {
        self.identities.get(name)
    }

    /// Hands `bytes` to member `to` as if `from` had sent them, outside the transport. Returns the
    /// protocol's verdict and how many messages it wanted to send in answer.
    pub fn inject(&mut self, to: &str, from: &str, bytes: &[u8]) -> (Result<(), GkaError>, usize) {
        let Some(m) = self.members.get_mut(to) else {
            return (Err(GkaError::NoView), 0);
        };
        let r = m.ka.handle_message(&mut m.rng, from, bytes);
        let mut n = 0;
        while m.ka.poll_transmit().is_some() {
            n += 1;
        }
        (r, n)
    }

    /// Starts recording every member's inputs, from copies of their states now, for
    /// [`Testbed::replay_alone`].
    pub fn record(&mut self) {
        let start = self
            .members
            .iter()
            .map(|(n, m)| (n.clone(), (m.ka.clone_box(), m.rng.clone())))
            .collect();
        self.recording = Some(Recording {
            start,
            steps: Vec::new(),
            chain: None,
        });
    }

    /// The critical path of the view numbered `view` (see [`critical_chain`]), timed again with
    /// each member on it computing alone: its recorded inputs are replayed on a copy of its
    /// state in memory of its own ([`KeyAgreement::own_copy`]), in one go, so that its own state
    /// is what the processor's caches hold, as in a real member (in place, all simulated
    /// members' states compete for them between its steps, and each member's tree lies
    /// scattered among theirs). Returns the replayed time in microseconds; `None` if nothing was
    /// recorded or the view produced no key. Members stop sharing their verifications first: a
    /// replayed member verifies every signature itself. The recording is kept, so that the
    /// replay can be timed again.
    pub fn replay_alone(&mut self, view: u64) -> Option<f64> {
        self.share_verifications(false);
        let rec = self.recording.as_mut()?;
        let chain = match &rec.chain {
            Some((v, c)) if *v == view => c.clone(),
            _ => {
                let c = critical_chain(&rec.steps, view).map(std::sync::Arc::new);
                rec.chain = Some((view, c.clone()));
                c
            }
        }?;
        let steps = &rec.steps;
        let mut alone: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
        for (name, own) in &chain.members {
            let (ka, rng) = rec.start.get(name)?;
            let (mut ka, mut rng) = (ka.own_copy(), rng.clone());
            for &i in own {
                let input = steps[i].input.delivered();
                let before = ka.meter();
                let t = Instant::now();
                let _ = input.apply(ka.as_mut(), &mut rng);
                let main = t.elapsed().as_nanos() as u64;
                let after_main = ka.meter();
                while ka.poll_transmit().is_some() {}
                let t = Instant::now();
                while ka.poll_key().is_some() {}
                alone.insert(i, (main, t.elapsed().as_nanos() as u64));
                // The replay did what the step did in place (a copy that lost part of the
                // state would time another computation).
                debug_assert_eq!(after_main.since(&before), steps[i].main_ops, "step {i}");
                debug_assert_eq!(ka.meter().since(&after_main), steps[i].key_ops, "step {i}");
            }
        }
        // Along the chain, with the replayed times.
        let (mut sent, mut finished) = (BTreeMap::new(), BTreeMap::new());
        let mut end = 0;
        for &(i, from) in &chain.steps {
            let (main, key) = alone[&i];
            let start = match from {
                From::Start => 0,
                From::Prev(j) => finished[&j],
                From::Sender(j) => sent[&j],
            };
            sent.insert(i, start + main);
            finished.insert(i, start + main + key);
            end = i;
        }
        Some(finished[&end] as f64 / 1000.0)
    }

    /// Messages waiting to be delivered.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::parse;
    use conclave_crypto::Ristretto255;

    /// The chain replayed alone is the path the view's critical counts describe: its steps'
    /// operations add up to exactly those counts, whatever the in-place times (here not even
    /// measured), so a replay's ratio to its floor compares like with like.
    #[test]
    fn the_replayed_chain_carries_the_views_critical_counts() {
        let names: Vec<String> = (0..9).map(|i| format!("m{i}")).collect();
        for p in ProtocolId::ALL {
            for event in [
                "join x".to_owned(),
                format!("leave {}", names[4]),
                format!("partition {}", names[5..].join(" ")),
                format!("merge {}", names[5..].join(" ")),
            ] {
                let mut tb = Testbed::<Ristretto255>::new(p, SigScheme::Ed25519, 7);
                tb.measure_time = false;
                let init = format!("init {}", names.join(" "));
                tb.run_script(&parse(&init).unwrap()).unwrap();
                if event.starts_with("merge") {
                    let split = format!("partition {}", names[5..].join(" "));
                    tb.run_script(&parse(&split).unwrap()).unwrap();
                }
                tb.record();
                tb.run_script(&parse(&event).unwrap()).unwrap();
                assert!(tb.errors.is_empty(), "{p:?} {event}: {:?}", tb.errors);
                let rec = tb
                    .records
                    .iter()
                    .rev()
                    .find(|r| r.members.iter().any(|m| m == "m0"))
                    .unwrap()
                    .clone();
                let steps = &tb.recording.as_ref().unwrap().steps;
                let chain = critical_chain(steps, rec.view).expect("a keyed view");
                let mut ops = Meter::default();
                for (k, &(i, _)) in chain.steps.iter().enumerate() {
                    ops.add(&steps[i].main_ops);
                    // A step's key derivation is on the path if a later step of the same
                    // member follows it, or if it ends the chain.
                    let next = chain.steps.get(k + 1);
                    if next.is_none() || matches!(next, Some((_, From::Prev(_)))) {
                        ops.add(&steps[i].key_ops);
                    }
                }
                let counts = (
                    rec.exps_critical,
                    rec.sigs_critical,
                    rec.verifs_critical,
                    rec.decodes_critical,
                );
                assert_eq!(
                    (ops.exps, ops.sigs, ops.verifs, ops.decodes),
                    counts,
                    "{p:?} {event}"
                );
                assert!(tb.replay_alone(rec.view).is_some(), "{p:?} {event}");
            }
        }
    }
}
