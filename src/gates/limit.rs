//! Per-type limits: how many tasks of a type may run at once, and how fast they may start (a
//! token bucket). A task held back by a limit stays ready and burns no attempt.

use std::time::{Duration, Instant};

/// How fast a task type's tasks may start: a token bucket that holds up to `burst` starts and
/// refills at `per_second`. Over any stretch of time `t`, at most `burst + per_second × t`
/// tasks of the type start. Given to [`TypeOptions::rate_limit`](crate::TypeOptions::rate_limit).
///
/// On the durable store a start is a claim: the bucket, shared by every pool on the database,
/// is drawn from when a pool claims a task. A pool that prefetches
/// ([`Builder::prefetch`](crate::Builder::prefetch)) starts a claimed task's handler a little
/// later, never sooner, so its handlers' starts keep to the same bound over any stretch, give
/// or take the tasks it holds; a claim given back at shutdown keeps its token spent.
///
/// # Examples
///
/// ```
/// use tasq::RateLimit;
///
/// // Ten starts a second, evenly spaced (a burst of one).
/// let limit = RateLimit::per_second(10.0);
/// assert_eq!(limit.burst(), 1);
/// // Up to 50 at once after a quiet spell, 10 a second after that.
/// let bursty = RateLimit::per_second(10.0).with_burst(50);
/// assert_eq!(bursty.burst(), 50);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    per_second: f64,
    burst: u32,
}

impl RateLimit {
    /// At most `starts` starts a second, with a burst of one. `starts` must be positive and
    /// finite, or the build fails with
    /// [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting).
    ///
    /// # Examples
    ///
    /// ```
    /// // One start every two seconds.
    /// let slow = tasq::RateLimit::per_second(0.5);
    /// assert_eq!(slow.starts_per_second(), 0.5);
    /// ```
    pub const fn per_second(starts: f64) -> Self {
        RateLimit {
            per_second: starts,
            burst: 1,
        }
    }

    /// How many starts may happen at once after a quiet spell (at least 1).
    ///
    /// # Examples
    ///
    /// ```
    /// let limit = tasq::RateLimit::per_second(100.0).with_burst(20);
    /// # let _ = limit;
    /// ```
    pub const fn with_burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        self
    }

    /// The refill rate.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::RateLimit::per_second(3.0).starts_per_second(), 3.0);
    /// ```
    pub const fn starts_per_second(&self) -> f64 {
        self.per_second
    }

    /// The bucket's size.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::RateLimit::per_second(3.0).with_burst(4).burst(), 4);
    /// ```
    pub const fn burst(&self) -> u32 {
        self.burst
    }

    /// Whether the settings make sense (checked when the pool is built).
    pub(crate) fn is_valid(&self) -> bool {
        self.per_second.is_finite() && self.per_second > 0.0 && self.burst >= 1
    }
}

/// A token bucket on the pool's clock: full when made.
#[derive(Clone, Debug)]
pub(crate) struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub(crate) fn full(limit: &RateLimit, now: Instant) -> Self {
        Bucket {
            tokens: f64::from(limit.burst),
            at: now,
        }
    }

    fn refill(&mut self, limit: &RateLimit, now: Instant) {
        if now > self.at {
            let earned = now.duration_since(self.at).as_secs_f64() * limit.per_second;
            self.tokens = (self.tokens + earned).min(f64::from(limit.burst));
            self.at = now;
        }
    }

    /// Takes one start if the bucket has one.
    pub(crate) fn try_take(&mut self, limit: &RateLimit, now: Instant) -> bool {
        self.refill(limit, now);
        // A hair under one counts as one: float steps must not hold a start back forever.
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }

    /// When the bucket next holds a start (`now` if it does).
    pub(crate) fn next_start(&mut self, limit: &RateLimit, now: Instant) -> Instant {
        self.refill(limit, now);
        let missing = (1.0 - self.tokens).max(0.0);
        if missing <= 1e-9 {
            return now;
        }
        let wait = Duration::try_from_secs_f64(missing / limit.per_second).unwrap_or(Duration::MAX);
        // Rounded up to the next microsecond: never a wake-up a hair before the token is there.
        let wait = wait.saturating_add(Duration::from_micros(1));
        now.checked_add(wait).unwrap_or(now)
    }
}

#[cfg(all(test, not(tasq_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_starts_full_and_refills_at_its_rate() {
        let limit = RateLimit::per_second(2.0).with_burst(2);
        let t0 = Instant::now();
        let mut bucket = Bucket::full(&limit, t0);
        assert!(bucket.try_take(&limit, t0));
        assert!(bucket.try_take(&limit, t0));
        assert!(!bucket.try_take(&limit, t0));
        let next = bucket.next_start(&limit, t0);
        assert!(next > t0 + Duration::from_millis(499) && next <= t0 + Duration::from_millis(501));
        assert!(bucket.try_take(&limit, next));
        assert!(!bucket.try_take(&limit, next));
        // A long quiet spell fills it to the burst, no more.
        let later = next + Duration::from_secs(60);
        assert!(bucket.try_take(&limit, later));
        assert!(bucket.try_take(&limit, later));
        assert!(!bucket.try_take(&limit, later));
    }

    #[test]
    fn nonsense_limits_are_refused() {
        assert!(RateLimit::per_second(1.0).is_valid());
        assert!(!RateLimit::per_second(0.0).is_valid());
        assert!(!RateLimit::per_second(f64::NAN).is_valid());
        assert!(!RateLimit::per_second(f64::INFINITY).is_valid());
        assert!(!RateLimit::per_second(1.0).with_burst(0).is_valid());
    }
}
