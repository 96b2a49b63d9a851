//! Scripted steps of the named scenarios, and the crash and restart of a daemon.

use super::*;

/// Performs one scripted step.
pub(super) fn scripted(
    action: &Action,
    w: &mut World,
    wire: &mut Wire,
    alive: &mut [bool],
    armed: &mut [Option<u64>],
    touched: &mut Vec<usize>,
) {
    let n = wire.n;
    match action {
        Action::Partition(parts) => {
            wire.comp = (0..n)
                .map(|i| {
                    parts
                        .iter()
                        .position(|p| p.contains(&i))
                        .unwrap_or(parts.len() + i)
                })
                .collect();
        }
        Action::Heal => wire.comp = vec![0; n],
        Action::Crash(d) => crash(*d, w, alive),
        Action::CrashRepresentative(d) => {
            if let Some(rep) = w.nodes.get(*d).and_then(|x| x.core().membership().ring()) {
                crash(rep.rep as usize - 1, w, alive);
            }
        }
        Action::Restart(d) => {
            if *d < n && !alive[*d] {
                restart(*d, w, alive, armed);
                touched.push(*d);
            }
        }
        Action::RestartCrashed => {
            for d in 0..n {
                if !alive[d] {
                    restart(d, w, alive, armed);
                    touched.push(d);
                }
            }
        }
        Action::Join(c, group) | Action::Leave(c, group) => {
            let Some(cl) = w.clients.get(*c) else { return };
            let d = cl.daemon;
            if !alive[d] || !cl.connected() {
                return;
            }
            let join = matches!(action, Action::Join(..));
            if w.security.is_some() {
                if join {
                    w.secure_join(*c, group.clone());
                } else {
                    w.secure_leave(*c, group);
                }
                touched.push(d);
                return;
            }
            let cmd = if join {
                ClientCommand::Join {
                    group: group.clone(),
                    vs: true,
                }
            } else {
                ClientCommand::Leave {
                    group: group.clone(),
                }
            };
            w.command(*c, cmd);
            touched.push(d);
        }
    }
}

/// A daemon crashes, and its clients with it.
pub(super) fn crash(i: usize, w: &mut World, alive: &mut [bool]) {
    if i >= alive.len() || !alive[i] {
        return;
    }
    alive[i] = false;
    let di = w.dinc[i];
    w.push(&name(i as DaemonId + 1), di, Event::Crash);
    for ci in 0..w.clients.len() {
        if w.clients[ci].daemon == i {
            w.client_crash(ci);
        }
    }
}

/// A crashed daemon comes back with no state, as the next incarnation; its clients reconnect.
pub(super) fn restart(i: usize, w: &mut World, alive: &mut [bool], armed: &mut [Option<u64>]) {
    alive[i] = true;
    w.dinc[i] += 1;
    armed[i] = None;
    let inc = w.dinc[i];
    w.nodes[i] = w.node(i);
    w.push(
        &name(i as DaemonId + 1),
        inc,
        Event::Join {
            group: String::new(),
            vs: false,
        },
    );
    for ci in 0..w.clients.len() {
        if w.clients[ci].daemon == i {
            w.connect(ci);
        }
    }
}
