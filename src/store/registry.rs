//! The registry: what the pool and its store know of each task type (its name, payload and output
//! types, settings, gates and codec), fixed when the pool is built and read without locks
//! afterwards. The handlers that run the types are the workers' (`handlers.rs`).

use std::any::TypeId;
use std::collections::HashMap;
use std::fmt;

use std::time::Duration;

use crate::gates::aging::Aging;
use crate::gates::breaker::Breaker;
use crate::gates::limit::RateLimit;
use crate::model::error::{BuildError, SubmitErrorKind};
use crate::model::retry::RetryPolicy;
use crate::model::task::TaskType;

/// A task's own settings: fixed when it is submitted (from its type's declaration in the
/// submitting pool, or the task's own [`Task`](crate::Task) setters), kept with the task, and
/// obeyed by every path that runs or ends it, whichever pool or process that is: the claim,
/// the handler's retry, its context, a timeout, the reaper, and a resubmit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// How many runs the task may start, the first included (at least 1).
    pub(crate) max_attempts: u32,
    pub(crate) retry: RetryPolicy,
    /// Each run's token fires this long after it starts.
    pub(crate) timeout: Option<Duration>,
}

impl Settings {
    /// The settings of a type this pool does not know, for a row that leaves some unset: as a
    /// declared type's with no options.
    #[cfg(feature = "postgres")]
    pub(crate) fn unknown_type() -> Settings {
        Settings {
            max_attempts: 0,
            retry: RetryPolicy::default(),
            timeout: None,
        }
    }
}

/// One registered task type.
pub(crate) struct Entry {
    pub(crate) name: &'static str,
    pub(crate) payload: TypeId,
    pub(crate) output: TypeId,
    /// Whether this pool has a handler for the type: `false` if declared without one
    /// ([`Builder::declare`](crate::Builder::declare)): a pool may submit its tasks, and
    /// never runs them.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) runs_here: bool,
    pub(crate) max_attempts: u32,
    pub(crate) retry: RetryPolicy,
    /// Each run's token fires this long after it starts (see `TypeOptions::timeout`).
    pub(crate) timeout: Option<Duration>,
    /// The downstream this type calls: an index into [`Registry::downstreams`].
    pub(crate) downstream: Option<u32>,
    /// At most this many of the type's tasks run at once.
    pub(crate) concurrency: Option<u32>,
    /// At most this many of the type's tasks start per second.
    pub(crate) rate: Option<RateLimit>,
    /// The queue the type belongs to.
    pub(crate) queue: &'static str,
    /// The lane of this pool's workers that runs the type (an index into [`Registry::lanes`]),
    /// if the pool gives some queue workers of its own; `None` if every worker serves every
    /// queue.
    pub(crate) lane: Option<u32>,
    /// How a durable store turns the payload and output into JSON and back.
    #[cfg(feature = "postgres")]
    pub(crate) codec: Option<crate::model::codec::Codec>,
}

impl Entry {
    /// The settings a task of this type gets unless it sets its own.
    pub(crate) fn settings(&self) -> Settings {
        Settings {
            max_attempts: self.max_attempts,
            retry: self.retry,
            timeout: self.timeout,
        }
    }

    /// The settings of a task of this type submitted with `own`: its own where it has them, the
    /// type's elsewhere; or why its own are refused.
    pub(crate) fn settings_for(
        &self,
        own: &crate::model::task::Own,
    ) -> Result<Settings, SubmitErrorKind> {
        let invalid = |setting, problem| SubmitErrorKind::InvalidSetting { setting, problem };
        let too_long = "is too long to add to the current time";
        let mut settings = self.settings();
        if let Some(attempts) = own.max_attempts {
            if attempts == 0 {
                return Err(invalid("max_attempts", "is zero"));
            }
            settings.max_attempts = attempts;
        }
        if let Some(retry) = own.retry {
            if std::time::Instant::now().checked_add(retry.cap()).is_none() {
                return Err(invalid("retry cap", too_long));
            }
            settings.retry = retry;
        }
        if let Some(timeout) = own.timeout {
            if timeout.is_zero() {
                return Err(invalid("timeout", "is zero"));
            }
            // Twice: a stuck report comes later still.
            if std::time::Instant::now()
                .checked_add(timeout.saturating_mul(2))
                .is_none()
            {
                return Err(invalid("timeout", too_long));
            }
            settings.timeout = Some(timeout);
        }
        Ok(settings)
    }

    /// Whether a limit or a breaker may hold this type's tasks back.
    pub(crate) fn is_gated(&self) -> bool {
        self.concurrency.is_some() || self.rate.is_some() || self.downstream.is_some()
    }

    /// The entry of `ty`, run here if `runs_here`; its attempts and retry policy are filled in
    /// when the pool is built, from the type's options or the pool's defaults.
    pub(crate) fn new<P: 'static, O: 'static>(ty: TaskType<P, O>, runs_here: bool) -> Entry {
        Entry {
            name: ty.name(),
            payload: TypeId::of::<P>(),
            output: TypeId::of::<O>(),
            runs_here,
            max_attempts: 0,
            retry: RetryPolicy::default(),
            timeout: None,
            downstream: None,
            concurrency: None,
            rate: None,
            queue: crate::model::pause::DEFAULT_QUEUE,
            lane: None,
            #[cfg(feature = "postgres")]
            codec: None,
        }
    }
}

