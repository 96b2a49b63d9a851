//! Optimized EVS (paper 002 §V-B3, the EVS-Fix-Messages module): a message of an EVS group keyed
//! by the daemons that is delivered in a later view than the one whose key sealed it is opened
//! and sealed again under the delivery view's key before it reaches the daemon's clients
//! ([`conclave_secure::reseal`]), so that members hold one key at a time.
//!
//! The daemon keeps the keys it handed for such groups, per group, for resealing; old ones
//! expire by key-out (more than `keys_per_group` keys of a group: the oldest goes) and time-out
//! (a key unused for `key_timeout_ms`, neither handed nor resealed from). The key of any view of
//! the current ring can be derived again from the daemons' key while it lasts, so expiry bites
//! on the keys of earlier rings. A message whose key has expired, or that this daemon never held
//! (sealed in a view of a ring it was not in, for a group it had no member of), is delivered as
//! it came: its members cannot open it and say so.
//!
//! A daemon reseals under two names: its own for what it delivers, and its name with `+out`
//! for its members' messages as they go. The nonce is one count for both, but a member keeps a
//! replay window per name, and each name's messages reach it in the order they were numbered.
//!
//! Departures from the paper: the Key_id is the view id every sealed message carries in the
//! clear (public anyway, and naming the key exactly); the daemon reseals under a key of its own
//! derived from the view's key, so that its nonces never meet the members' (see
//! conclave_secure's seal module); and the group's AEAD is the secure layer's default.

use conclave_crypto::GroupKey;
use conclave_wire::client::GroupViewId;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::Time;

/// How long old keys are kept (`[resealing]` in the configuration).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResealingConfig {
    /// Keys of one group kept at most (key-out).
    pub keys_per_group: usize,
    /// A key neither handed nor resealed from for this long is dropped (time-out).
    pub key_timeout_ms: u64,
}

impl Default for ResealingConfig {
    fn default() -> Self {
        ResealingConfig {
            keys_per_group: 8,
            key_timeout_ms: 30_000,
        }
    }
}

impl ResealingConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.keys_per_group < 2 || self.key_timeout_ms == 0 {
            return Err(
                "resealing: keys_per_group is at least 2 (the current key and an old \
                        one) and key_timeout_ms above 0"
                    .into(),
            );
        }
        Ok(())
    }
}

struct Kept {
    view: GroupViewId,
    key: GroupKey,
    used: Time,
}

/// The keys a daemon keeps for resealing, by group.
pub struct OldKeys {
    cfg: ResealingConfig,
    groups: HashMap<String, VecDeque<Kept>>,
    /// The daemon's count of messages resealed: the nonce of each, never reused in the run.
    counter: u64,
    last_sweep: Time,
}

impl OldKeys {
    pub fn new(cfg: ResealingConfig) -> OldKeys {
        OldKeys {
            cfg,
            groups: HashMap::new(),
            counter: 0,
            last_sweep: Time::ZERO,
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.key_timeout_ms)
    }

    /// Keeps the key of `view` of `group` (just handed to a member).
    pub fn remember(&mut self, now: Time, group: &str, view: GroupViewId, key: GroupKey) {
        self.sweep(now);
        let keys = self.groups.entry(group.to_owned()).or_default();
        if let Some(k) = keys.iter_mut().find(|k| k.view == view) {
            k.used = now;
            return;
        }
        keys.push_back(Kept {
            view,
            key,
            used: now,
        });
        while keys.len() > self.cfg.keys_per_group {
            keys.pop_front();
        }
    }

    /// The key of `view` of `group`, if still kept (its use renews it).
    pub fn get(&mut self, now: Time, group: &str, view: GroupViewId) -> Option<GroupKey> {
        let timeout = self.timeout();
        let k = self
            .groups
            .get_mut(group)?
            .iter_mut()
            .find(|k| k.view == view && now < k.used + timeout)?;
        k.used = now;
        Some(k.key.clone())
    }

    /// A fresh nonce for a resealed message.
    pub fn next_counter(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// Drops keys unused for the time-out (at most twice per time-out: cheap when called often).
    fn sweep(&mut self, now: Time) {
        let timeout = self.timeout();
        if now < self.last_sweep + timeout / 2 {
            return;
        }
        self.last_sweep = now;
        self.groups.retain(|_, keys| {
            keys.retain(|k| now < k.used + timeout);
            !keys.is_empty()
        });
    }

    /// Keys kept, over all groups.
    pub fn len(&self) -> usize {
        self.groups.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use conclave_wire::gcs::RingId;

    /// View `index` of a group on ring 1.
    pub(crate) fn view(index: u64) -> GroupViewId {
        GroupViewId {
            ring: RingId {
                seq: 1,
                rep: 1,
                inc: 0,
            },
            index,
        }
    }

    fn ms(m: u64) -> Time {
        Time::from_micros(m * 1000)
    }

    #[test]
    fn old_keys_go_by_key_out_and_by_time_out() {
        let mut k = OldKeys::new(ResealingConfig {
            keys_per_group: 2,
            key_timeout_ms: 1000,
        });
        for i in 0..3 {
            k.remember(ms(i), "g", view(i), GroupKey::from_bytes([i as u8; 32]));
        }
        assert!(k.get(ms(3), "g", view(0)).is_none(), "key-out");
        assert_eq!(
            k.get(ms(3), "g", view(1)),
            Some(GroupKey::from_bytes([1; 32]))
        );
        k.remember(ms(10), "h", view(0), GroupKey::from_bytes([9; 32]));
        // Past the time-out only what was used within it stays.
        k.get(ms(900), "g", view(2));
        k.remember(ms(1500), "h", view(1), GroupKey::from_bytes([8; 32]));
        assert!(k.get(ms(1500), "g", view(2)).is_some());
        assert!(k.get(ms(1500), "g", view(1)).is_none(), "time-out");
        assert!(k.get(ms(1500), "h", view(0)).is_none(), "time-out");
        assert_eq!(k.len(), 2);
        assert!(k.next_counter() < k.next_counter());
    }
}
