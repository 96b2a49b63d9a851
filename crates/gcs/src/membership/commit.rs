//! The commit token (TOCS §4.2): its two rotations around the new ring, and the installation
//! of the new ring at each member.

use super::*;

impl Membership {
    /// The ring a daemon that has installed none counts as coming from.
    pub(super) fn placeholder(&self) -> RingId {
        self.ring().unwrap_or(RingId {
            seq: 0,
            rep: self.me,
            inc: self.incarnation,
        })
    }

    pub(super) fn entry(&self) -> CommitEntry {
        CommitEntry {
            id: self.me,
            old_ring: self.placeholder(),
            old_aru: self.regular.as_ref().map_or(0, |o| o.my_aru()),
            high_delivered: self.regular.as_ref().map_or(0, |o| o.delivered_up_to()),
            filled: true,
        }
    }

    pub(super) fn forward_commit(&mut self, now: Time, commit: Commit, members: &[DaemonId]) {
        let i = members
            .iter()
            .position(|m| *m == self.me)
            .expect("a member");
        let next = members[(i + 1) % members.len()];
        if next == self.me {
            // A ring of one: the token is back at once (its own, listing it once).
            let r = self.handle_commit(now, commit);
            debug_assert!(r.is_ok(), "its own commit token");
            return;
        }
        self.out.push_back(Transmit {
            to: Dest::One(next),
            packet: Packet::Commit(commit),
        });
    }

    /// Starts recovery on the ring of a commit token; refuses (returns false) a token that
    /// would not move this daemon forward from the ring it is in: an older ring, or one whose
    /// first rotation saw this daemon in another ring (a stale token).
    pub(super) fn install(&mut self, now: Time, commit: &Commit) -> bool {
        let members: Vec<DaemonId> = commit.members.iter().map(|e| e.id).collect();
        let my_old = self.placeholder();
        let Some(mine) = commit.members.iter().find(|e| e.id == self.me) else {
            return false;
        };
        if mine.old_ring != my_old || commit.ring.seq <= my_old.seq {
            return false;
        }
        let from_mine: Vec<&CommitEntry> = commit
            .members
            .iter()
            .filter(|e| e.old_ring == my_old && (self.regular.is_some() || e.id == self.me))
            .collect();
        let transitional: Vec<DaemonId> = from_mine.iter().map(|e| e.id).collect();
        let low = from_mine.iter().map(|e| e.old_aru).min().unwrap_or(0);
        // Nobody delivers past what it holds in order; an entry claiming so is not believed.
        let max_delivered = from_mine
            .iter()
            .map(|e| e.high_delivered.min(e.old_aru))
            .max()
            .unwrap_or(0);
        let mut recovery = match &mut self.regular {
            Some(o) => {
                // What was accepted while the old ring was installed and never went out on it
                // is sent now, in that configuration, and delivered in its transitional part.
                let ring = o.ring();
                self.waiting_bytes = 0;
                for body in o.close_unsent(self.waiting.drain(..)) {
                    self.events
                        .push_back(RingEvent::Sent { ring, seq: 0, body });
                }
                o.for_recovery(low)
            }
            None => Vec::new(),
        };
        recovery.push((None, Arc::new(Body::RecoveryDone)));
        self.max_ring_seq = self.max_ring_seq.max(commit.ring.seq);
        self.state = State::Recovery {
            ordering: Box::new(Ordering::recovering(
                self.cfg.ordering.clone(),
                self.me,
                commit.ring,
                members,
                recovery,
            )),
            transitional,
            max_delivered,
            done: BTreeSet::new(),
            done_at: None,
            early: Vec::new(),
        };
        self.timers
            .reset(&[(Timer::TokenLoss, now + ms(self.cfg.token_loss_ms))]);
        true
    }

    pub(super) fn handle_commit(&mut self, now: Time, mut c: Commit) -> Result<(), PeerRefusal> {
        // Wire input is hostile: a token that does not list this daemon exactly once is refused.
        let ids: Vec<DaemonId> = c.members.iter().map(|e| e.id).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != ids.len() || !ids.contains(&self.me) {
            return Err(PeerRefusal::BadCommit);
        }
        self.max_ring_seq = self.max_ring_seq.max(c.ring.seq);
        if c.rotation == 2 && c.ring.rep == self.me && self.running_ring() == Some(c.ring) {
            // The second rotation is back: every member is in the new ring.
            self.start_token(now);
            return Ok(());
        }
        // The token lists the new ring's members from the start; a daemon takes part only in
        // the ring it would have formed itself (TOCS §4.2).
        let agrees = match &self.state {
            State::Commit { ring, members, .. } => *ring == c.ring && *members == ids,
            State::Gather { procs, failed, .. } => {
                let live: Vec<DaemonId> = procs.difference(failed).copied().collect();
                c.rotation == 1 && live == ids && live.first() == Some(&c.ring.rep)
            }
            State::Operational | State::Recovery { .. } => false,
        };
        if !agrees {
            return Ok(());
        }
        let rep = c.ring.rep;
        match c.rotation {
            // Back at the representative, full: the second rotation installs.
            1 if rep == self.me && c.members.iter().all(|e| e.filled) => {
                c.rotation = 2;
                if self.install(now, &c) {
                    self.forward_commit(now, c, &ids);
                }
            }
            1 if rep == self.me => {}
            1 => {
                let mine = self.entry();
                if let Some(e) = c.members.iter_mut().find(|e| e.id == self.me) {
                    *e = mine;
                }
                self.enter_commit(now, c.ring, ids.clone());
                self.forward_commit(now, c, &ids);
            }
            2 if rep != self.me && c.members.iter().all(|e| e.filled) && self.install(now, &c) => {
                self.forward_commit(now, c, &ids);
            }
            _ => {}
        }
        Ok(())
    }

    pub(super) fn enter_commit(&mut self, now: Time, ring: RingId, members: Vec<DaemonId>) {
        self.state = State::Commit { ring, members };
        self.timers
            .reset(&[(Timer::Commit, now + ms(self.cfg.commit_ms))]);
    }

    pub(super) fn start_token(&mut self, now: Time) {
        if let State::Recovery { ordering, .. } = &mut self.state {
            ordering.start(now);
        }
        self.drain_ordering(now);
    }
}
