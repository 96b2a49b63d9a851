//! The checker: verifies a recorded history against the properties of docs/reliability.md (membership
//! M1-M5, integrity I1-I3, delivery view D1-D2, virtual synchrony V1-V2, order O1-O4, VS extras
//! X1-X3, liveness L1-L3), after Chockler, Keidar and Vitenberg's survey of group communication
//! specifications and Moser et al.'s extended virtual synchrony.
//!
//! Some properties can only be judged when the history shows enough: a sender's self-delivery
//! (I3) and a safe message's delivery at the other members (O4) are required once the process
//! concerned has installed a later view in the same incarnation, or when the history ends in a
//! stable period with the process alive; a history cut short proves nothing there. Liveness is
//! checked only when the history holds a `stable` line.
//!
//! One file per family of properties, as docs/reliability.md groups them: `membership`,
//! `integrity`, `delivery` (and X2), `synchrony`, `order`, `liveness`. What needs only one pass
//! over the history (M3, and the VS extras X1 and X3) is checked here as it is gathered.

use crate::record::{Event, Record, Service, ViewId};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

mod delivery;
mod integrity;
mod liveness;
mod membership;
mod order;
mod secure;
mod synchrony;

use delivery::delivery_view;
use integrity::integrity;
use liveness::liveness;
use membership::membership;
use order::{order, safe};
pub use secure::DAEMONS_GROUP;
use secure::{daemons_key, group_keys, secure};
use synchrony::synchrony;

/// Most violations reported per property (the first ones are the useful ones).
pub const MAX_VIOLATIONS_PER_PROPERTY: usize = 20;

#[derive(Clone, Debug)]
pub struct Config {
    /// L3: most views a process may install for one group after stabilization.
    pub max_views_after_stable: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_views_after_stable: 4,
        }
    }
}

/// A broken property, with the lines of the history that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub property: &'static str,
    pub message: String,
    pub excerpt: Vec<String>,
}

impl core::fmt::Display for Violation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        writeln!(f, "{}: {}", self.property, self.message)?;
        for l in &self.excerpt {
            writeln!(f, "    {l}")?;
        }
        Ok(())
    }
}

type Proc = (String, u32);
/// Views a process installed: group, view, record.
type Installed<'a> = Vec<(&'a str, &'a ViewId, usize)>;
/// Each process's agreed deliveries in one regular view.
type Sequences<'a> = Vec<(&'a Proc, Vec<&'a Delivery>)>;

/// A view as one process installed it.
#[derive(Clone, Debug)]
struct Install {
    proc: Proc,
    group: String,
    view: ViewId,
    members: Vec<String>,
    trans: Vec<String>,
    prev: Option<ViewId>,
    /// Index of the record in the history.
    rec: usize,
    t: u64,
}

#[derive(Clone, Debug)]
struct Delivery {
    proc: Proc,
    group: String,
    msg: String,
    sender: String,
    service: Service,
    view: ViewId,
    /// In the transitional part (after the signal), as the process's state says.
    in_trans: bool,
    payload: String,
    rec: usize,
    t: u64,
}

#[derive(Clone, Debug)]
struct Send {
    proc: Proc,
    group: String,
    msg: String,
    service: Service,
    view: ViewId,
    payload: String,
    rec: usize,
    t: u64,
    pos: usize,
    /// Sent by a process outside the group ([`Event::OpenSend`]): no view of the sender's, so
    /// none of the checks that compare views or order a sender's messages within one.
    open: bool,
}

struct Report<'a> {
    records: &'a [Record],
    out: Vec<Violation>,
    counts: HashMap<&'static str, usize>,
}

impl Report<'_> {
    fn add(&mut self, property: &'static str, message: String, recs: &[usize]) {
        let c = self.counts.entry(property).or_default();
        *c += 1;
        if *c > MAX_VIOLATIONS_PER_PROPERTY {
            return;
        }
        let mut recs: Vec<usize> = recs.to_vec();
        recs.sort_unstable();
        recs.dedup();
        let excerpt = recs
            .iter()
            .take(6)
            .map(|i| format!("#{} {}", i + 1, self.records[*i].to_line()))
            .collect();
        self.out.push(Violation {
            property,
            message,
            excerpt,
        });
    }
}

/// Everything the properties look at, gathered in one pass.
#[derive(Default)]
struct Facts {
    installs: Vec<Install>,
    deliveries: Vec<Delivery>,
    sends: Vec<Send>,
    /// Per process: its events in order, as indexes into `installs` / `deliveries` / `sends`.
    timeline: BTreeMap<Proc, Vec<Step>>,
    crashed: HashMap<Proc, (u64, usize)>,
    /// (process, group) asked for VS.
    vs: HashSet<(Proc, String)>,
    /// Per process incarnation and group: the (leave record, time) events.
    leaves: Vec<(Proc, String, usize, u64)>,
    stable: Option<(u64, Vec<String>, usize)>,
    /// Groups each process incarnation was in at the end.
    joined_at_end: BTreeMap<Proc, BTreeSet<String>>,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Install(usize),
    Deliver(usize),
    Send,
    Leave(usize),
    FlushAck,
}

