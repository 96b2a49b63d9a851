//! A member's end of a key-graph group (paper 001 through the key server, docs/keygraph.md,
//! "Running the server"): it answers the server's invitation with the registration exchange,
//! keeps the keys of its path in the graph from the rekey messages, and learns from the server's
//! signed view key which group key the members of a view seal under.
//!
//! Departure from paper 001: the paper's members learn the group key and use it; here a group key
//! counts for a view only once the server has bound it to the view (or the view has the same
//! holders as the last keyed one, see `SecureGroup`), so that data is sealed per view as in the
//! layered architecture and a rekey that arrives mid-view never splits the members.

use crate::KeyGraphError;
use conclave_crypto::aead::Aead;
use conclave_crypto::aead::AeadAlg;
use conclave_crypto::{CryptoRng, GroupKey, PublicIdentity};
use conclave_gka::SharedDirectory;
use conclave_keygraph::{GraphKind, JoinAck, Member, MemberConfig, MemberError, Registration};
use conclave_keygraph::{Slot, UserId};
use conclave_wire::client::GroupViewId;
use conclave_wire::keyserver::{
    Admission, InvitationsMsg, LateKeyMsg, RegisterMsg, ServiceMsg, ViewKeyMsg,
};

/// What a service message asks of the member's group.
pub(crate) enum Outcome {
    Nothing,
    /// A service message to multicast to the group.
    Send(Vec<u8>),
    /// The server's key for the current view: its holders are the view's members but `excluded`.
    Key {
        epoch: u64,
        excluded: Vec<String>,
        key: GroupKey,
    },
}

pub(crate) struct KeyGraphMember {
    group: String,
    me: String,
    server: String,
    directory: SharedDirectory,
    registration: Option<Registration>,
    member: Option<Member>,
    /// The view this member last knocked in: one knock per view.
    knocked: Option<GroupViewId>,
    /// The graph's group key the last keyed view was bound to, and its epoch.
    bound: Option<(u64, GroupKey)>,
    /// The individual key of this member's last registration (a late key is sealed under it).
    individual: Option<GroupKey>,
    /// A rekey past the bound epoch, or a knock, came in the view since the key was bound: the
    /// next view waits for the server. Decided on what the view delivered, so the same at every
    /// member that comes through with this one (a member that applied part of a batch and one
    /// that applied none of it decide alike).
    no_keep: bool,
}

/// The key that seals a late key for the member whose individual key is `individual`.
pub(crate) fn late_sealing(individual: &GroupKey, msg: &LateKeyMsg) -> Aead {
    let key = conclave_crypto::kdf::derive::<32>(
        b"conclave keyserver late key",
        individual.expose(),
        &msg.sealing_aad(),
    );
    Aead::new(AeadAlg::ChaCha20Poly1305, &key)
}

/// A view's key from the graph's group key it is bound to: each view gets a key of its own (a
/// view that keeps the last one's group key still seals under a new key), which the server can
/// compute too.
pub(crate) fn view_key(
    group: &str,
    graph_key: &GroupKey,
    view: GroupViewId,
    epoch: u64,
) -> GroupKey {
    let v = view.to_bytes();
    let e = epoch.to_be_bytes();
    GroupKey::from_bytes(*conclave_crypto::kdf::derive::<32>(
        b"conclave key graph view key",
        graph_key.expose(),
        &conclave_crypto::kdf::info(&[group.as_bytes(), &v, &e]),
    ))
}

