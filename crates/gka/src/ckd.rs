//! Centralized Key Distribution (paper 000 §4.2, Figs 3-4).
//!
//! The controller is the view's first member (the oldest, in the agreed order). It shares a
//! pairwise key `k_i = H(g^{r_c r_i})` with every member, from long-term Diffie-Hellman shares
//! `g^{r_i}` that each member computes once when it is created. On every view it picks a fresh
//! group secret `K_s = g^s` and broadcasts `K_s^{k_i}` for every member, which recovers `K_s` with
//! `1/k_i` (the key is "encrypted via modular exponentiation" as in the paper, so CKD rests on
//! the same assumption as the contributory protocols). Members without a channel to the
//! controller (joiners, merging members, or everybody after the controller left) first run the
//! Fig 3 handshake: the controller sends its share (a unicast to one member, a broadcast to
//! several), each answers with its own.
//!
//! A handshake message addressed to other members is never used by this one, so it is dropped
//! unverified (`Ok`, no effect) rather than refused. A channel exists exactly between members of the same side whose secure state had this
//! controller, so both ends always agree on whether a handshake is needed. Cascades restart from
//! the newest view (see `core`).
//!
//! Departures from Tables I and II:
//! - Table II counts `n-2` exponentiations for a leave and `n-p-1` for a partition, which leaves
//!   out each member's final decryption, although join and merge count it; we count it everywhere
//!   (`n-1` and `n-p`).
//! - Controller leave: the new controller sends its share in one broadcast rather than `n-2`
//!   unicasts: `n` messages (`n-2` unicasts, 2 broadcasts), `n` signatures on the path and
//!   `n` verifications, against the table's `3n-6` messages (itself inconsistent with its own
//!   `2n-4` unicasts and 2 multicasts) and `2n-2` signatures. Exponentiations match (`2n-3`).

use crate::api::{
    Dest, GkaError, KeyAgreement, MemberId, Order, SecureView, SharedDirectory, View,
};
use crate::core::Core;
use crate::ops;
use conclave_crypto::{CryptoRng, Group, Identity};
use conclave_wire::gka::{CkdMsg, ProtocolId};
use std::collections::{BTreeMap, BTreeSet};

const CHANNEL_LABEL: &[u8] = b"conclave ckd channel";

#[derive(Clone)]
pub struct Ckd<G: Group> {
    core: Core,
    /// Long-term DH contribution and share, made once at creation.
    r: G::Scalar,
    share: G::Element,
    secure: Option<Secure<G>>,
    run: Option<Run<G>>,
    /// The controller derives its own `K_s` in `poll_key`, after sending.
    pending: Option<G::Scalar>,
    /// A member derives its channel key in `poll_key`, after answering the handshake, so that
    /// the work runs in parallel with the controller's (as Table II assumes).
    pending_channel: Option<G::Element>,
}

#[derive(Clone)]
struct Secure<G: Group> {
    controller: MemberId,
    /// Pairwise keys: with every member if this member is the controller, else with the controller.
    channels: BTreeMap<MemberId, G::Scalar>,
}

#[derive(Clone)]
struct Run<G: Group> {
    controller: MemberId,
    channels: BTreeMap<MemberId, G::Scalar>,
    /// Controller: members still to answer the handshake.
    waiting: BTreeSet<MemberId>,
    /// Member: whether it must wait for the controller's share first.
    expect_hello: bool,
}

impl<G: Group> Drop for Secure<G> {
    fn drop(&mut self) {
        self.channels
            .values_mut()
            .for_each(zeroize::Zeroize::zeroize);
    }
}

impl<G: Group> Drop for Run<G> {
    fn drop(&mut self) {
        self.channels
            .values_mut()
            .for_each(zeroize::Zeroize::zeroize);
    }
}

impl<G: Group> Drop for Ckd<G> {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.r);
        if let Some(s) = self.pending.as_mut() {
            zeroize::Zeroize::zeroize(s);
        }
    }
}

impl<G: Group> Ckd<G> {
    pub fn new(
        me: &str,
        group: &str,
        identity: Identity,
        directory: SharedDirectory,
        rng: &mut dyn CryptoRng,
    ) -> Self {
        let r = G::random_scalar(rng);
        let share = G::exp_g(&r);
        Ckd {
            core: Core::new(
                me.into(),
                group.into(),
                ProtocolId::Ckd,
                identity,
                directory,
            ),
            r,
            share,
            secure: None,
            run: None,
            pending: None,
            pending_channel: None,
        }
    }

