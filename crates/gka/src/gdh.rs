//! Group Diffie-Hellman, IKA.2 and its auxiliary operations (paper 000 §4.1, Figs 1-2).
//!
//! Secure state kept between views: the GDH order (`roster`, controller last), this member's
//! contribution `r`, and every member's partial key `g^{Π/r_j}` (the controller's own partial is
//! the token it received before adding its contribution).
//!
//! A view with one side (leave, partition, refresh) runs Fig 2: the controller (the last member of
//! the pruned roster) refreshes its contribution and broadcasts the refreshed partial keys; every
//! member raises its partial key to its contribution. A view with several sides runs Fig 1: the
//! *base* side is the one holding the view's first member; its controller refreshes its
//! contribution and sends the token along the other members (in view order), each adding a fresh
//! contribution; the last one, the new controller, broadcasts the token; everybody factors its
//! contribution out and unicasts the result to the new controller, which adds its own to each
//! and broadcasts the partial keys. Members of the other sides drop their old state and join as
//! fresh members, as the paper's merging members do. Group formation is the same merge, with a
//! base of one.
//!
//! Costs equal Tables I and II exactly (join `n+3` exponentiations, `4` signatures, `n+3`
//! verifications, `4` rounds; merge `n+2m+1`, `m+3`, `n+2m+1`; leave `n-1`, `1`, `1`).
//! Cascades restart from the newest view (see `core`); a member's own token is not committed until
//! the run completes, so an abandoned run changes nothing.

use crate::api::{
    Dest, GkaError, KeyAgreement, MemberId, Order, SecureView, SharedDirectory, View,
};
use crate::core::{index_of, Core};
use crate::ops;
use crate::tree::{Bk, BkData};
use conclave_crypto::{CryptoRng, Group, Identity, Meter};
use conclave_wire::gka::{GdhMsg, ProtocolId};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone)]
pub struct Gdh<G: Group> {
    core: Core,
    secure: Option<Secure<G>>,
    run: Option<Run<G>>,
    /// Own key to derive in `poll_key`, after the transmits.
    pending: Option<(G::Element, G::Scalar)>,
}

#[derive(Clone)]
struct Secure<G: Group> {
    roster: Vec<MemberId>,
    r: G::Scalar,
    partials: BTreeMap<MemberId, Partial<G>>,
}

/// A partial key, with its encoding (shared with the key tree's blinded keys).
type Partial<G> = Bk<G>;

impl<G: Group> Drop for Secure<G> {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.r);
    }
}

impl<G: Group> Drop for Run<G> {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.r);
    }
}

#[derive(Clone)]
struct Run<G: Group> {
    /// The GDH order of this run, once known.
    roster: Option<Vec<MemberId>>,
    /// This member's contribution for this run.
    r: G::Scalar,
    stage: Stage<G>,
}

// Each stage is named by the message it waits for.
#[allow(clippy::enum_variant_names)]
#[derive(Clone)]
enum Stage<G: Group> {
    /// Waiting for the upflow token (members of the chain but the first).
    ExpectUpflow,
    /// Waiting for the new controller's broadcast of the token.
    ExpectDownflow,
    /// New controller: collecting factor-out tokens.
    ExpectFactorOuts {
        token: G::Element,
        got: BTreeMap<MemberId, G::Element>,
    },
    /// Waiting for the partial keys; `token` is the controller's partial once the downflow is known.
    ExpectPartials { token: Option<G::Element> },
}

/// Raises every base to `s` (counting one exponentiation each) and keeps the encodings, which a
/// batch computes more cheaply than one by one.
fn exp_partials<G: Group>(
    meter: &mut Meter,
    bases: &[(MemberId, G::Element)],
    s: &G::Scalar,
) -> BTreeMap<MemberId, Partial<G>> {
    meter.exps += bases.len() as u64;
    let refs: Vec<&G::Element> = bases.iter().map(|(_, b)| b).collect();
    let (elems, enc) = G::exp_batch(&refs, s);
    bases
        .iter()
        .zip(elems.into_iter().zip(enc))
        .map(|((m, _), (e, b))| (m.clone(), BkData::from_parts(e, b)))
        .collect()
}

impl<G: Group> Gdh<G> {
    pub fn new(me: &str, group: &str, identity: Identity, directory: SharedDirectory) -> Self {
        Gdh {
            core: Core::new(
                me.into(),
                group.into(),
                ProtocolId::Gdh,
                identity,
                directory,
            ),
            secure: None,
            run: None,
            pending: None,
        }
    }

