//! Integrity: I1 no delivery without a send, I2 no duplicate delivery, I3 self-delivery.

use super::*;

pub(super) fn integrity(f: &Facts, rep: &mut Report<'_>) {
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
        if s.open || own.contains(&(&s.proc, s.msg.as_str())) || f.crashed.contains_key(&s.proc) {
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
