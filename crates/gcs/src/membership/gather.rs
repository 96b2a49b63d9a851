//! Gather (TOCS §4.1): join messages with the daemons heard and those given up on, until every
//! daemon of the set agrees (consensus), or the consensus timeout gives up on the silent ones.

use super::*;

impl Membership {
    pub(super) fn gather(&mut self, now: Time, also: BTreeSet<DaemonId>) {
        let mut procs: BTreeSet<DaemonId> = self.members_of_ring().into_iter().collect();
        procs.insert(self.me);
        if procs.union(&also).count() <= MAX_RING_MEMBERS {
            procs.extend(also);
        }
        self.state = State::Gather {
            procs,
            failed: BTreeSet::new(),
            heard: BTreeMap::new(),
            heard_at: BTreeMap::new(),
            timeouts: 0,
        };
        self.timers.reset(&[
            (Timer::Join, now),
            (Timer::Consensus, now + ms(self.cfg.consensus_ms)),
        ]);
        self.send_join(now);
    }

    pub(super) fn send_join(&mut self, now: Time) {
        let State::Gather { procs, failed, .. } = &self.state else {
            return;
        };
        self.timers.set(Timer::Join, now + ms(self.cfg.join_ms));
        if procs.len() > MAX_RING_MEMBERS || failed.len() > MAX_RING_MEMBERS {
            // Not encodable; joins past the limit are refused, so only a merge detector's
            // sender could get here, and it is left out.
            return;
        }
        let join = Join {
            sender: self.me,
            incarnation: self.incarnation,
            ring_seq: self.max_ring_seq,
            procs: procs.iter().copied().collect(),
            failed: failed.iter().copied().collect(),
        };
        self.out.push_back(Transmit {
            to: Dest::AllOthers,
            packet: Packet::Join(join),
        });
    }

    /// Consensus: every live daemon of `procs` sent this daemon's own two sets.
    pub(super) fn try_consensus(&mut self, now: Time) {
        let State::Gather {
            procs,
            failed,
            heard,
            ..
        } = &self.state
        else {
            return;
        };
        let live: Vec<DaemonId> = procs.difference(failed).copied().collect();
        let agreed = live
            .iter()
            .all(|p| *p == self.me || heard.get(p) == Some(&(procs.clone(), failed.clone())));
        if !agreed || live.first() != Some(&self.me) {
            return;
        }
        // This daemon represents the new ring.
        let ring = RingId {
            seq: self.max_ring_seq + 4,
            rep: self.me,
            inc: self.incarnation,
        };
        // A later attempt must not reuse this ring id: a stale token of this one could arrive.
        self.max_ring_seq = ring.seq;
        let commit = Commit {
            ring,
            rotation: 1,
            members: live
                .iter()
                .map(|id| {
                    if *id == self.me {
                        self.entry()
                    } else {
                        CommitEntry {
                            id: *id,
                            old_ring: ring,
                            old_aru: 0,
                            high_delivered: 0,
                            filled: false,
                        }
                    }
                })
                .collect(),
        };
        self.enter_commit(now, ring, live.clone());
        self.forward_commit(now, commit, &live);
    }

    pub(super) fn on_join(&mut self, now: Time, from: DaemonId, j: Join) {
        // A join that has not seen the newest ring this daemon knows of belongs to an older
        // round: its sender will learn of that ring (from our joins, the commit token or the
        // merge detector) and send a current one. Acting on stale joins makes rings flap.
        if j.ring_seq < self.max_ring_seq {
            return;
        }
        // Wire input is hostile: a join that would make the sets larger than a ring may be is
        // refused (the packets that carry them could not be encoded).
        let mut known: BTreeSet<DaemonId> = match &self.state {
            State::Gather { procs, .. } => procs.clone(),
            _ => self.members_of_ring().into_iter().collect(),
        };
        known.extend(j.procs.iter().copied().chain([from, self.me]));
        let failed_now = match &self.state {
            State::Gather { failed, .. } => failed.len(),
            _ => 0,
        };
        if known.len() > MAX_RING_MEMBERS || failed_now + j.failed.len() > MAX_RING_MEMBERS {
            return;
        }
        self.max_ring_seq = j.ring_seq;
        if let State::Operational | State::Commit { .. } | State::Recovery { .. } = self.state {
            // A join from a member of this ring that predates the ring is a late one.
            let stale = self
                .running_ring()
                .is_some_and(|r| j.ring_seq < r.seq && self.members_of_ring().contains(&from));
            if stale || matches!(self.state, State::Commit { .. }) && j.ring_seq < self.max_ring_seq
            {
                return;
            }
            // Someone is gathering: a member lost the ring, or an outsider wants in.
            let mut also: BTreeSet<DaemonId> = j.procs.iter().copied().collect();
            also.insert(from);
            self.gather(now, also);
        }
        let State::Gather {
            procs,
            failed,
            heard,
            heard_at,
            ..
        } = &mut self.state
        else {
            return;
        };
        heard_at.insert(from, now);
        let jp: BTreeSet<DaemonId> = j.procs.iter().copied().collect();
        let jf: BTreeSet<DaemonId> = j.failed.iter().copied().collect();
        let mut changed = false;
        if jf.contains(&self.me) {
            // It gave up on this daemon: give up on it too, so both can go on.
            changed |= failed.insert(from);
        } else if !failed.contains(&from) {
            for p in jp.iter().chain([&from]) {
                changed |= procs.insert(*p);
            }
            for f in jf.iter().filter(|f| **f != self.me) {
                changed |= failed.insert(*f);
            }
        }
        heard.insert(from, (jp, jf));
        if changed {
            self.send_join(now);
        }
        self.try_consensus(now);
    }

    /// The consensus timeout of a gather round.
    pub(super) fn give_up_on_silent(&mut self, now: Time) {
        let State::Gather {
            procs,
            failed,
            heard,
            heard_at,
            timeouts,
        } = &mut self.state
        else {
            return;
        };
        // Give up first on those not heard from in the last period: the daemons still talking
        // converge on their own, as their sets only grow. Giving up at once on every daemon that
        // has not agreed yet made the daemons of one side fail each other differently when an
        // unreachable daemon held up everyone's consensus, and split the side into rings that
        // never merged (seen with real daemons: four daemons re-forming {d1,d3} and {d2,d4}
        // every 400 ms). At the second timeout of a round, those that have still not agreed go
        // too.
        let mine = (procs.clone(), failed.clone());
        let period = ms(self.cfg.consensus_ms);
        let first = *timeouts == 0;
        *timeouts += 1;
        let silent: Vec<DaemonId> = procs
            .difference(failed)
            .filter(|p| {
                let quiet = !matches!(
                    heard_at.get(*p),
                    Some(t) if now.saturating_since(*t) < period
                );
                **p != self.me && heard.get(*p) != Some(&mine) && (quiet || !first)
            })
            .copied()
            .collect();
        failed.extend(silent);
        self.timers.set(Timer::Consensus, now + period);
        self.send_join(now);
        self.try_consensus(now);
    }
}
