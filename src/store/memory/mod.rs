//! The embedded store: one lock over the task state, and the wake-up protocol of the workers.
//!
//! # Intake and direct runs
//!
//! A plain submit (no dependencies, no key) never takes the lock: it pushes its task onto the
//! lock-free intake (`intake.rs`, which has its own design note). Workers pop it into their
//! slots (`slots.rs`, the protocol of direct runs) and, when nothing ranks before it, run it
//! without the lock and without a record; a success with a unit output is remembered as a
//! mark in a range (`done.rs`). Every other operation moves the intake and the slots into the
//! state first (`MemoryStore::materialize`), so the state it sees holds every task accepted so
//! far. A producer takes the lock only to wake a sleeping worker when no other is on its way
//! (the intake word counts both).
//!
//! # Wake-up protocol
//!
//! Idle workers sleep in one of two places, both under the pool's one lock:
//!
//! * `work_cv`: untimed. `State::idle` counts the workers here, `State::notified` those of them
//!   already notified but not yet running again.
//! * `timer_cv`: at most one worker, the *timer*, sleeps here until the earliest due time
//!   (`State::timer_sleeping`).
//!
//! While the timer sleeps, at most one idle worker, the *standby* (`State::standby`), waits on
//! `work_cv` until that same due time. When it comes, the timer takes the due task and runs it;
//! the standby, already awake, takes the next due task or becomes the timer, where the timer
//! alone would have had to wake a worker to take its role (a context switch added to each due
//! task's lateness: it took delayed tasks' p99 lateness from 0.9–3 ms to 0.2–0.5 ms on a 2-core
//! machine). No rule relies on the standby: it is an idle worker whose wait ends early. No other
//! wait is timed, so a thousand delayed tasks never wake a hundred workers at once, and a pool
//! with nothing delayed has no timed wait at all: an idle pool wakes no thread.
//!
//! *Due times* are those of the delayed heap and those of the gates that *need the timer*
//! (`gate.rs`): a rate limit holding tasks until its bucket's next token, an open breaker
//! holding tasks until its cool-down ends. `State::earliest_due` is the earliest of them all,
//! and `State::promote_due` both moves due tasks to the ready queue and releases the gates whose
//! time has come, so the timer serves a held task exactly as it serves a delayed one. A held
//! task is ready (`counts.ready`) but not poppable: the rules below count only the tasks in the
//! ready queue (`State::ready_len`), so a thousand held tasks wake nobody.
//!
//! *Waking a sleeper* means: an idle worker not yet notified if there is one, else the timer if
//! it is not yet notified, else nobody (everyone asleep is already on the way). A notified worker
//! counts as on the way until it holds the lock again; a worker that wakes for another reason
//! (a broadcast, a spurious wake-up) may take another's count with it, which only ever makes the
//! pool notify more, never less.
//!
//! *Searchers* are the workers on their way to look for work: those notified and not yet
//! running, and those spinning (below). Keeping one searcher per ready task is enough: each takes
//! a task or finds the queue empty.
//!
//! The rules that keep every ready task served (each checked under the lock):
//!
//! 1. When tasks become ready, sleepers are woken until there are as many searchers as ready
//!    tasks, but no more than there are CPUs (`MemoryStore::max_searchers`): more threads woken at once
//!    than can run only contend for the lock. Each searcher that takes a task applies this rule
//!    again (rule 2), so a deep queue still wakes every worker, in a few parallel chains.
//! 2. A worker that takes a task applies rule 1 to the tasks still ready, and wakes a sleeper if
//!    due times have no timer (`State::has_timed`). Every worker, woken or done with a task,
//!    looks for work before it sleeps, so a notification that finds its sleeper already awake
//!    loses nothing.
//! 3. A new earliest due time wakes the timer (to shorten its sleep), or, with no timer, one
//!    idle worker (to become it). A gate that starts needing the timer counts as one: a worker
//!    that holds a task there (in `take`) wakes a sleeping timer, and becomes the timer itself
//!    if there is none and it finds nothing to run; a breaker that opens again over held tasks
//!    (in `complete`) follows the rule as a transition. Tasks a gate releases into the ready
//!    queue are newly ready tasks (rule 1).
//! 4. Closing the pool, stopping it, and the end of a closed pool's drain (`State::drained`)
//!    wake everyone: workers re-check whether to exit, `shutdown` re-checks whether it is done.
//! 5. A manual clock's advance wakes the timer and `shutdown` (their deadlines are on that clock)
//!    and, with no timer but due times, one idle worker.
//! 6. A transition that leaves nothing in the ready queue and nothing running wakes `wait_idle`
//!    callers; so does a claim that holds back the last task in the ready queue (held tasks
//!    wait for a time or for a running task, like scheduled ones: see `State::is_idle`).
//!
//! A worker about to sleep (either way) first counts itself a sleeper in the intake word; if a
//! submit is pending there, it moves the intake in and looks again instead (see `intake.rs`).
//!
//! Before a worker goes to sleep untimed, it spins for a microsecond or two outside the lock (one
//! worker at a time), watching `MemoryStore::ready_epoch`, which every transition that makes a task
//! ready bumps, and the intake's pending count: a worker that keeps up with its producer then
//! catches the next task without two context switches. A spinner counts as a searcher in the
//! intake word (a producer leaves the task to it), is not counted as idle, and re-checks under
//! the lock before it sleeps, so spinning never loses a wake-up; it happens once per idle period,
//! so an idle pool still wakes no thread. Under loom there is no spinning: the models check the
//! protocol without it, and a spin only adds one more look at the queue before the same sleep.
//!
//! Every wait is a loop that re-checks its condition, so spurious wake-ups are harmless; no path
//! that makes progress depends on a timed wait firing, which is what lets loom check it.

mod claim;
mod dead_letters;
mod direct;
mod done;
mod gate;
mod ids;
mod intake;
mod invariants;
mod minutes;
mod overview;
mod pause;
mod queue;
mod queue_limits;
mod reads;
mod record;
mod retention;
mod run;
pub(crate) mod schedules;
mod slots;
mod state;
mod store;
mod submit;

pub(crate) use intake::MAX_WORKERS;
pub(crate) use state::Retention;
pub(crate) use store::MemoryStore;
