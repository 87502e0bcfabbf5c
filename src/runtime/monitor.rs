//! The monitor: what watches over a pool from above its store, the same for every store.
//!
//! It holds the pool's [`Events`] and [`RunMetrics`], times the runs of task types with a
//! timeout, and checks the backlog alerts. One thread, started only if some type has a
//! timeout or an alert is set, sleeps until the earliest of: a run's timeout (it fires the
//! run's token), a timed-out run's grace end (it reports the run stuck), and the next alert
//! check. Workers tell it when a timed run begins and ends; a run that begins wakes it only to
//! shorten its sleep. Like every wait in the crate, the thread's sleep loops on its condition,
//! on the pool's clock (a manual clock's advance wakes it).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use crate::model::cancel::CancelToken;
use crate::model::clock::{Clock, Wake};
use crate::model::id::TaskId;
use crate::observe::alert::{Alert, Alerts};
use crate::observe::event::Event;
use crate::observe::events::{Events, Hook};
use crate::observe::metrics::RunMetrics;
use crate::observe::trace;
use crate::store::Store;
use crate::store::registry::Registry;
use crate::sync::{self, Arc, Condvar, JoinHandle, Mutex, Weak};

/// The monitor's settings, checked by the builder.
pub(crate) struct Watch {
    pub(crate) hooks: Vec<Hook>,
    pub(crate) lifecycle: bool,
    pub(crate) alerts: Vec<Alert>,
    pub(crate) stuck_after: Duration,
    pub(crate) interval: Duration,
}

/// See the module docs.
pub(crate) struct Monitor {
    pub(crate) events: Events,
    pub(crate) runs: RunMetrics,
    clock: Clock,
    stuck_after: Duration,
    interval: Duration,
    state: Mutex<State>,
    cv: Condvar,
    thread: Mutex<Option<JoinHandle>>,
    /// A monitor with no work when the pool started (no type with a timeout, no alert): what
    /// its thread needs, to start it when a task with a timeout of its own first runs.
    idle: Mutex<Option<(Weak<dyn Store>, String)>>,
}

/// The timed runs, under the monitor's lock.
#[derive(Default)]
struct State {
    runs: HashMap<u64, Timed>,
    /// When each timed run next needs a look: its timeout, then its grace's end. A min-heap
    /// (`Reverse`); entries of runs that ended are skipped when popped.
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    next_key: u64,
    /// Timed runs reported stuck that have not returned.
    stuck: usize,
    stopped: bool,
}

/// One run of a type with a timeout.
struct Timed {
    id: TaskId,
    task_type: &'static str,
    attempt: u32,
    token: CancelToken,
    started: Instant,
    timeout: Duration,
    fired: bool,
    stuck: bool,
}

/// A timed run, from [`Monitor::begin`]: give it back to [`Monitor::end`].
#[derive(Debug)]
pub(crate) struct RunKey(u64);

impl Monitor {
    /// Starts the event dispatcher (if there are hooks); the monitor's own thread starts with
    /// [`start`](Monitor::start), once the store exists.
    pub(crate) fn new(
        watch: &mut Watch,
        registry: &Registry,
        workers: usize,
        clock: Clock,
        thread_name: &str,
    ) -> std::io::Result<Arc<Monitor>> {
        let events = Events::start(
            std::mem::take(&mut watch.hooks),
            watch.lifecycle,
            thread_name,
        )?;
        let monitor = Arc::new(Monitor {
            events,
            runs: RunMetrics::new(registry.entries().len(), workers),
            clock,
            stuck_after: watch.stuck_after,
            interval: watch.interval,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            thread: Mutex::new(None),
            idle: Mutex::new(None),
        });
        let sleeper: Weak<Monitor> = Arc::downgrade(&monitor);
        monitor.clock.register(sleeper);
        Ok(monitor)
    }

    /// Starts the monitor's thread if it has work: a type with a timeout, or an alert.
    pub(crate) fn start(
        self: &Arc<Self>,
        store: Weak<dyn Store>,
        alerts: Vec<Alert>,
        timed: bool,
        thread_name: &str,
    ) -> std::io::Result<()> {
        if !timed && alerts.is_empty() {
            *self.idle.lock() = Some((store, thread_name.to_owned()));
            return Ok(());
        }
        self.spawn(store, alerts, thread_name)
    }

    /// Starts the thread of a monitor that had no work when the pool started: a task with a
    /// timeout of its own runs. If the thread cannot be started, a run past its timeout still
    /// counts as timed out when it returns (see [`end`](Monitor::end)); only its token does not
    /// fire.
    fn wake_idle(self: &Arc<Self>) {
        let Some((store, name)) = self.idle.lock().take() else {
            return;
        };
        let _ = self.spawn(store, Vec::new(), &name);
    }

    fn spawn(
        self: &Arc<Self>,
        store: Weak<dyn Store>,
        alerts: Vec<Alert>,
        thread_name: &str,
    ) -> std::io::Result<()> {
        let monitor = Arc::clone(self);
        let alerts = Alerts::new(alerts);
        // The first check is an interval after the build, on the building thread's reading of
        // the clock: read on the new thread, a manual clock could already have moved.
        let first_check = if alerts.is_empty() {
            None
        } else {
            self.clock.now().checked_add(self.interval)
        };
        let handle = sync::spawn(format!("{thread_name}-monitor"), None, move || {
            monitor.run(&store, alerts, first_check);
        })?;
        *self.thread.lock() = Some(handle);
        Ok(())
    }

