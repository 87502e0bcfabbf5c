//! Circuit breakers, one per downstream: the settings, and the state machine both stores run.
//!
//! A task type names the downstream it calls ([`TypeOptions::downstream`]); several types may
//! share one. The breaker counts the downstream's consecutive failed runs. At the threshold it
//! *opens*: the downstream's tasks stay ready without being started, so no attempt is burned
//! while the downstream is known to be down, and every other type keeps running. After the
//! cool-down it is *half-open*: one task, the probe, may start. A success closes it (everything
//! held starts again); a failure opens it for another cool-down.
//!
//! A success closes the breaker from any state: the probe's, and also that of a run that started
//! before the breaker opened and ended while it was open. Either shows the downstream answering
//! again, and waiting out the cool-down for a probe to show it once more would only hold work
//! back. A late failure of such a run, by contrast, does not restart the cool-down.
//!
//! What counts: a run that returns a retryable error or times out is a failure (on its last
//! attempt too); a success is a success. A permanent error, a panic or a cancel says nothing
//! about the downstream and counts as neither (a probe that ends so lets another probe start).
//!
//! [`TypeOptions::downstream`]: crate::TypeOptions::downstream

use std::fmt;
use std::time::{Duration, Instant};

/// A circuit breaker's settings, given to [`Builder::breaker`](crate::Builder::breaker) with the
/// downstream's name.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::Breaker;
///
/// // Open after 5 failures in a row; probe again after 30 seconds.
/// let breaker = Breaker::new(5, Duration::from_secs(30));
/// assert_eq!(breaker.failures(), 5);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Breaker {
    failures: u32,
    cool_down: Duration,
}

impl Breaker {
    /// Opens after `failures` consecutive failed runs (at least 1; zero makes the build fail
    /// with [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting)), and lets a
    /// probe through `cool_down` after it opened.
    ///
    /// # Examples
    ///
    /// ```
    /// let breaker = tasq::Breaker::new(3, std::time::Duration::from_secs(10));
    /// # let _ = breaker;
    /// ```
    pub const fn new(failures: u32, cool_down: Duration) -> Self {
        Breaker {
            failures,
            cool_down,
        }
    }

    /// The consecutive failures that open the breaker.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::Breaker::new(3, std::time::Duration::ZERO).failures(), 3);
    /// ```
    pub const fn failures(&self) -> u32 {
        self.failures
    }

    /// How long the breaker stays open before a probe may start.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(tasq::Breaker::new(3, Duration::from_secs(9)).cool_down(), Duration::from_secs(9));
    /// ```
    pub const fn cool_down(&self) -> Duration {
        self.cool_down
    }
}

/// Where a circuit breaker stands.
///
/// # Examples
///
/// ```
/// assert_eq!(tasq::BreakerState::Open.to_string(), "open");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// The downstream's tasks run.
    Closed,
    /// The downstream failed too often: its tasks wait, ready, until the cool-down ends.
    Open,
    /// The cool-down ended: one probe task may run; its outcome closes or reopens the breaker.
    HalfOpen,
}

impl BreakerState {
    /// The state's name as the durable store writes it and the metrics label it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The state written as [`as_str`](BreakerState::as_str) does.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn parse(s: &str) -> BreakerState {
        match s {
            "open" => BreakerState::Open,
            "half_open" => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
        })
    }
}

/// What a finished run says about its downstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Success,
    Failure,
    /// A permanent error, a panic, a cancel: nothing about the downstream.
    Neither,
}

/// One downstream's breaker as the embedded store keeps it (the durable store keeps the same
/// fields in a row and follows the same rules in SQL).
#[derive(Clone, Debug)]
pub(crate) struct BreakerCell {
    pub(crate) state: BreakerState,
    /// Failed runs since the last success.
    pub(crate) consecutive: u32,
    /// When it last opened.
    pub(crate) opened_at: Option<Instant>,
    /// Half-open, and the probe has started and not ended.
    pub(crate) probe_out: bool,
}

impl BreakerCell {
    pub(crate) fn new() -> Self {
        BreakerCell {
            state: BreakerState::Closed,
            consecutive: 0,
            opened_at: None,
            probe_out: false,
        }
    }

    /// Whether a task of the downstream may start at `now` (and if so, it has started: a
    /// half-open breaker lets one through). Returns the new state if this changed it.
    pub(crate) fn try_start(
        &mut self,
        now: Instant,
        settings: &Breaker,
    ) -> (bool, Option<BreakerState>) {
        match self.state {
            BreakerState::Closed => (true, None),
            BreakerState::Open => {
                if self.reopens_at(settings).is_some_and(|at| now >= at) {
                    self.state = BreakerState::HalfOpen;
                    self.probe_out = true;
                    (true, Some(BreakerState::HalfOpen))
                } else {
                    (false, None)
                }
            }
            BreakerState::HalfOpen if !self.probe_out => {
                self.probe_out = true;
                (true, None)
            }
            BreakerState::HalfOpen => (false, None),
        }
    }

