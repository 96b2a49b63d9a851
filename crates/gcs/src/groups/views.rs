//! Installing a view at the local clients, each with its transitional set.

use super::*;

impl Daemon {
    /// Local clients that have installed the current view of `group`.
    pub(super) fn local_members(&self, group: &str) -> Vec<String> {
        let Some(view) = self.groups.get(group).and_then(|g| g.view) else {
            return Vec::new();
        };
        self.clients
            .iter()
            .filter(|(_, c)| c.views.get(group) == Some(&view))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Installs `view` of `group` at the local clients among `members` that are in the group,
    /// each with its transitional set: `stayed` for those in `before`, itself for the others. A
    /// client with no view of the group yet gets its first one from its own join (`joiner`) or a
    /// state exchange: a member of the same name may be an earlier connection of it, whose
    /// departure is still on its way.
    pub(super) fn emit_view(
        &mut self,
        group: &str,
        view: GroupViewId,
        members: &[String],
        before: &[String],
        reason: Reason,
        joiners: &[String],
    ) {
        let stayed: Vec<String> = members
            .iter()
            .filter(|m| before.contains(m))
            .cloned()
            .collect();
        // Who the change concerns: who came, and who went (a burst of changes is one view).
        let concerned: Vec<String> = members
            .iter()
            .filter(|m| !before.contains(m))
            .chain(before.iter().filter(|b| !members.contains(b)))
            .cloned()
            .collect();
        let sets = [concerned];
        self.emit_view_with(group, view, members, reason, joiners, &sets, |c, came| {
            if came && before.iter().any(|b| b == c) {
                stayed.clone()
            } else {
                vec![c.to_owned()]
            }
        });
    }

    /// As [`Daemon::emit_view`], with each client's transitional set from `trans(client, had a
    /// view)`, and `sets` the members' sets for Spread clients.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit_view_with(
        &mut self,
        group: &str,
        view: GroupViewId,
        members: &[String],
        reason: Reason,
        joiners: &[String],
        sets: &[Vec<String>],
        trans: impl Fn(&str, bool) -> Vec<String>,
    ) {
        let local: Vec<String> = self
            .clients
            .iter()
            .filter(|(n, c)| {
                c.groups.contains_key(group)
                    && members.contains(n)
                    && (c.views.contains_key(group)
                        || reason == Reason::Network
                        || joiners.contains(n))
            })
            .map(|(n, _)| n.clone())
            .collect();
        // One list for every local member of the group.
        let shared: Option<std::sync::Arc<[String]>> = (!local.is_empty()).then(|| members.into());
        for c in local {
            // A client that installed no view of the group since it joined comes alone.
            let transitional = trans(&c, self.clients[&c].views.contains_key(group));
            let Some(cl) = self.clients.get_mut(&c) else {
                continue;
            };
            cl.views.insert(group.to_owned(), view);
            let ev = ClientEvent::View {
                group: group.to_owned(),
                view,
                members: shared.clone().unwrap_or_default(),
                transitional: transitional.into(),
                reason,
            };
            if cl.spread {
                let client = cl.id;
                self.events.push_back(LocalEvent::SpreadView {
                    client,
                    view: ev,
                    sets: sets.to_vec(),
                });
            } else {
                self.emit(&c, ev);
            }
        }
    }
}
