//! The gates of the embedded store: the concurrency limits, rate limits and circuit breakers
//! that hold a ready task back before it starts, and the held queues where such tasks wait,
//! still ready, burning no attempt.
//!
//! # Design
//!
//! A task type may have up to four gates: its concurrency limit, its rate limit (a token
//! bucket, full when the pool starts), its downstream's circuit breaker (shared by every type
//! that names the downstream), and its *lane* (shared by every type of the lane's queues). Only
//! a pool with a gated type, lanes, or aging takes the gated path of a claim (`State::gated`):
//! an ungated pool pays one `bool` check per claim, nothing more.
//!
//! **Queue limits.** A queue may be limited at any time (`Pool::set_queue_limit`): a
//! concurrency gate shared by its types, whose limit can change. Its running count starts when
//! its first limit is set (read from the records then) and is kept from then on, limit or not,
//! so lowering, raising or lifting it later needs no count. Raising or lifting it releases what
//! it can; lowering it below what runs lets those finish and starts nothing new until the
//! count is below the limit.
//!
//! **Lanes.** A pool that gives some queues workers of their own (`Builder::queue`) has a lane
//! per such queue and a shared lane for the rest, each with a number of workers; the pool's
//! threads are their sum. A lane's gate is a concurrency limit of its workers, shared by its
//! types. So while a lane runs fewer tasks than its workers, fewer tasks run than the pool has
//! threads: some worker is free, and it pops past the tasks of full lanes (holding them) to the
//! lane's next task. Every worker serves every lane, but no lane can take another's workers:
//! they behave as threads of their own, and one slow queue never holds up the others.
//!
//! **Holding.** A worker that pops a task of a gated type asks its gates, in the order breaker,
//! concurrency, rate: the gate that stays closed longest first, so that tasks held by an open
//! breaker do not go round through the limits. If one is closed, the task goes to that gate's
//! held queue, keeping its state (`Ready`), its `since` stamp (it keeps aging) and its priority,
//! and the worker pops the next task. If every gate is open, the task starts and takes what it
//! uses: the breaker's probe, a concurrency slot, a token ([`Gates::admit`]).
//!
//! **Releasing.** A held queue is a ready queue of its own (priority, then first in first out;
//! by effective priority under aging). When its gate may have opened, the gate moves as many
//! held tasks back to the front of `ready` as it could let start now (its *capacity*: the free
//! slots, the whole tokens, one probe, or all of them once the breaker closes) minus those it
//! released already that no worker has popped yet (`Held::released`). So a freed slot releases
//! one task, not the whole queue: a long queue behind a small limit costs nothing per
//! completion. A released task is marked (`Gating::Released`) until a worker pops it: if it is
//! cancelled first, its gate releases another in its place; if a gate is closed when it is
//! popped (another task took the slot meanwhile), it goes back to the front of the queue it came
//! from, or to the back of the queue of the gate that stopped it.
//!
//! What may open a gate, and releases it:
//! * a task of the type leaves `Running` (complete, abandon): its concurrency gate and its
//!   lane's;
//! * a run's verdict changes its downstream's breaker (it closes, or a probe ends saying
//!   nothing): the breaker's gate;
//! * a released task is popped or cancelled: the gate it came from (one placeholder fewer);
//! * time: the bucket's next token, the breaker's cool-down. A gate that holds tasks, has
//!   released none, and opens at a time *needs the timer*: `State::earliest_due` includes that
//!   time, so a worker of the wake-up protocol (`mod.rs`) sleeps until it as the timer, and
//!   `State::promote_due` releases every such gate whose time has come. A gate that starts
//!   needing the timer is a new earliest due time (rule 3 there).
//!
//! A gate's capacity is positive exactly when [`Gates::admit`] would let a task through it:
//! a task held at a gate is never released by that same gate in the same step, so a claim's
//! loop of pops, holds and releases ends (each task moves forward to another gate, or stays).
//!
//! **Pausing.** Every type also has a pause gate, closed while the type or its queue is paused:
//! it comes first in [`Gates::admit`], so a paused type's tasks go to its held queue as workers
//! pop them (tasks already running finish). A pause changes no task when it is made: the
//! claim path finds the paused type's tasks where they are. Resuming releases the whole held
//! queue at once to the front of `ready`, as free tasks (a pause has no capacity to count
//! placeholders against), and wakes workers for them. A pool that was ever paused takes the
//! gated path of a claim from then on.
//!
//! Nothing is released while the pool stops: held tasks are cancelled like any ready task.