    /// A run of a type with a timeout begins: its token fires `timeout` from now.
    pub(crate) fn begin(
        self: &Arc<Self>,
        id: TaskId,
        task_type: &'static str,
        attempt: u32,
        token: &CancelToken,
        timeout: Duration,
    ) -> RunKey {
        if self.thread.lock().is_none() {
            self.wake_idle();
        }
        let started = self.clock.now();
        let at = started.checked_add(timeout).unwrap_or(started);
        let mut state = self.state.lock();
        let key = state.next_key;
        state.next_key += 1;
        state.runs.insert(
            key,
            Timed {
                id,
                task_type,
                attempt,
                token: token.clone(),
                started,
                timeout,
                fired: false,
                stuck: false,
            },
        );
        let earliest = state
            .due
            .peek()
            .is_none_or(|Reverse((first, _))| at < *first);
        state.due.push(Reverse((at, key)));
        if earliest {
            self.cv.notify_all();
        }
        RunKey(key)
    }

    /// A timed run returned; whether it timed out: its token fired, or it returned at or past
    /// its timeout before this thread got to fire it (a late wake-up, a busy machine, a manual
    /// clock moved past the timeout while the handler ran). How long a run took decides, not
    /// when this thread woke.
    pub(crate) fn end(&self, key: RunKey) -> bool {
        let now = self.clock.now();
        let mut state = self.state.lock();
        match state.runs.remove(&key.0) {
            Some(run) => {
                if run.stuck {
                    state.stuck -= 1;
                }
                run.fired || now.saturating_duration_since(run.started) >= run.timeout
            }
            None => false,
        }
    }

    /// Runs reported stuck that have not returned.
    pub(crate) fn stuck(&self) -> usize {
        self.state.lock().stuck
    }

    /// Stops the thread (it exits at its next look) without waiting for it.
    pub(crate) fn stop(&self) {
        self.state.lock().stopped = true;
        self.cv.notify_all();
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop_and_join(&self) {
        self.stop();
        let handle = self.thread.lock().take();
        if let Some(handle) = handle {
            // The thread runs no user code: it does not panic.
            let _ = handle.join();
        }
    }

    /// The thread's body: see the module docs.
    fn run(&self, store: &Weak<dyn Store>, mut alerts: Alerts, first_check: Option<Instant>) {
        let mut next_check = first_check;
        let mut events = Vec::new();
        let mut fired = Vec::new();
        loop {
            {
                let mut state = self.state.lock();
                loop {
                    if state.stopped {
                        return;
                    }
                    let now = self.clock.now();
                    let next_due = state.fire_due(now, self.stuck_after, &mut fired, &mut events);
                    if !events.is_empty()
                        || !fired.is_empty()
                        || next_check.is_some_and(|at| now >= at)
                    {
                        break;
                    }
                    let deadline = match (next_due, next_check) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    self.clock.wait_until(&self.cv, &mut state, deadline);
                }
            }
            // A `tracing` subscriber is user code: told outside the lock (it may call
            // `Pool::stats`, which takes it).
            for (id, timeout) in fired.drain(..) {
                trace::timed_out(id, timeout);
            }
            for event in events.drain(..) {
                self.events.emit(event);
            }
            let now = self.clock.now();
            if next_check.is_some_and(|at| now >= at) {
                let Some(store) = store.upgrade() else {
                    return;
                };
                // Unread (the database away): no alert changes until the next check.
                let backlog = store.backlog(alerts.need_types());
                drop(store);
                if let Some((stats, types)) = backlog {
                    for (alert, value, raised) in alerts.check(&stats, &types) {
                        self.events.emit(if raised {
                            Event::AlertRaised { alert, value }
                        } else {
                            Event::AlertCleared { alert, value }
                        });
                    }
                }
                next_check = now.checked_add(self.interval);
            }
        }
    }
}

impl State {
    /// Fires the tokens of runs past their timeout (listed in `fired`, to trace once the lock
    /// is released) and reports those past their grace as stuck; returns when the next run
    /// needs a look.
    fn fire_due(
        &mut self,
        now: Instant,
        stuck_after: Duration,
        fired: &mut Vec<(TaskId, Duration)>,
        events: &mut Vec<Event>,
    ) -> Option<Instant> {
        while let Some(&Reverse((at, key))) = self.due.peek() {
            if at > now {
                return Some(at);
            }
            self.due.pop();
            let Some(run) = self.runs.get_mut(&key) else {
                continue; // the run ended
            };
            if !run.fired {
                run.fired = true;
                run.token.fire(crate::model::cancel::Interrupt::TimedOut);
                fired.push((run.id, run.timeout));
                let grace_end = run
                    .started
                    .checked_add(run.timeout.saturating_add(stuck_after))
                    .unwrap_or(at);
                self.due.push(Reverse((grace_end, key)));
            } else if !run.stuck {
                run.stuck = true;
                self.stuck += 1;
                events.push(Event::Stuck {
                    id: run.id,
                    task_type: run.task_type,
                    attempt: run.attempt,
                    running_for: now.saturating_duration_since(run.started),
                });
            }
        }
        None
    }
}

impl Wake for Monitor {
    fn wake(&self) {
        let _state = self.state.lock();
        self.cv.notify_all();
    }
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor")
            .field("events", &self.events)
            .field("stuck_after", &self.stuck_after)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}