struct GroupState {
    view: Option<(ViewId, usize)>,
    in_trans: bool,
    flushed: Option<usize>,
}

fn gather(records: &[Record], rep: &mut Report<'_>) -> Facts {
    let mut f = Facts::default();
    let mut state: HashMap<(Proc, String), GroupState> = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        let proc: Proc = (r.p.clone(), r.inc);
        let pos = f.timeline.get(&proc).map_or(0, Vec::len);
        match &r.ev {
            Event::Stable { processes } => {
                f.stable = Some((r.t, processes.clone(), i));
            }
            Event::Crash => {
                f.crashed.insert(proc, (r.t, i));
            }
            Event::Hostile { kind, taken } => {
                if *taken > 0 {
                    rep.add(
                        "S-link",
                        format!(
                            "{} took {taken} packet(s) of a datagram an attacker made ({kind})",
                            r.p
                        ),
                        &[i],
                    );
                }
            }
            // The secure layer's records are checked on their own (`secure`).
            Event::SecureView { .. }
            | Event::SecureRefused { .. }
            | Event::SecureSend { .. }
            | Event::SecureDeliver { .. }
            | Event::SecureConsumed { .. }
            | Event::GroupKey { .. }
            | Event::KeyServer { .. } => {}
            Event::Join { group, vs } => {
                if *vs {
                    f.vs.insert((proc.clone(), group.clone()));
                }
                f.joined_at_end
                    .entry(proc)
                    .or_default()
                    .insert(group.clone());
            }
            Event::Leave { group } => {
                f.leaves.push((proc.clone(), group.clone(), i, r.t));
                f.joined_at_end
                    .entry(proc.clone())
                    .or_default()
                    .remove(group);
                state.remove(&(proc.clone(), group.clone()));
                f.timeline
                    .entry(proc)
                    .or_default()
                    .push(Step::Leave(f.leaves.len() - 1));
            }
            Event::View {
                group,
                view,
                members,
                transitional,
            } => {
                let st = state
                    .entry((proc.clone(), group.clone()))
                    .or_insert(GroupState {
                        view: None,
                        in_trans: false,
                        flushed: None,
                    });
                let prev = st.view.as_ref().map(|v| v.0.clone());
                st.view = Some((view.clone(), i));
                st.in_trans = false;
                st.flushed = None;
                f.installs.push(Install {
                    proc: proc.clone(),
                    group: group.clone(),
                    view: view.clone(),
                    members: members.clone(),
                    trans: transitional.clone(),
                    prev,
                    rec: i,
                    t: r.t,
                });
                f.timeline
                    .entry(proc)
                    .or_default()
                    .push(Step::Install(f.installs.len() - 1));
            }
            Event::TransSignal { group } => {
                if let Some(st) = state.get_mut(&(proc.clone(), group.clone())) {
                    st.in_trans = true;
                } else {
                    rep.add(
                        "M3",
                        format!(
                            "{} got a transitional signal for {group} outside any view",
                            r.p
                        ),
                        &[i],
                    );
                }
            }
            Event::FlushAck { group } => {
                if let Some(st) = state.get_mut(&(proc.clone(), group.clone())) {
                    st.flushed = Some(i);
                }
                f.timeline.entry(proc).or_default().push(Step::FlushAck);
            }
            Event::Send {
                group,
                msg,
                service,
                view,
                payload,
            } => {
                match state.get(&(proc.clone(), group.clone())) {
                    None => rep.add(
                        "M3",
                        format!("{} sent {msg} to {group} outside any view", r.p),
                        &[i],
                    ),
                    Some(st) => {
                        let (cur, vrec) = st.view.clone().expect("state exists with a view");
                        if &cur != view {
                            rep.add(
                                "M3",
                                format!(
                                    "{} sent {msg} naming view {view} while in view {cur}",
                                    r.p
                                ),
                                &[vrec, i],
                            );
                        }
                        if let Some(ack) = st.flushed {
                            if f.vs.contains(&(proc.clone(), group.clone())) {
                                rep.add(
                                    "X1",
                                    format!(
                                        "{} sent {msg} after acknowledging the flush of {cur}",
                                        r.p
                                    ),
                                    &[ack, i],
                                );
                            }
                        }
                    }
                }
                f.sends.push(Send {
                    proc: proc.clone(),
                    group: group.clone(),
                    msg: msg.clone(),
                    service: *service,
                    view: view.clone(),
                    payload: payload.clone(),
                    rec: i,
                    t: r.t,
                    pos,
                    open: false,
                });
                f.timeline.entry(proc).or_default().push(Step::Send);
            }
            Event::OpenSend {
                group,
                msg,
                service,
                payload,
            } => {
                f.sends.push(Send {
                    proc: proc.clone(),
                    group: group.clone(),
                    msg: msg.clone(),
                    service: *service,
                    view: ViewId(u64::MAX, "open".into()),
                    payload: payload.clone(),
                    rec: i,
                    t: r.t,
                    pos,
                    open: true,
                });
                f.timeline.entry(proc).or_default().push(Step::Send);
            }
            Event::Deliver {
                group,
                msg,
                sender,
                service,
                view,
                transitional,
                payload,
            } => {
                let mut in_trans = *transitional;
                match state.get(&(proc.clone(), group.clone())) {
                    None => {
                        let left = f
                            .leaves
                            .iter()
                            .rev()
                            .find(|(p, g, _, _)| *p == proc && g == group);
                        match left {
                            Some((_, _, lrec, _)) => rep.add(
                                "X3",
                                format!("{} delivered {msg} of {group} after leaving it", r.p),
                                &[*lrec, i],
                            ),
                            None => rep.add(
                                "M3",
                                format!("{} delivered {msg} of {group} outside any view", r.p),
                                &[i],
                            ),
                        }
                    }
                    Some(st) => {
                        let (cur, vrec) = st.view.clone().expect("state exists with a view");
                        in_trans = st.in_trans;
                        if &cur != view {
                            rep.add(
                                "M3",
                                format!(
                                    "{} delivered {msg} naming view {view} while in view {cur}",
                                    r.p
                                ),
                                &[vrec, i],
                            );
                        }
                        if st.in_trans != *transitional {
                            rep.add(
                                "M3",
                                format!(
                                    "{} delivered {msg} marked transitional={transitional} in the {} part of {cur}",
                                    r.p,
                                    if st.in_trans { "transitional" } else { "regular" }
                                ),
                                &[vrec, i],
                            );
                        }
                    }
                }
                f.deliveries.push(Delivery {
                    proc: proc.clone(),
                    group: group.clone(),
                    msg: msg.clone(),
                    sender: sender.clone(),
                    service: *service,
                    view: view.clone(),
                    in_trans,
                    payload: payload.clone(),
                    rec: i,
                    t: r.t,
                });
                f.timeline
                    .entry(proc)
                    .or_default()
                    .push(Step::Deliver(f.deliveries.len() - 1));
            }
        }
    }
    f
}

