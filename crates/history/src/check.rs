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

use crate::record::{Event, Record, Service, ViewId};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

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

fn membership(f: &Facts, rep: &mut Report<'_>) {
    let members = view_members(f);
    let index = install_index(f);
    let mut last: HashMap<(Proc, String), (ViewId, usize)> = HashMap::new();
    let mut seen: HashSet<(Proc, String, ViewId)> = HashSet::new();
    for ins in &f.installs {
        let who = &ins.proc.0;
        // M1
        if !ins.members.contains(who) {
            rep.add(
                "M1",
                format!(
                    "{who} installed view {} of {} without itself",
                    ins.view, ins.group
                ),
                &[ins.rec],
            );
        }
        // M2
        let key = (ins.proc.clone(), ins.group.clone());
        if !seen.insert((ins.proc.clone(), ins.group.clone(), ins.view.clone())) {
            rep.add(
                "M2",
                format!("{who} installed view {} of {} twice", ins.view, ins.group),
                &[ins.rec],
            );
        }
        if let Some((prev, prec)) = last.get(&key) {
            if ins.view.0 <= prev.0 {
                rep.add(
                    "M2",
                    format!(
                        "{who}: view {} of {} after view {prev}",
                        ins.view, ins.group
                    ),
                    &[*prec, ins.rec],
                );
            }
        }
        last.insert(key, (ins.view.clone(), ins.rec));
        // M4
        let (canon, crec) = &members[&(ins.group.clone(), ins.view.clone())];
        if canon != &ins.members {
            rep.add(
                "M4",
                format!(
                    "view {} of {} has members {:?} at {who} but {:?} elsewhere",
                    ins.view, ins.group, ins.members, canon
                ),
                &[*crec, ins.rec],
            );
        }
        // M5
        if !ins.trans.contains(who) {
            rep.add(
                "M5",
                format!("{who}'s transitional set for {} lacks itself", ins.view),
                &[ins.rec],
            );
        }
        for q in &ins.trans {
            if !ins.members.contains(q) {
                rep.add(
                    "M5",
                    format!(
                        "{who}'s transitional set for {} holds {q}, not a member",
                        ins.view
                    ),
                    &[ins.rec],
                );
                continue;
            }
            if q == who {
                continue;
            }
            match index.get(&(q.clone(), ins.group.clone(), ins.view.clone())) {
                Some(&qi) => {
                    let qins = &f.installs[qi];
                    if qins.prev.is_none() || qins.prev != ins.prev {
                        rep.add(
                            "M5",
                            format!(
                                "{who} lists {q} in the transitional set of {}, but {q} came from {:?}, {who} from {:?}",
                                ins.view, qins.prev, ins.prev
                            ),
                            &[ins.rec, qins.rec],
                        );
                    } else {
                        let a: BTreeSet<&String> = ins.trans.iter().collect();
                        let b: BTreeSet<&String> = qins.trans.iter().collect();
                        if a != b {
                            rep.add(
                                "M5",
                                format!(
                                    "{who} and {q} moved together into {} with different transitional sets",
                                    ins.view
                                ),
                                &[ins.rec, qins.rec],
                            );
                        }
                    }
                }
                None if f.crashed.keys().any(|p| &p.0 == q) => {}
                None => {
                    // q may not have installed it yet when the history ends; nothing to judge.
                }
            }
        }
    }
}

