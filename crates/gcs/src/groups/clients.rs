//! Clients' commands: accepted at once when they can go, or held per group in order until they
//! can.

use super::*;

impl Daemon {
    /// Accepts what clients have waiting, in each client's order per group, as far as it can.
    /// Returns whether anything was accepted.
    pub(super) fn pump(&mut self) -> bool {
        if !self.ready() {
            return false;
        }
        let mut any = false;
        // Called after every packet and command: while the ring takes no more messages, only a
        // queue holding an acknowledgement is worth a look.
        let submit = self.ring.can_submit();
        let queues: Vec<(String, String)> = self
            .clients
            .iter()
            .filter(|(_, c)| submit || c.held_acks > 0)
            .flat_map(|(n, c)| c.held.keys().map(move |g| (n.clone(), g.clone())))
            .collect();
        for (name, group) in queues {
            while let Some(q) = self.held_mut(&name, &group) {
                let Some(head) = q.pop_front() else {
                    break;
                };
                // A message to several groups may wait for another group's view, and a join or
                // leave for the client's earlier ones to be applied; a flush acknowledgement
                // behind them does not wait (that group's flush may be what they wait for), and
                // they then go in the next view.
                let ack = matches!(head.0, ClientCommand::FlushAck { .. });
                let bytes = command_bytes(&head.0);
                let ack_behind = match &head.0 {
                    ClientCommand::Multicast { groups, .. } if groups.len() == 1 => None,
                    _ => q
                        .iter()
                        .position(|c| matches!(c.0, ClientCommand::FlushAck { .. })),
                };
                let head = match self.try_accept(&name, head) {
                    Ok(()) => {
                        self.accepted(&name, &group, ack, bytes);
                        any = true;
                        continue;
                    }
                    Err(head) => head,
                };
                let Some(q) = self.held_mut(&name, &group) else {
                    break;
                };
                q.push_front(head);
                let Some(ack) = ack_behind.and_then(|i| q.remove(i + 1)) else {
                    break;
                };
                let ack_bytes = command_bytes(&ack.0);
                match self.try_accept(&name, ack) {
                    Ok(()) => {
                        self.accepted(&name, &group, true, ack_bytes);
                        any = true;
                    }
                    Err(ack) => {
                        if let Some(q) = self.held_mut(&name, &group) {
                            q.insert(ack_behind.unwrap_or(0) + 1, ack);
                        }
                        break;
                    }
                }
            }
        }
        any
    }

    pub(super) fn held_mut(&mut self, client: &str, group: &str) -> Option<&mut VecDeque<Held>> {
        self.clients.get_mut(client)?.held.get_mut(group)
    }

    /// A command taken from the client's queue for `group` was accepted.
    pub(super) fn accepted(&mut self, client: &str, group: &str, ack: bool, bytes: usize) {
        if let Some(c) = self.clients.get_mut(client) {
            c.held_count -= 1;
            c.held_bytes -= bytes;
            c.held_acks -= usize::from(ack);
            if c.held.get(group).is_some_and(|q| q.is_empty()) {
                c.held.remove(group);
            }
        }
    }

