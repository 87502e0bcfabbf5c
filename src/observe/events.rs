//! Where [`Event`]s go: to the hooks set with
//! [`Builder::on_event`](crate::Builder::on_event), on a thread of their own.
//!
//! Hooks are user code, so they never run on a worker or under a lock of the pool: whoever
//! notices an event (a worker ending a task, the monitor, a store) queues it on a channel and
//! goes on, and one dispatcher thread per pool calls the hooks in order, each inside
//! `catch_unwind`. A slow hook delays only the events after it; a hook may call back into the
//! pool (submit, stats, even shutdown). The same thread tells a `tracing` subscriber (feature
//! `tracing`), user code as well. The dispatcher exists only if a hook was set, or once a
//! subscriber wants an event.

use std::fmt;
use std::sync::mpsc;

use crate::model::id::TaskId;
use crate::model::state::{Failure, FailureReason};
use crate::observe::event::Event;
use crate::sync::{self, Arc, AtomicU64, Condvar, Mutex, Ordering};
use crate::unwind;

/// A hook: called with each event, on the dispatcher thread.
pub(crate) type Hook = Box<dyn FnMut(&Event) + Send>;

/// How many dead letters ended for each reason, in [`FailureReason::ALL`] order.
const REASONS: usize = FailureReason::ALL.len();

/// Where the pool's parts send their events: a cheap clone for each part. Also counts the
/// dead letters by reason, hooks or not (for the metrics).
///
/// A `tracing` subscriber is user code like a hook, and whoever notices an event may hold a
/// lock (the embedded store notices a dead letter inside its transition), so events reach the
/// subscriber on the dispatcher thread too. Without hooks that thread starts with the first
/// event a subscriber wants; without either, there is none.
#[derive(Clone)]
pub(crate) struct Events {
    /// Shared by every clone, and only by them: when the last goes, the channel closes and a
    /// dispatcher that was never stopped exits.
    outlet: Arc<Mutex<Outlet>>,
    shared: Arc<Shared>,
}

/// Where events go.
enum Outlet {
    /// No dispatcher yet (no hooks): one starts, named `{0}-events`, for the first event a
    /// `tracing` subscriber wants.
    Idle(String),
    /// The dispatcher runs.
    Open(mpsc::Sender<Message>),
    /// Stopped (or the dispatcher could not start): events are counted, not delivered.
    Closed,
}

enum Message {
    Event(Event),
    /// The pool shut down or was dropped: drop the hooks and exit.
    Stop,
}

/// What the dispatcher shares with the senders.
struct Shared {
    /// Whether hooks were set.
    hooks: bool,
    /// Whether the hooks hear a task's ordinary life (`Builder::lifecycle_events`, and hooks).
    lifecycle: bool,
    /// Events queued for the hooks.
    sent: AtomicU64,
    /// Events the hooks have seen; `flush` waits here.
    delivered: Mutex<u64>,
    cv: Condvar,
    dispatcher: Mutex<Option<sync::ThreadId>>,
    dead_letters: [AtomicU64; REASONS],
}

