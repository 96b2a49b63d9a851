//! Time as the pure state machines see it: an input, never read from a clock.
//!
//! The driver (the daemon's runtime, the simulator, a test) picks the origin, usually its own
//! start; only differences and order mean anything to the core. Microseconds are fine enough for
//! a token hold (hundreds of microseconds) and last 584,000 years in a `u64`.

use std::fmt;
use std::ops::{Add, AddAssign};
use std::time::Duration;

/// A point in time, in microseconds since the driver's origin.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(u64);

impl Time {
    /// The driver's origin.
    pub const ZERO: Time = Time(0);

    pub const fn from_micros(us: u64) -> Time {
        Time(us)
    }

    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this is; zero if it is not after it.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

/// Whole microseconds of a duration, saturating: no configured interval comes near the limit,
/// and a hostile or absurd one must not wrap into the past.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(micros(d)))
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}µs", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_and_orders() {
        let t = Time::from_micros(1_000);
        assert_eq!((t + Duration::from_millis(2)).as_micros(), 3_000);
        assert_eq!(t.saturating_since(Time::from_micros(1_500)), Duration::ZERO);
        assert_eq!(
            (t + Duration::from_millis(2)).saturating_since(t),
            Duration::from_millis(2)
        );
        assert_eq!(
            Time::from_micros(u64::MAX - 1) + Duration::MAX,
            Time::from_micros(u64::MAX)
        );
        assert!(Time::ZERO < t);
    }
}
