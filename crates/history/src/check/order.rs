//! Order: O1 FIFO, O2 causal, O3 agreed (one order of agreed and safe messages and views, across
//! components too), O4 safe.

use super::*;

pub(super) fn order(f: &Facts, rep: &mut Report<'_>) {
    let mut sends: HashMap<&str, &Send> = HashMap::new();
    for s in &f.sends {
        sends.entry(s.msg.as_str()).or_insert(s);
    }
    // O1: the place of each FIFO-or-stronger message in its sender's sends of that view.
    let mut send_index: HashMap<&str, usize> = HashMap::new();
    let mut sender_count: HashMap<(&Proc, &str, &ViewId), usize> = HashMap::new();
    for s in f.sends.iter().filter(|s| !s.open) {
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
            let Some(s) = sends.get(d.msg.as_str()).filter(|s| !s.open) else {
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
        if s.service.at_least_causal() && !s.open {
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
pub(super) fn safe(f: &Facts, rep: &mut Report<'_>) {
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