use std::time::Instant;

use super::ids::IdMap;
use super::ids::Seq;
use super::queue::{ReadyQueue, Stamp};
use super::record::{GateKind, Gating, Record};
use crate::gates::aging::Aging;
use crate::gates::breaker::{Breaker, BreakerCell, BreakerState, Verdict};
use crate::gates::limit::{Bucket, RateLimit};
use crate::model::state::TaskState;
use crate::observe::event::Event;
use crate::observe::events::Events;
use crate::store::registry::Registry;

/// One gate: the breaker of a downstream, or a type's own limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// The circuit breaker of downstream `.0` (an index into `Registry::downstreams`).
    Breaker(u32),
    /// The concurrency limit of type `.0`.
    Concurrency(u32),
    /// The rate limit of type `.0`.
    Rate(u32),
    /// The pause of type `.0` (paused itself, or through its queue).
    Paused(u32),
    /// The workers of lane `.0` (an index into `Registry::lanes`).
    Lane(u32),
    /// The limit of queue `.0` (an index into `Gates::queues`).
    Queue(u32),
}

impl Gate {
    fn kind(self) -> GateKind {
        match self {
            Gate::Breaker(_) => GateKind::Breaker,
            Gate::Concurrency(_) => GateKind::Concurrency,
            Gate::Rate(_) => GateKind::Rate,
            Gate::Paused(_) => GateKind::Paused,
            Gate::Lane(_) => GateKind::Lane,
            Gate::Queue(_) => GateKind::Queue,
        }
    }
}

/// What the wake-up rules must hear of a claim that went through the gates.
#[derive(Default, Debug)]
pub(crate) struct Wakes {
    /// Tasks released back to `ready`.
    pub(crate) newly_ready: usize,
    /// A gate started needing the timer: a sleeping timer must re-read the earliest due time.
    pub(crate) new_earliest: bool,
    /// A task was held back: if it was the last one ready, the pool may be idle now (rule 6).
    pub(crate) held: bool,
}

/// The tasks one gate holds back.
struct Held {
    /// Lazy deletion, like `ready`: a cancelled task's entry stays until it reaches the front.
    queue: ReadyQueue,
    /// Tasks released from `queue` to `ready` that no worker has popped since.
    released: usize,
}

impl Held {
    fn new() -> Self {
        Held {
            queue: ReadyQueue::new(),
            released: 0,
        }
    }
}

struct Concurrency {
    limit: u32,
    /// The type's running tasks (invariant 12).
    running: u32,
    held: Held,
}

struct Rate {
    limit: RateLimit,
    bucket: Bucket,
    held: Held,
}

/// A type's gates; all `None` (and not paused) for an ungated type.
struct TypeGates {
    downstream: Option<u32>,
    /// An index into `Gates::lanes`.
    lane: Option<u32>,
    /// Its queue: an index into `Gates::queues`.
    queue: u32,
    /// Its queue counts its running tasks (it was limited once): its starts go through the
    /// queue's gate.
    queue_counted: bool,
    concurrency: Option<Concurrency>,
    rate: Option<Rate>,
    /// The type is paused, itself or through its queue: its tasks are held at `pause`.
    paused: bool,
    /// Tasks held while the type is paused; every one goes back to `ready` when it is resumed,
    /// free (a pause has no capacity to count released tasks against).
    pause: Held,
}

impl TypeGates {
    fn is_gated(&self) -> bool {
        self.downstream.is_some()
            || self.lane.is_some()
            || self.queue_counted
            || self.concurrency.is_some()
            || self.rate.is_some()
            || self.paused
    }
}

/// A queue's limit: `limit: None` and `counted: false` until one is first set.
struct QueueGate {
    name: &'static str,
    limit: Option<u32>,
    /// Its types' running tasks, once `counted` (invariant 12).
    running: u32,
    counted: bool,
    held: Held,
}

impl QueueGate {
    fn capacity(&self) -> usize {
        match self.limit {
            Some(limit) if self.counted => limit.saturating_sub(self.running) as usize,
            _ => usize::MAX,
        }
    }
}

struct BreakerGate {
    name: &'static str,
    settings: Breaker,
    cell: BreakerCell,
    held: Held,
}

