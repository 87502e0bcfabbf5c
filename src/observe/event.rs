//! What a pool tells its operator: the [`Event`]s (delivered by `events.rs`).

use std::fmt;
use std::time::Duration;

use crate::gates::breaker::BreakerState;
use crate::model::id::TaskId;
use crate::model::state::{CancelReason, FailureReason};
use crate::observe::alert::{Alert, AlertValue};

/// Something an operator should hear about, given to the hooks of
/// [`Builder::on_event`](crate::Builder::on_event).
///
/// The hooks always hear what an operator must see (dead letters, stuck handlers, breakers,
/// alerts, declaration mismatches). A task's ordinary life (`Submitted`, `Started`,
/// `Succeeded`, `Retrying`, `Cancelled`; its failure is its `DeadLetter`) is told only to a pool
/// built with [`Builder::lifecycle_events`](crate::Builder::lifecycle_events); without it these
/// events are never made, and cost one `bool` check each.
///
/// # Examples
///
/// ```
/// use tasq::{Event, FailureReason, TaskId};
///
/// let event = Event::DeadLetter {
///     id: TaskId::from_parts(1, 7),
///     task_type: "email",
///     reason: FailureReason::Exhausted,
///     attempts: 3,
///     error: "connection refused".into(),
/// };
/// assert_eq!(
///     event.to_string(),
///     "task 1:7 is a dead letter (email, exhausted after 3 attempts): connection refused"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A task ended failed: it is a dead letter. Reported once per dead letter, by the process
    /// that ended it. This is also the lifecycle's *failed* event.
    DeadLetter {
        /// The task.
        id: TaskId,
        /// Its type's name.
        task_type: &'static str,
        /// Why it failed.
        reason: FailureReason,
        /// How many times it ran.
        attempts: u32,
        /// The last error's text.
        error: String,
    },
    /// A handler is still running a grace period ([`Builder::stuck_after`]) after its timeout
    /// fired its token: it ignores the token, and holds its worker until it returns (a thread
    /// cannot be killed). Reported once per run.
    ///
    /// [`Builder::stuck_after`]: crate::Builder::stuck_after
    Stuck {
        /// The task.
        id: TaskId,
        /// Its type's name.
        task_type: &'static str,
        /// The attempt that is stuck.
        attempt: u32,
        /// How long it has run.
        running_for: Duration,
    },
    /// A downstream's circuit breaker changed state.
    Breaker {
        /// The downstream's name.
        downstream: &'static str,
        /// Its new state.
        state: BreakerState,
    },
    /// A backlog alert reached its threshold.
    AlertRaised {
        /// The alert.
        alert: Alert,
        /// What it measured.
        value: AlertValue,
    },
    /// A raised alert's measure fell back under its threshold.
    AlertCleared {
        /// The alert.
        alert: Alert,
        /// What it measured.
        value: AlertValue,
    },
    /// (Durable store.) This pool, as it was built, declares a task type with other settings
    /// than the last pool built with it on the same schema: tasks each submits carry their
    /// submitter's settings, and each pool applies its own limits. Reported once per type at
    /// build (see `Totals::declaration_mismatches`); give a type the same `TypeOptions`
    /// everywhere.
    DeclarationMismatch {
        /// The type.
        task_type: &'static str,
        /// Each setting that differs, with this pool's value and, in brackets, the other's:
        /// `"max_attempts 20 (3)"`.
        differences: String,
        /// Who declared it the other way, and when: `"4711@worker-3 at 2026-12-05 07:12:03 UTC"`.
        declared_by: String,
    },
    /// (Lifecycle.) `submit` in this pool accepted a task (a duplicate key's submit is not a
    /// new task, and is not told).
    Submitted {
        /// The task.
        id: TaskId,
        /// Its type's name.
        task_type: &'static str,
        /// Its priority.
        priority: u8,
    },
    /// (Lifecycle.) A worker of this pool started a run of a task.
    Started {
        /// The task.
        id: TaskId,
        /// Its type's name.
        task_type: &'static str,
        /// The run's attempt, 1 for the first.
        attempt: u32,
    },
    /// (Lifecycle.) A run in this pool succeeded, and the store recorded it.
    Succeeded {
        /// The task.
        id: TaskId,
        /// Its type's name.
        task_type: &'static str,
        /// The attempt that succeeded.
        attempt: u32,
    },
    /// (Lifecycle.) A run in this pool failed with attempts left, and the store recorded that
    /// the task runs again after `delay`.
    Retrying {
        /// The task.
        id: TaskId,
        /// Its type's name.
        task_type: &'static str,
        /// The attempt that failed.
        attempt: u32,
        /// How long until the next attempt may start.
        delay: Duration,
        /// The error's text.
        error: String,
    },
    /// (Lifecycle.) A task ended cancelled, by this pool: a cancel of a waiting task, a running
    /// task's run ending after its cancel, a dependent of a task that failed or was cancelled,
    /// or (embedded store) the shutdown. On the durable store, the dependents a cascade cancels
    /// are not told one by one: their root's `DeadLetter` or `Cancelled` is.
    Cancelled {
        /// The task.
        id: TaskId,
        /// Its type's name.
        task_type: &'static str,
        /// Why.
        reason: CancelReason,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::DeadLetter {
                id,
                task_type,
                reason,
                attempts,
                error,
            } => write!(
                f,
                "{id} is a dead letter ({task_type}, {reason} after {attempts} attempt{}): {error}",
                if *attempts == 1 { "" } else { "s" }
            ),
            Event::Stuck {
                id,
                task_type,
                attempt,
                running_for,
            } => write!(
                f,
                "{id} is stuck ({task_type}, attempt {attempt}): it has run {running_for:?}, past its timeout"
            ),
            Event::Breaker { downstream, state } => {
                write!(f, "circuit breaker of {downstream}: {state}")
            }
            Event::AlertRaised { alert, value } => write!(f, "alert raised: {alert} ({value})"),
            Event::AlertCleared { alert, value } => write!(f, "alert cleared: {alert} ({value})"),
            Event::DeclarationMismatch {
                task_type,
                differences,
                declared_by,
            } => write!(
                f,
                "task type {task_type} is declared here otherwise than by {declared_by}: \
                 {differences}"
            ),
            Event::Submitted {
                id,
                task_type,
                priority,
            } => write!(f, "{id} submitted ({task_type}, priority {priority})"),
            Event::Started {
                id,
                task_type,
                attempt,
            } => write!(f, "{id} started ({task_type}, attempt {attempt})"),
            Event::Succeeded {
                id,
                task_type,
                attempt,
            } => write!(f, "{id} succeeded ({task_type}, attempt {attempt})"),
            Event::Retrying {
                id,
                task_type,
                attempt,
                delay,
                error,
            } => write!(
                f,
                "{id} will retry in {delay:?} ({task_type}, attempt {attempt} failed): {error}"
            ),
            Event::Cancelled {
                id,
                task_type,
                reason,
            } => write!(f, "{id} cancelled ({task_type}): {reason}"),
        }
    }
}