/// Checks a history; an empty result means every property holds.
pub fn check(records: &[Record], cfg: &Config) -> Vec<Violation> {
    let mut rep = Report {
        records,
        out: Vec::new(),
        counts: HashMap::new(),
    };
    let f = gather(records, &mut rep);
    membership(&f, &mut rep);
    integrity(&f, &mut rep);
    delivery_view(&f, &mut rep);
    synchrony(&f, &mut rep);
    order(&f, &mut rep);
    safe(&f, &mut rep);
    liveness(&f, cfg, &mut rep);
    secure(records, &f, &mut rep);
    daemons_key(records, &mut rep);
    group_keys(records, &mut rep);
    rep.out
}

/// (group, view) -> members, from the first installation seen.
fn view_members(f: &Facts) -> HashMap<(String, ViewId), (Vec<String>, usize)> {
    let mut m = HashMap::new();
    for ins in &f.installs {
        m.entry((ins.group.clone(), ins.view.clone()))
            .or_insert_with(|| (ins.members.clone(), ins.rec));
    }
    m
}

/// (process name, group, view) -> the installation (first incarnation that installed it).
fn install_index(f: &Facts) -> HashMap<(String, String, ViewId), usize> {
    let mut m = HashMap::new();
    for (i, ins) in f.installs.iter().enumerate() {
        m.entry((ins.proc.0.clone(), ins.group.clone(), ins.view.clone()))
            .or_insert(i);
    }
    m
}

/// For each delivery record: the next installation of the same group by the same process.
fn next_installs(f: &Facts) -> HashMap<usize, usize> {
    let mut out = HashMap::new();
    for steps in f.timeline.values() {
        let mut pending: Vec<usize> = Vec::new();
        for st in steps {
            match st {
                Step::Deliver(d) => pending.push(*d),
                Step::Install(i) => {
                    let g = &f.installs[*i].group;
                    pending.retain(|d| {
                        if &f.deliveries[*d].group == g {
                            out.insert(f.deliveries[*d].rec, *i);
                            false
                        } else {
                            true
                        }
                    });
                }
                _ => {}
            }
        }
    }
    out
}
