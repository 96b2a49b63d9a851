//! The registration exchange: how a member of a key-graph group gets its individual key from the
//! key server (docs/keygraph.md, "Registration"). Paper 001 leaves it to "an authentication
//! exchange" (§2, §5: Keystone used one with each client); this is a signed ephemeral
//! Diffie-Hellman exchange in three messages, both ends pure state machines.
//!
//! 1. The server invites a member it holds no key for, in one group view, with a fresh nonce,
//!    and signs the invitation.
//! 2. The member answers with an ephemeral element `g^a`, signing the group, both names, the view,
//!    the nonce and `g^a` with its identity key.
//! 3. The server checks the member's identity in the directory and its signature, draws `b`,
//!    admits the member to the key graph under the new key, and answers with `g^b` and the
//!    admission (the member's place in the graph), signing the transcript hash `th` of all of the
//!    above and `g^b`, and the admission.
//!
//! Both ends derive the individual key as HKDF(`g^ab`, `th`). What this gives, and why:
//! - no key travels, encrypted or not: a recording of the exchange and both identity keys stolen
//!   later do not give the individual key (the ephemerals are wiped);
//! - each side knows whom it shares the key with: the signatures bind both names, the group and
//!   the view, so a hello cannot be moved to another server, group or view, nor a welcome to
//!   another member;
//! - a replayed hello is refused: the nonce it carries is spent by its first use, or belongs to a
//!   past view; a replayed welcome answers an element the member no longer waits on;
//! - a replayed invite gets the hello it got the first time (the same element), so the welcome
//!   that answers either copy still registers the member. The invite is signed so that nobody
//!   but the server can make a member draw and keep ephemerals.

use conclave_crypto::{CryptoRng, Group, GroupKey, Identity, PublicIdentity, Ristretto255};
use conclave_wire::client::GroupViewId;
use conclave_wire::gcs::MAX_NAME_BYTES;
use conclave_wire::keyserver::{
    Exchange, InvitationsMsg, RegisterMsg, ELEMENT_BYTES, MAX_ADMISSION_BYTES, MAX_INVITED,
    NONCE_BYTES,
};
use conclave_wire::{DecodeError, Writer};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

type Scalar = <Ristretto255 as Group>::Scalar;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    #[error("malformed registration message: {0}")]
    Decode(#[from] DecodeError),
    #[error("a registration message of the wrong kind for this end")]
    WrongKind,
    #[error("registration message for another group, server or member")]
    Misaddressed,
    #[error("registration message from {0}, not from the member or server it names")]
    WrongSender(String),
    #[error("hello without a current invitation (stale, replayed or never invited)")]
    NotInvited,
    #[error("invitation for view {got:?}, not the current view {current:?}")]
    StaleView {
        got: GroupViewId,
        current: GroupViewId,
    },
    #[error("welcome answering no hello this member is waiting on")]
    NotWaiting,
    #[error("invitation answered before and since dropped")]
    ReplayedInvite,
    #[error("{0} is not in the directory")]
    UnknownIdentity(String),
    #[error("bad signature from {0}")]
    BadSignature(String),
    #[error("element is not a valid group element")]
    BadElement,
    #[error("the server could not admit the member: {0}")]
    Admission(String),
    /// The member was admitted but no welcome can be sent: the caller must undo the admission.
    #[error("{member} was admitted but no welcome can be sent ({why}): undo the admission")]
    AdmittedWithoutWelcome { member: String, why: &'static str },
    #[error("a group, server or member name must be 1 to {MAX_NAME_BYTES} bytes")]
    BadName,
    #[error("signing failed")]
    Sign,
}

/// A random nonce from `rng`.
fn nonce(rng: &mut dyn CryptoRng) -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    rng.fill_bytes(&mut n);
    n
}

fn exchange_bytes(x: &Exchange) -> Vec<u8> {
    let mut w = Writer::new();
    x.write(&mut w);
    w.into_vec()
}

/// What the server signs to invite.
fn invite_signed(x: &Exchange) -> Vec<u8> {
    let mut v = b"conclave keyserver invite v1".to_vec();
    v.extend_from_slice(&exchange_bytes(x));
    v
}

fn check_name(n: &str) -> Result<(), RegisterError> {
    if n.is_empty() || n.len() > MAX_NAME_BYTES {
        return Err(RegisterError::BadName);
    }
    Ok(())
}

/// What the member signs.
fn hello_signed(x: &Exchange, element: &[u8]) -> Vec<u8> {
    let mut v = b"conclave keyserver hello v1".to_vec();
    v.extend_from_slice(&exchange_bytes(x));
    v.extend_from_slice(element);
    v
}