fn integrity(f: &Facts, rep: &mut Report<'_>) {
    let mut sends: HashMap<&str, &Send> = HashMap::new();
    for s in &f.sends {
        sends.entry(s.msg.as_str()).or_insert(s);
    }
    let mut delivered: HashMap<(&Proc, &str, &str), usize> = HashMap::new();
    for d in &f.deliveries {
        // I1
        match sends.get(d.msg.as_str()) {
            None => rep.add(
                "I1",
                format!("{} delivered {}, which nobody sent", d.proc.0, d.msg),
                &[d.rec],
            ),
            Some(s) => {
                if s.payload != d.payload || s.t > d.t {
                    rep.add(
                        "I1",
                        format!("{} delivered {} unlike its send", d.proc.0, d.msg),
                        &[s.rec, d.rec],
                    );
                }
            }
        }
        // I2
        if let Some(prev) = delivered.insert((&d.proc, d.group.as_str(), d.msg.as_str()), d.rec) {
            rep.add(
                "I2",
                format!("{} delivered {} twice", d.proc.0, d.msg),
                &[prev, d.rec],
            );
        }
    }
    // I3: a sender that goes on delivers its own message in the view it was sent in.
    let mut own: HashSet<(&Proc, &str)> = HashSet::new();
    for d in &f.deliveries {
        if d.proc.0 == d.sender {
            own.insert((&d.proc, d.msg.as_str()));
        }
    }
    for s in &f.sends {
        if own.contains(&(&s.proc, s.msg.as_str())) || f.crashed.contains_key(&s.proc) {
            continue;
        }
        let later_view = f.timeline[&s.proc][s.pos..].iter().find_map(|st| match st {
            Step::Install(i) if f.installs[*i].group == s.group => Some(*i),
            Step::Leave(l) if f.leaves[*l].1 == s.group => Some(usize::MAX),
            _ => None,
        });
        let stable_member = f
            .stable
            .as_ref()
            .is_some_and(|(_, ps, _)| ps.contains(&s.proc.0));
        match later_view {
            Some(usize::MAX) => {}
            Some(i) => rep.add(
                "I3",
                format!(
                    "{} sent {} in {} and installed {} without delivering it",
                    s.proc.0, s.msg, s.view, f.installs[i].view
                ),
                &[s.rec, f.installs[i].rec],
            ),
            None if stable_member && s.service != Service::Unreliable => rep.add(
                "I3",
                format!("{} never delivered its own {}", s.proc.0, s.msg),
                &[s.rec],
            ),
            None => {}
        }
    }
}

