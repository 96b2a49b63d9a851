//! Liveness after stabilization: L1 one final view of the stable set, L2 everything sent in it
//! delivered and safe everywhere, L3 no flapping.

use super::*;

pub(super) fn liveness(f: &Facts, cfg: &Config, rep: &mut Report<'_>) {
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
