//! Helpers shared by the priority, lifecycle, retry, dead letter, bad input, idempotency and
//! retention tests: gates that hold a worker, probes that tell when a worker is idle, hang guards.

// Each test binary uses only some of these helpers.
#![allow(dead_code)]

use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use tasq::{Context, HandlerError, Outcome, Pool, TaskHandle, TaskType};

/// How long a test waits for something that should happen at once before it fails instead of
/// hanging. Never slept: only a bound on waits for signals.
pub const HANG_GUARD: Duration = Duration::from_secs(10);

/// A task that holds its worker until the test opens it: its handler says when it has started,
/// then blocks until [`Gate::open`] (or until the [`Gate`] is dropped).
pub const GATE: TaskType<GateTask, ()> = TaskType::new("gate");

/// The handler of [`GATE`].
pub fn gate_handler(_: &Context, task: &GateTask) -> Result<(), HandlerError> {
    // The test may have stopped listening (it failed): nothing to do about it here.
    let _ = task.started.send(());
    // `Err` means the gate was dropped, which opens it too.
    let _ = task.open.recv();
    Ok(())
}

/// The payload of a [`GATE`] task.
#[derive(Debug)]
pub struct GateTask {
    started: Sender<()>,
    open: Receiver<()>,
}

/// The test's side of a gate.
#[derive(Debug)]
pub struct Gate {
    started: Receiver<()>,
    open: Sender<()>,
}

/// A new gate: the test keeps the [`Gate`], the [`GateTask`] is the payload of a [`GATE`] task.
pub fn gate() -> (Gate, GateTask) {
    let (started_tx, started_rx) = crossbeam_channel::bounded(1);
    let (open_tx, open_rx) = crossbeam_channel::bounded(1);
    (
        Gate {
            started: started_rx,
            open: open_tx,
        },
        GateTask {
            started: started_tx,
            open: open_rx,
        },
    )
}

impl Gate {
    /// Blocks until the gate's handler runs (so it holds a worker).
    pub fn wait_started(&self) {
        self.started
            .recv_timeout(HANG_GUARD)
            .expect("the gate task never started");
    }

    /// Lets the gate's handler return.
    pub fn open(self) {
        // The handler may be gone if the pool was stopped; dropping the sender opens it anyway.
        let _ = self.open.send(());
    }
}

/// A task that does nothing. With one worker, once a probe submitted after some event has
/// finished, the worker has also finished whatever it was doing at that event (the outcome of the
/// handler it was running is recorded, and due tasks were promoted before the probe was claimed).
pub const PROBE: TaskType<(), ()> = TaskType::new("probe");

/// The handler of [`PROBE`].
pub fn probe_handler(_: &Context, _: &()) -> Result<(), HandlerError> {
    Ok(())
}

/// Submits a [`PROBE`] and waits for it: see [`PROBE`] for what that proves.
pub fn settle(pool: &Pool) {
    let probe = pool.submit(PROBE.task(())).expect("submit a probe");
    assert!(finish(&probe).is_succeeded(), "the probe did not succeed");
}

/// Waits for a task's outcome, failing the test instead of hanging.
pub fn finish<O: Clone + 'static>(handle: &TaskHandle<O>) -> Outcome<O> {
    handle
        .wait_timeout(HANG_GUARD)
        .unwrap_or_else(|| panic!("{} did not finish", handle.id()))
}