/// Every gate of a pool, with its held tasks.
pub(crate) struct Gates {
    /// By type index.
    types: Vec<TypeGates>,
    /// The pool's lanes of workers, by lane index: each a concurrency limit of its workers,
    /// shared by its types (invariant 12).
    lanes: Vec<Concurrency>,
    /// The queues of the pool's types, in the order first registered.
    queues: Vec<QueueGate>,
    /// By downstream index, in registry order.
    breakers: Vec<BreakerGate>,
    /// Every gate there is, to scan for timers.
    all: Vec<Gate>,
    /// Live held tasks in every queue: zero in a pool without gates, which then skips every
    /// scan of them.
    held: usize,
}

/// A live ready entry's `since` stamp; `None` for a stale entry.
pub(crate) fn ready_since(records: &IdMap<Record>, seq: Seq) -> Option<Stamp> {
    records
        .get(&seq)
        .filter(|r| r.state == TaskState::Ready)
        .map(|r| r.since)
}

/// How many tasks a breaker lets start at `now`: exactly when `BreakerCell::try_start` would.
fn breaker_capacity(cell: &BreakerCell, settings: &Breaker, now: Instant) -> usize {
    match cell.state {
        BreakerState::Closed => usize::MAX,
        BreakerState::Open if cell.reopens_at(settings).is_some_and(|at| now >= at) => 1,
        BreakerState::HalfOpen if !cell.probe_out => 1,
        _ => 0,
    }
}

impl Gates {
    /// The gates of `registry`'s types, buckets full at `now` (the pool's start).
    pub(crate) fn new(registry: &Registry, now: Instant) -> Self {
        let mut queues: Vec<QueueGate> = Vec::new();
        for entry in registry.entries() {
            if !queues.iter().any(|q| q.name == entry.queue) {
                queues.push(QueueGate {
                    name: entry.queue,
                    limit: None,
                    running: 0,
                    counted: false,
                    held: Held::new(),
                });
            }
        }
        let types: Vec<TypeGates> = registry
            .entries()
            .iter()
            .map(|entry| TypeGates {
                downstream: entry.downstream,
                lane: entry.lane,
                queue: queues
                    .iter()
                    .position(|q| q.name == entry.queue)
                    .expect("every type's queue was listed") as u32,
                queue_counted: false,
                concurrency: entry.concurrency.map(|limit| Concurrency {
                    limit,
                    running: 0,
                    held: Held::new(),
                }),
                rate: entry.rate.map(|limit| Rate {
                    bucket: Bucket::full(&limit, now),
                    limit,
                    held: Held::new(),
                }),
                paused: false,
                pause: Held::new(),
            })
            .collect();
        let breakers: Vec<BreakerGate> = registry
            .downstreams
            .iter()
            .map(|&(name, settings)| BreakerGate {
                name,
                settings,
                cell: BreakerCell::new(),
                held: Held::new(),
            })
            .collect();
        let lanes: Vec<Concurrency> = registry
            .lanes
            .iter()
            .map(|lane| Concurrency {
                limit: lane.workers,
                running: 0,
                held: Held::new(),
            })
            .collect();
        let mut all: Vec<Gate> = (0..breakers.len() as u32).map(Gate::Breaker).collect();
        all.extend((0..lanes.len() as u32).map(Gate::Lane));
        all.extend((0..queues.len() as u32).map(Gate::Queue));
        for (index, gates) in types.iter().enumerate() {
            let index = index as u32;
            if gates.concurrency.is_some() {
                all.push(Gate::Concurrency(index));
            }
            if gates.rate.is_some() {
                all.push(Gate::Rate(index));
            }
            all.push(Gate::Paused(index));
        }
        Gates {
            types,
            lanes,
            queues,
            breakers,
            all,
            held: 0,
        }
    }

    /// Whether a gate may hold tasks of `type_index` back.
    pub(crate) fn is_gated(&self, type_index: u32) -> bool {
        self.types
            .get(type_index as usize)
            .is_some_and(TypeGates::is_gated)
    }