    fn distribute(&mut self, rng: &mut dyn CryptoRng) -> Result<(), GkaError> {
        let view = self.core.view()?.clone();
        let run = self.run.as_ref().expect("controller run");
        let s = G::random_scalar(rng);
        let others: Vec<&MemberId> = view
            .members
            .iter()
            .filter(|m| **m != self.core.me)
            .collect();
        let exps: Vec<G::Scalar> = others
            .iter()
            .map(|m| G::scalar_mul(&s, &run.channels[*m]))
            .collect();
        self.core.meter.exps += exps.len() as u64;
        let entries: Vec<(MemberId, Vec<u8>)> = others
            .into_iter()
            .cloned()
            .zip(G::exp_g_batch_encoded(&exps))
            .collect();
        if !entries.is_empty() {
            self.core.send(
                Dest::Broadcast,
                Order::Agreed,
                3,
                CkdMsg::KeyDist {
                    roster: view.members.to_vec(),
                    entries,
                }
                .encode(),
            )?;
        }
        let mut run = self.run.take().expect("controller run");
        self.secure = Some(Secure {
            controller: std::mem::take(&mut run.controller),
            channels: std::mem::take(&mut run.channels),
        });
        self.pending = Some(s);
        Ok(())
    }

    fn flush_pending(&mut self) {
        if let Some(cs) = self.pending_channel.take() {
            let k = ops::to_scalar::<G>(
                CHANNEL_LABEL,
                &ops::exp::<G>(&mut self.core.meter, &cs, &self.r),
            );
            if let Some(run) = self.run.as_mut() {
                run.channels.insert(run.controller.clone(), k);
            }
        }
        if let Some(s) = self.pending.take() {
            let secret =
                zeroize::Zeroizing::new(G::encode(&ops::exp_g::<G>(&mut self.core.meter, &s)));
            let _ = self.core.complete(&secret, b"");
        }
    }
}

impl<G: Group> KeyAgreement for Ckd<G> {
    fn protocol(&self) -> ProtocolId {
        ProtocolId::Ckd
    }
    forward_to_core!();

    fn handle_view(&mut self, rng: &mut dyn CryptoRng, view: View) -> Result<(), GkaError> {
        self.flush_pending();
        self.core.install_view(view)?;
        self.run = None;
        self.pending_channel = None;
        let view = self.core.view()?.clone();
        let me = self.core.me.clone();
        let controller = view.members[0].clone();
        let side = self.core.side.clone();
        // Channels that survive: same side, same controller.
        let channels: BTreeMap<MemberId, G::Scalar> = match &self.secure {
            Some(s) if s.controller == controller && side.contains(&controller) => s
                .channels
                .iter()
                .filter(|(m, _)| side.contains(m))
                .map(|(m, k)| (m.clone(), k.clone()))
                .collect(),
            _ => BTreeMap::new(),
        };
        if controller == me {
            let need: Vec<MemberId> = view
                .members
                .iter()
                .filter(|m| **m != me && !channels.contains_key(*m))
                .cloned()
                .collect();
            self.run = Some(Run {
                controller,
                channels,
                waiting: need.iter().cloned().collect(),
                expect_hello: false,
            });
            match need.len() {
                0 => return self.distribute(rng),
                1 => {
                    let msg = CkdMsg::Hello {
                        controller_share: G::encode(&self.share),
                        recipients: need.clone(),
                    };
                    self.core
                        .send(Dest::Unicast(need[0].clone()), Order::Fifo, 1, msg.encode())?;
                }
                _ => {
                    let msg = CkdMsg::Hello {
                        controller_share: G::encode(&self.share),
                        recipients: need,
                    };
                    self.core
                        .send(Dest::Broadcast, Order::Agreed, 1, msg.encode())?;
                }
            }
        } else {
            let expect_hello = !channels.contains_key(&controller);
            self.run = Some(Run {
                controller,
                channels,
                waiting: BTreeSet::new(),
                expect_hello,
            });
        }
        Ok(())
    }

