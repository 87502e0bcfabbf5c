//! The pool's `tracing` events and spans (feature `tracing`): the only module that names the
//! crate. Without the feature every function here is empty and inlined away; with it and no
//! subscriber, each costs one check of `tracing`'s global level filter.
//!
//! Events are on target `tasq`: `debug` for a task's ordinary life (submit, start, retry,
//! cancel), `warn` for what an operator should see (a dead letter, a stuck handler, a breaker
//! opening, an alert), `info` for the rest (breakers closing, alerts clearing, shutdown). Each
//! run is a `tasq.run` span with the task's id, type and attempt.

use std::time::Duration;

use crate::model::id::TaskId;
use crate::observe::event::Event;

/// A run's span, entered for as long as the value lives.
pub(crate) struct RunSpan {
    #[cfg(feature = "tracing")]
    _entered: tracing::span::EnteredSpan,
}

/// Whether a subscriber wants the `warn` events (so an event worth building is built).
#[inline]
pub(crate) fn enabled() -> bool {
    #[cfg(feature = "tracing")]
    {
        tracing::enabled!(target: "tasq", tracing::Level::WARN)
    }
    #[cfg(not(feature = "tracing"))]
    {
        false
    }
}

/// A task was accepted.
#[inline]
pub(crate) fn submitted(id: TaskId, task_type: &'static str, priority: u8) {
    #[cfg(feature = "tracing")]
    tracing::debug!(target: "tasq", task_id = %id, task_type, priority, "task submitted");
    #[cfg(not(feature = "tracing"))]
    let _ = (id, task_type, priority);
}

/// A run starts: its span, entered until the returned value drops.
#[inline]
pub(crate) fn run(id: TaskId, task_type: &'static str, attempt: u32) -> RunSpan {
    #[cfg(feature = "tracing")]
    {
        let span =
            tracing::debug_span!(target: "tasq", "tasq.run", task_id = %id, task_type, attempt);
        let entered = span.entered();
        tracing::debug!(target: "tasq", "task started");
        RunSpan { _entered: entered }
    }
    #[cfg(not(feature = "tracing"))]
    {
        let _ = (id, task_type, attempt);
        RunSpan {}
    }
}

/// A run failed with attempts left: it runs again after `delay`.
#[inline]
pub(crate) fn retry(delay: Duration, error: &str) {
    #[cfg(feature = "tracing")]
    tracing::debug!(target: "tasq", ?delay, error, "task will retry");
    #[cfg(not(feature = "tracing"))]
    let _ = (delay, error);
}

/// A run's timeout fired its token.
#[inline]
pub(crate) fn timed_out(id: TaskId, timeout: Duration) {
    #[cfg(feature = "tracing")]
    tracing::info!(target: "tasq", task_id = %id, ?timeout, "task timed out; its token fired");
    #[cfg(not(feature = "tracing"))]
    let _ = (id, timeout);
}

/// A cancel reached a task.
#[inline]
pub(crate) fn cancelled(id: TaskId) {
    #[cfg(feature = "tracing")]
    tracing::debug!(target: "tasq", task_id = %id, "task cancel requested");
    #[cfg(not(feature = "tracing"))]
    let _ = id;
}

/// A shutdown began.
#[inline]
pub(crate) fn shutdown(timeout: Duration) {
    #[cfg(feature = "tracing")]
    tracing::info!(target: "tasq", ?timeout, "pool shutting down");
    #[cfg(not(feature = "tracing"))]
    let _ = timeout;
}

/// One of the pool's [`Event`]s, as a `tracing` event.
#[inline]
pub(crate) fn event(event: &Event) {
    #[cfg(feature = "tracing")]
    match event {
        Event::DeadLetter {
            id,
            task_type,
            reason,
            attempts,
            error,
        } => tracing::warn!(
            target: "tasq", task_id = %id, task_type, %reason, attempts, error = error.as_str(),
            "dead letter"
        ),
        Event::Stuck {
            id,
            task_type,
            attempt,
            running_for,
        } => tracing::warn!(
            target: "tasq", task_id = %id, task_type, attempt, ?running_for,
            "handler stuck past its timeout"
        ),
        Event::Breaker { downstream, state } => match state {
            crate::gates::breaker::BreakerState::Closed => {
                tracing::info!(target: "tasq", downstream, %state, "circuit breaker changed")
            }
            _ => tracing::warn!(target: "tasq", downstream, %state, "circuit breaker changed"),
        },
        Event::AlertRaised { alert, value } => {
            tracing::warn!(target: "tasq", %alert, %value, "alert raised")
        }
        Event::AlertCleared { alert, value } => {
            tracing::info!(target: "tasq", %alert, %value, "alert cleared")
        }
        Event::DeclarationMismatch {
            task_type,
            differences,
            declared_by,
        } => tracing::warn!(
            target: "tasq", task_type, differences = differences.as_str(),
            declared_by = declared_by.as_str(), "task type declared otherwise elsewhere"
        ),
        // A task's ordinary life is traced where it happens (`submitted`, `run`, `retry`,
        // `cancelled` above), inside the run's span: not a second time from here.
        Event::Submitted { .. }
        | Event::Started { .. }
        | Event::Succeeded { .. }
        | Event::Retrying { .. }
        | Event::Cancelled { .. } => {}
    }
    #[cfg(not(feature = "tracing"))]
    let _ = event;
}
