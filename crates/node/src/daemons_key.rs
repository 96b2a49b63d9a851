//! The Servers Agreement Engine (paper 002 §V-B): whenever the daemons' membership changes, the
//! daemons of the new ring agree a key among themselves, K_s, with a contributory key agreement
//! (TGDH unless `[links] agreement` names another of the five), and their links go under it
//! (docs/links.md "The daemons' key").
//!
//! How: each daemon is a member of one internal group, [`DAEMONS_GROUP`], under a name no client
//! can have (`#` and the daemon's name: a client's private name is never empty). The group's
//! views follow the daemons' ring, since every daemon of a ring has its member in it; the group
//! is keyed exactly as a client's secure group is, by the secure layer's own state machine
//! ([`SecureGroup`]) over the daemon's client-group service, signed with the daemon's identity
//! and checked against the keys the configuration names. So a cascade (a daemon that crashes or
//! a partition during the agreement) is handled as in a client's group: the new view restarts
//! the run from what the members that came along share, and no run takes another's messages.
//!
//! Departures from the paper: the agreement runs over the daemons' own client-group layer rather
//! than beside it, and K_s is not used as is: the links take a key exported from it
//! ([`conclave_secure::ViewKey::export`]), mixed with each pair's static secret
//! (`conclave_node::link`), so that a daemon of the ring cannot pose as another to a third.

use crate::link::Links;
use conclave_crypto::{CryptoRng, Fingerprint, Identity, PublicIdentity};
use conclave_gcs::Time;
use conclave_gka::{Directory, ProtocolId};
use conclave_secure::{SecureConfig, SecureEvent, SecureGroup};
use conclave_wire::client::{ClientCommand, ClientEvent, GroupViewId, KeyBytes};
use conclave_wire::gcs::{DaemonId, RingId};
use serde::Deserialize;
use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

/// The daemons' internal group. Clients may not join it or send to it, nor to any group whose
/// name begins with `#`.
pub use conclave_history::DAEMONS_GROUP;

/// The name of daemon `daemon`'s member of [`DAEMONS_GROUP`].
pub fn member_name(daemon: &str) -> String {
    format!("#{daemon}")
}

/// Whether a client may name `group` (the daemons keep names beginning with `#` to themselves).
pub fn is_reserved_group(group: &str) -> bool {
    group.starts_with('#')
}

/// The contributory protocol the daemons agree their key with (`[links] agreement`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Agreement {
    Gdh,
    Ckd,
    #[default]
    Tgdh,
    Str,
    Bd,
}

impl Agreement {
    pub fn protocol(self) -> ProtocolId {
        match self {
            Agreement::Gdh => ProtocolId::Gdh,
            Agreement::Ckd => ProtocolId::Ckd,
            Agreement::Tgdh => ProtocolId::Tgdh,
            Agreement::Str => ProtocolId::Str,
            Agreement::Bd => ProtocolId::Bd,
        }
    }
}

/// The label of the links' key exported from K_s.
const LINK_LABEL: &[u8] = b"conclave links v1";
/// The label of the links' key's public id.
const ID_LABEL: &[u8] = b"conclave links key id v1";
/// The label of the secret client group keys are derived from.
const GROUPS_LABEL: &[u8] = b"conclave group keys v1";
/// The HKDF salt of client group keys, from that secret.
const GROUP_KEY_SALT: &[u8] = b"conclave group key v1";

/// A daemons' key in force at this daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonsKey {
    /// The view of [`DAEMONS_GROUP`] it was agreed for.
    pub view: GroupViewId,
    /// The daemons that hold it, by id.
    pub members: Vec<DaemonId>,
    /// Its public short name, the same at every holder.
    pub fingerprint: Fingerprint,
    /// The id the links name it by.
    pub link_key: u64,
}

/// This daemon's side of the agreement.
pub struct ServersAgreement {
    group: SecureGroup,
    /// Daemon names by id from 1.
    names: Vec<String>,
    current: Option<DaemonsKey>,
    /// Keys agreed since the daemon started.
    agreed: u64,
    /// The ring whose every daemon holds the current key, and the secret its client groups'
    /// keys are derived from ([`ServersAgreement::group_key`]).
    groups_base: Option<(RingId, conclave_crypto::kdf::Expander)>,
    events: VecDeque<SecureEvent>,
}

impl ServersAgreement {
    /// Daemon `me` (its name) joins the daemons' group; `roster` names every daemon and its key,
    /// by id from 1. The first command is the join.
    pub fn new(
        me: &str,
        identity: Identity,
        roster: &[(String, Option<PublicIdentity>)],
        agreement: Agreement,
        rng: Box<dyn CryptoRng + Send>,
    ) -> ServersAgreement {
        let mut directory = Directory::new();
        for (name, key) in roster {
            if let Some(key) = key {
                directory.insert(member_name(name), key.clone());
            }
        }
        let cfg = SecureConfig {
            protocol: agreement.protocol(),
            ..SecureConfig::default()
        };
        let group = SecureGroup::join(
            DAEMONS_GROUP,
            &member_name(me),
            identity,
            Arc::new(RwLock::new(directory)),
            cfg,
            rng,
        );
        ServersAgreement {
            group,
            names: roster.iter().map(|(n, _)| n.clone()).collect(),
            current: None,
            agreed: 0,
            groups_base: None,
            events: VecDeque::new(),
        }
    }

