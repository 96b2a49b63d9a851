//! Membership: M1 self-inclusion, M2 local monotonicity, M4 view agreement, M5 transitional
//! sets. (M3, sends and deliveries inside installed views, is checked as the history is
//! gathered.)

use super::*;

pub(super) fn membership(f: &Facts, rep: &mut Report<'_>) {
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