    /// Live held tasks, in every queue.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// The gate of kind `kind` of type `type_index` (which has one).
    pub(crate) fn gate(&self, type_index: u32, kind: GateKind) -> Gate {
        match kind {
            GateKind::Breaker => Gate::Breaker(
                self.types[type_index as usize]
                    .downstream
                    .expect("a task held by a breaker has a downstream"),
            ),
            GateKind::Concurrency => Gate::Concurrency(type_index),
            GateKind::Rate => Gate::Rate(type_index),
            GateKind::Paused => Gate::Paused(type_index),
            GateKind::Lane => Gate::Lane(
                self.types[type_index as usize]
                    .lane
                    .expect("a task held by a lane has one"),
            ),
            GateKind::Queue => Gate::Queue(self.types[type_index as usize].queue),
        }
    }

    /// The breaker gate of `type_index`'s downstream, if it names one.
    pub(crate) fn breaker_of(&self, type_index: u32) -> Option<Gate> {
        let gates = self.types.get(type_index as usize)?;
        gates.downstream.map(Gate::Breaker)
    }

    fn held_ref(&self, gate: Gate) -> &Held {
        match gate {
            Gate::Breaker(d) => &self.breakers[d as usize].held,
            Gate::Concurrency(t) => {
                let limit = self.types[t as usize].concurrency.as_ref();
                &limit.expect("a concurrency gate has a limit").held
            }
            Gate::Rate(t) => {
                let limit = self.types[t as usize].rate.as_ref();
                &limit.expect("a rate gate has a limit").held
            }
            Gate::Paused(t) => &self.types[t as usize].pause,
            Gate::Lane(l) => &self.lanes[l as usize].held,
            Gate::Queue(q) => &self.queues[q as usize].held,
        }
    }

    fn held_mut(&mut self, gate: Gate) -> &mut Held {
        match gate {
            Gate::Breaker(d) => &mut self.breakers[d as usize].held,
            Gate::Concurrency(t) => {
                let limit = self.types[t as usize].concurrency.as_mut();
                &mut limit.expect("a concurrency gate has a limit").held
            }
            Gate::Rate(t) => {
                let limit = self.types[t as usize].rate.as_mut();
                &mut limit.expect("a rate gate has a limit").held
            }
            Gate::Paused(t) => &mut self.types[t as usize].pause,
            Gate::Lane(l) => &mut self.lanes[l as usize].held,
            Gate::Queue(q) => &mut self.queues[q as usize].held,
        }
    }

    // ===== starting =====

    /// Whether every gate of `type_index` lets a task start at `now`. If so, the task has
    /// started: it took the breaker's probe (if half-open), a concurrency slot, a worker of its
    /// lane, a slot of its queue's limit and a token. If not, the first gate found closed, in
    /// the order pause, breaker, concurrency, lane, queue, rate;
    /// nothing was taken. A breaker that lets a probe through emits its change (invariant 14).
    pub(crate) fn admit(
        &mut self,
        type_index: u32,
        now: Instant,
        events: &Events,
    ) -> Result<(), GateKind> {
        let gates = &mut self.types[type_index as usize];
        // Asks every gate before taking anything from any.
        if gates.paused {
            return Err(GateKind::Paused);
        }
        if let Some(d) = gates.downstream {
            let breaker = &self.breakers[d as usize];
            if breaker_capacity(&breaker.cell, &breaker.settings, now) == 0 {
                return Err(GateKind::Breaker);
            }
        }
        if let Some(limit) = &gates.concurrency {
            if limit.running >= limit.limit {
                return Err(GateKind::Concurrency);
            }
        }
        if let Some(lane) = gates.lane {
            let lane = &self.lanes[lane as usize];
            if lane.running >= lane.limit {
                return Err(GateKind::Lane);
            }
        }
        if gates.queue_counted && self.queues[gates.queue as usize].capacity() == 0 {
            return Err(GateKind::Queue);
        }
        if let Some(rate) = &mut gates.rate {
            if rate.bucket.next_start(&rate.limit, now) > now {
                return Err(GateKind::Rate);
            }
        }
        if let Some(d) = gates.downstream {
            let breaker = &mut self.breakers[d as usize];
            let (started, change) = breaker.cell.try_start(now, &breaker.settings);
            debug_assert!(
                started,
                "the breaker's capacity said it would let a task start"
            );
            if let Some(state) = change {
                events.emit(Event::Breaker {
                    downstream: breaker.name,
                    state,
                });
            }
        }
        if let Some(limit) = &mut gates.concurrency {
            // Keeps invariant 12: counted in as it starts.
            limit.running += 1;
        }
        if let Some(lane) = gates.lane {
            // Keeps invariant 12 for the lane.
            self.lanes[lane as usize].running += 1;
        }
        if gates.queue_counted {
            // Keeps invariant 12 for the queue.
            self.queues[gates.queue as usize].running += 1;
        }
        if let Some(rate) = &mut gates.rate {
            let took = rate.bucket.try_take(&rate.limit, now);
            debug_assert!(took, "the bucket said it held a start");
        }
        Ok(())
    }

