//! A worker thread's loop: claim a task, run its handler (never under the lock), classify the
//! result, complete the task. And the supervision that keeps a worker alive whatever happens.

use std::cell::Cell;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::client::context::Context;
use crate::client::current::Running;
use crate::model::id::TaskId;
use crate::model::state::{Failure, FailureReason};
use crate::observe::event::Event;
use crate::observe::metrics::RunEnd;
use crate::observe::trace;
use crate::runtime::handlers::{ErasedHandler, Handlers};
use crate::runtime::monitor::Monitor;
use crate::store::registry::{Entry, Settings};
use crate::store::{Claim, RunOutcome, Store};
use crate::sync::{self, Arc, JoinHandle};
use crate::unwind;

/// How the worker threads are started.
pub(crate) struct Threads {
    pub(crate) count: usize,
    /// Thread `i` is named `{name}-{i}`.
    pub(crate) name: String,
    pub(crate) stack_size: Option<usize>,
    /// Caught panics do not print (see `Builder::quiet_panics`).
    pub(crate) quiet_panics: bool,
    /// Seeds the workers' random sources (retry jitter), for deterministic tests.
    pub(crate) seed: Option<u64>,
    /// Run on each worker thread before its first claim (see `Builder::on_worker_start`).
    pub(crate) start_hook: Option<WorkerHook>,
    /// Run on each worker thread after its last task (see `Builder::on_worker_exit`).
    pub(crate) exit_hook: Option<WorkerHook>,
    /// What the workers run, by type index.
    pub(crate) handlers: std::sync::Arc<Handlers>,
}

/// A hook run on each worker thread with its index: user code.
pub(crate) type WorkerHook = std::sync::Arc<dyn Fn(usize) + Send + Sync>;

/// Starts the worker threads on `store`. If one cannot be started, the store is stopped, the
/// threads already started are joined, and the error returned.
pub(crate) fn spawn<S: Store + 'static>(
    store: &Arc<S>,
    monitor: &Arc<Monitor>,
    threads: &Threads,
) -> std::io::Result<Vec<JoinHandle>> {
    let mut handles = Vec::with_capacity(threads.count);
    for index in 0..threads.count {
        let worker_store = Arc::clone(store);
        let monitor = Arc::clone(monitor);
        let handlers = std::sync::Arc::clone(&threads.handlers);
        let name = format!("{}-{index}", threads.name);
        let quiet = threads.quiet_panics;
        let seed = threads.seed;
        let (start_hook, exit_hook) = (threads.start_hook.clone(), threads.exit_hook.clone());
        let spawned = sync::spawn(name, threads.stack_size, move || {
            if quiet {
                unwind::quiet_this_thread();
            }
            // Dropped last: the store counts the worker out after its exit hook returned.
            let _exit = ExitGuard(&*worker_store);
            run_hook(start_hook, index);
            let mut rng = rng(seed, index);
            supervise(&worker_store, &monitor, &handlers, index, &mut rng);
            run_hook(exit_hook, index);
        });
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(error) => {
                // Account for the workers that will never start, then stop the others.
                for _ in index..threads.count {
                    store.worker_exited();
                }
                store.stop_now();
                for handle in handles {
                    let _ = handle.join();
                }
                return Err(error);
            }
        }
    }
    Ok(handles)
}

/// Runs a worker hook (user code) on this worker's thread, with no lock held, inside
/// `catch_unwind`: a hook that panics is reported by the panic hook and otherwise ignored (the
/// worker goes on as if it had returned). This thread's reference to the hook is dropped there
/// too.
fn run_hook(hook: Option<WorkerHook>, index: usize) {
    if let Some(hook) = hook {
        let _ = unwind::catch(|| hook(index));
        unwind::drop_quietly(hook);
    }
}

/// The random source of worker `index`: seeded for deterministic tests, else from the OS.
fn rng(seed: Option<u64>, index: usize) -> SmallRng {
    match seed {
        Some(seed) => SmallRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9)),
        None => SmallRng::from_os_rng(),
    }
}

/// Tells the store a worker's loop ended, however it ended.
struct ExitGuard<'a, S: Store>(&'a S);

