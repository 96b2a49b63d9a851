//! Delivery view: D1 (VS) delivery in the sending view, D2 (EVS) in it or its transitional part,
//! the same at every receiver; and X2, no message of a new member before the view that holds it.

use super::*;

pub(super) fn delivery_view(f: &Facts, rep: &mut Report<'_>) {
    let members = view_members(f);
    let mut sends: HashMap<&str, &Send> = HashMap::new();
    for s in &f.sends {
        sends.entry(s.msg.as_str()).or_insert(s);
    }
    for d in &f.deliveries {
        // A message from outside the group has no sending view to compare.
        if sends.get(d.msg.as_str()).is_some_and(|s| s.open) {
            continue;
        }
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