    fn alone(&self, rng: &mut dyn CryptoRng) -> Secure<G> {
        Secure {
            roster: vec![self.core.me.clone()],
            r: G::random_scalar(rng),
            partials: BTreeMap::from([(
                self.core.me.clone(),
                BkData::from_elem(G::exp_g(&G::scalar_from_u64(1))),
            )]),
        }
    }

    fn finish(
        &mut self,
        roster: Vec<MemberId>,
        r: G::Scalar,
        partials: BTreeMap<MemberId, Partial<G>>,
    ) -> Result<(), GkaError> {
        let mine = partials
            .get(&self.core.me)
            .ok_or(GkaError::Misplaced("no partial key for this member"))?
            .elem()
            .clone();
        self.secure = Some(Secure {
            roster,
            r: r.clone(),
            partials,
        });
        self.run = None;
        self.pending = Some((mine, r));
        Ok(())
    }

    fn flush_pending(&mut self) {
        if let Some((partial, r)) = self.pending.take() {
            let secret = zeroize::Zeroizing::new(G::encode(&ops::exp::<G>(
                &mut self.core.meter,
                &partial,
                &r,
            )));
            // A run only completes with a view installed, so this cannot fail.
            let _ = self.core.complete(&secret, b"");
        }
    }

    fn broadcast_partials(
        &mut self,
        roster: Vec<MemberId>,
        partials: BTreeMap<MemberId, Partial<G>>,
    ) -> Result<(), GkaError> {
        let list = roster
            .iter()
            .filter(|m| **m != self.core.me)
            .map(|m| {
                partials
                    .get(m)
                    .map(|p| (m.clone(), p.bytes().to_vec()))
                    .ok_or(GkaError::Misplaced(
                        "no partial key for a member of the roster",
                    ))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.core.send(
            Dest::Broadcast,
            Order::Agreed,
            4,
            GdhMsg::Partials {
                roster,
                partials: list,
            }
            .encode(),
        )
    }
}

/// The body of an upflow (or, if `down`, a downflow) message, and its roster back: the roster is
/// kept after sending, not copied (at n = 1,024 a copy of its names costs an upflow hop about a
/// third of its exponentiation).
fn flow(down: bool, roster: Vec<MemberId>, token: Vec<u8>) -> (Vec<u8>, Vec<MemberId>) {
    let msg = if down {
        GdhMsg::Downflow { roster, token }
    } else {
        GdhMsg::Upflow { roster, token }
    };
    let body = msg.encode();
    match msg {
        GdhMsg::Upflow { roster, .. } | GdhMsg::Downflow { roster, .. } => (body, roster),
        _ => unreachable!("built above"),
    }
}

impl<G: Group> KeyAgreement for Gdh<G> {
    fn protocol(&self) -> ProtocolId {
        ProtocolId::Gdh
    }
    forward_to_core!();

    fn handle_view(&mut self, rng: &mut dyn CryptoRng, view: View) -> Result<(), GkaError> {
        self.flush_pending();
        self.core.install_view(view)?;
        self.run = None;
        let view = self.core.view()?.clone();
        let side = self.core.side.clone();
        let secure = match (&self.secure, side.len()) {
            (Some(s), n) if n > 1 || s.roster.len() == 1 => s.clone(),
            _ => self.alone(rng),
        };
        let me = self.core.me.clone();
        let base_roster: Vec<MemberId> = secure
            .roster
            .iter()
            .filter(|m| side.contains(m))
            .cloned()
            .collect();
        if base_roster.len() != side.len() {
            return Err(GkaError::InvalidView(
                "side is not covered by the secure state",
            ));
        }

        if self.core.single_side() {
            // Fig 2: the controller refreshes and rebroadcasts the partial keys.
            let controller = base_roster.last().expect("side holds this member").clone();
            if controller == me {
                let r_new = G::random_scalar(rng);
                let delta = G::scalar_mul(&r_new, &ops::inv::<G>(&secure.r));
                let mut others = Vec::with_capacity(base_roster.len());
                for m in base_roster.iter().filter(|m| **m != me) {
                    others.push((m.clone(), secure.partials[m].elem().clone()));
                }
                let mut partials = exp_partials::<G>(&mut self.core.meter, &others, &delta);
                partials.insert(me.clone(), secure.partials[&me].clone());
                if base_roster.len() > 1 {
                    self.broadcast_partials(base_roster.clone(), partials.clone())?;
                }
                return self.finish(base_roster, r_new, partials);
            }
            self.run = Some(Run {
                roster: Some(base_roster),
                r: secure.r.clone(),
                stage: Stage::ExpectPartials { token: None },
            });
            self.secure = Some(secure);
            return Ok(());
        }

        // Fig 1: merge. The base side holds the view's first member.
        let in_base = side.contains(&view.members[0]);
        if in_base {
            let chain: Vec<MemberId> = view
                .members
                .iter()
                .filter(|m| !side.contains(m))
                .cloned()
                .collect();
            let mut roster = base_roster.clone();
            roster.extend(chain.iter().cloned());
            let controller = base_roster.last().expect("side holds this member").clone();
            if controller == me {
                let r_new = G::random_scalar(rng);
                let token =
                    ops::exp::<G>(&mut self.core.meter, secure.partials[&me].elem(), &r_new);
                self.core.send(
                    Dest::Unicast(chain[0].clone()),
                    Order::Fifo,
                    1,
                    GdhMsg::Upflow {
                        roster: roster.clone(),
                        token: G::encode(&token),
                    }
                    .encode(),
                )?;
                self.run = Some(Run {
                    roster: Some(roster),
                    r: r_new,
                    stage: Stage::ExpectDownflow,
                });
            } else {
                self.run = Some(Run {
                    roster: Some(roster),
                    r: secure.r.clone(),
                    stage: Stage::ExpectDownflow,
                });
            }
            self.secure = Some(secure);
        } else {
            // A merging member joins with a fresh contribution; its old state is kept until the run
            // completes, so that an abandoned run leaves the side as it was.
            self.run = Some(Run {
                roster: None,
                r: G::random_scalar(rng),
                stage: Stage::ExpectUpflow,
            });
        }
        Ok(())
    }

    fn handle_message(
        &mut self,
        _rng: &mut dyn CryptoRng,
        from: &str,
        bytes: &[u8],
    ) -> Result<(), GkaError> {
        let inc = self.core.open(from, bytes)?;
        let msg = GdhMsg::decode(inc.kind, &inc.body)?;
        let view_members = self.core.member_set.clone();
        let me = self.core.me.clone();
        let run = self
            .run
            .as_mut()
            .ok_or(GkaError::Misplaced("no GDH run in progress"))?;
        match (msg, &mut run.stage) {
            (GdhMsg::Upflow { roster, token }, Stage::ExpectUpflow) => {
                // Only what this hop needs is checked here (an O(n) check per hop would make a
                // merge quadratic); the downflow's roster is checked against the view by everyone.
                if roster.len() != view_members.len()
                    || roster.last().is_some_and(|m| !view_members.contains(m))
                {
                    return Err(GkaError::Misplaced("upflow roster is not the view"));
                }
                let pos = index_of(&roster, &me)
                    .ok_or(GkaError::Misplaced("upflow roster without this member"))?;
                if pos == 0 || roster[pos - 1] != inc.sender {
                    return Err(GkaError::Misplaced(
                        "upflow from a member that is not my predecessor",
                    ));
                }
                let token = ops::decode::<G>(&mut self.core.meter, &token)?;
                if pos + 1 < roster.len() {
                    let next = ops::exp::<G>(&mut self.core.meter, &token, &run.r);
                    let to = roster[pos + 1].clone();
                    if !view_members.contains(&to) {
                        return Err(GkaError::Misplaced("upflow roster names a non-member"));
                    }
                    let (body, roster) = flow(false, roster, G::encode(&next));
                    run.roster = Some(roster);
                    run.stage = Stage::ExpectDownflow;
                    self.core.send(Dest::Unicast(to), Order::Fifo, 1, body)?;
                } else {
                    // The new controller checks, once per run, that the roster is exactly the view.
                    let set: BTreeSet<&MemberId> = roster.iter().collect();
                    if set.len() != roster.len() || !roster.iter().all(|m| view_members.contains(m))
                    {
                        return Err(GkaError::Misplaced("upflow roster is not the view"));
                    }
                    // The new controller broadcasts the token without its contribution.
                    let (body, roster) = flow(true, roster, G::encode(&token));
                    run.roster = Some(roster);
                    run.stage = Stage::ExpectFactorOuts {
                        token,
                        got: BTreeMap::new(),
                    };
                    self.core.send(Dest::Broadcast, Order::Agreed, 2, body)?;
                }
            }
            (GdhMsg::Downflow { roster, token }, Stage::ExpectDownflow) => {
                if let Some(expected) = &run.roster {
                    if *expected != roster {
                        return Err(GkaError::Misplaced(
                            "downflow roster differs from the upflow's",
                        ));
                    }
                }
                if roster.last() != Some(&inc.sender) {
                    return Err(GkaError::Misplaced(
                        "downflow not from the last member of the roster",
                    ));
                }
                let distinct: std::collections::HashSet<&str> =
                    roster.iter().map(String::as_str).collect();
                if roster.len() != view_members.len()
                    || distinct.len() != roster.len()
                    || !roster.iter().all(|m| view_members.contains(m))
                {
                    return Err(GkaError::Misplaced("downflow roster is not the view"));
                }
                let token = ops::decode::<G>(&mut self.core.meter, &token)?;
                let fo = ops::exp::<G>(&mut self.core.meter, &token, &ops::inv::<G>(&run.r));
                run.roster = Some(roster);
                run.stage = Stage::ExpectPartials { token: Some(token) };
                self.core.send(
                    Dest::Unicast(inc.sender.clone()),
                    Order::Fifo,
                    3,
                    GdhMsg::FactorOut {
                        value: G::encode(&fo),
                    }
                    .encode(),
                )?;
            }
            (GdhMsg::FactorOut { value }, Stage::ExpectFactorOuts { token, got }) => {
                if got.contains_key(&inc.sender) {
                    return Err(GkaError::Misplaced("second factor-out from one member"));
                }
                let v = ops::decode::<G>(&mut self.core.meter, &value)?;
                got.insert(inc.sender.clone(), v);
                if got.len() + 1 == view_members.len() {
                    let roster = run.roster.clone().expect("set with the upflow");
                    let token = token.clone();
                    let got = std::mem::take(got);
                    let r = run.r.clone();
                    let fos: Vec<(MemberId, G::Element)> = got.into_iter().collect();
                    let mut partials = exp_partials::<G>(&mut self.core.meter, &fos, &r);
                    partials.insert(me, BkData::from_elem(token));
                    self.broadcast_partials(roster.clone(), partials.clone())?;
                    self.core.applied(&inc);
                    return self.finish(roster, r, partials);
                }
            }
            (GdhMsg::Partials { roster, partials }, Stage::ExpectPartials { token }) => {
                let expected = run.roster.as_ref().expect("known in this stage");
                if *expected != roster || roster.last() != Some(&inc.sender) {
                    return Err(GkaError::Misplaced(
                        "partial keys from the wrong controller or roster",
                    ));
                }
                let mut map = BTreeMap::new();
                for (m, p) in &partials {
                    if !view_members.contains(m) || *m == inc.sender || map.contains_key(m) {
                        return Err(GkaError::Misplaced("partial key list names a wrong member"));
                    }
                    // Every entry is decoded, not only this member's: members must all accept or
                    // all refuse a message, or those that move together would part ways.
                    let partial: Partial<G> = BkData::checked(&mut self.core.meter, p)?;
                    map.insert(m.clone(), partial);
                }
                if map.len() + 1 != roster.len() {
                    return Err(GkaError::Misplaced("partial key list is incomplete"));
                }
                let controller_partial = match token.take() {
                    Some(t) => BkData::from_elem(t),
                    None => {
                        // Leave/partition: the controller's own partial does not change.
                        let s = self
                            .secure
                            .as_ref()
                            .ok_or(GkaError::Misplaced("no secure state"))?;
                        s.partials
                            .get(&inc.sender)
                            .cloned()
                            .ok_or(GkaError::Misplaced("unknown controller"))?
                    }
                };
                map.insert(inc.sender.clone(), controller_partial);
                let r = run.r.clone();
                self.core.applied(&inc);
                return self.finish(roster, r, map);
            }
            _ => {
                return Err(GkaError::Misplaced(
                    "GDH message not expected at this stage",
                ))
            }
        }
        self.core.applied(&inc);
        Ok(())
    }

    fn poll_key(&mut self) -> Option<SecureView> {
        self.flush_pending();
        self.core.poll_key()
    }
}
