//! Aging: a ready task's priority rises the longer it waits, so that a flood of high-priority
//! work cannot hold a low-priority task back forever. Opt-in per pool; strict priority is the
//! default.

use std::time::Duration;

/// How ready tasks age, given to [`Builder::aging`](crate::Builder::aging): a task that has
/// waited ready for `n × every` runs as if its priority were `priority + n`, up to `ceiling`
/// (a task above the ceiling keeps its own). Among tasks of one effective priority the one
/// ready longest runs first.
///
/// **The bound.** A task of priority `p` that became ready at `t` reaches the ceiling at
/// `t + (ceiling − p) × every`. From then on no task that became ready after `t` runs before it
/// unless its own priority is above the ceiling: with a ceiling at or above the highest
/// priority in use, it waits at most `(ceiling − p) × every` plus the time the workers take to
/// run the tasks that were ready before it. The durable store applies aging in a periodic
/// update, so there the bound grows by one `every`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::Aging;
///
/// // One level every 10 seconds, up to 9: a priority-0 task overtakes fresh priority-9 work
/// // after 90 seconds at most.
/// let aging = Aging::new(Duration::from_secs(10), 9);
/// assert_eq!(aging.effective(0, Duration::from_secs(35)), 3);
/// assert_eq!(aging.effective(0, Duration::from_secs(500)), 9);
/// assert_eq!(aging.effective(12, Duration::from_secs(500)), 12);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aging {
    every: Duration,
    ceiling: u8,
}

impl Aging {
    /// One priority level per `every` of waiting, up to `ceiling`. A zero `every` makes the
    /// build fail with [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting).
    ///
    /// # Examples
    ///
    /// ```
    /// let aging = tasq::Aging::new(std::time::Duration::from_secs(1), 5);
    /// # let _ = aging;
    /// ```
    pub const fn new(every: Duration, ceiling: u8) -> Self {
        Aging { every, ceiling }
    }

    /// The wait that earns one level.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(tasq::Aging::new(Duration::from_secs(2), 5).every(), Duration::from_secs(2));
    /// ```
    pub const fn every(&self) -> Duration {
        self.every
    }

    /// The highest priority aging gives.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::Aging::new(std::time::Duration::from_secs(2), 5).ceiling(), 5);
    /// ```
    pub const fn ceiling(&self) -> u8 {
        self.ceiling
    }

    /// The priority a task of `priority` runs at after waiting `waited`.
    ///
    /// # Examples
    ///
    /// See [`Aging`].
    pub fn effective(&self, priority: u8, waited: Duration) -> u8 {
        if priority >= self.ceiling || self.every.is_zero() {
            return priority;
        }
        let levels = waited.as_nanos() / self.every.as_nanos();
        let room = u128::from(self.ceiling - priority);
        priority + u8::try_from(levels.min(room)).expect("at most 255")
    }
}