    /// The key in force, if one is agreed.
    pub fn current(&self) -> Option<&DaemonsKey> {
        self.current.as_ref()
    }

    /// Keys agreed since the daemon started.
    pub fn agreed(&self) -> u64 {
        self.agreed
    }

    /// An event of the daemon's client-group service for this daemon's member.
    pub fn handle_event(&mut self, ev: ClientEvent) {
        self.group.handle_event(ev);
    }

    /// The next command for the client-group service.
    pub fn poll_command(&mut self) -> Option<ClientCommand> {
        self.group.poll_command()
    }

    /// The service refused the command taken last.
    pub fn command_refused(&mut self) {
        self.group.command_refused();
    }

    /// The key agreement message the runs took in, for the recorder.
    pub fn poll_consumed(&mut self) -> Option<conclave_secure::Consumed> {
        self.group.poll_consumed()
    }

    /// The ring whose client groups' keys can be derived now (see
    /// [`ServersAgreement::group_key`]).
    pub fn groups_ring(&self) -> Option<RingId> {
        self.groups_base.as_ref().map(|(r, _)| *r)
    }

    /// The key of `view` of client group `group` (the Group Keys Engine of paper 002 §V-B,
    /// Integrated VS: K_gv from K_s, the group and the view id), if the daemons of the view's
    /// ring have agreed their key: the key of the view of the daemons' group that holds every
    /// daemon of the ring. There is one such view per ring (a daemon's member joins that group
    /// once, and leaves it only with a change of ring), so every daemon derives the same K_gv.
    pub fn group_key(&self, group: &str, view: GroupViewId) -> Option<KeyBytes> {
        let (ring, base) = self.groups_base.as_ref()?;
        if *ring != view.ring {
            return None;
        }
        let k = base.expand(&[group.as_bytes(), &view.to_bytes()]);
        Some(KeyBytes(*k))
    }

    /// Takes what the group has agreed: a new key goes to the links, and, if every daemon of
    /// the current ring (`ring`, of `ring_members`) holds it, it becomes the base of client
    /// group keys. The group's events are kept for [`ServersAgreement::poll_event`].
    pub fn update(
        &mut self,
        now: Time,
        links: &mut Links,
        ring: Option<RingId>,
        ring_members: &[DaemonId],
    ) {
        while let Some(ev) = self.group.poll_event() {
            match &ev {
                SecureEvent::View(info) => {
                    let key = self.group.view_key().filter(|k| k.view() == info.view);
                    if let Some(key) = key {
                        let members: Vec<DaemonId> =
                            info.members.iter().filter_map(|m| self.id_of(m)).collect();
                        let id_bytes = key.export(ID_LABEL);
                        // 0 names the static key on the wire.
                        let link_key =
                            u64::from_be_bytes(id_bytes[..8].try_into().expect("8 bytes")).max(1);
                        links.install_ring_key(
                            now,
                            link_key,
                            key.export(LINK_LABEL),
                            members.clone(),
                        );
                        self.agreed += 1;
                        let mut holders = members.clone();
                        holders.sort_unstable();
                        let mut daemons = ring_members.to_vec();
                        daemons.sort_unstable();
                        // The first such view of a ring is the one: every daemon takes the same.
                        let first = self.groups_ring() != Some(info.view.ring);
                        if first && ring == Some(info.view.ring) && holders == daemons {
                            let base = key.export(GROUPS_LABEL);
                            let base =
                                conclave_crypto::kdf::Expander::new(GROUP_KEY_SALT, &base[..]);
                            self.groups_base = Some((info.view.ring, base));
                        }
                        tracing::info!(
                            view = ?info.view,
                            members = ?info.members,
                            key = %info.fingerprint,
                            "the daemons agreed a key"
                        );
                        self.current = Some(DaemonsKey {
                            view: info.view,
                            members,
                            fingerprint: info.fingerprint,
                            link_key,
                        });
                    }
                }
                SecureEvent::Left { reason, .. } => {
                    tracing::error!(
                        reason,
                        "this daemon is out of the daemons' group: its links keep their static keys"
                    );
                }
                SecureEvent::Refused { sender, error, .. } => {
                    tracing::warn!(sender, error = %error, "the daemons' key agreement refused input");
                }
                SecureEvent::Untrusted { members, .. } => {
                    tracing::error!(
                        ?members,
                        "a daemons' view with members of no configured key"
                    );
                }
                _ => {}
            }
            self.events.push_back(ev);
        }
    }

    /// The group's events, for the recorder.
    pub fn poll_event(&mut self) -> Option<SecureEvent> {
        self.events.pop_front()
    }

    fn id_of(&self, member: &str) -> Option<DaemonId> {
        let name = member.strip_prefix('#')?;
        let at = self.names.iter().position(|n| n == name)?;
        Some(at as DaemonId + 1)
    }
}