fn delivery_view(f: &Facts, rep: &mut Report<'_>) {
    let members = view_members(f);
    let mut sends: HashMap<&str, &Send> = HashMap::new();
    for s in &f.sends {
        sends.entry(s.msg.as_str()).or_insert(s);
    }
    for d in &f.deliveries {
        // X2 (and, for EVS, part of M3): the sender is a member of the delivery view.
        if let Some((m, vrec)) = members.get(&(d.group.clone(), d.view.clone())) {
            if !m.contains(&d.sender) {
                rep.add(
                    "X2",
                    format!(
                        "{} delivered {} from {} in {}, which does not hold the sender",
                        d.proc.0, d.msg, d.sender, d.view
                    ),
                    &[*vrec, d.rec],
                );
            }
        }
        let Some(s) = sends.get(d.msg.as_str()) else {
            continue;
        };
        if s.view != d.view {
            let vs = f.vs.contains(&(d.proc.clone(), d.group.clone()));
            rep.add(
                if vs { "D1" } else { "D2" },
                format!(
                    "{} delivered {} in {} but it was sent in {}",
                    d.proc.0, d.msg, d.view, s.view
                ),
                &[s.rec, d.rec],
            );
        }
    }
    // D2: receivers that move together agree on regular or transitional delivery.
    let next = next_installs(f);
    let mut by_msg: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for d in &f.deliveries {
        by_msg.entry(d.msg.as_str()).or_default().push(d);
    }
    for ds in by_msg.values() {
        for (i, a) in ds.iter().enumerate() {
            for b in &ds[i + 1..] {
                if a.in_trans == b.in_trans || a.view != b.view {
                    continue;
                }
                let (Some(na), Some(nb)) = (next.get(&a.rec), next.get(&b.rec)) else {
                    continue;
                };
                let (ia, ib) = (&f.installs[*na], &f.installs[*nb]);
                if ia.view == ib.view && ia.trans.contains(&b.proc.0) {
                    rep.add(
                        "D2",
                        format!(
                            "{} and {} moved together from {} but delivered {} in different parts of it",
                            a.proc.0, b.proc.0, a.view, a.msg
                        ),
                        &[a.rec, b.rec],
                    );
                }
            }
        }
    }
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

fn synchrony(f: &Facts, rep: &mut Report<'_>) {
    // Deliveries per (process incarnation, group, view).
    let mut sets: HashMap<(&Proc, &str, &ViewId), BTreeSet<&str>> = HashMap::new();
    for d in &f.deliveries {
        sets.entry((&d.proc, d.group.as_str(), &d.view))
            .or_default()
            .insert(d.msg.as_str());
    }
    let empty = BTreeSet::new();
    // V1: processes that move together from V to V' delivered the same set in V.
    let mut by_view: HashMap<(&str, &ViewId), Vec<&Install>> = HashMap::new();
    for ins in &f.installs {
        by_view
            .entry((ins.group.as_str(), &ins.view))
            .or_default()
            .push(ins);
    }
    for group in by_view.values() {
        for (i, a) in group.iter().enumerate() {
            for b in &group[i + 1..] {
                let Some(prev) = &a.prev else { continue };
                if b.prev.as_ref() != Some(prev)
                    || !a.trans.contains(&b.proc.0)
                    || !b.trans.contains(&a.proc.0)
                {
                    continue;
                }
                let sa = sets
                    .get(&(&a.proc, a.group.as_str(), prev))
                    .unwrap_or(&empty);
                let sb = sets
                    .get(&(&b.proc, b.group.as_str(), prev))
                    .unwrap_or(&empty);
                if sa != sb {
                    let only_a: Vec<_> = sa.difference(sb).take(3).collect();
                    let only_b: Vec<_> = sb.difference(sa).take(3).collect();
                    let mut recs = vec![a.rec, b.rec];
                    recs.extend(
                        f.deliveries
                            .iter()
                            .filter(|d| {
                                d.view == *prev
                                    && (only_a.contains(&&d.msg.as_str())
                                        || only_b.contains(&&d.msg.as_str()))
                            })
                            .map(|d| d.rec)
                            .take(3),
                    );
                    rep.add(
                        "V1",
                        format!(
                            "{} and {} moved together from {prev} to {} but delivered different messages in {prev}: only {}: {:?}, only {}: {:?}",
                            a.proc.0, b.proc.0, a.view, a.proc.0, only_a, b.proc.0, only_b
                        ),
                        &recs,
                    );
                }
            }
        }
    }
    // V2: if p delivered m before installing V', nobody installs V' before delivering m.
    let mut after: HashMap<&str, HashMap<(&str, &ViewId), usize>> = HashMap::new();
    let mut before: Vec<(&Delivery, Installed<'_>)> = Vec::new();
    for steps in f.timeline.values() {
        let mut installed: Vec<(&str, &ViewId, usize)> = Vec::new();
        let mut delivered: Vec<&Delivery> = Vec::new();
        for st in steps {
            match st {
                Step::Install(i) => {
                    let ins = &f.installs[*i];
                    for d in &delivered {
                        after
                            .entry(d.msg.as_str())
                            .or_default()
                            .entry((ins.group.as_str(), &ins.view))
                            .or_insert(ins.rec);
                    }
                    installed.push((ins.group.as_str(), &ins.view, ins.rec));
                }
                Step::Deliver(d) => {
                    let d = &f.deliveries[*d];
                    before.push((d, installed.clone()));
                    delivered.push(d);
                }
                _ => {}
            }
        }
    }
    for (d, installed) in before {
        let Some(a) = after.get(d.msg.as_str()) else {
            continue;
        };
        for (g, v, rec) in installed {
            if let Some(other) = a.get(&(g, v)) {
                rep.add(
                    "V2",
                    format!(
                        "{} delivered {} after installing {v}, which another process installed after delivering it",
                        d.proc.0, d.msg
                    ),
                    &[*other, rec, d.rec],
                );
                break;
            }
        }
    }
}

fn order(f: &Facts, rep: &mut Report<'_>) {
    let mut sends: HashMap<&str, &Send> = HashMap::new();
    for s in &f.sends {
        sends.entry(s.msg.as_str()).or_insert(s);
    }
    // O1: the place of each FIFO-or-stronger message in its sender's sends of that view.
    let mut send_index: HashMap<&str, usize> = HashMap::new();
    let mut sender_count: HashMap<(&Proc, &str, &ViewId), usize> = HashMap::new();
    for s in &f.sends {
        if s.service.at_least_fifo() {
            let c = sender_count
                .entry((&s.proc, s.group.as_str(), &s.view))
                .or_default();
            send_index.insert(s.msg.as_str(), *c);
            *c += 1;
        }
    }
    // O2: vector clocks of the causal-or-stronger messages, within their view.
    let clocks = causal_clocks(f);
    for (proc, steps) in &f.timeline {
        // Per sender and view: FIFO messages delivered in order so far; causal ones, counted.
        let mut next: HashMap<(&str, &str, &ViewId), usize> = HashMap::new();
        let mut causal_got: HashMap<(&str, &str, &ViewId), u32> = HashMap::new();
        for st in steps {
            let Step::Deliver(di) = st else { continue };
            let d = &f.deliveries[*di];
            let Some(s) = sends.get(d.msg.as_str()) else {
                continue;
            };
            let key = (s.proc.0.as_str(), d.group.as_str(), &s.view);
            if let (true, Some(&k)) = (d.service.at_least_fifo(), send_index.get(d.msg.as_str())) {
                let n = next.entry(key).or_default();
                // In a regular view no hole and no reversal; in the transitional part holes are
                // allowed, reversals are not.
                if k < *n || (!d.in_trans && k > *n) {
                    rep.add(
                        "O1",
                        format!(
                            "{} delivered {} (number {} from {} in {}) after {} of that sender's messages",
                            proc.0, d.msg, k + 1, s.proc.0, s.view, *n
                        ),
                        &[s.rec, d.rec],
                    );
                }
                *n = (*n).max(k + 1);
            }
            if d.service.at_least_causal() {
                if let (false, Some(vc)) = (d.in_trans, clocks.get(d.msg.as_str())) {
                    for (sender, need) in vc {
                        let need = if *sender == s.proc.0.as_str() {
                            need - 1
                        } else {
                            *need
                        };
                        let have = causal_got
                            .get(&(*sender, d.group.as_str(), &s.view))
                            .copied()
                            .unwrap_or(0);
                        if have < need {
                            rep.add(
                                "O2",
                                format!(
                                    "{} delivered {} having delivered {have} causal messages of {sender} in {}, but {need} precede it",
                                    proc.0, d.msg, s.view
                                ),
                                &[s.rec, d.rec],
                            );
                            break;
                        }
                    }
                }
                *causal_got.entry(key).or_default() += 1;
            }
        }
    }
    agreed(f, rep);
}

/// Vector clocks (within one view) of the causal-or-stronger messages: for each sender, how many
/// of its causal-or-stronger messages precede the message, the message itself included for its
/// own sender. The transitional part is not held to causal order across senders (FIFO holds).
fn causal_clocks(f: &Facts) -> HashMap<&str, BTreeMap<&str, u32>> {
    let mut clocks: HashMap<&str, BTreeMap<&str, u32>> = HashMap::new();
    // Process events in time order (a send precedes its deliveries); ties by record index.
    let mut events: Vec<(u64, usize, bool, usize)> = Vec::new();
    for (i, s) in f.sends.iter().enumerate() {
        if s.service.at_least_causal() {
            events.push((s.t, s.rec, true, i));
        }
    }
    for (i, d) in f.deliveries.iter().enumerate() {
        if d.service.at_least_causal() {
            events.push((d.t, d.rec, false, i));
        }
    }
    events.sort_unstable();
    let mut now: HashMap<(&Proc, &str, &ViewId), BTreeMap<&str, u32>> = HashMap::new();
    for (_, _, is_send, i) in events {
        if is_send {
            let s = &f.sends[i];
            let vc = now.entry((&s.proc, s.group.as_str(), &s.view)).or_default();
            *vc.entry(s.proc.0.as_str()).or_default() += 1;
            clocks.insert(s.msg.as_str(), vc.clone());
        } else {
            let d = &f.deliveries[i];
            if let Some(m) = clocks.get(d.msg.as_str()).cloned() {
                let vc = now.entry((&d.proc, d.group.as_str(), &d.view)).or_default();
                for (k, v) in m {
                    let e = vc.entry(k).or_default();
                    *e = (*e).max(v);
                }
            }
        }
    }
    clocks
}

/// O3: one order of agreed and safe messages and views everywhere; no holes in a regular view.
fn agreed(f: &Facts, rep: &mut Report<'_>) {
    #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
    enum Node<'a> {
        Msg(&'a str),
        View(&'a str, &'a ViewId),
    }
    let mut edges: BTreeMap<Node<'_>, BTreeSet<Node<'_>>> = BTreeMap::new();
    let mut witness: HashMap<(Node<'_>, Node<'_>), (usize, usize)> = HashMap::new();
    let mut regular: HashMap<(&str, &ViewId), Sequences<'_>> = HashMap::new();
    for (proc, steps) in &f.timeline {
        let mut prev: Option<(Node<'_>, usize)> = None;
        let mut cur_regular: HashMap<&str, (&ViewId, Vec<&Delivery>)> = HashMap::new();
        for st in steps {
            let (node, rec) = match st {
                Step::Deliver(d) => {
                    let d = &f.deliveries[*d];
                    if !d.service.at_least_agreed() {
                        continue;
                    }
                    if !d.in_trans {
                        cur_regular
                            .entry(d.group.as_str())
                            .or_insert_with(|| (&d.view, Vec::new()))
                            .1
                            .push(d);
                    }
                    (Node::Msg(d.msg.as_str()), d.rec)
                }
                Step::Install(i) => {
                    let ins = &f.installs[*i];
                    if let Some((v, ds)) = cur_regular.remove(ins.group.as_str()) {
                        regular
                            .entry((ins.group.as_str(), v))
                            .or_default()
                            .push((proc, ds));
                    }
                    (Node::View(ins.group.as_str(), &ins.view), ins.rec)
                }
                _ => continue,
            };
            if let Some((p, prec)) = prev.take() {
                if p != node {
                    witness
                        .entry((p.clone(), node.clone()))
                        .or_insert((prec, rec));
                    edges.entry(p).or_default().insert(node.clone());
                }
            }
            prev = Some((node, rec));
        }
        for (g, (v, ds)) in cur_regular {
            regular.entry((g, v)).or_default().push((proc, ds));
        }
    }
    // Cycle detection (Kahn); the nodes left over lie on or behind a cycle.
    let mut indeg: BTreeMap<&Node<'_>, usize> = BTreeMap::new();
    for (a, bs) in &edges {
        indeg.entry(a).or_default();
        for b in bs {
            *indeg.entry(b).or_default() += 1;
        }
    }
    let mut ready: Vec<&Node<'_>> = indeg
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(n, _)| *n)
        .collect();
    let mut done = 0;
    while let Some(n) = ready.pop() {
        done += 1;
        if let Some(bs) = edges.get(n) {
            for b in bs {
                let d = indeg.get_mut(b).expect("counted");
                *d -= 1;
                if *d == 0 {
                    ready.push(b);
                }
            }
        }
    }
    if done < indeg.len() {
        // Name one edge inside the cycle.
        let left: BTreeSet<&Node<'_>> = indeg
            .iter()
            .filter(|(_, d)| **d > 0)
            .map(|(n, _)| *n)
            .collect();
        let mut recs = Vec::new();
        let mut names = Vec::new();
        for (a, bs) in &edges {
            if !left.contains(a) {
                continue;
            }
            for b in bs {
                if left.contains(b) {
                    if let Some((x, y)) = witness.get(&(a.clone(), b.clone())) {
                        recs.push(*x);
                        recs.push(*y);
                    }
                    let name = |n: &Node<'_>| match n {
                        Node::Msg(m) => m.to_string(),
                        Node::View(g, v) => format!("view {v} of {g}"),
                    };
                    names.push(format!("{} before {}", name(a), name(b)));
                }
            }
            if names.len() >= 3 {
                break;
            }
        }
        rep.add(
            "O3",
            format!("the agreed order has a cycle: {}", names.join(", ")),
            &recs,
        );
    }
    // No holes: in a regular view, every member's agreed deliveries are a prefix of one order.
    for ((g, v), seqs) in regular {
        let Some((lp, longest)) = seqs.iter().max_by_key(|(_, s)| s.len()) else {
            continue;
        };
        for (p, s) in &seqs {
            if let Some(k) = s
                .iter()
                .zip(longest.iter())
                .position(|(a, b)| a.msg != b.msg)
            {
                rep.add(
                    "O3",
                    format!(
                        "in regular view {v} of {g}, {} delivered {} where {} delivered {}",
                        p.0, s[k].msg, lp.0, longest[k].msg
                    ),
                    &[s[k].rec, longest[k].rec],
                );
            }
        }
    }
}

/// O4: a safe message reaches every member that the delivering process had in its view (regular
/// part) or transitional set (transitional part), unless that member crashed.
fn safe(f: &Facts, rep: &mut Report<'_>) {
    let members = view_members(f);
    let next = next_installs(f);
    let mut delivered: HashSet<(&str, &str, &str)> = HashSet::new();
    for d in &f.deliveries {
        delivered.insert((d.proc.0.as_str(), d.group.as_str(), d.msg.as_str()));
    }
    // (process, group, view) -> whether the process went on past that view.
    let mut moved_on: HashSet<(&str, &str, &ViewId)> = HashSet::new();
    for ins in &f.installs {
        if let Some(prev) = &ins.prev {
            moved_on.insert((ins.proc.0.as_str(), ins.group.as_str(), prev));
        }
    }
    let crashed: HashSet<&str> = f.crashed.keys().map(|p| p.0.as_str()).collect();
    let mut reported: HashSet<&str> = HashSet::new();
    for d in &f.deliveries {
        if d.service != Service::Safe || reported.contains(d.msg.as_str()) {
            continue;
        }
        let must: Vec<String> = if d.in_trans {
            match next.get(&d.rec) {
                Some(i) => f.installs[*i].trans.clone(),
                None => continue,
            }
        } else {
            match members.get(&(d.group.clone(), d.view.clone())) {
                Some((m, _)) => m.clone(),
                None => continue,
            }
        };
        for q in &must {
            if crashed.contains(q.as_str())
                || delivered.contains(&(q.as_str(), d.group.as_str(), d.msg.as_str()))
            {
                continue;
            }
            if moved_on.contains(&(q.as_str(), d.group.as_str(), &d.view)) {
                reported.insert(d.msg.as_str());
                rep.add(
                    "O4",
                    format!(
                        "{} delivered safe {} in the {} part of {}, but {q} went past that view without it",
                        d.proc.0,
                        d.msg,
                        if d.in_trans { "transitional" } else { "regular" },
                        d.view
                    ),
                    &[d.rec],
                );
                break;
            }
        }
    }
}

fn liveness(f: &Facts, cfg: &Config, rep: &mut Report<'_>) {
    let Some((t_stable, procs, srec)) = &f.stable else {
        return;
    };
    let alive: BTreeSet<&str> = procs.iter().map(String::as_str).collect();
    // The latest incarnation of each stable process, and the groups it is in at the end. An
    // incarnation that crashed is over: a process listed as alive runs a later one (which may
    // not have done anything yet).
    let mut latest: BTreeMap<&str, &Proc> = BTreeMap::new();
    for p in f.timeline.keys().chain(f.joined_at_end.keys()) {
        if alive.contains(p.0.as_str()) && !f.crashed.contains_key(p) {
            let e = latest.entry(p.0.as_str()).or_insert(p);
            if p.1 > e.1 {
                *e = p;
            }
        }
    }
    let mut groups: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (name, proc) in &latest {
        if let Some(gs) = f.joined_at_end.get(*proc) {
            for g in gs {
                groups.entry(g.as_str()).or_default().insert(name);
            }
        }
    }
    for (g, should) in groups {
        let mut finals: BTreeMap<&str, &Install> = BTreeMap::new();
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for ins in &f.installs {
            if ins.group == g && Some(&&ins.proc) == latest.get(ins.proc.0.as_str()) {
                finals.insert(ins.proc.0.as_str(), ins);
                if ins.t > *t_stable {
                    *counts.entry(ins.proc.0.as_str()).or_default() += 1;
                }
            }
        }
        // L1
        let mut final_view: Option<&Install> = None;
        for p in &should {
            let Some(ins) = finals.get(p) else {
                rep.add("L1", format!("{p} never installed a view of {g}"), &[*srec]);
                continue;
            };
            let have: BTreeSet<&str> = ins.members.iter().map(String::as_str).collect();
            if have != should {
                rep.add(
                    "L1",
                    format!(
                        "{p}'s final view {} of {g} has members {:?}, the connected members are {:?}",
                        ins.view, have, should
                    ),
                    &[*srec, ins.rec],
                );
            }
            match final_view {
                None => final_view = Some(ins),
                Some(fv) if fv.view != ins.view => rep.add(
                    "L1",
                    format!(
                        "{} and {p} end in different views of {g}: {} and {}",
                        fv.proc.0, fv.view, ins.view
                    ),
                    &[fv.rec, ins.rec],
                ),
                _ => {}
            }
        }
        // L2: everything sent in the final view reaches every member of it.
        if let Some(fv) = final_view {
            let delivered: HashSet<(&str, &str)> = f
                .deliveries
                .iter()
                .filter(|d| d.group == g && d.view == fv.view)
                .map(|d| (d.proc.0.as_str(), d.msg.as_str()))
                .collect();
            for s in f.sends.iter().filter(|s| s.group == g && s.view == fv.view) {
                if s.service == Service::Unreliable {
                    continue;
                }
                for p in &should {
                    if !delivered.contains(&(*p, s.msg.as_str())) {
                        rep.add(
                            "L2",
                            format!(
                                "{p} never delivered {}, sent in the final view {} of {g}",
                                s.msg, fv.view
                            ),
                            &[s.rec, *srec],
                        );
                    }
                }
            }
        }
        // L3
        for (p, c) in counts {
            if c > cfg.max_views_after_stable {
                rep.add(
                    "L3",
                    format!("{p} installed {c} views of {g} after the network settled"),
                    &[*srec],
                );
            }
        }
    }
}