/// The transcript hash: everything both ends sent.
fn transcript(x: &Exchange, member_element: &[u8], server_element: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"conclave keyserver transcript v1");
    h.update(exchange_bytes(x));
    h.update(member_element);
    h.update(server_element);
    h.finalize().into()
}

/// What the server signs.
fn welcome_signed(th: &[u8; 32], admission: &[u8]) -> Vec<u8> {
    let mut v = b"conclave keyserver welcome v1".to_vec();
    v.extend_from_slice(th);
    v.extend_from_slice(&(admission.len() as u32).to_be_bytes());
    v.extend_from_slice(admission);
    v
}

/// The individual key from the shared element, which is wiped.
fn individual_key(mut shared: <Ristretto255 as Group>::Element, th: &[u8; 32]) -> GroupKey {
    let ikm = zeroize::Zeroizing::new(Ristretto255::encode(&shared));
    zeroize::Zeroize::zeroize(&mut shared);
    let info = conclave_crypto::kdf::info(&[b"conclave keyserver individual key v1", th]);
    GroupKey::from_bytes(*conclave_crypto::kdf::derive::<32>(
        b"conclave keyserver",
        &ikm,
        &info,
    ))
}

fn element(bytes: &[u8; ELEMENT_BYTES]) -> Result<<Ristretto255 as Group>::Element, RegisterError> {
    // The identity element would give a shared secret anyone knows.
    Ristretto255::decode(bytes, false).map_err(|_| RegisterError::BadElement)
}

fn encoded(e: &<Ristretto255 as Group>::Element) -> [u8; ELEMENT_BYTES] {
    Ristretto255::encode(e)
        .try_into()
        .expect("a Ristretto255 element is 32 bytes")
}

/// The server's end: invitations out, hellos in.
pub struct Registrar {
    group: String,
    server: String,
    identity: Identity,
    /// Each invited member's view and nonce; a nonce is spent by the hello that uses it.
    invited: HashMap<String, (GroupViewId, [u8; NONCE_BYTES])>,
}

/// How the server admits a member to its key graph under its new individual key: returns what
/// the welcome tells the member.
pub type Admit<'a> = dyn FnMut(&str, &GroupKey) -> Result<Vec<u8>, RegisterError> + 'a;

/// A member the server has just registered.
pub struct Registered {
    pub member: String,
    pub key: GroupKey,
    /// The welcome to send the member.
    pub welcome: Vec<u8>,
}

impl Registrar {
    pub fn new(group: &str, server: &str, identity: Identity) -> Result<Registrar, RegisterError> {
        check_name(group)?;
        check_name(server)?;
        Ok(Registrar {
            group: group.to_owned(),
            server: server.to_owned(),
            identity,
            invited: HashMap::new(),
        })
    }

    /// A signed invitation for `member` in `view`, replacing any earlier one.
    pub fn invite(
        &mut self,
        member: &str,
        view: GroupViewId,
        rng: &mut dyn CryptoRng,
    ) -> Result<Vec<u8>, RegisterError> {
        check_name(member)?;
        let exchange = Exchange {
            group: self.group.clone(),
            server: self.server.clone(),
            member: member.to_owned(),
            view,
            nonce: nonce(rng),
        };
        let signature = self
            .identity
            .sign(&invite_signed(&exchange))
            .map_err(|_| RegisterError::Sign)?;
        self.invited
            .insert(member.to_owned(), (view, exchange.nonce));
        Ok(RegisterMsg::Invite {
            exchange,
            signature,
        }
        .encode())
    }

    /// Signed invitations for `members` in `view` (replacing any earlier ones), at most
    /// `MAX_INVITED` to a message: a view with many new members costs a few messages.
    pub fn invite_many(
        &mut self,
        members: &[String],
        view: GroupViewId,
        rng: &mut dyn CryptoRng,
    ) -> Result<Vec<InvitationsMsg>, RegisterError> {
        let mut out = Vec::new();
        for chunk in members.chunks(MAX_INVITED) {
            let mut msg = InvitationsMsg {
                group: self.group.clone(),
                server: self.server.clone(),
                view,
                invited: Vec::with_capacity(chunk.len()),
                signature: Vec::new(),
            };
            for m in chunk {
                check_name(m)?;
                msg.invited.push((m.clone(), nonce(rng)));
            }
            msg.signature = self
                .identity
                .sign(&msg.signed_bytes())
                .map_err(|_| RegisterError::Sign)?;
            for (m, n) in &msg.invited {
                self.invited.insert(m.clone(), (view, *n));
            }
            out.push(msg);
        }
        Ok(out)
    }