    /// Records a run's verdict; returns the new state if it changed.
    pub(crate) fn record(
        &mut self,
        verdict: Verdict,
        now: Instant,
        settings: &Breaker,
    ) -> Option<BreakerState> {
        match verdict {
            Verdict::Success => {
                self.consecutive = 0;
                self.probe_out = false;
                (self.state != BreakerState::Closed).then(|| {
                    self.state = BreakerState::Closed;
                    self.opened_at = None;
                    BreakerState::Closed
                })
            }
            Verdict::Failure => {
                self.consecutive = self.consecutive.saturating_add(1);
                match self.state {
                    BreakerState::Closed if self.consecutive >= settings.failures => {
                        self.open(now);
                        Some(BreakerState::Open)
                    }
                    BreakerState::HalfOpen => {
                        self.open(now);
                        Some(BreakerState::Open)
                    }
                    _ => None,
                }
            }
            Verdict::Neither => {
                // A probe that ended saying nothing: another may start.
                self.probe_out = false;
                None
            }
        }
    }

    fn open(&mut self, now: Instant) {
        self.state = BreakerState::Open;
        self.opened_at = Some(now);
        self.probe_out = false;
    }

    /// When an open breaker lets a probe through.
    pub(crate) fn reopens_at(&self, settings: &Breaker) -> Option<Instant> {
        match self.state {
            BreakerState::Open => self
                .opened_at
                .map(|at| at.checked_add(settings.cool_down).unwrap_or(at)),
            _ => None,
        }
    }
}

#[cfg(all(test, not(tasq_loom)))]
mod tests {
    use super::*;

    #[test]
    fn opens_at_the_threshold_probes_after_the_cool_down_and_closes_on_success() {
        let settings = Breaker::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        let mut cell = BreakerCell::new();
        assert_eq!(cell.record(Verdict::Failure, t0, &settings), None);
        assert_eq!(
            cell.record(Verdict::Failure, t0, &settings),
            Some(BreakerState::Open)
        );
        assert_eq!(cell.try_start(t0, &settings), (false, None));
        let later = t0 + Duration::from_secs(10);
        assert_eq!(
            cell.try_start(later, &settings),
            (true, Some(BreakerState::HalfOpen))
        );
        // One probe at a time.
        assert_eq!(cell.try_start(later, &settings), (false, None));
        assert_eq!(
            cell.record(Verdict::Success, later, &settings),
            Some(BreakerState::Closed)
        );
        assert_eq!(cell.try_start(later, &settings), (true, None));
    }

    #[test]
    fn a_failed_probe_reopens_and_a_neutral_one_lets_another_probe() {
        let settings = Breaker::new(1, Duration::from_secs(5));
        let t0 = Instant::now();
        let mut cell = BreakerCell::new();
        cell.record(Verdict::Failure, t0, &settings);
        let t1 = t0 + Duration::from_secs(5);
        assert!(cell.try_start(t1, &settings).0);
        assert_eq!(cell.record(Verdict::Neither, t1, &settings), None);
        assert!(cell.try_start(t1, &settings).0, "another probe");
        assert_eq!(
            cell.record(Verdict::Failure, t1, &settings),
            Some(BreakerState::Open)
        );
        assert_eq!(
            cell.reopens_at(&settings),
            Some(t1 + Duration::from_secs(5))
        );
        // A run that started before the breaker opened and succeeds while it is open closes
        // it at once; one that fails then leaves the cool-down as it was.
        let mut cell = BreakerCell::new();
        cell.record(Verdict::Failure, t0, &settings);
        let t2 = t0 + Duration::from_secs(1);
        assert_eq!(cell.record(Verdict::Failure, t2, &settings), None);
        assert_eq!(
            cell.reopens_at(&settings),
            Some(t0 + Duration::from_secs(5))
        );
        assert_eq!(
            cell.record(Verdict::Success, t2, &settings),
            Some(BreakerState::Closed)
        );
        assert_eq!(cell.try_start(t2, &settings), (true, None));
        // A success resets the count: the threshold needs consecutive failures.
        let mut cell = BreakerCell::new();
        let settings = Breaker::new(2, Duration::from_secs(5));
        cell.record(Verdict::Failure, t0, &settings);
        cell.record(Verdict::Success, t0, &settings);
        assert_eq!(cell.record(Verdict::Failure, t0, &settings), None);
    }
}
