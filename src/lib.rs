//! A task queue and worker pool for programs that do not use async.
//!
//! tasq runs typed tasks on a pool of OS threads: higher priorities first, delayed tasks at
//! their time, failed tasks retried with exponential backoff and full jitter, tasks that keep
//! failing (or panic) kept as dead letters, tasks that wait for other tasks, cancellation, and a
//! graceful shutdown with a deadline. Delivery is at-least-once: a handler may run more than
//! once for one task (retries), so make handlers idempotent.
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use tasq::{HandlerError, Pool, TaskType};
//!
//! // A task type: its name, its payload type and its handler's output type.
//! const RESIZE: TaskType<(u32, u32), u64> = TaskType::new("resize");
//!
//! let pool = Pool::builder()
//!     .workers(4)
//!     .register(RESIZE, |ctx, &(w, h): &(u32, u32)| {
//!         if ctx.is_cancelled() {
//!             return Err(HandlerError::retryable("cancelled"));
//!         }
//!         if w == 0 || h == 0 {
//!             // Retrying cannot fix this: straight to the dead letters.
//!             return Err(HandlerError::permanent("empty image"));
//!         }
//!         Ok(u64::from(w) * u64::from(h))
//!     })
//!     .build()?;
//!
//! let urgent = pool.submit(RESIZE.task((640, 480)).priority(10))?;
//! let later = pool.submit(RESIZE.task((0, 480)).delay(Duration::from_millis(10)))?;
//! assert_eq!(urgent.wait().succeeded(), Some(307_200));
//! assert!(later.wait().is_failed());
//! assert_eq!(pool.dead_letters().len(), 1);
//!
//! let report = pool.shutdown(Duration::from_secs(5));
//! assert_eq!((report.succeeded, report.failed), (1, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design
//!
//! Workers block on one lock and condition variables that guard a ready queue (by priority,
//! first-in first-out within one), a delayed heap (by due time; retries wait there too), the
//! tasks blocked on dependencies, and the task records. A worker takes a task, releases the
//! lock, runs the handler, and locks again to record the outcome. See `src/store/memory/mod.rs`
//! for the wake-up protocol and `src/store/memory/state.rs` for the state machine's invariants.
//!
//! The pool, its handles, a handler's context and the worker loop reach the tasks only through
//! one type-erased trait, `Store` (`src/store/mod.rs`); the embedded store is one implementation
//! of it, in its own folder, and only building a pool names it.

#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations)]
#![warn(unreachable_pub)]

// The layers, from the bottom: each folder's module docs say what it owns and what it may
// import (ARCHITECTURE.md draws the whole).
mod sync;
mod unwind;

mod api;
mod client;
mod gates;
mod model;
mod observe;
mod runtime;
mod store;

pub use api::builder::{Builder, Embedded};
pub use api::pool::Pool;
pub use api::type_options::TypeOptions;
pub use client::context::Context;
pub use client::handle::{Outcome, Resubmitted, TaskHandle};
pub use client::schedule::Schedule;
#[cfg(feature = "postgres")]
pub use client::submit::Receipt;
pub use gates::aging::Aging;
pub use gates::breaker::{Breaker, BreakerState};
pub use gates::limit::RateLimit;
pub use model::cancel::{CancelToken, Cancelled, Interrupt};
pub use model::clock::ManualClock;
pub use model::dead_letter::DeadLetter;
pub use model::error::{
    BuildError, CancelError, ResubmitError, StatsError, SubmitError, SubmitErrorKind, TaskError,
    WaitError,
};
#[cfg(feature = "postgres")]
pub use model::error::{SchemaError, SucceedInError};
pub use model::id::{ParseTaskIdError, TaskId};
pub use model::pause::{DEFAULT_QUEUE, PauseError, PauseTarget, Paused};
pub use model::queue_limit::{QueueLimit, QueueLimitError};
pub use model::retry::{HandlerError, ResultExt, RetryPolicy};
pub use model::schedule::{MAX_CATCH_UP, Missed, ScheduleInfo};
pub use model::state::{CancelOutcome, CancelReason, Failure, FailureReason, TaskState};
pub use model::task::{Dependency, Task, TaskType};
pub use observe::alert::{Alert, AlertScope, AlertValue};
pub use observe::event::Event;
pub use observe::metrics::{Histogram, Metrics, RUN_TIME_BUCKETS, RunCounts, TypeMetrics};
pub use observe::stats::{ShutdownReport, Stats, TaskFilter, TaskInfo, Totals, TypeStats};

pub mod console {
    //! What an operator's console reads and asks of a queue, on either store: a queue's
    //! [`Overview`], a [`TaskPage`] of [`TaskRow`]s for a [`TaskQuery`], one task's
    //! [`TaskDetail`], and the dead letters a [`DeadFilter`] keeps for a bulk retry or purge.
    //! [`Pool`](crate::Pool) answers them for its own store; `postgres::Admin` answers them
    //! for a durable queue without running a pool; the `tasq` command and its dashboard (crate
    //! `tasq-console`) show them.
    pub use crate::observe::console::bulk::{BulkOutcome, DeadFilter, Retried};
    pub use crate::observe::console::overview::{
        BreakerOverview, COUNT_CAP, Minute, Overview, QueueOverview, StateCounts, TypeOverview,
    };
    pub use crate::observe::console::tasks::{
        Moment, Related, SCAN, TaskDetail, TaskPage, TaskQuery, TaskRow,
    };
}

/// The durable store (feature `postgres`): tasks in PostgreSQL, shared by pools in many
/// processes. Build a pool on it with [`Builder::postgres`].
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use crate::store::postgres::{
        Admin, AdminError, Policy, Postgres, SCHEMA_VERSION, migrate, migrate_in, policy,
        policy_in, set_policy, set_policy_in,
    };

    #[doc(hidden)]
    pub use crate::store::postgres::testing;
}

// The README's examples are doctests too.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
