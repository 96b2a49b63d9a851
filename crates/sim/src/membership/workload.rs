//! What the clients do: join, leave, disconnect and send messages of every service type, as a
//! seed draws.

use super::*;
use cluster::SpreadRequest;

impl World {
    /// The key server's workload: it restarts when it is down (calm or not: the group needs it),
    /// and crashes now and then.
    fn key_server_act(&mut self, ci: usize, rng: &mut ChaCha20Rng, calm: bool, crashes: bool) {
        if !self.clients[ci].connected() {
            return self.connect(ci);
        }
        if !calm && crashes && rng.next_u32() % 100 < 4 {
            let d = self.clients[ci].daemon;
            if let Some(sid) = self.clients[ci].session {
                self.sessions.remove(&sid);
                self.nodes[d].close_session(Time::from_micros(self.now), sid);
                self.client_gone(ci);
            }
        }
    }

    /// One step of client `ci`'s workload.
    pub(super) fn act(
        &mut self,
        ci: usize,
        rng: &mut ChaCha20Rng,
        groups: usize,
        calm: bool,
        disconnects: bool,
    ) {
        let d = self.clients[ci].daemon;
        let now = Time::from_micros(self.now);
        if self.is_key_server(ci) {
            return self.key_server_act(ci, rng, calm, disconnects);
        }
        if !self.clients[ci].connected() {
            if !calm {
                self.connect(ci);
            }
            return;
        }
        let roll = rng.next_u32() % 100;
        // Membership requests wait while the daemon's configuration changes (a client would
        // see the transitional signal); messages may be sent at any time.
        let roll = if self.nodes[d].core().ready() {
            roll
        } else {
            100
        };
        let joined: Vec<String> = if self.security.is_some() {
            self.clients[ci].secure.keys().cloned().collect()
        } else {
            self.clients[ci].joined()
        };
        let spread = self.clients[ci].spread.is_some();
        let pick = format!("g{}", rng.next_u32() as usize % groups.max(1));
        if (joined.is_empty() && roll < 100) || (!calm && roll < 6) {
            let vs = rng.next_u32().is_multiple_of(2);
            if self.security.is_some() {
                self.secure_join(ci, pick);
                return;
            }
            // The session core refuses a join of a group the client is in or joining.
            self.command(ci, ClientCommand::Join { group: pick, vs });
        } else if !calm && roll < 10 {
            let g = joined[rng.next_u32() as usize % joined.len()].clone();
            if self.security.is_some() {
                self.secure_leave(ci, &g);
                return;
            }
            self.command(ci, ClientCommand::Leave { group: g });
        } else if !calm && roll < 12 && disconnects {
            // A Spread client says so (KILL_MESS) half the time; its daemon closes it.
            if spread && rng.next_u32().is_multiple_of(2) {
                self.spread_request(ci, SpreadRequest::Kill);
                return;
            }
            if let Some(sid) = self.clients[ci].session {
                self.sessions.remove(&sid);
                self.nodes[d].close_session(now, sid);
                self.client_gone(ci);
            }
        } else if !joined.is_empty() {
            let k = rng.next_u32() as usize % joined.len();
            let s = SERVICES[(rng.next_u32() % 6) as usize];
            let c = &mut self.clients[ci];
            let msg = format!("{}/{}/{}", c.name, c.inc.unwrap_or(0), c.sent);
            // Every fifth message of a client in several groups goes to two of them.
            let mut groups = vec![joined[k].clone()];
            if self.multi_group && c.sent % 5 == 4 && joined.len() > 1 {
                groups.push(joined[(k + 1) % joined.len()].clone());
            }
            c.sent += 1;
            if spread {
                // Spread's groups are open, and private groups name one client: some messages
                // go to a group the client is not in, some also to another client, and some
                // are not for the sender itself.
                if rng.next_u32().is_multiple_of(5) && !joined.contains(&pick) {
                    groups.push(pick);
                }
                if rng.next_u32().is_multiple_of(6) {
                    let other = &self.clients[rng.next_u32() as usize % self.clients.len()];
                    let (p, d) = other.name.split_once('#').unwrap_or_default();
                    groups.push(format!("#{p}#{d}"));
                }
                let req = SpreadRequest::Send {
                    service: s,
                    groups,
                    payload: msg.into_bytes(),
                    self_discard: rng.next_u32().is_multiple_of(4),
                };
                return self.spread_request(ci, req);
            }
            let c = &mut self.clients[ci];
            // A client whose window is full would wait: this one sends nothing now.
            if c.core.window_free() < c.core.places(msg.len(), groups.len()) {
                return;
            }
            if self.security.is_some() {
                let g = groups.swap_remove(0);
                self.secure_send(ci, &g, s, msg.into_bytes().into());
                return;
            }
            let cmd = ClientCommand::Multicast {
                service: s,
                groups,
                payload: msg.into_bytes().into(),
            };
            // A full queue at the daemon refuses; the message was never sent.
            self.command(ci, cmd);
        }
    }
}