    /// A task of `type_index` left `Running`: counts it out of its concurrency limit and its
    /// lane, and gives its run's verdict to its downstream's breaker (emitting a change,
    /// invariant 14). Returns the gates that may have opened, for the caller to release.
    pub(crate) fn run_ended(
        &mut self,
        type_index: u32,
        verdict: Verdict,
        now: Instant,
        events: &Events,
    ) -> [Option<Gate>; 4] {
        let gates = &mut self.types[type_index as usize];
        let mut opened = [None, None, None, None];
        if let Some(limit) = &mut gates.concurrency {
            // Keeps invariant 12.
            limit.running -= 1;
            opened[0] = Some(Gate::Concurrency(type_index));
        }
        if let Some(lane) = gates.lane {
            self.lanes[lane as usize].running -= 1;
            opened[2] = Some(Gate::Lane(lane));
        }
        if gates.queue_counted {
            self.queues[gates.queue as usize].running -= 1;
            opened[3] = Some(Gate::Queue(gates.queue));
        }
        if let Some(d) = gates.downstream {
            let breaker = &mut self.breakers[d as usize];
            if let Some(state) = breaker.cell.record(verdict, now, &breaker.settings) {
                events.emit(Event::Breaker {
                    downstream: breaker.name,
                    state,
                });
            }
            opened[1] = Some(Gate::Breaker(d));
        }
        opened
    }

    // ===== holding and releasing =====

    /// Holds ready task `seq` at `gate` (the caller marks its record). `front`: it was released
    /// from this gate and goes back where it was.
    pub(crate) fn hold(&mut self, gate: Gate, seq: Seq, priority: u8, front: bool) {
        let held = self.held_mut(gate);
        if front {
            held.queue.push_front(priority, seq);
        } else {
            held.queue.push(priority, seq);
        }
        self.held += 1;
    }

    /// A task held at `gate` was cancelled: its entry is stale now.
    pub(crate) fn forget_held(&mut self, gate: Gate, priority: u8) {
        self.held_mut(gate).queue.forget(priority);
        self.held -= 1;
    }

    /// A task released from `gate` left `ready` (popped or cancelled): one placeholder fewer.
    /// The caller releases the gate again.
    pub(crate) fn unrelease(&mut self, gate: Gate) {
        self.held_mut(gate).released -= 1;
    }

    /// How many tasks `gate` could let start at `now` (at most what it holds and released,
    /// for a rate gate: counting tokens costs a step each).
    fn capacity(&mut self, gate: Gate, now: Instant) -> usize {
        match gate {
            Gate::Breaker(d) => {
                let breaker = &self.breakers[d as usize];
                breaker_capacity(&breaker.cell, &breaker.settings, now)
            }
            Gate::Concurrency(t) => {
                let limit = self.types[t as usize].concurrency.as_ref();
                let limit = limit.expect("a concurrency gate has a limit");
                limit.limit.saturating_sub(limit.running) as usize
            }
            Gate::Lane(l) => {
                let lane = &self.lanes[l as usize];
                lane.limit.saturating_sub(lane.running) as usize
            }
            Gate::Queue(q) => self.queues[q as usize].capacity(),
            Gate::Rate(t) => {
                let rate = self.types[t as usize].rate.as_ref();
                let rate = rate.expect("a rate gate has a limit");
                let wanted = rate.held.queue.len() + rate.held.released;
                let mut bucket = rate.bucket.clone();
                (0..wanted)
                    .take_while(|_| bucket.try_take(&rate.limit, now))
                    .count()
            }
            Gate::Paused(t) if self.types[t as usize].paused => 0,
            Gate::Paused(_) => usize::MAX,
        }
    }