    /// A new view: invitations of earlier views are void (their members are invited again if
    /// they are still unregistered).
    pub fn new_view(&mut self) {
        self.invited.clear();
    }

    /// Members invited and not yet registered.
    pub fn waiting(&self) -> usize {
        self.invited.len()
    }

    /// A hello from `from` (as the daemons name the sender). `identity_of` is the directory;
    /// `admit` admits the member under its new individual key and returns what the welcome tells
    /// it (at most `MAX_ADMISSION_BYTES`). Until `admit` succeeds nothing is spent: a refused
    /// hello leaves the invitation standing. Once it has, the invitation is spent (a replay must
    /// not admit the member twice), and any failure after it is
    /// [`RegisterError::AdmittedWithoutWelcome`]: the caller undoes the admission.
    pub fn handle_hello(
        &mut self,
        from: &str,
        bytes: &[u8],
        identity_of: &dyn Fn(&str) -> Option<PublicIdentity>,
        admit: &mut Admit<'_>,
        rng: &mut dyn CryptoRng,
    ) -> Result<Registered, RegisterError> {
        let RegisterMsg::Hello {
            exchange,
            element: member_element,
            signature,
        } = RegisterMsg::decode(bytes)?
        else {
            return Err(RegisterError::WrongKind);
        };
        if exchange.group != self.group || exchange.server != self.server {
            return Err(RegisterError::Misaddressed);
        }
        if exchange.member != from {
            return Err(RegisterError::WrongSender(from.to_owned()));
        }
        match self.invited.get(from) {
            Some((view, n)) if *view == exchange.view && *n == exchange.nonce => {}
            _ => return Err(RegisterError::NotInvited),
        }
        let public =
            identity_of(from).ok_or_else(|| RegisterError::UnknownIdentity(from.to_owned()))?;
        public
            .verify(&hello_signed(&exchange, &member_element), &signature)
            .map_err(|_| RegisterError::BadSignature(from.to_owned()))?;
        let theirs = element(&member_element)?;
        let b: Scalar = Ristretto255::random_scalar(rng);
        let ours = encoded(&Ristretto255::exp_g(&b));
        let th = transcript(&exchange, &member_element, &ours);
        let key = individual_key(Ristretto255::exp(&theirs, &b), &th);
        let admission = admit(from, &key)?;
        self.invited.remove(from);
        let undo = |why| RegisterError::AdmittedWithoutWelcome {
            member: from.to_owned(),
            why,
        };
        if admission.len() > MAX_ADMISSION_BYTES {
            return Err(undo("admission too long"));
        }
        let signature = self
            .identity
            .sign(&welcome_signed(&th, &admission))
            .map_err(|_| undo("signing failed"))?;
        let welcome = RegisterMsg::Welcome {
            exchange,
            member_element,
            element: ours,
            admission,
            signature,
        }
        .encode();
        Ok(Registered {
            member: from.to_owned(),
            key,
            welcome,
        })
    }
}

/// What a member learns from a welcome.
pub struct Welcomed {
    pub key: GroupKey,
    /// What the server told it on admitting it (signed with the rest).
    pub admission: Vec<u8>,
}

/// A member's end: invitations in, hellos out, the individual key from the welcome.
pub struct Registration {
    group: String,
    me: String,
    server: String,
    identity: Identity,
    server_identity: PublicIdentity,
    /// Hellos sent and not yet answered, newest last: the server may invite again in one view
    /// (and a replayed invite must get the hello it got the first time).
    pending: Vec<Pending>,
    /// Nonces of the view the pending hellos answer, all of those ever answered in it: a replayed
    /// invite whose hello was dropped must not push out the one the server is answering.
    answered: Vec<[u8; NONCE_BYTES]>,
}

/// Unanswered hellos kept at once.
const MAX_PENDING: usize = 4;

struct Pending {
    exchange: Exchange,
    element: [u8; ELEMENT_BYTES],
    hello: Vec<u8>,
    /// Wiped when dropped (`WipedScalar`).
    secret: Scalar,
}

impl Registration {
    pub fn new(
        group: &str,
        me: &str,
        server: &str,
        identity: Identity,
        server_identity: PublicIdentity,
    ) -> Result<Registration, RegisterError> {
        for n in [group, me, server] {
            check_name(n)?;
        }
        Ok(Registration {
            group: group.to_owned(),
            me: me.to_owned(),
            server: server.to_owned(),
            identity,
            server_identity,
            pending: Vec::new(),
            answered: Vec::new(),
        })
    }

