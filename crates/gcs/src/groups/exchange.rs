//! Configuration changes: the transitional signal, then the state exchange (every daemon's
//! group memberships) and each group's view on the new configuration.

use super::*;

impl Daemon {
    pub(super) fn on_ring(&mut self, ev: RingEvent) {
        match ev {
            RingEvent::Sent { .. } => {}
            RingEvent::TransitionalSignal { ring } => {
                let names: Vec<String> = self.groups.keys().cloned().collect();
                for g in names {
                    // Only views of the ring that ends have a transitional part.
                    if self.groups[&g].view.is_some_and(|v| v.ring == ring) {
                        for c in self.local_members(&g) {
                            self.emit(&c, ClientEvent::TransitionalSignal { group: g.clone() });
                        }
                    }
                    if let Some(gr) = self.groups.get_mut(&g) {
                        // The state exchange decides what the ring could not finish.
                        gr.flush = None;
                        gr.pending.clear();
                    }
                }
            }
            RingEvent::Configuration(c) => {
                // A client's view counts as where it comes from only if it is a view of the
                // ring that just ended: after a ring on which the groups never settled, the
                // daemons that come together did not necessarily come together from the
                // client's view, and may have delivered different parts of it.
                let previous = self.config.as_ref().map(|c| c.0);
                self.config = Some((c.ring, c.members.clone(), c.transitional.clone()));
                self.syncing = Some(BTreeMap::new());
                self.sync_backlog = Some(Vec::new());
                for g in self.groups.values_mut() {
                    g.flush = None;
                    g.pending.clear();
                }
                // Every change a client sent went on the ring that ended: applied, or left to
                // the state exchange.
                for c in self.clients.values_mut() {
                    c.changes = 0;
                }
                let mut members = StateEntries::new();
                for (name, cl) in &self.clients {
                    for (g, vs) in &cl.groups {
                        if members.len() < MAX_STATE_ENTRIES {
                            let view = cl
                                .views
                                .get(g)
                                .filter(|v| Some(v.ring) == previous)
                                .map(|v| (v.ring, v.index));
                            members.push(name, g, *vs, view);
                        }
                    }
                }
                self.ring.submit_control(Body::GroupState { members });
            }
            RingEvent::Deliver {
                ring,
                sender,
                body,
                transitional,
                ..
            } => self.on_deliver(ring, sender, body, transitional),
        }
    }

    /// Every daemon's group state is in: each group's view on the new configuration. A member's
    /// transitional set is the members that reported the same previous view as it, from daemons
    /// that came with this one.
    pub(super) fn finish_sync(&mut self) {
        let Some(states) = self.syncing.take() else {
            return;
        };
        let backlog = self.sync_backlog.take().unwrap_or_default();
        self.first_count = 0;
        for g in self.groups.values_mut() {
            g.flush = None;
            g.pending.clear();
        }
        let (_, _, came_with) = self.config.clone().expect("a configuration");
        type Prev = Option<(RingId, u64)>;
        // Each member with its previous view if its daemon came with this one, and as reported.
        let mut next: BTreeMap<String, Vec<(Member, Prev, Prev)>> = BTreeMap::new();
        for (daemon, body) in &states {
            let Body::GroupState { members: entries } = &**body else {
                continue;
            };
            let daemon = *daemon;
            for e in entries.iter() {
                if check_name(e.client).is_err()
                    || check_name(e.group).is_err()
                    || !self.speaks_for(daemon, e.client)
                {
                    continue;
                }
                let ms = match next.get_mut(e.group) {
                    Some(ms) => ms,
                    None => next.entry(e.group.to_owned()).or_default(),
                };
                if ms.len() < MAX_VIEW_MEMBERS && !ms.iter().any(|(m, ..)| m.name == e.client) {
                    let m = Member {
                        name: e.client.to_owned(),
                        daemon,
                        vs: e.vs,
                    };
                    ms.push((m, e.view.filter(|_| came_with.contains(&daemon)), e.view));
                }
            }
        }
        let names: BTreeSet<String> = self.groups.keys().chain(next.keys()).cloned().collect();
        for group in names {
            let mut entries = next.remove(&group).unwrap_or_default();
            entries.sort_by(|a, b| a.0.name.cmp(&b.0.name));
            let g = self.groups.entry(group.clone()).or_default();
            g.count = 0;
            g.members = entries.iter().map(|(m, ..)| m.clone()).collect();
            if g.members.is_empty() {
                self.groups.remove(&group);
                continue;
            }
            let view = self.next_view(&group);
            let members: Vec<String> = entries.iter().map(|(m, ..)| m.name.clone()).collect();
            let prev_of = |c: &str| {
                entries
                    .iter()
                    .find(|(m, ..)| m.name == c)
                    .and_then(|(_, p, _)| *p)
            };
            let trans = |c: &str, had: bool| match prev_of(c) {
                Some(p) if had => entries
                    .iter()
                    .filter(|(_, q, _)| *q == Some(p))
                    .map(|(m, ..)| m.name.clone())
                    .collect(),
                _ => vec![c.to_owned()],
            };
            // Members that reported one previous view came from it together (a configuration
            // change ends every view, so members of daemons that parted have different ones);
            // one with none came alone.
            let mut sets: Vec<Vec<String>> = Vec::new();
            let mut by_prev: BTreeMap<(RingId, u64), usize> = BTreeMap::new();
            for (m, _, raw) in &entries {
                match raw.and_then(|p| by_prev.get(&p).copied()) {
                    Some(i) => sets[i].push(m.name.clone()),
                    None => {
                        if let Some(p) = raw {
                            by_prev.insert(*p, sets.len());
                        }
                        sets.push(vec![m.name.clone()]);
                    }
                }
            }
            self.emit_view_with(&group, view, &members, Reason::Network, &[], &sets, trans);
        }
        // The changes delivered meanwhile, in their order.
        for (group, change) in backlog {
            match group {
                Some(g) => self.queue_change(&g, change),
                None => {
                    let names: Vec<String> = self.groups.keys().cloned().collect();
                    for g in names {
                        self.queue_change(&g, change.clone());
                    }
                }
            }
        }
    }
}
