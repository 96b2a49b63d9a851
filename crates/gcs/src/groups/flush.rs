//! Changes of a group's membership and the flush that installs each new view (docs/gcs.md).

use super::*;

impl Daemon {
    pub(super) fn queue_change(&mut self, group: &str, change: Change) {
        // During the state exchange, changes wait for the new group map.
        if self.sync_backlog.is_some() {
            self.wait_for_sync(Some(group.to_owned()), change);
            return;
        }
        // Only groups that exist (a join creates one); a bounded number per client is enforced
        // where clients join.
        if !self.groups.contains_key(group) && !matches!(change, Change::Join(_)) {
            self.consumed(&change);
            return;
        }
        let count = self.first_count;
        self.groups
            .entry(group.to_owned())
            .or_insert_with(|| Group {
                count,
                ..Group::default()
            })
            .pending
            .push_back(change);
        if self.syncing.is_none() {
            self.advance(group);
        }
    }

    /// Starts, continues or ends the flush of `group`.
    pub(super) fn advance(&mut self, group: &str) {
        if self.syncing.is_some() {
            return;
        }
        loop {
            let me = self.me;
            let Some(g) = self.groups.get_mut(group) else {
                return;
            };
            if g.flush.is_none() {
                let Some(change) = g.pending.pop_front() else {
                    if g.members.is_empty() {
                        self.first_count = self.first_count.max(g.count);
                        self.groups.remove(group);
                    }
                    return;
                };
                if !changes_anything(&g.members, &change) {
                    self.consumed(&change);
                    continue;
                }
                let need: BTreeSet<DaemonId> = g.members.iter().map(|m| m.daemon).collect();
                g.flush = Some(Flush {
                    need,
                    got: BTreeSet::new(),
                    awaiting: BTreeSet::new(),
                    acked: BTreeSet::new(),
                    marker_sent: false,
                    change,
                    deadline: self.now
                        + std::time::Duration::from_millis(self.cfg.flush_timeout_ms),
                });
                // The VS clients here that hold the view being closed (a member of the same name
                // that has not installed it is a later connection, or one that left and joined
                // again: it has nothing to flush).
                let awaiting: Vec<String> = self
                    .local_members(group)
                    .into_iter()
                    .filter(|c| self.clients[c].groups.get(group) == Some(&true))
                    .collect();
                // (Local members exist only where the group has a view.)
                let view = self.groups[group].view;
                for (c, view) in awaiting.into_iter().zip(std::iter::repeat(view)) {
                    let Some(view) = view else { break };
                    self.emit(
                        &c,
                        ClientEvent::FlushRequest {
                            group: group.to_owned(),
                            view,
                        },
                    );
                    if let Some(f) = self.groups.get_mut(group).and_then(|g| g.flush.as_mut()) {
                        f.awaiting.insert(c);
                    }
                }
                if let Some(f) = self.groups[group].flush.as_ref() {
                    if !f.awaiting.is_empty() {
                        let at = std::cmp::Reverse((f.deadline, group.to_owned()));
                        self.flush_deadlines.get_mut().push(at);
                    }
                }
            }
            let g = self.groups.get_mut(group).expect("present");
            let index = g.view.map_or(0, |v| v.index);
            let f = g.flush.as_mut().expect("flushing");
            if f.need.contains(&me) && !f.marker_sent && f.awaiting.is_empty() {
                f.marker_sent = true;
                self.ring.submit_control(Body::Flushed {
                    group: group.to_owned(),
                    view: index,
                });
            }
            if !f.got.is_superset(&f.need) {
                return;
            }
            // Every change delivered meanwhile goes into the same view: each daemon has the same
            // ones queued when the last marker arrives, and a burst of joins and leaves costs one
            // flush.
            let f = g.flush.take().expect("flushing");
            let mut changes = vec![f.change];
            changes.extend(g.pending.drain(..));
            self.install_changes(group, changes);
        }
    }

    pub(super) fn next_view(&mut self, group: &str) -> GroupViewId {
        let ring = self.config.as_ref().expect("a configuration").0;
        let g = self.groups.get_mut(group).expect("present");
        let id = GroupViewId {
            ring,
            index: g.count,
        };
        g.count += 1;
        g.view = Some(id);
        id
    }

    /// A join or leave has been applied to a view, or dropped: its client may send another.
    /// Keeps a change delivered during the state exchange for the new group map, within
    /// [`MAX_SYNC_BACKLOG`]. Past it the change is dropped, as it is at every daemon: they all
    /// deliver the same changes in the same order, so they all drop the same ones and their
    /// group maps stay equal.
    pub(super) fn wait_for_sync(&mut self, group: Option<String>, change: Change) {
        let Some(backlog) = &mut self.sync_backlog else {
            return;
        };
        if backlog.len() < MAX_SYNC_BACKLOG {
            backlog.push((group, change));
        } else {
            self.sync_dropped += 1;
            self.consumed(&change);
        }
    }

    pub(super) fn consumed(&mut self, change: &Change) {
        let client = match change {
            Change::Join(m) if m.daemon == self.me => &m.name,
            Change::Leave(n, d) if *d == self.me => n,
            _ => return,
        };
        if let Some(c) = self.clients.get_mut(client) {
            c.changes = c.changes.saturating_sub(1);
        }
    }

    /// Installs the view that `changes` make of the current one (the reason is the first's).
    pub(super) fn install_changes(&mut self, group: &str, changes: Vec<Change>) {
        for c in &changes {
            self.consumed(c);
        }
        let g = self.groups.get_mut(group).expect("present");
        let old: Vec<String> = g.members.iter().map(|m| m.name.clone()).collect();
        let mut joiners = Vec::new();
        let mut reason = None;
        for change in changes {
            let r = match change {
                Change::Join(m) => {
                    // Past the limit a join is ignored, the same way everywhere.
                    let room = g.members.len() < MAX_VIEW_MEMBERS;
                    if room && !g.members.iter().any(|x| x.name == m.name) {
                        joiners.push(m.name.clone());
                        g.members.push(m);
                    }
                    Reason::Join
                }
                Change::Leave(n, d) => {
                    g.members.retain(|m| m.name != n || m.daemon != d);
                    joiners.retain(|j| *j != n);
                    Reason::Leave
                }
                Change::Gone(n, d) => {
                    g.members.retain(|m| m.name != n || m.daemon != d);
                    joiners.retain(|j| *j != n);
                    Reason::Disconnect
                }
            };
            reason.get_or_insert(r);
        }
        g.members.sort_by(|a, b| a.name.cmp(&b.name));
        let view = self.next_view(group);
        let members: Vec<String> = self.groups[group]
            .members
            .iter()
            .map(|m| m.name.clone())
            .collect();
        let reason = reason.unwrap_or(Reason::Join);
        // One who left and joined again within the batch comes alone.
        let stayed: Vec<String> = old.into_iter().filter(|m| !joiners.contains(m)).collect();
        self.emit_view(group, view, &members, &stayed, reason, &joiners);
    }
}

/// Whether applying `change` to a view of `members` changes it.
fn changes_anything(members: &[Member], change: &Change) -> bool {
    match change {
        Change::Join(m) => !members.iter().any(|x| x.name == m.name),
        Change::Leave(n, d) | Change::Gone(n, d) => {
            members.iter().any(|x| &x.name == n && x.daemon == *d)
        }
    }
}