    /// Whether a hello is waiting for its welcome.
    pub fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    /// An invitation from `from`, received in `view`; returns the hello to send the server.
    pub fn handle_invite(
        &mut self,
        from: &str,
        bytes: &[u8],
        view: GroupViewId,
        rng: &mut dyn CryptoRng,
    ) -> Result<Vec<u8>, RegisterError> {
        let RegisterMsg::Invite {
            exchange,
            signature,
        } = RegisterMsg::decode(bytes)?
        else {
            return Err(RegisterError::WrongKind);
        };
        self.invited_here(from, &exchange, view)?;
        self.server_identity
            .verify(&invite_signed(&exchange), &signature)
            .map_err(|_| RegisterError::BadSignature(from.to_owned()))?;
        self.answer(exchange, view, rng)
    }

    /// Invitations from `from`, received in `view`: the hello to send the server if they invite
    /// this member (`None` if they do not name it).
    pub fn handle_invitations(
        &mut self,
        from: &str,
        msg: &InvitationsMsg,
        view: GroupViewId,
        rng: &mut dyn CryptoRng,
    ) -> Result<Option<Vec<u8>>, RegisterError> {
        let Some(exchange) = msg.exchange(&self.me) else {
            return Ok(None);
        };
        self.invited_here(from, &exchange, view)?;
        self.server_identity
            .verify(&msg.signed_bytes(), &msg.signature)
            .map_err(|_| RegisterError::BadSignature(from.to_owned()))?;
        self.answer(exchange, view, rng).map(Some)
    }

    /// The hello that answers an authentic invitation (the same one for the same invitation).
    fn answer(
        &mut self,
        exchange: Exchange,
        view: GroupViewId,
        rng: &mut dyn CryptoRng,
    ) -> Result<Vec<u8>, RegisterError> {
        if let Some(p) = self.pending.iter().find(|p| p.exchange == exchange) {
            return Ok(p.hello.clone());
        }
        if self
            .pending
            .first()
            .is_some_and(|p| p.exchange.view != view)
        {
            self.pending.clear();
            self.answered.clear();
        }
        if self.answered.contains(&exchange.nonce) {
            return Err(RegisterError::ReplayedInvite);
        }
        let secret: Scalar = Ristretto255::random_scalar(rng);
        let element = encoded(&Ristretto255::exp_g(&secret));
        let signature = self
            .identity
            .sign(&hello_signed(&exchange, &element))
            .map_err(|_| RegisterError::Sign)?;
        let hello = RegisterMsg::Hello {
            exchange: exchange.clone(),
            element,
            signature,
        }
        .encode();
        if self.pending.len() == MAX_PENDING {
            self.pending.remove(0);
        }
        self.answered.push(exchange.nonce);
        self.pending.push(Pending {
            exchange,
            element,
            hello: hello.clone(),
            secret,
        });
        Ok(hello)
    }

    /// The server's welcome: the individual key and what the server told the member on admitting
    /// it.
    pub fn handle_welcome(&mut self, from: &str, bytes: &[u8]) -> Result<Welcomed, RegisterError> {
        let RegisterMsg::Welcome {
            exchange,
            member_element,
            element: server_element,
            admission,
            signature,
        } = RegisterMsg::decode(bytes)?
        else {
            return Err(RegisterError::WrongKind);
        };
        self.addressed(from, &exchange)?;
        let pending = self
            .pending
            .iter()
            .find(|p| p.exchange == exchange && p.element == member_element)
            .ok_or(RegisterError::NotWaiting)?;
        let th = transcript(&exchange, &member_element, &server_element);
        self.server_identity
            .verify(&welcome_signed(&th, &admission), &signature)
            .map_err(|_| RegisterError::BadSignature(from.to_owned()))?;
        let theirs = element(&server_element)?;
        let key = individual_key(Ristretto255::exp(&theirs, &pending.secret), &th);
        self.pending.clear();
        self.answered.clear();
        Ok(Welcomed { key, admission })
    }

    /// An invitation to this member from its server, for the view it was received in.
    fn invited_here(
        &self,
        from: &str,
        x: &Exchange,
        view: GroupViewId,
    ) -> Result<(), RegisterError> {
        self.addressed(from, x)?;
        if x.view != view {
            return Err(RegisterError::StaleView {
                got: x.view,
                current: view,
            });
        }
        Ok(())
    }

    fn addressed(&self, from: &str, x: &Exchange) -> Result<(), RegisterError> {
        if from != self.server {
            return Err(RegisterError::WrongSender(from.to_owned()));
        }
        if x.group != self.group || x.server != self.server || x.member != self.me {
            return Err(RegisterError::Misaddressed);
        }
        Ok(())
    }
}