impl<S: Store> Drop for ExitGuard<'_, S> {
    fn drop(&mut self) {
        self.0.worker_exited();
    }
}

/// A worker thread's body: runs tasks until the pool says to stop.
///
/// User code cannot unwind out of [`run`]: every piece of it runs inside `catch_unwind`. A panic
/// that still escapes is the engine's own bug; the worker does not die of it: the task it held
/// ends failed (so every wait on it returns), the pool counts the panic in
/// [`Totals::worker_panics`](crate::Totals::worker_panics), and the worker starts its loop again.
fn supervise<S: Store + 'static, R: Rng>(
    store: &Arc<S>,
    monitor: &Arc<Monitor>,
    handlers: &Handlers,
    index: usize,
    rng: &mut R,
) {
    // What a handler's context reaches its pool through.
    let pool: Arc<dyn Store> = Arc::clone(store) as Arc<dyn Store>;
    let held = Cell::new(None);
    loop {
        match unwind::catch(|| run(&**store, &pool, monitor, handlers, index, rng, &held)) {
            Ok(()) => return,
            Err(message) => {
                let message = format!("the worker running this task panicked: {message}");
                store.worker_panicked(held.take(), message);
            }
        }
    }
}

/// Runs tasks from `store` until it says to stop. `held` names the claimed task at every
/// moment, for [`supervise`]; `pool` is the same store, for the handlers' contexts; `index` is
/// the worker's (its shard of the run metrics).
fn run<S: Store, R: Rng>(
    store: &S,
    pool: &Arc<dyn Store>,
    monitor: &Arc<Monitor>,
    handlers: &Handlers,
    index: usize,
    rng: &mut R,
    held: &Cell<Option<TaskId>>,
) {
    let mut next = store.claim(index, None);
    while let Some(claim) = next {
        held.set(Some(claim.id));
        #[cfg(all(test, not(tasq_loom)))]
        tests::maybe_inject_engine_panic();
        let entry = store.registry().entry(claim.type_index);
        // The task's own settings, fixed at submit; else its type's as this pool registered it.
        let settings = claim.settings.unwrap_or_else(|| entry.settings());
        let ctx = Context::new(
            claim.id,
            claim.attempt,
            settings.max_attempts,
            entry.name,
            claim.token.clone(),
            claim.lease,
            pool,
        );
        let timed = settings.timeout.map(|timeout| {
            monitor.begin(claim.id, entry.name, claim.attempt, &claim.token, timeout)
        });
        monitor.events.lifecycle(|| Event::Started {
            id: claim.id,
            task_type: entry.name,
            attempt: claim.attempt,
        });
        let outcome = {
            let _running = Running::enter(claim.id);
            let _span = trace::run(claim.id, entry.name, claim.attempt);
            let handler = handlers.get(claim.type_index);
            run_handler(entry, handler, &settings, &ctx, &claim, rng)
        };
        let timed_out = timed.is_some_and(|key| monitor.end(key));
        let outcome = if timed_out {
            past_timeout(outcome, &settings, &claim, rng)
        } else {
            outcome
        };
        let ended_as = outcome.ended();
        if let RunOutcome::Retry { delay, error } = &outcome {
            trace::retry(*delay, error);
        }
        // Timed from the claim to the outcome's recording, both read by the store on the
        // pool's clock: no clock read of the worker's own on the hot path.
        let run = RunEnd {
            metrics: &monitor.runs,
            worker: index,
            type_index: claim.type_index,
            ended: ended_as,
            timed_out,
            claimed_at: claim.claimed_at,
        };
        let token = ctx.into_token();
        next = store.complete_and_claim(claim, outcome, token, run);
        held.set(next.as_ref().map(|c| c.id));
    }
}

