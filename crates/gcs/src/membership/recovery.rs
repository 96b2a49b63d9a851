//! Recovery and extended virtual synchrony (TOCS §4.3, EVS): the old ring's messages delivered
//! in its regular or transitional configuration, then the new configuration.

use super::*;

impl Membership {
    /// Every member's recovery marker is in: the old ring's last messages, the transitional
    /// configuration, and the new regular configuration (TOCS §4.4).
    pub(super) fn end_recovery(&mut self, now: Time) {
        let State::Recovery {
            ordering,
            transitional,
            max_delivered,
            early,
            ..
        } = std::mem::replace(&mut self.state, State::Operational)
        else {
            return;
        };
        self.timers.reset(&[
            (Timer::TokenLoss, now + ms(self.cfg.token_loss_ms)),
            (Timer::MergeDetect, now + ms(self.cfg.merge_detect_ms)),
        ]);
        if let Some(old) = &mut self.regular {
            let ring = old.ring();
            let mut signalled = false;
            for f in old.finish(max_delivered) {
                if f.transitional && !signalled {
                    signalled = true;
                    self.events
                        .push_back(RingEvent::TransitionalSignal { ring });
                }
                self.events.push_back(RingEvent::Deliver {
                    ring,
                    seq: f.seq,
                    sender: f.sender,
                    body: f.body,
                    transitional: f.transitional,
                });
            }
            if !signalled {
                self.events
                    .push_back(RingEvent::TransitionalSignal { ring });
            }
        }
        let mut ordering = ordering;
        ordering.end_recovery();
        // The queue held no more than the limits before; it holds no more now. Taken as the
        // daemons' own messages are, so that none (a group state) is lost to the limits.
        self.waiting_bytes = 0;
        for body in self.waiting.drain(..) {
            ordering.submit_control(body);
        }
        self.events
            .push_back(RingEvent::Configuration(Configuration {
                ring: ordering.ring(),
                members: ordering.members().to_vec(),
                transitional,
            }));
        let ring = ordering.ring();
        for d in early {
            self.events.push_back(RingEvent::regular(ring, d));
        }
        self.regular = Some(ordering);
    }

    /// The running ring's packets, sends and deliveries; deliveries during recovery feed it.
    pub(super) fn drain_ordering(&mut self, now: Time) {
        loop {
            let (ring, d, from_member, members) = {
                let ordering = match (&mut self.state, &mut self.regular) {
                    (State::Recovery { ordering, .. }, _) => ordering,
                    (State::Operational, Some(o)) => o,
                    _ => return,
                };
                let ring = ordering.ring();
                while let Some(t) = ordering.poll_transmit() {
                    self.out.push_back(t);
                }
                while let Some((seq, body)) = ordering.poll_sent() {
                    self.events.push_back(RingEvent::Sent { ring, seq, body });
                }
                let stable = ordering.stable_up_to();
                let Some(d) = ordering.poll_delivery() else {
                    // Recovery ends once every member holds every marker (so every member holds
                    // every retransmission: whoever installs the new ring, the others hold all
                    // it delivers of their old ring, and deliver it, here or after another
                    // gather).
                    if let State::Recovery {
                        done_at: Some(at), ..
                    } = &self.state
                    {
                        if stable >= *at {
                            self.end_recovery(now);
                            continue;
                        }
                    }
                    return;
                };
                let from_member = ordering.members().contains(&d.sender);
                (ring, d, from_member, ordering.members().len())
            };
            match &mut self.state {
                State::Recovery {
                    done,
                    done_at,
                    early,
                    ..
                } => match (d.origin, &*d.body) {
                    (Some((old, seq, sender)), _) => {
                        if let Some(o) = self.regular.as_mut().filter(|o| o.ring() == old) {
                            o.insert_recovered(seq, sender, d.body);
                        }
                    }
                    (None, Body::RecoveryDone) if from_member => {
                        done.insert(d.sender);
                        if done.len() == members {
                            *done_at = Some(d.seq);
                        }
                    }
                    (None, Body::RecoveryDone) => {}
                    // Honest members send new messages only once they have ended recovery,
                    // which this one does within two token visits of them: at most two
                    // rotations of every member's sends, and no more than the window lets
                    // the ring send in two rotations. More is hostile and dropped.
                    (None, _)
                        if early.len()
                            < 2 * (members * self.cfg.ordering.max_per_visit as usize)
                                .min(self.cfg.ordering.window as usize) =>
                    {
                        early.push(d)
                    }
                    (None, _) => {}
                },
                _ => {
                    if d.origin.is_none() && *d.body != Body::RecoveryDone {
                        self.events.push_back(RingEvent::regular(ring, d));
                    }
                }
            }
        }
    }
}
