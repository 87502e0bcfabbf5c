//! How the durable store's rows map to the crate's types: states, reasons, ids and times.

use std::time::{Duration, Instant};

use crate::model::id::TaskId;
use crate::model::retry::RetryPolicy;
use crate::model::state::{CancelReason, Failure, FailureReason, TaskState};
use crate::store::registry::Settings;

/// The state of a row: its `status`, and for a ready row whether it is due.
pub(crate) fn state_of(status: &str, due: bool) -> TaskState {
    match status {
        "blocked" => TaskState::Blocked,
        "ready" if due => TaskState::Ready,
        "ready" => TaskState::Scheduled,
        "running" => TaskState::Running,
        "succeeded" => TaskState::Succeeded,
        "failed" => TaskState::Failed,
        _ => TaskState::Cancelled,
    }
}

pub(crate) fn failure_reason_text(reason: FailureReason) -> &'static str {
    reason.label()
}

pub(crate) fn failure_reason_of(text: &str) -> FailureReason {
    FailureReason::ALL
        .into_iter()
        .find(|reason| reason.label() == text)
        .unwrap_or(FailureReason::BadPayload)
}

/// A cancel reason as its two columns: the kind, and the task it names.
pub(crate) fn cancel_reason_columns(reason: CancelReason) -> (&'static str, Option<i64>) {
    match reason {
        CancelReason::Requested => ("requested", None),
        CancelReason::Shutdown => ("shutdown", None),
        CancelReason::DependencyFailed(id) => ("dependency_failed", Some(seq_of(id))),
        CancelReason::DependencyCancelled(id) => ("dependency_cancelled", Some(seq_of(id))),
    }
}

pub(crate) fn cancel_reason_of(queue: u64, kind: Option<&str>, cause: Option<i64>) -> CancelReason {
    let cause = || TaskId::from_parts(queue, cause.unwrap_or(0) as u64);
    match kind {
        Some("dependency_failed") => CancelReason::DependencyFailed(cause()),
        Some("dependency_cancelled") => CancelReason::DependencyCancelled(cause()),
        Some("shutdown") => CancelReason::Shutdown,
        _ => CancelReason::Requested,
    }
}

/// A failure read back from a row (the source error stays in the process that saw it).
pub(crate) fn failure_of(reason: Option<&str>, attempts: i32, error: Option<String>) -> Failure {
    Failure::new(
        failure_reason_of(reason.unwrap_or("")),
        u32::try_from(attempts).unwrap_or(0),
        error.unwrap_or_default(),
        None,
    )
}

/// A task id's row id, if it belongs to queue `queue`.
pub(crate) fn local_seq(queue: u64, id: TaskId) -> Option<i64> {
    (id.pool() == queue)
        .then(|| i64::try_from(id.seq()).ok())
        .flatten()
}

fn seq_of(id: TaskId) -> i64 {
    i64::try_from(id.seq()).unwrap_or(i64::MAX)
}

/// The instant `seconds` after `now` (negative: before), as the database measured it.
pub(crate) fn instant_in(now: Instant, seconds: f64) -> Instant {
    if !seconds.is_finite() {
        return now;
    }
    let offset = Duration::from_secs_f64(seconds.abs().min(1e9));
    if seconds >= 0.0 {
        now.checked_add(offset).unwrap_or(now)
    } else {
        now.checked_sub(offset).unwrap_or(now)
    }
}

/// A duration in microseconds, for `interval '1 microsecond' * $n`.
pub(crate) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// An age the database gave in seconds (`EXTRACT(EPOCH FROM ...)`) as a duration, a negative
/// one (clocks a hair apart) as zero.
pub(crate) fn age(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or_default()
}

/// A task's settings as its row keeps them, from column `first` on: `max_attempts`,
/// `retry_base_us`, `retry_cap_us`, `timeout_us` (0: no timeout). A column left NULL (a row
/// inserted by hand, or before schema version 3) takes the type's setting as `entry`, this
/// pool's registration, has it.
pub(crate) fn settings_of(defaults: Settings, row: &postgres::Row, first: usize) -> Settings {
    let mut settings = defaults;
    let micros = |column: usize| {
        row.get::<_, Option<i64>>(column)
            .map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)))
    };
    if let Some(attempts) = row.get::<_, Option<i32>>(first) {
        settings.max_attempts = u32::try_from(attempts).unwrap_or(0);
    }
    if let (Some(base), Some(cap)) = (micros(first + 1), micros(first + 2)) {
        settings.retry = RetryPolicy::exponential(base, cap);
    }
    if let Some(timeout) = micros(first + 3) {
        settings.timeout = Some(timeout).filter(|t| !t.is_zero());
    }
    settings
}

/// The columns [`settings_of`] reads: `max_attempts`, `retry_base_us`, `retry_cap_us`,
/// `timeout_us`.
pub(crate) fn settings_columns(settings: &Settings) -> SettingsColumns {
    (
        i32::try_from(settings.max_attempts).unwrap_or(i32::MAX),
        Some(micros(settings.retry.base())),
        Some(micros(settings.retry.cap())),
        Some(settings.timeout.map_or(0, |t| micros(t).max(1))),
    )
}

/// A task's settings as its row's columns: `max_attempts`, `retry_base_us`, `retry_cap_us`,
/// `timeout_us` (see [`settings_of`]).
pub(crate) type SettingsColumns = (i32, Option<i64>, Option<i64>, Option<i64>);