impl KeyGraphMember {
    pub fn new(group: &str, me: &str, server: &str, directory: SharedDirectory) -> Self {
        KeyGraphMember {
            group: group.to_owned(),
            me: me.to_owned(),
            server: server.to_owned(),
            directory,
            registration: None,
            member: None,
            knocked: None,
            bound: None,
            individual: None,
            no_keep: false,
        }
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// The key of `view` from the group key the last keyed view was bound to, with its epoch
    /// (for a view with the same holders: see `SecureGroup`).
    /// Not if a rekey came since (a member registered again in that view): the server binds the
    /// next view to the new group key, and a member that had only the new one would differ.
    pub fn keep(&self, view: GroupViewId) -> Option<(u64, GroupKey)> {
        let (epoch, graph_key) = self.bound.as_ref()?;
        if self.no_keep || self.member.as_ref()?.epoch() != Some(*epoch) {
            return None;
        }
        Some((*epoch, view_key(&self.group, graph_key, view, *epoch)))
    }

    fn server_identity(&self) -> Result<PublicIdentity, KeyGraphError> {
        let dir = self.directory.read().unwrap_or_else(|p| p.into_inner());
        dir.get(&self.server)
            .cloned()
            .ok_or_else(|| KeyGraphError::UnknownServer(self.server.clone()))
    }

    /// A service message `from` a member of the current `view` (the daemons name the sender).
    pub fn handle(
        &mut self,
        from: &str,
        body: &[u8],
        view: GroupViewId,
        identity: &conclave_crypto::Identity,
        rng: &mut dyn CryptoRng,
    ) -> Result<Outcome, KeyGraphError> {
        let msg = ServiceMsg::decode(body).map_err(KeyGraphError::Malformed)?;
        match &msg {
            // Other members' knocks are for the server (but the server answers them with a
            // rekey: the next view waits for its view key), and others' late keys for them.
            ServiceMsg::Knock { .. } => {
                self.no_keep = true;
                return Ok(Outcome::Nothing);
            }
            ServiceMsg::LateKey(l) if l.member != self.me => return Ok(Outcome::Nothing),
            ServiceMsg::Invitations(i) if i.exchange(&self.me).is_none() => {
                return Ok(Outcome::Nothing)
            }
            _ => {}
        }
        if let ServiceMsg::Register(b) = msg {
            let reg = RegisterMsg::decode(b).map_err(|e| KeyGraphError::Register(e.into()))?;
            // Others' exchanges, and hellos (for the server), are not this member's business.
            if reg.exchange().member != self.me || matches!(reg, RegisterMsg::Hello { .. }) {
                return Ok(Outcome::Nothing);
            }
        }
        if from != self.server {
            return Err(KeyGraphError::NotServer(from.to_owned()));
        }
        match msg {
            ServiceMsg::Register(b) => self.on_register(from, b, view, identity, rng),
            ServiceMsg::Rekey(b) => self.on_rekey(b, view),
            ServiceMsg::ViewKey(v) => self.on_view_key(v, view),
            ServiceMsg::LateKey(l) => self.on_late_key(l, view),
            ServiceMsg::Invitations(i) => self.on_invitations(from, &i, view, identity, rng),
            ServiceMsg::Knock { .. } => Ok(Outcome::Nothing),
        }
    }

    fn registration(
        &mut self,
        identity: &conclave_crypto::Identity,
    ) -> Result<&mut Registration, KeyGraphError> {
        if self.registration.is_none() {
            let server = self.server_identity()?;
            self.registration = Some(
                Registration::new(
                    &self.group,
                    &self.me,
                    &self.server,
                    identity.clone(),
                    server,
                )
                .map_err(KeyGraphError::Register)?,
            );
        }
        Ok(self.registration.as_mut().expect("made above"))
    }

    fn on_invitations(
        &mut self,
        from: &str,
        msg: &InvitationsMsg,
        view: GroupViewId,
        identity: &conclave_crypto::Identity,
        rng: &mut dyn CryptoRng,
    ) -> Result<Outcome, KeyGraphError> {
        let r = self.registration(identity)?;
        match r
            .handle_invitations(from, msg, view, rng)
            .map_err(KeyGraphError::Register)?
        {
            Some(hello) => Ok(Outcome::Send(ServiceMsg::Register(&hello).encode())),
            None => Ok(Outcome::Nothing),
        }
    }

    fn on_register(
        &mut self,
        from: &str,
        bytes: &[u8],
        view: GroupViewId,
        identity: &conclave_crypto::Identity,
        rng: &mut dyn CryptoRng,
    ) -> Result<Outcome, KeyGraphError> {
        let reg = KeyGraphError::Register;
        match RegisterMsg::decode(bytes).map_err(|e| reg(e.into()))? {
            RegisterMsg::Invite { .. } => {
                let r = self.registration(identity)?;
                let hello = r.handle_invite(from, bytes, view, rng).map_err(reg)?;
                Ok(Outcome::Send(ServiceMsg::Register(&hello).encode()))
            }
            RegisterMsg::Welcome { .. } => {
                let r = self
                    .registration
                    .as_mut()
                    .ok_or(reg(conclave_keygraph::RegisterError::NotWaiting))?;
                let welcomed = r.handle_welcome(from, bytes).map_err(reg)?;
                let a = Admission::decode(&welcomed.admission)
                    .map_err(|e| reg(conclave_keygraph::RegisterError::Decode(e)))?;
                if a.degree
                    .is_some_and(|d| !(2..=conclave_keygraph::server::MAX_DEGREE).contains(&d))
                {
                    return Err(reg(conclave_keygraph::RegisterError::Admission(
                        "a tree degree outside 2..=1024".into(),
                    )));
                }
                let cfg = MemberConfig {
                    group: self.group.clone(),
                    graph: match a.degree {
                        None => GraphKind::Star,
                        Some(degree) => GraphKind::Tree { degree },
                    },
                    aead: match a.aead {
                        0 => AeadAlg::Aes256Gcm,
                        _ => AeadAlg::ChaCha20Poly1305,
                    },
                    server: Some(self.server_identity()?),
                };
                let ack = JoinAck {
                    user: UserId(a.user),
                    slot: Slot(a.slot),
                    epoch: a.epoch,
                };
                // A member registered again starts over: the old keys are of no use.
                self.individual = Some(welcomed.key.clone());
                self.member =
                    Some(Member::new(cfg, &ack, welcomed.key).map_err(KeyGraphError::Rekey)?);
                Ok(Outcome::Nothing)
            }
            RegisterMsg::Hello { .. } => Ok(Outcome::Nothing),
        }
    }

    fn on_rekey(&mut self, bytes: &[u8], view: GroupViewId) -> Result<Outcome, KeyGraphError> {
        // From the server's name (checked by the caller), even one not for this member.
        let epoch = conclave_wire::lkh::RekeyMessage::decode(bytes).map(|(m, _)| m.epoch);
        if let (Ok(e), Some((bound, _))) = (epoch, &self.bound) {
            if e > *bound {
                self.no_keep = true;
            }
        }
        let Some(m) = self.member.as_mut() else {
            // Not registered yet: the rekeys before this member's welcome are not for it.
            return Ok(Outcome::Nothing);
        };
        match m.handle_rekey(bytes) {
            Ok(_) | Err(MemberError::NotForMe) => Ok(Outcome::Nothing),
            // The other messages of the epoch just applied (each set of members gets its own).
            Err(MemberError::Stale { epoch, expected }) if epoch + 1 == expected => {
                Ok(Outcome::Nothing)
            }
            Err(MemberError::Gap { .. }) => {
                // Keys were missed: only a new registration gives them back.
                self.member = None;
                Ok(self.knock(view))
            }
            Err(e) => Err(KeyGraphError::Rekey(e)),
        }
    }

    /// The key of the current view, for this member registered after it was announced.
    fn on_late_key(&mut self, l: LateKeyMsg, view: GroupViewId) -> Result<Outcome, KeyGraphError> {
        if l.group != self.group || l.server != self.server {
            return Err(KeyGraphError::ViewKey(
                "late key for another group or server",
            ));
        }
        self.server_identity()?
            .verify(&l.signed_bytes(), &l.signature)
            .map_err(|_| KeyGraphError::ViewKey("bad signature on a late key"))?;
        if l.view != view {
            return Err(KeyGraphError::ViewKey(
                "late key for another view (stale or replayed)",
            ));
        }
        let individual = self
            .individual
            .as_ref()
            .ok_or(KeyGraphError::ViewKey("late key before any registration"))?;
        let plain = late_sealing(individual, &l)
            .open(
                [0; conclave_crypto::aead::NONCE_BYTES],
                &l.sealing_aad(),
                &l.sealed,
            )
            .map_err(|_| KeyGraphError::ViewKey("late key does not open"))?;
        let plain = zeroize::Zeroizing::new(plain);
        let bytes: [u8; 32] = plain
            .as_slice()
            .try_into()
            .map_err(|_| KeyGraphError::ViewKey("late key of the wrong length"))?;
        // The view's key itself, not the group key it comes from: a late member gets no key of
        // the views before this one. It keeps nothing into the next view (its registration
        // brings a rekey), so no group key is bound here.
        let key = GroupKey::from_bytes(bytes);
        self.bound = None;
        let excluded = l.excluded.into_iter().filter(|m| *m != self.me).collect();
        Ok(Outcome::Key {
            epoch: l.epoch,
            excluded,
            key,
        })
    }

    fn knock(&mut self, view: GroupViewId) -> Outcome {
        if self.knocked == Some(view) {
            return Outcome::Nothing;
        }
        self.knocked = Some(view);
        Outcome::Send(
            ServiceMsg::Knock {
                group: self.group.clone(),
                view,
            }
            .encode(),
        )
    }

    fn on_view_key(&mut self, v: ViewKeyMsg, view: GroupViewId) -> Result<Outcome, KeyGraphError> {
        if v.group != self.group || v.server != self.server {
            return Err(KeyGraphError::ViewKey("for another group or server"));
        }
        self.server_identity()?
            .verify(&v.signed_bytes(), &v.signature)
            .map_err(|_| KeyGraphError::ViewKey("bad signature"))?;
        if v.view != view {
            return Err(KeyGraphError::ViewKey(
                "for another view (stale or replayed)",
            ));
        }
        if v.excluded.contains(&self.me) {
            // Not registered in time: the server invites again in the next view.
            return Ok(Outcome::Nothing);
        }
        let held = self.member.as_ref().and_then(|m| {
            let (r, k) = m.group_key()?;
            (m.epoch() == Some(v.epoch) && r.id == v.key_id && r.version == v.key_version)
                .then(|| k.clone())
        });
        match held {
            Some(graph_key) => {
                let key = view_key(&self.group, &graph_key, view, v.epoch);
                self.bound = Some((v.epoch, graph_key));
                self.no_keep = false;
                Ok(Outcome::Key {
                    epoch: v.epoch,
                    excluded: v.excluded,
                    key,
                })
            }
            // The server counts this member as a holder but it lacks the key (it missed a rekey,
            // or it is a new incarnation under an old name).
            None => {
                self.member = None;
                Ok(self.knock(view))
            }
        }
    }
}