    fn handle_message(
        &mut self,
        rng: &mut dyn CryptoRng,
        from: &str,
        bytes: &[u8],
    ) -> Result<(), GkaError> {
        self.flush_pending();
        let (env, signed_len) = self.core.check(from, bytes)?;
        let msg = CkdMsg::decode(env.kind, &env.body)?;
        let me = self.core.me.clone();
        let run = self
            .run
            .as_ref()
            .ok_or(GkaError::Misplaced("no CKD run in progress"))?;
        let from_controller = env.sender == run.controller;
        match msg {
            CkdMsg::Hello {
                controller_share,
                recipients,
            } => {
                if !from_controller {
                    return Err(GkaError::Misplaced("handshake not from the controller"));
                }
                if !recipients.contains(&me) {
                    // Addressed to others: nothing to do, not worth a verification.
                    return Ok(());
                }
                if !run.expect_hello {
                    return Err(GkaError::Misplaced("handshake already done"));
                }
                // The signature first: only then is the sender's element worth decoding.
                let inc = self.core.verify(bytes, env, signed_len)?;
                let cs = ops::decode::<G>(&mut self.core.meter, &controller_share)?;
                let controller = run.controller.clone();
                self.core.send(
                    Dest::Unicast(controller.clone()),
                    Order::Fifo,
                    2,
                    CkdMsg::Response {
                        member_share: G::encode(&self.share),
                    }
                    .encode(),
                )?;
                self.pending_channel = Some(cs);
                self.run.as_mut().expect("checked").expect_hello = false;
                self.core.applied(&inc);
                Ok(())
            }
            CkdMsg::Response { member_share } => {
                if run.controller != me || !run.waiting.contains(&env.sender) {
                    return Err(GkaError::Misplaced("handshake answer not expected"));
                }
                let inc = self.core.verify(bytes, env, signed_len)?;
                let ms = ops::decode::<G>(&mut self.core.meter, &member_share)?;
                let k = ops::to_scalar::<G>(
                    CHANNEL_LABEL,
                    &ops::exp::<G>(&mut self.core.meter, &ms, &self.r),
                );
                let run = self.run.as_mut().expect("checked");
                run.waiting.remove(&inc.sender);
                run.channels.insert(inc.sender.clone(), k);
                let done = run.waiting.is_empty();
                self.core.applied(&inc);
                if done {
                    self.distribute(rng)?;
                }
                Ok(())
            }
            CkdMsg::KeyDist { roster, entries } => {
                if !from_controller || run.controller == me {
                    return Err(GkaError::Misplaced(
                        "key distribution not from the controller",
                    ));
                }
                if roster[..] != self.core.view()?.members[..] {
                    return Err(GkaError::Misplaced(
                        "key distribution for another membership",
                    ));
                }
                let k = run
                    .channels
                    .get(&run.controller)
                    .ok_or(GkaError::Misplaced("no channel with the controller"))?;
                // Every entry is checked, not only this member's: members must all accept or all
                // refuse a message, or those that move together would part ways.
                if entries.len() + 1 != roster.len() {
                    return Err(GkaError::Misplaced(
                        "key distribution without an entry per member",
                    ));
                }
                // The signature before the entries: decoding one costs a subgroup check (an
                // exponentiation with MODP), which a forger must not be able to make members
                // spend n times over.
                let inc = self.core.verify(bytes, env, signed_len)?;
                let mut seen = std::collections::BTreeSet::new();
                let mut mine = None;
                for (m, value) in &entries {
                    if *m == run.controller
                        || !self.core.member_set.contains(m)
                        || !seen.insert(m.as_str())
                    {
                        return Err(GkaError::Misplaced("key distribution names a wrong member"));
                    }
                    let e = ops::decode::<G>(&mut self.core.meter, value)?;
                    if *m == me {
                        mine = Some(e);
                    }
                }
                let e = mine.ok_or(GkaError::Misplaced("no entry for this member"))?;
                let k_inv = ops::inv::<G>(k);
                let ks = ops::exp::<G>(&mut self.core.meter, &e, &k_inv);
                let mut run = self.run.take().expect("checked");
                self.secure = Some(Secure {
                    controller: std::mem::take(&mut run.controller),
                    channels: std::mem::take(&mut run.channels),
                });
                self.core.applied(&inc);
                self.core
                    .complete(&zeroize::Zeroizing::new(G::encode(&ks)), b"")
            }
        }
    }

    fn poll_key(&mut self) -> Option<SecureView> {
        self.flush_pending();
        self.core.poll_key()
    }
}