/// Runs the handler and turns its result into what the store records: success, a retry after a
/// drawn backoff (or the delay the handler asked for), or a dead letter (a permanent error, a
/// panic, or the last attempt failing). Every piece of user code here (the handler, the error's
/// `Display` and `Drop`, a panic's payload) runs inside `catch_unwind`.
fn run_handler<R: Rng>(
    entry: &Entry,
    handler: Option<&ErasedHandler>,
    settings: &Settings,
    ctx: &Context<'_>,
    claim: &Claim,
    rng: &mut R,
) -> RunOutcome {
    // A store claims only the types this pool runs: a type declared without a handler here is
    // never claimed.
    let Some(handler) = handler else {
        let error = format!("task type `{}` has no handler in this pool", entry.name);
        return RunOutcome::Failed(Failure::new(
            FailureReason::Permanent,
            claim.attempt,
            error,
            None,
        ));
    };
    let result = match unwind::catch(|| handler(ctx, &*claim.payload)) {
        Ok(result) => result,
        Err(panic_message) => {
            return RunOutcome::Failed(Failure::new(
                FailureReason::Panicked,
                claim.attempt,
                panic_message,
                None,
            ));
        }
    };
    let error = match result {
        Ok(output) => return RunOutcome::Succeeded(output),
        Err(error) => error,
    };
    let text = unwind::catch(|| error.to_string())
        .unwrap_or_else(|panic| format!("(the error's Display panicked: {panic})"));
    let reason = if error.is_permanent() {
        FailureReason::Permanent
    } else if claim.attempt >= settings.max_attempts {
        FailureReason::Exhausted
    } else {
        let delay = error
            .requested_delay()
            .unwrap_or_else(|| settings.retry.draw(claim.attempt, rng));
        unwind::drop_quietly(error);
        return RunOutcome::Retry { delay, error: text };
    };
    let source = error.into_source();
    RunOutcome::Failed(Failure::new(
        reason,
        claim.attempt,
        text,
        Some(source.into()),
    ))
}

/// What a run that outlived its timeout counts as, whatever the handler returned: a retryable
/// failure, or a dead letter once no attempt is left. A panic stays a panic. What the handler
/// returned is user code, dropped inside `catch_unwind`.
fn past_timeout<R: Rng>(
    outcome: RunOutcome,
    settings: &Settings,
    claim: &Claim,
    rng: &mut R,
) -> RunOutcome {
    match outcome {
        RunOutcome::Failed(failure) if failure.reason == FailureReason::Panicked => {
            return RunOutcome::Failed(failure);
        }
        RunOutcome::Succeeded(output) => unwind::drop_quietly(output),
        RunOutcome::Failed(failure) => unwind::drop_quietly(failure),
        RunOutcome::Retry { .. } => {}
    }
    let timeout = settings.timeout.unwrap_or_default();
    let error = format!("the handler ran past its timeout of {timeout:?}");
    if claim.attempt >= settings.max_attempts {
        RunOutcome::Failed(Failure::new(
            FailureReason::TimedOut,
            claim.attempt,
            error,
            None,
        ))
    } else {
        let delay = settings.retry.draw(claim.attempt, rng);
        RunOutcome::Retry { delay, error }
    }
}

#[cfg(all(test, not(tasq_loom)))]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::FailureReason;
    use crate::HandlerError;
    use crate::Outcome;
    use crate::Pool;
    use crate::TaskType;

    /// Set by a test: the next worker to claim a task panics in engine code, as a bug would.
    static INJECT: AtomicBool = AtomicBool::new(false);

    pub(super) fn maybe_inject_engine_panic() {
        if INJECT.swap(false, Ordering::SeqCst) {
            panic!("an injected engine bug");
        }
    }

    const JOB: TaskType<u32, u32> = TaskType::new("job");

    #[test]
    fn a_worker_survives_an_engine_panic_and_its_task_ends_failed() {
        let pool = Pool::builder()
            .workers(1)
            .quiet_panics(true)
            .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
            .build()
            .unwrap();
        INJECT.store(true, Ordering::SeqCst);
        match pool.submit(JOB.task(1)).unwrap().wait() {
            Outcome::Failed(failure) => {
                assert_eq!(failure.reason, FailureReason::Panicked);
                assert_eq!(
                    failure.error,
                    "the worker running this task panicked: an injected engine bug"
                );
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(
            pool.submit(JOB.task(2)).unwrap().wait().succeeded(),
            Some(2)
        );
        let stats = pool.stats();
        assert_eq!((stats.workers, stats.totals.worker_panics), (1, 1));
        pool.check_invariants().unwrap();
        // The failed task lost its payload with the worker's stack: not a resubmittable dead
        // letter.
        assert_eq!(stats.dead_letters, 0);
    }
}
