//! The membership's timers as one table indexed by what each is for, so that arming, expiry and
//! the next deadline are written once instead of once per phase.

use crate::time::Time;

/// What a membership timer is for. A phase arms its own timers when it is entered; entering a
/// phase disarms every other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timer {
    /// No token for `token_loss_ms` (recovery and operational): the ring is broken, gather.
    TokenLoss,
    /// The representative of an operational ring announces it (merge detection).
    MergeDetect,
    /// Send the gather's join message again.
    Join,
    /// Give up on the daemons that have not agreed.
    Consensus,
    /// The commit token did not come back: gather again.
    Commit,
}

const TIMERS: usize = 5;

impl Timer {
    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Default)]
pub(super) struct TimerTable([Option<Time>; TIMERS]);

impl TimerTable {
    /// Disarms every timer, then arms the ones given: what entering a phase does.
    pub fn reset(&mut self, armed: &[(Timer, Time)]) {
        self.0 = [None; TIMERS];
        for (t, at) in armed {
            self.set(*t, *at);
        }
    }

    pub fn set(&mut self, timer: Timer, at: Time) {
        self.0[timer.index()] = Some(at);
    }

    /// Whether `timer` is armed and due at `now`.
    pub fn expired(&self, timer: Timer, now: Time) -> bool {
        self.0[timer.index()].is_some_and(|at| at <= now)
    }

    /// The earliest armed deadline.
    pub fn next(&self) -> Option<Time> {
        self.0.iter().flatten().min().copied()
    }
}
