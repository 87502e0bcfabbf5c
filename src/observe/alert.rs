//! Backlog alerts: thresholds on the ready queue's depth and on how long its oldest task has
//! waited, for the whole pool, one priority or one task type. Each fires once when its
//! threshold is reached and once when the backlog falls back under it, never once per task.

use std::fmt;
use std::time::Duration;

use crate::observe::stats::{Stats, TypeStats};

/// A backlog threshold, given to [`Builder::alert`](crate::Builder::alert). The pool checks its
/// alerts every [`Builder::monitor_interval`](crate::Builder::monitor_interval) and reports
/// through [`Builder::on_event`](crate::Builder::on_event): [`Event::AlertRaised`] when the
/// measure reaches the threshold, [`Event::AlertCleared`] when it is back under it.
///
/// The depth counts ready tasks (due, waiting for a worker, including those a limit or an open
/// breaker holds back); the age is that of the task ready longest.
///
/// [`Event::AlertRaised`]: crate::Event::AlertRaised
/// [`Event::AlertCleared`]: crate::Event::AlertCleared
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::Alert;
///
/// let deep = Alert::ready_depth(10_000);
/// let slow_mail = Alert::oldest_ready(Duration::from_secs(60)).task_type("email");
/// let urgent = Alert::ready_depth(10).priority(9);
/// assert_eq!(urgent.to_string(), "ready tasks of priority 9 >= 10");
/// # let _ = (deep, slow_mail);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Alert {
    measure: Measure,
    scope: AlertScope,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Measure {
    Depth(usize),
    Age(Duration),
}

/// Which tasks an [`Alert`] looks at.
///
/// # Examples
///
/// ```
/// use tasq::{Alert, AlertScope};
/// assert_eq!(Alert::ready_depth(5).task_type("email").scope(), AlertScope::TaskType("email"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AlertScope {
    /// Every ready task.
    Pool,
    /// The ready tasks of one priority.
    Priority(u8),
    /// The ready tasks of one task type.
    TaskType(&'static str),
}

/// What an alert measured when it fired or cleared.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// assert_eq!(tasq::AlertValue::Depth(12).to_string(), "12 ready");
/// assert_eq!(tasq::AlertValue::Age(Duration::from_millis(1500)).to_string(), "oldest ready 1.5s");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AlertValue {
    /// Ready tasks.
    Depth(usize),
    /// How long the oldest ready task has waited.
    Age(Duration),
}

impl Alert {
    /// Fires when `threshold` or more tasks are ready.
    ///
    /// # Examples
    ///
    /// ```
    /// let alert = tasq::Alert::ready_depth(1_000);
    /// # let _ = alert;
    /// ```
    pub const fn ready_depth(threshold: usize) -> Self {
        Alert {
            measure: Measure::Depth(threshold),
            scope: AlertScope::Pool,
        }
    }

    /// Fires when a ready task has waited `threshold` or longer.
    ///
    /// # Examples
    ///
    /// ```
    /// let alert = tasq::Alert::oldest_ready(std::time::Duration::from_secs(30));
    /// # let _ = alert;
    /// ```
    pub const fn oldest_ready(threshold: Duration) -> Self {
        Alert {
            measure: Measure::Age(threshold),
            scope: AlertScope::Pool,
        }
    }

    /// Looks only at tasks of `priority`.
    ///
    /// # Examples
    ///
    /// ```
    /// let alert = tasq::Alert::ready_depth(100).priority(0);
    /// # let _ = alert;
    /// ```
    pub const fn priority(mut self, priority: u8) -> Self {
        self.scope = AlertScope::Priority(priority);
        self
    }

    /// Looks only at tasks of the type named `name` (a type the pool does not register makes
    /// the build fail with [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting)).
    ///
    /// # Examples
    ///
    /// ```
    /// let alert = tasq::Alert::ready_depth(100).task_type("email");
    /// # let _ = alert;
    /// ```
    pub const fn task_type(mut self, name: &'static str) -> Self {
        self.scope = AlertScope::TaskType(name);
        self
    }

    /// Which tasks it looks at.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::Alert::ready_depth(1).scope(), tasq::AlertScope::Pool);
    /// ```
    pub const fn scope(&self) -> AlertScope {
        self.scope
    }

    /// Whether it needs the per-type figures (which cost a scan on the embedded store).
    pub(crate) fn per_type(&self) -> bool {
        matches!(self.scope, AlertScope::TaskType(_))
    }

    /// What it measures in `stats` (and `types`, for a per-type alert), and whether that
    /// reaches its threshold.
    pub(crate) fn measure(&self, stats: &Stats, types: &[TypeStats]) -> (AlertValue, bool) {
        let (depth, age) = match self.scope {
            AlertScope::Pool => (stats.ready, stats.oldest_ready),
            AlertScope::Priority(p) => (
                stats
                    .ready_by_priority
                    .iter()
                    .find(|&&(q, _)| q == p)
                    .map_or(0, |&(_, n)| n),
                stats
                    .oldest_ready_by_priority
                    .iter()
                    .find(|&&(q, _)| q == p)
                    .map(|&(_, age)| age),
            ),
            AlertScope::TaskType(name) => types
                .iter()
                .find(|t| t.task_type == name)
                .map_or((0, None), |t| (t.ready, t.oldest_ready)),
        };
        match self.measure {
            Measure::Depth(threshold) => (AlertValue::Depth(depth), depth >= threshold),
            Measure::Age(threshold) => {
                let age = age.unwrap_or(Duration::ZERO);
                (AlertValue::Age(age), age >= threshold && depth > 0)
            }
        }
    }
}

impl fmt::Display for Alert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.measure {
            Measure::Depth(_) => f.write_str("ready tasks")?,
            Measure::Age(_) => f.write_str("oldest ready task's wait")?,
        }
        match self.scope {
            AlertScope::Pool => {}
            AlertScope::Priority(p) => write!(f, " of priority {p}")?,
            AlertScope::TaskType(name) => write!(f, " of type {name}")?,
        }
        match self.measure {
            Measure::Depth(n) => write!(f, " >= {n}"),
            Measure::Age(d) => write!(f, " >= {d:?}"),
        }
    }
}

impl fmt::Display for AlertValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AlertValue::Depth(n) => write!(f, "{n} ready"),
            AlertValue::Age(d) => write!(f, "oldest ready {d:?}"),
        }
    }
}

/// The alerts of one pool and which of them are raised: the monitor feeds it a snapshot at
/// each check and reports the changes.
#[derive(Debug)]
pub(crate) struct Alerts {
    alerts: Vec<(Alert, bool)>,
}

impl Alerts {
    pub(crate) fn new(alerts: Vec<Alert>) -> Self {
        Alerts {
            alerts: alerts.into_iter().map(|a| (a, false)).collect(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.alerts.is_empty()
    }

    pub(crate) fn need_types(&self) -> bool {
        self.alerts.iter().any(|(a, _)| a.per_type())
    }

    /// The alerts whose state changed: `(alert, value, raised)`.
    pub(crate) fn check(
        &mut self,
        stats: &Stats,
        types: &[TypeStats],
    ) -> Vec<(Alert, AlertValue, bool)> {
        let mut changed = Vec::new();
        for (alert, raised) in &mut self.alerts {
            let (value, over) = alert.measure(stats, types);
            if over != *raised {
                *raised = over;
                changed.push((*alert, value, over));
            }
        }
        changed
    }
}