/// Every registered task type, indexed by the position the engine stores in each task record.
/// Immutable once the pool is built, so workers read it without a lock.
#[derive(Default)]
pub(crate) struct Registry {
    entries: Vec<Entry>,
    by_name: HashMap<&'static str, u32>,
    /// The downstreams with circuit breakers, by the index an [`Entry`] names.
    pub(crate) downstreams: Vec<(&'static str, Breaker)>,
    /// How ready tasks age, if they do.
    pub(crate) aging: Option<Aging>,
    /// The pool's lanes of workers, if it gives some queue workers of its own
    /// ([`Builder::queue`](crate::Builder::queue)); empty if every worker serves every queue.
    pub(crate) lanes: Vec<Lane>,
    /// The pool's handlers (`handlers.rs`), opaque here: the registry never runs them, it only
    /// keeps them alive as long as itself, so that a handler's captures go when the store
    /// goes, once the pool's last thread and handle have let go of it.
    pub(crate) keep_alive: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

impl Registry {
    /// Adds an entry; `Err(name)` if the name is taken.
    pub(crate) fn insert(&mut self, entry: Entry) -> Result<(), &'static str> {
        let name = entry.name;
        if self.by_name.contains_key(name) {
            return Err(name);
        }
        let index = u32::try_from(self.entries.len()).expect("fewer than 2^32 task types");
        self.by_name.insert(name, index);
        self.entries.push(entry);
        Ok(())
    }

    /// The index of the type named `name`. Names usually come from the same `&'static str` the
    /// type was registered with, so a scan comparing addresses first beats hashing the name
    /// while there are few types.
    pub(crate) fn index_of(&self, name: &str) -> Option<u32> {
        if self.entries.len() > 16 {
            return self.by_name.get(name).copied();
        }
        let same = |e: &Entry| std::ptr::eq(e.name, name) || e.name == name;
        self.entries.iter().position(same).map(|i| i as u32)
    }

    /// The index of `ty`, checking its payload and output types.
    pub(crate) fn type_index<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
    ) -> Result<u32, SubmitErrorKind> {
        let index = self
            .index_of(ty.name())
            .ok_or(SubmitErrorKind::UnknownType(ty.name()))?;
        let entry = self.entry(index);
        if entry.payload != TypeId::of::<P>() || entry.output != TypeId::of::<O>() {
            return Err(SubmitErrorKind::TypeMismatch(ty.name()));
        }
        Ok(index)
    }

    /// How many types are registered.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn len(&self) -> u32 {
        self.entries.len() as u32
    }

    pub(crate) fn entry(&self, index: u32) -> &Entry {
        &self.entries[index as usize]
    }

    /// Every entry, by index.
    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Sorts the types into lanes of workers, given the shared workers and each named queue's
    /// ([`Builder::queue`](crate::Builder::queue)); nothing if no queue is named. Returns the
    /// pool's threads (their sum, saturating).
    pub(crate) fn set_lanes(
        &mut self,
        shared: usize,
        queues: &[(&'static str, usize)],
    ) -> Result<usize, BuildError> {
        if queues.is_empty() {
            return Ok(shared);
        }
        let mut lanes = vec![Lane {
            queues: Vec::new(),
            workers: worker_count(shared),
        }];
        let mut total = shared;
        for &(name, workers) in queues {
            if let Err(problem) = crate::model::pause::check_queue_name(name) {
                return Err(invalid("a queue name", name, problem));
            }
            if workers == 0 {
                return Err(invalid("a queue's workers", name, "are zero"));
            }
            if lanes.iter().any(|lane| lane.queues.contains(&name)) {
                return Err(invalid("a queue's workers", name, "are set twice"));
            }
            total = total.saturating_add(workers);
            lanes.push(Lane {
                queues: vec![name],
                workers: worker_count(workers),
            });
        }
        for entry in &mut self.entries {
            let lane = lanes
                .iter()
                .position(|lane| lane.queues.contains(&entry.queue))
                .unwrap_or(0);
            if lane == 0 {
                if entry.runs_here && shared == 0 {
                    return Err(invalid(
                        "a type's queue",
                        entry.name,
                        "has no worker in this pool: name it in Builder::queue, or give the \
                         pool shared workers",
                    ));
                }
                if !lanes[0].queues.contains(&entry.queue) {
                    lanes[0].queues.push(entry.queue);
                }
            }
            entry.lane = Some(lane as u32);
        }
        self.lanes = lanes;
        Ok(total)
    }

    /// Whether some type's tasks may be held back before they start: a limit or a breaker.
    pub(crate) fn has_gates(&self) -> bool {
        self.entries.iter().any(Entry::is_gated)
    }
}

/// A lane of a pool's workers: the threads that serve some queues, and no others. Lane 0 is
/// the shared one (`Builder::workers`): every queue the pool does not name in
/// `Builder::queue`; each named queue has a lane of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lane {
    /// The queues the lane serves, by name; for the shared lane, those of the pool's types
    /// that have no lane of their own.
    pub(crate) queues: Vec<&'static str>,
    /// Its threads: at most this many of its tasks run at once in the pool.
    pub(crate) workers: u32,
}

fn invalid(setting: &'static str, of: &'static str, problem: &'static str) -> BuildError {
    BuildError::InvalidSetting {
        setting,
        of,
        problem,
    }
}

/// A count of workers as a lane keeps it (the pool's total is checked by its builder).
fn worker_count(workers: usize) -> u32 {
    u32::try_from(workers).unwrap_or(u32::MAX)
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| e.name))
            .finish()
    }
}
