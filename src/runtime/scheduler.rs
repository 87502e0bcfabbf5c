//! The scheduler: the thread that ticks a pool's periodic tasks, the same for every store.
//!
//! One thread, started only if the pool has schedules. Each round it ticks every schedule
//! through the store (which decides the due slots from its watermark and its own clock, and
//! submits them: see `store/schedule.rs`), then sleeps until the earliest next slot any tick
//! reported, on the pool's clock (a manual clock's advance wakes it). A paused schedule, or a
//! store that could not be reached, shortens the sleep to [`POLL`]: a resume in another process,
//! or the database's return, sends this thread no signal. A resume in this pool wakes it at once
//! ([`kick`](Scheduler::kick)). The store's clock and this thread's may disagree (the durable
//! store's is the database's): the sleep is the tick's own distance to the next slot, and a
//! thread that wakes early only finds nothing due yet.

use std::fmt;
use std::time::Duration;

use crate::model::clock::{Clock, Wake};
use crate::store::Store;
use crate::store::schedule::ScheduleDef;
use crate::sync::{self, Arc, Condvar, JoinHandle, Mutex, Weak};

/// The longest sleep while a schedule is paused or the store is away.
pub(crate) const POLL: Duration = Duration::from_secs(1);

/// See the module docs.
pub(crate) struct Scheduler {
    defs: Vec<ScheduleDef>,
    clock: Clock,
    state: Mutex<State>,
    cv: Condvar,
    thread: Mutex<Option<JoinHandle>>,
}

#[derive(Default)]
struct State {
    stopped: bool,
    /// Tick again at once (a resume in this pool).
    kicked: bool,
}

impl Scheduler {
    /// Starts the thread that ticks `defs` on `store`; `None` without schedules.
    pub(crate) fn start(
        store: Weak<dyn Store>,
        defs: Vec<ScheduleDef>,
        clock: Clock,
        thread_name: &str,
    ) -> std::io::Result<Option<Arc<Scheduler>>> {
        if defs.is_empty() {
            return Ok(None);
        }
        let scheduler = Arc::new(Scheduler {
            defs,
            clock,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            thread: Mutex::new(None),
        });
        let sleeper: Weak<Scheduler> = Arc::downgrade(&scheduler);
        scheduler.clock.register(sleeper);
        let running = Arc::clone(&scheduler);
        let handle = sync::spawn(format!("{thread_name}-scheduler"), None, move || {
            running.run(&store);
        })?;
        *scheduler.thread.lock() = Some(handle);
        Ok(Some(scheduler))
    }

    /// Ticks every schedule again at once.
    pub(crate) fn kick(&self) {
        self.state.lock().kicked = true;
        self.cv.notify_all();
    }

    /// Stops the thread (it exits after the tick in progress) without waiting for it.
    pub(crate) fn stop(&self) {
        self.state.lock().stopped = true;
        self.cv.notify_all();
    }

    /// Stops the thread and waits for it, unless the caller is that thread (a payload function
    /// that shuts the pool down).
    pub(crate) fn stop_and_join(&self) {
        self.stop();
        let handle = self.thread.lock().take();
        if let Some(handle) = handle {
            if sync::thread_id(&handle) == sync::current_thread_id() {
                return;
            }
            // Payload functions run inside `catch_unwind`: the thread does not panic.
            let _ = handle.join();
        }
    }

    /// The thread's body: see the module docs.
    fn run(&self, store: &Weak<dyn Store>) {
        loop {
            if self.state.lock().stopped {
                return;
            }
            // Read before the ticks: a manual clock moved while they ran must not push the
            // deadline out (a wake-up that comes early finds nothing due and sleeps again).
            let before = self.clock.now();
            let Some(sleep) = self.round(store) else {
                return;
            };
            let deadline = before.checked_add(sleep);
            let mut state = self.state.lock();
            loop {
                if state.stopped {
                    return;
                }
                if state.kicked {
                    state.kicked = false;
                    break;
                }
                if deadline.is_some_and(|at| self.clock.now() >= at) {
                    break;
                }
                self.clock.wait_until(&self.cv, &mut state, deadline);
            }
        }
    }

    /// Ticks every schedule once; how long to sleep after (`None`: the store is gone or closed).
    fn round(&self, store: &Weak<dyn Store>) -> Option<Duration> {
        let store = store.upgrade()?;
        if store.is_closed() {
            return None;
        }
        let mut sleep: Option<Duration> = None;
        let mut poll = false;
        for def in &self.defs {
            match store.tick_schedule(def) {
                Ok(tick) => {
                    poll |= tick.paused;
                    if let Some(next) = tick.next {
                        let wait = next.duration_since(tick.now).unwrap_or_default();
                        sleep = Some(sleep.map_or(wait, |s| s.min(wait)));
                    }
                }
                Err(_) => poll = true,
            }
        }
        drop(store);
        if poll {
            sleep = Some(sleep.map_or(POLL, |s| s.min(POLL)));
        }
        // No slot left in any schedule: sleep until stopped (a day at a time).
        Some(sleep.unwrap_or(Duration::from_secs(86_400)))
    }
}

impl Wake for Scheduler {
    fn wake(&self) {
        let _state = self.state.lock();
        self.cv.notify_all();
    }
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("schedules", &self.defs)
            .finish_non_exhaustive()
    }
}
