//! How the durable store's rows map to the crate's types: states, reasons, ids and times.

use std::time::{Duration, Instant};

use crate::task::{CancelReason, Failure, FailureReason, TaskId, TaskState};

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
