//! One client's secure group: the key agreement driven by the views the daemons deliver, and the
//! group's data sealed under each view's key (thesis 004 §2.3, §3; paper 000 §3).
//!
//! The member joins with VS semantics. Every view the daemons deliver starts a run of the group's
//! [`KeyAgreement`] (Table 1's mapping of group events to the protocols' events is the protocols'
//! own: each derives join, leave, merge or partition from the member list and the transitional
//! set, so that a cascade of events needs no special case); a run that a newer view interrupts is
//! abandoned, and its messages, which name their view, are refused by the next (K5). Once the run
//! yields the view's key the application sees a *secure view*; until then its messages wait, and
//! data that other members sealed under the new key waits for this member's key (§3's
//! buffering). When the daemons ask for the flush of a view, this layer acknowledges it for the
//! application as soon as what it sealed in the view is on its way: later messages wait for the
//! next secure view, and the application is told ([`SecureEvent::ViewEnding`]).
//!
//! A group may instead take its keys from the daemons (the integrated architecture's Integrated
//! VS, paper 002 §V-B3; [`KeySource::Daemons`]): no key agreement runs; the member asks its
//! daemon for the group's keys before it joins, and each view's key comes with the view
//! ([`ClientEvent::ViewKey`]). What is sealed, buffered and flushed is the same.
//!
//! A group may also take its keys from a key-graph server (paper 001; [`KeySource::KeyGraph`],
//! docs/keygraph.md): the server registers each member, multicasts the rekey messages, and binds
//! each view to a group key with a signed view key. A view without the server whose members are
//! the holders of the last keyed view's key, all come through together, keeps that view's group
//! key without waiting for the server: a server's crash does not stop the group, and no key goes
//! to anyone who lacked it.
//!
//! Departures from the papers: a unicast of the key agreement goes to the whole group and names
//! its recipient (the daemons have no private groups); a group's protocol is fixed by its first
//! member, and a newcomer whose protocol differs leaves with a typed error; a view with a member
//! the trust directory does not know gets no key at all.

use crate::keygraph_member::{KeyGraphMember, Outcome};
use crate::seal::{ReplayWindow, SenderKey};
use crate::SecureError;
use bytes::Bytes;
use conclave_crypto::aead::AeadAlg;
use conclave_crypto::{CryptoRng, Fingerprint, GroupKey, Identity, Ristretto255};
use conclave_gka::testbed::new_member;
use conclave_gka::{
    Dest, GkaError, KeyAgreement, MemberId, Order, ProtocolId, SharedDirectory, View,
};
use conclave_wire::client::{ClientCommand, ClientEvent, GroupViewId};
use conclave_wire::gcs::{ServiceType, MAX_PAYLOAD_BYTES};
use conclave_wire::gka::Envelope;
use conclave_wire::secure::{SecureMessage, MAX_PLAINTEXT_BYTES};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Where a group's keys come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KeySource {
    /// The members agree each view's key among themselves (the layered architecture): the
    /// daemons are trusted with no group's key.
    #[default]
    Agreement,
    /// The daemons derive each view's key from the key they agree among themselves and hand it
    /// to the view's members (Integrated VS): no agreement among the members, at the price of
    /// trusting every daemon of the ring with the group's keys (docs/integrated.md).
    Daemons,
    /// A key-graph server (paper 001) registers each member and rekeys the group on every join
    /// and leave ([`SecureConfig::key_server`] names it): for large one-to-many groups, at the
    /// price of trusting the server with the group's keys (docs/keygraph.md).
    KeyGraph,
}

impl std::str::FromStr for KeySource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "agreement" | "layered" => Ok(KeySource::Agreement),
            "daemons" | "integrated" => Ok(KeySource::Daemons),
            "key-graph" | "keygraph" => Ok(KeySource::KeyGraph),
            _ => Err(format!(
                "unknown key source {s:?} (agreement, daemons or key-graph)"
            )),
        }
    }
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeySource::Agreement => "agreement",
            KeySource::Daemons => "daemons",
            KeySource::KeyGraph => "key-graph",
        })
    }
}

/// How a secure group is run; the defaults suit most groups.
#[derive(Clone, Debug)]
pub struct SecureConfig {
    /// Where the group's keys come from; every member of a group must take the same.
    pub keys: KeySource,
    /// The key agreement protocol this member asks for (the group keeps its first member's);
    /// unused when the keys come from the daemons.
    pub protocol: ProtocolId,
    pub aead: AeadAlg,
    /// Messages the application may send while no key is agreed, and their bytes: past either,
    /// a send is refused ([`SecureError::QueueFull`]).
    pub max_queued: usize,
    pub max_queued_bytes: usize,
    /// Messages of the current view that arrive before this member has its key, and their bytes:
    /// past either, such a message is refused.
    pub max_early: usize,
    pub max_early_bytes: usize,
    /// With keys from the daemons: join the group without virtual synchrony (no flush before
    /// a view change), and let the daemons reseal what is delivered in a later view than its
    /// key's (Optimized EVS, paper 002 §V-B3). Ignored when the members agree the keys, which
    /// takes VS.
    pub evs: bool,
    /// With keys from a key-graph server: the server's name, as views list it (the trust
    /// directory holds its identity under that name).
    pub key_server: Option<String>,
}

impl Default for SecureConfig {
    fn default() -> Self {
        SecureConfig {
            keys: KeySource::Agreement,
            protocol: ProtocolId::Tgdh,
            aead: AeadAlg::Aes256Gcm,
            max_queued: 1024,
            max_queued_bytes: 16 << 20,
            max_early: 4096,
            max_early_bytes: 16 << 20,
            evs: false,
            key_server: None,
        }
    }
}

