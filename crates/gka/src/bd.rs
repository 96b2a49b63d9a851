//! Burmester-Desmedt (paper 000 §4.5, Fig 9; slides 003).
//!
//! Stateless: every view runs the same two rounds among the members in the view's agreed order
//! (a ring). Round 1: `Z_i = g^{r_i}`. Round 2: `X_i = (Z_{i+1}/Z_{i-1})^{r_i}`. Key:
//! `K = Z_{i-1}^{n r_i} · X_i^{n-1} · X_{i+1}^{n-2} ⋯ X_{i+n-2}`.
//!
//! Departures from the paper:
//! - The product of `X`s with the descending small exponents (the "hidden cost" of §5, n-1 small
//!   exponentiations) is computed as the product of the n-1 prefix products
//!   `X_i, X_iX_{i+1}, ...`, which needs 2(n-1) multiplications and no exponentiation at all.
//! - A member verifies only the messages whose content it uses: `Z_{i-1}`, `Z_{i+1}` and the
//!   n-1 other `X`s, that is n+1 verifications for a view of n members. Table II counts one more
//!   (n'+2 for a view of n' members: "n+3" for a join).
//! - Cascades: a new view restarts the protocol (it has no state to keep).
//! - A `Z` from a member that is not a neighbour is never used, so it is dropped unverified
//!   (`Ok`, no effect) rather than refused.

use crate::api::{Dest, GkaError, KeyAgreement, Order, SecureView, SharedDirectory, View};
use crate::core::Core;
use crate::ops;
use conclave_crypto::{CryptoRng, Group, Identity};
use conclave_wire::gka::{BdMsg, ProtocolId};
use std::collections::BTreeMap;

/// One member's BD state machine.
#[derive(Clone)]
pub struct Bd<G: Group> {
    core: Core,
    run: Option<Run<G>>,
}

#[derive(Clone)]
struct Run<G: Group> {
    n: usize,
    me: usize,
    prev: usize,
    next: usize,
    r: G::Scalar,
    z_prev: Option<G::Element>,
    z_next: Option<G::Element>,
    /// `X_j` by ring index, own included once sent.
    x: BTreeMap<usize, G::Element>,
    sent_x: bool,
}

impl<G: Group> Drop for Run<G> {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.r);
    }
}

impl<G: Group> Bd<G> {
    pub fn new(me: &str, group: &str, identity: Identity, directory: SharedDirectory) -> Self {
        Bd {
            core: Core::new(me.into(), group.into(), ProtocolId::Bd, identity, directory),
            run: None,
        }
    }

    fn try_round2(&mut self) -> Result<(), GkaError> {
        let Some(run) = self.run.as_mut() else {
            return Ok(());
        };
        if run.sent_x {
            return Ok(());
        }
        let (Some(zp), Some(zn)) = (&run.z_prev, &run.z_next) else {
            return Ok(());
        };
        let x = ops::exp::<G>(&mut self.core.meter, &G::div(zn, zp), &run.r);
        run.x.insert(run.me, x.clone());
        run.sent_x = true;
        self.core.send(
            Dest::Broadcast,
            Order::Agreed,
            2,
            BdMsg::X { x: G::encode(&x) }.encode(),
        )?;
        self.try_finish()
    }

    fn try_finish(&mut self) -> Result<(), GkaError> {
        let Some(run) = self.run.as_ref() else {
            return Ok(());
        };
        if !run.sent_x || run.x.len() < run.n {
            return Ok(());
        }
        let zp = run.z_prev.as_ref().expect("z_prev known once X is sent");
        let nr = G::scalar_mul(&G::scalar_from_u64(run.n as u64), &run.r);
        let mut key = ops::exp::<G>(&mut self.core.meter, zp, &nr);
        // prod_{k=0}^{n-2} X_{i+k}^{n-1-k} = prod_{m=1}^{n-1} (X_i ... X_{i+m-1}).
        let mut prefix = G::identity();
        for k in 0..run.n - 1 {
            prefix = G::mul(&prefix, &run.x[&((run.me + k) % run.n)]);
            key = G::mul(&key, &prefix);
        }
        let secret = zeroize::Zeroizing::new(G::encode(&key));
        self.run = None;
        self.core.complete(&secret, b"")
    }
}

impl<G: Group> KeyAgreement for Bd<G> {
    fn protocol(&self) -> ProtocolId {
        ProtocolId::Bd
    }
    forward_to_core!();

    fn handle_view(&mut self, rng: &mut dyn CryptoRng, view: View) -> Result<(), GkaError> {
        self.core.install_view(view)?;
        self.run = None;
        let view = self.core.view()?;
        let n = view.members.len();
        let me = self
            .core
            .position(&self.core.me)
            .expect("checked by install_view");
        let r = G::random_scalar(rng);
        if n == 1 {
            let secret =
                zeroize::Zeroizing::new(G::encode(&ops::exp_g::<G>(&mut self.core.meter, &r)));
            return self.core.complete(&secret, b"");
        }
        let z = ops::exp_g::<G>(&mut self.core.meter, &r);
        self.run = Some(Run {
            n,
            me,
            prev: (me + n - 1) % n,
            next: (me + 1) % n,
            r,
            z_prev: None,
            z_next: None,
            x: BTreeMap::new(),
            sent_x: false,
        });
        self.core.send(
            Dest::Broadcast,
            Order::Agreed,
            1,
            BdMsg::Z { z: G::encode(&z) }.encode(),
        )
    }

    fn handle_message(
        &mut self,
        _rng: &mut dyn CryptoRng,
        from: &str,
        bytes: &[u8],
    ) -> Result<(), GkaError> {
        let (env, signed_len) = self.core.check(from, bytes)?;
        let msg = BdMsg::decode(env.kind, &env.body)?;
        let run = self
            .run
            .as_ref()
            .ok_or(GkaError::Misplaced("no BD run in progress"))?;
        let j = self
            .core
            .position(&env.sender)
            .expect("checked: sender is a member");
        match msg {
            BdMsg::Z { z } => {
                let needed = (j == run.prev && run.z_prev.is_none())
                    || (j == run.next && run.z_next.is_none());
                if !needed {
                    if j == run.prev || j == run.next {
                        return Err(GkaError::Misplaced("second Z from a neighbour"));
                    }
                    // Not a neighbour: the content is never used, so it is not worth a verification.
                    return Ok(());
                }
                let inc = self.core.verify(bytes, env, signed_len)?;
                let z = ops::decode::<G>(&mut self.core.meter, &z)?;
                let run = self.run.as_mut().expect("run checked above");
                if j == run.prev {
                    run.z_prev = Some(z.clone());
                }
                if j == run.next {
                    run.z_next = Some(z);
                }
                self.core.applied(&inc);
                self.try_round2()
            }
            BdMsg::X { x } => {
                if run.x.contains_key(&j) {
                    return Err(GkaError::Misplaced("second X from one member"));
                }
                // With two members X is always the identity.
                let inc = self.core.verify(bytes, env, signed_len)?;
                let x = ops::decode_any::<G>(&mut self.core.meter, &x)?;
                self.run.as_mut().expect("run checked above").x.insert(j, x);
                self.core.applied(&inc);
                self.try_finish()
            }
        }
    }

    fn poll_key(&mut self) -> Option<SecureView> {
        self.core.poll_key()
    }
}