impl Events {
    /// Events that go nowhere: counted and dropped (the stores' unit tests use it).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn none() -> Self {
        Events::with(Outlet::Closed, false, false)
    }

    fn with(outlet: Outlet, hooks: bool, lifecycle: bool) -> Self {
        Events {
            outlet: Arc::new(Mutex::new(outlet)),
            shared: Arc::new(Shared {
                hooks,
                lifecycle,
                sent: AtomicU64::new(0),
                delivered: Mutex::new(0),
                cv: Condvar::new(),
                dispatcher: Mutex::new(None),
                dead_letters: Default::default(),
            }),
        }
    }

    /// Starts the dispatcher thread for `hooks`; without hooks it waits for a `tracing`
    /// subscriber to want an event.
    pub(crate) fn start(
        hooks: Vec<Hook>,
        lifecycle: bool,
        thread_name: &str,
    ) -> std::io::Result<Self> {
        if hooks.is_empty() {
            return Ok(Events::with(
                Outlet::Idle(thread_name.to_owned()),
                false,
                false,
            ));
        }
        let events = Events::with(Outlet::Closed, true, lifecycle);
        let tx = events.spawn_dispatcher(hooks, thread_name)?;
        *events.outlet.lock() = Outlet::Open(tx);
        Ok(events)
    }

    fn spawn_dispatcher(
        &self,
        hooks: Vec<Hook>,
        thread_name: &str,
    ) -> std::io::Result<mpsc::Sender<Message>> {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::clone(&self.shared);
        let handle = sync::spawn(format!("{thread_name}-events"), None, move || {
            dispatch(&rx, hooks, &shared);
        })?;
        // Before the sender is handed out: the thread cannot exit (and clear this) until then.
        *self.shared.dispatcher.lock() = Some(sync::thread_id(&handle));
        Ok(tx)
    }

    /// Whether anyone listens: a caller may skip building an event's text otherwise.
    pub(crate) fn listening(&self) -> bool {
        self.shared.hooks || crate::observe::trace::enabled()
    }

    /// Queues an event for the hooks and the `tracing` subscriber; the dispatcher delivers it,
    /// since the caller may hold a lock. The only user code here is a subscriber's level check.
    pub(crate) fn emit(&self, event: Event) {
        if !self.listening() {
            return;
        }
        let mut outlet = self.outlet.lock();
        if let Outlet::Idle(thread_name) = &*outlet {
            *outlet = match self.spawn_dispatcher(Vec::new(), thread_name) {
                Ok(tx) => Outlet::Open(tx),
                // No thread for it: the event is lost, not told under the caller's lock.
                Err(_) => Outlet::Closed,
            };
        }
        if let Outlet::Open(tx) = &*outlet {
            self.shared.sent.fetch_add(1, Ordering::SeqCst);
            if tx.send(Message::Event(event)).is_err() {
                // The dispatcher has stopped: nobody will deliver it.
                self.shared.sent.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// A task ended failed.
    /// Tells the hooks of a task's ordinary life, if the pool was built to
    /// ([`Builder::lifecycle_events`](crate::Builder::lifecycle_events)) and has hooks; else
    /// `make` is never called: one `bool` check. Callers may hold a store's lock: nothing here
    /// runs user code (the dispatcher's thread does).
    #[inline]
    pub(crate) fn lifecycle(&self, make: impl FnOnce() -> Event) {
        if self.shared.lifecycle {
            self.emit(make());
        }
    }

    pub(crate) fn dead_letter(&self, id: TaskId, task_type: &'static str, failure: &Failure) {
        self.shared.dead_letters[failure.reason.index()].fetch_add(1, Ordering::Relaxed);
        if self.listening() {
            self.emit(Event::DeadLetter {
                id,
                task_type,
                reason: failure.reason,
                attempts: failure.attempts,
                error: failure.error.clone(),
            });
        }
    }

    /// Dead letters so far, by reason.
    pub(crate) fn dead_letters_by_reason(&self) -> Vec<(FailureReason, u64)> {
        FailureReason::ALL
            .iter()
            .map(|&reason| {
                let n = self.shared.dead_letters[reason.index()].load(Ordering::Relaxed);
                (reason, n)
            })
            .collect()
    }

    /// Waits until the hooks have seen every event queued so far, unless called from a hook
    /// (which would wait for itself). Also after [`stop`](Events::stop): the dispatcher
    /// delivers what was queued before it.
    pub(crate) fn flush(&self) {
        if self.on_dispatcher() {
            return;
        }
        let target = self.shared.sent.load(Ordering::SeqCst);
        let mut delivered = self.shared.delivered.lock();
        while *delivered < target && self.shared.dispatcher.lock().is_some() {
            self.shared.cv.wait(&mut delivered);
        }
    }

    /// Stops the dispatcher after the events queued so far: it drops the hooks and exits.
    /// Events after this are counted, not delivered.
    pub(crate) fn stop(&self) {
        let mut outlet = self.outlet.lock();
        if let Outlet::Open(tx) = &*outlet {
            let _ = tx.send(Message::Stop);
        }
        *outlet = Outlet::Closed;
    }

    fn on_dispatcher(&self) -> bool {
        *self.shared.dispatcher.lock() == Some(sync::current_thread_id())
    }
}

/// The dispatcher thread: tells the `tracing` subscriber and every hook of every event, in
/// order, until stopped or until every sender is gone.
fn dispatch(rx: &mpsc::Receiver<Message>, mut hooks: Vec<Hook>, shared: &Shared) {
    let _exit = DispatcherExit(shared);
    while let Ok(Message::Event(event)) = rx.recv() {
        // The subscriber is user code too.
        let _ = unwind::catch(|| crate::observe::trace::event(&event));
        for hook in &mut hooks {
            // A hook's panic is its own: the others still hear of the event, and later events
            // still come.
            let _ = unwind::catch(|| hook(&event));
        }
        unwind::drop_quietly(event);
        let mut delivered = shared.delivered.lock();
        *delivered += 1;
        shared.cv.notify_all();
    }
    // The hooks are user closures; so are their captures' `Drop`s.
    for hook in hooks {
        unwind::drop_quietly(hook);
    }
}

/// Marks the dispatcher gone however its thread ends (a panic there would be the engine's
/// bug): waiters in `flush` stop waiting for events nobody will deliver.
struct DispatcherExit<'a>(&'a Shared);

impl Drop for DispatcherExit<'_> {
    fn drop(&mut self) {
        let _delivered = self.0.delivered.lock();
        *self.0.dispatcher.lock() = None;
        self.0.cv.notify_all();
    }
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events")
            .field("hooks", &self.shared.hooks)
            .field("sent", &self.shared.sent.load(Ordering::Relaxed))
            .finish()
    }
}