    /// Moves tasks held at `gate` back to the front of `ready`, best first (by `aging` at
    /// `stamp`, if it is on), as many as the gate could let start at `now` minus those it
    /// released already. Returns how many.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn release(
        &mut self,
        gate: Gate,
        now: Instant,
        stamp: Stamp,
        records: &mut IdMap<Record>,
        ready: &mut ReadyQueue,
        aging: Option<&Aging>,
    ) -> usize {
        let capacity = self.capacity(gate, now);
        let kind = gate.kind();
        // A resumed type's tasks go back free: nothing counts them against the pause.
        let free = kind == GateKind::Paused;
        let held = self.held_mut(gate);
        let mut batch: Vec<(u8, Seq)> = Vec::new();
        while held.released < capacity {
            let Some(seq) = held
                .queue
                .pop_by(aging, stamp, |id| ready_since(records, id))
            else {
                break;
            };
            let record = records
                .get_mut(&seq)
                .expect("a live held entry has a record");
            // Keeps invariants 2 and 11: out of the held queue, into `ready`, marked (or free,
            // from a pause).
            if free {
                record.gating = Gating::Free;
            } else {
                held.released += 1;
                record.gating = Gating::Released(kind);
            }
            batch.push((record.priority, seq));
        }
        self.held -= batch.len();
        // Front of their priorities, in the order they were held.
        for &(priority, seq) in batch.iter().rev() {
            ready.push_front(priority, seq);
        }
        batch.len()
    }

    /// Whether `gate` needs the timer: it holds tasks, released none, and opens at a time.
    pub(crate) fn needs_timer(&self, gate: Gate) -> bool {
        let held = self.held_ref(gate);
        !held.queue.is_empty()
            && held.released == 0
            && match gate {
                Gate::Rate(_) => true,
                Gate::Breaker(d) => self.breakers[d as usize].cell.state == BreakerState::Open,
                Gate::Concurrency(_) | Gate::Paused(_) | Gate::Lane(_) | Gate::Queue(_) => false,
            }
    }

    /// When `gate` opens, if it needs the timer.
    fn opens_at(&mut self, gate: Gate, now: Instant) -> Option<Instant> {
        if !self.needs_timer(gate) {
            return None;
        }
        match gate {
            Gate::Rate(t) => {
                let rate = self.types[t as usize].rate.as_mut()?;
                Some(rate.bucket.next_start(&rate.limit, now))
            }
            Gate::Breaker(d) => {
                let breaker = &self.breakers[d as usize];
                breaker.cell.reopens_at(&breaker.settings)
            }
            Gate::Concurrency(_) | Gate::Paused(_) | Gate::Lane(_) | Gate::Queue(_) => None,
        }
    }

    /// Whether some gate needs the timer.
    pub(crate) fn has_timer(&self) -> bool {
        self.held > 0 && self.all.iter().any(|&gate| self.needs_timer(gate))
    }

    /// The earliest time a gate that needs the timer opens.
    pub(crate) fn earliest(&mut self, now: Instant) -> Option<Instant> {
        if self.held == 0 {
            return None;
        }
        let mut earliest: Option<Instant> = None;
        for i in 0..self.all.len() {
            if let Some(at) = self.opens_at(self.all[i], now) {
                earliest = Some(earliest.map_or(at, |e| e.min(at)));
            }
        }
        earliest
    }

    /// Releases every gate that needs the timer and whose time has come (its capacity is
    /// positive at `now` exactly then). Returns how many tasks went back to `ready`.
    pub(crate) fn release_due(
        &mut self,
        now: Instant,
        stamp: Stamp,
        records: &mut IdMap<Record>,
        ready: &mut ReadyQueue,
        aging: Option<&Aging>,
    ) -> usize {
        if self.held == 0 {
            return 0;
        }
        let mut released = 0;
        for i in 0..self.all.len() {
            let gate = self.all[i];
            if self.needs_timer(gate) {
                released += self.release(gate, now, stamp, records, ready, aging);
            }
        }
        released
    }

    // ===== pausing =====

    /// Whether type `type_index`'s pause gate is closed.
    pub(crate) fn is_paused(&self, type_index: u32) -> bool {
        self.types[type_index as usize].paused
    }

    /// Pauses type `type_index` or resumes it; returns whether that changed anything. A
    /// resumed type's held tasks stay held until the caller releases its pause gate.
    pub(crate) fn set_paused(&mut self, type_index: u32, paused: bool) -> bool {
        let gates = &mut self.types[type_index as usize];
        let changed = gates.paused != paused;
        gates.paused = paused;
        changed
    }

    // ===== queue limits =====

    /// The index of queue `name`, if a type of the pool is in it.
    pub(crate) fn queue_index(&self, name: &str) -> Option<u32> {
        self.queues
            .iter()
            .position(|q| q.name == name)
            .map(|q| q as u32)
    }

    /// Whether queue `queue` counts its running tasks.
    pub(crate) fn is_counted(&self, queue: u32) -> bool {
        self.queues[queue as usize].counted
    }

    /// Whether type `type_index` is in queue `queue`.
    pub(crate) fn in_queue(&self, type_index: u32, queue: u32) -> bool {
        self.types[type_index as usize].queue == queue
    }

    /// Queue `queue` counts its running tasks from now on, `running` of them now.
    pub(crate) fn start_counting(&mut self, queue: u32, running: u32) {
        let gate = &mut self.queues[queue as usize];
        gate.counted = true;
        gate.running = running;
        for gates in &mut self.types {
            if gates.queue == queue {
                gates.queue_counted = true;
            }
        }
    }

    /// Sets queue `queue`'s limit (it counts its running tasks); returns the one before. The
    /// caller releases the gate.
    pub(crate) fn set_queue_limit(&mut self, queue: u32, limit: Option<u32>) -> Option<u32> {
        std::mem::replace(&mut self.queues[queue as usize].limit, limit)
    }

    /// The queues' limits in force, by name.
    pub(crate) fn queue_limits(&self) -> Vec<(&'static str, u32)> {
        let mut limits: Vec<(&'static str, u32)> = self
            .queues
            .iter()
            .filter_map(|q| q.limit.map(|limit| (q.name, limit)))
            .collect();
        limits.sort_unstable();
        limits
    }

    // ===== reading =====

    /// Each breaker's state, in registry order.
    pub(crate) fn breakers(&self) -> Vec<(&'static str, BreakerState)> {
        self.breakers
            .iter()
            .map(|b| (b.name, b.cell.state))
            .collect()
    }

    /// Each breaker's name, state, failures in a row and when it last opened.
    pub(crate) fn breaker_cells(&self) -> Vec<(&'static str, BreakerState, u32, Option<Instant>)> {
        self.breakers
            .iter()
            .map(|b| (b.name, b.cell.state, b.cell.consecutive, b.cell.opened_at))
            .collect()
    }

    /// The fronts of every held queue, as [`ReadyQueue::fronts`] gives them.
    pub(crate) fn fronts(&mut self, is_live: impl Fn(Seq) -> bool) -> Vec<(u8, usize, Seq)> {
        if self.held == 0 {
            return Vec::new();
        }
        let mut fronts = Vec::new();
        for i in 0..self.all.len() {
            let gate = self.all[i];
            fronts.extend(self.held_mut(gate).queue.fronts(&is_live));
        }
        fronts
    }

    // ===== checking =====

    /// Checks invariants 2 (for held tasks), 11 to 14 against every record; `Err` names the
    /// invariant broken and how.
    pub(crate) fn check(&self, records: &IdMap<Record>) -> Result<(), (u32, String)> {
        // What the records say each gate holds, has released, and runs.
        let mut held = vec![0usize; self.all.len()];
        let mut released = vec![0usize; self.all.len()];
        let mut running = vec![0u32; self.types.len()];
        let mut lane_running = vec![0u32; self.lanes.len()];
        let mut queue_running = vec![0u32; self.queues.len()];
        let position = |gate: Gate| self.all.iter().position(|&g| g == gate);
        for (&seq, record) in records {
            if record.state == TaskState::Running {
                if let Some(n) = running.get_mut(record.type_index as usize) {
                    *n += 1;
                }
                let lane = self
                    .types
                    .get(record.type_index as usize)
                    .and_then(|g| g.lane);
                if let Some(n) = lane.and_then(|lane| lane_running.get_mut(lane as usize)) {
                    *n += 1;
                }
                let queue = self.types.get(record.type_index as usize).map(|g| g.queue);
                if let Some(n) = queue.and_then(|q| queue_running.get_mut(q as usize)) {
                    *n += 1;
                }
            }
            let (kind, counts) = match record.gating {
                Gating::Free => continue,
                Gating::Held(kind) => (kind, &mut held),
                Gating::Released(kind) => (kind, &mut released),
            };
            if record.state != TaskState::Ready {
                return Err((
                    11,
                    format!("{} task {seq} is {:?}", record.state, record.gating),
                ));
            }
            let gates = self.types.get(record.type_index as usize);
            let has = gates.is_some_and(|g| match kind {
                GateKind::Breaker => g.downstream.is_some(),
                GateKind::Concurrency => g.concurrency.is_some(),
                GateKind::Rate => g.rate.is_some(),
                GateKind::Lane => g.lane.is_some(),
                GateKind::Queue => g.queue_counted,
                // Invariant 16: held at a pause only while paused; never released from one.
                GateKind::Paused => g.paused && matches!(record.gating, Gating::Held(_)),
            });
            if !has {
                return Err((
                    11,
                    format!("task {seq} is {:?}, a gate its type lacks", record.gating),
                ));
            }
            let index = position(self.gate(record.type_index, kind)).expect("every gate is listed");
            counts[index] += 1;
        }
        for (index, gates) in self.types.iter().enumerate() {
            if let Some(limit) = &gates.concurrency {
                if limit.running != running[index] || limit.running > limit.limit {
                    return Err((
                        12,
                        format!(
                            "type {index} counts {} running of {}, the records {}",
                            limit.running, limit.limit, running[index]
                        ),
                    ));
                }
            }
        }
        for (index, lane) in self.lanes.iter().enumerate() {
            if lane.running != lane_running[index] || lane.running > lane.limit {
                return Err((
                    12,
                    format!(
                        "lane {index} counts {} running of {} workers, the records {}",
                        lane.running, lane.limit, lane_running[index]
                    ),
                ));
            }
        }
        for (index, queue) in self.queues.iter().enumerate() {
            // A limit lowered below what runs lets those finish: the count may be above it.
            if queue.counted && queue.running != queue_running[index] {
                return Err((
                    12,
                    format!(
                        "queue {} counts {} running, the records {}",
                        queue.name, queue.running, queue_running[index]
                    ),
                ));
            }
        }
        let mut total = 0;
        for (index, &gate) in self.all.iter().enumerate() {
            let queue = self.held_ref(gate);
            total += queue.queue.len();
            if queue.queue.len() != held[index] || queue.released != released[index] {
                return Err((
                    11,
                    format!(
                        "{gate:?} counts {} held and {} released, the records {} and {}",
                        queue.queue.len(),
                        queue.released,
                        held[index],
                        released[index]
                    ),
                ));
            }
            // Invariant 2: each task held here has one live entry here.
            let mut seen = std::collections::HashSet::new();
            for (_, seq) in queue.queue.entries() {
                let live = records
                    .get(&seq)
                    .is_some_and(|r| r.state == TaskState::Ready);
                if !live {
                    continue;
                }
                let here = records[&seq].gating == Gating::Held(gate.kind())
                    && self.gate(records[&seq].type_index, gate.kind()) == gate;
                if !here || !seen.insert(seq) {
                    return Err((
                        2,
                        format!("task {seq} has a stray or second entry in {gate:?}"),
                    ));
                }
            }
            // Invariant 13: nothing held is forgotten.
            if !queue.queue.is_empty() && queue.released == 0 {
                let closed = match gate {
                    Gate::Concurrency(t) => {
                        let limit = self.types[t as usize].concurrency.as_ref();
                        limit.is_some_and(|l| l.running >= l.limit)
                    }
                    Gate::Lane(l) => {
                        let lane = &self.lanes[l as usize];
                        lane.running >= lane.limit
                    }
                    Gate::Queue(q) => self.queues[q as usize].capacity() == 0,
                    Gate::Breaker(d) => {
                        let cell = &self.breakers[d as usize].cell;
                        cell.state == BreakerState::Open
                            || (cell.state == BreakerState::HalfOpen && cell.probe_out)
                    }
                    // Closed until its next token, which the timer waits for.
                    Gate::Rate(_) => true,
                    Gate::Paused(t) => self.types[t as usize].paused,
                };
                if !closed {
                    return Err((
                        13,
                        format!("{gate:?} holds tasks, released none, and is open"),
                    ));
                }
            }
        }
        if total != self.held {
            return Err((
                11,
                format!("{} held counted, {total} in the queues", self.held),
            ));
        }
        for breaker in &self.breakers {
            if breaker.cell.probe_out && breaker.cell.state != BreakerState::HalfOpen {
                return Err((
                    14,
                    format!(
                        "{}'s breaker is {} with a probe out",
                        breaker.name, breaker.cell.state
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for Gates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gates")
            .field("gates", &self.all)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}