    /// Accepts one command if it can go now; gives it back if not.
    pub(super) fn try_accept(&mut self, client: &str, held: Held) -> Result<(), Held> {
        let (cmd, spread) = held;
        if matches!(
            cmd,
            ClientCommand::Join { .. } | ClientCommand::Leave { .. }
        ) {
            let Some(c) = self.clients.get_mut(client) else {
                return Err((cmd, spread));
            };
            if c.changes >= self.cfg.max_changes_per_client {
                return Err((cmd, spread));
            }
        }
        // Everything but an acknowledgement goes on the ring.
        if !matches!(cmd, ClientCommand::FlushAck { .. }) && !self.ring.can_submit() {
            return Err((cmd, spread));
        }
        match cmd {
            ClientCommand::Join { group, vs } => {
                self.submit(Body::GroupJoin {
                    client: client.to_owned(),
                    group: group.clone(),
                    vs,
                });
                if let Some(c) = self.clients.get_mut(client) {
                    c.groups.insert(group.clone(), vs);
                    c.changes += 1;
                }
                self.emit(client, ClientEvent::Joined { group, vs });
                Ok(())
            }
            ClientCommand::Leave { group } => {
                self.submit(Body::GroupLeave {
                    client: client.to_owned(),
                    group: group.clone(),
                });
                if let Some(c) = self.clients.get_mut(client) {
                    c.groups.remove(&group);
                    c.views.remove(&group);
                    c.changes += 1;
                }
                if let Some(f) = self.groups.get_mut(&group).and_then(|g| g.flush.as_mut()) {
                    f.awaiting.remove(client);
                }
                self.emit(
                    client,
                    ClientEvent::Left {
                        group: group.clone(),
                    },
                );
                self.advance(&group);
                Ok(())
            }
            ClientCommand::Multicast {
                service,
                groups,
                payload,
            } => {
                // Sent in the client's current view of every group, or not yet. A Spread client
                // sends to a group it is not in (or a private group) in no view of its own.
                let mut views: smallvec::SmallVec<[GroupViewId; 1]> =
                    smallvec::SmallVec::with_capacity(groups.len());
                let open = |g: &str| {
                    self.clients.get(client).is_some_and(|c| {
                        c.spread && (g.starts_with('#') || !c.groups.contains_key(g))
                    })
                };
                let ring = self.config.as_ref().map(|c| c.0);
                for group in &groups {
                    if open(group) {
                        let Some(ring) = ring else {
                            return Err((
                                ClientCommand::Multicast {
                                    service,
                                    groups,
                                    payload,
                                },
                                spread,
                            ));
                        };
                        views.push(GroupViewId {
                            ring,
                            index: OPEN_VIEW,
                        });
                        continue;
                    }
                    let view = self.groups.get(group).and_then(|g| g.view.map(|v| (g, v)));
                    let Some((g, view)) = view else {
                        return Err((
                            ClientCommand::Multicast {
                                service,
                                groups,
                                payload,
                            },
                            spread,
                        ));
                    };
                    let in_view = self
                        .clients
                        .get(client)
                        .is_some_and(|c| c.views.get(group) == Some(&view));
                    let held_back = g
                        .flush
                        .as_ref()
                        .is_some_and(|f| f.marker_sent || f.acked.contains(client));
                    if !in_view || held_back {
                        return Err((
                            ClientCommand::Multicast {
                                service,
                                groups,
                                payload,
                            },
                            spread,
                        ));
                    }
                    views.push(view);
                }
                let mut sent = conclave_wire::gcs::MessageGroups::with_capacity(groups.len());
                for (group, view) in groups.into_iter().zip(views) {
                    sent.push((group.as_str().into(), view.index));
                    if view.index == OPEN_VIEW {
                        if !group.starts_with('#') {
                            if let Some(c) = self.clients.get(client) {
                                self.events.push_back(LocalEvent::OpenSent {
                                    client: c.id,
                                    group,
                                    service,
                                    payload: payload.clone(),
                                });
                            }
                        }
                        continue;
                    }
                    self.emit(
                        client,
                        ClientEvent::Sent {
                            group,
                            service,
                            payload: payload.clone(),
                            view,
                        },
                    );
                }
                self.submit(Body::Client {
                    client: client.into(),
                    groups: sent,
                    service,
                    payload,
                    spread,
                });
                Ok(())
            }
            ClientCommand::FlushAck { group, view } => {
                // Only an acknowledgement of the flush under way counts; one of a flush that a
                // configuration change cut short, or of an earlier view, is stale.
                let current = self.groups.get(&group).and_then(|g| g.view);
                let flush = self
                    .groups
                    .get_mut(&group)
                    .and_then(|g| g.flush.as_mut())
                    .filter(|f| current == Some(view) && f.awaiting.contains(client));
                if let Some(f) = flush {
                    f.awaiting.remove(client);
                    f.acked.insert(client.to_owned());
                    self.emit(
                        client,
                        ClientEvent::FlushAcked {
                            group: group.clone(),
                        },
                    );
                    self.advance(&group);
                }
                Ok(())
            }
        }
    }
}

/// What a waiting command holds, roughly: its payload, and room for its names.
pub(super) fn command_bytes(cmd: &ClientCommand) -> usize {
    64 + match cmd {
        ClientCommand::Multicast {
            payload, groups, ..
        } => payload.len() + groups.iter().map(String::len).sum::<usize>(),
        _ => 0,
    }
}