/// A view whose key is agreed: what the application sees of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecureViewInfo {
    pub group: String,
    /// The daemons' id of the view this key belongs to.
    pub view: GroupViewId,
    /// The key's holders (shared with the layer's own view and key: a member of many groups
    /// takes a key of each at once, and need not copy every list).
    pub members: Arc<[String]>,
    /// Members of the view that hold no key of it (a key-graph group's members the server could
    /// not register in time); empty in the other modes, where such a view gets no key at all.
    pub without: Vec<String>,
    /// This member's count of keys in the group (see `conclave_gka::SecureView::epoch`).
    pub epoch: u64,
    /// A public short name of the key, equal at every member of the view.
    pub fingerprint: Fingerprint,
}

/// What the secure layer tells the application about one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecureEvent {
    /// A new secure view: its key is agreed; what follows is sealed under it.
    View(SecureViewInfo),
    /// A message of a member, opened: it was sealed under the key of `view`, the current
    /// secure view, and is delivered in it.
    Message {
        group: String,
        sender: String,
        service: ServiceType,
        view: GroupViewId,
        payload: Bytes,
    },
    /// The daemons are changing the view: what the application sends from now on goes out in
    /// the next secure view.
    ViewEnding { group: String, view: GroupViewId },
    /// The daemons' view has members the trust directory does not know: it gets no key.
    Untrusted {
        group: String,
        view: GroupViewId,
        members: Vec<String>,
    },
    /// Input from `sender` that this layer refused: it reached the application as nothing else.
    Refused {
        group: String,
        sender: String,
        error: SecureError,
    },
    /// This member is out of the group (its leave, or a join the group could not take).
    Left { group: String, reason: String },
}

/// A key agreement message this member's run took in ([`SecureGroup::poll_consumed`]): what a
/// history needs to show that no run consumes another run's messages (K5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumed {
    pub sender: String,
    /// The view the message names, under its sender's signature.
    pub signed_for: GroupViewId,
    /// The view of the run that took it in.
    pub run: GroupViewId,
}

/// Records of [`Consumed`] kept for a caller that does not take them: the oldest go first.
pub const MAX_CONSUMED: usize = 1024;

/// Resealing daemons whose keys one member keeps for a view (a ring has at most 32 daemons,
/// each resealing under two names).
const MAX_RESEALERS: usize = 2 * conclave_wire::gcs::MAX_RING_MEMBERS;

/// The key of one secure view, outside its group ([`SecureGroup::view_key`]).
pub struct ViewKey {
    group: String,
    view: GroupViewId,
    alg: AeadAlg,
    key: GroupKey,
}

impl std::fmt::Debug for ViewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ViewKey({:?}, {:?}, {:?})",
            self.group, self.view, self.key
        )
    }
}

impl ViewKey {
    pub fn view(&self) -> GroupViewId {
        self.view
    }

    pub fn fingerprint(&self) -> Fingerprint {
        self.key.fingerprint()
    }

    /// A secret for another use than the group's data (as TLS exports keying material): a
    /// different `label` gives an independent key, bound to the group and the view. Whoever
    /// holds the view's key can compute it; keep it as secret.
    pub fn export(&self, label: &[u8]) -> zeroize::Zeroizing<[u8; 32]> {
        let view = self.view.to_bytes();
        conclave_crypto::kdf::derive::<32>(
            label,
            self.key.expose(),
            &conclave_crypto::kdf::info(&[self.group.as_bytes(), &view]),
        )
    }

    /// Opens a data message of the group, as the daemons carried it from `sender` with
    /// `service`, if it was sealed under this key.
    pub fn open(
        &self,
        sender: &str,
        service: ServiceType,
        payload: &[u8],
    ) -> Result<Vec<u8>, SecureError> {
        let SecureMessage::Data {
            view,
            counter,
            sealed,
        } = SecureMessage::decode(payload).map_err(SecureError::Malformed)?
        else {
            return Err(SecureError::OpenFailed);
        };
        let key = SenderKey::derive(self.alg, &self.key, &self.group, &view, sender);
        key.open(&self.group, &view, sender, service, counter, sealed)
            .map_err(|_| SecureError::OpenFailed)
    }

    /// A view's key the daemons handed (`ClientEvent::ViewKey`), with the default AEAD.
    pub fn from_daemons(group: &str, view: GroupViewId, key: GroupKey) -> ViewKey {
        ViewKey {
            group: group.to_owned(),
            view,
            alg: SecureConfig::default().aead,
            key,
        }
    }

    /// Seals `plaintext` as member `sender`'s message number `counter` of the view, as the
    /// member's secure layer does (a counter must never be used twice).
    pub fn seal(&self, sender: &str, service: ServiceType, counter: u64, plain: &[u8]) -> Vec<u8> {
        SenderKey::derive(self.alg, &self.key, &self.group, &self.view, sender).seal(
            &self.group,
            &self.view,
            sender,
            service,
            counter,
            plain,
        )
    }

    /// Opens a message a daemon resealed in this view (Optimized EVS); with the daemon it names.
    pub fn open_resealed(
        &self,
        sender: &str,
        service: ServiceType,
        payload: &[u8],
    ) -> Result<(String, Vec<u8>), SecureError> {
        let SecureMessage::Resealed {
            view,
            counter,
            daemon,
            sealed,
        } = SecureMessage::decode(payload).map_err(SecureError::Malformed)?
        else {
            return Err(SecureError::OpenFailed);
        };
        if view != self.view {
            return Err(SecureError::OpenFailed);
        }
        SenderKey::derive_resealer(self.alg, &self.key, &self.group, &view, &daemon)
            .open(&self.group, &view, sender, service, counter, sealed)
            .map(|plain| (daemon, plain))
            .map_err(|_| SecureError::OpenFailed)
    }
}

