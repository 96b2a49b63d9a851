//! Secure runs (`conclave sim --secure`): every client's groups are secure groups (the secure
//! layer of the client library, `conclave-secure`, over the client's session core), with
//! identities and a trust directory naming every client; in a third of the seeds the groups take
//! their keys from the daemons (Integrated VS) instead of agreeing them, and in half of those
//! the groups are EVS groups the daemons reseal late messages of (Optimized EVS). The history gains each client's secure
//! views (keys by fingerprint), the messages its secure layer took and delivered (named by a
//! digest, never the plaintext), what its key agreement took in and the layer's refusals, for
//! the checker's K properties.

use super::*;
use bytes::Bytes;
use conclave_crypto::{Identity, SigScheme};
use conclave_gka::{Directory, ProtocolId, SharedDirectory};
use conclave_history::ViewId;
use conclave_secure::{KeySource, SecureConfig, SecureGroup};
use conclave_wire::client::GroupViewId;
use conclave_wire::gcs::ServiceType;
use std::sync::{Arc, RwLock};

pub(super) struct Security {
    pub(super) protocol: ProtocolId,
    keys: KeySource,
    /// EVS groups resealed by the daemons (Optimized EVS), with keys from the daemons.
    evs: bool,
    identities: BTreeMap<String, Identity>,
    directory: SharedDirectory,
    seed: u64,
    /// Secure groups made so far, to seed each one's randomness differently.
    made: u64,
}

impl Security {
    pub(super) fn new(
        clients: &[SimClient],
        protocol: ProtocolId,
        keys: KeySource,
        evs: bool,
        seed: u64,
    ) -> Security {
        let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x6b657973);
        let mut directory = Directory::new();
        let mut identities = BTreeMap::new();
        for c in clients {
            let id = Identity::generate(SigScheme::Ed25519, &mut rng).expect("an Ed25519 key");
            directory.insert(c.private.clone(), id.public());
            identities.insert(c.private.clone(), id);
        }
        Security {
            protocol,
            keys,
            evs,
            identities,
            directory: Arc::new(RwLock::new(directory)),
            seed,
            made: 0,
        }
    }
}

/// A view's id as the daemons' recorders name it.
fn view_id(v: GroupViewId) -> ViewId {
    conclave_node::record::group_view_id(&name(v.ring.rep), v)
}

impl World {
    /// Client `ci`'s session had an event: its secure group takes it. What the client sends
    /// back, framed.
    pub(super) fn secure_event(&mut self, ci: usize, ev: ClientEvent) -> Vec<u8> {
        let Some(group) = ev.group().map(str::to_owned) else {
            return Vec::new();
        };
        let left = matches!(ev, ClientEvent::Left { .. });
        let Some(g) = self.clients[ci].secure.get_mut(&group) else {
            return Vec::new();
        };
        g.handle_event(ev);
        let out = self.secure_pump(ci, &group);
        if left {
            self.clients[ci].secure.remove(&group);
        }
        out
    }

    pub(super) fn secure_join(&mut self, ci: usize, group: String) {
        let Some(sec) = self.security.as_mut() else {
            return;
        };
        let c = &mut self.clients[ci];
        let Some(me) = c.core.name().map(str::to_owned) else {
            return;
        };
        if c.secure.contains_key(&group) || c.core.groups().any(|g| g == group) {
            return;
        }
        sec.made += 1;
        let rng = ChaCha20Rng::seed_from_u64(sec.seed ^ (sec.made << 20) ^ ci as u64);
        let cfg = SecureConfig {
            keys: sec.keys,
            protocol: sec.protocol,
            evs: sec.evs,
            ..SecureConfig::default()
        };
        let g = SecureGroup::join(
            &group,
            &me,
            sec.identities[&c.private].clone(),
            sec.directory.clone(),
            cfg,
            Box::new(rng),
        );
        // The keys are asked for before the join goes, so that the first view has its key.
        let asked = match g.key_source() {
            KeySource::Daemons => c.core.keys(&group).ok(),
            KeySource::Agreement | KeySource::KeyGraph => None,
        };
        c.secure.insert(group.clone(), g);
        if let (Some(bytes), Some(sid)) = (asked, c.session) {
            let now = Time::from_micros(self.now);
            self.nodes[c.daemon].handle_session_bytes(now, sid, &bytes);
        }
        self.secure_send_commands(ci, &group);
    }

    pub(super) fn secure_leave(&mut self, ci: usize, group: &str) {
        if let Some(g) = self.clients[ci].secure.get_mut(group) {
            g.leave();
            self.secure_send_commands(ci, group);
        }
    }

    pub(super) fn secure_send(&mut self, ci: usize, group: &str, s: ServiceType, payload: Bytes) {
        let c = &mut self.clients[ci];
        if let Some(g) = c.secure.get_mut(group) {
            let msg = conclave_node::record::message_name(&c.name, group, &payload);
            // A full queue refuses: the message was never sent.
            if g.send(s, payload).is_ok() {
                let (p, inc) = (c.name.clone(), c.inc.unwrap_or(0));
                self.history.push(Record {
                    t: self.now,
                    p,
                    inc,
                    ev: Event::SecureSend {
                        group: group.to_owned(),
                        msg,
                    },
                });
                self.secure_send_commands(ci, group);
            }
        }
    }

    fn secure_send_commands(&mut self, ci: usize, group: &str) {
        let bytes = self.secure_pump(ci, group);
        let c = &self.clients[ci];
        if let (Some(sid), false) = (c.session, bytes.is_empty()) {
            let now = Time::from_micros(self.now);
            self.nodes[c.daemon].handle_session_bytes(now, sid, &bytes);
        }
    }

    /// The group's commands, framed by the session core; its events, into the history.
    fn secure_pump(&mut self, ci: usize, group: &str) -> Vec<u8> {
        let now = self.now;
        let c = &mut self.clients[ci];
        let Some(g) = c.secure.get_mut(group) else {
            return Vec::new();
        };
        while let Some(cmd) = g.poll_command() {
            c.pending.push_back(cmd);
        }
        let (p, inc) = (c.name.clone(), c.inc.unwrap_or(0));
        let mut records = Vec::new();
        while let Some(c) = g.poll_consumed() {
            records.push(conclave_node::record::consumed(group, &c, &view_id));
        }
        while let Some(e) = g.poll_event() {
            records.extend(conclave_node::record::secure_event(&e, &view_id));
        }
        for ev in records {
            self.history.push(Record {
                t: now,
                p: p.clone(),
                inc,
                ev,
            });
        }
        self.send_pending(ci)
    }

    /// The client's waiting commands that the window has room for, framed, in order (as the
    /// client library's sender waits for room).
    pub(super) fn send_pending(&mut self, ci: usize) -> Vec<u8> {
        let c = &mut self.clients[ci];
        let mut out = Vec::new();
        while let Some(cmd) = c.pending.front() {
            if let ClientCommand::Multicast { groups, .. } = cmd {
                if c.core.window_free() < groups.len() {
                    break;
                }
            }
            let cmd = c.pending.pop_front().expect("peeked");
            // The session core refuses what the daemon would (a group left): the command is
            // dropped, as a client library reports it to the application.
            if let Ok(b) = c.core.command(cmd) {
                out.extend(b);
            }
        }
        out
    }
}
