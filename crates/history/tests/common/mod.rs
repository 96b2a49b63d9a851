//! A model of a correct group communication system, for the checker's tests: it partitions and
//! merges one group's members at random, totally orders each component's messages, and delivers
//! what is pending at a view change in the transitional part, as extended virtual synchrony says.
//! Its histories must pass the checker; mutated, they must not.

#![allow(dead_code)]

use conclave_history::{Event, Record, Service, ViewId};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

pub const SERVICES: [Service; 6] = [
    Service::Unreliable,
    Service::Reliable,
    Service::Fifo,
    Service::Causal,
    Service::Agreed,
    Service::Safe,
];

/// A message waiting for delivery: id, sender, service, payload.
type Pending = (String, String, Service, String);
/// A component: its view, members and pending messages.
type Component = (ViewId, Vec<String>, Vec<Pending>);

struct Model {
    rng: ChaCha20Rng,
    out: Vec<Record>,
    t: u64,
    seq: u64,
    names: Vec<String>,
    comps: Vec<Component>,
    sent: u64,
    vs: bool,
}

impl Model {
    fn rec(&mut self, p: &str, ev: Event) {
        self.t += 1;
        self.out.push(Record {
            t: self.t,
            p: p.to_owned(),
            inc: 0,
            ev,
        });
    }
    fn pick(&mut self, n: usize) -> usize {
        (self.rng.next_u32() as usize) % n
    }
    fn send(&mut self) {
        let c = self.pick(self.comps.len());
        let m = self.pick(self.comps[c].1.len());
        let who = self.comps[c].1[m].clone();
        let service = SERVICES[self.pick(6)];
        self.sent += 1;
        let msg = format!("{who}/0/{}", self.sent);
        let payload = format!("{:08x}", self.rng.next_u32());
        let view = self.comps[c].0.clone();
        self.rec(
            &who,
            Event::Send {
                group: "g".into(),
                msg: msg.clone(),
                service,
                view,
                payload: payload.clone(),
            },
        );
        self.comps[c].2.push((msg, who, service, payload));
    }
    /// The component delivers its oldest pending message to every member.
    fn deliver(&mut self) {
        let c = self.pick(self.comps.len());
        if self.comps[c].2.is_empty() {
            return;
        }
        let (msg, sender, service, payload) = self.comps[c].2.remove(0);
        let (view, members) = (self.comps[c].0.clone(), self.comps[c].1.clone());
        for p in members {
            self.rec(
                &p,
                Event::Deliver {
                    group: "g".into(),
                    msg: msg.clone(),
                    sender: sender.clone(),
                    service,
                    view: view.clone(),
                    transitional: false,
                    payload: payload.clone(),
                },
            );
        }
    }
    /// A new partition of all processes into components (one component when `merge_all`).
    fn change(&mut self, merge_all: bool) {
        let k = if merge_all {
            1
        } else {
            (1 + self.pick(3)).min(self.names.len())
        };
        let mut assign: Vec<usize> = (0..self.names.len()).map(|_| self.pick(k)).collect();
        // No empty component.
        for (c, a) in (0..k).zip(assign.iter_mut()) {
            *a = c;
        }
        let new: Vec<Vec<String>> = (0..k)
            .map(|c| {
                self.names
                    .iter()
                    .zip(&assign)
                    .filter(|(_, a)| **a == c)
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .collect();
        let old = std::mem::take(&mut self.comps);
        let mut views = Vec::new();
        for members in &new {
            self.seq += 1;
            views.push(ViewId(self.seq, members[0].clone()));
        }
        for (oview, omembers, pending) in &old {
            for (ni, nmembers) in new.iter().enumerate() {
                let trans: Vec<String> = omembers
                    .iter()
                    .filter(|m| nmembers.contains(m))
                    .cloned()
                    .collect();
                if trans.is_empty() {
                    continue;
                }
                for p in &trans {
                    if self.vs {
                        self.rec(p, Event::FlushAck { group: "g".into() });
                    }
                    self.rec(p, Event::TransSignal { group: "g".into() });
                }
                // What is pending is delivered in the transitional part, in order.
                for (msg, sender, service, payload) in pending {
                    for p in &trans {
                        self.rec(
                            p,
                            Event::Deliver {
                                group: "g".into(),
                                msg: msg.clone(),
                                sender: sender.clone(),
                                service: *service,
                                view: oview.clone(),
                                transitional: true,
                                payload: payload.clone(),
                            },
                        );
                    }
                }
                for p in &trans {
                    self.rec(
                        p,
                        Event::View {
                            group: "g".into(),
                            view: views[ni].clone(),
                            members: nmembers.clone(),
                            transitional: trans.clone(),
                        },
                    );
                }
            }
        }
        for (members, view) in new.into_iter().zip(views) {
            self.comps.push((view, members, Vec::new()));
        }
    }
}

/// A correct history of `n` processes and about `steps` events.
pub fn history(seed: u64, n: usize, steps: usize, vs: bool) -> Vec<Record> {
    let names: Vec<String> = (1..=n).map(|i| format!("c{i}")).collect();
    let mut m = Model {
        rng: ChaCha20Rng::seed_from_u64(seed),
        out: Vec::new(),
        t: 0,
        seq: 1,
        names: names.clone(),
        comps: Vec::new(),
        sent: 0,
        vs,
    };
    let first = ViewId(1, names[0].clone());
    for p in &names {
        m.rec(
            p,
            Event::Join {
                group: "g".into(),
                vs,
            },
        );
    }
    for p in &names {
        m.rec(
            p,
            Event::View {
                group: "g".into(),
                view: first.clone(),
                members: names.clone(),
                transitional: vec![p.clone()],
            },
        );
    }
    m.comps.push((first, names.clone(), Vec::new()));
    for _ in 0..steps {
        match m.pick(10) {
            0..=3 => m.send(),
            4..=8 => m.deliver(),
            _ => m.change(false),
        }
    }
    // The network settles: one component, everything delivered, a few more messages.
    m.t += 1;
    m.out.push(Record {
        t: m.t,
        p: String::new(),
        inc: 0,
        ev: Event::Stable {
            processes: names.clone(),
        },
    });
    m.change(true);
    for _ in 0..5 {
        m.send();
    }
    while !m.comps[0].2.is_empty() {
        m.deliver();
    }
    m.out
}