/// A message of this member on its way through the daemon.
enum Inflight {
    /// A key agreement message of a view.
    Protocol(GroupViewId),
    /// Data, with the view whose key sealed it and the plaintext, to seal again if the daemon
    /// sends it in another view.
    Data {
        view: GroupViewId,
        service: ServiceType,
        payload: Bytes,
    },
}

/// The daemons' current view of the group.
struct DaemonView {
    id: GroupViewId,
    members: Arc<[String]>,
    transitional: Arc<[String]>,
}

/// The key of the current view, and what sealing and opening under it need.
struct Keyed {
    info: SecureViewInfo,
    key: GroupKey,
    /// This member's sending key, derived at its first message: a member in many groups that
    /// sends to few of them does not pay a derivation per group at every view change.
    mine: Option<SenderKey>,
    /// Messages this member sealed in the view.
    sent: u64,
    /// Each sender's key and the counters opened.
    senders: HashMap<String, (SenderKey, ReplayWindow)>,
    /// The keys of the daemons that resealed messages of the view, and their counters opened.
    resealers: HashMap<String, (SenderKey, ReplayWindow)>,
}

/// One member of one secure group (see the module doc).
pub struct SecureGroup {
    /// Inline: a member in hundreds of groups finds each by it, cold, at a configuration change.
    group: compact_str::CompactString,
    me: MemberId,
    cfg: SecureConfig,
    identity: Identity,
    directory: SharedDirectory,
    rng: Box<dyn CryptoRng + Send>,
    gka: Box<dyn KeyAgreement>,
    /// The key agreement as it was when the members last all completed a run (`None`: as
    /// created), to go back to if a run completes here but not at the members that came with
    /// this one (see [`SecureGroup::confirm`]).
    confirmed: Option<Box<dyn KeyAgreement>>,
    /// The current view's key, once the run completed here, until what this member sent in the
    /// run is known to be in the view.
    unconfirmed: Option<conclave_gka::SecureView>,
    /// Key agreement messages this member sent in the current view, and those the daemon said
    /// it sent in this view.
    own_sent: u64,
    own_in_view: u64,
    /// The members that came with this one through every view since the last confirmed run
    /// (`None`: no view since): what the key agreement would have narrowed its side to, had it
    /// followed those views from `confirmed`.
    came_along: Option<Vec<String>>,
    view: Option<DaemonView>,
    keyed: Option<Keyed>,
    /// A key was agreed in this group at least once.
    ever_keyed: bool,
    /// Keys the daemons handed this member ([`KeySource::Daemons`]): each secure view's epoch.
    handed: u64,
    /// Views of the group this member was given ([`KeySource::Daemons`]).
    views_seen: u64,
    /// The flush of the current view is acknowledged: nothing more goes out in it.
    flushed: bool,
    left: bool,
    /// The application was told this member is out ([`SecureEvent::Left`]).
    told_left: bool,
    queued: VecDeque<(ServiceType, Bytes)>,
    queued_bytes: usize,
    /// This member's messages to the group that the daemon has not yet said it sent, oldest
    /// first (the daemon's `Sent` events come in that order).
    inflight: VecDeque<Inflight>,
    /// Data the daemon sent in another view than the one it was sealed in: no member opens it
    /// there, so it goes again, in order, before anything queued.
    resend: VecDeque<(ServiceType, Bytes)>,
    early: VecDeque<(String, ServiceType, Bytes)>,
    early_bytes: usize,
    commands: VecDeque<ClientCommand>,
    events: VecDeque<SecureEvent>,
    consumed: VecDeque<Consumed>,
    /// The member's end of a key-graph group ([`KeySource::KeyGraph`]).
    /// Boxed: most groups have none, and inline it would triple the size of every group's
    /// state, which a member in thousands of groups reads cold at each view change.
    keygraph: Option<Box<KeyGraphMember>>,
}

impl SecureGroup {
    /// Joins `group` as `me` (the name the daemon gave this client, as views list it); the join
    /// is the first command. Both names must be ones the client session accepts (1 to 64
    /// bytes): a caller checks a name it takes from a user first (the async client does), as
    /// this panics on one the key agreement cannot carry.
    pub fn join(
        group: &str,
        me: &str,
        identity: Identity,
        directory: SharedDirectory,
        cfg: SecureConfig,
        mut rng: Box<dyn CryptoRng + Send>,
    ) -> SecureGroup {
        let gka = new_member::<Ristretto255>(
            cfg.protocol,
            me,
            group,
            identity.clone(),
            directory.clone(),
            &mut *rng,
        );
        let mut g = SecureGroup {
            group: group.into(),
            me: me.to_owned(),
            cfg,
            identity,
            directory,
            rng,
            gka,
            confirmed: None,
            unconfirmed: None,
            own_sent: 0,
            own_in_view: 0,
            came_along: None,
            view: None,
            keyed: None,
            ever_keyed: false,
            handed: 0,
            views_seen: 0,
            flushed: false,
            left: false,
            told_left: false,
            queued: VecDeque::new(),
            queued_bytes: 0,
            inflight: VecDeque::new(),
            resend: VecDeque::new(),
            early: VecDeque::new(),
            early_bytes: 0,
            commands: VecDeque::new(),
            events: VecDeque::new(),
            consumed: VecDeque::new(),
            keygraph: None,
        };
        if g.cfg.keys == KeySource::KeyGraph {
            let Some(server) = g.cfg.key_server.clone() else {
                // Nothing is joined: there is no server to take keys from.
                g.left = true;
                g.told_left = true;
                g.events.push_back(SecureEvent::Left {
                    group: group.to_owned(),
                    reason: "a key-graph group needs its key server's name".into(),
                });
                return g;
            };
            g.keygraph = Some(Box::new(KeyGraphMember::new(
                group,
                me,
                &server,
                g.directory.clone(),
            )));
        }
        let vs = !g.optimized_evs();
        g.commands.push_back(ClientCommand::Join {
            group: group.to_owned(),
            vs,
        });
        g
    }

