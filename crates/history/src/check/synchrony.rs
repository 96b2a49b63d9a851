//! Virtual synchrony: V1 processes that move together delivered the same messages, V2 a message
//! delivered before a view is delivered before it everywhere.

use super::*;

pub(super) fn synchrony(f: &Facts, rep: &mut Report<'_>) {
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