    /// Keys from the daemons in a group without VS, which the daemons reseal across views.
    pub fn optimized_evs(&self) -> bool {
        self.cfg.evs && self.cfg.keys == KeySource::Daemons
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// Where this member takes the group's keys from. With [`KeySource::Daemons`] the caller
    /// asks the daemon for the group's keys (the client protocol's `Keys` request) before it
    /// sends the join, the first command.
    pub fn key_source(&self) -> KeySource {
        self.cfg.keys
    }

    /// The current secure view, if the current view's key is agreed.
    pub fn secure_view(&self) -> Option<&SecureViewInfo> {
        self.keyed.as_ref().map(|k| &k.info)
    }

    /// A copy of the current secure view's key, to open that view's messages outside the group:
    /// to show that a member that left cannot open what is sent after it left, or for an audit.
    /// It holds the key: keep it as secret as the member's own.
    pub fn view_key(&self) -> Option<ViewKey> {
        self.keyed.as_ref().map(|k| ViewKey {
            group: self.group.as_str().to_owned(),
            view: k.info.view,
            alg: self.cfg.aead,
            key: k.key.clone(),
        })
    }

    /// Sends `payload` to the group, sealed under the current view's key; with no key (a run in
    /// progress, or the view ending), it waits for the next secure view.
    pub fn send(&mut self, service: ServiceType, payload: Bytes) -> Result<(), SecureError> {
        if self.left {
            return Err(SecureError::NotJoined);
        }
        // A daemon that reseals a message names itself in it: room is left for the name.
        let max = match self.optimized_evs() {
            true => MAX_PLAINTEXT_BYTES - 1 - conclave_wire::secure::MAX_NAME_BYTES,
            false => MAX_PLAINTEXT_BYTES,
        };
        if payload.len() > max {
            return Err(SecureError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        if self.may_send() && self.queued.is_empty() && self.resend.is_empty() {
            self.seal_and_send(service, payload);
            return Ok(());
        }
        if self.queued.len() >= self.cfg.max_queued
            || self.queued_bytes + payload.len() > self.cfg.max_queued_bytes
        {
            return Err(SecureError::QueueFull {
                max: self.cfg.max_queued,
            });
        }
        self.queued_bytes += payload.len();
        self.queued.push_back((service, payload));
        Ok(())
    }

    /// Leaves the group. Messages still waiting for a key are dropped.
    pub fn leave(&mut self) {
        if !self.left {
            self.left = true;
            self.drop_queued();
            self.commands.push_back(ClientCommand::Leave {
                group: self.group.as_str().to_owned(),
            });
        }
    }

    /// An event of the client session about this group (others are ignored).
    pub fn handle_event(&mut self, ev: ClientEvent) {
        if ev.group() != Some(self.group.as_str()) {
            return;
        }
        match ev {
            ClientEvent::View { .. } if !self.left => self.on_view(ev),
            ClientEvent::Message {
                sender,
                service,
                payload,
                view,
                ..
            } if !self.left => self.on_message(sender, service, payload, view),
            ClientEvent::ViewKey { view, key, .. } if !self.left => self.on_view_key(view, key),
            ClientEvent::FlushRequest { view, .. } => self.on_flush_request(view),
            ClientEvent::Sent { view, .. } => self.on_sent(view),
            ClientEvent::Left { group } => {
                self.left = true;
                self.keyed = None;
                self.drop_queued();
                // A member that left on its own account (another protocol) was told already.
                if !self.told_left {
                    self.told_left = true;
                    self.events.push_back(SecureEvent::Left {
                        group,
                        reason: "left the group".into(),
                    });
                }
            }
            _ => {}
        }
    }

    /// The next command for the client session, in order.
    pub fn poll_command(&mut self) -> Option<ClientCommand> {
        self.commands.pop_front()
    }

    /// The session refused the multicast last taken with [`SecureGroup::poll_command`] (its
    /// own checks, before it travels): it never goes, so no `Sent` will answer it. Data is
    /// dropped (the application learns of the refusal from the session); a key agreement
    /// message left out keeps the run from completing in this view, and the next view starts
    /// from what the members share.
    pub fn command_refused(&mut self) {
        // Commands and entries on their way are in one order: the refused one is followed by
        // as many entries as multicasts are still waiting to be taken.
        let later = self
            .commands
            .iter()
            .filter(|c| matches!(c, ClientCommand::Multicast { .. }))
            .count();
        if let Some(at) = self.inflight.len().checked_sub(later + 1) {
            self.inflight.remove(at);
        }
        self.release();
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<SecureEvent> {
        self.events.pop_front()
    }

    /// The next key agreement message the runs took in, for a recorder of the history (the
    /// last [`MAX_CONSUMED`] are kept for a caller that does not take them).
    pub fn poll_consumed(&mut self) -> Option<Consumed> {
        self.consumed.pop_front()
    }

    /// The daemons' new view: it ends the old key (nothing more is sealed or opened under it),
    /// the flush, and what waited for a key of the view before.
    fn enter_view(&mut self, id: GroupViewId, members: Arc<[String]>, transitional: Arc<[String]>) {
        self.keyed = None;
        self.flushed = false;
        self.early.clear();
        self.early_bytes = 0;
        self.view = Some(DaemonView {
            id,
            members,
            transitional,
        });
    }

    fn on_view(&mut self, ev: ClientEvent) {
        if self.cfg.keys == KeySource::Daemons {
            // The view's key follows the view; until it is here, nothing is sealed or opened.
            // The lists stay as the session shares them: no protocol runs on them.
            if let ClientEvent::View {
                view,
                members,
                transitional,
                ..
            } = ev
            {
                self.views_seen += 1;
                self.enter_view(view, members, transitional);
            }
            return;
        }
        let Some(mut view) = View::from_owned_event(ev) else {
            return;
        };
        self.views_seen += 1;
        if self.cfg.keys == KeySource::KeyGraph {
            let kept = self.keyed.take().filter(|k| self.same_holders(k, &view));
            self.enter_view(view.view_id, view.members, view.transitional.into());
            let key = kept.and_then(|_| self.keygraph.as_ref()?.keep(view.view_id));
            if let Some((epoch, key)) = key {
                let members = self
                    .view
                    .as_ref()
                    .map(|v| v.members.clone())
                    .unwrap_or_default();
                self.install_key(view.view_id, members, epoch, key);
            }
            return;
        }
        let came_along: Vec<String> = match &self.came_along {
            Some(c) => view
                .transitional
                .iter()
                .filter(|m| c.contains(m))
                .cloned()
                .collect(),
            None => view.transitional.clone(),
        };
        // A run that completed here while something this member sent in it never went out in
        // its view did not complete at the members that came with this one (they never had
        // that message): go back to the state all of them share, and to the members that came
        // along through every view since.
        if self.unconfirmed.take().is_some() {
            self.gka = match &self.confirmed {
                Some(g) => g.clone_box(),
                None => self.new_member(),
            };
            view.transitional = came_along.clone();
        }
        self.came_along = Some(came_along);
        self.own_sent = 0;
        self.own_in_view = 0;
        self.enter_view(
            view.view_id,
            view.members.clone(),
            view.transitional.clone().into(),
        );
        let untrusted: Vec<String> = {
            let dir = self.directory.read().unwrap_or_else(|p| p.into_inner());
            view.members
                .iter()
                .filter(|m| dir.get(m).is_none())
                .cloned()
                .collect()
        };
        if !untrusted.is_empty() {
            // No run in this view; the next starts from scratch, sharing no state with members
            // that came through this view.
            self.fresh_member();
            self.events.push_back(SecureEvent::Untrusted {
                group: self.group.as_str().to_owned(),
                view: view.view_id,
                members: untrusted,
            });
            return;
        }
        if let Err(e) = self.gka.handle_view(&mut *self.rng, view.clone()) {
            // A view the protocol cannot follow from its last one (a session that connected
            // again sees view ids start over): start from scratch.
            self.fresh_member();
            if let Err(e2) = self.gka.handle_view(&mut *self.rng, view) {
                self.refused(self.me.clone(), SecureError::KeyAgreement(e2));
                return;
            }
            let _ = e;
        }
        self.pump();
    }

    fn on_message(
        &mut self,
        sender: String,
        service: ServiceType,
        payload: Bytes,
        at: GroupViewId,
    ) {
        // Only the view's members speak in it: a message from outside the group (a Spread
        // client may send to any group, docs/spread.md) must not move its key agreement.
        let outsider = self
            .view
            .as_ref()
            .is_some_and(|v| v.id == at && !v.members.contains(&sender));
        if outsider {
            return self.refused(sender, SecureError::NotAMember);
        }
        let msg = match SecureMessage::decode(&payload) {
            Ok(m) => m,
            Err(e) => return self.refused(sender, SecureError::Malformed(e)),
        };
        let current = self.view.as_ref().map(|v| v.id);
        match msg {
            SecureMessage::KeyAgreement { .. } if self.cfg.keys != KeySource::Agreement => {
                if sender != self.me && current == Some(at) {
                    self.on_key_source_mismatch(sender);
                }
            }
            SecureMessage::KeyGraph(_) if self.cfg.keys != KeySource::KeyGraph => {
                if sender != self.me && current == Some(at) {
                    self.on_key_source_mismatch(sender);
                }
            }
            SecureMessage::KeyGraph(body) => {
                if sender != self.me && current == Some(at) {
                    self.on_key_graph(&sender, body, at);
                }
            }
            SecureMessage::KeyAgreement { to, envelope } => {
                if sender == self.me || to.is_some_and(|t| t != self.me) || current != Some(at) {
                    return;
                }
                match self.gka.handle_message(&mut *self.rng, &sender, envelope) {
                    Ok(()) => {
                        // A message the key agreement took in decoded as an envelope.
                        if let (Ok(signed_for), Some(run)) = (Envelope::view_of(envelope), current)
                        {
                            if self.consumed.len() == MAX_CONSUMED {
                                self.consumed.pop_front();
                            }
                            self.consumed.push_back(Consumed {
                                sender: sender.clone(),
                                signed_for,
                                run,
                            });
                        }
                    }
                    // Messages of a run a newer view interrupted (K5): expected in cascades.
                    Err(GkaError::Stale { .. } | GkaError::Future { .. }) => {}
                    Err(GkaError::WrongProtocol { expected, got }) => {
                        self.on_wrong_protocol(sender, expected, got)
                    }
                    Err(e) => self.refused(sender, SecureError::KeyAgreement(e)),
                }
                self.pump();
            }
            SecureMessage::Data {
                view,
                counter,
                sealed,
            }
            | SecureMessage::Resealed {
                view,
                counter,
                sealed,
                ..
            } => {
                // Also what the daemon held past the end of the view it was sealed in: its sender
                // learns that from the daemon and sends it again under this view's key (or,
                // with Optimized EVS, the daemons reseal it).
                if current != Some(view) || at != view {
                    return self.refused(sender, SecureError::OtherView { got: view, current });
                }
                let resealed = match &msg {
                    SecureMessage::Resealed { daemon, .. } => Some(daemon.clone()),
                    _ => None,
                };
                // Any member keyed by the daemons takes them: an EVS member's daemon reseals what
                // it sends to the whole group, VS members included.
                if resealed.is_some() && self.cfg.keys != KeySource::Daemons {
                    return self.refused(sender, SecureError::OpenFailed);
                }
                // The sealed part is the message's tail.
                let at = payload.len() - sealed.len();
                if self.keyed.is_none() {
                    return self.hold_early(sender, service, payload);
                }
                self.open(sender, service, view, counter, resealed, payload, at);
            }
        }
    }

    /// Opens the sealed part of `payload` (from `at`), in place when this layer holds the only
    /// copy of the bytes (as a client session's delivery does): no second buffer per message.
    /// A resealed message is opened under this member's daemon's key for the view.
    #[allow(clippy::too_many_arguments)]
    fn open(
        &mut self,
        sender: String,
        service: ServiceType,
        view: GroupViewId,
        counter: u64,
        resealed: Option<String>,
        payload: Bytes,
        at: usize,
    ) {
        let Some(k) = self.keyed.as_mut() else {
            return;
        };
        let (alg, group) = (self.cfg.aead, &self.group);
        // A sender's membership is checked on its first message; a resealed one's every time.
        let known = resealed.is_none() && k.senders.contains_key(&sender);
        if !known && !k.info.members.contains(&sender) {
            return self.refused(sender, SecureError::NotAMember);
        }
        let (key, window) = if let Some(daemon) = resealed {
            // A resealing daemon's key is kept once a message opens under it: a forged name
            // costs a derivation, never a place (and the daemons of a ring are few).
            if !k.resealers.contains_key(&daemon) {
                if k.resealers.len() >= MAX_RESEALERS {
                    return self.refused(sender, SecureError::OpenFailed);
                }
                let key = SenderKey::derive_resealer(alg, &k.key, group, &view, &daemon);
                // Opened only to vouch for the name: the plaintext copy is wiped when dropped.
                let mut probe = zeroize::Zeroizing::new(payload.to_vec());
                if key
                    .open_in_place(group, &view, &sender, service, counter, &mut probe[at..])
                    .is_err()
                {
                    return self.refused(sender, SecureError::OpenFailed);
                }
                k.resealers
                    .insert(daemon.clone(), (key, ReplayWindow::default()));
            }
            k.resealers.get_mut(&daemon).expect("kept above")
        } else {
            // A sender's key is derived on its first message, once it is known to be a member.
            k.senders.entry(sender.clone()).or_insert_with(|| {
                let key = SenderKey::derive(alg, &k.key, group, &view, &sender);
                (key, ReplayWindow::default())
            })
        };
        if !window.fresh(counter) {
            return self.refused(sender, SecureError::Replay { counter });
        }
        let opened = match payload.try_into_mut() {
            Ok(mut buf) => key
                .open_in_place(group, &view, &sender, service, counter, &mut buf[at..])
                .map(|len| {
                    // Narrowed in place: a slice of the frozen buffer would allocate.
                    buf.truncate(at + len);
                    bytes::Buf::advance(&mut buf, at);
                    buf.freeze()
                }),
            Err(shared) => key
                .open(group, &view, &sender, service, counter, &shared[at..])
                .map(Bytes::from),
        };
        match opened {
            Ok(plain) => {
                window.accept(counter);
                self.events.push_back(SecureEvent::Message {
                    group: self.group.as_str().to_owned(),
                    sender,
                    service,
                    view,
                    payload: plain,
                });
            }
            Err(_) => self.refused(sender, SecureError::OpenFailed),
        }
    }

    /// Data sealed under this view's key by a member that has it already: kept until this
    /// member has it too (thesis 004 §3).
    fn hold_early(&mut self, sender: String, service: ServiceType, payload: Bytes) {
        if self.early.len() >= self.cfg.max_early
            || self.early_bytes + payload.len() > self.cfg.max_early_bytes
        {
            return self.refused(
                sender,
                SecureError::EarlyFull {
                    max: self.cfg.max_early,
                },
            );
        }
        self.early_bytes += payload.len();
        self.early.push_back((sender, service, payload));
    }

    /// The daemon sent this member's oldest message on its way, in `view`.
    fn on_sent(&mut self, view: GroupViewId) {
        match self.inflight.pop_front() {
            Some(Inflight::Data {
                view: sealed_in,
                service,
                payload,
            }) if sealed_in != view && !self.optimized_evs() => {
                // Held by the daemon past a view change (a VS message goes out once its sender
                // has the new view): sealed under a key no member uses there. (With Optimized
                // EVS the daemons reseal it instead.)
                self.resend.push_back((service, payload));
            }
            Some(Inflight::Protocol(of))
                if of == view && self.view.as_ref().is_some_and(|v| v.id == view) =>
            {
                self.own_in_view += 1;
                self.confirm();
            }
            _ => {}
        }
        self.release();
    }

    /// Installs the key of a run that completed here once everything this member sent in the
    /// run is known to go out in the view: a message the daemon accepted in a view reaches every
    /// member that stays in it before the next, so they complete the run too. (A message the
    /// daemon held past the view's end, or that was never sent, reaches none of them.)
    fn confirm(&mut self) {
        if self.own_in_view < self.own_sent {
            return;
        }
        if let Some(k) = self.unconfirmed.take() {
            self.confirmed = Some(self.gka.clone_box());
            self.came_along = None;
            self.install_key(k.view_id, k.members, k.epoch, k.key);
        }
    }

    /// Whether data may be sealed and sent now: the view's key is here, its flush is not
    /// acknowledged, and nothing sealed in an earlier view is still on its way (it might have to
    /// go again, and must stay ahead of what follows).
    fn may_send(&self) -> bool {
        let Some(k) = self.keyed.as_ref() else {
            return false;
        };
        // Data goes out in the order it is sealed and views only advance, so the oldest data on
        // its way is the one that can be of an earlier view.
        !self.flushed
            && !self.left
            && self
                .inflight
                .iter()
                .find_map(|f| match f {
                    Inflight::Data { view, .. } => Some(*view),
                    Inflight::Protocol(_) => None,
                })
                .is_none_or(|view| view == k.info.view)
    }

    /// Sends what waits (data to send again first, then the application's queue), if it may.
    fn release(&mut self) {
        if !self.may_send() {
            return;
        }
        while let Some((service, payload)) = self.resend.pop_front() {
            self.seal_and_send(service, payload);
        }
        while let Some((service, payload)) = self.queued.pop_front() {
            self.queued_bytes -= payload.len();
            self.seal_and_send(service, payload);
        }
    }

    fn on_flush_request(&mut self, view: GroupViewId) {
        if self.flushed || self.view.as_ref().map(|v| v.id) != Some(view) {
            // Still acknowledged: the daemons wait for every VS member.
            self.commands.push_back(ClientCommand::FlushAck {
                group: self.group.as_str().to_owned(),
                view,
            });
            return;
        }
        // Everything sealed in the view is ahead of the acknowledgement in the command queue.
        self.flushed = true;
        self.commands.push_back(ClientCommand::FlushAck {
            group: self.group.as_str().to_owned(),
            view,
        });
        if self.keyed.is_some() {
            self.events.push_back(SecureEvent::ViewEnding {
                group: self.group.as_str().to_owned(),
                view,
            });
        }
    }

    /// The daemons' key of `view` ([`KeySource::Daemons`]): the view's secure view begins. A
    /// key of a view that is no longer current (a newer view came first) is dropped.
    fn on_view_key(&mut self, view: GroupViewId, key: conclave_wire::client::KeyBytes) {
        if self.cfg.keys != KeySource::Daemons || self.keyed.is_some() {
            return;
        }
        let Some(members) = self
            .view
            .as_ref()
            .filter(|v| v.id == view)
            .map(|v| v.members.clone())
        else {
            return;
        };
        self.handed += 1;
        let key = GroupKey::from_bytes(key.0);
        self.install_key(view, members, self.handed, key);
    }

    /// Whether the new daemon view `view` keeps the key of `k`, the last view's: the server is
    /// not in it (with the server, its view key decides: the server may have registered members
    /// again), its members are the key's holders, and all of them came through from that view.
    fn same_holders(&self, k: &Keyed, view: &View) -> bool {
        let Some(server) = self.keygraph.as_ref().map(|g| g.server()) else {
            return false;
        };
        if view.members.iter().any(|m| m == server) {
            return false;
        }
        let mut now: Vec<&String> = view.members.iter().filter(|m| *m != server).collect();
        let mut then: Vec<&String> = k.info.members.iter().filter(|m| *m != server).collect();
        now.sort();
        then.sort();
        now == then && now.iter().all(|m| view.transitional.contains(m))
    }

    /// A message of the key-graph service from a member of the current view `at`.
    fn on_key_graph(&mut self, sender: &str, body: &[u8], at: GroupViewId) {
        let Some(kg) = self.keygraph.as_mut() else {
            return;
        };
        match kg.handle(sender, body, at, &self.identity, &mut *self.rng) {
            Ok(Outcome::Nothing) => {}
            Ok(Outcome::Send(b)) => {
                if self.flushed || self.left {
                    return;
                }
                self.commands.push_back(ClientCommand::Multicast {
                    service: ServiceType::Agreed,
                    groups: vec![self.group.as_str().to_owned()],
                    payload: SecureMessage::KeyGraph(&b).encode().into(),
                });
                self.inflight.push_back(Inflight::Protocol(at));
            }
            Ok(Outcome::Key {
                epoch,
                excluded,
                key,
            }) => {
                if self.keyed.is_some() {
                    return;
                }
                let members: Vec<String> = self
                    .view
                    .as_ref()
                    .map(|v| {
                        v.members
                            .iter()
                            .filter(|m| !excluded.contains(m))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                self.install_key(at, members.into(), epoch, key);
            }
            Err(e) => self.refused(sender.to_owned(), SecureError::KeyGraph(e)),
        }
    }

    /// A member runs a key agreement in a group whose keys this member takes from the daemons:
    /// the group's members do not take their keys from one place. As with another protocol, a
    /// newcomer (in its first view of the group, which the sender did not come into with it)
    /// leaves; an older member reports it. (The daemons' key may have come with the view already:
    /// having a key does not make a member an old one.)
    fn on_key_source_mismatch(&mut self, sender: String) {
        let error = SecureError::KeySourceMismatch {
            mine: self.cfg.keys,
        };
        // In a key-graph group the server decides who is in: a member that runs something else
        // is refused, and nobody leaves for it (any member could make newcomers leave).
        let newcomer = self.cfg.keys != KeySource::KeyGraph
            && self.views_seen == 1
            && self
                .view
                .as_ref()
                .is_some_and(|v| !v.transitional.contains(&sender));
        if newcomer {
            self.leave_refusing(sender, error);
        } else {
            self.refused(sender, error);
        }
    }

    /// A newcomer that cannot take part in the group as it is run: it refuses what `sender` sent,
    /// leaves, and tells the application why.
    fn leave_refusing(&mut self, sender: String, error: SecureError) {
        self.refused(sender, error.clone());
        self.leave();
        self.told_left = true;
        self.events.push_back(SecureEvent::Left {
            group: self.group.as_str().to_owned(),
            reason: error.to_string(),
        });
    }

    /// A member runs another protocol. The group keeps its first member's: a newcomer (that
    /// never had a key here) leaves; an older member ignores the newcomer, whose leave follows.
    fn on_wrong_protocol(&mut self, sender: String, expected: ProtocolId, got: ProtocolId) {
        let newcomer = !self.ever_keyed
            && self
                .view
                .as_ref()
                .is_some_and(|v| !v.transitional.contains(&sender));
        let error = SecureError::ProtocolMismatch {
            group_uses: got,
            asked: expected,
        };
        if newcomer {
            self.leave_refusing(sender, error);
        } else {
            self.refused(
                sender,
                SecureError::KeyAgreement(GkaError::WrongProtocol { expected, got }),
            );
        }
    }

    /// What the key agreement has to send and, once the run completes, the key.
    fn pump(&mut self) {
        let current = self.view.as_ref().map(|v| v.id);
        while let Some(t) = self.gka.poll_transmit() {
            if Some(t.view_id) != current {
                continue;
            }
            // Counted even if it does not go: the run is then not complete for the others.
            self.own_sent += 1;
            // Nothing goes out in a view once its flush is acknowledged.
            if self.flushed || self.left {
                continue;
            }
            let to = match t.dest {
                Dest::Broadcast => None,
                Dest::Unicast(m) => Some(m),
            };
            let payload = SecureMessage::KeyAgreement {
                to,
                envelope: &t.payload,
            }
            .encode();
            if payload.len() > MAX_PAYLOAD_BYTES {
                let error = SecureError::TooLarge {
                    len: payload.len(),
                    max: MAX_PAYLOAD_BYTES,
                };
                self.refused(self.me.clone(), error);
                continue;
            }
            let service = match t.order {
                Order::Fifo => ServiceType::Fifo,
                Order::Agreed => ServiceType::Agreed,
            };
            self.commands.push_back(ClientCommand::Multicast {
                service,
                groups: vec![self.group.as_str().to_owned()],
                payload: payload.into(),
            });
            self.inflight.push_back(Inflight::Protocol(t.view_id));
        }
        while let Some(k) = self.gka.poll_key() {
            if Some(k.view_id) == current && !self.left {
                self.unconfirmed = Some(k);
            }
        }
        self.confirm();
    }

    fn install_key(
        &mut self,
        view: GroupViewId,
        members: Arc<[String]>,
        epoch: u64,
        key: GroupKey,
    ) {
        let without = self
            .view
            .as_ref()
            .filter(|v| v.id == view && !Arc::ptr_eq(&v.members, &members) && v.members != members)
            .map(|v| {
                v.members
                    .iter()
                    .filter(|m| !members.contains(m))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let info = SecureViewInfo {
            group: self.group.as_str().to_owned(),
            view,
            members,
            without,
            epoch,
            fingerprint: key.fingerprint(),
        };
        self.keyed = Some(Keyed {
            info: info.clone(),
            key,
            mine: None,
            sent: 0,
            senders: HashMap::new(),
            resealers: HashMap::new(),
        });
        self.ever_keyed = true;
        let view = info.view;
        self.events.push_back(SecureEvent::View(info));
        if self.flushed {
            let group = self.group.as_str().to_owned();
            self.events
                .push_back(SecureEvent::ViewEnding { group, view });
        }
        for (sender, service, payload) in std::mem::take(&mut self.early) {
            let found = match SecureMessage::decode(&payload) {
                Ok(SecureMessage::Data {
                    view,
                    counter,
                    sealed,
                }) => Some((view, counter, None, payload.len() - sealed.len())),
                Ok(SecureMessage::Resealed {
                    view,
                    counter,
                    daemon,
                    sealed,
                }) => Some((view, counter, Some(daemon), payload.len() - sealed.len())),
                _ => None,
            };
            if let Some((view, counter, resealed, at)) = found {
                self.open(sender, service, view, counter, resealed, payload, at);
            }
        }
        self.early_bytes = 0;
        self.release();
    }

    fn seal_and_send(&mut self, service: ServiceType, payload: Bytes) {
        let Some(k) = self.keyed.as_mut() else {
            return;
        };
        let counter = k.sent;
        k.sent += 1;
        let view = k.info.view;
        let (aead, group, me) = (self.cfg.aead, &self.group, &self.me);
        let mine = k
            .mine
            .get_or_insert_with(|| SenderKey::derive(aead, &k.key, group, &view, me));
        let sealed = mine.seal(group, &view, me, service, counter, &payload);
        self.commands.push_back(ClientCommand::Multicast {
            service,
            groups: vec![self.group.as_str().to_owned()],
            payload: sealed.into(),
        });
        self.inflight.push_back(Inflight::Data {
            view,
            service,
            payload,
        });
    }

    /// Starts the key agreement over, sharing no state with anyone.
    fn fresh_member(&mut self) {
        self.gka = self.new_member();
        self.confirmed = None;
        self.unconfirmed = None;
        self.came_along = None;
    }

    fn new_member(&mut self) -> Box<dyn KeyAgreement> {
        new_member::<Ristretto255>(
            self.cfg.protocol,
            &self.me,
            &self.group,
            self.identity.clone(),
            self.directory.clone(),
            &mut *self.rng,
        )
    }

    fn drop_queued(&mut self) {
        self.queued.clear();
        self.queued_bytes = 0;
        self.resend.clear();
        self.inflight.clear();
    }

    fn refused(&mut self, sender: String, error: SecureError) {
        self.events.push_back(SecureEvent::Refused {
            group: self.group.as_str().to_owned(),
            sender,
            error,
        });
    }
}
